//! Kafka clients for Sluice: the producer factory and the etl's [`Feed`] with the settings
//! the invariants need, librdkafka's logs routed into `tracing`, and topic creation. The
//! services use these types, not librdkafka's.

use std::collections::BTreeMap;
use std::time::Duration;

use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::ClientContext;
use rdkafka::config::{ClientConfig, RDKafkaLogLevel};
use rdkafka::consumer::{ConsumerContext, StreamConsumer};
use rdkafka::error::RDKafkaErrorCode;
use rdkafka::producer::FutureProducer;
use serde::Deserialize;

mod access;
pub mod debezium;
mod feed;
mod io;

pub use access::check_access;
pub use feed::{CommitMode, Feed, Partition};

pub use io::{
    partitions, queue, queue_with, read_all, rows_topics, Delivery, GroupOffsets, ReadBack,
    ReadBounds, Received, Refused, SharedProducer, Stored, Tail,
};
pub use rdkafka::error::KafkaError;
use sluice_model::pipeline::shard::topic_char;

/// How to reach Kafka. `properties` are passed to librdkafka as they are (e.g.
/// `security.protocol`, `sasl.mechanisms`) and override Sluice's defaults.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KafkaConfig {
    /// Bootstrap servers, `host:port[,host:port...]`.
    pub brokers: String,
    /// Partitions for topics Sluice creates.
    #[serde(default = "default_partitions")]
    pub partitions: i32,
    /// Replication factor for topics Sluice creates.
    #[serde(default = "default_replication")]
    pub replication_factor: i32,
    #[serde(default)]
    pub properties: BTreeMap<String, String>,
    /// librdkafka's `sasl.password`, kept out of `properties` so it can come from the
    /// environment (`SLUICE_KAFKA__SASL_PASSWORD`, e.g. from a Kubernetes Secret).
    #[serde(default)]
    pub sasl_password: Option<sluice_model::Secret>,
    /// How long a produced message may wait for Kafka's acknowledgement (librdkafka's
    /// `message.timeout.ms`). Past it the message fails: the worker's task stops short of
    /// confirming it and resumes from its confirmed position, so nothing is lost, and
    /// nothing waits on an unreachable Kafka forever. Default 5 minutes.
    #[serde(default = "default_message_timeout", with = "humantime_serde")]
    pub message_timeout: Duration,
}

fn default_message_timeout() -> Duration {
    Duration::from_secs(300)
}

fn default_partitions() -> i32 {
    3
}

fn default_replication() -> i32 {
    1
}

impl KafkaConfig {
    pub fn new(brokers: impl Into<String>) -> Self {
        Self {
            brokers: brokers.into(),
            partitions: default_partitions(),
            replication_factor: default_replication(),
            properties: BTreeMap::new(),
            sasl_password: None,
            message_timeout: default_message_timeout(),
        }
    }

    /// Problems with the values, each naming its key under `prefix`.
    pub fn problems(&self, prefix: &str) -> Vec<String> {
        let mut out = Vec::new();
        if self.brokers.trim().is_empty() {
            out.push(format!("{prefix}.brokers: must name at least one broker"));
        }
        if self.message_timeout < Duration::from_secs(1) {
            out.push(format!(
                "{prefix}.message_timeout: at least 1s (Kafka's client checks it about once a second)"
            ));
        }
        out
    }

    fn client_config(&self) -> ClientConfig {
        let mut c = ClientConfig::new();
        c.set("bootstrap.servers", &self.brokers);
        if let Some(p) = &self.sasl_password {
            c.set("sasl.password", p.expose());
        }
        c.set_log_level(RDKafkaLogLevel::Info);
        c
    }

    fn apply_overrides(&self, c: &mut ClientConfig) {
        for (k, v) in &self.properties {
            c.set(k, v);
        }
    }
}

/// Routes librdkafka's log lines into `tracing` under the `librdkafka` target.
#[derive(Clone, Default)]
pub struct TracingContext;

