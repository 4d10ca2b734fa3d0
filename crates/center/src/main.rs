use std::path::PathBuf;

use clap::Parser;

/// Sluice's control plane: elects a leader, assigns binlog tasks, serves the admin API.
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
    let config = sluice_center::load(&args.config)?;
    let shutdown = sluice_core::shutdown::on_signals();
    sluice_center::run(config, shutdown).await
}
