//! Tubes: named queues sharing the engine's arena, id index, deadline heap and sessions.
//! This module owns what is a tube's own: its name, type and options, its task numbering
//! (`TubeNumbers`; how an id packs a tube and a number is `task_id`), its Ready / Waiting /
//! Buried skiplists, its counters, its interned utube keys with their per-utube ready lists
//! (`Utubes`), and its dedup window (`Dedup`). The transitions that move tasks between these
//! structures are `Queue`'s (`queue.rs`); this module keeps the structures and their checks.

use std::collections::VecDeque;
use std::hash::{BuildHasher, BuildHasherDefault, DefaultHasher};

use hashbrown::HashTable;
use slab::Slab;

use crate::lists::{ByRunat, SkipList, Towers};
use crate::slots::Slots;
use crate::NIL;
use crate::{Micros, QueueError, Stats, Status, TaskId, TaskRef, TubeIx, URGENT_PRI};

/// The tube the seed API works on: always exists, at index 0, and cannot be dropped.
pub const DEFAULT_TUBE: TubeIx = 0;
pub const DEFAULT_TUBE_NAME: &str = "default";

/// Tube names are Tarantool space names in the original, which allow 65000 bytes; a name is
/// part of every tube call and metric label, so tarq keeps them short, as Tarantool's
/// `BOX_NAME_MAX` (65000) is far above any name a user writes. 200 is beanstalkd's limit, so
/// every tube a beanstalk client can name is a tarq tube.
pub const MAX_TUBE_NAME_BYTES: usize = 200;

/// Each tube adds its series (about twenty) to every `/metrics` scrape and Graphite push:
/// 4096 tubes are ~80k series, about what one scrape interval carries comfortably. The tube
/// index is a u16 in the slot, so the hard ceiling would be 65536.
pub const MAX_TUBES: usize = 4096;

/// A task id is its tube's index and its number in the tube, packed:
/// `ix << TUBE_ID_SHIFT | number`. 41 bits of number beside the 12 bits `MAX_TUBES` needs keep
/// every id below 2^53, which JavaScript clients (beanstalk's, net.box's Lua numbers) read
/// exactly. `default` is index 0, so its ids are its numbers.
pub const TUBE_ID_SHIFT: u32 = 41;

/// The highest number a tube gives a task: a tube has 2^41 numbers (25 days of puts at a
/// million a second), then refuses puts (`QueueError::TubeNumbersSpent`).
pub const MAX_TASK_NUMBER: u64 = (1 << TUBE_ID_SHIFT) - 1;

const _: () = assert!(((MAX_TUBES as u64) << TUBE_ID_SHIFT) <= 1 << 53);

/// The id of task `number` of tube `tube`.
#[inline]
pub const fn task_id(tube: TubeIx, number: u64) -> TaskId {
    ((tube as u64) << TUBE_ID_SHIFT) | number
}

/// The number `id` packs: its place in its tube's index's numbering, which a tube re-created
/// at a dropped one's index continues (`TubeNumbers::first`). The tube API shows a task's
/// number counted from its tube's first instead: `Queue::task_number`. An id kept from before
/// tubes numbered their own tasks (below 2^41, see `TubeNumbers::legacy_below`) is its own
/// number.
#[inline]
pub const fn id_number(id: TaskId) -> u64 {
    id & MAX_TASK_NUMBER
}

/// The number the tube API shows for task `id` of `tube`, whose first task got number `first`
/// (`TubeNumbers::first`): the number `id` packs, counted from `first`. An id that is not
/// one of the tube's own numbers — kept from before tubes numbered their own, another tube's
/// — is shown whole, as `TubeNumbers::id_of` reads it. A few instructions: it runs for every
/// task the tube API answers with.
#[inline]
pub fn number_from(tube: TubeIx, first: u64, id: TaskId) -> u64 {
    let number = id_number(id);
    if id >> TUBE_ID_SHIFT == tube as u64 && number >= first {
        number - first
    } else {
        id
    }
}

