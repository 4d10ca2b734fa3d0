//! A local Sluice cluster for one test: N centers, M workers (cluster mode, tasks from
//! the leader) and one etl following the center's pipelines, each a separate process,
//! all under the test's ZooKeeper root, with the test's own meta database. Sources and
//! pipelines are added the way an operator would: with `sluicectl`.

use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use mysql_async::prelude::*;
use tokio::task::JoinHandle;

use serde_json::Value;
use sluice_proto::v1::admin_client::AdminClient;
use tonic::service::interceptor::{InterceptedService, Interceptor};
use tonic::transport::Channel;

use crate::context::TestCtx;
use crate::ports::{console_port, dictionary_port, free_center_port};
use crate::process::Service;
use crate::{check_table, eventually, CheckOptions, Pipeline};

/// The environment variable the services read the source password from (a source's
/// `password_ref` is `env:` this).
pub const PASSWORD_VAR: &str = "IT_SOURCE_PASSWORD";

/// The admin API's gRPC client, with the token in every call.
pub type Admin = AdminClient<InterceptedService<Channel, Bearer>>;

/// Adds `authorization: Bearer <token>` to each call.
#[derive(Clone)]
pub struct Bearer(tonic::metadata::MetadataValue<tonic::metadata::Ascii>);

impl Bearer {
    /// The header for `token` (an admin or a worker token).
    pub fn new(token: &str) -> Bearer {
        Bearer(
            format!("Bearer {token}")
                .parse()
                .expect("a token fit for a header"),
        )
    }
}

impl Interceptor for Bearer {
    fn call(&mut self, mut req: tonic::Request<()>) -> Result<tonic::Request<()>, tonic::Status> {
        req.metadata_mut().insert("authorization", self.0.clone());
        Ok(req)
    }
}

pub struct Cluster {
    /// The admin token `ctl` calls with.
    pub token: String,
    pub centers: Vec<Service>,
    /// `host:port` of each center's API, by index.
    pub addrs: Vec<String>,
    pub workers: Vec<Service>,
    pub etl: Service,
}

/// A source added to the cluster: one table of the test database, its own binlog task.
pub struct ClusterSource {
    pub name: String,
    pub pipeline: Pipeline,
}

impl TestCtx {
    pub fn meta_db(&self) -> String {
        format!("{}_meta", self.db)
    }

    /// A center's config with the test cluster's token authentication.
    fn center_config(&self, n: usize, port: u16) -> Service {
        self.center_with_api(
            n,
            port,
            &format!(
                "[api]\nauth = \"token\"\ntoken = \"{}\"\nworker_token = \"{}\"\nadmin_password = \"{}\"\n",
                self.secrets.api_token, self.secrets.worker_token, self.secrets.admin_password
            ),
        )
    }

    /// Adds `toml` (whole sections) to the config of every center configured from now on.
    pub fn center_section(&self, toml: &str) {
        self.center_sections
            .lock()
            .expect("sections")
            .push_str(toml);
    }

    /// A center's config with `api` as its `[api]` section.
    pub fn center_with_api(&self, n: usize, port: u16, api: &str) -> Service {
        {
            let mut extra = self.extra.lock().expect("extra");
            if !extra.1.contains(&self.meta_db()) {
                extra.1.push(self.meta_db());
            }
        }
        let url = self
            .routes()
            .meta
            .unwrap_or_else(|| self.stack.mysql_url.clone());
        let opts = mysql_async::Opts::from_url(&url).expect("a mysql:// URL");
        let center = format!(
            "[center]\nid = \"c{n}\"\nlisten = \"127.0.0.1:{port}\"\ndictionary_listen = \"127.0.0.1:{}\"\nconsole_listen = \"127.0.0.1:{}\"\n",
            dictionary_port(port),
            console_port(port)
        );
        let meta = format!(
            "[meta]\nhost = \"{}\"\nport = {}\nuser = \"{}\"\npassword = \"{}\"\ndatabase = \"{}\"\nallow_plaintext = {}\n",
            opts.ip_or_hostname(),
            opts.tcp_port(),
            opts.user().unwrap_or("root"),
            opts.pass().unwrap_or(""),
            self.meta_db(),
            self.plaintext(),
        );
        let balance = "[balance]\nsettle = \"1s\"\nresync = \"2s\"\n";
        let more = self.center_sections.lock().expect("sections").clone();
        self.service(
            "sluice-center",
            &format!("center-{n}"),
            &[
                &center,
                &self.zookeeper_section(),
                &meta,
                api,
                balance,
                &more,
                &self.elasticsearch_section(),
                &self.kafka_section(),
                &self.topics_section(),
            ],
        )
        .with_env(PASSWORD_VAR, &self.stack.source_password)
    }

