//! The search API's metrics (names as Prometheus shows them):
//! `sluice_search_requests_total{app,outcome}` (`ok`, or the refusal's code:
//! `unauthenticated`, `rate_limited`, `not_applied`…) and `sluice_search_wait_seconds` (how
//! long reads of an application's own write waited for the etl).

use std::sync::LazyLock;
use std::time::Duration;

use opentelemetry::metrics::{Counter, Histogram};
use opentelemetry::KeyValue;

struct Metrics {
    requests: Counter<u64>,
    wait: Histogram<f64>,
}

/// Made on first use, which comes after the service's telemetry is installed.
static METRICS: LazyLock<Metrics> = LazyLock::new(|| {
    let m = opentelemetry::global::meter("sluice");
    Metrics {
        requests: m
            .u64_counter("sluice.search.requests")
            .with_description("Requests to the search API, by application and outcome")
            .build(),
        wait: m
            .f64_histogram("sluice.search.wait")
            .with_unit("s")
            .with_description("How long reads of an application's own write waited")
            .build(),
    }
});

pub(crate) fn request(app: &str, outcome: &str) {
    METRICS.requests.add(
        1,
        &[
            KeyValue::new("app", app.to_owned()),
            KeyValue::new("outcome", outcome.to_owned()),
        ],
    );
}

pub(crate) fn waited(d: Duration) {
    METRICS.wait.record(d.as_secs_f64(), &[]);
}
