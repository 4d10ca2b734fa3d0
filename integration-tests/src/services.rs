//! The stack's endpoints, per-test isolation, and the Sluice binaries as child processes.

use std::fs;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use mysql_async::prelude::*;
use sluice_elastic::{EsClient, EsClientConfig};

use crate::lane::Lane;
use crate::paths::target_dir;
use crate::{check_table, eventually, unique, CheckOptions};

/// Where the real services are.
#[derive(Clone)]
pub struct Stack {
    pub mysql_url: String,
    pub mysql_host: String,
    pub mysql_port: u16,
    pub source_user: String,
    pub source_password: String,
    pub zookeeper: String,
    pub kafka: String,
    pub es_url: String,
    pub mysql: mysql_async::Pool,
    pub es: EsClient,
}

fn env_or(name: &str, default: &str) -> String {
    std::env::var(name)
        .ok()
        .filter(|v| !v.is_empty())
        .unwrap_or_else(|| default.to_owned())
}

const HOW: &str = "start the local stack with `make stack-up` (or point MARIADB_URL / MYSQL_URL / ZOOKEEPER / KAFKA_BROKERS / ES_URL at running services)";

impl Stack {
    /// Connects to every service, the source of the test's lane among them, failing with
    /// how to start one that is unreachable.
    pub async fn connect() -> Stack {
        let stack = Stack::connect_with_mysql(&Stack::shared_mysql_url()).await;
        let lane = Lane::current();
        let version: String = stack
            .conn()
            .await
            .query_first("SELECT VERSION()")
            .await
            .expect("the source's version")
            .unwrap_or_default();
        assert!(
            lane.matches(&version),
            "the {lane:?} lane's server ({}) is {version}: point {} at a {lane:?} server",
            lane.url_var().0,
            lane.url_var().0,
        );
        stack
    }

    /// The shared stack's source server of the test's lane (`MARIADB_URL` or `MYSQL_URL`),
    /// an admin URL.
    pub fn shared_mysql_url() -> String {
        let (var, default) = Lane::current().url_var();
        env_or(var, default)
    }

    /// The stack with another MySQL (an admin URL): a server of the test's own.
    pub async fn connect_with_mysql(mysql_url: &str) -> Stack {
        crate::init_tracing();
        let mysql_url = mysql_url.to_owned();
        let opts = mysql_async::Opts::from_url(&mysql_url)
            .unwrap_or_else(|e| panic!("{mysql_url} is not a mysql:// URL: {e}"));
        let mysql_host = opts.ip_or_hostname().to_string();
        let mysql_port = opts.tcp_port();
        let mysql = mysql_async::Pool::new(opts);
        let mut conn = mysql.get_conn().await.unwrap_or_else(|e| {
            panic!("MySQL at {mysql_host}:{mysql_port} is not reachable ({e}): {HOW}")
        });
        conn.query_drop("SELECT 1").await.expect("MySQL answers");
        drop(conn);

        let zookeeper = env_or("ZOOKEEPER", "127.0.0.1:12181");
        let zk_addr = zookeeper.split([',', '/']).next().unwrap_or_default();
        require_tcp("ZooKeeper", &zookeeper, zk_addr).await;
        let kafka = env_or("KAFKA_BROKERS", "127.0.0.1:19092");
        require_tcp("Kafka", &kafka, kafka.split(',').next().unwrap_or_default()).await;

        let es_url = env_or("ES_URL", "http://127.0.0.1:19200");
        let es = EsClient::new(EsClientConfig {
            url: es_url.parse().expect("ES_URL is a URL"),
            username: std::env::var("ES_USERNAME").ok(),
            password: std::env::var("ES_PASSWORD").ok(),
            request_timeout: Duration::from_secs(60),
            tls: None,
        })
        .expect("Elasticsearch client");
        es.ping()
            .await
            .unwrap_or_else(|e| panic!("Elasticsearch at {es_url} is not reachable ({e}): {HOW}"));

        Stack {
            mysql_url,
            mysql_host,
            mysql_port,
            source_user: env_or("MYSQL_SOURCE_USER", "sluice"),
            source_password: env_or("MYSQL_SOURCE_PASSWORD", "sluice"),
            zookeeper,
            kafka,
            es_url,
            mysql,
            es,
        }
    }

