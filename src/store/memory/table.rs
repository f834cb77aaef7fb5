//! A shard's states, found by a hash computed once per key.
//!
//! The store hashes a key once: the hash picks the shard (from bits the table does not use
//! for its buckets or its tags) and places the key in the shard's table, so a check hashes
//! its key once rather than once for the shard and once more for the map. The table is
//! `hashbrown`'s `HashTable`, the map under the standard library's `HashMap`, given the hash
//! instead of a hasher.

use hashbrown::hash_table::{Entry, HashTable};

use super::Stored;

/// One state and its key, with the key's hash (for growing the table without hashing again).
#[derive(Debug)]
struct Slot {
    hash: u64,
    key: String,
    stored: Stored,
}

/// The states of one shard, by key.
#[derive(Debug, Default)]
pub(super) struct Table {
    slots: HashTable<Slot>,
}

impl Table {
    pub(super) fn len(&self) -> usize {
        self.slots.len()
    }

    pub(super) fn get(&self, hash: u64, key: &str) -> Option<&Stored> {
        self.slots.find(hash, |s| s.key == key).map(|s| &s.stored)
    }

    pub(super) fn get_mut(&mut self, hash: u64, key: &str) -> Option<&mut Stored> {
        self.slots
            .find_mut(hash, |s| s.key == key)
            .map(|s| &mut s.stored)
    }

    pub(super) fn contains(&self, hash: u64, key: &str) -> bool {
        self.get(hash, key).is_some()
    }

    pub(super) fn remove(&mut self, hash: u64, key: &str) -> Option<Stored> {
        match self.slots.find_entry(hash, |s| s.key == key) {
            Ok(entry) => Some(entry.remove().0.stored),
            Err(_) => None,
        }
    }

    /// Sets the state of `key` (copied only when it is new).
    pub(super) fn insert(&mut self, hash: u64, key: &str, stored: Stored) {
        match self.slots.entry(hash, |s| s.key == key, |s| s.hash) {
            Entry::Occupied(mut slot) => slot.get_mut().stored = stored,
            Entry::Vacant(slot) => {
                slot.insert(Slot {
                    hash,
                    key: key.to_owned(),
                    stored,
                });
            }
        }
    }

    /// Keeps only the states `keep` says to.
    pub(super) fn retain(&mut self, mut keep: impl FnMut(&Stored) -> bool) {
        self.slots.retain(|s| keep(&s.stored));
    }

    /// Every key and its state, in no particular order.
    #[cfg(test)]
    pub(super) fn iter(&self) -> impl Iterator<Item = (&str, &Stored)> {
        self.slots.iter().map(|s| (s.key.as_str(), &s.stored))
    }

    /// Among the first `sample` states that are not `protected`, the hash and key of the
    /// one that expires first.
    pub(super) fn closest_to_expiry(
        &self,
        sample: usize,
        protected: impl Fn(&str) -> bool,
    ) -> Option<(u64, String)> {
        self.slots
            .iter()
            .filter(|s| !protected(&s.key))
            .take(sample)
            .min_by_key(|s| s.stored.expires_at)
            .map(|s| (s.hash, s.key.clone()))
    }
}
