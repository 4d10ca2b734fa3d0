//! Running a document read: the root rows, then one query per relation for all of their
//! rows at once (in bounded `IN` lists), assembled into documents; and the walk up from
//! changed rows to the documents that contain them.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;

use base64::Engine as _;
use mysql_async::prelude::*;
use mysql_async::{Conn, Params, Row, Value};
use serde_json::{Map, Value as Json};
use sluice_model::RelationKind;

use super::{join_key, sql, DocPlan, Node};
use crate::decode::Kind;
use crate::error::MysqlError;
use crate::preflight::query_err;
use crate::server::{Flavor, Server};
use crate::snapshot::{value_to_json, Key, KeyPart, Watermarks};
use crate::source::SourceConfig;

/// The newest changes a document read must see: the highest version among them, and
/// their GTIDs (MySQL; empty elsewhere).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Floor {
    pub version: u64,
    pub gtids: sluice_model::GtidSet,
}

impl Default for Floor {
    fn default() -> Self {
        Floor {
            version: 0,
            gtids: sluice_model::GtidSet::empty_mysql(),
        }
    }
}

impl Floor {
    /// Takes in a change of `version` with GTID `gtid` (`uuid:gno` on MySQL).
    pub fn add(&mut self, version: u64, gtid: Option<&str>) {
        self.version = self.version.max(version);
        if let Some((uuid, gno)) = gtid.and_then(|g| g.split_once(':')) {
            if let Ok(n) = gno.parse() {
                self.gtids.apply_mysql(uuid, n);
            }
        }
    }

    /// Takes in every change of `other`.
    pub fn merge(&mut self, other: &Floor) {
        self.version = self.version.max(other.version);
        self.gtids.union(&other.gtids);
    }
}

/// One document as read.
#[derive(Debug, Clone, PartialEq)]
pub struct Built {
    /// Its id values, in id order.
    pub key: Vec<Json>,
    /// Its `_id`.
    pub id: String,
    /// A child document's routing: its parent's `_id`.
    pub routing: Option<String>,
    /// `None`: no such row, or the filter hides it — the document is to be deleted.
    pub doc: Option<Map<String, Json>>,
}

/// A range of a build: the documents, and where the next read starts.
#[derive(Debug)]
pub struct RangeRead {
    pub docs: Vec<Built>,
    /// The primary key of the last root row read; `None` when none was.
    pub last: Option<Key>,
    /// Root rows read (documents, and rows without a usable id).
    pub rows: usize,
}

/// A connection reading documents of one source, counting its queries.
pub struct Reader<'a> {
    pub src: &'a SourceConfig,
    conn: Conn,
    /// The server, once asked.
    server: Option<Server>,
    /// Statements run so far.
    pub queries: u64,
    /// Rows those statements returned.
    pub rows: u64,
    /// While a document is explained: the rows each table gave it.
    trace: Option<Vec<TracedRows>>,
}

/// The rows one table of the tree gave the documents read (see [`DocPlan::explain`]).
#[derive(Debug, Clone, PartialEq)]
pub struct TracedRows {
    /// The relation's name; empty for the root.
    pub node: String,
    /// `db.table`.
    pub table: String,
    /// Each row: the columns the pipeline reads of it.
    pub rows: Vec<Map<String, Json>>,
}

/// How long a document read waits for a change to become visible before it goes ahead
/// and says so.
const VISIBLE_WITHIN: std::time::Duration = std::time::Duration::from_secs(5);

impl<'a> Reader<'a> {
    /// A reader on `conn`, which must have been opened with
    /// [`SourceConfig::reader_opts`]; `server` when known.
    pub(crate) fn new(src: &'a SourceConfig, conn: Conn, server: Option<Server>) -> Self {
        Self {
            src,
            conn,
            server,
            queries: 0,
            rows: 0,
            trace: None,
        }
    }

