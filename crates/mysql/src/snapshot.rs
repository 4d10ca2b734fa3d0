//! What a build needs of a table besides its documents ([`crate::docs`] reads those):
//! its description, its primary-key chunks, and the consistent snapshot a batch is read
//! in, without locking writers.
//!
//! Each batch is read in its own `START TRANSACTION WITH CONSISTENT SNAPSHOT`, together
//! with where that snapshot stands in the binlog ([`Watermarks`]): a row read in that
//! batch holds every change logged before the low watermark, and its document version is
//! derived from it, so any change logged later — which the live stream carries with a
//! larger version — wins over it, and anything older loses. No lock is taken.
//!
//! Values come through the binary protocol and are turned into exactly the JSON the
//! binlog decoder produces for the same row (see [`crate::decode`]), with the same
//! column type names, so a document built from a snapshot equals one built from the
//! stream. Keys work for any primary key, composite and non-integer ones included: the
//! cursor is the key tuple as the server returned it, compared as a row value.

use std::sync::Arc;

use base64::Engine as _;
use mysql_async::prelude::*;
use mysql_async::{Conn, Params, Row, Value};
use serde::{Deserialize, Serialize};
use serde_json::Value as Json;
use sluice_model::pipeline::shard::topic_char;
use sluice_model::pipeline::SHARD_COLUMN;
use sluice_model::{BinlogPosition, ColumnInfo};

use crate::decode::{shared_value, Kind};
use crate::error::MysqlError;
use crate::preflight::query_err;
use crate::server::{Flavor, Server};
use crate::source::SourceConfig;

/// `(database, table)`.
pub type TableName = (String, String);

/// One column as the snapshot reads it.
#[derive(Debug, Clone)]
pub(crate) struct Column {
    pub(crate) name: String,
    pub(crate) kind: Kind,
    pub(crate) fsp: u8,
    /// `AUTO_INCREMENT`: each table counts on its own (shards' values repeat).
    pub(crate) auto_increment: bool,
}

/// A table described for snapshot reads.
#[derive(Debug, Clone)]
pub struct SnapshotTable {
    pub db: String,
    pub table: String,
    pub(crate) columns: Vec<Column>,
    /// Indexes into `columns` of the primary key, in key order.
    pub(crate) key: Vec<usize>,
    /// Column names and types as the change-event envelope carries them.
    pub infos: Arc<[ColumnInfo]>,
    /// A sharded table (`db` and `table` are then its patterns): the shards its rows are
    /// read from, and its last column is the virtual [`SHARD_COLUMN`] (`infos` does not
    /// hold it: change events do not carry it).
    pub shards: Option<Vec<(String, String)>>,
    /// A sharded table's shards' own columns (in `shards`' order), as their change events
    /// carry them: a shard may have columns the others do not have yet.
    shard_infos: Vec<Arc<[ColumnInfo]>>,
}

/// A primary-key tuple as the server returned it: the cursor of a chunk and its bounds.
/// Serializable so cursors can be persisted.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Key(pub Vec<KeyPart>);

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum KeyPart {
    Null,
    Int(i64),
    Uint(u64),
    Float(f64),
    /// Base64 of the bytes.
    Bytes(String),
    /// year, month, day, hour, minute, second, microsecond
    Date([u32; 7]),
    /// negative, days, hours, minutes, seconds, microseconds
    Time(bool, [u32; 5]),
}

impl KeyPart {
    pub(crate) fn from_value(v: &Value) -> KeyPart {
        match v {
            Value::NULL => KeyPart::Null,
            Value::Int(i) => KeyPart::Int(*i),
            Value::UInt(u) => KeyPart::Uint(*u),
            Value::Float(f) => KeyPart::Float(*f as f64),
            Value::Double(d) => KeyPart::Float(*d),
            Value::Bytes(b) => KeyPart::Bytes(base64::engine::general_purpose::STANDARD.encode(b)),
            Value::Date(y, mo, d, h, mi, s, us) => KeyPart::Date([
                *y as u32, *mo as u32, *d as u32, *h as u32, *mi as u32, *s as u32, *us,
            ]),
            Value::Time(neg, days, h, m, s, us) => {
                KeyPart::Time(*neg, [*days, *h as u32, *m as u32, *s as u32, *us])
            }
        }
    }

