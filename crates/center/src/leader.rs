//! The campaign and, once elected, the leader's reconcile loop: publish sources and
//! pipelines from the meta database to ZooKeeper, and keep every source's task assigned to
//! exactly one live worker.

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use sluice_model::SourceSpec;
use sluice_zk::layout::{
    self, AssignmentRecord, CenterRecord, PipelineRecord, SourceRecord, WorkerRecord,
};
use sluice_zk::{Coordinator, Expect, Leadership, ZkError};
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;

use crate::balance::{self, LiveWorker, Move};
use crate::meta::StoredPipeline;
use crate::term::{is_deposed, Deposed};
use crate::Shared;

type RebalanceRequests = mpsc::Receiver<oneshot::Sender<Vec<Move>>>;

/// One reconcile pass may take this long before it is abandoned and retried.
const RECONCILE_TIMEOUT: Duration = Duration::from_secs(30);

/// How soon the leader looks again while a build is under way.
const BUILD_POLL: Duration = Duration::from_millis(150);

/// Connects, campaigns and leads, again after every lost session or leadership, until
/// shutdown.
pub(crate) async fn campaign_forever(
    shared: Arc<Shared>,
    mut rebalance: RebalanceRequests,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    let me = CenterRecord {
        id: shared.cfg.center.id.clone(),
        addr: shared.cfg.center.advertised(),
    };
    let info = serde_json::to_vec(&me).expect("center record serializes");
    let mut backoff = Duration::from_millis(250);
    while !shutdown.is_cancelled() {
        let coord = match Coordinator::connect(&shared.cfg.zookeeper).await {
            Ok(c) => c,
            Err(e) => {
                tracing::error!(error = %e, "cannot reach ZooKeeper; retrying");
                sluice_runtime::shutdown::pause(backoff, &shutdown).await;
                backoff = (backoff * 2).min(Duration::from_secs(10));
                continue;
            }
        };
        *shared.coord.write().unwrap_or_else(|e| e.into_inner()) = Some(coord.clone());
        let mut failed = false;
        match coord.campaign(&info, &shutdown).await {
            Ok(leadership) => {
                let epoch = leadership.epoch();
                let result = lead(&shared, &coord, &leadership, &mut rebalance, &shutdown).await;
                shared.leading.send_replace(None);
                if let Err(e) = &result {
                    // Each new leadership takes an epoch: do not churn through them while
                    // something (the meta database, a bad record) keeps failing.
                    tracing::warn!(epoch, error = format!("{e:#}"), retry_in = ?backoff, "stopped leading; campaigning again after a pause");
                    failed = true;
                }
                if shutdown.is_cancelled() {
                    // Hand over at once instead of after a session timeout.
                    leadership.resign().await;
                } else {
                    drop(leadership);
                }
            }
            Err(ZkError::Cancelled) => {}
            Err(e) => {
                tracing::warn!(error = %e, retry_in = ?backoff, "campaign interrupted; starting over after a pause");
                failed = true;
            }
        }
        coord.close().await;
        if failed {
            sluice_runtime::shutdown::pause(backoff, &shutdown).await;
            backoff = (backoff * 2).min(Duration::from_secs(10));
        } else {
            backoff = Duration::from_millis(250);
        }
    }
    Ok(())
}

