//! `EsClient` against a real server: OpenSearch locally (`make stack-up`), or any
//! Elasticsearch 7/8 or OpenSearch 2 cluster named by `ES_URL` (with `ES_USERNAME`
//! and `ES_PASSWORD` when it needs them).
//!
//! Every test works in its own indices (process id + counter) and deletes them at the
//! end, also when it fails. A server that cannot be reached fails the tests.

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use serde_json::{json, Value};
use sluice_elastic::{
    AliasAction, BulkOp, EsClient, EsClientConfig, EsError, ItemOutcome, PartsWrite, MAX_ID_BYTES,
};

const DEFAULT_ES_URL: &str = "http://127.0.0.1:19200";

fn es_url() -> String {
    std::env::var("ES_URL").unwrap_or_else(|_| DEFAULT_ES_URL.to_owned())
}

async fn client() -> EsClient {
    let url = es_url();
    let client = EsClient::new(EsClientConfig {
        url: url.parse().expect("ES_URL is a URL"),
        username: std::env::var("ES_USERNAME").ok(),
        password: std::env::var("ES_PASSWORD").ok(),
        request_timeout: Duration::from_secs(30),
        tls: None,
    })
    .expect("client config");
    if let Err(err) = client.ping().await {
        let mut chain = err.to_string();
        let mut source = std::error::Error::source(&err);
        while let Some(s) = source {
            chain.push_str(&format!(": {s}"));
            source = s.source();
        }
        panic!(
            "cannot reach Elasticsearch at {url} ({chain}). Start the local stack with \
             `make stack-up`, or set ES_URL to a running Elasticsearch/OpenSearch."
        );
    }
    client
}

fn unique_index(purpose: &str) -> String {
    static COUNTER: AtomicUsize = AtomicUsize::new(0);
    format!(
        "sluice-elastic-test-{}-{}-{purpose}",
        std::process::id(),
        COUNTER.fetch_add(1, Ordering::Relaxed)
    )
}

/// Runs `body` with `n` fresh index names, then deletes those indices whether the
/// body passed or panicked.
async fn with_indices<F, Fut>(purpose: &str, n: usize, body: F)
where
    F: FnOnce(EsClient, Vec<String>) -> Fut,
    Fut: Future<Output = ()> + Send + 'static,
{
    let es = client().await;
    let names: Vec<String> = (0..n).map(|_| unique_index(purpose)).collect();
    let outcome = tokio::spawn(body(es.clone(), names.clone())).await;
    for name in &names {
        if let Err(err) = es.delete_index(name).await {
            eprintln!("cleanup: {err}");
        }
    }
    if let Err(join_error) = outcome {
        std::panic::resume_unwind(join_error.into_panic());
    }
}

fn mapping() -> Value {
    json!({
        "settings": {"index": {"number_of_shards": 1, "gc_deletes": "120s"}},
        "mappings": {
            "dynamic": "strict",
            "properties": {
                "name": {"type": "keyword"},
                "qty": {"type": "long"}
            }
        }
    })
}

fn index_op(index: &str, id: &str, version: u64, doc: Value) -> BulkOp {
    BulkOp::Index {
        index: index.to_owned(),
        id: id.to_owned(),
        version,
        routing: None,
        doc,
    }
}

fn delete_op(index: &str, id: &str, version: u64) -> BulkOp {
    BulkOp::Delete {
        index: index.to_owned(),
        id: id.to_owned(),
        version,
        routing: None,
    }
}

fn ids(ids: &[&str]) -> Vec<String> {
    ids.iter().map(|s| s.to_string()).collect()
}

#[tokio::test]
async fn ping_reports_distribution_and_version() {
    let info = client().await.ping().await.unwrap();
    assert!(info.major_version().is_some(), "{info:?}");
}

