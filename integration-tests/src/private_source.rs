//! A source server of the test's own, of the test's lane (binlog and GTIDs on, as the
//! stack's), for faults that would disturb every other test on the shared one: a crash
//! and restart, purged binary logs, a replica promoted to primary. MariaDB is installed
//! and started by the test from the same `mariadb-install-db` and `mariadbd` the stack
//! script uses; Oracle MySQL by `deploy/stack.sh mysql-private`, from the stack's private
//! prefix. Stopped when dropped.

use std::path::PathBuf;
use std::process::{Child, Command};
use std::time::Duration;

use crate::eventually;
use crate::lane::Lane;

pub struct PrivateSource {
    lane: Lane,
    dir: PathBuf,
    port: u16,
    server_id: u32,
    child: Option<Child>,
}

const ADMIN: &str = "sluice_admin";

impl PrivateSource {
    /// A server of the test's lane: a data directory of its own, on a free port.
    pub async fn start(server_id: u32) -> PrivateSource {
        let lane = Lane::current().flavor();
        let dir = crate::paths::target_dir()
            .join("it")
            .join(crate::unique(match lane {
                Lane::MariaDb | Lane::MariaDbWatermarks => "mariadb-",
                Lane::MySql => "mysql-",
            }));
        std::fs::create_dir_all(&dir).expect("server directory");
        let port = crate::ports::free_port();
        let mut server = PrivateSource {
            lane,
            dir,
            port,
            server_id,
            child: None,
        };
        if lane == Lane::MariaDb {
            server.configure_mariadb();
        }
        server.launch();
        server.wait_up().await;
        server.root(&format!(
            "SET SESSION sql_log_bin = 0;\
             CREATE USER '{ADMIN}'@'%' IDENTIFIED BY '{ADMIN}';\
             GRANT ALL PRIVILEGES ON *.* TO '{ADMIN}'@'%' WITH GRANT OPTION;\
             CREATE USER 'sluice'@'%' IDENTIFIED BY 'sluice';\
             GRANT SELECT, REPLICATION SLAVE, REPLICATION CLIENT ON *.* TO 'sluice'@'%';"
        ));
        server
    }

    fn configure_mariadb(&self) {
        let (dir, port, server_id) = (&self.dir, self.port, self.server_id);
        let cnf = format!(
            "[mariadbd]\nuser=root\ndatadir={d}/data\nport={port}\nbind-address=127.0.0.1\n\
             socket={d}/mariadb.sock\npid-file={d}/mariadb.pid\nlog-error={d}/mariadb.log\n\
             skip-name-resolve\nserver-id={server_id}\nlog-bin={d}/data/binlog\n\
             binlog-format=ROW\nbinlog-row-image=FULL\nbinlog-row-metadata=FULL\n\
             gtid-strict-mode=1\nlog-slave-updates\ncharacter-set-server=utf8mb4\n\
             collation-server=utf8mb4_unicode_ci\ninnodb_buffer_pool_size=32M\n\
             innodb_log_file_size=16M\nperformance_schema=OFF\n",
            d = dir.display()
        );
        std::fs::write(dir.join("my.cnf"), cnf).expect("my.cnf");
        install_db(dir);
    }

