//! The cluster: the leader, workers, tasks, rebalancing, events, and the workers' reports.

use std::collections::BTreeMap;

use sluice_model::TaskState;
use sluice_proto::v1::{self, *};
use sluice_zk::layout::{self, AssignmentRecord, WorkerRecord};
use tonic::{Request, Response, Status};

use super::common::*;

pub(super) async fn get_leader(
    api: &AdminApi,
    _: Request<GetLeaderRequest>,
) -> Result<Response<LeaderInfo>, Status> {
    let (leader, epoch) = match api.leader().await? {
        Some((l, epoch)) => (Some(l), epoch),
        // An election under way: the epoch of the last leader, and nobody named.
        None => (None, api.coord()?.current_epoch().await.map_err(internal)?),
    };
    Ok(Response::new(LeaderInfo {
        leader_id: leader.as_ref().map(|l| l.id.clone()).unwrap_or_default(),
        leader_addr: leader.map(|l| l.addr).unwrap_or_default(),
        epoch,
        answered_by: api.shared.cfg.center.id.clone(),
        answered_by_leader: api.shared.leading_epoch().is_some(),
    }))
}

pub(super) async fn list_workers(
    api: &AdminApi,
    _: Request<ListWorkersRequest>,
) -> Result<Response<ListWorkersResponse>, Status> {
    let coord = api.coord()?;
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

pub(super) async fn list_tasks(
    api: &AdminApi,
    _: Request<ListTasksRequest>,
) -> Result<Response<ListTasksResponse>, Status> {
    let coord = api.coord()?;
    let sources = api.shared.meta.sources().await.map_err(meta_err)?;
    let statuses = api.shared.meta.statuses().await.map_err(meta_err)?;
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
        let state = status.and_then(|s| s.state);
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
            state: state.map(TaskState::as_str).unwrap_or_default().into(),
            task_state: state.map_or(v1::TaskState::Unspecified, Into::into).into(),
            events_published: status.map_or(0, |s| s.events_published),
            lag_seconds: status.map_or(0.0, |s| s.lag_seconds),
            reported_at_ms: status.map_or(0, |s| s.reported_at_ms),
            generation,
        });
    }
    Ok(Response::new(ListTasksResponse { tasks }))
}

pub(super) async fn rebalance(
    api: &AdminApi,
    _: Request<RebalanceRequest>,
) -> Result<Response<RebalanceResponse>, Status> {
    api.writable().await?;
    let (tx, rx) = tokio::sync::oneshot::channel();
    api.shared
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

pub(super) async fn list_events(
    api: &AdminApi,
    req: Request<ListEventsRequest>,
) -> Result<Response<ListEventsResponse>, Status> {
    let req = req.into_inner();
    let limit = if req.limit == 0 { 50 } else { req.limit };
    let filter = crate::meta::EventFilter {
        subject: req.subject.trim(),
        kind: req.kind.trim(),
        since_ms: (req.since_ms > 0).then_some(req.since_ms),
        until_ms: (req.until_ms > 0).then_some(req.until_ms),
    };
    let events = api
        .shared
        .meta
        .events(limit, &filter)
        .await
        .map_err(meta_err)?;
    Ok(Response::new(ListEventsResponse {
        events,
        kept_ms: api.shared.cfg.retention.events.as_millis() as i64,
    }))
}
