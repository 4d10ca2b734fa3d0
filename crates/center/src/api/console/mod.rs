//! The web console every center serves (`center.console_listen`): a page and its script,
//! embedded in the binary, and a JSON door to the admin service behind the same gate as
//! gRPC callers ([`super::guard`]) — same roles, same audit log.
//!
//! A browser logs in with a user's password and gets a session: a random cookie
//! (`HttpOnly`, `Secure`, `SameSite=Strict`; the meta database keeps its SHA-256) and a
//! CSRF token the page sends back in `x-csrf-token` with every call. A new session is made
//! at each login, so a cookie planted before it is worth nothing; it ends after
//! `api.session_lasts`, or once unused for `api.session_idle`, or at logout (recorded).
//! Failed logins are limited per user and client address and per client address
//! ([`super::limit`]; the client as `crate::client_addr` says behind a trusted proxy).

mod dispatch;
mod proxy;

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use axum::body::Bytes;
use axum::extract::{ConnectInfo, Path, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde_json::{json, Value};
use tokio_util::sync::CancellationToken;
use tonic::{Code, Status};

use super::common::{AdminApi, LEADER_HEADER};
use super::guard::{Gate, Identity};
use crate::credentials::{self, constant_time_eq};
use crate::error::{CenterError, Result as CenterResult};

const COOKIE: &str = "sluice_session";

/// The page, its script and its style: written by hand, no build step, nothing fetched
/// from elsewhere (the Content-Security-Policy allows this origin alone).
const INDEX: &str = include_str!("../../../console/index.html");
const SCRIPT: &str = include_str!("../../../console/app.js");
const EDITOR: &str = include_str!("../../../console/editor.js");
const STYLE: &str = include_str!("../../../console/app.css");

struct Console {
    api: AdminApi,
    gate: Arc<Gate>,
    /// Sends a follower's changes to the leader's console.
    http: reqwest::Client,
    limiter: Mutex<super::limit::Limiter>,
    /// Who a client is behind a trusted proxy.
    clients: crate::client_addr::ClientAddr,
    /// Password hashes checked at once.
    hashing: tokio::sync::Semaphore,
}

type Shared = State<Arc<Console>>;

/// Binds `center.console_listen`.
pub(crate) async fn bind(listen: SocketAddr) -> CenterResult<tokio::net::TcpListener> {
    tokio::net::TcpListener::bind(listen).await.map_err(|e| {
        CenterError::definite(format!(
            "center.console_listen: cannot listen on {listen}: {e}"
        ))
    })
}

/// Serves the console until `shutdown`.
pub(super) async fn serve(
    listener: tokio::net::TcpListener,
    api: AdminApi,
    gate: Arc<Gate>,
    tls: Option<tokio_rustls::TlsAcceptor>,
    shutdown: CancellationToken,
) -> CenterResult<()> {
    let http = proxy::client(&api.shared.cfg.api)?;
    let limits = api.shared.cfg.limits;
    let clients = crate::client_addr::ClientAddr::new(
        &api.shared.cfg.api.trusted_proxies,
        &api.shared.cfg.api.client_address_header,
    );
    let console = Arc::new(Console {
        api,
        gate,
        http,
        limiter: Mutex::default(),
        clients,
        hashing: tokio::sync::Semaphore::new(2),
    });
    let proxies = console.clients.shared_peers();
    let app = axum::Router::new()
        .route(
            "/",
            get(|| async { asset("text/html; charset=utf-8", INDEX) }),
        )
        .route(
            "/app.js",
            get(|| async { asset("text/javascript; charset=utf-8", SCRIPT) }),
        )
        .route(
            "/editor.js",
            get(|| async { asset("text/javascript; charset=utf-8", EDITOR) }),
        )
        .route(
            "/app.css",
            get(|| async { asset("text/css; charset=utf-8", STYLE) }),
        )
        .route("/roles", get(roles))
        .route("/session", get(session))
        .route("/login", post(login))
        .route("/logout", post(logout))
        .route("/api/{method}", post(call))
        .with_state(console);
    let addr = listener.local_addr().ok();
    tracing::info!(addr = ?addr, tls = tls.is_some(), "serving the console");
    sluice_runtime::listen::serve_http(listener, app, tls, limits, proxies, "console", shutdown)
        .await;
    Ok(())
}

/// Headers every answer carries: nothing of another origin may run or frame the page.
fn guarded(mut r: Response) -> Response {
    let h = r.headers_mut();
    let csp = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; \
               connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'";
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(csp),
    );
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    h.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    h.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    r
}

