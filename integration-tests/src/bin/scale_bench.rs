//! `make scale`: many sources on many workers — by default 200 sources on 20 workers and
//! two centers — on the local stack's ZooKeeper, with the harness of the end-to-end tests.
//!
//! The sources live on a few MySQL servers of the bench's own (`SCALE_SERVERS`, default 4,
//! of the lane's flavour, started like the source-lifecycle tests' private servers): each
//! task holds two connections to its server (its binlog, and the size of what it has yet
//! to read), so 200 of them would take more than the stack's shared servers admit
//! (`max_connections` 151 each) from every other test. Every source is a server and a
//! database of its own (`scale_<n>.*`); the servers are shared.
//!
//! 1. Registration: every source put through the leader's admin API (as an operator's
//!    script would), one after the other, timed until each task runs on the worker it is
//!    assigned to (it holds the task's lock) and has confirmed a position.
//! 2. The steady state: `SCALE_STEADY_PASSES` (default 100) reconcile passes of the
//!    leader, one every `SCALE_RESYNC` (default 500ms) with nothing changing; the pass's
//!    p50 and p99 from the leader's `sluice_center_reconcile_seconds` histogram (target:
//!    p99 under 100 ms), and the ZooKeeper writes per pass from its
//!    `sluice_center_zk_writes_total` (target: none) and reads per pass (no target).
//! 3. One change: one more source added; the ZooKeeper writes the leader made for it, API
//!    call and passes (target: one source's few records, not a rewrite of the layout).
//! 4. A worker killed (`kill -9`): every task of it must run on another worker within the
//!    ZooKeeper session timeout (4 s) + 2 s of the kill, and no other task may move or
//!    change hands; the writes it took.
//! 5. The leader restarted (SIGTERM, then started again): no task may move or change hands
//!    (each lock is the very node it was); how long the takeover took and what it wrote
//!    (a new leader restamps each assignment with its epoch, which workers trust).
//!
//! Figures print next to their targets as ratios (above 1 meets the target) and go to
//! `target/bench/scale-<lane>.json` (`BENCH_SOURCE`: mariadb, the default, or mysql),
//! judged against `integration-tests/bench-baseline.json`. A missed target is printed
//! loudly; the exit status says only whether the harness itself ran through.
//!
//! Environment: `SCALE_SOURCES` (200), `SCALE_WORKERS` (20), `SCALE_CENTERS` (2),
//! `SCALE_SERVERS` (4), `SCALE_STEADY_PASSES` (100), `SCALE_RESYNC` (500ms),
//! `SLUICE_BIN_DIR` (which build of the services runs), and the stack endpoints the tests
//! use (`MARIADB_URL`/`MYSQL_URL` for the meta database, `ZOOKEEPER`, `KAFKA_BROKERS`).

use std::collections::{BTreeMap, BTreeSet};
use std::panic::AssertUnwindSafe;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context as _};
use futures::{FutureExt as _, StreamExt as _, TryStreamExt as _};
use mysql_async::prelude::*;
use sluice_integration_tests::cluster::{Admin, Bearer, PASSWORD_VAR};
use sluice_integration_tests::context::SESSION_TIMEOUT;
use sluice_integration_tests::figures::{self, Figure, Figures};
use sluice_integration_tests::private_source::PrivateSource;
use sluice_integration_tests::process::series_sum;
use sluice_integration_tests::{env_num, Cluster, Stack, TestCtx};
use sluice_proto::v1::admin_client::AdminClient;
use sluice_zk::layout;

/// The account the private servers are made with (see [`PrivateSource`]).
const SOURCE_USER: &str = "sluice";
const SOURCE_PASSWORD: &str = "sluice";
/// How often the layout is looked at while waiting for tasks to run.
const POLL: Duration = Duration::from_millis(100);
/// How often a center's metrics are read while waiting for its passes: each read makes it
/// render every series, work that would compete with the passes being measured.
const SCRAPE_EVERY: Duration = Duration::from_secs(1);
/// The reconcile pass's p99 target.
const PASS_P99_TARGET_MS: f64 = 100.0;

