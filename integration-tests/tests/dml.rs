//! Inserts, updates, deletes and multi-row statements reach Elasticsearch exactly.

use std::time::Duration;

use sluice_integration_tests::{check_table, on_sources, CheckOptions, TestCtx};

on_sources!(inserts_updates_deletes_and_multi_row_statements_converge: mariadb, mysql);
async fn inserts_updates_deletes_and_multi_row_statements_converge() {
    let ctx = TestCtx::new("dml").await;
    ctx.exec("CREATE TABLE items (id INT PRIMARY KEY, name VARCHAR(64), qty INT, note TEXT)")
        .await;
    let pipeline = ctx.pipeline("items");
    let run = ctx.start(std::slice::from_ref(&pipeline)).await;

    ctx.exec("INSERT INTO items VALUES (1, 'one', 1, 'first')")
        .await;
    ctx.exec("INSERT INTO items VALUES (2, 'two', 2, NULL), (3, 'three', 3, 'x'), (4, 'four', 4, 'y'), (5, 'five', 5, 'z')").await;
    ctx.exec("UPDATE items SET qty = qty * 10, note = CONCAT('upd-', id) WHERE id IN (2, 3, 4)")
        .await;
    ctx.exec("UPDATE items SET name = 'uno' WHERE id = 1").await;
    ctx.exec("DELETE FROM items WHERE id IN (3, 5)").await;
    ctx.exec("INSERT INTO items VALUES (5, 'five again', 50, 'back')")
        .await;
    // Several statements on the same rows in one transaction: only the last state may remain.
    ctx.exec("START TRANSACTION; INSERT INTO items VALUES (6, 'six', 6, 'a'); UPDATE items SET qty = 66 WHERE id = 6; \
              UPDATE items SET qty = 666 WHERE id = 6; DELETE FROM items WHERE id = 4; COMMIT").await;
    ctx.exec("INSERT INTO items SELECT id + 100, CONCAT('bulk-', id), id, NULL FROM items")
        .await;

    ctx.converges(&run, &pipeline, Duration::from_secs(60))
        .await;

    // The checker must notice a difference: a write that bypasses the pipeline shows up.
    let stray = sluice_elastic::BulkOp::Delete {
        index: ctx.stack.es.alias_targets(&pipeline.alias).await.unwrap()[0].clone(),
        id: "1".into(),
        version: u64::MAX >> 2,
        routing: None,
    };
    ctx.stack.es.bulk(&[stray]).await.unwrap();
    assert!(
        check_table(&ctx, "items", &pipeline.alias, &CheckOptions::default())
            .await
            .is_err(),
        "the checker must see a missing document"
    );
}
