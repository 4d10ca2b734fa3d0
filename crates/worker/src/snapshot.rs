//! Build jobs (zero-downtime rebuilds): the leader gives workers jobs under
//! `snapshots/<worker>/<pipeline>~<job>`:
//!
//! * `plan` — cut the table of each kind of document (the root's; in parent-child mode
//!   each child relation's too) into primary-key chunks (`builds/<p>/chunks/<n>`, then
//!   `builds/<p>/plan` last, which marks the plan complete);
//! * `<n>` — read chunk `n` in batches of documents: a batch's root rows and every one of
//!   their relation queries run inside one consistent snapshot, whose binlog position is
//!   the documents' version. They go to the build's topic. The chunk's cursor is its task
//!   checkpoint, confirmed (compare-and-set, under the chunk's lock) only after Kafka
//!   acknowledged the batch, so a crash resumes after the last confirmed row and a zombie
//!   cannot move it;
//! * `mark` — write a catch-up marker to every partition of the build's topic
//!   (`builds/<p>/partitions` records how many), so the etl can tell when it applied every
//!   document of the build.
//!
//! Every job is idempotent: a job found already done is not done again.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;
use tracing::Instrument as _;

use sluice_kafka::SharedProducer;
use sluice_model::{BuildDocument, Checkpoint, ColumnInfo, ExternalVersion, ENVELOPE_VERSION};
use sluice_mysql::docs::{Built, DocPlan, RangeRead, Reader};
use sluice_mysql::Key;
use sluice_zk::layout::{
    self, BuildRecord, ChunkCursor, ChunkRecord, JobRecord, Marker, PlanRecord, SourceRecord,
};
use sluice_zk::{Coordinator, Expect, SessionState, TaskLock, ZkError};
use tokio::sync::mpsc::{UnboundedReceiver, UnboundedSender};
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::config::WorkerConfig;
use crate::error::{Context as _, Result, WorkerError};
use crate::report::Reports;

/// Root rows per snapshot batch of a document made of one row: one consistent snapshot,
/// one compile of the plan against the tables, one cursor confirm in ZooKeeper. At 500, a
/// million-row snapshot was 2,000 of each, and they cost more CPU (MySQL's, ZooKeeper's,
/// the worker's) than the rows did.
const FLAT_BATCH_ROWS: usize = 5_000;
/// Root rows per snapshot batch of a tree: each root brings its relations' rows (the
/// sample shop's, 14), all read in the batch's snapshot and held until Kafka has them.
const TREE_BATCH_ROWS: usize = 500;

/// Root rows per batch: a throttled build reads at most a second's worth at once, so its
/// pace stays even (a batch goes at once, then waits).
fn batch_rows(flat: bool, throttle_rows_per_sec: u64) -> usize {
    let base = if flat {
        FLAT_BATCH_ROWS
    } else {
        TREE_BATCH_ROWS
    };
    match usize::try_from(throttle_rows_per_sec) {
        Ok(0) | Err(_) => base,
        Ok(t) => base.min(t),
    }
}

pub(crate) struct Jobs {
    pub cfg: Arc<WorkerConfig>,
    pub coord: Coordinator,
    pub producer: SharedProducer,
    pub reports: Arc<Reports>,
}

struct Running {
    stop: CancellationToken,
    handle: JoinHandle<Result<()>>,
    /// This run's number, which it says when it ends (a retry runs under the same name).
    run: u64,
}

