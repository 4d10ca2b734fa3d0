//! A planned batch applied and landed: its writes set going (flat pipelines' in the
//! flight, beside the batches before it; documents read back from MySQL once no backlog
//! holds them, see [`Held`]),
//! then, oldest first, each batch whose writes are done finished — its dead letters in
//! Kafka, its changes of delayed relations handed over, what it tells the center
//! recorded — and only then its offsets committed.

use std::collections::BTreeMap;
use std::time::Duration;

use serde_json::Value;
use sluice_elastic::EsClient;
use sluice_kafka::{CommitMode, Feed, Producer, SharedProducer};
use sluice_model::dead_letter::{EventLetter, LETTER_VERSION};
use tokio::sync::oneshot;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::batch::{Batch, Bounds, DeadLetter, Msg};
use crate::config::EtlConfig;
use crate::error::{Context as _, Result};
use crate::flight::{Flight, Landed};
use crate::metrics::{self, METRICS};
use crate::pipeline::Router;
use crate::plan::{self, Plan};
use crate::{ddl, docs, follow, write};

/// What the etl did, for its progress lines.
#[derive(Default)]
pub(crate) struct Stats {
    pub events: u64,
    pub written: u64,
    pub stale: u64,
    pub retried: u64,
    pub dead_lettered: u64,
}

impl Stats {
    fn add(&mut self, t: &write::Tally) {
        self.written += t.written;
        self.stale += t.stale;
        self.retried += t.retried;
    }
}

/// What applying and landing batches work with.
pub(crate) struct Ctx<'a> {
    pub es: &'a EsClient,
    pub producer: &'a SharedProducer,
    pub feed: &'a Feed,
    pub cfg: &'a EtlConfig,
    pub shutdown: &'a CancellationToken,
    /// To the follower (cluster mode): what to record before the batch is committed
    /// (documents DDL changed, build markers applied), answered once recorded.
    pub notes: Option<&'a follow::NotesTx>,
}

impl Ctx<'_> {
    /// A writer for a batch whose unmappable messages are `dead`.
    fn writer(&self, dead: Vec<DeadLetter>) -> write::Writer {
        write::Writer::new(self.es, self.cfg.etl.retry(), self.shutdown, dead)
    }
}

/// What a batch carries from its planning to its landing: the pipelines whose documents
/// DDL changed, to record before its commit.
pub(crate) type InFlight = Flight<Vec<ddl::Rewritten>>;

/// Batches held while a backlog of changes read back from MySQL lasts, planned into one:
/// a document their changes dirty is read once for all of them (a product's SKUs, prices
/// and tags arrive table by table, in different batches), then written, and the held
/// batches land as one. Flat changes that come meanwhile are held too: nothing newer may
/// be committed before what is held.
#[derive(Default)]
pub(crate) struct Held {
    batch: Batch,
    plan: Plan,
    since: Option<Instant>,
    /// Answered once the last batch set going has read its documents back.
    read: Option<oneshot::Receiver<()>>,
    /// Held (also) because that read was still under way: written once it is done.
    for_read: bool,
}

/// Held batches are written after at most this long (during a backlog, whose documents
/// are late already),
const MAX_HOLD: Duration = Duration::from_secs(2);
/// … or once they are this many full batches (by messages or bytes).
const HOLD_BATCHES: usize = 4;
/// How often the loop looks whether the read that batches wait for is done.
const READ_POLL: Duration = Duration::from_millis(5);

impl Held {
    pub fn is_empty(&self) -> bool {
        self.batch.msgs.is_empty()
    }

    /// When to look again whether what is held must be written: at the latest after
    /// [`MAX_HOLD`]; soon, when it waits for a read to end.
    pub fn due(&self) -> Option<Instant> {
        let latest = self.since.map(|since| since + MAX_HOLD)?;
        if self.for_read {
            return Some(latest.min(Instant::now() + READ_POLL));
        }
        Some(latest)
    }

