//! Files damaged byte for byte on the fault-injecting storage, and what a start makes of them:
//! a torn tail (a write the process or the machine did not finish) is cut; any other damage
//! to the WAL — a flipped byte in a record, also in the last turn, or a record's damaged
//! length — stops the start naming the file and the offset, or, on a replica, moves the log
//! aside so that it copies its primary again; damage in records the snapshot holds loses
//! nothing and does not stop it (so a start after `--force-recovery` is clean); a damaged
//! snapshot is passed over for an older one and set aside, and with none left the WAL must
//! reach back to its first record.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use tarq_engine::{Micros, PutOptions, Queue};
use tarq_wal::format::{RECORD_HEADER_LEN, SNAP_SUFFIX, WAL_SUFFIX};
use tarq_wal::{relay, MemStorage, RecoveryReport, Storage, Wal, WalConfig, WalError, WalMode};

const WAIT: Duration = Duration::from_secs(20);
const NOW: Micros = 1_700_000_000_000_000;
/// A record's kind byte: a `Put`, and the `Commit` that closes each turn.
const PUT: u8 = 1;
const COMMIT: u8 = 4;

fn cfg() -> WalConfig {
    WalConfig {
        mode: WalMode::Write,
        segment_bytes: 1 << 20,
        snapshot_every_bytes: 0,
        snapshot_interval: None,
        keep_snapshots: 2,
        force_recovery: false,
        replica: false,
        loop_cpu: None,
    }
}

fn try_open(
    storage: &MemStorage,
    cfg: WalConfig,
) -> Result<(Wal, Queue, RecoveryReport), WalError> {
    let storage: Arc<dyn Storage> = Arc::new(storage.clone());
    Wal::open(storage, cfg)
}

fn open(storage: &MemStorage, cfg: WalConfig) -> (Wal, Queue, RecoveryReport) {
    try_open(storage, cfg).unwrap_or_else(|e| panic!("recovery failed: {e}"))
}

fn refused(storage: &MemStorage, cfg: WalConfig) -> WalError {
    match try_open(storage, cfg) {
        Err(e) => e,
        Ok((_, q, report)) => panic!(
            "the start must stop; it recovered {} tasks: {report:?}",
            q.len()
        ),
    }
}

/// Every task: id → payload.
fn tasks(q: &Queue) -> BTreeMap<u64, Vec<u8>> {
    q.iter().map(|t| (t.id, t.data.to_vec())).collect()
}

/// `n` puts, one turn each, each durable before the next (acknowledged).
fn put_turns(wal: &mut Wal, q: &mut Queue, n: usize, tag: &str) {
    for i in 0..n {
        q.put(
            NOW,
            format!("{tag} {i}").into_bytes(),
            PutOptions::default(),
        );
        wal.append_turn(q);
        let batch = wal.submit();
        wal.poll(q);
        assert!(wal.is_durable(batch));
    }
}

/// A data directory holding `n` acknowledged puts in one segment; the queue it holds.
fn one_segment(storage: &MemStorage, n: usize) -> BTreeMap<u64, Vec<u8>> {
    let (mut wal, mut q, _) = open(storage, cfg());
    put_turns(&mut wal, &mut q, n, "task");
    tasks(&q)
}

fn names(storage: &MemStorage, suffix: &str) -> Vec<String> {
    let mut v: Vec<String> = storage
        .list()
        .unwrap()
        .into_iter()
        .filter(|n| n.ends_with(suffix))
        .collect();
    v.sort();
    v
}

/// A record of a segment as it lies in the file.
#[derive(Clone, Copy, Debug)]
struct At {
    off: usize,
    end: usize,
    kind: u8,
}

/// The records of a segment, read by their headers alone.
fn records(bytes: &[u8]) -> Vec<At> {
    let mut out = Vec::new();
    let mut off = 32;
    while off + RECORD_HEADER_LEN <= bytes.len() {
        let len = u32::from_le_bytes(bytes[off + 4..off + 8].try_into().unwrap()) as usize;
        let end = off + RECORD_HEADER_LEN + len;
        out.push(At {
            off,
            end,
            kind: bytes[off + 16],
        });
        off = end;
    }
    out
}

fn flip(storage: &MemStorage, name: &str, offset: usize) {
    let byte = storage.contents(name).unwrap()[offset];
    storage.corrupt(name, offset, byte ^ 0x20);
}

fn assert_names(e: &WalError, file: &str, offset: usize) {
    let msg = e.to_string();
    assert!(
        matches!(e, WalError::Corrupt { file: f, offset: o, .. } if f == file && *o == offset as u64),
        "names {file} at offset {offset}: {msg}"
    );
    assert!(msg.contains("--force-recovery"), "says what to do: {msg}");
}

