//! The operational history has a retention the leader enforces: at the start of each term
//! (and every hour) it deletes events, audit entries, finished runs and assignment
//! history older than `[retention]` says, keeping what still says something now — a
//! task's latest assignment, each pipeline's latest run of each kind, every dead-letter
//! replay (a forgotten one would be replayed again) — and delayed changes of pipelines
//! that are gone.

use std::time::Duration;

use mysql_async::prelude::*;
use sluice_integration_tests::{eventually, TestCtx};

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