#[tokio::test]
async fn create_index_with_mapping_and_gc_deletes() {
    with_indices("create", 1, |es, names| async move {
        let index = &names[0];
        assert!(!es.index_exists(index).await.unwrap());
        es.create_index(index, &mapping()).await.unwrap();
        assert!(es.index_exists(index).await.unwrap());
        // Creating it again is fine.
        es.create_index(index, &mapping()).await.unwrap();

        let settings = es.get_settings(index).await.unwrap();
        assert_eq!(
            settings[index.as_str()]["settings"]["index"]["gc_deletes"],
            "120s",
            "{settings}"
        );
        es.update_settings(index, &json!({"index": {"gc_deletes": "300s"}}))
            .await
            .unwrap();
        let settings = es.get_settings(index).await.unwrap();
        assert_eq!(
            settings[index.as_str()]["settings"]["index"]["gc_deletes"],
            "300s"
        );

        es.delete_index(index).await.unwrap();
        assert!(!es.index_exists(index).await.unwrap());
        // Deleting a missing index is fine.
        es.delete_index(index).await.unwrap();
    })
    .await;
}

#[tokio::test]
async fn external_versions_never_move_a_document_backwards() {
    with_indices("versions", 1, |es, names| async move {
        let index = names[0].as_str();
        es.create_index(index, &mapping()).await.unwrap();

        let outcomes = es
            .bulk(&[
                index_op(index, "1", 5, json!({"name": "v5", "qty": 5})),
                index_op(index, "2", 1, json!({"name": "v1", "qty": 1})),
            ])
            .await
            .unwrap();
        assert_eq!(outcomes, vec![ItemOutcome::Applied, ItemOutcome::Applied]);

        // Older, equal, newer: in one request, answered in order.
        let outcomes = es
            .bulk(&[
                index_op(index, "1", 3, json!({"name": "v3", "qty": 3})),
                index_op(index, "1", 5, json!({"name": "v5 again", "qty": 5})),
                index_op(index, "2", 7, json!({"name": "v7", "qty": 7})),
            ])
            .await
            .unwrap();
        assert_eq!(
            outcomes,
            vec![
                ItemOutcome::Superseded,
                ItemOutcome::Stale,
                ItemOutcome::Applied
            ]
        );

        let docs = es.mget(index, &ids(&["1", "2"])).await.unwrap();
        assert_eq!(docs[0].as_ref().unwrap()["name"], "v5");
        assert_eq!(docs[1].as_ref().unwrap()["name"], "v7");
    })
    .await;
}

#[tokio::test]
async fn deleted_documents_are_not_resurrected_by_older_writes() {
    with_indices("tombstone", 1, |es, names| async move {
        let index = names[0].as_str();
        es.create_index(index, &mapping()).await.unwrap();

        let outcomes = es
            .bulk(&[
                index_op(index, "1", 1, json!({"name": "a", "qty": 1})),
                delete_op(index, "1", 10),
                // A delete of a document that never existed still leaves a tombstone.
                delete_op(index, "never", 10),
            ])
            .await
            .unwrap();
        assert_eq!(outcomes, vec![ItemOutcome::Applied; 3]);

        // Replays of older changes arrive after the deletes.
        let outcomes = es
            .bulk(&[
                index_op(index, "1", 5, json!({"name": "zombie", "qty": 5})),
                index_op(index, "never", 9, json!({"name": "zombie", "qty": 9})),
                delete_op(index, "1", 10),
            ])
            .await
            .unwrap();
        assert_eq!(
            outcomes,
            vec![
                ItemOutcome::Superseded,
                ItemOutcome::Superseded,
                ItemOutcome::Stale
            ]
        );

        es.refresh(index).await.unwrap();
        assert_eq!(es.count(index).await.unwrap(), 0);
        assert_eq!(
            es.mget(index, &ids(&["1", "never"])).await.unwrap(),
            vec![None, None]
        );

        // A newer write after the delete is applied.
        let outcomes = es
            .bulk(&[index_op(index, "1", 11, json!({"name": "back", "qty": 11}))])
            .await
            .unwrap();
        assert_eq!(outcomes, vec![ItemOutcome::Applied]);
    })
    .await;
}

