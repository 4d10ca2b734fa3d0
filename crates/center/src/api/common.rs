//! What every area of the admin API shares: the service and its view of the cluster
//! (ZooKeeper, the leader, whether this replica may write), and how errors and records
//! become answers.

use std::sync::Arc;

use sluice_model::{PipelineSpec, SourceSpec};
use sluice_mysql::SourceConfig;
use sluice_proto::convert::{self, PipelineState};
use sluice_proto::v1::{self, *};
use sluice_zk::layout::{self, CenterRecord};
use sluice_zk::Coordinator;
use tonic::metadata::MetadataValue;
use tonic::Status;

use crate::error::CenterError;
use crate::meta::{MetaError, StoredPipeline};
use crate::Shared;

/// The metadata (and header) naming the leader's address in a follower's refusal of a
/// write: `sluicectl` follows it, the console shows it.
pub(super) const LEADER_HEADER: &str = "sluice-leader";

#[derive(Clone)]
pub(super) struct AdminApi {
    pub(super) shared: Arc<Shared>,
}

pub(super) fn internal(e: impl std::fmt::Display) -> Status {
    Status::unavailable(e.to_string())
}

/// The center's errors at the API's edge: a refusal or anything retrying cannot mend is
/// `FAILED_PRECONDITION` with the reason, as is a write this replica may no longer make
/// (deposed); what may pass is `UNAVAILABLE`.
pub(super) fn center_err(e: CenterError) -> Status {
    match e {
        CenterError::Definite(_) | CenterError::Deposed(_) => {
            Status::failed_precondition(e.to_string())
        }
        CenterError::Transient(_) | CenterError::SessionExpired(_) => {
            Status::unavailable(e.to_string())
        }
    }
}

/// The meta database's errors at the API's edge: a refusal, with its reason, and a write
/// this replica may no longer make are `FAILED_PRECONDITION`; the rest may pass.
pub(super) fn meta_err(e: MetaError) -> Status {
    match e {
        MetaError::Deposed { .. } | MetaError::Refused(_) => {
            Status::failed_precondition(e.to_string())
        }
        MetaError::NotFound(_) => Status::not_found(e.to_string()),
        e => Status::unavailable(e.to_string()),
    }
}

impl AdminApi {
    pub(super) fn coord(&self) -> Result<Coordinator, Status> {
        self.shared
            .coord()
            .ok_or_else(|| Status::unavailable("not connected to ZooKeeper yet"))
    }

    /// The leading center's record and its epoch, or `None` while nobody leads.
    pub(super) async fn leader(&self) -> Result<Option<(CenterRecord, u64)>, Status> {
        let coord = self.coord()?;
        Ok(coord.leader().await.map_err(internal)?.and_then(|l| {
            let record = serde_json::from_slice(&l.info).ok()?;
            Some((record, l.epoch))
        }))
    }

    /// The epoch to write at, or the leader's address for the caller to go to.
    pub(super) async fn writable(&self) -> Result<u64, Status> {
        if let Some(epoch) = self.shared.leading_epoch() {
            return Ok(epoch);
        }
        let Some((l, _)) = self.leader().await? else {
            return Err(Status::unavailable(
                "no center leads right now; retry shortly",
            ));
        };
        if l.id == self.shared.cfg.center.id {
            return Err(Status::unavailable(
                "this center leads, but its ZooKeeper session is in doubt right now; retry shortly",
            ));
        }
        let mut status = Status::failed_precondition(format!(
            "not the leader: {} at {} leads; send writes there",
            l.id, l.addr
        ));
        if let Ok(v) = MetadataValue::try_from(l.addr.as_str()) {
            status.metadata_mut().insert(LEADER_HEADER, v);
        }
        Err(status)
    }

    /// Delayed changes reach the meta database through the leader's Kafka reader.
    pub(super) fn records_delayed(&self) -> Result<(), Status> {
        if self.shared.cfg.kafka.is_none() {
            return Err(Status::failed_precondition(
                "delayed changes need the centers' [kafka] section (the leader reads them from topics.delayed)",
            ));
        }
        Ok(())
    }

