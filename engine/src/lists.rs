//! The per-status lists: an intrusive, doubly linked skiplist over arena slot keys — each tube
//! has one for Ready, Waiting and Buried, each utube one for its Ready tasks but the head.
//! Ready and Buried lists are ordered by (pri, id) (`ByPri`), so the head of a tube's ready
//! list is the next task to take and the head of its buried list the next to kick; Waiting
//! lists by (runat, id) (`ByRunat`), so the head is the task whose delay ends first, which
//! beanstalk's `peek-delayed` and `kick` want (Taken tasks are listed by their session
//! instead, see `sessions.rs`). Links are u32 slot keys, not pointers. Level 0 — the one every
//! operation touches — lives in the task's own slot (`next0`, `prev0`); the upper levels of
//! the one task in four that has them live in a side arena of towers (`Towers`), at an
//! offset the slot records (`Slot::tower`), so the slot stays small.
//!
//! Every level is doubly linked and the list keeps both its heads and its tails (the tail
//! fingers), hence: pop of the head O(height), removal of any node O(height) with no search,
//! append after the tail or before the head O(height) with no search, insertion elsewhere
//! O(log n) expected. Heights come from the queue's own xorshift generator (p = 1/4), so a run
//! is reproducible.

use std::marker::PhantomData;

use crate::slots::Slots;
use crate::Status;
use crate::NIL;

/// Levels at p = 1/4 stay balanced up to 4^16 = 4 billion nodes, past the arena's limit.
pub(crate) const MAX_LEVEL: usize = 16;

/// Upper levels (1..height) of every node taller than 1, as (next, prev) pairs.
#[derive(Debug)]
pub(crate) struct Towers {
    links: Vec<u32>,
    /// Free towers by node height, chained through their own first word (NIL ends a chain): a
    /// freed tower is reused by the next node of that height, and freeing never allocates
    /// (a side list of free towers would grow, and its reallocation would be the slowest step
    /// of a mass expiry).
    free: [u32; MAX_LEVEL + 1],
}

impl Default for Towers {
    fn default() -> Self {
        Towers {
            links: Vec::new(),
            free: [NIL; MAX_LEVEL + 1],
        }
    }
}

impl Towers {
    /// A tower for a node of height `h` (NIL for height 1: level 0 lives in the slot).
    pub fn alloc(&mut self, h: u8) -> u32 {
        if h <= 1 {
            return NIL;
        }
        let off = self.free[h as usize];
        if off != NIL {
            self.free[h as usize] = self.links[off as usize];
            return off;
        }
        let off = self.links.len();
        self.links.resize(off + 2 * (h as usize - 1), NIL);
        u32::try_from(off).expect("tower arena beyond u32 offsets")
    }

    pub fn release(&mut self, h: u8, off: u32) {
        if h > 1 {
            self.links[off as usize] = self.free[h as usize];
            self.free[h as usize] = off;
        }
    }

    /// Bytes held (for the memory figure).
    pub fn capacity_bytes(&self) -> usize {
        4 * self.links.capacity()
    }

    /// Panics unless the towers of live nodes (offset, height) and the free towers are in
    /// bounds and disjoint.
    pub fn check(&self, mut used: Vec<(u32, u8)>) {
        for h in 2..=MAX_LEVEL {
            let mut off = self.free[h];
            while off != NIL {
                used.push((off, h as u8));
                assert!(
                    used.len() <= self.links.len(),
                    "free towers of height {h} loop"
                );
                off = self.links[off as usize];
            }
        }
        used.sort_unstable();
        let mut end = 0usize;
        for (off, h) in used {
            let off = off as usize;
            assert!(off >= end, "towers overlap at offset {off}");
            end = off + 2 * (h as usize - 1);
            assert!(end <= self.links.len(), "tower at {off} beyond the arena");
        }
    }
}

/// What a skiplist is ordered by: a key read from the slot, made unique by the id. The key
/// must not change while the node is listed (a Waiting task's runat changes only by leaving
/// and re-entering its list).
pub(crate) trait Order {
    type Key: Ord + Copy + std::fmt::Debug;
    fn key(slots: &Slots, k: u32) -> Self::Key;
}

/// (pri, id): take order (Ready lists) and kick order (Buried lists).
#[derive(Debug)]
pub(crate) struct ByPri;

