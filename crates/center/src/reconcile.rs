//! One pass of the leader: publish the meta database's sources and pipelines to
//! ZooKeeper, keep every source's task assigned to exactly one live worker, then drive
//! rebuilds, runs and builds a step each.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::time::Duration;

use sluice_model::{Availability, SourceSpec};
use sluice_zk::layout::{self, AssignmentRecord, PipelineRecord, SourceRecord};
use sluice_zk::{Cached, DirCache, Expect};

use crate::balance::{self, LiveWorker, Move};
use crate::error::{CenterError, Result};
use crate::known::{self, Known, Stamp, Wanted};
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
/// `known` is what the term's earlier passes read of ZooKeeper (see [`crate::known`]).
#[tracing::instrument(name = "center.reconcile", skip_all, fields(epoch = term.epoch()))]
pub(crate) async fn reconcile(
    shared: &Shared,
    term: &Term<'_>,
    known: &mut Known,
    operator: bool,
) -> Result<Pass> {
    let mut phases = Phases::start();
    // What the pass starts from, read at once: a round trip each, not one after another.
    let (workers, sources, pipelines, generations) = tokio::try_join!(
        async { Ok::<_, CenterError>(term.coord.children_watched("workers").await?) },
        async { Ok(shared.meta.sources().await?) },
        async { Ok(shared.meta.pipelines().await?) },
        async { Ok(shared.meta.generations().await?) },
    )?;
    let (worker_ids, watch) = workers;
    phases.done("read");
    publish_metadata(term, known, &sources, &pipelines).await?;
    phases.done("publish");

    let (live, mut wake) = live_workers(shared, term, known, &worker_ids, operator).await?;
    let tasks: Vec<String> = sources.iter().map(|s| s.name.clone()).collect();
    let task_set: HashSet<&str> = tasks.iter().map(String::as_str).collect();
    let judging = (worker_ids.as_slice(), &task_set, &generations);
    let (current, nodes) = current_assignments(shared, term, known, judging).await?;
    drop_orphan_checkpoints(term, known, &task_set).await?;
    phases.done("layout");

    let threshold = if operator {
        1
    } else {
        shared.cfg.balance.threshold
    };
    let moves = balance::moves_for(&live, &tasks, &current, threshold);
    let stay = assign(shared, term, known, &moves, &worker_ids, operator, nodes).await?;
    restamp(term, known, stay).await?;
    phases.done("assign");

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
    phases.done("rebuilds");
    let checking = crate::chunked::drive(shared, term, &pipelines).await?;
    phases.done("runs");
    let building =
        crate::build::drive(shared, term, &mut known.jobs, &pipelines, &worker_ids).await?;
    phases.done("builds");
    phases.say_if_slow();
    if building || checking {
        // Each phase of a build waits for this pass: a short one keeps the phases'
        // hand-offs (etls confirmed, plan made, chunks read, markers applied) to a
        // fraction of a second, for a few ZooKeeper reads per build.
        wake = Some(wake.map_or(BUILD_POLL, |w| w.min(BUILD_POLL)));
    }
    Ok(Pass { moves, wake, watch })
}

/// A pass longer than this says in the log how long each of its phases took.
const SLOW_PASS: Duration = Duration::from_millis(100);

/// When each phase of a pass ended, to say where a slow one spent its time.
struct Phases {
    started: std::time::Instant,
    ended: Vec<(&'static str, Duration)>,
}

impl Phases {
    fn start() -> Phases {
        Phases {
            started: std::time::Instant::now(),
            ended: Vec::new(),
        }
    }

    fn done(&mut self, phase: &'static str) {
        self.ended.push((phase, self.started.elapsed()));
    }

