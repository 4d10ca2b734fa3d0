//! Sharded tables: one logical table split into many (`orders_00` … `orders_63`, often
//! over several databases). A pipeline's root or relation marked `sharded` names its
//! database and its table by regular expressions, each matched against a whole name; every
//! table both match is a shard, now or when it is created later.
//!
//! ```toml
//! database = 'db_\d+'
//! table = 'orders_\d+'
//! sharded = true
//! id = ["order_no"]          # unique across every shard; or ["_shard", "id"]
//! ```
//!
//! Rows of different shards are documents of one index, so their ids must not collide:
//! a sharded root names its `id` columns, and either they are unique across the shards
//! (a global order number: a row moved from one shard to another stays one document) or
//! they include the virtual column `_shard` (`database.table` of the row's shard).

use regex::Regex;
use serde::{Deserialize, Serialize};

/// The virtual column of a sharded table that holds its row's shard, `database.table`.
pub const SHARD_COLUMN: &str = "_shard";

/// Tables named by a pattern of databases and one of tables (regular expressions, each
/// matched against a whole name).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct TablePattern {
    pub database: String,
    pub table: String,
}

impl TablePattern {
    pub fn new(database: &str, table: &str) -> TablePattern {
        TablePattern {
            database: database.to_owned(),
            table: table.to_owned(),
        }
    }

    /// The compiled patterns, or what is wrong with one (`database: …` or `table: …`).
    pub fn matcher(&self) -> Result<TableMatcher, String> {
        let compile = |key: &str, p: &str| {
            whole(p).map_err(|e| format!("{key}: `{p}` is not a regular expression: {e}"))
        };
        Ok(TableMatcher {
            database: compile("database", &self.database)?,
            table: compile("table", &self.table)?,
        })
    }
}

impl std::fmt::Display for TablePattern {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}.{}", self.database, self.table)
    }
}

/// A [`TablePattern`] compiled.
#[derive(Debug, Clone)]
pub struct TableMatcher {
    database: Regex,
    table: Regex,
}

impl TableMatcher {
    pub fn matches(&self, database: &str, table: &str) -> bool {
        self.database.is_match(database) && self.table.is_match(table)
    }

    pub fn matches_database(&self, database: &str) -> bool {
        self.database.is_match(database)
    }

    /// Whether a table known only in part matches: an unknown part (`None`) matches
    /// anything.
    pub fn matches_parts(&self, database: Option<&str>, table: Option<&str>) -> bool {
        database.is_none_or(|d| self.database.is_match(d))
            && table.is_none_or(|t| self.table.is_match(t))
    }
}

/// `pattern` matched against a whole name.
pub fn whole(pattern: &str) -> Result<Regex, regex::Error> {
    Regex::new(&format!("^(?:{pattern})$"))
}

/// A character a Kafka topic name keeps as it is (the others are written `_`). A shard
/// whose name has another is refused: its topic could not be told from its name.
pub fn topic_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-')
}

/// The value of [`SHARD_COLUMN`] in rows of `database`.`table`.
pub fn shard_name(database: &str, table: &str) -> String {
    format!("{database}.{table}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pattern_matches_whole_names_only() {
        let m = TablePattern::new(r"db_\d+", r"orders_\d+")
            .matcher()
            .unwrap();
        assert!(m.matches("db_0", "orders_07"));
        assert!(
            !m.matches("db_0", "orders_07_old"),
            "a prefix is not a match"
        );
        assert!(!m.matches("xdb_0", "orders_07"));
        assert!(!m.matches("db_0", "order_items_1"));
        assert!(m.matches_database("db_12") && !m.matches_database("db_"));
        let bad = TablePattern::new("db_(", "t").matcher().unwrap_err();
        assert!(
            bad.starts_with("database: `db_(` is not a regular expression"),
            "{bad}"
        );
        assert_eq!(shard_name("db_1", "orders_3"), "db_1.orders_3");
    }
}
