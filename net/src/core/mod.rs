//! The core: the queue, the journal, parked takes, waiting puts and pauses, behind one entry
//! point, [`Core::execute`]. A front-end decodes a request into a [`Command`] and hands it to
//! `execute` with its own reply token `R` (how to answer: an IPROTO sync, a beanstalk reply
//! kind); the core runs it and hands every [`Outcome`] to its [`Host`] to encode and queue —
//! now, or later for a take that parked or a put that waited for room. The core knows no
//! socket, no wire format and no front-end: the host (the event loop) owns the connections and
//! answers the few questions the core asks of it (is this connection still there, may this
//! node change anything, is a tube in use by a protocol's connections).
//!
//! A put's path: the loop reads a frame → the front-end decodes `Command::PutIn` → `execute`
//! checks the node's role and the disk's room, puts, logs the engine's events to the journal
//! → the host encodes the task into the connection's buffer → the loop commits the turn and
//! writes the reply once durable. Nothing goes back the way it came.

pub mod access;
mod command;
mod disk_room;
mod execute;
pub mod journal;
mod moves;
pub mod parked;
mod pauses;
pub mod waiting_puts;

use std::collections::HashMap;

use tarq_engine::{Bytes, Event, Micros, Queue, SessionId, Stats, TubeIx};

pub use command::{
    Command, Listed, MoveProgress, MoveReport, On, Outcome, Refusal, TaskFigures, TaskPage,
    LIST_PREVIEW_BYTES,
};
pub use execute::Unneeded;
use journal::{Journal, Ticket};
pub use moves::Page;
use parked::Parked;
pub use pauses::{Pause, Pauses};
use waiting_puts::WaitingPuts;

/// Who asked: a connection's slot and generation (a reused slot is another caller) and its
/// session (whose tasks it holds). Two words, so it travels in registers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Caller {
    conn: u32,
    pub gen: u32,
    pub sid: SessionId,
}

impl Caller {
    pub fn new(slot: usize, gen: u32, sid: SessionId) -> Caller {
        let conn = u32::try_from(slot).expect("connection slots are counted in u32");
        Caller { conn, gen, sid }
    }

    /// The connection's slot.
    #[inline]
    pub fn slot(&self) -> usize {
        self.conn as usize
    }
}

/// What the core needs from the loop that runs it.
pub trait Host<R> {
    /// Encodes `outcome` for `to` as `reply` says, queued for this turn's flush. `to` is live
    /// (the core asks [`is_live`](Self::is_live) before answering a caller that waited).
    fn deliver(&mut self, to: Caller, reply: R, outcome: &Outcome<'_>);

    /// `to`'s replies of this turn answer a change (with synchronous replicas they wait for
    /// the replicas' acknowledgements).
    fn changed(&mut self, to: Caller);

    /// Whether `to`'s connection is still the one that asked, and open.
    fn is_live(&self, to: Caller) -> bool;

    /// Whether this node may change the queue now (it leads: not a replica, not a cluster
    /// node whose leadership ran out). Asked before every change: keep it cheap.
    fn leads(&self) -> bool;

    /// Why this node may change nothing now, when it does not lead.
    fn not_leading(&self) -> Refusal;

    /// Whether a protocol's connections hold `tube` (beanstalk's `use` and `watch`): it may
    /// not be dropped under them.
    fn tube_in_use(&self, tube: TubeIx) -> bool;

    /// `tube` was dropped; `last` are its final counters.
    fn tube_dropped(&mut self, tube: TubeIx, last: &Stats);
}

/// The queue and everything that acts on it for the front-ends. `R` is the front-ends' reply
/// token, kept by a take that parks and a put that waits.
pub struct Core<R> {
    queue: Queue,
    journal: Journal,
    parked: Parked<R>,
    waiting_puts: WaitingPuts<R>,
    pauses: Pauses,
    /// The turn's wall-clock reading (µs since the epoch): the `now` of every engine call,
    /// which tasks keep (their deadlines are persisted).
    now: Micros,
    /// The turn's monotonic reading (µs): the `now` of parked takes', waiting puts' and pauses'
    /// deadlines, which live in this process only.
    mono: Micros,
    /// Engine events on their way to the journal (reused).
    events: Vec<Event>,
    /// The request being executed when it arrived as one big frame whose read buffer was
    /// handed over: a big put's payload is kept in it, not copied.
    big_frame: Option<Bytes>,
    /// Takes that parked since start.
    takes_parked: u64,
    /// A tube a live copy follows: which of its tasks changed since it began.
    changed: Option<moves::Changed>,
    /// Takes waiting on a partitioned tube in routers (this node's and others'), by the
    /// tube's first partition, when this node owns it: counted with its consumers
    /// (`shards::waiting`).
    routed_waiting: HashMap<TubeIx, u64>,
}

/// `s` with the consumers of `tube` (the takes parked on it or waiting in routers, the
/// sessions holding its tasks) and when its next ready task was put.
fn with_takers<R>(
    mut s: Stats,
    queue: &Queue,
    parked: &Parked<R>,
    routed: &HashMap<TubeIx, u64>,
    tube: TubeIx,
    holders: &[u64],
) -> Stats {
    s.ready_since = queue.ready_since(tube);
    // The routed count comes from other nodes: summed without overflow whatever it says.
    let routed = routed.get(&tube).copied().unwrap_or(0);
    s.takers_waiting = (parked.takers_in(tube) as u64).saturating_add(routed);
    s.takers_holding = holders.get(usize::from(tube)).copied().unwrap_or(0);
    s
}

impl<R: Copy> Core<R> {
    pub fn new(mut queue: Queue, journal: Journal, now: Micros, mono: Micros) -> Core<R> {
        queue.set_journal(journal.wants_events());
        Core {
            queue,
            journal,
            parked: Parked::default(),
            waiting_puts: WaitingPuts::default(),
            pauses: Pauses::default(),
            now,
            mono,
            events: Vec::new(),
            changed: None,
            routed_waiting: HashMap::new(),
            big_frame: None,
            takes_parked: 0,
        }
    }