impl ClientContext for TracingContext {
    fn log(&self, level: RDKafkaLogLevel, fac: &str, log_message: &str) {
        match level {
            RDKafkaLogLevel::Emerg
            | RDKafkaLogLevel::Alert
            | RDKafkaLogLevel::Critical
            | RDKafkaLogLevel::Error => {
                tracing::error!(target: "librdkafka", facility = fac, "{log_message}")
            }
            RDKafkaLogLevel::Warning => {
                tracing::warn!(target: "librdkafka", facility = fac, "{log_message}")
            }
            RDKafkaLogLevel::Notice | RDKafkaLogLevel::Info => {
                tracing::info!(target: "librdkafka", facility = fac, "{log_message}")
            }
            RDKafkaLogLevel::Debug => {
                tracing::debug!(target: "librdkafka", facility = fac, "{log_message}")
            }
        }
    }

    fn error(&self, error: KafkaError, reason: &str) {
        // A reader that asked for end-of-partition notices gets each as an "error" too.
        if matches!(
            error,
            KafkaError::PartitionEOF(_) | KafkaError::Global(RDKafkaErrorCode::PartitionEOF)
        ) {
            tracing::debug!(target: "librdkafka", %error, "{reason}");
            return;
        }
        tracing::warn!(target: "librdkafka", %error, "{reason}");
    }

    /// librdkafka's periodic statistics (consumers only): keeps each assigned
    /// partition's consumer lag for [`consumer_lag`].
    fn stats(&self, statistics: rdkafka::Statistics) {
        let mut lag = CONSUMER_LAG.lock().unwrap_or_else(|e| e.into_inner());
        lag.clear();
        for (topic, t) in statistics.topics {
            for (partition, p) in t.partitions {
                // Partition -1 is librdkafka's internal one; -1 lag means not known yet.
                if partition >= 0 && p.consumer_lag >= 0 {
                    lag.insert((topic.clone(), partition), p.consumer_lag);
                }
            }
        }
    }
}

static CONSUMER_LAG: std::sync::Mutex<BTreeMap<(String, i32), i64>> =
    std::sync::Mutex::new(BTreeMap::new());

/// Messages behind the end of each partition this process consumes, as librdkafka last
/// reported it (every 5 s).
pub fn consumer_lag() -> Vec<(String, i32, i64)> {
    CONSUMER_LAG
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .iter()
        .map(|((t, p), lag)| (t.clone(), *p, *lag))
        .collect()
}

/// Sluice's consumers never join a group (their partitions are assigned by the caller),
/// so no rebalance ever reaches this context.
impl ConsumerContext for TracingContext {}

pub type Producer = FutureProducer<TracingContext>;
pub(crate) type Consumer = StreamConsumer<TracingContext>;

/// An idempotent producer with `acks=all` that retries until `message_timeout`: while
/// Kafka is down, deliveries stay pending and the caller's in-flight bound turns that into
/// backpressure on the binlog reader (README invariant 6); past the timeout they fail,
/// and the caller resumes from what was acknowledged.
///
/// librdkafka's 5 ms linger. Its broker thread wakes once per linger while messages
/// queue, so at a moderate rate a 1 ms linger spent 0.4–0.7 of a core in it (1,000
/// events/s) where 5 ms spends 0.1–0.2, and on a loaded machine that core is what the
/// rest of the path needs: at 1,000 transactions/s on the local stack, commit to
/// searchable took p50 2.4–3.9 s and p99 4.3–6.0 s with 5 ms, against 3.2–4.6 s and
/// 5.2–6.4 s with 1 ms in the same runs; the worker's top rate stays (171k and 183k
/// events/s over a million). A lone change pays it: a light load's p50 is 20 ms, not 15.
pub fn producer(cfg: &KafkaConfig) -> Result<Producer, KafkaError> {
    let mut c = cfg.client_config();
    c.set("enable.idempotence", "true")
        .set("acks", "all")
        .set("max.in.flight.requests.per.connection", "5")
        .set(
            "message.timeout.ms",
            cfg.message_timeout.as_millis().max(1).to_string(),
        )
        .set("linger.ms", "5")
        .set("batch.num.messages", "10000")
        .set("queue.buffering.max.messages", "200000")
        .set("compression.type", "none");
    cfg.apply_overrides(&mut c);
    c.create_with_context(TracingContext)
}

