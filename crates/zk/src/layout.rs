//! What lives at each path of the layout (DESIGN.md), as JSON. The center writes
//! `mappings`, `pipelines` and `assignments`; workers write `workers`; the election writes
//! `election` and `leader`. Every record the leader writes carries its epoch: readers
//! ignore a record older than the current epoch in `leader` (a deposed leader's late write).

use serde::{Deserialize, Serialize};

/// `election/c-<seq>`: a center candidate.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct CenterRecord {
    pub id: String,
    /// Where its gRPC API listens.
    pub addr: String,
}

/// `workers/<id>` (ephemeral): a live worker.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct WorkerRecord {
    pub id: String,
    pub addr: String,
    pub version: String,
    pub started_at_ms: i64,
    /// When this registration (this session) was made.
    #[serde(default)]
    pub registered_at_ms: i64,
    /// How many binlog tasks it takes at most.
    pub capacity: u32,
}

/// `assignments/<worker>/<task>`: the leader gave `task` to `worker`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct AssignmentRecord {
    pub epoch: u64,
    /// Grows with every assignment of any task (the meta database's history id).
    pub generation: u64,
    pub assigned_at_ms: i64,
}

/// `mappings/<source>`: what a worker must capture for a source, and how to reach it.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct SourceRecord {
    pub epoch: u64,
    pub name: String,
    pub host: String,
    pub port: u16,
    pub user: String,
    /// `env:NAME` or `file:/path`, resolved by the worker: no password is ever stored here.
    pub password_ref: String,
    pub server_id: u32,
    pub tables: Vec<String>,
}

/// `pipelines/<name>`: what the etl must apply.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct PipelineRecord {
    pub epoch: u64,
    pub name: String,
    pub source: String,
    pub database: String,
    pub table: String,
    pub alias: String,
    pub columns: Vec<String>,
    pub shards: u32,
    pub replicas: u32,
    pub tombstone_retention: String,
}

pub fn worker(id: &str) -> String {
    format!("workers/{id}")
}

pub fn assignments(worker: &str) -> String {
    format!("assignments/{worker}")
}

pub fn assignment(worker: &str, task: &str) -> String {
    format!("assignments/{worker}/{task}")
}

pub fn mapping(source: &str) -> String {
    format!("mappings/{source}")
}

pub fn pipeline(name: &str) -> String {
    format!("pipelines/{name}")
}

pub fn lock(task: &str) -> String {
    format!("locks/{task}")
}

pub fn checkpoint(task: &str) -> String {
    format!("tasks/{task}/checkpoint")
}
