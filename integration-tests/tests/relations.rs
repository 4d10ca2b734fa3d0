//! Documents built from several tables, kept exact when any of them changes: the sample
//! shop (`sluice_integration_tests::shop`) of `products` (root, filter `deleted = 0`) →
//! one-to-one `brands` → one-to-many `skus` (nested) → one-to-many `sku_prices`, and
//! `product_tags` (an object array, the 5 newest by `created_at`). Every case ends with
//! the independent checker on every document of the index.

use std::time::{Duration, Instant};

use mysql_async::prelude::*;
use serde_json::{json, Value};
use sluice_integration_tests::on_sources;
use sluice_integration_tests::private_source::PrivateSource;
use sluice_integration_tests::proxy::{HttpFault, HttpProxy};
use sluice_integration_tests::{blog, check_documents, eventually, shop, Running, TestCtx};

const PRODUCTS: u64 = 2200;
/// Products 1..=2000 are brand 1's; the rest brand 2's.
const BRAND_ONE: u64 = 2000;

/// Waits until every document of the pipeline equals what MySQL yields.
async fn converged(ctx: &TestCtx, run: &Running, spec: &Value, what: &str) {
    eventually(what, Duration::from_secs(120), || async {
        check_documents(ctx, spec)
            .await
            .map_err(|e| format!("{e}\n{}", run.logs()))
    })
    .await;
}

/// What a document written in parts keeps of its versions, as stored.
async fn stored_versions(ctx: &TestCtx, alias: &str, id: u64) -> Value {
    let query = json!({"query": {"ids": {"values": [id.to_string()]}}});
    ctx.stack.es.refresh(alias).await.unwrap();
    let found = ctx.stack.es.search(alias, &query).await.unwrap();
    found["hits"]["hits"][0]["_source"][sluice_elastic::parts::FIELD].clone()
}

async fn document(ctx: &TestCtx, alias: &str, id: u64) -> Option<Value> {
    ctx.stack
        .es
        .mget(alias, &[id.to_string()])
        .await
        .unwrap()
        .remove(0)
}

