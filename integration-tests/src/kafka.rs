//! Kafka-side probes shared by the tests and the bench: reading a topic back, the etl
//! group's committed offsets, rewinding the group, and re-publishing an old event.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use rdkafka::admin::{AdminClient, AdminOptions};
use rdkafka::client::DefaultClientContext;
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer};
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::types::RDKafkaErrorCode;
use rdkafka::{ClientConfig, Offset, TopicPartitionList};

use crate::TestCtx;

/// One record read back from a topic.
pub struct Record {
    pub partition: i32,
    pub offset: i64,
    pub key: Vec<u8>,
    pub payload: Vec<u8>,
    /// Producer timestamp, ms since the Unix epoch.
    pub ts_ms: Option<i64>,
}

/// Partition → the offset after its last record.
pub fn ends(records: &[Record]) -> BTreeMap<i32, i64> {
    let mut ends = BTreeMap::new();
    for r in records {
        let end = ends.entry(r.partition).or_insert(0);
        *end = (r.offset + 1).max(*end);
    }
    ends
}

const TIMEOUT: Duration = Duration::from_secs(10);

/// Deletes `topics`; ones that do not exist (never created) are fine.
///
/// Only topics the cluster lists are asked for: librdkafka 2.12 crashes (a NULL topic
/// result) reading Kafka 4's answer to a DeleteTopics request naming a topic it does not
/// know.
pub async fn delete_topics(brokers: &str, topics: &[String]) -> Result<(), String> {
    let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .create()
        .map_err(|e| e.to_string())?;
    let listed = admin
        .inner()
        .fetch_metadata(None, TIMEOUT)
        .map_err(|e| e.to_string())?;
    let names: Vec<&str> = listed
        .topics()
        .iter()
        .map(|t| t.name())
        .filter(|name| topics.iter().any(|t| t == name))
        .collect();
    if names.is_empty() {
        return Ok(());
    }
    let opts = AdminOptions::new().operation_timeout(Some(TIMEOUT));
    let results = admin
        .delete_topics(&names, &opts)
        .await
        .map_err(|e| e.to_string())?;
    let failed: Vec<String> = results
        .into_iter()
        .filter_map(Result::err)
        .filter(|(_, code)| *code != RDKafkaErrorCode::UnknownTopicOrPartition)
        .map(|(topic, code)| format!("{topic}: {code}"))
        .collect();
    if failed.is_empty() {
        Ok(())
    } else {
        Err(failed.join(", "))
    }
}

impl TestCtx {
    /// The change topic of `table`.
    pub fn topic(&self, table: &str) -> String {
        sluice_kafka::TopicConfig::default().rows_topic(&self.instance, &self.db, table)
    }

    /// A librdkafka client's settings for the test's Kafka (its SASL_SSL listener on
    /// the secured lane).
    pub fn kafka_client_config(&self) -> ClientConfig {
        let mut cfg = ClientConfig::new();
        cfg.set("bootstrap.servers", self.kafka_brokers());
        if let Some(s) = crate::secure::Secure::lane() {
            for (k, v) in s.kafka_properties() {
                cfg.set(k, v);
            }
            cfg.set("sasl.password", &s.kafka_password);
        }
        cfg
    }

    /// Sluice's Kafka settings for the test's Kafka.
    pub fn kafka_config(&self) -> sluice_kafka::KafkaConfig {
        match crate::secure::Secure::lane() {
            Some(s) => sluice_kafka::KafkaConfig {
                brokers: self.kafka_brokers(),
                ..s.kafka_config()
            },
            None => sluice_kafka::KafkaConfig::new(self.kafka_brokers()),
        }
    }

    fn consumer(&self, group: &str, extra: &[(&str, &str)]) -> BaseConsumer {
        let mut cfg = self.kafka_client_config();
        cfg.set("group.id", group)
            .set("enable.auto.commit", "false");
        for (k, v) in extra {
            cfg.set(*k, *v);
        }
        cfg.create().expect("Kafka consumer")
    }

    fn partitions(consumer: &BaseConsumer, topic: &str) -> Vec<i32> {
        let md = consumer
            .fetch_metadata(Some(topic), TIMEOUT)
            .expect("topic metadata");
        md.topics()
            .iter()
            .flat_map(|t| t.partitions().iter().map(|p| p.id()))
            .collect()
    }

    /// Every record of `topic` from the start of each partition (read as the center reads
    /// dead letters, `sluice_kafka::read_all`). Returns once at least `at_least` records
    /// came and nothing followed for a second; panics if `within` passes first.
    pub async fn read_topic(&self, topic: &str, at_least: usize, within: Duration) -> Vec<Record> {
        let cfg = self.kafka_config();
        let topics = [topic.to_owned()];
        let deadline = Instant::now() + within;
        crate::eventually(
            &format!("reading {topic}: at least {at_least} records"),
            within,
            || async {
                let left = deadline.saturating_duration_since(Instant::now());
                let bounds = sluice_kafka::ReadBounds::all(Duration::from_secs(1), left);
                let read = sluice_kafka::read_all(&cfg, &topics, bounds)
                    .await
                    .map_err(|e| e.to_string())?;
                if read.messages.len() < at_least {
                    return Err(format!("{} records", read.messages.len()));
                }
                Ok(read
                    .messages
                    .into_iter()
                    .map(|m| Record {
                        partition: m.partition,
                        offset: m.offset,
                        key: m.key.unwrap_or_default(),
                        payload: m.payload,
                        ts_ms: m.ts_ms,
                    })
                    .collect())
            },
        )
        .await
    }

