//! `sluice-etl` configuration (TOML file, then `SLUICE_…` environment overrides).

use std::time::Duration;

use serde::Deserialize;
use sluice_kafka::{KafkaConfig, TopicConfig};
use sluice_model::PipelineSpec;
use sluice_mysql::SourceConfig;

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EtlConfig {
    #[serde(default)]
    pub etl: EtlSection,
    pub kafka: KafkaConfig,
    #[serde(default)]
    pub topics: TopicConfig,
    pub elasticsearch: EsSection,
    /// In a cluster: follow the pipelines the center publishes in ZooKeeper
    /// (`pipelines/<name>`), added, changed and removed at runtime.
    #[serde(default)]
    pub zookeeper: Option<sluice_zk::ZkConfig>,
    /// Pipelines from this file (standalone, or in addition to the center's).
    #[serde(default)]
    pub pipelines: Vec<PipelineSpec>,
    /// Sources the etl reads documents back from (pipelines with relations or a filter),
    /// by name. In a cluster the center's sources are used for those not listed here.
    #[serde(default)]
    pub sources: Vec<SourceConfig>,
    /// TLS to the center's sources (file sources have their own `tls`).
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
    /// `/metrics`, `/healthz`, `/readyz`, and traces over OTLP.
    #[serde(default)]
    pub telemetry: sluice_runtime::telemetry::TelemetrySection,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EtlSection {
    /// Kafka consumer group. Default `sluice-etl`.
    #[serde(default = "default_group")]
    pub group_id: String,
    /// This etl's member id in ZooKeeper (`etls/<id>`), by which the members of a group
    /// share the partitions: a restarted etl with the same id takes back the same ones.
    /// Must be unique per running etl (e.g. the StatefulSet pod name); a random one when
    /// unset.
    #[serde(default)]
    pub instance_id: Option<String>,
    /// Moved to `topics.dead_letter`, where the center finds it too; kept only to say so.
    #[serde(default)]
    pub dead_letter_topic: Option<String>,
    /// A bulk request holds at most this many documents...
    #[serde(default = "default_max_docs")]
    pub max_batch_docs: usize,
    /// ...and at most about this many bytes of events...
    #[serde(default = "default_max_bytes")]
    pub max_batch_bytes: usize,
    /// ...and waits at most this long for more events once it has one.
    #[serde(default = "default_linger", with = "humantime_serde")]
    pub linger: Duration,
    /// First pause before retrying what failed: a bulk item answered 429/5xx (the pause
    /// doubles, with jitter, up to `retry_backoff_max` while an attempt settles nothing,
    /// and holds while the server takes part of each), a send to Kafka, a read from the
    /// source, reaching ZooKeeper.
    #[serde(default = "default_retry_backoff", with = "humantime_serde")]
    pub retry_backoff: Duration,
    /// The longest pause between two attempts of a bulk (or of a send to Kafka): once the
    /// server is back, the writes behind wait at most this long.
    #[serde(default = "default_retry_backoff_max", with = "humantime_serde")]
    pub retry_backoff_max: Duration,
    /// At most this many batches' bulks in flight at once (halved while Elasticsearch
    /// answers 429, raised back as it stops). 1 writes one batch at a time.
    #[serde(default = "default_max_in_flight")]
    pub max_in_flight: usize,
    /// Documents read back from MySQL are read in chunks of 256 keys on up to this many
    /// connections of the source at once, each chunk in a snapshot of its own.
    #[serde(default = "default_read_concurrency")]
    pub read_concurrency: usize,
    /// How often how far each pipeline is applied is looked at and published
    /// (`applied/<pipeline>` in ZooKeeper): what an application reading its own write
    /// waits for, at most this much more.
    #[serde(default = "default_applied_interval", with = "humantime_serde")]
    pub applied_interval: Duration,
}

impl EtlSection {
    /// The retry policy of everything the etl retries.
    pub(crate) fn retry(&self) -> sluice_model::RetryPolicy {
        sluice_model::RetryPolicy::new(self.retry_backoff, self.retry_backoff_max)
    }
}

impl Default for EtlSection {
    fn default() -> Self {
        Self {
            group_id: default_group(),
            instance_id: None,
            dead_letter_topic: None,
            max_batch_docs: default_max_docs(),
            max_batch_bytes: default_max_bytes(),
            linger: default_linger(),
            retry_backoff: default_retry_backoff(),
            retry_backoff_max: default_retry_backoff_max(),
            max_in_flight: default_max_in_flight(),
            read_concurrency: default_read_concurrency(),
            applied_interval: default_applied_interval(),
        }
    }
}

fn default_group() -> String {
    "sluice-etl".into()
}
fn default_max_docs() -> usize {
    2000
}
fn default_max_bytes() -> usize {
    8 << 20
}
fn default_linger() -> Duration {
    Duration::from_millis(100)
}
fn default_max_in_flight() -> usize {
    4
}
fn default_read_concurrency() -> usize {
    4
}
fn default_applied_interval() -> Duration {
    Duration::from_millis(50)
}
fn default_retry_backoff() -> Duration {
    Duration::from_millis(200)
}
/// 5 s: at 30 s, a lone bulk that met a soak's fault after fault (eight 429s, then two
/// connections lost) waited 111 s in all, 60 s of it for the two lost connections alone;
/// with 5 s, the same soak (same seed, same faults in the same order) lagged 22.6 s at worst.
fn default_retry_backoff_max() -> Duration {
    Duration::from_secs(5)
}

pub use sluice_elastic::EsSection;

impl EtlConfig {
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

    /// The connection of source `name` from this file, or why there is none.
    pub fn source(&self, name: &str) -> Result<SourceConfig, String> {
        self.sources
            .iter()
            .find(|s| s.name == name)
            .cloned()
            .ok_or_else(|| format!("no [[sources]] entry named `{name}` in the etl's file"))
    }

    /// Checks values without I/O; every problem, each naming its key.
    pub fn validate(&self) -> Result<(), Vec<String>> {
        let mut p = Vec::new();
        p.extend(self.telemetry.problems("telemetry"));
        p.extend(sluice_model::tls::problems_of(&self.mysql_tls()));
        p.extend(self.source_access().problems());
        if self.etl.group_id.trim().is_empty() {
            p.push("etl.group_id: must not be empty".into());
        }
        if let Some(t) = &self.etl.dead_letter_topic {
            p.push(format!(
                "etl.dead_letter_topic: moved to topics.dead_letter (write `[topics]` `dead_letter = {t:?}`), where the center's `sluicectl dlq` finds it too"
            ));
        }
        if self.etl.max_batch_docs == 0 {
            p.push("etl.max_batch_docs: must be at least 1".into());
        }
        if self.etl.applied_interval.is_zero() {
            p.push("etl.applied_interval: must be above zero".into());
        }
        if self.etl.max_in_flight == 0 {
            p.push("etl.max_in_flight: must be at least 1".into());
        }
        if self.etl.read_concurrency == 0 {
            p.push("etl.read_concurrency: must be at least 1".into());
        }
        p.extend(
            self.etl
                .retry()
                .problems("etl.retry_backoff", "etl.retry_backoff_max"),
        );
        if self.etl.max_batch_bytes < 1024 {
            p.push("etl.max_batch_bytes: must be at least 1024".into());
        }
        p.extend(self.kafka.problems("kafka"));
        p.extend(self.topics.problems("topics"));
        p.extend(self.elasticsearch.problems("elasticsearch"));
        if self.pipelines.is_empty() && self.zookeeper.is_none() {
            p.push("pipelines: no pipeline configured; add a [[pipelines]] table, or a [zookeeper] section to follow the center's".into());
        }
        if let Some(zk) = &self.zookeeper {
            if let Err(issues) = zk.validate() {
                p.extend(
                    issues
                        .into_iter()
                        .map(|i| format!("zookeeper.{}: {}", i.key, i.reason)),
                );
            }
        }
        self.pipeline_problems(&mut p);
        for (i, s) in self.sources.iter().enumerate() {
            if self.sources[..i].iter().any(|o| o.name == s.name) {
                p.push(format!(
                    "sources[{i}].name: `{}` is used by another source",
                    s.name
                ));
            }
        }
        if p.is_empty() {
            Ok(())
        } else {
            Err(p)
        }
    }

    /// Each pipeline's problems, and the names and aliases pipelines share.
    fn pipeline_problems(&self, p: &mut Vec<String>) {
        for (i, pl) in self.pipelines.iter().enumerate() {
            let key = format!("pipelines[{i}]");
            p.extend(pl.problems().into_iter().map(|why| format!("{key}.{why}")));
            if self.pipelines[..i].iter().any(|o| o.name == pl.name) {
                p.push(format!(
                    "{key}.name: `{}` is used by another pipeline",
                    pl.name
                ));
            }
            let alias = pl.alias();
            if self.pipelines[..i].iter().any(|o| o.alias() == alias) {
                p.push(format!(
                    "{key}.alias: `{alias}` is used by another pipeline"
                ));
            }
            if pl.has_delayed() && self.zookeeper.is_none() {
                p.push(format!(
                "{key}.relations: a delayed relation's changes are recorded and applied by the centers: it needs a cluster ([zookeeper])"
            ));
            }
            if !pl.is_flat() && self.zookeeper.is_none() && self.source(&pl.source).is_err() {
                p.push(format!(
                "{key}.source: `{}` is not under [[sources]]: a pipeline with relations or a filter reads its documents back from MySQL, so the etl needs the source's connection",
                pl.source
            ));
            }
        }
    }
}