    pub async fn conn(&self) -> mysql_async::Conn {
        self.mysql.get_conn().await.expect("MySQL connection")
    }
}

/// Fails the test, saying how to start the service, unless `addr` accepts connections.
async fn require_tcp(service: &str, endpoint: &str, addr: &str) {
    let connected =
        tokio::time::timeout(Duration::from_secs(5), tokio::net::TcpStream::connect(addr)).await;
    if !matches!(connected, Ok(Ok(_))) {
        panic!("{service} at {endpoint} is not reachable: {HOW}");
    }
}

/// Where the binlog of the server `conn` is connected to ends now, asked as that server's
/// flavour and version ask it.
pub async fn binlog_end(
    conn: &mut mysql_async::Conn,
) -> Result<sluice_model::BinlogPosition, String> {
    let version: String = conn
        .query_first("SELECT VERSION()")
        .await
        .map_err(|e| e.to_string())?
        .unwrap_or_default();
    let sql = sluice_mysql::Server::from_version(&version).binlog_status();
    let row: mysql_async::Row = conn
        .query_first(sql)
        .await
        .map_err(|e| format!("{sql}: {e}"))?
        .ok_or_else(|| format!("{sql} is empty: is the binlog on?"))?;
    Ok(sluice_model::BinlogPosition::new(
        row.get::<String, _>(0).ok_or("no file")?,
        row.get::<u64, _>(1).ok_or("no position")?,
    ))
}

/// The ZooKeeper session timeout of every service a test starts, and of its own client.
pub const SESSION_TIMEOUT: Duration = Duration::from_secs(4);
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
}

impl Secrets {
    fn new() -> Secrets {
        let word = |what: &str| format!("{what}-{}", random_hex());
        Secrets {
            api_token: word("tok"),
            worker_token: word("wtok"),
            zk_auth: format!("sluice-it:{}", word("zk")),
        }
    }

    /// Each secret's value as it must never be seen (the ZooKeeper password alone: its
    /// user name is no secret).
    pub fn values(&self) -> Vec<&str> {
        let zk_password = self.zk_auth.split_once(':').map_or("", |(_, p)| p);
        vec![&self.api_token, &self.worker_token, zk_password]
    }
}

/// MySQL accounts of a test's own, with random passwords found nowhere else: an admin
/// (the centers' meta database) and a reader with a source's grants. `stack` is the
/// stack as services configured through it reach MySQL with them.
pub struct OwnAccounts {
    pub stack: Stack,
    pub admin: String,
    pub admin_password: String,
    pub reader: String,
    pub reader_password: String,
}

impl OwnAccounts {
    /// Creates both accounts on `base`'s server, each with `require` (`""`, or e.g.
    /// `"REQUIRE X509"`).
    pub async fn create(base: &Stack, require: &str) -> OwnAccounts {
        let tag = &random_hex()[..8];
        let accounts = OwnAccounts {
            admin: format!("ta_{tag}"),
            admin_password: format!("adm-{}", random_hex()),
            reader: format!("tr_{tag}"),
            reader_password: format!("src-{}", random_hex()),
            stack: base.clone(),
        };
        let (a, r) = (&accounts.admin, &accounts.reader);
        let mut conn = base.conn().await;
        for sql in [
            format!(
                "CREATE USER '{a}'@'%' IDENTIFIED BY '{}' {require}",
                accounts.admin_password
            ),
            format!("GRANT ALL ON *.* TO '{a}'@'%'"),
            format!(
                "CREATE USER '{r}'@'%' IDENTIFIED BY '{}' {require}",
                accounts.reader_password
            ),
            format!(
                "GRANT SELECT, RELOAD, REPLICATION SLAVE, REPLICATION CLIENT ON *.* TO '{r}'@'%'"
            ),
        ] {
            conn.query_drop(sql).await.expect("create a MySQL account");
        }
        let mut stack = base.clone();
        stack.mysql_url = format!(
            "mysql://{a}:{}@{}:{}",
            accounts.admin_password, base.mysql_host, base.mysql_port
        );
        stack.source_user = r.clone();
        stack.source_password = accounts.reader_password.clone();
        OwnAccounts { stack, ..accounts }
    }

