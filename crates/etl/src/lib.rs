//! `sluice-etl`: consumes change events from Kafka and applies them to Elasticsearch as
//! versioned bulk writes (README invariants 2, 3, 5 and 6).
//!
//! A batch (bounded by documents, bytes and linger time) is applied in full before its
//! offsets are committed: every item is either written, found stale (409: a newer version
//! is already there), or dead-lettered with its reason; 429/5xx items are retried with
//! backoff. A crash before the commit only replays events, which versions make harmless.
//! Several batches are written at once and commit in the order they were consumed
//! ([`flight`]).

mod applied;
mod batch;
pub mod config;
mod ddl;
mod dirty;
mod docs;
pub mod error;
mod flight;
mod follow;
mod index;
mod land;
mod metrics;
mod pipeline;
mod plan;
mod share;
mod write;

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::time::Duration;

use sluice_elastic::EsClient;
use sluice_kafka::{CommitMode, Feed, TopicConfig};
use sluice_runtime::ConfigError;
use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

pub use config::EtlConfig;
pub use error::EtlError;
pub use share::owns;
pub use sluice_mapping as mapping;
pub use sluice_mapping::{field_mapping, index_body, IndexSettings};

use batch::{collect, Bounds};
use flight::Flight;
use land::{apply, drain, write_held, Ctx, Held, MayHold, Stats};
use pipeline::{Active, Router};
use sluice_runtime::telemetry::Readiness;

use crate::error::{Context as _, Result};

/// Loads and validates the configuration; errors name the offending keys.
pub fn load(path: &Path) -> Result<EtlConfig, ConfigError> {
    let mut cfg: EtlConfig = sluice_runtime::load_config(Some(path), "SLUICE")?;
    cfg.validate().map_err(ConfigError::Problems)?;
    sluice_runtime::unreadable_tls(&cfg.mysql_tls())?;
    cfg.pipelines = cfg
        .pipelines
        .into_iter()
        .map(sluice_model::PipelineSpec::normalized)
        .map(whole_unless_said)
        .collect();
    Ok(cfg)
}

