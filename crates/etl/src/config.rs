//! `sluice-etl` configuration (TOML file, then `SLUICE_…` environment overrides).

use std::time::Duration;

use serde::Deserialize;
use sluice_kafka::{KafkaConfig, TopicConfig};

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
    pub pipelines: Vec<PipelineConfig>,
    /// `/metrics`, `/healthz`, `/readyz`, and traces over OTLP.
    #[serde(default)]
    pub telemetry: sluice_core::telemetry::TelemetrySection,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EtlSection {
    /// Kafka consumer group. Default `sluice-etl`.
    #[serde(default = "default_group")]
    pub group_id: String,
    /// Static group membership (Kafka's `group.instance.id`): a restarted etl with the same
    /// id takes its partitions back at once instead of waiting for the dead member's
    /// session to time out. Must be unique per running etl (e.g. the StatefulSet pod name).
    #[serde(default)]
    pub instance_id: Option<String>,
    /// Where events that cannot be applied go, with the reason. Default `sluice.dlq`.
    #[serde(default = "default_dlq")]
    pub dead_letter_topic: String,
    /// A bulk request holds at most this many documents...
    #[serde(default = "default_max_docs")]
    pub max_batch_docs: usize,
    /// ...and at most about this many bytes of events...
    #[serde(default = "default_max_bytes")]
    pub max_batch_bytes: usize,
    /// ...and waits at most this long for more events once it has one.
    #[serde(default = "default_linger", with = "humantime_serde")]
    pub linger: Duration,
    /// First pause before retrying a bulk item answered 429/5xx (doubles up to 30 s).
    #[serde(default = "default_retry_backoff", with = "humantime_serde")]
    pub retry_backoff: Duration,
}

impl Default for EtlSection {
    fn default() -> Self {
        Self {
            group_id: default_group(),
            instance_id: None,
            dead_letter_topic: default_dlq(),
            max_batch_docs: default_max_docs(),
            max_batch_bytes: default_max_bytes(),
            linger: default_linger(),
            retry_backoff: default_retry_backoff(),
        }
    }
}

fn default_group() -> String {
    "sluice-etl".into()
}
fn default_dlq() -> String {
    "sluice.dlq".into()
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
fn default_retry_backoff() -> Duration {
    Duration::from_millis(200)
}

pub use sluice_elastic::EsSection;

/// One table → one index alias.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PipelineConfig {
    pub name: String,
    /// The source (MySQL instance) name, as the worker knows it.
    pub source: String,
    pub database: String,
    pub table: String,
    /// The alias searches use; the physical index is `<alias>_v<N>`. Default: `name`.
    #[serde(default)]
    pub alias: Option<String>,
    /// Columns to index; empty indexes every column.
    #[serde(default)]
    pub columns: Vec<String>,
    #[serde(default = "default_shards")]
    pub shards: u32,
    #[serde(default = "default_replicas")]
    pub replicas: u32,
    /// How long Elasticsearch remembers a deleted document's version
    /// (`index.gc_deletes`). A replayed change older than a delete is rejected only while
    /// the tombstone lives, so keep this above the longest replay you may do (Kafka
    /// retention, consumer rewinds). Default 7 days.
    #[serde(default = "default_tombstones")]
    pub tombstone_retention: String,
    /// The index's `refresh_interval` (`1s`, `30s`, `-1` for off); empty keeps the
    /// server's default. Changed in place on the live index.
    #[serde(default)]
    pub refresh_interval: String,
    /// Per-column overrides of the generated mapping, by column name.
    #[serde(default)]
    pub fields: std::collections::BTreeMap<String, sluice_core::FieldOverride>,
    /// A version being built (from the center): written to as well as the alias's.
    #[serde(skip)]
    pub building: Option<u32>,
}

fn default_shards() -> u32 {
    1
}
fn default_replicas() -> u32 {
    1
}
fn default_tombstones() -> String {
    "7d".into()
}

impl PipelineConfig {
    pub fn alias(&self) -> &str {
        self.alias.as_deref().unwrap_or(&self.name)
    }
}

impl From<sluice_zk::layout::PipelineRecord> for PipelineConfig {
    fn from(r: sluice_zk::layout::PipelineRecord) -> Self {
        Self {
            name: r.name,
            source: r.source,
            database: r.database,
            table: r.table,
            alias: Some(r.alias).filter(|a| !a.is_empty()),
            columns: r.columns,
            shards: r.shards.max(1),
            replicas: r.replicas,
            tombstone_retention: if r.tombstone_retention.is_empty() {
                default_tombstones()
            } else {
                r.tombstone_retention
            },
            refresh_interval: r.refresh_interval,
            fields: r.fields,
            building: r.building,
        }
    }
}

impl EtlConfig {
    /// Checks values without I/O; every problem, each naming its key.
    pub fn validate(&self) -> Result<(), Vec<String>> {
        let mut p = Vec::new();
        p.extend(self.telemetry.problems("telemetry"));
        if self.etl.group_id.trim().is_empty() {
            p.push("etl.group_id: must not be empty".into());
        }
        if self.etl.dead_letter_topic.trim().is_empty() {
            p.push("etl.dead_letter_topic: must not be empty".into());
        }
        if self.etl.max_batch_docs == 0 {
            p.push("etl.max_batch_docs: must be at least 1".into());
        }
        if self.etl.max_batch_bytes < 1024 {
            p.push("etl.max_batch_bytes: must be at least 1024".into());
        }
        if self.kafka.brokers.trim().is_empty() {
            p.push("kafka.brokers: must name at least one broker".into());
        }
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
        for (i, pl) in self.pipelines.iter().enumerate() {
            let key = format!("pipelines[{i}]");
            let alias = pl.alias();
            if pl.name.is_empty() {
                p.push(format!("{key}.name: must not be empty"));
            }
            if alias.is_empty()
                || alias.starts_with(['_', '-', '+'])
                || alias
                    .chars()
                    .any(|c| c.is_ascii_uppercase() || r#" "*\<|,>/?#:"#.contains(c))
            {
                p.push(format!("{key}.alias: `{alias}` is not a valid index name (lowercase, no spaces or \\/*?\"<>|,#:)"));
            }
            if self.pipelines[..i].iter().any(|o| o.name == pl.name) {
                p.push(format!(
                    "{key}.name: `{}` is used by another pipeline",
                    pl.name
                ));
            }
            if self.pipelines[..i].iter().any(|o| o.alias() == alias) {
                p.push(format!(
                    "{key}.alias: `{alias}` is used by another pipeline"
                ));
            }
            if pl.shards == 0 {
                p.push(format!("{key}.shards: must be at least 1"));
            }
            p.extend(
                sluice_core::mapping::pipeline_problems(
                    &pl.columns,
                    &pl.fields,
                    &pl.refresh_interval,
                )
                .into_iter()
                .map(|problem| format!("{key}.{problem}")),
            );
            if humantime::parse_duration(&pl.tombstone_retention).is_err() {
                p.push(format!(
                    "{key}.tombstone_retention: `{}` is not a duration like 7d or 12h",
                    pl.tombstone_retention
                ));
            }
        }
        if p.is_empty() {
            Ok(())
        } else {
            Err(p)
        }
    }
}
