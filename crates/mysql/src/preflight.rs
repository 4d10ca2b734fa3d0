//! Checks that a source can be streamed before streaming it, and reports every problem at
//! once with the fix: a supported server, binlog on, ROW format, FULL row image, FULL row
//! metadata, GTIDs on MySQL, the privileges a replica needs, and — when resuming — that
//! the position is still on the server.

use std::collections::BTreeMap;

use mysql_async::prelude::*;
use mysql_async::Conn;
use sluice_model::position::MariaDbGtid;
use sluice_model::{BinlogPosition, Checkpoint, GtidSet};

use crate::error::MysqlError;
use crate::server::{Flavor, Server};
use crate::source::SourceConfig;

/// What the preflight learned about the server.
#[derive(Debug, Clone)]
pub struct ServerInfo {
    pub server: Server,
    pub server_id: u32,
    /// The server's current end of binlog.
    pub end: BinlogPosition,
    /// The server's GTID state at `end`, when GTIDs are in use.
    pub gtid: Option<GtidSet>,
}

pub async fn connect(cfg: &SourceConfig) -> Result<Conn, MysqlError> {
    cfg.connect_with(cfg.opts()).await
}

pub(crate) fn query_err<'a>(
    cfg: &'a SourceConfig,
    what: &'static str,
) -> impl FnOnce(mysql_async::Error) -> MysqlError + 'a {
    move |error| MysqlError::Query {
        source_name: cfg.name.clone(),
        what,
        error,
    }
}

/// Runs every check; `Err(Preflight)` lists all problems found.
pub async fn preflight(
    cfg: &SourceConfig,
    resume: Option<&Checkpoint>,
) -> Result<ServerInfo, MysqlError> {
    let mut conn = connect(cfg).await?;
    let server = server_of(&mut conn, cfg).await?;
    if let Some(why) = server.refusal() {
        return Err(MysqlError::Preflight {
            source_name: cfg.name.clone(),
            problems: vec![why],
        });
    }
    let mut problems = Vec::new();

    let vars = Variables::read(&mut conn, cfg).await?;
    check_binlog_settings(&vars, &server, &mut problems);
    check_gtid_settings(&vars, &server, &mut problems);
    check_json_logging(&vars, &mut problems);
    let server_id = check_server_id(&vars, cfg, &mut problems);

    let monitors = check_privileges(&mut conn, cfg, &server, &mut problems).await?;
    if !monitors {
        // The binlog's positions are not readable without it: say what is known.
        let _ = conn.disconnect().await;
        return Err(MysqlError::Preflight {
            source_name: cfg.name.clone(),
            problems,
        });
    }
    let (end, gtid) = current_end(&mut conn, cfg, &server).await?;

    if let Some(cp) = resume {
        check_resume(&mut conn, cfg, &server, cp, &mut problems).await?;
    }
    let _ = conn.disconnect().await;
    if !problems.is_empty() {
        return Err(MysqlError::Preflight {
            source_name: cfg.name.clone(),
            problems,
        });
    }
    Ok(ServerInfo {
        server,
        server_id,
        end,
        gtid,
    })
}

/// The server's global variables the checks read, as `(name, value)` pairs.
struct Variables(Vec<(String, String)>);

impl Variables {
    /// Reads the variables the checks need from the server.
    async fn read(conn: &mut Conn, cfg: &SourceConfig) -> Result<Self, MysqlError> {
        let vars: Vec<(String, String)> = conn
            .query(
                "SHOW GLOBAL VARIABLES WHERE Variable_name IN \
                 ('log_bin','binlog_format','binlog_row_image','binlog_row_metadata','server_id','gtid_mode',\
                  'enforce_gtid_consistency','binlog_row_value_options','binlog_transaction_compression')",
            )
            .await
            .map_err(query_err(cfg, "read server variables"))?;
        Ok(Self(vars))
    }

