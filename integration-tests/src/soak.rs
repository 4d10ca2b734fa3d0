//! The chaos soak (`make soak`, and a short one in CI): a sysbench-like write load
//! (`oltp_write_only`: per transaction an index update, a non-index update, a delete and
//! an insert) on several tables, each its own source, streamed by a cluster of two
//! centers and two workers, while a chaos loop injects at random every fault below; then
//! the checker on every table. The cluster reaches MySQL, Kafka, Elasticsearch and a
//! ZooKeeper of its own through fault proxies, so nothing the other tests share is
//! disturbed.
//!
//! Settings (environment): `SOAK_MINUTES` (default 10, fractions allowed), `SOAK_TABLES`
//! (4), `SOAK_ROWS` per table (2000), `SOAK_TPS` transactions per second in all (100),
//! `SOAK_FAULT_EVERY` most seconds between faults (15), `SOAK_KAFKA_OUTAGE` seconds (20),
//! `SOAK_SEED` (the clock's; printed, to replay a run's order of faults).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use mysql_async::prelude::*;

use crate::broker::PrivateKafka;
use crate::context::SESSION_TIMEOUT as SESSION;
use crate::proxy::{HttpFault, HttpProxy, Mode, Proxy};
use crate::zookeeper::PrivateZookeeper;
use crate::{
    check_table, env_num, CheckOptions, Cluster, ClusterSource, Service, Stack, TestCtx, Xorshift,
};
/// How long the index may take to equal the tables once the faults have stopped.
const SETTLE: Duration = Duration::from_secs(300);

#[derive(Debug, Clone)]
pub struct SoakOptions {
    pub duration: Duration,
    pub tables: usize,
    pub rows: u64,
    pub tps: u32,
    pub fault_every: Duration,
    pub kafka_outage: Duration,
    pub seed: u64,
}

impl SoakOptions {
    /// From the environment, `minutes` when `SOAK_MINUTES` is unset.
    pub fn from_env(minutes: f64) -> anyhow::Result<SoakOptions> {
        let clock = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(1, |d| d.as_nanos() as u64);
        Ok(SoakOptions {
            duration: Duration::from_secs_f64(env_num("SOAK_MINUTES", minutes)? * 60.0),
            tables: env_num("SOAK_TABLES", 4)?,
            rows: env_num("SOAK_ROWS", 2_000)?,
            tps: env_num("SOAK_TPS", 100)?,
            fault_every: Duration::from_secs(env_num("SOAK_FAULT_EVERY", 15)?),
            kafka_outage: Duration::from_secs(env_num("SOAK_KAFKA_OUTAGE", 20)?),
            seed: env_num("SOAK_SEED", clock)?,
        })
    }
}

/// Every fault the chaos loop injects.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Fault {
    KillWorker,
    KillEtl,
    KillLeader,
    StopWorker,
    StopLeader,
    CutMysql,
    CutKafka,
    ZookeeperStorm,
    EsThrottled,
    EsLostMidBulk,
    KafkaBlackhole,
    ZookeeperRestart,
}

impl Fault {
    pub const ALL: [Fault; 12] = [
        Fault::KillWorker,
        Fault::KillEtl,
        Fault::KillLeader,
        Fault::StopWorker,
        Fault::StopLeader,
        Fault::CutMysql,
        Fault::CutKafka,
        Fault::ZookeeperStorm,
        Fault::EsThrottled,
        Fault::EsLostMidBulk,
        Fault::KafkaBlackhole,
        Fault::ZookeeperRestart,
    ];

    pub fn describe(self) -> &'static str {
        match self {
            Fault::KillWorker => "kill -9 of a worker",
            Fault::KillEtl => "kill -9 of the etl",
            Fault::KillLeader => "kill -9 of the leader",
            Fault::StopWorker => "SIGSTOP of a worker past its session",
            Fault::StopLeader => "SIGSTOP of the leader past its session",
            Fault::CutMysql => "every MySQL connection cut",
            Fault::CutKafka => "every Kafka connection cut",
            Fault::ZookeeperStorm => "every ZooKeeper connection cut (reconnect storm)",
            Fault::EsThrottled => "a burst of 429 from Elasticsearch",
            Fault::EsLostMidBulk => "Elasticsearch lost mid-bulk",
            Fault::KafkaBlackhole => "Kafka black-holed",
            Fault::ZookeeperRestart => "ZooKeeper restarted (kill -9)",
        }
    }
}

