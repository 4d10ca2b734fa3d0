//! Batches: messages taken from the consumer until a batch is full, or until the load
//! says it should go (see [`collect`]).

use std::collections::HashSet;
use std::time::Duration;

use sluice_kafka::{Feed, Received};
use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::config::EtlConfig;
use crate::metrics::METRICS;
use crate::pipeline::Active;

/// One consumed message, detached from the consumer.
pub(crate) struct Msg {
    pub topic: String,
    pub partition: i32,
    pub offset: i64,
    pub key: Option<Vec<u8>>,
    pub payload: Vec<u8>,
    /// A build's catch-up marker: not a change, nothing to apply.
    pub marker: Option<sluice_zk::layout::Marker>,
}

/// A message that must go to the dead-letter topic, and why.
pub(crate) struct DeadLetter {
    pub msg: usize,
    pub reason: String,
    pub pipeline: Option<String>,
    /// The index that refused it: its pipeline is looked up once the batch is through,
    /// only when something was refused.
    pub index: Option<String>,
}

/// A lingered batch with at least this many messages says the load goes on.
const LOADED_BATCH: usize = 10;

/// Fills a batch up to the document or byte bound. When the etl is keeping up (no message
/// was waiting when it came back for this batch, and the last batch did not show a load),
/// the batch is written as soon as the consumer has nothing more buffered, so a lone
/// change waits for nothing. Under a load (messages were waiting, or the last lingered
/// batch gathered [`LOADED_BATCH`] or more), it waits up to `linger` after its first
/// message to fill — counted from when the batch before was handed over: when handling
/// that one took longer, what came meanwhile goes at once (it has waited already) —,
/// fewer, larger bulks, which a sink with a cost per request needs to keep up. A load is
/// over once the consumer waited a whole `linger` with nothing to read: the change that
/// ends such a pause waits for nothing either. Returns the batch, `stop` (shutdown came;
/// the batch holds what was collected) and `reroute` (the pipelines changed: re-route
/// after this batch).
pub(crate) async fn collect(
    feed: &Feed,
    bounds: &Bounds,
    pipelines: &mut watch::Receiver<Option<Vec<Active>>>,
    members: &mut watch::Receiver<Option<Vec<String>>>,
    due: Instant,
    pace: &mut Pace,
    shutdown: &CancellationToken,
) -> (Batch, bool, bool) {
    let (batch, stop, reroute) = fill(feed, bounds, pipelines, members, due, pace, shutdown).await;
    if !batch.msgs.is_empty() {
        pace.handed = Some(Instant::now());
    }
    (batch, stop, reroute)
}

/// How batches have been going: whether a load goes on, and when the last was handed over.
pub(crate) struct Pace {
    pub loaded: bool,
    /// When the last batch with messages was handed over; None before the first, which
    /// lingers from its first message.
    handed: Option<Instant>,
}

impl Pace {
    /// A starting etl most often finds a backlog (a restart, partitions taken over): it
    /// fills its first batch, then finds out.
    pub fn starting() -> Pace {
        Pace {
            loaded: true,
            handed: None,
        }
    }

    /// Whether no batch with messages has been handed over yet.
    pub fn first(&self) -> bool {
        self.handed.is_none()
    }
}

