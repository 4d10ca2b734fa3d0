//! Delayed changes (`crate::delayed`): each changed row of a `delayed` relation once,
//! however often it changed, until a delayed job that claimed it (`job`) is done; and
//! where the leader is in the delayed topic.

use std::collections::HashMap;

use mysql_async::prelude::*;
use mysql_async::Transaction;
use sluice_model::DelayedChange;

use super::{Meta, MetaError};

/// Delayed changes recorded by one statement at most.
const RECORD_ROWS: usize = 200;

/// A change waiting for (or being applied by) a delayed job.
#[derive(Debug, Clone, PartialEq)]
pub struct Pending {
    /// `kind/relation.relation`.
    pub node: String,
    /// The join values, as JSON text.
    pub values: String,
    pub version: u64,
    /// Changes of the row folded into this one.
    pub changes: u64,
    pub first_seen_ms: i64,
    pub last_seen_ms: i64,
    /// The job applying it; 0: waiting.
    pub job: u64,
}

/// `node, vals, version, changes, first_seen, last_seen, job` as read.
type PendingRow = (String, String, u64, u64, i64, i64, Option<u64>);

/// Claims every waiting change of `pipeline` for job `job`; returns how many.
pub(super) async fn claim(
    tx: &mut Transaction<'_>,
    pipeline: &str,
    job: u64,
) -> Result<u64, MetaError> {
    tx.exec_drop(
        "UPDATE delayed_changes SET job = ? WHERE pipeline = ? AND job IS NULL",
        (job, pipeline),
    )
    .await?;
    let claimed = tx.affected_rows();
    tx.exec_drop("UPDATE checks SET changes = ? WHERE id = ?", (claimed, job))
        .await?;
    Ok(claimed)
}

/// A failed job's changes wait again.
pub(super) async fn release(tx: &mut Transaction<'_>, job: u64) -> Result<(), MetaError> {
    tx.exec_drop(
        "UPDATE delayed_changes SET job = NULL WHERE job = ?",
        (job,),
    )
    .await?;
    Ok(())
}

/// A done job's changes are applied (a newer change of a row released it from the job).
pub(super) async fn forget(tx: &mut Transaction<'_>, job: u64) -> Result<(), MetaError> {
    tx.exec_drop("DELETE FROM delayed_changes WHERE job = ?", (job,))
        .await?;
    Ok(())
}

impl Meta {
    /// Records `changes` read from the delayed topic, and that `topic`'s partitions are
    /// read up to `next` (partition → next offset), in one transaction. A row already
    /// waiting keeps one entry with the newest version; one a running job claimed is
    /// released to wait again when the change is newer than what it had (the job may
    /// have read the documents before it).
    pub async fn record_delayed(
        &self,
        epoch: u64,
        changes: &[DelayedChange],
        topic: &str,
        next: &HashMap<i32, i64>,
    ) -> Result<(), MetaError> {
        let mut tx = self.fenced(epoch).await?;
        // Many rows to a statement: a leader catching up records a thousand changes in a
        // few round trips, not a thousand. A row twice in one statement is folded as if
        // by two statements (MySQL applies the rows in order).
        for rows in changes.chunks(RECORD_ROWS) {
            let mut params: Vec<mysql_async::Value> = Vec::with_capacity(rows.len() * 7);
            for c in rows {
                let (node, values) = (c.node_key(), c.values_text());
                params.extend([
                    c.pipeline.as_str().into(),
                    node.as_str().into(),
                    values.as_str().into(),
                    node.into(),
                    values.into(),
                    c.version.into(),
                    c.changes.into(),
                ]);
            }
            let tuples = vec!["(?, UNHEX(SHA2(CONCAT(?, '\n', ?), 256)), ?, ?, ?, ?)"; rows.len()];
            tx.exec_drop(
                format!(
                    "INSERT INTO delayed_changes (pipeline, digest, node, vals, version, changes)
                     VALUES {}
                     ON DUPLICATE KEY UPDATE
                       first_seen = IF(job IS NOT NULL AND VALUES(version) > version, CURRENT_TIMESTAMP(3), first_seen),
                       job = IF(VALUES(version) > version, NULL, job),
                       version = GREATEST(version, VALUES(version)),
                       changes = changes + VALUES(changes),
                       last_seen = CURRENT_TIMESTAMP(3)",
                    tuples.join(", ")
                ),
                params,
            )
            .await?;
        }
        for (part, offset) in next {
            tx.exec_drop(
                "INSERT INTO delayed_offsets (topic, part, next) VALUES (?, ?, ?)
                 ON DUPLICATE KEY UPDATE next = VALUES(next)",
                (topic, part, offset),
            )
            .await?;
        }
        tx.commit().await?;
        Ok(())
    }

    /// Where the leader is in the delayed topic: partition → next offset.
    pub async fn delayed_offsets(&self, topic: &str) -> Result<HashMap<i32, i64>, MetaError> {
        let mut conn = self.pool.get_conn().await?;
        Ok(conn
            .exec(
                "SELECT part, next FROM delayed_offsets WHERE topic = ?",
                (topic,),
            )
            .await?
            .into_iter()
            .collect())
    }

    /// Up to `limit` of a pipeline's changes, oldest first, and how many wait and how
    /// many a job applies in all.
    pub async fn delayed(
        &self,
        pipeline: &str,
        limit: u32,
    ) -> Result<(Vec<Pending>, u64, u64), MetaError> {
        let mut conn = self.pool.get_conn().await?;
        let rows: Vec<PendingRow> = conn
            .exec(
                "SELECT node, vals, version, changes,
                    CAST(UNIX_TIMESTAMP(first_seen) * 1000 AS SIGNED),
                    CAST(UNIX_TIMESTAMP(last_seen) * 1000 AS SIGNED), job
                 FROM delayed_changes WHERE pipeline = ? ORDER BY first_seen, digest LIMIT ?",
                (pipeline, limit),
            )
            .await?;
        let (waiting, applying): (Option<u64>, Option<u64>) = conn
            .exec_first(
                "SELECT CAST(COALESCE(SUM(job IS NULL), 0) AS UNSIGNED), CAST(COALESCE(SUM(job IS NOT NULL), 0) AS UNSIGNED)
                 FROM delayed_changes WHERE pipeline = ?",
                (pipeline,),
            )
            .await?
            .unwrap_or_default();
        let pending = rows
            .into_iter()
            .map(
                |(node, values, version, changes, first, last, job)| Pending {
                    node,
                    values,
                    version,
                    changes,
                    first_seen_ms: first,
                    last_seen_ms: last,
                    job: job.unwrap_or(0),
                },
            )
            .collect();
        Ok((pending, waiting.unwrap_or(0), applying.unwrap_or(0)))
    }

    /// The changes job `job` claimed: `(node, values)`.
    pub async fn claimed(&self, job: u64) -> Result<Vec<(String, String)>, MetaError> {
        let mut conn = self.pool.get_conn().await?;
        Ok(conn
            .exec(
                "SELECT node, vals FROM delayed_changes WHERE job = ?",
                (job,),
            )
            .await?)
    }

    /// When the oldest waiting change of each pipeline was recorded (ms since the epoch).
    pub async fn oldest_waiting(&self) -> Result<HashMap<String, i64>, MetaError> {
        let mut conn = self.pool.get_conn().await?;
        Ok(conn
            .query(
                "SELECT pipeline, CAST(UNIX_TIMESTAMP(MIN(first_seen)) * 1000 AS SIGNED)
                 FROM delayed_changes WHERE job IS NULL GROUP BY pipeline",
            )
            .await?
            .into_iter()
            .collect())
    }
}
