//! Chunked runs — consistency checks (`crate::check`), compares of held builds (kind
//! `compare`) and delayed jobs (`crate::delayed`, kind `delayed`): one row per run (the
//! `checks` table, by its first kind's name), its progress and what it found kept up to
//! date by the leader as the workers' chunk results come in.

use std::collections::HashMap;

use mysql_async::prelude::*;
use mysql_async::Row;
use sluice_model::{ResyncScope, RunKind, RunState};
use sluice_zk::layout::CheckTally;

use super::{insert_event, Meta, MetaError};

const COLUMNS: &str = "id, pipeline, version, since, since_ms, repair, state, started_by,
    chunks, chunks_done, tally_json,
    CAST(UNIX_TIMESTAMP(started_at) * 1000 AS SIGNED),
    CAST(COALESCE(UNIX_TIMESTAMP(finished_at) * 1000, 0) AS SIGNED), kind, changes, scope_json";

/// A check as the meta database keeps it.
#[derive(Debug, Clone, PartialEq)]
pub struct ChunkedRun {
    pub id: u64,
    pub pipeline: String,
    /// The index version compared.
    pub version: u32,
    /// The window as asked (`24h`); empty: every row.
    pub since: String,
    pub since_ms: Option<i64>,
    pub repair: bool,
    pub state: RunState,
    /// `operator` or `schedule`.
    pub started_by: String,
    pub chunks: u32,
    pub chunks_done: u32,
    pub tally: CheckTally,
    pub started_at_ms: i64,
    pub finished_at_ms: i64,
    pub kind: RunKind,
    /// A delayed job: the recorded changes it applies.
    pub changes: u64,
    /// A resync: what it rebuilds.
    pub scope: Option<ResyncScope>,
}

/// What a new check is to do.
pub struct NewRun<'a> {
    pub pipeline: &'a str,
    pub version: u32,
    pub since: &'a str,
    pub since_ms: Option<i64>,
    pub repair: bool,
    pub started_by: &'a str,
    /// A delayed job takes every waiting change of the pipeline.
    pub kind: RunKind,
    /// A resync: what it rebuilds.
    pub scope: Option<&'a ResyncScope>,
}

fn run_of(mut row: Row) -> Result<ChunkedRun, MetaError> {
    fn take<T: FromValue>(row: &mut Row, i: usize) -> Result<T, MetaError> {
        row.take_opt(i)
            .ok_or_else(|| MetaError::Corrupt(format!("checks row: no column {i}")))?
            .map_err(|e| MetaError::Corrupt(format!("checks row, column {i}: {e}")))
    }
    let id: u64 = take(&mut row, 0)?;
    let tally = match take::<Option<String>>(&mut row, 10)? {
        Some(json) => serde_json::from_str(&json)
            .map_err(|e| MetaError::Corrupt(format!("check {id}'s tally: {e}")))?,
        None => CheckTally::default(),
    };
    Ok(ChunkedRun {
        id,
        pipeline: take(&mut row, 1)?,
        version: take(&mut row, 2)?,
        since: take(&mut row, 3)?,
        since_ms: take(&mut row, 4)?,
        repair: take(&mut row, 5)?,
        state: {
            let state: String = take(&mut row, 6)?;
            RunState::parse(&state)
                .ok_or_else(|| MetaError::Corrupt(format!("check {id}'s state: `{state}`")))?
        },
        started_by: take(&mut row, 7)?,
        chunks: take(&mut row, 8)?,
        chunks_done: take(&mut row, 9)?,
        tally,
        started_at_ms: take(&mut row, 11)?,
        finished_at_ms: take(&mut row, 12)?,
        kind: {
            let kind: String = take(&mut row, 13)?;
            RunKind::parse(&kind)
                .ok_or_else(|| MetaError::Corrupt(format!("check {id}: kind `{kind}`")))?
        },
        changes: take(&mut row, 14)?,
        scope: match take::<Option<String>>(&mut row, 15)? {
            Some(json) => Some(
                serde_json::from_str(&json)
                    .map_err(|e| MetaError::Corrupt(format!("check {id}'s scope: {e}")))?,
            ),
            None => None,
        },
    })
}