/// The consumer a [`Feed`] wraps.
///
/// Fetches return after at most 10 ms without data (librdkafka waits 500 ms): a broker
/// answers a fetch as soon as it has a byte for it, but some Kafka-protocol brokers hold
/// every fetch for its whole wait, and that wait was nearly all of the commit-to-
/// searchable latency. When idle, that is 100 small fetches a second per broker, which no
/// broker notices; `kafka.properties` can set `fetch.wait.max.ms` back.
///
/// Read-ahead is bounded at 16 MiB (librdkafka's default is 64 MiB of prefetched messages,
/// up to 50 MiB per fetch): a backlog, such as one 100,000-row transaction, then costs the
/// etl that much memory at most, and the etl applies far less than 16 MiB a second.
fn consumer(cfg: &KafkaConfig, group: &str) -> Result<Consumer, KafkaError> {
    let mut c = cfg.client_config();
    c.set("group.id", group)
        .set("fetch.wait.max.ms", "10")
        .set("fetch.min.bytes", "1")
        .set("queued.max.messages.kbytes", "16384")
        .set("fetch.max.bytes", "8388608")
        .set("enable.auto.commit", "false")
        .set("enable.auto.offset.store", "false")
        .set("auto.offset.reset", "earliest")
        .set("topic.metadata.refresh.interval.ms", "5000")
        .set("statistics.interval.ms", "5000");
    cfg.apply_overrides(&mut c);
    c.create_with_context(TracingContext)
}

/// A client that asks the cluster whether its brokers answer ([`Probe::brokers`]), kept
/// between probes so that a broker down is one reconnecting client, not a new one per
/// probe.
pub struct Probe {
    admin: std::sync::Arc<AdminClient<TracingContext>>,
}

impl Probe {
    pub fn new(cfg: &KafkaConfig) -> Result<Probe, KafkaError> {
        let mut c = cfg.client_config();
        cfg.apply_overrides(&mut c);
        Ok(Probe {
            admin: std::sync::Arc::new(c.create_with_context(TracingContext)?),
        })
    }

    /// How many brokers the cluster's metadata names, asked of a broker now (a Metadata
    /// request, not librdkafka's cache); an error when none answers within `within`.
    pub async fn brokers(&self, within: Duration) -> Result<usize, KafkaError> {
        let admin = self.admin.clone();
        tokio::task::spawn_blocking(move || {
            admin
                .inner()
                .fetch_metadata(None, within)
                .map(|m| m.brokers().len())
        })
        .await
        .map_err(|_| KafkaError::Canceled)?
    }
}

/// Creates the topics that do not exist yet, with the configured partitions and
/// replication. Existing topics are left as they are.
pub async fn ensure_topics(cfg: &KafkaConfig, topics: &[String]) -> Result<(), KafkaError> {
    if topics.is_empty() {
        return Ok(());
    }
    let mut c = cfg.client_config();
    cfg.apply_overrides(&mut c);
    let admin: AdminClient<TracingContext> = c.create_with_context(TracingContext)?;
    let new: Vec<NewTopic<'_>> = topics
        .iter()
        .map(|t| {
            NewTopic::new(
                t,
                cfg.partitions,
                TopicReplication::Fixed(cfg.replication_factor),
            )
        })
        .collect();
    let opts = AdminOptions::new().operation_timeout(Some(Duration::from_secs(30)));
    for result in admin.create_topics(&new, &opts).await? {
        match result {
            Ok(_) | Err((_, RDKafkaErrorCode::TopicAlreadyExists)) => {}
            Err((topic, code)) => {
                return Err(KafkaError::AdminOp(code))
                    .inspect_err(|_| tracing::error!(%topic, ?code, "cannot create topic"));
            }
        }
    }
    Ok(())
}

