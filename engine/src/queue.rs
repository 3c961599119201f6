//! `Queue`: the state machine of tasks (Ready, Taken, Waiting) and every transition between
//! them. It owns the arena of task slots, the id index, the three status skiplists and their
//! towers, the deadline heap, the sessions and their taken lists, the counters and the event
//! journal. Nothing here blocks or reads a clock; deadlines fire only inside `advance`, never
//! as a side effect of another call. Parked takes are the server's (`tarq-net`).

use std::hash::Hasher;

use hashbrown::HashTable;
use slab::Slab;

use crate::heap::{DeadlineHeap, Entry, Kind, NIL, SLOT_BITS};
use crate::lists::{SkipList, Towers, MAX_LEVEL};
use crate::sessions::Sessions;
use crate::{
    Advance, Event, Micros, PutOptions, QueueError, RestoredTask, SessionId, Stats, Status, Task,
    TaskId, TaskRef,
};

/// The arena of task slots; a slot's key (u32) is what lists, towers and the heap link by.
pub(crate) type Slots = Slab<Slot>;

/// The session that owns tasks restored as Taken (no session survives a restart).
const RESTORED_OWNER: SessionId = 0;

/// Slot keys must fit the heap entry's 30 bits. 2^30 tasks at ~110 bytes each would be
/// 118 GB, five times this machine's memory, so the limit is never the one that bites.
const MAX_TASKS: usize = (1 << SLOT_BITS) - 1;

/// Seed of the skiplist height generator: fixed, so runs are reproducible.
const HEIGHT_SEED: u64 = 0x2545_F491_4F6C_DD1D;

/// `Slot::flags`: the task has a TTL (`ttl` is valid).
const HAS_TTL: u8 = 1;
/// `Slot::flags`: the task has a TTR (`ttr` is valid).
const HAS_TTR: u8 = 2;
/// `Slot::flags`: taken by `take` with a TTR, so `t` holds when it returns (tasks restored as
/// Taken have no TTR deadline: `release_all_taken` ends recovery).
const TTR_ARMED: u8 = 4;

/// One task in the arena: 88 bytes of fields and links, plus the payload's own allocation.
/// State-specific data shares storage: `t` is runat while Waiting and the TTR time while
/// Taken; `next0` / `prev0` link the status skiplist while Ready or Waiting and the owner's
/// take-order list while Taken (a Taken task is in no skiplist), `sess` names the owner.
/// So a taken task costs nothing beyond its slot.
#[derive(Debug)]
pub(crate) struct Slot {
    pub id: TaskId,
    pub pri: i64,
    pub created: Micros,
    /// Valid when `flags & HAS_TTL`.
    pub ttl: Micros,
    /// Valid when `flags & HAS_TTR`.
    pub ttr: Micros,
    /// Waiting: runat. Taken with `TTR_ARMED`: when the TTR returns it. Else 0.
    pub t: Micros,
    /// The raw MessagePack bytes received.
    pub data: Box<[u8]>,
    /// Position of this task's entry in the deadline heap, or NIL.
    pub heap_pos: u32,
    /// Taken: the owner's index in `Queue::sessions`, else NIL.
    pub sess: u32,
    /// Ready / Waiting: level 0 of the status skiplist. Taken: the owner's list, in take order.
    pub next0: u32,
    pub prev0: u32,
    /// Offset of the upper levels in `Towers`, NIL for height 1.
    pub up: u32,
    pub status: Status,
    pub flags: u8,
    /// Skiplist height, 1..=MAX_LEVEL, fixed for the task's life.
    pub height: u8,
}

/// The layout of `slab`'s private entry type, to size the arena (`overhead_bytes`).
#[allow(dead_code)]
enum SlabEntry<T> {
    Vacant(usize),
    Occupied(T),
}

