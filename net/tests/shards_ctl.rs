//! What an operator of a sharded cluster meets first (issue 39's rough edges), end to end:
//! real `tarq` nodes of one-node replica sets, one real etcd on loopback, `tarq ctl` as a
//! person runs it.
//! - `tarq ctl create-tube --partitions` makes a partitioned tube;
//! - `tarq ctl move` without `--etcd` and `--cluster` takes them from the node at `--addr`,
//!   and moves the partition;
//! - a wrong `--cluster` is said to be one, not taken for a missing tube;
//! - a node's headline figures count every tube, and its counters stay when a partition
//!   moves away;
//! - a partitioned tube's consumers and idle mark are summed over its owners, the same from
//!   every node, in `queue.statistics(tube)` and `queue.statistics()`;
//! - a set whose primary is gone is warned of once, not once per call that tried it, and its
//!   return is said with the drops counted meanwhile.
//!
//! Every wait has a deadline.

#[path = "support/cluster.rs"]
mod cluster;
mod support;

use std::net::SocketAddr;
use std::time::Duration;

use cluster::{field, str_field, wait_for, Etcd, Nodes};
use rmpv::Value;
use support::{Tarq, WAIT};
use tarq_client::{pack_args, Client, ClientError};

fn connect(addr: SocketAddr) -> Client {
    Client::connect_addr(addr, Duration::from_secs(10)).expect("connect")
}

fn text(out: &[u8]) -> String {
    String::from_utf8_lossy(out).into_owned()
}

/// The owning set of each partition of `tube`, as node `addr` sees the placement (empty while
/// it does not know the tube).
fn owners(addr: SocketAddr, tube: &str) -> Vec<String> {
    let mut c = connect(addr);
    let o = c
        .call("queue.cluster", &pack_args(&[]), None)
        .expect("queue.cluster")
        .into_iter()
        .next()
        .unwrap();
    let tubes = field(&o, "placement")
        .and_then(|p| field(p, "tubes"))
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    let Some(t) = tubes.iter().find(|t| str_field(t, "name") == tube) else {
        return Vec::new();
    };
    field(t, "partitions")
        .and_then(Value::as_array)
        .map(|ps| ps.iter().map(|p| str_field(p, "set")).collect())
        .unwrap_or_default()
}

/// `queue.stats()` of the node at `addr`.
fn stats(addr: SocketAddr) -> Value {
    connect(addr)
        .call("queue.stats", &pack_args(&[]), None)
        .expect("queue.stats")
        .into_iter()
        .next()
        .unwrap()
}

fn figure(stats: &Value, name: &str) -> u64 {
    field(stats, name)
        .and_then(Value::as_u64)
        .unwrap_or_else(|| panic!("no {name} in {stats}"))
}

/// Two one-node sets, `a` (node 0) and `b` (node 1), each with its primary known to node 0.
fn two_sets(etcd: &Etcd) -> Nodes {
    let nodes = Nodes::start_sets(etcd, &[("a", 1), ("b", 1)], &[]);
    nodes.wait_leader_among(&[0]);
    nodes.wait_leader_among(&[1]);
    wait_for("node a to see b's primary", || {
        nodes.overview(0).is_some_and(|o| {
            let sets = field(&o, "sets").and_then(Value::as_array).cloned();
            sets.unwrap_or_default().iter().any(|s| {
                str_field(s, "name") == "b" && field(s, "primary").is_some_and(|p| !p.is_nil())
            })
        })
    });
    nodes
}

