//! Users and grants through the WAL and snapshots (format 5; a user's own limits, format 7):
//! the table is logged whole after each change and comes back after a restart from the log
//! alone, from a snapshot alone, and from a snapshot with changes logged while it was walked; a
//! version-4 data directory (no users) opens, takes users from then on in newer files, and
//! keeps both readable; a user's limits in a file of version 6 are refused.

use std::sync::Arc;
use std::time::Duration;

use tarq_engine::{PutOptions, Queue, Rights, TubeOptions, TubeType, User, UserLimits};
use tarq_wal::format::{self, WAL_MAGIC};
use tarq_wal::{MemStorage, RecoveryReport, Storage, Wal, WalConfig, WalMode};

const WAIT: Duration = Duration::from_secs(20);
const NOW: u64 = 1_700_000_000_000_000;

fn cfg() -> WalConfig {
    WalConfig {
        mode: WalMode::Write,
        segment_bytes: 2000,
        snapshot_every_bytes: 0,
        snapshot_interval: None,
        keep_snapshots: 2,
        force_recovery: false,
        replica: false,
        loop_cpu: None,
    }
}

fn open(storage: &MemStorage) -> (Wal, Queue, RecoveryReport) {
    let s: Arc<dyn Storage> = Arc::new(storage.clone());
    Wal::open(s, cfg()).unwrap_or_else(|e| panic!("recovery failed: {e}"))
}

fn user(name: &str, hash: u8, admin: bool, grants: &[(&str, Rights)]) -> User {
    let mut u = User::new(name);
    u.hash2 = (hash != 0).then_some([hash; 20]);
    u.admin = admin;
    for (t, r) in grants {
        u.tubes.insert((*t).to_owned(), *r);
    }
    u
}

fn table(q: &Queue) -> Vec<User> {
    q.users().iter().cloned().collect()
}

#[test]
fn users_survive_a_restart_from_the_log_and_from_a_snapshot() {
    let storage = MemStorage::new();
    let (mut wal, mut q, _) = open(&storage);
    q.put_user(user("bob", 1, false, &[("jobs", Rights::PUT)]))
        .unwrap();
    q.put_user(user("ops", 2, true, &[])).unwrap();
    let mut guest = user("guest", 0, false, &[("*", Rights::TAKE)]);
    guest.limits.put_rate = Some(50);
    q.put_user(guest).unwrap();
    // Changed and dropped in the same turn as others: the last table wins.
    let mut bob = user(
        "bob",
        3,
        false,
        &[("jobs", Rights::PUT.union(Rights::TAKE))],
    );
    bob.limits = UserLimits {
        max_connections: Some(2),
        put_rate: Some(0),
    };
    q.put_user(bob).unwrap();
    q.put_user(user("gone", 4, false, &[])).unwrap();
    assert!(q.drop_user("gone").is_some());
    wal.flush(&mut q, WAIT).expect("flushed");
    let want = table(&q);
    assert_eq!(want.len(), 3);
    drop(wal);

    let (mut wal, mut q, _) = open(&storage);
    assert_eq!(table(&q), want, "from the log");
    let snap = wal.snapshot_now(&mut q, WAIT).expect("snapshot");
    drop(wal);
    for name in storage.list().unwrap() {
        if name.ends_with(format::WAL_SUFFIX) {
            storage.remove(&name).unwrap();
        }
    }
    let (mut wal, mut q, report) = open(&storage);
    assert_eq!(report.snapshot.as_deref(), Some(snap.as_str()));
    assert_eq!(table(&q), want, "from the snapshot alone");

    // A change after the snapshot's start replays on top of it.
    q.drop_user("ops").expect("there");
    q.put_user(user("eve", 5, false, &[("mail", Rights::ADMIN)]))
        .unwrap();
    wal.flush(&mut q, WAIT).expect("flushed");
    let want = table(&q);
    drop(wal);
    let (_wal, q, _) = open(&storage);
    assert_eq!(table(&q), want, "the snapshot and the log after it");
    assert!(q.users().get("ops").is_none());
}

