//! Sending a message and awaiting Kafka's acknowledgement, and reading topics back, without
//! the caller touching librdkafka's types.

use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, Consumer as _};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{Header, Message as _, OwnedHeaders};
use rdkafka::producer::{DeliveryFuture, FutureRecord};
use rdkafka::{Offset, TopicPartitionList};

use crate::{KafkaConfig, Producer};

/// The producer a process shares, replaced when librdkafka declares it unusable: an
/// idempotent producer is fenced for good when messages timed out and the broker would
/// not take its bumped epoch.
#[derive(Clone)]
pub struct SharedProducer {
    cfg: KafkaConfig,
    current: std::sync::Arc<std::sync::Mutex<Producer>>,
}

impl SharedProducer {
    pub fn new(cfg: &KafkaConfig) -> Result<Self, KafkaError> {
        Ok(Self {
            cfg: cfg.clone(),
            current: std::sync::Arc::new(std::sync::Mutex::new(crate::producer(cfg)?)),
        })
    }

    /// The producer to send with now.
    pub fn get(&self) -> Producer {
        self.current
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Replaces the producer after `failure`, when Kafka refused one of its messages or
    /// the producer hit a fatal error: an idempotent producer whose messages timed out
    /// moves to a new epoch, which not every broker takes, and may never deliver again.
    /// A new one starts clean; what the old one still holds fails, and is read again by
    /// its sender. Says why, when it did.
    pub fn renew_after(&self, failure: &(dyn std::error::Error + 'static)) -> Option<String> {
        use rdkafka::producer::Producer as _;
        let mut current = self.current.lock().unwrap_or_else(|e| e.into_inner());
        let why = match current.client().fatal_error() {
            Some((code, why)) => format!("{why} ({code:?})"),
            None => {
                let mut cause = Some(failure);
                let refused = std::iter::from_fn(|| {
                    let c = cause?;
                    cause = c.source();
                    Some(c)
                })
                .find_map(|c| c.downcast_ref::<Refused>())?;
                refused.to_string()
            }
        };
        match crate::producer(&self.cfg) {
            Ok(fresh) => *current = fresh,
            Err(e) => tracing::error!(error = %e, "cannot create a new Kafka producer"),
        }
        Some(why)
    }

    /// Waits up to `within` for everything queued to be delivered.
    pub async fn flush(&self, within: Duration) -> Result<(), KafkaError> {
        use rdkafka::producer::Producer as _;
        let producer = self.get();
        tokio::task::spawn_blocking(move || producer.flush(within))
            .await
            .map_err(|_| KafkaError::Canceled)?
    }
}

/// A message queued in the producer; [`Delivery::acknowledged`] waits for Kafka's answer.
#[must_use = "a message is only safe once Kafka acknowledged it"]
pub struct Delivery {
    future: DeliveryFuture,
}

/// Where Kafka stored a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stored {
    pub partition: i32,
    pub offset: i64,
}

/// Kafka did not take a message.
#[derive(Debug, thiserror::Error)]
#[error("Kafka did not take a message for {topic}: {error}")]
pub struct Refused {
    pub topic: String,
    #[source]
    pub error: KafkaError,
}

impl Delivery {
    /// Kafka's answer: where the message is, or why it was refused.
    pub async fn acknowledged(self) -> Result<Stored, Refused> {
        match self.future.await {
            Ok(Ok(d)) => Ok(Stored {
                partition: d.partition,
                offset: d.offset,
            }),
            Ok(Err((error, msg))) => Err(Refused {
                topic: msg.topic().to_owned(),
                error,
            }),
            Err(_) => Err(Refused {
                topic: "?".into(),
                error: KafkaError::Canceled,
            }),
        }
    }
}

/// Queues a message for `topic`. A full local queue is backpressure: this waits for room
/// rather than failing.
pub async fn queue(
    producer: &Producer,
    topic: &str,
    key: Option<&[u8]>,
    payload: &[u8],
) -> Result<Delivery, KafkaError> {
    queue_with(producer, topic, key, payload, None).await
}

/// A message's headers: name and value each.
pub type Headers<'a> = &'a [(&'a str, &'a [u8])];

/// [`queue`], to one partition and with headers (a build's markers).
pub async fn queue_with(
    producer: &Producer,
    topic: &str,
    key: Option<&[u8]>,
    payload: &[u8],
    to: Option<(i32, Headers<'_>)>,
) -> Result<Delivery, KafkaError> {
    loop {
        let mut record = FutureRecord::to(topic).payload(payload);
        if let Some(k) = key {
            record = record.key(k);
        }
        if let Some((partition, headers)) = to {
            let mut h = OwnedHeaders::new_with_capacity(headers.len());
            for (key, value) in headers.iter() {
                h = h.insert(Header {
                    key,
                    value: Some(*value),
                });
            }
            record = record.partition(partition).headers(h);
        }
        match producer.send_result(record) {
            Ok(future) => return Ok(Delivery { future }),
            Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), _)) => {
                // Not a retry of a failure: the local queue drains as the broker
                // acknowledges, so the send is offered again at that pace.
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            Err((e, _)) => return Err(e),
        }
    }
}

