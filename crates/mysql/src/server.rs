//! What kind of server a source is, and every statement that differs by its kind and
//! version: the one place of this crate that knows MariaDB from Oracle MySQL, chosen by
//! the server's own `VERSION()` (never by string checks elsewhere).
//!
//! | concern                      | MariaDB 10.5+                      | Oracle MySQL 8.0 – 9.x                     |
//! |------------------------------|------------------------------------|--------------------------------------------|
//! | binlog end                   | `SHOW MASTER STATUS`               | `SHOW BINARY LOG STATUS` (8.2+), `SHOW MASTER STATUS` before |
//! | GTID state                   | `@@gtid_binlog_pos`, `d-s-n` lists | `@@gtid_executed`, `uuid:a-b` sets         |
//! | purged GTIDs                 | `BINLOG_GTID_POS(oldest file, 4)`  | `@@gtid_purged`                            |
//! | a snapshot's binlog position | `binlog_snapshot_file/position`    | none: watermarks ([`crate::snapshot`])     |
//! | a change visible to readers  | a snapshot past its position       | `WAIT_FOR_EXECUTED_GTID_SET`               |
//! | heartbeat variable           | `@master_heartbeat_period`         | `@source_heartbeat_period` (8.0.26+)       |
//! | replica capability           | `@mariadb_slave_capability = 4`    | —                                          |
//! | cached table statistics      | —                                  | `information_schema_stats_expiry = 0`      |

use std::fmt;
use std::time::Duration;

/// A source server's kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Flavor {
    MariaDb,
    MySql,
}

/// A source server: its kind and version, as `VERSION()` reports them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Server {
    pub flavor: Flavor,
    /// Major, minor, patch.
    pub version: (u32, u32, u32),
    /// `VERSION()` as the server said it.
    pub text: String,
}

impl fmt::Display for Server {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let kind = match self.flavor {
            Flavor::MariaDb => "MariaDB",
            Flavor::MySql => "MySQL",
        };
        write!(f, "{kind} {}", self.text)
    }
}

impl Server {
    /// The server `VERSION()` describes (`10.11.19-MariaDB-0+deb12u1-log`, `9.7.4-2`,
    /// `8.0.36`). Missing parts of the number are 0.
    pub fn from_version(text: &str) -> Server {
        let flavor = if text.to_ascii_lowercase().contains("mariadb") {
            Flavor::MariaDb
        } else {
            Flavor::MySql
        };
        // MariaDB once reported "5.5.5-10.x" to old clients; the real version follows.
        let number = text.strip_prefix("5.5.5-").unwrap_or(text);
        let mut parts = number
            .split(|c: char| !c.is_ascii_digit())
            .take(3)
            .map(|p| p.parse().unwrap_or(0));
        let mut next = || parts.next().unwrap_or(0);
        Server {
            flavor,
            version: (next(), next(), next()),
            text: text.to_owned(),
        }
    }

    fn at_least(&self, major: u32, minor: u32, patch: u32) -> bool {
        self.version >= (major, minor, patch)
    }

    /// Why Sluice does not stream from this server, if it does not.
    pub fn refusal(&self) -> Option<String> {
        match self.flavor {
            Flavor::MySql if !self.at_least(8, 0, 0) => Some(format!(
                "{self} is not supported: MySQL before 8.0 is end of life and lacks full row \
                 metadata in its binlog (binlog_row_metadata); upgrade to MySQL 8.0 or newer"
            )),
            Flavor::MariaDb if !self.at_least(10, 5, 0) => Some(format!(
                "{self} is not supported: MariaDB before 10.5 lacks full row metadata in its \
                 binlog (binlog_row_metadata); upgrade to MariaDB 10.5 or newer"
            )),
            _ => None,
        }
    }

