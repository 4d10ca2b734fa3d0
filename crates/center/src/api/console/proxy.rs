//! A follower's console sends the changes its users make to the leader's console: the
//! same call with the same session cookie and CSRF token (sessions live in the meta
//! database every center shares, so the leader knows them), marked as sent on, so that
//! it is never sent on twice. The leader checks the role and records it in the audit log
//! like any call made there.

use axum::body::Bytes;
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use tonic::Status;

use super::super::common::AdminApi;
use super::{failure, guarded};

/// The client a follower sends changes to the leader's console with. Over HTTPS the
/// leader's certificate must name the address it advertises and be signed by a CA in
/// `api.client_ca`, in the chain of `api.tls_cert`, or among the system's.
pub(super) fn client(api: &crate::config::ApiSection) -> crate::error::Result<reqwest::Client> {
    let mut builder = reqwest::Client::builder().timeout(std::time::Duration::from_secs(60));
    for (key, path) in [
        ("api.client_ca", &api.client_ca),
        ("api.tls_cert", &api.tls_cert),
    ] {
        let Some(path) = path else { continue };
        let pem = std::fs::read(path).map_err(|e| {
            crate::error::CenterError::definite(format!("{key}: {}: {e}", path.display()))
        })?;
        for cert in reqwest::Certificate::from_pem_bundle(&pem).unwrap_or_default() {
            builder = builder.add_root_certificate(cert);
        }
    }
    builder.build().map_err(|e| {
        crate::error::CenterError::definite(format!("the console's client of the leader: {e}"))
    })
}

/// The header a call sent on by a follower carries: that follower's id.
pub(super) const SENT_ON_BY: &str = "x-sluice-sent-on-by";

/// The leader's answer to `method` called with `headers` and `body`, after this center
/// was told it does not lead; `None` when the call was already sent on by another
/// center, or the leader's console is not known (a leader that predates it).
pub(super) async fn to_leader(
    api: &AdminApi,
    http: &reqwest::Client,
    method: &str,
    headers: &HeaderMap,
    body: &Bytes,
) -> Option<Response> {
    if headers.contains_key(SENT_ON_BY) {
        return None;
    }
    let me = &api.shared.cfg.center.id;
    let (leader, _) = api.leader().await.ok()??;
    if leader.console.is_empty() || leader.id == *me {
        return None;
    }
    let mut req = http
        .post(format!("{}/api/{method}", leader.console))
        .header(SENT_ON_BY, me.as_str())
        .body(body.to_vec());
    for name in [header::COOKIE, header::CONTENT_TYPE] {
        if let Some(v) = headers.get(&name) {
            req = req.header(name, v);
        }
    }
    if let Some(v) = headers.get("x-csrf-token") {
        req = req.header("x-csrf-token", v);
    }
    let answer = match req.send().await {
        Ok(a) => a,
        Err(e) => {
            return Some(failure(&Status::unavailable(format!(
                "this center does not lead, and the leader's console at {} did not answer: {e}",
                leader.console
            ))))
        }
    };
    let status = StatusCode::from_u16(answer.status().as_u16()).unwrap_or(StatusCode::BAD_GATEWAY);
    let body = answer.bytes().await.unwrap_or_default();
    Some(guarded(
        (status, [(header::CONTENT_TYPE, "application/json")], body).into_response(),
    ))
}
