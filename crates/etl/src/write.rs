//! Bulk writes: every operation written, found stale (409: a newer version is there), or
//! rejected (dead-lettered with the server's reason); 429/5xx items and failed requests
//! retried with backoff. A 429 (the server asking for less) is counted as throttling,
//! apart from failures.

use std::sync::Arc;
use std::time::Duration;

use opentelemetry::KeyValue;
use sluice_elastic::{BulkOp, EsClient, ItemOutcome};
use sluice_model::RetryPolicy;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::batch::DeadLetter;
use crate::error::{Context as _, Result};
use crate::metrics::{self, METRICS};

/// What a writer's items came to.
#[derive(Default)]
pub(crate) struct Tally {
    pub written: u64,
    pub stale: u64,
    pub retried: u64,
    /// Elasticsearch answered 429 to a request or an item.
    pub throttled: bool,
}

/// When a superseded write was last logged: at most one line a minute, however many
/// writers there are.
static SUPERSEDED_WARNED: std::sync::Mutex<Option<Instant>> = std::sync::Mutex::new(None);

/// The messages an operation comes from: dead-lettered if the server rejects it.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Origin {
    One(usize),
    /// A document read back for several changes.
    Many(Arc<[usize]>),
}

impl Origin {
    pub fn many<'a>(msgs: impl IntoIterator<Item = &'a usize>) -> Origin {
        Origin::Many(msgs.into_iter().copied().collect())
    }

    fn messages(&self) -> &[usize] {
        match self {
            Origin::One(m) => std::slice::from_ref(m),
            Origin::Many(ms) => ms,
        }
    }
}

/// What a batch's writes came to.
pub(crate) struct Written {
    /// `false`: shutdown interrupted the retries; nothing from here on may be committed.
    pub complete: bool,
    pub dead: Vec<DeadLetter>,
    pub tally: Tally,
    /// Patches of parts that found no document: `(index, id)`, to be written whole.
    pub missing: Vec<(String, String)>,
}

/// Writes a batch's operations, collecting what must be dead-lettered. Owns its handles,
/// so that it can write in a task of its own.
pub(crate) struct Writer {
    es: EsClient,
    retry: RetryPolicy,
    shutdown: CancellationToken,
    tally: Tally,
    /// Messages to dead-letter once the batch is through, with why.
    pub dead: Vec<DeadLetter>,
    /// Patches of parts that found no document (see [`Written::missing`]).
    missing: Vec<(String, String)>,
}

impl Writer {
    /// A writer starting with the batch's messages already found unmappable (`dead`).
    pub fn new(
        es: &EsClient,
        retry: RetryPolicy,
        shutdown: &CancellationToken,
        dead: Vec<DeadLetter>,
    ) -> Self {
        Writer {
            es: es.clone(),
            retry,
            shutdown: shutdown.clone(),
            tally: Tally::default(),
            dead,
            missing: Vec::new(),
        }
    }

    /// A writer of its own for a task beside this one: what it came to joins this one's
    /// with [`Writer::absorb`].
    pub fn fork(&self) -> Writer {
        Writer::new(&self.es, self.retry, &self.shutdown, Vec::new())
    }

    /// Counts a forked writer's outcome as this one's.
    pub fn absorb(&mut self, other: Written) {
        self.dead.extend(other.dead);
        self.missing.extend(other.missing);
        let t = other.tally;
        self.tally.written += t.written;
        self.tally.stale += t.stale;
        self.tally.retried += t.retried;
        self.tally.throttled |= t.throttled;
    }

    /// Writes `ops` (each from the messages `origins[i]`) in a task of its own: what
    /// they came to, once done.
    pub fn spawn(
        mut self,
        ops: Vec<BulkOp>,
        origins: Vec<Origin>,
    ) -> tokio::task::JoinHandle<Result<Written>> {
        tokio::spawn(async move {
            let complete = self.write(ops, origins).await?;
            Ok(self.finish(complete))
        })
    }

