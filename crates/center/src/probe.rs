//! What every center replica knows of the services it depends on: every
//! [`EVERY`] it asks the meta database (`SELECT 1`), its ZooKeeper session and, when it has
//! a `[kafka]` section, the Kafka brokers (a Metadata request), each within [`WITHIN`].
//! Each answer becomes `sluice_center_dependency_up{dependency}` (1 or 0) and the gRPC
//! health of `sluice.dependency.<name>` (SERVING or NOT_SERVING), and a change is logged.
//! The replica's own health (`""`, `/readyz`) stays what it serves: its ZooKeeper session.

use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;
use tonic_health::ServingStatus;

use crate::Shared;

/// How often the dependencies are asked.
const EVERY: Duration = Duration::from_secs(5);
/// How long one answer may take.
const WITHIN: Duration = Duration::from_secs(5);

/// Asks the dependencies until `shutdown`.
pub(crate) async fn dependencies(
    shared: Arc<Shared>,
    health: tonic_health::server::HealthReporter,
    shutdown: CancellationToken,
) {
    let kafka = shared.cfg.kafka.as_ref().and_then(|k| {
        sluice_kafka::Probe::new(k)
            .inspect_err(
                |e| tracing::warn!(error = %e, "cannot make a Kafka client to probe the brokers"),
            )
            .ok()
    });
    let mut last: std::collections::BTreeMap<&'static str, bool> = Default::default();
    loop {
        let meta = tokio::time::timeout(WITHIN, shared.meta.ping())
            .await
            .map_err(|_| format!("no answer within {WITHIN:?}"))
            .and_then(|r| r.map_err(|e| e.to_string()));
        let zookeeper = match shared.coord() {
            Some(c) if c.is_live() => Ok(()),
            _ => Err("no live session".to_owned()),
        };
        let mut answers = vec![("meta", meta), ("zookeeper", zookeeper)];
        if let Some(probe) = &kafka {
            let brokers = match probe.brokers(WITHIN).await {
                Ok(0) => Err("the cluster names no broker".to_owned()),
                Ok(_) => Ok(()),
                Err(e) => Err(e.to_string()),
            };
            answers.push(("kafka", brokers));
        }
        for (name, answer) in answers {
            let up = answer.is_ok();
            if last.insert(name, up) != Some(up) {
                match &answer {
                    Ok(()) => tracing::info!(dependency = name, "answers"),
                    Err(e) => tracing::warn!(dependency = name, error = %e, "does not answer"),
                }
                let status = if up {
                    ServingStatus::Serving
                } else {
                    ServingStatus::NotServing
                };
                health
                    .set_service_status(format!("sluice.dependency.{name}"), status)
                    .await;
            }
            crate::metrics::update(|g| {
                g.dependencies.insert(name, up);
            });
        }
        tokio::select! {
            _ = tokio::time::sleep(EVERY) => {}
            _ = shutdown.cancelled() => return,
        }
    }
}