/// The tube whose numbers `id` is counted in: its tube, or `default` (0) for every id below
/// 2^41, which includes the ids kept from before tubes numbered their own tasks. `None` for
/// an id from 2^57 on, which packs no tube index at all (a damaged one): refused, not taken
/// for the tube its low bits would name.
#[inline]
pub fn id_tube(id: TaskId) -> Option<TubeIx> {
    TubeIx::try_from(id >> TUBE_ID_SHIFT).ok()
}

/// How a tube numbers its tasks. A number is never given twice at a tube index, across all
/// the tubes it ever holds (deleting the newest task does not give its number back, unlike the
/// original's `max + 1`; a tube created at a dropped one's index numbers on from it), so no
/// id is ever given twice. Serializable for a move of a tube's tasks to another node, which
/// carries the numbering with them (`Queue::import_numbers`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct TubeNumbers {
    /// The number the next put gets (packed in its id): `first` in a new tube (1 in
    /// `default`, whose seed ids start at 1).
    pub next: u64,
    /// The number the tube's first task got: the next number of the last tube dropped at its
    /// index (0 at an index never used). The tube API shows a task's number less this, so a
    /// fresh tube numbers from 0 there as in the original, while its ids stay new. 0 in
    /// `default` and in every tube with a `legacy_below` mark.
    pub first: u64,
    /// A tube that held tasks before tubes numbered their own (a data directory of an older
    /// format): its tasks of then kept their global ids, all below this mark, and the tube's
    /// own numbers start at it. The tube API reads a number below it as such an id. 0 for a
    /// tube created since (only a tube with `first` 0 has one).
    pub legacy_below: u64,
}

impl TubeNumbers {
    /// The id the tube API means by task `number` of tube `tube` numbered so: the tube's own
    /// number (counted from `first`), or, below `legacy_below`, the id a task kept from before
    /// tubes numbered their own. A number past `MAX_TASK_NUMBER` is taken as a whole id (one a
    /// beanstalk client or the seed API showed), which the tube calls then find only if it is
    /// the tube's; so is one past the numbers left at the tube's index (no task has it).
    #[inline]
    pub fn id_of(&self, tube: TubeIx, number: u64) -> TaskId {
        if number < self.legacy_below || number > MAX_TASK_NUMBER {
            return number;
        }
        match self.first.checked_add(number) {
            Some(n) if n <= MAX_TASK_NUMBER => task_id(tube, n),
            _ => number,
        }
    }
}

/// A utube key is stored once per tube (interned) but hashed and compared on every put:
/// 256 bytes is ample for the ids users put there (user ids, order ids, UUIDs).
pub const MAX_UTUBE_KEY_BYTES: usize = 256;

/// A dedup key is kept for the tube's whole window, one allocation each: 256 bytes fits a
/// content hash or a producer's request id with room to spare.
pub const MAX_DEDUP_KEY_BYTES: usize = 256;

/// The five drivers of tarantool/queue 1.5.0.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub enum TubeType {
    Fifo,
    FifoTtl,
    LimFifoTtl,
    Utube,
    UtubeTtl,
}

impl TubeType {
    /// The type named `s`, or the original's error for an unknown one.
    pub fn parse(s: &str) -> Result<TubeType, QueueError> {
        Ok(match s {
            "fifo" => TubeType::Fifo,
            "fifottl" => TubeType::FifoTtl,
            "limfifottl" => TubeType::LimFifoTtl,
            "utube" => TubeType::Utube,
            "utubettl" => TubeType::UtubeTtl,
            _ => return Err(QueueError::UnknownTubeType(s.to_owned())),
        })
    }

    pub fn as_str(self) -> &'static str {
        match self {
            TubeType::Fifo => "fifo",
            TubeType::FifoTtl => "fifottl",
            TubeType::LimFifoTtl => "limfifottl",
            TubeType::Utube => "utube",
            TubeType::UtubeTtl => "utubettl",
        }
    }

    /// Tasks have pri, delay, TTL and TTR (the `*ttl` drivers); fifo and utube ignore them,
    /// as the original does.
    pub fn has_ttl(self) -> bool {
        !matches!(self, TubeType::Fifo | TubeType::Utube)
    }

    /// At most one task per utube key is taken at a time.
    pub fn is_utube(self) -> bool {
        matches!(self, TubeType::Utube | TubeType::UtubeTtl)
    }
}

