//! Delayed changes, driven by the leader. A relation marked `delayed` rebuilds no
//! document when its table changes: the etl hands each change (which row, by the values
//! that join it to its parent) to the delayed topic, and the leader records it in the
//! meta database — once per row, however often it changed — moving its place in the
//! topic in the same transaction, so nothing is recorded twice or lost.
//!
//! A delayed job (every day at the pipeline's `delayed.daily_at`, or when an operator
//! asks) claims every waiting change, walks each up to the root keys of the documents
//! that contain its row *as they are when the job runs*, and publishes those keys in
//! chunks the way a check's are published (`checks/<pipeline>`, kind `delayed`):
//! workers rebuild the documents in consistent snapshots and send them through the etl
//! at the snapshot's version, so a newer change always wins over them. A document that
//! stopped containing the row was rebuilt by the change that took the row out (which is
//! not delayed: only the relation's own table is).

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use serde_json::Value as Json;
use sluice_model::DelayedChange;
use sluice_model::RunKind;
use sluice_mysql::docs::{DocPlan, Reader};
use sluice_zk::layout::ChunkRecord;
use tokio_util::sync::CancellationToken;

use crate::error::{CenterError, Context as _, Result};
use crate::meta::{ChunkedRun, NewRun, StoredPipeline};
use crate::run;
use crate::Shared;

/// Root keys per chunk of a delayed job.
const CHUNK_KEYS: usize = 1_000;
/// Delayed changes recorded per transaction at most.
const RECORD_BATCH: usize = 1_000;

/// Starts a delayed job of `p` now; a definite error says why it cannot start (nothing
/// waits, or a check or a job runs).
pub(crate) async fn start(
    shared: &Shared,
    epoch: u64,
    p: &StoredPipeline,
    started_by: &str,
) -> Result<u64> {
    let job = NewRun {
        pipeline: &p.spec.name,
        version: p.live_or_first(),
        since: "",
        since_ms: None,
        repair: true,
        started_by,
        kind: RunKind::Delayed,
        scope: None,
    };
    shared
        .meta
        .start_run(epoch, &job)
        .await
        .map_err(CenterError::from)
}

