//! A tube exists on every node of a sharded cluster once `create_tube` has answered (issue
//! 39, item 4): real `tarq` nodes, two replica sets of a primary and a replica each, one real
//! etcd on loopback.
//! - `create_tube` through any node, a replica's too, places the tube;
//! - a put through every other node right after it (no pause: the nodes' polls of etcd are
//!   250 ms apart, so without the read on an unknown name nearly every such put was refused)
//!   is done, and each node counts the tube's tasks the same;
//! - `create_tube(..., {if_not_exists = true})` through a replica answers the tube;
//! - a tube that exists nowhere is still Tarantool's missing function, after the read.
//!
//! Every wait has a deadline.

#[path = "support/cluster.rs"]
mod cluster;
mod support;

use std::net::SocketAddr;
use std::time::Duration;

use cluster::{field, Etcd, Nodes};
use rmpv::Value;
use tarq_client::{pack_args, Client, ClientError};

fn connect(addr: SocketAddr) -> Client {
    Client::connect_addr(addr, Duration::from_secs(10)).expect("connect")
}

fn create(c: &mut Client, name: &str, if_not_exists: bool) -> Result<Vec<Value>, ClientError> {
    let opts = Value::Map(vec![
        (Value::from("partitions"), Value::from(2)),
        (Value::from("if_not_exists"), Value::from(if_not_exists)),
    ]);
    let args = [Value::from(name), Value::from("fifottl"), opts];
    c.call("queue.create_tube", &pack_args(&args), None)
}

fn total(c: &mut Client, tube: &str) -> u64 {
    let s = c
        .call("queue.statistics", &pack_args(&[Value::from(tube)]), None)
        .expect("statistics")
        .remove(0);
    let tasks = field(&s, "tasks").unwrap_or_else(|| panic!("no tasks in {s}"));
    field(tasks, "total").and_then(Value::as_u64).unwrap()
}

#[test]
fn a_tube_created_through_any_node_takes_puts_through_every_other_at_once() {
    let etcd = Etcd::start();
    let nodes = Nodes::start_sets(&etcd, &[("a", 2), ("b", 2)], &[]);
    let a = nodes.wait_leader_among(&[0, 1]);
    let b = nodes.wait_leader_among(&[2, 3]);
    // Every node follows its primary (the replicas' creates and puts go through it).
    for i in 0..4 {
        if i != a && i != b {
            cluster::wait_for("a replica to follow its primary", || {
                nodes
                    .overview(i)
                    .is_some_and(|o| cluster::str_field(&o, "role") == "replica")
            });
        }
    }
    let mut clients: Vec<Client> = nodes.nodes.iter().map(|n| connect(n.addr)).collect();
    for round in 0..16 {
        let tube = format!("jobs{round}");
        let by = round % 4;
        let made = create(&mut clients[by], &tube, false)
            .unwrap_or_else(|e| panic!("create_tube {tube} through node {by}: {e}"));
        assert!(!made.is_empty(), "create_tube answers the tube");
        for (j, c) in clients.iter_mut().enumerate() {
            if j == by {
                continue;
            }
            let put = format!("queue.tube.{tube}:put");
            c.call(&put, &pack_args(&[Value::from(format!("from {j}"))]), None)
                .unwrap_or_else(|e| {
                    panic!("a put into {tube} through node {j} right after node {by} made it: {e}")
                });
        }
        for (j, c) in clients.iter_mut().enumerate() {
            assert_eq!(total(c, &tube), 3, "{tube}'s tasks seen from node {j}");
        }
    }
    // Through a replica, a tube that is there already is answered as it is.
    let replica = (0..4).find(|&i| i != a && i != b).unwrap();
    let again = create(&mut clients[replica], "jobs0", true).expect("if_not_exists");
    let name = field(&again[0], "name").cloned();
    assert!(
        name.is_none() || name == Some(Value::from("jobs0")),
        "{again:?}"
    );
    // A tube nobody made is missing after the read, as on one node.
    let missing = clients[replica]
        .call("queue.tube.nope:put", &pack_args(&[Value::from(1)]), None)
        .expect_err("no such tube");
    assert!(
        missing
            .to_string()
            .contains("Procedure 'queue.tube.nope:put' is not defined"),
        "{missing}"
    );
}
