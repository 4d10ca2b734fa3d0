//! Input from Debezium (README, "Input from Debezium"): an etl reads the topics Debezium's
//! own connector (3.6 for MySQL, 3.5 for MariaDB, in its embedded engine from Maven
//! Central) writes from the stack's server into the real Kafka — its snapshot records, then
//! inserts, updates (two of one row in one transaction), deletes with their tombstones —
//! and the index equals the table, row for row. Then a rewind: Debezium starts again
//! (a new snapshot), and another etl group replays every message from the start; versions
//! from Debezium's binlog coordinates keep the index equal (no deleted row comes back, no
//! older value wins). MariaDB's lane reads Debezium's JSON without schemas, MySQL's with.

use std::time::Duration;

use serde_json::json;
use sluice_integration_tests::debezium::Debezium;
use sluice_integration_tests::lane::Lane;
use sluice_integration_tests::{
    check_table, eventually, on_sources, CheckOptions, Service, TestCtx,
};

on_sources!(debezium_topics_build_the_same_documents: mariadb, mysql);
async fn debezium_topics_build_the_same_documents() {
    let ctx = TestCtx::new("dbz").await;
    // Without schemas, values stay as Debezium writes them: types whose JSON form is
    // Sluice's own (decimals as strings with decimal.handling.mode=string).
    let schemas = matches!(Lane::current().flavor(), Lane::MySql);
    let typed = if schemas {
        ", day DATE, at DATETIME, stamp TIMESTAMP NULL, tags SET('a','b','c')"
    } else {
        ""
    };
    ctx.exec(&format!(
        "CREATE TABLE items (id INT PRIMARY KEY, name VARCHAR(40), price DECIMAL(10,2), qty BIGINT{typed})"
    ))
    .await;
    let row = |id: u32| {
        let extra = if schemas {
            format!(
                ", '2024-01-{:02}', '2024-02-03 04:05:{:02}', '2024-03-04 05:06:07', 'a,c'",
                id % 28 + 1,
                id % 60
            )
        } else {
            String::new()
        };
        format!("({id}, 'item {id}', {id}.25, {}{extra})", id * 10)
    };
    let rows: Vec<String> = (1..=40).map(row).collect();
    ctx.exec(&format!("INSERT INTO items VALUES {}", rows.join(", ")))
        .await;

    let prefix = format!("dbz_{}", ctx.suffix);
    let topic = format!("{prefix}.{}.items", ctx.db);
    ctx.clean_up_topic(topic.clone());
    ctx.clean_up_topic(prefix.clone());
    sluice_kafka::ensure_topics(&ctx.kafka_config(), std::slice::from_ref(&topic))
        .await
        .unwrap();
    let mut spec = ctx.spec(json!({"table": "items"}));
    spec["input"] = json!({"format": "debezium", "topic_prefix": prefix});
    let alias = spec["alias"].as_str().unwrap().to_owned();
    let mut etl = ctx.etl_with(std::slice::from_ref(&spec));
    etl.start();

    let mut debezium = Debezium::start(&ctx, &prefix, &["items"], schemas, 1);
    equal(
        &ctx,
        &alias,
        &etl,
        &debezium,
        "the snapshot's records indexed",
    )
    .await;

    // Changes, streamed from the binlog.
    ctx.exec("UPDATE items SET name = 'renamed', price = 99.99 WHERE id <= 10")
        .await;
    ctx.exec("DELETE FROM items WHERE id BETWEEN 11 AND 15")
        .await;
    ctx.exec(&format!(
        "INSERT INTO items VALUES {}, {}",
        row(41),
        row(42)
    ))
    .await;
    // Two updates of one row in one transaction: the later one wins.
    ctx.exec("BEGIN; UPDATE items SET qty = 1 WHERE id = 20; UPDATE items SET qty = 2 WHERE id = 20; COMMIT")
        .await;
    // A key change: the old document goes, the new one comes.
    ctx.exec("UPDATE items SET id = 100 WHERE id = 30").await;
    ctx.exec("DELETE FROM items WHERE id = 41").await;
    equal(
        &ctx,
        &alias,
        &etl,
        &debezium,
        "the streamed changes applied",
    )
    .await;

    // A rewind: Debezium starts over (a new snapshot at a newer position), and a second
    // etl group replays every message of the topic, the deletes' and old values' too.
    // (A row deleted while Debezium is down, its offsets lost, is a change no snapshot
    // tells: that needs a rebuild, as for any source that lost its position.)
    debezium.stop();
    let mut debezium = Debezium::start(&ctx, &prefix, &["items"], schemas, 2);
    etl.terminate(Duration::from_secs(30));
    let group = format!("{}-replay", ctx.group);
    let mut replay = ctx
        .etl_with(std::slice::from_ref(&spec))
        .with_env("SLUICE_ETL__GROUP_ID", &group)
        .with_env("SLUICE_ETL__INSTANCE_ID", &format!("{group}-1"));
    replay.start();
    ctx.exec("UPDATE items SET name = 'after the rewind' WHERE id = 2")
        .await;
    equal(&ctx, &alias, &replay, &debezium, "equal after the rewind").await;
    // Every message was read again, none of it moved a document back.
    let doc = ctx
        .stack
        .es
        .mget(&alias, &["11".into(), "41".into(), "2".into()])
        .await
        .unwrap();
    assert!(
        doc[0].is_none() && doc[1].is_none(),
        "a deleted row came back: {doc:?}"
    );
    assert_eq!(doc[2].as_ref().unwrap()["name"], "after the rewind");
    debezium.stop();
    replay.terminate(Duration::from_secs(30));
    ctx.cleanup().await;
}

