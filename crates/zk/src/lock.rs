//! A held task lock and the fenced checkpoint writes made under it.

use std::fmt;
use std::sync::Arc;

use tokio::sync::{oneshot, watch};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn, Instrument};
use zookeeper_async::{CreateMode, Stat, WatchedEvent};

use crate::config::check_name;
use crate::coordinator::{non_empty, Coordinator};
use crate::error::{ZkCode, ZkError};
use crate::requests::Op;
use crate::session::SessionState;

/// How often `acquire_task_lock` re-reads and re-claims a checkpoint that keeps changing
/// under it before giving up.
const CLAIM_ATTEMPTS: usize = 5;

/// The ephemeral lock of one task, held by one session, plus the checkpoint version our
/// confirms must match. Publish only while [`TaskLock::may_publish`]; confirm positions
/// with [`TaskLock::confirm`]; stop the task on [`ZkError::Fenced`].
///
/// A watch on the lock node revokes the lock as soon as the node is deleted or owned by
/// another session. The library loses watches on reconnect, so after every reconnect the
/// node is looked at (and watched) again before publishing may resume.
///
/// Dropping a `TaskLock` does not delete the node (that needs I/O): call
/// [`TaskLock::release`], or close the coordinator.
pub struct TaskLock {
    coord: Coordinator,
    task: String,
    lock_path: String,
    checkpoint_path: String,
    checkpoint: Option<Vec<u8>>,
    /// The checkpoint znode version our next confirm must match.
    version: i32,
    /// A confirm whose outcome is unknown (its answer was lost): its data.
    unresolved: Option<Vec<u8>>,
    revoked: Arc<watch::Sender<Option<String>>>,
    /// The connection (see `Liveness::connection`) in which the lock node was last seen
    /// ours with a watch set on it. A watch dies with its connection, and a deletion
    /// while we were disconnected is never reported: so after a reconnect the lock counts
    /// only once it has been looked at again.
    verified: Arc<watch::Sender<u64>>,
    stop_guard: CancellationToken,
    guard: Option<JoinHandle<()>>,
}

impl fmt::Debug for TaskLock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TaskLock")
            .field("task", &self.task)
            .field("checkpoint_version", &self.version)
            .field("revoked", &*self.revoked.borrow())
            .field("may_publish", &self.may_publish())
            .finish()
    }
}

impl TaskLock {
    pub(crate) fn start(
        coord: Coordinator,
        task: String,
        lock_path: String,
        checkpoint_path: String,
        checkpoint: Option<Vec<u8>>,
        version: i32,
        watched: Watched,
    ) -> Self {
        let revoked = Arc::new(watch::channel(None).0);
        let verified = Arc::new(watch::channel(watched.connection).0);
        let stop_guard = CancellationToken::new();
        let span = tracing::info_span!(
            "zk_task_lock",
            task = %task,
            session = %format_args!("{:#x}", coord.session_id())
        );
        let guard = tokio::spawn(
            guard(
                coord.clone(),
                lock_path.clone(),
                watched,
                Arc::clone(&revoked),
                Arc::clone(&verified),
                stop_guard.clone(),
            )
            .instrument(span),
        );
        Self {
            coord,
            task,
            lock_path,
            checkpoint_path,
            checkpoint,
            version,
            unresolved: None,
            revoked,
            verified,
            stop_guard,
            guard: Some(guard),
        }
    }

    pub fn task(&self) -> &str {
        &self.task
    }

    /// What was confirmed when the lock was taken (`None`: never confirmed); where the
    /// task resumes.
    pub fn checkpoint(&self) -> Option<&[u8]> {
        self.checkpoint.as_deref()
    }

    /// `true` only while the lock is ours and the session is confirmed alive
    /// ([`SessionState::Connected`] and within the lease), and the lock node was checked
    /// in the current connection. Check it before every publish.
    pub fn may_publish(&self) -> bool {
        self.revoked.borrow().is_none()
            && *self.verified.borrow() == self.coord.connection()
            && self.coord.is_live()
    }