/// Follows this worker's build jobs until the session expires or `shutdown`.
pub(crate) async fn run_jobs(jobs: Arc<Jobs>, shutdown: &CancellationToken) {
    let me = jobs.cfg.worker.id.clone();
    let coord = jobs.coord.clone();
    let session = coord.session();
    let mut backoff = jobs.cfg.worker.retry().backoff();
    let mut runs = JobRuns::new(jobs);
    loop {
        if shutdown.is_cancelled() || *session.borrow() == SessionState::Expired {
            break;
        }
        let (names, watch) = match coord.children_watched(&layout::jobs(&me)).await {
            Ok(v) => v,
            Err(ZkError::SessionExpired) => break,
            Err(e) => {
                let pause = backoff.next_pause();
                tracing::warn!(error = %e, retry_in = ?pause, "cannot read the build jobs; retrying");
                sluice_runtime::shutdown::pause(pause, shutdown).await;
                continue;
            }
        };
        runs.withdraw(&names).await;
        if runs.reap().await {
            // A job that keeps failing (source unreachable, say) is retried ever less often.
            sluice_runtime::shutdown::pause(backoff.next_pause(), shutdown).await;
        } else {
            backoff.reset();
        }
        runs.start_new(&names, shutdown);
        tokio::select! {
            _ = coord.wait_any(vec![watch], shutdown) => {}
            Some(run) = runs.ended.recv() => {
                runs.ended_runs.insert(run);
            }
        }
        runs.note_ended();
    }
    runs.stop_all().await;
}

/// The build jobs this worker runs, and those it finished.
struct JobRuns {
    jobs: Arc<Jobs>,
    running: BTreeMap<String, Running>,
    finished: BTreeSet<String>,
    /// Runs say here that they ended, just before their tasks return: a run said ended is
    /// awaited even while its task is not seen finished yet, else that wakeup is lost and
    /// the job never looked at again.
    ended_tx: UnboundedSender<u64>,
    ended: UnboundedReceiver<u64>,
    ended_runs: BTreeSet<u64>,
    /// Runs started so far (the last one's number).
    runs: u64,
}

impl JobRuns {
    /// No job running or finished yet.
    fn new(jobs: Arc<Jobs>) -> JobRuns {
        let (ended_tx, ended) = tokio::sync::mpsc::unbounded_channel::<u64>();
        JobRuns {
            jobs,
            running: BTreeMap::new(),
            finished: BTreeSet::new(),
            ended_tx,
            ended,
            ended_runs: BTreeSet::new(),
            runs: 0,
        }
    }

    /// Stops the jobs no longer in `names`, and forgets those finished.
    async fn withdraw(&mut self, names: &[String]) {
        for name in self.running.keys().cloned().collect::<Vec<_>>() {
            if !names.contains(&name) {
                let r = self.running.remove(&name).expect("running");
                r.stop.cancel();
                let _ = r.handle.await;
                tracing::info!(job = %name, "build job withdrawn");
            }
        }
        self.finished.retain(|name| names.contains(name));
    }

    /// Awaits the runs that ended; `true` when one of them failed.
    async fn reap(&mut self) -> bool {
        let mut failed = false;
        for name in self.running.keys().cloned().collect::<Vec<_>>() {
            let r = &self.running[&name];
            if self.ended_runs.remove(&r.run) || r.handle.is_finished() {
                let r = self.running.remove(&name).expect("running");
                match r.handle.await {
                    Ok(Ok(())) => {
                        self.finished.insert(name);
                    }
                    Ok(Err(e)) => {
                        job_failed(&self.jobs, &name, &e).await;
                        failed = true;
                    }
                    Err(e) => {
                        tracing::error!(job = %name, error = %e, "build job ended abnormally");
                        failed = true;
                    }
                }
            }
        }
        failed
    }

    /// Starts a run of each job in `names` neither running nor finished.
    fn start_new(&mut self, names: &[String], shutdown: &CancellationToken) {
        for name in names {
            if self.running.contains_key(name) || self.finished.contains(name) {
                continue;
            }
            let stop = shutdown.child_token();
            let (jobs2, name2, stop2) = (self.jobs.clone(), name.clone(), stop.clone());
            let ended_tx = self.ended_tx.clone();
            self.runs += 1;
            let run = self.runs;
            let handle = tokio::spawn(async move {
                let result = run_job(&jobs2, &name2, &stop2).await;
                let _ = ended_tx.send(run);
                result
            });
            self.running
                .insert(name.clone(), Running { stop, handle, run });
        }
    }

