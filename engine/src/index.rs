//! The id index: task id → arena key, an open-addressing table that grows without ever
//! stopping the loop to rehash. When the table passes its load limit, a table of twice the size
//! takes the inserts, and every insert moves a few more tasks into it by walking the *arena*
//! in order ([`MIGRATE_STEP`] positions): the walk reads the ids of the tasks present when the
//! move began slot after slot, as a stream, and enters each in the new table. Lookups look in
//! the new table, then in the old one, until the walk reaches the end of the arena the move
//! began with; the old table is then given back in [`SHRINK_BUCKETS`] pieces (freeing a 32 MB
//! table at once costs ~1 ms of page unmapping). So the cost of growing is spread over the
//! inserts that cause it instead of falling on one put (a one-shot rehash of 7M ids reads 7M
//! random slots: ~0.45 s in which no client is answered). The walk follows the arena, not the
//! old table: the old table holds keys in hash order, so walking it would read each moved id
//! from a random slot, a cache miss each: in a fresh server taking `put_many` such a move
//! takes 18% of the loop's time.
//!
//! During a move every task is in exactly one place that a lookup trusts: a task present when
//! the move began and not yet walked (its arena position at or past the walk) is in the old
//! table only; one walked, or put since (always entered in the new table at once), is in the
//! new table. The old table keeps its entries for walked positions, but a lookup ignores them
//! (their key is below the walk), so it needs no update but a deleted mark ([`GONE`]) for a
//! task removed before the walk reached it. A slot freed and reused by a new task before the
//! walk reaches it is already in the new table: the walk's insert finds the key on the probe
//! it makes anyway and leaves it.
//!
//! **Lanes.** The table is a row of blocks of [`LANES`] buckets, and an id's hash picks a
//! block and a lane; a probe steps from block to block *within its lane*. The hash gives the 8
//! ids of a run (`id >> 3`) one block and 8 distinct lanes, so FIFO traffic (put n, n+1, ...;
//! ack in the same order) touches one cache line per 8 ids, and the ids of a run never compete
//! for a bucket: each lane is its own linear-probing table of short chains. (Probing bucket by
//! bucket instead, a run's 8 ids collide with a whole other run at once: at half load the
//! chains a deletion walks run to hundreds of buckets.)
//!
//! A bucket is a `u32`: 0 is empty, so a new table is zero pages from the allocator that cost
//! nothing until they are written (a table that must first be filled with a marker, as
//! hashbrown's control bytes are, costs ~6 ms per 16M buckets). The low [`KEY_BITS`] hold
//! `key + 1`, the top 4 bits how many blocks the entry sits past its home (15: that many or
//! more). The distance filters a probe without reading the slot: an entry whose home differs
//! from the id's cannot be it, so a lookup reads the slot of the right task and almost never
//! another. Deletion shifts the following entries of the lane back (no tombstones in the live
//! table), and the distance says which can move, again without reading their slots. The table
//! stores no ids: `id_of(key)` reads them from the arena, which holds them anyway.

use crate::TaskId;
use std::hash::Hasher;

/// Arena keys stored in a bucket: `key + 1` must fit under the distance bits and differ from
/// [`GONE`], so keys go up to `2^28 - 3` (268M tasks, more than the memory of the machines
/// tarq runs on holds at ~100 bytes a task).
pub(crate) const KEY_BITS: u32 = 28;
/// The largest key the index stores.
pub(crate) const MAX_KEY: u32 = (1 << KEY_BITS) - 3;
const KEY_MASK: u32 = (1 << KEY_BITS) - 1;
/// Distances 0..=14 (in blocks) are exact; 15 means "15 or more" (the slot is read to know).
const FAR: u32 = 15;
/// A deleted entry of the old table during a move (the live table shifts instead).
const GONE: u32 = u32::MAX;
/// Buckets per block: the ids of one run, one per lane.
const LANES: usize = 8;
/// Arena positions walked per insert during a move. The arena never holds more tasks than
/// the index has held, and the index holds at most 3/4 of its buckets, so the walk covers at
/// most 3/4 of the old table's size in positions while the new table (twice the buckets, the
/// same limit) has room for as many inserts again: any step of 1 or more ends the walk before
/// the new table fills; 8 keeps the two-table phase short (a walked slot is a sequential read).
const MIGRATE_STEP: usize = LANES;
/// Eight blocks: each lane has 8 buckets, so its 7/8 limit leaves a lane room for 7 entries.
const MIN_BUCKETS: usize = 8 * LANES;
/// The old table gives back its walked tail in pieces of this many buckets (256 KB; unit
/// tests shrink small tables too).
#[cfg(not(test))]
const SHRINK_BUCKETS: usize = 1 << 16;
#[cfg(test)]
const SHRINK_BUCKETS: usize = 2 * LANES;

