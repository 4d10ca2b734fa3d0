//! End-to-end harness on the real local stack (or external services):
//! MySQL → sluice-worker → Kafka → sluice-etl → Elasticsearch.
//!
//! Endpoints come from `MYSQL_URL` (an admin user that can create databases), `ZOOKEEPER`,
//! `KAFKA_BROKERS` and `ES_URL`, with the local stack's defaults; the worker streams as
//! `MYSQL_SOURCE_USER`/`MYSQL_SOURCE_PASSWORD` (default `sluice`/`sluice`). Every test gets
//! its own database, ZooKeeper root, topics, consumer group and indexes. A service that is
//! not reachable fails the test with how to start it — never a silent skip.

pub mod broker;
pub mod ceiling;
pub mod checker;
pub mod cluster;
pub mod documents;
pub mod kafka;
pub mod mariadb;
pub mod services;
pub mod shop;
pub mod soak;
pub mod zookeeper;

use std::future::Future;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

pub use checker::{check_table, CheckOptions};
pub use cluster::{time_until, Cluster, ClusterSource, TaskView};
pub use documents::check_documents;
pub use services::{sample, Load, Pipeline, Running, Service, Stack, TestCtx};
/// The fault proxy (a crate of its own: the ZooKeeper crate's tests use it too).
pub use sluice_faultproxy as proxy;

/// Polls `probe` until it returns `Ok`, or panics at the deadline with the last error.
pub async fn eventually<F, Fut, T>(what: &str, timeout: Duration, mut probe: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, String>>,
{
    let deadline = Instant::now() + timeout;
    loop {
        let last = match probe().await {
            Ok(v) => return v,
            Err(e) => e,
        };
        if Instant::now() >= deadline {
            panic!("{what}: not reached within {timeout:?}; last observation:\n{last}");
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// A number from the environment variable `name` (`_` allowed between digits), or
/// `default` when it is unset or empty (the benches' settings).
pub fn env_num<T: std::str::FromStr>(name: &str, default: T) -> anyhow::Result<T> {
    match std::env::var(name) {
        Ok(v) if !v.trim().is_empty() => v
            .trim()
            .replace('_', "")
            .parse()
            .map_err(|_| anyhow::anyhow!("{name}={v} is not a number")),
        _ => Ok(default),
    }
}

static COUNTER: AtomicU32 = AtomicU32::new(0);

/// A name unique to this process and call, safe for databases, topics and indexes.
pub fn unique(prefix: &str) -> String {
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() % 100_000_000)
        .unwrap_or(0);
    format!("{prefix}{}x{n}x{t}", std::process::id())
}

pub fn init_tracing() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| "warn,zookeeper_async=error".into()),
        )
        .with_test_writer()
        .try_init();
}
