//! The meta database: sources, pipelines, assignment history, events and the workers'
//! last reports. The center creates and migrates its schema at start (serialised between
//! replicas by a named lock).
//!
//! Every write of the leader runs in a transaction that first locks the `leader` row and
//! checks that it still holds the writer's epoch: a deposed leader's late write finds a
//! newer epoch there and is rolled back ([`MetaError::Deposed`]).

use std::time::Duration;

use mysql_async::prelude::*;
use mysql_async::{Conn, Pool, Transaction, TxOpts};

use crate::config::MetaSection;

mod delayed;
mod dict;
mod events;
mod migrations;
mod pipelines;
mod retention;
mod runs;
mod sources;
mod users;

pub use delayed::Pending;
use events::insert_event;
pub use events::{EventFilter, TaskStatus};
pub use pipelines::{BuildSettings, StoredPipeline};
pub use retention::History;
pub use runs::{ChunkedRun, NewRun};
pub use users::{Audited, StoredSession, StoredToken, StoredUser};

#[derive(Debug, thiserror::Error)]
pub enum MetaError {
    #[error("meta database: {0}")]
    Db(#[from] mysql_async::Error),
    #[error("deposed: the meta database names epoch {current} as the leader's, not ours ({ours})")]
    Deposed { ours: u64, current: u64 },
    #[error("meta database: {0}")]
    Corrupt(String),
    /// Refused, with the reason, which names the fix: the state does not allow the change
    /// (a build under way, a word already there, no such pipeline), or the settings do
    /// not allow connecting as configured.
    #[error("{0}")]
    Refused(String),
    /// What the call names is not there (a user, a token).
    #[error("{0}")]
    NotFound(String),
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
        let who = format!("the meta database ([meta], {}:{})", cfg.host, cfg.port);
        if let Some(why) = sluice_mysql::auth::refusal(
            cfg.tls.is_some(),
            cfg.allow_plaintext,
            &who,
            "meta.allow_plaintext",
        ) {
            return Err(MetaError::Refused(why));
        }
        let server = mysql_async::OptsBuilder::default()
            .ip_or_hostname(cfg.host.clone())
            .tcp_port(cfg.port)
            .user(Some(cfg.user.clone()))
            .pass(Some(cfg.password.expose().to_owned()))
            .prefer_socket(false)
            .ssl_opts(cfg.tls.as_ref().map(sluice_mysql::ssl_opts));
        let mut conn = sluice_mysql::auth::unwound(Conn::new(server.clone())).await?;
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
            for (version, statements) in migrations::MIGRATIONS.iter().filter(|(v, _)| *v > done) {
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

    pub async fn close(self) {
        let _ = tokio::time::timeout(Duration::from_secs(5), self.pool.disconnect()).await;
    }
}
