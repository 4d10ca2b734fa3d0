//! A pipeline: which documents an index holds and how each is made from MySQL rows. The
//! one definition of a pipeline, shared by the center (stored in the meta database,
//! published in ZooKeeper), the etl (its file, and what it follows), the worker (what to
//! capture, what to build) and `sluicectl` (`pipelines put NAME --spec FILE`).
//!
//! A document is a tree: the **root** table (one row → one document, `_id` from its
//! primary key or the `id` columns) and **relations** below it, to any depth —
//! `one_to_one` (an object, or `null`), `one_to_many` (an array of objects, mapped
//! `nested` unless `nested = false`) — or, directly under the root, `child` relations:
//! parent-child mode, where each child row is a document of its own in the same index,
//! joined to its parent by a `join` field and routed to its parent's shard.
//!
//! ```toml
//! name = "products"
//! source = "shop"
//! database = "shop"
//! table = "products"
//! filter = "deleted = 0"
//!
//! [[relations]]
//! name = "brand"
//! kind = "one_to_one"
//! table = "brands"
//! on = { brand_id = "id" }          # the parent's column = this table's column
//!
//! [[relations]]
//! name = "tags"
//! kind = "one_to_many"
//! table = "product_tags"
//! on = { id = "product_id" }
//! nested = false
//! order_by = ["created_at desc"]
//! limit = 5
//! ```

pub mod filter;
mod problems;
pub mod shard;

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::mapping::FieldOverride;

pub use shard::{TableMatcher, TablePattern, SHARD_COLUMN};

/// How deep relations may nest (root = 0).
pub const MAX_DEPTH: usize = 8;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PipelineSpec {
    /// Unique among the pipelines; `[A-Za-z0-9._-]`.
    #[serde(default)]
    pub name: String,
    /// The source (MySQL instance) every table of the pipeline comes from.
    pub source: String,
    pub database: String,
    /// The root table: one row, one document.
    pub table: String,
    /// `database` and `table` are regular expressions naming a table's shards (see
    /// [`shard`]).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub sharded: bool,
    /// The alias searches use; the physical index is `<alias>_v<N>`. Default: the name,
    /// lowercased.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub alias: String,
    /// The columns whose values make a document's `_id` (unique, never NULL). Default:
    /// the primary key.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub id: Vec<String>,
    /// Only rows matching this SQL condition are documents (see [`filter`]); a row that
    /// stops matching is deleted from the index.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub filter: String,
    /// The root's columns in the document; empty: every column.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub columns: Vec<String>,
    /// Mapping overrides of the root's columns.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub fields: BTreeMap<String, FieldOverride>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub relations: Vec<Relation>,
    /// Parent-child mode's `join` field (defaults apply when `child` relations exist).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub join: Option<JoinField>,
    #[serde(default = "default_shards")]
    pub shards: u32,
    #[serde(default = "default_replicas")]
    pub replicas: u32,
    /// How long Elasticsearch remembers a deleted document's version
    /// (`index.gc_deletes`): keep it above the longest replay you may do.
    #[serde(default = "default_tombstones")]
    pub tombstone_retention: String,
    /// The index's `refresh_interval` (`1s`, `30s`, `-1` for off); empty: the server's.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub refresh_interval: String,
    /// Start a build by itself when DDL changed rows of its tables without row events
    /// (otherwise the pipeline is only marked as needing one).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub auto_rebuild: bool,
    /// A change inside one relation under the root patches that part of each document
    /// alone, re-reading only it, instead of the whole document (see
    /// [`PipelineSpec::area_updates`]). `None`: the default.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub area_updates: Option<bool>,
    /// How many earlier versions a build keeps, written with live changes like the live
    /// one, so the alias can move back to them (`pipelines rollback`); older ones are
    /// deleted. Each costs the etl one more write per change.
    #[serde(default = "default_keep_history")]
    pub keep_history: u32,
    /// The consistency check's settings (`pipelines check`): its daily schedule, and the
    /// root's change-time column that `--since` selects by.
    #[serde(default, skip_serializing_if = "CheckSpec::is_empty")]
    pub check: CheckSpec,
    /// When the changes of `delayed` relations are applied (`sluicectl delayed`).
    #[serde(default, skip_serializing_if = "DelayedSpec::is_empty")]
    pub delayed: DelayedSpec,
    /// Where its changes come from: Sluice's workers, or Debezium's topics.
    #[serde(default, skip_serializing_if = "InputSpec::is_sluice")]
    pub input: InputSpec,
}

