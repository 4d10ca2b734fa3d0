//! A source as the center keeps it: one MySQL instance (one binlog task), reached with a
//! password that is never stored — only a reference to where each service finds it.

use serde::{Deserialize, Serialize};

use crate::Secret;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SourceSpec {
    /// The instance's name in Sluice; also its task's name and part of topic names.
    pub name: String,
    pub host: String,
    pub port: u16,
    pub user: String,
    /// `env:NAME` (a variable of the service's environment) or `file:/path` (a mounted
    /// secret), resolved by whichever service connects: workers to stream, the etl to
    /// read documents back, centers to check pipelines against the tables.
    pub password_ref: String,
    /// Replication server id a worker announces; unique among the server's replicas.
    pub server_id: u32,
    /// `db.table` or `db.*` patterns to capture; empty captures every non-system table.
    #[serde(default)]
    pub tables: Vec<String>,
    /// Sharded tables to capture besides `tables` (every table each pattern matches, now
    /// or once created). Kept by the center from its pipelines' sharded tables.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub shards: Vec<crate::pipeline::TablePattern>,
    /// Kept by the center, not set by the operator: where the binlog coordinates of the
    /// source begin.
    #[serde(default)]
    pub coordinates: Coordinates,
}

/// Where a source's binlog coordinates begin. Binlog file numbers start again on another
/// server, and versions are built from them, so whenever the coordinates restart (a
/// failover to a new primary, a re-snapshot) the center bumps `epoch`, the most
/// significant part of every version: changes read after the bump win over everything
/// indexed before it. The center persists each source's epoch and never hands out the
/// same one twice, not even to a source deleted and added again.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Coordinates {
    pub epoch: u16,
    /// How a task whose checkpoint is of an older epoch starts.
    #[serde(default)]
    pub restart: Restart,
}

/// How a task starts when the source's epoch is newer than its checkpoint's.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Restart {
    /// From the checkpoint's GTID state, on whatever server the source now names (a
    /// failover: the new primary has every transaction the old one confirmed).
    #[default]
    Gtid,
    /// At the server's current end (a re-snapshot: the builds it starts read the rest).
    End,
}

impl Restart {
    pub fn as_str(self) -> &'static str {
        match self {
            Restart::Gtid => "gtid",
            Restart::End => "end",
        }
    }

    pub fn parse(s: &str) -> Option<Restart> {
        match s {
            "gtid" => Some(Restart::Gtid),
            "end" => Some(Restart::End),
            _ => None,
        }
    }
}

impl SourceSpec {
    /// The password, from the reference, where this process's allowlist (`refs`) lets it
    /// be read.
    pub fn password(&self, refs: &crate::SecretRefs) -> Result<Secret, String> {
        refs.resolve(&self.password_ref)
            .map_err(|e| format!("source {}: password_ref: {e}", self.name))
    }

    /// What is wrong with the source on its face, each naming its key.
    pub fn problems(&self) -> Vec<String> {
        let mut p = Vec::new();
        if !crate::pipeline::is_name(&self.name, 64) {
            p.push(format!(
                "name: `{}` must be 1..=64 characters of [A-Za-z0-9._-]",
                self.name
            ));
        }
        if self.host.is_empty() {
            p.push("host: required".into());
        }
        if self.port == 0 {
            p.push("port: must be a TCP port".into());
        }
        if self.user.is_empty() {
            p.push("user: required".into());
        }
        if let Err(e) = self.password_ref.parse::<crate::SecretRef>() {
            p.push(format!("password_ref: {e}"));
        }
        if self.server_id == 0 {
            p.push(
                "server_id: must be a non-zero replication server id, unique among the server's replicas"
                    .into(),
            );
        }
        p
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(password_ref: &str) -> SourceSpec {
        SourceSpec {
            name: "m1".into(),
            host: "db".into(),
            port: 3306,
            user: "u".into(),
            password_ref: password_ref.into(),
            server_id: 7,
            tables: vec![],
            shards: Vec::new(),
            coordinates: Coordinates::default(),
        }
    }

    #[test]
    fn password_references_resolve_where_allowed_or_say_why() {
        let dir = std::env::temp_dir().join(format!("sluice-pw-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("m1");
        std::fs::write(&path, "s3cret\n").unwrap();
        let refs = crate::SecretRefs {
            env: vec![],
            dirs: vec![dir.clone()],
        };
        let from_file = spec(&format!("file:{}", path.display()));
        assert_eq!(from_file.password(&refs).unwrap().expose(), "s3cret");
        std::fs::remove_dir_all(&dir).unwrap();
        let refs = crate::SecretRefs {
            env: vec!["TEST_SURELY_*".into()],
            dirs: vec![],
        };
        let e = spec("env:TEST_SURELY_UNSET").password(&refs).unwrap_err();
        assert!(
            e.starts_with("source m1: password_ref:") && e.contains("TEST_SURELY_UNSET is not set"),
            "{e}"
        );
        assert!(spec("hunter2").problems()[0].starts_with("password_ref:"));
        assert!(spec("file:relative").problems()[0].starts_with("password_ref:"));
        assert!(spec("env:X").problems().is_empty());
    }
}
