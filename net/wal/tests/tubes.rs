//! Tubes through the WAL and snapshots: every tube event is logged and recovered (tubes and
//! their options, buried tasks, utube keys, delivery counts, dedup keys; a dropped tube stays
//! dropped), with the process dying at every write; the beanstalk front-end's calls (kick_task,
//! kick_delayed, bury_taken with a new pri, touch_ttr) likewise; a snapshot walked while tubes
//! are created, dropped and truncated; each tube's numbering through restarts and snapshots;
//! and the format versions: a version-1 data directory is read, a version-3 one (global ids)
//! keeps its ids and numbers its tubes' new tasks above them, an unknown version is refused
//! with an error that says so.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use tarq_engine::{
    id_number, task_id, Micros, PutOptions, PutOutcome, Queue, ReleaseOptions, RestoredTask,
    Status, TaskId, TubeInfo, TubeIx, TubeNumbers, TubeOptions, TubePut, TubeType,
};
use tarq_wal::format::{self, Kind, SNAP_MAGIC, WAL_MAGIC};
use tarq_wal::{Crash, MemStorage, RecoveryReport, Storage, Wal, WalConfig, WalError, WalMode};

const WAIT: Duration = Duration::from_secs(20);
const SEC: Micros = 1_000_000;
const START: Micros = 1_700_000_000 * SEC;

fn cfg_in(mode: WalMode) -> WalConfig {
    WalConfig {
        mode,
        segment_bytes: 2000,
        snapshot_every_bytes: 0,
        snapshot_interval: None,
        keep_snapshots: 2,
        force_recovery: false,
        replica: false,
        loop_cpu: None,
    }
}

fn try_open(storage: &MemStorage) -> Result<(Wal, Queue, RecoveryReport), WalError> {
    try_open_in(storage, WalMode::Write)
}

fn try_open_in(
    storage: &MemStorage,
    mode: WalMode,
) -> Result<(Wal, Queue, RecoveryReport), WalError> {
    let storage: Arc<dyn Storage> = Arc::new(storage.clone());
    Wal::open(storage, cfg_in(mode))
}

fn open(storage: &MemStorage) -> (Wal, Queue, RecoveryReport) {
    try_open(storage).unwrap_or_else(|e| panic!("recovery failed: {e}"))
}

/// Everything durable about the queue, as text lines sorted: tubes with type and options,
/// tasks with tube, status (taken ones as recovery returns them), times, delivery count,
/// utube key and payload, and the dedup keys live at `now`.
fn model(q: &Queue, now: Micros) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for t in q.tubes() {
        out.insert(format!("tube {} {} {} {:?}", t.ix, t.name, t.kind, t.opts));
        for (key, id, expires) in q.dedup_entries(t.ix).filter(|e| e.2 > now) {
            out.insert(format!("dedup {} {key:?} {id} {expires}", t.ix));
        }
    }
    for t in q.iter() {
        let max = q.tube_info(t.tube).expect("live tube").opts.max_deliveries;
        let mut counts = t.counts;
        let (status, runat) = match t.status {
            Status::Taken if max > 0 && t.deliveries >= max => {
                // Recovery's return past max_deliveries buries it, and counts the bury.
                counts.buries = counts.buries.saturating_add(1);
                (Status::Buried, 0)
            }
            Status::Taken => (Status::Ready, 0),
            s => (s, t.runat),
        };
        out.insert(format!(
            "task {} tube {} {status:?} {runat} pri {} ttl {:?} ttr {:?} created {} deliveries {} utube {:?} counts {counts:?} data {:?}",
            t.id, t.tube, t.pri, t.ttl, t.ttr, t.created, t.deliveries, t.utube, t.data
        ));
    }
    out
}

/// A deterministic workload over the tube API: tubes of every type created, dropped and
/// truncated; puts with utube and dedup keys; takes, acks, releases with options, touches,
/// buries, kicks, deletes, release_all; the beanstalk calls (kick_task, kick_delayed,
/// bury_taken, touch_ttr); time passing.
struct Driver {
    rng: u64,
    now: Micros,
    n: u64,
}

const SESSIONS: u64 = 3;

impl Driver {
    fn new(seed: u64) -> Self {
        Driver {
            rng: seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1,
            now: START,
            n: 0,
        }
    }

    fn next(&mut self, below: u64) -> u64 {
        self.rng ^= self.rng << 13;
        self.rng ^= self.rng >> 7;
        self.rng ^= self.rng << 17;
        self.rng % below
    }

    fn pick_tube(&mut self, q: &Queue) -> TubeIx {
        let tubes: Vec<TubeIx> = q.tubes().map(|t| t.ix).collect();
        tubes[self.next(tubes.len() as u64) as usize]
    }

    fn task_of(&mut self, q: &Queue, tube: TubeIx, status: Option<Status>) -> Option<(u64, u64)> {
        let ids: Vec<(u64, u64)> = q
            .iter()
            .filter(|t| t.tube == tube && status.is_none_or(|s| t.status == s))
            .map(|t| (t.id, t.owner.unwrap_or(0)))
            .collect();
        (!ids.is_empty()).then(|| ids[self.next(ids.len() as u64) as usize])
    }

    fn create(&mut self, q: &mut Queue) {
        self.n += 1;
        let kinds = [
            TubeType::Fifo,
            TubeType::FifoTtl,
            TubeType::LimFifoTtl,
            TubeType::Utube,
            TubeType::UtubeTtl,
        ];
        let kind = kinds[self.next(5) as usize];
        let opts = TubeOptions {
            ttl: (self.next(3) == 0).then(|| (5 + self.next(10)) * SEC),
            ttr: (self.next(3) == 0).then(|| (1 + self.next(3)) * SEC),
            pri: self.next(3) as i64,
            capacity: if kind == TubeType::LimFifoTtl { 20 } else { 0 },
            max_deliveries: self.next(3) as u16,
            dedup_window: if self.next(2) == 0 { 5 * SEC } else { 0 },
            temporary: false,
            // From the create count, not the generator: the workload stays as it was.
            on_demand: self.n.is_multiple_of(4),
            ..TubeOptions::default()
        };
        let _ = q.create_tube(&format!("t{}", self.n), kind, opts);
    }

    fn put(&mut self, q: &mut Queue, tube: TubeIx) {
        self.n += 1;
        let utube = format!("u{}", self.next(3));
        let dedup = format!("d{}", self.next(6));
        let p = TubePut {
            delay: if self.next(4) == 0 { SEC } else { 0 },
            ttl: (self.next(4) == 0).then(|| (2 + self.next(8)) * SEC),
            ttr: (self.next(4) == 0).then(|| (1 + self.next(3)) * SEC),
            pri: (self.next(2) == 0).then(|| self.next(3) as i64),
            utube: utube.as_bytes(),
            dedup_key: (self.next(2) == 0).then_some(dedup.as_bytes()),
        };
        let pad = "x".repeat(self.next(30) as usize);
        let data = format!("task {} {pad}", self.n);
        let _ = q.put_in(self.now, tube, data.into_bytes(), p);
    }

