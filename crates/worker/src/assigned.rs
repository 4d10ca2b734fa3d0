//! Cluster mode: run exactly the tasks the leader assigned to this worker.
//!
//! The worker watches `assignments/<me>` and, for each assigned task, the assignment node
//! and the source's `mappings/<source>` record (how to reach it, what to capture). It
//! starts a task only for an assignment stamped with the current leader epoch (a deposed
//! leader's late write is ignored); it stops a task when its assignment or source goes,
//! and restarts it when the source's record changes. Whether it may *publish* is still
//! decided by the task's ephemeral lock and fenced checkpoint (invariant 1), never by the
//! assignment alone.

use std::collections::BTreeMap;
use std::time::Duration;

use sluice_mysql::SourceConfig;
use sluice_zk::layout::{self, AssignmentRecord, SourceRecord};
use sluice_zk::{Coordinator, SessionState, Watch, ZkError, LEADER_NODE};
use tokio::sync::mpsc::UnboundedSender;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::report::Reports;
use crate::task::{self, TaskCtx};

/// What a task is started with: everything but the task's own progress and stop token.
pub(crate) type MakeCtx<'a> = dyn Fn(&str, CancellationToken) -> TaskCtx + Send + Sync + 'a;

struct Running {
    record: SourceRecord,
    stop: CancellationToken,
    handle: JoinHandle<()>,
}

/// One assigned task as ZooKeeper shows it now.
struct Assigned {
    /// Stamped with the current epoch (or newer): safe to start.
    trusted: bool,
    /// The source's record; `None` when the source is gone.
    source: Option<SourceRecord>,
}

/// Follows this worker's assignments until the session expires or `shutdown`.
pub(crate) async fn run_tasks(
    coord: &Coordinator,
    worker: &str,
    retry: sluice_model::RetryPolicy,
    make_ctx: &MakeCtx<'_>,
    access: &sluice_mysql::Access,
    reports: &Reports,
    shutdown: &CancellationToken,
) {
    // Reading the assignments, and starting tasks that could not start, are retried
    // with pauses of their own.
    let mut reading = retry.backoff();
    let mut starting = retry.backoff();
    // Tasks say here that they ended (their handles are awaited only once finished).
    let (ended_tx, mut ended) = tokio::sync::mpsc::unbounded_channel::<()>();
    let mut tasks = Tasks {
        make_ctx,
        access,
        reports,
        shutdown,
        ended_tx,
        running: BTreeMap::new(),
        failing: BTreeMap::new(),
    };
    let session = coord.session();
    loop {
        if shutdown.is_cancelled() || *session.borrow() == SessionState::Expired {
            break;
        }
        let (assigned, watches) = match look(coord, worker).await {
            Ok(v) => v,
            Err(ZkError::SessionExpired) => break,
            Err(e) => {
                let pause = reading.next_pause();
                tracing::warn!(error = %e, retry_in = ?pause, "cannot read the assignments; retrying");
                sluice_runtime::shutdown::pause(pause, shutdown).await;
                continue;
            }
        };
        reading.reset();
        tasks.stop_unwanted(&assigned).await;
        tasks.reap_ended();
        tasks.forget_unassigned(&assigned);
        let retry = !tasks.start_wanted(&assigned);
        let again = if retry {
            starting.next_pause()
        } else {
            starting.reset();
            Duration::ZERO
        };
        tokio::select! {
            _ = coord.wait_any(watches, shutdown) => {}
            _ = ended.recv() => {}
            _ = tokio::time::sleep(again), if retry => {}
        }
    }
    tasks.stop_all().await;
}

/// The tasks this worker runs, and those it could not start.
struct Tasks<'a> {
    make_ctx: &'a MakeCtx<'a>,
    access: &'a sluice_mysql::Access,
    reports: &'a Reports,
    shutdown: &'a CancellationToken,
    /// Given to each task, to say when it ended.
    ended_tx: UnboundedSender<()>,
    running: BTreeMap<String, Running>,
    /// Tasks that cannot start here (e.g. the password reference does not resolve), with
    /// the error already reported: reported again only when it changes.
    failing: BTreeMap<String, String>,
}

