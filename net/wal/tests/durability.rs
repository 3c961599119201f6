//! Durability against the fault-injecting storage: crash after every write (whole, torn, or
//! lost with the power) and compare the recovered queue with the queue as it was after some
//! turn the WAL had acknowledged; torn tails, damage in the middle and --force-recovery,
//! snapshot + WAL recovery, a full disk and a failing sync, and the data directory lock.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use tarq_engine::{Micros, PutOptions, Queue, Status};
use tarq_wal::{
    files_to_remove, Crash, DirLock, ManualClock, MemStorage, RecoveryReport, Storage, Wal,
    WalConfig, WalError, WalMode, RETRY_INTERVAL,
};

/// Generous bound for anything a test waits for; reached only when something is broken.
const WAIT: Duration = Duration::from_secs(20);
const SEC: Micros = 1_000_000;
const START: Micros = 1_700_000_000 * SEC;

/// A task as recovery must bring it back: taken tasks come back ready.
type Model = BTreeMap<
    u64,
    (
        Status,
        Micros,
        i64,
        Option<Micros>,
        Option<Micros>,
        Micros,
        Vec<u8>,
        u16,
    ),
>;

fn model(q: &Queue) -> Model {
    q.iter()
        .map(|t| {
            let (status, runat) = match t.status {
                Status::Taken => (Status::Ready, 0),
                s => (s, t.runat),
            };
            (
                t.id,
                (
                    status,
                    runat,
                    t.pri,
                    t.ttl,
                    t.ttr,
                    t.created,
                    t.data.to_vec(),
                    t.deliveries,
                ),
            )
        })
        .collect()
}

fn cfg(mode: WalMode) -> WalConfig {
    WalConfig {
        mode,
        // Small segments so a short workload rotates several times.
        segment_bytes: 1500,
        snapshot_every_bytes: 0,
        snapshot_interval: None,
        keep_snapshots: 2,
        force_recovery: false,
        replica: false,
        loop_cpu: None,
    }
}

/// Opens on a clock the test moves by hand.
fn open_with_clock(
    storage: &MemStorage,
    cfg: WalConfig,
    clock: &ManualClock,
) -> (Wal, Queue, RecoveryReport) {
    let storage: Arc<dyn Storage> = Arc::new(storage.clone());
    match Wal::open_with_clock(storage, cfg, Arc::new(clock.clone())) {
        Ok(x) => x,
        Err(e) => panic!("recovery failed: {e}"),
    }
}

fn open(storage: &MemStorage, cfg: WalConfig) -> (Wal, Queue, RecoveryReport) {
    let storage: Arc<dyn Storage> = Arc::new(storage.clone());
    match Wal::open(storage, cfg) {
        Ok(x) => x,
        Err(e) => panic!("recovery failed: {e}"),
    }
}

/// A deterministic workload: puts with every option, takes by three sessions, acks, releases
/// with and without delay, time passing (promotions, expiry, TTR returns), a disconnect.
struct Driver {
    rng: u64,
    now: Micros,
    n: u64,
}

impl Driver {
    fn new(seed: u64) -> Self {
        Driver {
            rng: seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1,
            now: START,
            n: 0,
        }
    }

    fn next(&mut self, below: u64) -> u64 {
        // xorshift64: deterministic, so a crash run replays the clean run exactly.
        self.rng ^= self.rng << 13;
        self.rng ^= self.rng >> 7;
        self.rng ^= self.rng << 17;
        self.rng % below
    }

    fn taken(&self, q: &Queue) -> Option<(u64, u64)> {
        q.iter()
            .filter(|t| t.status == Status::Taken)
            .map(|t| (t.id, t.owner.unwrap_or(0)))
            .min()
    }

