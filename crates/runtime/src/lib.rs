//! The life of a Sluice service process, shared by the center, the worker and the etl:
//! layered configuration loading, signals and the shutdown token, telemetry (logs, traces,
//! metrics, readiness) and the `main` that ties them together. The model the services
//! exchange is `sluice-model`'s; adapters never depend on this crate.

pub mod config;
pub mod error;
pub mod listen;
pub mod service;
pub mod shutdown;
pub mod telemetry;

pub use config::{load_config, load_config_from, unreadable_tls, ConfigError};
