//! A pipeline's earlier index versions: which are kept, and which of those are kept
//! *current* — the etl writes live changes to them as to the live one, so the alias can
//! move back to them (`pipelines rollback`) without losing a change.
//!
//! The live version is always announced to the etl as history too (when the pipeline
//! keeps any), and the alias moves only once every etl member writes to it that way: so
//! from the moment the alias leaves a version, the etl is already writing it as history.

/// Kept versions, newest first, and the current ones among them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct History {
    pub kept: Vec<u32>,
    pub current: Vec<u32>,
}

impl History {
    /// What the etl is told to write as history: the current versions and, when the
    /// pipeline keeps any, the live one (about to become history at the next swap).
    pub fn announced(&self, live: u32, keep: u32) -> Vec<u32> {
        if keep == 0 {
            return Vec::new();
        }
        let mut out = vec![live];
        out.extend(self.current.iter().filter(|v| **v != live));
        out
    }

    /// The alias left `previous` (written as history since `announced`): they join the
    /// history, current if announced. Returns the versions no longer kept (beyond
    /// `keep`, oldest first) — their indexes are to be deleted.
    pub fn retire(&mut self, previous: &[u32], announced: &[u32], keep: u32) -> Vec<u32> {
        for v in previous {
            if !self.kept.contains(v) {
                self.kept.push(*v);
            }
            if announced.contains(v) && !self.current.contains(v) {
                self.current.push(*v);
            }
        }
        self.kept.sort_unstable_by(|a, b| b.cmp(a));
        let dropped: Vec<u32> = self.kept.split_off((keep as usize).min(self.kept.len()));
        self.current.retain(|v| self.kept.contains(v));
        self.current.sort_unstable_by(|a, b| b.cmp(a));
        dropped.into_iter().rev().collect()
    }

    /// Takes `v` out (it went live again, or is dropped).
    pub fn remove(&mut self, v: u32) {
        self.kept.retain(|k| *k != v);
        self.current.retain(|k| *k != v);
    }

    /// The version a rollback goes to: `to`, or the newest current one. Refusals say why.
    pub fn rollback_target(&self, to: Option<u32>, live: u32) -> Result<u32, String> {
        match to {
            None => self.current.first().copied().ok_or_else(|| {
                if self.kept.is_empty() {
                    "no earlier version is kept (keep_history is 0, or no build replaced one yet)".into()
                } else {
                    format!(
                        "no kept version is current (kept: {}); build instead",
                        list(&self.kept)
                    )
                }
            }),
            Some(v) if v == live => Err(format!("version {v} is the live one already")),
            Some(v) if self.current.contains(&v) => Ok(v),
            Some(v) if self.kept.contains(&v) => Err(format!(
                "version {v} is kept but not current (never built whole, or it missed live changes since it left the alias); roll back to one of [{}] or build",
                list(&self.current)
            )),
            Some(v) => Err(format!(
                "version {v} is not a kept version of this pipeline (kept: [{}])",
                list(&self.kept)
            )),
        }
    }
}

fn list(versions: &[u32]) -> String {
    versions
        .iter()
        .map(u32::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_swap_keeps_the_newest_and_drops_the_rest() {
        let mut h = History::default();
        assert_eq!(h.announced(1, 2), vec![1]);
        assert!(h.retire(&[1], &[1], 2).is_empty());
        assert_eq!(h.current, vec![1]);
        let announced = h.announced(2, 2);
        assert_eq!(announced, vec![2, 1]);
        assert!(h.retire(&[2], &announced, 2).is_empty());
        assert_eq!(
            (h.kept.clone(), h.current.clone()),
            (vec![2, 1], vec![2, 1])
        );
        let announced = h.announced(3, 2);
        assert_eq!(h.retire(&[3], &announced, 2), vec![1]);
        assert_eq!(
            (h.kept.clone(), h.current.clone()),
            (vec![3, 2], vec![3, 2])
        );
        // Keeping none: the earlier version goes at the swap.
        let mut none = History::default();
        assert!(none.announced(1, 0).is_empty());
        assert_eq!(none.retire(&[1], &[], 0), vec![1]);
        assert_eq!(none, History::default());
    }

    #[test]
    fn only_a_current_version_is_a_rollback_target() {
        let h = History {
            kept: vec![4, 3, 2],
            current: vec![4, 3],
        };
        assert_eq!(h.rollback_target(None, 5), Ok(4));
        assert_eq!(h.rollback_target(Some(3), 5), Ok(3));
        let stale = h.rollback_target(Some(2), 5).unwrap_err();
        assert!(
            stale.contains("not current") && stale.contains("[4, 3]"),
            "{stale}"
        );
        assert!(h
            .rollback_target(Some(5), 5)
            .unwrap_err()
            .contains("live one already"));
        assert!(h
            .rollback_target(Some(9), 5)
            .unwrap_err()
            .contains("not a kept version"));
        assert!(History::default()
            .rollback_target(None, 1)
            .unwrap_err()
            .contains("no earlier version"));
        // A version announced but never retired (not kept) is not a target.
        let fresh = History {
            kept: vec![2],
            current: vec![],
        };
        assert!(fresh
            .rollback_target(None, 3)
            .unwrap_err()
            .contains("build instead"));
    }
}
