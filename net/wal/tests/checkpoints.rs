//! Checkpoints: when snapshots are due (WAL since the last one counted from the files, across
//! restarts; weighed against the last snapshot's size; an interval), the data directory staying
//! bounded over a restart loop, a clean stop never cutting valid WAL, every kept snapshot
//! usable as a fallback, and a queue with a long history snapshotting at once.

use std::sync::Arc;
use std::time::Duration;

use tarq_engine::{Micros, PutOptions, Queue};
use tarq_wal::{ManualClock, MemStorage, RecoveryReport, Storage, Wal, WalConfig, WalMode};

const WAIT: Duration = Duration::from_secs(20);
const SEC: Micros = 1_000_000;
const START: Micros = 1_700_000_000 * SEC;

fn cfg(every: u64) -> WalConfig {
    WalConfig {
        mode: WalMode::Write,
        segment_bytes: 4096,
        snapshot_every_bytes: every,
        snapshot_interval: None,
        keep_snapshots: 2,
        force_recovery: false,
        replica: false,
        loop_cpu: None,
    }
}

/// `cfg(0)` with segments of 64 MiB: a test writing big records in few files.
fn big_segments() -> WalConfig {
    WalConfig {
        segment_bytes: 64 << 20,
        ..cfg(0)
    }
}

fn open_mem(storage: &MemStorage, cfg: WalConfig) -> (Wal, Queue, RecoveryReport) {
    let storage: Arc<dyn Storage> = Arc::new(storage.clone());
    Wal::open(storage, cfg).unwrap_or_else(|e| panic!("recovery failed: {e}"))
}

fn ids(q: &Queue) -> Vec<u64> {
    let mut v: Vec<u64> = q.iter().map(|t| t.id).collect();
    v.sort_unstable();
    v
}

/// Puts `n` tasks of `size` bytes, one turn each, polling as the loop does (which starts
/// and walks snapshots that are due).
fn put_turns(wal: &mut Wal, q: &mut Queue, n: usize, size: usize) {
    for _ in 0..n {
        q.put(START, vec![b'p'; size], PutOptions::default());
        wal.append_turn(q);
        wal.submit();
        wal.poll(q);
    }
}

/// Drives the loop until no snapshot runs.
fn settle(wal: &mut Wal, q: &mut Queue) {
    let deadline = std::time::Instant::now() + WAIT;
    while wal.snapshot_running() {
        wal.poll(q);
        assert!(std::time::Instant::now() < deadline, "the snapshot ends");
        std::thread::yield_now();
    }
}

fn names(dir: &std::path::Path, suffix: &str) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .expect("listed")
        .map(|e| e.expect("entry").file_name().into_string().expect("utf-8"))
        .filter(|n| n.ends_with(suffix))
        .collect();
    v.sort();
    v
}

fn dir_bytes(dir: &std::path::Path) -> u64 {
    std::fs::read_dir(dir)
        .expect("listed")
        .map(|e| e.expect("entry").metadata().expect("stat").len())
        .sum()
}

const THRESHOLD: u64 = 16 * 1024;
const CYCLES: usize = 50;
/// Bytes a cycle puts: about a third of the threshold, so no single lifetime reaches it.
const PAYLOAD: usize = 100;
const PUTS_PER_CYCLE: usize = 40;

