//! The HTTP client: one method per REST call Sluice needs.
//!
//! The client does not retry: each failure says whether it is transient
//! ([`EsError::is_transient`]) and the caller decides on backoff, so that
//! backpressure reaches the consumer instead of piling up here.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use reqwest::{Method, RequestBuilder, StatusCode};
use serde::Deserialize;
use serde_json::{json, Value};
use sluice_model::TlsPem;
use url::Url;

use crate::error::EsError;

/// Where the cluster is and how to authenticate.
///
/// `Debug` never shows the password.
/// A document as a search or a multi-get found it.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct Hit {
    #[serde(rename = "_id", default)]
    pub id: String,
    /// Its version: the external version it was last written with, or for a document
    /// written in parts the newest version of its root and parts.
    #[serde(rename = "_version", default)]
    pub version: u64,
    #[serde(rename = "_routing", default)]
    pub routing: Option<String>,
    #[serde(rename = "_source", default)]
    pub source: Value,
    /// A search's sort values (for `search_after`).
    #[serde(default)]
    pub sort: Vec<Value>,
}

#[derive(Clone)]
pub struct EsClientConfig {
    /// Base URL, e.g. `https://es.internal:9200` or `https://proxy/es/` (a path prefix
    /// is kept). It must not embed credentials: use `username`/`password`.
    pub url: Url,
    pub username: Option<String>,
    pub password: Option<String>,
    /// Limit on a whole request, connect to last byte of the answer.
    pub request_timeout: Duration,
    /// For `https`: the CA trusted instead of the system's roots, a client certificate.
    pub tls: Option<TlsPem>,
}

impl fmt::Debug for EsClientConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EsClientConfig")
            .field("url", &self.url.as_str())
            .field("username", &self.username)
            .field("password", &self.password.as_ref().map(|_| "<redacted>"))
            .field("request_timeout", &self.request_timeout)
            .field("tls", &self.tls)
            .finish()
    }
}

/// Which server answered `GET /`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Distribution {
    Elasticsearch,
    OpenSearch,
    Other(String),
}

/// What `GET /` says about the server.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerInfo {
    pub distribution: Distribution,
    /// `version.number`, e.g. `8.13.4` or `2.15.0`.
    pub version: String,
    pub cluster_name: String,
    pub node_name: String,
}

impl ServerInfo {
    /// The major version, when `version` starts with a number.
    pub fn major_version(&self) -> Option<u32> {
        self.version.split('.').next()?.parse().ok()
    }
}

/// One action of an atomic `POST /_aliases` request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AliasAction {
    /// With a filter, searches through the alias see only what matches it.
    Add {
        index: String,
        alias: String,
        filter: Option<Value>,
    },
    Remove {
        index: String,
        alias: String,
    },
}

impl AliasAction {
    /// Points `alias` at `index`; for documents written in parts, hiding their tombstones
    /// ([`crate::parts::live_filter`]).
    pub fn add(index: &str, alias: &str, in_parts: bool) -> AliasAction {
        AliasAction::Add {
            index: index.to_owned(),
            alias: alias.to_owned(),
            filter: in_parts.then(crate::parts::live_filter),
        }
    }

    fn to_json(&self) -> Value {
        match self {
            AliasAction::Add {
                index,
                alias,
                filter: None,
            } => json!({"add": {"index": index, "alias": alias}}),
            AliasAction::Add {
                index,
                alias,
                filter: Some(f),
            } => json!({"add": {"index": index, "alias": alias, "filter": f}}),
            AliasAction::Remove { index, alias } => {
                json!({"remove": {"index": index, "alias": alias}})
            }
        }
    }

    fn names(&self) -> (&str, &str) {
        match self {
            AliasAction::Add { index, alias, .. } | AliasAction::Remove { index, alias } => {
                (index, alias)
            }
        }
    }
}

/// A client for the Elasticsearch 7.x/8.x and OpenSearch 2.x REST API.
/// Cloning is cheap and clones share one connection pool.
#[derive(Clone)]
pub struct EsClient {
    inner: Arc<Inner>,
}

struct Inner {
    http: reqwest::Client,
    base: Url,
    username: Option<String>,
    password: Option<String>,
}