    /// The statement whose first row is the binlog's end: file, position, …
    pub fn binlog_status(&self) -> &'static str {
        match self.flavor {
            Flavor::MySql if self.at_least(8, 2, 0) => "SHOW BINARY LOG STATUS",
            _ => "SHOW MASTER STATUS",
        }
    }

    /// The query of the server's GTID state (one text value).
    pub fn gtid_state(&self) -> &'static str {
        match self.flavor {
            Flavor::MariaDb => "SELECT @@GLOBAL.gtid_binlog_pos",
            Flavor::MySql => "SELECT @@GLOBAL.gtid_executed",
        }
    }

    /// The statement setting the heartbeat a binlog stream asks of the server.
    pub fn heartbeat(&self, period: Duration) -> String {
        let name = match self.flavor {
            Flavor::MySql if self.at_least(8, 0, 26) => "source_heartbeat_period",
            _ => "master_heartbeat_period",
        };
        format!("SET @{name} = {}", period.as_nanos())
    }

    /// What a replica announces before asking for the binlog: MariaDB sends its own
    /// events (GTIDs, annotations) only to replicas that say they understand them.
    pub fn replica_announcement(&self) -> Option<&'static str> {
        match self.flavor {
            Flavor::MariaDb => Some("SET @mariadb_slave_capability = 4"),
            Flavor::MySql => None,
        }
    }

    /// Session settings of connections that read rows and tables: MySQL caches
    /// `information_schema.TABLES` statistics for a day by default, so a new table's
    /// row estimate (which cuts builds into chunks) would read 0.
    pub fn reader_session(&self) -> &'static [&'static str] {
        match self.flavor {
            Flavor::MySql => &["SET SESSION information_schema_stats_expiry = 0"],
            Flavor::MariaDb => &[],
        }
    }

    /// The privilege that lets a user read binlog positions, as `SHOW GRANTS` names it.
    pub fn monitor_privileges(&self) -> &'static [&'static str] {
        match self.flavor {
            Flavor::MariaDb => &["REPLICATION CLIENT", "BINLOG MONITOR"],
            Flavor::MySql => &["REPLICATION CLIENT"],
        }
    }

    /// Whether document reads and build snapshots need the server's GTIDs: MySQL tells
    /// neither a snapshot's binlog position nor when a logged change became visible
    /// other than by GTID.
    pub fn needs_gtids(&self) -> bool {
        self.flavor == Flavor::MySql
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_are_read_from_what_each_server_reports() {
        let m = Server::from_version("10.11.19-MariaDB-0+deb12u1-log");
        assert_eq!((m.flavor, m.version), (Flavor::MariaDb, (10, 11, 19)));
        let m = Server::from_version("5.5.5-10.4.3-MariaDB");
        assert_eq!((m.flavor, m.version), (Flavor::MariaDb, (10, 4, 3)));
        let o = Server::from_version("9.7.4-2");
        assert_eq!((o.flavor, o.version), (Flavor::MySql, (9, 7, 4)));
        let o = Server::from_version("8.0.36-0ubuntu0.22.04.1");
        assert_eq!((o.flavor, o.version), (Flavor::MySql, (8, 0, 36)));
        assert_eq!(Server::from_version("8").version, (8, 0, 0));
    }

    #[test]
    fn statements_follow_the_version() {
        let v = |t| Server::from_version(t);
        assert_eq!(v("9.7.4").binlog_status(), "SHOW BINARY LOG STATUS");
        assert_eq!(v("8.4.0").binlog_status(), "SHOW BINARY LOG STATUS");
        assert_eq!(v("8.0.36").binlog_status(), "SHOW MASTER STATUS");
        assert_eq!(v("10.11.19-MariaDB").binlog_status(), "SHOW MASTER STATUS");
        assert_eq!(
            v("8.0.25").heartbeat(Duration::from_secs(5)),
            "SET @master_heartbeat_period = 5000000000"
        );
        assert_eq!(
            v("8.4.3").heartbeat(Duration::from_secs(5)),
            "SET @source_heartbeat_period = 5000000000"
        );
        assert!(v("10.6.1-MariaDB").replica_announcement().is_some());
        assert!(v("9.7.4").replica_announcement().is_none());
        assert_eq!(v("9.7.4").gtid_state(), "SELECT @@GLOBAL.gtid_executed");
    }

    #[test]
    fn end_of_life_servers_are_refused_with_the_reason() {
        let r = Server::from_version("5.7.44-log")
            .refusal()
            .expect("refused");
        assert!(r.contains("end of life"), "{r}");
        assert!(Server::from_version("10.4.32-MariaDB").refusal().is_some());
        assert!(Server::from_version("8.0.11").refusal().is_none());
        assert!(Server::from_version("10.5.0-MariaDB").refusal().is_none());
    }
}
