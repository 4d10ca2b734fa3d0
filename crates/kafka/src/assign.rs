//! A consumer's partitions set by the caller, without a consumer group's rebalances: the
//! etl decides which partitions it consumes (its members agree through ZooKeeper) and
//! commits its offsets to the group all the same, so a restart resumes where it stopped.

use std::collections::BTreeSet;
use std::time::Duration;

use rdkafka::consumer::Consumer as _;
use rdkafka::error::KafkaError;
use rdkafka::{Offset, TopicPartitionList};

use crate::Consumer;

/// A topic's partition: the topic and the partition's number.
pub type Partition = (String, i32);

/// Every partition of those of `topics` that exist, from the cluster's metadata. Blocks
/// for one metadata request (the consumer's own connection).
pub fn topic_partitions(
    consumer: &Consumer,
    topics: &BTreeSet<String>,
) -> Result<BTreeSet<Partition>, KafkaError> {
    let fetch = || consumer.fetch_metadata(None, Duration::from_secs(10));
    let md = match tokio::runtime::Handle::try_current().map(|h| h.runtime_flavor()) {
        Ok(tokio::runtime::RuntimeFlavor::MultiThread) => tokio::task::block_in_place(fetch),
        _ => fetch(),
    }?;
    Ok(md
        .topics()
        .iter()
        .filter(|t| topics.contains(t.name()) && t.error().is_none())
        .flat_map(|t| t.partitions().iter().map(|p| (t.name().to_owned(), p.id())))
        .collect())
}

/// Makes the consumer's partitions `wanted`. Partitions gained start from the group's
/// committed offset (`auto.offset.reset` where there is none); partitions kept go on
/// from where they are, without a pause; partitions given up stop.
pub fn reassign(
    consumer: &Consumer,
    held: &mut BTreeSet<Partition>,
    wanted: &BTreeSet<Partition>,
) -> Result<(), KafkaError> {
    let list = |parts: &[Partition]| -> Result<TopicPartitionList, KafkaError> {
        let mut tpl = TopicPartitionList::new();
        for (topic, partition) in parts {
            tpl.add_partition_offset(topic, *partition, Offset::Stored)?;
        }
        Ok(tpl)
    };
    let gone: Vec<Partition> = held.difference(wanted).cloned().collect();
    let gained: Vec<Partition> = wanted.difference(held).cloned().collect();
    if !gone.is_empty() {
        consumer.incremental_unassign(&list(&gone)?)?;
        tracing::info!(partitions = ?gone, "partitions given up");
        for p in &gone {
            held.remove(p);
        }
    }
    if !gained.is_empty() {
        consumer.incremental_assign(&list(&gained)?)?;
        tracing::info!(partitions = ?gained, "partitions taken");
        held.extend(gained);
    }
    Ok(())
}
