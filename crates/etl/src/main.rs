#[tokio::main]
async fn main() -> anyhow::Result<()> {
    sluice_runtime::service::main(
        "sluice-etl",
        "Applies Sluice change events from Kafka to Elasticsearch.",
        |path| Ok(sluice_etl::load(path)?),
        |c| c.telemetry.clone(),
        sluice_etl::run,
    )
    .await
}
