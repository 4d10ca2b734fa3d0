//! `sluice-etl`: consumes change events from Kafka and applies them to Elasticsearch as
//! versioned bulk writes (DESIGN.md invariants 2, 3, 5 and 6).
//!
//! A batch (bounded by documents, bytes and linger time) is applied in full before its
//! offsets are committed: every item is either written, found stale (409: a newer version
//! is already there), or dead-lettered with its reason; 429/5xx items are retried with
//! backoff. A crash before the commit only replays events, which versions make harmless.

pub mod config;
mod follow;
mod mapping;
mod metrics;
mod pipeline;

use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::time::Duration;

use anyhow::Context as _;
use rdkafka::consumer::{CommitMode, Consumer as _};
use rdkafka::message::Message as _;
use rdkafka::producer::FutureRecord;
use rdkafka::{Offset, TopicPartitionList};
use serde_json::{json, Value};
use sluice_core::{ChangeEvent, ConfigError};
use sluice_elastic::{BulkOp, EsClient, ItemOutcome};
use sluice_kafka::{Consumer, Producer};
use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

pub use config::EtlConfig;
pub use mapping::{field_mapping, index_body, IndexSettings};

use metrics::METRICS;
use opentelemetry::KeyValue;
use pipeline::{Active, Router};
use sluice_core::telemetry::Readiness;

/// Loads and validates the configuration; errors name the offending keys.
pub fn load(path: &Path) -> Result<EtlConfig, ConfigError> {
    let mut cfg: EtlConfig = sluice_core::load_config(Some(path), "SLUICE")?;
    cfg.validate().map_err(ConfigError::Problems)?;
    cfg.pipelines = cfg
        .pipelines
        .into_iter()
        .map(sluice_core::PipelineSpec::normalized)
        .collect();
    Ok(cfg)
}

/// The pipelines of the etl's own file, as it applies them.
fn file_pipelines(cfg: &EtlConfig) -> Vec<Active> {
    cfg.pipelines
        .iter()
        .map(|spec| Active {
            spec: spec.clone(),
            building: None,
        })
        .collect()
}

/// One consumed message, detached from the consumer.
struct Msg {
    topic: String,
    partition: i32,
    offset: i64,
    key: Option<Vec<u8>>,
    payload: Vec<u8>,
    /// A build's catch-up marker: not a change, nothing to apply.
    marker: Option<sluice_zk::layout::Marker>,
}

/// A message that must go to the dead-letter topic, and why.
struct DeadLetter {
    msg: usize,
    reason: String,
    pipeline: Option<String>,
}

#[derive(Default)]
struct Stats {
    events: u64,
    written: u64,
    stale: u64,
    retried: u64,
    dead_lettered: u64,
}

