//! Cluster mode: the pipelines the center publishes in ZooKeeper (`pipelines/<name>`),
//! followed with watches so pipelines are added, changed and removed without a restart.

use std::time::Duration;

use sluice_model::RetryPolicy;
use sluice_mysql::SourceConfig;
use sluice_zk::layout::{EtlRecord, Marker, NeedsRebuild, PipelineRecord, SourceRecord};
use sluice_zk::{Coordinator, SessionEnd, SessionState, Sessions, ZkConfig};
use tokio::sync::{mpsc, oneshot, watch};
use tokio_util::sync::CancellationToken;

use crate::ddl::Rewritten;
use crate::pipeline::{Active, Verdict};

/// What the etl has the follower record in ZooKeeper before it commits the offsets of the
/// batch that found it: committed first, a crash would lose it for good (the messages
/// that carried it are not read again).
pub(crate) enum Note {
    /// Documents DDL changed (`pipelines/<name>/needs_rebuild`).
    Rewrites(Vec<Rewritten>),
    /// A build marker applied on `partition` (`builds/<name>/caught_up/<partition>`): every
    /// document of the build before it on that partition is in Elasticsearch.
    CaughtUp { marker: Marker, partition: i32 },
}

/// Notes to record; each is answered once it is.
pub(crate) type NotesTx = mpsc::UnboundedSender<(Note, oneshot::Sender<()>)>;

/// Has the follower record `note` in ZooKeeper and waits until it has; `false` when
/// shutdown came first (the batch is then left uncommitted: it is read again).
pub(crate) async fn send_note(tx: &NotesTx, note: Note, shutdown: &CancellationToken) -> bool {
    let (done, recorded) = oneshot::channel();
    if tx.send((note, done)).is_err() {
        return false;
    }
    tokio::select! {
        r = recorded => r.is_ok(),
        _ = shutdown.cancelled() => false,
    }
}

/// What the follower keeps in step with ZooKeeper.
pub(crate) struct Follow {
    pub zk: ZkConfig,
    pub retry: RetryPolicy,
    /// This member's id in `etls/` (`etl.instance_id` when set).
    pub member: String,
    /// Its Kafka consumer group: the members of the same group share the partitions.
    pub group: String,
    /// Out: the live members of the group (this one among them once registered), sorted.
    pub members: watch::Sender<Option<Vec<String>>>,
    pub from_file: Vec<Active>,
    /// The file's sources (preferred to the center's records of the same name).
    pub file_sources: Vec<SourceConfig>,
    /// How to reach the center's sources (`source_tls`, `source_plaintext_hosts`,
    /// `[source_secrets]`).
    pub source_access: sluice_mysql::Access,
    /// Out: the file's pipelines plus the center's.
    pub pipelines: watch::Sender<Option<Vec<Active>>>,
    /// In: the versions being built this member writes to (published in `etls/<member>`,
    /// which the leader waits on before a build reads anything).
    pub applied: watch::Receiver<EtlRecord>,
    /// In: whether index versions need a rebuild, recorded in
    /// `pipelines/<name>/needs_rebuild` for the center's pipelines.
    pub verdicts: mpsc::UnboundedReceiver<Verdict>,
    /// In: what to record before a batch's offsets are committed, each answered once
    /// recorded.
    pub notes: mpsc::UnboundedReceiver<(Note, oneshot::Sender<()>)>,
}

