//! A table split into shards over several databases (`<db>_s0`.`orders_0` …
//! `<db>_s1`.`orders_3`: 8 shards over 2 databases) into one index, in a cluster, each
//! order with its items from a sharded relation (`order_items_0`, `order_items_1` in each
//! database): the pipeline names them by patterns, put-time checks refuse ids that could collide, a
//! build cuts every shard into chunks of its own, live changes in every shard reach their
//! documents, a row moved between shards stays one document whichever of its two changes
//! comes last, and a shard created at run time is captured and built without a restart.
//! The oracle lists the shards with MySQL's own REGEXP and reads each one.

use std::collections::BTreeMap;
use std::time::Duration;

use mysql_async::prelude::*;
use serde_json::{json, Value};
use sluice_integration_tests::{eventually, on_sources, Cluster, Tamper, TestCtx};

const ROWS_PER_SHARD: u64 = 40;

/// Builds pipeline `name` in chunks of 15 rows, watching its progress as an operator
/// would until it is done; the most chunks its plan showed.
async fn build(cluster: &Cluster, name: &str) -> u64 {
    cluster
        .ctl(&["pipelines", "build", name, "--chunk-rows", "15"])
        .unwrap();
    let mut chunks = 0;
    let deadline = std::time::Instant::now() + Duration::from_secs(180);
    loop {
        let s = cluster.ctl(&["pipelines", "status", name]).unwrap();
        chunks = chunks.max(s["chunks"].as_u64().unwrap_or_default());
        if s["phase"] == "done" {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the build is not done within 180 s: {s}\n{}",
            cluster.logs()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    chunks
}

/// The shards of `table_pattern` in the databases `db_pattern` matches, found by MySQL's
/// REGEXP (not Sluice's).
async fn shards_of(
    conn: &mut mysql_async::Conn,
    db_pattern: &str,
    table_pattern: &str,
) -> Vec<(String, String)> {
    conn.exec(
        "SELECT TABLE_SCHEMA, TABLE_NAME FROM information_schema.TABLES
         WHERE TABLE_SCHEMA REGEXP ? AND TABLE_NAME REGEXP ?",
        (format!("^{db_pattern}$"), format!("^{table_pattern}$")),
    )
    .await
    .unwrap()
}

/// Every order of every shard with its items (in SKU order) from every item shard, by
/// order number.
async fn oracle(ctx: &TestCtx, db_pattern: &str) -> BTreeMap<i64, Value> {
    let mut conn = ctx.stack.conn().await;
    let mut items: BTreeMap<i64, BTreeMap<String, Value>> = BTreeMap::new();
    for (db, table) in shards_of(&mut conn, db_pattern, "order_items_[0-9]+").await {
        let rows: Vec<(i64, String, i64)> = conn
            .query(format!("SELECT order_no, sku, qty FROM `{db}`.`{table}`"))
            .await
            .unwrap();
        for (order_no, sku, qty) in rows {
            let item = json!({"sku": sku, "qty": qty});
            items.entry(order_no).or_default().insert(sku, item);
        }
    }
    let mut out = BTreeMap::new();
    for (db, table) in shards_of(&mut conn, db_pattern, "orders_[0-9]+").await {
        let rows: Vec<(i64, i64, String, String)> = conn
            .query(format!(
                "SELECT id, order_no, customer, CAST(total AS CHAR) FROM `{db}`.`{table}`"
            ))
            .await
            .unwrap();
        for (id, order_no, customer, total) in rows {
            let of_order = items.get(&order_no).map(|i| i.values().cloned().collect());
            let doc = json!({
                "id": id, "order_no": order_no, "customer": customer, "total": total,
                "items": Value::Array(of_order.unwrap_or_default()),
            });
            assert!(
                out.insert(order_no, doc).is_none(),
                "order {order_no} is in two shards at once"
            );
        }
    }
    out
}

/// Every document behind `alias`, by order number (its `_id`).
async fn indexed(ctx: &TestCtx, alias: &str) -> Result<BTreeMap<i64, Value>, String> {
    let es = &ctx.stack.es;
    es.refresh(alias).await.map_err(|e| e.to_string())?;
    let hits = es
        .search_hits(
            alias,
            &json!({"size": 10000, "version": true, "query": {"match_all": {}}}),
        )
        .await
        .map_err(|e| e.to_string())?;
    let mut out = BTreeMap::new();
    for h in hits {
        let id: i64 =
            h.id.parse()
                .map_err(|_| format!("_id {} is not an order number", h.id))?;
        out.insert(id, h.source);
    }
    Ok(out)
}

/// Waits until the index holds exactly the shards' rows; how many.
async fn converges(
    ctx: &TestCtx,
    cluster: &Cluster,
    alias: &str,
    db_pattern: &str,
    what: &str,
) -> usize {
    eventually(what, Duration::from_secs(90), || async {
        let want = oracle(ctx, db_pattern).await;
        let got = indexed(ctx, alias).await?;
        if got == want {
            return Ok(want.len());
        }
        let missing: Vec<_> = want
            .keys()
            .filter(|k| !got.contains_key(k))
            .take(5)
            .collect();
        let extra: Vec<_> = got
            .keys()
            .filter(|k| !want.contains_key(k))
            .take(5)
            .collect();
        let differ: Vec<_> = (want.iter())
            .filter(|(k, v)| got.get(k).is_some_and(|g| g != *v))
            .take(3)
            .map(|(k, v)| format!("{k}: want {v}, got {}", got[k]))
            .collect();
        Err(format!(
            "{} rows, {} documents; missing {missing:?}, extra {extra:?}, differ {differ:?}\n{}",
            want.len(),
            got.len(),
            cluster.logs()
        ))
    })
    .await
}

/// Items in `db`.`table` for orders `orders` (none for every fifth, two for every third).
async fn items(ctx: &TestCtx, db: &str, table: &str, orders: impl Iterator<Item = u64>) {
    ctx.exec_in(
        db,
        &format!(
            "CREATE TABLE IF NOT EXISTS {table} (id INT AUTO_INCREMENT PRIMARY KEY,
             order_no BIGINT NOT NULL, sku VARCHAR(20) NOT NULL, qty INT NOT NULL, KEY (order_no))"
        ),
    )
    .await;
    let mut values = Vec::new();
    for n in orders.filter(|n| n % 5 != 0) {
        for k in 0..1 + u64::from(n % 3 == 0) {
            values.push(format!("({n}, 'sku-{n}-{k}', {})", 1 + (n + k) % 4));
        }
    }
    ctx.exec_in(
        db,
        &format!(
            "INSERT INTO {table} (order_no, sku, qty) VALUES {}",
            values.join(", ")
        ),
    )
    .await;
}

async fn shard(ctx: &TestCtx, db: &str, table: &str, first_order: u64) {
    ctx.exec_in(
        db,
        &format!(
            "CREATE TABLE {table} (id INT AUTO_INCREMENT PRIMARY KEY, order_no BIGINT NOT NULL UNIQUE,
             customer VARCHAR(40) NOT NULL, total DECIMAL(10,2) NOT NULL)"
        ),
    )
    .await;
    let values: Vec<String> = (0..ROWS_PER_SHARD)
        .map(|i| {
            let n = first_order + i;
            format!("({n}, 'customer {}', {}.{:02})", n % 17, n % 500, n % 100)
        })
        .collect();
    ctx.exec_in(
        db,
        &format!(
            "INSERT INTO {table} (order_no, customer, total) VALUES {}",
            values.join(", ")
        ),
    )
    .await;
}

