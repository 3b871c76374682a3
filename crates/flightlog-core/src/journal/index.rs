//! Finding an item of a growing list by its string key, for the pure rules' folds (hops by mail
//! id, actors, board entries by key).
//!
//! These lists are short in a typical engagement (a dozen hops, a handful of actors), where
//! comparing a few keys is cheaper than hashing one and needs no allocation. A long list switches
//! to a hash table of positions, keyed (SipHash, random keys) because the keys come from clients:
//! a list of any length stays linear in the work per lookup on average.

use std::collections::hash_map::RandomState;
use std::hash::BuildHasher;

use hashbrown::HashTable;

/// Beyond this many items, lookups go through a hash table.
const LINEAR_MAX: usize = 16;

/// The positions of a list's items by key. The list itself holds the keys: every call is given
/// the list and how to read an item's key, and the list must only grow by [`KeyIndex::pushed`].
#[derive(Default)]
pub(crate) struct KeyIndex {
    table: Option<(HashTable<usize>, RandomState)>,
}

impl KeyIndex {
    /// The position of the item whose key is `key`. While the list is short it is scanned from
    /// its end, where the items a fold looks up (recent mails) usually are.
    pub(crate) fn find<T>(
        &self,
        items: &[T],
        key_of: impl Fn(&T) -> &str,
        key: &str,
    ) -> Option<usize> {
        match &self.table {
            None => items.iter().rposition(|item| key_of(item) == key),
            Some((table, hasher)) => table
                .find(hasher.hash_one(key), |&index| key_of(&items[index]) == key)
                .copied(),
        }
    }

    /// Note that the last item of `items` was just pushed (its key must be new).
    pub(crate) fn pushed<T>(&mut self, items: &[T], key_of: impl Fn(&T) -> &str) {
        let hash = |hasher: &RandomState, index: usize| hasher.hash_one(key_of(&items[index]));
        match &mut self.table {
            Some((table, hasher)) => {
                let index = items.len() - 1;
                table.insert_unique(hash(hasher, index), index, |&other| hash(hasher, other));
            }
            None if items.len() > LINEAR_MAX => {
                let hasher = RandomState::new();
                let mut table = HashTable::with_capacity(items.len() * 2);
                for index in 0..items.len() {
                    table.insert_unique(hash(&hasher, index), index, |&other| hash(&hasher, other));
                }
                self.table = Some((table, hasher));
            }
            None => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_the_same_items_before_and_after_switching_to_a_table() {
        let mut items: Vec<String> = Vec::new();
        let mut index = KeyIndex::default();
        for n in 0..100 {
            let key = format!("k{n}");
            assert_eq!(index.find(&items, String::as_str, &key), None);
            items.push(key);
            index.pushed(&items, String::as_str);
            for m in [0, n / 2, n] {
                assert_eq!(
                    index.find(&items, String::as_str, &format!("k{m}")),
                    Some(m)
                );
            }
        }
        assert!(index.table.is_some());
        assert_eq!(index.find(&items, String::as_str, "k100"), None);
    }
}
