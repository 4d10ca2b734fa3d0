//! The change-event envelope: one JSON document per row change on Kafka.
//!
//! Envelope version 1 (`"v": 1`). Readable by any consumer; documented field by field in
//! README.md ("Change events"). Values inside `key`, `before` and `after` are typed JSON:
//!
//! | MySQL type                                   | JSON                                                  |
//! |----------------------------------------------|-------------------------------------------------------|
//! | TINYINT..BIGINT (signed/unsigned), YEAR, BIT | number (BIGINT UNSIGNED up to 18446744073709551615)   |
//! | DECIMAL                                      | string, exact, with the column's scale (`"12.50"`)    |
//! | FLOAT, DOUBLE                                | number (FLOAT at single precision: shortest form)     |
//! | CHAR, VARCHAR, TEXT                          | string (UTF-8)                                        |
//! | BINARY, VARBINARY, BLOB                      | string, base64 (standard alphabet, padded)            |
//! | DATE                                         | `"YYYY-MM-DD"`                                        |
//! | DATETIME                                     | `"YYYY-MM-DDTHH:MM:SS[.ffffff]"` (no zone)            |
//! | TIMESTAMP                                    | `"YYYY-MM-DDTHH:MM:SS[.ffffff]Z"` (UTC)               |
//! | TIME                                         | `"[-]HH:MM:SS[.ffffff]"` (hours may exceed 24)        |
//! | ENUM                                         | string label                                          |
//! | SET                                          | array of labels, in definition order                  |
//! | JSON (MySQL)                                 | the JSON value itself (MariaDB stores JSON as text)   |
//! | VECTOR (MySQL 9)                             | array of numbers (single precision: shortest form)    |
//! | GEOMETRY, POINT, … (spatial)                 | string, base64 of the stored bytes (SRID, then WKB)   |
//! | NULL; zero dates (`0000-00-00`)              | null                                                  |
//!
//! Fractional seconds are printed with exactly the column's precision (`DATETIME(3)` →
//! `.123`); columns without fractions print none.

use std::sync::Arc;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

pub const ENVELOPE_VERSION: u8 = 1;

/// What happened to the row.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Op {
    /// Insert.
    #[serde(rename = "c")]
    Create,
    /// Update.
    #[serde(rename = "u")]
    Update,
    /// Delete.
    #[serde(rename = "d")]
    Delete,
    /// Row read by a snapshot.
    #[serde(rename = "r")]
    Read,
}

/// Where the change came from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SourceInfo {
    /// The MySQL instance's name in Sluice (the task name).
    pub instance: String,
    /// `server_id` of the server that wrote the event.
    pub server_id: u32,
    /// Binlog file of the rows event.
    pub file: String,
    /// Start offset of the rows event in `file`.
    pub pos: u64,
    /// Index of this row inside the rows event.
    pub row: u32,
    /// GTID of the transaction, when the server has GTIDs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gtid: Option<String>,
    /// Commit timestamp of the transaction, milliseconds since the Unix epoch (binlog
    /// timestamps have second precision).
    pub ts_ms: u64,
}

/// One column as the binlog described it when the row was written.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ColumnInfo {
    pub name: String,
    /// SQL type as Sluice understood it: `bigint unsigned`, `decimal(10,2)`, `varchar`,
    /// `text`, `blob`, `datetime(6)`, `enum`, `set`, `json`, ...
    #[serde(rename = "type")]
    pub sql_type: String,
    /// Part of the primary key.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub key: bool,
}

/// A row change. `R` is a row's form: a JSON object read back, or whatever the worker
/// serializes as one without building it (its decoded values beside the column names).
/// `C` is the column list's form: read back, or rendered once per table map by the
/// worker and written into every event of it as it is.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ChangeEvent<R = Map<String, Value>, C = Arc<[ColumnInfo]>> {
    pub v: u8,
    pub source: SourceInfo,
    pub db: String,
    pub table: String,
    pub op: Op,
    /// Primary-key columns and their values (from `after`, or `before` for deletes).
    pub key: Map<String, Value>,
    #[serde(default)]
    pub before: Option<R>,
    #[serde(default)]
    pub after: Option<R>,
    /// Shared by every event of one table map: publishing an event does not copy it.
    pub columns: C,
    /// The external version for Elasticsearch (see [`crate::version`]).
    pub version: u64,
}

impl<R, C> ChangeEvent<R, C> {
    /// The Elasticsearch `_id` of the row: the key's single value as text, or for a
    /// composite key the values joined by `:` with `\` and `:` escaped.
    pub fn document_id(&self) -> Option<String> {
        document_id(&self.key)
    }
}

/// See [`ChangeEvent::document_id`]. `None` when the key is empty or holds null.
pub fn document_id(key: &Map<String, Value>) -> Option<String> {
    id_of(key.values())
}

/// Whether [`document_id`] has an id for `key`, without making it (for every row).
pub fn has_document_id(key: &Map<String, Value>) -> bool {
    !key.is_empty() && key.values().all(|v| !v.is_null())
}

