//! Zero-downtime builds, driven by the leader from what ZooKeeper and the meta database
//! hold (nothing in memory), one step per reconcile pass:
//!
//! 1. **waiting for etl** — the pipeline's record names the version being built; every
//!    live etl member must say (`etls/<member>`) that it writes live changes to it before
//!    anything is read, or a change applied in between would be missing from it.
//! 2. **planning** — a worker cuts the table into primary-key chunks.
//! 3. **snapshotting** — chunks are spread over the live workers (a dead worker's chunks
//!    move; each resumes from its fenced cursor).
//! 4. **catching up** — a worker writes a marker to every partition of the change topic;
//!    once the etl applied the marker on each, every snapshot row is in the new index.
//! 5. **held** (builds with `verify` only) — the new version gets the pipeline's settings
//!    and becomes searchable, and stays beside the live one, both taking live changes,
//!    until an operator releases the swap: after a compare (`crate::check`, kind
//!    `compare`) found it equal to MySQL, or by force.
//! 6. **swap** — the alias moves to the new version in one `_aliases` call; the versions it
//!    pointed to become history, kept current for rollback when the etl was writing them
//!    as history (step 1 waits for that too; see `crate::history`). Until then searches
//!    use the old version untouched.
//!
//! A reset abandons the build: its index is deleted once no etl writes to it. So does a
//! failure: a job that fails [`MAX_DEFINITE_FAILURES`] times with an error only an
//! operator can fix (the workers count them) fails the build, with the reason, the alias
//! untouched; so does a step of the leader's that meets such an error (Elasticsearch
//! refusing the new index's settings, say). Transient errors are retried without end.

use std::collections::BTreeMap;

use serde_json::json;
use sluice_elastic::{AliasAction, EsClient};
use sluice_model::BuildPhase;
use sluice_proto::v1::BuildStatus;
use sluice_zk::layout::{
    self, BuildRecord, ChunkCursor, EtlRecord, JobFailure, JobRecord, PlanRecord,
};
use sluice_zk::{Coordinator, Expect};

use crate::error::{CenterError, Context as _, Result};
use crate::known::Dirs;
use crate::meta::StoredPipeline;
use crate::term::Term;
use crate::Shared;

/// Default rows per chunk.
pub const DEFAULT_CHUNK_ROWS: u64 = 10_000;

/// Failures of one job, each an error retrying cannot fix, that fail the whole build.
pub const MAX_DEFINITE_FAILURES: u32 = 3;

/// Build jobs a worker runs at once (each holds a MySQL connection).
const JOBS_PER_WORKER: usize = 2;

/// Every build job: job name → worker, as `known` (the term's view of `snapshots/`)
/// brought up to date says.
async fn jobs(coord: &Coordinator, known: &mut Dirs<()>) -> Result<BTreeMap<String, String>> {
    known.refresh(coord).await?;
    let mut out = BTreeMap::new();
    for (worker, jobs) in known.get() {
        for job in jobs.names() {
            out.insert(job.clone(), worker.clone());
        }
    }
    Ok(out)
}

/// One pass over every pipeline's build. `live` are the live workers; `known_jobs` the
/// term's view of the build jobs (`snapshots/`). Returns whether a build is under way (the
/// leader then looks again soon: chunk progress fires no watch).
pub(crate) async fn drive(
    shared: &Shared,
    term: &Term<'_>,
    known_jobs: &mut Dirs<()>,
    pipelines: &[StoredPipeline],
    live: &[String],
) -> Result<bool> {
    let building: BTreeMap<&str, &StoredPipeline> = pipelines
        .iter()
        .filter(|p| p.building_version > 0)
        .map(|p| (p.spec.name.as_str(), p))
        .collect();
    remove_leftover_builds(term, &building).await?;
    let mut all_jobs = jobs(term.coord, known_jobs).await?;
    drop_unwanted_jobs(term, known_jobs, &building, live, &mut all_jobs).await?;
    let assigned = all_jobs.clone();
    for p in building.values() {
        step(shared, term, p, live, &mut all_jobs).await?;
    }
    // The builds' steps added and removed jobs: only their workers' directories are
    // read again at the next look (each list sets a watch, which stays until it fires).
    let before = assigned
        .iter()
        .filter(|(j, w)| all_jobs.get(*j) != Some(*w));
    let after = all_jobs
        .iter()
        .filter(|(j, w)| assigned.get(*j) != Some(*w));
    for (job, worker) in before.chain(after) {
        known_jobs.forget(worker, job);
    }
    // Builds no longer running: done (their alias moved) or reset.
    crate::metrics::update(|g| {
        g.builds
            .retain(|name, _| pipelines.iter().any(|p| p.spec.name == *name));
        for (name, (phase, _)) in g.builds.iter_mut() {
            if !building.contains_key(name.as_str()) {
                *phase = BuildPhase::Done;
            }
        }
    });
    let existing: Vec<&str> = pipelines.iter().map(|p| p.spec.name.as_str()).collect();
    delete_doomed(shared, term, &existing).await?;
    Ok(!building.is_empty())
}

