//! DDL that changes existing rows without row events (an added column's default, a
//! dropped column): the pipeline is marked as needing a rebuild, with the reason, in
//! `sluicectl pipelines list|status`, in an event and in a metric, without waiting for a
//! row change; a build clears the mark; a pipeline with `auto_rebuild` builds by itself.
//! DDL that leaves rows as they were (an index, a nullable column) marks nothing. An
//! online schema change's shadow table swapped in by RENAME, and DROP + CREATE with the
//! same name, mark it too, while streaming goes on on the new table.

use std::time::Duration;

use serde_json::Value;
use sluice_integration_tests::on_sources;
use sluice_integration_tests::{
    check_table, eventually, sample, CheckOptions, Cluster, ClusterSource, TestCtx,
};

const ROWS: u32 = 100;

/// The pipeline as `sluicectl pipelines list` shows it.
fn listed(cluster: &Cluster, name: &str) -> Value {
    let all = cluster.ctl(&["pipelines", "list"]).expect("pipelines list");
    all.as_array()
        .and_then(|a| a.iter().find(|p| p["name"] == name).cloned())
        .unwrap_or_else(|| panic!("{name} not listed: {all}"))
}

/// `sluice_center_pipeline_needs_rebuild` of `pipeline` on the leading center.
async fn needs_rebuild_metric(cluster: &Cluster, pipeline: &str) -> Result<f64, String> {
    let label = format!("pipeline=\"{pipeline}\"");
    for center in &cluster.centers {
        let m = center.metrics().await?;
        if sample(&m, "sluice_center_leader", &[]) == Some(1.0) {
            return sample(&m, "sluice_center_pipeline_needs_rebuild", &[&label])
                .ok_or_else(|| format!("no needs_rebuild series for {pipeline}"));
        }
    }
    Err("no center leads".into())
}

/// Creates `table` with `ROWS` rows.
async fn table_with_rows(ctx: &TestCtx, table: &str) {
    ctx.exec(&format!(
        "CREATE TABLE {table} (id INT PRIMARY KEY, name VARCHAR(32), legacy INT)"
    ))
    .await;
    let values: Vec<String> = (1..=ROWS).map(|i| format!("({i}, 'n{i}', {i})")).collect();
    ctx.exec(&format!("INSERT INTO {table} VALUES {}", values.join(",")))
        .await;
}

/// Waits until `pipeline`'s `needs_rebuild` contains `words`; returns it.
async fn marked(cluster: &Cluster, pipeline: &str, words: &str) -> String {
    eventually(
        &format!("{pipeline} marked as needing a rebuild"),
        Duration::from_secs(60),
        || async {
            let why = listed(cluster, pipeline)["needs_rebuild"]
                .as_str()
                .unwrap_or_default()
                .to_owned();
            if why.contains(words) {
                Ok(why)
            } else {
                Err(format!("needs_rebuild: {why:?}\n{}", cluster.logs()))
            }
        },
    )
    .await
}

async fn build(cluster: &Cluster, source: &ClusterSource) {
    let alias = &source.pipeline.alias;
    cluster.ctl(&["pipelines", "build", alias]).unwrap();
    cluster.wait_built(alias, Duration::from_secs(120)).await;
}

on_sources!(ddl_that_rewrites_rows_marks_the_pipeline_and_auto_rebuild_builds_it: mariadb, mysql);
async fn ddl_that_rewrites_rows_marks_the_pipeline_and_auto_rebuild_builds_it() {
    let ctx = TestCtx::new("ddlrw").await;
    for table in ["items", "goods"] {
        table_with_rows(&ctx, table).await;
    }
    let cluster = ctx.start_cluster(1, 1).await;
    let items = ctx.add_source(&cluster, "items", 1).await;
    let goods = ctx.add_source(&cluster, "goods", 2).await;
    let put = ctx
        .put_pipeline(&cluster, &goods, &["--auto-rebuild"])
        .unwrap();
    assert_eq!(put["auto_rebuild"], true, "{put}");
    cluster
        .wait_running(&[&items, &goods], Duration::from_secs(30))
        .await;
    build(&cluster, &items).await;
    build(&cluster, &goods).await;
    for p in [&items, &goods] {
        cluster
            .converges(&ctx, &p.pipeline, Duration::from_secs(60))
            .await;
    }
    let (ia, ga) = (&items.pipeline.alias, &goods.pipeline.alias);
    assert_eq!(listed(&cluster, ia)["needs_rebuild"], "");

    // Rows left as they were: an index, a nullable column (NULL is what documents without
    // the field say). Then a column whose default every existing row takes, with no row
    // change after it: only that one is named.
    ctx.exec("ALTER TABLE items ADD INDEX by_name (name), ADD COLUMN note VARCHAR(16) NULL")
        .await;
    ctx.exec("ALTER TABLE items ADD COLUMN c VARCHAR(8) NOT NULL DEFAULT 'x'")
        .await;
    let why = marked(&cluster, ia, "column `c` added with DEFAULT x").await;
    assert!(why.starts_with("v2: "), "the live version: {why}");
    assert!(!why.contains("note") && !why.contains("by_name"), "{why}");
    let status = cluster.ctl(&["pipelines", "status", ia]).unwrap();
    assert_eq!(status["needs_rebuild"], why.as_str(), "{status}");
    cluster.wait_event(ia, "rebuild", &["column `c`"]).await;
    eventually("the metric says so", Duration::from_secs(30), || async {
        match (
            needs_rebuild_metric(&cluster, ia).await?,
            needs_rebuild_metric(&cluster, ga).await?,
        ) {
            (1.0, 0.0) => Ok(()),
            other => Err(format!("{ia}, {ga}: {other:?}")),
        }
    })
    .await;
    // The mark is true: documents lack `c` until a build.
    let stale = check_table(&ctx, "items", ia, &CheckOptions::default()).await;
    assert!(
        stale
            .as_ref()
            .is_err_and(|e| e.contains("column `c` (varchar): MySQL \"x\" vs document null")),
        "{stale:?}"
    );
    assert_eq!(
        listed(&cluster, ia)["live_version"],
        2,
        "no auto_rebuild: no build"
    );
    build(&cluster, &items).await;
    cluster
        .converges(&ctx, &items.pipeline, Duration::from_secs(60))
        .await;
    assert_eq!(listed(&cluster, ia)["needs_rebuild"], "");
    eventually("the metric clears", Duration::from_secs(30), || async {
        match needs_rebuild_metric(&cluster, ia).await? {
            0.0 => Ok(()),
            v => Err(format!("{v}")),
        }
    })
    .await;

    // auto_rebuild: a dropped column's values leave the documents by themselves.
    ctx.exec("ALTER TABLE goods DROP COLUMN legacy").await;
    cluster
        .wait_event(ga, "rebuild", &["auto_rebuild", "column `legacy` dropped"])
        .await;
    eventually(
        "goods rebuilt by itself",
        Duration::from_secs(120),
        || async {
            let p = listed(&cluster, ga);
            if p["live_version"] == 3 && p["building_version"] == 0 && p["needs_rebuild"] == "" {
                Ok(())
            } else {
                Err(format!("{p}\n{}", cluster.logs()))
            }
        },
    )
    .await;
    // Exactly: no document keeps `legacy`.
    cluster
        .converges(&ctx, &goods.pipeline, Duration::from_secs(60))
        .await;
    drop(cluster);
    ctx.cleanup().await;
}

