//! One test's private corner of the stack: its database, ZooKeeper root, topics,
//! indexes and credentials, the services configured for it, and their removal.

use std::fs;
use std::path::PathBuf;
use std::time::Duration;

use mysql_async::prelude::*;

use crate::lane::Lane;
use crate::paths::target_dir;
use crate::process::{Running, Service};
use crate::stack::{binlog_end, random_hex, Stack};
use crate::{check_table, eventually, unique, CheckOptions};

/// The ZooKeeper session timeout of every service a test starts, and of its own client.
pub const SESSION_TIMEOUT: Duration = Duration::from_secs(4);

/// What the tests' services let a source's `password_ref` name (`[source_secrets]`):
/// the variables the tests' sources use ([`crate::PASSWORD_VAR`] and `PW`).
pub const SOURCE_SECRETS: &str = "IT_SOURCE_PASSWORD,PW";
/// The credentials a test's services use, random per test and found nowhere else, so a
/// leak of one can be searched for.
#[derive(Clone)]
pub struct Secrets {
    /// The centers' admin API token (sluicectl's).
    pub api_token: String,
    /// The workers' report-only API token.
    pub worker_token: String,
    /// ZooKeeper's digest credential, `user:password`: the nodes admit it alone.
    pub zk_auth: String,
    /// The first admin's password (`api.admin_password`, user `admin`).
    pub admin_password: String,
}

impl Secrets {
    fn new() -> Secrets {
        let word = |what: &str| format!("{what}-{}", random_hex());
        Secrets {
            api_token: word("tok"),
            worker_token: word("wtok"),
            zk_auth: format!("sluice-it:{}", word("zk")),
            admin_password: word("pw"),
        }
    }

    /// Each secret's value as it must never be seen (the ZooKeeper password alone: its
    /// user name is no secret).
    pub fn values(&self) -> Vec<&str> {
        let zk_password = self.zk_auth.split_once(':').map_or("", |(_, p)| p);
        vec![
            &self.api_token,
            &self.worker_token,
            zk_password,
            &self.admin_password,
        ]
    }
}

/// One test's private corner of the stack.
pub struct TestCtx {
    pub stack: Stack,
    pub suffix: String,
    pub db: String,
    pub instance: String,
    pub zk_root: String,
    pub group: String,
    pub dlq_topic: String,
    /// The test's own topic of delayed changes (the etl hands them to the leader there;
    /// shared, every test's center would record every other test's).
    pub delayed_topic: String,
    pub server_id: u32,
    pub dir: PathBuf,
    pub secrets: Secrets,
    zk: tokio::sync::OnceCell<sluice_zk::Coordinator>,
    /// Tables whose pipelines this test declared (their indexes and topics are removed).
    tables: std::sync::Mutex<Vec<String>>,
    /// More topics and databases the test created (cluster sources, the meta database).
    pub(crate) extra: std::sync::Mutex<(Vec<String>, Vec<String>)>,
    cleaned: std::sync::atomic::AtomicBool,
    /// The tag of the images services configured from now on run from as containers.
    images: std::sync::Mutex<Option<String>>,
    /// Endpoints the services are given instead of the stack's (a fault proxy's).
    routes: std::sync::Mutex<Routes>,
    /// Environment for services configured from now on, by binary.
    env: std::sync::Mutex<Vec<(&'static str, String, String)>>,
    /// Whether services configured from now on may send passwords to MySQL over plain TCP
    /// (`source_plaintext_hosts`, `allow_plaintext`): yes, unless a test says otherwise.
    plaintext: std::sync::atomic::AtomicBool,
    /// More TOML for centers configured from now on (a `[search]` section).
    pub(crate) center_sections: std::sync::Mutex<String>,
}

/// Where services configured from now on reach MySQL, Kafka and Elasticsearch, when not
/// the stack's endpoints directly (the test's own connections always go direct).
#[derive(Default, Clone)]
pub(crate) struct Routes {
    pub(crate) mysql: Option<(String, u16)>,
    pub(crate) kafka: Option<String>,
    pub(crate) elasticsearch: Option<String>,
    pub(crate) zookeeper: Option<String>,
    /// A `mysql://` URL for the centers' meta database.
    pub(crate) meta: Option<String>,
}

/// A table → index pipeline as a test declares it.
pub struct Pipeline {
    pub table: String,
    pub alias: String,
    pub columns: Vec<String>,
}

impl TestCtx {
    pub async fn new(name: &str) -> TestCtx {
        TestCtx::on(name, Stack::connect().await).await
    }

