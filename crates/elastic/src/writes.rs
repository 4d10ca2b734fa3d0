//! [`EsClient::bulk`]: one `_bulk` request of every valid operation, and a second of the
//! writes in parts whose `create` found a document, sent again as the script.

use std::time::Instant;

use reqwest::Method;

use crate::bulk::{classify_with_target, encode_ops, validate_op, BulkOp, ItemOutcome};
use crate::client::{expect_success, EsClient};
use crate::error::EsError;

impl EsClient {
    /// `POST /_bulk`: one outcome per operation, in the order of `ops`.
    ///
    /// Operations that would fail the whole request's validation (see
    /// [`crate::validate_op`]) are not sent and come back `Rejected` with status 400.
    /// A whole-request failure (connection error, timeout, HTTP 429/5xx, any other
    /// non-200) is an [`EsError`]; then none of the outcomes are known, but every
    /// operation is safe to send again thanks to external versions (or, in parts, the
    /// versions the documents keep). A write in parts sent as a `create` that found a
    /// document is sent again as the script in a second request, and its outcome is that
    /// one's.
    pub async fn bulk(&self, ops: &[BulkOp]) -> Result<Vec<ItemOutcome>, EsError> {
        let mut outcomes: Vec<Option<ItemOutcome>> = ops
            .iter()
            .map(|op| {
                validate_op(op).map(|reason| ItemOutcome::Rejected {
                    status: 400,
                    reason: format!("refused before sending: {reason}"),
                })
            })
            .collect();
        let to_send: Vec<&BulkOp> = ops
            .iter()
            .zip(&outcomes)
            .filter(|(_, o)| o.is_none())
            .map(|(op, _)| op)
            .collect();
        if to_send.is_empty() {
            return Ok(outcomes.into_iter().flatten().collect());
        }

        let sent = self.send_bulk(&to_send).await?;
        let mut sent = sent.into_iter();
        for slot in outcomes.iter_mut().filter(|o| o.is_none()) {
            *slot = sent.next();
        }
        let mut outcomes: Vec<ItemOutcome> = outcomes.into_iter().flatten().collect();
        debug_assert_eq!(outcomes.len(), ops.len());

        // A `create` that found a document (409): the write goes again as the script.
        let exists: Vec<usize> = (0..ops.len())
            .filter(|&i| ops[i].is_create())
            .filter(|&i| matches!(outcomes[i], ItemOutcome::Stale | ItemOutcome::Superseded))
            .collect();
        if !exists.is_empty() {
            let again: Vec<BulkOp> = exists.iter().map(|&i| ops[i].scripted()).collect();
            match self.send_bulk(&again.iter().collect::<Vec<_>>()).await {
                Ok(answered) => {
                    for (i, outcome) in exists.into_iter().zip(answered) {
                        outcomes[i] = outcome;
                    }
                }
                // The first request's outcomes stand; these go again with the caller's
                // retries (sent again, each is a create first once more).
                Err(e) => {
                    for i in exists {
                        outcomes[i] = ItemOutcome::Retry {
                            status: e.status().unwrap_or(503),
                            reason: format!(
                                "sent again as the script after its create found a document: {e}"
                            ),
                        };
                    }
                }
            }
        }
        Ok(outcomes)
    }

    /// One `POST /_bulk` of `ops` (each valid), its items classified in order.
    async fn send_bulk(&self, ops: &[&BulkOp]) -> Result<Vec<ItemOutcome>, EsError> {
        const CALL: &str = "bulk";
        let target = bulk_target(ops);
        let mut body = Vec::with_capacity(ops.len() * 256);
        encode_ops(ops.iter().copied(), &mut body);
        let body_bytes = body.len();
        let started = Instant::now();
        let request = self
            .request(Method::POST, &["_bulk"])
            .header(reqwest::header::CONTENT_TYPE, "application/x-ndjson")
            .body(body);
        let answer = self.send(CALL, &target, request).await?;
        let response = expect_success(CALL, &target, answer)?;
        let outcomes = classify_with_target(&response, ops.len(), &target)?;
        tracing::debug!(
            target = %target,
            ops = ops.len(),
            body_bytes,
            elapsed_ms = started.elapsed().as_millis() as u64,
            not_done = outcomes.iter().filter(|o| !o.is_done()).count(),
            "bulk request answered"
        );
        Ok(outcomes)
    }
}

/// Names the distinct indices of a bulk request for error messages.
fn bulk_target(ops: &[&BulkOp]) -> String {
    let mut indices: Vec<&str> = ops.iter().map(|op| op.index()).collect();
    indices.sort_unstable();
    indices.dedup();
    const SHOWN: usize = 5;
    let mut target = format!("_bulk [{}", indices[..indices.len().min(SHOWN)].join(", "));
    if indices.len() > SHOWN {
        target.push_str(&format!(", and {} more", indices.len() - SHOWN));
    }
    target.push(']');
    target
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bulk_target_lists_distinct_indices() {
        let op = |index: &str| BulkOp::Delete {
            index: index.into(),
            id: "1".into(),
            version: 1,
            routing: None,
        };
        let ops = [op("b"), op("a"), op("b")];
        let refs: Vec<&BulkOp> = ops.iter().collect();
        assert_eq!(bulk_target(&refs), "_bulk [a, b]");
        let ops: Vec<BulkOp> = (0..7).map(|n| op(&format!("i{n}"))).collect();
        let refs: Vec<&BulkOp> = ops.iter().collect();
        assert_eq!(bulk_target(&refs), "_bulk [i0, i1, i2, i3, i4, and 2 more]");
    }
}
