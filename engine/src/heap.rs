//! The deadline heap: an indexed 4-ary min-heap holding at most one entry per task — its
//! earliest pending deadline (runat of a Waiting task, TTL expiry, TTR of a Taken task). The
//! task's slot records the entry's position, so an ack, a release or a fired deadline updates
//! or removes the entry in place in O(log n): no stale entries exist, nothing piles up and
//! `advance` never skips garbage. Entries order by (time, number in the tube, id), which makes
//! `advance` fully deterministic; one entry per task keeps the heap at 16 bytes a task at
//! most.

use crate::slots::Slots;
use crate::{Micros, TaskId, NIL};

/// Slot keys are packed into 30 bits of an entry (the top 2 hold the kind).
pub(crate) const SLOT_BITS: u32 = 30;
const SLOT_MASK: u32 = (1 << SLOT_BITS) - 1;

/// Children per node. Every entry an operation moves writes its new position into its task's
/// slot — a likely cache miss — so depth is what costs: four children halve it against a
/// binary heap (10 levels at 1M) while the four siblings share one or two cache lines.
const ARITY: usize = 4;

/// `Entry::tie` of an id: its number in its tube, saturated at `u32::MAX`. Exact short of four
/// billion tasks in a tube, so equal times order without reading a slot; two entries with the
/// same tie (the same number in two tubes, or numbers past 2^32) compare their full keys.
fn tie_of(id: TaskId) -> u32 {
    u32::try_from(crate::id_number(id)).unwrap_or(u32::MAX)
}

/// The order of two tasks' deadlines at the same time: by number in their tubes, then by id
/// (which tells tubes apart). In `default` alone, the order of ids.
#[inline]
fn tie_key(id: TaskId) -> (u64, TaskId) {
    (crate::id_number(id), id)
}

/// What a deadline does when it falls due. At equal times the smaller kind is the task's
/// deadline: an expiry wins over a promotion, since the task is deleted anyway.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Kind {
    /// TTL passed: delete the task, whatever its state.
    Expire = 0,
    /// Waiting -> Ready.
    Promote = 1,
    /// Taken for ttr: back to Ready.
    Ttr = 2,
}

impl Kind {
    fn from_bits(b: u32) -> Kind {
        match b {
            0 => Kind::Expire,
            1 => Kind::Promote,
            _ => Kind::Ttr,
        }
    }
}

/// One pending deadline in 16 bytes. `tie` is the task's number in its tube when it fits in 32
/// bits ([`tie_of`]), so equal times order without reading a slot.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Entry {
    pub at: Micros,
    tie: u32,
    slot_kind: u32,
}

impl Entry {
    pub fn new(at: Micros, id: TaskId, slot: u32, kind: Kind) -> Entry {
        debug_assert!(slot <= SLOT_MASK);
        Entry {
            at,
            tie: tie_of(id),
            slot_kind: slot | (kind as u32) << SLOT_BITS,
        }
    }

    pub fn slot(&self) -> u32 {
        self.slot_kind & SLOT_MASK
    }

    pub fn kind(&self) -> Kind {
        Kind::from_bits(self.slot_kind >> SLOT_BITS)
    }
}

/// `a` fires before `b`: by time, then by number in the tube, then by task id.
#[inline]
fn less(a: &Entry, b: &Entry, slots: &Slots) -> bool {
    if a.at != b.at {
        return a.at < b.at;
    }
    if a.tie != b.tie {
        return a.tie < b.tie;
    }
    // The same number in two tubes, numbers past 2^32, or the same task (which compares
    // false).
    tie_key(slots[a.slot() as usize].id) < tie_key(slots[b.slot() as usize].id)
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

    /// Bytes held (for the memory figure).
    pub fn capacity_bytes(&self) -> usize {
        self.v.capacity() * std::mem::size_of::<Entry>()
    }

    /// Adds an entry and records its position in its slot.
    pub fn push(&mut self, e: Entry, slots: &mut Slots) {
        self.v.push(e);
        let pos = self.v.len() - 1;
        self.sift_up(pos, slots);
    }

    /// Replaces the entry at `pos` (a task's deadline changed) and restores the order.
    pub fn update(&mut self, pos: u32, e: Entry, slots: &mut Slots) {
        let pos = pos as usize;
        self.v[pos] = e;
        if self.sift_up(pos, slots) == pos {
            self.sift_down(pos, slots);
        }
    }

    /// Removes the entry at `pos` (as recorded in its slot) and marks the slot as having none.
    pub fn remove(&mut self, pos: u32, slots: &mut Slots) {
        let pos = pos as usize;
        let last = self.v.len() - 1;
        self.v.swap(pos, last);
        let e = self.v.pop().expect("remove from an empty heap");
        slots.set_heap_pos(e.slot(), NIL);
        if pos < last && self.sift_up(pos, slots) == pos {
            // The entry moved into the hole may belong above or below it.
            self.sift_down(pos, slots);
        }
    }

    fn sift_up(&mut self, mut pos: usize, slots: &mut Slots) -> usize {
        let e = self.v[pos];
        while pos > 0 {
            let parent = (pos - 1) / ARITY;
            if !less(&e, &self.v[parent], slots) {
                break;
            }
            self.v[pos] = self.v[parent];
            slots.set_heap_pos(self.v[pos].slot(), pos as u32);
            pos = parent;
        }
        self.v[pos] = e;
        slots.set_heap_pos(e.slot(), pos as u32);
        pos
    }

    fn sift_down(&mut self, mut pos: usize, slots: &mut Slots) {
        let n = self.v.len();
        let e = self.v[pos];
        loop {
            let first = ARITY * pos + 1;
            if first >= n {
                break;
            }
            let mut c = first;
            for j in first + 1..(first + ARITY).min(n) {
                if less(&self.v[j], &self.v[c], slots) {
                    c = j;
                }
            }
            if !less(&self.v[c], &e, slots) {
                break;
            }
            self.v[pos] = self.v[c];
            slots.set_heap_pos(self.v[pos].slot(), pos as u32);
            pos = c;
        }
        self.v[pos] = e;
        slots.set_heap_pos(e.slot(), pos as u32);
    }

    /// Panics unless the heap order holds and every entry's slot points back at it.
    pub fn check(&self, slots: &Slots) {
        for (i, e) in self.v.iter().enumerate() {
            if i > 0 {
                let parent = &self.v[(i - 1) / ARITY];
                assert!(
                    !less(e, parent, slots),
                    "heap order broken at {i}: {e:?} before its parent {parent:?}"
                );
            }
            let s = slots
                .get(e.slot() as usize)
                .unwrap_or_else(|| panic!("heap entry {e:?} points at a free slot"));
            assert_eq!(
                slots.heap_pos(e.slot()) as usize,
                i,
                "slot of {e:?} records another position"
            );
            assert_eq!(e.tie, tie_of(s.id), "tie of {e:?}");
        }
    }
}
