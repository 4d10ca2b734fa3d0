//! Resyncs on demand: an operator names documents — the root rows matching a condition,
//! or a list of `_id`s — and they are rebuilt the way a delayed job's are: read in
//! consistent snapshots by the workers and sent through the etl at the snapshot's
//! version, so a change newer than the read always wins over it. A condition is cut
//! into the root table's key ranges (each read narrowed by it); ids into lists of keys.

use serde_json::Value as Json;
use sluice_model::{ResyncScope, RunKind};
use sluice_mysql::docs::DocPlan;
use sluice_zk::layout::ChunkRecord;

use crate::error::{CenterError, Result};
use crate::meta::{ChunkedRun, NewRun, StoredPipeline};
use crate::run;
use crate::Shared;

/// Documents per chunk of a resync by ids.
const CHUNK_KEYS: usize = 1_000;

/// Whether `scope` names documents of `p`: the inner `Err` names the field at fault (no
/// condition nor ids, a condition that is no filter or names a column the root table
/// lacks, an id that fits no document).
pub(crate) async fn validate(
    shared: &Shared,
    p: &StoredPipeline,
    scope: &ResyncScope,
) -> Result<std::result::Result<(), String>> {
    if let Err((field, why)) = scope.check() {
        return Ok(Err(format!("{field}: {why}")));
    }
    let (_, plans) = plans(shared, p).await?;
    if scope.ids.is_empty() {
        return Ok(plans
            .iter()
            .try_for_each(|plan| unknown_columns(plan, &scope.condition)));
    }
    Ok(keys_of_ids(&plans, &scope.ids).map(|_| ()))
}

/// Starts a resync of `p`'s documents that `scope` names ([`validate`] it first); a
/// definite error says why it cannot start (a check or a job runs).
pub(crate) async fn start(
    shared: &Shared,
    epoch: u64,
    p: &StoredPipeline,
    scope: &ResyncScope,
    started_by: &str,
) -> Result<u64> {
    let job = NewRun {
        pipeline: &p.spec.name,
        version: p.live_or_first(),
        since: "",
        since_ms: None,
        repair: true,
        started_by,
        kind: RunKind::Resync,
        scope: Some(scope),
    };
    shared
        .meta
        .start_run(epoch, &job)
        .await
        .map_err(CenterError::from)
}

/// `p`'s source and its documents compiled against the tables as they are now.
pub(crate) async fn plans(
    shared: &Shared,
    p: &StoredPipeline,
) -> Result<(sluice_mysql::SourceConfig, Vec<DocPlan>)> {
    let src = run::source_of(shared, p).await?;
    let plans = sluice_mysql::docs::load(&src, &p.spec)
        .await?
        .map_err(|problems| run::unfit(&problems))?;
    Ok((src, plans))
}

/// `Err` when `condition` names a column the root table of `plan` does not have.
fn unknown_columns(plan: &DocPlan, condition: &str) -> std::result::Result<(), String> {
    let named = sluice_model::pipeline::filter::check(condition)
        .map_err(|why| format!("where: the condition {why}"))?;
    let table = &plan.root.table;
    match named.iter().find(|name| {
        !table
            .infos
            .iter()
            .any(|c| c.name.eq_ignore_ascii_case(name))
    }) {
        Some(name) => Err(format!(
            "where: the condition names column `{name}`, which {}.{} does not have",
            table.db, table.table
        )),
        None => Ok(()),
    }
}

/// The chunks of resync `run`: key ranges of each document kind's root table (read
/// narrowed by the condition), or its ids as lists of keys.
pub(crate) async fn chunks(
    shared: &Shared,
    p: &StoredPipeline,
    run: &ChunkedRun,
) -> Result<Vec<ChunkRecord>> {
    let scope = run.scope.clone().unwrap_or_default();
    if scope.ids.is_empty() {
        return crate::check::chunks(shared, p).await;
    }
    let (_, plans) = plans(shared, p).await?;
    let keys = keys_of_ids(&plans, &scope.ids).map_err(CenterError::definite)?;
    let mut chunks = Vec::new();
    for (kind, keys) in keys.into_iter().enumerate() {
        for part in keys.chunks(CHUNK_KEYS) {
            chunks.push(ChunkRecord {
                kind,
                lower: Json::Null,
                upper: Json::Null,
                keys: part.to_vec(),
                shard: None,
            });
        }
    }
    Ok(chunks)
}

/// Each id's key values (its document kind's id columns), by kind. `Err` names an id
/// that fits no kind.
fn keys_of_ids(plans: &[DocPlan], ids: &[String]) -> std::result::Result<Vec<Vec<Json>>, String> {
    let mut out = vec![Vec::new(); plans.len()];
    for id in ids {
        let (kind, values) = key_of_id(plans, id).map_err(|why| format!("ids: {why}"))?;
        out[kind].push(Json::Array(values));
    }
    Ok(out)
}

/// The document kind of `_id` and its id values: a child document of a parent-child
/// pipeline is `<kind>#<id>`. `Err` says why it fits no kind (the caller names its field).
pub(crate) fn key_of_id(
    plans: &[DocPlan],
    id: &str,
) -> std::result::Result<(usize, Vec<Json>), String> {
    let child = id.split_once('#').and_then(|(name, rest)| {
        let k = plans
            .iter()
            .position(|p| p.name == name && p.join.as_ref().is_some_and(|j| j.parent.is_some()))?;
        Some((k, rest))
    });
    let (kind, rest) = child.unwrap_or((0, id));
    let n = plans[kind].id.len();
    let values = sluice_model::event::id_values(rest, n).ok_or_else(|| {
        format!("`{id}` is not an id of this pipeline's documents ({n} values joined by `:`)")
    })?;
    Ok((kind, values))
}