    /// Waits until [`TaskLock::may_publish`] is true again (after a disconnection);
    /// [`ZkError::Fenced`] once the lock is lost for good.
    pub async fn ready(&self) -> Result<(), ZkError> {
        let mut session = self.coord.session();
        let mut verified = self.verified.subscribe();
        let mut revoked = self.revoked.subscribe();
        loop {
            session.borrow_and_update();
            verified.borrow_and_update();
            if let Some(why) = revoked.borrow_and_update().clone() {
                return Err(ZkError::Fenced {
                    task: self.task.clone(),
                    detail: why,
                });
            }
            if self.coord.is_expired() {
                return Err(ZkError::Fenced {
                    task: self.task.clone(),
                    detail: "the ZooKeeper session expired".to_owned(),
                });
            }
            if self.may_publish() {
                return Ok(());
            }
            // Each sender lives as long as `self`.
            tokio::select! {
                _ = session.changed() => {}
                _ = verified.changed() => {}
                _ = revoked.changed() => {}
            }
        }
    }

    /// Resolves once the lock is lost for good (node deleted or taken, fenced, session
    /// expired), with the reason. A mere disconnection does not resolve it: watch
    /// [`Coordinator::session`] for pauses.
    pub async fn lost(&self) -> String {
        let mut revoked = self.revoked.subscribe();
        let mut session = self.coord.session();
        loop {
            if let Some(why) = revoked.borrow_and_update().clone() {
                return why;
            }
            if *session.borrow_and_update() == SessionState::Expired {
                return "the ZooKeeper session expired".to_owned();
            }
            tokio::select! {
                _ = revoked.changed() => {}
                changed = session.changed() => if changed.is_err() {
                    return "the coordinator is gone".to_owned();
                },
            }
        }
    }

    /// Records `data` as the task's confirmed position: a compare-and-set on the
    /// checkpoint's version. Fails with [`ZkError::Fenced`] when the version moved (someone
    /// else took the task, or an operator reset it), when the lock was lost or the session
    /// expired; with [`ZkError::NotConnected`] (transient) while the session is not
    /// confirmed. After a transient error the outcome of the write is unknown; the next
    /// call finds out first.
    pub async fn confirm(&mut self, data: &[u8]) -> Result<(), ZkError> {
        if data.is_empty() {
            return Err(ZkError::InvalidArgument(format!(
                "task `{}`: an empty checkpoint cannot be confirmed",
                self.task
            )));
        }
        self.ensure_publishable()?;
        if let Some(pending) = self.unresolved.take() {
            self.resolve(pending).await?;
            self.ensure_publishable()?;
        }

        let path = self.checkpoint_path.clone();
        let written = self
            .coord
            .call(
                Op::Set,
                &path,
                self.coord
                    .zk()
                    .set_data(&path, data.to_vec(), Some(self.version)),
            )
            .await;
        match written {
            Ok(stat) => {
                debug!(task = %self.task, version = stat.version, "checkpoint confirmed");
                self.version = stat.version;
                Ok(())
            }
            Err(ZkError::Zk {
                source: ZkCode::BadVersion,
                ..
            }) => Err(self.fence(format!(
                "the checkpoint is no longer at version {}: another worker or an operator wrote it",
                self.version
            ))),
            Err(ZkError::Zk {
                source: ZkCode::NoNode,
                ..
            }) => Err(self.fence("the checkpoint node was deleted".to_owned())),
            Err(ZkError::SessionExpired) => {
                Err(self.fence("the ZooKeeper session expired".to_owned()))
            }
            Err(e) => {
                self.unresolved = Some(data.to_vec());
                Err(e)
            }
        }
    }

    /// Deletes the lock node if it is still ours, so another worker can take the task
    /// without waiting for our session to end.
    pub async fn release(mut self) -> Result<(), ZkError> {
        self.stop_guard.cancel();
        if let Some(guard) = self.guard.take() {
            if let Err(e) = guard.await {
                warn!(task = %self.task, error = %e, "task lock guard failed");
            }
        }
        revoke(&self.revoked, "released".to_owned());
        self.coord.delete_own_lock(&self.lock_path).await?;
        info!(task = %self.task, "task lock released");
        Ok(())
    }

