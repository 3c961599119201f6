//! `Queue`: the state machine of tasks (Ready, Taken, Waiting) and every transition between
//! them. It owns the arena of task slots, the id index, the three status lists, the deadline
//! heap, the per-session taken lists, the counters and the event journal. Nothing here blocks
//! or reads a clock; deadlines fire only inside `advance`, never as a side effect of a call.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

use slab::Slab;

use crate::heap::{DeadlineHeap, Entry, Kind, NIL};
use crate::lists::OrdList;
use crate::{
    Advance, Event, Micros, PutOptions, QueueError, RestoredTask, SessionId, Stats, Status, Task,
    TaskId, TaskRef,
};

/// The arena of task slots; a slot's key (u32) is what every list and heap entry links by.
pub(crate) type Slots = Slab<Slot>;

/// The session that owns tasks restored as Taken (no session survives a restart).
const RESTORED_OWNER: SessionId = 0;

/// Slot keys are u32 to halve the links; this many live tasks is far past any memory budget
/// (4 billion tasks at ~100 bytes each is 400 GB).
const MAX_TASKS: usize = u32::MAX as usize - 1;

const HAS_TTL: u8 = 1;
const HAS_TTR: u8 = 2;

/// One task in the arena: its fields, its payload and the links that thread it through the
/// status list, the deadline heap and its session's taken list.
#[derive(Debug)]
pub(crate) struct Slot {
    pub id: TaskId,
    pub pri: i64,
    pub created: Micros,
    /// When Waiting becomes Ready; 0 unless Waiting.
    pub runat: Micros,
    /// Valid when `flags & HAS_TTL` (a `u64` plus a bit instead of `Option<u64>`: 8 bytes less).
    pub ttl: Micros,
    /// Valid when `flags & HAS_TTR`.
    pub ttr: Micros,
    /// Valid while Taken.
    pub owner: SessionId,
    pub data: Box<[u8]>,
    /// Position of the TTL entry in the heap, or NIL.
    pub ttl_pos: u32,
    /// Position of the runat (Waiting) or TTR (Taken) entry in the heap, or NIL.
    pub tm_pos: u32,
    /// Links of the owner's taken list (take order), NIL at the ends or when not Taken.
    pub s_prev: u32,
    pub s_next: u32,
    pub status: Status,
    pub flags: u8,
}

impl Slot {
    fn ttl(&self) -> Option<Micros> {
        (self.flags & HAS_TTL != 0).then_some(self.ttl)
    }

    fn ttr(&self) -> Option<Micros> {
        (self.flags & HAS_TTR != 0).then_some(self.ttr)
    }

    fn view(&self) -> TaskRef<'_> {
        TaskRef {
            id: self.id,
            status: self.status,
            runat: self.runat,
            pri: self.pri,
            ttl: self.ttl(),
            ttr: self.ttr(),
            created: self.created,
            owner: (self.status == Status::Taken).then_some(self.owner),
            data: &self.data,
        }
    }

    fn into_task(self) -> Task {
        let owner = (self.status == Status::Taken).then_some(self.owner);
        Task {
            id: self.id,
            status: self.status,
            runat: self.runat,
            pri: self.pri,
            ttl: self.ttl(),
            ttr: self.ttr(),
            created: self.created,
            owner,
            data: self.data,
        }
    }
}

/// Ends of one session's taken list.
#[derive(Clone, Copy, Debug)]
struct SessionList {
    head: u32,
    tail: u32,
    len: u32,
}

/// Ids and session ids are small counters: a multiplicative hash spreads them well enough and
/// costs one multiply instead of SipHash's ~20 ns.
#[derive(Default, Clone, Copy)]
pub(crate) struct IdHasher(u64);

impl Hasher for IdHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0.rotate_left(8) ^ u64::from(b)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        }
    }
    fn write_u64(&mut self, n: u64) {
        // Fibonacci hashing: the high bits (which hashbrown uses for its tags) depend on all
        // input bits.
        self.0 = (n ^ (n >> 32))
            .wrapping_mul(0x9E37_79B9_7F4A_7C15)
            .rotate_left(26);
    }
}

type IdMap<V> = HashMap<u64, V, BuildHasherDefault<IdHasher>>;

