//! Dead letters: list (in pages) and replay.

use sluice_proto::v1::*;
use tonic::{Request, Response, Status};

use crate::error::CenterError;

use super::common::*;

/// Dead-letter reads one center makes at once.
pub(crate) const READS_AT_ONCE: usize = 2;
/// How long a call waits for its turn to read.
const TURN_WITHIN: std::time::Duration = std::time::Duration::from_secs(10);

pub(super) async fn list_dead_letters(
    api: &AdminApi,
    req: Request<ListDeadLettersRequest>,
) -> Result<Response<ListDeadLettersResponse>, Status> {
    let req = req.into_inner();
    let (letters, truncated) = api.dead_letters().await?;
    let replays = replays_of(api, &letters).await?;
    let mut matched: Vec<DeadLetter> = letters
        .iter()
        .filter(|l| req.pipeline.is_empty() || l.pipeline() == Some(req.pipeline.as_str()))
        .map(|l| letter_message(l, replays.get(&l.id.to_string()).copied()))
        .filter(|m| req.include_replayed || m.replayed_at_ms == 0)
        .collect();
    matched.sort_by(|a, b| b.at_ms.cmp(&a.at_ms).then_with(|| b.id.cmp(&a.id)));
    let total = matched.len() as u64;
    Ok(Response::new(ListDeadLettersResponse {
        letters: page(matched, req.skip, req.limit),
        matched: total,
        truncated,
    }))
}

pub(super) async fn replay_dead_letters(
    api: &AdminApi,
    req: Request<ReplayDeadLettersRequest>,
) -> Result<Response<ReplayDeadLettersResponse>, Status> {
    let target = match (&req.get_ref().pipeline, req.get_ref().all) {
        (_, true) => "every letter".to_owned(),
        (p, _) if !p.is_empty() => p.clone(),
        _ => format!("letters {:?}", req.get_ref().ids),
    };
    super::guard::about(&req, &target);
    let req = req.into_inner();
    if req.pipeline.is_empty() && req.ids.is_empty() && !req.all {
        return Err(Status::invalid_argument(
            "say which letters: a pipeline, letter ids, or all",
        ));
    }
    let epoch = api.writable().await?;
    let kafka = api.kafka()?;
    let (letters, truncated) = api.dead_letters().await?;
    let replays = replays_of(api, &letters).await?;
    let (chosen, unknown) =
        crate::dlq::chosen(&letters, &replays, &req.pipeline, &req.ids, req.all);
    let missing = if truncated {
        "not among the letters read (the read stops at its bounds)"
    } else {
        "no such dead letter"
    };
    let mut refused: Vec<String> = unknown
        .into_iter()
        .map(|id| format!("{id}: {missing}"))
        .collect();
    let mut ready = Vec::new();
    for l in chosen {
        match l.replayable() {
            Ok(()) => ready.push(l),
            Err(why) => refused.push(format!("{}: {why}", l.id)),
        }
    }
    let mut replayed = Vec::new();
    let meta = &api.shared.meta;
    let outcome = crate::dlq::replay(kafka, &ready, |l, to| {
        replayed.push(l.id.to_string());
        async move {
            meta.record_replay(epoch, &l.id.to_string(), &to)
                .await
                .map_err(CenterError::from)
        }
    })
    .await;
    if !replayed.is_empty() {
        api.add_event(
            "dlq",
            if req.pipeline.is_empty() {
                "dead letters"
            } else {
                &req.pipeline
            },
            &format!("{} dead letters replayed", replayed.len()),
        )
        .await;
    }
    if let Err(e) = outcome {
        return Err(Status::unavailable(format!(
            "{e:#} (replayed before it: {}; run the replay again for the rest)",
            replayed.len()
        )));
    }
    Ok(Response::new(ReplayDeadLettersResponse {
        replayed,
        refused,
        truncated,
    }))
}

impl AdminApi {
    pub(super) fn kafka(&self) -> Result<&sluice_kafka::KafkaConfig, Status> {
        self.shared.cfg.kafka.as_ref().ok_or_else(|| {
            Status::failed_precondition(
                "dead letters live in Kafka, and this center has no [kafka] section: add one",
            )
        })
    }