fn asset(kind: &'static str, body: &'static str) -> Response {
    guarded(([(header::CONTENT_TYPE, kind)], body).into_response())
}

fn answer(status: StatusCode, body: Value) -> Response {
    guarded(
        (
            status,
            [(header::CONTENT_TYPE, "application/json")],
            body.to_string(),
        )
            .into_response(),
    )
}

/// A refusal or failure as the page shows it: the gRPC code and message, and the
/// leader's address when this center is not it.
fn failure(s: &Status) -> Response {
    let status = match s.code() {
        Code::InvalidArgument => StatusCode::BAD_REQUEST,
        Code::Unauthenticated => StatusCode::UNAUTHORIZED,
        Code::PermissionDenied => StatusCode::FORBIDDEN,
        Code::NotFound => StatusCode::NOT_FOUND,
        Code::FailedPrecondition | Code::AlreadyExists => StatusCode::CONFLICT,
        Code::ResourceExhausted => StatusCode::TOO_MANY_REQUESTS,
        Code::Unavailable => StatusCode::SERVICE_UNAVAILABLE,
        _ => StatusCode::INTERNAL_SERVER_ERROR,
    };
    let leader = s
        .metadata()
        .get(LEADER_HEADER)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default();
    answer(
        status,
        json!({"code": format!("{:?}", s.code()), "message": s.message(), "leader": leader}),
    )
}

/// The session cookie's value, if the request has one.
fn cookie(headers: &HeaderMap) -> Option<&str> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|kv| kv.trim().split_once('='))
        .find(|(k, _)| *k == COOKIE)
        .map(|(_, v)| v)
}

/// The caller of a request with a live session, and the session's CSRF token.
async fn from_session(c: &Console, headers: &HeaderMap) -> Result<(Identity, String), Status> {
    let Some(id) = cookie(headers) else {
        return Err(Status::unauthenticated("not logged in"));
    };
    let idle = c.api.shared.cfg.api.session_idle;
    match c.gate.meta.session(&credentials::token_digest(id), idle).await {
        Ok(Some(s)) => Ok((
            Identity {
                user: s.user,
                role: s.role,
                via: "session",
            },
            s.csrf,
        )),
        Ok(None) => Err(Status::unauthenticated(
            "the session ended (logged out, expired, unused too long, or its user removed): log in again",
        )),
        Err(e) => Err(Status::unavailable(format!("cannot read the session: {e}"))),
    }
}

/// Whether the request carries the session's CSRF token.
fn csrf_ok(headers: &HeaderMap, csrf: &str) -> bool {
    headers
        .get("x-csrf-token")
        .and_then(|v| v.to_str().ok())
        .is_some_and(|given| constant_time_eq(given.as_bytes(), csrf.as_bytes()))
}

fn csrf_refused() -> Status {
    Status::permission_denied("missing or wrong x-csrf-token: reload the console")
}

/// What each method needs, for the page to show only the controls its user may use.
async fn roles() -> Response {
    let table: serde_json::Map<String, Value> = dispatch::METHODS
        .iter()
        .filter_map(|m| {
            let need = crate::access::need(m)?;
            Some((
                (*m).to_owned(),
                json!({"role": need.role.as_str(), "mutating": need.mutating}),
            ))
        })
        .collect();
    answer(StatusCode::OK, Value::Object(table))
}

