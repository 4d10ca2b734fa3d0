//! `make bench` (fourth part): the worker against the peer most users would pick instead,
//! Debezium's MySQL connector (its embedded engine, in a JVM started here by
//! `integration-tests/debezium/run.sh`, which installs it from Maven Central on first use),
//! over the same binlog into the same Kafka, one after the other.
//!
//! A server of the bench's own (`PrivateSource`, of `BENCH_SOURCE`'s kind) gets
//! `BENCH_PEER_EVENTS` row events (default 1,000,000: 90 % inserts in 1,000-row
//! transactions, then updates and deletes of 1,000 rows each). Then:
//! 1. the worker (stopped while the load was written) is started and timed until its
//!    confirmed checkpoint reaches the binlog's end — every event acknowledged by Kafka;
//! 2. Debezium is started and timed until it has had every row event acknowledged by
//!    Kafka (it reads the binlog from its first file, without a snapshot of the data).
//!
//! Each is timed from its process's start, and its peak RSS (`VmHWM`) and CPU seconds
//! (user + system) are read from `/proc` once it is done. Printed side by side with the
//! ratios; the figures go to `target/bench/peer-<source>.json` against the goal: at least
//! twice Debezium's events/s, at most a tenth of its memory.

use std::io::{BufRead as _, BufReader};
use std::path::PathBuf;
use std::process::{Command, ExitCode, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _};
use serde_json::Value;
use sluice_integration_tests::figures::{self, Figure, Figures};
use sluice_integration_tests::lane::Lane;
use sluice_integration_tests::private_source::PrivateSource;
use sluice_integration_tests::process::proc_usage;
use sluice_integration_tests::{env_num, TestCtx};
use sluice_model::Checkpoint;