    /// One loop turn's worth of calls; changing calls only while the WAL accepts them.
    fn turn(&mut self, q: &mut Queue, writable: bool) {
        for _ in 0..1 + self.next(3) {
            match self.next(10) {
                0..=3 if writable => {
                    self.n += 1;
                    let opts = PutOptions {
                        delay: if self.next(4) == 0 {
                            (1 + self.next(3)) * SEC
                        } else {
                            0
                        },
                        ttl: (self.next(5) == 0).then(|| (2 + self.next(8)) * SEC),
                        ttr: (self.next(4) == 0).then(|| (1 + self.next(3)) * SEC),
                        pri: self.next(3) as i64,
                    };
                    // One put in eight is big enough that its record holds the queue's
                    // buffer rather than a copy (written by a vectored write).
                    let pad_len = if self.next(8) == 0 {
                        (64 << 10) + self.next(4096)
                    } else {
                        self.next(40)
                    };
                    let pad: String = (0..pad_len)
                        .map(|i| (b'a' + (i % 26) as u8) as char)
                        .collect();
                    let data = format!("task {} {pad}", self.n);
                    q.put(self.now, data.into_bytes(), opts);
                }
                4 | 5 => {
                    q.take(self.now, 1 + self.next(3));
                }
                6 | 7 if writable => {
                    if let Some((id, owner)) = self.taken(q) {
                        q.ack(owner, id).expect("owner acks");
                    }
                }
                8 if writable => {
                    if let Some((id, owner)) = self.taken(q) {
                        let delay = if self.next(2) == 0 { 0 } else { SEC };
                        q.release(self.now, owner, id, delay)
                            .expect("owner releases");
                    }
                }
                9 if self.next(8) == 0 => {
                    q.release_session(1 + self.next(3));
                }
                _ => {
                    self.now += self.next(1500) * 1000;
                    q.advance(self.now, 64);
                }
            }
        }
    }
}

const TURNS: usize = 60;
const SNAPSHOT_AT: usize = 35;

/// Runs the workload; returns the model after every turn (index 0: before any) and the index
/// of the last turn the WAL acknowledged. Stops at the first failure, as a crash would.
fn run(storage: &MemStorage, mode: WalMode, seed: u64) -> (Vec<Model>, usize) {
    let (mut wal, mut q, _) = open(storage, cfg(mode));
    let mut d = Driver::new(seed);
    let mut models = vec![model(&q)];
    let mut acked = 0;
    for turn in 1..=TURNS {
        // Room first, as the server asks before a change: the segment is created and
        // allocated ahead here, so a crash meets that too.
        if wal.reserve(64 << 10).is_err() {
            break;
        }
        d.turn(&mut q, true);
        models.push(model(&q));
        wal.append_turn(&mut q);
        let batch = wal.submit();
        if mode == WalMode::Fsync && wal.flush(&mut q, WAIT).is_err() {
            break;
        }
        wal.poll(&mut q);
        if wal.check_writable().is_err() {
            break;
        }
        assert!(
            wal.durable_upto() >= batch,
            "write/fsync mode: batch {batch} durable after the turn"
        );
        acked = turn;
        if turn == SNAPSHOT_AT && wal.snapshot_now(&mut q, WAIT).is_err() {
            break;
        }
    }
    (models, acked)
}

fn check_recovered(storage: &MemStorage, models: &[Model], acked: usize, what: &str) {
    let (_wal, q, report) = open(storage, cfg(WalMode::Write));
    q.check_invariants();
    assert_eq!(q.stats().taken, 0, "{what}: nothing is left taken");
    let got = model(&q);
    let found = (acked..models.len()).find(|&i| models[i] == got);
    assert!(
        found.is_some(),
        "{what}: recovered {} tasks match no model state from the acknowledged turn {acked} on \
         (report {report:?}); acknowledged state had {} tasks",
        got.len(),
        models[acked].len()
    );
    let max_id = got.keys().max().copied().unwrap_or(0);
    assert!(
        q.last_id() >= max_id,
        "{what}: ids continue above the largest seen"
    );
}

fn crash_everywhere(mode: WalMode, crash_of: impl Fn(usize) -> Crash, keeps: &[usize]) {
    let clean = MemStorage::new();
    let (models, acked) = run(&clean, mode, 7);
    assert_eq!(acked, TURNS, "the clean run acknowledges every turn");
    let writes = clean.writes();
    assert!(
        writes > TURNS as u64,
        "the workload writes at least once per turn ({writes})"
    );
    check_recovered(&clean, &models, TURNS, "clean shutdown");
    assert!(
        models
            .iter()
            .flat_map(|m| m.values())
            .any(|t| t.6.len() > 64 << 10),
        "the workload puts payloads big enough to be held apart from the log's buffer"
    );
    for n in 1..=writes {
        for (k, &keep) in keeps.iter().enumerate() {
            let storage = MemStorage::new();
            storage.die_at_write(n, keep);
            let (models, acked) = run(&storage, mode, 7);
            storage.crash(crash_of(k));
            check_recovered(
                &storage,
                &models,
                acked,
                &format!("{mode} mode, died at write {n} keeping {keep} bytes"),
            );
        }
    }
}

