#[tokio::main]
async fn main() -> anyhow::Result<()> {
    sluice_core::service::main(
        "sluice-worker",
        "Streams MySQL binlogs into Kafka.",
        |path| Ok(sluice_worker::load(path)?),
        |c| c.telemetry.clone(),
        sluice_worker::run,
    )
    .await
}
