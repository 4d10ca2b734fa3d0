//! Consistency checks: a check (started by an operator, or by a pipeline's
//! `check.daily_at` schedule) is cut into chunks of the root table's primary key, which
//! the chunked-run driver (`crate::chunked`) publishes and adds up; workers claim the
//! chunks and compare them (see the worker's `check` module). A chunk that cannot be
//! checked at all fails the check with its reason.
//!
//! A compare is such a check of a build held for verification (`pipelines build
//! --verify`) instead of the live version; its workers also set each document beside
//! the live version's copy (`LiveTally`). A clean compare is what lets `pipelines swap`
//! move the alias.

use sluice_model::RunKind;
use sluice_model::{BuildPhase, RunState};
use sluice_zk::layout::ChunkRecord;
use sluice_zk::Coordinator;

use crate::error::{CenterError, Result};
use crate::meta::{ChunkedRun, NewRun, StoredPipeline};
use crate::run;
use crate::Shared;

/// Root rows per check chunk.
const CHUNK_ROWS: u64 = 5_000;

/// Starts a check of `p`'s live version; a definite error says why it cannot start.
pub(crate) async fn start(
    shared: &Shared,
    epoch: u64,
    p: &StoredPipeline,
    since: &str,
    repair: bool,
    started_by: &str,
) -> Result<u64> {
    let since_ms = if since.is_empty() {
        None
    } else {
        let Ok(window) = humantime::parse_duration(since) else {
            return Err(CenterError::definite(format!(
                "since: `{since}` is not a duration like 24h or 7d"
            )));
        };
        if p.spec.check.updated_column.is_empty() {
            return Err(CenterError::definite(format!(
                "since: pipeline `{}` has no check.updated_column (the root column holding a row's last change time); check it whole, or set one",
                p.spec.name
            )));
        }
        Some(sluice_model::now_ms() - window.as_millis() as i64)
    };
    let check = NewRun {
        pipeline: &p.spec.name,
        version: p.live_or_first(),
        since,
        since_ms,
        repair,
        started_by,
        kind: RunKind::Check,
        scope: None,
    };
    shared
        .meta
        .start_run(epoch, &check)
        .await
        .map_err(CenterError::from)
}

/// Starts a compare of `p`'s held build; a definite error says why it cannot start.
pub(crate) async fn start_compare(
    shared: &Shared,
    coord: &Coordinator,
    epoch: u64,
    p: &StoredPipeline,
    repair: bool,
) -> Result<u64> {
    let progress = crate::build::status(coord, p).await?;
    if progress.phase != BuildPhase::Held {
        return Err(CenterError::definite(format!(
            "pipeline `{}` has no build held for verification (build phase: {}); `sluicectl pipelines build {} --verify` holds one once it caught up",
            p.spec.name, progress.phase, p.spec.name
        )));
    }
    let compare = NewRun {
        pipeline: &p.spec.name,
        version: p.building_version,
        since: "",
        since_ms: None,
        repair,
        started_by: "operator",
        kind: RunKind::Compare,
        scope: None,
    };
    shared
        .meta
        .start_run(epoch, &compare)
        .await
        .map_err(CenterError::from)
}

/// Whether `compare` (the newest of the held build of `p`) lets the alias move: `Err`
/// says why not.
pub(crate) fn clean(
    p: &StoredPipeline,
    compare: Option<&ChunkedRun>,
) -> std::result::Result<String, String> {
    let name = &p.spec.name;
    let Some(c) = compare.filter(|c| c.version == p.building_version) else {
        return Err(format!(
            "version {} was not compared yet: `sluicectl pipelines compare {name} --wait` (or swap with --force)",
            p.building_version
        ));
    };
    let t = &c.tally;
    match c.state {
        RunState::Running => Err(format!(
            "compare {} is still running: `sluicectl pipelines checks {name} --kind compare`",
            c.id
        )),
        RunState::Failed => Err(format!(
            "compare {} failed: {}",
            c.id,
            t.error.as_deref().unwrap_or("no reason given")
        )),
        _ if t.drift() > 0 => Err(format!(
            "compare {} found version {} differs from MySQL ({} missing, {} extra, {} different){}: compare again{} (or swap with --force)",
            c.id,
            c.version,
            t.missing,
            t.extra,
            t.different,
            if c.repair { " and repaired it" } else { "" },
            if c.repair { "" } else { " with --repair, then once more" },
        )),
        _ => Ok(format!("compare {}", c.id)),
    }
}

