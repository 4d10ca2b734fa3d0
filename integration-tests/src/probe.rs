//! Commit-to-searchable latency, as the benches measure it: changes handed to a [`Probe`]
//! are polled by their document's id (a real-time GET, before any refresh) until the
//! document is there — or shows what the change wrote — and the time since it was handed
//! over is kept.
//!
//! The probe must not be what it measures: polling every change every few milliseconds
//! made its own GETs the sink's largest load once changes took seconds (thousands of ids
//! per `_mget`, each read from the translog). So it watches a sample, at most
//! [`WATCHED_PER_S`] changes a second evenly in time (every change at lower rates), and
//! polls each at an interval that grows with its age ([`poll_interval`]): a change seen
//! after `t` is timed to within a tenth of `t`, or 5 ms.

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::Value;
use tokio::sync::mpsc;

/// What a watched document must show to count as seen (beyond being there).
pub type Check = Arc<dyn Fn(&Value) -> bool + Send + Sync>;

/// A change watched: its document's id, when it was handed over, and what it must show.
type Watched = (String, Instant, Option<Check>);

/// At most this many changes a second are watched (see the module's text).
pub const WATCHED_PER_S: f64 = 200.0;

/// How long after a poll that did not see it a change `age` old is polled again.
pub fn poll_interval(age: Duration) -> Duration {
    (age / 10).max(Duration::from_millis(5))
}

/// Latencies, in ms and sorted, with how many were never seen, how many changes were
/// handed over (of which those timed were watched), and the rate they were handed over at.
pub struct Latency {
    pub sorted_ms: Vec<f64>,
    pub lost: usize,
    pub handed: usize,
    pub sent_rate: f64,
}

impl Latency {
    /// A sink's bulks' answer times (sorted, in ms), kept at `rate` documents a second.
    pub fn of_bulks(sorted_ms: Vec<f64>, rate: f64) -> Latency {
        Latency {
            handed: sorted_ms.len(),
            sorted_ms,
            lost: 0,
            sent_rate: rate,
        }
    }

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

    /// `p50 …, p99 …, max … (N of M changes watched, at R/s[, L lost])`.
    pub fn describe(&self) -> String {
        format!(
            "{} ({} of {} changes watched, at {:.1}/s{})",
            self.spread(),
            self.sorted_ms.len() + self.lost,
            self.handed,
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
    poller: tokio::task::JoinHandle<anyhow::Result<Polled>>,
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
        let polled = self.poller.await??;
        Ok(Latency {
            sorted_ms: polled.seen_ms,
            lost: polled.lost,
            handed: polled.handed,
            sent_rate,
        })
    }
}

/// What a [`Probe`]'s poller came to: the latencies seen (sorted), the watched changes
/// never seen, and every change handed over.
struct Polled {
    seen_ms: Vec<f64>,
    lost: usize,
    handed: usize,
}

/// A change being watched, and when to poll it next.
struct Pending {
    id: String,
    since: Instant,
    check: Option<Check>,
    next: Instant,
}

/// A [`Probe`]'s poller, until every sender is dropped and every watched id is seen or
/// given up on.
async fn poll(
    es: sluice_elastic::EsClient,
    alias: String,
    mut rx: mpsc::UnboundedReceiver<Watched>,
) -> anyhow::Result<Polled> {
    let give_up = Duration::from_secs(30);
    let mut sampler = Sampler::default();
    let mut pending: Vec<Pending> = Vec::new();
    let mut polled = Polled {
        seen_ms: Vec::new(),
        lost: 0,
        handed: 0,
    };
    let mut open = true;
    loop {
        if pending.is_empty() {
            if !open {
                break;
            }
            match rx.recv().await {
                Some(w) => sampler.take(w, &mut pending, &mut polled),
                None => break,
            }
        }
        while let Ok(w) = rx.try_recv() {
            sampler.take(w, &mut pending, &mut polled);
        }
        if rx.is_closed() && rx.is_empty() {
            open = false;
        }
        let now = Instant::now();
        let due: Vec<usize> = (0..pending.len())
            .filter(|&i| pending[i].next <= now)
            .collect();
        if due.is_empty() {
            let next = pending.iter().map(|p| p.next).min().unwrap_or(now);
            // Until the next is due, or a new change comes (it is due 5 ms after it).
            tokio::time::sleep_until(next.min(now + Duration::from_millis(5)).into()).await;
            continue;
        }
        let ids: Vec<String> = due.iter().map(|&i| pending[i].id.clone()).collect();
        let found = es.mget(&alias, &ids).await?;
        let now = Instant::now();
        let mut done = vec![false; pending.len()];
        for (&i, doc) in due.iter().zip(&found) {
            let p = &mut pending[i];
            let age = now - p.since;
            if doc
                .as_ref()
                .is_some_and(|d| p.check.as_ref().is_none_or(|c| c(d)))
            {
                polled.seen_ms.push(age.as_secs_f64() * 1000.0);
                done[i] = true;
            } else if age > give_up {
                polled.lost += 1;
                done[i] = true;
            } else {
                p.next = now + poll_interval(age);
            }
        }
        let mut i = 0;
        pending.retain(|_| {
            i += 1;
            !done[i - 1]
        });
    }
    polled.seen_ms.sort_by(f64::total_cmp);
    anyhow::Ok(polled)
}

/// Which changes handed over are watched: at most [`WATCHED_PER_S`] a second, by the
/// time they were handed over at.
#[derive(Default)]
struct Sampler {
    last: Option<Instant>,
}

impl Sampler {
    fn take(
        &mut self,
        (id, since, check): Watched,
        pending: &mut Vec<Pending>,
        polled: &mut Polled,
    ) {
        polled.handed += 1;
        let every = Duration::from_secs_f64(1.0 / WATCHED_PER_S);
        if self.last.is_some_and(|last| since < last + every) {
            return;
        }
        self.last = Some(since);
        pending.push(Pending {
            id,
            since,
            check,
            next: since + poll_interval(Duration::ZERO),
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_change_is_polled_within_a_tenth_of_its_age_or_5_ms() {
        assert_eq!(poll_interval(Duration::ZERO), Duration::from_millis(5));
        assert_eq!(
            poll_interval(Duration::from_millis(40)),
            Duration::from_millis(5)
        );
        assert_eq!(
            poll_interval(Duration::from_secs(2)),
            Duration::from_millis(200)
        );
    }

    #[test]
    fn at_most_the_watched_rate_is_watched_evenly_in_time() {
        let (mut sampler, mut pending) = (Sampler::default(), Vec::new());
        let mut polled = Polled {
            seen_ms: Vec::new(),
            lost: 0,
            handed: 0,
        };
        let start = Instant::now();
        // 1,000 changes a second for one second: 200 of them watched, one every 5 ms.
        for n in 0..1000u64 {
            let since = start + Duration::from_millis(n);
            sampler.take((n.to_string(), since, None), &mut pending, &mut polled);
        }
        assert_eq!(polled.handed, 1000);
        assert_eq!(pending.len(), 200);
        assert!(pending
            .iter()
            .all(|p| p.id.parse::<u64>().unwrap() % 5 == 0));
        // At a rate below it, every change.
        let (mut sampler, mut pending) = (Sampler::default(), Vec::new());
        for n in 0..100u64 {
            let since = start + Duration::from_millis(10 * n);
            sampler.take((n.to_string(), since, None), &mut pending, &mut polled);
        }
        assert_eq!(pending.len(), 100);
    }
}