/// What a soak did and found.
#[derive(Debug)]
pub struct SoakReport {
    pub seed: u64,
    pub ran: Duration,
    pub faults: BTreeMap<Fault, u32>,
    pub transactions: u64,
    /// Row changes the load committed (each one an event the pipeline must carry).
    pub row_changes: u64,
    /// Events the workers published, summed over their restarts (replays included).
    pub published: f64,
    /// How long probe changes took from their commit to being readable in the index: the
    /// median and the longest.
    pub median_lag: Duration,
    pub worst_lag: Duration,
    pub probes: u64,
    /// How long the index took to equal the tables after the last fault.
    pub settled_in: Duration,
    /// Confirmed positions read between faults (each compared with the one before).
    pub checkpoints_sampled: u64,
    /// `Ok` when every table equals its index and no checkpoint moved backwards.
    pub verdict: Result<(), String>,
}

impl std::fmt::Display for SoakReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(f, "soak: {:.0?} (seed {})", self.ran, self.seed)?;
        let total: u32 = self.faults.values().sum();
        writeln!(f, "  faults injected: {total}")?;
        for (fault, n) in &self.faults {
            writeln!(f, "    {n:>4} × {}", fault.describe())?;
        }
        writeln!(
            f,
            "  load: {} transactions, {} row changes; events published by the workers: {:.0}",
            self.transactions, self.row_changes, self.published
        )?;
        writeln!(
            f,
            "  lag (commit → readable in the index, {} probes): median {:.1?}, worst {:.1?}",
            self.probes, self.median_lag, self.worst_lag
        )?;
        writeln!(
            f,
            "  index equal to the tables {:.1?} after the last fault; {} checkpoints sampled, none moved backwards unless said below",
            self.settled_in, self.checkpoints_sampled
        )?;
        match &self.verdict {
            Ok(()) => write!(
                f,
                "  verdict: PASS (every row of every table equals its document)"
            ),
            Err(e) => write!(f, "  verdict: FAIL\n{e}"),
        }
    }
}

impl SoakReport {
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::json!({
            "seed": self.seed,
            "seconds": self.ran.as_secs_f64(),
            "faults": self.faults.iter().map(|(f, n)| (f.describe(), *n)).collect::<BTreeMap<_, _>>(),
            "transactions": self.transactions,
            "row_changes": self.row_changes,
            "published": self.published,
            "median_lag_seconds": self.median_lag.as_secs_f64(),
            "worst_lag_seconds": self.worst_lag.as_secs_f64(),
            "probes": self.probes,
            "settled_seconds": self.settled_in.as_secs_f64(),
            "checkpoints_sampled": self.checkpoints_sampled,
            "pass": self.verdict.is_ok(),
            "failure": self.verdict.as_ref().err(),
        })
    }
}

/// The proxies and private servers the cluster reaches everything through.
struct Faults {
    zookeeper: PrivateZookeeper,
    kafka: PrivateKafka,
    mysql: Proxy,
    elasticsearch: HttpProxy,
}

pub async fn run(opts: &SoakOptions) -> SoakReport {
    let mut stack = Stack::connect().await;
    let mut faults = Faults {
        zookeeper: PrivateZookeeper::start().await,
        kafka: PrivateKafka::start().await,
        mysql: Proxy::start(&format!("{}:{}", stack.mysql_host, stack.mysql_port)).await,
        elasticsearch: HttpProxy::start(&stack.es_url, "_bulk").await,
    };
    // The test's own ZooKeeper client goes to the server directly, past the proxy.
    stack.zookeeper = faults.zookeeper.addr();
    let ctx = TestCtx::on("soak", stack).await;
    ctx.route_zookeeper(&faults.zookeeper.proxy.addr());
    ctx.route_kafka(&faults.kafka.brokers());
    ctx.route_mysql(&faults.mysql.addr());
    ctx.route_elasticsearch(&faults.elasticsearch.url());
    let tables: Vec<String> = (1..=opts.tables).map(|n| format!("sbtest{n}")).collect();
    let (mut cluster, sources) = start_cluster(&ctx, &tables).await;

    let load = WriteLoad::start(&ctx, &tables, opts).await;
    let probe = LagProbe::start(&ctx, &sources);
    let mut watch = Watch {
        published: Published::default(),
        positions: Positions::new(&ctx),
        sources: &sources,
    };
    let started = Instant::now();
    let injected = chaos(opts, &mut cluster, &mut faults, &mut watch).await;
    let ran = started.elapsed();
    let (transactions, row_changes) = load.stop().await;
    let last_fault = Instant::now();
    let mut verdict = settle(&ctx, &sources).await;
    let settled_in = last_fault.elapsed();
    watch.sample(&cluster).await;
    if let Some(e) = watch.positions.regressed.take() {
        verdict = Err(match verdict {
            Ok(()) => e,
            Err(more) => format!("{e}\n{more}"),
        });
    }
    let mut lags = probe.stop().await;
    lags.sort();
    let report = SoakReport {
        seed: opts.seed,
        ran,
        faults: injected,
        transactions,
        row_changes,
        published: watch.published.total,
        median_lag: lags.get(lags.len() / 2).copied().unwrap_or_default(),
        worst_lag: lags.last().copied().unwrap_or_default(),
        probes: lags.len() as u64,
        settled_in,
        checkpoints_sampled: watch.positions.samples,
        verdict,
    };
    if report.verdict.is_ok() {
        drop(cluster);
        ctx.cleanup().await;
    } else {
        // The report first: the logs after it are long, and a CI excerpt may cut them.
        eprintln!("{report}\n{}", cluster.logs());
        ctx.keep();
    }
    report
}