/// Leads until the leadership is lost, a deposition is detected, or shutdown.
async fn lead(
    shared: &Shared,
    coord: &Coordinator,
    leadership: &Leadership,
    rebalance: &mut RebalanceRequests,
    shutdown: &CancellationToken,
) -> anyhow::Result<()> {
    let epoch = leadership.epoch();
    let me = &shared.cfg.center.id;
    shared
        .meta
        .take_leadership(epoch, me)
        .await
        .context("cannot record the leadership in the meta database")?;
    let _ = shared
        .meta
        .add_event(me, "leader", me, &format!("leads at epoch {epoch}"))
        .await;
    shared.leading.send_replace(Some(epoch));
    crate::metrics::update(|g| {
        g.leader = true;
        g.epoch = epoch;
    });
    // However leading ends, the gauges stop saying so.
    struct NotLeading;
    impl Drop for NotLeading {
        fn drop(&mut self) {
            crate::metrics::update(|g| {
                g.leader = false;
                g.workers_live = None;
                g.tasks.clear();
                g.pipelines.clear();
                g.builds.clear();
                g.needs_rebuild.clear();
            });
        }
    }
    let _not_leading = NotLeading;
    tracing::info!(epoch, "leading: reconciling");
    let main = async {
        let mut pending: Option<oneshot::Sender<Vec<Move>>> = None;
        loop {
            if !leadership.is_acting() {
                // Connection in doubt: act on nothing until it is back (or lost for good).
                shared.leading.send_replace(None);
                // The lease can also come back without a state change (a late heartbeat
                // answer): look again shortly as well.
                let mut session = coord.session();
                tokio::select! {
                    why = leadership.lost() => anyhow::bail!("leadership lost: {why}"),
                    _ = session.changed() => {}
                    _ = tokio::time::sleep(Duration::from_millis(50)) => {}
                    _ = shutdown.cancelled() => return Ok(()),
                }
                if leadership.is_acting() {
                    shared.leading.send_replace(Some(epoch));
                }
                continue;
            }
            let operator = pending.is_some();
            tracing::debug!("reconcile pass");
            let pass = tokio::time::timeout(
                RECONCILE_TIMEOUT,
                reconcile(shared, coord, leadership, operator),
            );
            let (moves, wake, watch) = match pass
                .await
                .unwrap_or_else(|_| Err(anyhow::anyhow!("reconcile took longer than {RECONCILE_TIMEOUT:?} (meta database or ZooKeeper not answering)")))
            {
                Ok(done) => done,
                Err(e) if is_deposed(&e) => return Err(e),
                Err(e) => {
                    tracing::warn!(error = format!("{e:#}"), "reconcile failed; retrying");
                    sluice_runtime::shutdown::pause(Duration::from_secs(1), shutdown).await;
                    if shutdown.is_cancelled() {
                        return Ok(());
                    }
                    continue;
                }
            };
            if let Some(reply) = pending.take() {
                let _ = reply.send(moves);
            }
            let resync = shared.cfg.balance.resync;
            let wake = wake.map_or(resync, |w| w.min(resync));
            tokio::select! {
                why = leadership.lost() => anyhow::bail!("leadership lost: {why}"),
                _ = shutdown.cancelled() => return Ok(()),
                _ = watch.changed(coord, shutdown) => {}
                _ = shared.nudge.notified() => {}
                req = rebalance.recv() => pending = req,
                _ = tokio::time::sleep(wake) => {}
            }
        }
    };
    // Delayed changes are recorded for as long as this replica leads.
    tokio::select! {
        r = main => r,
        r = crate::delayed::record(shared, epoch, shutdown) => r,
    }
}

