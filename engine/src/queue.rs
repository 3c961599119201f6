//! `Queue`: the state machine of tasks (Ready, Taken, Waiting, Buried) in named tubes and
//! every transition between them. It owns the arena of task slots (all tubes), the id index,
//! the tubes (their lists, utubes, counters and dedup windows, see `tubes.rs`), the skiplist
//! towers, the deadline heap, the sessions and their taken lists and the event journal.
//! Nothing here blocks or reads a clock; deadlines fire only inside `advance`, never as a side
//! effect of another call. Parked takes are the server's (`tarq-net`). The seed calls (`put`,
//! `take`, `ack`, ...) work on the tube `default`; the tube calls beside them on any tube. A
//! move's export and import of a tube's tasks are in `moving.rs`, a child of this module.

use std::collections::HashMap;

// A child of this module, so the move's export and import reach the queue's own structures
// as its other transitions do, in a file of their own.
#[path = "moving.rs"]
mod moving;
pub use moving::{MovedDedup, MovedTask, EXPORT_MIN_PROBES, EXPORT_PROBES_PER_TASK};

use crate::heap::{DeadlineHeap, Entry, Kind};
use crate::index::{hash_id, IdIndex, MAX_KEY};
use crate::lists::{Towers, MAX_LEVEL};
use crate::restoring::{list_key, Bulk, BulkIds, Restoring};
use crate::room::{Room, RoomWanted};
use crate::sessions::Sessions;
use crate::slots::{NewSlot, Slot, Slots, COUNTED, HAS_TTR, TTR_ARMED};
use crate::tubes::{
    id_number, id_tube, task_id, Tube, TubeInfo, TubeNumbers, TubeOptions, TubeType, DEFAULT_TUBE,
    DEFAULT_TUBE_NAME, MAX_DEDUP_KEY_BYTES, MAX_TASK_NUMBER, MAX_TUBES, MAX_TUBE_NAME_BYTES,
    MAX_UTUBE_KEY_BYTES,
};
use crate::users::{self, User, UserError, Users};
use crate::NIL;
use crate::{
    Advance, Bytes, Event, Hold, JobCounts, Micros, PutOptions, PutOutcome, PutPayload, QueueError,
    ReleaseOptions, RestoredTask, SessionId, Stats, Status, Task, TaskId, TaskRef, TubeIx, TubePut,
    URGENT_PRI,
};

/// The session that owns tasks restored as Taken (no session survives a restart).
const RESTORED_OWNER: SessionId = 0;

/// The most live tasks a queue can hold: slot keys must fit the id index's 28 bits (and the
/// heap entry's 30). 2^28 tasks at ~100 bytes each are 27 GB, more than most machines'
/// memory; a server may set a lower limit ([`Queue::set_max_tasks`]). A put past the limit is
/// refused ([`QueueError::TooManyTasks`]); only a restore may fill the queue up to this one.
pub const MAX_TASKS: usize = MAX_KEY as usize + 1;

/// Seed of the skiplist height generator: fixed, so runs are reproducible.
const HEIGHT_SEED: u64 = 0x2545_F491_4F6C_DD1D;

/// Ok if slot `k` (task `id`) is Taken by `sid`, else why not.
fn check_owner(
    slots: &Slots,
    sessions: &Sessions,
    k: u32,
    sid: SessionId,
    id: TaskId,
) -> Result<(), QueueError> {
    let s = &slots[k as usize];
    let hold = if s.status != Status::Taken {
        Hold::Untaken(s.status)
    } else {
        match sessions.owner(s.owner_ix()) {
            owner if owner == sid => return Ok(()),
            owner => Hold::TakenBy(owner),
        }
    };
    Err(not_held(id, sid, hold))
}

/// `sid` does not hold task `id`, for the reason `hold`.
fn not_held(id: TaskId, sid: SessionId, hold: Hold) -> QueueError {
    QueueError::NotHeld {
        id,
        caller: sid,
        hold,
    }
}

/// Why a Taken task goes back (for its counter and event), unless `max_deliveries` buries it.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Return {
    Release,
    Ttr,
    Auto,
}

/// (pri, id) of slot `k`: the order of every list.
fn order(slots: &Slots, k: u32) -> (i64, TaskId) {
    let s = &slots[k as usize];
    (s.pri, s.id)
}

/// Up to this many tube indexes, `tube_ix` compares names instead of hashing.
const SCAN_TUBES: usize = 8;

/// The queue. See the crate docs and `docs/design/engine.md`.
#[derive(Debug)]
pub struct Queue {
    slots: Slots,
    /// id -> slot key. Holds only the u32 key: ids are compared in the slot, which every
    /// lookup reads anyway, so a bucket costs 4 bytes plus 1 control byte.
    index: IdIndex,
    /// By `TubeIx`; `None` for a dropped tube's index. Index 0 is `default`.
    tubes: Vec<Option<Tube>>,
    names: HashMap<Box<str>, TubeIx>,
    /// By `TubeIx`: where the next tube created at a free index starts numbering — the next
    /// number of the last tube dropped there (0 at an index never used, or past the end).
    /// Only read for a free index: a live tube keeps its own start (`TubeNumbers::first`).
    floors: Vec<u64>,
    /// The operation counters of every tube dropped so far (its counts of tasks at zero):
    /// [`Queue::all_stats`] adds them, so the node's counters never go down when a tube goes
    /// (a drop, a beanstalk tube forgotten, a partition let go after a move).
    retired: Stats,
    /// With the journal on, the tubes whose operation counters changed since the last
    /// `take_counted` (each marked `Tube::counted`), and whether `retired` did: the WAL logs
    /// their counters at the end of the turn, so they survive a restart and reach replicas.
    counted: Vec<TubeIx>,
    retired_counted: bool,
    /// Tubes with a dedup window, which `advance` prunes.
    dedup_tubes: Vec<TubeIx>,
    towers: Towers,
    heap: DeadlineHeap,
    sessions: Sessions,
    /// xorshift64 state for skiplist heights.
    rng: u64,
    journal_on: bool,
    journal: Vec<Event>,
    /// The task the last put or take touched, as (id, slot key): the journal reads that task
    /// right after the call that logged it (a put's record is the whole task, a take's carries
    /// its delivery count), and `find` answers it from here without probing the index, whose
    /// probe reads the slots of other tasks sharing the home bucket (cache misses in a big
    /// queue). Checked against the slot, so a removed task or a reused slot never matches.
    recent: (TaskId, u32),
    /// Live tasks past which a put is refused; at most [`MAX_TASKS`].
    max_tasks: usize,
    /// Users and their grants: data the journal keeps, read by the server (`users.rs`).
    users: Users,
}

impl Default for Queue {
    fn default() -> Self {
        Self::new()
    }
}

/// Taken tasks [`Queue::list`] looks at in one call: a page of a console's task browser
/// costs the loop at most this (about a millisecond) however many tasks are taken.
pub const MAX_TAKEN_WALK: usize = 100_000;

impl Queue {
    /// An empty queue holding the tube `default` (a `fifottl` with no default TTL or TTR).
    pub fn new() -> Self {
        // The seed's ids start at 1.
        let numbers = TubeNumbers {
            next: 1,
            ..TubeNumbers::default()
        };
        let default = Tube::new(
            DEFAULT_TUBE_NAME,
            TubeType::FifoTtl,
            TubeOptions::default(),
            numbers,
        );
        Queue {
            slots: Slots::default(),
            index: IdIndex::default(),
            tubes: vec![Some(default)],
            names: HashMap::from([(DEFAULT_TUBE_NAME.into(), DEFAULT_TUBE)]),
            floors: Vec::new(),
            retired: Stats::default(),
            counted: Vec::new(),
            retired_counted: false,
            dedup_tubes: Vec::new(),
            towers: Towers::default(),
            heap: DeadlineHeap::default(),
            sessions: Sessions::default(),
            rng: HEIGHT_SEED,
            journal_on: false,
            journal: Vec::new(),
            recent: (0, NIL),
            max_tasks: MAX_TASKS,
            users: Users::default(),
        }
    }

    /// Refuses puts once the queue holds `max` live tasks (at most [`MAX_TASKS`], which a
    /// greater `max` means). Tasks held already stay: a lower limit only refuses puts until
    /// acks, deletes and expiries bring the count below it. Restores are not refused.
    pub fn set_max_tasks(&mut self, max: usize) {
        self.max_tasks = max.min(MAX_TASKS);
    }

    /// Live tasks past which a put is refused.
    pub fn max_tasks(&self) -> usize {
        self.max_tasks
    }

    // ---- the seed API: the tube `default` ----

