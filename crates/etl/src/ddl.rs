//! DDL that changed rows without row events, read from the sources' schema topics: a
//! column added with a value for every row, a column dropped, converted or renamed, a
//! table truncated, dropped or swapped by rename. The documents in every index version a
//! pipeline writes to may then differ from what its tables yield, until a build. That is
//! recorded for the center (`needs_rebuild`, and a build when the pipeline has
//! `auto_rebuild`) before the schema topic's offset is committed: never silent, and never
//! lost to a crash (README, "Schema changes").

use std::collections::HashMap;

use sluice_elastic::{index_version, EsClient};
use sluice_model::{DdlEvent, RetryPolicy};
use sluice_mysql::ddl::Rewrite;
use tokio_util::sync::CancellationToken;

use crate::error::Result;
use crate::pipeline::Router;

/// A pipeline whose documents DDL changed: the index versions it wrote to, and why.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Rewritten {
    pub pipeline: String,
    pub versions: Vec<u32>,
    pub reason: String,
}

/// The pipelines among `pipelines` (those of the event's source) whose documents `event`
/// changed without row events, each with why.
pub(crate) fn concerned(
    router: &Router,
    pipelines: &[usize],
    event: &DdlEvent,
) -> Vec<(usize, Vec<String>)> {
    let rewrites = sluice_mysql::ddl::rewrites(&event.db, &event.ddl);
    pipelines
        .iter()
        .filter_map(|&p| {
            let spec = &router.pipelines[p].cfg.spec;
            if spec.source != event.source.instance {
                return None;
            }
            let reasons: Vec<String> = rewrites
                .iter()
                .filter(|r| concerns(spec, r))
                .map(|r| r.reason.clone())
                .collect();
            (!reasons.is_empty()).then_some((p, reasons))
        })
        .collect()
}

/// What `event` changed in the documents of the `concerned` pipelines, given the index
/// versions each writes to (a pipeline without any has nothing to rebuild).
pub(crate) fn rewritten(
    router: &Router,
    event: &DdlEvent,
    concerned: Vec<(usize, Vec<String>)>,
    versions: &HashMap<usize, Vec<u32>>,
) -> Vec<Rewritten> {
    let mut out = Vec::new();
    for (p, reasons) in concerned {
        let spec = &router.pipelines[p].cfg.spec;
        let versions = versions.get(&p).cloned().unwrap_or_default();
        let reason = format!(
            "{} (DDL at {}:{})",
            reasons.join("; "),
            event.source.file,
            event.source.pos
        );
        tracing::warn!(pipeline = %spec.name, ?versions, "documents changed by DDL without row events; a rebuild makes them right (sluicectl pipelines build {}): {reason}", spec.name);
        if !versions.is_empty() {
            out.push(Rewritten {
                pipeline: spec.name.clone(),
                versions,
                reason,
            });
        }
    }
    out
}

/// Whether rewrite `r` changed what the pipeline's documents hold.
fn concerns(spec: &sluice_model::PipelineSpec, r: &Rewrite) -> bool {
    if r.columns.is_empty() {
        spec.reads_table(&r.db, &r.table)
    } else {
        r.columns
            .iter()
            .any(|c| spec.uses_column(&r.db, &r.table, c))
    }
}

/// The index versions pipeline `p` writes to now (none before its first index exists);
/// `None` when shutdown came while Elasticsearch was unavailable.
pub(crate) async fn versions(
    router: &Router,
    es: &EsClient,
    p: usize,
    retry: RetryPolicy,
    shutdown: &CancellationToken,
) -> Result<Option<Vec<u32>>> {
    let mut backoff = retry.backoff();
    let pipeline = &router.pipelines[p];
    let alias = pipeline.cfg.spec.alias();
    let mut indexes = match &pipeline.targets {
        Some(t) => t.clone(),
        None => loop {
            match es.alias_targets(&alias).await {
                Ok(t) => break t,
                Err(e) if e.is_transient() => {
                    let pause = backoff.next_pause();
                    tracing::warn!(error = %e, retry_in = ?pause, "Elasticsearch unavailable while reading a pipeline's versions; retrying");
                    if !sluice_runtime::shutdown::pause(pause, shutdown).await {
                        return Ok(None);
                    }
                }
                Err(e) => return Err(e.into()),
            }
        },
    };
    indexes.extend(pipeline.building_index.clone());
    let mut versions: Vec<u32> = indexes
        .iter()
        .filter_map(|i| index_version(&alias, i))
        .collect();
    versions.sort_unstable();
    versions.dedup();
    Ok(Some(versions))
}
