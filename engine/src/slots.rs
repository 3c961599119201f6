//! Where a task's fields live, laid out for memory: a resident task of a 32-byte payload
//! costs about 100 bytes in all (the budget the layout is held to), where a 96-byte slot and a malloc'd
//! payload cost 150. Three places, each paid only by the tasks that need it:
//!
//! - the **slot** (48 bytes, in the chunked [`Arena`]): what every list, the index and the
//!   heap read on the hot path — id, pri, the level-0 links, the tower, the tube, status and
//!   flags — and where the task's record is. Its key (u32) is what everything links by.
//! - the **record** (in [`Records`], a byte store of 4 MiB chunks with one free list per exact
//!   size): the put time (8 bytes) followed by the payload itself when it is at most
//!   [`SMALL_PAYLOAD`] bytes, with no allocator header and no rounding — a 32-byte payload
//!   takes 40 bytes, where `Box<[u8]>` took a 16-byte pointer in the slot and a 48-byte
//!   malloc chunk. A bigger payload keeps its own buffer (a `Bytes`: its header is noise
//!   beside it, and the log and a reply can hold it too without a copy) in the `big` arena,
//!   and the record holds that buffer's key.
//! - the **extension** (40 bytes, in a second arena, linked from the slot): the deadline
//!   fields — `t` (runat while Waiting, the TTR time while Taken), TTL, TTR, the heap
//!   position — and the utube. A plain task (no TTL, no TTR, no delay, no utube) has none;
//!   one gets an extension when it first needs a field of it and gives it back once it needs
//!   none again.
//! - the **counters** (releases, buries, kicks, timeouts: 12 bytes and a control byte in a
//!   side table by slot key): only for a task that has one not zero, which the slot's
//!   `COUNTED` flag says, so removing any other task tests one bit.
//!
//! A taken task is in no skiplist, so it gives its tower back and the same slot word names its
//! owner (the session index) instead (`Slot::tower` / `Slot::owner_ix`): taking a plain task touches no extension either.
//!
//! The records' free lists are per exact size, so a workload whose payload sizes shift keeps
//! the memory of sizes it no longer uses (as memcached's slab classes do) — bounded by the
//! most records of each size ever live at once, and nothing for the usual queue whose
//! payloads are of a few sizes.

use std::ops::{Index, IndexMut};

use crate::arena::{Arena, Chunk, PAGE};
use crate::NIL;
use crate::{Bytes, JobCounts, Micros, Payload, PutPayload, Status, TaskId, TubeIx};

/// Payloads up to this size are stored in the task's record (and come back inline in a
/// [`Payload`] when the task leaves); bigger ones keep their own allocation.
pub(crate) const SMALL_PAYLOAD: usize = crate::INLINE_PAYLOAD;

/// `Slot::flags`: the task has a TTL (the extension's `ttl` is valid).
pub(crate) const HAS_TTL: u8 = 1;
/// `Slot::flags`: the task has a TTR (the extension's `ttr` is valid).
pub(crate) const HAS_TTR: u8 = 2;
/// `Slot::flags`: taken by `take` with a TTR, so `t` holds when it returns (tasks restored as
/// Taken have no TTR deadline: `release_all_taken` ends recovery).
pub(crate) const TTR_ARMED: u8 = 4;
/// `Slot::flags`: the payload is in `big`; the record holds its key after the put time.
const BIG: u8 = 8;
/// `Slot::flags`: the task has an entry in `Slots::counts` (a release, bury, kick or TTR
/// return so far). Removing a task tests this bit and nothing more when it is clear.
pub(crate) const COUNTED: u8 = 16;

/// Bytes of a record before its payload: the put time.
const CREATED_BYTES: usize = 8;

/// The hot part of a task: 48 bytes, read by every list operation, index probe and take.
#[derive(Debug)]
pub(crate) struct Slot {
    pub id: TaskId,
    pub pri: i64,
    /// Byte offset of the task's record in `Records`.
    rec: u64,
    /// Ready / Waiting / Buried: level 0 of the status skiplist. Taken: the owner's list, in
    /// take order.
    pub next0: u32,
    pub prev0: u32,
    /// One word, two meanings by status, read through [`tower`](Self::tower) and
    /// [`owner_ix`](Self::owner_ix): a listed task's tower, a taken task's owner. A taken task
    /// is in no skiplist, so it gives its tower back and the word is free for its owner.
    tower_or_owner: u32,
    /// The extension's key, NIL if the task has none.
    ext: u32,
    pub tube: TubeIx,
    /// Times taken, saturating.
    pub deliveries: u16,
    pub status: Status,
    pub flags: u8,
    /// Skiplist height, 1..=MAX_LEVEL, fixed for the task's life.
    pub height: u8,
    /// Payload length when it is in the record (not `BIG`).
    small_len: u8,
}

