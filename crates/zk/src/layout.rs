//! What lives at each path of the layout (README, Architecture), as JSON. The center writes
//! `mappings`, `pipelines` and `assignments`; workers write `workers`; the election writes
//! `election` and `leader`. Every record the leader writes carries its epoch: readers
//! ignore a record older than the current epoch in `leader` (a deposed leader's late write).

use serde::{Deserialize, Serialize};
use sluice_model::RunKind;

/// `election/c-<seq>`: a center candidate.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct CenterRecord {
    pub id: String,
    /// Where its gRPC API listens.
    pub addr: String,
    /// Where its web console is reached (`https://host:port`); empty from centers that
    /// predate it.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub console: String,
}

/// `workers/<id>` (ephemeral): a live worker.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct WorkerRecord {
    pub id: String,
    pub addr: String,
    pub version: String,
    pub started_at_ms: i64,
    /// When this registration (this session) was made.
    #[serde(default)]
    pub registered_at_ms: i64,
    /// How many binlog tasks it takes at most.
    pub capacity: u32,
    /// SHA-256 (hex) of the key this worker process sends with its reports to the center:
    /// a report for this worker is taken only with it, so no other caller (another
    /// worker, a person with a certificate) can speak for this one.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub report_key_sha256: String,
}

impl WorkerRecord {
    /// A new report key for a worker process, and the digest its record keeps.
    pub fn new_report_key() -> (String, String) {
        let mut bytes = [0u8; 32];
        getrandom::fill(&mut bytes).expect("the operating system's random source answers");
        let key = hex(&bytes);
        let digest = Self::report_key_digest(&key);
        (key, digest)
    }

    /// What a record keeps of report key `key`.
    pub fn report_key_digest(key: &str) -> String {
        use sha2::Digest as _;
        hex(&sha2::Sha256::digest(key.as_bytes()))
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// `assignments/<worker>/<task>`: the leader gave `task` to `worker`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct AssignmentRecord {
    pub epoch: u64,
    /// Grows with every assignment of any task (the meta database's history id).
    pub generation: u64,
    pub assigned_at_ms: i64,
}

/// `mappings/<source>`: how to reach a source and what a worker must capture of it
/// (`tables`: the source's own patterns plus every table of its pipelines).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct SourceRecord {
    pub epoch: u64,
    #[serde(flatten)]
    pub spec: sluice_model::SourceSpec,
}

/// `pipelines/<name>`: what the etl must apply.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct PipelineRecord {
    pub epoch: u64,
    pub spec: sluice_model::PipelineSpec,
    /// A version being built (`<alias>_v<N>`): the etl writes to it as well as to the
    /// indexes behind the alias.
    #[serde(default)]
    pub building: Option<u32>,
    /// Earlier versions kept current for rollback: the etl writes live changes to them
    /// too (never creating one that is gone).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub history: Vec<u32>,
}

/// `builds/<pipeline>`: a build in progress, driven by the leader.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct BuildRecord {
    pub epoch: u64,
    /// The pipeline as it was when the build started: what its documents are made of.
    pub spec: sluice_model::PipelineSpec,
    pub version: u32,
    /// Rows per chunk.
    pub chunk_rows: u64,
    /// Rows per second per chunk reader; 0 for no limit.
    pub throttle_rows_per_sec: u64,
    pub started_at_ms: i64,
    /// Held once caught up (phase `held`) until an operator releases the swap.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub verify: bool,
    /// A held build's swap was released (by a clean compare, or forced).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub released: bool,
    /// A held build's index has the pipeline's settings (replicas, refresh) and was
    /// refreshed: searchable, so a compare can read it.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub searchable: bool,
}

/// `builds/<pipeline>/plan`: written by the worker that planned the chunks.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct PlanRecord {
    pub chunks: u32,
    pub estimated_rows: u64,
}