#[test]
fn ctl_makes_partitions_moves_with_the_nodes_own_etcd_and_names_a_wrong_cluster() {
    let etcd = Etcd::start();
    let nodes = two_sets(&etcd);
    let a = nodes.nodes[0].tarq.as_ref().unwrap();
    let ctl = |args: &[&str]| a.ctl(args);

    let out = ctl(&["create-tube", "jobs", "fifottl", "--partitions", "2"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    // The node reads the placement it wrote a moment later (issue 39's item 4).
    let mut placed = Vec::new();
    wait_for("node a to show the tube's 2 partitions", || {
        placed = owners(a.addr, "jobs");
        placed.len() == 2
    });
    let on_a = placed
        .iter()
        .position(|s| s == "a")
        .expect("a partition on a");

    // Tasks on a's partition: put through a, which leads it.
    let mut producer = connect(a.addr);
    for n in 0..10 {
        producer
            .call("queue.tube.jobs:put", &pack_args(&[Value::from(n)]), None)
            .expect("put");
    }
    let before = stats(a.addr);
    assert_eq!(
        (figure(&before, "total"), figure(&before, "puts")),
        (10, 10)
    );

    // No --etcd, no --cluster: node a says where its map is.
    let p = on_a.to_string();
    let out = ctl(&["move", "jobs", &p, "--to", "b"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).expect("a JSON report");
    assert_eq!(
        (&report["tube"], &report["from"], &report["to"]),
        (&"jobs".into(), &"a".into(), &"b".into())
    );
    assert_eq!(report["tasks"], 10);
    wait_for("node a to read the move", || {
        owners(a.addr, "jobs") == ["b", "b"]
    });
    // The tasks went with the partition; a's counters did not go down (issue 39, item 3).
    wait_for("node a to let go of the moved tasks", || {
        figure(&stats(a.addr), "total") == 0
    });
    let after = stats(a.addr);
    assert_eq!(figure(&after, "puts"), 10, "{after}");
    assert_eq!(figure(&stats(nodes.nodes[1].addr), "total"), 10);

    // A wrong --cluster is said to be one, whatever the command.
    let want = format!(
        "Error: etcd at {} knows no cluster named \"prod\": no node has registered under \
         /tarq/prod/.",
        etcd.url
    );
    for args in [
        &["move", "jobs", &p, "--to", "a", "--cluster", "prod"][..],
        &["rebalance", "--dry-run", "--cluster", "prod"],
        &["drain", "b", "--dry-run", "--cluster", "prod"],
        &["place", "jobs", &p, "--to", "a", "--cluster", "prod"],
    ] {
        let out = ctl(args);
        let err = text(&out.stderr);
        assert!(!out.status.success(), "{args:?}: {}", text(&out.stdout));
        assert!(err.starts_with(&want), "{args:?}: {err}");
        assert!(!err.contains("no tube"), "{err}");
    }
    // Nothing moved.
    assert_eq!(owners(a.addr, "jobs"), ["b", "b"]);

    // A node without etcd cannot say: ctl asks for the flags.
    let single = Tarq::start(&[]);
    let out = single.ctl(&["move", "jobs", "1", "--to", "b"]);
    let err = text(&out.stderr);
    assert!(!out.status.success());
    assert!(
        err.starts_with(&format!(
            "Error: the node at {} runs without etcd (no --etcd, --cluster), so it cannot say \
             where the cluster's map is: give --etcd and --cluster",
            single.addr
        )),
        "{err}"
    );
    let out = single.ctl(&["create-tube", "jobs", "fifottl", "--partitions", "2"]);
    let err = text(&out.stderr);
    assert!(!out.status.success());
    assert!(
        err.contains("a tube of 2 partitions needs a sharded cluster (--replica-set)"),
        "{err}"
    );
}

#[test]
fn a_set_whose_primary_is_gone_is_warned_of_once_and_its_return_said() {
    let etcd = Etcd::start();
    let mut nodes = two_sets(&etcd);
    let (a, b) = (nodes.nodes[0].addr, nodes.nodes[1].addr);
    let opts = Value::Map(vec![(Value::from("partitions"), Value::from(2))]);
    connect(a)
        .call(
            "queue.create_tube",
            &pack_args(&[Value::from("jobs"), Value::from("fifottl"), opts]),
            None,
        )
        .expect("create_tube");
    wait_for("node b to know the tube", || owners(b, "jobs").len() == 2);
    // Through b's own node, the put lands on the partition b owns.
    let put = connect(b)
        .call("queue.tube.jobs:put", &pack_args(&[Value::from("x")]), None)
        .expect("put");
    let id = put[0].as_array().unwrap()[0].as_u64().unwrap();

    let from = {
        let t = nodes.nodes[0].tarq.as_mut().unwrap();
        t.lines.drain(Duration::from_millis(100));
        t.log().len()
    };
    nodes.kill(1);
    // Until etcd lets b's lease go, node a still names b's primary: every peek of the task
    // opens a link to it, which fails (its port refuses). Count the drops the clients see.
    let mut c = connect(a);
    let peek = pack_args(&[Value::from(id)]);
    let mut dropped = 0;
    wait_for("peeks to meet b's link failing 20 times", || {
        match c.call("queue.tube.jobs:peek", &peek, None) {
            Err(ClientError::Server { message, .. })
                if message.contains("the link to replica set b failed") =>
            {
                dropped += 1
            }
            Err(ClientError::Server { .. }) => {}
            Ok(v) => panic!("a peek of a task on a stopped set answered {v:?}"),
            Err(e) => panic!("peek: {e}"),
        }
        dropped >= 20
    });

    nodes.start_node(1);
    nodes.wait_leader_among(&[1]);
    wait_for("a peek through a to reach b again", || {
        c.call("queue.tube.jobs:peek", &peek, None).is_ok()
    });
    let t = nodes.nodes[0].tarq.as_mut().unwrap();
    let back = t
        .lines
        .wait_for_after(from, "link to a replica set works again", WAIT);
    let drops: u64 = back
        .split_whitespace()
        .find_map(|w| w.strip_prefix("drops="))
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("the line counts the drops: {back}"));
    assert!(drops >= 20, "{back}");
    let warned: Vec<&String> = (t.log()[from..].iter())
        .filter(|l| l.contains("link to a replica set"))
        .filter(|l| l.contains("WARN"))
        .collect();
    assert_eq!(warned.len(), 1, "{warned:#?}");
    assert!(warned[0].contains("set=b"), "{}", warned[0]);
}

/// The consumers of a partitioned tube, from any node: `queue.statistics(tube)` and
/// `queue.statistics()` sum them over the partitions' owners, as they sum the counts.
#[test]
fn a_partitioned_tubes_consumers_and_idle_mark_are_the_same_from_every_node() {
    let etcd = Etcd::start();
    let nodes = two_sets(&etcd);
    let (a, b) = (nodes.nodes[0].addr, nodes.nodes[1].addr);
    let opts = Value::Map(vec![(Value::from("partitions"), Value::from(2))]);
    connect(a)
        .call(
            "queue.create_tube",
            &pack_args(&[Value::from("jobs"), Value::from("fifottl"), opts]),
            None,
        )
        .expect("create_tube");
    wait_for("both nodes to know the tube", || {
        owners(a, "jobs").len() == 2 && owners(b, "jobs").len() == 2
    });
    let put = |at: SocketAddr| {
        connect(at)
            .call("queue.tube.jobs:put", &pack_args(&[Value::from("x")]), None)
            .expect("put")
    };
    put(a);
    let mut holder = connect(a);
    holder
        .call("queue.tube.jobs:take", &pack_args(&[Value::from(0)]), None)
        .expect("take");
    put(b);
    let consumers = |at: SocketAddr| -> (Value, Value, Value) {
        let mut c = connect(at);
        let one = c
            .call("queue.statistics", &pack_args(&[Value::from("jobs")]), None)
            .expect("statistics")
            .remove(0);
        let all = c
            .call("queue.statistics", &pack_args(&[]), None)
            .expect("statistics()")
            .remove(0);
        let from_all = field(&all, "jobs").cloned().unwrap_or(Value::Nil);
        assert_eq!(
            field(&one, "consumers"),
            field(&from_all, "consumers"),
            "statistics(jobs) and statistics() at {at}"
        );
        let c = field(&one, "consumers").cloned().unwrap_or(Value::Nil);
        let idle = field(&one, "idle").cloned().unwrap_or(Value::Nil);
        let ready = field(field(&one, "tasks").unwrap(), "ready")
            .cloned()
            .unwrap();
        (c, idle, ready)
    };
    let held = Value::Map(vec![
        (Value::from("waiting"), Value::from(0)),
        (Value::from("holding"), Value::from(1)),
    ]);
    for at in [a, b] {
        assert_eq!(
            consumers(at),
            (held.clone(), Value::from(false), Value::from(1)),
            "{at}"
        );
    }
    // The consumer leaves: two ready tasks and nobody to take them, seen from both nodes.
    drop(holder);
    let none = Value::Map(vec![
        (Value::from("waiting"), Value::from(0)),
        (Value::from("holding"), Value::from(0)),
    ]);
    for at in [a, b] {
        wait_for("the tube to be idle", || {
            consumers(at) == (none.clone(), Value::from(true), Value::from(2))
        });
    }
}

/// A tube's counters travel with its moved partitions (issue 39, item 3): `queue.statistics`
/// of the whole tube, from either node, counts every put, take and ack once after a partition
/// has moved away and back (its earlier owners' counts ride in the placement), so put >= take
/// holds and no figure goes back; the node that served the partition keeps its headline
/// counts.
#[test]
fn a_tubes_counters_travel_with_its_partition_there_and_back() {
    let etcd = Etcd::start();
    let nodes = two_sets(&etcd);
    let (a, b) = (nodes.nodes[0].addr, nodes.nodes[1].addr);
    let node_a = nodes.nodes[0].tarq.as_ref().unwrap();
    let out = node_a.ctl(&["create-tube", "jobs", "fifottl", "--partitions", "2"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let mut placed = Vec::new();
    wait_for("both nodes to know the tube", || {
        placed = owners(a, "jobs");
        placed.len() == 2 && owners(b, "jobs").len() == 2
    });
    let p = placed.iter().position(|s| s == "a").unwrap().to_string();
    let work = |at: SocketAddr, puts: u64, done: u64| {
        let mut c = connect(at);
        for n in 0..puts {
            c.call("queue.tube.jobs:put", &pack_args(&[Value::from(n)]), None)
                .expect("put");
        }
        for _ in 0..done {
            let t = c
                .call("queue.tube.jobs:take", &pack_args(&[Value::from(0)]), None)
                .expect("take");
            let id = t[0].as_array().unwrap()[0].clone();
            c.call("queue.tube.jobs:ack", &pack_args(&[id]), None)
                .expect("ack");
        }
    };
    let calls = |at: SocketAddr| -> (u64, u64, u64, u64) {
        let s = connect(at)
            .call("queue.statistics", &pack_args(&[Value::from("jobs")]), None)
            .expect("statistics")
            .remove(0);
        let c = field(&s, "calls").unwrap();
        let n = |k: &str| field(c, k).and_then(Value::as_u64).unwrap();
        let total = field(field(&s, "tasks").unwrap(), "total")
            .and_then(Value::as_u64)
            .unwrap();
        (n("put"), n("take"), n("ack"), total)
    };
    let moved = |to: &str, want: [&str; 2]| {
        let out = node_a.ctl(&["move", "jobs", &p, "--to", to]);
        assert!(out.status.success(), "{}", text(&out.stderr));
        wait_for("both nodes to read the move", || {
            owners(a, "jobs") == want && owners(b, "jobs") == want
        });
    };
    work(a, 10, 4);
    work(b, 10, 4);
    for at in [a, b] {
        assert_eq!(calls(at), (20, 8, 8, 12), "before the move, from {at}");
    }
    let headline = figure(&stats(a), "puts");

    moved("b", ["b", "b"]);
    for at in [a, b] {
        assert_eq!(calls(at), (20, 8, 8, 12), "after the move away, from {at}");
    }
    work(a, 5, 2);
    for at in [a, b] {
        assert_eq!(calls(at), (25, 10, 10, 15), "served by b, from {at}");
    }

    let mut back = ["b", "b"];
    back[p.parse::<usize>().unwrap()] = "a";
    moved("a", back);
    for at in [a, b] {
        let (put, take, ack, total) = calls(at);
        assert_eq!(
            (put, take, ack, total),
            (25, 10, 10, 15),
            "moved back, from {at}"
        );
        assert!(put >= take);
    }
    work(a, 3, 3);
    for at in [a, b] {
        assert_eq!(calls(at), (28, 13, 13, 15), "served by a again, from {at}");
    }
    assert!(
        figure(&stats(a), "puts") >= headline + 3,
        "node a's headline puts"
    );
}
