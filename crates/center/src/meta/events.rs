//! What happened, as the meta database remembers it: assignment decisions, events, the
//! workers' last reports of their tasks, and dead letters replayed.

use std::collections::HashMap;

use mysql_async::prelude::*;
use sluice_model::TaskState;
use sluice_proto::v1::{Event, TaskProgress};

use super::{Meta, MetaError};

/// A worker's last report of a task.
#[derive(Debug, Clone)]
pub struct TaskStatus {
    pub worker: String,
    /// `None`: a state this center does not know (a newer worker's).
    pub state: Option<TaskState>,
    pub events_published: u64,
    pub lag_seconds: f64,
    pub reported_at_ms: i64,
}

impl Meta {
    /// Records an assignment decision (and the event saying so); its id is the
    /// assignment's generation.
    pub async fn record_assignment(
        &self,
        epoch: u64,
        center: &str,
        task: &str,
        from: Option<&str>,
        to: Option<&str>,
        reason: &str,
    ) -> Result<u64, MetaError> {
        let mut tx = self.fenced(epoch).await?;
        tx.exec_drop(
            "INSERT INTO assignments (task, worker, from_worker, epoch, reason) VALUES (?, ?, ?, ?, ?)",
            (task, to, from, epoch, reason),
        )
        .await?;
        let generation = tx.last_insert_id().unwrap_or(0);
        let message = match (from, to) {
            (Some(f), Some(t)) => format!("moved from {f} to {t}: {reason}"),
            (None, Some(t)) => format!("assigned to {t}: {reason}"),
            (Some(f), None) => format!("taken from {f}: {reason}"),
            (None, None) => format!("unassigned: {reason}"),
        };
        insert_event(&mut tx, center, "assignment", task, &message).await?;
        tx.commit().await?;
        Ok(generation)
    }

    /// Appends an event (leader changes, worker reports). Not fenced: events are a log,
    /// and a deposed leader's account of what it saw is still true.
    pub async fn add_event(
        &self,
        origin: &str,
        kind: &str,
        subject: &str,
        message: &str,
    ) -> Result<(), MetaError> {
        let mut conn = self.pool.get_conn().await?;
        insert_event(&mut conn, origin, kind, subject, message).await
    }

    /// Appends the event unless the same one (kind, subject, message) is already
    /// recorded: for a state that every pass of the leader sees again.
    pub async fn add_event_once(
        &self,
        origin: &str,
        kind: &str,
        subject: &str,
        message: &str,
    ) -> Result<bool, MetaError> {
        let mut conn = self.pool.get_conn().await?;
        let seen: Option<u64> = conn
            .exec_first(
                "SELECT id FROM events WHERE subject = ? AND kind = ? AND message = ? LIMIT 1",
                (subject, kind, message),
            )
            .await?;
        if seen.is_some() {
            return Ok(false);
        }
        insert_event(&mut conn, origin, kind, subject, message).await?;
        Ok(true)
    }

    /// The newest events (at most `limit`) that `filter` lets through, newest first.
    pub async fn events(
        &self,
        limit: u32,
        filter: &EventFilter<'_>,
    ) -> Result<Vec<Event>, MetaError> {
        let mut conn = self.pool.get_conn().await?;
        let limit = limit.clamp(1, 10_000);
        let (subject, kind) = (filter.subject, filter.kind);
        // The bounds as seconds: `at` compares with FROM_UNIXTIME in the session's zone.
        let since = filter.since_ms.map(|ms| ms as f64 / 1000.0);
        let until = filter.until_ms.map(|ms| ms as f64 / 1000.0);
        let rows: Vec<(u64, i64, String, String, String, String)> = conn
            .exec(
                "SELECT id, CAST(UNIX_TIMESTAMP(at) * 1000 AS SIGNED), origin, kind, subject, message
                 FROM events
                 WHERE (? = '' OR subject = ?) AND (? = '' OR kind = ?)
                   AND (? IS NULL OR at >= FROM_UNIXTIME(?)) AND (? IS NULL OR at < FROM_UNIXTIME(?))
                 ORDER BY id DESC LIMIT ?",
                (subject, subject, kind, kind, since, since, until, until, limit),
            )
            .await?;
        Ok(rows
            .into_iter()
            .map(|(id, at_ms, origin, kind, subject, message)| Event {
                id: id as i64,
                at_ms,
                origin,
                kind,
                subject,
                message,
            })
            .collect())
    }

