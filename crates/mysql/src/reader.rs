//! The binlog reader: streams a server's binlog from a start position and yields row
//! changes, DDL statements and transaction commits, each with its coordinates.
//!
//! Positions: `CommitPoint::position` is the end of a committed transaction — the only
//! place a stream may resume from without splitting a transaction. Row changes carry the
//! start offset of their rows event plus their index in it (the version's raw material).

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use mysql_async::binlog::events::{
    BinlogEventHeader, Event, EventData, QueryEvent, RotateEvent, RowsEventData, TableMapEvent,
};
use mysql_async::prelude::*;
use mysql_async::{BinlogStream, BinlogStreamRequest, Conn};
use serde_json::{Map, Value};
use sluice_model::position::MariaDbGtid;
use sluice_model::{BinlogPosition, GtidSet, Op};

use crate::decode::{RowValues, TableSchema};
use crate::error::{At, MysqlError};
use crate::preflight::{connect, query_err};
use crate::server::{Flavor, Server};
use crate::source::{SourceConfig, TableFilter};

// MariaDB's own event types (sent once the replica announces capability 4).
const MARIADB_ANNOTATE_ROWS: u8 = 160;
const MARIADB_BINLOG_CHECKPOINT: u8 = 161;
const MARIADB_GTID: u8 = 162;
const MARIADB_GTID_LIST: u8 = 163;
const MARIADB_GTID_FLAG_STANDALONE: u8 = 1;

const CHECKSUM_LEN: usize = 4;

/// Whether an event read before the stream's FORMAT_DESCRIPTION (an artificial ROTATE)
/// ends in a CRC32 of itself. MariaDB, and MySQL's dump by file and position, append one;
/// MySQL 9.7's dump by GTID set does not: the last four bytes are then part of the file
/// name, and stripping them named `binlog.000002` `binlog.00` (file number 0 in every
/// version that followed).
fn checksummed(header: &mysql_common::binlog::events::BinlogEventHeader, data: &[u8]) -> bool {
    let Some(split) = data.len().checked_sub(CHECKSUM_LEN) else {
        return false;
    };
    let (body, sum) = data.split_at(split);
    let mut crc = crc32fast::Hasher::new();
    crc.update(&header.timestamp().to_le_bytes());
    crc.update(&[header.event_type_raw()]);
    crc.update(&header.server_id().to_le_bytes());
    crc.update(&header.event_size().to_le_bytes());
    crc.update(&header.log_pos().to_le_bytes());
    crc.update(&header.flags_raw().to_le_bytes());
    crc.update(body);
    crc.finalize().to_le_bytes() == sum
}

/// How often an idle server sends a heartbeat; silence for much longer means the
/// connection is dead even if TCP has not noticed.
pub const HEARTBEAT: Duration = Duration::from_secs(5);

/// Where to start streaming.
#[derive(Debug, Clone)]
pub enum StartAt {
    /// A file/offset on this server.
    Position(BinlogPosition),
    /// A GTID state; `position` is where that state was reached on this server (used to
    /// name the first file until the server's rotate event arrives).
    Gtid {
        gtid: GtidSet,
        position: BinlogPosition,
    },
}

/// One decoded row change.
#[derive(Debug, Clone)]
pub struct RowChange {
    pub schema: Arc<TableSchema>,
    pub op: Op,
    pub key: Map<String, Value>,
    /// The row before and after the change, one value per column of `schema`.
    pub before: Option<RowValues>,
    pub after: Option<RowValues>,
    pub file: Arc<str>,
    /// Start offset of the rows event (for compressed MySQL transactions: of the payload
    /// event, with `row` counting every row in the payload).
    pub pos: u64,
    pub row: u32,
    pub server_id: u32,
    pub ts_ms: u64,
    pub gtid: Option<String>,
}

