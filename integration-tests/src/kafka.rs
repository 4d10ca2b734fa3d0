//! Kafka-side probes: how far the etl's group has committed, rewinding it, and
//! re-publishing an old event.

use std::time::Duration;

use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer};
use rdkafka::message::Message;
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::{ClientConfig, Offset, TopicPartitionList};

use crate::TestCtx;

impl TestCtx {
    /// The change topic of `table`.
    pub fn topic(&self, table: &str) -> String {
        sluice_kafka::TopicConfig::default().rows_topic(&self.instance, &self.db, table)
    }

    fn group_consumer(&self) -> BaseConsumer {
        ClientConfig::new()
            .set("bootstrap.servers", &self.stack.kafka)
            .set("group.id", &self.group)
            .set("enable.auto.commit", "false")
            .create()
            .expect("Kafka consumer")
    }

    fn partitions(&self, consumer: &BaseConsumer, topic: &str) -> Vec<i32> {
        let md = consumer
            .fetch_metadata(Some(topic), Duration::from_secs(10))
            .expect("topic metadata");
        md.topics()[0].partitions().iter().map(|p| p.id()).collect()
    }

    /// `Ok` when the etl's group has committed every partition of `topic` up to its end.
    ///
    /// Ends are found by reading each partition to the end rather than from its high
    /// watermark: tansu 0.6 reports a high watermark of 1 for partitions written by an
    /// idempotent librdkafka 2.12 producer, which would make this probe pass at once.
    pub async fn etl_caught_up(&self, topic: &str) -> Result<(), String> {
        let mut ends: std::collections::BTreeMap<i32, i64> = std::collections::BTreeMap::new();
        for (p, offset, _, _) in self.read_topic(topic).await {
            ends.insert(p, offset + 1);
        }
        let consumer = self.group_consumer();
        let topic = topic.to_owned();
        tokio::task::spawn_blocking(move || {
            let mut tpl = TopicPartitionList::new();
            for p in ends.keys() {
                tpl.add_partition(&topic, *p);
            }
            let committed = consumer
                .committed_offsets(tpl, Duration::from_secs(10))
                .map_err(|e| e.to_string())?;
            for (p, end) in ends {
                let at = match committed.find_partition(&topic, p).map(|e| e.offset()) {
                    Some(Offset::Offset(o)) => o,
                    _ => 0,
                };
                if at < end {
                    return Err(format!("partition {p}: committed {at} of {end}"));
                }
            }
            Ok(())
        })
        .await
        .expect("probe")
    }

    /// Moves the (stopped) etl group's committed offsets of `topic` back to the start.
    pub async fn rewind_etl(&self, topic: &str) {
        let consumer = self.group_consumer();
        let topic = topic.to_owned();
        let parts = self.partitions(&consumer, &topic);
        tokio::task::spawn_blocking(move || {
            let mut tpl = TopicPartitionList::new();
            for p in parts {
                let (low, _) = consumer
                    .fetch_watermarks(&topic, p, Duration::from_secs(10))
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

    /// Every (partition, offset, key, payload) currently in `topic`, read from the start
    /// of each partition until it stays idle (see [`TestCtx::etl_caught_up`] on why not
    /// up to the high watermark).
    pub async fn read_topic(&self, topic: &str) -> Vec<(i32, i64, Vec<u8>, Vec<u8>)> {
        let consumer: BaseConsumer = ClientConfig::new()
            .set("bootstrap.servers", &self.stack.kafka)
            .set("group.id", format!("reader-{}", crate::unique("")))
            .set("enable.auto.commit", "false")
            .create()
            .expect("Kafka consumer");
        let topic = topic.to_owned();
        let parts = self.partitions(&consumer, &topic);
        tokio::task::spawn_blocking(move || {
            let mut tpl = TopicPartitionList::new();
            for p in &parts {
                tpl.add_partition_offset(&topic, *p, Offset::Beginning)
                    .expect("offset");
            }
            consumer.assign(&tpl).expect("assign");
            let mut out = Vec::new();
            let mut idle = 0;
            while idle < 3 {
                match consumer.poll(Duration::from_millis(500)) {
                    Some(Ok(m)) => {
                        idle = 0;
                        out.push((
                            m.partition(),
                            m.offset(),
                            m.key().unwrap_or_default().to_vec(),
                            m.payload().unwrap_or_default().to_vec(),
                        ));
                    }
                    Some(Err(e)) => {
                        // End-of-partition and transient broker notices are not data.
                        tracing::debug!(%topic, error = %e, "reading");
                        idle += 1;
                    }
                    None => idle += 1,
                }
            }
            out
        })
        .await
        .expect("read topic")
    }

    /// Publishes `payload` again, as a late duplicate delivery.
    pub async fn republish(&self, topic: &str, partition: i32, key: &[u8], payload: &[u8]) {
        let producer: FutureProducer = ClientConfig::new()
            .set("bootstrap.servers", &self.stack.kafka)
            .create()
            .expect("producer");
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
}
