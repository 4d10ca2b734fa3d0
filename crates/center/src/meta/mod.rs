//! The meta database: sources, pipelines, assignment history, events and the workers'
//! last reports. The center creates and migrates its schema at start (serialised between
//! replicas by a named lock).
//!
//! Every write of the leader runs in a transaction that first locks the `leader` row and
//! checks that it still holds the writer's epoch: a deposed leader's late write finds a
//! newer epoch there and is rolled back ([`MetaError::Deposed`]).

use std::collections::HashMap;
use std::time::Duration;

use mysql_async::prelude::*;
use mysql_async::{Conn, Pool, Row, Transaction, TxOpts};
use sluice_model::{Coordinates, PipelineSpec, Restart, SourceSpec};
use sluice_proto::v1::{Event, TaskProgress};

use crate::config::MetaSection;
use crate::history::History;

mod checks;
mod delayed;
mod dict;

pub use checks::{CheckRun, NewCheck};
pub use delayed::Pending;

#[derive(Debug, thiserror::Error)]
pub enum MetaError {
    #[error("meta database: {0}")]
    Db(#[from] mysql_async::Error),
    #[error("deposed: the meta database names epoch {current} as the leader's, not ours ({ours})")]
    Deposed { ours: u64, current: u64 },
    #[error("meta database: {0}")]
    Corrupt(String),
    /// The settings do not allow connecting as configured (the reason names the fix).
    #[error("{0}")]
    Refused(String),
}

/// Schema versions, applied in order; each entry's statements run once.
const MIGRATIONS: &[(u32, &[&str])] = &[
    (
    1,
    &[
        "CREATE TABLE leader (
            id TINYINT UNSIGNED PRIMARY KEY,
            epoch BIGINT UNSIGNED NOT NULL,
            center VARCHAR(255) NOT NULL,
            since TIMESTAMP(3) NOT NULL DEFAULT CURRENT_TIMESTAMP(3)
        )",
        "INSERT INTO leader (id, epoch, center) VALUES (1, 0, '')",
        "CREATE TABLE sources (
            name VARCHAR(64) PRIMARY KEY,
            host VARCHAR(255) NOT NULL,
            port SMALLINT UNSIGNED NOT NULL,
            user VARCHAR(128) NOT NULL,
            password_ref VARCHAR(512) NOT NULL,
            server_id INT UNSIGNED NOT NULL,
            tables_json TEXT NOT NULL,
            updated_at TIMESTAMP(3) NOT NULL DEFAULT CURRENT_TIMESTAMP(3) ON UPDATE CURRENT_TIMESTAMP(3),
            UNIQUE KEY replica (host, port, server_id)
        )",
        "CREATE TABLE pipelines (
            name VARCHAR(128) PRIMARY KEY,
            source VARCHAR(64) NOT NULL,
            db_name VARCHAR(64) NOT NULL,
            table_name VARCHAR(64) NOT NULL,
            alias VARCHAR(255) NOT NULL,
            spec_json TEXT NOT NULL,
            updated_at TIMESTAMP(3) NOT NULL DEFAULT CURRENT_TIMESTAMP(3) ON UPDATE CURRENT_TIMESTAMP(3),
            UNIQUE KEY alias (alias)
        )",
        "CREATE TABLE assignments (
            id BIGINT UNSIGNED AUTO_INCREMENT PRIMARY KEY,
            task VARCHAR(64) NOT NULL,
            worker VARCHAR(255) NULL,
            from_worker VARCHAR(255) NULL,
            epoch BIGINT UNSIGNED NOT NULL,
            reason VARCHAR(255) NOT NULL,
            at TIMESTAMP(3) NOT NULL DEFAULT CURRENT_TIMESTAMP(3),
            KEY task (task, id)
        )",
        "CREATE TABLE events (
            id BIGINT UNSIGNED AUTO_INCREMENT PRIMARY KEY,
            at TIMESTAMP(3) NOT NULL DEFAULT CURRENT_TIMESTAMP(3),
            origin VARCHAR(255) NOT NULL,
            kind VARCHAR(64) NOT NULL,
            subject VARCHAR(255) NOT NULL,
            message TEXT NOT NULL,
            KEY subject (subject, id)
        )",
        "CREATE TABLE task_status (
            task VARCHAR(64) PRIMARY KEY,
            worker VARCHAR(255) NOT NULL,
            state VARCHAR(64) NOT NULL,
            position VARCHAR(255) NOT NULL,
            gtid TEXT NOT NULL,
            events_published BIGINT UNSIGNED NOT NULL,
            lag_seconds DOUBLE NOT NULL,
            reported_at TIMESTAMP(3) NOT NULL DEFAULT CURRENT_TIMESTAMP(3) ON UPDATE CURRENT_TIMESTAMP(3)
        )",
    ],
    ),
    (
        2,
        &[
            "ALTER TABLE pipelines
               ADD COLUMN state VARCHAR(16) NOT NULL DEFAULT 'unavailable',
               ADD COLUMN live_version INT UNSIGNED NOT NULL DEFAULT 0,
               ADD COLUMN building_version INT UNSIGNED NOT NULL DEFAULT 0,
               ADD COLUMN next_version INT UNSIGNED NOT NULL DEFAULT 1,
               ADD COLUMN history_json TEXT NULL",
            "CREATE TABLE builds (
                id BIGINT UNSIGNED AUTO_INCREMENT PRIMARY KEY,
                pipeline VARCHAR(128) NOT NULL,
                version INT UNSIGNED NOT NULL,
                state VARCHAR(16) NOT NULL,
                chunk_rows BIGINT UNSIGNED NOT NULL,
                throttle_rows_per_sec BIGINT UNSIGNED NOT NULL,
                started_at TIMESTAMP(3) NOT NULL DEFAULT CURRENT_TIMESTAMP(3),
                finished_at TIMESTAMP(3) NULL,
                KEY pipeline (pipeline, id)
            )",
            "CREATE TABLE doomed_indexes (
                index_name VARCHAR(255) PRIMARY KEY,
                pipeline VARCHAR(128) NOT NULL,
                version INT UNSIGNED NOT NULL,
                reason VARCHAR(64) NOT NULL,
                at TIMESTAMP(3) NOT NULL DEFAULT CURRENT_TIMESTAMP(3)
            )",
        ],
    ),
    // A pipeline's state follows from its versions (`StoredPipeline::state`); a stored copy could
    // only disagree with them.
    (3, &["ALTER TABLE pipelines DROP COLUMN state"]),
    // `spec_json` holds the whole pipeline (one definition, `sluice_model::PipelineSpec`);
    // the key columns beside it stay for the unique constraints.
    (
        4,
        &["UPDATE pipelines SET spec_json = JSON_SET(spec_json, '$.name', name,
             '$.source', source, '$.database', db_name, '$.table', table_name, '$.alias', alias)"],
    ),
    // Each source's version epoch (`sluice_model::Coordinates`): kept when the source is
    // deleted, so a name added again never reuses an epoch.
    (
        5,
        &["CREATE TABLE source_epochs (
            name VARCHAR(64) PRIMARY KEY,
            epoch SMALLINT UNSIGNED NOT NULL,
            restart VARCHAR(8) NOT NULL,
            at TIMESTAMP(3) NOT NULL DEFAULT CURRENT_TIMESTAMP(3) ON UPDATE CURRENT_TIMESTAMP(3)
        )"],
    ),
    // Dead letters published again (`sluicectl dlq replay`), by letter id, and where the
    // replayed event went.
    (
        6,
        &["CREATE TABLE dead_letter_replays (
            letter VARCHAR(400) PRIMARY KEY,
            replayed_to VARCHAR(400) NOT NULL,
            epoch BIGINT UNSIGNED NOT NULL,
            at TIMESTAMP(3) NOT NULL DEFAULT CURRENT_TIMESTAMP(3) ON UPDATE CURRENT_TIMESTAMP(3)
        )"],
    ),
    // The IK dynamic dictionary (`dict`): its words, and when each dictionary's published
    // set last changed (its `Last-Modified`).
    (
        7,
        &[
            "CREATE TABLE dict_words (
                id BIGINT UNSIGNED AUTO_INCREMENT PRIMARY KEY,
                dictionary VARCHAR(8) NOT NULL,
                word VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
                published TINYINT(1) NOT NULL DEFAULT 0,
                added_at TIMESTAMP(3) NOT NULL DEFAULT CURRENT_TIMESTAMP(3),
                published_at TIMESTAMP(3) NULL,
                UNIQUE KEY dictionary_word (dictionary, word)
            )",
            "CREATE TABLE dict_changes (
                dictionary VARCHAR(8) PRIMARY KEY,
                changed_at TIMESTAMP(3) NOT NULL DEFAULT CURRENT_TIMESTAMP(3)
            )",
        ],
    ),
    // Which kept versions the etl keeps current (`crate::history`); versions kept before
    // are not.
    (
        8,
        &["ALTER TABLE pipelines ADD COLUMN current_history_json TEXT NULL"],
    ),
    // Why a build failed (state `failed`).
    (9, &["ALTER TABLE builds ADD COLUMN reason TEXT NULL"]),
    // Consistency checks: what each compared and found (`tally_json`, a `CheckTally`).
    (
        10,
        &["CREATE TABLE checks (
            id BIGINT UNSIGNED AUTO_INCREMENT PRIMARY KEY,
            pipeline VARCHAR(128) NOT NULL,
            version INT UNSIGNED NOT NULL,
            since VARCHAR(32) NOT NULL DEFAULT '',
            since_ms BIGINT NULL,
            repair BOOL NOT NULL,
            state VARCHAR(16) NOT NULL,
            started_by VARCHAR(16) NOT NULL,
            chunks INT UNSIGNED NOT NULL DEFAULT 0,
            chunks_done INT UNSIGNED NOT NULL DEFAULT 0,
            tally_json TEXT NULL,
            started_at TIMESTAMP(3) NOT NULL DEFAULT CURRENT_TIMESTAMP(3),
            finished_at TIMESTAMP(3) NULL,
            KEY pipeline (pipeline, id),
            KEY state (state)
        )"],
    ),
    // Delayed changes (`crate::delayed`): recorded once per changed row (`digest` of its
    // relation and join values), claimed by a job (`job`, a `checks` row of kind
    // `delayed`); and where the leader is in the delayed topic, moved in the same
    // transaction as what it read.
    (
        11,
        &[
            "ALTER TABLE checks ADD COLUMN kind VARCHAR(16) NOT NULL DEFAULT 'check', ADD COLUMN changes BIGINT UNSIGNED NOT NULL DEFAULT 0",
            "CREATE TABLE delayed_changes (
                pipeline VARCHAR(128) NOT NULL,
                digest BINARY(32) NOT NULL,
                node VARCHAR(1024) NOT NULL,
                vals TEXT NOT NULL,
                version BIGINT UNSIGNED NOT NULL,
                changes BIGINT UNSIGNED NOT NULL DEFAULT 1,
                first_seen TIMESTAMP(3) NOT NULL DEFAULT CURRENT_TIMESTAMP(3),
                last_seen TIMESTAMP(3) NOT NULL DEFAULT CURRENT_TIMESTAMP(3),
                job BIGINT UNSIGNED NULL,
                PRIMARY KEY (pipeline, digest),
                KEY job (job)
            )",
            "CREATE TABLE delayed_offsets (
                topic VARCHAR(255) NOT NULL,
                part INT NOT NULL,
                next BIGINT NOT NULL,
                PRIMARY KEY (topic, part)
            )",
        ],
    ),
    // Verified builds (`pipelines build --verify`): held once caught up until `swap_by`
    // (a clean compare, or `force`) releases the swap.
    (
        12,
        &["ALTER TABLE builds ADD COLUMN verify BOOL NOT NULL DEFAULT FALSE, ADD COLUMN swap_by VARCHAR(64) NULL"],
    ),
];

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

    pub fn state(&self) -> &'static str {
        sluice_proto::convert::state_of(self.live_version, self.building_version)
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

