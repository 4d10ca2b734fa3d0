//! Failed logins, counted per user name and per address: after [`FAILURES`] within
//! [`WINDOW`] the key is refused until the oldest of them is out of the window, so a
//! password cannot be guessed at speed, for one user from many addresses or for many
//! users from one.

use std::collections::{HashMap, VecDeque};
use std::time::{Duration, Instant};

/// Failures a key may have within [`WINDOW`] before it is refused.
pub(super) const FAILURES: usize = 5;
pub(super) const WINDOW: Duration = Duration::from_secs(300);

#[derive(Default)]
pub(super) struct Limiter {
    failures: HashMap<String, VecDeque<Instant>>,
}

impl Limiter {
    /// How long every one of `keys` is still refused for, the longest of them; `None`
    /// when none is.
    pub(super) fn refused_for(&mut self, keys: &[String], now: Instant) -> Option<Duration> {
        keys.iter()
            .filter_map(|k| {
                let times = self.failures.get_mut(k)?;
                while times
                    .front()
                    .is_some_and(|t| now.duration_since(*t) >= WINDOW)
                {
                    times.pop_front();
                }
                (times.len() >= FAILURES).then(|| WINDOW - now.duration_since(times[0]))
            })
            .max()
    }

    /// Counts a failure against each of `keys`.
    pub(super) fn failed(&mut self, keys: &[String], now: Instant) {
        for k in keys {
            self.failures.entry(k.clone()).or_default().push_back(now);
        }
        // Keys whose failures all left the window go, so the map does not grow forever.
        self.failures
            .retain(|_, t| t.back().is_some_and(|t| now.duration_since(*t) < WINDOW));
    }

    /// Takes back the newest failure counted against each of `keys` (an attempt counted
    /// before it was known to succeed).
    pub(super) fn forgive(&mut self, keys: &[String]) {
        for k in keys {
            if let Some(times) = self.failures.get_mut(k) {
                times.pop_back();
            }
        }
    }

    /// Forgets the user's failures after a login that succeeded (the address keeps its
    /// own: an address guessing for many users is not cleared by one of them).
    pub(super) fn succeeded(&mut self, user_key: &str) {
        self.failures.remove(user_key);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_is_refused_after_its_failures_until_the_oldest_leaves_the_window() {
        let mut l = Limiter::default();
        let t0 = Instant::now();
        let keys = ["user:ann".to_owned(), "addr:10.0.0.1".to_owned()];
        for i in 0..FAILURES {
            assert_eq!(l.refused_for(&keys, t0), None, "failure {i}");
            l.failed(&keys, t0 + Duration::from_secs(i as u64));
        }
        let refused = l.refused_for(&keys, t0 + Duration::from_secs(10)).unwrap();
        assert_eq!(refused, WINDOW - Duration::from_secs(10));
        // Another user from the same address is refused too; from elsewhere, not.
        let other = ["user:bob".to_owned(), "addr:10.0.0.1".to_owned()];
        assert!(l.refused_for(&other, t0).is_some());
        let elsewhere = ["user:bob".to_owned(), "addr:10.0.0.2".to_owned()];
        assert_eq!(l.refused_for(&elsewhere, t0), None);
        // Once the oldest failure is out of the window, one more try is let through.
        assert_eq!(l.refused_for(&keys, t0 + WINDOW), None);
    }

    #[test]
    fn a_success_clears_the_user_not_the_address() {
        let mut l = Limiter::default();
        let t0 = Instant::now();
        let keys = ["user:ann".to_owned(), "addr:10.0.0.1".to_owned()];
        for _ in 0..FAILURES - 1 {
            l.failed(&keys, t0);
        }
        l.succeeded("user:ann");
        l.failed(&keys, t0);
        assert!(l.refused_for(&["user:ann".to_owned()], t0).is_none());
        assert!(l.refused_for(&["addr:10.0.0.1".to_owned()], t0).is_some());
        l.forgive(&["addr:10.0.0.1".to_owned()]);
        assert!(l.refused_for(&["addr:10.0.0.1".to_owned()], t0).is_none());
    }
}
