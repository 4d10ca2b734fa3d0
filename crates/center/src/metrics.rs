//! The center's metrics (names as Prometheus shows them), kept by the leader's passes
//! and the workers' reports, read at each scrape:
//! `sluice_center_leader` (1 on the replica that leads), `sluice_center_epoch`,
//! `sluice_center_dependency_up{dependency}` (1 when `meta`, `zookeeper` or `kafka`
//! answered this replica's last probe, see [`crate::probe`]),
//! `sluice_center_workers_live`, `sluice_center_tasks{worker}`,
//! `sluice_center_source_lag_seconds{source}` (as the workers report it),
//! `sluice_center_pipelines{state}`, and per pipeline being built
//! `sluice_center_build_rows_done{pipeline}`, `sluice_center_build_rows_estimated{pipeline}`,
//! `sluice_center_build_chunks{pipeline}`, `sluice_center_build_chunks_done{pipeline}` and
//! `sluice_center_build_running{pipeline}` (1 while building, 0 once done or held) and
//! `sluice_center_build_held{pipeline}` (1 while held for verification);
//! `sluice_center_pipeline_needs_rebuild{pipeline}` (1: its documents need a build);
//! per pipeline, of its running or else last consistency check,
//! `sluice_center_check_drift{pipeline,kind}` (documents found `missing`, `extra` or
//! `different`), `sluice_center_check_keys{pipeline}`, `sluice_center_check_skipped`,
//! `sluice_center_check_chunks`, `sluice_center_check_chunks_done` and
//! `sluice_center_check_running` (1 while it runs); and
//! `sluice_center_events_total{kind}`, the events this replica recorded (leader changes,
//! assignments, builds, workers' task events, operators' changes);
//! `sluice_center_reconcile_seconds`, how long each of the leader's reconcile passes took;
//! and `sluice_center_zk_writes_total{op}` (`create`, `set`, `delete`) and
//! `sluice_center_zk_reads_total{op}` (`get`, `children`, `exists`), the ZooKeeper
//! requests this replica sent, answered or not (a follower's are its campaign's, its
//! API's and its session's heartbeat); `sluice_center_refused_calls_total{method,outcome}`,
//! the calls this replica refused (a wrong credential, a role short of the call), of
//! which the audit log keeps a sample (see `api::refusals`); and
//! `sluice_center_history_deleted_total{history}`, rows the leader deleted for being older
//! than their retention.

use std::collections::BTreeMap;
use std::sync::{LazyLock, Mutex};

use opentelemetry::metrics::Meter;
use opentelemetry::KeyValue;
use sluice_model::BuildPhase;
use sluice_proto::v1::BuildStatus;

pub(crate) static EVENTS: LazyLock<opentelemetry::metrics::Counter<u64>> = LazyLock::new(|| {
    opentelemetry::global::meter("sluice")
        .u64_counter("sluice.center.events")
        .with_description("Events recorded in the meta database, by kind")
        .build()
});

pub(crate) static REFUSED: LazyLock<opentelemetry::metrics::Counter<u64>> = LazyLock::new(|| {
    opentelemetry::global::meter("sluice")
        .u64_counter("sluice.center.refused_calls")
        .with_description("Calls refused, by method and outcome")
        .build()
});

pub(crate) static FORGOTTEN: LazyLock<opentelemetry::metrics::Counter<u64>> = LazyLock::new(|| {
    opentelemetry::global::meter("sluice")
        .u64_counter("sluice.center.history_deleted")
        .with_description("History rows deleted for being older than their retention")
        .build()
});

pub(crate) static TOMBSTONES: LazyLock<opentelemetry::metrics::Counter<u64>> = LazyLock::new(
    || {
        opentelemetry::global::meter("sluice")
        .u64_counter("sluice.center.tombstones_deleted")
        .with_description(
            "Tombstones of documents written in parts deleted past their pipeline's tombstone_retention",
        )
        .build()
    },
);

/// Bucket bounds, in seconds, of the reconcile pass's duration (a pass is meant to stay
/// under 0.1 s, so the buckets are fine below it).
const RECONCILE_BUCKETS: &[f64] = &[
    0.001, 0.0025, 0.005, 0.01, 0.02, 0.03, 0.05, 0.075, 0.1, 0.15, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
    30.0,
];

pub(crate) static RECONCILE: LazyLock<opentelemetry::metrics::Histogram<f64>> =
    LazyLock::new(|| {
        opentelemetry::global::meter("sluice")
            .f64_histogram("sluice.center.reconcile")
            .with_unit("s")
            .with_description("How long each of the leader's reconcile passes took")
            .with_boundaries(RECONCILE_BUCKETS.to_vec())
            .build()
    });

