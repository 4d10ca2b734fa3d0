//! Types every Sluice service shares: the pipeline and source definitions, binlog
//! positions and GTID sets, the external document version derived from them, the
//! change-event envelope published to Kafka, layered configuration loading, secrets,
//! shutdown and telemetry set-up.

pub mod config;
pub mod dead_letter;
pub mod delayed;
pub mod event;
pub mod failpoint;
pub mod mapping;
pub mod pipeline;
pub mod position;
pub mod service;
pub mod shutdown;
pub mod source;
pub mod telemetry;
pub mod tls;
pub mod version;

pub use config::{load_config, load_config_from, ConfigError, Secret};
pub use delayed::DelayedChange;
pub use event::{
    BuildDocument, ChangeEvent, ColumnInfo, DdlEvent, Op, SourceInfo, ENVELOPE_VERSION,
};
pub use failpoint::failpoint;
pub use mapping::FieldOverride;
pub use pipeline::{PipelineSpec, Relation, RelationKind};
pub use position::{BinlogPosition, Checkpoint, GtidSet, PositionError};
pub use source::{Coordinates, Restart, SourceSpec};
pub use tls::{TlsFiles, TlsPem};
pub use version::{ExternalVersion, VersionError};

/// Milliseconds since the Unix epoch by the wall clock (for records and reports, never
/// for ordering changes).
pub fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}