    /// The value as a document holds it: numbers and UTF-8 strings (`None` for other
    /// kinds, which a document does not hold as given).
    pub fn to_json(&self) -> Option<serde_json::Value> {
        match self {
            KeyPart::Int(i) => Some((*i).into()),
            KeyPart::Uint(u) => Some((*u).into()),
            KeyPart::Float(f) => serde_json::Number::from_f64(*f).map(Into::into),
            KeyPart::Bytes(b) => base64::engine::general_purpose::STANDARD
                .decode(b)
                .ok()
                .and_then(|b| String::from_utf8(b).ok())
                .map(Into::into),
            KeyPart::Null | KeyPart::Date(_) | KeyPart::Time(..) => None,
        }
    }

    pub(crate) fn to_value(&self) -> Value {
        match self {
            KeyPart::Null => Value::NULL,
            KeyPart::Int(i) => Value::Int(*i),
            KeyPart::Uint(u) => Value::UInt(*u),
            KeyPart::Float(f) => Value::Double(*f),
            KeyPart::Bytes(b) => Value::Bytes(
                base64::engine::general_purpose::STANDARD
                    .decode(b)
                    .unwrap_or_default(),
            ),
            KeyPart::Date([y, mo, d, h, mi, s, us]) => Value::Date(
                *y as u16, *mo as u8, *d as u8, *h as u8, *mi as u8, *s as u8, *us,
            ),
            KeyPart::Time(neg, [days, h, m, s, us]) => {
                Value::Time(*neg, *days, *h as u8, *m as u8, *s as u8, *us)
            }
        }
    }
}

pub(crate) fn quote(ident: &str) -> String {
    format!("`{}`", ident.replace('`', "``"))
}

impl SnapshotTable {
    /// Reads the table's columns and primary key from `information_schema`; a table read
    /// in chunks must have a primary key.
    pub async fn describe(
        src: &SourceConfig,
        conn: &mut Conn,
        db: &str,
        table: &str,
    ) -> Result<Self, MysqlError> {
        let problem = |why: String| MysqlError::Preflight {
            source_name: src.name.clone(),
            problems: vec![why],
        };
        let t = Self::describe_any(src, conn, db, table)
            .await?
            .ok_or_else(|| problem(format!("table {db}.{table} does not exist")))?;
        if t.key.is_empty() {
            return Err(problem(format!(
                "table {db}.{table} has no primary key: it cannot be snapshotted in chunks (add one)"
            )));
        }
        Ok(t)
    }

    /// As [`SnapshotTable::describe`], for any table: `None` when it does not exist; its
    /// key is empty when it has no primary key.
    pub async fn describe_any(
        src: &SourceConfig,
        conn: &mut Conn,
        db: &str,
        table: &str,
    ) -> Result<Option<Self>, MysqlError> {
        let rows: Vec<(String, String, String, Option<u32>, String)> = conn
            .exec(
                "SELECT COLUMN_NAME, DATA_TYPE, COLUMN_TYPE, DATETIME_PRECISION, EXTRA
                 FROM information_schema.COLUMNS WHERE TABLE_SCHEMA = ? AND TABLE_NAME = ?
                 ORDER BY ORDINAL_POSITION",
                (db, table),
            )
            .await
            .map_err(query_err(src, "describe the table"))?;
        if rows.is_empty() {
            return Ok(None);
        }
        let key_names: Vec<String> = conn
            .exec(
                "SELECT COLUMN_NAME FROM information_schema.STATISTICS
                 WHERE TABLE_SCHEMA = ? AND TABLE_NAME = ? AND INDEX_NAME = 'PRIMARY'
                 ORDER BY SEQ_IN_INDEX",
                (db, table),
            )
            .await
            .map_err(query_err(src, "read the primary key"))?;
        let counted: Vec<String> = (rows.iter())
            .filter(|r| r.4.to_ascii_lowercase().contains("auto_increment"))
            .map(|r| r.0.clone())
            .collect();
        let columns = rows
            .into_iter()
            .map(|(name, data_type, column_type, precision, _)| {
                (name, classify(&data_type, &column_type, precision))
            })
            .collect();
        let mut t = Self::from_parts(db, table, columns, &key_names);
        for c in t.columns.iter_mut() {
            c.auto_increment = counted.contains(&c.name);
        }
        Ok(Some(t))
    }