/// How events and answers name a run of `kind`.
fn noun(kind: RunKind) -> &'static str {
    match kind {
        RunKind::Check => "check",
        RunKind::Compare => "compare",
        RunKind::Delayed => "delayed job",
        RunKind::Resync => "resync",
    }
}

impl Meta {
    /// Records a new running check, compare or delayed job (which claims every waiting
    /// change); refused while the pipeline has any of them running, or for a job when
    /// nothing waits.
    pub async fn start_run(&self, epoch: u64, c: &NewRun<'_>) -> Result<u64, MetaError> {
        let scope = match c.scope {
            Some(scope) => Some(
                serde_json::to_string(scope)
                    .map_err(|e| MetaError::Corrupt(format!("a resync's scope: {e}")))?,
            ),
            None => None,
        };
        let mut tx = self.fenced(epoch).await?;
        let running: Option<(u64, String)> = tx
            .exec_first(
                "SELECT id, kind FROM checks WHERE pipeline = ? AND state = 'running' FOR UPDATE",
                (c.pipeline,),
            )
            .await?;
        if let Some((id, kind)) = running {
            tx.rollback().await?;
            let what = RunKind::parse(&kind).map_or("check", noun);
            return Err(MetaError::Refused(format!(
                "{what} {id} of pipeline `{}` is still running (`sluicectl pipelines checks {}`)",
                c.pipeline, c.pipeline
            )));
        }
        tx.exec_drop(
            "INSERT INTO checks (pipeline, version, since, since_ms, repair, state, started_by, kind, scope_json) VALUES (?, ?, ?, ?, ?, 'running', ?, ?, ?)",
            (c.pipeline, c.version, c.since, c.since_ms, c.repair, c.started_by, c.kind.as_str(), scope),
        )
        .await?;
        let id = tx.last_insert_id().unwrap_or_default();
        if c.kind == RunKind::Delayed {
            let claimed = super::delayed::claim(&mut tx, c.pipeline, id).await?;
            if claimed == 0 {
                tx.rollback().await?;
                return Err(MetaError::Refused(format!(
                    "no delayed change of pipeline `{}` waits (`sluicectl delayed list {}`)",
                    c.pipeline, c.pipeline
                )));
            }
            let message = format!(
                "delayed job {id} started: {claimed} recorded changes (by {})",
                c.started_by
            );
            insert_event(&mut tx, &self.origin, "delayed", c.pipeline, &message).await?;
            tx.commit().await?;
            return Ok(id);
        }
        let what = match c.scope {
            Some(scope) => scope.describe(),
            None if c.since.is_empty() => "every row".to_owned(),
            None => format!("roots changed in the last {}", c.since),
        };
        let message = format!(
            "{} {id} of version {} started ({what}{}; by {})",
            noun(c.kind),
            c.version,
            if c.repair && c.kind != RunKind::Resync {
                ", repairing"
            } else {
                ""
            },
            c.started_by
        );
        insert_event(&mut tx, &self.origin, c.kind.as_str(), c.pipeline, &message).await?;
        tx.commit().await?;
        Ok(id)
    }

    /// The newest run of each kind of each pipeline (a running one is always the newest
    /// of its kind: no other can start while it runs).
    pub async fn latest_runs(&self) -> Result<Vec<ChunkedRun>, MetaError> {
        let mut conn = self.pool.get_conn().await?;
        let rows: Vec<Row> = conn
            .query(format!(
                "SELECT {COLUMNS} FROM checks WHERE id IN (SELECT MAX(id) FROM checks GROUP BY pipeline, kind) ORDER BY id"
            ))
            .await?;
        rows.into_iter().map(run_of).collect()
    }

    /// A pipeline's checks (of `kind` only, unless empty), newest first.
    pub async fn runs(
        &self,
        pipeline: &str,
        kind: &str,
        limit: u32,
    ) -> Result<Vec<ChunkedRun>, MetaError> {
        let mut conn = self.pool.get_conn().await?;
        let rows: Vec<Row> = conn
            .exec(
                format!("SELECT {COLUMNS} FROM checks WHERE pipeline = ? AND (? = '' OR kind = ?) ORDER BY id DESC LIMIT ?"),
                (pipeline, kind, kind, limit),
            )
            .await?;
        rows.into_iter().map(run_of).collect()
    }

