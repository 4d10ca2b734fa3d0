//! `sluice-center` configuration (TOML file, then `SLUICE_…` environment overrides).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use serde::Deserialize;
use sluice_model::{RetryPolicy, Secret};
use sluice_zk::ZkConfig;

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CenterConfig {
    #[serde(default)]
    pub center: CenterSection,
    pub zookeeper: ZkConfig,
    pub meta: MetaSection,
    pub api: ApiSection,
    #[serde(default)]
    pub balance: BalanceSection,
    /// Needed for builds (alias swaps) and for deleting pipelines' indexes.
    #[serde(default)]
    pub elasticsearch: Option<sluice_elastic::EsSection>,
    /// TLS to the sources, when the centers check pipelines against their tables.
    #[serde(default)]
    pub source_tls: Option<sluice_model::TlsFiles>,
    /// Hosts of those sources a password may go to without TLS (`*`: any): whoever
    /// answers at such an address can read or guess it. A source elsewhere without TLS is
    /// refused before its connection opens.
    #[serde(default, deserialize_with = "sluice_model::listed::strings")]
    pub source_plaintext_hosts: Vec<String>,
    /// What those sources' `password_ref` may name in this process: nothing beyond it
    /// resolves (README, "Security").
    #[serde(default)]
    pub source_secrets: sluice_model::SecretRefs,
    /// Needed to list and replay dead letters (`sluicectl dlq`).
    #[serde(default)]
    pub kafka: Option<sluice_kafka::KafkaConfig>,
    /// The topic names the workers and the etl use (only the dead-letter ones matter here).
    #[serde(default)]
    pub topics: sluice_kafka::TopicConfig,
    /// `/metrics`, `/healthz`, `/readyz`, and traces over OTLP.
    #[serde(default)]
    pub telemetry: sluice_runtime::telemetry::TelemetrySection,
    /// The search API for applications (README, "Searching from applications").
    #[serde(default)]
    pub search: sluice_search::SearchSection,
    /// What each listener (gRPC, console, search, dictionaries) allows its callers:
    /// connections at once, deadlines, body sizes.
    #[serde(default)]
    pub limits: sluice_runtime::listen::Limits,
    /// How long the operational history is kept; the leader deletes what is older.
    #[serde(default)]
    pub retention: RetentionSection,
}

/// How long each kind of history is kept (the leader deletes what is older, every hour).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RetentionSection {
    /// Events (`sluicectl events`).
    #[serde(with = "humantime_serde")]
    pub events: Duration,
    /// The audit log.
    #[serde(with = "humantime_serde")]
    pub audit: Duration,
    /// Finished runs (checks, compares, delayed jobs, resyncs) and dead-letter replays.
    #[serde(with = "humantime_serde")]
    pub runs: Duration,
    /// Task assignment history (each task's latest assignment is always kept).
    #[serde(with = "humantime_serde")]
    pub assignments: Duration,
}

impl Default for RetentionSection {
    fn default() -> Self {
        const DAY: u64 = 24 * 3600;
        Self {
            events: Duration::from_secs(30 * DAY),
            audit: Duration::from_secs(90 * DAY),
            runs: Duration::from_secs(30 * DAY),
            assignments: Duration::from_secs(30 * DAY),
        }
    }
}