/// [`collect`]'s batch.
async fn fill(
    feed: &Feed,
    bounds: &Bounds,
    pipelines: &mut watch::Receiver<Option<Vec<Active>>>,
    members: &mut watch::Receiver<Option<Vec<String>>>,
    due: Instant,
    pace: &mut Pace,
    shutdown: &CancellationToken,
) -> (Batch, bool, bool) {
    let handed = pace.handed;
    let lingered = || handed.unwrap_or_else(Instant::now) + bounds.linger;
    let loaded = &mut pace.loaded;
    let (mut batch, waiting) = begin(feed, bounds);
    // Nothing came since the last batch went (or since this one began, for the first).
    let idle_since = handed.unwrap_or_else(Instant::now);
    let mut behind = waiting || *loaded;
    let mut deadline = waiting.then(lingered);
    let mut following = true;
    let mut members_following = true;
    loop {
        if batch.full(bounds) {
            *loaded = true;
            return (batch, false, false);
        }
        let received = tokio::select! {
            biased;
            _ = shutdown.cancelled() => return (batch, true, false),
            _ = tokio::time::sleep_until(deadline.unwrap_or_else(Instant::now)), if deadline.is_some() => {
                // What came while the batch before was handled is part of this one.
                take_buffered(feed, &mut batch, bounds);
                *loaded = batch.msgs.len() >= LOADED_BATCH;
                return (batch, false, false);
            }
            // A pipeline change that failed, or a look at the partitions, is due.
            _ = tokio::time::sleep_until(due) => return (batch, false, false),
            // The members changed: the partitions are shared again after this batch.
            changed = members.changed(), if members_following => match changed {
                Ok(()) => {
                    // Left unseen for the loop, which shares the partitions again.
                    members.mark_changed();
                    return (batch, false, false);
                }
                Err(_) => { members_following = false; continue; }
            },
            // The pipelines changed: apply what is in hand, then re-route.
            changed = pipelines.changed(), if following => match changed {
                Ok(()) => return (batch, false, true),
                Err(_) => { following = false; continue; }
            },
            m = feed.recv() => m,
        };
        match received {
            Ok(m) => {
                // The first message after a whole linger with nothing: the load is over.
                if behind
                    && batch.msgs.is_empty()
                    && !waiting
                    && idle_since.elapsed() >= bounds.linger
                {
                    (behind, *loaded) = (false, false);
                }
                batch.push(m, bounds);
                if behind {
                    deadline.get_or_insert_with(lingered);
                    continue;
                }
                take_buffered(feed, &mut batch, bounds);
                return (batch, false, false);
            }
            Err(e) => {
                // Not a retry: librdkafka reconnects by itself and the next receive
                // answers once it has; the pause only keeps a run of errors from spinning.
                tracing::warn!(error = %e, "Kafka consumer error");
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    }
}

/// A batch with the message the consumer already holds, if one was waiting (`true`).
fn begin(feed: &Feed, bounds: &Bounds) -> (Batch, bool) {
    let mut batch = Batch::default();
    match feed.buffered() {
        Some(Ok(m)) => {
            batch.push(m, bounds);
            (batch, true)
        }
        _ => (batch, false),
    }
}

/// Keeping up: what the consumer already buffered joins the batch, up to its bounds.
fn take_buffered(feed: &Feed, batch: &mut Batch, bounds: &Bounds) {
    while !batch.full(bounds) {
        match feed.buffered() {
            Some(Ok(m)) => batch.push(m, bounds),
            Some(Err(_)) | None => break,
        }
    }
}

/// A batch of changes that are read back takes up to this many times `max_batch_docs`
/// messages: many of them lead to one document (a product's SKUs, prices and tags), read
/// once a batch, so a larger batch during a backlog reads each document fewer times.
/// Measured with the tree bench (5,000 products of a shop loaded table by table, 14 rows
/// a product, 71,003 changes): each product was read back 8.8 times at 2,000 messages a
/// batch, 4.6 times at 20,000.
const READ_BACK_SPAN: usize = 10;

/// How much a batch may take: `etl.max_batch_docs` documents (a message of a pipeline
/// that is read back counts for [`READ_BACK_SPAN`]th of one), `etl.max_batch_bytes`.
pub(crate) struct Bounds {
    docs: usize,
    bytes: usize,
    linger: Duration,
    /// The topics whose every pipeline is read back (`Router::reads_back`).
    pub read_back: HashSet<String>,
}

impl Bounds {
    /// Bounds of `docs` documents and a MiB, no linger, nothing read back.
    #[cfg(test)]
    pub fn of_docs(docs: usize) -> Self {
        Bounds {
            docs,
            bytes: 1 << 20,
            linger: Duration::ZERO,
            read_back: HashSet::new(),
        }
    }

    pub fn new(cfg: &EtlConfig) -> Self {
        Bounds {
            docs: cfg.etl.max_batch_docs,
            bytes: cfg.etl.max_batch_bytes,
            linger: cfg.etl.linger,
            read_back: HashSet::new(),
        }
    }
}

/// Messages collected for one batch, and their payloads' size.
#[derive(Default)]
pub(crate) struct Batch {
    pub msgs: Vec<Msg>,
    /// Messages that count as a document each (not read back).
    docs: usize,
    bytes: usize,
    /// When its first message was consumed.
    pub first: Option<Instant>,
}

impl Batch {
    /// Whether the batch reached a bound (collected full, more were likely waiting).
    pub fn full(&self, bounds: &Bounds) -> bool {
        self.holds(bounds, 1)
    }

    /// Whether the batch holds `times` full batches' worth (by documents, messages or
    /// bytes).
    pub fn holds(&self, bounds: &Bounds, times: usize) -> bool {
        let docs = bounds.docs.saturating_mul(times);
        self.docs >= docs
            || self.msgs.len() >= docs.saturating_mul(READ_BACK_SPAN)
            || self.bytes >= bounds.bytes.saturating_mul(times)
    }

    fn push(&mut self, m: Received, bounds: &Bounds) {
        if self.first.is_none() {
            self.first = Some(Instant::now());
            // Kafka's timestamp: when the worker queued the batch's first message.
            if let Some(published) = m.ts_ms {
                let waited = (sluice_model::now_ms() - published).max(0) as f64 / 1000.0;
                METRICS.consume_latency.record(waited, &[]);
            }
        }
        let marker = marker_of(&m);
        let msg = Msg {
            topic: m.topic,
            partition: m.partition,
            offset: m.offset,
            key: m.key,
            payload: m.payload,
            marker,
        };
        self.add(msg, bounds);
    }

    /// `later`'s messages after this batch's (one batch from several held ones).
    pub fn append(&mut self, later: Batch) {
        self.first = self.first.or(later.first);
        self.docs += later.docs;
        self.bytes += later.bytes;
        self.msgs.extend(later.msgs);
    }

    pub(crate) fn add(&mut self, msg: Msg, bounds: &Bounds) {
        if !bounds.read_back.contains(&msg.topic) {
            self.docs += 1;
        }
        self.bytes += msg.payload.len();
        self.msgs.push(msg);
    }
}

/// The build marker a message carries (header [`sluice_zk::layout::MARKER_HEADER`]).
fn marker_of(m: &Received) -> Option<sluice_zk::layout::Marker> {
    let marked = m
        .headers
        .iter()
        .any(|(key, _)| key == sluice_zk::layout::MARKER_HEADER);
    if !marked {
        return None;
    }
    match serde_json::from_slice(&m.payload) {
        Ok(marker) => Some(marker),
        Err(e) => {
            tracing::warn!(error = %e, "unreadable build marker; ignoring it");
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn msg(topic: &str) -> Msg {
        Msg {
            topic: topic.into(),
            partition: 0,
            offset: 0,
            key: None,
            payload: b"{}".to_vec(),
            marker: None,
        }
    }

    #[test]
    fn changes_read_back_fill_a_batch_ten_times_later_than_documents() {
        let bounds = Bounds {
            docs: 20,
            bytes: 1 << 20,
            linger: Duration::ZERO,
            read_back: HashSet::from(["tree".to_owned()]),
        };
        let mut flat = Batch::default();
        for _ in 0..20 {
            assert!(!flat.full(&bounds));
            flat.add(msg("flat"), &bounds);
        }
        assert!(flat.full(&bounds), "a flat change is a document");

        let mut tree = Batch::default();
        for _ in 0..200 {
            assert!(!tree.full(&bounds), "{} changes read back", tree.msgs.len());
            tree.add(msg("tree"), &bounds);
        }
        assert!(tree.full(&bounds), "ten times as many changes read back");

        let mut mixed = Batch::default();
        for _ in 0..100 {
            mixed.add(msg("tree"), &bounds);
        }
        for _ in 0..19 {
            mixed.add(msg("flat"), &bounds);
        }
        assert!(!mixed.full(&bounds));
        mixed.add(msg("flat"), &bounds);
        assert!(mixed.full(&bounds), "the flat changes still fill it");

        let tight = Bounds {
            bytes: 10,
            ..bounds
        };
        let mut by_size = Batch::default();
        for _ in 0..5 {
            by_size.add(msg("tree"), &tight);
        }
        assert!(
            by_size.full(&tight),
            "the byte bound holds for every change"
        );
    }
}
