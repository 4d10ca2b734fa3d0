//! A lone change goes out at once: after a load that made the etl gather its batches for
//! `linger`, a pause of a whole `linger` ends the load, and the change that ends the
//! pause waits for no batch to fill.

use std::time::Duration;

use sluice_integration_tests::{time_until, TestCtx};

const LINGER: Duration = Duration::from_secs(3);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lone_change_after_a_load_waits_for_no_linger() {
    let ctx = TestCtx::new("lone").await;
    ctx.exec("CREATE TABLE items (id INT PRIMARY KEY, name VARCHAR(64))")
        .await;
    let pipeline = ctx.pipeline("items");
    let etl = ctx
        .etl(std::slice::from_ref(&pipeline))
        .with_env("SLUICE_ETL__LINGER", &format!("{}s", LINGER.as_secs()));
    let run = ctx.run(ctx.worker(), etl).await;

    // A load: the etl starts out gathering, so these land in one lingered batch of more
    // than ten, which tells it the load goes on.
    for id in 1..=40 {
        ctx.exec(&format!("INSERT INTO items VALUES ({id}, 'load {id}')"))
            .await;
    }
    ctx.converges(&run, &pipeline, Duration::from_secs(60))
        .await;
    assert!(
        run.etl.metric("sluice_etl_bulk_documents_count", &[]).await < 10.0,
        "the load was gathered into batches"
    );

    // The pause is the scenario (the etl idles a whole linger), not a synchronisation.
    tokio::time::sleep(LINGER + Duration::from_millis(500)).await;
    ctx.exec("INSERT INTO items VALUES (100, 'alone')").await;
    let es = &ctx.stack.es;
    let took = time_until(
        "the lone change indexed",
        Duration::from_secs(30),
        || async {
            match es.mget(&pipeline.alias, &["100".to_owned()]).await {
                Ok(docs) if docs.first().is_some_and(Option::is_some) => Ok(()),
                other => Err(format!("{other:?}\n{}", run.logs())),
            }
        },
    )
    .await;
    assert!(
        took < LINGER / 2,
        "a lone change after a pause waited {took:?}, as if for the linger ({LINGER:?})"
    );
}