/// One pass: publish metadata, then assign. Returns the moves made, when to look again
/// for a worker that is about to settle, and a watch on the live workers.
#[tracing::instrument(name = "center.reconcile", skip_all, fields(epoch = leadership.epoch()))]
async fn reconcile(
    shared: &Shared,
    coord: &Coordinator,
    leadership: &Leadership,
    operator: bool,
) -> anyhow::Result<(Vec<Move>, Option<Duration>, sluice_zk::Watch)> {
    let epoch = leadership.epoch();
    let (worker_ids, watch) = coord.children_watched("workers").await?;
    let sources = shared.meta.sources().await?;
    let pipelines = shared.meta.pipelines().await?;
    let acting = || -> anyhow::Result<()> {
        if leadership.is_acting() {
            Ok(())
        } else {
            anyhow::bail!("not acting (ZooKeeper connection in doubt)")
        }
    };

    // Sources → mappings/<source>.
    let wanted: BTreeMap<String, Vec<u8>> = sources
        .iter()
        .map(|s| {
            (
                s.name.clone(),
                serde_json::to_vec(&source_record(s, &pipelines, epoch)).expect("serializes"),
            )
        })
        .collect();
    publish(coord, "mappings", &wanted, epoch, &acting).await?;
    let wanted: BTreeMap<String, Vec<u8>> = pipelines
        .iter()
        .map(|p| {
            (
                p.spec.name.clone(),
                serde_json::to_vec(&pipeline_record(p, epoch)).expect("serializes"),
            )
        })
        .collect();
    publish(coord, "pipelines", &wanted, epoch, &acting).await?;

    // Live workers.
    let settle = shared.cfg.balance.settle;
    let now = sluice_model::now_ms();
    let mut live = Vec::new();
    let mut wake: Option<Duration> = None;
    for id in &worker_ids {
        let Some(node) = coord.get(&layout::worker(id)).await? else {
            continue;
        };
        let rec: WorkerRecord = match serde_json::from_slice(&node.data) {
            Ok(r) => r,
            Err(e) => {
                tracing::warn!(worker = %id, error = %e, "unreadable worker registration; ignoring it");
                continue;
            }
        };
        // Since this registration: a worker back after a lost session settles again.
        let since = rec.registered_at_ms.max(rec.started_at_ms);
        let age = Duration::from_millis(now.saturating_sub(since).max(0) as u64);
        let settled = operator || age >= settle;
        if !settled {
            let left = settle - age;
            wake = Some(wake.map_or(left, |w: Duration| w.min(left)));
        }
        live.push(LiveWorker {
            id: id.clone(),
            capacity: rec.capacity.max(1) as usize,
            settled,
        });
    }

    // Current assignments, including those of dead workers.
    let tasks: Vec<String> = sources.iter().map(|s| s.name.clone()).collect();
    let task_set: HashSet<&str> = tasks.iter().map(String::as_str).collect();
    let mut current = BTreeMap::new();
    let mut nodes: BTreeMap<String, (String, i32, AssignmentRecord)> = BTreeMap::new();
    // Only each task's latest recorded decision stands: a node of an older generation
    // (a deposed leader's late write, a half-finished move) is removed.
    let generations = shared.meta.generations().await?;
    for worker in coord.children("assignments").await? {
        let assigned = coord.children(&layout::assignments(&worker)).await?;
        if assigned.is_empty() && !worker_ids.contains(&worker) {
            acting()?;
            coord
                .delete(&layout::assignments(&worker), None, false)
                .await?;
            continue;
        }
        for task in assigned {
            let path = layout::assignment(&worker, &task);
            let Some(node) = coord.get(&path).await? else {
                continue;
            };
            let rec = serde_json::from_slice::<AssignmentRecord>(&node.data).ok();
            if let Some(r) = &rec {
                if r.epoch > epoch {
                    return Err(Deposed(path, r.epoch).into());
                }
            }
            let drop_why = match &rec {
                None => Some("unreadable assignment record"),
                Some(_) if !task_set.contains(task.as_str()) => Some("source removed"),
                Some(r) if generations.get(&task) != Some(&r.generation) => {
                    Some("not the task's latest recorded assignment")
                }
                Some(_) if current.contains_key(&task) => Some("duplicate assignment"),
                Some(_) => None,
            };
            let reason = match (drop_why, rec) {
                (None, Some(rec)) => {
                    current.insert(task.clone(), worker.clone());
                    nodes.insert(task, (worker.clone(), node.version, rec));
                    continue;
                }
                (reason, _) => reason.unwrap_or("unreadable assignment record"),
            };
            acting()?;
            coord.delete(&path, Some(node.version), false).await?;
            tracing::warn!(task, worker, reason, "assignment removed");
            if reason == "source removed" {
                shared
                    .meta
                    .record_assignment(
                        epoch,
                        &shared.cfg.center.id,
                        &task,
                        Some(&worker),
                        None,
                        reason,
                    )
                    .await?;
            } else {
                // Not a decision: the task keeps its latest recorded one (or gets a new one
                // from the planner below).
                let _ = shared
                    .meta
                    .add_event(
                        &shared.cfg.center.id,
                        "assignment",
                        &task,
                        &format!("removed {path}: {reason}"),
                    )
                    .await;
            }
        }
    }

    // Checkpoints of removed sources go once nobody holds their lock, so a source added
    // again under the same name starts afresh (it may be another server).
    for task in coord.children("tasks").await? {
        if !task.starts_with("snap~")
            && !task_set.contains(task.as_str())
            && coord.get(&layout::lock(&task)).await?.is_none()
        {
            acting()?;
            coord.delete(&format!("tasks/{task}"), None, true).await?;
            tracing::info!(task, "checkpoint of a removed source deleted");
        }
    }

    let threshold = if operator {
        1
    } else {
        shared.cfg.balance.threshold
    };
    let moves = balance::plan(&live, &tasks, &current, threshold);
    for m in &moves {
        acting()?;
        let reason = match (&m.from, operator) {
            (None, _) => "unassigned",
            (Some(from), _) if !worker_ids.contains(from) => "worker left",
            (Some(_), true) => "operator rebalance",
            (Some(_), false) => "rebalance",
        };
        let generation = shared
            .meta
            .record_assignment(
                epoch,
                &shared.cfg.center.id,
                &m.task,
                m.from.as_deref(),
                Some(&m.to),
                reason,
            )
            .await?;
        if let Some((from, version, _)) = nodes.remove(&m.task) {
            coord
                .delete(&layout::assignment(&from, &m.task), Some(version), false)
                .await?;
        }
        let rec = AssignmentRecord {
            epoch,
            generation,
            assigned_at_ms: sluice_model::now_ms(),
        };
        coord
            .put(
                &layout::assignment(&m.to, &m.task),
                &serde_json::to_vec(&rec).expect("serializes"),
                Expect::Any,
            )
            .await?;
        tracing::info!(task = %m.task, from = ?m.from, to = %m.to, reason, generation, "task assigned");
    }
    // Assignments that stay: stamp them with our epoch so workers (re)starting now trust
    // them. Compare-and-set: a node changed under us means someone else writes here.
    for (task, (worker, version, rec)) in nodes {
        if rec.epoch < epoch {
            acting()?;
            let rec = AssignmentRecord { epoch, ..rec };
            coord
                .put(
                    &layout::assignment(&worker, &task),
                    &serde_json::to_vec(&rec).expect("serializes"),
                    Expect::Version(version),
                )
                .await?;
        }
    }
    let mut assigned = current;
    for m in &moves {
        assigned.insert(m.task.clone(), m.to.clone());
    }
    crate::metrics::update(|g| {
        g.workers_live = Some(live.len() as u64);
        g.tasks = live.iter().map(|w| (w.id.clone(), 0)).collect();
        for worker in assigned.values() {
            *g.tasks.entry(worker.clone()).or_default() += 1;
        }
        g.pipelines = ["unavailable", "building", "available"]
            .into_iter()
            .map(|state| {
                (
                    state,
                    pipelines.iter().filter(|p| p.state() == state).count() as u64,
                )
            })
            .collect();
        g.source_lag
            .retain(|source, _| task_set.contains(source.as_str()));
    });
    if !crate::rebuild::watch(shared, coord, epoch, &acting, &pipelines)
        .await?
        .is_empty()
    {
        // Builds started: publish them (and their pipelines' versions) at once.
        shared.nudge.notify_one();
    }
    let checking = crate::check::drive(shared, coord, epoch, &acting, &pipelines).await?;
    if crate::build::drive(shared, coord, epoch, &acting, &pipelines, &worker_ids).await?
        || checking
    {
        // Each phase of a build waits for this pass: a short one keeps the phases'
        // hand-offs (etls confirmed, plan made, chunks read, markers applied) to a
        // fraction of a second, for a few ZooKeeper reads per build.
        let soon = BUILD_POLL;
        wake = Some(wake.map_or(soon, |w| w.min(soon)));
    }
    Ok((moves, wake, watch))
}