/// How many partitions `topic` has (0 when it does not exist).
pub async fn partitions(producer: &Producer, topic: &str) -> Result<i32, KafkaError> {
    use rdkafka::producer::Producer as _;
    let producer = producer.clone();
    let topic = topic.to_owned();
    tokio::task::spawn_blocking(move || {
        producer
            .client()
            .fetch_metadata(Some(&topic), Duration::from_secs(10))
            .map(|md| {
                md.topics()
                    .first()
                    .map_or(0, |t| t.partitions().len() as i32)
            })
    })
    .await
    .map_err(|_| KafkaError::Canceled)?
}

/// The change topics of a pipeline's tables: each table's, and every topic of the
/// cluster a sharded table's patterns match (its shards', created so far).
pub async fn rows_topics(
    producer: &Producer,
    topics: &crate::TopicConfig,
    spec: &sluice_model::PipelineSpec,
) -> Result<Vec<String>, KafkaError> {
    use rdkafka::producer::Producer as _;
    if spec.patterns().is_empty() {
        return Ok(topics.rows_topics(spec, &[]));
    }
    let client = producer.clone();
    let names = tokio::task::spawn_blocking(move || topic_names_of(client.client()))
        .await
        .map_err(|_| KafkaError::Canceled)??;
    Ok(topics.rows_topics(spec, &names))
}

/// The names of every topic `client`'s cluster shows (a blocking metadata request).
pub(crate) fn topic_names_of<C: rdkafka::ClientContext>(
    client: &rdkafka::client::Client<C>,
) -> Result<Vec<String>, KafkaError> {
    let md = client.fetch_metadata(None, Duration::from_secs(10))?;
    Ok(md.topics().iter().map(|t| t.name().to_owned()).collect())
}

/// A message read back from a topic.
#[derive(Debug, Clone)]
pub struct Received {
    pub topic: String,
    pub partition: i32,
    pub offset: i64,
    pub key: Option<Vec<u8>>,
    pub payload: Vec<u8>,
    /// The producer's timestamp, ms since the Unix epoch.
    pub ts_ms: Option<i64>,
    /// The message's headers, in order (most messages have none).
    pub headers: Vec<(String, Vec<u8>)>,
}

impl Received {
    pub(crate) fn of(m: &rdkafka::message::BorrowedMessage<'_>) -> Received {
        use rdkafka::message::Headers as _;
        Received {
            headers: m
                .headers()
                .map(|hs| {
                    hs.iter()
                        .map(|h| (h.key.to_owned(), h.value.unwrap_or_default().to_vec()))
                        .collect()
                })
                .unwrap_or_default(),
            topic: m.topic().to_owned(),
            partition: m.partition(),
            offset: m.offset(),
            key: m.key().map(<[u8]>::to_vec),
            payload: m.payload().unwrap_or_default().to_vec(),
            ts_ms: m.timestamp().to_millis(),
        }
    }
}

