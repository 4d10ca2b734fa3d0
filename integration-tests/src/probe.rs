//! Commit-to-searchable latency, as the benches measure it: each change handed to a
//! [`Probe`] is polled by its document's id (a real-time GET, before any refresh) until the
//! document is there — or shows what the change wrote — and the time since it was handed
//! over is kept.

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::Value;
use tokio::sync::mpsc;

/// What a watched document must show to count as seen (beyond being there).
pub type Check = Arc<dyn Fn(&Value) -> bool + Send + Sync>;

/// A change watched: its document's id, when it was handed over, and what it must show.
type Watched = (String, Instant, Option<Check>);

/// Latencies, in ms and sorted, with how many were never seen and the rate they were
/// handed over at.
pub struct Latency {
    pub sorted_ms: Vec<f64>,
    pub lost: usize,
    pub sent_rate: f64,
}

impl Latency {
    /// The `p`th percentile (nearest rank).
    pub fn pct(&self, p: f64) -> f64 {
        if self.sorted_ms.is_empty() {
            return f64::NAN;
        }
        let rank = ((p / 100.0) * self.sorted_ms.len() as f64).ceil() as usize;
        self.sorted_ms[rank.clamp(1, self.sorted_ms.len()) - 1]
    }

    /// `p50 …, p99 …, max …`.
    pub fn spread(&self) -> String {
        format!(
            "p50 {:.0} ms, p99 {:.0} ms, max {:.0} ms",
            self.pct(50.0),
            self.pct(99.0),
            self.sorted_ms.last().copied().unwrap_or(f64::NAN),
        )
    }

    /// For a sink's bulks: `p50 …, p99 …, max … (N bulks, R documents/s kept)`.
    pub fn describe_bulks(&self) -> String {
        format!(
            "{} ({} bulks, {:.0} documents/s kept)",
            self.spread(),
            self.sorted_ms.len(),
            self.sent_rate,
        )
    }

    /// `p50 …, p99 …, max … (N samples at R/s[, L lost])`.
    pub fn describe(&self) -> String {
        format!(
            "{} ({} samples at {:.1}/s{})",
            self.spread(),
            self.sorted_ms.len(),
            self.sent_rate,
            if self.lost > 0 {
                format!(", {} never became visible", self.lost)
            } else {
                String::new()
            }
        )
    }
}

/// Watches documents of one index (or alias) until each is seen.
pub struct Probe {
    tx: mpsc::UnboundedSender<Watched>,
    poller: tokio::task::JoinHandle<anyhow::Result<(Vec<f64>, usize)>>,
}

/// Hands changes to a [`Probe`] from another task.
#[derive(Clone)]
pub struct Watch(mpsc::UnboundedSender<Watched>);

impl Watch {
    /// Times document `id` from `since` until it is there.
    pub fn since(&self, id: String, since: Instant) {
        let _ = self.0.send((id, since, None));
    }

    /// Times document `id` from `since` until it passes `check`.
    pub fn until(&self, id: String, since: Instant, check: Check) {
        let _ = self.0.send((id, since, Some(check)));
    }
}

impl Probe {
    pub fn start(es: sluice_elastic::EsClient, alias: String) -> Probe {
        let (tx, rx) = mpsc::unbounded_channel();
        let poller = tokio::spawn(poll(es, alias, rx));
        Probe { tx, poller }
    }

    /// Times document `id` from now until it is there.
    pub fn watch(&self, id: String) {
        self.watcher().since(id, Instant::now());
    }

    /// A handle that watches from another task.
    pub fn watcher(&self) -> Watch {
        Watch(self.tx.clone())
    }

    /// Once every watched document is seen (or given up on): the latencies of the
    /// `samples` handed over since `started`.
    pub async fn finish(self, samples: usize, started: Instant) -> anyhow::Result<Latency> {
        let sent_rate = samples as f64 / started.elapsed().as_secs_f64();
        drop(self.tx);
        let (sorted_ms, lost) = self.poller.await??;
        Ok(Latency {
            sorted_ms,
            lost,
            sent_rate,
        })
    }
}

/// A [`Probe`]'s poller, until every sender is dropped and every id is seen or given up.
async fn poll(
    es: sluice_elastic::EsClient,
    alias: String,
    mut rx: mpsc::UnboundedReceiver<Watched>,
) -> anyhow::Result<(Vec<f64>, usize)> {
    let give_up = Duration::from_secs(30);
    let mut pending: Vec<Watched> = Vec::new();
    let mut seen_ms = Vec::new();
    let mut lost = 0usize;
    let mut open = true;
    loop {
        if pending.is_empty() {
            if !open {
                break;
            }
            match rx.recv().await {
                Some(p) => pending.push(p),
                None => break,
            }
        }
        while let Ok(p) = rx.try_recv() {
            pending.push(p);
        }
        if rx.is_closed() && rx.is_empty() {
            open = false;
        }
        let ids: Vec<String> = pending.iter().map(|(id, _, _)| id.clone()).collect();
        let found = es.mget(&alias, &ids).await?;
        let now = Instant::now();
        let mut i = 0;
        pending.retain(|(_, committed, check)| {
            let doc = found[i].as_ref();
            i += 1;
            let visible = doc.is_some_and(|d| check.as_ref().is_none_or(|c| c(d)));
            if visible {
                seen_ms.push((now - *committed).as_secs_f64() * 1000.0);
            } else if now - *committed > give_up {
                lost += 1;
                return false;
            }
            !visible
        });
        if !pending.is_empty() {
            tokio::time::sleep(Duration::from_millis(5)).await; // a poll pace
        }
    }
    seen_ms.sort_by(f64::total_cmp);
    anyhow::Ok((seen_ms, lost))
}
