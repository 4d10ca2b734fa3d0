//! Pipelines: which change events go to which index, as what document.

use std::collections::HashMap;
use std::sync::Arc;

use serde_json::{json, Map, Value};
use sluice_core::{ChangeEvent, ColumnInfo, Op, PipelineSpec};
use sluice_elastic::{index_version, versioned_index, AliasAction, BulkOp, EsClient, EsError};

use crate::mapping;
use sluice_kafka::TopicConfig;

/// A pipeline the etl applies: its spec, and the version being built, if any (from the
/// center: written to as well as the alias's).
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Active {
    pub spec: PipelineSpec,
    pub building: Option<u32>,
}

pub(crate) struct Pipeline {
    pub cfg: Active,
    /// The physical indexes writes go to (resolved from the alias on first use).
    targets: Option<Vec<String>>,
    /// The change topic this pipeline consumes.
    topic: String,
    /// Per target index, the field mappings it has (read when the targets are resolved,
    /// then kept in step with what this process adds).
    live: HashMap<String, Map<String, Value>>,
    /// The columns the targets' mappings were last checked against.
    checked: Vec<ColumnInfo>,
    /// Per target index, why its settings cannot become the pipeline's.
    unfit_settings: HashMap<String, String>,
    /// `<alias>_v<N>` of the version being built, if any.
    building_index: Option<String>,
}

/// Finds the pipelines of a change event.
pub(crate) struct Router {
    pub pipelines: Vec<Pipeline>,
    /// Change topic → the pipelines that consume it.
    by_topic: HashMap<String, Arc<[usize]>>,
    /// What the last checks of index mappings and settings found, for the center: per
    /// index version, why it needs a rebuild (`None`: it does not).
    pub verdicts: Vec<Verdict>,
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

impl Router {
    pub fn new(configs: &[Active], topics: &TopicConfig) -> Self {
        let pipelines: Vec<Pipeline> = configs
            .iter()
            .map(|cfg| Pipeline {
                topic: topics.rows_topic(&cfg.spec.source, &cfg.spec.database, &cfg.spec.table),
                building_index: cfg.building.map(|v| versioned_index(&cfg.spec.alias(), v)),
                cfg: cfg.clone(),
                targets: None,
                live: HashMap::new(),
                checked: Vec::new(),
                unfit_settings: HashMap::new(),
            })
            .collect();
        let mut by_topic: HashMap<String, Vec<usize>> = HashMap::new();
        for (i, p) in pipelines.iter().enumerate() {
            by_topic.entry(p.topic.clone()).or_default().push(i);
        }
        let by_topic = by_topic.into_iter().map(|(t, v)| (t, v.into())).collect();
        Self {
            pipelines,
            by_topic,
            verdicts: Vec::new(),
        }
    }

    /// The pipelines that consume `event`, which arrived on `topic`. Looked up by topic
    /// (no allocation per event); the event's own table must match too, so a topic
    /// template shared by several tables cannot route a row to the wrong index.
    pub fn pipelines_for(&self, topic: &str, event: &ChangeEvent) -> Arc<[usize]> {
        let Some(candidates) = self.by_topic.get(topic) else {
            return Arc::from([]);
        };
        let matches = |&i: &usize| {
            let c = &self.pipelines[i].cfg;
            c.spec.source == event.source.instance
                && c.spec.database == event.db
                && c.spec.table == event.table
        };
        if candidates.iter().all(matches) {
            candidates.clone()
        } else {
            candidates.iter().copied().filter(matches).collect()
        }
    }

    /// The indexes pipeline `idx` writes to; empty until [`Router::prepare`] ran.
    pub fn targets(&self, idx: usize) -> &[String] {
        self.pipelines[idx].targets.as_deref().unwrap_or_default()
    }

    /// The indexes `event` goes to: every target, except that a snapshot row of a build
    /// goes only to the version being built (the live versions have the live state).
    pub fn targets_of(&self, idx: usize, event: &ChangeEvent) -> &[String] {
        let all = self.targets(idx);
        match (event.op, &self.pipelines[idx].building_index) {
            (Op::Read, Some(building)) => match all.iter().position(|t| t == building) {
                Some(i) => &all[i..=i],
                None => all,
            },
            _ => all,
        }
    }

