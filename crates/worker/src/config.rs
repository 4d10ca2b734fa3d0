//! `sluice-worker` configuration (TOML file, then `SLUICE_…` environment overrides).

use std::time::Duration;

use serde::Deserialize;
use sluice_kafka::{KafkaConfig, TopicConfig};
use sluice_mysql::SourceConfig;
use sluice_zk::ZkConfig;

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WorkerConfig {
    #[serde(default)]
    pub worker: WorkerSection,
    pub zookeeper: ZkConfig,
    pub kafka: KafkaConfig,
    #[serde(default)]
    pub topics: TopicConfig,
    /// How the worker reaches the center's API (progress and event reports).
    #[serde(default)]
    pub center: CenterClientSection,
    /// MySQL instances this worker streams on its own (standalone mode). Leave empty in
    /// a cluster: the center's leader assigns sources through ZooKeeper.
    #[serde(default)]
    pub sources: Vec<SourceConfig>,
    /// TLS to the sources the center assigns (file sources have their own `tls`).
    #[serde(default)]
    pub source_tls: Option<sluice_model::TlsFiles>,
    /// Hosts of those sources a password may go to without TLS (`*`: any): whoever
    /// answers at such an address can read or guess it. A source elsewhere without TLS is
    /// refused before its connection opens.
    #[serde(default, deserialize_with = "sluice_model::listed::strings")]
    pub source_plaintext_hosts: Vec<String>,
    /// What those sources' `password_ref` may name in this process: nothing beyond it
    /// resolves (README, "Security").
    #[serde(default)]
    pub source_secrets: sluice_model::SecretRefs,
    /// The Elasticsearch the etl writes to: consistency checks compare the index with
    /// MySQL. A worker without it takes no check chunks.
    #[serde(default)]
    pub elasticsearch: Option<sluice_elastic::EsSection>,
    /// `/metrics`, `/healthz`, `/readyz`, and traces over OTLP.
    #[serde(default)]
    pub telemetry: sluice_runtime::telemetry::TelemetrySection,
}

#[derive(Debug, Clone, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct CenterClientSection {
    /// Bearer token for the center's API (`api.auth = "token"`).
    #[serde(default)]
    pub token: Option<sluice_model::Secret>,
    #[serde(default)]
    pub token_file: Option<std::path::PathBuf>,
    /// CA (PEM) that signed the center's certificate; enables TLS.
    #[serde(default)]
    pub tls_ca: Option<std::path::PathBuf>,
    /// Client certificate and key (PEM) for `api.auth = "mtls"`.
    #[serde(default)]
    pub tls_cert: Option<std::path::PathBuf>,
    #[serde(default)]
    pub tls_key: Option<std::path::PathBuf>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WorkerSection {
    /// This worker's id in ZooKeeper. Default: the host name.
    #[serde(default = "default_id")]
    pub id: String,
    /// Events published but not yet acknowledged by Kafka, per task. Reading the binlog
    /// waits when this many are outstanding.
    #[serde(default = "default_max_in_flight")]
    pub max_in_flight: usize,
    /// How often the confirmed position is written to ZooKeeper.
    #[serde(default = "default_confirm_interval", with = "humantime_serde")]
    pub confirm_interval: Duration,
    /// How long a shutdown waits for Kafka to acknowledge what is in flight.
    #[serde(default = "default_drain_timeout", with = "humantime_serde")]
    pub drain_timeout: Duration,
    /// First pause before retrying what failed (a task, reaching ZooKeeper, a build job,
    /// a check); it doubles, with jitter, up to `retry_backoff_max`.
    #[serde(default = "default_retry_backoff", with = "humantime_serde")]
    pub retry_backoff: Duration,
    /// The longest pause between two attempts.
    #[serde(default = "default_retry_backoff_max", with = "humantime_serde")]
    pub retry_backoff_max: Duration,
    /// How long a task stopped by a failure that needs an operator (the source's
    /// settings, an undecodable event, a purged resume position) waits before it looks
    /// again; a change of its source's record restarts it at once.
    #[serde(default = "default_recheck_failed", with = "humantime_serde")]
    pub recheck_failed: Duration,
    /// How many binlog tasks the center may give this worker.
    #[serde(default = "default_capacity")]
    pub capacity: u32,
    /// The address this worker advertises in its registration (informational).
    #[serde(default)]
    pub advertise: Option<String>,
    /// How often progress is reported to the center.
    #[serde(default = "default_report_interval", with = "humantime_serde")]
    pub report_interval: Duration,
}

impl Default for WorkerSection {
    fn default() -> Self {
        Self {
            id: default_id(),
            max_in_flight: default_max_in_flight(),
            confirm_interval: default_confirm_interval(),
            drain_timeout: default_drain_timeout(),
            retry_backoff: default_retry_backoff(),
            retry_backoff_max: default_retry_backoff_max(),
            recheck_failed: default_recheck_failed(),
            capacity: default_capacity(),
            advertise: None,
            report_interval: default_report_interval(),
        }
    }
}

fn default_id() -> String {
    std::fs::read_to_string("/etc/hostname")
        .ok()
        .map(|s| s.trim().to_owned())
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| format!("worker-{}", std::process::id()))
}

/// Over a million row events on the local stack: 10,000 gave 231k events/s at a 55 MiB
/// peak, 20,000 240k events/s at 69 MiB.
fn default_max_in_flight() -> usize {
    10_000
}

