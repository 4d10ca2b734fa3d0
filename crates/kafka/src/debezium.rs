//! Change events of Debezium's MySQL (and MariaDB) connector, as Sluice's own
//! [`ChangeEvent`]s (README, "Input from Debezium").
//!
//! Debezium writes one JSON message per row change: `{"before", "after", "source", "op"}`,
//! wrapped as `{"schema", "payload"}` when its converter includes schemas. Its `source`
//! holds the binlog coordinates of the row (`file`, `pos` of the rows event, `row` within
//! it), so the event gets the same external version a Sluice worker gives the same row
//! change, and every invariant that rests on versions holds for it. Snapshot records
//! (`op: "r"`) carry the binlog position the snapshot started at.
//!
//! With schemas, values are turned into the forms Sluice's own events use (exact decimal
//! strings, `YYYY-MM-DD` dates, ISO date-times, JSON values, sets as arrays); without, they
//! stay as Debezium wrote them, so set the connector's `decimal.handling.mode=string`.

use base64::Engine as _;
use serde_json::{Map, Value};

use sluice_model::event::{ChangeEvent, ColumnInfo, Op, SourceInfo};
use sluice_model::version::ExternalVersion;

/// The change event a Debezium message stands for; `None` for what changes no row (a
/// tombstone, which follows each delete). The error says why the message cannot be
/// applied: a table's topic holds change events and tombstones alone, so anything else is
/// a dead letter, never skipped.
pub fn change_event(key: Option<&[u8]>, value: &[u8]) -> Result<Option<ChangeEvent>, String> {
    if value.is_empty() {
        return Ok(None);
    }
    let value: Value =
        serde_json::from_slice(value).map_err(|e| format!("not a Debezium JSON message: {e}"))?;
    if value.is_null() {
        return Ok(None);
    }
    let (schema, payload) = unwrap(value);
    if !payload.is_object() {
        return Err(format!("not a change event (a JSON object): {payload}"));
    }
    let op = payload
        .get("op")
        .and_then(Value::as_str)
        .ok_or("no `op`: not a row change")?;
    let op = match op {
        "c" => Op::Create,
        "u" => Op::Update,
        "d" => Op::Delete,
        "r" => Op::Read,
        "t" => return Err("a TRUNCATE (op t): rebuild the index".into()),
        other => return Err(format!("unknown op `{other}`")),
    };
    let source = payload
        .get("source")
        .and_then(Value::as_object)
        .ok_or("no `source` block")?;
    let text = |k: &str| source.get(k).and_then(Value::as_str).map(str::to_owned);
    let number = |k: &str| source.get(k).and_then(Value::as_u64);
    let file = text("file").ok_or("source.file: missing")?;
    let pos = number("pos").ok_or("source.pos: missing")?;
    let row = number("row").unwrap_or(0);
    let seq = sluice_model::position::file_seq(&file).map_err(|e| format!("source.file: {e}"))?;
    let version = ExternalVersion::new(0, seq, pos + row).map_err(|e| e.to_string())?;
    let fields = schema.as_ref().map(row_fields);
    let image = |k: &str| -> Option<Map<String, Value>> {
        let row = payload.get(k)?.as_object()?;
        Some(match &fields {
            Some(f) => converted(row, f),
            None => row.clone(),
        })
    };
    let (before, after) = (image("before"), image("after"));
    let key = key_of(key)?;
    let columns = fields.map(|f| columns_of(&f, &key)).unwrap_or_default();
    Ok(Some(ChangeEvent {
        v: 1,
        source: SourceInfo {
            instance: text("name").unwrap_or_default(),
            server_id: number("server_id").unwrap_or(0) as u32,
            file,
            pos,
            row: row as u32,
            gtid: text("gtid"),
            ts_ms: number("ts_ms").unwrap_or(0),
        },
        db: text("db").ok_or("source.db: missing")?,
        table: text("table").ok_or("source.table: missing")?,
        op,
        key,
        before,
        after,
        columns: columns.into(),
        version: version.get(),
    }))
}

/// `(schema, payload)` of a message with schemas; `(None, message)` without.
fn unwrap(value: Value) -> (Option<Value>, Value) {
    match value {
        Value::Object(mut o) if o.len() == 2 && o.contains_key("schema") => {
            let payload = o.remove("payload").unwrap_or(Value::Null);
            (o.remove("schema"), payload)
        }
        other => (None, other),
    }
}