/// Runs until `shutdown` is cancelled, then applies and commits the batch in hand.
pub async fn run(
    cfg: EtlConfig,
    ready: Readiness,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    let es = cfg.elasticsearch.client().context("elasticsearch")?;
    let producer =
        sluice_kafka::producer(&cfg.kafka).context("cannot create the dead-letter producer")?;
    sluice_kafka::ensure_topics(&cfg.kafka, std::slice::from_ref(&cfg.etl.dead_letter_topic))
        .await
        .context("cannot create the dead-letter topic")?;
    let mut consumer_cfg = cfg.kafka.clone();
    if let Some(id) = &cfg.etl.instance_id {
        consumer_cfg
            .properties
            .insert("group.instance.id".into(), id.clone());
    }
    let consumer = sluice_kafka::consumer(&consumer_cfg, &cfg.etl.group_id)
        .context("cannot create the Kafka consumer")?;

    // The pipelines: from the file, and from the center when a [zookeeper] section is set.
    let (pipelines_tx, mut pipelines) = watch::channel(None);
    let (applied_tx, applied) = watch::channel(sluice_zk::layout::EtlRecord::default());
    let (caught_up_tx, caught_up) = tokio::sync::mpsc::unbounded_channel();
    let (verdict_tx, verdicts) = tokio::sync::mpsc::unbounded_channel();
    let follower = match &cfg.zookeeper {
        Some(zk) => Some(tokio::spawn(follow::follow(
            follow::Follow {
                zk: zk.clone(),
                member: cfg
                    .etl
                    .instance_id
                    .clone()
                    .unwrap_or_else(|| format!("etl-{}", sluice_core::now_ms())),
                from_file: file_pipelines(&cfg),
                pipelines: pipelines_tx,
                applied,
                caught_up,
                verdicts,
            },
            shutdown.clone(),
        ))),
        None => {
            pipelines_tx.send_replace(Some(file_pipelines(&cfg)));
            None
        }
    };
    let mut router = Router::new(&[], &cfg.topics);
    let mut stats = Stats::default();
    let mut last_report = Instant::now();
    let mut reroute = false;
    let mut retry_reroute: Option<Instant> = None;
    loop {
        let retry_due = retry_reroute.is_some_and(|at| Instant::now() >= at);
        if reroute || retry_due || pipelines.has_changed().unwrap_or(false) {
            let list = pipelines.borrow_and_update().clone().unwrap_or_default();
            match subscribe(&consumer, &cfg, &list).await {
                Ok(mut r) => {
                    r.check_known(&es, &router.seen_columns()).await;
                    router = r;
                    retry_reroute = None;
                    metrics::zero(list.iter().map(|p| p.spec.name.as_str()));
                    ready.set(true);
                    // Tell the center which versions this member now writes to.
                    applied_tx.send_replace(sluice_zk::layout::EtlRecord {
                        building: list
                            .iter()
                            .filter_map(|p| p.building.map(|v| (p.spec.name.clone(), v)))
                            .collect(),
                        pipelines: list.iter().map(|p| p.spec.name.clone()).collect(),
                    });
                }
                Err(e) => {
                    // Keep applying the pipelines in force; try the change again shortly.
                    tracing::warn!(
                        error = format!("{e:#}"),
                        "cannot apply the changed pipelines yet; retrying in 1 s"
                    );
                    retry_reroute = Some(Instant::now() + Duration::from_secs(1));
                }
            }
        }
        // For the center: which index versions need a rebuild, as the last subscription or
        // batch found (none without ZooKeeper; the router logged them). Before waiting for
        // the next batch, which may not come soon.
        for v in router.verdicts.drain(..) {
            let _ = verdict_tx.send(v);
        }
        let (batch, stop);
        (batch, stop, reroute) =
            collect(&consumer, &cfg, &mut pipelines, retry_reroute, &shutdown).await;
        if !batch.is_empty() {
            match apply(
                &mut router,
                &es,
                &producer,
                &cfg,
                &batch,
                &shutdown,
                &mut stats,
            )
            .await?
            {
                Applied::All => {
                    commit(&consumer, &batch);
                    for m in batch
                        .iter()
                        .filter_map(|m| m.marker.clone().map(|k| (k, m.partition)))
                    {
                        let _ = caught_up_tx.send(m);
                    }
                }
                Applied::Interrupted => {
                    tracing::info!("shutdown during retries: the unfinished batch is left uncommitted and will be replayed");
                    break;
                }
            }
        }
        if last_report.elapsed() >= Duration::from_secs(10) && stats.events > 0 {
            tracing::info!(
                events = stats.events,
                written = stats.written,
                stale = stats.stale,
                retried = stats.retried,
                dead_lettered = stats.dead_lettered,
                "progress"
            );
            last_report = Instant::now();
        }
        if stop {
            break;
        }
    }
    if let Some(follower) = follower {
        let _ = follower.await;
    }
    tracing::info!("etl stopped");
    Ok(())
}

/// Subscribes to the change topics of `pipelines` (creating missing ones) and returns
/// their router. Offsets of topics that stay are kept by the group.
async fn subscribe(
    consumer: &Consumer,
    cfg: &EtlConfig,
    pipelines: &[Active],
) -> anyhow::Result<Router> {
    let mut topics: Vec<String> = pipelines
        .iter()
        .map(|p| {
            cfg.topics
                .rows_topic(&p.spec.source, &p.spec.database, &p.spec.table)
        })
        .collect();
    topics.sort();
    topics.dedup();
    if topics.is_empty() {
        consumer.unsubscribe();
        tracing::info!("no pipelines: consuming nothing until one is added");
    } else {
        sluice_kafka::ensure_topics(&cfg.kafka, &topics)
            .await
            .context("cannot create the change topics")?;
        let names: Vec<&str> = topics.iter().map(String::as_str).collect();
        consumer.subscribe(&names).context("cannot subscribe")?;
        tracing::info!(group = %cfg.etl.group_id, topics = ?topics, "etl consuming");
    }
    Ok(Router::new(pipelines, &cfg.topics))
}