#[derive(Default)]
pub(crate) struct Gauges {
    pub leader: bool,
    pub epoch: u64,
    /// Known only on the leader (a follower shows none).
    pub workers_live: Option<u64>,
    pub tasks: BTreeMap<String, u64>,
    pub pipelines: BTreeMap<&'static str, u64>,
    pub builds: BTreeMap<String, (BuildPhase, BuildStatus)>,
    pub source_lag: BTreeMap<String, f64>,
    /// Per pipeline, 1 when its live (or building) version needs a rebuild.
    pub needs_rebuild: BTreeMap<String, u64>,
    /// Per pipeline, its running or last consistency check.
    pub checks: BTreeMap<String, CheckGauge>,
    /// Per dependency (`meta`, `zookeeper`, `kafka`), whether it answered the last probe.
    pub dependencies: BTreeMap<&'static str, bool>,
}

/// A consistency check as the gauges show it.
#[derive(Debug, Clone, Default)]
pub(crate) struct CheckGauge {
    pub running: bool,
    pub chunks: u32,
    pub chunks_done: u32,
    pub tally: sluice_zk::layout::CheckTally,
}

pub(crate) static GAUGES: Mutex<Gauges> = Mutex::new(Gauges {
    leader: false,
    epoch: 0,
    workers_live: None,
    tasks: BTreeMap::new(),
    pipelines: BTreeMap::new(),
    builds: BTreeMap::new(),
    source_lag: BTreeMap::new(),
    needs_rebuild: BTreeMap::new(),
    checks: BTreeMap::new(),
    dependencies: BTreeMap::new(),
});

pub(crate) fn update(f: impl FnOnce(&mut Gauges)) {
    f(&mut GAUGES.lock().unwrap_or_else(|e| e.into_inner()));
}

fn read<T>(f: impl FnOnce(&Gauges) -> T) -> T {
    f(&GAUGES.lock().unwrap_or_else(|e| e.into_inner()))
}

fn read_checks() -> BTreeMap<String, CheckGauge> {
    read(|g| g.checks.clone())
}

/// Registers the gauges; call once, after telemetry is installed.
pub(crate) fn observe() {
    let m = opentelemetry::global::meter("sluice");
    observe_cluster(&m);
    observe_pipelines(&m);
    observe_checks(&m);
    observe_builds(&m);
    observe_zookeeper(&m);
}

/// The ZooKeeper requests this replica sent, writes and reads apart, by operation.
fn observe_zookeeper(m: &Meter) {
    for (name, description, writes) in [
        (
            "sluice.center.zk.writes",
            "ZooKeeper writes this replica sent (answered or not), by op: create, set, delete",
            true,
        ),
        (
            "sluice.center.zk.reads",
            "ZooKeeper reads this replica sent (its session's heartbeat too), by op: get, children, exists",
            false,
        ),
    ] {
        m.u64_observable_counter(name)
            .with_description(description)
            .with_callback(move |o| {
                for op in sluice_zk::Op::ALL.into_iter().filter(|op| op.is_write() == writes) {
                    o.observe(
                        sluice_zk::requests::sent(op),
                        &[KeyValue::new("op", op.as_str())],
                    );
                }
            })
            .build();
    }
}

/// The leadership, the dependencies' health, the workers, their tasks and lag; and the
/// event counter from zero for each kind (so a rate is defined before the first event).
fn observe_cluster(m: &Meter) {
    for kind in [
        "leader",
        "assignment",
        "build",
        "pipeline",
        "source",
        "rebuild",
        "check",
    ] {
        EVENTS.add(0, &[KeyValue::new("kind", kind)]);
    }
    m.u64_observable_gauge("sluice.center.leader")
        .with_description("1 on the center replica that leads, 0 on the others")
        .with_callback(|o| o.observe(read(|g| u64::from(g.leader)), &[]))
        .build();
    m.u64_observable_gauge("sluice.center.dependency.up")
        .with_description(
            "1 when the dependency (meta, zookeeper, kafka) answered this replica's last probe",
        )
        .with_callback(|o| {
            for (dependency, up) in read(|g| g.dependencies.clone()) {
                o.observe(u64::from(up), &[KeyValue::new("dependency", dependency)]);
            }
        })
        .build();
    m.u64_observable_gauge("sluice.center.epoch")
        .with_description("The leadership epoch this replica last led at")
        .with_callback(|o| o.observe(read(|g| g.epoch), &[]))
        .build();
    m.u64_observable_gauge("sluice.center.workers.live")
        .with_description("Workers registered in ZooKeeper (on the leader)")
        .with_callback(|o| {
            if let Some(n) = read(|g| g.workers_live) {
                o.observe(n, &[]);
            }
        })
        .build();
    m.u64_observable_gauge("sluice.center.tasks")
        .with_description("Binlog tasks assigned per worker (on the leader)")
        .with_callback(|o| {
            for (worker, n) in read(|g| g.tasks.clone()) {
                o.observe(n, &[KeyValue::new("worker", worker)]);
            }
        })
        .build();
    m.f64_observable_gauge("sluice.center.source.lag")
        .with_unit("s")
        .with_description("Binlog lag per source, as its worker last reported it")
        .with_callback(|o| {
            for (source, lag) in read(|g| g.source_lag.clone()) {
                o.observe(lag, &[KeyValue::new("source", source)]);
            }
        })
        .build();
}

