//! The tables a source captures, with their columns as `information_schema` describes
//! them: what an operator picks a pipeline's root and relations from.

use mysql_async::prelude::*;

use crate::error::MysqlError;
use crate::preflight::query_err;
use crate::source::SourceConfig;

/// One table and its columns, in their order.
#[derive(Debug, Clone, PartialEq)]
pub struct TableShape {
    pub db: String,
    pub table: String,
    pub columns: Vec<ColumnShape>,
    /// The server's estimate of its rows (`information_schema.TABLES.TABLE_ROWS`).
    pub rows_estimated: u64,
}

#[derive(Debug, Clone, PartialEq)]
pub struct ColumnShape {
    pub name: String,
    /// `COLUMN_TYPE`: `bigint unsigned`, `varchar(64)`, `enum('a','b')`, …
    pub column_type: String,
    /// Part of the primary key.
    pub key: bool,
    pub nullable: bool,
}

/// Schema, table, column, `COLUMN_TYPE`, `COLUMN_KEY`, `IS_NULLABLE`, `TABLE_ROWS`.
type ColumnRow = (String, String, String, String, String, String, Option<u64>);

/// Every base table of the source that its table patterns capture (with `all`, of its
/// server but the system schemas), with its columns, ordered by database and name.
pub async fn tables(cfg: &SourceConfig, all: bool) -> Result<Vec<TableShape>, MysqlError> {
    let mut conn = crate::preflight::connect(cfg).await?;
    let rows: Result<Vec<ColumnRow>, _> = conn
        .query(
            "SELECT c.TABLE_SCHEMA, c.TABLE_NAME, c.COLUMN_NAME, c.COLUMN_TYPE, c.COLUMN_KEY,
                    c.IS_NULLABLE, t.TABLE_ROWS
             FROM information_schema.COLUMNS c
             JOIN information_schema.TABLES t
               ON t.TABLE_SCHEMA = c.TABLE_SCHEMA AND t.TABLE_NAME = c.TABLE_NAME
             WHERE t.TABLE_TYPE = 'BASE TABLE'
               AND c.TABLE_SCHEMA NOT IN ('mysql', 'information_schema', 'performance_schema', 'sys')
             ORDER BY c.TABLE_SCHEMA, c.TABLE_NAME, c.ORDINAL_POSITION",
        )
        .await;
    let _ = conn.disconnect().await;
    let rows = rows.map_err(query_err(cfg, "list the tables and their columns"))?;
    let filter = cfg.filter();
    let mut out: Vec<TableShape> = Vec::new();
    for (db, table, name, column_type, key, nullable, estimated) in rows {
        if !all && !filter.includes(&db, &table) {
            continue;
        }
        let column = ColumnShape {
            name,
            column_type,
            key: key == "PRI",
            nullable: nullable == "YES",
        };
        match out.last_mut() {
            Some(t) if t.db == db && t.table == table => t.columns.push(column),
            _ => out.push(TableShape {
                db,
                table,
                columns: vec![column],
                rows_estimated: estimated.unwrap_or(0),
            }),
        }
    }
    Ok(out)
}