    /// Adds a task to `default`: Ready, or Waiting until `now + delay`. Ids go up by one from
    /// `last_id`. (The TTL counts from the put, the delay does not extend it.) Panics where
    /// [`try_put`](Self::try_put) refuses: a caller that may get there calls that instead.
    pub fn put(&mut self, now: Micros, data: impl PutPayload, opts: PutOptions) -> TaskRef<'_> {
        self.try_put(now, data, opts)
            .unwrap_or_else(|e| panic!("put refused: {e}"))
    }

    /// [`put`](Self::put), refused once `default` has given out its 2^41 ids
    /// ([`QueueError::TubeNumbersSpent`]) or the queue holds [`max_tasks`](Self::max_tasks)
    /// tasks ([`QueueError::TooManyTasks`]).
    pub fn try_put(
        &mut self,
        now: Micros,
        data: impl PutPayload,
        opts: PutOptions,
    ) -> Result<TaskRef<'_>, QueueError> {
        if !self.numbers_left(DEFAULT_TUBE) {
            return Err(QueueError::TubeNumbersSpent {
                name: DEFAULT_TUBE_NAME.to_string(),
            });
        }
        self.room_for_a_task()?;
        let k = self.add_task(now, DEFAULT_TUBE, data, opts, NIL);
        Ok(self.view(k))
    }

    /// Ok while a put may add a task: fewer than `max_tasks` are live.
    fn room_for_a_task(&self) -> Result<(), QueueError> {
        if self.slots.len() >= self.max_tasks {
            return Err(QueueError::TooManyTasks {
                max: self.max_tasks,
            });
        }
        Ok(())
    }

    /// Takes the ready task of `default` with the lowest (pri, id) for session `sid`, if any.
    pub fn take(&mut self, now: Micros, sid: SessionId) -> Option<TaskRef<'_>> {
        let k = self.take_slot(now, DEFAULT_TUBE, sid)?;
        Some(self.view(k))
    }

    /// Deletes a task of `default` taken by `sid` and returns it as it was (status Taken).
    pub fn ack(&mut self, sid: SessionId, id: TaskId) -> Result<Task, QueueError> {
        self.ack_held(DEFAULT_TUBE, sid, id)
    }

    /// Gives a task of `default` taken by `sid` back: Ready at its place by (pri, id), or
    /// Waiting until `now + delay` when `delay > 0`.
    pub fn release(
        &mut self,
        now: Micros,
        sid: SessionId,
        id: TaskId,
        delay: Micros,
    ) -> Result<TaskRef<'_>, QueueError> {
        let k = self.taken_in(DEFAULT_TUBE, sid, id)?;
        let runat = if delay == 0 {
            0
        } else {
            now.saturating_add(delay)
        };
        self.give_back(k, runat, Return::Release);
        Ok(self.view(k))
    }

    /// Returns every task `sid` holds, in any tube, to Ready (or Buried, past its tube's
    /// `max_deliveries`), in the order it took them, and forgets the session. O(tasks it holds).
    pub fn release_session(&mut self, sid: SessionId) -> usize {
        let Some(mut k) = self.sessions.detach(sid) else {
            return 0;
        };
        let mut n = 0;
        while k != NIL {
            // Out of the detached session's list (its `sess` cleared): `leave` must not
            // unlink it again.
            let next = self.sessions.pop_detached(&mut self.slots, k);
            self.give_back(k, 0, Return::Auto);
            n += 1;
            k = next;
        }
        n
    }

    /// Returns every Taken task of every tube to Ready, in (pri, id) order (restart: no
    /// session survives), and forgets every session.
    /// O(t log t) for t taken tasks: they are listed by session, so this sorts them (once per
    /// restart, not on the request path).
    pub fn release_all_taken(&mut self) -> usize {
        let mut taken = self.sessions.taken_slots(&self.slots);
        let slots = &self.slots;
        taken.sort_unstable_by_key(|&k| order(slots, k));
        for &k in &taken {
            self.give_back(k, 0, Return::Auto);
        }
        self.sessions.clear();
        taken.len()
    }

    /// Fires due deadlines (`at <= now`) in (time, number in the tube, id) order, at most
    /// `budget` of them: Waiting -> Ready, TTL expiry (deleted), TTR (Taken -> Ready).
    /// O(budget log n). Also forgets dedup keys whose window has passed (at most `budget` per
    /// tube, not counted).
    pub fn advance(&mut self, now: Micros, budget: usize) -> Advance {
        let mut processed = 0;
        while processed < budget {
            let e = match self.heap.peek() {
                Some(e) if e.at <= now => *e,
                _ => break,
            };
            let k = e.slot();
            let (id, tube) = (self.slots[k as usize].id, self.slots[k as usize].tube);
            match e.kind() {
                Kind::Expire => {
                    self.remove_slot(k);
                    self.ops_mut(tube).expired += 1;
                    self.log(Event::Expired { id });
                }
                Kind::Promote => {
                    self.move_to(k, Status::Ready, 0);
                    self.ops_mut(tube).promoted += 1;
                    self.log(Event::Promoted { id });
                }
                Kind::Ttr => {
                    self.give_back(k, 0, Return::Ttr);
                }
            }
            processed += 1;
        }
        for i in 0..self.dedup_tubes.len() {
            let t = self.dedup_tubes[i];
            if let Some(d) = self.tube_mut(t).dedup.as_mut() {
                d.prune(now, budget);
            }
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

    /// The live task `id`, in any tube.
    pub fn get(&self, id: TaskId) -> Option<TaskRef<'_>> {
        self.find(id).map(|k| self.view(k))
    }

    /// Task `id`'s payload as a shared handle to the buffer the queue holds it in, when it is
    /// over [`INLINE_PAYLOAD`](crate::INLINE_PAYLOAD) bytes: the log and a reply can keep a
    /// big payload without copying it (a clone counts a reference). `None` for an absent task
    /// or a small payload (copy those: they are in the queue's records).
    pub fn shared_payload(&self, id: TaskId) -> Option<Bytes> {
        self.find(id)
            .and_then(|k| self.slots.shared_payload(k).cloned())
    }

    /// Counts now and operations since start, of the tube `default`. O(1).
    pub fn stats(&self) -> Stats {
        self.tube(DEFAULT_TUBE).stats()
    }

    /// The whole queue's figures, every tube's summed: the tasks of the tubes there are now,
    /// and the operations of every tube since the queue was made (those of dropped tubes
    /// too, so a counter never goes down). O(tubes).
    pub fn all_stats(&self) -> Stats {
        let mut all = self.retired;
        for ix in 0..self.tubes.len() {
            if let Ok(s) = self.tube_stats(ix as TubeIx) {
                all += &Stats {
                    ready_since: self.ready_since(ix as TubeIx),
                    ..s
                };
            }
        }
        all
    }

    /// The newest id `default` gave out (0 for none): the seed API's ids count up from 1.
    pub fn last_id(&self) -> TaskId {
        self.tube(DEFAULT_TUBE).numbers.next - 1
    }

    /// Whether `tube` has a number left for a put.
    pub fn numbers_left(&self, tube: TubeIx) -> bool {
        self.live_tube(tube)
            .is_ok_and(|t| t.numbers.next <= MAX_TASK_NUMBER)
    }

    /// The id the tube API means by task `number` of `tube`: the tube's own number (counted
    /// from its `first`), or, below the tube's `legacy_below` mark, the id a task kept from
    /// before tubes numbered their own. A number past `MAX_TASK_NUMBER` is taken as a whole id
    /// (one a beanstalk client or the seed API showed), which the tube calls then find only if
    /// it is the tube's; so is one past the numbers left at the tube's index (no task has it).
    /// O(1).
    #[inline]
    pub fn task_id_in(&self, tube: TubeIx, number: u64) -> TaskId {
        self.tube_numbers(tube).id_of(tube, number)
    }

    /// How `tube` numbers its tasks (all zero for a missing tube): what the tube API's
    /// front-end reads once per call to turn numbers into ids and back
    /// (`TubeNumbers::id_of`, [`number_from`](crate::tubes::number_from)). O(1).
    #[inline]
    pub fn tube_numbers(&self, tube: TubeIx) -> TubeNumbers {
        self.tubes
            .get(tube as usize)
            .and_then(Option::as_ref)
            .map_or(TubeNumbers::default(), |t| t.numbers)
    }

    /// The number the tube API shows for task `id` of `tube`: the number it packs counted
    /// from the tube's `first` (so a tube numbers from 0 wherever its index's numbers stand).
    /// An id that is not one of the tube's own numbers — kept from before tubes numbered
    /// their own, another tube's — is shown whole, as `task_id_in` reads it. O(1).
    #[inline]
    pub fn task_number(&self, tube: TubeIx, id: TaskId) -> u64 {
        crate::tubes::number_from(tube, self.tube_numbers(tube).first, id)
    }

    /// Where each free tube index's next tube starts numbering (`TubeNumbers::first`), for
    /// the indexes where that is not 0: what a snapshot keeps beside the tube table, so a
    /// tube created after a restart does not give a dropped tube's ids again.
    pub fn floors(&self) -> impl Iterator<Item = (TubeIx, u64)> + '_ {
        let free = |ix: usize| self.tubes.get(ix).is_none_or(Option::is_none);
        (self.floors.iter().enumerate())
            .filter(move |&(ix, &floor)| floor > 0 && free(ix))
            .map(|(ix, &floor)| (ix as TubeIx, floor))
    }

    /// Live tasks in every tube.
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
            self.take_counted(&mut Vec::new());
        }
    }

    /// The events since the last drain, in order. The buffer is reused: no allocation once warm.
    pub fn drain_events(&mut self) -> std::vec::Drain<'_, Event> {
        self.journal.drain(..)
    }

    /// Moves the events since the last call into `into`, which must be empty, in order, by
    /// swapping buffers: no event is copied, and the caller's (emptied) buffer becomes the
    /// journal's, so two buffers take turns with no allocation once warm. For a caller that
    /// reads the queue while it goes through the events (the server's journal), which a
    /// [`drain_events`](Self::drain_events) borrow forbids.
    #[inline]
    pub fn take_events(&mut self, into: &mut Vec<Event>) {
        debug_assert!(
            into.is_empty(),
            "take_events into a buffer still holding events"
        );
        std::mem::swap(&mut self.journal, into);
    }

    // ---- users ----

    /// The users and their grants.
    pub fn users(&self) -> &Users {
        &self.users
    }

    /// Adds or replaces `user` (checked against the table's limits), journaled.
    pub fn put_user(&mut self, user: User) -> Result<(), UserError> {
        users::check(&self.users, &user)?;
        self.users.put(user);
        self.users_changed();
        Ok(())
    }

    /// Removes user `name`, journaled; `None` if there is none.
    pub fn drop_user(&mut self, name: &str) -> Option<User> {
        let gone = self.users.remove(name)?;
        self.users_changed();
        Some(gone)
    }

    /// Replaces the whole table as a log or a snapshot holds it; journals nothing.
    pub fn restore_users(&mut self, users: Vec<User>) {
        self.users.replace(users);
    }

    fn users_changed(&mut self) {
        if self.journal_on {
            self.journal.push(Event::UsersChanged);
        }
    }

    // ---- tubes ----

    /// Creates a tube at the lowest free index. A `*ttl` tube's default TTR is its default TTL
    /// when not given (the original's rule). `if_not_exists` is the caller's: look the name up
    /// with `tube_ix` first.
    pub fn create_tube(
        &mut self,
        name: &str,
        kind: TubeType,
        opts: TubeOptions,
    ) -> Result<TubeIx, QueueError> {
        check_tube_name(name)?;
        if self.names.contains_key(name) {
            return Err(QueueError::TubeExists(name.to_owned()));
        }
        let ix = match self.tubes.iter().position(Option::is_none) {
            Some(ix) => ix as TubeIx,
            None if self.tubes.len() < MAX_TUBES => self.tubes.len() as TubeIx,
            None => return Err(QueueError::TooManyTubes { max: MAX_TUBES }),
        };
        // At a free index, numbering from the index's floor.
        self.create_tube_at(ix, name, kind, opts, 0)?;
        Ok(ix)
    }

    /// Creates a tube at index `ix` (a sharded cluster's placement names every tube's index,
    /// the same on every node), its numbers starting at `first` or at the index's own floor if
    /// that is higher (no id is given twice at an index). A tube that is there already with
    /// this name, type and partition is kept (`Ok(false)`), its numbering raised to `first`
    /// if that is further: placement is applied again after every change. Journaled as
    /// `create_tube`.
    pub fn create_tube_at(
        &mut self,
        ix: TubeIx,
        name: &str,
        kind: TubeType,
        mut opts: TubeOptions,
        first: u64,
    ) -> Result<bool, QueueError> {
        check_tube_name(name)?;
        if ix as usize >= MAX_TUBES {
            return Err(QueueError::TooManyTubes { max: MAX_TUBES });
        }
        if let Some(t) = self.tubes.get(ix as usize).and_then(Option::as_ref) {
            if *t.name == *name && t.kind == kind && t.opts.part == opts.part {
                // Placed here again (it moved away and back): it numbers on from the
                // placement's first if that is further, so no id is given twice.
                if first > t.numbers.next {
                    self.tube_mut(ix).numbers.next = first;
                    self.log(Event::TubeCreated { tube: ix });
                }
                return Ok(false);
            }
            return Err(QueueError::TubeExists(t.name.to_string()));
        }
        if opts.part == 0 && self.names.contains_key(name) {
            return Err(QueueError::TubeExists(name.to_owned()));
        }
        if opts.ttr.is_none() {
            opts.ttr = opts.ttl;
        }
        if self.tubes.len() <= ix as usize {
            self.tubes.resize_with(ix as usize + 1, || None);
        }
        let first = first.max(self.floors.get(ix as usize).copied().unwrap_or(0));
        let numbers = TubeNumbers {
            next: first.max(u64::from(ix == DEFAULT_TUBE)),
            first: if ix == DEFAULT_TUBE { 0 } else { first },
            legacy_below: 0,
        };
        self.install_tube(ix, name, kind, opts, numbers);
        self.log(Event::TubeCreated { tube: ix });
        Ok(true)
    }

    /// Drops a tube and every task in it. Refused for `default` and while a task of the tube
    /// is Taken (the original's rule; parked takes on it are the server's to refuse).
    pub fn drop_tube(&mut self, tube: TubeIx) -> Result<(), QueueError> {
        self.check_droppable(tube)?;
        self.clear_tube(tube);
        self.uninstall_tube(tube);
        self.log(Event::TubeDropped { tube });
        Ok(())
    }

    /// Makes tube `tube` permanent if it was made on demand (beanstalk's `use` or `watch`):
    /// `create_tube` of a tube that exists keeps it from then on, as the original keeps every
    /// tube it creates. Journaled as the tube's record (what it is now). Ok(false): it was
    /// permanent already.
    pub fn keep_tube(&mut self, tube: TubeIx) -> Result<bool, QueueError> {
        let t = self.live_tube(tube)?;
        if !t.opts.on_demand {
            return Ok(false);
        }
        self.tube_mut(tube).opts.on_demand = false;
        self.log(Event::TubeCreated { tube });
        Ok(true)
    }

    /// Drops tube `tube` if it was made on demand (`TubeOptions::on_demand`) and holds no
    /// task: journaled as any drop. Whether anything still uses it (a beanstalk connection,
    /// a parked take) is the caller's to know. Ok(false): kept (made by `create_tube`,
    /// `default`, or not empty).
    pub fn drop_if_unneeded(&mut self, tube: TubeIx) -> Result<bool, QueueError> {
        let t = self.live_tube(tube)?;
        if tube == DEFAULT_TUBE || !t.opts.on_demand || t.total() > 0 {
            return Ok(false);
        }
        self.drop_tube(tube)?;
        Ok(true)
    }

    /// Deletes every task of a tube, Taken ones included, and its dedup keys; counters stay
    /// (as the original's `truncate`). Returns how many tasks went. O(tasks of the tube +
    /// taken tasks of all tubes).
    pub fn truncate(&mut self, tube: TubeIx) -> Result<usize, QueueError> {
        self.live_tube(tube)?;
        let n = self.clear_tube(tube);
        self.log(Event::TubeTruncated { tube });
        Ok(n)
    }

    /// The tube named `name`.
    pub fn tube_ix(&self, name: &str) -> Option<TubeIx> {
        // A few tubes (the usual case; every tube-API call asks) are compared directly:
        // cheaper than hashing the name.
        if self.tubes.len() <= SCAN_TUBES {
            let found = self.tubes.iter().position(|t| {
                t.as_ref()
                    .is_some_and(|t| t.opts.part == 0 && *t.name == *name)
            });
            return found.map(|i| i as TubeIx);
        }
        self.names.get(name).copied()
    }

    pub fn tube_info(&self, tube: TubeIx) -> Option<TubeInfo<'_>> {
        let t = self.tubes.get(tube as usize)?.as_ref()?;
        Some(TubeInfo {
            ix: tube,
            name: &t.name,
            kind: t.kind,
            opts: t.opts,
            numbers: t.numbers,
        })
    }

    /// Every tube, by index, partitions included (`TubeOptions::part`).
    pub fn tubes(&self) -> impl Iterator<Item = TubeInfo<'_>> {
        (0..self.tubes.len()).filter_map(|i| self.tube_info(i as TubeIx))
    }

    /// The tubes a name finds: every tube but the partitions after a partitioned tube's first.
    pub fn named_tubes(&self) -> impl Iterator<Item = TubeInfo<'_>> {
        self.tubes().filter(|t| t.opts.part == 0)
    }

    /// A tube's counts and operations. O(1).
    pub fn tube_stats(&self, tube: TubeIx) -> Result<Stats, QueueError> {
        Ok(self.live_tube(tube)?.stats())
    }

    /// When the ready task a take from `tube` gets next was put, 0 while none is ready (or
    /// no such tube): `Stats::ready_since`, which `tube_stats` leaves 0 (the figures' paths
    /// ask for it; the router's many `tube_stats` calls need only the counts). O(1).
    pub fn ready_since(&self, tube: TubeIx) -> Micros {
        (self.live_tube(tube).ok())
            .and_then(|t| t.ready.first())
            .map_or(0, |k| self.slots.created(k))
    }

    /// By tube index, how many sessions hold at least one of the tube's tasks now. O(taken
    /// tasks): each session's list is walked once.
    pub fn holders(&self) -> Vec<u64> {
        self.sessions.holders(&self.slots, self.tubes.len())
    }

    /// A take from the tube would return a task now (in a utube tube, `stats().ready > 0`
    /// does not say so: every ready task may wait behind a taken one of its utube). O(1).
    pub fn can_take(&self, tube: TubeIx) -> bool {
        self.tubes
            .get(tube as usize)
            .and_then(Option::as_ref)
            .is_some_and(|t| t.ready.len() > 0)
    }

    /// Puts into a tube, with the tube's defaults for what `p` leaves out and the type's
    /// rules: fifo / utube ignore pri, delay, TTL and TTR; a delay extends the TTL (except in
    /// `default`, which keeps the seed's rule); limfifottl refuses a put at capacity; a dedup
    /// key seen within the window returns the earlier task.
    pub fn put_in(
        &mut self,
        now: Micros,
        tube: TubeIx,
        data: impl PutPayload,
        p: TubePut<'_>,
    ) -> Result<PutOutcome<'_>, QueueError> {
        let t = self.live_tube(tube)?;
        if let Some(key) = p.dedup_key {
            if key.len() > MAX_DEDUP_KEY_BYTES {
                return Err(QueueError::DedupKeyTooLong {
                    len: key.len(),
                    max: MAX_DEDUP_KEY_BYTES,
                });
            }
            if let Some(id) = t.dedup.as_ref().and_then(|d| d.lookup(key, now)) {
                self.ops_mut(tube).deduplicated += 1;
                return Ok(match self.find(id) {
                    Some(k) => PutOutcome::Duplicate(self.view(k)),
                    None => PutOutcome::DuplicateDone(id),
                });
            }
        }
        if t.kind.is_utube() && p.utube.len() > MAX_UTUBE_KEY_BYTES {
            return Err(QueueError::UtubeKeyTooLong {
                len: p.utube.len(),
                max: MAX_UTUBE_KEY_BYTES,
            });
        }
        if t.kind == TubeType::LimFifoTtl && t.opts.capacity > 0 && t.total() >= t.opts.capacity {
            return Err(QueueError::TubeFull {
                name: t.name.to_string(),
                capacity: t.opts.capacity,
            });
        }
        if t.numbers.next > MAX_TASK_NUMBER {
            // Spent by this tube or by the tubes before it at its index.
            return Err(QueueError::TubeNumbersSpent {
                name: t.name.to_string(),
            });
        }
        self.room_for_a_task()?;
        let opts = Self::put_options(t, tube, &p);
        let utube = match self.tube_mut(tube).utubes.as_mut() {
            Some(u) => u.intern(p.utube),
            None => NIL,
        };
        let k = self.add_task(now, tube, data, opts, utube);
        if let Some(key) = p.dedup_key {
            self.record_dedup(now, tube, key, k);
        }
        Ok(PutOutcome::Created(self.view(k)))
    }

    /// Takes the next task of a tube for `sid`: lowest (pri, id) among its Ready tasks, in a
    /// utube tube among the heads of utubes with none Taken. O(log n), whatever the number of
    /// busy utubes.
    pub fn take_from(
        &mut self,
        now: Micros,
        tube: TubeIx,
        sid: SessionId,
    ) -> Result<Option<TaskRef<'_>>, QueueError> {
        self.live_tube(tube)?;
        Ok(self.take_slot(now, tube, sid).map(|k| self.view(k)))
    }

    /// Deletes a task of `tube` taken by `sid`; the task as it was.
    pub fn ack_in(&mut self, tube: TubeIx, sid: SessionId, id: TaskId) -> Result<Task, QueueError> {
        self.live_tube(tube)?;
        self.ack_held(tube, sid, id)
    }

    /// Gives back a task of `tube` taken by `sid`, with the original's `delay` (which extends
    /// the TTL) and, beyond it, a new `pri` and a new remaining `ttl` (`*ttl` types; fifo and
    /// utube ignore the options). Buried instead past the tube's `max_deliveries`.
    pub fn release_in(
        &mut self,
        now: Micros,
        tube: TubeIx,
        sid: SessionId,
        id: TaskId,
        opts: ReleaseOptions,
    ) -> Result<TaskRef<'_>, QueueError> {
        let k = self.taken_in(tube, sid, id)?;
        let mut runat = 0;
        if self.tube(tube).kind.has_ttl() {
            let extends = tube != DEFAULT_TUBE;
            let changed = self.apply_release_options(k, now, opts, extends);
            if changed {
                self.log(Event::Updated { id });
            }
            if opts.delay > 0 {
                runat = now.saturating_add(opts.delay);
            }
        }
        self.give_back(k, runat, Return::Release);
        Ok(self.view(k))
    }

    /// Extends a taken task's TTL, TTR and pending TTR deadline by `delta` (`None`: no TTL, no
    /// TTR from now on), as the original's `touch`. `*ttl` types only.
    pub fn touch(
        &mut self,
        tube: TubeIx,
        sid: SessionId,
        id: TaskId,
        delta: Option<Micros>,
    ) -> Result<TaskRef<'_>, QueueError> {
        let kind = self.live_tube(tube)?.kind;
        let k = self.taken_in(tube, sid, id)?;
        // The original counts a touch by the owner before its driver runs, and a touch that
        // succeeds once more: clients comparing statistics see the same figures.
        self.ops_mut(tube).touches += 1;
        if !kind.has_ttl() {
            return Err(QueueError::TouchUnsupported(kind));
        }
        let slots = &mut self.slots;
        match delta {
            None => {
                slots[k as usize].flags &= !TTR_ARMED;
                slots.set_ttl(k, None);
                slots.set_ttr(k, None);
                slots.set_t(k, 0);
            }
            Some(d) => {
                if let Some(ttl) = slots.ttl(k) {
                    slots.set_ttl(k, Some(ttl.saturating_add(d)));
                }
                if let Some(ttr) = slots.ttr(k) {
                    slots.set_ttr(k, Some(ttr.saturating_add(d)));
                }
                if slots[k as usize].flags & TTR_ARMED != 0 {
                    let t = slots.t(k).saturating_add(d);
                    slots.set_t(k, t);
                }
            }
        }
        self.reschedule(k);
        self.ops_mut(tube).touches += 1;
        self.log(Event::Updated { id });
        Ok(self.view(k))
    }

    /// The task `id` of `tube`, whatever its status.
    pub fn peek(&self, tube: TubeIx, id: TaskId) -> Result<TaskRef<'_>, QueueError> {
        self.live_tube(tube)?;
        Ok(self.view(self.in_tube(tube, id)?))
    }

    /// Buries a task of `tube` in any status (a Taken one leaves its owner: the original asks
    /// for no ownership). A task already Buried is returned as it is, uncounted.
    pub fn bury(&mut self, tube: TubeIx, id: TaskId) -> Result<TaskRef<'_>, QueueError> {
        self.live_tube(tube)?;
        let k = self.in_tube(tube, id)?;
        if self.slots[k as usize].status != Status::Buried {
            self.move_to(k, Status::Buried, 0);
            self.slots.bump(k, |c| &mut c.buries);
            self.ops_mut(tube).buries += 1;
            self.log(Event::Buried { id });
        }
        Ok(self.view(k))
    }

    /// Makes up to `count` Buried tasks of `tube` Ready, lowest (pri, id) first; returns how
    /// many. O(count log n).
    pub fn kick(&mut self, tube: TubeIx, count: u64) -> Result<u64, QueueError> {
        self.live_tube(tube)?;
        let mut n = 0;
        while n < count {
            let Some(k) = self.tube(tube).buried.first() else {
                break;
            };
            self.kick_slot(k);
            n += 1;
        }
        Ok(n)
    }

    /// Deletes a task of `tube` in any status; the task as it was.
    pub fn delete(&mut self, tube: TubeIx, id: TaskId) -> Result<Task, QueueError> {
        self.live_tube(tube)?;
        let k = self.in_tube(tube, id)?;
        let task = self.remove_slot(k);
        self.ops_mut(tube).deletes += 1;
        self.log(Event::Deleted { id });
        Ok(task)
    }

    /// Returns every Taken task of `tube` to Ready (or Buried, past `max_deliveries`), in
    /// (pri, id) order, whoever holds it. O(taken tasks of all tubes): an operator's call.
    pub fn release_all(&mut self, tube: TubeIx) -> Result<usize, QueueError> {
        self.live_tube(tube)?;
        let mut taken = self.sessions.taken_slots(&self.slots);
        let slots = &self.slots;
        taken.retain(|&k| slots[k as usize].tube == tube);
        taken.sort_unstable_by_key(|&k| order(slots, k));
        for &k in &taken {
            self.give_back(k, 0, Return::Auto);
        }
        Ok(taken.len())
    }

    /// A dedup key a put recorded (`Event::DedupRecorded`): key, task id, expiry.
    pub fn dedup_entry(&self, tube: TubeIx, seq: u64) -> Option<(&[u8], TaskId, Micros)> {
        let t = self.tubes.get(tube as usize)?.as_ref()?;
        let e = t.dedup.as_ref()?.entry(seq)?;
        Some((&e.key, e.id, e.expires))
    }

    /// Every live dedup key of a tube, oldest first (snapshots): key, task id, expiry.
    pub fn dedup_entries(&self, tube: TubeIx) -> impl Iterator<Item = (&[u8], TaskId, Micros)> {
        let d = self
            .tubes
            .get(tube as usize)
            .and_then(Option::as_ref)
            .and_then(|t| t.dedup.as_deref());
        d.into_iter()
            .flat_map(|d| d.fifo.iter().map(|e| (&*e.key, e.id, e.expires)))
    }

    // ---- what the beanstalkd front-end needs beyond the tube calls ----

    /// The first task of `tube` in `status`: Ready → the task the next `take_from` would
    /// return (in a utube tube the lowest head: a task behind a busy utube is not next);
    /// Buried → the head of the buried list, which `kick` makes Ready next; Waiting → the
    /// task whose delay ends first (earliest runat, ties by id). Taken: `Ok(None)` (taken
    /// tasks are listed by session, and beanstalkd has no peek for them). O(1): each is the
    /// head of its list.
    pub fn peek_first(
        &self,
        tube: TubeIx,
        status: Status,
    ) -> Result<Option<TaskRef<'_>>, QueueError> {
        let t = self.live_tube(tube)?;
        let k = match status {
            Status::Ready => t.ready.first(),
            Status::Buried => t.buried.first(),
            Status::Waiting => self.first_due(tube),
            Status::Taken => None,
        };
        Ok(k.map(|k| self.view(k)))
    }

    /// beanstalkd's `kick` in a tube with no buried task: up to `count` Waiting tasks of
    /// `tube` become Ready now, earliest runat first (ties by id); returns how many. Their TTL
    /// stays as it is (in a `*ttl` tube the put's delay extended it: kicking early does not
    /// take that back). Each is a kick (`Stats::kicks`, `Event::Kicked`). O(count log n): each
    /// pops the head of the waiting list, which is ordered by (runat, id).
    pub fn kick_delayed(
        &mut self,
        now: Micros,
        tube: TubeIx,
        count: u64,
    ) -> Result<u64, QueueError> {
        // Unused: a kick sets no time and no deadline fires outside `advance`. It stays in
        // the signature the front-end calls, beside the other timed calls.
        let _ = now;
        self.live_tube(tube)?;
        let mut n = 0;
        while n < count {
            let Some(k) = self.first_due(tube) else { break };
            self.kick_slot(k);
            n += 1;
        }
        Ok(n)
    }

    /// beanstalkd's `kick-job`: task `id`, of any tube, becomes Ready if it is Buried or
    /// Waiting. `NotFound` for an unknown id, `NotKickable` for a Ready or Taken task.
    pub fn kick_task(&mut self, now: Micros, id: TaskId) -> Result<TaskRef<'_>, QueueError> {
        let _ = now; // as in `kick_delayed`
        let k = self.find(id).ok_or(QueueError::NotFound(id))?;
        match self.slots[k as usize].status {
            Status::Buried | Status::Waiting => self.kick_slot(k),
            status => return Err(QueueError::NotKickable { id, status }),
        }
        Ok(self.view(k))
    }

    /// beanstalkd's `reserve-job`: task `id` (any tube), Ready, Waiting or Buried, is Taken by
    /// `sid` as a take would (TTR armed, delivery counted, journaled as `Taken`). A utube task
    /// can be taken only when it is its utube's Ready head: a second Taken task would break
    /// the utube's exclusivity. Err `NotFound`, or `NotTakeable` naming the status.
    pub fn take_task(
        &mut self,
        now: Micros,
        sid: SessionId,
        id: TaskId,
    ) -> Result<TaskRef<'_>, QueueError> {
        let k = self.find(id).ok_or(QueueError::NotFound(id))?;
        let s = &self.slots[k as usize];
        let (status, tube, u) = (s.status, s.tube, self.slots.utube(k));
        let refused = QueueError::NotTakeable { id, status };
        if u != NIL {
            let utube = &self.tube(tube).utubes.as_ref().expect("utube tube").list[u as usize];
            if status != Status::Ready || utube.busy || utube.head != k {
                return Err(refused);
            }
        }
        match status {
            Status::Ready => {}
            // Out of its list into the ready one, uncounted: the take below is what happened.
            Status::Waiting | Status::Buried => self.move_to(k, Status::Ready, 0),
            _ => return Err(refused),
        }
        self.take_ready(now, tube, k, sid);
        Ok(self.view(k))
    }

    /// beanstalkd's `touch`: task `id`, Taken by `sid` in any tube, gets its TTR restarted:
    /// it returns at `now + ttr` (a task with no TTR is left as it is). Counted as a touch.
    /// Refused (`NotHeld`) unless `sid` holds the task.
    ///
    /// Journals nothing, on purpose: a TTR deadline is not durable state. A restart brings
    /// every Taken task back Ready (`release_all_taken`), so the WAL has nothing to replay.
    pub fn touch_ttr(
        &mut self,
        now: Micros,
        sid: SessionId,
        id: TaskId,
    ) -> Result<TaskRef<'_>, QueueError> {
        let k = self.held_by(sid, id)?;
        if let Some(ttr) = self.slots.ttr(k) {
            self.slots[k as usize].flags |= TTR_ARMED;
            self.slots.set_t(k, now.saturating_add(ttr));
            self.reschedule(k);
        }
        let tube = self.slots[k as usize].tube;
        self.ops_mut(tube).touches += 1;
        Ok(self.view(k))
    }

    /// beanstalkd's `bury <id> <pri>`: task `id`, Taken by `sid` in any tube, is Buried with
    /// pri `pri` (ignored in fifo and utube tubes, whose tasks have no pri, as `release_in`
    /// ignores it there). Counted as a bury; `max_deliveries` plays no part (the task is
    /// buried either way). Journals `Updated` if the pri changed (the WAL's Replace record
    /// carries it), then `Buried`. Errors are the seed `ack`'s.
    pub fn bury_taken(
        &mut self,
        sid: SessionId,
        id: TaskId,
        pri: i64,
    ) -> Result<TaskRef<'_>, QueueError> {
        let k = self.held_by(sid, id)?;
        let tube = self.slots[k as usize].tube;
        // Taken tasks are in no skiplist, so the pri may change before the task is listed.
        if self.tube(tube).kind.has_ttl() && self.slots[k as usize].pri != pri {
            self.slots[k as usize].pri = pri;
            self.log(Event::Updated { id });
        }
        self.move_to(k, Status::Buried, 0);
        self.slots.bump(k, |c| &mut c.buries);
        self.ops_mut(tube).buries += 1;
        self.log(Event::Buried { id });
        Ok(self.view(k))
    }

    /// When the TTR of Taken task `id` runs out; `None` if it is not Taken or has no TTR
    /// armed (no TTR, or restored Taken during recovery).
    pub fn ttr_deadline(&self, id: TaskId) -> Option<Micros> {
        let k = self.find(id)?;
        let s = &self.slots[k as usize];
        (s.status == Status::Taken && s.flags & TTR_ARMED != 0).then(|| self.slots.t(k))
    }

    /// The earliest TTR deadline among the tasks session `sid` holds (beanstalkd's
    /// `DEADLINE_SOON`). O(tasks it holds): it walks the session's list.
    pub fn soonest_ttr(&self, sid: SessionId) -> Option<Micros> {
        let mut k = self.sessions.first(sid);
        let mut soonest = None;
        while k != NIL {
            let s = &self.slots[k as usize];
            if s.flags & TTR_ARMED != 0 {
                let t = self.slots.t(k);
                soonest = Some(soonest.map_or(t, |s: Micros| s.min(t)));
            }
            k = s.next0;
        }
        soonest
    }

    /// Ready tasks of `tube` with pri below `URGENT_PRI` (beanstalkd's
    /// `current-jobs-urgent`); utube tasks waiting behind a busy utube count, as they do in
    /// `Stats::ready`. O(1): a counter kept where the tube's ready count is.
    pub fn ready_urgent(&self, tube: TubeIx) -> Result<u64, QueueError> {
        Ok(self.live_tube(tube)?.ready_urgent_n)
    }

    /// Up to `limit` tasks of `tube` in `status`, in the order its list keeps them: Ready
    /// and Buried by (pri, id) — the order takes and kicks follow —, Waiting by (runat, id),
    /// Taken session by session in take order. A page of a listing starts after task `after`
    /// when that task is still in the list, else at its head. In a utube tube the Ready list
    /// holds the head of each utube (the tasks a take can get next). O(limit) for Ready,
    /// Waiting and Buried (one lookup, then a walk of level 0); Taken walks the taken tasks of
    /// every tube, at most [`MAX_TAKEN_WALK`] of them a call (a page may then come short, its
    /// tube's tasks being far down the sessions' lists).
    pub fn list(
        &self,
        tube: TubeIx,
        status: Status,
        after: Option<TaskId>,
        limit: usize,
    ) -> Result<Vec<TaskRef<'_>>, QueueError> {
        let t = self.live_tube(tube)?;
        let mut out = Vec::with_capacity(limit.min(1024));
        if status == Status::Taken {
            let mut started = after.is_none();
            let mut walked = 0;
            let mut found = Vec::new();
            self.sessions.walk_taken(&self.slots, |k| {
                walked += 1;
                let s = &self.slots[k as usize];
                if s.tube == tube {
                    if started {
                        found.push(k);
                    } else {
                        started = Some(s.id) == after;
                    }
                }
                found.len() < limit && walked < MAX_TAKEN_WALK
            });
            out.extend(found.into_iter().map(|k| self.view(k)));
            return Ok(out);
        }
        let head = match status {
            Status::Ready => t.ready.first(),
            Status::Waiting => t.waiting.first(),
            Status::Buried => t.buried.first(),
            Status::Taken => None,
        };
        let from = after
            .and_then(|id| self.find(id))
            .filter(|&k| {
                let s = &self.slots[k as usize];
                s.tube == tube && s.status == status
            })
            .map(|k| self.slots[k as usize].next0);
        let mut k = from.or(head).unwrap_or(NIL);
        while k != NIL && out.len() < limit {
            out.push(self.view(k));
            k = self.slots[k as usize].next0;
        }
        Ok(out)
    }

    // ---- recovery ----

    /// Recovery: adds a task to `default` as it was. Taken comes back owned by session 0 (call
    /// `release_all_taken` once recovery is done) and without a TTR deadline. The numbering of
    /// the id's tube rises past it. Journals nothing, counts no operation.
    pub fn restore(&mut self, task: RestoredTask) -> Result<(), QueueError> {
        self.restore_in(DEFAULT_TUBE, task, None, 0)
    }

    /// Recovery: `restore` into `tube`, with its utube key (utube tubes) and delivery count.
    pub fn restore_in(
        &mut self,
        tube: TubeIx,
        task: RestoredTask<impl PutPayload>,
        utube: Option<&[u8]>,
        deliveries: u16,
    ) -> Result<(), QueueError> {
        self.restore_task(tube, task, utube, deliveries, None)
    }

    /// `restore_in`, the task held unlisted in `bulk` when there is one (unless Taken).
    pub(crate) fn restore_task(
        &mut self,
        tube: TubeIx,
        task: RestoredTask<impl PutPayload>,
        utube: Option<&[u8]>,
        deliveries: u16,
        bulk: Option<&mut Bulk>,
    ) -> Result<(), QueueError> {
        self.live_tube(tube)?;
        let vouched = bulk.as_ref().is_some_and(|b| b.ids == BulkIds::Distinct);
        let owner = self.check_restorable(tube, task.id, vouched)?;
        // What was accepted once is restored whatever `max_tasks` says now, up to what the
        // index can address.
        if self.slots.len() >= MAX_TASKS {
            return Err(QueueError::TooManyTasks { max: MAX_TASKS });
        }
        let (status, runat) = (task.status, task.runat);
        let k = self.insert_restored(tube, owner, task, utube, deliveries);
        self.enter_restored(k, status, runat, bulk);
        Ok(())
    }

    /// Whether task `id` may be restored (or imported) into live `tube`: an id of the tube's
    /// numbering (`numbering_of`, whose tube it returns) that no live task has. `vouched`: the
    /// caller knows it is new, and no lookup is made.
    fn check_restorable(
        &self,
        tube: TubeIx,
        id: TaskId,
        vouched: bool,
    ) -> Result<TubeIx, QueueError> {
        let owner = self.numbering_of(tube, id)?;
        // Every live id is below its tube's next number, so a higher one needs no lookup: a
        // snapshot of a queue filled in order restores in id order, and skips a probe per task.
        if id_number(id) < self.tube(owner).numbers.next && !vouched && self.find(id).is_some() {
            return Err(QueueError::Duplicate(id));
        }
        Ok(owner)
    }

    /// Adds a task `check_restorable` accepted (its numbering `owner`) to `tube`'s arena and
    /// index, in no list yet, with its utube key interned and its delivery count; the
    /// numbering rises past its id. Returns its slot for the caller to list.
    fn insert_restored(
        &mut self,
        tube: TubeIx,
        owner: TubeIx,
        task: RestoredTask<impl PutPayload>,
        utube: Option<&[u8]>,
        deliveries: u16,
    ) -> u32 {
        self.count_restored_id(tube, owner, task.id);
        let utube = match self.tube_mut(tube).utubes.as_mut() {
            Some(u) => u.intern(utube.unwrap_or_default()),
            None => NIL,
        };
        let height = self.next_height();
        let k = self.insert_slot(
            NewSlot {
                id: task.id,
                pri: task.pri,
                created: task.created,
                ttl: task.ttl,
                ttr: task.ttr,
                utube,
                tube,
                height,
            },
            task.data,
        );
        self.slots[k as usize].deliveries = deliveries;
        k
    }

    /// Asks the CPU for the id index's line where `id` is looked up and entered: a loader
    /// that knows the ids it restores next calls this a few tasks ahead, so the lookup each
    /// restore makes (a cache miss at a random bucket) is under way before it is needed.
    #[inline]
    pub fn prefetch_id(&self, id: TaskId) {
        self.index.prefetch_home(hash_id(id));
    }

    /// Recovery: removes a task (ack, delete or expiry replay). Journals nothing.
    pub fn restore_remove(&mut self, id: TaskId) -> Option<Task> {
        let k = self.find(id)?;
        Some(self.remove_slot(k))
    }

    /// Recovery: sets a task's status (take / release / promote / return / bury / kick
    /// replay). Taken gets owner 0 and no TTR deadline; `runat` counts only for Waiting.
    /// Journals nothing.
    pub fn restore_status(
        &mut self,
        id: TaskId,
        status: Status,
        runat: Micros,
    ) -> Result<(), QueueError> {
        let k = self.find(id).ok_or(QueueError::NotFound(id))?;
        self.leave(k);
        self.enter_restored(k, status, runat, None);
        Ok(())
    }

    /// Recovery: a tube as it was, at its index, numbering as `numbers` says (`first` as it
    /// was made with — the tube API's numbers of its tasks depend on it —, the next number
    /// and `legacy_below` at least as given; all 0 for a tube of an older format). Journals
    /// nothing.
    ///
    /// A record of the tube that already lives at `tube` under this name and type says what it
    /// is now (a tube made on demand that `create_tube` made permanent): its options are taken
    /// and its numbers raised, as `restore_tube_numbers` does.
    pub fn restore_tube(
        &mut self,
        tube: TubeIx,
        name: &str,
        kind: TubeType,
        opts: TubeOptions,
        numbers: TubeNumbers,
    ) -> Result<(), QueueError> {
        let same = |t: &Tube| *t.name == *name && t.kind == kind && t.opts.part == opts.part;
        if self
            .tubes
            .get(tube as usize)
            .and_then(Option::as_ref)
            .is_some_and(same)
        {
            self.restore_tube_numbers(tube, numbers)?;
            self.tube_mut(tube).opts = opts;
            return Ok(());
        }
        if opts.part == 0 && self.names.contains_key(name) {
            return Err(QueueError::TubeExists(name.to_owned()));
        }
        if tube as usize >= MAX_TUBES {
            return Err(QueueError::TooManyTubes { max: MAX_TUBES });
        }
        if self.tubes.get(tube as usize).is_some_and(Option::is_some) {
            let held = self.tube(tube).name.to_string();
            return Err(QueueError::TubeExists(held));
        }
        if self.tubes.len() <= tube as usize {
            self.tubes.resize_with(tube as usize + 1, || None);
        }
        if numbers.first > 0 && (tube == DEFAULT_TUBE || numbers.legacy_below > 0) {
            return Err(QueueError::TubeNumbering {
                tube,
                first: numbers.first,
            });
        }
        let next = (numbers.next)
            .max(numbers.first)
            .max(numbers.legacy_below)
            .max(u64::from(tube == DEFAULT_TUBE));
        let numbers = TubeNumbers { next, ..numbers };
        self.install_tube(tube, name, kind, opts, numbers);
        Ok(())
    }

    /// Recovery: `tube` numbers its next tasks from `numbers.next` at least, and reads the
    /// numbers below `numbers.legacy_below` as ids kept from before tubes numbered their own
    /// (neither ever goes down; the next number stays at or above the mark). `numbers.first`
    /// must be the tube's own (it is set once, by `create_tube` or `restore_tube`), and a
    /// mark is refused in a tube whose numbers do not start at 0. Journals nothing.
    pub fn restore_tube_numbers(
        &mut self,
        tube: TubeIx,
        numbers: TubeNumbers,
    ) -> Result<(), QueueError> {
        let first = self.live_tube(tube)?.numbers.first;
        if numbers.first != first || (first > 0 && numbers.legacy_below > 0) {
            return Err(QueueError::TubeNumbering {
                tube,
                first: numbers.first,
            });
        }
        let t = &mut self.tube_mut(tube).numbers;
        t.legacy_below = t.legacy_below.max(numbers.legacy_below);
        t.next = t.next.max(numbers.next).max(t.legacy_below);
        Ok(())
    }

    /// Recovery: drops a tube and its tasks (no check for Taken ones). Journals nothing.
    pub fn restore_drop_tube(&mut self, tube: TubeIx) -> Result<(), QueueError> {
        if tube == DEFAULT_TUBE {
            return Err(QueueError::DefaultTubeUndroppable);
        }
        self.live_tube(tube)?;
        self.clear_tube(tube);
        // Silent: the log's own `Counts` say what `retired` is (a replica logs nothing).
        let counted = self.retired_counted;
        self.uninstall_tube(tube);
        self.retired_counted = counted;
        Ok(())
    }

    /// Recovery: empties a tube. Journals nothing.
    pub fn restore_truncate(&mut self, tube: TubeIx) -> Result<(), QueueError> {
        self.live_tube(tube)?;
        self.clear_tube(tube);
        Ok(())
    }

    /// Recovery: a dedup key of `tube` for task `id` until `expires`. The tube's numbering
    /// rises past the id, as a restored task's does: the key's task may be gone, and a retry
    /// with the key must not name a new task that got its number. Journals nothing.
    pub fn restore_dedup(
        &mut self,
        tube: TubeIx,
        key: &[u8],
        id: TaskId,
        expires: Micros,
    ) -> Result<(), QueueError> {
        self.live_tube(tube)?;
        let owner = self.numbering_of(tube, id)?;
        self.count_restored_id(tube, owner, id);
        if let Some(d) = self.tube_mut(tube).dedup.as_mut() {
            d.record(key, id, expires);
        }
        Ok(())
    }

    /// Starts loading a snapshot into this queue: the [`Restoring`] it becomes holds the
    /// tasks it restores unlisted until [`Restoring::finish`] lists them all at once, and no
    /// other call reaches the queue until then.
    pub fn restoring(self, ids: BulkIds) -> Restoring {
        Restoring::new(self, ids)
    }

    /// A held task's ([`list_key`], id), to sort it by; `None` for a Taken one.
    pub(crate) fn held_list_key(&self, k: u32) -> Option<((u8, u64), TaskId)> {
        let s = &self.slots[k as usize];
        list_key(s.status, s.pri, self.slots.t(k)).map(|key| (key, s.id))
    }

    /// Lists a held task in its tube's list of the status and time it was restored with.
    pub(crate) fn list_held(&mut self, k: u32) {
        let status = self.slots[k as usize].status;
        let t = if status == Status::Waiting {
            self.slots.t(k)
        } else {
            0
        };
        self.enter(k, status, t);
        self.reschedule(k);
    }

    /// Recovery: the tube `id` is counted in (`default` for an id below 2^41, as every id
    /// was before tubes numbered their own tasks) numbers its next tasks above it; at a free
    /// index, the next tube created there does (its floor: a put in a tube dropped in the
    /// same turn is logged only so). Never goes down; an id of no tube changes nothing.
    pub fn set_last_id(&mut self, id: TaskId) {
        let Some(ix) = id_tube(id).map(usize::from).filter(|&ix| ix < MAX_TUBES) else {
            return;
        };
        let above = id_number(id) + 1;
        match self.tubes.get_mut(ix) {
            Some(Some(t)) => t.numbers.next = t.numbers.next.max(above),
            _ => self.raise_floor(ix, above),
        }
    }

    /// Recovery: the next tube created at free index `tube` numbers from `floor` at least
    /// (a snapshot's record of the floors, `floors`). Refused for a live tube, which numbers
    /// as it was made. Journals nothing.
    pub fn restore_floor(&mut self, tube: TubeIx, floor: u64) -> Result<(), QueueError> {
        if tube as usize >= MAX_TUBES {
            return Err(QueueError::TooManyTubes { max: MAX_TUBES });
        }
        if let Ok(t) = self.live_tube(tube) {
            return Err(QueueError::TubeExists(t.name.to_string()));
        }
        self.raise_floor(tube as usize, floor);
        Ok(())
    }

    fn raise_floor(&mut self, ix: usize, floor: u64) {
        if self.floors.len() <= ix {
            self.floors.resize(ix + 1, 0);
        }
        self.floors[ix] = self.floors[ix].max(floor);
    }

    /// The tube whose numbers a task `id` restored into live `tube` is counted in: `tube`'s
    /// own, or `default` for an id below 2^41 — in another tube, one kept from before tubes
    /// numbered their own tasks, which only a tube numbering from 0 holds. An id packing a
    /// third tube, or a number below the tube's `first` (a tube before it at its index), is
    /// refused.
    fn numbering_of(&self, tube: TubeIx, id: TaskId) -> Result<TubeIx, QueueError> {
        let first = self.tube(tube).numbers.first;
        match id_tube(id) {
            Some(owner) if owner == tube && id_number(id) >= first => Ok(owner),
            Some(DEFAULT_TUBE) if first == 0 => Ok(DEFAULT_TUBE),
            _ => Err(QueueError::IdNotOfTube { id, tube }),
        }
    }

    /// Raises the numbering `id` is counted in (`owner`, from `numbering_of`) past it; an id
    /// kept from before tubes numbered their own tasks also raises `tube`'s `legacy_below`
    /// mark past it, so the tube API reads the number as that id and no new task takes it.
    fn count_restored_id(&mut self, tube: TubeIx, owner: TubeIx, id: TaskId) {
        let numbers = &mut self.tube_mut(owner).numbers;
        numbers.next = numbers.next.max(id_number(id) + 1);
        if owner != tube {
            let numbers = &mut self.tube_mut(tube).numbers;
            numbers.legacy_below = numbers.legacy_below.max(id + 1);
            numbers.next = numbers.next.max(numbers.legacy_below);
        }
    }

    /// Makes room for `additional` more tasks in the arena and the id index, so loading a
    /// snapshot of known size grows neither step by step (each doubling of the index rehashes
    /// every id). Towers, heap and sessions grow with what the tasks turn out to need.
    pub fn reserve(&mut self, additional: usize) {
        // More than the arena can ever hold is asked of no allocator.
        let additional = additional.min(MAX_TASKS.saturating_sub(self.slots.len()));
        self.slots.reserve(additional);
        let live = self.slots.iter().map(|(k, s)| (k as u32, hash_id(s.id)));
        self.index.reserve(additional, live);
    }

    /// Takes memory made ready for the next tasks, possibly on another thread ([`Room`]):
    /// their inserts then fault in no page. What is not used stays as capacity.
    pub fn add_room(&mut self, room: Room) {
        // Slots takes the pieces: `room` depends on `slots`, not the other way round.
        self.slots.add_room(room.slots, room.records);
    }

    /// Which kinds of [`Room`] the next inserts would use: a caller handing room in takes
    /// it from its maker only when it is wanted (a maker working ahead still makes a few
    /// that nobody takes).
    pub fn room_wanted(&self) -> RoomWanted {
        let (slots, records) = self.slots.room_wanted();
        RoomWanted { slots, records }
    }

    /// Every live task, of every tube, in no particular order (snapshots).
    pub fn iter(&self) -> impl Iterator<Item = TaskRef<'_>> {
        self.slots.iter().map(|(k, _)| self.view(k as u32))
    }

    /// Bytes the engine holds: the slots, records (small payloads included: they live there),
    /// extensions, index, towers, heap and session tables as allocated (capacity, not length),
    /// and the tubes with their utubes and dedup windows (keys excluded); big payloads' own
    /// boxes are not counted. For the memory figure in benches and tests.
    pub fn overhead_bytes(&self) -> usize {
        use std::mem::size_of;
        let tubes: usize = self
            .tubes
            .iter()
            .flatten()
            .map(|t| {
                let utubes = t.utubes.as_ref().map_or(0, |u| {
                    u.list.capacity() * (size_of::<crate::tubes::Utube>() + 8 + 5)
                });
                let dedup = t.dedup.as_ref().map_or(0, |d| {
                    d.fifo.capacity() * (size_of::<crate::tubes::DedupEntry>() + 9)
                });
                utubes + dedup
            })
            .sum();
        self.slots.capacity_bytes()
            + self.index.buckets() * size_of::<u32>()
            + self.towers.capacity_bytes()
            + self.heap.capacity_bytes()
            + self.sessions.capacity_bytes()
            + self.journal.capacity() * size_of::<Event>()
            + self.tubes.capacity() * size_of::<Option<Tube>>()
            + tubes
    }

    /// Panics with a message naming the broken invariant. O(n log n): for tests and debugging.
    pub fn check_invariants(&self) {
        let n = self.slots.len();
        let slots = &self.slots;
        let mut indexed = self.index.check(|j| hash_id(slots[j as usize].id));
        indexed.sort_unstable();
        let live: Vec<u32> = slots.iter().map(|(k, _)| k as u32).collect();
        assert!(
            indexed == live,
            "index holds {} keys for {n} tasks",
            indexed.len()
        );
        let mut listed = self.check_tubes();
        listed += self.sessions.check(&self.slots);
        assert_eq!(
            listed, n,
            "lists and sessions hold {listed} tasks, arena {n}"
        );
        self.heap.check(&self.slots);
        let mut entries = 0;
        let mut counted = 0;
        let mut towers = Vec::new();
        for (k, s) in self.slots.iter() {
            let k = k as u32;
            self.check_slot(k, s);
            if s.height > 1 && s.status != Status::Taken {
                towers.push((s.tower(), s.height));
            }
            entries += usize::from(self.check_deadline(k, s));
            if s.flags & COUNTED != 0 {
                counted += 1;
                assert!(
                    !self.slots.counts(k).is_zero(),
                    "task {} is marked counted with no count",
                    s.id
                );
            }
        }
        assert_eq!(entries, self.heap.len(), "heap holds entries of no task");
        assert_eq!(
            counted,
            self.slots.counted(),
            "the counters' table holds entries of no task"
        );
        self.towers.check(towers);
    }

    /// One task's own invariants: its id, its tower, its tube, and the time and owner its
    /// status allows.
    fn check_slot(&self, k: u32, s: &Slot) {
        assert_eq!(
            self.find(s.id),
            Some(k),
            "index does not find task {} at {k}",
            s.id
        );
        let owner = id_tube(s.id).unwrap_or_else(|| panic!("task {} packs no tube", s.id));
        let counted = self.tubes.get(owner as usize).and_then(Option::as_ref);
        assert!(
            s.id != 0 && counted.is_some_and(|t| id_number(s.id) < t.numbers.next),
            "task {} beyond its tube's numbers",
            s.id
        );
        if owner == s.tube {
            assert!(
                id_number(s.id) >= self.tube(s.tube).numbers.first,
                "task {} below its tube's first number",
                s.id
            );
        } else {
            assert!(
                owner == DEFAULT_TUBE && s.id < self.tube(s.tube).numbers.legacy_below,
                "task {} in tube {} is neither its nor kept from before",
                s.id,
                s.tube
            );
        }
        assert!(
            (1..=MAX_LEVEL).contains(&(s.height as usize)),
            "task {} height",
            s.id
        );
        if s.status != Status::Taken {
            assert_eq!(s.tower() == NIL, s.height == 1, "task {} tower", s.id);
        }
        assert!(
            self.tubes.get(s.tube as usize).is_some_and(Option::is_some),
            "task {} in dropped tube {}",
            s.id,
            s.tube
        );
        let t = self.slots.t(k);
        match s.status {
            Status::Ready | Status::Buried => {
                assert_eq!(t, 0, "{:?} task {} keeps a time", s.status, s.id)
            }
            Status::Waiting => {}
            Status::Taken => {
                if s.flags & TTR_ARMED != 0 {
                    assert!(s.flags & HAS_TTR != 0, "task {} armed without a ttr", s.id);
                } else {
                    assert_eq!(t, 0, "taken task {} keeps a time", s.id);
                }
            }
        }
        if s.status != Status::Taken {
            assert_eq!(s.flags & TTR_ARMED, 0, "task {} armed but not taken", s.id);
        } else {
            assert_ne!(s.owner_ix(), NIL, "taken task {} has no owner", s.id);
        }
    }

    /// A task with a deadline has the heap entry for it, and one without has none. Returns
    /// whether the task has an entry.
    fn check_deadline(&self, k: u32, s: &Slot) -> bool {
        let heap_pos = self.slots.heap_pos(k);
        match Self::due(&self.slots, k) {
            Some((at, kind)) => {
                assert_ne!(
                    heap_pos, NIL,
                    "task {} has deadline {at} but no entry",
                    s.id
                );
                let e = self.heap.get(heap_pos);
                assert_eq!(
                    (e.at, e.kind(), e.slot()),
                    (at, kind, k),
                    "task {} entry",
                    s.id
                );
                true
            }
            None => {
                assert_eq!(heap_pos, NIL, "task {} has no deadline, an entry", s.id);
                false
            }
        }
    }

    /// The tube half of `check_invariants`: each tube's lists, utubes, counts and dedup
    /// window, the name table, `default`. Returns the Ready, Waiting and Buried tasks listed.
    fn check_tubes(&self) -> usize {
        let mut listed = 0;
        let mut taken = vec![0u64; self.tubes.len()];
        for (_, s) in self.slots.iter() {
            if s.status == Status::Taken {
                taken[s.tube as usize] += 1;
            }
        }
        let mut live = 0;
        for (ix, t) in self.tubes.iter().enumerate() {
            let Some(t) = t else { continue };
            live += usize::from(t.opts.part == 0);
            let ix = ix as TubeIx;
            listed += t.check(ix, &self.slots, &self.towers);
            let n = t.numbers;
            assert!(
                n.first <= n.next && (n.first == 0 || (ix != DEFAULT_TUBE && n.legacy_below == 0)),
                "tube {}: numbering {n:?}",
                t.name
            );
            if t.opts.part == 0 {
                assert_eq!(
                    self.names.get(&t.name),
                    Some(&ix),
                    "tube {} not named",
                    t.name
                );
            }
            assert_eq!(
                t.taken_n, taken[ix as usize],
                "tube {}: taken count",
                t.name
            );
            assert_eq!(
                t.dedup.is_some(),
                t.opts.dedup_window > 0,
                "tube {}: dedup",
                t.name
            );
            if let Some(d) = &t.dedup {
                d.check();
                assert!(self.dedup_tubes.contains(&ix), "tube {} not pruned", t.name);
            }
        }
        assert_eq!(self.names.len(), live, "names of dropped tubes");
        assert_eq!(
            taken.iter().sum::<u64>(),
            self.sessions.len() as u64,
            "sessions hold other than the taken tasks"
        );
        assert_eq!(
            self.dedup_tubes
                .iter()
                .filter(|&&t| self.tube_info(t).is_some())
                .count(),
            self.dedup_tubes.len(),
            "dedup_tubes names a dropped tube"
        );
        assert_eq!(
            self.tube_info(DEFAULT_TUBE).map(|t| t.name),
            Some(DEFAULT_TUBE_NAME),
            "tube 0 is not default"
        );
        listed
    }

    // ---- internals ----

    fn log(&mut self, e: Event) {
        if self.journal_on {
            self.journal.push(e);
        }
    }

    fn find(&self, id: TaskId) -> Option<u32> {
        let (recent, k) = self.recent;
        // Ids start at 1, so the empty `(0, NIL)` never matches.
        if recent == id && self.slots.get(k as usize).is_some_and(|s| s.id == id) {
            return Some(k);
        }
        let slots = &self.slots;
        self.index
            .find(id, hash_id, |k| slots[k as usize].id)
            .map(|f| f.key)
    }

    fn view(&self, k: u32) -> TaskRef<'_> {
        let p = self.slots.parts(k);
        let s = p.slot;
        let utube = (p.utube != NIL).then(|| {
            let utubes = self.tube(s.tube).utubes.as_ref().expect("utube tube");
            &*utubes.list[p.utube as usize].key
        });
        TaskRef {
            id: s.id,
            status: s.status,
            runat: if s.status == Status::Waiting { p.t } else { 0 },
            pri: s.pri,
            ttl: p.ttl,
            ttr: p.ttr,
            created: p.created,
            owner: (s.status == Status::Taken).then(|| self.owner_of(s)),
            data: p.data,
            tube: s.tube,
            deliveries: s.deliveries,
            utube,
            counts: p.counts,
        }
    }

    /// The session holding a Taken slot (its `owner_ix`).
    fn owner_of(&self, s: &Slot) -> SessionId {
        self.sessions.owner(s.owner_ix())
    }

    /// The task's earliest pending deadline: TTL expiry, runat, or armed TTR.
    fn due(slots: &Slots, k: u32) -> Option<(Micros, Kind)> {
        let s = &slots[k as usize];
        let ttl = slots
            .ttl(k)
            .map(|ttl| (slots.created(k).saturating_add(ttl), Kind::Expire));
        let timer = match s.status {
            Status::Waiting => Some((slots.t(k), Kind::Promote)),
            Status::Taken if s.flags & TTR_ARMED != 0 => Some((slots.t(k), Kind::Ttr)),
            _ => None,
        };
        match (ttl, timer) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Brings the task's heap entry in line with its deadlines after a transition.
    fn reschedule(&mut self, k: u32) {
        if !self.slots.has_ext(k) {
            // Every deadline (TTL, runat, TTR) and the heap position live in the extension:
            // a task without one has none, and no entry to update (the plain task's path).
            return;
        }
        let pos = self.slots.heap_pos(k);
        let id = self.slots[k as usize].id;
        match (Self::due(&self.slots, k), pos) {
            (None, NIL) => {}
            (None, pos) => self.heap.remove(pos, &mut self.slots),
            (Some((at, kind)), NIL) => {
                let e = Entry::new(at, id, k, kind);
                self.heap.push(e, &mut self.slots);
            }
            (Some((at, kind)), pos) => {
                let e = Entry::new(at, id, k, kind);
                self.heap.update(pos, e, &mut self.slots);
            }
        }
        self.slots.trim_ext(k);
    }

    /// A Buried or Waiting slot becomes Ready: a kick, counted and journaled.
    fn kick_slot(&mut self, k: u32) {
        let (id, tube) = (self.slots[k as usize].id, self.slots[k as usize].tube);
        self.move_to(k, Status::Ready, 0);
        self.slots.bump(k, |c| &mut c.kicks);
        self.ops_mut(tube).kicks += 1;
        self.log(Event::Kicked { id });
    }

    /// The Waiting task of `tube` due first: lowest (runat, id), the head of its waiting list.
    /// O(1).
    fn first_due(&self, tube: TubeIx) -> Option<u32> {
        self.tube(tube).waiting.first()
    }

    /// The slot of task `id`, in any tube, if `sid` holds it, else why not.
    fn held_by(&self, sid: SessionId, id: TaskId) -> Result<u32, QueueError> {
        let k = self.find(id).ok_or(not_held(id, sid, Hold::NoTask))?;
        check_owner(&self.slots, &self.sessions, k, sid, id)?;
        Ok(k)
    }

    /// The slot of task `id` of `tube` if `sid` holds it, else why not (a task of another
    /// tube is no task of this one).
    fn taken_in(&self, tube: TubeIx, sid: SessionId, id: TaskId) -> Result<u32, QueueError> {
        self.live_tube(tube)?;
        let k = self
            .find(id)
            .filter(|&k| self.slots[k as usize].tube == tube)
            .ok_or(not_held(id, sid, Hold::NoTask))?;
        check_owner(&self.slots, &self.sessions, k, sid, id)?;
        Ok(k)
    }

    /// The slot of task `id` if it is in `tube`.
    fn in_tube(&self, tube: TubeIx, id: TaskId) -> Result<u32, QueueError> {
        self.find(id)
            .filter(|&k| self.slots[k as usize].tube == tube)
            .ok_or(QueueError::NotInTube { id, tube })
    }

    fn tube(&self, t: TubeIx) -> &Tube {
        self.tubes[t as usize].as_ref().expect("live tube")
    }

    /// Tube `tube`'s operation counters, to count an operation in (noted for the log).
    #[inline]
    fn ops_mut(&mut self, tube: TubeIx) -> &mut Stats {
        self.note_counted(tube);
        &mut self.tube_mut(tube).ops
    }

    /// With the journal on, notes that tube `tube`'s operation counters changed this turn.
    #[inline]
    fn note_counted(&mut self, tube: TubeIx) {
        if self.journal_on {
            let t = self.tube_mut(tube);
            if !t.counted {
                t.counted = true;
                self.counted.push(tube);
            }
        }
    }

    fn tube_mut(&mut self, t: TubeIx) -> &mut Tube {
        self.tubes[t as usize].as_mut().expect("live tube")
    }

    fn live_tube(&self, t: TubeIx) -> Result<&Tube, QueueError> {
        self.tubes
            .get(t as usize)
            .and_then(Option::as_ref)
            .ok_or(QueueError::TubeNotFound(t))
    }

    fn install_tube(
        &mut self,
        ix: TubeIx,
        name: &str,
        kind: TubeType,
        opts: TubeOptions,
        numbers: TubeNumbers,
    ) {
        if ix as usize == self.tubes.len() {
            self.tubes.push(None);
        }
        self.tubes[ix as usize] = Some(Tube::new(name, kind, opts, numbers));
        if opts.part == 0 {
            self.names.insert(name.into(), ix);
        }
        if opts.dedup_window > 0 {
            self.dedup_tubes.push(ix);
        }
    }

    /// The tubes whose operation counters changed since the last call (the journal on),
    /// into `out` (emptied first), and whether the dropped tubes' (`retired`) did: the WAL
    /// logs what they count now, so counters survive a restart and reach replicas.
    pub fn take_counted(&mut self, out: &mut Vec<TubeIx>) -> bool {
        out.clear();
        std::mem::swap(out, &mut self.counted);
        out.retain(|&ix| match self.tubes.get_mut(ix as usize) {
            Some(Some(t)) if t.counted => {
                t.counted = false;
                true
            }
            // Dropped since (`retired` has its counts), or listed twice.
            _ => false,
        });
        std::mem::take(&mut self.retired_counted)
    }

    /// The operation counters of every tube dropped so far (a part of `all_stats`).
    pub fn retired(&self) -> Stats {
        self.retired
    }

    /// Sets tube `tube`'s operation counters, as the log last said them (recovery, a
    /// replica): silent, as every restore call. `counts` are in `Stats::OP_NAMES` order.
    pub fn restore_ops(&mut self, tube: TubeIx, counts: &[u64]) -> Result<(), QueueError> {
        self.live_tube(tube)?;
        self.tube_mut(tube).ops = Stats::from_op_counts(counts);
        Ok(())
    }

    /// Sets the dropped tubes' operation counters (`retired`), as the log last said them.
    pub fn restore_retired(&mut self, counts: &[u64]) {
        self.retired = Stats::from_op_counts(counts);
    }

    /// Tube `tube`'s operation counters start again from 0, what they held counted on in the
    /// queue's own (`all_stats`): a partition that comes back to a node that served it before
    /// counts only what it does from now, its earlier counts having travelled with it.
    pub fn restart_counts(&mut self, tube: TubeIx) -> Result<(), QueueError> {
        let ops = self.live_tube(tube)?.ops;
        let t = self.tubes[tube as usize].as_mut().expect("live tube");
        t.ops = Stats::default();
        self.note_counted(tube);
        self.retired_counted |= self.journal_on;
        self.retired += &Stats {
            total: 0,
            ready: 0,
            taken: 0,
            waiting: 0,
            buried: 0,
            ready_since: 0,
            takers_waiting: 0,
            takers_holding: 0,
            ..ops
        };
        Ok(())
    }

    fn uninstall_tube(&mut self, ix: TubeIx) {
        let t = self.tubes[ix as usize].take().expect("live tube");
        // Its operations stay counted; its tasks are gone.
        self.retired_counted |= self.journal_on;
        self.retired += &Stats {
            total: 0,
            ready: 0,
            taken: 0,
            waiting: 0,
            buried: 0,
            ready_since: 0,
            ..t.stats()
        };
        // The next tube here numbers on from this one: its ids are never given again.
        self.raise_floor(ix as usize, t.numbers.next);
        if t.opts.part == 0 {
            self.names.remove(&t.name);
        }
        self.dedup_tubes.retain(|&d| d != ix);
    }

    fn check_droppable(&self, tube: TubeIx) -> Result<(), QueueError> {
        if tube == DEFAULT_TUBE {
            return Err(QueueError::DefaultTubeUndroppable);
        }
        if self.live_tube(tube)?.taken_n > 0 {
            return Err(QueueError::TubeHasTaken(tube));
        }
        Ok(())
    }

    /// Deletes every task of `tube` (silently) and its dedup keys; returns how many tasks.
    fn clear_tube(&mut self, tube: TubeIx) -> usize {
        let mut doomed = Vec::new();
        let t = self.tube(tube);
        for list in [&t.ready, &t.buried] {
            list.for_each(&self.slots, |k| doomed.push(k));
        }
        t.waiting.for_each(&self.slots, |k| doomed.push(k));
        if let Some(u) = &t.utubes {
            for (_, ut) in &u.list {
                ut.rest.for_each(&self.slots, |k| doomed.push(k));
            }
        }
        if t.taken_n > 0 {
            let slots = &self.slots;
            let taken = self.sessions.taken_slots(slots);
            doomed.extend(
                taken
                    .into_iter()
                    .filter(|&k| slots[k as usize].tube == tube),
            );
        }
        for &k in &doomed {
            self.remove_slot(k);
        }
        if let Some(d) = self.tube_mut(tube).dedup.as_mut() {
            **d = Default::default();
        }
        doomed.len()
    }

    /// The options a put into `t` stores: the type's rules and the tube's defaults.
    fn put_options(t: &Tube, ix: TubeIx, p: &TubePut<'_>) -> PutOptions {
        if !t.kind.has_ttl() {
            return PutOptions::default();
        }
        let mut ttl = p.ttl.or(t.opts.ttl);
        if p.delay > 0 && ix != DEFAULT_TUBE {
            ttl = ttl.map(|ttl| ttl.saturating_add(p.delay));
        }
        PutOptions {
            delay: p.delay,
            ttl,
            ttr: p.ttr.or(t.opts.ttr),
            pri: p.pri.unwrap_or(t.opts.pri),
        }
    }

    /// Release options on a taken slot: new pri, new remaining life (from `now`), and the
    /// delay added to the TTL where the tube extends it. Returns whether a field changed.
    fn apply_release_options(
        &mut self,
        k: u32,
        now: Micros,
        o: ReleaseOptions,
        extends: bool,
    ) -> bool {
        let slots = &mut self.slots;
        let before = (slots[k as usize].pri, slots.ttl(k));
        if let Some(pri) = o.pri {
            slots[k as usize].pri = pri;
        }
        if let Some(ttl) = o.ttl {
            let lived = now.saturating_sub(slots.created(k));
            slots.set_ttl(k, Some(lived.saturating_add(ttl)));
        }
        if extends && o.delay > 0 {
            if let Some(ttl) = slots.ttl(k) {
                slots.set_ttl(k, Some(ttl.saturating_add(o.delay)));
            }
        }
        before != (slots[k as usize].pri, slots.ttl(k))
    }

    /// Remembers a put's dedup key for the tube's window (forgetting a couple of expired
    /// ones first, so the window stays bounded between `advance` calls).
    fn record_dedup(&mut self, now: Micros, tube: TubeIx, key: &[u8], k: u32) {
        let id = self.slots[k as usize].id;
        let t = self.tube_mut(tube);
        let window = t.opts.dedup_window;
        let Some(d) = t.dedup.as_mut() else { return };
        d.prune(now, 2);
        let seq = d.record(key, id, now.saturating_add(window));
        self.log(Event::DedupRecorded { tube, seq });
    }

    /// A new task in `tube` with the next id: Ready, or Waiting until `now + delay`.
    fn add_task(
        &mut self,
        now: Micros,
        tube: TubeIx,
        data: impl PutPayload,
        opts: PutOptions,
        utube: u32,
    ) -> u32 {
        // One look at the tube for its next number and its count of puts.
        let t = self.tube_mut(tube);
        let n = t.numbers.next;
        assert!(
            n <= MAX_TASK_NUMBER,
            "tube {tube} has given out every number"
        );
        t.numbers.next = n + 1;
        t.ops.puts += 1;
        self.note_counted(tube);
        let id = task_id(tube, n);
        if id.is_multiple_of(8) {
            // The next run of 8 ids will share one block of the id index, a random one in a
            // big table: ask for it now, 8 puts before the first of them waits for it.
            self.index.prefetch_home(hash_id(id.wrapping_add(8)));
        }
        let height = self.next_height();
        let new = NewSlot {
            id,
            pri: opts.pri,
            created: now,
            ttl: opts.ttl,
            ttr: opts.ttr,
            utube,
            tube,
            height,
        };
        let k = self.insert_slot(new, data);
        if opts.delay == 0 {
            self.enter(k, Status::Ready, 0);
        } else {
            self.enter(k, Status::Waiting, now.saturating_add(opts.delay));
        }
        self.reschedule(k);
        self.log(Event::Put { id });
        self.recent = (id, k);
        k
    }

    /// Pops the head of `tube`'s ready list into `sid`'s hands, arming its TTR.
    fn take_slot(&mut self, now: Micros, tube: TubeIx, sid: SessionId) -> Option<u32> {
        let k = self.tube(tube).ready.first()?;
        self.take_ready(now, tube, k, sid);
        Some(k)
    }

    /// Task `k`, in `tube`'s ready list, into `sid`'s hands, arming its TTR.
    fn take_ready(&mut self, now: Micros, tube: TubeIx, k: u32, sid: SessionId) {
        let u = self.slots.utube(k);
        let t = self.tubes[tube as usize].as_mut().expect("live tube");
        if u != NIL {
            // Busy before it leaves the ready list, so no other task of the utube takes the
            // head's place there.
            t.utubes.as_mut().expect("utube tube").list[u as usize].busy = true;
        }
        t.ops.takes += 1;
        self.note_counted(tube);
        self.leave(k);
        let ttr = self.slots.ttr(k);
        let s = &mut self.slots[k as usize];
        let id = s.id;
        s.deliveries = s.deliveries.saturating_add(1);
        let ttr_at = match ttr {
            Some(ttr) => {
                s.flags |= TTR_ARMED;
                now.saturating_add(ttr)
            }
            None => 0,
        };
        self.enter_taken(k, sid, ttr_at);
        self.reschedule(k);
        self.log(Event::Taken { id, sid });
        self.recent = (id, k);
    }

    /// A Taken task goes back: Ready (`runat` 0) or Waiting, or Buried once taken its tube's
    /// `max_deliveries` times. Counts and journals the one that happened.
    fn give_back(&mut self, k: u32, runat: Micros, why: Return) {
        let s = &self.slots[k as usize];
        let (id, tube, deliveries) = (s.id, s.tube, s.deliveries);
        let max = self.tube(tube).opts.max_deliveries;
        let dead = max > 0 && deliveries >= max;
        if dead {
            self.move_to(k, Status::Buried, 0);
        } else if runat == 0 {
            self.move_to(k, Status::Ready, 0);
        } else {
            self.move_to(k, Status::Waiting, runat);
        }
        // beanstalkd counts a release and a TTR run out per job, not a disconnect.
        match why {
            Return::Release => self.slots.bump(k, |c| &mut c.releases),
            Return::Ttr => self.slots.bump(k, |c| &mut c.timeouts),
            Return::Auto => {}
        }
        if dead {
            self.slots.bump(k, |c| &mut c.buries);
        }
        let ops = self.ops_mut(tube);
        match why {
            Return::Release => ops.releases += 1,
            Return::Ttr => ops.ttr_returned += 1,
            Return::Auto => ops.auto_released += 1,
        }
        if dead {
            ops.dead_lettered += 1;
            self.log(Event::DeadLettered { id });
            return;
        }
        self.log(match why {
            Return::Release => Event::Released { id, runat },
            Return::Ttr => Event::TtrReturned { id },
            Return::Auto => Event::AutoReleased { id },
        });
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
    fn insert_slot(&mut self, new: NewSlot, data: impl PutPayload) -> u32 {
        assert!(self.slots.len() < MAX_TASKS, "more than {MAX_TASKS} tasks");
        let k = self.slots.insert(new, data);
        let slots = &self.slots;
        self.index.insert(
            k,
            |j| hash_id(slots[j as usize].id),
            |p| slots.get(p as usize).map(|s| hash_id(s.id)),
            slots.end(),
        );
        k
    }

    /// Moves a listed task into the list of `status` (Ready, Waiting or Buried) with `t`
    /// (runat), and brings its deadline in line: every release, auto-release, promotion, TTR
    /// return, bury and kick.
    fn move_to(&mut self, k: u32, status: Status, t: Micros) {
        self.leave(k);
        self.enter(k, status, t);
        self.reschedule(k);
    }

    /// Puts an unlisted slot into its tube's list of `status` (Ready, Waiting or Buried),
    /// with `t` (runat). The caller reschedules.
    fn enter(&mut self, k: u32, status: Status, t: Micros) {
        let s = &mut self.slots[k as usize];
        s.status = status;
        if s.tower() == NIL {
            // New, or back from Taken (which gave its tower back).
            s.set_tower(self.towers.alloc(s.height));
        }
        let tube = s.tube;
        self.slots.set_t(k, t);
        let tb = self.tubes[tube as usize].as_mut().expect("live tube");
        match status {
            Status::Ready => self.ready_push(k),
            Status::Waiting => tb.waiting.insert(&mut self.slots, &mut self.towers, k),
            Status::Buried => tb.buried.insert(&mut self.slots, &mut self.towers, k),
            Status::Taken => unreachable!("enter_taken"),
        }
    }

    /// Makes an unlisted slot Taken by `sid`, last in its take order, with `t` (TTR time or
    /// 0); its utube becomes busy. The caller sets `TTR_ARMED` and reschedules.
    fn enter_taken(&mut self, k: u32, sid: SessionId, t: Micros) {
        let u = self.slots.utube(k);
        self.slots.set_t(k, t);
        let s = &mut self.slots[k as usize];
        s.status = Status::Taken;
        // In no skiplist while Taken: the tower goes back, and the word names the owner.
        if s.tower() != NIL {
            self.towers.release(s.height, s.tower());
            s.set_tower(NIL);
        }
        let tube = s.tube;
        self.sessions.append(&mut self.slots, sid, k);
        let tb = self.tubes[tube as usize].as_mut().expect("live tube");
        tb.taken_n += 1;
        if u != NIL {
            let ut = &mut tb.utubes.as_mut().expect("utube tube").list[u as usize];
            debug_assert!(!ut.busy || ut.head == NIL, "utube taken twice");
            ut.busy = true;
            // A recovered Taken task may find a head in the ready list: it waits now.
            let h = ut.head;
            if h != NIL {
                ut.head = NIL;
                tb.ready.remove(&mut self.slots, &mut self.towers, h);
                ut.rest.insert(&mut self.slots, &mut self.towers, h);
            }
        }
    }

    /// Recovery's `enter`: Taken goes to session 0 unarmed; runat counts only for Waiting.
    /// During a bulk restore any other status is only noted in the slot, to be listed later.
    fn enter_restored(&mut self, k: u32, status: Status, runat: Micros, bulk: Option<&mut Bulk>) {
        if let Some(bulk) = bulk {
            let held = status != Status::Taken;
            bulk.restored(k, held);
            if held {
                self.slots[k as usize].status = status;
                let t = if status == Status::Waiting { runat } else { 0 };
                self.slots.set_t(k, t);
                return;
            }
        }
        match status {
            Status::Ready | Status::Buried => self.enter(k, status, 0),
            Status::Waiting => self.enter(k, status, runat),
            Status::Taken => self.enter_taken(k, RESTORED_OWNER, 0),
        }
        self.reschedule(k);
    }

    /// Takes a slot out of its list: its tube's (or utube's) status skiplist, or if Taken its
    /// session's list (unless `release_session` already did), unarmed, its utube freed. The
    /// heap entry stays until the caller reschedules or deletes.
    fn leave(&mut self, k: u32) {
        let u = self.slots.utube(k);
        let s = &mut self.slots[k as usize];
        let (status, tube) = (s.status, s.tube);
        let tb = self.tubes[tube as usize].as_mut().expect("live tube");
        match status {
            Status::Taken => {
                s.flags &= !TTR_ARMED;
                let held = s.owner_ix() != NIL;
                tb.taken_n -= 1;
                if held {
                    self.sessions.remove(&mut self.slots, k);
                }
                if u != NIL {
                    self.utube_freed(tube, u);
                }
            }
            Status::Ready => self.ready_remove(k),
            Status::Waiting => tb.waiting.remove(&mut self.slots, &mut self.towers, k),
            Status::Buried => tb.buried.remove(&mut self.slots, &mut self.towers, k),
        }
        self.slots.set_t(k, 0);
    }

    /// Lists a Ready slot: in its tube's ready list, or for a utube task in the ready list as
    /// its utube's head (if none of the utube is Taken and it goes before the current head,
    /// which then waits in the utube's list) or else in its utube's list.
    fn ready_push(&mut self, k: u32) {
        let s = &self.slots[k as usize];
        let (tube, u, urgent) = (s.tube, self.slots.utube(k), s.pri < URGENT_PRI);
        let tb = self.tubes[tube as usize].as_mut().expect("live tube");
        tb.ready_n += 1;
        tb.ready_urgent_n += u64::from(urgent);
        let (slots, tw) = (&mut self.slots, &mut self.towers);
        if u == NIL {
            tb.ready.insert(slots, tw, k);
            return;
        }
        let ut = &mut tb.utubes.as_mut().expect("utube tube").list[u as usize];
        if ut.busy {
            ut.rest.insert(slots, tw, k);
        } else if ut.head == NIL {
            tb.ready.insert(slots, tw, k);
            ut.head = k;
        } else if order(slots, k) < order(slots, ut.head) {
            let h = ut.head;
            tb.ready.remove(slots, tw, h);
            ut.rest.insert(slots, tw, h);
            tb.ready.insert(slots, tw, k);
            ut.head = k;
        } else {
            ut.rest.insert(slots, tw, k);
        }
    }

    /// Unlists a Ready slot; a utube's head is replaced by the next of its utube (unless the
    /// utube is busy).
    fn ready_remove(&mut self, k: u32) {
        let s = &self.slots[k as usize];
        let (tube, u, urgent) = (s.tube, self.slots.utube(k), s.pri < URGENT_PRI);
        let tb = self.tubes[tube as usize].as_mut().expect("live tube");
        tb.ready_n -= 1;
        tb.ready_urgent_n -= u64::from(urgent);
        let (slots, tw) = (&mut self.slots, &mut self.towers);
        if u == NIL {
            tb.ready.remove(slots, tw, k);
            return;
        }
        let ut = &mut tb.utubes.as_mut().expect("utube tube").list[u as usize];
        if ut.head != k {
            ut.rest.remove(slots, tw, k);
            return;
        }
        tb.ready.remove(slots, tw, k);
        ut.head = NIL;
        if !ut.busy {
            if let Some(f) = ut.rest.first() {
                ut.rest.remove(slots, tw, f);
                tb.ready.insert(slots, tw, f);
                ut.head = f;
            }
        }
    }

    /// Utube `u` of `tube` has no Taken task any more: its first Ready task becomes its head.
    fn utube_freed(&mut self, tube: TubeIx, u: u32) {
        let tb = self.tubes[tube as usize].as_mut().expect("live tube");
        let ut = &mut tb.utubes.as_mut().expect("utube tube").list[u as usize];
        ut.busy = false;
        if ut.head == NIL {
            if let Some(f) = ut.rest.first() {
                ut.rest.remove(&mut self.slots, &mut self.towers, f);
                tb.ready.insert(&mut self.slots, &mut self.towers, f);
                ut.head = f;
            }
        }
    }

    /// Removes a task from every structure and returns it as it was.
    fn remove_slot(&mut self, k: u32) -> Task {
        let slots = &self.slots;
        let id = slots[k as usize].id;
        if let Some(found) = self.index.find(id, hash_id, |j| slots[j as usize].id) {
            self.index
                .remove_found(found, |j| hash_id(slots[j as usize].id));
        }
        self.remove_unindexed(k)
    }

    /// Deletes task `id` of `tube` if `sid` holds it (counted, journaled), else why not (a
    /// task of another tube is no task of this one). One probe of the index both finds the
    /// task and, once ownership is checked, unlinks it.
    fn ack_held(&mut self, tube: TubeIx, sid: SessionId, id: TaskId) -> Result<Task, QueueError> {
        let slots = &self.slots;
        let found = self
            .index
            .find(id, hash_id, |j| slots[j as usize].id)
            .filter(|f| slots[f.key as usize].tube == tube)
            .ok_or(not_held(id, sid, Hold::NoTask))?;
        let k = found.key;
        check_owner(slots, &self.sessions, k, sid, id)?;
        self.index
            .remove_found(found, |j| hash_id(slots[j as usize].id));
        let task = self.remove_unindexed(k);
        self.ops_mut(tube).acks += 1;
        self.log(Event::Acked { id });
        Ok(task)
    }

    /// `remove_slot` for a task already out of the index.
    fn remove_unindexed(&mut self, k: u32) -> Task {
        let s = &self.slots[k as usize];
        let owner = (s.status == Status::Taken).then(|| self.owner_of(s));
        let runat = if s.status == Status::Waiting {
            self.slots.t(k)
        } else {
            0
        };
        let (status, tube, u) = (s.status, s.tube, self.slots.utube(k));
        self.leave(k);
        let pos = self.slots.heap_pos(k);
        if pos != NIL {
            self.heap.remove(pos, &mut self.slots);
        }
        let s = &self.slots[k as usize];
        if s.tower() != NIL {
            // Listed until `leave`: its tower (a Taken task's `owner_ix` is NIL once it has
            // left, so this reads NIL for it).
            self.towers.release(s.height, s.tower());
        }
        let r = self.slots.remove(k);
        if u != NIL {
            self.tube_mut(tube)
                .utubes
                .as_mut()
                .expect("utube tube")
                .unref(u);
        }
        Task {
            id: r.slot.id,
            status,
            runat,
            pri: r.slot.pri,
            ttl: r.ttl,
            ttr: r.ttr,
            created: r.created,
            owner,
            data: r.data,
            tube,
            deliveries: r.slot.deliveries,
        }
    }

    // ---- for durability: a live-task cursor, delivery counts, dedup positions ----

    /// One past the highest arena position a task may occupy: `task_at(0..arena_end())`
    /// visits every live task once. It grows with the most tasks ever live at once, never
    /// with the ids issued, so a snapshot walk costs what the queue holds.
    pub fn arena_end(&self) -> usize {
        self.slots.end()
    }

    /// The live task at arena position `pos`, if any. A task keeps its position for its whole
    /// life, so a cursor over positions sees every task that stays live exactly once.
    pub fn task_at(&self, pos: usize) -> Option<TaskRef<'_>> {
        let k = u32::try_from(pos).ok()?;
        self.slots.get(pos).map(|_| self.view(k))
    }

    /// Recovery: sets a task's counters (a replayed record carries them). Journals nothing.
    pub fn restore_counts(&mut self, id: TaskId, counts: JobCounts) -> Result<(), QueueError> {
        let k = self.find(id).ok_or(QueueError::NotFound(id))?;
        self.slots.set_counts(k, counts);
        Ok(())
    }

    /// Recovery: sets a task's delivery count (a replayed take carries it). Journals nothing.
    pub fn restore_deliveries(&mut self, id: TaskId, deliveries: u16) -> Result<(), QueueError> {
        let k = self.find(id).ok_or(QueueError::NotFound(id))?;
        self.slots[k as usize].deliveries = deliveries;
        Ok(())
    }

    /// The sequence numbers `dedup_entry(tube, seq)` answers for now (oldest first); empty
    /// for a tube without a dedup window.
    pub fn dedup_seqs(&self, tube: TubeIx) -> std::ops::Range<u64> {
        let d = self
            .tubes
            .get(tube as usize)
            .and_then(Option::as_ref)
            .and_then(|t| t.dedup.as_deref());
        d.map_or(0..0, |d| d.first_seq..d.first_seq + d.fifo.len() as u64)
    }
}

/// Refuses a tube name the engine does not keep: empty, or past `MAX_TUBE_NAME_BYTES`.
fn check_tube_name(name: &str) -> Result<(), QueueError> {
    if name.is_empty() || name.len() > MAX_TUBE_NAME_BYTES {
        return Err(QueueError::BadTubeName {
            len: name.len(),
            max: MAX_TUBE_NAME_BYTES,
        });
    }
    Ok(())
}