    fn launch(&mut self) {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.join("stdout.log"))
            .expect("log");
        let mut command = match self.lane {
            Lane::MariaDb | Lane::MariaDbWatermarks => {
                let mut c = Command::new("mariadbd");
                c.arg(format!("--defaults-file={}/my.cnf", self.dir.display()));
                c
            }
            Lane::MySql => {
                let mut c = Command::new(
                    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/stack.sh"),
                );
                c.arg("mysql-private")
                    .arg(&self.dir)
                    .arg(self.port.to_string())
                    .arg(self.server_id.to_string());
                c
            }
        };
        let child = command
            .stdout(log.try_clone().expect("log"))
            .stderr(log)
            .spawn()
            .expect("start the server (deploy/install.sh installs it)");
        self.child = Some(child);
    }

    fn socket(&self) -> PathBuf {
        self.dir.join(match self.lane {
            Lane::MariaDb | Lane::MariaDbWatermarks => "mariadb.sock",
            Lane::MySql => "mysql.sock",
        })
    }

    /// Runs `sql` as root over the socket (a test may change the server's settings).
    pub fn root(&self, sql: &str) {
        self.root_value(sql);
    }

    async fn wait_up(&self) {
        let url = self.url();
        eventually(
            &format!("{:?} on port {} up", self.lane, self.port),
            Duration::from_secs(90),
            || async {
                if !self.socket().exists() {
                    return Err(self.log_tail());
                }
                // The admin user exists only after the first start; the socket is enough.
                match mysql_async::Conn::new(mysql_async::Opts::from_url(&url).expect("url")).await
                {
                    Ok(_) => Ok(()),
                    Err(mysql_async::Error::Server(_)) => Ok(()),
                    Err(e) => Err(format!("{e}\n{}", self.log_tail())),
                }
            },
        )
        .await;
    }

    /// An admin URL (every privilege), as `MARIADB_URL` is for the stack.
    pub fn url(&self) -> String {
        format!("mysql://{ADMIN}:{ADMIN}@127.0.0.1:{}", self.port)
    }

    /// The stack with this server as the test's MySQL (for [`crate::TestCtx::on`]).
    pub async fn stack(&self) -> crate::stack::Stack {
        crate::stack::Stack::connect_with_mysql(&self.url()).await
    }

    pub fn addr(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// Makes this server a replica of `primary`, by GTID from the primary's first
    /// transaction (the users are created outside the binlog on each server).
    pub fn replicate_from(&self, primary: &PrivateSource) {
        let port = primary.port;
        self.root(&match self.lane {
            Lane::MariaDb | Lane::MariaDbWatermarks => format!(
                "CHANGE MASTER TO MASTER_HOST = '127.0.0.1', MASTER_PORT = {port}, MASTER_USER = '{ADMIN}', \
                 MASTER_PASSWORD = '{ADMIN}', MASTER_USE_GTID = slave_pos; START SLAVE;"
            ),
            // caching_sha2_password over plain TCP: the primary's RSA key is asked for.
            Lane::MySql => format!(
                "CHANGE REPLICATION SOURCE TO SOURCE_HOST = '127.0.0.1', SOURCE_PORT = {port}, \
                 SOURCE_USER = '{ADMIN}', SOURCE_PASSWORD = '{ADMIN}', SOURCE_AUTO_POSITION = 1, \
                 GET_SOURCE_PUBLIC_KEY = 1; START REPLICA;"
            ),
        });
    }

    /// Stops this replica's applier: what it receives is not visible on it until
    /// [`Self::resume_applier`].
    pub fn pause_applier(&self) {
        self.root(match self.lane {
            Lane::MariaDb | Lane::MariaDbWatermarks => "STOP SLAVE SQL_THREAD",
            Lane::MySql => "STOP REPLICA SQL_THREAD",
        });
    }

    pub fn resume_applier(&self) {
        self.root(match self.lane {
            Lane::MariaDb | Lane::MariaDbWatermarks => "START SLAVE SQL_THREAD",
            Lane::MySql => "START REPLICA SQL_THREAD",
        });
    }

    /// Promotes this replica: waits until it applied everything `primary` has written
    /// (no write may reach the primary any more), then stops replicating.
    pub fn promote(&self, primary: &PrivateSource) {
        match self.lane {
            Lane::MariaDb | Lane::MariaDbWatermarks => {
                let end = primary.root_value("SELECT @@GLOBAL.gtid_binlog_pos");
                let waited = self.root_value(&format!("SELECT MASTER_GTID_WAIT('{end}', 60)"));
                assert_eq!(waited, "0", "the replica did not apply {end} within 60 s");
                self.root("STOP SLAVE; RESET SLAVE ALL;");
            }
            Lane::MySql => {
                let end = primary.root_value("SELECT @@GLOBAL.gtid_executed");
                let waited =
                    self.root_value(&format!("SELECT WAIT_FOR_EXECUTED_GTID_SET('{end}', 60)"));
                assert_eq!(waited, "0", "the replica did not apply {end} within 60 s");
                self.root("STOP REPLICA; RESET REPLICA ALL;");
            }
        }
    }

    /// Runs `sql` as root over the socket; what it printed (the one value a query answers).
    fn root_value(&self, sql: &str) -> String {
        let out = Command::new("mariadb")
            .args(["--no-defaults", "-uroot", "--batch", "--skip-column-names"])
            .arg(format!("--socket={}", self.socket().display()))
            .arg("-e")
            .arg(sql)
            .output()
            .expect("mariadb client");
        assert!(
            out.status.success(),
            "{sql}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).trim().to_owned()
    }

    /// A crash: `kill -9` of the server process.
    pub fn kill9(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts the server again on the same data and port (after [`Self::kill9`]).
    pub async fn restart(&mut self) {
        assert!(self.child.is_none(), "the server is still running");
        self.launch();
        self.wait_up().await;
    }

    fn log_tail(&self) -> String {
        let log = match self.lane {
            Lane::MariaDb | Lane::MariaDbWatermarks => self.dir.join("mariadb.log"),
            Lane::MySql => self.dir.join("mysqld.err"),
        };
        let log = std::fs::read_to_string(log).unwrap_or_default();
        let lines: Vec<&str> = log.lines().collect();
        lines[lines.len().saturating_sub(15)..].join("\n")
    }
}

impl Drop for PrivateSource {
    fn drop(&mut self) {
        self.kill9();
        if !std::thread::panicking() {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

/// `mariadb-install-db` into `dir/data`, its output kept in `dir/install-db.log`. Tried
/// twice (the second time on an empty data directory): once in a full run, two of these
/// started together and both failed without a trace; the log now keeps why.
fn install_db(dir: &std::path::Path) {
    let log_path = dir.join("install-db.log");
    for attempt in 1..=2 {
        let _ = std::fs::remove_dir_all(dir.join("data"));
        let log = std::fs::File::create(&log_path).expect("install-db log");
        let installed = Command::new("mariadb-install-db")
            .args(["--no-defaults", "--user=root", "--skip-test-db"])
            .arg(format!("--datadir={}/data", dir.display()))
            .arg("--auth-root-authentication-method=socket")
            .stdout(log.try_clone().expect("log"))
            .stderr(log)
            .status()
            .expect("mariadb-install-db (install MariaDB: deploy/install.sh does)");
        if installed.success() {
            return;
        }
        eprintln!(
            "mariadb-install-db failed in {} (attempt {attempt}):\n{}",
            dir.display(),
            crate::last_lines(&log_path, 15)
        );
    }
    panic!("mariadb-install-db failed twice in {}", dir.display());
}
