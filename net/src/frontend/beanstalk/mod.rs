//! The beanstalk front-end: beanstalkd 1.12's text protocol (codec `tarq-beanstalk`) on a
//! second port, over the same engine, tubes, parked takes and journal as IPROTO. A beanstalk
//! tube is a tarq tube (`use` and `watch` create a missing one as `fifottl`), a job id is a
//! task id, and a reservation belongs to the connection's session, so it goes back to ready
//! when the connection closes.
//!
//! Commands about tasks and tubes (put, reserve, delete, release, bury, touch, kick, kick-job,
//! reserve-job, the peeks, stats-job, stats-tube, pause-tube) are returned to the loop as the
//! core's commands ([`Then::Run`], through [`Beanstalk::next`]) like the IPROTO calls, so the
//! journal's refusals, durability holds, parked-take wake-ups — and on a sharded cluster, the routing to a partition's owner — are
//! the same; the rest (use / watch / ignore, lists, stats, quit) read the connection's own
//! state or the node's and are answered here. As in beanstalkd, a connection runs its commands
//! one after another: while an answer is still to come (a reserve that waits, a command sent
//! on to another node, a tube being placed), the commands behind it wait in the read buffer
//! ([`BsConn::held`]); [`deliver`] ends the hold.
//!
//! Bodies: the engine keeps a task's data as MessagePack, so a job body is stored as one
//! MessagePack string (bin if it is not UTF-8) and a task put through IPROTO is reserved with
//! its string's bytes as the body (its raw MessagePack if it is anything else). A job put on
//! one protocol can be taken on the other.

mod grants;
mod state;
mod stats;

pub use state::BeanstalkState;

use tarq_beanstalk::{Command as Bs, Decoded, Decoder, ProtocolError, Reply as Out};
use tarq_engine::{
    id_tube, Micros, QueueError, ReleaseOptions, Status, TaskId, TubeIx, TubeOptions, TubePut,
    TubeType, DEFAULT_TUBE,
};

use crate::core::{Command, Outcome, Pause, Refusal};

use super::{Loop, ReplyTo, Then};

/// One second, in the engine's microseconds.
const SECOND: Micros = 1_000_000;

/// beanstalkd's safety margin: a reserve is answered `DEADLINE_SOON` when a job the connection
/// holds has less than this left of its TTR (and no job is ready for it).
pub const DEADLINE_MARGIN: Micros = SECOND;

/// A beanstalk connection's own state (the rest — socket, buffers, session — is its `Conn`'s).
#[derive(Debug)]
pub struct BsConn {
    pub decoder: Decoder,
    /// The tube `put` goes to.
    pub used: TubeIx,
    /// The tubes `reserve` takes from, in beanstalkd's order (`ignore` swaps the last one into
    /// the hole, as its set does).
    pub watched: Vec<TubeIx>,
    /// A reserve is parked: the commands behind it wait. `until` is its own deadline
    /// (`Micros::MAX`: none); the parked entries may wake earlier for `DEADLINE_SOON`.
    pub waiting: Option<Micros>,
    /// Has put a job / reserved one (beanstalkd's producer and worker counts).
    pub producer: bool,
    pub worker: bool,
    /// Answers the core still owes this connection (one a command; 0 or 1, as commands run
    /// one at a time): an answer that comes when none is owed is a stale one (a reserve the
    /// front-end ended itself), dropped.
    pub owed: u32,
    /// The command's answer did not come while it was dispatched: the commands behind it wait
    /// until [`deliver`] brings it.
    pub outstanding: bool,
    /// A tube placed for this connection's `use` or `watch` (`r`): taken in, and answered,
    /// when its input runs again.
    pub made: Option<(Reply, TubeIx)>,
    /// A `stats-tube` in flight: the figures this node keeps of the tube, for its answer.
    pub asked: Option<Box<stats::TubeAsk>>,
}

impl BsConn {
    pub fn new(max_job_size: u32) -> Self {
        BsConn {
            decoder: Decoder::new(max_job_size),
            used: DEFAULT_TUBE,
            watched: vec![DEFAULT_TUBE],
            waiting: None,
            producer: false,
            worker: false,
            owed: 0,
            outstanding: false,
            made: None,
            asked: None,
        }
    }

