//! Sources: how to reach each MySQL instance, what to capture, and its coordinates.

use mysql_async::prelude::*;
use mysql_async::Row;
use sluice_model::{Coordinates, Restart, SourceSpec};

use super::{Meta, MetaError};

impl Meta {
    pub async fn sources(&self) -> Result<Vec<SourceSpec>, MetaError> {
        let mut conn = self.pool.get_conn().await?;
        let rows: Vec<Row> = conn
            .query(
                "SELECT s.name, s.host, s.port, s.user, s.password_ref, s.server_id, s.tables_json,
                   COALESCE(e.epoch, 0), COALESCE(e.restart, 'gtid')
                 FROM sources s LEFT JOIN source_epochs e ON e.name = s.name ORDER BY s.name",
            )
            .await?;
        rows.into_iter().map(source_from_row).collect()
    }

    /// Bumps the version epoch of source `name` (README "Failover and re-snapshot") and,
    /// for a failover, points it at `to` (host, port), in one transaction; returns the
    /// source as it now is, or `None` if there is no such source.
    pub async fn bump_source_epoch(
        &self,
        epoch: u64,
        name: &str,
        restart: Restart,
        to: Option<(&str, u16)>,
    ) -> Result<Option<SourceSpec>, MetaError> {
        let mut tx = self.fenced(epoch).await?;
        let exists: Option<String> = tx
            .exec_first(
                "SELECT name FROM sources WHERE name = ? FOR UPDATE",
                (name,),
            )
            .await?;
        if exists.is_none() {
            return Ok(None);
        }
        let current: Option<u16> = tx
            .exec_first(
                "SELECT epoch FROM source_epochs WHERE name = ? FOR UPDATE",
                (name,),
            )
            .await?;
        let next = current
            .unwrap_or(0)
            .checked_add(1)
            .filter(|e| u64::from(*e) <= sluice_model::version::MAX_EPOCH);
        let Some(next) = next else {
            return Err(MetaError::Corrupt(format!(
                "source {name}: the version epoch is at its maximum ({})",
                sluice_model::version::MAX_EPOCH
            )));
        };
        tx.exec_drop(
            "INSERT INTO source_epochs (name, epoch, restart) VALUES (?, ?, ?)
             ON DUPLICATE KEY UPDATE epoch = VALUES(epoch), restart = VALUES(restart)",
            (name, next, restart.as_str()),
        )
        .await?;
        if let Some((host, port)) = to {
            tx.exec_drop(
                "UPDATE sources SET host = ?, port = ? WHERE name = ?",
                (host, port, name),
            )
            .await?;
        }
        tx.commit().await?;
        Ok(self.sources().await?.into_iter().find(|s| s.name == name))
    }

    pub async fn put_source(&self, epoch: u64, s: &SourceSpec) -> Result<(), MetaError> {
        let mut tx = self.fenced(epoch).await?;
        tx.exec_drop(
            "INSERT INTO sources (name, host, port, user, password_ref, server_id, tables_json)
             VALUES (?, ?, ?, ?, ?, ?, ?)
             ON DUPLICATE KEY UPDATE host = VALUES(host), port = VALUES(port), user = VALUES(user),
               password_ref = VALUES(password_ref), server_id = VALUES(server_id),
               tables_json = VALUES(tables_json)",
            (
                &s.name,
                &s.host,
                s.port,
                &s.user,
                &s.password_ref,
                s.server_id,
                serde_json::to_string(&s.tables).expect("strings serialize"),
            ),
        )
        .await?;
        tx.commit().await?;
        Ok(())
    }

    pub async fn delete_source(&self, epoch: u64, name: &str) -> Result<bool, MetaError> {
        let mut tx = self.fenced(epoch).await?;
        tx.exec_drop("DELETE FROM sources WHERE name = ?", (name,))
            .await?;
        let existed = tx.affected_rows() > 0;
        tx.exec_drop("DELETE FROM task_status WHERE task = ?", (name,))
            .await?;
        tx.commit().await?;
        Ok(existed)
    }
}

fn source_from_row(row: Row) -> Result<SourceSpec, MetaError> {
    type Columns = (
        String,
        String,
        u16,
        String,
        String,
        u32,
        String,
        u16,
        String,
    );
    let (name, host, port, user, password_ref, server_id, tables, epoch, restart): Columns =
        mysql_async::from_row_opt(row)
            .map_err(|e| MetaError::Corrupt(format!("a row of sources: {e}")))?;
    Ok(SourceSpec {
        tables: serde_json::from_str(&tables)
            .map_err(|e| MetaError::Corrupt(format!("sources.tables_json of {name}: {e}")))?,
        shards: Vec::new(),
        coordinates: Coordinates {
            epoch,
            restart: Restart::parse(&restart).ok_or_else(|| {
                MetaError::Corrupt(format!("source_epochs.restart of {name}: `{restart}`"))
            })?,
        },
        name,
        host,
        port,
        user,
        password_ref,
        server_id,
    })
}