/// Keeps the pipelines equal to the file's plus the center's (a center pipeline with the
/// name of a file pipeline is ignored: the file wins), registers this member with what
/// it applies, and records applied build markers; until `shutdown`.
pub(crate) async fn keep_in_step(mut f: Follow, shutdown: CancellationToken) {
    // Notes not recorded yet (ZooKeeper unavailable): tried again until they are.
    let mut pending: Vec<(Note, oneshot::Sender<()>)> = Vec::new();
    let mut sessions = Sessions::new(f.zk.clone(), f.retry, "the pipelines", shutdown.clone());
    while let Some(coord) = sessions.next().await {
        let session = coord.session();
        let mut backoff = f.retry.backoff();
        // Notes that could not be recorded are tried again with pauses of their own.
        let mut recording = f.retry.backoff();
        while !shutdown.is_cancelled() && *session.borrow() != SessionState::Expired {
            let step = async {
                let (list, mut watches) =
                    look(&coord, &f.from_file, &f.file_sources, &f.source_access).await?;
                let (members, w) = members_of(&coord, &f.group).await?;
                watches.push(w);
                f.members.send_if_modified(|current| {
                    let changed = current.as_ref() != Some(&members);
                    if changed {
                        tracing::info!(?members, "etl members changed");
                        *current = Some(members);
                    }
                    changed
                });
                f.pipelines.send_if_modified(|current| {
                    if current.as_ref() == Some(&list) {
                        false
                    } else {
                        tracing::info!(
                            pipelines = ?list.iter().map(|p| p.spec.name.as_str()).collect::<Vec<_>>(),
                            "pipelines changed"
                        );
                        *current = Some(list);
                        true
                    }
                });
                let me = serde_json::to_vec(&*f.applied.borrow_and_update()).expect("serializes");
                coord
                    .register(&sluice_zk::layout::etl(&f.member), &me, &shutdown)
                    .await?;
                Ok::<_, sluice_zk::ZkError>(watches)
            };
            let watches = match step.await {
                Ok(w) => {
                    backoff.reset();
                    w
                }
                Err(e) => {
                    let pause = backoff.next_pause();
                    tracing::warn!(error = %e, retry_in = ?pause, "cannot follow the pipelines; retrying");
                    sluice_runtime::shutdown::pause(pause, &shutdown).await;
                    continue;
                }
            };
            record_pending(&coord, &f.from_file, &mut pending).await;
            let again = if pending.is_empty() {
                recording.reset();
                Duration::ZERO
            } else {
                recording.next_pause()
            };
            tokio::select! {
                _ = coord.wait_any(watches, &shutdown) => {}
                Some(n) = f.notes.recv() => pending.push(n),
                _ = tokio::time::sleep(again), if !pending.is_empty() => {}
                _ = f.applied.changed() => {}
                Some(v) = f.verdicts.recv() => {
                    if !f.from_file.iter().any(|p| p.spec.name == v.pipeline) {
                        if let Err(e) = record_verdict(&coord, &v).await {
                            tracing::warn!(error = %e, pipeline = %v.pipeline, "cannot record whether the index needs a rebuild");
                        }
                    }
                }
            }
        }
        sessions.ended(coord, SessionEnd::Ended).await;
    }
}

/// Records what it can of `pending` and answers those recorded; the rest is tried again
/// on the next pass.
async fn record_pending(
    coord: &Coordinator,
    from_file: &[Active],
    pending: &mut Vec<(Note, oneshot::Sender<()>)>,
) {
    let mut left = Vec::new();
    for (note, done) in pending.drain(..) {
        match record_note(coord, from_file, &note).await {
            Ok(()) => {
                let _ = done.send(());
            }
            Err(e) => {
                tracing::warn!(error = %e, "cannot record what the batch found yet; the batch waits");
                left.push((note, done));
            }
        }
    }
    *pending = left;
}

async fn record_note(
    coord: &Coordinator,
    from_file: &[Active],
    note: &Note,
) -> Result<(), sluice_zk::ZkError> {
    match note {
        Note::Rewrites(rewritten) => {
            let center_pipelines = rewritten
                .iter()
                .filter(|r| !from_file.iter().any(|p| p.spec.name == r.pipeline));
            for r in center_pipelines {
                record_rewrite(coord, r).await?;
            }
        }
        Note::CaughtUp { marker, partition } => {
            let rel = format!(
                "{}/{partition}",
                sluice_zk::layout::build_caught_up(&marker.pipeline)
            );
            let data = marker.version.to_string();
            coord
                .put(&rel, data.as_bytes(), sluice_zk::Expect::Any)
                .await?;
            tracing::info!(pipeline = %marker.pipeline, version = marker.version, partition, "build marker applied");
        }
    }
    Ok(())
}

/// Adds the reason to each version of `r` in `pipelines/<name>/needs_rebuild` (once),
/// while the pipeline exists.
async fn record_rewrite(coord: &Coordinator, r: &Rewritten) -> Result<(), sluice_zk::ZkError> {
    update_needs_rebuild(coord, &r.pipeline, |record| {
        for v in &r.versions {
            let reasons = record.rewritten.entry(*v).or_default();
            if !reasons.contains(&r.reason) {
                reasons.push(r.reason.clone());
            }
        }
    })
    .await
}

/// Records (or clears) a version's need for a rebuild.
async fn record_verdict(coord: &Coordinator, v: &Verdict) -> Result<(), sluice_zk::ZkError> {
    update_needs_rebuild(coord, &v.pipeline, |record| match &v.needs_rebuild {
        Some(why) => {
            record.versions.insert(v.version, why.clone());
        }
        None => {
            record.versions.remove(&v.version);
        }
    })
    .await
}

