//! Consistency checks: workers claim the chunks of root keys a check was cut into
//! (`checks/<pipeline>/claims/<n>`, ephemeral, so a dead worker's chunk is claimed again)
//! and compare, per chunk, the documents the document builder makes from MySQL with the
//! ones the index holds.
//!
//! Every read is a lock-free consistent snapshot with its watermarks (see
//! [`sluice_mysql::Watermarks`]: every change logged before `low` is in it, none logged
//! after `high`; on MariaDB both are the snapshot's exact position).
//!
//! A chunk is judged in two rounds, so that the stream's own changes are never taken for
//! drift:
//!
//! 1. **Survey.** The chunk's root rows are read in batches, each in a consistent snapshot
//!    whose high watermark is `P`; the index is scanned over the same key range
//!    (`search_after` on the key). A document the index holds at a version above `P`'s
//!    was written after the read: skipped. What else differs is a suspect.
//! 2. **Confirm** (only suspects). Read them again in a snapshot `S2` (high watermark
//!    `P2`); wait until the source's task confirmed `P2` and every etl group consuming the
//!    pipeline committed past a probe written after it to each partition of the
//!    pipeline's change topics (so everything up to `P2` is applied); read them from the
//!    index (real time); read them from MySQL once more, in `S3`. A key whose document
//!    changed between `S2` and `S3`, or whose index copy is newer than `P2`, was touched
//!    by the stream while it was read: skipped. What still differs is reported.
//!
//! A repair sends the document read in `S3` (or an orphan's delete) through the etl, by
//! the pipeline's build topic, with the version of `S3`'s low watermark: it holds every
//! change before it, and a newer change always wins over it.
//!
//! A compare (of a build held for verification) is such a check of the held version,
//! whose documents are also set beside the live version's (see [`live`]). A delayed
//! job's chunks come the same way, as lists of root keys: those documents are read again
//! and sent through the etl without comparing (see [`rebuild`]).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use serde_json::{json, Map, Value as Json};
use sluice_elastic::{versioned_index, EsClient, Hit};
use sluice_kafka::SharedProducer;
use sluice_model::{BuildDocument, ENVELOPE_VERSION};
use sluice_mysql::docs::{Built, DocPlan, Reader};
use sluice_mysql::{Key, Watermarks};
use sluice_zk::layout::{self, CheckRecord, CheckTally, ChunkRecord, SourceRecord};
use sluice_zk::{Coordinator, Expect, SessionState, ZkError};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::config::WorkerConfig;
use crate::error::{Context as _, Result, WorkerError};
use crate::snapshot::{confirmed, version_at};

mod applied;
mod live;
mod scan;

use applied::settle;
use scan::scan;

/// Root rows per snapshot read, and documents per index page.
const BATCH: usize = 1000;

pub(crate) struct Checks {
    pub cfg: Arc<WorkerConfig>,
    pub coord: Coordinator,
    pub producer: SharedProducer,
    pub es: EsClient,
}

/// How soon a worker that found no chunk to claim looks again (other workers' claims
/// fire no watch here).
const UNCLAIMED_POLL: Duration = Duration::from_millis(500);

/// Claims and checks chunks until the session expires or `shutdown`.
pub(crate) async fn claim_chunks(c: Arc<Checks>, shutdown: &CancellationToken) {
    let session = c.coord.session();
    let mut backoff = c.cfg.worker.retry().backoff();
    loop {
        if shutdown.is_cancelled() || *session.borrow() == SessionState::Expired {
            return;
        }
        let (pipelines, watch) = match c.coord.children_watched("checks").await {
            Ok(v) => v,
            Err(ZkError::SessionExpired) => return,
            Err(e) => {
                let pause = backoff.next_pause();
                tracing::warn!(error = %e, retry_in = ?pause, "cannot read the checks; retrying");
                sluice_runtime::shutdown::pause(pause, shutdown).await;
                continue;
            }
        };
        if pipelines.is_empty() {
            c.coord.wait_any(vec![watch], shutdown).await;
            continue;
        }
        let mut worked = false;
        let mut failed = false;
        for p in &pipelines {
            match claim_and_check(&c, p, shutdown).await {
                Ok(did) => worked |= did,
                Err(e) => {
                    tracing::warn!(pipeline = %p, error = format!("{e:#}"), "check chunk failed; it is claimed again");
                    failed = true;
                }
            }
        }
        if failed {
            sluice_runtime::shutdown::pause(backoff.next_pause(), shutdown).await;
        } else {
            backoff.reset();
            if !worked {
                // Claims of other workers fire no watch here: look again shortly.
                sluice_runtime::shutdown::pause(UNCLAIMED_POLL, shutdown).await;
            }
        }
    }
}