impl std::fmt::Display for TubeType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A tube's options, as `create_tube` stores them. Times in microseconds; `None` is no limit.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(default))]
pub struct TubeOptions {
    /// Default TTL of a put (`*ttl` types).
    pub ttl: Option<Micros>,
    /// Default TTR of a put (`*ttl` types); `create_tube` sets it to `ttl` when absent, as
    /// the original does.
    pub ttr: Option<Micros>,
    /// Default pri of a put (`*ttl` types).
    pub pri: i64,
    /// limfifottl: most tasks the tube holds, in any status; 0 = no limit.
    pub capacity: u64,
    /// A task taken this many times and then returned is buried instead; 0 = no limit.
    pub max_deliveries: u16,
    /// A put with a dedup key seen in the tube this recently returns the earlier task; 0 = off.
    pub dedup_window: Micros,
    /// Kept as data: the server does not log a temporary tube's tasks.
    pub temporary: bool,
    /// Made on demand (beanstalk's `use` or `watch` of a tube that did not exist): it goes
    /// once it holds no task and nothing uses it (`Queue::drop_if_unneeded`), as beanstalkd
    /// forgets such a tube. A tube made by `create_tube` stays.
    pub on_demand: bool,
    /// Which partition of its named tube this is, in a sharded cluster: 0 for a whole tube
    /// (and a partitioned tube's first partition, which holds the name); from 1 a partition
    /// that shares its tube's name but is found by its index only (not by `tube_ix`, not in
    /// `named_tubes`), so a node lists a partitioned tube once.
    pub part: u16,
}

/// Options of a put into a tube. What the type has no use for is ignored (as the original does).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct TubePut<'a> {
    /// 0 = ready now; else Waiting for `delay` (and the TTL grows by `delay`, as in the original).
    pub delay: Micros,
    /// `None` = the tube's default.
    pub ttl: Option<Micros>,
    pub ttr: Option<Micros>,
    pub pri: Option<i64>,
    /// The utube key in a utube tube (the front-end passes the original's `tostring(utube)`).
    #[cfg_attr(feature = "serde", serde(borrow, with = "serde_bytes"))]
    pub utube: &'a [u8],
    #[cfg_attr(feature = "serde", serde(borrow, with = "serde_bytes"))]
    pub dedup_key: Option<&'a [u8]>,
}

/// Options of a release through the tube API (`*ttl` types; fifo and utube ignore them).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct ReleaseOptions {
    /// 0 = Ready now; else Waiting for `delay`, and the TTL grows by `delay` (the original).
    pub delay: Micros,
    /// New pri.
    pub pri: Option<i64>,
    /// New remaining life, counted from now (before the delay is added).
    pub ttl: Option<Micros>,
}

/// What a put into a tube did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PutOutcome<'a> {
    Created(TaskRef<'a>),
    /// The dedup key was put within the window: the earlier task, still live.
    Duplicate(TaskRef<'a>),
    /// The dedup key was put within the window, and that task is already gone (done).
    DuplicateDone(TaskId),
}

/// A tube as `tube_info` describes it (for the front-end's `create_tube` reply and the WAL).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TubeInfo<'a> {
    pub ix: TubeIx,
    pub name: &'a str,
    pub kind: TubeType,
    pub opts: TubeOptions,
    pub numbers: TubeNumbers,
}

/// One utube key of a tube: its Ready tasks but the head, and whether one of its tasks is
/// Taken. The head — its lowest (pri, id) Ready task while none is Taken — sits in the tube's
/// ready list instead, so `take` pops the tube's ready list and never sees a busy utube.
#[derive(Debug)]
pub(crate) struct Utube {
    pub key: Box<[u8]>,
    /// Ready tasks of this utube not in the tube's ready list, by (pri, id).
    pub rest: SkipList,
    /// The slot in the tube's ready list, or NIL.
    pub head: u32,
    /// One of its tasks is Taken.
    pub busy: bool,
    /// Live tasks with this key, in any status: the key is forgotten at 0.
    pub refs: u32,
}

