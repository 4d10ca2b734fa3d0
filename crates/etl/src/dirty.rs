//! Which documents a batch dirtied: a change of any table in a pipeline's tree marks the
//! documents that contain the row — the root row's own document (its key before and after
//! the change), or for a related row the documents its join columns lead up to (walked up
//! when the batch is read back, see the docs module), each with the newest change that
//! reached it and the parts it reached; changes of `delayed` relations are set aside for
//! the delayed job instead.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

use serde_json::Value as Json;
use sluice_model::delayed::{DelayedChange, DELAYED_VERSION};
use sluice_model::{ChangeEvent, Op};
use sluice_mysql::docs::{DocPlan, Floor};

/// What dirtied a document: the version of the newest change, and every message that
/// dirtied it (each is dead-lettered if the document cannot be made).
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Prov {
    /// The newest changes among them, which a read of the document must see.
    pub(crate) floor: Floor,
    pub(crate) msgs: BTreeSet<usize>,
}

impl Prov {
    pub(crate) fn of(event: &ChangeEvent, msg: usize) -> Self {
        let mut floor = Floor::default();
        floor.add(event.version, event.source.gtid.as_deref());
        Prov {
            floor,
            msgs: BTreeSet::from([msg]),
        }
    }

    pub(crate) fn empty() -> Self {
        Prov {
            floor: Floor::default(),
            msgs: BTreeSet::new(),
        }
    }

    pub(crate) fn version(&self) -> u64 {
        self.floor.version
    }

    pub(crate) fn merge(&mut self, other: &Prov) {
        self.floor.merge(&other.floor);
        self.msgs.extend(&other.msgs);
    }
}

/// Where to walk up from: a plan, the path of a node in it, which of its columns, and
/// which part (relation under the root) the changed rows are in.
type From = (usize, Vec<usize>, Vec<usize>, usize);

/// The documents a batch dirtied, by pipeline: one piece of work per compilation of the
/// pipeline the batch saw (its tables' columns changed in the middle of it: what was
/// marked before is read with the plans it was marked with).
#[derive(Default)]
pub(crate) struct Dirty {
    pub(crate) pipelines: BTreeMap<usize, Vec<Work>>,
    /// Changes of `delayed` relations, for the delayed job instead: by pipeline, node and
    /// join values (the same row changed twice in a batch is one change).
    delayed: Delayed,
}

pub(crate) struct Work {
    pub(crate) plans: Arc<Vec<DocPlan>>,
    /// By plan: each document's key (as text) → what dirtied it.
    pub(crate) docs: BTreeMap<usize, HashMap<String, Entry>>,
    /// Rows whose documents are found by walking up: by plan, the path (from the root)
    /// of the node to look in, which of its columns the values are of (relations of one
    /// parent join it on different columns), and the part they change.
    pub(crate) lookups: BTreeMap<From, Vec<(Vec<Json>, Prov)>>,
}

#[derive(Clone)]
pub(crate) struct Entry {
    pub(crate) key: Vec<Json>,
    pub(crate) prov: Prov,
    /// Routings the document had in the changes' images (a child document that moved
    /// parent must go from the old one's shard).
    pub(crate) routings: BTreeSet<String>,
    /// Its root row changed (the version of the newest such change): the document is
    /// read whole.
    pub(crate) root: Option<u64>,
    /// Likely new: its root row was inserted, or a patch found no document. Written in
    /// parts, it is sent as a `create` first (`sluice_elastic::parts`).
    pub(crate) fresh: bool,
    /// The parts (indexes of the root's relations) changes below them reached, each with
    /// the version of the newest: alone, they are what is read, when the pipeline's
    /// documents are written in parts.
    pub(crate) parts: BTreeMap<usize, u64>,
}

impl Dirty {
    pub fn is_empty(&self) -> bool {
        self.pipelines.is_empty() && self.delayed.is_empty()
    }

    /// The changes of `delayed` relations the batch held, each with the version of its
    /// newest event (`name` gives a pipeline's name).
    pub fn take_delayed(&mut self, name: impl Fn(usize) -> String) -> Vec<DelayedChange> {
        std::mem::take(&mut self.delayed)
            .into_iter()
            .map(|((p, _, _), (mut change, _))| {
                change.pipeline = name(p);
                change
            })
            .collect()
    }

