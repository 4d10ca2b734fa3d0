//! Pipelines and their versions: the spec, the live version, a build under way and how
//! it was asked for, the versions kept for rollback, and the indexes doomed to deletion.

use mysql_async::prelude::*;
use mysql_async::{Row, Transaction};
use sluice_model::{Availability, PipelineSpec};

use super::{insert_event, Meta, MetaError};
use crate::history::History;

/// How a running build was asked for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BuildSettings {
    pub chunk_rows: u64,
    pub throttle_rows_per_sec: u64,
    pub started_at_ms: i64,
    /// Held once caught up, until released.
    pub verify: bool,
    /// What released a held build's swap (`compare 12`, `force`); `None`: held.
    pub swap_by: Option<String>,
}

/// A pipeline as the meta database keeps it: the spec, and where its versions stand.
#[derive(Debug, Clone, PartialEq)]
pub struct StoredPipeline {
    pub spec: PipelineSpec,
    pub live_version: u32,
    pub building_version: u32,
    pub history: History,
}

impl StoredPipeline {
    /// The version the alias points to: the last one built, or version 1, which the etl
    /// creates before any build.
    pub fn live_or_first(&self) -> u32 {
        self.live_version.max(1)
    }

    pub fn availability(&self) -> Availability {
        Availability::of(self.live_version, self.building_version)
    }

    /// The versions the etl writes as history (see [`History::announced`]). Before any
    /// build there are none: version 1, made by the etl, holds only what streamed into
    /// it, so it is never whole and never becomes a rollback target.
    pub fn announced_history(&self) -> Vec<u32> {
        if self.live_version == 0 {
            return Vec::new();
        }
        self.history
            .announced(self.live_version, self.spec.keep_history)
    }
}

impl Meta {
    /// The pipeline named `name`, if there is one.
    pub async fn pipeline(&self, name: &str) -> Result<Option<StoredPipeline>, MetaError> {
        let pipelines = self.pipelines().await?;
        Ok(pipelines.into_iter().find(|p| p.spec.name == name))
    }

    pub async fn pipelines(&self) -> Result<Vec<StoredPipeline>, MetaError> {
        let mut conn = self.pool.get_conn().await?;
        let rows: Vec<Row> = conn
            .query("SELECT name, spec_json, live_version, building_version, history_json, current_history_json FROM pipelines ORDER BY name")
            .await?;
        rows.into_iter()
            .map(|row| {
                let name: String = row.get(0).unwrap_or_default();
                let spec: String = row.get(1).unwrap_or_default();
                let spec: PipelineSpec = serde_json::from_str(&spec).map_err(|e| {
                    MetaError::Corrupt(format!("pipelines.spec_json of {name}: {e}"))
                })?;
                Ok(StoredPipeline {
                    spec,
                    live_version: row.get(2).unwrap_or_default(),
                    building_version: row.get(3).unwrap_or_default(),
                    history: history_of(&name, row.get(4).flatten(), row.get(5).flatten())?,
                })
            })
            .collect()
    }

    pub async fn put_pipeline(&self, epoch: u64, p: &PipelineSpec) -> Result<(), MetaError> {
        let mut tx = self.fenced(epoch).await?;
        tx.exec_drop(
            "INSERT INTO pipelines (name, source, db_name, table_name, alias, spec_json)
             VALUES (?, ?, ?, ?, ?, ?)
             ON DUPLICATE KEY UPDATE source = VALUES(source), db_name = VALUES(db_name),
               table_name = VALUES(table_name), alias = VALUES(alias), spec_json = VALUES(spec_json)",
            (
                &p.name,
                &p.source,
                &p.database,
                &p.table,
                &p.alias,
                serde_json::to_string(p).expect("spec serializes"),
            ),
        )
        .await?;
        tx.commit().await?;
        Ok(())
    }

    /// Removes the pipeline; `indexes` (its versions) are doomed: deleted once no etl
    /// writes to them.
    pub async fn delete_pipeline(
        &self,
        epoch: u64,
        name: &str,
        indexes: &[(String, u32)],
    ) -> Result<bool, MetaError> {
        let mut tx = self.fenced(epoch).await?;
        tx.exec_drop("DELETE FROM pipelines WHERE name = ?", (name,))
            .await?;
        let existed = tx.affected_rows() > 0;
        for (index, version) in indexes {
            doom(&mut tx, index, name, *version, "pipeline deleted").await?;
        }
        tx.commit().await?;
        Ok(existed)
    }