#[test]
fn fifty_short_lifetimes_below_the_threshold_snapshot_and_stay_bounded() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut live: Vec<u64> = Vec::new();
    let mut worst = 0;
    for cycle in 0..CYCLES {
        let (mut wal, mut q, report) = Wal::open_dir(dir.path(), cfg(THRESHOLD)).expect("opens");
        assert!(
            report.torn.is_none(),
            "cycle {cycle}: a clean stop leaves no torn tail"
        );
        assert_eq!(ids(&q), live, "cycle {cycle}: every task recovered");
        put_turns(&mut wal, &mut q, PUTS_PER_CYCLE, PAYLOAD);
        // Ack a quarter, so the queue changes and does not only grow.
        let sid = 1;
        for _ in 0..PUTS_PER_CYCLE / 4 {
            let id = q.take(START, sid).expect("ready").id;
            q.ack(sid, id).expect("taken");
        }
        wal.append_turn(&mut q);
        wal.submit();
        settle(&mut wal, &mut q);
        live = ids(&q);
        wal.close(&mut q, WAIT).expect("clean stop");
        drop(wal);
        worst = worst.max(dir_bytes(dir.path()));
    }
    let snaps = names(dir.path(), ".snap");
    assert!(!snaps.is_empty(), "snapshots were taken across restarts");
    assert!(
        snaps.len() <= 2,
        "at most --keep-snapshots remain: {snaps:?}"
    );
    // Bound: the kept snapshots, the WAL they need (each at most max(threshold, snapshot) plus
    // a turn), one more threshold in progress, and a header per segment.
    let snap_bytes: u64 = snaps
        .iter()
        .map(|n| std::fs::metadata(dir.path().join(n)).expect("stat").len())
        .sum();
    let biggest_snap = snaps
        .iter()
        .map(|n| std::fs::metadata(dir.path().join(n)).expect("stat").len())
        .max()
        .unwrap_or(0);
    let bound = 2 * biggest_snap + 3 * THRESHOLD.max(biggest_snap) + 64 * 1024;
    assert!(
        worst <= bound,
        "data dir peaked at {worst} bytes, over the bound {bound} (snapshots {snap_bytes})"
    );
    let wal_bytes: u64 = names(dir.path(), ".xlog")
        .iter()
        .map(|n| std::fs::metadata(dir.path().join(n)).expect("stat").len())
        .sum();
    let wal_bound = 3 * THRESHOLD.max(biggest_snap) + 64 * 1024;
    assert!(
        wal_bytes <= wal_bound,
        "old segments go: {wal_bytes} bytes of WAL, bound {wal_bound}"
    );
    let (_wal, q, report) = Wal::open_dir(dir.path(), cfg(THRESHOLD)).expect("opens");
    assert_eq!(ids(&q), live, "the last start recovers every task");
    assert!(report.snapshot.is_some());
    assert!(
        report.wal_bytes_since_snapshot < 2 * THRESHOLD.max(biggest_snap),
        "replay is bounded: {} bytes",
        report.wal_bytes_since_snapshot
    );
}

/// Regression: a clean stop right after a snapshot covering the whole last segment made the
/// next start take that segment's valid records for a torn tail and cut them, which left the
/// older snapshot unable to recover (records missing).
#[test]
fn a_stop_right_after_a_snapshot_cuts_nothing_and_the_older_snapshot_still_recovers() {
    let storage = MemStorage::new();
    let (mut wal, mut q, _) = open_mem(&storage, cfg(0));
    put_turns(&mut wal, &mut q, 10, 50);
    let first = wal.snapshot_now(&mut q, WAIT).expect("snapshot");
    put_turns(&mut wal, &mut q, 10, 50);
    let second = wal.snapshot_now(&mut q, WAIT).expect("snapshot");
    assert_ne!(first, second);
    let want = ids(&q);
    wal.close(&mut q, WAIT).expect("clean stop");
    drop(wal);
    let before: Vec<(String, usize)> = storage
        .list()
        .expect("listed")
        .into_iter()
        .map(|n| (n.clone(), storage.contents(&n).expect("file").len()))
        .collect();
    let (wal, q, report) = open_mem(&storage, cfg(0));
    assert!(report.torn.is_none(), "nothing torn: {:?}", report.torn);
    assert_eq!(ids(&q), want);
    drop(wal);
    for (n, len) in &before {
        assert_eq!(
            storage.contents(n).map(|c| c.len()),
            Some(*len),
            "{n} is untouched by the restart"
        );
    }
    // Every kept snapshot is a fallback: without the newest, the older one and the WAL after
    // it give the same queue.
    storage.remove(&second).expect("removed");
    let (_wal, q, report) = open_mem(&storage, cfg(0));
    assert_eq!(report.snapshot.as_deref(), Some(first.as_str()));
    assert!(report.lost.is_empty(), "nothing lost: {:?}", report.lost);
    assert_eq!(ids(&q), want);
}

