//! Binlog coordinates: file/position pairs, MySQL and MariaDB GTID sets, and the
//! checkpoint a worker confirms in ZooKeeper.

use std::cmp::Ordering;
use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum PositionError {
    #[error("binlog position `{0}` is not of the form FILE:POS (e.g. mysql-bin.000012:4)")]
    Position(String),
    #[error("binlog file name `{0}` does not end in a sequence number")]
    FileName(String),
    #[error("GTID set `{0}` is neither MariaDB (domain-server-seq,...) nor MySQL (uuid:1-5,...)")]
    Gtid(String),
}

/// A byte offset in a named binlog file. Ordered by the file's sequence number, then offset.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct BinlogPosition {
    pub file: String,
    pub pos: u64,
}

impl BinlogPosition {
    pub fn new(file: impl Into<String>, pos: u64) -> Self {
        Self {
            file: file.into(),
            pos,
        }
    }

    /// The numeric suffix of the file name (`mysql-bin.000012` → 12).
    pub fn file_seq(&self) -> Result<u64, PositionError> {
        file_seq(&self.file)
    }
}

/// The numeric suffix of a binlog file name (`mysql-bin.000012` → 12).
pub fn file_seq(file: &str) -> Result<u64, PositionError> {
    let digits = file.rsplit('.').next().unwrap_or("");
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return Err(PositionError::FileName(file.to_owned()));
    }
    digits
        .parse()
        .map_err(|_| PositionError::FileName(file.to_owned()))
}

impl PartialOrd for BinlogPosition {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for BinlogPosition {
    fn cmp(&self, other: &Self) -> Ordering {
        let a = self.file_seq().ok();
        let b = other.file_seq().ok();
        a.cmp(&b)
            .then_with(|| self.file.cmp(&other.file))
            .then(self.pos.cmp(&other.pos))
    }
}

impl fmt::Display for BinlogPosition {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.file, self.pos)
    }
}

impl FromStr for BinlogPosition {
    type Err = PositionError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let (file, pos) = s
            .rsplit_once(':')
            .ok_or_else(|| PositionError::Position(s.to_owned()))?;
        let pos = pos
            .parse()
            .map_err(|_| PositionError::Position(s.to_owned()))?;
        if file.is_empty() {
            return Err(PositionError::Position(s.to_owned()));
        }
        Ok(Self::new(file, pos))
    }
}

/// The set of transactions a server has applied, in its own flavour.
///
/// MariaDB keeps one `domain-server-seq` per replication domain (the last applied
/// transaction of that domain); MySQL keeps, per source UUID, intervals of transaction
/// numbers. Neither is totally ordered across servers, which is why document versions are
/// not derived from GTIDs (see [`crate::version`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GtidSet {
    MariaDb(BTreeMap<u32, MariaDbGtid>),
    MySql(BTreeMap<String, Vec<(u64, u64)>>),
}

/// One MariaDB GTID, `domain-server-seq`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct MariaDbGtid {
    pub domain: u32,
    pub server: u32,
    pub seq: u64,
}

impl GtidSet {
    pub fn empty_mariadb() -> Self {
        GtidSet::MariaDb(BTreeMap::new())
    }

    pub fn empty_mysql() -> Self {
        GtidSet::MySql(BTreeMap::new())
    }

    pub fn is_empty(&self) -> bool {
        match self {
            GtidSet::MariaDb(m) => m.is_empty(),
            GtidSet::MySql(m) => m.is_empty(),
        }
    }

    /// Records a committed MariaDB transaction: it becomes its domain's position.
    pub fn apply_mariadb(&mut self, gtid: MariaDbGtid) {
        match self {
            GtidSet::MariaDb(m) => {
                m.insert(gtid.domain, gtid);
            }
            GtidSet::MySql(_) => *self = GtidSet::MariaDb(BTreeMap::from([(gtid.domain, gtid)])),
        }
    }

    /// Records a committed MySQL transaction `uuid:gno`, merging adjacent intervals.
    pub fn apply_mysql(&mut self, uuid: &str, gno: u64) {
        if let GtidSet::MariaDb(_) = self {
            *self = GtidSet::empty_mysql();
        }
        let GtidSet::MySql(m) = self else {
            unreachable!("converted above")
        };
        let intervals = m.entry(uuid.to_ascii_lowercase()).or_default();
        insert_interval(intervals, gno, gno);
    }
}

