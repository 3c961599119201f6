//! What a sharded node does for the shards stops when it stops leading, on real nodes and a
//! real etcd: only a primary's changes may be logged, so a primary deposed while it lets go
//! of a partition that moved away leaves the rest of the letting go to the next primary, and
//! follows it with a log that stays the primary's.
//!
//! Found by the fault harness (`tarq-chaos`): a deposed primary went on letting go after it
//! followed the new one, and closed the last batch with its old term after the new term's
//! records. Its own replicas, copying its log from the start later, refused that record again
//! and again; and the records it wrote took sequence numbers the new primary gave its own.

#[path = "support/cluster.rs"]
mod cluster;
#[path = "support/jobs.rs"]
mod jobs;
mod support;

use cluster::{field, wait_for, Etcd, Nodes};
use jobs::{call, connect, make_jobs, move_jobs, owners};
use rmpv::Value;

/// Node `i`'s position in its log and the term of its last turn.
fn position(nodes: &Nodes, i: usize) -> Option<(u64, u64)> {
    let o = nodes.overview(i)?;
    let at = |k| field(&o, k).and_then(Value::as_u64);
    Some((at("position")?, at("position_term")?))
}

#[test]
fn a_primary_deposed_while_letting_go_of_a_moved_partition_leaves_it_to_the_next() {
    let etcd = Etcd::start();
    // Paced so the letting go takes about two seconds: 6 batches of 1,024.
    let mut nodes = Nodes::start_sets(&etcd, &[("a", 2), ("b", 1)], &["--move-rate", "3000"]);
    let first = nodes.wait_leader_among(&[0, 1]);
    let next = 1 - first;
    nodes.wait_leader_among(&[2]);
    wait_for("a's replica to follow", || nodes.follows(next));
    let addrs: Vec<_> = nodes.nodes.iter().map(|n| n.addr).collect();
    make_jobs(addrs[first], addrs.iter().copied());
    let part = owners(addrs[first], "jobs")
        .iter()
        .position(|s| s == "a")
        .expect("a partition of a's") as u64;
    // A primary puts into its own set's partition.
    let mut c = connect(addrs[first]);
    for i in 0..6_000 {
        call(&mut c, "queue.tube.jobs:put", &[Value::from(i)]);
    }
    wait_for("the replica to hold every put", || {
        position(&nodes, next) == position(&nodes, first)
    });

    move_jobs(addrs[first], part, "b");
    // Deposed mid-letting-go: its lease runs out while it is stopped.
    nodes.signal(first, "STOP");
    nodes.wait_leader_among(&[next]);
    nodes.signal(first, "CONT");
    wait_for("the deposed primary to follow the new one", || {
        nodes.follows(first)
    });

    // The new primary finds what is left of the partition and lets it go; its records
    // (and a put of its own) reach the old primary, whose log stays the new primary's.
    wait_for("the new primary to let go of the partition", || {
        nodes.log(next).contains("let go of a partition's tasks")
    });
    call(
        &mut connect(addrs[next]),
        "queue.tube.jobs:put",
        &[Value::from("after")],
    );
    wait_for("the old primary to hold what the new one wrote", || {
        let (old, new) = (position(&nodes, first), position(&nodes, next));
        old.is_some() && old == new
    });
    let log = nodes.log(first);
    assert!(
        !log.contains("WAL refusing") && !log.contains("does not fit"),
        "{log}"
    );
}
