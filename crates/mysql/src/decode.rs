//! Decoding rows with the schema in force when they were written.
//!
//! With `binlog_row_metadata=FULL` every TABLE_MAP event carries the table's column names,
//! signedness, charsets, ENUM/SET labels and primary key as they were when the rows that
//! follow it were written. Decoding from it (rather than from today's
//! `information_schema`) is what keeps a row written before an `ALTER TABLE` decodable
//! after it, however far behind the reader is.

use std::sync::Arc;

use base64::Engine as _;
use mysql_async::binlog::events::{OptionalMetadataField, TableMapEvent};
use mysql_async::binlog::value::BinlogValue;
use mysql_async::consts::ColumnType;
use mysql_async::Value;
use mysql_common::io::ParseBuf;
use serde_json::{Map, Number, Value as Json};
use sluice_model::ColumnInfo;

/// MySQL's `binary` character set: the column holds bytes, not text.
const BINARY_CHARSET: u16 = 63;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Int,
    Float,
    Double,
    Decimal,
    Text,
    Bytes,
    Date,
    DateTime,
    Timestamp,
    Time,
    Year,
    Enum,
    Set,
    Bit,
    Json,
    /// MySQL 9's VECTOR: 4-byte little-endian floats.
    Vector,
}

#[derive(Debug, Clone)]
pub struct ColumnSchema {
    pub name: String,
    pub kind: Kind,
    pub charset: u16,
    /// Fractional-second digits of temporal columns.
    pub fsp: u8,
    pub labels: Vec<String>,
    pub key: bool,
    pub fixup: Fixup,
}

/// Corrections for what the binlog (or its decoder) leaves out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fixup {
    None,
    /// Signed MEDIUMINT arrives without sign extension from its 24 bits.
    SignExtend24,
    /// BINARY(n) is logged without its trailing zero bytes; SELECT returns all n.
    PadTo(usize),
}

/// A table as one TABLE_MAP event described it.
#[derive(Debug, Clone)]
pub struct TableSchema {
    pub db: String,
    pub table: String,
    pub columns: Vec<ColumnSchema>,
    /// The same columns in the envelope's form, shared by every event of this table map.
    pub infos: Arc<[ColumnInfo]>,
    pub key_columns: Vec<usize>,
    /// How each column's values are encoded in a row image, in column order.
    wire: Vec<Wire>,
}

/// A column's binlog encoding, from its TABLE_MAP entry.
#[derive(Debug, Clone)]
struct Wire {
    ty: ColumnType,
    meta: Box<[u8]>,
    unsigned: bool,
}

/// A row image decoded: one JSON value per column of its [`TableSchema`], in column order.
pub type RowValues = Vec<Json>;

/// Set in a partial update's value options: JSON columns may hold diffs.
const PARTIAL_JSON_UPDATES: u64 = 1;

impl TableSchema {
    /// Builds the schema from a TABLE_MAP event. Fails when the event lacks column names
    /// (`binlog_row_metadata` is not FULL), because then rows could not be named.
    pub fn from_table_map(tme: &TableMapEvent<'_>) -> Result<Self, String> {
        let n = tme.columns_count() as usize;
        let meta = OptionalMeta::read(tme)?;
        if meta.names.len() != n {
            return Err(format!(
                "TABLE_MAP of {}.{} carries {} column names for {n} columns: set binlog_row_metadata=FULL",
                tme.database_name(),
                tme.table_name(),
                meta.names.len()
            ));
        }
        let (names, key_columns, mut per_column) = meta.per_column();
        let mut columns = Vec::with_capacity(n);
        let mut infos = Vec::with_capacity(n);
        let mut wire = Vec::with_capacity(n);
        for (i, name) in names.into_iter().enumerate() {
            let key = key_columns.contains(&i);
            let (column, info, w) = per_column.column(tme, i, name, key)?;
            wire.push(w);
            infos.push(info);
            columns.push(column);
        }
        Ok(Self {
            db: tme.database_name().into_owned(),
            table: tme.table_name().into_owned(),
            columns,
            infos: infos.into(),
            key_columns,
            wire,
        })
    }