#[test]
fn the_size_trigger_counts_wal_from_the_files_across_restarts() {
    let storage = MemStorage::new();
    let every = 8 * 1024;
    let mut written = 0;
    for _ in 0..3 {
        let (mut wal, mut q, report) = open_mem(&storage, cfg(every));
        assert_eq!(
            report.wal_bytes_since_snapshot, written,
            "the WAL since the last snapshot is counted from the files"
        );
        put_turns(&mut wal, &mut q, 10, 100);
        assert_eq!(wal.stats().snapshots, 0, "below the threshold");
        written = wal.stats().wal_bytes_since_snapshot;
        wal.close(&mut q, WAIT).expect("clean stop");
    }
    assert!(written < every);
    let (mut wal, mut q, _) = open_mem(&storage, cfg(every));
    put_turns(&mut wal, &mut q, 30, 100);
    settle(&mut wal, &mut q);
    assert_eq!(
        wal.stats().snapshots,
        1,
        "due once the total passes the threshold"
    );
}

#[test]
fn a_big_snapshot_waits_for_as_much_wal_before_the_next() {
    let storage = MemStorage::new();
    let (mut wal, mut q, _) = open_mem(&storage, cfg(0));
    // A backlog of ~200 KiB, snapshotted.
    put_turns(&mut wal, &mut q, 200, 1000);
    wal.snapshot_now(&mut q, WAIT).expect("snapshot");
    wal.close(&mut q, WAIT).expect("stop");
    drop(wal);
    // The threshold is 8 KiB, but the snapshot is ~200 KiB: 8 KiB of WAL is not enough.
    let (mut wal, mut q, report) = open_mem(&storage, cfg(8 * 1024));
    assert!(report.snapshot_bytes > 200_000, "{}", report.snapshot_bytes);
    put_turns(&mut wal, &mut q, 100, 100);
    settle(&mut wal, &mut q);
    assert_eq!(
        wal.stats().snapshots,
        0,
        "20 KiB of WAL does not rewrite 200 KiB"
    );
    put_turns(&mut wal, &mut q, 200, 1000);
    settle(&mut wal, &mut q);
    assert_eq!(
        wal.stats().snapshots,
        1,
        "as much WAL as the snapshot makes it due"
    );
}

#[test]
fn the_interval_trigger_fires_after_the_interval_if_anything_was_written() {
    let storage = MemStorage::new();
    let clock = ManualClock::new();
    let c = WalConfig {
        snapshot_interval: Some(Duration::from_secs(60)),
        ..cfg(0)
    };
    let s: Arc<dyn Storage> = Arc::new(storage.clone());
    let (mut wal, mut q, _) = Wal::open_with_clock(s, c, Arc::new(clock.clone())).expect("opens");
    assert_eq!(wal.timeout(), None, "nothing written: no interval pending");
    put_turns(&mut wal, &mut q, 3, 10);
    assert_eq!(wal.timeout(), Some(Duration::from_secs(60)));
    clock.advance(Duration::from_secs(59));
    wal.poll(&mut q);
    assert!(!wal.snapshot_running());
    clock.advance(Duration::from_secs(1));
    assert_eq!(wal.timeout(), Some(Duration::ZERO));
    wal.poll(&mut q);
    assert!(wal.snapshot_running(), "due after the interval");
    settle(&mut wal, &mut q);
    assert_eq!(wal.stats().snapshots, 1);
    clock.advance(Duration::from_secs(3600));
    wal.poll(&mut q);
    assert!(
        !wal.snapshot_running(),
        "nothing written since: no new snapshot"
    );
}