    /// A description from `information_schema` facts — each column's name, `DATA_TYPE`
    /// and `COLUMN_TYPE` — and the primary key's column names, without a server (tests,
    /// tools that know the tables).
    pub fn from_columns(
        db: &str,
        table: &str,
        columns: &[(&str, &str, &str)],
        key: &[&str],
    ) -> Self {
        let columns = columns
            .iter()
            .map(|(name, data_type, column_type)| {
                (name.to_string(), classify(data_type, column_type, None))
            })
            .collect();
        let key: Vec<String> = key.iter().map(|k| k.to_string()).collect();
        Self::from_parts(db, table, columns, &key)
    }

    /// A description from each column's name with its decoder kind, precision and
    /// envelope type name, and the primary key's column names.
    pub(crate) fn from_parts(
        db: &str,
        table: &str,
        columns: Vec<(String, (Kind, u8, String))>,
        key_names: &[String],
    ) -> Self {
        let mut cols = Vec::new();
        let mut infos = Vec::new();
        for (name, (kind, fsp, sql_type)) in columns {
            infos.push(ColumnInfo {
                name: name.clone(),
                sql_type,
                key: key_names.contains(&name),
            });
            cols.push(Column {
                name,
                kind,
                fsp,
                auto_increment: false,
            });
        }
        let key = key_names
            .iter()
            .filter_map(|k| cols.iter().position(|c| &c.name == k))
            .collect();
        Self {
            db: db.to_owned(),
            table: table.to_owned(),
            columns: cols,
            key,
            infos: infos.into(),
            shards: None,
            shard_infos: Vec::new(),
        }
    }

    /// The shards `described` (each a table as [`Self::describe_any`] found it, in name
    /// order) as one table named by the patterns `db` and `table`, whose rows are every
    /// shard's: the columns every shard has with the same type (a column added shard by
    /// shard joins once all have it), with the virtual [`SHARD_COLUMN`] last. Err: why the
    /// shards cannot be read as one (their primary keys differ, or one has a column of
    /// that name).
    pub(crate) fn sharded(
        db: &str,
        table: &str,
        described: Vec<SnapshotTable>,
    ) -> Result<Self, String> {
        let Some(first) = described.first() else {
            return Err(format!("no table matches `{db}`.`{table}`"));
        };
        if first.column(SHARD_COLUMN).is_some() {
            return Err(format!(
                "`{}.{}` has a column named `{SHARD_COLUMN}`, the name of a sharded table's virtual column",
                first.db, first.table
            ));
        }
        if let Some(s) =
            (described.iter()).find(|s| !s.db.chars().chain(s.table.chars()).all(topic_char))
        {
            return Err(format!(
                "shard `{}.{}`: a shard's names may hold only letters, digits, `.`, `_` and `-` (its change topic's name could not tell it apart)",
                s.db, s.table
            ));
        }
        if let Some(s) = described.iter().find(|s| s.key.is_empty()) {
            return Err(format!(
                "shard `{}.{}` has no primary key: each shard is read in chunks of its own (add one)",
                s.db, s.table
            ));
        }
        // By name: a column whose type is being changed shard by shard (a rolling
        // `MODIFY`) stays, read as the first shard has it.
        let common: Vec<usize> = (0..first.columns.len())
            .filter(|&i| {
                let name = &first.columns[i].name;
                (described[1..].iter()).all(|o| o.column(name).is_some())
            })
            .collect();
        for other in &described[1..] {
            if other.key_names() != first.key_names() {
                return Err(format!(
                    "the shards' primary keys differ: `{}.{}` has ({}), `{}.{}` has ({}); every shard needs the same primary key",
                    first.db, first.table, first.key_names().join(", "),
                    other.db, other.table, other.key_names().join(", ")
                ));
            }
        }
        let mut t = first.clone();
        t.db = db.to_owned();
        t.table = table.to_owned();
        t.columns = (common.iter())
            .map(|&i| {
                let mut c = first.columns[i].clone();
                // One shard counting its own rows is enough for ids to collide.
                c.auto_increment = described.iter().any(|s| s.counts(&c.name));
                c
            })
            .collect();
        t.infos = common.iter().map(|&i| first.infos[i].clone()).collect();
        t.key = (first.key.iter())
            .filter_map(|k| common.iter().position(|c| c == k))
            .collect();
        let (kind, fsp, _) = classify("varchar", "varchar(192)", None);
        t.columns.push(Column {
            name: SHARD_COLUMN.to_owned(),
            kind,
            fsp,
            auto_increment: false,
        });
        // Rows of different shards may share a primary key: with the shard, they do not.
        t.key.push(t.columns.len() - 1);
        t.shard_infos = described.iter().map(|s| s.infos.clone()).collect();
        t.shards = Some(described.into_iter().map(|s| (s.db, s.table)).collect());
        Ok(t)
    }

