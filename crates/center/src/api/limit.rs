//! Failed attempts at a credential, counted by key within a sliding [`WINDOW`]: a key with
//! its allowance of failures in the window is refused until the oldest leaves it. The
//! console counts failed logins by user *and* client address, and by client address alone
//! with a larger allowance (one address trying many users) — never by user alone, so
//! guessing a user's password from elsewhere slows the guesser and never locks the user
//! out. The gRPC gate counts unknown API tokens by address, so a caller cannot make the
//! meta database look up tokens at speed.

use std::collections::{HashMap, VecDeque};
use std::time::{Duration, Instant};

/// How far back failures count.
pub(super) const WINDOW: Duration = Duration::from_secs(300);

/// The most keys remembered: past it, the ones whose last failure is oldest go (down to
/// nine tenths of it).
const MOST_KEYS: usize = 100_000;

/// What a key may fail within [`WINDOW`] before it is refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Allowance(pub(super) usize);

/// A user from one address: a few tries, as a person mistyping.
pub(super) const PER_USER_AND_ADDRESS: Allowance = Allowance(5);
/// One address, whichever users: many people behind one untrusted NAT, not a sweep.
pub(super) const PER_ADDRESS: Allowance = Allowance(50);

#[derive(Default)]
pub(super) struct Limiter {
    failures: HashMap<String, VecDeque<Instant>>,
    /// Failures counted: every so many, keys out of the window are dropped.
    counted: u64,
}

impl Limiter {
    /// How long the longest refused of `keys` (each with its allowance) is still refused
    /// for; `None` when none is.
    pub(super) fn refused_for(
        &mut self,
        keys: &[(String, Allowance)],
        now: Instant,
    ) -> Option<Duration> {
        keys.iter()
            .filter_map(|(k, allowance)| {
                let times = self.failures.get_mut(k)?;
                while times
                    .front()
                    .is_some_and(|t| now.duration_since(*t) >= WINDOW)
                {
                    times.pop_front();
                }
                let over = times.len().checked_sub(allowance.0)?;
                // Refused until enough of the oldest leave the window.
                Some(WINDOW - now.duration_since(times[over]))
            })
            .max()
    }

    /// Counts a failure against each of `keys`.
    pub(super) fn failed(&mut self, keys: &[(String, Allowance)], now: Instant) {
        for (k, allowance) in keys {
            let times = self.failures.entry(k.clone()).or_default();
            times.push_back(now);
            // The newest `allowance` decide a refusal; older ones need no memory.
            while times.len() > allowance.0.max(1) {
                times.pop_front();
            }
        }
        self.counted += 1;
        // Keys whose failures all left the window go, so the map does not grow forever.
        if self.counted % 256 == 0 || self.failures.len() > MOST_KEYS {
            self.failures
                .retain(|_, t| t.back().is_some_and(|t| now.duration_since(*t) < WINDOW));
        }
        if self.failures.len() > MOST_KEYS {
            let mut last: Vec<Instant> = self
                .failures
                .values()
                .filter_map(|t| t.back().copied())
                .collect();
            last.sort_unstable();
            // Down to nine tenths, so the next failures need no such pass.
            let cut = last[self.failures.len() - MOST_KEYS * 9 / 10];
            self.failures
                .retain(|_, t| t.back().is_some_and(|t| *t > cut));
        }
    }

    /// Takes back the newest failure counted against each of `keys` (an attempt counted
    /// before it was known to succeed).
    pub(super) fn forgive(&mut self, keys: &[(String, Allowance)]) {
        for (k, _) in keys {
            if let Some(times) = self.failures.get_mut(k) {
                times.pop_back();
            }
        }
    }

    /// Forgets a key's failures (a user's from an address, after a login that succeeded
    /// there).
    pub(super) fn succeeded(&mut self, key: &str) {
        self.failures.remove(key);
    }
}

