//! One binlog task: lock → preflight → stream → publish → confirm, retried with backoff.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use sluice_kafka::{Delivery, SharedProducer};
use sluice_model::{Checkpoint, Coordinates, GtidSet, Restart, TaskState};
use sluice_mysql::{
    BinlogReader, Flavor, RowChange, ServerInfo, SourceConfig, SourceEvent, StartAt, Unreadable,
};
use sluice_zk::{Coordinator, SessionState, TaskLock, ZkError};
use tokio::sync::{mpsc, watch, Mutex};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::config::WorkerConfig;
use crate::envelope;
use crate::error::{Context as _, Result, WorkerError};
use crate::report::{Progress, Reports};

pub(crate) struct TaskCtx {
    pub cfg: Arc<WorkerConfig>,
    pub producer: SharedProducer,
    pub coord: Coordinator,
    pub shutdown: CancellationToken,
    pub known_topics: Arc<Mutex<HashSet<String>>>,
    pub progress: Arc<Progress>,
    pub reports: Arc<Reports>,
}

fn expired() -> WorkerError {
    WorkerError::SessionExpired("the task was dropped".into())
}

/// What the publisher hands the acknowledger, in binlog order.
enum Entry {
    /// A row event's delivery, and when its event was read.
    Delivery(Delivery, Instant),
    Commit(Checkpoint),
}

/// Runs the source's task until shutdown or until the ZooKeeper session expires.
/// `coords` are the source's (the center's; a standalone worker's are the defaults).
pub(crate) async fn run_source(ctx: TaskCtx, src: SourceConfig, coords: Coordinates) {
    let owner =
        serde_json::json!({ "worker": ctx.cfg.worker.id, "pid": std::process::id() }).to_string();
    let mut backoff = ctx.cfg.worker.retry().backoff();
    loop {
        if ctx.shutdown.is_cancelled() {
            ctx.progress.state(TaskState::Stopped);
            return;
        }
        ctx.progress.state(TaskState::WaitingForLock);
        let lock = match ctx
            .coord
            .acquire_task_lock(&src.name, owner.as_bytes(), &ctx.shutdown)
            .await
        {
            Ok(lock) => lock,
            Err(ZkError::Cancelled) => return,
            Err(e) if matches!(*ctx.coord.session().borrow(), SessionState::Expired) => {
                tracing::warn!(task = %src.name, error = %e, "cannot take the task: session expired");
                return;
            }
            Err(e) => {
                let pause = backoff.next_pause();
                tracing::warn!(task = %src.name, error = %e, retry_in = ?pause, "cannot take the task lock; retrying");
                sluice_runtime::shutdown::pause(pause, &ctx.shutdown).await;
                continue;
            }
        };
        tracing::info!(task = %src.name, "task lock acquired");
        ctx.progress.state(TaskState::Streaming);
        ctx.reports.event(
            "task_started",
            &src.name,
            format!("task lock taken by {}", ctx.cfg.worker.id),
        );
        let started = Instant::now();
        match stream(&ctx, &src, coords, lock).await {
            Ok(()) => {
                ctx.progress.state(TaskState::Stopped);
                ctx.reports
                    .event("task_stopped", &src.name, "stopped and released");
                return;
            }
            Err(e @ WorkerError::SessionExpired(_)) => {
                tracing::warn!(task = %src.name, "{e}");
                ctx.progress.state(TaskState::Stopped);
                ctx.reports.event("task_stopped", &src.name, e.to_string());
                return;
            }
            Err(e @ WorkerError::Definite(_)) => {
                // Retrying on a backoff cannot help: stop, say what to fix, and look again
                // only rarely (or at once when the source's record changes: the task is
                // restarted then).
                let recheck = ctx.cfg.worker.recheck_failed;
                ctx.progress.state(TaskState::Failed);
                ctx.reports.event("task_failed", &src.name, e.to_string());
                tracing::error!(task = %src.name, error = %e, recheck_in = ?recheck, "task stopped: this needs an operator (see the error); nothing past the last confirmed position was skipped");
                if !sluice_runtime::shutdown::pause(recheck, &ctx.shutdown).await {
                    ctx.progress.state(TaskState::Stopped);
                    return;
                }
                backoff.reset();
            }
            Err(e) => {
                if started.elapsed() > Duration::from_secs(60) {
                    backoff.reset();
                }
                if let Some(why) = ctx.producer.renew_after(&e) {
                    tracing::warn!(task = %src.name, %why, "Kafka refused events: the producer is replaced with a new one");
                }
                ctx.progress.state(TaskState::Retrying);
                ctx.reports.event("task_error", &src.name, e.to_string());
                let pause = backoff.next_pause();
                tracing::error!(task = %src.name, error = %e, retry_in = ?pause, "task failed; it resumes from the last confirmed position");
                sluice_runtime::shutdown::pause(pause, &ctx.shutdown).await;
            }
        }
    }
}