/// Removes the records (and chunk tasks) of builds finished or reset: those of no
/// pipeline `building`, or of another version than the one it builds.
async fn remove_leftover_builds(
    term: &Term<'_>,
    building: &BTreeMap<&str, &StoredPipeline>,
) -> Result<()> {
    let coord = term.coord;
    for name in coord.children("builds").await? {
        let current = building.get(name.as_str()).map(|p| p.building_version);
        let recorded: Option<BuildRecord> =
            coord.get_json(&layout::build(&name)).await.ok().flatten();
        if current.is_none() || recorded.is_some_and(|r| Some(r.version) != current) {
            term.acting()?;
            coord.delete(&layout::build(&name), None, true).await?;
            remove_chunk_tasks(coord, &name).await?;
        }
    }
    Ok(())
}

/// Deletes the jobs of no build under way (or of an older version) and those of workers
/// no longer live, from ZooKeeper and from `all_jobs`.
async fn drop_unwanted_jobs(
    term: &Term<'_>,
    known_jobs: &mut Dirs<()>,
    building: &BTreeMap<&str, &StoredPipeline>,
    live: &[String],
    all_jobs: &mut BTreeMap<String, String>,
) -> Result<()> {
    let coord = term.coord;
    for (job, worker) in all_jobs.clone() {
        let pipeline = job.split('~').next().unwrap_or_default();
        let wanted = match building.get(pipeline) {
            Some(p) => coord
                .get_json::<JobRecord>(&layout::job(&worker, &job))
                .await?
                .is_some_and(|j| j.version == p.building_version),
            None => false,
        };
        if !wanted || !live.contains(&worker) {
            term.acting()?;
            let path = layout::job(&worker, &job);
            let delete = coord.delete(&path, None, false);
            known_jobs.write(&worker, &job, delete).await?;
            all_jobs.remove(&job);
        }
    }
    Ok(())
}

/// One step of `p`'s build. A transient failure is tried again on the next pass; a
/// definite one fails the build, with the reason, the alias untouched.
async fn step(
    shared: &Shared,
    term: &Term<'_>,
    p: &StoredPipeline,
    live: &[String],
    all_jobs: &mut BTreeMap<String, String>,
) -> Result<()> {
    match drive_one(shared, term, p, live, all_jobs).await {
        Ok(()) => Ok(()),
        Err(e) if e.ends_the_term() => Err(e),
        Err(e @ CenterError::Transient(_)) => {
            tracing::warn!(pipeline = %p.spec.name, error = %e, "build step failed; it is tried again on the next pass");
            Ok(())
        }
        Err(e) => {
            let reason = format!("build step failed: {e}");
            tracing::warn!(pipeline = %p.spec.name, version = p.building_version, %reason, "build failed");
            term.acting()?;
            let (name, alias) = (&p.spec.name, &p.spec.alias);
            shared
                .meta
                .fail_build(term.epoch(), name, alias, &reason)
                .await?;
            Ok(())
        }
    }
}

async fn remove_chunk_tasks(coord: &Coordinator, pipeline: &str) -> Result<()> {
    let prefix = format!("snap~{pipeline}~");
    for task in coord.children("tasks").await? {
        if task.starts_with(&prefix) && coord.get(&layout::lock(&task)).await?.is_none() {
            coord.delete(&format!("tasks/{task}"), None, true).await?;
        }
    }
    Ok(())
}

