//! Model-based property test: random sequences of every engine call — the seed API on
//! `default` (put with delay / ttl / ttr / pri, take, ack, release, session close, release of
//! all taken), the tube API (create, drop, truncate, put with utube and dedup keys, take, ack,
//! release with options, touch, peek, bury, kick, delete, release_all), the beanstalkd
//! front-end's calls (peek_first, kick_delayed, kick_task, touch_ttr, bury_taken) on tubes of
//! every type with capacity, max_deliveries and dedup windows, recovery calls, restarts from a snapshot
//! and time moving (with and without `advance` and its budget) — run against both the engine
//! and a plainly correct model built on `BTreeMap`s and scans. Every observable result is
//! compared: returned tasks, errors, per-tube stats (and `ready_urgent`), events, next
//! deadline, every task's TTR deadline, each session's soonest one, and the full task set;
//! `check_invariants()` runs after every step.
//!
//! `PROPTEST_CASES` raises the number of cases (the default keeps a debug run short).

use std::collections::{BTreeMap, VecDeque};

use proptest::prelude::*;
use tarq_engine::{
    Event, Hold, Micros, PutOptions, PutOutcome, Queue, QueueError, ReleaseOptions, RestoredTask,
    SessionId, Stats, Status, Task, TaskId, TubeIx, TubeOptions, TubePut, TubeType, URGENT_PRI,
};

const T0: Micros = 1_700_000_000_000_000;
/// Sessions are few so that ownership errors and session closes hit real tasks.
const SESSIONS: u64 = 4;
/// Cases by default: about a few seconds in a debug build.
const DEFAULT_CASES: u32 = 256;
/// A tube index no tube has.
const NO_TUBE: TubeIx = 77;

/// The tubes a test may create: every type, with the options that change behaviour.
fn palette(which: usize) -> (&'static str, TubeType, TubeOptions) {
    let o = TubeOptions::default();
    match which % 6 {
        0 => ("f", TubeType::Fifo, o),
        1 => (
            "ft",
            TubeType::FifoTtl,
            TubeOptions {
                ttl: Some(100),
                pri: 1,
                ..o
            },
        ),
        2 => (
            "lim",
            TubeType::LimFifoTtl,
            TubeOptions {
                capacity: 3,
                ttr: Some(15),
                ..o
            },
        ),
        3 => (
            "u",
            TubeType::Utube,
            TubeOptions {
                max_deliveries: 2,
                ..o
            },
        ),
        4 => (
            "ut",
            TubeType::UtubeTtl,
            TubeOptions {
                ttr: Some(20),
                dedup_window: 50,
                ..o
            },
        ),
        _ => (
            "fd",
            TubeType::FifoTtl,
            TubeOptions {
                dedup_window: 30,
                max_deliveries: 1,
                ..o
            },
        ),
    }
}

#[derive(Clone, Debug)]
enum Op {
    Put {
        delay: Option<u64>,
        ttl: Option<u64>,
        ttr: Option<u64>,
        pri: i64,
        len: usize,
    },
    Take {
        sid: SessionId,
    },
    Ack {
        sid: SessionId,
        which: usize,
    },
    Release {
        sid: SessionId,
        which: usize,
        delay: u64,
    },
    ReleaseSession {
        sid: SessionId,
    },
    ReleaseAll,
    Tick {
        dt: u64,
    },
    Advance {
        dt: u64,
        budget: usize,
    },
    RestoreStatus {
        which: usize,
        status: Status,
        dt: u64,
    },
    RestoreRemove {
        which: usize,
    },
    Restart,
    CreateTube {
        which: usize,
    },
    DropTube {
        tube: usize,
    },
    Truncate {
        tube: usize,
    },
    PutIn {
        tube: usize,
        delay: Option<u64>,
        ttl: Option<u64>,
        ttr: Option<u64>,
        pri: Option<i64>,
        utube: u8,
        dedup: Option<u8>,
    },
    TakeFrom {
        tube: usize,
        sid: SessionId,
    },
    AckIn {
        tube: usize,
        sid: SessionId,
        which: usize,
    },
    ReleaseIn {
        tube: usize,
        sid: SessionId,
        which: usize,
        delay: u64,
        pri: Option<i64>,
        ttl: Option<u64>,
    },
    Touch {
        tube: usize,
        sid: SessionId,
        which: usize,
        delta: Option<u64>,
    },
    Peek {
        tube: usize,
        which: usize,
    },
    Bury {
        tube: usize,
        which: usize,
    },
    Kick {
        tube: usize,
        count: u64,
    },
    Delete {
        tube: usize,
        which: usize,
    },
    ReleaseAllIn {
        tube: usize,
    },
    PeekFirst {
        tube: usize,
        status: Status,
    },
    KickDelayed {
        tube: usize,
        count: u64,
    },
    KickTask {
        which: usize,
    },
    TakeTask {
        sid: SessionId,
        which: usize,
    },
    TouchTtr {
        sid: SessionId,
        which: usize,
    },
    BuryTaken {
        sid: SessionId,
        which: usize,
        pri: i64,
    },
}

/// Pris around the tube defaults and around `URGENT_PRI`, so `ready_urgent` sees both sides.
fn pri() -> impl Strategy<Value = i64> {
    prop_oneof![3 => -2i64..3, 1 => (URGENT_PRI - 2)..(URGENT_PRI + 2)]
}

fn status() -> impl Strategy<Value = Status> {
    prop_oneof![
        Just(Status::Ready),
        Just(Status::Taken),
        Just(Status::Waiting),
        Just(Status::Buried)
    ]
}

fn seed_op() -> impl Strategy<Value = Op> {
    let small = || prop_oneof![Just(None), (0u64..60).prop_map(Some)];
    let sid = || 1..=SESSIONS;
    prop_oneof![
        6 => (small(), small(), small(), pri(), 0usize..4)
            .prop_map(|(delay, ttl, ttr, pri, len)| Op::Put { delay, ttl, ttr, pri, len }),
        5 => sid().prop_map(|sid| Op::Take { sid }),
        3 => (sid(), any::<usize>()).prop_map(|(sid, which)| Op::Ack { sid, which }),
        3 => (sid(), any::<usize>(), prop_oneof![Just(0u64), 0u64..40])
            .prop_map(|(sid, which, delay)| Op::Release { sid, which, delay }),
        1 => sid().prop_map(|sid| Op::ReleaseSession { sid }),
        1 => Just(Op::ReleaseAll),
        2 => (0u64..30).prop_map(|dt| Op::Tick { dt }),
        4 => (0u64..30, 0usize..6).prop_map(|(dt, budget)| Op::Advance { dt, budget }),
        1 => (
            any::<usize>(),
            status(),
            0u64..40
        )
            .prop_map(|(which, status, dt)| Op::RestoreStatus { which, status, dt }),
        1 => any::<usize>().prop_map(|which| Op::RestoreRemove { which }),
        1 => Just(Op::Restart),
    ]
}