#[test]
fn write_mode_survives_a_process_crash_at_every_write_whole_or_torn() {
    // The process dies during write n, which leaves 0, a few, a header's worth, part of a
    // big payload (in a write that has one), or all bytes.
    crash_everywhere(
        WalMode::Write,
        |_| Crash::Process,
        &[0, 5, 24, 61, 40_000, usize::MAX],
    );
}

#[test]
fn fsync_mode_survives_a_power_loss_at_every_write() {
    // Power fails during write n: only synced bytes survive, plus a torn prefix of the rest.
    let tears = [0, 30, usize::MAX];
    crash_everywhere(
        WalMode::Fsync,
        |k| Crash::Power {
            torn_keep: tears[k],
        },
        &[0, 30, usize::MAX],
    );
}

fn segments(storage: &MemStorage) -> Vec<String> {
    let mut v: Vec<String> = storage
        .list()
        .unwrap()
        .into_iter()
        .filter(|n| n.ends_with(".xlog"))
        .collect();
    v.sort();
    v
}

/// Runs `turns` turns in write mode with big segments, shuts down, returns the models.
fn simple_run(storage: &MemStorage, turns: usize) -> Vec<Model> {
    let mut c = cfg(WalMode::Write);
    c.segment_bytes = 1 << 20;
    let (mut wal, mut q, _) = open(storage, c);
    let mut d = Driver::new(11);
    let mut models = vec![model(&q)];
    for _ in 0..turns {
        d.turn(&mut q, true);
        wal.append_turn(&mut q);
        wal.submit();
        wal.poll(&mut q);
        models.push(model(&q));
    }
    models
}

#[test]
fn a_torn_tail_is_cut_and_reported_with_file_and_offset() {
    let storage = MemStorage::new();
    let models = simple_run(&storage, 30);
    let segs = segments(&storage);
    assert_eq!(segs.len(), 1);
    let name = &segs[0];
    let good = storage.contents(name).unwrap();
    // Half a record: a header announcing 100 bytes, and only 10 of them.
    let mut torn = good.clone();
    torn.extend_from_slice(&0x7172_6174u32.to_le_bytes());
    torn.extend_from_slice(&100u32.to_le_bytes());
    torn.extend_from_slice(&[0xAB; 26]);
    storage.put_file(name, torn.clone());

    let (_wal, q, report) = open(&storage, cfg(WalMode::Write));
    let t = report.torn.expect("the torn tail is reported");
    assert_eq!(
        (t.file.as_str(), t.offset, t.bytes),
        (
            name.as_str(),
            good.len() as u64,
            (torn.len() - good.len()) as u64
        )
    );
    assert_eq!(
        model(&q),
        *models.last().unwrap(),
        "every complete turn is back"
    );
    assert_eq!(
        storage.contents(name).unwrap(),
        good,
        "the tail was cut from the file"
    );
}

