//! The gRPC API every replica serves: `sluice.v1.Admin`, `sluice.v1.WorkerReports`, the
//! standard health service and reflection (so `grpcurl` works). Admin and reports are
//! authenticated as configured (`api.auth`); health and reflection are open, for probes.
//!
//! Reads answer from ZooKeeper and the meta database on any replica. Writes are the
//! leader's: a follower answers `FAILED_PRECONDITION` naming the leader's address, which
//! `sluicectl` follows.

use std::sync::Arc;

use sluice_proto::v1::admin_server::{Admin, AdminServer};
use sluice_proto::v1::worker_reports_server::{WorkerReports, WorkerReportsServer};
use sluice_proto::v1::*;
use sluice_zk::layout;
use tokio_stream::StreamExt as _;
use tokio_util::sync::CancellationToken;
use tonic::transport::Server;
use tonic::{Request, Response, Status};

use crate::error::{CenterError, Result as CenterResult};
use crate::Shared;

mod auth;
mod cluster;
mod common;
mod console;
mod explain;
mod guard;
mod letters;
mod limit;
mod pipelines;
mod preview;
mod refusals;
mod runs;
mod sources;
mod users;
mod words;

pub use auth::first_admin;
use auth::Auth;
use common::*;
use guard::Guarded;
pub(crate) use letters::READS_AT_ONCE as LETTER_READS_AT_ONCE;

/// Calls one connection may have under way at once.
const CALLS_PER_CONNECTION: usize = 32;

