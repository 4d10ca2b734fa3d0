//! Documents read back from MySQL (pipelines with relations or a filter).
//!
//! A change of any table in a pipeline's tree marks the documents that contain the row
//! as dirty (`dirty.rs`): the root row's own document, or for a related row the documents
//! its join columns lead up to — from its before and after images, so a child moved from
//! one parent to another dirties both; here they are found through one query per level
//! above the first. Per batch each dirty document keeps the version of
//! the newest change that dirtied it; it is read back from the source (one query per
//! relation for a chunk of documents), in a snapshot that includes that change, and
//! written with that version, or deleted with it when its root row is gone or filtered
//! out.
//!
//! Why this converges: the read sees at least the change's effect; a later change
//! carries a higher version and causes another read; a replay or a retry can only lose a
//! version race (409) to a document read later.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

use futures::StreamExt as _;
use serde_json::Map;
use serde_json::Value as Json;
use sluice_elastic::{BulkOp, PartsWrite};
use sluice_model::RetryPolicy;
use sluice_mysql::docs::{Built, DocPlan, Floor, Reader, SourcePool};
use sluice_mysql::{MysqlError, SourceConfig};
use tokio::sync::oneshot;
use tokio_util::sync::CancellationToken;

use crate::batch::DeadLetter;
use crate::dirty::{Dirty, Entry, Prov, Work};
use crate::error::Result;
use crate::metrics::METRICS;
use crate::pipeline::Router;
use crate::write::{Lanes, Origin};

/// Documents read (and written) per chunk: bounds the etl's memory however many
/// documents one change reaches.
const CHUNK: usize = 256;
/// The fewest documents a chunk is cut to so that a few documents' reads run at once.
const MIN_CHUNK: usize = 32;

/// How many documents each chunk of `n` reads: enough chunks for `concurrency` reads at
/// once (a few hundred documents read in one chunk took 100–180 ms, in four at once about
/// a third of it), none larger than [`CHUNK`], none smaller than [`MIN_CHUNK`].
fn chunk_size(n: usize, concurrency: usize) -> usize {
    n.div_ceil(concurrency.max(1)).clamp(MIN_CHUNK, CHUNK)
}

/// Connections to the sources documents are read from, by source name.
#[derive(Default)]
pub(crate) struct Sources {
    pools: HashMap<String, Arc<SourcePool>>,
}

impl Sources {
    fn pool(&mut self, src: &SourceConfig) -> Arc<SourcePool> {
        if self.pools.get(&src.name).is_some_and(|p| p.config() != src) {
            // The source changed (host, password): new connections.
            self.pools.remove(&src.name);
        }
        let pool = self.pools.entry(src.name.clone());
        pool.or_insert_with(|| Arc::new(SourcePool::new(src.clone())))
            .clone()
    }

    /// Closes the pools no read holds any more (the others close as their reads end).
    pub async fn close(self) {
        for (_, pool) in self.pools {
            if let Ok(pool) = Arc::try_unwrap(pool) {
                pool.close().await;
            }
        }
    }
}

/// How documents are read back: the retries, how many chunks at once, until when.
pub(crate) struct Reading<'a> {
    pub retry: RetryPolicy,
    /// Chunks read at once, each on a connection of its own.
    pub concurrency: usize,
    pub shutdown: &'a CancellationToken,
    /// Told once every document is read (the last bulks may still be going): the next
    /// batch's reads may begin, as what they read is never older than what these read.
    pub done: std::sync::Mutex<Option<oneshot::Sender<()>>>,
}

impl Reading<'_> {
    /// Says the reads are done (once; later calls do nothing).
    pub fn reads_done(&self) {
        let told = self.done.lock().map(|mut d| d.take());
        if let Ok(Some(tx)) = told {
            let _ = tx.send(());
        }
    }
}

/// The documents a batch dirtied, with what reading them back needs, detached from the
/// router: they are read and written in a task of their own, beside the batches that
/// follow.
pub(crate) struct Reads {
    pipelines: Vec<PipelineReads>,
    /// The messages of pipelines whose documents cannot be read at all.
    unreadable: Vec<DeadLetter>,
}

/// One pipeline's part of [`Reads`].
struct PipelineReads {
    name: String,
    pool: Arc<SourcePool>,
    targets: Vec<String>,
    works: Vec<Work>,
    /// Its documents are written in parts: a change below the root patches its part.
    in_parts: bool,
}

