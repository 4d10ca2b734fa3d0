//! Index mappings (issue 4): per-column overrides and index settings reach the index; an
//! added column and in-place changes apply to the live index; a change the live mapping
//! cannot take marks the pipeline as needing a rebuild, says why, and a build clears it.

use std::time::Duration;

use mysql_async::prelude::*;
use serde_json::{json, Value};
use sluice_integration_tests::{eventually, Cluster, ClusterSource, TestCtx};

/// The mapping of `index` (its `properties`).
async fn properties(ctx: &TestCtx, index: &str) -> Value {
    let m = ctx.stack.es.get_mapping(index).await.expect("mapping");
    m[index]["mappings"]["properties"].clone()
}

/// The test's overrides and settings, with `title`'s search analyzer and the refresh
/// interval as given (both change in place).
fn overrides(title_search_analyzer: &str, refresh_interval: &str) -> Vec<String> {
    let title = format!(
        "title:analyzer=english,search_analyzer={title_search_analyzer},copy_to=everything"
    );
    [
        "--field",
        &title,
        "--field",
        "body:keyword=false,copy_to=everything",
        "--field",
        "secret:type=keyword,index=false",
        "--field",
        "price:type=double",
        "--refresh-interval",
        refresh_interval,
    ]
    .map(String::from)
    .to_vec()
}

/// The pipeline as `sluicectl pipelines list` shows it.
fn listed(cluster: &Cluster, name: &str) -> Value {
    let all = cluster.ctl(&["pipelines", "list"]).expect("pipelines list");
    all.as_array()
        .and_then(|a| a.iter().find(|p| p["name"] == name).cloned())
        .unwrap_or_else(|| panic!("{name} not listed: {all}"))
}