/// Makes sure `job` is assigned to a live worker: the one with the fewest build jobs.
async fn ensure_job(
    term: &Term<'_>,
    version: u32,
    job: String,
    live: &[String],
    all_jobs: &mut BTreeMap<String, String>,
) -> Result<()> {
    let (coord, epoch) = (term.coord, term.epoch());
    if all_jobs.contains_key(&job) {
        return Ok(());
    }
    let mut load: BTreeMap<&str, usize> = live.iter().map(|w| (w.as_str(), 0)).collect();
    for w in all_jobs.values() {
        if let Some(n) = load.get_mut(w.as_str()) {
            *n += 1;
        }
    }
    let Some((worker, _)) = load
        .into_iter()
        .filter(|(_, n)| *n < JOBS_PER_WORKER)
        .min_by_key(|(w, n)| (*n, *w))
    else {
        return Ok(()); // every live worker is busy (or none lives): wait
    };
    let worker = worker.to_owned();
    term.acting()?;
    let rec = JobRecord { epoch, version };
    coord
        .put(
            &layout::job(&worker, &job),
            &serde_json::to_vec(&rec).expect("serializes"),
            Expect::Any,
        )
        .await?;
    tracing::info!(job, worker, "build job assigned");
    all_jobs.insert(job, worker);
    Ok(())
}

/// The build record of `p`'s building version as the meta database says it should be:
/// a new build, or a held one whose release may have come. `earlier` is kept when it
/// already says so; otherwise the new record is written.
async fn record_from_meta(
    shared: &Shared,
    term: &Term<'_>,
    p: &StoredPipeline,
    earlier: Option<BuildRecord>,
) -> Result<BuildRecord> {
    let epoch = term.epoch();
    let v = p.building_version;
    let settings = shared.meta.build_settings(&p.spec.name, v).await?;
    let released = settings.as_ref().is_some_and(|s| s.swap_by.is_some());
    if let Some(r) = earlier
        .as_ref()
        .filter(|r| r.version == v && r.released == released)
    {
        return Ok(r.clone());
    }
    let s = settings.unwrap_or(crate::meta::BuildSettings {
        chunk_rows: DEFAULT_CHUNK_ROWS,
        throttle_rows_per_sec: 0,
        started_at_ms: sluice_model::now_ms(),
        verify: false,
        swap_by: None,
    });
    let rec = BuildRecord {
        epoch,
        spec: p.spec.clone(),
        version: v,
        chunk_rows: s.chunk_rows,
        throttle_rows_per_sec: s.throttle_rows_per_sec,
        started_at_ms: s.started_at_ms,
        verify: s.verify,
        released,
        searchable: earlier.is_some_and(|r| r.version == v && r.searchable),
    };
    put_build(term, &rec).await?;
    Ok(rec)
}

