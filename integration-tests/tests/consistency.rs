//! Consistency check and repair: documents corrupted behind Sluice's back (deleted,
//! altered, orphans added straight into Elasticsearch) while the table keeps changing are
//! found exactly by `pipelines check`, chunk by chunk on two workers; `--repair` puts
//! them right through the etl; a check after that is clean and the index equals the
//! table.

use std::time::Duration;

use serde_json::{json, Value};
use sluice_elastic::BulkOp;
use sluice_integration_tests::on_sources;
use sluice_integration_tests::{check_table, eventually, CheckOptions, Tamper, TestCtx};

/// Rows: three check chunks (5,000 root keys each).
const ROWS: u64 = 12_000;
/// Keys the writer keeps changing while the checks run (never corrupted).
const BUSY: std::ops::RangeInclusive<u64> = 1..=400;
const DELETED: std::ops::RangeInclusive<u64> = 5_001..=5_010;
const ALTERED: std::ops::RangeInclusive<u64> = 9_001..=9_008;
const ORPHANS: std::ops::RangeInclusive<u64> = 50_001..=50_006;

fn counts(c: &Value) -> (u64, u64, u64) {
    let n = |k: &str| c[k].as_u64().unwrap_or(u64::MAX);
    (n("missing"), n("extra"), n("different"))
}