fn tube_op() -> impl Strategy<Value = Op> {
    let small = || prop_oneof![Just(None), (0u64..60).prop_map(Some)];
    let sid = || 1..=SESSIONS;
    let tube = || 0usize..8;
    let put = (
        tube(),
        small(),
        small(),
        small(),
        prop_oneof![Just(None), pri().prop_map(Some)],
        0u8..3,
        prop_oneof![Just(None), (0u8..3).prop_map(Some)],
    )
        .prop_map(|(tube, delay, ttl, ttr, pri, utube, dedup)| Op::PutIn {
            tube,
            delay,
            ttl,
            ttr,
            pri,
            utube,
            dedup,
        });
    let release = (
        tube(),
        sid(),
        any::<usize>(),
        prop_oneof![Just(0u64), 0u64..40],
        prop_oneof![Just(None), pri().prop_map(Some)],
        prop_oneof![Just(None), (0u64..80).prop_map(Some)],
    )
        .prop_map(|(tube, sid, which, delay, pri, ttl)| Op::ReleaseIn {
            tube,
            sid,
            which,
            delay,
            pri,
            ttl,
        });
    prop_oneof![
        2 => any::<usize>().prop_map(|which| Op::CreateTube { which }),
        1 => tube().prop_map(|tube| Op::DropTube { tube }),
        1 => tube().prop_map(|tube| Op::Truncate { tube }),
        8 => put,
        6 => (tube(), sid()).prop_map(|(tube, sid)| Op::TakeFrom { tube, sid }),
        3 => (tube(), sid(), any::<usize>()).prop_map(|(tube, sid, which)| Op::AckIn { tube, sid, which }),
        3 => release,
        2 => (tube(), sid(), any::<usize>(), prop_oneof![Just(None), (0u64..30).prop_map(Some)])
            .prop_map(|(tube, sid, which, delta)| Op::Touch { tube, sid, which, delta }),
        1 => (tube(), any::<usize>()).prop_map(|(tube, which)| Op::Peek { tube, which }),
        2 => (tube(), any::<usize>()).prop_map(|(tube, which)| Op::Bury { tube, which }),
        2 => (tube(), 0u64..4).prop_map(|(tube, count)| Op::Kick { tube, count }),
        1 => (tube(), any::<usize>()).prop_map(|(tube, which)| Op::Delete { tube, which }),
        1 => tube().prop_map(|tube| Op::ReleaseAllIn { tube }),
        2 => (tube(), status()).prop_map(|(tube, status)| Op::PeekFirst { tube, status }),
        2 => (tube(), 0u64..4).prop_map(|(tube, count)| Op::KickDelayed { tube, count }),
        2 => any::<usize>().prop_map(|which| Op::KickTask { which }),
        2 => (sid(), any::<usize>()).prop_map(|(sid, which)| Op::TakeTask { sid, which }),
        2 => (sid(), any::<usize>()).prop_map(|(sid, which)| Op::TouchTtr { sid, which }),
        2 => (sid(), any::<usize>(), pri()).prop_map(|(sid, which, pri)| Op::BuryTaken { sid, which, pri }),
    ]
}

fn sid_close() -> impl Strategy<Value = Op> {
    prop_oneof![
        (1..=SESSIONS).prop_map(|sid| Op::ReleaseSession { sid }),
        Just(Op::Restart),
    ]
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![1 => seed_op(), 1 => tube_op()]
}

#[derive(Clone, Debug)]
struct MTask {
    id: TaskId,
    /// As the tube API shows it: counted from the tube's first number.
    number: u64,
    tube: TubeIx,
    status: Status,
    runat: Micros,
    pri: i64,
    ttl: Option<Micros>,
    ttr: Option<Micros>,
    created: Micros,
    owner: Option<SessionId>,
    /// When a task taken by `take` goes back to Ready (restored Taken tasks have none).
    ttr_at: Option<Micros>,
    deliveries: u16,
    utube: Option<Vec<u8>>,
    data: Vec<u8>,
}

impl MTask {
    fn task(&self) -> Task {
        Task {
            id: self.id,
            status: self.status,
            runat: self.runat,
            pri: self.pri,
            ttl: self.ttl,
            ttr: self.ttr,
            created: self.created,
            owner: self.owner,
            data: self.data.clone().into(),
            tube: self.tube,
            deliveries: self.deliveries,
        }
    }

    /// Its pending deadlines as (time, number in its tube, id, kind): kind 0 expire, 1
    /// promote, 2 TTR. Equal times fire by number, then id.
    fn deadlines(&self) -> impl Iterator<Item = (Micros, u64, TaskId, u8)> {
        let n = self.id & ((1 << 41) - 1);
        let ttl = self
            .ttl
            .map(|t| (self.created.saturating_add(t), n, self.id, 0));
        let promote = (self.status == Status::Waiting).then_some((self.runat, n, self.id, 1));
        let ttr = self.ttr_at.map(|at| (at, n, self.id, 2));
        ttl.into_iter().chain(promote).chain(ttr)
    }
}

#[derive(Clone, Debug)]
struct MTube {
    name: String,
    kind: TubeType,
    opts: TubeOptions,
    ops: Stats,
    /// Every dedup key recorded since creation or truncate: (key, id, expires).
    dedup: Vec<(Vec<u8>, TaskId, Micros)>,
    /// The number the next put gets: from `first` (1 in `default`), never given twice.
    next: u64,
    /// Where the tube's numbers start: where the last tube dropped at its index stopped.
    first: u64,
}

/// Why a taken task goes back.
#[derive(Clone, Copy, PartialEq)]
enum Why {
    Release,
    Ttr,
    Auto,
}

/// The reference: every question answered by a scan.
#[derive(Debug)]
struct Model {
    tasks: BTreeMap<TaskId, MTask>,
    tubes: BTreeMap<TubeIx, MTube>,
    /// Each session's taken ids, in take order.
    sessions: BTreeMap<SessionId, VecDeque<TaskId>>,
    events: Vec<Event>,
    /// Dedup records of this step: (tube, key, id), for `DedupRecorded`.
    dedup_events: Vec<(TubeIx, Vec<u8>, TaskId)>,
    /// By index: the next number of the last tube dropped there.
    floors: BTreeMap<TubeIx, u64>,
}

impl Model {
    fn new() -> Model {
        let default = MTube {
            name: "default".into(),
            kind: TubeType::FifoTtl,
            opts: TubeOptions::default(),
            ops: Stats::default(),
            dedup: vec![],
            next: 1,
            first: 0,
        };
        Model {
            tasks: BTreeMap::new(),
            tubes: BTreeMap::from([(0, default)]),
            sessions: BTreeMap::new(),
            events: vec![],
            dedup_events: vec![],
            floors: BTreeMap::new(),
        }
    }

    /// The newest id of `default`.
    fn last_id(&self) -> TaskId {
        self.tubes[&0].next - 1
    }

    fn stats(&self, tube: TubeIx) -> Stats {
        let of = |s| {
            self.tasks
                .values()
                .filter(|t| t.tube == tube && t.status == s)
                .count() as u64
        };
        Stats {
            total: self.tasks.values().filter(|t| t.tube == tube).count() as u64,
            ready: of(Status::Ready),
            taken: of(Status::Taken),
            waiting: of(Status::Waiting),
            buried: of(Status::Buried),
            ..self.tubes[&tube].ops
        }
    }

    fn ops(&mut self, tube: TubeIx) -> &mut Stats {
        &mut self.tubes.get_mut(&tube).unwrap().ops
    }

    fn next_deadline(&self) -> Option<(Micros, u64, TaskId, u8)> {
        self.tasks.values().flat_map(MTask::deadlines).min()
    }

    fn leave_session(&mut self, id: TaskId) {
        let t = &self.tasks[&id];
        if t.status == Status::Taken {
            let sid = t.owner.unwrap();
            let list = self.sessions.get_mut(&sid).unwrap();
            list.retain(|&x| x != id);
            if list.is_empty() {
                self.sessions.remove(&sid);
            }
        }
    }

    fn set_status(&mut self, id: TaskId, status: Status, runat: Micros) {
        self.leave_session(id);
        let t = self.tasks.get_mut(&id).unwrap();
        t.status = status;
        t.runat = if status == Status::Waiting { runat } else { 0 };
        t.owner = None;
        t.ttr_at = None;
    }