    /// One shard `(db, table)` of a sharded table, read alone (a build's chunks), still
    /// with its shard column.
    pub fn shard(&self, db: &str, table: &str) -> SnapshotTable {
        let mut t = self.clone();
        t.db = db.to_owned();
        t.table = table.to_owned();
        let at = (self.shards.iter().flatten()).position(|s| s.0 == db && s.1 == table);
        t.shard_infos = at
            .map(|i| self.shard_infos[i].clone())
            .into_iter()
            .collect();
        t.shards = Some(vec![(db.to_owned(), table.to_owned())]);
        // Within one shard its own primary key is unique.
        let virtual_column = t.columns.len() - 1;
        t.key.retain(|&k| k != virtual_column);
        t
    }

    /// What a build or a check cuts into primary-key chunks: each shard of a sharded
    /// table (with its name), or the table itself.
    pub fn parts(&self) -> Vec<(Option<(String, String)>, SnapshotTable)> {
        match &self.shards {
            Some(shards) => (shards.iter())
                .map(|(db, t)| (Some((db.clone(), t.clone())), self.shard(db, t)))
                .collect(),
            None => vec![(None, self.clone())],
        }
    }

    /// The tables its rows are read from: its shards, or itself.
    pub fn names(&self) -> Vec<(String, String)> {
        match &self.shards {
            Some(shards) => shards.clone(),
            None => vec![(self.db.clone(), self.table.clone())],
        }
    }

    /// Each table its rows are read from, with its own columns as its change events
    /// carry them (a shard's may be more than the sharded table's).
    pub fn sources(&self) -> Vec<(TableName, Arc<[ColumnInfo]>)> {
        match &self.shards {
            Some(shards) => shards
                .iter()
                .cloned()
                .zip(self.shard_infos.iter().cloned())
                .collect(),
            None => vec![((self.db.clone(), self.table.clone()), self.infos.clone())],
        }
    }

    /// Whether column `name` is `AUTO_INCREMENT`.
    pub(crate) fn counts(&self, name: &str) -> bool {
        self.columns
            .iter()
            .any(|c| c.name == name && c.auto_increment)
    }

    /// How many of its columns are stored (not the virtual shard column).
    pub(crate) fn stored_columns(&self) -> usize {
        self.columns.len() - usize::from(self.shards.is_some())
    }

    /// The index of column `name`.
    pub(crate) fn column(&self, name: &str) -> Option<usize> {
        self.columns.iter().position(|c| c.name == name)
    }

    /// The primary key's column names.
    pub fn key_names(&self) -> Vec<String> {
        self.key
            .iter()
            .map(|&i| self.columns[i].name.clone())
            .collect()
    }

    fn key_list(&self) -> String {
        self.key
            .iter()
            .map(|&i| quote(&self.columns[i].name))
            .collect::<Vec<_>>()
            .join(", ")
    }

    fn placeholders(&self) -> String {
        vec!["?"; self.key.len()].join(", ")
    }

    fn from(&self) -> String {
        format!("{}.{}", quote(&self.db), quote(&self.table))
    }

    /// About how many rows the table holds (the storage engine's estimate).
    pub async fn estimated_rows(
        &self,
        src: &SourceConfig,
        conn: &mut Conn,
    ) -> Result<u64, MysqlError> {
        let server = crate::preflight::server_of(conn, src).await?;
        for sql in server.reader_session() {
            conn.query_drop(*sql)
                .await
                .map_err(query_err(src, "read fresh table statistics"))?;
        }
        let n: Option<Option<u64>> = conn
            .exec_first(
                "SELECT TABLE_ROWS FROM information_schema.TABLES WHERE TABLE_SCHEMA = ? AND TABLE_NAME = ?",
                (&self.db, &self.table),
            )
            .await
            .map_err(query_err(src, "estimate the table size"))?;
        Ok(n.flatten().unwrap_or(0))
    }