impl Slot {
    /// Ready, Waiting or Buried (and unlisted between two of them): the offset of the task's
    /// upper levels in `Towers`, NIL for height 1 or until `enter` gives it one.
    #[inline]
    pub fn tower(&self) -> u32 {
        self.tower_or_owner
    }

    /// Sets [`tower`](Self::tower); only while the task is not Taken.
    #[inline]
    pub fn set_tower(&mut self, offset: u32) {
        self.tower_or_owner = offset;
    }

    /// Taken: the owner's index in `Sessions`, NIL once its session let it go.
    #[inline]
    pub fn owner_ix(&self) -> u32 {
        self.tower_or_owner
    }

    /// Sets [`owner_ix`](Self::owner_ix); only while the task is Taken (after its tower went
    /// back).
    #[inline]
    pub fn set_owner_ix(&mut self, ix: u32) {
        self.tower_or_owner = ix;
    }
}

/// The slot's size is the bulk of the per-task cost; keep it from growing by accident. The
/// arena's entry reuses the status niche.
const _: () = assert!(std::mem::size_of::<Slot>() == 48);
const _: () = assert!(Arena::<Slot>::ENTRY_BYTES == 48);
const _: () = assert!(SMALL_PAYLOAD <= u8::MAX as usize);

/// The fields only tasks with a deadline, a TTL, a TTR or a utube have.
#[derive(Debug)]
pub(crate) struct Ext {
    /// Waiting: runat. Taken with `TTR_ARMED`: when the TTR returns it. Else 0.
    t: Micros,
    /// Valid when `HAS_TTL`.
    ttl: Micros,
    /// Valid when `HAS_TTR`.
    ttr: Micros,
    /// Position of the task's entry in the deadline heap, or NIL.
    heap_pos: u32,
    /// Index of its utube in its tube's `Utubes`, NIL outside utube tubes.
    utube: u32,
    /// Gives the arena's entry a niche, so an extension costs 40 bytes, not 48.
    _live: Live,
}

#[derive(Debug, Clone, Copy)]
enum Live {
    Yes,
}

const _: () = assert!(Arena::<Ext>::ENTRY_BYTES == 40);

impl Ext {
    const EMPTY: Ext = Ext {
        t: 0,
        ttl: 0,
        ttr: 0,
        heap_pos: NIL,
        utube: NIL,
        _live: Live::Yes,
    };
}

/// What a new slot starts with; `Slots::insert` adds the record.
pub(crate) struct NewSlot {
    pub id: TaskId,
    pub pri: i64,
    pub created: Micros,
    pub ttl: Option<Micros>,
    pub ttr: Option<Micros>,
    pub utube: u32,
    pub tube: TubeIx,
    pub height: u8,
}

/// A live task's fields, read together (`Slots::parts`).
pub(crate) struct Parts<'a> {
    pub slot: &'a Slot,
    pub created: Micros,
    pub data: &'a [u8],
    /// Waiting: runat; Taken with `TTR_ARMED`: the TTR time; else 0.
    pub t: Micros,
    pub ttl: Option<Micros>,
    pub ttr: Option<Micros>,
    pub utube: u32,
    pub counts: JobCounts,
}

/// A task removed from the store: its slot, put time and payload.
pub(crate) struct Removed {
    pub slot: Slot,
    pub created: Micros,
    pub ttl: Option<Micros>,
    pub ttr: Option<Micros>,
    pub data: Payload,
}

/// Hashes a slot key for the counters' table: one multiply, folded (slot keys are dense).
#[derive(Default, Clone, Copy)]
pub(crate) struct KeyHasher(u64);

impl std::hash::Hasher for KeyHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.write_u32(u32::from(b) ^ self.0 as u32);
        }
    }
    fn write_u32(&mut self, n: u32) {
        self.0 = crate::index::fold_mul(u64::from(n));
    }
}

