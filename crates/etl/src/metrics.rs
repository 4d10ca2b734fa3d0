//! The etl's metrics (names as Prometheus shows them): `sluice_etl_events_total`,
//! `sluice_etl_documents_total{result}` (written, stale, superseded), `sluice_etl_bulk_duration_seconds`
//! and `sluice_etl_bulk_documents` (histograms per bulk request),
//! `sluice_etl_bulk_errors_total{class}` (throttled: items or requests answered 429,
//! retry: 5xx items, rejected: items refused for good, request: whole requests failed), `sluice_etl_dead_letters_total{pipeline}`,
//! `sluice_etl_delayed_changes_total{pipeline}` (changes of `delayed` relations handed to
//! the center instead of rebuilding documents),
//! `sluice_etl_documents_read_total{pipeline}`, `sluice_etl_source_queries_total{pipeline}`
//! and `sluice_etl_source_rows_total{pipeline}` (documents read back from MySQL, the
//! queries that found and read them, and the rows those returned), and
//! `sluice_etl_consumer_lag_messages{topic,partition}`, `sluice_etl_bulks_in_flight` and
//! `sluice_etl_bulk_concurrency` (batches being written at once, and how many may be),
//! `sluice_etl_batches_waiting` (batches written and waiting for an older one to land),
//! `sluice_etl_applied_lag_seconds{pipeline}` (how old the source position known to be
//! applied is: what an application reading its own write may wait). The stages of commit to searchable
//! after the worker's: `sluice_etl_consume_latency_seconds` (Kafka's timestamp of a
//! batch's first message to its consumption) and `sluice_etl_index_latency_seconds`
//! (a batch's first message consumed to Elasticsearch acknowledging all of it).

use std::sync::LazyLock;

use opentelemetry::metrics::{Counter, Gauge, Histogram};
use opentelemetry::KeyValue;

pub(crate) struct Metrics {
    pub events: Counter<u64>,
    pub documents: Counter<u64>,
    pub bulk_duration: Histogram<f64>,
    pub consume_latency: Histogram<f64>,
    pub index_latency: Histogram<f64>,
    pub bulk_documents: Histogram<u64>,
    pub bulk_errors: Counter<u64>,
    pub bulks_in_flight: Gauge<u64>,
    pub bulk_concurrency: Gauge<u64>,
    pub batches_waiting: Gauge<u64>,
    pub dead_letters: Counter<u64>,
    pub documents_read: Counter<u64>,
    pub source_queries: Counter<u64>,
    pub source_rows: Counter<u64>,
    pub delayed_changes: Counter<u64>,
    pub applied_lag: Gauge<f64>,
}

/// How old the position published as applied for `pipeline` is (`ms`).
pub(crate) fn applied_lag(pipeline: &str, ms: i64) {
    METRICS.applied_lag.record(
        ms.max(0) as f64 / 1000.0,
        &[KeyValue::new("pipeline", pipeline.to_owned())],
    );
}

