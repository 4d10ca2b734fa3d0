//! Which etl member consumes which partition. Every member computes the same answer from
//! the same list of live members (ZooKeeper's `etls/`), so the etl needs no Kafka
//! consumer-group rebalance: adding a pipeline assigns its new partitions while every
//! other partition goes on, and a member coming or going moves only the partitions it
//! gains or held.
//!
//! Rendezvous hashing: a partition belongs to the member whose hash of (member, topic,
//! partition) is highest. The hash is this module's own (FNV-1a, then a finalizer), never
//! the standard library's, whose output may differ between builds: two versions of the
//! etl side by side must agree on every owner.

/// True when `me` consumes `partition` of `topic` among `members` (which should hold
/// `me`; an empty list means `me` alone).
pub fn owns(members: &[String], me: &str, topic: &str, partition: i32) -> bool {
    let owner = members
        .iter()
        .map(String::as_str)
        .max_by_key(|m| (weight(m, topic, partition), *m));
    owner.is_none_or(|owner| owner == me)
}

fn weight(member: &str, topic: &str, partition: i32) -> u64 {
    const PRIME: u64 = 0x0000_0100_0000_01b3;
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    let parts = [
        member.as_bytes(),
        &[0],
        topic.as_bytes(),
        &[0],
        &partition.to_le_bytes(),
    ];
    for byte in parts.into_iter().flatten() {
        h ^= u64::from(*byte);
        h = h.wrapping_mul(PRIME);
    }
    // FNV alone mixes the last bytes poorly; this finalizer (splitmix64's) spreads them.
    h ^= h >> 30;
    h = h.wrapping_mul(0xbf58_476d_1ce4_e5b9);
    h ^= h >> 27;
    h = h.wrapping_mul(0x94d0_49bb_1331_11eb);
    h ^ (h >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn members(n: usize) -> Vec<String> {
        (0..n).map(|i| format!("etl-{i}")).collect()
    }

    fn partitions() -> Vec<(String, i32)> {
        (0..40)
            .flat_map(|t| (0..3).map(move |p| (format!("sluice.m1.shop.t{t}"), p)))
            .collect()
    }

    fn owners(members: &[String]) -> Vec<String> {
        partitions()
            .iter()
            .map(|(t, p)| {
                let mine: Vec<&String> =
                    members.iter().filter(|m| owns(members, m, t, *p)).collect();
                assert_eq!(mine.len(), 1, "{t}/{p} has owners {mine:?}");
                mine[0].clone()
            })
            .collect()
    }

    #[test]
    fn every_partition_has_exactly_one_owner_and_the_load_is_spread() {
        let m = members(3);
        let owners = owners(&m);
        for member in &m {
            let held = owners.iter().filter(|o| *o == member).count();
            assert!((20..=60).contains(&held), "{member} holds {held} of 120");
        }
    }

    #[test]
    fn a_member_joining_takes_partitions_only_for_itself_and_leaving_gives_back_only_its_own() {
        let before = owners(&members(3));
        let after = owners(&members(4));
        let mut moved = 0;
        for (b, a) in before.iter().zip(&after) {
            if b != a {
                assert_eq!(a, "etl-3", "a partition moved between members that stayed");
                moved += 1;
            }
        }
        assert!(moved > 0, "the new member got nothing");
        // etl-3 leaving again restores the earlier owners exactly.
        assert_eq!(owners(&members(3)), before);
    }

    #[test]
    fn alone_or_before_the_members_are_known_a_member_owns_everything() {
        assert!(owns(&[], "etl-0", "t", 0));
        assert!(owns(&members(1), "etl-0", "t", 2));
    }
}