#[tokio::test]
async fn mget_and_count_after_refresh() {
    with_indices("read", 1, |es, names| async move {
        let index = names[0].as_str();
        es.create_index(index, &mapping()).await.unwrap();

        // Ids that need escaping, and a routed document.
        let odd_id = "quote\" back\\slash\nnewline é☃😀";
        let mut ops: Vec<BulkOp> = (0..20)
            .map(|n| {
                index_op(
                    index,
                    &n.to_string(),
                    1,
                    json!({"name": format!("n{n}"), "qty": n}),
                )
            })
            .collect();
        ops.push(index_op(
            index,
            odd_id,
            1,
            json!({"name": "odd", "qty": -1}),
        ));
        ops.push(BulkOp::Index {
            index: index.to_owned(),
            id: "routed".to_owned(),
            version: 1,
            routing: Some("shard-key".to_owned()),
            doc: json!({"name": "routed", "qty": 0}),
        });
        let outcomes = es.bulk(&ops).await.unwrap();
        assert!(
            outcomes.iter().all(|o| *o == ItemOutcome::Applied),
            "{outcomes:?}"
        );

        es.refresh(index).await.unwrap();
        assert_eq!(es.count(index).await.unwrap(), 22);

        let docs = es
            .mget(index, &ids(&["19", "missing", odd_id, "0"]))
            .await
            .unwrap();
        assert_eq!(
            docs,
            vec![
                Some(json!({"name": "n19", "qty": 19})),
                None,
                Some(json!({"name": "odd", "qty": -1})),
                Some(json!({"name": "n0", "qty": 0})),
            ]
        );
        let docs = es
            .mget_routed(
                index,
                &[("routed".to_owned(), Some("shard-key".to_owned()))],
            )
            .await
            .unwrap();
        assert_eq!(docs, vec![Some(json!({"name": "routed", "qty": 0}))]);
        assert_eq!(es.mget(index, &[]).await.unwrap(), vec![]);
    })
    .await;
}

#[tokio::test]
async fn mapping_errors_are_rejected_with_the_reason_and_spare_the_rest() {
    with_indices("mapping", 1, |es, names| async move {
        let index = names[0].as_str();
        es.create_index(index, &mapping()).await.unwrap();

        let outcomes = es
            .bulk(&[
                index_op(index, "good-1", 1, json!({"name": "a", "qty": 1})),
                index_op(index, "bad", 1, json!({"name": "b", "qty": "many"})),
                // Would fail the whole request on the server: refused locally instead.
                index_op(index, &"x".repeat(MAX_ID_BYTES + 1), 1, json!({"qty": 1})),
                index_op(index, "good-2", 1, json!({"name": "c", "qty": 3})),
            ])
            .await
            .unwrap();
        assert_eq!(outcomes[0], ItemOutcome::Applied);
        match &outcomes[1] {
            ItemOutcome::Rejected { status, reason } => {
                assert_eq!(*status, 400);
                assert!(reason.contains("mapper_parsing_exception"), "{reason}");
                assert!(reason.contains("qty"), "{reason}");
            }
            other => panic!("expected Rejected, got {other:?}"),
        }
        match &outcomes[2] {
            ItemOutcome::Rejected {
                status: 400,
                reason,
            } => {
                assert!(reason.contains("513 bytes"), "{reason}")
            }
            other => panic!("expected Rejected, got {other:?}"),
        }
        assert_eq!(outcomes[3], ItemOutcome::Applied);

        es.refresh(index).await.unwrap();
        assert_eq!(es.count(index).await.unwrap(), 2);
    })
    .await;
}