    /// Keys that cut the table into chunks of about `rows` rows: chunk `i` holds the keys
    /// in `(bounds[i-1], bounds[i]]`, the first from the start, the last to the end.
    /// Each query walks `rows` entries of the primary key from the previous bound.
    pub async fn chunk_bounds(
        &self,
        src: &SourceConfig,
        conn: &mut Conn,
        rows: u64,
    ) -> Result<Vec<Key>, MysqlError> {
        let keys = self.key_list();
        let mut bounds: Vec<Key> = Vec::new();
        loop {
            let (sql, params) = match bounds.last() {
                None => (
                    format!(
                        "SELECT {keys} FROM {} ORDER BY {keys} LIMIT 1 OFFSET {}",
                        self.from(),
                        rows.max(1) - 1
                    ),
                    Params::Empty,
                ),
                Some(after) => (
                    format!(
                        "SELECT {keys} FROM {} WHERE ({keys}) > ({}) ORDER BY {keys} LIMIT 1 OFFSET {}",
                        self.from(),
                        self.placeholders(),
                        rows.max(1) - 1
                    ),
                    Params::Positional(after.0.iter().map(KeyPart::to_value).collect()),
                ),
            };
            let row: Option<Row> = conn
                .exec_first(sql, params)
                .await
                .map_err(query_err(src, "find chunk bounds"))?;
            match row {
                Some(row) => {
                    bounds.push(Key(row.unwrap().iter().map(KeyPart::from_value).collect()))
                }
                None => return Ok(bounds),
            }
        }
    }
}

/// Where a lock-free consistent snapshot stands in the binlog: every transaction logged
/// before `low` is visible in it, and none logged after `high` is. A document read in it
/// is therefore at least as new as `low`, which versions what is written from it (any
/// later change reaches the index through the stream with a higher version and wins),
/// and a judgment of it waits for `high` (README, "Snapshots without locks").
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Watermarks {
    pub low: BinlogPosition,
    pub high: BinlogPosition,
}

/// How snapshots learn their watermarks on MariaDB (`SNAPSHOT_POSITIONS`): by
/// default its exact snapshot position (`low` = `high`); `watermarks` reads them around
/// the snapshot as on MySQL, so that path is tested on MariaDB too.
fn mariadb_watermarks() -> bool {
    static WATERMARKS: std::sync::LazyLock<bool> = std::sync::LazyLock::new(|| {
        std::env::var("SNAPSHOT_POSITIONS").is_ok_and(|v| v.trim() == "watermarks")
    });
    *WATERMARKS
}

/// How long a snapshot waits for the transactions being committed to become visible.
const COMMITTING_WITHIN: u32 = 10;

/// Starts a consistent snapshot and returns its watermarks. End it with
/// [`end_snapshot`]. The connection must have been opened with
/// [`SourceConfig::reader_opts`].
///
/// MariaDB reports the binlog position a consistent snapshot sees
/// (`binlog_snapshot_file`/`position`): both watermarks are it. MySQL does not, so:
/// the binlog's end is read (`low`); a transaction logged before it may not be
/// committed yet — it then owns its GTID until its commit is visible — so the snapshot
/// waits until the GTIDs owned at that moment are executed (`gtid_owned`, then
/// `WAIT_FOR_EXECUTED_GTID_SET`; MySQL adds a GTID to `gtid_executed` only after the
/// storage engine committed it); then it starts, and the binlog's end is read again
/// (`high`): whatever the snapshot sees was logged before it.
pub(crate) async fn begin_snapshot(
    src: &SourceConfig,
    conn: &mut Conn,
    server: &Server,
) -> Result<Watermarks, MysqlError> {
    if server.flavor == Flavor::MariaDb && !mariadb_watermarks() {
        begin_read(src, conn).await?;
        return match mariadb_position(src, conn).await {
            Ok(p) => Ok(Watermarks {
                low: p.clone(),
                high: p,
            }),
            Err(e) => {
                let _ = end_snapshot(src, conn).await;
                Err(e)
            }
        };
    }
    let low = match server.flavor {
        Flavor::MySql => {
            let low = crate::preflight::binlog_end(conn, src, server).await?;
            wait_committing(src, conn).await?;
            low
        }
        Flavor::MariaDb => {
            // A snapshot's exact position: everything before it is visible to any
            // snapshot started later.
            begin_read(src, conn).await?;
            let p = mariadb_position(src, conn).await;
            end_snapshot(src, conn).await?;
            p?
        }
    };
    begin_read(src, conn).await?;
    match crate::preflight::binlog_end(conn, src, server).await {
        Ok(high) => Ok(Watermarks { low, high }),
        Err(e) => {
            let _ = end_snapshot(src, conn).await;
            Err(e)
        }
    }
}