/// A mix of the id's run: a folded 64x64->128 multiply, every output bit depending on every
/// input bit.
#[inline]
pub(crate) fn fold_mul(x: u64) -> u64 {
    let p = u128::from(x) * 0x9E37_79B9_7F4A_7C15;
    (p as u64) ^ ((p >> 64) as u64)
}

/// Session ids are small counters: one multiply spreads them (SipHash costs ~20 ns).
#[derive(Default, Clone, Copy)]
pub(crate) struct IdHasher(u64);

impl Hasher for IdHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.write_u64(self.0 ^ u64::from(b));
        }
    }
    fn write_u64(&mut self, n: u64) {
        self.0 = fold_mul(n);
    }
}

/// Hash of a task id: the block comes from the mix of its run, the lane (low 3 bits) is the
/// id's place in the run rotated by the run's mix, so the 8 ids of a run take 8 lanes of one
/// block and no stride of live ids (every 8th, every other) leaves lanes empty and others full.
#[inline]
pub(crate) fn hash_id(id: TaskId) -> u64 {
    let run = fold_mul(id >> 3);
    (run << 3) | (id.wrapping_add(run >> 61) & 7)
}

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

/// One open-addressing table of a power-of-two number of buckets.
struct Table {
    buckets: Vec<u32>,
    mask: usize,
    /// Live entries (not counting `GONE`), in all and per lane.
    len: usize,
    lane_len: [usize; LANES],
}

impl Table {
    fn with_buckets(n: usize) -> Table {
        debug_assert!(n.is_power_of_two() && n >= MIN_BUCKETS);
        Table {
            // `vec![0; n]` asks the allocator for zeroed memory: fresh pages, no writes.
            buckets: vec![0; n],
            mask: n - 1,
            len: 0,
            lane_len: [0; LANES],
        }
    }

    /// Whether one more entry in `lane` needs a bigger table: past 3/4 of the buckets in all
    /// (short chains: ~2.5 blocks to find an entry), or at 7/8 of one lane's once the entry is
    /// in (only a skewed set of live ids gets there first). The entry goes in before the table
    /// grows, so the lane limit counts it: a lane must keep an empty bucket, where every probe
    /// of it ends (the smallest table's lanes have 8 buckets, and 7 + the insert filled one).
    fn full_for(&self, lane: usize) -> bool {
        let n = self.buckets.len();
        self.len >= n / 4 * 3 || self.lane_len[lane] + 1 >= n / LANES * 7 / 8
    }

    /// Blocks in a lane: no probe goes further (it would come round to where it began).
    #[inline]
    fn lane_blocks(&self) -> usize {
        (self.mask + 1) / LANES
    }

    /// The distance in blocks from home `home` to bucket `j` of the same lane.
    #[inline]
    fn blocks(&self, home: usize, j: usize) -> usize {
        (j.wrapping_sub(home) & self.mask) / LANES
    }

    /// The bucket holding `id` (home `h`). `min_key`: in the old table during a move, entries
    /// with a smaller key are walked copies (or stale) and are passed over.
    #[inline]
    fn find(
        &self,
        id: TaskId,
        h: u64,
        min_key: u32,
        id_of: &impl Fn(u32) -> TaskId,
    ) -> Option<usize> {
        let mut j = h as usize & self.mask;
        let mut dist = 0;
        loop {
            let e = self.buckets[j];
            // A lane always keeps an empty bucket (`full_for`); the bound is the backstop
            // that keeps a lookup finite if it ever did not.
            if e == 0 || dist == self.lane_blocks() {
                return None;
            }
            if e != GONE
                && stored_dist(e) == dist.min(FAR as usize)
                && key_of(e) >= min_key
                && id_of(key_of(e)) == id
            {
                return Some(j);
            }
            j = (j + LANES) & self.mask;
            dist += 1;
        }
    }

