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
    key: Key,
    stored: Stored,
}

/// The longest key kept in its slot: one of an IPv4 address and a policy of three limits
/// (`m:{ip:255.255.255.255}:r1s,r1m,r1h`, 34 bytes) fits, and the key takes 40 bytes.
const INLINE: usize = 38;

/// A key, in its slot when it is short, as nearly every key is (an identifier and a few
/// bytes): finding a state then reads nothing outside the table, where a key of its own
/// allocation would cost one more cache miss on every lookup of a key that is not in cache,
/// and an allocation for every new key.
#[derive(Debug)]
enum Key {
    Inline { len: u8, bytes: [u8; INLINE] },
    Heap(Box<str>),
}

impl Key {
    fn new(key: &str) -> Key {
        match u8::try_from(key.len()) {
            Ok(len) if key.len() <= INLINE => {
                let mut bytes = [0; INLINE];
                bytes[..key.len()].copy_from_slice(key.as_bytes());
                Key::Inline { len, bytes }
            }
            _ => Key::Heap(key.into()),
        }
    }

    fn as_bytes(&self) -> &[u8] {
        match self {
            Key::Inline { len, bytes } => &bytes[..usize::from(*len)],
            Key::Heap(key) => key.as_bytes(),
        }
    }

    fn is(&self, key: &str) -> bool {
        self.as_bytes() == key.as_bytes()
    }

    /// The key as text (it was made from a `str`, so it is one: checked again here, off the
    /// checks' path, rather than trusted without a check).
    fn to_text(&self) -> std::borrow::Cow<'_, str> {
        String::from_utf8_lossy(self.as_bytes())
    }
}