    /// Decodes the row image at the front of `data` (the rest of a rows event's data), and
    /// moves `data` past it:
    /// a NULL bitmap over the image's columns, then each non-NULL value in its binlog
    /// encoding. `present` is the event's column bitmap for this image; `shared` is set
    /// for the after image of a partial update, which starts with its value options.
    /// Values are decoded straight from the event's bytes, with the column encodings read
    /// once per TABLE_MAP.
    pub fn decode_image(
        &self,
        present: &bitvec::slice::BitSlice<u8>,
        shared: bool,
        data: &mut &[u8],
    ) -> Result<RowValues, String> {
        const SHORT: &str = "row image ends early";
        let mut buf = ParseBuf(data);
        let n = self.columns.len();
        let partial = if shared {
            let options = buf.checked_eat_lenenc_int().ok_or(SHORT)?;
            let json = (self.wire.iter())
                .filter(|w| w.ty == ColumnType::MYSQL_TYPE_JSON)
                .count();
            (options & PARTIAL_JSON_UPDATES != 0)
                .then(|| buf.checked_eat(json.div_ceil(8)).ok_or(SHORT))
                .transpose()?
        } else {
            None
        };
        let count = present.iter().by_vals().filter(|&p| p).count();
        if count != n || present.iter().by_vals().take(n).any(|p| !p) {
            return Err(format!(
                "row has {count} values for {n} columns (binlog_row_image must be FULL)"
            ));
        }
        let nulls = buf.checked_eat(n.div_ceil(8)).ok_or(SHORT)?;
        let bit = |bits: &[u8], i: usize| bits[i / 8] >> (i % 8) & 1 == 1;
        // A partial update's bits are over the JSON columns alone, in column order.
        let mut json_partial = (0..).map(|j| partial.is_some_and(|p| bit(p, j)));
        let mut out = Vec::with_capacity(n);
        for (i, (col, wire)) in self.columns.iter().zip(&self.wire).enumerate() {
            let is_partial =
                wire.ty == ColumnType::MYSQL_TYPE_JSON && json_partial.next().unwrap_or(false);
            if bit(nulls, i) {
                out.push(Json::Null);
                continue;
            }
            let value = buf
                .parse::<BinlogValue<'_>>((wire.ty, &wire.meta, wire.unsigned, is_partial))
                .map_err(|e| e.to_string())
                .and_then(|v| value_to_json(col, v));
            out.push(value.map_err(|e| format!("column `{}`: {e}", col.name))?);
        }
        *data = &data[data.len() - buf.len()..];
        Ok(out)
    }

    /// The primary-key columns of a decoded row, by name in key order.
    pub fn key_of(&self, row: &[Json]) -> Map<String, Json> {
        self.key_columns
            .iter()
            .filter_map(|&i| Some((self.columns.get(i)?, row.get(i)?)))
            .map(|(c, v)| (c.name.clone(), v.clone()))
            .collect()
    }
}

/// A TABLE_MAP event's optional metadata, each field as a list in column order (over the
/// columns it concerns: signedness over numeric columns, labels over ENUM or SET ones…).
#[derive(Default)]
struct OptionalMeta {
    names: Vec<String>,
    signedness: Vec<bool>,
    enum_labels: Vec<Vec<String>>,
    set_labels: Vec<Vec<String>>,
    key_columns: Vec<usize>,
    default_charset: Option<u16>,
    non_default_charsets: Vec<(usize, u16)>,
    column_charsets: Option<Vec<u16>>,
}

impl OptionalMeta {
    /// Reads every optional metadata field of `tme`.
    fn read(tme: &TableMapEvent<'_>) -> Result<Self, String> {
        let mut meta = Self::default();
        for field in tme.iter_optional_meta() {
            let field = field.map_err(|e| format!("bad optional metadata: {e}"))?;
            meta.add(field)?;
        }
        Ok(meta)
    }

