//! The server over a disk that fills up (the fault-injecting `MemStorage` behind the real WAL)
//! on a filesystem without `fallocate`, where the WAL cannot allocate room ahead: the put
//! being written when the disk filled waits, later puts/acks/releases get "WAL write failed:
//! No space left on device", takes and stats go on, and once there is room again the held put
//! is answered and changes are accepted, without a restart. (With room allocated ahead no
//! change waits: `tarq-wal`'s `tests/room.rs` and `full_disk.rs`.) With it, a put that waited
//! for a place in a full tube is refused at once if, when it may run, the disk has no room.

mod support;

use std::sync::Arc;
use std::time::Instant;

use rmpv::Value;
use support::{field, id_of, TestServer, WAIT};
use tarq_net::core::journal::Journal;
use tarq_net::server::Server;
use tarq_wal::{Crash, MemStorage, Wal, WalConfig, WalMode};

const ER_PROC_LUA: u32 = 32;

/// A server whose WAL (in write mode) lives in `storage`.
fn start(storage: &MemStorage) -> TestServer {
    let wal_cfg = WalConfig {
        mode: WalMode::Write,
        ..WalConfig::default()
    };
    let (wal, queue, _) = Wal::open(Arc::new(storage.clone()), wal_cfg.clone()).expect("open");
    let (cfg, dir) = TestServer::config(|c| c.wal = wal_cfg);
    let server = Server::with_journal(cfg, Journal::wal_with(wal, queue)).expect("bind");
    TestServer::spawn(server, dir, || {})
}

#[test]
fn without_fallocate_a_full_disk_holds_one_put_refuses_changes_and_recovers_by_itself() {
    let storage = MemStorage::new();
    storage.set_allocate_unsupported(true);
    let server = start(&storage);
    let mut a = server.connect();
    let mut b = server.connect();
    let first = id_of(&a.call("queue.put", &[Value::from("first")]).one());
    let second = id_of(&a.call("queue.put", &[Value::from("second")]).one());

    storage.set_space_left(Some(0));
    // This put is executed, but its turn cannot be written: its reply waits.
    let writes = storage.writes();
    let held_sync = b.send_call("queue.put", &[Value::from("held")]);
    // Wait for the failed write of that turn, so the next call is in a later turn.
    let deadline = Instant::now() + WAIT;
    while storage.writes() == writes {
        assert!(Instant::now() < deadline, "the held put's turn is written");
        std::thread::yield_now();
    }
    // Changes after the failure are refused at once, with the reason.
    let msg = a
        .call("queue.put", &[Value::from("refused")])
        .err(ER_PROC_LUA);
    assert_eq!(msg, "WAL write failed: No space left on device");
    // Takes of existing tasks and stats keep working.
    let t = a.call("queue.take", &[]).one();
    assert_eq!(id_of(&t), first);
    let stats = a.call("queue.stats", &[]).one();
    assert!(field(&stats, "total").as_u64().unwrap() >= 2, "{stats}");
    let ack = a.call("queue.ack", &[Value::from(first)]);
    assert_eq!(
        ack.err(ER_PROC_LUA),
        "WAL write failed: No space left on device"
    );

    // Room again: the retry writes the held turn, its reply arrives, changes are accepted.
    storage.set_space_left(None);
    let r = b.recv();
    assert_eq!(r.sync, held_sync);
    let held = id_of(&r.one());
    let ack = a.call("queue.ack", &[Value::from(first)]).one();
    assert_eq!(id_of(&ack), first);

    drop(server); // a clean stop: shut down, joined, its loop's result checked
    storage.crash(Crash::Process);
    let (_wal, q, _) = Wal::open(Arc::new(storage.clone()), WalConfig::default()).unwrap();
    assert!(
        q.get(first).is_none(),
        "the ack made after the disk recovered stays"
    );
    assert!(
        q.get(second).is_some() && q.get(held).is_some(),
        "nothing acknowledged was lost"
    );
    assert!(
        q.iter().all(|t| t.data != rmp_str("refused")),
        "refused puts never happened"
    );
}

fn rmp_str(s: &str) -> Vec<u8> {
    let mut v = Vec::new();
    rmpv::encode::write_value(&mut v, &Value::from(s)).unwrap();
    v
}

/// A put waiting for a place in a full `limfifottl` tube runs when a place frees (here a TTL
/// expiry); if by then the disk has no room for its record, it is refused at once, as any
/// change, instead of running and waiting for room.
#[test]
fn a_put_waiting_for_a_full_tube_is_refused_at_once_if_it_runs_on_a_full_disk() {
    let storage = MemStorage::new();
    let server = start(&storage);
    let mut a = server.connect();
    let mut b = server.connect();
    let capacity = support::map(&[("capacity", Value::from(1))]);
    a.call(
        "queue.create_tube",
        &[Value::from("lim"), Value::from("limfifottl"), capacity],
    )
    .one();
    let ttl = support::map(&[("ttl", Value::from(1))]);
    a.call("queue.tube.lim:put", &[Value::from("first"), ttl])
        .one();
    // Waits for the place; the ping's reply says it is parked.
    let wait = support::map(&[("timeout", Value::from(30))]);
    let waiting = b.send_call("queue.tube.lim:put", &[Value::from("waiting"), wait]);
    assert_eq!(b.ping().code, 0);

    // The disk fills: the room the WAL held ahead goes to other puts, then puts are refused.
    storage.set_space_left(Some(0));
    let payload = "p".repeat(64 << 10);
    let mut acked = Vec::new();
    let refusal = loop {
        let r = a.call("queue.put", &[Value::from(payload.as_str())]);
        if r.code != 0 {
            break r.err(ER_PROC_LUA);
        }
        acked.push(id_of(&r.one()));
        assert!(acked.len() < 1000, "the disk never filled");
    };
    assert_eq!(refusal, "WAL write failed: No space left on device");

    // The first task expires: the waiting put may run, and is refused for the disk.
    let r = b.recv();
    assert_eq!(r.sync, waiting);
    assert_eq!(
        r.err(ER_PROC_LUA),
        "WAL write failed: No space left on device"
    );

    drop(server);
    storage.crash(Crash::Process);
    let (_wal, q, _) = Wal::open(Arc::new(storage.clone()), WalConfig::default()).unwrap();
    assert!(
        acked.iter().all(|&id| q.get(id).is_some()),
        "nothing acknowledged was lost"
    );
    assert!(
        q.iter().all(|t| t.data != rmp_str("waiting")),
        "the refused put never happened"
    );
}