async fn drive_one(
    shared: &Shared,
    term: &Term<'_>,
    p: &StoredPipeline,
    live: &[String],
    all_jobs: &mut BTreeMap<String, String>,
) -> Result<()> {
    let (coord, epoch) = (term.coord, term.epoch());
    let v = p.building_version;
    let record: Option<BuildRecord> = coord.get_json(&layout::build(&p.spec.name)).await?;
    let record = match record {
        // Nothing the meta database holds could change it: not read on every pass.
        Some(r) if r.version == v && (!r.verify || r.released) => r,
        earlier => record_from_meta(shared, term, p, earlier).await?,
    };
    if let Some(reason) = failed_for_good(coord, p).await? {
        tracing::warn!(pipeline = %p.spec.name, version = v, %reason, "build failed");
        shared
            .meta
            .fail_build(epoch, &p.spec.name, &p.spec.alias, &reason)
            .await?;
        return Ok(());
    }
    let (Progress { phase, status }, chunk_done) = progress(coord, p).await?;
    crate::metrics::update(|g| {
        g.builds
            .insert(p.spec.name.clone(), (phase, status.clone()));
    });
    tracing::debug!(pipeline = %p.spec.name, %phase, chunks_done = status.chunks_done, "build step");
    let job = |kind: &str| format!("{}~{kind}", p.spec.name);
    let chunk_job = |n: usize| job(&layout::chunk_name(n as u32));
    // Jobs whose work is done leave room for the next.
    let mut finished: Vec<String> = Vec::new();
    if !matches!(phase, BuildPhase::Planning | BuildPhase::WaitingForEtl) {
        finished.push(job("plan"));
    }
    finished.extend(
        (0..chunk_done.len())
            .filter(|&n| chunk_done[n])
            .map(chunk_job),
    );
    if matches!(phase, BuildPhase::Swap | BuildPhase::Held) {
        finished.push(job("mark"));
    }
    for name in finished {
        if let Some(worker) = all_jobs.remove(&name) {
            term.acting()?;
            coord
                .delete(&layout::job(&worker, &name), None, false)
                .await?;
        }
    }
    match phase {
        BuildPhase::Planning => ensure_job(term, v, job("plan"), live, all_jobs).await,
        BuildPhase::Snapshotting => {
            for n in (0..chunk_done.len()).filter(|&n| !chunk_done[n]) {
                ensure_job(term, v, chunk_job(n), live, all_jobs).await?;
            }
            Ok(())
        }
        BuildPhase::CatchingUp => ensure_job(term, v, job("mark"), live, all_jobs).await,
        BuildPhase::Held if !record.searchable => {
            make_searchable(es(shared)?, p).await?;
            tracing::info!(pipeline = %p.spec.name, version = v, "build caught up: held for verification, searchable");
            let rec = BuildRecord {
                searchable: true,
                ..record
            };
            put_build(term, &rec).await
        }
        BuildPhase::Swap => swap(shared, term, p).await,
        BuildPhase::WaitingForEtl
        | BuildPhase::Held
        | BuildPhase::None
        | BuildPhase::Done
        | BuildPhase::Failed => Ok(()),
    }
}

async fn put_build(term: &Term<'_>, rec: &BuildRecord) -> Result<()> {
    let coord = term.coord;
    term.acting()?;
    coord
        .put(
            &layout::build(&rec.spec.name),
            &serde_json::to_vec(rec).expect("serializes"),
            Expect::Any,
        )
        .await?;
    Ok(())
}

/// Why the build must stop: a job of it failed [`MAX_DEFINITE_FAILURES`] times with an
/// error retrying cannot fix (as the workers count them).
async fn failed_for_good(coord: &Coordinator, p: &StoredPipeline) -> Result<Option<String>> {
    let name = &p.spec.name;
    for job in coord.children(&layout::build_failures(name)).await? {
        let failure: Option<JobFailure> = coord
            .get_json(&layout::build_failure(name, &job))
            .await
            .ok()
            .flatten();
        if let Some(f) =
            failure.filter(|f| f.version == p.building_version && f.count >= MAX_DEFINITE_FAILURES)
        {
            return Ok(Some(format!(
                "job {job} failed {} times: {}",
                f.count, f.reason
            )));
        }
    }
    Ok(None)
}

/// Where a pipeline's build stands, as the API shows it and the leader acts on it.
pub(crate) struct Progress {
    pub phase: BuildPhase,
    pub status: BuildStatus,
}

impl Progress {
    fn at(phase: BuildPhase, mut status: BuildStatus) -> Self {
        status.put_phase(phase);
        Progress { phase, status }
    }
}

/// Where a pipeline's build stands (any replica can compute it).
pub(crate) async fn status(coord: &Coordinator, p: &StoredPipeline) -> Result<Progress> {
    Ok(progress(coord, p).await?.0)
}