/// Debezium's replica connection's server id (the worker's differs; they run in turn).
const DEBEZIUM_SERVER_ID: u32 = 5401;

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> ExitCode {
    if let Err(e) = Lane::enter_from_env("BENCH_SOURCE") {
        eprintln!("{e}");
        return ExitCode::from(2);
    }
    let server = PrivateSource::start(7601).await;
    let ctx = TestCtx::on("peerbench", server.stack().await).await;
    let outcome = run(&ctx, &server).await;
    println!("cleanup: {}", ctx.cleanup().await);
    match outcome {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("peer bench failed: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// One reader's run: events/s from its start, peak RSS and CPU seconds.
struct Run {
    seconds: f64,
    peak_rss_mib: f64,
    cpu_s: f64,
}

async fn run(ctx: &TestCtx, server: &PrivateSource) -> anyhow::Result<()> {
    ctx.warm_up().await?;
    let events = env_num::<u64>("BENCH_PEER_EVENTS", 1_000_000)?;
    ctx.exec("CREATE TABLE items (id BIGINT PRIMARY KEY, k INT, c VARCHAR(120), pad VARCHAR(60), price DECIMAL(10,2), ts DATETIME(6))")
        .await;
    let _pipeline = ctx.pipeline("items");
    // The worker's first start records the binlog's end as its start; it is stopped
    // while the load is written.
    let mut worker = ctx.worker();
    worker.start();
    ctx.wait_worker_ready(&worker).await;
    worker.terminate(Duration::from_secs(30));
    let loaded = Instant::now();
    load(ctx, events).await;
    println!(
        "[peer] {events} row events written into a server of its own in {:.1} s",
        loaded.elapsed().as_secs_f64()
    );

    let sluice = time_worker(ctx, &mut worker).await?;
    drop(worker);
    println!(
        "[peer] sluice-worker: {events} events in {:.2} s = {:.0} events/s, peak RSS {:.0} MiB, {:.1} CPU s",
        sluice.seconds,
        events as f64 / sluice.seconds,
        sluice.peak_rss_mib,
        sluice.cpu_s
    );
    let debezium = time_debezium(ctx, server, events).await?;
    println!(
        "[peer] Debezium: {events} events in {:.2} s = {:.0} events/s, peak RSS {:.0} MiB, {:.1} CPU s",
        debezium.seconds,
        events as f64 / debezium.seconds,
        debezium.peak_rss_mib,
        debezium.cpu_s
    );
    let (ours, theirs) = (
        events as f64 / sluice.seconds,
        events as f64 / debezium.seconds,
    );
    println!(
        "[peer] the worker: {:.1}× Debezium's events/s, {:.2}× its memory, {:.2}× its CPU seconds",
        ours / theirs,
        sluice.peak_rss_mib / debezium.peak_rss_mib,
        sluice.cpu_s / debezium.cpu_s
    );
    let mut f = Figures::new();
    f.insert(
        "worker_events_per_s".into(),
        Figure::higher(ours, "events/s", Some(2.0 * theirs)),
    );
    f.insert(
        "debezium_events_per_s".into(),
        Figure::higher(theirs, "events/s", None),
    );
    f.insert(
        "worker_peak_rss_mib".into(),
        Figure::lower(
            sluice.peak_rss_mib,
            "MiB",
            Some(debezium.peak_rss_mib / 10.0),
        ),
    );
    f.insert(
        "debezium_peak_rss_mib".into(),
        Figure::lower(debezium.peak_rss_mib, "MiB", None),
    );
    f.insert(
        "worker_cpu_s".into(),
        Figure::lower(sluice.cpu_s, "s", Some(debezium.cpu_s)),
    );
    f.insert(
        "debezium_cpu_s".into(),
        Figure::lower(debezium.cpu_s, "s", None),
    );
    figures::report("peer", &f);
    Ok(())
}

/// `events` row events into `items`: 90 % inserts in 1,000-row transactions, then the
/// rest as updates and deletes of 1,000 rows each.
async fn load(ctx: &TestCtx, events: u64) {
    let inserts = events * 9 / 10;
    let mut id = 0u64;
    while id < inserts {
        let rows: Vec<String> = (id + 1..=(id + 1000).min(inserts))
            .map(|i| {
                format!(
                    "({i}, {}, 'c{i:0>100}', 'pad{i:0>50}', {}.{:02}, NOW(6))",
                    i % 1000,
                    i % 5000,
                    i % 100
                )
            })
            .collect();
        id += rows.len() as u64;
        ctx.exec(&format!("INSERT INTO items VALUES {}", rows.join(", ")))
            .await;
    }
    let rest = events - inserts;
    let (updates, deletes) = (rest / 2, rest - rest / 2);
    let mut done = 0;
    while done < updates {
        let n = (updates - done).min(1000);
        ctx.exec(&format!(
            "UPDATE items SET k = k + 1 WHERE id > {done} AND id <= {}",
            done + n
        ))
        .await;
        done += n;
    }
    let mut done = 0;
    while done < deletes {
        let n = (deletes - done).min(1000);
        let from = inserts - deletes + done;
        ctx.exec(&format!(
            "DELETE FROM items WHERE id > {from} AND id <= {}",
            from + n
        ))
        .await;
        done += n;
    }
}

/// Starts the worker and waits until its confirmed checkpoint reaches the binlog's end.
async fn time_worker(
    ctx: &TestCtx,
    worker: &mut sluice_integration_tests::Service,
) -> anyhow::Result<Run> {
    let end = ctx.binlog_end().await;
    let coord = sluice_zk::Coordinator::connect(&ctx.zk_config()).await?;
    let started = Instant::now();
    worker.start();
    let pid = worker.pid().context("the worker's pid")?;
    loop {
        let cp = coord
            .read_checkpoint(&ctx.instance)
            .await?
            .filter(|b| !b.is_empty())
            .map(|b| Checkpoint::from_json(&b))
            .transpose()?;
        if cp.is_some_and(|cp| cp.position >= end) {
            break;
        }
        if !worker.is_running() {
            bail!("the worker exited:\n{}", worker.log_tail());
        }
        if started.elapsed() > Duration::from_secs(1200) {
            bail!(
                "the worker did not reach {end} in 20 min:\n{}",
                worker.log_tail()
            );
        }
        tokio::time::sleep(Duration::from_millis(20)).await; // a poll pace
    }
    let seconds = started.elapsed().as_secs_f64();
    coord.close().await;
    let (peak_kib, cpu_s) = proc_usage(pid).context("the worker's /proc")?;
    Ok(Run {
        seconds,
        peak_rss_mib: peak_kib as f64 / 1024.0,
        cpu_s,
    })
}

/// Runs Debezium over the server's binlog into the stack's Kafka until it has had
/// `events` row events acknowledged; its figures are read while it holds (`--hold`).
async fn time_debezium(ctx: &TestCtx, server: &PrivateSource, events: u64) -> anyhow::Result<Run> {
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("debezium/run.sh");
    let connector = match Lane::current().flavor() {
        Lane::MySql => "mysql",
        _ => "mariadb",
    };
    // Installed first (once per machine), so that the timing starts at the JVM's start.
    let installed = Command::new(&script)
        .args(["install", connector])
        .status()
        .context("run integration-tests/debezium/run.sh install")?;
    if !installed.success() {
        bail!("Debezium could not be installed ({installed}); see the lines above");
    }
    let work = ctx.dir.join("debezium");
    std::fs::create_dir_all(&work)?;
    let log = std::fs::File::create(work.join("debezium.log"))?;
    let prefix = format!("dbz_{}", ctx.db);
    let url = mysql_async::Opts::from_url(&server.url())?;
    let port = url.tcp_port().to_string();
    let (user, password) = (
        url.user().unwrap_or_default().to_owned(),
        url.pass().unwrap_or_default().to_owned(),
    );
    let started = Instant::now();
    let mut jvm = Command::new(&script)
        .args(["--connector", connector, "--port", &port, "--user", &user])
        .args(["--password", &password, "--database", &ctx.db])
        .args(["--table", &format!("{}.items", ctx.db)])
        .args(["--server-id", &DEBEZIUM_SERVER_ID.to_string()])
        .args([
            "--topic-prefix",
            &prefix,
            "--bootstrap",
            &ctx.kafka_brokers(),
        ])
        .args(["--work-dir", &work.display().to_string()])
        .args([
            "--events",
            &events.to_string(),
            "--timeout-s",
            "1200",
            "--hold",
        ])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(log)
        .spawn()
        .context("start Debezium")?;
    let pid = jvm.id();
    let stdout = jvm.stdout.take().context("Debezium's stdout")?;
    // Its lines until the final JSON one, read off the runtime's threads.
    let last = tokio::task::spawn_blocking(move || {
        let mut done = None;
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            if line.starts_with('{') {
                done = Some((line, Instant::now()));
                break;
            }
        }
        done
    })
    .await?;
    let usage = proc_usage(pid);
    drop(jvm.stdin.take()); // ends the hold
    let status = jvm.wait()?;
    for topic in [prefix.clone(), format!("{prefix}.{}.items", ctx.db)] {
        ctx.clean_up_topic(topic);
    }
    let Some((line, at)) = last else {
        let tail = std::fs::read_to_string(work.join("debezium.log")).unwrap_or_default();
        let tail: Vec<&str> = tail.lines().rev().take(30).collect();
        bail!(
            "Debezium ended ({status}) before it reported its events:\n{}",
            tail.into_iter().rev().collect::<Vec<_>>().join("\n")
        );
    };
    let own: Value = serde_json::from_str(&line).context("Debezium's final line")?;
    if own["events"].as_u64() != Some(events) {
        bail!("Debezium counted {} events, not {events}", own["events"]);
    }
    println!("[peer] Debezium's own figures: {line}");
    let (peak_kib, cpu_s) = usage.context("Debezium's /proc")?;
    Ok(Run {
        seconds: (at - started).as_secs_f64(),
        peak_rss_mib: peak_kib as f64 / 1024.0,
        cpu_s,
    })
}