/// Makes the children of `dir` exactly `wanted` (name → record), writing only what
/// differs. A record of a newer epoch means we were deposed.
async fn publish(
    coord: &Coordinator,
    dir: &str,
    wanted: &BTreeMap<String, Vec<u8>>,
    epoch: u64,
    acting: &impl Fn() -> anyhow::Result<()>,
) -> anyhow::Result<()> {
    #[derive(serde::Deserialize)]
    struct Stamp {
        epoch: u64,
    }
    for name in coord.children(dir).await? {
        if !wanted.contains_key(&name) {
            acting()?;
            // With what others keep beneath (a pipeline's `needs_rebuild`).
            coord.delete(&format!("{dir}/{name}"), None, true).await?;
            tracing::info!(dir, name, "removed");
        }
    }
    for (name, data) in wanted {
        let rel = format!("{dir}/{name}");
        let existing = coord.get(&rel).await?;
        if let Some(node) = &existing {
            if let Ok(stamp) = serde_json::from_slice::<Stamp>(&node.data) {
                if stamp.epoch > epoch {
                    return Err(Deposed(rel, stamp.epoch).into());
                }
            }
            if node.data == *data {
                continue;
            }
        }
        acting()?;
        let expect = existing.map_or(Expect::Absent, |n| Expect::Version(n.version));
        coord.put(&rel, data, expect).await?;
        tracing::info!(dir, name, "published");
    }
    Ok(())
}

