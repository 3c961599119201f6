//! The per-status ordered lists: every task of one status, ordered by (pri, id), so the head of
//! the ready list is the next task to take. This first version keeps a `BTreeMap` per list;
//! the intrusive skiplist replaces it behind the same methods.

use std::collections::BTreeMap;

use crate::queue::Slots;

#[derive(Debug, Default)]
pub(crate) struct OrdList {
    map: BTreeMap<(i64, u64), u32>,
}

impl OrdList {
    pub fn len(&self) -> usize {
        self.map.len()
    }

    pub fn first(&self) -> Option<u32> {
        self.map.first_key_value().map(|(_, &k)| k)
    }

    pub fn insert(&mut self, slots: &mut Slots, node: u32) {
        let s = &slots[node as usize];
        let prev = self.map.insert((s.pri, s.id), node);
        debug_assert!(prev.is_none(), "task {} inserted twice", s.id);
    }

    pub fn remove(&mut self, slots: &mut Slots, node: u32) {
        let s = &slots[node as usize];
        let was = self.map.remove(&(s.pri, s.id));
        debug_assert_eq!(was, Some(node), "task {} not in its list", s.id);
    }

    pub fn iter<'a>(&'a self, _slots: &'a Slots) -> impl Iterator<Item = u32> + 'a {
        self.map.values().copied()
    }

    /// Panics unless every node is in (pri, id) order; returns the count walked.
    pub fn check(&self, slots: &Slots) -> usize {
        for (&(pri, id), &k) in &self.map {
            let s = &slots[k as usize];
            assert_eq!((s.pri, s.id), (pri, id), "list key of slot {k} is stale");
        }
        self.map.len()
    }
}