    /// Starts a turn at wall-clock `now` and monotonic `mono`: the journal takes in a finished
    /// sync or snapshot.
    pub fn begin_turn(&mut self, now: Micros, mono: Micros) {
        (self.now, self.mono) = (now, mono);
        self.journal.turn_start(&mut self.queue, now);
    }

    /// The turn's wall-clock reading.
    pub fn now(&self) -> Micros {
        self.now
    }

    pub fn queue(&self) -> &Queue {
        &self.queue
    }

    /// A tube's figures with its consumers: the engine's, plus the takes parked on it now
    /// and the sessions holding its tasks (`holders`, from [`Queue::holders`], read once for
    /// several tubes).
    pub fn tube_figures(&self, tube: TubeIx, holders: &[u64]) -> Option<Stats> {
        let s = self.queue.tube_stats(tube).ok()?;
        let routed = &self.routed_waiting;
        Some(with_takers(
            s,
            &self.queue,
            &self.parked,
            routed,
            tube,
            holders,
        ))
    }

    /// Sets how many takes wait on tube `head` in routers (this node's and other nodes'),
    /// counted in its figures beside the takes parked here.
    pub fn set_routed_waiting(&mut self, head: TubeIx, count: u64) {
        match count {
            0 => self.routed_waiting.remove(&head),
            n => self.routed_waiting.insert(head, n),
        };
    }

    /// The queue, changed behind the journal's back: tests only. Every change of the server's
    /// goes through a command, the replica's apply or a named call here.
    #[cfg(test)]
    pub fn queue_mut(&mut self) -> &mut Queue {
        &mut self.queue
    }

    /// Partition `ix`'s operation counters start again from 0 (a partition that moved back
    /// here: its earlier counts travelled with it). Counters are figures, not state: nothing
    /// is journaled, as nothing is for the commands they count.
    pub fn restart_counts(&mut self, ix: TubeIx) {
        let _ = self.queue.restart_counts(ix);
    }

    /// Replaces the queue (a replica took a new copy of its primary's, whose records it
    /// applies as they come: its own journal flag stays as the copy came).
    pub fn replace_queue(&mut self, queue: Queue) {
        self.queue = queue;
    }

    pub fn journal(&self) -> &Journal {
        &self.journal
    }

    pub fn journal_mut(&mut self) -> &mut Journal {
        &mut self.journal
    }

    /// The queue and the journal together (a journal call that reads or changes the queue).
    pub fn queue_and_journal(&mut self) -> (&mut Queue, &mut Journal) {
        (&mut self.queue, &mut self.journal)
    }

    /// The turn's monotonic reading.
    pub fn mono(&self) -> Micros {
        self.mono
    }

    pub fn pauses(&self) -> &Pauses {
        &self.pauses
    }

    /// Takes parked now, and since start.
    pub fn parked_takes(&self) -> (usize, u64) {
        (self.parked.len(), self.takes_parked)
    }

    /// Takes parked on `tube` now, watches left out.
    pub fn parked_in(&self, tube: TubeIx) -> usize {
        self.parked.takers_in(tube)
    }

    /// Takes connection `conn` has parked now.
    pub fn parked_of(&self, conn: usize) -> usize {
        self.parked.count_of(conn)
    }

    /// Whether a pause has reached its end (the turn ends it: [`Core::end_pauses`]).
    #[inline]
    pub fn pauses_due(&self) -> bool {
        self.pauses.next_end().is_some_and(|t| t <= self.mono)
    }

    /// Whether a put waits for room anywhere.
    #[inline]
    pub fn has_waiting_puts(&self) -> bool {
        !self.waiting_puts.is_empty()
    }