    /// One loop turn's worth of calls.
    fn turn(&mut self, q: &mut Queue) {
        for _ in 0..1 + self.next(4) {
            let tube = self.pick_tube(q);
            match self.next(24) {
                0 => self.create(q),
                1 if self.next(3) == 0 => {
                    let _ = q.drop_tube(tube);
                }
                2 if self.next(4) == 0 => {
                    let _ = q.truncate(tube);
                }
                3..=6 => self.put(q, tube),
                7 | 8 => {
                    let _ = q.take_from(self.now, tube, 1 + self.next(SESSIONS));
                }
                9 | 10 => {
                    if let Some((id, owner)) = self.task_of(q, tube, Some(Status::Taken)) {
                        q.ack_in(tube, owner, id).expect("owner acks");
                    }
                }
                11 => {
                    if let Some((id, owner)) = self.task_of(q, tube, Some(Status::Taken)) {
                        let opts = ReleaseOptions {
                            delay: if self.next(2) == 0 { SEC } else { 0 },
                            pri: (self.next(2) == 0).then_some(7),
                            ttl: (self.next(2) == 0).then_some(20 * SEC),
                        };
                        q.release_in(self.now, tube, owner, id, opts)
                            .expect("owner releases");
                    }
                }
                12 => {
                    if let Some((id, owner)) = self.task_of(q, tube, Some(Status::Taken)) {
                        let _ = q.touch(tube, owner, id, Some(SEC));
                    }
                }
                13 => {
                    if let Some((id, _)) = self.task_of(q, tube, None) {
                        q.bury(tube, id).expect("task of the tube");
                    }
                }
                14 => {
                    let _ = q.kick(tube, 1 + self.next(3));
                }
                15 => {
                    if let Some((id, _)) = self.task_of(q, tube, None) {
                        q.delete(tube, id).expect("task of the tube");
                    }
                }
                16 if self.next(4) == 0 => {
                    let _ = q.release_all(tube);
                }
                17 => {
                    q.release_session(1 + self.next(SESSIONS));
                }
                18 => {
                    if let Some((id, _)) = self.task_of(q, tube, None) {
                        let _ = q.kick_task(self.now, id);
                    }
                }
                19 => {
                    let _ = q.kick_delayed(self.now, tube, 1 + self.next(3));
                }
                20 => {
                    if let Some((id, owner)) = self.task_of(q, tube, Some(Status::Taken)) {
                        let pri = self.next(4) as i64;
                        q.bury_taken(owner, id, pri).expect("owner buries");
                    }
                }
                21 => {
                    if let Some((id, owner)) = self.task_of(q, tube, Some(Status::Taken)) {
                        q.touch_ttr(self.now, owner, id).expect("owner touches");
                    }
                }
                _ => {
                    self.now += self.next(1500) * 1000;
                    q.advance(self.now, 64);
                }
            }
        }
    }
}

const TURNS: usize = 70;
const SNAPSHOT_AT: usize = 40;

/// The workload: models after every turn (with the time), and the last acknowledged turn.
fn run(storage: &MemStorage, mode: WalMode, seed: u64) -> (Vec<(Micros, BTreeSet<String>)>, usize) {
    let (mut wal, mut q, _) =
        try_open_in(storage, mode).unwrap_or_else(|e| panic!("recovery failed: {e}"));
    let mut d = Driver::new(seed);
    let mut models = vec![(d.now, model(&q, d.now))];
    let mut acked = 0;
    for turn in 1..=TURNS {
        d.turn(&mut q);
        models.push((d.now, model(&q, d.now)));
        wal.append_turn(&mut q);
        let batch = wal.submit();
        if mode == WalMode::Fsync && wal.flush(&mut q, WAIT).is_err() {
            break;
        }
        wal.poll(&mut q);
        if wal.check_writable().is_err() {
            break;
        }
        assert!(wal.durable_upto() >= batch, "durable after the turn");
        acked = turn;
        if turn == SNAPSHOT_AT && wal.snapshot_now(&mut q, WAIT).is_err() {
            break;
        }
    }
    (models, acked)
}

fn check_recovered(
    storage: &MemStorage,
    models: &[(Micros, BTreeSet<String>)],
    acked: usize,
    what: &str,
) {
    let (_wal, q, report) = open(storage);
    q.check_invariants();
    let found = (acked..models.len()).find(|&i| model(&q, models[i].0) == models[i].1);
    if found.is_none() {
        let got = model(&q, models[acked].0);
        let want = &models[acked].1;
        let missing: Vec<_> = want.difference(&got).take(5).collect();
        let extra: Vec<_> = got.difference(want).take(5).collect();
        panic!(
            "{what}: the recovered queue matches no state from the acknowledged turn {acked} on \
             (report {report:?}); against that turn, missing {missing:#?}, extra {extra:#?}"
        );
    }
}

#[test]
fn tubes_survive_a_crash_at_every_write() {
    crash_everywhere(WalMode::Write, |_| Crash::Process, &[0, 30, usize::MAX]);
}

#[test]
fn tubes_survive_a_power_loss_at_every_write_in_fsync_mode() {
    // Only synced bytes survive, plus a torn prefix of the rest.
    crash_everywhere(
        WalMode::Fsync,
        |keep| Crash::Power { torn_keep: keep },
        &[0, 30, usize::MAX],
    );
}

fn crash_everywhere(mode: WalMode, crash_of: impl Fn(usize) -> Crash, keeps: &[usize]) {
    let clean = MemStorage::new();
    let (models, acked) = run(&clean, mode, 11);
    assert_eq!(acked, TURNS, "the clean run acknowledges every turn");
    let last = &models[TURNS].1;
    for what in ["tube ", "Buried", "utube Some", "dedup ", "deliveries 1"] {
        assert!(
            last.iter().any(|l| l.contains(what)),
            "the workload leaves something with {what:?} to recover: {last:#?}"
        );
    }
    check_recovered(&clean, &models, TURNS, "clean shutdown");
    let writes = clean.writes();
    for n in 1..=writes {
        for &keep in keeps {
            let storage = MemStorage::new();
            storage.die_at_write(n, keep);
            let (models, acked) = run(&storage, mode, 11);
            storage.crash(crash_of(keep));
            let what = format!("{mode} mode, died at write {n} keeping {keep}");
            check_recovered(&storage, &models, acked, &what);
        }
    }
}

