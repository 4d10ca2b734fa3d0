//! A consumer whose partitions the caller sets, without a consumer group's rebalances: the
//! etl decides which partitions it consumes (its members agree through ZooKeeper) and
//! commits its offsets to the group all the same, so a restart resumes where it stopped.

use std::collections::BTreeSet;
use std::sync::Mutex;
use std::time::Duration;

use futures::FutureExt as _;
use rdkafka::consumer::Consumer as _;
use rdkafka::error::KafkaError;
use rdkafka::{Offset, TopicPartitionList};
use sluice_model::RetryPolicy;

use crate::{Consumer, KafkaConfig, Received};

/// A topic's partition: the topic and the partition's number.
pub type Partition = (String, i32);

/// Whether a commit waits for the group coordinator's answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CommitMode {
    /// Sent; the answer is only logged. What the loop uses while it runs.
    Async,
    /// Waits for the answer: the last commit before a process exits.
    Sync,
}

/// The consumer of the partitions the caller gives it ([`Feed::share`]; it never joins
/// its group, so no rebalance ever stops it), committing to the group only what the
/// caller says: offsets of messages that were applied or dead-lettered.
pub struct Feed {
    consumer: Consumer,
    /// Only [`Feed::share`] changes it; a lock so that the feed can be shared while
    /// batches commit.
    held: Mutex<BTreeSet<Partition>>,
}

impl Feed {
    /// A feed committing to `group`, consuming nothing until it is given partitions.
    pub fn new(cfg: &KafkaConfig, group: &str) -> Result<Feed, KafkaError> {
        Ok(Feed {
            consumer: crate::consumer(cfg, group)?,
            held: Mutex::default(),
        })
    }

    /// The next message of the partitions held, once there is one.
    pub async fn recv(&self) -> Result<Received, KafkaError> {
        self.consumer.recv().await.map(|m| Received::of(&m))
    }

    /// The next message if one is already buffered.
    pub fn buffered(&self) -> Option<Result<Received, KafkaError>> {
        self.recv().now_or_never()
    }

    /// The partitions this feed consumes.
    pub fn held(&self) -> BTreeSet<Partition> {
        self.lock_held().clone()
    }

    fn lock_held(&self) -> std::sync::MutexGuard<'_, BTreeSet<Partition>> {
        self.held.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Makes the partitions consumed those of `topics` (those that exist) that `owns`
    /// picks. Partitions gained start from the group's committed offset (the earliest
    /// where there is none); partitions kept go on from where they are, without a pause;
    /// partitions given up stop here. Blocks for one metadata request when `topics` is not
    /// empty, and for the committed offsets of the partitions gained.
    ///
    /// Returns the topics of `topics` the cluster's metadata does not show yet (a topic
    /// just created reaches every broker's metadata a moment later): the caller shares
    /// again soon, or that topic's messages wait for its next look.
    pub fn share(
        &self,
        topics: &BTreeSet<String>,
        owns: impl Fn(&str, i32) -> bool,
    ) -> Result<Vec<String>, KafkaError> {
        let (found, missing) = if topics.is_empty() {
            (BTreeSet::new(), Vec::new())
        } else {
            self.partitions_of(topics)?
        };
        let wanted = found
            .into_iter()
            .filter(|(topic, partition)| owns(topic, *partition))
            .collect();
        self.reassign(&wanted)?;
        Ok(missing)
    }

    /// Commits, for each `(topic, partition, offset)`, `offset` as the next message to
    /// consume. An error (the coordinator unreachable, say) loses nothing: the messages
    /// after the last commit that got through are consumed again.
    pub fn commit<'a>(
        &self,
        next: impl IntoIterator<Item = (&'a str, i32, i64)>,
        mode: CommitMode,
    ) -> Result<(), KafkaError> {
        let mut tpl = TopicPartitionList::new();
        for (topic, partition, offset) in next {
            tpl.add_partition_offset(topic, partition, Offset::Offset(offset))?;
        }
        let mode = match mode {
            CommitMode::Async => rdkafka::consumer::CommitMode::Async,
            CommitMode::Sync => rdkafka::consumer::CommitMode::Sync,
        };
        self.consumer.commit(&tpl, mode)
    }

    /// The names of every topic the cluster's metadata shows.
    pub fn topic_names(&self) -> Result<Vec<String>, KafkaError> {
        blocking(|| crate::io::topic_names_of(self.consumer.client()))
    }

