//! The Sluice binaries as child processes: started, signalled, killed, their logs and
//! metrics read.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use crate::paths::target_dir;

/// The worker and etl of one test.
pub struct Running {
    pub worker: Service,
    pub etl: Service,
}

impl Running {
    pub fn logs(&self) -> String {
        format!(
            "--- etl log ---\n{}\n--- worker log ---\n{}",
            self.etl.log_tail(),
            self.worker.log_tail()
        )
    }
}

/// A Sluice binary running as a child process, its output in a log file.
pub struct Service {
    pub bin: &'static str,
    pub config: PathBuf,
    pub log: PathBuf,
    env: Vec<(String, String)>,
    child: Option<Child>,
    /// Stopped by SIGSTOP and not continued since.
    pub paused: bool,
    /// Where its `/metrics`, `/healthz` and `/readyz` are served.
    pub telemetry: std::net::SocketAddr,
    /// The image it runs from as a container (`crate::container`), instead of its binary.
    /// Its process is then `podman run`: TERM and INT reach the service through podman's
    /// signal proxy, STOP and CONT only podman, and its memory figures are podman's.
    pub(crate) image: Option<String>,
}

impl Service {
    pub(crate) fn new(bin: &'static str, config: PathBuf, log: PathBuf) -> Service {
        Service {
            bin,
            config,
            log,
            env: Vec::new(),
            child: None,
            paused: false,
            telemetry: std::net::SocketAddr::from(([127, 0, 0, 1], 9464)),
            image: None,
        }
    }

    /// The name of its container: the test's directory and the service's log name.
    pub fn container_name(&self) -> String {
        let part = |p: Option<&std::ffi::OsStr>| {
            p.map_or(String::new(), |p| p.to_string_lossy().into_owned())
        };
        let dir = part(self.log.parent().and_then(Path::file_name));
        format!("sluice-it-{dir}-{}", part(self.log.file_stem()))
    }

    /// How it starts: its binary, or `podman run` of its image with the test's directory
    /// (its config and secrets) mounted read-only where it is, and its environment (by
    /// name: podman takes the values from its own, so no secret is on a command line).
    fn command(&self) -> Command {
        let Some(image) = &self.image else {
            let mut cmd = Command::new(Service::binary(self.bin));
            cmd.arg("--config").arg(&self.config);
            return cmd;
        };
        let name = self.container_name();
        crate::container::remove(&name);
        let dir = self
            .config
            .parent()
            .expect("a config file in the test's directory");
        let dir = dir.to_str().expect("a UTF-8 test directory");
        let mut cmd = crate::container::podman();
        // --init: a service is not PID 1, which would ignore a signal it has no handler
        // for yet.
        cmd.args([
            "run",
            "--rm",
            "--init",
            "--name",
            &name,
            "--network",
            "host",
        ]);
        cmd.arg("--label").arg(crate::container::LABEL);
        cmd.arg("--volume").arg(format!("{dir}:{dir}:ro"));
        cmd.arg("--env").arg("RUST_LOG");
        for (k, _) in &self.env {
            cmd.arg("--env").arg(k);
        }
        cmd.arg(image).arg("--config").arg(&self.config);
        cmd
    }

    /// An environment variable for the process; a `SLUICE_…` one overrides a key of its
    /// config file (`SLUICE_WORKER__MAX_IN_FLIGHT`).
    pub fn with_env(mut self, key: &str, value: &str) -> Service {
        self.env.push((key.to_owned(), value.to_owned()));
        self
    }

    /// Removes the environment variable `key` for its next start.
    pub fn without_env(&mut self, key: &str) -> &mut Self {
        self.env.retain(|(k, _)| k != key);
        self
    }