    /// A reader on a connection of its own.
    pub async fn connect(src: &'a SourceConfig) -> Result<Reader<'a>, MysqlError> {
        Ok(Self::new(src, src.reader_conn().await?, None))
    }

    /// The server this reader reads.
    pub async fn server(&mut self) -> Result<Server, MysqlError> {
        if let Some(s) = &self.server {
            return Ok(s.clone());
        }
        let s = crate::preflight::server_of(&mut self.conn, self.src).await?;
        self.server = Some(s.clone());
        Ok(s)
    }

    /// Starts a read-only transaction in which every level of a read sees one state
    /// (times in UTC). End it with [`Reader::end`].
    pub async fn begin(&mut self) -> Result<(), MysqlError> {
        crate::snapshot::begin_read(self.src, &mut self.conn).await
    }

    /// Starts a read that sees every change up to `floor` (a document's newest change).
    /// A change reaches the binlog, and Sluice, a moment before its transaction is
    /// visible to readers (on a replica read from, until the replica applied it); a read
    /// in that moment would stamp the old state with the new version for good. So the read
    /// waits until the change is visible, a few milliseconds on a primary: on MySQL until
    /// the changes' GTIDs are executed (`WAIT_FOR_EXECUTED_GTID_SET`) — past
    /// [`VISIBLE_WITHIN`] it fails as transient ([`MysqlError::Wait`]) and is tried again,
    /// never read early; on MariaDB for a consistent snapshot whose binlog position is past
    /// the change's version — past [`VISIBLE_WITHIN`] it goes ahead and says so (another
    /// server's coordinates never pass). End it with [`Reader::end`].
    pub async fn begin_after(&mut self, floor: &Floor) -> Result<(), MysqlError> {
        let server = self.server().await?;
        if server.flavor == Flavor::MySql {
            if !floor.gtids.is_empty() {
                let set = floor.gtids.to_string();
                let timed_out: Option<i64> = self
                    .conn
                    .exec_first(
                        "SELECT WAIT_FOR_EXECUTED_GTID_SET(?, ?)",
                        (&set, VISIBLE_WITHIN.as_secs()),
                    )
                    .await
                    .map_err(query_err(self.src, "wait for a change to be visible"))?;
                if timed_out != Some(0) {
                    return Err(MysqlError::Wait {
                        source_name: self.src.name.clone(),
                        what: format!(
                            "changes {set} are not visible within {} s (a replica behind?): the documents are read once they are",
                            VISIBLE_WITHIN.as_secs()
                        ),
                    });
                }
            }
            return self.begin().await;
        }
        let version = sluice_model::ExternalVersion::from_raw(floor.version);
        let deadline = tokio::time::Instant::now() + VISIBLE_WITHIN;
        loop {
            self.begin().await?;
            let position = crate::snapshot::mariadb_position(self.src, &mut self.conn).await?;
            let at = (
                sluice_model::position::file_seq(&position.file).unwrap_or(0),
                position.pos,
            );
            if at > (version.file_seq(), version.offset()) {
                return Ok(());
            }
            if tokio::time::Instant::now() >= deadline {
                tracing::warn!(source = %self.src.name, snapshot = %position, "no snapshot past the change within 5 s (another server's coordinates?): reading anyway");
                return Ok(());
            }
            self.end().await?;
            tokio::time::sleep(std::time::Duration::from_millis(2)).await;
        }
    }

    /// Starts a consistent snapshot and returns where it stands in the binlog (a build's
    /// chunk: the documents read in it are versioned with its low watermark). End it
    /// with [`Reader::end`].
    pub async fn begin_snapshot(&mut self) -> Result<Watermarks, MysqlError> {
        let server = self.server().await?;
        crate::snapshot::begin_snapshot(self.src, &mut self.conn, &server).await
    }

    /// Describes the tables of `spec` on this reader's connection and compiles it, as
    /// [`super::load`] does. Called just after a snapshot began, it sees every DDL
    /// logged before the snapshot, so what the snapshot reads is never cut to a shape
    /// older than its rows (a later DDL either leaves the old column list readable or
    /// fails the read, which is then tried again).
    pub async fn compile(
        &mut self,
        spec: &sluice_model::PipelineSpec,
    ) -> Result<Result<Vec<DocPlan>, Vec<String>>, MysqlError> {
        let described = super::describe(self.src, &mut self.conn, spec).await?;
        Ok(super::compile_described(spec, described))
    }

    pub async fn end(&mut self) -> Result<(), MysqlError> {
        crate::snapshot::end_snapshot(self.src, &mut self.conn).await
    }

    /// Closes the connection (a pooled one goes back to its pool).
    pub async fn close(self) {
        let _ = self.conn.disconnect().await;
    }

    async fn fetch(
        &mut self,
        what: &'static str,
        text: String,
        params: Params,
    ) -> Result<Vec<Vec<Value>>, MysqlError> {
        self.queries += 1;
        let rows: Vec<Row> = self
            .conn
            .exec(text, params)
            .await
            .map_err(query_err(self.src, what))?;
        self.rows += rows.len() as u64;
        Ok(rows.into_iter().map(Row::unwrap).collect())
    }
}

type Rows = Vec<Vec<Json>>;
type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

impl DocPlan {
    /// The document of `key` (its id values) and the rows of every table that build
    /// it, table by table (a relation read for no parent row is absent). Run it inside a
    /// transaction, as [`DocPlan::read`].
    pub async fn explain(
        &self,
        r: &mut Reader<'_>,
        key: Vec<Json>,
    ) -> Result<(Option<Built>, Vec<TracedRows>), MysqlError> {
        r.trace = Some(Vec::new());
        let read = self.read(r, &[key]).await;
        let traced = r.trace.take().unwrap_or_default();
        Ok((read?.pop(), traced))
    }

