//! The Elasticsearch ceiling the benchmarks compare against: documents `_bulk`-indexed
//! straight into a scratch index of the same server, with the etl's default batch size
//! and as many requests in flight as the etl's default allows.

use std::time::{Duration, Instant};

use anyhow::bail;
use futures::stream::FuturesUnordered;
use futures::{StreamExt as _, TryStreamExt as _};
use sluice_elastic::{BulkOp, EsClient, ItemOutcome};
use tokio::sync::mpsc;

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
    bulk_ceiling_in_flight(es, index, ops, raw_concurrency()).await
}

/// [`bulk_ceiling`] with `in_flight` requests at once (1: a sequential client, each request
/// sent once the one before was answered).
pub async fn bulk_ceiling_in_flight(
    es: &EsClient,
    index: &str,
    ops: &[BulkOp],
    in_flight: usize,
) -> anyhow::Result<Duration> {
    let started = Instant::now();
    let busy = futures::stream::iter(ops.chunks(raw_batch()))
        .map(|chunk| async move {
            let sent = Instant::now();
            es.bulk(chunk)
                .await
                .map(|outcomes| (outcomes, sent.elapsed()))
        })
        .buffer_unordered(in_flight.max(1))
        .map_err(anyhow::Error::from)
        .try_fold(Duration::ZERO, |busy, (outcomes, took)| async move {
            all_applied(&outcomes).map(|()| busy + took)
        })
        .await?;
    let total = started.elapsed();
    let requests = ops.len().div_ceil(raw_batch()).max(1);
    println!(
        "    raw _bulk: {requests} requests, {in_flight} in flight, {:.2} s each on average",
        busy.as_secs_f64() / requests as f64
    );
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

/// Writes what `docs` brings as raw `_bulk` requests until it closes: whatever is queued
/// goes in the next request (up to [`raw_batch`]), with at most [`raw_concurrency`]
/// requests in flight, as the etl writes a stream.
pub async fn raw_writer(
    es: EsClient,
    mut docs: mpsc::UnboundedReceiver<BulkOp>,
) -> anyhow::Result<()> {
    let mut in_flight = FuturesUnordered::new();
    let mut queued: Vec<BulkOp> = Vec::new();
    let mut open = true;
    loop {
        tokio::select! {
            op = docs.recv(), if open => match op {
                Some(op) => queued.push(op),
                None => open = false,
            },
            Some(done) = in_flight.next(), if !in_flight.is_empty() => {
                let outcomes: Vec<ItemOutcome> = done?;
                all_applied(&outcomes)?;
            }
        }
        while let Ok(op) = docs.try_recv() {
            queued.push(op);
        }
        while !queued.is_empty() && in_flight.len() < raw_concurrency() {
            let batch: Vec<BulkOp> = queued.drain(..queued.len().min(raw_batch())).collect();
            let es = es.clone();
            in_flight.push(async move { es.bulk(&batch).await });
        }
        if !open && queued.is_empty() && in_flight.is_empty() {
            return Ok(());
        }
    }
}

/// The sink's own pace with nothing else on it: one writer sends `ops` in bulks of
/// `per_bulk`, one every `every` (or as soon as the last is answered, when that is
/// later), into `index`. Returns each bulk's answer time in ms, sorted, and the documents
/// a second kept up. No pipeline can make a change searchable faster than the sink
/// answers a bulk at the same rate.
pub async fn paced_bulks(
    es: &EsClient,
    ops: &[BulkOp],
    per_bulk: usize,
    every: Duration,
) -> anyhow::Result<(Vec<f64>, f64)> {
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut answered_ms = Vec::new();
    let started = Instant::now();
    for chunk in ops.chunks(per_bulk.max(1)) {
        tick.tick().await;
        let sent = Instant::now();
        all_applied(&es.bulk(chunk).await?)?;
        answered_ms.push(sent.elapsed().as_secs_f64() * 1000.0);
    }
    let kept = ops.len() as f64 / started.elapsed().as_secs_f64();
    answered_ms.sort_by(f64::total_cmp);
    Ok((answered_ms, kept))
}

/// Indexes `ops` in requests of [`raw_batch`], one at a time, untimed (a scratch index's
/// first contents); every item must be applied.
pub async fn bulk_all(es: &EsClient, ops: &[BulkOp]) -> anyhow::Result<()> {
    for chunk in ops.chunks(raw_batch()) {
        all_applied(&es.bulk(chunk).await?)?;
    }
    Ok(())
}

/// A raw client's items must all be applied (a fresh index, one version per document).
fn all_applied(outcomes: &[ItemOutcome]) -> anyhow::Result<()> {
    match outcomes.iter().find(|o| **o != ItemOutcome::Applied) {
        Some(bad) => bail!("raw _bulk: an item was not applied: {bad:?}"),
        None => Ok(()),
    }
}

/// Every document of `index` (an index or an alias), as `(id, source)`, read in pages of
/// 5,000 ordered by the numeric field `key` (a search answers at most 10,000 at once).
pub async fn documents(
    es: &EsClient,
    index: &str,
    key: &str,
) -> anyhow::Result<Vec<(String, serde_json::Value)>> {
    let mut out = Vec::new();
    let mut after: Option<serde_json::Value> = None;
    loop {
        let mut body =
            serde_json::json!({"size": 5000, "sort": [{key: "asc"}], "query": {"match_all": {}}});
        if let Some(after) = &after {
            body["search_after"] = serde_json::json!([after]);
        }
        let found = es.search(index, &body).await?;
        let hits = found["hits"]["hits"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        let Some(last) = hits.last() else {
            return Ok(out);
        };
        after = Some(last["sort"][0].clone());
        for h in hits {
            let id = h["_id"].as_str().unwrap_or_default().to_owned();
            out.push((id, h["_source"].clone()));
        }
    }
}

/// Creates `scratch`, empty, with the mapping and shards of `like` (an index), no replicas
/// and no refreshes: as a build fills a new version.
pub async fn scratch_like(es: &EsClient, like: &str, scratch: &str) -> anyhow::Result<()> {
    let mappings = es.get_mapping(like).await?;
    let settings = es.get_settings(like).await?;
    let (Some(mapping), Some(index_settings)) = (
        mappings.as_object().and_then(|m| m.values().next()),
        settings.as_object().and_then(|m| m.values().next()),
    ) else {
        bail!("{like} has no index to take the shape of");
    };
    let shards = &index_settings["settings"]["index"]["number_of_shards"];
    es.create_index(
        scratch,
        &serde_json::json!({
            "settings": {"number_of_shards": shards, "number_of_replicas": 0, "refresh_interval": "-1"},
            "mappings": mapping["mappings"],
        }),
    )
    .await?;
    Ok(())
}
