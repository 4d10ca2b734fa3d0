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
        filter: None,
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

/// `sluicectl dlq`: changes refused while the index was write-blocked are listed with the
/// reason; once the block is lifted a replay applies them through the normal path, the
/// versions keep a replayed letter from undoing a newer change of its row, and a letter is
/// replayed once unless named again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dead_letters_are_listed_and_replayed_through_the_normal_path_once_the_cause_is_fixed() {
    let ctx = TestCtx::new("dlqreplay").await;
    ctx.exec("CREATE TABLE notes (id INT PRIMARY KEY, body VARCHAR(40))")
        .await;
    let cluster = ctx.start_cluster(1, 1).await;
    let notes = ctx.add_source(&cluster, "notes", 1).await;
    let pipeline = notes.pipeline.alias.clone();
    cluster
        .wait_running(&[&notes], Duration::from_secs(30))
        .await;
    ctx.exec("INSERT INTO notes VALUES (1, 'one'), (2, 'two'), (3, 'three'), (4, 'four')")
        .await;
    cluster
        .converges(&ctx, &notes.pipeline, Duration::from_secs(60))
        .await;
    let index = format!("{}_v1", notes.pipeline.alias);
    let es = &ctx.stack.es;
    let index = &index;
    let block = |on: bool| async move {
        es.update_settings(index, &json!({"index.blocks.write": on}))
            .await
            .unwrap()
    };

    // Maintenance left a write block on the index: every change is refused (403).
    block(true).await;
    ctx.exec("INSERT INTO notes VALUES (5, 'five'), (6, 'six')")
        .await;
    ctx.exec("UPDATE notes SET body = 'four, again' WHERE id = 4")
        .await;
    ctx.exec("DELETE FROM notes WHERE id = 4").await;
    ctx.exec("INSERT INTO notes VALUES (4, 'four, back')").await;
    // The etl writes only a row's newest change of a batch: 3 to 5 letters, one or more
    // per row.
    let keys = |l: &Value| {
        let mut keys: Vec<String> = l["letters"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|l| l["key"].as_str().unwrap_or_default().to_owned())
            .collect();
        keys.sort();
        keys.dedup();
        keys
    };
    let listed = eventually(
        "letters for rows 4, 5 and 6",
        Duration::from_secs(60),
        || async {
            let l = cluster.ctl(&["dlq", "list", "--pipeline", &pipeline])?;
            (keys(&l) == [r#"{"id":4}"#, r#"{"id":5}"#, r#"{"id":6}"#])
                .then(|| l.clone())
                .ok_or(format!("{l}"))
        },
    )
    .await;
    let n = listed["letters"].as_array().unwrap().len();
    for letter in listed["letters"].as_array().unwrap() {
        let reason = letter["reason"].as_str().unwrap();
        assert!(reason.contains("cluster_block_exception"), "{letter}");
        assert_eq!(letter["table"], format!("{}.notes", ctx.db), "{letter}");
        assert_eq!(letter["not_replayable"], "", "{letter}");
    }
    let unknown = format!("{}:0:999999", ctx.dlq_topic);
    let refused = cluster.ctl(&["dlq", "replay", "--id", &unknown]).unwrap();
    assert_eq!(refused["replayed"], json!([]), "{refused}");
    assert!(refused["refused"][0]
        .as_str()
        .unwrap()
        .contains("no such dead letter"));

    // The block is lifted; row 5 changes again before the replay.
    block(false).await;
    ctx.exec("UPDATE notes SET body = 'five, newer' WHERE id = 5")
        .await;
    let replayed = cluster
        .ctl(&["dlq", "replay", "--pipeline", &pipeline])
        .unwrap();
    assert_eq!(
        replayed["replayed"].as_array().unwrap().len(),
        n,
        "{replayed}"
    );
    cluster
        .converges(&ctx, &notes.pipeline, Duration::from_secs(60))
        .await;
    let doc = es.mget(index, &["5".to_owned()]).await.unwrap().remove(0);
    let doc = doc.expect("document 5");
    assert_eq!(
        doc["body"], "five, newer",
        "the replay undid nothing: {doc}"
    );

    let left = cluster
        .ctl(&["dlq", "list", "--pipeline", &pipeline])
        .unwrap();
    assert_eq!(left["letters"], json!([]), "nothing left to replay: {left}");
    let all = cluster
        .ctl(&["dlq", "list", "--pipeline", &pipeline, "--include-replayed"])
        .unwrap();
    let letters = all["letters"].as_array().unwrap();
    assert_eq!(letters.len(), n, "{all}");
    assert!(
        letters
            .iter()
            .all(|l| l["replayed_at_ms"].as_i64() > Some(0)),
        "{all}"
    );
    // In pages, newest first, as many at once as callers ask: each waits its turn.
    let second = cluster
        .ctl(&[
            "dlq",
            "list",
            "--pipeline",
            &pipeline,
            "--include-replayed",
            "--limit",
            "1",
            "--skip",
            "1",
        ])
        .unwrap();
    assert_eq!(second["matched"], json!(n), "{second}");
    assert_eq!(second["letters"].as_array().unwrap().len(), 1, "{second}");
    assert_eq!(
        second["letters"][0]["id"], letters[1]["id"],
        "{second} / {all}"
    );
    let admin = cluster.admin().await;
    let at_once = (0..6).map(|_| {
        let mut admin = admin.clone();
        let req = sluice_proto::v1::ListDeadLettersRequest {
            pipeline: pipeline.clone(),
            include_replayed: true,
            ..Default::default()
        };
        async move { admin.list_dead_letters(req).await }
    });
    for listed in futures::future::join_all(at_once).await {
        assert_eq!(listed.unwrap().into_inner().letters.len(), n);
    }
    let again = cluster
        .ctl(&["dlq", "replay", "--pipeline", &pipeline])
        .unwrap();
    assert_eq!(
        again["replayed"],
        json!([]),
        "a letter is replayed once: {again}"
    );
    let events = cluster.ctl(&["events", "--subject", &pipeline]).unwrap();
    assert!(
        events
            .to_string()
            .contains(&format!("{n} dead letters replayed")),
        "the replay is recorded: {events}"
    );
}

/// A row the worker cannot decode (here an update one session logged with only its key
/// and changed columns, `binlog_row_image=MINIMAL`) goes to the source's dead-letter topic
/// with the reason and where it was; the rows around it flow, and the row's next complete
/// change brings its document back in line.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_row_logged_without_its_full_image_is_dead_lettered_with_the_reason() {
    use mysql_async::prelude::Queryable as _;
    let ctx = TestCtx::new("minimal").await;
    ctx.exec("CREATE TABLE notes (id INT PRIMARY KEY, body VARCHAR(40), n INT)")
        .await;
    let pipelines = [ctx.pipeline("notes")];
    let run = ctx.start(&pipelines).await;
    ctx.exec("INSERT INTO notes VALUES (1, 'one', 1), (2, 'two', 2)")
        .await;
    let mut minimal = ctx.stack.conn().await;
    for sql in [
        format!("USE {}", ctx.db),
        "SET SESSION binlog_row_image = 'MINIMAL'".into(),
        "UPDATE notes SET n = 10 WHERE id = 1".into(),
    ] {
        minimal.query_drop(&sql).await.expect(&sql);
    }
    ctx.exec("INSERT INTO notes VALUES (3, 'three', 3)").await;

    let topic = sluice_kafka::TopicConfig::default().source_dead_letter_topic(&ctx.instance);
    let dead = ctx.read_topic(&topic, 1, Duration::from_secs(60)).await;
    assert_eq!(
        dead.len(),
        1,
        "the one undecodable rows event is dead-lettered"
    );
    let letter: Value = serde_json::from_slice(&dead[0].payload).unwrap();
    assert_eq!(letter["table"], "notes", "{letter}");
    let reason = letter["reason"].as_str().unwrap_or_default();
    assert!(
        reason.contains("binlog_row_image must be FULL"),
        "the reason names the fix: {letter}"
    );
    assert!(
        letter["source"]["pos"].as_u64().unwrap_or(0) > 0,
        "{letter}"
    );

    // The row's next change is logged in full and carries the whole row.
    ctx.exec("UPDATE notes SET body = 'one, again' WHERE id = 1")
        .await;
    ctx.converges(&run, &pipelines[0], Duration::from_secs(60))
        .await;
}