    pub(super) async fn check_message(&self, id: u64) -> Result<Check, Status> {
        self.shared
            .meta
            .run(id)
            .await
            .map_err(meta_err)?
            .map(|c| check_message(&c))
            .ok_or_else(|| Status::not_found(format!("no check {id}")))
    }

    pub(super) fn changed(&self) {
        self.shared.nudge.notify_one();
    }

    /// Records an operator's change as an event of this center (best effort: the change
    /// itself is already stored).
    pub(super) async fn add_event(&self, kind: &str, subject: &str, message: &str) {
        if let Err(e) = self
            .shared
            .meta
            .add_event(&self.shared.cfg.center.id, kind, subject, message)
            .await
        {
            tracing::warn!(kind, subject, error = %e, "cannot record the event");
        }
    }

    /// The pipeline named, or `NOT_FOUND` naming it.
    pub(super) async fn existing(&self, name: &str) -> Result<StoredPipeline, Status> {
        self.pipeline(name)
            .await?
            .ok_or_else(|| Status::not_found(format!("no pipeline `{name}`")))
    }

    pub(super) async fn pipeline(&self, name: &str) -> Result<Option<StoredPipeline>, Status> {
        self.shared.meta.pipeline(name).await.map_err(meta_err)
    }

    /// The pipeline as the API shows it: its spec and its versions' state, with what
    /// the etl found about the live (or building) version needing a rebuild.
    pub(super) async fn message(&self, p: &StoredPipeline) -> Result<Pipeline, Status> {
        let state = PipelineState {
            live_version: p.live_version,
            building_version: p.building_version,
            history: p.history.kept.clone(),
            current_history: p.history.current.clone(),
            needs_rebuild: self.needs_rebuild(p).await?,
            applied: self.applied(&p.spec.name).await?,
        };
        Ok(convert::pipeline(&p.spec, &state))
    }

    /// How far the etl has applied pipeline `name`, per source, as it published.
    pub(super) async fn applied(&self, name: &str) -> Result<Vec<convert::Applied>, Status> {
        let record: Option<layout::AppliedRecord> = self
            .coord()?
            .get_json(&layout::applied(name))
            .await
            .map_err(internal)?;
        let now = sluice_model::now_ms();
        Ok(record
            .map(|r| r.sources)
            .unwrap_or_default()
            .into_iter()
            .map(|(source, a)| convert::Applied {
                source,
                checkpoint: a.checkpoint,
                lag_ms: u64::try_from(now - a.read_at_ms).unwrap_or(0),
            })
            .collect())
    }

    /// Why the pipeline's live (or building) version needs a rebuild, as the etl
    /// recorded it; empty when it does not.
    pub(super) async fn needs_rebuild(&self, p: &StoredPipeline) -> Result<String, Status> {
        let record: Option<layout::NeedsRebuild> = self
            .coord()?
            .get_json(&layout::needs_rebuild(&p.spec.name))
            .await
            .map_err(internal)?;
        Ok(record
            .map(|r| r.reasons(p.live_or_first()))
            .unwrap_or_default())
    }

    /// Checks `spec` against its source's tables: they exist and have the columns it
    /// names. The center reaches the source as the etl does (its password reference
    /// resolved in this center's environment).
    pub(super) async fn check_tables(&self, spec: &PipelineSpec) -> Result<(), Status> {
        match self.compiled(spec).await? {
            Ok(_) => Ok(()),
            Err(problems) => invalid(problems),
        }
    }

