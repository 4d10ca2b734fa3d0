//! Faults of the source server itself, on a MariaDB of the test's own (they would disturb
//! every other test on the shared one): a crash and restart while the worker streams, and
//! a resume position purged while the worker was down, which stops the task with the fix
//! named and skips nothing.

use std::time::Duration;

use sluice_integration_tests::mariadb::PrivateMariadb;
use sluice_integration_tests::services::Stack;
use sluice_integration_tests::{eventually, TestCtx};

const WITHIN: Duration = Duration::from_secs(120);

async fn binary_logs(ctx: &TestCtx) -> Vec<String> {
    use mysql_async::prelude::*;
    let rows: Vec<mysql_async::Row> = ctx
        .stack
        .conn()
        .await
        .query("SHOW BINARY LOGS")
        .await
        .expect("SHOW BINARY LOGS");
    rows.iter().map(|r| r.get(0).expect("file name")).collect()
}

async fn ctx_on(name: &str, server: &PrivateMariadb) -> TestCtx {
    TestCtx::on(name, Stack::connect_with_mysql(&server.url()).await).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_source_crashed_and_restarted_mid_stream_loses_nothing() {
    let mut server = PrivateMariadb::start(7101).await;
    let mut ctx = ctx_on("srcrestart", &server).await;
    ctx.exec("CREATE TABLE acct (id INT PRIMARY KEY, balance BIGINT, note VARCHAR(40))")
        .await;
    let pipeline = ctx.pipeline("acct");
    let run = ctx.start(std::slice::from_ref(&pipeline)).await;
    ctx.exec("INSERT INTO acct SELECT seq, seq, 'first' FROM seq_1_to_3000")
        .await;
    ctx.exec("UPDATE acct SET balance = balance * 2 WHERE id % 2 = 0")
        .await;

    // Crashed while the worker reads; the binlog continues in a new file after recovery.
    server.kill9();
    server.restart().await;
    ctx.stack = Stack::connect_with_mysql(&server.url()).await;
    ctx.exec("UPDATE acct SET note = 'after' WHERE id % 3 = 0")
        .await;
    ctx.exec("DELETE FROM acct WHERE id % 5 = 0").await;
    ctx.exec("INSERT INTO acct VALUES (5000, 1, 'new')").await;

    ctx.wait_streamed(&run.worker).await;
    ctx.converges(&run, &pipeline, WITHIN).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_purged_resume_position_stops_the_task_with_the_fix_named_and_skips_nothing() {
    let server = PrivateMariadb::start(7102).await;
    let ctx = ctx_on("purged", &server).await;
    ctx.exec("CREATE TABLE acct (id INT PRIMARY KEY, balance BIGINT)")
        .await;
    let pipeline = ctx.pipeline("acct");
    let mut run = ctx.start(std::slice::from_ref(&pipeline)).await;
    ctx.exec("INSERT INTO acct SELECT seq, seq FROM seq_1_to_100")
        .await;
    ctx.wait_streamed(&run.worker).await;
    ctx.converges(&run, &pipeline, WITHIN).await;

    // While the worker is down, changes land in binary logs that are then purged.
    run.worker.kill9();
    let confirmed = ctx.checkpoint().await.expect("checkpoint");
    ctx.exec("UPDATE acct SET balance = 0 WHERE id <= 10").await;
    ctx.exec("FLUSH BINARY LOGS").await;
    ctx.exec("FLUSH BINARY LOGS").await;
    let newest = binary_logs(&ctx).await.pop().expect("a binary log");
    // The killed worker's dump thread keeps its file from being purged until the server
    // notices the connection is gone (at its next heartbeat).
    eventually("the older binary logs purged", WITHIN, || async {
        ctx.exec(&format!("PURGE BINARY LOGS TO '{newest}'")).await;
        match binary_logs(&ctx).await {
            logs if logs == [newest.clone()] => Ok(()),
            logs => Err(format!("binary logs still there: {logs:?}")),
        }
    })
    .await;

    let mark = run.worker.log_mark();
    run.worker.start();
    eventually("the task stops and names the fix", WITHIN, || async {
        run.worker
            .logged_since(mark, &["task stopped: this needs an operator"])?;
        run.worker
            .logged_since(mark, &["reset the task's position (and re-snapshot)"])
    })
    .await;
    let failed = run
        .worker
        .metric("sluice_worker_tasks", &[("state", "failed")])
        .await;
    assert_eq!(failed, 1.0, "the task shows as failed");
    let log = std::fs::read_to_string(&run.worker.log).expect("worker log");
    assert_eq!(
        log[mark..].matches("task failed; it resumes").count(),
        0,
        "a definite failure is not retried on a backoff"
    );
    assert_eq!(
        ctx.checkpoint().await.expect("checkpoint"),
        confirmed,
        "nothing was skipped: the confirmed position did not move"
    );
}