/// Inside a consistent snapshot on MariaDB: the binlog position it sees.
pub(crate) async fn mariadb_position(
    src: &SourceConfig,
    conn: &mut Conn,
) -> Result<BinlogPosition, MysqlError> {
    let status: Vec<(String, String)> = conn
        .query("SHOW STATUS LIKE 'binlog_snapshot_%'")
        .await
        .map_err(query_err(src, "read the snapshot's binlog position"))?;
    let get = |name: &str| {
        status
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.clone())
    };
    match (get("binlog_snapshot_file"), get("binlog_snapshot_position")) {
        (Some(file), Some(pos)) if !file.is_empty() => Ok(BinlogPosition {
            file,
            pos: pos.parse().unwrap_or(0),
        }),
        _ => Err(MysqlError::Preflight {
            source_name: src.name.clone(),
            problems: vec![
                "the server does not report the binlog position of a consistent snapshot \
                 (binlog_snapshot_file/position): is binary logging on?"
                    .into(),
            ],
        }),
    }
}

/// Waits until the transactions that own a GTID now (logged or being logged, not yet
/// visible) are executed, so that a snapshot started afterwards sees every transaction
/// logged so far.
async fn wait_committing(src: &SourceConfig, conn: &mut Conn) -> Result<(), MysqlError> {
    let owned: String = conn
        .query_first("SELECT @@GLOBAL.gtid_owned")
        .await
        .map_err(query_err(src, "read the GTIDs being committed"))?
        .unwrap_or_default();
    let owned = owned_gtids(&owned);
    if owned.is_empty() {
        return Ok(());
    }
    let timed_out: Option<i64> = conn
        .exec_first(
            "SELECT WAIT_FOR_EXECUTED_GTID_SET(?, ?)",
            (&owned, COMMITTING_WITHIN),
        )
        .await
        .map_err(query_err(src, "wait for the transactions being committed"))?;
    if timed_out == Some(0) {
        Ok(())
    } else {
        Err(MysqlError::Wait {
            source_name: src.name.clone(),
            what: format!("transactions {owned} were not committed within {COMMITTING_WITHIN} s"),
        })
    }
}

/// `@@GLOBAL.gtid_owned` (`uuid:gno#thread, …`, thread ids after `#`) as a GTID set.
pub(crate) fn owned_gtids(owned: &str) -> String {
    let mut set = sluice_model::GtidSet::empty_mysql();
    for item in owned.split(',') {
        let mut parts = item.trim().split(':');
        let Some(uuid) = parts.next().filter(|u| u.len() == 36) else {
            continue;
        };
        for gno in parts {
            let gno = gno.split('#').next().unwrap_or_default().trim();
            if let Ok(n) = gno.parse::<u64>() {
                set.apply_mysql(uuid, n);
            }
        }
    }
    set.to_string()
}

/// Starts a read-only transaction with a consistent snapshot, on a connection opened
/// with [`SourceConfig::reader_opts`] (in UTC, REPEATABLE READ).
pub(crate) async fn begin_read(src: &SourceConfig, conn: &mut Conn) -> Result<(), MysqlError> {
    conn.query_drop("START TRANSACTION WITH CONSISTENT SNAPSHOT, READ ONLY")
        .await
        .map_err(query_err(src, "start a consistent snapshot"))
}

/// Ends the transaction [`begin_snapshot`] (or a read) started.
pub(crate) async fn end_snapshot(src: &SourceConfig, conn: &mut Conn) -> Result<(), MysqlError> {
    conn.query_drop("COMMIT")
        .await
        .map_err(query_err(src, "end the snapshot"))
}