impl fmt::Debug for EsClient {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EsClient")
            .field("url", &self.inner.base.as_str())
            .field("username", &self.inner.username)
            .finish_non_exhaustive()
    }
}

/// An answer read to the end.
pub(crate) struct Answer {
    status: StatusCode,
    body: Vec<u8>,
}

/// Trusts only `tls.ca` when given, and presents the client certificate.
fn with_tls(http: reqwest::ClientBuilder, tls: &TlsPem) -> Result<reqwest::ClientBuilder, EsError> {
    let mut http = http.danger_accept_invalid_hostnames(tls.skip_hostname_check);
    if let Some(ca) = &tls.ca {
        let roots = reqwest::Certificate::from_pem_bundle(ca).map_err(|e| {
            EsError::Config(format!("elasticsearch.tls.ca: not a PEM certificate: {e}"))
        })?;
        if roots.is_empty() {
            return Err(EsError::Config(
                "elasticsearch.tls.ca: holds no PEM certificate".to_owned(),
            ));
        }
        http = http.tls_built_in_root_certs(false);
        for root in roots {
            http = http.add_root_certificate(root);
        }
    }
    if let Some(identity) = &tls.identity {
        let identity = reqwest::Identity::from_pem(identity).map_err(|e| {
            EsError::Config(format!(
                "elasticsearch.tls.cert / elasticsearch.tls.key: not a PEM certificate and key: {e}"
            ))
        })?;
        http = http.identity(identity);
    }
    Ok(http)
}

impl EsClient {
    /// Checks the configuration and builds the HTTP client; does no I/O (the TLS files
    /// come read, see [`sluice_model::TlsFiles::read`]).
    pub fn new(cfg: EsClientConfig) -> Result<Self, EsError> {
        let url = cfg.url;
        if url.scheme() != "http" && url.scheme() != "https" {
            return Err(EsError::Config(format!(
                "Elasticsearch URL {url} must use http or https"
            )));
        }
        if url.cannot_be_a_base() || url.host_str().is_none() {
            return Err(EsError::Config(format!(
                "Elasticsearch URL {url} has no host"
            )));
        }
        if !url.username().is_empty() || url.password().is_some() {
            // Not echoing the URL: it holds a secret.
            return Err(EsError::Config(
                "the Elasticsearch URL must not embed credentials; set the username and password separately"
                    .to_owned(),
            ));
        }
        if url.query().is_some() || url.fragment().is_some() {
            return Err(EsError::Config(format!(
                "Elasticsearch URL {url} must not have a query or fragment"
            )));
        }
        if cfg.password.is_some() && cfg.username.is_none() {
            return Err(EsError::Config(
                "an Elasticsearch password is set without a username".to_owned(),
            ));
        }
        if cfg.request_timeout.is_zero() {
            return Err(EsError::Config(
                "the Elasticsearch request timeout must be above zero".to_owned(),
            ));
        }
        let mut http = reqwest::Client::builder()
            .timeout(cfg.request_timeout)
            .connect_timeout(cfg.request_timeout.min(Duration::from_secs(10)))
            .user_agent(concat!("sluice-elastic/", env!("CARGO_PKG_VERSION")));
        if let Some(tls) = &cfg.tls {
            http = with_tls(http, tls)?;
        }
        let http = http
            .build()
            .map_err(|e| EsError::Config(format!("cannot build the HTTP client: {e}")))?;
        Ok(Self {
            inner: Arc::new(Inner {
                http,
                base: url,
                username: cfg.username,
                password: cfg.password,
            }),
        })
    }

    /// The base URL (never holds credentials).
    pub fn url(&self) -> &Url {
        &self.inner.base
    }

