//! Every end-to-end test, in one binary: one link of the services and their clients instead
//! of one per scenario, which kept a clean build's target directory several GiB smaller
//! and its link time minutes shorter. Each scenario stays in its own file (module); nextest
//! still runs every test in its own process, so `cargo nextest run -E 'test(/^delayed::/)'`
//! picks one scenario's tests.

mod access;
mod big_transaction;
mod cluster_admin;
mod cluster_api;
mod cluster_build;
mod cluster_failover;
mod cluster_mapping;
mod config_errors;
mod consistency;
mod console;
mod ddl;
mod ddl_rewrites;
mod dead_letter;
mod debezium_input;
mod delayed;
mod dictionary;
mod dml;
mod es_faults;
mod etl_members;
mod explain_resync;
mod failpoints;
mod helm_chart;
mod history;
mod hostile_callers;
mod hostile_source;
mod images;
mod kafka_faults;
mod latency;
mod layout;
mod lifecycle;
mod mysql_faults;
mod preflight;
mod relations;
mod relations_cluster;
mod replay;
mod reports;
mod restarts;
mod retention;
mod rotation;
mod search_api;
mod secrets;
mod secured;
mod sharded;
mod soak;
mod source_faults;
mod source_lifecycle;
mod telemetry;
mod tls;
mod types;
mod verified_swap;