impl GtidSet {
    /// Adds every transaction of `other` (MySQL sets; a MariaDB `other` takes each of its
    /// domains' positions where newer).
    pub fn union(&mut self, other: &GtidSet) {
        match other {
            GtidSet::MySql(m) => {
                for (uuid, ivs) in m {
                    for &(a, b) in ivs {
                        self.apply_mysql_range(uuid, a, b);
                    }
                }
            }
            GtidSet::MariaDb(m) => {
                for g in m.values() {
                    let newer = match self {
                        GtidSet::MariaDb(mine) => mine.get(&g.domain).is_none_or(|h| h.seq < g.seq),
                        GtidSet::MySql(_) => true,
                    };
                    if newer {
                        self.apply_mariadb(*g);
                    }
                }
            }
        }
    }

    /// Records the MySQL transactions `uuid:a-b`.
    fn apply_mysql_range(&mut self, uuid: &str, a: u64, b: u64) {
        if let GtidSet::MariaDb(_) = self {
            *self = GtidSet::empty_mysql();
        }
        if let GtidSet::MySql(m) = self {
            insert_interval(m.entry(uuid.to_ascii_lowercase()).or_default(), a, b);
        }
    }

    /// The MySQL transactions of `self` that `other` lacks; empty when `self` is a
    /// MariaDB set (whose per-domain positions do not name single transactions) or
    /// empty.
    pub fn missing_from(&self, other: &GtidSet) -> GtidSet {
        let mut out = GtidSet::empty_mysql();
        let GtidSet::MySql(mine) = self else {
            return out;
        };
        let empty = BTreeMap::new();
        let theirs = match other {
            GtidSet::MySql(m) => m,
            GtidSet::MariaDb(_) => &empty,
        };
        for (uuid, ivs) in mine {
            let have = theirs.get(uuid).map(Vec::as_slice).unwrap_or_default();
            for &(a, b) in ivs {
                let mut from = a;
                for &(c, d) in have {
                    if d < from || c > b {
                        continue;
                    }
                    if c > from {
                        out.apply_mysql_range(uuid, from, c - 1);
                    }
                    from = d.saturating_add(1);
                    if from > b {
                        break;
                    }
                }
                if from <= b {
                    out.apply_mysql_range(uuid, from, b);
                }
            }
        }
        out
    }
}

impl GtidSet {
    /// Whether every transaction `other` names is in `self`: each of its MySQL intervals,
    /// or each of its MariaDB domains at `other`'s sequence number or past it. Sets of
    /// different flavours never hold each other's transactions.
    pub fn contains(&self, other: &GtidSet) -> bool {
        match (self, other) {
            (GtidSet::MySql(_), GtidSet::MySql(_)) => other.missing_from(self).is_empty(),
            (GtidSet::MariaDb(mine), GtidSet::MariaDb(theirs)) => theirs
                .values()
                .all(|g| mine.get(&g.domain).is_some_and(|h| h.seq >= g.seq)),
            _ => other.is_empty(),
        }
    }
}

/// A point of a source's history that an application names after its commit, to read
/// its own write: its transaction's GTID (MySQL's `uuid:N`, MariaDB's `@@last_gtid`), a
/// server's whole GTID set, or, on a server without GTIDs, `SERVER_ID@FILE:POS`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SourcePoint {
    Gtids(GtidSet),
    Binlog {
        server_id: u32,
        position: BinlogPosition,
    },
}

impl FromStr for SourcePoint {
    type Err = PositionError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if let Some((server, position)) = s.split_once('@') {
            let server_id = server
                .parse()
                .map_err(|_| PositionError::Position(s.to_owned()))?;
            return Ok(SourcePoint::Binlog {
                server_id,
                position: position.parse()?,
            });
        }
        let gtids: GtidSet = s.parse()?;
        if gtids.is_empty() {
            return Err(PositionError::Gtid(s.to_owned()));
        }
        Ok(SourcePoint::Gtids(gtids))
    }
}