/// A DDL statement.
#[derive(Debug, Clone)]
pub struct Ddl {
    pub db: String,
    pub query: String,
    pub file: Arc<str>,
    pub pos: u64,
    pub server_id: u32,
    pub ts_ms: u64,
    pub gtid: Option<String>,
}

/// The end of a committed transaction: a position that may be confirmed once every
/// event before it is safely published.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CommitPoint {
    pub position: BinlogPosition,
    pub gtid: Option<GtidSet>,
    pub ts_ms: u64,
}

/// Rows of a captured table that could not be decoded: dead-lettered with the reason by
/// the worker, so the stream goes on and the position never skips them silently.
#[derive(Debug, Clone)]
pub struct Unreadable {
    pub db: String,
    pub table: String,
    pub file: Arc<str>,
    pub pos: u64,
    pub server_id: u32,
    pub ts_ms: u64,
    pub reason: String,
}

#[derive(Debug, Clone)]
pub enum SourceEvent {
    Row(RowChange),
    Ddl(Ddl),
    Unreadable(Unreadable),
    Commit(CommitPoint),
}

/// What the reader knows of a table id from its last TABLE_MAP.
enum TableState {
    Skipped,
    Schema(Arc<TableSchema>),
    Broken {
        db: String,
        table: String,
        reason: String,
    },
}

enum PendingGtid {
    MariaDb(MariaDbGtid),
    MySql(String, u64),
}

impl PendingGtid {
    fn text(&self) -> String {
        match self {
            PendingGtid::MariaDb(g) => format!("{}-{}-{}", g.domain, g.server, g.seq),
            PendingGtid::MySql(uuid, gno) => format!("{uuid}:{gno}"),
        }
    }
}

/// Bookkeeping for a MySQL compressed transaction (TRANSACTION_PAYLOAD).
struct Payload {
    start: u64,
    end: u64,
    rows: u32,
}

/// Where an event sits: its start offset and end position (for an event inside a
/// compressed transaction: the payload event's), and whether it is inside one.
struct Span {
    start: u64,
    end: u64,
    inside_payload: bool,
}

pub struct BinlogReader {
    name: String,
    stream: BinlogStream,
    filter: TableFilter,
    file: Arc<str>,
    next_pos: u64,
    gtid_set: Option<GtidSet>,
    pending_gtid: Option<PendingGtid>,
    in_trx: bool,
    payload: Option<Payload>,
    /// mysql_common strips events' checksums once it has seen a FORMAT_DESCRIPTION; an
    /// artificial ROTATE sent before it may still have one ([`checksummed`]).
    seen_format_description: bool,
    /// Per table id: the TABLE_MAP last seen and what it means. A TABLE_MAP precedes
    /// every transaction's rows; the schema is rebuilt only when the map changed.
    tables: HashMap<u64, (TableMapEvent<'static>, TableState)>,
    queue: VecDeque<SourceEvent>,
}

impl BinlogReader {
    /// Connects as a replica and requests the binlog from `at`.
    pub async fn start(
        cfg: &SourceConfig,
        server: &Server,
        at: StartAt,
    ) -> Result<Self, MysqlError> {
        let mut conn = connect(cfg).await?;
        prepare_replica(&mut conn, cfg, server).await?;
        let (file, pos, gtid_set) = match &at {
            StartAt::Position(p) => (p.file.clone(), p.pos, None),
            StartAt::Gtid { gtid, position } => {
                (position.file.clone(), position.pos, Some(gtid.clone()))
            }
        };
        let stream = request_stream(conn, cfg, server.flavor, &at, &file, pos).await?;
        Ok(Self {
            name: cfg.name.clone(),
            stream,
            filter: cfg.filter(),
            file: file.into(),
            next_pos: pos,
            gtid_set,
            pending_gtid: None,
            in_trx: false,
            payload: None,
            seen_format_description: false,
            tables: HashMap::new(),
            queue: VecDeque::new(),
        })
    }

    /// The position after the last event read.
    pub fn position(&self) -> BinlogPosition {
        BinlogPosition::new(&*self.file, self.next_pos)
    }

