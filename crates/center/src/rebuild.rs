//! Pipelines whose live documents need a rebuild, as the etl recorded it in
//! `pipelines/<name>/needs_rebuild`: a mapping the live index cannot take, or DDL that
//! changed rows without row events. Each pass of the leader exports it as
//! `sluice_center_pipeline_needs_rebuild{pipeline}`, records an event the first time a
//! reason appears, and builds a pipeline with `auto_rebuild` whose documents DDL changed
//! (a mapping change is the operator's to rebuild: it follows their own `pipelines put`).

use sluice_zk::layout::{self, NeedsRebuild};

use crate::error::Result;
use crate::meta::{MetaError, StoredPipeline};
use crate::term::Term;
use crate::Shared;

/// One pass over every pipeline: exports the gauge, records the reasons, and starts the
/// builds `auto_rebuild` asks for. Returns the pipelines it started a build of.
pub(crate) async fn start_needed(
    shared: &Shared,
    term: &Term<'_>,
    pipelines: &[StoredPipeline],
) -> Result<Vec<String>> {
    let (coord, epoch) = (term.coord, term.epoch());
    let mut flagged = std::collections::BTreeMap::new();
    let mut started = Vec::new();
    let me = &shared.cfg.center.id;
    for p in pipelines {
        let name = &p.spec.name;
        let record: NeedsRebuild = coord
            .get_json(&layout::needs_rebuild(name))
            .await?
            .unwrap_or_default();
        let live = p.live_or_first();
        let reasons = record.reasons(live);
        flagged.insert(name.clone(), u64::from(!reasons.is_empty()));
        if reasons.is_empty() {
            continue;
        }
        shared
            .meta
            .add_event_once(
                me,
                "rebuild",
                name,
                &format!("needs a rebuild (sluicectl pipelines build {name}): {reasons}"),
            )
            .await?;
        let wanted = p.spec.auto_rebuild && p.building_version == 0 && record.rewritten_since(live);
        if !wanted || shared.es.is_none() {
            continue;
        }
        term.acting()?;
        match shared
            .meta
            .start_build(epoch, name, crate::build::DEFAULT_CHUNK_ROWS, 0, false)
            .await
        {
            Ok(version) => {
                tracing::info!(pipeline = %name, version, %reasons, "auto_rebuild: build started");
                shared
                    .meta
                    .add_event(
                        me,
                        "rebuild",
                        name,
                        &format!("auto_rebuild: building version {version} because {reasons}"),
                    )
                    .await?;
                started.push(name.clone());
            }
            // A build started meanwhile (an operator's): it is the rebuild.
            Err(MetaError::Refused(why)) => {
                tracing::info!(pipeline = %name, %why, "auto_rebuild: no build started")
            }
            Err(e) => return Err(e.into()),
        }
    }
    crate::metrics::update(|g| g.needs_rebuild = flagged);
    Ok(started)
}