type CountsTable = hashbrown::HashMap<u32, JobCounts, std::hash::BuildHasherDefault<KeyHasher>>;

/// The task store: slots, records, extensions and big payloads. Indexing (`slots[k]`) reads
/// and writes the slot; the rest goes through the methods.
#[derive(Debug, Default)]
pub(crate) struct Slots {
    hot: Arena<Slot>,
    ext: Arena<Ext>,
    records: Records,
    big: Arena<Bytes>,
    /// The per-task counters of the tasks that have one (`COUNTED`), by slot key: a side
    /// table, since the slot has no room and most tasks are never released, buried, kicked or
    /// timed out (12 bytes and a control byte an entry, none for the rest).
    counts: CountsTable,
}

impl Slots {
    pub fn len(&self) -> usize {
        self.hot.len()
    }

    pub fn is_empty(&self) -> bool {
        self.hot.is_empty()
    }

    /// Slot positions ever used: every key handed out is below this.
    pub fn end(&self) -> usize {
        self.hot.end()
    }

    /// Allocates the slot chunks `additional` more tasks need now (loading a snapshot).
    pub fn reserve(&mut self, additional: usize) {
        self.hot.reserve(additional);
    }

    /// Whether the next new slots, and the next new records, would open a chunk nobody
    /// made ready ([`crate::Room`]).
    pub fn room_wanted(&self) -> (bool, bool) {
        (self.hot.wants_chunk(), self.records.spare.is_empty())
    }

    /// Takes memory made ready elsewhere ([`crate::Room`]) for the next slots and records.
    pub fn add_room(&mut self, slots: Vec<Chunk<Slot>>, records: Vec<Box<[u8]>>) {
        for c in slots {
            self.hot.add_chunk(c);
        }
        self.records.spare.extend(records);
    }

    #[inline]
    pub fn get(&self, k: usize) -> Option<&Slot> {
        self.hot.get(k)
    }

    /// Live slots in key order.
    pub fn iter(&self) -> impl Iterator<Item = (usize, &Slot)> {
        self.hot.iter()
    }

    /// Bytes allocated for slots, extensions, records and the big payloads' boxes (the
    /// payload bytes in records included: they have no other home).
    pub fn capacity_bytes(&self) -> usize {
        self.hot.capacity() * Arena::<Slot>::ENTRY_BYTES
            + self.ext.capacity() * Arena::<Ext>::ENTRY_BYTES
            + self.records.capacity_bytes()
            + self.big.capacity() * Arena::<Bytes>::ENTRY_BYTES
            + self.counts.capacity() * (std::mem::size_of::<(u32, JobCounts)>() + 1)
    }

    /// Stores a new task, in no list and with no deadline; its payload is copied into its
    /// record when small, else kept in its box. Returns its key.
    pub fn insert(&mut self, n: NewSlot, data: impl PutPayload) -> u32 {
        let len = data.bytes().len();
        let small = len <= SMALL_PAYLOAD;
        let size = record_bytes(len);
        let rec = self.records.alloc(size);
        let bytes = self.records.bytes_mut(rec, size);
        bytes[..CREATED_BYTES].copy_from_slice(&n.created.to_le_bytes());
        let mut flags =
            if n.ttl.is_some() { HAS_TTL } else { 0 } | if n.ttr.is_some() { HAS_TTR } else { 0 };
        let small_len = if small {
            bytes[CREATED_BYTES..].copy_from_slice(data.bytes());
            len as u8
        } else {
            flags |= BIG;
            let b = self.big.insert(data.into_shared()) as u32;
            bytes[CREATED_BYTES..].copy_from_slice(&b.to_le_bytes());
            0
        };
        let k = self.hot.insert(Slot {
            id: n.id,
            pri: n.pri,
            rec,
            next0: NIL,
            prev0: NIL,
            tower_or_owner: NIL,
            ext: NIL,
            tube: n.tube,
            deliveries: 0,
            // Not in any list yet; the queue's `enter` sets the real status.
            status: Status::Ready,
            flags,
            height: n.height,
            small_len,
        }) as u32;
        if n.ttl.is_some() || n.ttr.is_some() || n.utube != NIL {
            let e = self.ext_mut(k);
            e.ttl = n.ttl.unwrap_or(0);
            e.ttr = n.ttr.unwrap_or(0);
            e.utube = n.utube;
        }
        k
    }

