//! Removing the tombstones of documents written in parts ([`crate::parts`]) once they
//! are older than the window in which a late write of their document could still come
//! (the pipeline's tombstone retention, like `index.gc_deletes` for versioned deletes).
//!
//! A page of tombstones is found with their sequence numbers, and each is deleted only
//! if it is still the tombstone that was found (`if_seq_no`/`if_primary_term`): a write
//! that brought the document back in between wins, and its delete fails with a conflict
//! that is skipped.

use std::time::Duration;

use reqwest::Method;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use crate::client::{check_name, expect_success, parse};
use crate::{EsClient, EsError};

/// Tombstones found, and deleted, per request.
const PAGE: usize = 1_000;

/// A tombstone as a search found it.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
struct Found {
    #[serde(rename = "_id")]
    id: String,
    #[serde(rename = "_seq_no")]
    seq_no: u64,
    #[serde(rename = "_primary_term")]
    primary_term: u64,
    #[serde(rename = "_routing", default)]
    routing: Option<String>,
}

/// The search of a page of tombstones older than `older_than`.
fn search_body(older_than: Duration) -> Value {
    json!({
        "query": crate::parts::sweep_query(older_than),
        "size": PAGE,
        "_source": false,
        "seq_no_primary_term": true,
        "sort": ["_doc"],
    })
}

fn found(call: &'static str, index: &str, body: &[u8]) -> Result<Vec<Found>, EsError> {
    #[derive(Deserialize)]
    struct Answer {
        hits: Hits,
    }
    #[derive(Deserialize)]
    struct Hits {
        hits: Vec<Found>,
    }
    Ok(parse::<Answer>(call, index, body)?.hits.hits)
}

/// The `_bulk` body deleting each of `found` unless it changed since.
fn encode(index: &str, found: &[Found]) -> Vec<u8> {
    #[derive(Serialize)]
    struct Line<'a> {
        delete: Meta<'a>,
    }
    #[derive(Serialize)]
    struct Meta<'a> {
        _index: &'a str,
        _id: &'a str,
        #[serde(skip_serializing_if = "Option::is_none")]
        routing: Option<&'a str>,
        if_seq_no: u64,
        if_primary_term: u64,
    }
    let mut out = Vec::with_capacity(found.len() * 128);
    for f in found {
        let line = Line {
            delete: Meta {
                _index: index,
                _id: &f.id,
                routing: f.routing.as_deref(),
                if_seq_no: f.seq_no,
                if_primary_term: f.primary_term,
            },
        };
        serde_json::to_writer(&mut out, &line).expect("a delete line serializes");
        out.push(b'\n');
    }
    out
}

/// How many items of a `_bulk` answer deleted their document. Conflicts (written
/// since) and absences (removed since) delete nothing and are no error; any other
/// failure of an item is the first one's.
fn deleted(call: &'static str, index: &str, body: &[u8]) -> Result<u64, EsError> {
    #[derive(Deserialize)]
    struct Answer {
        items: Vec<Item>,
    }
    #[derive(Deserialize)]
    struct Item {
        delete: Outcome,
    }
    #[derive(Deserialize)]
    struct Outcome {
        status: u16,
        #[serde(default)]
        error: Option<Value>,
    }
    let mut n = 0;
    for item in parse::<Answer>(call, index, body)?.items {
        match item.delete.status {
            200 => n += 1,
            404 | 409 => {}
            status => {
                let error = json!({"error": item.delete.error}).to_string();
                return Err(EsError::server(call, index, status, error.as_bytes()));
            }
        }
    }
    Ok(n)
}

/// Whether an index's mapping (`{"mappings": {...}}`) maps `sluice` as documents written
/// in parts do ([`crate::parts::mapping`]).
fn keeps_versions(index: &Value) -> bool {
    let field = &index["mappings"]["properties"][crate::parts::FIELD]["properties"];
    field["p"]["enabled"] == json!(false)
        && field["dead"]["type"] == json!("boolean")
        && field["at"]["type"] == json!("date")
}

