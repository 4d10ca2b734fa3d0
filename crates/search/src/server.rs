//! The HTTP/JSON endpoints (described in `openapi.json`, served at `/openapi.json`).

use std::collections::HashMap;
use std::num::NonZeroU32;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Path, Query, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use governor::{DefaultDirectRateLimiter, Quota};
use serde::Deserialize;
use serde_json::{json, Map, Value};
use sha2::{Digest, Sha256};
use sluice_model::SourcePoint;
use subtle::ConstantTimeEq;
use tokio::time::Instant;

use crate::config::{AppConfig, SearchSection, TemplateConfig};
use crate::wait::{standing, Standing};
use crate::{Cluster, View};

/// The OpenAPI description of these endpoints.
pub const OPENAPI: &str = include_str!("openapi.json");

/// The search API: the applications, templates and limits of the configuration, over
/// Elasticsearch and what the cluster tells.
pub struct SearchApi<C> {
    cfg: SearchSection,
    es: sluice_elastic::EsClient,
    cluster: C,
    apps: Vec<App>,
    templates: HashMap<String, TemplateConfig>,
    /// Per alias: when the last refresh that made its applied writes searchable began.
    /// Requests waiting at once share one refresh rather than each forcing their own.
    refreshed: std::sync::Mutex<HashMap<String, Arc<tokio::sync::Mutex<Option<Instant>>>>>,
}

struct App {
    cfg: AppConfig,
    digest: [u8; 32],
    limiter: DefaultDirectRateLimiter,
    /// What it may read of a document by id: what its templates show.
    fields: crate::fields::Fields,
}

impl<C: Cluster> SearchApi<C> {
    /// The API of a validated `[search]` section.
    pub fn new(cfg: SearchSection, es: sluice_elastic::EsClient, cluster: C) -> Self {
        let templates: HashMap<String, TemplateConfig> = (cfg.templates.iter())
            .map(|t| (t.name.clone(), t.clone()))
            .collect();
        let apps = cfg
            .apps
            .iter()
            .map(|a| {
                let rate = NonZeroU32::new(a.rate_per_sec).unwrap_or(NonZeroU32::MIN);
                let burst = a.burst.and_then(NonZeroU32::new).unwrap_or(rate);
                App {
                    cfg: a.clone(),
                    digest: hex32(&a.token_sha256).unwrap_or_default(),
                    limiter: DefaultDirectRateLimiter::direct(
                        Quota::per_second(rate).allow_burst(burst),
                    ),
                    fields: crate::fields::Fields::shown_by(
                        a.templates.iter().filter_map(|t| templates.get(t)),
                    ),
                }
            })
            .collect();
        Self {
            cfg,
            es,
            cluster,
            apps,
            templates,
            refreshed: Default::default(),
        }
    }

    /// The routes, for [`axum::serve`].
    pub fn router(self: Arc<Self>) -> Router {
        Router::new()
            .route("/openapi.json", get(openapi))
            .route("/v1/aliases/{alias}/search", post(search::<C>))
            .route("/v1/aliases/{alias}/documents/{id}", get(document::<C>))
            .route("/v1/aliases/{alias}/position", get(position::<C>))
            .with_state(self)
    }

    /// The application whose token `headers` carry, once the rate limit lets it in (a
    /// refusal counted).
    fn app(&self, headers: &HeaderMap) -> Result<&App, Refusal> {
        let found = self.authenticated(headers);
        if let Err(r) = &found {
            let app = r.body.get("app").and_then(Value::as_str).unwrap_or("-");
            crate::metrics::request(app, r.code());
        }
        found
    }

    fn authenticated(&self, headers: &HeaderMap) -> Result<&App, Refusal> {
        let token = headers
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
            .ok_or_else(|| {
                Refusal::new(
                    StatusCode::UNAUTHORIZED,
                    "unauthenticated",
                    "no application token (header `authorization: Bearer <token>`)",
                )
            })?;
        let digest: [u8; 32] = Sha256::digest(token.trim().as_bytes()).into();
        // Every application is compared, in constant time, whichever matches.
        let mut found = None;
        for app in &self.apps {
            if bool::from(app.digest.ct_eq(&digest)) {
                found = Some(app);
            }
        }
        let app = found.ok_or_else(|| {
            Refusal::new(
                StatusCode::UNAUTHORIZED,
                "unauthenticated",
                "the token is no application's",
            )
        })?;
        if let Err(not_until) = app.limiter.check() {
            let wait = not_until.wait_time_from(governor::clock::Clock::now(
                &governor::clock::DefaultClock::default(),
            ));
            return Err(Refusal::new(
                StatusCode::TOO_MANY_REQUESTS,
                "rate_limited",
                &format!(
                    "application `{}` may make {} requests per second; retry in {} ms",
                    app.cfg.name,
                    app.cfg.rate_per_sec,
                    wait.as_millis().max(1)
                ),
            )
            .with("retry_after_ms", json!(wait.as_millis().max(1) as u64))
            .with("app", json!(app.cfg.name)));
        }
        Ok(app)
    }

