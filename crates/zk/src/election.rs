//! Leader election among center replicas, with an epoch that fences a deposed leader.
//!
//! Each candidate creates an ephemeral-sequential node `election/c-<seq>` holding what it
//! wants others to know (its id and address); the lowest sequence leads. A candidate
//! waits on the deletion of the node just before its own (no herd on every change).
//!
//! The new leader then claims the next **epoch**: a compare-and-set increment of the
//! persistent node `leader`. Everything a leader writes carries its epoch, and readers
//! ignore writes of an epoch older than the one in `leader`, so a deposed leader's late
//! writes take no effect even if its client silently opened a new session.
//!
//! A leader acts only while [`Leadership::is_acting`]: its session is confirmed alive
//! within the lease (see [`crate::session`]), which ends at least half a session timeout
//! before the server can expire the session and delete the election node — and no
//! successor can lead before that deletion.

use serde::{Deserialize, Serialize};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};
use zookeeper_async::CreateMode;

use crate::coordinator::Coordinator;
use crate::error::ZkError;
use crate::nodes::Expect;
use crate::requests::Op;

const ELECTION: &str = "election";
const EXPIRED: &str = "the ZooKeeper session expired";
const PREFIX: &str = "c-";
/// The persistent node holding the current epoch.
pub const LEADER_NODE: &str = "leader";

/// The content of the `leader` node.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct EpochRecord {
    pub epoch: u64,
    /// The election node of the candidate that claimed it.
    pub candidate: String,
}

/// The leader as others see it ([`Coordinator::leader`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Leader {
    /// What the leader published when it joined (its id and address).
    pub info: Vec<u8>,
    /// The epoch it claimed.
    pub epoch: u64,
}

/// A candidate that won the election.
pub struct Leadership {
    coord: Coordinator,
    node: String,
    epoch: u64,
    lost: watch::Receiver<Option<String>>,
    stop: CancellationToken,
}

impl Coordinator {
    /// Joins the election and returns once this candidate leads and has claimed the
    /// next epoch. `info` is what followers report as the leader (e.g. JSON with an id
    /// and an address).
    pub async fn campaign(
        &self,
        info: &[u8],
        cancel: &CancellationToken,
    ) -> Result<Leadership, ZkError> {
        let node = self.candidate_node(info).await?;
        let name = node.rsplit('/').next().unwrap_or_default().to_owned();
        info!(candidate = %name, "joined the center election");
        let leading = async {
            loop {
                let candidates = self.candidates().await?;
                let Some(at) = candidates.iter().position(|c| *c == name) else {
                    return Err(ZkError::Fenced {
                        task: "leadership".into(),
                        detail: "our election node disappeared".into(),
                    });
                };
                if at == 0 {
                    break;
                }
                let before = format!("{ELECTION}/{}", candidates[at - 1]);
                if let (Some(_), watch) = self.get_watched(&before).await? {
                    watch.changed(self, cancel).await?;
                }
            }
            self.claim_epoch(&name).await
        };
        match leading.await {
            Ok(epoch) => {
                let (lost_tx, lost) = watch::channel(None);
                let stop = CancellationToken::new();
                tokio::spawn(guard(self.clone(), node.clone(), lost_tx, stop.clone()));
                info!(candidate = %name, epoch, "leading");
                Ok(Leadership {
                    coord: self.clone(),
                    node,
                    epoch,
                    lost,
                    stop,
                })
            }
            Err(e) => {
                let rel = format!("{ELECTION}/{name}");
                if let Err(d) = self.delete(&rel, None, false).await {
                    warn!(error = %d, "could not withdraw from the election; the node goes with the session");
                }
                Err(e)
            }
        }
    }

    /// Who leads, read as one: the lowest candidate, once it has claimed its epoch. `None`
    /// while nobody leads — no candidate, or the lowest one has not claimed its epoch yet
    /// (the one before it just left: an election is under way). Never the new leader
    /// with the old epoch.
    pub async fn leader(&self) -> Result<Option<Leader>, ZkError> {
        let Some(claimed) = self.epoch_record().await? else {
            return Ok(None);
        };
        for name in self.candidates().await? {
            if let Some(node) = self.get(&format!("{ELECTION}/{name}")).await? {
                return Ok((name == claimed.candidate).then_some(Leader {
                    info: node.data,
                    epoch: claimed.epoch,
                }));
            }
        }
        Ok(None)
    }

    /// The epoch of the most recent leader (0 before the first election).
    pub async fn current_epoch(&self) -> Result<u64, ZkError> {
        Ok(self.epoch_record().await?.map_or(0, |r| r.epoch))
    }

    async fn epoch_record(&self) -> Result<Option<EpochRecord>, ZkError> {
        Ok(self
            .get(LEADER_NODE)
            .await?
            .and_then(|n| serde_json::from_slice::<EpochRecord>(&n.data).ok()))
    }