/// `builds/<pipeline>/chunks/<n>`: the key range of chunk `n` (JSON keys as the snapshot
/// reader returns them; `null` for an open end) of the table of one kind of document
/// (`kind`: 0 the root's, then each child relation's in parent-child mode).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct ChunkRecord {
    #[serde(default)]
    pub kind: usize,
    pub lower: serde_json::Value,
    pub upper: serde_json::Value,
    /// A delayed job's chunk: these root keys (each its id values), not a range.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub keys: Vec<serde_json::Value>,
    /// A sharded root's chunk: the shard `(database, table)` its range is of.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shard: Option<(String, String)>,
}

impl ChunkRecord {
    /// The chunks of document kind `kind` that `bounds` (keys in order) cut its table
    /// into: `(null, b0]`, `(b0, b1]`, …, `(bn, null)` — one more than the bounds.
    pub fn cut<K: Serialize>(kind: usize, bounds: &[K]) -> serde_json::Result<Vec<ChunkRecord>> {
        let mut keys = vec![serde_json::Value::Null];
        for b in bounds {
            keys.push(serde_json::to_value(b)?);
        }
        keys.push(serde_json::Value::Null);
        Ok(keys
            .windows(2)
            .map(|w| ChunkRecord {
                kind,
                lower: w[0].clone(),
                upper: w[1].clone(),
                keys: Vec::new(),
                shard: None,
            })
            .collect())
    }
}

/// The progress of a chunk, in the checkpoint of its snapshot task (fenced like a
/// binlog position).
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct ChunkCursor {
    /// The key of the last row published and acknowledged; `null` before the first.
    pub after: serde_json::Value,
    pub rows: u64,
    pub done: bool,
}

/// `snapshots/<worker>/<job>`: a build job the leader gave a worker. `job` is
/// `<pipeline>~plan`, `<pipeline>~<chunk>` or `<pipeline>~mark`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct JobRecord {
    pub epoch: u64,
    pub version: u32,
}

/// `etls/<member>` (ephemeral): which version each pipeline's building index has in this
/// etl member's router.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct EtlRecord {
    pub building: std::collections::BTreeMap<String, u32>,
    /// Every pipeline it routes.
    #[serde(default)]
    pub pipelines: Vec<String>,
    /// The history versions it writes live changes to, by pipeline (an index is deleted
    /// only once no member writes to it).
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub history: std::collections::BTreeMap<String, Vec<u32>>,
    /// Its Kafka consumer group: a check waits until the group's committed offsets pass
    /// what the stream had published when a chunk was read.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub group: String,
    /// The partitions it consumes, by topic: the members of a group share them, each
    /// partition to one member.
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub partitions: std::collections::BTreeMap<String, Vec<i32>>,
}

impl EtlRecord {
    /// Whether this member writes every one of `versions` of `pipeline` as history.
    pub fn writes_history(&self, pipeline: &str, versions: &[u32]) -> bool {
        let written = self.history.get(pipeline);
        versions
            .iter()
            .all(|v| written.is_some_and(|w| w.contains(v)))
    }
}

/// `pipelines/<name>/needs_rebuild` (written by the etl): the index versions whose
/// mapping or settings cannot take what the table and the pipeline now ask for (a
/// column's type changed, an analyzer override changed...), each with why. Only a build
/// fixes that; versions older than the live one are history and no longer matter.
/// Also the versions whose documents DDL changed without row events (an added column's
/// default, a dropped or renamed column, a truncate...), kept apart because the mapping
/// checks that rewrite `versions` cannot tell that they went away: only a newer version
/// makes them history.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct NeedsRebuild {
    pub versions: std::collections::BTreeMap<u32, String>,
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub rewritten: std::collections::BTreeMap<u32, Vec<String>>,
}

impl NeedsRebuild {
    /// Why version `live` or a newer one needs a rebuild (`v<N>: why; …`); empty when
    /// none does.
    pub fn reasons(&self, live: u32) -> String {
        let versions: std::collections::BTreeSet<u32> = self
            .versions
            .keys()
            .chain(self.rewritten.keys())
            .copied()
            .filter(|v| *v >= live)
            .collect();
        versions
            .into_iter()
            .filter_map(|v| Some(format!("v{v}: {}", self.of(v)?)))
            .collect::<Vec<_>>()
            .join("; ")
    }

