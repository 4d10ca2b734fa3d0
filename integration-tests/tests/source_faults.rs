//! Faults of the source server itself, on a MariaDB of the test's own (they would disturb
//! every other test on the shared one): a crash and restart while the worker streams. (A
//! purged resume position is in `source_lifecycle`, with its recovery.)

use std::time::Duration;

use sluice_integration_tests::on_sources;
use sluice_integration_tests::private_source::PrivateSource;
use sluice_integration_tests::TestCtx;

const WITHIN: Duration = Duration::from_secs(120);

on_sources!(the_source_crashed_and_restarted_mid_stream_loses_nothing: mariadb, mysql);
async fn the_source_crashed_and_restarted_mid_stream_loses_nothing() {
    let mut server = PrivateSource::start(7101).await;
    let mut ctx = TestCtx::on("srcrestart", server.stack().await).await;
    ctx.exec("CREATE TABLE acct (id INT PRIMARY KEY, balance BIGINT, note VARCHAR(40))")
        .await;
    let pipeline = ctx.pipeline("acct");
    let run = ctx.start(std::slice::from_ref(&pipeline)).await;
    ctx.exec(&format!(
        "INSERT INTO acct SELECT seq, seq, 'first' FROM {}",
        sluice_integration_tests::seq(1, 3000)
    ))
    .await;
    ctx.exec("UPDATE acct SET balance = balance * 2 WHERE id % 2 = 0")
        .await;

    // Crashed while the worker reads; the binlog continues in a new file after recovery.
    server.kill9();
    server.restart().await;
    ctx.stack = server.stack().await;
    ctx.exec("UPDATE acct SET note = 'after' WHERE id % 3 = 0")
        .await;
    ctx.exec("DELETE FROM acct WHERE id % 5 = 0").await;
    ctx.exec("INSERT INTO acct VALUES (5000, 1, 'new')").await;

    ctx.wait_streamed(&run.worker).await;
    ctx.converges(&run, &pipeline, WITHIN).await;
}