    /// A test whose database, and source, live on the MySQL of `stack`.
    pub async fn on(name: &str, stack: Stack) -> TestCtx {
        let suffix = unique("");
        let db = format!("it_{name}_{suffix}");
        stack
            .conn()
            .await
            .query_drop(format!("CREATE DATABASE `{db}`"))
            .await
            .expect("create the test database");
        let dir = target_dir().join("it").join(format!("{name}-{suffix}"));
        fs::create_dir_all(&dir).expect("test directory");
        // Its real path: what a service's allowlist of secret directories compares.
        let dir = fs::canonicalize(&dir).expect("the test directory's real path");
        let server_id = 100_000
            + (std::process::id() % 20_000) * 100
            + (crate::COUNTER.load(std::sync::atomic::Ordering::Relaxed) % 100);
        TestCtx {
            instance: format!("{name}{suffix}"),
            zk_root: format!("/sluice-it-{name}-{suffix}"),
            group: format!("etl-{name}-{suffix}"),
            dlq_topic: format!("sluice.dlq.{name}.{suffix}"),
            delayed_topic: format!("sluice.delayed.{name}.{suffix}"),
            suffix,
            db,
            stack,
            server_id,
            dir,
            secrets: Secrets::new(),
            zk: tokio::sync::OnceCell::new(),
            tables: Default::default(),
            extra: Default::default(),
            center_sections: Default::default(),
            cleaned: Default::default(),
            routes: Default::default(),
            env: Default::default(),
            plaintext: true.into(),
            images: Default::default(),
        }
    }

    /// Services configured from now on run from their images under `tag` as containers
    /// (`deploy/images.sh`), not from their binaries.
    pub fn run_from_images(&self, tag: &str) {
        *self.images.lock().expect("images") = Some(tag.to_owned());
    }

    /// Services configured from now on reach the source's MySQL at `addr` (`host:port`,
    /// a fault proxy's).
    pub fn route_mysql(&self, addr: &str) {
        let (host, port) = addr.rsplit_once(':').expect("host:port");
        self.routes.lock().expect("routes").mysql =
            Some((host.to_owned(), port.parse().expect("a port")));
    }

    /// Services configured from now on, and the test's own Kafka clients, use these
    /// bootstrap brokers (a broker of the test's own).
    pub fn route_kafka(&self, brokers: &str) {
        self.routes.lock().expect("routes").kafka = Some(brokers.to_owned());
    }

    /// Services configured from now on reach ZooKeeper at `connect` (a fault proxy's in
    /// front of a server of the test's own, which `stack.zookeeper` then names).
    pub fn route_zookeeper(&self, connect: &str) {
        self.routes.lock().expect("routes").zookeeper = Some(connect.to_owned());
    }

    /// Centers configured from now on keep their meta database on the MySQL at
    /// `mysql_url` rather than on the test's (which a test may take away).
    pub fn route_meta(&self, mysql_url: &str) {
        self.routes.lock().expect("routes").meta = Some(mysql_url.to_owned());
    }

    /// Services configured from now on reach Elasticsearch at `url`.
    pub fn route_elasticsearch(&self, url: &str) {
        self.routes.lock().expect("routes").elasticsearch = Some(url.to_owned());
    }

    pub(crate) fn routes(&self) -> Routes {
        self.routes.lock().expect("routes").clone()
    }

    /// Where services reach the source's MySQL: the route's, or the test's server.
    pub fn source_endpoint(&self) -> (String, u16) {
        (self.routes().mysql)
            .unwrap_or_else(|| (self.stack.mysql_host.clone(), self.stack.mysql_port))
    }

    pub fn pipeline(&self, table: &str) -> Pipeline {
        self.tables.lock().expect("tables").push(table.to_owned());
        Pipeline {
            table: table.to_owned(),
            alias: self.pipeline_alias(table),
            columns: Vec::new(),
        }
    }

