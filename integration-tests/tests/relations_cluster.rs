//! Documents from several tables in a cluster, driven with `sluicectl` as an operator
//! would: a pipeline spec put from a file (its mistakes refused with the key named), a
//! source registered with the root table only (the center widens what the worker
//! captures to every table of the tree), and a zero-downtime build of the whole tree
//! while a write load changes all five tables. Ends with the independent checker.

use std::time::Duration;

use serde_json::json;
use sluice_integration_tests::on_sources;
use sluice_integration_tests::{check_documents, eventually, shop, TestCtx};

const PRODUCTS: u64 = 600;

/// One round of changes to all five tables of the shop (round `n`).
fn change_everything(n: u64) -> Vec<String> {
    let p = 1 + (n * 37) % PRODUCTS;
    let new = 100_000 + n;
    let mut round = vec![
        format!("UPDATE brands SET name = 'name {n}' WHERE id = {}", 1 + n % 3),
        format!("UPDATE products SET title = 'title {n}', deleted = {} WHERE id = {p}", n % 4 / 3),
        format!("INSERT INTO products VALUES ({new}, 'new {n}', {}, 1.00, 0)", 1 + n % 3),
        format!("INSERT INTO skus VALUES ({new}, {new}, 'new-{n}', 1)"),
        format!("UPDATE skus SET product_id = {} WHERE id = {}", 1 + (p * 7) % PRODUCTS, p * 10),
        format!("UPDATE sku_prices SET amount = amount + 1 WHERE sku_id = {}", (1 + (n * 11) % PRODUCTS) * 10 + 1),
        format!("INSERT INTO sku_prices VALUES (NULL, {new}, 'EUR', {n})"),
        format!("INSERT INTO product_tags VALUES (NULL, {p}, 'load-{n}', TIMESTAMP('2025-01-01') + INTERVAL {n} SECOND)"),
    ];
    if n % 5 == 0 {
        round.push(format!(
            "DELETE FROM products WHERE id = {}",
            100_000 + n / 2
        ));
    }
    round
}

on_sources!(a_whole_tree_builds_under_a_load_on_all_its_tables: mariadb, mariadb_watermarks);
async fn a_whole_tree_builds_under_a_load_on_all_its_tables() {
    let ctx = TestCtx::new("reltree").await;
    shop::schema(&ctx).await;
    shop::data(&ctx, PRODUCTS, PRODUCTS / 2).await;
    let cluster = ctx.start_cluster(2, 2).await;
    // The source captures the root table only, as registered; the pipeline's other
    // tables are added to what the worker captures by the center.
    let source = ctx.add_source(&cluster, "products", 1).await;
    // Its pipeline (named like the alias) becomes the tree.
    let mut spec = shop::spec(&ctx);
    spec["source"] = json!(source.name);
    for t in ["brands", "skus", "sku_prices", "product_tags", "promotions"] {
        ctx.clean_up_topic(sluice_kafka::TopicConfig::default().rows_topic(
            &source.name,
            &ctx.db,
            t,
        ));
    }

    // Mistakes are refused with the key named.
    let mut wrong = spec.clone();
    wrong["relations"][1]["relations"][0]["on"] = json!({"id": "sku"});
    let e = ctx.put_spec(&cluster, &wrong).unwrap_err();
    assert!(
        e.contains("relations.skus.relations.prices.on: `sku` is not a column of"),
        "{e}"
    );
    let mut wrong = spec.clone();
    wrong["relations"][0]["filter"] = json!("name <> '' OR (SELECT 1)");
    let e = ctx.put_spec(&cluster, &wrong).unwrap_err();
    assert!(e.contains("relations.brand.filter:"), "{e}");
    let mut wrong = spec.clone();
    wrong["relations"][2]["table"] = json!("product_tag");
    let e = ctx.put_spec(&cluster, &wrong).unwrap_err();
    assert!(
        e.contains("relations.tags.table: `") && e.contains("product_tag` does not exist"),
        "{e}"
    );

    let put_back = ctx.put_spec(&cluster, &spec).unwrap();
    assert_eq!(
        put_back["relations"][1]["relations"][0]["name"], "prices",
        "{put_back}"
    );
    let name = spec["name"].as_str().unwrap().to_owned();
    let got = cluster.ctl(&["pipelines", "get", &name]).unwrap();
    assert_eq!(got["relations"].as_array().map(Vec::len), Some(5), "{got}");
    cluster
        .wait_running(&[&source], Duration::from_secs(60))
        .await;

    // The load, on all five tables, through the whole build.
    let load = ctx.load(Duration::from_millis(30), change_everything);
    let started = cluster
        .ctl(&["pipelines", "build", &name, "--chunk-rows", "150"])
        .unwrap();
    assert_eq!(started["version"], 2, "{started}");
    cluster.wait_built(&name, Duration::from_secs(240)).await;
    let rounds = load.stop().await;
    assert!(
        rounds > 20,
        "the load ran during the build ({rounds} rounds)"
    );
    let alias = spec["alias"].as_str().unwrap();
    assert_eq!(
        ctx.stack.es.alias_targets(alias).await.unwrap(),
        [format!("{alias}_v2")]
    );
    let documents = eventually(
        "the tree equals MySQL",
        Duration::from_secs(120),
        || async {
            check_documents(&ctx, &spec)
                .await
                .map_err(|e| format!("{e}\n{}", cluster.logs()))
        },
    )
    .await;
    assert!(
        documents as u64 > PRODUCTS / 2,
        "only {documents} documents compared"
    );
    drop(cluster);
    ctx.cleanup().await;
}

