//! Verified swaps (a dual run): `pipelines build --verify` holds the new version once it
//! caught up, the alias untouched and both versions taking live changes; `pipelines
//! compare` judges the held version against MySQL (exactly what was corrupted in it) and
//! sets it beside the live one (what differs between them, including drift of the live
//! one); `pipelines swap` moves the alias only after a clean compare, or with `--force`.

use std::time::Duration;

use serde_json::{json, Value};
use sluice_integration_tests::on_sources;
use sluice_integration_tests::{eventually, Cluster, Tamper, TestCtx};

/// Rows: two compare chunks (5,000 root keys each).
const ROWS: u64 = 6_000;
/// Keys the writer keeps changing while the versions are compared (never corrupted).
const BUSY: std::ops::RangeInclusive<u64> = 1..=300;
/// Corrupted in the held version: deleted, altered.
const DELETED: std::ops::RangeInclusive<u64> = 1_001..=1_003;
const ALTERED: std::ops::RangeInclusive<u64> = 5_501..=5_502;
/// Altered in the live version.
const LIVE_ALTERED: u64 = 3_001;

/// Runs a compare (`extra`: more arguments) to its end; returns it as `pipelines checks`
/// shows it.
async fn compare(cluster: &Cluster, alias: &str, extra: &[&str]) -> Value {
    let mut args = vec!["pipelines", "compare", alias];
    args.extend(extra);
    let started = cluster.ctl(&args).expect("the compare starts");
    let id = started[0]["id"].as_u64().expect("a compare id");
    assert_eq!(started[0]["kind"], "compare", "{started}");
    let list = ["pipelines", "checks", alias, "--kind", "compare"];
    cluster
        .wait_run_ended(&list, id, Duration::from_secs(180))
        .await
}

/// `(missing, extra, different)` against MySQL, `(only new, only live, different)`
/// against the live version.
fn verdicts(c: &Value) -> ((u64, u64, u64), (u64, u64, u64)) {
    let n = |v: &Value, k: &str| v[k].as_u64().unwrap_or(u64::MAX);
    let live = &c["live"];
    (
        (n(c, "missing"), n(c, "extra"), n(c, "different")),
        (
            n(live, "only_new"),
            n(live, "only_live"),
            n(live, "different"),
        ),
    )
}

fn example_ids(list: &Value, kind: &str) -> Vec<String> {
    let mut ids: Vec<String> = list
        .as_array()
        .into_iter()
        .flatten()
        .filter(|e| e["kind"] == kind)
        .map(|e| e["id"].as_str().unwrap().to_owned())
        .collect();
    ids.sort();
    ids
}

