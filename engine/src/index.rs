//! The id index: task id → arena key, an open-addressing table (linear probing) that grows
//! without ever stopping the loop to rehash. When the table passes its load limit, a table of
//! twice the size takes the inserts and every insert moves a few buckets of the old table into
//! it ([`MIGRATE_STEP`]); lookups look in both until the old one is empty and freed. So the
//! cost of growing is spread over the inserts that cause it instead of falling on one put (a
//! one-shot rehash of 7M ids reads 7M random slots: ~0.7 s in which no client is answered).
//! The old table is walked from its end down and shrunk as the walk goes ([`SHRINK_BUCKETS`]
//! at a time), so its memory goes back in small pieces: freeing a 32 MB table at once costs
//! ~1 ms of page unmapping. The walk first moves the run of entries at the start of the old
//! table (the only ones a probe can reach by wrapping past its end), so a probe of the old
//! table never leaves the window between that run and the walk.
//!
//! A bucket is a `u32`: 0 is empty, so a new table is zero pages from the allocator that cost
//! nothing until they are written (a table that must first be filled with a marker, as
//! hashbrown's control bytes are, costs ~6 ms per 16M buckets). The low [`KEY_BITS`] hold
//! `key + 1`, the top 4 bits how far the entry sits from its home bucket (15: that far or
//! more). The distance filters a probe without reading the slot: an entry whose home differs
//! from the id's cannot be it, so a lookup reads the slot of the right task and almost never
//! another. Deletion shifts the following entries back (no tombstones in the live table), and
//! the distance says which can move, again without reading their slots. The table stores no
//! ids: `id_of(key)` reads them from the arena, which holds them anyway.

use crate::TaskId;

/// Arena keys stored in a bucket: `key + 1` must fit under the distance bits and differ from
/// [`GONE`], so keys go up to `2^28 - 3` (268M tasks, more than the memory of the machines
/// tarq runs on holds at ~100 bytes a task).
pub(crate) const KEY_BITS: u32 = 28;
/// The largest key the index stores.
pub(crate) const MAX_KEY: u32 = (1 << KEY_BITS) - 3;
const KEY_MASK: u32 = (1 << KEY_BITS) - 1;
/// Distances 0..=14 are exact; 15 means "15 or more" (the slot is read to know).
const FAR: u32 = 15;
/// A deleted entry of the table being emptied (the live table shifts instead).
const GONE: u32 = u32::MAX;
/// Buckets of the old table moved per insert. The old table holds at most 3/4 of its buckets,
/// the new one has twice as many and the same limit, so any step over 1.34 empties the old
/// table before the new one fills; 8 keeps the two-table phase short.
const MIGRATE_STEP: usize = 8;
const MIN_BUCKETS: usize = 16;
/// The old table gives back its walked tail in pieces of this many buckets (256 KB).
const SHRINK_BUCKETS: usize = 1 << 16;

#[inline]
fn pack(key: u32, dist: usize) -> u32 {
    debug_assert!(key <= MAX_KEY);
    ((dist.min(FAR as usize) as u32) << KEY_BITS) | (key + 1)
}

#[inline]
fn key_of(e: u32) -> u32 {
    (e & KEY_MASK) - 1
}

#[inline]
fn stored_dist(e: u32) -> usize {
    (e >> KEY_BITS) as usize
}

/// One open-addressing table of a power-of-two size.
struct Table {
    buckets: Vec<u32>,
    mask: usize,
    /// Live entries (not counting `GONE`).
    len: usize,
}

impl Table {
    fn with_buckets(n: usize) -> Table {
        debug_assert!(n.is_power_of_two());
        Table {
            // `vec![0; n]` asks the allocator for zeroed memory: fresh pages, no writes.
            buckets: vec![0; n],
            mask: n - 1,
            len: 0,
        }
    }

    /// Entries allowed before the table grows: 3/4 of the buckets keeps linear probes short
    /// (~2.5 buckets to find an entry, ~8.5 to find a free one).
    fn limit(&self) -> usize {
        self.buckets.len() / 4 * 3
    }

    /// The bucket holding `id` (home `h`), probing at most up to `end` (exclusive) when given
    /// (the old table's window: no wrap past it) and around the table otherwise.
    #[inline]
    fn find(
        &self,
        id: TaskId,
        h: u64,
        end: Option<usize>,
        id_of: &impl Fn(u32) -> TaskId,
    ) -> Option<usize> {
        let mut j = h as usize & self.mask;
        let mut dist = 0;
        loop {
            if end.is_some_and(|end| j >= end) {
                return None;
            }
            let e = self.buckets[j];
            if e == 0 {
                return None;
            }
            if e != GONE && stored_dist(e) == dist.min(FAR as usize) && id_of(key_of(e)) == id {
                return Some(j);
            }
            j = (j + 1) & self.mask;
            dist += 1;
        }
    }