/// A consumer that reads without joining `group` (the client requires a group id) and
/// never commits; fetches return after at most `fetch_wait_ms`, since a broker may hold
/// a fetch for its whole wait.
fn reader(
    cfg: &KafkaConfig,
    group: &str,
    fetch_wait_ms: u32,
    extra: &[(&str, &str)],
) -> Result<BaseConsumer<crate::TracingContext>, KafkaError> {
    let mut c = cfg.client_config();
    c.set("group.id", group)
        .set("enable.auto.commit", "false")
        .set("enable.auto.offset.store", "false")
        .set("fetch.wait.max.ms", fetch_wait_ms.to_string());
    for (k, v) in extra {
        c.set(*k, *v);
    }
    cfg.apply_overrides(&mut c);
    c.create_with_context(crate::TracingContext)
}

/// What [`read_all`] read, and whether it stopped short.
#[derive(Debug, Default)]
pub struct ReadBack {
    pub messages: Vec<Received>,
    /// A bound of the [`ReadBounds`] stopped the read before the topics went quiet, or
    /// older messages were left unread (`newest`).
    pub truncated: bool,
}

/// How much a [`read_all`] may read, and for how long.
#[derive(Debug, Clone, Copy)]
pub struct ReadBounds {
    /// The end is where nothing more arrived for this long.
    pub quiet: Duration,
    /// The whole read.
    pub within: Duration,
    pub max_messages: usize,
    /// Keys and payloads together.
    pub max_bytes: usize,
    /// Only each partition's newest this many messages, when set.
    pub newest: Option<i64>,
}

impl ReadBounds {
    /// Everything, for up to `within`.
    pub fn all(quiet: Duration, within: Duration) -> ReadBounds {
        ReadBounds {
            quiet,
            within,
            max_messages: usize::MAX,
            max_bytes: usize::MAX,
            newest: None,
        }
    }
}

/// The messages of `topics` (those that exist), from the start or each partition's
/// newest, within `bounds`, without a consumer group.
///
/// The end is where every partition reported its end and nothing more arrived for `quiet`:
/// the reported end alone is not trusted, because some Kafka-protocol brokers under-report
/// high watermarks for partitions written by an idempotent producer.
pub async fn read_all(
    cfg: &KafkaConfig,
    topics: &[String],
    bounds: ReadBounds,
) -> Result<ReadBack, KafkaError> {
    // Fetches return fast, or quiet would look like data still coming.
    let consumer = reader(
        cfg,
        "sluice-reader",
        50,
        &[("enable.partition.eof", "true")],
    )?;
    let topics = topics.to_vec();
    tokio::task::spawn_blocking(move || read_blocking(&consumer, &topics, bounds))
        .await
        .map_err(|_| KafkaError::Canceled)?
}

fn read_blocking(
    consumer: &BaseConsumer<crate::TracingContext>,
    topics: &[String],
    bounds: ReadBounds,
) -> Result<ReadBack, KafkaError> {
    let deadline = Instant::now() + bounds.within;
    let mut out = ReadBack::default();
    let mut bytes = 0usize;
    // One topic at a time: an end-of-partition notice names the partition, not the topic.
    // Each takes at most its share of what is left of the bounds, so a full topic leaves
    // the next ones theirs.
    for (i, topic) in topics.iter().enumerate() {
        let left = topics.len() - i;
        let share = ReadBounds {
            max_messages: out.messages.len()
                + (bounds.max_messages - out.messages.len().min(bounds.max_messages)) / left,
            max_bytes: bytes + (bounds.max_bytes - bytes.min(bounds.max_bytes)) / left,
            ..bounds
        };
        // Its share of the time left, but never less than it takes to see an end
        // (`quiet`), unless the whole read is out of time.
        let remaining = deadline.saturating_duration_since(Instant::now());
        let until = Instant::now()
            + (remaining / left as u32)
                .max(2 * bounds.quiet)
                .min(remaining);
        let ask = remaining.clamp(Duration::from_secs(1), Duration::from_secs(10));
        let each = share.max_messages - out.messages.len();
        let tpl = starts(
            consumer,
            topic,
            bounds.newest,
            each,
            ask,
            &mut out.truncated,
        )?;
        if tpl.count() == 0 {
            continue;
        }
        consumer.assign(&tpl)?;
        let mut ended = std::collections::HashSet::new();
        let mut last = Instant::now();
        while ended.len() < tpl.count() || last.elapsed() < bounds.quiet {
            if Instant::now() >= until
                || out.messages.len() >= share.max_messages
                || bytes >= share.max_bytes
            {
                // Cut short only if some partition was not read to its end.
                out.truncated |= ended.len() < tpl.count();
                break;
            }
            match consumer.poll(Duration::from_millis(50)) {
                Some(Ok(m)) => {
                    let got = Received::of(&m);
                    bytes += got.payload.len() + got.key.as_ref().map_or(0, Vec::len);
                    out.messages.push(got);
                    last = Instant::now();
                }
                Some(Err(KafkaError::PartitionEOF(p))) => {
                    ended.insert(p);
                    last = Instant::now();
                }
                // Transient broker notices are not data.
                Some(Err(e)) => tracing::debug!(%topic, error = %e, "reading back"),
                None => {}
            }
        }
    }
    Ok(out)
}