    /// Whether the commands behind the one that ran wait: its answer is still to come.
    pub fn held(&self) -> bool {
        self.waiting.is_some() || self.outstanding || self.made.is_some()
    }
}

/// Delivers `outcome`, the core's answer to `r`, to beanstalk connection `bs`, writing its
/// reply to `out`. Returns whether the connection was held for it (the commands behind it
/// run next). An answer none is owed any more is dropped.
pub fn deliver(out: &mut Vec<u8>, bs: &mut BsConn, r: Reply, outcome: &Outcome<'_>) -> bool {
    if bs.owed == 0 {
        tracing::debug!(?r, "a beanstalk answer no longer awaited, dropped");
        return false;
    }
    bs.owed -= 1;
    match (r, outcome) {
        // Answered when the connection's input runs again, where its tube counts are kept.
        (Reply::Use | Reply::Watch, Outcome::Tube(t)) => bs.made = Some((r, t.ix)),
        (Reply::StatsTube, _) => stats::tube_answer(out, bs.asked.take(), outcome),
        _ => encode(out, r, outcome),
    }
    let held = std::mem::take(&mut bs.outstanding);
    if held {
        bs.waiting = None;
    }
    held || bs.made.is_some()
}

/// Which command a dispatched outcome answers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reply {
    Put,
    Reserve,
    Delete,
    Release,
    Bury,
    Touch,
    Kick,
    KickJob,
    Pause,
    Peek,
    StatsJob,
    StatsTube,
    /// A tube placed for `use` / `watch`.
    Use,
    Watch,
}

/// Encodes `outcome` as the reply to `r`.
pub fn encode(out: &mut Vec<u8>, r: Reply, outcome: &Outcome<'_>) {
    let reply = match (r, outcome) {
        (Reply::Put, Outcome::Task(t)) => Out::Inserted { id: t.id },
        (Reply::Reserve, Outcome::Task(t)) => Out::Reserved {
            id: t.id,
            body: body_of(t.data),
        },
        (Reply::Reserve, Outcome::Nothing) => Out::TimedOut,
        (Reply::Delete, Outcome::Done(_)) => Out::Deleted,
        // A release of a task taken `max_deliveries` times buries it.
        (Reply::Release, Outcome::Task(t)) if t.status == Status::Buried => Out::Buried,
        (Reply::Release, Outcome::Task(_)) => Out::Released,
        (Reply::Bury, Outcome::Task(_)) => Out::Buried,
        (Reply::Touch, Outcome::Task(_)) => Out::Touched,
        (Reply::Kick, Outcome::Count(n)) => Out::KickedCount {
            count: (*n).min(u32::MAX as u64) as u32,
        },
        (Reply::KickJob, Outcome::Task(_)) => Out::Kicked,
        (Reply::Pause, Outcome::Ok) => Out::Paused,
        (Reply::Peek, Outcome::Task(t)) => Out::Found {
            id: t.id,
            body: body_of(t.data),
        },
        (Reply::Peek, Outcome::Nothing) => Out::NotFound,
        (Reply::StatsJob, Outcome::TaskFigures(f)) => return stats::job_answer(out, f),
        // The journal cannot take changes (a full or failing disk): beanstalkd answers a put
        // its binlog has no room for this way. The server's log names the cause.
        (_, Outcome::Error(Refusal::Journal(_))) => Out::OutOfMemory,
        // beanstalkd has no read-only answer: a line of its own, naming the primary, which
        // clients report as an unexpected reply.
        (_, Outcome::Error(Refusal::ReadOnly(primary))) => {
            out.extend_from_slice(format!("READ_ONLY {primary}\r\n").as_bytes());
            return;
        }
        // No primary to name (an election, etcd unreachable): the same line without one.
        (_, Outcome::Error(Refusal::NoPrimary(_))) => {
            out.extend_from_slice(b"READ_ONLY\r\n");
            return;
        }
        // A tube `use` or `watch` could not have: beanstalkd's answer when it cannot make one.
        (Reply::Use | Reply::Watch, Outcome::Error(e)) => {
            tracing::warn!(error = %e, "beanstalk: cannot create the tube");
            Out::OutOfMemory
        }
        // A full limfifottl tube has no room for the put.
        (_, Outcome::Full) => Out::OutOfMemory,
        // A tube that has given out every number (2^41 puts) has no id for another job, a
        // queue at its task limit no room for one: beanstalkd's answer when it has no room.
        (
            _,
            Outcome::Error(Refusal::Queue(
                QueueError::TubeNumbersSpent { .. } | QueueError::TooManyTasks { .. },
            )),
        ) => Out::OutOfMemory,
        (_, Outcome::Error(Refusal::Queue(_))) => Out::NotFound,
        (_, _) => Out::InternalError,
    };
    reply.encode(out);
}