    fn make_taken(&mut self, id: TaskId, sid: SessionId, ttr_at: Option<Micros>) {
        self.set_status(id, Status::Ready, 0);
        let t = self.tasks.get_mut(&id).unwrap();
        t.status = Status::Taken;
        t.owner = Some(sid);
        t.ttr_at = ttr_at;
        self.sessions.entry(sid).or_default().push_back(id);
    }

    fn remove(&mut self, id: TaskId) -> Task {
        self.leave_session(id);
        self.tasks.remove(&id).unwrap().task()
    }

    fn live(&self, tube: TubeIx) -> Result<&MTube, QueueError> {
        self.tubes.get(&tube).ok_or(QueueError::TubeNotFound(tube))
    }

    fn add(
        &mut self,
        now: Micros,
        tube: TubeIx,
        data: Vec<u8>,
        o: PutOptions,
        utube: Option<Vec<u8>>,
    ) -> Task {
        let mt = self.tubes.get_mut(&tube).unwrap();
        let id = (u64::from(tube) << 41) | mt.next;
        let number = mt.next - mt.first;
        mt.next += 1;
        let t = MTask {
            id,
            number,
            tube,
            status: if o.delay == 0 {
                Status::Ready
            } else {
                Status::Waiting
            },
            runat: if o.delay == 0 { 0 } else { now + o.delay },
            pri: o.pri,
            ttl: o.ttl,
            ttr: o.ttr,
            created: now,
            owner: None,
            ttr_at: None,
            deliveries: 0,
            utube,
            data,
        };
        self.tasks.insert(id, t);
        self.ops(tube).puts += 1;
        self.events.push(Event::Put { id });
        self.tasks[&id].task()
    }

    /// The next task a take from `tube` gets: lowest (pri, id) Ready task whose utube (if
    /// any) has no Taken task.
    fn next_ready(&self, tube: TubeIx) -> Option<TaskId> {
        let busy = |u: &Option<Vec<u8>>| {
            u.is_some()
                && self
                    .tasks
                    .values()
                    .any(|t| t.tube == tube && t.status == Status::Taken && &t.utube == u)
        };
        self.tasks
            .values()
            .filter(|t| t.tube == tube && t.status == Status::Ready && !busy(&t.utube))
            .min_by_key(|t| (t.pri, t.id))
            .map(|t| t.id)
    }

    fn take(&mut self, now: Micros, tube: TubeIx, sid: SessionId) -> Option<Task> {
        let id = self.next_ready(tube)?;
        let ttr_at = self.tasks[&id].ttr.map(|t| now + t);
        self.make_taken(id, sid, ttr_at);
        self.tasks.get_mut(&id).unwrap().deliveries += 1;
        self.ops(tube).takes += 1;
        self.events.push(Event::Taken { id, sid });
        Some(self.tasks[&id].task())
    }

    /// Ownership as every call on a held task checks it: the task must be in `tube` (in any
    /// tube for `None`) and Taken by `sid`.
    fn held(&self, tube: Option<TubeIx>, sid: SessionId, id: TaskId) -> Result<(), QueueError> {
        let not_held = |hold| QueueError::NotHeld {
            id,
            caller: sid,
            hold,
        };
        let t = (self.tasks.get(&id))
            .filter(|t| tube.is_none_or(|tube| t.tube == tube))
            .ok_or(not_held(Hold::NoTask))?;
        match t.owner {
            None => Err(not_held(Hold::Untaken(t.status))),
            Some(owner) if owner != sid => Err(not_held(Hold::TakenBy(owner))),
            Some(_) => Ok(()),
        }
    }

    /// Seed ownership: the task must be in `default`.
    fn owned(&self, sid: SessionId, id: TaskId) -> Result<(), QueueError> {
        self.held(Some(0), sid, id)
    }

    fn taken_in(&self, tube: TubeIx, sid: SessionId, id: TaskId) -> Result<(), QueueError> {
        self.live(tube)?;
        self.held(Some(tube), sid, id)
    }

    fn in_tube(&self, tube: TubeIx, id: TaskId) -> Result<(), QueueError> {
        self.live(tube)?;
        match self.tasks.get(&id) {
            Some(t) if t.tube == tube => Ok(()),
            _ => Err(QueueError::NotInTube { id, tube }),
        }
    }

    fn give_back(&mut self, id: TaskId, runat: Micros, why: Why) {
        let t = &self.tasks[&id];
        let tube = t.tube;
        let max = self.tubes[&tube].opts.max_deliveries;
        let dead = max > 0 && t.deliveries >= max;
        if dead {
            self.set_status(id, Status::Buried, 0);
        } else if runat == 0 {
            self.set_status(id, Status::Ready, 0);
        } else {
            self.set_status(id, Status::Waiting, runat);
        }
        let ops = self.ops(tube);
        match why {
            Why::Release => ops.releases += 1,
            Why::Ttr => ops.ttr_returned += 1,
            Why::Auto => ops.auto_released += 1,
        }
        if dead {
            ops.dead_lettered += 1;
            self.events.push(Event::DeadLettered { id });
            return;
        }
        self.events.push(match why {
            Why::Release => Event::Released { id, runat },
            Why::Ttr => Event::TtrReturned { id },
            Why::Auto => Event::AutoReleased { id },
        });
    }

    fn ack(&mut self, sid: SessionId, id: TaskId) -> Result<Task, QueueError> {
        self.owned(sid, id)?;
        self.ops(0).acks += 1;
        self.events.push(Event::Acked { id });
        Ok(self.remove(id))
    }

    fn release(
        &mut self,
        now: Micros,
        sid: SessionId,
        id: TaskId,
        delay: Micros,
    ) -> Result<Task, QueueError> {
        self.owned(sid, id)?;
        let runat = if delay == 0 { 0 } else { now + delay };
        self.give_back(id, runat, Why::Release);
        Ok(self.tasks[&id].task())
    }

    fn release_session(&mut self, sid: SessionId) -> usize {
        let ids = self.sessions.get(&sid).cloned().unwrap_or_default();
        for &id in &ids {
            self.give_back(id, 0, Why::Auto);
        }
        ids.len()
    }

    fn taken_by_pri_id(&self, tube: Option<TubeIx>) -> Vec<TaskId> {
        let mut v: Vec<&MTask> = self
            .tasks
            .values()
            .filter(|t| t.status == Status::Taken && tube.is_none_or(|x| x == t.tube))
            .collect();
        v.sort_by_key(|t| (t.pri, t.id));
        v.into_iter().map(|t| t.id).collect()
    }

    fn release_all_taken(&mut self) -> usize {
        let ids = self.taken_by_pri_id(None);
        for &id in &ids {
            self.give_back(id, 0, Why::Auto);
        }
        ids.len()
    }

    fn advance(&mut self, now: Micros, budget: usize) -> (usize, Option<Micros>) {
        let mut processed = 0;
        while processed < budget {
            let Some((at, _, id, kind)) = self.next_deadline() else {
                break;
            };
            if at > now {
                break;
            }
            let tube = self.tasks[&id].tube;
            match kind {
                0 => {
                    self.remove(id);
                    self.ops(tube).expired += 1;
                    self.events.push(Event::Expired { id });
                }
                1 => {
                    self.set_status(id, Status::Ready, 0);
                    self.ops(tube).promoted += 1;
                    self.events.push(Event::Promoted { id });
                }
                _ => self.give_back(id, 0, Why::Ttr),
            }
            processed += 1;
        }
        (processed, self.next_deadline().map(|d| d.0))
    }

