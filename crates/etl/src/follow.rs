//! Cluster mode: the pipelines the center publishes in ZooKeeper (`pipelines/<name>`),
//! followed with watches so pipelines are added, changed and removed without a restart.

use std::time::Duration;

use sluice_zk::layout::PipelineRecord;
use sluice_zk::{Coordinator, SessionState, ZkConfig};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::config::PipelineConfig;

/// Keeps `tx` equal to the file's pipelines plus the center's, until `shutdown`. A
/// center pipeline with the name of a file pipeline is ignored (the file wins).
pub(crate) async fn follow(
    zk: ZkConfig,
    from_file: Vec<PipelineConfig>,
    tx: watch::Sender<Option<Vec<PipelineConfig>>>,
    shutdown: CancellationToken,
) {
    while !shutdown.is_cancelled() {
        let coord = match Coordinator::connect(&zk).await {
            Ok(c) => c,
            Err(e) => {
                tracing::error!(error = %e, "cannot reach ZooKeeper for the pipelines; retrying");
                sluice_core::shutdown::pause(Duration::from_secs(1), &shutdown).await;
                continue;
            }
        };
        let session = coord.session();
        while !shutdown.is_cancelled() && *session.borrow() != SessionState::Expired {
            let (list, watches) = match look(&coord, &from_file).await {
                Ok(v) => v,
                Err(e) => {
                    tracing::warn!(error = %e, "cannot read the pipelines; retrying");
                    sluice_core::shutdown::pause(Duration::from_secs(1), &shutdown).await;
                    continue;
                }
            };
            tx.send_if_modified(|current| {
                if current.as_ref() == Some(&list) {
                    false
                } else {
                    tracing::info!(
                        pipelines = ?list.iter().map(|p| p.name.as_str()).collect::<Vec<_>>(),
                        "pipelines changed"
                    );
                    *current = Some(list);
                    true
                }
            });
            coord.wait_any(watches, &shutdown).await;
        }
        coord.close().await;
    }
}

async fn look(
    coord: &Coordinator,
    from_file: &[PipelineConfig],
) -> Result<(Vec<PipelineConfig>, Vec<sluice_zk::Watch>), sluice_zk::ZkError> {
    let mut list = from_file.to_vec();
    let (names, w) = coord.children_watched("pipelines").await?;
    let mut watches = vec![w];
    for name in names {
        let (node, w) = coord
            .get_watched(&sluice_zk::layout::pipeline(&name))
            .await?;
        watches.push(w);
        let Some(node) = node else { continue };
        match serde_json::from_slice::<PipelineRecord>(&node.data) {
            Ok(r) if from_file.iter().any(|p| p.name == r.name) => {
                tracing::warn!(pipeline = %r.name, "the center's pipeline has the name of one in the file; using the file's");
            }
            Ok(r) => list.push(r.into()),
            Err(e) => {
                tracing::warn!(pipeline = %name, error = %e, "unreadable pipeline record; ignoring it")
            }
        }
    }
    Ok((list, watches))
}