/// A worker's last report of a task.
#[derive(Debug, Clone)]
pub struct TaskStatus {
    pub worker: String,
    pub state: String,
    pub events_published: u64,
    pub lag_seconds: f64,
    pub reported_at_ms: i64,
}

#[derive(Clone)]
pub struct Meta {
    pool: Pool,
    /// This center's id: the origin of the events the meta database records itself.
    origin: String,
}

impl Meta {
    /// Connects, creates the database if missing and applies pending migrations.
    pub async fn connect(cfg: &MetaSection, origin: &str) -> Result<Self, MetaError> {
        if cfg.tls.is_none() && !cfg.allow_public_key_retrieval {
            let greeting = sluice_mysql::auth::greeting(&cfg.host, cfg.port)
                .await
                .map_err(|e| MetaError::Db(mysql_async::Error::Io(mysql_async::IoError::Io(e))))?;
            let who = "the meta database ([meta])";
            if let Some(why) = sluice_mysql::auth::refusal(&greeting, false, false, who) {
                return Err(MetaError::Refused(why));
            }
        }
        let server = mysql_async::OptsBuilder::default()
            .ip_or_hostname(cfg.host.clone())
            .tcp_port(cfg.port)
            .user(Some(cfg.user.clone()))
            .pass(Some(cfg.password.expose().to_owned()))
            .prefer_socket(false)
            .ssl_opts(cfg.tls.as_ref().map(sluice_mysql::ssl_opts));
        let mut conn = Conn::new(server.clone()).await?;
        conn.query_drop(format!(
            "CREATE DATABASE IF NOT EXISTS `{}` CHARACTER SET utf8mb4",
            cfg.database
        ))
        .await?;
        conn.disconnect().await?;
        let pool = Pool::new(server.db_name(Some(cfg.database.clone())));
        let meta = Self {
            pool,
            origin: origin.to_owned(),
        };
        meta.migrate().await?;
        Ok(meta)
    }