    /// The documents of `keys` (id values, in id order): one entry per distinct key
    /// without NULLs, in order. Run it inside a transaction ([`Reader::begin`], or a
    /// build's [`crate::begin_snapshot`]) so every level sees one state.
    pub async fn read(
        &self,
        r: &mut Reader<'_>,
        keys: &[Vec<Json>],
    ) -> Result<Vec<Built>, MysqlError> {
        self.read_some(r, keys, None).await
    }

    /// The parts `parts` (indexes of the root's relations) of the documents of `keys`:
    /// each root row read as [`DocPlan::read`] reads it, and only those relations below
    /// it. A document built holds those relations' fields alone; `None` when its root row
    /// is gone or filtered out.
    pub async fn read_parts(
        &self,
        r: &mut Reader<'_>,
        keys: &[Vec<Json>],
        parts: &[usize],
    ) -> Result<Vec<Built>, MysqlError> {
        self.read_some(r, keys, Some(parts)).await
    }

    async fn read_some(
        &self,
        r: &mut Reader<'_>,
        keys: &[Vec<Json>],
        parts: Option<&[usize]>,
    ) -> Result<Vec<Built>, MysqlError> {
        let root = &self.root;
        let mut distinct = std::collections::HashSet::new();
        let keys: Vec<Vec<Json>> = keys
            .iter()
            .filter(|k| join_key(k.iter()).is_some_and(|k| distinct.insert(k)))
            .cloned()
            .collect();
        let mut rows: Rows = Vec::new();
        for chunk in keys.chunks(sql::MAX_IN) {
            let text = sql::rows_by(
                root,
                &root.select,
                &self.id,
                sql::padded(chunk.len()),
                false,
            );
            let params = params(root, &self.id, chunk);
            let raw = r.fetch("read documents", text, params).await?;
            rows.extend(decode(r.src, root, &root.select, raw)?);
        }
        trace(r, root, "", &rows);
        let docs = match parts {
            None => assemble(self, r, root, &rows).await?,
            Some(parts) => self.parts_of(r, &rows, parts).await?,
        };
        let slots: Vec<usize> = self.id.iter().map(|&c| root.slot(c)).collect();
        let mut found: HashMap<String, usize> = HashMap::new();
        for (i, row) in rows.iter().enumerate() {
            if let Some(k) = join_key(slots.iter().map(|&s| &row[s])) {
                found.entry(k).or_insert(i);
            }
        }
        let mut docs: Vec<Option<Map<String, Json>>> = docs.into_iter().map(Some).collect();
        let mut out = Vec::with_capacity(keys.len());
        for key in keys {
            let Some(id) = self.document_id(&key) else {
                continue;
            };
            let at = join_key(&key).and_then(|k| found.get(&k).copied());
            out.push(Built {
                routing: at.and_then(|i| self.routing_in(&rows[i])),
                doc: at.and_then(|i| docs[i].take()),
                key,
                id,
            });
        }
        Ok(out)
    }