    /// The pipeline and source behind `alias`, which `app` must be allowed.
    fn target(&self, app: &App, alias: &str, view: &View) -> Result<crate::AliasTarget, Refusal> {
        if !app.cfg.aliases.iter().any(|a| a == alias) {
            return Err(Refusal::new(
                StatusCode::FORBIDDEN,
                "alias_not_allowed",
                &format!(
                    "application `{}` may not search `{alias}` (it may search: {})",
                    app.cfg.name,
                    app.cfg.aliases.join(", ")
                ),
            ));
        }
        view.aliases.get(alias).cloned().ok_or_else(|| {
            Refusal::new(
                StatusCode::NOT_FOUND,
                "unknown_alias",
                &format!("`{alias}` is no pipeline's alias"),
            )
        })
    }

    /// Makes what was applied to `alias` by `since` searchable: a refresh that began after
    /// it already did, so requests waiting at once share one.
    async fn refreshed_since(&self, alias: &str, since: Instant) -> Result<(), Refusal> {
        let slot = self
            .refreshed
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .entry(alias.to_owned())
            .or_default()
            .clone();
        let mut last = slot.lock().await;
        if last.is_some_and(|began| began >= since) {
            return Ok(());
        }
        let began = Instant::now();
        self.es
            .refresh(alias)
            .await
            .map_err(|e| Refusal::search_failed(alias, &e))?;
        *last = Some(began);
        Ok(())
    }

    /// Waits until `after` (when given) is applied for `target`, up to `wait_ms` (at most
    /// `max_wait`): the time waited, or why it gave up.
    async fn wait_for(
        &self,
        target: &crate::AliasTarget,
        after: Option<&str>,
        wait_ms: Option<u64>,
    ) -> Result<Duration, Refusal> {
        let Some(after) = after.map(str::trim).filter(|a| !a.is_empty()) else {
            return Ok(Duration::ZERO);
        };
        let point: SourcePoint = after.parse().map_err(|e| {
            Refusal::bad(&format!(
                "after: {e} (give your transaction's GTID, MariaDB's @@last_gtid, or a position this API returned)"
            ))
        })?;
        let started = Instant::now();
        let within = wait_ms.map_or(self.cfg.max_wait, |ms| {
            Duration::from_millis(ms).min(self.cfg.max_wait)
        });
        let deadline = started + within;
        let mut views = self.cluster.view();
        loop {
            let now = sluice_model::now_ms();
            let stands = {
                let view = views.borrow_and_update();
                standing(
                    view.applied.get(&target.pipeline),
                    &target.source,
                    &point,
                    now,
                )
            };
            let Standing::Behind { applied, lag_ms } = stands else {
                crate::metrics::waited(started.elapsed());
                return Ok(started.elapsed());
            };
            let changed = tokio::time::timeout_at(deadline, views.changed()).await;
            if !matches!(changed, Ok(Ok(()))) {
                return Err(Refusal::new(
                    StatusCode::GATEWAY_TIMEOUT,
                    "not_applied",
                    &format!(
                        "`{after}` of source {} is not applied to {} after {} ms; applied up to {} ({})",
                        target.source,
                        target.pipeline,
                        within.as_millis(),
                        applied.as_deref().unwrap_or("nothing published yet"),
                        lag_ms.map_or("lag unknown".into(), |l| format!("{l} ms behind")),
                    ),
                )
                .with("lag_ms", json!(lag_ms))
                .with("applied", json!(applied)));
            }
        }
    }
}

/// A number that ties an application's error to the center's log line about it.
fn incident() -> String {
    format!("{:08x}", fastrand::u32(..))
}

fn hex32(hex: &str) -> Option<[u8; 32]> {
    let hex = hex.trim().as_bytes();
    if hex.len() != 64 {
        return None;
    }
    let mut out = [0u8; 32];
    for (i, pair) in hex.chunks(2).enumerate() {
        let text = std::str::from_utf8(pair).ok()?;
        out[i] = u8::from_str_radix(text, 16).ok()?;
    }
    Some(out)
}

