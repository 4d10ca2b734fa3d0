//! Consistency checks, driven by the leader: a check (started by an operator, or by a
//! pipeline's `check.daily_at` schedule) is cut into chunks of the root table's primary
//! key and published in ZooKeeper (`checks/<pipeline>`); workers claim the chunks and
//! compare them (see the worker's `check` module); each pass adds up their results into
//! the meta database, and the check ends once every chunk has one. A chunk that cannot
//! be checked at all fails the check with its reason.
//!
//! A compare is such a check of a build held for verification (`pipelines build
//! --verify`) instead of the live version; its workers also set each document beside
//! the live version's copy (`LiveTally`). A clean compare is what lets `pipelines swap`
//! move the alias.

use anyhow::Context as _;
use sluice_zk::layout::{self, CheckRecord, CheckTally, ChunkRecord, RunKind};
use sluice_zk::{Coordinator, Expect};

use crate::meta::{CheckRun, NewCheck, StoredPipeline};
use crate::run;
use crate::Shared;

/// Root rows per check chunk.
const CHUNK_ROWS: u64 = 5_000;

/// Starts a check of `p`'s live version; `Err` says why it cannot start.
pub(crate) async fn start(
    shared: &Shared,
    epoch: u64,
    p: &StoredPipeline,
    since: &str,
    repair: bool,
    started_by: &str,
) -> anyhow::Result<Result<u64, String>> {
    let since_ms = if since.is_empty() {
        None
    } else {
        let Ok(window) = humantime::parse_duration(since) else {
            return Ok(Err(format!(
                "since: `{since}` is not a duration like 24h or 7d"
            )));
        };
        if p.spec.check.updated_column.is_empty() {
            return Ok(Err(format!(
                "since: pipeline `{}` has no check.updated_column (the root column holding a row's last change time); check it whole, or set one",
                p.spec.name
            )));
        }
        Some(sluice_model::now_ms() - window.as_millis() as i64)
    };
    let check = NewCheck {
        pipeline: &p.spec.name,
        version: p.live_or_first(),
        since,
        since_ms,
        repair,
        started_by,
        kind: RunKind::Check,
    };
    Ok(shared.meta.start_check(epoch, &check).await?)
}

/// Starts a compare of `p`'s held build; `Err` says why it cannot start.
pub(crate) async fn start_compare(
    shared: &Shared,
    coord: &Coordinator,
    epoch: u64,
    p: &StoredPipeline,
    repair: bool,
) -> anyhow::Result<Result<u64, String>> {
    let status = crate::build::status(coord, p).await?;
    if status.phase != "held" {
        return Ok(Err(format!(
            "pipeline `{}` has no build held for verification (build phase: {}); `sluicectl pipelines build {} --verify` holds one once it caught up",
            p.spec.name, status.phase, p.spec.name
        )));
    }
    let compare = NewCheck {
        pipeline: &p.spec.name,
        version: p.building_version,
        since: "",
        since_ms: None,
        repair,
        started_by: "operator",
        kind: RunKind::Compare,
    };
    Ok(shared.meta.start_check(epoch, &compare).await?)
}

