//! How many requests this process sent ZooKeeper, by operation, whatever their answer:
//! what a service exports as counters (the center's `sluice_center_zk_writes_total{op}`,
//! README, Operating), so that what a leader's pass writes and reads can be measured.
//! Counted where every request goes out: [`Coordinator::call`](crate::Coordinator), the
//! connect's set-up and the session's heartbeat.

use std::sync::atomic::{AtomicU64, Ordering};

/// A request to ZooKeeper, as counted and as its errors name it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Op {
    Create,
    Set,
    Delete,
    Get,
    Children,
    Exists,
}

impl Op {
    pub const ALL: [Op; 6] = [
        Op::Create,
        Op::Set,
        Op::Delete,
        Op::Get,
        Op::Children,
        Op::Exists,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Op::Create => "create",
            Op::Set => "set",
            Op::Delete => "delete",
            Op::Get => "get",
            Op::Children => "children",
            Op::Exists => "exists",
        }
    }

    /// Whether the request changes the tree (a failed one too: the ensemble orders it
    /// like any other write).
    pub fn is_write(self) -> bool {
        matches!(self, Op::Create | Op::Set | Op::Delete)
    }
}

static SENT: [AtomicU64; Op::ALL.len()] = [const { AtomicU64::new(0) }; Op::ALL.len()];

/// Counts one request of `op`, about to be sent.
pub(crate) fn count(op: Op) {
    SENT[op as usize].fetch_add(1, Ordering::Relaxed);
}

/// The requests of `op` this process sent so far, in every session.
pub fn sent(op: Op) -> u64 {
    SENT[op as usize].load(Ordering::Relaxed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_op_counts_apart_and_writes_are_told_from_reads() {
        let before: Vec<u64> = Op::ALL.iter().map(|&op| sent(op)).collect();
        count(Op::Set);
        count(Op::Set);
        count(Op::Get);
        let after: Vec<u64> = Op::ALL.iter().map(|&op| sent(op)).collect();
        // Other tests of this process may count too: at least what was counted here.
        assert!(after[Op::Set as usize] >= before[Op::Set as usize] + 2);
        assert!(after[Op::Get as usize] > before[Op::Get as usize]);
        let writes: Vec<&str> = Op::ALL
            .into_iter()
            .filter(|op| op.is_write())
            .map(Op::as_str)
            .collect();
        assert_eq!(writes, ["create", "set", "delete"]);
    }
}