    fn ensure_publishable(&mut self) -> Result<(), ZkError> {
        if let Some(why) = self.revoked.borrow().clone() {
            return Err(ZkError::Fenced {
                task: self.task.clone(),
                detail: why,
            });
        }
        if self.coord.is_expired() {
            return Err(self.fence("the ZooKeeper session expired".to_owned()));
        }
        if !self.coord.is_live() || *self.verified.borrow() != self.coord.connection() {
            return Err(ZkError::NotConnected);
        }
        Ok(())
    }

    /// Finds out whether a confirm whose answer was lost was applied. Our own write is the
    /// only one that can move the version by exactly one to exactly that data: every new
    /// holder bumps the version when it takes the lock.
    async fn resolve(&mut self, pending: Vec<u8>) -> Result<(), ZkError> {
        let path = self.checkpoint_path.clone();
        match self
            .coord
            .call(Op::Get, &path, self.coord.zk().get_data(&path, false))
            .await
        {
            Ok((_, stat)) if stat.version == self.version => Ok(()),
            Ok((data, stat)) if stat.version == self.version.wrapping_add(1) && data == pending => {
                self.version = stat.version;
                Ok(())
            }
            Ok((_, stat)) => Err(self.fence(format!(
                "the checkpoint moved from version {} to {} under us",
                self.version, stat.version
            ))),
            Err(ZkError::Zk {
                source: ZkCode::NoNode,
                ..
            }) => Err(self.fence("the checkpoint node was deleted".to_owned())),
            Err(ZkError::SessionExpired) => {
                Err(self.fence("the ZooKeeper session expired".to_owned()))
            }
            Err(e) => {
                self.unresolved = Some(pending);
                Err(e)
            }
        }
    }

    fn fence(&mut self, detail: String) -> ZkError {
        warn!(task = %self.task, %detail, "task fenced; it must stop");
        revoke(&self.revoked, detail.clone());
        self.stop_guard.cancel();
        ZkError::Fenced {
            task: self.task.clone(),
            detail,
        }
    }
}

impl Drop for TaskLock {
    fn drop(&mut self) {
        self.stop_guard.cancel();
    }
}

fn revoke(revoked: &watch::Sender<Option<String>>, why: String) -> bool {
    revoked.send_if_modified(|r| {
        if r.is_none() {
            *r = Some(why);
            true
        } else {
            false
        }
    })
}

/// The lock node seen ours, with a watch set on it in connection `connection`.
pub(crate) struct Watched {
    connection: u64,
    session: watch::Receiver<SessionState>,
    fired: oneshot::Receiver<WatchedEvent>,
}

/// Lock acquisition, on the coordinator whose session the lock belongs to.
impl Coordinator {
    /// Takes the task's lock: the ephemeral node `/<root>/locks/<task>` holding
    /// `owner_info`. While another session holds it, waits for its deletion (a watch,
    /// re-armed after every reconnect) until it is gone or `cancel` fires. A lock node this
    /// session already owns (its create was answered by a lost connection, or a previous
    /// `TaskLock` was dropped without release) is adopted.
    ///
    /// Then claims the checkpoint: rewrites it unchanged as a compare-and-set (or creates
    /// it empty), so its version moves past anything a previous holder read. A zombie's
    /// late confirm therefore fails, even one that was on the wire when we took over, and
    /// cannot fence us instead.
    pub async fn acquire_task_lock(
        &self,
        task: &str,
        owner_info: &[u8],
        cancel: &CancellationToken,
    ) -> Result<TaskLock, ZkError> {
        check_name(task).map_err(|e| ZkError::InvalidArgument(format!("task id: {e}")))?;
        let lock_path = self.lock_path(task);
        self.create_lock_node(task, &lock_path, owner_info, cancel)
            .await?;

        let taken = async {
            let watched = watch_lock(self, &lock_path).await.map_err(|e| match e {
                LockCheck::Lost(why) => ZkError::Fenced {
                    task: task.to_owned(),
                    detail: why,
                },
                LockCheck::Failed(e) => e,
            })?;
            let (checkpoint, version) = self.claim_checkpoint(task).await?;
            Ok::<_, ZkError>((watched, checkpoint, version))
        };
        match taken.await {
            Ok((watched, checkpoint, version)) => {
                info!(task, checkpoint_version = version, "task lock taken");
                Ok(TaskLock::start(
                    self.clone(),
                    task.to_owned(),
                    lock_path,
                    self.checkpoint_path(task),
                    checkpoint,
                    version,
                    watched,
                ))
            }
            Err(e) => {
                if let Err(release) = self.delete_own_lock(&lock_path).await {
                    warn!(task, error = %release, "could not delete the lock node after a failed acquire; it goes with the session");
                }
                Err(e)
            }
        }
    }