/// A refused or failed request: its status, a code a program can test, and a message
/// that says what was refused and why.
#[derive(Debug)]
pub(crate) struct Refusal {
    status: StatusCode,
    body: Map<String, Value>,
}

impl Refusal {
    fn new(status: StatusCode, code: &str, message: &str) -> Self {
        let mut body = Map::new();
        body.insert("code".into(), json!(code));
        body.insert("message".into(), json!(message));
        Self { status, body }
    }

    fn bad(message: &str) -> Self {
        Self::new(StatusCode::BAD_REQUEST, "bad_request", message)
    }

    fn with(mut self, key: &str, value: Value) -> Self {
        self.body.insert(key.into(), value);
        self
    }

    fn code(&self) -> &str {
        self.body.get("code").and_then(Value::as_str).unwrap_or("-")
    }

    /// A failure of the search cluster, told to the application by an incident number
    /// only: its text (index, host and user names) is logged, not sent.
    fn search_failed(alias: &str, e: &sluice_elastic::EsError) -> Self {
        let incident = incident();
        tracing::warn!(%alias, incident, error = %e, "a search API request failed at the search cluster");
        Self::new(
            StatusCode::BAD_GATEWAY,
            "search_failed",
            &format!("the search cluster could not answer (incident {incident}: the center's log says why)"),
        )
        .with("incident", json!(incident))
    }
}

impl IntoResponse for Refusal {
    fn into_response(self) -> Response {
        let mut response = (self.status, Json(json!({ "error": self.body }))).into_response();
        if let Some(ms) = self.body.get("retry_after_ms").and_then(Value::as_u64) {
            let secs = ms.div_ceil(1000).max(1).to_string();
            if let Ok(v) = secs.parse() {
                response.headers_mut().insert(header::RETRY_AFTER, v);
            }
        }
        response
    }
}

/// `result` as it is, counted for `app` by its outcome.
fn counted<T>(app: &str, result: Result<T, Refusal>) -> Result<T, Refusal> {
    crate::metrics::request(app, result.as_ref().map_or_else(Refusal::code, |_| "ok"));
    result
}

