//! The dead letters' formats, written by the services that give up on something and read
//! by the center, which lists them and replays the etl's (`sluicectl dlq`).

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::{BuildDocument, ChangeEvent};

/// Version of both letter formats.
pub const LETTER_VERSION: u8 = 1;

/// An event the etl could not apply, on the dead-letter topic (`topics.dead_letter`),
/// keyed like the event was. Replaying it publishes `event` to `topic` again.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EventLetter {
    pub v: u8,
    pub reason: String,
    /// The pipeline that could not apply it; none when it is not an event at all.
    #[serde(default)]
    pub pipeline: Option<String>,
    /// Where the event was read.
    pub topic: String,
    pub partition: i32,
    pub offset: i64,
    /// The event as it was read: JSON, or a string when it was not JSON.
    pub event: Value,
}

impl EventLetter {
    /// The change event a replay would publish, or why publishing it again cannot apply
    /// it: only a change event can (a build's document belongs to a build that is over;
    /// build again instead).
    pub fn change(&self) -> Result<ChangeEvent, &'static str> {
        ChangeEvent::deserialize(&self.event).map_err(|_| {
            if BuildDocument::deserialize(&self.event).is_ok() {
                "a build's document: build the pipeline again instead"
            } else {
                "not a change event: publishing it again would only dead-letter it again"
            }
        })
    }

    /// Whether publishing the event again can apply it, or why not (see [`Self::change`]).
    pub fn replayable(&self) -> Result<(), &'static str> {
        self.change().map(drop)
    }
}

/// Rows a worker could not decode, on its source's dead-letter topic
/// (`topics.source_dead_letter`). It holds no row data: once the cause is fixed the
/// table has to be read again (`sluicectl sources resnapshot`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RowsLetter {
    pub v: u8,
    pub reason: String,
    pub source: RowsAt,
    pub db: String,
    pub table: String,
}

/// Where in a binlog the rows were.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RowsAt {
    pub instance: String,
    pub server_id: u32,
    pub file: String,
    pub pos: u64,
    pub ts_ms: u64,
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn only_change_events_are_replayable() {
        let letter = |event| EventLetter {
            v: LETTER_VERSION,
            reason: "HTTP 400".into(),
            pipeline: Some("p".into()),
            topic: "t".into(),
            partition: 0,
            offset: 7,
            event,
        };
        let event = json!({
            "v": 1, "op": "c",
            "source": {"instance": "m1", "server_id": 1, "file": "b.000001", "pos": 4, "row": 0, "ts_ms": 0},
            "db": "d", "table": "t", "key": {"id": 1}, "version": 1,
            "columns": [], "before": null, "after": {"id": 1}
        });
        assert_eq!(letter(event).replayable(), Ok(()));
        assert!(letter(json!("garbage")).replayable().is_err());
        assert!(letter(json!({"marker": 1})).replayable().is_err());
    }

    #[test]
    fn a_letter_reads_back_as_written() {
        let text = r#"{"v":1,"reason":"r","pipeline":null,"topic":"t","partition":2,"offset":9,"event":{"op":"u"}}"#;
        let l: EventLetter = serde_json::from_str(text).unwrap();
        assert_eq!(
            serde_json::to_value(&l).unwrap(),
            serde_json::from_str::<Value>(text).unwrap()
        );
    }
}