    /// `GET /`: which distribution and version the server is.
    pub async fn ping(&self) -> Result<ServerInfo, EsError> {
        const CALL: &str = "ping";
        let target = self.inner.base.as_str();
        let answer = self
            .send(CALL, target, self.request(Method::GET, &[]))
            .await?;
        let body = expect_success(CALL, target, answer)?;

        #[derive(Deserialize)]
        struct Root {
            #[serde(default)]
            name: String,
            #[serde(default)]
            cluster_name: String,
            version: Version,
        }
        #[derive(Deserialize)]
        struct Version {
            number: String,
            #[serde(default)]
            distribution: Option<String>,
        }
        let root: Root = parse(CALL, target, &body)?;
        // OpenSearch says so in `version.distribution`; Elasticsearch has no such field.
        let distribution = match root.version.distribution.as_deref() {
            None | Some("elasticsearch") => Distribution::Elasticsearch,
            Some("opensearch") => Distribution::OpenSearch,
            Some(other) => Distribution::Other(other.to_owned()),
        };
        Ok(ServerInfo {
            distribution,
            version: root.version.number,
            cluster_name: root.cluster_name,
            node_name: root.name,
        })
    }

    /// `HEAD /{index}`: whether an index (or an alias) of that name exists.
    pub async fn index_exists(&self, index: &str) -> Result<bool, EsError> {
        const CALL: &str = "index_exists";
        check_name(CALL, index)?;
        let answer = self
            .send(CALL, index, self.request(Method::HEAD, &[index]))
            .await?;
        match answer.status {
            StatusCode::OK => Ok(true),
            StatusCode::NOT_FOUND => Ok(false),
            status => Err(EsError::server(CALL, index, status.as_u16(), &answer.body)),
        }
    }

    /// `PUT /{index}` with settings, mappings and aliases in `body`.
    /// An index that already exists is success, whatever its mapping.
    pub async fn create_index(&self, index: &str, body: &Value) -> Result<(), EsError> {
        const CALL: &str = "create_index";
        check_name(CALL, index)?;
        let answer = self
            .send(CALL, index, self.request(Method::PUT, &[index]).json(body))
            .await?;
        if answer.status == StatusCode::BAD_REQUEST {
            let err = EsError::server(CALL, index, 400, &answer.body);
            return match err.server_error_type() {
                // The second name is what Elasticsearch before 6.0 called it.
                Some("resource_already_exists_exception" | "index_already_exists_exception") => {
                    Ok(())
                }
                _ => Err(err),
            };
        }
        let body = expect_success(CALL, index, answer)?;
        warn_unacknowledged(CALL, index, &body);
        Ok(())
    }

    /// `GET /_alias/{alias}`: the indices the alias points to, sorted;
    /// empty when there is no such alias.
    pub async fn alias_targets(&self, alias: &str) -> Result<Vec<String>, EsError> {
        const CALL: &str = "alias_targets";
        check_name(CALL, alias)?;
        let answer = self
            .send(CALL, alias, self.request(Method::GET, &["_alias", alias]))
            .await?;
        if answer.status == StatusCode::NOT_FOUND {
            return Ok(Vec::new());
        }
        let body = expect_success(CALL, alias, answer)?;
        let map: serde_json::Map<String, Value> = parse(CALL, alias, &body)?;
        let mut indices: Vec<String> = map.into_iter().map(|(index, _)| index).collect();
        indices.sort();
        Ok(indices)
    }

    /// `POST /_aliases`: applies all actions atomically, or none of them.
    pub async fn update_aliases(&self, actions: &[AliasAction]) -> Result<(), EsError> {
        const CALL: &str = "update_aliases";
        if actions.is_empty() {
            return Ok(());
        }
        let mut names = Vec::new();
        for action in actions {
            let (index, alias) = action.names();
            check_name(CALL, index)?;
            check_name(CALL, alias)?;
            names.push(match action {
                AliasAction::Add { .. } => format!("+{alias}->{index}"),
                AliasAction::Remove { .. } => format!("-{alias}->{index}"),
            });
        }
        let target = names.join(" ");
        let body = json!({"actions": actions.iter().map(AliasAction::to_json).collect::<Vec<_>>()});
        let answer = self
            .send(
                CALL,
                &target,
                self.request(Method::POST, &["_aliases"]).json(&body),
            )
            .await?;
        let body = expect_success(CALL, &target, answer)?;
        warn_unacknowledged(CALL, &target, &body);
        Ok(())
    }

    /// `PUT /{index}/_settings`: changes dynamic settings (`refresh_interval`,
    /// `index.gc_deletes`, `number_of_replicas`...).
    pub async fn update_settings(&self, index: &str, settings: &Value) -> Result<(), EsError> {
        self.put_index_json("update_settings", index, "_settings", settings)
            .await
    }