#[test]
fn a_queue_with_a_billion_id_history_snapshots_in_one_turn() {
    let storage = MemStorage::new();
    let (mut wal, mut q, _) = open_mem(&storage, cfg(0));
    // A long history: ids issued up to a billion, arena drained but for three tasks.
    for _ in 0..2000 {
        let id = q.put(START, b"x".to_vec(), PutOptions::default()).id;
        let t = q.take(START, 1).expect("ready").id;
        assert_eq!(t, id);
        q.ack(1, t).expect("taken");
    }
    q.set_last_id(1_000_000_000);
    for _ in 0..3 {
        q.put(START, b"live".to_vec(), PutOptions::default());
    }
    wal.flush(&mut q, WAIT).expect("flushed");
    wal.snapshot_now(&mut q, WAIT).expect("snapshot");
    let steps = wal.stats().snapshot_walk_steps;
    assert!(steps <= 3, "the walk took {steps} turns for 3 live tasks");
    let want = ids(&q);
    drop(wal);
    let (_wal, q, report) = open_mem(&storage, cfg(0));
    assert_eq!(report.snapshot_tasks, 3);
    assert_eq!(ids(&q), want);
    assert!(
        q.last_id() >= 1_000_000_003,
        "ids continue above the history"
    );
}

/// A big snapshot is synced as it is written, every `SNAPSHOT_SYNC_EVERY_BYTES`, not only once
/// at its end: the kernel never holds the whole snapshot dirty, to be flushed in one go while
/// the WAL's writes wait behind it.
#[test]
fn a_big_snapshot_is_synced_as_it_is_written() {
    use tarq_wal::snapshot::SNAPSHOT_SYNC_EVERY_BYTES;
    let storage = MemStorage::new();
    let (mut wal, mut q, _) = open_mem(&storage, big_segments());
    put_turns(&mut wal, &mut q, 1, 10);
    let before = storage.syncs();
    wal.snapshot_now(&mut q, WAIT).expect("snapshot");
    let small = storage.syncs() - before;
    // Two and a half times the interval of 4 KiB payloads, in a few turns.
    let size = 4096;
    let tasks = (SNAPSHOT_SYNC_EVERY_BYTES as usize * 5 / 2) / size;
    for _ in 0..8 {
        for _ in 0..tasks / 8 {
            q.put(START, vec![b'b'; size], PutOptions::default());
        }
        wal.append_turn(&mut q);
        wal.submit();
        wal.poll(&mut q);
    }
    settle(&mut wal, &mut q);
    let before = storage.syncs();
    let name = wal.snapshot_now(&mut q, WAIT).expect("snapshot");
    let big = storage.syncs() - before;
    let bytes = storage.contents(&name).expect("written").len() as u64;
    assert!(bytes > 2 * SNAPSHOT_SYNC_EVERY_BYTES, "{bytes} bytes");
    assert_eq!(
        big,
        small + bytes / SNAPSHOT_SYNC_EVERY_BYTES,
        "one sync per {SNAPSHOT_SYNC_EVERY_BYTES} bytes of a {bytes}-byte snapshot, then the last"
    );
}

/// Bytes that differ along the payload, so a misplaced or torn piece cannot recover equal.
fn patterned(len: usize, seed: u8) -> Vec<u8> {
    (0..len).map(|i| (i / 7) as u8 ^ seed).collect()
}

