//! One ZooKeeper session and the operations Sluice's services run in it.

use std::fmt;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{mpsc, oneshot, watch};
use tokio::task::JoinHandle;
use tokio::time::{timeout, timeout_at, Instant};
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn, Instrument};
use zookeeper_async::{Acl, CreateMode, WatchedEvent, ZooKeeper};

use crate::config::{check_name, ConfigIssue, ZkConfig};
use crate::error::{ZkCode, ZkError};
use crate::handshake::{authenticate, negotiate_session_timeout, until_deadline};
use crate::requests::{self, Op};
use crate::session::{Liveness, SessionState, Supervisor, Timings};

/// Persistent children of the root (the layout in the README's Architecture section), created by `connect`.
/// `sessions` holds one ephemeral marker per live coordinator; see [`Coordinator`].
pub const LAYOUT: [&str; 8] = [
    "election",
    "workers",
    "assignments",
    "locks",
    "tasks",
    "mappings",
    "pipelines",
    "sessions",
];

/// Pause between failed TCP connects inside the client library (without one it retries
/// in a busy loop).
const RECONNECT_BACKOFF: Duration = Duration::from_millis(250);
/// The library cannot work with less: it re-arms its read deadline in whole seconds of
/// two thirds of the granted timeout.
const MIN_GRANTED_TIMEOUT: Duration = Duration::from_millis(1500);

/// One ZooKeeper session, supervised (see [`SessionState`]). Cheap to clone; all clones
/// share the session. Dropping the last clone ends the session in the background; prefer
/// [`Coordinator::close`], which waits for it.
///
/// `connect` creates an ephemeral-sequential marker `/<root>/sessions/s-NNNNNNNNNN` whose
/// `ephemeralOwner` tells the session id, and which the heartbeat reads: when it is gone,
/// the session is.
#[derive(Clone)]
pub struct Coordinator {
    inner: Arc<Inner>,
}

struct Inner {
    zk: Arc<ZooKeeper>,
    shared: Arc<Liveness>,
    root: String,
    session_id: i64,
    timings: Timings,
    /// The ACL of every node created: creator-only with a digest credential, else open.
    acl: Vec<Acl>,
    cancel: CancellationToken,
    supervisor: Mutex<Option<JoinHandle<()>>>,
}

impl Drop for Inner {
    fn drop(&mut self) {
        // The supervisor closes the session when it stops.
        self.cancel.cancel();
    }
}

impl fmt::Debug for Coordinator {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Coordinator")
            .field("root", &self.inner.root)
            .field("session_id", &format_args!("{:#x}", self.inner.session_id))
            .field("session_timeout", &self.inner.timings.session)
            .field("state", &self.inner.shared.state())
            .finish()
    }
}

/// The session timeout the server grants, refused when it is too short to supervise a
/// session by (the server's minSessionTimeout/maxSessionTimeout decide it).
async fn granted_timeout(cfg: &ZkConfig, deadline: Instant) -> Result<Duration, ZkError> {
    let granted = negotiate_session_timeout(&cfg.connect, cfg.session_timeout, deadline).await?;
    if granted < MIN_GRANTED_TIMEOUT {
        return Err(ZkError::InvalidConfig(vec![ConfigIssue {
            key: "session_timeout",
            reason: format!(
                "the server grants only {granted:?} (its minSessionTimeout/maxSessionTimeout); \
                 at least {MIN_GRANTED_TIMEOUT:?} is needed"
            ),
        }]));
    }
    if granted != cfg.session_timeout {
        warn!(
            requested = ?cfg.session_timeout,
            ?granted,
            "ZooKeeper granted a different session timeout; supervising with the granted one"
        );
    }
    Ok(granted)
}

/// The library's client, connected before `deadline`.
async fn open_client(cfg: &ZkConfig, deadline: Instant) -> Result<ZooKeeper, ZkError> {
    timeout_at(
        deadline,
        ZooKeeper::connect_with_retry_time(
            &cfg.connect,
            cfg.session_timeout,
            |event: WatchedEvent| debug!(?event, "unclaimed ZooKeeper event"),
            RECONNECT_BACKOFF,
        ),
    )
    .await
    .map_err(|_| ZkError::Unreachable {
        connect: cfg.connect.clone(),
        detail: "no connection before the connect deadline".to_owned(),
    })?
    .map_err(|e| ZkError::Unreachable {
        connect: cfg.connect.clone(),
        detail: e.to_string(),
    })
}