/// Touches row 1 (a live change the etl must prepare the index for) until `probe` holds.
async fn touching_until<F, Fut>(ctx: &TestCtx, what: &str, probe: F)
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = Result<(), String>>,
{
    let mut n = 0;
    eventually(what, Duration::from_secs(60), || {
        n += 1;
        let sql = format!("UPDATE docs SET hits = {n} WHERE id = 1");
        let probe = probe();
        async move {
            ctx.exec(&sql).await;
            probe.await
        }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn overrides_settings_and_column_changes_reach_the_index() {
    let ctx = TestCtx::new("mapping").await;
    ctx.exec(
        "CREATE TABLE docs (id BIGINT PRIMARY KEY, title VARCHAR(100), body TEXT,
         price DECIMAL(10,2), secret VARCHAR(20), hits INT)",
    )
    .await;
    ctx.exec("INSERT INTO docs VALUES (1, 'Foxes', 'a rainbow over the hill', 9.50, 's1', 0)")
        .await;
    let cluster = ctx.start_cluster(1, 1).await;
    let docs: ClusterSource = ctx.add_source(&cluster, "docs", 1).await;
    let alias = docs.pipeline.alias.clone();

    // Bad overrides are refused, naming the key.
    let refused = ctx
        .put_pipeline(
            &cluster,
            &docs,
            &["--field", "price:type=long,analyzer=english"],
        )
        .unwrap_err();
    assert!(refused.contains("fields.price.analyzer"), "{refused}");
    let refused = ctx
        .put_pipeline(&cluster, &docs, &["--refresh-interval", "soon"])
        .unwrap_err();
    assert!(refused.contains("refresh_interval"), "{refused}");

    ctx.put_pipeline(&cluster, &docs, &overrides("standard", "2s"))
        .unwrap();
    let put = listed(&cluster, &alias);
    assert_eq!(
        put["fields"]["secret"],
        json!({"type": "keyword", "index": false})
    );
    assert_eq!(put["refresh_interval"], "2s");
    cluster
        .wait_running(&[&docs], Duration::from_secs(30))
        .await;

    // Version 1, made by the etl for the first live change, has what was asked for.
    let v1 = format!("{alias}_v1");
    touching_until(&ctx, "version 1 created", || async {
        ctx.stack
            .es
            .get_mapping(&v1)
            .await
            .map(|_| ())
            .map_err(|e| e.to_string())
    })
    .await;
    let p = properties(&ctx, &v1).await;
    assert_eq!(p["title"]["analyzer"], "english", "{p}");
    assert_eq!(p["title"]["search_analyzer"], "standard", "{p}");
    assert_eq!(p["title"]["copy_to"], json!(["everything"]), "{p}");
    assert_eq!(p["title"]["fields"]["keyword"]["type"], "keyword", "{p}");
    assert_eq!(p["body"]["type"], "text", "{p}");
    assert!(
        p["body"].get("fields").is_none(),
        "no keyword sub-field: {p}"
    );
    assert_eq!(
        p["secret"],
        json!({"type": "keyword", "index": false}),
        "{p}"
    );
    assert_eq!(p["price"]["type"], "double", "{p}");
    assert_eq!(
        p["everything"]["type"], "text",
        "copy_to target mapped: {p}"
    );
    assert_eq!(p["hits"]["type"], "long", "generated: {p}");
    let settings = ctx.stack.es.get_settings(&v1).await.unwrap();
    assert_eq!(settings[&v1]["settings"]["index"]["refresh_interval"], "2s");

    // copy_to works: the body's words are found through the combined field.
    touching_until(&ctx, "a search through copy_to", || async {
        ctx.stack
            .es
            .refresh(&alias)
            .await
            .map_err(|e| e.to_string())?;
        let hits = ctx
            .stack
            .es
            .search(
                &alias,
                &json!({"query": {"match": {"everything": "rainbow"}}}),
            )
            .await
            .map_err(|e| e.to_string())?;
        match hits["hits"]["total"]["value"].as_u64() {
            Some(1) => Ok(()),
            _ => Err(hits.to_string()),
        }
    })
    .await;

    // Additive changes apply in place: a new column, a changed search analyzer, another
    // refresh interval.
    ctx.exec("ALTER TABLE docs ADD COLUMN tag VARCHAR(10)")
        .await;
    ctx.put_pipeline(&cluster, &docs, &overrides("simple", "3s"))
        .unwrap();
    touching_until(&ctx, "changes applied in place", || async {
        let p = properties(&ctx, &v1).await;
        let s = ctx
            .stack
            .es
            .get_settings(&v1)
            .await
            .map_err(|e| e.to_string())?;
        let interval = &s[&v1]["settings"]["index"]["refresh_interval"];
        if p["tag"]["type"] == "text"
            && p["title"]["search_analyzer"] == "simple"
            && interval == "3s"
        {
            Ok(())
        } else {
            Err(format!("{p} refresh_interval {interval}"))
        }
    })
    .await;
    assert_eq!(listed(&cluster, &alias)["needs_rebuild"], "");
    assert_eq!(
        ctx.stack.es.alias_targets(&alias).await.unwrap(),
        std::slice::from_ref(&v1),
        "in place: still version 1"
    );

    // An analyzer change the live index cannot take, on a quiet table: the pipeline is
    // marked as needing a rebuild at once, saying why, without waiting for a row change.
    // Quiet: the etl has applied the table's last change.
    let mut conn = ctx.stack.conn().await;
    let hits: i64 = conn
        .query_first(format!("SELECT hits FROM `{}`.docs WHERE id = 1", ctx.db))
        .await
        .unwrap()
        .unwrap();
    eventually(
        "the last change applied",
        Duration::from_secs(60),
        || async {
            let doc = ctx
                .stack
                .es
                .mget(&alias, &["1".to_owned()])
                .await
                .map_err(|e| e.to_string())?;
            match doc.first() {
                Some(Some(d)) if d["hits"] == hits => Ok(()),
                other => Err(format!("{other:?}, want hits {hits}")),
            }
        },
    )
    .await;
    ctx.put_pipeline(
        &cluster,
        &docs,
        &[
            "--field",
            "title:analyzer=standard",
            "--refresh-interval",
            "3s",
        ],
    )
    .unwrap();
    eventually(
        "marked without a row change",
        Duration::from_secs(60),
        || async {
            let reason = listed(&cluster, &alias)["needs_rebuild"].to_string();
            if reason.contains("field `title`: analyzer is english in the index, standard wanted") {
                Ok(())
            } else {
                Err(format!("needs_rebuild: {reason}\n{}", cluster.logs()))
            }
        },
    )
    .await;
    // A column's type change: the same, with the type named.
    ctx.exec("ALTER TABLE docs MODIFY price VARCHAR(20)").await;
    ctx.exec("UPDATE docs SET price = 'cheap' WHERE id = 1")
        .await;
    touching_until(&ctx, "the type change marked", || {
        let reason = listed(&cluster, &alias)["needs_rebuild"].to_string();
        async move {
            if reason.contains("type is double in the index, text wanted") {
                Ok(())
            } else {
                Err(format!("needs_rebuild: {reason}"))
            }
        }
    })
    .await;
    // Meanwhile a value the old field cannot hold is dead-lettered with the reason
    // (invariant 5), not lost.
    let dead = ctx
        .read_topic(&ctx.dlq_topic, 1, Duration::from_secs(60))
        .await;
    let letters: Vec<Value> = dead
        .iter()
        .map(|r| serde_json::from_slice(&r.payload).unwrap())
        .collect();
    assert!(
        letters
            .iter()
            .any(|l| l["event"]["after"]["price"] == "cheap"
                && l["reason"].as_str().is_some_and(|r| r.contains("price"))),
        "the row with price 'cheap' dead-lettered with a reason naming the field: {letters:?}"
    );
    let why = listed(&cluster, &alias)["needs_rebuild"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(why.starts_with("v1: "), "{why}");
    assert!(
        why.contains("type is double in the index, text wanted"),
        "{why}"
    );
    assert!(
        why.contains("analyzer is english in the index, standard wanted"),
        "{why}"
    );

    // A build makes a version with the new mapping; the mark goes with the old version.
    cluster.ctl(&["pipelines", "build", &alias]).unwrap();
    eventually("the build finishes", Duration::from_secs(120), || async {
        let s = cluster.ctl(&["pipelines", "status", &alias])?;
        if s["phase"] == "done" {
            Ok(())
        } else {
            Err(format!("{s}\n{}", cluster.logs()))
        }
    })
    .await;
    let v2 = format!("{alias}_v2");
    let settings = ctx.stack.es.get_settings(&v2).await.unwrap();
    assert_eq!(
        settings[&v2]["settings"]["index"]["refresh_interval"], "3s",
        "built with refreshes off, given the pipeline's interval before the swap"
    );
    let p = properties(&ctx, &v2).await;
    assert_eq!(p["price"]["type"], "text", "{p}");
    assert_eq!(p["title"]["analyzer"], "standard", "{p}");
    assert!(
        p["title"].get("copy_to").is_none(),
        "the override was replaced: {p}"
    );
    let after = listed(&cluster, &alias);
    assert_eq!(after["live_version"], 2, "{after}");
    assert_eq!(after["needs_rebuild"], "", "{after}");
    cluster
        .converges(&ctx, &docs.pipeline, Duration::from_secs(60))
        .await;
    drop(cluster);
    ctx.cleanup().await;
}
