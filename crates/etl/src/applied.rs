//! How far each pipeline is applied, per source, published in ZooKeeper
//! (`applied/<pipeline>`) for applications that wait to read their own writes
//! (README, "Searching from applications").
//!
//! A worker confirms a position only once Kafka acknowledged every event before it. So
//! when the etl reads a source's confirmed position C and then the end offsets of the
//! pipeline's topics, every event up to C lies below those ends; once the group's
//! committed offsets reach them (the etl commits only what Elasticsearch acknowledged or
//! what it dead-lettered), nothing up to C is pending. Each pass takes such a sample when
//! C moved, and publishes the newest sample the commits have passed. Every member
//! computes from the group's commits, so the member a pipeline's name hashes to can
//! publish for it, whichever members consume its partitions.

use std::collections::{HashMap, VecDeque};
use std::time::Duration;

use sluice_kafka::{GroupOffsets, TopicConfig};
use sluice_model::Checkpoint;
use sluice_zk::layout::{AppliedPosition, AppliedRecord};
use sluice_zk::{Coordinator, Expect, SessionEnd, SessionState, Sessions, ZkConfig};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::pipeline::Active;

/// Samples kept per pipeline while the commits have not passed them: the oldest and
/// newest are what matter, so the ones between are dropped first.
const MAX_SAMPLES: usize = 32;
/// A position with nothing new is published again this often: how old the published
/// one is stays a measure of the etl's lag, not of the source's quiet.
const HEARTBEAT: Duration = Duration::from_secs(1);

pub(crate) struct Tracking {
    pub zk: ZkConfig,
    pub kafka: sluice_kafka::KafkaConfig,
    pub topics: TopicConfig,
    pub retry: sluice_model::RetryPolicy,
    pub group: String,
    pub member: String,
    pub interval: Duration,
    pub pipelines: watch::Receiver<Option<Vec<Active>>>,
    pub members: watch::Receiver<Option<Vec<String>>>,
}

/// One look at a source: its confirmed position, and where the pipeline's partitions
/// ended just after.
#[derive(Debug, Clone, PartialEq)]
struct Sample {
    checkpoint: Checkpoint,
    read_at_ms: i64,
    ends: Vec<(String, i32, i64)>,
}

/// What is known of one pipeline's source.
#[derive(Debug, Default)]
struct Track {
    source: String,
    samples: VecDeque<Sample>,
    /// The newest sample the commits passed.
    applied: Option<Sample>,
    published_at: Option<tokio::time::Instant>,
}

impl Track {
    /// Whether `checkpoint` is not the newest one sampled.
    fn is_new(&self, checkpoint: &Checkpoint) -> bool {
        self.samples
            .back()
            .or(self.applied.as_ref())
            .is_none_or(|s| s.checkpoint != *checkpoint)
    }

    /// Keeps `sample`, unless it confirms nothing new.
    fn sampled(&mut self, sample: Sample) {
        if !self.is_new(&sample.checkpoint) {
            return;
        }
        if self.samples.len() >= MAX_SAMPLES {
            self.samples.remove(self.samples.len() / 2);
        }
        self.samples.push_back(sample);
    }

    /// Moves past every sample whose ends `committed` reached (`None`: nothing
    /// committed there, which only an empty partition has passed); whether it moved.
    fn passed(&mut self, committed: &HashMap<(String, i32), i64>) -> bool {
        let mut moved = false;
        while let Some(s) = self.samples.front() {
            let done = s.ends.iter().all(|(t, p, end)| {
                *end == 0 || committed.get(&(t.clone(), *p)).is_some_and(|c| c >= end)
            });
            if !done {
                break;
            }
            self.applied = self.samples.pop_front();
            moved = true;
        }
        moved
    }

    /// The partitions the samples still wait on.
    fn waiting_on(&self) -> impl Iterator<Item = (String, i32)> + '_ {
        self.samples
            .iter()
            .flat_map(|s| s.ends.iter().map(|(t, p, _)| (t.clone(), *p)))
    }
}