    /// Every partition of those of `topics` that exist, from the cluster's metadata, and
    /// the topics of `topics` it does not show (or shows with an error, such as no leader
    /// yet).
    fn partitions_of(
        &self,
        topics: &BTreeSet<String>,
    ) -> Result<(BTreeSet<Partition>, Vec<String>), KafkaError> {
        let md = blocking(|| self.consumer.fetch_metadata(None, Duration::from_secs(10)))?;
        let shown: Vec<_> = md
            .topics()
            .iter()
            .filter(|t| topics.contains(t.name()) && t.error().is_none())
            .collect();
        let missing = topics
            .iter()
            .filter(|name| !shown.iter().any(|t| t.name() == name.as_str()))
            .cloned()
            .collect();
        let partitions = shown
            .iter()
            .flat_map(|t| t.partitions().iter().map(|p| (t.name().to_owned(), p.id())))
            .collect();
        Ok((partitions, missing))
    }

    fn reassign(&self, wanted: &BTreeSet<Partition>) -> Result<(), KafkaError> {
        let mut held = self.lock_held();
        let gone: Vec<Partition> = held.difference(wanted).cloned().collect();
        let gained: Vec<Partition> = wanted.difference(&held).cloned().collect();
        if !gone.is_empty() {
            let mut tpl = TopicPartitionList::new();
            for (topic, partition) in &gone {
                tpl.add_partition(topic, *partition);
            }
            self.consumer.incremental_unassign(&tpl)?;
            tracing::info!(partitions = ?gone, "partitions given up");
            for p in &gone {
                held.remove(p);
            }
        }
        if !gained.is_empty() {
            let start = blocking(|| self.committed(&gained))?;
            self.consumer.incremental_assign(&start)?;
            tracing::info!(partitions = ?gained, "partitions taken");
            held.extend(gained);
        }
        Ok(())
    }

    /// Where each of `parts` starts: the group's committed offset, or the earliest one
    /// where the group has none (`auto.offset.reset`).
    ///
    /// Asked of the group coordinator before assigning, not left to librdkafka (an
    /// assignment at `Offset::Stored`): a coordinator that is still loading the group's
    /// offsets (a broker just started) answers NOT_COORDINATOR or
    /// COORDINATOR_LOAD_IN_PROGRESS once, and librdkafka 2.12 left the partitions of an
    /// assignment that met it waiting for offsets for good. Here such an answer is asked
    /// again, up to [`COMMITTED_WITHIN`].
    fn committed(&self, parts: &[Partition]) -> Result<TopicPartitionList, KafkaError> {
        let mut tpl = TopicPartitionList::new();
        for (topic, partition) in parts {
            tpl.add_partition(topic, *partition);
        }
        let deadline = std::time::Instant::now() + COMMITTED_WITHIN;
        let mut backoff = OFFSETS_RETRY.backoff();
        let committed = loop {
            match self
                .consumer
                .committed_offsets(tpl.clone(), Duration::from_secs(10))
            {
                Ok(c) => break c,
                Err(e) if std::time::Instant::now() < deadline => {
                    tracing::info!(error = %e, "the group's committed offsets are not available yet; asking again");
                    std::thread::sleep(backoff.next_pause());
                }
                Err(e) => return Err(e),
            }
        };
        let mut start = TopicPartitionList::new();
        for e in committed.elements() {
            let offset = match e.offset() {
                o @ Offset::Offset(_) => o,
                _ => Offset::Beginning,
            };
            start.add_partition_offset(e.topic(), e.partition(), offset)?;
        }
        Ok(start)
    }
}

/// How long [`Feed::committed`] asks a coordinator that is not ready.
const COMMITTED_WITHIN: Duration = Duration::from_secs(60);

/// The pauses between those questions.
const OFFSETS_RETRY: RetryPolicy =
    RetryPolicy::new(Duration::from_millis(100), Duration::from_secs(2));

/// Runs a blocking librdkafka call, off the async workers when on a multi-threaded runtime.
fn blocking<T>(f: impl FnOnce() -> T) -> T {
    match tokio::runtime::Handle::try_current().map(|h| h.runtime_flavor()) {
        Ok(tokio::runtime::RuntimeFlavor::MultiThread) => tokio::task::block_in_place(f),
        _ => f(),
    }
}