impl Coordinator {
    /// Opens a session, makes sure the root and the layout's persistent parents exist and
    /// starts supervising the session. Gives up after one `session_timeout`.
    pub async fn connect(cfg: &ZkConfig) -> Result<Self, ZkError> {
        cfg.validate().map_err(ZkError::InvalidConfig)?;
        let deadline = Instant::now() + cfg.session_timeout;

        let granted = granted_timeout(cfg, deadline).await?;
        let timings = Timings::for_session_timeout(granted);

        let zk = Arc::new(open_client(cfg, deadline).await?);

        let shared = Arc::new(Liveness::new());
        let (events_tx, events) = mpsc::unbounded_channel();
        {
            let shared = Arc::clone(&shared);
            zk.add_listener(move |state| {
                shared.on_library_state(state);
                let _ = events_tx.send(state);
            });
        }

        // From here on a failure must close the client: its task would keep the session
        // alive otherwise.
        let acl = acl_for(cfg);
        let credential = cfg.auth.as_ref().map(|a| a.expose().as_bytes().to_vec());
        let set_up = async {
            if let Some(c) = &credential {
                authenticate(&zk, c, deadline).await?;
            }
            set_up(&zk, &cfg.root, &acl, deadline).await
        };
        let (marker, session_id, sent) = match set_up.await {
            Ok(done) => done,
            Err(e) => {
                let _ = timeout(Duration::from_secs(1), zk.close()).await;
                return Err(e);
            }
        };
        shared.library_connected_at_start();
        shared.extend_lease(sent + timings.lease);
        shared.mark_connected();

        let cancel = CancellationToken::new();
        let span = tracing::info_span!("zk_session", session = %format_args!("{session_id:#x}"));
        info!(
            parent: &span,
            connect = %cfg.connect,
            root = %cfg.root,
            session_timeout = ?granted,
            lease = ?timings.lease,
            "ZooKeeper session established"
        );
        let supervisor = Supervisor {
            zk: Arc::clone(&zk),
            shared: Arc::clone(&shared),
            marker,
            session_id,
            timings,
            events,
            credential,
            cancel: cancel.clone(),
        };
        let handle = tokio::spawn(supervisor.run().instrument(span));

        Ok(Self {
            inner: Arc::new(Inner {
                zk,
                shared,
                root: cfg.root.clone(),
                session_id,
                timings,
                acl,
                cancel,
                supervisor: Mutex::new(Some(handle)),
            }),
        })
    }

    /// The session's state; see [`SessionState`] for what each value demands.
    pub fn session(&self) -> watch::Receiver<SessionState> {
        self.inner.shared.subscribe()
    }

    /// The ZooKeeper session id (what `ephemeralOwner` of our ephemeral nodes holds).
    pub fn session_id(&self) -> i64 {
        self.inner.session_id
    }

    /// The session timeout the server granted; publishing stops at the latest half of it
    /// after the last confirmed heartbeat.
    pub fn session_timeout(&self) -> Duration {
        self.inner.timings.session
    }

    /// `rel` below the root: `path("locks/db1")` is `/sluice/locks/db1`.
    pub fn path(&self, rel: &str) -> String {
        let rel = rel.trim_matches('/');
        if rel.is_empty() {
            self.inner.root.clone()
        } else {
            format!("{}/{rel}", self.inner.root)
        }
    }