    /// The next event, `Ok(None)` when the server ended the stream. Waits for the server;
    /// fails when it stays silent for several heartbeat periods.
    pub async fn next(&mut self) -> Result<Option<SourceEvent>, MysqlError> {
        loop {
            if let Some(ev) = self.queue.pop_front() {
                return Ok(Some(ev));
            }
            let event = match tokio::time::timeout(HEARTBEAT * 4, self.stream.next()).await {
                Err(_) => {
                    return Err(MysqlError::Stream {
                        source_name: self.name.clone(),
                        at: self.at(None),
                        error: mysql_async::Error::Io(mysql_async::IoError::Io(
                            std::io::Error::new(
                                std::io::ErrorKind::TimedOut,
                                format!("no event or heartbeat for {:?}", HEARTBEAT * 4),
                            ),
                        )),
                    })
                }
                Ok(None) => return Ok(None),
                Ok(Some(Err(error))) => {
                    return Err(MysqlError::Stream {
                        source_name: self.name.clone(),
                        at: self.at(None),
                        error,
                    })
                }
                Ok(Some(Ok(event))) => event,
            };
            self.handle(event)?;
        }
    }

    fn at(&self, table: Option<String>) -> Box<At> {
        Box::new(At {
            position: Some(self.position()),
            table,
        })
    }

    fn decode_err(&self, table: Option<String>, detail: impl Into<String>) -> MysqlError {
        MysqlError::Decode {
            source_name: self.name.clone(),
            at: self.at(table),
            detail: detail.into(),
        }
    }

    /// Handles one event from the stream: updates the state and queues what it yields.
    fn handle(&mut self, event: Event) -> Result<(), MysqlError> {
        let header = event.header();
        let log_pos = header.log_pos() as u64;
        let span = self.span(&header);
        let advance = match header.event_type_raw() {
            MARIADB_GTID => {
                self.mariadb_gtid(event.data(), header.server_id())?;
                true
            }
            MARIADB_ANNOTATE_ROWS | MARIADB_BINLOG_CHECKPOINT | MARIADB_GTID_LIST => true,
            ty => self.handle_decoded(&event, ty, &span)?,
        };
        if advance && log_pos != 0 && !span.inside_payload {
            self.next_pos = log_pos;
        }
        Ok(())
    }

    /// Where the event of `header` sits in the binlog.
    fn span(&self, header: &BinlogEventHeader) -> Span {
        let log_pos = header.log_pos() as u64;
        let size = header.event_size() as u64;
        let inside_payload = self.payload.is_some() && log_pos == 0;
        let start = if inside_payload {
            self.payload
                .as_ref()
                .map(|p| p.start)
                .unwrap_or(self.next_pos)
        } else if log_pos >= size {
            log_pos - size
        } else {
            self.next_pos
        };
        let end = if inside_payload {
            self.payload
                .as_ref()
                .map(|p| p.end)
                .unwrap_or(self.next_pos)
        } else {
            log_pos
        };
        Span {
            start,
            end,
            inside_payload,
        }
    }

    /// A MariaDB GTID event: the GTID of the transaction (or statement) that follows.
    fn mariadb_gtid(&mut self, body: &[u8], server_id: u32) -> Result<(), MysqlError> {
        if body.len() < 13 {
            return Err(self.decode_err(None, "short MariaDB GTID event"));
        }
        let seq = u64::from_le_bytes(body[0..8].try_into().expect("8 bytes"));
        let domain = u32::from_le_bytes(body[8..12].try_into().expect("4 bytes"));
        let flags = body[12];
        self.pending_gtid = Some(PendingGtid::MariaDb(MariaDbGtid {
            domain,
            server: server_id,
            seq,
        }));
        self.in_trx = flags & MARIADB_GTID_FLAG_STANDALONE == 0;
        Ok(())
    }