    /// Marks what `event` (message `msg`) changes in the documents of pipeline
    /// `pipeline`, compiled as `plans`.
    pub fn touch(
        &mut self,
        pipeline: usize,
        plans: &Arc<Vec<DocPlan>>,
        event: &ChangeEvent,
        msg: usize,
    ) {
        let works = self.pipelines.entry(pipeline).or_default();
        if works.last().is_none_or(|w| !Arc::ptr_eq(&w.plans, plans)) {
            works.push(Work {
                plans: plans.clone(),
                docs: BTreeMap::new(),
                lookups: BTreeMap::new(),
            });
        }
        let work = works.last_mut().expect("just made sure");
        for (k, plan) in plans.iter().enumerate() {
            for path in plan.paths_of(&event.db, &event.table) {
                let node = plan.node(path);
                for image in [&event.before, &event.after].into_iter().flatten() {
                    let image = &*DocPlan::event_image(node, &event.db, &event.table, image);
                    match &node.link {
                        None => {
                            let Some(key) = DocPlan::image_values(node, &plan.id, image) else {
                                continue;
                            };
                            let entry = work.entry(k, key, &Prov::of(event, msg));
                            entry.routings.extend(plan.routing_of(image));
                            entry.root = entry.root.max(Some(event.version));
                            entry.fresh |= event.op == Op::Create;
                        }
                        Some(link) => {
                            let Some(values) = DocPlan::image_values(node, &link.child, image)
                            else {
                                continue;
                            };
                            if node.delayed {
                                let d = &mut self.delayed;
                                delay(d, pipeline, plan, path, values, event.version);
                                continue;
                            }
                            let parent = path[..path.len() - 1].to_vec();
                            work.lookups
                                .entry((k, parent, link.parent.clone(), path[0]))
                                .or_default()
                                .push((values, Prov::of(event, msg)));
                        }
                    }
                }
            }
        }
    }
}

/// Each with the version of the event folded last (an update's two images are one change).
type Delayed = BTreeMap<(usize, String, String), (DelayedChange, u64)>;

/// Notes a change of a `delayed` node (at `path`) for the delayed job.
fn delay(
    delayed: &mut Delayed,
    pipeline: usize,
    plan: &DocPlan,
    path: &[usize],
    values: Vec<Json>,
    version: u64,
) {
    let change = DelayedChange {
        v: DELAYED_VERSION,
        pipeline: String::new(),
        kind: plan.name.clone(),
        node: plan.path_names(path),
        values,
        version,
        changes: 1,
    };
    let key = (pipeline, change.node_key(), change.values_text());
    match delayed.entry(key) {
        std::collections::btree_map::Entry::Vacant(v) => {
            v.insert((change, version));
        }
        std::collections::btree_map::Entry::Occupied(mut o) => {
            let (had, last) = o.get_mut();
            if *last != version {
                had.version = had.version.max(version);
                had.changes += 1;
                *last = version;
            }
        }
    }
}

impl Work {
    pub(crate) fn entry(&mut self, plan: usize, key: Vec<Json>, prov: &Prov) -> &mut Entry {
        let text = serde_json::to_string(&key).expect("JSON values serialize");
        let e = self
            .docs
            .entry(plan)
            .or_default()
            .entry(text)
            .or_insert_with(|| Entry {
                key,
                prov: Prov::empty(),
                routings: BTreeSet::new(),
                root: None,
                fresh: false,
                parts: BTreeMap::new(),
            });
        e.prov.merge(prov);
        e
    }
}