/// Where a pipeline's changes come from: Sluice's own workers (the default), or the
/// topics Debezium's MySQL connector writes (`<topic_prefix>.<database>.<table>`), read
/// in its JSON envelope with or without schemas.
///
/// ```toml
/// [input]
/// format = "debezium"
/// topic_prefix = "dbserver1"      # the connector's `topic.prefix`
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct InputSpec {
    #[serde(default)]
    pub format: InputFormat,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub topic_prefix: String,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum InputFormat {
    #[default]
    Sluice,
    Debezium,
}

impl InputSpec {
    pub fn is_sluice(&self) -> bool {
        self.format == InputFormat::Sluice
    }

    /// The topic of `database`.`table`'s changes when they come from Debezium.
    pub fn debezium_topic(&self, database: &str, table: &str) -> Option<String> {
        (self.format == InputFormat::Debezium)
            .then(|| format!("{}.{database}.{table}", self.topic_prefix))
    }
}

/// When a pipeline's delayed changes are applied: the changes of relations marked
/// `delayed` rebuild no document when they stream in; they are recorded, deduplicated,
/// and a job applies them every day at this time (or when `sluicectl delayed apply` asks).
///
/// ```toml
/// [delayed]
/// daily_at = "02:30"              # UTC; default 03:00
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DelayedSpec {
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub daily_at: String,
}

/// When delayed changes are applied if a pipeline does not say.
pub const DEFAULT_DELAYED_AT: &str = "03:00";

impl DelayedSpec {
    pub fn is_empty(&self) -> bool {
        *self == DelayedSpec::default()
    }

    /// The time of day the job runs, as minutes after midnight UTC.
    pub fn daily_minute(&self) -> u32 {
        let at = if self.daily_at.is_empty() {
            DEFAULT_DELAYED_AT
        } else {
            &self.daily_at
        };
        parse_time_of_day(at).unwrap_or(3 * 60)
    }
}

/// How a pipeline's documents are checked against MySQL (`pipelines check`).
///
/// ```toml
/// [check]
/// updated_column = "updated_at"   # the root's last-change time: what `--since` selects by
/// daily_at = "03:00"              # UTC; empty: no schedule
/// since = "24h"                   # a scheduled check looks this far back; empty: every row
/// repair = true                   # a scheduled check repairs what it finds
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CheckSpec {
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub updated_column: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub daily_at: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub since: String,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub repair: bool,
}

impl CheckSpec {
    pub fn is_empty(&self) -> bool {
        *self == CheckSpec::default()
    }

    /// The scheduled time of day as minutes after midnight UTC; `None` without a schedule.
    pub fn daily_minute(&self) -> Option<u32> {
        parse_time_of_day(&self.daily_at).ok()
    }

    /// What is wrong with the settings, each naming its key.
    fn problems(&self, p: &mut Vec<String>) {
        if !self.daily_at.is_empty() {
            if let Err(why) = parse_time_of_day(&self.daily_at) {
                p.push(format!("check.daily_at: {why}"));
            }
        }
        if !self.since.is_empty() {
            if humantime::parse_duration(&self.since).is_err() {
                p.push(format!(
                    "check.since: `{}` is not a duration like 24h or 7d",
                    self.since
                ));
            }
            if self.updated_column.is_empty() {
                p.push("check.since: needs check.updated_column (the root column holding a row's last change time)".into());
            }
        }
        if !self.updated_column.is_empty() && !is_column_name(&self.updated_column) {
            p.push(format!(
                "check.updated_column: `{}` is not a column name",
                self.updated_column
            ));
        }
    }
}

/// `HH:MM` (24-hour) as minutes after midnight.
fn parse_time_of_day(s: &str) -> Result<u32, String> {
    let bad = || format!("`{s}` is not a time of day like 03:00 (HH:MM, UTC)");
    let (h, m) = s.split_once(':').ok_or_else(bad)?;
    let (h, m): (u32, u32) = (h.parse().map_err(|_| bad())?, m.parse().map_err(|_| bad())?);
    if h > 23 || m > 59 || s.len() != 5 {
        return Err(bad());
    }
    Ok(h * 60 + m)
}

/// Rows of another table joined below a parent (the root or another relation).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Relation {
    /// The document field that holds the related rows (for `child`: the child documents'
    /// name in the join field).
    pub name: String,
    pub kind: RelationKind,
    pub table: String,
    /// `database` (or the pipeline's) and `table` are regular expressions naming a
    /// table's shards (see [`shard`]).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub sharded: bool,
    /// Default: the pipeline's database (another database of the same source may be
    /// named).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub database: String,
    /// Only to be explicit: it must be the pipeline's source (versions compare within one
    /// binlog only).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub source: String,
    /// Join columns: the parent's column → this table's column (composite keys: several
    /// entries). Either side may hold the key.
    pub on: BTreeMap<String, String>,
    /// Mapped as `nested` (default for `one_to_many`) or as a plain `object`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nested: Option<bool>,
    /// This table's columns in the document; empty: every column.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub columns: Vec<String>,
    /// Only rows matching this SQL condition are included.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub filter: String,
    /// Identical rows (over the selected columns) appear once.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub distinct: bool,
    /// `column [asc|desc]`, in order. Ties are broken by the primary key (by every
    /// selected column for `distinct`). For `one_to_one` it picks the row when several
    /// match; otherwise the first by primary key.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub order_by: Vec<String>,
    /// `one_to_many` only: keep the first N rows in `order_by` order.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit: Option<u32>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub fields: BTreeMap<String, FieldOverride>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub relations: Vec<Relation>,
    /// Its changes rebuild no document as they stream in: they are recorded,
    /// deduplicated, and applied later by a job (for tables whose one change reaches a
    /// great many documents, like a category's name). See [`DelayedSpec`].
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub delayed: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RelationKind {
    OneToOne,
    OneToMany,
    /// Parent-child mode: each row a document of its own (directly under the root only).
    Child,
}

impl RelationKind {
    pub fn as_str(self) -> &'static str {
        match self {
            RelationKind::OneToOne => "one_to_one",
            RelationKind::OneToMany => "one_to_many",
            RelationKind::Child => "child",
        }
    }
}