impl fmt::Display for SourcePoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SourcePoint::Gtids(g) => write!(f, "{g}"),
            SourcePoint::Binlog {
                server_id,
                position,
            } => write!(f, "{server_id}@{position}"),
        }
    }
}

/// Adds the closed range `a..=b` to sorted, disjoint, non-adjacent closed intervals.
fn insert_interval(intervals: &mut Vec<(u64, u64)>, a: u64, b: u64) {
    intervals.push((a, b));
    intervals.sort_unstable();
    let mut merged: Vec<(u64, u64)> = Vec::with_capacity(intervals.len());
    for &(s, e) in intervals.iter() {
        match merged.last_mut() {
            Some(last) if s <= last.1.saturating_add(1) => last.1 = last.1.max(e),
            _ => merged.push((s, e)),
        }
    }
    *intervals = merged;
}

impl fmt::Display for GtidSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            GtidSet::MariaDb(m) => {
                let mut first = true;
                for g in m.values() {
                    if !first {
                        f.write_str(",")?;
                    }
                    first = false;
                    write!(f, "{}-{}-{}", g.domain, g.server, g.seq)?;
                }
                Ok(())
            }
            GtidSet::MySql(m) => {
                let mut first = true;
                for (uuid, ivs) in m {
                    if !first {
                        f.write_str(",")?;
                    }
                    first = false;
                    f.write_str(uuid)?;
                    for (a, b) in ivs {
                        if a == b {
                            write!(f, ":{a}")?;
                        } else {
                            write!(f, ":{a}-{b}")?;
                        }
                    }
                }
                Ok(())
            }
        }
    }
}

impl FromStr for GtidSet {
    type Err = PositionError;

    /// Parses either flavour. The empty string is an empty MariaDB set (MariaDB's
    /// `gtid_binlog_pos` is empty on a fresh server). Whitespace and newlines (MySQL prints
    /// `gtid_executed` with them) are ignored.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let s: String = s.chars().filter(|c| !c.is_whitespace()).collect();
        let err = || PositionError::Gtid(s.clone());
        if s.is_empty() {
            return Ok(GtidSet::empty_mariadb());
        }
        if s.contains(':') {
            let mut set = GtidSet::empty_mysql();
            let GtidSet::MySql(m) = &mut set else {
                unreachable!()
            };
            for part in s.split(',') {
                let mut fields = part.split(':');
                let uuid = fields.next().filter(|u| u.len() == 36).ok_or_else(err)?;
                let ivs = m.entry(uuid.to_ascii_lowercase()).or_default();
                for iv in fields {
                    let (a, b) = match iv.split_once('-') {
                        Some((a, b)) => {
                            (a.parse().map_err(|_| err())?, b.parse().map_err(|_| err())?)
                        }
                        None => {
                            let a = iv.parse().map_err(|_| err())?;
                            (a, a)
                        }
                    };
                    if a > b || a == 0 {
                        return Err(err());
                    }
                    insert_interval(ivs, a, b);
                }
            }
            return Ok(set);
        }
        let mut m = BTreeMap::new();
        for part in s.split(',') {
            let mut fields = part.splitn(3, '-');
            let (Some(d), Some(sv), Some(q)) = (fields.next(), fields.next(), fields.next()) else {
                return Err(err());
            };
            let g = MariaDbGtid {
                domain: d.parse().map_err(|_| err())?,
                server: sv.parse().map_err(|_| err())?,
                seq: q.parse().map_err(|_| err())?,
            };
            m.insert(g.domain, g);
        }
        Ok(GtidSet::MariaDb(m))
    }
}