/// The decoder's kind, precision and type name for an `information_schema` column.
fn classify(data_type: &str, column_type: &str, precision: Option<u32>) -> (Kind, u8, String) {
    let unsigned = column_type.contains("unsigned");
    let u = if unsigned { " unsigned" } else { "" };
    let fsp = precision.unwrap_or(0).min(6) as u8;
    let with_fsp = |name: &str| {
        if fsp == 0 {
            name.to_owned()
        } else {
            format!("{name}({fsp})")
        }
    };
    let inner = column_type
        .split_once('(')
        .and_then(|(_, rest)| rest.split_once(')'))
        .map(|(inner, _)| inner.to_owned())
        .unwrap_or_default();
    match data_type {
        "tinyint" | "smallint" | "mediumint" | "int" | "bigint" => {
            (Kind::Int, 0, format!("{data_type}{u}"))
        }
        "float" => (Kind::Float, 0, format!("float{u}")),
        "double" => (Kind::Double, 0, format!("double{u}")),
        "decimal" => (
            Kind::Decimal,
            0,
            format!("decimal({}){u}", inner.replace(' ', "")),
        ),
        "year" => (Kind::Year, 0, "year".into()),
        "date" => (Kind::Date, 0, "date".into()),
        "datetime" => (Kind::DateTime, fsp, with_fsp("datetime")),
        "timestamp" => (Kind::Timestamp, fsp, with_fsp("timestamp")),
        "time" => (Kind::Time, fsp, with_fsp("time")),
        "enum" => (Kind::Enum, 0, "enum".into()),
        "set" => (Kind::Set, 0, "set".into()),
        "bit" => (Kind::Bit, 0, format!("bit({inner})")),
        "json" => (Kind::Json, 0, "json".into()),
        "vector" => (Kind::Vector, 0, "vector".into()),
        "char" | "varchar" | "tinytext" | "text" | "mediumtext" | "longtext" => {
            (Kind::Text, 0, data_type.to_owned())
        }
        "binary" | "varbinary" | "tinyblob" | "blob" | "mediumblob" | "longblob" => {
            (Kind::Bytes, 0, data_type.to_owned())
        }
        other => (Kind::Bytes, 0, other.to_owned()),
    }
}

/// A binary-protocol value as the JSON the binlog decoder gives the same value.
pub(crate) fn value_to_json(col: &Column, value: Value) -> Result<Json, String> {
    if value == Value::NULL {
        return Ok(Json::Null);
    }
    let text = |b: Vec<u8>| String::from_utf8(b).map_err(|e| format!("not UTF-8: {e}"));
    match (col.kind, value) {
        // Labels and text come as text here (the binlog has ENUM/SET indexes and charsets).
        (Kind::Text | Kind::Enum, Value::Bytes(b)) => text(b).map(Json::String),
        (Kind::Json, Value::Bytes(b)) => {
            // MySQL's JSON type: the document; MariaDB's JSON is LONGTEXT (Kind::Text).
            let t = text(b)?;
            serde_json::from_str(&t).map_err(|e| format!("invalid JSON document: {e}"))
        }
        (Kind::Set, Value::Bytes(b)) => {
            let t = text(b)?;
            Ok(Json::Array(
                t.split(',')
                    .filter(|s| !s.is_empty())
                    .map(|s| Json::String(s.to_owned()))
                    .collect(),
            ))
        }
        // The session time zone is UTC, so a TIMESTAMP reads as UTC.
        (kind, v) => shared_value(kind, col.fsp, v),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn owned_gtids_drop_their_threads() {
        let u = "3e11fa47-71ca-11e1-9e33-c80aa9429562";
        let w = "4e11fa47-71ca-11e1-9e33-c80aa9429562";
        assert_eq!(owned_gtids(""), "");
        assert_eq!(owned_gtids(&format!("{u}:7#12")), format!("{u}:7"));
        assert_eq!(
            owned_gtids(&format!("{u}:7#12, {u}:8#13,\n{w}:2#9")),
            format!("{u}:7-8,{w}:2")
        );
        assert_eq!(owned_gtids(&format!("{u}:3#1:5#2")), format!("{u}:3:5"));
    }
}
