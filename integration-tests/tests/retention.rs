//! The operational history has a retention the leader enforces: at the start of each term
//! (and every hour) it deletes events, audit entries, finished runs and assignment
//! history older than `[retention]` says, keeping what still says something now — a
//! task's latest assignment, each pipeline's latest run of each kind, every dead-letter
//! replay (a forgotten one would be replayed again) — and delayed changes of pipelines
//! that are gone. It also deletes the tombstones that deletes leave in the indexes of
//! pipelines written in parts, once past the pipeline's `tombstone_retention`.

use std::time::Duration;

use mysql_async::prelude::*;
use serde_json::json;
use sluice_integration_tests::{check_documents, eventually, shop, TestCtx};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_leader_deletes_history_past_its_retention() {
    let ctx = TestCtx::new("retention").await;
    let mut cluster = ctx.start_cluster(1, 0).await;
    let db = ctx.meta_db();
    let mut conn = ctx.stack.conn().await;
    let old = "CURRENT_TIMESTAMP(3) - INTERVAL 120 DAY";
    for sql in [
        format!("INSERT INTO `{db}`.events (at, origin, kind, subject, message) VALUES ({old}, 'it', 'old', 'kept-not', 'old'), (CURRENT_TIMESTAMP(3), 'it', 'new', 'kept', 'new')"),
        format!("INSERT INTO `{db}`.audit (at, user, role, method, target, peer, outcome, detail) VALUES ({old}, 'it', 'admin', 'PutSource', 'old', '', 'ok', ''), (CURRENT_TIMESTAMP(3), 'it', 'admin', 'PutSource', 'new', '', 'ok', '')"),
        format!("INSERT INTO `{db}`.checks (pipeline, version, repair, state, started_by, kind, started_at, finished_at) VALUES ('p', 1, 0, 'done', 'operator', 'check', {old}, {old}), ('p', 1, 0, 'done', 'operator', 'check', {old}, {old}), ('p', 1, 0, 'done', 'operator', 'compare', {old}, {old})"),
        format!("INSERT INTO `{db}`.assignments (task, worker, epoch, reason, at) VALUES ('t', 'w0', 1, 'old', {old}), ('t', 'w1', 1, 'latest', {old})"),
        format!("INSERT INTO `{db}`.dead_letter_replays (letter, replayed_to, epoch, at) VALUES ('dlq:0:1', 'x', 1, {old})"),
        format!("INSERT INTO `{db}`.delayed_changes (pipeline, digest, node, vals, version) VALUES ('gone', REPEAT('a', 32), 'n', '[]', 1)"),
    ] {
        conn.query_drop(&sql).await.unwrap_or_else(|e| panic!("{sql}: {e}"));
    }
    // A new term sweeps at once.
    cluster.centers[0].terminate(Duration::from_secs(10));
    cluster.centers[0].start();
    cluster.wait_leader(Duration::from_secs(30), None).await;
    let count = |sql: String| {
        let pool = ctx.stack.conn();
        async move {
            let mut c = pool.await;
            c.query_first::<u64, _>(sql).await.unwrap().unwrap()
        }
    };
    eventually(
        "history past its retention is gone",
        Duration::from_secs(30),
        || async {
            let left = (
                count(format!(
                    "SELECT COUNT(*) FROM `{db}`.events WHERE kind IN ('old', 'new')"
                ))
                .await,
                count(format!(
                    "SELECT COUNT(*) FROM `{db}`.audit WHERE user = 'it'"
                ))
                .await,
                count(format!(
                    "SELECT COUNT(*) FROM `{db}`.checks WHERE pipeline = 'p'"
                ))
                .await,
                count(format!(
                    "SELECT COUNT(*) FROM `{db}`.assignments WHERE task = 't'"
                ))
                .await,
                count(format!("SELECT COUNT(*) FROM `{db}`.dead_letter_replays")).await,
                count(format!("SELECT COUNT(*) FROM `{db}`.delayed_changes")).await,
            );
            // The new event and entry stay; the latest check and the latest compare of `p`
            // stay; the latest assignment of `t` stays; the replay stays.
            if left == (1, 1, 2, 1, 1, 0) {
                Ok(())
            } else {
                Err(format!("left: {left:?}\n{}", cluster.logs()))
            }
        },
    )
    .await;
    let kept: String = conn
        .query_first(format!(
            "SELECT reason FROM `{db}`.assignments WHERE task = 't'"
        ))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(kept, "latest");
    let deleted = cluster.centers[0]
        .metric(
            "sluice_center_history_deleted_total",
            &[("history", "events")],
        )
        .await;
    assert!(deleted >= 1.0, "{deleted}");

    drop(cluster);
    ctx.cleanup().await;
}

