//! Chunked runs: consistency checks, compares of held builds, delayed changes and their jobs.

use sluice_proto::v1::*;
use tonic::{Request, Response, Status};

use super::common::*;

pub(super) async fn start_check(
    api: &AdminApi,
    req: Request<CheckRequest>,
) -> Result<Response<Check>, Status> {
    super::guard::about(&req, &req.get_ref().pipeline);
    let req = req.into_inner();
    let epoch = api.writable().await?;
    let p = api.existing(&req.pipeline).await?;
    let id = crate::check::start(
        &api.shared,
        epoch,
        &p,
        req.since.trim(),
        req.repair,
        "operator",
    )
    .await
    .map_err(center_err)?;
    tracing::info!(pipeline = %req.pipeline, check = id, "check started");
    api.changed();
    api.check_message(id).await.map(Response::new)
}

pub(super) async fn start_compare(
    api: &AdminApi,
    req: Request<CompareRequest>,
) -> Result<Response<Check>, Status> {
    super::guard::about(&req, &req.get_ref().pipeline);
    let req = req.into_inner();
    let epoch = api.writable().await?;
    let p = api.existing(&req.pipeline).await?;
    let coord = api.coord()?;
    let id = crate::check::start_compare(&api.shared, &coord, epoch, &p, req.repair)
        .await
        .map_err(center_err)?;
    tracing::info!(pipeline = %req.pipeline, compare = id, version = p.building_version, "compare started");
    api.changed();
    api.check_message(id).await.map(Response::new)
}

pub(super) async fn list_checks(
    api: &AdminApi,
    req: Request<ListChecksRequest>,
) -> Result<Response<ListChecksResponse>, Status> {
    let req = req.into_inner();
    api.existing(&req.pipeline).await?;
    let limit = if req.limit == 0 { 20 } else { req.limit };
    let checks = api
        .shared
        .meta
        .runs(&req.pipeline, req.kind.trim(), limit)
        .await
        .map_err(meta_err)?;
    Ok(Response::new(ListChecksResponse {
        checks: checks.iter().map(check_message).collect(),
    }))
}

pub(super) async fn get_check(
    api: &AdminApi,
    req: Request<GetCheckRequest>,
) -> Result<Response<Check>, Status> {
    api.check_message(req.into_inner().id)
        .await
        .map(Response::new)
}

pub(super) async fn list_delayed(
    api: &AdminApi,
    req: Request<ListDelayedRequest>,
) -> Result<Response<ListDelayedResponse>, Status> {
    let req = req.into_inner();
    api.existing(&req.pipeline).await?;
    api.records_delayed()?;
    let limit = if req.limit == 0 { 100 } else { req.limit };
    let (changes, pending, applying) = api
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

pub(super) async fn apply_delayed(
    api: &AdminApi,
    req: Request<ApplyDelayedRequest>,
) -> Result<Response<Check>, Status> {
    super::guard::about(&req, &req.get_ref().pipeline);
    let req = req.into_inner();
    let epoch = api.writable().await?;
    api.records_delayed()?;
    let p = api.existing(&req.pipeline).await?;
    let id = crate::delayed::start(&api.shared, epoch, &p, "operator")
        .await
        .map_err(center_err)?;
    tracing::info!(pipeline = %req.pipeline, job = id, "delayed job started");
    api.changed();
    api.check_message(id).await.map(Response::new)
}

pub(super) async fn resync_documents(
    api: &AdminApi,
    req: Request<ResyncRequest>,
) -> Result<Response<Check>, Status> {
    super::guard::about(&req, &req.get_ref().pipeline);
    let req = req.into_inner();
    let epoch = api.writable().await?;
    let p = api.existing(&req.pipeline).await?;
    let scope = sluice_model::ResyncScope {
        condition: req.r#where.trim().to_owned(),
        ids: req.ids.iter().map(|id| id.trim().to_owned()).collect(),
    };
    crate::resync::validate(&api.shared, &p, &scope)
        .await
        .map_err(center_err)?
        .map_err(Status::invalid_argument)?;
    let id = crate::resync::start(&api.shared, epoch, &p, &scope, "operator")
        .await
        .map_err(center_err)?;
    tracing::info!(pipeline = %req.pipeline, resync = id, scope = %scope.describe(), "resync started");
    api.changed();
    api.check_message(id).await.map(Response::new)
}
