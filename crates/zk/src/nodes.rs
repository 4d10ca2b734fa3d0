//! Plain node operations below the root, for the registry, assignments, mappings and
//! pipelines: reads with a watch that survives reconnects (the caller looks again),
//! compare-and-set writes, and ephemeral registration tied to this session.

use tokio::sync::{oneshot, watch};
use tokio_util::sync::CancellationToken;
use zookeeper_async::{CreateMode, WatchedEvent};

use crate::coordinator::Coordinator;
use crate::error::{ZkCode, ZkError};
use crate::requests::Op;
use crate::session::SessionState;

/// A node's data and the version a compare-and-set must name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Node {
    pub data: Vec<u8>,
    pub version: i32,
    /// The session owning an ephemeral node; 0 for persistent ones.
    pub ephemeral_owner: i64,
    /// The transaction that created it: a node deleted and created again differs.
    pub created_zxid: i64,
}

impl Node {
    pub(crate) fn new(data: Vec<u8>, stat: zookeeper_async::Stat) -> Self {
        Self {
            data,
            version: stat.version,
            ephemeral_owner: stat.ephemeral_owner,
            created_zxid: stat.czxid,
        }
    }
}

/// What a write expects to find.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Expect {
    /// Whatever is there (or nothing): an unconditional write.
    Any,
    /// Nothing: the write creates the node and fails with `NodeExists` otherwise.
    Absent,
    /// Exactly this version: fails with `BadVersion` (or `NoNode`) otherwise.
    Version(i32),
}

/// A watch set by one of the `*_watched` reads. [`Watch::changed`] returns when the
/// watched thing changed, or when it must be looked at again because the connection was
/// re-established (the client library does not restore watches after a reconnect).
pub struct Watch {
    session: watch::Receiver<SessionState>,
    fired: oneshot::Receiver<WatchedEvent>,
}

impl Watch {
    pub async fn changed(
        mut self,
        coord: &Coordinator,
        cancel: &CancellationToken,
    ) -> Result<(), ZkError> {
        coord
            .wait_for_change(&mut self.session, self.fired, cancel)
            .await
    }
}

impl Coordinator {
    /// Waits until any of `watches` fired or must be set again (after a reconnect), the
    /// session expired, or `cancel`. With no watches, waits for the session or `cancel`.
    pub async fn wait_any(&self, watches: Vec<Watch>, cancel: &CancellationToken) {
        if watches.is_empty() {
            let mut session = self.session();
            tokio::select! {
                _ = session.changed() => {}
                _ = cancel.cancelled() => {}
            }
            return;
        }
        let changes = watches
            .into_iter()
            .map(|w| Box::pin(w.changed(self, cancel)));
        let _ = futures::future::select_all(changes).await;
    }

