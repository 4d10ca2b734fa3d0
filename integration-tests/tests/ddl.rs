//! Rows are decoded with the schema in force when they were written: ADD and DROP COLUMN
//! mid-stream, including while the worker is behind (stopped) and reads old rows after
//! the table has already changed.

use std::time::Duration;

use sluice_integration_tests::TestCtx;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn add_and_drop_column_mid_stream_decode_with_the_schema_of_their_time() {
    let ctx = TestCtx::new("ddl").await;
    ctx.exec("CREATE TABLE people (id INT PRIMARY KEY, name VARCHAR(32), legacy INT)")
        .await;
    let pipeline = ctx.pipeline("people");
    let mut run = ctx.start(std::slice::from_ref(&pipeline)).await;

    ctx.exec("INSERT INTO people VALUES (1, 'ann', 10), (2, 'bob', 20)")
        .await;
    ctx.converges(&run, &pipeline, Duration::from_secs(60))
        .await;

    // The worker falls behind: everything below is read after all of it was written.
    run.worker.kill9();
    ctx.exec("INSERT INTO people VALUES (3, 'cid', 30)").await;
    ctx.exec("ALTER TABLE people ADD COLUMN email VARCHAR(64) NULL AFTER name")
        .await;
    ctx.exec("INSERT INTO people VALUES (4, 'dee', 'dee@example.com', 40)")
        .await;
    ctx.exec("UPDATE people SET email = 'ann@example.com', legacy = 11 WHERE id = 1")
        .await;
    ctx.exec("ALTER TABLE people DROP COLUMN legacy").await;
    ctx.exec("INSERT INTO people VALUES (5, 'eve', 'eve@example.com')")
        .await;
    ctx.exec("UPDATE people SET name = 'bobby' WHERE id = 2")
        .await;
    ctx.exec("ALTER TABLE people ADD COLUMN score DECIMAL(6,2) NOT NULL DEFAULT 0")
        .await;
    ctx.exec("INSERT INTO people VALUES (6, 'fay', NULL, 99.50)")
        .await;
    ctx.exec("UPDATE people SET score = 1.25").await;
    run.worker.start();

    // Every row was rewritten after the last ALTER, so documents equal rows exactly,
    // except that documents keep `legacy` until rewritten — all were rewritten.
    ctx.converges(&run, &pipeline, Duration::from_secs(60))
        .await;
}
