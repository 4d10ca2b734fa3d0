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

    /// The rate `items` done over this interval would reach had every core been busy
    /// with the same work: `items` × cores ÷ the machine's busy seconds. At this CPU per
    /// item the machine can do no better, however the waiting is tuned.
    pub fn on_full_cores(&self, items: f64) -> Option<f64> {
        let busy = self.machine.filter(|b| *b > 0.0)?;
        Some(items * cores() as f64 / busy)
    }

    /// What keeps `rate` (`items` done over this interval, in `unit`) from `target`: the
    /// cores, when even [`Self::on_full_cores`] falls short of it, or else the waiting.
    /// The rate on full cores, and a line saying so.
    pub fn bound(&self, items: f64, rate: f64, target: f64, unit: &str) -> Option<(f64, String)> {
        let full = self.on_full_cores(items)?;
        let busy = self.machine?;
        let per_item = 1000.0 * busy / items.max(1.0);
        let verdict = if rate >= target {
            "met".to_owned()
        } else if full < target {
            let most =
                self.by
                    .iter()
                    .max_by(|a, b| a.1.total_cmp(b.1))
                    .map_or(String::new(), |(k, v)| {
                        format!(
                            ", {:.0} % of the counted CPU in {k}",
                            100.0 * v / self.total().max(f64::MIN_POSITIVE)
                        )
                    });
            format!(
                "the cores bound it: the CPU per item must fall {:.1}× to meet it{most}",
                target / full
            )
        } else {
            "waiting bounds it, not the cores: with them kept busy it would meet it".to_owned()
        };
        let line = format!(
            "{rate:.0} {unit} at {per_item:.3} ms of the machine's CPU each; with every core busy at most {full:.0} {unit} = {:.2} of the target {target:.0}: {verdict}",
            full / target
        );
        Some((full, line))
    }

    /// The search server's CPU per item, of `items` done over this interval (OpenSearch's
    /// or Elasticsearch's, whichever worked more): `0.352 ms`.
    pub fn sink_per_item(&self, items: f64) -> String {
        let used = ["opensearch", "elasticsearch"]
            .iter()
            .map(|k| self.by.get(k).copied().unwrap_or(0.0))
            .fold(0.0, f64::max);
        format!("{:.3} ms", 1000.0 * used / items.max(1.0))
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
    // user nice system idle iowait irq softirq steal (guest time is within user): steal is
    // another guest's, not this machine's work.
    let busy: f64 = ticks.iter().take(7).sum::<f64>() - ticks.get(3)? - ticks.get(4)?;
    Some(busy / 100.0)
}

/// The cores this machine has.
pub fn cores() -> usize {
    std::thread::available_parallelism().map_or(1, usize::from)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn over(machine_busy: f64, by: &[(&'static str, f64)]) -> CpuSeconds {
        CpuSeconds {
            by: by.iter().copied().collect(),
            machine: Some(machine_busy),
            at: std::time::Instant::now(),
            wall: Some(std::time::Duration::from_secs(10)),
        }
    }

    #[test]
    fn the_cores_bound_a_rate_whose_cpu_per_item_cannot_reach_the_target() {
        let cores = cores() as f64;
        // 1,000 items took 2 busy seconds: on full cores, 500 × cores a second.
        let cpu = over(2.0, &[("etl", 0.5), ("opensearch", 1.5)]);
        let (full, line) = cpu.bound(1000.0, 100.0, 1000.0 * cores, "docs/s").unwrap();
        assert!((full - 500.0 * cores).abs() < 1e-6, "{full}");
        assert!(line.contains("the cores bound it"), "{line}");
        assert!(line.contains("fall 2.0×"), "{line}");
        assert!(
            line.contains("75 % of the counted CPU in opensearch"),
            "{line}"
        );
        let (_, line) = cpu.bound(1000.0, 100.0, 400.0 * cores, "docs/s").unwrap();
        assert!(line.contains("waiting bounds it"), "{line}");
        let (_, line) = cpu
            .bound(1000.0, 500.0 * cores, 400.0 * cores, "docs/s")
            .unwrap();
        assert!(line.ends_with("met"), "{line}");
    }
}