/// The interned utube keys of a tube.
#[derive(Debug, Default)]
pub(crate) struct Utubes {
    by_key: HashTable<u32>,
    pub list: Slab<Utube>,
}

/// Keys hash with SipHash under fixed keys: deterministic, as the engine must be.
fn hash_bytes(b: &[u8]) -> u64 {
    BuildHasherDefault::<DefaultHasher>::default().hash_one(b)
}

impl Utubes {
    /// The index of `key`, interned on first use; counts one more task holding it.
    pub fn intern(&mut self, key: &[u8]) -> u32 {
        let list = &self.list;
        let h = hash_bytes(key);
        if let Some(&u) = self.by_key.find(h, |&u| &*list[u as usize].key == key) {
            self.list[u as usize].refs += 1;
            return u;
        }
        let u = u32::try_from(self.list.insert(Utube {
            key: key.into(),
            rest: SkipList::default(),
            head: NIL,
            busy: false,
            refs: 1,
        }))
        .expect("utubes fit u32");
        let list = &self.list;
        self.by_key
            .insert_unique(h, u, |&j| hash_bytes(&list[j as usize].key));
        u
    }

    /// The index of `key` if a live task holds it (nothing is interned).
    pub fn find(&self, key: &[u8]) -> Option<u32> {
        let list = &self.list;
        (self.by_key)
            .find(hash_bytes(key), |&u| &*list[u as usize].key == key)
            .copied()
    }

    /// One task fewer holds utube `u`; forgets the key at none.
    pub fn unref(&mut self, u: u32) {
        let ut = &mut self.list[u as usize];
        ut.refs -= 1;
        if ut.refs == 0 {
            debug_assert!(ut.head == NIL && ut.rest.len() == 0 && !ut.busy);
            let h = hash_bytes(&ut.key);
            if let Ok(e) = self.by_key.find_entry(h, |&j| j == u) {
                e.remove();
            }
            self.list.remove(u as usize);
        }
    }

    /// Panics unless the index maps every key to its entry and nothing else.
    pub fn check_index(&self) {
        assert_eq!(self.by_key.len(), self.list.len(), "utube index size");
        for (u, ut) in &self.list {
            let found = self.by_key.find(hash_bytes(&ut.key), |&j| {
                self.list[j as usize].key == ut.key
            });
            assert_eq!(found, Some(&(u as u32)), "utube {u} not indexed by its key");
        }
    }
}

/// One remembered dedup key.
#[derive(Debug)]
pub(crate) struct DedupEntry {
    pub key: Box<[u8]>,
    pub id: TaskId,
    pub expires: Micros,
}

/// A tube's dedup window: keys in put order (so expiry pops the front, never scans) and an
/// index from key to its newest entry's sequence number.
#[derive(Debug, Default)]
pub(crate) struct Dedup {
    pub fifo: VecDeque<DedupEntry>,
    /// Sequence number of `fifo[0]`.
    pub first_seq: u64,
    index: HashTable<u64>,
}

impl Dedup {
    pub fn entry(&self, seq: u64) -> Option<&DedupEntry> {
        let i = usize::try_from(seq.checked_sub(self.first_seq)?).ok()?;
        self.fifo.get(i)
    }

    /// The task put with `key` whose entry has not expired at `now`.
    pub fn lookup(&self, key: &[u8], now: Micros) -> Option<TaskId> {
        let seq = *self.index.find(hash_bytes(key), |&s| {
            self.entry(s).is_some_and(|e| &*e.key == key)
        })?;
        let e = self.entry(seq).expect("indexed entry");
        (e.expires > now).then_some(e.id)
    }

