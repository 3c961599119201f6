//! The arena of task slots: a slab (keys reused through a free list, so lists, towers and the
//! heap link tasks by a `u32`) stored in fixed chunks of [`CHUNK`] slots instead of one
//! vector. One vector doubles by moving every slot — at 8M tasks of 96 bytes that is 768 MB
//! remapped in one put (~2.5 ms, and growing with the arena) — while a chunk is allocated
//! once, filled in place and never moved: growing costs one allocation of untouched pages,
//! whatever the size. A lookup pays one extra load (the chunk's address, from a table that
//! stays in cache).

use std::ops::{Index, IndexMut};

/// Slots per chunk: 3 MiB of 48-byte slots, small enough to allocate in microseconds, large
/// enough that the chunk table stays a few cache lines. Unit tests use small chunks to cross
/// their boundaries often.
#[cfg(not(test))]
const CHUNK_BITS: u32 = 16;
#[cfg(test)]
const CHUNK_BITS: u32 = 6;
const CHUNK: usize = 1 << CHUNK_BITS;
const NONE: u32 = u32::MAX;

pub(crate) enum Entry<T> {
    /// A free slot, linking the next free one (`NONE` ends the list).
    Vacant(u32),
    Occupied(T),
}

/// A slab in chunks. Keys are `u32` (the caller bounds how many are live).
pub(crate) struct Arena<T> {
    /// Each chunk is allocated with room for `CHUNK` entries and only ever pushed to, so its
    /// entries never move.
    chunks: Vec<Vec<Entry<T>>>,
    free: u32,
    len: usize,
    /// Entries ever used: the next new key. Chunks past it are reserved and empty.
    end: usize,
    /// Chunks before this index that lie past `end` were handed in already faulted in
    /// ([`Arena::add_chunk`]); the next one handed in goes here or further.
    faulted: usize,
}

/// A chunk's memory: room for [`CHUNK`] entries.
pub(crate) type Chunk<T> = Vec<Entry<T>>;

/// Bytes of a page: one write into each faults it in.
pub(crate) const PAGE: usize = 4096;

impl<T> Default for Arena<T> {
    fn default() -> Self {
        Arena {
            chunks: Vec::new(),
            free: NONE,
            len: 0,
            end: 0,
            faulted: 0,
        }
    }
}

#[inline]
fn split(k: usize) -> (usize, usize) {
    (k >> CHUNK_BITS, k & (CHUNK - 1))
}

impl<T> Arena<T> {
    /// Bytes an entry takes: the value's size when a field of it lends the niche that tells a
    /// free entry from a live one.
    pub const ENTRY_BYTES: usize = std::mem::size_of::<Entry<T>>();

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Entries allocated (live, free and not yet used), for memory accounting.
    pub fn capacity(&self) -> usize {
        self.chunks.len() * CHUNK
    }

    /// Entries ever used (live or free): every key handed out is below this.
    pub fn end(&self) -> usize {
        self.end
    }

    /// Allocates the chunks `additional` more entries need now (loading a snapshot).
    pub fn reserve(&mut self, additional: usize) {
        let want = self.end() + additional.saturating_sub(self.free_count_hint());
        while self.capacity() < want {
            self.chunks.push(Vec::with_capacity(CHUNK));
        }
    }

    /// Entries a chunk holds.
    pub const CHUNK_ENTRIES: usize = CHUNK;

    /// A chunk for [`Arena::add_chunk`], its pages faulted in on the calling thread: every
    /// entry written once (each page holds the start of one at least), then the vector
    /// emptied, which leaves the pages mapped.
    pub fn faulted_chunk() -> Chunk<T> {
        let mut c = Vec::with_capacity(CHUNK);
        c.resize_with(CHUNK, || Entry::Vacant(NONE));
        c.clear();
        c
    }