/// Below this many states a table is not shrunk: its memory is next to nothing.
const SMALL: usize = 64;

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
        self.slots.find(hash, |s| s.key.is(key)).map(|s| &s.stored)
    }

    pub(super) fn get_mut(&mut self, hash: u64, key: &str) -> Option<&mut Stored> {
        self.slots
            .find_mut(hash, |s| s.key.is(key))
            .map(|s| &mut s.stored)
    }

    pub(super) fn contains(&self, hash: u64, key: &str) -> bool {
        self.get(hash, key).is_some()
    }

    pub(super) fn remove(&mut self, hash: u64, key: &str) -> Option<Stored> {
        match self.slots.find_entry(hash, |s| s.key.is(key)) {
            Ok(entry) => Some(entry.remove().0.stored),
            Err(_) => None,
        }
    }

    /// Sets the state of `key` (copied only when it is new).
    pub(super) fn insert(&mut self, hash: u64, key: &str, stored: Stored) {
        match self.slots.entry(hash, |s| s.key.is(key), |s| s.hash) {
            Entry::Occupied(mut slot) => slot.get_mut().stored = stored,
            Entry::Vacant(slot) => {
                slot.insert(Slot {
                    hash,
                    key: Key::new(key),
                    stored,
                });
            }
        }
    }

    /// Keeps only the states `keep` says to, and gives memory back when they fill less than
    /// a quarter of the table: a flood passed leaves a table sized for it otherwise, as
    /// removing never shrinks one. (Down to twice the states kept, so that the table does
    /// not grow again at the next few insertions.)
    pub(super) fn retain(&mut self, mut keep: impl FnMut(&Stored) -> bool) {
        self.slots.retain(|s| keep(&s.stored));
        let len = self.slots.len();
        if self.slots.capacity() > 4 * len.max(SMALL) {
            self.slots.shrink_to(2 * len, |s| s.hash);
        }
    }

    /// The states the table has room for without growing.
    #[cfg(test)]
    pub(super) fn capacity(&self) -> usize {
        self.slots.capacity()
    }

    /// Every key and its state, in no particular order.
    #[cfg(test)]
    pub(super) fn iter(&self) -> impl Iterator<Item = (std::borrow::Cow<'_, str>, &Stored)> {
        self.slots.iter().map(|s| (s.key.to_text(), &s.stored))
    }

    /// Among `sample` states that are not `protected`, the hash and key of the one that
    /// expires first: those met first from a bucket `seed` picks, on through the table (and
    /// round from its start). A seed drawn anew for each eviction (the new key's hash) samples
    /// the whole table alike. Always the first states in table order, as this took once, both
    /// evicted the same few buckets over and over, so that a key landing there was evicted
    /// soon after it came however young, and left a stretch of empty buckets in front that
    /// every later eviction walked through, under the shard's lock.
    pub(super) fn closest_to_expiry(
        &self,
        seed: u64,
        sample: usize,
        protected: impl Fn(&str) -> bool,
    ) -> Option<(u64, String)> {
        let buckets = self.slots.num_buckets();
        if buckets == 0 {
            return None;
        }
        // (the bits the table places keys by are the low ones, its tags the top seven: the
        // seed's others pick the start)
        let start = (seed.rotate_left(26) % buckets as u64) as usize;
        (start..buckets)
            .chain(0..start)
            .filter_map(|i| self.slots.get_bucket(i))
            .filter(|s| !protected(&s.key.to_text()))
            .take(sample)
            .min_by_key(|s| s.stored.expires_at)
            .map(|s| (s.hash, s.key.to_text().into_owned()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::algorithm::{Counters, State};

    fn stored(expires_at: u64) -> Stored {
        Stored {
            state: State::Counters(Counters::new()),
            expires_at,
        }
    }

    #[test]
    fn keys_in_their_slot_and_of_their_own_are_found_alike() {
        // up to the inline length, one over it, far over it, and with non-ASCII text
        let keys = [
            String::new(),
            "m:{ip:1.2.3.4}:r1s".to_string(),
            "k".repeat(INLINE),
            "k".repeat(INLINE + 1),
            "k".repeat(300),
            "m:{é€}:r1s".to_string(),
        ];
        assert!(matches!(Key::new(&keys[2]), Key::Inline { .. }));
        assert!(matches!(Key::new(&keys[3]), Key::Heap(_)));
        let mut table = Table::default();
        // every key with the same hash: they are told apart by their bytes alone
        for (i, key) in keys.iter().enumerate() {
            table.insert(7, key, stored(i as u64 + 10));
        }
        assert_eq!(table.len(), keys.len());
        for (i, key) in keys.iter().enumerate() {
            assert_eq!(table.get(7, key).map(|s| s.expires_at), Some(i as u64 + 10));
            // a prefix or an extension of a key is another key
            assert!(!table.contains(7, &format!("{key}x")));
        }
        assert!(!table.contains(7, &"k".repeat(INLINE - 1)));
        let mut listed: Vec<String> = table.iter().map(|(k, _)| k.into_owned()).collect();
        listed.sort();
        let mut expected = keys.to_vec();
        expected.sort();
        assert_eq!(listed, expected);
        // the earliest expiry among the keys not protected, named as it was given
        let closest = table.closest_to_expiry(0, 16, |k| k.is_empty());
        assert_eq!(closest, Some((7, keys[1].clone())));
        assert_eq!(table.remove(7, &keys[3]).map(|s| s.expires_at), Some(13));
        assert!(!table.contains(7, &keys[3]));
        assert_eq!(table.len(), keys.len() - 1);
    }

    /// Under a flood of new keys (each evicting one of a full table), the states evicted are
    /// the oldest, from all over the table: a key is kept about as long as the table's size
    /// in insertions, wherever it lands.
    #[test]
    fn a_flood_evicts_the_oldest_states_from_all_over_the_table() {
        use std::hash::BuildHasher;
        let hasher = std::collections::hash_map::RandomState::new();
        let size = 4096u64;
        let mut table = Table::default();
        let key = |i: u64| format!("k{i}");
        for i in 0..size {
            table.insert(hasher.hash_one(key(i)), &key(i), stored(i));
        }
        let mut ages = Vec::new();
        for i in size..8 * size {
            let hash = hasher.hash_one(key(i));
            let (h, evicted) = table.closest_to_expiry(hash, 16, |_| false).unwrap();
            let born = table.remove(h, &evicted).unwrap().expires_at;
            if i >= 4 * size {
                ages.push(i - born);
            }
            table.insert(hash, &key(i), stored(i));
        }
        ages.sort_unstable();
        let (youngest, median) = (ages[ages.len() / 100], ages[ages.len() / 2]);
        // (evicting the first states in table order, the median age was 16 insertions)
        assert!(median >= size / 2, "median age at eviction {median}");
        assert!(youngest >= size / 8, "1st percentile of ages {youngest}");
    }
}
