//! A bulk restore's bookkeeping: which arena slots a snapshot load has restored but not yet
//! listed, and the order they are listed in.
//!
//! A snapshot lists its tasks in arena order, which after churn is no list's order, so
//! inserting each into its skiplist as it comes would search the list (O(log n) steps, a cache
//! miss each). The engine instead holds them unlisted — status and time already in the slot,
//! no tower yet — and lists them at the end sorted by [`list_key`] and id, so that every task
//! is appended at its list's tail in O(height). The sort is either the engine's own
//! ([`crate::Queue::end_bulk_restore`]) or given by the loader, which can compute it on another
//! thread while the loop thread restores ([`crate::Queue::end_bulk_restore_in`]): the order
//! names tasks by their *ordinal*, the how-manieth `restore_in` of the bulk each was.

use crate::{Micros, Status};

/// How `restore_in` treats ids during a bulk restore ([`crate::Queue::begin_bulk_restore`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BulkIds {
    /// Each restore looks its id up and refuses a duplicate.
    Check,
    /// The caller has made sure the ids are distinct and none is in the queue already, so no
    /// restore looks one up (in a churned queue's snapshot the lookup is a cache miss or two
    /// per task, a sixth of the load). A snapshot's ids are distinct by construction and its
    /// loader checks them on its reading thread; should they not be, the queue holds two index
    /// entries for one id and must be discarded, as a failed load's is.
    Distinct,
}

/// A held task's place in the order it is listed in, before its id: which of the two list
/// orders it has — 0 by pri (Ready, Buried; pri with the sign bit flipped, so it sorts as
/// unsigned), 1 by time (Waiting; runat) — and its key in that order. Sorted by (this, id),
/// all tasks together, each list still receives its own tasks in its own order; and so does
/// each half sorted alone, which a loader can use (tasks in arena order are often near their
/// list's order within each half, seldom across the two). `None` for a Taken task, which is
/// entered at once (its order is its session's, by time).
pub fn list_key(status: Status, pri: i64, runat: Micros) -> Option<(u8, u64)> {
    match status {
        Status::Taken => None,
        Status::Waiting => Some((1, runat)),
        Status::Ready | Status::Buried => Some((0, (pri as u64) ^ (1 << 63))),
    }
}

/// An open bulk restore.
#[derive(Debug)]
pub(crate) struct Bulk {
    pub(crate) ids: BulkIds,
    /// The arena key of each task restored since the bulk began, by ordinal.
    keys: Keys,
    /// The ordinals of the Taken ones (few), so a given order is checked without reading
    /// a slot per task; every other task restored is held.
    pub(crate) taken: Vec<u32>,
}

/// Ordinal → arena key. A fresh arena hands out keys in order, so in a snapshot load the key
/// of ordinal `i` is `i`: nothing is written unless a key differs.
#[derive(Debug)]
enum Keys {
    InOrder(u32),
    Mapped(Vec<u32>),
}

impl Bulk {
    pub(crate) fn new(ids: BulkIds) -> Self {
        Bulk {
            ids,
            keys: Keys::InOrder(0),
            taken: Vec::new(),
        }
    }

    /// Notes the next restored task's arena key; `held` unless it is Taken.
    pub(crate) fn restored(&mut self, k: u32, held: bool) {
        if !held {
            self.taken.push(self.len() as u32);
        }
        match &mut self.keys {
            Keys::InOrder(n) if *n == k => *n += 1,
            Keys::InOrder(n) => {
                let mut keys: Vec<u32> = (0..*n).collect();
                keys.push(k);
                self.keys = Keys::Mapped(keys);
            }
            Keys::Mapped(keys) => keys.push(k),
        }
    }

    /// How many of the tasks restored are held (not Taken): the tasks the listing names.
    pub(crate) fn held(&self) -> usize {
        self.len() - self.taken.len()
    }

    /// How many tasks were restored.
    pub(crate) fn len(&self) -> usize {
        match &self.keys {
            Keys::InOrder(n) => *n as usize,
            Keys::Mapped(keys) => keys.len(),
        }
    }

    /// The arena key of the task restored `ordinal`-th, if there was one.
    pub(crate) fn key(&self, ordinal: u32) -> Option<u32> {
        match &self.keys {
            Keys::InOrder(n) => (ordinal < *n).then_some(ordinal),
            Keys::Mapped(keys) => keys.get(ordinal as usize).copied(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_written_out_only_once_one_is_out_of_order() {
        let mut b = Bulk::new(BulkIds::Distinct);
        for k in 0..3 {
            b.restored(k, true);
        }
        assert!(matches!(b.keys, Keys::InOrder(3)));
        b.restored(7, false);
        b.restored(3, true);
        assert_eq!(b.len(), 5);
        assert_eq!(b.held(), 4);
        assert_eq!(b.taken, [3], "the ordinal of the Taken one");
        let keys: Vec<_> = (0..6).map(|i| b.key(i)).collect();
        assert_eq!(keys, [Some(0), Some(1), Some(2), Some(7), Some(3), None]);
    }

    #[test]
    fn taken_tasks_have_no_list_key_and_pri_sorts_as_signed() {
        assert_eq!(list_key(Status::Taken, 0, 5), None);
        assert_eq!(list_key(Status::Waiting, 3, 5), Some((1, 5)));
        let ready = |pri| list_key(Status::Ready, pri, 0).expect("held");
        assert!(ready(-1) < ready(0) && ready(0) < ready(1));
        assert!(ready(i64::MIN) < ready(i64::MAX));
    }
}
