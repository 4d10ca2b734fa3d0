//! The states the API carries twice — as an enum the compiler checks and, for peers that
//! predate the enum, as its name — to and from the model's enums. Nothing else converts
//! them.

use sluice_model::{Availability, BuildPhase, RunKind, RunState, TaskState};

use crate::v1;

/// Both directions between a model enum and its wire enum, whose variants share names
/// (the wire's `Unspecified` aside: a peer that did not set the field).
macro_rules! same_variants {
    ($model:ident, $wire:ident, [$($v:ident),+ $(,)?]) => {
        impl From<$model> for v1::$wire {
            fn from(m: $model) -> Self {
                match m {
                    $($model::$v => v1::$wire::$v,)+
                }
            }
        }

        impl v1::$wire {
            /// The model's value; `None` when unspecified.
            pub fn model(self) -> Option<$model> {
                match self {
                    v1::$wire::Unspecified => None,
                    $(v1::$wire::$v => Some($model::$v),)+
                }
            }
        }
    };
}

same_variants!(
    Availability,
    PipelineAvailability,
    [Unavailable, Building, Available]
);
same_variants!(
    BuildPhase,
    BuildPhase,
    [
        None,
        WaitingForEtl,
        Planning,
        Snapshotting,
        CatchingUp,
        Held,
        Swap,
        Done,
        Failed
    ]
);
same_variants!(
    TaskState,
    TaskState,
    [WaitingForLock, Streaming, Retrying, Failed, Stopped]
);
same_variants!(RunState, RunState, [Running, Done, Failed]);
same_variants!(RunKind, RunKind, [Check, Compare, Delayed, Resync]);

/// The enum when the peer set it, else the state its name names (a peer that predates
/// the enum field).
fn either<M>(typed: Option<M>, name: &str, parse: fn(&str) -> Option<M>) -> Option<M> {
    typed.or_else(|| parse(name))
}

impl v1::Pipeline {
    pub fn availability_of(&self) -> Option<Availability> {
        either(
            self.availability().model(),
            &self.state,
            Availability::parse,
        )
    }
}

impl v1::BuildStatus {
    pub fn phase_of(&self) -> Option<BuildPhase> {
        either(self.build_phase().model(), &self.phase, BuildPhase::parse)
    }

    /// Sets the phase, as the enum and as its name.
    pub fn put_phase(&mut self, phase: BuildPhase) {
        self.phase = phase.as_str().into();
        self.set_build_phase(phase.into());
    }
}

impl v1::Task {
    pub fn state_of(&self) -> Option<TaskState> {
        either(self.task_state().model(), &self.state, TaskState::parse)
    }
}

impl v1::TaskProgress {
    pub fn state_of(&self) -> Option<TaskState> {
        either(self.task_state().model(), &self.state, TaskState::parse)
    }
}

impl v1::Check {
    pub fn state_of(&self) -> Option<RunState> {
        either(self.run_state().model(), &self.state, RunState::parse)
    }

    pub fn kind_of(&self) -> Option<RunKind> {
        either(self.run_kind().model(), &self.kind, RunKind::parse)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_state_crosses_the_wire_and_back() {
        for p in BuildPhase::ALL {
            assert_eq!(v1::BuildPhase::from(p).model(), Some(p));
        }
        for s in TaskState::ALL {
            assert_eq!(v1::TaskState::from(s).model(), Some(s));
        }
        for s in RunState::ALL {
            assert_eq!(v1::RunState::from(s).model(), Some(s));
        }
        for a in Availability::ALL {
            assert_eq!(v1::PipelineAvailability::from(a).model(), Some(a));
        }
        for k in RunKind::ALL {
            assert_eq!(v1::RunKind::from(k).model(), Some(k));
        }
    }

    #[test]
    fn a_peer_that_predates_the_enums_is_read_by_the_names() {
        let old = v1::BuildStatus {
            phase: "catching up".into(),
            ..Default::default()
        };
        assert_eq!(old.phase_of(), Some(BuildPhase::CatchingUp));
        let mut new = v1::BuildStatus::default();
        new.put_phase(BuildPhase::Held);
        assert_eq!(
            (new.phase.as_str(), new.phase_of()),
            ("held", Some(BuildPhase::Held))
        );
        let check = v1::Check {
            kind: "delayed".into(),
            run_state: v1::RunState::Done as i32,
            ..Default::default()
        };
        assert_eq!(check.kind_of(), Some(RunKind::Delayed));
        assert_eq!(check.state_of(), Some(RunState::Done));
        assert_eq!(v1::Task::default().state_of(), None);
    }
}
