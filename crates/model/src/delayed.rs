//! A change of a `delayed` relation's table, as the etl hands it to the center: instead of
//! rebuilding the documents that contain the row, the etl publishes which row it was (by
//! the values that join it to its parent) on the delayed topic, and the leader records it,
//! deduplicated, in the meta database until the delayed job applies it (README, "Delayed
//! changes").

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// Version of the format.
pub const DELAYED_VERSION: u8 = 1;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DelayedChange {
    pub v: u8,
    pub pipeline: String,
    /// The kind of document (parent-child mode has several; else the root table's name).
    pub kind: String,
    /// The relation names from the root down to the changed table.
    pub node: Vec<String>,
    /// The values, in a row image, of the relation's join columns (its side of `on`):
    /// the documents to rebuild are those these values lead up to.
    pub values: Vec<Value>,
    /// The external version of the newest change folded into this one.
    pub version: u64,
    /// How many changes of the row it folds (the etl hands a row over once per batch).
    #[serde(default = "one")]
    pub changes: u64,
}

fn one() -> u64 {
    1
}

impl DelayedChange {
    /// What makes two changes one for the delayed job: the same pipeline, relation and
    /// join values (the documents are read when the job runs, so the newest wins).
    pub fn node_key(&self) -> String {
        format!("{}/{}", self.kind, self.node.join("."))
    }

    pub fn values_text(&self) -> String {
        serde_json::to_string(&self.values).expect("JSON values serialize")
    }
}
