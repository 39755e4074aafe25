//! Hash maps keyed by the small integers of a session: ITTs, CmdSNs, CIDs.
//!
//! std's default SipHash resists keys chosen to collide, at a cost that shows on every
//! command (several lookups per command at ERL 2). These keys are chosen by the one
//! initiator of the session that owns the map, and the maps are under that session's own
//! lock: an initiator that picks colliding ITTs only makes its own session's lookups
//! slower (linear in what it keeps outstanding, which it could spend on commands anyway).
//! So a multiplicative hash is enough here; do not use it for keys shared across sessions.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

/// A map keyed by an ITT, CmdSN or CID.
pub(crate) type TagMap<K, V> = HashMap<K, V, BuildHasherDefault<TagHasher>>;

/// Multiplies by an odd 64-bit constant (2^64 / golden ratio) and folds the high half,
/// which depends on every bit of the key, into the low bits the table indexes by.
#[derive(Clone, Copy, Default)]
pub(crate) struct TagHasher(u64);

const K: u64 = 0x9e37_79b9_7f4a_7c15;

impl TagHasher {
    fn add(&mut self, n: u64) {
        let h = (self.0 ^ n).wrapping_mul(K);
        self.0 = h ^ (h >> 32);
    }
}

impl Hasher for TagHasher {
    fn write(&mut self, bytes: &[u8]) {
        // Not reached for the integer keys above; correct for anything else.
        for &b in bytes {
            self.add(u64::from(b));
        }
    }

    fn write_u16(&mut self, n: u16) {
        self.add(u64::from(n));
    }

    fn write_u32(&mut self, n: u32) {
        self.add(u64::from(n));
    }

    fn finish(&self) -> u64 {
        self.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::hash::BuildHasher;

    fn hash(n: u32) -> u64 {
        BuildHasherDefault::<TagHasher>::default().hash_one(n)
    }

    #[test]
    fn tags_that_differ_in_high_bits_only_spread_over_the_low_bits() {
        // Initiators often put a slot number in the high bits of the ITT.
        let low: std::collections::HashSet<u64> = (0..64u32).map(|i| hash(i << 24) & 63).collect();
        assert!(low.len() > 32, "{} distinct buckets of 64", low.len());
        let top: std::collections::HashSet<u64> = (0..64u32).map(|i| hash(i) >> 57).collect();
        assert!(top.len() > 32, "{} distinct control bytes of 64", top.len());
    }

    #[test]
    fn a_map_works() {
        let mut m: TagMap<u32, u32> = TagMap::default();
        for i in 0..1000u32 {
            m.insert(i.wrapping_mul(0x0101_0101), i);
        }
        for i in 0..1000u32 {
            assert_eq!(m.get(&i.wrapping_mul(0x0101_0101)), Some(&i));
        }
    }
}