/// A big put's record holds the queue's buffer of the payload instead of a copy: the log's
/// own buffer stays small, the pending figure counts the payload, and the record written
/// from the held buffer recovers byte for byte.
#[test]
fn a_big_puts_record_holds_the_queues_buffer_not_a_copy() {
    let storage = MemStorage::new();
    let (mut wal, mut q, _) = open_mem(&storage, big_segments());
    let big = 8 << 20;
    let id = q.put(START, patterned(big, 1), PutOptions::default()).id;
    wal.append_turn(&mut q);
    assert!(
        wal.buffer_capacity() < 1 << 20,
        "{} bytes in the log's buffer: the payload was copied",
        wal.buffer_capacity()
    );
    wal.submit();
    wal.flush(&mut q, WAIT).expect("flushed");
    put_turns(&mut wal, &mut q, 3, 10);
    wal.flush(&mut q, WAIT).expect("flushed");
    assert_eq!(wal.stats().pending_bytes, 0, "nothing held once durable");
    drop(wal);
    let (mut wal, mut q2, report) = open_mem(&storage, cfg(0));
    assert!(report.torn.is_none(), "{report:?}");
    assert_eq!(q2.len(), 4, "the big task and the small ones recovered");
    assert!(q2.get(id).expect("recovered").data == patterned(big, 1));
    // A snapshot writes the big task in a block of its own, from the queue's buffer too.
    q2.put(START, patterned(100_000, 4), PutOptions::default());
    wal.append_turn(&mut q2);
    wal.submit();
    wal.snapshot_now(&mut q2, WAIT).expect("snapshot");
    drop(wal);
    let (_wal, q3, report) = open_mem(&storage, cfg(0));
    assert_eq!(
        report.snapshot_tasks, 5,
        "all from the snapshot: {report:?}"
    );
    assert_eq!(report.records, 0, "no WAL after it: {report:?}");
    assert!(q3.get(id).expect("recovered").data == patterned(big, 1));
    assert!(q3.iter().any(|t| t.data == patterned(100_000, 4)));
}

/// Records holding big payloads interleave with small ones in a turn, as events come: the log
/// keeps the turn's order, and a big task changed later in the turn replays to its last state.
#[test]
fn a_turn_of_big_and_small_changes_recovers_in_order() {
    let storage = MemStorage::new();
    let (mut wal, mut q, _) = open_mem(&storage, big_segments());
    // As the server does: each call's events handed to the log as the call returns.
    fn hand_over(wal: &mut Wal, q: &mut Queue) {
        let events: Vec<_> = q.drain_events().collect();
        for ev in events {
            wal.record_event(q, ev);
        }
    }
    let small = q.put(START, b"small".to_vec(), PutOptions::default()).id;
    hand_over(&mut wal, &mut q);
    let big = q
        .put(START, patterned(2 << 20, 2), PutOptions::default())
        .id;
    hand_over(&mut wal, &mut q);
    let acked = q
        .put(START, patterned(1 << 20, 3), PutOptions::default())
        .id;
    hand_over(&mut wal, &mut q);
    // Later in the same turn: the small task is taken and acked, the big one taken, the
    // second big one taken and acked (its record still holds its buffer).
    assert_eq!(q.take(START, 1).map(|t| t.id), Some(small));
    q.ack(1, small).expect("taken");
    assert_eq!(q.take(START, 1).map(|t| t.id), Some(big));
    assert_eq!(q.take(START, 2).map(|t| t.id), Some(acked));
    q.ack(2, acked).expect("taken");
    hand_over(&mut wal, &mut q);
    wal.append_turn(&mut q);
    wal.submit();
    wal.flush(&mut q, WAIT).expect("flushed");
    drop(wal);
    let (_wal, q, report) = open_mem(&storage, cfg(0));
    assert!(report.torn.is_none(), "{report:?}");
    assert!(
        q.get(small).is_none(),
        "the small task's ack is logged after its put"
    );
    assert!(q.get(acked).is_none(), "the acked big task stays gone");
    let t = q.get(big).expect("the big task is recovered");
    assert!(t.data == patterned(2 << 20, 2), "its bytes, in order");
    assert_eq!(t.status, tarq_engine::Status::Ready, "taken, back as ready");
}