    /// Removes task `k` and everything it holds. Panics if `k` is not live.
    pub fn remove(&mut self, k: u32) -> Removed {
        let slot = self.hot.remove(k as usize);
        if slot.flags & COUNTED != 0 {
            self.counts.remove(&k);
        }
        let (ttl, ttr) = if slot.ext == NIL {
            (None, None)
        } else {
            let e = self.ext.remove(slot.ext as usize);
            (
                (slot.flags & HAS_TTL != 0).then_some(e.ttl),
                (slot.flags & HAS_TTR != 0).then_some(e.ttr),
            )
        };
        let size = record_size(&slot);
        let bytes = self.records.bytes(slot.rec, size);
        let created = read_u64(bytes);
        let data = if slot.flags & BIG == 0 {
            Payload::from(&bytes[CREATED_BYTES..])
        } else {
            Payload::from(self.big.remove(read_u32(&bytes[CREATED_BYTES..]) as usize))
        };
        self.records.free(slot.rec, size);
        Removed {
            slot,
            created,
            ttl,
            ttr,
            data,
        }
    }

    /// Whether the task has an extension: without one it has no deadline and no heap entry.
    #[inline]
    pub fn has_ext(&self, k: u32) -> bool {
        self.hot[k as usize].ext != NIL
    }

    /// The task's put time.
    #[inline]
    pub fn created(&self, k: u32) -> Micros {
        let s = &self.hot[k as usize];
        read_u64(self.records.bytes(s.rec, CREATED_BYTES))
    }

    #[inline]
    fn ext(&self, k: u32) -> Option<&Ext> {
        self.ext_of(&self.hot[k as usize])
    }

    #[inline]
    fn ext_of(&self, s: &Slot) -> Option<&Ext> {
        (s.ext != NIL).then(|| &self.ext[s.ext as usize])
    }

    /// Task `k`'s payload buffer when it is big (kept in its own buffer), to share without a
    /// copy; `None` for a payload kept in the record.
    pub fn shared_payload(&self, k: u32) -> Option<&Bytes> {
        let s = &self.hot[k as usize];
        (s.flags & BIG != 0).then(|| {
            let bytes = self.records.bytes(s.rec, record_size(s));
            &self.big[read_u32(&bytes[CREATED_BYTES..]) as usize]
        })
    }