/// The row's columns and their schemas, from the envelope's `after` (or `before`) field.
fn row_fields(schema: &Value) -> Vec<(String, Value)> {
    let envelope = schema["fields"].as_array().cloned().unwrap_or_default();
    envelope
        .iter()
        .find(|f| f["field"] == "after" || f["field"] == "before")
        .and_then(|f| f["fields"].as_array())
        .map(|cols| {
            cols.iter()
                .filter_map(|c| Some((c["field"].as_str()?.to_owned(), c.clone())))
                .collect()
        })
        .unwrap_or_default()
}

/// The message key's columns: `{"id": 1}` (or its payload, with schemas).
fn key_of(key: Option<&[u8]>) -> Result<Map<String, Value>, String> {
    let Some(bytes) = key.filter(|k| !k.is_empty()) else {
        return Ok(Map::new());
    };
    let value: Value =
        serde_json::from_slice(bytes).map_err(|e| format!("the message key: {e}"))?;
    let (schema, payload) = unwrap(value);
    let mut key = match payload {
        Value::Object(o) => o,
        Value::Null => Map::new(),
        other => return Err(format!("the message key is not an object: {other}")),
    };
    if let Some(s) = schema {
        let fields: Vec<(String, Value)> = (s["fields"].as_array().into_iter().flatten())
            .filter_map(|c| Some((c["field"].as_str()?.to_owned(), c.clone())))
            .collect();
        key = converted(&key, &fields);
    }
    Ok(key)
}

fn columns_of(fields: &[(String, Value)], key: &Map<String, Value>) -> Vec<ColumnInfo> {
    fields
        .iter()
        .map(|(name, schema)| ColumnInfo {
            name: name.clone(),
            sql_type: sql_type(schema).into(),
            key: key.contains_key(name),
        })
        .collect()
}

/// The SQL type a field's schema stands for, as Sluice names types (what the index
/// mapping is generated from).
fn sql_type(schema: &Value) -> &'static str {
    match (schema["name"].as_str(), schema["type"].as_str()) {
        (
            Some("org.apache.kafka.connect.data.Decimal" | "io.debezium.data.VariableScaleDecimal"),
            _,
        ) => "decimal",
        (Some("io.debezium.time.Date"), _) => "date",
        (Some("io.debezium.time.Timestamp" | "io.debezium.time.MicroTimestamp"), _) => "datetime",
        (Some("io.debezium.time.ZonedTimestamp"), _) => "timestamp",
        (Some("io.debezium.time.MicroTime" | "io.debezium.time.Time"), _) => "time",
        (Some("io.debezium.data.Json"), _) => "json",
        (Some("io.debezium.data.Enum"), _) => "enum",
        (Some("io.debezium.data.EnumSet"), _) => "set",
        (Some("io.debezium.data.Bits"), _) => "bit",
        (Some("io.debezium.time.Year"), _) => "year",
        (_, Some("int8" | "int16")) => "smallint",
        (_, Some("int32")) => "int",
        (_, Some("int64")) => "bigint",
        (_, Some("float")) => "float",
        (_, Some("double")) => "double",
        (_, Some("boolean")) => "boolean",
        (_, Some("bytes")) => "blob",
        _ => "varchar",
    }
}

/// `row` with each value in the form Sluice's own events give it.
fn converted(row: &Map<String, Value>, fields: &[(String, Value)]) -> Map<String, Value> {
    row.iter()
        .map(|(name, v)| {
            let schema = fields.iter().find(|(n, _)| n == name).map(|(_, s)| s);
            let v = match schema {
                Some(s) if !v.is_null() => value_of(v, s).unwrap_or_else(|| v.clone()),
                _ => v.clone(),
            };
            (name.clone(), v)
        })
        .collect()
}

/// One value by its schema's semantic name; `None` leaves it as it is.
fn value_of(v: &Value, schema: &Value) -> Option<Value> {
    let string = |s: String| Some(Value::String(s));
    match schema["name"].as_str()? {
        "org.apache.kafka.connect.data.Decimal" => {
            let scale = schema["parameters"]["scale"].as_str()?.parse().ok()?;
            match v {
                Value::String(b64) => string(decimal(&bytes(b64)?, scale)),
                _ => None,
            }
        }
        "io.debezium.data.VariableScaleDecimal" => {
            let scale = v["scale"].as_u64()? as u32;
            string(decimal(&bytes(v["value"].as_str()?)?, scale))
        }
        "io.debezium.time.Date" => string(date_time(v.as_i64()? * 86_400_000_000)[..10].to_owned()),
        "io.debezium.time.Timestamp" => string(trimmed(date_time(v.as_i64()? * 1000), 3)),
        "io.debezium.time.MicroTimestamp" => string(date_time(v.as_i64()?)),
        "io.debezium.data.Json" => serde_json::from_str(v.as_str()?).ok(),
        "io.debezium.data.EnumSet" => Some(Value::Array(
            v.as_str()?
                .split(',')
                .filter(|s| !s.is_empty())
                .map(|s| Value::String(s.to_owned()))
                .collect(),
        )),
        "io.debezium.data.Bits" => {
            let b = bytes(v.as_str()?)?;
            // Little-endian, as Kafka Connect writes a BIT's bytes.
            Some(Value::from(
                b.iter()
                    .rev()
                    .fold(0u64, |acc, x| (acc << 8) | u64::from(*x)),
            ))
        }
        _ => None,
    }
}