    fn cluster_worker(&self, n: usize) -> Service {
        let worker = format!(
            "[worker]\nid = \"w{n}\"\nconfirm_interval = \"200ms\"\nreport_interval = \"500ms\"\n"
        );
        let center = format!("[center]\ntoken = \"{}\"\n", self.secrets.worker_token);
        self.service(
            "sluice-worker",
            &format!("worker-{n}"),
            &[
                &worker,
                &self.zookeeper_section(),
                &self.kafka_section(),
                &self.elasticsearch_section(),
                &center,
            ],
        )
        .with_env(PASSWORD_VAR, &self.stack.source_password)
    }

    fn cluster_etl(&self) -> Service {
        self.service(
            "sluice-etl",
            "etl",
            &[&self.etl_sections(), &self.zookeeper_section()],
        )
        .with_env(PASSWORD_VAR, &self.stack.source_password)
    }

    /// One more etl of the cluster's group (member `<group>-<n>`; the cluster's own is
    /// `<group>-1`), not started.
    pub fn another_etl(&self, n: u32) -> Service {
        self.service(
            "sluice-etl",
            &format!("etl-{n}"),
            &[&self.etl_sections(), &self.zookeeper_section()],
        )
        .with_env(PASSWORD_VAR, &self.stack.source_password)
        .with_env("SLUICE_ETL__INSTANCE_ID", &format!("{}-{n}", self.group))
    }

    /// Starts `centers` centers and waits for a leader, then `workers` workers (waiting
    /// until each registered) and the etl.
    pub async fn start_cluster(&self, centers: usize, workers: usize) -> Cluster {
        let mut cluster = self.start_centers(centers).await;
        for _ in 0..workers {
            cluster.add_worker(self).await;
        }
        cluster.etl.start();
        cluster
    }

    /// Starts `centers` centers and waits for a leader, then `workers` workers at once,
    /// waiting until all registered. The etl is configured, not started: a cluster of
    /// sources alone (the scale bench's).
    pub async fn start_cluster_without_etl(&self, centers: usize, workers: usize) -> Cluster {
        let mut cluster = self.start_centers(centers).await;
        cluster.add_workers(self, workers).await;
        cluster
    }

    /// `centers` centers, a leader among them; no worker yet, the etl not started.
    async fn start_centers(&self, centers: usize) -> Cluster {
        let mut cluster = Cluster {
            token: self.secrets.api_token.clone(),
            centers: Vec::new(),
            addrs: Vec::new(),
            workers: Vec::new(),
            etl: self.cluster_etl(),
        };
        for n in 0..centers {
            let port = free_center_port();
            let mut center = self.center_config(n, port);
            center.start();
            cluster.centers.push(center);
            cluster.addrs.push(format!("127.0.0.1:{port}"));
        }
        cluster.wait_leader(Duration::from_secs(30), None).await;
        // One center answering says nothing of the others: each is waited for.
        for addr in &cluster.addrs {
            crate::eventually(
                &format!("the center at {addr} takes connections"),
                Duration::from_secs(30),
                || async {
                    tokio::net::TcpStream::connect(addr)
                        .await
                        .map(drop)
                        .map_err(|e| format!("{e}\n{}", cluster.logs()))
                },
            )
            .await;
        }
        cluster
    }

    /// Adds table `table` of the test database as a source of its own (a binlog task)
    /// with a pipeline to an index, through `sluicectl`.
    pub async fn add_source(&self, cluster: &Cluster, table: &str, n: u32) -> ClusterSource {
        let source = self.put_source(cluster, table, n);
        self.put_pipeline(cluster, &source, &[] as &[&str])
            .unwrap_or_else(|e| panic!("{e}"));
        source
    }