impl Serialize for GtidSet {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for GtidSet {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

/// What a worker confirms in ZooKeeper: where a restarted task resumes.
///
/// `position` is the end of the last transaction whose every event Kafka acknowledged;
/// `gtid`, when the server has GTIDs, is the set including that transaction. `epoch` is
/// the version epoch (see [`crate::version`]): it is carried forward unchanged by the
/// worker, which takes a newer one from the source's [`crate::Coordinates`] when the
/// center bumped them (primary failover, re-snapshot).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Checkpoint {
    pub position: BinlogPosition,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gtid: Option<GtidSet>,
    #[serde(default)]
    pub epoch: u16,
    /// Commit timestamp (ms since the epoch) of the last confirmed transaction; 0 if none yet.
    #[serde(default)]
    pub ts_ms: u64,
    /// The `server_id` of the server whose binlog `position` is in: coordinates of another
    /// server are not comparable with these.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub server_id: Option<u32>,
}

impl Checkpoint {
    /// Whether every transaction up to `point` is at or before this checkpoint: its GTIDs
    /// are in the checkpoint's set, or its binlog position (of the same server) is not
    /// past the checkpoint's.
    pub fn covers(&self, point: &SourcePoint) -> bool {
        match point {
            SourcePoint::Gtids(g) => self.gtid.as_ref().is_some_and(|mine| mine.contains(g)),
            SourcePoint::Binlog {
                server_id,
                position,
            } => self.server_id == Some(*server_id) && *position <= self.position,
        }
    }

    pub fn to_json(&self) -> Vec<u8> {
        serde_json::to_vec(self).expect("checkpoint serializes")
    }

