#[tokio::main]
async fn main() -> anyhow::Result<()> {
    sluice_runtime::service::main(
        "sluice-center",
        "Sluice's control plane: elects a leader, assigns binlog tasks, serves the admin API.",
        |path| Ok(sluice_center::load(path)?),
        |c| c.telemetry.clone(),
        |cfg, ready, shutdown| async move { Ok(sluice_center::run(cfg, ready, shutdown).await?) },
    )
    .await
}
