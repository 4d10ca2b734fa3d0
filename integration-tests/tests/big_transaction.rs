//! One transaction of 100 000 rows streams through whole ().

use std::time::Duration;

use sluice_integration_tests::{eventually, TestCtx};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_transaction_of_100k_rows_arrives_whole() {
    let ctx = TestCtx::new("bigtx").await;
    ctx.exec("CREATE TABLE digits (d INT PRIMARY KEY)").await;
    ctx.exec("INSERT INTO digits VALUES (0),(1),(2),(3),(4),(5),(6),(7),(8),(9)")
        .await;
    ctx.exec("CREATE TABLE big (id INT PRIMARY KEY, label VARCHAR(40), n BIGINT)")
        .await;
    let pipeline = ctx.pipeline("big");
    let run = ctx.start(std::slice::from_ref(&pipeline)).await;

    ctx.exec(
        "INSERT INTO big \
         SELECT a.d + 10*b.d + 100*c.d + 1000*e.d + 10000*f.d, CONCAT('row-', a.d, b.d, c.d, e.d, f.d), \
                (a.d + 10*b.d + 100*c.d + 1000*e.d + 10000*f.d) * 1000003 \
         FROM digits a, digits b, digits c, digits e, digits f",
    )
    .await;
    let before = ctx.checkpoint().await.expect("checkpoint").position;

    ctx.converges(&run, &pipeline, Duration::from_secs(300))
        .await;
    // The position moved past the transaction only once all of it was in Kafka.
    eventually(
        "checkpoint past the transaction",
        Duration::from_secs(30),
        || async {
            let now = ctx.checkpoint().await.expect("checkpoint").position;
            if now > before {
                Ok(())
            } else {
                Err(format!("still at {now}"))
            }
        },
    )
    .await;
    // The source's memory stayed bounded while 100k events went through.
    let rss =
        std::fs::read_to_string(format!("/proc/{}/status", run.worker.pid().unwrap())).unwrap();
    let peak_kib: u64 = rss
        .lines()
        .find(|l| l.starts_with("VmHWM:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|n| n.parse().ok())
        .unwrap();
    assert!(
        peak_kib < 1_000_000,
        "worker peak RSS {peak_kib} KiB: buffering without bound?"
    );
}
