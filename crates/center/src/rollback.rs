//! `pipelines rollback`: the alias moves back to a kept version the etl kept current.
//! Refused, with the reason, when that would serve anything but the table as it is: a
//! build under way (its swap would move the alias again), a version not kept current, one
//! whose mapping cannot take what the pipeline now asks for, one an etl member does not
//! write after a short wait (right after a swap the members are taking it up), one whose
//! index is gone.

use std::time::{Duration, Instant};

use sluice_elastic::{AliasAction, EsClient};
use sluice_zk::layout::{self, EtlRecord, NeedsRebuild};
use sluice_zk::Coordinator;

use crate::error::{CenterError, Result};
use crate::meta::StoredPipeline;
use crate::Shared;

/// How long a rollback waits for every etl member to write the versions it moves between
/// (a member takes up a new history within a reconcile pass or two of a swap).
const CATCH_UP: Duration = Duration::from_secs(20);
const CATCH_UP_POLL: Duration = Duration::from_millis(200);

/// Moves `p`'s alias to `to` (`None`: the newest current version); the version now live.
/// A refusal is a definite error with the reason. Safe to repeat after a failure halfway: the
/// alias move is idempotent and the meta database is written after it.
pub(crate) async fn rollback(
    shared: &Shared,
    es: &EsClient,
    coord: &Coordinator,
    epoch: u64,
    p: &StoredPipeline,
    to: Option<u32>,
) -> Result<u32> {
    let name = &p.spec.name;
    let live = p.live_or_first();
    if p.building_version > 0 {
        return Err(CenterError::definite(format!(
            "a build of version {} is under way and would move the alias again; reset it first (`pipelines reset {name}`)",
            p.building_version
        )));
    }
    let to = match p.history.rollback_target(to, live) {
        Ok(v) => v,
        Err(why) => return Err(CenterError::Definite(why)),
    };
    let verdicts: NeedsRebuild = coord
        .get_json(&layout::needs_rebuild(name))
        .await?
        .unwrap_or_default();
    if let Some(why) = verdicts.of(to) {
        return Err(CenterError::definite(format!(
            "version {to} cannot take what the pipeline now asks for ({why}); put back the spec it was built with, or build"
        )));
    }
    // Every etl member must already write both as history: the target (so it is
    // current) and the live one (so it stays current once the alias leaves it). Right
    // after a swap the members are still taking up the new history: waited for, briefly.
    let deadline = Instant::now() + CATCH_UP;
    loop {
        let behind = not_writing(coord, name, &[to, live]).await?;
        if behind.is_empty() {
            break;
        }
        if Instant::now() >= deadline {
            return Err(CenterError::definite(format!(
                "etl member(s) {} did not write versions {to} and {live} as history within {} s; check that they run and reach ZooKeeper",
                behind.join(", "),
                CATCH_UP.as_secs()
            )));
        }
        tokio::time::sleep(CATCH_UP_POLL).await;
    }
    let alias = &p.spec.alias;
    let target = sluice_elastic::versioned_index(alias, to);
    if !es.index_exists(&target).await? {
        return Err(CenterError::definite(format!(
            "the index {target} is gone; drop the version (`pipelines drop-version {name} {to}`) and build instead"
        )));
    }
    let mut actions: Vec<AliasAction> = es
        .alias_targets(alias)
        .await?
        .into_iter()
        .filter(|i| *i != target)
        .map(|index| AliasAction::Remove {
            index,
            alias: alias.clone(),
        })
        .collect();
    actions.push(AliasAction::add(&target, alias, p.spec.area_updates()));
    if shared.leading_epoch() != Some(epoch) {
        return Err(CenterError::Deposed(
            "this center stopped leading; send the rollback to the new leader".into(),
        ));
    }
    es.update_aliases(&actions).await?;
    let dropped = shared.meta.rolled_back(epoch, p, to).await?;
    tracing::info!(pipeline = %name, from = live, to, ?dropped, "alias moved back");
    Ok(to)
}

/// The etl members that do not write all of `versions` of `pipeline` as history.
async fn not_writing(coord: &Coordinator, pipeline: &str, versions: &[u32]) -> Result<Vec<String>> {
    let mut behind = Vec::new();
    for member in coord.children("etls").await? {
        let rec: Option<EtlRecord> = coord.get_json(&layout::etl(&member)).await?;
        if !rec.is_some_and(|r| r.writes_history(pipeline, versions)) {
            behind.push(member);
        }
    }
    Ok(behind)
}
