//! Sluice's gRPC API (`proto/sluice/v1/admin.proto`): the admin service and the workers'
//! report service, with the descriptor set the centers serve for reflection, and the
//! conversions between its messages and the shared definitions ([`convert`]).

pub mod convert;
pub mod spec_text;
pub mod states;

#[allow(clippy::all, rust_2018_idioms)]
pub mod v1 {
    tonic::include_proto!("sluice.v1");
}

/// The encoded descriptors of every message and service, for gRPC reflection.
pub const FILE_DESCRIPTOR_SET: &[u8] =
    include_bytes!(concat!(env!("OUT_DIR"), "/sluice_descriptor.bin"));

/// The metadata a worker's report carries its report key in: the key whose digest the
/// worker's own registration (`workers/<id>`) publishes, so that a report is taken only
/// from the process registered as the worker it names.
pub const REPORT_KEY_HEADER: &str = "x-sluice-report-key";