/// The beanstalk calls, turn by turn: a tube `bs` and `default` with ready, delayed and
/// buried tasks; bury_taken with a new pri (an `Updated` and a `Buried`) and with the pri it
/// has; kick_task of a buried and of a delayed task; kick_delayed in both tubes; touch_ttr
/// (which logs nothing); time passing. Returns whether the turn did anything.
fn beanstalk_turn(q: &mut Queue, turn: usize, now: Micros) -> bool {
    let bs = q.tube_ix("bs");
    // The k-th put into `bs` (index 1), as the comments count them: numbered from 0 there.
    let j = |k: u64| tarq_engine::task_id(1, k - 1);
    let put = |q: &mut Queue, tube, pri, delay| {
        let p = TubePut {
            pri: Some(pri),
            delay,
            ..TubePut::default()
        };
        let data = format!("job pri {pri} delay {delay}").into_bytes();
        match q.put_in(now, tube, data, p).expect("put") {
            tarq_engine::PutOutcome::Created(t) => t.id,
            other => panic!("a new task, got {other:?}"),
        }
    };
    match turn {
        1 => {
            let ttr = TubeOptions {
                ttr: Some(30 * SEC),
                ..TubeOptions::default()
            };
            let bs = q.create_tube("bs", TubeType::FifoTtl, ttr).expect("new");
            put(q, bs, 5, 0); // 1: taken, buried with pri 2000, kicked
            put(q, bs, 5, 60 * SEC); // 2: kick_task from delayed
            put(q, bs, 5, 30 * SEC); // 3: kick_delayed (due first), taken, buried with pri 7
            put(q, bs, 5, 90 * SEC); // 4: stays delayed
            put(q, bs, 0, 0); // 5: taken, buried with its own pri
            let o = PutOptions {
                delay: 10 * SEC,
                ..PutOptions::default()
            };
            q.put(now, b"default, delayed".to_vec(), o); // 6 (`default`'s 1): kick_delayed there
        }
        2 => {
            let bs = bs.expect("bs");
            assert_eq!(
                q.take_from(now, bs, 1).expect("live").map(|t| t.id),
                Some(j(5))
            );
            assert_eq!(
                q.take_from(now, bs, 2).expect("live").map(|t| t.id),
                Some(j(1))
            );
        }
        3 => {
            assert_eq!(q.bury_taken(2, j(1), 2000).expect("held").pri, 2000);
            q.touch_ttr(now, 1, j(5)).expect("held");
        }
        4 => {
            assert_eq!(
                q.bury_taken(1, j(5), 0).expect("held").status,
                Status::Buried
            );
        }
        5 => {
            assert_eq!(
                q.kick_task(now, j(1)).expect("buried").status,
                Status::Ready
            );
            assert_eq!(
                q.kick_task(now, j(2)).expect("delayed").status,
                Status::Ready
            );
        }
        6 => {
            assert_eq!(q.kick_delayed(now, bs.expect("bs"), 1), Ok(1));
            assert_eq!(q.kick_delayed(now, 0, 5), Ok(1));
        }
        7 => {
            // Task 1 (pri 2000) now goes after task 3 (pri 5).
            let bs = bs.expect("bs");
            let t = q.take_from(now, bs, 1).expect("live").expect("ready");
            assert_eq!(t.id, j(2));
            let t = q.take_from(now, bs, 1).expect("live").expect("ready");
            assert_eq!(t.id, j(3));
            q.touch_ttr(now, 1, j(3)).expect("held");
            assert_eq!(q.bury_taken(1, j(3), 7).expect("held").pri, 7);
        }
        8 => {
            q.advance(now, 64);
        }
        _ => return false,
    }
    true
}

const BEANSTALK_SNAPSHOT_AT: usize = 4;

/// `run` for the beanstalk script: models after every turn, the last acknowledged turn.
fn run_beanstalk(storage: &MemStorage, mode: WalMode) -> (Vec<(Micros, BTreeSet<String>)>, usize) {
    let (mut wal, mut q, _) =
        try_open_in(storage, mode).unwrap_or_else(|e| panic!("recovery failed: {e}"));
    let mut now = START;
    let mut models = vec![(now, model(&q, now))];
    let mut acked = 0;
    for turn in 1.. {
        now += SEC;
        if !beanstalk_turn(&mut q, turn, now) {
            break;
        }
        q.check_invariants();
        models.push((now, model(&q, now)));
        wal.append_turn(&mut q);
        let batch = wal.submit();
        if mode == WalMode::Fsync && wal.flush(&mut q, WAIT).is_err() {
            break;
        }
        wal.poll(&mut q);
        if wal.check_writable().is_err() {
            break;
        }
        assert!(wal.durable_upto() >= batch, "durable after the turn");
        acked = turn;
        if turn == BEANSTALK_SNAPSHOT_AT && wal.snapshot_now(&mut q, WAIT).is_err() {
            break;
        }
    }
    (models, acked)
}

#[test]
fn beanstalk_kicks_and_buries_survive_a_restart() {
    let storage = MemStorage::new();
    let (models, acked) = run_beanstalk(&storage, WalMode::Write);
    assert_eq!(acked, models.len() - 1, "every turn acknowledged");
    let (_wal, q, _) = open(&storage);
    q.check_invariants();
    // The k-th put into `bs` (1..=5), or `default`'s put (6).
    let state = |k: u64| {
        let id = if k == 6 {
            1
        } else {
            tarq_engine::task_id(1, k - 1)
        };
        let t = q.get(id).expect("live");
        (t.status, t.runat, t.pri)
    };
    assert_eq!(
        state(1),
        (Status::Ready, 0, 2000),
        "bury_taken's pri, then kick_task"
    );
    assert_eq!(
        state(2),
        (Status::Ready, 0, 5),
        "kicked from delayed, then taken"
    );
    assert_eq!(
        state(3),
        (Status::Buried, 0, 7),
        "kick_delayed, then bury_taken"
    );
    assert_eq!(state(4), (Status::Waiting, START + SEC + 90 * SEC, 5));
    assert_eq!(state(5), (Status::Buried, 0, 0));
    assert_eq!(state(6), (Status::Ready, 0, 0), "kick_delayed in default");
    let last = models.last().expect("turns");
    assert_eq!(model(&q, last.0), last.1);
    let bs = q.tube_ix("bs").expect("recovered");
    assert_eq!(
        q.peek_first(bs, Status::Ready).expect("live").map(|t| t.id),
        Some(tarq_engine::task_id(bs, 1))
    );
    assert_eq!(
        q.ready_urgent(bs),
        Ok(1),
        "task 2 (pri 5); task 1 has pri 2000"
    );
}

#[test]
fn beanstalk_calls_survive_a_crash_at_every_write() {
    beanstalk_crash_everywhere(WalMode::Write, |_| Crash::Process);
}

#[test]
fn beanstalk_calls_survive_a_power_loss_at_every_write_in_fsync_mode() {
    beanstalk_crash_everywhere(WalMode::Fsync, |keep| Crash::Power { torn_keep: keep });
}

fn beanstalk_crash_everywhere(mode: WalMode, crash_of: impl Fn(usize) -> Crash) {
    let clean = MemStorage::new();
    let (models, acked) = run_beanstalk(&clean, mode);
    check_recovered(&clean, &models, acked, "clean shutdown");
    let writes = clean.writes();
    assert!(writes > 8, "a write per turn at least: {writes}");
    for n in 1..=writes {
        for keep in [0, 30, usize::MAX] {
            let storage = MemStorage::new();
            storage.die_at_write(n, keep);
            let (models, acked) = run_beanstalk(&storage, mode);
            storage.crash(crash_of(keep));
            let what = format!("{mode} mode, died at write {n} keeping {keep}");
            check_recovered(&storage, &models, acked, &what);
        }
    }
}