/// The sbtest-like tables, each a source of its own with its pipeline, on a cluster of
/// two centers and two workers; returns once every task streams.
async fn start_cluster(ctx: &TestCtx, tables: &[String]) -> (Cluster, Vec<ClusterSource>) {
    for t in tables {
        ctx.exec(&format!(
            "CREATE TABLE {t} (id INT PRIMARY KEY, k INT NOT NULL, c CHAR(120) NOT NULL, \
             pad CHAR(60) NOT NULL, KEY k_{t} (k))"
        ))
        .await;
    }
    let cluster = ctx.start_cluster(2, 2).await;
    let mut sources = Vec::new();
    for (n, t) in tables.iter().enumerate() {
        sources.push(ctx.add_source(&cluster, t, n as u32 + 1).await);
    }
    let refs: Vec<&ClusterSource> = sources.iter().collect();
    cluster.wait_running(&refs, Duration::from_secs(90)).await;
    (cluster, sources)
}

/// The chaos loop: the faults in a shuffled order, again and again, each followed by a
/// random gap, until the time is up and every fault has been injected at least once.
async fn chaos(
    opts: &SoakOptions,
    cluster: &mut Cluster,
    faults: &mut Faults,
    watch: &mut Watch<'_>,
) -> BTreeMap<Fault, u32> {
    let mut dice = Xorshift(opts.seed | 1);
    let mut injected: BTreeMap<Fault, u32> = BTreeMap::new();
    let started = Instant::now();
    let mut order = Vec::new();
    while started.elapsed() < opts.duration || injected.len() < Fault::ALL.len() {
        if order.is_empty() {
            order = Fault::ALL.to_vec();
            dice.shuffle(&mut order);
        }
        let fault = order.pop().expect("a fault");
        eprintln!("[soak {:>6.1?}] {}", started.elapsed(), fault.describe());
        watch.published.sample(cluster).await;
        inject(fault, cluster, faults, &mut dice, opts).await;
        *injected.entry(fault).or_default() += 1;
        let until = Instant::now() + dice.between(Duration::from_secs(1), opts.fault_every);
        while Instant::now() < until {
            tokio::time::sleep(Duration::from_secs(1)).await; // the gap between faults
            watch.sample(cluster).await;
        }
    }
    injected
}

/// What is sampled between faults.
struct Watch<'a> {
    published: Published,
    positions: Positions,
    sources: &'a [ClusterSource],
}

impl Watch<'_> {
    async fn sample(&mut self, cluster: &Cluster) {
        self.published.sample(cluster).await;
        self.positions.sample(self.sources).await;
    }
}

