#[tokio::main]
async fn main() -> anyhow::Result<()> {
    sluice_runtime::service::main(
        "sluice-center",
        "Sluice's control plane: elects a leader, assigns binlog tasks, serves the admin API.",
        |path| Ok(sluice_center::load(path)?),
        |c| c.telemetry.clone(),
        sluice_center::run,
    )
    .await
}