/// Claims one unclaimed chunk of `pipeline`'s check and checks it; `false` when none was
/// left to claim.
async fn claim_and_check(c: &Checks, pipeline: &str, stop: &CancellationToken) -> Result<bool> {
    let Some(rec) = c
        .coord
        .get_json::<CheckRecord>(&layout::check(pipeline))
        .await?
    else {
        return Ok(false);
    };
    let done = c.coord.children(&layout::check_results(pipeline)).await?;
    for n in 0..rec.chunks {
        if done.contains(&layout::chunk_name(n)) {
            continue;
        }
        let me = json!({ "worker": c.cfg.worker.id, "check": rec.id }).to_string();
        if !c
            .coord
            .claim(&layout::check_claim(pipeline, n), me.as_bytes())
            .await?
        {
            continue;
        }
        let tally = match check_chunk(c, &rec, n, stop).await {
            Ok(tally) => tally,
            // Retrying cannot mend it: the check fails with the reason.
            Err(e @ WorkerError::Definite(_)) => CheckTally {
                error: Some(format!("chunk {n}: {e}")),
                ..CheckTally::default()
            },
            Err(e) => {
                let _ = c
                    .coord
                    .delete(&layout::check_claim(pipeline, n), None, false)
                    .await;
                return Err(e);
            }
        };
        // Only for the check it was read for (a new one may have replaced it).
        let current = c
            .coord
            .get_json::<CheckRecord>(&layout::check(pipeline))
            .await?;
        if current.is_some_and(|r| r.id == rec.id) && !stop.is_cancelled() {
            c.coord
                .put(
                    &layout::check_result(pipeline, n),
                    &serde_json::to_vec(&tally)?,
                    Expect::Any,
                )
                .await?;
        }
        let _ = c
            .coord
            .delete(&layout::check_claim(pipeline, n), None, false)
            .await;
        return Ok(true);
    }
    Ok(false)
}

/// One document on both sides.
#[derive(Default)]
struct Pair {
    /// The key (id values) and the document, with the version of the read that made it.
    mysql: Option<(Built, u64)>,
    index: Option<Hit>,
}

/// What a comparison made of a key.
#[derive(Debug, PartialEq, Eq)]
enum Verdict {
    Equal,
    /// Written by the stream after the read: not judged.
    Touched,
    Missing,
    Extra,
    Different(String),
}

fn judge(mysql: Option<&Map<String, Json>>, read_at: u64, index: Option<&Hit>) -> Verdict {
    if index.is_some_and(|h| h.version > read_at) {
        return Verdict::Touched;
    }
    match (mysql, index) {
        (None, None) => Verdict::Equal,
        (Some(_), None) => Verdict::Missing,
        (None, Some(_)) => Verdict::Extra,
        (Some(doc), Some(hit)) => match hit.source.as_object() {
            Some(src) if src == doc => Verdict::Equal,
            Some(src) => Verdict::Different(differing_fields(doc, src)),
            None => Verdict::Different("the index's _source is not an object".into()),
        },
    }
}

/// The first few fields whose values differ.
fn differing_fields(a: &Map<String, Json>, b: &Map<String, Json>) -> String {
    let names = sluice_model::diff::differing_fields(a, b);
    let more = names.len().saturating_sub(3);
    let mut s = names.iter().take(3).cloned().collect::<Vec<_>>().join(", ");
    if more > 0 {
        s.push_str(&format!(" and {more} more"));
    }
    format!("fields differ: {s}")
}

struct Ctx<'a> {
    rec: &'a CheckRecord,
    plan: &'a DocPlan,
    src: &'a sluice_mysql::SourceConfig,
    epoch: u16,
    index: String,
}