    /// Remembers `key` for task `id` until `expires`; returns its sequence number.
    pub fn record(&mut self, key: &[u8], id: TaskId, expires: Micros) -> u64 {
        let seq = self.first_seq + self.fifo.len() as u64;
        let h = hash_bytes(key);
        let (fifo, first) = (&self.fifo, self.first_seq);
        let at = |s: u64| &fifo[(s - first) as usize];
        match self.index.find_entry(h, |&s| &*at(s).key == key) {
            // An expired entry of the same key: the new one replaces it in the index.
            Ok(mut e) => *e.get_mut() = seq,
            Err(_) => {
                self.fifo.push_back(DedupEntry {
                    key: key.into(),
                    id,
                    expires,
                });
                let (fifo, first) = (&self.fifo, self.first_seq);
                self.index
                    .insert_unique(h, seq, |&s| hash_bytes(&fifo[(s - first) as usize].key));
                return seq;
            }
        }
        self.fifo.push_back(DedupEntry {
            key: key.into(),
            id,
            expires,
        });
        seq
    }

    /// Forgets the entries expired at `now`, oldest first, at most `budget`. Returns how many.
    pub fn prune(&mut self, now: Micros, budget: usize) -> usize {
        let mut n = 0;
        while n < budget {
            match self.fifo.front() {
                Some(e) if e.expires <= now => {}
                _ => break,
            }
            let e = self.fifo.pop_front().expect("front");
            let seq = self.first_seq;
            self.first_seq += 1;
            if let Ok(ie) = self.index.find_entry(hash_bytes(&e.key), |&s| s == seq) {
                ie.remove();
            }
            n += 1;
        }
        n
    }

    /// Panics unless every indexed seq is live and is its key's newest entry.
    pub fn check(&self) {
        for (i, e) in self.fifo.iter().enumerate() {
            let seq = self.first_seq + i as u64;
            let found = self.index.find(hash_bytes(&e.key), |&s| {
                self.entry(s).is_some_and(|x| x.key == e.key)
            });
            let newest = found.expect("dedup key not indexed");
            assert!(*newest >= seq, "dedup index points at an older entry");
        }
        assert!(
            self.index.len() <= self.fifo.len(),
            "dedup index larger than fifo"
        );
    }
}

/// One tube. Counts by status are list lengths or counters; operations in `ops`.
#[derive(Debug)]
pub(crate) struct Tube {
    pub name: Box<str>,
    pub kind: TubeType,
    pub opts: TubeOptions,
    pub numbers: TubeNumbers,
    /// Ready tasks by (pri, id); in a utube tube only the heads of utubes with none Taken.
    pub ready: SkipList,
    /// By (runat, id): the head is due first (promotion order, beanstalk's delayed kicks).
    pub waiting: SkipList<ByRunat>,
    /// By (pri, id): the head is kicked first.
    pub buried: SkipList,
    /// Ready tasks (in a utube tube `ready.len()` counts only the heads).
    pub ready_n: u64,
    /// Ready tasks with pri below `URGENT_PRI`, kept where `ready_n` is (beanstalk's
    /// `current-jobs-urgent` is read on every `stats-tube`; counting would walk the lists).
    pub ready_urgent_n: u64,
    pub taken_n: u64,
    /// Operation counters (the count fields are filled in by `stats`).
    pub ops: Stats,
    /// In the queue's list of tubes whose counters the turn changed (`Queue::take_counted`).
    pub counted: bool,
    pub utubes: Option<Box<Utubes>>,
    pub dedup: Option<Box<Dedup>>,
}

impl Tube {
    pub fn new(name: &str, kind: TubeType, opts: TubeOptions, numbers: TubeNumbers) -> Tube {
        Tube {
            name: name.into(),
            kind,
            opts,
            numbers,
            ready: SkipList::default(),
            waiting: SkipList::default(),
            buried: SkipList::default(),
            ready_n: 0,
            ready_urgent_n: 0,
            taken_n: 0,
            ops: Stats::default(),
            counted: false,
            utubes: kind.is_utube().then(Box::default),
            dedup: (opts.dedup_window > 0).then(Box::default),
        }
    }

    pub fn total(&self) -> u64 {
        self.ready_n + self.taken_n + self.waiting.len() as u64 + self.buried.len() as u64
    }

    pub fn stats(&self) -> Stats {
        Stats {
            total: self.total(),
            ready: self.ready_n,
            taken: self.taken_n,
            waiting: self.waiting.len() as u64,
            buried: self.buried.len() as u64,
            ..self.ops
        }
    }