#[test]
fn damage_in_the_middle_stops_the_start_and_force_recovery_skips_it() {
    let storage = MemStorage::new();
    let models = simple_run(&storage, 30);
    let name = segments(&storage)[0].clone();
    let bytes = storage.contents(&name).unwrap();
    // Find the first put record after the 4th record and flip a byte of its body.
    let mut off = 32;
    let mut seen = 0;
    loop {
        let len = u32::from_le_bytes(bytes[off + 4..off + 8].try_into().unwrap()) as usize;
        if seen >= 4 && bytes[off + 16] == 1 {
            break;
        }
        seen += 1;
        off += 24 + len;
    }
    let victim_seq = u64::from_le_bytes(bytes[off + 8..off + 16].try_into().unwrap());
    let victim_task = u64::from_le_bytes(bytes[off + 24..off + 32].try_into().unwrap());
    storage.corrupt(&name, off + 24, bytes[off + 24] ^ 0xFF);

    let err = match Wal::open(Arc::new(storage.clone()), cfg(WalMode::Write)) {
        Err(e) => e,
        Ok(_) => panic!("damage in the middle must stop the start"),
    };
    let msg = err.to_string();
    assert!(
        matches!(err, WalError::Corrupt { offset, .. } if offset == off as u64),
        "{msg}"
    );
    assert!(
        msg.contains(&name) && msg.contains(&format!("offset {off}")),
        "names file and offset: {msg}"
    );
    assert!(msg.contains("--force-recovery"), "says how to go on: {msg}");

    let mut c = cfg(WalMode::Write);
    c.force_recovery = true;
    let (_wal, q, report) = open(&storage, c);
    assert!(
        report.lost[0].contains(&format!("records {victim_seq}..{victim_seq} lost")),
        "{:?}",
        report.lost
    );
    // Later records about the lost put's task no longer fit and are reported, nothing else.
    for line in &report.lost[1..] {
        assert!(line.contains(&format!("task {victim_task}:")), "{line}");
    }
    q.check_invariants();
    // Everything but the damaged record's effect is there: the final state differs from the
    // clean one in at most that record's task.
    let want = models.last().unwrap();
    let got = model(&q);
    let differing: Vec<_> = want
        .keys()
        .chain(got.keys())
        .filter(|id| want.get(id) != got.get(id))
        .collect();
    assert!(
        differing.iter().all(|&&id| id == victim_task),
        "only task {victim_task} differs: {differing:?}"
    );
}

#[test]
fn snapshot_then_wal_recovers_and_old_files_go() {
    let storage = MemStorage::new();
    let mut c = cfg(WalMode::Write);
    c.segment_bytes = 4096;
    c.keep_snapshots = 1;
    let (mut wal, mut q, _) = open(&storage, c.clone());
    let mut d = Driver::new(3);
    for _ in 0..200 {
        d.turn(&mut q, true);
        wal.append_turn(&mut q);
        wal.submit();
        wal.poll(&mut q);
    }
    let first = wal.snapshot_now(&mut q, WAIT).expect("snapshot");
    let segs_before = segments(&storage);
    for _ in 0..200 {
        d.turn(&mut q, true);
        wal.append_turn(&mut q);
        wal.submit();
        wal.poll(&mut q);
    }
    let second = wal.snapshot_now(&mut q, WAIT).expect("snapshot");
    assert!(second > first, "{second} after {first}");
    for _ in 0..50 {
        d.turn(&mut q, true);
        wal.append_turn(&mut q);
        wal.submit();
        wal.poll(&mut q);
    }
    let want = model(&q);
    let last_id = q.last_id();
    let names = storage.list().unwrap();
    assert!(
        !names.contains(&first),
        "keep_snapshots = 1 removed {first}"
    );
    assert!(names.contains(&second));
    assert!(
        segs_before.iter().any(|s| !names.contains(s)),
        "WAL before the snapshot was removed"
    );
    drop(wal);
    storage.crash(Crash::Process);

    let (mut wal, mut q, report) = open(&storage, c);
    assert_eq!(report.snapshot.as_deref(), Some(second.as_str()));
    assert_eq!(model(&q), want);
    assert!(q.last_id() >= last_id, "ids continue above {last_id}");
    let t = q.put(d.now, b"after".to_vec(), PutOptions::default());
    assert!(t.id > last_id, "new id {} above {last_id}", t.id);
    wal.append_turn(&mut q);
    wal.submit();
}