    /// The value of variable `name` (case-insensitive), if the server has it.
    fn get(&self, name: &str) -> Option<&str> {
        self.0
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    /// Adds a problem with `fix` unless variable `name` is `want` on `server`.
    fn expect(
        &self,
        problems: &mut Vec<String>,
        server: &Server,
        name: &str,
        want: &str,
        fix: &str,
    ) {
        let version = &server.text;
        match self.get(name) {
            Some(v) if v.eq_ignore_ascii_case(want) => {}
            Some(v) => problems.push(format!("{name} is {v}, must be {want}: {fix}")),
            None => problems.push(format!("{name} is not available on {version}: {fix}")),
        }
    }
}

/// Binlog on, ROW format, FULL row image and FULL row metadata.
fn check_binlog_settings(vars: &Variables, server: &Server, problems: &mut Vec<String>) {
    vars.expect(
        problems,
        server,
        "log_bin",
        "ON",
        "start the server with --log-bin",
    );
    vars.expect(
        problems,
        server,
        "binlog_format",
        "ROW",
        "SET GLOBAL binlog_format=ROW (and in the server config)",
    );
    vars.expect(
        problems,
        server,
        "binlog_row_image",
        "FULL",
        "SET GLOBAL binlog_row_image=FULL (and in the server config)",
    );
    vars.expect(
        problems,
        server,
        "binlog_row_metadata",
        "FULL",
        "SET GLOBAL binlog_row_metadata=FULL (MySQL 8.0.1+ / MariaDB 10.5+; older servers are not supported)",
    );
}

/// GTIDs on (and enforced) where the server's flavor needs them.
fn check_gtid_settings(vars: &Variables, server: &Server, problems: &mut Vec<String>) {
    if !server.needs_gtids() {
        return;
    }
    vars.expect(
        problems,
        server,
        "enforce_gtid_consistency",
        "ON",
        "SET PERSIST enforce_gtid_consistency = ON (before gtid_mode)",
    );
    vars.expect(
        problems,
        server,
        "gtid_mode",
        "ON",
        "Sluice reads MySQL snapshots and documents by GTID and resumes by them: \
         SET PERSIST gtid_mode = OFF_PERMISSIVE; SET PERSIST gtid_mode = ON_PERMISSIVE; \
         then, once SHOW STATUS LIKE 'Ongoing_anonymous_transaction_count' is 0, \
         SET PERSIST gtid_mode = ON",
    );
}

/// JSON columns logged whole, not as partial updates.
fn check_json_logging(vars: &Variables, problems: &mut Vec<String>) {
    if let Some(v) = vars.get("binlog_row_value_options") {
        if v.to_ascii_uppercase().contains("PARTIAL_JSON") {
            problems.push("binlog_row_value_options has PARTIAL_JSON: set it to '' so JSON columns are logged whole".into());
        }
    }
}

/// The server's own server_id (0 if unknown); a problem if the source announces the same.
fn check_server_id(vars: &Variables, cfg: &SourceConfig, problems: &mut Vec<String>) -> u32 {
    let server_id: u32 = vars
        .get("server_id")
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    if server_id == cfg.server_id {
        problems.push(format!(
            "source `{}` announces replication server_id {} which is the server's own server_id: choose another",
            cfg.name, cfg.server_id
        ));
    }
    server_id
}

/// The privileges a replica needs; returns whether the user may read binlog positions.
async fn check_privileges(
    conn: &mut Conn,
    cfg: &SourceConfig,
    server: &Server,
    problems: &mut Vec<String>,
) -> Result<bool, MysqlError> {
    let grants: Vec<String> = conn
        .query("SHOW GRANTS")
        .await
        .map_err(query_err(cfg, "read grants"))?;
    let grants = grants.join("\n").to_ascii_uppercase();
    let all = grants.contains("ALL PRIVILEGES ON *.*");
    let monitors = all
        || server
            .monitor_privileges()
            .iter()
            .any(|p| grants.contains(p));
    if !all {
        if !grants.contains("REPLICATION SLAVE") {
            problems.push(format!(
                "user `{}` lacks REPLICATION SLAVE: GRANT REPLICATION SLAVE ON *.* TO ...",
                cfg.user
            ));
        }
        if !monitors {
            problems.push(format!(
                "user `{}` lacks REPLICATION CLIENT (BINLOG MONITOR on MariaDB): GRANT REPLICATION CLIENT ON *.* TO ...",
                cfg.user
            ));
        }
        if !grants.contains("SELECT") {
            problems.push(format!(
                "user `{}` lacks SELECT: GRANT SELECT ON <db>.* TO ...",
                cfg.user
            ));
        }
    }
    Ok(monitors)
}

/// That the resume checkpoint `cp` is still on the server: its file, or its GTIDs.
async fn check_resume(
    conn: &mut Conn,
    cfg: &SourceConfig,
    server: &Server,
    cp: &Checkpoint,
    problems: &mut Vec<String>,
) -> Result<(), MysqlError> {
    let logs: Vec<mysql_async::Row> = conn
        .query("SHOW BINARY LOGS")
        .await
        .map_err(query_err(cfg, "list binary logs"))?;
    let files: Vec<String> = logs.iter().filter_map(|r| r.get::<String, _>(0)).collect();
    let gtid_resume = cp.gtid.as_ref().is_some_and(|g| !g.is_empty());
    if !files.contains(&cp.position.file) && !gtid_resume {
        problems.push(format!(
            "resume position {} is gone: binlog file {} was purged (oldest is {}). \
             Nothing was skipped: run `sluicectl sources resnapshot {}` to stream again from the current end \
             and build the source's pipelines anew",
            cp.position,
            cp.position.file,
            files.first().map(String::as_str).unwrap_or("none"),
            cfg.name
        ));
    }
    if let (Flavor::MySql, Some(want)) = (server.flavor, cp.gtid.as_ref()) {
        check_mysql_gtids_kept(conn, cfg, want, problems).await?;
    }
    if gtid_resume {
        if let Some(GtidSet::MariaDb(want)) = &cp.gtid {
            check_mariadb_gtids_kept(conn, cfg, &files, want, problems).await?;
        }
    }
    Ok(())
}

/// MySQL: that the server purged no transaction of the GTID set `want` lacks.
async fn check_mysql_gtids_kept(
    conn: &mut Conn,
    cfg: &SourceConfig,
    want: &GtidSet,
    problems: &mut Vec<String>,
) -> Result<(), MysqlError> {
    let purged: String = conn
        .query_first("SELECT @@GLOBAL.gtid_purged")
        .await
        .map_err(query_err(cfg, "read gtid_purged"))?
        .unwrap_or_default();
    let purged: GtidSet = purged.parse().unwrap_or_else(|_| GtidSet::empty_mysql());
    let lost = purged.missing_from(want);
    if !lost.is_empty() {
        problems.push(format!(
            "resume GTID set {want} is gone: the server purged transactions it lacks ({lost}). \
             Nothing was skipped: run `sluicectl sources resnapshot {}` to stream again from the \
             current end and build the source's pipelines anew",
            cfg.name
        ));
    }
    Ok(())
}

/// MariaDB: that the oldest binlog starts at or before each domain's GTID in `want`.
async fn check_mariadb_gtids_kept(
    conn: &mut Conn,
    cfg: &SourceConfig,
    files: &[String],
    want: &BTreeMap<u32, MariaDbGtid>,
    problems: &mut Vec<String>,
) -> Result<(), MysqlError> {
    let first_file = files.first().cloned().unwrap_or_default();
    let oldest: Option<Option<String>> = conn
        .exec_first("SELECT BINLOG_GTID_POS(?, 4)", (first_file,))
        .await
        .map_err(query_err(cfg, "read oldest GTID position"))?;
    let Some(Some(oldest)) = oldest else {
        return Ok(());
    };
    let Ok(GtidSet::MariaDb(oldest)) = oldest.parse::<GtidSet>() else {
        return Ok(());
    };
    for (domain, g) in want {
        if let Some(o) = oldest.get(domain) {
            if o.seq > g.seq {
                problems.push(format!(
                    "resume GTID {}-{}-{} is gone: the oldest binlog starts after {}-{}-{}. \
                     Nothing was skipped: run `sluicectl sources resnapshot {}` to stream again from the \
                     current end and build the source's pipelines anew",
                    g.domain, g.server, g.seq, o.domain, o.server, o.seq, cfg.name
                ));
            }
        }
    }
    Ok(())
}

/// The server `conn` is connected to.
pub async fn server_of(conn: &mut Conn, cfg: &SourceConfig) -> Result<Server, MysqlError> {
    let version: String = conn
        .query_first("SELECT VERSION()")
        .await
        .map_err(query_err(cfg, "read version"))?
        .unwrap_or_default();
    Ok(Server::from_version(&version))
}

/// The binlog's end on the server: the position after its last event.
pub async fn binlog_end(
    conn: &mut Conn,
    cfg: &SourceConfig,
    server: &Server,
) -> Result<BinlogPosition, MysqlError> {
    let sql = server.binlog_status();
    let status: Option<mysql_async::Row> = conn
        .query_first(sql)
        .await
        .map_err(query_err(cfg, "read the binlog's end"))?;
    let status = status.ok_or_else(|| MysqlError::Preflight {
        source_name: cfg.name.clone(),
        problems: vec![format!(
            "{sql} is empty: binary logging is off (start the server with --log-bin)"
        )],
    })?;
    let file: String = status.get(0).unwrap_or_default();
    let pos: u64 = status.get(1).unwrap_or(4);
    Ok(BinlogPosition::new(file, pos))
}

/// The binlog's end and the server's GTID state there (when it has one).
async fn current_end(
    conn: &mut Conn,
    cfg: &SourceConfig,
    server: &Server,
) -> Result<(BinlogPosition, Option<GtidSet>), MysqlError> {
    let end = binlog_end(conn, cfg, server).await?;
    let g: Option<String> = conn
        .query_first(server.gtid_state())
        .await
        .map_err(query_err(cfg, "read the GTID state"))?;
    Ok((end, g.and_then(|g| g.parse().ok())))
}

/// Where the source stands now: its GTID set, or on a server without GTIDs its
/// `server_id` and binlog end. A transaction committed before the call is at or before it.
pub async fn current_point(cfg: &SourceConfig) -> Result<sluice_model::SourcePoint, MysqlError> {
    let mut conn = connect(cfg).await?;
    let point = point_on(&mut conn, cfg).await;
    let _ = conn.disconnect().await;
    point
}

/// The current point of the server `conn` is connected to.
async fn point_on(
    conn: &mut Conn,
    cfg: &SourceConfig,
) -> Result<sluice_model::SourcePoint, MysqlError> {
    let server = server_of(conn, cfg).await?;
    let (end, gtids) = current_end(conn, cfg, &server).await?;
    Ok(match gtids.filter(|g| !g.is_empty()) {
        Some(g) => sluice_model::SourcePoint::Gtids(g),
        None => {
            let server_id: Option<u32> = conn
                .query_first("SELECT @@server_id")
                .await
                .map_err(query_err(cfg, "read server_id"))?;
            sluice_model::SourcePoint::Binlog {
                server_id: server_id.unwrap_or_default(),
                position: end,
            }
        }
    })
}

/// A source's current point read over a few pooled connections, for callers that ask
/// often (the search API's `/position`): no connection is opened per read.
pub struct Points {
    cfg: SourceConfig,
    pool: mysql_async::Pool,
}

impl Points {
    pub fn new(cfg: SourceConfig) -> Points {
        let constraints = mysql_async::PoolConstraints::new(0, 4).expect("0 <= 4");
        // Up to four kept idle for a minute after use (with no idle time-to-live the pool
        // keeps only its minimum, none, and each read would connect anew).
        let pool = mysql_async::PoolOpts::default()
            .with_constraints(constraints)
            .with_inactive_connection_ttl(std::time::Duration::from_secs(60));
        let opts = mysql_async::OptsBuilder::from_opts(cfg.opts()).pool_opts(pool);
        Points {
            pool: mysql_async::Pool::new(opts),
            cfg,
        }
    }

