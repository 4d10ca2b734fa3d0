//! The pure core of bulk writes: the NDJSON encoder and the per-item response
//! classifier. No I/O here, so both are tested byte for byte.
//!
//! Every index and delete carries an external version (`"version_type":"external"`), so
//! replays, retries and reordering can never move a document backwards: the server
//! applies a write only when its version is higher than the stored one, including
//! the version of a delete's tombstone (kept for `index.gc_deletes`, 60 s by default).
//! Writes in parts keep their versions in the document instead ([`crate::parts`]).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::error::{is_transient_status, EsError, ServerError};
use crate::parts::{PartsWrite, UpdateBody, MISSING, SCRIPT};

/// Longest `_id` the server accepts, in UTF-8 bytes. A longer one fails request
/// validation for the *whole* bulk request, so [`validate_op`] rejects it locally.
pub const MAX_ID_BYTES: usize = 512;

/// Highest external version the server accepts (versions are Java `long`s). A higher
/// one also fails the whole bulk request.
pub const MAX_VERSION: u64 = i64::MAX as u64;

/// One write of a bulk request. `Index` and `Delete` are sent with
/// `"version_type":"external"` and their `version`; `Parts` as a scripted upsert that
/// compares the versions the document keeps (see [`crate::parts`]).
#[derive(Debug, Clone, PartialEq)]
pub enum BulkOp {
    /// Replace the whole document (`index` action).
    Index {
        index: String,
        id: String,
        version: u64,
        routing: Option<String>,
        doc: Value,
    },
    /// Delete the document, leaving a versioned tombstone.
    Delete {
        index: String,
        id: String,
        version: u64,
        routing: Option<String>,
    },
    /// Write a document in parts: whole, some parts, or its tombstone (`update` action).
    Parts {
        index: String,
        id: String,
        version: u64,
        routing: Option<String>,
        write: PartsWrite,
    },
}

impl BulkOp {
    /// Whether it is sent as a `create` (a whole write in parts of a likely new document).
    pub(crate) fn is_create(&self) -> bool {
        matches!(self, BulkOp::Parts { write, .. } if write.is_fresh())
    }

    /// The same operation, a write in parts sent as the script only.
    pub(crate) fn scripted(&self) -> BulkOp {
        let mut op = self.clone();
        if let BulkOp::Parts { write, .. } = &mut op {
            *write = write.scripted();
        }
        op
    }

    pub fn index(&self) -> &str {
        match self {
            BulkOp::Index { index, .. }
            | BulkOp::Delete { index, .. }
            | BulkOp::Parts { index, .. } => index,
        }
    }

    pub fn id(&self) -> &str {
        match self {
            BulkOp::Index { id, .. } | BulkOp::Delete { id, .. } | BulkOp::Parts { id, .. } => id,
        }
    }

    pub fn version(&self) -> u64 {
        match self {
            BulkOp::Index { version, .. }
            | BulkOp::Delete { version, .. }
            | BulkOp::Parts { version, .. } => *version,
        }
    }

    pub fn routing(&self) -> Option<&str> {
        match self {
            BulkOp::Index { routing, .. }
            | BulkOp::Delete { routing, .. }
            | BulkOp::Parts { routing, .. } => routing.as_deref(),
        }
    }

    /// About the bytes it takes in a `_bulk` body, without encoding it: enough to bound a
    /// request by (strings count their length, other values a few bytes; escapes are
    /// not counted).
    pub fn approx_len(&self) -> usize {
        /// The action line's fixed part: `{"index":{"_index":"","_id":"",...}}`.
        const ACTION: usize = 80;
        let line = ACTION + self.index().len() + self.id().len();
        let line = line + self.routing().map_or(0, str::len);
        match self {
            BulkOp::Index { doc, .. } => line + approx_json_len(doc) + 1,
            BulkOp::Delete { .. } => line,
            BulkOp::Parts { write, .. } => line + parts_len(write),
        }
    }
}

