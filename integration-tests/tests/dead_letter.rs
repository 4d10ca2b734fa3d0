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