    /// Makes pipeline `idx` ready to write: resolves the indexes behind its alias, creating
    /// `<alias>_v1` with a mapping generated from `columns` and pointing the alias at it
    /// when the alias does not exist yet (and the version being built); then, whenever the
    /// columns differ from the last check, brings every target's mapping in step: new
    /// fields and in-place changes are applied, anything else is a [`Verdict`] that the
    /// version needs a rebuild.
    pub async fn prepare(
        &mut self,
        es: &EsClient,
        idx: usize,
        columns: &[ColumnInfo],
    ) -> Result<(), EsError> {
        let p = &mut self.pipelines[idx];
        let settings = mapping::IndexSettings {
            shards: p.cfg.spec.shards,
            replicas: p.cfg.spec.replicas,
            tombstone_retention: p.cfg.spec.tombstone_retention.clone(),
            refresh_interval: p.cfg.spec.refresh_interval.clone(),
        };
        if p.targets.is_none() {
            let alias = p.cfg.spec.alias().to_owned();
            let mut targets = es.alias_targets(&alias).await?;
            let (props, ignored) =
                mapping::properties(columns, &p.cfg.spec.columns, &p.cfg.spec.fields);
            for why in ignored {
                tracing::warn!(pipeline = %p.cfg.spec.name, "{why}");
            }
            let body = mapping::index_body(props.clone(), &settings);
            let mut created = Vec::new();
            if targets.is_empty() && p.cfg.building.is_none() {
                let index = versioned_index(&alias, 1);
                es.create_index(&index, &body).await?;
                es.update_aliases(&[AliasAction::Add {
                    index: index.clone(),
                    alias: alias.clone(),
                }])
                .await?;
                tracing::info!(pipeline = %p.cfg.spec.name, %index, %alias, "created index version 1 and its alias");
                targets = vec![index.clone()];
                created.push(index);
            }
            if let Some(index) = p.building_index.clone() {
                // The version being built, written alongside the live ones. Nobody
                // searches it yet: no refreshes, no replicas while it fills; the center
                // gives it the pipeline's settings before the alias moves to it.
                if !targets.contains(&index) {
                    let filling = mapping::IndexSettings {
                        replicas: 0,
                        refresh_interval: "-1".into(),
                        ..settings.clone()
                    };
                    let body = mapping::index_body(props, &filling);
                    // Idempotent: another etl member may have created it first.
                    es.create_index(&index, &body).await?;
                    targets.push(index);
                }
            }
            p.live.clear();
            p.unfit_settings.clear();
            for index in &targets {
                let live = es.get_mapping(index).await?;
                let props = live
                    .get(index)
                    .and_then(|m| m["mappings"]["properties"].as_object())
                    .cloned()
                    .unwrap_or_default();
                p.live.insert(index.clone(), props);
                if created.contains(index) || p.building_index.as_ref() == Some(index) {
                    continue;
                }
                // Settings the pipeline changed since the index was made.
                let live = es.get_settings(index).await?;
                match settings.diff(&live[index.as_str()]["settings"]["index"]) {
                    Ok(change) if change.is_empty() => {}
                    Ok(change) => {
                        let change = Value::Object(change);
                        es.update_settings(index, &change).await?;
                        tracing::info!(pipeline = %p.cfg.spec.name, %index, settings = %change, "index settings changed in place");
                    }
                    Err(why) => {
                        p.unfit_settings.insert(index.clone(), why);
                    }
                }
            }
            p.targets = Some(targets);
            p.checked.clear();
        }
        let unchanged = p.checked.len() == columns.len()
            && p.checked
                .iter()
                .zip(columns)
                .all(|(seen, c)| seen.name == c.name && seen.sql_type == c.sql_type);
        if unchanged {
            return Ok(());
        }
        let (wanted, _) = mapping::properties(columns, &p.cfg.spec.columns, &p.cfg.spec.fields);
        let alias = p.cfg.spec.alias().to_owned();
        for index in p.targets.as_deref().unwrap_or_default() {
            let live = p.live.entry(index.clone()).or_default();
            let mut change = Map::new();
            let mut rebuild: Vec<String> =
                p.unfit_settings.get(index).cloned().into_iter().collect();
            for (field, want) in &wanted {
                match live.get(field).map(|l| mapping::fit(field, l, want)) {
                    None | Some(mapping::Fit::InPlace) => {
                        change.insert(field.clone(), want.clone());
                    }
                    Some(mapping::Fit::Same) => {}
                    Some(mapping::Fit::Rebuild(why)) => rebuild.push(why),
                }
            }
            if !change.is_empty() {
                match es
                    .put_mapping(index, &json!({ "properties": change }))
                    .await
                {
                    Ok(()) => {
                        tracing::info!(pipeline = %p.cfg.spec.name, %index, fields = ?change.keys().collect::<Vec<_>>(), "mapping changed in place");
                        live.extend(change);
                    }
                    Err(e) if e.is_transient() => return Err(e),
                    Err(e) => rebuild.push(format!("the server refused the mapping change: {e}")),
                }
            }
            let needs_rebuild = (!rebuild.is_empty()).then(|| rebuild.join("; "));
            if let Some(why) = &needs_rebuild {
                tracing::warn!(pipeline = %p.cfg.spec.name, %index, "needs a rebuild: {why}; documents keep every value in _source meanwhile");
            }
            self.verdicts.push(Verdict {
                pipeline: p.cfg.spec.name.clone(),
                version: index_version(&alias, index).unwrap_or(0),
                needs_rebuild,
            });
        }
        p.checked = columns.to_vec();
        Ok(())
    }