impl Reads {
    /// What reading back `dirty` needs, from the router and the sources' pools.
    pub fn of(router: &Router, sources: &mut Sources, dirty: Dirty) -> Reads {
        let mut reads = Reads {
            pipelines: Vec::new(),
            unreadable: Vec::new(),
        };
        for (p, works) in dirty.pipelines {
            let pipeline = &router.pipelines[p];
            let name = pipeline.cfg.spec.name.clone();
            match &pipeline.cfg.source {
                Ok(src) => reads.pipelines.push(PipelineReads {
                    name,
                    pool: sources.pool(src),
                    targets: router.targets(p).to_vec(),
                    works,
                    in_parts: pipeline.in_parts,
                }),
                // Marked only once compiled, which needs the source: cannot happen.
                Err(why) => {
                    for work in &works {
                        unreadable(&mut reads.unreadable, &name, work.messages(), why);
                    }
                }
            }
        }
        reads
    }

    /// Reads back and writes every document. `false` when shutdown came while the
    /// source or Elasticsearch was unavailable (nothing may be committed).
    pub async fn run(self, lanes: &mut Lanes<'_>, reading: &Reading<'_>) -> Result<bool> {
        lanes.dead_letter(self.unreadable);
        let n = self.pipelines.len();
        for (i, pipeline) in self.pipelines.into_iter().enumerate() {
            if !pipeline.run(lanes, reading, i + 1 == n).await? {
                return Ok(false);
            }
        }
        Ok(true)
    }
}

impl PipelineReads {
    /// `last`: no pipeline's reads come after this one's in the batch.
    async fn run(
        mut self,
        lanes: &mut Lanes<'_>,
        reading: &Reading<'_>,
        last: bool,
    ) -> Result<bool> {
        let mut dead: Vec<(BTreeSet<usize>, String)> = Vec::new();
        let works = std::mem::take(&mut self.works);
        let n_works = works.len();
        for (w, work) in works.into_iter().enumerate() {
            let ctx = Rebuild {
                pool: &self.pool,
                name: &self.name,
                retry: reading.retry,
                shutdown: reading.shutdown,
            };
            let Some(docs) = ctx.walk_up(work, &mut dead).await else {
                return Ok(false);
            };
            let n_docs = docs.len();
            for (d, (plan, k, entries)) in docs.into_iter().enumerate() {
                let plan = &plan[k];
                let groups = groups(entries.into_values(), self.in_parts);
                for (parts, entries) in &groups {
                    let form = self.form(plan, parts.is_some());
                    let read = Read {
                        plan,
                        parts: parts.as_deref(),
                        form,
                    };
                    if !self
                        .write(&ctx, &read, entries, lanes, reading, &mut dead)
                        .await?
                    {
                        return Ok(false);
                    }
                }
                // The last of the batch's reads: the next batch's may begin while these
                // bulks go. (A patch that finds no document is read again whole below,
                // maybe after the next batch read: at its lower versions, the parts'
                // script keeps whatever that one writes.)
                if last && w + 1 == n_works && d + 1 == n_docs {
                    reading.reads_done();
                }
                // Another plan or compilation may hold the same documents.
                if !lanes.settle().await? {
                    return Ok(false);
                }
                if !self
                    .write_missing(&ctx, plan, &groups, lanes, reading, &mut dead)
                    .await?
                {
                    return Ok(false);
                }
            }
        }
        let mut letters = Vec::new();
        for (msgs, why) in dead {
            let why = format!("cannot read its documents from the source: {why}");
            unreadable(&mut letters, &self.name, msgs, &why);
        }
        lanes.dead_letter(letters);
        Ok(true)
    }

    /// Writes whole the documents of `groups` whose patches found no document (not
    /// written yet, or deleted), read again. `false` on shutdown.
    async fn write_missing(
        &self,
        ctx: &Rebuild<'_>,
        plan: &DocPlan,
        groups: &[(Option<Vec<usize>>, Vec<Entry>)],
        lanes: &mut Lanes<'_>,
        reading: &Reading<'_>,
        dead: &mut Vec<(BTreeSet<usize>, String)>,
    ) -> Result<bool> {
        let missing: BTreeSet<String> =
            lanes.take_missing().into_iter().map(|(_, id)| id).collect();
        if missing.is_empty() {
            return Ok(true);
        }
        let again: Vec<Entry> = (groups.iter())
            .filter(|(parts, _)| parts.is_some())
            .flat_map(|(_, entries)| entries.iter())
            .filter(|e| {
                plan.document_id(&e.key)
                    .is_some_and(|id| missing.contains(&id))
            })
            .map(|e| Entry {
                fresh: true,
                ..e.clone()
            })
            .collect();
        let read = Read {
            plan,
            parts: None,
            form: self.form(plan, false),
        };
        Ok(self.write(ctx, &read, &again, lanes, reading, dead).await? && lanes.settle().await?)
    }