    pub async fn exec(&self, sql: &str) {
        self.exec_in(&self.db, sql).await
    }

    /// Runs `sql` with `db` as its default database.
    pub async fn exec_in(&self, db: &str, sql: &str) {
        let mut conn = self.stack.conn().await;
        conn.query_drop(format!("USE `{db}`"))
            .await
            .expect("use db");
        conn.query_drop(sql)
            .await
            .unwrap_or_else(|e| panic!("{sql}: {e}"));
    }

    /// A second database of the test's on the same server (which its source does not
    /// capture), dropped with the test's own.
    pub async fn other_database(&self) -> String {
        self.database("other").await
    }

    /// Database `<test database>_<suffix>` on the same server, created now and dropped
    /// with the test's own.
    pub async fn database(&self, suffix: &str) -> String {
        let db = format!("{}_{suffix}", self.db);
        self.exec(&format!("CREATE DATABASE `{db}`")).await;
        self.extra.lock().expect("extra").1.push(db.clone());
        db
    }

    /// `items (id, name, qty)` holding rows 1..=`rows` (`item <id>`, `id % 97`): the
    /// table the build and version-history tests stream and rebuild.
    pub async fn items_table(&self, rows: u64) {
        self.exec("CREATE TABLE items (id BIGINT PRIMARY KEY, name VARCHAR(40), qty INT)")
            .await;
        if rows > 0 {
            let values: Vec<String> = (1..=rows)
                .map(|i| format!("({i}, 'item {i}', {})", i % 97))
                .collect();
            self.exec(&format!("INSERT INTO items VALUES {}", values.join(", ")))
                .await;
        }
    }

    /// The `[zookeeper]` section of every service of this test (its own root).
    pub(crate) fn zookeeper_section(&self) -> String {
        let connect = (self.routes().zookeeper).unwrap_or_else(|| self.stack.zookeeper.clone());
        format!(
            "[zookeeper]\nconnect = \"{connect}\"\nroot = \"{}\"\nsession_timeout = \"{}s\"\nauth = \"{}\"\n",
            self.zk_root,
            SESSION_TIMEOUT.as_secs(),
            self.secrets.zk_auth,
        )
    }

    /// A ZooKeeper client's settings for this test's own root, on the server the test
    /// reaches directly (past any proxy the services are routed through).
    pub fn zk_config(&self) -> sluice_zk::ZkConfig {
        sluice_zk::ZkConfig {
            connect: self.stack.zookeeper.clone(),
            root: self.zk_root.clone(),
            session_timeout: SESSION_TIMEOUT,
            auth: Some(sluice_model::Secret::new(&self.secrets.zk_auth)),
        }
    }

    /// The Kafka the test's services use: the stack's, or a broker of the test's own.
    pub fn kafka_brokers(&self) -> String {
        self.routes()
            .kafka
            .unwrap_or_else(|| self.stack.kafka.clone())
    }

    pub(crate) fn kafka_section(&self) -> String {
        let mut s = format!(
            "[kafka]\nbrokers = \"{}\"\npartitions = 3\n",
            self.kafka_brokers()
        );
        if let Some(secure) = crate::secure::Secure::lane() {
            s.push_str(&secure.kafka_toml());
        }
        s
    }

    pub(crate) fn elasticsearch_section(&self) -> String {
        let url = (self.routes().elasticsearch).unwrap_or_else(|| self.stack.es_url.clone());
        let mut s = format!("[elasticsearch]\nurl = \"{url}\"\n");
        if let Some(secure) = crate::secure::Secure::lane() {
            s.push_str(&format!(
                "[elasticsearch.tls]\nca = \"{}\"\n",
                secure.es_ca.display()
            ));
        }
        s
    }

    /// The etl's own sections: its group and member id, dead-letter topic, Kafka
    /// and Elasticsearch.
    pub(crate) fn etl_sections(&self) -> String {
        format!(
            "[etl]\ngroup_id = \"{group}\"\ninstance_id = \"{group}-1\"\nlinger = \"50ms\"\n\n{}\n{}\n{}",
            self.kafka_section(),
            self.topics_section(),
            self.elasticsearch_section(),
            group = self.group,
        )
    }

