use std::path::PathBuf;

use clap::Parser;

/// Applies Sluice change events from Kafka to Elasticsearch.
#[derive(Parser)]
#[command(version)]
struct Args {
    /// Configuration file (TOML). `SLUICE_…` environment variables override it.
    #[arg(short, long, env = "SLUICE_CONFIG_FILE")]
    config: PathBuf,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    sluice_core::telemetry::init_logging();
    let config = sluice_etl::load(&args.config)?;
    let shutdown = sluice_core::shutdown::on_signals();
    sluice_etl::run(config, shutdown).await
}