    /// Whether the documents of the last batch set going are still being read back. Then
    /// the next batches wait and join what is held, so that the next read takes every
    /// document they dirtied at once: reads follow each other (see [`write_held`]), and
    /// many small ones would queue behind each other under a steady load of changes,
    /// each paying the queries' round trips again.
    fn reading(&mut self) -> bool {
        let Some(read) = self.read.as_mut() else {
            return false;
        };
        if let Err(oneshot::error::TryRecvError::Empty) = read.try_recv() {
            return true;
        }
        // Done (or failed): a receiver that answered may not be asked again.
        self.read = None;
        false
    }

    /// Whether what is held may wait longer: a read is under way, and the held batches
    /// are not due.
    pub fn may_wait(&mut self, bounds: &Bounds) -> bool {
        !self.is_empty() && !self.full(bounds) && self.reading()
    }

    /// Whether what is held must be written now, whatever comes next.
    fn full(&self, bounds: &Bounds) -> bool {
        self.since.is_some_and(|s| s.elapsed() >= MAX_HOLD)
            || self.batch.holds(bounds, HOLD_BATCHES)
            // The center waits for these.
            || !self.plan.rewritten.is_empty()
    }
}

/// Whether a batch that dirtied documents read back may be held (see [`apply`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum MayHold {
    /// More are waiting (a full batch, or a starting etl's first).
    Backlog,
    /// While the last read back is under way.
    WhileReading,
    /// The etl stops or re-routes: what is held is written now.
    No,
}

/// Plans a batch and sets its writes going. Flat pipelines' writes join the flight once
/// the limit allows (writes of documents a batch in flight is writing wait for it; see
/// the flight's module). A batch that
/// dirtied documents read back from MySQL is held when `backlog` says more are waiting,
/// or while the last read back is under way (see [`Held`]), up to the batch `bounds`
/// four times over; otherwise what is held is written — after every batch before it
/// has landed — and lands at once. `false` when shutdown interrupted it: nothing more may
/// be committed.
#[tracing::instrument(name = "etl.apply", skip_all, fields(messages = batch.msgs.len()))]
#[allow(clippy::too_many_arguments)]
pub(crate) async fn apply(
    ctx: &Ctx<'_>,
    router: &mut Router,
    sources: &mut docs::Sources,
    flight: &mut InFlight,
    held: &mut Held,
    batch: Batch,
    stats: &mut Stats,
    bounds: &Bounds,
    may_hold: MayHold,
) -> Result<bool> {
    stats.events += batch.msgs.len() as u64;
    METRICS.events.add(batch.msgs.len() as u64, &[]);
    let mut plan = std::mem::take(&mut held.plan);
    let routed = plan::route(router, &batch.msgs, held.batch.msgs.len(), &mut plan.dead);
    let retry = ctx.cfg.etl.retry();
    let Some(prepared) = plan::prepare(router, ctx.es, retry, &routed, ctx.shutdown).await? else {
        return Ok(false);
    };
    plan::plan(router, routed, &prepared, &mut plan);
    if held.is_empty() && plan.dirty.is_empty() {
        let (ops, origins) = plan.take_writes();
        let docs = flight.docs(&ops);
        if !make_room(ctx, router, flight, stats).await? {
            return Ok(false);
        }
        let writer = ctx.writer(plan.dead);
        flight.launch(batch, docs, writer, (ops, origins), plan.rewritten);
        return Ok(true);
    }
    // A build's marker is waited for by the center: it goes at once.
    let marked = batch.msgs.iter().any(|m| m.marker.is_some());
    held.batch.append(batch);
    held.plan = plan;
    held.since.get_or_insert_with(Instant::now);
    if !marked && !held.full(bounds) {
        match may_hold {
            MayHold::Backlog => return Ok(true),
            MayHold::WhileReading if held.reading() => {
                held.for_read = true;
                return Ok(true);
            }
            MayHold::WhileReading | MayHold::No => {}
        }
    }
    write_held(ctx, router, sources, flight, held, stats).await
}