    /// Everything a view of task `k` reads, with one lookup of each part: the slot, its put
    /// time, payload, runat-or-TTR time, TTL, TTR and utube.
    #[inline]
    pub fn parts(&self, k: u32) -> Parts<'_> {
        let s = &self.hot[k as usize];
        let bytes = self.records.bytes(s.rec, record_size(s));
        let data = if s.flags & BIG == 0 {
            &bytes[CREATED_BYTES..]
        } else {
            &self.big[read_u32(&bytes[CREATED_BYTES..]) as usize]
        };
        let e = self.ext_of(s);
        Parts {
            slot: s,
            created: read_u64(bytes),
            data,
            t: e.map_or(0, |e| e.t),
            ttl: (s.flags & HAS_TTL != 0).then(|| e.map_or(0, |e| e.ttl)),
            ttr: (s.flags & HAS_TTR != 0).then(|| e.map_or(0, |e| e.ttr)),
            utube: e.map_or(NIL, |e| e.utube),
            counts: self.counts_of(k, s),
        }
    }

    /// Task `k`'s counters (all zero for a task without an entry).
    #[inline]
    pub fn counts(&self, k: u32) -> JobCounts {
        self.counts_of(k, &self.hot[k as usize])
    }

    /// Task `k`'s counters, its slot `s` already at hand (a view reads it anyway): the
    /// common task, never released, buried, kicked or timed out, costs one flag test.
    #[inline]
    fn counts_of(&self, k: u32, s: &Slot) -> JobCounts {
        if s.flags & COUNTED == 0 {
            return JobCounts::default();
        }
        self.counts.get(&k).copied().unwrap_or_default()
    }

    /// Adds one to a counter of task `k` (saturating), making its entry if it has none.
    pub fn bump(&mut self, k: u32, counter: impl FnOnce(&mut JobCounts) -> &mut u16) {
        self.hot[k as usize].flags |= COUNTED;
        let c = counter(self.counts.entry(k).or_default());
        *c = c.saturating_add(1);
    }

    /// Sets task `k`'s counters (recovery); all zero leaves it without an entry.
    pub fn set_counts(&mut self, k: u32, counts: JobCounts) {
        if counts.is_zero() {
            if self.hot[k as usize].flags & COUNTED != 0 {
                self.hot[k as usize].flags &= !COUNTED;
                self.counts.remove(&k);
            }
            return;
        }
        self.hot[k as usize].flags |= COUNTED;
        self.counts.insert(k, counts);
    }

    /// Entries in the counters' table (`check_invariants`: one per `COUNTED` task).
    pub fn counted(&self) -> usize {
        self.counts.len()
    }

    /// The task's extension, made if it has none.
    #[inline]
    fn ext_mut(&mut self, k: u32) -> &mut Ext {
        let s = &mut self.hot[k as usize];
        if s.ext == NIL {
            s.ext = self.ext.insert(Ext::EMPTY) as u32;
        }
        &mut self.ext[s.ext as usize]
    }

    /// Gives back the extension of a task that uses none of its fields any more (called
    /// after every transition, once the heap entry is settled).
    #[inline]
    pub fn trim_ext(&mut self, k: u32) {
        let s = &self.hot[k as usize];
        if s.ext == NIL || s.flags & (HAS_TTL | HAS_TTR) != 0 {
            return;
        }
        let e = &self.ext[s.ext as usize];
        if e.t == 0 && e.heap_pos == NIL && e.utube == NIL {
            let x = s.ext;
            self.hot[k as usize].ext = NIL;
            self.ext.remove(x as usize);
        }
    }

    /// Waiting: runat; Taken with `TTR_ARMED`: the TTR time; else 0.
    #[inline]
    pub fn t(&self, k: u32) -> Micros {
        self.ext(k).map_or(0, |e| e.t)
    }

    #[inline]
    pub fn set_t(&mut self, k: u32, t: Micros) {
        let e = self.hot[k as usize].ext;
        if e != NIL {
            self.ext[e as usize].t = t;
        } else if t != 0 {
            self.ext_mut(k).t = t;
        }
    }

    /// The TTL, if the task has one.
    #[inline]
    pub fn ttl(&self, k: u32) -> Option<Micros> {
        let has = self.hot[k as usize].flags & HAS_TTL != 0;
        has.then(|| self.ext(k).map_or(0, |e| e.ttl))
    }

    /// The TTR, if the task has one.
    #[inline]
    pub fn ttr(&self, k: u32) -> Option<Micros> {
        let has = self.hot[k as usize].flags & HAS_TTR != 0;
        has.then(|| self.ext(k).map_or(0, |e| e.ttr))
    }

    /// Sets (or with `None` clears) the TTL.
    pub fn set_ttl(&mut self, k: u32, ttl: Option<Micros>) {
        match ttl {
            Some(v) => {
                self.hot[k as usize].flags |= HAS_TTL;
                self.ext_mut(k).ttl = v;
            }
            None => self.hot[k as usize].flags &= !HAS_TTL,
        }
    }

    /// Sets (or with `None` clears) the TTR.
    pub fn set_ttr(&mut self, k: u32, ttr: Option<Micros>) {
        match ttr {
            Some(v) => {
                self.hot[k as usize].flags |= HAS_TTR;
                self.ext_mut(k).ttr = v;
            }
            None => self.hot[k as usize].flags &= !HAS_TTR,
        }
    }

    /// Position of the task's heap entry, NIL if it has none.
    #[inline]
    pub fn heap_pos(&self, k: u32) -> u32 {
        self.ext(k).map_or(NIL, |e| e.heap_pos)
    }

    #[inline]
    pub fn set_heap_pos(&mut self, k: u32, pos: u32) {
        let e = self.hot[k as usize].ext;
        if e != NIL {
            self.ext[e as usize].heap_pos = pos;
        } else if pos != NIL {
            self.ext_mut(k).heap_pos = pos;
        }
    }

    /// Its utube's index in its tube, NIL outside utube tubes.
    #[inline]
    pub fn utube(&self, k: u32) -> u32 {
        self.ext(k).map_or(NIL, |e| e.utube)
    }
}