on_sources!(a_check_finds_exactly_what_was_corrupted_and_repair_puts_it_right: mariadb, mariadb_watermarks, mysql);
async fn a_check_finds_exactly_what_was_corrupted_and_repair_puts_it_right() {
    let ctx = TestCtx::new("consistency").await;
    ctx.items_table(ROWS).await;
    let mut cluster = ctx.start_cluster(1, 2).await;
    let items = ctx.add_source(&cluster, "items", 1).await;
    let alias = items.pipeline.alias.clone();
    cluster
        .wait_running(&[&items], Duration::from_secs(30))
        .await;
    cluster
        .ctl(&["pipelines", "build", &alias])
        .expect("build starts");
    cluster.wait_built(&alias, Duration::from_secs(180)).await;
    let index = format!("{alias}_v2");

    let clean = cluster.check(&alias, &[]).await;
    assert_eq!(clean["state"], "done", "{clean}");
    assert_eq!(
        counts(&clean),
        (0, 0, 0),
        "a fresh build is consistent: {clean}"
    );
    assert_eq!(clean["documents"].as_u64(), Some(ROWS), "{clean}");
    assert_eq!(clean["chunks"].as_u64(), Some(3), "{clean}");

    // The table keeps changing while the index is corrupted and checked.
    let writer = ctx.load(Duration::ZERO, |n| {
        let id = BUSY.start() + (n * 37) % (BUSY.end() - BUSY.start() + 1);
        vec![
            format!("UPDATE items SET qty = qty + 1, name = 'busy {n}' WHERE id = {id}"),
            format!("INSERT INTO items VALUES ({}, 'new {n}', {n})", 100_000 + n),
        ]
    });

    // Behind Sluice's back: deleted, altered, and orphans that match no row.
    let es = &ctx.stack.es;
    let ids = |r: std::ops::RangeInclusive<u64>| r.map(|i| i.to_string()).collect::<Vec<_>>();
    let changes: Vec<(String, Tamper)> = ids(DELETED)
        .into_iter()
        .map(|id| (id, Tamper::Delete))
        .chain(
            ids(ALTERED)
                .into_iter()
                .map(|id| (id, Tamper::Set("name", json!("tampered")))),
        )
        .collect();
    ctx.tamper(&index, &changes).await;
    let orphans: Vec<BulkOp> = ORPHANS
        .map(|id| BulkOp::Index {
            index: index.clone(),
            id: id.to_string(),
            version: 1,
            routing: None,
            doc: json!({"id": id, "name": "ghost", "qty": 0}),
        })
        .collect();
    let outcomes = es.bulk(&orphans).await.expect("orphans written");
    assert!(outcomes.iter().all(|o| o.is_done()), "{outcomes:?}");
    es.refresh(&index).await.unwrap();

    let expected = (
        DELETED.count() as u64,
        ORPHANS.count() as u64,
        ALTERED.count() as u64,
    );
    let found = cluster.check(&alias, &[]).await;
    assert_eq!(found["state"], "done", "{found}");
    assert_eq!(
        counts(&found),
        expected,
        "exactly what was corrupted: {found}\n{}",
        cluster.logs()
    );
    let examples: Vec<(String, String)> = found["examples"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            (
                e["kind"].as_str().unwrap().to_owned(),
                e["id"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    assert!(
        examples.contains(&("missing".into(), "5001".into())),
        "{found}"
    );
    assert!(
        examples.contains(&("extra".into(), "50001".into())),
        "{found}"
    );
    assert!(
        examples.contains(&("different".into(), "9001".into())),
        "{found}"
    );
    assert_eq!(
        found["repaired"].as_u64(),
        Some(0),
        "not asked to repair: {found}"
    );
    let still = es.mget(&index, &ids(DELETED)).await.unwrap();
    assert!(
        still.iter().all(Option::is_none),
        "a check without --repair changes nothing"
    );

    let repaired = cluster.check(&alias, &["--repair"]).await;
    assert_eq!(counts(&repaired), expected, "{repaired}");
    assert_eq!(
        repaired["repaired"].as_u64(),
        Some(expected.0 + expected.1 + expected.2),
        "{repaired}"
    );

    assert!(
        writer.stop().await > 0,
        "the table changed during the checks"
    );
    eventually(
        "the index equals the table",
        Duration::from_secs(60),
        || async {
            check_table(&ctx, "items", &alias, &CheckOptions::default())
                .await
                .map_err(|e| format!("{e}\n{}", cluster.logs()))
        },
    )
    .await;
    let after = cluster.check(&alias, &[]).await;
    assert_eq!(counts(&after), (0, 0, 0), "clean after the repair: {after}");

    // A lagging etl is not drift: changes it has not applied yet when a chunk is read are
    // waited for, not reported. The etl is stopped for a while (the fault), changes are
    // made, and a check runs across it.
    cluster.etl.signal("STOP");
    ctx.exec("UPDATE items SET name = 'late' WHERE id BETWEEN 11001 AND 11030")
        .await;
    let started = cluster.ctl(&["pipelines", "check", &alias]).unwrap();
    let id = started[0]["id"].as_u64().unwrap();
    eventually("the check is planned", Duration::from_secs(30), || async {
        let list = cluster
            .ctl(&["pipelines", "checks", &alias])
            .map_err(|e| e.to_string())?;
        match list[0]["chunks"].as_u64() {
            Some(n) if n > 0 && list[0]["id"].as_u64() == Some(id) => Ok(()),
            _ => Err(list.to_string()),
        }
    })
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await; // the fault's length, not a wait
    cluster.etl.signal("CONT");
    let lagged = eventually(
        "the check across the stopped etl ends",
        Duration::from_secs(120),
        || async {
            let list = cluster
                .ctl(&["pipelines", "checks", &alias])
                .map_err(|e| e.to_string())?;
            match list[0]["state"].as_str() {
                Some("running") => Err(list.to_string()),
                _ => Ok(list[0].clone()),
            }
        },
    )
    .await;
    assert_eq!(lagged["state"], "done", "{lagged}");
    assert_eq!(
        counts(&lagged),
        (0, 0, 0),
        "changes the etl had yet to apply are not drift: {lagged}"
    );

    let list = cluster.ctl(&["pipelines", "checks", &alias]).unwrap();
    let states: Vec<&str> = list
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["state"].as_str().unwrap())
        .collect();
    assert_eq!(states, ["done"; 5], "newest first, all kept: {list}");
    let events = cluster
        .ctl(&["events", "--subject", &alias])
        .unwrap_or_default();
    assert!(
        events
            .to_string()
            .contains("10 missing, 6 extra, 8 different"),
        "{events}"
    );
}

on_sources!(a_windowed_check_looks_only_at_recently_changed_roots: mariadb, mariadb_watermarks);
/// A check of a window (`--since`) looks only at roots whose `check.updated_column` is
/// that recent: drift in an old row is left to the full check.
async fn a_windowed_check_looks_only_at_recently_changed_roots() {
    let ctx = TestCtx::new("checkwindow").await;
    ctx.exec(
        "CREATE TABLE stamped (id BIGINT PRIMARY KEY, name VARCHAR(40), \
         updated_at TIMESTAMP(3) NOT NULL DEFAULT CURRENT_TIMESTAMP(3) ON UPDATE CURRENT_TIMESTAMP(3))",
    )
    .await;
    let old: Vec<String> = (1..=300)
        .map(|i| format!("({i}, 'old {i}', '2020-01-01 00:00:00')"))
        .collect();
    ctx.exec(&format!("INSERT INTO stamped VALUES {}", old.join(", ")))
        .await;
    let recent: Vec<String> = (301..=400)
        .map(|i| format!("({i}, 'new {i}', NOW(3))"))
        .collect();
    ctx.exec(&format!("INSERT INTO stamped VALUES {}", recent.join(", ")))
        .await;
    let cluster = ctx.start_cluster(1, 1).await;
    let source = ctx.add_source(&cluster, "stamped", 1).await;
    let alias = source.pipeline.alias.clone();
    let spec = json!({
        "source": source.name, "database": ctx.db, "table": "stamped",
        "check": {"updated_column": "updated_at"}
    });
    let path = ctx.dir.join("stamped.json");
    std::fs::write(&path, serde_json::to_vec(&spec).unwrap()).unwrap();
    cluster
        .ctl(&["pipelines", "put", &alias, "--spec", path.to_str().unwrap()])
        .expect("the pipeline with a check column is put");
    cluster
        .wait_running(&[&source], Duration::from_secs(30))
        .await;
    cluster
        .ctl(&["pipelines", "build", &alias])
        .expect("build starts");
    cluster.wait_built(&alias, Duration::from_secs(120)).await;

    // One old and one recent document altered behind Sluice's back.
    let index = format!("{alias}_v2");
    let altered = ["10", "350"].map(|id| (id.to_owned(), Tamper::Set("name", json!("tampered"))));
    ctx.tamper(&index, &altered).await;

    let window = cluster.check(&alias, &["--since", "1h"]).await;
    assert_eq!(window["state"], "done", "{window}");
    assert_eq!(
        window["documents"].as_u64(),
        Some(100),
        "only the recent roots: {window}"
    );
    assert_eq!(counts(&window), (0, 0, 1), "{window}");
    assert_eq!(window["examples"][0]["id"], "350", "{window}");
    let full = cluster.check(&alias, &[]).await;
    assert_eq!(counts(&full), (0, 0, 2), "{full}");

    let refused = cluster
        .ctl(&["pipelines", "check", &alias, "--since", "a while"])
        .unwrap_err();
    assert!(refused.contains("not a duration"), "{refused}");

    // A daily schedule whose time of day has come runs once, by itself, with the spec's
    // window and repair.
    let minute = (sluice_model::now_ms() / 60_000) % 1440;
    let spec = json!({
        "source": source.name, "database": ctx.db, "table": "stamped",
        "check": {"updated_column": "updated_at", "daily_at": format!("{:02}:{:02}", minute / 60, minute % 60),
                  "since": "1h", "repair": true}
    });
    std::fs::write(&path, serde_json::to_vec(&spec).unwrap()).unwrap();
    cluster
        .ctl(&["pipelines", "put", &alias, "--spec", path.to_str().unwrap()])
        .expect("the schedule is put");
    let scheduled = eventually(
        "the scheduled check ran",
        Duration::from_secs(60),
        || async {
            let list = cluster
                .ctl(&["pipelines", "checks", &alias])
                .map_err(|e| e.to_string())?;
            match list
                .as_array()
                .and_then(|l| l.iter().find(|c| c["trigger"] == "schedule"))
            {
                Some(c) if c["state"] == "done" => Ok(c.clone()),
                other => Err(format!("{other:?}")),
            }
        },
    )
    .await;
    assert_eq!(scheduled["since"], "1h", "{scheduled}");
    assert_eq!(counts(&scheduled), (0, 0, 1), "{scheduled}");
    assert_eq!(scheduled["repaired"].as_u64(), Some(1), "{scheduled}");
    let list = cluster.ctl(&["pipelines", "checks", &alias]).unwrap();
    let by_schedule = list
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c["trigger"] == "schedule")
        .count();
    assert_eq!(by_schedule, 1, "once a day: {list}");
}

on_sources!(a_check_reads_text_keys_in_order: mariadb, mariadb_watermarks);
/// A text primary key: the index is read in key order on its `keyword` sub-field, chunk
/// by chunk (several chunks, so the key ranges matter), and finds exactly what differs.
async fn a_check_reads_text_keys_in_order() {
    let ctx = TestCtx::new("checktext").await;
    // Byte order, as the keyword sub-field sorts; text an analyzer would split.
    ctx.exec("CREATE TABLE codes (code VARCHAR(20) COLLATE utf8mb4_bin PRIMARY KEY, qty INT)")
        .await;
    let rows: Vec<String> = (0..12_000).map(|i| format!("('K-{i:06}', {i})")).collect();
    ctx.exec(&format!("INSERT INTO codes VALUES {}", rows.join(", ")))
        .await;
    let cluster = ctx.start_cluster(1, 2).await;
    let source = ctx.add_source(&cluster, "codes", 1).await;
    let alias = source.pipeline.alias.clone();
    cluster
        .wait_running(&[&source], Duration::from_secs(30))
        .await;
    cluster
        .ctl(&["pipelines", "build", &alias])
        .expect("build starts");
    cluster.wait_built(&alias, Duration::from_secs(180)).await;

    let index = format!("{alias}_v2");
    let altered = ["K-000007", "K-006001", "K-011999"]
        .map(|id| (id.to_owned(), Tamper::Set("qty", json!(-1))));
    ctx.tamper(&index, &altered).await;

    let found = cluster.check(&alias, &[]).await;
    assert_eq!(found["state"], "done", "{found}");
    assert_eq!(found["chunks"].as_u64(), Some(3), "{found}");
    assert_eq!(
        found["documents"].as_u64(),
        Some(12_000),
        "each document once: {found}"
    );
    assert_eq!(counts(&found), (0, 0, 3), "{found}");
}