    /// Whether a take or a put waits on `tube`.
    #[inline]
    pub fn has_waiters(&self, tube: TubeIx) -> bool {
        self.parked.waiting_in(tube) || self.waiting_puts.waiting_in(tube)
    }

    /// The request being executed arrived as this one big frame (`None` after it): a big put
    /// keeps its payload in the frame instead of a copy.
    pub fn set_big_frame(&mut self, frame: Option<Bytes>) {
        self.big_frame = frame;
    }

    /// Hands the engine's events of the last call to the journal.
    pub fn drain_events(&mut self) {
        if self.journal.wants_events() {
            // Taken out first, by a swap of buffers (no copy, no allocation): `record` reads
            // the queue, which a drain would hold borrowed.
            self.queue.take_events(&mut self.events);
            if self.changed.is_some() {
                self.note_changes();
            }
            for ev in self.events.drain(..) {
                self.journal.record(&self.queue, ev);
            }
        } else if self.changed.is_some() {
            self.queue.take_events(&mut self.events);
            self.note_changes();
            self.events.clear();
        }
    }

    /// A live copy follows a tube's changes: the drained events' tasks of it are noted.
    #[cold]
    #[inline(never)]
    fn note_changes(&mut self) {
        if let Some(c) = self.changed.as_mut() {
            for ev in &self.events {
                c.note(ev);
            }
        }
    }

    /// Fires up to `budget` due engine deadlines (promotions, expiries, TTR returns) and serves
    /// the takes they free. Returns whether deadlines are still due (the loop turns again at
    /// once).
    pub fn advance(&mut self, budget: usize, host: &mut impl Host<R>) -> bool {
        let adv = self.queue.advance(self.now, budget);
        if adv.processed > 0 {
            self.drain_events();
            self.serve_all_parked(host);
        }
        adv.next_deadline.is_some_and(|d| d <= self.now)
    }

    /// The engine's earliest deadline (a promotion, an expiry, a TTR), on the wall clock.
    pub fn next_engine_deadline(&self) -> Option<Micros> {
        self.queue.next_deadline()
    }

    /// The earliest in-process deadline, on the monotonic clock: a parked take's, a waiting
    /// put's, a pause's end.
    pub fn next_timer(&mut self) -> Option<Micros> {
        [
            self.parked.next_deadline(),
            self.waiting_puts.next_deadline(),
            self.pauses.next_end(),
        ]
        .into_iter()
        .flatten()
        .min()
    }

    /// When the journal wants the loop back (a snapshot's next step, a failed write's retry),
    /// on the monotonic clock from the turn's reading.
    pub fn next_journal_wakeup(&self) -> Option<Micros> {
        (self.journal.next_wakeup()).map(|d| self.mono + d.as_micros() as Micros)
    }

    /// A parked take whose deadline passed, removed: its front-end answers it.
    pub fn expired_take(&mut self) -> Option<(Caller, R)> {
        let (_, p) = self.parked.pop_expired(self.mono)?;
        Some((p.caller, p.reply))
    }

    /// Any parked take, removed (a stop answers them all).
    pub fn any_parked(&mut self) -> Option<(Caller, R)> {
        let (_, p) = self.parked.pop_any()?;
        Some((p.caller, p.reply))
    }

    /// Any waiting put, removed (a stop answers them all).
    pub fn any_waiting_put(&mut self) -> Option<(Caller, R)> {
        self.waiting_puts.pop_front().map(|p| (p.caller, p.reply))
    }

    /// Drops the takes connection `conn` has parked (it closed, or its front-end ended them).
    pub fn unpark(&mut self, conn: usize) {
        self.parked.remove_conn(conn);
    }

    /// Holds a tube a sharded cluster's placement puts here, at its index (journaled; a no-op
    /// when it is there already).
    pub fn place_tube(
        &mut self,
        ix: TubeIx,
        name: &str,
        kind: tarq_engine::TubeType,
        opts: tarq_engine::TubeOptions,
        first: u64,
    ) -> Result<bool, tarq_engine::QueueError> {
        let made = self.queue.create_tube_at(ix, name, kind, opts, first)?;
        self.drain_events();
        Ok(made)
    }

    /// Stores `user` as the cluster's table has it (a sharded primary), journaled with this
    /// turn.
    pub fn put_user(&mut self, user: tarq_engine::User) -> Result<(), tarq_engine::UserError> {
        let stored = self.queue.put_user(user);
        self.drain_events();
        stored
    }

    /// Drops user `name` as the cluster's table has it (a sharded primary), journaled with
    /// this turn.
    pub fn drop_user(&mut self, name: &str) {
        self.queue.drop_user(name);
        self.drain_events();
    }

    /// Commits the turn to the journal; returns its ticket.
    pub fn commit(&mut self) -> Ticket {
        self.journal.commit(&mut self.queue, self.now)
    }
}