    /// Starts building the pipeline's next version; returns it. Fails when a build is
    /// already under way.
    pub async fn start_build(
        &self,
        epoch: u64,
        name: &str,
        chunk_rows: u64,
        throttle: u64,
        verify: bool,
    ) -> Result<u32, MetaError> {
        let mut tx = self.fenced(epoch).await?;
        let row: Option<(u32, u32, u32)> = tx
            .exec_first(
                "SELECT building_version, live_version, next_version FROM pipelines WHERE name = ? FOR UPDATE",
                (name,),
            )
            .await?;
        let Some((building, live, next)) = row else {
            tx.rollback().await?;
            return Err(MetaError::Refused(format!("no pipeline `{name}`")));
        };
        if building > 0 {
            tx.rollback().await?;
            return Err(MetaError::Refused(format!(
                "pipeline `{name}` is already building version {building}; reset it first to start over"
            )));
        }
        // Versions are never reused: an abandoned build's index may linger until deleted.
        // The etl's first version (created before any build) is 1.
        let version = next.max(live + 1).max(2);
        tx.exec_drop(
            "UPDATE pipelines SET building_version = ?, next_version = ? WHERE name = ?",
            (version, version + 1, name),
        )
        .await?;
        tx.exec_drop(
            "INSERT INTO builds (pipeline, version, state, chunk_rows, throttle_rows_per_sec, verify) VALUES (?, ?, 'running', ?, ?, ?)",
            (name, version, chunk_rows, throttle, verify),
        )
        .await?;
        let held = if verify {
            " (held for verification once caught up)"
        } else {
            ""
        };
        insert_event(
            &mut tx,
            &self.origin,
            "build",
            name,
            &format!("building version {version}{held}"),
        )
        .await?;
        tx.commit().await?;
        Ok(version)
    }

    /// The settings of the pipeline's build of `version`.
    pub async fn build_settings(
        &self,
        name: &str,
        version: u32,
    ) -> Result<Option<BuildSettings>, MetaError> {
        let mut conn = self.pool.get_conn().await?;
        let row: Option<(u64, u64, i64, bool, Option<String>)> = conn
            .exec_first(
                "SELECT chunk_rows, throttle_rows_per_sec, CAST(UNIX_TIMESTAMP(started_at) * 1000 AS SIGNED), verify, swap_by
                 FROM builds WHERE pipeline = ? AND version = ? ORDER BY id DESC LIMIT 1",
                (name, version),
            )
            .await?;
        Ok(row.map(
            |(chunk_rows, throttle_rows_per_sec, started_at_ms, verify, swap_by)| BuildSettings {
                chunk_rows,
                throttle_rows_per_sec,
                started_at_ms,
                verify,
                swap_by,
            },
        ))
    }

    /// Releases the swap of the held build of `version` (`by`: what allowed it); `false`
    /// when that version is not being built any more.
    pub async fn release_swap(
        &self,
        epoch: u64,
        name: &str,
        version: u32,
        by: &str,
    ) -> Result<bool, MetaError> {
        let mut tx = self.fenced(epoch).await?;
        let build: Option<u64> = tx
            .exec_first(
                "SELECT b.id FROM builds b JOIN pipelines p ON p.name = b.pipeline AND p.building_version = b.version
                 WHERE b.pipeline = ? AND b.version = ? AND b.state = 'running' ORDER BY b.id DESC LIMIT 1 FOR UPDATE",
                (name, version),
            )
            .await?;
        let Some(build) = build else {
            tx.rollback().await?;
            return Ok(false);
        };
        tx.exec_drop("UPDATE builds SET swap_by = ? WHERE id = ?", (by, build))
            .await?;
        let message = format!("swap to version {version} released ({by})");
        insert_event(&mut tx, &self.origin, "build", name, &message).await?;
        tx.commit().await?;
        Ok(true)
    }

    /// The build of `version` is live: the alias moved to it from `previous` versions,
    /// which join the history (current if the etl wrote them as `announced` history).
    /// Versions beyond the pipeline's `keep_history` are doomed; returns them.
    pub async fn finish_build(
        &self,
        epoch: u64,
        p: &StoredPipeline,
        version: u32,
        previous: &[u32],
    ) -> Result<Vec<u32>, MetaError> {
        let name = &p.spec.name;
        let mut tx = self.fenced(epoch).await?;
        let mut history = locked_history(&mut tx, name).await?.unwrap_or_default();
        history.remove(version);
        let dropped = retire(&mut tx, p, history, previous).await?;
        tx.exec_drop(
            "UPDATE pipelines SET live_version = ?, building_version = 0 WHERE name = ? AND building_version = ?",
            (version, name, version),
        )
        .await?;
        tx.exec_drop(
            "UPDATE builds SET state = 'done', finished_at = CURRENT_TIMESTAMP(3) WHERE pipeline = ? AND version = ?",
            (name, version),
        )
        .await?;
        insert_event(
            &mut tx,
            &self.origin,
            "build",
            name,
            &format!(
                "version {version} is live (alias moved){}",
                dropped_note(&dropped)
            ),
        )
        .await?;
        tx.commit().await?;
        Ok(dropped)
    }

