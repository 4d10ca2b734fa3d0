//! The state of one ZooKeeper session as the rest of Sluice sees it, and the task that
//! keeps it honest.
//!
//! `zookeeper-async` is not enough on its own to stop a zombie:
//! * it notices a silent connection only after `2 × ⌊2T/3⌋` whole seconds without a
//!   byte from the server (8 s for T = 6 s, longer than T itself on the first
//!   connection), so the server may have expired the session long before;
//! * after the server expired the session it quietly opens a **new** session on the next
//!   reconnect and reports `Connected` again; watches are not re-registered either.
//!
//! So the session is supervised here with a *lease*. A heartbeat (`exists` on this
//! session's marker node, every T/6) that the server answers proves the session was alive
//! when the request was **sent** at `t0`: the server received it after `t0`, and cannot
//! expire the session less than T after that. The lease runs until `t0 + T/2`. Publishing
//! is allowed only while the library says connected **and** the lease runs; so when it
//! stops, the session still has at least T/2 to live, and no other session can have
//! taken a lock of ours. Expiry is latched: once `Expired`, never `Connected` again.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{mpsc, watch};
use tokio::time::{sleep_until, timeout, Instant};
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};
use zookeeper_async::{Stat, ZkState, ZooKeeper};

use crate::error::ZkCode;

/// What a publisher must do, as seen from ZooKeeper.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SessionState {
    /// The session is alive and was confirmed within the lease: publishing may go on.
    Connected,
    /// The connection is lost or the lease ran out; the session may still be alive (and
    /// our locks with it), but publishing must pause until it is `Connected` again.
    Disconnected,
    /// The session is gone (expired by the server, or closed): every lock and watch of it
    /// is lost. Drop all tasks; a new `Coordinator` is needed to go on. Never followed by
    /// `Connected`.
    Expired,
}

/// Time bounds derived from the session timeout the server granted.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Timings {
    /// T, the granted session timeout.
    pub session: Duration,
    /// How long a confirmed heartbeat allows publishing, counted from when it was sent.
    pub lease: Duration,
    /// Pause between heartbeats.
    pub heartbeat: Duration,
    /// Deadline of a single ZooKeeper operation.
    pub op: Duration,
}

impl Timings {
    pub fn for_session_timeout(session: Duration) -> Self {
        Self {
            session,
            lease: session / 2,
            heartbeat: session / 6,
            op: session,
        }
    }
}

// What the client library last said about its connection.
const LIB_UNKNOWN: u8 = 0;
const LIB_CONNECTED: u8 = 1;
const LIB_RECONNECTING: u8 = 2;
const LIB_GONE: u8 = 3;

/// Liveness between the coordinator, its locks, the supervisor task and the library's
/// state listener (which runs inside the library's I/O task and must never block).
pub(crate) struct Liveness {
    state: watch::Sender<SessionState>,
    library: AtomicU8,
    /// Counts the library's reconnects. Watches live on a connection: one set in an
    /// earlier connection is gone.
    connection: AtomicU64,
    lease_until: Mutex<Instant>,
}

impl Liveness {
    pub fn new() -> Self {
        Self {
            state: watch::channel(SessionState::Disconnected).0,
            library: AtomicU8::new(LIB_UNKNOWN),
            connection: AtomicU64::new(0),
            lease_until: Mutex::new(Instant::now()),
        }
    }

    pub fn subscribe(&self) -> watch::Receiver<SessionState> {
        self.state.subscribe()
    }

    pub fn state(&self) -> SessionState {
        *self.state.borrow()
    }

    pub fn is_expired(&self) -> bool {
        self.state() == SessionState::Expired
    }

    /// `true` only while the session is confirmed alive: the library is connected, the
    /// lease runs, and it has not expired. Evaluated against the clock on every call, so
    /// it turns false on time even if the supervisor task is late.
    pub fn is_live(&self) -> bool {
        self.state() == SessionState::Connected
            && self.library.load(Ordering::SeqCst) == LIB_CONNECTED
            && Instant::now() < self.lease_until()
    }

