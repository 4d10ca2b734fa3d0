//! `pipelines rollback`: the alias moves back to a kept version the etl kept current.
//! Refused, with the reason, when that would serve anything but the table as it is: a
//! build under way (its swap would move the alias again), a version not kept current, one
//! whose mapping cannot take what the pipeline now asks for, one an etl member does not
//! write after a short wait (right after a swap the members are taking it up), one whose
//! index is gone. One rollback of a pipeline at a time; each check is made again on the
//! pipeline as it stands after the wait.

use std::collections::BTreeSet;
use std::sync::Mutex;
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
const CATCH_UP_POLL: Duration = Duration::from_millis(250);

/// The pipelines being rolled back on this center: a second rollback of one is refused
/// while the first runs (they would move the alias from the same version).
#[derive(Default)]
pub(crate) struct Rollbacks(Mutex<BTreeSet<String>>);

/// A pipeline's place in [`Rollbacks`], given up when dropped.
struct Underway<'a> {
    of: &'a Rollbacks,
    name: String,
}

impl Rollbacks {
    fn begin(&self, name: &str) -> Result<Underway<'_>> {
        let mut underway = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if !underway.insert(name.to_owned()) {
            return Err(CenterError::definite(format!(
                "a rollback of `{name}` is under way; look at the pipeline again once it is done"
            )));
        }
        Ok(Underway {
            of: self,
            name: name.to_owned(),
        })
    }
}

impl Drop for Underway<'_> {
    fn drop(&mut self) {
        let mut underway = self.of.0.lock().unwrap_or_else(|e| e.into_inner());
        underway.remove(&self.name);
    }
}

/// Moves pipeline `name`'s alias to `to` (`None`: the newest current version); the version
/// now live. A refusal is a definite error with the reason. Safe to repeat after a failure
/// halfway: the alias move is idempotent and the meta database is written after it.
pub(crate) async fn rollback(
    shared: &Shared,
    es: &EsClient,
    coord: &Coordinator,
    epoch: u64,
    name: &str,
    to: Option<u32>,
) -> Result<u32> {
    let _underway = shared.rollbacks.begin(name)?;
    let deadline = Instant::now() + CATCH_UP;
    let (p, to) = loop {
        let p = stored(shared, name).await?;
        let (to, live) = target(coord, &p, to).await?;
        // Every etl member must already write both as history: the target (so it is
        // current) and the live one (so it stays current once the alias leaves it).
        let behind = not_writing(coord, name, &[to, live]).await?;
        if behind.is_empty() {
            break (p, to);
        }
        if shared.leading_epoch() != Some(epoch) {
            return Err(deposed());
        }
        if Instant::now() >= deadline {
            return Err(CenterError::definite(format!(
                "etl member(s) {} did not take up versions {to} and {live} as history within {} s; the leader announces them at its next reconcile pass, so retry, or check the members' logs",
                behind.join(", "),
                CATCH_UP.as_secs()
            )));
        }
        tokio::time::sleep(CATCH_UP_POLL).await;
    };
    let alias = &p.spec.alias;
    let index = sluice_elastic::versioned_index(alias, to);
    if !es.index_exists(&index).await? {
        return Err(CenterError::definite(format!(
            "the index {index} is gone; drop the version (`pipelines drop-version {name} {to}`) and build instead"
        )));
    }
    let mut actions: Vec<AliasAction> = es
        .alias_targets(alias)
        .await?
        .into_iter()
        .filter(|i| *i != index)
        .map(|index| AliasAction::Remove {
            index,
            alias: alias.clone(),
        })
        .collect();
    actions.push(AliasAction::add(&index, alias, p.spec.area_updates()));
    if shared.leading_epoch() != Some(epoch) {
        return Err(deposed());
    }
    es.update_aliases(&actions).await?;
    let dropped = shared.meta.rolled_back(epoch, &p, to).await?;
    tracing::info!(pipeline = %name, from = p.live_or_first(), to, ?dropped, "alias moved back");
    Ok(to)
}

fn deposed() -> CenterError {
    CenterError::Deposed("this center stopped leading; send the rollback to the new leader".into())
}

async fn stored(shared: &Shared, name: &str) -> Result<StoredPipeline> {
    shared
        .meta
        .pipeline(name)
        .await?
        .ok_or_else(|| CenterError::definite(format!("no pipeline `{name}`")))
}

/// The version `p`'s alias would move to and the live one it leaves, or why it may not.
async fn target(coord: &Coordinator, p: &StoredPipeline, to: Option<u32>) -> Result<(u32, u32)> {
    let name = &p.spec.name;
    let live = p.live_or_first();
    if p.building_version > 0 {
        return Err(CenterError::definite(format!(
            "a build of version {} is under way and would move the alias again; reset it first (`pipelines reset {name}`)",
            p.building_version
        )));
    }
    let to = p
        .history
        .rollback_target(to, live)
        .map_err(CenterError::Definite)?;
    // What the etl is not told to write as history it never will: no wait helps.
    let announced = p.announced_history();
    if !announced.contains(&to) || !announced.contains(&live) {
        return Err(CenterError::definite(format!(
            "versions {to} and {live} are not both written as history (keep_history is {}); build instead",
            p.spec.keep_history
        )));
    }
    let verdicts: NeedsRebuild = coord
        .get_json(&layout::needs_rebuild(name))
        .await?
        .unwrap_or_default();
    if let Some(why) = verdicts.of(to) {
        return Err(CenterError::definite(format!(
            "version {to} cannot take what the pipeline now asks for ({why}); put back the spec it was built with, or build"
        )));
    }
    Ok((to, live))
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_rollback_of_a_pipeline_is_refused_until_the_first_ends() {
        let rollbacks = Rollbacks::default();
        let first = rollbacks.begin("items").expect("the first begins");
        let refused = rollbacks.begin("items").err().expect("a second is refused");
        assert!(refused.to_string().contains("under way"), "{refused}");
        rollbacks.begin("notes").expect("another pipeline's begins");
        drop(first);
        rollbacks
            .begin("items")
            .expect("one begins again once the first ended");
    }
}