    /// The alias moved back from the live version to `to`, a current history version;
    /// the one it left joins the history, current. Returns the versions doomed.
    pub async fn rolled_back(
        &self,
        epoch: u64,
        p: &StoredPipeline,
        to: u32,
    ) -> Result<Vec<u32>, MetaError> {
        let name = &p.spec.name;
        let from = p.live_or_first();
        let mut tx = self.fenced(epoch).await?;
        let mut history = locked_history(&mut tx, name).await?.unwrap_or_default();
        history.remove(to);
        let dropped = retire(&mut tx, p, history, &[from]).await?;
        tx.exec_drop(
            "UPDATE pipelines SET live_version = ? WHERE name = ?",
            (to, name),
        )
        .await?;
        insert_event(
            &mut tx,
            &self.origin,
            "rollback",
            name,
            &format!(
                "alias moved back from version {from} to {to}{}",
                dropped_note(&dropped)
            ),
        )
        .await?;
        tx.commit().await?;
        Ok(dropped)
    }

    /// Drops kept version `version`: no longer a rollback target, its index doomed.
    pub async fn drop_version(
        &self,
        epoch: u64,
        p: &StoredPipeline,
        version: u32,
    ) -> Result<(), MetaError> {
        let name = &p.spec.name;
        let mut tx = self.fenced(epoch).await?;
        let Some(mut history) = locked_history(&mut tx, name).await? else {
            tx.rollback().await?;
            return Err(MetaError::Refused(format!("no pipeline `{name}`")));
        };
        if !history.kept.contains(&version) {
            tx.rollback().await?;
            return Err(MetaError::Refused(format!(
                "version {version} is not a kept version of `{name}` (kept: {:?}; the live and the building one cannot be dropped)",
                history.kept
            )));
        }
        history.remove(version);
        store_history(&mut tx, name, &history).await?;
        let index = sluice_elastic::versioned_index(&p.spec.alias, version);
        doom(&mut tx, &index, name, version, "dropped").await?;
        insert_event(
            &mut tx,
            &self.origin,
            "version",
            name,
            &format!("version {version} dropped; its index is deleted once no etl writes to it"),
        )
        .await?;
        tx.commit().await?;
        Ok(())
    }

    /// Abandons the pipeline's build; its index is doomed. Returns the abandoned version.
    pub async fn reset_build(
        &self,
        epoch: u64,
        name: &str,
        alias: &str,
    ) -> Result<Option<u32>, MetaError> {
        self.end_build(epoch, name, alias, None).await
    }

    /// The pipeline's build failed for `reason`: abandoned like a reset (the alias
    /// untouched, its index doomed), and recorded as failed with the reason.
    pub async fn fail_build(
        &self,
        epoch: u64,
        name: &str,
        alias: &str,
        reason: &str,
    ) -> Result<Option<u32>, MetaError> {
        self.end_build(epoch, name, alias, Some(reason)).await
    }

    async fn end_build(
        &self,
        epoch: u64,
        name: &str,
        alias: &str,
        failure: Option<&str>,
    ) -> Result<Option<u32>, MetaError> {
        let mut tx = self.fenced(epoch).await?;
        let row: Option<u32> = tx
            .exec_first(
                "SELECT building_version FROM pipelines WHERE name = ? FOR UPDATE",
                (name,),
            )
            .await?;
        let Some(building) = row else {
            tx.rollback().await?;
            return Ok(None);
        };
        tx.exec_drop(
            "UPDATE pipelines SET building_version = 0 WHERE name = ?",
            (name,),
        )
        .await?;
        if building > 0 {
            let (state, why, message) = match failure {
                None => ("reset", "build reset", format!("build of version {building} reset")),
                Some(reason) => (
                    "failed",
                    "build failed",
                    format!("build of version {building} failed: {reason}; the alias is untouched, fix the cause and build again"),
                ),
            };
            tx.exec_drop(
                "UPDATE builds SET state = ?, reason = ?, finished_at = CURRENT_TIMESTAMP(3) WHERE pipeline = ? AND version = ?",
                (state, failure, name, building),
            )
            .await?;
            doom(
                &mut tx,
                &sluice_elastic::versioned_index(alias, building),
                name,
                building,
                why,
            )
            .await?;
            insert_event(&mut tx, &self.origin, "build", name, &message).await?;
        }
        tx.commit().await?;
        Ok((building > 0).then_some(building))
    }

