//! The worker's one error model: what failed, classed by what is to be done about it.
//! Every error of an adapter is classed once, here, where it enters the worker; a task, a
//! build job or a check chunk decides by the class and never looks into the error again.
//! The cause stays attached, so that what reads the chain (the Kafka producer, which
//! renews itself after a refusal) still finds it.

use std::fmt::Display;

use sluice_runtime::error::Failure;
use sluice_zk::ZkError;

#[derive(Debug, thiserror::Error)]
pub enum WorkerError {
    /// A service did not answer (the source, Kafka, ZooKeeper, Elasticsearch), a query
    /// was killed, a connection lost: the work resumes from its last confirmed place under
    /// the retry policy.
    #[error(transparent)]
    Transient(Failure),
    /// Retrying cannot mend it (the source's settings, an event that cannot be decoded, a
    /// resume position the server no longer has, a spec that no longer fits its tables):
    /// the work stops, and an event names the fix.
    #[error(transparent)]
    Definite(Failure),
    /// The ZooKeeper session expired: every task held in it was dropped, and the worker
    /// starts over with a new session.
    #[error("ZooKeeper session expired: {0}")]
    SessionExpired(String),
    /// Another worker holds the work now (its lock or its fenced checkpoint moved on).
    #[error("{0}")]
    Deposed(String),
}

pub type Result<T, E = WorkerError> = std::result::Result<T, E>;

impl WorkerError {
    pub fn transient(why: impl Display) -> Self {
        WorkerError::Transient(Failure::message(why))
    }

    pub fn definite(why: impl Display) -> Self {
        WorkerError::Definite(Failure::message(why))
    }

    /// Classed by `transient`, the cause kept.
    fn classed(transient: bool, cause: impl std::error::Error + Send + Sync + 'static) -> Self {
        if transient {
            WorkerError::Transient(Failure::of(cause))
        } else {
            WorkerError::Definite(Failure::of(cause))
        }
    }

    /// Whether retrying cannot mend it: the work stops and says what to fix.
    pub fn is_definite(&self) -> bool {
        matches!(self, WorkerError::Definite(_))
    }

    /// The same error, its message prefixed with `context` (the class kept).
    pub fn context(self, context: impl Display) -> Self {
        match self {
            WorkerError::Transient(f) => WorkerError::Transient(f.within(context)),
            WorkerError::Definite(f) => WorkerError::Definite(f.within(context)),
            WorkerError::SessionExpired(w) => {
                WorkerError::SessionExpired(format!("{context}: {w}"))
            }
            WorkerError::Deposed(w) => WorkerError::Deposed(format!("{context}: {w}")),
        }
    }
}

sluice_runtime::error_context!(WorkerError);

impl From<ZkError> for WorkerError {
    fn from(e: ZkError) -> Self {
        match e {
            ZkError::SessionExpired => WorkerError::SessionExpired(e.to_string()),
            ZkError::Fenced { .. } => WorkerError::Deposed(e.to_string()),
            // Shutdown: the loops that see it stop on the token themselves.
            ZkError::Cancelled => WorkerError::classed(true, e),
            e => WorkerError::classed(e.is_transient(), e),
        }
    }
}

impl From<sluice_mysql::MysqlError> for WorkerError {
    fn from(e: sluice_mysql::MysqlError) -> Self {
        WorkerError::classed(e.is_transient(), e)
    }
}

impl From<sluice_elastic::EsError> for WorkerError {
    fn from(e: sluice_elastic::EsError) -> Self {
        WorkerError::classed(e.is_transient(), e)
    }
}

impl From<sluice_kafka::KafkaError> for WorkerError {
    /// Brokers away, a queue full, a message timed out: the producer renews itself when
    /// the cause says it must, and what it held is sent again.
    fn from(e: sluice_kafka::KafkaError) -> Self {
        WorkerError::classed(true, e)
    }
}

impl From<sluice_kafka::Refused> for WorkerError {
    fn from(e: sluice_kafka::Refused) -> Self {
        WorkerError::classed(true, e)
    }
}

impl From<serde_json::Error> for WorkerError {
    /// A record that cannot be read or written as JSON: the same bytes fail again.
    fn from(e: serde_json::Error) -> Self {
        WorkerError::classed(false, e)
    }
}

impl From<sluice_model::PositionError> for WorkerError {
    fn from(e: sluice_model::PositionError) -> Self {
        WorkerError::classed(false, e)
    }
}

impl From<sluice_model::VersionError> for WorkerError {
    fn from(e: sluice_model::VersionError) -> Self {
        WorkerError::classed(false, e)
    }
}

impl From<std::num::ParseIntError> for WorkerError {
    fn from(e: std::num::ParseIntError) -> Self {
        WorkerError::classed(false, e)
    }
}

impl From<std::io::Error> for WorkerError {
    /// Files the configuration names (a token, a certificate): read again, they fail
    /// again.
    fn from(e: std::io::Error) -> Self {
        WorkerError::classed(false, e)
    }
}

impl From<tokio::task::JoinError> for WorkerError {
    /// A task of the worker panicked: a bug, which running it again repeats.
    fn from(e: tokio::task::JoinError) -> Self {
        WorkerError::classed(false, e)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_adapter_error_is_classed_once_and_keeps_its_cause() {
        assert!(matches!(
            WorkerError::from(ZkError::SessionExpired),
            WorkerError::SessionExpired(_)
        ));
        assert!(matches!(
            WorkerError::from(ZkError::NotConnected),
            WorkerError::Transient(_)
        ));
        let refused = sluice_kafka::KafkaError::Canceled;
        let e = WorkerError::from(refused).context("publishing a row");
        assert!(matches!(e, WorkerError::Transient(_)));
        let cause = std::error::Error::source(&e).expect("the cause is kept");
        assert!(cause.downcast_ref::<sluice_kafka::KafkaError>().is_some());
        assert!(e.to_string().starts_with("publishing a row: "), "{e}");
    }

    #[test]
    fn context_keeps_the_class_and_nests_outermost_first() {
        let e: Result<()> = Err(WorkerError::definite("no primary key")).context("table t");
        let e = e.context("build job p~plan").unwrap_err();
        assert!(e.is_definite());
        assert_eq!(e.to_string(), "build job p~plan: table t: no primary key");
    }
}