    /// `spec` compiled against its source's tables as they are now, with the source: the
    /// inner error lists what does not fit, each naming its key.
    pub(super) async fn compiled(
        &self,
        spec: &PipelineSpec,
    ) -> Result<Result<(SourceConfig, Vec<sluice_mysql::docs::DocPlan>), Vec<String>>, Status> {
        let sources = self.shared.meta.sources().await.map_err(meta_err)?;
        let Some(source) = sources.iter().find(|s| s.name == spec.source) else {
            return Ok(Err(vec![format!(
                "source: no source `{}` (add it first: sluicectl sources put)",
                spec.source
            )]));
        };
        let cannot = |why: String| {
            Status::failed_precondition(format!(
                "cannot check the pipeline against the tables of source {}: {why}",
                spec.source
            ))
        };
        let src = SourceConfig::from_spec(source, &self.shared.cfg.source_access())
            .map_err(|e| cannot(format!("{e} (the centers need the source's password too)")))?;
        let checked = tokio::time::timeout(
            std::time::Duration::from_secs(15),
            sluice_mysql::docs::load(&src, spec),
        )
        .await
        .map_err(|_| {
            Status::unavailable(format!("source {} did not answer within 15 s", spec.source))
        })?
        .map_err(|e| Status::unavailable(e.to_string()))?;
        Ok(checked.map(|plans| (src, plans)))
    }

    /// The pipeline named, as the API shows it.
    pub(super) async fn pipeline_message(&self, name: &str) -> Result<Pipeline, Status> {
        let p = self.existing(name).await?;
        self.message(&p).await
    }
}

pub(super) fn invalid(problems: Vec<String>) -> Result<(), Status> {
    if problems.is_empty() {
        Ok(())
    } else {
        Err(Status::invalid_argument(problems.join("; ")))
    }
}

/// The source of a request, once its fields are sound and its `password_ref` names a
/// secret this center's `[source_secrets]` lets sources name (workers and the etl check
/// theirs when they connect).
pub(super) fn validate_source(
    s: Source,
    secrets: &sluice_model::SecretRefs,
) -> Result<SourceSpec, Status> {
    let spec = convert::source_spec(s).map_err(Status::invalid_argument)?;
    let mut problems = spec.problems();
    if problems.is_empty() {
        if let Err(e) = secrets.admits(&spec.password_ref) {
            problems.push(format!("password_ref: {e}"));
        }
    }
    invalid(problems)?;
    Ok(spec)
}

pub(super) fn validate_pipeline(p: Pipeline) -> Result<PipelineSpec, Status> {
    let spec = convert::pipeline_spec(p)
        .map_err(Status::invalid_argument)?
        .normalized();
    invalid(spec.problems())?;
    Ok(spec)
}

/// A check as the API shows it.
pub(super) fn check_message(c: &crate::meta::ChunkedRun) -> Check {
    let t = &c.tally;
    Check {
        id: c.id,
        pipeline: c.pipeline.clone(),
        version: c.version,
        since: c.since.clone(),
        repair: c.repair,
        state: c.state.as_str().into(),
        run_state: v1::RunState::from(c.state).into(),
        trigger: c.started_by.clone(),
        started_at_ms: c.started_at_ms,
        finished_at_ms: c.finished_at_ms,
        chunks: c.chunks,
        chunks_done: c.chunks_done,
        keys: t.keys,
        missing: t.missing,
        extra: t.extra,
        different: t.different,
        skipped: t.skipped,
        repaired: t.repaired,
        examples: examples(&t.examples),
        error: t.error.clone().unwrap_or_default(),
        kind: c.kind.as_str().to_owned(),
        run_kind: v1::RunKind::from(c.kind).into(),
        scope: c
            .scope
            .as_ref()
            .map(sluice_model::ResyncScope::describe)
            .unwrap_or_default(),
        changes: c.changes,
        live: (!t.live.is_empty()).then(|| LiveComparison {
            version: t.live.version,
            same: t.live.same,
            only_new: t.live.only_new,
            only_live: t.live.only_live,
            different: t.live.different,
            skipped: t.live.skipped,
            examples: examples(&t.live.examples),
        }),
    }
}

pub(super) fn examples(list: &[sluice_zk::layout::CheckExample]) -> Vec<CheckExample> {
    list.iter()
        .map(|e| CheckExample {
            kind: e.kind.clone(),
            id: e.id.clone(),
            detail: e.detail.clone(),
        })
        .collect()
}
