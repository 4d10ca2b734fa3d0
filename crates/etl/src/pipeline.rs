//! Pipelines: which change events concern which pipeline, and what becomes of them — for
//! a flat pipeline (one table, no filter) a document straight from the event's row; for
//! the others, the compiled plans that read documents back from MySQL (see `docs`).

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;

use serde_json::{Map, Value};
use sluice_elastic::{parts, versioned_index, BulkOp, EsClient, EsError, PartsWrite};
use sluice_kafka::TopicConfig;
use sluice_model::pipeline::TableMatcher;
use sluice_model::{BuildDocument, ChangeEvent, ColumnInfo, Op, PipelineSpec};
use sluice_mysql::docs::DocPlan;
use sluice_mysql::{MysqlError, SourceConfig};

use crate::mapping;

/// A pipeline the etl applies: its spec, the version being built, if any (from the
/// center: written to as well as the alias's), the versions kept for rollback, and how
/// to reach its source (pipelines read back from MySQL need it; `Err` says why it cannot
/// be reached).
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Active {
    pub spec: PipelineSpec,
    pub building: Option<u32>,
    /// Earlier versions kept current for rollback (the live one among them): written
    /// with live changes as long as their index exists.
    pub history: Vec<u32>,
    pub source: Result<SourceConfig, String>,
}

pub(crate) struct Pipeline {
    pub cfg: Active,
    /// Every `(database, table)` of its tree.
    tables: Vec<(String, String)>,
    /// The physical indexes writes go to (resolved from the alias on first use).
    pub(crate) targets: Option<Vec<String>>,
    /// Per target index, the field mappings it has (read when the targets are resolved,
    /// then kept in step with what this process adds).
    pub(crate) live: HashMap<String, Map<String, Value>>,
    /// Flat pipelines: the columns the targets' mappings were last checked against.
    pub(crate) checked: Vec<ColumnInfo>,
    /// The mapping the targets were last brought in step with.
    pub(crate) wanted: Option<Map<String, Value>>,
    /// Per target index, why its settings cannot become the pipeline's.
    pub(crate) unfit_settings: HashMap<String, String>,
    /// `<alias>_v<N>` of the version being built, if any.
    pub(crate) building_index: Option<String>,
    /// Its sharded tables' patterns: a change of any table they match is its.
    shards: Vec<TableMatcher>,
    /// The topic of its builds.
    build_topic: String,
    /// Pipelines read back from MySQL: their compiled documents.
    tree: Option<Tree>,
    /// Its documents are written in parts (area updates: its spec asks, the sink runs
    /// Painless), known once its tree is ready.
    pub(crate) in_parts: bool,
}

/// A pipeline read back from MySQL, as far as this process knows it.
enum Tree {
    Unloaded,
    Ready {
        plans: Arc<Vec<DocPlan>>,
        /// Each table's columns as last seen (described, or in a change event): columns
        /// that differ mean DDL, and the plans are compiled again.
        seen: HashMap<String, HashMap<String, Arc<[ColumnInfo]>>>,
    },
    /// Its spec does not fit its tables, or its source cannot be reached: why.
    Unfit(String),
}

/// Finds the pipelines of a change event.
pub(crate) struct Router {
    pub pipelines: Vec<Pipeline>,
    /// Change topic → the pipelines that consume it.
    by_topic: HashMap<String, Arc<[usize]>>,
    /// Build topic → the pipeline whose version it builds.
    by_build: HashMap<String, usize>,
    /// A source's schema topic (its DDL) → the pipelines of that source.
    by_schema: HashMap<String, Arc<[usize]>>,
    /// Change topics written by Debezium (read in its format).
    debezium: std::collections::HashSet<String>,
    /// What the last checks of index mappings and settings found, for the center: per
    /// index version, why it needs a rebuild (`None`: it does not).
    pub verdicts: Vec<Verdict>,
    /// Whether the sink runs Painless scripts, once asked.
    painless: Option<bool>,
}

/// Whether an index version of a pipeline can take what the table and the pipeline now
/// ask for.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Verdict {
    pub pipeline: String,
    pub version: u32,
    /// Why only a rebuild fixes it; `None` when it fits.
    pub needs_rebuild: Option<String>,
}

