//! `sluice-worker`: reads each assigned MySQL instance's binlog and publishes every row
//! change to Kafka, confirming a position in ZooKeeper only after Kafka acknowledged every
//! event before it (DESIGN.md invariants 1, 2 and 6).
//!
//! One task per source. A task runs only while it holds the source's ephemeral lock;
//! publishing pauses while the ZooKeeper connection is lost and stops when the session
//! expires; checkpoints are compare-and-set writes, so a worker that lost its task can
//! never move a position again.

pub mod config;
mod envelope;
mod task;

use std::collections::HashSet;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use sluice_core::ConfigError;
use sluice_zk::{Coordinator, SessionState};
use tokio::sync::Mutex;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

pub use config::WorkerConfig;

/// Loads and validates the configuration; errors name the offending keys.
pub fn load(path: &Path) -> Result<WorkerConfig, ConfigError> {
    let cfg: WorkerConfig = sluice_core::load_config(Some(path), "SLUICE")?;
    cfg.validate().map_err(ConfigError::Problems)?;
    Ok(cfg)
}

/// Runs the worker until `shutdown` is cancelled; then drains (confirms what Kafka
/// acknowledged) within the configured bound.
pub async fn run(cfg: WorkerConfig, shutdown: CancellationToken) -> anyhow::Result<()> {
    let cfg = Arc::new(cfg);
    let producer =
        sluice_kafka::producer(&cfg.kafka).context("cannot create the Kafka producer")?;
    let known_topics = Arc::new(Mutex::new(HashSet::new()));
    tracing::info!(worker = %cfg.worker.id, sources = cfg.sources.len(), "worker starting");
    let mut backoff = cfg.worker.retry_backoff;
    while !shutdown.is_cancelled() {
        let coord = match Coordinator::connect(&cfg.zookeeper).await {
            Ok(c) => c,
            Err(e) => {
                tracing::error!(error = %e, "cannot reach ZooKeeper; retrying");
                pause(backoff, &shutdown).await;
                backoff = (backoff * 2).min(Duration::from_secs(30));
                continue;
            }
        };
        backoff = cfg.worker.retry_backoff;
        let mut tasks = JoinSet::new();
        for source in cfg.sources.iter().cloned() {
            let ctx = task::TaskCtx {
                cfg: cfg.clone(),
                producer: producer.clone(),
                coord: coord.clone(),
                shutdown: shutdown.clone(),
                known_topics: known_topics.clone(),
            };
            tasks.spawn(async move { task::run_source(ctx, source).await });
        }
        while tasks.join_next().await.is_some() {}
        let expired = *coord.session().borrow() == SessionState::Expired;
        coord.close().await;
        if expired && !shutdown.is_cancelled() {
            tracing::warn!("ZooKeeper session expired: every task was dropped; reconnecting with a new session");
        }
    }
    let flushed = tokio::task::spawn_blocking(move || {
        use rdkafka::producer::Producer as _;
        producer.flush(Duration::from_secs(5))
    })
    .await;
    if let Ok(Err(e)) = flushed {
        tracing::warn!(error = %e, "producer flush at shutdown failed");
    }
    tracing::info!("worker stopped");
    Ok(())
}

/// Waits `d` or until shutdown — a retry pace, never a synchronisation.
async fn pause(d: Duration, shutdown: &CancellationToken) {
    tokio::select! {
        _ = tokio::time::sleep(d) => {}
        _ = shutdown.cancelled() => {}
    }
}
