//! Waiting until the stream and the etl passed a position: a check confirms a suspect
//! only once every change up to its read is applied.

use std::time::Duration;

use sluice_zk::layout::{self, EtlRecord};
use tokio::time::Instant;

use super::{Checks, Ctx};
use crate::error::{Context as _, Result, WorkerError};
use crate::snapshot::{confirmed, version_at};

/// How long confirming waits for the stream and the etl to pass a position.
const SETTLE_WITHIN: Duration = Duration::from_secs(60);

/// Waits until every change up to `position` is applied: the source's task confirmed
/// it (so it is in Kafka), then every etl group consuming the pipeline committed past a
/// probe written behind it to each partition of the pipeline's change topics.
pub(super) async fn settle(
    c: &Checks,
    ctx: &Ctx<'_>,
    position: &sluice_model::BinlogPosition,
) -> Result<()> {
    let deadline = Instant::now() + SETTLE_WITHIN;
    let target = version_at(ctx.epoch, position)?;
    let spec = &ctx.rec.spec;
    loop {
        let at = confirmed(&c.coord, &spec.source)
            .await?
            .and_then(|cp| version_at(cp.epoch, &cp.position).ok());
        if at.is_some_and(|v| v >= target) {
            break;
        }
        if Instant::now() > deadline {
            return Err(WorkerError::transient(format!("the task of source {} did not confirm position {position} within {SETTLE_WITHIN:?}", spec.source)));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let groups = etl_groups(c, &spec.name)
        .await?
        .into_iter()
        .map(|g| Ok((sluice_kafka::GroupOffsets::new(&c.cfg.kafka, &g)?, g)))
        .collect::<Result<Vec<_>, sluice_kafka::KafkaError>>()?;
    let probes = probe(c, ctx).await?;
    let partitions: Vec<(String, i32)> = probes.iter().map(|(t, p, _)| (t.clone(), *p)).collect();
    loop {
        let mut behind = None;
        for (offsets, group) in &groups {
            let at = offsets.committed(&partitions).await?;
            if let Some(((t, p, _), _)) = probes
                .iter()
                .zip(at)
                .find(|((_, _, offset), committed)| committed.is_none_or(|c| c <= *offset))
            {
                behind = Some(format!("etl group {group} on {t}/{p}"));
                break;
            }
        }
        let Some(behind) = behind else {
            return Ok(());
        };
        if Instant::now() > deadline {
            return Err(WorkerError::transient(format!(
                "{behind} did not apply the changes up to {position} within {SETTLE_WITHIN:?}"
            )));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The consumer groups of the etl members applying `pipeline`.
async fn etl_groups(c: &Checks, pipeline: &str) -> Result<Vec<String>> {
    let mut groups = Vec::new();
    for member in c.coord.children("etls").await? {
        if let Some(r) = c.coord.get_json::<EtlRecord>(&layout::etl(&member)).await? {
            if r.pipelines.iter().any(|p| p == pipeline)
                && !r.group.is_empty()
                && !groups.contains(&r.group)
            {
                groups.push(r.group);
            }
        }
    }
    if groups.is_empty() {
        return Err(WorkerError::transient(format!("no etl member applies pipeline {pipeline}: a check waits for the etl to apply what it reads")));
    }
    Ok(groups)
}

/// A marker (which the etl skips) on every partition of the pipeline's change topics:
/// `(topic, partition, offset)` of each.
async fn probe(c: &Checks, ctx: &Ctx<'_>) -> Result<Vec<(String, i32, i64)>> {
    let spec = &ctx.rec.spec;
    let producer = c.producer.get();
    let payload = serde_json::to_vec(&layout::Marker {
        pipeline: spec.name.clone(),
        version: 0,
    })?;
    let headers: &[(&str, &[u8])] = &[(layout::MARKER_HEADER, &payload)];
    let mut sent = Vec::new();
    for topic in sluice_kafka::rows_topics(&producer, &c.cfg.topics, spec).await? {
        let partitions = sluice_kafka::partitions(&producer, &topic).await?;
        for p in 0..partitions {
            let d = sluice_kafka::queue_with(&producer, &topic, None, &payload, Some((p, headers)))
                .await
                .context("cannot send a check probe")?;
            sent.push((topic.clone(), d));
        }
    }
    let mut out = Vec::new();
    for (topic, d) in sent {
        let stored = d
            .acknowledged()
            .await
            .context("Kafka refused a check probe")?;
        out.push((topic, stored.partition, stored.offset));
    }
    Ok(out)
}