async fn check_chunk(
    c: &Checks,
    rec: &CheckRecord,
    n: u32,
    stop: &CancellationToken,
) -> Result<CheckTally> {
    let p = &rec.spec.name;
    let (chunk, src, plan) = chunk_plan(c, rec, n).await?;
    let epoch = confirmed(&c.coord, &rec.spec.source)
        .await?
        .map_or(0, |cp| cp.epoch);
    if rec.kind.rebuilds() {
        if chunk.keys.is_empty() {
            let lower: Option<Key> = serde_json::from_value(chunk.lower)?;
            let upper: Option<Key> = serde_json::from_value(chunk.upper)?;
            let range = (lower.as_ref(), upper.as_ref());
            let part = (chunk.kind, chunk.shard.as_ref());
            return rebuild_range(c, rec, part, &src, epoch, range).await;
        }
        return rebuild(c, rec, (chunk.kind, None), &src, epoch, &chunk.keys).await;
    }
    let ctx = Ctx {
        rec,
        plan: &plan,
        src: &src,
        epoch,
        index: versioned_index(&rec.spec.alias(), rec.version),
    };
    if !c.es.index_exists(&ctx.index).await? {
        return Err(WorkerError::definite(format!(
            "index {} does not exist (nothing was written to the pipeline yet, or the version was deleted)",
            ctx.index
        )));
    }
    let lower: Option<Key> = serde_json::from_value(chunk.lower)?;
    let upper: Option<Key> = serde_json::from_value(chunk.upper)?;
    let started = Instant::now();
    let pairs = survey(c, &ctx, lower.as_ref(), upper.as_ref(), stop).await?;
    let mut tally = CheckTally {
        keys: pairs.len() as u64,
        ..CheckTally::default()
    };
    let suspects = suspects(&pairs, &mut tally);
    if !suspects.is_empty() {
        confirm(c, &ctx, &pairs, &suspects, &mut tally).await?;
    }
    if rec.against > 0 {
        tally.live =
            live::compare(c, &ctx, rec.against, &pairs, lower.as_ref(), upper.as_ref()).await?;
    }
    tracing::info!(
        pipeline = %p, check = rec.id, chunk = n, keys = tally.keys, suspects = suspects.len(),
        drift = tally.drift(), took_ms = started.elapsed().as_millis() as u64, "check chunk done"
    );
    Ok(tally)
}

/// Chunk `n` of the check, its source, and the plan of the chunk's kind of document.
async fn chunk_plan(
    c: &Checks,
    rec: &CheckRecord,
    n: u32,
) -> Result<(ChunkRecord, sluice_mysql::SourceConfig, DocPlan)> {
    let p = &rec.spec.name;
    let chunk: ChunkRecord = c
        .coord
        .get_json(&layout::check_chunk(p, n))
        .await?
        .ok_or_else(|| {
            WorkerError::transient(format!("chunk {n} of the check of {p} is not planned"))
        })?;
    let source: SourceRecord = c
        .coord
        .get_json(&layout::mapping(&rec.spec.source))
        .await?
        .ok_or_else(|| WorkerError::transient(format!("source {} is gone", rec.spec.source)))?;
    let src = sluice_mysql::SourceConfig::from_spec(&source.spec, &c.cfg.source_access())
        .map_err(WorkerError::transient)?;
    let plans = sluice_mysql::docs::load(&src, &rec.spec)
        .await?
        .map_err(unfit)?;
    let plan = narrowed(rec, plans, (chunk.kind, chunk.shard.as_ref()))?;
    Ok((chunk, src, plan))
}

fn unfit(problems: Vec<String>) -> WorkerError {
    WorkerError::definite(format!(
        "the pipeline does not fit its tables: {}",
        problems.join("; ")
    ))
}

/// A chunk's document kind, and for a sharded root the shard its range is of.
type Part<'a> = (usize, Option<&'a (String, String)>);

/// Document kind `kind` of `plans` (only `shard` of a sharded root), its root narrowed
/// as the run asks (a window, a resync's condition).
fn narrowed(
    rec: &CheckRecord,
    mut plans: Vec<DocPlan>,
    (kind, shard): Part<'_>,
) -> Result<DocPlan> {
    if kind >= plans.len() {
        return Err(WorkerError::definite(format!(
            "document kind {kind} is gone"
        )));
    }
    let mut plan = plans.swap_remove(kind);
    if let Some((db, table)) = shard {
        plan = plan
            .for_shard(db, table)
            .ok_or_else(|| WorkerError::definite(format!("shard {db}.{table} is gone")))?;
    }
    if let Some(since) = rec.since_ms {
        restrict_to_recent(&mut plan, &rec.spec.check.updated_column, since)?;
    }
    if let Some(condition) = &rec.condition {
        narrow(&mut plan, format!("({condition})"));
    }
    Ok(plan)
}