    /// For each root row, the fields of the relations `parts` (indexes of the root's).
    async fn parts_of(
        &self,
        r: &mut Reader<'_>,
        rows: &[Vec<Json>],
        parts: &[usize],
    ) -> Result<Vec<Map<String, Json>>, MysqlError> {
        let mut docs = vec![Map::new(); rows.len()];
        if rows.is_empty() {
            return Ok(docs);
        }
        for &i in parts {
            let child = &self.root.children[i];
            let values = related(self, r, &self.root, child, rows).await?;
            for (doc, v) in docs.iter_mut().zip(values) {
                doc.insert(child.name.clone(), v);
            }
        }
        Ok(docs)
    }

    /// The documents whose root rows have primary keys in `(after, upto]` (open ends when
    /// `None`), in key order, at most `limit` rows: a build reads a chunk with it, inside a
    /// consistent snapshot.
    pub async fn read_range(
        &self,
        r: &mut Reader<'_>,
        after: Option<&Key>,
        upto: Option<&Key>,
        limit: usize,
    ) -> Result<RangeRead, MysqlError> {
        let root = &self.root;
        let text = sql::root_range(root, after.is_some(), upto.is_some(), limit);
        let mut values: Vec<Value> = Vec::new();
        for k in [after, upto].into_iter().flatten() {
            values.extend(k.0.iter().map(KeyPart::to_value));
        }
        let params = if values.is_empty() {
            Params::Empty
        } else {
            Params::Positional(values)
        };
        let raw = r.fetch("read a build chunk", text, params).await?;
        let key_slots: Vec<usize> = root.table.key.iter().map(|&c| root.slot(c)).collect();
        let last = raw.last().map(|r| {
            Key(key_slots
                .iter()
                .map(|&s| KeyPart::from_value(&r[s]))
                .collect())
        });
        let count = raw.len();
        let rows = decode(r.src, root, &root.select, raw)?;
        let docs = assemble(self, r, root, &rows).await?;
        let id_slots: Vec<usize> = self.id.iter().map(|&c| root.slot(c)).collect();
        let mut out = Vec::with_capacity(rows.len());
        for (row, doc) in rows.iter().zip(docs) {
            let key: Vec<Json> = id_slots.iter().map(|&s| row[s].clone()).collect();
            let Some(id) = self.document_id(&key) else {
                tracing::warn!(table = %root.table.table, "a row with a NULL id cannot be a document; skipped");
                continue;
            };
            out.push(Built {
                routing: self.routing_in(row),
                key,
                id,
                doc: Some(doc),
            });
        }
        Ok(RangeRead {
            docs: out,
            last,
            rows: count,
        })
    }

    /// The root id values of the documents that contain rows of the node at `path` whose
    /// columns `cols` hold `values`, each with the tags of the values that led to it,
    /// combined by `merge`. Filters are ignored on the way up: a row a filter hides may
    /// be joined now, or may just have stopped being joined, and its document must be
    /// read again either way.
    pub async fn roots_of<T: Clone + Send + Sync>(
        &self,
        r: &mut Reader<'_>,
        path: &[usize],
        cols: &[usize],
        values: Vec<(Vec<Json>, T)>,
        merge: &(dyn Fn(&mut T, &T) + Sync),
    ) -> Result<Vec<(Vec<Json>, T)>, MysqlError> {
        let mut path = path.to_vec();
        let mut cols = cols.to_vec();
        let mut values = combine(values, merge);
        loop {
            let node = self.node(&path);
            let Some(link) = &node.link else {
                // The root: its id columns, looked up unless these are they.
                return lookup(r, node, &self.id, &cols, values, merge).await;
            };
            values = lookup(r, node, &link.child, &cols, values, merge).await?;
            path.pop();
            cols = link.parent.clone();
            if values.is_empty() {
                return Ok(values);
            }
        }
    }

