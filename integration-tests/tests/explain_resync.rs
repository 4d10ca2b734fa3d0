//! Explaining a document and resyncing chosen ones, on the shop's tree: `pipelines
//! explain` shows a document's version and the binlog position it stands for, the rows
//! of every table that build it, and — for a document tampered with behind Sluice's
//! back — the field that differs; `pipelines resync` rebuilds the documents a condition
//! or a list of ids names (and only those) through the etl, never over a newer write; a
//! condition that is no filter, or names a missing column, is refused with `where` named.

use std::time::Duration;

use serde_json::{json, Value};
use sluice_elastic::BulkOp;
use sluice_integration_tests::on_sources;
use sluice_integration_tests::{eventually, shop, Cluster, Tamper, TestCtx};

const PRODUCTS: u64 = 60;

/// `pipelines explain NAME ID`.
fn explain(cluster: &Cluster, name: &str, id: &str) -> Value {
    cluster
        .ctl(&["pipelines", "explain", name, id])
        .unwrap_or_else(|e| panic!("explain {id}: {e}"))
}

/// The rows the explanation lists for `node` (`""`: the root).
fn rows<'a>(e: &'a Value, node: &str) -> &'a Vec<Value> {
    e["rows"]
        .as_array()
        .and_then(|t| t.iter().find(|t| t["node"] == node))
        .and_then(|t| t["rows"].as_array())
        .unwrap_or_else(|| panic!("no rows of `{node}` in {e}"))
}

/// `pipelines explain` once `ready` holds of it, within 30 s: a resync's run ends once its
/// documents reached Kafka, a moment before the etl writes them.
async fn explained_once(
    cluster: &Cluster,
    name: &str,
    id: &str,
    ready: impl Fn(&Value) -> bool,
) -> Value {
    eventually(
        &format!("document {id} rewritten"),
        Duration::from_secs(30),
        || async {
            let e = explain(cluster, name, id);
            if ready(&e) {
                Ok(e)
            } else {
                Err(e.to_string())
            }
        },
    )
    .await
}

/// Runs a resync to its end (`args` after the pipeline's name); returns it as it ended.
async fn resync(cluster: &Cluster, name: &str, args: &[&str]) -> Value {
    let mut all = vec!["pipelines", "resync", name];
    all.extend(args);
    let started = cluster.ctl(&all).expect("the resync starts");
    let id = started[0]["id"].as_u64().expect("a run id");
    assert_eq!(started[0]["kind"], "resync", "{started}");
    let list = ["pipelines", "checks", name, "--kind", "resync"];
    let run = cluster
        .wait_run_ended(&list, id, Duration::from_secs(120))
        .await;
    assert_eq!(run["state"], "done", "{run}\n{}", cluster.logs());
    run
}

async fn shop_cluster(ctx: &TestCtx) -> (Cluster, String) {
    shop::schema(ctx).await;
    shop::data(ctx, PRODUCTS, PRODUCTS / 2).await;
    let cluster = ctx.start_cluster(1, 1).await;
    let source = ctx.add_source(&cluster, "products", 1).await;
    let mut spec = shop::spec(ctx);
    spec["source"] = json!(source.name);
    for t in ["brands", "skus", "sku_prices", "product_tags", "promotions"] {
        ctx.clean_up_topic(sluice_kafka::TopicConfig::default().rows_topic(
            &source.name,
            &ctx.db,
            t,
        ));
    }
    let name = spec["name"].as_str().unwrap().to_owned();
    let path = ctx.dir.join(format!("{name}.json"));
    std::fs::write(&path, serde_json::to_vec_pretty(&spec).unwrap()).unwrap();
    cluster
        .ctl(&["pipelines", "put", &name, "--spec", path.to_str().unwrap()])
        .unwrap();
    cluster
        .wait_running(&[&source], Duration::from_secs(60))
        .await;
    cluster.ctl(&["pipelines", "build", &name]).unwrap();
    cluster.wait_built(&name, Duration::from_secs(180)).await;
    (cluster, name)
}