/// [`BulkOp::approx_len`]'s body of a write in parts: the script, its parameters.
fn parts_len(write: &PartsWrite) -> usize {
    let fields = |m: &serde_json::Map<String, Value>| {
        2 + m
            .iter()
            .map(|(k, v)| k.len() + 4 + approx_json_len(v))
            .sum::<usize>()
    };
    // A create carries the document alone, no script.
    let script = if write.is_fresh() { 0 } else { SCRIPT.len() };
    script
        + 60
        + match write {
            PartsWrite::Whole {
                root, parts, at, ..
            } => fields(root) + fields(parts) + 30 * at.len(),
            PartsWrite::Patch { parts, at } => fields(parts) + 30 * at.len(),
            PartsWrite::Delete => 0,
        }
}

fn approx_json_len(v: &Value) -> usize {
    match v {
        Value::Null | Value::Bool(_) => 5,
        Value::Number(_) => 12,
        Value::String(s) => s.len() + 2,
        Value::Array(items) => 2 + items.iter().map(|i| approx_json_len(i) + 1).sum::<usize>(),
        Value::Object(fields) => {
            2 + fields
                .iter()
                .map(|(k, v)| k.len() + 4 + approx_json_len(v))
                .sum::<usize>()
        }
    }
}

/// The result of one bulk operation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ItemOutcome {
    /// Written: 200/201. Also a delete answered 404 `"result":"not_found"`: the
    /// document was absent, and the server still recorded a tombstone with the
    /// delete's version (an older index of the same id is refused with 409 until
    /// `index.gc_deletes` expires), so the delete's goal is met.
    Applied,
    /// 409 `version_conflict_engine_exception` with the stored version (document or
    /// tombstone) equal to this one, or not stated: this very change is there already (a
    /// replay). Nothing to do.
    Stale,
    /// 409 with a strictly newer stored version: a later change is there. Nothing to do
    /// either; but a steady run of these on fresh changes means their versions went
    /// backwards (binlog coordinates of another server under the same version epoch).
    Superseded,
    /// 408, 429 (`es_rejected_execution_exception`) or 5xx: send this item again later.
    Retry { status: u16, reason: String },
    /// Any other failure (`mapper_parsing_exception`, `illegal_argument_exception`,
    /// a missing index...): retrying cannot help; dead-letter it with the reason.
    Rejected { status: u16, reason: String },
    /// A patch of parts found no document (or its tombstone): the whole document is to
    /// be written instead.
    Missing,
}

impl ItemOutcome {
    /// Applied or stale: the operation needs no further work.
    pub fn is_done(&self) -> bool {
        matches!(
            self,
            ItemOutcome::Applied | ItemOutcome::Stale | ItemOutcome::Superseded
        )
    }
}

#[derive(Serialize)]
#[serde(rename_all = "lowercase")]
enum ActionLine<'a> {
    Index(ActionMeta<'a>),
    Delete(ActionMeta<'a>),
    Update(UpdateMeta<'a>),
    Create(CreateMeta<'a>),
}

#[derive(Serialize)]
struct ActionMeta<'a> {
    _index: &'a str,
    _id: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    routing: Option<&'a str>,
    version: u64,
    version_type: &'static str,
}

/// A `create`: refused with 409 when any document of the id is there.
#[derive(Serialize)]
struct CreateMeta<'a> {
    _index: &'a str,
    _id: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    routing: Option<&'a str>,
}

#[derive(Serialize)]
struct UpdateMeta<'a> {
    _index: &'a str,
    _id: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    routing: Option<&'a str>,
    retry_on_conflict: u32,
}

/// Appends the NDJSON body of a `POST /_bulk` request for `ops` to `out`: one action
/// line per operation, followed by the document line for index operations. Every
/// line, the last included, ends with `\n`.
///
/// This encodes every operation as given; [`crate::EsClient::bulk`] first sets aside
/// the ones [`validate_op`] refuses, which would fail the whole request.
pub fn encode_bulk(ops: &[BulkOp], out: &mut Vec<u8>) {
    encode_ops(ops.iter(), out);
}

