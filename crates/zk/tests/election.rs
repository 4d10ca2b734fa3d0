//! Election, epochs, registration and watched nodes against a real ZooKeeper: env
//! `ZOOKEEPER` (default `127.0.0.1:12181`, the one `make stack-up` starts).

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use sluice_zk::{
    CancellationToken, Coordinator, EpochRecord, Expect, Leader, ZkCode, ZkConfig, ZkError,
    LEADER_NODE,
};
use tokio::time::timeout;

fn cfg(root: &str) -> ZkConfig {
    ZkConfig {
        connect: std::env::var("ZOOKEEPER").unwrap_or_else(|_| "127.0.0.1:12181".to_owned()),
        root: root.to_owned(),
        session_timeout: Duration::from_secs(4),
        auth: None,
    }
}

fn root(name: &str) -> String {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    format!("/sluice-test-{name}-{}-{nanos}", std::process::id())
}

async fn connect(root: &str) -> Coordinator {
    let cfg = cfg(root);
    Coordinator::connect(&cfg).await.unwrap_or_else(|e| {
        panic!(
            "ZooKeeper is unreachable at {} ({e}): run `make stack-up`, or set ZOOKEEPER=host:port",
            cfg.connect
        )
    })
}

async fn within<T>(limit: Duration, what: &str, fut: impl std::future::Future<Output = T>) -> T {
    timeout(limit, fut)
        .await
        .unwrap_or_else(|_| panic!("{what} did not happen within {limit:?}"))
}

