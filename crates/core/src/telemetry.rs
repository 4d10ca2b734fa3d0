//! Structured logs through `tracing`. `RUST_LOG` filters (default `info`);
//! `SLUICE_LOG_FORMAT=json` switches to JSON lines.

use tracing_subscriber::{fmt, prelude::*, EnvFilter};

pub fn init_logging() {
    let filter = EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| EnvFilter::new("info,librdkafka=warn,zookeeper_async=warn"));
    let json = std::env::var("SLUICE_LOG_FORMAT").is_ok_and(|v| v == "json");
    let registry = tracing_subscriber::registry().with(filter);
    let result = if json {
        registry
            .with(fmt::layer().json().with_target(true))
            .try_init()
    } else {
        registry.with(fmt::layer().with_target(true)).try_init()
    };
    // A second init (tests starting several services in one process) is harmless.
    let _ = result;
}
