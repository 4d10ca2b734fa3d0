//! ZooKeeper coordination for Sluice: one supervised session per process, the ephemeral
//! lock a worker must hold to run a task, and the task's checkpoint, written only as a
//! compare-and-set under that lock.
//!
//! # Invariant 1: at most one publisher per MySQL instance
//!
//! A worker publishes for a task only while [`TaskLock::may_publish`] is true, which
//! requires the session to be confirmed alive within a *lease* (see [`session`]):
//!
//! * **Disconnected** is reported at once when the client library sees the connection
//!   drop, and otherwise at the latest `T/2` after the **sending** of the last heartbeat the
//!   server answered (heartbeats go out every `T/6`; `T` is the session timeout the server
//!   granted, learnt by a handshake at connect). The server cannot expire the session
//!   sooner than `T` after it received that heartbeat, so when publishing pauses the
//!   session still has at least `T/2` to live: that is the worker's budget to stop, and
//!   nobody else can hold the lock before it ends. (Assumes the two clocks run at the
//!   same rate, not that they agree.)
//! * **Expired** is reported when the server answers a reconnect with "session expired",
//!   when the heartbeat finds this session's marker node gone (the library opened a new
//!   session under us), when any operation answers SESSIONEXPIRED, or after `close`. It
//!   is final: the coordinator never reports `Connected` again, and closes the library's
//!   client so no replacement session lives on. How soon it is reported after a silent
//!   partition depends on the library noticing the dead connection (`2 × ⌊2T/3⌋` s of
//!   silence) and reaching a server again; until then the state is `Disconnected`, which
//!   already stops publishing.
//! * The lock node is watched; the library drops watches on reconnect (no `SetWatches`),
//!   so after every reconnect the node is looked at and watched again before
//!   `may_publish` can be true ([`TaskLock::ready`] waits for that). A deletion of the
//!   lock node (an operator, a lost session) revokes the lock for good.
//! * The checkpoint is fenced at the store: taking a lock bumps the checkpoint's znode
//!   version (an unchanged rewrite), and every confirm is a `setData` on the version we
//!   hold. A zombie's confirm — even one delayed in the network — fails and stops it.
//!
//! Layout (README, Architecture) below the configured root: `locks/<task>` (ephemeral, the lock),
//! `tasks/<task>/checkpoint` (persistent, the fenced position), and `sessions/s-<seq>`
//! (ephemeral marker of each live coordinator session, read by its heartbeat).

mod cache;
mod config;
mod coordinator;
mod election;
mod error;
mod handshake;
pub mod layout;
mod lock;
mod nodes;
mod reconnect;
pub mod requests;
pub mod session;

pub use cache::{Cached, DirCache};
pub use config::{ConfigIssue, ZkConfig, MAX_SESSION_TIMEOUT, MIN_SESSION_TIMEOUT};
pub use coordinator::{Coordinator, LAYOUT};
pub use election::{EpochRecord, Leader, Leadership, LEADER_NODE};
pub use error::{ZkCode, ZkError};
pub use lock::TaskLock;
pub use nodes::{Expect, Node, Watch};
pub use reconnect::{SessionEnd, Sessions};
pub use requests::Op;
pub use session::SessionState;
pub use tokio_util::sync::CancellationToken;