    /// Records one optional metadata field; fields Sluice does not use are ignored.
    fn add(&mut self, field: OptionalMetadataField<'_>) -> Result<(), String> {
        match field {
            OptionalMetadataField::Signedness(bits) => {
                self.signedness = bits.iter().by_vals().collect()
            }
            OptionalMetadataField::ColumnName(cn) => {
                for name in cn.iter_names() {
                    self.names
                        .push(name.map_err(|e| e.to_string())?.name().into_owned());
                }
            }
            OptionalMetadataField::DefaultCharset(dc) => {
                self.default_charset = Some(dc.default_charset());
                for nd in dc.iter_non_default() {
                    let nd = nd.map_err(|e| e.to_string())?;
                    self.non_default_charsets
                        .push((nd.column_index() as usize, nd.charset()));
                }
            }
            OptionalMetadataField::ColumnCharset(cc) => {
                let mut v = Vec::new();
                for c in cc.iter_charsets() {
                    v.push(c.map_err(|e| e.to_string())?);
                }
                self.column_charsets = Some(v);
            }
            OptionalMetadataField::EnumStrValue(ev) => {
                for values in ev.iter_values() {
                    let values = values.map_err(|e| e.to_string())?;
                    let labels = values.values().iter().map(|v| v.value().into_owned());
                    self.enum_labels.push(labels.collect());
                }
            }
            OptionalMetadataField::SetStrValue(sv) => {
                for values in sv.iter_values() {
                    let values = values.map_err(|e| e.to_string())?;
                    let labels = values.values().iter().map(|v| v.value().into_owned());
                    self.set_labels.push(labels.collect());
                }
            }
            OptionalMetadataField::SimplePrimaryKey(pk) => {
                for i in pk.iter_indexes() {
                    self.key_columns
                        .push(i.map_err(|e| e.to_string())? as usize);
                }
            }
            OptionalMetadataField::PrimaryKeyWithPrefix(pk) => {
                for k in pk.iter_keys() {
                    let k = k.map_err(|e| e.to_string())?;
                    self.key_columns.push(k.column_index() as usize);
                }
            }
            _ => {}
        }
        Ok(())
    }

    /// The column names, the primary-key columns, and the rest to hand out column by column.
    fn per_column(self) -> (Vec<String>, Vec<usize>, PerColumn) {
        let rest = PerColumn {
            signed: self.signedness.into_iter(),
            enums: self.enum_labels.into_iter(),
            sets: self.set_labels.into_iter(),
            char_idx: 0,
            non_default: self.non_default_charsets.into_iter().peekable(),
            default_charset: self.default_charset,
            column_charsets: self.column_charsets,
        };
        (self.names, self.key_columns, rest)
    }
}

/// The optional metadata that is listed only for some columns, handed out in column
/// order: each numeric column takes the next signedness, each character column the next
/// charset, each ENUM or SET column the next labels.
struct PerColumn {
    signed: std::vec::IntoIter<bool>,
    enums: std::vec::IntoIter<Vec<String>>,
    sets: std::vec::IntoIter<Vec<String>>,
    /// How many character columns came before.
    char_idx: usize,
    non_default: std::iter::Peekable<std::vec::IntoIter<(usize, u16)>>,
    default_charset: Option<u16>,
    column_charsets: Option<Vec<u16>>,
}

impl PerColumn {
    /// Builds column `i` of `tme` for decoding, for the envelope and as its binlog encoding.
    fn column(
        &mut self,
        tme: &TableMapEvent<'_>,
        i: usize,
        name: String,
        key: bool,
    ) -> Result<(ColumnSchema, ColumnInfo, Wire), String> {
        let ty = tme
            .get_column_type(i)
            .map_err(|e| format!("column {name}: {e}"))?
            .ok_or_else(|| format!("column {name}: no type"))?;
        let meta = tme.get_column_metadata(i).unwrap_or(&[]);
        let unsigned = ty.is_numeric_type() && self.signed.next().unwrap_or(false);
        let charset = if ty.is_character_type() {
            self.next_charset()
        } else {
            0
        };
        let (kind, fsp, sql_type) = classify(ty, meta, unsigned, charset);
        let labels = match kind {
            Kind::Enum => self.enums.next().unwrap_or_default(),
            Kind::Set => self.sets.next().unwrap_or_default(),
            _ => Vec::new(),
        };
        let fixup = match (ty, kind) {
            (ColumnType::MYSQL_TYPE_INT24, _) if !unsigned => Fixup::SignExtend24,
            (ColumnType::MYSQL_TYPE_STRING, Kind::Bytes) => Fixup::PadTo(string_length(meta)),
            _ => Fixup::None,
        };
        let wire = Wire {
            ty,
            meta: meta.into(),
            unsigned,
        };
        let info = ColumnInfo {
            name: name.clone(),
            sql_type,
            key,
        };
        let column = ColumnSchema {
            name,
            kind,
            charset,
            fsp,
            labels,
            key,
            fixup,
        };
        Ok((column, info, wire))
    }

