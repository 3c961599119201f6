//! An error that does not mean "nothing was done" is never sent as one, through a forwarding
//! node either. Two replica sets of two real nodes each on a real etcd, `--sync-replicas 1`:
//! with set b's replica stopped (SIGSTOP), a put forwarded from set a into one of b's
//! partitions is made on b's primary but never acknowledged by a replica. b answers it
//! ER_OUTCOME_UNKNOWN, and set a must pass that on, not ER_READONLY (code 7), which the README
//! tells clients means nothing was done and may be retried: a client following it would put
//! the task twice. Once the replica runs again every such put is in the queue, which is why
//! "unknown" is the honest answer.

#[path = "support/cluster.rs"]
mod cluster;
mod support;

use std::collections::HashSet;
use std::net::SocketAddr;
use std::time::Duration;

use cluster::{wait_for, Etcd, Nodes};
use rmpv::Value;
use tarq_client::{pack_args, Client, ClientError};
use tarq_iproto::codes::ER_OUTCOME_UNKNOWN;

/// Puts through set a's replica; about half go to set b's partitions.
const PUTS: usize = 8;

fn connect(addr: SocketAddr) -> Client {
    Client::connect_addr(addr, Duration::from_secs(3)).expect("connect")
}

#[test]
fn a_forwarded_change_whose_outcome_is_unknown_is_not_answered_read_only() {
    let etcd = Etcd::start();
    let flags = ["--sync-replicas", "1", "--sync-timeout", "0.3"];
    let nodes = Nodes::start_sets(&etcd, &[("a", 2), ("b", 2)], &flags);
    let a = nodes.wait_leader_among(&[0, 1]);
    let b = nodes.wait_leader_among(&[2, 3]);
    let replica_b = if b == 2 { 3 } else { 2 };
    // Through set a's replica, which forwards every put, to each partition in turn (a primary
    // puts into its own partitions first).
    let addr = nodes.nodes[if a == 0 { 1 } else { 0 }].addr;
    let primary_a = nodes.nodes[a].addr;
    nodes.create_tube(&mut connect(primary_a), "f", "fifo", 4);

    nodes.signal(replica_b, "STOP");
    let mut c = connect(addr);
    let mut unknown = HashSet::new();
    let mut acked = HashSet::new();
    for n in 0..PUTS {
        let data = format!("t{n}");
        match c.call(
            "queue.tube.f:put",
            &pack_args(&[Value::from(data.as_str())]),
            None,
        ) {
            Ok(_) => {
                acked.insert(data);
            }
            Err(ClientError::Server { code, message }) => {
                assert_eq!(
                    code, ER_OUTCOME_UNKNOWN,
                    "put {data} made on b and not confirmed is answered as unknown: {message}"
                );
                assert!(message.starts_with("outcome unknown: "), "{message}");
                unknown.insert(data);
            }
            Err(e) => panic!("put {data}: {e}"),
        }
    }
    assert!(
        !unknown.is_empty() && !acked.is_empty(),
        "puts reached both sets: {} acknowledged, {} unknown",
        acked.len(),
        unknown.len()
    );

    // The replica runs again: every put answered "unknown" was made, and is taken once.
    nodes.signal(replica_b, "CONT");
    let mut taken = HashSet::new();
    wait_for("every put to be taken", || {
        let take = pack_args(&[Value::from(0.1)]);
        if let Ok(r) = c.call("queue.tube.f:take", &take, None) {
            let task = r.first().and_then(Value::as_array).cloned();
            if let Some(data) = task.as_ref().and_then(|t| t.get(2)?.as_str()) {
                assert!(taken.insert(data.to_owned()), "{data} taken twice");
                let id = task.as_ref().unwrap()[0].clone();
                c.call("queue.tube.f:ack", &pack_args(&[id]), None)
                    .expect("ack");
            }
        }
        taken.len() == PUTS
    });
    assert!(unknown.iter().all(|d| taken.contains(d)));
}