    async fn candidates(&self) -> Result<Vec<String>, ZkError> {
        let mut names: Vec<String> = self
            .children(ELECTION)
            .await?
            .into_iter()
            .filter(|n| n.starts_with(PREFIX))
            .collect();
        // Zero-padded sequence numbers after one prefix: name order is sequence order.
        names.sort();
        Ok(names)
    }

    /// Creates our ephemeral-sequential candidate node. When the answer to the create is
    /// lost, the node may exist anyway: find it by its owner.
    async fn candidate_node(&self, info: &[u8]) -> Result<String, ZkError> {
        let prefix = self.path(&format!("{ELECTION}/{PREFIX}"));
        self.ensure_persistent(&self.path(ELECTION)).await?;
        loop {
            match self
                .call(
                    Op::Create,
                    &prefix,
                    self.zk().create(
                        &prefix,
                        info.to_vec(),
                        self.acl(),
                        CreateMode::EphemeralSequential,
                    ),
                )
                .await
            {
                Ok(path) => return Ok(path),
                Err(e) if e.is_transient() && !matches!(e, ZkError::SessionExpired) => {
                    self.wait_connected(&CancellationToken::new()).await?;
                    for name in self.candidates().await? {
                        let rel = format!("{ELECTION}/{name}");
                        if let Some(n) = self.get(&rel).await? {
                            if n.ephemeral_owner == self.session_id() {
                                return Ok(self.path(&rel));
                            }
                        }
                    }
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// Compare-and-set increment of the epoch.
    async fn claim_epoch(&self, candidate: &str) -> Result<u64, ZkError> {
        loop {
            let (current, expect) = match self.get(LEADER_NODE).await? {
                Some(n) => {
                    let rec: EpochRecord = serde_json::from_slice(&n.data).map_err(|e| {
                        ZkError::InvalidArgument(format!(
                            "{}: not an epoch record ({e})",
                            self.path(LEADER_NODE)
                        ))
                    })?;
                    (rec.epoch, Expect::Version(n.version))
                }
                None => (0, Expect::Absent),
            };
            let next = EpochRecord {
                epoch: current + 1,
                candidate: candidate.to_owned(),
            };
            let data = serde_json::to_vec(&next).expect("epoch record serializes");
            match self.put(LEADER_NODE, &data, expect).await {
                Ok(_) => return Ok(next.epoch),
                Err(e) if e.is_conflict() => continue,
                Err(e) => return Err(e),
            }
        }
    }
}

impl Leadership {
    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    /// True while this leader may act on anything: the session is confirmed alive within
    /// its lease and the election node is ours. False from the moment either is in doubt.
    pub fn is_acting(&self) -> bool {
        self.lost.borrow().is_none() && self.coord.is_live()
    }

    /// Resolves when the leadership is gone for good (session expired, node deleted),
    /// with the reason. A lost connection only pauses acting ([`Leadership::is_acting`]).
    pub async fn lost(&self) -> String {
        let mut lost = self.lost.clone();
        loop {
            if let Some(why) = lost.borrow_and_update().clone() {
                return why;
            }
            if lost.changed().await.is_err() {
                return "the leadership guard stopped".into();
            }
        }
    }

    /// Steps down: deletes the election node so the next candidate leads at once.
    pub async fn resign(self) {
        self.stop.cancel();
        let rel = relative(&self.coord, &self.node);
        if let Err(e) = self.coord.delete(&rel, None, false).await {
            warn!(error = %e, "could not delete the election node; it goes with the session");
        }
        info!(epoch = self.epoch, "resigned the leadership");
    }
}

impl Drop for Leadership {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

/// Watches our election node; reports the leadership lost when it is gone or the session
/// expired. After a reconnect looks again (watches are not restored).
async fn guard(
    coord: Coordinator,
    node: String,
    lost: watch::Sender<Option<String>>,
    stop: CancellationToken,
) {
    let rel = relative(&coord, &node);
    let lose = |why: &str| {
        warn!(reason = why, "leadership lost; acting stops");
        lost.send_replace(Some(why.to_owned()));
    };
    loop {
        if let Err(e) = coord.wait_connected(&stop).await {
            if !matches!(e, ZkError::Cancelled) {
                lose(EXPIRED);
            }
            return;
        }
        let watched = tokio::select! {
            w = coord.get_watched(&rel) => w,
            _ = stop.cancelled() => return,
        };
        match watched {
            Ok((Some(n), watch)) if n.ephemeral_owner == coord.session_id() => {
                match watch.changed(&coord, &stop).await {
                    Ok(()) => {}
                    Err(ZkError::Cancelled) => return,
                    Err(_) => return lose(EXPIRED),
                }
            }
            Ok(_) => return lose("our election node was deleted"),
            Err(ZkError::SessionExpired) => return lose(EXPIRED),
            Err(_) => {
                tokio::select! {
                    _ = tokio::time::sleep(coord.timings().heartbeat) => {}
                    _ = stop.cancelled() => return,
                }
            }
        }
    }
}

/// `path` relative to the coordinator's root.
fn relative(coord: &Coordinator, path: &str) -> String {
    path.strip_prefix(&format!("{}/", coord.path("")))
        .unwrap_or(path)
        .to_owned()
}