#[test]
fn a_snapshot_taken_while_the_queue_changes_recovers_exactly() {
    // Enough tasks that the walk spans several turns, with changes both behind and ahead of
    // the walk's cursor while it runs.
    let storage = MemStorage::new();
    let mut c = cfg(WalMode::Fsync);
    c.segment_bytes = 1 << 20;
    let (mut wal, mut q, _) = open(&storage, c.clone());
    let now = START;
    for i in 0..5000u64 {
        let opts = PutOptions {
            delay: if i % 7 == 0 { 5 * SEC } else { 0 },
            pri: (i % 3) as i64,
            ..Default::default()
        };
        q.put(now, format!("t{i}").into_bytes(), opts);
    }
    wal.flush(&mut q, WAIT).unwrap();
    assert!(wal.request_snapshot());
    let mut turns = 0;
    let mut d = Driver::new(5);
    d.now = now;
    while wal.snapshot_running() || turns == 0 {
        // Take and ack low ids (behind the cursor), release others, put new ones (ahead).
        for _ in 0..50 {
            if let Some(t) = q.take(d.now, 1) {
                let id = t.id;
                if id % 2 == 0 {
                    q.ack(1, id).unwrap();
                } else {
                    q.release(d.now, 1, id, SEC).unwrap();
                }
            }
        }
        d.turn(&mut q, true);
        wal.append_turn(&mut q);
        wal.submit();
        wal.poll(&mut q);
        turns += 1;
        assert!(turns < 100_000, "the snapshot finishes");
        if wal.snapshot_running() && turns > 3 {
            wal.flush(&mut q, WAIT).unwrap();
        }
    }
    assert!(turns > 3, "the walk spanned several turns ({turns})");
    wal.flush(&mut q, WAIT).unwrap();
    let want = model(&q);
    drop(wal);
    // Keep only the snapshot and the WAL after its start: older segments must not be needed.
    storage.crash(Crash::Power { torn_keep: 0 });
    let (_wal, q, report) = open(&storage, c);
    assert!(report.snapshot.is_some(), "{report:?}");
    assert_eq!(model(&q), want);
}

#[test]
fn a_full_disk_refuses_changes_keeps_takes_and_resumes_by_itself() {
    let storage = MemStorage::new();
    let mut c = cfg(WalMode::Write);
    c.segment_bytes = 1 << 20;
    let clock = ManualClock::new();
    let (mut wal, mut q, _) = open_with_clock(&storage, c.clone(), &clock);
    let now = START;
    for i in 0..10 {
        q.put(
            now,
            format!("before {i}").into_bytes(),
            PutOptions::default(),
        );
    }
    wal.append_turn(&mut q);
    let b = wal.submit();
    assert_eq!(wal.durable_upto(), b);

    // The disk fills up in the middle of the next turn's write: a put big enough that its
    // record holds the queue's buffer, so the retry rewrites it from there.
    storage.set_space_left(Some(40));
    let during: Vec<u8> = (0..100_000u32).map(|i| (i % 251) as u8).collect();
    q.put(now, during.clone(), PutOptions::default());
    wal.append_turn(&mut q);
    let held = wal.submit();
    assert!(
        wal.durable_upto() < held,
        "the failed turn is not acknowledged"
    );
    let err = wal.check_writable().expect_err("changes are refused");
    assert_eq!(err.to_string(), "WAL write failed: No space left on device");

    // Takes of existing tasks go on while the disk is full.
    assert!(wal.accepts_takes());
    let t = q.take(now, 9).expect("a ready task").id;
    wal.append_turn(&mut q);
    let take_turn = wal.submit();
    wal.poll(&mut q);
    assert!(
        wal.is_durable(take_turn),
        "a take's reply does not wait for the disk"
    );
    assert!(!wal.is_durable(held), "the put's reply does");
    assert!(wal.check_writable().is_err(), "still full");

    // Room again: the WAL notices by itself at its next retry, RETRY_INTERVAL after the failure.
    storage.set_space_left(None);
    assert_eq!(
        wal.timeout(),
        Some(RETRY_INTERVAL),
        "the loop wakes for the retry"
    );
    clock.advance(RETRY_INTERVAL - Duration::from_micros(1));
    wal.poll(&mut q);
    assert!(wal.check_writable().is_err(), "no retry before its time");
    assert_eq!(wal.timeout(), Some(Duration::from_micros(1)));
    clock.advance(Duration::from_micros(1));
    wal.poll(&mut q);
    wal.check_writable()
        .expect("the retry succeeds and changes are accepted again");
    assert!(wal.durable_upto() >= held, "the held turn is durable now");
    q.ack(9, t).unwrap();
    wal.append_turn(&mut q);
    let last = wal.submit();
    assert_eq!(wal.durable_upto(), last);
    let want = model(&q);
    drop(wal);
    storage.crash(Crash::Process);
    let (_wal, q, _) = open(&storage, c);
    assert_eq!(
        model(&q),
        want,
        "nothing acknowledged was lost, the acked task stays gone"
    );
    assert!(
        q.iter().any(|t| t.data == during),
        "the held put was written on retry"
    );
}