    /// Panics unless the tube's lists and utubes are consistent with the slots; returns the
    /// tasks listed (Ready, Waiting, Buried) — Taken ones are counted by the caller.
    pub fn check(&self, ix: TubeIx, slots: &Slots, tw: &Towers) -> usize {
        let mut listed = 0;
        listed += self.waiting.check(slots, tw, Status::Waiting);
        listed += self.buried.check(slots, tw, Status::Buried);
        let mut in_tube = |k: u32| {
            let s = &slots[k as usize];
            assert_eq!(
                s.tube, ix,
                "{:?} task {} in tube {ix}'s list",
                s.status, s.id
            );
        };
        self.waiting.for_each(slots, &mut in_tube);
        self.buried.for_each(slots, &mut in_tube);
        let heads = self.ready.check(slots, tw, Status::Ready);
        self.ready.for_each(slots, |k| {
            assert_eq!(slots[k as usize].tube, ix, "ready task in tube {ix}'s list");
        });
        let mut ready = heads;
        let mut urgent = 0u64;
        let mut count_urgent = |k: u32| urgent += u64::from(slots[k as usize].pri < URGENT_PRI);
        self.ready.for_each(slots, &mut count_urgent);
        if let Some(ut) = &self.utubes {
            for (_, u) in &ut.list {
                u.rest.for_each(slots, &mut count_urgent);
            }
        }
        match &self.utubes {
            None => {
                for (k, s) in slots.iter() {
                    if s.tube == ix {
                        let u = slots.utube(k as u32);
                        assert_eq!(u, NIL, "task at {k} has a utube in a plain tube");
                    }
                }
            }
            Some(ut) => ready += check_utubes(ut, ix, &self.ready, slots, tw),
        }
        assert_eq!(ready as u64, self.ready_n, "tube {ix}: ready count");
        assert_eq!(urgent, self.ready_urgent_n, "tube {ix}: urgent ready count");
        listed + ready
    }
}

/// Checks every utube of tube `ix` against the slots; returns the Ready tasks in `rest` lists.
fn check_utubes(ut: &Utubes, ix: TubeIx, ready: &SkipList, slots: &Slots, tw: &Towers) -> usize {
    ut.check_index();
    let mut refs = vec![0u32; ut.list.capacity()];
    let mut taken = vec![0u32; ut.list.capacity()];
    for (k, s) in slots.iter().filter(|(_, s)| s.tube == ix) {
        let u = slots.utube(k as u32);
        assert_ne!(u, NIL, "task {} in a utube tube has no utube", s.id);
        refs[u as usize] += 1;
        if s.status == Status::Taken {
            taken[u as usize] += 1;
        }
    }
    let mut heads = 0;
    ready.for_each(slots, |k| {
        let u = slots.utube(k);
        assert_eq!(
            ut.list[u as usize].head, k,
            "ready task at {k} is not its utube's head"
        );
        heads += 1;
    });
    let mut rest = 0;
    for (u, t) in &ut.list {
        assert_eq!(t.refs, refs[u], "utube {u}: refs");
        assert!(taken[u] <= 1, "utube {u}: {} tasks taken", taken[u]);
        assert_eq!(t.busy, taken[u] == 1, "utube {u}: busy flag");
        rest += t.rest.check(slots, tw, Status::Ready);
        t.rest.for_each(slots, |k| {
            assert_eq!(
                slots.utube(k),
                u as u32,
                "task at {k} in another utube's list"
            );
        });
        if t.busy {
            assert_eq!(t.head, NIL, "busy utube {u} has a head in the ready list");
        } else if t.rest.len() > 0 {
            assert_ne!(t.head, NIL, "free utube {u} with ready tasks has no head");
        }
        if t.head != NIL {
            let hk = (slots[t.head as usize].pri, slots[t.head as usize].id);
            if let Some(f) = t.rest.first() {
                assert!(
                    hk < (slots[f as usize].pri, slots[f as usize].id),
                    "utube {u}: head not first"
                );
            }
            heads -= 1;
        }
    }
    assert_eq!(heads, 0, "ready list holds tasks no utube calls its head");
    rest
}
