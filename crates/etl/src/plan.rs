//! A batch planned in three steps, the I/O in the middle one only:
//!
//! 1. [`route`] decodes each message and finds its pipelines (what cannot be decoded is
//!    dead-lettered);
//! 2. [`prepare`] makes ready what the plan will need: each pipeline a message reaches
//!    gets its index and mapping (and a pipeline read back from MySQL its compiled
//!    documents, again when an event shows its table changed), and the index versions of
//!    each pipeline a DDL event concerns are read;
//! 3. [`plan`] turns the routed messages into the batch's writes: flat pipelines'
//!    operations (the newest version of each document), the documents dirtied in
//!    pipelines read back from MySQL, the dead letters, and what DDL changed without row
//!    events. It is a function of the router and what was prepared.

use std::collections::HashMap;
use std::sync::Arc;

use sluice_elastic::{BulkOp, EsClient};
use sluice_model::{BuildDocument, ChangeEvent, DdlEvent, RetryPolicy};
use sluice_mysql::docs::DocPlan;
use tokio_util::sync::CancellationToken;

use crate::batch::{DeadLetter, Msg};
use crate::error::{Context as _, Result};
use crate::pipeline::{NotReady, Router};
use crate::{ddl, dirty, docs, write};

/// Batches as what to write: flat pipelines' operations — the newest version of each
/// document (older ones would only be answered 409), each with the message it came
/// from —, the documents they dirtied in pipelines read back from MySQL, the messages
/// that cannot become anything, and the pipelines whose documents DDL changed without
/// row events. Several batches may be planned into one (see `land::Held`).
#[derive(Default)]
pub(crate) struct Plan {
    latest: HashMap<(String, String), (BulkOp, usize)>,
    pub dirty: dirty::Dirty,
    pub dead: Vec<DeadLetter>,
    pub rewritten: Vec<ddl::Rewritten>,
}

impl Plan {
    /// The flat pipelines' writes, each with the message it came from; taken.
    pub fn take_writes(&mut self) -> (Vec<BulkOp>, Vec<write::Origin>) {
        std::mem::take(&mut self.latest)
            .into_values()
            .map(|(op, msg)| (op, write::Origin::One(msg)))
            .unzip()
    }
}

/// A message of the batch, decoded, with the pipelines it reaches. Row changes, the
/// largest variant, are nearly every message: boxing them would allocate once per
/// message for nothing (a batch's worth is held at a time).
#[allow(clippy::large_enum_variant)]
pub(crate) enum Routed {
    /// DDL of a source, for the pipelines of that source.
    Ddl {
        pipelines: Arc<[usize]>,
        event: DdlEvent,
    },
    /// A document of a build (or a repair) of one pipeline.
    Build { pipeline: usize, doc: BuildDocument },
    /// A row change, for the pipelines of its table.
    Change {
        pipelines: Arc<[usize]>,
        event: ChangeEvent,
    },
}

/// Each message of `batch` decoded and routed, with its place (counted from `base`: the
/// messages held before it). Build markers and changes no pipeline takes are left out;
/// what cannot be decoded goes to `dead`.
pub(crate) fn route(
    router: &Router,
    batch: &[Msg],
    base: usize,
    dead: &mut Vec<DeadLetter>,
) -> Vec<(usize, Routed)> {
    let mut out = Vec::with_capacity(batch.len());
    for (i, msg) in batch.iter().enumerate() {
        let i = base + i;
        if msg.marker.is_some() {
            continue;
        }
        if let Some(pipelines) = router.schema_of(&msg.topic) {
            if let Some(event) = decode::<DdlEvent>(msg, i, "DDL event", None, dead) {
                out.push((i, Routed::Ddl { pipelines, event }));
            }
            continue;
        }
        if let Some(p) = router.build_of(&msg.topic) {
            let name = Some(router.pipelines[p].cfg.spec.name.clone());
            if let Some(doc) = decode::<BuildDocument>(msg, i, "build document", name, dead) {
                out.push((i, Routed::Build { pipeline: p, doc }));
            }
            continue;
        }
        let event = if router.is_debezium(&msg.topic) {
            match sluice_kafka::debezium::change_event(msg.key.as_deref(), &msg.payload) {
                Ok(Some(event)) => event,
                // A tombstone: its delete came before it.
                Ok(None) => continue,
                Err(why) => {
                    dead.push(DeadLetter {
                        msg: i,
                        reason: format!("not a Debezium change event: {why}"),
                        pipeline: None,
                        index: None,
                    });
                    continue;
                }
            }
        } else {
            let Some(event) = decode::<ChangeEvent>(msg, i, "change event", None, dead) else {
                continue;
            };
            event
        };
        let pipelines = router.pipelines_for(&msg.topic, &event);
        if !pipelines.is_empty() {
            out.push((i, Routed::Change { pipelines, event }));
        }
    }
    out
}

