//! The one connect-and-reconnect routine of every service that uses ZooKeeper: a session
//! after another until shutdown, with the service's retry policy between failures.
//!
//! ```ignore
//! let mut sessions = Sessions::new(cfg, retry, "the worker", shutdown.clone());
//! while let Some(coord) = sessions.next().await {
//!     let end = work(&coord).await; // until the session expires, say
//!     sessions.ended(coord, end).await;
//! }
//! ```

use sluice_model::{Backoff, RetryPolicy};
use tokio_util::sync::CancellationToken;

use crate::{Coordinator, SessionState, ZkConfig};

/// How the work of one session ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SessionEnd {
    /// The session ended (expired, say) or the work finished: start over at once.
    Ended,
    /// The work failed: start over after the next pause of the retry policy, so a fault
    /// that outlives sessions (a meta database down) is not met again and again at once.
    Failed,
}

/// One ZooKeeper session after another, until shutdown.
pub struct Sessions {
    cfg: ZkConfig,
    backoff: Backoff,
    what: &'static str,
    shutdown: CancellationToken,
}

impl Sessions {
    /// Sessions for `what` (named in the logs), pausing by `policy` while ZooKeeper
    /// cannot be reached or the work keeps failing.
    pub fn new(
        cfg: ZkConfig,
        policy: RetryPolicy,
        what: &'static str,
        shutdown: CancellationToken,
    ) -> Self {
        Sessions {
            cfg,
            backoff: policy.backoff(),
            what,
            shutdown,
        }
    }

    /// A new session, once ZooKeeper can be reached; `None` at shutdown.
    pub async fn next(&mut self) -> Option<Coordinator> {
        while !self.shutdown.is_cancelled() {
            match Coordinator::connect(&self.cfg).await {
                Ok(c) => return Some(c),
                Err(e) => {
                    let pause = self.backoff.next_pause();
                    tracing::error!(error = %e, retry_in = ?pause, "cannot reach ZooKeeper for {}; retrying", self.what);
                    self.wait(pause).await;
                }
            }
        }
        None
    }

    /// Closes the session the work ran in; after a failure, pauses before the next.
    pub async fn ended(&mut self, coord: Coordinator, end: SessionEnd) {
        let expired = *coord.session().borrow() == SessionState::Expired;
        coord.close().await;
        if self.shutdown.is_cancelled() {
            return;
        }
        if expired {
            tracing::warn!(
                "ZooKeeper session of {} expired; reconnecting with a new session",
                self.what
            );
        }
        match end {
            SessionEnd::Ended => self.backoff.reset(),
            SessionEnd::Failed => {
                let pause = self.backoff.next_pause();
                tracing::warn!(retry_in = ?pause, "{} failed; starting over with a new session after a pause", self.what);
                self.wait(pause).await;
            }
        }
    }

    async fn wait(&self, pause: std::time::Duration) {
        tokio::select! {
            _ = tokio::time::sleep(pause) => {}
            _ = self.shutdown.cancelled() => {}
        }
    }
}