/// Deletes the test's nodes. Cleanup, not what a test checks: a transient error (once, a
/// fresh session's delete met `ConnectionLoss` in a full run on a loaded machine) is tried
/// again on a new session, for up to 10 s.
async fn remove(root: &str) {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let c = connect(root).await;
        let deleted = c.delete("", None, true).await;
        c.close().await;
        match deleted {
            Ok(()) => return,
            Err(e) if e.is_transient() && std::time::Instant::now() < deadline => {
                eprintln!("removing {root}: {e}; trying again");
            }
            Err(e) => panic!("cannot remove {root}: {e}"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_leader_at_a_time_and_each_takes_a_higher_epoch() {
    let root = root("election");
    let (a, b) = (connect(&root).await, connect(&root).await);
    let cancel = CancellationToken::new();
    assert_eq!(a.leader().await.unwrap(), None);
    let first = within(Duration::from_secs(5), "a leads", a.campaign(b"a", &cancel))
        .await
        .unwrap();
    assert_eq!(first.epoch(), 1);
    assert!(first.is_acting());

    let second = {
        let (b, cancel) = (b.clone(), cancel.clone());
        tokio::spawn(async move { b.campaign(b"b", &cancel).await })
    };
    // b has joined once its node is there; it must wait while a leads.
    within(Duration::from_secs(5), "b joins", async {
        while a.children("election").await.unwrap().len() < 2 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    assert!(!second.is_finished(), "b leads while a does");
    assert_eq!(
        a.leader().await.unwrap(),
        Some(Leader {
            info: b"a".to_vec(),
            epoch: 1
        })
    );
    assert_eq!(b.current_epoch().await.unwrap(), 1);

    // a's session ends: its leadership is lost and b leads with the next epoch.
    let a_session = a.clone();
    a_session.close().await;
    within(Duration::from_secs(5), "a notices", first.lost()).await;
    assert!(!first.is_acting());
    let second = within(Duration::from_secs(10), "b leads", second)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(second.epoch(), 2);
    assert_eq!(
        b.leader().await.unwrap(),
        Some(Leader {
            info: b"b".to_vec(),
            epoch: 2
        })
    );
    assert_eq!(b.current_epoch().await.unwrap(), 2);

    // Between a candidate becoming the lowest and its claim of the next epoch, nobody
    // leads: never the new leader with the old epoch (the record names another candidate).
    let unclaimed = serde_json::to_vec(&EpochRecord {
        epoch: 2,
        candidate: "c-not-claimed-yet".into(),
    })
    .unwrap();
    b.put(LEADER_NODE, &unclaimed, Expect::Any).await.unwrap();
    assert_eq!(b.leader().await.unwrap(), None);
    assert_eq!(b.current_epoch().await.unwrap(), 2);

    // Resigning hands over at once: a new candidate leads with epoch 3.
    let c = connect(&root).await;
    let third = {
        let (c, cancel) = (c.clone(), cancel.clone());
        tokio::spawn(async move { c.campaign(b"c", &cancel).await })
    };
    second.resign().await;
    let third = within(Duration::from_secs(5), "c leads", third)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(third.epoch(), 3);
    drop(third);
    b.close().await;
    c.close().await;
    remove(&root).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_registration_waits_for_the_previous_owner_and_goes_with_the_session() {
    let root = root("register");
    let (a, b) = (connect(&root).await, connect(&root).await);
    let cancel = CancellationToken::new();
    a.register("workers/w1", b"first", &cancel).await.unwrap();
    // Re-registering from the same session updates it.
    a.register("workers/w1", b"first again", &cancel)
        .await
        .unwrap();
    let node = b.get("workers/w1").await.unwrap().unwrap();
    assert_eq!(node.data, b"first again");
    assert_eq!(node.ephemeral_owner, a.session_id());

    let (names, watch) = b.children_watched("workers").await.unwrap();
    assert_eq!(names, ["w1"]);
    let waiting = {
        let (b, cancel) = (b.clone(), cancel.clone());
        tokio::spawn(async move { b.register("workers/w1", b"second", &cancel).await })
    };
    tokio::time::sleep(Duration::from_millis(500)).await; // a negative: nothing may happen
    assert!(!waiting.is_finished(), "registered over a live owner");

    a.close().await;
    within(
        Duration::from_secs(5),
        "the children watch fires",
        watch.changed(&b, &cancel),
    )
    .await
    .unwrap();
    within(Duration::from_secs(5), "b registers", waiting)
        .await
        .unwrap()
        .unwrap();
    let node = b.get("workers/w1").await.unwrap().unwrap();
    assert_eq!(
        (node.data.as_slice(), node.ephemeral_owner),
        (&b"second"[..], b.session_id())
    );
    b.close().await;
    remove(&root).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn puts_are_compare_and_set_and_watches_see_creation() {
    let root = root("nodes");
    let c = connect(&root).await;
    let cancel = CancellationToken::new();
    let (none, watch) = c.get_watched("assignments/w1/db1").await.unwrap();
    assert!(none.is_none());
    let v0 = c
        .put("assignments/w1/db1", b"one", Expect::Absent)
        .await
        .unwrap();
    within(
        Duration::from_secs(5),
        "creation is seen",
        watch.changed(&c, &cancel),
    )
    .await
    .unwrap();
    assert!(matches!(
        c.put("assignments/w1/db1", b"x", Expect::Absent).await,
        Err(ZkError::Zk {
            source: ZkCode::NodeExists,
            ..
        })
    ));
    let v1 = c
        .put("assignments/w1/db1", b"two", Expect::Version(v0))
        .await
        .unwrap();
    assert!(matches!(
        c.put("assignments/w1/db1", b"stale", Expect::Version(v0))
            .await,
        Err(ZkError::Zk {
            source: ZkCode::BadVersion,
            ..
        })
    ));
    let (node, watch) = c.get_watched("assignments/w1/db1").await.unwrap();
    assert_eq!((node.unwrap().data, v1), (b"two".to_vec(), v0 + 1));
    c.put("assignments/w1/db1", b"three", Expect::Any)
        .await
        .unwrap();
    within(
        Duration::from_secs(5),
        "the change is seen",
        watch.changed(&c, &cancel),
    )
    .await
    .unwrap();
    assert_eq!(c.children("assignments/w1").await.unwrap(), ["db1"]);
    c.delete("assignments", None, true).await.unwrap();
    assert!(c.children("assignments/w1").await.unwrap().is_empty());
    c.close().await;
    remove(&root).await;
}