    /// Writes `now`, then, once the writes of every batch in `after` are over, `later`
    /// (documents those batches were writing), in a task of its own; `over` is dropped
    /// when it ends, which tells the batches that wait for this one.
    pub fn spawn_after(
        mut self,
        now: (Vec<BulkOp>, Vec<Origin>),
        later: (Vec<BulkOp>, Vec<Origin>),
        after: Vec<CancellationToken>,
        over: tokio_util::sync::DropGuard,
    ) -> tokio::task::JoinHandle<Result<Written>> {
        tokio::spawn(async move {
            let _over = over;
            let mut complete = self.write(now.0, now.1).await?;
            if complete && !later.0.is_empty() {
                for earlier in &after {
                    tokio::select! {
                        _ = earlier.cancelled() => {}
                        _ = self.shutdown.cancelled() => return Ok(self.finish(false)),
                    }
                }
                complete = self.write(later.0, later.1).await?;
            }
            Ok(self.finish(complete))
        })
    }

    /// What the writes came to; `complete` as the last [`Writer::write`] said.
    pub fn finish(self, complete: bool) -> Written {
        Written {
            complete,
            dead: self.dead,
            tally: self.tally,
            missing: self.missing,
        }
    }

    /// Sends `ops` (each from the messages `origins[i]`), retrying 429/5xx items and
    /// failed requests with backoff until every item is written, stale or rejected
    /// (rejections join `dead`). `false` when shutdown interrupted the retries.
    #[tracing::instrument(name = "etl.bulk", skip_all, fields(operations = ops.len()))]
    pub async fn write(&mut self, mut ops: Vec<BulkOp>, mut origins: Vec<Origin>) -> Result<bool> {
        let mut backoff = self.retry.backoff();
        while !ops.is_empty() {
            let sent = ops.len();
            let started = Instant::now();
            let answer = self.es.bulk(&ops).await;
            METRICS
                .bulk_duration
                .record(started.elapsed().as_secs_f64(), &[]);
            METRICS.bulk_documents.record(ops.len() as u64, &[]);
            let mut failed = None;
            match answer {
                Ok(outcomes) => {
                    let (mut retry_ops, mut retry_origins) = (Vec::new(), Vec::new());
                    for ((op, origin), outcome) in ops.into_iter().zip(origins).zip(outcomes) {
                        if let Some(op) = self.settle(op, &origin, outcome) {
                            retry_ops.push(op);
                            retry_origins.push(origin);
                        }
                    }
                    (ops, origins) = (retry_ops, retry_origins);
                }
                Err(e) if e.is_transient() => {
                    let class = self.retried(e.status(), "request");
                    METRICS.bulk_errors.add(1, &metrics::class(class));
                    failed = Some(e);
                }
                Err(e) => {
                    METRICS.bulk_errors.add(1, &metrics::class("request"));
                    return Err(e)
                        .context("bulk request refused (fix the cause; nothing was committed)");
                }
            }
            if !ops.is_empty() {
                self.tally.retried += ops.len() as u64;
                // A bulk the server took part of is getting through at the pace the server
                // sets (the flight's concurrency backs off on 429 apart from this):
                // doubling on each partial answer would leave the last items of a bulk
                // nearly through waiting the longest pause, and every batch behind it
                // uncommitted.
                let pause = if ops.len() < sent {
                    backoff.hold()
                } else {
                    backoff.next_pause()
                };
                if let Some(e) = failed {
                    tracing::warn!(error = %e, retry_in = ?pause, "bulk request failed; retrying");
                }
                if !sluice_runtime::shutdown::pause(pause, &self.shutdown).await {
                    return Ok(false);
                }
            }
        }
        Ok(true)
    }

