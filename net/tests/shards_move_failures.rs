//! A partition move interrupted, end to end: two replica sets of two real `tarq` nodes each
//! (`--sync-replicas 1`) and one real etcd on loopback; a partition holding many tasks is
//! moved from set a to set b, and in the middle of its copy
//! - the source primary is killed (-9),
//! - the target primary is killed (-9),
//! - etcd is stopped (SIGSTOP) for longer than a lease and then resumed.
//!
//! Each time the partition ends in exactly one place — where etcd's placement says — and
//! every task put before the move is delivered exactly once afterwards, through any node.
//!
//! Every wait has a deadline.

#[path = "support/cluster.rs"]
mod cluster;
mod support;

use std::collections::HashSet;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use cluster::{field, wait_for, Etcd, Nodes};
use rmpv::Value;
use tarq_client::{pack_args, Client};

/// Tasks in the moving partition: enough that its copy is under way for a while.
const TASKS: usize = 150_000;
const WINDOW: usize = 256;

fn connect(addr: SocketAddr) -> Option<Client> {
    Client::connect_addr(addr, Duration::from_secs(5)).ok()
}

fn placement(etcd: &str) -> tarq_cluster::ClusterMap {
    let mut client = tarq_cluster::etcd::Client::connect(&[etcd.to_owned()]).unwrap();
    tarq_cluster::placement::read(&mut client, "c", Duration::from_secs(2)).unwrap()
}

/// Puts `n` tasks "t0".. through `addr`, pipelined; every one acknowledged.
fn fill(addr: SocketAddr, n: usize) {
    let mut c = connect(addr).expect("connect");
    let mut in_flight = 0;
    let mut sent = 0;
    while sent < n || in_flight > 0 {
        while sent < n && in_flight < WINDOW {
            let args = pack_args(&[Value::from(format!("t{sent}"))]);
            c.send_request(|o, s| tarq_iproto::client::call(o, s, "queue.tube.jobs:put", &args))
                .unwrap();
            sent += 1;
            in_flight += 1;
        }
        let r = c.recv().unwrap().expect("a reply");
        r.into_result().expect("a put acknowledged");
        in_flight -= 1;
    }
}

/// Takes and acks every task through `addr` (pipelined) until the tube counts none: the
/// payloads delivered, and those whose ack was refused as not taken (they went back to ready
/// and may come again).
fn drain(addr: SocketAddr) -> (Vec<String>, HashSet<String>) {
    let deadline = Instant::now() + Duration::from_secs(120);
    let (mut out, mut refused) = (Vec::new(), HashSet::new());
    let mut c = connect(addr).expect("connect");
    let take = pack_args(&[Value::from(0)]);
    loop {
        assert!(Instant::now() < deadline, "drained {} so far", out.len());
        let mut tasks = Vec::new();
        for r in pipelined(&mut c, "queue.tube.jobs:take", vec![take.clone(); WINDOW]) {
            match r {
                Ok(r) => {
                    if let Some(t) = r.first().and_then(Value::as_array) {
                        tasks.push((t[0].as_u64().unwrap(), t[2].as_str().unwrap().to_owned()));
                    }
                }
                // A refusal while a set elects or a view catches up: asked again.
                Err(e) => eprintln!("take: {e}"),
            }
        }
        if tasks.is_empty() {
            // None now: done once the whole tube counts none (a partition may be
            // unreachable for a moment, its set electing a primary).
            let stats = c.call("queue.statistics", &pack_args(&[Value::from("jobs")]), None);
            let total = stats.ok().and_then(|s| {
                let tasks = field(s.first()?, "tasks")?;
                field(tasks, "total")?.as_u64()
            });
            if total == Some(0) {
                return (out, refused);
            }
            continue;
        }
        let mut left = tasks;
        while !left.is_empty() {
            assert!(Instant::now() < deadline, "acks of {} tasks", left.len());
            let acks = left
                .iter()
                .map(|(id, _)| pack_args(&[Value::from(*id)]))
                .collect();
            let answers = pipelined(&mut c, "queue.tube.jobs:ack", acks);
            let mut again = Vec::new();
            for ((id, data), a) in left.into_iter().zip(answers) {
                match a {
                    Ok(_) => out.push(data),
                    // Not this session's any more: back to ready, and delivered again.
                    Err(e) if e.contains("was not taken") => {
                        out.push(data.clone());
                        refused.insert(data);
                    }
                    Err(e) => {
                        eprintln!("ack: {e}");
                        again.push((id, data));
                    }
                }
            }
            left = again;
        }
    }
}

/// Calls `function` with each of `args`, pipelined; the answers in order.
fn pipelined(
    c: &mut Client,
    function: &str,
    args: Vec<Vec<u8>>,
) -> Vec<Result<Vec<Value>, String>> {
    let mut syncs = Vec::with_capacity(args.len());
    for a in &args {
        let sync = c
            .send_request(|o, s| tarq_iproto::client::call(o, s, function, a))
            .unwrap();
        syncs.push(sync);
    }
    let mut by_sync = std::collections::HashMap::new();
    while by_sync.len() < syncs.len() {
        let r = c.recv().unwrap().expect("a reply");
        let sync = r.sync;
        by_sync.insert(
            sync,
            r.into_result()
                .map_err(|e| e.to_string())
                .and_then(|r| r.values().map_err(|e| e.to_string())),
        );
    }
    syncs.iter().map(|s| by_sync.remove(s).unwrap()).collect()
}