/// Where a task begins, from its checkpoint and the source's coordinates.
enum Begin {
    /// At the server's current end under `epoch`: a first start, or a re-snapshot.
    AtEnd { epoch: u16, why: &'static str },
    /// From the checkpoint, on the server it was read from.
    Resume(Checkpoint),
    /// From the checkpoint's GTID state, on a new server, under a newer `epoch`.
    Failover { from: Checkpoint, epoch: u16 },
}

impl Begin {
    fn new(resumed: Option<Checkpoint>, coords: Coordinates) -> Begin {
        match resumed {
            None => Begin::AtEnd {
                epoch: coords.epoch,
                why: "first start: streaming from the current end of the binlog",
            },
            Some(cp) if cp.epoch >= coords.epoch => Begin::Resume(cp),
            Some(cp) => match coords.restart {
                Restart::End => Begin::AtEnd {
                    epoch: coords.epoch,
                    why: "re-snapshot: streaming from the current end of the binlog under a new version epoch",
                },
                Restart::Gtid => Begin::Failover {
                    from: cp,
                    epoch: coords.epoch,
                },
            },
        }
    }

    /// The checkpoint the preflight checks the server still has.
    fn resumes(&self) -> Option<&Checkpoint> {
        match self {
            Begin::AtEnd { .. } => None,
            Begin::Resume(cp) | Begin::Failover { from: cp, .. } => Some(cp),
        }
    }
}

/// Streams while holding `lock`. Returns `Ok` only on shutdown, after draining.
async fn stream(
    ctx: &TaskCtx,
    src: &SourceConfig,
    coords: Coordinates,
    mut lock: TaskLock,
) -> Result<()> {
    let (reader, stamp) = match open(src, coords, &mut lock).await {
        Ok(opened) => opened,
        Err(e) => {
            // Not held while the task waits to try again (or for an operator).
            let _ = lock.release().await;
            return Err(e);
        }
    };

    let lag_watch = ctx.shutdown.child_token();
    let _stop_lag_watch = lag_watch.clone().drop_guard();
    tokio::spawn(watch_bytes_behind(
        src.clone(),
        ctx.progress.clone(),
        lag_watch,
    ));

    let (tx, rx) = mpsc::channel(ctx.cfg.worker.max_in_flight);
    let interval = ctx.cfg.worker.confirm_interval;
    let task_name = src.name.clone();
    let progress = ctx.progress.clone();
    let stop = CancellationToken::new();
    let stopped = stop.clone();
    let mut acker = tokio::spawn(async move {
        let result = tokio::select! {
            r = acknowledge(rx, &mut lock, interval, &task_name, &progress) => r,
            _ = stopped.cancelled() => Err(WorkerError::transient("drain timed out")),
        };
        (lock, result)
    });
    let read_result = publish_loop(ctx, src, reader, tx, stamp).await;

    // The publisher is done (shutdown or failure): let the acknowledger confirm what Kafka
    // acknowledges, within the drain bound. Past it the acknowledger is stopped, and the
    // lock released either way: a task is never left detached while its lock, held by
    // this live session, keeps every other attempt and worker out.
    let (lock, ack_result) = match tokio::time::timeout(ctx.cfg.worker.drain_timeout, &mut acker)
        .await
    {
        Ok(joined) => {
            joined.map_err(|e| WorkerError::transient(format!("acknowledger task failed: {e}")))?
        }
        Err(_) => {
            stop.cancel();
            tracing::warn!(task = %src.name, "drain timed out: unacknowledged events will be re-read from the last confirmed position");
            acker
                .await
                .map_err(|e| WorkerError::transient(format!("acknowledger task failed: {e}")))?
        }
    };
    if let Err(e) = lock.release().await {
        tracing::debug!(task = %src.name, error = %e, "lock release failed (the session will drop it)");
    }
    if !stop.is_cancelled() {
        ack_result?;
    }
    read_result
}

/// Finds where the task starts (recording a new starting checkpoint first) and opens the
/// binlog stream there; what its checkpoints are stamped with.
async fn open(
    src: &SourceConfig,
    coords: Coordinates,
    lock: &mut TaskLock,
) -> Result<(BinlogReader, Stamp)> {
    let resumed = match lock.checkpoint() {
        Some(bytes) if !bytes.is_empty() => Some(Checkpoint::from_json(bytes).map_err(|e| {
            WorkerError::definite(format!(
                "the checkpoint of task `{}` cannot be read ({e}): reset the task's position",
                src.name
            ))
        })?),
        _ => None,
    };
    let begin = Begin::new(resumed, coords);
    let info = sluice_mysql::preflight(src, begin.resumes()).await?;
    let (checkpoint, new) = begin_at(src, begin, &info)?;
    if let Some(why) = new {
        // Recorded at once, so a crash before the first commit cannot move the start past
        // unread events (or back to the old epoch).
        lock.confirm(&checkpoint.to_json())
            .await
            .context("cannot record the starting position")?;
        tracing::info!(task = %src.name, position = %checkpoint.position, epoch = checkpoint.epoch, "{why}");
    }
    let start = match (&checkpoint.gtid, info.server.flavor) {
        (Some(g @ GtidSet::MariaDb(_)), Flavor::MariaDb)
        | (Some(g @ GtidSet::MySql(_)), Flavor::MySql)
            if !g.is_empty() =>
        {
            StartAt::Gtid {
                gtid: g.clone(),
                position: checkpoint.position.clone(),
            }
        }
        _ => StartAt::Position(checkpoint.position.clone()),
    };
    tracing::info!(task = %src.name, server = %info.server, start = ?start, "streaming");
    let reader = BinlogReader::start(src, &info.server, start).await?;
    let stamp = Stamp {
        epoch: checkpoint.epoch,
        server_id: info.server_id,
    };
    Ok((reader, stamp))
}

/// The checkpoint a task starts from, and why, when it is a new one to record first.
fn begin_at(
    src: &SourceConfig,
    begin: Begin,
    info: &ServerInfo,
) -> Result<(Checkpoint, Option<&'static str>)> {
    let at_end = |epoch, gtid: Option<GtidSet>, ts_ms| Checkpoint {
        position: info.end.clone(),
        gtid,
        epoch,
        ts_ms,
        server_id: Some(info.server_id),
    };
    match begin {
        Begin::AtEnd { epoch, why } => Ok((
            at_end(epoch, info.gtid.clone().filter(|g| !g.is_empty()), 0),
            Some(why),
        )),
        Begin::Failover { from, epoch } => match from.gtid.filter(|g| !g.is_empty()) {
            // The GTID state decides where the stream starts; the position only names a
            // file of the new server until its first rotate event.
            Some(gtid) => Ok((
                at_end(epoch, Some(gtid), from.ts_ms),
                Some("failover: resuming from the confirmed GTID state on the new server under a new version epoch"),
            )),
            None => Err(WorkerError::definite(format!(
                "source `{}` moved to another server (version epoch {epoch}), but its confirmed position {} has no GTID state \
                 to find on the new one: run `sluicectl sources resnapshot {}`",
                src.name, from.position, src.name
            ))),
        },
        Begin::Resume(cp) => match cp.server_id {
            Some(was) if was != info.server_id => Err(WorkerError::definite(format!(
                "source `{}` now answers from server_id {} at {}:{}, but its confirmed position {} was read from server_id {was}: \
                 the binlog coordinates of another server would version new changes below the indexed ones (refused as stale). \
                 If this is the new primary, run `sluicectl sources failover {} --host {} --port {}` to resume there from the \
                 confirmed GTID state under a new version epoch",
                src.name, info.server_id, src.host, src.port, cp.position, src.name, src.host, src.port
            ))),
            _ => Ok((cp, None)),
        },
    }
}

/// What every checkpoint of one run of a task carries besides the position.
#[derive(Clone, Copy)]
struct Stamp {
    epoch: u16,
    server_id: u32,
}

/// How far the confirmed position is behind the server's end of binlog, in bytes, every
/// 10 s, until `stop` (a connection of its own; failures only leave the figure unknown).
async fn watch_bytes_behind(src: SourceConfig, progress: Arc<Progress>, stop: CancellationToken) {
    const EVERY: Duration = Duration::from_secs(10);
    let mut conn = None;
    loop {
        let at: Option<sluice_model::BinlogPosition> = progress.position().parse().ok();
        if let Some(at) = at {
            if conn.is_none() {
                conn = sluice_mysql::preflight::connect(&src).await.ok();
            }
            if let Some(c) = conn.as_mut() {
                match sluice_mysql::bytes_behind(c, &src, &at).await {
                    Ok(bytes) => progress.bytes_behind(bytes),
                    Err(e) => {
                        tracing::debug!(task = %src.name, error = %e, "cannot read the binlog size");
                        progress.bytes_behind(None);
                        conn = None;
                    }
                }
            }
        }
        if !sluice_runtime::shutdown::pause(EVERY, &stop).await {
            return;
        }
    }
}

/// Reads the binlog and publishes each event; commit points follow their events into
/// the acknowledger's queue, whose capacity bounds the work in flight.
async fn publish_loop(
    ctx: &TaskCtx,
    src: &SourceConfig,
    mut reader: BinlogReader,
    tx: mpsc::Sender<Entry>,
    stamp: Stamp,
) -> Result<()> {
    let mut session = ctx.coord.session();
    let producer = ctx.producer.get();
    let mut publisher = Publisher {
        ctx,
        src,
        tx,
        stamp,
        events: crate::metrics::EventLabels::default(),
        told: DeadLetterNotices::default(),
        seen_tables: envelope::SeenTables::default(),
        open: false,
        finish_by: None,
    };
    loop {
        let Some(next) = publisher.next(&mut reader).await else {
            reader.close().await;
            return Ok(());
        };
        let Some(event) = next? else {
            return Err(WorkerError::transient(format!(
                "the server ended the binlog stream at {}",
                reader.position()
            )));
        };
        let Some((record, new_topic)) = publisher.record(event).await? else {
            // A commit: once the open transaction is over, a shutdown stops here.
            if publisher.finish_by.is_some() {
                reader.close().await;
                return Ok(());
            }
            continue;
        };
        publisher.open = true;
        let read_at = Instant::now();
        wait_publishable(&ctx.coord, &mut session, &ctx.shutdown).await?;
        if new_topic {
            ensure_topic(ctx, &record.topic).await?;
        }
        let delivery =
            sluice_kafka::queue(&producer, &record.topic, Some(&record.key), &record.payload)
                .await
                .with_context(|| format!("cannot publish to {}", record.topic))?;
        ctx.progress.published();
        publisher.send(Entry::Delivery(delivery, read_at)).await?;
    }
}

/// What the publisher of one run of a task keeps from one event to the next.
struct Publisher<'a> {
    ctx: &'a TaskCtx,
    src: &'a SourceConfig,
    tx: mpsc::Sender<Entry>,
    stamp: Stamp,
    events: crate::metrics::EventLabels,
    told: DeadLetterNotices,
    seen_tables: envelope::SeenTables,
    /// Events of a transaction whose commit is not read yet have been published:
    /// stopping now would publish them again after a restart (the confirmed position is
    /// the last commit). So a shutdown lets the open transaction finish first.
    open: bool,
    /// When a shutdown came during a transaction: how long it may take to finish (half
    /// the drain bound).
    finish_by: Option<Instant>,
}

