//! A directory read through watches: its children and, for most, each child's node,
//! kept in memory between looks and read again only where a watch fired. A reader that
//! looks at a large directory often (the center leader's pass, at every change and every
//! resync) so reads what changed since its last look, not the whole directory.
//!
//! ZooKeeper sends a watch's news before the answer of any later read showing the change,
//! so a look after the news reads the change; a look racing a change may miss it, as a
//! fresh read racing the same change would. A watch lives on one connection (the client
//! library does not restore watches after a reconnect): after a reconnect, or in another
//! session, everything is read again.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};

use futures::{StreamExt as _, TryStreamExt as _};
use serde::de::DeserializeOwned;

use crate::coordinator::Coordinator;
use crate::error::{ZkCode, ZkError};
use crate::nodes::Node;
use crate::requests::Op;

/// A child of a cached directory: its node, and its data read as the cache's record.
#[derive(Debug, Clone, PartialEq)]
pub struct Cached<T> {
    pub node: Node,
    /// The data as a `T`, or why it is not one.
    pub record: Result<T, String>,
}

/// The directory `dir` below the root as last looked at (see [`Coordinator::refresh`]).
pub struct DirCache<T> {
    dir: String,
    /// Whether the children's nodes are read, or only their names.
    with_nodes: bool,
    /// The session and connection of the watches behind what is held; `None` before the
    /// first look and after one that failed (everything is read again).
    read_in: Option<(i64, u64)>,
    names: BTreeSet<String>,
    nodes: BTreeMap<String, Cached<T>>,
    /// What the watches' news says must be read again, set from the client library's
    /// event task.
    stale: Arc<Mutex<Stale>>,
    /// Requests its looks sent: lists and node reads.
    reads: u64,
}

/// Node reads a look has under way at once. A session's requests are answered in order,
/// the heartbeat's among them: hundreds at once would hold it back past its lease.
const READS_AT_ONCE: usize = 32;

#[derive(Debug, Default)]
struct Stale {
    names: bool,
    nodes: BTreeSet<String>,
}

impl<T> DirCache<T> {
    /// The children of `dir` and their nodes, each read as a `T` (JSON).
    pub fn new(dir: &str) -> Self {
        DirCache::with(dir, true)
    }

    /// The names of `dir`'s children alone.
    pub fn names_only(dir: &str) -> Self {
        DirCache::with(dir, false)
    }

    fn with(dir: &str, with_nodes: bool) -> Self {
        DirCache {
            dir: dir.trim_matches('/').to_owned(),
            with_nodes,
            read_in: None,
            names: BTreeSet::new(),
            nodes: BTreeMap::new(),
            stale: Arc::default(),
            reads: 0,
        }
    }

    pub fn dir(&self) -> &str {
        &self.dir
    }

    /// The children's names, as of the last look.
    pub fn names(&self) -> &BTreeSet<String> {
        &self.names
    }

    /// The children's nodes by name, as of the last look (none for `names_only`).
    pub fn nodes(&self) -> &BTreeMap<String, Cached<T>> {
        &self.nodes
    }

    /// How many requests its looks sent so far (lists and node reads).
    pub fn reads(&self) -> u64 {
        self.reads
    }

    /// Reads child `name` (and the list) again at the next look: after a write of one's
    /// own, whose watch news may reach this process after the write's answer.
    pub fn forget(&mut self, name: &str) {
        let mut stale = self.stale.lock().unwrap_or_else(|e| e.into_inner());
        stale.names = true;
        stale.nodes.insert(name.to_owned());
    }

    /// Makes everything stale: the next look reads it all (after writes of one's own too
    /// many or too scattered to name).
    pub fn forget_all(&mut self) {
        self.read_in = None;
    }

    /// What must be read again at this look, in session and connection `here`: the
    /// watches' news taken, or everything when the watches behind what is held are gone.
    fn take_stale(&mut self, here: (i64, u64)) -> Stale {
        let mut stale = std::mem::take(&mut *self.stale.lock().unwrap_or_else(|e| e.into_inner()));
        if self.read_in != Some(here) {
            self.names.clear();
            self.nodes.clear();
            stale.names = true;
        }
        stale
    }

    /// The children to read at this look: new ones, and those whose watch fired.
    fn to_read(&self, stale: &Stale) -> Vec<String> {
        if !self.with_nodes {
            return Vec::new();
        }
        self.names
            .iter()
            .filter(|n| stale.nodes.contains(*n) || !self.nodes.contains_key(*n))
            .cloned()
            .collect()
    }
}