/// Sets what is held going as one batch of the flight: its documents are read back and
/// written in a task of their own while the next batches are collected (and read theirs
/// once it has read its own), and it lands in its turn. `false` when shutdown
/// interrupted it: nothing more may be committed.
pub(crate) async fn write_held(
    ctx: &Ctx<'_>,
    router: &Router,
    sources: &mut docs::Sources,
    flight: &mut InFlight,
    held: &mut Held,
    stats: &mut Stats,
) -> Result<bool> {
    if held.is_empty() {
        return Ok(true);
    }
    let after = held.read.take();
    let Held {
        batch, mut plan, ..
    } = std::mem::take(held);
    let (reads_done, read) = oneshot::channel();
    held.read = Some(read);
    // The flight's limit bounds the batches going.
    if !make_room(ctx, router, flight, stats).await? {
        return Ok(false);
    }
    // Handed over first: a batch not committed hands them over again when it is
    // replayed, which the delayed job folds into one.
    let delayed = plan
        .dirty
        .take_delayed(|p| router.pipelines[p].cfg.spec.name.clone());
    if !hand_over(ctx, &delayed).await? {
        return Ok(false);
    }
    let reads = docs::Reads::of(router, sources, std::mem::take(&mut plan.dirty));
    let (ops, origins) = plan.take_writes();
    let writer = ctx.writer(plan.dead);
    let etl = &ctx.cfg.etl;
    let bounds = (etl.max_batch_docs, etl.max_batch_bytes, flight.lanes());
    let (retry, concurrency) = (etl.retry(), etl.read_concurrency);
    let shutdown = ctx.shutdown.clone();
    let task = tokio::spawn(async move {
        let mut writer = writer;
        let began = Instant::now();
        let (mut waited, mut read_ms) = (0, 0);
        let mut complete = writer.write(ops, origins).await?;
        if complete {
            // The documents read back: several bulks in flight while the next are read.
            let (docs, bytes, lanes) = bounds;
            let mut lanes = write::Lanes::new(&mut writer, docs, bytes, lanes);
            let reading = docs::Reading {
                retry,
                concurrency,
                shutdown: &shutdown,
                done: std::sync::Mutex::new(Some(reads_done)),
            };
            // Read after the batches before have read theirs: a document read here is
            // never older than what they read, and its higher version wins in whatever
            // order the writes land.
            let waiting = Instant::now();
            if let Some(after) = after {
                let _ = after.await;
            }
            waited = waiting.elapsed().as_millis() as u64;
            let reading_began = Instant::now();
            complete = reads.run(&mut lanes, &reading).await?;
            read_ms = reading_began.elapsed().as_millis() as u64;
            // Said already after the last read, unless there was none or it stopped.
            reading.reads_done();
            complete = complete && lanes.settle().await?;
        }
        let written = writer.finish(complete);
        tracing::debug!(
            documents = written.tally.written + written.tally.stale,
            ms = began.elapsed().as_millis() as u64,
            waited_for_the_read_before_ms = waited,
            reading_ms = read_ms,
            "documents read back written"
        );
        Ok(written)
    });
    flight.launch_task(batch, task, plan.rewritten);
    Ok(true)
}

/// Waits until another batch may join the flight, landing the oldest batches as their
/// writes finish. `false` when shutdown interrupted one.
async fn make_room(
    ctx: &Ctx<'_>,
    router: &Router,
    flight: &mut InFlight,
    stats: &mut Stats,
) -> Result<bool> {
    while flight.must_wait() {
        if !flight.front_done() {
            flight.some_done().await;
            continue;
        }
        let landed = flight.land().await?;
        if !land(ctx, router, landed, stats, CommitMode::Async).await? {
            return Ok(false);
        }
    }
    Ok(true)
}

/// Lands every batch in flight, oldest first. `false` when shutdown interrupted one.
pub(crate) async fn drain(
    ctx: &Ctx<'_>,
    router: &Router,
    flight: &mut InFlight,
    stats: &mut Stats,
    mode: CommitMode,
) -> Result<bool> {
    while !flight.is_empty() {
        let landed = flight.land().await?;
        if !land(ctx, router, landed, stats, mode).await? {
            return Ok(false);
        }
    }
    Ok(true)
}

