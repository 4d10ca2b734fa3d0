//! The etl's one error model: what failed, classed by what is to be done about it. The
//! etl retries what is transient where it happens (a bulk, a send to Kafka, a read from
//! the source), under the retry policy, without committing the batch; an error that
//! reaches the top is definite and ends the process with nothing committed past the
//! last batch that landed (a restarted etl reads the rest again). ZooKeeper sessions are
//! the follower's, which reconnects on its own: no session error reaches here.

use std::fmt::Display;

use sluice_runtime::error::Failure;

#[derive(Debug, thiserror::Error)]
pub enum EtlError {
    /// Elasticsearch, Kafka or the source did not answer: tried again where it happened.
    #[error(transparent)]
    Transient(Failure),
    /// Retrying cannot mend it (Elasticsearch refusing a request, a broken invariant):
    /// the etl stops, and its message names the fix.
    #[error(transparent)]
    Definite(Failure),
}

pub type Result<T, E = EtlError> = std::result::Result<T, E>;

impl EtlError {
    pub fn transient(why: impl Display) -> Self {
        EtlError::Transient(Failure::message(why))
    }

    pub fn definite(why: impl Display) -> Self {
        EtlError::Definite(Failure::message(why))
    }

    fn classed(transient: bool, cause: impl std::error::Error + Send + Sync + 'static) -> Self {
        if transient {
            EtlError::Transient(Failure::of(cause))
        } else {
            EtlError::Definite(Failure::of(cause))
        }
    }

    pub fn is_transient(&self) -> bool {
        matches!(self, EtlError::Transient(_))
    }

    /// The same error, its message prefixed with `context` (the class kept).
    pub fn context(self, context: impl Display) -> Self {
        match self {
            EtlError::Transient(f) => EtlError::Transient(f.within(context)),
            EtlError::Definite(f) => EtlError::Definite(f.within(context)),
        }
    }
}

sluice_runtime::error_context!(EtlError);

impl From<sluice_elastic::EsError> for EtlError {
    fn from(e: sluice_elastic::EsError) -> Self {
        EtlError::classed(e.is_transient(), e)
    }
}

impl From<sluice_mysql::MysqlError> for EtlError {
    fn from(e: sluice_mysql::MysqlError) -> Self {
        EtlError::classed(e.is_transient(), e)
    }
}

impl From<crate::pipeline::NotReady> for EtlError {
    fn from(e: crate::pipeline::NotReady) -> Self {
        EtlError::classed(e.is_transient(), e)
    }
}

impl From<sluice_kafka::KafkaError> for EtlError {
    /// Brokers away, a message timed out: the producer renews itself when the cause
    /// says it must, and what it held is sent again.
    fn from(e: sluice_kafka::KafkaError) -> Self {
        EtlError::classed(true, e)
    }
}

impl From<sluice_kafka::Refused> for EtlError {
    fn from(e: sluice_kafka::Refused) -> Self {
        EtlError::classed(true, e)
    }
}

impl From<serde_json::Error> for EtlError {
    /// What cannot be written as JSON fails the same way again.
    fn from(e: serde_json::Error) -> Self {
        EtlError::classed(false, e)
    }
}

impl From<tokio::task::JoinError> for EtlError {
    /// A task of the etl panicked: a bug, which running it again repeats.
    fn from(e: tokio::task::JoinError) -> Self {
        EtlError::classed(false, e)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kafka_failures_are_transient_and_keep_their_cause() {
        let e = EtlError::from(sluice_kafka::KafkaError::Canceled).context("a dead letter");
        assert!(e.is_transient());
        let cause = std::error::Error::source(&e).expect("the cause is kept");
        assert!(cause.downcast_ref::<sluice_kafka::KafkaError>().is_some());
        let gone: Result<u8> = None.context("no batch in flight");
        assert!(matches!(gone, Err(EtlError::Definite(_))));
    }
}
