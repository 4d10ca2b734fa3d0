//! The stages of commit → searchable, from the services' own histograms: what a bench
//! prints beside a latency it measured end to end, to say where the time went.

use std::collections::BTreeMap;

use crate::process::{buckets_between, Service};

/// One scrape of every service's metrics, merged (their names do not overlap).
pub async fn scrape<'a>(services: impl IntoIterator<Item = &'a Service>) -> BTreeMap<String, f64> {
    let mut all = BTreeMap::new();
    for s in services {
        all.extend(s.metrics().await.unwrap_or_default());
    }
    all
}

/// Each stage's p50 and p99 between two [`scrape`]s, as the bucket bounds they fall within:
/// read → published (the worker), published → consumed and consumed → indexed (the etl),
/// and the etl's `_bulk` requests.
pub fn describe(before: &BTreeMap<String, f64>, after: &BTreeMap<String, f64>) -> String {
    const STAGES: [(&str, &str); 4] = [
        ("read→published", "sluice_worker_publish_latency_seconds"),
        ("published→consumed", "sluice_etl_consume_latency_seconds"),
        ("consumed→indexed", "sluice_etl_index_latency_seconds"),
        (
            "of which each _bulk request",
            "sluice_etl_bulk_duration_seconds",
        ),
    ];
    let stage = |name: &str| {
        let buckets = buckets_between(before, after, name);
        let total = buckets.last().map_or(0.0, |b| b.1);
        let at = |q: f64| {
            buckets
                .iter()
                .find(|(_, n)| *n >= q * total)
                .map_or(f64::NAN, |(le, _)| le * 1000.0)
        };
        match total > 0.0 {
            true => format!(
                "p50 ≤ {:.0} ms, p99 ≤ {:.0} ms ({total:.0})",
                at(0.5),
                at(0.99)
            ),
            false => "no samples".into(),
        }
    };
    STAGES
        .iter()
        .map(|(what, name)| format!("{what} {}", stage(name)))
        .collect::<Vec<_>>()
        .join("; ")
}
