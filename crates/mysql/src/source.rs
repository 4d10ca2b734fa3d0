//! How to reach a MySQL instance and which of its tables to capture.

use serde::Deserialize;
use sluice_model::pipeline::{TableMatcher, TablePattern};
use sluice_model::{Secret, SecretRefs, SourceSpec};

use crate::error::MysqlError;

/// One MySQL/MariaDB instance: one binlog task.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SourceConfig {
    /// The instance's name in Sluice; also the task name and part of topic names.
    pub name: String,
    pub host: String,
    #[serde(default = "default_port")]
    pub port: u16,
    pub user: String,
    pub password: Secret,
    /// Replication server id this worker announces; unique among the server's replicas.
    pub server_id: u32,
    /// `db.table` or `db.*` patterns to capture; empty captures every non-system table.
    #[serde(default)]
    pub tables: Vec<String>,
    /// Sharded tables to capture besides `tables`: every table whose database and name
    /// match a pattern's (regular expressions, each matched against a whole name).
    #[serde(default)]
    pub shards: Vec<sluice_model::pipeline::TablePattern>,
    /// TLS to the server; none: plain connections.
    #[serde(default)]
    pub tls: Option<sluice_model::TlsFiles>,
    /// Without `tls`, let the password go over a plain connection, readable or guessable
    /// by whoever answers at the address (see [`crate::auth`]); without either, the
    /// connection is refused before it opens.
    #[serde(default)]
    pub allow_plaintext: bool,
}

/// How a process reaches the sources the center keeps: its `source_tls`,
/// `source_plaintext_hosts` and `[source_secrets]` settings (a file source has its own).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Access {
    pub tls: Option<sluice_model::TlsFiles>,
    /// Hosts a password may go to without TLS (`*`: any).
    pub plaintext_hosts: Vec<String>,
    /// What a source's `password_ref` may name here.
    pub secrets: SecretRefs,
}

impl Access {
    /// Whether a password may go to `host` over a plain connection.
    pub fn plaintext_to(&self, host: &str) -> bool {
        self.plaintext_hosts
            .iter()
            .any(|h| h == "*" || h.eq_ignore_ascii_case(host))
    }

    /// Problems of `source_plaintext_hosts` and `[source_secrets]` (no I/O), by key.
    pub fn problems(&self) -> Vec<String> {
        let mut p: Vec<String> = (self.plaintext_hosts.iter().enumerate())
            .filter(|(_, h)| h.is_empty() || h.contains(['/', ' ', ',']))
            .map(|(i, h)| {
                format!("source_plaintext_hosts[{i}]: `{h}` is not a host name or address")
            })
            .collect();
        p.extend(self.secrets.problems("source_secrets"));
        p
    }
}

fn default_port() -> u16 {
    3306
}

impl SourceConfig {
    /// The connection settings of a source the center keeps, its password resolved from
    /// the reference in this process's environment, with this process's settings for
    /// reaching the center's sources (certificates are files of each process).
    pub fn from_spec(spec: &SourceSpec, access: &Access) -> Result<SourceConfig, String> {
        Ok(SourceConfig {
            name: spec.name.clone(),
            host: spec.host.clone(),
            port: spec.port,
            user: spec.user.clone(),
            password: spec.password(&access.secrets)?,
            server_id: spec.server_id,
            tables: spec.tables.clone(),
            shards: spec.shards.clone(),
            tls: access.tls.clone(),
            allow_plaintext: access.plaintext_to(&spec.host),
        })
    }

    /// Refuses, before it opens, a connection that would send the password where nothing
    /// checked who receives it ([`crate::auth`]).
    pub fn may_send_password(&self) -> Result<(), MysqlError> {
        let who = format!("source `{}` ({}:{})", self.name, self.host, self.port);
        let keys = "source_plaintext_hosts (a source the center keeps) or allow_plaintext (a [[sources]] entry)";
        match crate::auth::refusal(self.tls.is_some(), self.allow_plaintext, &who, keys) {
            Some(why) => Err(MysqlError::Preflight {
                source_name: self.name.clone(),
                problems: vec![why],
            }),
            None => Ok(()),
        }
    }

    /// A connection with `opts` (this source's, perhaps with more settings), once the
    /// password may be sent ([`SourceConfig::may_send_password`]).
    pub async fn connect_with(
        &self,
        opts: mysql_async::Opts,
    ) -> Result<mysql_async::Conn, MysqlError> {
        self.may_send_password()?;
        crate::auth::unwound(mysql_async::Conn::new(opts))
            .await
            .map_err(|error| MysqlError::Connect {
                source_name: self.name.clone(),
                error,
            })
    }

    /// A connection set up as the document readers' are ([`SourceConfig::reader_opts`]).
    pub async fn reader_conn(&self) -> Result<mysql_async::Conn, MysqlError> {
        self.connect_with(self.reader_opts()).await
    }

    pub fn opts(&self) -> mysql_async::Opts {
        mysql_async::OptsBuilder::default()
            .ip_or_hostname(self.host.clone())
            .tcp_port(self.port)
            .user(Some(self.user.clone()))
            .pass(Some(self.password.expose().to_owned()))
            .prefer_socket(false)
            .ssl_opts(self.tls.as_ref().map(crate::tls::ssl_opts))
            .into()
    }