/// Finishes a batch whose writes are done, every batch before it having landed: its dead
/// letters in Kafka, what it tells the center recorded, then its offsets committed.
/// `false` when shutdown interrupted it: nothing more may be committed.
pub(crate) async fn land(
    ctx: &Ctx<'_>,
    router: &Router,
    landed: Landed<Vec<ddl::Rewritten>>,
    stats: &mut Stats,
    mode: CommitMode,
) -> Result<bool> {
    let Landed {
        batch,
        written,
        rest: rewritten,
    } = landed;
    stats.add(&written.tally);
    if !written.complete {
        return Ok(false);
    }
    let mut dead = written.dead;
    for d in &mut dead {
        if let (None, Some(index)) = (&d.pipeline, &d.index) {
            d.pipeline = router.owner_of(index);
        }
    }
    if !dead.is_empty() {
        stats.dead_lettered += dead.len() as u64;
        for d in &dead {
            let pipeline = d.pipeline.clone().unwrap_or_default();
            METRICS
                .dead_letters
                .add(1, &[opentelemetry::KeyValue::new("pipeline", pipeline)]);
        }
        if !dead_letter(ctx.producer, ctx.cfg, &batch.msgs, &dead, ctx.shutdown).await? {
            return Ok(false);
        }
    }
    if let Some(tx) = ctx.notes {
        // Markers of builds this etl is not making (reset or finished ones, in the
        // pipeline's build topic) say nothing.
        let markers = batch.msgs.iter().filter_map(|m| {
            let marker = m.marker.as_ref()?;
            router
                .building(&marker.pipeline, marker.version)
                .then(|| (marker.clone(), m.partition))
        });
        if !tell_center(tx, markers, rewritten, ctx.shutdown).await {
            return Ok(false);
        }
    }
    if let Some(first) = batch.first {
        METRICS
            .index_latency
            .record(first.elapsed().as_secs_f64(), &[]);
    }
    // A crash here: Elasticsearch has the batch, Kafka not its offsets.
    sluice_model::failpoint("etl.before_commit");
    commit(ctx.feed, &batch.msgs, mode);
    Ok(true)
}

/// Records, for the center, the documents DDL changed and the build markers the batch
/// holds (every batch before it has landed, so each marker's partition is applied up to
/// it). `false` when shutdown came first.
async fn tell_center(
    tx: &follow::NotesTx,
    markers: impl Iterator<Item = (sluice_zk::layout::Marker, i32)>,
    rewritten: Vec<ddl::Rewritten>,
    shutdown: &CancellationToken,
) -> bool {
    if !rewritten.is_empty()
        && !follow::send_note(tx, follow::Note::Rewrites(rewritten), shutdown).await
    {
        return false;
    }
    let mut recorded = 0;
    for (marker, partition) in markers {
        let note = follow::Note::CaughtUp { marker, partition };
        if !follow::send_note(tx, note, shutdown).await {
            return false;
        }
        recorded += 1;
    }
    if recorded > 0 {
        // A crash here: the build's marker is recorded, its offset not committed.
        sluice_model::failpoint("etl.after_build_marker");
    }
    true
}

/// Publishes dead letters and waits until Kafka has them all; only then may the batch's
/// offsets be committed. `false` when shutdown came first.
async fn dead_letter(
    producer: &SharedProducer,
    cfg: &EtlConfig,
    batch: &[Msg],
    dead: &[DeadLetter],
    shutdown: &CancellationToken,
) -> Result<bool> {
    let topic = &cfg.topics.dead_letter;
    acknowledged(producer, cfg, shutdown, "dead letters", async |p| {
        send_letters(p, topic, batch, dead).await
    })
    .await
}

/// Hands the changes of `delayed` relations to the center (the delayed topic) and waits
/// until Kafka has them all: the batch is not committed before. `false` when shutdown
/// came first.
async fn hand_over(ctx: &Ctx<'_>, delayed: &[sluice_model::DelayedChange]) -> Result<bool> {
    if delayed.is_empty() {
        return Ok(true);
    }
    let topic = &ctx.cfg.topics.delayed;
    let sent = acknowledged(
        ctx.producer,
        ctx.cfg,
        ctx.shutdown,
        "delayed changes",
        async |p| {
            let mut deliveries = Vec::with_capacity(delayed.len());
            for change in delayed {
                let payload = serde_json::to_vec(change)?;
                let key = Some(change.pipeline.as_bytes());
                deliveries.push(sluice_kafka::queue(p, topic, key, &payload).await?);
            }
            for d in deliveries {
                d.acknowledged()
                    .await
                    .context("Kafka did not take a delayed change; the batch is not committed")?;
            }
            Ok(())
        },
    )
    .await?;
    if sent {
        for change in delayed {
            METRICS
                .delayed_changes
                .add(1, &metrics::pipeline(&change.pipeline));
        }
    }
    Ok(sent)
}

