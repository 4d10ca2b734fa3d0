//! Several batches' bulks in flight at once, landed in the order they were consumed.
//!
//! While batches are being written, the next one is collected and planned. A planned
//! batch is written by a task of its own, so up to the concurrency limit of bulks travel
//! at once; they land (are dead-lettered, recorded and committed) strictly in consumption
//! order, so no partition's committed offset passes a message of an unfinished batch, and
//! a build's catch-up marker is recorded only once everything before it is applied.
//!
//! The limit counts the batches still being written (one whose writes of a shared
//! document wait for an earlier batch among them), not the batches waiting to land: a
//! batch whose writes finished while an older one is still being written frees its place
//! at once, as a client with several requests in flight would (a slow bulk does not hold
//! the others' places). How many batches may wait to land is bounded too, at twice the
//! limit's maximum, so a stalled bulk holds only so many batches in memory.
//!
//! Per-document order is kept: a batch's writes of documents an earlier batch is still
//! writing wait until that batch's writes are over; its other writes go at once. (A
//! batch as a whole waiting for any document in common held every batch back behind the
//! one before whenever a transaction's inserts and its updates fell into two batches: one
//! bulk in flight at a time.) External versions would make a reordering harmless anyway
//! (the higher version wins, a delete's tombstone outlives any retry by days), but kept
//! order also keeps the counts of stale writes meaningful.
//! Documents read back from MySQL (pipelines with relations or a filter) are only known
//! once read, so such a batch is applied after every batch before it has landed.
//!
//! The limit adapts: a batch whose writes met a 429 halves it, a window of batches
//! without one raises it by one, up to `etl.max_in_flight`.

use std::collections::{HashSet, VecDeque};
use std::hash::{BuildHasher as _, RandomState};

use sluice_elastic::BulkOp;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::batch::Batch;
use crate::error::{Context as _, EtlError, Result};
use crate::metrics::METRICS;
use crate::write::{Origin, Writer, Written};

/// A batch whose writes are done, with what it still needs before its commit.
pub(crate) struct Landed<T> {
    pub batch: Batch,
    pub written: Written,
    pub rest: T,
}

struct Flying<T> {
    batch: Batch,
    /// Hashes of (index, id) of the documents it writes.
    docs: HashSet<u64>,
    writes: Writes,
    rest: T,
    /// Cancelled once its writes are over (done, failed or aborted): what a later batch's
    /// writes of the same documents wait for.
    over: CancellationToken,
}

/// A batch's writes: still going, or what they came to.
enum Writes {
    Going(JoinHandle<Result<Written>>),
    Done(Result<Written>),
}

impl Writes {
    /// Done, or about to say so when awaited.
    fn is_done(&self) -> bool {
        match self {
            Writes::Going(task) => task.is_finished(),
            Writes::Done(_) => true,
        }
    }

    /// Waits for the writes to be done. Cancel-safe.
    async fn finish(&mut self) {
        if let Writes::Going(task) = self {
            *self = Writes::Done(task.await.context("a bulk task panicked").and_then(|w| w));
        }
    }

    fn outcome(self) -> Result<Written> {
        match self {
            Writes::Done(outcome) => outcome,
            Writes::Going(_) => Err(EtlError::definite(
                "a batch landed before its writes were done",
            )),
        }
    }
}

/// The batches in flight, oldest first; `T` is what a batch carries to its landing.
pub(crate) struct Flight<T> {
    queue: VecDeque<Flying<T>>,
    limit: Limit,
    hasher: RandomState,
}

impl<T> Flight<T> {
    pub fn new(max: usize) -> Self {
        let limit = Limit {
            max,
            now: max,
            clean: 0,
        };
        METRICS.bulk_concurrency.record(max as u64, &[]);
        let flight = Flight {
            queue: VecDeque::new(),
            limit,
            hasher: RandomState::new(),
        };
        flight.export_gauges();
        flight
    }

    pub fn is_empty(&self) -> bool {
        self.queue.is_empty()
    }

    /// How many bulks may be in flight now.
    pub fn lanes(&self) -> usize {
        self.limit.now
    }

