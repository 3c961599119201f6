//! Model-based property test: random sequences of put (delay / ttl / ttr / pri), take, ack,
//! release (with and without delay), session close, release of all taken, recovery calls,
//! restarts from a snapshot and time moving (with and without `advance` and its budget) run
//! against both the engine and a plainly correct model built on `BTreeMap` / `VecDeque`.
//! Every observable result is compared: returned tasks, errors, stats, events, next deadline
//! and the full task set; `check_invariants()` runs after every step.
//!
//! `PROPTEST_CASES` raises the number of cases (the default keeps a debug run short).

use std::collections::{BTreeMap, VecDeque};

use proptest::prelude::*;
use tarq_engine::{
    Event, Micros, PutOptions, Queue, QueueError, RestoredTask, SessionId, Stats, Status, Task,
    TaskId,
};

const T0: Micros = 1_700_000_000_000_000;
/// Sessions are few so that ownership errors and session closes hit real tasks.
const SESSIONS: u64 = 4;
/// Cases by default: about a few seconds in a debug build.
const DEFAULT_CASES: u32 = 256;

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
}

fn op() -> impl Strategy<Value = Op> {
    let small = || prop_oneof![Just(None), (0u64..60).prop_map(Some)];
    let sid = || 1..=SESSIONS;
    prop_oneof![
        6 => (small(), small(), small(), -2i64..3, 0usize..4)
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
            prop_oneof![Just(Status::Ready), Just(Status::Taken), Just(Status::Waiting)],
            0u64..40
        )
            .prop_map(|(which, status, dt)| Op::RestoreStatus { which, status, dt }),
        1 => any::<usize>().prop_map(|which| Op::RestoreRemove { which }),
        1 => Just(Op::Restart),
    ]
}

#[derive(Clone, Debug)]
struct MTask {
    id: TaskId,
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
            tube: 0,
            deliveries: self.deliveries,
        }
    }

    /// Its pending deadlines as (time, id, kind): kind 0 expire, 1 promote, 2 TTR.
    fn deadlines(&self) -> impl Iterator<Item = (Micros, TaskId, u8)> {
        let ttl = self
            .ttl
            .map(|t| (self.created.saturating_add(t), self.id, 0));
        let promote = (self.status == Status::Waiting).then_some((self.runat, self.id, 1));
        let ttr = self.ttr_at.map(|at| (at, self.id, 2));
        ttl.into_iter().chain(promote).chain(ttr)
    }
}

/// The reference: every question answered by a scan, every list a `VecDeque`.
#[derive(Default, Debug)]
struct Model {
    tasks: BTreeMap<TaskId, MTask>,
    /// Each session's taken ids, in take order.
    sessions: BTreeMap<SessionId, VecDeque<TaskId>>,
    last_id: TaskId,
    ops: Stats,
    events: Vec<Event>,
}

impl Model {
    fn stats(&self) -> Stats {
        let count = |s| self.tasks.values().filter(|t| t.status == s).count() as u64;
        Stats {
            total: self.tasks.len() as u64,
            ready: count(Status::Ready),
            taken: count(Status::Taken),
            waiting: count(Status::Waiting),
            ..self.ops
        }
    }