#[test]
fn a_dropped_tube_stays_dropped_and_its_name_can_be_reused() {
    let storage = MemStorage::new();
    let (mut wal, mut q, _) = open(&storage);
    let a = q
        .create_tube("a", TubeType::Utube, TubeOptions::default())
        .expect("new");
    let p = TubePut {
        utube: b"k",
        ..TubePut::default()
    };
    q.put_in(START, a, b"x".to_vec(), p).expect("put");
    wal.flush(&mut q, WAIT).expect("flushed");
    q.drop_tube(a).expect("dropped");
    wal.flush(&mut q, WAIT).expect("flushed");
    drop(wal);
    let (mut wal, mut q, _) = open(&storage);
    assert_eq!(q.tube_ix("a"), None, "a dropped tube stays dropped");
    assert_eq!(q.len(), 0);
    // Created and dropped within one turn, then created again with another type: only the
    // last one is there after a restart.
    let b = q
        .create_tube("b", TubeType::Fifo, TubeOptions::default())
        .expect("new");
    q.put_in(START, b, b"y".to_vec(), TubePut::default())
        .expect("put");
    q.drop_tube(b).expect("dropped");
    let b2 = q
        .create_tube("b", TubeType::FifoTtl, TubeOptions::default())
        .expect("new");
    wal.flush(&mut q, WAIT).expect("flushed");
    let want = model(&q, START);
    drop(wal);
    let (_wal, q, _) = open(&storage);
    assert_eq!(q.tube_info(b2).map(|t| t.kind), Some(TubeType::FifoTtl));
    assert_eq!(model(&q, START), want);
}

/// Enough tasks that the walk takes many turns (it encodes at most 1024 a turn).
const BACKLOG: usize = 5000;

#[test]
fn a_snapshot_walked_while_tubes_change_recovers_exactly() {
    let storage = MemStorage::new();
    let (mut wal, mut q, _) = open(&storage);
    let mut d = Driver::new(5);
    for _ in 0..6 {
        d.create(&mut q);
    }
    for i in 0..BACKLOG {
        let tube = d.pick_tube(&q);
        d.put(&mut q, tube);
        if i % 100 == 0 {
            wal.append_turn(&mut q);
            wal.submit();
        }
    }
    wal.flush(&mut q, WAIT).expect("flushed");
    assert!(wal.request_snapshot());
    let mut turns = 0;
    while wal.snapshot_running() || turns == 0 {
        d.turn(&mut q);
        wal.append_turn(&mut q);
        wal.submit();
        wal.poll(&mut q);
        turns += 1;
        assert!(turns < 100_000, "the snapshot ends");
        if turns % 64 == 0 {
            std::thread::yield_now();
        }
    }
    assert!(
        wal.stats().snapshot_walk_steps > 2,
        "the walk spanned turns"
    );
    assert_eq!(wal.stats().snapshots, 1);
    for _ in 0..20 {
        d.turn(&mut q);
        wal.append_turn(&mut q);
        wal.submit();
    }
    wal.flush(&mut q, WAIT).expect("flushed");
    let want = model(&q, d.now);
    drop(wal);
    let (_wal, q, report) = open(&storage);
    assert!(report.snapshot.is_some(), "recovered from the snapshot");
    assert_eq!(model(&q, d.now), want);
}

fn v1_task(buf: &mut Vec<u8>, seq: u64, id: u64, data: &[u8]) {
    let mut q = Queue::new();
    q.restore(tarq_engine::RestoredTask {
        id,
        status: Status::Ready,
        runat: 0,
        pri: 3,
        ttl: Some(60 * SEC),
        ttr: None,
        created: START,
        data: data.into(),
    })
    .expect("restored");
    let at = format::begin_record(buf, seq, Kind::Put);
    format::encode_task_v1(buf, &q.get(id).expect("live"));
    format::end_record(buf, at).expect("small");
}

fn commit(buf: &mut Vec<u8>, seq: u64) {
    let at = format::begin_record(buf, seq, Kind::Commit);
    format::end_small_record(buf, at);
}

/// A data directory as the format before tubes wrote it: a snapshot of tasks 1 and 2 at
/// position 2, then a segment with a put of task 3 and a take of task 1 (v1 status record).
fn write_v1_dir(storage: &MemStorage) {
    let snap = v1_snapshot(&[(1, b"one"), (2, b"two")]);
    storage.put_file(&format::snapshot_name(2), snap);

    let mut seg = format::file_header_version(WAL_MAGIC, 1, 1).to_vec();
    // Records 1..=2 are covered by the snapshot.
    v1_task(&mut seg, 1, 1, b"one");
    commit(&mut seg, 2);
    v1_task(&mut seg, 3, 3, b"three");
    let at = format::begin_record(&mut seg, 4, Kind::Status);
    seg.extend_from_slice(&1u64.to_le_bytes());
    seg.push(1); // Taken
    seg.extend_from_slice(&0u64.to_le_bytes());
    format::end_small_record(&mut seg, at);
    commit(&mut seg, 5);
    storage.put_file(&format::segment_name(1), seg);
}

/// A version-1 snapshot at position 2 of these tasks (Ready, in `default`), in this order.
fn v1_snapshot(tasks: &[(u64, &[u8])]) -> Vec<u8> {
    let mut snap = format::file_header_version(SNAP_MAGIC, 1, 2).to_vec();
    let at = format::begin_record(&mut snap, 1, Kind::SnapTasks);
    snap.extend_from_slice(&(tasks.len() as u32).to_le_bytes());
    for &(id, data) in tasks {
        let mut q = Queue::new();
        q.restore(tarq_engine::RestoredTask {
            id,
            status: Status::Ready,
            runat: 0,
            pri: 0,
            ttl: None,
            ttr: None,
            created: START,
            data: data.into(),
        })
        .expect("restored");
        format::encode_task_v1(&mut snap, &q.get(id).expect("live"));
    }
    format::end_record(&mut snap, at).expect("small");
    let at = format::begin_record(&mut snap, 2, Kind::SnapEnd);
    let last_id = tasks.iter().map(|t| t.0).max().unwrap_or(0);
    for v in [2u64, last_id, tasks.len() as u64] {
        snap.extend_from_slice(&v.to_le_bytes());
    }
    format::end_small_record(&mut snap, at);
    snap
}

#[test]
fn a_snapshot_listing_an_id_twice_is_refused_and_recovery_replays_the_wal() {
    // The load looks no id up as it restores (its reading thread checks them all): a
    // snapshot that is sound record by record but lists a task twice must still be refused.
    let storage = MemStorage::new();
    write_v1_dir(&storage);
    let twice = v1_snapshot(&[(2, b"two"), (1, b"one"), (2, b"two")]);
    storage.put_file(&format::snapshot_name(2), twice);
    let name = format::snapshot_name(2);
    match tarq_wal::snapshot::load(&storage, &name) {
        Err(tarq_wal::snapshot::LoadError::Damaged(e)) => {
            assert!(e.contains("task 2 appears twice"), "{e}")
        }
        other => panic!(
            "a repeated id must be refused: {:?}",
            other.map(|(_, l)| l.tasks)
        ),
    }
    let (_wal, q, report) = open(&storage);
    assert!(report.snapshot.is_none(), "the snapshot is not used");
    let mut ids: Vec<u64> = q.iter().map(|t| t.id).collect();
    ids.sort_unstable();
    assert_eq!(ids, [1, 3], "the WAL from its start, without the snapshot");
}

