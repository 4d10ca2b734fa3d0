//! Pipelines: which change events go to which index, as what document.

use std::collections::{HashMap, HashSet};

use serde_json::{json, Map, Value};
use sluice_core::{ChangeEvent, ColumnInfo, Op};
use sluice_elastic::{AliasAction, BulkOp, EsClient, EsError};

use crate::config::PipelineConfig;
use crate::mapping;

pub(crate) struct Pipeline {
    pub cfg: PipelineConfig,
    /// The physical indexes writes go to (resolved from the alias on first use).
    targets: Option<Vec<String>>,
    /// Columns this process has made sure are in the mapping.
    mapped: HashSet<String>,
}

/// Finds the pipelines of a change event.
pub(crate) struct Router {
    pub pipelines: Vec<Pipeline>,
    by_table: HashMap<(String, String, String), Vec<usize>>,
}

impl Router {
    pub fn new(configs: &[PipelineConfig]) -> Self {
        let mut by_table: HashMap<_, Vec<usize>> = HashMap::new();
        for (i, p) in configs.iter().enumerate() {
            by_table
                .entry((p.source.clone(), p.database.clone(), p.table.clone()))
                .or_default()
                .push(i);
        }
        let pipelines = configs
            .iter()
            .map(|cfg| Pipeline {
                cfg: cfg.clone(),
                targets: None,
                mapped: HashSet::new(),
            })
            .collect();
        Self {
            pipelines,
            by_table,
        }
    }

    /// The pipelines that consume `event`'s table.
    pub fn pipelines_for(&self, event: &ChangeEvent) -> &[usize] {
        self.by_table
            .get(&(
                event.source.instance.clone(),
                event.db.clone(),
                event.table.clone(),
            ))
            .map(Vec::as_slice)
            .unwrap_or(&[])
    }

    /// The indexes pipeline `idx` writes to, creating `<alias>_v1` with a mapping generated
    /// from `columns` and pointing the alias at it when the alias does not exist yet; and
    /// adding to the mapping any column this process has not mapped yet (an ADD COLUMN).
    pub async fn targets(
        &mut self,
        es: &EsClient,
        idx: usize,
        columns: &[ColumnInfo],
    ) -> Result<Vec<String>, EsError> {
        let p = &mut self.pipelines[idx];
        if p.targets.is_none() {
            let alias = p.cfg.alias().to_owned();
            let mut targets = es.alias_targets(&alias).await?;
            if targets.is_empty() {
                let index = format!("{alias}_v1");
                let props = mapping::properties(columns, &p.cfg.columns);
                let body = mapping::index_body(
                    props.clone(),
                    p.cfg.shards,
                    p.cfg.replicas,
                    &p.cfg.tombstone_retention,
                );
                es.create_index(&index, &body).await?;
                es.update_aliases(&[AliasAction::Add {
                    index: index.clone(),
                    alias: alias.clone(),
                }])
                .await?;
                tracing::info!(pipeline = %p.cfg.name, %index, %alias, "created index version 1 and its alias");
                p.mapped.extend(props.keys().cloned());
                targets = vec![index];
            }
            p.targets = Some(targets);
        }
        let targets = p.targets.clone().unwrap_or_default();
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
            for index in &targets {
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
        Ok(targets)
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
