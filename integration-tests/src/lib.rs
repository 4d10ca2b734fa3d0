//! End-to-end harness on the real local stack (or external services):
//! MySQL → sluice-worker → Kafka → sluice-etl → Elasticsearch.
//!
//! Endpoints come from `MARIADB_URL` and `MYSQL_URL` (admin users that can create
//! databases, one per source [lane](lane)), `ZOOKEEPER`, `KAFKA_BROKERS` and `ES_URL`, with
//! the local stack's defaults; the worker streams as
//! `MYSQL_SOURCE_USER`/`MYSQL_SOURCE_PASSWORD` (default `sluice`/`sluice`). Every test gets
//! its own database, ZooKeeper root, topics, consumer group and indexes. A service that is
//! not reachable fails the test with how to start it — never a silent skip.

pub mod blog;
pub mod broker;
pub mod ceiling;
pub mod checker;
pub mod cluster;
pub mod console;
pub mod container;
pub mod context;
pub mod cpu;
pub mod debezium;
pub mod documents;
pub mod figures;
pub mod hostile_mysql;
pub mod kafka;
pub mod lane;
pub mod load;
pub mod paths;
pub mod ports;
pub mod private_source;
pub mod probe;
pub mod process;
pub mod secure;
pub mod shop;
pub mod soak;
pub mod stack;
pub mod stages;
pub mod tamper;
mod warm;
pub mod zookeeper;

use std::future::Future;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

pub use checker::{check_table, CheckOptions};
pub use cluster::{time_until, Cluster, ClusterSource, TaskView, PASSWORD_VAR};
pub use context::{Pipeline, TestCtx};
pub use documents::check_documents;
pub use load::Load;
pub use process::{sample, Running, Service};
/// The fault proxy (a crate of its own: the ZooKeeper crate's tests use it too).
pub use sluice_faultproxy as proxy;
pub use stack::Stack;
pub use tamper::Tamper;

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

/// The last `n` lines of the file at `path` (empty when unreadable), for failure messages.
pub fn last_lines(path: &std::path::Path, n: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

static COUNTER: AtomicU32 = AtomicU32::new(0);

/// The numbers `from..=to` as a derived table of one column, `seq`, for `INSERT … SELECT`
/// on either server (MariaDB's `seq_1_to_N` tables do not exist on MySQL, and MySQL's
/// recursive CTEs stop at 1,000 rows by default): `from` plus the span's digits
/// cross-joined.
pub fn seq(from: u64, to: u64) -> String {
    let span = to.saturating_sub(from);
    let places = span.max(1).ilog10() + 1;
    let digits = "(SELECT 0 AS d UNION ALL SELECT 1 UNION ALL SELECT 2 UNION ALL SELECT 3 \
                  UNION ALL SELECT 4 UNION ALL SELECT 5 UNION ALL SELECT 6 UNION ALL SELECT 7 \
                  UNION ALL SELECT 8 UNION ALL SELECT 9)";
    let sum = (0..places)
        .map(|p| format!("d{p}.d * {}", 10u64.pow(p)))
        .collect::<Vec<_>>()
        .join(" + ");
    let from_list = (0..places)
        .map(|p| format!("{digits} AS d{p}"))
        .collect::<Vec<_>>()
        .join(" CROSS JOIN ");
    format!("(SELECT {from} + {sum} AS seq FROM {from_list} WHERE {sum} <= {span}) AS seq_rows")
}

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

/// A small deterministic generator (xorshift64*): runs replay from their seed, with no
/// dependency.
pub struct Xorshift(pub u64);

impl Xorshift {
    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// A number in `0..n` (0 when `n` is 0).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n.max(1)
    }

    /// A duration in `low..=high`, by the millisecond.
    pub fn between(&mut self, low: Duration, high: Duration) -> Duration {
        let span = high.saturating_sub(low).as_millis() as u64;
        low + Duration::from_millis(self.below(span + 1))
    }

    /// `items` in a random order.
    pub fn shuffle<T>(&mut self, items: &mut [T]) {
        for i in (1..items.len()).rev() {
            items.swap(i, self.below(i as u64 + 1) as usize);
        }
    }

    /// Letters, digits and spaces only, so it needs no SQL escaping.
    pub fn text(&mut self, min: u64, max: u64) -> String {
        const CHARS: &[u8] = b"abcdefghijklmnopqrstuvwxyz0123456789     ";
        let len = min + self.below(max - min + 1);
        (0..len)
            .map(|_| CHARS[self.below(CHARS.len() as u64) as usize] as char)
            .collect()
    }
}
