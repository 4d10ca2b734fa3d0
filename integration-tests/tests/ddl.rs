//! Rows are decoded with the schema in force when they were written: ADD and DROP COLUMN
//! mid-stream, including while the worker is behind (stopped) and reads old rows after
//! the table has already changed. The source's schema history (its schema topic) holds
//! its own database's DDL, and none of another database on the same server.

use std::time::Duration;

use sluice_integration_tests::on_sources;
use sluice_integration_tests::TestCtx;

on_sources!(add_and_drop_column_mid_stream_decode_with_the_schema_of_their_time: mariadb, mysql);
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
    let other = ctx.other_database().await;
    ctx.exec_in(&other, "CREATE TABLE elsewhere (id INT PRIMARY KEY)")
        .await;
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

    // Every event before the rows just indexed is in Kafka (a position is confirmed
    // only then): the three ALTERs are on the schema topic, the other database's
    // CREATE TABLE is not.
    let topic = sluice_kafka::TopicConfig::default().schema_topic(&ctx.instance);
    let ddl: Vec<String> = ctx
        .read_topic(&topic, 3, Duration::from_secs(30))
        .await
        .iter()
        .map(|r| {
            let e: sluice_model::DdlEvent =
                serde_json::from_slice(&r.payload).expect("a DDL event");
            e.ddl
        })
        .collect();
    assert_eq!(
        ddl.iter()
            .filter(|d| d.starts_with("ALTER TABLE people"))
            .count(),
        3,
        "{ddl:?}"
    );
    assert!(
        !ddl.iter().any(|d| d.contains("elsewhere")),
        "another database's DDL is not this source's: {ddl:?}"
    );
}