/// Made on first use, which must come after the service's telemetry is installed.
pub(crate) static METRICS: LazyLock<Metrics> = LazyLock::new(|| {
    let m = opentelemetry::global::meter("sluice");
    m.i64_observable_gauge("sluice.etl.consumer.lag.messages")
        .with_description("Messages behind the end of each consumed partition")
        .with_callback(|o| {
            for (topic, partition, lag) in sluice_kafka::consumer_lag() {
                o.observe(
                    lag,
                    &[
                        KeyValue::new("topic", topic),
                        KeyValue::new("partition", i64::from(partition)),
                    ],
                );
            }
        })
        .build();
    Metrics {
        events: m
            .u64_counter("sluice.etl.events")
            .with_description("Change events consumed")
            .build(),
        documents: m
            .u64_counter("sluice.etl.documents")
            .with_description("Bulk items by result: written, stale (this version was there: a replay) or superseded (a newer version was there)")
            .build(),
        bulk_duration: m
            .f64_histogram("sluice.etl.bulk.duration")
            .with_unit("s")
            .with_description("Time per bulk request")
            .with_boundaries(vec![
                0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
            ])
            .build(),
        consume_latency: m
            .f64_histogram("sluice.etl.consume.latency")
            .with_unit("s")
            .with_description("Per batch, from Kafka's timestamp of its first message (the worker published it) to its consumption")
            .with_boundaries(sluice_runtime::telemetry::LATENCY_BUCKETS.to_vec())
            .build(),
        index_latency: m
            .f64_histogram("sluice.etl.index.latency")
            .with_unit("s")
            .with_description("Per batch, from consuming its first message to Elasticsearch acknowledging all of it")
            .with_boundaries(sluice_runtime::telemetry::LATENCY_BUCKETS.to_vec())
            .build(),
        bulk_documents: m
            .u64_histogram("sluice.etl.bulk.documents")
            .with_description("Operations per bulk request")
            .with_boundaries(vec![
                1.0, 10.0, 50.0, 100.0, 250.0, 500.0, 1000.0, 2000.0, 5000.0,
            ])
            .build(),
        bulk_errors: m
            .u64_counter("sluice.etl.bulk.errors")
            .with_description("Bulk retries and failures by class: throttled (429 items or requests, retried), retry (5xx items), rejected (items refused for good), request (whole requests failed)")
            .build(),
        bulks_in_flight: m
            .u64_gauge("sluice.etl.bulks.in_flight")
            .with_description("Batches being written to Elasticsearch at once")
            .build(),
        bulk_concurrency: m
            .u64_gauge("sluice.etl.bulk.concurrency")
            .with_description("How many batches may be in flight: etl.max_in_flight, halved while Elasticsearch throttles (429)")
            .build(),
        batches_waiting: m
            .u64_gauge("sluice.etl.batches.waiting")
            .with_description("Batches written and waiting for an older batch to land, as offsets commit in consumption order; with those being written, at most twice etl.max_in_flight")
            .build(),
        dead_letters: m
            .u64_counter("sluice.etl.dead_letters")
            .with_description("Events sent to the dead-letter topic, by pipeline")
            .build(),
        documents_read: m
            .u64_counter("sluice.etl.documents.read")
            .with_description("Documents read back from MySQL (pipelines with relations or a filter), by pipeline")
            .build(),
        source_queries: m
            .u64_counter("sluice.etl.source.queries")
            .with_description("Queries run on sources to find and read documents, by pipeline")
            .build(),
        source_rows: m
            .u64_counter("sluice.etl.source.rows")
            .with_description("Rows the queries on sources returned, by pipeline")
            .build(),
        delayed_changes: m
            .u64_counter("sluice.etl.delayed.changes")
            .with_description("Changes of delayed relations handed to the center for the delayed job, by pipeline")
            .build(),
        applied_lag: m
            .f64_gauge("sluice.etl.applied.lag")
            .with_unit("s")
            .with_description("How old the source position known to be applied is, by pipeline")
            .build(),
    }
});

pub(crate) fn class(class: &'static str) -> [KeyValue; 1] {
    [KeyValue::new("class", class)]
}

pub(crate) fn pipeline(name: &str) -> [KeyValue; 1] {
    [KeyValue::new("pipeline", name.to_owned())]
}

/// Exports every counter at zero for the known label values, so rates and alerts see a
/// series from the start rather than from the first occurrence.
pub(crate) fn zero<'a>(pipelines: impl IntoIterator<Item = &'a str>) {
    let m = &*METRICS;
    m.events.add(0, &[]);
    for result in ["written", "stale", "superseded"] {
        m.documents.add(0, &[KeyValue::new("result", result)]);
    }
    for c in ["retry", "rejected", "request"] {
        m.bulk_errors.add(0, &class(c));
    }
    for p in pipelines {
        m.dead_letters.add(0, &pipeline(p));
        m.documents_read.add(0, &pipeline(p));
        m.source_queries.add(0, &pipeline(p));
    }
}
