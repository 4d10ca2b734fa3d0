//! Pipelines and their versions: put, delete, list; builds, resets, verified swaps, rollbacks, dropped versions.

use sluice_model::BuildPhase;
use sluice_model::RunKind;
use sluice_proto::v1::*;
use tonic::{Request, Response, Status};

use super::common::*;

pub(super) async fn list_pipelines(
    api: &AdminApi,
    _: Request<ListPipelinesRequest>,
) -> Result<Response<ListPipelinesResponse>, Status> {
    let mut pipelines = Vec::new();
    for p in api.shared.meta.pipelines().await.map_err(meta_err)? {
        pipelines.push(api.message(&p).await?);
    }
    Ok(Response::new(ListPipelinesResponse { pipelines }))
}

pub(super) async fn put_pipeline(
    api: &AdminApi,
    req: Request<Pipeline>,
) -> Result<Response<Pipeline>, Status> {
    super::guard::about(&req, &req.get_ref().name);
    let spec = validate_pipeline(req.into_inner())?;
    let epoch = api.writable().await?;
    api.check_tables(&spec).await?;
    api.shared
        .meta
        .put_pipeline(epoch, &spec)
        .await
        .map_err(meta_err)?;
    let relations = spec.tables().len() - 1;
    api.add_event(
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
    api.changed();
    Ok(Response::new(api.pipeline_message(&spec.name).await?))
}

pub(super) async fn delete_pipeline(
    api: &AdminApi,
    req: Request<DeleteRequest>,
) -> Result<Response<DeleteResponse>, Status> {
    super::guard::about(&req, &req.get_ref().name);
    let name = req.into_inner().name;
    let epoch = api.writable().await?;
    // Its indexes go too, once no etl writes to them any more.
    let mut doomed = Vec::new();
    if let Some(p) = api.pipeline(&name).await? {
        let alias = &p.spec.alias;
        let mut versions: Vec<u32> = p.history.kept.clone();
        versions.extend([1, p.live_version, p.building_version]);
        if let Some(es) = &api.shared.es {
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
    let existed = api
        .shared
        .meta
        .delete_pipeline(epoch, &name, &doomed)
        .await
        .map_err(meta_err)?;
    api.changed();
    Ok(Response::new(DeleteResponse { existed }))
}

pub(super) async fn build_pipeline(
    api: &AdminApi,
    req: Request<BuildRequest>,
) -> Result<Response<BuildStatus>, Status> {
    super::guard::about(&req, &req.get_ref().name);
    let req = req.into_inner();
    let epoch = api.writable().await?;
    if api.shared.es.is_none() {
        return Err(Status::failed_precondition(
            "builds need the center's [elasticsearch] section (to move the alias)",
        ));
    }
    let chunk_rows = if req.chunk_rows == 0 {
        crate::build::DEFAULT_CHUNK_ROWS
    } else {
        req.chunk_rows
    };
    let version = api
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
        .map_err(meta_err)?;
    tracing::info!(pipeline = %req.name, version, chunk_rows, "build started");
    api.changed();
    let p = api.existing(&req.name).await?;
    let status = crate::build::status(&api.coord()?, &p)
        .await
        .map_err(internal)?
        .status;
    Ok(Response::new(BuildStatus { version, ..status }))
}

pub(super) async fn reset_pipeline(
    api: &AdminApi,
    req: Request<ResetRequest>,
) -> Result<Response<Pipeline>, Status> {
    super::guard::about(&req, &req.get_ref().name);
    let name = req.into_inner().name;
    let epoch = api.writable().await?;
    let p = api.existing(&name).await?;
    api.shared
        .meta
        .reset_build(epoch, &name, &p.spec.alias)
        .await
        .map_err(meta_err)?;
    api.changed();
    Ok(Response::new(api.pipeline_message(&name).await?))
}

pub(super) async fn rollback_pipeline(
    api: &AdminApi,
    req: Request<RollbackRequest>,
) -> Result<Response<Pipeline>, Status> {
    super::guard::about(&req, &req.get_ref().name);
    let req = req.into_inner();
    let epoch = api.writable().await?;
    let es = api.shared.es.as_ref().ok_or_else(|| {
        Status::failed_precondition(
            "rollbacks need the center's [elasticsearch] section (to move the alias)",
        )
    })?;
    api.existing(&req.name).await?;
    let to = (req.to_version > 0).then_some(req.to_version);
    crate::rollback::rollback(&api.shared, es, &api.coord()?, epoch, &req.name, to)
        .await
        .map_err(center_err)?;
    api.changed();
    Ok(Response::new(api.pipeline_message(&req.name).await?))
}

pub(super) async fn swap_pipeline(
    api: &AdminApi,
    req: Request<SwapRequest>,
) -> Result<Response<BuildStatus>, Status> {
    super::guard::about(&req, &req.get_ref().name);
    let req = req.into_inner();
    let epoch = api.writable().await?;
    let p = api.existing(&req.name).await?;
    let coord = api.coord()?;
    let progress = crate::build::status(&coord, &p).await.map_err(internal)?;
    if progress.phase != BuildPhase::Held {
        return Err(Status::failed_precondition(format!(
            "pipeline `{}` has no build held for verification (build phase: {})",
            req.name, progress.phase
        )));
    }
    let by = if req.force {
        "force".to_owned()
    } else {
        let compares = api
            .shared
            .meta
            .runs(&req.name, RunKind::Compare.as_str(), 1)
            .await
            .map_err(meta_err)?;
        crate::check::clean(&p, compares.first()).map_err(Status::failed_precondition)?
    };
    let released = api
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
    api.changed();
    Ok(Response::new(BuildStatus {
        message: format!("swap released ({by}): the alias moves at the leader's next pass"),
        ..progress.status
    }))
}

pub(super) async fn drop_version(
    api: &AdminApi,
    req: Request<DropVersionRequest>,
) -> Result<Response<Pipeline>, Status> {
    super::guard::about(&req, &req.get_ref().name);
    let req = req.into_inner();
    let epoch = api.writable().await?;
    let p = api.existing(&req.name).await?;
    api.shared
        .meta
        .drop_version(epoch, &p, req.version)
        .await
        .map_err(meta_err)?;
    api.changed();
    Ok(Response::new(api.pipeline_message(&req.name).await?))
}

pub(super) async fn get_build(
    api: &AdminApi,
    req: Request<GetBuildRequest>,
) -> Result<Response<BuildStatus>, Status> {
    let name = req.into_inner().name;
    let p = api.existing(&name).await?;
    let mut status = crate::build::status(&api.coord()?, &p)
        .await
        .map_err(internal)?
        .status;
    if p.building_version == 0 {
        let last = api.shared.meta.last_build(&name).await.map_err(meta_err)?;
        if let Some((version, _, reason)) = last.filter(|(_, s, _)| s == "failed") {
            status.put_phase(BuildPhase::Failed);
            status.version = version;
            status.message = reason.unwrap_or_default();
        } else if p.live_version > 0 {
            status.put_phase(BuildPhase::Done);
            status.version = p.live_version;
        }
    }
    status.needs_rebuild = api.needs_rebuild(&p).await?;
    Ok(Response::new(status))
}