    /// An event mysql_common decodes, by kind; returns whether the position moves past it.
    fn handle_decoded(&mut self, event: &Event, ty: u8, span: &Span) -> Result<bool, MysqlError> {
        let header = event.header();
        let server_id = header.server_id();
        let ts_ms = header.timestamp() as u64 * 1000;
        let data = event
            .read_data()
            .map_err(|e| self.decode_err(None, format!("event type {ty}: {e}")))?;
        match data {
            Some(EventData::RotateEvent(r)) => {
                self.rotate(event, &r);
                return Ok(false);
            }
            Some(EventData::HeartbeatEvent) => return Ok(false),
            Some(EventData::FormatDescriptionEvent(_)) => self.seen_format_description = true,
            Some(EventData::GtidEvent(g)) => {
                self.pending_gtid = Some(PendingGtid::MySql(uuid_text(&g.sid()), g.gno()));
            }
            Some(EventData::TransactionPayloadEvent(_)) => {
                self.payload = Some(Payload {
                    start: span.start,
                    end: header.log_pos() as u64,
                    rows: 0,
                });
            }
            Some(EventData::QueryEvent(q)) => self.query(&q, span, server_id, ts_ms),
            Some(EventData::TableMapEvent(tme)) => self.table_map(tme),
            Some(EventData::RowsEvent(rows)) => self.rows(&rows, span.start, server_id, ts_ms)?,
            Some(EventData::XidEvent(_)) => self.commit(span.end, ts_ms),
            _ => {}
        }
        Ok(true)
    }

    /// A ROTATE event: the stream goes on in the file it names, at its position.
    fn rotate(&mut self, event: &Event, r: &RotateEvent<'_>) {
        let mut name = r.name_raw();
        if !self.seen_format_description && checksummed(&event.header(), event.data()) {
            name = &name[..name.len().saturating_sub(CHECKSUM_LEN)];
        }
        self.file = String::from_utf8_lossy(name).as_ref().into();
        self.next_pos = r.position();
    }

    /// A QUERY event: BEGIN, COMMIT/ROLLBACK, or DDL (queued when it may concern a table).
    fn query(&mut self, q: &QueryEvent<'_>, span: &Span, server_id: u32, ts_ms: u64) {
        let sql = q.query();
        let word = sql
            .split_whitespace()
            .next()
            .unwrap_or("")
            .to_ascii_uppercase();
        match word.as_str() {
            "BEGIN" => self.in_trx = true,
            "COMMIT" | "ROLLBACK" => self.commit(span.end, ts_ms),
            "XA" | "SAVEPOINT" => {}
            _ => {
                let db = q.schema();
                if self.filter.may_concern(&db, &sql) {
                    self.queue.push_back(SourceEvent::Ddl(Ddl {
                        db: db.into_owned(),
                        query: sql.into_owned(),
                        file: self.file.clone(),
                        pos: span.start,
                        server_id,
                        ts_ms,
                        gtid: self.pending_gtid.as_ref().map(PendingGtid::text),
                    }));
                }
                if !self.in_trx {
                    self.commit(span.end, ts_ms);
                }
            }
        }
    }

    /// A TABLE_MAP event: the table id's schema, rebuilt only when the map changed.
    fn table_map(&mut self, tme: TableMapEvent<'_>) {
        let id = tme.table_id();
        if self.tables.get(&id).is_none_or(|(seen, _)| *seen != tme) {
            let state = self.table_state(&tme);
            self.tables.insert(id, (tme.into_owned(), state));
        }
        // A crash here: the rows event of this table map is not read yet.
        sluice_model::failpoint("reader.after_table_map");
    }