    /// Why version `v` itself needs a rebuild, if it does.
    pub fn of(&self, v: u32) -> Option<String> {
        let why: Vec<&str> = self
            .versions
            .get(&v)
            .map(String::as_str)
            .into_iter()
            .chain(
                self.rewritten
                    .get(&v)
                    .into_iter()
                    .flatten()
                    .map(String::as_str),
            )
            .collect();
        (!why.is_empty()).then(|| why.join("; "))
    }

    /// Whether DDL changed the documents of version `live` (or a newer one).
    pub fn rewritten_since(&self, live: u32) -> bool {
        self.rewritten.keys().any(|v| *v >= live)
    }
}

pub fn needs_rebuild(pipeline: &str) -> String {
    format!("pipelines/{pipeline}/needs_rebuild")
}

/// The Kafka header that marks a build's catch-up marker (its payload: [`Marker`]).
pub const MARKER_HEADER: &str = "sluice-marker";

/// A catch-up marker, written to every partition of a build's topic once every chunk is
/// read: an etl that applied it applied every document of the build before it.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct Marker {
    pub pipeline: String,
    pub version: u32,
}

pub fn build(pipeline: &str) -> String {
    format!("builds/{pipeline}")
}

pub fn build_plan(pipeline: &str) -> String {
    format!("builds/{pipeline}/plan")
}

pub fn build_chunks(pipeline: &str) -> String {
    format!("builds/{pipeline}/chunks")
}

pub fn build_chunk(pipeline: &str, n: u32) -> String {
    format!("builds/{pipeline}/chunks/{}", chunk_name(n))
}

/// `builds/<pipeline>/caught_up/<partition>`: the etl applied the marker on it.
pub fn build_caught_up(pipeline: &str) -> String {
    format!("builds/{pipeline}/caught_up")
}

/// `builds/<pipeline>/partitions`: how many partitions the markers went to.
pub fn build_partitions(pipeline: &str) -> String {
    format!("builds/{pipeline}/partitions")
}

/// `builds/<pipeline>/failures/<job>`: how often a build job failed with an error only
/// an operator can fix (written by the workers; the leader fails the build past a bound).
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct JobFailure {
    pub version: u32,
    pub count: u32,
    pub reason: String,
}

pub fn build_failures(pipeline: &str) -> String {
    format!("builds/{pipeline}/failures")
}

pub fn build_failure(pipeline: &str, job: &str) -> String {
    format!("builds/{pipeline}/failures/{job}")
}

/// `checks/<pipeline>`: a consistency check in progress, written by the leader with its
/// chunks (`checks/<pipeline>/chunks/<n>`, [`ChunkRecord`]s of the root table). Workers
/// claim a chunk (`claims/<n>`, ephemeral: a dead worker's chunk is claimed again) and
/// write what they found (`results/<n>`, [`CheckTally`]); the leader adds them up into
/// the meta database and removes the check once every chunk has a result.
///
/// A compare (of a held build) and a delayed job travel the same way (see [`RunKind`]).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct CheckRecord {
    pub id: u64,
    pub spec: sluice_model::PipelineSpec,
    /// The index version compared (the live one when the check started; a compare's,
    /// the held build's).
    pub version: u32,
    /// Only roots whose `check.updated_column` is at least this (ms since the epoch).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub since_ms: Option<i64>,
    pub repair: bool,
    pub chunks: u32,
    #[serde(default, skip_serializing_if = "RunKind::is_check")]
    pub kind: RunKind,
    /// A compare: the live version its documents are also compared with (0: none).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub against: u32,
    /// A resync by condition: only root rows matching it (a pipeline filter's syntax).
    #[serde(default, rename = "where", skip_serializing_if = "Option::is_none")]
    pub condition: Option<String>,
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