    /// The last confirmed position of `task` (`/<root>/tasks/<task>/checkpoint`), `None`
    /// when none was ever confirmed.
    pub async fn read_checkpoint(&self, task: &str) -> Result<Option<Vec<u8>>, ZkError> {
        check_name(task).map_err(|e| ZkError::InvalidArgument(format!("task id: {e}")))?;
        let path = self.checkpoint_path(task);
        match self
            .call(Op::Get, &path, self.inner.zk.get_data(&path, false))
            .await
        {
            Ok((data, _)) => Ok(non_empty(data)),
            Err(ZkError::Zk {
                source: ZkCode::NoNode,
                ..
            }) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Creates `task`'s checkpoint holding `data` (and its parent); `false` when one
    /// exists already (created in between: the caller reads or writes it again).
    pub(crate) async fn create_checkpoint(&self, task: &str, data: &[u8]) -> Result<bool, ZkError> {
        let path = self.checkpoint_path(task);
        match self.create(&path, data, CreateMode::Persistent).await {
            Ok(()) => Ok(true),
            Err(ZkError::Zk {
                source: ZkCode::NodeExists,
                ..
            }) => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Overwrites the checkpoint regardless of who holds the task (operators, tests: reset
    /// a position). A running holder's next confirm is fenced and its task stops; when it
    /// is taken again it starts from this position. Empty `data` clears the checkpoint.
    pub async fn write_checkpoint_unfenced(&self, task: &str, data: &[u8]) -> Result<(), ZkError> {
        check_name(task).map_err(|e| ZkError::InvalidArgument(format!("task id: {e}")))?;
        let path = self.checkpoint_path(task);
        loop {
            match self
                .call(
                    Op::Set,
                    &path,
                    self.inner.zk.set_data(&path, data.to_vec(), None),
                )
                .await
            {
                Ok(_) => break,
                Err(ZkError::Zk {
                    source: ZkCode::NoNode,
                    ..
                }) => {}
                Err(e) => return Err(e),
            }
            if self.create_checkpoint(task, data).await? {
                break;
            }
        }
        info!(task, "checkpoint overwritten without fencing");
        Ok(())
    }

    /// Ends the session: its ephemeral nodes (locks, markers) are deleted by the server
    /// and every clone of this coordinator reports `Expired`.
    pub async fn close(self) {
        let handle = self
            .inner
            .supervisor
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        self.inner.cancel.cancel();
        if let Some(handle) = handle {
            if let Err(e) = handle.await {
                warn!(error = %e, "ZooKeeper session supervisor failed");
            }
        }
    }

    // ----- crate-internal ------------------------------------------------------------

    pub(crate) fn zk(&self) -> &ZooKeeper {
        &self.inner.zk
    }

    /// The ACL for a node this coordinator creates.
    pub(crate) fn acl(&self) -> Vec<Acl> {
        self.inner.acl.clone()
    }

    pub(crate) fn timings(&self) -> Timings {
        self.inner.timings
    }

    /// The session is confirmed alive right now: connected, and its lease (renewed by
    /// answered heartbeats) has not run out. Turns false on time even if the supervisor is
    /// late, e.g. right after the process was stopped and continued.
    pub fn is_live(&self) -> bool {
        self.inner.shared.is_live()
    }

    /// Which connection of the session is current; it changes on every reconnect.
    pub(crate) fn connection(&self) -> u64 {
        self.inner.shared.connection()
    }

    pub(crate) fn is_expired(&self) -> bool {
        self.inner.shared.is_expired()
    }

    pub(crate) fn expire(&self, why: &str) {
        if self.inner.shared.mark_expired() {
            warn!(reason = why, "ZooKeeper session treated as expired");
        }
        self.inner.cancel.cancel();
    }

    pub(crate) fn lock_path(&self, task: &str) -> String {
        self.path(&format!("locks/{task}"))
    }

    pub(crate) fn checkpoint_path(&self, task: &str) -> String {
        self.path(&format!("tasks/{task}/checkpoint"))
    }

    /// Runs one operation: refused once the session expired, bounded by the operation
    /// deadline, errors mapped (and an expiry the server reports latched).
    pub(crate) async fn call<T>(
        &self,
        op: Op,
        path: &str,
        request: impl Future<Output = Result<T, ZkCode>>,
    ) -> Result<T, ZkError> {
        if self.is_expired() {
            return Err(ZkError::SessionExpired);
        }
        crate::requests::count(op);
        let op = op.as_str();
        let deadline = self.inner.timings.op;
        match timeout(deadline, request).await {
            Ok(Ok(value)) => Ok(value),
            Ok(Err(ZkCode::SessionExpired)) => {
                self.expire("an operation was answered with SESSIONEXPIRED");
                Err(ZkError::SessionExpired)
            }
            Ok(Err(code)) => Err(ZkError::zk(op, path, code)),
            Err(_) => Err(ZkError::Timeout {
                op,
                path: path.to_owned(),
                timeout: deadline,
            }),
        }
    }

    /// Waits until the session is `Connected`.
    pub(crate) async fn wait_connected(&self, cancel: &CancellationToken) -> Result<(), ZkError> {
        let mut session = self.session();
        loop {
            match *session.borrow_and_update() {
                SessionState::Connected => return Ok(()),
                SessionState::Expired => return Err(ZkError::SessionExpired),
                SessionState::Disconnected => {}
            }
            tokio::select! {
                changed = session.changed() => if changed.is_err() {
                    return Err(ZkError::SessionExpired);
                },
                _ = cancel.cancelled() => return Err(ZkError::Cancelled),
            }
        }
    }

    /// Waits until a watch set after `session` was subscribed fires, or must be set again:
    /// the library does not re-register watches after a reconnect, so any return to
    /// `Connected` means "look again".
    pub(crate) async fn wait_for_change(
        &self,
        session: &mut watch::Receiver<SessionState>,
        fired: oneshot::Receiver<WatchedEvent>,
        cancel: &CancellationToken,
    ) -> Result<(), ZkError> {
        tokio::pin!(fired);
        loop {
            tokio::select! {
                _ = cancel.cancelled() => return Err(ZkError::Cancelled),
                event = &mut fired => {
                    debug!(?event, "watch fired");
                    return Ok(());
                }
                changed = session.changed() => {
                    if changed.is_err() {
                        return Err(ZkError::SessionExpired);
                    }
                    match *session.borrow_and_update() {
                        SessionState::Expired => return Err(ZkError::SessionExpired),
                        SessionState::Connected => return Ok(()),
                        SessionState::Disconnected => {}
                    }
                }
            }
        }
    }

    /// Creates `path` (and its parents) as persistent nodes if missing.
    pub(crate) async fn ensure_persistent(&self, path: &str) -> Result<(), ZkError> {
        for end in path
            .char_indices()
            .skip(1)
            .filter(|&(_, c)| c == '/')
            .map(|(i, _)| i)
            .chain(std::iter::once(path.len()))
        {
            let prefix = &path[..end];
            match self
                .call(
                    Op::Create,
                    prefix,
                    self.inner
                        .zk
                        .create(prefix, Vec::new(), self.acl(), CreateMode::Persistent),
                )
                .await
            {
                Ok(_)
                | Err(ZkError::Zk {
                    source: ZkCode::NodeExists,
                    ..
                }) => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    /// Deletes the lock node if this session owns it.
    pub(crate) async fn delete_own_lock(&self, path: &str) -> Result<(), ZkError> {
        if self.is_expired() {
            // Gone with the session.
            return Ok(());
        }
        let version = match self
            .call(Op::Exists, path, self.inner.zk.exists(path, false))
            .await
        {
            Ok(Some(stat)) if stat.ephemeral_owner == self.session_id() => stat.version,
            Ok(Some(stat)) => {
                warn!(
                    path,
                    owner = %format_args!("{:#x}", stat.ephemeral_owner),
                    "lock node belongs to another session; leaving it"
                );
                return Ok(());
            }
            Ok(None) | Err(ZkError::SessionExpired) => return Ok(()),
            Err(e) => return Err(e),
        };
        match self
            .call(Op::Delete, path, self.inner.zk.delete(path, Some(version)))
            .await
        {
            Ok(())
            | Err(ZkError::SessionExpired)
            | Err(ZkError::Zk {
                source: ZkCode::NoNode,
                ..
            }) => Ok(()),
            Err(e) => Err(e),
        }
    }
}

pub(crate) fn non_empty(data: Vec<u8>) -> Option<Vec<u8>> {
    if data.is_empty() {
        None
    } else {
        Some(data)
    }
}

/// The ACL of the nodes a service with `cfg` creates.
fn acl_for(cfg: &ZkConfig) -> Vec<Acl> {
    match cfg.auth {
        Some(_) => Acl::creator_all().clone(),
        None => Acl::open_unsafe().clone(),
    }
}

/// Root, layout parents and this session's marker. Returns the marker's path, the session
/// id and when the marker's create was sent (the start of the first lease).
async fn set_up(
    zk: &ZooKeeper,
    root: &str,
    acl: &[Acl],
    deadline: Instant,
) -> Result<(String, i64, Instant), ZkError> {
    let mut parents: Vec<String> = root
        .char_indices()
        .skip(1)
        .filter(|&(_, c)| c == '/')
        .map(|(i, _)| root[..i].to_owned())
        .collect();
    parents.push(root.to_owned());
    parents.extend(LAYOUT.iter().map(|child| format!("{root}/{child}")));

    for path in &parents {
        until_deadline(deadline, "create", path, || {
            requests::count(Op::Create);
            zk.create(path, Vec::new(), acl.to_vec(), CreateMode::Persistent)
        })
        .await
        .map(drop)
        .or_else(|e| match e {
            ZkError::Zk {
                source: ZkCode::NodeExists,
                ..
            } => Ok(()),
            e => Err(e),
        })?;
    }

    let marker_prefix = format!("{root}/sessions/s-");
    let info = serde_json::json!({
        "pid": std::process::id(),
        "crate": concat!(env!("CARGO_PKG_NAME"), " ", env!("CARGO_PKG_VERSION")),
    })
    .to_string()
    .into_bytes();
    let sent = Instant::now();
    let (marker, stat) = until_deadline(deadline, "create", &marker_prefix, || {
        requests::count(Op::Create);
        zk.create2(
            &marker_prefix,
            info.clone(),
            acl.to_vec(),
            CreateMode::EphemeralSequential,
        )
    })
    .await?;
    Ok((marker, stat.ephemeral_owner, sent))
}