pub(crate) fn encode_ops<'a>(ops: impl IntoIterator<Item = &'a BulkOp>, out: &mut Vec<u8>) {
    for op in ops {
        let meta = ActionMeta {
            _index: op.index(),
            _id: op.id(),
            routing: op.routing(),
            version: op.version(),
            version_type: "external",
        };
        let line = match op {
            BulkOp::Index { .. } => ActionLine::Index(meta),
            BulkOp::Delete { .. } => ActionLine::Delete(meta),
            BulkOp::Parts { write, .. } if write.is_fresh() => ActionLine::Create(CreateMeta {
                _index: meta._index,
                _id: meta._id,
                routing: meta.routing,
            }),
            BulkOp::Parts { .. } => ActionLine::Update(UpdateMeta {
                _index: meta._index,
                _id: meta._id,
                routing: meta.routing,
                retry_on_conflict: crate::parts::RETRY_ON_CONFLICT,
            }),
        };
        // Writing plain structs and `Value`s (string keys only) into a Vec cannot fail.
        serde_json::to_writer(&mut *out, &line).expect("bulk action line serializes");
        out.push(b'\n');
        // Compact JSON escapes control characters, so a document is one line.
        match op {
            BulkOp::Index { doc, .. } => {
                serde_json::to_writer(&mut *out, doc).expect("bulk document serializes");
                out.push(b'\n');
            }
            BulkOp::Parts {
                write:
                    PartsWrite::Whole {
                        root,
                        parts,
                        at,
                        fresh: true,
                    },
                version,
                ..
            } => {
                let doc = crate::parts::created(root, parts, at, *version);
                serde_json::to_writer(&mut *out, &doc).expect("bulk document serializes");
                out.push(b'\n');
            }
            BulkOp::Parts { write, version, .. } => {
                let body = UpdateBody::new(write, *version);
                serde_json::to_writer(&mut *out, &body).expect("bulk update serializes");
                out.push(b'\n');
            }
            BulkOp::Delete { .. } => {}
        }
    }
}

/// Checks what the server validates for the whole bulk request rather than per item:
/// an operation failing here would make every other operation of the request fail
/// with HTTP 400. Returns the reason to reject it with.
pub fn validate_op(op: &BulkOp) -> Option<String> {
    let id = op.id();
    if id.is_empty() {
        return Some("document id is empty".to_owned());
    }
    if id.len() > MAX_ID_BYTES {
        return Some(format!(
            "document id is {} bytes long; Elasticsearch accepts at most {MAX_ID_BYTES}",
            id.len()
        ));
    }
    if op.version() > MAX_VERSION {
        return Some(format!(
            "external version {} is above the maximum {MAX_VERSION}",
            op.version()
        ));
    }
    if op.index().is_empty() {
        return Some("index name is empty".to_owned());
    }
    None
}

#[derive(Deserialize)]
struct BulkResponse {
    items: Vec<BTreeMap<String, BulkItem>>,
}

#[derive(Deserialize)]
struct BulkItem {
    status: u16,
    #[serde(default)]
    result: Option<String>,
    #[serde(default)]
    error: Option<Value>,
}

/// Classifies each item of a successful (HTTP 200) `_bulk` response, in request order.
/// The top-level `errors` flag is ignored: every item is read.
///
/// Fails with [`EsError::ItemCountMismatch`] when the response does not hold exactly
/// `expected` items, and with [`EsError::Malformed`] when it is not a bulk response.
pub fn classify_bulk_response(body: &[u8], expected: usize) -> Result<Vec<ItemOutcome>, EsError> {
    classify_with_target(body, expected, "_bulk")
}

pub(crate) fn classify_with_target(
    body: &[u8],
    expected: usize,
    target: &str,
) -> Result<Vec<ItemOutcome>, EsError> {
    let response: BulkResponse = serde_json::from_slice(body).map_err(|e| {
        EsError::malformed(
            "bulk",
            target,
            format!("not a bulk response ({e}): {}", crate::error::excerpt(body)),
        )
    })?;
    if response.items.len() != expected {
        return Err(EsError::ItemCountMismatch {
            target: target.to_owned(),
            expected,
            actual: response.items.len(),
        });
    }
    response
        .items
        .into_iter()
        .enumerate()
        .map(|(n, item)| {
            let mut entries = item.into_iter();
            match (entries.next(), entries.next()) {
                (Some((action, item)), None) => Ok(classify_item(&action, &item)),
                _ => Err(EsError::malformed(
                    "bulk",
                    target,
                    format!("item {n} does not hold exactly one action"),
                )),
            }
        })
        .collect()
}

/// `(current, provided)` from a version conflict's reason, as Elasticsearch and
/// OpenSearch word it: `…current version [9] is higher or equal to the one provided [4]`.
fn conflicting_versions(reason: &str) -> Option<(u64, u64)> {
    let number_after = |marker: &str| -> Option<u64> {
        let rest = &reason[reason.find(marker)? + marker.len()..];
        rest[..rest.find(']')?].parse().ok()
    };
    Some((
        number_after("current version [")?,
        number_after("the one provided [")?,
    ))
}

