//! The gRPC API every replica serves: `sluice.v1.Admin`, `sluice.v1.WorkerReports`, the
//! standard health service and reflection (so `grpcurl` works). Admin and reports are
//! authenticated as configured (`api.auth`); health and reflection are open, for probes.
//!
//! Reads answer from ZooKeeper and the meta database on any replica. Writes are the
//! leader's: a follower answers `FAILED_PRECONDITION` naming the leader's address, which
//! `sluicectl` follows.

use std::collections::BTreeMap;
use std::sync::Arc;

use sluice_proto::v1::admin_server::{Admin, AdminServer};
use sluice_proto::v1::worker_reports_server::{WorkerReports, WorkerReportsServer};
use sluice_proto::v1::*;
use sluice_zk::layout::{self, AssignmentRecord, CenterRecord, RunKind, WorkerRecord};
use sluice_zk::Coordinator;
use subtle::ConstantTimeEq as _;
use tokio_util::sync::CancellationToken;
use tonic::metadata::MetadataValue;
use tonic::service::Interceptor;
use tonic::transport::{Certificate, Identity, Server, ServerTlsConfig};
use tonic::{Request, Response, Status};

use sluice_model::{PipelineSpec, Restart, SourceSpec};
use sluice_mysql::SourceConfig;
use sluice_proto::convert::{self, PipelineState};

use crate::config::AuthMode;
use crate::dict::{self, Dictionary};
use crate::error::{CenterError, Result as CenterResult};
use crate::meta::{MetaError, StoredPipeline};
use crate::Shared;

/// Serves until `shutdown`.
pub async fn serve(shared: Arc<Shared>, shutdown: CancellationToken) -> CenterResult<()> {
    let api = &shared.cfg.api;
    let (admin_auth, reports_auth) = Auth::from_config(&shared.cfg)?;
    let (health, health_service) = tonic_health::server::health_reporter();
    let probes = tokio::spawn(crate::probe::dependencies(
        shared.clone(),
        health.clone(),
        shutdown.clone(),
    ));
    let readiness = tokio::spawn(report_health(health, shared.clone(), shutdown.clone()));
    let reflection = tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(sluice_proto::FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
        .build_v1()
        .map_err(CenterError::definite)?;
    let service = AdminApi {
        shared: shared.clone(),
    };
    let mut server = Server::builder();
    if let (Some(cert), Some(key)) = (&api.tls_cert, &api.tls_key) {
        let mut tls = ServerTlsConfig::new().identity(Identity::from_pem(
            std::fs::read(cert).map_err(|e| {
                CenterError::definite(format!("api.tls_cert: {}: {e}", cert.display()))
            })?,
            std::fs::read(key).map_err(|e| {
                CenterError::definite(format!("api.tls_key: {}: {e}", key.display()))
            })?,
        ));
        if let Some(ca) = &api.client_ca {
            tls = tls.client_ca_root(Certificate::from_pem(std::fs::read(ca).map_err(|e| {
                CenterError::definite(format!("api.client_ca: {}: {e}", ca.display()))
            })?));
        }
        server = server.tls_config(tls).map_err(CenterError::definite)?;
    }
    let listen = shared.cfg.center.listen;
    tracing::info!(%listen, auth = ?api.auth, "gRPC API listening");
    let served = server
        .add_service(health_service)
        .add_service(reflection)
        .add_service(AdminServer::with_interceptor(service.clone(), admin_auth))
        .add_service(WorkerReportsServer::with_interceptor(service, reports_auth))
        .serve_with_shutdown(listen, shutdown.clone().cancelled_owned())
        .await
        .map_err(|e| CenterError::definite(format!("gRPC API on {listen}: {e}")));
    shutdown.cancel();
    let _ = readiness.await;
    let _ = probes.await;
    served
}

/// Health as probes see it: SERVING while this replica's ZooKeeper session is confirmed
/// alive (it can answer reads and campaign), NOT_SERVING otherwise and once shutting down.
/// Checked every second.
async fn report_health(
    health: tonic_health::server::HealthReporter,
    shared: Arc<Shared>,
    shutdown: CancellationToken,
) {
    use tonic_health::ServingStatus;
    let mut last = None;
    loop {
        let serving = !shutdown.is_cancelled() && shared.coord().is_some_and(|c| c.is_live());
        shared.ready.set(serving);
        if last != Some(serving) {
            let status = if serving {
                ServingStatus::Serving
            } else {
                ServingStatus::NotServing
            };
            health.set_service_status("", status).await;
            health.set_service_status("sluice.v1.Admin", status).await;
            health
                .set_service_status("sluice.v1.WorkerReports", status)
                .await;
            tracing::info!(serving, "health");
            last = Some(serving);
        }
        if shutdown.is_cancelled() {
            return;
        }
        tokio::select! {
            _ = tokio::time::sleep(std::time::Duration::from_secs(1)) => {}
            _ = shutdown.cancelled() => {}
        }
    }
}

/// Bearer-token check (mTLS is enforced by the TLS layer itself). The admin token opens
/// both services; the workers' token only the reports.
#[derive(Clone)]
struct Auth {
    admin: Option<Arc<str>>,
    worker: Option<Arc<str>>,
    /// Whether this guards the reports service (else the admin service).
    reports: bool,
}

/// A token from its value or its file, named by `key` in errors; `None` when neither is set.
fn token(
    value: &Option<sluice_model::Secret>,
    file: &Option<std::path::PathBuf>,
    key: &str,
) -> CenterResult<Option<Arc<str>>> {
    let token = match (value, file) {
        (Some(t), _) => t.expose().to_owned(),
        (None, Some(f)) => std::fs::read_to_string(f)
            .map_err(|e| CenterError::definite(format!("api.{key}_file: {}: {e}", f.display())))?
            .trim()
            .to_owned(),
        (None, None) => return Ok(None),
    };
    if token.is_empty() {
        return Err(CenterError::definite(format!(
            "api.{key}: must not be empty"
        )));
    }
    Ok(Some(token.into()))
}

impl Auth {
    /// The admin service's guard and the reports service's.
    fn from_config(cfg: &crate::CenterConfig) -> CenterResult<(Self, Self)> {
        let api = &cfg.api;
        let (admin, worker) = match api.auth {
            AuthMode::Token => {
                let admin = token(&api.token, &api.token_file, "token")?.ok_or_else(|| {
                    CenterError::definite("api.token: required with auth = \"token\"")
                })?;
                let worker = token(&api.worker_token, &api.worker_token_file, "worker_token")?;
                if worker.as_deref() == Some(&*admin) {
                    return Err(CenterError::definite(
                        "api.worker_token: must differ from api.token, or workers could administer",
                    ));
                }
                (Some(admin), worker)
            }
            AuthMode::Mtls | AuthMode::None => (None, None),
        };
        let guard = |reports| Auth {
            admin: admin.clone(),
            worker: worker.clone(),
            reports,
        };
        Ok((guard(false), guard(true)))
    }
}

impl Interceptor for Auth {
    fn call(&mut self, req: Request<()>) -> Result<Request<()>, Status> {
        let Some(admin) = &self.admin else {
            return Ok(req);
        };
        let given = req
            .metadata()
            .get("authorization")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
            .unwrap_or_default();
        if constant_time_eq(given.as_bytes(), admin.as_bytes()) {
            return Ok(req);
        }
        match &self.worker {
            Some(w) if constant_time_eq(given.as_bytes(), w.as_bytes()) => {
                if self.reports {
                    Ok(req)
                } else {
                    Err(Status::permission_denied(
                        "this is the workers' token: it can only report, not administer",
                    ))
                }
            }
            _ => Err(Status::unauthenticated(
                "missing or wrong bearer token (header `authorization: Bearer <token>`)",
            )),
        }
    }
}

/// Whether a given token equals a configured one, in a time that does not depend on
/// where they differ.
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.ct_eq(b).into()
}