    /// Takes in every run said ended, keeping only those of running jobs.
    fn note_ended(&mut self) {
        while let Ok(run) = self.ended.try_recv() {
            self.ended_runs.insert(run);
        }
        let running = &self.running;
        self.ended_runs
            .retain(|run| running.values().any(|r| r.run == *run));
    }

    /// Stops every running job and waits for each to end.
    async fn stop_all(self) {
        for (_, r) in self.running {
            r.stop.cancel();
            let _ = r.handle.await;
        }
    }
}

/// Reports a failed run of job `name`: counts a definite failure against its build, and
/// replaces the producer when Kafka refused documents; the job is retried.
async fn job_failed(jobs: &Jobs, name: &str, e: &WorkerError) {
    tracing::warn!(job = %name, error = %e, "build job failed; retrying");
    if e.is_definite() {
        if let Err(z) = count_failure(&jobs.coord, &jobs.cfg.worker.id, name, e).await {
            tracing::warn!(job = %name, error = %z, "cannot record the job's failure");
        }
    }
    if let Some(why) = jobs.producer.renew_after(e) {
        tracing::warn!(job = %name, %why, "Kafka refused documents: the producer is replaced with a new one");
    }
    jobs.reports.event("build_job_error", name, e.to_string());
}

/// The source task's confirmed checkpoint (its position and version epoch), if any.
pub(crate) async fn confirmed(
    coord: &Coordinator,
    source: &str,
) -> Result<Option<Checkpoint>, ZkError> {
    Ok(coord
        .read_checkpoint(source)
        .await?
        .and_then(|c| Checkpoint::from_json(&c).ok()))
}

/// The external version of what a snapshot at `position` read, under version epoch
/// `epoch`: the version its documents are written with.
pub(crate) fn version_at(epoch: u16, position: &sluice_model::BinlogPosition) -> Result<u64> {
    let seq = sluice_model::position::file_seq(&position.file)?;
    Ok(ExternalVersion::new(epoch as u64, seq, position.pos)?.get())
}

/// Counts a definite failure of this worker's job `name` (`<pipeline>~<job>`) against
/// the build version the job is for (the leader fails the build after a few: the spec no
/// longer fits the tables, a table without a primary key); a job already withdrawn
/// counts for nothing.
async fn count_failure(
    coord: &Coordinator,
    me: &str,
    name: &str,
    e: &WorkerError,
) -> Result<(), ZkError> {
    let Some((pipeline, job)) = name.split_once('~') else {
        return Ok(());
    };
    let Some(assigned) = coord.get_json::<JobRecord>(&layout::job(me, name)).await? else {
        return Ok(());
    };
    let at = layout::build_failure(pipeline, job);
    loop {
        let node = coord.get(&at).await?;
        let mut failure = node
            .as_ref()
            .and_then(|n| serde_json::from_slice::<layout::JobFailure>(&n.data).ok())
            .filter(|f| f.version == assigned.version)
            .unwrap_or_default();
        failure.version = assigned.version;
        failure.count += 1;
        failure.reason = e.to_string();
        let expect = node.map_or(Expect::Absent, |n| Expect::Version(n.version));
        let data = serde_json::to_vec(&failure).expect("serializes");
        match coord.put(&at, &data, expect).await {
            Ok(_) => return Ok(()),
            Err(e) if e.is_conflict() => continue,
            Err(e) => return Err(e),
        }
    }
}