/// Fills a batch up to the document or byte bound, or until `linger` after its first
/// message. Returns the batch, `stop` (shutdown came; the batch holds what was
/// collected) and `reroute` (the pipelines changed: re-subscribe after this batch).
async fn collect(
    consumer: &Consumer,
    cfg: &EtlConfig,
    pipelines: &mut watch::Receiver<Option<Vec<Active>>>,
    retry_reroute: Option<Instant>,
    shutdown: &CancellationToken,
) -> (Vec<Msg>, bool, bool) {
    let mut batch = Vec::new();
    let mut bytes = 0usize;
    let mut deadline: Option<Instant> = None;
    let mut following = true;
    loop {
        if batch.len() >= cfg.etl.max_batch_docs || bytes >= cfg.etl.max_batch_bytes {
            return (batch, false, false);
        }
        let received = tokio::select! {
            biased;
            _ = shutdown.cancelled() => return (batch, true, false),
            _ = tokio::time::sleep_until(deadline.unwrap_or_else(Instant::now)), if deadline.is_some() => return (batch, false, false),
            // A pipeline change that failed is due again.
            _ = tokio::time::sleep_until(retry_reroute.unwrap_or_else(Instant::now)), if retry_reroute.is_some() => return (batch, false, true),
            // The pipelines changed: apply what is in hand, then re-route.
            changed = pipelines.changed(), if following => match changed {
                Ok(()) => return (batch, false, true),
                Err(_) => { following = false; continue; }
            },
            m = consumer.recv() => m,
        };
        match received {
            Ok(m) => {
                let payload = m.payload().unwrap_or_default().to_vec();
                bytes += payload.len();
                let marker = marker_of(&m, &payload);
                batch.push(Msg {
                    topic: m.topic().to_owned(),
                    partition: m.partition(),
                    offset: m.offset(),
                    key: m.key().map(<[u8]>::to_vec),
                    payload,
                    marker,
                });
                deadline.get_or_insert_with(|| Instant::now() + cfg.etl.linger);
            }
            Err(e) => {
                tracing::warn!(error = %e, "Kafka consumer error");
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    }
}

enum Applied {
    All,
    Interrupted,
}

/// Applies every message of the batch: written, stale, or dead-lettered.
#[tracing::instrument(name = "etl.apply", skip_all, fields(messages = batch.len()))]
async fn apply(
    router: &mut Router,
    es: &EsClient,
    producer: &Producer,
    cfg: &EtlConfig,
    batch: &[Msg],
    shutdown: &CancellationToken,
    stats: &mut Stats,
) -> anyhow::Result<Applied> {
    stats.events += batch.len() as u64;
    METRICS.events.add(batch.len() as u64, &[]);
    let Some(Plan {
        ops,
        origins,
        mut dead,
    }) = plan(router, es, cfg, batch, shutdown).await?
    else {
        return Ok(Applied::Interrupted);
    };
    if !write(es, cfg, ops, origins, &mut dead, shutdown, stats).await? {
        return Ok(Applied::Interrupted);
    }
    if !dead.is_empty() {
        stats.dead_lettered += dead.len() as u64;
        for d in &dead {
            let pipeline = d.pipeline.clone().unwrap_or_default();
            METRICS
                .dead_letters
                .add(1, &[opentelemetry::KeyValue::new("pipeline", pipeline)]);
        }
        dead_letter(producer, &cfg.etl.dead_letter_topic, batch, &dead).await?;
    }
    Ok(Applied::All)
}

/// A batch as bulk operations: the newest version of each document (older ones in the
/// same batch would only be answered 409), each with the message it came from, and the
/// messages that cannot become an operation.
struct Plan {
    ops: Vec<BulkOp>,
    origins: Vec<usize>,
    dead: Vec<DeadLetter>,
}

/// `None` when shutdown came while Elasticsearch was unavailable.
async fn plan(
    router: &mut Router,
    es: &EsClient,
    cfg: &EtlConfig,
    batch: &[Msg],
    shutdown: &CancellationToken,
) -> anyhow::Result<Option<Plan>> {
    let mut dead = Vec::new();
    let mut latest: HashMap<(String, String), (BulkOp, usize)> = HashMap::new();
    for (i, msg) in batch.iter().enumerate() {
        if msg.marker.is_some() {
            continue;
        }
        let event: ChangeEvent = match serde_json::from_slice(&msg.payload) {
            Ok(e) => e,
            Err(e) => {
                dead.push(DeadLetter {
                    msg: i,
                    reason: format!("not a Sluice change event: {e}"),
                    pipeline: None,
                });
                continue;
            }
        };
        for p in router.pipelines_for(&msg.topic, &event).iter().copied() {
            loop {
                match router.prepare(es, p, &event.columns).await {
                    Ok(()) => break,
                    Err(e) if e.is_transient() => {
                        tracing::warn!(error = %e, "Elasticsearch unavailable while preparing the index; retrying");
                        if !sluice_core::shutdown::pause(cfg.etl.retry_backoff * 5, shutdown).await
                        {
                            return Ok(None);
                        }
                    }
                    Err(e) => return Err(e).context("cannot prepare the pipeline's index"),
                }
            }
            for index in router.targets_of(p, &event) {
                match router.op(p, index, &event) {
                    Ok(op) => {
                        let key = (index.clone(), op_id(&op).to_owned());
                        let newer = latest
                            .get(&key)
                            .is_none_or(|(old, _)| op_version(old) < op_version(&op));
                        if newer {
                            latest.insert(key, (op, i));
                        }
                    }
                    Err(reason) => dead.push(DeadLetter {
                        msg: i,
                        reason,
                        pipeline: Some(router.pipelines[p].cfg.spec.name.clone()),
                    }),
                }
            }
        }
    }
    let (ops, origins) = latest.into_values().unzip();
    Ok(Some(Plan { ops, origins, dead }))
}

/// Sends the operations, retrying 429/5xx items and failed requests with backoff until
/// every item is written, stale or rejected (rejections join `dead`). `false` when
/// shutdown interrupted the retries.
#[tracing::instrument(name = "etl.bulk", skip_all, fields(operations = ops.len()))]
async fn write(
    es: &EsClient,
    cfg: &EtlConfig,
    mut ops: Vec<BulkOp>,
    mut origins: Vec<usize>,
    dead: &mut Vec<DeadLetter>,
    shutdown: &CancellationToken,
    stats: &mut Stats,
) -> anyhow::Result<bool> {
    let mut backoff = cfg.etl.retry_backoff;
    while !ops.is_empty() {
        let started = Instant::now();
        let answer = es.bulk(&ops).await;
        METRICS
            .bulk_duration
            .record(started.elapsed().as_secs_f64(), &[]);
        METRICS.bulk_documents.record(ops.len() as u64, &[]);
        match answer {
            Ok(outcomes) => {
                let (mut retry_ops, mut retry_origins) = (Vec::new(), Vec::new());
                for ((op, origin), outcome) in ops.into_iter().zip(origins).zip(outcomes) {
                    match outcome {
                        ItemOutcome::Applied => {
                            stats.written += 1;
                            METRICS
                                .documents
                                .add(1, &[KeyValue::new("result", "written")]);
                        }
                        ItemOutcome::Stale => {
                            stats.stale += 1;
                            METRICS
                                .documents
                                .add(1, &[KeyValue::new("result", "stale")]);
                        }
                        ItemOutcome::Retry { status, reason } => {
                            METRICS.bulk_errors.add(1, &metrics::class("retry"));
                            tracing::debug!(status, %reason, "bulk item will be retried");
                            retry_ops.push(op);
                            retry_origins.push(origin);
                        }
                        ItemOutcome::Rejected { status, reason } => {
                            METRICS.bulk_errors.add(1, &metrics::class("rejected"));
                            dead.push(DeadLetter {
                                msg: origin,
                                reason: format!(
                                    "Elasticsearch rejected the document (HTTP {status}): {reason}"
                                ),
                                pipeline: None,
                            });
                        }
                    }
                }
                (ops, origins) = (retry_ops, retry_origins);
            }
            Err(e) if e.is_transient() => {
                METRICS.bulk_errors.add(1, &metrics::class("request"));
                tracing::warn!(error = %e, retry_in = ?backoff, "bulk request failed; retrying");
            }
            Err(e) => {
                METRICS.bulk_errors.add(1, &metrics::class("request"));
                return Err(e)
                    .context("bulk request refused (fix the cause; nothing was committed)");
            }
        }
        if !ops.is_empty() {
            stats.retried += ops.len() as u64;
            if !sluice_core::shutdown::pause(backoff, shutdown).await {
                return Ok(false);
            }
            backoff = (backoff * 2).min(Duration::from_secs(30));
        }
    }
    Ok(true)
}

fn op_id(op: &BulkOp) -> &str {
    match op {
        BulkOp::Index { id, .. } | BulkOp::Delete { id, .. } => id,
    }
}

fn op_version(op: &BulkOp) -> u64 {
    match op {
        BulkOp::Index { version, .. } | BulkOp::Delete { version, .. } => *version,
    }
}

/// Publishes dead letters and waits until Kafka has them all; only then may the batch's
/// offsets be committed.
async fn dead_letter(
    producer: &Producer,
    topic: &str,
    batch: &[Msg],
    dead: &[DeadLetter],
) -> anyhow::Result<()> {
    let mut deliveries = Vec::with_capacity(dead.len());
    for d in dead {
        let msg = &batch[d.msg];
        let original: Value = serde_json::from_slice(&msg.payload)
            .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&msg.payload).into_owned()));
        tracing::warn!(topic = %msg.topic, partition = msg.partition, offset = msg.offset, reason = %d.reason, "dead-lettering event");
        let payload = serde_json::to_vec(&json!({
            "v": 1,
            "reason": d.reason,
            "pipeline": d.pipeline,
            "topic": msg.topic,
            "partition": msg.partition,
            "offset": msg.offset,
            "event": original,
        }))?;
        let mut record = FutureRecord::to(topic).payload(&payload);
        if let Some(k) = &msg.key {
            record = record.key(k);
        }
        let delivery = producer
            .send_result(record)
            .map_err(|(e, _)| anyhow::anyhow!(e).context("cannot queue a dead letter"))?;
        deliveries.push(delivery);
    }
    for delivery in deliveries {
        match delivery.await {
            Ok(Ok(_)) => {}
            Ok(Err((e, _))) => {
                return Err(anyhow::anyhow!(e)
                    .context("Kafka refused a dead letter; the batch is not committed"))
            }
            Err(_) => anyhow::bail!("dead-letter delivery report lost; the batch is not committed"),
        }
    }
    Ok(())
}

