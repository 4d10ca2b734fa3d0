//! The driver of the chunked runs — checks, compares and delayed jobs — one mechanism for
//! all three: a run (started by an operator, or by a schedule) is planned into chunks
//! (`check::plan` cuts the root table's primary key; `delayed::plan` lists the root keys
//! of the documents its claimed changes reach), published in ZooKeeper
//! (`checks/<pipeline>`), claimed and worked by the workers (see the worker's `check`
//! module), and each pass of the leader adds up their results into the meta database; the
//! run ends once every chunk has one. A run that cannot be planned or worked fails with its
//! reason; a transient failure is tried again on the next pass.

use sluice_model::RunKind;
use sluice_model::RunState;
use sluice_zk::layout::{self, CheckRecord, CheckTally, ChunkRecord};
use sluice_zk::{Coordinator, Expect};

use crate::error::{CenterError, Result};
use crate::meta::{ChunkedRun, StoredPipeline};
use crate::term::Term;
use crate::{check, delayed, Shared};

/// One pass over every running run; starts the scheduled checks and delayed jobs that are
/// due. Returns whether a run is under way (the leader then looks again soon: results
/// fire no watch).
pub(crate) async fn drive(
    shared: &Shared,
    term: &Term<'_>,
    pipelines: &[StoredPipeline],
) -> Result<bool> {
    let (coord, epoch) = (term.coord, term.epoch());
    check::schedule(shared, epoch, pipelines).await?;
    delayed::schedule(shared, epoch, pipelines).await?;
    let latest = shared.meta.latest_runs().await?;
    let running: Vec<&ChunkedRun> = latest
        .iter()
        .filter(|c| c.state == RunState::Running)
        .collect();
    // Leftovers of checks that ended (or were replaced).
    for name in coord.children("checks").await? {
        let rec: Option<CheckRecord> = coord.get_json(&layout::check(&name)).await.ok().flatten();
        if !rec.is_some_and(|r| running.iter().any(|c| c.id == r.id)) {
            term.acting()?;
            coord.delete(&layout::check(&name), None, true).await?;
        }
    }
    let mut gauges = Vec::new();
    for run in &latest {
        if run.state != RunState::Running {
            gauges.push((
                run.pipeline.clone(),
                gauge(run, run.chunks_done, &run.tally, false),
                run.kind,
            ));
            continue;
        }
        match drive_one(shared, term, run, pipelines).await {
            Ok((name, g)) => gauges.push((name, g, run.kind)),
            Err(e) if e.ends_the_term() => return Err(e),
            Err(e @ CenterError::Transient(_)) => {
                tracing::warn!(pipeline = %run.pipeline, check = run.id, error = %e, "check step failed; it is tried again on the next pass");
            }
            Err(e) => {
                // Retrying cannot mend it: the run fails with the reason.
                tracing::warn!(pipeline = %run.pipeline, check = run.id, error = %e, "check failed");
                let tally = CheckTally {
                    error: Some(e.to_string()),
                    ..run.tally.clone()
                };
                term.acting()?;
                let done = run.chunks_done;
                shared
                    .meta
                    .finish_run(term.epoch(), run, done, &tally)
                    .await?;
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
    term: &Term<'_>,
    run: &ChunkedRun,
    pipelines: &[StoredPipeline],
) -> Result<(String, crate::metrics::CheckGauge)> {
    let (coord, epoch) = (term.coord, term.epoch());
    let name = &run.pipeline;
    let mut tally = CheckTally::default();
    let Some(p) = pipelines.iter().find(|p| p.spec.name == *name) else {
        tally.error = Some("the pipeline was deleted".into());
        shared
            .meta
            .finish_run(epoch, run, run.chunks_done, &tally)
            .await?;
        return Ok((name.clone(), gauge(run, run.chunks_done, &tally, false)));
    };
    let rec: Option<CheckRecord> = coord.get_json(&layout::check(name)).await?;
    let Some(rec) = rec.filter(|r| r.id == run.id && r.chunks > 0) else {
        let planned = match run.kind {
            RunKind::Delayed => delayed::chunks(shared, p, run).await,
            RunKind::Resync => crate::resync::chunks(shared, p, run).await,
            RunKind::Check | RunKind::Compare => check::chunks(shared, p).await,
        };
        let chunks = match planned {
            Ok(chunks) => chunks,
            Err(e) if e.ends_the_term() => return Err(e),
            Err(e @ CenterError::Transient(_)) => {
                tracing::warn!(pipeline = %name, check = run.id, error = %e, "cannot plan the check; it is tried again on the next pass");
                return Ok((name.clone(), gauge(run, 0, &tally, true)));
            }
            Err(why) => {
                tally.error = Some(why.to_string());
                shared.meta.finish_run(epoch, run, 0, &tally).await?;
                return Ok((name.clone(), gauge(run, 0, &tally, false)));
            }
        };
        if chunks.is_empty() {
            // A delayed job whose changes reach no document, a resync of no id.
            shared.meta.finish_run(epoch, run, 0, &tally).await?;
            return Ok((name.clone(), gauge(run, 0, &tally, false)));
        }
        publish(term, run, p, &chunks).await?;
        shared
            .meta
            .run_progress(epoch, run.id, chunks.len() as u32, 0, &tally)
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
        term.acting()?;
        shared.meta.finish_run(epoch, run, done, &tally).await?;
        coord.delete(&layout::check(name), None, true).await?;
        tracing::info!(pipeline = %name, check = run.id, keys = tally.keys, drift = tally.drift(), "check ended");
        return Ok((name.clone(), gauge(run, done, &tally, false)));
    }
    if done != run.chunks_done || tally != run.tally {
        shared
            .meta
            .run_progress(epoch, run.id, rec.chunks, done, &tally)
            .await?;
    }
    Ok((name.clone(), gauge(run, done, &tally, true)))
}

fn gauge(
    run: &ChunkedRun,
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

/// Writes the check for the workers: its record without chunks first (so a worker that
/// sees it early claims nothing), the chunks, then the record with their number.
async fn publish(
    term: &Term<'_>,
    run: &ChunkedRun,
    p: &StoredPipeline,
    chunks: &[ChunkRecord],
) -> Result<()> {
    let coord = term.coord;
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
        condition: run
            .scope
            .as_ref()
            .map(|s| s.condition.trim().to_owned())
            .filter(|c| !c.is_empty()),
    };
    term.acting()?;
    coord.delete(&layout::check(name), None, true).await?;
    put(coord, &layout::check(name), &rec).await?;
    for (n, chunk) in chunks.iter().enumerate() {
        put(coord, &layout::check_chunk(name, n as u32), chunk).await?;
    }
    rec.chunks = chunks.len() as u32;
    put(coord, &layout::check(name), &rec).await
}

async fn put(coord: &Coordinator, at: &str, value: &impl serde::Serialize) -> Result<()> {
    coord
        .put(at, &serde_json::to_vec(value)?, Expect::Any)
        .await?;
    Ok(())
}
