//! The one retry policy of every service: a jittered exponential backoff between a first
//! pause and a cap, both named in each service's configuration (`retry_backoff`,
//! `retry_backoff_max`). Every pause is drawn between half and all of its nominal length
//! ("equal jitter"), so the workers that lost ZooKeeper together do not all come back in
//! the same millisecond, and no pause is ever shorter than half the first one.
//!
//! The policy is arithmetic only; a loop waits the pause it gives with the service's
//! shutdown token (`sluice_runtime::shutdown::pause`), or the ZooKeeper adapter's own
//! reconnect routine does.

use std::time::Duration;

/// How long to wait between attempts: from `first`, doubling after each failed attempt,
/// up to `cap`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RetryPolicy {
    pub first: Duration,
    pub cap: Duration,
}

impl RetryPolicy {
    pub const fn new(first: Duration, cap: Duration) -> Self {
        Self { first, cap }
    }

    /// A fresh sequence of pauses under this policy.
    pub fn backoff(self) -> Backoff {
        Backoff {
            policy: self,
            pause: self.first,
        }
    }

    /// What is wrong with the policy, its keys named as `first_key` and `cap_key`.
    pub fn problems(&self, first_key: &str, cap_key: &str) -> Vec<String> {
        let mut found = Vec::new();
        if self.first.is_zero() {
            found.push(format!("{first_key}: must be above zero"));
        }
        if self.cap < self.first {
            found.push(format!(
                "{cap_key}: must be at least {first_key} ({})",
                humantime::format_duration(self.first)
            ));
        }
        found
    }
}

/// One run of attempts under a [`RetryPolicy`]: each [`Backoff::next_pause`] gives the pause
/// before the next attempt and doubles the one after; [`Backoff::reset`] starts over once
/// an attempt succeeded.
#[derive(Clone, Debug)]
pub struct Backoff {
    policy: RetryPolicy,
    pause: Duration,
}

impl Backoff {
    /// The pause before the next attempt, after one that failed outright.
    pub fn next_pause(&mut self) -> Duration {
        let pause = jittered(self.pause, fastrand::f64());
        self.pause = (self.pause * 2).min(self.policy.cap);
        pause
    }

    /// The pause before the next attempt, after one that got part of the way (a bulk the
    /// server took some of): the pace holds instead of doubling, since the work is getting
    /// through at the rate the server sets.
    pub fn hold(&mut self) -> Duration {
        jittered(self.pause, fastrand::f64())
    }

    /// Back to the first pause, after an attempt that succeeded.
    pub fn reset(&mut self) {
        self.pause = self.policy.first;
    }

    /// The nominal length of the next pause (before jitter), for the tests.
    #[cfg(test)]
    fn nominal(&self) -> Duration {
        self.pause
    }
}

/// `pause` scaled into [pause/2, pause] by `unit` in [0, 1).
fn jittered(pause: Duration, unit: f64) -> Duration {
    pause / 2 + pause.mul_f64(unit.clamp(0.0, 1.0) / 2.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn pauses_double_to_the_cap_and_start_over_on_reset() {
        let mut b = RetryPolicy::new(100 * MS, 1000 * MS).backoff();
        let nominal: Vec<Duration> = (0..6)
            .map(|_| {
                let n = b.nominal();
                let pause = b.next_pause();
                assert!(
                    pause >= n / 2 && pause <= n,
                    "{pause:?} outside [{n:?}/2, {n:?}]"
                );
                n
            })
            .collect();
        assert_eq!(
            nominal,
            [100, 200, 400, 800, 1000, 1000].map(|m| m * MS).to_vec()
        );
        b.reset();
        assert_eq!(b.nominal(), 100 * MS);
    }

    #[test]
    fn a_partial_success_holds_the_pace() {
        let mut b = RetryPolicy::new(100 * MS, 1000 * MS).backoff();
        b.next_pause();
        b.next_pause();
        for _ in 0..5 {
            assert!(b.hold() <= 400 * MS);
            assert_eq!(b.nominal(), 400 * MS);
        }
    }

    #[test]
    fn jitter_spreads_between_half_and_all() {
        assert_eq!(jittered(1000 * MS, 0.0), 500 * MS);
        assert_eq!(jittered(1000 * MS, 0.5), 750 * MS);
        assert!(jittered(1000 * MS, 0.999_999) <= 1000 * MS);
        // Two workers that failed together wait different times.
        let mut a = RetryPolicy::new(1000 * MS, 1000 * MS).backoff();
        let spread: std::collections::BTreeSet<Duration> =
            (0..50).map(|_| a.next_pause()).collect();
        assert!(spread.len() > 40, "pauses hardly differ: {spread:?}");
    }

    #[test]
    fn problems_name_the_keys() {
        let p = RetryPolicy::new(Duration::ZERO, Duration::ZERO);
        assert_eq!(
            p.problems("a.first", "a.cap"),
            ["a.first: must be above zero"]
        );
        let p = RetryPolicy::new(2 * MS, MS);
        assert_eq!(
            p.problems("a.first", "a.cap"),
            ["a.cap: must be at least a.first (2ms)"]
        );
    }
}
