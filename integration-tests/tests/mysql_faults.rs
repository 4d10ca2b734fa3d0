//! The source misbehaving under the worker, on the real MariaDB, with writes going on:
//! its binlog dump thread killed server-side, every connection cut, a partition (the
//! fault proxy black-holes the stream until the worker's heartbeat check gives up), binlog
//! rotation under the load; and the worker killed with `kill -9` in the middle of one
//! large transaction. Each ends with the checker on every row.

use std::time::{Duration, Instant};

use mysql_async::prelude::*;
use sluice_integration_tests::proxy::{Mode, Proxy};
use sluice_integration_tests::{eventually, Load, Running, Service, TestCtx};

const WITHIN: Duration = Duration::from_secs(120);

/// The id of the binlog dump thread serving the worker through `proxy`.
async fn dump_thread(ctx: &TestCtx, proxy: &Proxy) -> Result<u64, String> {
    let threads: Vec<(u64, String)> = ctx
        .stack
        .conn()
        .await
        .query(
            "SELECT ID, HOST FROM information_schema.PROCESSLIST WHERE COMMAND LIKE 'Binlog Dump%'",
        )
        .await
        .map_err(|e| e.to_string())?;
    let ours = proxy.upstream_ports();
    threads
        .iter()
        .find(|(_, host)| {
            host.rsplit_once(':')
                .and_then(|(_, port)| port.parse::<u16>().ok())
                .is_some_and(|port| ours.contains(&port))
        })
        .map(|(id, _)| *id)
        .ok_or_else(|| format!("no dump thread through the proxy among {threads:?}"))
}

/// Waits until the worker streams again through a dump thread other than `old`.
async fn streams_again(ctx: &TestCtx, proxy: &Proxy, old: u64, worker: &Service) -> u64 {
    eventually("the worker streams again", WITHIN, || async {
        match dump_thread(ctx, proxy).await {
            Ok(id) if id != old => Ok(id),
            Ok(_) => Err("still the old dump thread".to_owned()),
            Err(e) => Err(format!("{e}\n{}", worker.log_tail())),
        }
    })
    .await
}

struct Faulted<'a> {
    ctx: &'a TestCtx,
    proxy: &'a Proxy,
    worker: &'a Service,
}

impl Faulted<'_> {
    /// Puts the proxy in `mode` until the worker logs `needle`, then opens it and waits
    /// for a new dump thread (the old one was `thread`); returns the new one.
    async fn until_logged(&self, mode: Mode, needle: &str, thread: u64) -> u64 {
        let mark = self.worker.log_mark();
        self.proxy.set(mode);
        eventually(
            &format!("the worker logs {needle:?} ({mode:?})"),
            WITHIN,
            || async { self.worker.logged_since(mark, &[needle]) },
        )
        .await;
        self.proxy.set(Mode::Open);
        streams_again(self.ctx, self.proxy, thread, self.worker).await
    }
}

fn write_load(ctx: &TestCtx) -> Load {
    ctx.load(Duration::from_millis(10), |n| {
        let id = n % 400;
        vec![
            format!("INSERT INTO acct VALUES ({id}, {n}, 'i{n}') ON DUPLICATE KEY UPDATE balance = {n}, note = 'd{n}'"),
            format!("UPDATE acct SET balance = balance + 1, note = 'u{n}' WHERE id = {}", (id * 7) % 400),
            format!("DELETE FROM acct WHERE id = {}", (id * 13) % 400),
        ]
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_cut_and_partitioned_binlog_connection_loses_nothing() {
    let ctx = TestCtx::new("srcfault").await;
    ctx.exec("CREATE TABLE acct (id INT PRIMARY KEY, balance BIGINT, note VARCHAR(40))")
        .await;
    let proxy = Proxy::start(&format!(
        "{}:{}",
        ctx.stack.mysql_host, ctx.stack.mysql_port
    ))
    .await;
    ctx.route_mysql(&proxy.addr());
    let pipeline = ctx.pipeline("acct");
    let run: Running = ctx.start(std::slice::from_ref(&pipeline)).await;
    let load = write_load(&ctx);
    let mut thread = eventually("the worker streams", WITHIN, || dump_thread(&ctx, &proxy)).await;

    // KILL of the dump thread on the server's side, then rotations, all under the load.
    ctx.exec(&format!("KILL {thread}")).await;
    thread = streams_again(&ctx, &proxy, thread, &run.worker).await;
    for _ in 0..3 {
        ctx.exec("FLUSH BINARY LOGS").await;
    }

    // Every connection cut, and new ones refused until the worker noticed.
    let faulted = Faulted {
        ctx: &ctx,
        proxy: &proxy,
        worker: &run.worker,
    };
    thread = faulted
        .until_logged(Mode::Refuse, "task failed", thread)
        .await;
    // A partition: nothing passes, nothing closes; only the heartbeat check can tell.
    faulted
        .until_logged(Mode::Blackhole, "no event or heartbeat", thread)
        .await;

    let rounds = load.stop().await;
    assert!(rounds > 50, "the load ran throughout ({rounds} rounds)");
    ctx.wait_streamed(&run.worker).await;
    ctx.converges(&run, &pipeline, WITHIN).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_inside_a_large_transaction_resumes_at_its_start_and_loses_nothing() {
    let ctx = TestCtx::new("killtx").await;
    ctx.exec("CREATE TABLE big (id INT PRIMARY KEY, v BIGINT, pad VARCHAR(64))")
        .await;
    let pipeline = ctx.pipeline("big");
    let mut run = ctx.start(std::slice::from_ref(&pipeline)).await;
    ctx.exec(&format!(
        "INSERT INTO big SELECT seq, 0, 'x' FROM {}",
        sluice_integration_tests::seq(1, 5000)
    ))
    .await;
    ctx.converges(&run, &pipeline, WITHIN).await;

    // One transaction of 100,000 row changes, each to a row of its own: a restart that
    // resumed anywhere past the transaction's start would leave rows missing.
    let before = run.worker.metric("sluice_worker_events_total", &[]).await;
    ctx.exec(&format!(
        "INSERT INTO big SELECT seq, seq, REPEAT('t', 40) FROM {}",
        sluice_integration_tests::seq(5001, 105000)
    ))
    .await;

    // Killed once part of the transaction is published and before all of it is.
    let deadline = Instant::now() + WITHIN;
    let published = loop {
        let n = run.worker.metric("sluice_worker_events_total", &[]).await - before;
        if n >= 2_000.0 {
            break n;
        }
        assert!(Instant::now() < deadline, "the worker published {n} events");
        tokio::time::sleep(Duration::from_millis(20)).await; // polling the counter
    };
    run.worker.kill9();
    assert!(
        published < 100_000.0,
        "killed mid-transaction: {published} of 100,000 events published"
    );

    run.worker.start();
    ctx.wait_streamed(&run.worker).await;
    ctx.converges(&run, &pipeline, WITHIN).await;
}
