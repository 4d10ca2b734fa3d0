//! The oracle for documents built from several tables: from a pipeline's spec (as the
//! JSON given to Sluice, read here on its own terms), every expected document is computed
//! with this module's own SQL — each table of the tree read whole over the text protocol,
//! per-parent order and limits by window functions over the whole table, joins done here
//! — and compared with every document of the index, field by field: arrays as multisets,
//! or in order when the relation has an `order_by`. Missing, extra and different
//! documents are reported with examples.
//!
//! Nothing here calls the product's document reader: a bug there shows up as a
//! difference. Conventions it checks (the README's pipeline spec): a `one_to_one` with no
//! row is `null`, one with several takes the first by `order_by` then primary key; a
//! `one_to_many` with none is `[]`; child documents (parent-child mode) have the `_id`
//! `<relation>#<id>`, the join field `{name, parent}` and their parent's `_id` as routing,
//! and parents the join field set to their name.

use std::collections::{BTreeMap, HashMap};

use mysql_async::prelude::*;
use mysql_async::Value as MyValue;
use serde_json::{Map, Value};

use crate::checker::{expected_json, values_equal};
use crate::TestCtx;

/// The result of a comparison: how many documents matched, or what differs.
pub async fn check_documents(ctx: &TestCtx, spec: &Value) -> Result<usize, String> {
    let alias = spec["alias"].as_str().ok_or("the spec has no alias")?;
    let db = spec["database"]
        .as_str()
        .ok_or("the spec has no database")?;
    let mut conn = ctx.stack.conn().await;
    conn.query_drop("SET time_zone = '+00:00'")
        .await
        .map_err(|e| e.to_string())?;
    let mut expected: BTreeMap<String, Expected> = BTreeMap::new();
    // The root documents.
    let root = Node::root(spec, db);
    let rows = read_node(&mut conn, &root).await?;
    let loaded = load(&mut conn, &root).await?;
    let id_cols: Vec<String> = match spec["id"].as_array() {
        Some(a) if !a.is_empty() => strings(&spec["id"]),
        _ => primary_key(&mut conn, db, &root.table).await?,
    };
    let join = spec["relations"]
        .as_array()
        .into_iter()
        .flatten()
        .any(|r| r["kind"] == "child")
        .then(|| {
            let field = spec["join"]["field"]
                .as_str()
                .unwrap_or("join_field")
                .to_owned();
            let parent = spec["join"]["parent"]
                .as_str()
                .unwrap_or(&root.table)
                .to_owned();
            (field, parent)
        });
    for row in &rows {
        let id = id_of(row, &id_cols).ok_or("a root row has a NULL id")?;
        let mut doc = output(&root, row);
        attach(&loaded, row, &mut doc);
        if let Some((field, parent)) = &join {
            doc.insert(field.clone(), Value::String(parent.clone()));
        }
        expected.insert(
            id,
            Expected {
                doc,
                routing: None,
                ordered: root.ordered_fields(),
            },
        );
    }
    // Child documents (parent-child mode).
    for rel in spec["relations"].as_array().into_iter().flatten() {
        if rel["kind"] != "child" {
            continue;
        }
        let node = Node::relation(rel, db);
        let (field, _) = join.clone().expect("child relations make a join");
        let pk = primary_key(&mut conn, &node.db, &node.table).await?;
        let loaded = load(&mut conn, &node).await?;
        for row in read_node(&mut conn, &node).await? {
            let parent_cols: Vec<String> = id_cols.iter().map(|c| node.on[c].clone()).collect();
            let Some(parent) = id_of(&row, &parent_cols) else {
                continue;
            };
            let mut doc = output(&node, &row);
            attach(&loaded, &row, &mut doc);
            doc.insert(
                field.clone(),
                serde_json::json!({"name": node.name, "parent": parent}),
            );
            let id = format!(
                "{}#{}",
                node.name,
                id_of(&row, &pk).ok_or("a child row has a NULL key")?
            );
            expected.insert(
                id,
                Expected {
                    doc,
                    routing: Some(parent),
                    ordered: node.ordered_fields(),
                },
            );
        }
    }
    drop(conn);
    compare(ctx, alias, &expected)
        .await
        .map(|()| expected.len())
}

