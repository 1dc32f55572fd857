//! The hashing of the isolate's maps keyed by what clients send (their
//! keys, their log groups), under a secret seed. std's `RandomState` has no
//! random source on wasm32-unknown-unknown and keys itself from allocation
//! addresses, the same in every isolate of a build: a client could work out
//! identifiers that all fall in one bucket and make each lookup walk them.

use std::{
    cell::Cell,
    collections::{hash_map::RandomState, HashMap},
    hash::{BuildHasher, DefaultHasher, Hasher},
};

thread_local! {
    static SEED: Cell<Option<[u64; 2]>> = const { Cell::new(None) };
}

/// Seeds every [`Seeded`] made after it on this thread (the isolate's
/// one): the worker calls it once, before its first map, with random bits.
pub fn seed_with(seed: [u64; 2]) {
    SEED.with(|s| s.set(Some(seed)));
}

/// SipHash-1-3 (std's `DefaultHasher`) fed the seed before each key: a
/// client that knows the algorithm but not the seed cannot aim its
/// identifiers at one bucket.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Seeded([u64; 2]);

impl Default for Seeded {
    /// Under the seed [`seed_with`] gave, else under one of std's own
    /// (random natively, where `simulate` and the tests run).
    fn default() -> Seeded {
        Seeded(SEED.with(Cell::get).unwrap_or_else(|| {
            let std = RandomState::new();
            [std.hash_one(0u8), std.hash_one(1u8)]
        }))
    }
}

impl BuildHasher for Seeded {
    type Hasher = DefaultHasher;

    fn build_hasher(&self) -> DefaultHasher {
        let mut h = DefaultHasher::new();
        h.write_u64(self.0[0]);
        h.write_u64(self.0[1]);
        h
    }
}

/// A map whose keys a client may choose, hashed under the isolate's seed.
pub type SeededMap<K, V> = HashMap<K, V, Seeded>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_seed_decides_every_hash() {
        let key = "el:{203.0.113.9}:per-ip";
        let (a, b) = (Seeded([1, 2]), Seeded([1, 3]));
        assert_eq!(a.hash_one(key), Seeded([1, 2]).hash_one(key));
        assert_ne!(a.hash_one(key), b.hash_one(key));
        assert_ne!(a.hash_one(key), Seeded([0, 2]).hash_one(key));
        seed_with([7, 9]);
        assert_eq!(Seeded::default(), Seeded([7, 9]));
        let mut map: SeededMap<String, u8> = SeededMap::default();
        map.insert(key.to_owned(), 1);
        assert_eq!(map.get(key), Some(&1));
    }
}