/// The build's progress and, once planned, which chunks are done (read once per pass).
async fn progress(coord: &Coordinator, p: &StoredPipeline) -> Result<(Progress, Vec<bool>)> {
    let mut s = BuildStatus {
        pipeline: p.spec.name.clone(),
        version: p.building_version,
        ..Default::default()
    };
    if p.building_version == 0 {
        return Ok((Progress::at(BuildPhase::None, s), Vec::new()));
    }
    let v = p.building_version;
    let record = coord
        .get_json::<BuildRecord>(&layout::build(&p.spec.name))
        .await?
        .filter(|r| r.version == v);
    if let Some(rec) = &record {
        s.started_at_ms = rec.started_at_ms;
    }
    let (etls, unaware) = etls_unaware(coord, p).await?;
    // With no etl running nothing is being applied: an etl that starts later reads the
    // pipeline, building version included, before it applies anything.
    if !unaware.is_empty() {
        s.message = format!("waiting for {} to write to version {v}", unaware.join(", "));
        return Ok((Progress::at(BuildPhase::WaitingForEtl, s), Vec::new()));
    }
    if etls == 0 {
        s.message =
            "no etl is running: the build goes on; the alias moves once an etl caught up".into();
    }
    let Some(plan) = coord
        .get_json::<PlanRecord>(&layout::build_plan(&p.spec.name))
        .await?
    else {
        return Ok((Progress::at(BuildPhase::Planning, s), Vec::new()));
    };
    let done = chunks_read(coord, p, &plan, &mut s).await?;
    if s.chunks_done < plan.chunks {
        return Ok((Progress::at(BuildPhase::Snapshotting, s), done));
    }
    let (caught, partitions) = caught_up(coord, p).await?;
    let phase = match partitions {
        Some(k) if caught >= k && record.as_ref().is_some_and(|r| r.verify && !r.released) => {
            s.message = format!(
                "caught up; held beside the live version: `sluicectl pipelines compare {0}`, then `pipelines swap {0}`",
                p.spec.name
            );
            BuildPhase::Held
        }
        Some(k) if caught >= k => BuildPhase::Swap,
        Some(k) => {
            s.message = format!("etl applied the marker on {caught} of {k} partitions");
            BuildPhase::CatchingUp
        }
        None => BuildPhase::CatchingUp,
    };
    Ok((Progress::at(phase, s), done))
}

/// How many etl members there are, and those that do not write to `p`'s building version
/// yet (or, the version the alias leaves, as history: it must be before it leaves).
async fn etls_unaware(coord: &Coordinator, p: &StoredPipeline) -> Result<(usize, Vec<String>)> {
    let v = p.building_version;
    let history = p.announced_history();
    let members = coord.children("etls").await?;
    let mut unaware = Vec::new();
    for member in &members {
        let rec: Option<EtlRecord> = coord.get_json(&layout::etl(member)).await.ok().flatten();
        if rec.is_none_or(|r| {
            r.building.get(&p.spec.name) != Some(&v) || !r.writes_history(&p.spec.name, &history)
        }) {
            unaware.push(member.clone());
        }
    }
    Ok((members.len(), unaware))
}

/// Adds up the chunks' cursors into `s`; which chunks are done.
async fn chunks_read(
    coord: &Coordinator,
    p: &StoredPipeline,
    plan: &PlanRecord,
    s: &mut BuildStatus,
) -> Result<Vec<bool>> {
    s.chunks = plan.chunks;
    s.rows_estimated = plan.estimated_rows;
    let mut done = Vec::new();
    for n in 0..plan.chunks {
        let cursor = coord
            .read_checkpoint(&layout::chunk_task(&p.spec.name, p.building_version, n))
            .await?
            .and_then(|b| serde_json::from_slice::<ChunkCursor>(&b).ok())
            .unwrap_or_default();
        s.rows_done += cursor.rows;
        s.chunks_done += u32::from(cursor.done);
        done.push(cursor.done);
    }
    let elapsed = (sluice_model::now_ms() - s.started_at_ms).max(1) as f64 / 1000.0;
    s.rows_per_sec = s.rows_done as f64 / elapsed;
    Ok(done)
}

/// On how many partitions the etl applied the build's catch-up marker, and how many it
/// was written to (`None` before it was).
async fn caught_up(coord: &Coordinator, p: &StoredPipeline) -> Result<(u32, Option<u32>)> {
    let name = &p.spec.name;
    let partitions: Option<u32> = coord
        .get(&layout::build_partitions(name))
        .await?
        .and_then(|n| String::from_utf8(n.data).ok()?.parse().ok());
    let version = p.building_version.to_string();
    let mut caught = 0;
    for part in coord.children(&layout::build_caught_up(name)).await? {
        let at = format!("{}/{part}", layout::build_caught_up(name));
        if coord
            .get(&at)
            .await?
            .is_some_and(|n| n.data == version.as_bytes())
        {
            caught += 1;
        }
    }
    Ok((caught, partitions))
}

