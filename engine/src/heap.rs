//! The deadline heap: one indexed binary min-heap holding every pending deadline of every task
//! (runat of a Waiting task, TTL expiry, TTR of a Taken task). Each task's slot records where
//! its entries sit, so an ack or release removes its entry at once in O(log n): no stale
//! entries, hence nothing to skip in `advance` and nothing that piles up. Ties on time are
//! broken by (id, kind), which makes the order of `advance` fully deterministic.

use crate::queue::Slots;
use crate::{Micros, TaskId};

/// "No position": the slot has no entry of that kind.
pub(crate) const NIL: u32 = u32::MAX;

/// What a deadline does when it falls due. The order matters for ties at the same time and
/// id: an expiry wins, since the task is deleted anyway.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Kind {
    /// TTL passed: delete the task, whatever its state.
    Expire = 0,
    /// Waiting -> Ready.
    Promote = 1,
    /// Taken for ttr: back to Ready.
    Ttr = 2,
}

/// One pending deadline. 24 bytes: `at` and `id` inline so that sifting never reads a slot.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Entry {
    pub at: Micros,
    pub id: TaskId,
    pub slot: u32,
    pub kind: Kind,
}

impl Entry {
    #[inline]
    fn key(&self) -> (Micros, TaskId, Kind) {
        (self.at, self.id, self.kind)
    }
}

#[derive(Debug, Default)]
pub(crate) struct DeadlineHeap {
    v: Vec<Entry>,
}

impl DeadlineHeap {
    pub fn len(&self) -> usize {
        self.v.len()
    }

    pub fn peek(&self) -> Option<&Entry> {
        self.v.first()
    }

    pub fn get(&self, pos: u32) -> &Entry {
        &self.v[pos as usize]
    }

    /// Adds an entry and records its position in its slot.
    pub fn push(&mut self, e: Entry, slots: &mut Slots) {
        self.v.push(e);
        let pos = self.v.len() - 1;
        self.sift_up(pos, slots);
    }

    /// Removes the entry at `pos` (as recorded in its slot) and marks the slot as having none.
    pub fn remove(&mut self, pos: u32, slots: &mut Slots) -> Entry {
        let pos = pos as usize;
        let last = self.v.len() - 1;
        self.v.swap(pos, last);
        let e = self.v.pop().expect("remove from an empty heap");
        set_pos(slots, &e, NIL);
        if pos < last {
            // The entry moved into the hole may belong above or below it.
            let moved = self.sift_up(pos, slots);
            if moved == pos {
                self.sift_down(pos, slots);
            }
        }
        e
    }

    /// Removes the earliest entry.
    pub fn pop(&mut self, slots: &mut Slots) -> Option<Entry> {
        if self.v.is_empty() {
            None
        } else {
            Some(self.remove(0, slots))
        }
    }

    fn sift_up(&mut self, mut pos: usize, slots: &mut Slots) -> usize {
        let e = self.v[pos];
        let key = e.key();
        while pos > 0 {
            let parent = (pos - 1) / 2;
            if self.v[parent].key() <= key {
                break;
            }
            self.v[pos] = self.v[parent];
            set_pos(slots, &self.v[pos], pos as u32);
            pos = parent;
        }
        self.v[pos] = e;
        set_pos(slots, &e, pos as u32);
        pos
    }

    fn sift_down(&mut self, mut pos: usize, slots: &mut Slots) {
        let n = self.v.len();
        let e = self.v[pos];
        let key = e.key();
        loop {
            let l = 2 * pos + 1;
            if l >= n {
                break;
            }
            let r = l + 1;
            let c = if r < n && self.v[r].key() < self.v[l].key() {
                r
            } else {
                l
            };
            if key <= self.v[c].key() {
                break;
            }
            self.v[pos] = self.v[c];
            set_pos(slots, &self.v[pos], pos as u32);
            pos = c;
        }
        self.v[pos] = e;
        set_pos(slots, &e, pos as u32);
    }

    /// Panics unless the heap order holds and every entry's slot points back at it.
    pub fn check(&self, slots: &Slots) {
        for (i, e) in self.v.iter().enumerate() {
            if i > 0 {
                let parent = &self.v[(i - 1) / 2];
                assert!(
                    parent.key() <= e.key(),
                    "heap order broken at {i}: parent {parent:?} > {e:?}"
                );
            }
            let s = slots
                .get(e.slot as usize)
                .unwrap_or_else(|| panic!("heap entry {e:?} points at a free slot"));
            assert_eq!(s.id, e.id, "heap entry {e:?} points at task {}", s.id);
            let recorded = match e.kind {
                Kind::Expire => s.ttl_pos,
                Kind::Promote | Kind::Ttr => s.tm_pos,
            };
            assert_eq!(
                recorded as usize, i,
                "slot of {e:?} records position {recorded}"
            );
        }
    }
}

#[inline]
fn set_pos(slots: &mut Slots, e: &Entry, pos: u32) {
    let s = &mut slots[e.slot as usize];
    match e.kind {
        Kind::Expire => s.ttl_pos = pos,
        Kind::Promote | Kind::Ttr => s.tm_pos = pos,
    }
}