    /// A child document's routing from its row as read.
    fn routing_in(&self, row: &[Json]) -> Option<String> {
        let cols = self.join.as_ref()?.parent.as_ref()?;
        let values: Vec<&Json> = cols.iter().map(|&c| &row[self.root.slot(c)]).collect();
        sluice_model::event::id_of(values)
    }
}

/// Values of `out` for the rows of `node` whose `by` columns hold `values`: no query
/// when `by` are `out` (in any order).
async fn lookup<T: Clone + Send + Sync>(
    r: &mut Reader<'_>,
    node: &Node,
    out: &[usize],
    by: &[usize],
    values: Vec<(Vec<Json>, T)>,
    merge: &(dyn Fn(&mut T, &T) + Sync),
) -> Result<Vec<(Vec<Json>, T)>, MysqlError> {
    let mut same = by.to_vec();
    same.sort_unstable();
    let mut wanted = out.to_vec();
    wanted.sort_unstable();
    if same == wanted {
        let order: Vec<usize> = out
            .iter()
            .map(|c| by.iter().position(|b| b == c).expect("same columns"))
            .collect();
        return Ok(values
            .into_iter()
            .map(|(v, t)| (order.iter().map(|&i| v[i].clone()).collect(), t))
            .collect());
    }
    let tags: HashMap<String, T> = values
        .iter()
        .filter_map(|(v, t)| Some((join_key(v)?, t.clone())))
        .collect();
    let mut select = out.to_vec();
    select.extend(by);
    let keys: Vec<Vec<Json>> = values.into_iter().map(|(v, _)| v).collect();
    let mut found = Vec::new();
    for chunk in keys.chunks(sql::MAX_IN) {
        let text = sql::rows_by(node, &select, by, sql::padded(chunk.len()), true);
        let raw = r
            .fetch(
                "find the documents of a change",
                text,
                params(node, by, chunk),
            )
            .await?;
        for row in decode(r.src, node, &select, raw)? {
            let (o, b) = row.split_at(out.len());
            if let (Some(t), true) = (
                join_key(b).and_then(|k| tags.get(&k)),
                o.iter().all(|v| !v.is_null()),
            ) {
                found.push((o.to_vec(), t.clone()));
            }
        }
    }
    Ok(combine(found, merge))
}

/// Each distinct key once, its tags combined by `merge`; keys holding NULL (which joins
/// nothing) left out.
fn combine<T: Clone>(
    values: Vec<(Vec<Json>, T)>,
    merge: &(dyn Fn(&mut T, &T) + Sync),
) -> Vec<(Vec<Json>, T)> {
    let mut at: HashMap<String, usize> = HashMap::new();
    let mut out: Vec<(Vec<Json>, T)> = Vec::new();
    for (v, t) in values {
        let Some(k) = join_key(&v) else { continue };
        match at.get(&k) {
            Some(&i) => merge(&mut out[i].1, &t),
            None => {
                at.insert(k, out.len());
                out.push((v, t));
            }
        }
    }
    out
}

/// The documents of `rows` of `node` (read with its `select`): their output columns and,
/// per relation, what it joins.
fn assemble<'a, 'r: 'a>(
    plan: &'a DocPlan,
    r: &'a mut Reader<'r>,
    node: &'a Node,
    rows: &'a [Vec<Json>],
) -> BoxFuture<'a, Result<Vec<Map<String, Json>>, MysqlError>> {
    Box::pin(async move {
        let mut docs: Vec<Map<String, Json>> = rows
            .iter()
            .map(|row| {
                node.output
                    .iter()
                    .map(|&c| {
                        (
                            node.table.columns[c].name.clone(),
                            row[node.slot(c)].clone(),
                        )
                    })
                    .collect()
            })
            .collect();
        if rows.is_empty() {
            return Ok(docs);
        }
        for child in &node.children {
            let values = related(plan, r, node, child, rows).await?;
            for (doc, v) in docs.iter_mut().zip(values) {
                doc.insert(child.name.clone(), v);
            }
        }
        if let Some(join) = plan
            .join
            .as_ref()
            .filter(|_| std::ptr::eq(node, &plan.root))
        {
            for (doc, row) in docs.iter_mut().zip(rows) {
                let tag = match &join.parent {
                    None => Json::String(plan.name.clone()),
                    Some(_) => serde_json::json!({
                        "name": plan.name,
                        "parent": plan.routing_in(row),
                    }),
                };
                doc.insert(join.field.clone(), tag);
            }
        }
        Ok(docs)
    })
}