    /// How documents of `plan` read whole or in parts (`patch`) are written.
    fn form(&self, plan: &DocPlan, patch: bool) -> Form {
        match (self.in_parts, patch) {
            (false, _) => Form::Index,
            (true, false) => Form::Whole(plan.part_names()),
            (true, true) => Form::Patch(plan.part_names()),
        }
    }

    /// Reads `entries` back as `read` says and writes them. One plan's documents are
    /// each read once: their bulks may fly together, and its chunks are read several at
    /// once (each in its own snapshot, as one chunk always was), written in their order.
    /// `false` on shutdown.
    async fn write(
        &self,
        ctx: &Rebuild<'_>,
        read: &Read<'_>,
        entries: &[Entry],
        lanes: &mut Lanes<'_>,
        reading: &Reading<'_>,
        dead: &mut Vec<(BTreeSet<usize>, String)>,
    ) -> Result<bool> {
        let size = chunk_size(entries.len(), reading.concurrency);
        let mut chunks = entries.chunks(size);
        let mut reads = futures::stream::FuturesOrdered::new();
        loop {
            while reads.len() < reading.concurrency.max(1) {
                let Some(chunk) = chunks.next() else { break };
                reads.push_back(ctx.read_chunk(read, chunk));
            }
            let Some((chunk, built, unread)) = reads.next().await else {
                return Ok(true);
            };
            dead.extend(unread);
            let Some(built) = built else {
                return Ok(false);
            };
            METRICS
                .documents_read
                .add(built.len() as u64, &crate::metrics::pipeline(&self.name));
            let (ops, origins) = operations(&self.targets, chunk, built, &read.form);
            if !lanes.push(ops, origins).await? {
                return Ok(false);
            }
        }
    }
}

/// A plan's dirty documents as they are read: whole (`None`), or, when its documents are
/// written in parts, by the set of parts read for them.
fn groups(
    entries: impl Iterator<Item = Entry>,
    in_parts: bool,
) -> Vec<(Option<Vec<usize>>, Vec<Entry>)> {
    let mut by: BTreeMap<Option<Vec<usize>>, Vec<Entry>> = BTreeMap::new();
    for e in entries {
        let parts = (in_parts && e.root.is_none()).then(|| e.parts.keys().copied().collect());
        by.entry(parts).or_default().push(e);
    }
    by.into_iter().collect()
}

/// What a chunk's read reads, and how its documents are written.
struct Read<'a> {
    plan: &'a DocPlan,
    /// `None`: whole documents; else these parts (indexes of the root's relations).
    parts: Option<&'a [usize]>,
    form: Form,
}

/// How documents read back are written.
enum Form {
    /// Whole, with external versions.
    Index,
    /// Whole, in parts (these the names of the plan's parts).
    Whole(Vec<String>),
    /// Some parts alone (these the names of the plan's parts).
    Patch(Vec<String>),
}

/// Reading one pipeline's documents back.
struct Rebuild<'a> {
    pool: &'a SourcePool,
    name: &'a str,
    retry: RetryPolicy,
    shutdown: &'a CancellationToken,
}

/// A plan's dirty documents, with the plans they are read with.
type Docs = Vec<(Arc<Vec<DocPlan>>, usize, HashMap<String, Entry>)>;

/// A chunk read back: its documents (`None` on shutdown), and what could not be read.
type ChunkRead<'c> = futures::future::BoxFuture<
    'c,
    (
        &'c [Entry],
        Option<Vec<Built>>,
        Vec<(BTreeSet<usize>, String)>,
    ),
>;

