//! The external version every document write carries (README invariant 3).
//!
//! A version must grow with the binlog order of the changes to a row, and stay monotonic
//! across binlog rotation, a primary failover and a position reset. GTID sets have no total
//! order and file numbers restart on a new primary, so the version is built from three
//! fields, most significant first:
//!
//! | bits  | field    | range            | meaning                                          |
//! |-------|----------|------------------|--------------------------------------------------|
//! | 62-53 | epoch    | 0..=1023         | bumped by the operator/center when coordinates restart |
//! | 52-32 | file     | 0..=2_097_151    | the binlog file's sequence number                |
//! | 31-0  | offset   | 0..=4_294_967_295| the rows event's start offset plus the row index |
//!
//! Rows inside one rows event share the event's offset; adding the row's index keeps them
//! distinct, and because every row takes at least one byte of the event, `start + index` is
//! still below the next event's start. Bit 63 stays clear: Elasticsearch versions are
//! non-negative signed longs.

use std::fmt;

pub const MAX_EPOCH: u64 = (1 << 10) - 1;
pub const MAX_FILE_SEQ: u64 = (1 << 21) - 1;
pub const MAX_OFFSET: u64 = (1 << 32) - 1;

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum VersionError {
    #[error("version epoch {0} exceeds {MAX_EPOCH}")]
    Epoch(u64),
    #[error("binlog file sequence {0} exceeds {MAX_FILE_SEQ}: bump the version epoch and reset positions")]
    FileSeq(u64),
    #[error("binlog offset {0} exceeds {MAX_OFFSET} (binlog files over 4 GiB are not supported)")]
    Offset(u64),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ExternalVersion(u64);

impl ExternalVersion {
    pub fn new(epoch: u64, file_seq: u64, offset: u64) -> Result<Self, VersionError> {
        if epoch > MAX_EPOCH {
            return Err(VersionError::Epoch(epoch));
        }
        if file_seq > MAX_FILE_SEQ {
            return Err(VersionError::FileSeq(file_seq));
        }
        if offset > MAX_OFFSET {
            return Err(VersionError::Offset(offset));
        }
        Ok(Self((epoch << 53) | (file_seq << 32) | offset))
    }

    pub fn get(self) -> u64 {
        self.0
    }

    /// A version as a document carries it.
    pub fn from_raw(v: u64) -> Self {
        Self(v)
    }

    pub fn epoch(self) -> u64 {
        self.0 >> 53
    }

    pub fn file_seq(self) -> u64 {
        (self.0 >> 32) & MAX_FILE_SEQ
    }

    pub fn offset(self) -> u64 {
        self.0 & MAX_OFFSET
    }
}

impl fmt::Display for ExternalVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn later_file_beats_larger_offset_and_epoch_beats_everything() {
        let a = ExternalVersion::new(0, 9, MAX_OFFSET).unwrap();
        let b = ExternalVersion::new(0, 10, 4).unwrap();
        let c = ExternalVersion::new(1, 1, 4).unwrap();
        assert!(a < b && b < c);
        assert!(
            ExternalVersion::new(MAX_EPOCH, MAX_FILE_SEQ, MAX_OFFSET)
                .unwrap()
                .get()
                <= i64::MAX as u64
        );
    }

    #[test]
    fn out_of_range_fields_are_errors() {
        assert_eq!(
            ExternalVersion::new(MAX_EPOCH + 1, 0, 0),
            Err(VersionError::Epoch(MAX_EPOCH + 1))
        );
        assert!(ExternalVersion::new(0, MAX_FILE_SEQ + 1, 0).is_err());
        assert!(ExternalVersion::new(0, 0, MAX_OFFSET + 1).is_err());
    }

    proptest! {
        #[test]
        fn ordering_is_lexicographic_in_fields(
            e1 in 0..=MAX_EPOCH, f1 in 0..=MAX_FILE_SEQ, o1 in 0..=MAX_OFFSET,
            e2 in 0..=MAX_EPOCH, f2 in 0..=MAX_FILE_SEQ, o2 in 0..=MAX_OFFSET,
        ) {
            let a = ExternalVersion::new(e1, f1, o1).unwrap();
            let b = ExternalVersion::new(e2, f2, o2).unwrap();
            prop_assert_eq!(a.cmp(&b), (e1, f1, o1).cmp(&(e2, f2, o2)));
            prop_assert_eq!((a.epoch(), a.file_seq(), a.offset()), (e1, f1, o1));
        }
    }
}