    /// Takes a chunk made by [`Arena::faulted_chunk`] (anywhere) as the first chunk past
    /// the ones in use and the ones handed in before, in place of a reserved one if there
    /// is one there: new keys reach it without a page fault.
    pub fn add_chunk(&mut self, chunk: Chunk<T>) {
        debug_assert!(chunk.is_empty() && chunk.capacity() >= CHUNK);
        let at = self.end.div_ceil(CHUNK).max(self.faulted);
        if at < self.chunks.len() {
            self.chunks[at] = chunk;
        } else {
            self.chunks.push(chunk);
        }
        self.faulted = at + 1;
    }

    /// Whether no chunk handed in waits for the next new keys: the next chunk they open
    /// would be faulted in by the inserts themselves.
    pub fn wants_chunk(&self) -> bool {
        self.faulted <= self.end.div_ceil(CHUNK)
    }

    /// Free entries are reused before new ones; counting them exactly would walk the list.
    fn free_count_hint(&self) -> usize {
        self.end() - self.len
    }

    #[inline]
    pub fn get(&self, k: usize) -> Option<&T> {
        let (c, i) = split(k);
        match self.chunks.get(c)?.get(i)? {
            Entry::Occupied(t) => Some(t),
            Entry::Vacant(_) => None,
        }
    }

    #[inline]
    pub fn get_mut(&mut self, k: usize) -> Option<&mut T> {
        let (c, i) = split(k);
        match self.chunks.get_mut(c)?.get_mut(i)? {
            Entry::Occupied(t) => Some(t),
            Entry::Vacant(_) => None,
        }
    }

    /// Stores `value` and returns its key: the most recently freed one, else the next unused.
    #[inline]
    pub fn insert(&mut self, value: T) -> usize {
        self.len += 1;
        if self.free != NONE {
            let k = self.free as usize;
            let (c, i) = split(k);
            let e = &mut self.chunks[c][i];
            let Entry::Vacant(next) = *e else {
                unreachable!("the free list links vacant entries only")
            };
            self.free = next;
            *e = Entry::Occupied(value);
            return k;
        }
        let k = self.end;
        let (c, _) = split(k);
        if c == self.chunks.len() {
            self.chunks.push(Vec::with_capacity(CHUNK));
        }
        // Pushing into a chunk allocated with room for `CHUNK` never reallocates.
        self.chunks[c].push(Entry::Occupied(value));
        self.end += 1;
        k
    }

    /// Removes and returns the value at `k`. Panics if `k` is not live.
    #[inline]
    pub fn remove(&mut self, k: usize) -> T {
        let (c, i) = split(k);
        let e = &mut self.chunks[c][i];
        match std::mem::replace(e, Entry::Vacant(self.free)) {
            Entry::Occupied(t) => {
                self.free = k as u32;
                self.len -= 1;
                t
            }
            Entry::Vacant(next) => {
                *e = Entry::Vacant(next);
                panic!("arena key {k} is not live")
            }
        }
    }

    /// Live entries in key order.
    pub fn iter(&self) -> impl Iterator<Item = (usize, &T)> {
        self.chunks.iter().enumerate().flat_map(|(c, chunk)| {
            chunk.iter().enumerate().filter_map(move |(i, e)| match e {
                Entry::Occupied(t) => Some(((c << CHUNK_BITS) | i, t)),
                Entry::Vacant(_) => None,
            })
        })
    }
}

impl<T> Index<usize> for Arena<T> {
    type Output = T;
    #[inline]
    fn index(&self, k: usize) -> &T {
        match self.get(k) {
            Some(t) => t,
            None => panic!("arena key {k} is not live"),
        }
    }
}

impl<T> IndexMut<usize> for Arena<T> {
    #[inline]
    fn index_mut(&mut self, k: usize) -> &mut T {
        match self.get_mut(k) {
            Some(t) => t,
            None => panic!("arena key {k} is not live"),
        }
    }
}

