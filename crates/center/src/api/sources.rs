//! Sources: add or change, fail over to a new primary, re-snapshot, delete, list.

use sluice_model::Restart;
use sluice_proto::convert;
use sluice_proto::v1::*;
use tonic::{Request, Response, Status};

use crate::meta::StoredPipeline;

use super::common::*;

pub(super) async fn list_sources(
    api: &AdminApi,
    _: Request<ListSourcesRequest>,
) -> Result<Response<ListSourcesResponse>, Status> {
    let sources = api.shared.meta.sources().await.map_err(meta_err)?;
    Ok(Response::new(ListSourcesResponse {
        sources: sources.iter().map(convert::source).collect(),
    }))
}

pub(super) async fn put_source(
    api: &AdminApi,
    req: Request<Source>,
) -> Result<Response<Source>, Status> {
    super::guard::about(&req, &req.get_ref().name);
    let s = validate_source(req.into_inner(), &api.shared.cfg.source_secrets)?;
    let epoch = api.writable().await?;
    let existing = api.shared.meta.sources().await.map_err(meta_err)?;
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
            api.coord()?
                .delete(&format!("tasks/{}", s.name), None, true)
                .await
                .map_err(internal)?;
        }
    }
    api.shared
        .meta
        .put_source(epoch, &s)
        .await
        .map_err(meta_err)?;
    api.add_event(
        "source",
        &s.name,
        &format!(
            "source put: {}:{} server_id {}",
            s.host, s.port, s.server_id
        ),
    )
    .await;
    api.changed();
    Ok(Response::new(convert::source(&s)))
}

pub(super) async fn failover_source(
    api: &AdminApi,
    req: Request<FailoverRequest>,
) -> Result<Response<Source>, Status> {
    super::guard::about(&req, &req.get_ref().name);
    let req = req.into_inner();
    if req.host.is_empty() {
        return Err(Status::invalid_argument("host: required (the new primary)"));
    }
    let port = match req.port {
        0 => None,
        p => Some(
            u16::try_from(p)
                .map_err(|_| Status::invalid_argument(format!("port: {p} is not a TCP port")))?,
        ),
    };
    let epoch = api.writable().await?;
    let current = api
        .shared
        .meta
        .sources()
        .await
        .map_err(meta_err)?
        .into_iter()
        .find(|s| s.name == req.name)
        .ok_or_else(|| Status::not_found(format!("no source `{}`", req.name)))?;
    let port = port.unwrap_or(current.port);
    let s = api
        .shared
        .meta
        .bump_source_epoch(epoch, &req.name, Restart::Gtid, Some((&req.host, port)))
        .await
        .map_err(meta_err)?
        .ok_or_else(|| Status::not_found(format!("no source `{}`", req.name)))?;
    api.add_event(
        "source",
        &s.name,
        &format!(
            "source failover: {}:{} → {}:{}, version epoch {}; the task resumes there from its confirmed GTID state",
            current.host, current.port, s.host, s.port, s.coordinates.epoch
        ),
    )
    .await;
    api.changed();
    Ok(Response::new(convert::source(&s)))
}

pub(super) async fn resnapshot_source(
    api: &AdminApi,
    req: Request<ResnapshotRequest>,
) -> Result<Response<ResnapshotResponse>, Status> {
    super::guard::about(&req, &req.get_ref().name);
    let name = req.into_inner().name;
    let epoch = api.writable().await?;
    let pipelines = api.shared.meta.pipelines().await.map_err(meta_err)?;
    let ours: Vec<&StoredPipeline> = pipelines.iter().filter(|p| p.spec.source == name).collect();
    if !ours.is_empty() && api.shared.es.is_none() {
        return Err(Status::failed_precondition(
            "a re-snapshot builds the source's pipelines anew, and builds need the center's [elasticsearch] section",
        ));
    }
    let s = api
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
        api.shared
            .meta
            .start_build(
                epoch,
                &p.spec.name,
                crate::build::DEFAULT_CHUNK_ROWS,
                0,
                false,
            )
            .await
            .map_err(meta_err)?;
        builds_started.push(p.spec.name.clone());
    }
    api.add_event(
        "source",
        &s.name,
        &format!(
            "source re-snapshot: version epoch {}; the task starts again at the server's current end; builds started: {}",
            s.coordinates.epoch,
            if builds_started.is_empty() { "none".to_owned() } else { builds_started.join(", ") }
        ),
    )
    .await;
    api.changed();
    Ok(Response::new(ResnapshotResponse {
        source: Some(convert::source(&s)),
        builds_started,
        already_building,
    }))
}

pub(super) async fn delete_source(
    api: &AdminApi,
    req: Request<DeleteRequest>,
) -> Result<Response<DeleteResponse>, Status> {
    super::guard::about(&req, &req.get_ref().name);
    let name = req.into_inner().name;
    let epoch = api.writable().await?;
    let existed = api
        .shared
        .meta
        .delete_source(epoch, &name)
        .await
        .map_err(meta_err)?;
    if existed {
        api.add_event("source", &name, "source deleted").await;
    }
    api.changed();
    Ok(Response::new(DeleteResponse { existed }))
}

pub(super) async fn test_source(
    api: &AdminApi,
    req: Request<Source>,
) -> Result<Response<SourceTest>, Status> {
    let spec = validate_source(req.into_inner(), &api.shared.cfg.source_secrets)?;
    let src = sluice_mysql::SourceConfig::from_spec(&spec, &api.shared.cfg.source_access())
        .map_err(Status::invalid_argument)?;
    let mut test = SourceTest::default();
    match sluice_mysql::preflight(&src, None).await {
        Ok(info) => test.server = info.server.to_string(),
        Err(sluice_mysql::MysqlError::Preflight { problems, .. }) => test.problems = problems,
        Err(e) => {
            test.problems = vec![e.to_string()];
            return Ok(Response::new(test));
        }
    }
    match sluice_mysql::catalog::tables(&src, false).await {
        Ok(tables) => test.tables = tables.iter().map(table_message).collect(),
        Err(e) => test.problems.push(e.to_string()),
    }
    Ok(Response::new(test))
}

pub(super) async fn list_tables(
    api: &AdminApi,
    req: Request<ListTablesRequest>,
) -> Result<Response<ListTablesResponse>, Status> {
    let ListTablesRequest { source: name, all } = req.into_inner();
    let sources = api.shared.meta.sources().await.map_err(meta_err)?;
    let spec = sources
        .iter()
        .find(|s| s.name == name)
        .ok_or_else(|| Status::not_found(format!("no source `{name}`")))?;
    let src = sluice_mysql::SourceConfig::from_spec(spec, &api.shared.cfg.source_access())
        .map_err(Status::failed_precondition)?;
    let tables = sluice_mysql::catalog::tables(&src, all)
        .await
        .map_err(|e| center_err(e.into()))?;
    Ok(Response::new(ListTablesResponse {
        tables: tables.iter().map(table_message).collect(),
    }))
}

fn table_message(t: &sluice_mysql::catalog::TableShape) -> Table {
    Table {
        database: t.db.clone(),
        table: t.table.clone(),
        columns: t
            .columns
            .iter()
            .map(|c| Column {
                name: c.name.clone(),
                r#type: c.column_type.clone(),
                key: c.key,
                nullable: c.nullable,
            })
            .collect(),
        rows_estimated: t.rows_estimated,
    }
}