#[test]
fn a_snapshot_walked_while_users_change_keeps_the_last_table() {
    let storage = MemStorage::new();
    let (mut wal, mut q, _) = open(&storage);
    for i in 0..50 {
        q.put(NOW, vec![i; 10], PutOptions::default());
    }
    q.put_user(user("bob", 1, false, &[])).unwrap();
    wal.flush(&mut q, WAIT).expect("flushed");
    assert!(wal.request_snapshot());
    // Changed once the walk runs: the snapshot holds the table at its start, the log the
    // change after it.
    let (mut turns, mut changed) = (0, false);
    while wal.snapshot_running() || turns == 0 {
        if wal.snapshot_running() && !changed {
            q.put_user(user("bob", 9, true, &[])).unwrap();
            changed = true;
        }
        wal.append_turn(&mut q);
        wal.submit();
        wal.poll(&mut q);
        turns += 1;
        assert!(turns < 100_000, "the snapshot ends");
        if turns % 64 == 0 {
            std::thread::yield_now();
        }
    }
    assert!(changed, "the walk ran");
    wal.flush(&mut q, WAIT).expect("flushed");
    let want = table(&q);
    drop(wal);
    let (_wal, q, report) = open(&storage);
    assert!(report.snapshot.is_some(), "{report:?}");
    assert_eq!(table(&q), want);
    assert!(q.users().get("bob").unwrap().admin);
}

/// A directory written by a build of format 4: its segments' headers say 4 (the records of
/// that format are this build's records without users and counters).
#[test]
fn a_version_4_data_directory_opens_and_takes_users_from_then_on() {
    let storage = MemStorage::new();
    let (mut wal, mut q, _) = open(&storage);
    let tube = q
        .create_tube("jobs", TubeType::Fifo, TubeOptions::default())
        .unwrap();
    q.put_in(NOW, tube, b"old".to_vec(), tarq_engine::TubePut::default())
        .unwrap();
    // Nor operation counters (format 6's `Counts`): the put's are not logged.
    q.take_counted(&mut Vec::new());
    wal.flush(&mut q, WAIT).expect("flushed");
    drop(wal);
    for name in storage.list().unwrap() {
        let mut bytes = storage.contents(&name).unwrap();
        let h = format::parse_file_header(&bytes, WAL_MAGIC).expect("a segment");
        bytes[..32].copy_from_slice(&format::file_header_version(WAL_MAGIC, 4, h.seq));
        storage.put_file(&name, bytes);
    }

    let (mut wal, mut q, report) = open(&storage);
    assert!(report.older_format, "{report:?}");
    assert!(q.users().is_empty());
    assert_eq!(q.tube_stats(tube).unwrap().ready, 1);
    q.put_user(user("bob", 1, false, &[("jobs", Rights::TAKE)]))
        .unwrap();
    wal.flush(&mut q, WAIT).expect("flushed");
    let want = table(&q);
    drop(wal);
    let versions: Vec<u32> = storage
        .list()
        .unwrap()
        .iter()
        .filter(|n| n.ends_with(format::WAL_SUFFIX))
        .map(|n| {
            format::parse_file_header(&storage.contents(n).unwrap(), WAL_MAGIC)
                .unwrap()
                .version
        })
        .collect();
    assert!(
        versions.contains(&4) && versions.contains(&format::FORMAT_VERSION),
        "{versions:?}"
    );
    let (_wal, q, _) = open(&storage);
    assert_eq!(table(&q), want);
    assert_eq!(q.tube_stats(tube).unwrap().ready, 1);
}

#[test]
fn a_users_record_is_refused_in_a_file_of_an_older_version() {
    let mut users = tarq_engine::Users::default();
    let mut q = Queue::new();
    q.put_user(user("bob", 1, false, &[])).unwrap();
    users.clone_from(q.users());
    let mut body = Vec::new();
    format::encode_users(&mut body, &users);
    let err = format::decode_change(format::Kind::Users, &body, 4)
        .err()
        .expect("refused");
    assert!(err.contains("version 4"), "{err}");
    match format::decode_change(format::Kind::Users, &body, 5) {
        Ok(format::Change::Users(back)) => assert_eq!(back, table(&q)),
        _ => panic!("decodes in version 5"),
    }
    // A user's own limits are version 7's: a file of 6 cannot hold them.
    let mut limited = user("carl", 1, false, &[]);
    limited.limits.max_connections = Some(3);
    q.put_user(limited).unwrap();
    users.clone_from(q.users());
    body.clear();
    format::encode_users(&mut body, &users);
    let err = format::decode_change(format::Kind::Users, &body, 6)
        .err()
        .expect("refused");
    assert!(err.contains("unknown flags"), "{err}");
    match format::decode_change(format::Kind::Users, &body, 7) {
        Ok(format::Change::Users(back)) => assert_eq!(back, table(&q)),
        _ => panic!("decodes in version 7"),
    }
}
