//! A tube's calls act on its own tasks only, on a sharded cluster as on one node: a tube API
//! call naming another tube's task by its whole id (`ix << 41 | number`, as the tube API shows
//! a task of a partition other than the first) finds no task, through either set's primary,
//! whichever set holds the task; the task is left as it was. The router sent such a call to
//! the partition the id names, whatever tube the call named: `queue.tube.tb:peek(id)` showed
//! and `queue.tube.tb:delete(id)` deleted tube `ta`'s task, past the rights checked on `tb`.

#[path = "support/cluster.rs"]
mod cluster;
mod support;

use std::net::SocketAddr;
use std::time::Duration;

use cluster::{Etcd, Nodes};
use rmpv::Value;
use tarq_client::{pack_args, Client};

fn connect(addr: SocketAddr) -> Client {
    Client::connect_addr(addr, Duration::from_secs(10)).expect("connect")
}

/// The error message of `queue.tube.<tube>:<f>(id)`, or `None` when it succeeded.
fn refusal(c: &mut Client, tube: &str, f: &str, id: u64) -> Option<String> {
    let args = pack_args(&[Value::from(id)]);
    (c.call(&format!("queue.tube.{tube}:{f}"), &args, None).err()).map(|e| e.to_string())
}

#[test]
fn a_tubes_call_naming_another_tubes_task_finds_none() {
    let etcd = Etcd::start();
    let nodes = Nodes::start_sets(&etcd, &[("a", 1), ("b", 1)], &[]);
    let primaries = [nodes.wait_leader_among(&[0]), nodes.wait_leader_among(&[1])];
    let addrs = primaries.map(|i| nodes.nodes[i].addr);
    let mut c = connect(addrs[0]);
    for t in ["ta", "tb"] {
        nodes.create_tube(&mut c, t, "fifo", 2);
    }
    // A put through each primary goes to the partition it leads: a task of `ta` in each set.
    for &addr in &addrs {
        connect(addr)
            .call(
                "queue.tube.ta:put",
                &pack_args(&[Value::from("ta's")]),
                None,
            )
            .unwrap();
    }
    // Their whole ids: the first tubes' indexes (from 1) and numbers (from 0) that `ta` finds.
    let ids: Vec<u64> = (1..8u64)
        .flat_map(|ix| (0..2u64).map(move |n| (ix << 41) | n))
        .filter(|&id| refusal(&mut c, "ta", "peek", id).is_none())
        .collect();
    assert_eq!(ids.len(), 2, "one task of ta in each partition: {ids:?}");
    for &addr in &addrs {
        let mut c = connect(addr);
        for &id in &ids {
            let e = refusal(&mut c, "tb", "peek", id).expect("tb:peek finds ta's task");
            assert!(
                e.starts_with(&format!("Task {id} not found")),
                "tb:peek({id}): {e}"
            );
            for f in ["touch", "bury", "delete", "ack", "release"] {
                let args = match f {
                    "touch" => pack_args(&[Value::from(id), Value::from(10)]),
                    _ => pack_args(&[Value::from(id)]),
                };
                let r = c.call(&format!("queue.tube.tb:{f}"), &args, None);
                let e = r.expect_err(&format!("tb:{f}({id}) through {addr} acts on ta's task"));
                let e = e.to_string();
                assert!(
                    e.contains("not found") || e.contains("not taken"),
                    "tb:{f}({id}): {e}"
                );
            }
            assert_eq!(
                refusal(&mut c, "ta", "peek", id),
                None,
                "ta's task {id} is there"
            );
        }
    }
    let args = pack_args(&[Value::from("ta")]);
    let stats = c.call("queue.statistics", &args, None).unwrap();
    let tasks = support::field(&stats[0], "tasks");
    assert_eq!(
        support::field(tasks, "ready").as_u64(),
        Some(2),
        "{stats:?}"
    );
}