impl Work {
    /// Every message that dirtied something here.
    pub(crate) fn messages(&self) -> BTreeSet<usize> {
        let docs = self
            .docs
            .values()
            .flat_map(|d| d.values().flat_map(|e| e.prov.msgs.iter().copied()));
        let lookups = self
            .lookups
            .values()
            .flat_map(|l| l.iter().flat_map(|(_, p)| p.msgs.iter().copied()));
        docs.chain(lookups).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use serde_json::Value;
    use sluice_mysql::SnapshotTable;

    fn shop() -> Vec<DocPlan> {
        let spec: sluice_model::PipelineSpec = serde_json::from_value(json!({
            "source": "s", "database": "d", "table": "products",
            "relations": [
                {"name": "brand", "kind": "one_to_one", "table": "brands", "on": {"brand_id": "id"}},
                {"name": "tags", "kind": "one_to_many", "table": "tags", "on": {"id": "product_id"}}
            ]
        }))
        .unwrap();
        let int = ("", "int", "int");
        let table = |name: &str, cols: &[&str]| {
            let cols: Vec<(&str, &str, &str)> = cols.iter().map(|c| (*c, int.1, int.2)).collect();
            (
                ("d".to_owned(), name.to_owned()),
                SnapshotTable::from_columns("d", name, &cols, &["id"]),
            )
        };
        let tables = [
            table("products", &["id", "brand_id"]),
            table("brands", &["id"]),
            table("tags", &["id", "product_id"]),
        ]
        .into_iter()
        .collect();
        sluice_mysql::docs::compile(&spec, &tables).unwrap()
    }

    fn event(table: &str, row: Value, version: u64) -> ChangeEvent {
        serde_json::from_value(json!({
            "v": 1,
            "source": {"instance": "s", "server_id": 1, "file": "b.000001", "pos": 4, "row": 0, "ts_ms": 0},
            "db": "d", "table": table, "op": "c", "key": {"id": row["id"]},
            "after": row, "columns": [], "version": version
        }))
        .unwrap()
    }

    #[test]
    fn relations_of_one_parent_walk_up_by_their_own_join_columns() {
        let plans = Arc::new(shop());
        let mut dirty = Dirty::default();
        // A tag of product 5 first, then brand 2: the brand's id is a brand_id, not a
        // product id, whatever came first in the batch.
        dirty.touch(
            0,
            &plans,
            &event("tags", json!({"id": 70, "product_id": 5}), 10),
            0,
        );
        dirty.touch(0, &plans, &event("brands", json!({"id": 2}), 20), 1);
        dirty.touch(
            0,
            &plans,
            &event("products", json!({"id": 9, "brand_id": 2}), 30),
            2,
        );
        let work = &dirty.pipelines[&0][0];
        let names = |cols: &[usize]| plans[0].root.names(cols);
        let lookups: Vec<(Vec<String>, Vec<Value>)> = work
            .lookups
            .iter()
            .map(|((_, path, cols, _), values)| {
                assert!(path.is_empty(), "both walk up to the root");
                (
                    names(cols),
                    values.iter().map(|(v, _)| v[0].clone()).collect(),
                )
            })
            .collect();
        assert_eq!(
            lookups,
            [
                (vec!["id".to_owned()], vec![json!(5)]),
                (vec!["brand_id".to_owned()], vec![json!(2)]),
            ]
        );
        let roots: Vec<(&Vec<Value>, &Prov)> =
            work.docs[&0].values().map(|e| (&e.key, &e.prov)).collect();
        assert_eq!(
            roots,
            [(
                &vec![json!(9)],
                &Prov {
                    floor: Floor {
                        version: 30,
                        ..Floor::default()
                    },
                    msgs: BTreeSet::from([2])
                }
            )],
            "a root row is its own document"
        );
    }

    #[test]
    fn a_delayed_relation_is_handed_over_not_walked_up() {
        let mut plans = shop();
        plans[0].root.children[0].delayed = true; // brand
        let plans = Arc::new(plans);
        let mut dirty = Dirty::default();
        dirty.touch(0, &plans, &event("brands", json!({"id": 2}), 20), 0);
        // An update: its two images are one change.
        let mut update = event("brands", json!({"id": 2}), 25);
        update.before = update.after.clone();
        dirty.touch(0, &plans, &update, 1);
        dirty.touch(
            0,
            &plans,
            &event("tags", json!({"id": 70, "product_id": 5}), 30),
            2,
        );
        assert!(!dirty.is_empty());
        let work = &dirty.pipelines[&0][0];
        assert_eq!(work.lookups.len(), 1, "only the tag walks up");
        let delayed = dirty.take_delayed(|_| "shop".into());
        assert_eq!(
            delayed,
            [DelayedChange {
                v: DELAYED_VERSION,
                pipeline: "shop".into(),
                kind: "products".into(),
                node: vec!["brand".into()],
                values: vec![json!(2)],
                version: 25,
                changes: 2,
            }],
            "one change per row, with its newest version"
        );
        assert_eq!(delayed[0].node_key(), "products/brand");
    }

    #[test]
    fn marks_made_under_another_compilation_keep_their_own_plans() {
        // The tables changed in the middle of a batch: the plans were compiled again.
        let (before, after) = (Arc::new(shop()), Arc::new(shop()));
        let mut dirty = Dirty::default();
        dirty.touch(0, &before, &event("brands", json!({"id": 2}), 20), 0);
        dirty.touch(0, &after, &event("brands", json!({"id": 3}), 30), 1);
        dirty.touch(0, &after, &event("brands", json!({"id": 4}), 40), 2);
        let works = &dirty.pipelines[&0];
        assert_eq!(works.len(), 2);
        assert!(Arc::ptr_eq(&works[0].plans, &before) && Arc::ptr_eq(&works[1].plans, &after));
        assert_eq!(works[0].messages(), BTreeSet::from([0]));
        assert_eq!(works[1].messages(), BTreeSet::from([1, 2]));
    }
}