struct Expected {
    doc: Map<String, Value>,
    routing: Option<String>,
    /// Array fields (by path) compared in order.
    ordered: Vec<String>,
}

/// A table of the tree as the spec describes it.
#[derive(Clone)]
struct Node {
    name: String,
    db: String,
    table: String,
    kind: String,
    /// Parent column → this table's column.
    on: BTreeMap<String, String>,
    columns: Vec<String>,
    filter: Option<String>,
    distinct: bool,
    order_by: Vec<String>,
    limit: Option<u64>,
    children: Vec<Node>,
}

impl Node {
    fn root(spec: &Value, db: &str) -> Node {
        Node {
            name: String::new(),
            db: db.to_owned(),
            table: spec["table"].as_str().unwrap_or_default().to_owned(),
            kind: "root".into(),
            on: BTreeMap::new(),
            columns: strings(&spec["columns"]),
            filter: spec["filter"].as_str().map(String::from),
            distinct: false,
            order_by: Vec::new(),
            limit: None,
            children: children(spec, db),
        }
    }

    fn relation(r: &Value, db: &str) -> Node {
        let db = r["database"].as_str().unwrap_or(db).to_owned();
        Node {
            name: r["name"].as_str().unwrap_or_default().to_owned(),
            table: r["table"].as_str().unwrap_or_default().to_owned(),
            kind: r["kind"].as_str().unwrap_or_default().to_owned(),
            on: r["on"]
                .as_object()
                .map(|m| {
                    m.iter()
                        .map(|(k, v)| (k.clone(), v.as_str().unwrap_or_default().to_owned()))
                        .collect()
                })
                .unwrap_or_default(),
            columns: strings(&r["columns"]),
            filter: r["filter"].as_str().map(String::from),
            distinct: r["distinct"].as_bool().unwrap_or(false),
            order_by: strings(&r["order_by"]),
            limit: r["limit"].as_u64(),
            children: children(r, &db),
            db,
        }
    }

    /// The paths of array fields whose order matters.
    fn ordered_fields(&self) -> Vec<String> {
        let mut out = Vec::new();
        for c in &self.children {
            if !c.order_by.is_empty() {
                out.push(c.name.clone());
            }
            out.extend(
                c.ordered_fields()
                    .into_iter()
                    .map(|f| format!("{}.{f}", c.name)),
            );
        }
        out
    }
}

fn children(v: &Value, db: &str) -> Vec<Node> {
    v["relations"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|r| r["kind"] != "child")
        .map(|r| Node::relation(r, db))
        .collect()
}

fn strings(v: &Value) -> Vec<String> {
    v.as_array()
        .into_iter()
        .flatten()
        .filter_map(|s| s.as_str().map(String::from))
        .collect()
}

/// One row: column → expected JSON value, and its rank among its parent's rows.
type Row = (BTreeMap<String, Value>, u64);

async fn primary_key(
    conn: &mut mysql_async::Conn,
    db: &str,
    table: &str,
) -> Result<Vec<String>, String> {
    conn.exec(
        "SELECT COLUMN_NAME FROM information_schema.KEY_COLUMN_USAGE \
         WHERE TABLE_SCHEMA = ? AND TABLE_NAME = ? AND CONSTRAINT_NAME = 'PRIMARY' ORDER BY ORDINAL_POSITION",
        (db, table),
    )
    .await
    .map_err(|e| e.to_string())
}

/// A node's rows, read once: grouped by the values that join them to a parent (in
/// rank order, cut to the limit), with its children's.
struct Loaded {
    node: Node,
    by_parent: HashMap<String, Vec<BTreeMap<String, Value>>>,
    children: Vec<Loaded>,
}

/// Reads `node` and its relations, one query each.
async fn load(conn: &mut mysql_async::Conn, node: &Node) -> Result<Loaded, String> {
    let mut rows = ranked(conn, node).await?;
    rows.sort_by_key(|(_, rank)| *rank);
    let mut by_parent: HashMap<String, Vec<BTreeMap<String, Value>>> = HashMap::new();
    for (row, rank) in rows {
        if node.limit.is_some_and(|l| rank > l) {
            continue;
        }
        let values: Vec<&Value> = node
            .on
            .values()
            .map(|c| row.get(c).unwrap_or(&Value::Null))
            .collect();
        if let Some(k) = join_text(&values) {
            by_parent.entry(k).or_default().push(row);
        }
    }
    let mut children = Vec::new();
    for c in &node.children {
        children.push(Box::pin(load(conn, c)).await?);
    }
    Ok(Loaded {
        node: node.clone(),
        by_parent,
        children,
    })
}