async fn run_job(jobs: &Jobs, name: &str, stop: &CancellationToken) -> Result<()> {
    let (pipeline, kind) = name
        .split_once('~')
        .ok_or_else(|| WorkerError::transient(format!("`{name}` is not a build job name")))?;
    let me = &jobs.cfg.worker.id;
    let job: JobRecord = jobs
        .coord
        .get_json(&layout::job(me, name))
        .await?
        .ok_or_else(|| WorkerError::transient(format!("job {name} vanished")))?;
    let build: BuildRecord = jobs
        .coord
        .get_json(&layout::build(pipeline))
        .await?
        .ok_or_else(|| WorkerError::transient(format!("no build of {pipeline} in progress")))?;
    if build.version != job.version {
        return Err(WorkerError::transient(format!(
            "job {name} is for version {}, the build is of {}",
            job.version, build.version
        )));
    }
    let record: SourceRecord = jobs
        .coord
        .get_json(&layout::mapping(&build.spec.source))
        .await?
        .ok_or_else(|| WorkerError::transient(format!("source {} is gone", build.spec.source)))?;
    let src = sluice_mysql::SourceConfig::from_spec(&record.spec, &jobs.cfg.source_access())
        .map_err(WorkerError::transient)?;
    tracing::info!(job = %name, version = build.version, "build job started");
    match kind {
        "plan" => plan_chunks(jobs, &build, &src).await,
        "mark" => mark(jobs, &build).await,
        n => {
            let n: u32 = n
                .parse()
                .with_context(|| format!("`{name}`: unknown job"))?;
            chunk(jobs, &build, &src, record.spec.coordinates.epoch, n, stop).await
        }
    }
}

/// The pipeline's documents compiled against its tables as they are now.
async fn compile(b: &BuildRecord, src: &sluice_mysql::SourceConfig) -> Result<Vec<DocPlan>> {
    sluice_mysql::docs::load(src, &b.spec)
        .await?
        .map_err(|problems| {
            WorkerError::definite(format!(
                "pipeline {} does not fit its tables: {}",
                b.spec.name,
                problems.join("; ")
            ))
        })
}

async fn plan_chunks(jobs: &Jobs, b: &BuildRecord, src: &sluice_mysql::SourceConfig) -> Result<()> {
    if jobs
        .coord
        .get(&layout::build_plan(&b.spec.name))
        .await?
        .is_some()
    {
        return Ok(());
    }
    let plans = compile(b, src).await?;
    // Set up as the document reader's are (in UTC), so the chunk bounds of a TIMESTAMP
    // key are the values the chunk reads compare against.
    let mut conn = src.reader_conn().await?;
    let mut chunks = 0u32;
    let mut estimated_rows = 0;
    for (kind, doc) in plans.iter().enumerate() {
        let table = &doc.root.table;
        if table.key_names().is_empty() {
            return Err(WorkerError::definite(format!(
                "table {}.{} has no primary key: a build reads it in chunks of its primary key (add one)",
                table.db, table.table
            )));
        }
        // A sharded root is cut shard by shard, each by its own primary key.
        for (shard, one) in table.parts() {
            estimated_rows += one.estimated_rows(src, &mut conn).await?;
            let bounds = one.chunk_bounds(src, &mut conn, b.chunk_rows).await?;
            for mut rec in ChunkRecord::cut(kind, &bounds)? {
                rec.shard.clone_from(&shard);
                jobs.coord
                    .put(
                        &layout::build_chunk(&b.spec.name, chunks),
                        &serde_json::to_vec(&rec)?,
                        Expect::Any,
                    )
                    .await?;
                chunks += 1;
            }
        }
    }
    let _ = conn.disconnect().await;
    let plan = PlanRecord {
        chunks,
        estimated_rows,
    };
    jobs.coord
        .put(
            &layout::build_plan(&b.spec.name),
            &serde_json::to_vec(&plan)?,
            Expect::Any,
        )
        .await?;
    tracing::info!(pipeline = %b.spec.name, chunks, estimated_rows, "build planned");
    Ok(())
}