impl RetentionSection {
    fn problems(&self) -> Vec<String> {
        [
            ("events", self.events),
            ("audit", self.audit),
            ("runs", self.runs),
            ("assignments", self.assignments),
        ]
        .into_iter()
        .filter(|(_, d)| *d < Duration::from_secs(3600))
        .map(|(key, _)| format!("retention.{key}: must be at least an hour"))
        .collect()
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CenterSection {
    /// This replica's id. Default: the host name.
    #[serde(default = "default_id")]
    pub id: String,
    /// Where the gRPC API (admin, worker reports, health, reflection) listens.
    #[serde(default = "default_listen")]
    pub listen: SocketAddr,
    /// The address others reach this replica at. Default: `listen`.
    #[serde(default)]
    pub advertise: Option<String>,
    /// Where the IK dictionaries are served over HTTP (`/dict/ext`, `/dict/stop`).
    #[serde(default = "default_dictionary_listen")]
    pub dictionary_listen: SocketAddr,
    /// Where the web console is served over HTTP (README, "Console").
    #[serde(default = "default_console_listen")]
    pub console_listen: SocketAddr,
    /// The address other centers reach this one's console at (a follower's console sends
    /// changes to the leader's). Default: `console_listen`, or when that listens on every
    /// address, the host of `advertise` with the console's port.
    #[serde(default)]
    pub console_advertise: Option<String>,
    /// First pause before retrying what failed (reaching ZooKeeper or the meta database,
    /// a campaign, a reconcile pass, recording delayed changes); it doubles, with jitter,
    /// up to `retry_backoff_max`.
    #[serde(default = "default_retry_backoff", with = "humantime_serde")]
    pub retry_backoff: Duration,
    /// The longest pause between two attempts.
    #[serde(default = "default_retry_backoff_max", with = "humantime_serde")]
    pub retry_backoff_max: Duration,
}

impl Default for CenterSection {
    fn default() -> Self {
        Self {
            id: default_id(),
            listen: default_listen(),
            advertise: None,
            dictionary_listen: default_dictionary_listen(),
            console_listen: default_console_listen(),
            console_advertise: None,
            retry_backoff: default_retry_backoff(),
            retry_backoff_max: default_retry_backoff_max(),
        }
    }
}

fn default_retry_backoff() -> Duration {
    Duration::from_millis(250)
}

fn default_retry_backoff_max() -> Duration {
    Duration::from_secs(10)
}

impl CenterSection {
    /// The retry policy of everything the center retries.
    pub fn retry(&self) -> RetryPolicy {
        RetryPolicy::new(self.retry_backoff, self.retry_backoff_max)
    }

    pub fn advertised(&self) -> String {
        self.advertise
            .clone()
            .unwrap_or_else(|| self.listen.to_string())
    }

    /// Where other centers reach this one's console (see `console_advertise`).
    pub fn console_advertised(&self) -> String {
        if let Some(a) = &self.console_advertise {
            return a.clone();
        }
        if !self.console_listen.ip().is_unspecified() {
            return self.console_listen.to_string();
        }
        let api = self.advertised();
        let host = api.rsplit_once(':').map_or(api.as_str(), |(host, _)| host);
        format!("{host}:{}", self.console_listen.port())
    }
}

fn default_id() -> String {
    std::fs::read_to_string("/etc/hostname")
        .ok()
        .map(|s| s.trim().to_owned())
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| format!("center-{}", std::process::id()))
}

fn default_listen() -> SocketAddr {
    SocketAddr::from(([0, 0, 0, 0], 7070))
}

fn default_dictionary_listen() -> SocketAddr {
    SocketAddr::from(([0, 0, 0, 0], 7071))
}

/// Loopback by default: the console speaks plain HTTP, so a password crosses the
/// network only behind a TLS proxy an operator puts in front of it on purpose.
fn default_console_listen() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], 7072))
}

/// The MySQL meta database (sources, pipelines, assignment history, events). The center
/// creates and migrates its schema.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MetaSection {
    pub host: String,
    #[serde(default = "default_port")]
    pub port: u16,
    pub user: String,
    pub password: Secret,
    pub database: String,
    /// TLS to the meta database; none: plain connections.
    #[serde(default)]
    pub tls: Option<sluice_model::TlsFiles>,
    /// Without `tls`, let the password go over a plain connection, readable or guessable
    /// by whoever answers at the address; without either, the center does not start.
    #[serde(default)]
    pub allow_plaintext: bool,
}

fn default_port() -> u16 {
    3306
}

/// How callers authenticate to the gRPC API.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ApiSection {
    /// `token` (a bearer token in the `authorization` header), `mtls` (client certificates
    /// signed by `client_ca`) or `none` (no authentication: only when explicitly chosen).
    pub auth: AuthMode,
    /// The bearer token (`auth = "token"`); prefer `token_file` or `SLUICE_API__TOKEN`.
    #[serde(default)]
    pub token: Option<Secret>,
    /// A file holding the bearer token (e.g. a mounted Kubernetes secret).
    #[serde(default)]
    pub token_file: Option<PathBuf>,
    /// The workers' bearer token (`auth = "token"`, required): it may report tasks'
    /// progress and events, nothing else, so a worker's credential cannot administer the
    /// cluster (the admin token cannot report). Prefer `worker_token_file` or
    /// `SLUICE_API__WORKER_TOKEN`.
    #[serde(default)]
    pub worker_token: Option<Secret>,
    #[serde(default)]
    pub worker_token_file: Option<PathBuf>,
    /// Server certificate and key (PEM); required for `mtls`, optional TLS otherwise.
    #[serde(default)]
    pub tls_cert: Option<PathBuf>,
    #[serde(default)]
    pub tls_key: Option<PathBuf>,
    /// CA that signs client certificates (`mtls`).
    #[serde(default)]
    pub client_ca: Option<PathBuf>,
    /// The user the configured `token` (and, with `mtls`, a client certificate) acts as,
    /// with the admin role; and the name of the first admin made from `admin_password`.
    #[serde(default = "default_admin_user")]
    pub admin_user: String,
    /// The first admin's password (for the console): at start the user `admin_user` is
    /// created with it unless a user of that name exists. Prefer `admin_password_file` or
    /// `SLUICE_API__ADMIN_PASSWORD`.
    #[serde(default)]
    pub admin_password: Option<Secret>,
    #[serde(default)]
    pub admin_password_file: Option<PathBuf>,
    /// The longest an API token works; a token asked for longer gets this.
    #[serde(default = "default_token_lifetime", with = "humantime_serde")]
    pub token_lifetime: Duration,
    /// How long a console session lasts after its login.
    #[serde(default = "default_session_lasts", with = "humantime_serde")]
    pub session_lasts: Duration,
    /// A console session unused this long ends.
    #[serde(default = "default_session_idle", with = "humantime_serde")]
    pub session_idle: Duration,
    /// Proxies in front of the console (addresses or CIDR ranges, `10.0.0.0/8`) whose
    /// `client_address_header` says who the client is: login attempts are then counted by
    /// that address, not the proxy's.
    #[serde(default, deserialize_with = "sluice_model::listed::strings")]
    pub trusted_proxies: Vec<String>,
    /// The header a trusted proxy names the client in (its last address not a trusted
    /// proxy's counts).
    #[serde(default = "default_client_address_header")]
    pub client_address_header: String,
    /// Serve tokens, passwords and session cookies over plain TCP on addresses other
    /// than loopback (`center.listen`, `center.console_listen`, `search.listen`) without
    /// `tls_cert`: only where the network is trusted or TLS ends in front of the center.
    /// Without it such a center does not start.
    #[serde(default)]
    pub allow_plaintext: bool,
}