impl Publisher<'_> {
    /// The next binlog event; `None` when the task is to stop (and close the reader).
    async fn next(
        &mut self,
        reader: &mut BinlogReader,
    ) -> Option<Result<Option<SourceEvent>, sluice_mysql::MysqlError>> {
        let ctx = self.ctx;
        loop {
            match self.finish_by {
                Some(deadline) => {
                    return match tokio::time::timeout_at(deadline, reader.next()).await {
                        Ok(next) => Some(next),
                        Err(_) => {
                            tracing::warn!(task = %self.src.name, "the open transaction did not end within the drain bound: its published events will be read again after a restart");
                            None
                        }
                    }
                }
                None => tokio::select! {
                    biased;
                    _ = ctx.shutdown.cancelled() => {
                        if !self.open {
                            return None;
                        }
                        tracing::info!(task = %self.src.name, "shutdown: finishing the open transaction first");
                        self.finish_by = Some(Instant::now() + ctx.cfg.worker.drain_timeout / 2);
                    }
                    next = reader.next() => return Some(next),
                },
            }
        }
    }

    /// The record to publish for `event`, and whether its topic is new; `None` for a commit (queued).
    async fn record(&mut self, event: SourceEvent) -> Result<Option<(envelope::Record, bool)>> {
        let (ctx, src) = (self.ctx, self.src);
        let task = &src.name;
        let topics = &ctx.cfg.topics;
        Ok(Some(match event {
            SourceEvent::Row(rc) => {
                self.events.count(task, &rc);
                self.told.keyless(ctx, task, &rc);
                envelope::row(topics, &mut self.seen_tables, task, self.stamp.epoch, rc)?
            }
            SourceEvent::Ddl(d) => (envelope::ddl(topics, task, d)?, true),
            SourceEvent::Unreadable(u) => {
                let record = envelope::unreadable(topics, task, &u)?;
                self.told.unreadable(ctx, task, &u, &record.topic);
                (record, true)
            }
            SourceEvent::Commit(cp) => {
                self.events.flush();
                ctx.progress.read_commit(cp.ts_ms);
                let cp = Checkpoint {
                    position: cp.position,
                    gtid: cp.gtid,
                    epoch: self.stamp.epoch,
                    ts_ms: cp.ts_ms,
                    server_id: Some(self.stamp.server_id),
                };
                self.send(Entry::Commit(cp)).await?;
                self.open = false;
                return Ok(None);
            }
        }))
    }

    /// Hands `entry` to the acknowledger, waiting while its queue is full.
    async fn send(&self, entry: Entry) -> Result<()> {
        self.tx
            .send(entry)
            .await
            .map_err(|_| WorkerError::transient("acknowledger stopped"))
    }
}