    pub async fn run(&self, id: u64) -> Result<Option<ChunkedRun>, MetaError> {
        let mut conn = self.pool.get_conn().await?;
        let row: Option<Row> = conn
            .exec_first(format!("SELECT {COLUMNS} FROM checks WHERE id = ?"), (id,))
            .await?;
        row.map(run_of).transpose()
    }

    /// When each pipeline's last scheduled check started (ms since the epoch).
    pub async fn last_scheduled_checks(&self) -> Result<HashMap<String, i64>, MetaError> {
        let mut conn = self.pool.get_conn().await?;
        Ok(conn
            .query(
                "SELECT pipeline, CAST(UNIX_TIMESTAMP(MAX(started_at)) * 1000 AS SIGNED) FROM checks WHERE started_by = 'schedule' AND kind = 'check' GROUP BY pipeline",
            )
            .await?
            .into_iter()
            .collect())
    }

    /// A running check's progress so far.
    pub async fn run_progress(
        &self,
        epoch: u64,
        id: u64,
        chunks: u32,
        chunks_done: u32,
        tally: &CheckTally,
    ) -> Result<(), MetaError> {
        let mut tx = self.fenced(epoch).await?;
        tx.exec_drop(
            "UPDATE checks SET chunks = ?, chunks_done = ?, tally_json = ? WHERE id = ? AND state = 'running'",
            (chunks, chunks_done, tally_json(tally), id),
        )
        .await?;
        tx.commit().await?;
        Ok(())
    }

    /// Ends a check: `done`, or `failed` when the tally carries an error.
    pub async fn finish_run(
        &self,
        epoch: u64,
        run: &ChunkedRun,
        chunks_done: u32,
        tally: &CheckTally,
    ) -> Result<(), MetaError> {
        let state = if tally.error.is_some() {
            RunState::Failed
        } else {
            RunState::Done
        }
        .as_str();
        let mut tx = self.fenced(epoch).await?;
        tx.exec_drop(
            "UPDATE checks SET state = ?, chunks_done = ?, tally_json = ?, finished_at = CURRENT_TIMESTAMP(3) WHERE id = ? AND state = 'running'",
            (state, chunks_done, tally_json(tally), run.id),
        )
        .await?;
        if run.kind == RunKind::Delayed {
            let message = match &tally.error {
                Some(e) => {
                    super::delayed::release(&mut tx, run.id).await?;
                    format!(
                        "delayed job {} failed (its changes wait again): {e}",
                        run.id
                    )
                }
                None => {
                    super::delayed::forget(&mut tx, run.id).await?;
                    format!(
                        "delayed job {} done: {} changes applied, {} documents rebuilt",
                        run.id, run.changes, tally.repaired
                    )
                }
            };
            insert_event(&mut tx, &self.origin, "delayed", &run.pipeline, &message).await?;
            tx.commit().await?;
            return Ok(());
        }
        let what = noun(run.kind);
        let message = match &tally.error {
            Some(e) => format!("{what} {} failed: {e}", run.id),
            None if run.kind == RunKind::Resync => format!(
                "resync {} done ({}): {} documents rebuilt of {} roots read",
                run.id,
                run.scope.as_ref().map(ResyncScope::describe).unwrap_or_default(),
                tally.repaired,
                tally.keys
            ),
            None => format!(
                "{what} {} done: {} documents, {} missing, {} extra, {} different, {} skipped (changed while read){}{}",
                run.id,
                tally.keys,
                tally.missing,
                tally.extra,
                tally.different,
                tally.skipped,
                if run.repair {
                    format!(", {} repairs sent", tally.repaired)
                } else {
                    String::new()
                },
                live_summary(&tally.live),
            ),
        };
        insert_event(
            &mut tx,
            &self.origin,
            run.kind.as_str(),
            &run.pipeline,
            &message,
        )
        .await?;
        tx.commit().await?;
        Ok(())
    }
}

/// A compare's verdict against the live version, for its event.
fn live_summary(live: &sluice_zk::layout::LiveTally) -> String {
    if live.is_empty() {
        return String::new();
    }
    format!(
        "; against live version {}: {} same, {} only new, {} only live, {} different, {} skipped",
        live.version, live.same, live.only_new, live.only_live, live.different, live.skipped
    )
}

fn tally_json(t: &CheckTally) -> String {
    serde_json::to_string(t).expect("a tally serializes")
}