impl std::str::FromStr for RelationKind {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "one_to_one" => Ok(RelationKind::OneToOne),
            "one_to_many" => Ok(RelationKind::OneToMany),
            "child" => Ok(RelationKind::Child),
            other => Err(format!(
                "`{other}` is not a relation kind (one_to_one, one_to_many, child)"
            )),
        }
    }
}

/// The `join` field of parent-child mode.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JoinField {
    /// The field's name. Default `join_field`.
    #[serde(default = "default_join_field")]
    pub field: String,
    /// The root documents' name in it. Default: the root table's name.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub parent: String,
}

/// The join field's name when a pipeline does not give one.
pub const DEFAULT_JOIN_FIELD: &str = "join_field";

fn default_join_field() -> String {
    DEFAULT_JOIN_FIELD.into()
}

fn default_shards() -> u32 {
    1
}
fn default_replicas() -> u32 {
    1
}
/// Earlier versions kept current for rollback unless a pipeline says otherwise.
pub const DEFAULT_KEEP_HISTORY: u32 = 1;
fn default_keep_history() -> u32 {
    DEFAULT_KEEP_HISTORY
}
fn default_tombstones() -> String {
    "7d".into()
}

/// One `order_by` entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OrderKey {
    pub column: String,
    pub descending: bool,
}

