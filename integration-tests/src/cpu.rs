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

/// CPU seconds used so far, by kind of process.
#[derive(Debug)]
pub struct CpuSeconds(BTreeMap<&'static str, f64>);

impl CpuSeconds {
    /// What every counted process has used so far.
    pub fn now() -> CpuSeconds {
        let mut used = BTreeMap::new();
        let Ok(dir) = fs::read_dir("/proc") else {
            return CpuSeconds(used);
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
        CpuSeconds(used)
    }

    /// What was used since `before` (processes started meanwhile count from zero; those
    /// gone meanwhile are left out).
    pub fn since(&self, before: &CpuSeconds) -> CpuSeconds {
        CpuSeconds(
            self.0
                .iter()
                .map(|(k, v)| (*k, (v - before.0.get(k).copied().unwrap_or(0.0)).max(0.0)))
                .filter(|(_, v)| *v >= 0.01)
                .collect(),
        )
    }

    /// [`Self::describe`], with the total and the least time the machine's cores needed
    /// for it: when that is near the time taken, the cores were the limit.
    pub fn describe_on_cores(&self) -> String {
        let cores = cores();
        format!(
            "{}; {:.1} s in all, {:.1} s on {cores} cores",
            self.describe(),
            self.total(),
            self.total() / cores as f64
        )
    }

    /// All of them together.
    pub fn total(&self) -> f64 {
        self.0.values().sum()
    }

    /// `opensearch 4.31 s, workers 2.34 s, …`, most first.
    pub fn describe(&self) -> String {
        let mut by: Vec<_> = self.0.iter().collect();
        by.sort_by(|a, b| b.1.total_cmp(a.1));
        by.iter()
            .map(|(k, v)| format!("{k} {v:.2} s"))
            .collect::<Vec<_>>()
            .join(", ")
    }
}

/// The cores this machine has.
pub fn cores() -> usize {
    std::thread::available_parallelism().map_or(1, usize::from)
}