    /// Adds table `table` of the test database as a source of its own, without its
    /// pipeline (see [`TestCtx::put_pipeline`]).
    pub fn put_source(&self, cluster: &Cluster, table: &str, n: u32) -> ClusterSource {
        self.put_source_with(cluster, table, n, &format!("env:{PASSWORD_VAR}"))
    }

    /// [`TestCtx::put_source`] with the source's password named by `password_ref`.
    pub fn put_source_with(
        &self,
        cluster: &Cluster,
        table: &str,
        n: u32,
        password_ref: &str,
    ) -> ClusterSource {
        let name = format!("{}-{table}", self.instance);
        let pipeline = self.pipeline(table);
        let topic = sluice_kafka::TopicConfig::default().rows_topic(&name, &self.db, table);
        self.extra.lock().expect("extra").0.push(topic);
        let server_id = (self.server_id + n).to_string();
        let (host, port) = self.source_endpoint();
        let port = port.to_string();
        let tables = format!("{}.{table}", self.db);
        cluster
            .ctl(&[
                "sources",
                "put",
                &name,
                "--host",
                &host,
                "--port",
                &port,
                "--user",
                &self.stack.source_user,
                "--password-ref",
                password_ref,
                "--server-id",
                &server_id,
                "--tables",
                &tables,
            ])
            .unwrap_or_else(|e| panic!("sluicectl sources put: {e}"));
        ClusterSource { name, pipeline }
    }

    /// Puts `spec` as an operator would: `sluicectl pipelines put NAME --spec FILE`, the
    /// file a JSON one in the test's directory. sluicectl's JSON answer or its error.
    pub fn put_spec(&self, cluster: &Cluster, spec: &Value) -> Result<Value, String> {
        let name = spec["name"].as_str().expect("the spec has a name");
        let path = self.dir.join(format!("{name}.json"));
        std::fs::write(&path, serde_json::to_vec_pretty(spec).expect("JSON")).expect("spec file");
        cluster.ctl(&["pipelines", "put", name, "--spec", &path.to_string_lossy()])
    }

    /// (Re)puts `source`'s pipeline (named like its alias), with `extra` sluicectl
    /// arguments (`--field ...`, `--shards 2`); sluicectl's JSON answer or its error.
    pub fn put_pipeline(
        &self,
        cluster: &Cluster,
        source: &ClusterSource,
        extra: &[impl AsRef<str>],
    ) -> Result<Value, String> {
        let p = &source.pipeline;
        let mut args = vec![
            "pipelines",
            "put",
            &p.alias,
            "--source",
            &source.name,
            "--database",
            &self.db,
            "--table",
            &p.table,
            "--alias",
            &p.alias,
            "--replicas",
            "0",
        ];
        args.extend(extra.iter().map(AsRef::as_ref));
        cluster.ctl(&args)
    }
}

/// One row of `sluicectl tasks`.
#[derive(Debug, Clone, PartialEq)]
pub struct TaskView {
    pub source: String,
    pub assigned_to: String,
    pub running_on: String,
    pub position: String,
}

impl Cluster {
    pub fn worker_id(n: usize) -> String {
        format!("w{n}")
    }

    /// Starts one more worker and waits until it is registered.
    pub async fn add_worker(&mut self, ctx: &TestCtx) -> usize {
        self.add_workers(ctx, 1).await.start
    }

    /// Starts `count` more workers together and waits until every one is registered;
    /// their indexes.
    pub async fn add_workers(&mut self, ctx: &TestCtx, count: usize) -> std::ops::Range<usize> {
        let first = self.workers.len();
        for n in first..first + count {
            let mut w = ctx.cluster_worker(n);
            w.start();
            self.workers.push(w);
        }
        let ids: Vec<String> = (first..first + count).map(Cluster::worker_id).collect();
        eventually(
            &format!("workers {ids:?} registered"),
            Duration::from_secs(30 + count as u64),
            || async {
                let workers = self.ctl(&["workers"])?;
                let listed = |id: &String| {
                    workers
                        .as_array()
                        .is_some_and(|a| a.iter().any(|w| w["id"] == id.as_str()))
                };
                if ids.iter().all(listed) {
                    Ok(())
                } else {
                    Err(format!("workers: {workers}\n{}", self.logs()))
                }
            },
        )
        .await;
        first..first + count
    }

