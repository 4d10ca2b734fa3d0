//! Operating a running cluster through sluicectl: sources and pipelines added at runtime
//! stream with no restart; a joining worker receives tasks; the API demands its token; a
//! definite error stops the leader's pass with an event until it is fixed.

use std::time::Duration;

use mysql_async::prelude::*;
use sluice_integration_tests::{Cluster, TestCtx};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sources_and_pipelines_added_at_runtime_stream_without_restarts() {
    let ctx = TestCtx::new("rtadd").await;
    ctx.exec("CREATE TABLE items (id INT PRIMARY KEY, name VARCHAR(40), qty INT)")
        .await;
    let mut cluster = ctx.start_cluster(3, 3).await;
    let pids: Vec<Option<u32>> = cluster
        .centers
        .iter()
        .chain(&cluster.workers)
        .chain([&cluster.etl])
        .map(|s| s.pid())
        .collect();

    let items = ctx.add_source(&cluster, "items", 1).await;
    let placed = cluster
        .wait_running(&[&items], Duration::from_secs(30))
        .await;
    ctx.exec("INSERT INTO items VALUES (1, 'one', 1), (2, 'two', 2), (3, 'three', 3)")
        .await;
    ctx.exec("UPDATE items SET qty = qty * 10 WHERE id > 1")
        .await;
    ctx.exec("DELETE FROM items WHERE id = 1").await;
    cluster
        .converges(&ctx, &items.pipeline, Duration::from_secs(60))
        .await;

    // A second source and pipeline while the first streams.
    ctx.exec("CREATE TABLE people (id BIGINT PRIMARY KEY, email VARCHAR(80))")
        .await;
    let people = ctx.add_source(&cluster, "people", 2).await;
    cluster
        .wait_running(&[&people], Duration::from_secs(30))
        .await;
    ctx.exec("INSERT INTO people VALUES (10, 'a@example.com'), (11, 'b@example.com')")
        .await;
    ctx.exec("INSERT INTO items VALUES (4, 'four', 4)").await;
    cluster
        .converges(&ctx, &people.pipeline, Duration::from_secs(60))
        .await;
    cluster
        .converges(&ctx, &items.pipeline, Duration::from_secs(60))
        .await;

    let after: Vec<Option<u32>> = cluster
        .centers
        .iter_mut()
        .chain(cluster.workers.iter_mut())
        .chain([&mut cluster.etl])
        .map(|s| s.is_running().then(|| s.pid()).flatten())
        .collect();
    assert_eq!(pids, after, "every process still runs, none was restarted");
    assert_eq!(
        cluster
            .tasks()
            .unwrap()
            .iter()
            .find(|t| t.source == items.name)
            .unwrap()
            .running_on,
        placed[&items.name],
        "the first task never moved"
    );

    // Removing a source stops its task (its lock goes) without touching the other.
    cluster.ctl(&["sources", "delete", &people.name]).unwrap();
    cluster
        .ctl(&["pipelines", "delete", &people.pipeline.alias])
        .unwrap();
    let zk = ctx.coordinator().await;
    sluice_integration_tests::eventually(
        "the removed source's task stops",
        Duration::from_secs(30),
        || async {
            match zk.get(&sluice_zk::layout::lock(&people.name)).await {
                Ok(None) => Ok(()),
                other => Err(format!("lock still there: {other:?}\n{}", cluster.logs())),
            }
        },
    )
    .await;
    ctx.exec("INSERT INTO items VALUES (5, 'five', 5)").await;
    cluster
        .converges(&ctx, &items.pipeline, Duration::from_secs(60))
        .await;
    let tasks = cluster.tasks().unwrap();
    assert_eq!(tasks.len(), 1, "{tasks:?}");

    // The events say what happened.
    let events = cluster.ctl(&["events", "--limit", "200"]).unwrap();
    let kinds: Vec<&str> = events
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["kind"].as_str().unwrap())
        .collect();
    for kind in ["leader", "source", "pipeline", "assignment", "task_started"] {
        assert!(kinds.contains(&kind), "no `{kind}` event in {events}");
    }

    // Without the token the admin API refuses; health stays open (probes need no token).
    let (ok, said) = cluster.ctl_as(None, &["sources", "list"]);
    assert!(!ok);
    assert!(said.contains("Unauthenticated"), "{said}");
    // The workers' token reported all along (the task events above came through it), but
    // it cannot administer.
    let sources = cluster.ctl(&["sources", "list"]).unwrap();
    assert!(sources.to_string().contains(&items.name), "{sources}");
    let (ok, said) = cluster.ctl_as(
        Some(&ctx.secrets.worker_token),
        &["sources", "delete", &items.name],
    );
    assert!(!ok, "{said}");
    assert!(said.contains("can only report"), "{said}");
    assert_eq!(
        cluster.ctl(&["sources", "list"]).unwrap(),
        sources,
        "nothing was deleted"
    );

    drop(cluster);
    ctx.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_joining_worker_receives_tasks_by_rebalancing() {
    let ctx = TestCtx::new("join").await;
    let mut sources = Vec::new();
    let mut cluster = ctx.start_cluster(3, 2).await;
    for (n, t) in ["t1", "t2", "t3", "t4"].iter().enumerate() {
        ctx.exec(&format!("CREATE TABLE {t} (id INT PRIMARY KEY, v INT)"))
            .await;
        sources.push(ctx.add_source(&cluster, t, n as u32 + 1).await);
    }
    let refs: Vec<_> = sources.iter().collect();
    let before = cluster.wait_running(&refs, Duration::from_secs(60)).await;
    let mut load = std::collections::BTreeMap::<&str, usize>::new();
    for w in before.values() {
        *load.entry(w).or_default() += 1;
    }
    assert_eq!(
        load.values().copied().collect::<Vec<_>>(),
        [2, 2],
        "{before:?}"
    );

    // A third worker joins: 2/2/0 is beyond the threshold (1), so one task moves to it
    // once it has settled.
    let n = cluster.add_worker(&ctx).await;
    let newcomer = Cluster::worker_id(n);
    sluice_integration_tests::eventually(
        "the new worker runs a task",
        Duration::from_secs(60),
        || async {
            let tasks = cluster.tasks()?;
            if tasks.iter().any(|t| t.running_on == newcomer) {
                Ok(())
            } else {
                Err(format!("{tasks:?}"))
            }
        },
    )
    .await;
    for (i, s) in sources.iter().enumerate() {
        ctx.exec(&format!("INSERT INTO t{} VALUES (1, 1), (2, 2)", i + 1))
            .await;
        let _ = s;
    }
    for s in &sources {
        cluster
            .converges(&ctx, &s.pipeline, Duration::from_secs(60))
            .await;
    }

    // An operator's rebalance with nothing to fix moves nothing.
    let moves = cluster.ctl(&["rebalance"]).unwrap();
    assert_eq!(moves.as_array().map(Vec::len), Some(0), "{moves}");

    drop(cluster);
    ctx.cleanup().await;
}

