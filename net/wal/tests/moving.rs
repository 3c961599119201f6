//! Tasks moved in from another node (`Queue::import_task`) through the WAL: logged as `Put`
//! records (no kind of their own, the format's version unchanged), they come back from a
//! restart — from the WAL alone and from a snapshot — in the status they were imported in (a
//! Taken one as every Taken task does: Ready, its delivery count kept) and on a replica that
//! follows the stream as they are, Taken ones still Taken; the dedup keys and the numbering
//! moved with them come back too, so no id of the moved tube is given again.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use tarq_engine::{
    id_number, Micros, MovedTask, PutOutcome, Queue, ReleaseOptions, Status, TaskId, TaskRef,
    TubeIx, TubeOptions, TubePut, TubeType,
};
use tarq_wal::format::{self, Kind};
use tarq_wal::{MemStorage, RecoveryReport, Storage, Wal, WalConfig, WalMode};

const WAIT: Duration = Duration::from_secs(20);
const SEC: Micros = 1_000_000;
const START: Micros = 1_700_000_000 * SEC;

fn cfg(replica: bool) -> WalConfig {
    WalConfig {
        mode: WalMode::Write,
        segment_bytes: 4000,
        snapshot_every_bytes: 0,
        snapshot_interval: None,
        keep_snapshots: 2,
        force_recovery: false,
        replica,
        loop_cpu: None,
    }
}

fn open(storage: &MemStorage, replica: bool) -> (Wal, Queue, RecoveryReport) {
    let storage: Arc<dyn Storage> = Arc::new(storage.clone());
    Wal::open(storage, cfg(replica)).unwrap_or_else(|e| panic!("recovery failed: {e}"))
}

/// The tubes a move copies: a fifottl with TTL and TTR, a utube, and one with a dedup window.
const TUBES: [(TubeIx, &str, TubeType); 3] = [
    (1, "jobs", TubeType::FifoTtl),
    (2, "per-user", TubeType::Utube),
    (3, "dedup", TubeType::FifoTtl),
];

fn opts(ix: TubeIx) -> TubeOptions {
    match ix {
        1 => TubeOptions {
            ttl: Some(600 * SEC),
            ttr: Some(30 * SEC),
            ..TubeOptions::default()
        },
        3 => TubeOptions {
            dedup_window: 60 * SEC,
            ..TubeOptions::default()
        },
        _ => TubeOptions::default(),
    }
}

fn make_tubes(q: &mut Queue) {
    for (ix, name, kind) in TUBES {
        q.create_tube_at(ix, name, kind, opts(ix), 0)
            .expect("new tube");
    }
}

fn put(q: &mut Queue, tube: TubeIx, p: TubePut<'_>) -> TaskId {
    match q.put_in(START, tube, b"moved payload".to_vec(), p) {
        Ok(PutOutcome::Created(t)) => t.id,
        other => panic!("a new task, got {other:?}"),
    }
}

/// The old owner (no WAL of its own here): a task of every status in each tube, one Taken
/// task with counters, deliveries and a TTR deadline, and numbers given to tasks already gone.
fn old_owner() -> Queue {
    let mut q = Queue::new();
    make_tubes(&mut q);
    let jobs = 1;
    let a = put(&mut q, jobs, TubePut::default());
    let gone = put(&mut q, jobs, TubePut::default());
    q.delete(jobs, gone).unwrap();
    put(
        &mut q,
        jobs,
        TubePut {
            delay: 5 * SEC,
            pri: Some(4),
            ..TubePut::default()
        },
    );
    let buried = put(&mut q, jobs, TubePut::default());
    q.bury(jobs, buried).unwrap();
    q.take_from(START, jobs, 11).unwrap();
    q.release_in(START, jobs, 11, a, ReleaseOptions::default())
        .unwrap();
    assert_eq!(q.take_from(START, jobs, 11).unwrap().map(|t| t.id), Some(a));
    // The tube's newest number, given to a task gone: only the numbering carries it.
    let newest = put(&mut q, jobs, TubePut::default());
    q.delete(jobs, newest).unwrap();
    let user = |k: &'static [u8]| TubePut {
        utube: k,
        ..TubePut::default()
    };
    let u = 2;
    put(&mut q, u, user(b"alice"));
    put(&mut q, u, user(b"alice"));
    put(&mut q, u, user(b"bob"));
    q.take_from(START, u, 12).unwrap();
    let d = 3;
    for key in [&b"x"[..], b"y"] {
        let id = put(
            &mut q,
            d,
            TubePut {
                dedup_key: Some(key),
                ..TubePut::default()
            },
        );
        if key == b"y" {
            q.delete(d, id).unwrap();
        }
    }
    q.check_invariants();
    q
}