/// The plan of document kind `kind`, compiled against the tables as the snapshot open on
/// `reader` sees them — a DDL between the chunk's start and this read cannot cut columns
/// from documents stamped newer than it — and narrowed as the run asks.
async fn plan_in_snapshot(
    reader: &mut Reader<'_>,
    rec: &CheckRecord,
    part: Part<'_>,
) -> Result<DocPlan> {
    let plans = reader.compile(&rec.spec).await?.map_err(unfit)?;
    narrowed(rec, plans, part)
}

/// The surveyed keys whose copies differ; those the stream touched count as skipped.
fn suspects(pairs: &BTreeMap<String, Pair>, tally: &mut CheckTally) -> Vec<String> {
    let mut suspects: Vec<String> = Vec::new();
    for (id, pair) in pairs {
        let (doc, at) = match &pair.mysql {
            Some((b, at)) => (b.doc.as_ref(), *at),
            None => (None, u64::MAX),
        };
        match judge(doc, at, pair.index.as_ref()) {
            Verdict::Equal => {}
            Verdict::Touched => tally.skipped += 1,
            _ => suspects.push(id.clone()),
        }
    }
    suspects
}

/// A delayed job's chunk: its documents read again, batch by batch, each batch in a
/// consistent snapshot, and sent through the etl to every version it writes at the
/// snapshot's version (a root that is gone or filtered out: a delete).
async fn rebuild(
    c: &Checks,
    rec: &CheckRecord,
    part: Part<'_>,
    src: &sluice_mysql::SourceConfig,
    epoch: u16,
    keys: &[Json],
) -> Result<CheckTally> {
    let keys: Vec<Vec<Json>> = keys
        .iter()
        .map(|k| serde_json::from_value(k.clone()))
        .collect::<Result<_, _>>()
        .map_err(|e| WorkerError::definite(format!("a chunk key is not a list of values: {e}")))?;
    let started = Instant::now();
    let mut reader = Reader::connect(src).await?;
    let mut tally = CheckTally {
        keys: keys.len() as u64,
        ..CheckTally::default()
    };
    for batch in keys.chunks(BATCH) {
        // Written with the low watermark: what it read holds every change before it.
        let position = reader.begin_snapshot().await?.low;
        let built = async {
            let plan = plan_in_snapshot(&mut reader, rec, part).await?;
            Ok::<_, WorkerError>(plan.read(&mut reader, batch).await?)
        }
        .await;
        reader.end().await?;
        let version = version_at(epoch, &position)?;
        let docs = rebuilt(rec, built?, version);
        tally.repaired += repair(c, &rec.spec.name, docs).await?;
    }
    reader.close().await;
    tracing::info!(
        pipeline = %rec.spec.name, job = rec.id, documents = tally.repaired,
        took_ms = started.elapsed().as_millis() as u64, "chunk of keys rebuilt"
    );
    Ok(tally)
}

/// A resync's range chunk: the root rows in `(lower, upper]` that match the plan's
/// (narrowed) root filter, read batch by batch, each batch in a consistent snapshot, and
/// their documents sent through the etl at the snapshot's version.
async fn rebuild_range(
    c: &Checks,
    rec: &CheckRecord,
    part: Part<'_>,
    src: &sluice_mysql::SourceConfig,
    epoch: u16,
    (lower, upper): (Option<&Key>, Option<&Key>),
) -> Result<CheckTally> {
    let started = Instant::now();
    let mut reader = Reader::connect(src).await?;
    let mut tally = CheckTally::default();
    let mut after = lower.cloned();
    loop {
        let position = reader.begin_snapshot().await?.low;
        let read = async {
            let plan = plan_in_snapshot(&mut reader, rec, part).await?;
            Ok::<_, WorkerError>(
                plan.read_range(&mut reader, after.as_ref(), upper, BATCH)
                    .await?,
            )
        }
        .await;
        reader.end().await?;
        let read = read?;
        tally.keys += read.rows as u64;
        let docs = rebuilt(rec, read.docs, version_at(epoch, &position)?);
        tally.repaired += repair(c, &rec.spec.name, docs).await?;
        if read.rows < BATCH {
            break;
        }
        after = read.last;
    }
    reader.close().await;
    tracing::info!(
        pipeline = %rec.spec.name, job = rec.id, documents = tally.repaired,
        took_ms = started.elapsed().as_millis() as u64, "range chunk rebuilt"
    );
    Ok(tally)
}

