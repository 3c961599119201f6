//! Room on the disk, against the fault-injecting storage (its free space counts allocations as
//! a filesystem does): a change the disk has no room for is refused before the queue changes,
//! every admitted change is written (none waits for room), takes go on in the reserve, a retry
//! finds room again by itself; rotation allocates the new segment before a change goes into
//! it and gives back the old one's tail; a preallocated segment recovers, its tail given back
//! (and zeros past the records read as the end of the log); a snapshot on a nearly full disk
//! cannot take the log's room; a filesystem without `fallocate` falls back to waiting for room.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use tarq_engine::{Micros, PutOptions, Queue};
use tarq_wal::room::{task_record_bytes, SMALL_RECORD_BYTES, TAKE_RESERVE_BYTES};
use tarq_wal::{
    Crash, ManualClock, MemStorage, RecoveryReport, Storage, Wal, WalConfig, WalMode,
    RETRY_INTERVAL,
};

const SEC: Micros = 1_000_000;
const NOW: Micros = 1_700_000_000 * SEC;
const FULL: &str = "WAL write failed: No space left on device";

fn cfg(segment_bytes: u64) -> WalConfig {
    WalConfig {
        mode: WalMode::Write,
        segment_bytes,
        snapshot_every_bytes: 0,
        ..WalConfig::default()
    }
}