on_sources!(shards_over_two_databases_make_one_index: mariadb, mysql);
async fn shards_over_two_databases_make_one_index() {
    let ctx = TestCtx::new("shard").await;
    let dbs = [ctx.database("s0").await, ctx.database("s1").await];
    for (d, db) in dbs.iter().enumerate() {
        for t in 0..4 {
            let first = (d * 4 + t) as u64 * 1000;
            shard(&ctx, db, &format!("orders_{t}"), first).await;
            let item_table = format!("order_items_{}", t % 2);
            items(&ctx, db, &item_table, first..first + ROWS_PER_SHARD).await;
        }
    }
    ctx.exec("CREATE TABLE notes (id INT PRIMARY KEY)").await;
    let mut cluster = ctx.start_cluster(1, 1).await;
    let source = ctx.put_source(&cluster, "notes", 1);
    let topics = sluice_kafka::TopicConfig::default();
    for db in &dbs {
        for t in 0..5 {
            ctx.clean_up_topic(topics.rows_topic(&source.name, db, &format!("orders_{t}")));
        }
        for t in 0..3 {
            let table = format!("order_items_{t}");
            ctx.clean_up_topic(topics.rows_topic(&source.name, db, &table));
        }
    }
    let db_pattern = format!(r"{}_s\d", ctx.db);
    let alias = ctx.pipeline("orders").alias;
    let mut spec = json!({
        "name": alias, "alias": alias, "source": source.name, "replicas": 0,
        "database": db_pattern, "table": r"orders_\d+", "sharded": true,
        "relations": [{
            "name": "items", "kind": "one_to_many", "table": r"order_items_\d+", "sharded": true,
            "on": {"order_no": "order_no"}, "columns": ["sku", "qty"], "order_by": ["sku"]
        }]
    });

    // Ids that could collide are refused at put time, each naming its key.
    let e = ctx.put_spec(&cluster, &spec).unwrap_err();
    assert!(e.contains("id: required for a sharded root"), "{e}");
    spec["id"] = json!(["id"]);
    let e = ctx.put_spec(&cluster, &spec).unwrap_err();
    assert!(
        e.contains("id: `id` is AUTO_INCREMENT, so each shard counts its own rows"),
        "{e}"
    );
    spec["table"] = json!(r"orders_(\d+");
    let e = ctx.put_spec(&cluster, &spec).unwrap_err();
    assert!(
        e.contains(r"table: `orders_(\d+` is not a regular expression"),
        "{e}"
    );
    spec["table"] = json!(r"orders_\d+");
    spec["id"] = json!(["order_no"]);
    ctx.put_spec(&cluster, &spec).unwrap();
    cluster
        .wait_running(&[&source], Duration::from_secs(60))
        .await;

    let converged = |what: &'static str| converges(&ctx, &cluster, &alias, &db_pattern, what);

    // A build cuts each shard into chunks of its own primary key.
    let name = alias.as_str();
    let chunks = build(&cluster, name).await;
    assert_eq!(
        chunks,
        8 * 3,
        "every shard is cut in chunks of 15 of its 40 rows"
    );
    let n = converged("the build holds every shard").await;
    assert_eq!(n as u64, 8 * ROWS_PER_SHARD);

    // A check compares every shard's documents (chunk by chunk of each shard's key) and
    // repairs what was changed behind Sluice's back.
    let tampered = [
        ("1003".to_owned(), Tamper::Delete),
        (
            "6010".to_owned(),
            Tamper::Set("customer", json!("tampered")),
        ),
    ];
    ctx.tamper(&format!("{alias}_v2"), &tampered).await;
    let c = cluster.check(&alias, &["--repair"]).await;
    let n = |k: &str| c[k].as_u64().unwrap_or(u64::MAX);
    assert_eq!(
        (n("documents"), n("missing"), n("extra"), n("different")),
        (8 * ROWS_PER_SHARD, 1, 0, 1),
        "{c}"
    );
    converged("the repair").await;

    // Live changes in several shards.
    let [s0, s1] = &dbs;
    ctx.exec_in(s0, "UPDATE orders_0 SET total = total + 1 WHERE id <= 10")
        .await;
    ctx.exec_in(s1, "DELETE FROM orders_3 WHERE id % 4 = 0")
        .await;
    ctx.exec_in(
        s1,
        "INSERT INTO orders_2 (order_no, customer, total) VALUES (90001, 'new', 1.50)",
    )
    .await;
    // Items: changed, deleted, added to an order in another database, moved between
    // item shards.
    ctx.exec_in(
        s0,
        "UPDATE order_items_1 SET qty = qty + 10 WHERE order_no < 1010",
    )
    .await;
    ctx.exec_in(s1, "DELETE FROM order_items_0 WHERE order_no % 7 = 0")
        .await;
    ctx.exec_in(s1, "INSERT INTO order_items_1 (order_no, sku, qty) VALUES (3, 'sku-extra', 9), (90001, 'sku-new', 1)")
        .await;
    ctx.exec(&format!(
        "START TRANSACTION;
         INSERT INTO `{s1}`.order_items_0 (order_no, sku, qty) SELECT order_no, sku, qty FROM `{s0}`.order_items_0 WHERE order_no = 2002;
         DELETE FROM `{s0}`.order_items_0 WHERE order_no = 2002; COMMIT"
    ))
    .await;
    // Moves between shards: in one transaction; inserted first, then deleted; deleted
    // first, then inserted (each in two transactions, the document's last change being
    // the delete in the second case).
    let moved = |order: u64| {
        format!("INSERT INTO `{s1}`.orders_1 (order_no, customer, total)
                 SELECT order_no, CONCAT(customer, ' moved'), total FROM `{s0}`.orders_{} WHERE order_no = {order}", (order / 1000) % 4)
    };
    let gone = |order: u64| {
        format!(
            "DELETE FROM `{s0}`.orders_{} WHERE order_no = {order}",
            (order / 1000) % 4
        )
    };
    ctx.exec(&format!(
        "START TRANSACTION; {}; {}; COMMIT",
        moved(5),
        gone(5)
    ))
    .await;
    ctx.exec(&moved(1007)).await;
    ctx.exec(&gone(1007)).await;
    let mut conn = ctx.stack.conn().await;
    let row: Option<(String,)> = conn
        .query_first(format!(
            "SELECT CONCAT(customer, ' moved') FROM `{s0}`.orders_2 WHERE order_no = 2011"
        ))
        .await
        .unwrap();
    let (customer,) = row.expect("order 2011 exists");
    ctx.exec(&gone(2011)).await;
    ctx.exec(&format!(
        "INSERT INTO `{s1}`.orders_1 (order_no, customer, total) VALUES (2011, '{customer}', 3.00)"
    ))
    .await;
    converged("live changes and moves").await;
    let docs = indexed(&ctx, &alias).await.unwrap();
    for order in [5, 1007, 2011] {
        assert!(
            docs[&order]["customer"]
                .as_str()
                .unwrap()
                .ends_with(" moved"),
            "order {order} is its moved row: {}",
            docs[&order]
        );
    }

    // A column added to one shard only (a rolling ALTER under way): the documents keep
    // the columns every shard has, and that shard's changes still apply.
    ctx.exec_in(s0, "ALTER TABLE orders_1 ADD COLUMN note VARCHAR(20) NULL")
        .await;
    ctx.exec_in(
        s0,
        "UPDATE orders_1 SET customer = 'altered', note = 'n' WHERE id <= 3",
    )
    .await;
    converged("a shard with a column more").await;

    // A shard created at run time: captured (its topic found) and its rows indexed, then
    // part of the next build.
    shard(&ctx, s1, "orders_4", 50_000).await;
    items(&ctx, s1, "order_items_2", 50_000..50_000 + ROWS_PER_SHARD).await;
    let n = converged("the new shard streams").await;
    assert!(docs.len() < n, "the new shard's rows are documents");
    ctx.exec_in(s1, "UPDATE orders_4 SET customer = 'later' WHERE id = 1")
        .await;
    let chunks = build(&cluster, name).await;
    assert_eq!(chunks, 9 * 3, "the new shard is cut too");
    converged("the second build holds every shard").await;

    // A shard emptied and dropped while the etl is down: its deletes apply, though the
    // plan the etl compiles after the drop no longer lists the shard.
    cluster.etl.kill9();
    ctx.exec_in(s1, "DELETE FROM orders_4").await;
    ctx.exec_in(s1, "DROP TABLE orders_4").await;
    cluster.etl.start();
    converges(
        &ctx,
        &cluster,
        &alias,
        &db_pattern,
        "a dropped shard's rows gone",
    )
    .await;
    drop(cluster);
    ctx.cleanup().await;
}