/// What relation `child` holds for each of `parent`'s `rows`: an object (or null) for
/// one_to_one, an array for one_to_many.
async fn related(
    plan: &DocPlan,
    r: &mut Reader<'_>,
    parent: &Node,
    child: &Node,
    rows: &[Vec<Json>],
) -> Result<Vec<Json>, MysqlError> {
    let link = child.link.as_ref().expect("a relation has a link");
    let parent_slots: Vec<usize> = link.parent.iter().map(|&c| parent.slot(c)).collect();
    let mut keys: Vec<Vec<Json>> = Vec::new();
    let mut seen = std::collections::HashSet::new();
    let parent_keys: Vec<Option<String>> = rows
        .iter()
        .map(|row| {
            let values: Vec<Json> = parent_slots.iter().map(|&s| row[s].clone()).collect();
            let k = join_key(&values)?;
            if seen.insert(k.clone()) {
                keys.push(values);
            }
            Some(k)
        })
        .collect();
    let mut child_rows: Rows = Vec::new();
    for chunk in keys.chunks(sql::MAX_IN) {
        let text = sql::children(child, sql::padded(chunk.len()));
        let raw = r
            .fetch("read a relation", text, params(child, &link.child, chunk))
            .await?;
        child_rows.extend(decode(r.src, child, &child.select, raw)?);
    }
    trace(r, child, &child.name, &child_rows);
    let child_docs = assemble(plan, r, child, &child_rows).await?;
    let child_slots: Vec<usize> = link.child.iter().map(|&c| child.slot(c)).collect();
    let mut grouped: HashMap<String, Vec<Map<String, Json>>> = HashMap::new();
    for (row, doc) in child_rows.iter().zip(child_docs) {
        if let Some(k) = join_key(child_slots.iter().map(|&s| &row[s])) {
            grouped.entry(k).or_default().push(doc);
        }
    }
    Ok(parent_keys
        .into_iter()
        .map(|k| {
            let docs = k.and_then(|k| grouped.get(&k));
            match link.kind {
                RelationKind::OneToOne => docs
                    .and_then(|d| d.first())
                    .map_or(Json::Null, |d| Json::Object(d.clone())),
                _ => Json::Array(
                    docs.map(|d| d.iter().cloned().map(Json::Object).collect())
                        .unwrap_or_default(),
                ),
            }
        })
        .collect())
}

/// Notes `rows` of `node` while a document is explained.
fn trace(r: &mut Reader<'_>, node: &Node, name: &str, rows: &Rows) {
    let Some(trace) = r.trace.as_mut() else {
        return;
    };
    trace.push(TracedRows {
        node: name.to_owned(),
        table: format!("{}.{}", node.table.db, node.table.table),
        rows: rows
            .iter()
            .map(|row| {
                node.select
                    .iter()
                    .map(|&c| {
                        (
                            node.table.columns[c].name.clone(),
                            row[node.slot(c)].clone(),
                        )
                    })
                    .collect()
            })
            .collect(),
    });
}