    /// The document hashes of `ops`.
    pub fn docs(&self, ops: &[BulkOp]) -> HashSet<u64> {
        ops.iter()
            .map(|op| self.hasher.hash_one((op.index(), op.id())))
            .collect()
    }

    /// Whether the next batch must wait before it is launched: the limit of bulks being
    /// written is reached, or as many batches as may wait to land are waiting.
    pub fn must_wait(&self) -> bool {
        self.queue.len() >= self.most_queued() || self.going().count() >= self.limit.now
    }

    /// Of `docs`, those a batch still being written writes, with what tells when the
    /// newest such batch of each is over: it waits for any older one writing the same
    /// document before its own writes of it end, so order holds along a chain.
    fn busy(&self, docs: &HashSet<u64>) -> (HashSet<u64>, Vec<CancellationToken>) {
        let (mut busy, mut over) = (HashSet::new(), Vec::new());
        for f in self.going().rev() {
            let before = busy.len();
            busy.extend(f.docs.intersection(docs).copied());
            if busy.len() > before {
                over.push(f.over.clone());
            }
        }
        (busy, over)
    }

    /// The most batches queued, being written or waiting to land: twice the limit's
    /// maximum (see the module's comment).
    fn most_queued(&self) -> usize {
        2 * self.limit.max
    }

    /// The batches whose writes are not done.
    fn going(&self) -> impl DoubleEndedIterator<Item = &Flying<T>> {
        self.queue.iter().filter(|f| !f.writes.is_done())
    }

    /// The metrics of batches being written and of batches written but waiting to land.
    fn export_gauges(&self) {
        let going = self.going().count();
        METRICS.bulks_in_flight.record(going as u64, &[]);
        METRICS
            .batches_waiting
            .record((self.queue.len() - going) as u64, &[]);
    }

    /// Whether the oldest batch's writes are done, so that [`Flight::land`] answers at once.
    pub fn front_done(&self) -> bool {
        self.queue.front().is_some_and(|f| f.writes.is_done())
    }

    /// Waits for the writes of some batch to finish, whichever it is (it lands later, in
    /// its turn). Cancel-safe. Returns at once when none is being written.
    pub async fn some_done(&mut self) {
        let going: Vec<_> = self
            .queue
            .iter_mut()
            .filter(|f| matches!(f.writes, Writes::Going(_)))
            .map(|f| Box::pin(f.writes.finish()))
            .collect();
        if !going.is_empty() {
            // Each `finish` keeps its outcome once done; the others are left going.
            futures::future::select_all(going).await;
            self.export_gauges();
        }
    }

    /// Starts `writer` writing `ops` (each from the messages `origins[i]`) in a task of
    /// its own.
    pub fn launch(
        &mut self,
        batch: Batch,
        docs: HashSet<u64>,
        writer: Writer,
        (ops, origins): (Vec<BulkOp>, Vec<Origin>),
        rest: T,
    ) {
        let (busy, after) = self.busy(&docs);
        let (mut now, mut later) = ((Vec::new(), Vec::new()), (Vec::new(), Vec::new()));
        for (op, origin) in ops.into_iter().zip(origins) {
            let to = match busy.contains(&self.hasher.hash_one((op.index(), op.id()))) {
                true => &mut later,
                false => &mut now,
            };
            to.0.push(op);
            to.1.push(origin);
        }
        let over = CancellationToken::new();
        let writes = writer.spawn_after(now, later, after, over.clone().drop_guard());
        self.push(batch, docs, Writes::Going(writes), rest, over);
    }

    /// Adds a batch whose writes `task` makes (documents read back, then written).
    /// Such a batch's documents are not tracked (they are only known once read back;
    /// versions order their writes): no later batch waits for it.
    pub fn launch_task(&mut self, batch: Batch, task: JoinHandle<Result<Written>>, rest: T) {
        let over = CancellationToken::new();
        self.push(batch, HashSet::new(), Writes::Going(task), rest, over);
    }

    fn push(
        &mut self,
        batch: Batch,
        docs: HashSet<u64>,
        writes: Writes,
        rest: T,
        over: CancellationToken,
    ) {
        self.queue.push_back(Flying {
            batch,
            docs,
            writes,
            rest,
            over,
        });
        self.export_gauges();
    }