/// The join key of some values: their text, or `None` when one is NULL.
fn join_text(values: &[&Value]) -> Option<String> {
    if values.iter().any(|v| v.is_null()) {
        return None;
    }
    Some(
        values
            .iter()
            .map(|v| text(v))
            .collect::<Vec<_>>()
            .join("\u{1f}"),
    )
}

/// Every row of `node`'s table that its filter keeps (roots and child documents).
async fn read_node(
    conn: &mut mysql_async::Conn,
    node: &Node,
) -> Result<Vec<BTreeMap<String, Value>>, String> {
    Ok(ranked(conn, node)
        .await?
        .into_iter()
        .map(|(row, _)| row)
        .collect())
}

/// The node's rows with their ranks within their parents, from one query over the whole
/// table.
async fn ranked(conn: &mut mysql_async::Conn, node: &Node) -> Result<Vec<Row>, String> {
    let described: Vec<(String, String)> = conn
        .exec(
            "SELECT COLUMN_NAME, DATA_TYPE FROM information_schema.COLUMNS WHERE TABLE_SCHEMA = ? AND TABLE_NAME = ? ORDER BY ORDINAL_POSITION",
            (&node.db, &node.table),
        )
        .await
        .map_err(|e| e.to_string())?;
    let table_order: Vec<String> = described.iter().map(|(c, _)| c.clone()).collect();
    let types: HashMap<String, String> = described
        .into_iter()
        .map(|(c, t)| (c, t.to_ascii_lowercase()))
        .collect();
    let pk = primary_key(conn, &node.db, &node.table).await?;
    let q = |c: &str| format!("`{c}`");
    let from = format!("`{}`.`{}`", node.db, node.table);
    let filter = node.filter.clone().unwrap_or_else(|| "1 = 1".into());
    let partition: Vec<String> = node.on.values().map(|c| q(c)).collect();
    let partition = if partition.is_empty() {
        "NULL".to_owned()
    } else {
        partition.join(", ")
    };
    let mut order: Vec<String> = node
        .order_by
        .iter()
        .map(|o| {
            let mut w = o.split_whitespace();
            let col = q(w.next().unwrap_or_default());
            match w.next().map(str::to_ascii_lowercase).as_deref() {
                Some("desc") => format!("{col} DESC"),
                _ => col,
            }
        })
        .collect();
    let sql = if node.distinct {
        // The selected columns — the join's and the listed ones — in table order, the
        // documented tie-break.
        let cols: Vec<String> = table_order
            .iter()
            .filter(|c| {
                node.columns.is_empty()
                    || node.columns.contains(c)
                    || node.on.values().any(|o| o == *c)
            })
            .cloned()
            .collect();
        let cols: Vec<String> = cols.iter().map(|c| q(c)).collect();
        order.extend(cols.iter().cloned());
        format!(
            "SELECT d.*, ROW_NUMBER() OVER (PARTITION BY {partition} ORDER BY {}) AS `__rank` FROM (SELECT DISTINCT {} FROM {from} WHERE {filter}) d",
            order.join(", "),
            cols.join(", ")
        )
    } else {
        order.extend(pk.iter().map(|c| q(c)));
        format!(
            "SELECT t.*, ROW_NUMBER() OVER (PARTITION BY {partition} ORDER BY {}) AS `__rank` FROM {from} t WHERE {filter}",
            order.join(", ")
        )
    };
    let rows: Vec<mysql_async::Row> = conn.query(&sql).await.map_err(|e| format!("{sql}: {e}"))?;
    Ok(rows
        .into_iter()
        .map(|row| {
            let names: Vec<String> = row
                .columns_ref()
                .iter()
                .map(|c| c.name_str().into_owned())
                .collect();
            let mut out = BTreeMap::new();
            let mut rank = 0;
            for (i, name) in names.into_iter().enumerate() {
                let raw = row.as_ref(i).cloned().unwrap_or(MyValue::NULL);
                if name == "__rank" {
                    rank = expected_json("bigint", raw).as_u64().unwrap_or(0);
                } else {
                    let t = types.get(&name).map(String::as_str).unwrap_or("varchar");
                    out.insert(name, expected_json(t, raw));
                }
            }
            (out, rank)
        })
        .collect())
}