/// Starts the jobs that are due: a pipeline's waiting changes are applied at the first
/// `delayed.daily_at` after the oldest of them was recorded.
pub(crate) async fn schedule(
    shared: &Shared,
    epoch: u64,
    pipelines: &[StoredPipeline],
) -> Result<()> {
    if !pipelines.iter().any(|p| p.spec.has_delayed()) {
        return Ok(());
    }
    let now = sluice_model::now_ms();
    for (name, oldest) in shared.meta.oldest_waiting().await? {
        let Some(p) = pipelines.iter().find(|p| p.spec.name == name) else {
            continue;
        };
        if !run::due(now, p.spec.delayed.daily_minute(), Some(oldest)) {
            continue;
        }
        match start(shared, epoch, p, "schedule").await {
            Ok(id) => tracing::info!(pipeline = %name, job = id, "scheduled delayed job started"),
            Err(why @ CenterError::Definite(_)) => {
                tracing::debug!(pipeline = %name, %why, "scheduled delayed job not started yet")
            }
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// The chunks of root keys job `run` rebuilds; a definite error when the pipeline does
/// not fit its tables. Changes whose relation the pipeline no longer has are skipped (a spec
/// change that drops a relation needs a build anyway).
pub(crate) async fn chunks(
    shared: &Shared,
    p: &StoredPipeline,
    run: &ChunkedRun,
) -> Result<Vec<ChunkRecord>> {
    let src = run::source_of(shared, p).await?;
    let plans = sluice_mysql::docs::load(&src, &p.spec)
        .await?
        .map_err(|problems| run::unfit(&problems))?;
    let claimed = shared.meta.claimed(run.id).await?;
    let starts = starts(&plans, &claimed);
    let mut reader = Reader::connect(&src).await?;
    let mut chunks = Vec::new();
    for ((k, path, cols), values) in starts {
        reader.begin().await?;
        let roots = plans[k]
            .roots_of(&mut reader, &path, &cols, values, &|_, _| {})
            .await;
        reader.end().await?;
        let keys: Vec<Json> = roots?
            .into_iter()
            .map(|(key, ())| Json::from(key))
            .collect();
        for part in keys.chunks(CHUNK_KEYS) {
            chunks.push(ChunkRecord {
                kind: k,
                lower: Json::Null,
                upper: Json::Null,
                keys: part.to_vec(),
                shard: None,
            });
        }
    }
    reader.close().await;
    Ok(chunks)
}

/// Where to walk up from, for each claimed change: by document kind, the path of the
/// relation's parent and the parent's join columns, the join values.
type Starts = BTreeMap<(usize, Vec<usize>, Vec<usize>), Vec<(Vec<Json>, ())>>;

fn starts(plans: &[DocPlan], claimed: &[(String, String)]) -> Starts {
    let mut out = Starts::new();
    for (node, values) in claimed {
        let found = node.split_once('/').and_then(|(kind, names)| {
            let k = plans.iter().position(|p| p.name == kind)?;
            let names: Vec<String> = names.split('.').map(str::to_owned).collect();
            let path = plans[k].path_named(&names)?;
            let link = plans[k].node(&path).link.as_ref()?;
            let values: Vec<Json> = serde_json::from_str(values).ok()?;
            Some((k, path, link.parent.clone(), values))
        });
        let Some((k, mut path, cols, values)) = found else {
            tracing::warn!(%node, %values, "a delayed change's relation is no longer in the pipeline; skipped");
            continue;
        };
        path.pop();
        out.entry((k, path, cols)).or_default().push((values, ()));
    }
    out
}

/// Records what the etl hands over on the delayed topic into the meta database, for as
/// long as this replica leads at `epoch`: returns only when deposed (`Err`) or at
/// shutdown.
pub(crate) async fn record_changes(
    shared: &Shared,
    epoch: u64,
    shutdown: &CancellationToken,
) -> Result<()> {
    let Some(kafka) = shared.cfg.kafka.clone() else {
        // Nothing to read with: the API says so to whoever asks about delayed changes.
        shutdown.cancelled().await;
        return Ok(());
    };
    let topic = shared.cfg.topics.delayed.clone();
    let mut backoff = shared.cfg.center.retry().backoff();
    loop {
        let failed = match tail(shared, &kafka, &topic, epoch, shutdown).await {
            Ok(()) => return Ok(()),
            Err(e) if e.ends_the_term() => return Err(e),
            Err(e @ CenterError::Definite(_)) => {
                // Retrying cannot mend it: say so, and record nothing more in this term
                // (the changes wait in the topic, from the last recorded place).
                let me = &shared.cfg.center.id;
                let why = format!("delayed changes are not recorded: {e} (fix it, then restart the leading center)");
                tracing::error!("{why}");
                let _ = shared
                    .meta
                    .add_event_once(me, "delayed", &topic, &why)
                    .await;
                shutdown.cancelled().await;
                return Ok(());
            }
            Err(e) => e,
        };
        let pause = backoff.next_pause();
        tracing::warn!(error = %failed, retry_in = ?pause, "cannot record delayed changes; retrying");
        if !sluice_runtime::shutdown::pause(pause, shutdown).await {
            return Ok(());
        }
    }
}

async fn tail(
    shared: &Shared,
    kafka: &sluice_kafka::KafkaConfig,
    topic: &str,
    epoch: u64,
    shutdown: &CancellationToken,
) -> Result<()> {
    sluice_kafka::ensure_topics(kafka, &[topic.to_owned()])
        .await
        .context("cannot create the delayed topic")?;
    let from = shared.meta.delayed_offsets(topic).await?;
    let tail = sluice_kafka::Tail::open(kafka, topic, &from)
        .await
        .with_context(|| format!("cannot read topic {topic}"))?;
    while !shutdown.is_cancelled() {
        let messages = tail.next(RECORD_BATCH, Duration::from_millis(500)).await?;
        if messages.is_empty() {
            continue;
        }
        let mut next: HashMap<i32, i64> = HashMap::new();
        let mut changes = Vec::with_capacity(messages.len());
        for m in &messages {
            next.insert(m.partition, m.offset + 1);
            match serde_json::from_slice::<DelayedChange>(&m.payload) {
                Ok(c) => changes.push(c),
                // Only the etl writes here: a message of another format is not a change
                // anyone could apply.
                Err(e) => {
                    tracing::warn!(%topic, partition = m.partition, offset = m.offset, error = %e, "not a delayed change; skipped")
                }
            }
        }
        shared
            .meta
            .record_delayed(epoch, &changes, topic, &next)
            .await?;
        tracing::debug!(changes = changes.len(), "delayed changes recorded");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use sluice_mysql::SnapshotTable;

    fn plans() -> Vec<DocPlan> {
        let spec: sluice_model::PipelineSpec = serde_json::from_value(json!({
            "source": "s", "database": "d", "table": "products",
            "relations": [
                {"name": "skus", "kind": "one_to_many", "table": "skus", "on": {"id": "product_id"},
                 "relations": [{"name": "colour", "kind": "one_to_one", "table": "colours",
                                "on": {"colour_id": "id"}, "delayed": true}]},
                {"name": "category", "kind": "one_to_one", "table": "categories",
                 "on": {"category_id": "id"}, "delayed": true}
            ]
        }))
        .unwrap();
        let table = |name: &str, cols: &[&str]| {
            let cols: Vec<(&str, &str, &str)> = cols.iter().map(|c| (*c, "int", "int")).collect();
            (
                ("d".to_owned(), name.to_owned()),
                SnapshotTable::from_columns("d", name, &cols, &["id"]),
            )
        };
        let tables = [
            table("products", &["id", "category_id"]),
            table("skus", &["id", "product_id", "colour_id"]),
            table("colours", &["id"]),
            table("categories", &["id"]),
        ]
        .into_iter()
        .collect();
        sluice_mysql::docs::compile(&spec, &tables).unwrap()
    }

    #[test]
    fn recorded_changes_walk_up_from_their_relations_parent() {
        let plans = plans();
        let claimed = [
            ("products/category".to_owned(), "[7]".to_owned()),
            ("products/category".to_owned(), "[8]".to_owned()),
            ("products/skus.colour".to_owned(), "[3]".to_owned()),
            // A relation the spec no longer has, and a kind that is gone: skipped.
            ("products/brand".to_owned(), "[1]".to_owned()),
            ("answers/category".to_owned(), "[1]".to_owned()),
        ];
        let starts = starts(&plans, &claimed);
        let root = &plans[0].root;
        let shown: Vec<(Vec<usize>, Vec<String>, Vec<Json>)> = starts
            .iter()
            .map(|((k, path, cols), values)| {
                assert_eq!(*k, 0);
                let node = plans[0].node(path);
                let values = values.iter().map(|(v, ())| v[0].clone()).collect();
                (path.clone(), node.names(cols), values)
            })
            .collect();
        assert_eq!(
            shown,
            [
                (
                    vec![],
                    vec!["category_id".to_owned()],
                    vec![json!(7), json!(8)]
                ),
                (vec![0], vec!["colour_id".to_owned()], vec![json!(3)]),
            ],
            "the category from the root's category_id, the colour from the sku's colour_id"
        );
        assert_eq!(root.name, "products");
    }
}