fn list_ix(s: Status) -> usize {
    match s {
        Status::Ready => 0,
        Status::Taken => 1,
        Status::Waiting => 2,
    }
}

/// The queue. See the crate docs and `ARCHITECTURE.md` for the data structures.
#[derive(Debug, Default)]
pub struct Queue {
    slots: Slots,
    index: IdMap<u32>,
    /// Ready, Taken, Waiting — indexed by `list_ix`.
    lists: [OrdList; 3],
    heap: DeadlineHeap,
    sessions: IdMap<SessionList>,
    last_id: TaskId,
    stats: Stats,
    journal_on: bool,
    journal: Vec<Event>,
}

impl Queue {
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds a task: Ready, or Waiting until `now + delay`. Ids go up by one from `last_id`.
    pub fn put(&mut self, now: Micros, data: Box<[u8]>, opts: PutOptions) -> TaskRef<'_> {
        let id = self
            .last_id
            .checked_add(1)
            .expect("task ids exhausted (last id is u64::MAX)");
        self.last_id = id;
        let (status, runat) = if opts.delay == 0 {
            (Status::Ready, 0)
        } else {
            (Status::Waiting, now.saturating_add(opts.delay))
        };
        let k = self.insert_slot(id, opts.pri, now, opts.ttl, opts.ttr, data);
        self.enter(k, status, runat, RESTORED_OWNER, None);
        self.stats.puts += 1;
        self.log(Event::Put { id });
        self.slots[k as usize].view()
    }

    /// Takes the ready task with the lowest (pri, id) for session `sid`, if any.
    pub fn take(&mut self, now: Micros, sid: SessionId) -> Option<TaskRef<'_>> {
        let k = self.lists[list_ix(Status::Ready)].first()?;
        self.leave(k);
        let s = &self.slots[k as usize];
        let ttr_at = s.ttr().map(|t| now.saturating_add(t));
        let id = s.id;
        self.enter(k, Status::Taken, 0, sid, ttr_at);
        self.stats.takes += 1;
        self.log(Event::Taken { id, sid });
        Some(self.slots[k as usize].view())
    }

    /// Deletes a task taken by `sid` and returns it as it was (status Taken).
    pub fn ack(&mut self, _now: Micros, sid: SessionId, id: TaskId) -> Result<Task, QueueError> {
        let k = self.owned(sid, id)?;
        let task = self.delete(k);
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
        self.leave(k);
        let runat = if delay == 0 {
            self.enter(k, Status::Ready, 0, RESTORED_OWNER, None);
            0
        } else {
            let runat = now.saturating_add(delay);
            self.enter(k, Status::Waiting, runat, RESTORED_OWNER, None);
            runat
        };
        self.stats.releases += 1;
        self.log(Event::Released { id, runat });
        Ok(self.slots[k as usize].view())
    }

    /// Returns every task `sid` holds to Ready, in the order it took them. O(tasks it holds).
    pub fn release_session(&mut self, sid: SessionId) -> usize {
        let Some(list) = self.sessions.remove(&sid) else {
            return 0;
        };
        let mut k = list.head;
        let mut n = 0;
        while k != NIL {
            let s = &mut self.slots[k as usize];
            let next = s.s_next;
            // The whole list is dropped at once: detach the node so `leave` skips it.
            s.s_prev = NIL;
            s.s_next = NIL;
            s.owner = RESTORED_OWNER;
            let id = s.id;
            self.leave_detached(k);
            self.enter(k, Status::Ready, 0, RESTORED_OWNER, None);
            self.stats.auto_released += 1;
            self.log(Event::AutoReleased { id });
            n += 1;
            k = next;
        }
        debug_assert_eq!(n, list.len as usize);
        n
    }

    /// Returns every Taken task to Ready, in (pri, id) order (restart: no session survives).
    pub fn release_all_taken(&mut self) -> usize {
        let mut n = 0;
        while let Some(k) = self.lists[list_ix(Status::Taken)].first() {
            let id = self.slots[k as usize].id;
            self.leave(k);
            self.enter(k, Status::Ready, 0, RESTORED_OWNER, None);
            self.stats.auto_released += 1;
            self.log(Event::AutoReleased { id });
            n += 1;
        }
        n
    }

    /// Fires due deadlines (`at <= now`) in (time, id) order, at most `budget` of them:
    /// Waiting -> Ready, TTL expiry (deleted), TTR (Taken -> Ready).
    pub fn advance(&mut self, now: Micros, budget: usize) -> Advance {
        let mut processed = 0;
        while processed < budget {
            match self.heap.peek() {
                Some(e) if e.at <= now => {}
                _ => break,
            }
            let e = self.heap.pop(&mut self.slots).expect("peeked");
            let k = e.slot;
            match e.kind {
                Kind::Expire => {
                    self.delete(k);
                    self.stats.expired += 1;
                    self.log(Event::Expired { id: e.id });
                }
                Kind::Promote => {
                    self.leave(k);
                    self.enter(k, Status::Ready, 0, RESTORED_OWNER, None);
                    self.stats.promoted += 1;
                    self.log(Event::Promoted { id: e.id });
                }
                Kind::Ttr => {
                    self.leave(k);
                    self.enter(k, Status::Ready, 0, RESTORED_OWNER, None);
                    self.stats.ttr_returned += 1;
                    self.log(Event::TtrReturned { id: e.id });
                }
            }
            processed += 1;
        }
        Advance {
            processed,
            next_deadline: self.next_deadline(),
        }
    }

    /// The earliest pending deadline, if any.
    pub fn next_deadline(&self) -> Option<Micros> {
        self.heap.peek().map(|e| e.at)
    }

    pub fn get(&self, id: TaskId) -> Option<TaskRef<'_>> {
        let &k = self.index.get(&id)?;
        Some(self.slots[k as usize].view())
    }

    /// Counts now and operations since start. O(1).
    pub fn stats(&self) -> Stats {
        Stats {
            total: self.slots.len() as u64,
            ready: self.lists[list_ix(Status::Ready)].len() as u64,
            taken: self.lists[list_ix(Status::Taken)].len() as u64,
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
    /// `release_all_taken` once recovery is done) and without a TTR deadline. Journals nothing.
    pub fn restore(&mut self, task: RestoredTask) -> Result<(), QueueError> {
        if self.index.contains_key(&task.id) {
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
        let runat = if task.status == Status::Waiting {
            task.runat
        } else {
            0
        };
        self.enter(k, task.status, runat, RESTORED_OWNER, None);
        Ok(())
    }

    /// Recovery: removes a task (ack or expiry replay). Journals nothing.
    pub fn restore_remove(&mut self, id: TaskId) -> Option<Task> {
        let &k = self.index.get(&id)?;
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
        let &k = self.index.get(&id).ok_or(QueueError::NotFound(id))?;
        self.leave(k);
        let runat = if status == Status::Waiting { runat } else { 0 };
        self.enter(k, status, runat, RESTORED_OWNER, None);
        Ok(())
    }

    /// Recovery: new ids continue above `id` (never lowers the current last id).
    pub fn set_last_id(&mut self, id: TaskId) {
        self.last_id = self.last_id.max(id);
    }

    /// Every live task, in no particular order (snapshots).
    pub fn iter(&self) -> impl Iterator<Item = TaskRef<'_>> {
        self.slots.iter().map(|(_, s)| s.view())
    }

    /// Panics with a message naming the broken invariant. O(n log n); for tests and debugging.
    pub fn check_invariants(&self) {
        let n = self.slots.len();
        assert_eq!(
            self.index.len(),
            n,
            "index holds {} ids for {n} tasks",
            self.index.len()
        );
        for (&id, &k) in &self.index {
            let s = self
                .slots
                .get(k as usize)
                .unwrap_or_else(|| panic!("index maps {id} to free slot {k}"));
            assert_eq!(
                s.id, id,
                "index maps {id} to slot {k} holding task {}",
                s.id
            );
        }
        let mut listed = 0;
        for status in [Status::Ready, Status::Taken, Status::Waiting] {
            let list = &self.lists[list_ix(status)];
            listed += list.check(&self.slots);
            for k in list.iter(&self.slots) {
                let s = &self.slots[k as usize];
                assert_eq!(
                    s.status, status,
                    "task {} is {:?} in the {status:?} list",
                    s.id, s.status
                );
            }
        }
        assert_eq!(listed, n, "lists hold {listed} tasks, arena {n}");
        self.heap.check(&self.slots);
        let mut entries = 0;
        for (k, s) in self.slots.iter() {
            assert!(
                s.id != 0 && s.id <= self.last_id,
                "task {} beyond last id {}",
                s.id,
                self.last_id
            );
            assert!(
                s.status == Status::Waiting || s.runat == 0,
                "task {} is {:?} with runat {}",
                s.id,
                s.status,
                s.runat
            );
            if s.flags & HAS_TTL != 0 {
                assert_ne!(
                    s.ttl_pos, NIL,
                    "task {} has a ttl but no expiry entry",
                    s.id
                );
                let e = self.heap.get(s.ttl_pos);
                assert_eq!(e.slot as usize, k);
                assert_eq!(
                    e.at,
                    s.created.saturating_add(s.ttl),
                    "task {} expiry time",
                    s.id
                );
                entries += 1;
            } else {
                assert_eq!(
                    s.ttl_pos, NIL,
                    "task {} has no ttl but an expiry entry",
                    s.id
                );
            }
            match s.status {
                Status::Ready => {
                    assert_eq!(s.tm_pos, NIL, "ready task {} has a timer", s.id)
                }
                Status::Waiting => {
                    assert_ne!(s.tm_pos, NIL, "waiting task {} has no runat entry", s.id);
                    let e = self.heap.get(s.tm_pos);
                    assert_eq!(
                        (e.kind, e.at),
                        (Kind::Promote, s.runat),
                        "task {} runat",
                        s.id
                    );
                    entries += 1;
                }
                Status::Taken => {
                    if s.tm_pos != NIL {
                        let e = self.heap.get(s.tm_pos);
                        assert_eq!(e.kind, Kind::Ttr, "taken task {} timer kind", s.id);
                        assert!(
                            s.flags & HAS_TTR != 0,
                            "task {} has a TTR entry, no ttr",
                            s.id
                        );
                        entries += 1;
                    }
                }
            }
            if s.status != Status::Taken {
                assert_eq!(
                    (s.s_prev, s.s_next),
                    (NIL, NIL),
                    "task {} in a session list",
                    s.id
                );
            }
        }
        assert_eq!(entries, self.heap.len(), "heap holds entries of no task");
        let mut in_sessions = 0;
        for (&sid, list) in &self.sessions {
            assert!(list.len > 0, "session {sid} kept with an empty list");
            let (mut k, mut prev, mut len) = (list.head, NIL, 0);
            while k != NIL {
                let s = &self.slots[k as usize];
                assert_eq!(
                    s.status,
                    Status::Taken,
                    "task {} in session {sid} is {:?}",
                    s.id,
                    s.status
                );
                assert_eq!(
                    s.owner, sid,
                    "task {} owned by {} in session {sid}",
                    s.id, s.owner
                );
                assert_eq!(s.s_prev, prev, "session {sid}: task {} back link", s.id);
                prev = k;
                k = s.s_next;
                len += 1;
                assert!(
                    len <= list.len,
                    "session {sid} list longer than {}",
                    list.len
                );
            }
            assert_eq!(prev, list.tail, "session {sid} tail");
            assert_eq!(len, list.len, "session {sid} length");
            in_sessions += len as usize;
        }
        let taken = self.lists[list_ix(Status::Taken)].len();
        assert_eq!(
            in_sessions, taken,
            "{taken} taken tasks, {in_sessions} in sessions"
        );
    }

    // ---- internals ----

    fn log(&mut self, e: Event) {
        if self.journal_on {
            self.journal.push(e);
        }
    }

    /// The slot of task `id` if `sid` holds it, else the seed's error for why not.
    fn owned(&self, sid: SessionId, id: TaskId) -> Result<u32, QueueError> {
        let &k = self.index.get(&id).ok_or(QueueError::NotFound(id))?;
        let s = &self.slots[k as usize];
        if s.status != Status::Taken {
            return Err(QueueError::NotTaken(id));
        }
        if s.owner != sid {
            return Err(QueueError::NotOwner {
                id,
                owner: s.owner,
                caller: sid,
            });
        }
        Ok(k)
    }

    /// Allocates a slot (in no list yet), indexes it and schedules its expiry.
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
        let flags =
            if ttl.is_some() { HAS_TTL } else { 0 } | if ttr.is_some() { HAS_TTR } else { 0 };
        let k = self.slots.insert(Slot {
            id,
            pri,
            created,
            runat: 0,
            ttl: ttl.unwrap_or(0),
            ttr: ttr.unwrap_or(0),
            owner: RESTORED_OWNER,
            data,
            ttl_pos: NIL,
            tm_pos: NIL,
            s_prev: NIL,
            s_next: NIL,
            // Not in any list yet; `enter` sets the real status.
            status: Status::Ready,
            flags,
        }) as u32;
        self.index.insert(id, k);
        if let Some(ttl) = ttl {
            let at = created.saturating_add(ttl);
            self.heap.push(
                Entry {
                    at,
                    id,
                    slot: k,
                    kind: Kind::Expire,
                },
                &mut self.slots,
            );
        }
        k
    }

    /// Puts an unlisted slot into `status`: its list, its timer, its session.
    fn enter(
        &mut self,
        k: u32,
        status: Status,
        runat: Micros,
        owner: SessionId,
        ttr_at: Option<Micros>,
    ) {
        let s = &mut self.slots[k as usize];
        s.status = status;
        s.runat = runat;
        let id = s.id;
        self.lists[list_ix(status)].insert(&mut self.slots, k);
        match status {
            Status::Ready => {}
            Status::Waiting => self.heap.push(
                Entry {
                    at: runat,
                    id,
                    slot: k,
                    kind: Kind::Promote,
                },
                &mut self.slots,
            ),
            Status::Taken => {
                self.slots[k as usize].owner = owner;
                self.session_append(owner, k);
                if let Some(at) = ttr_at {
                    self.heap.push(
                        Entry {
                            at,
                            id,
                            slot: k,
                            kind: Kind::Ttr,
                        },
                        &mut self.slots,
                    );
                }
            }
        }
    }

    /// Takes a slot out of its status: list, timer (runat/TTR) and session. The TTL stays.
    fn leave(&mut self, k: u32) {
        if self.slots[k as usize].status == Status::Taken {
            self.session_remove(k);
        }
        self.leave_detached(k);
    }

    /// `leave` for a slot already out of its session list.
    fn leave_detached(&mut self, k: u32) {
        let s = &self.slots[k as usize];
        let (status, tm) = (s.status, s.tm_pos);
        self.lists[list_ix(status)].remove(&mut self.slots, k);
        if tm != NIL {
            self.heap.remove(tm, &mut self.slots);
        }
        self.slots[k as usize].runat = 0;
    }

    /// Removes a task from every structure and returns it as it was.
    fn delete(&mut self, k: u32) -> Task {
        let s = &self.slots[k as usize];
        let (status, runat) = (s.status, s.runat);
        self.leave(k);
        let ttl_pos = self.slots[k as usize].ttl_pos;
        if ttl_pos != NIL {
            self.heap.remove(ttl_pos, &mut self.slots);
        }
        let mut slot = self.slots.remove(k as usize);
        self.index.remove(&slot.id);
        // `leave` cleared runat; give the caller the task as it was.
        slot.status = status;
        slot.runat = runat;
        slot.into_task()
    }

    fn session_append(&mut self, sid: SessionId, k: u32) {
        let list = self.sessions.entry(sid).or_insert(SessionList {
            head: NIL,
            tail: NIL,
            len: 0,
        });
        let tail = list.tail;
        if tail == NIL {
            list.head = k;
        } else {
            self.slots[tail as usize].s_next = k;
        }
        list.tail = k;
        list.len += 1;
        let s = &mut self.slots[k as usize];
        s.s_prev = tail;
        s.s_next = NIL;
    }

    fn session_remove(&mut self, k: u32) {
        let s = &mut self.slots[k as usize];
        let (sid, prev, next) = (s.owner, s.s_prev, s.s_next);
        s.s_prev = NIL;
        s.s_next = NIL;
        let list = self
            .sessions
            .get_mut(&sid)
            .expect("a taken task's session has a list");
        if prev == NIL {
            list.head = next;
        } else {
            self.slots[prev as usize].s_next = next;
        }
        if next == NIL {
            list.tail = prev;
        } else {
            self.slots[next as usize].s_prev = prev;
        }
        list.len -= 1;
        if list.len == 0 {
            self.sessions.remove(&sid);
        }
    }
}