#[tokio::test]
async fn alias_swap_is_atomic() {
    with_indices("alias", 3, |es, names| async move {
        let (v1, v2, alias) = (names[0].as_str(), names[1].as_str(), names[2].as_str());
        es.create_index(v1, &mapping()).await.unwrap();
        es.create_index(v2, &mapping()).await.unwrap();
        es.bulk(&[
            index_op(v1, "1", 1, json!({"name": "old", "qty": 1})),
            index_op(v2, "1", 1, json!({"name": "new", "qty": 1})),
            index_op(v2, "2", 1, json!({"name": "new", "qty": 2})),
        ])
        .await
        .unwrap();
        es.refresh(v1).await.unwrap();
        es.refresh(v2).await.unwrap();

        assert_eq!(es.alias_targets(alias).await.unwrap(), Vec::<String>::new());
        es.update_aliases(&[AliasAction::Add {
            index: v1.to_owned(),
            alias: alias.to_owned(),
            filter: None,
        }])
        .await
        .unwrap();
        assert_eq!(es.alias_targets(alias).await.unwrap(), vec![v1.to_owned()]);
        assert_eq!(es.count(alias).await.unwrap(), 1);

        // The swap.
        es.update_aliases(&[
            AliasAction::Remove {
                index: v1.to_owned(),
                alias: alias.to_owned(),
            },
            AliasAction::Add {
                index: v2.to_owned(),
                alias: alias.to_owned(),
                filter: None,
            },
        ])
        .await
        .unwrap();
        assert_eq!(es.alias_targets(alias).await.unwrap(), vec![v2.to_owned()]);
        assert_eq!(es.count(alias).await.unwrap(), 2);

        // A swap with a failing action changes nothing.
        let missing = unique_index("missing");
        let err = es
            .update_aliases(&[
                AliasAction::Remove {
                    index: v2.to_owned(),
                    alias: alias.to_owned(),
                },
                AliasAction::Add {
                    index: missing.clone(),
                    alias: alias.to_owned(),
                    filter: None,
                },
            ])
            .await
            .unwrap_err();
        assert!(!err.is_transient(), "{err}");
        assert_eq!(err.status(), Some(404), "{err}");
        assert_eq!(es.alias_targets(alias).await.unwrap(), vec![v2.to_owned()]);

        es.update_aliases(&[AliasAction::Remove {
            index: v2.to_owned(),
            alias: alias.to_owned(),
        }])
        .await
        .unwrap();
        assert_eq!(es.alias_targets(alias).await.unwrap(), Vec::<String>::new());
    })
    .await;
}

#[tokio::test]
async fn errors_name_the_call_and_index_and_say_they_are_definite() {
    with_indices("errors", 1, |es, names| async move {
        let missing = names[0].as_str();
        let err = es.count(missing).await.unwrap_err();
        assert!(
            matches!(err, EsError::Server { status: 404, .. }),
            "{err:?}"
        );
        assert!(!err.is_transient());
        let text = err.to_string();
        assert!(
            text.starts_with(&format!("count on {missing}: HTTP 404")),
            "{text}"
        );
        assert!(text.contains("index_not_found_exception"), "{text}");

        let err = es
            .create_index(
                missing,
                &json!({"mappings": {"properties": {"x": {"type": "no_such_type"}}}}),
            )
            .await
            .unwrap_err();
        assert_eq!(err.status(), Some(400), "{err}");
        assert!(err.to_string().contains(missing), "{err}");
        assert!(!es.index_exists(missing).await.unwrap());
    })
    .await;
}

#[tokio::test]
async fn unreachable_server_is_a_transient_error() {
    // Port 9 (discard) on localhost: nothing listens there on a test machine.
    let es = EsClient::new(EsClientConfig {
        url: "http://127.0.0.1:9".parse().unwrap(),
        username: None,
        password: None,
        request_timeout: Duration::from_secs(5),
        tls: None,
    })
    .unwrap();
    let err = es
        .bulk(&[delete_op("orders_v1", "1", 1)])
        .await
        .unwrap_err();
    assert!(err.is_transient(), "{err:?}");
    assert!(
        err.to_string().starts_with("bulk on _bulk [orders_v1]"),
        "{err}"
    );
}

fn parts_op(index: &str, id: &str, version: u64, write: PartsWrite) -> BulkOp {
    BulkOp::Parts {
        index: index.to_owned(),
        id: id.to_owned(),
        version,
        routing: None,
        write,
    }
}

/// A whole write, sent as the etl sends a likely new document's: a `create` first, the
/// script when a document is there.
fn whole(root: Value, parts: Value) -> PartsWrite {
    whole_at(root, parts, &[])
}

/// A whole write with `at`: parts at versions of their own.
fn whole_at(root: Value, parts: Value, at: &[(&str, u64)]) -> PartsWrite {
    PartsWrite::Whole {
        root: root.as_object().unwrap().clone(),
        parts: parts.as_object().unwrap().clone(),
        at: at.iter().map(|(k, v)| (k.to_string(), *v)).collect(),
        fresh: true,
    }
}

fn patch(parts: Value) -> PartsWrite {
    PartsWrite::Patch {
        parts: parts.as_object().unwrap().clone(),
        at: Default::default(),
    }
}