/// The slot's layout is the bulk of the per-task overhead (ARCHITECTURE.md gives the
/// budget); keep it from growing by accident. The slab's entry reuses the status niche.
const _: () = assert!(std::mem::size_of::<Slot>() == 88);
const _: () = assert!(std::mem::size_of::<SlabEntry<Slot>>() == 88);

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

/// A folded 64x64->128 multiply: every output bit depends on every input bit.
#[inline]
fn fold_mul(x: u64) -> u64 {
    let p = u128::from(x) * 0x9E37_79B9_7F4A_7C15;
    (p as u64) ^ ((p >> 64) as u64)
}

/// Hash of a task id for the index. Runs of 8 consecutive ids land in 8 adjacent buckets with
/// distinct tags (the top 7 bits), and the runs themselves are spread by a full mix: FIFO
/// traffic (put n, n+1, ...; ack in the same order) hits one cache line per 8 ids, while no
/// pattern of live ids piles onto one bucket.
#[inline]
fn hash_id(id: TaskId) -> u64 {
    let run = fold_mul(id >> 3);
    ((run << 3) | (id & 7)) ^ ((id & 7) << 60)
}

/// Ok if slot `k` (task `id`) is Taken by `sid`, else the seed's error for why not.
fn check_owner(
    slots: &Slots,
    sessions: &Sessions,
    k: u32,
    sid: SessionId,
    id: TaskId,
) -> Result<(), QueueError> {
    let s = &slots[k as usize];
    if s.status != Status::Taken {
        return Err(QueueError::NotTaken(id));
    }
    let owner = sessions.owner(s.sess);
    if owner != sid {
        return Err(QueueError::NotOwner {
            id,
            owner,
            caller: sid,
        });
    }
    Ok(())
}

/// The skiplist of a Ready or Waiting task. Taken tasks are in their session's list instead.
fn list_ix(s: Status) -> usize {
    match s {
        Status::Ready => 0,
        Status::Waiting => 1,
        Status::Taken => unreachable!("taken tasks are listed by their session"),
    }
}

/// The queue. See the crate docs and the "engine" section of `ARCHITECTURE.md`.
#[derive(Debug)]
pub struct Queue {
    slots: Slots,
    /// id -> slot key. Holds only the u32 key: ids are compared in the slot, which every
    /// lookup reads anyway, so a bucket costs 4 bytes plus 1 control byte.
    index: HashTable<u32>,
    /// Ready, Waiting — indexed by `list_ix`. Taken tasks are listed by `sessions`.
    lists: [SkipList; 2],
    towers: Towers,
    heap: DeadlineHeap,
    sessions: Sessions,
    /// xorshift64 state for skiplist heights.
    rng: u64,
    last_id: TaskId,
    stats: Stats,
    journal_on: bool,
    journal: Vec<Event>,
}

impl Default for Queue {
    fn default() -> Self {
        Self::new()
    }
}

impl Queue {
    pub fn new() -> Self {
        Queue {
            slots: Slab::new(),
            index: HashTable::new(),
            lists: Default::default(),
            towers: Towers::default(),
            heap: DeadlineHeap::default(),
            sessions: Sessions::default(),
            rng: HEIGHT_SEED,
            last_id: 0,
            stats: Stats::default(),
            journal_on: false,
            journal: Vec::new(),
        }
    }