    /// `PUT /{index}/_mapping`: adds fields to an index's mapping. Changing an existing
    /// field's type is refused by the server (a definite error).
    pub async fn put_mapping(&self, index: &str, mapping: &Value) -> Result<(), EsError> {
        self.put_index_json("put_mapping", index, "_mapping", mapping)
            .await
    }

    async fn put_index_json(
        &self,
        call: &'static str,
        index: &str,
        endpoint: &str,
        body: &Value,
    ) -> Result<(), EsError> {
        check_name(call, index)?;
        let answer = self
            .send(
                call,
                index,
                self.request(Method::PUT, &[index, endpoint]).json(body),
            )
            .await?;
        let body = expect_success(call, index, answer)?;
        warn_unacknowledged(call, index, &body);
        Ok(())
    }

    /// `GET /_script_language`: whether the server runs Painless scripts, which writes of
    /// documents in parts need ([`crate::parts`]): OpenSearch's and Elasticsearch's
    /// distributions carry it, a minimal one may not. `None` when the server would not
    /// say (no right to ask).
    pub async fn runs_painless(&self) -> Result<Option<bool>, EsError> {
        const CALL: &str = "script languages";
        let target = "_script_language";
        let answer = self
            .send(CALL, target, self.request(Method::GET, &[target]))
            .await?;
        if matches!(answer.status.as_u16(), 401 | 403) {
            return Ok(None);
        }
        let body = expect_success(CALL, target, answer)?;
        #[derive(Deserialize)]
        struct Languages {
            #[serde(default)]
            language_contexts: Vec<Language>,
        }
        #[derive(Deserialize)]
        struct Language {
            language: String,
        }
        let langs: Languages = parse(CALL, target, &body)?;
        Ok(Some(
            langs
                .language_contexts
                .iter()
                .any(|l| l.language == "painless"),
        ))
    }

    /// `POST /{index}/_refresh`: makes every acknowledged write visible to search.
    pub async fn refresh(&self, index: &str) -> Result<(), EsError> {
        const CALL: &str = "refresh";
        check_name(CALL, index)?;
        let answer = self
            .send(
                CALL,
                index,
                self.request(Method::POST, &[index, "_refresh"]),
            )
            .await?;
        expect_success(CALL, index, answer)?;
        Ok(())
    }

    /// `GET /{index}/_count`: the number of searchable documents (see [`Self::refresh`]).
    pub async fn count(&self, index: &str) -> Result<u64, EsError> {
        const CALL: &str = "count";
        check_name(CALL, index)?;
        let answer = self
            .send(CALL, index, self.request(Method::GET, &[index, "_count"]))
            .await?;
        let body = expect_success(CALL, index, answer)?;
        #[derive(Deserialize)]
        struct Count {
            count: u64,
        }
        Ok(parse::<Count>(CALL, index, &body)?.count)
    }

    /// `POST /{index}/_search` with `body` (a query DSL request): the answer as given.
    pub async fn search(&self, index: &str, body: &Value) -> Result<Value, EsError> {
        const CALL: &str = "search";
        check_name(CALL, index)?;
        let answer = self
            .send(
                CALL,
                index,
                self.request(Method::POST, &[index, "_search"]).json(body),
            )
            .await?;
        let body = expect_success(CALL, index, answer)?;
        parse(CALL, index, &body)
    }

    /// `POST /{index}/_mget`: each document's `_source`, or `None` when it does not
    /// exist, in the order of `ids`. Reads are real-time (no refresh needed).
    /// Documents written with a routing value need [`Self::mget_routed`].
    pub async fn mget(&self, index: &str, ids: &[String]) -> Result<Vec<Option<Value>>, EsError> {
        let docs: Vec<(String, Option<String>)> = ids.iter().map(|id| (id.clone(), None)).collect();
        self.mget_routed(index, &docs).await
    }