/// What a check found in one chunk (or, added up, in the whole check).
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct CheckTally {
    pub keys: u64,
    pub missing: u64,
    pub extra: u64,
    pub different: u64,
    pub skipped: u64,
    pub repaired: u64,
    /// A few of each kind, to start looking from.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub examples: Vec<CheckExample>,
    /// Why the chunk could not be checked at all (the check fails with it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// A compare: the documents next to the live version's.
    #[serde(default, skip_serializing_if = "LiveTally::is_empty")]
    pub live: LiveTally,
}

/// A compare's documents next to the live version's (see [`RunKind::Compare`]).
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct LiveTally {
    /// The live version compared with.
    pub version: u32,
    pub same: u64,
    pub only_new: u64,
    pub only_live: u64,
    pub different: u64,
    /// Changed by the stream while they were read again: not judged.
    #[serde(default)]
    pub skipped: u64,
    /// A few of each kind (`only new`, `only live`, `different`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub examples: Vec<CheckExample>,
}

impl LiveTally {
    pub fn is_empty(&self) -> bool {
        *self == LiveTally::default()
    }

    fn add(&mut self, other: &LiveTally) {
        self.version = self.version.max(other.version);
        self.same += other.same;
        self.only_new += other.only_new;
        self.only_live += other.only_live;
        self.different += other.different;
        self.skipped += other.skipped;
        for e in &other.examples {
            keep_example(&mut self.examples, &e.kind, &e.id, &e.detail);
        }
    }

    /// Counts a document whose copies differ: `kind` is `only new`, `only live` or
    /// `different`.
    pub fn found(&mut self, kind: &str, id: &str, detail: &str) {
        match kind {
            "only new" => self.only_new += 1,
            "only live" => self.only_live += 1,
            _ => self.different += 1,
        }
        keep_example(&mut self.examples, kind, id, detail);
    }
}

/// Keeps `id` as an example of `kind` while there are fewer than
/// [`CheckTally::EXAMPLES`] of it.
fn keep_example(examples: &mut Vec<CheckExample>, kind: &str, id: &str, detail: &str) {
    if examples.iter().filter(|e| e.kind == kind).count() < CheckTally::EXAMPLES {
        examples.push(CheckExample {
            kind: kind.to_owned(),
            id: id.to_owned(),
            detail: detail.to_owned(),
        });
    }
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct CheckExample {
    /// `missing`, `extra` or `different`.
    pub kind: String,
    pub id: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub detail: String,
}

impl CheckTally {
    /// Examples kept per kind.
    pub const EXAMPLES: usize = 5;

    pub fn add(&mut self, other: &CheckTally) {
        self.keys += other.keys;
        self.missing += other.missing;
        self.extra += other.extra;
        self.different += other.different;
        self.skipped += other.skipped;
        self.repaired += other.repaired;
        for e in &other.examples {
            self.example(&e.kind, &e.id, &e.detail);
        }
        if self.error.is_none() {
            self.error.clone_from(&other.error);
        }
        self.live.add(&other.live);
    }

    /// Counts a document found wrong: `kind` is `missing`, `extra` or `different`.
    pub fn found(&mut self, kind: &str, id: &str, detail: &str) {
        match kind {
            "missing" => self.missing += 1,
            "extra" => self.extra += 1,
            _ => self.different += 1,
        }
        self.example(kind, id, detail);
    }

    /// Keeps `id` as an example of `kind` while there are fewer than [`Self::EXAMPLES`].
    pub fn example(&mut self, kind: &str, id: &str, detail: &str) {
        keep_example(&mut self.examples, kind, id, detail);
    }

    /// Documents found wrong.
    pub fn drift(&self) -> u64 {
        self.missing + self.extra + self.different
    }
}

/// A chunk's name in a build's or a check's paths (`00042`: they sort as numbers).
pub fn chunk_name(n: u32) -> String {
    format!("{n:05}")
}

pub fn check(pipeline: &str) -> String {
    format!("checks/{pipeline}")
}

pub fn check_chunk(pipeline: &str, n: u32) -> String {
    format!("checks/{pipeline}/chunks/{}", chunk_name(n))
}

pub fn check_claim(pipeline: &str, n: u32) -> String {
    format!("checks/{pipeline}/claims/{}", chunk_name(n))
}

pub fn check_results(pipeline: &str) -> String {
    format!("checks/{pipeline}/results")
}

pub fn check_result(pipeline: &str, n: u32) -> String {
    format!("checks/{pipeline}/results/{}", chunk_name(n))
}

pub fn jobs(worker: &str) -> String {
    format!("snapshots/{worker}")
}

pub fn job(worker: &str, job: &str) -> String {
    format!("snapshots/{worker}/{job}")
}

/// The task id (lock and cursor) of chunk `n` of the build of `pipeline`'s version
/// `version`: a build after a reset starts every chunk afresh, never from the cursor an
/// abandoned build left.
pub fn chunk_task(pipeline: &str, version: u32, n: u32) -> String {
    format!("snap~{pipeline}~v{version}~{}", chunk_name(n))
}

pub fn etl(member: &str) -> String {
    format!("etls/{member}")
}

pub fn worker(id: &str) -> String {
    format!("workers/{id}")
}

pub fn assignments(worker: &str) -> String {
    format!("assignments/{worker}")
}

pub fn assignment(worker: &str, task: &str) -> String {
    format!("assignments/{worker}/{task}")
}

pub fn mapping(source: &str) -> String {
    format!("mappings/{source}")
}

pub fn pipeline(name: &str) -> String {
    format!("pipelines/{name}")
}

pub fn lock(task: &str) -> String {
    format!("locks/{task}")
}

pub fn checkpoint(task: &str) -> String {
    format!("tasks/{task}/checkpoint")
}

/// `applied/<pipeline>`: how far the etl has applied a pipeline, written by one etl
/// member (the one the pipeline's name hashes to) and read by the centers.
pub fn applied(pipeline: &str) -> String {
    format!("applied/{pipeline}")
}

/// What `applied/<pipeline>` holds: per source, the position below which nothing of
/// the pipeline's tables is pending.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct AppliedRecord {
    pub sources: std::collections::BTreeMap<String, AppliedPosition>,
}