    pub fn config(&self) -> &SourceConfig {
        &self.cfg
    }

    pub async fn current(&self) -> Result<sluice_model::SourcePoint, MysqlError> {
        self.cfg.may_send_password()?;
        let mut conn = crate::auth::unwound(self.pool.get_conn())
            .await
            .map_err(|error| MysqlError::Connect {
                source_name: self.cfg.name.clone(),
                error,
            })?;
        point_on(&mut conn, &self.cfg).await
    }

    pub async fn close(self) {
        let _ = self.pool.disconnect().await;
    }
}

/// How many binlog bytes the server has written past `at`: the rest of `at`'s file plus
/// every later file (`SHOW BINARY LOGS`). `None` when `at`'s file is no longer listed.
pub async fn bytes_behind(
    conn: &mut Conn,
    cfg: &SourceConfig,
    at: &BinlogPosition,
) -> Result<Option<u64>, MysqlError> {
    let rows: Vec<mysql_async::Row> = conn
        .query("SHOW BINARY LOGS")
        .await
        .map_err(query_err(cfg, "SHOW BINARY LOGS"))?;
    let logs: Vec<(String, u64)> = rows
        .into_iter()
        .filter_map(|r| Some((r.get::<String, _>(0)?, r.get::<u64, _>(1)?)))
        .collect();
    Ok(behind(&logs, at))
}

fn behind(logs: &[(String, u64)], at: &BinlogPosition) -> Option<u64> {
    let i = logs.iter().position(|(name, _)| *name == at.file)?;
    let rest = logs[i].1.saturating_sub(at.pos);
    Some(rest + logs[i + 1..].iter().map(|(_, size)| size).sum::<u64>())
}

#[cfg(test)]
mod behind_tests {
    use super::*;

    #[test]
    fn counts_the_rest_of_the_file_and_every_later_one() {
        let logs = vec![
            ("b.000001".to_owned(), 1000),
            ("b.000002".to_owned(), 500),
            ("b.000003".to_owned(), 300),
        ];
        assert_eq!(
            behind(&logs, &BinlogPosition::new("b.000002", 200)),
            Some(600)
        );
        assert_eq!(
            behind(&logs, &BinlogPosition::new("b.000003", 300)),
            Some(0)
        );
        assert_eq!(behind(&logs, &BinlogPosition::new("b.000000", 4)), None);
    }
}