on_sources!(a_verified_build_is_held_compared_and_swapped_only_when_clean: mariadb, mariadb_watermarks, mysql);
async fn a_verified_build_is_held_compared_and_swapped_only_when_clean() {
    let ctx = TestCtx::new("verified").await;
    ctx.items_table(ROWS).await;
    let cluster = ctx.start_cluster(1, 2).await;
    let items = ctx.add_source(&cluster, "items", 1).await;
    let alias = items.pipeline.alias.clone();
    let v = |n: u32| format!("{alias}_v{n}");
    cluster
        .wait_running(&[&items], Duration::from_secs(30))
        .await;
    cluster.ctl(&["pipelines", "build", &alias]).unwrap();
    cluster.wait_built(&alias, Duration::from_secs(180)).await;

    // Nothing held: nothing to compare or swap.
    let e = cluster.ctl(&["pipelines", "compare", &alias]).unwrap_err();
    assert!(e.contains("no build held"), "{e}");

    // Held once caught up; the alias stays on version 2.
    let held = cluster
        .ctl(&["pipelines", "build", &alias, "--verify", "--wait"])
        .unwrap();
    assert_eq!(held["phase"], "held", "{held}");
    assert_eq!(held["version"], 3, "{held}");
    assert!(
        held["message"]
            .as_str()
            .unwrap()
            .contains("pipelines compare"),
        "{held}"
    );
    assert_eq!(ctx.stack.es.alias_targets(&alias).await.unwrap(), [v(2)]);
    cluster
        .wait_event(&alias, "build", &["version 3", "held for verification"])
        .await;

    // Both versions take live changes while held.
    ctx.exec(&format!(
        "INSERT INTO items VALUES ({}, 'after the hold', 1)",
        ROWS + 1
    ))
    .await;
    ctx.exec("UPDATE items SET name = 'changed while held' WHERE id = 4000")
        .await;
    ctx.exec("DELETE FROM items WHERE id = 4001").await;
    cluster.wait_equal(&ctx, "items", &v(2)).await;
    cluster.wait_equal(&ctx, "items", &v(3)).await;

    let e = cluster.ctl(&["pipelines", "swap", &alias]).unwrap_err();
    assert!(e.contains("not compared yet"), "{e}");

    // Drift in each version, behind Sluice's back, while the table keeps changing.
    let held: Vec<(String, Tamper)> = DELETED
        .map(|id| (id.to_string(), Tamper::Delete))
        .chain(ALTERED.map(|id| (id.to_string(), Tamper::Set("name", json!("tampered")))))
        .collect();
    ctx.tamper(&v(3), &held).await;
    let live = [(
        LIVE_ALTERED.to_string(),
        Tamper::Set("name", json!("live drift")),
    )];
    ctx.tamper(&v(2), &live).await;
    let writer = ctx.load(Duration::ZERO, |n| {
        let id = BUSY.start() + (n * 37) % (BUSY.end() - BUSY.start() + 1);
        vec![format!(
            "UPDATE items SET qty = qty + 1, name = 'busy {n}' WHERE id = {id}"
        )]
    });

    let found = compare(&cluster, &alias, &[]).await;
    assert_eq!(found["state"], "done", "{found}");
    assert_eq!(found["version"], 3, "{found}");
    assert_eq!(
        verdicts(&found),
        ((3, 0, 2), (0, 3, 3)),
        "against MySQL: exactly the held version's corruption; against the live one: \
         that, and the live version's own drift: {found}\n{}",
        cluster.logs()
    );
    assert_eq!(found["live"]["version"], 2, "{found}");
    let live = &found["live"];
    assert_eq!(
        live["same"].as_u64().unwrap() + live["skipped"].as_u64().unwrap(),
        ROWS - 6,
        "every other document is the same in both, or was changed while compared: {found}"
    );
    assert_eq!(
        example_ids(&found["examples"], "missing"),
        ["1001", "1002", "1003"]
    );
    assert_eq!(
        example_ids(&found["live"]["examples"], "different"),
        ["3001", "5501", "5502"]
    );
    let e = cluster.ctl(&["pipelines", "swap", &alias]).unwrap_err();
    assert!(e.contains("differs from MySQL"), "{e}");
    assert_eq!(ctx.stack.es.alias_targets(&alias).await.unwrap(), [v(2)]);

    // Repaired, compared again: clean against MySQL; the live version's drift is still
    // reported beside it, and is no reason to hold the new one.
    let repaired = compare(&cluster, &alias, &["--repair"]).await;
    assert_eq!(repaired["repaired"], 5, "{repaired}");
    let clean = eventually(
        "a compare after the repair is clean",
        Duration::from_secs(120),
        || async {
            let c = compare(&cluster, &alias, &[]).await;
            match verdicts(&c) {
                ((0, 0, 0), (0, 0, 1)) => Ok(c),
                _ => Err(c.to_string()),
            }
        },
    )
    .await;
    assert_eq!(
        example_ids(&clean["live"]["examples"], "different"),
        [LIVE_ALTERED.to_string()]
    );
    assert!(writer.stop().await > 0, "the table changed");

    let released = cluster.ctl(&["pipelines", "swap", &alias]).unwrap();
    assert!(
        released["message"].as_str().unwrap().contains("compare"),
        "{released}"
    );
    cluster.wait_built(&alias, Duration::from_secs(60)).await;
    assert_eq!(ctx.stack.es.alias_targets(&alias).await.unwrap(), [v(3)]);
    cluster.wait_equal(&ctx, "items", &alias).await;
    cluster
        .wait_event(&alias, "build", &["swap to version 3 released", "compare"])
        .await;

    // --force moves the alias without a compare.
    cluster
        .ctl(&["pipelines", "build", &alias, "--verify", "--wait"])
        .unwrap();
    let e = cluster.ctl(&["pipelines", "swap", &alias]).unwrap_err();
    assert!(e.contains("version 4 was not compared"), "{e}");
    cluster
        .ctl(&["pipelines", "swap", &alias, "--force", "--wait"])
        .unwrap();
    assert_eq!(ctx.stack.es.alias_targets(&alias).await.unwrap(), [v(4)]);
    cluster.wait_equal(&ctx, "items", &alias).await;
    cluster
        .wait_event(&alias, "build", &["swap to version 4 released (force)"])
        .await;
}