/// Every change of the source up to `checkpoint` (a position its worker confirmed) is
/// in Elasticsearch or dead-lettered, for the pipeline's tables.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AppliedPosition {
    pub checkpoint: sluice_model::Checkpoint,
    /// When the etl read that checkpoint (ms since the epoch): how old what is known to
    /// be applied is. A source with nothing new is read again, so it stays recent.
    pub read_at_ms: i64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bounds_cut_a_table_into_one_more_chunk_with_open_ends() {
        let chunks = ChunkRecord::cut(1, &[10, 20]).unwrap();
        let ends: Vec<(serde_json::Value, serde_json::Value)> = chunks
            .iter()
            .map(|c| (c.lower.clone(), c.upper.clone()))
            .collect();
        use serde_json::{json, Value::Null};
        assert_eq!(
            ends,
            [(Null, json!(10)), (json!(10), json!(20)), (json!(20), Null)]
        );
        assert!(chunks.iter().all(|c| c.kind == 1));
        assert_eq!(
            ChunkRecord::cut::<u32>(0, &[]).unwrap().len(),
            1,
            "an empty table: one open chunk"
        );
    }

    #[test]
    fn a_versions_reasons_are_its_own() {
        let mut r = NeedsRebuild::default();
        r.versions.insert(2, "title changed type".into());
        r.versions.insert(3, "analyzer changed".into());
        r.rewritten.insert(3, vec!["a column was dropped".into()]);
        assert_eq!(r.of(2).as_deref(), Some("title changed type"));
        assert_eq!(
            r.of(3).as_deref(),
            Some("analyzer changed; a column was dropped")
        );
        assert_eq!(r.of(1), None);
        assert_eq!(
            r.reasons(3),
            "v3: analyzer changed; a column was dropped",
            "older versions no longer matter"
        );
        assert_eq!(r.reasons(4), "");
    }
}
