//! A tube's operation counters never go back (issue 39, item 3): they are in the journal
//! (`Counts` records, a snapshot's `SnapCounts`), so `queue.statistics`, `/metrics` and the
//! console read the same after a kill -9 and a restart, over a snapshot, and on a replica
//! that becomes primary — and go on from there. Real processes; the failover one on a real
//! etcd (`support/cluster.rs`).

#[path = "support/cluster.rs"]
mod cluster;
mod support;

use std::net::SocketAddr;

use cluster::{field, wait_for, Etcd, Nodes};
use rmpv::Value;
use support::*;

/// A tube's `calls` from `queue.statistics(tube)` at `addr`: put, take, ack, release, bury,
/// kick, delete.
type Calls = [u64; 7];
const CALLS: [&str; 7] = ["put", "take", "ack", "release", "bury", "kick", "delete"];

fn calls(addr: SocketAddr, tube: &str) -> Calls {
    let s = Client::connect(addr)
        .call("queue.statistics", &[Value::from(tube)])
        .one();
    let c = field(&s, "calls").unwrap_or_else(|| panic!("no calls in {s}"));
    CALLS.map(|k| field(c, k).and_then(Value::as_u64).unwrap_or(0))
}

/// `tarq_tube_<name>_total{tube="<tube>"}` and `tarq_<name>_total` of the `/metrics` at `http`.
fn metrics(http: SocketAddr, tube: &str, name: &str) -> (u64, u64) {
    let (status, page) = http_get(http, "/metrics");
    assert_eq!(status, 200, "{page}");
    let find = |series: &str| -> u64 {
        let line = (page.lines())
            .find(|l| l.split_whitespace().next() == Some(series))
            .unwrap_or_else(|| panic!("no {series} in:\n{page}"));
        line.split_whitespace().nth(1).unwrap().parse().unwrap()
    };
    (
        find(&format!("tarq_tube_{name}_total{{tube=\"{tube}\"}}")),
        find(&format!("tarq_{name}_total")),
    )
}

/// Puts `puts` tasks into `tube` through `addr`, takes `takes` of them and acks all but one,
/// which it releases; buries, kicks and deletes task 9 when `more` (`puts` > 9 > `takes`).
fn work(addr: SocketAddr, tube: &str, puts: u64, takes: u64, more: bool) {
    let mut c = Client::connect(addr);
    let call = |c: &mut Client, f: &str, a: &[Value]| c.call(&format!("queue.tube.{tube}:{f}"), a);
    for n in 0..puts {
        call(&mut c, "put", &[Value::from(n)]).one();
    }
    let mut held = Vec::new();
    for _ in 0..takes {
        let t = call(&mut c, "take", &[Value::from(0)]).one();
        held.push(t.as_array().unwrap()[0].clone());
    }
    let last = held.pop().expect("a task taken");
    for id in held {
        call(&mut c, "ack", &[id]).one();
    }
    call(&mut c, "release", &[last]).one();
    if more {
        // Task 9 is ready: put, never taken.
        let id = Value::from(9);
        call(&mut c, "bury", std::slice::from_ref(&id)).one();
        call(&mut c, "kick", &[Value::from(1)]).one();
        call(&mut c, "delete", &[id]).one();
    }
}

fn create(addr: SocketAddr, tube: &str) {
    Client::connect(addr)
        .call(
            "queue.create_tube",
            &[Value::from(tube), Value::from("fifottl")],
        )
        .one();
}

/// kill -9 and a start on the same directory.
fn kill_and_restart(mut t: Tarq, args: &[&str]) -> Tarq {
    t.signal("KILL");
    t.wait_exit();
    Tarq::start_in(t.take_dir(), args)
}