    /// Stores `key` in the first free bucket of its lane from its home `h`. The lane has room.
    #[inline]
    fn insert(&mut self, key: u32, h: u64) {
        self.insert_absent(key, h);
    }

    /// [`insert`](Self::insert) unless `key` is already on the probe from `h` (every bucket up
    /// to the first free one, which the insert reads anyway): false then. No slot is read.
    #[inline]
    fn insert_absent(&mut self, key: u32, h: u64) -> bool {
        // `full_for` keeps an empty bucket in every lane, where this probe ends.
        debug_assert!(
            self.lane_len[h as usize % LANES] + 1 < self.lane_blocks(),
            "a lane keeps an empty bucket"
        );
        let mut j = h as usize & self.mask;
        let mut dist = 0;
        loop {
            let e = self.buckets[j];
            if e == 0 {
                break;
            }
            if key_of(e) == key && e != GONE {
                return false;
            }
            j = (j + LANES) & self.mask;
            dist += 1;
        }
        self.buckets[j] = pack(key, dist);
        self.len += 1;
        self.lane_len[j % LANES] += 1;
        true
    }

    /// Empties bucket `i` and shifts back the entries after it in its lane that may move
    /// (those whose home is at or before the hole), so no probe chain is cut.
    fn remove_shifting(&mut self, i: usize, hash_of_key: &impl Fn(u32) -> u64) {
        let mut hole = i;
        let mut j = (i + LANES) & self.mask;
        loop {
            let e = self.buckets[j];
            if e == 0 {
                break;
            }
            let dist = match stored_dist(e) {
                d if d < FAR as usize => d,
                _ => self.blocks(hash_of_key(key_of(e)) as usize & self.mask, j),
            };
            let gap = self.blocks(hole, j);
            if dist >= gap {
                self.buckets[hole] = pack(key_of(e), dist - gap);
                hole = j;
            }
            j = (j + LANES) & self.mask;
        }
        self.buckets[hole] = 0;
        self.len -= 1;
        self.lane_len[i % LANES] -= 1;
    }

    /// Marks a bucket of the old table deleted (its chains stay whole).
    fn remove_marking(&mut self, i: usize) {
        self.buckets[i] = GONE;
        self.len -= 1;
        self.lane_len[i % LANES] -= 1;
    }

    /// Live entries of `range`, as (bucket, key).
    fn entries(
        &self,
        range: std::ops::Range<usize>,
    ) -> impl DoubleEndedIterator<Item = (usize, u32)> + '_ {
        self.buckets[range.clone()]
            .iter()
            .zip(range)
            .filter(|&(&e, _)| e != 0 && e != GONE)
            .map(|(&e, j)| (j, key_of(e)))
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
    /// During a move, the table before: trusted only for keys at or past `walk`.
    old: Option<Table>,
    /// The next arena position the move walks, and where it stops (the arena's end when the
    /// move began: every task present then is below it).
    walk: u32,
    walk_end: u32,
    /// Tasks still only in `old`: present when the move began, not walked, not removed.
    pending: usize,
    /// The old table after its move, given back a piece per insert.
    retired: Option<Table>,
}

