//! Failover with 3 centers and 3 workers, each a separate process (README invariants 1
//! and 4): the leader or a worker killed or stopped, writes going on
//! throughout, and Elasticsearch equal to MySQL afterwards. Each test prints the failover
//! time it measured.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use mysql_async::prelude::*;
use sluice_integration_tests::cluster::{write_load, write_load_counted};
use sluice_integration_tests::context::SESSION_TIMEOUT as SESSION;
use sluice_integration_tests::{eventually, time_until, Cluster, ClusterSource, TestCtx};

async fn setup(name: &str, tables: &[&str]) -> (TestCtx, Cluster, Vec<ClusterSource>) {
    let ctx = TestCtx::new(name).await;
    for t in tables {
        ctx.exec(&format!(
            "CREATE TABLE {t} (id BIGINT PRIMARY KEY, v BIGINT)"
        ))
        .await;
    }
    let cluster = ctx.start_cluster(3, 3).await;
    let mut sources = Vec::new();
    for (n, t) in tables.iter().enumerate() {
        sources.push(ctx.add_source(&cluster, t, n as u32 + 1).await);
    }
    (ctx, cluster, sources)
}

/// The lock node of each task: (owner session, creating transaction).
async fn locks(ctx: &TestCtx, sources: &[ClusterSource]) -> Vec<(i64, i64)> {
    let zk = ctx.coordinator().await;
    let mut out = Vec::new();
    for s in sources {
        let node = zk
            .get(&sluice_zk::layout::lock(&s.name))
            .await
            .unwrap()
            .unwrap_or_else(|| panic!("task {} holds no lock", s.name));
        out.push((node.ephemeral_owner, node.created_zxid));
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killing_the_leader_elects_another_and_interrupts_no_task() {
    let (ctx, mut cluster, sources) = setup("leaderkill", &["a", "b", "c"]).await;
    let refs: Vec<&ClusterSource> = sources.iter().collect();
    let placed = cluster.wait_running(&refs, Duration::from_secs(60)).await;
    let locks_before = locks(&ctx, &sources).await;
    let (stop, load) = write_load(&ctx, &["a", "b", "c"]);

    let (old, epoch) = cluster.wait_leader(Duration::from_secs(10), None).await;
    cluster.centers[old].kill9();
    let failover = time_until("a new leader", Duration::from_secs(30), || async {
        let l = cluster.ctl(&["leader"])?;
        match l["epoch"].as_u64() {
            Some(e) if e > epoch && l["leader_id"] != format!("c{old}").as_str() => Ok(()),
            _ => Err(l.to_string()),
        }
    })
    .await;
    eprintln!("leader failover (kill -9 → new leader serving): {failover:?}");
    assert!(
        failover < SESSION + Duration::from_secs(6),
        "the new leader took {failover:?}: more than the session timeout and a few seconds"
    );

    // The new leader changed nothing that ran: same tasks, same workers, same locks.
    tokio::time::sleep(Duration::from_secs(3)).await; // two resync periods, for a negative
    stop.store(true, Ordering::Relaxed);
    let statements = load.await.unwrap();
    assert!(statements > 10, "the load ran during the failover");
    assert_eq!(
        cluster.wait_running(&refs, Duration::from_secs(10)).await,
        placed
    );
    assert_eq!(
        locks(&ctx, &sources).await,
        locks_before,
        "a task lock was released and taken again: a task was interrupted"
    );
    for s in &sources {
        cluster
            .converges(&ctx, &s.pipeline, Duration::from_secs(60))
            .await;
    }
    drop(cluster);
    ctx.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killing_a_worker_moves_its_task_and_loses_nothing() {
    let (ctx, mut cluster, sources) = setup("workerkill", &["a", "b", "c"]).await;
    let refs: Vec<&ClusterSource> = sources.iter().collect();
    let placed = cluster.wait_running(&refs, Duration::from_secs(60)).await;
    let rounds = Arc::new(AtomicU64::new(0));
    let (stop, load) = write_load_counted(&ctx, &["a", "b", "c"], rounds.clone());
    eventually("the load under way", Duration::from_secs(30), || async {
        match rounds.load(Ordering::Relaxed) {
            n if n >= 10 => Ok(()),
            n => Err(format!("{n} rounds")),
        }
    })
    .await;

    let victim = placed[&sources[0].name].clone();
    cluster.workers[Cluster::worker_index(&victim)].kill9();
    let failover = time_until(
        "the task runs on another worker",
        Duration::from_secs(30),
        || async {
            let t = cluster
                .tasks()?
                .into_iter()
                .find(|t| t.source == sources[0].name)
                .ok_or("task gone")?;
            if !t.running_on.is_empty() && t.running_on != victim && t.running_on == t.assigned_to {
                Ok(())
            } else {
                Err(format!("{t:?}"))
            }
        },
    )
    .await;
    eprintln!("worker failover (kill -9 → task running elsewhere): {failover:?}");
    assert!(failover < SESSION + Duration::from_secs(6), "{failover:?}");

    stop.store(true, Ordering::Relaxed);
    load.await.unwrap();
    for s in &sources {
        cluster
            .converges(&ctx, &s.pipeline, Duration::from_secs(60))
            .await;
    }
    // The other tasks stayed where they were.
    let after = cluster.wait_running(&refs, Duration::from_secs(10)).await;
    for s in &sources[1..] {
        if placed[&s.name] != victim {
            assert_eq!(
                after[&s.name], placed[&s.name],
                "{} moved off a live worker",
                s.name
            );
        }
    }
    drop(cluster);
    ctx.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_worker_past_its_session_never_regresses_and_stops() {
    let (ctx, mut cluster, sources) = setup("zombie", &["a"]).await;
    let task = sources[0].name.clone();
    let placed = cluster
        .wait_running(&[&sources[0]], Duration::from_secs(60))
        .await;
    let rounds = Arc::new(AtomicU64::new(0));
    let (stop, load) = write_load_counted(&ctx, &["a"], rounds.clone());

    // Watch the checkpoint throughout: it may only move forward.
    let sampling = Arc::new(AtomicBool::new(true));
    let sampler = {
        let zk = ctx.coordinator().await.clone();
        let (task, sampling) = (task.clone(), sampling.clone());
        tokio::spawn(async move {
            let mut last: Option<sluice_model::BinlogPosition> = None;
            let mut samples = 0u32;
            while sampling.load(Ordering::Relaxed) {
                if let Some(b) = zk.read_checkpoint(&task).await.unwrap() {
                    let cp = sluice_model::Checkpoint::from_json(&b).unwrap();
                    if let Some(prev) = &last {
                        assert!(
                            cp.position >= *prev,
                            "checkpoint regressed: {prev} → {}",
                            cp.position
                        );
                    }
                    last = Some(cp.position);
                    samples += 1;
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            samples
        })
    };

    let zombie = Cluster::worker_index(&placed[&task]);
    cluster.workers[zombie].signal("STOP");
    // The zombie cannot have read past this.
    let stopped_at = ctx.binlog_end().await;
    let moved = time_until(
        "the task runs on another worker",
        Duration::from_secs(30),
        || async {
            let t = cluster
                .tasks()?
                .into_iter()
                .find(|t| t.source == task)
                .ok_or("task gone")?;
            if !t.running_on.is_empty() && t.running_on != placed[&task] {
                Ok(())
            } else {
                Err(format!("{t:?}"))
            }
        },
    )
    .await;
    eprintln!("zombie worker: task taken over {moved:?} after SIGSTOP");
    assert!(
        moved >= SESSION / 2,
        "taken over before the zombie's session could expire: {moved:?}"
    );

    // Let the new owner confirm a position past anything the zombie read, then wake it.
    let zk = ctx.coordinator().await;
    eventually(
        "the new owner confirms a position past the zombie's",
        Duration::from_secs(30),
        || async {
            let now = zk
                .read_checkpoint(&task)
                .await
                .unwrap()
                .map(|b| sluice_model::Checkpoint::from_json(&b).unwrap().position);
            match now {
                Some(p) if p >= stopped_at => Ok(()),
                other => Err(format!("{other:?}, the zombie stopped before {stopped_at}")),
            }
        },
    )
    .await;
    let woke_ms = sluice_model::now_ms();
    let rounds_at_wake = rounds.load(Ordering::Relaxed);
    let mark = cluster.workers[zombie].log_mark();
    let woke = Instant::now();
    cluster.workers[zombie].signal("CONT");
    let stopped = time_until(
        "the zombie drops its task",
        Duration::from_secs(20),
        || async {
            // Whichever way it learns first: the server says the session expired, the
            // lock's check finds it gone, or the client gives the connection up (the
            // session then ends and the task lets go of its lock).
            cluster.workers[zombie].logged_since(
                mark,
                &["session expired", "task lock lost", "task lock released"],
            )
        },
    )
    .await;
    eprintln!(
        "zombie worker: dropped its task {stopped:?} after SIGCONT ({:?} since)",
        woke.elapsed()
    );

    // The zombie may drop its task within milliseconds of waking: keep the load on until
    // rows committed after the wake exist, so the new owner has something of its own to
    // publish after it (the contrast the Kafka check below needs).
    eventually(
        "the load writes rows after the zombie woke",
        Duration::from_secs(30),
        || async {
            match rounds.load(Ordering::Relaxed) {
                n if n >= rounds_at_wake + 3 => Ok(()),
                n => Err(format!("{n} rounds, {rounds_at_wake} at the wake")),
            }
        },
    )
    .await;
    stop.store(true, Ordering::Relaxed);
    load.await.unwrap();
    cluster
        .converges(&ctx, &sources[0].pipeline, Duration::from_secs(60))
        .await;
    sampling.store(false, Ordering::Relaxed);
    let samples = sampler.await.unwrap();
    assert!(
        samples > 20,
        "the checkpoint was sampled only {samples} times"
    );

    // In Kafka: what arrived after the zombie woke for a change it could have read (before
    // it stopped) is the zombie's: the new owner had published those, acknowledged, before
    // the wake. Its producer still held messages queued before the stop and sends them
    // when the process runs again; nothing fences a producer in Kafka short of
    // transactions. Each of them must repeat, byte for byte, an event the new owner
    // published (same change, same version): the zombie adds nothing of its own.
    let topic = sluice_kafka::TopicConfig::default().rows_topic(&task, &ctx.db, "a");
    let records = ctx.read_topic(&topic, 1, Duration::from_secs(60)).await;
    let mut copies: std::collections::HashMap<&[u8], usize> = Default::default();
    for r in &records {
        *copies.entry(&r.payload).or_default() += 1;
    }
    let (mut late, mut since_woke) = (Vec::new(), 0);
    for r in records
        .iter()
        .filter(|r| r.ts_ms.is_some_and(|ts| ts >= woke_ms))
    {
        since_woke += 1;
        let e: sluice_model::ChangeEvent =
            serde_json::from_slice(&r.payload).expect("a change event");
        let at = sluice_model::BinlogPosition::new(e.source.file.clone(), e.source.pos);
        if at < stopped_at {
            late.push((at.to_string(), copies[r.payload.as_slice()]));
        }
    }
    eprintln!(
        "zombie worker: {} of its queued events reached Kafka after it woke",
        late.len()
    );
    assert!(
        late.iter().all(|(_, n)| *n >= 2),
        "the zombie published events the new owner did not (position, copies): {late:?}"
    );
    assert!(
        since_woke > late.len(),
        "the new owner published nothing after the zombie woke: the check saw no contrast"
    );
    drop(cluster);
    ctx.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_leader_past_its_session_takes_no_decision() {
    let (ctx, mut cluster, sources) = setup("leaderstop", &["a", "b"]).await;
    let refs: Vec<&ClusterSource> = sources.iter().collect();
    cluster.wait_running(&refs, Duration::from_secs(60)).await;
    let (old, epoch) = cluster.wait_leader(Duration::from_secs(10), None).await;

    cluster.centers[old].signal("STOP");
    let (new, new_epoch) = cluster
        .wait_leader(Duration::from_secs(30), Some(old))
        .await;
    assert!(
        new_epoch > epoch,
        "c{new} leads at epoch {new_epoch}, after c{old} at {epoch}\n{}",
        cluster.logs()
    );
    // Decisions for the new leader while the old one sleeps: a new source, a dead worker.
    ctx.exec("CREATE TABLE c (id BIGINT PRIMARY KEY, v BIGINT)")
        .await;
    let c = ctx.add_source(&cluster, "c", 3).await;
    let placed = cluster.wait_running(&[&c], Duration::from_secs(30)).await;
    cluster.workers[Cluster::worker_index(&placed[&c.name])].kill9();

    let mark = cluster.centers[old].log_mark();
    cluster.centers[old].signal("CONT");
    time_until(
        "the old leader steps down",
        Duration::from_secs(20),
        || async {
            cluster.centers[old].logged_since(mark, &["stopped leading", "leadership lost"])
        },
    )
    .await;
    let all: Vec<&ClusterSource> = sources.iter().chain([&c]).collect();
    cluster.wait_running(&all, Duration::from_secs(30)).await;
    assert_eq!(
        cluster.wait_leader(Duration::from_secs(5), None).await.0,
        new
    );

    // No decision of the old leader took effect after the new one's first.
    let mut conn = ctx.stack.conn().await;
    let rows: Vec<(u64, u64, String)> = conn
        .query(format!(
            "SELECT id, epoch, task FROM `{}`.assignments ORDER BY id",
            ctx.meta_db()
        ))
        .await
        .unwrap();
    let first_new = rows
        .iter()
        .position(|r| r.1 >= new_epoch)
        .expect("the new leader decided");
    assert!(
        rows[first_new..].iter().all(|r| r.1 >= new_epoch),
        "an older epoch decided after the new leader: {rows:?}"
    );
    // Every assignment in ZooKeeper carries the newest epoch, once per task.
    let zk = ctx.coordinator().await;
    let mut seen = std::collections::BTreeSet::new();
    for w in zk.children("assignments").await.unwrap() {
        for t in zk
            .children(&sluice_zk::layout::assignments(&w))
            .await
            .unwrap()
        {
            let node = zk
                .get(&sluice_zk::layout::assignment(&w, &t))
                .await
                .unwrap()
                .unwrap();
            let rec: sluice_zk::layout::AssignmentRecord =
                serde_json::from_slice(&node.data).unwrap();
            assert!(
                rec.epoch >= new_epoch,
                "{w}/{t} carries epoch {}",
                rec.epoch
            );
            assert!(seen.insert(t.clone()), "{t} is assigned twice");
        }
    }
    for s in &all {
        ctx.exec(&format!("INSERT INTO {} VALUES (1, 1)", s.pipeline.table))
            .await;
        cluster
            .converges(&ctx, &s.pipeline, Duration::from_secs(60))
            .await;
    }
    drop(cluster);
    ctx.cleanup().await;
}