/// A document's stored source as it is (the client's reads show documents only): its
/// fields, its `sluice` versions and its `_version`.
async fn stored(index: &str, id: &str) -> Option<(Value, Value, u64)> {
    let url = format!("{}/{index}/_doc/{id}", es_url().trim_end_matches('/'));
    let mut req = reqwest::Client::new().get(&url);
    if let Ok(user) = std::env::var("ES_USERNAME") {
        req = req.basic_auth(user, std::env::var("ES_PASSWORD").ok());
    }
    let answer: Value = req.send().await.unwrap().json().await.unwrap();
    let mut doc = answer.get("_source")?.as_object().unwrap().clone();
    let versions = doc.remove("sluice").unwrap_or_default();
    Some((
        Value::Object(doc),
        versions,
        answer["_version"].as_u64().unwrap(),
    ))
}

fn parts_mapping() -> Value {
    json!({
        "settings": {"index": {"number_of_shards": 1}},
        "mappings": {
            "dynamic": "strict",
            "properties": {
                "name": {"type": "keyword"},
                "skus": {"type": "long"},
                "brand": {"type": "keyword"},
                "sluice": sluice_elastic::parts::mapping(),
            }
        }
    })
}

/// Documents written in parts (area updates) run a Painless script that keeps each
/// part's version, so the sink must run Painless (the local stack's OpenSearch nodes carry
/// the module: `deploy/install.sh`). Whatever order whole writes, patches and deletes of
/// one document arrive in, and however often, each part ends as its newest write left it:
/// a patch never lands over a newer whole or part, a whole write keeps a part patched
/// later, a delete leaves a tombstone that no older write brings back.
#[tokio::test]
async fn the_sink_runs_scripts_that_write_documents_in_parts_in_order() {
    with_indices("parts", 1, |es, names| async move {
        let index = names[0].clone();
        es.create_index(&index, &parts_mapping()).await.unwrap();
        let write = |version: u64, w: PartsWrite| {
            let (es, op) = (es.clone(), parts_op(&index, "1", version, w));
            async move {
                let outcome = es.bulk(&[op]).await.unwrap().remove(0);
                if let ItemOutcome::Rejected { reason, .. } = &outcome {
                    assert!(
                        !reason.contains("painless"),
                        "the sink runs no Painless ({reason}): deploy/install.sh adds the \
                         lang-painless module to the local stack's OpenSearch; restart it \
                         with `deploy/stack.sh down opensearch` and `make stack-up`"
                    );
                }
                outcome
            }
        };
        let get = || async {
            let (doc, versions, _) = stored(&index, "1").await?;
            Some((doc, versions))
        };
        let sku = |v: u64| json!({"skus": [v]});
        assert_eq!(
            write(5, patch(sku(5))).await,
            ItemOutcome::Missing,
            "nothing to patch yet"
        );
        assert_eq!(get().await, None, "and the patch created nothing");
        let w10 = whole(
            json!({"name": "a10"}),
            json!({"skus": [10], "brand": "b10"}),
        );
        assert_eq!(write(10, w10.clone()).await, ItemOutcome::Applied);
        // A replay of the same whole write and an older patch change nothing.
        let w10b = whole(json!({"name": "x"}), json!({"skus": [0], "brand": "x"}));
        assert_eq!(write(10, w10b).await, ItemOutcome::Applied);
        assert_eq!(write(8, patch(sku(8))).await, ItemOutcome::Applied);
        let (doc, _) = get().await.unwrap();
        assert_eq!(doc, json!({"name": "a10", "skus": [10], "brand": "b10"}));
        // A newer patch lands; a whole write older than it keeps it, newer than the root
        // replaces the rest.
        write(20, patch(sku(20))).await;
        let w15 = whole(
            json!({"name": "a15"}),
            json!({"skus": [15], "brand": "b15"}),
        );
        write(15, w15).await;
        let (doc, versions) = get().await.unwrap();
        assert_eq!(
            doc,
            json!({"name": "a15", "skus": [20], "brand": "b15"}),
            "{versions}"
        );
        assert_eq!(write(18, patch(sku(18))).await, ItemOutcome::Applied);
        assert_eq!(
            get().await.unwrap().0["skus"],
            json!([20]),
            "an older patch loses"
        );
        let w25 = whole(
            json!({"name": "a25"}),
            json!({"skus": [25], "brand": "b25"}),
        );
        write(25, w25).await;
        assert_eq!(
            get().await.unwrap().0,
            json!({"name": "a25", "skus": [25], "brand": "b25"})
        );
        // An older delete loses; a newer one leaves a tombstone that older writes and
        // patches leave alone.
        write(24, PartsWrite::Delete).await;
        assert_eq!(get().await.unwrap().0["name"], json!("a25"));
        assert_eq!(write(30, PartsWrite::Delete).await, ItemOutcome::Applied);
        let (doc, versions) = get().await.unwrap();
        assert_eq!(doc, json!({}), "a tombstone holds nothing of the document");
        assert!(
            sluice_elastic::parts::is_tombstone(
                &json!({"sluice": versions}).as_object().unwrap().clone()
            ),
            "{versions}"
        );
        assert_eq!(
            es.mget(&index, &ids(&["1"])).await.unwrap(),
            [None],
            "a tombstone is no document to the client's reads"
        );
        assert_eq!(write(40, patch(sku(40))).await, ItemOutcome::Missing);
        write(29, w10).await;
        assert_eq!(
            get().await.unwrap().0,
            json!({}),
            "no older write brings it back"
        );
        let w31 = whole(
            json!({"name": "a31"}),
            json!({"skus": [31], "brand": "b31"}),
        );
        write(31, w31).await;
        assert_eq!(
            get().await.unwrap().0,
            json!({"name": "a31", "skus": [31], "brand": "b31"}),
            "a newer write does"
        );
        let hits = es.mget_hits(&index, &[("1".into(), None)]).await.unwrap();
        let hit = hits[0].as_ref().unwrap();
        assert_eq!(
            (hit.source.clone(), hit.version),
            (json!({"name": "a31", "skus": [31], "brand": "b31"}), 31),
            "the client's reads show the document and its newest version"
        );
        // The alias filter hides tombstones from searches.
        let dead = parts_op(&index, "2", 3, PartsWrite::Delete);
        assert_eq!(es.bulk(&[dead]).await.unwrap(), [ItemOutcome::Applied]);
        es.refresh(&index).await.unwrap();
        let filtered = json!({"query": sluice_elastic::parts::live_filter()});
        let hits = es.search(&index, &filtered).await.unwrap();
        assert_eq!(hits["hits"]["total"]["value"], json!(1), "{hits}");
        let swept = json!({"query": sluice_elastic::parts::sweep_query(Duration::ZERO)});
        let hits = es.search(&index, &swept).await.unwrap();
        assert_eq!(hits["hits"]["hits"][0]["_id"], json!("2"), "{hits}");
        let all = json!({"query": {"match_all": {}}, "version": true});
        let hits = es.search_hits(&index, &all).await.unwrap();
        let found: Vec<&str> = hits.iter().map(|h| h.id.as_str()).collect();
        assert_eq!(found, ["1"], "searches for hits leave tombstones out");
    })
    .await;
}