/// Publishes how far the pipelines this member answers for are applied, every
/// `interval`, until `shutdown`.
pub(crate) async fn track(mut t: Tracking, shutdown: CancellationToken) {
    let offsets = match GroupOffsets::new(&t.kafka, &t.group) {
        Ok(o) => o,
        Err(e) => {
            tracing::error!(error = %e, "cannot read the group's offsets: applied positions are not published");
            return;
        }
    };
    let mut tracks: HashMap<String, Track> = HashMap::new();
    let mut sessions = Sessions::new(t.zk.clone(), t.retry, "applied positions", shutdown.clone());
    while let Some(coord) = sessions.next().await {
        let session = coord.session();
        let mut backoff = t.retry.backoff();
        while !shutdown.is_cancelled() && *session.borrow() != SessionState::Expired {
            let pause = match pass(&t, &coord, &offsets, &mut tracks).await {
                Ok(()) => {
                    backoff.reset();
                    t.interval
                }
                Err(e) => {
                    let pause = backoff.next_pause();
                    tracing::warn!(error = %e, retry_in = ?pause, "cannot tell how far the pipelines are applied; retrying");
                    pause
                }
            };
            tokio::select! {
                _ = tokio::time::sleep(pause) => {}
                _ = t.pipelines.changed() => {}
                _ = shutdown.cancelled() => {}
            }
        }
        sessions.ended(coord, SessionEnd::Ended).await;
    }
}