fn bytes(b64: &str) -> Option<Vec<u8>> {
    base64::engine::general_purpose::STANDARD.decode(b64).ok()
}

/// A two's-complement big-endian unscaled integer with `scale` digits after the point,
/// as exact decimal text (`1250`, 2 → `12.50`).
fn decimal(unscaled: &[u8], scale: u32) -> String {
    let negative = unscaled.first().is_some_and(|b| b & 0x80 != 0);
    // Magnitude as big-endian base-256 digits.
    let mut magnitude: Vec<u8> = if negative {
        let mut m: Vec<u8> = unscaled.iter().map(|b| !b).collect();
        for byte in m.iter_mut().rev() {
            let (sum, carry) = byte.overflowing_add(1);
            *byte = sum;
            if !carry {
                break;
            }
        }
        m
    } else {
        unscaled.to_vec()
    };
    // Repeated division by 10 gives the decimal digits, least significant first.
    let mut digits = Vec::new();
    while magnitude.iter().any(|b| *b != 0) {
        let mut rest = 0u32;
        for byte in magnitude.iter_mut() {
            let cur = (rest << 8) | u32::from(*byte);
            *byte = (cur / 10) as u8;
            rest = cur % 10;
        }
        digits.push(char::from(b'0' + rest as u8));
    }
    while digits.len() <= scale as usize {
        digits.push('0');
    }
    let mut text: String = digits.iter().rev().collect();
    if scale > 0 {
        text.insert(text.len() - scale as usize, '.');
    }
    if negative {
        text.insert(0, '-');
    }
    text
}

/// `YYYY-MM-DDTHH:MM:SS.ffffff` of microseconds since the epoch (UTC).
fn date_time(micros: i64) -> String {
    let days = micros.div_euclid(86_400_000_000);
    let of_day = micros.rem_euclid(86_400_000_000);
    let (y, m, d) = civil(days);
    let secs = of_day / 1_000_000;
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}.{:06}",
        secs / 3600,
        secs / 60 % 60,
        secs % 60,
        of_day % 1_000_000
    )
}

/// `text` (ending in six fraction digits) with `digits` of them, or none when all zero.
fn trimmed(mut text: String, digits: usize) -> String {
    let point = text.len() - 7;
    if text[point + 1..].bytes().all(|b| b == b'0') {
        text.truncate(point);
    } else {
        text.truncate(point + 1 + digits);
    }
    text
}

