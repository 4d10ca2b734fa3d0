//! `sluice-worker`: reads each assigned MySQL instance's binlog and publishes every row
//! change to Kafka, confirming a position in ZooKeeper only after Kafka acknowledged every
//! event before it (README invariants 1, 2 and 6).
//!
//! One task per source. A task runs only while it holds the source's ephemeral lock;
//! publishing pauses while the ZooKeeper connection is lost and stops when the session
//! expires; checkpoints are compare-and-set writes, so a worker that lost its task can
//! never move a position again.

mod assigned;
mod check;
pub mod config;
mod envelope;
pub mod error;
mod metrics;
mod report;
mod snapshot;
mod task;

use std::collections::HashSet;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use sluice_runtime::telemetry::Readiness;
use sluice_runtime::ConfigError;
use sluice_zk::layout::{self, WorkerRecord};
use sluice_zk::{Coordinator, SessionEnd, Sessions};
use tokio::sync::Mutex;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

pub use config::WorkerConfig;
pub use error::WorkerError;

use crate::error::{Context as _, Result};

/// Loads and validates the configuration; errors name the offending keys.
pub fn load(path: &Path) -> Result<WorkerConfig, ConfigError> {
    let cfg: WorkerConfig = sluice_runtime::load_config(Some(path), "SLUICE")?;
    cfg.validate().map_err(ConfigError::Problems)?;
    sluice_runtime::unreadable_tls(&cfg.mysql_tls())?;
    Ok(cfg)
}

/// Runs the worker until `shutdown` is cancelled; then drains (confirms what Kafka
/// acknowledged) within the configured bound.
///
/// With `sources` in its configuration the worker runs those (standalone); without, it
/// registers in ZooKeeper and runs what the center's leader assigns it.
pub async fn run(cfg: WorkerConfig, ready: Readiness, shutdown: CancellationToken) -> Result<()> {
    let cfg = Arc::new(cfg);
    // Credentials and certificates refused at start stop the worker naming the setting.
    sluice_kafka::check_access(&cfg.kafka, Duration::from_secs(10))
        .await
        .map_err(WorkerError::definite)?;
    let producer = sluice_kafka::SharedProducer::new(&cfg.kafka)
        .context("cannot create the Kafka producer")?;
    let es = match &cfg.elasticsearch {
        Some(section) => Some(
            section
                .client()
                .context("cannot make the Elasticsearch client (elasticsearch)")?,
        ),
        None => None,
    };
    if let Some(es) = &es {
        sluice_elastic::EsSection::check_access(es, "elasticsearch")
            .await
            .map_err(WorkerError::definite)?;
    }
    let reports = Arc::new(report::Reports::default());
    metrics::observe(reports.clone());
    let cluster = cfg.sources.is_empty();
    tracing::info!(
        worker = %cfg.worker.id,
        mode = if cluster { "cluster (tasks assigned by the center)" } else { "standalone (sources from the file)" },
        "worker starting"
    );
    // Sent with every report; only its digest is published, in this worker's record.
    let (report_key, report_key_sha256) = WorkerRecord::new_report_key();
    let worker = Worker {
        cfg: cfg.clone(),
        report_key_sha256,
        producer: producer.clone(),
        es,
        reports: reports.clone(),
        known_topics: Arc::new(Mutex::new(HashSet::new())),
        started_at_ms: sluice_model::now_ms(),
        shutdown: shutdown.clone(),
    };
    let retry = cfg.worker.retry();
    let mut sessions = Sessions::new(cfg.zookeeper.clone(), retry, "the worker", shutdown.clone());
    while let Some(coord) = sessions.next().await {
        let session_done = shutdown.child_token();
        let reporter = tokio::spawn(report::report_loop(
            cfg.clone(),
            coord.clone(),
            reports.clone(),
            report_key.clone(),
            session_done.clone(),
        ));
        let end = if cluster {
            worker.in_cluster(&coord, &ready).await
        } else {
            worker.standalone(&coord, &ready).await
        };
        ready.set(false);
        session_done.cancel();
        let _ = reporter.await;
        sessions.ended(coord, end).await;
    }
    if let Err(e) = producer.flush(Duration::from_secs(5)).await {
        tracing::warn!(error = %e, "producer flush at shutdown failed");
    }
    tracing::info!("worker stopped");
    Ok(())
}

