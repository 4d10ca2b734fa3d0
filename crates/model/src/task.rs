//! Where a worker's binlog task stands, as the worker reports it and the API and
//! `sluicectl` name it.

use crate::names::named;

/// A binlog task's state on the worker running it. The names (`as_str`) are what the
/// API's `Task.state` carries and the `sluice.worker.tasks` gauge's `state` label says.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum TaskState {
    /// Assigned, waiting for the task's lock (its previous holder's session to end).
    WaitingForLock,
    /// Reading the binlog and publishing its changes.
    Streaming,
    /// A transient error stopped the stream; it starts again after a pause.
    Retrying,
    /// A definite error stopped the task (an event says why and what fixes it).
    Failed,
    /// Not running: not started yet, or stopped by its unassignment or shutdown.
    #[default]
    Stopped,
}

named!(TaskState {
    WaitingForLock => "waiting for the task lock",
    Streaming => "streaming",
    Retrying => "retrying",
    Failed => "failed",
    Stopped => "stopped",
});

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_state_reads_back_from_its_name() {
        for s in TaskState::ALL {
            assert_eq!(TaskState::parse(s.as_str()), Some(s));
        }
        assert_eq!(TaskState::parse("running"), None);
    }
}