#[derive(Debug, thiserror::Error)]
enum PassError {
    #[error(transparent)]
    Zk(#[from] sluice_zk::ZkError),
    #[error(transparent)]
    Kafka(#[from] sluice_kafka::KafkaError),
}

/// Samples each pipeline this member answers for, then publishes those the commits
/// moved past a newer sample (or whose heartbeat is due).
async fn pass(
    t: &Tracking,
    coord: &Coordinator,
    offsets: &GroupOffsets,
    tracks: &mut HashMap<String, Track>,
) -> Result<(), PassError> {
    sample(t, coord, offsets, tracks).await?;
    let committed = committed(offsets, tracks).await?;
    for (name, track) in tracks.iter_mut() {
        let moved = track.passed(&committed);
        let due = track
            .published_at
            .is_none_or(|at| at.elapsed() >= HEARTBEAT);
        let Some(applied) = &track.applied else {
            continue;
        };
        crate::metrics::applied_lag(name, sluice_model::now_ms() - applied.read_at_ms);
        if moved || due {
            let record = AppliedRecord {
                sources: [(
                    track.source.clone(),
                    AppliedPosition {
                        checkpoint: applied.checkpoint.clone(),
                        read_at_ms: applied.read_at_ms,
                    },
                )]
                .into(),
            };
            let data = serde_json::to_vec(&record).expect("serializes");
            coord
                .put(&sluice_zk::layout::applied(name), &data, Expect::Any)
                .await?;
            track.published_at = Some(tokio::time::Instant::now());
        }
    }
    Ok(())
}

/// Reads the confirmed position of each pipeline's source this member answers for, and
/// where its partitions end when the position moved. Forgets deleted pipelines.
async fn sample(
    t: &Tracking,
    coord: &Coordinator,
    offsets: &GroupOffsets,
    tracks: &mut HashMap<String, Track>,
) -> Result<(), PassError> {
    let list = t.pipelines.borrow().clone().unwrap_or_default();
    let members = t.members.borrow().clone().unwrap_or_default();
    let gone: Vec<String> = (tracks.keys())
        .filter(|name| !list.iter().any(|p| &p.spec.name == *name))
        .cloned()
        .collect();
    for name in gone {
        // A deleted pipeline's: nobody publishes it any more.
        coord
            .delete(&sluice_zk::layout::applied(&name), None, false)
            .await?;
        tracks.remove(&name);
    }
    let node_of = |p: &Active| sluice_zk::layout::applied(&p.spec.name);
    let mine: Vec<&Active> = (list.iter())
        .filter(|p| crate::share::owns(&members, &t.member, &node_of(p), 0))
        .collect();
    tracks.retain(|name, _| mine.iter().any(|p| &p.spec.name == name));
    // Each source's confirmed position, read once a pass (before any end offsets: every
    // event up to it is then below them).
    let mut confirmed: HashMap<&str, Option<(Checkpoint, i64)>> = HashMap::new();
    for p in mine {
        let spec = &p.spec;
        let track = tracks.entry(spec.name.clone()).or_default();
        track.source.clone_from(&spec.source);
        if !confirmed.contains_key(spec.source.as_str()) {
            let node = coord
                .get(&sluice_zk::layout::checkpoint(&spec.source))
                .await?;
            let read = node.and_then(|n| Checkpoint::from_json(&n.data).ok());
            let read = read.map(|cp| (cp, sluice_model::now_ms()));
            confirmed.insert(&spec.source, read);
        }
        // None: the source's task has confirmed nothing yet.
        let Some((checkpoint, read_at_ms)) = confirmed[spec.source.as_str()].clone() else {
            continue;
        };
        if track.is_new(&checkpoint) {
            // Listed after the position was read: a shard's topic exists before any of
            // its events is confirmed.
            let existing = if spec.patterns().is_empty() {
                Vec::new()
            } else {
                offsets.topic_names().await?
            };
            let topics = crate::pipeline::change_topics(spec, &t.topics, &existing);
            let ends = offsets.ends(&topics).await?;
            track.sampled(Sample {
                checkpoint,
                read_at_ms,
                ends,
            });
        } else if track.samples.is_empty() {
            // Nothing confirmed since the last sample, which is applied: as recent as now.
            if let Some(a) = track.applied.as_mut() {
                a.read_at_ms = read_at_ms;
            }
        }
    }
    Ok(())
}

/// The group's committed offsets of the partitions the samples wait on.
async fn committed(
    offsets: &GroupOffsets,
    tracks: &HashMap<String, Track>,
) -> Result<HashMap<(String, i32), i64>, PassError> {
    let mut waiting: Vec<(String, i32)> = tracks.values().flat_map(Track::waiting_on).collect();
    if waiting.is_empty() {
        return Ok(HashMap::new());
    }
    waiting.sort();
    waiting.dedup();
    let found = offsets.committed(&waiting).await?;
    Ok(waiting
        .into_iter()
        .zip(found)
        .filter_map(|(tp, c)| Some((tp, c?)))
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(n: u64, ends: &[(&str, i32, i64)]) -> Sample {
        Sample {
            checkpoint: Checkpoint {
                position: sluice_model::BinlogPosition::new("b.000001", n),
                gtid: None,
                epoch: 0,
                ts_ms: 0,
                server_id: Some(1),
            },
            read_at_ms: n as i64,
            ends: ends
                .iter()
                .map(|(t, p, e)| ((*t).to_owned(), *p, *e))
                .collect(),
        }
    }

    #[test]
    fn a_sample_is_applied_once_every_partition_committed_past_its_end() {
        let mut track = Track::default();
        track.sampled(sample(100, &[("a", 0, 5), ("a", 1, 0), ("b", 0, 3)]));
        track.sampled(sample(200, &[("a", 0, 9), ("a", 1, 2), ("b", 0, 3)]));
        // The same position again: nothing new to wait for.
        track.sampled(sample(200, &[("a", 0, 10), ("a", 1, 2), ("b", 0, 3)]));
        assert_eq!(track.samples.len(), 2);
        let committed = |c: &[(&str, i32, i64)]| {
            c.iter()
                .map(|(t, p, o)| (((*t).to_owned(), *p), *o))
                .collect::<HashMap<_, _>>()
        };
        // b never committed: not applied, though a is.
        assert!(!track.passed(&committed(&[("a", 0, 5)])));
        assert!(track.applied.is_none());
        // An empty partition (end 0) needs no commit.
        assert!(track.passed(&committed(&[("a", 0, 5), ("b", 0, 3)])));
        assert_eq!(track.applied.as_ref().unwrap().read_at_ms, 100);
        assert!(!track.passed(&committed(&[("a", 0, 9), ("a", 1, 1), ("b", 0, 3)])));
        assert!(track.passed(&committed(&[("a", 0, 9), ("a", 1, 2), ("b", 0, 3)])));
        assert_eq!(track.applied.as_ref().unwrap().read_at_ms, 200);
        assert_eq!(track.waiting_on().count(), 0);
    }

    #[test]
    fn samples_stay_bounded_keeping_the_oldest_and_newest() {
        let mut track = Track::default();
        for n in 0..100 {
            track.sampled(sample(n + 1, &[("a", 0, n as i64)]));
        }
        assert_eq!(track.samples.len(), MAX_SAMPLES);
        assert_eq!(track.samples.front().unwrap().read_at_ms, 1);
        assert_eq!(track.samples.back().unwrap().read_at_ms, 100);
    }
}