/// A metadata row the leader cannot read (a pipeline's spec broken by hand in the meta
/// database) is an error retrying cannot mend: the leader says so as an event naming the
/// row and waits for a change instead of retrying; what was asked meanwhile (a source
/// added) waits too, and is done without a restart once the row is fixed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_definite_error_is_said_as_an_event_and_the_leader_goes_on_once_fixed() {
    let ctx = TestCtx::new("definite").await;
    ctx.items_table(0).await;
    ctx.exec("CREATE TABLE others (id INT PRIMARY KEY, v INT)")
        .await;
    let cluster = ctx.start_cluster(1, 1).await;
    let items = ctx.add_source(&cluster, "items", 1).await;
    cluster
        .wait_running(&[&items], Duration::from_secs(30))
        .await;
    let (leader, _) = cluster.wait_leader(Duration::from_secs(30), None).await;
    let leader = format!("c{leader}");

    let (meta, name) = (ctx.meta_db(), items.pipeline.alias.clone());
    let spec: String = ctx
        .stack
        .conn()
        .await
        .exec_first(
            format!("SELECT spec_json FROM `{meta}`.pipelines WHERE name = ?"),
            (&name,),
        )
        .await
        .unwrap()
        .expect("the pipeline's row");
    ctx.exec_in(
        &meta,
        &format!("UPDATE pipelines SET spec_json = '{{broken' WHERE name = '{name}'"),
    )
    .await;
    // A change the leader must act on: a new source, whose task needs a worker.
    let others = ctx.put_source(&cluster, "others", 2);
    let said = cluster
        .wait_event(
            &leader,
            "leader",
            &[
                "reconcile failed",
                &format!("pipelines.spec_json of {name}"),
            ],
        )
        .await;
    assert!(said.starts_with("reconcile failed: "), "{said}");
    let waiting = cluster.tasks().unwrap();
    let new_task = waiting.iter().find(|t| t.source == others.name);
    assert!(
        new_task.is_some_and(|t| t.assigned_to.is_empty()),
        "no pass went through while the row was broken: {waiting:?}"
    );
    assert!(
        cluster.centers[0]
            .log_since(0)
            .contains("reconcile failed, and will until the cause is fixed"),
        "said as definite, not retried as transient:\n{}",
        cluster.logs()
    );

    // Fixed: the next pass (a change, or the resync) assigns the new task.
    let mut conn = ctx.stack.conn().await;
    conn.exec_drop(
        format!("UPDATE `{meta}`.pipelines SET spec_json = ? WHERE name = ?"),
        (&spec, &name),
    )
    .await
    .unwrap();
    cluster
        .wait_running(&[&items, &others], Duration::from_secs(30))
        .await;

    drop(cluster);
    ctx.cleanup().await;
}