/// Rows the etl will certainly dead-letter are told as events as well, so an operator
/// learns of them without reading the dead-letter topic: keyless rows once per table,
/// undecodable ones each time.
#[derive(Default)]
struct DeadLetterNotices {
    keyless: HashSet<(String, String)>,
}

impl DeadLetterNotices {
    fn keyless(&mut self, ctx: &TaskCtx, task: &str, rc: &RowChange) {
        if sluice_model::event::has_document_id(&rc.key)
            || !self
                .keyless
                .insert((rc.schema.db.clone(), rc.schema.table.clone()))
        {
            return;
        }
        let why = format!(
            "rows of {}.{} have no primary key value: a pipeline without `id` columns dead-letters them (give the table a primary key, or its pipelines `id` columns)",
            rc.schema.db, rc.schema.table
        );
        tracing::warn!(task, "{why}");
        ctx.reports.event("dead_letter", task, why);
    }

    fn unreadable(&self, ctx: &TaskCtx, task: &str, u: &Unreadable, topic: &str) {
        let why = format!(
            "rows of {}.{} at {}:{} cannot be decoded ({}): dead-lettered to {topic}",
            u.db, u.table, u.file, u.pos, u.reason
        );
        ctx.reports.event("dead_letter", task, why);
    }
}

/// Publishing goes on only while the session is confirmed alive within its lease; it
/// pauses while the connection is lost or in doubt and stops for good when the session
/// expires. The lease is read from the clock on every call, so a worker that was stopped
/// (SIGSTOP, a long GC-like pause) and continued publishes nothing before its supervisor
/// has caught up.
async fn wait_publishable(
    coord: &Coordinator,
    session: &mut watch::Receiver<SessionState>,
    shutdown: &CancellationToken,
) -> Result<()> {
    let mut warned = false;
    loop {
        let state = *session.borrow_and_update();
        match state {
            SessionState::Connected if coord.is_live() => {
                if warned {
                    tracing::info!("ZooKeeper session confirmed again: publishing resumes");
                }
                return Ok(());
            }
            SessionState::Expired => return Err(expired()),
            SessionState::Connected | SessionState::Disconnected => {}
        }
        if !warned {
            tracing::warn!("ZooKeeper session not confirmed alive: publishing paused");
            warned = true;
        }
        // Connected but out of lease: the supervisor is about to say so; look again soon.
        let recheck = state == SessionState::Connected;
        tokio::select! {
            changed = session.changed() => if changed.is_err() { return Err(expired()) },
            _ = tokio::time::sleep(Duration::from_millis(20)), if recheck => {}
            _ = shutdown.cancelled() => return Err(WorkerError::transient("shutdown while paused")),
        }
    }
}