    /// Logs each phase's share of a pass that took longer than [`SLOW_PASS`].
    fn say_if_slow(&self) {
        let took = self.started.elapsed();
        if took < SLOW_PASS {
            return;
        }
        let mut before = Duration::ZERO;
        let phases: Vec<String> = (self.ended.iter())
            .map(|(phase, at)| {
                let spent = at.saturating_sub(before);
                before = *at;
                format!("{phase} {} ms", spent.as_millis())
            })
            .collect();
        tracing::info!(took_ms = took.as_millis() as u64, phases = %phases.join(", "), "slow reconcile pass");
    }
}

/// Sources → `mappings/<source>`, pipelines → `pipelines/<name>`.
async fn publish_metadata(
    term: &Term<'_>,
    known: &mut Known,
    sources: &[SourceSpec],
    pipelines: &[StoredPipeline],
) -> Result<()> {
    let epoch = term.epoch();
    let unchanged = (known.wanted.as_ref()).is_some_and(|w| {
        w.made_of.0 == epoch && w.made_of.1 == sources && w.made_of.2 == pipelines
    });
    if !unchanged {
        known.wanted = Some(wanted_records(epoch, sources, pipelines));
    }
    let wanted = known.wanted.as_ref().expect("made above");
    publish(term, &mut known.mappings, &wanted.mappings).await?;
    publish(term, &mut known.pipelines, &wanted.pipelines).await
}

/// The records of `mappings/` and `pipelines/` of `sources` and `pipelines`, stamped with
/// `epoch`.
fn wanted_records(epoch: u64, sources: &[SourceSpec], pipelines: &[StoredPipeline]) -> Wanted {
    let mappings = (sources.iter())
        .map(|s| {
            let record = source_record(s, pipelines, epoch);
            let data = serde_json::to_vec(&record).expect("serializes");
            (s.name.clone(), data)
        })
        .collect();
    let records = (pipelines.iter())
        .map(|p| {
            let record = pipeline_record(p, epoch);
            let data = serde_json::to_vec(&record).expect("serializes");
            (p.spec.name.clone(), data)
        })
        .collect();
    Wanted {
        made_of: (epoch, sources.to_vec(), pipelines.to_vec()),
        mappings,
        pipelines: records,
    }
}

/// The live workers, each settled or not, and how soon the first unsettled one settles.
/// `worker_ids` is the list this pass watches; their registrations come from `known`.
async fn live_workers(
    shared: &Shared,
    term: &Term<'_>,
    known: &mut Known,
    worker_ids: &[String],
    operator: bool,
) -> Result<(Vec<LiveWorker>, Option<Duration>)> {
    let coord = term.coord;
    coord.refresh(&mut known.workers).await?;
    let missing: Vec<&String> = (worker_ids.iter())
        .filter(|id| !known.workers.nodes().contains_key(*id))
        .collect();
    if !missing.is_empty() {
        // The watched list can be ahead of the watches' news: read those now.
        for id in missing {
            known.workers.forget(id);
        }
        coord.refresh(&mut known.workers).await?;
    }
    let settle = shared.cfg.balance.settle;
    let now = sluice_model::now_ms();
    let mut live = Vec::new();
    let mut wake: Option<Duration> = None;
    for id in worker_ids {
        let Some(cached) = known.workers.nodes().get(id) else {
            continue;
        };
        let rec = match &cached.record {
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

/// What assignments are judged by: the live workers, the sources' tasks, and each task's
/// latest recorded assignment (the meta database's generation).
type Judging<'a> = (&'a [String], &'a HashSet<&'a str>, &'a HashMap<String, u64>);

/// Current assignments (task → worker), including those of dead workers, and their nodes.
/// Only each task's latest recorded decision stands (see [`judge_assignments`]); the
/// other nodes, and the empty directories of dead workers, are removed.
async fn current_assignments(
    shared: &Shared,
    term: &Term<'_>,
    known: &mut Known,
    (worker_ids, task_set, generations): Judging<'_>,
) -> Result<(BTreeMap<String, String>, Standing)> {
    let coord = term.coord;
    known.assignments.refresh(coord).await?;
    let dirs = known.assignments.get().iter().map(|(w, c)| (w, c.nodes()));
    let judged = judge_assignments(dirs, worker_ids, task_set, generations, term.epoch())
        .map_err(|(path, epoch)| term.deposed_by(&path, epoch))?;
    for worker in &judged.empty_dirs {
        term.acting()?;
        let dir = layout::assignments(worker);
        let delete = coord.delete(&dir, None, false);
        known.assignments.write(worker, "", delete).await?;
    }
    for r in judged.removals {
        term.acting()?;
        let path = layout::assignment(&r.worker, &r.task);
        let delete = coord.delete(&path, Some(r.version), false);
        known.assignments.write(&r.worker, &r.task, delete).await?;
        tracing::warn!(
            task = r.task,
            worker = r.worker,
            reason = r.why,
            "assignment removed"
        );
        record_removal(shared, term, &r.task, &r.worker, &path, r.why).await?;
    }
    Ok((judged.current, judged.standing))
}

/// An assignment node that goes, and why.
#[derive(Debug, PartialEq)]
struct Removal {
    worker: String,
    task: String,
    version: i32,
    why: &'static str,
}

/// The assignment nodes judged: who runs what, the nodes that stand, those that go, and
/// the dead workers' directories left empty.
#[derive(Debug, Default, PartialEq)]
struct Judged {
    current: BTreeMap<String, String>,
    standing: Standing,
    removals: Vec<Removal>,
    empty_dirs: Vec<String>,
}

/// Judges the assignment nodes, by worker directory then task (`dirs`, in name order).
/// Only each task's latest recorded decision (`generations`, from the meta database)
/// stands: a node of an older generation (a deposed leader's late write, a half-finished
/// move), a second one of the same task, an unreadable one, or one of a removed source
/// goes. A node of a newer epoch than ours means we were deposed: `Err` with its path and
/// epoch.
fn judge_assignments<'a>(
    dirs: impl IntoIterator<Item = (&'a String, &'a BTreeMap<String, Cached<AssignmentRecord>>)>,
    live: &[String],
    tasks: &HashSet<&str>,
    generations: &HashMap<String, u64>,
    epoch: u64,
) -> std::result::Result<Judged, (String, u64)> {
    let mut judged = Judged::default();
    for (worker, nodes) in dirs {
        if nodes.is_empty() && !live.contains(worker) {
            judged.empty_dirs.push(worker.clone());
            continue;
        }
        for (task, cached) in nodes {
            let rec = cached.record.as_ref().ok();
            if let Some(r) = rec.filter(|r| r.epoch > epoch) {
                return Err((layout::assignment(worker, task), r.epoch));
            }
            let why = match rec {
                None => "unreadable assignment record",
                Some(_) if !tasks.contains(task.as_str()) => "source removed",
                Some(r) if generations.get(task) != Some(&r.generation) => {
                    "not the task's latest recorded assignment"
                }
                Some(_) if judged.current.contains_key(task) => "duplicate assignment",
                Some(r) => {
                    judged.current.insert(task.clone(), worker.clone());
                    let stands = (worker.clone(), cached.node.version, r.clone());
                    judged.standing.insert(task.clone(), stands);
                    continue;
                }
            };
            judged.removals.push(Removal {
                worker: worker.clone(),
                task: task.clone(),
                version: cached.node.version,
                why,
            });
        }
    }
    Ok(judged)
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
async fn drop_orphan_checkpoints(
    term: &Term<'_>,
    known: &mut Known,
    task_set: &HashSet<&str>,
) -> Result<()> {
    let coord = term.coord;
    coord.refresh(&mut known.tasks).await?;
    let orphans: Vec<String> = (known.tasks.names().iter())
        .filter(|t| !t.starts_with("snap~") && !task_set.contains(t.as_str()))
        .cloned()
        .collect();
    for task in orphans {
        if coord.get(&layout::lock(&task)).await?.is_none() {
            term.acting()?;
            let path = format!("tasks/{task}");
            known::write(&mut known.tasks, &task, coord.delete(&path, None, true)).await?;
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
    known: &mut Known,
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
            let delete = term.coord.delete(&old, Some(version), false);
            known.assignments.write(&from, &m.task, delete).await?;
        }
        let rec = AssignmentRecord {
            epoch,
            generation,
            assigned_at_ms: sluice_model::now_ms(),
        };
        let data = serde_json::to_vec(&rec).expect("serializes");
        // A node there already is someone else's write since this pass read.
        let node = layout::assignment(&m.to, &m.task);
        let create = term.coord.put(&node, &data, Expect::Absent);
        known.assignments.write(&m.to, &m.task, create).await?;
        tracing::info!(task = %m.task, from = ?m.from, to = %m.to, reason, generation, "task assigned");
    }
    Ok(nodes)
}

/// Assignments that stay: stamped with this term's epoch so workers (re)starting now trust
/// them. Compare-and-set: a node changed under us means someone else writes here.
async fn restamp(term: &Term<'_>, known: &mut Known, stay: Standing) -> Result<()> {
    let epoch = term.epoch();
    let sets = (stay.into_iter())
        .filter(|(_, (_, _, rec))| rec.epoch < epoch)
        .map(|(task, (worker, version, rec))| {
            let rec = AssignmentRecord { epoch, ..rec };
            let data = serde_json::to_vec(&rec).expect("serializes");
            let node = layout::assignment(&worker, &task);
            let set = async move {
                term.acting()?;
                let set = term.coord.put(&node, &data, Expect::Version(version));
                set.await.map(drop).map_err(known::conflict_is_transient)
            };
            ((worker, task), set)
        })
        .collect();
    known.assignments.write_all(sets).await
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

/// Makes the children of `cache`'s directory exactly `wanted` (name → record), writing
/// only what differs from what is there (see [`publish_plan`]).
async fn publish(
    term: &Term<'_>,
    cache: &mut DirCache<Stamp>,
    wanted: &BTreeMap<String, Vec<u8>>,
) -> Result<()> {
    let coord = term.coord;
    coord.refresh(cache).await?;
    let dir = cache.dir().to_owned();
    let plan = publish_plan(cache.nodes(), wanted, term.epoch())
        .map_err(|(name, epoch)| term.deposed_by(&format!("{dir}/{name}"), epoch))?;
    for name in plan.remove {
        term.acting()?;
        // With what others keep beneath (a pipeline's `needs_rebuild`).
        let path = format!("{dir}/{name}");
        known::write(cache, &name, coord.delete(&path, None, true)).await?;
        tracing::info!(dir, name, "removed");
    }
    let puts = (plan.put.into_iter())
        .map(|(name, expect)| {
            let (path, data) = (format!("{dir}/{name}"), &wanted[&name]);
            let put = async move {
                term.acting()?;
                let put = coord.put(&path, data, expect);
                put.await.map_err(known::conflict_is_transient)?;
                tracing::info!(node = %path, "published");
                Ok(())
            };
            (name, put)
        })
        .collect();
    known::write_all(cache, puts).await
}

/// The writes that make a directory's children exactly `wanted`.
#[derive(Debug, PartialEq)]
struct Publish {
    /// Children to remove.
    remove: Vec<String>,
    /// Children to write, each expecting what was read of it.
    put: Vec<(String, Expect)>,
}

/// What to write so that the children (`existing`, as read) are exactly `wanted`: a child
/// whose data is already the wanted record is left alone, so a pass over an unchanged
/// layout writes nothing. A child written at a newer epoch than ours means we were
/// deposed: `Err` with its name and epoch.
fn publish_plan(
    existing: &BTreeMap<String, Cached<Stamp>>,
    wanted: &BTreeMap<String, Vec<u8>>,
    epoch: u64,
) -> std::result::Result<Publish, (String, u64)> {
    for (name, cached) in existing {
        if let Ok(stamp) = &cached.record {
            if stamp.epoch > epoch {
                return Err((name.clone(), stamp.epoch));
            }
        }
    }
    let remove = (existing.keys())
        .filter(|name| !wanted.contains_key(*name))
        .cloned()
        .collect();
    let put = (wanted.iter())
        .filter_map(|(name, data)| match existing.get(name) {
            Some(c) if c.node.data == *data => None,
            Some(c) => Some((name.clone(), Expect::Version(c.node.version))),
            None => Some((name.clone(), Expect::Absent)),
        })
        .collect();
    Ok(Publish { remove, put })
}

/// The source's record: how to reach it, and what to capture — its own table patterns
/// plus every table of its pipelines, sharded ones by their patterns (none: everything,
/// which covers them).
pub(crate) fn source_record(
    s: &SourceSpec,
    pipelines: &[StoredPipeline],
    epoch: u64,
) -> SourceRecord {
    let mut spec = s.clone();
    if !spec.tables.is_empty() {
        for p in pipelines.iter().filter(|p| p.spec.source == s.name) {
            let patterns = p.spec.patterns();
            for pattern in &patterns {
                if !spec.shards.contains(pattern) {
                    spec.shards.push(pattern.clone());
                }
            }
            for (db, table) in p.spec.plain_tables() {
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
    use sluice_model::pipeline::TablePattern;
    use sluice_model::PipelineSpec;
    use sluice_zk::Node;

    fn cached<T>(data: &[u8], version: i32, record: std::result::Result<T, String>) -> Cached<T> {
        Cached {
            node: Node {
                data: data.to_vec(),
                version,
                ephemeral_owner: 0,
                created_zxid: 1,
            },
            record,
        }
    }

    fn stamped(data: &str, version: i32, epoch: u64) -> Cached<Stamp> {
        cached(data.as_bytes(), version, Ok(Stamp { epoch }))
    }

    #[test]
    fn publishing_an_unchanged_layout_writes_nothing_and_a_change_writes_its_own_nodes() {
        let existing = BTreeMap::from([
            ("a".to_owned(), stamped("A", 3, 2)),
            ("b".to_owned(), stamped("B", 5, 2)),
            ("gone".to_owned(), stamped("G", 1, 1)),
            ("junk".to_owned(), cached(b"?", 7, Err("not JSON".into()))),
        ]);
        let wanted = |pairs: &[(&str, &str)]| -> BTreeMap<String, Vec<u8>> {
            (pairs.iter())
                .map(|(n, d)| ((*n).to_owned(), d.as_bytes().to_vec()))
                .collect()
        };
        let same = wanted(&[("a", "A"), ("b", "B"), ("gone", "G"), ("junk", "?")]);
        assert_eq!(
            publish_plan(&existing, &same, 2),
            Ok(Publish {
                remove: vec![],
                put: vec![]
            }),
            "nothing changed: nothing written, whatever the layout's size"
        );
        let changed = wanted(&[("a", "A"), ("b", "B2"), ("c", "C"), ("junk", "J")]);
        assert_eq!(
            publish_plan(&existing, &changed, 2),
            Ok(Publish {
                remove: vec!["gone".into()],
                put: vec![
                    ("b".into(), Expect::Version(5)),
                    ("c".into(), Expect::Absent),
                    ("junk".into(), Expect::Version(7)),
                ],
            })
        );
        assert_eq!(
            publish_plan(&existing, &same, 1),
            Err(("a".into(), 2)),
            "a record of a newer leader: deposed"
        );
    }

    fn assignment(version: i32, epoch: u64, generation: u64) -> Cached<AssignmentRecord> {
        let rec = AssignmentRecord {
            epoch,
            generation,
            assigned_at_ms: 0,
        };
        cached(&serde_json::to_vec(&rec).unwrap(), version, Ok(rec))
    }

    #[test]
    fn only_each_tasks_latest_decision_stands() {
        let dirs: BTreeMap<String, BTreeMap<String, Cached<AssignmentRecord>>> = BTreeMap::from([
            (
                "w1".to_owned(),
                BTreeMap::from([
                    ("t1".to_owned(), assignment(4, 2, 10)),
                    ("t2".to_owned(), assignment(1, 1, 11)),
                    ("gone".to_owned(), assignment(1, 2, 12)),
                ]),
            ),
            (
                "w2".to_owned(),
                BTreeMap::from([
                    ("t1".to_owned(), assignment(0, 2, 10)),
                    ("t3".to_owned(), assignment(2, 2, 7)),
                    ("t4".to_owned(), cached(b"?", 9, Err("not JSON".into()))),
                ]),
            ),
            ("w3".to_owned(), BTreeMap::new()),
            ("w4".to_owned(), BTreeMap::new()),
        ]);
        let live = ["w1".to_owned(), "w2".to_owned(), "w4".to_owned()];
        let tasks = HashSet::from(["t1", "t2", "t3", "t4"]);
        let generations = HashMap::from([("t1".into(), 10), ("t2".into(), 11), ("t3".into(), 8)]);
        let judged = judge_assignments(&dirs, &live, &tasks, &generations, 2).unwrap();
        assert_eq!(
            judged.current,
            BTreeMap::from([("t1".into(), "w1".into()), ("t2".into(), "w1".into())])
        );
        assert_eq!(
            judged.standing["t2"].1, 1,
            "with the version a restamp expects"
        );
        let removed: Vec<(&str, &str, i32, &str)> = (judged.removals.iter())
            .map(|r| (r.worker.as_str(), r.task.as_str(), r.version, r.why))
            .collect();
        assert_eq!(
            removed,
            [
                ("w1", "gone", 1, "source removed"),
                ("w2", "t1", 0, "duplicate assignment"),
                ("w2", "t3", 2, "not the task's latest recorded assignment"),
                ("w2", "t4", 9, "unreadable assignment record"),
            ]
        );
        assert_eq!(judged.empty_dirs, ["w3"], "a dead worker's empty directory");
        assert_eq!(
            judge_assignments(&dirs, &live, &tasks, &generations, 1),
            Err(("assignments/w1/gone".into(), 2)),
            "a record of a newer leader: deposed"
        );
    }

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
            shards: Vec::new(),
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
        let mut sharded = PipelineSpec::table("s", "shop", r"db_\d+", r"orders_\d+");
        sharded.sharded = true;
        let stored = |spec| StoredPipeline {
            spec,
            live_version: 0,
            building_version: 0,
            history: Default::default(),
        };
        let record = source_record(&source, &[stored(spec), stored(other), stored(sharded)], 3);
        assert_eq!(
            record.spec.tables,
            ["shop.products", "crm.*", "shop.brands"],
            "its own patterns, then what its pipelines add; not other sources' tables"
        );
        assert_eq!(
            record.spec.shards,
            [TablePattern::new(r"db_\d+", r"orders_\d+")],
            "a sharded table is captured by its patterns"
        );
        let everything = SourceSpec {
            tables: vec![],
            ..source
        };
        assert!(source_record(&everything, &[], 3).spec.tables.is_empty());
    }
}
