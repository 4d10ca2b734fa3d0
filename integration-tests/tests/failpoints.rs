//! Crash windows that cannot be reached from outside, reached with failpoints (debug
//! builds only): the etl dying after Elasticsearch acknowledged a batch but before its
//! offsets were committed (the batch is only replayed: stale, never superseded), and the
//! worker dying between a TABLE_MAP event and its rows event in the middle of
//! multi-table transactions (it resumes from its last transaction boundary; nothing is
//! lost).

use std::time::Duration;

use mysql_async::prelude::*;
use mysql_async::TxOpts;
use sluice_integration_tests::{Running, TestCtx};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crash_after_elasticsearch_acknowledged_and_before_the_offset_commit_only_replays() {
    let ctx = TestCtx::new("fpetl").await;
    ctx.exec("CREATE TABLE notes (id INT PRIMARY KEY, body VARCHAR(40))")
        .await;
    let pipeline = ctx.pipeline("notes");
    let mut worker = ctx.worker();
    worker.start();
    ctx.wait_worker_ready(&worker).await;
    let insert = |chunks: std::ops::Range<i32>| {
        let ctx = &ctx;
        async move {
            for chunk in chunks {
                let values: Vec<String> = (0..100)
                    .map(|i| chunk * 100 + i)
                    .map(|id| format!("({id}, 'b{id}')"))
                    .collect();
                ctx.exec(&format!("INSERT INTO notes VALUES {}", values.join(",")))
                    .await;
            }
        }
    };
    insert(0..5).await;
    ctx.wait_streamed(&worker).await;

    // The topic holds exactly one batch (500 documents, lingered for up to 10 s until it
    // is full): it is written, acknowledged, and its offsets never committed. With a
    // second batch in the topic its bulk could be on its way (a batch whose writes are
    // done frees its place in the flight before it lands), and the count below would
    // depend on whether it reached Elasticsearch before the crash.
    let mut etl = ctx
        .etl(std::slice::from_ref(&pipeline))
        .with_env("SLUICE_ETL__MAX_BATCH_DOCS", "500")
        .with_env("SLUICE_ETL__LINGER", "10s")
        .with_env("FAILPOINTS", "etl.before_commit");
    etl.start();
    etl.wait_failpoint("etl.before_commit", Duration::from_secs(90));
    let es = &ctx.stack.es;
    let _ = es.refresh(&pipeline.alias).await;
    let applied = es.count(&pipeline.alias).await.unwrap_or(0);
    assert_eq!(applied, 500, "the batch was applied before the crash");

    insert(5..20).await;
    ctx.wait_streamed(&worker).await;
    etl.without_env("FAILPOINTS");
    etl.without_env("SLUICE_ETL__LINGER");
    etl.start();
    let run = Running { worker, etl };
    ctx.converges(&run, &pipeline, Duration::from_secs(90))
        .await;
    let stale = run
        .etl
        .metric("sluice_etl_documents_total", &[("result", "stale")])
        .await;
    let superseded = run
        .etl
        .metric("sluice_etl_documents_total", &[("result", "superseded")])
        .await;
    assert_eq!(
        stale,
        applied as f64,
        "the uncommitted batch was read again, each of its documents found already there:\n{}",
        run.etl.log_tail()
    );
    assert_eq!(superseded, 0.0, "a replay never meets a newer version");
    drop(run);
    ctx.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crash_between_a_table_map_and_its_rows_loses_nothing() {
    let ctx = TestCtx::new("fpmap").await;
    for t in ["debits", "credits"] {
        ctx.exec(&format!(
            "CREATE TABLE {t} (id INT PRIMARY KEY, amount BIGINT, note VARCHAR(20))"
        ))
        .await;
    }
    let pipelines = [ctx.pipeline("debits"), ctx.pipeline("credits")];
    // Each transaction maps both tables; the 150th table map is in the 75th.
    let worker = ctx
        .worker()
        .with_env("FAILPOINTS", "reader.after_table_map@150");
    let etl = ctx.etl(&pipelines);
    let mut run = ctx.run(worker, etl).await;
    let mut conn = ctx.stack.conn().await;
    conn.query_drop(format!("USE `{}`", ctx.db)).await.unwrap();
    for i in 0..200i64 {
        let mut tx = conn.start_transaction(TxOpts::default()).await.unwrap();
        tx.query_drop(format!(
            "INSERT INTO debits VALUES ({i}, {i}, 'd{i}'), ({}, 1, 'x')",
            i + 1000
        ))
        .await
        .unwrap();
        tx.query_drop(format!("INSERT INTO credits VALUES ({i}, {}, 'c{i}')", -i))
            .await
            .unwrap();
        tx.query_drop(format!("DELETE FROM debits WHERE id = {}", i + 1000))
            .await
            .unwrap();
        tx.commit().await.unwrap();
    }
    run.worker
        .wait_failpoint("reader.after_table_map", Duration::from_secs(90));
    run.worker.without_env("FAILPOINTS");
    run.worker.start();
    for p in &pipelines {
        ctx.converges(&run, p, Duration::from_secs(90)).await;
    }
    drop(run);
    ctx.cleanup().await;
}