    /// The etl group's committed offset per partition of `topic` (partitions without a
    /// commit are absent).
    pub async fn committed(&self, topic: &str) -> BTreeMap<i32, i64> {
        let consumer = self.consumer(&self.group, &[]);
        let topic = topic.to_owned();
        tokio::task::spawn_blocking(move || {
            let mut tpl = TopicPartitionList::new();
            for p in TestCtx::partitions(&consumer, &topic) {
                tpl.add_partition(&topic, p);
            }
            let committed = consumer
                .committed_offsets(tpl, TIMEOUT)
                .expect("committed offsets");
            committed
                .elements()
                .iter()
                .filter_map(|e| match e.offset() {
                    Offset::Offset(o) => Some((e.partition(), o)),
                    _ => None,
                })
                .collect()
        })
        .await
        .expect("committed offsets")
    }

    /// `Ok` when the etl's group has committed every partition up to `ends` (from
    /// [`ends`] over a [`TestCtx::read_topic`] taken while the topic was quiet).
    pub async fn etl_committed_up_to(
        &self,
        topic: &str,
        ends: &BTreeMap<i32, i64>,
    ) -> Result<(), String> {
        assert!(
            !ends.is_empty(),
            "no partition ends to compare with: the topic was read empty"
        );
        let committed = self.committed(topic).await;
        let behind: Vec<String> = ends
            .iter()
            .filter(|(p, end)| committed.get(p).copied().unwrap_or(0) < **end)
            .map(|(p, end)| format!("partition {p}: committed {:?} of {end}", committed.get(p)))
            .collect();
        if behind.is_empty() {
            Ok(())
        } else {
            Err(behind.join(", "))
        }
    }

    /// High watermarks as the broker reports them (see the module doc before trusting
    /// them; the bench prints them next to what the topic really holds).
    pub async fn watermarks(&self, topic: &str) -> BTreeMap<i32, i64> {
        let consumer = self.consumer(&self.group, &[]);
        let topic = topic.to_owned();
        tokio::task::spawn_blocking(move || {
            TestCtx::partitions(&consumer, &topic)
                .into_iter()
                .map(|p| {
                    (
                        p,
                        consumer
                            .fetch_watermarks(&topic, p, TIMEOUT)
                            .expect("watermarks")
                            .1,
                    )
                })
                .collect()
        })
        .await
        .expect("watermarks")
    }

    /// Moves the (stopped) etl group's committed offsets of `topic` back to the start.
    pub async fn rewind_etl(&self, topic: &str) {
        let consumer = self.consumer(&self.group, &[]);
        let topic = topic.to_owned();
        tokio::task::spawn_blocking(move || {
            let mut tpl = TopicPartitionList::new();
            for p in TestCtx::partitions(&consumer, &topic) {
                let (low, _) = consumer
                    .fetch_watermarks(&topic, p, TIMEOUT)
                    .expect("watermarks");
                tpl.add_partition_offset(&topic, p, Offset::Offset(low))
                    .expect("offset");
            }
            consumer
                .commit(&tpl, CommitMode::Sync)
                .expect("commit rewound offsets");
        })
        .await
        .expect("rewind");
    }

    /// Publishes `payload` again, as a late duplicate delivery.
    pub async fn republish(&self, topic: &str, partition: i32, key: &[u8], payload: &[u8]) {
        let producer: FutureProducer = self.kafka_client_config().create().expect("producer");
        producer
            .send(
                FutureRecord::to(topic)
                    .partition(partition)
                    .key(key)
                    .payload(payload),
                Duration::from_secs(30),
            )
            .await
            .map_err(|(e, _)| e)
            .expect("republish");
    }

    /// A raw producer's ceiling for `records`: how long `producers` producers with the
    /// workers' settings (`sluice_kafka::producer`) take to write them, each a contiguous
    /// share, with their keys and partitions, into a fresh `topic` of as many partitions,
    /// until Kafka acknowledged every one. Nothing is read or encoded on the way: what
    /// is left is the client and the broker. The topic is deleted afterwards.
    pub async fn producer_ceiling(
        &self,
        records: &[Record],
        topic: &str,
        producers: usize,
    ) -> anyhow::Result<Duration> {
        let partitions = records.iter().map(|r| r.partition + 1).max().unwrap_or(1);
        let cfg = sluice_kafka::KafkaConfig {
            partitions,
            ..self.kafka_config()
        };
        sluice_kafka::ensure_topics(&cfg, &[topic.to_owned()]).await?;
        let share = records.len().div_ceil(producers.max(1)).max(1);
        let parts: Vec<_> = records
            .chunks(share)
            .map(|part| Ok((sluice_kafka::producer(&cfg)?, part)))
            .collect::<anyhow::Result<_>>()?;
        let started = Instant::now();
        let writers = parts.iter().map(|(producer, part)| async move {
            let mut deliveries = Vec::with_capacity(part.len());
            for r in *part {
                let to = Some((r.partition, &[][..]));
                let key = (!r.key.is_empty()).then_some(&r.key[..]);
                deliveries
                    .push(sluice_kafka::queue_with(producer, topic, key, &r.payload, to).await?);
            }
            for d in deliveries {
                d.acknowledged().await?;
            }
            anyhow::Ok(())
        });
        let written = futures::future::try_join_all(writers).await;
        let took = started.elapsed();
        // Deleted whether or not every message went: a leftover would be reused next time.
        delete_topics(&self.kafka_brokers(), &[topic.to_owned()])
            .await
            .map_err(anyhow::Error::msg)?;
        written?;
        Ok(took)
    }
}