/// What every session of the worker shares.
struct Worker {
    cfg: Arc<WorkerConfig>,
    /// What this process's record publishes of its report key.
    report_key_sha256: String,
    producer: sluice_kafka::SharedProducer,
    es: Option<sluice_elastic::EsClient>,
    reports: Arc<report::Reports>,
    known_topics: Arc<Mutex<HashSet<String>>>,
    started_at_ms: i64,
    shutdown: CancellationToken,
}

impl Worker {
    /// What a binlog task of `task` runs with in the session of `coord`, until `stop`.
    fn task_ctx(&self, coord: &Coordinator, task: &str, stop: CancellationToken) -> task::TaskCtx {
        task::TaskCtx {
            cfg: self.cfg.clone(),
            producer: self.producer.clone(),
            coord: coord.clone(),
            shutdown: stop,
            known_topics: self.known_topics.clone(),
            progress: self.reports.task(task),
            reports: self.reports.clone(),
        }
    }

    /// A session in a cluster: registers, then runs the assigned tasks, the build jobs
    /// and (with `[elasticsearch]`) the check chunks until the session ends.
    async fn in_cluster(&self, coord: &Coordinator, ready: &Readiness) -> SessionEnd {
        let cfg = &self.cfg;
        let me = WorkerRecord {
            id: cfg.worker.id.clone(),
            addr: cfg.worker.advertise.clone().unwrap_or_default(),
            version: env!("CARGO_PKG_VERSION").to_owned(),
            started_at_ms: self.started_at_ms,
            registered_at_ms: sluice_model::now_ms(),
            capacity: cfg.worker.capacity,
            report_key_sha256: self.report_key_sha256.clone(),
        };
        let data = serde_json::to_vec(&me).expect("worker record serializes");
        let at = layout::worker(&cfg.worker.id);
        if let Err(e) = coord.register(&at, &data, &self.shutdown).await {
            tracing::warn!(error = %e, "cannot register the worker");
            return SessionEnd::Failed;
        }
        tracing::info!(worker = %cfg.worker.id, "registered; following assignments");
        ready.set(true);
        let jobs = Arc::new(snapshot::Jobs {
            cfg: cfg.clone(),
            coord: coord.clone(),
            producer: self.producer.clone(),
            reports: self.reports.clone(),
        });
        let checks = self.es.clone().map(|es| {
            Arc::new(check::Checks {
                cfg: cfg.clone(),
                coord: coord.clone(),
                producer: self.producer.clone(),
                es,
            })
        });
        let access = cfg.source_access();
        let make_ctx = |task: &str, stop| self.task_ctx(coord, task, stop);
        let shutdown = &self.shutdown;
        tokio::join!(
            async {
                if let Some(checks) = checks {
                    check::claim_chunks(checks, shutdown).await;
                }
            },
            assigned::run_tasks(
                coord,
                &cfg.worker.id,
                cfg.worker.retry(),
                &make_ctx,
                &access,
                &self.reports,
                shutdown,
            ),
            snapshot::run_jobs(jobs, shutdown),
        );
        SessionEnd::Ended
    }

    /// A session of a standalone worker: the file's sources, until they stop.
    async fn standalone(&self, coord: &Coordinator, ready: &Readiness) -> SessionEnd {
        let mut tasks = JoinSet::new();
        for source in self.cfg.sources.iter().cloned() {
            let ctx = self.task_ctx(coord, &source.name, self.shutdown.clone());
            tasks.spawn(async move { task::run_source(ctx, source, Default::default()).await });
        }
        ready.set(true);
        while tasks.join_next().await.is_some() {}
        SessionEnd::Ended
    }
}
