//! Where a pipeline's build stands, as the leader drives it one step per pass and as
//! the API and `sluicectl` name it.

use crate::names::named;

/// A build's phase. The names (`as_str`) are what the API's `BuildStatus.phase` carries.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BuildPhase {
    /// No build of the pipeline has run.
    None,
    /// Every live etl member must say it writes to the new version before anything is
    /// read.
    WaitingForEtl,
    /// A worker cuts the table into primary-key chunks.
    Planning,
    /// Workers read the chunks.
    Snapshotting,
    /// The etl applies the catch-up markers written after the last chunk.
    CatchingUp,
    /// A verified build that caught up, beside the live version until its swap is
    /// released.
    Held,
    /// The alias moves to the new version.
    Swap,
    /// The last build's alias moved.
    Done,
    /// The last build failed (the status's message says why).
    Failed,
}

named!(BuildPhase {
    None => "none",
    WaitingForEtl => "waiting for etl",
    Planning => "planning",
    Snapshotting => "snapshotting",
    CatchingUp => "catching up",
    Held => "held",
    Swap => "swap",
    Done => "done",
    Failed => "failed",
});

impl BuildPhase {
    /// Whether the build is still doing something (neither none, held, done nor failed).
    pub fn running(self) -> bool {
        !matches!(
            self,
            BuildPhase::None | BuildPhase::Held | BuildPhase::Done | BuildPhase::Failed
        )
    }
}

/// Whether a pipeline's alias answers, which follows from its versions. The names
/// (`as_str`) are what the API's `Pipeline.state` carries.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Availability {
    /// Never built: no version is live.
    Unavailable,
    /// A version is being built.
    Building,
    /// A built version is live.
    Available,
}

named!(Availability {
    Unavailable => "unavailable",
    Building => "building",
    Available => "available",
});

impl Availability {
    /// `Building` while a version is being built, `Available` once one was, else
    /// `Unavailable` (a version number 0 is none).
    pub fn of(live_version: u32, building_version: u32) -> Availability {
        if building_version > 0 {
            Availability::Building
        } else if live_version > 0 {
            Availability::Available
        } else {
            Availability::Unavailable
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_phase_reads_back_from_its_name() {
        for p in BuildPhase::ALL {
            assert_eq!(BuildPhase::parse(p.as_str()), Some(p));
        }
        assert_eq!(BuildPhase::parse("swapping"), None);
        assert!(BuildPhase::Snapshotting.running() && !BuildPhase::Held.running());
    }

    #[test]
    fn availability_follows_from_the_versions() {
        assert_eq!(Availability::of(0, 0), Availability::Unavailable);
        assert_eq!(Availability::of(0, 1), Availability::Building);
        assert_eq!(Availability::of(3, 4), Availability::Building);
        assert_eq!(Availability::of(3, 0), Availability::Available);
        for a in Availability::ALL {
            assert_eq!(Availability::parse(a.as_str()), Some(a));
        }
    }
}