/// A whole write sent as a `create` where no document is, and as the script where one is
/// (a tombstone included), leaves what the script alone leaves, step by step: documents,
/// versions and outcomes; also over a document written whole with an external version
/// and over one deleted with one (before area updates).
#[tokio::test]
async fn the_sink_runs_scripts_only_where_a_create_finds_a_document_and_ends_the_same() {
    with_indices("parts-create", 2, |es, names| async move {
        for index in &names {
            es.create_index(index, &parts_mapping()).await.unwrap();
            let before = [
                index_op(index, "4", 50, json!({"name": "old", "skus": [50]})),
                delete_op(index, "5", 50),
            ];
            es.bulk(&before).await.unwrap();
        }
        let sku = |v: u64| patch(json!({"skus": [v]}));
        let w = |v: u64, at: &[(&str, u64)]| {
            let parts = json!({"skus": [v], "brand": format!("b{v}")});
            whole_at(json!({"name": format!("a{v}")}), parts, at)
        };
        let steps: Vec<(&str, u64, PartsWrite)> = vec![
            ("1", 10, w(10, &[("skus", 14)])),
            ("1", 10, w(10, &[])),
            ("1", 12, sku(12)),
            ("1", 20, sku(20)),
            ("1", 15, w(15, &[])),
            ("1", 30, PartsWrite::Delete),
            ("1", 29, w(29, &[])),
            ("1", 31, w(31, &[("brand", 40)])),
            ("2", 5, w(5, &[("brand", 4), ("skus", 9)])),
            ("2", 6, PartsWrite::Delete),
            ("2", 7, w(7, &[])),
            ("3", 3, PartsWrite::Delete),
            ("3", 2, w(2, &[])),
            ("3", 4, w(4, &[("skus", 8)])),
            ("4", 45, w(45, &[])),
            ("4", 60, w(60, &[("skus", 70)])),
            ("5", 40, w(40, &[])),
        ];
        for (n, (id, v, write)) in steps.into_iter().enumerate() {
            let both = [write.scripted(), write];
            let mut seen = Vec::new();
            for (index, write) in names.iter().zip(both) {
                let outcome = es.bulk(&[parts_op(index, id, v, write)]).await.unwrap();
                let (doc, mut versions, _) = stored(index, id).await.unwrap_or_default();
                // When a tombstone was left differs by the time between the two writes.
                if let Some(v) = versions.as_object_mut() {
                    v.remove("at");
                }
                seen.push((outcome, doc, versions));
            }
            assert_eq!(
                seen[0], seen[1],
                "step {n} (document {id} at {v}): the script alone, then a create first"
            );
        }
        let (doc, versions, _) = stored(&names[1], "1").await.unwrap();
        assert_eq!(doc, json!({"name": "a31", "skus": [31], "brand": "b31"}));
        assert_eq!(
            versions,
            json!({"v": 40, "p": {}}),
            "written over its tombstone, at the newest of its versions"
        );
        let (_, versions, _) = stored(&names[1], "2").await.unwrap();
        assert_eq!(
            versions,
            json!({"v": 7, "p": {}}),
            "created at 5, then deleted"
        );
    })
    .await;
}

