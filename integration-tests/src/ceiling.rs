//! The Elasticsearch ceiling the benchmarks compare against: documents `_bulk`-indexed
//! straight into a scratch index of the same server, with the etl's default batch size
//! and as many requests in flight as the etl's default allows.

use std::time::{Duration, Instant};

use anyhow::bail;
use futures::{StreamExt as _, TryStreamExt as _};
use sluice_elastic::{BulkOp, EsClient, ItemOutcome};

/// Documents per request: the etl's `max_batch_docs`.
pub fn raw_batch() -> usize {
    sluice_etl::config::EtlSection::default().max_batch_docs
}

/// Requests in flight at once: the etl's `max_in_flight`.
pub fn raw_concurrency() -> usize {
    sluice_etl::config::EtlSection::default().max_in_flight
}

/// How the ceiling was written, for the benchmarks' lines.
pub fn describe() -> String {
    format!("{}/request, {} in flight", raw_batch(), raw_concurrency())
}

/// Indexes `ops` (all into `index`, which must exist) and returns how long it took;
/// checks every item was applied and the index holds them all, then deletes it.
pub async fn bulk_ceiling(es: &EsClient, index: &str, ops: &[BulkOp]) -> anyhow::Result<Duration> {
    let started = Instant::now();
    futures::stream::iter(ops.chunks(raw_batch()))
        .map(|chunk| es.bulk(chunk))
        .buffer_unordered(raw_concurrency())
        .map_err(anyhow::Error::from)
        .try_for_each(|outcomes| async move {
            match outcomes.iter().find(|o| **o != ItemOutcome::Applied) {
                Some(bad) => bail!("raw _bulk: an item was not applied: {bad:?}"),
                None => Ok(()),
            }
        })
        .await?;
    let total = started.elapsed();
    es.refresh(index).await?;
    let count = es.count(index).await?;
    if count != ops.len() as u64 {
        bail!(
            "raw _bulk: the scratch index holds {count} of {} documents",
            ops.len()
        );
    }
    es.delete_index(index).await?;
    Ok(total)
}