/// Injects `fault` and undoes it (restarts what it killed, continues what it stopped,
/// opens what it closed) before returning.
async fn inject(
    fault: Fault,
    cluster: &mut Cluster,
    faults: &mut Faults,
    dice: &mut Xorshift,
    opts: &SoakOptions,
) {
    let brief = dice.between(Duration::from_millis(200), Duration::from_secs(3));
    let past_session = SESSION + dice.between(Duration::from_secs(2), Duration::from_secs(6));
    match fault {
        Fault::KillWorker => {
            let w = dice.below(cluster.workers.len() as u64) as usize;
            restart_after(&mut cluster.workers[w], brief).await;
        }
        Fault::KillEtl => restart_after(&mut cluster.etl, brief).await,
        Fault::KillLeader => {
            let c = leader(cluster, dice);
            restart_after(&mut cluster.centers[c], brief).await;
        }
        Fault::StopWorker => {
            let w = dice.below(cluster.workers.len() as u64) as usize;
            pause(&mut cluster.workers[w], past_session).await;
        }
        Fault::StopLeader => {
            let c = leader(cluster, dice);
            pause(&mut cluster.centers[c], past_session).await;
        }
        Fault::CutMysql => faults.mysql.cut(),
        Fault::CutKafka => faults.kafka.proxy.cut(),
        Fault::ZookeeperStorm => faults.zookeeper.proxy.cut(),
        Fault::EsThrottled => {
            faults.elasticsearch.inject(HttpFault::Answer(429), 8);
            drain(&faults.elasticsearch).await;
        }
        Fault::EsLostMidBulk => {
            faults.elasticsearch.inject(HttpFault::DropBeforeForward, 2);
            faults.elasticsearch.inject(HttpFault::DropAfterForward, 2);
            faults.elasticsearch.inject(HttpFault::Answer(503), 3);
            drain(&faults.elasticsearch).await;
        }
        Fault::KafkaBlackhole => {
            faults.kafka.proxy.set(Mode::Blackhole);
            tokio::time::sleep(opts.kafka_outage).await; // the outage's length
            faults.kafka.proxy.set(Mode::Open);
        }
        Fault::ZookeeperRestart => faults.zookeeper.restart(brief).await,
    }
}

/// `kill -9`, and the same service started again after `down_for`.
async fn restart_after(service: &mut Service, down_for: Duration) {
    if service.paused {
        service.signal("CONT");
    }
    service.kill9();
    tokio::time::sleep(down_for).await; // how long it stays down
    service.start();
}

/// SIGSTOP for `stopped_for`, then SIGCONT.
async fn pause(service: &mut Service, stopped_for: Duration) {
    service.signal("STOP");
    tokio::time::sleep(stopped_for).await; // how long it stays stopped
    service.signal("CONT");
}

/// The leading center's index, or any center when no leader can be asked now (the
/// previous fault may still be settling).
fn leader(cluster: &Cluster, dice: &mut Xorshift) -> usize {
    cluster
        .ctl(&["leader"])
        .ok()
        .and_then(|l| {
            let id = l["leader_id"].as_str()?.strip_prefix('c')?.parse().ok()?;
            (id < cluster.centers.len()).then_some(id)
        })
        .unwrap_or_else(|| dice.below(cluster.centers.len() as u64) as usize)
}

/// Waits until the etl has met every queued Elasticsearch fault (it retries until it
/// has), at most a minute: a stuck etl shows in the verdict, not here.
async fn drain(proxy: &HttpProxy) {
    let until = Instant::now() + Duration::from_secs(60);
    while proxy.pending() > 0 && Instant::now() < until {
        tokio::time::sleep(Duration::from_millis(200)).await; // polling the proxy's queue
    }
    proxy.clear();
}

/// After the faults: every table equals its index within [`SETTLE`], or why not.
async fn settle(ctx: &TestCtx, sources: &[ClusterSource]) -> Result<(), String> {
    let until = Instant::now() + SETTLE;
    let mut failures = Vec::new();
    for s in sources {
        let (table, alias) = (&s.pipeline.table, &s.pipeline.alias);
        loop {
            match check_table(ctx, table, alias, &CheckOptions::default()).await {
                Ok(()) => break,
                Err(e) if Instant::now() >= until => {
                    // The verdict names the rows that differ.
                    let every_row = CheckOptions {
                        every_row: true,
                        ..CheckOptions::default()
                    };
                    let e = check_table(ctx, table, alias, &every_row)
                        .await
                        .err()
                        .unwrap_or(e);
                    failures.push(format!("{table} does not equal {alias}: {e}"));
                    break;
                }
                Err(_) => tokio::time::sleep(Duration::from_secs(1)).await, // polling the checker
            }
        }
    }
    if failures.is_empty() {
        Ok(())
    } else {
        Err(failures.join("\n"))
    }
}