    /// An id picked by `which`: usually a live one, sometimes one that does not exist.
    fn pick(&self, which: usize) -> TaskId {
        let n = self.tasks.len();
        if which % (n + 1) == n {
            self.last_id() + 1 + (which % 3) as u64
        } else {
            *self.tasks.keys().nth(which % (n + 1)).unwrap()
        }
    }

    /// A tube picked by `which`: a live one, or now and then one that does not exist.
    fn pick_tube(&self, which: usize) -> TubeIx {
        let n = self.tubes.len();
        if which % (n + 1) == n {
            NO_TUBE
        } else {
            *self.tubes.keys().nth(which % (n + 1)).unwrap()
        }
    }
}

/// The tube API of the model.
impl Model {
    fn create_tube(
        &mut self,
        name: &str,
        kind: TubeType,
        mut opts: TubeOptions,
    ) -> Result<TubeIx, QueueError> {
        if self.tubes.values().any(|t| t.name == name) {
            return Err(QueueError::TubeExists(name.into()));
        }
        let ix = (0..).find(|i| !self.tubes.contains_key(i)).unwrap();
        if opts.ttr.is_none() {
            opts.ttr = opts.ttl;
        }
        let first = self.floors.get(&ix).copied().unwrap_or(0);
        self.tubes.insert(
            ix,
            MTube {
                name: name.into(),
                kind,
                opts,
                ops: Stats::default(),
                dedup: vec![],
                next: first,
                first,
            },
        );
        self.events.push(Event::TubeCreated { tube: ix });
        Ok(ix)
    }

    fn clear(&mut self, tube: TubeIx) -> usize {
        let ids: Vec<TaskId> = self
            .tasks
            .values()
            .filter(|t| t.tube == tube)
            .map(|t| t.id)
            .collect();
        for &id in &ids {
            self.remove(id);
        }
        self.tubes.get_mut(&tube).unwrap().dedup.clear();
        ids.len()
    }

    fn drop_tube(&mut self, tube: TubeIx) -> Result<(), QueueError> {
        if tube == 0 {
            return Err(QueueError::DefaultTubeUndroppable);
        }
        self.live(tube)?;
        if self.stats(tube).taken > 0 {
            return Err(QueueError::TubeHasTaken(tube));
        }
        self.clear(tube);
        let gone = self.tubes.remove(&tube).unwrap();
        self.floors.insert(tube, gone.next);
        self.events.push(Event::TubeDropped { tube });
        Ok(())
    }

    fn truncate(&mut self, tube: TubeIx) -> Result<usize, QueueError> {
        self.live(tube)?;
        let n = self.clear(tube);
        self.events.push(Event::TubeTruncated { tube });
        Ok(n)
    }

    /// A put's result as (new?, task or done id).
    fn put_in(
        &mut self,
        now: Micros,
        tube: TubeIx,
        data: Vec<u8>,
        p: TubePut<'_>,
    ) -> Result<(u8, Option<Task>, TaskId), QueueError> {
        let t = self.live(tube)?.clone();
        if let Some(key) = p.dedup_key {
            let hit = t
                .dedup
                .iter()
                .rev()
                .find(|(k, _, exp)| k == key && *exp > now);
            if let Some(&(_, id, _)) = hit {
                self.ops(tube).deduplicated += 1;
                return Ok((1, self.tasks.get(&id).map(MTask::task), id));
            }
        }
        if t.kind == TubeType::LimFifoTtl
            && t.opts.capacity > 0
            && self.stats(tube).total >= t.opts.capacity
        {
            return Err(QueueError::TubeFull {
                name: t.name.clone(),
                capacity: t.opts.capacity,
            });
        }
        let o = if t.kind.has_ttl() {
            let mut ttl = p.ttl.or(t.opts.ttl);
            if p.delay > 0 && tube != 0 {
                ttl = ttl.map(|x| x + p.delay);
            }
            PutOptions {
                delay: p.delay,
                ttl,
                ttr: p.ttr.or(t.opts.ttr),
                pri: p.pri.unwrap_or(t.opts.pri),
            }
        } else {
            PutOptions::default()
        };
        let utube = t.kind.is_utube().then(|| p.utube.to_vec());
        let task = self.add(now, tube, data, o, utube);
        if let Some(key) = p.dedup_key {
            if t.opts.dedup_window > 0 {
                let exp = now + t.opts.dedup_window;
                self.tubes
                    .get_mut(&tube)
                    .unwrap()
                    .dedup
                    .push((key.to_vec(), task.id, exp));
                self.dedup_events.push((tube, key.to_vec(), task.id));
            }
        }
        Ok((0, Some(task.clone()), task.id))
    }

    fn take_from(
        &mut self,
        now: Micros,
        tube: TubeIx,
        sid: SessionId,
    ) -> Result<Option<Task>, QueueError> {
        self.live(tube)?;
        Ok(self.take(now, tube, sid))
    }

    fn ack_in(&mut self, tube: TubeIx, sid: SessionId, id: TaskId) -> Result<Task, QueueError> {
        self.taken_in(tube, sid, id)?;
        self.ops(tube).acks += 1;
        self.events.push(Event::Acked { id });
        Ok(self.remove(id))
    }

    fn release_in(
        &mut self,
        now: Micros,
        tube: TubeIx,
        sid: SessionId,
        id: TaskId,
        o: ReleaseOptions,
    ) -> Result<Task, QueueError> {
        self.taken_in(tube, sid, id)?;
        let mut runat = 0;
        if self.tubes[&tube].kind.has_ttl() {
            let t = self.tasks.get_mut(&id).unwrap();
            let before = (t.pri, t.ttl);
            if let Some(pri) = o.pri {
                t.pri = pri;
            }
            if let Some(ttl) = o.ttl {
                t.ttl = Some(now - t.created + ttl);
            }
            if o.delay > 0 && tube != 0 {
                t.ttl = t.ttl.map(|x| x + o.delay);
            }
            if before != (t.pri, t.ttl) {
                self.events.push(Event::Updated { id });
            }
            if o.delay > 0 {
                runat = now + o.delay;
            }
        }
        self.give_back(id, runat, Why::Release);
        Ok(self.tasks[&id].task())
    }

    fn touch(
        &mut self,
        tube: TubeIx,
        sid: SessionId,
        id: TaskId,
        delta: Option<Micros>,
    ) -> Result<Task, QueueError> {
        let kind = self.live(tube)?.kind;
        self.taken_in(tube, sid, id)?;
        // Counted once by the owner's call and once more on success, as the original does.
        self.ops(tube).touches += 1;
        if !kind.has_ttl() {
            return Err(QueueError::TouchUnsupported(kind));
        }
        let t = self.tasks.get_mut(&id).unwrap();
        match delta {
            None => {
                t.ttl = None;
                t.ttr = None;
                t.ttr_at = None;
            }
            Some(d) => {
                t.ttl = t.ttl.map(|x| x + d);
                t.ttr = t.ttr.map(|x| x + d);
                t.ttr_at = t.ttr_at.map(|x| x + d);
            }
        }
        self.ops(tube).touches += 1;
        self.events.push(Event::Updated { id });
        Ok(self.tasks[&id].task())
    }

    fn peek(&self, tube: TubeIx, id: TaskId) -> Result<Task, QueueError> {
        self.in_tube(tube, id)?;
        Ok(self.tasks[&id].task())
    }

    fn bury(&mut self, tube: TubeIx, id: TaskId) -> Result<Task, QueueError> {
        self.in_tube(tube, id)?;
        if self.tasks[&id].status != Status::Buried {
            self.set_status(id, Status::Buried, 0);
            self.ops(tube).buries += 1;
            self.events.push(Event::Buried { id });
        }
        Ok(self.tasks[&id].task())
    }

