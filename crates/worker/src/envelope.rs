//! Turns decoded binlog events into Kafka records (topic, key, JSON payload).

use sluice_core::dead_letter::{RowsAt, RowsLetter, LETTER_VERSION};
use sluice_core::event::DdlEvent;
use sluice_core::position::file_seq;
use sluice_core::{ChangeEvent, ExternalVersion, SourceInfo, ENVELOPE_VERSION};
use sluice_kafka::TopicConfig;
use sluice_mysql::{Ddl, RowChange, Unreadable};

pub(crate) struct Record {
    pub topic: String,
    pub key: Vec<u8>,
    pub payload: Vec<u8>,
}

pub(crate) fn row(
    topics: &TopicConfig,
    instance: &str,
    epoch: u16,
    rc: RowChange,
) -> anyhow::Result<Record> {
    let seq = file_seq(&rc.file)?;
    let version = ExternalVersion::new(epoch as u64, seq, rc.pos + rc.row as u64)?;
    let topic = topics.rows_topic(instance, &rc.schema.db, &rc.schema.table);
    // Key = primary key, so each row's changes stay ordered in one partition.
    let key = serde_json::to_vec(&rc.key)?;
    let event = ChangeEvent {
        v: ENVELOPE_VERSION,
        source: SourceInfo {
            instance: instance.to_owned(),
            server_id: rc.server_id,
            file: rc.file.to_string(),
            pos: rc.pos,
            row: rc.row,
            gtid: rc.gtid,
            ts_ms: rc.ts_ms,
        },
        db: rc.schema.db.clone(),
        table: rc.schema.table.clone(),
        op: rc.op,
        key: rc.key,
        before: rc.before,
        after: rc.after,
        columns: rc.schema.infos.clone(),
        version: version.get(),
    };
    Ok(Record {
        topic,
        key,
        payload: serde_json::to_vec(&event)?,
    })
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
        topic: topics.schema_topic(instance),
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
        topic: topics.source_dead_letter_topic(instance),
        key: format!("{}.{}", u.db, u.table).into_bytes(),
        payload: serde_json::to_vec(&payload)?,
    })
}
