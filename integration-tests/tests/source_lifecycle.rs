//! A source's binlog coordinates restarting without loss, on MariaDB servers of the
//! test's own: a replica promoted to primary while writes go on, and a resume position
//! purged while the worker was down. Binlog file numbers start low again on the promoted
//! replica, so without a new version epoch every change read there would be refused as
//! older than the documents the old primary gave. The purged position stops the task with
//! the fix named, skipping nothing, until `sluicectl sources resnapshot` recovers it.

use std::time::Duration;

use sluice_integration_tests::on_sources;
use sluice_integration_tests::private_source::PrivateSource;
use sluice_integration_tests::proxy::Proxy;
use sluice_integration_tests::stack::Stack;
use sluice_integration_tests::{eventually, TestCtx};

const WITHIN: Duration = Duration::from_secs(120);

/// Upserts into `acct` over a key range the first rows already cover, so most changes
/// update documents indexed earlier; `phase` makes every value one no earlier write had.
fn upserts(phase: &'static str) -> impl Fn(u64) -> Vec<String> + Send + 'static {
    move |n| {
        let id = n % 400 + 1;
        vec![format!(
            "INSERT INTO acct VALUES ({id}, -{n}, '{phase}{n}') ON DUPLICATE KEY UPDATE balance = -{n}, note = '{phase}{n}'"
        )]
    }
}

async fn binary_logs(ctx: &TestCtx) -> Vec<String> {
    use mysql_async::prelude::*;
    let rows: Vec<mysql_async::Row> = ctx
        .stack
        .conn()
        .await
        .query("SHOW BINARY LOGS")
        .await
        .expect("SHOW BINARY LOGS");
    rows.iter().map(|r| r.get(0).expect("file name")).collect()
}

on_sources!(a_promoted_replica_takes_over_by_failover_and_nothing_is_lost_or_refused: mariadb, mysql);
async fn a_promoted_replica_takes_over_by_failover_and_nothing_is_lost_or_refused() {
    let primary = PrivateSource::start(7201).await;
    let replica = PrivateSource::start(7202).await;
    replica.replicate_from(&primary);
    // The source's address, as a DNS name or a virtual IP would be: moved to the replica
    // when it is promoted.
    let address = Proxy::start(&primary.addr()).await;
    let mut ctx = TestCtx::on("srcmove", primary.stack().await).await;
    ctx.route_mysql(&address.addr());
    // The centers' own database stays out of the servers that change roles.
    ctx.route_meta(&Stack::shared_mysql_url());
    // The primary's binlog files are numbered past the replica's own.
    for _ in 0..3 {
        ctx.exec("FLUSH BINARY LOGS").await;
    }
    ctx.exec("CREATE TABLE acct (id INT PRIMARY KEY, balance BIGINT, note VARCHAR(40))")
        .await;
    let cluster = ctx.start_cluster(1, 1).await;
    let source = ctx.add_source(&cluster, "acct", 1).await;
    cluster
        .wait_running(&[&source], Duration::from_secs(60))
        .await;
    ctx.exec(&format!(
        "INSERT INTO acct SELECT seq, seq, 'first' FROM {}",
        sluice_integration_tests::seq(1, 400)
    ))
    .await;
    let load = ctx.load(Duration::from_millis(5), upserts("primary"));
    load.wait_rounds(300, WITHIN).await;
    let before = load.stop().await;
    cluster.converges(&ctx, &source.pipeline, WITHIN).await;
    let on_primary = ctx.checkpoint_of(&source.name).await.expect("a checkpoint");
    assert_eq!(on_primary.server_id, Some(7201));

    // A planned failover: writes stop on the primary, the replica applies the rest and is
    // promoted, the address moves to it, and writes go on there.
    replica.promote(&primary);
    address.retarget(&replica.addr());
    address.cut();
    ctx.stack = replica.stack().await;
    let load = ctx.load(Duration::from_millis(5), upserts("promoted"));

    // Same address, another server: the task refuses to read coordinates that would
    // version new changes below the indexed ones, and says what to run.
    let refused = cluster
        .wait_event(
            &source.name,
            "task_failed",
            &["server_id 7202", "sluicectl sources failover"],
        )
        .await;
    eprintln!("the task stopped: {refused}");
    let moved = cluster
        .ctl(&[
            "sources",
            "failover",
            &source.name,
            "--host",
            "127.0.0.1",
            "--port",
            address.addr().rsplit_once(':').expect("host:port").1,
        ])
        .unwrap_or_else(|e| panic!("sluicectl sources failover: {e}"));
    assert_eq!(moved["epoch"], 1, "{moved}");
    cluster
        .wait_event(&source.name, "source", &["failover", "version epoch 1"])
        .await;

    // Writes go on on the promoted replica, also after the task resumed there.
    load.wait_rounds(150, WITHIN).await;
    let after = load.stop().await;
    assert!(
        before > 100 && after > 100,
        "writes went on before ({before}) and after ({after}) the promotion"
    );
    cluster.converges(&ctx, &source.pipeline, WITHIN).await;
    let on_replica = ctx.checkpoint_of(&source.name).await.expect("a checkpoint");
    assert_eq!(
        (on_replica.epoch, on_replica.server_id),
        (1, Some(7202)),
        "{on_replica:?}"
    );
    assert!(
        sluice_model::position::file_seq(&on_replica.position.file).expect("a binlog file")
            < sluice_model::position::file_seq(&on_primary.position.file).expect("a binlog file"),
        "the promoted replica's binlog numbers are below the primary's ({} vs {}): the case the epoch is for",
        on_replica.position,
        on_primary.position
    );
}

on_sources!(a_purged_resume_position_stops_the_task_until_a_resnapshot_recovers_it: mariadb, mariadb_watermarks, mysql);
async fn a_purged_resume_position_stops_the_task_until_a_resnapshot_recovers_it() {
    let server = PrivateSource::start(7102).await;
    let ctx = TestCtx::on("purged", server.stack().await).await;
    ctx.route_meta(&Stack::shared_mysql_url());
    ctx.exec("CREATE TABLE acct (id INT PRIMARY KEY, balance BIGINT)")
        .await;
    let mut cluster = ctx.start_cluster(1, 1).await;
    let source = ctx.add_source(&cluster, "acct", 1).await;
    cluster
        .wait_running(&[&source], Duration::from_secs(60))
        .await;
    ctx.exec(&format!(
        "INSERT INTO acct SELECT seq, seq FROM {}",
        sluice_integration_tests::seq(1, 100)
    ))
    .await;
    cluster.converges(&ctx, &source.pipeline, WITHIN).await;

    // While the worker is down, changes land in binary logs that are then purged.
    cluster.workers[0].kill9();
    let confirmed = ctx.checkpoint_of(&source.name).await.expect("a checkpoint");
    ctx.exec("UPDATE acct SET balance = 0 WHERE id <= 10").await;
    ctx.exec("FLUSH BINARY LOGS").await;
    ctx.exec("FLUSH BINARY LOGS").await;
    let newest = binary_logs(&ctx).await.pop().expect("a binary log");
    // The killed worker's dump thread keeps its file from being purged until the server
    // notices the connection is gone (at its next heartbeat).
    eventually("the older binary logs purged", WITHIN, || async {
        ctx.exec(&format!("PURGE BINARY LOGS TO '{newest}'")).await;
        match binary_logs(&ctx).await {
            logs if logs == [newest.clone()] => Ok(()),
            logs => Err(format!("binary logs still there: {logs:?}")),
        }
    })
    .await;

    let worker = &mut cluster.workers[0];
    let mark = worker.log_mark();
    worker.start();
    let fix = format!("sluicectl sources resnapshot {}", source.name);
    cluster
        .wait_event(&source.name, "task_failed", &["is gone", &fix])
        .await;
    let worker = &cluster.workers[0];
    let failed = worker
        .metric("sluice_worker_tasks", &[("state", "failed")])
        .await;
    assert_eq!(failed, 1.0, "the task shows as failed");
    let log = std::fs::read_to_string(&worker.log).expect("worker log");
    assert_eq!(
        log[mark..].matches("task failed; it resumes").count(),
        0,
        "a definite failure is not retried on a backoff"
    );
    assert_eq!(
        ctx.checkpoint_of(&source.name).await.expect("a checkpoint"),
        confirmed,
        "nothing was skipped: the confirmed position did not move"
    );

    // On request: the task starts again at the end under a new epoch, and a build reads
    // what the purged files held.
    let recovered = cluster
        .ctl(&["sources", "resnapshot", &source.name])
        .unwrap_or_else(|e| panic!("sluicectl sources resnapshot: {e}"));
    assert_eq!(recovered["source"]["epoch"], 1, "{recovered}");
    assert_eq!(
        recovered["builds_started"],
        serde_json::json!([source.pipeline.alias]),
        "{recovered}"
    );
    ctx.exec("INSERT INTO acct VALUES (101, 101)").await;
    cluster.wait_built(&source.pipeline.alias, WITHIN).await;
    cluster.converges(&ctx, &source.pipeline, WITHIN).await;
    let now = ctx.checkpoint_of(&source.name).await.expect("a checkpoint");
    assert_eq!(now.epoch, 1, "{now:?}");
}