    /// The test's own dead-letter and delayed-changes topics.
    pub fn topics_section(&self) -> String {
        format!(
            "[topics]\ndead_letter = \"{}\"\ndelayed = \"{}\"\n",
            self.dlq_topic, self.delayed_topic
        )
    }

    /// Writes `sections` as `<name>.toml` in the test directory; the service `bin` with
    /// it, logging to `<name>.log`.
    /// Each gets a `[telemetry]` section listening on a port of its own.
    pub(crate) fn service(&self, bin: &'static str, name: &str, sections: &[&str]) -> Service {
        let path = self.dir.join(format!("{name}.toml"));
        let telemetry = std::net::SocketAddr::from(([127, 0, 0, 1], crate::ports::free_port()));
        let mut text = sections.join("\n");
        text.push_str(&format!("\n[telemetry]\nlisten = \"{telemetry}\"\n"));
        fs::write(&path, text).unwrap_or_else(|e| panic!("write {}: {e}", path.display()));
        let mut service = Service::new(bin, path, self.dir.join(format!("{name}.log")));
        service.telemetry = telemetry;
        if let Some(tag) = &*self.images.lock().expect("images") {
            service.image = Some(crate::container::image_of(bin, tag));
        }
        if let Some((key, value)) = Lane::current().env() {
            service = service.with_env(key, value);
        }
        if self.plaintext() {
            service = service.with_env("SLUICE_SOURCE_PLAINTEXT_HOSTS", "*");
        }
        if let Some(secure) = crate::secure::Secure::lane() {
            let (user, password) = secure.es_user_of(bin);
            service = service
                .with_env("SLUICE_KAFKA__SASL_PASSWORD", &secure.kafka_password)
                .with_env("SLUICE_ELASTICSEARCH__USERNAME", user)
                .with_env("SLUICE_ELASTICSEARCH__PASSWORD", password);
        }
        // The variables the tests' sources name their passwords by and the files of the
        // test's own directory, nothing else.
        service = service
            .with_env("SLUICE_SOURCE_SECRETS__ENV", SOURCE_SECRETS)
            .with_env(
                "SLUICE_SOURCE_SECRETS__DIRS",
                self.dir.to_str().expect("a UTF-8 test directory"),
            );
        for (_, key, value) in self
            .env
            .lock()
            .expect("env")
            .iter()
            .filter(|(b, ..)| *b == bin)
        {
            service = service.with_env(key, value);
        }
        service
    }

    /// Whether services configured from now on may send passwords to MySQL over plain
    /// TCP.
    pub fn allow_plaintext(&self, allowed: bool) {
        self.plaintext
            .store(allowed, std::sync::atomic::Ordering::Relaxed);
    }