    /// Connection settings for reading rows and documents: the session in UTC (so
    /// TIMESTAMP values read as the binlog decoder renders them) and REPEATABLE READ (a
    /// consistent snapshot needs it; a server defaulting to READ COMMITTED would ignore
    /// it), set once when the connection opens; pooled connections are not reset when
    /// returned (a reset would drop the prepared statements every read runs again).
    pub fn reader_opts(&self) -> mysql_async::Opts {
        mysql_async::OptsBuilder::from_opts(self.opts())
            .init(vec![
                "SET SESSION time_zone = '+00:00'",
                "SET SESSION TRANSACTION ISOLATION LEVEL REPEATABLE READ",
            ])
            .pool_opts(mysql_async::PoolOpts::default().with_reset_connection(false))
            .into()
    }

    pub fn filter(&self) -> TableFilter {
        TableFilter::new(&self.tables).with_shards(&self.shards)
    }
}

/// Which tables a task captures.
#[derive(Debug, Clone, Default)]
pub struct TableFilter {
    patterns: Vec<(String, Option<String>)>,
    /// Sharded tables, captured besides `patterns` when those are given.
    shards: Vec<TableMatcher>,
}

const SYSTEM_SCHEMAS: [&str; 4] = ["mysql", "information_schema", "performance_schema", "sys"];

impl TableFilter {
    pub fn new(patterns: &[String]) -> Self {
        let patterns = patterns
            .iter()
            .map(|p| match p.split_once('.') {
                Some((db, "*")) => (db.to_owned(), None),
                Some((db, table)) => (db.to_owned(), Some(table.to_owned())),
                None => (p.clone(), None),
            })
            .collect();
        Self {
            patterns,
            shards: Vec::new(),
        }
    }

    /// Captures the shards of `shards` too (a pattern that does not compile was refused
    /// where it was given: the center's check of the pipeline, the worker's of its file).
    pub fn with_shards(mut self, shards: &[TablePattern]) -> Self {
        self.shards = shards.iter().filter_map(|s| s.matcher().ok()).collect();
        self
    }

    fn nothing_named(&self) -> bool {
        self.patterns.is_empty() && self.shards.is_empty()
    }

    pub fn includes(&self, db: &str, table: &str) -> bool {
        if self.nothing_named() {
            return !SYSTEM_SCHEMAS.contains(&db);
        }
        self.patterns
            .iter()
            .any(|(d, t)| d == db && t.as_deref().is_none_or(|t| t == table))
            || self.shards.iter().any(|s| s.matches(db, table))
    }

    /// Whether a DDL statement run with `default_db` may concern a captured table: its
    /// default database holds captured tables (or it has none, as `CREATE DATABASE`),
    /// or a table whose rows it rewrites is captured. Statements that cannot are not
    /// published, so a schema topic carries its own source's DDL and not that of every
    /// database sharing the server.
    pub fn may_concern(&self, default_db: &str, sql: &str) -> bool {
        default_db.is_empty()
            || self.holds_database(default_db)
            || crate::ddl::rewrites(default_db, sql)
                .iter()
                .any(|r| self.includes(&r.db, &r.table))
    }

    fn holds_database(&self, db: &str) -> bool {
        if self.nothing_named() {
            return !SYSTEM_SCHEMAS.contains(&db);
        }
        self.patterns.iter().any(|(d, _)| d == db)
            || self.shards.iter().any(|s| s.matches_database(db))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn filter_patterns() {
        let f = TableFilter::new(&["shop.*".into(), "crm.people".into()]);
        assert!(f.includes("shop", "orders"));
        assert!(f.includes("crm", "people"));
        assert!(!f.includes("crm", "leads"));
        let all = TableFilter::new(&[]);
        assert!(all.includes("shop", "x") && !all.includes("mysql", "user"));
    }

    #[test]
    fn ddl_of_other_databases_is_not_theirs() {
        let f = TableFilter::new(&["shop.*".into(), "crm.people".into()]);
        assert!(f.may_concern("shop", "CREATE TABLE t (id INT PRIMARY KEY)"));
        assert!(f.may_concern("crm", "ALTER TABLE leads ADD KEY k (a)"));
        assert!(f.may_concern("", "CREATE DATABASE elsewhere"));
        assert!(!f.may_concern("other", "CREATE TABLE t (id INT PRIMARY KEY)"));
        assert!(f.may_concern("other", "TRUNCATE TABLE shop.orders"));
        assert!(f.may_concern("other", "RENAME TABLE x TO crm.people"));
        assert!(!f.may_concern("other", "DROP TABLE crm.leads"));
        assert!(!TableFilter::new(&[]).may_concern("mysql", "CREATE TABLE t (a INT)"));
    }

    #[test]
    fn sharded_tables_are_captured_by_their_patterns_now_and_once_created() {
        let shards = [TablePattern::new(r"db_\d+", r"orders_\d+")];
        let f = TableFilter::new(&["shop.*".into()]).with_shards(&shards);
        assert!(f.includes("shop", "x") && f.includes("db_1", "orders_99"));
        assert!(!f.includes("db_1", "orders_archive") && !f.includes("crm", "orders_1"));
        assert!(f.may_concern("db_7", "CREATE TABLE orders_08 LIKE orders_00"));
        let only = TableFilter::new(&[]).with_shards(&shards);
        assert!(
            !only.includes("shop", "x"),
            "shards alone capture only the shards"
        );
    }
}