/// Whether `compare` (the newest of the held build of `p`) lets the alias move: `Err`
/// says why not.
pub(crate) fn clean(p: &StoredPipeline, compare: Option<&CheckRun>) -> Result<String, String> {
    let name = &p.spec.name;
    let Some(c) = compare.filter(|c| c.version == p.building_version) else {
        return Err(format!(
            "version {} was not compared yet: `sluicectl pipelines compare {name} --wait` (or swap with --force)",
            p.building_version
        ));
    };
    let t = &c.tally;
    match c.state.as_str() {
        "running" => Err(format!(
            "compare {} is still running: `sluicectl pipelines checks {name} --kind compare`",
            c.id
        )),
        "failed" => Err(format!(
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

/// One pass over every running check; starts the scheduled ones that are due. Returns
/// whether a check runs (the leader then looks again soon: results fire no watch).
pub(crate) async fn drive(
    shared: &Shared,
    coord: &Coordinator,
    epoch: u64,
    acting: &impl Fn() -> anyhow::Result<()>,
    pipelines: &[StoredPipeline],
) -> anyhow::Result<bool> {
    schedule(shared, epoch, pipelines).await?;
    crate::delayed::schedule(shared, epoch, pipelines).await?;
    let latest = shared.meta.latest_checks().await?;
    let running: Vec<&CheckRun> = latest.iter().filter(|c| c.state == "running").collect();
    // Leftovers of checks that ended (or were replaced).
    for name in coord.children("checks").await? {
        let rec: Option<CheckRecord> = coord.get_json(&layout::check(&name)).await.ok().flatten();
        if !rec.is_some_and(|r| running.iter().any(|c| c.id == r.id)) {
            acting()?;
            coord.delete(&layout::check(&name), None, true).await?;
        }
    }
    let mut gauges = Vec::new();
    for run in &latest {
        if run.state != "running" {
            gauges.push((
                run.pipeline.clone(),
                gauge(run, run.chunks_done, &run.tally, false),
                run.kind,
            ));
            continue;
        }
        match drive_one(shared, coord, epoch, acting, run, pipelines).await {
            Ok((name, g)) => gauges.push((name, g, run.kind)),
            Err(e) => {
                tracing::warn!(pipeline = %run.pipeline, check = run.id, error = format!("{e:#}"), "check step failed; retrying");
                if crate::term::is_deposed(&e) {
                    return Err(e);
                }
            }
        }
    }
    // The drift gauges are the live versions' (a compare's is a held build's).
    crate::metrics::update(|g| {
        g.checks = gauges
            .into_iter()
            .filter(|(name, _, kind)| {
                kind.is_check() && pipelines.iter().any(|p| p.spec.name == *name)
            })
            .map(|(name, gauge, _)| (name, gauge))
            .collect();
    });
    Ok(!running.is_empty())
}

/// Plans a check not published yet, or adds up its results (and ends it once complete).
async fn drive_one(
    shared: &Shared,
    coord: &Coordinator,
    epoch: u64,
    acting: &impl Fn() -> anyhow::Result<()>,
    run: &CheckRun,
    pipelines: &[StoredPipeline],
) -> anyhow::Result<(String, crate::metrics::CheckGauge)> {
    let name = &run.pipeline;
    let mut tally = CheckTally::default();
    let Some(p) = pipelines.iter().find(|p| p.spec.name == *name) else {
        tally.error = Some("the pipeline was deleted".into());
        shared
            .meta
            .finish_check(epoch, run, run.chunks_done, &tally)
            .await?;
        return Ok((name.clone(), gauge(run, run.chunks_done, &tally, false)));
    };
    let rec: Option<CheckRecord> = coord.get_json(&layout::check(name)).await?;
    let Some(rec) = rec.filter(|r| r.id == run.id && r.chunks > 0) else {
        let planned = if run.kind == RunKind::Delayed {
            crate::delayed::plan(shared, p, run).await
        } else {
            plan(shared, p).await
        };
        let chunks = match planned {
            Ok(Ok(chunks)) => chunks,
            Ok(Err(why)) => {
                tally.error = Some(why);
                shared.meta.finish_check(epoch, run, 0, &tally).await?;
                return Ok((name.clone(), gauge(run, 0, &tally, false)));
            }
            Err(e) => {
                tracing::warn!(pipeline = %name, check = run.id, error = format!("{e:#}"), "cannot plan the check; retrying");
                return Ok((name.clone(), gauge(run, 0, &tally, true)));
            }
        };
        if chunks.is_empty() {
            // A delayed job whose changes reach no document.
            shared.meta.finish_check(epoch, run, 0, &tally).await?;
            return Ok((name.clone(), gauge(run, 0, &tally, false)));
        }
        publish(coord, acting, run, p, &chunks).await?;
        shared
            .meta
            .check_progress(epoch, run.id, chunks.len() as u32, 0, &tally)
            .await?;
        tracing::info!(pipeline = %name, check = run.id, chunks = chunks.len(), "check planned");
        return Ok((name.clone(), gauge(run, 0, &tally, true)));
    };
    let results = layout::check_results(name);
    let done = coord.children(&results).await?;
    for n in &done {
        if let Some(t) = coord
            .get_json::<CheckTally>(&format!("{results}/{n}"))
            .await?
        {
            tally.add(&t);
        }
    }
    let done = done.len() as u32;
    if done >= rec.chunks || tally.error.is_some() {
        acting()?;
        shared.meta.finish_check(epoch, run, done, &tally).await?;
        coord.delete(&layout::check(name), None, true).await?;
        tracing::info!(pipeline = %name, check = run.id, keys = tally.keys, drift = tally.drift(), "check ended");
        return Ok((name.clone(), gauge(run, done, &tally, false)));
    }
    if done != run.chunks_done || tally != run.tally {
        shared
            .meta
            .check_progress(epoch, run.id, rec.chunks, done, &tally)
            .await?;
    }
    Ok((name.clone(), gauge(run, done, &tally, true)))
}

fn gauge(
    run: &CheckRun,
    done: u32,
    tally: &CheckTally,
    running: bool,
) -> crate::metrics::CheckGauge {
    crate::metrics::CheckGauge {
        running,
        chunks: run.chunks.max(done),
        chunks_done: done,
        tally: tally.clone(),
    }
}

/// The root table's (and in parent-child mode each child kind's) primary-key chunks;
/// `Err` when the pipeline does not fit its tables.
async fn plan(
    shared: &Shared,
    p: &StoredPipeline,
) -> anyhow::Result<Result<Vec<ChunkRecord>, String>> {
    let src = run::source_of(shared, p).await?;
    let plans = match sluice_mysql::docs::load(&src, &p.spec).await? {
        Ok(plans) => plans,
        Err(problems) => return Ok(Err(run::unfit(&problems))),
    };
    let mut conn = mysql_async::Conn::new(src.reader_opts())
        .await
        .with_context(|| format!("cannot connect to source {}", src.name))?;
    let mut chunks = Vec::new();
    for (kind, doc) in plans.iter().enumerate() {
        let bounds = doc
            .root
            .table
            .chunk_bounds(&src, &mut conn, CHUNK_ROWS)
            .await?;
        chunks.extend(ChunkRecord::cut(kind, &bounds)?);
    }
    let _ = conn.disconnect().await;
    Ok(Ok(chunks))
}

/// Writes the check for the workers: its record without chunks first (so a worker that
/// sees it early claims nothing), the chunks, then the record with their number.
async fn publish(
    coord: &Coordinator,
    acting: &impl Fn() -> anyhow::Result<()>,
    run: &CheckRun,
    p: &StoredPipeline,
    chunks: &[ChunkRecord],
) -> anyhow::Result<()> {
    let name = &p.spec.name;
    let mut rec = CheckRecord {
        id: run.id,
        spec: p.spec.clone(),
        version: run.version,
        since_ms: run.since_ms,
        repair: run.repair,
        chunks: 0,
        kind: run.kind,
        // A compare also reads the live version, if there is one besides the held one.
        against: match run.kind {
            RunKind::Compare if p.live_version != run.version => p.live_version,
            _ => 0,
        },
    };
    acting()?;
    coord.delete(&layout::check(name), None, true).await?;
    put(coord, &layout::check(name), &rec).await?;
    for (n, chunk) in chunks.iter().enumerate() {
        put(coord, &layout::check_chunk(name, n as u32), chunk).await?;
    }
    rec.chunks = chunks.len() as u32;
    put(coord, &layout::check(name), &rec).await
}

async fn put(coord: &Coordinator, at: &str, value: &impl serde::Serialize) -> anyhow::Result<()> {
    coord
        .put(at, &serde_json::to_vec(value)?, Expect::Any)
        .await?;
    Ok(())
}

/// Starts the scheduled checks that are due.
async fn schedule(shared: &Shared, epoch: u64, pipelines: &[StoredPipeline]) -> anyhow::Result<()> {
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
        match start(shared, epoch, p, &c.since, c.repair, "schedule").await? {
            Ok(id) => {
                tracing::info!(pipeline = %p.spec.name, check = id, "scheduled check started")
            }
            Err(why) => {
                tracing::debug!(pipeline = %p.spec.name, %why, "scheduled check not started yet")
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_finished_clean_compare_of_the_held_version_releases_the_swap() {
        let p = StoredPipeline {
            spec: sluice_model::PipelineSpec::table("items", "s", "d", "items"),
            live_version: 2,
            building_version: 3,
            history: Default::default(),
        };
        let run = |version: u32, state: &str, tally: CheckTally| CheckRun {
            id: 7,
            pipeline: "items".into(),
            version,
            since: String::new(),
            since_ms: None,
            repair: false,
            state: state.into(),
            started_by: "operator".into(),
            chunks: 1,
            chunks_done: 1,
            tally,
            started_at_ms: 0,
            finished_at_ms: 0,
            kind: RunKind::Compare,
            changes: 0,
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
        let refused = |c: Option<&CheckRun>, why: &str| {
            let e = clean(&p, c).unwrap_err();
            assert!(e.contains(why), "{e}");
        };
        refused(None, "not compared yet");
        refused(
            Some(&run(2, "done", CheckTally::default())),
            "not compared yet",
        );
        refused(
            Some(&run(3, "running", CheckTally::default())),
            "still running",
        );
        refused(Some(&run(3, "done", drift)), "differs from MySQL");
        assert_eq!(
            clean(&p, Some(&run(3, "done", live_only))),
            Ok("compare 7".to_owned()),
            "differences from the live version are no reason to refuse"
        );
    }
}