    async fn migrate(&self) -> Result<(), MetaError> {
        let mut conn = self.pool.get_conn().await?;
        let locked: Option<i64> = conn
            .query_first("SELECT GET_LOCK(CONCAT(DATABASE(), '.migrate'), 60)")
            .await?;
        if locked != Some(1) {
            return Err(MetaError::Corrupt(
                "another center held the migration lock for 60 s".into(),
            ));
        }
        let result = async {
            conn.query_drop(
                "CREATE TABLE IF NOT EXISTS schema_migrations (
                    version INT UNSIGNED PRIMARY KEY,
                    applied_at TIMESTAMP(3) NOT NULL DEFAULT CURRENT_TIMESTAMP(3)
                )",
            )
            .await?;
            let done: Option<u32> = conn
                .query_first("SELECT MAX(version) FROM schema_migrations")
                .await?
                .flatten();
            let done = done.unwrap_or(0);
            for (version, statements) in MIGRATIONS.iter().filter(|(v, _)| *v > done) {
                // DDL commits implicitly in MySQL: each statement is its own step, and the
                // version row is written last.
                for statement in *statements {
                    conn.query_drop(*statement).await?;
                }
                conn.exec_drop(
                    "INSERT INTO schema_migrations (version) VALUES (?)",
                    (version,),
                )
                .await?;
                tracing::info!(version, "meta database migrated");
            }
            Ok::<_, MetaError>(())
        }
        .await;
        conn.query_drop("SELECT RELEASE_LOCK(CONCAT(DATABASE(), '.migrate'))")
            .await?;
        result
    }

    /// Records that `center` leads at `epoch`; fails if a newer epoch is already there.
    /// Whether the meta database answers (`SELECT 1` on a pooled connection).
    pub async fn ping(&self) -> Result<(), MetaError> {
        let mut conn = self.pool.get_conn().await?;
        conn.query_drop("SELECT 1").await?;
        Ok(())
    }

    pub async fn take_leadership(&self, epoch: u64, center: &str) -> Result<(), MetaError> {
        let mut conn = self.pool.get_conn().await?;
        conn.exec_drop(
            "UPDATE leader SET epoch = ?, center = ?, since = CURRENT_TIMESTAMP(3) WHERE id = 1 AND epoch < ?",
            (epoch, center, epoch),
        )
        .await?;
        if conn.affected_rows() == 0 {
            let current: u64 = conn
                .query_first("SELECT epoch FROM leader WHERE id = 1")
                .await?
                .unwrap_or(0);
            if current != epoch {
                return Err(MetaError::Deposed {
                    ours: epoch,
                    current,
                });
            }
        }
        Ok(())
    }

    /// Starts a transaction in which the leader at `epoch` may write.
    async fn fenced(&self, epoch: u64) -> Result<Transaction<'static>, MetaError> {
        let mut tx = self.pool.start_transaction(TxOpts::default()).await?;
        let current: u64 = tx
            .query_first("SELECT epoch FROM leader WHERE id = 1 FOR UPDATE")
            .await?
            .unwrap_or(0);
        if current != epoch {
            tx.rollback().await?;
            return Err(MetaError::Deposed {
                ours: epoch,
                current,
            });
        }
        Ok(tx)
    }

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
    ) -> Result<Result<u32, String>, MetaError> {
        let mut tx = self.fenced(epoch).await?;
        let row: Option<(u32, u32, u32)> = tx
            .exec_first(
                "SELECT building_version, live_version, next_version FROM pipelines WHERE name = ? FOR UPDATE",
                (name,),
            )
            .await?;
        let Some((building, live, next)) = row else {
            tx.rollback().await?;
            return Ok(Err(format!("no pipeline `{name}`")));
        };
        if building > 0 {
            tx.rollback().await?;
            return Ok(Err(format!(
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
        Ok(Ok(version))
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
    ) -> Result<Result<(), String>, MetaError> {
        let name = &p.spec.name;
        let mut tx = self.fenced(epoch).await?;
        let Some(mut history) = locked_history(&mut tx, name).await? else {
            tx.rollback().await?;
            return Ok(Err(format!("no pipeline `{name}`")));
        };
        if !history.kept.contains(&version) {
            tx.rollback().await?;
            return Ok(Err(format!(
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
        Ok(Ok(()))
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

    pub async fn events(&self, limit: u32, subject: &str) -> Result<Vec<Event>, MetaError> {
        let mut conn = self.pool.get_conn().await?;
        let limit = limit.clamp(1, 10_000);
        let rows: Vec<(u64, i64, String, String, String, String)> = conn
            .exec(
                "SELECT id, CAST(UNIX_TIMESTAMP(at) * 1000 AS SIGNED), origin, kind, subject, message
                 FROM events WHERE (? = '' OR subject = ?) ORDER BY id DESC LIMIT ?",
                (subject, subject, limit),
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

    pub async fn save_status(&self, worker: &str, t: &TaskProgress) -> Result<(), MetaError> {
        let mut conn = self.pool.get_conn().await?;
        conn.exec_drop(
            "INSERT INTO task_status (task, worker, state, position, gtid, events_published, lag_seconds)
             VALUES (?, ?, ?, ?, ?, ?, ?)
             ON DUPLICATE KEY UPDATE worker = VALUES(worker), state = VALUES(state),
               position = VALUES(position), gtid = VALUES(gtid),
               events_published = VALUES(events_published), lag_seconds = VALUES(lag_seconds)",
            (
                &t.source,
                worker,
                &t.state,
                &t.position,
                &t.gtid,
                t.events_published,
                t.lag_seconds,
            ),
        )
        .await?;
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
                            state,
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

    /// When each replayed dead letter (by id) was last replayed, ms since the epoch.
    pub async fn replays(&self) -> Result<HashMap<String, i64>, MetaError> {
        let mut conn = self.pool.get_conn().await?;
        let rows: Vec<(String, i64)> = conn
            .query(
                "SELECT letter, CAST(UNIX_TIMESTAMP(at) * 1000 AS SIGNED) FROM dead_letter_replays",
            )
            .await?;
        Ok(rows.into_iter().collect())
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

    pub async fn close(self) {
        let _ = tokio::time::timeout(Duration::from_secs(5), self.pool.disconnect()).await;
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

async fn insert_event(
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
