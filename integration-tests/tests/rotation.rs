//! Versions stay monotonic across binlog rotation: changes to the same rows on both sides
//! of `FLUSH BINARY LOGS`, and a worker that resumes in the new file, all land
//! (README invariant 3).

use std::time::Duration;

use sluice_integration_tests::on_sources;
use sluice_integration_tests::TestCtx;

on_sources!(changes_across_binlog_rotation_keep_growing_versions: mariadb, mysql);
async fn changes_across_binlog_rotation_keep_growing_versions() {
    let ctx = TestCtx::new("rotate").await;
    ctx.exec("CREATE TABLE r (id INT PRIMARY KEY, v INT)").await;
    let pipeline = ctx.pipeline("r");
    let mut run = ctx.start(std::slice::from_ref(&pipeline)).await;
    let first_file = ctx.checkpoint().await.expect("checkpoint").position.file;

    ctx.exec("INSERT INTO r VALUES (1, 1), (2, 1), (3, 1)")
        .await;
    ctx.exec("UPDATE r SET v = 2").await;
    ctx.exec("FLUSH BINARY LOGS").await;
    // Later changes live in a file whose offsets start again from 4: only the file
    // number in the version keeps them newer than the ones above.
    ctx.exec("UPDATE r SET v = 3 WHERE id IN (1, 2)").await;
    ctx.exec("DELETE FROM r WHERE id = 3").await;
    ctx.converges(&run, &pipeline, Duration::from_secs(60))
        .await;

    run.worker.kill9();
    ctx.exec("FLUSH BINARY LOGS").await;
    ctx.exec("UPDATE r SET v = 4 WHERE id = 1").await;
    ctx.exec("INSERT INTO r VALUES (3, 4)").await;
    run.worker.start();
    ctx.converges(&run, &pipeline, Duration::from_secs(60))
        .await;
    let now = ctx.checkpoint().await.expect("checkpoint").position.file;
    assert_ne!(
        now, first_file,
        "the confirmed position moved to a later binlog file"
    );
}