/// Pipelines by availability, and which need a rebuild.
fn observe_pipelines(m: &Meter) {
    m.u64_observable_gauge("sluice.center.pipelines")
        .with_description("Pipelines by state: unavailable, building, available")
        .with_callback(|o| {
            for (state, n) in read(|g| g.pipelines.clone()) {
                o.observe(n, &[KeyValue::new("state", state)]);
            }
        })
        .build();
    m.u64_observable_gauge("sluice.center.pipeline.needs_rebuild")
        .with_description("1 when the pipeline's documents need a rebuild (a mapping the live index cannot take, or DDL that changed rows without row events), on the leader")
        .with_callback(|o| {
            for (pipeline, n) in read(|g| g.needs_rebuild.clone()) {
                o.observe(n, &[KeyValue::new("pipeline", pipeline)]);
            }
        })
        .build();
}

/// Each pipeline's running or last consistency check.
fn observe_checks(m: &Meter) {
    m.u64_observable_gauge("sluice.center.check.drift")
        .with_description("Documents the pipeline's running or last consistency check found wrong, by kind: missing, extra, different")
        .with_callback(|o| {
            for (pipeline, c) in read_checks() {
                for (kind, n) in [
                    ("missing", c.tally.missing),
                    ("extra", c.tally.extra),
                    ("different", c.tally.different),
                ] {
                    o.observe(
                        n,
                        &[KeyValue::new("pipeline", pipeline.clone()), KeyValue::new("kind", kind)],
                    );
                }
            }
        })
        .build();
    type CheckField = fn(&CheckGauge) -> u64;
    let checks: [(&'static str, &'static str, CheckField); 5] = [
        (
            "sluice.center.check.keys",
            "Documents the check compared so far",
            |c| c.tally.keys,
        ),
        (
            "sluice.center.check.skipped",
            "Documents the stream changed while the check read them (not judged)",
            |c| c.tally.skipped,
        ),
        (
            "sluice.center.check.chunks",
            "Chunks the check was cut into",
            |c| c.chunks.into(),
        ),
        ("sluice.center.check.chunks_done", "Chunks compared", |c| {
            c.chunks_done.into()
        }),
        (
            "sluice.center.check.running",
            "1 while the pipeline's check runs",
            |c| u64::from(c.running),
        ),
    ];
    for (name, description, field) in checks {
        m.u64_observable_gauge(name)
            .with_description(description)
            .with_callback(move |o| {
                for (pipeline, c) in read_checks() {
                    o.observe(field(&c), &[KeyValue::new("pipeline", pipeline)]);
                }
            })
            .build();
    }
}

/// Each pipeline's running or last build.
fn observe_builds(m: &Meter) {
    type Field = fn(&(BuildPhase, BuildStatus)) -> u64;
    let builds: [(&'static str, &'static str, Field); 6] = [
        (
            "sluice.center.build.rows_done",
            "Rows snapshotted so far by the pipeline's build",
            |(_, b)| b.rows_done,
        ),
        (
            "sluice.center.build.rows_estimated",
            "The table's estimated rows at planning",
            |(_, b)| b.rows_estimated,
        ),
        (
            "sluice.center.build.chunks",
            "Chunks the build's table was cut into",
            |(_, b)| b.chunks.into(),
        ),
        (
            "sluice.center.build.chunks_done",
            "Chunks read completely",
            |(_, b)| b.chunks_done.into(),
        ),
        (
            "sluice.center.build.running",
            "1 while the pipeline's build runs, 0 once its alias moved or while it is held",
            |(phase, _)| u64::from(*phase != BuildPhase::Done && *phase != BuildPhase::Held),
        ),
        (
            "sluice.center.build.held",
            "1 while the pipeline's build is held for verification (`pipelines swap`)",
            |(phase, _)| u64::from(*phase == BuildPhase::Held),
        ),
    ];
    for (name, description, field) in builds {
        m.u64_observable_gauge(name)
            .with_description(description)
            .with_callback(move |o| {
                for (pipeline, b) in read(|g| g.builds.clone()) {
                    o.observe(field(&b), &[KeyValue::new("pipeline", pipeline)]);
                }
            })
            .build();
    }
}
