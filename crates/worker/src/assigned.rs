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
    let mut running: BTreeMap<String, Running> = BTreeMap::new();
    // Tasks that cannot start here (e.g. the password reference does not resolve), with
    // the error already reported: reported again only when it changes.
    let mut failing: BTreeMap<String, String> = BTreeMap::new();
    // Tasks say here that they ended (their handles are awaited only once finished).
    let (ended_tx, mut ended) = tokio::sync::mpsc::unbounded_channel::<()>();
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
        let mut retry = false;
        // Stop what is no longer ours, or whose source changed.
        let names: Vec<String> = running.keys().cloned().collect();
        for name in names {
            let stop_why = match assigned.get(&name) {
                None => Some("its assignment was removed"),
                Some(Assigned { source: None, .. }) => Some("its source was removed"),
                Some(Assigned {
                    source: Some(s), ..
                }) if !same_source(s, &running[&name].record) => Some("its source changed"),
                Some(_) => None,
            };
            if let Some(why) = stop_why {
                tracing::info!(task = %name, why, "stopping the task");
                let r = running.remove(&name).expect("running");
                r.stop.cancel();
                if let Err(e) = r.handle.await {
                    tracing::error!(task = %name, error = %e, "task ended abnormally");
                }
            }
        }
        // Reap tasks that ended by themselves (the session expired under them, or a bug):
        // they are started again below while still assigned.
        running.retain(|name, r| {
            if r.handle.is_finished() {
                tracing::warn!(task = %name, "task ended on its own");
            }
            !r.handle.is_finished()
        });
        // Progress of tasks no longer ours is not ours to report.
        reports.retain(|name| assigned.contains_key(name));
        failing.retain(|name, _| assigned.contains_key(name));
        // Start what is ours and not running.
        for (name, a) in &assigned {
            if running.contains_key(name) {
                continue;
            }
            let Some(record) = &a.source else {
                continue;
            };
            if !a.trusted {
                tracing::warn!(task = %name, "assignment carries an old leader epoch; waiting for the current leader to confirm it");
                continue;
            }
            let src = match SourceConfig::from_spec(&record.spec, access) {
                Ok(s) => {
                    failing.remove(name);
                    s
                }
                Err(e) => {
                    if failing.get(name) != Some(&e) {
                        tracing::error!(task = %name, error = %e, "cannot start the task; retrying every 5 s");
                        reports.event("task_error", name, e.clone());
                        failing.insert(name.clone(), e);
                    }
                    retry = true;
                    continue;
                }
            };
            let stop = shutdown.child_token();
            let ctx = make_ctx(name, stop.clone());
            tracing::info!(task = %name, host = %record.spec.host, port = record.spec.port, "starting the assigned task");
            let ended_tx = ended_tx.clone();
            let coords = record.spec.coordinates;
            let handle = tokio::spawn(async move {
                task::run_source(ctx, src, coords).await;
                let _ = ended_tx.send(());
            });
            running.insert(
                name.clone(),
                Running {
                    record: record.clone(),
                    stop,
                    handle,
                },
            );
        }

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
    for (name, r) in running {
        r.stop.cancel();
        if let Err(e) = r.handle.await {
            tracing::error!(task = %name, error = %e, "task ended abnormally");
        }
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
