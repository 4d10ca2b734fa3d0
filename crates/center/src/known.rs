//! What the leader's passes know of ZooKeeper from one pass to the next: the directories
//! every pass reads — `mappings/`, `pipelines/`, `workers/` and `assignments/` — kept
//! current by watches ([`sluice_zk::DirCache`]), so that a pass reads what changed since
//! the last one rather than every node of the layout (at 200 sources on 20 workers, some
//! 450 reads, one after the other, in every pass). It lives as long as one term: a new
//! leader reads everything once.
//!
//! After each write of its own the pass makes the node's entry stale, so the next pass
//! reads it again whether or not the watch's news came in first.

use std::collections::BTreeMap;
use std::future::Future;

use futures::future::try_join_all;
use sluice_zk::layout::{self, AssignmentRecord, WorkerRecord};
use sluice_zk::{Coordinator, DirCache, ZkError};

use crate::error::{CenterError, Result};

/// What a record the leader publishes carries of who wrote it.
#[derive(Debug, Clone, PartialEq, serde::Deserialize)]
pub(crate) struct Stamp {
    pub epoch: u64,
}

pub(crate) struct Known {
    pub mappings: DirCache<Stamp>,
    pub pipelines: DirCache<Stamp>,
    pub workers: DirCache<WorkerRecord>,
    /// `assignments/`: a directory for each worker that was assigned a task.
    assignment_dirs: DirCache<()>,
    /// `assignments/<worker>/`, by worker.
    assignments: BTreeMap<String, DirCache<AssignmentRecord>>,
}

impl Known {
    pub fn new() -> Known {
        Known {
            mappings: DirCache::new("mappings"),
            pipelines: DirCache::new("pipelines"),
            workers: DirCache::new("workers"),
            assignment_dirs: DirCache::names_only("assignments"),
            assignments: BTreeMap::new(),
        }
    }

    /// Brings the assignments up to date: the workers' directories, then (at once) what
    /// changed in each.
    pub async fn refresh_assignments(&mut self, coord: &Coordinator) -> Result<()> {
        coord.refresh(&mut self.assignment_dirs).await?;
        let dirs = self.assignment_dirs.names();
        self.assignments.retain(|w, _| dirs.contains(w));
        for w in dirs {
            self.assignments
                .entry(w.clone())
                .or_insert_with(|| DirCache::new(&layout::assignments(w)));
        }
        try_join_all(self.assignments.values_mut().map(|c| coord.refresh(c))).await?;
        Ok(())
    }

    /// The assignment directories, by worker: each one's nodes by task.
    pub fn assignments(&self) -> &BTreeMap<String, DirCache<AssignmentRecord>> {
        &self.assignments
    }

    /// Runs `write`, a write of `assignments/<worker>/<task>` (`task` empty: of the
    /// worker's directory itself), as [`write`] does.
    pub async fn write_assignment<R>(
        &mut self,
        worker: &str,
        task: &str,
        write: impl Future<Output = std::result::Result<R, ZkError>>,
    ) -> Result<R> {
        let result = write.await;
        self.assignment_dirs.forget(worker);
        if let Some(dir) = self
            .assignments
            .get_mut(worker)
            .filter(|_| !task.is_empty())
        {
            dir.forget(task);
        }
        result.map_err(conflict_is_transient)
    }
}

/// Runs `write`, a write of the pass to child `name` of `cache`'s directory, then makes the
/// child stale. A write that lost to another writer (a version the pass read is no longer
/// there) means the pass decided on an outdated view: it is tried again shortly, reading
/// the node again, rather than taken as a failure retrying cannot mend.
pub(crate) async fn write<T, R>(
    cache: &mut DirCache<T>,
    name: &str,
    write: impl Future<Output = std::result::Result<R, ZkError>>,
) -> Result<R> {
    let result = write.await;
    cache.forget(name);
    result.map_err(conflict_is_transient)
}

/// A write that lost to another writer is tried again (see [`write`]); any other error
/// keeps its class.
pub(crate) fn conflict_is_transient(e: ZkError) -> CenterError {
    if e.is_conflict() {
        CenterError::transient(format!(
            "{e}: another writer changed it since this pass read it; reading it again"
        ))
    } else {
        e.into()
    }
}