/// A job body as stored: one MessagePack string or bin, UTF-8 bodies as strings (what
/// Tarantool clients decode as text).
pub fn wrap_body(out: &mut Vec<u8>, body: &[u8]) {
    out.clear();
    match std::str::from_utf8(body) {
        Ok(s) => tarq_iproto::mp::write::str(out, s),
        Err(_) => tarq_iproto::mp::write::bin(out, body),
    }
}

/// The body a stored task is reserved with: the bytes of its string or bin, or its raw
/// MessagePack when it is another value (a task put through IPROTO as a map, say).
pub fn body_of(data: &[u8]) -> &[u8] {
    let mut value = tarq_iproto::mp::Reader::new(data);
    match value.read_str_or_bin() {
        Ok(body) if value.is_empty() => body,
        _ => data,
    }
}

/// Seconds as the engine's microseconds.
fn secs(s: u32) -> Micros {
    s as Micros * SECOND
}

/// Room a command may borrow past the front-end's call, lent by the loop while a
/// connection's input runs: a put's wrapped body and a reserve's watched tubes. Reused.
#[derive(Debug, Default)]
pub struct Room {
    body: Vec<u8>,
    tubes: Vec<TubeIx>,
}

/// One step through a connection's input: what the loop does next, the input bytes it used
/// (0 for a tube placed for an earlier `use` or `watch`), and whether it was a command
/// (counted and timed as a request).
#[derive(Debug)]
pub struct Step<'f> {
    pub then: Then<'f>,
    pub used: usize,
    pub command: bool,
}

/// The beanstalk front-end at work for the loop `L`: it translates a connection's commands
/// into the core's and answers what needs no core call.
pub struct Beanstalk<'a, L: Loop> {
    l: &'a mut L,
}

impl<'a, L: Loop> Beanstalk<'a, L> {
    pub fn new(l: &'a mut L) -> Self {
        Beanstalk { l }
    }
}

