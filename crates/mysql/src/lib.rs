//! Reading MySQL and MariaDB: connection settings, the preflight that checks a source can
//! be streamed, the binlog reader that turns row events into typed row changes, and the
//! document reader that builds a pipeline's documents from its tables.
//! Knows nothing of Kafka or ZooKeeper.

pub mod auth;
pub mod catalog;
pub mod ddl;
pub mod decode;
pub mod docs;
pub mod error;
pub mod preflight;
pub mod reader;
pub mod server;
pub mod snapshot;
pub mod source;
pub mod tls;

pub use error::MysqlError;
pub use preflight::{bytes_behind, preflight, ServerInfo};
pub use reader::{BinlogReader, CommitPoint, Ddl, RowChange, SourceEvent, StartAt, Unreadable};
pub use server::{Flavor, Server};
pub use snapshot::{Key, KeyPart, SnapshotTable, Watermarks};
pub use source::{Access, SourceConfig, TableFilter};
pub use tls::ssl_opts;