#[test]
fn a_version_1_data_directory_is_read_into_the_default_tube_and_kept_readable() {
    let storage = MemStorage::new();
    write_v1_dir(&storage);
    let (mut wal, mut q, report) = open(&storage);
    assert!(report.torn.is_none(), "nothing cut: {report:?}");
    let ids: Vec<(u64, TubeIx, Status)> = {
        let mut v: Vec<_> = q.iter().map(|t| (t.id, t.tube, t.status)).collect();
        v.sort_unstable_by_key(|t| t.0);
        v
    };
    assert_eq!(
        ids,
        [
            (1, 0, Status::Ready),
            (2, 0, Status::Ready),
            (3, 0, Status::Ready)
        ],
        "tasks of the old format land in `default`; the taken one comes back ready"
    );
    assert_eq!(q.get(3).expect("live").pri, 3);
    // New records go to a version-2 segment beside the old one; both are read again.
    let id = q.put(START, b"four".to_vec(), PutOptions::default()).id;
    wal.flush(&mut q, WAIT).expect("flushed");
    let want = model(&q, START);
    drop(wal);
    let (mut wal, mut q, _) = open(&storage);
    assert_eq!(model(&q, START), want);
    assert_eq!(q.get(id).expect("live").data, b"four");
    // And a snapshot in the new format replaces the old one.
    wal.snapshot_now(&mut q, WAIT).expect("snapshot");
    drop(wal);
    let (_wal, q, _) = open(&storage);
    assert_eq!(model(&q, START), want);
}

#[test]
fn an_unknown_format_version_is_refused_with_an_error_that_says_so() {
    // A segment of a later format.
    let storage = MemStorage::new();
    let mut seg = format::file_header_version(WAL_MAGIC, 99, 1).to_vec();
    commit(&mut seg, 1);
    storage.put_file(&format::segment_name(1), seg);
    match try_open(&storage) {
        Err(WalError::UnsupportedFormat { file, version }) => {
            assert_eq!((file.as_str(), version), ("00000000000000000001.xlog", 99));
        }
        other => panic!("expected UnsupportedFormat, got {:?}", other.map(|x| x.2)),
    }
    let text = try_open(&storage).err().expect("refused").to_string();
    assert!(
        text.contains("version 99")
            && text.contains(&format!("reads versions 1..={}", format::FORMAT_VERSION)),
        "{text}"
    );

    // A snapshot of a later format is not taken for damage (which would fall back to an
    // older snapshot and misread the WAL after it): the start stops.
    let storage = MemStorage::new();
    let (mut wal, mut q, _) = open(&storage);
    q.put(START, b"a".to_vec(), PutOptions::default());
    let name = wal.snapshot_now(&mut q, WAIT).expect("snapshot");
    drop(wal);
    let mut bytes = storage.contents(&name).expect("written");
    let later = format::FORMAT_VERSION + 1;
    bytes[..32].copy_from_slice(&format::file_header_version(SNAP_MAGIC, later, 1));
    storage.put_file(&name, bytes);
    match try_open(&storage) {
        Err(WalError::UnsupportedFormat { file, version }) if version == later => {
            assert_eq!(file, name)
        }
        other => panic!("expected UnsupportedFormat, got {:?}", other.map(|x| x.2)),
    }
}

/// A data directory of format 3 (before per-task counters) opens, its tasks with no
/// counters; new records carrying counters go beside it in format 4, and the mixed directory
/// opens again, before and after a snapshot.
#[test]
fn a_version_3_data_directory_opens_and_takes_counters_from_then_on() {
    let storage = MemStorage::new();
    write_v3_dir(&storage);
    let (mut wal, mut q, report) = open(&storage);
    assert!(report.snapshot.is_some(), "{report:?}");
    assert_eq!(q.len(), 5);
    assert!(q.iter().all(|t| t.counts.is_zero()));
    // Counters from now on, in format-4 records beside the format-3 ones.
    let id = q.take(START, 1).expect("ready").id;
    q.release(START, 1, id, 0).expect("held");
    q.bury(tarq_engine::DEFAULT_TUBE, id).expect("live");
    wal.flush(&mut q, WAIT).expect("flushed");
    let want = model(&q, START);
    assert_eq!(q.get(id).expect("live").counts.releases, 1);
    drop(wal);
    let (mut wal, mut q, _) = open(&storage);
    assert_eq!(model(&q, START), want);
    wal.snapshot_now(&mut q, WAIT).expect("snapshot");
    drop(wal);
    let (_wal, q, _) = open(&storage);
    assert_eq!(model(&q, START), want);
    let t = q.get(id).expect("live");
    assert_eq!((t.counts.releases, t.counts.buries), (1, 1));
}

/// Format 3: each turn carries its leader's term and the log's history id, a snapshot carries
/// both as of its start, and a restart knows the term of every record it keeps.
#[test]
fn terms_and_the_history_id_survive_restarts_and_snapshots() {
    let storage = MemStorage::new();
    let (mut wal, mut q, _) = open(&storage);
    assert_eq!((wal.history(), wal.last_term()), (0, 0));
    wal.adopt_history(0xfeed);
    wal.adopt_history(0xbeef);
    assert_eq!(wal.history(), 0xfeed, "a log keeps the history it has");
    q.put(START, b"a".to_vec(), PutOptions::default());
    wal.flush(&mut q, WAIT).expect("flushed");
    let first_turn_end = wal.last_seq();
    wal.set_term(7);
    q.put(START, b"b".to_vec(), PutOptions::default());
    wal.flush(&mut q, WAIT).expect("flushed");
    drop(wal);
    let (mut wal, mut q, _) = open(&storage);
    assert_eq!((wal.history(), wal.last_term()), (0xfeed, 7));
    assert_eq!(wal.term_of(first_turn_end), Some(0));
    assert_eq!(wal.term_of(first_turn_end + 1), Some(7));
    assert_eq!(wal.term_of(wal.last_seq() + 1), None, "beyond the log");
    let snap = wal.snapshot_now(&mut q, WAIT).expect("snapshot");
    drop(wal);
    // With the segments gone, the snapshot alone tells the term at its start.
    for name in storage.list().unwrap() {
        if name.ends_with(".xlog") {
            storage.remove(&name).unwrap();
        }
    }
    let (wal, _q, report) = open(&storage);
    assert_eq!(report.snapshot.as_deref(), Some(snap.as_str()));
    let start = format::parse_name(&snap, ".snap").unwrap();
    assert_eq!((wal.history(), wal.last_term()), (0xfeed, 7));
    assert_eq!(wal.term_of(start), Some(7));
    assert_eq!(
        wal.term_of(start - 1),
        None,
        "before the snapshot: not kept"
    );
}

/// A node that led term 3, then followed the primary of term 5, logs no change of its own:
/// closed with term 3 after the primary's records, such a turn makes a log no replica copying
/// it from the start can follow, and its records take sequence numbers the primary gives its
/// own (found by the fault harness: a deposed primary went on letting a moved partition go).
/// The turn is refused, never durable, nothing of it reaches the disk, and a restart has the
/// primary's log whole. A node told it does not lead (`stop_leading`) refuses the same way.
#[test]
fn a_node_that_follows_a_newer_term_logs_no_change_of_its_own() {
    let (primary_storage, follower_storage) = (MemStorage::new(), MemStorage::new());
    let (mut p, mut pq, _) = open(&primary_storage);
    p.set_tap(true);
    p.set_term(5);
    pq.put(START, b"primary's".to_vec(), PutOptions::default());
    p.flush(&mut pq, WAIT).expect("flushed");
    let mut stream = Vec::new();
    p.take_tap(&mut stream);

    for told in [false, true] {
        let (mut w, mut q, _) = open(&follower_storage);
        w.set_term(3);
        if told {
            w.stop_leading();
        }
        w.apply_replicated(&mut q, &stream).expect("applied");
        let held = w.last_seq();
        assert_eq!(w.last_term(), 5);
        q.put(START, b"own".to_vec(), PutOptions::default());
        w.append_turn(&mut q);
        let turn = w.submit();
        assert!(!w.is_durable(turn), "no reply may claim the turn");
        let refused = w.check_writable().expect_err("changes refused from now on");
        assert!(refused.to_string().contains("does not lead"), "{refused}");
        assert_eq!(w.last_seq(), held, "nothing of the turn is logged");
        drop(w);
        let (w, q, _) = open(&follower_storage);
        assert_eq!((w.last_seq(), w.last_term()), (held, 5));
        assert_eq!(
            model(&q, START),
            model(&pq, START),
            "the primary's log, whole"
        );
    }
}

