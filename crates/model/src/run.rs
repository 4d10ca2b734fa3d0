//! Where a chunked run (a check, a compare, a delayed job) stands.

use crate::names::named;

/// A run's state. The names (`as_str`) are what the meta database stores and the API's
/// `Check.state` carries.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RunState {
    /// Planned or being worked by the workers.
    Running,
    /// Every chunk has its result.
    Done,
    /// It could not be planned or worked (the tally's error says why).
    Failed,
}

named!(RunState {
    Running => "running",
    Done => "done",
    Failed => "failed",
});

/// What a run does with its chunks. The names (`as_str`) are what the coordination
/// records, the meta database and the API's `Check.kind` carry.
#[derive(Debug, Clone, Copy, Default, serde::Serialize, serde::Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum RunKind {
    /// A consistency check of the live version against MySQL.
    #[default]
    Check,
    /// A check of a build held for verification, which also compares its documents with
    /// the live version's.
    Compare,
    /// A delayed job: its chunks list the root keys its changes reach, and a worker
    /// rebuilds those documents instead of comparing them.
    Delayed,
}

named!(RunKind {
    Check => "check",
    Compare => "compare",
    Delayed => "delayed",
});

impl RunKind {
    pub fn is_check(&self) -> bool {
        *self == RunKind::Check
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_state_reads_back_from_its_name() {
        for s in RunState::ALL {
            assert_eq!(RunState::parse(s.as_str()), Some(s));
        }
        assert_eq!(RunState::parse("finished"), None);
    }
}
