//! The leader keeps the operational history within its retention (`[retention]`): at the
//! start of its term and every hour, it deletes events, audit entries, finished runs
//! and assignment history older than theirs, and delayed changes
//! whose pipeline is gone. Each pass's deletions are counted in
//! `sluice_center_history_deleted_total{history}` and logged.

use std::time::Duration;

use opentelemetry::KeyValue;
use tokio_util::sync::CancellationToken;

use crate::meta::History;
use crate::Shared;

/// How often the leader deletes what is past its retention.
const EVERY: Duration = Duration::from_secs(3600);

/// Deletes what is past its retention now and every [`EVERY`], until `shutdown` (the
/// term's end drops it).
pub(crate) async fn keep(
    shared: &Shared,
    shutdown: &CancellationToken,
) -> crate::error::Result<()> {
    loop {
        sweep(shared).await;
        if !sluice_runtime::shutdown::pause(EVERY, shutdown).await {
            return Ok(());
        }
    }
}

/// One pass; a failure is logged and tried again at the next.
async fn sweep(shared: &Shared) {
    let r = &shared.cfg.retention;
    for history in History::ALL {
        let kept = match history {
            History::Events => r.events,
            History::Audit => r.audit,
            History::Runs => r.runs,
            History::Assignments => r.assignments,
        };
        note(
            history.as_str(),
            shared.meta.forget_older(history, kept).await,
        );
    }
    note("delayed", shared.meta.forget_orphan_delayed().await);
}

fn note(history: &'static str, deleted: Result<u64, crate::meta::MetaError>) {
    match deleted {
        Ok(0) => {}
        Ok(n) => {
            crate::metrics::FORGOTTEN.add(n, &[KeyValue::new("history", history)]);
            tracing::info!(history, deleted = n, "deleted history past its retention");
        }
        Err(e) => {
            tracing::warn!(history, error = %e, "cannot delete history past its retention; trying again in an hour")
        }
    }
}
