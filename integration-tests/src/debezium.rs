//! Debezium's MySQL (or MariaDB) connector in its embedded engine, writing a test's table
//! into the stack's Kafka in Debezium's own format (`integration-tests/debezium/run.sh`,
//! which installs it from Maven Central on first use): the producer of the topics an etl
//! reads as Debezium input.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};

use crate::lane::Lane;
use crate::TestCtx;

/// A running engine; dropping it stops the JVM (its stdin closes: a clean stop).
pub struct Debezium {
    child: Option<Child>,
    pub log: PathBuf,
}

impl Debezium {
    /// Installs the connector of the test's lane (once per machine), panicking with how
    /// to retry when it cannot.
    pub fn install() {
        let status = Command::new(script())
            .args(["install", connector()])
            .status()
            .expect("run integration-tests/debezium/run.sh install");
        assert!(
            status.success(),
            "Debezium could not be installed from Maven Central ({status}): run \
             `integration-tests/debezium/run.sh install {}` to see why",
            connector()
        );
    }

    /// Starts an engine capturing `tables` of the test's database into topics
    /// `<prefix>.<db>.<table>`: a snapshot of the table first (its records `op: r`), then
    /// its binlog. `schemas`: Debezium's JSON converter with schemas in every message.
    /// `run` numbers the log of this start.
    pub fn start(
        ctx: &TestCtx,
        prefix: &str,
        tables: &[&str],
        schemas: bool,
        run: u32,
    ) -> Debezium {
        Self::install();
        let work = ctx.dir.join(format!("debezium-{run}"));
        std::fs::create_dir_all(&work).expect("work dir");
        let log = work.join("debezium.log");
        let out = std::fs::File::create(&log).expect("log file");
        let url = mysql_async::Opts::from_url(&ctx.stack.mysql_url).expect("a mysql:// URL");
        let schemas = schemas.to_string();
        let qualified: Vec<String> = tables.iter().map(|t| format!("{}.{t}", ctx.db)).collect();
        let child = Command::new(script())
            .args(["--connector", connector()])
            .args(["--host", url.ip_or_hostname()])
            .args(["--port", &url.tcp_port().to_string()])
            .args(["--user", url.user().unwrap_or("root")])
            .args(["--password", url.pass().unwrap_or("")])
            .args(["--database", &ctx.db])
            .args(["--table", &qualified.join(",")])
            .args(["--server-id", &(ctx.server_id + 900).to_string()])
            .args([
                "--topic-prefix",
                prefix,
                "--bootstrap",
                &ctx.kafka_brokers(),
            ])
            .args(["--work-dir", &work.display().to_string()])
            // Running on after its first event, until stopped.
            .args(["--events", "1", "--timeout-s", "3600", "--hold"])
            .args(["--set", "snapshot.mode=initial"])
            .args(["--set", "snapshot.locking.mode=none"])
            // Only the captured tables' DDL: other tests create and drop databases on
            // the same server meanwhile, which a snapshot of every schema trips over.
            .args([
                "--set",
                "schema.history.internal.store.only.captured.tables.ddl=true",
            ])
            .args([
                "--set",
                "schema.history.internal.store.only.captured.databases.ddl=true",
            ])
            .args(["--set", "decimal.handling.mode=string"])
            .args(["--set", &format!("key.converter.schemas.enable={schemas}")])
            .args([
                "--set",
                &format!("value.converter.schemas.enable={schemas}"),
            ])
            .args(["--set", &format!("converter.schemas.enable={schemas}")])
            .env("DEBEZIUM_LOG_LEVEL", "warn")
            .stdin(Stdio::piped())
            .stdout(out.try_clone().expect("log file"))
            .stderr(out)
            .spawn()
            .expect("start Debezium");
        Debezium {
            child: Some(child),
            log,
        }
    }

    /// The last lines of its log.
    pub fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(40)..].join("\n")
    }

    /// Stops it cleanly (its offsets written), within 30 s, then for good.
    pub fn stop(&mut self) {
        let Some(mut child) = self.child.take() else {
            return;
        };
        drop(child.stdin.take());
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        while std::time::Instant::now() < deadline {
            if let Ok(Some(_)) = child.try_wait() {
                return;
            }
            std::thread::sleep(std::time::Duration::from_millis(100)); // polling an exit
        }
        let _ = child.kill();
        let _ = child.wait();
    }
}

impl Drop for Debezium {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

fn script() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("debezium/run.sh")
}

fn connector() -> &'static str {
    match Lane::current().flavor() {
        Lane::MySql => "mysql",
        _ => "mariadb",
    }
}