/// Documents read again, as the etl takes them: to every version it writes, at
/// `version` (a root that is gone or filtered out: a delete).
fn rebuilt(rec: &CheckRecord, built: Vec<Built>, version: u64) -> Vec<BuildDocument> {
    built
        .into_iter()
        .map(|b| BuildDocument {
            v: ENVELOPE_VERSION,
            pipeline: rec.spec.name.clone(),
            build: 0,
            id: b.id,
            routing: b.routing,
            version,
            deleted: b.doc.is_none(),
            doc: b.doc.unwrap_or_default(),
            columns: None,
            repair: true,
        })
        .collect()
}

/// Narrows the root to rows changed at or after `since_ms` (`check.updated_column`).
/// The readers' sessions are in UTC, as `FROM_UNIXTIME` then is.
fn restrict_to_recent(plan: &mut DocPlan, column: &str, since_ms: i64) -> Result<()> {
    if column.is_empty() {
        return Err(WorkerError::definite(
            "a check with a window needs check.updated_column",
        ));
    }
    let cond = format!(
        "`{}` >= FROM_UNIXTIME({}.{:03})",
        column.replace('`', "``"),
        since_ms.div_euclid(1000),
        since_ms.rem_euclid(1000)
    );
    narrow(plan, cond);
    Ok(())
}

/// Narrows the root to rows that also match `cond`.
fn narrow(plan: &mut DocPlan, cond: String) {
    plan.root.filter = Some(match plan.root.filter.take() {
        Some(f) => format!("({f}) AND {cond}"),
        None => cond,
    });
}

/// Round one: the chunk from MySQL, batch by batch, and the index over the same keys.
async fn survey(
    c: &Checks,
    ctx: &Ctx<'_>,
    lower: Option<&Key>,
    upper: Option<&Key>,
    stop: &CancellationToken,
) -> Result<BTreeMap<String, Pair>> {
    let mut pairs: BTreeMap<String, Pair> = BTreeMap::new();
    let mut reader = Reader::connect(ctx.src).await?;
    let mut after = lower.cloned();
    loop {
        if stop.is_cancelled() {
            return Err(WorkerError::transient("stopped"));
        }
        // Judged at the high watermark: an index copy above it was written after the
        // read, one at or below it is what the read may be compared with.
        let position = reader.begin_snapshot().await?.high;
        let read = ctx
            .plan
            .read_range(&mut reader, after.as_ref(), upper, BATCH)
            .await;
        reader.end().await?;
        let read = read?;
        let at = version_at(ctx.epoch, &position)?;
        for b in read.docs {
            let id = b.id.clone();
            pairs.entry(id).or_default().mysql = Some((b, at));
        }
        if read.rows < BATCH {
            break;
        }
        after = read.last;
    }
    reader.close().await;
    for (id, hit) in copies(c, ctx, &ctx.index, &pairs, lower, upper).await? {
        pairs.entry(id).or_default().index = Some(hit);
    }
    Ok(pairs)
}

/// The copies `index` holds of the chunk's documents: every document in the chunk's key
/// range, so that orphans are found too; for a window (orphans are a full check's), or a
/// sharded root (its shards' key ranges overlap in the index, whose documents do not say
/// their shard), only the copies of the documents MySQL has (`pairs`).
async fn copies(
    c: &Checks,
    ctx: &Ctx<'_>,
    index: &str,
    pairs: &BTreeMap<String, Pair>,
    lower: Option<&Key>,
    upper: Option<&Key>,
) -> Result<BTreeMap<String, Hit>> {
    if ctx.rec.since_ms.is_none() && ctx.plan.root.table.shards.is_none() {
        return scan(c, ctx, index, lower, upper).await;
    }
    let ids: Vec<(String, Option<String>)> = (pairs.iter())
        .filter_map(|(id, p)| {
            let (b, _) = p.mysql.as_ref()?;
            Some((id.clone(), b.routing.clone()))
        })
        .collect();
    let mut found = BTreeMap::new();
    for part in ids.chunks(BATCH) {
        let hits = c.es.mget_hits(index, part).await?;
        for ((id, _), hit) in part.iter().zip(hits) {
            found.extend(hit.map(|h| (id.clone(), h)));
        }
    }
    Ok(found)
}

