//! An event Elasticsearch cannot take goes to the dead-letter topic with the event and the
//! reason; the pipeline keeps going, and the offsets move past it only once it is there
//! (README invariant 5).

use std::time::Duration;

use serde_json::{json, Value};
use sluice_elastic::AliasAction;
use sluice_integration_tests::{eventually, kafka, TestCtx};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rejected_document_is_dead_lettered_with_its_reason_and_the_rest_flows() {
    let ctx = TestCtx::new("dlq").await;
    ctx.exec("CREATE TABLE events (id INT PRIMARY KEY, happened VARCHAR(40))")
        .await;
    let pipeline = ctx.pipeline("events");
    // An index whose mapping disagrees with the data: `happened` must be a date.
    let index = format!("{}_v1", pipeline.alias);
    let es = &ctx.stack.es;
    es.create_index(
        &index,
        &json!({"mappings": {"properties": {"happened": {"type": "date"}}}}),
    )
    .await
    .unwrap();
    es.update_aliases(&[AliasAction::Add {
        index: index.clone(),
        alias: pipeline.alias.clone(),
    }])
    .await
    .unwrap();
    let run = ctx.start(std::slice::from_ref(&pipeline)).await;

    ctx.exec("INSERT INTO events VALUES (1, '2024-01-01'), (2, 'not a date'), (3, '2024-02-02')")
        .await;
    ctx.exec("INSERT INTO events VALUES (4, '2024-04-04')")
        .await;

    let dead = ctx
        .read_topic(&ctx.dlq_topic, 1, Duration::from_secs(60))
        .await;
    assert_eq!(dead.len(), 1, "exactly the bad row is dead-lettered");
    let letter: Value = serde_json::from_slice(&dead[0].payload).unwrap();
    assert_eq!(letter["event"]["key"]["id"], 2, "{letter}");
    assert_eq!(
        letter["event"]["after"]["happened"], "not a date",
        "the event travels whole: {letter}"
    );
    let reason = letter["reason"].as_str().unwrap();
    assert!(
        reason.contains("HTTP 400") && reason.contains("happened"),
        "the reason names the problem: {reason}"
    );
    assert_eq!(letter["topic"], ctx.topic("events"));

    // The rows around it were applied, and so is a later change to the bad row.
    ctx.exec("UPDATE events SET happened = '2024-03-03' WHERE id = 2")
        .await;
    ctx.converges(&run, &pipeline, Duration::from_secs(60))
        .await;
    let topic = ctx.topic("events");
    let ends = kafka::ends(&ctx.read_topic(&topic, 5, Duration::from_secs(60)).await);
    eventually(
        "offsets committed past the dead letter",
        Duration::from_secs(60),
        || ctx.etl_committed_up_to(&topic, &ends),
    )
    .await;
    assert_eq!(
        ctx.read_topic(&ctx.dlq_topic, 1, Duration::from_secs(60))
            .await
            .len(),
        1
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rows_of_a_table_without_a_primary_key_are_dead_lettered_and_the_worker_says_so_once() {
    let ctx = TestCtx::new("nopk").await;
    ctx.exec("CREATE TABLE notes_raw (body VARCHAR(40))").await;
    ctx.exec("CREATE TABLE kept (id INT PRIMARY KEY, body VARCHAR(40))")
        .await;
    let pipelines = [ctx.pipeline("notes_raw"), ctx.pipeline("kept")];
    let run = ctx.start(&pipelines).await;
    ctx.exec("INSERT INTO notes_raw VALUES ('a'), ('b')").await;
    ctx.exec("INSERT INTO notes_raw VALUES ('c')").await;
    ctx.exec("INSERT INTO kept VALUES (1, 'k')").await;

    let dead = ctx
        .read_topic(&ctx.dlq_topic, 3, Duration::from_secs(60))
        .await;
    assert_eq!(dead.len(), 3, "every keyless row is dead-lettered");
    for d in &dead {
        let letter: Value = serde_json::from_slice(&d.payload).unwrap();
        let reason = letter["reason"].as_str().unwrap_or_default();
        assert!(
            reason.contains("no value for its id columns (the primary key)"),
            "{letter}"
        );
    }
    ctx.converges(&run, &pipelines[1], Duration::from_secs(60))
        .await;
    let said = std::fs::read_to_string(&run.worker.log)
        .unwrap()
        .matches("notes_raw have no primary key value")
        .count();
    assert_eq!(said, 1, "told once per table, not per row");
}