/// The keys a login attempt of `user` from `client` counts against.
/// A name that could name no user counts as one (so the keys stay short, whatever a
/// caller posts), and a client by its address or its IPv6 /64.
pub(super) fn login_keys(user: &str, client: std::net::IpAddr) -> [(String, Allowance); 2] {
    let user = if crate::credentials::check_user_name(user).is_ok() {
        user
    } else {
        "(not a user name)"
    };
    let client = sluice_runtime::listen::client_block(client);
    [
        (format!("login:{user}@{client}"), PER_USER_AND_ADDRESS),
        (format!("login-from:{client}"), PER_ADDRESS),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(s: &str) -> std::net::IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn guesses_from_one_address_are_refused_and_the_right_password_elsewhere_is_not() {
        let mut l = Limiter::default();
        let t0 = Instant::now();
        let attacker = login_keys("admin", at("10.0.0.66"));
        for i in 0..PER_USER_AND_ADDRESS.0 {
            assert_eq!(l.refused_for(&attacker, t0), None, "failure {i}");
            l.failed(&attacker, t0 + Duration::from_secs(i as u64));
        }
        let refused = l
            .refused_for(&attacker, t0 + Duration::from_secs(10))
            .unwrap();
        assert_eq!(refused, WINDOW - Duration::from_secs(10));
        // The real admin, from another address, is not refused.
        assert_eq!(
            l.refused_for(&login_keys("admin", at("10.0.0.7")), t0),
            None
        );
        // Another user from the attacker's address is, only once that address has swept.
        assert_eq!(l.refused_for(&login_keys("bob", at("10.0.0.66")), t0), None);
        // Once the oldest failure is out of the window, one more try is let through.
        assert_eq!(l.refused_for(&attacker, t0 + WINDOW), None);
    }

    #[test]
    fn an_address_trying_many_users_is_refused_for_all_of_them() {
        let mut l = Limiter::default();
        let t0 = Instant::now();
        for n in 0..PER_ADDRESS.0 {
            l.failed(&login_keys(&format!("user{n}"), at("10.0.0.66")), t0);
        }
        assert!(l
            .refused_for(&login_keys("fresh", at("10.0.0.66")), t0)
            .is_some());
        assert!(l
            .refused_for(&login_keys("fresh", at("10.0.0.67")), t0)
            .is_none());
    }

    #[test]
    fn a_success_clears_its_pair_not_the_address() {
        let mut l = Limiter::default();
        let t0 = Instant::now();
        let keys = login_keys("ann", at("10.0.0.1"));
        for _ in 0..PER_USER_AND_ADDRESS.0 - 1 {
            l.failed(&keys, t0);
        }
        l.succeeded(&keys[0].0);
        l.failed(&keys, t0);
        assert!(l.refused_for(&keys[..1], t0).is_none());
        assert_eq!(l.failures[&keys[1].0].len(), PER_USER_AND_ADDRESS.0);
        l.forgive(&keys[1..]);
        assert_eq!(l.failures[&keys[1].0].len(), PER_USER_AND_ADDRESS.0 - 1);
    }

    #[test]
    fn keys_stay_short_and_an_ipv6_client_is_its_block() {
        let long = "x".repeat(1 << 20);
        let keys = login_keys(&long, at("2001:db8::1"));
        assert!(keys[0].0.len() < 100, "{}", keys[0].0.len());
        assert_eq!(keys[1], login_keys("ann", at("2001:db8::ffff"))[1]);
    }

    #[test]
    fn the_keys_remembered_are_bounded() {
        let mut l = Limiter::default();
        let t0 = Instant::now();
        for n in 0..MOST_KEYS + 10 {
            l.failed(
                &[(format!("k{n}"), Allowance(1))],
                t0 + Duration::from_micros(n as u64),
            );
        }
        assert!(l.failures.len() <= MOST_KEYS, "{}", l.failures.len());
        assert!(
            l.failures.contains_key(&format!("k{}", MOST_KEYS + 9)),
            "the newest stay"
        );
        // However often one key fails, it remembers only what decides its refusal.
        let key = [("hot".to_owned(), PER_ADDRESS)];
        for n in 0..10_000u64 {
            l.failed(&key, t0 + Duration::from_micros(n));
        }
        assert_eq!(l.failures["hot"].len(), PER_ADDRESS.0);
        assert!(l.refused_for(&key, t0 + Duration::from_secs(1)).is_some());
    }
}
