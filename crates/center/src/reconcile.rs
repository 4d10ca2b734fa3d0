//! One pass of the leader: publish the meta database's sources and pipelines to
//! ZooKeeper, keep every source's task assigned to exactly one live worker, then drive
//! rebuilds, runs and builds a step each.

use std::collections::{BTreeMap, HashSet};
use std::time::Duration;

use sluice_model::{Availability, SourceSpec};
use sluice_zk::layout::{self, AssignmentRecord, PipelineRecord, SourceRecord, WorkerRecord};
use sluice_zk::Expect;

use crate::balance::{self, LiveWorker, Move};
use crate::error::Result;
use crate::meta::StoredPipeline;
use crate::term::Term;
use crate::Shared;

/// How soon the leader looks again while a build is under way.
const BUILD_POLL: Duration = Duration::from_millis(150);

/// What a pass did and what it waits on next.
pub(crate) struct Pass {
    /// The tasks it moved.
    pub moves: Vec<Move>,
    /// When to look again before anything fires (a worker about to settle, a build).
    pub wake: Option<Duration>,
    /// Fires when the live workers change.
    pub watch: sluice_zk::Watch,
}

/// One pass: publish metadata, then assign, then the pipelines' work. `operator` when an
/// operator asked for a rebalance (every worker counts as settled, any imbalance moves).
#[tracing::instrument(name = "center.reconcile", skip_all, fields(epoch = term.epoch()))]
pub(crate) async fn reconcile(shared: &Shared, term: &Term<'_>, operator: bool) -> Result<Pass> {
    let (worker_ids, watch) = term.coord.children_watched("workers").await?;
    let sources = shared.meta.sources().await?;
    let pipelines = shared.meta.pipelines().await?;
    publish_metadata(term, &sources, &pipelines).await?;

    let (live, mut wake) = live_workers(shared, term, &worker_ids, operator).await?;
    let tasks: Vec<String> = sources.iter().map(|s| s.name.clone()).collect();
    let task_set: HashSet<&str> = tasks.iter().map(String::as_str).collect();
    let (current, nodes) = current_assignments(shared, term, &worker_ids, &task_set).await?;
    drop_orphan_checkpoints(term, &task_set).await?;

    let threshold = if operator {
        1
    } else {
        shared.cfg.balance.threshold
    };
    let moves = balance::moves_for(&live, &tasks, &current, threshold);
    let stay = assign(shared, term, &moves, &worker_ids, operator, nodes).await?;
    restamp(term, stay).await?;

    let mut assigned = current;
    for m in &moves {
        assigned.insert(m.task.clone(), m.to.clone());
    }
    export_gauges(&live, &assigned, &pipelines, &task_set);

    if !crate::rebuild::start_needed(shared, term, &pipelines)
        .await?
        .is_empty()
    {
        // Builds started: publish them (and their pipelines' versions) at once.
        shared.nudge.notify_one();
    }
    let checking = crate::chunked::drive(shared, term, &pipelines).await?;
    if crate::build::drive(shared, term, &pipelines, &worker_ids).await? || checking {
        // Each phase of a build waits for this pass: a short one keeps the phases'
        // hand-offs (etls confirmed, plan made, chunks read, markers applied) to a
        // fraction of a second, for a few ZooKeeper reads per build.
        wake = Some(wake.map_or(BUILD_POLL, |w| w.min(BUILD_POLL)));
    }
    Ok(Pass { moves, wake, watch })
}

/// Sources → `mappings/<source>`, pipelines → `pipelines/<name>`.
async fn publish_metadata(
    term: &Term<'_>,
    sources: &[SourceSpec],
    pipelines: &[StoredPipeline],
) -> Result<()> {
    let epoch = term.epoch();
    let wanted: BTreeMap<String, Vec<u8>> = sources
        .iter()
        .map(|s| {
            let record = source_record(s, pipelines, epoch);
            (
                s.name.clone(),
                serde_json::to_vec(&record).expect("serializes"),
            )
        })
        .collect();
    publish(term, "mappings", &wanted).await?;
    let wanted: BTreeMap<String, Vec<u8>> = pipelines
        .iter()
        .map(|p| {
            let record = pipeline_record(p, epoch);
            (
                p.spec.name.clone(),
                serde_json::to_vec(&record).expect("serializes"),
            )
        })
        .collect();
    publish(term, "pipelines", &wanted).await
}