impl Index<usize> for Slots {
    type Output = Slot;
    #[inline]
    fn index(&self, k: usize) -> &Slot {
        &self.hot[k]
    }
}

impl IndexMut<usize> for Slots {
    #[inline]
    fn index_mut(&mut self, k: usize) -> &mut Slot {
        &mut self.hot[k]
    }
}

fn record_size(s: &Slot) -> usize {
    CREATED_BYTES
        + if s.flags & BIG == 0 {
            usize::from(s.small_len)
        } else {
            4
        }
}

#[inline]
fn read_u64(b: &[u8]) -> u64 {
    u64::from_le_bytes(b[..8].try_into().expect("8 bytes"))
}

#[inline]
fn read_u32(b: &[u8]) -> u32 {
    u32::from_le_bytes(b[..4].try_into().expect("4 bytes"))
}

/// Bytes per chunk of records: 4 MiB, a zeroed allocation whose pages the kernel backs only
/// as records are written, so growing costs microseconds whatever the size (unit tests use
/// small chunks to cross their boundaries often).
#[cfg(not(test))]
const RECORD_CHUNK_BITS: u32 = 22;
#[cfg(test)]
const RECORD_CHUNK_BITS: u32 = 9;
const RECORD_CHUNK: usize = 1 << RECORD_CHUNK_BITS;
/// The largest record: the put time and a small payload (a big one's key is shorter).
const MAX_RECORD: usize = CREATED_BYTES + SMALL_PAYLOAD;
/// End of a free list.
const NONE: u64 = u64::MAX;

/// The record bytes of a task whose payload is `len` bytes.
pub(crate) fn record_bytes(len: usize) -> usize {
    CREATED_BYTES + if len <= SMALL_PAYLOAD { len } else { 4 }
}

/// Bytes of a record chunk.
pub(crate) const RECORD_CHUNK_BYTES: usize = RECORD_CHUNK;

/// A record chunk for [`Slots::add_room`], its pages faulted in on the calling thread. The
/// zeros are written through `black_box`, or the compiler may drop stores of zero into
/// memory it knows came zeroed.
pub(crate) fn faulted_record_chunk() -> Box<[u8]> {
    let mut c = vec![0u8; RECORD_CHUNK].into_boxed_slice();
    for b in c.iter_mut().step_by(PAGE) {
        *b = std::hint::black_box(0);
    }
    c
}

/// Records of variable size in chunks that never move. A freed record goes on the free list
/// of its exact size (linked through its first 8 bytes, which every record has), and the
/// next record of that size takes it; otherwise records are cut from the end of the last
/// chunk, and the tail a record does not fit in goes on the free list of the tail's size.
#[derive(Debug)]
struct Records {
    chunks: Vec<Box<[u8]>>,
    /// Chunks handed in faulted in ([`Slots::add_room`]), taken before a new one is made.
    spare: Vec<Box<[u8]>>,
    /// Bytes used of the last chunk.
    top: usize,
    /// Head of the free list of each size (index = size), NONE if empty.
    free: Vec<u64>,
}

impl Default for Records {
    fn default() -> Self {
        Records {
            chunks: Vec::new(),
            spare: Vec::new(),
            top: RECORD_CHUNK,
            free: vec![NONE; MAX_RECORD + 1],
        }
    }
}

impl Records {
    fn capacity_bytes(&self) -> usize {
        (self.chunks.len() + self.spare.len()) * RECORD_CHUNK + self.free.capacity() * 8
    }

    #[inline]
    fn alloc(&mut self, size: usize) -> u64 {
        debug_assert!((CREATED_BYTES..=MAX_RECORD).contains(&size));
        let head = self.free[size];
        if head != NONE {
            self.free[size] = read_u64(self.bytes(head, 8));
            return head;
        }
        if self.top + size > RECORD_CHUNK {
            let tail = RECORD_CHUNK - self.top;
            if tail >= CREATED_BYTES {
                let off = self.offset(self.chunks.len() - 1, self.top);
                self.free(off, tail);
            }
            let chunk = self
                .spare
                .pop()
                .unwrap_or_else(|| vec![0u8; RECORD_CHUNK].into_boxed_slice());
            self.chunks.push(chunk);
            self.top = 0;
        }
        let off = self.offset(self.chunks.len() - 1, self.top);
        self.top += size;
        off
    }