fn put_in(q: &mut Queue, tube: TubeIx, data: &[u8]) -> TaskId {
    match q.put_in(START, tube, data.to_vec(), TubePut::default()) {
        Ok(PutOutcome::Created(t)) => t.id,
        other => panic!("a new task, got {other:?}"),
    }
}

/// A tube created in a turn of its own: no `TubeCreate` of a later turn carries its
/// numbering, so what those turns log must.
fn tube_of_its_own(wal: &mut Wal, q: &mut Queue, opts: TubeOptions) -> TubeIx {
    let t = q.create_tube("q", TubeType::FifoTtl, opts).expect("new");
    wal.flush(q, WAIT).expect("flushed");
    t
}

#[test]
fn a_tubes_numbering_survives_restarts_and_snapshots_after_its_newest_task_is_deleted() {
    let storage = MemStorage::new();
    let (mut wal, mut q, _) = open(&storage);
    let t = tube_of_its_own(&mut wal, &mut q, TubeOptions::default());
    for _ in 0..3 {
        put_in(&mut q, t, b"x");
    }
    q.delete(t, q.task_id_in(t, 2)).expect("live");
    wal.append_turn(&mut q);
    wal.flush(&mut q, WAIT).expect("flushed");
    drop(wal);
    // From the WAL alone: the deleted put still counts.
    let (mut wal, mut q, _) = open(&storage);
    assert_eq!(id_number(put_in(&mut q, t, b"x")), 3);
    q.delete(t, q.task_id_in(t, 3)).expect("live");
    wal.append_turn(&mut q);
    wal.flush(&mut q, WAIT).expect("flushed");
    // From a snapshot taken after the newest went (the WAL before it removed).
    wal.snapshot_now(&mut q, WAIT).expect("snapshot");
    drop(wal);
    let (_wal, mut q, report) = open(&storage);
    assert!(report.snapshot.is_some(), "recovered from the snapshot");
    assert_eq!(report.records, 0, "nothing replayed after it");
    assert!(!report.older_format, "all in the current format");
    assert_eq!(id_number(put_in(&mut q, t, b"x")), 4);
    q.check_invariants();
}

/// A tube entry as formats 2 and 3 wrote it: without its numbering.
fn v3_tube(buf: &mut Vec<u8>, ix: TubeIx, name: &str) {
    let info = TubeInfo {
        ix,
        name,
        kind: TubeType::FifoTtl,
        opts: TubeOptions::default(),
        numbers: TubeNumbers::default(),
    };
    format::encode_tube_v3(buf, &info);
}

/// A task of `tube` in the layout formats 2 to 4 share.
fn v3_task(buf: &mut Vec<u8>, tube: TubeIx, id: TaskId, status: Status) {
    let mut q = Queue::new();
    if tube != 0 {
        q.restore_tube(
            tube,
            "t",
            TubeType::FifoTtl,
            TubeOptions::default(),
            TubeNumbers::default(),
        )
        .expect("tube");
    }
    let task = RestoredTask {
        id,
        status,
        runat: 0,
        pri: 0,
        ttl: None,
        ttr: None,
        created: START,
        data: format!("task {id}").into_bytes().into_boxed_slice(),
    };
    q.restore_in(tube, task, None, 0).expect("restored");
    format::encode_task(buf, &q.get(id).expect("live")).expect("small");
}

/// A data directory as format 3 wrote it, ids from one global counter (9 at the snapshot):
/// a snapshot at position 2 of tube 1 `old` holding tasks 5 (ready) and 7 (buried) and
/// `default` holding 6; then a segment whose one turn creates tube 2 `later`, puts task 10
/// into it and task 11 into `default`.
fn write_v3_dir(storage: &MemStorage) {
    let mut snap = format::file_header_version(SNAP_MAGIC, 3, 2).to_vec();
    let at = format::begin_record(&mut snap, 1, Kind::SnapTubes);
    snap.extend_from_slice(&2u32.to_le_bytes());
    v3_tube(&mut snap, 0, "default");
    v3_tube(&mut snap, 1, "old");
    format::end_record(&mut snap, at).expect("small");
    let at = format::begin_record(&mut snap, 2, Kind::SnapTasks);
    snap.extend_from_slice(&3u32.to_le_bytes());
    v3_task(&mut snap, 1, 5, Status::Ready);
    v3_task(&mut snap, 0, 6, Status::Ready);
    v3_task(&mut snap, 1, 7, Status::Buried);
    format::end_record(&mut snap, at).expect("small");
    let at = format::begin_record(&mut snap, 3, Kind::SnapEnd);
    for v in [2u64, 9, 3, 0] {
        snap.extend_from_slice(&v.to_le_bytes());
    }
    format::encode_commit(&mut snap, 0, 0);
    format::end_small_record(&mut snap, at);
    storage.put_file(&format::snapshot_name(2), snap);

    let mut seg = format::file_header_version(WAL_MAGIC, 3, 3).to_vec();
    let at = format::begin_record(&mut seg, 3, Kind::TubeCreate);
    v3_tube(&mut seg, 2, "later");
    format::end_record(&mut seg, at).expect("small");
    let at = format::begin_record(&mut seg, 4, Kind::Put);
    v3_task(&mut seg, 2, 10, Status::Ready);
    format::end_record(&mut seg, at).expect("small");
    let at = format::begin_record(&mut seg, 5, Kind::Put);
    v3_task(&mut seg, 0, 11, Status::Ready);
    format::end_record(&mut seg, at).expect("small");
    let at = format::begin_record(&mut seg, 6, Kind::Commit);
    format::encode_commit(&mut seg, 0, 0);
    format::end_small_record(&mut seg, at);
    storage.put_file(&format::segment_name(3), seg);
}

/// Where each of the older directory's tasks is and how the tube API reaches it.
fn check_v3_ids(q: &Queue) {
    q.check_invariants();
    for (tube, id) in [(1, 5), (0, 6), (1, 7), (2, 10), (0, 11)] {
        let t = q.get(id).unwrap_or_else(|| panic!("task {id} kept"));
        assert_eq!((t.tube, t.data), (tube, format!("task {id}").as_bytes()));
        assert_eq!(q.task_id_in(tube, id), id, "the tube API's number {id}");
        assert_eq!(q.peek(tube, id).expect("in its tube").id, id);
    }
    assert_eq!(q.get(7).expect("kept").status, Status::Buried);
}

