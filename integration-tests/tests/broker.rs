//! The stack's Kafka broker keeps the promise of a fetch that the etl's no-loss rule
//! stands on (README, "Running against external services"): a consumer resuming inside a
//! producer's record batch gets the rest of that batch. Unpatched tansu breaks it, and
//! every other end-to-end test would then lose changes now and then, far from the cause;
//! this test says so at once. (The patch's other half, a fetch stopping at a batch still
//! being stored, comes from reading tansu's produce path; no test here could make that
//! window show.)

use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer};
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::{ClientConfig, Message, Offset, TopicPartitionList};
use sluice_integration_tests::{unique, TestCtx};

const WITHIN: Duration = Duration::from_secs(60);

fn producer(brokers: &str, linger_ms: &str) -> FutureProducer {
    ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .set("linger.ms", linger_ms)
        .set("enable.idempotence", "true")
        .create()
        .expect("producer")
}

fn consumer(brokers: &str, group: &str) -> BaseConsumer {
    ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .set("group.id", group)
        .set("enable.auto.commit", "false")
        .set("auto.offset.reset", "earliest")
        .set("fetch.wait.max.ms", "10")
        .create()
        .expect("consumer")
}

async fn topic(ctx: &TestCtx) -> String {
    let topic = unique("sluice.it.broker-");
    sluice_kafka::ensure_topics(
        &sluice_kafka::KafkaConfig::new(ctx.kafka_brokers()),
        std::slice::from_ref(&topic),
    )
    .await
    .expect("create the topic");
    topic
}

/// Sends `count` records to partition 0 at once (so they share record batches), numbered
/// from `first`; returns once every one is acknowledged.
async fn send(producer: &FutureProducer, topic: &str, first: u32, count: u32) {
    let sends = (first..first + count).map(|n| {
        let payload = n.to_string();
        async move {
            producer
                .send(
                    FutureRecord::<(), _>::to(topic)
                        .partition(0)
                        .payload(&payload),
                    Duration::from_secs(30),
                )
                .await
                .map_err(|(e, _)| e)
                .expect("produce")
        }
    });
    futures::future::join_all(sends).await;
}

/// Polls partition 0 of `topic` from `from` until `want` records came, or the deadline;
/// returns (offset, payload) of each.
fn read(consumer: &BaseConsumer, topic: &str, from: Offset, want: usize) -> Vec<(i64, String)> {
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition_offset(topic, 0, from).expect("offset");
    consumer.assign(&tpl).expect("assign");
    let deadline = Instant::now() + WITHIN;
    let mut got = Vec::new();
    while got.len() < want && Instant::now() < deadline {
        if let Some(m) = consumer.poll(Duration::from_millis(200)) {
            let m = m.expect("a record");
            let payload = String::from_utf8_lossy(m.payload().unwrap_or_default()).into_owned();
            got.push((m.offset(), payload));
        }
    }
    got
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_consumer_resuming_inside_a_record_batch_gets_the_rest_of_it() {
    let ctx = TestCtx::new("broker_batch").await;
    let topic = topic(&ctx).await;
    // Ten records lingered into one batch, then a committed offset in its middle.
    send(&producer(&ctx.kafka_brokers(), "200"), &topic, 0, 10).await;
    let group = unique("broker-batch-");
    let brokers = ctx.kafka_brokers();
    let t = topic.clone();
    let got = tokio::task::spawn_blocking(move || {
        let consumer = consumer(&brokers, &group);
        let mut at = TopicPartitionList::new();
        at.add_partition_offset(&t, 0, Offset::Offset(7))
            .expect("offset");
        consumer.commit(&at, CommitMode::Sync).expect("commit 7");
        read(&consumer, &t, Offset::Stored, 3)
    })
    .await
    .expect("reader");
    let offsets: Vec<i64> = got.iter().map(|(o, _)| *o).collect();
    assert_eq!(
        offsets,
        vec![7, 8, 9],
        "resuming at offset 7 of a 10-record batch must yield 7, 8 and 9 (the stack's \
         broker must be the patched tansu deploy/install.sh builds)"
    );
    ctx.cleanup().await;
}
