//! `sluice-etl`: consumes change events from Kafka and applies them to Elasticsearch as
//! versioned bulk writes (README invariants 2, 3, 5 and 6).
//!
//! A batch (bounded by documents, bytes and linger time) is applied in full before its
//! offsets are committed: every item is either written, found stale (409: a newer version
//! is already there), or dead-lettered with its reason; 429/5xx items are retried with
//! backoff. A crash before the commit only replays events, which versions make harmless.
//! Several batches are written at once and commit in the order they were consumed
//! ([`flight`]).

pub mod config;
mod ddl;
mod docs;
mod flight;
mod follow;
mod index;
mod mapping;
mod metrics;
mod pipeline;
mod share;
mod write;

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::path::Path;
use std::time::Duration;

use anyhow::Context as _;
use serde_json::Value;
use sluice_elastic::{BulkOp, EsClient};
use sluice_kafka::{CommitMode, Feed, Producer, Received, SharedProducer};
use sluice_model::dead_letter::{EventLetter, LETTER_VERSION};
use sluice_model::{BuildDocument, ChangeEvent, DdlEvent};
use sluice_runtime::ConfigError;
use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

pub use config::EtlConfig;
pub use mapping::{field_mapping, index_body, IndexSettings};
pub use share::owns;

use flight::{Flight, Landed};
use metrics::METRICS;
use pipeline::{Active, Router};
use sluice_runtime::telemetry::Readiness;

/// Loads and validates the configuration; errors name the offending keys.
pub fn load(path: &Path) -> Result<EtlConfig, ConfigError> {
    let mut cfg: EtlConfig = sluice_runtime::load_config(Some(path), "SLUICE")?;
    cfg.validate().map_err(ConfigError::Problems)?;
    sluice_runtime::unreadable_tls(&cfg.mysql_tls())?;
    cfg.pipelines = cfg
        .pipelines
        .into_iter()
        .map(sluice_model::PipelineSpec::normalized)
        .collect();
    Ok(cfg)
}