/// Moves every tube of `from` into `to` (each at its index already): numbering, tasks (Taken
/// ones to session 50), dedup keys.
fn move_all(from: &Queue, to: &mut Queue) -> usize {
    let mut n = 0;
    for (ix, ..) in TUBES {
        to.import_numbers(ix, from.tube_numbers(ix)).unwrap();
        let mut after = None;
        loop {
            let page: Vec<MovedTask> = from.export_tube(ix, after, 2, usize::MAX).unwrap();
            let Some(last) = page.last() else { break };
            after = Some(last.id);
            for t in page {
                to.import_task(ix, t, 50).unwrap();
                n += 1;
            }
        }
        for d in from.export_dedup(ix, None, usize::MAX).unwrap() {
            to.import_dedup(ix, d).unwrap();
        }
    }
    to.check_invariants();
    n
}

/// A task as text, its session left out (no session survives a restart, and a replica's
/// Taken tasks are held by none of the primary's).
fn line(t: &TaskRef<'_>) -> String {
    format!(
        "task {} tube {} {:?} runat {} pri {} ttl {:?} ttr {:?} created {} deliveries {} utube {:?} counts {:?} data {:?}",
        t.id, t.tube, t.status, t.runat, t.pri, t.ttl, t.ttr, t.created, t.deliveries, t.utube, t.counts, t.data
    )
}

/// The queue's tasks, numbering and dedup keys as text; with `restarted`, each Taken task as
/// a restart brings it back (Ready, its utube free).
fn state(q: &Queue, restarted: bool) -> BTreeSet<String> {
    let mut out: BTreeSet<String> = q
        .iter()
        .map(|t| {
            let status = if restarted && t.status == Status::Taken {
                Status::Ready
            } else {
                t.status
            };
            line(&TaskRef { status, ..t })
        })
        .collect();
    for (ix, ..) in TUBES {
        out.insert(format!("tube {ix} {:?}", q.tube_numbers(ix)));
        for (key, id, expires) in q.dedup_entries(ix) {
            out.insert(format!("dedup {ix} {key:?} {id} {expires}"));
        }
    }
    out
}

/// The Put records in a stream of turns.
fn puts_in(stream: &[u8]) -> usize {
    let mut off = 0;
    let mut puts = 0;
    while off < stream.len() {
        let rec = format::parse_record(stream, off).expect("a whole record");
        puts += usize::from(rec.kind == Kind::Put);
        off = rec.end;
    }
    puts
}

/// The new owner, with a WAL: its tubes made in a turn of their own, then the move in
/// another. Returns its storage, queue and its whole log as a relay streams it.
fn new_owner(old: &Queue) -> (MemStorage, Wal, Queue, Vec<u8>, usize) {
    let storage = MemStorage::new();
    let (mut wal, mut q, _) = open(&storage, false);
    wal.set_tap(true);
    make_tubes(&mut q);
    wal.flush(&mut q, WAIT).expect("flushed");
    let moved = move_all(old, &mut q);
    wal.flush(&mut q, WAIT).expect("flushed");
    let mut stream = Vec::new();
    wal.take_tap(&mut stream);
    (storage, wal, q, stream, moved)
}