/// The `_id` of a document from its key values, in key order: a single value as text,
/// several joined by `:` with `\` and `:` escaped. `None` when empty or one is null.
pub fn id_of<'a>(values: impl IntoIterator<Item = &'a Value>) -> Option<String> {
    let text = |v: &Value| match v {
        Value::String(s) => Some(s.clone()),
        Value::Number(n) => Some(n.to_string()),
        Value::Bool(b) => Some(b.to_string()),
        Value::Null => None,
        other => Some(other.to_string()),
    };
    let mut values = values.into_iter().peekable();
    let first = text(values.next()?)?;
    if values.peek().is_none() {
        return Some(first);
    }
    let mut id = String::new();
    let escape = |id: &mut String, part: &str| {
        for c in part.chars() {
            if c == '\\' || c == ':' {
                id.push('\\');
            }
            id.push(c);
        }
    };
    escape(&mut id, &first);
    for v in values {
        id.push(':');
        escape(&mut id, &text(v)?);
    }
    Some(id)
}

/// The key values an `_id` made of `n` values stands for (the inverse of [`id_of`]), each
/// as text (MySQL compares text with any column type); `None` when it does not split
/// into `n` parts.
pub fn id_values(id: &str, n: usize) -> Option<Vec<Value>> {
    if n <= 1 {
        return (n == 1).then(|| vec![Value::String(id.to_owned())]);
    }
    let mut parts = vec![String::new()];
    let mut chars = id.chars();
    while let Some(c) = chars.next() {
        match c {
            '\\' => parts.last_mut()?.push(chars.next()?),
            ':' => parts.push(String::new()),
            c => parts.last_mut()?.push(c),
        }
    }
    (parts.len() == n).then(|| parts.into_iter().map(Value::String).collect())
}

/// A document a build read — a pipeline's tables in one consistent snapshot — on the
/// build's own topic; the etl writes it into the version being built, and nowhere else.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BuildDocument {
    pub v: u8,
    pub pipeline: String,
    /// The index version being built.
    pub build: u32,
    /// The document's `_id`.
    pub id: String,
    /// Parent-child mode: a child document's routing (its parent's `_id`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub routing: Option<String>,
    /// The external version: the snapshot's binlog position.
    pub version: u64,
    pub doc: Map<String, Value>,
    /// A pipeline whose documents are its rows: the table's columns, from which the etl
    /// makes the index's mapping (as it does from change events).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub columns: Option<Arc<[ColumnInfo]>>,
    /// A repair of version `build` (the live one, or a kept one it writes), not a
    /// build's document: written if the etl writes that version; `build` 0: to every
    /// version it writes (the delayed job's rebuilt documents).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub repair: bool,
    /// A repair's delete of an orphan (`doc` is empty).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub deleted: bool,
}

/// A DDL statement, published to the instance's schema topic (schema history).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DdlEvent {
    pub v: u8,
    pub source: SourceInfo,
    /// Default database of the statement.
    pub db: String,
    pub ddl: String,
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn ids_for_single_and_composite_keys() {
        let single = json!({"id": 18446744073709551615u64})
            .as_object()
            .unwrap()
            .clone();
        assert_eq!(document_id(&single).unwrap(), "18446744073709551615");
        let composite = json!({"a": "x:y", "b": 7}).as_object().unwrap().clone();
        assert_eq!(document_id(&composite).unwrap(), "x\\:y:7");
        let null = json!({"a": null}).as_object().unwrap().clone();
        assert_eq!(document_id(&null), None);
        let partly_null = json!({"a": 1, "b": null}).as_object().unwrap().clone();
        for key in [single, composite, null, partly_null, Map::new()] {
            assert_eq!(
                has_document_id(&key),
                document_id(&key).is_some(),
                "{key:?}"
            );
        }
    }

    #[test]
    fn ids_split_back_into_their_key_values() {
        let values = [json!("x:y\\z"), json!(7)];
        let id = id_of(&values).unwrap();
        assert_eq!(id_values(&id, 2), Some(vec![json!("x:y\\z"), json!("7")]));
        assert_eq!(id_values("42", 1), Some(vec![json!("42")]));
        assert_eq!(id_values("a:b:c", 2), None);
        assert_eq!(id_values("a", 0), None);
    }

    #[test]
    fn op_codes_match_the_documented_envelope() {
        let e = ChangeEvent {
            v: ENVELOPE_VERSION,
            source: SourceInfo {
                instance: "m1".into(),
                server_id: 1,
                file: "binlog.000001".into(),
                pos: 400,
                row: 0,
                gtid: Some("0-1-9".into()),
                ts_ms: 1000,
            },
            db: "shop".into(),
            table: "t".into(),
            op: Op::Delete,
            key: json!({"id": 1}).as_object().unwrap().clone(),
            before: Some(json!({"id": 1}).as_object().unwrap().clone()),
            after: None,
            columns: vec![ColumnInfo {
                name: "id".into(),
                sql_type: "int".into(),
                key: true,
            }]
            .into(),
            version: 7,
        };
        let v = serde_json::to_value(&e).unwrap();
        assert_eq!(v["op"], "d");
        assert_eq!(v["columns"][0]["type"], "int");
        assert_eq!(serde_json::from_value::<ChangeEvent>(v).unwrap(), e);
    }
}