    fn kick(&mut self, tube: TubeIx, count: u64) -> Result<u64, QueueError> {
        self.live(tube)?;
        let mut n = 0;
        while n < count {
            let next = self
                .tasks
                .values()
                .filter(|t| t.tube == tube && t.status == Status::Buried)
                .min_by_key(|t| (t.pri, t.id))
                .map(|t| t.id);
            let Some(id) = next else { break };
            self.set_status(id, Status::Ready, 0);
            self.ops(tube).kicks += 1;
            self.events.push(Event::Kicked { id });
            n += 1;
        }
        Ok(n)
    }

    fn delete(&mut self, tube: TubeIx, id: TaskId) -> Result<Task, QueueError> {
        self.in_tube(tube, id)?;
        self.ops(tube).deletes += 1;
        self.events.push(Event::Deleted { id });
        Ok(self.remove(id))
    }

    fn release_all(&mut self, tube: TubeIx) -> Result<usize, QueueError> {
        self.live(tube)?;
        let ids = self.taken_by_pri_id(Some(tube));
        for &id in &ids {
            self.give_back(id, 0, Why::Auto);
        }
        Ok(ids.len())
    }
}

/// The beanstalkd front-end's calls of the model.
impl Model {
    /// Ownership in any tube.
    fn owned_any(&self, sid: SessionId, id: TaskId) -> Result<(), QueueError> {
        self.held(None, sid, id)
    }

    /// The Waiting task of `tube` due first, by (runat, id).
    fn first_due(&self, tube: TubeIx) -> Option<TaskId> {
        self.tasks
            .values()
            .filter(|t| t.tube == tube && t.status == Status::Waiting)
            .min_by_key(|t| (t.runat, t.id))
            .map(|t| t.id)
    }

    fn peek_first(&self, tube: TubeIx, status: Status) -> Result<Option<Task>, QueueError> {
        self.live(tube)?;
        let id = match status {
            Status::Ready => self.next_ready(tube),
            Status::Waiting => self.first_due(tube),
            Status::Buried => self
                .tasks
                .values()
                .filter(|t| t.tube == tube && t.status == Status::Buried)
                .min_by_key(|t| (t.pri, t.id))
                .map(|t| t.id),
            Status::Taken => None,
        };
        Ok(id.map(|id| self.tasks[&id].task()))
    }

    fn kick_one(&mut self, id: TaskId) {
        let tube = self.tasks[&id].tube;
        self.set_status(id, Status::Ready, 0);
        self.ops(tube).kicks += 1;
        self.events.push(Event::Kicked { id });
    }

    fn kick_delayed(&mut self, tube: TubeIx, count: u64) -> Result<u64, QueueError> {
        self.live(tube)?;
        let mut n = 0;
        while n < count {
            let Some(id) = self.first_due(tube) else {
                break;
            };
            self.kick_one(id);
            n += 1;
        }
        Ok(n)
    }

    fn kick_task(&mut self, id: TaskId) -> Result<Task, QueueError> {
        let t = self.tasks.get(&id).ok_or(QueueError::NotFound(id))?;
        match t.status {
            Status::Buried | Status::Waiting => self.kick_one(id),
            status => return Err(QueueError::NotKickable { id, status }),
        }
        Ok(self.tasks[&id].task())
    }

    /// beanstalk's reserve-job: a Ready, Waiting or Buried task taken by id; a utube task
    /// only as its utube's free Ready head.
    fn take_task(&mut self, now: Micros, sid: SessionId, id: TaskId) -> Result<Task, QueueError> {
        let t = self.tasks.get(&id).ok_or(QueueError::NotFound(id))?;
        let (status, tube) = (t.status, t.tube);
        let refused = QueueError::NotTakeable { id, status };
        if t.utube.is_some() && self.next_ready_of_utube(tube, &t.utube) != Some(id) {
            return Err(refused);
        }
        if !matches!(status, Status::Ready | Status::Waiting | Status::Buried) {
            return Err(refused);
        }
        let ttr_at = t.ttr.map(|ttr| now + ttr);
        self.make_taken(id, sid, ttr_at);
        self.tasks.get_mut(&id).unwrap().deliveries += 1;
        self.ops(tube).takes += 1;
        self.events.push(Event::Taken { id, sid });
        Ok(self.tasks[&id].task())
    }

    /// The head of utube `u` of `tube`: its lowest (pri, id) Ready task, if none is Taken.
    fn next_ready_of_utube(&self, tube: TubeIx, u: &Option<Vec<u8>>) -> Option<TaskId> {
        let mine = || {
            self.tasks
                .values()
                .filter(|t| t.tube == tube && &t.utube == u)
        };
        if mine().any(|t| t.status == Status::Taken) {
            return None;
        }
        mine()
            .filter(|t| t.status == Status::Ready)
            .min_by_key(|t| (t.pri, t.id))
            .map(|t| t.id)
    }

    fn touch_ttr(&mut self, now: Micros, sid: SessionId, id: TaskId) -> Result<Task, QueueError> {
        self.owned_any(sid, id)?;
        let t = self.tasks.get_mut(&id).unwrap();
        if let Some(ttr) = t.ttr {
            t.ttr_at = Some(now + ttr);
        }
        let tube = t.tube;
        self.ops(tube).touches += 1;
        Ok(self.tasks[&id].task())
    }

    fn bury_taken(&mut self, sid: SessionId, id: TaskId, pri: i64) -> Result<Task, QueueError> {
        self.owned_any(sid, id)?;
        let tube = self.tasks[&id].tube;
        let t = self.tasks.get_mut(&id).unwrap();
        if self.tubes[&tube].kind.has_ttl() && t.pri != pri {
            t.pri = pri;
            self.events.push(Event::Updated { id });
        }
        self.set_status(id, Status::Buried, 0);
        self.ops(tube).buries += 1;
        self.events.push(Event::Buried { id });
        Ok(self.tasks[&id].task())
    }

    fn ready_urgent(&self, tube: TubeIx) -> Result<u64, QueueError> {
        self.live(tube)?;
        Ok(self
            .tasks
            .values()
            .filter(|t| t.tube == tube && t.status == Status::Ready && t.pri < URGENT_PRI)
            .count() as u64)
    }

    fn soonest_ttr(&self, sid: SessionId) -> Option<Micros> {
        let held = self.sessions.get(&sid)?;
        held.iter().filter_map(|id| self.tasks[id].ttr_at).min()
    }
}

fn opts(delay: Option<u64>, ttl: Option<u64>, ttr: Option<u64>, pri: i64) -> PutOptions {
    PutOptions {
        delay: delay.unwrap_or(0),
        ttl,
        ttr,
        pri,
    }
}

/// Rebuilds the queue the way recovery does: every tube, every task from a snapshot
/// (`iter`) with its tube, utube key and delivery count, the dedup keys, the last id, then
/// `release_all_taken`.
fn restart(q: &Queue) -> (Queue, usize) {
    let mut fresh = Queue::new();
    fresh.set_journal(true);
    for t in q.tubes() {
        if t.ix != 0 {
            fresh
                .restore_tube(t.ix, t.name, t.kind, t.opts, t.numbers)
                .unwrap();
        } else {
            fresh.restore_tube_numbers(t.ix, t.numbers).unwrap();
        }
    }
    for (ix, floor) in q.floors() {
        fresh.restore_floor(ix, floor).unwrap();
    }
    for t in q.iter() {
        let task: RestoredTask = RestoredTask {
            id: t.id,
            status: t.status,
            runat: t.runat,
            pri: t.pri,
            ttl: t.ttl,
            ttr: t.ttr,
            created: t.created,
            data: t.data.into(),
        };
        fresh
            .restore_in(t.tube, task, t.utube, t.deliveries)
            .unwrap();
    }
    for t in q.tubes() {
        for (key, id, expires) in q.dedup_entries(t.ix) {
            fresh.restore_dedup(t.ix, key, id, expires).unwrap();
        }
    }
    fresh.set_last_id(q.last_id());
    fresh.check_invariants();
    let n = fresh.release_all_taken();
    (fresh, n)
}