    /// Counts an item's outcome; the operation back when it is to be retried.
    fn settle(&mut self, op: BulkOp, origin: &Origin, outcome: ItemOutcome) -> Option<BulkOp> {
        match outcome {
            ItemOutcome::Applied => {
                self.tally.written += 1;
                METRICS
                    .documents
                    .add(1, &[KeyValue::new("result", "written")]);
                None
            }
            ItemOutcome::Stale => {
                self.tally.stale += 1;
                METRICS
                    .documents
                    .add(1, &[KeyValue::new("result", "stale")]);
                None
            }
            ItemOutcome::Superseded => {
                self.tally.stale += 1;
                METRICS
                    .documents
                    .add(1, &[KeyValue::new("result", "superseded")]);
                let mut warned = SUPERSEDED_WARNED.lock().unwrap_or_else(|e| e.into_inner());
                if warned.is_none_or(|at| at.elapsed() >= Duration::from_secs(60)) {
                    *warned = Some(Instant::now());
                    let (index, id, version) = (op.index(), op.id(), op.version());
                    tracing::warn!(%index, %id, %version, "a change arrived older than the indexed document (refused): harmless during a replay; \
                        if it goes on for fresh changes, their versions went backwards, as when a source moved to another server \
                        without `sluicectl sources failover` (at most one such line a minute)");
                }
                None
            }
            ItemOutcome::Missing => {
                METRICS
                    .documents
                    .add(1, &[KeyValue::new("result", "missing")]);
                self.missing
                    .push((op.index().to_owned(), op.id().to_owned()));
                None
            }
            ItemOutcome::Retry { status, reason } => {
                let class = self.retried(Some(status), "retry");
                METRICS.bulk_errors.add(1, &metrics::class(class));
                tracing::debug!(status, %reason, "bulk item will be retried");
                Some(op)
            }
            ItemOutcome::Rejected { status, reason } => {
                METRICS.bulk_errors.add(1, &metrics::class("rejected"));
                for &msg in origin.messages() {
                    self.dead.push(DeadLetter {
                        msg,
                        reason: format!(
                            "Elasticsearch rejected the document (HTTP {status}): {reason}"
                        ),
                        pipeline: None,
                        index: Some(op.index().to_owned()),
                    });
                }
                None
            }
        }
    }

    /// The `bulk_errors` class of something retried: a 429 is the server asking for
    /// less, not a failure, and is counted apart as `throttled`; anything else is
    /// `otherwise`.
    fn retried(&mut self, status: Option<u16>, otherwise: &'static str) -> &'static str {
        if status == Some(429) {
            self.tally.throttled = true;
            "throttled"
        } else {
            otherwise
        }
    }
}

/// Bulks written beside the work that makes them (documents read back from MySQL): up to
/// `lanes` at once, each of up to `docs` operations and about `bytes` (or one pushed
/// chunk, when that is more), in tasks of their own. The caller keeps any one document in
/// a single bulk, or waits ([`Lanes::settle`]) before writing it again, so no two bulks in
/// flight hold the same document.
pub(crate) struct Lanes<'w> {
    writer: &'w mut Writer,
    docs: usize,
    bytes: usize,
    lanes: usize,
    queued: (Vec<BulkOp>, Vec<Origin>),
    /// About the bytes of `queued`.
    queued_bytes: usize,
    flying: std::collections::VecDeque<tokio::task::JoinHandle<Result<Written>>>,
    /// A bulk was interrupted by shutdown.
    interrupted: bool,
}

impl<'w> Lanes<'w> {
    pub fn new(writer: &'w mut Writer, docs: usize, bytes: usize, lanes: usize) -> Self {
        Lanes {
            writer,
            docs: docs.max(1),
            bytes,
            lanes: lanes.max(1),
            queued: (Vec::new(), Vec::new()),
            queued_bytes: 0,
            flying: Default::default(),
            interrupted: false,
        }
    }

