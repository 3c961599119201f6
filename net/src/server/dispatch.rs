//! One dispatch for every front-end. A front-end turns its frames into [`Command`]s and hands
//! them to [`Server::dispatch`] with a [`ReplyTo`] saying how to answer; this file runs them
//! against the engine, the parked takes (and waiting puts), the journal's refusals and the
//! stats, and hands each result back as an [`Outcome`] for the front-end of the asking
//! connection to encode ([`crate::frontend::encode`]). A take that parks keeps its `ReplyTo`,
//! so it is answered in its own connection's protocol when a task or its deadline comes.
//!
//! Nothing here knows a wire format: names, argument decoding, error codes and reply shapes
//! are the front-ends'.

use tarq_engine::{
    Bytes, Micros, PutOptions, PutOutcome, QueueError, ReleaseOptions, Stats, Status, Task, TaskId,
    TaskRef, TubeInfo, TubeIx, TubeOptions, TubePut, TubeType, DEFAULT_TUBE,
};

use slab::Slab;
use tarq_ops::stats::Snapshot;

use super::conn::Conn;
use super::parked::MAX_PARKED_PER_CONN;
use super::{mark_flush, Server};
use crate::frontend::{self, ReplyTo};

/// Which API a command speaks, when the two differ in wording: the seed calls (`queue.put`,
/// ... on the tube `default`, with the seed's error texts) or the tube API on any tube.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum On {
    Seed,
    Tube(TubeIx),
}

impl On {
    pub fn tube(self) -> TubeIx {
        match self {
            On::Seed => DEFAULT_TUBE,
            On::Tube(t) => t,
        }
    }
}

/// A front-end-neutral request. Payloads and keys borrow the request frame.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Command<'a> {
    /// The seed's put into `default`.
    Put {
        data: &'a [u8],
        opts: PutOptions,
    },
    /// A put into a tube; `wait` is how long a put into a full tube waits for room (0: none).
    PutIn {
        tube: TubeIx,
        data: &'a [u8],
        opts: TubePut<'a>,
        wait: Micros,
    },
    /// `timeout` 0 answers at once; `None` waits without end.
    Take {
        on: On,
        timeout: Option<Micros>,
    },
    Ack {
        on: On,
        id: TaskId,
    },
    Release {
        on: On,
        id: TaskId,
        opts: ReleaseOptions,
    },
    /// `delta` `None`: no TTL or TTR from now on.
    Touch {
        tube: TubeIx,
        id: TaskId,
        delta: Option<Micros>,
    },
    Peek {
        tube: TubeIx,
        id: TaskId,
    },
    Bury {
        tube: TubeIx,
        id: TaskId,
    },
    Kick {
        tube: TubeIx,
        count: u64,
    },
    Delete {
        tube: TubeIx,
        id: TaskId,
    },
    ReleaseAll {
        tube: TubeIx,
    },
    Truncate {
        tube: TubeIx,
    },
    DropTube {
        tube: TubeIx,
    },
    CreateTube {
        name: &'a str,
        kind: TubeType,
        opts: TubeOptions,
        if_not_exists: bool,
    },
    /// A take from whichever of `tubes` has the lowest (pri, id) task ready (beanstalk's
    /// reserve over its watched tubes). Parked on all of them while none has one; the parked
    /// entries wake at `wake` (at most the timeout's deadline) for the front-end to decide.
    TakeAny {
        tubes: &'a [TubeIx],
        timeout: Option<Micros>,
        wake: Micros,
    },
    /// Take this task (beanstalk's reserve-job): Ready, Waiting or Buried, in any tube.
    TakeTask {
        id: TaskId,
    },
    /// Bury a task this session holds, with a new pri (beanstalk's bury).
    BuryTaken {
        id: TaskId,
        pri: i64,
    },
    /// Restart the TTR of a task this session holds (beanstalk's touch).
    TouchTtr {
        id: TaskId,
    },
    /// Kick up to `count` buried tasks of `tube`, or if it has none, delayed ones (beanstalk's
    /// kick).
    KickAny {
        tube: TubeIx,
        count: u64,
    },
    /// Make one buried or delayed task ready (beanstalk's kick-job).
    KickTask {
        id: TaskId,
    },
    /// One tube's counters.
    TubeStats {
        tube: TubeIx,
    },
    /// The server's figures (`queue.stats()`).
    ServerStats,
    Snapshot,
}