fn compare(q: &mut Queue, m: &mut Model, step: usize, op: &Op) {
    q.check_invariants();
    let mut recorded = std::mem::take(&mut m.dedup_events).into_iter();
    let events: Vec<Event> = q.drain_events().collect();
    let events: Vec<Event> = events
        .into_iter()
        .filter_map(|e| match e {
            Event::DedupRecorded { tube, seq } => {
                let (mt, key, id) = recorded.next().expect("a dedup record the model made");
                let (k, i, _) = q.dedup_entry(tube, seq).expect("recorded entry");
                assert_eq!(
                    (tube, k, i),
                    (mt, &key[..], id),
                    "dedup record at step {step}"
                );
                None
            }
            e => Some(e),
        })
        .collect();
    assert!(
        recorded.next().is_none(),
        "dedup record missing at step {step}"
    );
    assert_eq!(
        events,
        std::mem::take(&mut m.events),
        "events after step {step} {op:?}"
    );
    assert_eq!(q.stats(), m.stats(0), "stats after step {step} {op:?}");
    let tubes: Vec<(TubeIx, String, TubeType, TubeOptions)> = q
        .tubes()
        .map(|t| (t.ix, t.name.to_owned(), t.kind, t.opts))
        .collect();
    let want: Vec<(TubeIx, String, TubeType, TubeOptions)> = m
        .tubes
        .iter()
        .map(|(&ix, t)| (ix, t.name.clone(), t.kind, t.opts))
        .collect();
    assert_eq!(tubes, want, "tubes after step {step}");
    for &ix in m.tubes.keys() {
        assert_eq!(
            q.tube_stats(ix),
            Ok(m.stats(ix)),
            "tube {ix} stats after step {step} {op:?}"
        );
        assert_eq!(
            q.can_take(ix),
            m.next_ready(ix).is_some(),
            "can_take {ix} at step {step}"
        );
        assert_eq!(
            q.ready_urgent(ix),
            m.ready_urgent(ix),
            "ready_urgent {ix} after step {step} {op:?}"
        );
    }
    assert_eq!(
        q.ready_urgent(NO_TUBE),
        Err(QueueError::TubeNotFound(NO_TUBE))
    );
    for t in m.tasks.values() {
        assert_eq!(
            q.ttr_deadline(t.id),
            t.ttr_at,
            "ttr_deadline {} after step {step} {op:?}",
            t.id
        );
    }
    assert_eq!(q.ttr_deadline(m.last_id() + 1), None);
    for sid in 0..=SESSIONS + 1 {
        assert_eq!(
            q.soonest_ttr(sid),
            m.soonest_ttr(sid),
            "soonest_ttr {sid} after step {step} {op:?}"
        );
    }
    assert_eq!(
        q.next_deadline(),
        m.next_deadline().map(|d| d.0),
        "deadline at step {step}"
    );
    assert_eq!(q.last_id(), m.last_id());
    for (&ix, t) in &m.tubes {
        let numbers = q.tube_info(ix).expect("live tube").numbers;
        assert_eq!(
            numbers.next, t.next,
            "tube {ix}'s next number after step {step}"
        );
    }
    assert_eq!(q.len(), m.tasks.len());
    let mut all: Vec<(Task, Option<Vec<u8>>)> = q
        .iter()
        .map(|t| (t.to_task(), t.utube.map(<[u8]>::to_vec)))
        .collect();
    all.sort_by_key(|t| t.0.id);
    let want: Vec<(Task, Option<Vec<u8>>)> = m
        .tasks
        .values()
        .map(|t| (t.task(), t.utube.clone()))
        .collect();
    assert_eq!(all, want, "tasks after step {step} {op:?}");
    // Each task's number as the tube API shows it, by the engine and by the front-end's
    // mapping from the tube's first number.
    for t in m.tasks.values() {
        assert_eq!(
            q.task_number(t.tube, t.id),
            t.number,
            "task {} number",
            t.id
        );
        let first = q.tube_numbers(t.tube).first;
        assert_eq!(tarq_engine::number_from(t.tube, first, t.id), t.number);
    }
    assert!(q.get(m.last_id() + 1).is_none());
}

fn run_seed(q: &mut Queue, m: &mut Model, now: &mut Micros, step: usize, op: &Op) {
    let now_v = *now;
    match *op {
        Op::Put {
            delay,
            ttl,
            ttr,
            pri,
            len,
        } => {
            let data = vec![len as u8; len];
            let o = opts(delay, ttl, ttr, pri);
            let got = q.put(now_v, data.clone(), o).to_task();
            assert_eq!(got, m.add(now_v, 0, data, o, None), "put at step {step}");
        }
        Op::Take { sid } => {
            let got = q.take(now_v, sid).map(|t| t.to_task());
            assert_eq!(got, m.take(now_v, 0, sid), "take at step {step}");
        }
        Op::Ack { sid, which } => {
            let id = m.pick(which);
            assert_eq!(q.ack(sid, id), m.ack(sid, id), "ack {id} at step {step}");
        }
        Op::Release { sid, which, delay } => {
            let id = m.pick(which);
            let got = q.release(now_v, sid, id, delay).map(|t| t.to_task());
            assert_eq!(
                got,
                m.release(now_v, sid, id, delay),
                "release {id} at step {step}"
            );
        }
        Op::ReleaseSession { sid } => {
            assert_eq!(
                q.release_session(sid),
                m.release_session(sid),
                "step {step}"
            );
        }
        Op::ReleaseAll => assert_eq!(q.release_all_taken(), m.release_all_taken()),
        Op::Tick { dt } => *now += dt,
        Op::Advance { dt, budget } => {
            *now += dt;
            let adv = q.advance(*now, budget);
            let (processed, next) = m.advance(*now, budget);
            assert_eq!(
                (adv.processed, adv.next_deadline),
                (processed, next),
                "step {step}"
            );
            assert!(processed == budget || next.is_none_or(|d| d > *now));
        }
        Op::RestoreStatus { which, status, dt } => {
            let id = m.pick(which);
            let want = match m.tasks.get(&id) {
                None => Err(QueueError::NotFound(id)),
                Some(t) => {
                    // Recovery never holds two taken tasks of one utube.
                    let clash = status == Status::Taken
                        && t.utube.is_some()
                        && m.tasks.values().any(|o| {
                            o.id != id
                                && o.tube == t.tube
                                && o.status == Status::Taken
                                && o.utube == t.utube
                        });
                    if clash {
                        return;
                    }
                    match status {
                        Status::Taken => m.make_taken(id, 0, None),
                        s => m.set_status(id, s, now_v + dt),
                    }
                    Ok(())
                }
            };
            assert_eq!(
                q.restore_status(id, status, now_v + dt),
                want,
                "step {step}"
            );
        }
        Op::RestoreRemove { which } => {
            let id = m.pick(which);
            let want = m.tasks.contains_key(&id).then(|| m.remove(id));
            assert_eq!(q.restore_remove(id), want, "step {step}");
        }
        Op::Restart => {
            let (fresh, n) = restart(q);
            *q = fresh;
            for t in m.tubes.values_mut() {
                t.ops = Stats::default();
            }
            assert_eq!(n, m.release_all_taken(), "restart at step {step}");
        }
        _ => unreachable!(),
    }
}