impl<T: std::fmt::Debug> std::fmt::Debug for Arena<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Arena")
            .field("len", &self.len)
            .field("chunks", &self.chunks.len())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::BTreeMap;

    proptest! {
        /// Against a map: the same keys live with the same values, freed keys reused last
        /// freed first, and iteration in key order, across chunk boundaries (small values so
        /// thousands of entries are cheap).
        #[test]
        fn matches_a_map(ops in prop::collection::vec((any::<bool>(), any::<u16>()), 0..3000)) {
            let mut a: Arena<u32> = Arena::default();
            let mut m: BTreeMap<usize, u32> = BTreeMap::new();
            let mut freed: Vec<usize> = Vec::new();
            for (n, (put, pick)) in ops.into_iter().enumerate() {
                if put || m.is_empty() {
                    let k = a.insert(n as u32);
                    if let Some(f) = freed.pop() {
                        prop_assert_eq!(k, f, "the last freed key is reused first");
                    }
                    prop_assert!(m.insert(k, n as u32).is_none());
                } else {
                    let k = *m.keys().nth(usize::from(pick) % m.len()).unwrap();
                    prop_assert_eq!(a.remove(k), m.remove(&k).unwrap());
                    prop_assert!(a.get(k).is_none());
                    freed.push(k);
                }
                prop_assert_eq!(a.len(), m.len());
            }
            let got: Vec<_> = a.iter().map(|(k, &v)| (k, v)).collect();
            let want: Vec<_> = m.into_iter().collect();
            prop_assert_eq!(got, want);
        }
    }

    #[test]
    fn chunks_fill_in_place_and_never_move() {
        let mut a: Arena<u64> = Arena::default();
        for n in 0..CHUNK as u64 {
            a.insert(n);
        }
        let first: *const u64 = &a[0];
        assert_eq!(a.capacity(), CHUNK);
        assert_eq!(a.insert(7), CHUNK, "the next key opens a second chunk");
        assert_eq!(a.capacity(), 2 * CHUNK);
        assert!(std::ptr::eq(&a[0], first), "the first chunk did not move");
        assert_eq!(a[CHUNK], 7);
    }

    #[test]
    fn reserved_chunks_are_filled_from_the_first_key() {
        // Reserved chunks are empty vectors: the next key is counted, not read off the last
        // chunk's length (which made a load's keys start past every reserved chunk but one).
        let mut a: Arena<u64> = Arena::default();
        a.reserve(3 * CHUNK);
        assert_eq!(a.capacity(), 3 * CHUNK);
        let keys: Vec<usize> = (0..3 * CHUNK as u64).map(|n| a.insert(n)).collect();
        assert_eq!(keys, (0..3 * CHUNK).collect::<Vec<_>>());
        assert_eq!(
            (a.end(), a.capacity()),
            (3 * CHUNK, 3 * CHUNK),
            "no chunk more"
        );
        assert_eq!(a.iter().count(), 3 * CHUNK);
    }

    #[test]
    fn chunks_handed_in_are_filled_next_wherever_they_go() {
        let mut a: Arena<u64> = Arena::default();
        a.reserve(2 * CHUNK);
        a.insert(0);
        // Mid-chunk: the chunk goes after the one in use, replacing the reserved one...
        assert!(a.wants_chunk());
        a.add_chunk(Arena::faulted_chunk());
        assert!(!a.wants_chunk(), "the next chunk is there");
        // ...and the next one after it, past what was reserved.
        a.add_chunk(Arena::faulted_chunk());
        assert_eq!(a.capacity(), 3 * CHUNK);
        let keys: Vec<usize> = (1..3 * CHUNK as u64).map(|n| a.insert(n)).collect();
        assert_eq!(keys, (1..3 * CHUNK).collect::<Vec<_>>());
        assert_eq!(
            a.capacity(),
            3 * CHUNK,
            "every key in a chunk handed in or reserved"
        );
        assert!((0..3 * CHUNK).all(|k| a[k] == k as u64));
        assert!(a.wants_chunk(), "all used");
        // At a chunk boundary, a late chunk is the very next one.
        a.add_chunk(Arena::faulted_chunk());
        assert_eq!(a.insert(7), 3 * CHUNK);
        assert_eq!(a.capacity(), 4 * CHUNK);
    }

    #[test]
    #[should_panic(expected = "arena key 3 is not live")]
    fn removing_a_free_key_panics_naming_it() {
        let mut a: Arena<u8> = Arena::default();
        for n in 0..5 {
            a.insert(n);
        }
        a.remove(3);
        a.remove(3);
    }
}
