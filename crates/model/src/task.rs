//! Where a worker's binlog task stands, as the worker reports it and the API and
//! `sluicectl` name it.

use std::fmt;

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

impl TaskState {
    pub const ALL: [TaskState; 5] = [
        TaskState::WaitingForLock,
        TaskState::Streaming,
        TaskState::Retrying,
        TaskState::Failed,
        TaskState::Stopped,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            TaskState::WaitingForLock => "waiting for the task lock",
            TaskState::Streaming => "streaming",
            TaskState::Retrying => "retrying",
            TaskState::Failed => "failed",
            TaskState::Stopped => "stopped",
        }
    }

    /// The state `name` names (as [`TaskState::as_str`] writes it).
    pub fn parse(name: &str) -> Option<TaskState> {
        TaskState::ALL.into_iter().find(|s| s.as_str() == name)
    }
}

impl fmt::Display for TaskState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

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