    /// Which connection of the session is current (see `connection`).
    pub fn connection(&self) -> u64 {
        self.connection.load(Ordering::SeqCst)
    }

    pub fn lease_until(&self) -> Instant {
        *self.lease_until.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn extend_lease(&self, until: Instant) {
        let mut lease = self.lease_until.lock().unwrap_or_else(|e| e.into_inner());
        if until > *lease {
            *lease = until;
        }
    }

    fn revoke_lease(&self) {
        *self.lease_until.lock().unwrap_or_else(|e| e.into_inner()) = Instant::now();
    }

    /// The library's state listener. Runs inside the library's I/O task.
    pub fn on_library_state(&self, state: ZkState) {
        match state {
            // Not trusted until a heartbeat proves it is still *our* session.
            ZkState::Connected => self.library.store(LIB_CONNECTED, Ordering::SeqCst),
            ZkState::Connecting | ZkState::ConnectedReadOnly => {
                self.library.store(LIB_RECONNECTING, Ordering::SeqCst);
                self.connection.fetch_add(1, Ordering::SeqCst);
                self.revoke_lease();
                self.mark_disconnected();
            }
            // `NotConnected` is what the library reports when the server answered the
            // reconnect with "session expired"; `Closed` after close; `AuthFailed`.
            _ => {
                self.library.store(LIB_GONE, Ordering::SeqCst);
                self.mark_expired();
            }
        }
    }

    /// The session was established by requests that succeeded; used once at connect, in
    /// case the library's first `Connected` came before the listener was registered.
    pub fn library_connected_at_start(&self) {
        let _ = self.library.compare_exchange(
            LIB_UNKNOWN,
            LIB_CONNECTED,
            Ordering::SeqCst,
            Ordering::SeqCst,
        );
    }

    pub fn mark_disconnected(&self) -> bool {
        self.state.send_if_modified(|s| {
            if *s == SessionState::Connected {
                *s = SessionState::Disconnected;
                true
            } else {
                false
            }
        })
    }

    /// `Disconnected -> Connected`, only if the library is connected and the lease runs.
    /// `Expired` is final.
    pub fn mark_connected(&self) -> bool {
        self.state.send_if_modified(|s| {
            if *s == SessionState::Disconnected
                && self.library.load(Ordering::SeqCst) == LIB_CONNECTED
                && Instant::now() < self.lease_until()
            {
                *s = SessionState::Connected;
                true
            } else {
                false
            }
        })
    }

    pub fn mark_expired(&self) -> bool {
        self.revoke_lease();
        self.state.send_if_modified(|s| {
            if *s == SessionState::Expired {
                false
            } else {
                *s = SessionState::Expired;
                true
            }
        })
    }
}

type Heartbeat =
    Pin<Box<dyn Future<Output = (Instant, Option<Result<Option<Stat>, ZkCode>>)> + Send>>;

/// Renews the lease, turns the session `Disconnected` when it runs out, and ends the
/// session for good on expiry or close.
pub(crate) struct Supervisor {
    pub zk: Arc<ZooKeeper>,
    pub shared: Arc<Liveness>,
    pub marker: String,
    pub session_id: i64,
    pub timings: Timings,
    pub events: mpsc::UnboundedReceiver<ZkState>,
    /// The digest credential, presented again on each new connection.
    pub credential: Option<Vec<u8>>,
    pub cancel: CancellationToken,
}

impl Supervisor {
    pub async fn run(mut self) {
        let why = self.supervise().await;
        let newly_expired = self.shared.mark_expired();
        if newly_expired && !self.cancel.is_cancelled() {
            warn!(reason = %why, "ZooKeeper session ended; every task lock of it is lost");
        } else {
            info!(reason = %why, "ZooKeeper session ended");
        }
        // Close the client in every case: after an expiry the library may already have
        // opened a new session, which must not live on (nor anything created in it), and
        // its I/O task only stops after a close.
        match timeout(self.timings.op, self.zk.close()).await {
            Ok(Ok(())) => debug!("ZooKeeper client closed"),
            Ok(Err(e)) => debug!(error = %e, "closing the ZooKeeper client"),
            Err(_) => warn!(
                "closing the ZooKeeper client timed out; its connection task lingers until \
                 ZooKeeper is reachable"
            ),
        }
    }