    /// Like [`Self::mget`], with a routing value per document.
    pub async fn mget_routed(
        &self,
        index: &str,
        docs: &[(String, Option<String>)],
    ) -> Result<Vec<Option<Value>>, EsError> {
        Ok(self
            .mget_hits(index, docs)
            .await?
            .into_iter()
            .map(|hit| hit.map(|h| h.source))
            .collect())
    }

    /// Like [`Self::mget_routed`], each found document with its version and routing.
    pub async fn mget_hits(
        &self,
        index: &str,
        docs: &[(String, Option<String>)],
    ) -> Result<Vec<Option<Hit>>, EsError> {
        const CALL: &str = "mget";
        check_name(CALL, index)?;
        if docs.is_empty() {
            return Ok(Vec::new());
        }
        let docs: Vec<Value> = docs
            .iter()
            .map(|(id, routing)| match routing {
                Some(r) => json!({"_id": id, "routing": r}),
                None => json!({"_id": id}),
            })
            .collect();
        let expected = docs.len();
        let answer = self
            .send(
                CALL,
                index,
                self.request(Method::POST, &[index, "_mget"])
                    .json(&json!({ "docs": docs })),
            )
            .await?;
        let body = expect_success(CALL, index, answer)?;

        #[derive(Deserialize)]
        struct Mget {
            docs: Vec<MgetDoc>,
        }
        #[derive(Deserialize)]
        struct MgetDoc {
            #[serde(default)]
            found: bool,
            #[serde(default)]
            error: Option<Value>,
            #[serde(flatten)]
            hit: Hit,
        }
        let mget: Mget = parse(CALL, index, &body)?;
        if mget.docs.len() != expected {
            return Err(EsError::malformed(
                CALL,
                index,
                format!("{} documents for {expected} ids", mget.docs.len()),
            ));
        }
        mget.docs
            .into_iter()
            .map(|doc| {
                if let Some(error) = doc.error {
                    // Per-document failures (missing index, alias with several
                    // indices) fail the call: "absent" would be a lie.
                    let error = crate::ServerError::from_error_value(&error);
                    let status = match error.error_type.as_str() {
                        "index_not_found_exception" => 404,
                        _ => 400,
                    };
                    return Err(EsError::Server {
                        call: CALL,
                        target: index.to_owned(),
                        status,
                        error,
                    });
                }
                match (doc.found, doc.hit.source.is_null()) {
                    (true, false) => Ok(crate::parts::live(doc.hit)),
                    (true, true) => Err(EsError::malformed(
                        CALL,
                        index,
                        "a found document has no _source (is _source disabled?)",
                    )),
                    (false, _) => Ok(None),
                }
            })
            .collect()
    }

    /// `POST /{index}/_search` with `body`, which should ask for `"version": true`: the
    /// hits, each with its version, routing and sort values. Like [`Self::mget_hits`],
    /// documents only: tombstones of documents written in parts are left out (by the
    /// query, so pages stay whole), and their versions are what [`crate::parts::live`]
    /// says.
    pub async fn search_hits(&self, index: &str, body: &Value) -> Result<Vec<Hit>, EsError> {
        #[derive(Deserialize)]
        struct Answer {
            hits: Hits,
        }
        #[derive(Deserialize)]
        struct Hits {
            hits: Vec<Hit>,
        }
        let mut body = body.clone();
        let query = body
            .get("query")
            .cloned()
            .unwrap_or(json!({"match_all": {}}));
        body["query"] = json!({"bool": {"must": [query], "filter": [crate::parts::live_filter()]}});
        let answer = self.search(index, &body).await?;
        serde_json::from_value::<Answer>(answer)
            .map(|a| {
                a.hits
                    .hits
                    .into_iter()
                    .filter_map(crate::parts::live)
                    .collect()
            })
            .map_err(|e| EsError::malformed("search", index, e.to_string()))
    }

    /// `GET /{index}/_settings`: the answer as the server gives it, keyed by concrete
    /// index name: `{"orders_v2": {"settings": {"index": {...}}}}` (an alias or pattern
    /// yields one entry per index).
    pub async fn get_settings(&self, index: &str) -> Result<Value, EsError> {
        self.get_index_json("get_settings", index, "_settings")
            .await
    }