/// Renders a topic template: `{instance}`, `{db}` and `{table}` are replaced, and any
/// character Kafka does not allow in a topic name becomes `_`.
pub fn render_topic(template: &str, instance: &str, db: &str, table: &str) -> String {
    template
        .replace("{instance}", instance)
        .replace("{db}", db)
        .replace("{table}", table)
        .chars()
        .map(|c| if topic_char(c) { c } else { '_' })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_topics_of_a_sharded_table_are_those_of_its_shards() {
        let cfg: TopicConfig = serde_json::from_str("{}").unwrap();
        let mut spec = sluice_model::PipelineSpec::table("o", "m.1", r"^db_\d+$", r"orders_\d+");
        spec.sharded = true;
        let existing = [
            cfg.rows_topic("m.1", "db_0", "orders_07"),
            cfg.rows_topic("m.1", "db_0", "orders_07_old"),
            cfg.rows_topic("mx1", "db_0", "orders_07"),
            cfg.rows_topic("m.1", "shop", "orders_1"),
            cfg.rows_topic("m.1", "db_12", "orders_3"),
        ]
        .map(String::from);
        let found = cfg.rows_topics(&spec, &existing);
        // Anchors in a pattern mean what they mean in the table filter; the instance's
        // dot is literal.
        assert_eq!(found, [existing[0].clone(), existing[4].clone()]);
        let one_topic: TopicConfig =
            serde_json::from_str(r#"{"rows": "cdc.{instance}.rows"}"#).unwrap();
        let all = ["cdc.m.1.rows".to_owned(), "cdc.other.rows".to_owned()];
        assert_eq!(
            one_topic.rows_topics(&spec, &all),
            ["cdc.m.1.rows"],
            "a template without the table"
        );
    }

    #[test]
    fn topic_template_renders_and_sanitises() {
        assert_eq!(
            render_topic(
                "sluice.{instance}.{db}.{table}",
                "m1",
                "shop",
                "order items"
            ),
            "sluice.m1.shop.order_items"
        );
    }

    #[test]
    fn every_build_of_a_pipeline_shares_one_topic() {
        let t = TopicConfig::default();
        assert_eq!(t.build_topic("shop"), "sluice.build.shop");
        assert!(t.problems("topics").is_empty());
        let per_version = TopicConfig {
            build: "sluice.build.{pipeline}.v{version}".into(),
            ..TopicConfig::default()
        };
        let problems = per_version.problems("topics");
        assert_eq!(problems.len(), 1, "{problems:?}");
        assert!(problems[0].starts_with("topics.build: "), "{problems:?}");
        assert!(problems[0].contains("{version} is no longer used"));
    }
}

/// Topic names, as templates over `{instance}`, `{db}` and `{table}` (the builds' over
/// `{pipeline}`). Shared by the worker (which publishes) and the etl
/// (which subscribes), so both agree by construction.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TopicConfig {
    /// Row changes of one table. Default `sluice.{instance}.{db}.{table}`.
    #[serde(default = "default_rows_topic")]
    pub rows: String,
    /// DDL statements of one instance (schema history). Default `sluice.{instance}.schema`.
    #[serde(default = "default_schema_topic")]
    pub schema: String,
    /// Binlog events the worker could not decode. Default `sluice.{instance}.dlq`.
    #[serde(default = "default_source_dlq_topic")]
    pub source_dead_letter: String,
    /// Events the etl could not apply, each with the reason; `sluicectl dlq` lists and
    /// replays them. Default `sluice.dlq`.
    #[serde(default = "default_dead_letter_topic")]
    pub dead_letter: String,
    /// The documents the builds of a pipeline's index versions read, and their catch-up
    /// markers; each carries its version. One topic per pipeline, which the etl stays
    /// subscribed to, so a build starts without a consumer-group rebalance. Default
    /// `sluice.build.{pipeline}`.
    #[serde(default = "default_build_topic")]
    pub build: String,
    /// The changes of `delayed` relations, from the etl to the leader, which records them
    /// for the delayed job. Default `sluice.delayed`.
    #[serde(default = "default_delayed_topic")]
    pub delayed: String,
}

fn default_rows_topic() -> String {
    "sluice.{instance}.{db}.{table}".into()
}

fn default_schema_topic() -> String {
    "sluice.{instance}.schema".into()
}

fn default_source_dlq_topic() -> String {
    "sluice.{instance}.dlq".into()
}

fn default_dead_letter_topic() -> String {
    "sluice.dlq".into()
}

fn default_build_topic() -> String {
    "sluice.build.{pipeline}".into()
}

fn default_delayed_topic() -> String {
    "sluice.delayed".into()
}

impl Default for TopicConfig {
    fn default() -> Self {
        Self {
            rows: default_rows_topic(),
            schema: default_schema_topic(),
            source_dead_letter: default_source_dlq_topic(),
            dead_letter: default_dead_letter_topic(),
            build: default_build_topic(),
            delayed: default_delayed_topic(),
        }
    }
}

impl TopicConfig {
    pub fn rows_topic(&self, instance: &str, db: &str, table: &str) -> String {
        render_topic(&self.rows, instance, db, table)
    }

