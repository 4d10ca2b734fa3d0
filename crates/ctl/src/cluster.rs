//! `sluicectl leader`, `workers`, `tasks`, `rebalance` and `events`: the cluster as the
//! leader sees it.

use serde_json::{json, Value};
use sluice_proto::v1::*;

use crate::{ago, or_dash, print, Conn, Output};

/// `leader`: which center leads, at which epoch, and who answered.
pub async fn leader(conn: &mut Conn<'_>, out: Output) -> anyhow::Result<()> {
    let l = conn
        .call(|mut c| async move { c.get_leader(GetLeaderRequest {}).await })
        .await?;
    print(
        out,
        &["leader", "address", "epoch", "answered by"],
        vec![vec![
            or_dash(&l.leader_id),
            or_dash(&l.leader_addr),
            l.epoch.to_string(),
            l.answered_by.clone(),
        ]],
        json!({"leader_id": l.leader_id, "leader_addr": l.leader_addr, "epoch": l.epoch,
               "answered_by": l.answered_by, "answered_by_leader": l.answered_by_leader}),
    );
    Ok(())
}

/// `workers`: the live workers and their tasks.
pub async fn workers(conn: &mut Conn<'_>, out: Output) -> anyhow::Result<()> {
    let r = conn
        .call(|mut c| async move { c.list_workers(ListWorkersRequest {}).await })
        .await?;
    print(
        out,
        &["worker", "address", "version", "started", "capacity", "tasks"],
        r.workers
            .iter()
            .map(|w| vec![w.id.clone(), or_dash(&w.addr), w.version.clone(), ago(w.started_at_ms), w.capacity.to_string(), if w.tasks.is_empty() { "-".into() } else { w.tasks.join(",") }])
            .collect(),
        Value::Array(r.workers.iter().map(|w| json!({"id": w.id, "addr": w.addr, "version": w.version, "started_at_ms": w.started_at_ms, "capacity": w.capacity, "tasks": w.tasks})).collect()),
    );
    Ok(())
}

/// `tasks`: each binlog task, where it runs, its position and its worker's last report.
pub async fn tasks(conn: &mut Conn<'_>, out: Output) -> anyhow::Result<()> {
    let r = conn
        .call(|mut c| async move { c.list_tasks(ListTasksRequest {}).await })
        .await?;
    print(
        out,
        &["task", "assigned to", "running on", "position", "gtid", "state", "events", "lag", "reported"],
        r.tasks
            .iter()
            .map(|t| vec![t.source.clone(), or_dash(&t.assigned_to), or_dash(&t.running_on), or_dash(&t.position), or_dash(&t.gtid), or_dash(&t.state), t.events_published.to_string(), format!("{:.1}s", t.lag_seconds), ago(t.reported_at_ms)])
            .collect(),
        Value::Array(r.tasks.iter().map(|t| json!({"source": t.source, "assigned_to": t.assigned_to, "running_on": t.running_on, "position": t.position, "gtid": t.gtid, "state": t.state, "events_published": t.events_published, "lag_seconds": t.lag_seconds, "reported_at_ms": t.reported_at_ms, "generation": t.generation})).collect()),
    );
    Ok(())
}

/// `rebalance`: the moves the leader made to even out the workers.
pub async fn rebalance(conn: &mut Conn<'_>, out: Output) -> anyhow::Result<()> {
    let r = conn
        .call(|mut c| async move { c.rebalance(RebalanceRequest {}).await })
        .await?;
    print(
        out,
        &["task", "from", "to"],
        r.moves
            .iter()
            .map(|m| vec![m.task.clone(), or_dash(&m.from), m.to.clone()])
            .collect(),
        Value::Array(
            r.moves
                .iter()
                .map(|m| json!({"task": m.task, "from": m.from, "to": m.to}))
                .collect(),
        ),
    );
    Ok(())
}

/// `events`: what happened, newest first.
pub async fn events(
    conn: &mut Conn<'_>,
    out: Output,
    req: ListEventsRequest,
) -> anyhow::Result<()> {
    let r = conn
        .call_with(req, |mut c, req| async move { c.list_events(req).await })
        .await?;
    print(
        out,
        &["id", "when", "origin", "kind", "subject", "message"],
        r.events.iter().map(|e| vec![e.id.to_string(), ago(e.at_ms), e.origin.clone(), e.kind.clone(), e.subject.clone(), e.message.clone()]).collect(),
        Value::Array(r.events.iter().map(|e| json!({"id": e.id, "at_ms": e.at_ms, "origin": e.origin, "kind": e.kind, "subject": e.subject, "message": e.message})).collect()),
    );
    Ok(())
}