    /// Waits for the oldest batch to land. Cancel-safe: a batch leaves the queue only once
    /// its task is done. Call only when not empty.
    pub async fn land(&mut self) -> Result<Landed<T>> {
        let front = self.queue.front_mut().context("no batch in flight")?;
        front.writes.finish().await;
        let flying = self.queue.pop_front().context("no batch in flight")?;
        let written = flying.writes.outcome()?;
        self.export_gauges();
        self.limit.after(written.tally.throttled);
        Ok(Landed {
            batch: flying.batch,
            written,
            rest: flying.rest,
        })
    }
}

impl<T> Drop for Flight<T> {
    /// Batches never landed are never committed: their writes need not finish.
    fn drop(&mut self) {
        for f in &self.queue {
            if let Writes::Going(task) = &f.writes {
                task.abort();
            }
        }
    }
}

/// How many batches may be in flight: halved by a throttled batch, raised by one after a
/// window's worth of batches without throttling.
struct Limit {
    max: usize,
    now: usize,
    /// Batches landed without throttling since the last change.
    clean: usize,
}

impl Limit {
    fn after(&mut self, throttled: bool) {
        let before = self.now;
        if throttled {
            self.now = (self.now / 2).max(1);
            self.clean = 0;
        } else {
            self.clean += 1;
            if self.clean >= self.now {
                self.now = (self.now + 1).min(self.max);
                self.clean = 0;
            }
        }
        if self.now != before {
            if self.now < before {
                tracing::info!(
                    from = before,
                    to = self.now,
                    "Elasticsearch is throttling: fewer bulks in flight"
                );
            }
            METRICS.bulk_concurrency.record(self.now as u64, &[]);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn delete(index: &str, id: &str) -> BulkOp {
        BulkOp::Delete {
            index: index.into(),
            id: id.into(),
            version: 1,
            routing: None,
        }
    }

    /// A writer to no server: its batches write nothing, or retry until `shutdown`.
    fn writer_until(shutdown: &tokio_util::sync::CancellationToken) -> Writer {
        let section: sluice_elastic::EsSection =
            serde_json::from_value(serde_json::json!({"url": "http://127.0.0.1:9"})).unwrap();
        let es = section.client().unwrap();
        let pause = std::time::Duration::from_millis(10);
        let retry = sluice_model::RetryPolicy::new(pause, pause);
        Writer::new(&es, retry, shutdown, Vec::new())
    }

    fn writer() -> Writer {
        writer_until(&tokio_util::sync::CancellationToken::new())
    }

    /// Launches an empty batch over `docs`, tagged `tag`.
    fn launch(flight: &mut Flight<u32>, docs: HashSet<u64>, tag: u32) {
        flight.launch(
            Batch::default(),
            docs,
            writer(),
            (Vec::new(), Vec::new()),
            tag,
        );
    }

    /// Launches a batch writing the one document `id` of index `i`, with a writer that
    /// retries against no server until `shutdown`, tagged `tag`.
    fn launch_stuck(
        flight: &mut Flight<u32>,
        id: &str,
        shutdown: &tokio_util::sync::CancellationToken,
        tag: u32,
    ) {
        let ops = vec![delete("i", id)];
        let docs = flight.docs(&ops);
        let writer = writer_until(shutdown);
        flight.launch(
            Batch::default(),
            docs,
            writer,
            (ops, vec![Origin::One(0)]),
            tag,
        );
    }

    #[tokio::test]
    async fn the_limit_holds_a_batch_back_and_batches_land_in_order() {
        let mut flight: Flight<u32> = Flight::new(2);
        let first = flight.docs(&[delete("i", "a")]);
        launch(&mut flight, first, 1);
        assert!(
            !flight.must_wait(),
            "below the limit, the next goes at once"
        );
        let second = flight.docs(&[delete("i", "b")]);
        launch(&mut flight, second, 2);
        assert!(flight.must_wait(), "the limit holds the next batch back");
        assert_eq!(
            flight.land().await.unwrap().rest,
            1,
            "the oldest lands first"
        );
        assert_eq!(flight.land().await.unwrap().rest, 2);
        assert!(flight.is_empty());
    }

    #[tokio::test]
    async fn a_batch_done_behind_one_still_writing_frees_its_place_and_waits_to_land() {
        let mut flight: Flight<u32> = Flight::new(2);
        let shutdown = tokio_util::sync::CancellationToken::new();
        launch_stuck(&mut flight, "a", &shutdown, 1);
        let docs = flight.docs(&[delete("i", "b")]);
        launch(&mut flight, docs, 2);
        flight.some_done().await;
        assert!(!flight.front_done(), "the oldest is still writing");
        assert!(
            !flight.must_wait(),
            "one bulk is being written, so a second may go"
        );
        let docs = flight.docs(&[delete("i", "c")]);
        launch(&mut flight, docs, 3);
        let docs = flight.docs(&[delete("i", "d")]);
        launch(&mut flight, docs, 4);
        flight.some_done().await;
        flight.some_done().await;
        assert!(
            flight.must_wait(),
            "twice the limit waits to land behind the oldest"
        );
        shutdown.cancel();
        let oldest = flight.land().await.unwrap();
        assert_eq!(oldest.rest, 1, "the oldest lands first");
        assert!(!oldest.written.complete, "its writes never got through");
        for tag in 2..=4 {
            assert_eq!(flight.land().await.unwrap().rest, tag);
        }
        assert!(flight.is_empty());
    }

    #[tokio::test]
    async fn a_document_still_being_written_waits_while_the_batch_s_others_go() {
        let mut flight: Flight<u32> = Flight::new(4);
        let shutdown = tokio_util::sync::CancellationToken::new();
        // The first batch's write of "a" cannot get through (no server) until shutdown.
        launch_stuck(&mut flight, "a", &shutdown, 1);
        let (busy, after) = flight.busy(&flight.docs(&[delete("i", "a"), delete("i", "b")]));
        assert_eq!(
            busy,
            flight.docs(&[delete("i", "a")]),
            "only the shared one waits"
        );
        assert_eq!(after.len(), 1);
        assert!(!after[0].is_cancelled(), "the first batch is still writing");
        // The second batch writes "a" too: its write waits for the first's writes, which
        // end only with shutdown.
        launch_stuck(&mut flight, "a", &shutdown, 2);
        assert!(!flight.front_done());
        assert_eq!(flight.going().count(), 2);
        shutdown.cancel();
        assert_eq!(flight.land().await.unwrap().rest, 1);
        assert!(after[0].is_cancelled(), "its writes are over");
        let second = flight.land().await.unwrap();
        assert_eq!(second.rest, 2);
        assert!(!second.written.complete, "shutdown came while it waited");
    }

    #[tokio::test]
    async fn along_a_chain_of_batches_on_one_document_each_waits_for_the_one_before() {
        let mut flight: Flight<u32> = Flight::new(4);
        let (first_stops, second_stops) = (
            tokio_util::sync::CancellationToken::new(),
            tokio_util::sync::CancellationToken::new(),
        );
        launch_stuck(&mut flight, "a", &first_stops, 1);
        launch_stuck(&mut flight, "a", &second_stops, 2);
        // A third batch writing "a" waits for the second (which waits for the first).
        let (_, after) = flight.busy(&flight.docs(&[delete("i", "a")]));
        assert_eq!(after.len(), 1);
        first_stops.cancel();
        assert_eq!(flight.land().await.unwrap().rest, 1);
        assert!(
            !after[0].is_cancelled(),
            "the first's writes are over, the second's are not: the third waits for the second"
        );
        second_stops.cancel();
        assert_eq!(flight.land().await.unwrap().rest, 2);
        assert!(after[0].is_cancelled());
    }

    #[test]
    fn throttling_halves_the_limit_and_clean_windows_raise_it_back() {
        let mut l = Limit {
            max: 4,
            now: 4,
            clean: 0,
        };
        l.after(true);
        assert_eq!(l.now, 2);
        l.after(true);
        l.after(true);
        assert_eq!(l.now, 1, "never below one");
        l.after(false);
        assert_eq!(l.now, 2, "one clean batch is a window of one");
        l.after(false);
        assert_eq!(l.now, 2);
        l.after(false);
        assert_eq!(l.now, 3, "a window of two clean batches");
        for _ in 0..10 {
            l.after(false);
        }
        assert_eq!(l.now, 4, "never above the maximum");
    }
}