    /// Runs `sluicectl --output json ARGS` against every live center; the parsed output.
    pub fn ctl(&self, args: &[&str]) -> Result<Value, String> {
        self.ctl_with(&self.token, args)
    }

    /// The web console of center `n`.
    pub fn console_url(&self, n: usize) -> String {
        let port: u16 = self.addrs[n]
            .rsplit(':')
            .next()
            .and_then(|p| p.parse().ok())
            .expect("a center's port");
        format!("http://127.0.0.1:{}", console_port(port))
    }

    /// [`Cluster::ctl`] with `envs` set for sluicectl (a password it reads from one).
    pub fn ctl_env(&self, args: &[&str], envs: &[(&str, &str)]) -> Result<Value, String> {
        self.ctl_run(&self.token, args, envs)
    }

    /// [`Cluster::ctl`] with another bearer token (a user's).
    pub fn ctl_with(&self, token: &str, args: &[&str]) -> Result<Value, String> {
        self.ctl_run(token, args, &[])
    }

    fn ctl_run(&self, token: &str, args: &[&str], envs: &[(&str, &str)]) -> Result<Value, String> {
        let centers: Vec<String> = self
            .addrs
            .iter()
            .zip(&self.centers)
            .filter(|(_, c)| c.pid().is_some() && !c.paused)
            .map(|(a, _)| format!("http://{a}"))
            .collect();
        let out = Command::new(Service::binary("sluicectl"))
            .arg("--center")
            .arg(centers.join(","))
            .arg("--output")
            .arg("json")
            .args(args)
            .env("SLUICECTL_TOKEN", token)
            .envs(envs.iter().copied())
            .output()
            .map_err(|e| format!("cannot run sluicectl: {e}"))?;
        if !out.status.success() {
            return Err(format!(
                "sluicectl {}: {}",
                args.join(" "),
                String::from_utf8_lossy(&out.stderr)
            ));
        }
        serde_json::from_slice(&out.stdout).map_err(|e| format!("sluicectl output: {e}"))
    }

    /// A gRPC client of the first live center's admin API, calling with the admin token
    /// (what an application other than sluicectl sees).
    pub async fn admin(&self) -> Admin {
        let addr = self
            .addrs
            .iter()
            .zip(&self.centers)
            .find(|(_, c)| c.pid().is_some() && !c.paused)
            .map(|(a, _)| format!("http://{a}"))
            .expect("a live center");
        let channel = tonic::transport::Endpoint::from_shared(addr)
            .expect("a center's address")
            .connect()
            .await
            .expect("connect to a center's API");
        AdminClient::with_interceptor(channel, Bearer::new(&self.token))
    }

    /// Runs `sluicectl ARGS` against the first center as a caller holding `token` (none:
    /// no token at all); whether it succeeded, and what it said on stderr.
    pub fn ctl_as(&self, token: Option<&str>, args: &[&str]) -> (bool, String) {
        let mut cmd = Command::new(Service::binary("sluicectl"));
        cmd.arg("--center")
            .arg(format!("http://{}", self.addrs[0]))
            .args(args)
            .env_remove("SLUICECTL_TOKEN");
        if let Some(t) = token {
            cmd.env("SLUICECTL_TOKEN", t);
        }
        let out = cmd.output().expect("run sluicectl");
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    }

    /// Waits for a leader other than `not` (a center index); returns its index and epoch.
    pub async fn wait_leader(&self, within: Duration, not: Option<usize>) -> (usize, u64) {
        eventually("a center leads", within, || async {
            let l = self.ctl(&["leader"])?;
            let id = l["leader_id"].as_str().unwrap_or_default();
            let idx = id
                .strip_prefix('c')
                .and_then(|n| n.parse::<usize>().ok())
                .filter(|i| {
                    Some(*i) != not && self.centers.get(*i).is_some_and(|c| c.pid().is_some())
                });
            match idx {
                Some(i) => Ok((i, l["epoch"].as_u64().unwrap_or(0))),
                None => Err(format!("leader: {l}\n{}", self.logs())),
            }
        })
        .await
    }

