//! Failpoints: named places where a debug build aborts the process when the environment
//! says so, for the tests of crash windows that cannot be reached from outside (after
//! Elasticsearch acknowledged a batch but before its offsets are committed; between a
//! TABLE_MAP event and its rows event; at a build's hand-off from snapshot to stream,
//! after its markers are written and after one is recorded as applied).
//! `FAILPOINTS=name[@n],…` aborts at the `n`-th pass of `name` (default: the first).
//! Release builds compile them to nothing.

/// Aborts the process here if the failpoint `name` is armed and its count is reached.
#[cfg(debug_assertions)]
pub fn failpoint(name: &str) {
    use std::collections::HashMap;
    use std::sync::{LazyLock, Mutex};

    static ARMED: LazyLock<Option<Mutex<HashMap<String, u64>>>> = LazyLock::new(|| {
        let spec = std::env::var("FAILPOINTS").ok()?;
        let armed: HashMap<String, u64> = spec
            .split(',')
            .filter(|s| !s.trim().is_empty())
            .map(|s| match s.trim().split_once('@') {
                Some((name, n)) => (name.to_owned(), n.parse().unwrap_or(1).max(1)),
                None => (s.trim().to_owned(), 1),
            })
            .collect();
        Some(Mutex::new(armed))
    });
    let Some(armed) = ARMED.as_ref() else {
        return;
    };
    let mut armed = armed.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(left) = armed.get_mut(name) {
        *left -= 1;
        if *left == 0 {
            eprintln!("failpoint {name}: aborting the process");
            std::process::abort();
        }
    }
}

/// Release builds: nothing.
#[cfg(not(debug_assertions))]
#[inline(always)]
pub fn failpoint(_name: &str) {}