/// A pipeline read back from MySQL as it stood for one message: its compiled documents
/// (a table changed within the batch compiles them again), or why it has none.
type Compiled = std::result::Result<Arc<Vec<DocPlan>>, String>;

/// What [`plan`] needs from the world, read by [`prepare`].
#[derive(Default)]
pub(crate) struct Prepared {
    /// Per message and pipeline read back from MySQL.
    trees: HashMap<(usize, usize), Compiled>,
    /// Per pipeline a DDL event of the batch concerns: the index versions it writes to.
    versions: HashMap<usize, Vec<u32>>,
}

impl Prepared {
    /// What a test (or a batch that reached no tree) knows: `trees` as given.
    #[cfg(test)]
    fn with(
        trees: impl IntoIterator<Item = ((usize, usize), Compiled)>,
        versions: impl IntoIterator<Item = (usize, Vec<u32>)>,
    ) -> Self {
        Prepared {
            trees: trees.into_iter().collect(),
            versions: versions.into_iter().collect(),
        }
    }
}

/// Makes every pipeline `routed` reaches ready for it, in the batch's order, retrying
/// while Elasticsearch or a source is unavailable, and reads the index versions of the
/// pipelines its DDL concerns. `None` when shutdown came first.
pub(crate) async fn prepare(
    router: &mut Router,
    es: &EsClient,
    retry: RetryPolicy,
    routed: &[(usize, Routed)],
    shutdown: &CancellationToken,
) -> Result<Option<Prepared>> {
    let mut prepared = Prepared::default();
    for (i, r) in routed {
        match r {
            Routed::Ddl { pipelines, event } => {
                for (p, _) in ddl::concerned(router, pipelines, event) {
                    if prepared.versions.contains_key(&p) {
                        continue;
                    }
                    let Some(v) = ddl::versions(router, es, p, retry, shutdown).await? else {
                        return Ok(None);
                    };
                    prepared.versions.insert(p, v);
                }
            }
            Routed::Build { pipeline, doc } => {
                let input = Input::Build(doc);
                if !ready(router, es, retry, *pipeline, input, shutdown).await? {
                    return Ok(None);
                }
            }
            Routed::Change { pipelines, event } => {
                for &p in pipelines.iter() {
                    let input = Input::Change(event);
                    if !ready(router, es, retry, p, input, shutdown).await? {
                        return Ok(None);
                    }
                    let pipeline = &router.pipelines[p];
                    if pipeline.is_tree() {
                        let plans = pipeline
                            .plans()
                            .ok_or_else(|| pipeline.unfit().unwrap_or("not ready").to_owned());
                        prepared.trees.insert((*i, p), plans);
                    }
                }
            }
        }
    }
    Ok(Some(prepared))
}