#[test]
fn a_flipped_byte_in_the_last_turn_stops_the_start_instead_of_cutting_it() {
    let storage = MemStorage::new();
    let want = one_segment(&storage, 10);
    let seg = names(&storage, WAL_SUFFIX).remove(0);
    let before = storage.contents(&seg).unwrap();
    let commit = *records(&before).last().unwrap();
    assert_eq!(commit.kind, COMMIT);
    // A byte of the acknowledged last turn's Commit: whole on disk, its checksum fails.
    flip(&storage, &seg, commit.off + RECORD_HEADER_LEN + 2);

    let e = refused(&storage, cfg());
    assert_names(&e, &seg, commit.off);
    assert!(e.to_string().contains("acknowledged"), "{e}");
    assert_eq!(
        storage.contents(&seg).unwrap().len(),
        before.len(),
        "nothing was cut"
    );

    // --force-recovery keeps what is readable: the turn whose Commit rotted is lost.
    let mut c = cfg();
    c.force_recovery = true;
    let (_wal, q, report) = open(&storage, c);
    assert_eq!(report.lost.len(), 1, "{report:?}");
    assert_eq!(q.len(), want.len() - 1);
}

#[test]
fn a_damaged_length_of_the_last_record_is_not_taken_for_a_torn_write() {
    let storage = MemStorage::new();
    one_segment(&storage, 10);
    let seg = names(&storage, WAL_SUFFIX).remove(0);
    let commit = *records(&storage.contents(&seg).unwrap()).last().unwrap();
    // The length's second byte: the record now claims more bytes than the file holds.
    flip(&storage, &seg, commit.off + 5);
    let e = refused(&storage, cfg());
    assert_names(&e, &seg, commit.off);
}

#[test]
fn a_torn_tail_is_still_cut_whatever_a_power_loss_left_of_it() {
    let storage = MemStorage::new();
    let want = one_segment(&storage, 10);
    let seg = names(&storage, WAL_SUFFIX).remove(0);
    let good = storage.contents(&seg).unwrap();
    // A turn being written when the power went: its record's header and first sector made it
    // to disk, the sector after it did not (zeros), the one after that did.
    let body = 1200;
    let mut torn = good.clone();
    torn.extend_from_slice(&0x7172_6174u32.to_le_bytes());
    torn.extend_from_slice(&(body as u32).to_le_bytes());
    torn.extend_from_slice(&[0xAB; RECORD_HEADER_LEN - 8]);
    torn.extend_from_slice(&[0xCD; 1200]);
    let lost_sector = good.len().div_ceil(512) * 512;
    torn[lost_sector..lost_sector + 512].fill(0);
    // And the plain cases: the file ends inside the record, or in zeros after its header.
    let mut short = good.clone();
    short.extend_from_slice(&torn[good.len()..good.len() + 100]);
    let mut zeroed = good.clone();
    zeroed.extend_from_slice(&torn[good.len()..good.len() + 8]);
    zeroed.resize(good.len() + 64, 0);
    for (what, bytes) in [
        ("a lost sector", torn),
        ("cut short", short),
        ("zeros", zeroed),
    ] {
        storage.put_file(&seg, bytes.clone());
        let (wal, q, report) = open(&storage, cfg());
        let t = report.torn.unwrap_or_else(|| panic!("{what}: cut as torn"));
        assert_eq!(
            (t.offset, t.bytes),
            (good.len() as u64, (bytes.len() - good.len()) as u64)
        );
        assert_eq!(tasks(&q), want, "{what}");
        assert_eq!(
            storage.contents(&seg).unwrap(),
            good,
            "{what}: the tail was cut"
        );
        drop(wal);
    }
}

#[test]
fn damage_in_a_segment_before_the_last_stops_the_start() {
    let storage = MemStorage::new();
    let mut c = cfg();
    c.segment_bytes = 4096;
    let (mut wal, mut q, _) = open(&storage, c.clone());
    put_turns(&mut wal, &mut q, 120, "task");
    drop(wal);
    let segs = names(&storage, WAL_SUFFIX);
    assert!(segs.len() >= 3, "{segs:?}");
    // Its last turn's Commit: a turn-closing record like any other in a segment that is not
    // the last, where no tail is torn.
    let seg = &segs[1];
    let intact = storage.contents(seg).unwrap();
    let commit = *records(&intact).last().unwrap();
    flip(&storage, seg, commit.off + RECORD_HEADER_LEN);
    assert_names(&refused(&storage, c.clone()), seg, commit.off);
    storage.put_file(seg, intact);

    // Cut short at a turn's end instead: records are missing before the next segment.
    let bytes = storage.contents(&segs[0]).unwrap();
    let ends: Vec<At> = records(&bytes)
        .into_iter()
        .filter(|r| r.kind == COMMIT)
        .collect();
    let cut = ends[ends.len() / 2].end;
    storage.put_file(&segs[0], bytes[..cut].to_vec());
    let e = refused(&storage, c);
    assert!(
        matches!(&e, WalError::Corrupt { file, .. } if file == &segs[1]),
        "{e}"
    );
    assert!(e.to_string().contains("missing before this file"), "{e}");
}