    /// The next character column's charset: its own if listed, else the default.
    fn next_charset(&mut self) -> u16 {
        let c = match &self.column_charsets {
            Some(v) => v.get(self.char_idx).copied().unwrap_or(0),
            None => match self.non_default.peek() {
                Some(&(idx, cs)) if idx == self.char_idx => {
                    self.non_default.next();
                    cs
                }
                _ => self.default_charset.unwrap_or(0),
            },
        };
        self.char_idx += 1;
        c
    }
}

/// Maps a binlog column type and its metadata to a decoding kind, fractional digits and
/// the SQL type name reported in the envelope.
fn classify(ty: ColumnType, meta: &[u8], unsigned: bool, charset: u16) -> (Kind, u8, String) {
    use ColumnType::*;
    let u = if unsigned { " unsigned" } else { "" };
    let m0 = meta.first().copied().unwrap_or(0);
    let m1 = meta.get(1).copied().unwrap_or(0);
    let binary = charset == BINARY_CHARSET;
    match ty {
        MYSQL_TYPE_TINY => (Kind::Int, 0, format!("tinyint{u}")),
        MYSQL_TYPE_SHORT => (Kind::Int, 0, format!("smallint{u}")),
        MYSQL_TYPE_INT24 => (Kind::Int, 0, format!("mediumint{u}")),
        MYSQL_TYPE_LONG => (Kind::Int, 0, format!("int{u}")),
        MYSQL_TYPE_LONGLONG => (Kind::Int, 0, format!("bigint{u}")),
        MYSQL_TYPE_FLOAT => (Kind::Float, 0, format!("float{u}")),
        MYSQL_TYPE_DOUBLE => (Kind::Double, 0, format!("double{u}")),
        MYSQL_TYPE_NEWDECIMAL | MYSQL_TYPE_DECIMAL => {
            (Kind::Decimal, 0, format!("decimal({m0},{m1}){u}"))
        }
        MYSQL_TYPE_YEAR => (Kind::Year, 0, "year".into()),
        MYSQL_TYPE_DATE | MYSQL_TYPE_NEWDATE => (Kind::Date, 0, "date".into()),
        MYSQL_TYPE_DATETIME => (Kind::DateTime, 0, "datetime".into()),
        MYSQL_TYPE_DATETIME2 => (Kind::DateTime, m0, with_fsp("datetime", m0)),
        MYSQL_TYPE_TIMESTAMP => (Kind::Timestamp, 0, "timestamp".into()),
        MYSQL_TYPE_TIMESTAMP2 => (Kind::Timestamp, m0, with_fsp("timestamp", m0)),
        MYSQL_TYPE_TIME => (Kind::Time, 0, "time".into()),
        MYSQL_TYPE_TIME2 => (Kind::Time, m0, with_fsp("time", m0)),
        MYSQL_TYPE_ENUM => (Kind::Enum, 0, "enum".into()),
        MYSQL_TYPE_SET => (Kind::Set, 0, "set".into()),
        MYSQL_TYPE_BIT => (Kind::Bit, 0, format!("bit({})", m1 as u32 * 8 + m0 as u32)),
        MYSQL_TYPE_JSON => (Kind::Json, 0, "json".into()),
        MYSQL_TYPE_VARCHAR | MYSQL_TYPE_VAR_STRING => {
            if binary {
                (Kind::Bytes, 0, "varbinary".into())
            } else {
                (Kind::Text, 0, "varchar".into())
            }
        }
        MYSQL_TYPE_STRING => {
            if binary {
                (Kind::Bytes, 0, "binary".into())
            } else {
                (Kind::Text, 0, "char".into())
            }
        }
        MYSQL_TYPE_TINY_BLOB | MYSQL_TYPE_MEDIUM_BLOB | MYSQL_TYPE_LONG_BLOB | MYSQL_TYPE_BLOB => {
            let size = match m0 {
                1 => "tiny",
                3 => "medium",
                4 => "long",
                _ => "",
            };
            if binary {
                (Kind::Bytes, 0, format!("{size}blob"))
            } else {
                (Kind::Text, 0, format!("{size}text"))
            }
        }
        MYSQL_TYPE_GEOMETRY => (Kind::Bytes, 0, "geometry".into()),
        MYSQL_TYPE_VECTOR => (Kind::Vector, 0, "vector".into()),
        other => (Kind::Bytes, 0, format!("{other:?}").to_ascii_lowercase()),
    }
}

