//! Turns decoded binlog events into Kafka records (topic, key, JSON payload).

use std::collections::HashMap;
use std::sync::Arc;

use serde_json::value::RawValue;
use sluice_mysql::decode::{RowValues, TableSchema};

use sluice_kafka::TopicConfig;
use sluice_model::dead_letter::{RowsAt, RowsLetter, LETTER_VERSION};
use sluice_model::event::DdlEvent;
use sluice_model::position::file_seq;
use sluice_model::{ChangeEvent, ColumnInfo, ExternalVersion, SourceInfo, ENVELOPE_VERSION};
use sluice_mysql::{Ddl, RowChange, Unreadable};

use crate::error::Result;

pub(crate) struct Record {
    pub topic: Arc<str>,
    pub key: Vec<u8>,
    pub payload: Vec<u8>,
}

/// What a task renders once per table it has seen, not once per row: the table's change
/// topic and its column list as JSON. Keyed by the table's schema as decoded: a new
/// schema (after DDL) is a new entry.
#[derive(Default)]
pub(crate) struct SeenTables {
    /// By the schema's address (as a number: the map is sent across threads).
    by_schema: HashMap<usize, Rendered>,
}

struct Rendered {
    /// Kept so that its address is never reused by another schema while it is here.
    schema: Arc<TableSchema>,
    topic: Arc<str>,
    columns: Box<RawValue>,
}

impl SeenTables {
    /// What is rendered for `schema`'s table, and whether it is the first time it is
    /// asked for (its topic may need creating).
    fn of(
        &mut self,
        topics: &TopicConfig,
        instance: &str,
        schema: &Arc<TableSchema>,
    ) -> Result<(&Rendered, bool)> {
        let at = Arc::as_ptr(schema) as usize;
        let new = !self.by_schema.contains_key(&at);
        if new {
            let rendered = Rendered {
                schema: schema.clone(),
                topic: topics
                    .rows_topic(instance, &schema.db, &schema.table)
                    .into(),
                columns: serde_json::value::to_raw_value(&schema.infos)?,
            };
            // The table's earlier schema (before a DDL) goes: one entry per table.
            self.by_schema
                .retain(|_, r| r.schema.db != schema.db || r.schema.table != schema.table);
            self.by_schema.insert(at, rendered);
        }
        Ok((&self.by_schema[&at], new))
    }
}

/// A row change as a record; `true` with it when its topic is new to this task (it may
/// need creating).
pub(crate) fn row(
    topics: &TopicConfig,
    seen: &mut SeenTables,
    instance: &str,
    epoch: u16,
    rc: RowChange,
) -> Result<(Record, bool)> {
    let seq = file_seq(&rc.file)?;
    let version = ExternalVersion::new(epoch as u64, seq, rc.pos + rc.row as u64)?;
    let (rendered, new_topic) = seen.of(topics, instance, &rc.schema)?;
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
        columns: &*rendered.columns,
        version: version.get(),
    };
    // Sized for a typical row: one allocation rather than a series of regrowths.
    let mut payload = Vec::with_capacity(1024);
    serde_json::to_writer(&mut payload, &event)?;
    Ok((
        Record {
            topic: rendered.topic.clone(),
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

pub(crate) fn ddl(topics: &TopicConfig, instance: &str, d: Ddl) -> Result<Record> {
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

pub(crate) fn unreadable(topics: &TopicConfig, instance: &str, u: &Unreadable) -> Result<Record> {
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
