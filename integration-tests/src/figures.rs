//! A benchmark's figures, each next to the ceiling it was measured against in the same
//! run: written as JSON under `target/bench/`, and compared with the committed baseline
//! (`integration-tests/bench-baseline.json`), so that a ratio falling by more than 20 %
//! is reported loudly. Not a failing test: these machines are noisy.

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

/// How far a ratio may fall below its baseline before it is reported.
pub const TOLERANCE: f64 = 0.20;

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Figure {
    pub value: f64,
    pub unit: String,
    /// What `value` is judged against, measured in the same run (a raw client's rate, a
    /// target), when there is one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ceiling: Option<f64>,
    /// `value / ceiling`, or for figures where lower is better `ceiling / value`: above 1
    /// is better than the ceiling either way.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ratio: Option<f64>,
}

impl Figure {
    /// A rate or any figure where more is better.
    pub fn higher(value: f64, unit: &str, ceiling: Option<f64>) -> Figure {
        Figure {
            value,
            unit: unit.to_owned(),
            ceiling,
            ratio: ceiling.map(|c| value / c),
        }
    }

    /// A latency, a size: less is better; `ceiling` is the most it may be.
    pub fn lower(value: f64, unit: &str, ceiling: Option<f64>) -> Figure {
        Figure {
            value,
            unit: unit.to_owned(),
            ceiling,
            ratio: ceiling.map(|c| c / value),
        }
    }
}

/// One benchmark's figures, by name.
pub type Figures = BTreeMap<String, Figure>;

/// Writes `target/bench/<bench>.json` and returns its path.
pub fn write(bench: &str, figures: &Figures) -> std::io::Result<PathBuf> {
    let dir = crate::paths::target_dir().join("bench");
    std::fs::create_dir_all(&dir)?;
    let path = dir.join(format!("{bench}.json"));
    std::fs::write(&path, serde_json::to_vec_pretty(figures)?)?;
    Ok(path)
}

/// Prints each figure with its ceiling and ratio, writes them under `target/bench/`, and
/// says loudly which ratios fell against the committed baseline. Figures are the
/// source's: `bench` is named after the lane (`bench-mysql`).
pub fn report(bench: &str, figures: &Figures) {
    let bench = &format!("{bench}-{}", crate::lane::Lane::current().name());
    println!();
    println!("{bench}, on {:?}", crate::lane::Lane::current());
    println!(
        "{:<30} {:>12} {:>12} {:>8}",
        "figure", "value", "ceiling", "ratio"
    );
    for (name, f) in figures {
        println!(
            "{name:<30} {:>12.1} {:>12} {:>8}  {}",
            f.value,
            f.ceiling.map_or("-".into(), |c| format!("{c:.1}")),
            f.ratio.map_or("-".into(), |r| format!("{r:.2}")),
            f.unit
        );
    }
    match write(bench, figures) {
        Ok(path) => println!("figures: {}", path.display()),
        Err(e) => eprintln!("{bench}: cannot write the figures: {e}"),
    }
    match regressions(bench, figures) {
        Ok(found) if found.is_empty() => {
            println!("no ratio fell more than 20 % against the baseline")
        }
        Ok(found) => {
            for line in found {
                println!("!!! {line}");
            }
        }
        Err(why) => println!("baseline: {why}"),
    }
}

/// The committed baseline: benchmark → figures.
pub fn baseline_path() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("bench-baseline.json")
}

/// Each figure whose ratio fell by more than [`TOLERANCE`] below the baseline's, as a
/// line to print; `Err` when there is no baseline to compare with, saying how to set one.
pub fn regressions(bench: &str, figures: &Figures) -> Result<Vec<String>, String> {
    let path = baseline_path();
    let text = std::fs::read_to_string(&path).map_err(|_| {
        format!(
            "no baseline at {}: to set one, copy this run's target/bench/*.json into it as {{\"<bench>\": <figures>}}",
            path.display()
        )
    })?;
    let all: BTreeMap<String, Figures> =
        serde_json::from_str(&text).map_err(|e| format!("{}: {e}", path.display()))?;
    let Some(base) = all.get(bench) else {
        return Err(format!("{} has no figures for {bench}", path.display()));
    };
    Ok(compare(base, figures))
}

fn compare(base: &Figures, now: &Figures) -> Vec<String> {
    let mut out = Vec::new();
    for (name, was) in base {
        let (Some(before), Some(after)) = (was.ratio, now.get(name).and_then(|f| f.ratio)) else {
            continue;
        };
        if after < before * (1.0 - TOLERANCE) {
            out.push(format!(
                "REGRESSION {name}: ratio {after:.2} against the baseline's {before:.2} ({:+.0} %)",
                100.0 * (after / before - 1.0)
            ));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_ratio_fallen_past_the_tolerance_is_reported_either_way_round() {
        let base = Figures::from([
            ("etl".into(), Figure::higher(900.0, "docs/s", Some(1000.0))),
            ("latency".into(), Figure::lower(50.0, "ms", Some(100.0))),
            ("rss".into(), Figure::lower(40.0, "MiB", None)),
        ]);
        let steady = Figures::from([
            ("etl".into(), Figure::higher(760.0, "docs/s", Some(1000.0))),
            ("latency".into(), Figure::lower(60.0, "ms", Some(100.0))),
        ]);
        assert!(compare(&base, &steady).is_empty(), "within 20 %");
        let worse = Figures::from([
            ("etl".into(), Figure::higher(700.0, "docs/s", Some(1000.0))),
            ("latency".into(), Figure::lower(70.0, "ms", Some(100.0))),
        ]);
        let found = compare(&base, &worse);
        assert_eq!(found.len(), 2, "{found:?}");
        assert!(
            found[0].starts_with("REGRESSION etl: ratio 0.70"),
            "{found:?}"
        );
        assert!(
            found[1].starts_with("REGRESSION latency: ratio 1.43"),
            "{found:?}"
        );
    }
}
