//! Version history: the version a build replaces is kept current (the etl writes live
//! changes to it too), so `pipelines rollback` moves the alias back to an index equal to
//! the table, and forward again; `keep_history` bounds what is kept (older versions are
//! deleted), `drop-version` drops one, and what cannot be rolled back to is refused with
//! the reason.

use std::time::Duration;

use serde_json::Value;
use sluice_integration_tests::{eventually, Cluster, TestCtx};

const ROWS: u64 = 300;

/// Writes one round of changes: an insert, an update, a delete.
async fn change(ctx: &TestCtx, n: u64) {
    ctx.exec(&format!(
        "INSERT INTO items VALUES ({}, 'new {n}', {n})",
        ROWS + n
    ))
    .await;
    ctx.exec(&format!(
        "UPDATE items SET qty = qty + 1000, name = 'round {n}' WHERE id = {}",
        1 + (n * 37) % ROWS
    ))
    .await;
    ctx.exec(&format!(
        "DELETE FROM items WHERE id = {}",
        1 + (n * 53) % ROWS
    ))
    .await;
}

fn versions(p: &Value) -> (u64, Vec<u64>, Vec<u64>) {
    let list = |k: &str| -> Vec<u64> {
        p[k].as_array()
            .into_iter()
            .flatten()
            .filter_map(Value::as_u64)
            .collect()
    };
    (
        p["live_version"].as_u64().unwrap_or(0),
        list("history"),
        list("current_history"),
    )
}

