//! A client of tarantool/sharded-queue against a sharded tarq, as against one node (issue 39,
//! item 4): `tests/clients/sharded_queue/netbox_sharded_queue.lua` (net.box, Debian's
//! `tarantool`) walks the scenarios of sharded-queue's own suite — its
//! `create_tube(name, options)`, put / peek / take / ack / release / delete / bury / kick /
//! touch / truncate / drop, `queue.statistics`, a take woken by a put, delays and TTRs — once
//! against one fresh `tarq`, and once against a sharded cluster of two replica sets (a primary
//! and a replica each, one real etcd), every tube spread over both sets, made and dropped
//! through a node of one set and used at once through a node of the other, with no pause.
//! Each run must pass the script's own checks, and the two runs must record the same answers
//! line by line. This file owns the processes and their deadlines; what is checked lives in
//! the script.
//!
//! A tool that is not installed fails the test, naming it (`bash .ci/test` installs them).

#[path = "support/cluster.rs"]
mod cluster;
mod support;

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use cluster::{Etcd, Nodes};
use support::{run_with_deadline, Tarq};

/// How long a whole run of the script may take: it takes 2-4 s (short delays and TTRs); its
/// calls are bounded by 20 s and its waits by 10 s, so a hung node shows up as the script's
/// failure before this.
const SCRIPT_DEADLINE: Duration = Duration::from_secs(120);

fn script() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/clients/sharded_queue/netbox_sharded_queue.lua")
}

/// Runs the script with the router at `router`, tubes made through `creator`, `extra` added
/// to every create; its `check` lines. Fails with its output and `logs()` unless it exits 0
/// with its OK line.
fn run(router: u16, creator: u16, extra: &str, logs: impl FnOnce() -> String) -> Vec<String> {
    let mut cmd = Command::new("tarantool");
    cmd.arg(script())
        .arg(router.to_string())
        .arg(creator.to_string())
        .arg(extra);
    let shown = format!("{cmd:?}");
    let run = run_with_deadline(cmd, SCRIPT_DEADLINE);
    if !(matches!(run.status, Some(s) if s.success()) && run.stdout.contains("OK: ")) {
        panic!(
            "{shown} ended with {:?}\n--- stdout ---\n{}\n--- stderr ---\n{}\n--- logs ---\n{}",
            run.status,
            run.stdout,
            run.stderr,
            logs()
        );
    }
    (run.stdout.lines())
        .filter(|l| l.starts_with("check "))
        .map(str::to_owned)
        .collect()
}

#[test]
fn sharded_queue_scenarios_answer_on_a_sharded_cluster_as_on_one_node() {
    support::require_command(
        "net.box (Debian package `tarantool`)",
        &["tarantool", "--version"],
    );
    let one = Tarq::start(&[]);
    let port = one.addr.port();
    let on_one = run(port, port, "{}", || one.log().join("\n"));
    drop(one);

    let etcd = Etcd::start();
    let mut nodes = Nodes::start_sets(&etcd, &[("a", 2), ("b", 2)], &[]);
    let a = nodes.wait_leader_among(&[0, 1]);
    let b = nodes.wait_leader_among(&[2, 3]);
    // The replicas follow (tubes are made through one, and used through the other).
    let (a_replica, b_replica) = (1 - a, 5 - b);
    nodes.wait_following(a_replica);
    nodes.wait_following(b_replica);
    let (router, creator) = (nodes.nodes[b_replica].addr, nodes.nodes[a_replica].addr);
    let on_cluster = run(
        router.port(),
        creator.port(),
        r#"{"partitions": 2}"#,
        || {
            (0..4)
                .map(|i| format!("--- node {i} ---\n{}", nodes.log(i)))
                .collect::<Vec<_>>()
                .join("\n")
        },
    );
    assert_eq!(
        on_cluster.len(),
        on_one.len(),
        "the same checks ran on both"
    );
    for (c, o) in on_cluster.iter().zip(&on_one) {
        assert_eq!(c, o, "a sharded cluster answers as one node does");
    }
}