/// The running primary of each set (a's among 0, 1; b's among 2, 3).
fn primaries(nodes: &Nodes) -> (usize, usize) {
    let running = |among: [usize; 2]| -> Vec<usize> {
        among
            .into_iter()
            .filter(|&i| nodes.nodes[i].tarq.is_some())
            .collect()
    };
    (
        nodes.wait_leader_among(&running([0, 1])),
        nodes.wait_leader_among(&running([2, 3])),
    )
}

/// A cluster with the tube and set a's partition full; the partition's number.
fn setup(etcd: &Etcd) -> (Nodes, u16) {
    let nodes = Nodes::start_sets(etcd, &[("a", 2), ("b", 2)], &["--sync-replicas", "1"]);
    let (a, _) = primaries(&nodes);
    let mut c = connect(nodes.nodes[a].addr).unwrap();
    let opts = Value::Map(vec![(Value::from("partitions"), Value::from(2))]);
    let args = pack_args(&[Value::from("jobs"), Value::from("fifottl"), opts]);
    c.call("queue.create_tube", &args, None).unwrap();
    for i in 0..4 {
        wait_for(&format!("node {i} to know the tube"), || {
            connect(nodes.nodes[i].addr).is_some_and(|mut c| {
                c.call("queue.statistics", &pack_args(&[Value::from("jobs")]), None)
                    .is_ok()
            })
        });
    }
    let map = placement(&etcd.url);
    let p = map.placement.tubes["jobs"]
        .partitions
        .iter()
        .position(|p| p.set == "a")
        .expect("a partition on a") as u16;
    fill(nodes.nodes[a].addr, TASKS);
    (nodes, p)
}

/// Starts the move on set a's primary in a thread; returns once its copy is under way.
fn start_move(nodes: &Nodes, a: usize, p: u16) -> std::thread::JoinHandle<Result<String, String>> {
    let addr = nodes.nodes[a].addr;
    let mover = std::thread::spawn(move || {
        let mut c = connect(addr).ok_or("connect")?;
        let args = pack_args(&[Value::from("jobs"), Value::from(p), Value::from("b")]);
        c.call("tarq.move", &args, Some(Duration::from_secs(120)))
            .map(|r| r[0].as_str().unwrap_or_default().to_owned())
            .map_err(|e| e.to_string())
    });
    wait_for("the copy to be under way", || {
        nodes.overview(a).is_some_and(|o| {
            field(&o, "moves")
                .and_then(|m| field(m, "in_progress"))
                .and_then(|m| field(m, "tasks"))
                .and_then(Value::as_u64)
                .is_some_and(|n| n > 0)
        })
    });
    mover
}

/// Afterwards: the partition has one owner in etcd, and every task is there once.
fn check_every_task_once(etcd: &Etcd, nodes: &Nodes, p: u16) -> String {
    let owner = placement(&etcd.url).placement.tubes["jobs"].partitions[usize::from(p)]
        .set
        .clone();
    let (a, b) = primaries(nodes);
    // Through the other set's node than the owner's, so the takes are forwarded.
    let via = if owner == "a" { b } else { a };
    let (got, refused) = drain(nodes.nodes[via].addr);
    let mut seen = HashSet::new();
    for d in &got {
        assert!(
            seen.insert(d) || refused.contains(d),
            "{d} delivered twice though its ack was taken"
        );
    }
    assert_eq!(seen.len(), TASKS, "tasks lost: {} of {TASKS}", seen.len());
    owner
}

#[test]
fn the_source_killed_mid_copy_keeps_the_partition_whole_in_one_place() {
    let etcd = Etcd::start();
    let (mut nodes, p) = setup(&etcd);
    let (a, _) = primaries(&nodes);
    let mover = start_move(&nodes, a, p);
    nodes.kill(a);
    let answer = mover.join().unwrap();
    assert!(answer.is_err(), "the mover's connection closed: {answer:?}");
    // Back as a replica, so the set's changes have the replica --sync-replicas asks for.
    primaries(&nodes);
    nodes.start_node(a);
    let owner = check_every_task_once(&etcd, &nodes, p);
    eprintln!("source killed: the partition is on {owner}");
}

#[test]
fn the_target_killed_mid_copy_leaves_the_partition_on_the_source() {
    let etcd = Etcd::start();
    let (mut nodes, p) = setup(&etcd);
    let (a, b) = primaries(&nodes);
    let mover = start_move(&nodes, a, p);
    nodes.kill(b);
    let answer = mover.join().unwrap();
    let e = answer.expect_err("the move is given up");
    assert!(e.contains("given up"), "{e}");
    primaries(&nodes);
    nodes.start_node(b);
    let owner = check_every_task_once(&etcd, &nodes, p);
    assert_eq!(owner, "a");
}

#[test]
fn etcd_stopped_mid_move_leaves_the_partition_in_one_place() {
    let etcd = Etcd::start();
    let (nodes, p) = setup(&etcd);
    let (a, _) = primaries(&nodes);
    let mover = start_move(&nodes, a, p);
    etcd.pause();
    // The outage itself, not a wait for something: longer than a lease (2 s), so the commit
    // can be neither made nor read meanwhile, and the leaders' leases run out.
    std::thread::sleep(Duration::from_secs(3));
    etcd.resume();
    let answer = mover.join().unwrap();
    let owner = check_every_task_once(&etcd, &nodes, p);
    match &answer {
        Ok(report) => assert_eq!(owner, "b", "committed: {report}"),
        Err(e) if e.contains("given up") => assert_eq!(owner, "a", "{e}"),
        Err(e) => eprintln!("the move ended without its report ({e}); the partition is on {owner}"),
    }
}
