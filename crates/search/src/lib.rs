//! `sluice-search`: the search API applications call (README, "Searching from
//! applications"), served by every center.
//!
//! An application holds a token of its own; it may search only the aliases and run only
//! the templates its configuration names, at its own rate. Answers come from aliases only,
//! so a rebuild and its swap are invisible. A request may name a point of its source's
//! history (its transaction's GTID, or a position this API returned after its commit):
//! the answer then waits until the etl has applied that point to the alias's pipeline.

pub mod config;
pub mod fields;
mod metrics;
mod server;
pub mod template;
pub mod wait;

use std::collections::HashMap;
use std::future::Future;
use std::sync::Arc;

use sluice_model::SourcePoint;
use sluice_zk::layout::AppliedRecord;
use tokio::sync::watch;

pub use config::{AppConfig, SearchSection, TemplateConfig};
pub use server::{SearchApi, OPENAPI};

/// What the API needs to know of the cluster.
pub trait Cluster: Send + Sync + 'static {
    /// The cluster as last seen; a change notifies the receiver.
    fn view(&self) -> watch::Receiver<Arc<View>>;

    /// The current position of `source` (a commit made before the call is at or before it).
    fn position_of(&self, source: &str)
        -> impl Future<Output = Result<SourcePoint, String>> + Send;
}

/// Each alias's pipeline, and how far each pipeline is applied.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct View {
    pub aliases: HashMap<String, AliasTarget>,
    /// By pipeline.
    pub applied: HashMap<String, AppliedRecord>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AliasTarget {
    pub pipeline: String,
    pub source: String,
}
