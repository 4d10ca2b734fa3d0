//! A pipeline's indexes: found behind its alias (or created, version 1 and the version
//! being built, with a mapping generated for its documents), then kept in step when the
//! tables or the pipeline change — in place where the server allows it, otherwise a
//! [`Verdict`] that the version needs a rebuild.

use std::collections::HashMap;

use serde_json::{json, Map, Value};
use sluice_elastic::{index_version, versioned_index, AliasAction, EsClient, EsError};
use sluice_model::ColumnInfo;

use crate::mapping;
use crate::pipeline::{Pipeline, Router, Verdict};

impl Router {
    /// A pipeline whose documents are change events' rows: its mapping comes from the
    /// columns the events carry, checked again whenever those change.
    pub async fn prepare(
        &mut self,
        es: &EsClient,
        idx: usize,
        columns: &[ColumnInfo],
    ) -> Result<(), EsError> {
        let p = &self.pipelines[idx];
        let unchanged = p.checked.len() == columns.len()
            && p.checked
                .iter()
                .zip(columns)
                .all(|(seen, c)| seen.name == c.name && seen.sql_type == c.sql_type);
        if p.targets.is_some() && unchanged {
            return Ok(());
        }
        let (props, ignored) =
            mapping::properties(columns, &p.cfg.spec.columns, &p.cfg.spec.fields);
        for why in ignored {
            tracing::warn!(pipeline = %p.cfg.spec.name, "{why}");
        }
        self.ensure(es, idx, props).await?;
        self.pipelines[idx].checked = columns.to_vec();
        Ok(())
    }

    /// Makes pipeline `idx` ready to write documents whose mapping is `wanted`: resolves
    /// the indexes behind its alias (creating `<alias>_v1` and pointing the alias at it
    /// when there is none, and the version being built), then, whenever `wanted` differs
    /// from the last check, brings every target's mapping in step: new fields and
    /// in-place changes are applied, anything else is a [`Verdict`] that the version
    /// needs a rebuild.
    pub async fn ensure(
        &mut self,
        es: &EsClient,
        idx: usize,
        wanted: Map<String, Value>,
    ) -> Result<(), EsError> {
        if self.pipelines[idx].targets.is_none() {
            self.resolve(es, idx, &wanted).await?;
        }
        let p = &mut self.pipelines[idx];
        if p.wanted.as_ref() == Some(&wanted) {
            return Ok(());
        }
        let alias = p.cfg.spec.alias();
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
        p.wanted = Some(wanted);
        Ok(())
    }

    /// Finds (or creates) the indexes pipeline `idx` writes to, with what they map now
    /// and whether their settings can become the pipeline's.
    async fn resolve(
        &mut self,
        es: &EsClient,
        idx: usize,
        props: &Map<String, Value>,
    ) -> Result<(), EsError> {
        let p = &mut self.pipelines[idx];
        let settings = mapping::IndexSettings {
            shards: p.cfg.spec.shards,
            replicas: p.cfg.spec.replicas,
            tombstone_retention: p.cfg.spec.tombstone_retention.clone(),
            refresh_interval: p.cfg.spec.refresh_interval.clone(),
        };
        let alias = p.cfg.spec.alias();
        let mut targets = es.alias_targets(&alias).await?;
        let mut created = Vec::new();
        if targets.is_empty() && p.cfg.building.is_none() {
            let index = versioned_index(&alias, 1);
            es.create_index(&index, &mapping::index_body(props.clone(), &settings))
                .await?;
            es.update_aliases(&[AliasAction::add(&index, &alias, p.in_parts)])
                .await?;
            tracing::info!(pipeline = %p.cfg.spec.name, %index, %alias, "created index version 1 and its alias");
            targets = vec![index.clone()];
            created.push(index);
        }
        if p.in_parts && created.is_empty() {
            // Written in parts: the alias hides tombstones, whenever it was made.
            let hiding: Vec<AliasAction> = (targets.iter())
                .map(|index| AliasAction::add(index, &alias, true))
                .collect();
            es.update_aliases(&hiding).await?;
        }
        if let Some(index) = p.building_index.clone() {
            // The version being built, written alongside the live ones. Nobody searches
            // it yet: no refreshes, no replicas while it fills; the center gives it the
            // pipeline's settings before the alias moves to it.
            if !targets.contains(&index) {
                let filling = mapping::IndexSettings {
                    replicas: 0,
                    refresh_interval: "-1".into(),
                    ..settings.clone()
                };
                // Idempotent: another etl member may have created it first.
                es.create_index(&index, &mapping::index_body(props.clone(), &filling))
                    .await?;
                targets.push(index);
            }
        }
        // Earlier versions kept for rollback take live changes too; one that is gone
        // (dropped, deleted by hand) is not made again.
        for v in &p.cfg.history {
            let index = versioned_index(&alias, *v);
            if !targets.contains(&index) && es.index_exists(&index).await? {
                targets.push(index);
            }
        }
        read_live(es, p, &targets, &created, &settings).await?;
        p.targets = Some(targets);
        p.wanted = None;
        Ok(())
    }

    /// The columns each flat pipeline's indexes were last checked against, by pipeline
    /// name.
    pub fn seen_columns(&self) -> HashMap<String, Vec<ColumnInfo>> {
        self.pipelines
            .iter()
            .filter(|p| !p.checked.is_empty())
            .map(|p| (p.cfg.spec.name.clone(), p.checked.clone()))
            .collect()
    }

    /// Prepares at once what this router can without waiting for a change: flat
    /// pipelines whose table's columns are `known` (from the router this one replaces),
    /// and every pipeline read back from MySQL. A changed override or setting of a quiet
    /// table is applied, or marked as needing a rebuild, without waiting for the table's
    /// next change.
    pub async fn check_known(&mut self, es: &EsClient, known: &HashMap<String, Vec<ColumnInfo>>) {
        for idx in 0..self.pipelines.len() {
            let checked = if self.pipelines[idx].is_tree() {
                self.ready_tree(es, idx, None)
                    .await
                    .map_err(|e| e.to_string())
            } else {
                let Some(columns) = known.get(&self.pipelines[idx].cfg.spec.name) else {
                    continue;
                };
                self.prepare(es, idx, columns)
                    .await
                    .map_err(|e| e.to_string())
            };
            if let Err(e) = checked {
                tracing::warn!(pipeline = %self.pipelines[idx].cfg.spec.name, error = %e, "cannot check the index now; its next change will");
                self.pipelines[idx].forget();
            }
        }
    }
}

/// What each of a pipeline's indexes maps now; the settings the pipeline changed since an
/// index was made are changed in place, or noted as unfit when they cannot be.
async fn read_live(
    es: &EsClient,
    p: &mut Pipeline,
    targets: &[String],
    created: &[String],
    settings: &mapping::IndexSettings,
) -> Result<(), EsError> {
    p.live.clear();
    p.unfit_settings.clear();
    for index in targets {
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
    Ok(())
}
