//! Where a machine's CPU went while a benchmark ran: the CPU seconds of the stack's
//! services and Sluice's processes, read from `/proc` before and after, so a figure
//! next to its ceiling can say what else shared the cores with the sink.

use std::collections::BTreeMap;
use std::fs;

/// The processes counted, by a word of their command line, under a short name.
/// Sluice's own first: a word of a service's own command line may also be in a path.
const KINDS: [(&str, &str); 9] = [
    ("sluice-etl", "etl"),
    ("sluice-worker", "workers"),
    ("sluice-center", "center"),
    ("opensearch", "opensearch"),
    ("elasticsearch", "elasticsearch"),
    ("kafka", "kafka"),
    ("mariadbd", "mariadb"),
    ("mysqld", "mysql"),
    ("zookeeper", "zookeeper"),
];

/// CPU seconds used so far, by kind of process (the bench itself, its load and probe, as
/// `bench`); and the whole machine's busy seconds with the wall time, so that what else
/// ran is seen too.
#[derive(Debug)]
pub struct CpuSeconds {
    by: BTreeMap<&'static str, f64>,
    /// The machine's busy seconds (all cores): since boot, or over `wall`.
    machine: Option<f64>,
    at: std::time::Instant,
    /// Set by [`CpuSeconds::since`]: the time between the two readings.
    wall: Option<std::time::Duration>,
}

impl CpuSeconds {
    /// What every counted process has used so far.
    pub fn now() -> CpuSeconds {
        let at = std::time::Instant::now();
        let machine = machine_busy();
        let mut used = BTreeMap::new();
        if let Some((_, cpu)) = crate::process::proc_usage(std::process::id()) {
            used.insert("bench", cpu);
        }
        let Ok(dir) = fs::read_dir("/proc") else {
            return CpuSeconds {
                by: used,
                machine,
                at,
                wall: None,
            };
        };
        for entry in dir.flatten() {
            let Some(pid) = entry
                .file_name()
                .to_str()
                .and_then(|p| p.parse::<u32>().ok())
            else {
                continue;
            };
            let Ok(cmd) = fs::read(format!("/proc/{pid}/cmdline")) else {
                continue;
            };
            let cmd = String::from_utf8_lossy(&cmd);
            let Some((_, kind)) = KINDS.iter().find(|(word, _)| cmd.contains(word)) else {
                continue;
            };
            if let Some((_, cpu)) = crate::process::proc_usage(pid) {
                *used.entry(*kind).or_insert(0.0) += cpu;
            }
        }
        CpuSeconds {
            by: used,
            machine,
            at,
            wall: None,
        }
    }

    /// What was used since `before` (processes started meanwhile count from zero; those
    /// gone meanwhile are left out).
    /// The wall time is the one between the two.
    pub fn since(&self, before: &CpuSeconds) -> CpuSeconds {
        CpuSeconds {
            by: self
                .by
                .iter()
                .map(|(k, v)| (*k, (v - before.by.get(k).copied().unwrap_or(0.0)).max(0.0)))
                .filter(|(_, v)| *v >= 0.01)
                .collect(),
            machine: self.machine.zip(before.machine).map(|(a, b)| a - b),
            at: self.at,
            wall: Some(self.at - before.at),
        }
    }

    /// [`Self::describe`], with the total and the least time the machine's cores needed
    /// for it: when that is near the time taken, the cores were the limit.
    pub fn describe_on_cores(&self) -> String {
        let cores = cores();
        let machine = match (self.machine, self.wall) {
            (Some(busy), Some(wall)) => format!(
                "; the machine's cores busy {:.0} % of {:.1} s",
                100.0 * busy / (cores as f64 * wall.as_secs_f64()).max(f64::MIN_POSITIVE),
                wall.as_secs_f64()
            ),
            _ => String::new(),
        };
        format!(
            "{}; {:.1} s in all, {:.1} s on {cores} cores{machine}",
            self.describe(),
            self.total(),
            self.total() / cores as f64
        )
    }

    /// All of them together.
    pub fn total(&self) -> f64 {
        self.by.values().sum()
    }

    /// `opensearch 4.31 s, workers 2.34 s, …`, most first.
    pub fn describe(&self) -> String {
        let mut by: Vec<_> = self.by.iter().collect();
        by.sort_by(|a, b| b.1.total_cmp(a.1));
        by.iter()
            .map(|(k, v)| format!("{k} {v:.2} s"))
            .collect::<Vec<_>>()
            .join(", ")
    }
}

/// The seconds all cores of the machine have been busy since boot (`/proc/stat`: all
/// but idle and I/O wait), in clock ticks of 100 a second.
fn machine_busy() -> Option<f64> {
    let stat = fs::read_to_string("/proc/stat").ok()?;
    let cpu = stat.lines().next()?.strip_prefix("cpu ")?;
    let ticks: Vec<f64> = cpu
        .split_whitespace()
        .filter_map(|t| t.parse().ok())
        .collect();
    // user nice system idle iowait irq softirq steal (guest time is within user).
    let busy: f64 = ticks.iter().take(8).sum::<f64>() - ticks.get(3)? - ticks.get(4)?;
    Some(busy / 100.0)
}

/// The cores this machine has.
pub fn cores() -> usize {
    std::thread::available_parallelism().map_or(1, usize::from)
}
