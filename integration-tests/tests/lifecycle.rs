//! Graceful lifecycle (issue 5): on SIGTERM readiness turns false first, the service
//! drains (the worker finishes the open transaction and confirms its position, the etl
//! applies and commits the batch in hand) and exits 0; a second signal exits at once.
//! After a SIGTERM mid-load and a restart nothing is lost and nothing is replayed.

use std::collections::{BTreeMap, BTreeSet};
use std::io::Read as _;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use mysql_async::prelude::*;
use sluice_integration_tests::{eventually, Service, TestCtx};
use sluice_model::ChangeEvent;

const STATEMENTS: u64 = 1200;

/// `needle` was logged, and before `later`.
fn logged_before(s: &Service, needle: &str, later: &str) {
    let log = std::fs::read_to_string(&s.log).unwrap_or_default();
    let (a, b) = (log.rfind(needle), log.rfind(later));
    assert!(
        matches!((a, b), (Some(a), Some(b)) if a < b),
        "{}: `{needle}` should come before `{later}`:\n{}",
        s.bin,
        s.log_tail()
    );
}

/// The restarted etl's count of stale bulk items (a replayed event would be one).
async fn stale(etl: &Service) -> f64 {
    let m = etl.metrics().await.expect("etl metrics");
    m.iter()
        .find(|(k, _)| {
            k.starts_with("sluice_etl_documents_total") && k.contains("result=\"stale\"")
        })
        .map_or(0.0, |(_, v)| *v)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_mid_load_then_restart_loses_and_replays_nothing() {
    let ctx = TestCtx::new("lifecycle").await;
    ctx.exec("CREATE TABLE ledger (id INT PRIMARY KEY, v BIGINT)")
        .await;
    let pipeline = ctx.pipeline("ledger");
    let mut run = ctx.start(std::slice::from_ref(&pipeline)).await;

    // Single-row statements, each changing exactly one row: as many row events.
    let done = Arc::new(AtomicU64::new(0));
    let load = {
        let (pool, db, done) = (ctx.stack.mysql.clone(), ctx.db.clone(), done.clone());
        tokio::spawn(async move {
            let mut conn = pool.get_conn().await.unwrap();
            conn.query_drop(format!("USE `{db}`")).await.unwrap();
            for i in 0..STATEMENTS {
                let sql = match i % 4 {
                    0 | 1 => format!("INSERT INTO ledger VALUES ({i}, {i})"),
                    2 => format!("UPDATE ledger SET v = v + 1 WHERE id = {}", i - 2),
                    _ => format!("DELETE FROM ledger WHERE id = {}", i - 2),
                };
                conn.query_drop(sql).await.unwrap();
                assert_eq!(conn.affected_rows(), 1, "statement {i}");
                done.fetch_add(1, Ordering::Relaxed);
                tokio::time::sleep(Duration::from_millis(5)).await; // pacing the load
            }
        })
    };
    let reached = |n: u64| {
        let done = done.clone();
        move || {
            let done = done.clone();
            async move {
                let d = done.load(Ordering::Relaxed);
                if d >= n {
                    Ok(())
                } else {
                    Err(format!("{d} statements"))
                }
            }
        }
    };

    // The etl first: it applies and commits what it holds, then a new one goes on.
    eventually(
        "a third of the load",
        Duration::from_secs(60),
        reached(STATEMENTS / 3),
    )
    .await;
    let status = run.etl.terminate(Duration::from_secs(30));
    assert!(
        status.success(),
        "etl exit: {status:?}\n{}",
        run.etl.log_tail()
    );
    logged_before(&run.etl, "not ready any more; draining", "etl stopped");
    run.etl.start();

    // Then the worker: it finishes the open transaction and confirms where it is.
    eventually(
        "two thirds of the load",
        Duration::from_secs(60),
        reached(2 * STATEMENTS / 3),
    )
    .await;
    let status = run.worker.terminate(Duration::from_secs(30));
    assert!(
        status.success(),
        "worker exit: {status:?}\n{}",
        run.worker.log_tail()
    );
    logged_before(
        &run.worker,
        "not ready any more; draining",
        "worker stopped",
    );
    run.worker.start();

    load.await.unwrap();
    ctx.converges(&run, &pipeline, Duration::from_secs(90))
        .await;

    // Every row change is in Kafka exactly once: none lost, none published again.
    let records = ctx
        .read_topic(
            &ctx.topic("ledger"),
            STATEMENTS as usize,
            Duration::from_secs(60),
        )
        .await;
    let mut seen: BTreeMap<(String, u64, u32), usize> = BTreeMap::new();
    for r in &records {
        let e: ChangeEvent = serde_json::from_slice(&r.payload).expect("change event");
        *seen
            .entry((e.source.file, e.source.pos, e.source.row))
            .or_default() += 1;
    }
    let twice: Vec<_> = seen.iter().filter(|(_, n)| **n > 1).collect();
    assert!(twice.is_empty(), "published more than once: {twice:?}");
    assert_eq!(seen.len() as u64, STATEMENTS, "row events in Kafka");
    // Each is keyed by its row's primary key, and one row's changes (its insert, update
    // and delete, across the worker's restart) share one partition, so they stay in order.
    let mut partitions: BTreeMap<String, BTreeSet<i32>> = BTreeMap::new();
    for r in &records {
        let e: ChangeEvent = serde_json::from_slice(&r.payload).expect("change event");
        let key: serde_json::Value = serde_json::from_slice(&r.key).expect("a JSON key");
        assert_eq!(
            key,
            serde_json::Value::Object(e.key.clone()),
            "the message's key"
        );
        partitions
            .entry(key.to_string())
            .or_default()
            .insert(r.partition);
    }
    let split: Vec<_> = partitions.iter().filter(|(_, p)| p.len() > 1).collect();
    assert!(split.is_empty(), "rows in several partitions: {split:?}");
    let used: BTreeSet<i32> = partitions.values().flatten().copied().collect();
    assert!(
        used.len() > 1,
        "every row in partitions {used:?}: the key does not pick the partition"
    );
    // And the restarted etl started where the first one committed.
    assert_eq!(
        stale(&run.etl).await,
        0.0,
        "the restarted etl re-applied events"
    );
    ctx.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readiness_turns_false_first_and_a_second_signal_exits_at_once() {
    let ctx = TestCtx::new("forced").await;
    ctx.exec("CREATE TABLE stuck (id INT PRIMARY KEY)").await;
    let pipeline = ctx.pipeline("stuck");

    // An "Elasticsearch" that accepts connections and never answers: the etl's request
    // stays in flight (for its 30 s request timeout) and its drain cannot finish.
    let hole = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let hole_addr = hole.local_addr().unwrap();
    let accepted = Arc::new(AtomicUsize::new(0));
    {
        let accepted = accepted.clone();
        std::thread::spawn(move || {
            let mut held = Vec::new();
            for mut conn in hole.incoming().flatten() {
                accepted.fetch_add(1, Ordering::SeqCst);
                let mut buf = [0u8; 4096];
                let _ = conn.set_nonblocking(true);
                let _ = conn.read(&mut buf);
                held.push(conn);
            }
        });
    }
    let mut worker = ctx.worker();
    worker.start();
    ctx.wait_worker_ready(&worker).await;
    let mut etl = ctx.etl(std::slice::from_ref(&pipeline));
    let text = std::fs::read_to_string(&etl.config).unwrap();
    let text = text.replace(&ctx.stack.es_url, &format!("http://{hole_addr}"));
    std::fs::write(&etl.config, text).unwrap();
    etl.start();
    eventually("the etl ready", Duration::from_secs(60), || async {
        match etl.ops("/readyz").await {
            Ok((200, _)) => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
    // (The etl asked the cluster who it is at start, on a connection of its own.)
    let at_start = accepted.load(Ordering::SeqCst);
    ctx.exec("INSERT INTO stuck VALUES (1)").await;
    eventually("a request in flight", Duration::from_secs(60), || async {
        if accepted.load(Ordering::SeqCst) > at_start {
            Ok(())
        } else {
            Err("no connection yet".to_owned())
        }
    })
    .await;

    etl.signal("TERM");
    eventually(
        "not ready while draining",
        Duration::from_secs(10),
        || async {
            match etl.ops("/readyz").await {
                Ok((503, body)) if body.contains("draining") => Ok(()),
                other => Err(format!("{other:?}")),
            }
        },
    )
    .await;
    assert_eq!(
        etl.ops("/healthz").await.unwrap().0,
        200,
        "still alive while draining"
    );
    assert!(
        etl.wait_exit(Duration::from_secs(1)).is_none(),
        "the drain waits for the request in flight"
    );

    etl.signal("TERM");
    let status = etl
        .wait_exit(Duration::from_secs(5))
        .unwrap_or_else(|| panic!("a second SIGTERM did not end the etl:\n{}", etl.log_tail()));
    assert_eq!(status.code(), Some(130), "forced exit");
    worker.terminate(Duration::from_secs(30));
    ctx.cleanup().await;
}