/// The pipelines of the etl's own file, as it applies them, with their sources from the
/// file (in a cluster, a source missing there is looked up in the center's records).
fn file_pipelines(cfg: &EtlConfig) -> Vec<Active> {
    cfg.pipelines
        .iter()
        .map(|spec| Active {
            spec: spec.clone(),
            building: None,
            history: Vec::new(),
            source: cfg.source(&spec.source),
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
pub(crate) struct DeadLetter {
    pub msg: usize,
    pub reason: String,
    pub pipeline: Option<String>,
    /// The index that refused it: its pipeline is looked up once the batch is through,
    /// only when something was refused.
    pub index: Option<String>,
}

/// What the etl did, for its progress lines.
#[derive(Default)]
struct Stats {
    events: u64,
    written: u64,
    stale: u64,
    retried: u64,
    dead_lettered: u64,
}

impl Stats {
    fn add(&mut self, t: &write::Tally) {
        self.written += t.written;
        self.stale += t.stale;
        self.retried += t.retried;
    }
}

/// Runs until `shutdown` is cancelled, then applies and commits the batch in hand.
pub async fn run(
    cfg: EtlConfig,
    ready: Readiness,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    let es = cfg.elasticsearch.client().context("elasticsearch")?;
    let producer = sluice_kafka::SharedProducer::new(&cfg.kafka)
        .context("cannot create the dead-letter producer")?;
    let own = [cfg.topics.dead_letter.clone(), cfg.topics.delayed.clone()];
    sluice_kafka::ensure_topics(&cfg.kafka, &own)
        .await
        .context("cannot create the dead-letter and delayed topics")?;
    // The consumer never joins its group: the members share the partitions among
    // themselves (`share`), and the group only keeps their committed offsets.
    let feed =
        Feed::new(&cfg.kafka, &cfg.etl.group_id).context("cannot create the Kafka consumer")?;
    let me = cfg
        .etl
        .instance_id
        .clone()
        .unwrap_or_else(|| format!("etl-{}", sluice_model::now_ms()));

    // The pipelines: from the file, and from the center when a [zookeeper] section is set.
    let (pipelines_tx, mut pipelines) = watch::channel(None);
    let (applied_tx, applied) = watch::channel(sluice_zk::layout::EtlRecord::default());
    let (verdict_tx, verdicts) = tokio::sync::mpsc::unbounded_channel();
    let (notes_tx, notes) = tokio::sync::mpsc::unbounded_channel();
    // The live members of the group, once the follower has read them; without
    // ZooKeeper this one alone, consuming every partition.
    let (members_tx, mut members) = watch::channel(None::<Vec<String>>);
    let follower = match &cfg.zookeeper {
        Some(zk) => Some(tokio::spawn(follow::follow(
            follow::Follow {
                zk: zk.clone(),
                member: me.clone(),
                group: cfg.etl.group_id.clone(),
                members: members_tx,
                from_file: file_pipelines(&cfg),
                file_sources: cfg.sources.clone(),
                source_access: cfg.source_access(),
                pipelines: pipelines_tx,
                applied,
                verdicts,
                notes,
            },
            shutdown.clone(),
        ))),
        None => {
            pipelines_tx.send_replace(Some(file_pipelines(&cfg)));
            members_tx.send_replace(Some(Vec::new()));
            None
        }
    };
    let mut router = Router::new(&[], &cfg.topics);
    let mut sources = docs::Sources::default();
    let mut flight = Flight::new(cfg.etl.max_in_flight);
    let mut bounds = Bounds::new(&cfg);
    let ctx = Ctx {
        es: &es,
        producer: &producer,
        feed: &feed,
        cfg: &cfg,
        shutdown: &shutdown,
        notes: follower.is_some().then_some(&notes_tx),
    };
    let mut stats = Stats::default();
    let mut last_report = Instant::now();
    let mut reroute = false;
    let mut retry_reroute: Option<Instant> = None;
    // The topics of the pipelines in force, the partitions of them this member consumes,
    // and when to look at the topics' partitions again (a topic may gain some).
    let mut topics = BTreeSet::new();
    let mut reshare_at = Instant::now();
    // A starting etl most often finds a backlog (a restart, partitions taken over): it fills its
    // first batch, then finds out.
    let mut loaded = true;
    loop {
        let retry_due = retry_reroute.is_some_and(|at| Instant::now() >= at);
        if reroute || retry_due || pipelines.has_changed().unwrap_or(false) {
            // What is in flight was planned with the pipelines in force: it lands first.
            if !drain(&ctx, &router, &mut flight, &mut stats, CommitMode::Async).await? {
                interrupted();
                break;
            }
            let list = pipelines.borrow_and_update().clone().unwrap_or_default();
            match route(&cfg, &list, &topics).await {
                Ok((mut r, t)) => {
                    r.check_known(&es, &router.seen_columns()).await;
                    router = r;
                    bounds.read_back = t.iter().filter(|t| router.reads_back(t)).cloned().collect();
                    if t != topics {
                        topics = t;
                        reshare_at = Instant::now();
                    }
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
                        history: list
                            .iter()
                            .filter(|p| !p.history.is_empty())
                            .map(|p| (p.spec.name.clone(), p.history.clone()))
                            .collect(),
                        group: cfg.etl.group_id.clone(),
                        partitions: by_topic(&feed.held()),
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
        let known = members.borrow().is_some();
        if known && (members.has_changed().unwrap_or(false) || Instant::now() >= reshare_at) {
            let list = members.borrow_and_update().clone().unwrap_or_default();
            reshare_at = reshare(&feed, &topics, list, &me, &applied_tx);
        }
        // For the center: which index versions need a rebuild, as the last re-route or
        // batch found (none without ZooKeeper; the router logged them). Before waiting for
        // the next batch, which may not come soon.
        for v in router.verdicts.drain(..) {
            let _ = verdict_tx.send(v);
        }
        // The next batch is collected while earlier ones are written; those land as
        // their writes finish.
        let collected = {
            let collecting = collect(
                &feed,
                &bounds,
                &mut pipelines,
                &mut members,
                // Until the members are known, their arrival wakes the collection.
                retry_reroute
                    .into_iter()
                    .chain(known.then_some(reshare_at))
                    .min()
                    .unwrap_or_else(|| Instant::now() + Duration::from_secs(3600)),
                &mut loaded,
                &shutdown,
            );
            tokio::pin!(collecting);
            loop {
                tokio::select! {
                    biased;
                    landed = flight.land(), if !flight.is_empty() => {
                        if !land(&ctx, &router, landed?, &mut stats, CommitMode::Async).await? {
                            break None;
                        }
                    }
                    c = &mut collecting => break Some(c),
                }
            }
        };
        let Some((batch, stop, r)) = collected else {
            interrupted();
            break;
        };
        reroute = r;
        // The last commit before exiting waits for its answer; the others do not hold
        // the loop (nor a runtime thread) while the group coordinator is slow or being
        // found again after an outage.
        let mode = if stop {
            CommitMode::Sync
        } else {
            CommitMode::Async
        };
        if !batch.msgs.is_empty()
            && !apply(
                &ctx,
                &mut router,
                &mut sources,
                &mut flight,
                batch,
                &mut stats,
                mode,
            )
            .await?
        {
            interrupted();
            break;
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
            if !drain(&ctx, &router, &mut flight, &mut stats, mode).await? {
                interrupted();
            }
            break;
        }
    }
    drop(flight);
    if let Some(follower) = follower {
        let _ = follower.await;
    }
    sources.close().await;
    tracing::info!("etl stopped");
    Ok(())
}

fn interrupted() {
    tracing::info!(
        "shutdown during retries: the unfinished batches are left uncommitted and will be replayed"
    );
}

/// The router of `pipelines` and their topics (every table of each one's tree, its schema
/// and build topics), created where missing. When the topics are `current` (a build
/// started or ended, a spec changed in place), nothing is created or logged: the
/// partitions consumed stay as they are.
async fn route(
    cfg: &EtlConfig,
    pipelines: &[Active],
    current: &BTreeSet<String>,
) -> anyhow::Result<(Router, BTreeSet<String>)> {
    let router = Router::new(pipelines, &cfg.topics);
    let topics: BTreeSet<String> = router
        .pipelines
        .iter()
        .flat_map(|p| p.topics(&cfg.topics))
        .collect();
    if topics == *current {
        return Ok((router, topics));
    }
    if topics.is_empty() {
        tracing::info!("no pipelines: consuming nothing until one is added");
    } else {
        let list: Vec<String> = topics.iter().cloned().collect();
        sluice_kafka::ensure_topics(&cfg.kafka, &list)
            .await
            .context("cannot create the change topics")?;
        tracing::info!(group = %cfg.etl.group_id, topics = ?topics, "etl consuming");
    }
    Ok((router, topics))
}

/// `partitions` as the member's record lists them.
fn by_topic(partitions: &BTreeSet<sluice_kafka::Partition>) -> BTreeMap<String, Vec<i32>> {
    let mut out: BTreeMap<String, Vec<i32>> = BTreeMap::new();
    for (topic, partition) in partitions {
        out.entry(topic.clone()).or_default().push(*partition);
    }
    out
}

/// How often a member looks at its topics' partitions when nothing told it to.
const RESHARE_EVERY: Duration = Duration::from_secs(10);

/// Consumes exactly the partitions of `topics` this member owns among `members` (this
/// member counts from its start, registered in ZooKeeper or not yet): those it gains
/// start from the group's committed offsets, those it keeps go on without a pause, those
/// another member now owns stop here (batches of theirs in flight still land and commit;
/// the new owner may apply them again, which changes nothing). Puts the partitions it now
/// consumes in its record, and says when to look again.
fn reshare(
    feed: &Feed,
    topics: &BTreeSet<String>,
    mut members: Vec<String>,
    me: &str,
    record: &watch::Sender<sluice_zk::layout::EtlRecord>,
) -> Instant {
    if !members.iter().any(|m| m == me) {
        members.push(me.to_owned());
    }
    let shared = feed.share(topics, |topic, partition| {
        share::owns(&members, me, topic, partition)
    });
    record.send_if_modified(|r| {
        let partitions = by_topic(&feed.held());
        let changed = r.partitions != partitions;
        r.partitions = partitions;
        changed
    });
    match shared {
        Ok(()) => Instant::now() + RESHARE_EVERY,
        Err(e) => {
            tracing::warn!(error = %e, "cannot take this member's partitions yet; retrying in 1 s");
            Instant::now() + Duration::from_secs(1)
        }
    }
}

/// A lingered batch with at least this many messages says the load goes on.
const LOADED_BATCH: usize = 10;

/// Fills a batch up to the document or byte bound. When the etl is keeping up (no message
/// was waiting when it came back for this batch, and the last batch did not show a load),
/// the batch is written as soon as the consumer has nothing more buffered, so a lone
/// change waits for nothing. Under a load (messages were waiting, or the last lingered
/// batch gathered [`LOADED_BATCH`] or more), it waits up to `linger` after its first
/// message to fill: fewer, larger bulks, which a sink with a cost per request needs to
/// keep up. Returns the batch, `stop` (shutdown came; the batch holds what was
/// collected) and `reroute` (the pipelines changed: re-route after this batch).
async fn collect(
    feed: &Feed,
    bounds: &Bounds,
    pipelines: &mut watch::Receiver<Option<Vec<Active>>>,
    members: &mut watch::Receiver<Option<Vec<String>>>,
    due: Instant,
    loaded: &mut bool,
    shutdown: &CancellationToken,
) -> (Batch, bool, bool) {
    let mut batch = Batch::default();
    let waiting = match feed.buffered() {
        Some(Ok(m)) => {
            batch.push(m, bounds);
            true
        }
        _ => false,
    };
    let behind = waiting || *loaded;
    let mut deadline = waiting.then(|| Instant::now() + bounds.linger);
    let mut following = true;
    let mut members_following = true;
    loop {
        if batch.full(bounds) {
            *loaded = true;
            return (batch, false, false);
        }
        let received = tokio::select! {
            biased;
            _ = shutdown.cancelled() => return (batch, true, false),
            _ = tokio::time::sleep_until(deadline.unwrap_or_else(Instant::now)), if deadline.is_some() => {
                *loaded = batch.msgs.len() >= LOADED_BATCH;
                return (batch, false, false);
            }
            // A pipeline change that failed, or a look at the partitions, is due.
            _ = tokio::time::sleep_until(due) => return (batch, false, false),
            // The members changed: the partitions are shared again after this batch.
            changed = members.changed(), if members_following => match changed {
                Ok(()) => {
                    // Left unseen for the loop, which shares the partitions again.
                    members.mark_changed();
                    return (batch, false, false);
                }
                Err(_) => { members_following = false; continue; }
            },
            // The pipelines changed: apply what is in hand, then re-route.
            changed = pipelines.changed(), if following => match changed {
                Ok(()) => return (batch, false, true),
                Err(_) => { following = false; continue; }
            },
            m = feed.recv() => m,
        };
        match received {
            Ok(m) => {
                batch.push(m, bounds);
                if behind {
                    deadline.get_or_insert_with(|| Instant::now() + bounds.linger);
                    continue;
                }
                // Keeping up: what is already buffered joins, and the batch goes.
                while !batch.full(bounds) {
                    match feed.buffered() {
                        Some(Ok(m)) => batch.push(m, bounds),
                        Some(Err(_)) | None => break,
                    }
                }
                return (batch, false, false);
            }
            Err(e) => {
                tracing::warn!(error = %e, "Kafka consumer error");
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    }
}

/// A batch of changes that are read back takes up to this many times `max_batch_docs`
/// messages: many of them lead to one document (a product's SKUs, prices and tags), read
/// once a batch, so a larger batch during a backlog reads each document fewer times.
/// Measured with the tree bench (5,000 products of a shop loaded table by table, 14 rows
/// a product, 71,003 changes): each product was read back 8.8 times at 2,000 messages a
/// batch, 4.6 times at 20,000.
const READ_BACK_SPAN: usize = 10;

/// How much a batch may take: `etl.max_batch_docs` documents (a message of a pipeline
/// that is read back counts for [`READ_BACK_SPAN`]th of one), `etl.max_batch_bytes`.
struct Bounds {
    docs: usize,
    bytes: usize,
    linger: Duration,
    /// The topics whose every pipeline is read back (`Router::reads_back`).
    read_back: HashSet<String>,
}

impl Bounds {
    fn new(cfg: &EtlConfig) -> Self {
        Bounds {
            docs: cfg.etl.max_batch_docs,
            bytes: cfg.etl.max_batch_bytes,
            linger: cfg.etl.linger,
            read_back: HashSet::new(),
        }
    }
}

/// Messages collected for one batch, and their payloads' size.
#[derive(Default)]
struct Batch {
    msgs: Vec<Msg>,
    /// Messages that count as a document each (not read back).
    docs: usize,
    bytes: usize,
    /// When its first message was consumed.
    first: Option<Instant>,
}

impl Batch {
    fn full(&self, bounds: &Bounds) -> bool {
        self.docs >= bounds.docs
            || self.msgs.len() >= bounds.docs.saturating_mul(READ_BACK_SPAN)
            || self.bytes >= bounds.bytes
    }

    fn push(&mut self, m: Received, bounds: &Bounds) {
        if self.first.is_none() {
            self.first = Some(Instant::now());
            // Kafka's timestamp: when the worker queued the batch's first message.
            if let Some(published) = m.ts_ms {
                let waited = (sluice_model::now_ms() - published).max(0) as f64 / 1000.0;
                METRICS.consume_latency.record(waited, &[]);
            }
        }
        let marker = marker_of(&m);
        let msg = Msg {
            topic: m.topic,
            partition: m.partition,
            offset: m.offset,
            key: m.key,
            payload: m.payload,
            marker,
        };
        self.add(msg, bounds);
    }

    fn add(&mut self, msg: Msg, bounds: &Bounds) {
        if !bounds.read_back.contains(&msg.topic) {
            self.docs += 1;
        }
        self.bytes += msg.payload.len();
        self.msgs.push(msg);
    }
}

/// What applying and landing batches work with.
struct Ctx<'a> {
    es: &'a EsClient,
    producer: &'a SharedProducer,
    feed: &'a Feed,
    cfg: &'a EtlConfig,
    shutdown: &'a CancellationToken,
    /// To the follower (cluster mode): what to record before the batch is committed
    /// (documents DDL changed, build markers applied), answered once recorded.
    notes: Option<&'a follow::NotesTx>,
}

impl Ctx<'_> {
    /// A writer for a batch whose unmappable messages are `dead`.
    fn writer(&self, dead: Vec<DeadLetter>) -> write::Writer {
        write::Writer::new(self.es, self.cfg.etl.backoff(), self.shutdown, dead)
    }
}

/// What a batch carries from its planning to its landing: the pipelines whose documents
/// DDL changed, to record before its commit.
type InFlight = Flight<Vec<ddl::Rewritten>>;

/// Plans a batch and sets its writes going. Flat pipelines' writes join the flight, once
/// the limit allows and no batch in flight writes the same documents; documents read back
/// from MySQL are written here, after every batch before has landed, and the batch lands
/// at once. `false` when shutdown interrupted it: nothing more may be committed.
#[tracing::instrument(name = "etl.apply", skip_all, fields(messages = batch.msgs.len()))]
async fn apply(
    ctx: &Ctx<'_>,
    router: &mut Router,
    sources: &mut docs::Sources,
    flight: &mut InFlight,
    batch: Batch,
    stats: &mut Stats,
    mode: CommitMode,
) -> anyhow::Result<bool> {
    stats.events += batch.msgs.len() as u64;
    METRICS.events.add(batch.msgs.len() as u64, &[]);
    let Some(Plan {
        ops,
        origins,
        mut dirty,
        dead,
        rewritten,
    }) = plan(router, ctx.es, ctx.cfg, &batch.msgs, ctx.shutdown).await?
    else {
        return Ok(false);
    };
    if dirty.is_empty() {
        let docs = flight.docs(&ops);
        while flight.must_wait(&docs) {
            if !flight.front_done() {
                flight.some_done().await;
                continue;
            }
            let landed = flight.land().await?;
            if !land(ctx, router, landed, stats, CommitMode::Async).await? {
                return Ok(false);
            }
        }
        flight.launch(batch, docs, ctx.writer(dead), (ops, origins), rewritten);
        return Ok(true);
    }
    if !drain(ctx, router, flight, stats, CommitMode::Async).await? {
        return Ok(false);
    }
    let delayed = dirty.take_delayed(|p| router.pipelines[p].cfg.spec.name.clone());
    let mut writer = ctx.writer(dead);
    let mut complete = writer.write(ops, origins).await?;
    if complete {
        // The documents read back: several bulks in flight while the next are read.
        let etl = &ctx.cfg.etl;
        let (docs, bytes) = (etl.max_batch_docs, etl.max_batch_bytes);
        let mut lanes = write::Lanes::new(&mut writer, docs, bytes, flight.lanes());
        complete = docs::rebuild(router, sources, &mut lanes, dirty, ctx.shutdown).await?
            && lanes.settle().await?;
    }
    let complete = complete && hand_over(ctx, &delayed).await?;
    let landed = Landed {
        batch,
        written: writer.finish(complete),
        rest: rewritten,
    };
    flight.observe(landed.written.tally.throttled);
    land(ctx, router, landed, stats, mode).await
}

/// Lands every batch in flight, oldest first. `false` when shutdown interrupted one.
async fn drain(
    ctx: &Ctx<'_>,
    router: &Router,
    flight: &mut InFlight,
    stats: &mut Stats,
    mode: CommitMode,
) -> anyhow::Result<bool> {
    while !flight.is_empty() {
        let landed = flight.land().await?;
        if !land(ctx, router, landed, stats, mode).await? {
            return Ok(false);
        }
    }
    Ok(true)
}

/// Finishes a batch whose writes are done, every batch before it having landed: its dead
/// letters in Kafka, what it tells the center recorded, then its offsets committed.
/// `false` when shutdown interrupted it: nothing more may be committed.
async fn land(
    ctx: &Ctx<'_>,
    router: &Router,
    landed: Landed<Vec<ddl::Rewritten>>,
    stats: &mut Stats,
    mode: CommitMode,
) -> anyhow::Result<bool> {
    let Landed {
        batch,
        written,
        rest: rewritten,
    } = landed;
    stats.add(&written.tally);
    if !written.complete {
        return Ok(false);
    }
    let mut dead = written.dead;
    for d in &mut dead {
        if let (None, Some(index)) = (&d.pipeline, &d.index) {
            d.pipeline = router.owner_of(index);
        }
    }
    if !dead.is_empty() {
        stats.dead_lettered += dead.len() as u64;
        for d in &dead {
            let pipeline = d.pipeline.clone().unwrap_or_default();
            METRICS
                .dead_letters
                .add(1, &[opentelemetry::KeyValue::new("pipeline", pipeline)]);
        }
        if !dead_letter(ctx.producer, ctx.cfg, &batch.msgs, &dead, ctx.shutdown).await? {
            return Ok(false);
        }
    }
    if let Some(tx) = ctx.notes {
        // Markers of builds this etl is not making (reset or finished ones, in the
        // pipeline's build topic) say nothing.
        let markers = batch.msgs.iter().filter_map(|m| {
            let marker = m.marker.as_ref()?;
            router
                .building(&marker.pipeline, marker.version)
                .then(|| (marker.clone(), m.partition))
        });
        if !record(tx, markers, rewritten, ctx.shutdown).await {
            return Ok(false);
        }
    }
    if let Some(first) = batch.first {
        METRICS
            .index_latency
            .record(first.elapsed().as_secs_f64(), &[]);
    }
    // A crash here: Elasticsearch has the batch, Kafka not its offsets.
    sluice_model::failpoint("etl.before_commit");
    commit(ctx.feed, &batch.msgs, mode);
    Ok(true)
}

/// Records, for the center, the documents DDL changed and the build markers the batch
/// holds (every batch before it has landed, so each marker's partition is applied up to
/// it). `false` when shutdown came first.
async fn record(
    tx: &follow::NotesTx,
    markers: impl Iterator<Item = (sluice_zk::layout::Marker, i32)>,
    rewritten: Vec<ddl::Rewritten>,
    shutdown: &CancellationToken,
) -> bool {
    if !rewritten.is_empty()
        && !follow::record(tx, follow::Note::Rewrites(rewritten), shutdown).await
    {
        return false;
    }
    let mut recorded = 0;
    for (marker, partition) in markers {
        let note = follow::Note::CaughtUp { marker, partition };
        if !follow::record(tx, note, shutdown).await {
            return false;
        }
        recorded += 1;
    }
    if recorded > 0 {
        // A crash here: the build's marker is recorded, its offset not committed.
        sluice_model::failpoint("etl.after_build_marker");
    }
    true
}

/// A batch as what to write: flat pipelines' operations — the newest version of each
/// document (older ones in the same batch would only be answered 409), each with the
/// message it came from —, the documents it dirtied in pipelines read back from MySQL,
/// the messages that cannot become anything, and the pipelines whose documents DDL
/// changed without row events.
struct Plan {
    ops: Vec<BulkOp>,
    origins: Vec<write::Origin>,
    dirty: docs::Dirty,
    dead: Vec<DeadLetter>,
    rewritten: Vec<ddl::Rewritten>,
}

/// `None` when shutdown came while Elasticsearch or a source was unavailable.
async fn plan(
    router: &mut Router,
    es: &EsClient,
    cfg: &EtlConfig,
    batch: &[Msg],
    shutdown: &CancellationToken,
) -> anyhow::Result<Option<Plan>> {
    let mut dead = Vec::new();
    let mut rewritten = Vec::new();
    let mut dirty = docs::Dirty::default();
    let mut latest: HashMap<(String, String), (BulkOp, usize)> = HashMap::new();
    let mut ops = Vec::new();
    for (i, msg) in batch.iter().enumerate() {
        if msg.marker.is_some() {
            continue;
        }
        if let Some(pipelines) = router.schema_of(&msg.topic) {
            let Some(event) = decode::<DdlEvent>(msg, i, "DDL event", None, &mut dead) else {
                continue;
            };
            let found = ddl::rewritten(
                router,
                es,
                &pipelines,
                &event,
                cfg.etl.retry_backoff,
                shutdown,
            );
            match found.await? {
                Some(r) => rewritten.extend(r),
                None => return Ok(None),
            }
            continue;
        }
        if let Some(p) = router.build_of(&msg.topic) {
            let pipeline = Some(router.pipelines[p].cfg.spec.name.clone());
            let Some(doc) = decode::<BuildDocument>(msg, i, "build document", pipeline, &mut dead)
            else {
                continue;
            };
            if !ready(router, es, cfg, p, Input::Build(&doc), shutdown).await? {
                return Ok(None);
            }
            for op in router.build_ops(p, doc) {
                newest(&mut latest, op, i);
            }
            continue;
        }
        let Some(event) = decode::<ChangeEvent>(msg, i, "change event", None, &mut dead) else {
            continue;
        };
        for p in router.pipelines_for(&msg.topic, &event).iter().copied() {
            if !ready(router, es, cfg, p, Input::Change(&event), shutdown).await? {
                return Ok(None);
            }
            let pipeline = &router.pipelines[p];
            if pipeline.is_tree() {
                match pipeline.plans() {
                    Some(plans) => dirty.touch(p, &plans, &event, i),
                    None => docs::unreadable(
                        &mut dead,
                        &pipeline.cfg.spec.name,
                        [i],
                        pipeline.unfit().unwrap_or("not ready"),
                    ),
                }
                continue;
            }
            for index in router.targets(p) {
                if let Err(reason) = router.flat_ops(p, index, &event, &mut ops) {
                    dead.push(DeadLetter {
                        msg: i,
                        reason,
                        pipeline: Some(pipeline.cfg.spec.name.clone()),
                        index: None,
                    });
                }
                for op in ops.drain(..) {
                    newest(&mut latest, op, i);
                }
            }
        }
    }
    let (ops, origins) = latest
        .into_values()
        .map(|(op, msg)| (op, write::Origin::One(msg)))
        .unzip();
    Ok(Some(Plan {
        ops,
        origins,
        dirty,
        dead,
        rewritten,
    }))
}

/// Message `i` read as a `what`; when it is not one, it is dead-lettered with why.
fn decode<T: serde::de::DeserializeOwned>(
    msg: &Msg,
    i: usize,
    what: &str,
    pipeline: Option<String>,
    dead: &mut Vec<DeadLetter>,
) -> Option<T> {
    serde_json::from_slice(&msg.payload)
        .map_err(|e| {
            dead.push(DeadLetter {
                msg: i,
                reason: format!("not a Sluice {what}: {e}"),
                pipeline,
                index: None,
            })
        })
        .ok()
}

/// Keeps `op` (from message `msg`) unless the batch has a newer write of its document.
fn newest(latest: &mut HashMap<(String, String), (BulkOp, usize)>, op: BulkOp, msg: usize) {
    let key = (op.index().to_owned(), op.id().to_owned());
    if latest
        .get(&key)
        .is_none_or(|(old, _)| old.version() < op.version())
    {
        latest.insert(key, (op, msg));
    }
}

/// What a pipeline is made ready for.
#[derive(Clone, Copy)]
enum Input<'a> {
    Change(&'a ChangeEvent),
    Build(&'a BuildDocument),
}

/// Makes pipeline `p` ready for `input`, retrying while Elasticsearch or its source is
/// unavailable; `false` when shutdown came first.
async fn ready(
    router: &mut Router,
    es: &EsClient,
    cfg: &EtlConfig,
    p: usize,
    input: Input<'_>,
    shutdown: &CancellationToken,
) -> anyhow::Result<bool> {
    loop {
        let prepared = match input {
            _ if router.pipelines[p].is_tree() => {
                let event = match input {
                    Input::Change(e) => Some(e),
                    Input::Build(_) => None,
                };
                router.ready_tree(es, p, event).await
            }
            Input::Change(event) => router
                .prepare(es, p, &event.columns)
                .await
                .map_err(pipeline::NotReady::Index),
            Input::Build(doc) => match &doc.columns {
                Some(columns) => router
                    .prepare(es, p, columns)
                    .await
                    .map_err(pipeline::NotReady::Index),
                None => Ok(()),
            },
        };
        match prepared {
            Ok(()) => return Ok(true),
            Err(e) if e.is_transient() => {
                tracing::warn!(error = %e, "Elasticsearch or the source unavailable while preparing a pipeline; retrying");
                if !sluice_runtime::shutdown::pause(cfg.etl.retry_backoff * 5, shutdown).await {
                    return Ok(false);
                }
            }
            Err(e) => return Err(e).context("cannot prepare the pipeline's index"),
        }
    }
}

/// Publishes dead letters and waits until Kafka has them all; only then may the batch's
/// offsets be committed. `false` when shutdown came first.
async fn dead_letter(
    producer: &SharedProducer,
    cfg: &EtlConfig,
    batch: &[Msg],
    dead: &[DeadLetter],
    shutdown: &CancellationToken,
) -> anyhow::Result<bool> {
    let topic = &cfg.topics.dead_letter;
    acknowledged(producer, cfg, shutdown, "dead letters", async |p| {
        send_letters(p, topic, batch, dead).await
    })
    .await
}

/// Hands the changes of `delayed` relations to the center (the delayed topic) and waits
/// until Kafka has them all: the batch is not committed before. `false` when shutdown
/// came first.
async fn hand_over(ctx: &Ctx<'_>, delayed: &[sluice_model::DelayedChange]) -> anyhow::Result<bool> {
    if delayed.is_empty() {
        return Ok(true);
    }
    let topic = &ctx.cfg.topics.delayed;
    let sent = acknowledged(
        ctx.producer,
        ctx.cfg,
        ctx.shutdown,
        "delayed changes",
        async |p| {
            let mut deliveries = Vec::with_capacity(delayed.len());
            for change in delayed {
                let payload = serde_json::to_vec(change)?;
                let key = Some(change.pipeline.as_bytes());
                deliveries.push(sluice_kafka::queue(p, topic, key, &payload).await?);
            }
            for d in deliveries {
                d.acknowledged()
                    .await
                    .context("Kafka did not take a delayed change; the batch is not committed")?;
            }
            Ok(())
        },
    )
    .await?;
    if sent {
        for change in delayed {
            METRICS
                .delayed_changes
                .add(1, &metrics::pipeline(&change.pipeline));
        }
    }
    Ok(sent)
}

/// Runs `send` until Kafka acknowledged everything it sent; what was refused is sent
/// again, by a new producer, with backoff. `false` when shutdown came first.
async fn acknowledged(
    producer: &SharedProducer,
    cfg: &EtlConfig,
    shutdown: &CancellationToken,
    what: &str,
    mut send: impl AsyncFnMut(&Producer) -> anyhow::Result<()>,
) -> anyhow::Result<bool> {
    let policy = cfg.etl.backoff();
    let mut backoff = policy.first;
    loop {
        let Err(e) = send(&producer.get()).await else {
            return Ok(true);
        };
        let Some(why) = producer.renew_after(e.as_ref()) else {
            return Err(e);
        };
        tracing::warn!(%why, retry_in = ?backoff, "Kafka refused {what}: sending them again with a new producer");
        if !sluice_runtime::shutdown::pause(backoff, shutdown).await {
            return Ok(false);
        }
        backoff = policy.next(backoff, false);
    }
}

async fn send_letters(
    producer: &Producer,
    topic: &str,
    batch: &[Msg],
    dead: &[DeadLetter],
) -> anyhow::Result<()> {
    let mut deliveries = Vec::with_capacity(dead.len());
    for d in dead {
        let msg = &batch[d.msg];
        let event: Value = serde_json::from_slice(&msg.payload)
            .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&msg.payload).into_owned()));
        tracing::warn!(topic = %msg.topic, partition = msg.partition, offset = msg.offset, reason = %d.reason, "dead-lettering event");
        let payload = serde_json::to_vec(&EventLetter {
            v: LETTER_VERSION,
            reason: d.reason.clone(),
            pipeline: d.pipeline.clone(),
            topic: msg.topic.clone(),
            partition: msg.partition,
            offset: msg.offset,
            event,
        })?;
        let delivery = sluice_kafka::queue(producer, topic, msg.key.as_deref(), &payload)
            .await
            .context("cannot queue a dead letter")?;
        deliveries.push(delivery);
    }
    for delivery in deliveries {
        delivery
            .acknowledged()
            .await
            .context("Kafka did not take a dead letter; the batch is not committed")?;
    }
    Ok(())
}

/// The build marker a message carries (header [`sluice_zk::layout::MARKER_HEADER`]).
fn marker_of(m: &Received) -> Option<sluice_zk::layout::Marker> {
    let marked = m
        .headers
        .iter()
        .any(|(key, _)| key == sluice_zk::layout::MARKER_HEADER);
    if !marked {
        return None;
    }
    match serde_json::from_slice(&m.payload) {
        Ok(marker) => Some(marker),
        Err(e) => {
            tracing::warn!(error = %e, "unreadable build marker; ignoring it");
            None
        }
    }
}

/// Commits, per partition, the offset after the batch's last message.
fn commit(feed: &Feed, batch: &[Msg], mode: CommitMode) {
    let mut next: BTreeMap<(&str, i32), i64> = BTreeMap::new();
    for m in batch {
        let e = next.entry((&m.topic, m.partition)).or_insert(m.offset + 1);
        *e = (*e).max(m.offset + 1);
    }
    // A failed commit (e.g. the group coordinator unreachable) only
    // means the events are applied again, harmlessly.
    let next = next.into_iter().map(|((t, p), o)| (t, p, o));
    if let Err(e) = feed.commit(next, mode) {
        tracing::warn!(error = %e, "offset commit failed; the batch may be replayed");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn msg(topic: &str) -> Msg {
        Msg {
            topic: topic.into(),
            partition: 0,
            offset: 0,
            key: None,
            payload: b"{}".to_vec(),
            marker: None,
        }
    }

    #[test]
    fn changes_read_back_fill_a_batch_ten_times_later_than_documents() {
        let bounds = Bounds {
            docs: 20,
            bytes: 1 << 20,
            linger: Duration::ZERO,
            read_back: HashSet::from(["tree".to_owned()]),
        };
        let mut flat = Batch::default();
        for _ in 0..20 {
            assert!(!flat.full(&bounds));
            flat.add(msg("flat"), &bounds);
        }
        assert!(flat.full(&bounds), "a flat change is a document");

        let mut tree = Batch::default();
        for _ in 0..200 {
            assert!(!tree.full(&bounds), "{} changes read back", tree.msgs.len());
            tree.add(msg("tree"), &bounds);
        }
        assert!(tree.full(&bounds), "ten times as many changes read back");

        let mut mixed = Batch::default();
        for _ in 0..100 {
            mixed.add(msg("tree"), &bounds);
        }
        for _ in 0..19 {
            mixed.add(msg("flat"), &bounds);
        }
        assert!(!mixed.full(&bounds));
        mixed.add(msg("flat"), &bounds);
        assert!(mixed.full(&bounds), "the flat changes still fill it");

        let tight = Bounds {
            bytes: 10,
            ..bounds
        };
        let mut by_size = Batch::default();
        for _ in 0..5 {
            by_size.add(msg("tree"), &tight);
        }
        assert!(
            by_size.full(&tight),
            "the byte bound holds for every change"
        );
    }
}