#[test]
fn after_force_recovery_the_next_start_is_clean() {
    let storage = MemStorage::new();
    let want = one_segment(&storage, 20);
    let seg = names(&storage, WAL_SUFFIX).remove(0);
    let bytes = storage.contents(&seg).unwrap();
    let victim = records(&bytes)
        .into_iter()
        .filter(|r| r.kind == PUT)
        .nth(5)
        .unwrap();
    flip(&storage, &seg, victim.off + RECORD_HEADER_LEN + 1);
    assert_names(&refused(&storage, cfg()), &seg, victim.off);

    let mut c = cfg();
    c.force_recovery = true;
    let (mut wal, mut q, report) = open(&storage, c);
    assert_eq!(report.lost.len(), 1, "{report:?}");
    assert_eq!(q.len(), want.len() - 1);
    let kept = tasks(&q);
    // The snapshot it asks for holds the state without the lost put. Nothing written since:
    // the damaged segment is still the last one, so no clean-up removes it.
    wal.snapshot_now(&mut q, WAIT).expect("snapshot");
    drop(wal);
    assert_eq!(names(&storage, WAL_SUFFIX), vec![seg.clone()]);

    // The damage is in records the snapshot holds: nothing is lost, the start goes on.
    let (mut wal, mut q, report) = open(&storage, cfg());
    assert_eq!(tasks(&q), kept);
    assert!(
        report.lost.is_empty() && report.torn.is_none(),
        "{report:?}"
    );
    put_turns(&mut wal, &mut q, 3, "after");
    let after = tasks(&q);
    drop(wal);
    let (_wal, q, _) = open(&storage, cfg());
    assert_eq!(tasks(&q), after);
}

/// A directory with two snapshots and the WAL since the older one (segments small enough that
/// older ones went); the queue it holds, and the snapshots, older first.
fn two_snapshots(storage: &MemStorage, c: &WalConfig) -> (BTreeMap<u64, Vec<u8>>, Vec<String>) {
    let (mut wal, mut q, _) = open(storage, c.clone());
    put_turns(&mut wal, &mut q, 40, "a");
    let older = wal.snapshot_now(&mut q, WAIT).expect("snapshot");
    put_turns(&mut wal, &mut q, 40, "b");
    let newer = wal.snapshot_now(&mut q, WAIT).expect("snapshot");
    put_turns(&mut wal, &mut q, 5, "c");
    (tasks(&q), vec![older, newer])
}

/// A byte in the middle of a snapshot's first task block.
fn flip_snapshot(storage: &MemStorage, name: &str) {
    let len = storage.contents(name).unwrap().len();
    flip(storage, name, len / 2);
}

#[test]
fn a_damaged_newest_snapshot_is_passed_over_and_set_aside() {
    let mut c = cfg();
    c.segment_bytes = 4096;
    for truncate in [false, true] {
        let storage = MemStorage::new();
        let (want, snaps) = two_snapshots(&storage, &c);
        let bytes = storage.contents(&snaps[1]).unwrap();
        if truncate {
            storage.put_file(&snaps[1], bytes[..bytes.len() - 30].to_vec());
        } else {
            flip_snapshot(&storage, &snaps[1]);
        }
        let (wal, q, report) = open(&storage, c.clone());
        assert_eq!(tasks(&q), want, "truncated: {truncate}");
        assert_eq!(report.snapshot.as_deref(), Some(snaps[0].as_str()));
        assert_eq!(report.damaged_snapshots.len(), 1, "{report:?}");
        assert_eq!(report.damaged_snapshots[0].file, snaps[1]);
        // Moved, not deleted: no replica that joins is sent it, and it counts for no kept
        // snapshot.
        assert_eq!(names(&storage, SNAP_SUFFIX), vec![snaps[0].clone()]);
        let aside = storage.set_aside_files();
        assert_eq!(aside.len(), 1, "{aside:?}");
        assert!(aside[0].starts_with("damaged-") && aside[0].ends_with(&format!("/{}", snaps[1])));
        let source = relay::join_source(&*wal.storage()).unwrap();
        assert_eq!(format!("{:020}{SNAP_SUFFIX}", source.start_seq), snaps[0]);
    }
}