impl OrderKey {
    pub fn parse(s: &str) -> Result<OrderKey, String> {
        let mut words = s.split_whitespace();
        let column = words.next().ok_or("is empty")?;
        let descending = match words.next().map(str::to_ascii_lowercase).as_deref() {
            None | Some("asc") => false,
            Some("desc") => true,
            Some(other) => return Err(format!("`{other}` is neither asc nor desc")),
        };
        if words.next().is_some() || !is_column_name(column) {
            return Err(format!("`{s}` is not `column [asc|desc]`"));
        }
        Ok(OrderKey {
            column: column.to_owned(),
            descending,
        })
    }
}

impl PipelineSpec {
    /// A single-table pipeline with the defaults.
    pub fn table(name: &str, source: &str, database: &str, table: &str) -> PipelineSpec {
        PipelineSpec {
            name: name.to_owned(),
            source: source.to_owned(),
            database: database.to_owned(),
            table: table.to_owned(),
            sharded: false,
            alias: String::new(),
            id: Vec::new(),
            filter: String::new(),
            columns: Vec::new(),
            fields: BTreeMap::new(),
            relations: Vec::new(),
            join: None,
            shards: default_shards(),
            replicas: default_replicas(),
            tombstone_retention: default_tombstones(),
            refresh_interval: String::new(),
            auto_rebuild: false,
            area_updates: None,
            keep_history: DEFAULT_KEEP_HISTORY,
            check: CheckSpec::default(),
            delayed: DelayedSpec::default(),
            input: InputSpec::default(),
        }
    }

    /// Whether its documents are written in parts (area updates): it has relations under
    /// its root, and `area_updates` is not set off. A sink that runs no Painless
    /// scripts (Elasticsearch without its `lang-painless` module) writes whole documents
    /// whatever this says.
    pub fn area_updates(&self) -> bool {
        // A child relation's documents have their own relations as parts.
        let parts = (self.relations.iter())
            .any(|r| r.kind != RelationKind::Child || !r.relations.is_empty());
        parts && self.area_updates.unwrap_or(true)
    }

    /// The alias: as given, or the name lowercased.
    pub fn alias(&self) -> String {
        if self.alias.is_empty() {
            self.name.to_ascii_lowercase()
        } else {
            self.alias.clone()
        }
    }

    /// Fills in what defaults to something else (the alias, at least one shard, the
    /// tombstone retention), so every holder stores and compares the same spec.
    pub fn normalized(mut self) -> PipelineSpec {
        self.alias = self.alias();
        self.shards = self.shards.max(1);
        if self.tombstone_retention.is_empty() {
            self.tombstone_retention = default_tombstones();
        }
        if self.has_children() {
            let join = self.join.get_or_insert_with(|| JoinField {
                field: default_join_field(),
                parent: String::new(),
            });
            if join.parent.is_empty() {
                join.parent = self.table.clone();
            }
        }
        self
    }

    /// One table, every document made from its change events alone: no relations, no
    /// filter. Such a pipeline needs no reads from MySQL.
    pub fn is_flat(&self) -> bool {
        self.relations.is_empty() && self.filter.is_empty() && !self.sharded
    }

    /// The sharded tables of the pipeline, root first, each once. A document of a
    /// sharded table is read back from MySQL by its id across every shard, so a row
    /// moved between shards is right whichever of its two changes comes last.
    pub fn patterns(&self) -> Vec<TablePattern> {
        let mut out = Vec::new();
        if self.sharded {
            out.push(TablePattern::new(&self.database, &self.table));
        }
        self.visit(&mut |_, r, _| {
            let t = TablePattern::new(self.database_of(r), &r.table);
            if r.sharded && !out.contains(&t) {
                out.push(t);
            }
        });
        out
    }

    /// Every table of the pipeline that is not sharded, as [`Self::tables`] lists them.
    pub fn plain_tables(&self) -> Vec<(String, String)> {
        let patterns = self.patterns();
        (self.tables().into_iter())
            .filter(|(db, table)| !patterns.contains(&TablePattern::new(db, table)))
            .collect()
    }

