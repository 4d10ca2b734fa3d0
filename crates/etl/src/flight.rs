//! Several batches' bulks in flight at once, landed in the order they were consumed.
//!
//! While batches are being written, the next one is collected and planned. A planned
//! batch is written by a task of its own, so up to the concurrency limit of bulks travel
//! at once; they land (are dead-lettered, recorded and committed) strictly in consumption
//! order, so no partition's committed offset passes a message of an unfinished batch, and
//! a build's catch-up marker is recorded only once everything before it is applied.
//!
//! Per-document order is kept: a batch that writes a document an earlier batch still in
//! flight also writes waits for that batch to land first. External versions would make a
//! reordering harmless anyway (the higher version wins, a delete's tombstone outlives any
//! retry by days), but kept order also keeps the counts of stale writes meaningful.
//! Documents read back from MySQL (pipelines with relations or a filter) are only known
//! once read, so such a batch is applied after every batch before it has landed.
//!
//! The limit adapts: a batch whose writes met a 429 halves it, a window of batches
//! without one raises it by one, up to `etl.max_in_flight`.

use std::collections::{HashSet, VecDeque};
use std::hash::{BuildHasher as _, RandomState};

use anyhow::Context as _;
use sluice_elastic::BulkOp;
use tokio::task::JoinHandle;

use crate::metrics::METRICS;
use crate::write::{Origin, Writer, Written};
use crate::Batch;

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
    task: JoinHandle<anyhow::Result<Written>>,
    rest: T,
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
        Flight {
            queue: VecDeque::new(),
            limit,
            hasher: RandomState::new(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.queue.is_empty()
    }

    /// How many bulks may be in flight now.
    pub fn lanes(&self) -> usize {
        self.limit.now
    }

    /// A batch written beside the flight (documents read back) met a 429 or did not: the
    /// limit follows it as it follows the batches that land here.
    pub fn observe(&mut self, throttled: bool) {
        self.limit.after(throttled);
    }

    /// The document hashes of `ops`.
    pub fn docs(&self, ops: &[BulkOp]) -> HashSet<u64> {
        ops.iter()
            .map(|op| self.hasher.hash_one((op.index(), op.id())))
            .collect()
    }

    /// Whether a batch writing `docs` must wait for the oldest batch to land first: the
    /// limit is reached, or a batch in flight writes one of its documents.
    pub fn must_wait(&self, docs: &HashSet<u64>) -> bool {
        !self.queue.is_empty()
            && (self.queue.len() >= self.limit.now
                || self.queue.iter().any(|f| !f.docs.is_disjoint(docs)))
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
        let task = writer.spawn(ops, origins);
        self.queue.push_back(Flying {
            batch,
            docs,
            task,
            rest,
        });
        METRICS.bulks_in_flight.record(self.queue.len() as u64, &[]);
    }

    /// Waits for the oldest batch to land. Cancel-safe: a batch leaves the queue only once
    /// its task is done. Call only when not empty.
    pub async fn land(&mut self) -> anyhow::Result<Landed<T>> {
        let front = self.queue.front_mut().context("no batch in flight")?;
        let written = (&mut front.task).await.context("a bulk task panicked")??;
        let flying = self.queue.pop_front().context("no batch in flight")?;
        METRICS.bulks_in_flight.record(self.queue.len() as u64, &[]);
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
            f.task.abort();
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

    /// A writer that needs no server: the batches below write nothing.
    fn writer() -> Writer {
        let section: sluice_elastic::EsSection =
            serde_json::from_value(serde_json::json!({"url": "http://127.0.0.1:9"})).unwrap();
        let es = section.client().unwrap();
        let shutdown = tokio_util::sync::CancellationToken::new();
        Writer::new(&es, std::time::Duration::ZERO, &shutdown, Vec::new())
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

    #[tokio::test]
    async fn a_document_in_flight_and_the_limit_hold_a_batch_back_and_batches_land_in_order() {
        let mut flight: Flight<u32> = Flight::new(2);
        let first = flight.docs(&[delete("i", "a")]);
        launch(&mut flight, first, 1);
        assert!(
            flight.must_wait(&flight.docs(&[delete("i", "a")])),
            "a document of a batch in flight waits for it"
        );
        assert!(
            !flight.must_wait(&flight.docs(&[delete("j", "a"), delete("i", "b")])),
            "other documents go at once, below the limit"
        );
        let second = flight.docs(&[delete("i", "b")]);
        launch(&mut flight, second, 2);
        assert!(
            flight.must_wait(&flight.docs(&[delete("i", "c")])),
            "the limit holds the next batch back"
        );
        assert_eq!(
            flight.land().await.unwrap().rest,
            1,
            "the oldest lands first"
        );
        assert_eq!(flight.land().await.unwrap().rest, 2);
        assert!(flight.is_empty());
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