/// The write load: one connection per table, `oltp_write_only`'s transaction at a
/// steady rate; it first fills each table with `rows` rows (and row 0, the lag probe's).
struct WriteLoad {
    go: Arc<AtomicBool>,
    transactions: Arc<AtomicU64>,
    rows: Arc<AtomicU64>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl WriteLoad {
    /// Fills the tables, then starts the transactions.
    async fn start(ctx: &TestCtx, tables: &[String], opts: &SoakOptions) -> WriteLoad {
        let go = Arc::new(AtomicBool::new(true));
        let transactions = Arc::new(AtomicU64::new(0));
        let rows = Arc::new(AtomicU64::new(0));
        let mut conn = ctx.stack.conn().await;
        conn.query_drop(format!("USE `{}`", ctx.db))
            .await
            .expect("use");
        for table in tables {
            fill(&mut conn, table, opts.rows, &rows).await;
        }
        let per_table = (opts.tps as f64 / tables.len() as f64).max(0.1);
        let pace = Duration::from_secs_f64(1.0 / per_table);
        let tasks = tables
            .iter()
            .enumerate()
            .map(|(n, table)| {
                let (pool, db, table) = (ctx.stack.mysql.clone(), ctx.db.clone(), table.clone());
                let (go, transactions, rows) = (go.clone(), transactions.clone(), rows.clone());
                let (size, seed) = (opts.rows, opts.seed.wrapping_add(n as u64) | 1);
                tokio::spawn(async move {
                    let mut conn = pool.get_conn().await.expect("MySQL connection");
                    conn.query_drop(format!("USE `{db}`")).await.expect("use");
                    let mut dice = Xorshift(seed);
                    let mut next = Instant::now();
                    while go.load(Ordering::Relaxed) {
                        write_only(&mut conn, &table, size, &mut dice).await;
                        transactions.fetch_add(1, Ordering::Relaxed);
                        rows.fetch_add(4, Ordering::Relaxed);
                        next += pace;
                        tokio::time::sleep_until(next.into()).await; // the load's rate
                    }
                })
            })
            .collect();
        WriteLoad {
            go,
            transactions,
            rows,
            tasks,
        }
    }

    /// Stops it; the transactions and row changes it committed.
    async fn stop(self) -> (u64, u64) {
        self.go.store(false, Ordering::Relaxed);
        for t in self.tasks {
            t.await.expect("the soak's write load panicked");
        }
        (
            self.transactions.load(Ordering::Relaxed),
            self.rows.load(Ordering::Relaxed),
        )
    }
}

async fn fill(conn: &mut mysql_async::Conn, table: &str, size: u64, rows: &AtomicU64) {
    let mut from = 0;
    while from <= size {
        let to = (from + 499).min(size);
        conn.query_drop(format!(
            "INSERT INTO {table} (id, k, c, pad) SELECT seq, seq, CONCAT('c-', seq), 'pad' FROM {}",
            crate::seq(from, to)
        ))
        .await
        .unwrap_or_else(|e| panic!("fill {table}: {e}"));
        rows.fetch_add(to - from + 1, Ordering::Relaxed);
        from = to + 1;
    }
}

/// One `oltp_write_only` transaction (row 0 is left to the lag probe).
async fn write_only(conn: &mut mysql_async::Conn, table: &str, size: u64, dice: &mut Xorshift) {
    let mut id = || 1 + dice.below(size);
    let (a, b, c) = (id(), id(), id());
    let salt = dice.next_u64() % 1_000_000_007;
    let statements = [
        "BEGIN".to_owned(),
        format!("UPDATE {table} SET k = k + 1 WHERE id = {a}"),
        format!("UPDATE {table} SET c = 'c-{salt}' WHERE id = {b}"),
        format!("DELETE FROM {table} WHERE id = {c}"),
        format!("INSERT INTO {table} (id, k, c, pad) VALUES ({c}, {salt}, 'i-{salt}', 'pad')"),
        "COMMIT".to_owned(),
    ];
    for statement in &statements {
        conn.query_drop(statement)
            .await
            .unwrap_or_else(|e| panic!("{statement}: {e}"));
    }
}

/// Commit → readable lag: one probe at a time writes row 0 of a table, round the tables,
/// and polls the index until it holds the value; keeps each probe's lag.
struct LagProbe {
    go: Arc<AtomicBool>,
    task: tokio::task::JoinHandle<Vec<Duration>>,
}

impl LagProbe {
    fn start(ctx: &TestCtx, sources: &[ClusterSource]) -> LagProbe {
        let go = Arc::new(AtomicBool::new(true));
        let targets: Vec<(String, String)> = sources
            .iter()
            .map(|s| (s.pipeline.table.clone(), s.pipeline.alias.clone()))
            .collect();
        let (pool, db, es, flag) = (
            ctx.stack.mysql.clone(),
            ctx.db.clone(),
            ctx.stack.es.clone(),
            go.clone(),
        );
        let task = tokio::spawn(async move {
            let mut conn = pool.get_conn().await.expect("MySQL connection");
            conn.query_drop(format!("USE `{db}`")).await.expect("use");
            let (mut took, mut n) = (Vec::new(), 0u64);
            while flag.load(Ordering::Relaxed) {
                let (table, alias) = &targets[n as usize % targets.len()];
                n += 1;
                let mark = format!("probe-{n}");
                conn.query_drop(format!("UPDATE {table} SET c = '{mark}' WHERE id = 0"))
                    .await
                    .expect("probe write");
                let at = Instant::now();
                let mut told = false;
                loop {
                    let doc = es.mget(alias, &["0".to_owned()]).await.ok();
                    let seen = doc
                        .and_then(|d| d.into_iter().next().flatten())
                        .is_some_and(|d| d["c"] == mark.as_str());
                    if seen || !flag.load(Ordering::Relaxed) {
                        break;
                    }
                    if !told && at.elapsed() > Duration::from_secs(30) {
                        told = true;
                        eprintln!("[probe] {mark} on {table} not in {alias} after 30 s");
                    }
                    tokio::time::sleep(Duration::from_millis(50)).await; // polling the index
                }
                took.push(at.elapsed());
                if told {
                    eprintln!(
                        "[probe] {mark} on {table} arrived after {:.1?}",
                        at.elapsed()
                    );
                }
                tokio::time::sleep(Duration::from_millis(500)).await; // the probe's pace
            }
            took
        });
        LagProbe { go, task }
    }