#[test]
fn every_snapshot_damaged_and_the_wal_gone_before_them_stops_the_start_naming_them() {
    let mut c = cfg();
    c.segment_bytes = 4096;
    let storage = MemStorage::new();
    let (want, snaps) = two_snapshots(&storage, &c);
    let first_seg = names(&storage, WAL_SUFFIX).remove(0);
    assert_ne!(
        first_seg,
        format!("{:020}{WAL_SUFFIX}", 1),
        "older WAL was removed"
    );
    for s in &snaps {
        flip_snapshot(&storage, s);
    }
    let e = refused(&storage, c.clone());
    let msg = e.to_string();
    assert!(matches!(e, WalError::SnapshotsDamaged { .. }), "{msg}");
    for s in &snaps {
        assert!(
            msg.contains(&format!("{s} at offset")),
            "names {s} and where: {msg}"
        );
    }
    assert!(msg.contains("--force-recovery"), "{msg}");
    assert_eq!(
        names(&storage, SNAP_SUFFIX),
        snaps,
        "nothing moved when refusing"
    );

    // With the whole WAL instead, it is the state: replayed from its first record.
    let storage = MemStorage::new();
    let mut whole = c.clone();
    whole.segment_bytes = 1 << 20;
    let (want_whole, snaps) = two_snapshots(&storage, &whole);
    for s in &snaps {
        flip_snapshot(&storage, s);
    }
    let (_wal, q, report) = open(&storage, whole);
    assert_eq!(tasks(&q), want_whole);
    assert!(report.snapshot.is_none());
    assert_eq!(report.damaged_snapshots.len(), 2);
    assert_ne!(want, BTreeMap::new());
}

#[test]
fn without_a_wal_a_damaged_snapshot_stops_the_start_instead_of_an_empty_queue() {
    let storage = MemStorage::new();
    let mut c = cfg();
    c.mode = WalMode::None;
    let (mut wal, mut q, _) = open(&storage, c.clone());
    for i in 0..30 {
        q.put(NOW, format!("task {i}").into_bytes(), PutOptions::default());
    }
    let snap = wal.snapshot_now(&mut q, WAIT).expect("snapshot");
    drop(wal);
    assert!(names(&storage, WAL_SUFFIX).is_empty());
    flip_snapshot(&storage, &snap);
    let e = refused(&storage, c.clone());
    assert!(
        matches!(
            e,
            WalError::SnapshotsDamaged {
                wal_first: None,
                ..
            }
        ),
        "{e}"
    );
    assert!(e.to_string().contains(&snap), "{e}");

    // --force-recovery starts empty, as asked, and says what was lost.
    c.force_recovery = true;
    let (_wal, q, report) = open(&storage, c);
    assert_eq!(q.len(), 0);
    assert!(
        report.lost.len() == 1 && report.lost[0].contains("all they held is lost"),
        "{report:?}"
    );
}

#[test]
fn a_replica_with_a_damaged_log_sets_it_aside_and_starts_empty() {
    let storage = MemStorage::new();
    one_segment(&storage, 20);
    let seg = names(&storage, WAL_SUFFIX).remove(0);
    let victim = records(&storage.contents(&seg).unwrap())[7];
    flip(&storage, &seg, victim.off + RECORD_HEADER_LEN);
    let damaged = storage.contents(&seg).unwrap();

    let mut c = cfg();
    c.replica = true;
    let (wal, q, report) = open(&storage, c);
    assert_eq!(q.len(), 0, "nothing is served from a log with a hole in it");
    assert_eq!(wal.last_seq(), 0, "it copies its primary from the start");
    let aside = wal.started_over().expect("the log was set aside").clone();
    assert_eq!(report.set_aside.as_ref(), Some(&aside));
    assert!(aside.folder.starts_with("damaged-"), "{aside:?}");
    assert!(
        aside.cause.contains(&seg) && aside.cause.contains(&format!("offset {}", victim.off)),
        "{aside:?}"
    );
    assert_eq!(aside.files, vec![seg.clone()]);
    assert!(storage
        .list()
        .unwrap()
        .iter()
        .all(|n| !n.ends_with(WAL_SUFFIX)));
    assert_eq!(
        storage.aside_contents(&format!("{}/{seg}", aside.folder)),
        Some(damaged),
        "kept byte for byte"
    );
}