    /// `GET /{index}/_mapping`, keyed like [`EsClient::get_settings`]:
    /// `{"orders_v2": {"mappings": {"properties": {...}}}}`.
    pub async fn get_mapping(&self, index: &str) -> Result<Value, EsError> {
        self.get_index_json("get_mapping", index, "_mapping").await
    }

    async fn get_index_json(
        &self,
        call: &'static str,
        index: &str,
        endpoint: &str,
    ) -> Result<Value, EsError> {
        check_name(call, index)?;
        let answer = self
            .send(call, index, self.request(Method::GET, &[index, endpoint]))
            .await?;
        let body = expect_success(call, index, answer)?;
        parse(call, index, &body)
    }

    /// `DELETE /{index}`: a missing index is success. The name must be a concrete
    /// index (Elasticsearch 8 refuses aliases here; wildcards are refused locally).
    pub async fn delete_index(&self, index: &str) -> Result<(), EsError> {
        const CALL: &str = "delete_index";
        check_name(CALL, index)?;
        let answer = self
            .send(CALL, index, self.request(Method::DELETE, &[index]))
            .await?;
        if answer.status == StatusCode::NOT_FOUND {
            let err = EsError::server(CALL, index, 404, &answer.body);
            return match err.server_error_type() {
                Some("index_not_found_exception") => Ok(()),
                _ => Err(err),
            };
        }
        expect_success(CALL, index, answer)?;
        Ok(())
    }

    pub(crate) fn request(&self, method: Method, segments: &[&str]) -> RequestBuilder {
        let mut url = self.inner.base.clone();
        if !segments.is_empty() {
            url.path_segments_mut()
                .expect("checked in EsClient::new: the URL can be a base")
                .pop_if_empty()
                .extend(segments);
        }
        let request = self.inner.http.request(method, url);
        match &self.inner.username {
            // reqwest marks the Authorization header sensitive.
            Some(user) => request.basic_auth(user, self.inner.password.as_deref()),
            None => request,
        }
    }

    pub(crate) async fn send(
        &self,
        call: &'static str,
        target: &str,
        request: RequestBuilder,
    ) -> Result<Answer, EsError> {
        let response = request
            .send()
            .await
            .map_err(|e| EsError::transport(call, target, e))?;
        let status = response.status();
        let body = response
            .bytes()
            .await
            .map_err(|e| EsError::transport(call, target, e))?;
        Ok(Answer {
            status,
            body: body.to_vec(),
        })
    }
}

/// The body of a 2xx answer, or the server's error.
pub(crate) fn expect_success(
    call: &'static str,
    target: &str,
    answer: Answer,
) -> Result<Vec<u8>, EsError> {
    if answer.status.is_success() {
        Ok(answer.body)
    } else {
        Err(EsError::server(
            call,
            target,
            answer.status.as_u16(),
            &answer.body,
        ))
    }
}

pub(crate) fn parse<T: serde::de::DeserializeOwned>(
    call: &'static str,
    target: &str,
    body: &[u8],
) -> Result<T, EsError> {
    serde_json::from_slice(body).map_err(|e| {
        EsError::malformed(
            call,
            target,
            format!("{e}: {}", crate::error::excerpt(body)),
        )
    })
}

/// `"acknowledged": false` means the change was committed but not every node
/// confirmed it within the timeout: not a failure, but worth a line in the log.
fn warn_unacknowledged(call: &'static str, target: &str, body: &[u8]) {
    if let Ok(value) = serde_json::from_slice::<Value>(body) {
        if value.get("acknowledged") == Some(&Value::Bool(false)) {
            tracing::warn!(
                call,
                target,
                "Elasticsearch applied the change but not every node acknowledged it in time; \
                 it will converge, check cluster health if this repeats"
            );
        }
    }
}