fn classify_item(action: &str, item: &BulkItem) -> ItemOutcome {
    let status = item.status;
    let error = item.error.as_ref().map(ServerError::from_error_value);
    let reason = || match &error {
        Some(e) => e.to_string(),
        None => format!("HTTP {status} without an error body"),
    };
    match status {
        200..=299 => ItemOutcome::Applied,
        // The script refused a patch: no document (or a tombstone) to patch.
        400 if action == "update" && error.as_ref().is_some_and(|e| e.reason.contains(MISSING)) => {
            ItemOutcome::Missing
        }
        // An update that lost its races `retry_on_conflict` times: it is not stale (the
        // script compares versions itself), it is to be sent again.
        409 if action == "update" => ItemOutcome::Retry {
            status,
            reason: reason(),
        },
        // A delete of an absent document: the tombstone is written, the goal is met.
        // A 404 *with* an error (index_not_found_exception) is a real failure.
        404 if action == "delete"
            && error.is_none()
            && item.result.as_deref().is_none_or(|r| r == "not_found") =>
        {
            ItemOutcome::Applied
        }
        409 if error
            .as_ref()
            .is_some_and(|e| e.error_type == "version_conflict_engine_exception") =>
        {
            match error.as_ref().and_then(|e| conflicting_versions(&e.reason)) {
                Some((current, provided)) if current > provided => ItemOutcome::Superseded,
                _ => ItemOutcome::Stale,
            }
        }
        s if is_transient_status(s) => ItemOutcome::Retry {
            status,
            reason: reason(),
        },
        _ => ItemOutcome::Rejected {
            status,
            reason: reason(),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_approximate_length_stays_near_the_encoded_one() {
        let big = "x".repeat(10_000);
        let ops = [
            BulkOp::Index {
                index: "shop_v1".into(),
                id: "42".into(),
                version: 7,
                routing: Some("3".into()),
                doc: json!({"name": big, "skus": [{"id": 1, "price": 9.99, "on": true}, {"id": 2, "tag": null}], "n": 12345}),
            },
            BulkOp::Delete {
                index: "shop_v1".into(),
                id: "43".into(),
                version: 8,
                routing: None,
            },
        ];
        for op in &ops {
            let encoded = encode(std::slice::from_ref(op)).len();
            let approx = op.approx_len();
            assert!(
                approx * 2 >= encoded && approx <= encoded * 2,
                "{approx} bytes guessed for {encoded} encoded: {op:?}"
            );
        }
        let small = BulkOp::Index {
            index: "i".into(),
            id: "1".into(),
            version: 1,
            routing: None,
            doc: json!({"a": "b"}),
        };
        assert!(ops[0].approx_len() > 10_000 && small.approx_len() < 200);
    }

    fn encode(ops: &[BulkOp]) -> String {
        let mut out = Vec::new();
        encode_bulk(ops, &mut out);
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn encodes_index_with_and_without_routing() {
        let ops = [
            BulkOp::Index {
                index: "orders_v1".into(),
                id: "42".into(),
                version: 7,
                routing: None,
                doc: json!({"id": 42, "name": "a\nb"}),
            },
            BulkOp::Index {
                index: "orders_v1".into(),
                id: "43".into(),
                version: 8,
                routing: Some("p1".into()),
                doc: json!({}),
            },
        ];
        assert_eq!(
            encode(&ops),
            concat!(
                r#"{"index":{"_index":"orders_v1","_id":"42","version":7,"version_type":"external"}}"#,
                "\n",
                r#"{"id":42,"name":"a\nb"}"#,
                "\n",
                r#"{"index":{"_index":"orders_v1","_id":"43","routing":"p1","version":8,"version_type":"external"}}"#,
                "\n{}\n",
            )
        );
    }

    #[test]
    fn encodes_delete_as_a_single_line() {
        let ops = [
            BulkOp::Delete {
                index: "orders_v1".into(),
                id: "42".into(),
                version: 9_223_372_036_854_775_807,
                routing: Some("7".into()),
            },
            BulkOp::Delete {
                index: "orders_v1".into(),
                id: "43".into(),
                version: 0,
                routing: None,
            },
        ];
        assert_eq!(
            encode(&ops),
            concat!(
                r#"{"delete":{"_index":"orders_v1","_id":"42","routing":"7","version":9223372036854775807,"version_type":"external"}}"#,
                "\n",
                r#"{"delete":{"_index":"orders_v1","_id":"43","version":0,"version_type":"external"}}"#,
                "\n",
            )
        );
    }

    #[test]
    fn escapes_ids_and_routing() {
        let ops = [BulkOp::Delete {
            index: "i".into(),
            id: "a\"b\\c\nd\te\u{1}é☃😀".into(),
            version: 1,
            routing: Some("r\"\n".into()),
        }];
        let encoded = encode(&ops);
        // UTF-8 passes through unescaped; quotes, backslashes, control chars are escaped.
        assert_eq!(
            encoded,
            "{\"delete\":{\"_index\":\"i\",\"_id\":\"a\\\"b\\\\c\\nd\\te\\u0001é☃😀\",\"routing\":\"r\\\"\\n\",\"version\":1,\"version_type\":\"external\"}}\n"
        );
        // One line per action, and it reads back as the same id.
        assert_eq!(encoded.matches('\n').count(), 1);
        let back: Value = serde_json::from_str(encoded.trim_end()).unwrap();
        assert_eq!(back["delete"]["_id"], "a\"b\\c\nd\te\u{1}é☃😀");
    }

    #[test]
    fn empty_input_encodes_nothing_and_appends() {
        let mut out = b"x".to_vec();
        encode_bulk(&[], &mut out);
        assert_eq!(out, b"x");
    }

    #[test]
    fn validation_refuses_what_fails_the_whole_request() {
        let op = |id: &str, version: u64| BulkOp::Delete {
            index: "i".into(),
            id: id.into(),
            version,
            routing: None,
        };
        assert_eq!(validate_op(&op("1", 1)), None);
        assert_eq!(validate_op(&op(&"é".repeat(256), MAX_VERSION)), None); // 512 bytes
        assert!(validate_op(&op(&"é".repeat(257), 1))
            .unwrap()
            .contains("514 bytes"));
        assert!(validate_op(&op("", 1)).unwrap().contains("empty"));
        assert!(validate_op(&op("1", MAX_VERSION + 1))
            .unwrap()
            .contains("9223372036854775808"));
    }

    // Response bodies below are shaped like Elasticsearch 8 / OpenSearch 2 answers.

    #[test]
    fn classifies_each_item_class() {
        let body = br#"{"took":30,"errors":true,"items":[
          {"index":{"_index":"orders_v1","_id":"1","_version":5,"result":"created","_shards":{"total":2,"successful":1,"failed":0},"_seq_no":0,"_primary_term":1,"status":201}},
          {"index":{"_index":"orders_v1","_id":"2","_version":6,"result":"updated","_shards":{"total":2,"successful":1,"failed":0},"_seq_no":1,"_primary_term":1,"status":200}},
          {"index":{"_index":"orders_v1","_id":"3","status":409,"error":{"type":"version_conflict_engine_exception","reason":"[3]: version conflict, current version [9] is higher or equal to the one provided [4]","index_uuid":"aAsFqTI0Tc2W0LCWgPNrOA","shard":"0","index":"orders_v1"}}},
          {"index":{"_index":"orders_v1","_id":"4","status":429,"error":{"type":"es_rejected_execution_exception","reason":"rejected execution of coordinating operation [coordinating_and_primary_bytes=0, replica_bytes=0, all_bytes=0, coordinating_operation_bytes=55, max_coordinating_and_primary_bytes=0]"}}},
          {"index":{"_index":"orders_v1","_id":"5","status":503,"error":{"type":"unavailable_shards_exception","reason":"[orders_v1][0] primary shard is not active Timeout: [1m]"}}},
          {"index":{"_index":"orders_v1","_id":"6","status":400,"error":{"type":"mapper_parsing_exception","reason":"failed to parse field [qty] of type [long] in document with id '6'. Preview of field's value: 'many'","caused_by":{"type":"illegal_argument_exception","reason":"For input string: \"many\""}}}},
          {"delete":{"_index":"orders_v1","_id":"7","_version":12,"result":"not_found","_shards":{"total":2,"successful":1,"failed":0},"_seq_no":5,"_primary_term":1,"status":404}},
          {"delete":{"_index":"orders_v1","_id":"8","_version":13,"result":"deleted","_shards":{"total":2,"successful":1,"failed":0},"_seq_no":6,"_primary_term":1,"status":200}},
          {"delete":{"_index":"orders_v1","_id":"9","status":409,"error":{"type":"version_conflict_engine_exception","reason":"[9]: version conflict, current version [20] is higher or equal to the one provided [20]","index_uuid":"aAsFqTI0Tc2W0LCWgPNrOA","shard":"0","index":"orders_v1"}}}
        ]}"#;
        let outcomes = classify_bulk_response(body, 9).unwrap();
        assert_eq!(
            outcomes,
            vec![
                ItemOutcome::Applied,
                ItemOutcome::Applied,
                ItemOutcome::Superseded,
                ItemOutcome::Retry {
                    status: 429,
                    reason: "es_rejected_execution_exception: rejected execution of coordinating operation [coordinating_and_primary_bytes=0, replica_bytes=0, all_bytes=0, coordinating_operation_bytes=55, max_coordinating_and_primary_bytes=0]".into(),
                },
                ItemOutcome::Retry {
                    status: 503,
                    reason: "unavailable_shards_exception: [orders_v1][0] primary shard is not active Timeout: [1m]".into(),
                },
                ItemOutcome::Rejected {
                    status: 400,
                    reason: "mapper_parsing_exception: failed to parse field [qty] of type [long] in document with id '6'. Preview of field's value: 'many' (caused by illegal_argument_exception: For input string: \"many\")".into(),
                },
                ItemOutcome::Applied,
                ItemOutcome::Applied,
                ItemOutcome::Stale,
            ]
        );
    }

    #[test]
    fn classifies_items_even_when_errors_is_false_and_es7_type_field() {
        // Elasticsearch 7 adds "_type":"_doc"; the flag is not trusted either way.
        let body = br#"{"took":3,"errors":false,"items":[{"index":{"_index":"i","_type":"_doc","_id":"1","_version":1,"result":"created","forced_refresh":false,"_shards":{"total":2,"successful":1,"failed":0},"_seq_no":0,"_primary_term":1,"status":201}},{"index":{"_index":"i","_type":"_doc","_id":"2","status":409,"error":{"type":"version_conflict_engine_exception","reason":"[2]: version conflict"}}}]}"#;
        assert_eq!(
            classify_bulk_response(body, 2).unwrap(),
            vec![ItemOutcome::Applied, ItemOutcome::Stale]
        );
    }

    #[test]
    fn failures_that_are_not_what_they_seem() {
        let body = br#"{"errors":true,"items":[
          {"delete":{"_index":"gone","_id":"1","status":404,"error":{"type":"index_not_found_exception","reason":"no such index [gone]","index":"gone"}}},
          {"index":{"_index":"i","_id":"2","status":404,"error":{"type":"index_not_found_exception","reason":"no such index [i]"}}},
          {"index":{"_index":"i","_id":"3","status":409,"error":{"type":"some_other_conflict","reason":"x"}}},
          {"index":{"_index":"BadName","_id":"4","status":400,"error":{"type":"invalid_index_name_exception","reason":"Invalid index name [BadName], must be lowercase"}}},
          {"index":{"_index":"i","_id":"5","status":500}}
        ]}"#;
        let outcomes = classify_bulk_response(body, 5).unwrap();
        assert_eq!(
            outcomes,
            vec![
                ItemOutcome::Rejected {
                    status: 404,
                    reason: "index_not_found_exception: no such index [gone]".into()
                },
                ItemOutcome::Rejected {
                    status: 404,
                    reason: "index_not_found_exception: no such index [i]".into()
                },
                ItemOutcome::Rejected {
                    status: 409,
                    reason: "some_other_conflict: x".into()
                },
                ItemOutcome::Rejected {
                    status: 400,
                    reason: "invalid_index_name_exception: Invalid index name [BadName], must be lowercase".into()
                },
                ItemOutcome::Retry {
                    status: 500,
                    reason: "HTTP 500 without an error body".into()
                },
            ]
        );
    }

    #[test]
    fn item_count_mismatch_is_a_definite_error() {
        let body = br#"{"took":1,"errors":false,"items":[{"index":{"_index":"i","_id":"1","status":201,"result":"created"}}]}"#;
        let err = classify_bulk_response(body, 2).unwrap_err();
        assert!(matches!(
            err,
            EsError::ItemCountMismatch {
                expected: 2,
                actual: 1,
                ..
            }
        ));
        assert!(!err.is_transient());
        assert_eq!(
            err.to_string(),
            "bulk on _bulk: response has 1 items for 2 operations"
        );
    }

    #[test]
    fn malformed_responses_are_definite_errors() {
        for body in [
            &b"{\"took\":1,\"errors\":false,\"items\":[{\"index\":"[..],
            b"<html>oops</html>",
            br#"{"took":1,"errors":false}"#,
            br#"{"items":[{"index":{"_id":"1"}}]}"#, // no status
            br#"{"items":[{}]}"#,
            br#"{"items":[{"index":{"status":201},"delete":{"status":200}}]}"#,
        ] {
            let err = classify_bulk_response(body, 1).unwrap_err();
            assert!(
                matches!(err, EsError::Malformed { call: "bulk", .. }),
                "{err}"
            );
            assert!(!err.is_transient());
        }
    }

    #[test]
    fn empty_response_for_no_ops() {
        assert_eq!(
            classify_bulk_response(br#"{"took":0,"errors":false,"items":[]}"#, 0).unwrap(),
            vec![]
        );
    }

    #[test]
    fn a_write_in_parts_is_an_update_running_the_script_without_an_external_version() {
        let parts: serde_json::Map<String, Value> =
            json!({"skus": [{"id": 1}]}).as_object().unwrap().clone();
        let op = BulkOp::Parts {
            index: "shop_v1".into(),
            id: "42".into(),
            version: 9,
            routing: Some("3".into()),
            write: PartsWrite::Patch {
                parts,
                at: Default::default(),
            },
        };
        let text = encode(std::slice::from_ref(&op));
        let lines: Vec<Value> = text
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert_eq!(
            lines[0],
            json!({"update": {"_index": "shop_v1", "_id": "42", "routing": "3",
                "retry_on_conflict": crate::parts::RETRY_ON_CONFLICT}})
        );
        assert_eq!(lines[1]["script"]["source"], json!(crate::parts::SCRIPT));
        assert_eq!(lines[1]["script"]["params"]["v"], json!(9));
        assert_eq!(lines.len(), 2);
        let approx = op.approx_len();
        assert!(approx * 2 >= text.len() && approx <= text.len() * 2);
    }

    #[test]
    fn a_patch_without_a_document_is_missing_and_a_lost_race_is_retried() {
        let body = json!({"took": 1, "errors": true, "items": [
            {"update": {"_id": "1", "status": 400, "error": {
                "type": "illegal_argument_exception", "reason": "failed to execute script",
                "caused_by": {"type": "script_exception", "reason": "runtime error",
                    "caused_by": {"type": "illegal_argument_exception", "reason": MISSING}}}}},
            {"update": {"_id": "2", "status": 409, "error": {
                "type": "version_conflict_engine_exception",
                "reason": "[2]: version conflict, required seqNo [5], primary term [1]. current document has seqNo [6] and primary term [1]"}}},
            {"update": {"_id": "3", "status": 200, "result": "noop"}},
            {"update": {"_id": "4", "status": 400, "error": {
                "type": "illegal_argument_exception", "reason": "failed to execute script",
                "caused_by": {"type": "illegal_argument_exception", "reason": "script_lang not supported [painless]"}}}},
            {"index": {"_id": "5", "status": 400, "error": {"type": "illegal_argument_exception", "reason": MISSING}}},
        ]});
        let outcomes = classify_bulk_response(body.to_string().as_bytes(), 5).unwrap();
        assert_eq!(outcomes[0], ItemOutcome::Missing);
        assert!(matches!(
            outcomes[1],
            ItemOutcome::Retry { status: 409, .. }
        ));
        assert_eq!(outcomes[2], ItemOutcome::Applied, "a noop is done");
        assert!(
            matches!(&outcomes[3], ItemOutcome::Rejected { reason, .. } if reason.contains("painless")),
            "{:?}",
            outcomes[3]
        );
        assert!(
            matches!(outcomes[4], ItemOutcome::Rejected { .. }),
            "only updates patch"
        );
    }
}
