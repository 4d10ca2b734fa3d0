//! The admin service's gate: every call is recognised as a user with a role, checked
//! against the role its method needs ([`crate::access`]), and — when it changes
//! anything — recorded in the audit log with how it ended, under the identity that was
//! authenticated and the method that was served. Refusals are counted and sampled
//! ([`super::refusals`]), not recorded one by one.
//!
//! It wraps the whole service, below the generated code, so no method can be added that
//! skips it: a method the role table does not know is refused.

use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use tonic::body::Body;
use tonic::codegen::{http, BoxFuture, Service};
use tonic::server::NamedService;
use tonic::{Code, Status};

use crate::access::{self, Role};
use crate::config::AuthMode;
use crate::credentials::{self, constant_time_eq};
use crate::meta::{Audited, Meta};

use super::common::LEADER_HEADER;

/// Who is calling, as the gate recognised them; in every admin request's extensions.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Identity {
    pub user: String,
    pub role: Role,
    /// `token`, `config`, `certificate`, `session` or `open` (see the API's `Identity`).
    pub via: &'static str,
}

/// What a call was about, for its audit entry: set by the method (a source's or a
/// pipeline's name) through the request's extensions, read by the gate once it answered.
#[derive(Debug, Clone, Default)]
pub(crate) struct About(Arc<Mutex<String>>);

impl About {
    pub(crate) fn set(&self, target: &str) {
        *self.0.lock().unwrap_or_else(|e| e.into_inner()) = target.to_owned();
    }