impl EsClient {
    /// Deletes the tombstones of documents written in parts left in `index` more than
    /// `older_than` ago, a page at a time, and returns how many went. An index that
    /// does not exist has none.
    pub async fn sweep_tombstones(
        &self,
        index: &str,
        older_than: Duration,
    ) -> Result<u64, EsError> {
        const CALL: &str = "sweep tombstones";
        check_name(CALL, index)?;
        if !self.index_exists(index).await? {
            return Ok(0);
        }
        // Only an index whose `sluice` field is the one documents written in parts keep
        // (a table's own `sluice` column could hold anything, `dead` included).
        let mapping = self.get_mapping(index).await?;
        let fits =
            (mapping.as_object()).is_some_and(|m| !m.is_empty() && m.values().all(keeps_versions));
        if !fits {
            tracing::warn!(index, "not sweeping tombstones: its `sluice` field is not the one of documents written in parts");
            return Ok(0);
        }
        let mut total = 0;
        loop {
            let search = self.request(Method::POST, &[index, "_search"]);
            let answer = self
                .send(CALL, index, search.json(&search_body(older_than)))
                .await?;
            let page = found(CALL, index, &expect_success(CALL, index, answer)?)?;
            if page.is_empty() {
                return Ok(total);
            }
            let bulk = self
                .request(Method::POST, &["_bulk"])
                .header(reqwest::header::CONTENT_TYPE, "application/x-ndjson")
                .body(encode(index, &page));
            let answer = self.send(CALL, index, bulk).await?;
            let n = deleted(CALL, index, &expect_success(CALL, index, answer)?)?;
            total += n;
            // A short page was the last; a page of which nothing went (all written or
            // removed since) would only be found again.
            if page.len() < PAGE || n == 0 {
                return Ok(total);
            }
            // The next search must not find this page's tombstones again.
            self.refresh(index).await?;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_tombstone_is_deleted_only_as_it_was_found() {
        let page = [
            Found {
                id: "7".into(),
                seq_no: 12,
                primary_term: 1,
                routing: None,
            },
            Found {
                id: "a\"b".into(),
                seq_no: 3,
                primary_term: 2,
                routing: Some("r".into()),
            },
        ];
        let body = String::from_utf8(encode("shop_v2", &page)).unwrap();
        assert_eq!(
            body,
            "{\"delete\":{\"_index\":\"shop_v2\",\"_id\":\"7\",\"if_seq_no\":12,\"if_primary_term\":1}}\n\
             {\"delete\":{\"_index\":\"shop_v2\",\"_id\":\"a\\\"b\",\"routing\":\"r\",\"if_seq_no\":3,\"if_primary_term\":2}}\n"
        );
    }

    #[test]
    fn the_search_asks_for_sequence_numbers_of_old_tombstones_only() {
        let body = search_body(Duration::from_secs(7 * 86_400));
        assert_eq!(body["seq_no_primary_term"], json!(true));
        assert_eq!(body["_source"], json!(false));
        let filter = &body["query"]["bool"]["filter"];
        assert_eq!(filter[0], json!({"term": {"sluice.dead": true}}));
        assert_eq!(filter[1]["range"]["sluice.at"]["lt"], json!("now-604800s"));
    }

    #[test]
    fn hits_carry_their_sequence_numbers_and_routing() {
        let body = br#"{"hits":{"hits":[{"_index":"x","_id":"1","_seq_no":5,"_primary_term":1,"_routing":"k","sort":[0]}]}}"#;
        assert_eq!(
            found("t", "x", body).unwrap(),
            vec![Found {
                id: "1".into(),
                seq_no: 5,
                primary_term: 1,
                routing: Some("k".into()),
            }]
        );
    }

    #[test]
    fn only_an_index_mapped_for_parts_is_swept() {
        let ours = json!({"mappings": {"properties": {"sluice": crate::parts::mapping()}}});
        assert!(keeps_versions(&ours));
        let theirs = json!({"mappings": {"properties": {"sluice": {"properties": {
            "dead": {"type": "boolean"}, "at": {"type": "date"}, "p": {"type": "keyword"}}}}}});
        assert!(!keeps_versions(&theirs));
        assert!(!keeps_versions(
            &json!({"mappings": {"properties": {"sluice": {"type": "keyword"}}}})
        ));
        assert!(!keeps_versions(&json!({"mappings": {}})));
    }

    #[test]
    fn conflicts_and_absences_delete_nothing_and_other_failures_stop() {
        let ok = br#"{"items":[{"delete":{"status":200}},{"delete":{"status":409,"error":{"type":"version_conflict_engine_exception"}}},{"delete":{"status":404}}]}"#;
        assert_eq!(deleted("t", "x", ok).unwrap(), 1);
        let bad = br#"{"items":[{"delete":{"status":403,"error":{"type":"security_exception"}}}]}"#;
        let e = deleted("t", "x", bad).unwrap_err();
        assert!(e.to_string().contains("security_exception"), "{e}");
    }
}