/// The columns of `row` a document shows.
fn output(node: &Node, row: &BTreeMap<String, Value>) -> Map<String, Value> {
    row.iter()
        .filter(|(c, _)| node.columns.is_empty() || node.columns.contains(c))
        .map(|(c, v)| (c.clone(), v.clone()))
        .collect()
}

/// Adds each relation (`loaded.children`) to `doc`, for the parent row `row`.
fn attach(loaded: &Loaded, row: &BTreeMap<String, Value>, doc: &mut Map<String, Value>) {
    for child in &loaded.children {
        let parent: Vec<&Value> = child
            .node
            .on
            .keys()
            .map(|c| row.get(c).unwrap_or(&Value::Null))
            .collect();
        let rows = join_text(&parent)
            .and_then(|k| child.by_parent.get(&k))
            .map(Vec::as_slice)
            .unwrap_or_default();
        let docs: Vec<Value> = rows
            .iter()
            .map(|r| {
                let mut d = output(&child.node, r);
                attach(child, r, &mut d);
                Value::Object(d)
            })
            .collect();
        let value = if child.node.kind == "one_to_one" {
            docs.into_iter().next().unwrap_or(Value::Null)
        } else {
            Value::Array(docs)
        };
        doc.insert(child.node.name.clone(), value);
    }
}

