//! The worker's metrics (names as Prometheus shows them):
//! `sluice_worker_events_total{source,database,table,op}`,
//! `sluice_worker_snapshot_rows_total{pipeline}`, `sluice_worker_publish_latency_seconds`
//! (binlog read to Kafka acknowledgement, per transaction), and read from the tasks' progress at
//! each scrape: `sluice_worker_binlog_lag_seconds{source}`,
//! `sluice_worker_binlog_lag_bytes{source}`, `sluice_worker_tasks{state}`.

use std::collections::HashMap;
use std::sync::{Arc, LazyLock};

use opentelemetry::metrics::{Counter, Histogram, Meter};
use opentelemetry::KeyValue;
use sluice_model::TaskState;

use crate::report::Reports;

pub(crate) struct Metrics {
    pub events: Counter<u64>,
    pub snapshot_rows: Counter<u64>,
    pub publish_latency: Histogram<f64>,
}

fn meter() -> Meter {
    opentelemetry::global::meter("sluice")
}

/// Made on first use, which must come after the service's telemetry is installed.
pub(crate) static METRICS: LazyLock<Metrics> = LazyLock::new(|| {
    let m = meter();
    Metrics {
        events: m
            .u64_counter("sluice.worker.events")
            .with_description("Row changes published to Kafka (acknowledged or not)")
            .build(),
        snapshot_rows: m
            .u64_counter("sluice.worker.snapshot.rows")
            .with_description("Rows read by build snapshots and published")
            .build(),
        publish_latency: m
            .f64_histogram("sluice.worker.publish.latency")
            .with_unit("s")
            .with_description("Per transaction, from reading its first row event in the binlog to Kafka acknowledging its last (the first stage of commit to searchable)")
            .with_boundaries(sluice_runtime::telemetry::LATENCY_BUCKETS.to_vec())
            .build(),
    }
});

/// `sluice_worker_events_total`, with its labels made once per table. Row events are
/// added up here per table and operation and handed to the counter at each commit (or
/// every [`FLUSH_EVERY`] events), not once per row: the counter's attribute lookup cost
/// as much as encoding the row.
#[derive(Default)]
pub(crate) struct EventLabels {
    labels: HashMap<String, HashMap<String, [[KeyValue; 4]; 4]>>,
    /// Counts not yet added: (db, table, op) → events.
    pending: Vec<((String, String), usize, u64)>,
    unflushed: u64,
}

/// Events counted between two hand-overs to the counter, at most.
const FLUSH_EVERY: u64 = 4096;

impl EventLabels {
    pub fn count(&mut self, source: &str, rc: &sluice_mysql::RowChange) {
        let (db, table) = (&rc.schema.db, &rc.schema.table);
        let op = match rc.op {
            sluice_model::Op::Create => 0,
            sluice_model::Op::Update => 1,
            sluice_model::Op::Delete => 2,
            sluice_model::Op::Read => 3,
        };
        self.unflushed += 1;
        if self.unflushed >= FLUSH_EVERY {
            self.flush();
        }
        // Most rows are of a table and operation the transaction already had.
        if let Some((_, _, n)) = self
            .pending
            .iter_mut()
            .find(|((d, t), o, _)| *o == op && d == db && t == table)
        {
            *n += 1;
            return;
        }
        if !self.labels.get(db).is_some_and(|t| t.contains_key(table)) {
            let labels = ["insert", "update", "delete", "snapshot"].map(|op| {
                [
                    KeyValue::new("source", source.to_owned()),
                    KeyValue::new("database", db.clone()),
                    KeyValue::new("table", table.clone()),
                    KeyValue::new("op", op),
                ]
            });
            self.labels
                .entry(db.clone())
                .or_default()
                .insert(table.clone(), labels);
        }
        self.pending.push(((db.clone(), table.clone()), op, 1));
    }

    /// Hands the counts so far to the counter.
    pub fn flush(&mut self) {
        for ((db, table), op, n) in self.pending.drain(..) {
            METRICS.events.add(n, &self.labels[&db][&table][op]);
        }
        self.unflushed = 0;
    }
}

/// Registers the gauges read from the tasks' progress.
pub(crate) fn observe(reports: Arc<Reports>) {
    let m = meter();
    let r = reports.clone();
    m.f64_observable_gauge("sluice.worker.binlog.lag")
        .with_unit("s")
        .with_description("Now minus the commit time of the last transaction read, per source")
        .with_callback(move |o| {
            for (source, p) in r.all() {
                o.observe(p.lag_seconds(), &[KeyValue::new("source", source)]);
            }
        })
        .build();
    let r = reports.clone();
    m.u64_observable_gauge("sluice.worker.binlog.lag")
        .with_unit("By")
        .with_description(
            "Binlog bytes the server has written past the last confirmed position, per source",
        )
        .with_callback(move |o| {
            for (source, p) in r.all() {
                if let Some(bytes) = p.lag_bytes() {
                    o.observe(bytes, &[KeyValue::new("source", source)]);
                }
            }
        })
        .build();
    m.u64_observable_gauge("sluice.worker.tasks")
        .with_description("Binlog tasks on this worker, by state")
        .with_callback(move |o| {
            let all = reports.all();
            for state in TaskState::ALL {
                let n = all.iter().filter(|(_, p)| p.task_state() == state).count();
                o.observe(n as u64, &[KeyValue::new("state", state.as_str())]);
            }
        })
        .build();
}