    pub fn from_json(bytes: &[u8]) -> Result<Self, serde_json::Error> {
        serde_json::from_slice(bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn a_checkpoint_covers_the_transactions_its_gtids_or_position_reach() {
        let cp = |gtid: Option<&str>, at: &str| Checkpoint {
            position: at.parse().unwrap(),
            gtid: gtid.map(|g| g.parse().unwrap()),
            epoch: 0,
            ts_ms: 0,
            server_id: Some(7),
        };
        let point = |s: &str| s.parse::<SourcePoint>().unwrap();
        let uuid = "3e11fa47-71ca-11e1-9e33-c80aa9429562";
        let mysql = cp(Some(&format!("{uuid}:1-20:22")), "binlog.000002:900");
        assert!(mysql.covers(&point(&format!("{uuid}:20"))));
        assert!(mysql.covers(&point(&format!("{}:1-5", uuid.to_uppercase()))));
        assert!(!mysql.covers(&point(&format!("{uuid}:21"))));
        assert!(!mysql.covers(&point(&format!("{uuid}:23"))));
        let other = "4e11fa47-71ca-11e1-9e33-c80aa9429562";
        assert!(!mysql.covers(&point(&format!("{other}:1"))));
        let maria = cp(Some("0-1-120,1-1-7"), "mariadb-bin.000003:4000");
        assert!(maria.covers(&point("0-1-120")));
        assert!(maria.covers(&point("0-2-100,1-1-7")));
        assert!(!maria.covers(&point("0-1-121")));
        assert!(!maria.covers(&point("2-1-1")));
        assert!(!maria.covers(&point(&format!("{uuid}:1"))));
        // Without GTIDs: a position of the same server only.
        let plain = cp(None, "mysql-bin.000010:500");
        assert!(plain.covers(&point("7@mysql-bin.000010:500")));
        assert!(plain.covers(&point("7@mysql-bin.000009:90000")));
        assert!(!plain.covers(&point("7@mysql-bin.000010:501")));
        assert!(!plain.covers(&point("8@mysql-bin.000001:4")));
        assert!(!plain.covers(&point("0-1-1")));
        assert_eq!(
            point("7@mysql-bin.000010:500").to_string(),
            "7@mysql-bin.000010:500"
        );
        assert!("".parse::<SourcePoint>().is_err());
        assert!("x@mysql-bin.000010:500".parse::<SourcePoint>().is_err());
    }

    #[test]
    fn position_orders_by_file_number_then_offset() {
        let a: BinlogPosition = "mysql-bin.000009:900".parse().unwrap();
        let b: BinlogPosition = "mysql-bin.000010:4".parse().unwrap();
        let c: BinlogPosition = "mysql-bin.000010:120".parse().unwrap();
        assert!(a < b && b < c);
        assert_eq!(c.file_seq().unwrap(), 10);
        assert_eq!(c.to_string(), "mysql-bin.000010:120");
    }

    #[test]
    fn bad_positions_are_rejected() {
        assert!("nocolon".parse::<BinlogPosition>().is_err());
        assert!("f.1:x".parse::<BinlogPosition>().is_err());
        assert!(BinlogPosition::new("binlog", 4).file_seq().is_err());
    }

    #[test]
    fn mariadb_gtid_round_trip_and_apply() {
        let mut g: GtidSet = "0-1-100,1-2-7".parse().unwrap();
        assert_eq!(g.to_string(), "0-1-100,1-2-7");
        g.apply_mariadb(MariaDbGtid {
            domain: 0,
            server: 1,
            seq: 101,
        });
        assert_eq!(g.to_string(), "0-1-101,1-2-7");
        assert_eq!("".parse::<GtidSet>().unwrap(), GtidSet::empty_mariadb());
    }

    #[test]
    fn mysql_gtid_intervals_merge() {
        let uuid = "3e11fa47-71ca-11e1-9e33-c80aa9429562";
        let mut g: GtidSet = format!("{uuid}:1-5:7-9").parse().unwrap();
        g.apply_mysql(uuid, 6);
        assert_eq!(g.to_string(), format!("{uuid}:1-9"));
        g.apply_mysql(uuid, 11);
        assert_eq!(g.to_string(), format!("{uuid}:1-9:11"));
        let printed = format!("{uuid}:1-9:11,\n4e11fa47-71ca-11e1-9e33-c80aa9429562:1-2");
        let parsed: GtidSet = printed.parse().unwrap();
        assert_eq!(parsed.to_string(), printed.replace('\n', ""));
    }

    #[test]
    fn mysql_sets_subtract_and_unite() {
        let u = "3e11fa47-71ca-11e1-9e33-c80aa9429562";
        let w = "4e11fa47-71ca-11e1-9e33-c80aa9429562";
        let purged: GtidSet = format!("{u}:1-100,{w}:1-3").parse().unwrap();
        let have: GtidSet = format!("{u}:1-40:45-90").parse().unwrap();
        assert_eq!(
            purged.missing_from(&have).to_string(),
            format!("{u}:41-44:91-100,{w}:1-3")
        );
        assert!(have.missing_from(&purged).is_empty());
        assert!(""
            .parse::<GtidSet>()
            .unwrap()
            .missing_from(&have)
            .is_empty());
        let mut all = have.clone();
        all.union(&purged);
        assert_eq!(all, purged);
        let mut m: GtidSet = "0-1-5".parse().unwrap();
        m.union(&"0-1-3,1-1-2".parse().unwrap());
        assert_eq!(m.to_string(), "0-1-5,1-1-2");
    }

    #[test]
    fn checkpoint_json_round_trip() {
        let c = Checkpoint {
            position: BinlogPosition::new("binlog.000003", 1234),
            gtid: Some("0-1-55".parse().unwrap()),
            epoch: 2,
            ts_ms: 1_700_000_000_000,
            server_id: Some(7),
        };
        assert_eq!(Checkpoint::from_json(&c.to_json()).unwrap(), c);
    }

    proptest! {
        #[test]
        fn position_display_parse_round_trip(stem in "[a-z][a-z-]{0,10}", seq in 0u32..999_999, pos in any::<u64>()) {
            let p = BinlogPosition::new(format!("{stem}.{seq:06}"), pos);
            prop_assert_eq!(p.to_string().parse::<BinlogPosition>().unwrap(), p);
        }

        #[test]
        fn mysql_set_equals_applied_numbers(nums in proptest::collection::btree_set(1u64..200, 0..60)) {
            let uuid = "3e11fa47-71ca-11e1-9e33-c80aa9429562";
            let mut g = GtidSet::empty_mysql();
            for n in nums.iter().rev() { g.apply_mysql(uuid, *n); }
            let GtidSet::MySql(m) = &g else { unreachable!() };
            let covered: std::collections::BTreeSet<u64> = m.values().flatten().flat_map(|&(a, b)| a..=b).collect();
            prop_assert_eq!(&covered, &nums);
            // intervals are disjoint and non-adjacent
            for ivs in m.values() { for w in ivs.windows(2) { prop_assert!(w[0].1 + 1 < w[1].0); } }
            if !nums.is_empty() { prop_assert_eq!(g.to_string().parse::<GtidSet>().unwrap(), g); }
        }
    }
}