    /// Stores `key` in the first free bucket from its home `h`. The table has room.
    #[inline]
    fn insert(&mut self, key: u32, h: u64) {
        let mut j = h as usize & self.mask;
        let mut dist = 0;
        while self.buckets[j] != 0 {
            j = (j + 1) & self.mask;
            dist += 1;
        }
        self.buckets[j] = pack(key, dist);
        self.len += 1;
    }

    /// Empties bucket `i` and shifts back the entries after it that may move (those whose
    /// home is at or before the hole), so no probe chain is cut.
    fn remove_shifting(&mut self, i: usize, hash_of_key: &impl Fn(u32) -> u64) {
        let mut hole = i;
        let mut j = (i + 1) & self.mask;
        loop {
            let e = self.buckets[j];
            if e == 0 {
                break;
            }
            let dist = match stored_dist(e) {
                d if d < FAR as usize => d,
                _ => j.wrapping_sub(hash_of_key(key_of(e)) as usize) & self.mask,
            };
            let gap = j.wrapping_sub(hole) & self.mask;
            if dist >= gap {
                self.buckets[hole] = pack(key_of(e), dist - gap);
                hole = j;
            }
            j = (j + 1) & self.mask;
        }
        self.buckets[hole] = 0;
        self.len -= 1;
    }
}

/// Where [`IdIndex::find`] found an id, for [`IdIndex::remove_found`].
#[derive(Clone, Copy, Debug)]
pub(crate) struct Found {
    pub key: u32,
    bucket: usize,
    in_old: bool,
}

/// Task id → arena key. See the module doc.
pub(crate) struct IdIndex {
    live: Table,
    /// The table being emptied into `live`. Its buckets `..=head` (the run at its start, up to
    /// its first empty bucket) and `walked..` are moved; `walked..` is also given back.
    old: Option<Table>,
    head: usize,
    walked: usize,
}

impl Default for IdIndex {
    fn default() -> Self {
        IdIndex {
            live: Table::with_buckets(MIN_BUCKETS),
            old: None,
            head: 0,
            walked: 0,
        }
    }
}

impl std::fmt::Debug for IdIndex {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IdIndex")
            .field("len", &self.len())
            .field("buckets", &self.buckets())
            .field("moving", &self.old.is_some())
            .finish()
    }
}

impl IdIndex {
    pub fn len(&self) -> usize {
        self.live.len + self.old.as_ref().map_or(0, |t| t.len)
    }

    /// Buckets allocated, in both tables (for memory accounting).
    pub fn buckets(&self) -> usize {
        self.live.buckets.len() + self.old.as_ref().map_or(0, |t| t.buckets.len())
    }

    /// Finds `id` (whose hash is `hash(id)`); `id_of` reads the id of the task at a key.
    #[inline]
    pub fn find(
        &self,
        id: TaskId,
        hash: impl Fn(TaskId) -> u64,
        id_of: impl Fn(u32) -> TaskId,
    ) -> Option<Found> {
        let h = hash(id);
        if let Some(j) = self.live.find(id, h, None, &id_of) {
            return Some(Found {
                key: key_of(self.live.buckets[j]),
                bucket: j,
                in_old: false,
            });
        }
        let old = self.old.as_ref()?;
        // A home in the moved head run or the walked tail: anything of it still in the old
        // table would sit in the head run (chains stop at empty buckets), which is moved.
        let home = h as usize & old.mask;
        if home <= self.head || home >= self.walked {
            return None;
        }
        let j = old.find(id, h, Some(self.walked), &id_of)?;
        Some(Found {
            key: key_of(old.buckets[j]),
            bucket: j,
            in_old: true,
        })
    }

    /// Removes what `find` found (nothing may change the index in between).
    pub fn remove_found(&mut self, f: Found, hash_of_key: impl Fn(u32) -> u64) {
        if f.in_old {
            let old = self.old.as_mut().expect("found in the old table");
            old.buckets[f.bucket] = GONE;
            old.len -= 1;
            if old.len == 0 {
                self.old = None;
            }
        } else {
            self.live.remove_shifting(f.bucket, &hash_of_key);
        }
    }