    #[inline]
    fn free(&mut self, off: u64, size: usize) {
        let next = self.free[size];
        self.bytes_mut(off, 8).copy_from_slice(&next.to_le_bytes());
        self.free[size] = off;
    }

    fn offset(&self, chunk: usize, at: usize) -> u64 {
        ((chunk as u64) << RECORD_CHUNK_BITS) | at as u64
    }

    #[inline]
    fn bytes(&self, off: u64, size: usize) -> &[u8] {
        let (c, at) = (
            (off >> RECORD_CHUNK_BITS) as usize,
            (off as usize) & (RECORD_CHUNK - 1),
        );
        &self.chunks[c][at..at + size]
    }

    #[inline]
    fn bytes_mut(&mut self, off: u64, size: usize) -> &mut [u8] {
        let (c, at) = (
            (off >> RECORD_CHUNK_BITS) as usize,
            (off as usize) & (RECORD_CHUNK - 1),
        );
        &mut self.chunks[c][at..at + size]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::BTreeMap;

    fn new_slot(id: u64, created: Micros) -> NewSlot {
        NewSlot {
            id,
            pri: 0,
            created,
            ttl: None,
            ttr: None,
            utube: NIL,
            tube: 0,
            height: 1,
        }
    }

    proptest! {
        /// Against a map: every live task reads back its own put time and payload, of every
        /// size around the small/big line, across many record chunks and free-list reuse;
        /// removal returns them; a freed record of a size is reused by the next of that size.
        #[test]
        fn payloads_and_times_round_trip(
            ops in prop::collection::vec((any::<bool>(), 0usize..=SMALL_PAYLOAD + 40, any::<u16>()), 0..1500)
        ) {
            let mut s = Slots::default();
            let mut m: BTreeMap<u32, (Micros, Vec<u8>)> = BTreeMap::new();
            for (n, (put, len, pick)) in ops.into_iter().enumerate() {
                if put || m.is_empty() {
                    let data: Vec<u8> = (0..len).map(|i| (i + n) as u8).collect();
                    let created = 1_000_000 + n as u64;
                    let k = s.insert(new_slot(n as u64 + 1, created), data.clone());
                    prop_assert!(m.insert(k, (created, data)).is_none());
                } else {
                    let k = *m.keys().nth(usize::from(pick) % m.len()).unwrap();
                    let (created, data) = m.remove(&k).unwrap();
                    let r = s.remove(k);
                    prop_assert_eq!(r.created, created);
                    prop_assert_eq!(&*r.data, &data[..]);
                }
                for (&k, (created, data)) in &m {
                    prop_assert_eq!(s.created(k), *created);
                    prop_assert_eq!(s.parts(k).data, &data[..]);
                }
            }
        }
    }

    #[test]
    fn a_freed_record_is_reused_by_the_next_of_its_size() {
        let mut r = Records::default();
        let a = r.alloc(40);
        let b = r.alloc(40);
        r.free(a, 40);
        assert_eq!(r.alloc(24), b + 40, "another size is cut from the chunk");
        assert_eq!(r.alloc(40), a, "the freed record of this size is reused");
    }

    #[test]
    fn the_extension_comes_and_goes_with_its_fields() {
        let mut s = Slots::default();
        let k = s.insert(new_slot(1, 5), vec![1, 2, 3]);
        assert_eq!(s.ext.len(), 0, "a plain task has no extension");
        s.set_t(k, 0);
        s.set_heap_pos(k, NIL);
        assert_eq!(s.ext.len(), 0, "clearing what is not there makes none");
        s.set_t(k, 99);
        assert_eq!((s.t(k), s.ext.len()), (99, 1));
        s.trim_ext(k);
        assert_eq!(s.ext.len(), 1, "kept while a field is in use");
        s.set_t(k, 0);
        s.trim_ext(k);
        assert_eq!(s.ext.len(), 0, "given back once no field is");
        s.set_ttl(k, Some(7));
        s.trim_ext(k);
        assert_eq!((s.ttl(k), s.ttr(k), s.ext.len()), (Some(7), None, 1));
        let removed = s.remove(k);
        assert_eq!((removed.ttl, removed.created), (Some(7), 5));
        assert_eq!(s.ext.len(), 0);
    }
}