/// Each part keeps the version of the newest change below the root that reached it, so
/// what a document holds does not depend on how changes were batched into writes: a
/// replay that batches them otherwise writes nothing at all.
#[tokio::test]
async fn the_sink_runs_scripts_that_keep_each_parts_own_version() {
    with_indices("parts-at", 1, |es, names| async move {
        let index = names[0].clone();
        es.create_index(&index, &parts_mapping()).await.unwrap();
        let write = |version: u64, w: PartsWrite| {
            let (es, op) = (es.clone(), parts_op(&index, "1", version, w));
            async move { es.bulk(&[op]).await.unwrap().remove(0) }
        };
        // The root changed at 10, a SKU at 14: one whole write.
        let parts = json!({"skus": [14], "brand": "b10"});
        let w = whole_at(json!({"name": "a10"}), parts, &[("skus", 14)]);
        assert_eq!(write(10, w).await, ItemOutcome::Applied);
        let (_, versions, _) = stored(&index, "1").await.unwrap();
        assert_eq!(versions, json!({"v": 10, "p": {"skus": 14}}));
        // A SKU change at 12 is older than the part; the brand's at 12 is newer.
        write(12, patch(json!({"skus": [12]}))).await;
        write(12, patch(json!({"brand": "b12"}))).await;
        let (doc, versions, was) = stored(&index, "1").await.unwrap();
        assert_eq!(doc, json!({"name": "a10", "skus": [14], "brand": "b12"}));
        assert_eq!(versions, json!({"v": 10, "p": {"skus": 14, "brand": 12}}));
        // The root's change at 10 and the SKU's at 14 again, in one write or in two.
        let parts = json!({"skus": [0], "brand": "x"});
        let again = whole_at(json!({"name": "x"}), parts, &[("skus", 14)]);
        assert_eq!(write(10, again).await, ItemOutcome::Applied);
        let at = BTreeMap::from([("skus".to_owned(), 14)]);
        let parts = json!({"skus": [0]}).as_object().unwrap().clone();
        write(14, PartsWrite::Patch { parts, at }).await;
        let (doc, _, now) = stored(&index, "1").await.unwrap();
        assert_eq!(doc, json!({"name": "a10", "skus": [14], "brand": "b12"}));
        assert_eq!(now, was, "a replay writes nothing");
        // A root change at 13 replaces the root and the brand, keeps the newer SKUs.
        let parts = json!({"skus": [13], "brand": "b13"});
        write(13, whole(json!({"name": "a13"}), parts)).await;
        let (doc, versions, _) = stored(&index, "1").await.unwrap();
        assert_eq!(doc, json!({"name": "a13", "skus": [14], "brand": "b13"}));
        assert_eq!(versions, json!({"v": 13, "p": {"skus": 14}}));
    })
    .await;
}