/// Applies `change` to `pipelines/<name>/needs_rebuild`; written only when it changes,
/// and only while the pipeline exists. Another etl member writing meanwhile makes it
/// read again.
async fn update_needs_rebuild(
    coord: &Coordinator,
    pipeline: &str,
    change: impl Fn(&mut NeedsRebuild),
) -> Result<(), sluice_zk::ZkError> {
    let rel = sluice_zk::layout::needs_rebuild(pipeline);
    loop {
        if coord
            .get(&sluice_zk::layout::pipeline(pipeline))
            .await?
            .is_none()
        {
            return Ok(());
        }
        let node = coord.get(&rel).await?;
        let mut record: NeedsRebuild = node
            .as_ref()
            .and_then(|n| serde_json::from_slice(&n.data).ok())
            .unwrap_or_default();
        let before = record.clone();
        change(&mut record);
        if record == before {
            return Ok(());
        }
        let expect = node.map_or(sluice_zk::Expect::Absent, |n| {
            sluice_zk::Expect::Version(n.version)
        });
        let data = serde_json::to_vec(&record).expect("serializes");
        match coord.put(&rel, &data, expect).await {
            Ok(_) => {
                tracing::info!(%pipeline, needs_rebuild = %record.reasons(0), "recorded for the center");
                return Ok(());
            }
            Err(e) if e.is_conflict() => continue,
            Err(e) => return Err(e),
        }
    }
}

/// The etl members of `group` registered now, sorted, and a watch on members coming and
/// going. A member whose record names no group yet (it has just started) counts.
async fn members_of(
    coord: &Coordinator,
    group: &str,
) -> Result<(Vec<String>, sluice_zk::Watch), sluice_zk::ZkError> {
    let (names, w) = coord.children_watched("etls").await?;
    let mut members = Vec::new();
    for name in names {
        let Some(node) = coord.get(&sluice_zk::layout::etl(&name)).await? else {
            continue;
        };
        let same = serde_json::from_slice::<EtlRecord>(&node.data)
            .map_or(true, |r| r.group.is_empty() || r.group == group);
        if same {
            members.push(name);
        }
    }
    Ok((members, w))
}

async fn look(
    coord: &Coordinator,
    from_file: &[Active],
    file_sources: &[SourceConfig],
    access: &sluice_mysql::Access,
) -> Result<(Vec<Active>, Vec<sluice_zk::Watch>), sluice_zk::ZkError> {
    let (names, w) = coord.children_watched("pipelines").await?;
    let mut watches = vec![w];
    let mut list = Vec::new();
    for p in from_file {
        let mut p = p.clone();
        if !p.spec.is_flat() && p.source.is_err() {
            p.source = source_of(coord, &p.spec.source, file_sources, access, &mut watches).await?;
        }
        list.push(p);
    }
    for name in names {
        let (node, w) = coord
            .get_watched(&sluice_zk::layout::pipeline(&name))
            .await?;
        watches.push(w);
        let Some(node) = node else { continue };
        match serde_json::from_slice::<PipelineRecord>(&node.data) {
            Ok(r) if from_file.iter().any(|p| p.spec.name == r.spec.name) => {
                tracing::warn!(pipeline = %r.spec.name, "the center's pipeline has the name of one in the file; using the file's");
            }
            Ok(r) => {
                let source = if r.spec.is_flat() {
                    Err("not needed: its documents are its rows".to_owned())
                } else {
                    source_of(coord, &r.spec.source, file_sources, access, &mut watches).await?
                };
                list.push(Active {
                    spec: r.spec,
                    building: r.building,
                    history: r.history,
                    source,
                });
            }
            Err(e) => {
                tracing::warn!(pipeline = %name, error = %e, "unreadable pipeline record; ignoring it")
            }
        }
    }
    Ok((list, watches))
}

/// How to reach source `name`: from the etl's file, else from the center's record (with
/// a watch on it), its password resolved in this process's environment.
async fn source_of(
    coord: &Coordinator,
    name: &str,
    file_sources: &[SourceConfig],
    access: &sluice_mysql::Access,
    watches: &mut Vec<sluice_zk::Watch>,
) -> Result<Result<SourceConfig, String>, sluice_zk::ZkError> {
    if let Some(s) = file_sources.iter().find(|s| s.name == name) {
        return Ok(Ok(s.clone()));
    }
    let (node, w) = coord.get_watched(&sluice_zk::layout::mapping(name)).await?;
    watches.push(w);
    Ok(match node {
        None => Err(format!("no source `{name}` in the center's records")),
        Some(n) => match serde_json::from_slice::<SourceRecord>(&n.data) {
            Ok(r) => SourceConfig::from_spec(&r.spec, access),
            Err(e) => Err(format!(
                "the center's record of source `{name}` is unreadable: {e}"
            )),
        },
    })
}
