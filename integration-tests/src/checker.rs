//! The oracle: compares every row of a MySQL table with its Elasticsearch document, field
//! by field, and the document count with the row count (so a resurrected or stray
//! document is caught too).
//!
//! It reads MySQL over the text protocol and converts each value with its own rules from
//! `information_schema` types — an implementation independent of the worker's binlog
//! decoder, so a decoding bug shows up as a difference.

use base64::Engine as _;
use mysql_async::prelude::*;
use mysql_async::Value as MyValue;
use serde_json::{Map, Value};

use crate::TestCtx;

#[derive(Default, Clone)]
pub struct CheckOptions {
    /// Document fields that may remain from dropped columns (documents of rows not
    /// written since a DROP COLUMN keep the field until the index is rebuilt).
    pub dropped_columns: Vec<String>,
    /// Compare only these columns (a pipeline with a column list); all when empty.
    pub columns: Vec<String>,
    /// Compare every row even when the counts differ, so the answer names the rows
    /// (a final verdict; while the index is visibly behind, the count alone answers).
    pub every_row: bool,
}

struct Col {
    name: String,
    data_type: String,
}

/// `Ok` when the index behind `alias` equals `table`; otherwise a description of the
/// first differences.
pub async fn check_table(
    ctx: &TestCtx,
    table: &str,
    alias: &str,
    opts: &CheckOptions,
) -> Result<(), String> {
    let mut conn = ctx.stack.conn().await;
    conn.query_drop("SET time_zone = '+00:00'")
        .await
        .map_err(|e| e.to_string())?;
    let cols: Vec<Col> = conn
        .exec_map(
            "SELECT COLUMN_NAME, DATA_TYPE FROM information_schema.COLUMNS \
             WHERE TABLE_SCHEMA = ? AND TABLE_NAME = ? ORDER BY ORDINAL_POSITION",
            (&ctx.db, table),
            |(name, data_type): (String, String)| Col {
                name,
                data_type: data_type.to_ascii_lowercase(),
            },
        )
        .await
        .map_err(|e| e.to_string())?;
    let key: Vec<String> = conn
        .exec(
            "SELECT COLUMN_NAME FROM information_schema.KEY_COLUMN_USAGE \
             WHERE TABLE_SCHEMA = ? AND TABLE_NAME = ? AND CONSTRAINT_NAME = 'PRIMARY' ORDER BY ORDINAL_POSITION",
            (&ctx.db, table),
        )
        .await
        .map_err(|e| e.to_string())?;
    if key.is_empty() {
        return Err(format!("{table} has no primary key"));
    }
    // Cheap first: while the index is visibly behind, skip reading every row and
    // document. Equal counts prove nothing; the full comparison below decides.
    let mysql_count: Option<u64> = conn
        .query_first(format!("SELECT COUNT(*) FROM `{}`.`{table}`", ctx.db))
        .await
        .map_err(|e| e.to_string())?;
    let es = &ctx.stack.es;
    es.refresh(alias)
        .await
        .map_err(|e| format!("refresh {alias}: {e}"))?;
    let count = es
        .count(alias)
        .await
        .map_err(|e| format!("count {alias}: {e}"))?;
    if Some(count) != mysql_count && !opts.every_row {
        return Err(format!(
            "{table} vs {alias}: {count} documents for {mysql_count:?} rows"
        ));
    }
    let rows: Vec<mysql_async::Row> = conn
        .query(format!("SELECT * FROM `{}`.`{table}`", ctx.db))
        .await
        .map_err(|e| e.to_string())?;
    drop(conn);

    let mut expected: Vec<(String, Map<String, Value>)> = Vec::with_capacity(rows.len());
    for row in rows {
        let mut doc = Map::new();
        for (i, col) in cols.iter().enumerate() {
            let raw = row.as_ref(i).cloned().unwrap_or(MyValue::NULL);
            doc.insert(col.name.clone(), expected_json(&col.data_type, raw));
        }
        let key_map: Map<String, Value> = key.iter().map(|k| (k.clone(), doc[k].clone())).collect();
        let id = sluice_model::event::document_id(&key_map).ok_or("row with a NULL key")?;
        if !opts.columns.is_empty() {
            doc.retain(|k, _| opts.columns.contains(k));
        }
        expected.push((id, doc));
    }

    let mut problems = Vec::new();
    for chunk in expected.chunks(500) {
        let ids: Vec<String> = chunk.iter().map(|(id, _)| id.clone()).collect();
        let docs = es
            .mget(alias, &ids)
            .await
            .map_err(|e| format!("mget {alias}: {e}"))?;
        for ((id, want), got) in chunk.iter().zip(docs) {
            match got {
                None => problems.push(format!("row {id}: no document")),
                Some(Value::Object(got)) => {
                    if let Some(diff) = compare(want, &got, &cols, opts) {
                        problems.push(format!("row {id}: {diff}"));
                    }
                }
                Some(other) => {
                    problems.push(format!("row {id}: document is not an object: {other}"))
                }
            }
            if problems.len() >= 10 {
                break;
            }
        }
        if problems.len() >= 10 {
            break;
        }
    }
    let count = es
        .count(alias)
        .await
        .map_err(|e| format!("count {alias}: {e}"))?;
    if count != expected.len() as u64 {
        problems.push(format!("{count} documents for {} rows", expected.len()));
    }
    if problems.is_empty() {
        Ok(())
    } else {
        Err(format!("{table} vs {alias}:\n  {}", problems.join("\n  ")))
    }
}