impl<L: Loop> Beanstalk<'_, L> {
    /// The next step of connection `idx`'s input `data`: its next command, translated (the
    /// core's command it becomes is returned for the loop to run, in `room` if it must
    /// borrow), or the end of a tube's placement for an earlier command. `None` while the
    /// answer to a command is still to come (the commands behind it wait), or when `data`
    /// holds no whole command.
    pub fn next<'f>(&mut self, idx: usize, data: &'f [u8], room: &'f mut Room) -> Option<Step<'f>> {
        let bs = self.l.beanstalk_parts(idx).1?;
        if let Some((r, t)) = bs.made.take() {
            return Some(Step {
                then: self.took_tube(idx, r, t),
                used: 0,
                command: false,
            });
        }
        if bs.held() {
            return None;
        }
        let (step, used) = bs.decoder.decode(data)?;
        let (then, command) = match step {
            Decoded::Command(cmd) => (self.execute_beanstalk(idx, cmd, room), true),
            Decoded::Error(e) => {
                self.protocol_error(idx, e);
                (Then::Done, false)
            }
            Decoded::Discarded => (Then::Done, false),
        };
        Some(Step {
            then,
            used,
            command,
        })
    }

    /// The loop ran the step [`next`](Self::next) (or a reserve's wake-up) returned: an answer
    /// the core did not give at once holds the commands behind it; a reserve answered at once
    /// waits no more.
    pub fn ran(&mut self, idx: usize) {
        if let Some(bs) = self.l.beanstalk_parts(idx).1 {
            bs.outstanding = bs.owed > 0;
            if !bs.outstanding {
                bs.waiting = None;
            }
        }
    }

    fn protocol_error(&mut self, idx: usize, e: ProtocolError) {
        self.state().errors += 1;
        // beanstalkd counts a put once its line is read, so a body refused is in `cmd-put`.
        if matches!(
            e,
            ProtocolError::JobTooBig { .. } | ProtocolError::ExpectedCrlf { .. }
        ) {
            self.state().count(tarq_beanstalk::CommandKind::Put);
        }
        tracing::debug!(sid = self.l.sid(idx), error = %e, "beanstalk request refused");
        e.reply().encode(self.l.reply_buf(idx));
    }

    /// Writes a reply that needs no engine call.
    fn bs_answer(&mut self, idx: usize, reply: Out<'_>) -> Then<'static> {
        reply.encode(self.l.reply_buf(idx));
        Then::Done
    }

    fn bs(&mut self, idx: usize) -> &mut BsConn {
        (self.l.beanstalk_parts(idx).1).expect("a beanstalk connection")
    }

    /// The front-end's server-wide state.
    fn state(&mut self) -> &mut BeanstalkState {
        self.l.beanstalk_parts(usize::MAX).0
    }

    /// The translation table: one beanstalk command, answered here or returned as the core's.
    fn execute_beanstalk<'f>(&mut self, idx: usize, cmd: Bs<'f>, room: &'f mut Room) -> Then<'f> {
        self.state().count(cmd.kind());
        if !self.permitted(idx, &cmd) {
            return Then::Done;
        }
        match cmd {
            Bs::Put {
                pri,
                delay,
                ttr,
                body,
            } => self.bs_put(idx, (pri, delay, ttr), body, room),
            Bs::Use { tube } => self.bs_use(idx, tube),
            Bs::Reserve => self.bs_reserve(idx, None, room),
            Bs::ReserveWithTimeout { seconds } => {
                // Negative waits forever, as beanstalkd reads it.
                let timeout = u32::try_from(seconds).ok().map(secs);
                self.bs_reserve(idx, timeout, room)
            }
            Bs::ReserveJob { id } => {
                // beanstalkd counts the connection a worker for a reserve-job too.
                self.bs(idx).worker = true;
                self.bs_dispatch(idx, Reply::Reserve, Command::TakeTask { id })
            }
            Bs::Delete { id } => self.bs_delete(idx, id),
            Bs::Release { id, pri, delay } => self.bs_release(idx, id, pri, delay),
            Bs::Bury { id, pri } => {
                let pri = pri as i64;
                self.bs_dispatch(idx, Reply::Bury, Command::BuryTaken { id, pri })
            }
            Bs::Touch { id } => self.bs_dispatch(idx, Reply::Touch, Command::TouchTtr { id }),
            Bs::Watch { tube } => self.bs_watch(idx, tube),
            Bs::Ignore { tube } => self.bs_ignore(idx, tube),
            Bs::Peek { id } => match self.tube_of(id).or(id_tube(id)) {
                Some(tube) => self.bs_dispatch(idx, Reply::Peek, Command::Peek { tube, id }),
                None => self.bs_answer(idx, Out::NotFound),
            },
            Bs::PeekReady => self.bs_peek_first(idx, Status::Ready),
            Bs::PeekDelayed => self.bs_peek_first(idx, Status::Waiting),
            Bs::PeekBuried => self.bs_peek_first(idx, Status::Buried),
            Bs::Kick { bound } => {
                let tube = self.bs(idx).used;
                let count = bound as u64;
                self.bs_dispatch(idx, Reply::Kick, Command::KickAny { tube, count })
            }
            Bs::KickJob { id } => self.bs_dispatch(idx, Reply::KickJob, Command::KickTask { id }),
            Bs::StatsJob { id } => {
                self.bs_dispatch(idx, Reply::StatsJob, Command::TaskFigures { id })
            }
            Bs::StatsTube { tube } => {
                self.l.collect_tubes();
                self.bs_stats_tube(idx, tube)
            }
            Bs::Stats => {
                self.l.collect_tubes();
                self.bs_stats(idx);
                Then::Done
            }
            Bs::ListTubes => self.bs_list_tubes(idx),
            Bs::ListTubeUsed => {
                let used = self.bs(idx).used;
                let name = self.tube_name(used);
                self.bs_answer(idx, Out::Using { tube: &name })
            }
            Bs::ListTubesWatched => self.bs_list_watched(idx),
            Bs::PauseTube { tube, delay } => self.bs_pause(idx, tube, delay),
            Bs::Quit => Then::Close("quit"),
        }
    }

    /// `release`: back to ready, or delayed, with a new priority.
    fn bs_release(&mut self, idx: usize, id: u64, pri: u32, delay: u32) -> Then<'static> {
        let Some(tube) = self.tube_of(id).or(id_tube(id)) else {
            return self.bs_answer(idx, Out::NotFound);
        };
        let opts = ReleaseOptions {
            delay: secs(delay),
            pri: Some(pri as i64),
            ttl: None,
        };
        let on = crate::core::On::Tube(tube);
        self.bs_dispatch(idx, Reply::Release, Command::Release { on, id, opts })
    }

    /// `list-tubes`: the tubes the connection may touch in some way (all, unless it acts as a
    /// user with grants).
    fn bs_list_tubes(&mut self, idx: usize) -> Then<'static> {
        self.l.collect_tubes();
        let who = self.l.who(idx).clone();
        self.l.reply_with_queue(idx, &mut |out, q| {
            let users = q.users();
            let names = q
                .named_tubes()
                .map(|t| t.name)
                .filter(|n| who.allows(users, crate::core::access::Need::AnyOn(n)));
            tarq_beanstalk::ok_yaml(out, |o| tarq_beanstalk::write_list(o, names))
        });
        Then::Done
    }

    /// `use`: the tube this connection's puts go to, made when missing.
    fn bs_use<'f>(&mut self, idx: usize, tube: &'f str) -> Then<'f> {
        match self.bs_tube(idx, tube, Reply::Use) {
            Ok(t) => self.use_tube(idx, t, tube),
            Err(then) => then,
        }
    }

    fn use_tube(&mut self, idx: usize, t: TubeIx, name: &str) -> Then<'static> {
        let bs = self.bs(idx);
        let old = std::mem::replace(&mut bs.used, t);
        self.state().tube_mut(t).using += 1;
        self.state().stop_using(old);
        self.bs_answer(idx, Out::Using { tube: name })
    }

    /// A tube placed for this connection's `use` or `watch` (`r`) is here: the command ends
    /// as it would have had the tube been found.
    fn took_tube(&mut self, idx: usize, r: Reply, t: TubeIx) -> Then<'static> {
        let name = self.tube_name(t);
        match r {
            Reply::Watch => self.watch_tube(idx, t),
            _ => self.use_tube(idx, t, &name),
        }
    }

    /// `watch`: a tube this connection's reserves take from, made when missing.
    fn bs_watch<'f>(&mut self, idx: usize, tube: &'f str) -> Then<'f> {
        match self.bs_tube(idx, tube, Reply::Watch) {
            Ok(t) => self.watch_tube(idx, t),
            Err(then) => then,
        }
    }

    fn watch_tube(&mut self, idx: usize, t: TubeIx) -> Then<'static> {
        let bs = self.bs(idx);
        let added = !bs.watched.contains(&t);
        if added {
            bs.watched.push(t);
        }
        let count = bs.watched.len() as u64;
        if added {
            self.state().tube_mut(t).watching += 1;
        }
        self.bs_answer(idx, Out::Watching { count })
    }

    /// `list-tubes-watched`.
    fn bs_list_watched(&mut self, idx: usize) -> Then<'static> {
        let watched = self.bs(idx).watched.clone();
        let names: Vec<String> = watched.iter().map(|&t| self.tube_name(t)).collect();
        tarq_beanstalk::ok_yaml(self.l.reply_buf(idx), |o| {
            tarq_beanstalk::write_list(o, names.iter().map(String::as_str))
        });
        Then::Done
    }

    /// `pause-tube`: the core holds the tube's tasks from every take for `delay` seconds.
    fn bs_pause(&mut self, idx: usize, tube: &str, delay: u32) -> Then<'static> {
        // A tube forgotten once empty and unused is not found, as in beanstalkd.
        self.l.collect_tubes();
        let Some(t) = self.l.queue().tube_ix(tube) else {
            return self.bs_answer(idx, Out::NotFound);
        };
        // A delay of 0 ends a pause at once: beanstalkd raises 0 to 1 ns (so its waiters wake),
        // not to a second.
        let until = self.l.mono().saturating_add(secs(delay));
        self.state().tube_mut(t).cmd_pause_tube += 1;
        let pause = Pause {
            until,
            seconds: delay,
        };
        self.bs_dispatch(idx, Reply::Pause, Command::Pause { tube: t, pause })
    }

    /// Returns `cmd` for the loop to run, answered as `reply`, its answer owed. An answer that
    /// does not come at once (a reserve that waits, a command another node answers) holds the
    /// commands behind it until it does ([`ran`](Self::ran)).
    fn bs_dispatch<'f>(&mut self, idx: usize, reply: Reply, cmd: Command<'f>) -> Then<'f> {
        self.bs(idx).owed = 1;
        Then::Run(ReplyTo::Beanstalk(reply), cmd)
    }

    /// `put` into the used tube, with `(pri, delay, ttr)`; the body is wrapped in `room`.
    fn bs_put<'f>(
        &mut self,
        idx: usize,
        (pri, delay, ttr): (u32, u32, u32),
        body: &[u8],
        room: &'f mut Room,
    ) -> Then<'f> {
        let bs = self.bs(idx);
        bs.producer = true;
        let tube = bs.used;
        let opts = TubePut {
            delay: secs(delay),
            // beanstalkd raises a TTR of 0 to one second.
            ttr: Some(secs(ttr.max(1))),
            pri: Some(pri as i64),
            ..Default::default()
        };
        wrap_body(&mut room.body, body);
        let cmd = Command::PutIn {
            tube,
            data: &room.body,
            opts,
            wait: 0,
        };
        self.bs_dispatch(idx, Reply::Put, cmd)
    }

    /// `reserve`: `DEADLINE_SOON` when a job this connection holds is about to time out and
    /// none is ready for it; else a take from its watched tubes, parked while none is ready.
    /// The take is returned with the connection `waiting` until `timeout`: once it has run,
    /// [`ran`](Self::ran) ends the wait if it was answered at once.
    fn bs_reserve<'f>(
        &mut self,
        idx: usize,
        timeout: Option<Micros>,
        room: &'f mut Room,
    ) -> Then<'f> {
        // A reserve's wait is an in-process timeout: on the monotonic clock.
        let now = self.l.mono();
        let sid = self.l.sid(idx);
        // The watched tubes, copied into the room the command borrows.
        let tubes = &mut room.tubes;
        let bs = self.bs(idx);
        bs.worker = true;
        tubes.clear();
        tubes.extend_from_slice(&bs.watched);
        self.takeable(idx, tubes);
        if tubes.is_empty() {
            // Watching only tubes it may not take from: as if none of them were there.
            self.refuse(idx);
            return Then::Done;
        }
        if self.deadline_soon(sid) && !self.ready_in_any(tubes) {
            return self.bs_answer(idx, Out::DeadlineSoon);
        }
        let until = timeout.map_or(Micros::MAX, |t| now.saturating_add(t));
        self.bs(idx).waiting = Some(until);
        let wake = self.reserve_wake(sid, until);
        let cmd = Command::TakeAny {
            tubes: &room.tubes,
            timeout,
            wake,
        };
        self.bs_dispatch(idx, Reply::Reserve, cmd)
    }

    /// When a waiting reserve must look again (monotonic): its deadline `until`, or earlier,
    /// when the soonest TTR of the jobs its connection holds (a task deadline, on the wall
    /// clock) enters the safety margin.
    fn reserve_wake(&self, sid: u64, until: Micros) -> Micros {
        let soon = self.l.queue().soonest_ttr(sid).map_or(Micros::MAX, |d| {
            let left = d
                .saturating_sub(DEADLINE_MARGIN)
                .saturating_sub(self.l.now());
            self.l.mono().saturating_add(left)
        });
        until.min(soon)
    }

    /// A waiting reserve's parked entries woke (at its deadline, or for `DEADLINE_SOON`); the
    /// loop has dropped them. Answered here, or the take to wait on is returned.
    pub fn reserve_woke<'f>(&mut self, idx: usize, room: &'f mut Room) -> Then<'f> {
        let now = self.l.mono();
        let sid = self.l.sid(idx);
        let Some(until) = self.end_wait(idx) else {
            return Then::Done;
        };
        if self.deadline_soon(sid) {
            self.bs_answer(idx, Out::DeadlineSoon)
        } else if until <= now {
            self.bs_answer(idx, Out::TimedOut)
        } else {
            // Woken for a job that is no longer held (released or acked elsewhere): wait on.
            let left = (until != Micros::MAX).then(|| until - now);
            self.bs_reserve(idx, left, room)
        }
    }

    /// The client shut its side while its reserve waited (the loop has dropped its parked
    /// entries): `TIMED_OUT`, as beanstalkd answers.
    pub fn half_closed(&mut self, idx: usize) {
        self.end_wait(idx);
        let _answered = self.bs_answer(idx, Out::TimedOut);
    }

    /// Ends connection `idx`'s wait (its parked entries, here and on other nodes, are the
    /// loop's to drop): its answer is no longer owed, and the deadline it had is returned
    /// (`None` when it was not waiting).
    fn end_wait(&mut self, idx: usize) -> Option<Micros> {
        let bs = self.l.beanstalk_parts(idx).1?;
        bs.owed = 0;
        bs.outstanding = false;
        bs.waiting.take()
    }

    /// Whether a job session `sid` holds is inside its TTR's last second (`DEADLINE_SOON`).
    fn deadline_soon(&self, sid: u64) -> bool {
        let now = self.l.now();
        self.l
            .queue()
            .soonest_ttr(sid)
            .is_some_and(|d| d <= now.saturating_add(DEADLINE_MARGIN))
    }

    /// A parked reserve was answered (served, or timed out; the loop drops its other entries
    /// and runs the commands that waited behind it).
    pub fn reserve_answered(&mut self, idx: usize) {
        self.end_wait(idx);
    }

    /// Whether any of `tubes` (not paused) has a task a take would get now.
    fn ready_in_any(&self, tubes: &[TubeIx]) -> bool {
        let now = self.l.mono();
        tubes
            .iter()
            .any(|&t| !self.l.pauses().paused(t, now) && self.l.queue().can_take(t))
    }

    fn bs_delete(&mut self, idx: usize, id: TaskId) -> Then<'static> {
        let sid = self.l.sid(idx);
        // A job reserved by another connection is not this one's to delete (the core checks
        // too: the job may be held on another node).
        match self.l.served(id).map(|t| (t.tube, t.owner)) {
            Some((_, Some(o))) if o != sid => return self.bs_answer(idx, Out::NotFound),
            Some((tube, _)) => self.state().tube_mut(tube).cmd_delete += 1,
            None => {}
        }
        self.bs_dispatch(idx, Reply::Delete, Command::DeleteJob { id })
    }

    fn bs_ignore(&mut self, idx: usize, name: &str) -> Then<'static> {
        let t = self.l.queue().tube_ix(name);
        let bs = self.bs(idx);
        let pos = t.and_then(|t| bs.watched.iter().position(|&w| w == t));
        match pos {
            Some(_) if bs.watched.len() == 1 => self.bs_answer(idx, Out::NotIgnored),
            Some(p) => {
                let t = bs.watched.swap_remove(p);
                let count = bs.watched.len() as u64;
                self.state().stop_watching(t);
                self.bs_answer(idx, Out::Watching { count })
            }
            None => {
                let count = bs.watched.len() as u64;
                self.bs_answer(idx, Out::Watching { count })
            }
        }
    }

    fn bs_peek_first(&mut self, idx: usize, status: Status) -> Then<'static> {
        let tube = self.bs(idx).used;
        self.bs_dispatch(idx, Reply::Peek, Command::PeekFirst { tube, status })
    }

    /// The tube named `name`, created (`fifottl`, default options) when missing, as beanstalkd
    /// creates a tube on `use` or `watch` (`r`). `Err` when it is answered already: it cannot
    /// be created (a replica: `READ_ONLY`, as its puts; the journal refuses changes, or the
    /// tube limit is reached: logged, and `OUT_OF_MEMORY`), or a node that makes no tube on
    /// its own returns the core's command to place it (the connection waits;
    /// [`took_tube`](Self::took_tube) ends the command). `Err` carries what the loop does.
    // `Err` is no failure but what the loop does instead: built once a command, never moved
    // far.
    #[allow(clippy::result_large_err)]
    fn bs_tube<'f>(&mut self, idx: usize, name: &'f str, r: Reply) -> Result<TubeIx, Then<'f>> {
        if let Some(t) = self.l.queue().tube_ix(name) {
            return Ok(t);
        }
        if !self.l.makes_tubes_on_demand() {
            let cmd = Command::CreateTube {
                name,
                kind: TubeType::FifoTtl,
                opts: TubeOptions::default(),
                if_not_exists: true,
                partitions: 1,
            };
            return Err(self.bs_dispatch(idx, r, cmd));
        }
        match self.l.create_tube_for(idx, name) {
            Ok(t) => Ok(t),
            // On a replica the tube would be a change: refused as a put is there (`READ_ONLY`
            // naming the primary), not taken for a lack of memory.
            Err(e @ (Refusal::ReadOnly(_) | Refusal::NoPrimary(_))) => {
                encode(self.l.reply_buf(idx), r, &Outcome::Error(e));
                Err(Then::Done)
            }
            Err(e) => {
                tracing::warn!(tube = name, error = %e, "beanstalk: cannot create the tube");
                Err(self.bs_answer(idx, Out::OutOfMemory))
            }
        }
    }

    /// The tube of task `id`, if it is live.
    fn tube_of(&self, id: TaskId) -> Option<TubeIx> {
        self.l.queue().get(id).map(|t| t.tube)
    }

    fn tube_name(&self, t: TubeIx) -> String {
        self.l
            .queue()
            .tube_info(t)
            .map_or_else(String::new, |i| i.name.to_owned())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_body_is_stored_as_one_messagepack_string_or_bin_and_read_back_whole() {
        let mut buf = Vec::new();
        for body in [
            &b""[..],
            b"hello",
            &[b'x'; 31],
            &[b'y'; 32],
            &[b'z'; 300],
            &[b'w'; 70_000],
            b"\xff\xfe",
            &[0x80; 300],
        ] {
            wrap_body(&mut buf, body);
            let v = rmpv::decode::read_value(&mut &buf[..]).unwrap();
            match std::str::from_utf8(body) {
                Ok(s) => assert_eq!(v.as_str(), Some(s)),
                Err(_) => assert_eq!(v, rmpv::Value::Binary(body.to_vec())),
            }
            assert_eq!(body_of(&buf), body);
        }
    }

    #[test]
    fn a_task_that_is_not_one_string_is_reserved_as_its_raw_messagepack() {
        for raw in [
            &[0x93, 0x01, 0x02, 0x03][..], // an array
            &[0x81, 0xa1, b'k', 0x01],     // a map
            &[0x2a],                       // an integer
            &[0xa3, b'a', b'b'],           // a string cut short
            &[0xa1, b'a', b'b'],           // a string with bytes after it
            &[0xd9],                       // a str8 with no length
            &[],
        ] {
            assert_eq!(body_of(raw), raw);
        }
    }
}