    /// The columns each pipeline's indexes were last checked against, by pipeline name.
    pub fn seen_columns(&self) -> HashMap<String, Vec<ColumnInfo>> {
        self.pipelines
            .iter()
            .filter(|p| !p.checked.is_empty())
            .map(|p| (p.cfg.spec.name.clone(), p.checked.clone()))
            .collect()
    }

    /// Prepares at once the pipelines whose table's columns are `known` (from the router
    /// this one replaces): a changed override or setting of a quiet table is applied, or
    /// marked as needing a rebuild, without waiting for the table's next change.
    pub async fn check_known(&mut self, es: &EsClient, known: &HashMap<String, Vec<ColumnInfo>>) {
        for idx in 0..self.pipelines.len() {
            let Some(columns) = known.get(&self.pipelines[idx].cfg.spec.name) else {
                continue;
            };
            if let Err(e) = self.prepare(es, idx, columns).await {
                tracing::warn!(pipeline = %self.pipelines[idx].cfg.spec.name, error = %e, "cannot check the index now; its next change will");
                self.pipelines[idx].targets = None;
            }
        }
    }

    /// The bulk operation of `event` for pipeline `idx` on `index`, or why there is none.
    pub fn op(&self, idx: usize, index: &str, event: &ChangeEvent) -> Result<BulkOp, String> {
        let p = &self.pipelines[idx];
        let id = event.document_id().ok_or_else(|| {
            format!(
                "{}.{} row has no primary key value: cannot derive a document id",
                event.db, event.table
            )
        })?;
        match event.op {
            Op::Delete => Ok(BulkOp::Delete {
                index: index.to_owned(),
                id,
                version: event.version,
                routing: None,
            }),
            Op::Create | Op::Update | Op::Read => {
                let after = event
                    .after
                    .as_ref()
                    .ok_or("insert/update event without an `after` image")?;
                let doc: Map<String, Value> = if p.cfg.spec.columns.is_empty() {
                    after.clone()
                } else {
                    p.cfg
                        .spec
                        .columns
                        .iter()
                        .filter_map(|c| after.get(c).map(|v| (c.clone(), v.clone())))
                        .collect()
                };
                Ok(BulkOp::Index {
                    index: index.to_owned(),
                    id,
                    version: event.version,
                    routing: None,
                    doc: Value::Object(doc),
                })
            }
        }
    }
}