/// The live workers, each settled or not, and how soon the first unsettled one settles.
async fn live_workers(
    shared: &Shared,
    term: &Term<'_>,
    worker_ids: &[String],
    operator: bool,
) -> Result<(Vec<LiveWorker>, Option<Duration>)> {
    let settle = shared.cfg.balance.settle;
    let now = sluice_model::now_ms();
    let mut live = Vec::new();
    let mut wake: Option<Duration> = None;
    for id in worker_ids {
        let Some(node) = term.coord.get(&layout::worker(id)).await? else {
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
    Ok((live, wake))
}

/// The assignment nodes that stand, by task: worker, node version, record.
type Standing = BTreeMap<String, (String, i32, AssignmentRecord)>;

/// Current assignments (task → worker), including those of dead workers, and their nodes.
/// Only each task's latest recorded decision stands: a node of an older generation (a
/// deposed leader's late write, a half-finished move), a duplicate, an unreadable one or
/// one of a removed source is removed.
async fn current_assignments(
    shared: &Shared,
    term: &Term<'_>,
    worker_ids: &[String],
    task_set: &HashSet<&str>,
) -> Result<(BTreeMap<String, String>, Standing)> {
    let coord = term.coord;
    let mut current = BTreeMap::new();
    let mut nodes = Standing::new();
    let generations = shared.meta.generations().await?;
    for worker in coord.children("assignments").await? {
        let assigned = coord.children(&layout::assignments(&worker)).await?;
        if assigned.is_empty() && !worker_ids.contains(&worker) {
            term.acting()?;
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
                if r.epoch > term.epoch() {
                    return Err(term.deposed_by(&path, r.epoch));
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
            term.acting()?;
            coord.delete(&path, Some(node.version), false).await?;
            tracing::warn!(task, worker, reason, "assignment removed");
            record_removal(shared, term, &task, &worker, &path, reason).await?;
        }
    }
    Ok((current, nodes))
}

/// Records a removed assignment: a decision when its source was removed; otherwise only an
/// event (the task keeps its latest recorded decision, or gets a new one from the planner).
async fn record_removal(
    shared: &Shared,
    term: &Term<'_>,
    task: &str,
    worker: &str,
    path: &str,
    reason: &str,
) -> Result<()> {
    let me = &shared.cfg.center.id;
    if reason == "source removed" {
        shared
            .meta
            .record_assignment(term.epoch(), me, task, Some(worker), None, reason)
            .await?;
    } else {
        let what = format!("removed {path}: {reason}");
        let _ = shared.meta.add_event(me, "assignment", task, &what).await;
    }
    Ok(())
}

/// Checkpoints of removed sources go once nobody holds their lock, so a source added
/// again under the same name starts afresh (it may be another server).
async fn drop_orphan_checkpoints(term: &Term<'_>, task_set: &HashSet<&str>) -> Result<()> {
    let coord = term.coord;
    for task in coord.children("tasks").await? {
        if !task.starts_with("snap~")
            && !task_set.contains(task.as_str())
            && coord.get(&layout::lock(&task)).await?.is_none()
        {
            term.acting()?;
            coord.delete(&format!("tasks/{task}"), None, true).await?;
            tracing::info!(task, "checkpoint of a removed source deleted");
        }
    }
    Ok(())
}

/// Makes the `moves`: each recorded as a decision in the meta database first, then its old
/// node removed and the new one written. Returns the standing nodes that stay.
async fn assign(
    shared: &Shared,
    term: &Term<'_>,
    moves: &[Move],
    worker_ids: &[String],
    operator: bool,
    mut nodes: Standing,
) -> Result<Standing> {
    let epoch = term.epoch();
    for m in moves {
        term.acting()?;
        let reason = match (&m.from, operator) {
            (None, _) => "unassigned",
            (Some(from), _) if !worker_ids.contains(from) => "worker left",
            (Some(_), true) => "operator rebalance",
            (Some(_), false) => "rebalance",
        };
        let (me, from) = (&shared.cfg.center.id, m.from.as_deref());
        let generation = shared
            .meta
            .record_assignment(epoch, me, &m.task, from, Some(&m.to), reason)
            .await?;
        if let Some((from, version, _)) = nodes.remove(&m.task) {
            let old = layout::assignment(&from, &m.task);
            term.coord.delete(&old, Some(version), false).await?;
        }
        let rec = AssignmentRecord {
            epoch,
            generation,
            assigned_at_ms: sluice_model::now_ms(),
        };
        let data = serde_json::to_vec(&rec).expect("serializes");
        let node = layout::assignment(&m.to, &m.task);
        term.coord.put(&node, &data, Expect::Any).await?;
        tracing::info!(task = %m.task, from = ?m.from, to = %m.to, reason, generation, "task assigned");
    }
    Ok(nodes)
}

/// Assignments that stay: stamped with this term's epoch so workers (re)starting now trust
/// them. Compare-and-set: a node changed under us means someone else writes here.
async fn restamp(term: &Term<'_>, stay: Standing) -> Result<()> {
    let epoch = term.epoch();
    for (task, (worker, version, rec)) in stay {
        if rec.epoch < epoch {
            term.acting()?;
            let rec = AssignmentRecord { epoch, ..rec };
            let data = serde_json::to_vec(&rec).expect("serializes");
            let node = layout::assignment(&worker, &task);
            term.coord
                .put(&node, &data, Expect::Version(version))
                .await?;
        }
    }
    Ok(())
}

fn export_gauges(
    live: &[LiveWorker],
    assigned: &BTreeMap<String, String>,
    pipelines: &[StoredPipeline],
    task_set: &HashSet<&str>,
) {
    crate::metrics::update(|g| {
        g.workers_live = Some(live.len() as u64);
        g.tasks = live.iter().map(|w| (w.id.clone(), 0)).collect();
        for worker in assigned.values() {
            *g.tasks.entry(worker.clone()).or_default() += 1;
        }
        g.pipelines = Availability::ALL
            .into_iter()
            .map(|a| {
                let count = pipelines.iter().filter(|p| p.availability() == a).count();
                (a.as_str(), count as u64)
            })
            .collect();
        g.source_lag
            .retain(|source, _| task_set.contains(source.as_str()));
    });
}

/// Makes the children of `dir` exactly `wanted` (name → record), writing only what
/// differs. A record of a newer epoch means we were deposed.
async fn publish(term: &Term<'_>, dir: &str, wanted: &BTreeMap<String, Vec<u8>>) -> Result<()> {
    #[derive(serde::Deserialize)]
    struct Stamp {
        epoch: u64,
    }
    let coord = term.coord;
    for name in coord.children(dir).await? {
        if !wanted.contains_key(&name) {
            term.acting()?;
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
                if stamp.epoch > term.epoch() {
                    return Err(term.deposed_by(&rel, stamp.epoch));
                }
            }
            if node.data == *data {
                continue;
            }
        }
        term.acting()?;
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