    /// Adds a task: Ready, or Waiting until `now + delay`. Ids go up by one from `last_id`.
    pub fn put(&mut self, now: Micros, data: Box<[u8]>, opts: PutOptions) -> TaskRef<'_> {
        let id = self
            .last_id
            .checked_add(1)
            .expect("task ids exhausted (last id is u64::MAX)");
        self.last_id = id;
        let k = self.insert_slot(id, opts.pri, now, opts.ttl, opts.ttr, data);
        if opts.delay == 0 {
            self.enter(k, Status::Ready, 0);
        } else {
            self.enter(k, Status::Waiting, now.saturating_add(opts.delay));
        }
        self.reschedule(k);
        self.stats.puts += 1;
        self.log(Event::Put { id });
        self.view(k)
    }

    /// Takes the ready task with the lowest (pri, id) for session `sid`, if any.
    pub fn take(&mut self, now: Micros, sid: SessionId) -> Option<TaskRef<'_>> {
        let k = self.lists[list_ix(Status::Ready)].first()?;
        self.leave(k);
        let s = &mut self.slots[k as usize];
        let id = s.id;
        let ttr_at = if s.flags & HAS_TTR != 0 {
            s.flags |= TTR_ARMED;
            now.saturating_add(s.ttr)
        } else {
            0
        };
        self.enter_taken(k, sid, ttr_at);
        self.reschedule(k);
        self.stats.takes += 1;
        self.log(Event::Taken { id, sid });
        Some(self.view(k))
    }

    /// Deletes a task taken by `sid` and returns it as it was (status Taken).
    pub fn ack(&mut self, _now: Micros, sid: SessionId, id: TaskId) -> Result<Task, QueueError> {
        // One probe of the index both finds the task and, once ownership is checked, unlinks it.
        let slots = &self.slots;
        let entry = self
            .index
            .find_entry(hash_id(id), |&j| slots[j as usize].id == id)
            .map_err(|_| QueueError::NotFound(id))?;
        let k = *entry.get();
        check_owner(&self.slots, &self.sessions, k, sid, id)?;
        entry.remove();
        let task = self.delete_unindexed(k);
        self.stats.acks += 1;
        self.log(Event::Acked { id });
        Ok(task)
    }

    /// Gives a task taken by `sid` back: Ready at its place by (pri, id), or Waiting until
    /// `now + delay` when `delay > 0`.
    pub fn release(
        &mut self,
        now: Micros,
        sid: SessionId,
        id: TaskId,
        delay: Micros,
    ) -> Result<TaskRef<'_>, QueueError> {
        let k = self.owned(sid, id)?;
        let (status, runat) = if delay == 0 {
            (Status::Ready, 0)
        } else {
            (Status::Waiting, now.saturating_add(delay))
        };
        self.move_to(k, status, runat);
        self.stats.releases += 1;
        self.log(Event::Released { id, runat });
        Ok(self.view(k))
    }

    /// Returns every task `sid` holds to Ready, in the order it took them, and forgets the
    /// session. O(tasks it holds).
    pub fn release_session(&mut self, sid: SessionId) -> usize {
        let Some(mut k) = self.sessions.detach(sid) else {
            return 0;
        };
        let mut n = 0;
        while k != NIL {
            // Out of the detached session's list (its `sess` cleared): `leave` must not
            // unlink it again.
            let next = self.sessions.pop_detached(&mut self.slots, k);
            let id = self.slots[k as usize].id;
            self.move_to(k, Status::Ready, 0);
            self.stats.auto_released += 1;
            self.log(Event::AutoReleased { id });
            n += 1;
            k = next;
        }
        n
    }

    /// Returns every Taken task to Ready, in (pri, id) order (restart: no session survives),
    /// and forgets every session.
    /// O(t log t) for t taken tasks: they are listed by session, so this sorts them (once per
    /// restart, not on the request path).
    pub fn release_all_taken(&mut self) -> usize {
        let mut taken = self.sessions.taken_slots(&self.slots);
        let slots = &self.slots;
        taken.sort_unstable_by_key(|&k| (slots[k as usize].pri, slots[k as usize].id));
        let mut n = 0;
        for k in taken {
            let id = self.slots[k as usize].id;
            self.move_to(k, Status::Ready, 0);
            self.stats.auto_released += 1;
            self.log(Event::AutoReleased { id });
            n += 1;
        }
        self.sessions.clear();
        n
    }

    /// Fires due deadlines (`at <= now`) in (time, id) order, at most `budget` of them:
    /// Waiting -> Ready, TTL expiry (deleted), TTR (Taken -> Ready). O(budget log n).
    pub fn advance(&mut self, now: Micros, budget: usize) -> Advance {
        let mut processed = 0;
        while processed < budget {
            let e = match self.heap.peek() {
                Some(e) if e.at <= now => *e,
                _ => break,
            };
            let k = e.slot();
            let id = self.slots[k as usize].id;
            match e.kind() {
                Kind::Expire => {
                    self.delete(k);
                    self.stats.expired += 1;
                    self.log(Event::Expired { id });
                }
                // A due `runat` (Waiting) and a due TTR (Taken) both put the task back in
                // the ready list at its (pri, id) place; they differ only in what they count.
                kind @ (Kind::Promote | Kind::Ttr) => {
                    self.move_to(k, Status::Ready, 0);
                    if kind == Kind::Promote {
                        self.stats.promoted += 1;
                        self.log(Event::Promoted { id });
                    } else {
                        self.stats.ttr_returned += 1;
                        self.log(Event::TtrReturned { id });
                    }
                }
            }
            processed += 1;
        }
        Advance {
            processed,
            next_deadline: self.next_deadline(),
        }
    }

    /// The earliest pending deadline, if any. O(1).
    pub fn next_deadline(&self) -> Option<Micros> {
        self.heap.peek().map(|e| e.at)
    }

    pub fn get(&self, id: TaskId) -> Option<TaskRef<'_>> {
        self.find(id).map(|k| self.view(k))
    }

    /// Counts now and operations since start. O(1).
    pub fn stats(&self) -> Stats {
        Stats {
            total: self.slots.len() as u64,
            ready: self.lists[list_ix(Status::Ready)].len() as u64,
            taken: self.sessions.len() as u64,
            waiting: self.lists[list_ix(Status::Waiting)].len() as u64,
            ..self.stats
        }
    }

    pub fn last_id(&self) -> TaskId {
        self.last_id
    }

    pub fn len(&self) -> usize {
        self.slots.len()
    }

    pub fn is_empty(&self) -> bool {
        self.slots.is_empty()
    }

    /// Turns the event journal on or off (off by default). Turning it off drops what is kept.
    pub fn set_journal(&mut self, on: bool) {
        self.journal_on = on;
        if !on {
            self.journal.clear();
        }
    }

    /// The events since the last drain, in order. The buffer is reused: no allocation once warm.
    pub fn drain_events(&mut self) -> std::vec::Drain<'_, Event> {
        self.journal.drain(..)
    }

    /// Recovery: adds a task as it was. Taken comes back owned by session 0 (call
    /// `release_all_taken` once recovery is done) and without a TTR deadline. `last_id` rises
    /// to the id. Journals nothing, counts no operation.
    pub fn restore(&mut self, task: RestoredTask) -> Result<(), QueueError> {
        if self.find(task.id).is_some() {
            return Err(QueueError::Duplicate(task.id));
        }
        self.last_id = self.last_id.max(task.id);
        let k = self.insert_slot(
            task.id,
            task.pri,
            task.created,
            task.ttl,
            task.ttr,
            task.data,
        );
        self.enter_restored(k, task.status, task.runat);
        Ok(())
    }

    /// Recovery: removes a task (ack or expiry replay). Journals nothing.
    pub fn restore_remove(&mut self, id: TaskId) -> Option<Task> {
        let k = self.find(id)?;
        Some(self.delete(k))
    }

    /// Recovery: sets a task's status (take / release / promote / return replay). Taken gets
    /// owner 0 and no TTR deadline; `runat` counts only for Waiting. Journals nothing.
    pub fn restore_status(
        &mut self,
        id: TaskId,
        status: Status,
        runat: Micros,
    ) -> Result<(), QueueError> {
        let k = self.find(id).ok_or(QueueError::NotFound(id))?;
        self.leave(k);
        self.enter_restored(k, status, runat);
        Ok(())
    }

    /// Recovery: new ids continue above `id` (never lowers the current last id).
    pub fn set_last_id(&mut self, id: TaskId) {
        self.last_id = self.last_id.max(id);
    }

    /// Makes room for `additional` more tasks in the arena and the id index, so loading a
    /// snapshot of known size grows neither step by step (each doubling of the index rehashes
    /// every id). Towers, heap and sessions grow with what the tasks turn out to need.
    pub fn reserve(&mut self, additional: usize) {
        self.slots.reserve(additional);
        let slots = &self.slots;
        self.index
            .reserve(additional, |&j| hash_id(slots[j as usize].id));
    }

    /// Every live task, in no particular order (snapshots).
    pub fn iter(&self) -> impl Iterator<Item = TaskRef<'_>> {
        self.slots.iter().map(|(k, _)| self.view(k as u32))
    }

    /// Bytes the engine holds beyond the payloads: the arena, index, towers, heap and session
    /// tables as allocated (capacity, not length). For the memory figure in benches and tests.
    pub fn overhead_bytes(&self) -> usize {
        use std::mem::size_of;
        self.slots.capacity() * size_of::<SlabEntry<Slot>>()
            + self.index.capacity() * (size_of::<u32>() + 1)
            + self.towers.capacity_bytes()
            + self.heap.capacity_bytes()
            + self.sessions.capacity_bytes()
            + self.journal.capacity() * size_of::<Event>()
    }

    /// Panics with a message naming the broken invariant. O(n log n): for tests and debugging.
    pub fn check_invariants(&self) {
        let n = self.slots.len();
        assert_eq!(
            self.index.len(),
            n,
            "index holds {} ids for {n} tasks",
            self.index.len()
        );
        let mut listed = 0;
        for status in [Status::Ready, Status::Waiting] {
            listed += self.lists[list_ix(status)].check(&self.slots, &self.towers, status);
        }
        listed += self.sessions.check(&self.slots);
        assert_eq!(
            listed, n,
            "lists and sessions hold {listed} tasks, arena {n}"
        );
        self.heap.check(&self.slots);
        let mut entries = 0;
        let mut towers = Vec::new();
        for (k, s) in self.slots.iter() {
            let k = k as u32;
            assert_eq!(
                self.find(s.id),
                Some(k),
                "index does not find task {} at {k}",
                s.id
            );
            assert!(
                s.id != 0 && s.id <= self.last_id,
                "task {} beyond last id {}",
                s.id,
                self.last_id
            );
            assert!(
                (1..=MAX_LEVEL).contains(&(s.height as usize)),
                "task {} height",
                s.id
            );
            assert_eq!(s.up == NIL, s.height == 1, "task {} tower", s.id);
            if s.height > 1 {
                towers.push((s.up, s.height));
            }
            match s.status {
                Status::Ready => assert_eq!(s.t, 0, "ready task {} keeps a time", s.id),
                Status::Waiting => {}
                Status::Taken => {
                    if s.flags & TTR_ARMED != 0 {
                        assert!(s.flags & HAS_TTR != 0, "task {} armed without a ttr", s.id);
                    } else {
                        assert_eq!(s.t, 0, "taken task {} keeps a time", s.id);
                    }
                }
            }
            if s.status != Status::Taken {
                assert_eq!(s.flags & TTR_ARMED, 0, "task {} armed but not taken", s.id);
                assert_eq!(s.sess, NIL, "task {} is {:?} with an owner", s.id, s.status);
            } else {
                assert_ne!(s.sess, NIL, "taken task {} has no owner", s.id);
            }
            match Self::due(s) {
                Some((at, kind)) => {
                    assert_ne!(
                        s.heap_pos, NIL,
                        "task {} has deadline {at} but no entry",
                        s.id
                    );
                    let e = self.heap.get(s.heap_pos);
                    assert_eq!(
                        (e.at, e.kind(), e.slot()),
                        (at, kind, k),
                        "task {} entry",
                        s.id
                    );
                    entries += 1;
                }
                None => assert_eq!(s.heap_pos, NIL, "task {} has no deadline, an entry", s.id),
            }
        }
        assert_eq!(entries, self.heap.len(), "heap holds entries of no task");
        self.towers.check(towers);
    }

    // ---- internals ----

    fn log(&mut self, e: Event) {
        if self.journal_on {
            self.journal.push(e);
        }
    }

    fn find(&self, id: TaskId) -> Option<u32> {
        let slots = &self.slots;
        self.index
            .find(hash_id(id), |&k| slots[k as usize].id == id)
            .copied()
    }

    fn view(&self, k: u32) -> TaskRef<'_> {
        let s = &self.slots[k as usize];
        TaskRef {
            id: s.id,
            status: s.status,
            runat: if s.status == Status::Waiting { s.t } else { 0 },
            pri: s.pri,
            ttl: (s.flags & HAS_TTL != 0).then_some(s.ttl),
            ttr: (s.flags & HAS_TTR != 0).then_some(s.ttr),
            created: s.created,
            owner: (s.status == Status::Taken).then(|| self.owner_of(s)),
            data: &s.data,
        }
    }

    fn owner_of(&self, s: &Slot) -> SessionId {
        self.sessions.owner(s.sess)
    }

    /// The task's earliest pending deadline: TTL expiry, runat, or armed TTR.
    fn due(s: &Slot) -> Option<(Micros, Kind)> {
        let ttl = (s.flags & HAS_TTL != 0).then(|| (s.created.saturating_add(s.ttl), Kind::Expire));
        let timer = match s.status {
            Status::Waiting => Some((s.t, Kind::Promote)),
            Status::Taken if s.flags & TTR_ARMED != 0 => Some((s.t, Kind::Ttr)),
            _ => None,
        };
        match (ttl, timer) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Brings the task's heap entry in line with its deadlines after a transition.
    fn reschedule(&mut self, k: u32) {
        let s = &self.slots[k as usize];
        let pos = s.heap_pos;
        match (Self::due(s), pos) {
            (None, NIL) => {}
            (None, pos) => self.heap.remove(pos, &mut self.slots),
            (Some((at, kind)), NIL) => {
                let e = Entry::new(at, s.id, k, kind);
                self.heap.push(e, &mut self.slots);
            }
            (Some((at, kind)), pos) => {
                let e = Entry::new(at, s.id, k, kind);
                self.heap.update(pos, e, &mut self.slots);
            }
        }
    }

    /// The slot of task `id` if `sid` holds it, else the seed's error for why not.
    fn owned(&self, sid: SessionId, id: TaskId) -> Result<u32, QueueError> {
        let k = self.find(id).ok_or(QueueError::NotFound(id))?;
        check_owner(&self.slots, &self.sessions, k, sid, id)?;
        Ok(k)
    }

    fn next_height(&mut self) -> u8 {
        let mut x = self.rng;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.rng = x;
        // Two bits per level: p = 1/4. x is never 0, so trailing_zeros < 64.
        1 + (x.trailing_zeros() as usize / 2).min(MAX_LEVEL - 1) as u8
    }

    /// Allocates and indexes a slot, in no list and with no deadline yet.
    fn insert_slot(
        &mut self,
        id: TaskId,
        pri: i64,
        created: Micros,
        ttl: Option<Micros>,
        ttr: Option<Micros>,
        data: Box<[u8]>,
    ) -> u32 {
        assert!(self.slots.len() < MAX_TASKS, "more than {MAX_TASKS} tasks");
        let height = self.next_height();
        let up = self.towers.alloc(height);
        let flags =
            if ttl.is_some() { HAS_TTL } else { 0 } | if ttr.is_some() { HAS_TTR } else { 0 };
        let k = self.slots.insert(Slot {
            id,
            pri,
            created,
            ttl: ttl.unwrap_or(0),
            ttr: ttr.unwrap_or(0),
            t: 0,
            data,
            heap_pos: NIL,
            sess: NIL,
            next0: NIL,
            prev0: NIL,
            up,
            // Not in any list yet; `enter` sets the real status.
            status: Status::Ready,
            flags,
            height,
        }) as u32;
        let slots = &self.slots;
        self.index
            .insert_unique(hash_id(id), k, |&j| hash_id(slots[j as usize].id));
        k
    }

    /// Moves a listed task into the list of `status` (Ready or Waiting) with `t` (runat), and
    /// brings its deadline in line: every release, auto-release, promotion and TTR return.
    fn move_to(&mut self, k: u32, status: Status, t: Micros) {
        self.leave(k);
        self.enter(k, status, t);
        self.reschedule(k);
    }

    /// Puts an unlisted slot into the list of `status` (Ready or Waiting), with `t` (runat).
    /// The caller reschedules.
    fn enter(&mut self, k: u32, status: Status, t: Micros) {
        let s = &mut self.slots[k as usize];
        s.status = status;
        s.t = t;
        self.lists[list_ix(status)].insert(&mut self.slots, &mut self.towers, k);
    }

    /// Makes an unlisted slot Taken by `sid`, last in its take order, with `t` (TTR time or
    /// 0). The caller sets `TTR_ARMED` and reschedules.
    fn enter_taken(&mut self, k: u32, sid: SessionId, t: Micros) {
        let s = &mut self.slots[k as usize];
        s.status = Status::Taken;
        s.t = t;
        self.sessions.append(&mut self.slots, sid, k);
    }

    /// Recovery's `enter`: Taken goes to session 0 unarmed; runat counts only for Waiting.
    fn enter_restored(&mut self, k: u32, status: Status, runat: Micros) {
        match status {
            Status::Ready => self.enter(k, status, 0),
            Status::Waiting => self.enter(k, status, runat),
            Status::Taken => self.enter_taken(k, RESTORED_OWNER, 0),
        }
        self.reschedule(k);
    }

    /// Takes a slot out of its list: its status skiplist, or if Taken its session's list
    /// (unless `release_session` already did) and unarmed. The heap entry stays until the
    /// caller reschedules or deletes.
    fn leave(&mut self, k: u32) {
        let s = &mut self.slots[k as usize];
        let status = s.status;
        if status == Status::Taken {
            s.flags &= !TTR_ARMED;
            if s.sess != NIL {
                self.sessions.remove(&mut self.slots, k);
            }
        } else {
            self.lists[list_ix(status)].remove(&mut self.slots, &mut self.towers, k);
        }
        self.slots[k as usize].t = 0;
    }

    /// Removes a task from every structure and returns it as it was.
    fn delete(&mut self, k: u32) -> Task {
        let slots = &self.slots;
        let id = slots[k as usize].id;
        if let Ok(entry) = self
            .index
            .find_entry(hash_id(id), |&j| slots[j as usize].id == id)
        {
            entry.remove();
        }
        self.delete_unindexed(k)
    }

    /// `delete` for a task already out of the index.
    fn delete_unindexed(&mut self, k: u32) -> Task {
        let s = &self.slots[k as usize];
        let owner = (s.status == Status::Taken).then(|| self.owner_of(s));
        let runat = if s.status == Status::Waiting { s.t } else { 0 };
        let (status, pos, id, height, up) = (s.status, s.heap_pos, s.id, s.height, s.up);
        self.leave(k);
        if pos != NIL {
            self.heap.remove(pos, &mut self.slots);
        }
        self.towers.release(height, up);
        let s = self.slots.remove(k as usize);
        Task {
            id,
            status,
            runat,
            pri: s.pri,
            ttl: (s.flags & HAS_TTL != 0).then_some(s.ttl),
            ttr: (s.flags & HAS_TTR != 0).then_some(s.ttr),
            created: s.created,
            owner,
            data: s.data,
        }
    }
}