    pub fn tasks(&self) -> Result<Vec<TaskView>, String> {
        let v = self.ctl(&["tasks"])?;
        Ok(v.as_array()
            .cloned()
            .unwrap_or_default()
            .iter()
            .map(|t| TaskView {
                source: t["source"].as_str().unwrap_or_default().to_owned(),
                assigned_to: t["assigned_to"].as_str().unwrap_or_default().to_owned(),
                running_on: t["running_on"].as_str().unwrap_or_default().to_owned(),
                position: t["position"].as_str().unwrap_or_default().to_owned(),
            })
            .collect())
    }

    /// Waits until every task in `sources` runs on the worker it is assigned to (a live
    /// one) and has confirmed a position — a new task starts at the end of the binlog, so
    /// only writes after this are sure to be streamed. Returns task → worker.
    pub async fn wait_running(
        &self,
        sources: &[&ClusterSource],
        within: Duration,
    ) -> std::collections::BTreeMap<String, String> {
        eventually("every task runs where it is assigned", within, || async {
            let tasks = self.tasks()?;
            let mut placed = std::collections::BTreeMap::new();
            for s in sources {
                let t = tasks
                    .iter()
                    .find(|t| t.source == s.name)
                    .ok_or_else(|| format!("no task {} in {tasks:?}", s.name))?;
                if t.running_on.is_empty() || t.running_on != t.assigned_to || t.position.is_empty()
                {
                    return Err(format!("{t:?}\n{}", self.logs()));
                }
                placed.insert(t.source.clone(), t.running_on.clone());
            }
            Ok(placed)
        })
        .await
    }

    /// Waits until `pipeline`'s index equals its table.
    pub async fn converges(&self, ctx: &TestCtx, pipeline: &Pipeline, within: Duration) {
        let (table, alias) = (&pipeline.table, &pipeline.alias);
        eventually(&format!("{table} equals {alias}"), within, || async {
            check_table(ctx, table, alias, &CheckOptions::default())
                .await
                .map_err(|e| format!("{e}\n{}", self.logs()))
        })
        .await;
    }

    /// Waits until `pipeline`'s build is done (the alias moved); its last status.
    /// Waits (up to two minutes) for an event of `kind` about `subject` whose message
    /// contains every one of `words`; its message.
    pub async fn wait_event(&self, subject: &str, kind: &str, words: &[&str]) -> String {
        eventually(
            &format!("a {kind} event about {subject} naming {words:?}"),
            Duration::from_secs(120),
            || async {
                let events = self.ctl(&["events", "--subject", subject])?;
                let hit = events.as_array().into_iter().flatten().find_map(|e| {
                    let message = e["message"].as_str()?;
                    (e["kind"] == kind && words.iter().all(|w| message.contains(w)))
                        .then(|| message.to_owned())
                });
                hit.ok_or_else(|| format!("events: {events}\n{}", self.logs()))
            },
        )
        .await
    }

    /// Waits until run `id` (a check, compare or delayed job), as `sluicectl LIST...`
    /// lists it, is no longer running; returns its row.
    /// Runs `pipelines check ALIAS EXTRA...` to its end; the check as `pipelines checks`
    /// shows it (its rate printed).
    pub async fn check(&self, alias: &str, extra: &[&str]) -> Value {
        let mut args = vec!["pipelines", "check", alias];
        args.extend(extra);
        let started = self.ctl(&args).expect("the check starts");
        let id = started[0]["id"].as_u64().expect("a check id");
        let list = ["pipelines", "checks", alias];
        let c = self
            .wait_run_ended(&list, id, Duration::from_secs(180))
            .await;
        let took = (c["finished_at_ms"].as_i64().unwrap_or(0)
            - c["started_at_ms"].as_i64().unwrap_or(0))
        .max(1);
        eprintln!(
            "check {}: {} documents in {took} ms ({:.0} documents/s), {} skipped, {} repaired",
            c["id"],
            c["documents"],
            c["documents"].as_f64().unwrap_or(0.0) * 1000.0 / took as f64,
            c["skipped"],
            c["repaired"]
        );
        c
    }