impl Command<'_> {
    /// Whether the command changes the queue (refused while the journal cannot take changes).
    pub(crate) fn changes(&self) -> bool {
        !matches!(
            self,
            Command::Peek { .. }
                | Command::TubeStats { .. }
                | Command::ServerStats
                | Command::Snapshot
                | Command::Take { .. }
                | Command::TakeAny { .. }
                | Command::TouchTtr { .. }
        )
    }

    /// Whether the command only reads (all a replica serves). A snapshot is the replica's
    /// own: it changes no task.
    fn reads_only(&self) -> bool {
        matches!(
            self,
            Command::Peek { .. }
                | Command::TubeStats { .. }
                | Command::ServerStats
                | Command::Snapshot
        )
    }

    /// Whether the command touches tube state the journal must be able to log (anything but
    /// the seed calls and takes / acks on `default`).
    fn needs_tube_journal(&self) -> bool {
        match self {
            Command::Put { .. }
            | Command::Take { .. }
            | Command::TakeAny { .. }
            | Command::TouchTtr { .. }
            | Command::Ack { .. }
            | Command::ServerStats
            | Command::Snapshot
            | Command::Peek { .. }
            | Command::TubeStats { .. } => false,
            Command::Release { on, opts, .. } => {
                *on != On::Seed && (opts.pri.is_some() || opts.ttl.is_some())
            }
            _ => true,
        }
    }
}