impl Rebuild<'_> {
    /// [`Rebuild::read`] of one chunk, boxed: the reads run in a spawned task, and a
    /// closure's future over borrowed chunks is not known to be `Send` otherwise.
    fn read_chunk<'c>(&'c self, read: &'c Read<'c>, chunk: &'c [Entry]) -> ChunkRead<'c> {
        Box::pin(async move {
            let mut dead = Vec::new();
            let built = self.read(read.plan, read.parts, chunk, &mut dead).await;
            (chunk, built, dead)
        })
    }

    /// Resolves the work's walk-ups into dirty documents. `None` on shutdown; what
    /// cannot be looked up joins `dead` with its messages.
    async fn walk_up(
        &self,
        mut work: Work,
        dead: &mut Vec<(BTreeSet<usize>, String)>,
    ) -> Option<Docs> {
        let plans = work.plans.clone();
        for ((k, path, cols, part), values) in std::mem::take(&mut work.lookups) {
            let mut all = Prov::empty();
            for (_, prov) in &values {
                all.merge(prov);
            }
            let plan = &plans[k];
            let (pool, name, floor) = (self.pool, self.name, &all.floor);
            let (path, cols, rows) = (&path, &cols, &values);
            let found = retrying(self.retry, self.shutdown, || {
                let values = rows.clone();
                async move {
                    let mut r = pool.reader().await?;
                    r.begin_after(floor).await?;
                    let roots = plan
                        .roots_of(&mut r, path, cols, values, &Prov::merge)
                        .await;
                    count_queries(name, &r);
                    let _ = r.end().await;
                    roots
                }
            })
            .await?;
            match found {
                Ok(roots) => {
                    for (key, prov) in roots {
                        let version = prov.version();
                        let at = work.entry(k, key, &prov).parts.entry(part).or_default();
                        *at = version.max(*at);
                    }
                }
                Err(e) => dead.push((all.msgs, e.to_string())),
            }
        }
        Some(
            work.docs
                .into_iter()
                .map(|(k, entries)| (plans.clone(), k, entries))
                .collect(),
        )
    }

    /// Reads the documents of `chunk`, in a snapshot that includes their newest
    /// changes. A value that cannot be read is narrowed down by halves to its documents,
    /// which join `dead` with their messages; any other definite failure takes the chunk
    /// there. `None` on shutdown.
    async fn read(
        &self,
        plan: &DocPlan,
        parts: Option<&[usize]>,
        chunk: &[Entry],
        dead: &mut Vec<(BTreeSet<usize>, String)>,
    ) -> Option<Vec<Built>> {
        let mut built = Vec::new();
        let mut pending: Vec<std::ops::Range<usize>> = Vec::new();
        pending.push(0..chunk.len());
        while let Some(range) = pending.pop() {
            let part = &chunk[range.clone()];
            let keys: Vec<Vec<Json>> = part.iter().map(|e| e.key.clone()).collect();
            let mut floor = Floor::default();
            for e in part {
                floor.merge(&e.prov.floor);
            }
            let (pool, name, floor, keys) = (self.pool, self.name, &floor, &keys);
            let read = retrying(self.retry, self.shutdown, || async move {
                let mut r = pool.reader().await?;
                r.begin_after(floor).await?;
                let built = match parts {
                    None => plan.read(&mut r, keys).await,
                    Some(parts) => plan.read_parts(&mut r, keys, parts).await,
                };
                count_queries(name, &r);
                let _ = r.end().await;
                built
            })
            .await?;
            match read {
                Ok(b) => built.extend(b),
                Err(e @ MysqlError::Value { .. }) if range.len() > 1 => {
                    tracing::debug!(error = %e, "a document cannot be read; narrowing it down");
                    let mid = range.start + range.len() / 2;
                    pending.push(range.start..mid);
                    pending.push(mid..range.end);
                }
                Err(e) => {
                    let msgs = part.iter().flat_map(|e| e.prov.msgs.iter().copied());
                    dead.push((msgs.collect(), e.to_string()));
                }
            }
        }
        Some(built)
    }
}

/// Dead letters for every message that dirtied something in a pipeline whose documents
/// cannot be made (`why`: its spec does not fit its tables, its source is unreachable,
/// a read failed for good).
pub(crate) fn unreadable(
    dead: &mut Vec<DeadLetter>,
    pipeline: &str,
    msgs: impl IntoIterator<Item = usize>,
    why: &str,
) {
    for msg in msgs {
        dead.push(DeadLetter {
            msg,
            reason: format!("pipeline {pipeline}: {why}"),
            pipeline: Some(pipeline.to_owned()),
            index: None,
        });
    }
}