/// The source's record: how to reach it, and what to capture — its own table patterns
/// plus every table of its pipelines (none: everything, which covers them).
pub(crate) fn source_record(
    s: &SourceSpec,
    pipelines: &[StoredPipeline],
    epoch: u64,
) -> SourceRecord {
    let mut spec = s.clone();
    if !spec.tables.is_empty() {
        for p in pipelines.iter().filter(|p| p.spec.source == s.name) {
            for (db, table) in p.spec.tables() {
                let covered = spec
                    .tables
                    .iter()
                    .any(|t| *t == db || *t == format!("{db}.*") || *t == format!("{db}.{table}"));
                if !covered {
                    spec.tables.push(format!("{db}.{table}"));
                }
            }
        }
    }
    SourceRecord { epoch, spec }
}

pub(crate) fn pipeline_record(p: &StoredPipeline, epoch: u64) -> PipelineRecord {
    PipelineRecord {
        epoch,
        spec: p.spec.clone(),
        building: (p.building_version > 0).then_some(p.building_version),
        history: p.announced_history(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_model::PipelineSpec;

    #[test]
    fn a_source_captures_every_table_of_its_pipelines() {
        let source = SourceSpec {
            name: "shop".into(),
            host: "db".into(),
            port: 3306,
            user: "u".into(),
            password_ref: "env:P".into(),
            server_id: 1,
            tables: vec!["shop.products".into(), "crm.*".into()],
            coordinates: Default::default(),
        };
        let mut spec = PipelineSpec::table("p", "shop", "shop", "products");
        let tree: PipelineSpec = serde_json::from_value(serde_json::json!({
            "source": "shop", "database": "shop", "table": "products",
            "relations": [
                {"name": "brand", "kind": "one_to_one", "table": "brands", "on": {"brand_id": "id"}},
                {"name": "notes", "kind": "one_to_many", "table": "notes", "database": "crm", "on": {"id": "product_id"}}
            ]
        }))
        .unwrap();
        spec.relations = tree.relations;
        let other = PipelineSpec::table("o", "elsewhere", "x", "y");
        let stored = |spec| StoredPipeline {
            spec,
            live_version: 0,
            building_version: 0,
            history: Default::default(),
        };
        let record = source_record(&source, &[stored(spec), stored(other)], 3);
        assert_eq!(
            record.spec.tables,
            ["shop.products", "crm.*", "shop.brands"],
            "its own patterns, then what its pipelines add; not other sources' tables"
        );
        let everything = SourceSpec {
            tables: vec![],
            ..source
        };
        assert!(source_record(&everything, &[], 3).spec.tables.is_empty());
    }
}