/// Values as text: how join columns compare (and how `_id`s are made).
fn text(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

fn id_of(row: &BTreeMap<String, Value>, cols: &[String]) -> Option<String> {
    let parts: Option<Vec<String>> = cols
        .iter()
        .map(|c| row.get(c).filter(|v| !v.is_null()).map(text))
        .collect();
    let parts = parts?;
    if parts.len() == 1 {
        return parts.into_iter().next();
    }
    Some(
        parts
            .iter()
            .map(|p| p.replace('\\', "\\\\").replace(':', "\\:"))
            .collect::<Vec<_>>()
            .join(":"),
    )
}

/// Up to this many documents are compared by one search (which also finds extras by
/// id); more are read by id, and extras counted.
const SEARCHED: usize = 9_000;

/// Every document of the index against `expected`.
async fn compare(
    ctx: &TestCtx,
    alias: &str,
    expected: &BTreeMap<String, Expected>,
) -> Result<(), String> {
    let es = &ctx.stack.es;
    es.refresh(alias)
        .await
        .map_err(|e| format!("refresh {alias}: {e}"))?;
    let mut problems = Vec::new();
    let (hits, searched) = if expected.len() < SEARCHED {
        let found = es
            .search(
                alias,
                &serde_json::json!({"query": {"match_all": {}}, "size": 10000}),
            )
            .await
            .map_err(|e| format!("search {alias}: {e}"))?;
        let mut hits = found["hits"]["hits"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        // Documents written in parts keep their versions beside their fields.
        for hit in &mut hits {
            if let Some(source) = hit["_source"].as_object_mut() {
                source.remove(sluice_elastic::parts::FIELD);
            }
        }
        (hits, true)
    } else {
        // Too many for one search: every expected document by id, and extras by count.
        let docs: Vec<(String, Option<String>)> = expected
            .iter()
            .map(|(id, want)| (id.clone(), want.routing.clone()))
            .collect();
        let mut hits = Vec::new();
        for part in docs.chunks(1000) {
            let found = es
                .mget_routed(alias, part)
                .await
                .map_err(|e| format!("mget {alias}: {e}"))?;
            for ((id, routing), source) in part.iter().zip(found) {
                if let Some(source) = source {
                    hits.push(
                        serde_json::json!({"_id": id, "_routing": routing, "_source": source}),
                    );
                }
            }
        }
        let count = es
            .count(alias)
            .await
            .map_err(|e| format!("count {alias}: {e}"))?;
        if count > hits.len() as u64 {
            problems.push(format!(
                "{} extra document(s) (the index holds {count})",
                count - hits.len() as u64
            ));
        }
        (hits, false)
    };
    let mut seen = std::collections::BTreeSet::new();
    for hit in &hits {
        let id = hit["_id"].as_str().unwrap_or_default().to_owned();
        seen.insert(id.clone());
        let Some(want) = expected.get(&id) else {
            problems.push(format!("extra document {id}: {}", hit["_source"]));
            continue;
        };
        let routing = hit["_routing"].as_str().map(String::from);
        if want.routing.is_some() && routing != want.routing {
            problems.push(format!(
                "document {id}: routing {routing:?}, expected {:?}",
                want.routing
            ));
        }
        let got = hit["_source"].as_object().cloned().unwrap_or_default();
        if let Some(diff) = diff_object("", &want.doc, &got, &want.ordered) {
            problems.push(format!("document {id}: {diff}"));
        }
    }
    let missing: Vec<&String> = expected.keys().filter(|id| !seen.contains(*id)).collect();
    if !missing.is_empty() {
        problems.push(format!(
            "{} missing document(s), e.g. {:?}",
            missing.len(),
            &missing[..missing.len().min(5)]
        ));
    }
    if searched && hits.len() >= 10000 {
        problems.push("the index holds 10000 documents or more: too many for this checker".into());
    }
    if problems.is_empty() {
        Ok(())
    } else {
        let total = problems.len();
        problems.truncate(10);
        Err(format!(
            "{alias}: {total} problem(s) over {} expected and {} indexed documents:\n  {}",
            expected.len(),
            hits.len(),
            problems.join("\n  ")
        ))
    }
}

fn diff_object(
    path: &str,
    want: &Map<String, Value>,
    got: &Map<String, Value>,
    ordered: &[String],
) -> Option<String> {
    for (k, w) in want {
        let p = if path.is_empty() {
            k.clone()
        } else {
            format!("{path}.{k}")
        };
        let Some(g) = got.get(k) else {
            return Some(format!("field `{p}` is missing (MySQL yields {w})"));
        };
        if let Some(d) = diff_value(&p, w, g, ordered) {
            return Some(d);
        }
    }
    got.keys().find(|k| !want.contains_key(*k)).map(|k| {
        format!(
            "field `{path}{}{k}` that MySQL does not yield",
            if path.is_empty() { "" } else { "." }
        )
    })
}

fn diff_value(path: &str, want: &Value, got: &Value, ordered: &[String]) -> Option<String> {
    match (want, got) {
        (Value::Object(w), Value::Object(g)) => diff_object(path, w, g, ordered),
        (Value::Array(w), Value::Array(g)) if w.iter().chain(g).any(Value::is_object) => {
            if w.len() != g.len() {
                return Some(format!(
                    "`{path}` has {} element(s), MySQL yields {}",
                    g.len(),
                    w.len()
                ));
            }
            let (mut w, mut g) = (w.clone(), g.clone());
            // `skus[3].prices` is ordered when `skus.prices` is.
            let bare: String = {
                let mut out = String::new();
                let mut depth = 0;
                for c in path.chars() {
                    match c {
                        '[' => depth += 1,
                        ']' => depth -= 1,
                        c if depth == 0 => out.push(c),
                        _ => {}
                    }
                }
                out
            };
            if !ordered.contains(&bare) {
                let key = |v: &Value| canonical(v);
                w.sort_by_key(key);
                g.sort_by_key(key);
            }
            w.iter()
                .zip(&g)
                .enumerate()
                .find_map(|(i, (a, b))| diff_value(&format!("{path}[{i}]"), a, b, ordered))
        }
        _ if values_equal(number_kind(want, got), want, got) => None,
        _ => Some(format!(
            "`{path}`: MySQL yields {want}, the document has {got}"
        )),
    }
}

/// Floats compare with a tolerance (the type is not known here: both numbers, one a float).
fn number_kind(want: &Value, got: &Value) -> &'static str {
    match (want, got) {
        (Value::Number(a), Value::Number(b)) if a.is_f64() || b.is_f64() => "double",
        _ => "",
    }
}

/// A value's text with object keys sorted: the order of multisets.
fn canonical(v: &Value) -> String {
    match v {
        Value::Object(m) => {
            let sorted: BTreeMap<&String, String> =
                m.iter().map(|(k, v)| (k, canonical(v))).collect();
            format!("{sorted:?}")
        }
        Value::Array(a) => format!("{:?}", a.iter().map(canonical).collect::<Vec<_>>()),
        other => other.to_string(),
    }
}