/// The declared byte length of a CHAR/BINARY column from its TABLE_MAP metadata (the
/// high bits of the length are folded into the type byte for lengths over 255).
fn string_length(meta: &[u8]) -> usize {
    let (b0, b1) = (
        meta.first().copied().unwrap_or(0) as usize,
        meta.get(1).copied().unwrap_or(0) as usize,
    );
    if (b0 & 0x30) != 0x30 {
        b1 | (((b0 & 0x30) ^ 0x30) << 4)
    } else {
        b1
    }
}

fn with_fsp(name: &str, fsp: u8) -> String {
    if fsp == 0 {
        name.to_owned()
    } else {
        format!("{name}({fsp})")
    }
}

/// The JSON of one binlog value of column `col`.
fn value_to_json(col: &ColumnSchema, value: BinlogValue<'_>) -> Result<Json, String> {
    let value = match value {
        BinlogValue::Value(v) => v,
        BinlogValue::Jsonb(j) => {
            return Json::try_from(j).map_err(|e| format!("invalid JSON document: {e}"));
        }
        BinlogValue::JsonDiff(_) => {
            return Err("partial JSON update (binlog_row_value_options=PARTIAL_JSON) is not supported: turn it off".into())
        }
    };
    if value == Value::NULL {
        return Ok(Json::Null);
    }
    match (col.kind, value) {
        (Kind::Int, Value::Int(i)) if col.fixup == Fixup::SignExtend24 && i >= 1 << 23 => {
            Ok(Json::from(i - (1 << 24)))
        }
        (Kind::Year, Value::Bytes(b)) => {
            let y: u32 = std::str::from_utf8(&b)
                .ok()
                .and_then(|s| s.parse().ok())
                .ok_or("bad YEAR")?;
            // The binlog stores YEAR as years since 1900, with 0 meaning 0000.
            Ok(Json::from(if y == 1900 { 0 } else { y }))
        }
        (Kind::Text, Value::Bytes(b)) => decode_text(b, col.charset).map(Json::String),
        (Kind::Bytes, Value::Bytes(mut b)) => {
            if let Fixup::PadTo(n) = col.fixup {
                if b.len() < n {
                    b.resize(n, 0);
                }
            }
            shared_value(Kind::Bytes, col.fsp, Value::Bytes(b))
        }
        (Kind::Timestamp, Value::Bytes(b)) => timestamp_from_text(b, col.fsp),
        (Kind::Timestamp, Value::Int(secs)) => {
            if secs == 0 {
                return Ok(Json::Null);
            }
            Ok(Json::String(format!("{}Z", utc_datetime(secs))))
        }
        (Kind::Enum, Value::Int(i)) => enum_label(col, i),
        (Kind::Set, Value::Bytes(b)) => Ok(set_labels(col, &b)),
        // MariaDB stores JSON as LONGTEXT; a JSON column arriving as text stays text.
        (Kind::Json, Value::Bytes(b)) => decode_text(b, col.charset).map(Json::String),
        (kind, v) => shared_value(kind, col.fsp, v),
    }
}

/// A TIMESTAMP logged as `secs[.micros]` since the epoch, in UTC (NULL for the zero one).
fn timestamp_from_text(b: Vec<u8>, fsp: u8) -> Result<Json, String> {
    let text = String::from_utf8(b).map_err(|e| e.to_string())?;
    let (secs, micros) = match text.split_once('.') {
        Some((s, f)) => (
            s.parse::<i64>().map_err(|e| e.to_string())?,
            f.parse::<u32>().map_err(|e| e.to_string())?,
        ),
        None => (text.parse::<i64>().map_err(|e| e.to_string())?, 0),
    };
    if secs == 0 && micros == 0 {
        return Ok(Json::Null);
    }
    Ok(Json::String(format!(
        "{}{}Z",
        utc_datetime(secs),
        fraction(micros, fsp)
    )))
}

/// The label of an ENUM value by its 1-based index (0: the empty string).
fn enum_label(col: &ColumnSchema, i: i64) -> Result<Json, String> {
    if i == 0 {
        // MySQL's "invalid value" index stores the empty string.
        return Ok(Json::String(String::new()));
    }
    col.labels
        .get(i as usize - 1)
        .map(|l| Json::String(l.clone()))
        .ok_or_else(|| format!("ENUM index {i} out of {} labels", col.labels.len()))
}