fn run_tube(q: &mut Queue, m: &mut Model, now: Micros, step: usize, op: &Op) {
    match *op {
        Op::CreateTube { which } => {
            let (name, kind, o) = palette(which);
            assert_eq!(
                q.create_tube(name, kind, o),
                m.create_tube(name, kind, o),
                "step {step}"
            );
        }
        Op::DropTube { tube } => {
            let t = m.pick_tube(tube);
            assert_eq!(q.drop_tube(t), m.drop_tube(t), "drop {t} at step {step}");
        }
        Op::Truncate { tube } => {
            let t = m.pick_tube(tube);
            assert_eq!(q.truncate(t), m.truncate(t), "truncate {t} at step {step}");
        }
        Op::PutIn {
            tube,
            delay,
            ttl,
            ttr,
            pri,
            utube,
            dedup,
        } => {
            let t = m.pick_tube(tube);
            let (ukey, dkey) = ([b'k', utube], dedup.map(|d| [b'd', d]));
            let p = TubePut {
                delay: delay.unwrap_or(0),
                ttl,
                ttr,
                pri,
                utube: &ukey,
                dedup_key: dkey.as_ref().map(|d| &d[..]),
            };
            let data = vec![7u8; 2];
            let got = q.put_in(now, t, data.clone(), p).map(|o| match o {
                PutOutcome::Created(r) => (0, Some(r.to_task()), r.id),
                PutOutcome::Duplicate(r) => (1, Some(r.to_task()), r.id),
                PutOutcome::DuplicateDone(id) => (1, None, id),
            });
            assert_eq!(
                got,
                m.put_in(now, t, data, p),
                "put into {t} at step {step}"
            );
        }
        Op::TakeFrom { tube, sid } => {
            let t = m.pick_tube(tube);
            let got = q.take_from(now, t, sid).map(|o| o.map(|r| r.to_task()));
            assert_eq!(
                got,
                m.take_from(now, t, sid),
                "take from {t} at step {step}"
            );
        }
        Op::AckIn { tube, sid, which } => {
            let (t, id) = (m.pick_tube(tube), m.pick(which));
            assert_eq!(
                q.ack_in(t, sid, id),
                m.ack_in(t, sid, id),
                "ack {id} at step {step}"
            );
        }
        Op::ReleaseIn {
            tube,
            sid,
            which,
            delay,
            pri,
            ttl,
        } => {
            let (t, id) = (m.pick_tube(tube), m.pick(which));
            let o = ReleaseOptions { delay, pri, ttl };
            let got = q.release_in(now, t, sid, id, o).map(|r| r.to_task());
            assert_eq!(
                got,
                m.release_in(now, t, sid, id, o),
                "release {id} at step {step}"
            );
        }
        Op::Touch {
            tube,
            sid,
            which,
            delta,
        } => {
            let (t, id) = (m.pick_tube(tube), m.pick(which));
            let got = q.touch(t, sid, id, delta).map(|r| r.to_task());
            assert_eq!(got, m.touch(t, sid, id, delta), "touch {id} at step {step}");
        }
        Op::Peek { tube, which } => {
            let (t, id) = (m.pick_tube(tube), m.pick(which));
            assert_eq!(
                q.peek(t, id).map(|r| r.to_task()),
                m.peek(t, id),
                "peek at step {step}"
            );
        }
        Op::Bury { tube, which } => {
            let (t, id) = (m.pick_tube(tube), m.pick(which));
            assert_eq!(
                q.bury(t, id).map(|r| r.to_task()),
                m.bury(t, id),
                "bury at step {step}"
            );
        }
        Op::Kick { tube, count } => {
            let t = m.pick_tube(tube);
            assert_eq!(q.kick(t, count), m.kick(t, count), "kick at step {step}");
        }
        Op::Delete { tube, which } => {
            let (t, id) = (m.pick_tube(tube), m.pick(which));
            assert_eq!(q.delete(t, id), m.delete(t, id), "delete at step {step}");
        }
        Op::ReleaseAllIn { tube } => {
            let t = m.pick_tube(tube);
            assert_eq!(
                q.release_all(t),
                m.release_all(t),
                "release_all at step {step}"
            );
        }
        _ => run_beanstalk(q, m, now, step, op),
    }
}

fn run_beanstalk(q: &mut Queue, m: &mut Model, now: Micros, step: usize, op: &Op) {
    match *op {
        Op::PeekFirst { tube, status } => {
            let t = m.pick_tube(tube);
            assert_eq!(
                q.peek_first(t, status).map(|o| o.map(|r| r.to_task())),
                m.peek_first(t, status),
                "peek_first {status:?} of {t} at step {step}"
            );
        }
        Op::KickDelayed { tube, count } => {
            let t = m.pick_tube(tube);
            assert_eq!(
                q.kick_delayed(now, t, count),
                m.kick_delayed(t, count),
                "kick_delayed at step {step}"
            );
        }
        Op::KickTask { which } => {
            let id = m.pick(which);
            assert_eq!(
                q.kick_task(now, id).map(|r| r.to_task()),
                m.kick_task(id),
                "kick_task {id} at step {step}"
            );
        }
        Op::TakeTask { sid, which } => {
            let id = m.pick(which);
            assert_eq!(
                q.take_task(now, sid, id).map(|r| r.to_task()),
                m.take_task(now, sid, id),
                "take_task {id} at step {step}"
            );
        }
        Op::TouchTtr { sid, which } => {
            let id = m.pick(which);
            assert_eq!(
                q.touch_ttr(now, sid, id).map(|r| r.to_task()),
                m.touch_ttr(now, sid, id),
                "touch_ttr {id} at step {step}"
            );
        }
        Op::BuryTaken { sid, which, pri } => {
            let id = m.pick(which);
            assert_eq!(
                q.bury_taken(sid, id, pri).map(|r| r.to_task()),
                m.bury_taken(sid, id, pri),
                "bury_taken {id} at step {step}"
            );
        }
        _ => run_seed(q, m, &mut now.clone(), step, op),
    }
}

fn run(ops: &[Op]) {
    let mut q = Queue::new();
    q.set_journal(true);
    let mut m = Model::new();
    let mut now = T0;
    for (step, op) in ops.iter().enumerate() {
        match op {
            Op::Put { .. }
            | Op::Take { .. }
            | Op::Ack { .. }
            | Op::Release { .. }
            | Op::ReleaseSession { .. }
            | Op::ReleaseAll
            | Op::Tick { .. }
            | Op::Advance { .. }
            | Op::RestoreStatus { .. }
            | Op::RestoreRemove { .. }
            | Op::Restart => run_seed(&mut q, &mut m, &mut now, step, op),
            _ => run_tube(&mut q, &mut m, now, step, op),
        }
        compare(&mut q, &mut m, step, op);
    }
    moved_copy_matches(q, now);
}

/// Page size of the move's export in the property test: small, so a tube takes many pages.
const MOVE_PAGE: usize = 3;