/// What a command did, for the front-end to encode. Borrowed tasks live in the engine.
#[derive(Debug)]
pub enum Outcome<'q> {
    /// A task as it is now (put, take, release, peek, bury, touch).
    Task(TaskRef<'q>),
    /// A task that left the queue (ack, delete), as it was.
    Done(Task),
    /// A dedup put whose earlier task is already gone: its id, and its number as the tube API
    /// shows it (`Queue::task_number`).
    DoneId {
        id: TaskId,
        number: u64,
    },
    /// No task: a take that timed out, a touch with nothing to add.
    Nothing,
    /// A put into a full tube that waited (or could not wait) and found no room.
    Full,
    /// How many (kick).
    Count(u64),
    /// Done, nothing to show (truncate, release_all).
    Ok,
    /// drop.
    Dropped,
    /// A tube created or found (`if_not_exists`).
    Tube(TubeInfo<'q>),
    TubeStats(Stats),
    ServerStats(Box<Snapshot>),
    /// The snapshot call's report.
    Text(String),
    Error(Refusal),
}

/// Why a command was refused, for the front-end to word and code.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    #[error(transparent)]
    Queue(#[from] QueueError),
    /// The journal cannot make changes durable now (a full or failing disk).
    #[error("{0}")]
    Journal(String),
    #[error("Too many waiting takes on this connection: the limit is {MAX_PARKED_PER_CONN}")]
    TooManyParked,
    /// drop of a tube with a take parked on it (the original's wording).
    #[error("There are consumers connected the tube")]
    Consumers,
    /// The journal cannot log tube changes.
    #[error("tube changes need the WAL format with tubes: not durable yet")]
    NotDurable,
    /// The journal has no snapshots.
    #[error("no snapshots without a WAL")]
    NoSnapshots,
    /// A change sent to a replica: it names the primary, so a client can go there. The form
    /// `read-only replica: the primary is ADDR` is stable: clients parse it to redirect.
    #[error("read-only replica: the primary is {0}")]
    ReadOnly(String),
    /// A change sent to a cluster node while no primary is known to it (an election, etcd
    /// unreachable, a leadership that ran out): why.
    #[error("read-only replica: no primary now: {0}")]
    NoPrimary(String),
}

/// `deliver_to` over the server's fields, so that an outcome may borrow the queue.
macro_rules! deliver {
    ($s:expr, $idx:expr, $reply:expr, $outcome:expr) => {
        deliver_to(&mut $s.conns, &mut $s.flush_list, $idx, $reply, $outcome)
    };
}

impl Server {
    /// Runs `cmd` for connection `idx` and answers it through `reply` (now, or when a parked
    /// take is served or times out).
    pub(crate) fn dispatch(&mut self, idx: usize, reply: ReplyTo, cmd: Command<'_>) {
        if let Some(r) = self.refusal(&cmd) {
            self.deliver(idx, reply, &Outcome::Error(r));
            return;
        }
        if cmd.changes() {
            self.conns[idx].out.changed = true;
        }
        // The pair of the reservation: what the change logged stays within what it reserved.
        #[cfg(debug_assertions)]
        let reserved = cmd
            .changes()
            .then(|| (self.record_bound(&cmd), self.journal.pending_bytes()));
        let woke = match cmd {
            Command::Put { data, opts } => self.put(idx, reply, data, opts),
            Command::PutIn {
                tube,
                data,
                opts,
                wait,
            } => self.put_in(idx, reply, tube, data, opts, wait),
            Command::Take { on, timeout } => {
                self.take(idx, reply, on.tube(), timeout);
                None
            }
            Command::TakeAny {
                tubes,
                timeout,
                wake,
            } => {
                self.take_any(idx, reply, tubes, timeout, wake);
                None
            }
            Command::Ack { on, id } => self.ack(idx, reply, on, id),
            Command::Release { on, id, opts } => self.release(idx, reply, on, id, opts),
            other => self.dispatch_tube_admin(idx, reply, other),
        };
        self.drain_events();
        if let Some(tube) = woke {
            self.serve_parked(tube);
        }
        #[cfg(debug_assertions)]
        if let Some((bound, before)) = reserved {
            self.drain_events();
            let logged = self.journal.pending_bytes().saturating_sub(before);
            assert!(
                logged <= bound,
                "{cmd:?} logged {logged} bytes of records, over the {bound} it reserved"
            );
        }
    }

    /// The journal's refusal of a change it cannot make durable, checked before the queue is
    /// touched (the journal reserves the room for the change's records otherwise).
    pub(crate) fn refusal(&mut self, cmd: &Command<'_>) -> Option<Refusal> {
        if let Some(r) = self.role_refusal(cmd) {
            return Some(r);
        }
        let admitted = match cmd {
            Command::Take { .. } | Command::TakeAny { .. } | Command::TakeTask { .. } => {
                self.journal.admit_take()
            }
            c if c.changes() => {
                let bytes = self.record_bound(c);
                self.journal.admit_change(bytes)
            }
            _ => return None,
        };
        admitted.err().map(Refusal::Journal)
    }

    /// [`refusal`](Self::refusal) of a batch whose first command is `first` and whose records
    /// take at most `bytes`: the room for all its items is reserved at once.
    pub(crate) fn batch_refusal(&mut self, first: &Command<'_>, bytes: u64) -> Option<Refusal> {
        if let Some(r) = self.role_refusal(first) {
            return Some(r);
        }
        let admitted = match first {
            Command::Take { .. } => self.journal.admit_take(),
            _ => self.journal.admit_change(bytes),
        };
        admitted.err().map(Refusal::Journal)
    }

    /// Refusals that do not depend on the disk: a node that does not lead, a journal that
    /// cannot log tube changes.
    #[inline(always)]
    fn role_refusal(&self, cmd: &Command<'_>) -> Option<Refusal> {
        // Only the primary's records change a replica's queue; a take would too. A cluster
        // node checks its fence here, before the change runs.
        if !cmd.reads_only() && !self.leads() {
            return Some(match (&self.cluster, self.cfg.replica_of) {
                (Some(c), _) => c.not_leading(),
                (None, Some(primary)) => Refusal::ReadOnly(primary.to_string()),
                (None, None) => Refusal::NoPrimary("this tarq is not the primary".into()),
            });
        }
        if cmd.needs_tube_journal() && self.journal.wants_events() && !self.journal.logs_tubes() {
            return Some(Refusal::NotDurable);
        }
        None
    }

    /// `data` as a handle into the big frame it arrived in, when that frame's buffer was
    /// handed over and the payload is most of it: the task keeps the payload where it was
    /// read instead of a copy, and holds at most as much again of the rest of the frame (a
    /// batch of smaller payloads in one frame is copied, or one left in the queue would keep
    /// the whole frame).
    fn frame_payload(&self, data: &[u8]) -> Option<Bytes> {
        let frame = self.big_frame.as_ref()?;
        let within = frame.as_ptr_range();
        let ptrs = data.as_ptr_range();
        let inside = within.start <= ptrs.start && ptrs.end <= within.end;
        (inside && data.len() * 2 >= frame.len()).then(|| frame.slice_ref(data))
    }

    fn put(&mut self, idx: usize, reply: ReplyTo, data: &[u8], opts: PutOptions) -> Option<TubeIx> {
        let put = match self.frame_payload(data) {
            Some(payload) => self.queue.try_put(self.now, payload, opts),
            None => self.queue.try_put(self.now, data, opts),
        };
        match put {
            Ok(t) => deliver!(self, idx, reply, &Outcome::Task(t)),
            Err(e) => {
                deliver!(self, idx, reply, &Outcome::Error(e.into()));
                return None;
            }
        }
        (opts.delay == 0).then_some(DEFAULT_TUBE)
    }

    fn put_in(
        &mut self,
        idx: usize,
        reply: ReplyTo,
        tube: TubeIx,
        data: &[u8],
        opts: TubePut<'_>,
        wait: Micros,
    ) -> Option<TubeIx> {
        let put = match self.frame_payload(data) {
            Some(payload) => self.queue.put_in(self.now, tube, payload, opts),
            None => self.queue.put_in(self.now, tube, data, opts),
        };
        let outcome = match put {
            Ok(PutOutcome::Created(t)) => {
                let ready = t.status == tarq_engine::Status::Ready;
                deliver!(self, idx, reply, &Outcome::Task(t));
                return ready.then_some(tube);
            }
            Ok(PutOutcome::Duplicate(t)) => Outcome::Task(t),
            Ok(PutOutcome::DuplicateDone(id)) => Outcome::DoneId {
                id,
                number: self.queue.task_number(tube, id),
            },
            Err(QueueError::TubeFull { .. }) if wait > 0 => {
                self.park_put(idx, reply, tube, data, opts, wait);
                return None;
            }
            Err(QueueError::TubeFull { .. }) => Outcome::Full,
            Err(e) => Outcome::Error(e.into()),
        };
        deliver!(self, idx, reply, &outcome);
        None
    }

    fn take(&mut self, idx: usize, reply: ReplyTo, tube: TubeIx, timeout: Option<Micros>) {
        let sid = self.conns[idx].sid;
        if self.beanstalk.paused(tube, self.now) {
            return match timeout {
                Some(0) => self.deliver(idx, reply, &Outcome::Nothing),
                _ => self.park_take(idx, reply, tube, timeout),
            };
        }
        match self.queue.take_from(self.now, tube, sid) {
            Ok(Some(t)) => deliver!(self, idx, reply, &Outcome::Task(t)),
            Ok(None) if timeout == Some(0) => self.deliver(idx, reply, &Outcome::Nothing),
            Ok(None) => self.park_take(idx, reply, tube, timeout),
            Err(e) => self.deliver(idx, reply, &Outcome::Error(e.into())),
        }
    }

    fn park_take(&mut self, idx: usize, reply: ReplyTo, tube: TubeIx, timeout: Option<Micros>) {
        let deadline = timeout.map_or(Micros::MAX, |t| self.now.saturating_add(t));
        self.park_on(idx, reply, &[tube], deadline);
    }

    /// Parks one take on every tube of `tubes` (whichever gets a task first serves it; the
    /// front-end drops the other entries then).
    fn park_on(&mut self, idx: usize, reply: ReplyTo, tubes: &[TubeIx], deadline: Micros) {
        let c = &mut self.conns[idx];
        if c.parked.len() + tubes.len() > MAX_PARKED_PER_CONN {
            self.deliver(idx, reply, &Outcome::Error(Refusal::TooManyParked));
            return;
        }
        self.takes_parked += 1;
        for &tube in tubes {
            let key = self.parked.park(idx, c.gen, tube, reply, deadline);
            c.parked.push(key);
        }
    }

    /// A take from the tube of `tubes` whose ready head is lowest in (pri, id), skipping
    /// paused tubes; parked on all of them when none has one.
    fn take_any(
        &mut self,
        idx: usize,
        reply: ReplyTo,
        tubes: &[TubeIx],
        timeout: Option<Micros>,
        wake: Micros,
    ) {
        let now = self.now;
        let best = tubes
            .iter()
            .filter(|&&t| !self.beanstalk.paused(t, now) && self.queue.can_take(t))
            .filter_map(|&t| {
                let head = self.queue.peek_first(t, Status::Ready).ok().flatten()?;
                Some((head.pri, head.id, t))
            })
            .min();
        if let Some((_, _, tube)) = best {
            let sid = self.conns[idx].sid;
            match self.queue.take_from(now, tube, sid) {
                Ok(Some(t)) => deliver!(self, idx, reply, &Outcome::Task(t)),
                Ok(None) => self.deliver(idx, reply, &Outcome::Nothing),
                Err(e) => self.deliver(idx, reply, &Outcome::Error(e.into())),
            }
            return;
        }
        match timeout {
            Some(0) => self.deliver(idx, reply, &Outcome::Nothing),
            _ => self.park_on(idx, reply, tubes, wake),
        }
    }

    fn ack(&mut self, idx: usize, reply: ReplyTo, on: On, id: TaskId) -> Option<TubeIx> {
        let sid = self.conns[idx].sid;
        let res = match on {
            On::Seed => self.queue.ack(sid, id),
            On::Tube(t) => self.queue.ack_in(t, sid, id),
        };
        let woke = self.room_or_head_freed(on.tube());
        match res {
            Ok(t) => self.deliver(idx, reply, &Outcome::Done(t)),
            Err(e) => self.deliver(idx, reply, &Outcome::Error(e.into())),
        }
        woke
    }

    fn release(
        &mut self,
        idx: usize,
        reply: ReplyTo,
        on: On,
        id: TaskId,
        opts: ReleaseOptions,
    ) -> Option<TubeIx> {
        let sid = self.conns[idx].sid;
        let res = match on {
            On::Seed => self.queue.release(self.now, sid, id, opts.delay),
            On::Tube(t) => self.queue.release_in(self.now, t, sid, id, opts),
        };
        match res {
            Ok(t) => {
                deliver!(self, idx, reply, &Outcome::Task(t));
                Some(on.tube())
            }
            Err(e) => {
                self.deliver(idx, reply, &Outcome::Error(e.into()));
                None
            }
        }
    }

    /// After a task of `tube` left: a utube head may be free, a full tube may have room.
    fn room_or_head_freed(&self, tube: TubeIx) -> Option<TubeIx> {
        (self.parked.waiting_in(tube) || self.waiting_puts_in(tube)).then_some(tube)
    }

    /// The tube API's calls beyond put / take / ack / release, and the stats.
    fn dispatch_tube_admin(
        &mut self,
        idx: usize,
        reply: ReplyTo,
        cmd: Command<'_>,
    ) -> Option<TubeIx> {
        let now = self.now;
        let q = &mut self.queue;
        let (outcome, woke) = match cmd {
            Command::Touch { tube, id, delta } => {
                (task(q.touch(tube, self.conns[idx].sid, id, delta)), None)
            }
            Command::Peek { tube, id } => (task(q.peek(tube, id)), None),
            Command::Bury { tube, id } => (task(q.bury(tube, id)), Some(tube)),
            Command::Kick { tube, count: n } => (count(q.kick(tube, n)), Some(tube)),
            Command::Delete { tube, id } => (done(q.delete(tube, id)), Some(tube)),
            Command::ReleaseAll { tube } => (ok(q.release_all(tube)), Some(tube)),
            Command::Truncate { tube } => (ok(q.truncate(tube)), Some(tube)),
            Command::DropTube { tube }
                if self.parked.waiting_in(tube) || self.beanstalk.in_use(tube) =>
            {
                (Outcome::Error(Refusal::Consumers), None)
            }
            Command::DropTube { tube } => match (q.tube_stats(tube), q.drop_tube(tube)) {
                (last, Ok(())) => {
                    self.beanstalk.forget_tube(tube, &last.unwrap_or_default());
                    self.refuse_waiting_puts(tube);
                    (Outcome::Dropped, None)
                }
                (_, Err(e)) => (Outcome::Error(e.into()), None),
            },
            Command::CreateTube {
                name,
                kind,
                opts,
                if_not_exists,
            } => {
                let found = q.tube_ix(name).filter(|_| if_not_exists);
                match found.map_or_else(|| q.create_tube(name, kind, opts), Ok) {
                    Ok(t) => (Outcome::Tube(q.tube_info(t).expect("live")), None),
                    Err(e) => (Outcome::Error(e.into()), None),
                }
            }
            Command::TakeTask { id } => {
                let sid = self.conns[idx].sid;
                (task(q.take_task(now, sid, id)), None)
            }
            Command::BuryTaken { id, pri } => {
                let sid = self.conns[idx].sid;
                let r = q.bury_taken(sid, id, pri);
                let tube = r.as_ref().ok().map(|t| t.tube);
                (task(r), tube)
            }
            Command::TouchTtr { id } => (task(q.touch_ttr(now, self.conns[idx].sid, id)), None),
            Command::KickAny { tube, count: n } => {
                let buried = q.tube_stats(tube).map_or(0, |s| s.buried);
                let kicked = if buried > 0 {
                    q.kick(tube, n)
                } else {
                    q.kick_delayed(now, tube, n)
                };
                (count(kicked), Some(tube))
            }
            Command::KickTask { id } => {
                let r = q.kick_task(now, id);
                let tube = r.as_ref().ok().map(|t| t.tube);
                (task(r), tube)
            }
            Command::TubeStats { tube } => match q.tube_stats(tube) {
                Ok(s) => (Outcome::TubeStats(s), None),
                Err(e) => (Outcome::Error(e.into()), None),
            },
            Command::ServerStats => (Outcome::ServerStats(Box::new(self.snapshot())), None),
            Command::Snapshot => match self.journal.snapshot(&self.queue, now) {
                None => (Outcome::Error(Refusal::NoSnapshots), None),
                Some(Ok(text)) => (Outcome::Text(text), None),
                Some(Err(msg)) => (Outcome::Error(Refusal::Journal(msg)), None),
            },
            Command::Put { .. }
            | Command::PutIn { .. }
            | Command::Take { .. }
            | Command::TakeAny { .. }
            | Command::Ack { .. }
            | Command::Release { .. } => unreachable!("dispatched by `dispatch`"),
        };
        deliver!(self, idx, reply, &outcome);
        woke
    }

    /// Encodes `outcome` into connection `idx`'s replies, queued for this turn's flush.
    pub(crate) fn deliver(&mut self, idx: usize, reply: ReplyTo, outcome: &Outcome<'_>) {
        deliver!(self, idx, reply, outcome);
    }

    /// Hands ready tasks of `tube` to its parked takes, oldest waiter first, and room in it to
    /// its waiting puts.
    pub(crate) fn serve_parked(&mut self, tube: TubeIx) {
        self.serve_waiting_puts(tube);
        if self.beanstalk.paused(tube, self.now) {
            return;
        }
        while self.parked.waiting_in(tube) && self.queue.can_take(tube) {
            let Some((key, p)) = self.parked.pop_oldest(tube) else {
                break;
            };
            let Some(c) = self.conns.get_mut(p.conn).filter(|c| c.gen == p.gen) else {
                continue;
            };
            super::forget_parked(c, key);
            let sid = c.sid;
            match self.queue.take_from(self.now, tube, sid) {
                Ok(Some(t)) => deliver!(self, p.conn, p.reply, &Outcome::Task(t)),
                _ => break,
            }
            self.drain_events();
            self.parked_answered(p.conn, p.reply);
        }
    }

    /// `serve_parked` for every tube with waiters (after deadlines fired or a session closed).
    pub(crate) fn serve_all_parked(&mut self) {
        let mut i = 0;
        while let Some(tube) = self
            .parked
            .waiting_tube(i)
            .or_else(|| self.waiting_put_tube(i))
        {
            self.serve_parked(tube);
            i += 1;
        }
    }
}

/// Writes `outcome` for connection `idx` through its front-end. A free function over the
/// server's fields, so a task borrowed (mutably) from the queue can be encoded into a
/// connection's buffer.
pub(super) fn deliver_to(
    conns: &mut Slab<Conn>,
    flush: &mut Vec<usize>,
    idx: usize,
    reply: ReplyTo,
    outcome: &Outcome<'_>,
) {
    mark_flush(conns, flush, idx);
    frontend::encode(&mut conns[idx].out.out, reply, outcome);
}

fn task(r: Result<TaskRef<'_>, QueueError>) -> Outcome<'_> {
    r.map_or_else(|e| Outcome::Error(e.into()), Outcome::Task)
}

fn done(r: Result<Task, QueueError>) -> Outcome<'static> {
    r.map_or_else(|e| Outcome::Error(e.into()), Outcome::Done)
}

fn count(r: Result<u64, QueueError>) -> Outcome<'static> {
    r.map_or_else(|e| Outcome::Error(e.into()), Outcome::Count)
}

fn ok(r: Result<usize, QueueError>) -> Outcome<'static> {
    r.map_or_else(|e| Outcome::Error(e.into()), |_| Outcome::Ok)
}