/// The root table's (and in parent-child mode each child kind's) primary-key chunks; a
/// definite error when the pipeline does not fit its tables.
pub(crate) async fn chunks(shared: &Shared, p: &StoredPipeline) -> Result<Vec<ChunkRecord>> {
    let src = run::source_of(shared, p).await?;
    let plans = sluice_mysql::docs::load(&src, &p.spec)
        .await?
        .map_err(|problems| run::unfit(&problems))?;
    let mut conn = src.reader_conn().await?;
    let mut chunks = Vec::new();
    for (kind, doc) in plans.iter().enumerate() {
        // A sharded root is cut shard by shard, each by its own primary key.
        for (shard, table) in doc.root.table.parts() {
            let bounds = table.chunk_bounds(&src, &mut conn, CHUNK_ROWS).await?;
            for mut chunk in ChunkRecord::cut(kind, &bounds).map_err(CenterError::definite)? {
                chunk.shard.clone_from(&shard);
                chunks.push(chunk);
            }
        }
    }
    let _ = conn.disconnect().await;
    Ok(chunks)
}

/// Starts the scheduled checks that are due.
pub(crate) async fn schedule(
    shared: &Shared,
    epoch: u64,
    pipelines: &[StoredPipeline],
) -> Result<()> {
    let scheduled: Vec<(&StoredPipeline, u32)> = pipelines
        .iter()
        .filter_map(|p| Some((p, p.spec.check.daily_minute()?)))
        .collect();
    if scheduled.is_empty() {
        return Ok(());
    }
    let now = sluice_model::now_ms();
    let last = shared.meta.last_scheduled_checks().await?;
    for (p, minute) in scheduled {
        if !run::due(now, minute, last.get(&p.spec.name).copied()) {
            continue;
        }
        let c = &p.spec.check;
        match start(shared, epoch, p, &c.since, c.repair, "schedule").await {
            Ok(id) => {
                tracing::info!(pipeline = %p.spec.name, check = id, "scheduled check started")
            }
            Err(why @ CenterError::Definite(_)) => {
                tracing::debug!(pipeline = %p.spec.name, %why, "scheduled check not started yet")
            }
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_model::RunKind;
    use sluice_zk::layout::{self, CheckTally};

    #[test]
    fn only_a_finished_clean_compare_of_the_held_version_releases_the_swap() {
        let p = StoredPipeline {
            spec: sluice_model::PipelineSpec::table("items", "s", "d", "items"),
            live_version: 2,
            building_version: 3,
            history: Default::default(),
        };
        let run = |version: u32, state: RunState, tally: CheckTally| ChunkedRun {
            id: 7,
            pipeline: "items".into(),
            version,
            since: String::new(),
            since_ms: None,
            repair: false,
            state,
            started_by: "operator".into(),
            chunks: 1,
            chunks_done: 1,
            tally,
            started_at_ms: 0,
            finished_at_ms: 0,
            kind: RunKind::Compare,
            changes: 0,
            scope: None,
        };
        let drift = CheckTally {
            missing: 1,
            ..CheckTally::default()
        };
        let live_only = CheckTally {
            live: layout::LiveTally {
                different: 4,
                ..Default::default()
            },
            ..CheckTally::default()
        };
        let refused = |c: Option<&ChunkedRun>, why: &str| {
            let e = clean(&p, c).unwrap_err();
            assert!(e.contains(why), "{e}");
        };
        refused(None, "not compared yet");
        refused(
            Some(&run(2, RunState::Done, CheckTally::default())),
            "not compared yet",
        );
        refused(
            Some(&run(3, RunState::Running, CheckTally::default())),
            "still running",
        );
        refused(Some(&run(3, RunState::Done, drift)), "differs from MySQL");
        assert_eq!(
            clean(&p, Some(&run(3, RunState::Done, live_only))),
            Ok("compare 7".to_owned()),
            "differences from the live version are no reason to refuse"
        );
    }
}