fn compare(
    want: &Map<String, Value>,
    got: &Map<String, Value>,
    cols: &[Col],
    opts: &CheckOptions,
) -> Option<String> {
    for (name, w) in want {
        // A column added after the document was last written is absent from it, which
        // is what NULL means for a nullable column that no write has touched.
        let g = got.get(name).unwrap_or(&Value::Null);
        let data_type = cols
            .iter()
            .find(|c| &c.name == name)
            .map(|c| c.data_type.as_str())
            .unwrap_or("");
        if !values_equal(data_type, w, g) {
            return Some(format!(
                "column `{name}` ({data_type}): MySQL {w} vs document {g}"
            ));
        }
    }
    for name in got.keys() {
        if !want.contains_key(name) && !opts.dropped_columns.contains(name) {
            return Some(format!("document has field `{name}` that the row has not"));
        }
    }
    None
}

pub(crate) fn values_equal(data_type: &str, want: &Value, got: &Value) -> bool {
    match (data_type, want, got) {
        ("float", Value::Number(a), Value::Number(b)) => close(a.as_f64(), b.as_f64(), 1e-6),
        ("double", Value::Number(a), Value::Number(b)) => close(a.as_f64(), b.as_f64(), 1e-14),
        _ => want == got,
    }
}

fn close(a: Option<f64>, b: Option<f64>, rel: f64) -> bool {
    match (a, b) {
        (Some(a), Some(b)) => a == b || (a - b).abs() <= rel * a.abs().max(b.abs()),
        _ => false,
    }
}

/// What the document must hold for a MySQL text-protocol value of `data_type`.
pub(crate) fn expected_json(data_type: &str, raw: MyValue) -> Value {
    let bytes = match raw {
        MyValue::NULL => return Value::Null,
        MyValue::Bytes(b) => b,
        other => other.as_sql(true).into_bytes(),
    };
    let text = || String::from_utf8_lossy(&bytes).into_owned();
    match data_type {
        "tinyint" | "smallint" | "mediumint" | "int" | "bigint" | "year" => {
            let t = text();
            t.parse::<i64>()
                .map(Value::from)
                .or_else(|_| t.parse::<u64>().map(Value::from))
                .unwrap_or(Value::String(t))
        }
        "bit" => Value::from(bytes.iter().fold(0u64, |acc, b| (acc << 8) | *b as u64)),
        "float" | "double" => text()
            .parse::<f64>()
            .map(Value::from)
            .unwrap_or(Value::Null),
        "decimal" => Value::String(text()),
        "binary" | "varbinary" | "tinyblob" | "blob" | "mediumblob" | "longblob" | "geometry"
        | "point" | "linestring" | "polygon" | "multipoint" | "multilinestring"
        | "multipolygon" | "geometrycollection" | "geomcollection" => {
            Value::String(base64::engine::general_purpose::STANDARD.encode(&bytes))
        }
        "date" => {
            let t = text();
            if t.starts_with("0000-00-00") {
                Value::Null
            } else {
                Value::String(t)
            }
        }
        "datetime" | "timestamp" => {
            let t = text();
            if t.starts_with("0000-00-00") {
                Value::Null
            } else {
                let iso = t.replacen(' ', "T", 1);
                Value::String(if data_type == "timestamp" {
                    format!("{iso}Z")
                } else {
                    iso
                })
            }
        }
        "set" => {
            let t = text();
            Value::Array(if t.is_empty() {
                Vec::new()
            } else {
                t.split(',').map(|s| Value::String(s.to_owned())).collect()
            })
        }
        "json" => serde_json::from_slice(&bytes).unwrap_or_else(|_| Value::String(text())),
        "vector" => Value::Array(
            bytes
                .chunks_exact(4)
                .map(|c| {
                    let f = f32::from_le_bytes([c[0], c[1], c[2], c[3]]);
                    Value::from(f.to_string().parse::<f64>().expect("a float"))
                })
                .collect(),
        ),
        // char, varchar, text types, enum, time (and MariaDB's JSON, a longtext)
        _ => Value::String(text()),
    }
}