/// The etl's and Debezium's last lines.
fn logs(etl: &Service, dbz: &Debezium) -> String {
    format!(
        "--- etl ---\n{}\n--- debezium ---\n{}",
        etl.log_tail(),
        dbz.log_tail()
    )
}

/// Waits until the index behind `alias` equals the table, row for row.
async fn equal(ctx: &TestCtx, alias: &str, etl: &Service, dbz: &Debezium, what: &str) {
    eventually(what, Duration::from_secs(120), || async {
        check_table(ctx, "items", alias, &CheckOptions::default())
            .await
            .map_err(|e| format!("{e}\n{}", logs(etl, dbz)))
    })
    .await;
}

on_sources!(debezium_topics_build_documents_from_several_tables: mariadb, mysql);
/// The shop's tree (products → brand, SKUs → prices, tags, promotions) fed by Debezium's
/// topics of its six tables: documents read back from MySQL as any tree's, versioned by
/// Debezium's coordinates, equal to what MySQL yields through changes at every level.
async fn debezium_topics_build_documents_from_several_tables() {
    let ctx = TestCtx::new("dbztree").await;
    sluice_integration_tests::shop::schema(&ctx).await;
    sluice_integration_tests::shop::data(&ctx, 30, 10).await;
    let tables = [
        "products",
        "brands",
        "skus",
        "sku_prices",
        "product_tags",
        "promotions",
    ];
    let prefix = format!("dbz_{}", ctx.suffix);
    let topics: Vec<String> = tables
        .iter()
        .map(|t| format!("{prefix}.{}.{t}", ctx.db))
        .collect();
    for t in topics.iter().chain([&prefix]) {
        ctx.clean_up_topic(t.clone());
    }
    sluice_kafka::ensure_topics(&ctx.kafka_config(), &topics)
        .await
        .unwrap();
    let mut spec = sluice_integration_tests::shop::spec(&ctx);
    spec["input"] = json!({"format": "debezium", "topic_prefix": prefix});
    let mut etl = ctx.etl_with(std::slice::from_ref(&spec));
    etl.start();
    let schemas = matches!(Lane::current().flavor(), Lane::MySql);
    let mut debezium = Debezium::start(&ctx, &prefix, &tables, schemas, 1);
    let documents = |what: &'static str| {
        let (ctx, spec, etl, dbz) = (&ctx, &spec, &etl, &debezium);
        async move {
            eventually(what, Duration::from_secs(120), || async {
                sluice_integration_tests::check_documents(ctx, spec)
                    .await
                    .map_err(|e| format!("{e}\n{}", logs(etl, dbz)))
            })
            .await
        }
    };
    documents("the snapshot's documents").await;
    for sql in [
        "UPDATE brands SET name = 'renamed' WHERE id = 1",
        "UPDATE skus SET product_id = 2 WHERE id = 30",
        "DELETE FROM sku_prices WHERE sku_id = 40",
        "UPDATE products SET deleted = 1 WHERE id = 5",
        "INSERT INTO product_tags (product_id, tag, created_at) VALUES (7, 'newest', '2030-01-01 00:00:00')",
        "INSERT INTO promotions (product_id, brand_id, pct) VALUES (12, 2, 15)",
        "UPDATE products SET title = 'retitled', brand_id = 3 WHERE id = 9",
    ] {
        ctx.exec(sql).await;
    }
    let n = documents("changes at every level of the tree").await;
    assert_eq!(n, 29, "30 products, one filtered out");
    debezium.stop();
    etl.terminate(Duration::from_secs(30));
    ctx.cleanup().await;
}
