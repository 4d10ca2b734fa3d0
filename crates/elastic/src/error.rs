//! Errors of the whole-request calls, and how the server's error bodies are read.

use std::fmt;

use serde_json::Value;

/// What the server said about a failed request or bulk item: the error `type`
/// (`mapper_parsing_exception`, `index_not_found_exception`, ...) and a reason
/// that includes the `caused_by` chain.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerError {
    pub error_type: String,
    pub reason: String,
}

impl ServerError {
    /// Reads an `"error"` value as Elasticsearch and OpenSearch write it: usually an
    /// object with `type`, `reason` and an optional `caused_by`, sometimes a bare
    /// string (`GET /_alias/x` answers `{"error":"alias [x] missing","status":404}`).
    pub fn from_error_value(error: &Value) -> Self {
        match error {
            Value::String(reason) => Self {
                error_type: "unknown".to_owned(),
                reason: reason.clone(),
            },
            Value::Object(obj) => {
                let error_type = obj
                    .get("type")
                    .and_then(Value::as_str)
                    .unwrap_or("unknown")
                    .to_owned();
                let mut reason = obj
                    .get("reason")
                    .and_then(Value::as_str)
                    .unwrap_or("no reason given")
                    .to_owned();
                // Follow `caused_by` a few levels: the root cause is often the useful part
                // ("For input string: \"abc\"" under a mapper_parsing_exception).
                let mut cause = obj.get("caused_by");
                for _ in 0..4 {
                    let Some(Value::Object(c)) = cause else { break };
                    let ty = c.get("type").and_then(Value::as_str).unwrap_or("unknown");
                    let why = c.get("reason").and_then(Value::as_str).unwrap_or("");
                    reason.push_str(&format!(" (caused by {ty}: {why})"));
                    cause = c.get("caused_by");
                }
                Self { error_type, reason }
            }
            other => Self {
                error_type: "unknown".to_owned(),
                reason: other.to_string(),
            },
        }
    }

    /// Reads a whole-request error body. Bodies that are not JSON (a proxy's HTML
    /// page, an empty HEAD answer) are kept as a short excerpt.
    pub fn from_body(body: &[u8]) -> Self {
        if let Ok(value) = serde_json::from_slice::<Value>(body) {
            if let Some(error) = value.get("error") {
                return Self::from_error_value(error);
            }
        }
        Self {
            error_type: "unknown".to_owned(),
            reason: if body.is_empty() {
                "empty response body".to_owned()
            } else {
                excerpt(body)
            },
        }
    }
}

impl fmt::Display for ServerError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.error_type, self.reason)
    }
}

/// The first few hundred bytes of a body, lossily decoded, for error messages.
pub(crate) fn excerpt(body: &[u8]) -> String {
    const MAX: usize = 300;
    let text = String::from_utf8_lossy(&body[..body.len().min(MAX)]).into_owned();
    if body.len() > MAX {
        format!("{text}... ({} bytes)", body.len())
    } else {
        text
    }
}

/// A failed call. Each variant names the call (`bulk`, `create_index`, ...) and its
/// target (the index or alias, or the indices of a bulk request).
///
/// [`EsError::is_transient`] tells the caller whether retrying with backoff can help.
/// Per-item bulk failures are not errors: they are [`crate::ItemOutcome`]s.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum EsError {
    /// The client configuration cannot work (bad URL, zero timeout...). Definite.
    #[error("invalid Elasticsearch client configuration: {0}")]
    Config(String),

    /// The caller passed something the server would misread (an empty or wildcard
    /// index name...). Definite; nothing was sent.
    #[error("{call} on {target}: invalid argument: {detail}")]
    InvalidArgument {
        call: &'static str,
        target: String,
        detail: String,
    },

    /// No HTTP answer: connect error, timeout, connection reset. Transient.
    /// The message ends with the innermost cause (`Connection refused`, `invalid peer
    /// certificate: UnknownIssuer`...): what tells an operator which side to fix.
    #[error("{call} on {target}: no answer from Elasticsearch ({kind}: {})", innermost(.source))]
    Transport {
        call: &'static str,
        target: String,
        kind: &'static str,
        #[source]
        source: reqwest::Error,
    },

    /// The server answered with an error status. Transient for 408, 429 and 5xx.
    #[error("{call} on {target}: HTTP {status}: {error}")]
    Server {
        call: &'static str,
        target: String,
        status: u16,
        error: ServerError,
    },

    /// The server answered success with a body this client cannot read. Definite.
    #[error("{call} on {target}: malformed response: {detail}")]
    Malformed {
        call: &'static str,
        target: String,
        detail: String,
    },

    /// A bulk response does not have one item per operation sent. Definite: the
    /// outcomes cannot be matched to the operations.
    #[error("bulk on {target}: response has {actual} items for {expected} operations")]
    ItemCountMismatch {
        target: String,
        expected: usize,
        actual: usize,
    },
}

impl EsError {
    /// True when the same request may succeed later: connection errors, timeouts,
    /// HTTP 408, 429 and 5xx. Everything else (4xx, malformed answers, bad
    /// configuration or arguments) is definite.
    pub fn is_transient(&self) -> bool {
        match self {
            EsError::Transport { source, .. } => !source.is_builder(),
            EsError::Server { status, .. } => is_transient_status(*status),
            EsError::Config(_)
            | EsError::InvalidArgument { .. }
            | EsError::Malformed { .. }
            | EsError::ItemCountMismatch { .. } => false,
        }
    }