/// The labels of a SET value's bits (little-endian, at most 64), as an array.
fn set_labels(col: &ColumnSchema, b: &[u8]) -> Json {
    let mut bits: u64 = 0;
    for (i, byte) in b.iter().enumerate().take(8) {
        bits |= (*byte as u64) << (8 * i);
    }
    let labels = col
        .labels
        .iter()
        .enumerate()
        .filter(|(i, _)| bits & (1u64 << i) != 0)
        .map(|(_, l)| Json::String(l.clone()))
        .collect();
    Json::Array(labels)
}

/// The JSON of the value shapes a binlog row and a binary-protocol result share
/// (integers, floats, DECIMAL text, bytes, BIT, DATE, DATETIME, TIMESTAMP read in UTC,
/// TIME): one place, so a snapshot row and a streamed row of the same value are equal.
pub(crate) fn shared_value(kind: Kind, fsp: u8, value: Value) -> Result<Json, String> {
    match (kind, value) {
        (Kind::Int | Kind::Year, Value::Int(i)) => Ok(Json::from(i)),
        (Kind::Int | Kind::Year, Value::UInt(u)) => Ok(Json::from(u)),
        (Kind::Float, Value::Float(f)) => single_precision(f),
        (Kind::Float | Kind::Double, Value::Double(d)) => number_from_f64(d),
        (Kind::Decimal, Value::Bytes(b)) => Ok(Json::String(
            String::from_utf8(b).map_err(|e| e.to_string())?,
        )),
        (Kind::Bytes, Value::Bytes(b)) => Ok(Json::String(
            base64::engine::general_purpose::STANDARD.encode(b),
        )),
        (Kind::Vector, Value::Bytes(b)) => vector(&b),
        (Kind::Bit, Value::Bytes(b)) => {
            if b.len() > 8 {
                return Err(format!("BIT value of {} bytes", b.len()));
            }
            Ok(Json::from(
                b.iter().fold(0u64, |acc, byte| (acc << 8) | *byte as u64),
            ))
        }
        (Kind::Date, Value::Date(y, m, d, ..)) => {
            if y == 0 && m == 0 && d == 0 {
                Ok(Json::Null)
            } else {
                Ok(Json::String(format!("{y:04}-{m:02}-{d:02}")))
            }
        }
        (Kind::DateTime | Kind::Timestamp, Value::Date(y, mo, d, h, mi, s, us)) => {
            if y == 0 && mo == 0 && d == 0 {
                return Ok(Json::Null);
            }
            let zone = if kind == Kind::Timestamp { "Z" } else { "" };
            Ok(Json::String(format!(
                "{y:04}-{mo:02}-{d:02}T{h:02}:{mi:02}:{s:02}{}{zone}",
                fraction(us, fsp)
            )))
        }
        (Kind::Time, Value::Time(neg, days, h, m, s, us)) => {
            let hours = days as u64 * 24 + h as u64;
            let sign = if neg { "-" } else { "" };
            Ok(Json::String(format!(
                "{sign}{hours:02}:{m:02}:{s:02}{}",
                fraction(us, fsp)
            )))
        }
        (kind, v) => Err(format!("unexpected value {v:?} for a {kind:?} column")),
    }
}

/// A VECTOR's floats (4 bytes each, little-endian) as an array of numbers, each as a
/// FLOAT's.
fn vector(bytes: &[u8]) -> Result<Json, String> {
    if bytes.len() % 4 != 0 {
        return Err(format!("VECTOR value of {} bytes", bytes.len()));
    }
    bytes
        .chunks_exact(4)
        .map(|c| single_precision(f32::from_le_bytes([c[0], c[1], c[2], c[3]])))
        .collect::<Result<Vec<_>, _>>()
        .map(Json::Array)
}

/// A single-precision float as the number it prints as, widened: FLOAT 1.1 is 1.1, not
/// 1.100000023841858.
fn single_precision(f: f32) -> Result<Json, String> {
    let shortest: f64 = f.to_string().parse().map_err(|_| format!("float {f}"))?;
    number_from_f64(shortest)
}

fn number_from_f64(f: f64) -> Result<Json, String> {
    Number::from_f64(f)
        .map(Json::Number)
        .ok_or_else(|| format!("non-finite number {f}"))
}

/// `.ffffff` cut to the column's precision; nothing for precision 0. Written straight
/// into the value's text (it is in every DATETIME(n) of every row).
pub(crate) fn fraction(micros: u32, fsp: u8) -> Fraction {
    Fraction { micros, fsp }
}

pub(crate) struct Fraction {
    micros: u32,
    fsp: u8,
}

