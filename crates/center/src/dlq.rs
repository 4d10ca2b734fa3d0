//! Dead letters read back from their topics, and the etl's replayed: each letter's event
//! published again to the topic it was read from, with its key, so it takes the normal
//! path. Its external version keeps it from undoing any newer change of the row (README,
//! invariant 5), so a letter replayed twice, or after the row changed again, is harmless.

use std::fmt;
use std::time::Duration;

use sluice_kafka::{KafkaConfig, Received, TopicConfig};
use sluice_model::dead_letter::{EventLetter, RowsLetter};

use crate::error::Result;

/// A letter's place in its dead-letter topic: `<topic>:<partition>:<offset>`.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct LetterId {
    pub topic: String,
    pub partition: i32,
    pub offset: i64,
}

impl fmt::Display for LetterId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}:{}", self.topic, self.partition, self.offset)
    }
}

impl LetterId {
    /// Parses `<topic>:<partition>:<offset>` (topic names cannot hold `:`).
    pub fn parse(s: &str) -> Option<LetterId> {
        let mut parts = s.rsplitn(3, ':');
        let offset = parts.next()?.parse().ok()?;
        let partition = parts.next()?.parse().ok()?;
        let topic = parts.next().filter(|t| !t.is_empty())?.to_owned();
        Some(LetterId {
            topic,
            partition,
            offset,
        })
    }
}

/// What a letter holds.
#[derive(Debug, Clone)]
pub enum Content {
    /// An event the etl could not apply, and its Kafka key.
    Event(Box<EventLetter>, Option<Vec<u8>>),
    /// Rows a worker could not decode.
    Rows(RowsLetter),
    /// Something on a dead-letter topic that is not a letter.
    Unreadable(String),
}

#[derive(Debug, Clone)]
pub struct Letter {
    pub id: LetterId,
    pub at_ms: i64,
    pub content: Content,
}

impl Letter {
    fn from_message(m: Received) -> Letter {
        let id = LetterId {
            topic: m.topic,
            partition: m.partition,
            offset: m.offset,
        };
        let content = match serde_json::from_slice::<EventLetter>(&m.payload) {
            Ok(l) => Content::Event(Box::new(l), m.key),
            Err(event_err) => match serde_json::from_slice::<RowsLetter>(&m.payload) {
                Ok(l) => Content::Rows(l),
                Err(_) => Content::Unreadable(format!("not a Sluice dead letter: {event_err}")),
            },
        };
        Letter {
            id,
            at_ms: m.ts_ms.unwrap_or(0),
            content,
        }
    }

    pub fn pipeline(&self) -> Option<&str> {
        match &self.content {
            Content::Event(l, _) => l.pipeline.as_deref(),
            _ => None,
        }
    }

    /// `Ok` when a replay can apply it; otherwise why not, and what to do instead.
    pub fn replayable(&self) -> Result<(), String> {
        match &self.content {
            Content::Event(l, _) => l.replayable().map_err(str::to_owned),
            Content::Rows(l) => Err(format!(
                "the worker could not decode these rows, so the letter holds none: once the cause is fixed, read the table again (`sluicectl sources resnapshot {}`)",
                l.source.instance
            )),
            Content::Unreadable(why) => Err(why.clone()),
        }
    }
}

/// The most letters one read holds, by count and by size, and the newest of each
/// partition it starts from: what a listing costs the center is bounded, however many
/// letters there are (`truncated` says some were left unread).
const READ: sluice_kafka::ReadBounds = sluice_kafka::ReadBounds {
    quiet: Duration::from_millis(500),
    within: Duration::from_secs(30),
    max_messages: 20_000,
    max_bytes: 64 << 20,
    newest: Some(10_000),
};

/// Reads the newest letters of the etl's dead-letter topic and of the given sources',
/// within [`READ`]'s bounds.
pub async fn read(
    kafka: &KafkaConfig,
    topics: &TopicConfig,
    sources: &[String],
) -> Result<(Vec<Letter>, bool), sluice_kafka::KafkaError> {
    let mut names = vec![topics.dead_letter.clone()];
    names.extend(sources.iter().map(|s| topics.source_dead_letter_topic(s)));
    let read = sluice_kafka::read_all(kafka, &names, READ).await?;
    let letters = read
        .messages
        .into_iter()
        .map(Letter::from_message)
        .collect();
    Ok((letters, read.truncated))
}