/// The writes for a chunk's documents as read: each indexed (or deleted) with the version
/// of the newest change that dirtied it, on every target, in `form`; a child document
/// that had another routing is deleted there after it is indexed under the new one (in
/// this order: if both routings lead to one shard, the delete then loses to the index).
/// Each write comes from every message that dirtied its document.
fn operations(
    targets: &[String],
    chunk: &[Entry],
    built: Vec<Built>,
    form: &Form,
) -> (Vec<BulkOp>, Vec<Origin>) {
    let by_key: HashMap<String, &Entry> = chunk
        .iter()
        .map(|e| (serde_json::to_string(&e.key).expect("serializes"), e))
        .collect();
    let (mut ops, mut origins) = (Vec::new(), Vec::new());
    for b in built {
        let Some(entry) = by_key.get(&serde_json::to_string(&b.key).expect("serializes")) else {
            continue;
        };
        let origin = Origin::many(&entry.prov.msgs);
        let write = |index: &String, routing: Option<String>, doc: Option<&Map<String, Json>>| {
            write_of(form, entry, index, &b.id, routing, doc)
        };
        for index in targets {
            let mut push = |op| {
                ops.push(op);
                origins.push(origin.clone());
            };
            match &b.doc {
                Some(doc) => push(write(index, b.routing.clone(), Some(doc))),
                None if entry.routings.is_empty() => push(write(index, None, None)),
                None => {}
            }
            for old in entry
                .routings
                .iter()
                .filter(|r| Some(*r) != b.routing.as_ref())
            {
                push(write(index, Some(old.clone()), None));
            }
        }
    }
    (ops, origins)
}

/// The write of one document (`None`: its delete) into `index`, in `form`. In parts,
/// each part is written at the version of the newest change below the root that reached
/// it, when newer than the write's own (a whole write's is its root's newest change):
/// what a document holds then depends on the changes alone, not on how they were batched.
fn write_of(
    form: &Form,
    entry: &Entry,
    index: &str,
    id: &str,
    routing: Option<String>,
    doc: Option<&Map<String, Json>>,
) -> BulkOp {
    let newest = entry.prov.version();
    let version = match form {
        Form::Whole(_) => entry.root.unwrap_or(newest),
        _ => newest,
    };
    let at = |names: &[String]| -> BTreeMap<String, u64> {
        (entry.parts.iter())
            .filter(|(_, v)| **v > version || matches!(form, Form::Patch(_)))
            .filter_map(|(i, v)| Some((names.get(*i)?.clone(), *v)))
            .collect()
    };
    let (index, id) = (index.to_owned(), id.to_owned());
    let parts = |write, version| BulkOp::Parts {
        index: index.clone(),
        id: id.clone(),
        version,
        routing: routing.clone(),
        write,
    };
    match (form, doc) {
        (Form::Index, Some(doc)) => BulkOp::Index {
            index,
            id,
            version,
            routing,
            doc: Json::Object(doc.clone()),
        },
        (Form::Index, None) => BulkOp::Delete {
            index,
            id,
            version,
            routing,
        },
        (Form::Whole(names), Some(doc)) => {
            let whole = PartsWrite::whole(doc.clone(), names, at(names), entry.fresh);
            parts(whole, version)
        }
        (Form::Patch(names), Some(doc)) => parts(
            PartsWrite::Patch {
                parts: doc.clone(),
                at: at(names),
            },
            version,
        ),
        (_, None) => parts(PartsWrite::Delete, newest),
    }
}

fn count_queries(pipeline: &str, r: &Reader<'_>) {
    let pipeline = crate::metrics::pipeline(pipeline);
    METRICS.source_queries.add(r.queries, &pipeline);
    METRICS.source_rows.add(r.rows, &pipeline);
}