/// The batch's writes, from its routed messages and what was prepared for them, added to
/// `into` (which holds what routing found undecodable already, and what batches planned
/// before it into the same writes left).
pub(crate) fn plan(
    router: &Router,
    routed: Vec<(usize, Routed)>,
    prepared: &Prepared,
    into: &mut Plan,
) {
    let Plan {
        latest,
        dirty,
        dead,
        rewritten,
    } = into;
    let mut ops = Vec::new();
    for (i, r) in routed {
        match r {
            Routed::Ddl { pipelines, event } => {
                let concerned = ddl::concerned(router, &pipelines, &event);
                rewritten.extend(ddl::rewritten(
                    router,
                    &event,
                    concerned,
                    &prepared.versions,
                ));
            }
            Routed::Build { pipeline, doc } => {
                for op in router.build_ops(pipeline, doc) {
                    newest(latest, op, i);
                }
            }
            Routed::Change { pipelines, event } => {
                for &p in pipelines.iter() {
                    let pipeline = &router.pipelines[p];
                    let name = &pipeline.cfg.spec.name;
                    if pipeline.is_tree() {
                        match prepared.trees.get(&(i, p)) {
                            Some(Ok(plans)) => dirty.touch(p, plans, &event, i),
                            Some(Err(why)) => docs::unreadable(dead, name, [i], why),
                            None => docs::unreadable(dead, name, [i], "not ready"),
                        }
                        continue;
                    }
                    for index in router.targets(p) {
                        if let Err(reason) = router.flat_ops(p, index, &event, &mut ops) {
                            dead.push(DeadLetter {
                                msg: i,
                                reason,
                                pipeline: Some(name.clone()),
                                index: None,
                            });
                        }
                        for op in ops.drain(..) {
                            newest(latest, op, i);
                        }
                    }
                }
            }
        }
    }
}

/// Message `i` read as a `what`; when it is not one, it is dead-lettered with why.
fn decode<T: serde::de::DeserializeOwned>(
    msg: &Msg,
    i: usize,
    what: &str,
    pipeline: Option<String>,
    dead: &mut Vec<DeadLetter>,
) -> Option<T> {
    serde_json::from_slice(&msg.payload)
        .map_err(|e| {
            dead.push(DeadLetter {
                msg: i,
                reason: format!("not a Sluice {what}: {e}"),
                pipeline,
                index: None,
            })
        })
        .ok()
}

/// Keeps `op` (from message `msg`) unless the batch has a newer write of its document.
fn newest(latest: &mut HashMap<(String, String), (BulkOp, usize)>, op: BulkOp, msg: usize) {
    let key = (op.index().to_owned(), op.id().to_owned());
    if latest
        .get(&key)
        .is_none_or(|(old, _)| old.version() < op.version())
    {
        latest.insert(key, (op, msg));
    }
}