fn default_confirm_interval() -> Duration {
    Duration::from_millis(500)
}

fn default_drain_timeout() -> Duration {
    Duration::from_secs(10)
}

fn default_retry_backoff() -> Duration {
    Duration::from_millis(500)
}

fn default_retry_backoff_max() -> Duration {
    Duration::from_secs(30)
}

impl WorkerSection {
    /// The retry policy of everything the worker retries.
    pub fn retry(&self) -> sluice_model::RetryPolicy {
        sluice_model::RetryPolicy::new(self.retry_backoff, self.retry_backoff_max)
    }
}

fn default_recheck_failed() -> Duration {
    Duration::from_secs(300)
}

fn default_capacity() -> u32 {
    16
}

fn default_report_interval() -> Duration {
    Duration::from_secs(2)
}

impl WorkerConfig {
    /// How this process reaches the center's sources.
    pub fn source_access(&self) -> sluice_mysql::Access {
        sluice_mysql::Access {
            tls: self.source_tls.clone(),
            plaintext_hosts: self.source_plaintext_hosts.clone(),
            secrets: self.source_secrets.clone(),
        }
    }

    /// Every MySQL TLS setting in the file, by key.
    pub fn mysql_tls(&self) -> Vec<(String, &sluice_model::TlsFiles)> {
        sluice_mysql::tls::settings(self.source_tls.as_ref(), &self.sources)
    }

    /// Checks values without I/O; every problem, each naming its key.
    pub fn validate(&self) -> Result<(), Vec<String>> {
        let mut problems = Vec::new();
        problems.extend(self.telemetry.problems("telemetry"));
        self.streaming_problems(&mut problems);
        self.connection_problems(&mut problems);
        self.center_problems(&mut problems);
        self.source_problems(&mut problems);
        if problems.is_empty() {
            Ok(())
        } else {
            Err(problems)
        }
    }

    /// Problems of how the worker names itself, retries, and publishes and confirms.
    fn streaming_problems(&self, problems: &mut Vec<String>) {
        if self.worker.id.trim().is_empty() || self.worker.id.contains('/') {
            problems.push(format!(
                "worker.id: `{}` must be non-empty and contain no `/`",
                self.worker.id
            ));
        }
        problems.extend(
            self.worker
                .retry()
                .problems("worker.retry_backoff", "worker.retry_backoff_max"),
        );
        if self.worker.max_in_flight == 0 {
            problems.push("worker.max_in_flight: must be at least 1".into());
        }
        if self.worker.confirm_interval.is_zero() {
            problems.push("worker.confirm_interval: must be positive".into());
        }
    }

    /// Problems of how the worker reaches ZooKeeper, Kafka, Elasticsearch and MySQL (TLS).
    fn connection_problems(&self, problems: &mut Vec<String>) {
        if let Err(issues) = self.zookeeper.validate() {
            problems.extend(
                issues
                    .into_iter()
                    .map(|i| format!("zookeeper.{}: {}", i.key, i.reason)),
            );
        }
        problems.extend(self.kafka.problems("kafka"));
        problems.extend(self.topics.problems("topics"));
        if let Some(es) = &self.elasticsearch {
            problems.extend(es.problems("elasticsearch"));
        }
        problems.extend(sluice_model::tls::problems_of(&self.mysql_tls()));
        problems.extend(self.source_access().problems());
    }

    /// Problems of what concerns the center: capacity, progress reports, and its API.
    fn center_problems(&self, problems: &mut Vec<String>) {
        if self.worker.capacity == 0 {
            problems.push("worker.capacity: must be at least 1".into());
        }
        if self.worker.report_interval.is_zero() {
            problems.push("worker.report_interval: must be positive".into());
        }
        if self.center.token.is_some() && self.center.token_file.is_some() {
            problems.push("center.token: set center.token or center.token_file, not both".into());
        }
        if self.center.tls_cert.is_some() != self.center.tls_key.is_some() {
            problems.push("center.tls_key: set center.tls_cert and center.tls_key together".into());
        }
    }

    /// Problems of the standalone sources: names, server ids, and clashes between them.
    fn source_problems(&self, problems: &mut Vec<String>) {
        for (i, s) in self.sources.iter().enumerate() {
            let key = format!("sources[{i}]");
            if s.name.is_empty()
                || !s
                    .name
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'))
            {
                problems.push(format!(
                    "{key}.name: `{}` must be non-empty [A-Za-z0-9._-]",
                    s.name
                ));
            }
            if s.server_id == 0 {
                problems.push(format!(
                    "{key}.server_id: must be a non-zero replication server id"
                ));
            }
            for (j, shard) in s.shards.iter().enumerate() {
                if let Err(why) = shard.matcher() {
                    problems.push(format!("{key}.shards[{j}].{why}"));
                }
            }
            if self.sources[..i].iter().any(|o| o.name == s.name) {
                problems.push(format!(
                    "{key}.name: `{}` is used by another source",
                    s.name
                ));
            }
            if self.sources[..i]
                .iter()
                .any(|o| o.server_id == s.server_id && o.host == s.host && o.port == s.port)
            {
                problems.push(format!(
                    "{key}.server_id: {} is used by another source on the same server",
                    s.server_id
                ));
            }
        }
    }
}