/// Documents written whole before area updates (external versions) are patched above
/// their version and never below it.
#[tokio::test]
async fn the_sink_runs_scripts_that_patch_documents_written_whole_above_their_version() {
    with_indices("parts-old", 1, |es, names| async move {
        let index = names[0].clone();
        es.create_index(&index, &parts_mapping()).await.unwrap();
        let old = index_op(&index, "1", 50, json!({"name": "a", "skus": [50]}));
        assert_eq!(es.bulk(&[old]).await.unwrap(), [ItemOutcome::Applied]);
        for (v, skus) in [(40, 50), (60, 60)] {
            let op = parts_op(&index, "1", v, patch(json!({"skus": [v]})));
            assert_eq!(es.bulk(&[op]).await.unwrap(), [ItemOutcome::Applied]);
            let doc = es
                .mget(&index, &ids(&["1"]))
                .await
                .unwrap()
                .remove(0)
                .unwrap();
            assert_eq!(doc["skus"], json!([skus]), "after a patch at {v}");
        }
        assert_eq!(es.runs_painless().await.unwrap(), Some(true));
    })
    .await;
}

/// The server says whether it runs Painless exactly when a scripted write works there
/// (Elasticsearch 7.17 of the local stack runs none: its module is not published).
#[tokio::test]
async fn the_sink_says_whether_it_runs_scripts() {
    with_indices("painless", 1, |es, names| async move {
        let index = names[0].clone();
        es.create_index(&index, &parts_mapping()).await.unwrap();
        let op = parts_op(&index, "1", 1, PartsWrite::Delete);
        let works = es.bulk(&[op]).await.unwrap() == [ItemOutcome::Applied];
        assert_eq!(es.runs_painless().await.unwrap(), Some(works));
    })
    .await;
}

/// Tombstones of documents written in parts go once past their window, and only the
/// ones still as they were found: a document written again since stays.
#[tokio::test]
async fn the_sink_runs_scripts_whose_tombstones_are_swept_unless_written_since() {
    with_indices("parts-sweep", 1, |es, names| async move {
        let index = names[0].clone();
        let mut body = parts_mapping();
        // Searches see only what a refresh made visible, as the test says when.
        body["settings"]["index"]["refresh_interval"] = json!("-1");
        es.create_index(&index, &body).await.unwrap();
        for id in ["1", "2", "3"] {
            let w = whole(json!({"name": id}), json!({}));
            es.bulk(&[parts_op(&index, id, 5, w)]).await.unwrap();
        }
        for id in ["1", "3"] {
            let op = parts_op(&index, id, 6, PartsWrite::Delete);
            assert_eq!(es.bulk(&[op]).await.unwrap(), [ItemOutcome::Applied]);
        }
        es.refresh(&index).await.unwrap();
        let hour = Duration::from_secs(3600);
        assert_eq!(
            es.sweep_tombstones(&index, hour).await.unwrap(),
            0,
            "too young"
        );
        // Document 3 is written again after the search that finds its tombstone could
        // (no refresh since): its delete is refused, and the write stays.
        let w = whole(json!({"name": "3 again"}), json!({}));
        es.bulk(&[parts_op(&index, "3", 7, w)]).await.unwrap();
        let now = Duration::ZERO;
        assert_eq!(es.sweep_tombstones(&index, now).await.unwrap(), 1);
        assert!(stored(&index, "1").await.is_none(), "the tombstone went");
        let (two, _, _) = stored(&index, "2").await.unwrap();
        assert_eq!(two, json!({"name": "2"}));
        let (three, versions, _) = stored(&index, "3").await.unwrap();
        assert_eq!(
            (three, versions["v"].clone()),
            (json!({"name": "3 again"}), json!(7))
        );
        // Nothing is left to sweep, and an index that is not there has nothing.
        es.refresh(&index).await.unwrap();
        assert_eq!(es.sweep_tombstones(&index, now).await.unwrap(), 0);
        let gone = format!("{index}-none");
        assert_eq!(es.sweep_tombstones(&gone, now).await.unwrap(), 0);
    })
    .await;
}
