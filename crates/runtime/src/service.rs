//! The life of a service process, the same for the center, the worker and the etl:
//! arguments, configuration, telemetry and its endpoint, signals, run, flush.

use std::future::Future;
use std::path::{Path, PathBuf};

use tokio_util::sync::CancellationToken;

use crate::telemetry::{Readiness, Telemetry, TelemetrySection};

/// Parses `--config PATH` (or `SLUICE_CONFIG_FILE`), loads it with `load`, starts
/// telemetry from the `[telemetry]` section `telemetry` picks, and runs `run` until it
/// returns (after a signal, once drained).
pub async fn main<C, Fut>(
    service: &'static str,
    about: &'static str,
    load: impl FnOnce(&Path) -> anyhow::Result<C>,
    telemetry: impl FnOnce(&C) -> TelemetrySection,
    run: impl FnOnce(C, Readiness, CancellationToken) -> Fut,
) -> anyhow::Result<()>
where
    Fut: Future<Output = anyhow::Result<()>>,
{
    let args = clap::Command::new(service)
        .version(env!("CARGO_PKG_VERSION"))
        .about(about)
        .arg(
            clap::Arg::new("config")
                .short('c')
                .long("config")
                .env("SLUICE_CONFIG_FILE")
                .required(true)
                .value_parser(clap::value_parser!(PathBuf))
                .help("Configuration file (TOML). `SLUICE_…` environment variables override it."),
        )
        .get_matches();
    let path = args
        .get_one::<PathBuf>("config")
        .expect("required argument");
    let config = load(path)?;
    let section = telemetry(&config);
    let telemetry = Telemetry::init(service, &section)?;
    telemetry.serve(section.listen).await?;
    let readiness = telemetry.readiness.clone();
    let shutdown = crate::shutdown::on_signals(move || readiness.drain());
    let result = run(config, telemetry.readiness.clone(), shutdown).await;
    telemetry.finish();
    result
}