async fn chunk(
    jobs: &Jobs,
    b: &BuildRecord,
    src: &sluice_mysql::SourceConfig,
    source_epoch: u16,
    n: u32,
    stop: &CancellationToken,
) -> Result<()> {
    let range: ChunkRecord = jobs
        .coord
        .get_json(&layout::build_chunk(&b.spec.name, n))
        .await?
        .ok_or_else(|| {
            WorkerError::transient(format!("chunk {n} of {} is not planned", b.spec.name))
        })?;
    let lower: Option<Key> = serde_json::from_value(range.lower)?;
    let upper: Option<Key> = serde_json::from_value(range.upper)?;
    let task = layout::chunk_task(&b.spec.name, b.version, n);
    let owner = serde_json::json!({ "worker": jobs.cfg.worker.id }).to_string();
    let mut lock = jobs
        .coord
        .acquire_task_lock(&task, owner.as_bytes(), stop)
        .await?;
    let mut cursor: ChunkCursor = match lock.checkpoint() {
        Some(b) => serde_json::from_slice(b).context("unreadable chunk cursor")?,
        None => ChunkCursor::default(),
    };
    let result = async {
        if cursor.done {
            return Ok(());
        }
        let epoch = streaming_epoch(jobs, b, source_epoch).await?;
        let topic = jobs.cfg.topics.build_topic(&b.spec.name);
        sluice_kafka::ensure_topics(&jobs.cfg.kafka, std::slice::from_ref(&topic)).await?;
        let read = ChunkRead {
            jobs,
            b,
            n,
            kind: range.kind,
            shard: range.shard,
            epoch,
            topic,
            lower,
            upper,
            batch: batch_rows(b.spec.is_flat(), b.throttle_rows_per_sec),
        };
        read.run(src, &mut lock, &mut cursor, stop).await
    }
    .await;
    let _ = lock.release().await;
    result
}

/// The source's version epoch, once its task streams under `source_epoch` (or a newer one).
async fn streaming_epoch(jobs: &Jobs, b: &BuildRecord, source_epoch: u16) -> Result<u16> {
    // The source's version epoch, so snapshot versions compare with the stream's. When
    // the center bumped it (a re-snapshot starts builds at once), read only once the
    // task streams under it: a change the task still published under the old epoch
    // after this read would be refused as older than the snapshot.
    let epoch = confirmed(&jobs.coord, &b.spec.source)
        .await?
        .map_or(0, |c| c.epoch);
    if epoch < source_epoch {
        return Err(WorkerError::transient(format!("the task of source {} does not stream under version epoch {source_epoch} yet (its checkpoint is of {epoch}); the chunk is read once it does",
            b.spec.source)));
    }
    Ok(epoch)
}

/// A batch read: its documents, its snapshot's low watermark and, for a pipeline whose
/// documents are its rows, the root's columns.
type BatchRead = (
    RangeRead,
    sluice_model::BinlogPosition,
    Option<Arc<[ColumnInfo]>>,
);

/// A batch published and not yet confirmed: its deliveries, and the cursor after it.
struct Published {
    deliveries: Vec<sluice_kafka::Delivery>,
    rows: u64,
    cursor: ChunkCursor,
}

/// One chunk's read: what stays the same from one batch to the next.
struct ChunkRead<'a> {
    jobs: &'a Jobs,
    b: &'a BuildRecord,
    n: u32,
    /// The chunk's document kind (its place among the pipeline's compiled documents).
    kind: usize,
    /// A sharded root's chunk: its shard.
    shard: Option<(String, String)>,
    /// The source's version epoch, which the documents' versions are under.
    epoch: u16,
    /// The build's topic.
    topic: String,
    lower: Option<Key>,
    upper: Option<Key>,
    /// Root rows per batch ([`batch_rows`]).
    batch: usize,
}