/// Publishes each letter's event again, in the order given, and calls `done` with each
/// letter and where its event went once Kafka has it. Stops at the first failure.
pub async fn replay<'a, F, Fut>(
    kafka: &KafkaConfig,
    letters: &[&'a Letter],
    mut done: F,
) -> Result<()>
where
    F: FnMut(&'a Letter, String) -> Fut,
    Fut: std::future::Future<Output = Result<()>>,
{
    use crate::error::Context as _;
    let producer = sluice_kafka::producer(kafka).context("cannot create a Kafka producer")?;
    let mut queued = Vec::with_capacity(letters.len());
    for &letter in letters {
        let Content::Event(l, key) = &letter.content else {
            continue;
        };
        let payload = serde_json::to_vec(&l.event)?;
        let delivery = sluice_kafka::queue(&producer, &l.topic, key.as_deref(), &payload)
            .await
            .with_context(|| format!("cannot publish to {}", l.topic))?;
        queued.push((letter, &l.topic, delivery));
    }
    for (letter, topic, delivery) in queued {
        let stored = delivery
            .acknowledged()
            .await
            .with_context(|| format!("replaying {}", letter.id))?;
        done(
            letter,
            format!("{topic}:{}:{}", stored.partition, stored.offset),
        )
        .await?;
    }
    Ok(())
}

/// The letters a replay request asks for, in topic order, or the ids it names that are
/// not letters. `replayed` holds the ids already replayed: named ids are taken again,
/// the others only once.
pub fn chosen<'a>(
    letters: &'a [Letter],
    replayed: &std::collections::HashMap<String, i64>,
    pipeline: &str,
    ids: &[String],
    all: bool,
) -> (Vec<&'a Letter>, Vec<String>) {
    let mut unknown = Vec::new();
    let mut out: Vec<&Letter> = if ids.is_empty() {
        letters
            .iter()
            .filter(|l| !replayed.contains_key(&l.id.to_string()))
            .filter(|l| all || (!pipeline.is_empty() && l.pipeline() == Some(pipeline)))
            .collect()
    } else {
        let mut out = Vec::new();
        for id in ids {
            match letters.iter().find(|l| l.id.to_string() == *id) {
                Some(l) => out.push(l),
                None => unknown.push(id.clone()),
            }
        }
        out
    };
    // Per key, letters sit in one partition in the order they were written: replaying in
    // that order keeps each row's changes in order.
    out.sort_by(|a, b| a.id.cmp(&b.id));
    out.dedup_by(|a, b| a.id == b.id);
    (out, unknown)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_letter_id_reads_back_as_written() {
        let id = LetterId {
            topic: "sluice.dlq".into(),
            partition: 2,
            offset: 41,
        };
        assert_eq!(id.to_string(), "sluice.dlq:2:41");
        assert_eq!(LetterId::parse("sluice.dlq:2:41"), Some(id));
        assert_eq!(LetterId::parse("sluice.dlq:2"), None);
        assert_eq!(LetterId::parse(":2:41"), None);
        assert_eq!(LetterId::parse("t:x:41"), None);
    }

    fn event_letter(partition: i32, offset: i64, pipeline: &str) -> Letter {
        Letter {
            id: LetterId {
                topic: "dlq".into(),
                partition,
                offset,
            },
            at_ms: 0,
            content: Content::Event(
                Box::new(EventLetter {
                    v: 1,
                    reason: "r".into(),
                    pipeline: Some(pipeline.into()),
                    topic: "t".into(),
                    partition: 0,
                    offset: 0,
                    event: serde_json::Value::Null,
                }),
                None,
            ),
        }
    }

    #[test]
    fn a_replay_takes_what_it_names_in_topic_order() {
        let letters = vec![
            event_letter(1, 5, "a"),
            event_letter(0, 9, "b"),
            event_letter(0, 3, "a"),
        ];
        let replayed = [("dlq:0:3".to_owned(), 1)].into_iter().collect();
        let ids = |v: Vec<&Letter>| v.iter().map(|l| l.id.to_string()).collect::<Vec<_>>();

        let (by_pipeline, _) = chosen(&letters, &replayed, "a", &[], false);
        assert_eq!(
            ids(by_pipeline),
            ["dlq:1:5"],
            "replayed ones are not taken again"
        );
        let (every, _) = chosen(&letters, &replayed, "", &[], true);
        assert_eq!(ids(every), ["dlq:0:9", "dlq:1:5"]);
        let (nothing, _) = chosen(&letters, &replayed, "", &[], false);
        assert!(nothing.is_empty(), "no pipeline, no ids, not all: nothing");
        let asked = ["dlq:1:5".to_owned(), "dlq:0:3".into(), "dlq:7:7".into()];
        let (named, unknown) = chosen(&letters, &replayed, "", &asked, false);
        assert_eq!(
            ids(named),
            ["dlq:0:3", "dlq:1:5"],
            "named ones again, in order"
        );
        assert_eq!(unknown, ["dlq:7:7"]);
    }

    #[test]
    fn rows_letters_point_at_a_resnapshot() {
        let m = Received {
            topic: "sluice.m1.dlq".into(),
            partition: 0,
            offset: 3,
            key: None,
            payload: br#"{"v":1,"reason":"bad","source":{"instance":"m1","server_id":1,"file":"b.1","pos":4,"ts_ms":0},"db":"d","table":"t"}"#.to_vec(),
            ts_ms: Some(5),
            headers: Vec::new(),
        };
        let l = Letter::from_message(m);
        assert!(matches!(l.content, Content::Rows(_)));
        let why = l.replayable().unwrap_err();
        assert!(why.contains("sluicectl sources resnapshot m1"), "{why}");
    }
}