on_sources!(a_shop_tree_stays_exact_through_every_kind_of_change: mariadb, mysql);
async fn a_shop_tree_stays_exact_through_every_kind_of_change() {
    let ctx = TestCtx::new("relations").await;
    shop::schema(&ctx).await;
    let spec = shop::spec(&ctx);
    let alias = spec["alias"].as_str().unwrap().to_owned();
    let run = ctx.start_with(std::slice::from_ref(&spec)).await;
    shop::data(&ctx, PRODUCTS, BRAND_ONE).await;
    converged(&ctx, &run, &spec, "the shop, streamed").await;

    // A grandchild inserted before its parent: the price row joins nothing until its SKU
    // arrives, then the SKU's insert brings both.
    ctx.exec("INSERT INTO sku_prices VALUES (NULL, 900001, 'EUR', 5.00)")
        .await;
    ctx.exec("INSERT INTO skus VALUES (900001, 7, 'late-sku', 3)")
        .await;
    converged(&ctx, &run, &spec, "a grandchild inserted before its parent").await;
    let seven = document(&ctx, &alias, 7).await.expect("product 7");
    let late = seven["skus"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["code"] == "late-sku")
        .cloned();
    assert_eq!(
        late.map(|s| s["prices"].clone()),
        Some(json!([{"currency": "EUR", "amount": "5.00"}])),
        "{seven}"
    );

    // A child moved to another parent: both documents change.
    ctx.exec("UPDATE skus SET product_id = 8 WHERE id = 70")
        .await;
    converged(&ctx, &run, &spec, "a SKU moved from product 7 to 8").await;
    let codes = |doc: &Value| -> Vec<String> {
        doc["skus"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| s["code"].as_str().unwrap().to_owned())
            .collect()
    };
    assert!(!codes(&document(&ctx, &alias, 7).await.unwrap()).contains(&"sku-7-0".to_owned()));
    assert!(codes(&document(&ctx, &alias, 8).await.unwrap()).contains(&"sku-7-0".to_owned()));

    // A grandchild changed.
    ctx.exec("UPDATE sku_prices SET amount = 123.45 WHERE sku_id = 90 AND currency = 'USD'")
        .await;
    converged(&ctx, &run, &spec, "a price of a SKU of product 9 changed").await;
    // Where the sink runs scripts, documents are written in parts: the SKUs alone were
    // read again and patched (their version kept beside the root's).
    let in_parts = ctx.stack.es.runs_painless().await.unwrap() == Some(true);
    if in_parts {
        let kept = stored_versions(&ctx, &alias, 9).await;
        assert!(
            kept["p"]["skus"].as_u64() > kept["v"].as_u64() && kept["p"].get("brand").is_none(),
            "product 9's SKUs patched alone: {kept}"
        );
    }

    // A brand renamed under 2000 products: every one of them, one change.
    let renamed = Instant::now();
    ctx.exec("UPDATE brands SET name = 'renamed' WHERE id = 1")
        .await;
    eventually("brand 1's new name in all its documents", Duration::from_secs(120), || async {
        ctx.stack.es.refresh(&alias).await.map_err(|e| e.to_string())?;
        let found = ctx
            .stack
            .es
            .search(&alias, &json!({"query": {"match": {"brand.name": "renamed"}}, "size": 0, "track_total_hits": true}))
            .await
            .map_err(|e| e.to_string())?;
        let n = found["hits"]["total"]["value"].as_u64().unwrap_or(0);
        if n == BRAND_ONE {
            Ok(())
        } else {
            Err(format!("{n} of {BRAND_ONE} documents show the new name"))
        }
    })
    .await;
    println!(
        "brand rename reached its {BRAND_ONE} documents in {:?}",
        renamed.elapsed()
    );
    converged(&ctx, &run, &spec, "a brand renamed").await;
    if in_parts {
        let kept = stored_versions(&ctx, &alias, 5).await;
        assert!(
            kept["p"]["brand"].as_u64() > kept["v"].as_u64(),
            "product 5's brand patched: {kept}"
        );
    }

    // A root deleted and inserted again with the same id.
    ctx.exec("DELETE FROM products WHERE id = 10").await;
    ctx.exec("INSERT INTO products VALUES (10, 'product 10 again', 3, 1.00, 0)")
        .await;
    converged(&ctx, &run, &spec, "product 10 deleted and inserted again").await;
    assert_eq!(
        document(&ctx, &alias, 10).await.unwrap()["brand"]["name"],
        "brand 3"
    );

    // A row leaving the root's filter, then coming back.
    ctx.exec("UPDATE products SET deleted = 1 WHERE id = 11")
        .await;
    converged(&ctx, &run, &spec, "product 11 filtered out").await;
    assert_eq!(
        document(&ctx, &alias, 11).await,
        None,
        "a filtered-out row has no document"
    );
    ctx.exec("UPDATE products SET deleted = 0, title = 'back' WHERE id = 11")
        .await;
    converged(&ctx, &run, &spec, "product 11 back").await;

    // Newer tags push older ones out of the 5 kept.
    ctx.exec(
        "INSERT INTO product_tags VALUES (NULL, 12, 'newest', '2030-01-01'), (NULL, 12, 'newer', '2029-01-01')",
    )
    .await;
    converged(&ctx, &run, &spec, "two new tags of product 12").await;
    let tags: Vec<Value> = document(&ctx, &alias, 12).await.unwrap()["tags"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["tag"].clone())
        .collect();
    assert_eq!(tags.len(), 5);
    assert_eq!(&tags[..2], &[json!("newest"), json!("newer")]);

    // The distinct tag names hold a repeated tag once; a price in XXX is filtered out;
    // a product moved to another brand loses the promotions of the old one (joined on
    // the product and its brand).
    ctx.exec("INSERT INTO product_tags VALUES (NULL, 12, 'tag-1', '2020-01-01')")
        .await;
    ctx.exec("INSERT INTO sku_prices VALUES (NULL, 130, 'XXX', 1.00)")
        .await;
    ctx.exec("UPDATE products SET brand_id = 3 WHERE id = 20")
        .await;
    converged(
        &ctx,
        &run,
        &spec,
        "a repeated tag, a filtered price, a brand change",
    )
    .await;
    let twelve = document(&ctx, &alias, 12).await.unwrap();
    let names = twelve["tag_names"].as_array().unwrap();
    assert_eq!(
        names.iter().filter(|t| t["tag"] == "tag-1").count(),
        1,
        "{twelve}"
    );
    let thirteen = document(&ctx, &alias, 13).await.unwrap();
    assert!(!thirteen.to_string().contains("XXX"), "{thirteen}");
    assert_eq!(
        document(&ctx, &alias, 20).await.unwrap()["promotions"],
        json!([{"pct": 99}]),
        "product 20 is brand 3's now: brand 3's promotion applies, brand 1's does not"
    );
    let mapping = ctx
        .stack
        .es
        .get_mapping(&format!("{alias}_v1"))
        .await
        .unwrap();
    let props = &mapping[format!("{alias}_v1")]["mappings"]["properties"];
    assert_eq!(props["skus"]["type"], "nested");
    assert_eq!(
        props["skus"]["properties"]["code"]["type"], "keyword",
        "{props}"
    );
    // A plain object: the server shows no type at all for one.
    assert!(
        props["tags"]["type"].is_null() && props["tags"]["properties"].is_object(),
        "{props}"
    );

    // The oracle is not blind: a nested value changed and a stray document, written
    // behind Sluice's back, are both reported.
    let mut wrong = document(&ctx, &alias, 13).await.unwrap();
    wrong["skus"][0]["prices"][0]["amount"] = json!("0.01");
    let index = format!("{alias}_v1");
    let bulk = vec![
        sluice_elastic::BulkOp::Index {
            index: index.clone(),
            id: "13".into(),
            version: i64::MAX as u64 - 1,
            routing: None,
            doc: wrong,
        },
        sluice_elastic::BulkOp::Index {
            index,
            id: "999999".into(),
            version: 1,
            routing: None,
            doc: json!({"id": 999999}),
        },
    ];
    ctx.stack.es.bulk(&bulk).await.unwrap();
    let report = check_documents(&ctx, &spec).await.unwrap_err();
    assert!(
        report.contains("document 13: `skus[0].prices[0].amount`")
            || report.contains("document 13: `skus"),
        "{report}"
    );
    assert!(report.contains("extra document 999999"), "{report}");

    drop(run);
    ctx.cleanup().await;
}