    /// One heartbeat: `exists` on the session's marker (the credential presented first
    /// on a new connection), with when it was sent.
    fn heartbeat(&self, unauthenticated: bool) -> Heartbeat {
        let zk = Arc::clone(&self.zk);
        let marker = self.marker.clone();
        let credential = self.credential.clone().filter(|_| unauthenticated);
        let timings = self.timings;
        let sent = Instant::now();
        Box::pin(async move {
            if let Some(c) = credential {
                let deadline = sent + timings.op;
                if let Err(e) = crate::handshake::authenticate(&zk, &c, deadline).await {
                    warn!(error = %e, "cannot present the ZooKeeper credential on the new connection yet");
                    return (sent, Some(Err(ZkCode::AuthFailed)));
                }
            }
            crate::requests::count(crate::requests::Op::Exists);
            (
                sent,
                timeout(timings.op, zk.exists(&marker, false)).await.ok(),
            )
        })
    }

    async fn supervise(&mut self) -> String {
        let timings = self.timings;
        let mut next_beat = Instant::now() + timings.heartbeat;
        let mut beat: Option<Heartbeat> = None;
        // A new connection has yet to present the credential (ZooKeeper keeps it per
        // connection): the heartbeat does first, and counts as failed until it did.
        let mut unauthenticated = false;
        loop {
            let connected = self.shared.state() == SessionState::Connected;
            let lease_until = self.shared.lease_until();
            tokio::select! {
                biased;
                _ = self.cancel.cancelled() => return "closed or dropped by its owner".to_owned(),
                event = self.events.recv() => match event {
                    // Confirm at once that it is still our session, and renew the lease;
                    // first, present the credential on the new connection.
                    Some(ZkState::Connected) => {
                        unauthenticated = self.credential.is_some();
                        // A heartbeat sent before is no proof about this connection.
                        beat = None;
                        next_beat = Instant::now();
                    }
                    Some(ZkState::Connecting) | Some(ZkState::ConnectedReadOnly) => {
                        warn!("ZooKeeper connection lost; publishing paused while reconnecting");
                    }
                    Some(other) => return format!("client state {other}"),
                    None => return "client gone".to_owned(),
                },
                (sent, outcome) = async { beat.as_mut().expect("guarded by is_some").await },
                    if beat.is_some() =>
                {
                    beat = None;
                    next_beat = Instant::now() + timings.heartbeat;
                    match outcome {
                        Some(Ok(Some(stat))) if stat.ephemeral_owner == self.session_id => {
                            unauthenticated = false;
                            self.shared.extend_lease(sent + timings.lease);
                            if self.shared.mark_connected() {
                                info!("ZooKeeper session confirmed; publishing may go on");
                            }
                        }
                        Some(Ok(_)) => {
                            return "the session's marker node is gone: the server expired the \
                                    session"
                                .to_owned()
                        }
                        Some(Err(ZkCode::SessionExpired)) => {
                            return "the server reports the session expired".to_owned()
                        }
                        Some(Err(e)) => debug!(error = %e, "heartbeat failed"),
                        None => debug!(timeout = ?timings.op, "heartbeat unanswered"),
                    }
                },
                _ = sleep_until(next_beat), if beat.is_none() => {
                    beat = Some(self.heartbeat(unauthenticated));
                },
                _ = sleep_until(lease_until), if connected => {
                    if Instant::now() >= self.shared.lease_until() && self.shared.mark_disconnected() {
                        warn!(
                            lease = ?timings.lease,
                            "no heartbeat answer within the lease; publishing paused"
                        );
                    }
                },
            }
        }
    }
}