impl std::fmt::Display for Fraction {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let digits = self.fsp.min(6) as u32;
        if digits == 0 {
            return Ok(());
        }
        let cut = self.micros / 10u32.pow(6 - digits);
        write!(f, ".{cut:0width$}", width = digits as usize)
    }
}

/// Decodes text in the column's character set. utf8/utf8mb4/ascii are UTF-8 on the wire;
/// latin1 maps byte for byte (MySQL's latin1 is cp1252; the 0x80-0x9F range differs).
fn decode_text(bytes: Vec<u8>, charset: u16) -> Result<String, String> {
    const LATIN1: [u16; 6] = [5, 8, 15, 31, 47, 48];
    if LATIN1.contains(&charset) {
        return Ok(bytes.into_iter().map(char::from).collect());
    }
    String::from_utf8(bytes)
        .map_err(|e| format!("text is not valid UTF-8 (charset id {charset}): {e}"))
}

/// `YYYY-MM-DDTHH:MM:SS` in UTC for seconds since the Unix epoch.
pub fn utc_datetime(secs: i64) -> String {
    let days = secs.div_euclid(86_400);
    let rem = secs.rem_euclid(86_400);
    let (y, m, d) = civil_from_days(days);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

/// Proleptic Gregorian date of a day count since 1970-01-01 (Howard Hinnant's algorithm).
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (if m <= 2 { y + 1 } else { y }, m, d)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn utc_dates() {
        assert_eq!(utc_datetime(0), "1970-01-01T00:00:00");
        assert_eq!(utc_datetime(951_782_400), "2000-02-29T00:00:00");
        assert_eq!(utc_datetime(2_147_483_647), "2038-01-19T03:14:07");
        assert_eq!(utc_datetime(1_700_000_000), "2023-11-14T22:13:20");
    }

    #[test]
    fn fractions_follow_column_precision() {
        assert_eq!(fraction(123_456, 0).to_string(), "");
        assert_eq!(fraction(123_456, 3).to_string(), ".123");
        assert_eq!(fraction(5, 6).to_string(), ".000005");
        assert_eq!(fraction(5, 2).to_string(), ".00");
        assert_eq!(fraction(999_999, 1).to_string(), ".9");
    }

    #[test]
    fn latin1_and_utf8_text() {
        assert_eq!(
            decode_text(vec![0x63, 0x61, 0x66, 0xe9], 8).unwrap(),
            "café"
        );
        assert_eq!(
            decode_text("café 🚀".as_bytes().to_vec(), 45).unwrap(),
            "café 🚀"
        );
        assert!(decode_text(vec![0xff, 0xfe], 45).is_err());
    }

    /// `(id INT PRIMARY KEY, body VARCHAR(40))`, as its TABLE_MAP would describe it.
    fn notes() -> TableSchema {
        let column = |name: &str, kind, key| ColumnSchema {
            name: name.into(),
            key,
            ..col(kind, 0, &[])
        };
        TableSchema {
            db: "d".into(),
            table: "notes".into(),
            columns: vec![
                column("id", Kind::Int, true),
                column("body", Kind::Text, false),
            ],
            infos: Arc::new([]),
            key_columns: vec![0],
            wire: vec![
                Wire {
                    ty: ColumnType::MYSQL_TYPE_LONG,
                    meta: Box::new([]),
                    unsigned: false,
                },
                Wire {
                    ty: ColumnType::MYSQL_TYPE_VARCHAR,
                    meta: Box::new([40, 0]),
                    unsigned: false,
                },
            ],
        }
    }

    #[test]
    fn row_images_decode_in_sequence_and_a_short_or_partial_one_is_an_error() {
        let schema = notes();
        let all = bitvec::bitvec![u8, bitvec::order::Lsb0; 1, 1];
        // Two images: (7, "hé") and (8, NULL), each a NULL bitmap and its values.
        let mut bytes = vec![0b00, 7, 0, 0, 0, 3, b'h', 0xc3, 0xa9];
        bytes.extend([0b10, 8, 0, 0, 0]);
        let mut data = &bytes[..];
        let first = schema.decode_image(&all, false, &mut data).unwrap();
        assert_eq!(first, vec![Json::from(7), Json::from("hé")]);
        assert_eq!(
            schema.key_of(&first),
            serde_json::json!({"id": 7}).as_object().unwrap().clone()
        );
        let second = schema.decode_image(&all, false, &mut data).unwrap();
        assert_eq!(second, vec![Json::from(8), Json::Null]);
        assert!(data.is_empty(), "each image is consumed exactly");

        let mut short = &bytes[..7];
        let err = schema.decode_image(&all, false, &mut short).unwrap_err();
        assert!(err.contains("body"), "{err}");

        let key_only = bitvec::bitvec![u8, bitvec::order::Lsb0; 1, 0];
        let mut data = &[0u8, 7, 0, 0, 0][..];
        let err = schema
            .decode_image(&key_only, false, &mut data)
            .unwrap_err();
        assert!(err.contains("binlog_row_image must be FULL"), "{err}");
    }

    fn col(kind: Kind, fsp: u8, labels: &[&str]) -> ColumnSchema {
        ColumnSchema {
            name: "c".into(),
            kind,
            charset: 45,
            fsp,
            labels: labels.iter().map(|s| s.to_string()).collect(),
            key: false,
            fixup: Fixup::None,
        }
    }

    #[test]
    fn values_take_their_documented_json_form() {
        let v = |c: &ColumnSchema, x: Value| value_to_json(c, BinlogValue::Value(x)).unwrap();
        assert_eq!(
            v(&col(Kind::Int, 0, &[]), Value::UInt(u64::MAX)),
            Json::from(u64::MAX)
        );
        assert_eq!(
            v(&col(Kind::Float, 0, &[]), Value::Float(1.1)),
            serde_json::json!(1.1)
        );
        let floats: Vec<u8> = [1.1f32, -2.0, 1e-7]
            .iter()
            .flat_map(|f| f.to_le_bytes())
            .collect();
        assert_eq!(
            v(&col(Kind::Vector, 0, &[]), Value::Bytes(floats)),
            serde_json::json!([1.1, -2.0, 1e-7]),
            "each of a VECTOR's floats as a FLOAT's"
        );
        assert!(shared_value(Kind::Vector, 0, Value::Bytes(vec![0; 5])).is_err());
        assert_eq!(
            v(&col(Kind::Decimal, 0, &[]), Value::Bytes(b"-0.50".to_vec())),
            "-0.50"
        );
        assert_eq!(
            v(&col(Kind::Year, 0, &[]), Value::Bytes(b"1900".to_vec())),
            0
        );
        assert_eq!(
            v(
                &col(Kind::DateTime, 3, &[]),
                Value::Date(2024, 2, 29, 13, 4, 5, 123_000)
            ),
            "2024-02-29T13:04:05.123"
        );
        assert_eq!(
            v(&col(Kind::Date, 0, &[]), Value::Date(0, 0, 0, 0, 0, 0, 0)),
            Json::Null
        );
        assert_eq!(
            v(
                &col(Kind::Timestamp, 6, &[]),
                Value::Bytes(b"1700000000.000042".to_vec())
            ),
            "2023-11-14T22:13:20.000042Z"
        );
        assert_eq!(
            v(
                &col(Kind::Time, 2, &[]),
                Value::Time(true, 34, 22, 59, 59, 990_000)
            ),
            "-838:59:59.99"
        );
        assert_eq!(v(&col(Kind::Enum, 0, &["a", "b"]), Value::Int(2)), "b");
        assert_eq!(
            v(
                &col(Kind::Set, 0, &["x", "y", "z"]),
                Value::Bytes(vec![0b101])
            ),
            serde_json::json!(["x", "z"])
        );
        assert_eq!(
            v(&col(Kind::Bit, 0, &[]), Value::Bytes(vec![0x01, 0x02])),
            258
        );
        assert_eq!(
            v(&col(Kind::Bytes, 0, &[]), Value::Bytes(vec![0, 255])),
            "AP8="
        );
        assert_eq!(v(&col(Kind::Text, 0, &[]), Value::NULL), Json::Null);
        let medium = ColumnSchema {
            fixup: Fixup::SignExtend24,
            ..col(Kind::Int, 0, &[])
        };
        assert_eq!(v(&medium, Value::Int(8_388_608)), -8_388_608);
        assert_eq!(v(&medium, Value::Int(8_388_607)), 8_388_607);
        let binary4 = ColumnSchema {
            fixup: Fixup::PadTo(4),
            ..col(Kind::Bytes, 0, &[])
        };
        assert_eq!(v(&binary4, Value::Bytes(vec![0xff])), "/wAAAA==");
    }
}