/// What a pipeline is made ready for.
#[derive(Clone, Copy)]
enum Input<'a> {
    Change(&'a ChangeEvent),
    Build(&'a BuildDocument),
}

/// Makes pipeline `p` ready for `input`, retrying while Elasticsearch or its source is
/// unavailable; `false` when shutdown came first.
async fn ready(
    router: &mut Router,
    es: &EsClient,
    retry: RetryPolicy,
    p: usize,
    input: Input<'_>,
    shutdown: &CancellationToken,
) -> Result<bool> {
    let mut backoff = retry.backoff();
    loop {
        let prepared = match input {
            _ if router.pipelines[p].is_tree() => {
                let event = match input {
                    Input::Change(e) => Some(e),
                    Input::Build(_) => None,
                };
                router.ready_tree(es, p, event).await
            }
            Input::Change(event) => router
                .prepare(es, p, &event.columns)
                .await
                .map_err(NotReady::Index),
            Input::Build(doc) => match &doc.columns {
                Some(columns) => router
                    .prepare(es, p, columns)
                    .await
                    .map_err(NotReady::Index),
                None => Ok(()),
            },
        };
        match prepared {
            Ok(()) => return Ok(true),
            Err(e) if e.is_transient() => {
                let pause = backoff.next_pause();
                tracing::warn!(error = %e, retry_in = ?pause, "Elasticsearch or the source unavailable while preparing a pipeline; retrying");
                if !sluice_runtime::shutdown::pause(pause, shutdown).await {
                    return Ok(false);
                }
            }
            Err(e) => return Err(e).context("cannot prepare the pipeline's index"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{json, Value};
    use sluice_kafka::TopicConfig;
    use sluice_model::PipelineSpec;

    use crate::pipeline::Active;

    fn active(spec: PipelineSpec) -> Active {
        Active {
            spec,
            building: None,
            history: vec![],
            source: Err("not needed".into()),
        }
    }

    /// A router of `specs`, each flat one writing to `<name>_v1`.
    fn router(specs: Vec<PipelineSpec>) -> Router {
        let mut r = Router::new(
            &specs.into_iter().map(active).collect::<Vec<_>>(),
            &TopicConfig::default(),
            &[],
        );
        for p in r.pipelines.iter_mut() {
            p.targets = Some(vec![format!("{}_v1", p.cfg.spec.name)]);
        }
        r
    }

    fn msg(topic: String, payload: Value) -> Msg {
        Msg {
            topic,
            partition: 0,
            offset: 0,
            key: None,
            payload: serde_json::to_vec(&payload).unwrap(),
            marker: None,
        }
    }

    fn rows(table: &str) -> String {
        TopicConfig::default().rows_topic("s", "d", table)
    }

    fn change(table: &str, id: i64, version: u64) -> Value {
        json!({
            "v": 1,
            "source": {"instance": "s", "server_id": 1, "file": "b.000001", "pos": 4, "row": 0, "ts_ms": 0},
            "db": "d", "table": table, "op": "c", "key": {"id": id},
            "columns": [{"name": "id", "type": "int", "key": true}, {"name": "name", "type": "varchar"}],
            "after": {"id": id, "name": format!("n{version}")},
            "version": version
        })
    }

    fn planned(router: &Router, batch: &[Msg], prepared: &Prepared) -> Plan {
        let mut p = Plan::default();
        let routed = route(router, batch, 0, &mut p.dead);
        plan(router, routed, prepared, &mut p);
        p
    }

    /// `(index, id, version, message)` of each operation, sorted.
    fn writes(p: &mut Plan) -> Vec<(String, String, u64, usize)> {
        let (ops, origins) = p.take_writes();
        let mut out: Vec<_> = ops
            .iter()
            .zip(&origins)
            .map(|(op, origin)| {
                let write::Origin::One(m) = origin else {
                    panic!("one message per write")
                };
                (op.index().to_owned(), op.id().to_owned(), op.version(), *m)
            })
            .collect();
        out.sort();
        out
    }

    #[test]
    fn changes_go_to_their_tables_pipelines_and_the_newest_version_of_a_document_wins() {
        let r = router(vec![
            PipelineSpec::table("items", "s", "d", "items"),
            PipelineSpec::table("tags", "s", "d", "tags"),
        ]);
        let batch = [
            msg(rows("items"), change("items", 1, 5)),
            msg(rows("items"), change("items", 1, 9)),
            msg(rows("items"), change("items", 1, 7)),
            msg(rows("tags"), change("tags", 1, 3)),
            // A table no pipeline takes: nothing, and no dead letter.
            msg(rows("other"), change("other", 1, 4)),
        ];
        let mut p = planned(&r, &batch, &Prepared::default());
        assert_eq!(
            writes(&mut p),
            [
                ("items_v1".to_owned(), "1".to_owned(), 9, 1),
                ("tags_v1".to_owned(), "1".to_owned(), 3, 3),
            ],
            "one write per document, the newest, from the message that carried it"
        );
        assert!(p.dead.is_empty() && p.rewritten.is_empty() && p.dirty.is_empty());
    }

    #[test]
    fn batches_planned_into_one_keep_each_message_s_place_and_the_newest_write() {
        let r = router(vec![PipelineSpec::table("items", "s", "d", "items")]);
        let first = [
            msg(rows("items"), change("items", 1, 5)),
            msg(rows("items"), json!("not an event")),
        ];
        let second = [
            msg(rows("items"), change("items", 1, 9)),
            msg(rows("items"), change("items", 2, 3)),
        ];
        let mut p = Plan::default();
        for (base, batch) in [(0, &first[..]), (first.len(), &second[..])] {
            let routed = route(&r, batch, base, &mut p.dead);
            plan(&r, routed, &Prepared::default(), &mut p);
        }
        assert_eq!(
            writes(&mut p),
            [
                ("items_v1".to_owned(), "1".to_owned(), 9, 2),
                ("items_v1".to_owned(), "2".to_owned(), 3, 3),
            ],
            "the later batch's newer write wins, counted after the first batch's messages"
        );
        let dead: Vec<usize> = p.dead.iter().map(|d| d.msg).collect();
        assert_eq!(dead, [1]);
    }

    #[test]
    fn debezium_topics_are_read_in_debezium_s_format_and_what_is_not_a_change_is_dead_lettered() {
        let mut spec = PipelineSpec::table("items", "s", "d", "items");
        spec.input.format = sluice_model::pipeline::InputFormat::Debezium;
        spec.input.topic_prefix = "dbz".into();
        let r = router(vec![spec]);
        let topic = "dbz.d.items".to_owned();
        // Debezium names its connector, not the source: the topic says whose it is.
        let update = json!({
            "before": {"id": 7, "name": "a"}, "after": {"id": 7, "name": "b"},
            "source": {"name": "dbz", "file": "b.000002", "pos": 900, "row": 0, "db": "d", "table": "items"},
            "op": "u"
        });
        let mut keyed = msg(topic.clone(), update);
        keyed.key = Some(br#"{"id": 7}"#.to_vec());
        let mut tombstone = msg(topic.clone(), Value::Null);
        tombstone.key = Some(br#"{"id": 7}"#.to_vec());
        tombstone.payload.clear();
        let truncate = json!({"source": {"file": "b.000002", "pos": 950, "db": "d", "table": "items"}, "op": "t"});
        let batch = [
            keyed,
            tombstone,
            msg(topic.clone(), truncate),
            msg(topic, json!("not an event")),
        ];
        let mut p = planned(&r, &batch, &Prepared::default());
        let dead: Vec<(usize, &str)> = p.dead.iter().map(|d| (d.msg, d.reason.as_str())).collect();
        assert_eq!(
            dead,
            [
                (2, "not a Debezium change event: a TRUNCATE (op t): rebuild the index"),
                (3, "not a Debezium change event: not a change event (a JSON object): \"not an event\"")
            ]
        );
        let version = sluice_model::version::ExternalVersion::new(0, 2, 900)
            .unwrap()
            .get();
        assert_eq!(
            writes(&mut p),
            [("items_v1".to_owned(), "7".to_owned(), version, 0)],
            "the change written with the version of its binlog coordinates; the tombstone skipped"
        );
    }

    #[test]
    fn what_cannot_be_decoded_or_has_no_id_is_dead_lettered_with_why() {
        let r = router(vec![PipelineSpec::table("items", "s", "d", "items")]);
        let build = TopicConfig::default().build_topic("items");
        let mut no_id = change("items", 1, 5);
        no_id["op"] = json!("d");
        no_id["before"] = json!({"name": "x"});
        no_id["key"] = json!({});
        let batch = [
            msg(rows("items"), json!("not an event")),
            msg(build, json!({"what": "nothing"})),
            msg(rows("items"), no_id),
            msg(rows("items"), change("items", 2, 6)),
        ];
        let mut p = planned(&r, &batch, &Prepared::default());
        let dead: Vec<(usize, Option<&str>, &str)> = p
            .dead
            .iter()
            .map(|d| (d.msg, d.pipeline.as_deref(), d.reason.as_str()))
            .collect();
        assert_eq!(dead.len(), 3, "{dead:?}");
        assert!(
            dead[0].0 == 0 && dead[0].2.starts_with("not a Sluice change event"),
            "{dead:?}"
        );
        assert_eq!((dead[1].0, dead[1].1), (1, Some("items")), "{dead:?}");
        assert!(
            dead[1].2.starts_with("not a Sluice build document"),
            "{dead:?}"
        );
        assert!(
            dead[2].0 == 2 && dead[2].2.contains("cannot derive a document id"),
            "{dead:?}"
        );
        assert_eq!(writes(&mut p).len(), 1, "the rest of the batch flows");
    }

    #[test]
    fn ddl_that_rewrites_rows_marks_the_versions_of_the_pipelines_it_concerns() {
        let r = router(vec![
            PipelineSpec::table("items", "s", "d", "items"),
            PipelineSpec::table("tags", "s", "d", "tags"),
        ]);
        let schema = TopicConfig::default().schema_topic("s");
        let ddl = |sql: &str| {
            msg(
                schema.clone(),
                json!({
                    "v": 1,
                    "source": {"instance": "s", "server_id": 1, "file": "b.000002", "pos": 120, "row": 0, "ts_ms": 0},
                    "db": "d", "ddl": sql
                }),
            )
        };
        let batch = [
            ddl("ALTER TABLE items DROP COLUMN name"),
            ddl("CREATE TABLE unrelated (id INT PRIMARY KEY)"),
        ];
        let prepared = Prepared::with([], [(0, vec![1, 2])]);
        let mut p = planned(&r, &batch, &prepared);
        assert_eq!(p.rewritten.len(), 1, "{:?}", p.rewritten);
        let w = &p.rewritten[0];
        assert_eq!(
            (w.pipeline.as_str(), w.versions.as_slice()),
            ("items", &[1, 2][..])
        );
        assert!(w.reason.contains("DDL at b.000002:120"), "{}", w.reason);
        assert!(writes(&mut p).is_empty() && p.dead.is_empty());

        // What `prepare` reads the versions of: only the pipelines the DDL concerns.
        let mut dead = Vec::new();
        let routed = route(&r, &batch, 0, &mut dead);
        let Routed::Ddl { pipelines, event } = &routed[0].1 else {
            panic!("a DDL event")
        };
        let concerned: Vec<usize> = ddl::concerned(&r, pipelines, event)
            .into_iter()
            .map(|(p, _)| p)
            .collect();
        assert_eq!(concerned, [0]);
    }

    #[test]
    fn a_pipeline_read_back_from_mysql_marks_its_documents_dirty_or_says_why_it_cannot() {
        let spec: PipelineSpec = serde_json::from_value(json!({
            "name": "shop", "source": "s", "database": "d", "table": "items",
            "relations": [{"name": "brand", "kind": "one_to_one", "table": "brands", "on": {"brand_id": "id"}}]
        }))
        .unwrap();
        let r = router(vec![spec.clone()]);
        let table = |name: &str, cols: &[&str]| {
            let cols: Vec<(&str, &str, &str)> = cols.iter().map(|c| (*c, "int", "int")).collect();
            (
                ("d".to_owned(), name.to_owned()),
                sluice_mysql::SnapshotTable::from_columns("d", name, &cols, &["id"]),
            )
        };
        let tables = [
            table("items", &["id", "brand_id"]),
            table("brands", &["id"]),
        ]
        .into_iter()
        .collect();
        let plans = Arc::new(sluice_mysql::docs::compile(&spec, &tables).unwrap());
        let batch = [
            msg(rows("items"), change("items", 1, 5)),
            msg(rows("items"), change("items", 2, 6)),
        ];
        let prepared = Prepared::with(
            [
                ((0, 0), Ok(plans)),
                (
                    (1, 0),
                    Err("its spec does not fit its tables: brands.id is gone".into()),
                ),
            ],
            [],
        );
        let mut p = planned(&r, &batch, &prepared);
        assert!(!p.dirty.is_empty(), "the first change dirties its document");
        assert!(
            writes(&mut p).is_empty(),
            "documents read back are not written from the event"
        );
        assert_eq!(p.dead.len(), 1);
        assert_eq!(p.dead[0].msg, 1);
        assert_eq!(
            p.dead[0].reason,
            "pipeline shop: its spec does not fit its tables: brands.id is gone"
        );
    }
}
