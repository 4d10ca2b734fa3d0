//! The center's one error model: what failed, classed by what is to be done about it.
//! Every error of an adapter is classed once, here, where it enters the center; the
//! leader's loop and the API decide by the class and never look into the error again.

use std::fmt::Display;

use sluice_zk::ZkError;

use crate::meta::MetaError;

#[derive(Debug, thiserror::Error)]
pub enum CenterError {
    /// A service did not answer (ZooKeeper, the meta database, Elasticsearch, a source,
    /// Kafka), or this replica may not act for the moment (its ZooKeeper connection is in
    /// doubt): the same work is tried again, under the retry policy.
    #[error("{0}")]
    Transient(String),
    /// Retrying cannot help (a spec that no longer fits its tables, a record that cannot
    /// be read, a server refusing the request): the work stops, and an event names the
    /// fix.
    #[error("{0}")]
    Definite(String),
    /// The ZooKeeper session expired: whatever it held is gone, and the leader starts
    /// over with a new session.
    #[error("{0}")]
    SessionExpired(String),
    /// Another replica leads now: the meta database or ZooKeeper holds a newer epoch than
    /// the one this replica acts under.
    #[error("{0}")]
    Deposed(String),
}

pub type Result<T, E = CenterError> = std::result::Result<T, E>;

impl CenterError {
    pub fn transient(why: impl Display) -> Self {
        CenterError::Transient(why.to_string())
    }

    pub fn definite(why: impl Display) -> Self {
        CenterError::Definite(why.to_string())
    }

    /// Whether this replica lost its leadership (or its session, which it led in): the
    /// leader's work ends, and a campaign starts over.
    pub fn ends_the_term(&self) -> bool {
        matches!(
            self,
            CenterError::Deposed(_) | CenterError::SessionExpired(_)
        )
    }

    /// The same error, its message prefixed with `context` (the class kept).
    pub fn context(self, context: impl Display) -> Self {
        let with = |why: String| format!("{context}: {why}");
        match self {
            CenterError::Transient(w) => CenterError::Transient(with(w)),
            CenterError::Definite(w) => CenterError::Definite(with(w)),
            CenterError::SessionExpired(w) => CenterError::SessionExpired(with(w)),
            CenterError::Deposed(w) => CenterError::Deposed(with(w)),
        }
    }
}

sluice_runtime::error_context!(CenterError);

impl From<ZkError> for CenterError {
    fn from(e: ZkError) -> Self {
        match e {
            ZkError::SessionExpired => CenterError::SessionExpired(e.to_string()),
            ZkError::Fenced { .. } => CenterError::Deposed(e.to_string()),
            e if e.is_transient() => CenterError::Transient(e.to_string()),
            // Shutdown: the loops that see it stop on the token themselves.
            ZkError::Cancelled => CenterError::Transient(e.to_string()),
            e => CenterError::Definite(e.to_string()),
        }
    }
}

impl From<MetaError> for CenterError {
    fn from(e: MetaError) -> Self {
        match e {
            MetaError::Deposed { .. } => CenterError::Deposed(e.to_string()),
            MetaError::Db(_) => CenterError::Transient(e.to_string()),
            MetaError::Corrupt(_) | MetaError::Refused(_) | MetaError::NotFound(_) => {
                CenterError::Definite(e.to_string())
            }
        }
    }
}

impl From<sluice_elastic::EsError> for CenterError {
    fn from(e: sluice_elastic::EsError) -> Self {
        if e.is_transient() {
            CenterError::Transient(e.to_string())
        } else {
            CenterError::Definite(e.to_string())
        }
    }
}

impl From<sluice_mysql::MysqlError> for CenterError {
    fn from(e: sluice_mysql::MysqlError) -> Self {
        if e.is_transient() {
            CenterError::Transient(e.to_string())
        } else {
            CenterError::Definite(e.to_string())
        }
    }
}

impl From<sluice_kafka::KafkaError> for CenterError {
    /// Kafka's answers to the center (topics, tails, dead letters) fail while brokers are
    /// away; what they refuse for good the operator sees in the message of each retry.
    fn from(e: sluice_kafka::KafkaError) -> Self {
        CenterError::Transient(e.to_string())
    }
}

impl From<sluice_kafka::Refused> for CenterError {
    fn from(e: sluice_kafka::Refused) -> Self {
        CenterError::Transient(e.to_string())
    }
}

impl From<tokio::task::JoinError> for CenterError {
    /// A task of the center panicked: a bug, which running it again repeats.
    fn from(e: tokio::task::JoinError) -> Self {
        CenterError::Definite(e.to_string())
    }
}

impl From<serde_json::Error> for CenterError {
    /// A record that cannot be read or written as JSON: the same bytes fail again.
    fn from(e: serde_json::Error) -> Self {
        CenterError::Definite(e.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_adapter_error_is_classed_once() {
        assert!(matches!(
            CenterError::from(ZkError::SessionExpired),
            CenterError::SessionExpired(_)
        ));
        assert!(matches!(
            CenterError::from(ZkError::NotConnected),
            CenterError::Transient(_)
        ));
        assert!(matches!(
            CenterError::from(MetaError::Deposed {
                ours: 3,
                current: 4
            }),
            CenterError::Deposed(_)
        ));
        assert!(matches!(
            CenterError::from(MetaError::Corrupt("x".into())),
            CenterError::Definite(_)
        ));
        assert!(CenterError::from(MetaError::Deposed {
            ours: 3,
            current: 4
        })
        .ends_the_term());
        assert!(!CenterError::transient("x").ends_the_term());
    }

    #[test]
    fn context_keeps_the_class() {
        let e: Result<()> = Err(MetaError::Deposed {
            ours: 3,
            current: 4,
        })
        .context("starting a build");
        let e = e.unwrap_err();
        assert!(matches!(e, CenterError::Deposed(_)));
        assert!(
            e.to_string().starts_with("starting a build: deposed"),
            "{e}"
        );
        let missing: Result<u8> = None.context("source x is gone");
        assert!(matches!(missing, Err(CenterError::Definite(_))));
    }
}