    /// Creates the task's ephemeral lock node, waiting while another session holds it;
    /// returns once this session owns it.
    async fn create_lock_node(
        &self,
        task: &str,
        lock_path: &str,
        owner_info: &[u8],
        cancel: &CancellationToken,
    ) -> Result<(), ZkError> {
        loop {
            if cancel.is_cancelled() {
                return Err(ZkError::Cancelled);
            }
            self.wait_connected(cancel).await?;
            let created = self
                .call(
                    Op::Create,
                    lock_path,
                    self.zk().create2(
                        lock_path,
                        owner_info.to_vec(),
                        self.acl(),
                        CreateMode::Ephemeral,
                    ),
                )
                .await;
            match created {
                Ok((_, stat)) if stat.ephemeral_owner == self.session_id() => return Ok(()),
                Ok((_, stat)) => {
                    // The library reconnected with a new session under us.
                    self.expire(&format!(
                        "lock node created by session {:#x}, not ours",
                        stat.ephemeral_owner
                    ));
                    return Err(ZkError::SessionExpired);
                }
                Err(ZkError::Zk {
                    source: ZkCode::NodeExists,
                    ..
                }) => {
                    if self.await_holder(task, lock_path, cancel).await? {
                        return Ok(());
                    }
                }
                Err(ZkError::Zk {
                    source: ZkCode::NoNode,
                    ..
                }) => self.ensure_persistent(&self.path("locks")).await?,
                Err(e) if e.is_transient() && !matches!(e, ZkError::SessionExpired) => {
                    debug!(task, error = %e, "creating the lock node; trying again");
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// The lock node exists: whether this session owns it (adopted). Otherwise waits
    /// until the holder's node changes or goes, and says to try creating it again.
    async fn await_holder(
        &self,
        task: &str,
        lock_path: &str,
        cancel: &CancellationToken,
    ) -> Result<bool, ZkError> {
        let mut session = self.session();
        let (holder, fired) = exists_watched(self, lock_path).await;
        match holder {
            Ok(Some(stat)) if stat.ephemeral_owner == self.session_id() => {
                info!(task, "adopting the lock node this session already owns");
                Ok(true)
            }
            Ok(Some(stat)) => {
                info!(
                    task,
                    holder = %format_args!("{:#x}", stat.ephemeral_owner),
                    "task is locked by another session; waiting for it to go"
                );
                self.wait_for_change(&mut session, fired, cancel).await?;
                Ok(false)
            }
            Ok(None) => Ok(false),
            Err(e) if e.is_transient() && !matches!(e, ZkError::SessionExpired) => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Bumps the checkpoint's version by rewriting it unchanged (or creates it empty).
    /// Returns what it held and the version our confirms must match.
    async fn claim_checkpoint(&self, task: &str) -> Result<(Option<Vec<u8>>, i32), ZkError> {
        let path = self.checkpoint_path(task);
        for _ in 0..CLAIM_ATTEMPTS {
            if !self.is_live() {
                return Err(if self.is_expired() {
                    ZkError::SessionExpired
                } else {
                    ZkError::NotConnected
                });
            }
            match self
                .call(Op::Get, &path, self.zk().get_data(&path, false))
                .await
            {
                Ok((data, stat)) => {
                    match self
                        .call(
                            Op::Set,
                            &path,
                            self.zk().set_data(&path, data.clone(), Some(stat.version)),
                        )
                        .await
                    {
                        Ok(claimed) => return Ok((non_empty(data), claimed.version)),
                        // Written (a zombie's last confirm, an operator) or deleted
                        // between our read and write: read again.
                        Err(ZkError::Zk {
                            source: ZkCode::BadVersion | ZkCode::NoNode,
                            ..
                        }) => continue,
                        Err(e) => return Err(e),
                    }
                }
                Err(ZkError::Zk {
                    source: ZkCode::NoNode,
                    ..
                }) => {
                    // Created by another in between: read it again.
                    if self.create_checkpoint(task, &[]).await? {
                        return Ok((None, 0));
                    }
                }
                Err(e) => return Err(e),
            }
        }
        Err(ZkError::Fenced {
            task: task.to_owned(),
            detail: format!(
                "its checkpoint changed {CLAIM_ATTEMPTS} times while the lock was being taken"
            ),
        })
    }
}

pub(crate) enum LockCheck {
    /// The lock node is gone or belongs to another session.
    Lost(String),
    Failed(ZkError),
}

/// Whether `path` exists (its stat), with a watch whose event `fired` receives.
async fn exists_watched(
    coord: &Coordinator,
    path: &str,
) -> (
    Result<Option<Stat>, ZkError>,
    oneshot::Receiver<WatchedEvent>,
) {
    let (tx, fired) = oneshot::channel();
    let looked = coord
        .call(
            Op::Exists,
            path,
            coord.zk().exists_w(path, move |event| {
                let _ = tx.send(event);
            }),
        )
        .await;
    (looked, fired)
}

/// Checks that the lock node is ours and sets a watch on it. Repeats when the connection
/// changed while the request was under way (the watch may be on the old one).
pub(crate) async fn watch_lock(coord: &Coordinator, path: &str) -> Result<Watched, LockCheck> {
    loop {
        let session = coord.session();
        let connection = coord.connection();
        let (looked, fired) = exists_watched(coord, path).await;
        match looked {
            Ok(Some(stat)) if stat.ephemeral_owner == coord.session_id() => {
                if coord.connection() == connection {
                    return Ok(Watched {
                        connection,
                        session,
                        fired,
                    });
                }
            }
            Ok(Some(stat)) => {
                return Err(LockCheck::Lost(format!(
                    "the lock node now belongs to session {:#x}",
                    stat.ephemeral_owner
                )))
            }
            Ok(None) => return Err(LockCheck::Lost("the lock node was deleted".to_owned())),
            Err(e) => return Err(LockCheck::Failed(e)),
        }
    }
}

/// Keeps watching the lock node while the lock is held: revokes the lock when the node
/// is gone or owned by another session, or when the session expires; after a reconnect
/// looks again and records the connection in which it was verified.
async fn guard(
    coord: Coordinator,
    path: String,
    mut watched: Watched,
    revoked: Arc<watch::Sender<Option<String>>>,
    verified: Arc<watch::Sender<u64>>,
    stop: CancellationToken,
) {
    let lost = |why: String| {
        if revoke(&revoked, why.clone()) {
            warn!(reason = %why, "task lock lost; publishing must stop");
        }
    };
    let expired = || lost("the ZooKeeper session expired".to_owned());
    loop {
        match coord
            .wait_for_change(&mut watched.session, watched.fired, &stop)
            .await
        {
            Ok(()) => {}
            Err(ZkError::Cancelled) => return,
            Err(_) => return expired(),
        }
        watched = loop {
            match coord.wait_connected(&stop).await {
                Ok(()) => {}
                Err(ZkError::Cancelled) => return,
                Err(_) => return expired(),
            }
            let looked = tokio::select! {
                looked = watch_lock(&coord, &path) => looked,
                _ = stop.cancelled() => return,
            };
            match looked {
                Ok(again) => {
                    verified.send_replace(again.connection);
                    debug!("lock node verified and watched");
                    break again;
                }
                Err(LockCheck::Lost(why)) => return lost(why),
                Err(LockCheck::Failed(ZkError::SessionExpired)) => return expired(),
                Err(LockCheck::Failed(e)) => {
                    debug!(error = %e, "checking the lock node; trying again");
                    tokio::select! {
                        _ = tokio::time::sleep(coord.timings().heartbeat) => {}
                        _ = stop.cancelled() => return,
                    }
                }
            }
        };
    }
}