impl Order for ByPri {
    type Key = (i64, u64);
    #[inline]
    fn key(slots: &Slots, k: u32) -> (i64, u64) {
        let s = &slots[k as usize];
        (s.pri, s.id)
    }
}

/// (runat, id): the order delays end in (Waiting lists; runat is `t` while Waiting).
#[derive(Debug)]
pub(crate) struct ByRunat;

impl Order for ByRunat {
    type Key = (u64, u64);
    #[inline]
    fn key(slots: &Slots, k: u32) -> (u64, u64) {
        (slots.t(k), slots[k as usize].id)
    }
}

#[inline]
fn key<O: Order>(slots: &Slots, k: u32) -> O::Key {
    O::key(slots, k)
}

#[inline]
fn next(slots: &Slots, tw: &Towers, k: u32, i: usize) -> u32 {
    let s = &slots[k as usize];
    if i == 0 {
        s.next0
    } else {
        tw.links[s.tower() as usize + 2 * (i - 1)]
    }
}

#[inline]
fn prev(slots: &Slots, tw: &Towers, k: u32, i: usize) -> u32 {
    let s = &slots[k as usize];
    if i == 0 {
        s.prev0
    } else {
        tw.links[s.tower() as usize + 2 * (i - 1) + 1]
    }
}

#[inline]
fn set_next(slots: &mut Slots, tw: &mut Towers, k: u32, i: usize, v: u32) {
    let s = &mut slots[k as usize];
    if i == 0 {
        s.next0 = v;
    } else {
        tw.links[s.tower() as usize + 2 * (i - 1)] = v;
    }
}

#[inline]
fn set_prev(slots: &mut Slots, tw: &mut Towers, k: u32, i: usize, v: u32) {
    let s = &mut slots[k as usize];
    if i == 0 {
        s.prev0 = v;
    } else {
        tw.links[s.tower() as usize + 2 * (i - 1) + 1] = v;
    }
}

/// A skiplist ordered by `O` (`ByPri` unless named).
#[derive(Debug)]
pub(crate) struct SkipList<O: Order = ByPri> {
    /// First node at each level (NIL when the level is empty).
    head: [u32; MAX_LEVEL],
    /// Last node at each level: the tail fingers that make appends search-free.
    tail: [u32; MAX_LEVEL],
    /// Levels in use: `head[i] != NIL` exactly for `i < levels`.
    levels: usize,
    len: usize,
    order: PhantomData<O>,
}

impl<O: Order> Default for SkipList<O> {
    fn default() -> Self {
        SkipList {
            head: [NIL; MAX_LEVEL],
            tail: [NIL; MAX_LEVEL],
            levels: 0,
            len: 0,
            order: PhantomData,
        }
    }
}

impl<O: Order> SkipList<O> {
    pub fn len(&self) -> usize {
        self.len
    }

    /// The node with the lowest key. O(1).
    pub fn first(&self) -> Option<u32> {
        (self.head[0] != NIL).then_some(self.head[0])
    }

    /// Calls `f` with every node, in key order. O(n).
    pub fn for_each(&self, slots: &Slots, mut f: impl FnMut(u32)) {
        let mut k = self.head[0];
        while k != NIL {
            f(k);
            k = slots[k as usize].next0;
        }
    }

    /// Links node `k` (not in any list) at its place by its key.
    pub fn insert(&mut self, slots: &mut Slots, tw: &mut Towers, k: u32) {
        let h = slots[k as usize].height as usize;
        let kk = key::<O>(slots, k);
        if self.len == 0 || kk > key::<O>(slots, self.tail[0]) {
            // After the tail: the common case for puts (ids only grow) and takes.
            for i in 0..h {
                let p = self.tail[i];
                set_prev(slots, tw, k, i, p);
                set_next(slots, tw, k, i, NIL);
                if p == NIL {
                    self.head[i] = k;
                } else {
                    set_next(slots, tw, p, i, k);
                }
                self.tail[i] = k;
            }
        } else if kk < key::<O>(slots, self.head[0]) {
            // Before the head: a released task that was the oldest goes back first.
            for i in 0..h {
                let n = self.head[i];
                set_next(slots, tw, k, i, n);
                set_prev(slots, tw, k, i, NIL);
                if n == NIL {
                    self.tail[i] = k;
                } else {
                    set_prev(slots, tw, n, i, k);
                }
                self.head[i] = k;
            }
        } else {
            debug_assert_ne!(kk, key::<O>(slots, self.tail[0]), "{kk:?} listed twice");
            let top = self.levels.max(h);
            let mut x = NIL; // NIL stands for the list head here
            for i in (0..top).rev() {
                loop {
                    let nx = if x == NIL {
                        self.head[i]
                    } else {
                        next(slots, tw, x, i)
                    };
                    if nx != NIL && key::<O>(slots, nx) < kk {
                        x = nx;
                    } else {
                        break;
                    }
                }
                if i < h {
                    self.link_after(slots, tw, x, k, i);
                }
            }
        }
        self.levels = self.levels.max(h);
        self.len += 1;
    }

