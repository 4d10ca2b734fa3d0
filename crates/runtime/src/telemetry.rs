//! Logs, metrics and traces, and the operations endpoint every service serves.
//!
//! Logs go through `tracing`: `RUST_LOG` filters (default [`DEFAULT_FILTER`]: `info`, the
//! Kafka and ZooKeeper clients quieter), `SLUICE_LOG_FORMAT=json` switches to JSON lines.
//! Metrics are OpenTelemetry instruments exported in Prometheus' text format on
//! `GET /metrics`; spans go to an OTLP/gRPC collector when
//! `telemetry.otlp_endpoint` is set. `GET /healthz` answers while the process runs,
//! `GET /readyz` while the service is ready for work, and turns 503 the moment shutdown
//! begins, before anything drains.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use axum::http::{header, StatusCode};
use axum::response::IntoResponse;
use axum::routing::get;
use opentelemetry::trace::TracerProvider as _;
use opentelemetry::KeyValue;
use opentelemetry_otlp::WithExportConfig;
use opentelemetry_sdk::metrics::SdkMeterProvider;
use opentelemetry_sdk::trace::SdkTracerProvider;
use opentelemetry_sdk::Resource;
use serde::Deserialize;
use tracing_subscriber::{fmt, prelude::*, EnvFilter, Layer};

/// `[telemetry]`: where the operations endpoint listens, where traces go.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TelemetrySection {
    /// `/metrics`, `/healthz` and `/readyz` (HTTP). Default `0.0.0.0:9464`.
    #[serde(default = "default_listen")]
    pub listen: SocketAddr,
    /// An OTLP/gRPC collector (`http://otel-collector:4317`) for traces; none: no traces.
    #[serde(default)]
    pub otlp_endpoint: Option<String>,
}

impl Default for TelemetrySection {
    fn default() -> Self {
        Self {
            listen: default_listen(),
            otlp_endpoint: None,
        }
    }
}

fn default_listen() -> SocketAddr {
    SocketAddr::from(([0, 0, 0, 0], 9464))
}

impl TelemetrySection {
    /// What is wrong, each naming its key under `section`.
    pub fn problems(&self, section: &str) -> Vec<String> {
        match &self.otlp_endpoint {
            Some(e) if !(e.starts_with("http://") || e.starts_with("https://")) => vec![format!(
                "{section}.otlp_endpoint: `{e}` is not an http:// or https:// URL"
            )],
            _ => Vec::new(),
        }
    }
}

/// Whether the service takes work (`/readyz`). Once draining, never ready again.
#[derive(Clone, Default, Debug)]
pub struct Readiness(Arc<(AtomicBool, AtomicBool)>);

impl Readiness {
    pub fn set(&self, ready: bool) {
        self.0 .0.store(ready, Ordering::SeqCst);
    }

    pub fn is_ready(&self) -> bool {
        self.0 .0.load(Ordering::SeqCst) && !self.is_draining()
    }

    pub fn is_draining(&self) -> bool {
        self.0 .1.load(Ordering::SeqCst)
    }

    /// Not ready any more, for good: the service is shutting down.
    pub fn drain(&self) {
        self.0 .1.store(true, Ordering::SeqCst);
    }
}

/// The service's telemetry; keep it alive for the life of the process.
pub struct Telemetry {
    registry: prometheus::Registry,
    meters: SdkMeterProvider,
    tracer: Option<SdkTracerProvider>,
    pub readiness: Readiness,
}

/// Why telemetry could not start; each names the key to fix.
#[derive(Debug, thiserror::Error)]
pub enum TelemetryError {
    #[error("cannot set up the Prometheus exporter: {0}")]
    Prometheus(String),
    #[error("telemetry.otlp_endpoint: `{endpoint}`: {why}")]
    Otlp { endpoint: String, why: String },
    #[error("telemetry.listen: cannot listen on {listen}: {source}")]
    Listen {
        listen: SocketAddr,
        source: std::io::Error,
    },
}

impl Telemetry {
    /// Installs logging (with an OTLP span layer when configured) and the global meter
    /// provider. Call once, in the runtime, before any metric is touched: instruments
    /// made before it record nothing.
    pub fn init(
        service: &'static str,
        cfg: &TelemetrySection,
    ) -> Result<Telemetry, TelemetryError> {
        let resource = Resource::builder()
            .with_service_name(service)
            .with_attribute(KeyValue::new("service.version", env!("CARGO_PKG_VERSION")))
            .build();
        let registry = prometheus::Registry::new();
        let exporter = opentelemetry_prometheus::exporter()
            .with_registry(registry.clone())
            .scope_info_enabled(false)
            .build()
            .map_err(|e| TelemetryError::Prometheus(e.to_string()))?;
        let meters = SdkMeterProvider::builder()
            .with_reader(exporter)
            .with_resource(resource.clone())
            .build();
        opentelemetry::global::set_meter_provider(meters.clone());
        let tracer = match &cfg.otlp_endpoint {
            Some(endpoint) => {
                let exporter = opentelemetry_otlp::SpanExporter::builder()
                    .with_tonic()
                    .with_endpoint(endpoint)
                    .build()
                    .map_err(|e| TelemetryError::Otlp {
                        endpoint: endpoint.clone(),
                        why: e.to_string(),
                    })?;
                Some(
                    SdkTracerProvider::builder()
                        .with_batch_exporter(exporter)
                        .with_resource(resource)
                        .build(),
                )
            }
            None => None,
        };
        install_logging(tracer.as_ref().map(|t| t.tracer(service)));
        Ok(Telemetry {
            registry,
            meters,
            tracer,
            readiness: Readiness::default(),
        })
    }