on_sources!(explain_finds_a_tampered_document_and_resync_puts_right_only_what_it_names: mariadb, mysql);
async fn explain_finds_a_tampered_document_and_resync_puts_right_only_what_it_names() {
    let ctx = TestCtx::new("explain").await;
    let (cluster, name) = shop_cluster(&ctx).await;
    let index = format!("{name}_v2");

    // An untouched document: equal, with its version's position and every table's rows.
    let e = explain(&cluster, &name, "10");
    assert_eq!(
        (e["indexed"].as_bool(), e["equal"].as_bool()),
        (Some(true), Some(true)),
        "{e}"
    );
    assert!(e["version"].as_u64().unwrap_or(0) > 0, "{e}");
    let position = e["position"].as_str().unwrap_or_default();
    let offset = position.rsplit_once(':').map(|(_, o)| o.parse::<u64>());
    assert!(
        matches!(offset, Some(Ok(o)) if o > 4),
        "a binlog position: {e}"
    );
    assert_eq!(rows(&e, "")[0]["title"], "product 10", "{e}");
    assert_eq!(rows(&e, "brand")[0]["name"], "brand 1", "{e}");
    assert_eq!(rows(&e, "skus").len(), 2, "{e}");
    assert_eq!(rows(&e, "prices").len(), 4, "both SKUs' EUR and USD: {e}");
    assert_eq!(rows(&e, "tags").len(), 5, "the newest five: {e}");
    // Only the promotion of the product's own brand joins (the composite key).
    let promotions = rows(&e, "promotions");
    assert_eq!(promotions.len(), 1, "{e}");
    assert_eq!(promotions[0]["brand_id"], 1, "{e}");

    // The spec previewed (not saved): the same document for a root id, with its rows,
    // and the mapping it generates; a relation joined on a missing column is refused at
    // its key.
    let spec_file = ctx.dir.join(format!("{name}.json"));
    let spec_file = spec_file.to_str().unwrap();
    let preview = cluster
        .ctl(&[
            "pipelines",
            "preview",
            &name,
            "--spec",
            spec_file,
            "--document",
            "10",
        ])
        .unwrap();
    assert_eq!(preview["problems"], json!([]), "{preview}");
    assert_eq!(preview["document"], e["built"], "{preview}");
    assert_eq!(preview["rows"], e["rows"], "{preview}");
    assert_eq!(preview["mapping"]["skus"]["type"], "nested", "{preview}");
    let mut wrong: Value =
        serde_json::from_str(&std::fs::read_to_string(spec_file).unwrap()).unwrap();
    wrong["relations"][1]["on"] = json!({"id": "sku"});
    let wrong_file = ctx.dir.join("wrong.json");
    std::fs::write(&wrong_file, wrong.to_string()).unwrap();
    let refused = cluster
        .ctl(&[
            "pipelines",
            "preview",
            &name,
            "--spec",
            wrong_file.to_str().unwrap(),
        ])
        .unwrap_err();
    assert!(
        refused.contains("relations.skus.on: `sku` is not a column of"),
        "{refused}"
    );

    // Tampered behind Sluice's back: explain names the field and both values.
    let tampered = |id: &str| (id.to_owned(), Tamper::Set("title", json!("tampered")));
    ctx.tamper(
        &index,
        &[
            tampered("10"),
            tampered("20"),
            tampered("31"),
            tampered("44"),
        ],
    )
    .await;
    let e = explain(&cluster, &name, "10");
    assert_eq!(e["equal"], false, "{e}");
    assert_eq!(
        e["differences"],
        json!([{"field": "title", "index": "tampered", "mysql": "product 10"}]),
        "{e}"
    );

    // A condition that is no filter, or names a column the root lacks: refused, named.
    for (bad, says) in [
        ("id = 1; DROP TABLE products", "where: the condition"),
        ("nosuch = 1", "`nosuch`"),
    ] {
        let refused = cluster
            .ctl(&["pipelines", "resync", &name, "--where", bad])
            .unwrap_err();
        assert!(
            refused.contains("where:") && refused.contains(says),
            "{bad}: {refused}"
        );
    }

    // By condition: ids 1..=20 are rebuilt (10 and 20 put right); 31 and 44 are not.
    let run = resync(&cluster, &name, &["--where", "id <= 20"]).await;
    assert_eq!(run["repaired"], 20, "{run}");
    assert_eq!(run["scope"], "where id <= 20", "{run}");
    for id in ["10", "20"] {
        explained_once(&cluster, &name, id, |e| e["equal"] == true).await;
    }
    // Not named by the condition: no write of theirs is on its way.
    for id in ["31", "44"] {
        let e = explain(&cluster, &name, id);
        assert_eq!(
            e["equal"], false,
            "document {id} after the resync of id <= 20: {e}"
        );
    }

    // Never over a newer write: document 31 written far ahead of the binlog keeps it.
    let es = &ctx.stack.es;
    let ahead = e_version(&explain(&cluster, &name, "31")) + (1 << 53);
    let mut doc = es.mget(&index, &["31".to_owned()]).await.unwrap()[0]
        .clone()
        .unwrap();
    doc["title"] = json!("from the future");
    let written = es
        .bulk(&[BulkOp::Index {
            index: index.clone(),
            id: "31".into(),
            version: ahead,
            routing: None,
            doc,
        }])
        .await
        .unwrap();
    assert!(written.iter().all(|o| o.is_done()), "{written:?}");
    es.refresh(&index).await.unwrap();
    let run = resync(&cluster, &name, &["--ids", "31,44"]).await;
    assert_eq!(run["repaired"], 2, "{run}");
    explained_once(&cluster, &name, "44", |e| e["equal"] == true).await;
    // 31 went in the same batch as 44: its write was refused, not pending.
    let e = explain(&cluster, &name, "31");
    assert_eq!(e_version(&e), ahead, "{e}");
    assert_eq!(e["differences"][0]["index"], "from the future", "{e}");

    // An id MySQL has no row for: its orphan in the index is deleted, not kept.
    let orphan = BulkOp::Index {
        index: index.clone(),
        id: "99999".into(),
        version: 1,
        routing: None,
        doc: json!({"id": 99999, "title": "ghost"}),
    };
    let written = es.bulk(&[orphan]).await.unwrap();
    assert!(written.iter().all(|o| o.is_done()), "{written:?}");
    es.refresh(&index).await.unwrap();
    assert_eq!(explain(&cluster, &name, "99999")["indexed"], true);
    resync(&cluster, &name, &["--ids", "99999"]).await;
    let e = explained_once(&cluster, &name, "99999", |e| e["indexed"] == false).await;
    assert_eq!(
        (e["indexed"].as_bool(), e["in_mysql"].as_bool()),
        (Some(false), Some(false)),
        "{e}"
    );
    assert_eq!(e["equal"], true, "{e}");

    // The resyncs' events, listed by kind among the pipeline's others.
    let all = cluster.ctl(&["events", "--subject", &name]).unwrap();
    let kinds = |events: &Value| -> Vec<String> {
        let list = events.as_array().unwrap();
        list.iter()
            .map(|e| e["kind"].as_str().unwrap_or_default().to_owned())
            .collect()
    };
    assert!(kinds(&all).iter().any(|k| k != "resync"), "{all}");
    let resyncs = cluster
        .ctl(&[
            "events",
            "--subject",
            &name,
            "--kind",
            "resync",
            "--since",
            "1h",
        ])
        .unwrap();
    let resync_kinds = kinds(&resyncs);
    assert!(
        resync_kinds.len() >= 6 && resync_kinds.iter().all(|k| k == "resync"),
        "{resyncs}"
    );

    // A viewer may explain, not resync.
    cluster
        .ctl(&["users", "put", "vera", "--role", "viewer"])
        .unwrap();
    let made = cluster
        .ctl(&["tokens", "create", "e2e", "--user", "vera"])
        .unwrap();
    let viewer = made["secret"].as_str().unwrap().to_owned();
    cluster
        .ctl_with(&viewer, &["pipelines", "explain", &name, "10"])
        .unwrap();
    let refused = cluster
        .ctl_with(&viewer, &["pipelines", "resync", &name, "--ids", "10"])
        .unwrap_err();
    assert!(refused.contains("operator"), "{refused}");
    drop(cluster);
    ctx.cleanup().await;
}

fn e_version(e: &Value) -> u64 {
    e["version"]
        .as_u64()
        .unwrap_or_else(|| panic!("no version: {e}"))
}