fn open(storage: &MemStorage, cfg: WalConfig, clock: &ManualClock) -> (Wal, Queue, RecoveryReport) {
    let storage: Arc<dyn Storage> = Arc::new(storage.clone());
    Wal::open_with_clock(storage, cfg, Arc::new(clock.clone())).expect("recovers")
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

/// id → payload.
fn tasks(q: &Queue) -> BTreeMap<u64, Vec<u8>> {
    q.iter().map(|t| (t.id, t.data.to_vec())).collect()
}

/// A put as the server makes it: the room first, then the change, then the turn. Returns the
/// id, or the refusal (the queue untouched).
fn put(wal: &mut Wal, q: &mut Queue, payload: &[u8]) -> Result<u64, String> {
    wal.reserve(task_record_bytes(payload.len()))
        .map_err(|e| e.to_string())?;
    let id = q.put(NOW, payload.to_vec(), PutOptions::default()).id;
    wal.append_turn(q);
    let turn = wal.submit();
    assert!(wal.is_durable(turn), "an admitted put never waits for room");
    Ok(id)
}

#[test]
fn a_change_without_room_is_refused_at_once_takes_go_on_and_room_comes_back() {
    let storage = MemStorage::new();
    let clock = ManualClock::new();
    let (mut wal, mut q, _) = open(&storage, cfg(64 << 20), &clock);
    let payload = vec![b'p'; 64 << 10];
    let mut acked = BTreeMap::new();
    acked.insert(put(&mut wal, &mut q, &payload).unwrap(), payload.clone());
    let seg = &segments(&storage)[0];
    assert!(
        storage.allocated(seg).unwrap()
            >= storage.contents(seg).unwrap().len() as u64 + TAKE_RESERVE_BYTES,
        "the segment is allocated ahead, the reserve included"
    );

    // The disk fills up (another file took it): puts go on in what is allocated, then are
    // refused before they change anything.
    storage.set_space_left(Some(0));
    let refusal = loop {
        match put(&mut wal, &mut q, &payload) {
            Ok(id) => acked.insert(id, payload.clone()),
            Err(e) => break e,
        };
        assert!(acked.len() < 1000, "the disk never filled");
    };
    assert_eq!(refusal, FULL);
    assert!(acked.len() > 2, "the allocation ahead held some puts");
    assert_eq!(tasks(&q), acked, "the refused put changed nothing");
    let s = wal.stats();
    assert!(s.disk_full);
    assert_eq!(s.refusals, 1);
    assert_eq!(s.write_errors, 0, "no write met the full disk");

    // Every change is refused at once, with the same reason; takes go on in the reserve and
    // their turns are written.
    assert_eq!(
        wal.reserve(SMALL_RECORD_BYTES).unwrap_err().to_string(),
        FULL
    );
    assert_eq!(wal.stats().refusals, 2);
    for _ in 0..3 {
        wal.reserve_take().expect("takes are not refused");
        q.take(NOW, 1).expect("a ready task");
        wal.append_turn(&mut q);
        let turn = wal.submit();
        wal.poll(&mut q);
        assert!(wal.is_durable(turn));
    }
    assert_eq!(wal.stats().write_errors, 0);

    // The loop wakes for the retry; before it nothing changes, at it the room is found.
    assert_eq!(wal.timeout(), Some(RETRY_INTERVAL));
    storage.set_space_left(None);
    clock.advance(RETRY_INTERVAL - Duration::from_micros(1));
    wal.poll(&mut q);
    assert!(wal.check_writable().is_err(), "no retry before its time");
    clock.advance(Duration::from_micros(1));
    wal.poll(&mut q);
    wal.check_writable().expect("room again");
    assert!(!wal.stats().disk_full);
    let id = put(&mut wal, &mut q, b"after").expect("puts are accepted again");
    acked.insert(id, b"after".to_vec());

    // Nothing acknowledged is lost, nothing refused appears.
    drop(wal);
    storage.crash(Crash::Process);
    let (_wal, q, _) = open(&storage, cfg(64 << 20), &clock);
    assert_eq!(tasks(&q), acked);
}

#[test]
fn a_take_beside_a_change_never_takes_its_room() {
    let storage = MemStorage::new();
    let clock = ManualClock::new();
    let (mut wal, mut q, _) = open(&storage, cfg(64 << 20), &clock);
    // More ready tasks than the reserve holds take records.
    let n = TAKE_RESERVE_BYTES / 40;
    for i in 0..n {
        q.put(NOW, i.to_le_bytes().to_vec(), PutOptions::default());
    }
    wal.append_turn(&mut q);
    wal.submit();
    // Room for the put's reservation exactly (no chunk ahead), and none after.
    storage.set_space_left(Some(
        task_record_bytes(5) + SMALL_RECORD_BYTES + TAKE_RESERVE_BYTES,
    ));

    // One turn: a put, then takes until one is refused.
    wal.reserve(task_record_bytes(5)).expect("room for the put");
    let put = q.put(NOW, b"fresh".to_vec(), PutOptions::default()).id;
    wal.append_turn(&mut q);
    let mut took = 0;
    let refusal = loop {
        match wal.reserve_take() {
            Ok(()) => {
                q.take(NOW, 9).expect("a ready task");
                wal.append_turn(&mut q);
                took += 1;
            }
            Err(e) => break e.to_string(),
        }
        assert!(took < n, "a take was refused before the tasks ran out");
    };
    assert_eq!(refusal, FULL);
    assert!(took > 1000, "the reserve held takes: {took}");
    let turn = wal.submit();
    assert!(wal.is_durable(turn), "the put's turn was written whole");
    assert_eq!(wal.stats().write_errors, 0);
    drop(wal);
    storage.crash(Crash::Process);
    let (_wal, q, _) = open(&storage, cfg(64 << 20), &clock);
    assert!(q.get(put).is_some(), "the acknowledged put is there");
}

#[test]
fn rotation_allocates_the_new_segment_first_and_gives_back_the_old_tail() {
    let storage = MemStorage::new();
    let clock = ManualClock::new();
    let c = cfg(4096);
    let (mut wal, mut q, _) = open(&storage, c.clone(), &clock);
    let payload = vec![b'r'; 1500];
    let mut acked = BTreeMap::new();
    while segments(&storage).len() < 4 {
        acked.insert(put(&mut wal, &mut q, &payload).unwrap(), payload.clone());
    }
    let segs = segments(&storage);
    for s in &segs[..segs.len() - 1] {
        assert_eq!(
            storage.allocated(s),
            Some(storage.contents(s).unwrap().len() as u64),
            "{s}: a rotated segment keeps no space past its end"
        );
    }
    let current = segs.last().unwrap();
    assert!(storage.allocated(current).unwrap() > TAKE_RESERVE_BYTES);

    // Puts until one fills the segment: it rotates, and no segment is open until the next
    // change. The disk is taken away then: that change is refused, as the new segment could
    // not be allocated, and no segment is left behind.
    while wal.stats().allocated_ahead > 0 {
        acked.insert(put(&mut wal, &mut q, &payload).unwrap(), payload.clone());
    }
    let before = segments(&storage).len();
    storage.set_space_left(Some(0));
    assert_eq!(put(&mut wal, &mut q, &payload).unwrap_err(), FULL);
    assert_eq!(segments(&storage).len(), before, "no segment without room");
    assert_eq!(wal.stats().write_errors, 0);

    storage.set_space_left(None);
    clock.advance(RETRY_INTERVAL);
    wal.poll(&mut q);
    acked.insert(put(&mut wal, &mut q, b"after").unwrap(), b"after".to_vec());
    assert_eq!(segments(&storage).len(), before + 1);
    drop(wal);
    storage.crash(Crash::Process);
    let (_wal, q, _) = open(&storage, c, &clock);
    assert_eq!(tasks(&q), acked);
}

#[test]
fn a_preallocated_segment_recovers_whole_and_its_tail_is_given_back() {
    let storage = MemStorage::new();
    let clock = ManualClock::new();
    let (mut wal, mut q, _) = open(&storage, cfg(64 << 20), &clock);
    let mut acked = BTreeMap::new();
    for i in 0..20u32 {
        let p = format!("task {i}").into_bytes();
        acked.insert(put(&mut wal, &mut q, &p).unwrap(), p);
    }
    let seg = segments(&storage)[0].clone();
    let len = storage.contents(&seg).unwrap().len() as u64;
    assert!(storage.allocated(&seg).unwrap() > len + TAKE_RESERVE_BYTES);
    // Killed with its allocation ahead: the file's length is what was written.
    drop(wal);
    storage.crash(Crash::Process);
    let (wal, q, report) = open(&storage, cfg(64 << 20), &clock);
    assert_eq!(tasks(&q), acked);
    assert!(report.torn.is_none(), "no tail to cut: {report:?}");
    assert_eq!(
        storage.allocated(&seg),
        Some(len),
        "the start gives back the space allocated past the end"
    );
    drop(wal);

    // A filesystem that showed the allocation as zeros past the records (a preallocation
    // that moves the length, as etcd's): the zeros read as the end of the log, with or
    // without a torn record before them.
    for torn in [&b""[..], &b"\x74\x61\x72\x71\x10\x00"[..]] {
        let mut bytes = storage.contents(&seg).unwrap()[..len as usize].to_vec();
        bytes.extend_from_slice(torn);
        bytes.resize(bytes.len() + 64 * 1024, 0);
        storage.put_file(&seg, bytes);
        let (wal, q, report) = open(&storage, cfg(64 << 20), &clock);
        assert_eq!(tasks(&q), acked, "torn record {torn:?}");
        let cut = report.torn.expect("the zeros are cut as a torn tail");
        assert_eq!(cut.offset, len);
        assert_eq!(storage.contents(&seg).unwrap().len() as u64, len);
        drop(wal);
    }
}

#[test]
fn without_fallocate_a_change_meeting_a_full_disk_waits_for_room_as_before() {
    let storage = MemStorage::new();
    storage.set_allocate_unsupported(true);
    let clock = ManualClock::new();
    let (mut wal, mut q, _) = open(&storage, cfg(1 << 20), &clock);
    wal.reserve(task_record_bytes(3))
        .expect("admitted without room");
    q.put(NOW, b"one".to_vec(), PutOptions::default());
    wal.append_turn(&mut q);
    wal.submit();
    storage.set_space_left(Some(10));
    wal.reserve(task_record_bytes(3))
        .expect("nothing to reserve: admitted");
    let two = q.put(NOW, b"two".to_vec(), PutOptions::default()).id;
    wal.append_turn(&mut q);
    let held = wal.submit();
    assert!(
        !wal.is_durable(held),
        "its write met the full disk: it waits"
    );
    assert_eq!(wal.reserve(1).unwrap_err().to_string(), FULL);
    storage.set_space_left(None);
    clock.advance(RETRY_INTERVAL);
    wal.poll(&mut q);
    assert!(wal.is_durable(held), "written by the retry");
    drop(wal);
    storage.crash(Crash::Process);
    let (_wal, q, _) = open(&storage, cfg(1 << 20), &clock);
    assert!(q.get(two).is_some());
}

#[test]
fn without_a_wal_nothing_is_reserved() {
    let storage = MemStorage::new();
    let clock = ManualClock::new();
    let c = WalConfig {
        mode: WalMode::None,
        ..cfg(1 << 20)
    };
    let (mut wal, _q, _) = open(&storage, c, &clock);
    storage.set_space_left(Some(0));
    wal.reserve(task_record_bytes(1 << 20))
        .expect("no WAL, no room needed");
    assert!(segments(&storage).is_empty());
}

/// Blocks the file `name` in `dir` has on disk, in bytes.
fn disk_bytes(dir: &std::path::Path, name: &str) -> u64 {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(dir.join(name)).unwrap().blocks() * 512
}

#[test]
fn a_real_segment_is_allocated_ahead_and_its_tail_given_back_at_the_stop() {
    let dir = tempfile::tempdir().unwrap();
    let c = cfg(64 << 20);
    let (mut wal, mut q, _) = Wal::open_dir(dir.path(), c.clone()).unwrap();
    let id = put(&mut wal, &mut q, b"on disk").unwrap();
    let seg = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .find(|n| n.ends_with(".xlog"))
        .expect("a segment");
    let len = std::fs::metadata(dir.path().join(&seg)).unwrap().len();
    assert!(len < 4096, "the length is what was written: {len}");
    assert!(
        disk_bytes(dir.path(), &seg) >= TAKE_RESERVE_BYTES,
        "the space ahead is the file's ({} bytes on disk)",
        disk_bytes(dir.path(), &seg)
    );
    assert!(wal.stats().allocated_ahead >= TAKE_RESERVE_BYTES);
    wal.close(&mut q, Duration::from_secs(20)).unwrap();
    assert!(
        disk_bytes(dir.path(), &seg) < 64 * 1024,
        "given back at the stop"
    );
    drop(wal);
    let (_wal, q, _) = Wal::open_dir(dir.path(), c).unwrap();
    assert_eq!(
        q.get(id).map(|t| t.data.to_vec()),
        Some(b"on disk".to_vec())
    );
}

#[test]
fn a_snapshot_on_a_nearly_full_disk_cannot_take_the_logs_room() {
    let storage = MemStorage::new();
    let clock = ManualClock::new();
    let (mut wal, mut q, _) = open(&storage, cfg(64 << 20), &clock);
    let payload = vec![b's'; 1024];
    let mut acked = BTreeMap::new();
    for _ in 0..200 {
        acked.insert(put(&mut wal, &mut q, &payload).unwrap(), payload.clone());
    }
    let free = 10 * 1024;
    storage.set_space_left(Some(free));
    wal.snapshot_now(&mut q, Duration::from_secs(20))
        .expect_err("no room for a snapshot of 200 KiB");
    let names = storage.list().unwrap();
    assert!(
        names.iter().all(|n| !n.ends_with(".inprogress")),
        "the failed snapshot's file is gone: {names:?}"
    );
    assert_eq!(storage.space_left(), Some(free), "and its space is back");
    // The log's room was allocated ahead: the snapshot could not take it.
    for _ in 0..100 {
        acked.insert(put(&mut wal, &mut q, &payload).unwrap(), payload.clone());
    }
    assert_eq!(wal.stats().write_errors, 0);
    drop(wal);
    storage.crash(Crash::Process);
    let (_wal, q, _) = open(&storage, cfg(64 << 20), &clock);
    assert_eq!(tasks(&q), acked);
}