/// Runs `f` until it succeeds or fails for good, pausing between transient failures:
/// `None` when shutdown came first.
async fn retrying<T, F: std::future::Future<Output = Result<T, MysqlError>>>(
    retry: RetryPolicy,
    shutdown: &CancellationToken,
    // Not an async closure: the reads run in a spawned task, and an async closure's
    // future is not known to be `Send` for every lifetime of its borrows.
    mut f: impl FnMut() -> F,
) -> Option<Result<T, MysqlError>> {
    let mut backoff = retry.backoff();
    loop {
        match f().await {
            Err(e) if e.is_transient() => {
                let pause = backoff.next_pause();
                tracing::warn!(error = %e, retry_in = ?pause, "the source is unavailable for reading documents; retrying");
                if !sluice_runtime::shutdown::pause(pause, shutdown).await {
                    return None;
                }
            }
            done => return Some(done),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn documents_are_cut_into_enough_chunks_to_be_read_at_once_within_bounds() {
        assert_eq!(chunk_size(300, 4), 75, "four reads at once");
        assert_eq!(chunk_size(5000, 4), CHUNK, "no chunk larger than the bound");
        assert_eq!(chunk_size(40, 4), MIN_CHUNK, "a few documents: one chunk");
        assert_eq!(chunk_size(300, 0), CHUNK, "one read at a time");
    }

    fn entry(key: i64, version: u64, msgs: &[usize], routings: &[&str]) -> Entry {
        Entry {
            key: vec![json!(key)],
            prov: Prov {
                floor: Floor {
                    version,
                    ..Floor::default()
                },
                msgs: msgs.iter().copied().collect(),
            },
            routings: routings.iter().map(|r| r.to_string()).collect(),
            root: Some(version),
            fresh: false,
            parts: BTreeMap::new(),
        }
    }

    fn built(key: i64, routing: Option<&str>, doc: bool) -> Built {
        Built {
            key: vec![json!(key)],
            id: format!("c#{key}"),
            routing: routing.map(String::from),
            doc: doc.then(|| json!({"id": key}).as_object().unwrap().clone()),
        }
    }

    #[test]
    fn in_parts_each_part_is_written_at_the_newest_change_that_reached_it() {
        // The root changed at 10; a change below part 0 at 14, below part 1 at 8.
        let mut e = entry(7, 14, &[1], &[]);
        e.root = Some(10);
        e.parts = BTreeMap::from([(0, 14), (1, 8)]);
        let names = vec!["skus".to_owned(), "brand".to_owned()];
        let doc = json!({"id": 7, "skus": [], "brand": null});
        let doc = doc.as_object().unwrap();
        let at = |op: BulkOp| match op {
            BulkOp::Parts { version, write, .. } => match write {
                PartsWrite::Whole { at, .. } | PartsWrite::Patch { at, .. } => (version, at),
                PartsWrite::Delete => (version, BTreeMap::new()),
            },
            _ => panic!("a write in parts"),
        };
        let whole = write_of(&Form::Whole(names.clone()), &e, "i", "7", None, Some(doc));
        assert_eq!(
            at(whole),
            (10, BTreeMap::from([("skus".to_owned(), 14)])),
            "a whole write is its root's; a part above it says so"
        );
        let patch = write_of(&Form::Patch(names.clone()), &e, "i", "7", None, Some(doc));
        let every = BTreeMap::from([("skus".to_owned(), 14), ("brand".to_owned(), 8)]);
        assert_eq!(at(patch), (14, every), "a patch names each part's own");
        let gone = write_of(&Form::Whole(names), &e, "i", "7", None, None);
        assert_eq!(at(gone).0, 14, "a delete is the newest change's");
    }

    #[test]
    fn a_moved_child_is_indexed_under_its_new_parent_then_deleted_under_the_old() {
        let targets = ["i_v1".to_owned()];
        let chunk = [
            entry(7, 90, &[1, 3], &["1", "2"]),
            entry(8, 80, &[4], &["5"]),
        ];
        let (ops, origins) = operations(
            &targets,
            &chunk,
            vec![built(7, Some("2"), true), built(8, None, false)],
            &Form::Index,
        );
        let shape: Vec<(String, Option<&str>, u64)> = ops
            .iter()
            .map(|o| {
                let kind = if matches!(o, BulkOp::Index { .. }) {
                    "index"
                } else {
                    "delete"
                };
                (format!("{kind} {}", o.id()), o.routing(), o.version())
            })
            .collect();
        assert_eq!(
            shape,
            [
                ("index c#7".into(), Some("2"), 90),
                ("delete c#7".into(), Some("1"), 90),
                ("delete c#8".into(), Some("5"), 80),
            ]
        );
        let both = Origin::many(&[1, 3]);
        assert_eq!(origins, [both.clone(), both, Origin::many(&[4])]);
    }
}
