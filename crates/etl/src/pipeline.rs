//! Pipelines: which change events go to which index, as what document.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use serde_json::{json, Map, Value};
use sluice_core::{ChangeEvent, ColumnInfo, Op};
use sluice_elastic::{AliasAction, BulkOp, EsClient, EsError};

use crate::config::PipelineConfig;
use crate::mapping;
use sluice_kafka::TopicConfig;

pub(crate) struct Pipeline {
    pub cfg: PipelineConfig,
    /// The physical indexes writes go to (resolved from the alias on first use).
    targets: Option<Vec<String>>,
    /// The change topic this pipeline consumes.
    topic: String,
    /// Columns this process has made sure are in the mapping.
    mapped: HashSet<String>,
    /// `<alias>_v<N>` of the version being built, if any.
    building_index: Option<String>,
}

/// Finds the pipelines of a change event.
pub(crate) struct Router {
    pub pipelines: Vec<Pipeline>,
    /// Change topic → the pipelines that consume it.
    by_topic: HashMap<String, Arc<[usize]>>,
}

impl Router {
    pub fn new(configs: &[PipelineConfig], topics: &TopicConfig) -> Self {
        let pipelines: Vec<Pipeline> = configs
            .iter()
            .map(|cfg| Pipeline {
                topic: topics.rows_topic(&cfg.source, &cfg.database, &cfg.table),
                building_index: cfg.building.map(|v| format!("{}_v{v}", cfg.alias())),
                cfg: cfg.clone(),
                targets: None,
                mapped: HashSet::new(),
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
            c.source == event.source.instance && c.database == event.db && c.table == event.table
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
    /// when the alias does not exist yet; and adds to the mapping any column this process
    /// has not mapped yet (an ADD COLUMN).
    pub async fn prepare(
        &mut self,
        es: &EsClient,
        idx: usize,
        columns: &[ColumnInfo],
    ) -> Result<(), EsError> {
        let p = &mut self.pipelines[idx];
        if p.targets.is_none() {
            let alias = p.cfg.alias().to_owned();
            let mut targets = es.alias_targets(&alias).await?;
            let props = mapping::properties(columns, &p.cfg.columns);
            let body = mapping::index_body(
                props.clone(),
                p.cfg.shards,
                p.cfg.replicas,
                &p.cfg.tombstone_retention,
            );
            if targets.is_empty() && p.cfg.building.is_none() {
                let index = format!("{alias}_v1");
                es.create_index(&index, &body).await?;
                es.update_aliases(&[AliasAction::Add {
                    index: index.clone(),
                    alias: alias.clone(),
                }])
                .await?;
                tracing::info!(pipeline = %p.cfg.name, %index, %alias, "created index version 1 and its alias");
                targets = vec![index];
            }
            if let Some(index) = p.building_index.clone() {
                // The version being built, written alongside the live ones.
                if !targets.contains(&index) {
                    // Idempotent: another etl member may have created it first.
                    es.create_index(&index, &body).await?;
                    targets.push(index);
                }
            }
            p.mapped.extend(props.keys().cloned());
            p.targets = Some(targets);
        }
        let targets = p.targets.as_deref().unwrap_or_default();
        let new: Vec<&ColumnInfo> = columns
            .iter()
            .filter(|c| {
                !p.mapped.contains(&c.name)
                    && (p.cfg.columns.is_empty() || p.cfg.columns.contains(&c.name))
            })
            .collect();
        if !new.is_empty() {
            let props: Map<String, Value> = new
                .iter()
                .map(|c| (c.name.clone(), mapping::field_mapping(&c.sql_type)))
                .collect();
            for index in targets {
                if let Err(e) = es.put_mapping(index, &json!({ "properties": props })).await {
                    if e.is_transient() {
                        return Err(e);
                    }
                    tracing::warn!(pipeline = %p.cfg.name, %index, error = %e,
                        "a column's type no longer fits the index mapping: documents keep the value in _source; rebuild the pipeline to index it");
                }
            }
            p.mapped.extend(new.iter().map(|c| c.name.clone()));
        }
        Ok(())
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
                let doc: Map<String, Value> = if p.cfg.columns.is_empty() {
                    after.clone()
                } else {
                    p.cfg
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