async fn openapi() -> impl IntoResponse {
    ([(header::CONTENT_TYPE, "application/json")], OPENAPI)
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct SearchRequest {
    template: String,
    #[serde(default)]
    params: Map<String, Value>,
    #[serde(default)]
    after: Option<String>,
    #[serde(default)]
    wait_ms: Option<u64>,
}

async fn search<C: Cluster>(
    State(api): State<Arc<SearchApi<C>>>,
    Path(alias): Path<String>,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> Result<Json<Value>, Refusal> {
    let app = api.app(&headers)?;
    counted(&app.cfg.name, searched(&api, app, alias, &body).await)
}

async fn searched<C: Cluster>(
    api: &SearchApi<C>,
    app: &App,
    alias: String,
    body: &[u8],
) -> Result<Json<Value>, Refusal> {
    let req: SearchRequest = serde_json::from_slice(body)
        .map_err(|e| Refusal::bad(&format!("the request body: {e}")))?;
    let target = api.target(app, &alias, &api.cluster.view().borrow())?;
    if !app.cfg.templates.contains(&req.template) {
        return Err(Refusal::new(
            StatusCode::FORBIDDEN,
            "template_not_allowed",
            &format!(
                "application `{}` may not run template `{}` (it may run: {})",
                app.cfg.name,
                req.template,
                app.cfg.templates.join(", ")
            ),
        ));
    }
    let template = api
        .templates
        .get(&req.template)
        .ok_or_else(|| Refusal::bad(&format!("template: no template `{}`", req.template)))?;
    let query = crate::template::render(template, &req.params).map_err(|e| Refusal::bad(&e))?;
    let waited = api
        .wait_for(&target, req.after.as_deref(), req.wait_ms)
        .await?;
    if req.after.is_some() {
        // Applied is acknowledged; a refresh makes it searchable too.
        api.refreshed_since(&alias, Instant::now()).await?;
    }
    let answer = api
        .es
        .search(&alias, &query)
        .await
        .map_err(|e| Refusal::search_failed(&alias, &e))?;
    tracing::debug!(app = %app.cfg.name, %alias, template = %req.template, waited_ms = waited.as_millis() as u64, "searched");
    Ok(Json(answer_of(&answer, waited)))
}

/// The search answer without what names physical indexes (a swap stays invisible), nor
/// the versions a document written in parts keeps.
fn answer_of(es: &Value, waited: Duration) -> Value {
    let hits = es["hits"]["hits"].as_array().cloned().unwrap_or_default();
    let total = &es["hits"]["total"];
    let document = |h: &Value| {
        let mut doc = h["_source"].clone();
        if let Some(fields) = doc.as_object_mut() {
            fields.remove(sluice_elastic::parts::FIELD);
        }
        doc
    };
    let mut out = json!({
        "total": total.get("value").unwrap_or(total),
        "hits": hits
            .iter()
            .map(|h| json!({"id": h["_id"], "score": h["_score"], "document": document(h)}))
            .collect::<Vec<_>>(),
        "took_ms": es["took"],
        "waited_ms": waited.as_millis() as u64,
    });
    if let Some(aggs) = es.get("aggregations") {
        out["aggregations"] = aggs.clone();
    }
    out
}

#[derive(Debug, Deserialize)]
struct ReadAfter {
    #[serde(default)]
    after: Option<String>,
    #[serde(default)]
    wait_ms: Option<u64>,
}

async fn document<C: Cluster>(
    State(api): State<Arc<SearchApi<C>>>,
    Path((alias, id)): Path<(String, String)>,
    Query(q): Query<ReadAfter>,
    headers: HeaderMap,
) -> Result<Json<Value>, Refusal> {
    let app = api.app(&headers)?;
    counted(&app.cfg.name, read(&api, app, alias, id, q).await)
}

async fn read<C: Cluster>(
    api: &SearchApi<C>,
    app: &App,
    alias: String,
    id: String,
    q: ReadAfter,
) -> Result<Json<Value>, Refusal> {
    let target = api.target(app, &alias, &api.cluster.view().borrow())?;
    if app.fields.is_nothing() {
        return Err(Refusal::new(
            StatusCode::FORBIDDEN,
            "documents_not_allowed",
            &format!(
                "application `{}` may read no field of a document: none of its templates shows one",
                app.cfg.name
            ),
        ));
    }
    let waited = api.wait_for(&target, q.after.as_deref(), q.wait_ms).await?;
    // A read by id is real-time: no refresh needed.
    let found = api
        .es
        .mget(&alias, std::slice::from_ref(&id))
        .await
        .map_err(|e| Refusal::search_failed(&alias, &e))?;
    match found.into_iter().next().flatten() {
        Some(document) => Ok(Json(json!({
            "id": id,
            "document": app.fields.filter(document),
            "waited_ms": waited.as_millis() as u64,
        }))),
        None => Err(Refusal::new(
            StatusCode::NOT_FOUND,
            "not_found",
            &format!("`{alias}` has no document `{id}`"),
        )
        .with("waited_ms", json!(waited.as_millis() as u64))),
    }
}

async fn position<C: Cluster>(
    State(api): State<Arc<SearchApi<C>>>,
    Path(alias): Path<String>,
    headers: HeaderMap,
) -> Result<Json<Value>, Refusal> {
    let app = api.app(&headers)?;
    counted(&app.cfg.name, positioned(&api, app, alias).await)
}

async fn positioned<C: Cluster>(
    api: &SearchApi<C>,
    app: &App,
    alias: String,
) -> Result<Json<Value>, Refusal> {
    let target = api.target(app, &alias, &api.cluster.view().borrow())?;
    let point = api.cluster.position_of(&target.source).await.map_err(|e| {
        let incident = incident();
        tracing::warn!(source = %target.source, incident, error = %e, "the search API cannot read a source's position");
        Refusal::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "source_unavailable",
            &format!(
                "cannot read source {}'s position now (incident {incident}: the center's log says why)",
                target.source
            ),
        )
        .with("incident", json!(incident))
    })?;
    Ok(Json(json!({
        "source": target.source,
        "position": point.to_string(),
    })))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_answer_shows_documents_without_their_index_or_kept_versions() {
        let es = json!({"took": 3, "hits": {"total": {"value": 1}, "hits": [
            {"_index": "shop_v2", "_id": "7", "_score": 1.0,
             "_source": {"title": "a", "sluice": {"v": 9, "p": {}}}}
        ]}});
        let out = answer_of(&es, Duration::from_millis(5));
        assert_eq!(
            out["hits"],
            json!([{"id": "7", "score": 1.0, "document": {"title": "a"}}])
        );
        assert_eq!(
            (out["total"].clone(), out["waited_ms"].clone()),
            (json!(1), json!(5))
        );
    }
}