/// Serves until `shutdown`.
pub async fn serve(shared: Arc<Shared>, shutdown: CancellationToken) -> CenterResult<()> {
    let api = &shared.cfg.api;
    let (gate, reports_auth) = Auth::from_config(&shared.cfg, shared.meta.clone())?;
    auth::first_admin(&shared.cfg, &shared.meta, &shutdown).await?;
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
    let gate = Arc::new(gate);
    let limits = shared.cfg.limits;
    let console = console::serve(
        console::bind(shared.cfg.center.console_listen).await?,
        service.clone(),
        gate.clone(),
        crate::listeners::http_tls(api)?,
        shutdown.clone(),
    );
    let listen = shared.cfg.center.listen;
    let tcp = tokio::net::TcpListener::bind(listen)
        .await
        .map_err(|e| CenterError::definite(format!("center.listen: {listen}: {e}")))?;
    let conns = sluice_runtime::listen::accept(
        tcp,
        crate::listeners::grpc_tls(api)?,
        limits,
        sluice_runtime::listen::SharedPeers::default(),
        "grpc",
        shutdown.clone(),
    );
    let incoming = tokio_stream::wrappers::ReceiverStream::new(conns)
        .map(|c| Ok::<_, std::io::Error>(crate::listeners::GrpcConn(c)));
    tracing::info!(%listen, auth = ?api.auth, "gRPC API listening");
    // Calls at once per connection and streams per connection are bounded, each call has
    // the request deadline, and a connection lives at most half an hour (its client
    // reconnects), so no caller keeps more than its share.
    let served = Server::builder()
        .timeout(limits.request_within)
        .concurrency_limit_per_connection(CALLS_PER_CONNECTION)
        .max_concurrent_streams(CALLS_PER_CONNECTION as u32)
        .http2_keepalive_interval(Some(std::time::Duration::from_secs(30)))
        .http2_keepalive_timeout(Some(std::time::Duration::from_secs(10)))
        .max_connection_age(std::time::Duration::from_secs(1800))
        .add_service(health_service)
        .add_service(reflection)
        .add_service(Guarded::new(AdminServer::new(service.clone()), gate))
        .add_service(WorkerReportsServer::with_interceptor(service, reports_auth))
        .serve_with_incoming_shutdown(incoming, shutdown.clone().cancelled_owned());
    // Either one failing ends the center.
    let served = tokio::select! {
        served = served => served.map_err(|e| CenterError::definite(format!("gRPC API on {listen}: {e}"))),
        served = console => served,
    };
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

#[tonic::async_trait]

impl Admin for AdminApi {
    async fn get_leader(
        &self,
        req: Request<GetLeaderRequest>,
    ) -> Result<Response<LeaderInfo>, Status> {
        cluster::get_leader(self, req).await
    }

    async fn list_sources(
        &self,
        req: Request<ListSourcesRequest>,
    ) -> Result<Response<ListSourcesResponse>, Status> {
        sources::list_sources(self, req).await
    }

    async fn put_source(&self, req: Request<Source>) -> Result<Response<Source>, Status> {
        sources::put_source(self, req).await
    }

    async fn failover_source(
        &self,
        req: Request<FailoverRequest>,
    ) -> Result<Response<Source>, Status> {
        sources::failover_source(self, req).await
    }

    async fn resnapshot_source(
        &self,
        req: Request<ResnapshotRequest>,
    ) -> Result<Response<ResnapshotResponse>, Status> {
        sources::resnapshot_source(self, req).await
    }

    async fn delete_source(
        &self,
        req: Request<DeleteRequest>,
    ) -> Result<Response<DeleteResponse>, Status> {
        sources::delete_source(self, req).await
    }

    async fn list_pipelines(
        &self,
        req: Request<ListPipelinesRequest>,
    ) -> Result<Response<ListPipelinesResponse>, Status> {
        pipelines::list_pipelines(self, req).await
    }

    async fn put_pipeline(&self, req: Request<Pipeline>) -> Result<Response<Pipeline>, Status> {
        pipelines::put_pipeline(self, req).await
    }

    async fn delete_pipeline(
        &self,
        req: Request<DeleteRequest>,
    ) -> Result<Response<DeleteResponse>, Status> {
        pipelines::delete_pipeline(self, req).await
    }

    async fn build_pipeline(
        &self,
        req: Request<BuildRequest>,
    ) -> Result<Response<BuildStatus>, Status> {
        pipelines::build_pipeline(self, req).await
    }

    async fn reset_pipeline(
        &self,
        req: Request<ResetRequest>,
    ) -> Result<Response<Pipeline>, Status> {
        pipelines::reset_pipeline(self, req).await
    }

    async fn rollback_pipeline(
        &self,
        req: Request<RollbackRequest>,
    ) -> Result<Response<Pipeline>, Status> {
        pipelines::rollback_pipeline(self, req).await
    }

    async fn start_check(&self, req: Request<CheckRequest>) -> Result<Response<Check>, Status> {
        runs::start_check(self, req).await
    }

    async fn start_compare(&self, req: Request<CompareRequest>) -> Result<Response<Check>, Status> {
        runs::start_compare(self, req).await
    }

    async fn swap_pipeline(
        &self,
        req: Request<SwapRequest>,
    ) -> Result<Response<BuildStatus>, Status> {
        pipelines::swap_pipeline(self, req).await
    }

    async fn list_checks(
        &self,
        req: Request<ListChecksRequest>,
    ) -> Result<Response<ListChecksResponse>, Status> {
        runs::list_checks(self, req).await
    }

    async fn get_check(&self, req: Request<GetCheckRequest>) -> Result<Response<Check>, Status> {
        runs::get_check(self, req).await
    }

    async fn list_delayed(
        &self,
        req: Request<ListDelayedRequest>,
    ) -> Result<Response<ListDelayedResponse>, Status> {
        runs::list_delayed(self, req).await
    }

    async fn apply_delayed(
        &self,
        req: Request<ApplyDelayedRequest>,
    ) -> Result<Response<Check>, Status> {
        runs::apply_delayed(self, req).await
    }

    async fn preview_pipeline(
        &self,
        req: Request<PreviewRequest>,
    ) -> Result<Response<PipelinePreview>, Status> {
        preview::preview_pipeline(self, req).await
    }

    async fn test_source(&self, req: Request<Source>) -> Result<Response<SourceTest>, Status> {
        sources::test_source(self, req).await
    }

    async fn list_tables(
        &self,
        req: Request<ListTablesRequest>,
    ) -> Result<Response<ListTablesResponse>, Status> {
        sources::list_tables(self, req).await
    }

    async fn resync_documents(
        &self,
        req: Request<ResyncRequest>,
    ) -> Result<Response<Check>, Status> {
        runs::resync_documents(self, req).await
    }

    async fn explain_document(
        &self,
        req: Request<ExplainRequest>,
    ) -> Result<Response<Explanation>, Status> {
        explain::explain_document(self, req).await
    }

    async fn drop_version(
        &self,
        req: Request<DropVersionRequest>,
    ) -> Result<Response<Pipeline>, Status> {
        pipelines::drop_version(self, req).await
    }

    async fn get_build(
        &self,
        req: Request<GetBuildRequest>,
    ) -> Result<Response<BuildStatus>, Status> {
        pipelines::get_build(self, req).await
    }

    async fn list_workers(
        &self,
        req: Request<ListWorkersRequest>,
    ) -> Result<Response<ListWorkersResponse>, Status> {
        cluster::list_workers(self, req).await
    }

    async fn list_tasks(
        &self,
        req: Request<ListTasksRequest>,
    ) -> Result<Response<ListTasksResponse>, Status> {
        cluster::list_tasks(self, req).await
    }

    async fn rebalance(
        &self,
        req: Request<RebalanceRequest>,
    ) -> Result<Response<RebalanceResponse>, Status> {
        cluster::rebalance(self, req).await
    }

    async fn list_events(
        &self,
        req: Request<ListEventsRequest>,
    ) -> Result<Response<ListEventsResponse>, Status> {
        cluster::list_events(self, req).await
    }

    async fn list_dead_letters(
        &self,
        req: Request<ListDeadLettersRequest>,
    ) -> Result<Response<ListDeadLettersResponse>, Status> {
        letters::list_dead_letters(self, req).await
    }

    async fn replay_dead_letters(
        &self,
        req: Request<ReplayDeadLettersRequest>,
    ) -> Result<Response<ReplayDeadLettersResponse>, Status> {
        letters::replay_dead_letters(self, req).await
    }

    async fn list_words(
        &self,
        req: Request<ListWordsRequest>,
    ) -> Result<Response<ListWordsResponse>, Status> {
        words::list_words(self, req).await
    }

    async fn add_words(
        &self,
        req: Request<WordsRequest>,
    ) -> Result<Response<ListWordsResponse>, Status> {
        words::add_words(self, req).await
    }

    async fn edit_word(&self, req: Request<EditWordRequest>) -> Result<Response<Word>, Status> {
        words::edit_word(self, req).await
    }

    async fn publish_words(
        &self,
        req: Request<WordsRequest>,
    ) -> Result<Response<ListWordsResponse>, Status> {
        words::publish_words(self, req).await
    }

    async fn delete_words(
        &self,
        req: Request<WordsRequest>,
    ) -> Result<Response<ListWordsResponse>, Status> {
        words::delete_words(self, req).await
    }

    async fn who_am_i(&self, req: Request<WhoAmIRequest>) -> Result<Response<Caller>, Status> {
        users::who_am_i(req).await
    }

    async fn list_users(
        &self,
        req: Request<ListUsersRequest>,
    ) -> Result<Response<ListUsersResponse>, Status> {
        users::list_users(self, req).await
    }

    async fn put_user(&self, req: Request<PutUserRequest>) -> Result<Response<User>, Status> {
        users::put_user(self, req).await
    }

    async fn delete_user(
        &self,
        req: Request<DeleteRequest>,
    ) -> Result<Response<DeleteResponse>, Status> {
        users::delete_user(self, req).await
    }

    async fn create_token(
        &self,
        req: Request<CreateTokenRequest>,
    ) -> Result<Response<CreatedToken>, Status> {
        users::create_token(self, req).await
    }

    async fn list_tokens(
        &self,
        req: Request<ListTokensRequest>,
    ) -> Result<Response<ListTokensResponse>, Status> {
        users::list_tokens(self, req).await
    }

    async fn revoke_token(
        &self,
        req: Request<RevokeTokenRequest>,
    ) -> Result<Response<DeleteResponse>, Status> {
        users::revoke_token(self, req).await
    }

    async fn list_audit(
        &self,
        req: Request<ListAuditRequest>,
    ) -> Result<Response<ListAuditResponse>, Status> {
        users::list_audit(self, req).await
    }
}

#[tonic::async_trait]
impl WorkerReports for AdminApi {
    /// A worker's progress and events, taken only from the process registered as the
    /// worker the report names: its report key must match the digest that worker's own
    /// registration publishes, and under mTLS its certificate may name no user and no
    /// other worker. So no other caller — another worker, a person's certificate — can
    /// mark a task healthy or record events in a worker's name.
    async fn report(&self, req: Request<WorkerReport>) -> Result<Response<ReportAck>, Status> {
        let key = req
            .metadata()
            .get(sluice_proto::REPORT_KEY_HEADER)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_owned();
        let certified = match self.shared.cfg.api.auth {
            crate::config::AuthMode::Mtls => Some(reporter_certificate(&req)?),
            _ => None,
        };
        let report = req.into_inner();
        if !sluice_model::pipeline::is_name(&report.worker, 255) {
            return Err(Status::invalid_argument(format!(
                "worker: `{}` must be 1..=255 characters of [A-Za-z0-9._-]",
                report.worker
            )));
        }
        let coord = self.coord()?;
        if let Some(cn) = certified {
            self.certified_reporter(&coord, &cn, &report.worker).await?;
        }
        registered_reporter(&coord, &report.worker, &key).await?;
        let assigned = coord
            .children(&layout::assignments(&report.worker))
            .await
            .map_err(internal)?;
        // Only the worker a task is assigned to speaks for it (a worker that lost its
        // session may still report the task it dropped).
        let ours: Vec<&TaskProgress> = (report.tasks.iter())
            .filter(|t| assigned.contains(&t.source))
            .collect();
        self.shared
            .meta
            .save_statuses(&report.worker, &ours)
            .await
            .map_err(meta_err)?;
        crate::metrics::update(|g| {
            for t in &ours {
                g.source_lag.insert(t.source.clone(), t.lag_seconds);
            }
        });
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

impl AdminApi {
    /// Under mTLS, whether a certificate naming `cn` may carry a report for `worker`: not
    /// one that names a user (a person's, or a worker's that also administers — give the
    /// worker a certificate of its own), and one naming a registered worker only for that
    /// worker. Any other certificate (one the workers share) leaves it to the report key.
    async fn certified_reporter(
        &self,
        coord: &sluice_zk::Coordinator,
        cn: &str,
        worker: &str,
    ) -> Result<(), Status> {
        let user = self.shared.meta.password_of(cn).await.map_err(meta_err)?;
        if user.is_some() {
            return Err(Status::permission_denied(format!(
                "this certificate names user `{cn}`: a worker reports with a certificate of its own (`CN=<worker id>`) that names no user"
            )));
        }
        if cn != worker
            && coord
                .get(&layout::worker(cn))
                .await
                .map_err(internal)?
                .is_some()
        {
            return Err(Status::permission_denied(format!(
                "this certificate names worker `{cn}`: it may report for worker `{cn}` only, not `{worker}`"
            )));
        }
        Ok(())
    }
}

/// The name the reporting client's certificate gives (mTLS: the TLS layer admitted only
/// certificates the CA signed).
fn reporter_certificate<T>(req: &Request<T>) -> Result<String, Status> {
    let leaf = crate::listeners::client_certificate(req.extensions())
        .ok_or_else(|| Status::unauthenticated("no client certificate"))?;
    crate::credentials::certificate_user(leaf).map_err(Status::unauthenticated)
}

/// Whether `key` is the report key of the worker registered as `worker` now.
async fn registered_reporter(
    coord: &sluice_zk::Coordinator,
    worker: &str,
    key: &str,
) -> Result<(), Status> {
    let refused = || {
        Status::permission_denied(format!(
            "reports for worker `{worker}` are taken only from the process registered as it (its report key)"
        ))
    };
    let Some(node) = coord.get(&layout::worker(worker)).await.map_err(internal)? else {
        return Err(refused());
    };
    let record: sluice_zk::layout::WorkerRecord = serde_json::from_slice(&node.data)
        .map_err(|e| internal(format!("workers/{worker}: {e}")))?;
    let given = sluice_zk::layout::WorkerRecord::report_key_digest(key);
    let kept = &record.report_key_sha256;
    if key.is_empty()
        || kept.is_empty()
        || !crate::credentials::constant_time_eq(given.as_bytes(), kept.as_bytes())
    {
        return Err(refused());
    }
    Ok(())
}
