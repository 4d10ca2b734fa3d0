#[tokio::main]
async fn main() -> anyhow::Result<()> {
    sluice_runtime::service::main(
        "sluice-etl",
        "Applies Sluice change events from Kafka to Elasticsearch.",
        |path| Ok(sluice_etl::load(path)?),
        |c| c.telemetry.clone(),
        |cfg, ready, shutdown| async move { Ok(sluice_etl::run(cfg, ready, shutdown).await?) },
    )
    .await
}