    fn rows(
        &mut self,
        rows: &RowsEventData<'_>,
        start: u64,
        server_id: u32,
        ts_ms: u64,
    ) -> Result<(), MysqlError> {
        let id = rows.table_id();
        let schema = match self.tables.get(&id).map(|(_, state)| state) {
            Some(TableState::Schema(schema)) => schema.clone(),
            Some(TableState::Skipped) => return Ok(()),
            Some(TableState::Broken { db, table, reason }) => {
                let (db, table, reason) = (db.clone(), table.clone(), reason.clone());
                self.unreadable(db, table, start, server_id, ts_ms, reason);
                return Ok(());
            }
            None => {
                return Err(self.decode_err(
                    None,
                    format!("rows event for unknown table id {id} (no TABLE_MAP)"),
                ))
            }
        };
        let op = match rows {
            RowsEventData::WriteRowsEventV1(_) | RowsEventData::WriteRowsEvent(_) => Op::Create,
            RowsEventData::DeleteRowsEventV1(_) | RowsEventData::DeleteRowsEvent(_) => Op::Delete,
            _ => Op::Update,
        };
        let gtid = self.pending_gtid.as_ref().map(PendingGtid::text);
        let (decoded, failure) = decode_rows(&schema, rows);
        if let Some(reason) = failure {
            // The whole event is dead-lettered: its rows cannot be split reliably once one
            // of them fails to parse.
            self.unreadable(
                schema.db.clone(),
                schema.table.clone(),
                start,
                server_id,
                ts_ms,
                reason,
            );
            return Ok(());
        }
        let (pos, first_row) = match &mut self.payload {
            Some(p) => {
                let first = p.rows;
                p.rows += decoded.len() as u32;
                (p.start, first)
            }
            None => (start, 0),
        };
        for (i, (key, before, after)) in decoded.into_iter().enumerate() {
            self.queue.push_back(SourceEvent::Row(RowChange {
                schema: schema.clone(),
                op,
                key,
                before,
                after,
                file: self.file.clone(),
                pos,
                row: first_row + i as u32,
                server_id,
                ts_ms,
                gtid: gtid.clone(),
            }));
        }
        Ok(())
    }

    fn table_state(&self, tme: &TableMapEvent<'_>) -> TableState {
        if !self
            .filter
            .includes(&tme.database_name(), &tme.table_name())
        {
            return TableState::Skipped;
        }
        match TableSchema::from_table_map(tme) {
            Ok(schema) => TableState::Schema(Arc::new(schema)),
            Err(reason) => TableState::Broken {
                db: tme.database_name().into_owned(),
                table: tme.table_name().into_owned(),
                reason,
            },
        }
    }

    fn unreadable(
        &mut self,
        db: String,
        table: String,
        pos: u64,
        server_id: u32,
        ts_ms: u64,
        reason: String,
    ) {
        tracing::error!(source = %self.name, %db, %table, file = %self.file, pos, %reason, "undecodable rows event: dead-lettering it");
        self.queue.push_back(SourceEvent::Unreadable(Unreadable {
            db,
            table,
            file: self.file.clone(),
            pos,
            server_id,
            ts_ms,
            reason,
        }));
    }

    fn commit(&mut self, end: u64, ts_ms: u64) {
        match self.pending_gtid.take() {
            Some(PendingGtid::MariaDb(g)) => self
                .gtid_set
                .get_or_insert_with(GtidSet::empty_mariadb)
                .apply_mariadb(g),
            Some(PendingGtid::MySql(uuid, gno)) => self
                .gtid_set
                .get_or_insert_with(GtidSet::empty_mysql)
                .apply_mysql(&uuid, gno),
            None => {}
        }
        self.in_trx = false;
        self.payload = None;
        self.queue.push_back(SourceEvent::Commit(CommitPoint {
            position: BinlogPosition::new(&*self.file, end),
            gtid: self.gtid_set.clone(),
            ts_ms,
        }));
    }