    /// The node at `rel` below the root, `None` when it does not exist.
    pub async fn get(&self, rel: &str) -> Result<Option<Node>, ZkError> {
        let path = self.path(rel);
        match self
            .call(Op::Get, &path, self.zk().get_data(&path, false))
            .await
        {
            Ok((data, stat)) => Ok(Some(Node::new(data, stat))),
            Err(ZkError::Zk {
                source: ZkCode::NoNode,
                ..
            }) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// The JSON record at `rel` (see [`crate::layout`]), `None` when there is no node.
    pub async fn get_json<T: serde::de::DeserializeOwned>(
        &self,
        rel: &str,
    ) -> Result<Option<T>, ZkError> {
        match self.get(rel).await? {
            Some(node) => {
                serde_json::from_slice(&node.data)
                    .map(Some)
                    .map_err(|e| ZkError::Unreadable {
                        path: self.path(rel),
                        detail: e.to_string(),
                    })
            }
            None => Ok(None),
        }
    }

    /// Like [`Coordinator::get`], with a watch on the node's data, creation or deletion.
    pub async fn get_watched(&self, rel: &str) -> Result<(Option<Node>, Watch), ZkError> {
        let path = self.path(rel);
        loop {
            let session = self.session();
            let (tx, fired) = oneshot::channel();
            match self
                .call(
                    Op::Get,
                    &path,
                    self.zk().get_data_w(&path, move |e| {
                        let _ = tx.send(e);
                    }),
                )
                .await
            {
                Ok((data, stat)) => {
                    return Ok((Some(Node::new(data, stat)), Watch { session, fired }));
                }
                Err(ZkError::Zk {
                    source: ZkCode::NoNode,
                    ..
                }) => {}
                Err(e) => return Err(e),
            }
            // Absent: watch for its creation. If it appeared in between, read it again.
            let (tx, fired) = oneshot::channel();
            let exists = self
                .call(
                    Op::Exists,
                    &path,
                    self.zk().exists_w(&path, move |e| {
                        let _ = tx.send(e);
                    }),
                )
                .await?;
            if exists.is_none() {
                return Ok((None, Watch { session, fired }));
            }
        }
    }

    /// The names of `rel`'s children, sorted; empty when `rel` does not exist.
    pub async fn children(&self, rel: &str) -> Result<Vec<String>, ZkError> {
        let path = self.path(rel);
        match self
            .call(Op::Children, &path, self.zk().get_children(&path, false))
            .await
        {
            Ok(mut names) => {
                names.sort();
                Ok(names)
            }
            Err(ZkError::Zk {
                source: ZkCode::NoNode,
                ..
            }) => Ok(Vec::new()),
            Err(e) => Err(e),
        }
    }

    /// Like [`Coordinator::children`], with a watch on the set of children. `rel` is
    /// created (persistent, empty) when missing, so the watch always has a node.
    pub async fn children_watched(&self, rel: &str) -> Result<(Vec<String>, Watch), ZkError> {
        let path = self.path(rel);
        loop {
            let session = self.session();
            let (tx, fired) = oneshot::channel();
            match self
                .call(
                    Op::Children,
                    &path,
                    self.zk().get_children_w(&path, move |e| {
                        let _ = tx.send(e);
                    }),
                )
                .await
            {
                Ok(mut names) => {
                    names.sort();
                    return Ok((names, Watch { session, fired }));
                }
                Err(ZkError::Zk {
                    source: ZkCode::NoNode,
                    ..
                }) => self.ensure_persistent(&path).await?,
                Err(e) => return Err(e),
            }
        }
    }

    /// Writes `data` at `rel` as a persistent node, creating missing parents. Returns the
    /// node's new version.
    pub async fn put(&self, rel: &str, data: &[u8], expect: Expect) -> Result<i32, ZkError> {
        let path = self.path(rel);
        loop {
            if expect != Expect::Absent {
                let version = match expect {
                    Expect::Version(v) => Some(v),
                    _ => None,
                };
                match self
                    .call(
                        Op::Set,
                        &path,
                        self.zk().set_data(&path, data.to_vec(), version),
                    )
                    .await
                {
                    Ok(stat) => return Ok(stat.version),
                    Err(ZkError::Zk {
                        source: ZkCode::NoNode,
                        ..
                    }) if expect == Expect::Any => {}
                    Err(e) => return Err(e),
                }
            }
            match self.create(&path, data, CreateMode::Persistent).await {
                Ok(()) => return Ok(0),
                // Created by someone else between our set and create: set again.
                Err(ZkError::Zk {
                    source: ZkCode::NodeExists,
                    ..
                }) if expect == Expect::Any => {}
                Err(e) => return Err(e),
            }
        }
    }

    /// Deletes the node at `rel` (at `version`, when given). A missing node is not an
    /// error. Children are deleted first when `recursive`.
    pub async fn delete(
        &self,
        rel: &str,
        version: Option<i32>,
        recursive: bool,
    ) -> Result<(), ZkError> {
        if recursive {
            for child in self.children(rel).await? {
                Box::pin(self.delete(
                    &format!("{}/{child}", rel.trim_end_matches('/')),
                    None,
                    true,
                ))
                .await?;
            }
        }
        let path = self.path(rel);
        match self
            .call(Op::Delete, &path, self.zk().delete(&path, version))
            .await
        {
            Ok(())
            | Err(ZkError::Zk {
                source: ZkCode::NoNode,
                ..
            }) => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// Creates the ephemeral node `rel` holding `data`, owned by this session: it goes
    /// when the session does. A node this session already owns is updated. While another
    /// session owns it (this identity's previous process, until its session expires),
    /// waits for it to go, or until `cancel`.
    pub async fn register(
        &self,
        rel: &str,
        data: &[u8],
        cancel: &CancellationToken,
    ) -> Result<(), ZkError> {
        let path = self.path(rel);
        let mut warned = false;
        loop {
            if self.claim(rel, data).await? {
                return Ok(());
            }
            match self.get_watched(rel).await? {
                (Some(node), _) if node.ephemeral_owner == self.session_id() => {
                    self.put(rel, data, Expect::Version(node.version)).await?;
                    return Ok(());
                }
                (Some(node), watch) => {
                    if !warned {
                        tracing::warn!(
                            path,
                            owner = %format_args!("{:#x}", node.ephemeral_owner),
                            "registered by another session (a previous process of this id, or a duplicate id); waiting for it to go"
                        );
                        warned = true;
                    }
                    watch.changed(self, cancel).await?;
                }
                (None, _) => {}
            }
        }
    }

    /// Claims `rel` for this session: creates it ephemeral, holding `data`. `false` when
    /// it exists already (someone else's claim, or this session's own).
    pub async fn claim(&self, rel: &str, data: &[u8]) -> Result<bool, ZkError> {
        let path = self.path(rel);
        match self.create(&path, data, CreateMode::Ephemeral).await {
            Ok(()) => Ok(true),
            Err(ZkError::Zk {
                source: ZkCode::NodeExists,
                ..
            }) => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Creates `path` holding `data`; its missing parents first when the create finds
    /// one missing, so that a node created under parents that exist (the usual case) is
    /// one write.
    pub(crate) async fn create(
        &self,
        path: &str,
        data: &[u8],
        mode: CreateMode,
    ) -> Result<(), ZkError> {
        let create = || {
            let request = self.zk().create(path, data.to_vec(), self.acl(), mode);
            self.call(Op::Create, path, request)
        };
        match create().await {
            Err(ZkError::Zk {
                source: ZkCode::NoNode,
                ..
            }) => {
                self.ensure_parent(path).await?;
                create().await.map(drop)
            }
            created => created.map(drop),
        }
    }

    async fn ensure_parent(&self, path: &str) -> Result<(), ZkError> {
        match path
            .rsplit_once('/')
            .map(|(p, _)| p)
            .filter(|p| !p.is_empty())
        {
            Some(parent) => self.ensure_persistent(parent).await,
            None => Ok(()),
        }
    }
}