/// Where to start reading each partition of `topic` (none if it does not exist yet):
/// the beginning, or with `newest` set, each partition's newest, as many as `messages`
/// shared between them holds (so a read that ends stops at the newest); `truncated` is
/// set when older messages are left out.
fn starts(
    consumer: &BaseConsumer<crate::TracingContext>,
    topic: &str,
    newest: Option<i64>,
    messages: usize,
    ask: Duration,
    truncated: &mut bool,
) -> Result<TopicPartitionList, KafkaError> {
    let md = consumer.fetch_metadata(Some(topic), ask)?;
    let mut tpl = TopicPartitionList::new();
    // A topic nobody wrote to does not exist yet: nothing to read there.
    let live: Vec<_> = md.topics().iter().filter(|t| t.error().is_none()).collect();
    let partitions: usize = live.iter().map(|t| t.partitions().len()).sum();
    let each = i64::try_from(messages.div_ceil(partitions.max(1))).unwrap_or(i64::MAX);
    for t in live {
        for p in t.partitions() {
            let from = match newest {
                None => Offset::Beginning,
                Some(n) => {
                    let n = n.min(each).max(1);
                    let (low, high) = consumer.fetch_watermarks(topic, p.id(), ask)?;
                    if high - low > n {
                        *truncated = true;
                        Offset::Offset(high - n)
                    } else {
                        Offset::Beginning
                    }
                }
            };
            tpl.add_partition_offset(topic, p.id(), from)?;
        }
    }
    Ok(tpl)
}

/// Reads the offsets a consumer group committed, without joining the group (its members
/// are not disturbed). One client, for as many reads as needed.
pub struct GroupOffsets {
    consumer: std::sync::Arc<BaseConsumer<crate::TracingContext>>,
}

impl GroupOffsets {
    pub fn new(cfg: &KafkaConfig, group: &str) -> Result<Self, KafkaError> {
        let mut c = cfg.client_config();
        c.set("group.id", group).set("enable.auto.commit", "false");
        cfg.apply_overrides(&mut c);
        Ok(Self {
            consumer: std::sync::Arc::new(c.create_with_context(crate::TracingContext)?),
        })
    }

    /// The offsets committed on each of `partitions` (`(topic, partition)`), in that
    /// order: `None` where the group committed none.
    pub async fn committed(
        &self,
        partitions: &[(String, i32)],
    ) -> Result<Vec<Option<i64>>, KafkaError> {
        let mut tpl = TopicPartitionList::new();
        for (topic, p) in partitions {
            tpl.add_partition(topic, *p);
        }
        let consumer = self.consumer.clone();
        let partitions = partitions.to_vec();
        tokio::task::spawn_blocking(move || {
            let found = consumer.committed_offsets(tpl, Duration::from_secs(10))?;
            Ok(partitions
                .iter()
                .map(
                    |(t, p)| match found.find_partition(t, *p).map(|e| e.offset()) {
                        Some(Offset::Offset(o)) => Some(o),
                        _ => None,
                    },
                )
                .collect())
        })
        .await
        .map_err(|_| KafkaError::Canceled)?
    }
}

impl GroupOffsets {
    /// The names of every topic the cluster's metadata shows.
    pub async fn topic_names(&self) -> Result<Vec<String>, KafkaError> {
        let consumer = self.consumer.clone();
        tokio::task::spawn_blocking(move || topic_names_of(consumer.client()))
            .await
            .map_err(|_| KafkaError::Canceled)?
    }