    pub async fn close(self) {
        let _ = self.stream.close().await;
    }
}

/// Sets the heartbeat period on `conn` and announces the replica's capabilities.
async fn prepare_replica(
    conn: &mut Conn,
    cfg: &SourceConfig,
    server: &Server,
) -> Result<(), MysqlError> {
    conn.query_drop(server.heartbeat(HEARTBEAT))
        .await
        .map_err(query_err(cfg, "set heartbeat period"))?;
    if let Some(announce) = server.replica_announcement() {
        conn.query_drop(announce)
            .await
            .map_err(query_err(cfg, "announce the replica's capability"))?;
    }
    Ok(())
}

/// Requests the binlog by `at`'s GTID set when of the server's flavor, else at `file`/`pos`.
async fn request_stream(
    mut conn: Conn,
    cfg: &SourceConfig,
    flavor: Flavor,
    at: &StartAt,
    file: &str,
    pos: u64,
) -> Result<BinlogStream, MysqlError> {
    let stream = match (at, flavor) {
        (
            StartAt::Gtid {
                gtid: gtid @ GtidSet::MariaDb(_),
                ..
            },
            Flavor::MariaDb,
        ) => {
            set_mariadb_connect_state(&mut conn, cfg, gtid).await?;
            conn.get_binlog_stream(BinlogStreamRequest::new(cfg.server_id))
                .await
        }
        (
            StartAt::Gtid {
                gtid: GtidSet::MySql(m),
                ..
            },
            Flavor::MySql,
        ) => {
            let sids = mysql_sids(m).map_err(|detail| MysqlError::Decode {
                source_name: cfg.name.clone(),
                at: Box::default(),
                detail,
            })?;
            conn.get_binlog_stream(
                BinlogStreamRequest::new(cfg.server_id)
                    .with_gtid()
                    .with_gtid_set(sids),
            )
            .await
        }
        _ => {
            conn.get_binlog_stream(
                BinlogStreamRequest::new(cfg.server_id)
                    .with_filename(file.as_bytes())
                    .with_pos(pos),
            )
            .await
        }
    };
    stream.map_err(|error| MysqlError::Stream {
        source_name: cfg.name.clone(),
        at: Box::new(At {
            position: Some(BinlogPosition::new(file, pos)),
            table: None,
        }),
        error,
    })
}

/// Tells a MariaDB server to stream from the GTID state `gtid`, strictly.
async fn set_mariadb_connect_state(
    conn: &mut Conn,
    cfg: &SourceConfig,
    gtid: &GtidSet,
) -> Result<(), MysqlError> {
    conn.query_drop(format!("SET @slave_connect_state = '{gtid}'"))
        .await
        .map_err(query_err(cfg, "set slave_connect_state"))?;
    conn.query_drop("SET @slave_gtid_strict_mode = 1")
        .await
        .map_err(query_err(cfg, "set slave_gtid_strict_mode"))?;
    conn.query_drop("SET @slave_gtid_ignore_duplicates = 0")
        .await
        .map_err(query_err(cfg, "set slave_gtid_ignore_duplicates"))?;
    Ok(())
}

fn uuid_text(sid: &[u8; 16]) -> String {
    let h: String = sid.iter().map(|b| format!("{b:02x}")).collect();
    format!(
        "{}-{}-{}-{}-{}",
        &h[0..8],
        &h[8..12],
        &h[12..16],
        &h[16..20],
        &h[20..32]
    )
}

fn mysql_sids(
    set: &std::collections::BTreeMap<String, Vec<(u64, u64)>>,
) -> Result<Vec<mysql_async::Sid<'static>>, String> {
    set.iter()
        .map(|(uuid, ivs)| {
            let hex: String = uuid.chars().filter(|c| *c != '-').collect();
            if hex.len() != 32 {
                return Err(format!("bad server uuid {uuid}"));
            }
            let mut bytes = [0u8; 16];
            for (i, b) in bytes.iter_mut().enumerate() {
                *b = u8::from_str_radix(&hex[2 * i..2 * i + 2], 16)
                    .map_err(|_| format!("bad server uuid {uuid}"))?;
            }
            let intervals = ivs
                .iter()
                .map(|&(a, b)| mysql_async::GnoInterval::new(a, b + 1))
                .collect();
            Ok(mysql_async::Sid::new(bytes).with_intervals(intervals))
        })
        .collect()
}

