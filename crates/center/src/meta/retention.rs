//! History past its retention, deleted in batches (the leader's `crate::retention`).
//! Each kind keeps what still says something now: a task's latest assignment, each
//! pipeline's latest run of each kind, delayed changes still waiting for their pipeline.
//! Dead-letter replays are kept: forgetting one would let a replay of "every letter not
//! yet replayed" publish its letter again. They grow only by an operator's replays, one
//! row per letter replayed, and are read only for the letters a read found.

use std::time::Duration;

use mysql_async::prelude::*;

use super::{Meta, MetaError};

/// Rows one statement deletes at most, so no delete holds locks for long.
const BATCH: u64 = 5_000;

/// A kind of history with a retention.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum History {
    Events,
    Audit,
    /// Finished checks, compares, delayed jobs and resyncs.
    Runs,
    Assignments,
}

impl History {
    pub const ALL: [History; 4] = [
        History::Events,
        History::Audit,
        History::Runs,
        History::Assignments,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            History::Events => "events",
            History::Audit => "audit",
            History::Runs => "runs",
            History::Assignments => "assignments",
        }
    }

    /// One batch's statement; its `?` is the retention in microseconds.
    fn statement(self) -> String {
        let older = "CURRENT_TIMESTAMP(3) - INTERVAL ? MICROSECOND";
        match self {
            History::Events => format!("DELETE FROM events WHERE at < {older} LIMIT {BATCH}"),
            History::Audit => format!("DELETE FROM audit WHERE at < {older} LIMIT {BATCH}"),
            History::Runs => format!(
                "DELETE FROM checks WHERE finished_at IS NOT NULL AND finished_at < {older}
                 AND id NOT IN (SELECT id FROM (SELECT MAX(id) AS id FROM checks GROUP BY pipeline, kind) AS latest)
                 LIMIT {BATCH}"
            ),
            History::Assignments => format!(
                "DELETE FROM assignments WHERE at < {older}
                 AND id NOT IN (SELECT id FROM (SELECT MAX(id) AS id FROM assignments GROUP BY task) AS latest)
                 LIMIT {BATCH}"
            ),
        }
    }
}

impl Meta {
    /// Deletes `history` older than `kept`, batch after batch; how many rows went.
    pub async fn forget_older(&self, history: History, kept: Duration) -> Result<u64, MetaError> {
        let mut conn = self.pool.get_conn().await?;
        let statement = history.statement();
        let kept_us = kept.as_micros() as u64;
        let mut deleted = 0;
        loop {
            conn.exec_drop(&statement, (kept_us,)).await?;
            let n = conn.affected_rows();
            deleted += n;
            if n < BATCH {
                return Ok(deleted);
            }
        }
    }

    /// Deletes delayed changes recorded for pipelines that no longer exist (none will
    /// apply them); how many went.
    pub async fn forget_orphan_delayed(&self) -> Result<u64, MetaError> {
        let mut conn = self.pool.get_conn().await?;
        let mut deleted = 0;
        loop {
            conn.query_drop(format!(
                "DELETE FROM delayed_changes WHERE job IS NULL
                 AND pipeline NOT IN (SELECT name FROM pipelines) LIMIT {BATCH}"
            ))
            .await?;
            let n = conn.affected_rows();
            deleted += n;
            if n < BATCH {
                return Ok(deleted);
            }
        }
    }
}
