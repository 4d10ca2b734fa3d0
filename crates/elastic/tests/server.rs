//! `EsClient` against a real server: OpenSearch locally (`make stack-up`), or any
//! Elasticsearch 7/8 or OpenSearch 2 cluster named by `ES_URL` (with `ES_USERNAME`
//! and `ES_PASSWORD` when it needs them).
//!
//! Every test works in its own indices (process id + counter) and deletes them at the
//! end, also when it fails. A server that cannot be reached fails the tests.

use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use serde_json::{json, Value};
use sluice_elastic::{
    AliasAction, BulkOp, EsClient, EsClientConfig, EsError, ItemOutcome, MAX_ID_BYTES,
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

/// Partial ("area") updates patch one part of a document in place with a script that
/// keeps each part's version, so the sink must run Painless scripts (the local stack's
/// OpenSearch nodes carry the module: `deploy/install.sh`). A patch lands over an older
/// part and leaves a newer one alone, atomically per document (here `qty` holds the
/// part's version).
#[tokio::test]
async fn the_sink_runs_scripts_that_keep_each_parts_newest_version() {
    with_indices("scripts", 1, |es, names| async move {
        let index = names[0].clone();
        es.create_index(&index, &mapping()).await.unwrap();
        let http = reqwest::Client::new();
        let url = format!("{}/{index}/_update/1", es_url().trim_end_matches('/'));
        let patch = |v: u64, name: &str| {
            let body = json!({
                "scripted_upsert": true,
                "upsert": {},
                "script": {
                    "source": "def had = ctx._source.qty; \
                               if (had == null || params.v > had) { \
                                 ctx._source.name = params.name; ctx._source.qty = params.v; \
                               } else { ctx.op = 'none'; }",
                    "params": {"v": v, "name": name},
                },
            });
            let (http, url) = (http.clone(), url.clone());
            async move {
                let mut req = http.post(&url).json(&body);
                if let Ok(user) = std::env::var("ES_USERNAME") {
                    req = req.basic_auth(user, std::env::var("ES_PASSWORD").ok());
                }
                let r = req.send().await.expect("the sink answers");
                let status = r.status();
                let answer: Value = r.json().await.unwrap();
                assert!(
                    status.is_success(),
                    "a scripted update was refused ({status}): {answer}. The sink needs its \
                     Painless module (`lang-painless`): deploy/install.sh adds it to the \
                     local stack's OpenSearch; restart it with `deploy/stack.sh down \
                     opensearch` and `make stack-up`"
                );
                answer["result"].as_str().unwrap_or_default().to_owned()
            }
        };
        assert_eq!(patch(5, "v5").await, "created");
        assert_eq!(patch(3, "v3").await, "noop", "an older part is left alone");
        assert_eq!(patch(5, "v5 again").await, "noop", "so is the same version");
        assert_eq!(patch(7, "v7").await, "updated");
        let docs = es.mget(&index, &ids(&["1"])).await.unwrap();
        let doc = docs[0].as_ref().unwrap();
        assert_eq!(
            (doc["name"].clone(), doc["qty"].clone()),
            (json!("v7"), json!(7))
        );
    })
    .await;
}