/// A row change decoded: its key, and its images before and after.
type Decoded = (Map<String, Value>, Option<RowValues>, Option<RowValues>);

/// Decodes every row of a rows event, stopping at the first that cannot be: what was
/// decoded, and why the rest could not be.
fn decode_rows(schema: &TableSchema, rows: &RowsEventData<'_>) -> (Vec<Decoded>, Option<String>) {
    let shared_after = matches!(rows, RowsEventData::PartialUpdateRowsEvent(_));
    let (before_cols, after_cols) = (rows.columns_before_image(), rows.columns_after_image());
    let mut data = rows.rows_data();
    let mut decoded = Vec::new();
    if rows.num_columns() as usize != schema.columns.len() {
        let why = format!(
            "rows event has {} columns, its TABLE_MAP {}",
            rows.num_columns(),
            schema.columns.len()
        );
        return (decoded, Some(why));
    }
    while !data.is_empty() {
        let mut image = |cols: Option<&bitvec::slice::BitSlice<u8>>, shared| {
            cols.map(|c| schema.decode_image(c, shared, &mut data))
                .transpose()
        };
        let row = image(before_cols, false).and_then(|b| Ok((b, image(after_cols, shared_after)?)));
        match row {
            Ok((before, after)) => {
                let key = after
                    .as_deref()
                    .or(before.as_deref())
                    .map(|r| schema.key_of(r))
                    .unwrap_or_default();
                decoded.push((key, before, after));
            }
            Err(detail) => {
                let why = format!("row {}: {detail}", decoded.len());
                return (decoded, Some(why));
            }
        }
    }
    (decoded, None)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uuid_formatting() {
        let sid = [
            0x3e, 0x11, 0xfa, 0x47, 0x71, 0xca, 0x11, 0xe1, 0x9e, 0x33, 0xc8, 0x0a, 0xa9, 0x42,
            0x95, 0x62,
        ];
        assert_eq!(uuid_text(&sid), "3e11fa47-71ca-11e1-9e33-c80aa9429562");
    }

    #[test]
    fn an_artificial_rotate_keeps_its_name_with_or_without_a_checksum() {
        use mysql_common::binlog::consts::{EventFlags, EventType};
        use mysql_common::binlog::events::BinlogEventHeader;
        let name = b"binlog.000002";
        let mut body = 4u64.to_le_bytes().to_vec();
        body.extend_from_slice(name);
        let header = |len: usize| {
            BinlogEventHeader::new(
                0,
                EventType::ROTATE_EVENT,
                2,
                (BinlogEventHeader::LEN + len) as u32,
                0,
                EventFlags::LOG_EVENT_ARTIFICIAL_F,
            )
        };
        // Without a checksum (MySQL's dump by GTID set): the name is whole.
        assert!(!checksummed(&header(body.len()), &body));
        // With one, as the server computes it over the header and the body.
        let h = header(body.len() + CHECKSUM_LEN);
        let mut raw = Vec::new();
        raw.extend_from_slice(&h.timestamp().to_le_bytes());
        raw.push(h.event_type_raw());
        raw.extend_from_slice(&h.server_id().to_le_bytes());
        raw.extend_from_slice(&h.event_size().to_le_bytes());
        raw.extend_from_slice(&h.log_pos().to_le_bytes());
        raw.extend_from_slice(&h.flags_raw().to_le_bytes());
        raw.extend_from_slice(&body);
        let mut with = body.clone();
        with.extend_from_slice(&crc32fast::hash(&raw).to_le_bytes());
        assert!(checksummed(&h, &with));
        // A name whose last four bytes happen not to be its checksum stays whole.
        assert!(!checksummed(&h, &body));
    }
}