impl Default for IdIndex {
    fn default() -> Self {
        IdIndex {
            live: Table::with_buckets(MIN_BUCKETS),
            old: None,
            walk: 0,
            walk_end: 0,
            pending: 0,
            retired: None,
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
        self.live.len + self.pending
    }

    /// Buckets allocated, in every table (for memory accounting).
    pub fn buckets(&self) -> usize {
        let n = |t: &Option<Table>| t.as_ref().map_or(0, |t| t.buckets.len());
        self.live.buckets.len() + n(&self.old) + n(&self.retired)
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
        if let Some(j) = self.live.find(id, h, 0, &id_of) {
            return Some(Found {
                key: key_of(self.live.buckets[j]),
                bucket: j,
                in_old: false,
            });
        }
        let old = self.old.as_ref()?;
        let j = old.find(id, h, self.walk, &id_of)?;
        Some(Found {
            key: key_of(old.buckets[j]),
            bucket: j,
            in_old: true,
        })
    }

    /// Removes what `find` found (nothing may change the index in between).
    pub fn remove_found(&mut self, f: Found, hash_of_key: impl Fn(u32) -> u64) {
        if f.in_old {
            self.old
                .as_mut()
                .expect("found in the old table")
                .remove_marking(f.bucket);
            self.pending -= 1;
        } else {
            self.live.remove_shifting(f.bucket, &hash_of_key);
        }
    }

    /// Adds `key` for an id not in the index. `hash_of_key` hashes the id of the task at a
    /// key (the new one included); `hash_at` the same for any arena position, `None` for a
    /// free one; `arena_end` is the arena's end with the new task in it.
    pub fn insert(
        &mut self,
        key: u32,
        hash_of_key: impl Fn(u32) -> u64,
        hash_at: impl Fn(u32) -> Option<u64>,
        arena_end: usize,
    ) {
        let h = hash_of_key(key);
        let lane = h as usize % LANES;
        // In first: a walk below then finds it indexed and leaves it. A lane at its limit
        // still has free buckets (the limit is 7/8 of them).
        let full = self.live.full_for(lane);
        self.live.insert(key, h);
        if full {
            // A move under way cannot meet the limit (the walk ends first, see MIGRATE_STEP):
            // only a lane skewed past the growth schedule gets here. Finish it.
            self.migrate(usize::MAX, &hash_at);
            self.start_migration(arena_end);
        }
        self.migrate(MIGRATE_STEP, &hash_at);
    }

    /// Asks the CPU for the live table's bucket at home `h` (an insert there comes soon).
    #[inline]
    pub fn prefetch_home(&self, h: u64) {
        crate::prefetch(&self.live.buckets[h as usize & self.live.mask]);
    }

    /// Makes room for `additional` more ids at once (loading a snapshot of known size): one
    /// full rebuild now instead of many doublings, when nobody is waiting for answers.
    /// `live` yields every key the index holds with its hash, in any order: the caller walks
    /// its arena in order, which reads the ids sequentially instead of one cache miss each.
    pub fn reserve(&mut self, additional: usize, live: impl Iterator<Item = (u32, u64)>) {
        let want = self.len() + additional;
        if want <= self.live.buckets.len() / 4 * 3 {
            return;
        }
        let mut n = self.live.buckets.len();
        while n / 4 * 3 < want {
            n *= 2;
        }
        let held = self.len();
        self.old = None;
        self.retired = None;
        self.pending = 0;
        self.live = Table::with_buckets(n);
        for (k, h) in live {
            self.live.insert(k, h);
        }
        assert_eq!(
            self.live.len, held,
            "the keys given are the keys the index held"
        );
    }

    /// Puts a table of twice the size in place; the old one stays for lookups until the walk
    /// has entered every task present now (all below `arena_end`) in the new one.
    fn start_migration(&mut self, arena_end: usize) {
        let bigger = Table::with_buckets(self.live.buckets.len() * 2);
        let old = std::mem::replace(&mut self.live, bigger);
        // A table given back in pieces is dropped whole if a move starts first (it cannot:
        // the pieces take a few hundred inserts, a move comes after a quarter of the table).
        self.retired = None;
        self.pending = old.len;
        self.old = Some(old);
        self.walk = 0;
        self.walk_end = u32::try_from(arena_end).expect("arena keys fit 28 bits");
    }

    /// Walks up to `steps` more arena positions into the live table; once the walk is done the
    /// old table is retired, and a retired table gives back a piece.
    fn migrate(&mut self, steps: usize, hash_at: &impl Fn(u32) -> Option<u64>) {
        if self.old.is_none() {
            if let Some(t) = self.retired.as_mut() {
                let keep = t.buckets.len().saturating_sub(SHRINK_BUCKETS);
                t.buckets.truncate(keep);
                t.buckets.shrink_to(keep);
                if keep == 0 {
                    self.retired = None;
                }
            }
            return;
        }
        let stop = self
            .walk
            .saturating_add(u32::try_from(steps).unwrap_or(u32::MAX))
            .min(self.walk_end);
        for p in self.walk..stop {
            // A task put since the move began is indexed already: the insert leaves it.
            if let Some(h) = hash_at(p) {
                if self.live.insert_absent(p, h) {
                    self.pending -= 1;
                }
            }
        }
        self.walk = stop;
        if self.walk == self.walk_end {
            debug_assert_eq!(self.pending, 0, "every task of the old table is walked");
            self.retired = self.old.take();
            self.pending = 0;
            return;
        }
        // The next step's tasks are the next slots (a sequential read, and in cache for that
        // step then); where they go in the new table is a random bucket, a cache miss the step
        // would wait for. Ask for those lines now, once each: the ids of a run share a block.
        let ahead = stop
            .saturating_add(u32::try_from(steps).unwrap_or(u32::MAX))
            .min(self.walk_end);
        let mut last = usize::MAX;
        for p in stop..ahead {
            if let Some(h) = hash_at(p) {
                let j = h as usize & self.live.mask;
                if j / 16 != last {
                    last = j / 16;
                    crate::prefetch(&self.live.buckets[j]);
                }
            }
        }
    }

    /// Panics unless every entry sits where a probe finds it, with its distance right, and the
    /// counts match. Returns the keys stored, for the caller to compare with the arena.
    pub fn check(&self, hash_of_key: impl Fn(u32) -> u64) -> Vec<u32> {
        let mut keys = Vec::with_capacity(self.len());
        let count = |t: &Table, keys: &mut Vec<u32>| {
            let mut lanes = [0; LANES];
            for (j, k) in t.entries(0..t.buckets.len()) {
                let home = hash_of_key(k) as usize & t.mask;
                assert_eq!(home % LANES, j % LANES, "key {k} at {j} outside its lane");
                let dist = t.blocks(home, j);
                assert_eq!(
                    stored_dist(t.buckets[j]),
                    dist.min(FAR as usize),
                    "key {k} at {j} from home {home}"
                );
                // Every bucket of the lane from home up to here is in use: a probe reaches it.
                for d in 0..dist {
                    assert_ne!(
                        t.buckets[(home + d * LANES) & t.mask],
                        0,
                        "gap before key {k}"
                    );
                }
                keys.push(k);
                lanes[j % LANES] += 1;
            }
            assert_eq!(lanes.iter().sum::<usize>(), t.len, "table counts {}", t.len);
            assert_eq!(lanes, t.lane_len, "lane counts");
        };
        count(&self.live, &mut keys);
        if let Some(old) = &self.old {
            // The entries a lookup trusts: keys not walked yet, each the only copy of its task.
            let from = keys.len();
            keys.extend(
                old.entries(0..old.buckets.len())
                    .filter_map(|(_, k)| (k >= self.walk).then_some(k)),
            );
            assert_eq!(
                keys.len() - from,
                self.pending,
                "tasks only in the old table"
            );
        } else {
            assert_eq!(self.pending, 0, "no move, nothing pending");
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
                    ix.insert(
                        k,
                        |k| hash(arena.id(k)),
                        |p| arena.ids.get(&p).map(|&id| hash(id)),
                        next_key as usize,
                    );
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
                Op::Reserve(n) => {
                    let live = arena.ids.iter().map(|(&k, &id)| (k, hash(id)));
                    ix.reserve(usize::from(n), live)
                }
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
            run(&ops, super::hash_id);
        }
    }

    #[test]
    fn growing_walks_the_arena_a_step_per_insert_and_gives_the_old_table_back() {
        // Keys are arena positions 0..n, each task's hash its key plus 16.
        let h = |k: u32| 16 + u64::from(k);
        let at = |p: u32, n: u32| (p < n).then(|| h(p));
        let mut ix = IdIndex::default();
        for k in 0..48 {
            ix.insert(k, h, |p| at(p, k + 1), k as usize + 1);
        }
        assert!(
            ix.old.is_none(),
            "48 of 64 buckets is the limit, not past it"
        );
        ix.insert(48, h, |p| at(p, 49), 49);
        assert_eq!(ix.buckets(), 64 + 128, "both tables while moving");
        assert_eq!(ix.walk, 8, "the insert that starts the move walks a step");
        for k in 49..54 {
            ix.insert(k, h, |p| at(p, k + 1), k as usize + 1);
            assert!(ix.old.is_some(), "still moving after insert {k}");
            assert_eq!(ix.len(), k as usize + 1);
            ix.check(h);
        }
        ix.insert(54, h, |p| at(p, 55), 55);
        assert!(ix.old.is_none(), "49 positions walked in seven steps");
        assert_eq!(ix.buckets(), 64 + 128, "retired, not given back yet");
        for k in 55..59 {
            ix.insert(k, h, |p| at(p, k + 1), k as usize + 1);
        }
        assert_eq!(ix.buckets(), 128, "given back in four pieces of 16");
        assert_eq!(ix.check(h).len(), 59);
    }

    #[test]
    fn a_slot_reused_before_the_walk_reaches_it_is_indexed_once() {
        let ids: std::cell::RefCell<HashMap<u32, TaskId>> = (0..49)
            .map(|k| (k, 1000 + u64::from(k)))
            .collect::<HashMap<_, _>>()
            .into();
        let hash = |id: TaskId| id * 3;
        let id_of = |k: u32| ids.borrow()[&k];
        let mut ix = IdIndex::default();
        for k in 0..49 {
            ix.insert(
                k,
                |k| hash(id_of(k)),
                |p| ids.borrow().get(&p).map(|&id| hash(id)),
                k as usize + 1,
            );
        }
        assert!(ix.old.is_some() && ix.walk == 8, "moving, 8 walked");
        // Task at 40 (not walked) goes, and a new task takes its slot.
        let f = ix.find(1040, hash, id_of).unwrap();
        assert!(f.in_old);
        ix.remove_found(f, |k| hash(id_of(k)));
        ids.borrow_mut().insert(40, 5000);
        ix.insert(
            40,
            |k| hash(id_of(k)),
            |p| ids.borrow().get(&p).map(|&id| hash(id)),
            49,
        );
        // Task at 3 (walked) goes too, its slot stays free.
        let f = ix.find(1003, hash, id_of).unwrap();
        assert!(!f.in_old);
        ix.remove_found(f, |k| hash(id_of(k)));
        ids.borrow_mut().remove(&3);
        while ix.old.is_some() {
            let k = ids.borrow().keys().max().unwrap() + 1;
            ids.borrow_mut().insert(k, 6000 + u64::from(k));
            ix.insert(
                k,
                |k| hash(id_of(k)),
                |p| ids.borrow().get(&p).map(|&id| hash(id)),
                k as usize + 1,
            );
        }
        let mut stored = ix.check(|k| hash(id_of(k)));
        stored.sort_unstable();
        let mut want: Vec<u32> = ids.borrow().keys().copied().collect();
        want.sort_unstable();
        assert_eq!(stored, want);
        assert_eq!(ix.find(5000, hash, id_of).unwrap().key, 40);
        assert!(ix.find(1040, hash, id_of).is_none());
        assert!(ix.find(1003, hash, id_of).is_none());
    }

    #[test]
    fn a_skewed_lane_grows_the_table_before_it_fills_and_lookups_end() {
        // Every third key's hash is home 0 (lane 0), the rest spread over lanes 1..8: lane 0
        // reaches its limit long before the table's 3/4, with arena positions the move has
        // not walked yet. Lookups of absent ids in lane 0 must still end, in either table.
        let h = |k: u32| {
            if k.is_multiple_of(3) {
                0
            } else {
                u64::from(k) * 8 + 1 + u64::from(k % 7)
            }
        };
        let id_of = |k: u32| u64::from(k) + 1000;
        let hash = |id: TaskId| h((id - 1000) as u32);
        let mut ix = IdIndex::default();
        for k in 0..40u32 {
            ix.insert(k, h, |p| (p <= k).then(|| h(p)), k as usize + 1);
            ix.check(h);
            for lane in 0..LANES {
                assert!(
                    ix.live.lane_len[lane] < ix.live.lane_blocks(),
                    "lane {lane} full"
                );
            }
            for absent in [3 * 1000u64 + 1000, 999_999] {
                assert!(ix.find(absent, |_| 0, id_of).is_none());
            }
            for j in 0..=k {
                assert_eq!(ix.find(id_of(j), hash, id_of).map(|f| f.key), Some(j));
            }
        }
    }

    #[test]
    fn far_entries_are_found_and_shift_back() {
        // Every id has the same home: distances run past 15, where the slot is read.
        let same = |_: TaskId| 5u64;
        let mut ix = IdIndex::default();
        let ids: Vec<TaskId> = (100..130).collect();
        let id_of = |k: u32| ids[k as usize];
        ix.reserve(40, std::iter::empty());
        for k in 0..ids.len() as u32 {
            ix.insert(k, |_| 5, |p| (p <= k).then_some(5), k as usize + 1);
        }
        let f = ix.find(100, same, id_of).unwrap();
        ix.remove_found(f, |_| 5);
        for (k, &id) in ids.iter().enumerate().skip(1) {
            assert_eq!(ix.find(id, same, id_of).unwrap().key, k as u32);
        }
        ix.check(|_| 5);
    }
}