    fn next_deadline(&self) -> Option<(Micros, TaskId, u8)> {
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

    fn make_ready(&mut self, id: TaskId) {
        self.leave_session(id);
        let t = self.tasks.get_mut(&id).unwrap();
        t.status = Status::Ready;
        t.runat = 0;
        t.owner = None;
        t.ttr_at = None;
    }

    fn make_waiting(&mut self, id: TaskId, runat: Micros) {
        self.make_ready(id);
        let t = self.tasks.get_mut(&id).unwrap();
        t.status = Status::Waiting;
        t.runat = runat;
    }

    fn make_taken(&mut self, id: TaskId, sid: SessionId, ttr_at: Option<Micros>) {
        self.make_ready(id);
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

    fn put(&mut self, now: Micros, data: Vec<u8>, o: PutOptions) -> Task {
        self.last_id += 1;
        let id = self.last_id;
        let t = MTask {
            id,
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
            data,
        };
        self.tasks.insert(id, t);
        self.ops.puts += 1;
        self.events.push(Event::Put { id });
        self.tasks[&id].task()
    }

    fn first_by_pri_id(&self, status: Status) -> Option<TaskId> {
        self.tasks
            .values()
            .filter(|t| t.status == status)
            .min_by_key(|t| (t.pri, t.id))
            .map(|t| t.id)
    }

    fn take(&mut self, now: Micros, sid: SessionId) -> Option<Task> {
        let id = self.first_by_pri_id(Status::Ready)?;
        let ttr_at = self.tasks[&id].ttr.map(|t| now + t);
        self.make_taken(id, sid, ttr_at);
        self.tasks.get_mut(&id).unwrap().deliveries += 1;
        self.ops.takes += 1;
        self.events.push(Event::Taken { id, sid });
        Some(self.tasks[&id].task())
    }

    fn owned(&self, sid: SessionId, id: TaskId) -> Result<(), QueueError> {
        let t = self.tasks.get(&id).ok_or(QueueError::NotFound(id))?;
        match t.owner {
            None => Err(QueueError::NotTaken(id)),
            Some(owner) if owner != sid => Err(QueueError::NotOwner {
                id,
                owner,
                caller: sid,
            }),
            Some(_) => Ok(()),
        }
    }

    fn ack(&mut self, sid: SessionId, id: TaskId) -> Result<Task, QueueError> {
        self.owned(sid, id)?;
        self.ops.acks += 1;
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
        let runat = if delay == 0 {
            self.make_ready(id);
            0
        } else {
            self.make_waiting(id, now + delay);
            now + delay
        };
        self.ops.releases += 1;
        self.events.push(Event::Released { id, runat });
        Ok(self.tasks[&id].task())
    }

    fn release_session(&mut self, sid: SessionId) -> usize {
        let ids = self.sessions.get(&sid).cloned().unwrap_or_default();
        for &id in &ids {
            self.make_ready(id);
            self.ops.auto_released += 1;
            self.events.push(Event::AutoReleased { id });
        }
        ids.len()
    }

    fn release_all_taken(&mut self) -> usize {
        let mut n = 0;
        while let Some(id) = self.first_by_pri_id(Status::Taken) {
            self.make_ready(id);
            self.ops.auto_released += 1;
            self.events.push(Event::AutoReleased { id });
            n += 1;
        }
        n
    }

    fn advance(&mut self, now: Micros, budget: usize) -> (usize, Option<Micros>) {
        let mut processed = 0;
        while processed < budget {
            let Some((at, id, kind)) = self.next_deadline() else {
                break;
            };
            if at > now {
                break;
            }
            match kind {
                0 => {
                    self.remove(id);
                    self.ops.expired += 1;
                    self.events.push(Event::Expired { id });
                }
                1 => {
                    self.make_ready(id);
                    self.ops.promoted += 1;
                    self.events.push(Event::Promoted { id });
                }
                _ => {
                    self.make_ready(id);
                    self.ops.ttr_returned += 1;
                    self.events.push(Event::TtrReturned { id });
                }
            }
            processed += 1;
        }
        (processed, self.next_deadline().map(|d| d.0))
    }

    /// An id picked by `which`: usually a live one, sometimes one that does not exist.
    fn pick(&self, which: usize) -> TaskId {
        let n = self.tasks.len();
        if which % (n + 1) == n {
            self.last_id + 1 + (which % 3) as u64
        } else {
            *self.tasks.keys().nth(which % (n + 1)).unwrap()
        }
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

/// Rebuilds the queue the way recovery does: every task from a snapshot (`iter`), the last
/// id, then `release_all_taken`.
fn restart(q: &Queue) -> (Queue, usize) {
    let mut fresh = Queue::new();
    fresh.set_journal(true);
    for t in q.iter() {
        fresh
            .restore_in(
                t.tube,
                RestoredTask {
                    id: t.id,
                    status: t.status,
                    runat: t.runat,
                    pri: t.pri,
                    ttl: t.ttl,
                    ttr: t.ttr,
                    created: t.created,
                    data: t.data.into(),
                },
                t.utube,
                t.deliveries,
            )
            .unwrap();
    }
    fresh.set_last_id(q.last_id());
    fresh.check_invariants();
    let n = fresh.release_all_taken();
    (fresh, n)
}

fn compare(q: &mut Queue, m: &mut Model, step: usize, op: &Op) {
    q.check_invariants();
    let events: Vec<Event> = q.drain_events().collect();
    assert_eq!(
        events,
        std::mem::take(&mut m.events),
        "events after step {step} {op:?}"
    );
    assert_eq!(q.stats(), m.stats(), "stats after step {step} {op:?}");
    assert_eq!(
        q.next_deadline(),
        m.next_deadline().map(|d| d.0),
        "deadline at step {step}"
    );
    assert_eq!(q.last_id(), m.last_id);
    assert_eq!(q.len(), m.tasks.len());
    let mut all: Vec<Task> = q.iter().map(|t| t.to_task()).collect();
    all.sort_by_key(|t| t.id);
    let want: Vec<Task> = m.tasks.values().map(MTask::task).collect();
    assert_eq!(all, want, "tasks after step {step} {op:?}");
    for t in m.tasks.values() {
        assert_eq!(q.get(t.id).map(|r| r.to_task()), Some(t.task()));
    }
    assert!(q.get(m.last_id + 1).is_none());
}

fn run(ops: &[Op]) {
    let mut q = Queue::new();
    q.set_journal(true);
    let mut m = Model::default();
    let mut now = T0;
    for (step, op) in ops.iter().enumerate() {
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
                let got = q.put(now, data.clone().into(), o).to_task();
                assert_eq!(got, m.put(now, data, o), "put at step {step}");
            }
            Op::Take { sid } => {
                let got = q.take(now, sid).map(|t| t.to_task());
                assert_eq!(got, m.take(now, sid), "take at step {step}");
            }
            Op::Ack { sid, which } => {
                let id = m.pick(which);
                assert_eq!(
                    q.ack(now, sid, id),
                    m.ack(sid, id),
                    "ack {id} at step {step}"
                );
            }
            Op::Release { sid, which, delay } => {
                let id = m.pick(which);
                let got = q.release(now, sid, id, delay).map(|t| t.to_task());
                assert_eq!(
                    got,
                    m.release(now, sid, id, delay),
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
            Op::Tick { dt } => now += dt,
            Op::Advance { dt, budget } => {
                now += dt;
                let adv = q.advance(now, budget);
                let (processed, next) = m.advance(now, budget);
                assert_eq!(
                    (adv.processed, adv.next_deadline),
                    (processed, next),
                    "step {step}"
                );
                assert!(processed == budget || next.is_none_or(|d| d > now));
            }
            Op::RestoreStatus { which, status, dt } => {
                let id = m.pick(which);
                let want = if m.tasks.contains_key(&id) {
                    match status {
                        Status::Ready => m.make_ready(id),
                        Status::Waiting => m.make_waiting(id, now + dt),
                        Status::Taken => m.make_taken(id, 0, None),
                        Status::Buried => unreachable!(),
                    }
                    Ok(())
                } else {
                    Err(QueueError::NotFound(id))
                };
                assert_eq!(q.restore_status(id, status, now + dt), want, "step {step}");
            }
            Op::RestoreRemove { which } => {
                let id = m.pick(which);
                let want = m.tasks.contains_key(&id).then(|| m.remove(id));
                assert_eq!(q.restore_remove(id), want, "step {step}");
            }
            Op::Restart => {
                let (fresh, n) = restart(&q);
                q = fresh;
                m.ops = Stats::default();
                assert_eq!(n, m.release_all_taken(), "restart at step {step}");
            }
        }
        compare(&mut q, &mut m, step, op);
    }
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