async fn session(State(c): Shared, headers: HeaderMap) -> Response {
    match from_session(&c, &headers).await {
        Ok((caller, csrf)) => answer(
            StatusCode::OK,
            json!({"user": caller.user, "role": caller.role.as_str(), "csrf": csrf}),
        ),
        Err(s) => failure(&s),
    }
}

/// `POST /login` `{"user", "password"}`: a new session, or why not.
async fn login(
    State(c): Shared,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    // JSON only: a form another site posts (`text/plain`) cannot log a browser in.
    let json_body = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|t| t.starts_with("application/json"));
    let form: Option<Value> = serde_json::from_slice(&body).ok().filter(|_| json_body);
    let Some(form) = form else {
        return failure(&Status::invalid_argument(
            "a login is JSON: {\"user\": …, \"password\": …}",
        ));
    };
    let user = form["user"].as_str().unwrap_or_default().to_owned();
    let password = form["password"].as_str().unwrap_or_default();
    let client = c.clients.of(peer.ip(), &headers);
    let keys = super::limit::login_keys(&user, client);
    // The attempt counts as a failure from the start, so attempts made at once cannot
    // each pass the limit; a success takes it back.
    let refused_for = {
        let mut limiter = c.limiter.lock().unwrap_or_else(|e| e.into_inner());
        let refused = limiter.refused_for(&keys, Instant::now());
        if refused.is_none() {
            limiter.failed(&keys, Instant::now());
        }
        refused
    };
    let outcome = match refused_for {
        Some(wait) => Err(Status::resource_exhausted(format!(
            "too many failed logins: try again in {} s",
            wait.as_secs().max(1)
        ))),
        None => check_password(&c, &user, password).await,
    };
    let caller = outcome.clone().map(|role| Identity {
        user: user.clone(),
        role,
        via: "session",
    });
    // Recorded like every call that changes something: a login is one.
    let claimed = Some(user.as_str());
    let pass = match c
        .gate
        .admit("Login", client_of(peer, client), caller, claimed)
        .await
    {
        Ok(pass) => pass,
        Err(s) => return failure(&s),
    };
    pass.about.set(&user);
    let opened = open_session(&c, &user).await;
    c.gate.close(pass, opened.as_ref().err(), false).await;
    let (id, csrf) = match opened {
        Ok(v) => v,
        Err(s) => return failure(&s),
    };
    {
        let mut limiter = c.limiter.lock().unwrap_or_else(|e| e.into_inner());
        limiter.forgive(&keys[1..]);
        limiter.succeeded(&keys[0].0);
    }
    let role = outcome.map(|r| r.as_str()).unwrap_or_default();
    let mut r = answer(
        StatusCode::OK,
        json!({"user": user, "role": role, "csrf": csrf}),
    );
    let set = format!(
        "{COOKIE}={id}; Path=/; HttpOnly; Secure; SameSite=Strict; Max-Age={}",
        c.api.shared.cfg.api.session_lasts.as_secs()
    );
    if let Ok(v) = HeaderValue::from_str(&set) {
        r.headers_mut().insert(header::SET_COOKIE, v);
    }
    r
}

/// The role of `user` when `password` is theirs. An unknown user, or one without a
/// password, costs a hash too: how long a refusal takes says nothing of who exists.
async fn check_password(
    c: &Console,
    user: &str,
    password: &str,
) -> Result<crate::access::Role, Status> {
    let wrong = || Status::unauthenticated("wrong user name or password");
    let stored = c
        .gate
        .meta
        .password_of(user)
        .await
        .map_err(|e| Status::unavailable(format!("cannot check the password now: {e}")))?;
    let (role, hash) = match stored {
        Some((role, Some(hash))) => (Some(role), hash),
        _ => (None, dummy_hash().to_owned()),
    };
    // Argon2 takes tens of milliseconds and 19 MiB: off the async threads, two at once.
    let _turn = c
        .hashing
        .acquire()
        .await
        .map_err(|e| Status::internal(e.to_string()))?;
    let password = password.to_owned();
    let matches =
        tokio::task::spawn_blocking(move || credentials::verify_password(&password, &hash))
            .await
            .map_err(|e| Status::internal(format!("checking the password failed: {e}")))?;
    match role {
        Some(role) if matches => Ok(role),
        _ => Err(wrong()),
    }
}