/// Round two: judges the suspects again between two watermarks, once everything the
/// stream carried up to the first is applied; reports (and repairs) what still differs.
async fn confirm(
    c: &Checks,
    ctx: &Ctx<'_>,
    pairs: &BTreeMap<String, Pair>,
    suspects: &[String],
    tally: &mut CheckTally,
) -> Result<()> {
    let keys = suspect_keys(ctx, pairs, suspects, tally);
    let key_values: Vec<Vec<Json>> = keys.iter().map(|(_, k, _)| k.clone()).collect();
    let mut reader = Reader::connect(ctx.src).await?;
    let low = read_keys(&mut reader, ctx, &key_values).await?;
    settle(c, ctx, &low.marks.high).await?;
    let index = index_copies(c, ctx, &keys).await?;
    let high = read_keys(&mut reader, ctx, &key_values).await?;
    reader.close().await;
    let repairs = judge_again(ctx, &keys, &low, &high, &index, tally);
    if ctx.rec.repair && !repairs.is_empty() {
        tally.repaired = repair(c, &ctx.rec.spec.name, repairs).await?;
    }
    Ok(())
}

/// A suspect: its `_id`, its id values and its routing.
type SuspectKey = (String, Vec<Json>, Option<String>);

/// The id values of each suspect, from MySQL's side, else from the index's copy.
fn suspect_keys(
    ctx: &Ctx<'_>,
    pairs: &BTreeMap<String, Pair>,
    suspects: &[String],
    tally: &mut CheckTally,
) -> Vec<SuspectKey> {
    let id_cols = ctx.plan.root.names(&ctx.plan.id);
    let mut keys: Vec<SuspectKey> = Vec::new();
    for id in suspects {
        let pair = &pairs[id];
        let routing = pair
            .mysql
            .as_ref()
            .and_then(|(b, _)| b.routing.clone())
            .or_else(|| pair.index.as_ref().and_then(|h| h.routing.clone()));
        let key = match (&pair.mysql, &pair.index) {
            (Some((b, _)), _) => Some(b.key.clone()),
            (None, Some(h)) => id_cols
                .iter()
                .map(|col| h.source.get(col).cloned())
                .collect::<Option<Vec<Json>>>(),
            (None, None) => None,
        };
        match key {
            Some(k) => keys.push((id.clone(), k, routing)),
            None => {
                // An orphan without its id fields: it cannot come from any row.
                tally.found("extra", id, "the document lacks its id fields");
            }
        }
    }
    keys
}

/// The index's copies of the suspects now (real time), by `_id`.
async fn index_copies(
    c: &Checks,
    ctx: &Ctx<'_>,
    keys: &[SuspectKey],
) -> Result<BTreeMap<String, Hit>> {
    let refs: Vec<(String, Option<String>)> = keys
        .iter()
        .map(|(id, _, r)| (id.clone(), r.clone()))
        .collect();
    let mut index: BTreeMap<String, Hit> = BTreeMap::new();
    for part in refs.chunks(BATCH) {
        for (r, hit) in part.iter().zip(c.es.mget_hits(&ctx.index, part).await?) {
            if let Some(h) = hit {
                index.insert(r.0.clone(), h);
            }
        }
    }
    Ok(index)
}

