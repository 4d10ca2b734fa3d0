//! The leader removes the tombstones that deletes leave in the indexes of pipelines
//! written in parts (README, "Area updates: documents written in parts") once they are
//! older than the pipeline's `tombstone_retention`: the window in which a late write of
//! a deleted row's document could still come, as `index.gc_deletes` is for the
//! versioned deletes of other pipelines. It sweeps each such pipeline at the start of its
//! term (or when the pipeline appears), then as often as its retention, but at least
//! hourly and at most every [`QUICKEST`]; a sweep that failed is tried again within
//! [`AGAIN`]. Removals are counted in `sluice_center_tombstones_deleted_total{pipeline}`.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use opentelemetry::KeyValue;
use tokio_util::sync::CancellationToken;

use crate::meta::StoredPipeline;
use crate::Shared;

/// The longest wait between two sweeps.
const SLOWEST: Duration = Duration::from_secs(3600);

/// The shortest wait between two sweeps, however short a retention.
const QUICKEST: Duration = Duration::from_secs(1);

/// How often the pipelines are listed again (a new one, a retention changed).
const LOOK: Duration = Duration::from_secs(10);

/// The longest wait before a failed sweep is tried again.
const AGAIN: Duration = Duration::from_secs(60);

/// Sweeps each pipeline written in parts when it is due, until `shutdown`.
pub(crate) async fn keep(
    shared: &Shared,
    shutdown: &CancellationToken,
) -> crate::error::Result<()> {
    let Some(es) = &shared.es else {
        // Nothing to sweep without a sink; the term's end drops this.
        shutdown.cancelled().await;
        return Ok(());
    };
    // When each pipeline is next to be swept, in this term.
    let mut due: HashMap<String, Instant> = HashMap::new();
    loop {
        let mut next = LOOK;
        match shared.meta.pipelines().await {
            Ok(pipelines) => {
                for p in pipelines.iter().filter(|p| p.spec.area_updates()) {
                    let Some(every) = every(p) else { continue };
                    next = next.min(every);
                    let name = &p.spec.name;
                    if due.get(name).is_none_or(|at| Instant::now() >= *at) {
                        let wait = next_sweep(sweep(es, p).await, every);
                        due.insert(name.clone(), Instant::now() + wait);
                    }
                }
                due.retain(|name, _| pipelines.iter().any(|p| p.spec.name == *name));
            }
            Err(e) => {
                tracing::warn!(error = %e, "cannot list the pipelines whose tombstones to sweep; trying again");
            }
        }
        if !sluice_runtime::shutdown::pause(next, shutdown).await {
            return Ok(());
        }
    }
}

/// One pipeline's indexes swept; whether every one was (a failure is logged).
async fn sweep(es: &sluice_elastic::EsClient, p: &StoredPipeline) -> bool {
    let Some(window) = retention(p) else {
        return true;
    };
    let mut all = true;
    let pipeline = p.spec.name.as_str();
    for index in indexes(p) {
        match es.sweep_tombstones(&index, window).await {
            Ok(0) => {}
            Ok(n) => {
                crate::metrics::TOMBSTONES
                    .add(n, &[KeyValue::new("pipeline", p.spec.name.clone())]);
                tracing::info!(
                    pipeline,
                    index,
                    deleted = n,
                    "deleted tombstones past the pipeline's tombstone_retention"
                );
            }
            Err(e) => {
                all = false;
                tracing::warn!(pipeline, index, error = %e, "cannot delete tombstones past their retention; trying again within a minute")
            }
        }
    }
    all
}

/// A pipeline's tombstone retention (its spec is validated: a bad one is skipped).
fn retention(p: &StoredPipeline) -> Option<Duration> {
    humantime::parse_duration(&p.spec.tombstone_retention).ok()
}

/// The indexes an etl may write a pipeline's deletes to: the live version (or the first,
/// before any build), the one being built, and the versions kept as history.
fn indexes(p: &StoredPipeline) -> Vec<String> {
    let mut versions = vec![p.live_or_first()];
    versions.push(p.building_version);
    versions.extend(p.announced_history());
    versions.retain(|v| *v > 0);
    versions.sort_unstable();
    versions.dedup();
    (versions.into_iter())
        .map(|v| sluice_elastic::versioned_index(&p.spec.alias, v))
        .collect()
}

/// How often a pipeline is swept: as often as its retention, within
/// [`QUICKEST`]..=[`SLOWEST`], so that no tombstone outlives its retention by more than
/// that again. `None` for a retention that does not parse (the spec is validated).
fn every(p: &StoredPipeline) -> Option<Duration> {
    retention(p).map(|r| r.clamp(QUICKEST, SLOWEST))
}

/// The wait until a pipeline swept `every` so long is swept again: sooner when this
/// sweep failed.
fn next_sweep(swept: bool, every: Duration) -> Duration {
    if swept {
        every
    } else {
        every.min(AGAIN)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_model::PipelineSpec;

    fn pipeline(retention: &str, in_parts: bool, live: u32, building: u32) -> StoredPipeline {
        let spec = format!(
            r#"
            name = "shop"
            source = "s"
            database = "shop"
            table = "products"
            tombstone_retention = "{retention}"
            area_updates = {in_parts}
            [[relations]]
            name = "skus"
            kind = "one_to_many"
            table = "skus"
            on = {{ id = "product_id" }}
            "#
        );
        let mut spec: PipelineSpec = toml::from_str(&spec).unwrap();
        spec.alias = spec.alias();
        StoredPipeline {
            spec,
            live_version: live,
            building_version: building,
            history: Default::default(),
        }
    }

    #[test]
    fn the_live_and_the_building_index_are_swept() {
        assert_eq!(indexes(&pipeline("7d", true, 0, 0)), ["shop_v1"]);
        assert_eq!(indexes(&pipeline("7d", true, 2, 3)), ["shop_v2", "shop_v3"]);
    }

    #[test]
    fn a_pipeline_is_swept_as_often_as_its_retention_within_bounds() {
        let every = |r: &str| every(&pipeline(r, true, 1, 0));
        assert_eq!(every("90s"), Some(Duration::from_secs(90)));
        assert_eq!(every("7d"), Some(SLOWEST));
        assert_eq!(every("1ms"), Some(QUICKEST));
        assert_eq!(every("soon"), None);
        let hour = Duration::from_secs(3600);
        assert_eq!(next_sweep(true, hour), hour);
        assert_eq!(
            next_sweep(false, hour),
            AGAIN,
            "a failed sweep is tried again sooner"
        );
        assert_eq!(next_sweep(false, QUICKEST), QUICKEST);
    }
}
