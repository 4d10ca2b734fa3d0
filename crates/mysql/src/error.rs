use sluice_model::BinlogPosition;

/// Where in the binlog a failure happened.
#[derive(Debug, Clone, Default)]
pub struct At {
    pub position: Option<BinlogPosition>,
    pub table: Option<String>,
}

impl std::fmt::Display for At {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.position {
            Some(p) => write!(f, "at {p}")?,
            None => f.write_str("at start")?,
        }
        if let Some(t) = &self.table {
            write!(f, " in {t}")?;
        }
        Ok(())
    }
}

#[derive(Debug, thiserror::Error)]
pub enum MysqlError {
    #[error("cannot connect to source `{source_name}`: {error}")]
    Connect {
        source_name: String,
        #[source]
        error: mysql_async::Error,
    },
    #[error("query on source `{source_name}` failed ({what}): {error}")]
    Query {
        source_name: String,
        what: &'static str,
        #[source]
        error: mysql_async::Error,
    },
    #[error("binlog stream of `{source_name}` failed {at}: {error}")]
    Stream {
        source_name: String,
        at: Box<At>,
        #[source]
        error: mysql_async::Error,
    },
    #[error("cannot decode binlog event of `{source_name}` {at}: {detail}")]
    Decode {
        source_name: String,
        at: Box<At>,
        detail: String,
    },
    #[error("cannot read {table}.{column} of source `{source_name}`: {detail}")]
    Value {
        source_name: String,
        table: String,
        column: String,
        detail: String,
    },
    #[error("source `{source_name}`: {what}")]
    Wait { source_name: String, what: String },
    #[error("source `{source_name}` cannot be streamed:\n{}", problems.iter().map(|p| format!("  - {p}")).collect::<Vec<_>>().join("\n"))]
    Preflight {
        source_name: String,
        problems: Vec<String>,
    },
}

/// Server errors that say "not now" rather than "never": too many connections (1040),
/// shutting down (1053), a lock wait timed out (1205), a deadlock (1213), the query or
/// connection was killed (1317; MariaDB 1927), a table's definition changed under a
/// consistent snapshot (1412), a statement timed out (MySQL 3024; MariaDB 1969).
const TRANSIENT_SERVER_ERRORS: [u16; 9] = [1040, 1053, 1205, 1213, 1317, 1412, 1927, 1969, 3024];

impl MysqlError {
    /// Transient failures are retried with backoff; definite ones need an operator.
    pub fn is_transient(&self) -> bool {
        match self {
            MysqlError::Connect { .. } | MysqlError::Stream { .. } | MysqlError::Wait { .. } => {
                true
            }
            MysqlError::Query { error, .. } => match error {
                mysql_async::Error::Io(_) | mysql_async::Error::Driver(_) => true,
                mysql_async::Error::Server(e) => TRANSIENT_SERVER_ERRORS.contains(&e.code),
                _ => false,
            },
            MysqlError::Decode { .. } | MysqlError::Preflight { .. } | MysqlError::Value { .. } => {
                false
            }
        }
    }
}