    pub(crate) fn plaintext(&self) -> bool {
        self.plaintext.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Services of binary `bin` configured from now on get `key=value` in their
    /// environment (a `SLUICE_…` override, say).
    pub fn env_for(&self, bin: &'static str, key: &str, value: &str) {
        self.env
            .lock()
            .expect("env")
            .push((bin, key.to_owned(), value.to_owned()));
    }

    /// The test's source as a `[[sources]]` entry (the worker streams it; the etl reads
    /// documents back from it).
    fn source_section(&self) -> String {
        let (host, port) = self.source_endpoint();
        format!(
            r#"[[sources]]
name = "{instance}"
host = "{host}"
port = {port}
user = "{user}"
password = "{password}"
server_id = {server_id}
tables = ["{db}.*"]
allow_plaintext = {plaintext}
"#,
            instance = self.instance,
            user = self.stack.source_user,
            password = self.stack.source_password,
            server_id = self.server_id,
            db = self.db,
            plaintext = self.plaintext(),
        )
    }

    /// A standalone worker streaming the test database (not yet started).
    pub fn worker(&self) -> Service {
        let worker = format!(
            "[worker]\nid = \"w-{}\"\nconfirm_interval = \"200ms\"\n",
            self.suffix
        );
        let source = self.source_section();
        self.service(
            "sluice-worker",
            "worker",
            &[
                &worker,
                &self.zookeeper_section(),
                &self.kafka_section(),
                &source,
            ],
        )
    }

    /// An etl of `sections` following the test's ZooKeeper root, logging as `name` (not
    /// yet started).
    pub fn etl_of_sections(&self, name: &str, sections: &[&str]) -> Service {
        let zookeeper = self.zookeeper_section();
        let mut all = sections.to_vec();
        all.push(&zookeeper);
        self.service("sluice-etl", name, &all)
    }

    /// A standalone etl applying `pipelines` (not yet started).
    pub fn etl(&self, pipelines: &[Pipeline]) -> Service {
        let mut sections = vec![self.etl_sections()];
        for p in pipelines {
            let columns = p
                .columns
                .iter()
                .map(|c| format!("{c:?}"))
                .collect::<Vec<_>>()
                .join(", ");
            sections.push(format!(
                r#"[[pipelines]]
name = "{alias}"
source = "{instance}"
database = "{db}"
table = "{table}"
alias = "{alias}"
columns = [{columns}]
replicas = 0
"#,
                alias = p.alias,
                instance = self.instance,
                db = self.db,
                table = p.table,
            ));
        }
        let sections: Vec<&str> = sections.iter().map(String::as_str).collect();
        self.service("sluice-etl", "etl", &sections)
    }

    /// A pipeline spec (JSON, as `sluicectl pipelines put --spec` takes it) over this
    /// test's source and database: `tree` gives the root table and relations; the name
    /// and alias derive from the root table (as for [`TestCtx::pipeline`]), no replicas.
    /// Every table of the tree is registered for cleanup.
    pub fn spec(&self, mut tree: serde_json::Value) -> serde_json::Value {
        fn tables(v: &serde_json::Value, out: &mut Vec<String>) {
            if let Some(t) = v["table"].as_str() {
                out.push(t.to_owned());
            }
            for r in v["relations"].as_array().into_iter().flatten() {
                tables(r, out);
            }
        }
        let mut all = Vec::new();
        tables(&tree, &mut all);
        let mut seen = std::collections::HashSet::new();
        all.retain(|t| seen.insert(t.clone()));
        let alias = self.pipeline_alias(&all[0]);
        self.tables.lock().expect("tables").extend(all);
        for (k, v) in [
            ("name", alias.clone()),
            ("source", self.instance.clone()),
            ("database", self.db.clone()),
            ("alias", alias),
        ] {
            tree[k] = serde_json::Value::String(v);
        }
        tree["replicas"] = 0.into();
        tree
    }

    /// Removes `topic` with the test's other leftovers.
    pub fn clean_up_topic(&self, topic: String) {
        self.extra.lock().expect("extra").0.push(topic);
    }

    /// A standalone etl applying pipeline `specs` (see [`TestCtx::spec`]), reading
    /// documents back from the test's source (not yet started).
    pub fn etl_with(&self, specs: &[serde_json::Value]) -> Service {
        let pipelines =
            toml::to_string(&serde_json::json!({ "pipelines": specs })).expect("a spec is TOML");
        let sections = [self.etl_sections(), pipelines, self.source_section()];
        let sections: Vec<&str> = sections.iter().map(String::as_str).collect();
        self.service("sluice-etl", "etl", &sections)
    }

    /// Starts a worker, waits until it streams, then an etl applying `specs`.
    pub async fn start_with(&self, specs: &[serde_json::Value]) -> Running {
        self.run(self.worker(), self.etl_with(specs)).await
    }

    /// This test's ZooKeeper session (under its own root), opened on first use.
    pub async fn coordinator(&self) -> &sluice_zk::Coordinator {
        self.zk
            .get_or_init(|| async {
                sluice_zk::Coordinator::connect(&self.zk_config())
                    .await
                    .expect("ZooKeeper")
            })
            .await
    }

    /// The task's confirmed checkpoint.
    pub async fn checkpoint(&self) -> Option<sluice_model::Checkpoint> {
        self.checkpoint_of(&self.instance).await
    }

    /// The confirmed checkpoint of task `task` (a cluster source's, named by the test).
    pub async fn checkpoint_of(&self, task: &str) -> Option<sluice_model::Checkpoint> {
        let cp = self
            .coordinator()
            .await
            .read_checkpoint(task)
            .await
            .expect("read checkpoint");
        cp.filter(|b| !b.is_empty())
            .map(|b| sluice_model::Checkpoint::from_json(&b).expect("checkpoint JSON"))
    }

    /// Waits until the worker has recorded its start position: writes after this point
    /// are guaranteed to be streamed.
    pub async fn wait_worker_ready(&self, worker: &Service) {
        eventually(
            "worker recorded its start position",
            Duration::from_secs(60),
            || async {
                match self.checkpoint().await {
                    Some(_) => Ok(()),
                    None => Err(format!(
                        "no checkpoint yet\nworker log:\n{}",
                        worker.log_tail()
                    )),
                }
            },
        )
        .await;
    }

    /// Where the server's binlog ends now: no reader can have read past it yet.
    pub async fn binlog_end(&self) -> sluice_model::BinlogPosition {
        binlog_end(&mut self.stack.conn().await)
            .await
            .unwrap_or_else(|e| panic!("the binlog's end: {e}"))
    }

    /// Waits until the worker has confirmed the binlog position the server is at now:
    /// every change made before this call is in Kafka.
    pub async fn wait_streamed(&self, worker: &Service) {
        let end = self.binlog_end().await;
        eventually(
            "the worker streamed every change",
            Duration::from_secs(60),
            || async {
                match self.checkpoint().await {
                    Some(cp) if cp.position >= end => Ok(()),
                    cp => Err(format!(
                        "confirmed {cp:?}, the server is at {end}\n{}",
                        worker.log_tail()
                    )),
                }
            },
        )
        .await;
    }

    /// Starts a worker, waits until it streams, then starts an etl for `pipelines`.
    pub async fn start(&self, pipelines: &[Pipeline]) -> Running {
        self.run(self.worker(), self.etl(pipelines)).await
    }

    /// Starts `worker`, waits until it streams, then starts `etl`.
    pub async fn run(&self, mut worker: Service, mut etl: Service) -> Running {
        worker.start();
        self.wait_worker_ready(&worker).await;
        etl.start();
        Running { worker, etl }
    }

    /// Waits until `pipeline`'s index equals its table (see [`check_table`]); on timeout
    /// fails with the last difference and both services' logs.
    pub async fn converges(&self, running: &Running, pipeline: &Pipeline, within: Duration) {
        let (table, alias) = (&pipeline.table, &pipeline.alias);
        eventually(&format!("{table} equals {alias}"), within, || async {
            check_table(self, table, alias, &CheckOptions::default())
                .await
                .map_err(|e| format!("{e}\n{}", running.logs()))
        })
        .await;
    }
}

impl TestCtx {
    fn leftovers(&self) -> Leftovers {
        let tables = self.tables.lock().expect("tables").clone();
        let topics = sluice_kafka::TopicConfig::default();
        let mut all_topics: Vec<String> = tables.iter().map(|t| self.topic(t)).collect();
        // Builds' topics (pipelines are named like their alias in the tests).
        for alias in tables.iter().map(|t| self.pipeline_alias(t)) {
            all_topics.push(topics.build_topic(&alias));
        }
        all_topics.extend([
            self.dlq_topic.clone(),
            self.delayed_topic.clone(),
            topics.schema_topic(&self.instance),
            topics.source_dead_letter_topic(&self.instance),
        ]);
        let (extra_topics, extra_dbs) = self.extra.lock().expect("extra").clone();
        all_topics.extend(extra_topics);
        let mut dbs = vec![self.db.clone()];
        dbs.extend(extra_dbs);
        Leftovers {
            zk_root: self.zk_root.clone(),
            zk_auth: self.secrets.zk_auth.clone(),
            dbs,
            aliases: tables.iter().map(|t| self.pipeline_alias(t)).collect(),
            topics: all_topics,
        }
    }