/// A move of every tube of `q` into a fresh queue (`export_tube` / `import_task`, the dedup
/// keys and the numbering) makes a copy that no call tells from the original: every task's
/// view and TTR deadline, each tube's counts by status, urgent count, first task of each
/// status and lists, its numbering and dedup keys, the next deadline and each session's
/// soonest TTR; then the same deadlines fire in the same order, and takes return the same
/// tasks in the same order. Sessions keep their numbers (the importer's map is the identity).
fn moved_copy_matches(mut q: Queue, now: Micros) {
    q.drain_events().for_each(drop);
    let mut c = Queue::new();
    c.set_journal(true);
    let mut keys = 0;
    let tubes: Vec<_> = q
        .tubes()
        .map(|t| (t.ix, t.name.to_owned(), t.kind, t.opts, t.numbers))
        .collect();
    for (ix, name, kind, opts, numbers) in &tubes {
        if *ix != 0 {
            let made = c.create_tube_at(*ix, name, *kind, *opts, numbers.first);
            assert_eq!(made, Ok(true), "tube {ix} made at its index");
        }
        c.import_numbers(*ix, *numbers).expect("same first");
        let mut after = None;
        loop {
            let page = q
                .export_tube(*ix, after, MOVE_PAGE, usize::MAX)
                .expect("live tube");
            assert!(page.len() <= MOVE_PAGE);
            let Some(last) = page.last() else { break };
            after = Some(last.id);
            for t in page {
                assert_eq!(t.owner.is_some(), t.status == Status::Taken);
                let id = t.id;
                let owner = t.owner.unwrap_or(0);
                c.import_task(*ix, t.clone(), owner)
                    .unwrap_or_else(|e| panic!("import of {id}: {e}"));
                assert_eq!(
                    c.import_task(*ix, t, owner),
                    Err(QueueError::Duplicate(id)),
                    "an import sent twice"
                );
                c.check_invariants();
            }
        }
        let mut after = None;
        loop {
            let page = q.export_dedup(*ix, after, 2).expect("live tube");
            let Some(last) = page.last() else { break };
            after = Some(last.seq);
            for d in page {
                c.import_dedup(*ix, d).expect("dedup key");
                keys += 1;
            }
        }
    }
    let events: Vec<Event> = c.drain_events().collect();
    let count = |f: fn(&Event) -> bool| events.iter().filter(|e| f(e)).count();
    assert_eq!(
        count(|e| matches!(e, Event::Imported { .. })),
        q.len(),
        "one Imported event a task"
    );
    assert_eq!(
        count(|e| matches!(e, Event::DedupRecorded { .. })),
        keys,
        "one DedupRecorded event a key"
    );
    c.check_invariants();
    assert_eq!(c.len(), q.len());
    for t in q.iter() {
        assert_eq!(c.get(t.id), Some(t), "task {} moved", t.id);
        assert_eq!(
            c.ttr_deadline(t.id),
            q.ttr_deadline(t.id),
            "TTR of {}",
            t.id
        );
    }
    for (ix, ..) in &tubes {
        let (a, b) = (q.tube_stats(*ix).unwrap(), c.tube_stats(*ix).unwrap());
        let counts = |s: Stats| (s.total, s.ready, s.taken, s.waiting, s.buried);
        assert_eq!(counts(b), counts(a), "tube {ix}: counts by status");
        assert_eq!(
            b.puts + b.takes + b.acks,
            0,
            "tube {ix}: an import counts no operation"
        );
        assert_eq!(c.ready_urgent(*ix), q.ready_urgent(*ix));
        assert_eq!(c.can_take(*ix), q.can_take(*ix), "tube {ix}: can_take");
        assert_eq!(
            c.tube_numbers(*ix),
            q.tube_numbers(*ix),
            "tube {ix}: numbering"
        );
        let keys = |q: &Queue| -> Vec<(Vec<u8>, TaskId, Micros)> {
            q.dedup_entries(*ix)
                .map(|(k, id, e)| (k.to_vec(), id, e))
                .collect()
        };
        assert_eq!(keys(&c), keys(&q), "tube {ix}: dedup keys");
        for status in [
            Status::Ready,
            Status::Waiting,
            Status::Buried,
            Status::Taken,
        ] {
            assert_eq!(
                c.peek_first(*ix, status),
                q.peek_first(*ix, status),
                "tube {ix}: first {status:?}"
            );
            let ids = |q: &Queue| -> Vec<TaskId> {
                let mut ids: Vec<TaskId> = (q.list(*ix, status, None, usize::MAX).unwrap().iter())
                    .map(|t| t.id)
                    .collect();
                // A session's take order is not carried: the copy's is id order.
                if status == Status::Taken {
                    ids.sort_unstable();
                }
                ids
            };
            assert_eq!(ids(&c), ids(&q), "tube {ix}: {status:?} list");
        }
    }
    assert_eq!(c.next_deadline(), q.next_deadline(), "next deadline");
    for sid in 0..=SESSIONS {
        assert_eq!(c.soonest_ttr(sid), q.soonest_ttr(sid), "session {sid}");
    }
    // What they do from here on: the same deadlines fire in the same order, then takes
    // return the same tasks.
    let mut at = now;
    for _ in 0..8 {
        at += 40;
        let (a, b) = (q.advance(at, 5), c.advance(at, 5));
        assert_eq!(b, a, "advance to {at}");
        let (ea, eb): (Vec<Event>, Vec<Event>) =
            (q.drain_events().collect(), c.drain_events().collect());
        assert_eq!(eb, ea, "events of the advance to {at}");
    }
    for (ix, ..) in &tubes {
        loop {
            let a = q.take_from(at, *ix, SESSIONS + 1).unwrap().map(|t| t.id);
            let b = c.take_from(at, *ix, SESSIONS + 1).unwrap().map(|t| t.id);
            assert_eq!(b, a, "tube {ix}: take order");
            if a.is_none() {
                break;
            }
        }
    }
    c.check_invariants();
}

fn config() -> ProptestConfig {
    let cases = std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(DEFAULT_CASES);
    ProptestConfig {
        cases,
        ..ProptestConfig::default()
    }
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn engine_matches_the_model(ops in prop::collection::vec(op(), 1..200)) {
        run(&ops);
    }
}

/// Tubes of every type created up front, then the tube API only: more steps land on tubes.
#[test]
fn tube_heavy_runs_match_the_model() {
    let mut runner = proptest::test_runner::TestRunner::new(config());
    let step = prop_oneof![
        6 => tube_op(),
        1 => (0u64..30, 0usize..6).prop_map(|(dt, budget)| Op::Advance { dt, budget }),
        1 => sid_close(),
    ];
    let ops = prop::collection::vec(step, 1..300).prop_map(|ops| {
        let mut all: Vec<Op> = (0..6).map(|which| Op::CreateTube { which }).collect();
        all.extend(ops);
        all
    });
    runner
        .run(&ops, |ops| {
            run(&ops);
            Ok(())
        })
        .unwrap();
}

/// A long deterministic run with many tasks, so the skiplists grow several levels tall.
#[test]
fn long_run_with_many_tasks() {
    let mut ops = vec![];
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
    let mut next = || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    for _ in 0..3000 {
        let r = next();
        let sid = 1 + r % SESSIONS;
        let which = (r >> 8) as usize;
        ops.push(match r % 10 {
            0..=3 => Op::Put {
                delay: (r & 0x100 != 0).then_some((r >> 20) % 50),
                ttl: (r & 0x200 != 0).then_some(200 + (r >> 30) % 400),
                ttr: (r & 0x400 != 0).then_some((r >> 40) % 80),
                pri: ((r >> 50) % 3) as i64,
                len: 1,
            },
            4 | 5 => Op::Take { sid },
            6 => Op::Ack { sid, which },
            7 => Op::Release {
                sid,
                which,
                delay: (r >> 12) % 3 * 10,
            },
            8 => Op::Advance {
                dt: (r >> 16) % 5,
                budget: 8,
            },
            _ => {
                if r % 97 == 0 {
                    Op::ReleaseSession { sid }
                } else {
                    Op::Tick { dt: 1 }
                }
            }
        });
    }
    run(&ops);
}
