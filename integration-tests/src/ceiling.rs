//! The Elasticsearch ceiling the benchmarks compare against: documents `_bulk`-indexed
//! straight into a scratch index of the same server, 2000 per request, one at a time.

use std::time::{Duration, Instant};

use anyhow::bail;
use sluice_elastic::{BulkOp, EsClient, ItemOutcome};

pub const RAW_BATCH: usize = 2000;

/// Indexes `ops` (all into `index`, which must exist) and returns how long it took;
/// checks every item was applied and the index holds them all, then deletes it.
pub async fn bulk_ceiling(es: &EsClient, index: &str, ops: &[BulkOp]) -> anyhow::Result<Duration> {
    let started = Instant::now();
    for chunk in ops.chunks(RAW_BATCH) {
        let outcomes = es.bulk(chunk).await?;
        if let Some(bad) = outcomes.iter().find(|o| **o != ItemOutcome::Applied) {
            bail!("raw _bulk: an item was not applied: {bad:?}");
        }
    }
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