    /// Queues operations; a full bulk goes out, after the oldest landed if every lane is
    /// busy. `false` once shutdown interrupted a bulk.
    pub async fn push(&mut self, ops: Vec<BulkOp>, origins: Vec<Origin>) -> Result<bool> {
        self.queued_bytes += ops.iter().map(BulkOp::approx_len).sum::<usize>();
        self.queued.0.extend(ops);
        self.queued.1.extend(origins);
        while self.queued.0.len() >= self.docs {
            let rest_ops = self.queued.0.split_off(self.docs);
            let rest_origins = self.queued.1.split_off(self.docs);
            let full = std::mem::replace(&mut self.queued, (rest_ops, rest_origins));
            self.queued_bytes = self.queued.0.iter().map(BulkOp::approx_len).sum();
            if !self.launch(full).await? {
                return Ok(false);
            }
        }
        if self.queued_bytes >= self.bytes {
            let full = std::mem::take(&mut self.queued);
            self.queued_bytes = 0;
            if !self.launch(full).await? {
                return Ok(false);
            }
        }
        Ok(!self.interrupted)
    }

    /// The patches of parts that found no document, among the bulks landed so far
    /// (all of them after [`Lanes::settle`]): each is to be written whole.
    pub fn take_missing(&mut self) -> Vec<(String, String)> {
        std::mem::take(&mut self.writer.missing)
    }

    /// Messages to dead-letter with the batch.
    pub fn dead_letter(&mut self, letters: Vec<DeadLetter>) {
        self.writer.dead.extend(letters);
    }

    /// Writes what is queued and waits for every bulk: `false` when shutdown
    /// interrupted one. Documents written before may be written again after.
    pub async fn settle(&mut self) -> Result<bool> {
        let (mut ops, mut origins) = std::mem::take(&mut self.queued);
        self.queued_bytes = 0;
        // What is left goes over the free lanes at once, so that the server writes it
        // on as many threads (a bulk's items of one shard are written one by one).
        let free = self.lanes.saturating_sub(self.flying.len()).max(1);
        let size = ops.len().div_ceil(pieces(ops.len(), free)).max(1);
        while !ops.is_empty() {
            let at = size.min(ops.len());
            let (later_ops, later_origins) = (ops.split_off(at), origins.split_off(at));
            let piece = (
                std::mem::replace(&mut ops, later_ops),
                std::mem::replace(&mut origins, later_origins),
            );
            if !self.launch(piece).await? {
                break;
            }
        }
        while let Some(task) = self.flying.pop_front() {
            self.land(task).await?;
        }
        Ok(!self.interrupted)
    }

    async fn launch(&mut self, (ops, origins): (Vec<BulkOp>, Vec<Origin>)) -> Result<bool> {
        while self.flying.len() >= self.lanes {
            let oldest = self.flying.pop_front().expect("lanes are busy");
            self.land(oldest).await?;
        }
        let task = self.writer.fork().spawn(ops, origins);
        self.flying.push_back(task);
        Ok(!self.interrupted)
    }

    async fn land(&mut self, task: tokio::task::JoinHandle<Result<Written>>) -> Result<()> {
        let written = task.await.context("a bulk task panicked")??;
        self.interrupted |= !written.complete;
        self.writer.absorb(written);
        Ok(())
    }
}

/// The fewest operations worth a bulk of their own when a batch's last ones are spread
/// over free lanes.
const LEAST_SPREAD: usize = 64;

/// Into how many bulks `n` operations left are cut with `free` lanes free: at most one
/// per lane, each of at least [`LEAST_SPREAD`] (one bulk at least).
fn pieces(n: usize, free: usize) -> usize {
    (n / LEAST_SPREAD).clamp(1, free.max(1))
}

impl Drop for Lanes<'_> {
    /// Bulks never waited for belong to a batch that is not committed.
    fn drop(&mut self) {
        for task in &self.flying {
            task.abort();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_is_left_is_spread_over_free_lanes_in_bulks_worth_sending() {
        assert_eq!(pieces(0, 4), 1);
        assert_eq!(pieces(10, 4), 1, "too few to spread");
        assert_eq!(pieces(100, 4), 1, "two would be under 64 each");
        assert_eq!(pieces(130, 4), 2);
        assert_eq!(pieces(500, 4), 4);
        assert_eq!(pieces(500, 0), 1, "every lane busy: one, after the oldest");
    }
}