    fn pipeline_alias(&self, table: &str) -> String {
        format!("{table}_{}", self.suffix).to_ascii_lowercase()
    }

    /// Keeps what the test created in the shared services (as a failing test does), for
    /// a run that found a fault without panicking.
    pub fn keep(&self) {
        self.cleaned
            .store(true, std::sync::atomic::Ordering::Relaxed);
        eprintln!(
            "keeping database {}, its indexes and topics for inspection",
            self.db
        );
    }

    /// Removes what the test created in the shared services — its indexes, database and
    /// topics — and says what it removed. Stop the services first. Runs by itself when a passing test's context is
    /// dropped; a failing test keeps everything for inspection.
    pub async fn cleanup(&self) -> String {
        self.cleaned
            .store(true, std::sync::atomic::Ordering::Relaxed);
        self.leftovers().remove(&self.stack).await
    }
}

impl Drop for TestCtx {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!(
                "test failed: keeping database {}, its indexes and topics for inspection",
                self.db
            );
            return;
        }
        if self.cleaned.load(std::sync::atomic::Ordering::Relaxed) {
            return;
        }
        // Drop cannot await: clean up on a thread of its own, with clients of its own
        // (connections belong to the runtime that opened them).
        let leftovers = self.leftovers();
        let done = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("runtime");
            rt.block_on(async move { leftovers.remove(&Stack::connect().await).await })
        })
        .join();
        if let Err(e) = done {
            eprintln!("cleanup of {} failed: {e:?}", self.db);
        }
    }
}

