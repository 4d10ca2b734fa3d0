//! Whether an application's write is applied: the decision a read that waits for it
//! makes each time the published positions change.

use sluice_model::SourcePoint;
use sluice_zk::layout::AppliedRecord;

/// Where a pipeline stands against a point an application named.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Standing {
    /// Every change up to the point is applied.
    Applied,
    /// Not yet: how far it is applied (none published yet), and how old that is.
    Behind {
        applied: Option<String>,
        lag_ms: Option<u64>,
    },
}

/// Whether `record` (what the etl published for a pipeline) shows `source` applied up to
/// `point`, at `now_ms`.
pub fn standing(
    record: Option<&AppliedRecord>,
    source: &str,
    point: &SourcePoint,
    now_ms: i64,
) -> Standing {
    let Some(at) = record.and_then(|r| r.sources.get(source)) else {
        return Standing::Behind {
            applied: None,
            lag_ms: None,
        };
    };
    if at.checkpoint.covers(point) {
        return Standing::Applied;
    }
    let cp = &at.checkpoint;
    let applied = match &cp.gtid {
        Some(g) => format!("{g} ({})", cp.position),
        None => match cp.server_id {
            Some(id) => format!("{id}@{}", cp.position),
            None => cp.position.to_string(),
        },
    };
    Standing::Behind {
        applied: Some(applied),
        lag_ms: u64::try_from(now_ms - at.read_at_ms).ok(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_model::Checkpoint;
    use sluice_zk::layout::AppliedPosition;

    #[test]
    fn a_point_is_applied_once_its_source_s_published_position_covers_it() {
        let record = AppliedRecord {
            sources: [(
                "shop".to_owned(),
                AppliedPosition {
                    checkpoint: Checkpoint {
                        position: "binlog.000002:900".parse().unwrap(),
                        gtid: Some("0-1-41".parse().unwrap()),
                        epoch: 0,
                        ts_ms: 0,
                        server_id: Some(1),
                    },
                    read_at_ms: 1_000,
                },
            )]
            .into(),
        };
        let point = |s: &str| s.parse::<SourcePoint>().unwrap();
        assert_eq!(
            standing(Some(&record), "shop", &point("0-1-41"), 1_250),
            Standing::Applied
        );
        assert_eq!(
            standing(Some(&record), "shop", &point("0-1-42"), 1_250),
            Standing::Behind {
                applied: Some("0-1-41 (binlog.000002:900)".into()),
                lag_ms: Some(250)
            }
        );
        // Another source's record says nothing of this one.
        assert_eq!(
            standing(Some(&record), "crm", &point("0-1-1"), 1_250),
            Standing::Behind {
                applied: None,
                lag_ms: None
            }
        );
        assert!(matches!(
            standing(None, "shop", &point("0-1-1"), 0),
            Standing::Behind { applied: None, .. }
        ));
    }
}