on_sources!(parent_child_documents_are_built_routed_and_moved_with_their_parent: mariadb, mariadb_watermarks);
async fn parent_child_documents_are_built_routed_and_moved_with_their_parent() {
    let ctx = TestCtx::new("reljoin").await;
    for ddl in [
        "CREATE TABLE questions (id INT PRIMARY KEY, title VARCHAR(100) NOT NULL, closed TINYINT NOT NULL DEFAULT 0)",
        "CREATE TABLE answers (id INT PRIMARY KEY, question_id INT NOT NULL, author_id INT NULL, body TEXT NOT NULL, KEY (question_id))",
        "CREATE TABLE authors (id INT PRIMARY KEY, nick VARCHAR(40) NOT NULL)",
    ] {
        ctx.exec(ddl).await;
    }
    ctx.exec("INSERT INTO authors VALUES (1, 'ann'), (2, 'bob')")
        .await;
    let values = |f: &dyn Fn(u32) -> String| (1..=120).map(f).collect::<Vec<_>>().join(", ");
    ctx.exec(&format!(
        "INSERT INTO questions VALUES {}",
        values(&|q| format!("({q}, 'question {q}', {})", u32::from(q % 9 == 0)))
    ))
    .await;
    ctx.exec(&format!(
        "INSERT INTO answers VALUES {}",
        values(&|a| format!("({a}, {}, {}, 'answer {a}')", 1 + a % 40, 1 + a % 2))
    ))
    .await;
    let cluster = ctx.start_cluster(1, 1).await;
    let source = ctx.add_source(&cluster, "questions", 1).await;
    for t in ["answers", "authors"] {
        ctx.clean_up_topic(sluice_kafka::TopicConfig::default().rows_topic(
            &source.name,
            &ctx.db,
            t,
        ));
    }
    let mut spec = ctx.spec(json!({
        "table": "questions",
        "filter": "closed = 0",
        "join": {"field": "qa", "parent": "question"},
        "relations": [
            {"name": "answer", "kind": "child", "table": "answers", "on": {"id": "question_id"},
             "relations": [{"name": "author", "kind": "one_to_one", "table": "authors", "on": {"author_id": "id"}}]}
        ]
    }));
    spec["source"] = json!(source.name);
    spec["shards"] = json!(2);
    ctx.put_spec(&cluster, &spec).unwrap();
    cluster
        .wait_running(&[&source], Duration::from_secs(60))
        .await;
    let name = spec["name"].as_str().unwrap().to_owned();
    let alias = spec["alias"].as_str().unwrap().to_owned();
    // Chunks of both kinds of document: questions and answers.
    cluster
        .ctl(&["pipelines", "build", &name, "--chunk-rows", "50"])
        .unwrap();
    cluster.wait_built(&name, Duration::from_secs(120)).await;
    let checked = |what: &'static str| {
        let (ctx, spec, cluster) = (&ctx, &spec, &cluster);
        async move {
            eventually(what, Duration::from_secs(90), || async {
                check_documents(ctx, spec)
                    .await
                    .map_err(|e| format!("{e}\n{}", cluster.logs()))
            })
            .await
        }
    };
    let documents = checked("the built questions and answers").await;
    assert_eq!(
        documents,
        (120 - 120 / 9) + 120,
        "open questions, and every answer"
    );

    // An answer moves to another question: it is routed to its new parent's shard and
    // gone from its old one's.
    ctx.exec("UPDATE answers SET question_id = 77 WHERE id = 5")
        .await;
    ctx.exec("DELETE FROM answers WHERE id = 6").await;
    ctx.exec("UPDATE authors SET nick = 'bobby' WHERE id = 2")
        .await;
    ctx.exec("INSERT INTO answers VALUES (500, 3, 1, 'late answer')")
        .await;
    checked("an answer moved, one deleted, an author renamed").await;
    let moved = ctx
        .stack
        .es
        .search(&alias, &json!({"query": {"ids": {"values": ["answer#5"]}}}))
        .await
        .unwrap();
    let hits = moved["hits"]["hits"].as_array().unwrap();
    assert_eq!(hits.len(), 1, "one copy of the moved answer: {moved}");
    assert_eq!(hits[0]["_routing"], "77", "{moved}");
    assert_eq!(
        hits[0]["_source"]["qa"],
        json!({"name": "answer", "parent": "77"})
    );
    drop(cluster);
    ctx.cleanup().await;
}