/// A pipeline of the etl's own file is written whole unless it says `area_updates = true`:
/// the tombstones deletes leave in documents written in parts are swept by a center's
/// leader, which does not know these pipelines (README, "Area updates").
fn whole_unless_said(mut spec: sluice_model::PipelineSpec) -> sluice_model::PipelineSpec {
    spec.area_updates.get_or_insert(false);
    spec
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

/// Runs until `shutdown` is cancelled, then applies and commits the batch in hand.
///
/// The loop is kept whole, past 80 lines, so that a batch's life reads in one
/// place: re-route, re-share, collect while earlier batches land, apply, drain at the end.
pub async fn run(cfg: EtlConfig, ready: Readiness, shutdown: CancellationToken) -> Result<()> {
    let (es, producer, feed) = clients(&cfg).await?;
    let me = cfg
        .etl
        .instance_id
        .clone()
        .unwrap_or_else(|| format!("etl-{}", sluice_model::now_ms()));
    let (follower, mut links) = follow_pipelines(&cfg, &me, &shutdown);
    let mut sources = docs::Sources::default();
    let mut flight = Flight::new(cfg.etl.max_in_flight);
    let mut held = Held::default();
    let mut routing = Routing::new(&cfg);
    let ctx = Ctx {
        es: &es,
        producer: &producer,
        feed: &feed,
        cfg: &cfg,
        shutdown: &shutdown,
        notes: follower.is_some().then_some(&links.notes),
    };
    let mut stats = Stats::default();
    let mut last_report = Instant::now();
    let mut reroute = false;
    let mut pace = batch::Pace::starting();
    loop {
        let rerouting = routing.due(reroute, &links.pipelines);
        if rerouting || routing.reshare_due(&links.members) {
            // What is held was planned with the pipelines and partitions in force.
            let router = &routing.router;
            let (sources, flight) = (&mut sources, &mut flight);
            if !write_held(&ctx, router, sources, flight, &mut held, &mut stats).await? {
                interrupted();
                break;
            }
        }
        if rerouting {
            // What is in flight was planned with the pipelines in force: it lands first.
            if !drain(
                &ctx,
                &routing.router,
                &mut flight,
                &mut stats,
                CommitMode::Async,
            )
            .await?
            {
                interrupted();
                break;
            }
            let list = links
                .pipelines
                .borrow_and_update()
                .clone()
                .unwrap_or_default();
            if routing.reroute(&cfg, &feed, &es, &list).await {
                metrics::zero(list.iter().map(|p| p.spec.name.as_str()));
                ready.set(true);
                // Tell the center which versions this member now writes to.
                links.applied.send_replace(record_of(&cfg, &list, &feed));
            }
        }
        routing.reshare_if_due(&cfg.topics, &feed, &mut links.members, &me, &links.applied);
        // For the center: which index versions need a rebuild, as the last re-route or
        // batch found (none without ZooKeeper; the router logged them). Before waiting for
        // the next batch, which may not come soon.
        for v in routing.router.verdicts.drain(..) {
            let _ = links.verdicts.send(v);
        }
        // The next batch is collected while earlier ones are written; those land as
        // their writes finish.
        let mut due = routing.next_look(links.members.borrow().is_some());
        due = held.due().map_or(due, |at| at.min(due));
        let first = pace.first();
        let collecting = collect(
            &feed,
            &routing.bounds,
            &mut links.pipelines,
            &mut links.members,
            due,
            &mut pace,
            &shutdown,
        );
        let collected = land_while(&ctx, &routing.router, &mut flight, &mut stats, collecting);
        let Some((batch, stop, r)) = collected.await? else {
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
        // A full batch: more are waiting, and documents read back may be held for them.
        // So is the first: a starting etl most often finds a backlog, which its consumer
        // is still fetching from every partition when the first batch goes. Otherwise
        // they are held while the last read back is under way, and go once it is done.
        let may_hold = if stop || reroute {
            MayHold::No
        } else if batch.full(&routing.bounds) || first {
            MayHold::Backlog
        } else {
            MayHold::WhileReading
        };
        let applied = if batch.msgs.is_empty() {
            if may_hold != MayHold::No && held.may_wait(&routing.bounds) {
                true
            } else {
                let router = &routing.router;
                let (sources, flight) = (&mut sources, &mut flight);
                write_held(&ctx, router, sources, flight, &mut held, &mut stats).await?
            }
        } else {
            let router = &mut routing.router;
            let (sources, flight) = (&mut sources, &mut flight);
            let (held, stats) = (&mut held, &mut stats);
            let bounds = &routing.bounds;
            apply(
                &ctx, router, sources, flight, held, batch, stats, bounds, may_hold,
            )
            .await?
        };
        if !applied {
            interrupted();
            break;
        }
        report_progress(&stats, &mut last_report);
        if stop {
            if !drain(&ctx, &routing.router, &mut flight, &mut stats, mode).await? {
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

/// How long the brokers have to answer the check at start.
const ACCESS_WITHIN: Duration = Duration::from_secs(10);

/// The clients the etl works with: Elasticsearch, the producer of dead letters and
/// hand-overs (their topics created), and the consumer of the change topics.
async fn clients(cfg: &EtlConfig) -> Result<(EsClient, sluice_kafka::SharedProducer, Feed)> {
    let es = cfg.elasticsearch.client().context("elasticsearch")?;
    // Credentials and certificates refused at start stop the etl naming the setting.
    sluice_kafka::check_access(&cfg.kafka, ACCESS_WITHIN)
        .await
        .map_err(EtlError::definite)?;
    sluice_elastic::EsSection::check_access(&es, "elasticsearch")
        .await
        .map_err(EtlError::definite)?;
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
    Ok((es, producer, feed))
}

/// Between the batch loop and the follower (or, without ZooKeeper, the file alone).
struct Links {
    /// In: the pipelines in force.
    pipelines: watch::Receiver<Option<Vec<Active>>>,
    /// In: the live members of the group, once known.
    members: watch::Receiver<Option<Vec<String>>>,
    /// Out: what this member applies (its record in `etls/`).
    applied: watch::Sender<sluice_zk::layout::EtlRecord>,
    /// Out: whether index versions need a rebuild.
    verdicts: tokio::sync::mpsc::UnboundedSender<pipeline::Verdict>,
    /// Out: what to record before a batch's offsets are committed.
    notes: follow::NotesTx,
}

/// The pipelines and members this member follows: from the center and the file when a
/// `[zookeeper]` section is set (the follower's task, returned), from the file alone
/// otherwise, this member then consuming every partition.
fn follow_pipelines(
    cfg: &EtlConfig,
    me: &str,
    shutdown: &CancellationToken,
) -> (Option<tokio::task::JoinHandle<()>>, Links) {
    let (pipelines_tx, pipelines) = watch::channel(None);
    let (applied, applied_rx) = watch::channel(sluice_zk::layout::EtlRecord::default());
    let (verdicts, verdicts_rx) = tokio::sync::mpsc::unbounded_channel();
    let (notes, notes_rx) = tokio::sync::mpsc::unbounded_channel();
    let (members_tx, members) = watch::channel(None::<Vec<String>>);
    let follower = match &cfg.zookeeper {
        Some(zk) => Some(tokio::spawn(follow_and_track(
            follow::Follow {
                zk: zk.clone(),
                retry: cfg.etl.retry(),
                member: me.to_owned(),
                group: cfg.etl.group_id.clone(),
                members: members_tx,
                from_file: file_pipelines(cfg),
                file_sources: cfg.sources.clone(),
                source_access: cfg.source_access(),
                pipelines: pipelines_tx,
                applied: applied_rx,
                verdicts: verdicts_rx,
                notes: notes_rx,
            },
            applied::Tracking {
                zk: zk.clone(),
                kafka: cfg.kafka.clone(),
                topics: cfg.topics.clone(),
                retry: cfg.etl.retry(),
                group: cfg.etl.group_id.clone(),
                member: me.to_owned(),
                interval: cfg.etl.applied_interval,
                pipelines: pipelines.clone(),
                members: members.clone(),
            },
            shutdown.clone(),
        ))),
        None => {
            pipelines_tx.send_replace(Some(file_pipelines(cfg)));
            members_tx.send_replace(Some(Vec::new()));
            None
        }
    };
    let links = Links {
        pipelines,
        members,
        applied,
        verdicts,
        notes,
    };
    (follower, links)
}

/// Follows the pipelines and publishes how far they are applied, until `shutdown`.
async fn follow_and_track(
    follow: follow::Follow,
    tracking: applied::Tracking,
    shutdown: CancellationToken,
) {
    tokio::join!(
        follow::keep_in_step(follow, shutdown.clone()),
        applied::track(tracking, shutdown)
    );
}

/// The pipelines in force, the topics they read and the partitions of them this member
/// consumes, and when to look at each again.
struct Routing {
    router: Router,
    topics: BTreeSet<String>,
    bounds: Bounds,
    /// A change of the pipelines that could not be applied yet: when to try again.
    retry_at: Option<Instant>,
    backoff: sluice_model::Backoff,
    /// When to look at the topics' partitions again (a topic may gain some).
    reshare_at: Instant,
    /// A sharded table has a topic not consumed yet: re-route.
    new_shards: bool,
    reshare_backoff: sluice_model::Backoff,
}

impl Routing {
    fn new(cfg: &EtlConfig) -> Self {
        Routing {
            router: Router::new(&[], &cfg.topics, &[]),
            topics: BTreeSet::new(),
            bounds: Bounds::new(cfg),
            retry_at: None,
            backoff: cfg.etl.retry().backoff(),
            reshare_at: Instant::now(),
            new_shards: false,
            reshare_backoff: cfg.etl.retry().backoff(),
        }
    }

    /// Whether to re-route now: asked to, a retry is due, the pipelines changed, or a
    /// sharded table has a new shard's topic.
    fn due(&self, asked: bool, pipelines: &watch::Receiver<Option<Vec<Active>>>) -> bool {
        asked
            || self.new_shards
            || self.retry_at.is_some_and(|at| Instant::now() >= at)
            || pipelines.has_changed().unwrap_or(false)
    }

    /// Routes by `list` from now on; `false` when it cannot yet (the pipelines in force
    /// stay, and it is tried again after a pause).
    async fn reroute(
        &mut self,
        cfg: &EtlConfig,
        feed: &Feed,
        es: &EsClient,
        list: &[Active],
    ) -> bool {
        match route(cfg, feed, list, &self.topics).await {
            Ok((mut r, t)) => {
                r.check_known(es, &self.router.seen_columns()).await;
                self.router = r;
                self.bounds.read_back = t
                    .iter()
                    .filter(|t| self.router.reads_back(t))
                    .cloned()
                    .collect();
                if t != self.topics {
                    self.topics = t;
                    self.reshare_at = Instant::now();
                }
                self.new_shards = false;
                self.retry_at = None;
                self.backoff.reset();
                true
            }
            Err(e) => {
                let pause = self.backoff.next_pause();
                tracing::warn!(error = %e, retry_in = ?pause, "cannot apply the changed pipelines yet; retrying");
                self.retry_at = Some(Instant::now() + pause);
                false
            }
        }
    }

    /// With sharded tables, whether the cluster has a topic of theirs not consumed yet (a
    /// shard created since): they are routed again, and the new topic consumed from its
    /// start.
    fn look_for_shards(&mut self, feed: &Feed, topics: &TopicConfig) {
        if !self.router.sharded() {
            return;
        }
        match feed.topic_names() {
            Ok(existing) => {
                self.new_shards = self.router.topics_with(topics, &existing) != self.topics;
                tracing::debug!(found = self.new_shards, "looked for new shards' topics");
            }
            Err(e) => {
                tracing::warn!(error = %e, "cannot list the topics of the sharded tables; looking again later")
            }
        }
    }

    /// Whether the partitions are to be shared again: the members changed, or it is time
    /// to look.
    fn reshare_due(&self, members: &watch::Receiver<Option<Vec<String>>>) -> bool {
        let known = members.borrow().is_some();
        known && (members.has_changed().unwrap_or(false) || Instant::now() >= self.reshare_at)
    }

    /// Shares the partitions again when [`Self::reshare_due`].
    fn reshare_if_due(
        &mut self,
        topics: &TopicConfig,
        feed: &Feed,
        members: &mut watch::Receiver<Option<Vec<String>>>,
        me: &str,
        record: &watch::Sender<sluice_zk::layout::EtlRecord>,
    ) {
        if self.reshare_due(members) {
            self.look_for_shards(feed, topics);
            let list = members.borrow_and_update().clone().unwrap_or_default();
            let backoff = &mut self.reshare_backoff;
            self.reshare_at = reshare(feed, &self.topics, list, me, record, backoff);
        }
    }

    /// When the collection of a batch must stop waiting to look again (until the members
    /// are known, their arrival wakes it).
    fn next_look(&self, members_known: bool) -> Instant {
        self.retry_at
            .into_iter()
            .chain(members_known.then_some(self.reshare_at))
            .min()
            .unwrap_or_else(|| Instant::now() + Duration::from_secs(3600))
    }
}

/// This member's record for the center: the versions it builds and keeps as history,
/// its pipelines, its group and the partitions it consumes.
fn record_of(cfg: &EtlConfig, list: &[Active], feed: &Feed) -> sluice_zk::layout::EtlRecord {
    sluice_zk::layout::EtlRecord {
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
    }
}

/// Lands the batches in flight whose writes finish while `collecting` runs; its batch,
/// or `None` when shutdown interrupted a landing.
async fn land_while(
    ctx: &Ctx<'_>,
    router: &Router,
    flight: &mut land::InFlight,
    stats: &mut Stats,
    collecting: impl std::future::Future<Output = (batch::Batch, bool, bool)>,
) -> Result<Option<(batch::Batch, bool, bool)>> {
    tokio::pin!(collecting);
    loop {
        tokio::select! {
            biased;
            landed = flight.land(), if !flight.is_empty() => {
                if !land::land(ctx, router, landed?, stats, CommitMode::Async).await? {
                    return Ok(None);
                }
            }
            c = &mut collecting => return Ok(Some(c)),
        }
    }
}

/// A progress line every 10 s while events flow.
fn report_progress(stats: &Stats, last: &mut Instant) {
    if last.elapsed() >= Duration::from_secs(10) && stats.events > 0 {
        tracing::info!(
            events = stats.events,
            written = stats.written,
            stale = stats.stale,
            retried = stats.retried,
            dead_lettered = stats.dead_lettered,
            "progress"
        );
        *last = Instant::now();
    }
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
    feed: &Feed,
    pipelines: &[Active],
    current: &BTreeSet<String>,
) -> Result<(Router, BTreeSet<String>)> {
    let sharded = pipelines.iter().any(|p| !p.spec.patterns().is_empty());
    let existing = if sharded {
        feed.topic_names()
            .context("cannot list the topics of the sharded tables")?
    } else {
        Vec::new()
    };
    let router = Router::new(pipelines, &cfg.topics, &existing);
    let topics = router.topics();
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
    backoff: &mut sluice_model::Backoff,
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
        Ok(missing) if missing.is_empty() => {
            backoff.reset();
            Instant::now() + RESHARE_EVERY
        }
        Ok(missing) => {
            // Topics just created: their partitions are taken as soon as the cluster's
            // metadata shows them, not at the next regular look.
            let pause = backoff.next_pause();
            tracing::debug!(topics = ?missing, retry_in = ?pause, "topics not in the cluster's metadata yet");
            Instant::now() + pause
        }
        Err(e) => {
            let pause = backoff.next_pause();
            tracing::warn!(error = %e, retry_in = ?pause, "cannot take this member's partitions yet; retrying");
            Instant::now() + pause
        }
    }
}