impl Tasks<'_> {
    /// Stops what is no longer ours, or whose source went or changed.
    async fn stop_unwanted(&mut self, assigned: &BTreeMap<String, Assigned>) {
        let names: Vec<String> = self.running.keys().cloned().collect();
        for name in names {
            if let Some(why) = why_stop(assigned.get(&name), &self.running[&name].record) {
                tracing::info!(task = %name, why, "stopping the task");
                let r = self.running.remove(&name).expect("running");
                stop(&name, r).await;
            }
        }
    }

    /// Drops the tasks that ended by themselves; they start again while still assigned.
    fn reap_ended(&mut self) {
        // They end so when the session expired under them, or on a bug.
        self.running.retain(|name, r| {
            if r.handle.is_finished() {
                tracing::warn!(task = %name, "task ended on its own");
            }
            !r.handle.is_finished()
        });
    }

    /// Forgets the progress and failures of tasks no longer ours (not ours to report).
    fn forget_unassigned(&mut self, assigned: &BTreeMap<String, Assigned>) {
        self.reports.retain(|name| assigned.contains_key(name));
        self.failing.retain(|name, _| assigned.contains_key(name));
    }

    /// Starts what is ours, trusted and not running; `false` when a task could not start.
    fn start_wanted(&mut self, assigned: &BTreeMap<String, Assigned>) -> bool {
        let mut all_started = true;
        for (name, a) in assigned {
            if self.running.contains_key(name) {
                continue;
            }
            let Some(record) = &a.source else {
                continue;
            };
            if !a.trusted {
                tracing::warn!(task = %name, "assignment carries an old leader epoch; waiting for the current leader to confirm it");
                continue;
            }
            all_started &= self.start(name, record);
        }
        all_started
    }

    /// Starts task `name` on its source's `record`; `false` when it cannot start.
    fn start(&mut self, name: &str, record: &SourceRecord) -> bool {
        let src = match SourceConfig::from_spec(&record.spec, self.access) {
            Ok(s) => {
                self.failing.remove(name);
                s
            }
            Err(e) => {
                if self.failing.get(name) != Some(&e) {
                    tracing::error!(task = %name, error = %e, "cannot start the task; retrying every 5 s");
                    self.reports.event("task_error", name, e.clone());
                    self.failing.insert(name.to_owned(), e);
                }
                return false;
            }
        };
        let stop = self.shutdown.child_token();
        let ctx = (self.make_ctx)(name, stop.clone());
        tracing::info!(task = %name, host = %record.spec.host, port = record.spec.port, "starting the assigned task");
        let ended_tx = self.ended_tx.clone();
        let coords = record.spec.coordinates;
        let handle = tokio::spawn(async move {
            task::run_source(ctx, src, coords).await;
            let _ = ended_tx.send(());
        });
        self.running.insert(
            name.to_owned(),
            Running {
                record: record.clone(),
                stop,
                handle,
            },
        );
        true
    }

    /// Stops every running task and waits for each to end.
    async fn stop_all(self) {
        for (name, r) in self.running {
            stop(&name, r).await;
        }
    }
}

/// Why a task running on source record `running` must stop, given its assignment now.
fn why_stop(assigned: Option<&Assigned>, running: &SourceRecord) -> Option<&'static str> {
    match assigned {
        None => Some("its assignment was removed"),
        Some(Assigned { source: None, .. }) => Some("its source was removed"),
        Some(Assigned {
            source: Some(s), ..
        }) if !same_source(s, running) => Some("its source changed"),
        Some(_) => None,
    }
}

/// Stops a task and waits for it to end.
async fn stop(name: &str, r: Running) {
    r.stop.cancel();
    if let Err(e) = r.handle.await {
        tracing::error!(task = %name, error = %e, "task ended abnormally");
    }
}

/// Reads this worker's assignments and their sources, with watches on all of them and
/// on the leader epoch.
async fn look(
    coord: &Coordinator,
    worker: &str,
) -> Result<(BTreeMap<String, Assigned>, Vec<Watch>), ZkError> {
    let mut watches = Vec::new();
    let (leader, w) = coord.get_watched(LEADER_NODE).await?;
    watches.push(w);
    let epoch = leader
        .and_then(|n| serde_json::from_slice::<sluice_zk::EpochRecord>(&n.data).ok())
        .map_or(0, |r| r.epoch);
    let (names, w) = coord.children_watched(&layout::assignments(worker)).await?;
    watches.push(w);
    let mut assigned = BTreeMap::new();
    for name in names {
        let (node, w) = coord
            .get_watched(&layout::assignment(worker, &name))
            .await?;
        watches.push(w);
        let Some(node) = node else { continue };
        let trusted = match serde_json::from_slice::<AssignmentRecord>(&node.data) {
            Ok(rec) => rec.epoch >= epoch,
            Err(e) => {
                tracing::warn!(task = %name, error = %e, "unreadable assignment; ignoring it");
                false
            }
        };
        let (source, w) = coord.get_watched(&layout::mapping(&name)).await?;
        watches.push(w);
        let source = source.and_then(|n| match serde_json::from_slice::<SourceRecord>(&n.data) {
            Ok(s) => Some(s),
            Err(e) => {
                tracing::warn!(task = %name, error = %e, "unreadable source record; ignoring it");
                None
            }
        });
        assigned.insert(name, Assigned { trusted, source });
    }
    Ok((assigned, watches))
}

/// The same source apart from the epoch stamp (a new leader restamps unchanged records).
/// A change of what to capture counts: the task restarts from its confirmed position
/// with the new tables (a pipeline added a related table, say), in this process.
fn same_source(a: &SourceRecord, b: &SourceRecord) -> bool {
    a.spec == b.spec
}