    /// The newest dead letters, read by at most [`READS_AT_ONCE`] calls at once (each read
    /// holds up to the dead-letter read's bounds in memory); a call that finds no turn
    /// within [`TURN_WITHIN`] is refused, saying so.
    pub(super) async fn dead_letters(&self) -> Result<(Vec<crate::dlq::Letter>, bool), Status> {
        let kafka = self.kafka()?;
        let _turn = tokio::time::timeout(TURN_WITHIN, self.shared.letter_reads.acquire())
            .await
            .map_err(|_| {
                Status::resource_exhausted(format!(
                    "{READS_AT_ONCE} dead-letter reads are under way on this center: try again shortly"
                ))
            })?
            .map_err(|e| Status::internal(e.to_string()))?;
        let sources: Vec<String> = (self.shared.meta.sources().await.map_err(meta_err)?)
            .into_iter()
            .map(|s| s.name)
            .collect();
        crate::dlq::read(kafka, &self.shared.cfg.topics, &sources)
            .await
            .map_err(|e| Status::unavailable(format!("cannot read the dead-letter topics: {e}")))
    }
}

/// When each of `letters` that was replayed was last replayed.
async fn replays_of(
    api: &AdminApi,
    letters: &[crate::dlq::Letter],
) -> Result<std::collections::HashMap<String, i64>, Status> {
    let ids: Vec<String> = letters.iter().map(|l| l.id.to_string()).collect();
    api.shared.meta.replays_of(&ids).await.map_err(meta_err)
}

/// The letters a page shows at most.
const MOST_PER_PAGE: usize = 1_000;

/// Letters `skip..skip + limit` of `matched` (`limit` 0: 100; never more than
/// [`MOST_PER_PAGE`]).
fn page(matched: Vec<DeadLetter>, skip: u32, limit: u32) -> Vec<DeadLetter> {
    let limit = match limit {
        0 => 100,
        n => (n as usize).min(MOST_PER_PAGE),
    };
    matched
        .into_iter()
        .skip(skip as usize)
        .take(limit)
        .collect()
}

/// A dead letter as the API shows it.
pub(super) fn letter_message(l: &crate::dlq::Letter, replayed_at_ms: Option<i64>) -> DeadLetter {
    use crate::dlq::Content;
    let mut m = DeadLetter {
        id: l.id.to_string(),
        at_ms: l.at_ms,
        replayed_at_ms: replayed_at_ms.unwrap_or(0),
        ..DeadLetter::default()
    };
    match &l.content {
        Content::Event(e, _) => {
            m.reason = e.reason.clone();
            m.pipeline = e.pipeline.clone().unwrap_or_default();
            m.origin = format!("{}:{}:{}", e.topic, e.partition, e.offset);
            match e.change() {
                Ok(c) => {
                    m.table = format!("{}.{}", c.db, c.table);
                    m.key = serde_json::Value::Object(c.key).to_string();
                    m.source = c.source.instance;
                }
                Err(why) => m.not_replayable = why.to_owned(),
            }
        }
        Content::Rows(r) => {
            m.reason = r.reason.clone();
            m.source = r.source.instance.clone();
            m.table = format!("{}.{}", r.db, r.table);
            m.origin = format!("{}:{}", r.source.file, r.source.pos);
            m.not_replayable = l.replayable().err().unwrap_or_default();
        }
        Content::Unreadable(why) => {
            m.reason = why.clone();
            m.not_replayable = why.clone();
        }
    }
    m
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_page_is_bounded_whatever_is_asked() {
        let letters = |n: usize| -> Vec<DeadLetter> {
            (0..n)
                .map(|i| DeadLetter {
                    id: i.to_string(),
                    ..DeadLetter::default()
                })
                .collect()
        };
        assert_eq!(page(letters(5000), 0, 0).len(), 100);
        assert_eq!(page(letters(5000), 0, u32::MAX).len(), MOST_PER_PAGE);
        let second = page(letters(250), 100, 100);
        assert_eq!((second[0].id.as_str(), second.len()), ("100", 100));
        assert!(page(letters(10), 20, 5).is_empty());
    }
}