/// Judges each suspect, read in `low` and `high`, against its index copy; returns the repairs.
fn judge_again(
    ctx: &Ctx<'_>,
    keys: &[SuspectKey],
    low: &Snapshot,
    high: &Snapshot,
    index: &BTreeMap<String, Hit>,
    tally: &mut CheckTally,
) -> Vec<BuildDocument> {
    let mut repairs = Vec::new();
    for (id, _, routing) in keys {
        let before = low.doc(id);
        let after = high.doc(id);
        if before != after {
            tally.skipped += 1;
            continue;
        }
        let (kind, detail) = match judge(before, low.judged, index.get(id)) {
            Verdict::Equal => continue,
            Verdict::Touched => {
                tally.skipped += 1;
                continue;
            }
            Verdict::Missing => ("missing", String::new()),
            Verdict::Extra => ("extra", String::new()),
            Verdict::Different(d) => ("different", d),
        };
        tally.found(kind, id, &detail);
        let hit_routing = index.get(id).and_then(|h| h.routing.clone());
        repairs.push(BuildDocument {
            v: ENVELOPE_VERSION,
            pipeline: ctx.rec.spec.name.clone(),
            build: ctx.rec.version,
            id: id.clone(),
            routing: routing.clone().or(hit_routing),
            version: high.written,
            doc: after.cloned().unwrap_or_default(),
            columns: None,
            repair: true,
            deleted: after.is_none(),
        });
    }
    repairs
}

/// Documents read in one consistent snapshot, by `_id`.
struct Snapshot {
    /// Where the snapshot stands in the binlog.
    marks: Watermarks,
    /// The version its documents are written with (its low watermark's: they hold
    /// every change before it).
    written: u64,
    /// The version an index copy is judged against (its high watermark's: a copy above
    /// it was written after the read).
    judged: u64,
    docs: BTreeMap<String, Built>,
}

impl Snapshot {
    /// The document `id`; `None` when its row is gone or filtered out.
    fn doc(&self, id: &str) -> Option<&Map<String, Json>> {
        self.docs.get(id).and_then(|b| b.doc.as_ref())
    }
}

async fn read_keys(reader: &mut Reader<'_>, ctx: &Ctx<'_>, keys: &[Vec<Json>]) -> Result<Snapshot> {
    let marks = reader.begin_snapshot().await?;
    let read = ctx.plan.read(reader, keys).await;
    reader.end().await?;
    Ok(Snapshot {
        written: version_at(ctx.epoch, &marks.low)?,
        judged: version_at(ctx.epoch, &marks.high)?,
        docs: read?.into_iter().map(|b| (b.id.clone(), b)).collect(),
        marks,
    })
}

/// Sends repairs through the etl (the pipeline's build topic); returns how many Kafka
/// acknowledged.
async fn repair(c: &Checks, pipeline: &str, docs: Vec<BuildDocument>) -> Result<u64> {
    let topic = c.cfg.topics.build_topic(pipeline);
    sluice_kafka::ensure_topics(&c.cfg.kafka, std::slice::from_ref(&topic)).await?;
    let producer = c.producer.get();
    let mut deliveries = Vec::with_capacity(docs.len());
    for doc in &docs {
        let payload = serde_json::to_vec(doc)?;
        deliveries.push(
            sluice_kafka::queue(&producer, &topic, Some(doc.id.as_bytes()), &payload)
                .await
                .with_context(|| format!("cannot publish a repair to {topic}"))?,
        );
    }
    for d in deliveries {
        d.acknowledged().await.context("Kafka refused a repair")?;
    }
    Ok(docs.len() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hit(version: u64, source: Json) -> Hit {
        Hit {
            version,
            source,
            ..Hit::default()
        }
    }

    #[test]
    fn a_copy_newer_than_the_read_is_not_judged() {
        let doc = json!({"id": 1, "a": "x"});
        let doc = doc.as_object().unwrap();
        assert_eq!(
            judge(Some(doc), 10, Some(&hit(11, json!({"id": 1})))),
            Verdict::Touched
        );
        assert_eq!(
            judge(Some(doc), 10, Some(&hit(10, json!({"id": 1, "a": "x"})))),
            Verdict::Equal
        );
        assert_eq!(judge(Some(doc), 10, None), Verdict::Missing);
        assert_eq!(
            judge(None, 10, Some(&hit(3, json!({"id": 1})))),
            Verdict::Extra
        );
        assert_eq!(
            judge(
                Some(doc),
                10,
                Some(&hit(3, json!({"id": 1, "a": "y", "b": 2})))
            ),
            Verdict::Different("fields differ: a, b".into())
        );
    }
}