    /// Whether `db`.`table` is one of the pipeline's tables (or a shard of one).
    pub fn reads_table(&self, db: &str, table: &str) -> bool {
        let mut found = Self::names(&self.database, &self.table, self.sharded, db, table);
        self.visit(&mut |_, r, _| {
            found |= Self::names(self.database_of(r), &r.table, r.sharded, db, table);
        });
        found
    }

    /// Whether `db`.`table` is the table `(name_db, name_table)` names: the same names,
    /// or for a sharded one, one of its shards.
    fn names(name_db: &str, name_table: &str, sharded: bool, db: &str, table: &str) -> bool {
        if sharded {
            TablePattern::new(name_db, name_table)
                .matcher()
                .is_ok_and(|m| m.matches(db, table))
        } else {
            name_db == db && name_table == table
        }
    }

    /// Parent-child mode: some relations are documents of their own.
    pub fn has_children(&self) -> bool {
        self.relations.iter().any(|r| r.kind == RelationKind::Child)
    }

    /// The database of `r` (its own or the pipeline's).
    pub fn database_of<'a>(&'a self, r: &'a Relation) -> &'a str {
        if r.database.is_empty() {
            &self.database
        } else {
            &r.database
        }
    }

    /// Every table of the pipeline as `(database, table)`, root first, each once.
    pub fn tables(&self) -> Vec<(String, String)> {
        let mut out = vec![(self.database.clone(), self.table.clone())];
        self.visit(&mut |_, r, _| {
            let t = (self.database_of(r).to_owned(), r.table.clone());
            if !out.contains(&t) {
                out.push(t);
            }
        });
        out
    }

    /// Whether a document may hold or depend on `column` of `db`.`table`: the table is
    /// one of the pipeline's and the column is selected (every column is, without a
    /// list), makes the id, joins, orders or appears in a filter. Errs towards yes.
    pub fn uses_column(&self, db: &str, table: &str, column: &str) -> bool {
        let named = |list: &[String]| list.iter().any(|c| c.eq_ignore_ascii_case(column));
        let in_filter = |f: &str| {
            f.to_ascii_lowercase()
                .contains(&column.to_ascii_lowercase())
        };
        let ordered = |order: &[String]| {
            order.iter().any(|o| {
                o.split_whitespace()
                    .next()
                    .is_some_and(|c| c.eq_ignore_ascii_case(column))
            })
        };
        let joins_below = |children: &[Relation]| {
            children
                .iter()
                .any(|c| c.on.keys().any(|k| k.eq_ignore_ascii_case(column)))
        };
        let mut used = Self::names(&self.database, &self.table, self.sharded, db, table)
            && (self.columns.is_empty()
                || named(&self.columns)
                || named(&self.id)
                || in_filter(&self.filter)
                || joins_below(&self.relations));
        self.visit(&mut |_, r, _| {
            used |= Self::names(self.database_of(r), &r.table, r.sharded, db, table)
                && (r.columns.is_empty()
                    || named(&r.columns)
                    || r.on.values().any(|c| c.eq_ignore_ascii_case(column))
                    || in_filter(&r.filter)
                    || ordered(&r.order_by)
                    || joins_below(&r.relations));
        });
        used
    }

    /// Calls `f(path, relation, depth)` for every relation, parents before children;
    /// `path` is its key prefix (`relations.skus.relations.prices`), depth 1 under the root.
    pub fn visit<'a>(&'a self, f: &mut dyn FnMut(&str, &'a Relation, usize)) {
        fn walk<'a>(
            prefix: &str,
            relations: &'a [Relation],
            depth: usize,
            f: &mut dyn FnMut(&str, &'a Relation, usize),
        ) {
            for r in relations {
                let path = format!("{prefix}relations.{}", r.name);
                f(&path, r, depth);
                walk(&format!("{path}."), &r.relations, depth + 1, f);
            }
        }
        walk("", &self.relations, 1, f);
    }

    /// Whether a relation is `delayed` (its changes wait for the delayed job).
    pub fn has_delayed(&self) -> bool {
        let mut any = false;
        self.visit(&mut |_, r, _| any |= r.delayed);
        any
    }
}

