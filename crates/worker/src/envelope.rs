//! Turns decoded binlog events into Kafka records (topic, key, JSON payload).

use std::collections::HashMap;
use std::sync::Arc;

use sluice_mysql::decode::{RowValues, TableSchema};

use sluice_core::dead_letter::{RowsAt, RowsLetter, LETTER_VERSION};
use sluice_core::event::DdlEvent;
use sluice_core::position::file_seq;
use sluice_core::{ChangeEvent, ColumnInfo, ExternalVersion, SourceInfo, ENVELOPE_VERSION};
use sluice_kafka::TopicConfig;
use sluice_mysql::{Ddl, RowChange, Unreadable};

pub(crate) struct Record {
    pub topic: Arc<str>,
    pub key: Vec<u8>,
    pub payload: Vec<u8>,
}

/// The change topic of each table a task has seen, rendered once (not once per row).
/// Keyed by the table's schema as decoded: a new schema (after DDL) is a new entry.
#[derive(Default)]
pub(crate) struct RowTopics {
    /// By the schema's address (as a number: the map is sent across threads).
    by_schema: HashMap<usize, (Arc<TableSchema>, Arc<str>)>,
}

impl RowTopics {
    /// The topic of `schema`'s table, and whether it is the first time it is asked for.
    fn of(
        &mut self,
        topics: &TopicConfig,
        instance: &str,
        schema: &Arc<TableSchema>,
    ) -> (Arc<str>, bool) {
        let at = Arc::as_ptr(schema) as usize;
        if let Some((_, topic)) = self.by_schema.get(&at) {
            return (topic.clone(), false);
        }
        let topic: Arc<str> = topics
            .rows_topic(instance, &schema.db, &schema.table)
            .into();
        // The schema is kept with its entry, so its address is never reused by another;
        // the table's earlier schema (before a DDL) goes, so the map holds one per table.
        self.by_schema
            .retain(|_, (s, _)| s.db != schema.db || s.table != schema.table);
        self.by_schema.insert(at, (schema.clone(), topic.clone()));
        (topic, true)
    }
}

/// A row change as a record; `true` with it when its topic is new to this task (it may
/// need creating).
pub(crate) fn row(
    topics: &TopicConfig,
    seen: &mut RowTopics,
    instance: &str,
    epoch: u16,
    rc: RowChange,
) -> anyhow::Result<(Record, bool)> {
    let seq = file_seq(&rc.file)?;
    let version = ExternalVersion::new(epoch as u64, seq, rc.pos + rc.row as u64)?;
    let (topic, new_topic) = seen.of(topics, instance, &rc.schema);
    // Key = primary key, so each row's changes stay ordered in one partition.
    let key = serde_json::to_vec(&rc.key)?;
    let event = ChangeEvent {
        v: ENVELOPE_VERSION,
        source: SourceInfo {
            instance: instance.to_owned(),
            server_id: rc.server_id,
            file: String::from(&*rc.file),
            pos: rc.pos,
            row: rc.row,
            gtid: rc.gtid,
            ts_ms: rc.ts_ms,
        },
        db: rc.schema.db.clone(),
        table: rc.schema.table.clone(),
        op: rc.op,
        key: rc.key,
        before: Named::of(&rc.schema.infos, &rc.before),
        after: Named::of(&rc.schema.infos, &rc.after),
        columns: rc.schema.infos.clone(),
        version: version.get(),
    };
    // Sized for a typical row: one allocation rather than a series of regrowths.
    let mut payload = Vec::with_capacity(1024);
    serde_json::to_writer(&mut payload, &event)?;
    Ok((
        Record {
            topic,
            key,
            payload,
        },
        new_topic,
    ))
}

/// A decoded row serialized as the JSON object of its column names and values, without
/// building that object first.
struct Named<'a> {
    columns: &'a [ColumnInfo],
    values: &'a [serde_json::Value],
}

impl<'a> Named<'a> {
    fn of(columns: &'a [ColumnInfo], values: &'a Option<RowValues>) -> Option<Self> {
        let values = values.as_deref()?;
        Some(Named { columns, values })
    }
}

impl serde::Serialize for Named<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap as _;
        let mut map = s.serialize_map(Some(self.values.len()))?;
        for (c, v) in self.columns.iter().zip(self.values) {
            map.serialize_entry(&c.name, v)?;
        }
        map.end()
    }
}

pub(crate) fn ddl(topics: &TopicConfig, instance: &str, d: Ddl) -> anyhow::Result<Record> {
    let event = DdlEvent {
        v: ENVELOPE_VERSION,
        source: SourceInfo {
            instance: instance.to_owned(),
            server_id: d.server_id,
            file: d.file.to_string(),
            pos: d.pos,
            row: 0,
            gtid: d.gtid,
            ts_ms: d.ts_ms,
        },
        db: d.db.clone(),
        ddl: d.query,
    };
    Ok(Record {
        topic: topics.schema_topic(instance).into(),
        key: d.db.into_bytes(),
        payload: serde_json::to_vec(&event)?,
    })
}

pub(crate) fn unreadable(
    topics: &TopicConfig,
    instance: &str,
    u: &Unreadable,
) -> anyhow::Result<Record> {
    let payload = RowsLetter {
        v: LETTER_VERSION,
        reason: u.reason.clone(),
        source: RowsAt {
            instance: instance.to_owned(),
            server_id: u.server_id,
            file: u.file.to_string(),
            pos: u.pos,
            ts_ms: u.ts_ms,
        },
        db: u.db.clone(),
        table: u.table.clone(),
    };
    Ok(Record {
        topic: topics.source_dead_letter_topic(instance).into(),
        key: format!("{}.{}", u.db, u.table).into_bytes(),
        payload: serde_json::to_vec(&payload)?,
    })
}