    /// The change topics of `spec`'s tables: each table's, and those of `existing` (the
    /// cluster's topics) that are a sharded table's shards' (its shards' so far).
    pub fn rows_topics(
        &self,
        spec: &sluice_model::PipelineSpec,
        existing: &[String],
    ) -> Vec<String> {
        let mut out: Vec<String> = (spec.plain_tables().into_iter())
            .map(|(db, table)| self.rows_topic(&spec.source, &db, &table))
            .collect();
        // A pattern that does not compile was refused with the spec.
        let shards: Vec<_> = (spec.patterns().iter())
            .filter_map(|p| p.matcher().ok())
            .collect();
        if shards.is_empty() {
            return out;
        }
        let read = self.rows_topic_parts(&spec.source);
        let shard = |topic: &&String| {
            read(topic).is_some_and(|(db, table)| shards.iter().any(|s| s.matches_parts(db, table)))
        };
        let found: Vec<String> = existing.iter().filter(shard).cloned().collect();
        for topic in found {
            if !out.contains(&topic) {
                out.push(topic);
            }
        }
        out
    }

    /// Reads a topic name the rows template could have rendered for `instance`: its
    /// database and table as the name writes them (`None` for one the template does not
    /// hold); `None` when the template cannot have rendered it. The shortest database
    /// that fits is taken, so a database name holding a `.` is not told apart.
    fn rows_topic_parts(
        &self,
        instance: &str,
    ) -> impl Fn(&str) -> Option<(Option<&str>, Option<&str>)> {
        let mut re = String::from("^");
        let mut groups = Vec::new();
        let mut rest = self.rows.as_str();
        while !rest.is_empty() {
            let next = ["{instance}", "{db}", "{table}"]
                .iter()
                .filter_map(|p| rest.find(p).map(|at| (at, *p)))
                .min();
            let Some((at, placeholder)) = next else {
                re.push_str(&regex::escape(&render_topic(rest, "", "", "")));
                break;
            };
            re.push_str(&regex::escape(&render_topic(&rest[..at], "", "", "")));
            if placeholder == "{instance}" {
                re.push_str(&regex::escape(&render_topic(instance, "", "", "")));
            } else {
                re.push_str("(.+?)");
                groups.push(placeholder);
            }
            rest = &rest[at + placeholder.len()..];
        }
        re.push('$');
        let re = regex::Regex::new(&re).expect("escaped text and plain groups make a regex");
        move |topic: &str| {
            let c = re.captures(topic)?;
            let part = |name: &str| {
                let i = groups.iter().position(|g| *g == name)?;
                c.get(i + 1).map(|m| m.as_str())
            };
            Some((part("{db}"), part("{table}")))
        }
    }

    pub fn schema_topic(&self, instance: &str) -> String {
        render_topic(&self.schema, instance, "", "")
    }

    pub fn source_dead_letter_topic(&self, instance: &str) -> String {
        render_topic(&self.source_dead_letter, instance, "", "")
    }

    /// The topic of the builds of `pipeline`'s index versions.
    pub fn build_topic(&self, pipeline: &str) -> String {
        render_topic(&self.build.replace("{pipeline}", pipeline), "", "", "")
    }

    /// Problems with the templates, each naming its key under `prefix`.
    pub fn problems(&self, prefix: &str) -> Vec<String> {
        let mut out = Vec::new();
        if !self.rows.contains("{table}") {
            out.push(format!(
                "{prefix}.rows: `{}` must contain {{table}} so each table gets its own topic",
                self.rows
            ));
        }
        if !self.build.contains("{pipeline}") {
            out.push(format!(
                "{prefix}.build: `{}` must contain {{pipeline}} so each pipeline's builds get their own topic",
                self.build
            ));
        }
        if self.build.contains("{version}") {
            out.push(format!(
                "{prefix}.build: `{}`: {{version}} is no longer used; every build of a pipeline shares one topic (its documents carry their version), so that starting a build changes no subscription (write `sluice.build.{{pipeline}}`)",
                self.build
            ));
        }
        for (key, t) in [
            ("rows", &self.rows),
            ("schema", &self.schema),
            ("source_dead_letter", &self.source_dead_letter),
            ("dead_letter", &self.dead_letter),
            ("build", &self.build),
        ] {
            if t.trim().is_empty() {
                out.push(format!("{prefix}.{key}: must not be empty"));
            }
        }
        out
    }
}
