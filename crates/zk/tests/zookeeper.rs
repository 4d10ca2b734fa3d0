//! `sluice-zk` against a real ZooKeeper: env `ZOOKEEPER` (default `127.0.0.1:12181`, the
//! one `make stack-up` starts). Every test works below its own random root. Connection
//! loss and partitions are produced with a TCP proxy between a coordinator and the server.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use sluice_faultproxy::{Mode, Proxy};
use sluice_zk::{CancellationToken, Coordinator, SessionState, ZkCode, ZkConfig, ZkError, LAYOUT};
use tokio::task::JoinHandle;
use tokio::time::{timeout, Instant};
use zookeeper_async::{ZooKeeper, ZooKeeperExt};

/// Short enough for quick expiries, within the stack's [minSessionTimeout, maxSessionTimeout].
const SESSION_TIMEOUT: Duration = Duration::from_secs(4);
const TASK: &str = "db1.example-3306";
/// The services' digest credential in these tests.
const AUTH: &str = "sluice-test:s3cret";

fn zookeeper() -> String {
    std::env::var("ZOOKEEPER").unwrap_or_else(|_| "127.0.0.1:12181".to_owned())
}

fn init_tracing() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_test_writer()
        .try_init();
}

/// A private root and a plain client (another session) to look at and meddle with it.
struct Fixture {
    root: String,
    raw: ZooKeeper,
}

impl Fixture {
    async fn new() -> Self {
        init_tracing();
        static N: AtomicUsize = AtomicUsize::new(0);
        let millis = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_millis();
        let root = format!(
            "/sluice-test-{}-{}-{millis}",
            std::process::id(),
            N.fetch_add(1, Ordering::SeqCst)
        );
        let addr = zookeeper();
        let raw = timeout(
            Duration::from_secs(10),
            ZooKeeper::connect(&addr, Duration::from_secs(10), |_| {}),
        )
        .await
        .unwrap_or_else(|_| unreachable_zookeeper(&addr, "no connection within 10 s"))
        .unwrap_or_else(|e| unreachable_zookeeper(&addr, &e.to_string()));
        // Requests queue until the session is up: the first answer proves it.
        match timeout(Duration::from_secs(10), raw.exists("/", false)).await {
            Ok(Ok(_)) => {}
            Ok(Err(e)) => unreachable_zookeeper(&addr, &e.to_string()),
            Err(_) => unreachable_zookeeper(&addr, "no answer within 10 s"),
        }
        // The raw client plays a Sluice service behind the coordinators' backs: it holds
        // their credential.
        raw.add_auth("digest", AUTH.as_bytes().to_vec())
            .await
            .unwrap();
        Self { root, raw }
    }

    fn cfg(&self, connect: &str) -> ZkConfig {
        ZkConfig {
            connect: connect.to_owned(),
            root: self.root.clone(),
            session_timeout: SESSION_TIMEOUT,
            auth: Some(sluice_model::Secret::new(AUTH)),
        }
    }

    async fn connect(&self) -> Coordinator {
        connect(&self.cfg(&zookeeper())).await
    }

    fn checkpoint_path(&self) -> String {
        format!("{}/tasks/{TASK}/checkpoint", self.root)
    }

    fn lock_path(&self) -> String {
        format!("{}/locks/{TASK}", self.root)
    }

    async fn checkpoint_version(&self) -> i32 {
        self.raw
            .get_data(&self.checkpoint_path(), false)
            .await
            .unwrap()
            .1
            .version
    }

    async fn cleanup(self) {
        let _ = self.raw.delete_recursive(&self.root).await;
        let _ = self.raw.close().await;
    }
}

fn unreachable_zookeeper(addr: &str, why: &str) -> ! {
    panic!(
        "ZooKeeper is unreachable at {addr} ({why}): run `make stack-up`, or set ZOOKEEPER=host:port"
    )
}

async fn connect(cfg: &ZkConfig) -> Coordinator {
    match Coordinator::connect(cfg).await {
        Ok(coordinator) => coordinator,
        Err(e) => unreachable_zookeeper(&cfg.connect, &e.to_string()),
    }
}

/// `acquire_task_lock` in a task; yields when it got the lock, and when.
fn acquire_in_background(
    coordinator: &Coordinator,
    owner: &'static [u8],
    cancel: CancellationToken,
) -> JoinHandle<Result<(Instant, sluice_zk::TaskLock), ZkError>> {
    let coordinator = coordinator.clone();
    tokio::spawn(async move {
        let lock = coordinator.acquire_task_lock(TASK, owner, &cancel).await?;
        Ok((Instant::now(), lock))
    })
}