/// Runs `send` until Kafka acknowledged everything it sent; what was refused is sent
/// again, by a new producer, with backoff. `false` when shutdown came first.
async fn acknowledged(
    producer: &SharedProducer,
    cfg: &EtlConfig,
    shutdown: &CancellationToken,
    what: &str,
    mut send: impl AsyncFnMut(&Producer) -> Result<()>,
) -> Result<bool> {
    let mut backoff = cfg.etl.retry().backoff();
    loop {
        let Err(e) = send(&producer.get()).await else {
            return Ok(true);
        };
        let Some(why) = producer.renew_after(&e) else {
            return Err(e);
        };
        let pause = backoff.next_pause();
        tracing::warn!(%why, retry_in = ?pause, "Kafka refused {what}: sending them again with a new producer");
        if !sluice_runtime::shutdown::pause(pause, shutdown).await {
            return Ok(false);
        }
    }
}

async fn send_letters(
    producer: &Producer,
    topic: &str,
    batch: &[Msg],
    dead: &[DeadLetter],
) -> Result<()> {
    let mut deliveries = Vec::with_capacity(dead.len());
    for d in dead {
        let msg = &batch[d.msg];
        let event: Value = serde_json::from_slice(&msg.payload)
            .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&msg.payload).into_owned()));
        tracing::warn!(topic = %msg.topic, partition = msg.partition, offset = msg.offset, reason = %d.reason, "dead-lettering event");
        let payload = serde_json::to_vec(&EventLetter {
            v: LETTER_VERSION,
            reason: d.reason.clone(),
            pipeline: d.pipeline.clone(),
            topic: msg.topic.clone(),
            partition: msg.partition,
            offset: msg.offset,
            event,
        })?;
        let delivery = sluice_kafka::queue(producer, topic, msg.key.as_deref(), &payload)
            .await
            .context("cannot queue a dead letter")?;
        deliveries.push(delivery);
    }
    for delivery in deliveries {
        delivery
            .acknowledged()
            .await
            .context("Kafka did not take a dead letter; the batch is not committed")?;
    }
    Ok(())
}

/// Commits, per partition, the offset after the batch's last message.
fn commit(feed: &Feed, batch: &[Msg], mode: CommitMode) {
    let mut next: BTreeMap<(&str, i32), i64> = BTreeMap::new();
    for m in batch {
        let e = next.entry((&m.topic, m.partition)).or_insert(m.offset + 1);
        *e = (*e).max(m.offset + 1);
    }
    // A failed commit (e.g. the group coordinator unreachable) only
    // means the events are applied again, harmlessly.
    let next = next.into_iter().map(|((t, p), o)| (t, p, o));
    if let Err(e) = feed.commit(next, mode) {
        tracing::warn!(error = %e, "offset commit failed; the batch may be replayed");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn batches_wait_while_a_read_is_under_way_and_go_once_it_is_done() {
        let bounds = Bounds::of_docs(20);
        let mut held = Held::default();
        held.batch.add(
            Msg {
                topic: "tree".into(),
                partition: 0,
                offset: 0,
                key: None,
                payload: b"{}".to_vec(),
                marker: None,
            },
            &bounds,
        );
        held.since = Some(Instant::now());
        assert!(!held.may_wait(&bounds), "nothing is being read");
        assert!(held.due() >= Some(Instant::now() + MAX_HOLD / 2));

        let (read, done) = oneshot::channel();
        held.read = Some(done);
        held.for_read = true;
        assert!(held.may_wait(&bounds), "the last batch's read is under way");
        assert!(
            held.due() <= Some(Instant::now() + READ_POLL),
            "looked at again soon"
        );
        let _ = read.send(());
        assert!(!held.may_wait(&bounds), "the read is done");
        assert!(!held.may_wait(&bounds), "asked again: still done, no panic");
    }
}