impl ChunkRead<'_> {
    /// Reads, publishes and confirms batch after batch from `cursor` until done or `stop`.
    /// The next batch is read while Kafka acknowledges the one before and its cursor is
    /// confirmed: a crash between the two publishes the later batch again on resume (a
    /// document at the same version changes nothing), never skips one.
    async fn run(
        &self,
        src: &sluice_mysql::SourceConfig,
        lock: &mut TaskLock,
        cursor: &mut ChunkCursor,
        stop: &CancellationToken,
    ) -> Result<()> {
        let mut reader = Reader::connect(src).await?;
        let started = Instant::now();
        let rows_at_start = cursor.rows;
        let mut published: Option<Published> = None;
        loop {
            if stop.is_cancelled() {
                return Ok(());
            }
            let after: Option<Key> = match &cursor.after {
                serde_json::Value::Null => self.lower.clone(),
                v => Some(serde_json::from_value(v.clone())?),
            };
            let (read, settled) = tokio::join!(
                self.read_batch(&mut reader, after.as_ref()),
                self.settle(lock, published.take())
            );
            settled?;
            let (read, position, columns) = read?;
            let version = version_at(self.epoch, &position)?;
            let deliveries = self.publish(lock, version, columns, read.docs).await?;
            cursor.rows += read.rows as u64;
            cursor.done = read.rows < self.batch;
            if let Some(k) = read.last {
                cursor.after = serde_json::to_value(k)?;
            }
            published = Some(Published {
                deliveries,
                rows: read.rows as u64,
                cursor: cursor.clone(),
            });
            if cursor.done {
                self.settle(lock, published).await?;
                tracing::info!(pipeline = %self.b.spec.name, chunk = self.n, rows = cursor.rows, "chunk done");
                reader.close().await;
                return Ok(());
            }
            self.throttle(cursor.rows - rows_at_start, started, stop)
                .await;
        }
    }

    /// Waits until Kafka acknowledged a published batch, then confirms its cursor.
    async fn settle(&self, lock: &mut TaskLock, published: Option<Published>) -> Result<()> {
        let Some(p) = published else {
            return Ok(());
        };
        acknowledged(p.deliveries, &format!("a document for {}", self.topic)).await?;
        lock.confirm(&serde_json::to_vec(&p.cursor)?).await?;
        crate::metrics::METRICS.snapshot_rows.add(
            p.rows,
            &[opentelemetry::KeyValue::new(
                "pipeline",
                self.b.spec.name.clone(),
            )],
        );
        Ok(())
    }

    /// Reads the next batch after `after` in one consistent snapshot: its documents, its
    /// position and, for a pipeline whose documents are its rows, the root's columns (the
    /// etl maps the index from them).
    async fn read_batch(&self, reader: &mut Reader<'_>, after: Option<&Key>) -> Result<BatchRead> {
        async {
            // The documents hold every change logged before the snapshot's low
            // watermark: they are versioned with it.
            let position = reader.begin_snapshot().await?.low;
            // Compiled in the snapshot, against the tables' shape it reads: a plan
            // compiled earlier would miss a column added (and filled) in between, and
            // stamp rows without it with a version newer than the change that filled it.
            let read = async {
                let plans = reader.compile(&self.b.spec).await?.map_err(|problems| {
                    WorkerError::definite(format!(
                        "pipeline {} does not fit its tables: {}",
                        self.b.spec.name,
                        problems.join("; ")
                    ))
                })?;
                let plan = plans.get(self.kind).ok_or_else(|| {
                    WorkerError::transient(format!(
                        "chunk {} is of document kind {}, which the pipeline no longer has",
                        self.n, self.kind
                    ))
                })?;
                let shard = match &self.shard {
                    None => Some(std::borrow::Cow::Borrowed(plan)),
                    Some((db, table)) => plan.for_shard(db, table).map(std::borrow::Cow::Owned),
                };
                // A shard dropped since the plan: nothing of it is left to read.
                let read = match shard {
                    Some(plan) => {
                        plan.read_range(reader, after, self.upper.as_ref(), self.batch)
                            .await?
                    }
                    None => RangeRead {
                        docs: Vec::new(),
                        last: None,
                        rows: 0,
                    },
                };
                let columns = self.b.spec.is_flat().then(|| plan.root.table.infos.clone());
                Ok::<_, WorkerError>((read, columns))
            }
            .await;
            reader.end().await?;
            let (read, columns) = read?;
            Ok((read, position, columns))
        }
        .instrument(tracing::info_span!("worker.snapshot_batch", pipeline = %self.b.spec.name, chunk = self.n))
        .await
    }

    /// Publishes a batch's documents at `version` while the lock allows; their deliveries.
    async fn publish(
        &self,
        lock: &TaskLock,
        version: u64,
        columns: Option<Arc<[ColumnInfo]>>,
        docs: Vec<Built>,
    ) -> Result<Vec<sluice_kafka::Delivery>> {
        let producer = self.jobs.producer.get();
        let topic = &self.topic;
        let mut deliveries = Vec::with_capacity(docs.len());
        for built in docs {
            if !lock.may_publish() {
                return Err(WorkerError::transient(
                    "the chunk's lock is in doubt: stopping before publishing more",
                ));
            }
            let doc = BuildDocument {
                v: ENVELOPE_VERSION,
                pipeline: self.b.spec.name.clone(),
                build: self.b.version,
                version,
                routing: built.routing,
                doc: built.doc.unwrap_or_default(),
                columns: columns.clone(),
                id: built.id,
                repair: false,
                deleted: false,
            };
            let payload = serde_json::to_vec(&doc)?;
            let delivery = sluice_kafka::queue(&producer, topic, Some(doc.id.as_bytes()), &payload)
                .await
                .with_context(|| format!("cannot publish to {topic}"))?;
            deliveries.push(delivery);
        }
        Ok(deliveries)
    }

    /// Waits as the build's throttle asks, `rows` having been read since `started`.
    async fn throttle(&self, rows: u64, started: Instant, stop: &CancellationToken) {
        if self.b.throttle_rows_per_sec > 0 {
            let due = Duration::from_secs_f64(rows as f64 / self.b.throttle_rows_per_sec as f64);
            if let Some(wait) = due.checked_sub(started.elapsed()) {
                sluice_runtime::shutdown::pause(wait, stop).await;
            }
        }
    }
}