/// Commits, per partition, the offset after the batch's last message.
/// The build marker a message carries (header [`sluice_zk::layout::MARKER_HEADER`]).
fn marker_of(
    m: &rdkafka::message::BorrowedMessage<'_>,
    payload: &[u8],
) -> Option<sluice_zk::layout::Marker> {
    use rdkafka::message::Headers as _;
    let headers = m.headers()?;
    let marked = headers
        .iter()
        .any(|h| h.key == sluice_zk::layout::MARKER_HEADER);
    if !marked {
        return None;
    }
    match serde_json::from_slice(payload) {
        Ok(marker) => Some(marker),
        Err(e) => {
            tracing::warn!(error = %e, "unreadable build marker; ignoring it");
            None
        }
    }
}

fn commit(consumer: &Consumer, batch: &[Msg]) {
    let mut next: BTreeMap<(&str, i32), i64> = BTreeMap::new();
    for m in batch {
        let e = next.entry((&m.topic, m.partition)).or_insert(m.offset + 1);
        *e = (*e).max(m.offset + 1);
    }
    let mut tpl = TopicPartitionList::new();
    for ((topic, partition), offset) in next {
        if let Err(e) = tpl.add_partition_offset(topic, partition, Offset::Offset(offset)) {
            tracing::warn!(error = %e, topic, partition, "cannot record offset");
        }
    }
    // A failed commit (e.g. the partition moved to another consumer in a rebalance) only
    // means the events are applied again, harmlessly.
    if let Err(e) = consumer.commit(&tpl, CommitMode::Sync) {
        tracing::warn!(error = %e, "offset commit failed; the batch may be replayed");
    }
}
