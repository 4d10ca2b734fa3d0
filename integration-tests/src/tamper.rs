//! Documents changed straight in Elasticsearch, behind Sluice's back: the drift that
//! consistency checks and compares must find.

use serde_json::Value;
use sluice_elastic::BulkOp;

use crate::TestCtx;

/// What [`TestCtx::tamper`] does to one document.
pub enum Tamper {
    Delete,
    /// Sets one field of its `_source` to this value.
    Set(&'static str, Value),
}

impl TestCtx {
    /// Applies `changes` (by `_id`) to documents of `index`, each written one version
    /// above its own (so the write is taken), then refreshes the index. Panics if a
    /// document is not there or a write is refused.
    pub async fn tamper(&self, index: &str, changes: &[(String, Tamper)]) {
        let es = &self.stack.es;
        let refs: Vec<(String, Option<String>)> =
            changes.iter().map(|(id, _)| (id.clone(), None)).collect();
        let hits = es.mget_hits(index, &refs).await.expect("mget");
        let ops: Vec<BulkOp> = changes
            .iter()
            .zip(hits)
            .map(|((id, change), hit)| {
                let mut hit = hit.unwrap_or_else(|| panic!("{index} has no document {id}"));
                let (index, id, version) = (index.to_owned(), id.clone(), hit.version + 1);
                match change {
                    Tamper::Delete => BulkOp::Delete {
                        index,
                        id,
                        version,
                        routing: None,
                    },
                    Tamper::Set(field, value) => {
                        hit.source[*field] = value.clone();
                        BulkOp::Index {
                            index,
                            id,
                            version,
                            routing: None,
                            doc: hit.source,
                        }
                    }
                }
            })
            .collect();
        let outcomes = es.bulk(&ops).await.expect("tampering written");
        assert!(outcomes.iter().all(|o| o.is_done()), "{outcomes:?}");
        es.refresh(index).await.expect("refresh");
    }
}