async fn mark(jobs: &Jobs, b: &BuildRecord) -> Result<()> {
    if jobs
        .coord
        .get(&layout::build_partitions(&b.spec.name))
        .await?
        .is_some()
    {
        return Ok(());
    }
    let topic = jobs.cfg.topics.build_topic(&b.spec.name);
    sluice_kafka::ensure_topics(&jobs.cfg.kafka, std::slice::from_ref(&topic)).await?;
    let partitions = sluice_kafka::partitions(&jobs.producer.get(), &topic).await?;
    if partitions == 0 {
        return Err(WorkerError::transient(format!(
            "topic {topic} has no partitions"
        )));
    }
    let marker = serde_json::to_vec(&Marker {
        pipeline: b.spec.name.clone(),
        version: b.version,
    })?;
    let producer = jobs.producer.get();
    let mut deliveries = Vec::new();
    let headers: &[(&str, &[u8])] = &[(layout::MARKER_HEADER, &marker)];
    for p in 0..partitions {
        let d = sluice_kafka::queue_with(&producer, &topic, None, &marker, Some((p, headers)))
            .await
            .context("cannot send a build marker")?;
        deliveries.push(d);
    }
    acknowledged(deliveries, "a build marker").await?;
    // A crash here: the markers are in Kafka, their count not recorded; the job is done
    // again and the etl finds the markers twice.
    sluice_model::failpoint("worker.after_build_markers");
    jobs.coord
        .put(
            &layout::build_partitions(&b.spec.name),
            partitions.to_string().as_bytes(),
            Expect::Any,
        )
        .await?;
    tracing::info!(pipeline = %b.spec.name, partitions, "build markers written");
    Ok(())
}

/// Waits for Kafka to acknowledge every delivery; the first refusal is the error.
async fn acknowledged(deliveries: Vec<sluice_kafka::Delivery>, what: &str) -> Result<()> {
    for d in deliveries {
        d.acknowledged()
            .await
            .with_context(|| format!("Kafka refused {what}"))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_batch_is_larger_for_rows_than_for_trees_and_at_most_a_seconds_worth_when_throttled() {
        assert_eq!(batch_rows(true, 0), FLAT_BATCH_ROWS);
        assert_eq!(batch_rows(false, 0), TREE_BATCH_ROWS);
        assert_eq!(batch_rows(true, 200), 200);
        assert_eq!(batch_rows(false, 200), 200);
        assert_eq!(batch_rows(true, 1_000_000), FLAT_BATCH_ROWS);
        assert_eq!(batch_rows(false, u64::MAX), TREE_BATCH_ROWS);
    }
}