#[test]
fn a_version_3_data_directory_keeps_its_ids_and_numbers_new_tasks_above_them() {
    let storage = MemStorage::new();
    write_v3_dir(&storage);
    let (mut wal, mut q, report) = open(&storage);
    assert!(
        report.snapshot.is_some() && report.torn.is_none(),
        "{report:?}"
    );
    check_v3_ids(&q);
    // `old` goes on above the snapshot's counter (9), though its newest task is 7; `later`,
    // created in the older WAL, above its task 10; `default` above every old id.
    let numbers = |q: &Queue, ix| q.tube_info(ix).expect("live").numbers;
    let old = TubeNumbers {
        next: 10,
        legacy_below: 10,
        first: 0,
    };
    let later = TubeNumbers {
        next: 11,
        legacy_below: 11,
        first: 0,
    };
    assert_eq!((numbers(&q, 1), numbers(&q, 2)), (old, later));
    let a = put_in(&mut q, 1, b"new in old");
    let b = put_in(&mut q, 2, b"new in later");
    let c = q.put(START, b"new seed".to_vec(), PutOptions::default()).id;
    assert_eq!((a, b, c), (task_id(1, 10), task_id(2, 11), 12));
    assert_eq!((q.task_id_in(1, 10), q.task_id_in(2, 11)), (a, b));
    // A number below the mark is an old id: not another tube's task, nor a new one.
    assert!(q.peek(1, q.task_id_in(1, 6)).is_err());
    assert!(q.peek(2, q.task_id_in(2, 5)).is_err());
    wal.append_turn(&mut q);
    wal.flush(&mut q, WAIT).expect("flushed");
    let want = model(&q, START);
    drop(wal);
    // Read again (the older files and a new segment, or the snapshot in the current format
    // the start asked for, if it was written by then): the same.
    let (mut wal, mut q, _) = open(&storage);
    assert_eq!(model(&q, START), want);
    check_v3_ids(&q);
    assert_eq!(numbers(&q, 1).next, 11);
    // A snapshot in the new format carries the marks.
    wal.snapshot_now(&mut q, WAIT).expect("snapshot");
    drop(wal);
    let (_wal, mut q, report) = open(&storage);
    assert_eq!(report.records, 0, "all from the new snapshot");
    assert_eq!(model(&q, START), want);
    check_v3_ids(&q);
    assert_eq!(numbers(&q, 1).legacy_below, 10);
    assert_eq!(put_in(&mut q, 1, b"next"), task_id(1, 11));
    assert_eq!(put_in(&mut q, 2, b"next"), task_id(2, 12));
    assert_eq!(q.put(START, b"s".to_vec(), PutOptions::default()).id, 13);
}

#[test]
fn a_replica_carries_each_tubes_numbering_from_the_stream() {
    // The primary's turns, as a relay streams them: a tube, then three puts and the newest
    // deleted in one turn.
    let storage = MemStorage::new();
    let (mut wal, mut q, _) = open(&storage);
    wal.set_tap(true);
    let t = tube_of_its_own(&mut wal, &mut q, TubeOptions::default());
    for _ in 0..3 {
        put_in(&mut q, t, b"x");
    }
    q.delete(t, q.task_id_in(t, 2)).expect("live");
    wal.append_turn(&mut q);
    wal.flush(&mut q, WAIT).expect("flushed");
    let mut stream = Vec::new();
    wal.take_tap(&mut stream);
    assert!(!stream.is_empty(), "the turn was tapped");

    let replica_storage = MemStorage::new();
    let cfg = WalConfig {
        replica: true,
        ..cfg_in(WalMode::Write)
    };
    let (mut rwal, mut r, _) =
        Wal::open(Arc::new(replica_storage.clone()), cfg).expect("replica opens");
    rwal.apply_replicated(&mut r, &stream).expect("applied");
    r.check_invariants();
    assert_eq!(model(&r, START), model(&q, START));
    let numbers = r.tube_info(t).expect("replicated tube").numbers;
    assert_eq!(numbers, q.tube_info(t).expect("live").numbers);
    // Promoted, the replica goes on where its primary was: 2 is not given again.
    assert_eq!(id_number(put_in(&mut r, t, b"y")), 3);
}

#[test]
fn a_start_on_an_older_format_asks_for_a_snapshot_in_the_current_one() {
    let storage = MemStorage::new();
    write_v3_dir(&storage);
    let (mut wal, mut q, report) = open(&storage);
    assert!(report.older_format, "{report:?}");
    wal.poll(&mut q);
    assert!(wal.snapshot_running(), "asked for at the start");
    let deadline = std::time::Instant::now() + WAIT;
    while wal.snapshot_running() {
        wal.poll(&mut q);
        assert!(std::time::Instant::now() < deadline, "the snapshot ends");
        std::thread::yield_now();
    }
    let newest = storage
        .list()
        .expect("listed")
        .into_iter()
        .filter(|n| n.ends_with(format::SNAP_SUFFIX))
        .max()
        .expect("a snapshot");
    let bytes = storage.contents(&newest).expect("written");
    let header = format::parse_file_header(&bytes, SNAP_MAGIC).expect("a header");
    assert_eq!(header.version, format::FORMAT_VERSION);
    drop(wal);
    let (_wal, q, report) = open(&storage);
    assert_eq!(report.snapshot.as_deref(), Some(newest.as_str()));
    check_v3_ids(&q);
    let old = q.tube_info(1).expect("live").numbers;
    assert_eq!(
        (old.next, old.legacy_below),
        (10, 10),
        "the marks, carried in format 4"
    );
}

/// A put removed within its own turn leaves no task to log, yet its number is given: neither
/// a restart (from the WAL alone, or from a snapshot and the WAL after it) nor a promoted
/// replica gives it again.
#[test]
fn a_number_put_and_removed_within_one_turn_is_not_given_again() {
    for snapshot_first in [false, true] {
        let storage = MemStorage::new();
        let (mut wal, mut q, _) = open(&storage);
        wal.set_tap(true);
        let t = tube_of_its_own(&mut wal, &mut q, TubeOptions::default());
        assert_eq!(id_number(put_in(&mut q, t, b"kept")), 0);
        wal.flush(&mut q, WAIT).expect("flushed");
        if snapshot_first {
            wal.snapshot_now(&mut q, WAIT).expect("snapshot");
        }
        // Put and deleted in one turn, then put and truncated away in one turn: only the
        // truncation names the tube.
        let gone = put_in(&mut q, t, b"deleted");
        q.delete(t, gone).expect("live");
        wal.flush(&mut q, WAIT).expect("flushed");
        put_in(&mut q, t, b"truncated");
        q.truncate(t).expect("live");
        wal.flush(&mut q, WAIT).expect("flushed");
        let mut stream = Vec::new();
        wal.take_tap(&mut stream);
        drop(wal);

        let (_wal, mut q, report) = open(&storage);
        assert_eq!(report.snapshot.is_some(), snapshot_first, "{report:?}");
        assert_eq!(id_number(put_in(&mut q, t, b"next")), 3);

        let cfg = WalConfig {
            replica: true,
            ..cfg_in(WalMode::Write)
        };
        let (mut rwal, mut r, _) =
            Wal::open(Arc::new(MemStorage::new()), cfg).expect("replica opens");
        rwal.apply_replicated(&mut r, &stream).expect("applied");
        assert_eq!(id_number(put_in(&mut r, t, b"promoted")), 3);
    }
}