    /// The pipeline's last build: (version, state, why it failed).
    pub async fn last_build(
        &self,
        name: &str,
    ) -> Result<Option<(u32, String, Option<String>)>, MetaError> {
        let mut conn = self.pool.get_conn().await?;
        Ok(conn
            .exec_first(
                "SELECT version, state, reason FROM builds WHERE pipeline = ? ORDER BY id DESC LIMIT 1",
                (name,),
            )
            .await?)
    }

    /// Indexes to delete once no etl writes to them: (index, pipeline, version).
    pub async fn doomed(&self) -> Result<Vec<(String, String, u32)>, MetaError> {
        let mut conn = self.pool.get_conn().await?;
        Ok(conn
            .query("SELECT index_name, pipeline, version FROM doomed_indexes ORDER BY at")
            .await?)
    }

    pub async fn forget_doomed(&self, epoch: u64, index: &str) -> Result<(), MetaError> {
        let mut tx = self.fenced(epoch).await?;
        tx.exec_drop("DELETE FROM doomed_indexes WHERE index_name = ?", (index,))
            .await?;
        tx.commit().await?;
        Ok(())
    }
}

async fn locked_history(
    tx: &mut Transaction<'static>,
    name: &str,
) -> Result<Option<History>, MetaError> {
    let row: Option<(Option<String>, Option<String>)> = tx
        .exec_first(
            "SELECT history_json, current_history_json FROM pipelines WHERE name = ? FOR UPDATE",
            (name,),
        )
        .await?;
    row.map(|(kept, current)| history_of(name, kept, current))
        .transpose()
}

async fn store_history(
    tx: &mut Transaction<'static>,
    name: &str,
    history: &History,
) -> Result<(), MetaError> {
    tx.exec_drop(
        "UPDATE pipelines SET history_json = ?, current_history_json = ? WHERE name = ?",
        (
            serde_json::to_string(&history.kept).expect("serializes"),
            serde_json::to_string(&history.current).expect("serializes"),
            name,
        ),
    )
    .await?;
    Ok(())
}

fn history_of(
    name: &str,
    kept: Option<String>,
    current: Option<String>,
) -> Result<History, MetaError> {
    let parse = |column: &str, text: Option<String>| -> Result<Vec<u32>, MetaError> {
        let mut versions: Vec<u32> = match text {
            Some(t) => serde_json::from_str(&t)
                .map_err(|e| MetaError::Corrupt(format!("pipelines.{column} of {name}: {e}")))?,
            None => Vec::new(),
        };
        versions.sort_unstable_by(|a, b| b.cmp(a));
        Ok(versions)
    };
    Ok(History {
        kept: parse("history_json", kept)?,
        current: parse("current_history_json", current)?,
    })
}

/// The alias left `previous`: they join `p`'s history (current if the etl wrote them as
/// history), which is stored; versions beyond its `keep_history` are doomed and returned.
async fn retire(
    tx: &mut Transaction<'static>,
    p: &StoredPipeline,
    mut history: History,
    previous: &[u32],
) -> Result<Vec<u32>, MetaError> {
    let dropped = history.retire(previous, &p.announced_history(), p.spec.keep_history);
    store_history(tx, &p.spec.name, &history).await?;
    for v in &dropped {
        let index = sluice_elastic::versioned_index(&p.spec.alias, *v);
        doom(tx, &index, &p.spec.name, *v, "beyond keep_history").await?;
    }
    Ok(dropped)
}

fn dropped_note(dropped: &[u32]) -> String {
    if dropped.is_empty() {
        String::new()
    } else {
        format!("; versions {dropped:?} are beyond keep_history and will be deleted")
    }
}

async fn doom(
    q: &mut impl Queryable,
    index: &str,
    pipeline: &str,
    version: u32,
    reason: &str,
) -> Result<(), MetaError> {
    q.exec_drop(
        "INSERT INTO doomed_indexes (index_name, pipeline, version, reason) VALUES (?, ?, ?, ?)
         ON DUPLICATE KEY UPDATE reason = VALUES(reason)",
        (index, pipeline, version, reason),
    )
    .await?;
    Ok(())
}