    fn link_after(&mut self, slots: &mut Slots, tw: &mut Towers, x: u32, k: u32, i: usize) {
        let n = if x == NIL {
            self.head[i]
        } else {
            next(slots, tw, x, i)
        };
        set_next(slots, tw, k, i, n);
        set_prev(slots, tw, k, i, x);
        if x == NIL {
            self.head[i] = k;
        } else {
            set_next(slots, tw, x, i, k);
        }
        if n == NIL {
            self.tail[i] = k;
        } else {
            set_prev(slots, tw, n, i, k);
        }
    }

    /// Unlinks node `k` from this list. O(height), no search.
    pub fn remove(&mut self, slots: &mut Slots, tw: &mut Towers, k: u32) {
        let h = slots[k as usize].height as usize;
        for i in 0..h {
            let p = prev(slots, tw, k, i);
            let n = next(slots, tw, k, i);
            if p == NIL {
                self.head[i] = n;
            } else {
                set_next(slots, tw, p, i, n);
            }
            if n == NIL {
                self.tail[i] = p;
            } else {
                set_prev(slots, tw, n, i, p);
            }
        }
        while self.levels > 0 && self.head[self.levels - 1] == NIL {
            self.levels -= 1;
        }
        self.len -= 1;
    }

    /// Panics unless every level is sorted by key, doubly linked consistently, ends at
    /// its tail, holds exactly the nodes of this status tall enough for it, and `levels` and
    /// `len` are right. Returns the count. O(n).
    pub fn check(&self, slots: &Slots, tw: &Towers, status: Status) -> usize {
        let mut tall = [0usize; MAX_LEVEL];
        for i in 0..MAX_LEVEL {
            if i >= self.levels {
                assert_eq!(
                    (self.head[i], self.tail[i]),
                    (NIL, NIL),
                    "{status:?} list: level {i} above {} in use",
                    self.levels
                );
                assert_eq!(
                    tall[i], 0,
                    "{status:?} list: nodes taller than {} levels",
                    self.levels
                );
                continue;
            }
            let (mut k, mut p, mut count) = (self.head[i], NIL, 0usize);
            while k != NIL {
                let s = slots
                    .get(k as usize)
                    .unwrap_or_else(|| panic!("{status:?} list links free slot {k} at level {i}"));
                assert_eq!(
                    s.status, status,
                    "task {} ({:?}) in the {status:?} list",
                    s.id, s.status
                );
                assert!(
                    s.height as usize > i,
                    "task {} of height {} at level {i}",
                    s.id,
                    s.height
                );
                assert_eq!(
                    prev(slots, tw, k, i),
                    p,
                    "{status:?} list: back link of {} at {i}",
                    s.id
                );
                if p != NIL {
                    assert!(
                        key::<O>(slots, p) < key::<O>(slots, k),
                        "{status:?} list unsorted at level {i}"
                    );
                }
                if i == 0 {
                    for t in tall.iter_mut().take(s.height as usize) {
                        *t += 1;
                    }
                }
                count += 1;
                assert!(count <= slots.len(), "{status:?} list: cycle at level {i}");
                p = k;
                k = next(slots, tw, k, i);
            }
            assert_eq!(p, self.tail[i], "{status:?} list: tail finger of level {i}");
            assert_eq!(
                count, tall[i],
                "{status:?} list: level {i} misses tall nodes"
            );
        }
        assert_eq!(tall[0], self.len, "{status:?} list: length");
        tall[0]
    }
}
