//! What can go wrong talking to ZooKeeper, and whether trying again can help.

use std::time::Duration;

use crate::config::ConfigIssue;

/// The error codes `zookeeper-async` returns (the server's `KeeperException` codes).
pub use zookeeper_async::ZkError as ZkCode;

#[derive(Debug, thiserror::Error)]
pub enum ZkError {
    /// Someone else holds or has held this task since our lock was taken: the checkpoint's
    /// version moved, the lock node is gone or belongs to another session, or our session
    /// ended. The caller must stop the task at once and drop what it has not confirmed.
    #[error("task `{task}` is fenced: {detail}; stop the task, another worker may own it now")]
    Fenced { task: String, detail: String },

    /// The server expired (or we closed) this coordinator's session. Nothing this
    /// `Coordinator` holds is valid any more; make a new `Coordinator` to continue.
    #[error("ZooKeeper session expired; every lock of this session is lost")]
    SessionExpired,

    /// The session may still be alive but the client cannot currently prove it (connection
    /// lost or the lease ran out). Pause and retry once the session is `Connected` again.
    #[error("not connected to ZooKeeper; publishing is paused until the session is confirmed")]
    NotConnected,

    /// The caller's cancellation token fired.
    #[error("cancelled")]
    Cancelled,

    /// The server answered an operation with an error.
    #[error("ZooKeeper {op} `{path}` failed: {source}{}", hint(source))]
    Zk {
        op: &'static str,
        path: String,
        #[source]
        source: ZkCode,
    },

    /// No answer within the operation deadline (one session timeout).
    #[error("ZooKeeper {op} `{path}`: no answer within {timeout:?}")]
    Timeout {
        op: &'static str,
        path: String,
        timeout: Duration,
    },

    /// No server of the connect string answered the session handshake.
    #[error(
        "cannot reach ZooKeeper at `{connect}`: {detail}; check that it is running and that \
         `connect` names its client port"
    )]
    Unreachable { connect: String, detail: String },

    /// The configuration is invalid; every problem is listed.
    #[error("invalid ZooKeeper configuration: {}", join(.0))]
    InvalidConfig(Vec<ConfigIssue>),

    /// A node holds something that is not the record its path is documented to hold.
    #[error("ZooKeeper node `{path}` is not a readable record: {detail}")]
    Unreadable { path: String, detail: String },

    /// A caller passed an unusable value (a task id that is not a znode name, an empty
    /// checkpoint).
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
}

fn join(issues: &[ConfigIssue]) -> String {
    issues
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join("; ")
}

impl ZkError {
    /// `true` when the same call may succeed later without anyone changing anything:
    /// connection trouble, timeouts, and an expired session (after making a new
    /// `Coordinator`). `Fenced` is definite for the task: stop it; it may be re-acquired
    /// from scratch later, which is a new `acquire_task_lock`, not a retry.
    pub fn is_transient(&self) -> bool {
        match self {
            ZkError::NotConnected
            | ZkError::Timeout { .. }
            | ZkError::Unreachable { .. }
            | ZkError::SessionExpired => true,
            ZkError::Zk { source, .. } => matches!(
                source,
                ZkCode::ConnectionLoss
                    | ZkCode::OperationTimeout
                    | ZkCode::SessionMoved
                    | ZkCode::SessionExpired
            ),
            ZkError::Fenced { .. }
            | ZkError::Cancelled
            | ZkError::InvalidConfig(_)
            | ZkError::InvalidArgument(_)
            | ZkError::Unreadable { .. } => false,
        }
    }

    /// `true` when a conditional write lost to another writer (the node changed, appeared
    /// or went away since it was read): read again and decide again.
    pub fn is_conflict(&self) -> bool {
        matches!(
            self,
            ZkError::Zk {
                source: ZkCode::BadVersion | ZkCode::NodeExists | ZkCode::NoNode,
                ..
            }
        )
    }

    /// `true` for [`ZkError::Fenced`]: the task must stop now.
    pub fn is_fenced(&self) -> bool {
        matches!(self, ZkError::Fenced { .. })
    }

    pub(crate) fn zk(op: &'static str, path: &str, source: ZkCode) -> Self {
        match source {
            ZkCode::SessionExpired => ZkError::SessionExpired,
            source => ZkError::Zk {
                op,
                path: path.to_owned(),
                source,
            },
        }
    }
}

/// What an operator should know about a server's answer.
fn hint(code: &ZkCode) -> &'static str {
    match code {
        ZkCode::NoAuth => {
            " (the node's ACL does not admit this service: every service of a cluster needs the \
             same `zookeeper.auth`, the one its nodes were created with)"
        }
        _ => "",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn transient_or_definite() {
        assert!(ZkError::NotConnected.is_transient());
        assert!(ZkError::zk("get", "/a", ZkCode::ConnectionLoss).is_transient());
        assert!(matches!(
            ZkError::zk("get", "/a", ZkCode::SessionExpired),
            ZkError::SessionExpired
        ));
        assert!(!ZkError::zk("create", "/a", ZkCode::NoAuth).is_transient());
        let fenced = ZkError::Fenced {
            task: "t".into(),
            detail: "checkpoint version moved".into(),
        };
        assert!(!fenced.is_transient());
        assert!(fenced.is_fenced());
    }

    #[test]
    fn config_errors_name_every_key() {
        let err = ZkError::InvalidConfig(vec![
            ConfigIssue {
                key: "connect",
                reason: "is empty".into(),
            },
            ConfigIssue {
                key: "root",
                reason: "must be absolute".into(),
            },
        ]);
        assert_eq!(
            err.to_string(),
            "invalid ZooKeeper configuration: `connect`: is empty; `root`: must be absolute"
        );
    }
}