on_sources!(a_swap_by_rename_and_a_drop_and_create_mark_the_pipeline_while_streaming_goes_on: mariadb, mysql);
async fn a_swap_by_rename_and_a_drop_and_create_mark_the_pipeline_while_streaming_goes_on() {
    let ctx = TestCtx::new("ddlswap").await;
    for table in ["items", "orders"] {
        table_with_rows(&ctx, table).await;
    }
    let cluster = ctx.start_cluster(1, 1).await;
    let items = ctx.add_source(&cluster, "items", 1).await;
    let orders = ctx.add_source(&cluster, "orders", 2).await;
    cluster
        .wait_running(&[&items, &orders], Duration::from_secs(30))
        .await;
    for p in [&items, &orders] {
        build(&cluster, p).await;
        cluster
            .converges(&ctx, &p.pipeline, Duration::from_secs(60))
            .await;
    }
    let (ia, oa) = (&items.pipeline.alias, &orders.pipeline.alias);

    // An online schema change as gh-ost makes it: a shadow table altered and filled, then
    // swapped in by one RENAME. Changes go on streaming on the table swapped in.
    ctx.exec("CREATE TABLE _items_gho LIKE items").await;
    ctx.exec("ALTER TABLE _items_gho ADD COLUMN c VARCHAR(8) NOT NULL DEFAULT 'x'")
        .await;
    ctx.exec("INSERT INTO _items_gho (id, name, legacy) SELECT id, name, legacy FROM items")
        .await;
    ctx.exec("RENAME TABLE items TO _items_del, _items_gho TO items")
        .await;
    ctx.exec("UPDATE items SET name = 'after' WHERE id = 1")
        .await;
    let why = marked(&cluster, ia, "_items_gho (renamed in its place)").await;
    assert!(why.starts_with("v2: "), "{why}");
    eventually(
        "the swapped-in table streams",
        Duration::from_secs(60),
        || async {
            let docs = ctx
                .stack
                .es
                .mget(ia, &["1".to_owned()])
                .await
                .map_err(|e| e.to_string())?;
            match docs.first() {
                Some(Some(d)) if d["name"] == "after" && d["c"] == "x" => Ok(()),
                other => Err(format!("{other:?}")),
            }
        },
    )
    .await;
    build(&cluster, &items).await;
    cluster
        .converges(&ctx, &items.pipeline, Duration::from_secs(60))
        .await;
    assert_eq!(listed(&cluster, ia)["needs_rebuild"], "");

    // DROP + CREATE with the same name: the old rows' documents stay until a build.
    ctx.exec("DROP TABLE orders").await;
    ctx.exec("CREATE TABLE orders (id INT PRIMARY KEY, name VARCHAR(32), legacy INT)")
        .await;
    ctx.exec("INSERT INTO orders VALUES (1, 'new', 1)").await;
    marked(&cluster, oa, "dropped").await;
    // Every old row's document is still there (the new row 1 overwrites one of them).
    let stale = check_table(&ctx, "orders", oa, &CheckOptions::default()).await;
    assert!(
        stale
            .as_ref()
            .is_err_and(|e| e.contains(&format!("{ROWS} documents for"))),
        "documents of dropped rows remain: {stale:?}"
    );
    build(&cluster, &orders).await;
    cluster
        .converges(&ctx, &orders.pipeline, Duration::from_secs(60))
        .await;
    assert_eq!(listed(&cluster, oa)["needs_rebuild"], "");
    drop(cluster);
    ctx.cleanup().await;
}