    /// Each partition of `topics` (those that exist) as `(topic, partition, end)`: the
    /// offset the next message written there will have. Every message Kafka acknowledged
    /// before the call is below its partition's end.
    pub async fn ends(&self, topics: &[String]) -> Result<Vec<(String, i32, i64)>, KafkaError> {
        let consumer = self.consumer.clone();
        let topics = topics.to_vec();
        tokio::task::spawn_blocking(move || {
            let mut tpl = TopicPartitionList::new();
            for topic in &topics {
                let md = consumer.fetch_metadata(Some(topic), Duration::from_secs(10))?;
                for t in md.topics().iter().filter(|t| t.error().is_none()) {
                    for p in t.partitions() {
                        // The newest offset: a ListOffsets request asking for the "latest".
                        tpl.add_partition_offset(t.name(), p.id(), Offset::End)?;
                    }
                }
            }
            if tpl.count() == 0 {
                return Ok(Vec::new());
            }
            let found = consumer.offsets_for_times(tpl, Duration::from_secs(10))?;
            found
                .elements()
                .iter()
                .map(|e| match e.offset() {
                    Offset::Offset(o) => Ok((e.topic().to_owned(), e.partition(), o)),
                    _ => Err(e
                        .error()
                        .err()
                        .unwrap_or(KafkaError::OffsetFetch(RDKafkaErrorCode::Fail))),
                })
                .collect()
        })
        .await
        .map_err(|_| KafkaError::Canceled)?
    }
}

/// One topic read from offsets the caller keeps, without a consumer group: no rebalance
/// ever stalls it, and the caller can store where it is in the same transaction as what
/// it made of the messages (the center keeps the delayed topic's offsets in its meta
/// database).
pub struct Tail {
    consumer: std::sync::Arc<BaseConsumer<crate::TracingContext>>,
    topic: String,
}

impl Tail {
    /// Reads `topic` (which must exist) from `from` (partition → next offset); a
    /// partition not in it from its beginning.
    pub async fn open(
        cfg: &KafkaConfig,
        topic: &str,
        from: &std::collections::HashMap<i32, i64>,
    ) -> Result<Tail, KafkaError> {
        // An offset the topic no longer has (it was made again): from its start.
        let extra = [("auto.offset.reset", "earliest")];
        let consumer = std::sync::Arc::new(reader(cfg, "sluice-tail", 100, &extra)?);
        let (c2, t, from) = (consumer.clone(), topic.to_owned(), from.clone());
        tokio::task::spawn_blocking(move || {
            let md = c2.fetch_metadata(Some(&t), Duration::from_secs(10))?;
            let mut tpl = TopicPartitionList::new();
            for mt in md.topics() {
                if let Some(e) = mt.error() {
                    return Err(KafkaError::MetadataFetch(e.into()));
                }
                for p in mt.partitions() {
                    let at = from
                        .get(&p.id())
                        .map_or(Offset::Beginning, |&o| Offset::Offset(o));
                    tpl.add_partition_offset(&t, p.id(), at)?;
                }
            }
            c2.assign(&tpl)
        })
        .await
        .map_err(|_| KafkaError::Canceled)??;
        Ok(Tail {
            consumer,
            topic: topic.to_owned(),
        })
    }

    /// Up to `max` messages: waits up to `wait` for the first, then takes what is there.
    pub async fn next(&self, max: usize, wait: Duration) -> Result<Vec<Received>, KafkaError> {
        let consumer = self.consumer.clone();
        let topic = self.topic.clone();
        tokio::task::spawn_blocking(move || {
            let mut out = Vec::new();
            let deadline = Instant::now() + wait;
            while out.len() < max {
                let left = if out.is_empty() {
                    deadline.saturating_duration_since(Instant::now())
                } else {
                    Duration::ZERO
                };
                match consumer.poll(left) {
                    Some(Ok(m)) => out.push(Received::of(&m)),
                    // Transient broker notices are not data; the client reconnects.
                    Some(Err(e)) => {
                        tracing::debug!(%topic, error = %e, "tailing");
                        if Instant::now() >= deadline {
                            break;
                        }
                    }
                    None if out.is_empty() && Instant::now() < deadline => {}
                    None => break,
                }
            }
            out
        })
        .await
        .map_err(|_| KafkaError::Canceled)
    }
}