    /// Serves `/metrics`, `/healthz` and `/readyz` on `listen` for the life of the
    /// process. Returns the address bound (a `:0` port is chosen by the system).
    pub async fn serve(&self, listen: SocketAddr) -> Result<SocketAddr, TelemetryError> {
        let bound = async {
            let listener = tokio::net::TcpListener::bind(listen).await?;
            let addr = listener.local_addr()?;
            Ok::<_, std::io::Error>((listener, addr))
        };
        let (listener, addr) = bound
            .await
            .map_err(|source| TelemetryError::Listen { listen, source })?;
        let (registry, live, ready) = (
            self.registry.clone(),
            self.readiness.clone(),
            self.readiness.clone(),
        );
        let app = axum::Router::new()
            .route("/metrics", get(move || metrics(registry.clone())))
            .route(
                "/healthz",
                get(move || async move {
                    if live.is_draining() {
                        (StatusCode::OK, "draining\n")
                    } else {
                        (StatusCode::OK, "ok\n")
                    }
                }),
            )
            .route(
                "/readyz",
                get(move || async move {
                    if ready.is_ready() {
                        (StatusCode::OK, "ready\n")
                    } else if ready.is_draining() {
                        (StatusCode::SERVICE_UNAVAILABLE, "draining\n")
                    } else {
                        (StatusCode::SERVICE_UNAVAILABLE, "not ready\n")
                    }
                }),
            );
        tokio::spawn(crate::listen::serve_http(
            listener,
            app,
            None,
            crate::listen::Limits::default(),
            crate::listen::SharedPeers::default(),
            "telemetry",
            tokio_util::sync::CancellationToken::new(),
        ));
        tracing::info!(%addr, "serving /metrics, /healthz and /readyz");
        Ok(addr)
    }

    /// Flushes spans and metrics still buffered.
    pub fn finish(self) {
        if let Some(t) = self.tracer {
            if let Err(e) = t.shutdown() {
                tracing::warn!(error = %e, "cannot flush the last spans");
            }
        }
        let _ = self.meters.shutdown();
    }
}

async fn metrics(registry: prometheus::Registry) -> impl IntoResponse {
    use prometheus::Encoder as _;
    let encoder = prometheus::TextEncoder::new();
    let mut body = Vec::new();
    match encoder.encode(&registry.gather(), &mut body) {
        Ok(()) => (
            StatusCode::OK,
            [(header::CONTENT_TYPE, encoder.format_type().to_owned())],
            body,
        ),
        Err(e) => (
            StatusCode::INTERNAL_SERVER_ERROR,
            [(header::CONTENT_TYPE, "text/plain".to_owned())],
            e.to_string().into_bytes(),
        ),
    }
}

/// Bucket bounds, in seconds, of the stage-latency histograms (commit to searchable is
/// meant to stay under 0.1 s, so the buckets are fine below it).
pub const LATENCY_BUCKETS: &[f64] = &[
    0.001, 0.0025, 0.005, 0.01, 0.02, 0.035, 0.05, 0.075, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
];

/// The log filter when `RUST_LOG` is unset (the Helm chart's `log.level` default too).
/// The ZooKeeper client logs a WARN for every failed reconnect attempt, hundreds a second
/// while the server is down; the session's own log lines say when the connection is lost,
/// confirmed again, or the session expired.
pub const DEFAULT_FILTER: &str = "info,librdkafka=warn,zookeeper_async=error";

/// One global filter for logs and spans alike (per-layer filters, mixed with an absent
/// layer, lost events).
fn install_logging(tracer: Option<opentelemetry_sdk::trace::Tracer>) {
    let filter =
        EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(DEFAULT_FILTER));
    let json = std::env::var("SLUICE_LOG_FORMAT").is_ok_and(|v| v == "json");
    let base = tracing_subscriber::registry().with(filter);
    let logs = if json {
        fmt::layer().json().with_target(true).boxed()
    } else {
        fmt::layer().with_target(true).boxed()
    };
    let result = match tracer {
        Some(t) => base
            .with(logs)
            .with(tracing_opentelemetry::layer().with_tracer(t))
            .try_init(),
        None => base.with(logs).try_init(),
    };
    // A second init (tests starting several services in one process) is harmless.
    let _ = result;
}
