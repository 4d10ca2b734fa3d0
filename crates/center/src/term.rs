//! A leader's term as its work sees it: the error that says another replica took over.

use crate::meta::MetaError;

/// Whether `e` says this replica no longer leads: the meta database or ZooKeeper holds a
/// newer epoch than the one it acts under.
pub(crate) fn is_deposed(e: &anyhow::Error) -> bool {
    e.chain().any(|c| {
        matches!(
            c.downcast_ref::<MetaError>(),
            Some(MetaError::Deposed { .. })
        ) || c.downcast_ref::<Deposed>().is_some()
    })
}

#[derive(Debug, thiserror::Error)]
#[error("deposed: {0} carries epoch {1}, newer than ours")]
pub(crate) struct Deposed(pub(crate) String, pub(crate) u64);