#[derive(Clone)]
struct AdminApi {
    shared: Arc<Shared>,
}

fn internal(e: impl std::fmt::Display) -> Status {
    Status::unavailable(e.to_string())
}

/// The center's errors at the API's edge: a refusal or anything retrying cannot mend is
/// `FAILED_PRECONDITION` with the reason, as is a write this replica may no longer make
/// (deposed); what may pass is `UNAVAILABLE`.
fn center_err(e: CenterError) -> Status {
    match e {
        CenterError::Definite(_) | CenterError::Deposed(_) => {
            Status::failed_precondition(e.to_string())
        }
        CenterError::Transient(_) | CenterError::SessionExpired(_) => {
            Status::unavailable(e.to_string())
        }
    }
}

fn meta_err(e: MetaError) -> Status {
    match e {
        MetaError::Deposed { .. } => Status::failed_precondition(e.to_string()),
        e => Status::unavailable(e.to_string()),
    }
}

impl AdminApi {
    fn coord(&self) -> Result<Coordinator, Status> {
        self.shared
            .coord()
            .ok_or_else(|| Status::unavailable("not connected to ZooKeeper yet"))
    }

    async fn leader(&self) -> Result<Option<CenterRecord>, Status> {
        let coord = self.coord()?;
        Ok(coord
            .leader_info()
            .await
            .map_err(internal)?
            .and_then(|b| serde_json::from_slice(&b).ok()))
    }

    /// The epoch to write at, or the leader's address for the caller to go to.
    async fn writable(&self) -> Result<u64, Status> {
        if let Some(epoch) = self.shared.leading_epoch() {
            return Ok(epoch);
        }
        let Some(l) = self.leader().await? else {
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
            status.metadata_mut().insert("sluice-leader", v);
        }
        Err(status)
    }

    /// Delayed changes reach the meta database through the leader's Kafka reader.
    fn records_delayed(&self) -> Result<(), Status> {
        if self.shared.cfg.kafka.is_none() {
            return Err(Status::failed_precondition(
                "delayed changes need the centers' [kafka] section (the leader reads them from topics.delayed)",
            ));
        }
        Ok(())
    }

    async fn check_message(&self, id: u64) -> Result<Check, Status> {
        self.shared
            .meta
            .check(id)
            .await
            .map_err(meta_err)?
            .map(|c| check_message(&c))
            .ok_or_else(|| Status::not_found(format!("no check {id}")))
    }

    fn changed(&self) {
        self.shared.nudge.notify_one();
    }

