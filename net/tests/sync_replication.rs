//! Synchronous replication (`--sync-replicas N`), end to end with the real binary: a change is
//! answered only once a replica has it durably, so with the only replica stopped (SIGSTOP) a
//! put waits, and it is answered when the replica resumes; every task acknowledged to the
//! client is on the replica at that moment, task by task. A change that waits past
//! `--sync-timeout` stays applied (Tarantool's new `replication_synchro_timeout` behaviour), so
//! it is answered ER_OUTCOME_UNKNOWN, not Tarantool's ER_SYNC_QUORUM_TIMEOUT, which there means
//! rolled back. Every wait has a deadline; "not answered" is read
//! from the primary's own figure of waiting turns, not from a pause.

mod support;

use rmpv::Value;
use support::{field, wait_until, Client, Tarq};
use tarq_iproto::codes::ER_OUTCOME_UNKNOWN;

fn stat(c: &mut Client, name: &str) -> u64 {
    let stats = c.call("queue.stats", &[]).one();
    field(&stats, name).as_u64().unwrap_or(0)
}

/// A primary with `args` and one replica streaming from it.
fn pair(args: &[&str], replica_mode: &str) -> (Tarq, Tarq, Client, Client) {
    let primary = Tarq::start(args);
    let paddr = primary.addr.to_string();
    let mut replica = Tarq::start(&["--replica-of", &paddr, "--wal-mode", replica_mode]);
    replica.wait_for_line("streaming from the primary");
    let mut p = Client::connect(primary.addr);
    let r = Client::connect(replica.addr);
    wait_until("the replica streams", || stat(&mut p, "replicas") == 1);
    (primary, replica, p, r)
}

/// The task `id` as the replica has it (seed API), or None.
fn on_replica(r: &mut Client, id: u64) -> Option<Value> {
    let reply = r.call("queue.tube.default:peek", &[id.into()]);
    (reply.code == 0).then(|| reply.one())
}

fn sync_put_waits_for_the_stopped_replica(replica_mode: &str) {
    let (primary, replica, mut p, mut r) = pair(
        &[
            "--sync-replicas",
            "1",
            "--sync-timeout",
            "120",
            "--wal-mode",
            "fsync",
        ],
        replica_mode,
    );
    // While the replica runs, each put is answered, and is on the replica when it is.
    for i in 0..20 {
        let t = p.call("queue.put", &[format!("before{i}").into()]).one();
        let id = field(&t, "id").as_u64().unwrap();
        assert!(
            on_replica(&mut r, id).is_some(),
            "acknowledged task {id} missing on the replica"
        );
    }
    replica.signal("STOP");
    let mut writer = Client::connect(primary.addr);
    let sync = writer.send_call("queue.put", &["while stopped".into()]);
    let sync2 = writer.send_call("queue.put", &["also while stopped".into()]);
    wait_until("the puts wait for the replica", || {
        stat(&mut p, "sync_waiting") >= 1 && stat(&mut p, "total") == 22
    });
    // Applied on the primary, written, and still not answered: the figure says why.
    assert_eq!(stat(&mut p, "sync_timeouts"), 0);
    replica.signal("CONT");
    let a = writer.recv();
    let b = writer.recv();
    assert_eq!((a.sync, b.sync), (sync, sync2));
    for reply in [a, b] {
        assert_eq!(reply.code, 0, "{:?}", reply.error);
        let id = field(&reply.one(), "id").as_u64().unwrap();
        assert!(
            on_replica(&mut r, id).is_some(),
            "acknowledged task {id} missing on the replica"
        );
    }
    // Takes do not wait (a take lost in a failover comes back ready anyway); acks do.
    replica.signal("STOP");
    let t = writer.call("queue.take", &[0.into()]).one();
    let id = field(&t, "id").as_u64().unwrap();
    let sync = writer.send_call("queue.ack", &[id.into()]);
    wait_until("the ack waits", || stat(&mut p, "sync_waiting") >= 1);
    replica.signal("CONT");
    let reply = writer.recv();
    assert_eq!((reply.sync, reply.code), (sync, 0));
    assert!(
        on_replica(&mut r, id).is_none(),
        "the acked task {id} is gone on the replica"
    );
}

#[test]
fn a_sync_change_waits_for_a_stopped_replica_whose_wal_writes() {
    sync_put_waits_for_the_stopped_replica("write");
}

#[test]
fn a_sync_change_waits_for_a_stopped_replica_whose_wal_syncs() {
    sync_put_waits_for_the_stopped_replica("fsync");
}

#[test]
fn a_sync_change_past_its_timeout_is_answered_outcome_unknown_and_stays() {
    let (_primary, replica, mut p, mut r) =
        pair(&["--sync-replicas", "1", "--sync-timeout", "0.3"], "write");
    replica.signal("STOP");
    let reply = p.call("queue.put", &["late".into()]);
    let msg = reply.err(ER_OUTCOME_UNKNOWN);
    assert!(
        msg.starts_with(
            "outcome unknown: Quorum collection for a synchronous transaction is timed out: 0 of \
             the 1"
        ),
        "{msg}"
    );
    assert_eq!(stat(&mut p, "sync_timeouts"), 1);
    // Not undone: the task is on the primary, and reaches the replica once it runs.
    assert_eq!(stat(&mut p, "total"), 1);
    replica.signal("CONT");
    wait_until("the replica has the task", || stat(&mut r, "total") == 1);
    // And with the replica back, changes are answered normally again.
    p.call("queue.put", &["on time".into()]).one();
}

#[test]
fn with_no_replica_connected_a_sync_change_times_out_naming_the_problem() {
    let primary = Tarq::start(&["--sync-replicas", "1", "--sync-timeout", "0.2"]);
    let mut p = Client::connect(primary.addr);
    let msg = p
        .call("queue.put", &["alone".into()])
        .err(ER_OUTCOME_UNKNOWN);
    assert!(msg.contains("(0 connected)"), "{msg}");
    // Reads and takes go on.
    assert_eq!(stat(&mut p, "total"), 1);
    p.call("queue.take", &[0.into()]).one();
}