/// A dedup key whose task was put and deleted within one turn is logged, the put is not: after
/// a restart an unrelated put must not get that task's id, or a retry with the key would
/// answer with the unrelated task.
#[test]
fn a_dedup_key_of_a_task_gone_within_its_turn_never_names_another_task() {
    let storage = MemStorage::new();
    let (mut wal, mut q, _) = open(&storage);
    let opts = TubeOptions {
        dedup_window: 60 * SEC,
        ..TubeOptions::default()
    };
    let t = tube_of_its_own(&mut wal, &mut q, opts);
    let keyed = TubePut {
        dedup_key: Some(b"k"),
        ..TubePut::default()
    };
    let gone = match q.put_in(START, t, b"keyed".to_vec(), keyed) {
        Ok(PutOutcome::Created(task)) => task.id,
        other => panic!("a new task, got {other:?}"),
    };
    q.delete(t, gone).expect("live");
    wal.flush(&mut q, WAIT).expect("flushed");
    drop(wal);

    let (_wal, mut q, _) = open(&storage);
    assert_ne!(put_in(&mut q, t, b"unrelated"), gone);
    match q.put_in(START, t, b"retry".to_vec(), keyed) {
        Ok(PutOutcome::DuplicateDone(id)) => assert_eq!(id, gone),
        other => panic!("the key's task, done, got {other:?}"),
    }
}

/// The floors of the free tube indexes, as a snapshot carries them.
fn floors(q: &Queue) -> Vec<(TubeIx, u64)> {
    q.floors().collect()
}

/// A put into `tube` as the tube API reports it: (whole id, number shown).
fn put_shown(q: &mut Queue, tube: TubeIx) -> (TaskId, u64) {
    let id = match q.put_in(START, tube, &b"x"[..], TubePut::default()) {
        Ok(PutOutcome::Created(t)) => t.id,
        other => panic!("a new task, got {other:?}"),
    };
    (id, q.task_number(tube, id))
}

/// A tube created at a dropped one's index numbers from 0 through the tube API and takes its
/// ids above the dropped tube's, after a restart from the WAL alone and on a replica fed the
/// stream as before them: the replayed `TubeDrop` sets the index's floor, and so do the
/// `Spent` records of a tube created, filled and dropped within one turn (nothing else of it
/// is logged).
#[test]
fn a_tube_created_at_a_dropped_ones_index_gives_no_id_again_through_restarts_and_replicas() {
    let storage = MemStorage::new();
    let (mut wal, mut q, _) = open(&storage);
    wal.set_tap(true);
    let a = q
        .create_tube("a", TubeType::FifoTtl, TubeOptions::default())
        .expect("new");
    let old: Vec<TaskId> = (0..10).map(|_| put_shown(&mut q, a).0).collect();
    wal.flush(&mut q, WAIT).expect("flushed");
    q.drop_tube(a).expect("droppable");
    wal.flush(&mut q, WAIT).expect("flushed");
    assert_eq!(floors(&q), [(a, 10)]);
    // One turn: made, filled, emptied and dropped.
    let v = q
        .create_tube("v", TubeType::Fifo, TubeOptions::default())
        .expect("new");
    assert_eq!(v, a, "the index is reused");
    let vanished = [put_shown(&mut q, v), put_shown(&mut q, v)];
    assert_eq!(vanished, [(task_id(a, 10), 0), (task_id(a, 11), 1)]);
    q.drop_tube(v).expect("droppable");
    wal.flush(&mut q, WAIT).expect("flushed");
    assert_eq!(floors(&q), [(a, 12)]);
    let mut stream = Vec::new();
    wal.take_tap(&mut stream);
    drop(wal);

    let (mut wal, mut q, _) = open(&storage);
    wal.set_tap(true);
    assert_eq!(floors(&q), [(a, 12)], "from the WAL alone");
    let b = q
        .create_tube("b", TubeType::FifoTtl, TubeOptions::default())
        .expect("new");
    assert_eq!(b, a);
    let (id, number) = put_shown(&mut q, b);
    assert_eq!((id, number), (task_id(a, 12), 0));
    assert!(!old.contains(&id));
    wal.flush(&mut q, WAIT).expect("flushed");
    let want = q.tube_info(b).expect("live").numbers;
    assert_eq!((want.first, want.next), (12, 13));
    let mut more = Vec::new();
    wal.take_tap(&mut more);
    stream.extend_from_slice(&more);
    drop(wal);

    let (_wal, mut q, _) = open(&storage);
    assert_eq!(q.tube_info(b).expect("recovered").numbers, want);
    q.get(id).expect("recovered");
    assert_eq!(q.task_number(b, id), 0);
    assert_eq!(put_shown(&mut q, b), (task_id(a, 13), 1));

    // A replica fed the stream from the start, across the primary's restart.
    let cfg = WalConfig {
        replica: true,
        ..cfg_in(WalMode::Write)
    };
    let (mut rwal, mut r, _) = Wal::open(Arc::new(MemStorage::new()), cfg).expect("replica opens");
    rwal.apply_replicated(&mut r, &stream).expect("applied");
    assert_eq!(r.tube_info(b).expect("replicated").numbers, want);
    r.get(id).expect("replicated");
    assert_eq!(r.task_number(b, id), 0);
}

/// A snapshot taken while a dropped tube's index is free carries the index's floor: a
/// restart from it, and a replica joining from it, give the next tube there new ids.
#[test]
fn a_snapshot_taken_while_an_index_is_free_keeps_its_floor_for_restarts_and_replicas() {
    let storage = MemStorage::new();
    let (mut wal, mut q, _) = open(&storage);
    let a = q
        .create_tube("a", TubeType::Fifo, TubeOptions::default())
        .expect("new");
    let keep = q
        .create_tube("keep", TubeType::Fifo, TubeOptions::default())
        .expect("new");
    for _ in 0..3 {
        put_shown(&mut q, a);
    }
    put_shown(&mut q, keep);
    wal.flush(&mut q, WAIT).expect("flushed");
    q.drop_tube(a).expect("droppable");
    wal.flush(&mut q, WAIT).expect("flushed");
    let name = wal.snapshot_now(&mut q, WAIT).expect("snapshot");
    drop(wal);
    // The WAL before the snapshot is skipped at replay: the floor comes from the snapshot.
    for n in storage.list().expect("listed") {
        if n.ends_with(".xlog") {
            storage.remove(&n).expect("removed");
        }
    }
    let (_wal, mut q, report) = open(&storage);
    assert!(report.snapshot.is_some(), "{report:?}");
    assert_eq!(floors(&q), [(a, 3)]);
    let b = q
        .create_tube("b", TubeType::Fifo, TubeOptions::default())
        .expect("new");
    assert_eq!((b, put_shown(&mut q, b)), (a, (task_id(a, 3), 0)));

    // A replica joining from that snapshot.
    let cfg = WalConfig {
        replica: true,
        ..cfg_in(WalMode::Write)
    };
    let (mut rwal, _, _) = Wal::open(Arc::new(MemStorage::new()), cfg).expect("replica opens");
    let start = format::parse_name(&name, ".snap").expect("a snapshot's name");
    rwal.join_begin(start).expect("begins");
    rwal.join_write(&storage.contents(&name).expect("the snapshot"))
        .expect("written");
    let r = rwal.join_finish().expect("loaded");
    assert_eq!(floors(&r), [(a, 3)]);
}