    /// Adds `key` for an id not in the index; `hash_of_key` hashes the id of the task at a
    /// key (the new one included).
    pub fn insert(&mut self, key: u32, hash_of_key: impl Fn(u32) -> u64) {
        if self.old.is_some() {
            self.migrate(MIGRATE_STEP, &hash_of_key);
        } else if self.live.len >= self.live.limit() {
            self.start_migration(&hash_of_key);
        }
        self.live.insert(key, hash_of_key(key));
    }

    /// Makes room for `additional` more ids at once (loading a snapshot of known size): one
    /// full move now instead of many doublings, when nobody is waiting for answers.
    pub fn reserve(&mut self, additional: usize, hash_of_key: impl Fn(u32) -> u64) {
        let want = self.len() + additional;
        if want <= self.live.limit() {
            return;
        }
        self.migrate(usize::MAX, &hash_of_key);
        let mut n = self.live.buckets.len();
        while n / 4 * 3 < want {
            n *= 2;
        }
        let old = std::mem::replace(&mut self.live, Table::with_buckets(n));
        for &e in old.buckets.iter().filter(|&&e| e != 0) {
            self.live.insert(key_of(e), hash_of_key(key_of(e)));
        }
    }

    /// Puts a table of twice the size in place and moves the old table's head run into it at
    /// once (a few entries: the run up to the first empty bucket).
    fn start_migration(&mut self, hash_of_key: &impl Fn(u32) -> u64) {
        let bigger = Table::with_buckets(self.live.buckets.len() * 2);
        let mut old = std::mem::replace(&mut self.live, bigger);
        let head = old
            .buckets
            .iter()
            .position(|&e| e == 0)
            .expect("a table under its load limit has an empty bucket");
        for j in 0..head {
            let e = old.buckets[j];
            self.live.insert(key_of(e), hash_of_key(key_of(e)));
            old.len -= 1;
        }
        self.head = head;
        self.walked = old.buckets.len();
        self.old = Some(old);
        self.migrate(MIGRATE_STEP, hash_of_key);
    }

    /// Moves up to `steps` buckets of the old table's unwalked window (from its end down) into
    /// the live one, gives back the walked tail in `SHRINK_BUCKETS` pieces, and drops the old
    /// table when the window is walked.
    fn migrate(&mut self, steps: usize, hash_of_key: &impl Fn(u32) -> u64) {
        let Some(old) = self.old.as_mut() else {
            return;
        };
        let stop = self.walked.saturating_sub(steps).max(self.head + 1);
        for j in (stop..self.walked).rev() {
            let e = old.buckets[j];
            if e != 0 && e != GONE {
                self.live.insert(key_of(e), hash_of_key(key_of(e)));
                old.len -= 1;
            }
        }
        self.walked = stop;
        if self.walked == self.head + 1 {
            debug_assert_eq!(old.len, 0, "the old table is empty once walked");
            self.old = None;
        } else if old.buckets.len() - self.walked >= SHRINK_BUCKETS {
            old.buckets.truncate(self.walked);
            old.buckets.shrink_to(self.walked);
        }
    }

