//! A leader's term as its work sees it: the ZooKeeper session it leads in, the epoch it
//! acts under, and whether it may act right now. The phases of the leader's pass (publish,
//! assign, builds, runs, rebuilds) take it instead of calling back into the leader.

use sluice_zk::{Coordinator, Leadership};

use crate::error::{CenterError, Result};

pub(crate) struct Term<'a> {
    pub(crate) coord: &'a Coordinator,
    leadership: &'a Leadership,
}

impl<'a> Term<'a> {
    pub(crate) fn new(coord: &'a Coordinator, leadership: &'a Leadership) -> Self {
        Term { coord, leadership }
    }

    /// The epoch every record and fenced write of this term carries.
    pub(crate) fn epoch(&self) -> u64 {
        self.leadership.epoch()
    }

    /// `Ok` while the session is confirmed alive within the lease, so that no other
    /// replica can lead yet; a transient error while the connection is in doubt (the pass
    /// is tried again once it is back, or the term ends when it is lost).
    pub(crate) fn acting(&self) -> Result<()> {
        if self.leadership.is_acting() {
            Ok(())
        } else {
            Err(CenterError::transient(
                "not acting (ZooKeeper connection in doubt)",
            ))
        }
    }

    /// The error for a record of `what` that carries `epoch`, newer than this term's.
    pub(crate) fn deposed_by(&self, what: &str, epoch: u64) -> CenterError {
        CenterError::Deposed(format!(
            "deposed: {what} carries epoch {epoch}, newer than ours ({})",
            self.epoch()
        ))
    }
}
