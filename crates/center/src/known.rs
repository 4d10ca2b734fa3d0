//! What the leader's passes know of ZooKeeper from one pass to the next: the directories
//! every pass reads — `mappings/`, `pipelines/`, `workers/`, `assignments/`, `tasks/` and
//! `snapshots/` — kept current by watches ([`sluice_zk::DirCache`]), so that a pass reads
//! what changed since the last one rather than every node of the layout (at 200 sources
//! on 20 workers, some 450 reads one after the other in every pass); and the records it
//! last wanted published, so that an unchanged meta database is not serialized again. It
//! lives as long as one term: a new leader reads everything once.
//!
//! After each write of its own the pass makes the node's entry stale, so the next pass
//! reads it again whether or not the watch's news came in first.

use std::collections::BTreeMap;
use std::future::Future;

use futures::StreamExt as _;
use serde::de::DeserializeOwned;
use sluice_model::SourceSpec;
use sluice_zk::layout::{AssignmentRecord, WorkerRecord};
use sluice_zk::{Coordinator, DirCache, ZkError};

use crate::error::{CenterError, Result};
use crate::meta::StoredPipeline;

/// Writes a pass has under way at once. A session's requests are answered in order, the
/// heartbeat's among them: hundreds at once (a new leader's restamps) would hold it back
/// past its lease, and the leader would stop acting.
const WRITES_AT_ONCE: usize = 16;

/// Runs `writes`, at most [`WRITES_AT_ONCE`] at a time; their results in order.
async fn bounded<F: Future<Output = Result<()>>>(writes: Vec<F>) -> Vec<Result<()>> {
    futures::stream::iter(writes)
        .buffered(WRITES_AT_ONCE)
        .collect()
        .await
}

/// What a record the leader publishes carries of who wrote it.
#[derive(Debug, Clone, PartialEq, serde::Deserialize)]
pub(crate) struct Stamp {
    pub epoch: u64,
}

pub(crate) struct Known {
    pub mappings: DirCache<Stamp>,
    pub pipelines: DirCache<Stamp>,
    pub workers: DirCache<WorkerRecord>,
    /// `assignments/<worker>/<task>`.
    pub assignments: Dirs<AssignmentRecord>,
    /// `tasks/<task>`: whose checkpoints there are.
    pub tasks: DirCache<()>,
    /// `snapshots/<worker>/<job>`: the build jobs.
    pub jobs: Dirs<()>,
    /// The records the last pass wanted published.
    pub wanted: Option<Wanted>,
}

impl Known {
    pub fn new() -> Known {
        Known {
            mappings: DirCache::new("mappings"),
            pipelines: DirCache::new("pipelines"),
            workers: DirCache::new("workers"),
            assignments: Dirs::new("assignments", true),
            tasks: DirCache::names_only("tasks"),
            jobs: Dirs::new("snapshots", false),
            wanted: None,
        }
    }
}

/// The records of `mappings/` and `pipelines/` a pass wanted, and what they were made of.
pub(crate) struct Wanted {
    pub made_of: (u64, Vec<SourceSpec>, Vec<StoredPipeline>),
    pub mappings: BTreeMap<String, Vec<u8>>,
    pub pipelines: BTreeMap<String, Vec<u8>>,
}

/// A directory of directories (`assignments/<worker>/…`), both levels read through
/// watches.
pub(crate) struct Dirs<T> {
    top: DirCache<()>,
    with_nodes: bool,
    subs: BTreeMap<String, DirCache<T>>,
}

impl<T: DeserializeOwned> Dirs<T> {
    fn new(dir: &str, with_nodes: bool) -> Dirs<T> {
        Dirs {
            top: DirCache::names_only(dir),
            with_nodes,
            subs: BTreeMap::new(),
        }
    }

    /// Brings both levels up to date: the directories, then (at once) what changed in
    /// each.
    pub async fn refresh(&mut self, coord: &Coordinator) -> Result<()> {
        coord.refresh(&mut self.top).await?;
        let names = self.top.names();
        self.subs.retain(|d, _| names.contains(d));
        for d in names {
            let dir = format!("{}/{d}", self.top.dir());
            self.subs
                .entry(d.clone())
                .or_insert_with(|| match self.with_nodes {
                    true => DirCache::new(&dir),
                    false => DirCache::names_only(&dir),
                });
        }
        // One after the other: each reads what changed in it at once, and with nothing
        // changed reads nothing.
        for sub in self.subs.values_mut() {
            coord.refresh(sub).await?;
        }
        Ok(())
    }

    /// The directories by name, each as last looked at.
    pub fn get(&self) -> &BTreeMap<String, DirCache<T>> {
        &self.subs
    }

    /// Makes `<dir>/<name>` (`name` empty: `<dir>` itself) stale: it was just written.
    pub fn forget(&mut self, dir: &str, name: &str) {
        self.top.forget(dir);
        if let Some(sub) = self.subs.get_mut(dir).filter(|_| !name.is_empty()) {
            sub.forget(name);
        }
    }

    /// Runs `write`, a write of `<dir>/<name>` (`name` empty: of `<dir>` itself), as
    /// [`write`] does.
    pub async fn write<R>(
        &mut self,
        dir: &str,
        name: &str,
        write: impl Future<Output = std::result::Result<R, ZkError>>,
    ) -> Result<R> {
        let result = write.await;
        self.forget(dir, name);
        result.map_err(conflict_is_transient)
    }

    /// Runs `writes` at once, each a write of the pass to `<dir>/<name>`, as
    /// [`write_all`] does.
    pub async fn write_all<F: Future<Output = Result<()>>>(
        &mut self,
        writes: Vec<((String, String), F)>,
    ) -> Result<()> {
        let (nodes, writes): (Vec<_>, Vec<_>) = writes.into_iter().unzip();
        let results = bounded(writes).await;
        for (dir, name) in &nodes {
            self.forget(dir, name);
        }
        results.into_iter().collect()
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

/// Runs `writes` at once ([`WRITES_AT_ONCE`] at a time), each a write of the pass to
/// child `name` of `cache`'s directory (its errors already classed, see
/// [`conflict_is_transient`]), waits for all of them, then makes each of those children
/// stale. Writes of distinct nodes do not depend on each other: a new leader restamping
/// hundreds of them need not wait for each in turn.
pub(crate) async fn write_all<T, F: Future<Output = Result<()>>>(
    cache: &mut DirCache<T>,
    writes: Vec<(String, F)>,
) -> Result<()> {
    let (names, writes): (Vec<_>, Vec<_>) = writes.into_iter().unzip();
    let results = bounded(writes).await;
    for name in &names {
        cache.forget(name);
    }
    results.into_iter().collect()
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