fn default_admin_user() -> String {
    "admin".into()
}

fn default_token_lifetime() -> Duration {
    Duration::from_secs(90 * 24 * 3600)
}

fn default_session_lasts() -> Duration {
    Duration::from_secs(12 * 3600)
}

fn default_session_idle() -> Duration {
    Duration::from_secs(30 * 60)
}

fn default_client_address_header() -> String {
    "x-forwarded-for".into()
}

impl ApiSection {
    /// What is wrong with `[api]`, each naming its key.
    fn problems(&self) -> Vec<String> {
        let mut p = Vec::new();
        if let Err(e) = crate::credentials::check_user_name(&self.admin_user) {
            p.push(format!("api.admin_user: {e}"));
        }
        if self.admin_password.is_some() && self.admin_password_file.is_some() {
            p.push("api.admin_password: set at most one of api.admin_password and api.admin_password_file".into());
        }
        match self.auth {
            AuthMode::Token => {
                if self.token.is_none() == self.token_file.is_none() {
                    p.push("api.token: with auth = \"token\" set exactly one of api.token and api.token_file".into());
                }
                if self.worker_token.is_none() == self.worker_token_file.is_none() {
                    p.push("api.worker_token: with auth = \"token\" set exactly one of api.worker_token and api.worker_token_file (workers report with a token of their own, which may do nothing else)".into());
                }
            }
            AuthMode::Mtls => {
                for (key, v) in [
                    ("api.tls_cert", &self.tls_cert),
                    ("api.tls_key", &self.tls_key),
                    ("api.client_ca", &self.client_ca),
                ] {
                    if v.is_none() {
                        p.push(format!("{key}: required with auth = \"mtls\""));
                    }
                }
            }
            AuthMode::None => {}
        }
        if self.tls_cert.is_some() != self.tls_key.is_some() {
            p.push("api.tls_key: set api.tls_cert and api.tls_key together".into());
        }
        for (i, proxy) in self.trusted_proxies.iter().enumerate() {
            if let Err(e) = crate::client_addr::Cidr::parse(proxy) {
                p.push(format!("api.trusted_proxies[{i}]: {e}"));
            }
        }
        if self
            .client_address_header
            .parse::<axum::http::HeaderName>()
            .is_err()
        {
            p.push(format!(
                "api.client_address_header: `{}` is not a header name",
                self.client_address_header
            ));
        }
        for (key, d) in [
            ("api.token_lifetime", self.token_lifetime),
            ("api.session_lasts", self.session_lasts),
            ("api.session_idle", self.session_idle),
        ] {
            if d < Duration::from_secs(1) {
                p.push(format!("{key}: must be at least a second"));
            }
        }
        p
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum AuthMode {
    Token,
    Mtls,
    None,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BalanceSection {
    /// Tasks move automatically only when the busiest live worker has more than this many
    /// tasks above the idlest (seed 001's threshold against flapping). An operator's
    /// rebalance evens them out regardless.
    #[serde(default = "default_threshold")]
    pub threshold: usize,
    /// After the set of live workers changes, wait this long for it to settle before
    /// moving running tasks (a dead worker's tasks are reassigned at once).
    #[serde(default = "default_settle", with = "humantime_serde")]
    pub settle: Duration,
    /// The leader reconciles at least this often, even without a watch firing.
    #[serde(default = "default_resync", with = "humantime_serde")]
    pub resync: Duration,
}

impl Default for BalanceSection {
    fn default() -> Self {
        Self {
            threshold: default_threshold(),
            settle: default_settle(),
            resync: default_resync(),
        }
    }
}

fn default_threshold() -> usize {
    1
}
fn default_settle() -> Duration {
    Duration::from_secs(5)
}
fn default_resync() -> Duration {
    Duration::from_secs(10)
}

impl CenterConfig {
    /// Listeners that would carry credentials in clear across a network, or make every
    /// caller an admin on one.
    fn listener_problems(&self) -> Vec<String> {
        let mut p = Vec::new();
        let c = &self.center;
        if self.api.auth == AuthMode::None {
            for (key, addr) in [
                ("center.listen", c.listen),
                ("center.console_listen", c.console_listen),
            ] {
                if !addr.ip().is_loopback() {
                    p.push(format!(
                        "api.auth: `none` makes every caller an admin, so {key} must be a loopback address (it is {addr})"
                    ));
                }
            }
        }
        if self.api.tls_cert.is_some() || self.api.allow_plaintext {
            return p;
        }
        let mut carrying = vec![(
            "center.console_listen",
            c.console_listen,
            "passwords and session cookies",
        )];
        if self.api.auth == AuthMode::Token {
            carrying.push(("center.listen", c.listen, "bearer tokens"));
        }
        if let Some(addr) = self.search.listen {
            carrying.push(("search.listen", addr, "applications' tokens"));
        }
        for (key, addr, what) in carrying {
            if !addr.ip().is_loopback() {
                p.push(format!(
                    "{key}: {addr} is not a loopback address and the center has no TLS (api.tls_cert), so {what} would cross the network in clear: set api.tls_cert and api.tls_key, listen on loopback, or set api.allow_plaintext = true where the network is trusted or TLS ends in front of the center"
                ));
            }
        }
        p
    }

    /// How this process reaches the center's sources.
    pub fn source_access(&self) -> sluice_mysql::Access {
        sluice_mysql::Access {
            tls: self.source_tls.clone(),
            plaintext_hosts: self.source_plaintext_hosts.clone(),
            secrets: self.source_secrets.clone(),
        }
    }

    /// Every MySQL TLS setting in the file, by key.
    pub fn mysql_tls(&self) -> Vec<(String, &sluice_model::TlsFiles)> {
        let sources = self.source_tls.iter().map(|t| ("source_tls".to_owned(), t));
        let meta = self.meta.tls.iter().map(|t| ("meta.tls".to_owned(), t));
        sources.chain(meta).collect()
    }

    /// Checks values without I/O; every problem, each naming its key.
    pub fn validate(&self) -> Result<(), Vec<String>> {
        let mut p = Vec::new();
        p.extend(self.telemetry.problems("telemetry"));
        p.extend(
            self.center
                .retry()
                .problems("center.retry_backoff", "center.retry_backoff_max"),
        );
        p.extend(self.topics.problems("topics"));
        p.extend(sluice_model::tls::problems_of(&self.mysql_tls()));
        p.extend(self.source_access().problems());
        if let Some(k) = &self.kafka {
            p.extend(k.problems("kafka"));
        }
        if self.center.id.trim().is_empty() || self.center.id.contains('/') {
            p.push(format!(
                "center.id: `{}` must be non-empty and contain no `/`",
                self.center.id
            ));
        }
        if let Err(issues) = self.zookeeper.validate() {
            p.extend(
                issues
                    .into_iter()
                    .map(|i| format!("zookeeper.{}: {}", i.key, i.reason)),
            );
        }
        if self.meta.database.is_empty()
            || !self
                .meta
                .database
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_')
        {
            p.push(format!(
                "meta.database: `{}` must be non-empty [A-Za-z0-9_]",
                self.meta.database
            ));
        }
        p.extend(self.api.problems());
        p.extend(self.listener_problems());
        p.extend(self.limits.problems("limits"));
        p.extend(self.retention.problems());
        p.extend(self.search.problems("search"));
        if self.search.listen.is_some() && self.elasticsearch.is_none() {
            p.push("search.listen: the search API needs an [elasticsearch] section".into());
        }
        if self.balance.threshold == 0 {
            p.push(
                "balance.threshold: must be at least 1 (0 would move tasks back and forth)".into(),
            );
        }
        if let Some(es) = &self.elasticsearch {
            p.extend(es.problems("elasticsearch"));
        }
        if self.balance.resync.is_zero() {
            p.push("balance.resync: must be positive".into());
        }
        if p.is_empty() {
            Ok(())
        } else {
            Err(p)
        }
    }
}