/// Every document of `alias` with its `_version`.
async fn versions(ctx: &TestCtx, alias: &str) -> std::collections::BTreeMap<String, (u64, Value)> {
    ctx.stack.es.refresh(alias).await.unwrap();
    let found = ctx
        .stack
        .es
        .search(
            alias,
            &json!({"query": {"match_all": {}}, "size": 10000, "version": true}),
        )
        .await
        .unwrap();
    found["hits"]["hits"]
        .as_array()
        .unwrap()
        .iter()
        .map(|h| {
            (
                h["_id"].as_str().unwrap().to_owned(),
                (h["_version"].as_u64().unwrap(), h["_source"].clone()),
            )
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_etl_killed_mid_batch_and_a_full_replay_change_nothing() {
    let ctx = TestCtx::new("relreplay").await;
    shop::schema(&ctx).await;
    let spec = shop::spec(&ctx);
    let alias = spec["alias"].as_str().unwrap().to_owned();
    let mut run = ctx.start_with(std::slice::from_ref(&spec)).await;
    shop::data(&ctx, PRODUCTS, BRAND_ONE).await;

    // Changes to all five tables while the etl is killed (kill -9, mid-batch: it is
    // busy with the initial load) and started again.
    for round in 0..6u64 {
        let p = 1 + round * 97;
        ctx.exec(&format!(
            "UPDATE brands SET name = 'brand {round}' WHERE id = 2"
        ))
        .await;
        ctx.exec(&format!(
            "UPDATE products SET title = 'retitled {round}' WHERE id IN ({p}, {})",
            p + 1
        ))
        .await;
        ctx.exec(&format!(
            "UPDATE skus SET product_id = {} WHERE id = {}",
            p + 2,
            p * 10
        ))
        .await;
        ctx.exec(&format!(
            "UPDATE sku_prices SET amount = amount + 1 WHERE sku_id = {}",
            (p + 3) * 10
        ))
        .await;
        ctx.exec(&format!(
            "DELETE FROM product_tags WHERE product_id = {} LIMIT 2",
            p + 4
        ))
        .await;
        if round == 2 {
            run.etl.kill9();
            run.etl.start();
        }
    }
    run.etl.kill9();
    run.etl.start();
    converged(&ctx, &run, &spec, "the shop after an etl killed twice").await;

    // Rewind the group to the start of every topic: every change is applied again.
    ctx.wait_streamed(&run.worker).await;
    let tables = ["brands", "products", "skus", "sku_prices", "product_tags"];
    let mut ends = Vec::new();
    for t in tables {
        let topic = ctx.topic(t);
        let end = sluice_integration_tests::kafka::ends(
            &ctx.read_topic(&topic, 1, Duration::from_secs(60)).await,
        );
        ends.push((topic, end));
    }
    eventually(
        "the etl committed everything",
        Duration::from_secs(300),
        || async {
            for (topic, end) in &ends {
                ctx.etl_committed_up_to(topic, end).await?;
            }
            Ok(())
        },
    )
    .await;
    let before = versions(&ctx, &alias).await;
    assert_eq!(before.len() as u64, PRODUCTS);
    run.etl.terminate(Duration::from_secs(30));
    for (topic, _) in &ends {
        ctx.rewind_etl(topic).await;
    }
    run.etl.start();
    eventually("the replay consumed", Duration::from_secs(120), || async {
        for (topic, end) in &ends {
            ctx.etl_committed_up_to(topic, end).await?;
        }
        Ok(())
    })
    .await;
    let after = versions(&ctx, &alias).await;
    let moved: Vec<&String> = before
        .keys()
        .filter(|id| before.get(*id) != after.get(*id))
        .collect();
    if let Some(id) = moved.first() {
        panic!(
            "a replay moved {} document(s) (content or _version), e.g. {:?}; {id} before: {:?}\nafter: {:?}",
            moved.len(),
            &moved[..moved.len().min(5)],
            before.get(*id),
            after.get(*id)
        );
    }
    assert_eq!(check_documents(&ctx, &spec).await, Ok(PRODUCTS as usize));

    drop(run);
    ctx.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_thousand_children_in_one_transaction_rebuild_their_root_once_per_batch() {
    let ctx = TestCtx::new("relwide").await;
    shop::schema(&ctx).await;
    let spec = shop::spec(&ctx);
    let alias = spec["alias"].as_str().unwrap().to_owned();
    let run = ctx.start_with(std::slice::from_ref(&spec)).await;
    ctx.exec("INSERT INTO brands VALUES (1, 'brand 1', 'DE')")
        .await;
    ctx.exec("INSERT INTO products VALUES (1, 'wide', 1, 1.00, 0), (2, 'narrow', 1, 2.00, 0)")
        .await;
    converged(&ctx, &run, &spec, "two products").await;
    let pipeline = [("pipeline", alias.as_str())];
    let read_before = run
        .etl
        .metric("sluice_etl_documents_read_total", &pipeline)
        .await;

    // One transaction: 10000 SKUs of product 1.
    let mut conn = ctx.stack.conn().await;
    conn.query_drop(format!("USE `{}`", ctx.db)).await.unwrap();
    conn.query_drop("START TRANSACTION").await.unwrap();
    for chunk in (1..=10_000u64).collect::<Vec<_>>().chunks(2000) {
        let rows: Vec<String> = chunk
            .iter()
            .map(|i| format!("({}, 1, 'wide-{i}', {i})", 1000 + i))
            .collect();
        conn.query_drop(format!("INSERT INTO skus VALUES {}", rows.join(", ")))
            .await
            .unwrap();
    }
    conn.query_drop("COMMIT").await.unwrap();
    drop(conn);
    eventually(
        "product 1 holds its 10000 SKUs",
        Duration::from_secs(180),
        || async {
            let doc = document(&ctx, &alias, 1).await.ok_or("no document 1")?;
            let n = doc["skus"].as_array().map_or(0, Vec::len);
            if n == 10_000 {
                Ok(())
            } else {
                Err(format!("{n} SKUs\n{}", run.logs()))
            }
        },
    )
    .await;
    converged(&ctx, &run, &spec, "after the wide transaction").await;
    let reads = run
        .etl
        .metric("sluice_etl_documents_read_total", &pipeline)
        .await
        - read_before;
    // 10000 events reach the etl in batches (of at most 20000 changes that are read
    // back): the product is read back once per batch, never once per SKU.
    assert!(
        (1.0..=40.0).contains(&reads),
        "product 1 read back {reads} times for 10000 SKU inserts"
    );
    let peak = run.etl.peak_rss().expect("the etl's memory");
    assert!(peak < 256 << 20, "the etl peaked at {} MiB", peak >> 20);
    println!(
        "10000 children: the root read back {reads} times; etl peak RSS {} MiB",
        peak >> 20
    );

    drop(run);
    ctx.cleanup().await;
}

/// The blog, a tree of another shape: a commenter under each comment, and tags
/// many-to-many through a link table; each kind of change reaches its documents.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_blog_with_tags_through_a_link_table_stays_exact() {
    let ctx = TestCtx::new("relblog").await;
    blog::schema(&ctx).await;
    let spec = blog::spec(&ctx);
    let alias = spec["alias"].as_str().unwrap().to_owned();
    let run = ctx.start_with(std::slice::from_ref(&spec)).await;
    blog::data(&ctx, 60, 20).await;
    converged(&ctx, &run, &spec, "the blog").await;
    let tag_names = |doc: &Value| -> Vec<String> {
        doc["tags"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|t| t["tag"]["name"].as_str().map(str::to_owned))
            .collect()
    };
    let first = document(&ctx, &alias, 1).await.expect("article 1");
    assert!(
        tag_names(&first).contains(&"tag 1".to_owned()),
        "article 1 carries tag 1 through the link table: {first}"
    );

    for sql in [
        "UPDATE tags SET name = 'renamed tag' WHERE id = 1",
        "UPDATE users SET name = 'renamed user' WHERE id = 11",
        "UPDATE authors SET name = 'renamed author' WHERE id = 2",
        "DELETE FROM article_tags WHERE article_id = 2 AND tag_id = 1",
        "INSERT INTO article_tags VALUES (40, 1)",
        "UPDATE comments SET text = 'edited' WHERE id = 31",
        "DELETE FROM comments WHERE id = 50",
    ] {
        ctx.exec(sql).await;
    }
    converged(&ctx, &run, &spec, "the blog after changes at every level").await;
    let names = |id: u64| {
        let ctx = &ctx;
        let alias = &alias;
        async move { tag_names(&document(ctx, alias, id).await.expect("an article")) }
    };
    assert!(names(1).await.contains(&"renamed tag".to_owned()));
    assert!(!names(2)
        .await
        .iter()
        .any(|n| n.contains("tag 1") || n == "renamed tag"));
    assert!(names(40).await.contains(&"renamed tag".to_owned()));
    drop(run);
    ctx.cleanup().await;
}

/// A backlog of the shop's rows, table by table: each product's rows reach the etl in
/// several batches (batches of 1,000 changes here), yet its document is read back about
/// once, the batches being held and planned into one while the backlog lasts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backlog_reads_each_document_about_once_across_batches() {
    const BACKLOG_PRODUCTS: u64 = 200;
    let ctx = TestCtx::new("relbacklog").await;
    shop::schema(&ctx).await;
    let spec = shop::spec(&ctx);
    let alias = spec["alias"].as_str().unwrap().to_owned();
    let mut worker = ctx.worker();
    worker.start();
    ctx.wait_worker_ready(&worker).await;
    shop::data(&ctx, BACKLOG_PRODUCTS, BACKLOG_PRODUCTS / 2).await;
    ctx.wait_streamed(&worker).await;
    let mut ends = Vec::new();
    let mut changes = 0;
    for (table, rows) in shop::rows(BACKLOG_PRODUCTS) {
        let topic = ctx.topic(table);
        let records = ctx
            .read_topic(&topic, rows as usize, Duration::from_secs(60))
            .await;
        changes += records.len();
        ends.push((topic, sluice_integration_tests::kafka::ends(&records)));
    }

    // 100 documents a batch: a batch of changes read back is full at 1,000.
    let mut etl = ctx
        .etl_with(std::slice::from_ref(&spec))
        .with_env("SLUICE_ETL__MAX_BATCH_DOCS", "100");
    etl.start();
    eventually(
        "the etl committed the backlog",
        Duration::from_secs(120),
        || async {
            for (topic, end) in &ends {
                ctx.etl_committed_up_to(topic, end)
                    .await
                    .map_err(|e| format!("{e}\n{}", etl.log_tail()))?;
            }
            Ok(())
        },
    )
    .await;
    let pipeline = [("pipeline", alias.as_str())];
    let reads = etl
        .metric_sum("sluice_etl_documents_read_total", &pipeline)
        .await
        .unwrap();
    let per_product = reads / BACKLOG_PRODUCTS as f64;
    println!("a backlog of {changes} changes: each product read back {per_product:.2} times");
    assert!(
        changes > 2000,
        "{changes} changes: the backlog spans several batches"
    );
    assert!(
        per_product <= 1.5,
        "each product read back {per_product:.2} times from {changes} changes in batches of 1,000"
    );
    assert_eq!(
        check_documents(&ctx, &spec).await,
        Ok(BACKLOG_PRODUCTS as usize)
    );
    drop((etl, worker));
    ctx.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tree_that_stops_fitting_its_tables_dead_letters_with_the_key_named_and_recovers() {
    let ctx = TestCtx::new("relunfit").await;
    shop::schema(&ctx).await;
    let spec = shop::spec(&ctx);
    let alias = spec["alias"].as_str().unwrap().to_owned();
    let run = ctx.start_with(std::slice::from_ref(&spec)).await;
    shop::data(&ctx, 20, 10).await;
    converged(&ctx, &run, &spec, "a small shop").await;

    // The join column of the brand relation goes: the spec no longer fits, and the change
    // that shows it is dead-lettered with the key named; nothing else moves.
    ctx.exec("ALTER TABLE products DROP COLUMN brand_id").await;
    ctx.exec("UPDATE products SET title = 'after the drop' WHERE id = 3")
        .await;
    // Changes still in flight from before the drop may be dead-lettered too (a walk-up
    // by the dropped column fails): find the letter of this change.
    let letter: Value = eventually(
        "the change dead-lettered",
        Duration::from_secs(60),
        || async {
            let dead = ctx
                .read_topic(&ctx.dlq_topic, 1, Duration::from_secs(60))
                .await;
            dead.iter()
                .map(|r| serde_json::from_slice::<Value>(&r.payload).unwrap())
                .find(|l| l["event"]["table"] == "products" && l["event"]["key"]["id"] == 3)
                .ok_or_else(|| format!("{} letters, none for products 3", dead.len()))
        },
    )
    .await;
    let reason = letter["reason"].as_str().unwrap();
    assert!(
        reason.contains("relations.brand.on: `brand_id` is not a column of"),
        "{reason}"
    );
    assert_eq!(letter["event"]["key"]["id"], 3, "{letter}");
    assert_eq!(
        document(&ctx, &alias, 3).await.unwrap()["title"],
        "product 3",
        "an unfit pipeline writes nothing"
    );

    // The column comes back: the next change compiles the tree again and flows.
    ctx.exec("ALTER TABLE products ADD COLUMN brand_id INT NULL")
        .await;
    ctx.exec("UPDATE products SET brand_id = 2, title = 'fits again' WHERE id = 3")
        .await;
    eventually(
        "product 3 written again",
        Duration::from_secs(60),
        || async {
            let doc = document(&ctx, &alias, 3).await.ok_or("no document 3")?;
            if doc["title"] == "fits again" && doc["brand"]["name"] == "brand 2" {
                Ok(())
            } else {
                Err(format!("{doc}\n{}", run.logs()))
            }
        },
    )
    .await;
    drop(run);
    ctx.cleanup().await;
}

on_sources!(a_document_is_read_only_once_its_change_is_visible_where_it_is_read: mysql);
/// A document is read only once its change is visible where it is read. The etl reads
/// documents from a replica whose applier is stopped, so a change the worker streamed
/// from the primary stays invisible there: the etl waits for its GTID
/// (`WAIT_FOR_EXECUTED_GTID_SET`) and tries again, rather than stamp the replica's older
/// state with the change's version (which would stick: nothing newer comes to replace
/// it). Once the replica applies the change, the document has it.
async fn a_document_is_read_only_once_its_change_is_visible_where_it_is_read() {
    let primary = PrivateSource::start(7301).await;
    let replica = PrivateSource::start(7302).await;
    replica.replicate_from(&primary);
    let ctx = TestCtx::on("visible", primary.stack().await).await;
    shop::schema(&ctx).await;
    let spec = shop::spec(&ctx);
    let alias = spec["alias"].as_str().unwrap().to_owned();
    // The worker streams the primary; the etl reads documents from the replica.
    let worker = ctx.worker();
    ctx.route_mysql(&replica.addr());
    let etl = ctx.etl_with(std::slice::from_ref(&spec));
    let run = ctx.run(worker, etl).await;
    shop::data(&ctx, 20, 10).await;
    converged(&ctx, &run, &spec, "the shop, streamed").await;

    replica.pause_applier();
    // Every version of the change is above the binlog's end before it.
    let before = ctx.binlog_end().await;
    let before = sluice_model::ExternalVersion::new(0, before.file_seq().unwrap(), before.pos)
        .unwrap()
        .get();
    ctx.exec("UPDATE sku_prices SET amount = 99.99 WHERE sku_id = 70")
        .await;
    // Until the etl has waited past one bound (it says so each time), or has written the
    // document at the change's version without waiting, which must not be.
    let waits = |log: &str| log.matches("are not visible within").count();
    let seven = eventually(
        "the etl waits for the change on the replica, past one wait",
        Duration::from_secs(60),
        || async {
            let log = std::fs::read_to_string(&run.etl.log).unwrap_or_default();
            let hit = ctx
                .stack
                .es
                .mget_hits(&alias, &[("7".to_owned(), None)])
                .await
                .map_err(|e| e.to_string())?
                .remove(0)
                .ok_or("no product 7")?;
            if waits(&log) >= 2 || hit.version > before {
                Ok(hit)
            } else {
                Err(format!(
                    "{} waits so far\n{}",
                    waits(&log),
                    run.etl.log_tail()
                ))
            }
        },
    )
    .await;
    assert!(
        seven.version < before && !seven.source.to_string().contains("99.99"),
        "product 7 was written at version {} (the change's are above {before}) while the \
         replica did not have the change: {}",
        seven.version,
        seven.source
    );
    replica.resume_applier();
    converged(&ctx, &run, &spec, "the change, once the replica applied it").await;
    let seven = document(&ctx, &alias, 7).await.expect("product 7");
    assert!(seven.to_string().contains("99.99"), "{seven}");
}

/// Documents written in parts keep their versions in a `sluice` field: a tree whose
/// documents would have a field of that name is not written, and its changes are
/// dead-lettered with the fix named.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tree_with_a_field_where_the_versions_go_dead_letters_with_the_fix_named() {
    let ctx = TestCtx::new("relsluice").await;
    shop::schema(&ctx).await;
    ctx.exec("ALTER TABLE products ADD COLUMN sluice VARCHAR(16) NULL")
        .await;
    let spec = shop::spec(&ctx);
    let alias = spec["alias"].as_str().unwrap().to_owned();
    let run = ctx.start_with(std::slice::from_ref(&spec)).await;
    ctx.exec("INSERT INTO products VALUES (1, 'mine', NULL, 1.00, 0, 'v9')")
        .await;
    let dead = ctx
        .read_topic(&ctx.dlq_topic, 1, Duration::from_secs(60))
        .await;
    let letter: Value = serde_json::from_slice(&dead[0].payload).unwrap();
    let reason = letter["reason"].as_str().unwrap();
    assert!(
        reason
            .contains("a field `sluice`, which documents written in parts keep their versions in")
            && reason.contains("area_updates = false"),
        "{reason}\n{}",
        run.logs()
    );
    assert_eq!(letter["event"]["key"]["id"], 1, "{letter}");
    let made = ctx.stack.es.index_exists(&alias).await.unwrap();
    assert!(
        !made || document(&ctx, &alias, 1).await.is_none(),
        "nothing written"
    );
    drop(run);
    ctx.cleanup().await;
}

/// A write of an etl killed while its bulk was on the way, landing after the etl that
/// replaced it wrote newer versions of the same part: refused by the part's own version,
/// so the document stays what MySQL holds (written whole, the document's external
/// version refuses it the same way).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_write_of_a_killed_etl_never_lands_over_a_newer_part() {
    let ctx = TestCtx::new("rellate").await;
    shop::schema(&ctx).await;
    let proxy = HttpProxy::start(&ctx.stack.es_url, "_bulk").await;
    ctx.route_elasticsearch(&proxy.url());
    let spec = shop::spec(&ctx);
    let alias = spec["alias"].as_str().unwrap().to_owned();
    let mut run = ctx.start_with(std::slice::from_ref(&spec)).await;
    shop::data(&ctx, 20, 10).await;
    converged(&ctx, &run, &spec, "the shop is indexed").await;

    // A price of product 9's SKU changes; its patch is held on the way to the sink.
    let price = |amount: &str| {
        format!("UPDATE sku_prices SET amount = {amount} WHERE sku_id = 90 AND currency = 'USD'")
    };
    proxy.inject(HttpFault::Hold, 1);
    ctx.exec(&price("1.00")).await;
    eventually("the patch held", Duration::from_secs(60), || async {
        match proxy.held() {
            1 => Ok(()),
            n => Err(format!("{n} bulks held\n{}", run.logs())),
        }
    })
    .await;
    // The etl dies with it; the price changes again; the etl that replaces it replays
    // both changes and writes the price as it is now.
    run.etl.kill9();
    ctx.exec(&price("2.00")).await;
    run.etl.start();
    converged(&ctx, &run, &spec, "the replaced etl wrote the newer price").await;
    let before = stored_versions(&ctx, &alias, 9).await;

    // Then the dead etl's bulk reaches the sink, carrying the older price: refused.
    proxy.release();
    let (late, answer) = eventually(
        "the held bulk answered by the sink",
        Duration::from_secs(60),
        || async {
            match &proxy.answered_after_hold()[..] {
                [one] => Ok(one.clone()),
                other => Err(format!("{} held bulks answered", other.len())),
            }
        },
    )
    .await;
    assert!(
        late.contains(r#""_id":"9""#) && late.contains("1.00") && !late.contains("2.00"),
        "the held bulk is product 9's write of the older price: {late}"
    );
    assert!(
        answer.contains(r#""result":"noop""#) || answer.contains("version_conflict"),
        "the sink refused the late write as older (a no-op, or a version conflict where \
         written whole): {answer}"
    );
    check_documents(&ctx, &spec)
        .await
        .unwrap_or_else(|e| panic!("the late write landed over the newer part: {e}"));
    assert_eq!(
        stored_versions(&ctx, &alias, 9).await,
        before,
        "the late write changed nothing"
    );
    drop(run);
    ctx.cleanup().await;
}