    /// Panics unless every entry sits where a probe finds it, with its distance right, and the
    /// counts match. Returns the keys stored, for the caller to compare with the arena.
    pub fn check(&self, hash_of_key: impl Fn(u32) -> u64) -> Vec<u32> {
        let mut keys = Vec::with_capacity(self.len());
        let count = |t: &Table, window: std::ops::Range<usize>, keys: &mut Vec<u32>| {
            let mut n = 0;
            for (j, &e) in t.buckets.iter().enumerate() {
                if e == 0 || e == GONE || !window.contains(&j) {
                    continue;
                }
                let home = hash_of_key(key_of(e)) as usize & t.mask;
                let dist = j.wrapping_sub(home) & t.mask;
                assert_eq!(
                    stored_dist(e),
                    dist.min(FAR as usize),
                    "key {} at {j} from home {home}",
                    key_of(e)
                );
                // Every bucket from home up to here is in use, so a probe reaches it.
                for d in 0..dist {
                    assert_ne!(
                        t.buckets[(home + d) & t.mask],
                        0,
                        "gap before key {}",
                        key_of(e)
                    );
                }
                keys.push(key_of(e));
                n += 1;
            }
            assert_eq!(n, t.len, "table counts {} entries, holds {n}", t.len);
        };
        count(&self.live, 0..self.live.buckets.len(), &mut keys);
        if let Some(old) = &self.old {
            count(old, self.head + 1..self.walked, &mut keys);
        }
        keys
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::HashMap;

    /// A stand-in arena: key → id, and a hash that is deliberately poor (many ids share a
    /// home) so chains, wrap-around and far entries are exercised in small tables.
    struct Arena {
        ids: HashMap<u32, TaskId>,
    }

    fn poor_hash(id: TaskId) -> u64 {
        (id % 7) * 3 + (id >> 4)
    }

    impl Arena {
        fn id(&self, k: u32) -> TaskId {
            self.ids[&k]
        }
    }

    #[derive(Debug, Clone)]
    enum Op {
        Insert,
        Remove(usize),
        Reserve(u8),
    }

    fn ops() -> impl Strategy<Value = Vec<Op>> {
        prop::collection::vec(
            prop_oneof![
                6 => Just(Op::Insert),
                4 => any::<usize>().prop_map(Op::Remove),
                1 => any::<u8>().prop_map(Op::Reserve),
            ],
            0..600,
        )
    }

    fn run(ops: &[Op], hash: fn(TaskId) -> u64) {
        let mut ix = IdIndex::default();
        let mut arena = Arena {
            ids: HashMap::new(),
        };
        let mut free: Vec<u32> = Vec::new();
        let mut next_key = 0;
        let mut next_id: TaskId = 1;
        for op in ops {
            match *op {
                Op::Insert => {
                    let k = free.pop().unwrap_or_else(|| {
                        next_key += 1;
                        next_key - 1
                    });
                    arena.ids.insert(k, next_id);
                    next_id += 1;
                    ix.insert(k, |k| hash(arena.id(k)));
                }
                Op::Remove(pick) => {
                    if arena.ids.is_empty() {
                        continue;
                    }
                    let mut keys: Vec<_> = arena.ids.keys().copied().collect();
                    keys.sort_unstable();
                    let k = keys[pick % keys.len()];
                    let id = arena.id(k);
                    let f = ix
                        .find(id, hash, |k| arena.id(k))
                        .expect("a live id is found");
                    assert_eq!(f.key, k);
                    ix.remove_found(f, |k| hash(arena.id(k)));
                    arena.ids.remove(&k);
                    free.push(k);
                    assert!(ix.find(id, hash, |k| arena.id(k)).is_none());
                }
                Op::Reserve(n) => ix.reserve(usize::from(n), |k| hash(arena.id(k))),
            }
            let mut stored = ix.check(|k| hash(arena.id(k)));
            stored.sort_unstable();
            let mut want: Vec<_> = arena.ids.keys().copied().collect();
            want.sort_unstable();
            assert_eq!(stored, want);
            assert_eq!(ix.len(), arena.ids.len());
        }
        for (&k, &id) in &arena.ids {
            assert_eq!(ix.find(id, hash, |k| arena.id(k)).map(|f| f.key), Some(k));
        }
        for gone in [0, next_id, next_id + 100] {
            assert!(ix.find(gone, hash, |k| arena.id(k)).is_none());
        }
    }

    proptest! {
        #[test]
        fn matches_a_map_through_growth_and_removal(ops in ops()) {
            run(&ops, poor_hash);
        }

        #[test]
        fn matches_a_map_with_the_real_hash(ops in ops()) {
            run(&ops, crate::queue::hash_id);
        }
    }

    #[test]
    fn growing_moves_a_few_buckets_per_insert_and_frees_the_old_table() {
        let mut ix = IdIndex::default();
        let h = |k: u32| crate::queue::hash_id(u64::from(k) + 1);
        for k in 0..12 {
            ix.insert(k, h);
        }
        assert!(
            ix.old.is_none(),
            "12 of 16 buckets is the limit, not past it"
        );
        ix.insert(12, h);
        assert_eq!(ix.buckets(), 16 + 32, "both tables while moving");
        ix.insert(13, h);
        assert!(ix.old.is_none(), "16 buckets move in two inserts of 8");
        assert_eq!(ix.buckets(), 32);
        assert_eq!(ix.check(h).len(), 14);
    }

    #[test]
    fn far_entries_are_found_and_shift_back() {
        // Every id has the same home: distances run past 15, where the slot is read.
        let same = |_: TaskId| 5u64;
        let mut ix = IdIndex::default();
        let ids: Vec<TaskId> = (100..130).collect();
        let id_of = |k: u32| ids[k as usize];
        ix.reserve(40, |_| 5);
        for k in 0..ids.len() as u32 {
            ix.insert(k, |_| 5);
        }
        let f = ix.find(100, same, id_of).unwrap();
        ix.remove_found(f, |_| 5);
        for (k, &id) in ids.iter().enumerate().skip(1) {
            assert_eq!(ix.find(id, same, id_of).unwrap().key, k as u32);
        }
        ix.check(|_| 5);
    }
}