    /// The HTTP status of a [`EsError::Server`] error.
    pub fn status(&self) -> Option<u16> {
        match self {
            EsError::Server { status, .. } => Some(*status),
            _ => None,
        }
    }

    /// The server's error type (`index_not_found_exception`...) of a
    /// [`EsError::Server`] error.
    pub fn server_error_type(&self) -> Option<&str> {
        match self {
            EsError::Server { error, .. } => Some(&error.error_type),
            _ => None,
        }
    }

    pub(crate) fn transport(call: &'static str, target: &str, source: reqwest::Error) -> Self {
        let kind = if source.is_timeout() {
            "timeout"
        } else if source.is_connect() {
            "connect error"
        } else if source.is_builder() {
            "invalid request"
        } else if source.is_body() || source.is_decode() {
            "error reading the response body"
        } else {
            "request error"
        };
        EsError::Transport {
            call,
            target: target.to_owned(),
            kind,
            // The URL never holds credentials (rejected in `EsClient::new`), but it is
            // already in `target`; keep messages short.
            source: source.without_url(),
        }
    }

    pub(crate) fn server(call: &'static str, target: &str, status: u16, body: &[u8]) -> Self {
        EsError::Server {
            call,
            target: target.to_owned(),
            status,
            error: ServerError::from_body(body),
        }
    }

    pub(crate) fn malformed(call: &'static str, target: &str, detail: impl Into<String>) -> Self {
        EsError::Malformed {
            call,
            target: target.to_owned(),
            detail: detail.into(),
        }
    }
}

/// Statuses worth retrying: request timeout, too many requests, server errors.
pub(crate) fn is_transient_status(status: u16) -> bool {
    status == 408 || status == 429 || (500..=599).contains(&status)
}

impl EsError {
    /// What this failure of a first call says is wrong with the `[{prefix}]` settings, if
    /// anything definite: refused credentials (401), a user lacking the right to ask
    /// (403), a certificate not trusted. `None` for what may pass (a cluster down).
    pub fn refused_setting(&self, prefix: &str) -> Option<String> {
        match self {
            EsError::Server { status: 401, .. } => Some(format!(
                "{prefix}.username / {prefix}.password: the cluster refused these credentials ({self})"
            )),
            EsError::Server { status: 403, .. } => Some(format!(
                "{prefix}.username: the cluster knows the user but does not let it ask even who the cluster is (cluster:monitor/main) ({self})"
            )),
            EsError::Transport { source, .. } => {
                let cause = innermost(source);
                let lower = cause.to_ascii_lowercase();
                (lower.contains("certificate") || lower.contains("unknownissuer")).then(|| {
                    format!("{prefix}.tls.ca: the cluster's certificate is not trusted ({cause})")
                })
            }
            _ => None,
        }
    }
}

/// The last error of `e`'s source chain.
fn innermost(e: &(dyn std::error::Error + 'static)) -> String {
    let mut cause = e;
    while let Some(inner) = cause.source() {
        cause = inner;
    }
    cause.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn reads_object_errors_with_caused_by() {
        let e = ServerError::from_error_value(&json!({
            "type": "mapper_parsing_exception",
            "reason": "failed to parse field [n] of type [long]",
            "caused_by": {"type": "illegal_argument_exception", "reason": "For input string: \"x\""}
        }));
        assert_eq!(e.error_type, "mapper_parsing_exception");
        assert_eq!(
            e.reason,
            "failed to parse field [n] of type [long] (caused by illegal_argument_exception: For input string: \"x\")"
        );
    }

    #[test]
    fn reads_string_errors_and_non_json_bodies() {
        let e = ServerError::from_body(br#"{"error":"alias [a] missing","status":404}"#);
        assert_eq!(e.error_type, "unknown");
        assert_eq!(e.reason, "alias [a] missing");

        let e = ServerError::from_body(b"<html>502 Bad Gateway</html>");
        assert_eq!(e.reason, "<html>502 Bad Gateway</html>");
        assert_eq!(ServerError::from_body(b"").reason, "empty response body");
    }

    #[test]
    fn transient_statuses() {
        let err = |status| EsError::server("count", "i", status, b"{}");
        for s in [408, 429, 500, 502, 503, 504] {
            assert!(err(s).is_transient(), "{s}");
        }
        for s in [400, 401, 403, 404, 409, 413] {
            assert!(!err(s).is_transient(), "{s}");
        }
        assert!(!EsError::malformed("count", "i", "x").is_transient());
    }

    #[test]
    fn messages_name_call_target_and_server_reason() {
        let body = br#"{"error":{"type":"index_not_found_exception","reason":"no such index [orders_v3]"},"status":404}"#;
        let e = EsError::server("count", "orders_v3", 404, body);
        assert_eq!(
            e.to_string(),
            "count on orders_v3: HTTP 404: index_not_found_exception: no such index [orders_v3]"
        );
        assert_eq!(e.server_error_type(), Some("index_not_found_exception"));
    }
}