async fn index_gone(ctx: &TestCtx, index: &str) {
    eventually(
        &format!("{index} is deleted"),
        Duration::from_secs(60),
        || async {
            match ctx.stack.es.index_exists(index).await {
                Ok(false) => Ok(()),
                other => Err(format!("{other:?}")),
            }
        },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replaced_version_is_kept_current_and_the_alias_rolls_back_and_forth() {
    let ctx = TestCtx::new("history").await;
    ctx.items_table(ROWS).await;
    let cluster = ctx.start_cluster(1, 2).await;
    let items = ctx.add_source(&cluster, "items", 1).await;
    let alias = items.pipeline.alias.clone();
    let v = |n: u32| format!("{alias}_v{n}");
    cluster
        .wait_running(&[&items], Duration::from_secs(30))
        .await;

    // Version 1 (streaming only), then a build: version 2 live, 1 kept current.
    ctx.exec("UPDATE items SET qty = -1 WHERE id = 1").await;
    eventually("version 1 exists", Duration::from_secs(60), || async {
        match ctx.stack.es.index_exists(&v(1)).await {
            Ok(true) => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
    let refused = cluster.ctl(&["pipelines", "rollback", &alias]).unwrap_err();
    assert!(refused.contains("no earlier version is kept"), "{refused}");
    // The first build replaces version 1, which holds only what streamed into it: kept,
    // but no rollback target.
    build(&cluster, &alias).await;
    let p = cluster.ctl(&["pipelines", "get", &alias]).unwrap();
    assert_eq!(versions(&p), (2, vec![1], vec![]), "{p}");
    let refused = cluster.ctl(&["pipelines", "rollback", &alias]).unwrap_err();
    assert!(refused.contains("build instead"), "{refused}");
    // The second keeps version 2 current; keep_history 1 deletes version 1.
    build(&cluster, &alias).await;
    let p = cluster.ctl(&["pipelines", "get", &alias]).unwrap();
    assert_eq!(versions(&p), (3, vec![2], vec![2]), "{p}");
    // Right after a swap, as an operator would: the etl members are taking up the new
    // history, and the rollback waits for them rather than refusing. Then forward again.
    let p = cluster.ctl(&["pipelines", "rollback", &alias]).unwrap();
    assert_eq!(versions(&p), (2, vec![3], vec![3]), "{p}");
    let p = cluster
        .ctl(&["pipelines", "rollback", &alias, "--to", "3"])
        .unwrap();
    assert_eq!(versions(&p), (3, vec![2], vec![2]), "{p}");
    index_gone(&ctx, &v(1)).await;

    // Changes after the swap reach the live version and the kept one alike.
    for n in 1..=20 {
        change(&ctx, n).await;
    }
    cluster.wait_equal(&ctx, "items", &alias).await;
    cluster.wait_equal(&ctx, "items", &v(2)).await;

    // Back to version 2: searches see the table; version 3 is kept current in turn.
    let p = cluster.ctl(&["pipelines", "rollback", &alias]).unwrap();
    assert_eq!(versions(&p), (2, vec![3], vec![3]), "{p}");
    assert_eq!(
        ctx.stack.es.alias_targets(&alias).await.unwrap(),
        [v(2)],
        "the alias moved back"
    );
    for n in 21..=40 {
        change(&ctx, n).await;
    }
    cluster.wait_equal(&ctx, "items", &alias).await;
    cluster.wait_equal(&ctx, "items", &v(3)).await;

    // What cannot be rolled back to is refused, naming why.
    for (args, reason) in [
        (vec!["--to", "2"], "live one already"),
        (vec!["--to", "1"], "not a kept version"),
    ] {
        let mut call = vec!["pipelines", "rollback", alias.as_str()];
        call.extend(args);
        let e = cluster.ctl(&call).unwrap_err();
        assert!(e.contains(reason), "{call:?}: {e}");
    }

    // Forward again.
    let p = cluster
        .ctl(&["pipelines", "rollback", &alias, "--to", "3"])
        .unwrap();
    assert_eq!(versions(&p), (3, vec![2], vec![2]), "{p}");
    change(&ctx, 41).await;
    cluster.wait_equal(&ctx, "items", &alias).await;
    cluster.wait_equal(&ctx, "items", &v(2)).await;

    // Dropping: not the live version; a kept one goes, index and all.
    let e = cluster
        .ctl(&["pipelines", "drop-version", &alias, "3"])
        .unwrap_err();
    assert!(e.contains("not a kept version"), "{e}");
    let p = cluster
        .ctl(&["pipelines", "drop-version", &alias, "2"])
        .unwrap();
    assert_eq!(versions(&p), (3, vec![], vec![]), "{p}");
    index_gone(&ctx, &v(2)).await;
    let e = cluster.ctl(&["pipelines", "rollback", &alias]).unwrap_err();
    assert!(e.contains("no earlier version is kept"), "{e}");
    cluster.wait_equal(&ctx, "items", &alias).await;
}

async fn build(cluster: &Cluster, alias: &str) {
    cluster
        .ctl(&["pipelines", "build", alias])
        .expect("build starts");
    cluster.wait_built(alias, Duration::from_secs(120)).await;
}

/// A build whose job keeps failing with an error only an operator can fix (here: a
/// relation's table renamed away) is marked failed with the reason after a few tries and
/// cleaned up, the alias untouched; fixed, the next build goes through.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_build_failing_for_good_is_marked_failed_and_the_alias_stays() {
    let ctx = TestCtx::new("buildfail").await;
    ctx.items_table(0).await;
    ctx.exec("CREATE TABLE notes (id BIGINT PRIMARY KEY, item_id BIGINT, body VARCHAR(40))")
        .await;
    let cluster = ctx.start_cluster(1, 1).await;
    let items = ctx.add_source(&cluster, "items", 1).await;
    let alias = items.pipeline.alias.clone();
    let spec = serde_json::json!({
        "source": items.name, "database": ctx.db, "table": "items",
        "relations": [{"name": "notes", "kind": "one_to_many", "table": "notes",
                       "on": {"id": "item_id"}}]
    });
    let path = ctx.dir.join("items.json");
    std::fs::write(&path, serde_json::to_vec(&spec).unwrap()).unwrap();
    cluster
        .ctl(&["pipelines", "put", &alias, "--spec", path.to_str().unwrap()])
        .expect("the tree pipeline is put");
    cluster
        .wait_running(&[&items], Duration::from_secs(30))
        .await;
    ctx.exec("INSERT INTO items VALUES (1, 'one', 1)").await;
    ctx.exec("INSERT INTO notes VALUES (10, 1, 'a note')").await;
    eventually(
        "version 1 has the document",
        Duration::from_secs(60),
        || async {
            match ctx.stack.es.count(&alias).await {
                Ok(1) => Ok(()),
                other => Err(format!("{other:?}\n{}", cluster.logs())),
            }
        },
    )
    .await;

    ctx.exec("RENAME TABLE notes TO notes_gone").await;
    cluster
        .ctl(&["pipelines", "build", &alias])
        .expect("build starts");
    let failed = eventually("the build fails", Duration::from_secs(120), || async {
        let s = cluster.ctl(&["pipelines", "status", &alias])?;
        if s["phase"] == "failed" {
            Ok(s)
        } else {
            Err(format!("{s}\n{}", cluster.logs()))
        }
    })
    .await;
    let reason = failed["message"].as_str().unwrap();
    assert!(
        reason.contains("failed 3 times") && reason.contains("notes"),
        "{failed}"
    );
    assert_eq!(failed["version"], 2, "{failed}");
    cluster
        .wait_event(&alias, "build", &["version 2 failed"])
        .await;
    assert_eq!(
        ctx.stack.es.alias_targets(&alias).await.unwrap(),
        [format!("{alias}_v1")],
        "the alias is untouched"
    );
    let p = cluster.ctl(&["pipelines", "get", &alias]).unwrap();
    assert_eq!(p["building_version"], 0, "{p}");
    index_gone(&ctx, &format!("{alias}_v2")).await;
    let e = cluster
        .ctl(&["pipelines", "status", &alias, "--wait"])
        .unwrap_err();
    assert!(e.contains("failed"), "--wait ends with the failure: {e}");

    // Fixed, a new build (version 3: versions are never reused) goes through.
    ctx.exec("RENAME TABLE notes_gone TO notes").await;
    build(&cluster, &alias).await;
    assert_eq!(
        ctx.stack.es.alias_targets(&alias).await.unwrap(),
        [format!("{alias}_v3")]
    );
    assert_eq!(ctx.stack.es.count(&alias).await.unwrap(), 1);
}