impl Relation {
    /// Mapped as `nested`: `one_to_many` unless `nested = false`; `one_to_one` only when
    /// `nested = true`.
    pub fn is_nested(&self) -> bool {
        match self.kind {
            RelationKind::OneToMany => self.nested != Some(false),
            RelationKind::OneToOne => self.nested == Some(true),
            RelationKind::Child => false,
        }
    }

    /// `order_by`, parsed (entries that do not parse are left out: [`PipelineSpec::problems`]
    /// reports them).
    pub fn order_keys(&self) -> Vec<OrderKey> {
        self.order_by
            .iter()
            .filter_map(|o| OrderKey::parse(o).ok())
            .collect()
    }
}

/// `[A-Za-z0-9._-]`, 1..=max characters: names of pipelines and sources.
pub fn is_name(v: &str, max: usize) -> bool {
    !v.is_empty()
        && v.len() <= max
        && v.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'))
}

/// A valid Elasticsearch index (or alias) name.
pub fn is_index_name(v: &str) -> bool {
    !v.is_empty()
        && !v.starts_with(['_', '-', '+'])
        && !v
            .chars()
            .any(|c| c.is_ascii_uppercase() || r#" "*\<|,>/?#:"#.contains(c))
}

/// A MySQL column name as a pipeline may name it.
fn is_column_name(v: &str) -> bool {
    !v.is_empty() && v.len() <= 64 && !v.contains(['`', '.']) && !v.chars().any(char::is_whitespace)
}

/// A document field's name: no dots, not empty, not starting with `_`.
fn is_field_name(v: &str) -> bool {
    !v.is_empty() && !v.contains('.') && !v.starts_with('_')
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shop() -> PipelineSpec {
        let text = r#"
            name = "products"
            source = "shop"
            database = "shop"
            table = "products"
            filter = "deleted = 0"

            [[relations]]
            name = "brand"
            kind = "one_to_one"
            table = "brands"
            on = { brand_id = "id" }

            [[relations]]
            name = "skus"
            kind = "one_to_many"
            table = "skus"
            on = { id = "product_id" }

            [[relations.relations]]
            name = "prices"
            kind = "one_to_many"
            table = "sku_prices"
            on = { id = "sku_id" }

            [[relations]]
            name = "tags"
            kind = "one_to_many"
            table = "product_tags"
            on = { id = "product_id" }
            nested = false
            order_by = ["created_at desc"]
            limit = 5
        "#;
        let v: toml::Value = toml::from_str(text).unwrap();
        v.try_into().unwrap()
    }

    #[test]
    fn trees_are_written_in_parts_unless_set_off() {
        let mut spec = shop();
        assert!(spec.area_updates(), "on by default");
        spec.area_updates = Some(false);
        assert!(!spec.area_updates());
        let flat = PipelineSpec::table("p", "s", "d", "t");
        assert!(!flat.area_updates(), "a document of one table has no parts");
    }

    #[test]
    fn columns_a_pipeline_uses() {
        let mut spec = shop();
        // Every column of a table without a column list.
        assert!(spec.uses_column("shop", "products", "anything"));
        assert!(!spec.uses_column("shop", "orders", "id"));
        assert!(!spec.uses_column("other", "products", "id"));
        spec.columns = vec!["title".into()];
        spec.relations[1].columns = vec!["sku".into()];
        assert!(spec.uses_column("shop", "products", "TITLE"));
        assert!(!spec.uses_column("shop", "products", "notes"));
        // A filter, a join and an order name columns too.
        assert!(spec.uses_column("shop", "products", "deleted"));
        assert!(spec.uses_column("shop", "products", "brand_id"));
        assert!(spec.uses_column("shop", "skus", "product_id"));
        assert!(spec.uses_column("shop", "skus", "id"), "joins its children");
        assert!(!spec.uses_column("shop", "skus", "weight"));
        assert!(spec.uses_column("shop", "product_tags", "created_at"));
    }

    #[test]
    fn the_shop_tree_is_valid_and_lists_its_tables() {
        let s = shop().normalized();
        assert_eq!(s.problems(), Vec::<String>::new());
        assert_eq!(s.alias, "products");
        assert!(!s.is_flat());
        let tables: Vec<String> = s.tables().into_iter().map(|(_, t)| t).collect();
        assert_eq!(
            tables,
            ["products", "brands", "skus", "sku_prices", "product_tags"]
        );
        let skus = &s.relations[1];
        assert!(skus.is_nested());
        assert!(!s.relations[2].is_nested());
        assert!(!s.relations[0].is_nested());
        assert_eq!(
            s.relations[2].order_keys(),
            [OrderKey {
                column: "created_at".into(),
                descending: true
            }]
        );
        let mut paths = Vec::new();
        s.visit(&mut |path, _, depth| paths.push(format!("{path}@{depth}")));
        assert_eq!(
            paths,
            [
                "relations.brand@1",
                "relations.skus@1",
                "relations.skus.relations.prices@2",
                "relations.tags@1"
            ]
        );
    }

    #[test]
    fn a_json_spec_reads_like_the_toml_one_and_round_trips() {
        let s = shop();
        let json = serde_json::to_string(&s).unwrap();
        let back: PipelineSpec = serde_json::from_str(&json).unwrap();
        assert_eq!(back, s);
        // Defaults stay out of the JSON.
        assert!(!json.contains("distinct"), "{json}");
    }

    #[test]
    fn check_settings_are_checked_by_key() {
        let mut s = shop();
        s.check = CheckSpec {
            updated_column: String::new(),
            daily_at: "3:00".into(),
            since: "a day".into(),
            repair: true,
        };
        let p = s.problems();
        for (prefix, word) in [
            ("check.daily_at:", "HH:MM"),
            ("check.since:", "duration"),
            ("check.since:", "check.updated_column"),
        ] {
            assert!(
                p.iter().any(|x| x.starts_with(prefix) && x.contains(word)),
                "no `{prefix}…{word}` in {p:#?}"
            );
        }
        s.check.daily_at = "23:59".into();
        s.check.since = "24h".into();
        s.check.updated_column = "updated_at".into();
        assert!(s.problems().is_empty(), "{:?}", s.problems());
        assert_eq!(s.check.daily_minute(), Some(23 * 60 + 59));
        let text = serde_json::to_string(&PipelineSpec::table("p", "s", "d", "t")).unwrap();
        assert!(
            !text.contains("check"),
            "no check settings, none written: {text}"
        );
    }

    #[test]
    fn delayed_settings_are_checked_by_key() {
        let mut s = shop();
        assert!(!s.has_delayed());
        assert_eq!(s.delayed.daily_minute(), 3 * 60, "03:00 unless set");
        s.relations[0].delayed = true;
        assert!(s.has_delayed());
        s.delayed.daily_at = "25:00".into();
        s.relations.push(Relation {
            name: "kids".into(),
            kind: RelationKind::Child,
            delayed: true,
            ..s.relations[2].clone()
        });
        let p = s.problems();
        for (prefix, word) in [
            ("delayed.daily_at:", "HH:MM"),
            ("relations.kids.delayed:", "documents of their own"),
        ] {
            assert!(
                p.iter().any(|x| x.starts_with(prefix) && x.contains(word)),
                "no `{prefix}…{word}` in {p:#?}"
            );
        }
        s.relations.pop();
        s.delayed.daily_at = "01:30".into();
        assert!(s.problems().is_empty(), "{:?}", s.problems());
        assert_eq!(s.delayed.daily_minute(), 90);
        let text = serde_json::to_string(&s).unwrap();
        let back: PipelineSpec = serde_json::from_str(&text).unwrap();
        assert_eq!(back, s);
    }

    #[test]
    fn problems_name_the_offending_key() {
        let mut s = shop();
        s.relations[1].relations[0].filter = "price > (SELECT 1)".into();
        s.relations[1].relations[0].source = "other".into();
        s.relations[2].order_by = vec!["created_at sideways".into()];
        s.relations[0].limit = Some(3);
        s.relations[0].on.clear();
        s.relations.push(Relation {
            name: "again".into(),
            kind: RelationKind::OneToMany,
            table: "products".into(),
            ..s.relations[1].clone()
        });
        let kids = Relation {
            name: "kids".into(),
            kind: RelationKind::Child,
            ..s.relations[1].relations[0].clone()
        };
        s.relations[1].relations.push(kids);
        let p = s.problems();
        let has = |prefix: &str, word: &str| {
            assert!(
                p.iter().any(|x| x.starts_with(prefix) && x.contains(word)),
                "no `{prefix}…{word}` in {p:#?}"
            )
        };
        has("relations.skus.relations.prices.filter:", "subqueries");
        has("relations.skus.relations.prices.source:", "one source");
        has("relations.tags.order_by[0]:", "sideways");
        has("relations.brand.limit:", "one_to_many");
        has("relations.brand.on:", "required");
        has("relations.again.table:", "cycle");
        has(
            "relations.skus.relations.kids.kind:",
            "directly under the root",
        );
    }

    #[test]
    fn a_sharded_root_names_its_id_and_patterns_that_compile() {
        let mut s = PipelineSpec::table("orders", "src", r"db_\d+", r"orders_\d+");
        s.sharded = true;
        assert!(
            !s.is_flat(),
            "a sharded root is read back, so moves between shards are right"
        );
        let p = s.problems();
        assert!(
            p.iter()
                .any(|p| p.starts_with("id: required for a sharded root")),
            "{p:?}"
        );
        s.id = vec!["order_no".into()];
        assert_eq!(s.problems(), Vec::<String>::new());
        assert_eq!(
            s.patterns(),
            vec![TablePattern::new(r"db_\d+", r"orders_\d+")]
        );
        assert!(s.uses_column("db_1", "orders_07", "order_no"));
        assert!(!s.uses_column("db_1", "orders_archive", "order_no"));
        let mut brands = s.clone();
        brands.relations = serde_json::from_value(serde_json::json!([
            {"name": "brand", "kind": "one_to_one", "table": "brands", "on": {"brand_id": "id"}}
        ]))
        .unwrap();
        let p = brands.problems();
        assert!(
            p.iter()
                .any(|p| p.starts_with("relations.brand.database: required under a sharded root")),
            "{p:?}"
        );
        brands.relations[0].database = "shop".into();
        assert_eq!(brands.problems(), Vec::<String>::new());
        s.table = "orders_(".into();
        let p = s.problems();
        assert!(
            p.iter()
                .any(|p| p.starts_with("table: `orders_(` is not a regular expression")),
            "{p:?}"
        );
        s.table = r"orders_\d+".into();
        s.input.format = InputFormat::Debezium;
        s.input.topic_prefix = "dbz".into();
        assert!(s.problems().iter().any(|p| p.starts_with("sharded:")));
    }

    #[test]
    fn child_relations_make_parent_child_mode() {
        let mut s = PipelineSpec::table("qa", "src", "db", "questions");
        s.relations.push(Relation {
            name: "answer".into(),
            kind: RelationKind::Child,
            table: "answers".into(),
            sharded: false,
            database: String::new(),
            source: String::new(),
            on: BTreeMap::from([("id".into(), "question_id".into())]),
            nested: None,
            columns: Vec::new(),
            filter: String::new(),
            distinct: false,
            order_by: Vec::new(),
            limit: Some(2),
            fields: BTreeMap::new(),
            relations: Vec::new(),
            delayed: false,
        });
        let s = s.normalized();
        assert_eq!(
            s.join,
            Some(JoinField {
                field: "join_field".into(),
                parent: "questions".into()
            })
        );
        assert_eq!(
            s.problems(),
            ["relations.answer.limit: a child relation's rows are documents of their own; limit does not apply"]
        );
        let mut keyed = s.clone();
        keyed.id = vec!["code".into()];
        keyed.relations[0].limit = None;
        assert!(keyed.problems()[0].contains("the root's id columns"));
        let mut flat = PipelineSpec::table("t", "src", "db", "t");
        flat.join = Some(JoinField {
            field: "j".into(),
            parent: String::new(),
        });
        assert!(flat.problems()[0].starts_with("join:"));
    }
}