#[test]
fn a_tubes_counters_survive_a_kill_and_a_snapshot_and_go_on_from_there() {
    let args = ["--wal-mode", "write", "--http-listen", "127.0.0.1:0"];
    let mut t = Tarq::start(&args);
    create(t.addr, "jobs");
    work(t.addr, "jobs", 10, 4, true);
    let before = calls(t.addr, "jobs");
    assert_eq!(before, [10, 4, 3, 1, 1, 1, 1]);
    let http = t.metrics.unwrap();
    let puts = metrics(http, "jobs", "puts");
    assert_eq!(puts.0, 10);

    // Only the WAL holds them.
    t = kill_and_restart(t, &args);
    assert_eq!(
        calls(t.addr, "jobs"),
        before,
        "after a kill -9, from the WAL"
    );
    assert_eq!(metrics(t.metrics.unwrap(), "jobs", "puts"), puts);

    // A snapshot holds them, and the WAL after it what came next.
    Client::connect(t.addr).call("queue.snapshot", &[]).one();
    t.wait_for_line("snapshot done");
    work(t.addr, "jobs", 2, 1, false);
    let after = [12, 5, 3, 2, 1, 1, 1];
    assert_eq!(calls(t.addr, "jobs"), after);
    t = kill_and_restart(t, &args);
    assert_eq!(
        calls(t.addr, "jobs"),
        after,
        "after a snapshot and a kill -9"
    );
    let http = t.metrics.unwrap();
    assert_eq!(metrics(http, "jobs", "puts").0, 12);
    assert_eq!(metrics(http, "jobs", "acks").0, 3);

    // A dropped tube's counts stay in the node's headline across a restart too.
    let headline = metrics(http, "jobs", "puts").1;
    let mut c = Client::connect(t.addr);
    c.call("queue.tube.jobs:truncate", &[]).ok();
    c.call("queue.tube.jobs:drop", &[]).ok();
    t = kill_and_restart(t, &args);
    let (_, page) = http_get(t.metrics.unwrap(), "/metrics");
    let line = page
        .lines()
        .find(|l| l.starts_with("tarq_puts_total "))
        .unwrap();
    assert_eq!(line, format!("tarq_puts_total {headline}"), "{page}");
}

#[test]
fn a_replica_made_primary_goes_on_from_the_old_primarys_counters() {
    let etcd = Etcd::start();
    let mut nodes = Nodes::start(&etcd, 3, &["--http-listen", "127.0.0.1:0"]);
    let all = [0, 1, 2];
    let primary = nodes.wait_leader_among(&all);
    let addr = |nodes: &Nodes, i: usize| nodes.nodes[i].addr;
    create(addr(&nodes, primary), "jobs");
    work(addr(&nodes, primary), "jobs", 20, 6, true);
    // A tube dropped: its counts go to the node's headline, on the replicas from the
    // primary's records (a replica that logged the drop's counts itself could not follow).
    create(addr(&nodes, primary), "gone");
    work(addr(&nodes, primary), "gone", 2, 2, false);
    let mut c = Client::connect(addr(&nodes, primary));
    c.call("queue.tube.gone:truncate", &[]).ok();
    c.call("queue.tube.gone:drop", &[]).ok();
    let before = calls(addr(&nodes, primary), "jobs");
    assert_eq!(before, [20, 6, 5, 1, 1, 1, 1]);
    // Replication is asynchronous: the replicas hold the counters once they read the same.
    for i in all.into_iter().filter(|&i| i != primary) {
        nodes.wait_following(i);
        wait_for(&format!("node {i} to count as its primary does"), || {
            calls(addr(&nodes, i), "jobs") == before
        });
    }

    nodes.kill(primary);
    let rest: Vec<usize> = all.into_iter().filter(|&i| i != primary).collect();
    let next = nodes.wait_leader_among(&rest);
    assert_eq!(
        calls(addr(&nodes, next), "jobs"),
        before,
        "on the new primary"
    );
    let http = nodes.nodes[next].tarq.as_ref().unwrap().metrics.unwrap();
    assert_eq!(metrics(http, "jobs", "puts").0, 20);
    assert_eq!(metrics(http, "jobs", "takes").0, 6);
    assert_eq!(
        metrics(http, "jobs", "puts").1,
        22,
        "the headline counts the dropped tube's"
    );

    work(addr(&nodes, next), "jobs", 3, 2, false);
    let after = [23, 8, 6, 2, 1, 1, 1];
    assert_eq!(calls(addr(&nodes, next), "jobs"), after, "counting on");

    // The old primary, back, follows and counts what its successor did.
    nodes.start_node(primary);
    nodes.wait_following(primary);
    wait_for("the old primary to count as the new one does", || {
        calls(addr(&nodes, primary), "jobs") == after
    });
    for i in all.into_iter().filter(|&i| i != next) {
        nodes.wait_following(i);
    }
}