/// Deleted rows of a tree written in parts leave tombstones (hidden by the alias); the
/// leader deletes them once older than the pipeline's `tombstone_retention`, and the
/// deleted documents stay gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_leader_deletes_tombstones_past_the_pipelines_retention() {
    let ctx = TestCtx::new("tombsweep").await;
    shop::schema(&ctx).await;
    let cluster = ctx.start_cluster(1, 1).await;
    let source = ctx.add_source(&cluster, "products", 1).await;
    for t in ["brands", "skus", "sku_prices", "product_tags", "promotions"] {
        ctx.clean_up_topic(sluice_kafka::TopicConfig::default().rows_topic(
            &source.name,
            &ctx.db,
            t,
        ));
    }
    let mut spec = shop::spec(&ctx);
    spec["source"] = json!(source.name);
    spec["tombstone_retention"] = json!("3s");
    ctx.put_spec(&cluster, &spec).unwrap();
    cluster
        .wait_running(&[&source], Duration::from_secs(60))
        .await;
    let alias = spec["alias"].as_str().unwrap().to_owned();
    let index = sluice_elastic::versioned_index(&alias, 1);
    // Products inserted now are streamed into the index (it is never built), some deleted.
    let mark = cluster.centers[0].log_mark();
    let values: Vec<String> = (1001..=1020)
        .map(|p| format!("({p}, 'streamed {p}', 1, 1.00, 0)"))
        .collect();
    ctx.exec(&format!(
        "INSERT INTO products VALUES {}",
        values.join(", ")
    ))
    .await;
    ctx.exec("DELETE FROM products WHERE id BETWEEN 1001 AND 1008")
        .await;
    // Tombstones of 8 deletes are gone from the index; the 12 others stay, as in MySQL.
    eventually(
        "the deleted products' tombstones are swept",
        Duration::from_secs(60),
        || async {
            ctx.stack
                .es
                .refresh(&index)
                .await
                .map_err(|e| e.to_string())?;
            let stored = ctx
                .stack
                .es
                .count(&index)
                .await
                .map_err(|e| e.to_string())?;
            let live = ctx
                .stack
                .es
                .count(&alias)
                .await
                .map_err(|e| e.to_string())?;
            let swept = cluster.centers[0].logged_since(mark, &["deleted tombstones past"]);
            match (stored, live, swept) {
                (12, 12, Ok(())) => Ok(()),
                (stored, live, swept) => Err(format!(
                    "{stored} stored, {live} searchable, swept: {}\n{}",
                    swept.is_ok(),
                    cluster.logs()
                )),
            }
        },
    )
    .await;
    let deleted = cluster.centers[0]
        .metric(
            "sluice_center_tombstones_deleted_total",
            &[("pipeline", spec["name"].as_str().unwrap())],
        )
        .await;
    assert_eq!(deleted, 8.0);
    // What is left is exactly MySQL's (the deleted ones did not come back).
    let documents = check_documents(&ctx, &spec).await.unwrap();
    assert_eq!(documents, 12);

    drop(cluster);
    ctx.cleanup().await;
}

/// Trees are written in parts by default, but a pipeline stored by an earlier version
/// keeps its whole writes across the upgrade (its etls may still be the earlier ones);
/// a spec that says either way keeps what it says.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pipelines_stored_before_parts_were_the_default_keep_whole_writes() {
    let ctx = TestCtx::new("upgrade18").await;
    let mut cluster = ctx.start_cluster(1, 0).await;
    let db = ctx.meta_db();
    let mut conn = ctx.stack.conn().await;
    let mut stored = Vec::new();
    for (name, said) in [("before", None), ("on", Some(true))] {
        let mut spec = shop::spec(&ctx);
        spec["name"] = json!(name);
        spec["alias"] = json!(format!("{name}_{}", ctx.db));
        match said {
            Some(on) => spec["area_updates"] = json!(on),
            None => drop(spec.as_object_mut().unwrap().remove("area_updates")),
        }
        conn.exec_drop(
            format!("INSERT INTO `{db}`.pipelines (name, source, db_name, table_name, alias, spec_json) VALUES (?, 'gone', ?, 'products', ?, ?)"),
            (name, &ctx.db, spec["alias"].as_str().unwrap(), spec.to_string()),
        )
        .await
        .unwrap();
        stored.push(name);
    }
    // As a database of the version before: the migration runs at the next start.
    conn.query_drop(format!(
        "DELETE FROM `{db}`.schema_migrations WHERE version = 18"
    ))
    .await
    .unwrap();
    cluster.centers[0].terminate(Duration::from_secs(10));
    cluster.centers[0].start();
    cluster.wait_leader(Duration::from_secs(30), None).await;
    for (name, want) in [("before", false), ("on", true)] {
        let spec: String = conn
            .exec_first(
                format!("SELECT spec_json FROM `{db}`.pipelines WHERE name = ?"),
                (name,),
            )
            .await
            .unwrap()
            .unwrap();
        let spec: serde_json::Value = serde_json::from_str(&spec).unwrap();
        assert_eq!(spec["area_updates"], json!(want), "{name}: {spec}");
        let parsed: sluice_model::PipelineSpec = serde_json::from_value(spec).unwrap();
        assert_eq!(parsed.area_updates(), want, "{name}");
    }
    drop(cluster);
    ctx.cleanup().await;
}