impl Coordinator {
    /// Brings `cache` up to date: lists the directory again if its children changed, and
    /// reads (at once, each with a watch) the children that are new or whose watch fired.
    /// After a failure the next look reads everything.
    pub async fn refresh<T: DeserializeOwned>(
        &self,
        cache: &mut DirCache<T>,
    ) -> Result<(), ZkError> {
        let here = (self.session_id(), self.connection());
        let stale = cache.take_stale(here);
        cache.read_in = None;
        if stale.names {
            cache.reads += 1;
            let names = self.names_watched(&cache.dir, &cache.stale).await?;
            cache.names = names.into_iter().collect();
            let names = &cache.names;
            cache.nodes.retain(|n, _| names.contains(n));
        }
        let wanted = cache.to_read(&stale);
        cache.reads += wanted.len() as u64;
        let reads = (wanted.iter()).map(|name| self.node_watched(&cache.dir, name, &cache.stale));
        let read: Vec<Option<Node>> = futures::stream::iter(reads)
            .buffered(READS_AT_ONCE)
            .try_collect()
            .await?;
        for (name, node) in wanted.into_iter().zip(read) {
            match node {
                Some(node) => {
                    let record = serde_json::from_slice(&node.data).map_err(|e| e.to_string());
                    cache.nodes.insert(name, Cached { node, record });
                }
                // Gone: the list's watch fired too.
                None => {
                    cache.nodes.remove(&name);
                }
            }
        }
        cache.read_in = Some(here);
        Ok(())
    }

    /// The children of `dir`, with a watch that marks the list stale; none when `dir` does
    /// not exist, with a watch on its creation instead (a list that fails leaves no watch).
    async fn names_watched(
        &self,
        dir: &str,
        stale: &Arc<Mutex<Stale>>,
    ) -> Result<Vec<String>, ZkError> {
        let path = self.path(dir);
        let marks = |stale: &Arc<Mutex<Stale>>| {
            let stale = Arc::clone(stale);
            move |_| stale.lock().unwrap_or_else(|e| e.into_inner()).names = true
        };
        match self
            .call(
                Op::Children,
                &path,
                self.zk().get_children_w(&path, marks(stale)),
            )
            .await
        {
            Ok(names) => return Ok(names),
            Err(ZkError::Zk {
                source: ZkCode::NoNode,
                ..
            }) => {}
            Err(e) => return Err(e),
        }
        let exists = self
            .call(Op::Exists, &path, self.zk().exists_w(&path, marks(stale)))
            .await?;
        if exists.is_some() {
            // Created between the two requests: listed at the next look.
            stale.lock().unwrap_or_else(|e| e.into_inner()).names = true;
        }
        Ok(Vec::new())
    }

    /// Child `name` of `dir`, with a watch that marks it stale; `None` when it is gone.
    async fn node_watched(
        &self,
        dir: &str,
        name: &str,
        stale: &Arc<Mutex<Stale>>,
    ) -> Result<Option<Node>, ZkError> {
        let path = self.path(&format!("{dir}/{name}"));
        let (stale, name) = (Arc::clone(stale), name.to_owned());
        let watch = move |_| {
            let mut stale = stale.lock().unwrap_or_else(|e| e.into_inner());
            stale.nodes.insert(name);
        };
        match self
            .call(Op::Get, &path, self.zk().get_data_w(&path, watch))
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
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(data: &str) -> Cached<u64> {
        Cached {
            node: Node {
                data: data.as_bytes().to_vec(),
                version: 0,
                ephemeral_owner: 0,
                created_zxid: 1,
            },
            record: data.parse().map_err(|_| "not a number".to_owned()),
        }
    }

    #[test]
    fn a_look_reads_what_is_new_or_whose_watch_fired_and_everything_in_another_connection() {
        let mut cache: DirCache<u64> = DirCache::new("d");
        let here = (7, 1);
        let stale = cache.take_stale(here);
        assert!(stale.names, "a first look lists the directory");
        cache.names = ["a", "b", "c"].map(String::from).into();
        assert_eq!(cache.to_read(&stale), ["a", "b", "c"], "all new");
        for n in ["a", "b", "c"] {
            cache.nodes.insert(n.into(), node("1"));
        }
        cache.read_in = Some(here);

        let stale = cache.take_stale(here);
        assert!(
            !stale.names && cache.to_read(&stale).is_empty(),
            "nothing fired: nothing read"
        );

        cache.stale.lock().unwrap().nodes.insert("b".into());
        let stale = cache.take_stale(here);
        assert!(!stale.names);
        assert_eq!(cache.to_read(&stale), ["b"], "only what fired");

        cache.forget("c");
        let stale = cache.take_stale(here);
        assert!(stale.names, "a write of one's own lists again");
        assert_eq!(cache.to_read(&stale), ["c"]);

        let stale = cache.take_stale((7, 2));
        assert!(stale.names, "a reconnect lost every watch");
        assert!(cache.names.is_empty() && cache.nodes.is_empty());
    }

    #[test]
    fn a_names_only_cache_reads_no_node() {
        let mut cache: DirCache<()> = DirCache::names_only("d");
        let stale = cache.take_stale((1, 1));
        cache.names = ["w1"].map(String::from).into();
        assert!(cache.to_read(&stale).is_empty());
    }
}