    /// Sends `signal` (`STOP`, `CONT`, `TERM`…) to the running process.
    pub fn signal(&mut self, signal: &str) {
        let pid = self
            .pid()
            .unwrap_or_else(|| panic!("{} is not running", self.bin));
        let status = Command::new("kill")
            .arg(format!("-{signal}"))
            .arg(pid.to_string())
            .status()
            .expect("kill");
        assert!(status.success(), "kill -{signal} {pid} failed");
        match signal {
            "STOP" => self.paused = true,
            "CONT" => self.paused = false,
            _ => {}
        }
    }

    /// The binary in `SLUICE_BIN_DIR` when set (`make bench` uses `target/release`),
    /// otherwise in the debug build.
    pub fn binary(bin: &str) -> PathBuf {
        let dir = std::env::var_os("SLUICE_BIN_DIR")
            .filter(|d| !d.is_empty())
            .map(PathBuf::from)
            .unwrap_or_else(|| target_dir().join("debug"));
        let path = dir.join(bin);
        assert!(
            path.exists(),
            "{} is missing: build the binaries first (`cargo build --bins`; `make test` does)",
            path.display()
        );
        path
    }

    pub fn start(&mut self) -> &mut Self {
        assert!(self.child.is_none(), "{} already running", self.bin);
        let log = fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .expect("log file");
        let rust_log = std::env::var("SLUICE_IT_LOG")
            .unwrap_or_else(|_| sluice_runtime::telemetry::DEFAULT_FILTER.into());
        let child = self
            .command()
            // Every SLUICE_* variable is a config override for the services.
            .env_remove("SLUICE_BIN_DIR")
            .env_remove("SLUICE_IT_LOG")
            .env("RUST_LOG", &rust_log)
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("log file"))
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {}: {e}", self.bin));
        self.child = Some(child);
        self
    }

    /// `GET` of `path` on its telemetry endpoint: status and body.
    pub async fn ops(&self, path: &str) -> Result<(u16, String), String> {
        let url = format!("http://{}{path}", self.telemetry);
        let answer = reqwest::get(&url)
            .await
            .map_err(|e| format!("{url}: {e}"))?;
        let status = answer.status().as_u16();
        let body = answer.text().await.map_err(|e| format!("{url}: {e}"))?;
        Ok((status, body))
    }

    /// Its `/metrics`: each sample's value by `name{labels}` as the text format writes it.
    pub async fn metrics(&self) -> Result<std::collections::BTreeMap<String, f64>, String> {
        let (status, body) = self.ops("/metrics").await?;
        if status != 200 {
            return Err(format!("/metrics answered {status}: {body}"));
        }
        Ok(body
            .lines()
            .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
            .filter_map(|l| {
                let (series, value) = l.rsplit_once(' ')?;
                Some((series.to_owned(), value.parse().ok()?))
            })
            .collect())
    }

    /// The sum of metric `name`'s samples whose labels include each of `labels`.
    pub async fn metric_sum(&self, name: &str, labels: &[(&str, &str)]) -> Result<f64, String> {
        Ok(series_sum(&self.metrics().await?, name, labels))
    }

    /// [`Service::metric_sum`] of a running service whose metrics must be readable.
    pub async fn metric(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        self.metric_sum(name, labels)
            .await
            .unwrap_or_else(|e| panic!("{} metrics: {e}", self.bin))
    }

    /// The process's peak resident memory (`VmHWM`), in bytes.
    pub fn peak_rss(&self) -> Option<u64> {
        self.status_bytes("VmHWM:")
    }

    /// The process's resident memory now (`VmRSS`), in bytes.
    pub fn rss(&self) -> Option<u64> {
        self.status_bytes("VmRSS:")
    }

    fn status_bytes(&self, field: &str) -> Option<u64> {
        let status = fs::read_to_string(format!("/proc/{}/status", self.pid()?)).ok()?;
        let line = status.lines().find(|l| l.starts_with(field))?;
        let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
        Some(kib * 1024)
    }

    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// `kill -9`: no drain, no goodbye (a container is removed by force).
    pub fn kill9(&mut self) {
        if self.image.is_some() && self.child.is_some() {
            crate::container::remove(&self.container_name());
        }
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// SIGTERM, then waits for the exit (at most `within`).
    pub fn terminate(&mut self, within: Duration) -> std::process::ExitStatus {
        self.signal("TERM");
        self.wait_exit(within).unwrap_or_else(|| {
            panic!(
                "{} did not exit within {within:?} of SIGTERM:\n{}",
                self.bin,
                self.log_tail()
            )
        })
    }

    /// Waits at most `within` for the process to exit; `None` (still running) after it.
    pub fn wait_exit(&mut self, within: Duration) -> Option<std::process::ExitStatus> {
        let c = self.child.as_mut().expect("service running");
        let deadline = std::time::Instant::now() + within;
        loop {
            if let Some(status) = c.try_wait().expect("wait") {
                self.child = None;
                return Some(status);
            }
            if std::time::Instant::now() >= deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(50)); // polling a child's exit
        }
    }

    /// Waits until the process aborted at failpoint `name` (armed with
    /// `with_env("FAILPOINTS", …)`); fails when it did not within `within`.
    pub fn wait_failpoint(&mut self, name: &str, within: Duration) {
        use std::os::unix::process::ExitStatusExt as _;
        let status = self.wait_exit(within);
        let said = fs::read_to_string(&self.log)
            .unwrap_or_default()
            .contains(&format!("failpoint {name}: aborting"));
        assert!(
            status.is_some_and(|s| s.signal() == Some(6)) && said,
            "{} did not stop at failpoint {name} within {within:?} (status {status:?}); \
             failpoints exist in debug builds only (`cargo build --bins`; make test does):\n{}",
            self.bin,
            self.log_tail()
        );
    }

    /// Runs the binary to completion (for start-up failures) and returns (status, output).
    pub fn run_to_exit(&self, within: Duration) -> (std::process::ExitStatus, String) {
        let mut child = Command::new(Service::binary(self.bin))
            .arg("--config")
            .arg(&self.config)
            .env_remove("SLUICE_BIN_DIR")
            .env_remove("SLUICE_IT_LOG")
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn");
        let deadline = std::time::Instant::now() + within;
        loop {
            if let Some(status) = child.try_wait().expect("wait") {
                let out = child.wait_with_output().expect("output");
                let text = format!(
                    "{}{}",
                    String::from_utf8_lossy(&out.stdout),
                    String::from_utf8_lossy(&out.stderr)
                );
                return (status, text);
            }
            if std::time::Instant::now() >= deadline {
                let _ = child.kill();
                panic!("{} kept running with a bad config", self.bin);
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    pub fn is_running(&mut self) -> bool {
        self.child
            .as_mut()
            .is_some_and(|c| c.try_wait().ok().flatten().is_none())
    }

    /// How long the service's log is now: a mark for [`Service::logged_since`].
    pub fn log_mark(&self) -> usize {
        fs::metadata(&self.log).map_or(0, |m| m.len() as usize)
    }

    /// `Ok` once the log, after `mark`, contains any of `needles`; otherwise what it says.
    pub fn logged_since(&self, mark: usize, needles: &[&str]) -> Result<(), String> {
        let after = self.log_since(mark);
        if needles.iter().any(|n| after.contains(n)) {
            Ok(())
        } else {
            Err(format!("{} log since the mark:\n{after}", self.bin))
        }
    }

    /// When the service first logged a line holding every one of `needles`: seconds since
    /// midnight UTC, read from the line's timestamp.
    pub fn first_logged(&self, needles: &[&str]) -> Option<f64> {
        let log = fs::read_to_string(&self.log).unwrap_or_default();
        let line = log
            .lines()
            .find(|l| needles.iter().all(|n| l.contains(n)))?;
        // `2026-11-28T05:54:11.035167Z ...`, in colour escapes (`ESC[2m`) or not.
        let mut plain = String::new();
        let mut chars = line.chars();
        while let Some(c) = chars.next() {
            if c == '\x1b' {
                chars.by_ref().find(|c| *c == 'm');
            } else {
                plain.push(c);
            }
        }
        let clock = plain.split_whitespace().next()?.split('T').nth(1)?;
        let clock = clock.trim_end_matches('Z');
        let mut parts = clock.split(':');
        let (h, m, s) = (parts.next()?, parts.next()?, parts.next()?);
        Some(
            h.parse::<f64>().ok()? * 3600.0
                + m.parse::<f64>().ok()? * 60.0
                + s.parse::<f64>().ok()?,
        )
    }

    /// What the service logged after `mark` ([`Service::log_mark`]).
    pub fn log_since(&self, mark: usize) -> String {
        let log = fs::read_to_string(&self.log).unwrap_or_default();
        log.get(mark..).unwrap_or_default().to_owned()
    }

    /// The last lines of the service's log (for failure messages).
    pub fn log_tail(&self) -> String {
        crate::last_lines(&self.log, 40)
    }
}

impl Drop for Service {
    fn drop(&mut self) {
        if std::thread::panicking() {
            // CI keeps only the test's output: the log is the one clue to what happened.
            eprintln!(
                "--- {} log ({}) ---\n{}",
                self.bin,
                self.log.display(),
                self.log_tail()
            );
        }
        self.kill9();
    }
}

/// The sum of `name`'s series in `m` whose labels include every `label="value"`.
pub fn series_sum(
    m: &std::collections::BTreeMap<String, f64>,
    name: &str,
    labels: &[(&str, &str)],
) -> f64 {
    m.iter()
        .filter(|(k, _)| {
            k.split('{').next() == Some(name)
                && labels
                    .iter()
                    .all(|(l, v)| k.contains(&format!("{l}=\"{v}\"")))
        })
        .map(|(_, v)| v)
        .sum()
}

/// What histogram `name` observed between two scrapes of the same service: each bucket's
/// upper bound (`le`, `+Inf` as infinity) with its cumulative count, by bound.
pub fn buckets_between(
    before: &std::collections::BTreeMap<String, f64>,
    after: &std::collections::BTreeMap<String, f64>,
    name: &str,
) -> Vec<(f64, f64)> {
    let prefix = format!("{name}_bucket{{");
    let mut buckets: Vec<(f64, f64)> = after
        .iter()
        .filter(|(k, _)| k.starts_with(&prefix))
        .filter_map(|(k, v)| {
            let le = k.split("le=\"").nth(1)?.split('"').next()?;
            let le = if le == "+Inf" {
                f64::INFINITY
            } else {
                le.parse().ok()?
            };
            Some((le, v - before.get(k).copied().unwrap_or(0.0)))
        })
        .collect();
    buckets.sort_by(|a, b| a.0.total_cmp(&b.0));
    buckets
}

/// The value of the one series of `name` whose labels include every `label="value"`.
pub fn sample(
    m: &std::collections::BTreeMap<String, f64>,
    name: &str,
    labels: &[&str],
) -> Option<f64> {
    m.iter()
        .find(|(series, _)| {
            let (n, rest) = series.split_once('{').unwrap_or((series, ""));
            n == name && labels.iter().all(|l| rest.contains(l))
        })
        .map(|(_, v)| *v)
}

/// A process's peak resident memory (`VmHWM`, KiB) and the CPU seconds it used (user +
/// system), from `/proc`; `None` once it is gone.
pub fn proc_usage(pid: u32) -> Option<(u64, f64)> {
    let status = fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let peak = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))?
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()?;
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The fields after the command (which may hold spaces) in parentheses: utime and
    // stime are the 12th and 13th, in clock ticks (100 a second on Linux).
    let after = stat.rsplit_once(')')?.1;
    let fields: Vec<&str> = after.split_whitespace().collect();
    let ticks: u64 = fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?;
    Some((peak, ticks as f64 / 100.0))
}
