//! `sluice-elastic`: the Elasticsearch side of Sluice, knowing nothing of MySQL or
//! Kafka.
//!
//! - [`bulk`](crate::encode_bulk): a pure NDJSON encoder for versioned bulk writes
//!   and a pure per-item classifier of bulk responses
//!   ([`ItemOutcome::Applied`] / [`Stale`](ItemOutcome::Stale) /
//!   [`Retry`](ItemOutcome::Retry) / [`Rejected`](ItemOutcome::Rejected)).
//! - [`EsClient`]: the REST calls the etl and the center need (bulk, index and
//!   alias management, refresh, count, mget, settings), against Elasticsearch
//!   7.x/8.x and OpenSearch 2.x.
//! - [`EsError`]: whole-call failures, each saying which call and index failed and
//!   whether retrying can help ([`EsError::is_transient`]).
//!
//! Every write carries `"version_type":"external"`: the server keeps the highest
//! version per document id, including for a deleted document's tombstone, for
//! `index.gc_deletes` (60 s by default). A replayed or reordered write therefore
//! comes back [`ItemOutcome::Stale`] instead of moving a document backwards, as long
//! as it arrives within that window after a delete; index builds that may replay
//! older changes later than that need a longer `index.gc_deletes`.

mod bulk;
mod client;
mod config;
mod error;
pub mod parts;
mod sweep;
mod versions;
mod writes;

pub use bulk::{
    classify_bulk_response, encode_bulk, validate_op, BulkOp, ItemOutcome, MAX_ID_BYTES,
    MAX_VERSION,
};
pub use client::{AliasAction, Distribution, EsClient, EsClientConfig, Hit, ServerInfo};
pub use config::EsSection;
pub use error::{EsError, ServerError};
pub use parts::PartsWrite;
pub use versions::{index_version, versioned_index};