#[test]
fn a_failed_fsync_rewrites_the_unsynced_turns_into_a_new_segment() {
    let storage = MemStorage::new();
    let mut c = cfg(WalMode::Fsync);
    c.segment_bytes = 1 << 20;
    let clock = ManualClock::new();
    let (mut wal, mut q, _) = open_with_clock(&storage, c.clone(), &clock);
    let now = START;
    q.put(now, b"one".to_vec(), PutOptions::default());
    wal.flush(&mut q, WAIT).unwrap();
    storage.fail_sync_at(1);
    q.put(now, b"two".to_vec(), PutOptions::default());
    let err = wal.flush(&mut q, WAIT).expect_err("the sync fails");
    assert!(err.to_string().starts_with("WAL write failed: "), "{err}");
    assert!(wal.check_writable().is_err());
    assert!(wal.flush(&mut q, WAIT).is_err(), "no retry before its time");
    clock.advance(RETRY_INTERVAL);
    wal.flush(&mut q, WAIT)
        .expect("the retry rewrites the turn and syncs it");
    assert!(
        segments(&storage).len() >= 2,
        "a new segment holds the rewritten turn: {:?}",
        segments(&storage)
    );
    let want = model(&q);
    drop(wal);
    storage.crash(Crash::Power { torn_keep: 0 });
    let (_wal, q, _) = open(&storage, c);
    assert_eq!(model(&q), want);
}

#[test]
fn files_to_remove_keeps_the_wal_the_oldest_kept_snapshot_needs() {
    let names: Vec<String> = [
        "00000000000000000001.xlog",
        "00000000000000000100.xlog",
        "00000000000000000200.xlog",
        "00000000000000000300.xlog",
        "00000000000000000150.snap",
        "00000000000000000250.snap",
        "00000000000000000050.snap",
        "tarq.lock",
    ]
    .map(String::from)
    .to_vec();
    let mut got = files_to_remove(&names, 2);
    got.sort();
    // Snapshots 250 and 150 stay; replay from 151 needs segment 100 (151..199) on.
    assert_eq!(
        got,
        ["00000000000000000001.xlog", "00000000000000000050.snap"]
    );
    assert!(
        files_to_remove(&names[..4], 2).is_empty(),
        "no snapshot: all WAL is needed"
    );
}

#[test]
fn a_second_process_on_the_same_directory_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let first = DirLock::acquire(dir.path()).unwrap();
    let err = DirLock::acquire(dir.path()).expect_err("the directory is locked");
    let msg = err.to_string();
    assert!(
        msg.contains("in use by another tarq") && msg.contains(&std::process::id().to_string()),
        "{msg}"
    );
    drop(first);
    DirLock::acquire(dir.path()).expect("free again once the holder is gone");
}

#[test]
fn the_real_disk_round_trips() {
    let dir = tempfile::tempdir().unwrap();
    let c = WalConfig {
        mode: WalMode::Fsync,
        ..WalConfig::default()
    };
    let want = {
        let (mut wal, mut q, _) = Wal::open_dir(dir.path(), c.clone()).unwrap();
        let mut d = Driver::new(9);
        for _ in 0..100 {
            d.turn(&mut q, true);
            wal.append_turn(&mut q);
            wal.submit();
            wal.poll(&mut q);
        }
        wal.snapshot_now(&mut q, WAIT).unwrap();
        for _ in 0..100 {
            d.turn(&mut q, true);
        }
        wal.flush(&mut q, WAIT).unwrap();
        model(&q)
    };
    let (_wal, q, report) = Wal::open_dir(dir.path(), c).unwrap();
    assert!(report.snapshot.is_some());
    assert_eq!(model(&q), want);
}

#[test]
fn a_segment_named_zero_recovers_without_underflow() {
    use tarq_wal::format::{file_header, segment_name, WAL_MAGIC};
    let storage = MemStorage::new();
    storage.put_file(&segment_name(0), file_header(WAL_MAGIC, 0).to_vec());
    let (_wal, q, report) = open(&storage, cfg(WalMode::Write));
    assert_eq!(q.iter().count(), 0, "an empty segment restores no task");
    assert_eq!(report.segments, 1, "the segment named 0 is read");
    assert!(report.torn.is_none(), "{:?}", report.torn);
}
