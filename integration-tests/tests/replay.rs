//! Replays and reordering are harmless (README invariant 3): rewinding
//! the etl's consumer group changes no document, and an insert delivered again long after
//! its row was deleted does not bring the document back.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use serde_json::Value;
use sluice_integration_tests::on_sources;
use sluice_integration_tests::process::Service;
use sluice_integration_tests::{check_table, eventually, kafka, CheckOptions, TestCtx};

/// Every document of `alias` with its `_version`.
async fn snapshot(ctx: &TestCtx, alias: &str, ids: &[String]) -> BTreeMap<String, (u64, Value)> {
    let url = format!("{}/{alias}/_mget", ctx.stack.es_url.trim_end_matches('/'));
    let body: Value = reqwest::Client::new()
        .post(url)
        .json(&serde_json::json!({ "ids": ids }))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    body["docs"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|d| d["found"] == true)
        .map(|d| {
            (
                d["_id"].as_str().unwrap().to_owned(),
                (d["_version"].as_u64().unwrap(), d["_source"].clone()),
            )
        })
        .collect()
}

on_sources!(rewinding_the_etl_changes_nothing_and_a_late_insert_does_not_resurrect: mariadb, mysql);
async fn rewinding_the_etl_changes_nothing_and_a_late_insert_does_not_resurrect() {
    let ctx = TestCtx::new("replay").await;
    ctx.exec("CREATE TABLE kv (id INT PRIMARY KEY, v VARCHAR(20))")
        .await;
    let pipeline = ctx.pipeline("kv");
    let topic = ctx.topic("kv");
    let mut run = ctx.start(std::slice::from_ref(&pipeline)).await;

    for i in 0..50 {
        ctx.exec(&format!("INSERT INTO kv VALUES ({i}, 'v{i}')"))
            .await;
    }
    ctx.exec("UPDATE kv SET v = CONCAT(v, '-2') WHERE id % 2 = 0")
        .await;
    ctx.exec("UPDATE kv SET v = CONCAT(v, '-3') WHERE id % 3 = 0")
        .await;
    ctx.exec("DELETE FROM kv WHERE id % 5 = 0").await;
    ctx.exec("INSERT INTO kv VALUES (900, 'doomed')").await;
    ctx.exec("DELETE FROM kv WHERE id = 900").await;
    let deleted_at = Instant::now();
    // Every change above is one event: inserts, the two updates, the deletes, row 900.
    let events = 50
        + (0..50).filter(|i| i % 2 == 0).count()
        + (0..50).filter(|i| i % 3 == 0).count()
        + (0..50).filter(|i| i % 5 == 0).count()
        + 2;
    let records = ctx
        .read_topic(&topic, events, Duration::from_secs(60))
        .await;
    assert_eq!(
        records.len(),
        events,
        "the topic holds exactly the changes made"
    );
    let ends = kafka::ends(&records);
    eventually("converged", Duration::from_secs(60), || async {
        check_table(&ctx, "kv", &pipeline.alias, &CheckOptions::default()).await?;
        ctx.etl_committed_up_to(&topic, &ends).await
    })
    .await;
    let ids: Vec<String> = (0..50).chain([900]).map(|i| i.to_string()).collect();
    let before = snapshot(&ctx, &pipeline.alias, &ids).await;
    assert!(!before.contains_key("900"));

    // Rewind the group to the start: every event is applied again.
    run.etl.terminate(Duration::from_secs(30));
    ctx.rewind_etl(&topic).await;
    assert!(
        ctx.etl_committed_up_to(&topic, &ends).await.is_err(),
        "the rewind must leave events to replay"
    );
    run.etl.start();
    eventually("the replay consumed", Duration::from_secs(60), || {
        ctx.etl_committed_up_to(&topic, &ends)
    })
    .await;
    let after = snapshot(&ctx, &pipeline.alias, &ids).await;
    assert_eq!(
        before, after,
        "a replay moved a document (content or _version)"
    );
    // A replay finds its own versions there (stale), not newer ones (superseded: what
    // versions going backwards look like).
    let (written, stale, superseded) = documents(&run.etl).await;
    assert_eq!(written, 0.0, "the replay wrote documents");
    assert!(
        stale > 0.0 && superseded == 0.0,
        "{stale} stale and {superseded} superseded after a replay of {events} events"
    );
    check_table(&ctx, "kv", &pipeline.alias, &CheckOptions::default())
        .await
        .unwrap();

    // The index keeps delete tombstones far longer than Elasticsearch's 60 s default.
    let index = ctx
        .stack
        .es
        .alias_targets(&pipeline.alias)
        .await
        .unwrap()
        .remove(0);
    let settings = ctx.stack.es.get_settings(&index).await.unwrap();
    assert_eq!(settings[&index]["settings"]["index"]["gc_deletes"], "7d");

    // Deliver row 900's insert again after the default tombstone lifetime has passed.
    let insert = records
        .iter()
        .find(|r| {
            let e: Value = serde_json::from_slice(&r.payload).unwrap();
            e["op"] == "c" && e["key"]["id"] == 900
        })
        .expect("row 900's insert event is in the topic");
    let wait = Duration::from_secs(62).saturating_sub(deleted_at.elapsed());
    // Not synchronisation: the property under test is about elapsed time itself.
    tokio::time::sleep(wait).await;
    ctx.republish(&topic, insert.partition, &insert.key, &insert.payload)
        .await;
    let mut late_ends = ends.clone();
    *late_ends.get_mut(&insert.partition).expect("partition") += 1;
    eventually(
        "the late insert was consumed",
        Duration::from_secs(60),
        || ctx.etl_committed_up_to(&topic, &late_ends),
    )
    .await;
    let late = ctx
        .stack
        .es
        .mget(&pipeline.alias, &["900".to_owned()])
        .await
        .unwrap();
    assert_eq!(
        late,
        vec![None],
        "a replayed insert resurrected a deleted row"
    );
    let (_, _, superseded) = documents(&run.etl).await;
    assert_eq!(
        superseded, 1.0,
        "the late insert, older than the delete's tombstone, is counted as superseded"
    );
    check_table(&ctx, "kv", &pipeline.alias, &CheckOptions::default())
        .await
        .unwrap();
}

/// The etl's bulk items by result: written, stale and superseded.
async fn documents(etl: &Service) -> (f64, f64, f64) {
    let result = |r: &'static str| async move {
        etl.metric("sluice_etl_documents_total", &[("result", r)])
            .await
    };
    (
        result("written").await,
        result("stale").await,
        result("superseded").await,
    )
}
