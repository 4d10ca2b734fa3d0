//! What the chunked runs — checks, compares and delayed jobs — share: when a daily one
//! is due, the source their chunks are read from, and how a pipeline that does not fit
//! its tables fails one.

use crate::error::{CenterError, Context as _, Result};
use crate::meta::StoredPipeline;
use crate::Shared;

/// The connection settings of `p`'s source.
pub(crate) async fn source_of(
    shared: &Shared,
    p: &StoredPipeline,
) -> Result<sluice_mysql::SourceConfig> {
    let sources = shared.meta.sources().await?;
    let source = sources
        .iter()
        .find(|s| s.name == p.spec.source)
        .with_context(|| format!("source {} is gone", p.spec.source))?;
    sluice_mysql::SourceConfig::from_spec(source, &shared.cfg.source_access())
        .map_err(CenterError::definite)
}

/// Why a run cannot be planned: the pipeline's `problems` with its tables.
pub(crate) fn unfit(problems: &[String]) -> CenterError {
    CenterError::definite(format!(
        "the pipeline does not fit its tables: {}",
        problems.join("; ")
    ))
}

/// Whether a check scheduled daily at `minute` (after midnight UTC) is due at `now`,
/// the last scheduled one having started at `last` (all in ms since the epoch).
pub(crate) fn due(now: i64, minute: u32, last: Option<i64>) -> bool {
    const DAY: i64 = 86_400_000;
    let today = now - now.rem_euclid(DAY) + i64::from(minute) * 60_000;
    let slot = if today <= now { today } else { today - DAY };
    last.is_none_or(|l| l < slot)
}

#[cfg(test)]
mod tests {
    use super::*;

    const H: i64 = 3_600_000;

    #[test]
    fn a_daily_check_runs_once_per_day_at_or_after_its_time() {
        let day = 20_000 * 24 * H; // a midnight
        let three = 180; // 03:00
        assert!(due(day + 3 * H, three, None), "never ran: due at its time");
        assert!(
            !due(day + 3 * H, three, Some(day + 3 * H)),
            "ran at 03:00 today"
        );
        assert!(
            due(day + 5 * H, three, Some(day - 21 * H)),
            "last ran yesterday 03:00"
        );
        assert!(
            !due(day + 2 * H, three, Some(day - 21 * H)),
            "before today's 03:00"
        );
        assert!(
            due(day + 2 * H, three, Some(day - 30 * H)),
            "yesterday's slot was missed"
        );
    }
}