/// Asserts that a background acquire is still waiting a while after it started.
async fn assert_still_waiting<T: std::fmt::Debug>(waiter: &mut JoinHandle<T>) {
    if let Ok(done) = timeout(Duration::from_secs(1), &mut *waiter).await {
        panic!("acquired a lock another live session holds: {done:?}");
    }
}

/// The futures a worker holds across `.await`s must be `Send` (checked at compile time).
#[allow(dead_code)]
fn futures_are_send(coordinator: &Coordinator, lock: &mut sluice_zk::TaskLock) {
    fn is_send<T: Send>(_: &T) {}
    let cancel = CancellationToken::new();
    is_send(&Coordinator::connect(&ZkConfig::new("x:1")));
    is_send(&coordinator.acquire_task_lock(TASK, b"", &cancel));
    is_send(&coordinator.read_checkpoint(TASK));
    is_send(&coordinator.write_checkpoint_unfenced(TASK, b""));
    is_send(&coordinator.clone().close());
    is_send(&lock.lost());
    is_send(&lock.ready());
    is_send(&lock.confirm(b""));
}

async fn within<T>(limit: Duration, what: &str, fut: impl std::future::Future<Output = T>) -> T {
    timeout(limit, fut)
        .await
        .unwrap_or_else(|_| panic!("{what}: not within {limit:?}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connect_creates_the_layout_and_a_session_marker() {
    let fx = Fixture::new().await;
    let a = fx.connect().await;
    assert_ne!(a.session_id(), 0);
    assert_eq!(*a.session().borrow(), SessionState::Connected);
    assert_eq!(a.path("locks/x"), format!("{}/locks/x", fx.root));
    assert_eq!(a.path("/tasks/"), format!("{}/tasks", fx.root));
    assert_eq!(a.path(""), fx.root);
    for child in LAYOUT {
        let stat = fx.raw.exists(&a.path(child), false).await.unwrap();
        assert!(stat.is_some_and(|s| s.ephemeral_owner == 0), "{child}");
    }
    let markers = fx
        .raw
        .get_children(&a.path("sessions"), false)
        .await
        .unwrap();
    assert_eq!(markers.len(), 1, "{markers:?}");
    let marker = a.path(&format!("sessions/{}", markers[0]));
    let (_, stat) = fx.raw.get_data(&marker, false).await.unwrap();
    assert_eq!(stat.ephemeral_owner, a.session_id());

    // A second coordinator on the same root is another session; connecting is idempotent.
    let b = fx.connect().await;
    assert_ne!(a.session_id(), b.session_id());

    let mut state = a.session();
    a.close().await;
    assert_eq!(*state.borrow_and_update(), SessionState::Expired);
    // The close request is written, not yet answered, when `close` returns: the server
    // drops the session's marker as it processes it.
    within(
        Duration::from_secs(5),
        "the closed session's marker goes",
        async {
            while fx.raw.exists(&marker, false).await.unwrap().is_some() {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        },
    )
    .await;
    b.close().await;
    fx.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unreachable_zookeeper_is_a_clear_error() {
    init_tracing();
    let cfg = ZkConfig {
        session_timeout: Duration::from_secs(2),
        ..ZkConfig::new("127.0.0.1:1")
    };
    let err = within(
        Duration::from_secs(5),
        "connect to a closed port",
        Coordinator::connect(&cfg),
    )
    .await
    .unwrap_err();
    assert!(matches!(err, ZkError::Unreachable { .. }), "{err:?}");
    assert!(err.is_transient());
    assert!(err.to_string().contains("127.0.0.1:1"), "{err}");

    let bad = ZkConfig {
        root: "relative".to_owned(),
        ..ZkConfig::new("127.0.0.1:1")
    };
    let err = Coordinator::connect(&bad).await.unwrap_err();
    assert!(matches!(err, ZkError::InvalidConfig(_)), "{err:?}");
    assert!(err.to_string().contains("`root`"), "{err}");
}

/// With `auth`, Sluice's nodes admit its credential alone: a client without it can
/// neither read nor change a checkpoint, a lock or the layout, and a service with another
/// credential is stopped at connect with the reason.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nodes_admit_only_the_services_credential() {
    let fx = Fixture::new().await;
    let a = fx.connect().await;
    let mut lock = a
        .acquire_task_lock(TASK, b"worker-a", &CancellationToken::new())
        .await
        .unwrap();
    lock.confirm(b"{\"position\":1}").await.unwrap();

    let addr = zookeeper();
    let stranger = ZooKeeper::connect(&addr, Duration::from_secs(10), |_| {})
        .await
        .unwrap();
    let no_auth = |r: Result<(), zookeeper_async::ZkError>, what: &str| {
        assert_eq!(r, Err(ZkCode::NoAuth), "{what}");
    };
    no_auth(
        stranger
            .set_data(&fx.checkpoint_path(), b"{}".to_vec(), None)
            .await
            .map(drop),
        "changing a checkpoint",
    );
    no_auth(
        stranger
            .get_data(&fx.checkpoint_path(), false)
            .await
            .map(drop),
        "reading a checkpoint",
    );
    no_auth(
        stranger.delete(&fx.lock_path(), None).await,
        "deleting a lock",
    );
    no_auth(
        stranger
            .create(
                &format!("{}/assignments/w9", fx.root),
                Vec::new(),
                zookeeper_async::Acl::open_unsafe().clone(),
                zookeeper_async::CreateMode::Persistent,
            )
            .await
            .map(drop),
        "adding an assignment",
    );
    let _ = stranger.close().await;
    let (data, _) = fx.raw.get_data(&fx.checkpoint_path(), false).await.unwrap();
    assert_eq!(data, b"{\"position\":1}", "the checkpoint is untouched");

    let other = ZkConfig {
        auth: Some(sluice_model::Secret::new("someone:else")),
        ..fx.cfg(&addr)
    };
    let err = Coordinator::connect(&other).await.unwrap_err();
    let said = err.to_string();
    assert!(said.contains("the same `zookeeper.auth`"), "{said}");
    assert!(
        !said.contains("else"),
        "the credential stays out of the error: {said}"
    );
    lock.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lock_is_exclusive_and_passes_on_release() {
    let fx = Fixture::new().await;
    let a = fx.connect().await;
    let b = fx.connect().await;

    let lock_a = a
        .acquire_task_lock(TASK, b"worker-a", &CancellationToken::new())
        .await
        .unwrap();
    assert!(lock_a.may_publish());
    let (owner_info, stat) = fx.raw.get_data(&fx.lock_path(), false).await.unwrap();
    assert_eq!(owner_info, b"worker-a");
    assert_eq!(stat.ephemeral_owner, a.session_id());

    let mut waiter = acquire_in_background(&b, b"worker-b", CancellationToken::new());
    assert_still_waiting(&mut waiter).await;

    // A second waiter gives up when cancelled.
    let cancel = CancellationToken::new();
    let cancelled = acquire_in_background(&b, b"worker-c", cancel.clone());
    cancel.cancel();
    let err = within(Duration::from_secs(5), "cancelled acquire", cancelled)
        .await
        .unwrap()
        .unwrap_err();
    assert!(matches!(err, ZkError::Cancelled), "{err:?}");

    assert!(!waiter.is_finished());
    lock_a.release().await.unwrap();
    let (_, lock_b) = within(Duration::from_secs(5), "B takes the released lock", waiter)
        .await
        .unwrap()
        .unwrap();
    assert!(lock_b.may_publish());
    let (owner_info, stat) = fx.raw.get_data(&fx.lock_path(), false).await.unwrap();
    assert_eq!(owner_info, b"worker-b");
    assert_eq!(stat.ephemeral_owner, b.session_id());

    lock_b.release().await.unwrap();
    assert!(fx
        .raw
        .exists(&fx.lock_path(), false)
        .await
        .unwrap()
        .is_none());
    a.close().await;
    b.close().await;
    fx.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lock_passes_when_the_holder_session_closes() {
    let fx = Fixture::new().await;
    let a = fx.connect().await;
    let b = fx.connect().await;
    let mut lock_a = a
        .acquire_task_lock(TASK, b"worker-a", &CancellationToken::new())
        .await
        .unwrap();
    lock_a.confirm(b"pos-1").await.unwrap();

    let mut waiter = acquire_in_background(&b, b"worker-b", CancellationToken::new());
    assert_still_waiting(&mut waiter).await;

    let mut state_a = a.session();
    a.close().await;
    assert_eq!(*state_a.borrow_and_update(), SessionState::Expired);
    assert!(!lock_a.may_publish());
    let why = within(Duration::from_secs(1), "lost() after close", lock_a.lost()).await;
    assert!(why.contains("expired"), "{why}");

    let (_, mut lock_b) = within(Duration::from_secs(10), "B takes over", waiter)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(lock_b.checkpoint(), Some(&b"pos-1"[..]));
    lock_b.confirm(b"pos-2").await.unwrap();

    let err = lock_a.confirm(b"pos-zombie").await.unwrap_err();
    assert!(err.is_fenced(), "{err:?}");
    assert_eq!(*state_a.borrow(), SessionState::Expired);
    assert_eq!(
        b.read_checkpoint(TASK).await.unwrap().as_deref(),
        Some(&b"pos-2"[..])
    );
    lock_b.release().await.unwrap();
    b.close().await;
    fx.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn checkpoint_round_trip_and_operator_reset() {
    let fx = Fixture::new().await;
    let a = fx.connect().await;
    let never = CancellationToken::new();
    assert_eq!(a.read_checkpoint(TASK).await.unwrap(), None);

    let mut lock = a.acquire_task_lock(TASK, b"a", &never).await.unwrap();
    assert_eq!(lock.checkpoint(), None);
    assert_eq!(a.read_checkpoint(TASK).await.unwrap(), None);
    lock.confirm(b"mysql-bin.000001:4").await.unwrap();
    let v1 = fx.checkpoint_version().await;
    lock.confirm(b"mysql-bin.000001:120").await.unwrap();
    assert_eq!(fx.checkpoint_version().await, v1 + 1);
    assert_eq!(
        a.read_checkpoint(TASK).await.unwrap().as_deref(),
        Some(&b"mysql-bin.000001:120"[..])
    );
    let err = lock.confirm(b"").await.unwrap_err();
    assert!(matches!(err, ZkError::InvalidArgument(_)), "{err:?}");
    lock.release().await.unwrap();

    let mut lock = a.acquire_task_lock(TASK, b"a", &never).await.unwrap();
    assert_eq!(lock.checkpoint(), Some(&b"mysql-bin.000001:120"[..]));

    // An operator resets the position under the running holder: its next confirm is
    // fenced and does not land; the task restarts from the reset position.
    a.write_checkpoint_unfenced(TASK, b"mysql-bin.000001:4")
        .await
        .unwrap();
    let err = lock.confirm(b"mysql-bin.000001:500").await.unwrap_err();
    assert!(err.is_fenced(), "{err:?}");
    assert!(!lock.may_publish());
    assert!(lock
        .confirm(b"mysql-bin.000001:501")
        .await
        .unwrap_err()
        .is_fenced());
    assert_eq!(
        a.read_checkpoint(TASK).await.unwrap().as_deref(),
        Some(&b"mysql-bin.000001:4"[..])
    );
    lock.release().await.unwrap();
    let lock = a.acquire_task_lock(TASK, b"a", &never).await.unwrap();
    assert_eq!(lock.checkpoint(), Some(&b"mysql-bin.000001:4"[..]));
    lock.release().await.unwrap();

    // A fresh task: the unfenced write creates the node.
    a.write_checkpoint_unfenced("other", b"x").await.unwrap();
    assert_eq!(
        a.read_checkpoint("other").await.unwrap().as_deref(),
        Some(&b"x"[..])
    );
    let err = a.acquire_task_lock("a/b", b"", &never).await.unwrap_err();
    assert!(matches!(err, ZkError::InvalidArgument(_)), "{err:?}");
    a.close().await;
    fx.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_zombie_is_fenced_at_the_store() {
    let fx = Fixture::new().await;
    let a = fx.connect().await;
    let b = fx.connect().await;
    let mut lock_a = a
        .acquire_task_lock(TASK, b"worker-a", &CancellationToken::new())
        .await
        .unwrap();
    lock_a.confirm(b"pos-1").await.unwrap();
    // The version A's next confirm would be made with.
    let stale = fx.checkpoint_version().await;

    let mut waiter = acquire_in_background(&b, b"worker-b", CancellationToken::new());
    assert_still_waiting(&mut waiter).await;
    a.close().await;
    let (_, mut lock_b) = within(Duration::from_secs(10), "B takes over", waiter)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(lock_b.checkpoint(), Some(&b"pos-1"[..]));

    // A write A had in flight lands after the take-over, before B confirmed anything:
    // taking the lock moved the version, so it fails at the store...
    let late = fx
        .raw
        .set_data(&fx.checkpoint_path(), b"pos-zombie".to_vec(), Some(stale))
        .await
        .unwrap_err();
    assert_eq!(late, ZkCode::BadVersion);
    // ... and does not fence the rightful holder.
    lock_b.confirm(b"pos-2").await.unwrap();
    let late = fx
        .raw
        .set_data(&fx.checkpoint_path(), b"pos-zombie".to_vec(), Some(stale))
        .await
        .unwrap_err();
    assert_eq!(late, ZkCode::BadVersion);

    let err = lock_a.confirm(b"pos-zombie").await.unwrap_err();
    assert!(err.is_fenced(), "{err:?}");
    assert_eq!(
        b.read_checkpoint(TASK).await.unwrap().as_deref(),
        Some(&b"pos-2"[..])
    );
    lock_b.release().await.unwrap();
    b.close().await;
    fx.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_node_of_our_own_session_is_adopted() {
    let fx = Fixture::new().await;
    let a = fx.connect().await;
    let never = CancellationToken::new();
    let mut first = a.acquire_task_lock(TASK, b"a", &never).await.unwrap();
    first.confirm(b"pos-1").await.unwrap();
    drop(first); // the node stays: it belongs to the live session
    assert!(fx
        .raw
        .exists(&fx.lock_path(), false)
        .await
        .unwrap()
        .is_some());

    let mut again = within(
        Duration::from_secs(5),
        "re-acquire our own lock",
        a.acquire_task_lock(TASK, b"a", &never),
    )
    .await
    .unwrap();
    assert!(again.may_publish());
    assert_eq!(again.checkpoint(), Some(&b"pos-1"[..]));
    again.confirm(b"pos-2").await.unwrap();
    again.release().await.unwrap();
    assert!(fx
        .raw
        .exists(&fx.lock_path(), false)
        .await
        .unwrap()
        .is_none());
    a.close().await;
    fx.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_connection_pauses_at_once_and_the_same_session_resumes() {
    let fx = Fixture::new().await;
    let proxy = Proxy::start(&zookeeper()).await;
    let a = connect(&fx.cfg(&proxy.addr())).await;
    let mut lock_a = a
        .acquire_task_lock(TASK, b"worker-a", &CancellationToken::new())
        .await
        .unwrap();
    lock_a.confirm(b"pos-1").await.unwrap();
    let lease = a.session_timeout() / 2;
    let mut state = a.session();
    state.borrow_and_update();

    proxy.set(Mode::Refuse);
    // Reported by the connection drop itself, well before the lease would run out.
    within(
        lease / 2,
        "Disconnected after the connection dropped",
        state.wait_for(|s| *s == SessionState::Disconnected),
    )
    .await
    .unwrap();
    assert!(!lock_a.may_publish());
    let err = lock_a.confirm(b"pos-2").await.unwrap_err();
    assert!(matches!(err, ZkError::NotConnected), "{err:?}");
    assert!(err.is_transient());

    proxy.set(Mode::Open);
    within(
        a.session_timeout(),
        "Connected again in the same session",
        state.wait_for(|s| *s == SessionState::Connected),
    )
    .await
    .unwrap();
    // The lock node is looked at again in the new connection before publishing resumes.
    within(a.session_timeout(), "lock ready again", lock_a.ready())
        .await
        .unwrap();
    assert!(lock_a.may_publish());
    lock_a.confirm(b"pos-2").await.unwrap();
    let (_, stat) = fx.raw.get_data(&fx.lock_path(), false).await.unwrap();
    assert_eq!(stat.ephemeral_owner, a.session_id());

    // The lock's watch was set again in the new connection (the old one's died with it):
    // an operator deleting the node revokes the lock.
    fx.raw.delete(&fx.lock_path(), None).await.unwrap();
    let why = within(Duration::from_secs(5), "lock revoked", lock_a.lost()).await;
    assert!(why.contains("deleted"), "{why}");
    assert!(!lock_a.may_publish());
    assert!(lock_a.confirm(b"pos-3").await.unwrap_err().is_fenced());
    assert!(lock_a.ready().await.unwrap_err().is_fenced());
    assert_eq!(*a.session().borrow(), SessionState::Connected);
    a.close().await;
    fx.cleanup().await;
}

/// The seeds' split-brain: the holder is cut off from ZooKeeper without noticing a
/// closed connection. It must stop publishing before its session can expire, i.e. before
/// anyone else can get the lock; its late writes are fenced; it never becomes Connected
/// again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partitioned_holder_pauses_before_anyone_can_take_over() {
    let fx = Fixture::new().await;
    let proxy = Proxy::start(&zookeeper()).await;
    let a = connect(&fx.cfg(&proxy.addr())).await;
    let b = fx.connect().await;
    let t = a.session_timeout();

    let mut lock_a = a
        .acquire_task_lock(TASK, b"worker-a", &CancellationToken::new())
        .await
        .unwrap();
    lock_a.confirm(b"pos-1").await.unwrap();
    let stale = fx.checkpoint_version().await;
    let mut waiter = acquire_in_background(&b, b"worker-b", CancellationToken::new());
    assert_still_waiting(&mut waiter).await;

    // Record every state A goes through from now on.
    let mut state = a.session();
    assert_eq!(*state.borrow_and_update(), SessionState::Connected);
    let history = tokio::spawn({
        let mut state = state.clone();
        async move {
            let mut seen = Vec::new();
            while state.changed().await.is_ok() {
                let now = *state.borrow_and_update();
                seen.push(now);
                if now == SessionState::Expired {
                    break;
                }
            }
            seen
        }
    });

    let frozen_at = Instant::now();
    proxy.set(Mode::Blackhole);
    within(
        t / 2 + Duration::from_millis(500),
        "A pauses within the lease",
        state.wait_for(|s| *s != SessionState::Connected),
    )
    .await
    .unwrap();
    let paused_at = Instant::now();
    assert!(!lock_a.may_publish());
    let err = lock_a.confirm(b"pos-late").await.unwrap_err();
    assert!(matches!(err, ZkError::NotConnected), "{err:?}");

    let (acquired_at, mut lock_b) = within(t * 3, "B takes over after A's session expired", waiter)
        .await
        .unwrap()
        .unwrap();
    assert!(
        paused_at < acquired_at,
        "A paused {:?} after the partition, B acquired after {:?}",
        paused_at - frozen_at,
        acquired_at - frozen_at
    );
    assert!(!lock_a.may_publish());
    assert_eq!(lock_b.checkpoint(), Some(&b"pos-1"[..]));
    lock_b.confirm(b"pos-2").await.unwrap();

    // The partition heals: A learns its session is gone and stays out.
    proxy.set(Mode::Open);
    within(
        Duration::from_secs(30),
        "A reports Expired",
        state.wait_for(|s| *s == SessionState::Expired),
    )
    .await
    .unwrap();
    let seen = within(Duration::from_secs(1), "state history", history)
        .await
        .unwrap();
    assert!(!seen.contains(&SessionState::Connected), "{seen:?}");
    assert_eq!(seen.last(), Some(&SessionState::Expired), "{seen:?}");
    assert!(!lock_a.may_publish());
    assert!(lock_a.confirm(b"pos-zombie").await.unwrap_err().is_fenced());
    let late = fx
        .raw
        .set_data(&fx.checkpoint_path(), b"pos-zombie".to_vec(), Some(stale))
        .await
        .unwrap_err();
    assert_eq!(late, ZkCode::BadVersion);
    assert_eq!(
        b.read_checkpoint(TASK).await.unwrap().as_deref(),
        Some(&b"pos-2"[..])
    );
    // A no longer has a session of any kind: no session marker but B's is left.
    let markers = fx
        .raw
        .get_children(&b.path("sessions"), false)
        .await
        .unwrap();
    assert_eq!(markers.len(), 1, "{markers:?}");

    lock_b.release().await.unwrap();
    a.close().await;
    b.close().await;
    fx.cleanup().await;
}

/// The data of child `name` in a cached directory of numbers, `None` when absent.
fn cached_number(cache: &sluice_zk::DirCache<u64>, name: &str) -> Option<u64> {
    cache.nodes().get(name).and_then(|c| c.record.clone().ok())
}

/// Looks at `cache` until `done` holds (a watch's news is asynchronous).
async fn refresh_until(
    coordinator: &Coordinator,
    cache: &mut sluice_zk::DirCache<u64>,
    what: &str,
    done: impl Fn(&sluice_zk::DirCache<u64>) -> bool,
) {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        coordinator.refresh(cache).await.unwrap();
        if done(cache) {
            return;
        }
        assert!(Instant::now() < deadline, "{what}: not seen within 5 s");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cached_directory_reads_what_changed_and_everything_after_a_reconnect() {
    let fx = Fixture::new().await;
    let proxy = Proxy::start(&zookeeper()).await;
    let a = connect(&fx.cfg(&proxy.addr())).await;
    for (name, n) in [("x", b"1"), ("y", b"2")] {
        a.put(&format!("d/{name}"), n, sluice_zk::Expect::Absent)
            .await
            .unwrap();
    }
    let mut cache: sluice_zk::DirCache<u64> = sluice_zk::DirCache::new("d");
    a.refresh(&mut cache).await.unwrap();
    assert_eq!(cache.reads(), 3, "a first look: the list and each node");
    assert_eq!(
        (cached_number(&cache, "x"), cached_number(&cache, "y")),
        (Some(1), Some(2))
    );
    a.refresh(&mut cache).await.unwrap();
    assert_eq!(cache.reads(), 3, "nothing changed: nothing read");

    // Changes behind its back reach it through the watches, and only they are read.
    let path = |name: &str| format!("{}/d/{name}", fx.root);
    fx.raw
        .set_data(&path("x"), b"3".to_vec(), None)
        .await
        .unwrap();
    refresh_until(&a, &mut cache, "x changed", |c| {
        cached_number(c, "x") == Some(3)
    })
    .await;
    assert_eq!(cache.reads(), 4, "the one node that changed");
    fx.raw.delete(&path("y"), None).await.unwrap();
    a.put("d/z", b"5", sluice_zk::Expect::Absent).await.unwrap();
    refresh_until(&a, &mut cache, "y gone, z there", |c| {
        c.names().iter().eq(["x", "z"]) && cached_number(c, "z") == Some(5)
    })
    .await;
    assert!(cached_number(&cache, "y").is_none());

    // A change made while the connection is down fires no watch of it: after the
    // reconnect, everything is read again.
    let mut state = a.session();
    proxy.set(Mode::Refuse);
    within(
        Duration::from_secs(2),
        "Disconnected",
        state.wait_for(|s| *s == SessionState::Disconnected),
    )
    .await
    .unwrap();
    fx.raw
        .set_data(&path("z"), b"6".to_vec(), None)
        .await
        .unwrap();
    proxy.set(Mode::Open);
    within(
        a.session_timeout(),
        "Connected again",
        state.wait_for(|s| *s == SessionState::Connected),
    )
    .await
    .unwrap();
    let before = cache.reads();
    a.refresh(&mut cache).await.unwrap();
    assert_eq!(cached_number(&cache, "z"), Some(6));
    assert_eq!(cache.reads() - before, 3, "the list and each node, again");
    a.close().await;
    fx.cleanup().await;
}

/// A directory that does not exist yet is cached as empty, and its creation and first
/// children reach the cache through a watch (a list of a missing node leaves none).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cached_directory_that_did_not_exist_sees_its_children_once_it_does() {
    let fx = Fixture::new().await;
    let a = connect(&fx.cfg(&zookeeper())).await;
    let mut cache: sluice_zk::DirCache<u64> = sluice_zk::DirCache::new("later");
    a.refresh(&mut cache).await.unwrap();
    assert!(cache.names().is_empty());
    let reads = cache.reads();
    a.refresh(&mut cache).await.unwrap();
    assert_eq!(cache.reads(), reads, "nothing changed: nothing read");

    // Created behind its back, with a child: no write of the cache's own to name it.
    fx.raw
        .create(
            &format!("{}/later", fx.root),
            Vec::new(),
            zookeeper_async::Acl::open_unsafe().clone(),
            zookeeper_async::CreateMode::Persistent,
        )
        .await
        .unwrap();
    fx.raw
        .create(
            &format!("{}/later/w", fx.root),
            b"7".to_vec(),
            zookeeper_async::Acl::open_unsafe().clone(),
            zookeeper_async::CreateMode::Persistent,
        )
        .await
        .unwrap();
    refresh_until(&a, &mut cache, "later/w seen", |c| {
        cached_number(c, "w") == Some(7)
    })
    .await;
    a.close().await;
    fx.cleanup().await;
}