/// The parameters for an `IN` list of `keys` over `cols`, padded as the statement is.
fn params(node: &Node, cols: &[usize], keys: &[Vec<Json>]) -> Params {
    let kinds: Vec<Kind> = cols.iter().map(|&c| node.table.columns[c].kind).collect();
    let mut out = Vec::with_capacity(sql::padded(keys.len()) * cols.len());
    for key in keys.iter().chain(std::iter::repeat_n(
        keys.last().expect("at least one key"),
        sql::padded(keys.len()) - keys.len(),
    )) {
        out.extend(key.iter().zip(&kinds).map(|(v, &k)| param(k, v)));
    }
    Params::Positional(out)
}

/// A JSON value as the parameter that matches the column's value: the inverse of the
/// decoding for the types a key may have.
fn param(kind: Kind, v: &Json) -> Value {
    match v {
        Json::Null => Value::NULL,
        Json::Bool(b) => Value::Int(i64::from(*b)),
        Json::Number(n) => n
            .as_i64()
            .map(Value::Int)
            .or_else(|| n.as_u64().map(Value::UInt))
            .unwrap_or_else(|| Value::Double(n.as_f64().unwrap_or(0.0))),
        Json::String(s) => Value::Bytes(match kind {
            Kind::Bytes => base64::engine::general_purpose::STANDARD
                .decode(s)
                .unwrap_or_else(|_| s.clone().into_bytes()),
            Kind::DateTime | Kind::Timestamp => {
                s.replacen('T', " ", 1).trim_end_matches('Z').into()
            }
            _ => s.clone().into_bytes(),
        }),
        Json::Array(labels) => Value::Bytes(
            labels
                .iter()
                .filter_map(Json::as_str)
                .collect::<Vec<_>>()
                .join(",")
                .into_bytes(),
        ),
        Json::Object(_) => Value::Bytes(v.to_string().into_bytes()),
    }
}

/// Raw rows of `node`'s columns `cols` as JSON, decoded as the binlog decoder would.
fn decode(
    src: &SourceConfig,
    node: &Node,
    cols: &[usize],
    raw: Vec<Vec<Value>>,
) -> Result<Rows, MysqlError> {
    raw.into_iter()
        .map(|values| {
            cols.iter()
                .zip(values)
                .map(|(&c, v)| {
                    let col = &node.table.columns[c];
                    value_to_json(col, v).map_err(|detail| MysqlError::Value {
                        source_name: src.name.clone(),
                        table: format!("{}.{}", node.table.db, node.table.table),
                        column: col.name.clone(),
                        detail,
                    })
                })
                .collect()
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn combine_merges_the_tags_of_a_key_and_drops_nulls() {
        let merged = combine(
            vec![
                (vec![Json::from(1)], vec![5u64]),
                (vec![Json::from("1")], vec![9]),
                (vec![Json::from(2)], vec![3]),
                (vec![Json::Null], vec![10]),
            ],
            &|a: &mut Vec<u64>, b: &Vec<u64>| a.extend(b),
        );
        assert_eq!(
            merged,
            [
                (vec![Json::from(1)], vec![5, 9]),
                (vec![Json::from(2)], vec![3])
            ]
        );
    }

    #[test]
    fn parameters_undo_the_decoding() {
        assert_eq!(param(Kind::Int, &Json::from(-3)), Value::Int(-3));
        assert_eq!(
            param(Kind::Int, &Json::from(u64::MAX)),
            Value::UInt(u64::MAX)
        );
        assert_eq!(
            param(Kind::Bytes, &Json::from("AAE=")),
            Value::Bytes(vec![0, 1])
        );
        assert_eq!(
            param(Kind::Timestamp, &Json::from("2024-01-02T03:04:05Z")),
            Value::Bytes(b"2024-01-02 03:04:05".to_vec())
        );
        assert_eq!(
            param(Kind::Text, &Json::from("a")),
            Value::Bytes(b"a".to_vec())
        );
    }
}
