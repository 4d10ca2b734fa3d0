//! What Sluice's services and adapters agree on, and nothing that runs: the pipeline and
//! source definitions, binlog positions and GTID sets, the external document version
//! derived from them, the change-event envelope published to Kafka, dead letters, secrets
//! and TLS files. It pulls no telemetry, web server or async runtime, so the adapters
//! (MySQL, Kafka, Elasticsearch, ZooKeeper) depend on it alone; the services' process
//! life (configuration loading, signals, telemetry) is `sluice-runtime`'s.

pub mod build;
pub mod dead_letter;
pub mod delayed;
pub mod diff;
pub mod event;
pub mod failpoint;
pub mod listed;
pub mod mapping;
mod names;
pub mod pipeline;
pub mod position;
pub mod retry;
pub mod run;
pub mod secret;
pub mod source;
pub mod task;
pub mod tls;
pub mod version;

pub use build::{Availability, BuildPhase};
pub use delayed::DelayedChange;
pub use event::{
    BuildDocument, ChangeEvent, ColumnInfo, DdlEvent, Op, SourceInfo, ENVELOPE_VERSION,
};
pub use failpoint::failpoint;
pub use mapping::FieldOverride;
pub use pipeline::{PipelineSpec, Relation, RelationKind};
pub use position::{BinlogPosition, Checkpoint, GtidSet, PositionError, SourcePoint};
pub use retry::{Backoff, RetryPolicy};
pub use run::{ResyncScope, RunKind, RunState};
pub use secret::{Secret, SecretRef, SecretRefs};
pub use source::{Coordinates, Restart, SourceSpec};
pub use task::TaskState;
pub use tls::{TlsFiles, TlsPem};
pub use version::{ExternalVersion, VersionError};

/// Milliseconds since the Unix epoch by the wall clock (for records and reports, never
/// for ordering changes).
pub fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}