    /// Stops it; each probe's lag, in order.
    async fn stop(self) -> Vec<Duration> {
        self.go.store(false, Ordering::Relaxed);
        self.task.await.expect("the lag probe panicked")
    }
}

/// Events the workers published, summed over restarts: a counter that went down was
/// restarted, and counts from zero again.
#[derive(Default)]
struct Published {
    last: BTreeMap<usize, f64>,
    total: f64,
}

impl Published {
    async fn sample(&mut self, cluster: &Cluster) {
        for (n, w) in cluster.workers.iter().enumerate() {
            if w.paused || w.pid().is_none() {
                continue;
            }
            let read = tokio::time::timeout(
                Duration::from_secs(2),
                w.metric_sum("sluice_worker_events_total", &[]),
            );
            let Ok(Ok(now)) = read.await else {
                continue;
            };
            let last = self.last.insert(n, now).unwrap_or(0.0);
            self.total += if now >= last { now - last } else { now };
        }
    }
}

/// Each task's confirmed position, sampled between faults: it may only move forward.
/// Its ZooKeeper session is its own, opened again when a restart of the server expired it.
struct Positions {
    zk: sluice_zk::ZkConfig,
    session: Option<sluice_zk::Coordinator>,
    last: BTreeMap<String, sluice_model::BinlogPosition>,
    samples: u64,
    regressed: Option<String>,
}

impl Positions {
    fn new(ctx: &TestCtx) -> Positions {
        Positions {
            zk: ctx.zk_config(),
            session: None,
            last: BTreeMap::new(),
            samples: 0,
            regressed: None,
        }
    }

    async fn sample(&mut self, sources: &[ClusterSource]) {
        if self.session.is_none() {
            let open = tokio::time::timeout(SESSION, sluice_zk::Coordinator::connect(&self.zk));
            self.session = open.await.ok().and_then(Result::ok);
        }
        let Some(zk) = &self.session else { return };
        for s in sources {
            let read = tokio::time::timeout(Duration::from_secs(2), zk.read_checkpoint(&s.name));
            let bytes = match read.await {
                Ok(Ok(Some(bytes))) => bytes,
                Ok(Ok(None)) => continue,
                // A slow answer on a loaded machine: the session may well be fine.
                Err(_) => return,
                Ok(Err(_)) => {
                    self.session = None;
                    return;
                }
            };
            self.samples += 1;
            let Ok(cp) = sluice_model::Checkpoint::from_json(&bytes) else {
                continue;
            };
            if let Some(prev) = self.last.get(&s.name) {
                if cp.position < *prev && self.regressed.is_none() {
                    self.regressed = Some(format!(
                        "the checkpoint of {} moved backwards: {prev} → {}",
                        s.name, cp.position
                    ));
                }
            }
            self.last.insert(s.name.clone(), cp.position);
        }
    }
}