#[test]
fn moved_tasks_are_logged_as_puts_of_the_current_format() {
    let old = old_owner();
    let (_storage, _wal, q, stream, moved) = new_owner(&old);
    assert_eq!(moved, old.len());
    assert_eq!(puts_in(&stream), moved, "one Put record a moved task");
    let statuses: BTreeSet<&str> = q.iter().map(|t| t.status.as_str()).collect();
    assert_eq!(statuses.len(), 4, "every status moved: {statuses:?}");
    assert_eq!(state(&q, false), state(&old, false), "the copy is exact");
}

#[test]
fn moved_tasks_survive_a_restart_in_their_status() {
    let old = old_owner();
    let (storage, wal, q, _, _) = new_owner(&old);
    let want = state(&q, true);
    let taken: Vec<TaskId> = (q.iter())
        .filter(|t| t.status == Status::Taken)
        .map(|t| t.id)
        .collect();
    assert_eq!(taken.len(), 2);
    drop(wal);

    let (_wal, mut r, report) = open(&storage, false);
    assert!(!report.older_format, "{report:?}");
    assert_eq!(
        report.released,
        taken.len(),
        "the Taken ones came back Ready"
    );
    r.check_invariants();
    assert_eq!(state(&r, false), want);
    // The numbers given on the old node to tasks already gone stay given.
    assert_eq!(id_number(put(&mut r, 1, TubePut::default())), 5);
}

#[test]
fn moved_tasks_survive_a_restart_from_a_snapshot() {
    let old = old_owner();
    let (storage, mut wal, mut q, _, _) = new_owner(&old);
    wal.snapshot_now(&mut q, WAIT).expect("snapshot");
    let want = state(&q, true);
    drop(wal);
    let (_wal, mut r, report) = open(&storage, false);
    assert!(report.snapshot.is_some(), "{report:?}");
    assert_eq!(report.records, 0, "all from the snapshot");
    assert_eq!(state(&r, false), want);
    assert_eq!(id_number(put(&mut r, 1, TubePut::default())), 5);
}

#[test]
fn a_replica_replays_moved_tasks_as_they_are() {
    let old = old_owner();
    let (_storage, _wal, q, stream, _) = new_owner(&old);
    let replica_storage = MemStorage::new();
    let (mut rwal, mut r, _) = open(&replica_storage, true);
    rwal.apply_replicated(&mut r, &stream).expect("applied");
    r.check_invariants();
    assert_eq!(state(&r, false), state(&q, false), "Taken ones still Taken");
    for t in q.iter().filter(|t| t.status == Status::Taken) {
        let on_replica = r.get(t.id).unwrap();
        assert_eq!(on_replica.status, Status::Taken);
        assert_eq!(
            r.ttr_deadline(t.id),
            None,
            "as every Taken task on a replica"
        );
    }
    // The replica's own restart keeps them Taken too, from its own log.
    drop(rwal);
    let (_rwal, r2, _) = open(&replica_storage, true);
    assert_eq!(state(&r2, false), state(&q, false));
}

#[test]
fn a_task_imported_and_acked_in_one_turn_leaves_its_number_given() {
    let old = old_owner();
    let storage = MemStorage::new();
    let (mut wal, mut q, _) = open(&storage, false);
    make_tubes(&mut q);
    wal.flush(&mut q, WAIT).expect("flushed");
    // Only the Taken task of `jobs` (its first), its numbering not carried (no
    // import_numbers): only the import can have raised the tube's numbering past it.
    let taken = old
        .export_tube(1, None, 10, usize::MAX)
        .unwrap()
        .into_iter()
        .find(|t| t.status == Status::Taken)
        .unwrap();
    let id = taken.id;
    q.import_task(1, taken, 50).unwrap();
    q.ack_in(1, 50, id).unwrap();
    wal.flush(&mut q, WAIT).expect("flushed");
    drop(wal);
    let (_wal, mut r, _) = open(&storage, false);
    assert!(r.is_empty());
    assert_eq!(
        id_number(put(&mut r, 1, TubePut::default())),
        id_number(id) + 1
    );
}