    fn get(&self) -> String {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

/// Names what the call of `req` is about in its audit entry.
pub(super) fn about<T>(req: &tonic::Request<T>, target: &str) {
    if let Some(a) = req.extensions().get::<About>() {
        a.set(target);
    }
}

/// How callers are recognised (`api.auth` and its credentials).
pub(super) struct Gate {
    pub(super) mode: AuthMode,
    /// The configured admin token, acting as `admin_user`.
    pub(super) admin: Option<Arc<str>>,
    /// The workers' token: refused here with a message saying what it is.
    pub(super) worker: Option<Arc<str>>,
    pub(super) admin_user: String,
    pub(super) meta: Meta,
    pub(super) refusals: super::refusals::Refusals,
    /// Unknown API tokens, by the address that presented them.
    pub(super) unknown_tokens: Mutex<super::limit::Limiter>,
    /// Tokens the meta database recognised lately: they pass an address's limit, so
    /// unknown tokens sent from a shared address lock no one with a good token out.
    pub(super) known_tokens: Mutex<KnownTokens>,
}

/// Digests of tokens recognised within [`KnownTokens::FOR`], at most [`KnownTokens::MOST`].
#[derive(Default)]
pub(super) struct KnownTokens(std::collections::HashMap<[u8; 32], std::time::Instant>);

impl KnownTokens {
    const FOR: std::time::Duration = std::time::Duration::from_secs(600);
    const MOST: usize = 4096;

    fn knows(&self, digest: &[u8; 32], now: std::time::Instant) -> bool {
        self.0
            .get(digest)
            .is_some_and(|at| now.duration_since(*at) < Self::FOR)
    }

    fn forget(&mut self, digest: &[u8; 32]) {
        self.0.remove(digest);
    }

    fn learn(&mut self, digest: [u8; 32], now: std::time::Instant) {
        if self.0.len() >= Self::MOST && !self.0.contains_key(&digest) {
            self.0.retain(|_, at| now.duration_since(*at) < Self::FOR);
            if self.0.len() >= Self::MOST {
                let oldest = self.0.iter().min_by_key(|(_, at)| **at).map(|(d, _)| *d);
                oldest.map(|d| self.0.remove(&d));
            }
        }
        self.0.insert(digest, now);
    }
}

impl Gate {
    /// The caller of a request with these headers (and, in mTLS mode, the client
    /// certificate among its extensions), or why it is not let in.
    async fn caller(
        &self,
        headers: &http::HeaderMap,
        ext: &http::Extensions,
    ) -> Result<Identity, Status> {
        let as_admin = |user: &str, via| Identity {
            user: user.to_owned(),
            role: Role::Admin,
            via,
        };
        match self.mode {
            AuthMode::None => return Ok(as_admin("anonymous", "open")),
            // The TLS layer admitted only certificates the CA signed; each acts as the
            // user its subject's CN names.
            AuthMode::Mtls => return self.certificate_caller(ext).await,
            AuthMode::Token => {}
        }
        let given = headers
            .get("authorization")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
            .unwrap_or_default();
        if self
            .admin
            .as_deref()
            .is_some_and(|a| constant_time_eq(given.as_bytes(), a.as_bytes()))
        {
            return Ok(as_admin(&self.admin_user, "config"));
        }
        if self
            .worker
            .as_deref()
            .is_some_and(|w| constant_time_eq(given.as_bytes(), w.as_bytes()))
        {
            return Err(Status::permission_denied(
                "this is the workers' token: it can only report, not administer",
            ));
        }
        if given.starts_with(credentials::TOKEN_PREFIX) {
            return self.token_caller(given, ext).await;
        }
        Err(Status::unauthenticated(
            "missing or wrong bearer token (header `authorization: Bearer <token>`)",
        ))
    }

    /// The user an API token (`slu_…`) names. An address presenting unknown tokens at
    /// speed is refused before the meta database is asked (but not a token it knew lately).
    async fn token_caller(&self, given: &str, ext: &http::Extensions) -> Result<Identity, Status> {
        let client = sluice_runtime::listen::client_block(crate::listeners::client_ip(ext));
        let from = [(format!("token-from:{client}"), super::limit::PER_ADDRESS)];
        let now = std::time::Instant::now();
        let lock = || {
            self.unknown_tokens
                .lock()
                .unwrap_or_else(|e| e.into_inner())
        };
        let known_tokens = || self.known_tokens.lock().unwrap_or_else(|e| e.into_inner());
        let digest = credentials::token_digest(given);
        let known = known_tokens().knows(&digest, now);
        if let Some(wait) = (!known).then(|| lock().refused_for(&from, now)).flatten() {
            return Err(Status::resource_exhausted(format!(
                "too many unknown tokens from this address: try again in {} s",
                wait.as_secs().max(1)
            )));
        }
        match self.meta.token_user(&digest).await {
            Ok(Some((user, role))) => {
                known_tokens().learn(digest, now);
                Ok(Identity {
                    user,
                    role,
                    via: "token",
                })
            }
            Ok(None) => {
                // A token revoked or expired since is no longer one it knew.
                known_tokens().forget(&digest);
                lock().failed(&from, now);
                Err(Status::unauthenticated(
                    "unknown, expired or revoked token: make a new one (`sluicectl tokens create`)",
                ))
            }
            Err(e) => Err(Status::unavailable(format!(
                "cannot check the token now: {e}"
            ))),
        }
    }

    /// The user the client certificate names, with their role.
    async fn certificate_caller(&self, ext: &http::Extensions) -> Result<Identity, Status> {
        let leaf = crate::listeners::client_certificate(ext)
            .ok_or_else(|| Status::unauthenticated("no client certificate"))?;
        let user = credentials::certificate_user(leaf).map_err(Status::unauthenticated)?;
        match self.meta.password_of(&user).await {
            Ok(Some((role, _))) => Ok(Identity {
                user,
                role,
                via: "certificate",
            }),
            Ok(None) => Err(Status::unauthenticated(format!(
                "the client certificate's CN `{user}` names no user: an admin adds it (`sluicectl users put {user} --role viewer|operator|admin`)"
            ))),
            Err(e) => Err(Status::unavailable(format!(
                "cannot look the certificate's user up now: {e}"
            ))),
        }
    }

    /// Lets a call of `method` by `caller` in, or refuses it (counted, and recorded as
    /// the sample of its kind says). `claimed` is the user a caller not recognised said
    /// it was (a login's name), shown in a recorded refusal when it could name a user.
    pub(super) async fn admit(
        &self,
        method: &str,
        peer: String,
        caller: Result<Identity, Status>,
        claimed: Option<&str>,
    ) -> Result<Pass, Status> {
        let method = super::refusals::served(method);
        let mut entry = Audited {
            method: method.to_owned(),
            peer,
            ..Audited::default()
        };
        let audited = access::need(method).is_none_or(|n| n.mutating);
        let caller = match caller {
            Ok(c) => c,
            Err(refused) => {
                entry.user = super::refusals::NOT_RECOGNISED.to_owned();
                if let Some(name) = claimed.filter(|n| credentials::check_user_name(n).is_ok()) {
                    entry.target = format!("as {name}");
                }
                self.refuse(entry, &refused).await;
                return Err(refused);
            }
        };
        entry.user = caller.user.clone();
        entry.role = caller.role.to_string();
        if let Err(why) = access::allows(caller.role, method) {
            let refused = Status::permission_denied(why);
            self.refuse(entry, &refused).await;
            return Err(refused);
        }
        Ok(Pass {
            caller,
            about: About::default(),
            entry,
            audited,
        })
    }

    /// Records how a call let in ended (`failed`: its error), when it is one to record: a
    /// change, or a refusal its method made (sampled like the gate's). A follower's "not
    /// the leader" (`redirected`) is not: sluicectl makes the call again at the leader,
    /// which records it (the console shows the leader's address).
    pub(super) async fn close(&self, pass: Pass, failed: Option<&Status>, redirected: bool) {
        if redirected {
            return;
        }
        let mut entry = pass.entry;
        entry.target = pass.about.get();
        match failed {
            Some(s) if matches!(s.code(), Code::PermissionDenied | Code::Unauthenticated) => {
                self.refuse(entry, s).await;
            }
            _ if pass.audited => self.record(outcome(entry, failed)).await,
            _ => {}
        }
    }

    /// Counts a refusal, and records it when it is its kind's sample.
    async fn refuse(&self, entry: Audited, refused: &Status) {
        let code = format!("{:?}", refused.code());
        let now = std::time::Instant::now();
        let Some(since) = self.refusals.count(&entry.user, &entry.method, &code, now) else {
            return;
        };
        let mut entry = outcome(entry, Some(refused));
        if since > 0 {
            entry.detail = format!(
                "{} ({since} more refused like it since the last entry of its kind)",
                entry.detail
            );
        }
        self.record(entry).await;
    }

    /// Records `entry`; a failure to record is logged, not the call's failure.
    async fn record(&self, entry: Audited) {
        if let Err(e) = self.meta.record_audit(&entry).await {
            tracing::error!(error = %e, user = %entry.user, method = %entry.method, outcome = %entry.outcome, "cannot record an audit entry");
        }
    }
}

/// A call let in by the [`Gate`]: who makes it, and its audit entry to finish.
pub(super) struct Pass {
    pub(super) caller: Identity,
    /// What the call is about, set by its method.
    pub(super) about: About,
    entry: Audited,
    /// Whether its end is recorded (it changes something).
    audited: bool,
}

/// A service behind the [`Gate`].
#[derive(Clone)]
pub(super) struct Guarded<S> {
    inner: S,
    gate: Arc<Gate>,
}

impl<S> Guarded<S> {
    pub(super) fn new(inner: S, gate: Arc<Gate>) -> Self {
        Guarded { inner, gate }
    }
}

impl<S: NamedService> NamedService for Guarded<S> {
    const NAME: &'static str = S::NAME;
}

impl<S> Service<http::Request<Body>> for Guarded<S>
where
    S: Service<http::Request<Body>, Response = http::Response<Body>, Error = Infallible>
        + NamedService
        + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
{
    type Response = http::Response<Body>;
    type Error = Infallible;
    type Future = BoxFuture<Self::Response, Self::Error>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut req: http::Request<Body>) -> Self::Future {
        // The clone that was made ready answers this call (tower's rule).
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let gate = self.gate.clone();
        // In a task of its own: a caller's deadline (`grpc-timeout`) or a reset stream drops
        // the future answering it, and the audit entry of a change already made must not go
        // with it.
        let call = async move {
            let path = req.uri().path();
            // Exactly `/sluice.v1.Admin/<Method>`; the console's `Login` is no gRPC call.
            let method = path
                .strip_prefix(&format!("/{}/", S::NAME))
                .filter(|m| !m.contains('/') && *m != "Login")
                .unwrap_or(path)
                .to_owned();
            let peer = peer(req.extensions());
            let caller = gate.caller(req.headers(), req.extensions()).await;
            let pass = match gate.admit(&method, peer, caller, None).await {
                Ok(pass) => pass,
                Err(refused) => return Ok(refused.into_http()),
            };
            req.extensions_mut().insert(pass.caller.clone());
            req.extensions_mut().insert(pass.about.clone());
            let answer = inner.call(req).await?;
            let redirected = answer.headers().contains_key(LEADER_HEADER);
            // A handler's error is in the answer's extensions; the generated code's own
            // (an unknown method) only in its `grpc-status` header.
            let failed = answer
                .extensions()
                .get::<Status>()
                .cloned()
                .or_else(|| Status::from_header_map(answer.headers()))
                .filter(|s| s.code() != Code::Ok);
            gate.close(pass, failed.as_ref(), redirected).await;
            Ok(answer)
        };
        Box::pin(async move {
            tokio::spawn(call).await.unwrap_or_else(|e| {
                Ok(Status::internal(format!("the call failed: {e}")).into_http())
            })
        })
    }
}

/// `entry` with the call's outcome: `ok`, or the code and message of `failed`.
fn outcome(mut entry: Audited, failed: Option<&Status>) -> Audited {
    match failed {
        None => entry.outcome = "ok".into(),
        Some(s) => {
            entry.outcome = format!("{:?}", s.code());
            entry.detail = s.message().to_owned();
        }
    }
    entry
}

/// The caller's address, as the connection gives it.
fn peer(ext: &http::Extensions) -> String {
    crate::listeners::client_addr(ext)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_known_lately_are_remembered_within_bounds() {
        let now = std::time::Instant::now();
        let mut known = KnownTokens::default();
        known.learn([1; 32], now);
        assert!(known.knows(&[1; 32], now));
        assert!(!known.knows(&[2; 32], now));
        assert!(!known.knows(&[1; 32], now + KnownTokens::FOR));
        for i in 0..KnownTokens::MOST + 10 {
            let mut d = [0; 32];
            d[..8].copy_from_slice(&(i as u64).to_le_bytes());
            known.learn(d, now + std::time::Duration::from_millis(i as u64));
        }
        assert_eq!(known.0.len(), KnownTokens::MOST);
    }
}