    /// Records an operator's change as an event of this center (best effort: the change
    /// itself is already stored).
    async fn record(&self, kind: &str, subject: &str, message: &str) {
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
    async fn existing(&self, name: &str) -> Result<StoredPipeline, Status> {
        self.pipeline(name)
            .await?
            .ok_or_else(|| Status::not_found(format!("no pipeline `{name}`")))
    }

    async fn pipeline(&self, name: &str) -> Result<Option<StoredPipeline>, Status> {
        let pipelines = self.shared.meta.pipelines().await.map_err(meta_err)?;
        Ok(pipelines.into_iter().find(|p| p.spec.name == name))
    }

    /// The pipeline as the API shows it: its spec and its versions' state, with what
    /// the etl found about the live (or building) version needing a rebuild.
    async fn message(&self, p: &StoredPipeline) -> Result<Pipeline, Status> {
        let state = PipelineState {
            live_version: p.live_version,
            building_version: p.building_version,
            history: p.history.kept.clone(),
            current_history: p.history.current.clone(),
            needs_rebuild: self.needs_rebuild(p).await?,
        };
        Ok(convert::pipeline(&p.spec, &state))
    }

    /// Why the pipeline's live (or building) version needs a rebuild, as the etl
    /// recorded it; empty when it does not.
    async fn needs_rebuild(&self, p: &StoredPipeline) -> Result<String, Status> {
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
    async fn check_tables(&self, spec: &PipelineSpec) -> Result<(), Status> {
        let sources = self.shared.meta.sources().await.map_err(meta_err)?;
        let source = sources
            .iter()
            .find(|s| s.name == spec.source)
            .ok_or_else(|| {
                Status::invalid_argument(format!(
                    "source: no source `{}` (add it first: sluicectl sources put)",
                    spec.source
                ))
            })?;
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
        match checked {
            Ok(_) => Ok(()),
            Err(problems) => invalid(problems),
        }
    }

    /// The pipeline named, as the API shows it.
    async fn pipeline_message(&self, name: &str) -> Result<Pipeline, Status> {
        let p = self.existing(name).await?;
        self.message(&p).await
    }
}

fn invalid(problems: Vec<String>) -> Result<(), Status> {
    if problems.is_empty() {
        Ok(())
    } else {
        Err(Status::invalid_argument(problems.join("; ")))
    }
}

fn validate_source(s: Source) -> Result<SourceSpec, Status> {
    let spec = convert::source_spec(s).map_err(Status::invalid_argument)?;
    invalid(spec.problems())?;
    Ok(spec)
}

fn validate_pipeline(p: Pipeline) -> Result<PipelineSpec, Status> {
    let spec = convert::pipeline_spec(p)
        .map_err(Status::invalid_argument)?
        .normalized();
    invalid(spec.problems())?;
    Ok(spec)
}

#[tonic::async_trait]
impl Admin for AdminApi {
    async fn get_leader(
        &self,
        _: Request<GetLeaderRequest>,
    ) -> Result<Response<LeaderInfo>, Status> {
        let coord = self.coord()?;
        let leader = self.leader().await?;
        let epoch = coord.current_epoch().await.map_err(internal)?;
        Ok(Response::new(LeaderInfo {
            leader_id: leader.as_ref().map(|l| l.id.clone()).unwrap_or_default(),
            leader_addr: leader.map(|l| l.addr).unwrap_or_default(),
            epoch,
            answered_by: self.shared.cfg.center.id.clone(),
            answered_by_leader: self.shared.leading_epoch().is_some(),
        }))
    }

    async fn list_sources(
        &self,
        _: Request<ListSourcesRequest>,
    ) -> Result<Response<ListSourcesResponse>, Status> {
        let sources = self.shared.meta.sources().await.map_err(meta_err)?;
        Ok(Response::new(ListSourcesResponse {
            sources: sources.iter().map(convert::source).collect(),
        }))
    }

    async fn put_source(&self, req: Request<Source>) -> Result<Response<Source>, Status> {
        let s = validate_source(req.into_inner())?;
        let epoch = self.writable().await?;
        let existing = self.shared.meta.sources().await.map_err(meta_err)?;
        match existing.iter().find(|e| e.name == s.name) {
            Some(e) if (e.host.as_str(), e.port) != (s.host.as_str(), s.port) => {
                return Err(Status::failed_precondition(format!(
                    "source {}: host/port cannot change by a put ({}:{} → {}:{}): its confirmed position belongs to the old server. \
                     To move it to a new primary without losing a change: sluicectl sources failover {} --host {} --port {}",
                    s.name, e.host, e.port, s.host, s.port, s.name, s.host, s.port
                )));
            }
            Some(_) => {}
            None => {
                // A new source: a checkpoint left by an earlier source of this name (another
                // server, perhaps) must not be resumed.
                self.coord()?
                    .delete(&format!("tasks/{}", s.name), None, true)
                    .await
                    .map_err(internal)?;
            }
        }
        self.shared
            .meta
            .put_source(epoch, &s)
            .await
            .map_err(meta_err)?;
        self.record(
            "source",
            &s.name,
            &format!(
                "source put: {}:{} server_id {}",
                s.host, s.port, s.server_id
            ),
        )
        .await;
        self.changed();
        Ok(Response::new(convert::source(&s)))
    }

    async fn failover_source(
        &self,
        req: Request<FailoverRequest>,
    ) -> Result<Response<Source>, Status> {
        let req = req.into_inner();
        if req.host.is_empty() {
            return Err(Status::invalid_argument("host: required (the new primary)"));
        }
        let port =
            match req.port {
                0 => None,
                p => Some(u16::try_from(p).map_err(|_| {
                    Status::invalid_argument(format!("port: {p} is not a TCP port"))
                })?),
            };
        let epoch = self.writable().await?;
        let current = self
            .shared
            .meta
            .sources()
            .await
            .map_err(meta_err)?
            .into_iter()
            .find(|s| s.name == req.name)
            .ok_or_else(|| Status::not_found(format!("no source `{}`", req.name)))?;
        let port = port.unwrap_or(current.port);
        let s = self
            .shared
            .meta
            .bump_source_epoch(epoch, &req.name, Restart::Gtid, Some((&req.host, port)))
            .await
            .map_err(meta_err)?
            .ok_or_else(|| Status::not_found(format!("no source `{}`", req.name)))?;
        self.record(
            "source",
            &s.name,
            &format!(
                "source failover: {}:{} → {}:{}, version epoch {}; the task resumes there from its confirmed GTID state",
                current.host, current.port, s.host, s.port, s.coordinates.epoch
            ),
        )
        .await;
        self.changed();
        Ok(Response::new(convert::source(&s)))
    }

    async fn resnapshot_source(
        &self,
        req: Request<ResnapshotRequest>,
    ) -> Result<Response<ResnapshotResponse>, Status> {
        let name = req.into_inner().name;
        let epoch = self.writable().await?;
        let pipelines = self.shared.meta.pipelines().await.map_err(meta_err)?;
        let ours: Vec<&StoredPipeline> =
            pipelines.iter().filter(|p| p.spec.source == name).collect();
        if !ours.is_empty() && self.shared.es.is_none() {
            return Err(Status::failed_precondition(
                "a re-snapshot builds the source's pipelines anew, and builds need the center's [elasticsearch] section",
            ));
        }
        let s = self
            .shared
            .meta
            .bump_source_epoch(epoch, &name, Restart::End, None)
            .await
            .map_err(meta_err)?
            .ok_or_else(|| Status::not_found(format!("no source `{name}`")))?;
        let (mut builds_started, mut already_building) = (Vec::new(), Vec::new());
        for p in ours {
            if p.building_version != 0 {
                already_building.push(p.spec.name.clone());
                continue;
            }
            self.shared
                .meta
                .start_build(
                    epoch,
                    &p.spec.name,
                    crate::build::DEFAULT_CHUNK_ROWS,
                    0,
                    false,
                )
                .await
                .map_err(meta_err)?
                .map_err(Status::failed_precondition)?;
            builds_started.push(p.spec.name.clone());
        }
        self.record(
            "source",
            &s.name,
            &format!(
                "source re-snapshot: version epoch {}; the task starts again at the server's current end; builds started: {}",
                s.coordinates.epoch,
                if builds_started.is_empty() { "none".to_owned() } else { builds_started.join(", ") }
            ),
        )
        .await;
        self.changed();
        Ok(Response::new(ResnapshotResponse {
            source: Some(convert::source(&s)),
            builds_started,
            already_building,
        }))
    }

    async fn delete_source(
        &self,
        req: Request<DeleteRequest>,
    ) -> Result<Response<DeleteResponse>, Status> {
        let name = req.into_inner().name;
        let epoch = self.writable().await?;
        let existed = self
            .shared
            .meta
            .delete_source(epoch, &name)
            .await
            .map_err(meta_err)?;
        if existed {
            self.record("source", &name, "source deleted").await;
        }
        self.changed();
        Ok(Response::new(DeleteResponse { existed }))
    }

    async fn list_pipelines(
        &self,
        _: Request<ListPipelinesRequest>,
    ) -> Result<Response<ListPipelinesResponse>, Status> {
        let mut pipelines = Vec::new();
        for p in self.shared.meta.pipelines().await.map_err(meta_err)? {
            pipelines.push(self.message(&p).await?);
        }
        Ok(Response::new(ListPipelinesResponse { pipelines }))
    }

    async fn put_pipeline(&self, req: Request<Pipeline>) -> Result<Response<Pipeline>, Status> {
        let spec = validate_pipeline(req.into_inner())?;
        let epoch = self.writable().await?;
        self.check_tables(&spec).await?;
        self.shared
            .meta
            .put_pipeline(epoch, &spec)
            .await
            .map_err(meta_err)?;
        let relations = spec.tables().len() - 1;
        self.record(
            "pipeline",
            &spec.name,
            &format!(
                "pipeline put: {}.{}.{}{} -> {}",
                spec.source,
                spec.database,
                spec.table,
                match relations {
                    0 => String::new(),
                    n => format!(" and {n} related table(s)"),
                },
                spec.alias
            ),
        )
        .await;
        self.changed();
        Ok(Response::new(self.pipeline_message(&spec.name).await?))
    }

    async fn delete_pipeline(
        &self,
        req: Request<DeleteRequest>,
    ) -> Result<Response<DeleteResponse>, Status> {
        let name = req.into_inner().name;
        let epoch = self.writable().await?;
        // Its indexes go too, once no etl writes to them any more.
        let mut doomed = Vec::new();
        if let Some(p) = self.pipeline(&name).await? {
            let alias = &p.spec.alias;
            let mut versions: Vec<u32> = p.history.kept.clone();
            versions.extend([1, p.live_version, p.building_version]);
            if let Some(es) = &self.shared.es {
                for index in es.alias_targets(alias).await.map_err(internal)? {
                    if let Some(v) = sluice_elastic::index_version(alias, &index) {
                        versions.push(v);
                    }
                }
            }
            versions.retain(|v| *v > 0);
            versions.sort_unstable();
            versions.dedup();
            doomed = versions
                .into_iter()
                .map(|v| (sluice_elastic::versioned_index(alias, v), v))
                .collect();
        }
        let existed = self
            .shared
            .meta
            .delete_pipeline(epoch, &name, &doomed)
            .await
            .map_err(meta_err)?;
        self.changed();
        Ok(Response::new(DeleteResponse { existed }))
    }

    async fn build_pipeline(
        &self,
        req: Request<BuildRequest>,
    ) -> Result<Response<BuildStatus>, Status> {
        let req = req.into_inner();
        let epoch = self.writable().await?;
        if self.shared.es.is_none() {
            return Err(Status::failed_precondition(
                "builds need the center's [elasticsearch] section (to move the alias)",
            ));
        }
        let chunk_rows = if req.chunk_rows == 0 {
            crate::build::DEFAULT_CHUNK_ROWS
        } else {
            req.chunk_rows
        };
        let version = self
            .shared
            .meta
            .start_build(
                epoch,
                &req.name,
                chunk_rows,
                req.throttle_rows_per_sec,
                req.verify,
            )
            .await
            .map_err(meta_err)?
            .map_err(Status::failed_precondition)?;
        tracing::info!(pipeline = %req.name, version, chunk_rows, "build started");
        self.changed();
        let p = self.existing(&req.name).await?;
        let status = crate::build::status(&self.coord()?, &p)
            .await
            .map_err(internal)?;
        Ok(Response::new(BuildStatus { version, ..status }))
    }

    async fn reset_pipeline(
        &self,
        req: Request<ResetRequest>,
    ) -> Result<Response<Pipeline>, Status> {
        let name = req.into_inner().name;
        let epoch = self.writable().await?;
        let p = self.existing(&name).await?;
        self.shared
            .meta
            .reset_build(epoch, &name, &p.spec.alias)
            .await
            .map_err(meta_err)?;
        self.changed();
        Ok(Response::new(self.pipeline_message(&name).await?))
    }

    async fn rollback_pipeline(
        &self,
        req: Request<RollbackRequest>,
    ) -> Result<Response<Pipeline>, Status> {
        let req = req.into_inner();
        let epoch = self.writable().await?;
        let es = self.shared.es.as_ref().ok_or_else(|| {
            Status::failed_precondition(
                "rollbacks need the center's [elasticsearch] section (to move the alias)",
            )
        })?;
        let p = self.existing(&req.name).await?;
        let to = (req.to_version > 0).then_some(req.to_version);
        crate::rollback::rollback(&self.shared, es, &self.coord()?, epoch, &p, to)
            .await
            .map_err(center_err)?;
        self.changed();
        Ok(Response::new(self.pipeline_message(&req.name).await?))
    }

    async fn start_check(&self, req: Request<CheckRequest>) -> Result<Response<Check>, Status> {
        let req = req.into_inner();
        let epoch = self.writable().await?;
        let p = self.existing(&req.pipeline).await?;
        let id = crate::check::start(
            &self.shared,
            epoch,
            &p,
            req.since.trim(),
            req.repair,
            "operator",
        )
        .await
        .map_err(center_err)?;
        tracing::info!(pipeline = %req.pipeline, check = id, "check started");
        self.changed();
        self.check_message(id).await.map(Response::new)
    }

    async fn start_compare(&self, req: Request<CompareRequest>) -> Result<Response<Check>, Status> {
        let req = req.into_inner();
        let epoch = self.writable().await?;
        let p = self.existing(&req.pipeline).await?;
        let coord = self.coord()?;
        let id = crate::check::start_compare(&self.shared, &coord, epoch, &p, req.repair)
            .await
            .map_err(center_err)?;
        tracing::info!(pipeline = %req.pipeline, compare = id, version = p.building_version, "compare started");
        self.changed();
        self.check_message(id).await.map(Response::new)
    }

    async fn swap_pipeline(
        &self,
        req: Request<SwapRequest>,
    ) -> Result<Response<BuildStatus>, Status> {
        let req = req.into_inner();
        let epoch = self.writable().await?;
        let p = self.existing(&req.name).await?;
        let coord = self.coord()?;
        let status = crate::build::status(&coord, &p).await.map_err(internal)?;
        if status.phase != "held" {
            return Err(Status::failed_precondition(format!(
                "pipeline `{}` has no build held for verification (build phase: {})",
                req.name, status.phase
            )));
        }
        let by = if req.force {
            "force".to_owned()
        } else {
            let compares = self
                .shared
                .meta
                .checks(&req.name, RunKind::Compare.as_str(), 1)
                .await
                .map_err(meta_err)?;
            crate::check::clean(&p, compares.first()).map_err(Status::failed_precondition)?
        };
        let released = self
            .shared
            .meta
            .release_swap(epoch, &req.name, p.building_version, &by)
            .await
            .map_err(meta_err)?;
        if !released {
            return Err(Status::failed_precondition(format!(
                "version {} of pipeline `{}` is no longer being built",
                p.building_version, req.name
            )));
        }
        tracing::info!(pipeline = %req.name, version = p.building_version, %by, "swap released");
        self.changed();
        Ok(Response::new(BuildStatus {
            message: format!("swap released ({by}): the alias moves at the leader's next pass"),
            ..status
        }))
    }

    async fn list_checks(
        &self,
        req: Request<ListChecksRequest>,
    ) -> Result<Response<ListChecksResponse>, Status> {
        let req = req.into_inner();
        self.existing(&req.pipeline).await?;
        let limit = if req.limit == 0 { 20 } else { req.limit };
        let checks = self
            .shared
            .meta
            .checks(&req.pipeline, req.kind.trim(), limit)
            .await
            .map_err(meta_err)?;
        Ok(Response::new(ListChecksResponse {
            checks: checks.iter().map(check_message).collect(),
        }))
    }

    async fn get_check(&self, req: Request<GetCheckRequest>) -> Result<Response<Check>, Status> {
        self.check_message(req.into_inner().id)
            .await
            .map(Response::new)
    }

    async fn list_delayed(
        &self,
        req: Request<ListDelayedRequest>,
    ) -> Result<Response<ListDelayedResponse>, Status> {
        let req = req.into_inner();
        self.existing(&req.pipeline).await?;
        self.records_delayed()?;
        let limit = if req.limit == 0 { 100 } else { req.limit };
        let (changes, pending, applying) = self
            .shared
            .meta
            .delayed(&req.pipeline, limit)
            .await
            .map_err(meta_err)?;
        Ok(Response::new(ListDelayedResponse {
            changes: changes
                .into_iter()
                .map(|c| DelayedChange {
                    node: c.node,
                    values: c.values,
                    version: c.version,
                    changes: c.changes,
                    first_seen_ms: c.first_seen_ms,
                    last_seen_ms: c.last_seen_ms,
                    job: c.job,
                })
                .collect(),
            pending,
            applying,
        }))
    }

    async fn apply_delayed(
        &self,
        req: Request<ApplyDelayedRequest>,
    ) -> Result<Response<Check>, Status> {
        let req = req.into_inner();
        let epoch = self.writable().await?;
        self.records_delayed()?;
        let p = self.existing(&req.pipeline).await?;
        let id = crate::delayed::start(&self.shared, epoch, &p, "operator")
            .await
            .map_err(center_err)?;
        tracing::info!(pipeline = %req.pipeline, job = id, "delayed job started");
        self.changed();
        self.check_message(id).await.map(Response::new)
    }

    async fn drop_version(
        &self,
        req: Request<DropVersionRequest>,
    ) -> Result<Response<Pipeline>, Status> {
        let req = req.into_inner();
        let epoch = self.writable().await?;
        let p = self.existing(&req.name).await?;
        refused(self.shared.meta.drop_version(epoch, &p, req.version).await)?;
        self.changed();
        Ok(Response::new(self.pipeline_message(&req.name).await?))
    }

    async fn get_build(
        &self,
        req: Request<GetBuildRequest>,
    ) -> Result<Response<BuildStatus>, Status> {
        let name = req.into_inner().name;
        let p = self.existing(&name).await?;
        let mut status = crate::build::status(&self.coord()?, &p)
            .await
            .map_err(internal)?;
        if p.building_version == 0 {
            let last = self.shared.meta.last_build(&name).await.map_err(meta_err)?;
            if let Some((version, _, reason)) = last.filter(|(_, s, _)| s == "failed") {
                status.phase = "failed".into();
                status.version = version;
                status.message = reason.unwrap_or_default();
            } else if p.live_version > 0 {
                status.phase = "done".into();
                status.version = p.live_version;
            }
        }
        status.needs_rebuild = self.needs_rebuild(&p).await?;
        Ok(Response::new(status))
    }

    async fn list_workers(
        &self,
        _: Request<ListWorkersRequest>,
    ) -> Result<Response<ListWorkersResponse>, Status> {
        let coord = self.coord()?;
        let mut workers = Vec::new();
        for id in coord.children("workers").await.map_err(internal)? {
            let Some(node) = coord.get(&layout::worker(&id)).await.map_err(internal)? else {
                continue;
            };
            let rec: WorkerRecord = serde_json::from_slice(&node.data)
                .map_err(|e| internal(format!("workers/{id}: {e}")))?;
            let tasks = coord
                .children(&layout::assignments(&id))
                .await
                .map_err(internal)?;
            workers.push(Worker {
                id: rec.id,
                addr: rec.addr,
                version: rec.version,
                started_at_ms: rec.started_at_ms,
                capacity: rec.capacity,
                tasks,
            });
        }
        Ok(Response::new(ListWorkersResponse { workers }))
    }

    async fn list_tasks(
        &self,
        _: Request<ListTasksRequest>,
    ) -> Result<Response<ListTasksResponse>, Status> {
        let coord = self.coord()?;
        let sources = self.shared.meta.sources().await.map_err(meta_err)?;
        let statuses = self.shared.meta.statuses().await.map_err(meta_err)?;
        let mut assigned: BTreeMap<String, (String, u64)> = BTreeMap::new();
        for worker in coord.children("assignments").await.map_err(internal)? {
            for task in coord
                .children(&layout::assignments(&worker))
                .await
                .map_err(internal)?
            {
                let generation = coord
                    .get(&layout::assignment(&worker, &task))
                    .await
                    .map_err(internal)?
                    .and_then(|n| serde_json::from_slice::<AssignmentRecord>(&n.data).ok())
                    .map_or(0, |r| r.generation);
                assigned.insert(task, (worker.clone(), generation));
            }
        }
        let mut tasks = Vec::new();
        for s in sources {
            let running_on = coord
                .get(&layout::lock(&s.name))
                .await
                .map_err(internal)?
                .and_then(|n| serde_json::from_slice::<serde_json::Value>(&n.data).ok())
                .and_then(|v| v["worker"].as_str().map(str::to_owned))
                .unwrap_or_default();
            let checkpoint = coord
                .read_checkpoint(&s.name)
                .await
                .map_err(internal)?
                .and_then(|b| sluice_model::Checkpoint::from_json(&b).ok());
            let status = statuses.get(&s.name);
            let (assigned_to, generation) = assigned.remove(&s.name).unwrap_or_default();
            tasks.push(Task {
                source: s.name,
                assigned_to,
                running_on,
                position: checkpoint
                    .as_ref()
                    .map(|c| c.position.to_string())
                    .unwrap_or_default(),
                gtid: checkpoint
                    .and_then(|c| c.gtid)
                    .map(|g| g.to_string())
                    .unwrap_or_default(),
                state: status.map(|s| s.state.clone()).unwrap_or_default(),
                events_published: status.map_or(0, |s| s.events_published),
                lag_seconds: status.map_or(0.0, |s| s.lag_seconds),
                reported_at_ms: status.map_or(0, |s| s.reported_at_ms),
                generation,
            });
        }
        Ok(Response::new(ListTasksResponse { tasks }))
    }

    async fn rebalance(
        &self,
        _: Request<RebalanceRequest>,
    ) -> Result<Response<RebalanceResponse>, Status> {
        self.writable().await?;
        let (tx, rx) = tokio::sync::oneshot::channel();
        self.shared
            .rebalance
            .send(tx)
            .await
            .map_err(|_| Status::unavailable("the leader loop is not running"))?;
        let moves = tokio::time::timeout(std::time::Duration::from_secs(30), rx)
            .await
            .map_err(|_| Status::deadline_exceeded("the rebalance did not finish within 30 s"))?
            .map_err(|_| Status::unavailable("leadership changed during the rebalance; retry"))?;
        Ok(Response::new(RebalanceResponse {
            moves: moves
                .into_iter()
                .map(|m| Move {
                    task: m.task,
                    from: m.from.unwrap_or_default(),
                    to: m.to,
                })
                .collect(),
        }))
    }

    async fn list_events(
        &self,
        req: Request<ListEventsRequest>,
    ) -> Result<Response<ListEventsResponse>, Status> {
        let req = req.into_inner();
        let limit = if req.limit == 0 { 50 } else { req.limit };
        let events = self
            .shared
            .meta
            .events(limit, &req.subject)
            .await
            .map_err(meta_err)?;
        Ok(Response::new(ListEventsResponse { events }))
    }

    async fn list_dead_letters(
        &self,
        req: Request<ListDeadLettersRequest>,
    ) -> Result<Response<ListDeadLettersResponse>, Status> {
        let req = req.into_inner();
        let (letters, truncated) = self.dead_letters().await?;
        let replays = self.shared.meta.replays().await.map_err(meta_err)?;
        let mut matched: Vec<DeadLetter> = letters
            .iter()
            .filter(|l| req.pipeline.is_empty() || l.pipeline() == Some(req.pipeline.as_str()))
            .map(|l| letter_message(l, replays.get(&l.id.to_string()).copied()))
            .filter(|m| req.include_replayed || m.replayed_at_ms == 0)
            .collect();
        matched.sort_by(|a, b| b.at_ms.cmp(&a.at_ms).then_with(|| b.id.cmp(&a.id)));
        let total = matched.len() as u64;
        matched.truncate(if req.limit == 0 {
            100
        } else {
            req.limit as usize
        });
        Ok(Response::new(ListDeadLettersResponse {
            letters: matched,
            matched: total,
            truncated,
        }))
    }

    async fn replay_dead_letters(
        &self,
        req: Request<ReplayDeadLettersRequest>,
    ) -> Result<Response<ReplayDeadLettersResponse>, Status> {
        let req = req.into_inner();
        if req.pipeline.is_empty() && req.ids.is_empty() && !req.all {
            return Err(Status::invalid_argument(
                "say which letters: a pipeline, letter ids, or all",
            ));
        }
        let epoch = self.writable().await?;
        let kafka = self.kafka()?;
        let (letters, _) = self.dead_letters().await?;
        let replays = self.shared.meta.replays().await.map_err(meta_err)?;
        let (chosen, unknown) =
            crate::dlq::chosen(&letters, &replays, &req.pipeline, &req.ids, req.all);
        let mut refused: Vec<String> = unknown
            .into_iter()
            .map(|id| format!("{id}: no such dead letter"))
            .collect();
        let mut ready = Vec::new();
        for l in chosen {
            match l.replayable() {
                Ok(()) => ready.push(l),
                Err(why) => refused.push(format!("{}: {why}", l.id)),
            }
        }
        let mut replayed = Vec::new();
        let meta = &self.shared.meta;
        let outcome = crate::dlq::replay(kafka, &ready, |l, to| {
            replayed.push(l.id.to_string());
            async move {
                meta.record_replay(epoch, &l.id.to_string(), &to)
                    .await
                    .map_err(CenterError::from)
            }
        })
        .await;
        if !replayed.is_empty() {
            self.record(
                "dlq",
                if req.pipeline.is_empty() {
                    "dead letters"
                } else {
                    &req.pipeline
                },
                &format!("{} dead letters replayed", replayed.len()),
            )
            .await;
        }
        if let Err(e) = outcome {
            return Err(Status::unavailable(format!(
                "{e:#} (replayed before it: {}; run the replay again for the rest)",
                replayed.len()
            )));
        }
        Ok(Response::new(ReplayDeadLettersResponse {
            replayed,
            refused,
        }))
    }

    async fn list_words(
        &self,
        req: Request<ListWordsRequest>,
    ) -> Result<Response<ListWordsResponse>, Status> {
        let dictionary =
            dict::requested(&req.into_inner().dictionary).map_err(Status::invalid_argument)?;
        let words = self.shared.meta.words(dictionary).await.map_err(meta_err)?;
        Ok(Response::new(words_message(&words)))
    }

    async fn add_words(
        &self,
        req: Request<WordsRequest>,
    ) -> Result<Response<ListWordsResponse>, Status> {
        let (dictionary, words) = words_request(req.into_inner())?;
        let epoch = self.writable().await?;
        let meta = &self.shared.meta;
        let added = meta.add_words(epoch, dictionary, &words).await;
        Ok(Response::new(words_message(&refused(added)?)))
    }

    async fn edit_word(&self, req: Request<EditWordRequest>) -> Result<Response<Word>, Status> {
        let req = req.into_inner();
        let dictionary = Dictionary::parse(&req.dictionary).map_err(Status::invalid_argument)?;
        let [word, replacement] = [&req.word, &req.replacement]
            .map(|w| dict::check_word(w).map_err(Status::invalid_argument));
        let (word, replacement) = (word?, replacement?);
        let epoch = self.writable().await?;
        let meta = &self.shared.meta;
        let edited = meta.edit_word(epoch, dictionary, &word, &replacement).await;
        Ok(Response::new(word_message(&refused(edited)?)))
    }

    async fn publish_words(
        &self,
        req: Request<WordsRequest>,
    ) -> Result<Response<ListWordsResponse>, Status> {
        let (dictionary, words) = words_request(req.into_inner())?;
        let epoch = self.writable().await?;
        let meta = &self.shared.meta;
        let published = meta.publish_words(epoch, dictionary, &words).await;
        Ok(Response::new(words_message(&refused(published)?)))
    }

    async fn delete_words(
        &self,
        req: Request<WordsRequest>,
    ) -> Result<Response<ListWordsResponse>, Status> {
        let (dictionary, words) = words_request(req.into_inner())?;
        let epoch = self.writable().await?;
        let meta = &self.shared.meta;
        let deleted = meta.delete_words(epoch, dictionary, &words).await;
        Ok(Response::new(words_message(&refused(deleted)?)))
    }
}

/// A meta-database change that the state can refuse: a refusal (`Ok(Err(why))`) is
/// `FAILED_PRECONDITION` with the reason.
fn refused<T>(outcome: Result<Result<T, String>, MetaError>) -> Result<T, Status> {
    outcome
        .map_err(meta_err)?
        .map_err(Status::failed_precondition)
}

fn words_request(req: WordsRequest) -> Result<(Dictionary, Vec<String>), Status> {
    let dictionary = Dictionary::parse(&req.dictionary).map_err(Status::invalid_argument)?;
    let words = dict::checked(&req.words).map_err(Status::invalid_argument)?;
    Ok((dictionary, words))
}

fn word_message(w: &dict::Word) -> Word {
    Word {
        dictionary: w.dictionary.name().into(),
        word: w.word.clone(),
        state: if w.published { "published" } else { "draft" }.into(),
        added_at_ms: w.added_at_ms,
        published_at_ms: w.published_at_ms,
    }
}

fn words_message(words: &[dict::Word]) -> ListWordsResponse {
    ListWordsResponse {
        words: words.iter().map(word_message).collect(),
    }
}

impl AdminApi {
    fn kafka(&self) -> Result<&sluice_kafka::KafkaConfig, Status> {
        self.shared.cfg.kafka.as_ref().ok_or_else(|| {
            Status::failed_precondition(
                "dead letters live in Kafka, and this center has no [kafka] section: add one",
            )
        })
    }

    async fn dead_letters(&self) -> Result<(Vec<crate::dlq::Letter>, bool), Status> {
        let kafka = self.kafka()?;
        let sources: Vec<String> = (self.shared.meta.sources().await.map_err(meta_err)?)
            .into_iter()
            .map(|s| s.name)
            .collect();
        crate::dlq::read(kafka, &self.shared.cfg.topics, &sources)
            .await
            .map_err(|e| Status::unavailable(format!("cannot read the dead-letter topics: {e}")))
    }
}

/// A dead letter as the API shows it.
fn letter_message(l: &crate::dlq::Letter, replayed_at_ms: Option<i64>) -> DeadLetter {
    use crate::dlq::Content;
    let mut m = DeadLetter {
        id: l.id.to_string(),
        at_ms: l.at_ms,
        replayed_at_ms: replayed_at_ms.unwrap_or(0),
        ..DeadLetter::default()
    };
    match &l.content {
        Content::Event(e, _) => {
            m.reason = e.reason.clone();
            m.pipeline = e.pipeline.clone().unwrap_or_default();
            m.origin = format!("{}:{}:{}", e.topic, e.partition, e.offset);
            match e.change() {
                Ok(c) => {
                    m.table = format!("{}.{}", c.db, c.table);
                    m.key = serde_json::Value::Object(c.key).to_string();
                    m.source = c.source.instance;
                }
                Err(why) => m.not_replayable = why.to_owned(),
            }
        }
        Content::Rows(r) => {
            m.reason = r.reason.clone();
            m.source = r.source.instance.clone();
            m.table = format!("{}.{}", r.db, r.table);
            m.origin = format!("{}:{}", r.source.file, r.source.pos);
            m.not_replayable = l.replayable().err().unwrap_or_default();
        }
        Content::Unreadable(why) => {
            m.reason = why.clone();
            m.not_replayable = why.clone();
        }
    }
    m
}

#[tonic::async_trait]
impl WorkerReports for AdminApi {
    async fn report(&self, req: Request<WorkerReport>) -> Result<Response<ReportAck>, Status> {
        let report = req.into_inner();
        if !sluice_model::pipeline::is_name(&report.worker, 255) {
            return Err(Status::invalid_argument(format!(
                "worker: `{}` must be 1..=255 characters of [A-Za-z0-9._-]",
                report.worker
            )));
        }
        let coord = self.coord()?;
        let assigned = coord
            .children(&layout::assignments(&report.worker))
            .await
            .map_err(internal)?;
        // Only the worker a task is assigned to speaks for it (a worker that lost its
        // session may still report the task it dropped).
        for t in report.tasks.iter().filter(|t| assigned.contains(&t.source)) {
            self.shared
                .meta
                .save_status(&report.worker, t)
                .await
                .map_err(meta_err)?;
            crate::metrics::update(|g| {
                g.source_lag.insert(t.source.clone(), t.lag_seconds);
            });
        }
        for e in &report.events {
            self.shared
                .meta
                .add_event(&report.worker, &e.kind, &e.subject, &e.message)
                .await
                .map_err(meta_err)?;
        }
        Ok(Response::new(ReportAck {}))
    }
}

/// A check as the API shows it.
fn check_message(c: &crate::meta::CheckRun) -> Check {
    let t = &c.tally;
    Check {
        id: c.id,
        pipeline: c.pipeline.clone(),
        version: c.version,
        since: c.since.clone(),
        repair: c.repair,
        state: c.state.clone(),
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

fn examples(list: &[sluice_zk::layout::CheckExample]) -> Vec<CheckExample> {
    list.iter()
        .map(|e| CheckExample {
            kind: e.kind.clone(),
            id: e.id.clone(),
            detail: e.detail.clone(),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::constant_time_eq;

    #[test]
    fn tokens_match_only_when_equal_in_full() {
        assert!(constant_time_eq(b"s3cret-token", b"s3cret-token"));
        assert!(!constant_time_eq(b"s3cret-token", b"s3cret-tokeN"));
        assert!(
            !constant_time_eq(b"s3cret", b"s3cret-token"),
            "a prefix is not the token"
        );
        assert!(!constant_time_eq(b"", b"s3cret-token"));
    }
}