/// The proleptic Gregorian date `days` after 1970-01-01.
fn civil(days: i64) -> (i64, u32, u32) {
    // Shifted to a year starting in March, so the leap day ends it.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_message_without_schemas_keeps_its_values_and_gets_the_worker_s_version() {
        let value = json!({
            "before": {"id": 7, "name": "old"}, "after": {"id": 7, "name": "new"},
            "source": {"name": "dbz", "server_id": 1, "file": "binlog.000003", "pos": 4015,
                       "row": 2, "db": "shop", "table": "items", "ts_ms": 1700000000000u64,
                       "gtid": null, "snapshot": "false"},
            "op": "u", "ts_ms": 1700000000100u64
        });
        let e = change_event(Some(br#"{"id": 7}"#), value.to_string().as_bytes())
            .unwrap()
            .unwrap();
        assert_eq!(e.op, Op::Update);
        assert_eq!((e.db.as_str(), e.table.as_str()), ("shop", "items"));
        assert_eq!(e.document_id().as_deref(), Some("7"));
        assert_eq!(e.after.unwrap()["name"], "new");
        assert_eq!(e.version, ExternalVersion::new(0, 3, 4017).unwrap().get());
        assert!(e.columns.is_empty());
        // A tombstone follows each delete: nothing to apply.
        assert!(change_event(Some(br#"{"id": 7}"#), b"").unwrap().is_none());
        assert!(change_event(None, b"null").unwrap().is_none());
    }

    #[test]
    fn with_schemas_values_take_the_forms_sluice_s_events_use() {
        let field = |name: &str, t: &str, semantic: Option<&str>, params: Value| {
            let mut f = json!({"field": name, "type": t, "optional": true});
            if let Some(s) = semantic {
                f["name"] = json!(s);
            }
            if !params.is_null() {
                f["parameters"] = params;
            }
            f
        };
        let row = json!({"type": "struct", "field": "after", "fields": [
            field("id", "int32", None, Value::Null),
            field("price", "bytes", Some("org.apache.kafka.connect.data.Decimal"), json!({"scale": "2"})),
            field("debt", "bytes", Some("org.apache.kafka.connect.data.Decimal"), json!({"scale": "2"})),
            field("day", "int32", Some("io.debezium.time.Date"), Value::Null),
            field("at", "int64", Some("io.debezium.time.Timestamp"), Value::Null),
            field("at6", "int64", Some("io.debezium.time.MicroTimestamp"), Value::Null),
            field("stamp", "string", Some("io.debezium.time.ZonedTimestamp"), Value::Null),
            field("doc", "string", Some("io.debezium.data.Json"), Value::Null),
            field("tags", "string", Some("io.debezium.data.EnumSet"), Value::Null),
        ]});
        let message = json!({
            "schema": {"type": "struct", "fields": [row, {"field": "op", "type": "string"}]},
            "payload": {
                "before": null,
                "after": {"id": 1, "price": "BOI=", "debt": "/4M=", "day": 19723,
                          "at": 1704103200000i64, "at6": 1704103200123456i64,
                          "stamp": "2024-01-01T10:00:00Z", "doc": "{\"a\":[1,2]}", "tags": "a,c"},
                "source": {"file": "mysql-bin.000001", "pos": 100, "row": 0, "db": "d", "table": "t"},
                "op": "c"
            }
        });
        let key = json!({"schema": {"type": "struct", "fields": [{"field": "id", "type": "int32"}]},
                         "payload": {"id": 1}});
        let e = change_event(
            Some(key.to_string().as_bytes()),
            message.to_string().as_bytes(),
        )
        .unwrap()
        .unwrap();
        let after = e.after.unwrap();
        assert_eq!(after["price"], "12.50");
        assert_eq!(after["debt"], "-1.25");
        assert_eq!(after["day"], "2024-01-01");
        assert_eq!(after["at"], "2024-01-01T10:00:00");
        assert_eq!(after["at6"], "2024-01-01T10:00:00.123456");
        assert_eq!(after["stamp"], "2024-01-01T10:00:00Z");
        assert_eq!(after["doc"], json!({"a": [1, 2]}));
        assert_eq!(after["tags"], json!(["a", "c"]));
        let types: Vec<(&str, &str, bool)> = e
            .columns
            .iter()
            .map(|c| (c.name.as_str(), c.sql_type.as_str(), c.key))
            .collect();
        assert_eq!(types[0], ("id", "int", true));
        assert_eq!(types[1], ("price", "decimal", false));
        assert_eq!(e.op, Op::Create);
    }

    #[test]
    fn decimals_and_dates_convert_exactly() {
        assert_eq!(decimal(&[0x04, 0xe2], 2), "12.50");
        assert_eq!(decimal(&[0x00], 0), "0");
        assert_eq!(decimal(&[0x00], 3), "0.000");
        assert_eq!(decimal(&[0xff], 1), "-0.1");
        assert_eq!(decimal(&[0x80, 0x00], 0), "-32768");
        assert_eq!(civil(0), (1970, 1, 1));
        assert_eq!(civil(19_723), (2024, 1, 1));
        assert_eq!(civil(-1), (1969, 12, 31));
        assert_eq!(civil(11_016), (2000, 2, 29));
        assert_eq!(trimmed(date_time(1_500_000), 3), "1970-01-01T00:00:01.500");
        assert_eq!(date_time(-1), "1969-12-31T23:59:59.999999");
    }

    #[test]
    fn what_is_no_change_event_is_refused_not_skipped() {
        assert_eq!(
            change_event(None, br#""text""#).unwrap_err(),
            r#"not a change event (a JSON object): "text""#
        );
        assert_eq!(
            change_event(None, br#"{"ddl": "CREATE TABLE t (id INT)"}"#).unwrap_err(),
            "no `op`: not a row change"
        );
    }

    #[test]
    fn a_truncate_is_refused_with_what_to_do() {
        let value =
            json!({"source": {"file": "b.000001", "pos": 4, "db": "d", "table": "t"}, "op": "t"});
        assert_eq!(
            change_event(None, value.to_string().as_bytes()).unwrap_err(),
            "a TRUNCATE (op t): rebuild the index"
        );
    }
}
