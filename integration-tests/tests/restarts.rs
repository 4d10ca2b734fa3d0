//! `kill -9` of the worker and of the etl mid-stream, restart, and convergence with
//! nothing lost ().

use std::time::Duration;

use mysql_async::prelude::*;
use sluice_integration_tests::on_sources;
use sluice_integration_tests::{eventually, TestCtx};

on_sources!(kill_9_of_worker_and_etl_mid_stream_loses_nothing: mariadb, mysql);
async fn kill_9_of_worker_and_etl_mid_stream_loses_nothing() {
    let ctx = TestCtx::new("kill").await;
    ctx.exec("CREATE TABLE acct (id INT PRIMARY KEY, balance BIGINT, note VARCHAR(40))")
        .await;
    let pipeline = ctx.pipeline("acct");
    let mut run = ctx.start(std::slice::from_ref(&pipeline)).await;

    // A steady write load: inserts, updates and deletes in small transactions.
    let db = ctx.db.clone();
    let pool = ctx.stack.mysql.clone();
    let load = tokio::spawn(async move {
        let mut conn = pool.get_conn().await.unwrap();
        conn.query_drop(format!("USE `{db}`")).await.unwrap();
        for i in 0..3000i64 {
            let id = i % 700;
            let sql = match i % 5 {
                0 | 1 => format!("INSERT INTO acct VALUES ({id}, {i}, 'n{i}') ON DUPLICATE KEY UPDATE balance = {i}, note = 'dup{i}'"),
                2 | 3 => format!("UPDATE acct SET balance = balance + {i}, note = 'u{i}' WHERE id = {}", (id * 7) % 700),
                _ => format!("DELETE FROM acct WHERE id = {}", (id * 13) % 700),
            };
            conn.query_drop(sql).await.unwrap();
        }
    });

    let count = |ctx: &TestCtx| {
        let es = ctx.stack.es.clone();
        let alias = pipeline.alias.clone();
        async move {
            let _ = es.refresh(&alias).await;
            es.count(&alias).await.unwrap_or(0)
        }
    };
    eventually("documents flowing", Duration::from_secs(60), || async {
        let n = count(&ctx).await;
        if n > 20 {
            Ok(())
        } else {
            Err(format!("{n} documents"))
        }
    })
    .await;
    run.worker.kill9();
    run.worker.start();
    eventually(
        "more documents after the worker restart",
        Duration::from_secs(60),
        || async {
            let n = count(&ctx).await;
            if n > 100 {
                Ok(())
            } else {
                Err(format!("{n} documents"))
            }
        },
    )
    .await;
    run.etl.kill9();
    run.etl.start();
    run.worker.kill9();
    run.worker.start();
    load.await.unwrap();

    ctx.converges(&run, &pipeline, Duration::from_secs(120))
        .await;
}