    /// Saves what `worker` reported of `tasks`, in one statement however many there are
    /// (a worker reports all its tasks every `report_interval`: at 200 sources, one
    /// statement a task would be a hundred a second).
    pub async fn save_statuses(
        &self,
        worker: &str,
        tasks: &[&TaskProgress],
    ) -> Result<(), MetaError> {
        if tasks.is_empty() {
            return Ok(());
        }
        let rows = vec!["(?, ?, ?, ?, ?, ?, ?)"; tasks.len()].join(", ");
        let sql = format!(
            "INSERT INTO task_status (task, worker, state, position, gtid, events_published, lag_seconds)
             VALUES {rows}
             ON DUPLICATE KEY UPDATE worker = VALUES(worker), state = VALUES(state),
               position = VALUES(position), gtid = VALUES(gtid),
               events_published = VALUES(events_published), lag_seconds = VALUES(lag_seconds)"
        );
        let params: Vec<mysql_async::Value> = (tasks.iter())
            .flat_map(|t| {
                let state = t
                    .state_of()
                    .map_or(t.state.clone(), |s| s.as_str().to_owned());
                [
                    t.source.as_str().into(),
                    worker.into(),
                    state.into(),
                    t.position.as_str().into(),
                    t.gtid.as_str().into(),
                    t.events_published.into(),
                    t.lag_seconds.into(),
                ]
            })
            .collect();
        let mut conn = self.pool.get_conn().await?;
        conn.exec_drop(sql, params).await?;
        Ok(())
    }

    pub async fn statuses(&self) -> Result<HashMap<String, TaskStatus>, MetaError> {
        let mut conn = self.pool.get_conn().await?;
        let rows: Vec<(String, String, String, u64, f64, i64)> = conn
            .query(
                "SELECT task, worker, state, events_published, lag_seconds,
                        CAST(UNIX_TIMESTAMP(reported_at) * 1000 AS SIGNED) FROM task_status",
            )
            .await?;
        Ok(rows
            .into_iter()
            .map(
                |(task, worker, state, events_published, lag_seconds, reported_at_ms)| {
                    (
                        task,
                        TaskStatus {
                            worker,
                            state: TaskState::parse(&state),
                            events_published,
                            lag_seconds,
                            reported_at_ms,
                        },
                    )
                },
            )
            .collect())
    }

    /// The generation of each task's latest assignment.
    pub async fn generations(&self) -> Result<HashMap<String, u64>, MetaError> {
        let mut conn = self.pool.get_conn().await?;
        let rows: Vec<(String, u64)> = conn
            .query("SELECT task, MAX(id) FROM assignments GROUP BY task")
            .await?;
        Ok(rows.into_iter().collect())
    }

    /// When each of `letters` (ids) that was replayed was last replayed, ms since the
    /// epoch: only those, asked in bounded lists, however many replays are recorded.
    pub async fn replays_of(&self, letters: &[String]) -> Result<HashMap<String, i64>, MetaError> {
        let mut conn = self.pool.get_conn().await?;
        let mut out = HashMap::new();
        for chunk in letters.chunks(500) {
            let marks = vec!["?"; chunk.len()].join(",");
            let rows: Vec<(String, i64)> = conn
                .exec(
                    format!(
                        "SELECT letter, CAST(UNIX_TIMESTAMP(at) * 1000 AS SIGNED)
                         FROM dead_letter_replays WHERE letter IN ({marks})"
                    ),
                    chunk.to_vec(),
                )
                .await?;
            out.extend(rows);
        }
        Ok(out)
    }

    /// Records that the leader at `epoch` replayed `letter` to `to`.
    pub async fn record_replay(&self, epoch: u64, letter: &str, to: &str) -> Result<(), MetaError> {
        let mut tx = self.fenced(epoch).await?;
        tx.exec_drop(
            "INSERT INTO dead_letter_replays (letter, replayed_to, epoch) VALUES (?, ?, ?)
             ON DUPLICATE KEY UPDATE replayed_to = VALUES(replayed_to), epoch = VALUES(epoch),
               at = CURRENT_TIMESTAMP(3)",
            (letter, to, epoch),
        )
        .await?;
        tx.commit().await?;
        Ok(())
    }
}

pub(super) async fn insert_event(
    q: &mut impl Queryable,
    origin: &str,
    kind: &str,
    subject: &str,
    message: &str,
) -> Result<(), MetaError> {
    q.exec_drop(
        "INSERT INTO events (origin, kind, subject, message) VALUES (?, ?, ?, ?)",
        (origin, kind, subject, message),
    )
    .await?;
    crate::metrics::EVENTS.add(1, &[opentelemetry::KeyValue::new("kind", kind.to_owned())]);
    Ok(())
}

/// Which events to list: each part that is set narrows.
#[derive(Debug, Default)]
pub struct EventFilter<'a> {
    pub subject: &'a str,
    pub kind: &'a str,
    pub since_ms: Option<i64>,
    pub until_ms: Option<i64>,
}