/// Why a pipeline read back from MySQL cannot be made ready now.
#[derive(Debug, thiserror::Error)]
pub(crate) enum NotReady {
    #[error(transparent)]
    Source(#[from] MysqlError),
    #[error(transparent)]
    Index(#[from] EsError),
}

impl NotReady {
    pub fn is_transient(&self) -> bool {
        match self {
            NotReady::Source(e) => e.is_transient(),
            NotReady::Index(e) => e.is_transient(),
        }
    }
}

impl Pipeline {
    fn new(cfg: &Active, topics: &TopicConfig) -> Self {
        Pipeline {
            tables: cfg.spec.tables(),
            shards: (cfg.spec.patterns().iter())
                .filter_map(|p| p.matcher().ok())
                .collect(),
            building_index: cfg.building.map(|v| versioned_index(&cfg.spec.alias(), v)),
            build_topic: topics.build_topic(&cfg.spec.name),
            tree: (!cfg.spec.is_flat()).then_some(Tree::Unloaded),
            in_parts: false,
            cfg: cfg.clone(),
            targets: None,
            live: HashMap::new(),
            checked: Vec::new(),
            wanted: None,
            unfit_settings: HashMap::new(),
        }
    }

    /// Its documents are read back from MySQL (relations or a filter).
    pub fn is_tree(&self) -> bool {
        self.tree.is_some()
    }

    /// The compiled documents of a pipeline read back from MySQL, once ready.
    pub fn plans(&self) -> Option<Arc<Vec<DocPlan>>> {
        match &self.tree {
            Some(Tree::Ready { plans, .. }) => Some(plans.clone()),
            _ => None,
        }
    }

    /// The parts of its kinds of documents (the fields of the relations under each
    /// kind's root), once its tree is ready.
    pub fn part_names(&self) -> Vec<String> {
        let mut names: Vec<String> = (self.plans().iter())
            .flat_map(|plans| plans.iter().flat_map(DocPlan::part_names))
            .collect();
        names.sort();
        names.dedup();
        names
    }

    /// Why a pipeline read back from MySQL cannot be applied, if it cannot.
    pub fn unfit(&self) -> Option<&str> {
        match &self.tree {
            Some(Tree::Unfit(why)) => Some(why),
            _ => None,
        }
    }

    /// Forgets what was resolved: found again on next use.
    pub fn forget(&mut self) {
        self.targets = None;
        if self.tree.is_some() {
            self.tree = Some(Tree::Unloaded);
        }
    }

    /// Whether `event`'s columns differ from what the plans were compiled against.
    fn stale_for(&self, event: &ChangeEvent) -> bool {
        match &self.tree {
            Some(Tree::Ready { seen, .. }) => seen
                .get(&event.db)
                .and_then(|t| t.get(&event.table))
                .is_none_or(|cols| **cols != *event.columns),
            // Not compiled yet, or unfit: the event's columns may be what fits.
            _ => true,
        }
    }
}

impl Router {
    /// Routes `configs`; `existing` (the cluster's topics) holds the change topics of
    /// their sharded tables.
    pub fn new(configs: &[Active], topics: &TopicConfig, existing: &[String]) -> Self {
        let pipelines: Vec<Pipeline> = configs.iter().map(|c| Pipeline::new(c, topics)).collect();
        let mut by_topic: HashMap<String, Vec<usize>> = HashMap::new();
        for (i, p) in pipelines.iter().enumerate() {
            for topic in p.topics(topics, existing) {
                by_topic.entry(topic).or_default().push(i);
            }
        }
        let by_topic = by_topic.into_iter().map(|(t, v)| (t, v.into())).collect();
        let by_build = pipelines
            .iter()
            .enumerate()
            .map(|(i, p)| (p.build_topic.clone(), i))
            .collect();
        let mut by_schema: HashMap<String, Vec<usize>> = HashMap::new();
        let mut debezium = std::collections::HashSet::new();
        for (i, p) in pipelines.iter().enumerate() {
            if !p.cfg.spec.input.is_sluice() {
                debezium.extend(change_topics(&p.cfg.spec, topics, &[]));
                continue;
            }
            by_schema
                .entry(topics.schema_topic(&p.cfg.spec.source))
                .or_default()
                .push(i);
        }
        let by_schema = by_schema.into_iter().map(|(t, v)| (t, v.into())).collect();
        Self {
            pipelines,
            by_topic,
            by_build,
            by_schema,
            debezium,
            verdicts: Vec::new(),
            painless: None,
        }
    }

    /// Whether a pipeline has sharded tables, whose topics are found among the cluster's.
    pub fn sharded(&self) -> bool {
        self.pipelines.iter().any(|p| !p.shards.is_empty())
    }

    /// Every topic the pipelines consume.
    pub fn topics(&self) -> BTreeSet<String> {
        self.by_topic.keys().cloned().collect()
    }

    /// Every topic the pipelines would consume, `existing` being the cluster's topics.
    pub fn topics_with(&self, topics: &TopicConfig, existing: &[String]) -> BTreeSet<String> {
        (self.pipelines.iter())
            .flat_map(|p| p.topics(topics, existing))
            .collect()
    }

    /// Whether `topic`'s messages are Debezium's change events.
    pub fn is_debezium(&self, topic: &str) -> bool {
        self.debezium.contains(topic)
    }

    /// The pipelines that consume `event`, which arrived on `topic`. Looked up by topic
    /// (no allocation per event); the event's own table must be in the pipeline too, so a
    /// topic template shared by several tables cannot route a row to the wrong index.
    pub fn pipelines_for(&self, topic: &str, event: &ChangeEvent) -> Arc<[usize]> {
        let Some(candidates) = self.by_topic.get(topic) else {
            return Arc::from([]);
        };
        let matches = |&i: &usize| {
            let p = &self.pipelines[i];
            // Debezium names its connector, not the source: its topic says whose it is.
            (p.cfg.spec.source == event.source.instance || !p.cfg.spec.input.is_sluice())
                && if p.is_tree() {
                    p.tables
                        .iter()
                        .any(|(db, table)| *db == event.db && *table == event.table)
                        || p.shards.iter().any(|s| s.matches(&event.db, &event.table))
                } else {
                    p.cfg.spec.database == event.db && p.cfg.spec.table == event.table
                }
        };
        if candidates.iter().all(matches) {
            candidates.clone()
        } else {
            candidates.iter().copied().filter(matches).collect()
        }
    }

    /// Every pipeline fed by `topic` reads its documents back from MySQL: many of its
    /// changes lead to one document, read once a batch.
    pub fn reads_back(&self, topic: &str) -> bool {
        self.by_topic
            .get(topic)
            .is_some_and(|ps| ps.iter().all(|&i| self.pipelines[i].is_tree()))
    }

    /// The indexes pipeline `idx` writes to; empty until it was prepared.
    pub fn targets(&self, idx: usize) -> &[String] {
        self.pipelines[idx].targets.as_deref().unwrap_or_default()
    }

    /// The pipeline that writes to `index`.
    pub fn owner_of(&self, index: &str) -> Option<String> {
        self.pipelines
            .iter()
            .find(|p| p.targets.iter().flatten().any(|t| t == index))
            .map(|p| p.cfg.spec.name.clone())
    }

    /// The pipelines whose source's DDL `topic` carries, if it is a schema topic.
    pub fn schema_of(&self, topic: &str) -> Option<Arc<[usize]>> {
        self.by_schema.get(topic).cloned()
    }

    /// Whether pipeline `name` is building index version `version`.
    pub fn building(&self, name: &str, version: u32) -> bool {
        self.pipelines
            .iter()
            .any(|p| p.cfg.spec.name == name && p.cfg.building == Some(version))
    }

    /// The pipeline a build topic belongs to, if `topic` is one.
    pub fn build_of(&self, topic: &str) -> Option<usize> {
        self.by_build.get(topic).copied()
    }

    /// Makes pipeline `idx` (read back from MySQL) ready for `event`: compiled against its
    /// tables — again when the event's columns show the table changed — and its indexes in
    /// step with the documents' mapping. When its spec does not fit its tables (or its
    /// source cannot be reached), it is left [`Pipeline::unfit`]; an error is to be retried.
    pub async fn ready_tree(
        &mut self,
        es: &EsClient,
        idx: usize,
        event: Option<&ChangeEvent>,
    ) -> Result<(), NotReady> {
        let p = &self.pipelines[idx];
        let stale = match event {
            Some(e) => p.stale_for(e),
            None => !matches!(p.tree, Some(Tree::Ready { .. })),
        };
        if !stale || !p.is_tree() {
            return Ok(());
        }
        let in_parts = p.cfg.spec.area_updates() && self.painless(es, idx).await?;
        let p = &mut self.pipelines[idx];
        let name = p.cfg.spec.name.clone();
        let loaded = match &p.cfg.source {
            Err(why) => Err(format!("its source cannot be reached from this etl: {why}")),
            Ok(src) => match sluice_mysql::docs::load(src, &p.cfg.spec).await {
                Err(e) if e.is_transient() => return Err(e.into()),
                Err(e) => Err(format!("cannot describe its tables: {e}")),
                Ok(Err(problems)) => Err(format!(
                    "its spec does not fit its tables: {}",
                    problems.join("; ")
                )),
                Ok(Ok(plans)) => mapping::tree_properties(&plans)
                    .map(|m| (plans, m.properties, m.ignored))
                    .map_err(|conflicts| conflicts.join("; ")),
            },
        };
        let (plans, mut props, ignored) = match loaded {
            Ok(l) => l,
            Err(why) => {
                tracing::error!(pipeline = %name, "{why}: its events are dead-lettered until that is fixed");
                p.tree = Some(Tree::Unfit(why));
                return Ok(());
            }
        };
        for why in ignored {
            tracing::warn!(pipeline = %name, "{why}");
        }
        let mut seen: HashMap<String, HashMap<String, Arc<[ColumnInfo]>>> = HashMap::new();
        for plan in &plans {
            for n in plan.nodes() {
                for ((db, table), columns) in n.table.sources() {
                    seen.entry(db).or_default().insert(table, columns);
                }
            }
        }
        if let Some(e) = event {
            // Compiled now, for these columns: the same columns again are not a change.
            seen.entry(e.db.clone())
                .or_default()
                .insert(e.table.clone(), e.columns.clone());
        }
        if in_parts {
            if let Some(why) = versions_field_taken(&props) {
                tracing::error!(pipeline = %name, "{why}: its events are dead-lettered until that is fixed");
                p.tree = Some(Tree::Unfit(why));
                return Ok(());
            }
            props.insert(parts::FIELD.into(), parts::mapping());
        }
        p.in_parts = in_parts;
        self.ensure(es, idx, props).await?;
        self.pipelines[idx].tree = Some(Tree::Ready {
            plans: Arc::new(plans),
            seen,
        });
        tracing::info!(pipeline = %name, "documents compiled against the tables");
        Ok(())
    }

    /// Whether the sink runs Painless scripts (asked once): when it does not, pipeline
    /// `idx`, which asks for area updates, is written whole, and says so.
    async fn painless(&mut self, es: &EsClient, idx: usize) -> Result<bool, EsError> {
        let runs = match self.painless {
            Some(runs) => runs,
            None => {
                // A server that will not say (no right to ask) is taken to run them: its
                // writes then fail with the reason, dead-lettered.
                let runs = es.runs_painless().await?.unwrap_or(true);
                self.painless = Some(runs);
                runs
            }
        };
        if !runs {
            tracing::warn!(pipeline = %self.pipelines[idx].cfg.spec.name, "asks for area updates, but the sink runs no Painless scripts (Elasticsearch without its lang-painless module): whole documents are written instead");
        }
        Ok(runs)
    }

    /// The writes of a build's document: into the version being built only; none when
    /// the document is of another build (a leftover of an earlier one). A repair goes to
    /// the version it names, if this etl writes it, or with version 0 to every version it
    /// writes (the delayed job's documents); an orphan's repair is a delete.
    pub fn build_ops(&self, idx: usize, doc: BuildDocument) -> Vec<BulkOp> {
        let p = &self.pipelines[idx];
        let indexes: Vec<String> = if doc.repair {
            let targets = p.targets.as_deref().unwrap_or_default();
            if doc.build == 0 {
                targets.to_vec()
            } else {
                let index = versioned_index(&p.cfg.spec.alias(), doc.build);
                targets.iter().filter(|t| **t == index).cloned().collect()
            }
        } else if p.cfg.building == Some(doc.build) {
            p.building_index.iter().cloned().collect()
        } else {
            Vec::new()
        };
        if p.in_parts {
            let names = p.part_names();
            let write = match doc.deleted {
                true => PartsWrite::Delete,
                // A build's document is new to the version it fills (a repair's is not).
                false => PartsWrite::whole(doc.doc, &names, Default::default(), !doc.repair),
            };
            return (indexes.into_iter())
                .map(|index| BulkOp::Parts {
                    index,
                    id: doc.id.clone(),
                    version: doc.version,
                    routing: doc.routing.clone(),
                    write: write.clone(),
                })
                .collect();
        }
        // The document is moved into the last write (most often the only one).
        let last = indexes.len().saturating_sub(1);
        let mut body = Some(Value::Object(doc.doc));
        indexes
            .into_iter()
            .enumerate()
            .map(|(i, index)| {
                let (id, version, routing) = (doc.id.clone(), doc.version, doc.routing.clone());
                if doc.deleted {
                    return BulkOp::Delete {
                        index,
                        id,
                        version,
                        routing,
                    };
                }
                let copy = if i == last { body.take() } else { body.clone() };
                BulkOp::Index {
                    index,
                    id,
                    version,
                    routing,
                    doc: copy.expect("the document is moved into the last write only"),
                }
            })
            .collect()
    }

    /// Appends the bulk operations of `event` for flat pipeline `idx` on `index` (its row
    /// is the document): one, or when an update changed the `id` columns, the old
    /// document's delete too. The error says why there is none.
    pub fn flat_ops(
        &self,
        idx: usize,
        index: &str,
        event: &ChangeEvent,
        out: &mut Vec<BulkOp>,
    ) -> Result<(), String> {
        let spec = &self.pipelines[idx].cfg.spec;
        let id_of = |image: &Option<Map<String, Value>>| -> Result<String, String> {
            let id = if spec.id.is_empty() {
                event.document_id()
            } else {
                image.as_ref().and_then(|row| {
                    let values: Option<Vec<&Value>> = spec.id.iter().map(|c| row.get(c)).collect();
                    sluice_model::event::id_of(values?)
                })
            };
            id.ok_or_else(|| {
                format!(
                    "{}.{} row has no value for its id columns ({}): cannot derive a document id",
                    event.db,
                    event.table,
                    if spec.id.is_empty() {
                        "the primary key".to_owned()
                    } else {
                        spec.id.join(", ")
                    }
                )
            })
        };
        let delete = |id: String| BulkOp::Delete {
            index: index.to_owned(),
            id,
            version: event.version,
            routing: None,
        };
        if event.op == Op::Delete {
            out.push(delete(id_of(&event.before)?));
            return Ok(());
        }
        let after = event
            .after
            .as_ref()
            .ok_or("insert/update event without an `after` image")?;
        let id = id_of(&event.after)?;
        if !spec.id.is_empty() && event.before.is_some() {
            let old = id_of(&event.before)?;
            if old != id {
                out.push(delete(old));
            }
        }
        let doc: Map<String, Value> = if spec.columns.is_empty() {
            after.clone()
        } else {
            spec.columns
                .iter()
                .filter_map(|c| after.get(c).map(|v| (c.clone(), v.clone())))
                .collect()
        };
        out.push(BulkOp::Index {
            index: index.to_owned(),
            id,
            version: event.version,
            routing: None,
            doc: Value::Object(doc),
        });
        Ok(())
    }
}

impl Pipeline {
    /// The topics it consumes: the change topic of each table of its tree, and its
    /// builds' (always: a build then starts without a change of the partitions consumed).
    pub fn topics(&self, topics: &TopicConfig, existing: &[String]) -> Vec<String> {
        let mut all = change_topics(&self.cfg.spec, topics, existing);
        all.push(self.build_topic.clone());
        all
    }
}

/// The topics whose events move a pipeline's documents: each table's change topic
/// (Sluice's, or Debezium's for a pipeline fed by Debezium), and for Sluice's input the
/// source's schema topic (DDL that changes rows without row events marks the pipeline).
/// A sharded table's are those of `existing` (the cluster's topics) its patterns match.
pub(crate) fn change_topics(
    spec: &sluice_model::PipelineSpec,
    topics: &TopicConfig,
    existing: &[String],
) -> Vec<String> {
    let tables = spec.tables();
    if !spec.input.is_sluice() {
        return (tables.iter())
            .filter_map(|(db, table)| spec.input.debezium_topic(db, table))
            .collect();
    }
    let mut out = topics.rows_topics(spec, existing);
    out.push(topics.schema_topic(&spec.source));
    out
}

/// Why documents of these properties cannot be written in parts: one of their fields is
/// the one those keep their versions in.
fn versions_field_taken(props: &Map<String, Value>) -> Option<String> {
    props.contains_key(parts::FIELD).then(|| {
        format!(
            "its documents have a field `{}`, which documents written in parts keep their versions in: leave that column out (`columns`), rename the relation, or set `area_updates = false`",
            parts::FIELD
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn event(op: Op, before: Option<Value>, after: Option<Value>) -> ChangeEvent {
        let image = |v: Option<Value>| v.map(|v| v.as_object().unwrap().clone());
        serde_json::from_value::<ChangeEvent>(json!({
            "v": 1,
            "source": {"instance": "s", "server_id": 1, "file": "b.000001", "pos": 4, "row": 0, "ts_ms": 0},
            "db": "d", "table": "t", "op": op, "key": {"id": 1},
            "columns": [{"name": "id", "type": "int", "key": true}, {"name": "code", "type": "varchar"}],
            "version": 77
        }))
        .map(|mut e| {
            e.before = image(before);
            e.after = image(after);
            e
        })
        .unwrap()
    }

    #[test]
    fn a_flat_pipeline_with_id_columns_moves_the_document_when_they_change() {
        let mut spec = PipelineSpec::table("t", "s", "d", "t");
        spec.id = vec!["code".into()];
        let router = Router::new(
            &[Active {
                spec,
                building: None,
                history: vec![],
                source: Err("not needed".into()),
            }],
            &TopicConfig::default(),
            &[],
        );
        let update = event(
            Op::Update,
            Some(json!({"id": 1, "code": "a"})),
            Some(json!({"id": 1, "code": "b"})),
        );
        let mut ops = Vec::new();
        router.flat_ops(0, "i", &update, &mut ops).unwrap();
        let ids: Vec<(&str, bool)> = ops
            .iter()
            .map(|o| (o.id(), matches!(o, BulkOp::Index { .. })))
            .collect();
        assert_eq!(ids, [("a", false), ("b", true)]);
        let delete = event(Op::Delete, Some(json!({"id": 1, "code": null})), None);
        let e = router
            .flat_ops(0, "i", &delete, &mut Vec::new())
            .unwrap_err();
        assert!(e.contains("(code)"), "{e}");
    }

    #[test]
    fn a_sharded_table_is_read_from_the_cluster_topics_its_patterns_match() {
        let mut spec = PipelineSpec::table("orders", "s", r"db_\d+", r"orders_\d+");
        spec.sharded = true;
        spec.id = vec!["order_no".into()];
        let topics = TopicConfig::default();
        let active = Active {
            spec,
            building: None,
            history: vec![],
            source: Err("not needed".into()),
        };
        let existing = [
            topics.rows_topic("s", "db_0", "orders_1"),
            topics.rows_topic("s", "db_1", "orders_7"),
            topics.rows_topic("s", "db_1", "orders_archive"),
            topics.rows_topic("other", "db_1", "orders_2"),
        ];
        let router = Router::new(std::slice::from_ref(&active), &topics, &existing);
        assert!(router.sharded());
        let consumed = router.topics();
        assert!(consumed.contains(&existing[0]) && consumed.contains(&existing[1]));
        assert!(!consumed.contains(&existing[2]) && !consumed.contains(&existing[3]));
        assert!(consumed.contains(&topics.schema_topic("s")));
        // A shard created since: its topic is one more to consume.
        let mut later = existing.to_vec();
        later.push(topics.rows_topic("s", "db_2", "orders_0"));
        assert_ne!(router.topics_with(&topics, &later), consumed);
        assert_eq!(router.topics_with(&topics, &existing), consumed);

        let mut e = event(Op::Create, None, Some(json!({"id": 1, "code": "a"})));
        e.source.instance = "s".into();
        (e.db, e.table) = ("db_1".into(), "orders_7".into());
        assert_eq!(&*router.pipelines_for(&existing[1], &e), &[0]);
        (e.db, e.table) = ("db_1".into(), "orders_archive".into());
        assert!(
            router.pipelines_for(&existing[1], &e).is_empty(),
            "not a shard"
        );
    }
}