    /// Drops both accounts (best effort).
    pub async fn remove(self) {
        let mut conn = self.stack.conn().await;
        for user in [&self.admin, &self.reader] {
            let _ = conn.query_drop(format!("DROP USER '{user}'@'%'")).await;
        }
    }
}

/// 16 random hex digits (the standard library's per-process random hasher keys, mixed
/// with the time and a counter).
pub fn random_hex() -> String {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos()),
    );
    h.write_u32(crate::COUNTER.fetch_add(1, std::sync::atomic::Ordering::Relaxed));
    format!("{:016x}", h.finish())
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
    pub server_id: u32,
    pub dir: PathBuf,
    pub secrets: Secrets,
    zk: tokio::sync::OnceCell<sluice_zk::Coordinator>,
    /// Tables whose pipelines this test declared (their indexes and topics are removed).
    tables: std::sync::Mutex<Vec<String>>,
    /// More topics and databases the test created (cluster sources, the meta database).
    pub(crate) extra: std::sync::Mutex<(Vec<String>, Vec<String>)>,
    cleaned: std::sync::atomic::AtomicBool,
    /// Endpoints the services are given instead of the stack's (a fault proxy's).
    routes: std::sync::Mutex<Routes>,
    /// Environment for services configured from now on, by binary.
    env: std::sync::Mutex<Vec<(&'static str, String, String)>>,
    /// Whether services configured from now on may send passwords over plain TCP with the
    /// server's RSA key (`allow_public_key_retrieval`): on the MySQL lane, unless a test
    /// says otherwise.
    public_key_retrieval: std::sync::atomic::AtomicBool,
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
        let server_id = 100_000
            + (std::process::id() % 20_000) * 100
            + (crate::COUNTER.load(std::sync::atomic::Ordering::Relaxed) % 100);
        TestCtx {
            instance: format!("{name}{suffix}"),
            zk_root: format!("/sluice-it-{name}-{suffix}"),
            group: format!("etl-{name}-{suffix}"),
            dlq_topic: format!("sluice.dlq.{name}.{suffix}"),
            suffix,
            db,
            stack,
            server_id,
            dir,
            secrets: Secrets::new(),
            zk: tokio::sync::OnceCell::new(),
            tables: Default::default(),
            extra: Default::default(),
            cleaned: Default::default(),
            routes: Default::default(),
            env: Default::default(),
            public_key_retrieval: (Lane::current().flavor() == Lane::MySql).into(),
        }
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
    pub(crate) fn source_endpoint(&self) -> (String, u16) {
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
        let db = format!("{}_other", self.db);
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
        format!(
            "[kafka]\nbrokers = \"{}\"\npartitions = 3\n",
            self.kafka_brokers()
        )
    }

    pub(crate) fn elasticsearch_section(&self) -> String {
        let url = (self.routes().elasticsearch).unwrap_or_else(|| self.stack.es_url.clone());
        format!("[elasticsearch]\nurl = \"{url}\"\n")
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

    /// The test's own dead-letter topic.
    pub(crate) fn topics_section(&self) -> String {
        format!("[topics]\ndead_letter = \"{}\"\n", self.dlq_topic)
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
        if let Some((key, value)) = Lane::current().env() {
            service = service.with_env(key, value);
        }
        if self.public_key_retrieval() {
            service = service.with_env("SLUICE_SOURCE_PUBLIC_KEY_RETRIEVAL", "true");
            if bin == "sluice-center" {
                service = service.with_env("SLUICE_META__ALLOW_PUBLIC_KEY_RETRIEVAL", "true");
            }
        }
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

    /// Whether services configured from now on may send passwords over plain TCP
    /// encrypted with the RSA key the server sends.
    pub fn allow_public_key_retrieval(&self, allowed: bool) {
        self.public_key_retrieval
            .store(allowed, std::sync::atomic::Ordering::Relaxed);
    }

    fn public_key_retrieval(&self) -> bool {
        self.public_key_retrieval
            .load(std::sync::atomic::Ordering::Relaxed)
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
allow_public_key_retrieval = {rsa}
"#,
            instance = self.instance,
            user = self.stack.source_user,
            password = self.stack.source_password,
            server_id = self.server_id,
            db = self.db,
            rsa = self.public_key_retrieval(),
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

/// A write load on the test database in the background, until [`Load::stop`].
pub struct Load {
    running: std::sync::Arc<std::sync::atomic::AtomicBool>,
    done: std::sync::Arc<std::sync::atomic::AtomicU64>,
    task: tokio::task::JoinHandle<u64>,
}

impl TestCtx {
    /// Runs `round(n)`'s statements, in order, for n = 1, 2, … with `pace` between rounds
    /// (a load's pace, not a synchronisation), on a connection of its own.
    pub fn load(
        &self,
        pace: Duration,
        round: impl Fn(u64) -> Vec<String> + Send + 'static,
    ) -> Load {
        use std::sync::atomic::Ordering;
        let running = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(true));
        let done = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
        let (pool, db, go) = (self.stack.mysql.clone(), self.db.clone(), running.clone());
        let counted = done.clone();
        let task = tokio::spawn(async move {
            let mut conn = pool.get_conn().await.expect("MySQL connection");
            conn.query_drop(format!("USE `{db}`"))
                .await
                .expect("use db");
            let mut n = 0;
            while go.load(Ordering::Relaxed) {
                n += 1;
                for statement in round(n) {
                    conn.query_drop(&statement)
                        .await
                        .unwrap_or_else(|e| panic!("{statement}: {e}"));
                }
                counted.store(n, Ordering::Relaxed);
                tokio::time::sleep(pace).await; // pacing a load
            }
            n
        });
        Load {
            running,
            done,
            task,
        }
    }
}

impl Load {
    /// The rounds done so far.
    pub fn rounds(&self) -> u64 {
        self.done.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Waits (at most `within`) until `more` rounds have run after this call.
    pub async fn wait_rounds(&self, more: u64, within: Duration) {
        let from = self.rounds();
        eventually(&format!("{more} more load rounds"), within, || async {
            match self.rounds() - from {
                n if n >= more => Ok(()),
                n => Err(format!("{n} of {more} rounds")),
            }
        })
        .await
    }

    /// Stops after the round under way; how many rounds ran.
    pub async fn stop(self) -> u64 {
        self.running
            .store(false, std::sync::atomic::Ordering::Relaxed);
        self.task.await.expect("the load panicked")
    }
}

/// The worker and etl of one test.
pub struct Running {
    pub worker: Service,
    pub etl: Service,
}

impl Running {
    pub fn logs(&self) -> String {
        format!(
            "--- etl log ---\n{}\n--- worker log ---\n{}",
            self.etl.log_tail(),
            self.worker.log_tail()
        )
    }
}

/// A Sluice binary running as a child process, its output in a log file.
pub struct Service {
    pub bin: &'static str,
    pub config: PathBuf,
    pub log: PathBuf,
    env: Vec<(String, String)>,
    child: Option<Child>,
    /// Stopped by SIGSTOP and not continued since.
    pub paused: bool,
    /// Where its `/metrics`, `/healthz` and `/readyz` are served.
    pub telemetry: std::net::SocketAddr,
}

impl Service {
    pub(crate) fn new(bin: &'static str, config: PathBuf, log: PathBuf) -> Service {
        Service {
            bin,
            config,
            log,
            env: Vec::new(),
            child: None,
            paused: false,
            telemetry: std::net::SocketAddr::from(([127, 0, 0, 1], 9464)),
        }
    }

    /// An environment variable for the process; a `SLUICE_…` one overrides a key of its
    /// config file (`SLUICE_WORKER__MAX_IN_FLIGHT`).
    pub fn with_env(mut self, key: &str, value: &str) -> Service {
        self.env.push((key.to_owned(), value.to_owned()));
        self
    }

    /// Removes the environment variable `key` for its next start.
    pub fn without_env(&mut self, key: &str) -> &mut Self {
        self.env.retain(|(k, _)| k != key);
        self
    }

    /// Sends `signal` (`STOP`, `CONT`, `TERM`…) to the running process.
    pub fn signal(&mut self, signal: &str) {
        let pid = self
            .pid()
            .unwrap_or_else(|| panic!("{} is not running", self.bin));
        let status = Command::new("kill")
            .arg(format!("-{signal}"))
            .arg(pid.to_string())
            .status()
            .expect("kill");
        assert!(status.success(), "kill -{signal} {pid} failed");
        match signal {
            "STOP" => self.paused = true,
            "CONT" => self.paused = false,
            _ => {}
        }
    }

    /// The binary in `SLUICE_BIN_DIR` when set (`make bench` uses `target/release`),
    /// otherwise in the debug build.
    pub fn binary(bin: &str) -> PathBuf {
        let dir = std::env::var_os("SLUICE_BIN_DIR")
            .filter(|d| !d.is_empty())
            .map(PathBuf::from)
            .unwrap_or_else(|| target_dir().join("debug"));
        let path = dir.join(bin);
        assert!(
            path.exists(),
            "{} is missing: build the binaries first (`cargo build --bins`; `make test` does)",
            path.display()
        );
        path
    }

    pub fn start(&mut self) -> &mut Self {
        assert!(self.child.is_none(), "{} already running", self.bin);
        let log = fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .expect("log file");
        let child = Command::new(Service::binary(self.bin))
            .arg("--config")
            .arg(&self.config)
            // Every SLUICE_* variable is a config override for the services.
            .env_remove("SLUICE_BIN_DIR")
            .env_remove("SLUICE_IT_LOG")
            .env(
                "RUST_LOG",
                std::env::var("SLUICE_IT_LOG")
                    .unwrap_or_else(|_| sluice_runtime::telemetry::DEFAULT_FILTER.into()),
            )
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("log file"))
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {}: {e}", self.bin));
        self.child = Some(child);
        self
    }

    /// `GET` of `path` on its telemetry endpoint: status and body.
    pub async fn ops(&self, path: &str) -> Result<(u16, String), String> {
        let url = format!("http://{}{path}", self.telemetry);
        let answer = reqwest::get(&url)
            .await
            .map_err(|e| format!("{url}: {e}"))?;
        let status = answer.status().as_u16();
        let body = answer.text().await.map_err(|e| format!("{url}: {e}"))?;
        Ok((status, body))
    }

    /// Its `/metrics`: each sample's value by `name{labels}` as the text format writes it.
    pub async fn metrics(&self) -> Result<std::collections::BTreeMap<String, f64>, String> {
        let (status, body) = self.ops("/metrics").await?;
        if status != 200 {
            return Err(format!("/metrics answered {status}: {body}"));
        }
        Ok(body
            .lines()
            .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
            .filter_map(|l| {
                let (series, value) = l.rsplit_once(' ')?;
                Some((series.to_owned(), value.parse().ok()?))
            })
            .collect())
    }

    /// The sum of metric `name`'s samples whose labels include each of `labels`.
    pub async fn metric_sum(&self, name: &str, labels: &[(&str, &str)]) -> Result<f64, String> {
        Ok(self
            .metrics()
            .await?
            .iter()
            .filter(|(k, _)| {
                k.split('{').next() == Some(name)
                    && labels
                        .iter()
                        .all(|(l, v)| k.contains(&format!("{l}=\"{v}\"")))
            })
            .map(|(_, v)| v)
            .sum())
    }

    /// [`Service::metric_sum`] of a running service whose metrics must be readable.
    pub async fn metric(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        self.metric_sum(name, labels)
            .await
            .unwrap_or_else(|e| panic!("{} metrics: {e}", self.bin))
    }

    /// The process's peak resident memory (`VmHWM`), in bytes.
    pub fn peak_rss(&self) -> Option<u64> {
        self.status_bytes("VmHWM:")
    }

    /// The process's resident memory now (`VmRSS`), in bytes.
    pub fn rss(&self) -> Option<u64> {
        self.status_bytes("VmRSS:")
    }

    fn status_bytes(&self, field: &str) -> Option<u64> {
        let status = fs::read_to_string(format!("/proc/{}/status", self.pid()?)).ok()?;
        let line = status.lines().find(|l| l.starts_with(field))?;
        let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
        Some(kib * 1024)
    }

    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// `kill -9`: no drain, no goodbye.
    pub fn kill9(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// SIGTERM, then waits for the exit (at most `within`).
    pub fn terminate(&mut self, within: Duration) -> std::process::ExitStatus {
        self.signal("TERM");
        self.wait_exit(within).unwrap_or_else(|| {
            panic!(
                "{} did not exit within {within:?} of SIGTERM:\n{}",
                self.bin,
                self.log_tail()
            )
        })
    }

    /// Waits at most `within` for the process to exit; `None` (still running) after it.
    pub fn wait_exit(&mut self, within: Duration) -> Option<std::process::ExitStatus> {
        let c = self.child.as_mut().expect("service running");
        let deadline = std::time::Instant::now() + within;
        loop {
            if let Some(status) = c.try_wait().expect("wait") {
                self.child = None;
                return Some(status);
            }
            if std::time::Instant::now() >= deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(50)); // polling a child's exit
        }
    }

    /// Waits until the process aborted at failpoint `name` (armed with
    /// `with_env("FAILPOINTS", …)`); fails when it did not within `within`.
    pub fn wait_failpoint(&mut self, name: &str, within: Duration) {
        use std::os::unix::process::ExitStatusExt as _;
        let status = self.wait_exit(within);
        let said = fs::read_to_string(&self.log)
            .unwrap_or_default()
            .contains(&format!("failpoint {name}: aborting"));
        assert!(
            status.is_some_and(|s| s.signal() == Some(6)) && said,
            "{} did not stop at failpoint {name} within {within:?} (status {status:?}); \
             failpoints exist in debug builds only (`cargo build --bins`; make test does):\n{}",
            self.bin,
            self.log_tail()
        );
    }

    /// Runs the binary to completion (for start-up failures) and returns (status, output).
    pub fn run_to_exit(&self, within: Duration) -> (std::process::ExitStatus, String) {
        let mut child = Command::new(Service::binary(self.bin))
            .arg("--config")
            .arg(&self.config)
            .env_remove("SLUICE_BIN_DIR")
            .env_remove("SLUICE_IT_LOG")
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn");
        let deadline = std::time::Instant::now() + within;
        loop {
            if let Some(status) = child.try_wait().expect("wait") {
                let out = child.wait_with_output().expect("output");
                let text = format!(
                    "{}{}",
                    String::from_utf8_lossy(&out.stdout),
                    String::from_utf8_lossy(&out.stderr)
                );
                return (status, text);
            }
            if std::time::Instant::now() >= deadline {
                let _ = child.kill();
                panic!("{} kept running with a bad config", self.bin);
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    pub fn is_running(&mut self) -> bool {
        self.child
            .as_mut()
            .is_some_and(|c| c.try_wait().ok().flatten().is_none())
    }

    /// How long the service's log is now: a mark for [`Service::logged_since`].
    pub fn log_mark(&self) -> usize {
        fs::metadata(&self.log).map_or(0, |m| m.len() as usize)
    }

    /// `Ok` once the log, after `mark`, contains any of `needles`; otherwise what it says.
    pub fn logged_since(&self, mark: usize, needles: &[&str]) -> Result<(), String> {
        let after = self.log_since(mark);
        if needles.iter().any(|n| after.contains(n)) {
            Ok(())
        } else {
            Err(format!("{} log since the mark:\n{after}", self.bin))
        }
    }

    /// What the service logged after `mark` ([`Service::log_mark`]).
    pub fn log_since(&self, mark: usize) -> String {
        let log = fs::read_to_string(&self.log).unwrap_or_default();
        log.get(mark..).unwrap_or_default().to_owned()
    }

    /// The last lines of the service's log (for failure messages).
    pub fn log_tail(&self) -> String {
        crate::last_lines(&self.log, 40)
    }
}

impl Drop for Service {
    fn drop(&mut self) {
        if std::thread::panicking() {
            // CI keeps only the test's output: the log is the one clue to what happened.
            eprintln!(
                "--- {} log ({}) ---\n{}",
                self.bin,
                self.log.display(),
                self.log_tail()
            );
        }
        self.kill9();
    }
}

/// The value of the one series of `name` whose labels include every `label="value"`.
pub fn sample(
    m: &std::collections::BTreeMap<String, f64>,
    name: &str,
    labels: &[&str],
) -> Option<f64> {
    m.iter()
        .find(|(series, _)| {
            let (n, rest) = series.split_once('{').unwrap_or((series, ""));
            n == name && labels.iter().all(|l| rest.contains(l))
        })
        .map(|(_, v)| *v)
}