/// Refuses names that would turn a call into something else: empty (`DELETE /`),
/// API endpoints (`_all`, `_bulk`), wildcards and lists (`*`, `a,b`), path tricks.
/// Everything else (case, length) is left to the server, which explains itself.
pub(crate) fn check_name(call: &'static str, name: &str) -> Result<(), EsError> {
    let problem = if name.is_empty() {
        Some("the name is empty")
    } else if name.starts_with(['_', '-', '+']) {
        Some("the name starts with '_', '-' or '+'")
    } else if name == "." || name == ".." {
        Some("the name is '.' or '..'")
    } else if name.contains(['*', ',', '/', '\\', '?', '"', '<', '>', '|', ' ', '#']) {
        Some("the name holds one of * , / \\ ? \" < > | space #")
    } else {
        None
    };
    match problem {
        Some(detail) => Err(EsError::InvalidArgument {
            call,
            target: name.to_owned(),
            detail: detail.to_owned(),
        }),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(url: &str) -> EsClientConfig {
        EsClientConfig {
            url: Url::parse(url).unwrap(),
            username: Some("elastic".into()),
            password: Some("hunter2-secret".into()),
            request_timeout: Duration::from_secs(5),
            tls: None,
        }
    }

    #[test]
    fn debug_output_hides_the_password() {
        let cfg = config("http://127.0.0.1:9200");
        let shown = format!("{cfg:?}");
        assert!(!shown.contains("hunter2"), "{shown}");
        assert!(shown.contains("<redacted>"), "{shown}");
        let client = EsClient::new(cfg).unwrap();
        let shown = format!("{client:?}");
        assert!(!shown.contains("hunter2"), "{shown}");
        assert!(shown.contains("elastic"), "{shown}");
    }

    #[test]
    fn refuses_credentials_in_the_url_without_echoing_them() {
        let err =
            EsClient::new(config("http://elastic:hunter2-secret@127.0.0.1:9200")).unwrap_err();
        assert!(!err.to_string().contains("hunter2"), "{err}");
        assert!(!format!("{err:?}").contains("hunter2"), "{err:?}");
    }

    #[test]
    fn refuses_unusable_configs() {
        assert!(EsClient::new(config("ftp://h/")).is_err());
        assert!(EsClient::new(config("http://h/?x=1")).is_err());
        let mut cfg = config("http://h");
        cfg.request_timeout = Duration::ZERO;
        assert!(EsClient::new(cfg).is_err());
        let mut cfg = config("http://h");
        cfg.username = None;
        assert!(EsClient::new(cfg).is_err());
    }

    #[test]
    fn builds_urls_under_a_path_prefix_and_escapes_segments() {
        for base in ["http://h:9200", "http://h:9200/"] {
            let client = EsClient::new(config(base)).unwrap();
            let req = client
                .request(Method::GET, &["a_v1", "_count"])
                .build()
                .unwrap();
            assert_eq!(req.url().as_str(), "http://h:9200/a_v1/_count");
        }
        let client = EsClient::new(config("https://proxy/es/")).unwrap();
        let req = client
            .request(Method::GET, &["_alias", "a%b"])
            .build()
            .unwrap();
        assert_eq!(req.url().as_str(), "https://proxy/es/_alias/a%25b");
        let req = client.request(Method::GET, &[]).build().unwrap();
        assert_eq!(req.url().as_str(), "https://proxy/es/");
    }

    #[test]
    fn sends_basic_auth_marked_sensitive() {
        let client = EsClient::new(config("http://h")).unwrap();
        let req = client.request(Method::GET, &[]).build().unwrap();
        let auth = req.headers().get(reqwest::header::AUTHORIZATION).unwrap();
        assert!(auth.is_sensitive());
        // base64("elastic:hunter2-secret")
        assert_eq!(
            auth.to_str().unwrap(),
            "Basic ZWxhc3RpYzpodW50ZXIyLXNlY3JldA=="
        );
    }

    #[test]
    fn refuses_names_that_change_the_call() {
        for bad in ["", "_all", "*", "a,b", "a/b", "..", "-x", "a b"] {
            let err = check_name("delete_index", bad).unwrap_err();
            assert!(!err.is_transient());
        }
        for good in ["orders_v1", "Orders", ".kibana", "a-b.c_d"] {
            check_name("delete_index", good).unwrap();
        }
    }

    #[test]
    fn server_info_major_version() {
        let info = ServerInfo {
            distribution: Distribution::OpenSearch,
            version: "2.15.0".into(),
            cluster_name: String::new(),
            node_name: String::new(),
        };
        assert_eq!(info.major_version(), Some(2));
    }
}