    pub async fn wait_run_ended(&self, list: &[&str], id: u64, within: Duration) -> Value {
        eventually(&format!("run {id} ends"), within, || async {
            let rows = self.ctl(list).map_err(|e| e.to_string())?;
            let run = rows
                .as_array()
                .and_then(|l| l.iter().find(|r| r["id"].as_u64() == Some(id)))
                .cloned()
                .ok_or_else(|| format!("run {id} not listed: {rows}"))?;
            match run["state"].as_str() {
                Some("running") => Err(format!("still running: {run}\n{}", self.logs())),
                _ => Ok(run),
            }
        })
        .await
    }

    /// Waits until `index` (an alias or one version) equals `table`, row for row.
    pub async fn wait_equal(&self, ctx: &TestCtx, table: &str, index: &str) {
        eventually(
            &format!("{index} equals table {table}"),
            Duration::from_secs(90),
            || async {
                check_table(ctx, table, index, &CheckOptions::default())
                    .await
                    .map_err(|e| format!("{e}\n{}", self.logs()))
            },
        )
        .await;
    }

    pub async fn wait_built(&self, pipeline: &str, within: Duration) -> Value {
        eventually(
            &format!("the build of {pipeline} finishes"),
            within,
            || async {
                let s = self.ctl(&["pipelines", "status", pipeline])?;
                if s["phase"] == "done" {
                    Ok(s)
                } else {
                    Err(format!("{s}\n{}", self.logs()))
                }
            },
        )
        .await
    }

    pub fn worker_index(id: &str) -> usize {
        id.strip_prefix('w')
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("`{id}` is not a test worker id"))
    }

    pub fn logs(&self) -> String {
        let mut out = String::new();
        for s in self.centers.iter().chain(&self.workers).chain([&self.etl]) {
            out.push_str(&format!(
                "--- {} ({}) ---\n{}\n",
                s.bin,
                s.log.display(),
                s.log_tail()
            ));
        }
        out
    }
}

/// How long `probe` took to succeed, polled every 100 ms (for failover figures); panics
/// after `within`.
pub async fn time_until<F, Fut>(what: &str, within: Duration, mut probe: F) -> Duration
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<(), String>>,
{
    let started = Instant::now();
    loop {
        let last = match probe().await {
            Ok(()) => return started.elapsed(),
            Err(e) => e,
        };
        if started.elapsed() >= within {
            panic!("{what}: not reached within {within:?}; last observation:\n{last}");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Inserts and updates rows of `tables` (`id BIGINT PRIMARY KEY, v BIGINT`) of the test
/// database until stopped; returns how many rounds ran.
pub fn write_load(ctx: &TestCtx, tables: &[&str]) -> (Arc<AtomicBool>, JoinHandle<u64>) {
    write_load_counted(ctx, tables, Arc::new(AtomicU64::new(0)))
}

/// [`write_load`], counting the rounds in `rounds` as they go.
pub fn write_load_counted(
    ctx: &TestCtx,
    tables: &[&str],
    rounds: Arc<AtomicU64>,
) -> (Arc<AtomicBool>, JoinHandle<u64>) {
    let stop = Arc::new(AtomicBool::new(false));
    let pool = ctx.stack.mysql.clone();
    let db = ctx.db.clone();
    let tables: Vec<String> = tables.iter().map(|t| (*t).to_owned()).collect();
    let flag = stop.clone();
    let handle = tokio::spawn(async move {
        let mut conn = pool.get_conn().await.expect("MySQL");
        conn.query_drop(format!("USE `{db}`")).await.expect("use");
        let mut n = 0u64;
        while !flag.load(Ordering::Relaxed) {
            n += 1;
            for t in &tables {
                conn.query_drop(format!("INSERT INTO {t} VALUES ({n}, {n})"))
                    .await
                    .expect("insert");
                if n % 3 == 0 {
                    conn.query_drop(format!("UPDATE {t} SET v = v + 1000 WHERE id = {}", n - 1))
                        .await
                        .expect("update");
                }
            }
            rounds.store(n, Ordering::Relaxed);
            tokio::time::sleep(Duration::from_millis(20)).await; // pacing a load, not a wait
        }
        n
    });
    (stop, handle)
}