fn es(shared: &Shared) -> Result<&EsClient> {
    shared
        .es
        .as_ref()
        .context("builds need the center's [elasticsearch] section")
}

/// Gives the version being built the pipeline's settings (it was filled without
/// refreshes or replicas) and makes every write visible, before anyone searches it.
async fn make_searchable(es: &EsClient, p: &StoredPipeline) -> Result<()> {
    let new = sluice_elastic::versioned_index(&p.spec.alias, p.building_version);
    // An empty table gives the etl nothing to create the index with.
    es.create_index(
        &new,
        &json!({"settings": {"index": {
            "number_of_shards": p.spec.shards.max(1),
            "number_of_replicas": p.spec.replicas,
            "gc_deletes": p.spec.tombstone_retention,
        }}}),
    )
    .await?;
    // It was filled without refreshes or replicas (the etl makes it so): it gets the
    // pipeline's settings, and every write made visible, before anyone searches it.
    let refresh = if p.spec.refresh_interval.is_empty() {
        serde_json::Value::Null
    } else {
        json!(p.spec.refresh_interval)
    };
    es.update_settings(
        &new,
        &json!({"index": {"number_of_replicas": p.spec.replicas, "refresh_interval": refresh}}),
    )
    .await?;
    es.refresh(&new).await?;
    Ok(())
}

/// Moves the alias to the new version in one atomic `_aliases` request.
async fn swap(shared: &Shared, term: &Term<'_>, p: &StoredPipeline) -> Result<()> {
    let (coord, epoch) = (term.coord, term.epoch());
    let es = es(shared)?;
    let v = p.building_version;
    let new = sluice_elastic::versioned_index(&p.spec.alias, v);
    make_searchable(es, p).await?;
    let old = es.alias_targets(&p.spec.alias).await?;
    let mut actions: Vec<AliasAction> = old
        .iter()
        .filter(|i| **i != new)
        .map(|i| AliasAction::Remove {
            index: i.clone(),
            alias: p.spec.alias.clone(),
        })
        .collect();
    actions.push(AliasAction::add(&new, &p.spec.alias, p.spec.area_updates()));
    term.acting()?;
    es.update_aliases(&actions).await?;
    let previous: Vec<u32> = old
        .iter()
        .filter_map(|i| sluice_elastic::index_version(&p.spec.alias, i))
        .filter(|o| *o != v)
        .collect();
    let dropped = shared.meta.finish_build(epoch, p, v, &previous).await?;
    tracing::info!(pipeline = %p.spec.name, version = v, from = ?old, ?dropped, "alias moved: the new version is live");
    term.acting()?;
    coord
        .delete(&layout::build(&p.spec.name), None, true)
        .await?;
    Ok(())
}

/// Deletes doomed indexes (reset builds, deleted pipelines) once no etl writes to them.
async fn delete_doomed(shared: &Shared, term: &Term<'_>, existing: &[&str]) -> Result<()> {
    let (coord, epoch) = (term.coord, term.epoch());
    let doomed = shared.meta.doomed().await?;
    if doomed.is_empty() {
        return Ok(());
    }
    let Ok(es) = es(shared) else {
        return Ok(());
    };
    let mut records = Vec::new();
    for member in coord.children("etls").await? {
        if let Some(r) = coord
            .get_json::<EtlRecord>(&layout::etl(&member))
            .await
            .ok()
            .flatten()
        {
            records.push(r);
        }
    }
    for (index, pipeline, version) in doomed {
        // A reset build's index is written while an etl still builds that version; a
        // deleted pipeline's while an etl still routes the pipeline.
        let deleted = !existing.contains(&pipeline.as_str());
        let written = records.iter().any(|r| {
            r.building.get(&pipeline) == Some(&version)
                || r.writes_history(&pipeline, &[version])
                || (deleted && r.pipelines.contains(&pipeline))
        });
        if written {
            continue;
        }
        term.acting()?;
        es.delete_index(&index).await?;
        shared.meta.forget_doomed(epoch, &index).await?;
        tracing::info!(%index, pipeline, "doomed index deleted");
    }
    Ok(())
}
