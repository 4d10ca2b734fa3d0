//! Where a chunked run (a check, a compare, a delayed job) stands.

use crate::names::named;

/// A run's state. The names (`as_str`) are what the meta database stores and the API's
/// `Check.state` carries.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RunState {
    /// Planned or being worked by the workers.
    Running,
    /// Every chunk has its result.
    Done,
    /// It could not be planned or worked (the tally's error says why).
    Failed,
}

named!(RunState {
    Running => "running",
    Done => "done",
    Failed => "failed",
});

/// What a run does with its chunks. The names (`as_str`) are what the coordination
/// records, the meta database and the API's `Check.kind` carry.
#[derive(Debug, Clone, Copy, Default, serde::Serialize, serde::Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum RunKind {
    /// A consistency check of the live version against MySQL.
    #[default]
    Check,
    /// A check of a build held for verification, which also compares its documents with
    /// the live version's.
    Compare,
    /// A delayed job: its chunks list the root keys its changes reach, and a worker
    /// rebuilds those documents instead of comparing them.
    Delayed,
    /// A resync: chosen documents (root rows matching a condition, or listed ids) rebuilt
    /// on demand, without comparing; its chunks are key ranges narrowed by the condition,
    /// or lists of root keys.
    Resync,
}

named!(RunKind {
    Check => "check",
    Compare => "compare",
    Delayed => "delayed",
    Resync => "resync",
});

impl RunKind {
    pub fn is_check(&self) -> bool {
        *self == RunKind::Check
    }

    /// Whether its documents are rebuilt and sent through the etl without comparing.
    pub fn rebuilds(&self) -> bool {
        matches!(self, RunKind::Delayed | RunKind::Resync)
    }
}

/// What a resync rebuilds: the documents of the root rows matching `where` (checked as
/// a pipeline filter is), or the documents with these `_id`s.
#[derive(Debug, Clone, Default, serde::Serialize, serde::Deserialize, PartialEq, Eq)]
pub struct ResyncScope {
    #[serde(default, rename = "where", skip_serializing_if = "String::is_empty")]
    pub condition: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ids: Vec<String>,
}

impl ResyncScope {
    /// Exactly one of a condition or ids, the condition a valid filter: `Err` names the
    /// field at fault and why.
    pub fn check(&self) -> Result<(), (&'static str, String)> {
        match (self.condition.trim().is_empty(), self.ids.is_empty()) {
            (true, true) => Err((
                "where",
                "name the documents to resync: a condition on the root table (--where) or their ids (--ids)".into(),
            )),
            (false, false) => Err(("where", "give a condition or ids, not both".into())),
            (false, true) => crate::pipeline::filter::check(&self.condition)
                .map(|_| ())
                .map_err(|why| ("where", format!("the condition {why}"))),
            (true, false) => match self.ids.iter().find(|id| id.is_empty()) {
                Some(_) => Err(("ids", "an id is empty".into())),
                None => Ok(()),
            },
        }
    }

    /// How lists and events name it.
    pub fn describe(&self) -> String {
        if self.ids.is_empty() {
            format!("where {}", self.condition.trim())
        } else {
            format!("ids {}", self.ids.join(", "))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_resync_names_a_condition_or_ids_and_the_condition_is_a_filter() {
        let scope = |condition: &str, ids: &[&str]| ResyncScope {
            condition: condition.into(),
            ids: ids.iter().map(|s| s.to_string()).collect(),
        };
        assert_eq!(scope("`id` < 10", &[]).check(), Ok(()));
        assert_eq!(scope("", &["1", "2"]).check(), Ok(()));
        assert_eq!(scope(" ", &[]).check().unwrap_err().0, "where");
        assert_eq!(scope("id < 3", &["1"]).check().unwrap_err().0, "where");
        let (field, why) = scope("id < 3; DROP TABLE t", &[]).check().unwrap_err();
        assert_eq!(field, "where");
        assert!(why.starts_with("the condition "), "{why}");
        assert_eq!(scope("", &["1", ""]).check().unwrap_err().0, "ids");
        assert_eq!(scope("", &["1", "2"]).describe(), "ids 1, 2");
        let json = serde_json::to_string(&scope("id < 3", &[])).unwrap();
        assert_eq!(json, r#"{"where":"id < 3"}"#);
    }

    #[test]
    fn every_state_reads_back_from_its_name() {
        for s in RunState::ALL {
            assert_eq!(RunState::parse(s.as_str()), Some(s));
        }
        assert_eq!(RunState::parse("finished"), None);
    }
}
