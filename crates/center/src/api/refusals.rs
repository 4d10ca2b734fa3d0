//! Refused calls are counted, not stored one by one. Each refusal adds to
//! `sluice_center_refused_calls_total{method,outcome}`; the audit log gets at most one
//! entry every [`SAMPLE_EVERY`] for each kind of refusal — who (the authenticated user,
//! or `(not recognised)`), the method served and the outcome — saying how many like it
//! came since the previous one. Whoever can reach a port can therefore add only as many
//! rows as there are kinds of refusal, each once a minute, however fast they call, and
//! every name in an entry is one the center knows, never one the caller made up.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use opentelemetry::KeyValue;

/// How often one kind of refusal is recorded at most.
pub(super) const SAMPLE_EVERY: Duration = Duration::from_secs(60);

/// The user of an entry whose caller was not recognised.
pub(super) const NOT_RECOGNISED: &str = "(not recognised)";

/// The method of an entry for a path that names no method the center serves.
pub(super) const UNKNOWN_METHOD: &str = "(unknown method)";

/// Kinds remembered at most (they are bounded by users × methods × outcomes; this bounds
/// them again should that ever be large).
const MOST_KINDS: usize = 10_000;

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct Kind {
    user: String,
    method: String,
    outcome: String,
}

#[derive(Debug, Default)]
struct Tally {
    /// Refusals of this kind since the last recorded.
    unrecorded: u64,
    recorded_at: Option<Instant>,
}

#[derive(Default)]
pub(super) struct Refusals {
    kinds: Mutex<HashMap<Kind, Tally>>,
}

impl Refusals {
    /// Counts a refusal of `method` by `user` ending in `outcome`; `Some(n)` when it is to
    /// be recorded, `n` the refusals of its kind since the last one recorded.
    pub(super) fn count(
        &self,
        user: &str,
        method: &str,
        outcome: &str,
        now: Instant,
    ) -> Option<u64> {
        crate::metrics::REFUSED.add(
            1,
            &[
                KeyValue::new("method", method.to_owned()),
                KeyValue::new("outcome", outcome.to_owned()),
            ],
        );
        let mut kinds = self.kinds.lock().unwrap_or_else(|e| e.into_inner());
        if kinds.len() >= MOST_KINDS {
            kinds.retain(|_, t| {
                t.recorded_at
                    .is_some_and(|at| now.duration_since(at) < SAMPLE_EVERY)
            });
        }
        let tally = kinds
            .entry(Kind {
                user: user.to_owned(),
                method: method.to_owned(),
                outcome: outcome.to_owned(),
            })
            .or_default();
        if tally
            .recorded_at
            .is_some_and(|at| now.duration_since(at) < SAMPLE_EVERY)
        {
            tally.unrecorded += 1;
            return None;
        }
        let since = std::mem::take(&mut tally.unrecorded);
        tally.recorded_at = Some(now);
        Some(since)
    }
}

/// `method` if the center serves a method of that name, else [`UNKNOWN_METHOD`].
pub(super) fn served(method: &str) -> &str {
    if crate::access::need(method).is_some() {
        method
    } else {
        UNKNOWN_METHOD
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_kind_of_refusal_is_recorded_once_a_minute_with_how_many_came_between() {
        let r = Refusals::default();
        let t0 = Instant::now();
        let at = |s: u64| t0 + Duration::from_secs(s);
        assert_eq!(
            r.count(NOT_RECOGNISED, "ListSources", "Unauthenticated", at(0)),
            Some(0)
        );
        for s in 1..=30 {
            assert_eq!(
                r.count(NOT_RECOGNISED, "ListSources", "Unauthenticated", at(s)),
                None
            );
        }
        // Another kind is recorded on its own.
        assert_eq!(
            r.count("ann", "PutSource", "PermissionDenied", at(5)),
            Some(0)
        );
        assert_eq!(
            r.count(NOT_RECOGNISED, "ListSources", "Unauthenticated", at(60)),
            Some(30)
        );
        assert_eq!(
            r.count(NOT_RECOGNISED, "ListSources", "Unauthenticated", at(61)),
            None
        );
    }

    #[test]
    fn a_method_the_center_does_not_serve_is_named_as_unknown() {
        assert_eq!(served("PutSource"), "PutSource");
        assert_eq!(served("Login"), "Login");
        assert_eq!(served("DropAllTables<script>"), UNKNOWN_METHOD);
    }
}
