//! A compare's second verdict: the held version's documents next to the live version's,
//! key by key (`pipelines compare`). Both versions take every live change, so once the
//! etl applied everything up to one position, what still differs between them is what
//! the rebuild changes (a new field, a relation, a filter) or drift in one of them.
//!
//! Round one scans the live index over the chunk's key range, as the survey scanned the
//! held one; keys whose copies differ are suspects. Round two waits until every change
//! up to a position `P` taken after the scans is applied (the watermark a check's
//! confirm waits for) and reads both copies of each suspect again, in real time. A copy
//! written at a version above `P`'s was changed by the stream in between (the other copy
//! may not have that change yet): skipped. What else differs is reported.

use std::collections::BTreeMap;

use serde_json::{Map, Value as Json};
use sluice_elastic::{versioned_index, Hit};
use sluice_mysql::docs::Reader;
use sluice_mysql::Key;
use sluice_zk::layout::LiveTally;

use super::{copies, differing_fields, settle, version_at, Checks, Ctx, Pair, BATCH};
use crate::error::Result;

/// What one key's two copies make.
#[derive(Debug, PartialEq, Eq)]
enum Side {
    Same,
    OnlyNew,
    OnlyLive,
    Different(String),
}

fn side(held: Option<&Hit>, live: Option<&Hit>) -> Option<Side> {
    fn source(h: Option<&Hit>) -> Option<&Map<String, Json>> {
        h.and_then(|h| h.source.as_object())
    }
    Some(match (source(held), source(live)) {
        (None, None) => return None,
        (Some(_), None) => Side::OnlyNew,
        (None, Some(_)) => Side::OnlyLive,
        (Some(a), Some(b)) if a == b => Side::Same,
        (Some(a), Some(b)) => Side::Different(differing_fields(a, b)),
    })
}

/// Compares the held version's copies (`pairs`, from the survey) with the live version
/// `against` over the chunk's range.
pub(super) async fn compare(
    c: &Checks,
    ctx: &Ctx<'_>,
    against: u32,
    pairs: &BTreeMap<String, Pair>,
    lower: Option<&Key>,
    upper: Option<&Key>,
) -> Result<LiveTally> {
    let live_index = versioned_index(&ctx.rec.spec.alias(), against);
    let live = copies(c, ctx, &live_index, pairs, lower, upper).await?;
    let mut tally = LiveTally {
        version: against,
        ..LiveTally::default()
    };
    let mut suspects: Vec<(String, Option<String>)> = Vec::new();
    let ids = pairs
        .iter()
        .filter(|(_, p)| p.index.is_some())
        .map(|(id, _)| id)
        .chain(live.keys());
    let mut seen = std::collections::BTreeSet::new();
    for id in ids {
        if !seen.insert(id) {
            continue;
        }
        let held = pairs.get(id).and_then(|p| p.index.as_ref());
        match side(held, live.get(id)) {
            Some(Side::Same) => tally.same += 1,
            Some(_) => {
                let routing = held.or(live.get(id)).and_then(|h| h.routing.clone());
                suspects.push((id.clone(), routing));
            }
            None => {}
        }
    }
    if suspects.is_empty() {
        return Ok(tally);
    }
    // Everything up to now applied to both, then both copies again, in real time.
    let mut reader = Reader::connect(ctx.src).await?;
    // Nothing the snapshot sees was logged after its high watermark.
    let position = reader.begin_snapshot().await?.high;
    reader.end().await?;
    reader.close().await;
    settle(c, ctx, &position).await?;
    let watermark = version_at(ctx.epoch, &position)?;
    for part in suspects.chunks(BATCH) {
        let held = c.es.mget_hits(&ctx.index, part).await?;
        let live = c.es.mget_hits(&live_index, part).await?;
        for (((id, _), h), l) in part.iter().zip(held).zip(live) {
            if [&h, &l]
                .iter()
                .any(|c| c.as_ref().is_some_and(|c| c.version > watermark))
            {
                tally.skipped += 1;
                continue;
            }
            match side(h.as_ref(), l.as_ref()) {
                Some(Side::Same) => tally.same += 1,
                Some(Side::OnlyNew) => tally.found("only new", id, ""),
                Some(Side::OnlyLive) => tally.found("only live", id, ""),
                Some(Side::Different(d)) => tally.found("different", id, &d),
                None => {}
            }
        }
    }
    Ok(tally)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn hit(source: Json) -> Hit {
        Hit {
            source,
            ..Hit::default()
        }
    }

    #[test]
    fn copies_are_judged_by_their_sources_only() {
        let a = hit(json!({"id": 1, "t": "x"}));
        let mut same = hit(json!({"id": 1, "t": "x"}));
        same.version = 99; // written at another version: still the same document
        assert_eq!(side(Some(&a), Some(&same)), Some(Side::Same));
        assert_eq!(side(Some(&a), None), Some(Side::OnlyNew));
        assert_eq!(side(None, Some(&a)), Some(Side::OnlyLive));
        assert_eq!(side(None, None), None);
        assert_eq!(
            side(Some(&a), Some(&hit(json!({"id": 1, "t": "y"})))),
            Some(Side::Different("fields differ: t".into()))
        );
    }
}