async fn ensure_topic(ctx: &TaskCtx, topic: &str) -> Result<()> {
    let mut known = ctx.known_topics.lock().await;
    if known.contains(topic) {
        return Ok(());
    }
    sluice_kafka::ensure_topics(&ctx.cfg.kafka, &[topic.to_owned()])
        .await
        .with_context(|| format!("cannot create topic {topic}"))?;
    known.insert(topic.to_owned());
    Ok(())
}

enum Step {
    Entry(Option<Entry>),
    Tick,
    Lost(String),
}

/// Awaits Kafka's acknowledgements in binlog order; a commit point becomes confirmable
/// once every delivery before it succeeded, and is written (compare-and-set) at most every
/// `interval`. Any failed delivery stops the task before its commit can be confirmed.
async fn acknowledge(
    mut rx: mpsc::Receiver<Entry>,
    lock: &mut TaskLock,
    interval: Duration,
    task: &str,
    progress: &Progress,
) -> Result<()> {
    let mut ready: Option<Checkpoint> = None;
    let mut last_write = Instant::now();
    // When the first event of the open transaction was read.
    let mut first_read: Option<Instant> = None;
    loop {
        let step = tokio::select! {
            entry = rx.recv() => Step::Entry(entry),
            _ = tokio::time::sleep_until(last_write + interval), if ready.is_some() => Step::Tick,
            why = lock.lost() => Step::Lost(why),
        };
        match step {
            Step::Lost(why) => return Err(WorkerError::Deposed(format!("task lock lost: {why}"))),
            Step::Tick => {}
            Step::Entry(None) => {
                if let Some(cp) = ready.take() {
                    confirm(lock, &cp, task, progress).await?;
                }
                return Ok(());
            }
            Step::Entry(Some(Entry::Commit(cp))) => {
                if let Some(read) = first_read.take() {
                    crate::metrics::METRICS
                        .publish_latency
                        .record(read.elapsed().as_secs_f64(), &[]);
                }
                ready = Some(cp);
            }
            Step::Entry(Some(Entry::Delivery(delivery, read_at))) => {
                first_read.get_or_insert(read_at);
                delivery
                    .acknowledged()
                    .await
                    .context("the position was not confirmed past it")?;
            }
        }
        if last_write.elapsed() >= interval {
            if let Some(cp) = ready.take() {
                match confirm(lock, &cp, task, progress).await {
                    Ok(()) => last_write = Instant::now(),
                    Err(e @ (WorkerError::Transient(_) | WorkerError::SessionExpired(_))) => {
                        tracing::warn!(task, error = %e, "cannot confirm yet; will retry");
                        ready = Some(cp);
                        last_write = Instant::now();
                    }
                    Err(e) => return Err(e),
                }
            }
        }
    }
}

async fn confirm(
    lock: &mut TaskLock,
    cp: &Checkpoint,
    task: &str,
    progress: &Progress,
) -> Result<()> {
    lock.confirm(&cp.to_json()).await?;
    progress.confirmed(
        cp.position.to_string(),
        cp.gtid
            .as_ref()
            .map(ToString::to_string)
            .unwrap_or_default(),
    );
    tracing::debug!(task, position = %cp.position, "position confirmed");
    Ok(())
}