/// What a test leaves in the shared services.
struct Leftovers {
    zk_root: String,
    /// The credential the root's nodes admit.
    zk_auth: String,
    dbs: Vec<String>,
    aliases: Vec<String>,
    topics: Vec<String>,
}

impl Leftovers {
    async fn remove(&self, stack: &Stack) -> String {
        let mut notes = Vec::new();
        let mut deleted = 0;
        for alias in &self.aliases {
            // Behind the alias, and the versions a build left out of it.
            let mut indexes = stack.es.alias_targets(alias).await.unwrap_or_default();
            for v in 1..=4 {
                let index = format!("{alias}_v{v}");
                if !indexes.contains(&index) && stack.es.count(&index).await.is_ok() {
                    indexes.push(index);
                }
            }
            for index in indexes {
                match stack.es.delete_index(&index).await {
                    Ok(()) => deleted += 1,
                    Err(e) => notes.push(format!("index {index} left ({e})")),
                }
            }
        }
        notes.push(format!("{deleted} index(es) deleted"));
        for db in &self.dbs {
            match stack
                .conn()
                .await
                .query_drop(format!("DROP DATABASE IF EXISTS `{db}`"))
                .await
            {
                Ok(()) => notes.push(format!("database {db} dropped")),
                Err(e) => notes.push(format!("database {db} left ({e})")),
            }
        }
        // A plain client: a coordinator would have its own session marker under the root.
        let deleted = async {
            use zookeeper_async::ZooKeeperExt as _;
            let zk = zookeeper_async::ZooKeeper::connect(
                &stack.zookeeper,
                Duration::from_secs(10),
                |_| {},
            )
            .await
            .map_err(|e| e.to_string())?;
            zk.add_auth("digest", self.zk_auth.as_bytes().to_vec())
                .await
                .map_err(|e| e.to_string())?;
            let result = match zk.exists(&self.zk_root, false).await {
                Ok(Some(_)) => zk
                    .delete_recursive(&self.zk_root)
                    .await
                    .map_err(|e| e.to_string()),
                Ok(None) => Ok(()),
                Err(e) => Err(e.to_string()),
            };
            let _ = zk.close().await;
            result
        };
        match tokio::time::timeout(Duration::from_secs(20), deleted).await {
            Ok(Ok(())) => notes.push(format!("ZooKeeper root {} deleted", self.zk_root)),
            Ok(Err(e)) => notes.push(format!("ZooKeeper root {} left ({e})", self.zk_root)),
            Err(_) => notes.push(format!("ZooKeeper root {} left (timeout)", self.zk_root)),
        }
        match crate::kafka::delete_topics(&stack.kafka, &self.topics).await {
            Ok(()) => notes.push("topics deleted".into()),
            Err(e) => notes.push(format!("topics left ({e})")),
        }
        notes.join(", ")
    }
}