/// A hash no password is checked against but for its cost.
fn dummy_hash() -> &'static str {
    static HASH: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    HASH.get_or_init(|| credentials::hash_password("no user has this password").unwrap_or_default())
}

/// A new session of `user`: the cookie's value and the CSRF token.
async fn open_session(c: &Console, user: &str) -> Result<(String, String), Status> {
    let (id, digest) = credentials::new_token();
    let (csrf, _) = credentials::new_token();
    c.gate
        .meta
        .open_session(&digest, user, &csrf, c.api.shared.cfg.api.session_lasts)
        .await
        .map_err(|e| Status::unavailable(format!("cannot open a session now: {e}")))?;
    Ok((id, csrf))
}

/// `POST /logout`: ends the session (recorded, as its user).
async fn logout(
    State(c): Shared,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    headers: HeaderMap,
) -> Response {
    let session = from_session(&c, &headers).await;
    let caller = match &session {
        Ok((_, csrf)) if !csrf_ok(&headers, csrf) => Err(csrf_refused()),
        Ok((caller, _)) => Ok(caller.clone()),
        Err(s) => Err(s.clone()),
    };
    let client = c.clients.of(peer.ip(), &headers);
    let pass = match c
        .gate
        .admit("Logout", client_of(peer, client), caller, None)
        .await
    {
        Ok(pass) => pass,
        Err(s) => return failure(&s),
    };
    let closed = match cookie(&headers) {
        Some(id) => c
            .gate
            .meta
            .close_session(&credentials::token_digest(id))
            .await
            .map_err(|e| Status::unavailable(e.to_string())),
        None => Ok(()),
    };
    c.gate.close(pass, closed.as_ref().err(), false).await;
    if let Err(s) = closed {
        return failure(&s);
    }
    let mut r = answer(StatusCode::OK, json!({}));
    let clear = format!("{COOKIE}=; Path=/; HttpOnly; Secure; SameSite=Strict; Max-Age=0");
    if let Ok(v) = HeaderValue::from_str(&clear) {
        r.headers_mut().insert(header::SET_COOKIE, v);
    }
    r
}

/// The peer as the audit log shows it: the connection's address, and the client's when a
/// trusted proxy named another.
fn client_of(peer: SocketAddr, client: std::net::IpAddr) -> String {
    if client == peer.ip() {
        peer.to_string()
    } else {
        format!("{client} via {peer}")
    }
}

/// `POST /api/{method}`: an admin call as the session's user.
async fn call(
    State(c): Shared,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    Path(method): Path<String>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let session = from_session(&c, &headers).await;
    let caller = match &session {
        Ok((_, csrf)) if !csrf_ok(&headers, csrf) => Err(csrf_refused()),
        Ok((caller, _)) => Ok(caller.clone()),
        Err(s) => Err(s.clone()),
    };
    let claimed = session.as_ref().ok().map(|(c, _)| c.user.as_str());
    let client = c.clients.of(peer.ip(), &headers);
    let pass = match c
        .gate
        .admit(&method, client_of(peer, client), caller, claimed)
        .await
    {
        Ok(pass) => pass,
        Err(s) => return failure(&s),
    };
    let mut extensions = tonic::Extensions::new();
    extensions.insert(pass.caller.clone());
    extensions.insert(pass.about.clone());
    let answered = dispatch::call(&c.api, &method, &body, extensions).await;
    let failed = answered.as_ref().err();
    let redirected = failed.is_some_and(|s| s.metadata().get(LEADER_HEADER).is_some());
    c.gate.close(pass, failed, redirected).await;
    if redirected {
        if let Some(r) = proxy::to_leader(&c.api, &c.http, &method, &headers, &body).await {
            return r;
        }
    }
    match answered {
        Ok(json) => guarded(([(header::CONTENT_TYPE, "application/json")], json).into_response()),
        Err(s) => failure(&s),
    }
}
