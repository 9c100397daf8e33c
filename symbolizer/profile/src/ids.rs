//! Hash maps keyed by ids a program made itself (stack nodes, tree nodes, sample keys).

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

/// Hashes integer ids with one multiply per word, as rustc's FxHash does: several times faster
/// than SipHash on the per-frame and per-row paths of appends, compaction and queries. Only for
/// ids the program assigned: strings that come from targets (function names, labels) keep the
/// default hasher, which resists crafted collisions.
#[derive(Debug, Default, Clone, Copy)]
pub struct IdHasher(u64);

impl IdHasher {
    fn add(&mut self, word: u64) {
        self.0 = (self.0.rotate_left(5) ^ word).wrapping_mul(0x517c_c1b7_2722_0a95);
    }
}

impl Hasher for IdHasher {
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.add(u64::from(b));
        }
    }

    fn write_u32(&mut self, n: u32) {
        self.add(u64::from(n));
    }

    fn write_u64(&mut self, n: u64) {
        self.add(n);
    }

    fn finish(&self) -> u64 {
        // The multiply leaves its entropy in the high bits; the table indexes by the low ones.
        self.0.rotate_left(26)
    }
}

/// A hash map keyed by the program's own ids; see [`IdHasher`].
pub type IdMap<K, V> = HashMap<K, V, BuildHasherDefault<IdHasher>>;