struct Settings {
    sources: usize,
    workers: usize,
    centers: usize,
    servers: usize,
    steady_passes: u64,
    resync: String,
}

impl Settings {
    fn from_env() -> anyhow::Result<Settings> {
        let s = Settings {
            sources: env_num("SCALE_SOURCES", 200)?,
            workers: env_num("SCALE_WORKERS", 20)?,
            centers: env_num("SCALE_CENTERS", 2)?,
            servers: env_num("SCALE_SERVERS", 4)?,
            steady_passes: env_num("SCALE_STEADY_PASSES", 100)?,
            resync: std::env::var("SCALE_RESYNC")
                .ok()
                .filter(|v| !v.is_empty())
                .unwrap_or_else(|| "500ms".into()),
        };
        if s.sources == 0 || s.workers < 2 || s.centers == 0 || s.servers == 0 {
            bail!("SCALE_SOURCES, SCALE_CENTERS and SCALE_SERVERS must be at least 1, SCALE_WORKERS at least 2");
        }
        Ok(s)
    }
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> ExitCode {
    if let Err(e) = sluice_integration_tests::lane::Lane::enter_from_env("BENCH_SOURCE") {
        eprintln!("{e}");
        return ExitCode::from(2);
    }
    let settings = match Settings::from_env() {
        Ok(s) => s,
        Err(e) => {
            eprintln!("{e:#}");
            return ExitCode::from(2);
        }
    };
    // The services reach the sources as the private servers' own account.
    let mut stack = Stack::connect().await;
    stack.source_user = SOURCE_USER.into();
    stack.source_password = SOURCE_PASSWORD.into();
    let ctx = TestCtx::on("scale", stack).await;
    // The harness's waits panic at their deadlines: clean up after those too.
    let outcome = AssertUnwindSafe(run(&ctx, &settings))
        .catch_unwind()
        .await
        .unwrap_or_else(|panic| {
            let why = panic
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| panic.downcast_ref::<&str>().map(|s| (*s).to_owned()))
                .unwrap_or_default();
            Err(anyhow!("the harness panicked: {why}"))
        });
    println!("cleanup: {}", ctx.cleanup().await);
    match outcome {
        Ok(figures) => {
            figures::report("scale", &figures);
            say_missed(&figures);
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("scale bench failed: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// Prints, loudly, each figure that missed its target.
fn say_missed(figures: &Figures) {
    let missed: Vec<&String> = figures
        .iter()
        .filter(|(_, f)| f.ratio.is_some_and(|r| r < 1.0))
        .map(|(name, _)| name)
        .collect();
    if missed.is_empty() {
        println!("every figure met its target");
    }
    for name in missed {
        let f = &figures[name];
        println!(
            "!!! MISSED TARGET {name}: {:.2} {} against {:.2}",
            f.value,
            f.unit,
            f.ceiling.unwrap_or(f64::NAN)
        );
    }
}

/// The bench's sources: the servers they live on, source `n` on server `n % servers`.
struct Sources {
    servers: Vec<PrivateSource>,
}

impl Sources {
    fn name(n: usize) -> String {
        format!("scale-{n:03}")
    }

    fn database(n: usize) -> String {
        format!("scale_{n:03}")
    }

    fn server(&self, n: usize) -> &PrivateSource {
        &self.servers[n % self.servers.len()]
    }
}

async fn run(ctx: &TestCtx, s: &Settings) -> anyhow::Result<Figures> {
    println!(
        "{} sources on {} workers, {} center(s), the sources on {} server(s) of the bench's own",
        s.sources, s.workers, s.centers, s.servers
    );
    let sources = servers(ctx, s).await?;
    ctx.env_for("sluice-center", "SLUICE_BALANCE__RESYNC", &s.resync);
    // The default pace of reports: each reports every task of the worker to the meta database.
    ctx.env_for("sluice-worker", "SLUICE_WORKER__REPORT_INTERVAL", "2s");
    let mut cluster = ctx.start_cluster_without_etl(s.centers, s.workers).await;
    let zk = ctx.coordinator().await;
    let mut figures = Figures::new();

    let (leader, _) = cluster.wait_leader(Duration::from_secs(30), None).await;
    let names: Vec<String> = (0..s.sources).map(Sources::name).collect();
    let registered = register(&cluster, leader, &sources, &names).await?;
    let placed = wait_all_running(zk, &names, Duration::from_secs(300)).await?;
    println!(
        "registration: {} sources put and running in {:.1} s; tasks per worker {}",
        names.len(),
        registered.elapsed().as_secs_f64(),
        spread(&placed.assigned)
    );
    figures.insert(
        "registration_s".into(),
        Figure::lower(registered.elapsed().as_secs_f64(), "s", None),
    );

    steady(&cluster, leader, s.steady_passes, &mut figures).await?;
    one_more_source(&cluster, leader, &sources, s.sources, zk, &mut figures).await?;
    let mut names = names;
    names.push(Sources::name(s.sources));
    kill_a_worker(&mut cluster, leader, zk, &names, &mut figures).await?;
    restart_the_leader(&mut cluster, leader, zk, &names, &mut figures).await?;
    memory(&cluster, &mut figures);
    stop_all(&mut cluster);
    drop(sources);
    Ok(figures)
}

/// Stops every service with SIGTERM, so that each closes its ZooKeeper session and its
/// ephemeral nodes go at once (not while the cleanup deletes the root).
fn stop_all(cluster: &mut Cluster) {
    let services = cluster.workers.iter_mut().chain(cluster.centers.iter_mut());
    let mut running: Vec<&mut sluice_integration_tests::Service> =
        services.filter(|s| s.pid().is_some()).collect();
    for s in running.iter_mut() {
        s.signal("TERM");
    }
    for s in running {
        if s.wait_exit(Duration::from_secs(20)).is_none() {
            s.kill9();
        }
    }
}

/// Starts the servers and makes every source's database on its server (one more than
/// `SCALE_SOURCES`, for the change of part 3).
async fn servers(ctx: &TestCtx, s: &Settings) -> anyhow::Result<Sources> {
    let started = Instant::now();
    let mut servers = Vec::new();
    for k in 0..s.servers {
        let server = PrivateSource::start(ctx.server_id + 5_000 + k as u32).await;
        // Two connections a task, and room for the services' other ones.
        server.root("SET GLOBAL max_connections = 1000");
        servers.push(server);
    }
    let sources = Sources { servers };
    for n in 0..=s.sources {
        let url = sources.server(n).url();
        let mut conn = mysql_async::Conn::new(mysql_async::Opts::from_url(&url)?).await?;
        let db = Sources::database(n);
        conn.query_drop(format!("CREATE DATABASE `{db}`")).await?;
        conn.query_drop(format!(
            "CREATE TABLE `{db}`.t (id BIGINT PRIMARY KEY, v BIGINT)"
        ))
        .await?;
        conn.disconnect().await?;
    }
    println!(
        "{} servers up and {} databases made in {:.1} s",
        s.servers,
        s.sources + 1,
        started.elapsed().as_secs_f64()
    );
    Ok(sources)
}

/// A client of center `idx`'s admin API (the leader's: writes go there).
async fn admin(cluster: &Cluster, idx: usize) -> anyhow::Result<Admin> {
    let channel =
        tonic::transport::Endpoint::from_shared(format!("http://{}", cluster.addrs[idx]))?
            .connect()
            .await
            .context("connect to the leader's API")?;
    Ok(AdminClient::with_interceptor(
        channel,
        Bearer::new(&cluster.token),
    ))
}

/// Puts source `n` through `api`.
async fn put_source(api: &mut Admin, sources: &Sources, n: usize) -> anyhow::Result<()> {
    let server = sources.server(n);
    let (host, port) = server
        .addr()
        .rsplit_once(':')
        .map(|(h, p)| (h.to_owned(), p.parse::<u32>()))
        .ok_or_else(|| anyhow!("a host:port"))?;
    api.put_source(sluice_proto::v1::Source {
        name: Sources::name(n),
        host,
        port: port?,
        user: SOURCE_USER.into(),
        password_ref: format!("env:{PASSWORD_VAR}"),
        server_id: server_id_base() + n as u32,
        tables: vec![format!("{}.*", Sources::database(n))],
        epoch: 0,
    })
    .await
    .with_context(|| format!("put source {}", Sources::name(n)))?;
    Ok(())
}

/// Puts every source of `names` through the leader's API, one after the other; when it
/// started.
async fn register(
    cluster: &Cluster,
    leader: usize,
    sources: &Sources,
    names: &[String],
) -> anyhow::Result<Instant> {
    let mut api = admin(cluster, leader).await?;
    let started = Instant::now();
    for n in 0..names.len() {
        put_source(&mut api, sources, n).await?;
    }
    println!(
        "{} sources put in {:.1} s",
        names.len(),
        started.elapsed().as_secs_f64()
    );
    Ok(started)
}

/// The first replication server id of the sources (each source announces its own).
fn server_id_base() -> u32 {
    1_000 + std::process::id() % 1_000 * 1_000
}

/// The cluster as ZooKeeper shows it: assignments, lock holders, live workers.
#[derive(Debug, Clone, PartialEq)]
struct Layout {
    /// Task → the worker its assignment names.
    assigned: BTreeMap<String, String>,
    /// Tasks assigned to more than one worker.
    doubled: BTreeSet<String>,
    /// Task → the worker holding its lock, and the transaction that created the lock node.
    locks: BTreeMap<String, (String, i64)>,
    workers: BTreeSet<String>,
}

impl Layout {
    /// Whether task `t` runs where it is assigned, on a live worker.
    fn runs(&self, t: &str) -> bool {
        match (self.assigned.get(t), self.locks.get(t)) {
            (Some(to), Some((holder, _))) => {
                to == holder && self.workers.contains(to) && !self.doubled.contains(t)
            }
            _ => false,
        }
    }
}

/// Requests the harness has under way at once on its ZooKeeper session.
const READS_AT_ONCE: usize = 32;

/// Runs `reads`, [`READS_AT_ONCE`] at a time; their results in order.
async fn at_once<T, F>(reads: impl IntoIterator<Item = F>) -> anyhow::Result<Vec<T>>
where
    F: std::future::Future<Output = Result<T, sluice_zk::ZkError>>,
{
    let read = futures::stream::iter(reads).buffered(READS_AT_ONCE);
    Ok(read.try_collect().await?)
}

/// Reads the layout, each directory's nodes at once.
async fn read_layout(zk: &sluice_zk::Coordinator) -> anyhow::Result<Layout> {
    let workers: BTreeSet<String> = zk.children("workers").await?.into_iter().collect();
    let dirs = zk.children("assignments").await?;
    let paths: Vec<String> = dirs.iter().map(|w| layout::assignments(w)).collect();
    let lists = at_once(paths.iter().map(|p| zk.children(p))).await?;
    let mut assigned = BTreeMap::new();
    let mut doubled = BTreeSet::new();
    for (worker, list) in dirs.iter().zip(lists) {
        for task in list {
            if assigned.insert(task.clone(), worker.clone()).is_some() {
                doubled.insert(task);
            }
        }
    }
    let names = zk.children("locks").await?;
    let paths: Vec<String> = names.iter().map(|t| layout::lock(t)).collect();
    let nodes = at_once(paths.iter().map(|p| zk.get(p))).await?;
    let mut locks = BTreeMap::new();
    for (task, node) in names.into_iter().zip(nodes) {
        let Some(node) = node else { continue };
        let holder = serde_json::from_slice::<serde_json::Value>(&node.data)
            .ok()
            .and_then(|v| v["worker"].as_str().map(str::to_owned))
            .unwrap_or_default();
        locks.insert(task, (holder, node.created_zxid));
    }
    Ok(Layout {
        assigned,
        doubled,
        locks,
        workers,
    })
}

/// Waits until every task of `names` runs where it is assigned and has confirmed a
/// position; the layout then.
async fn wait_all_running(
    zk: &sluice_zk::Coordinator,
    names: &[String],
    within: Duration,
) -> anyhow::Result<Layout> {
    let deadline = Instant::now() + within;
    loop {
        let l = read_layout(zk).await?;
        let waiting: Vec<&String> = names.iter().filter(|t| !l.runs(t)).collect();
        if waiting.is_empty() {
            let positions = at_once(names.iter().map(|t| zk.read_checkpoint(t))).await?;
            if positions.iter().all(Option::is_some) {
                return Ok(l);
            }
        } else if Instant::now() > deadline {
            bail!(
                "{} of {} tasks do not run where assigned within {within:?}, e.g. {:?}",
                waiting.len(),
                names.len(),
                &waiting[..waiting.len().min(5)]
            );
        }
        if Instant::now() > deadline {
            bail!("some tasks confirmed no position within {within:?}");
        }
        tokio::time::sleep(POLL).await; // a poll pace
    }
}

/// `min–max (mean)` tasks per worker.
fn spread(assigned: &BTreeMap<String, String>) -> String {
    let mut per: BTreeMap<&str, usize> = BTreeMap::new();
    for w in assigned.values() {
        *per.entry(w.as_str()).or_default() += 1;
    }
    let (min, max) = (per.values().min(), per.values().max());
    format!(
        "{}–{} over {} workers",
        min.unwrap_or(&0),
        max.unwrap_or(&0),
        per.len()
    )
}

/// One scrape of a center's metrics.
type Scrape = BTreeMap<String, f64>;

async fn scrape(cluster: &Cluster, idx: usize) -> anyhow::Result<Scrape> {
    cluster.centers[idx]
        .metrics()
        .await
        .map_err(|e| anyhow!("center {idx}'s metrics: {e}"))
}

const PASSES: &str = "sluice_center_reconcile_seconds_count";
const WRITES: &str = "sluice_center_zk_writes_total";
const READS: &str = "sluice_center_zk_reads_total";

/// What changed between two scrapes: passes, writes, reads.
fn delta(before: &Scrape, after: &Scrape) -> (f64, f64, f64) {
    let d = |name| series_sum(after, name, &[]) - series_sum(before, name, &[]);
    (d(PASSES), d(WRITES), d(READS))
}

/// The `q` quantile, in seconds, of histogram `name` over what it observed between two
/// scrapes, interpolated within its bucket (as Prometheus's `histogram_quantile`).
fn quantile(before: &Scrape, after: &Scrape, name: &str, q: f64) -> Option<f64> {
    let buckets = sluice_integration_tests::process::buckets_between(before, after, name);
    let count = buckets.last()?.1;
    if count <= 0.0 {
        return None;
    }
    let rank = q * count;
    let (mut low, mut below) = (0.0, 0.0);
    for (le, cumulative) in buckets {
        if cumulative >= rank {
            if le.is_infinite() {
                return Some(low);
            }
            let within = (rank - below) / (cumulative - below).max(f64::MIN_POSITIVE);
            return Some(low + (le - low) * within);
        }
        (low, below) = (le, cumulative);
    }
    None
}

/// Waits until center `idx` has made `passes` more reconcile passes than at `from`
/// (`within` at most); its metrics then.
async fn wait_passes(
    cluster: &Cluster,
    idx: usize,
    from: &Scrape,
    passes: u64,
    within: Duration,
) -> anyhow::Result<Scrape> {
    let deadline = Instant::now() + within;
    loop {
        let now = scrape(cluster, idx).await?;
        let made = series_sum(&now, PASSES, &[]) - series_sum(from, PASSES, &[]);
        if made >= passes as f64 {
            return Ok(now);
        }
        if Instant::now() > deadline {
            bail!("center {idx} made {made} of {passes} passes within {within:?}");
        }
        tokio::time::sleep(SCRAPE_EVERY).await; // a poll pace
    }
}

/// Part 2: the leader's passes while nothing changes.
async fn steady(
    cluster: &Cluster,
    leader: usize,
    passes: u64,
    figures: &mut Figures,
) -> anyhow::Result<()> {
    // Whatever the registration left to do (a worker settling, say) is done first.
    let settled = wait_passes(
        cluster,
        leader,
        &scrape(cluster, leader).await?,
        3,
        Duration::from_secs(60),
    )
    .await?;
    let window = Duration::from_secs(30 + passes * 2);
    let after = wait_passes(cluster, leader, &settled, passes, window).await?;
    let (n, writes, reads) = delta(&settled, &after);
    let name = "sluice_center_reconcile_seconds";
    let p50 = quantile(&settled, &after, name, 0.5).ok_or_else(|| anyhow!("no passes"))?;
    let p99 = quantile(&settled, &after, name, 0.99).ok_or_else(|| anyhow!("no passes"))?;
    println!(
        "steady: {n} passes, p50 {:.1} ms, p99 {:.1} ms; {writes} ZooKeeper writes, {:.1} reads a pass",
        p50 * 1000.0,
        p99 * 1000.0,
        reads / n
    );
    figures.insert(
        "steady_pass_p50_ms".into(),
        Figure::lower(p50 * 1000.0, "ms", None),
    );
    figures.insert(
        "steady_pass_p99_ms".into(),
        Figure::lower(p99 * 1000.0, "ms", Some(PASS_P99_TARGET_MS)),
    );
    // Target: none. Against a ceiling of half a write over all the passes, so that a
    // single one shows as a ratio of at most 0.5 (missed), and none as an infinite one.
    figures.insert(
        "steady_zk_writes_per_pass".into(),
        Figure::lower(writes / n, "writes/pass", Some(0.5 / n)),
    );
    figures.insert(
        "steady_zk_reads_per_pass".into(),
        Figure::lower(reads / n, "reads/pass", None),
    );
    Ok(())
}

/// At most this many ZooKeeper writes for one source added: its record in `mappings/`,
/// its assignment, and the clearing of a checkpoint of an earlier source of its name —
/// a handful of nodes of its own, where a rewrite of the layout would be hundreds.
const ONE_SOURCE_WRITES: f64 = 5.0;

/// Part 3: one more source (number `n`), the writes it cost the leader.
async fn one_more_source(
    cluster: &Cluster,
    leader: usize,
    sources: &Sources,
    n: usize,
    zk: &sluice_zk::Coordinator,
    figures: &mut Figures,
) -> anyhow::Result<()> {
    let before = scrape(cluster, leader).await?;
    let mut api = admin(cluster, leader).await?;
    let started = Instant::now();
    put_source(&mut api, sources, n).await?;
    let name = Sources::name(n);
    wait_all_running(zk, std::slice::from_ref(&name), Duration::from_secs(60)).await?;
    let running = started.elapsed();
    // The passes that follow would show any write the change still leads to.
    let mark = scrape(cluster, leader).await?;
    let after = wait_passes(cluster, leader, &mark, 2, Duration::from_secs(30)).await?;
    let (passes, writes, _) = delta(&before, &after);
    let ops: Vec<String> = ["create", "set", "delete"]
        .iter()
        .map(|op| {
            let d = series_sum(&after, WRITES, &[("op", op)])
                - series_sum(&before, WRITES, &[("op", op)]);
            format!("{d} {op}")
        })
        .collect();
    println!(
        "one source added: running in {:.2} s; {writes} ZooKeeper writes ({}) over {passes} passes",
        running.as_secs_f64(),
        ops.join(", ")
    );
    figures.insert(
        "one_source_added_zk_writes".into(),
        Figure::lower(writes, "writes", Some(ONE_SOURCE_WRITES)),
    );
    figures.insert(
        "one_source_added_running_s".into(),
        Figure::lower(running.as_secs_f64(), "s", None),
    );
    Ok(())
}

/// Tasks of `before` that no longer run where they did: assigned elsewhere, or their
/// lock is another node (released and taken again).
fn moved(before: &Layout, after: &Layout, among: impl Fn(&str) -> bool) -> Vec<String> {
    before
        .assigned
        .iter()
        .filter(|(t, _)| among(t))
        .filter(|(t, w)| {
            after.assigned.get(*t) != Some(w) || after.locks.get(*t) != before.locks.get(*t)
        })
        .map(|(t, _)| t.clone())
        .collect()
}

/// Part 4: `kill -9` of the worker holding the most tasks.
async fn kill_a_worker(
    cluster: &mut Cluster,
    leader: usize,
    zk: &sluice_zk::Coordinator,
    names: &[String],
    figures: &mut Figures,
) -> anyhow::Result<()> {
    let before = wait_all_running(zk, names, Duration::from_secs(60)).await?;
    let victim = busiest(&before.assigned).ok_or_else(|| anyhow!("no assignment"))?;
    let theirs: Vec<String> = before
        .assigned
        .iter()
        .filter(|(_, w)| **w == victim)
        .map(|(t, _)| t.clone())
        .collect();
    let scraped = scrape(cluster, leader).await?;
    cluster.workers[Cluster::worker_index(&victim)].kill9();
    let killed = Instant::now();
    let target = SESSION_TIMEOUT + Duration::from_secs(2);
    let deadline = killed + Duration::from_secs(60);
    let took = loop {
        let now = read_layout(zk).await?;
        let elsewhere = |t: &String| now.runs(t) && now.assigned.get(t) != Some(&victim);
        if theirs.iter().all(elsewhere) {
            break killed.elapsed();
        }
        if Instant::now() > deadline {
            bail!("{victim}'s tasks do not all run elsewhere 60 s after the kill: {now:?}");
        }
        tokio::time::sleep(POLL).await; // a poll pace
    };
    // What the leader does next (a further pass or two) must move nothing more either.
    let mark = scrape(cluster, leader).await?;
    let after_passes = wait_passes(cluster, leader, &mark, 2, Duration::from_secs(30)).await?;
    let after = read_layout(zk).await?;
    let others = before.assigned.len() - theirs.len();
    let others_moved = moved(&before, &after, |t| !theirs.iter().any(|x| x == t));
    let (passes, writes, _) = delta(&scraped, &after_passes);
    println!(
        "worker {victim} killed: its {} tasks run elsewhere {:.2} s after the kill (target {:.0} s); \
         {} of the other {others} tasks moved; {writes} ZooKeeper writes over {passes} passes",
        theirs.len(),
        took.as_secs_f64(),
        target.as_secs_f64(),
        others_moved.len(),
    );
    if !others_moved.is_empty() {
        println!("!!! tasks that moved without cause: {others_moved:?}");
    }
    figures.insert(
        "worker_killed_tasks_running_s".into(),
        Figure::lower(took.as_secs_f64(), "s", Some(target.as_secs_f64())),
    );
    figures.insert(
        "worker_killed_others_kept".into(),
        Figure::higher(
            (others - others_moved.len()) as f64,
            "tasks",
            Some(others as f64),
        ),
    );
    figures.insert(
        "worker_killed_zk_writes_per_moved_task".into(),
        Figure::lower(writes / theirs.len() as f64, "writes/task", None),
    );
    Ok(())
}

/// The worker assigned the most tasks (the first by id among equals).
fn busiest(assigned: &BTreeMap<String, String>) -> Option<String> {
    let mut per: BTreeMap<&str, usize> = BTreeMap::new();
    for w in assigned.values() {
        *per.entry(w.as_str()).or_default() += 1;
    }
    let most = *per.values().max()?;
    per.into_iter()
        .find(|(_, n)| *n == most)
        .map(|(w, _)| w.to_owned())
}

/// Part 5: the leader stopped (SIGTERM: it hands over at once) and started again.
async fn restart_the_leader(
    cluster: &mut Cluster,
    leader: usize,
    zk: &sluice_zk::Coordinator,
    names: &[String],
    figures: &mut Figures,
) -> anyhow::Result<()> {
    let before = wait_all_running(zk, names, Duration::from_secs(60)).await?;
    let (_, epoch) = cluster.wait_leader(Duration::from_secs(10), None).await;
    // Every other center's counters before it may lead.
    let mut counters = BTreeMap::new();
    for i in (0..cluster.centers.len()).filter(|i| *i != leader) {
        counters.insert(i, scrape(cluster, i).await?);
    }
    let stopped = Instant::now();
    cluster.centers[leader].terminate(Duration::from_secs(20));
    if cluster.centers.len() > 1 {
        cluster
            .wait_leader(Duration::from_secs(30), Some(leader))
            .await;
    }
    let takeover = stopped.elapsed();
    cluster.centers[leader].start();
    let (now, new_epoch) = wait_new_leader(cluster, epoch).await?;
    // Its first passes, and those after the old leader is back (as a follower, with two
    // centers), must move nothing.
    let mark = scrape(cluster, now).await?;
    let settled = wait_passes(cluster, now, &mark, 3, Duration::from_secs(60)).await?;
    let after = read_layout(zk).await?;
    let moved = moved(&before, &after, |_| true);
    // A restarted center counts from zero.
    let writes = match counters.get(&now) {
        Some(b) => delta(b, &settled).1,
        None => series_sum(&settled, WRITES, &[]),
    };
    println!(
        "leader c{leader} restarted: c{now} leads at epoch {new_epoch} (was {epoch}), {:.2} s after the stop; \
         {} of {} tasks moved or changed hands; {writes} ZooKeeper writes by the new leader since it led",
        takeover.as_secs_f64(),
        moved.len(),
        before.assigned.len(),
    );
    if !moved.is_empty() {
        println!("!!! tasks that moved on the restart: {moved:?}");
    }
    figures.insert(
        "restart_tasks_kept".into(),
        Figure::higher(
            (before.assigned.len() - moved.len()) as f64,
            "tasks",
            Some(before.assigned.len() as f64),
        ),
    );
    figures.insert(
        "restart_takeover_s".into(),
        Figure::lower(takeover.as_secs_f64(), "s", None),
    );
    figures.insert(
        "restart_new_leader_zk_writes".into(),
        Figure::lower(writes, "writes", None),
    );
    Ok(())
}

/// Waits for a leader at an epoch after `epoch`; its index and epoch.
async fn wait_new_leader(cluster: &Cluster, epoch: u64) -> anyhow::Result<(usize, u64)> {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let (i, e) = cluster.wait_leader(Duration::from_secs(60), None).await;
        if e > epoch {
            return Ok((i, e));
        }
        if Instant::now() > deadline {
            bail!("no leader after epoch {epoch} within 60 s");
        }
        tokio::time::sleep(POLL).await; // a poll pace
    }
}

/// The most a worker may hold, idle with its tasks: the bench's ceiling of a worker
/// streaming (`make bench`, README's Measured).
const WORKER_RSS_MIB: f64 = 64.0;

/// The workers' and the centers' resident memory now.
fn memory(cluster: &Cluster, figures: &mut Figures) {
    let mib = |b: u64| b as f64 / (1024.0 * 1024.0);
    let workers: Vec<f64> = cluster
        .workers
        .iter()
        .filter_map(|w| w.rss())
        .map(mib)
        .collect();
    let centers: Vec<f64> = cluster
        .centers
        .iter()
        .filter_map(|c| c.rss())
        .map(mib)
        .collect();
    let max = |v: &[f64]| v.iter().copied().fold(0.0, f64::max);
    let sum: f64 = workers.iter().sum();
    println!(
        "memory: {} workers {:.0} MiB in all (at most {:.0} each), centers at most {:.0} MiB",
        workers.len(),
        sum,
        max(&workers),
        max(&centers)
    );
    figures.insert(
        "worker_rss_max_mib".into(),
        Figure::lower(max(&workers), "MiB", Some(WORKER_RSS_MIB)),
    );
    figures.insert(
        "center_rss_max_mib".into(),
        Figure::lower(max(&centers), "MiB", None),
    );
}
