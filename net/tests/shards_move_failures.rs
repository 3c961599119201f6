//! A partition move interrupted, end to end: two replica sets of two real `tarq` nodes each
//! (`--sync-replicas 1`) and one real etcd on loopback; a partition holding many tasks is
//! moved from set a to set b, and in the middle of its copy
//! - the source primary is killed (-9),
//! - the target primary is killed (-9),
//! - etcd is stopped (SIGSTOP) for longer than a lease and then resumed;
//! - etcd applies the commit and its answer is lost, then etcd is out of reach for a moment
//!   (a proxy in front of etcd, `support/etcd_proxy.rs`): the old owner still reads itself
//!   as the owner in its view, and must learn from etcd that the move committed;
//! - the commit is held back on its way to etcd while the old owner dies, and reaches etcd
//!   after the new owner, its link closed, has discarded its copy: the late commit must fail;
//! - the commit is held back while the old owner is stopped (SIGSTOP), its set elects another
//!   primary that takes puts into the partition, and the commit reaches etcd then: it must
//!   fail, or the new owner's copy would lack those puts.
//!
//! Each time the partition ends in exactly one place — where etcd's placement says — and
//! every task put before the move is delivered exactly once afterwards, through any node.
//!
//! Every wait has a deadline.

#[path = "support/cluster.rs"]
mod cluster;
#[path = "support/etcd_proxy.rs"]
mod etcd_proxy;
mod support;

use std::collections::HashSet;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use cluster::{field, wait_for, Etcd, Nodes};
use etcd_proxy::{EtcdProxy, Fault};
use rmpv::Value;
use tarq_client::{pack_args, Client};

/// Tasks in the moving partition: enough that its copy is under way for a while.
const TASKS: usize = 150_000;
/// Tasks in a partition whose commit is the test's point, not its copy.
const FEW_TASKS: usize = 5_000;
const WINDOW: usize = 256;

fn connect(addr: SocketAddr) -> Option<Client> {
    Client::connect_addr(addr, Duration::from_secs(5)).ok()
}

fn placement(etcd: &str) -> tarq_cluster::ClusterMap {
    let mut client = tarq_cluster::etcd::Client::connect(&[etcd.to_owned()]).unwrap();
    tarq_cluster::placement::read(&mut client, "c", Duration::from_secs(2)).unwrap()
}

/// Puts tasks "<prefix>0".. through `addr`, pipelined, until `n` are acknowledged: the
/// payloads acknowledged, and those answered with an error (refused, or — a leadership that ran out
/// meanwhile — perhaps kept), which the checks allow to be there or not.
fn fill(addr: SocketAddr, n: usize, prefix: &str) -> (HashSet<String>, HashSet<String>) {
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut c = connect(addr).expect("connect");
    let (mut acked, mut unsure) = (HashSet::new(), HashSet::new());
    let mut in_flight = std::collections::HashMap::new();
    let mut sent = 0;
    while acked.len() + in_flight.len() < n || !in_flight.is_empty() {
        assert!(
            Instant::now() < deadline,
            "{} puts acknowledged",
            acked.len()
        );
        while acked.len() + in_flight.len() < n && in_flight.len() < WINDOW {
            let payload = format!("{prefix}{sent}");
            let args = pack_args(&[Value::from(payload.as_str())]);
            let sync = c
                .send_request(|o, s| tarq_iproto::client::call(o, s, "queue.tube.jobs:put", &args))
                .unwrap();
            in_flight.insert(sync, payload);
            sent += 1;
        }
        let r = c.recv().unwrap().expect("a reply");
        let payload = in_flight
            .remove(&r.sync)
            .expect("a reply to a put in flight");
        match r.into_result() {
            Ok(_) => acked.insert(payload),
            Err(e) => {
                eprintln!("put: {e}");
                unsure.insert(payload)
            }
        };
    }
    (acked, unsure)
}

/// Takes and acks every task (pipelined) until the tube counts none, through the node
/// `node()` names: the payloads delivered, and those that may come again (their ack was
/// refused as not taken, or their session ended before the ack: back to ready). A connection
/// that closes, or a node that stops leading (a lease not refreshed on a loaded machine), is
/// replaced by a new one to the node `node()` names then, as a client would.
fn drain(node: impl Fn() -> SocketAddr) -> (Vec<String>, HashSet<String>) {
    let deadline = Instant::now() + Duration::from_secs(120);
    let (mut out, mut again) = (Vec::new(), HashSet::new());
    let take = pack_args(&[Value::from(0)]);
    'connection: loop {
        assert!(Instant::now() < deadline, "drained {} so far", out.len());
        let Some(mut c) = connect(node()) else {
            continue;
        };
        loop {
            assert!(Instant::now() < deadline, "drained {} so far", out.len());
            let mut tasks = Vec::new();
            let takes = vec![take.clone(); WINDOW];
            let Some(answers) = pipelined(&mut c, "queue.tube.jobs:take", takes) else {
                continue 'connection;
            };
            for r in answers {
                match r {
                    Ok(r) => {
                        if let Some(t) = r.first().and_then(Value::as_array) {
                            let data = t[2].as_str().unwrap().to_owned();
                            tasks.push((t[0].as_u64().unwrap(), data));
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
                    return (out, again);
                }
                continue;
            }
            let acks = (tasks.iter())
                .map(|(id, _)| pack_args(&[Value::from(*id)]))
                .collect();
            let Some(answers) = pipelined(&mut c, "queue.tube.jobs:ack", acks) else {
                // Delivered; the session ended with the connection, so they may come again.
                for (_, data) in tasks {
                    out.push(data.clone());
                    again.insert(data);
                }
                continue 'connection;
            };
            let mut lost_session = false;
            for ((_, data), a) in tasks.into_iter().zip(answers) {
                match a {
                    Ok(_) => out.push(data),
                    // Not this session's any more: back to ready, and delivered again.
                    Err(e) if e.contains("was not taken") => {
                        out.push(data.clone());
                        again.insert(data);
                    }
                    // Delivered, its ack not known done: this session is given up (a new
                    // connection ends it), so the task may go back to ready and come again.
                    Err(e) => {
                        eprintln!("ack: {e}");
                        out.push(data.clone());
                        again.insert(data);
                        lost_session = true;
                    }
                }
            }
            if lost_session {
                continue 'connection;
            }
        }
    }
}

/// Calls `function` with each of `args`, pipelined; the answers in order, or `None` when the
/// connection failed first.
fn pipelined(
    c: &mut Client,
    function: &str,
    args: Vec<Vec<u8>>,
) -> Option<Vec<Result<Vec<Value>, String>>> {
    let mut syncs = Vec::with_capacity(args.len());
    for a in &args {
        let sync = c
            .send_request(|o, s| tarq_iproto::client::call(o, s, function, a))
            .ok()?;
        syncs.push(sync);
    }
    let mut by_sync = std::collections::HashMap::new();
    while by_sync.len() < syncs.len() {
        let r = c.recv().ok()??;
        let sync = r.sync;
        by_sync.insert(
            sync,
            r.into_result()
                .map_err(|e| e.to_string())
                .and_then(|r| r.values().map_err(|e| e.to_string())),
        );
    }
    Some(syncs.iter().map(|s| by_sync.remove(s).unwrap()).collect())
}

/// The running primary of each set.
fn primaries(nodes: &Nodes) -> (usize, usize) {
    (primary_of(nodes, "a", None), primary_of(nodes, "b", None))
}

/// The running primary of set `set`, `but` left out (a node stopped, which cannot answer).
fn primary_of(nodes: &Nodes, set: &str, but: Option<usize>) -> usize {
    let among: Vec<usize> = (0..nodes.nodes.len())
        .filter(|&i| nodes.nodes[i].name.starts_with(set) && nodes.nodes[i].tarq.is_some())
        .filter(|&i| Some(i) != but)
        .collect();
    nodes.wait_leader_among(&among)
}

/// What was put: the payloads acknowledged, and those whose put answered an error.
struct Put {
    acked: HashSet<String>,
    unsure: HashSet<String>,
}

/// A cluster with the tube and set a's partition full; the partition's number.
fn setup(etcd: &Etcd) -> (Nodes, u16, Put) {
    setup_at(etcd, &etcd.url, 2, TASKS)
}

/// [`setup`] with the nodes given etcd at `url` (a proxy before it), `a_nodes` nodes in set
/// a, `tasks` tasks.
fn setup_at(etcd: &Etcd, url: &str, a_nodes: usize, tasks: usize) -> (Nodes, u16, Put) {
    let sets = [("a", a_nodes), ("b", 2)];
    let nodes = Nodes::start_sets_at(url, &sets, &["--sync-replicas", "1"]);
    let (a, _) = primaries(&nodes);
    let mut c = connect(nodes.nodes[a].addr).unwrap();
    let opts = Value::Map(vec![(Value::from("partitions"), Value::from(2))]);
    let args = pack_args(&[Value::from("jobs"), Value::from("fifottl"), opts]);
    c.call("queue.create_tube", &args, None).unwrap();
    for i in 0..nodes.nodes.len() {
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
    let (acked, unsure) = fill(nodes.nodes[a].addr, tasks, "t");
    (nodes, p, Put { acked, unsure })
}

/// The move of partition `p` from set a to set b, asked of set a's primary in a thread: its
/// answer, the report or why not.
fn spawn_move(nodes: &Nodes, a: usize, p: u16) -> std::thread::JoinHandle<Result<String, String>> {
    let addr = nodes.nodes[a].addr;
    std::thread::spawn(move || {
        let mut c = connect(addr).ok_or("connect")?;
        let args = pack_args(&[Value::from("jobs"), Value::from(p), Value::from("b")]);
        c.call("tarq.move", &args, Some(Duration::from_secs(120)))
            .map(|r| r[0].as_str().unwrap_or_default().to_owned())
            .map_err(|e| e.to_string())
    })
}

/// The text of the move's commit in etcd (its epoch key's value), which the proxy looks for.
fn commit_text(p: u16) -> String {
    format!("move jobs partition {p} from a to b")
}

/// Starts the move on set a's primary in a thread; returns once its copy is under way.
fn start_move(nodes: &Nodes, a: usize, p: u16) -> std::thread::JoinHandle<Result<String, String>> {
    let mover = spawn_move(nodes, a, p);
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
fn check_every_task_once(etcd: &Etcd, nodes: &Nodes, p: u16, put: &Put) -> String {
    let owner = placement(&etcd.url).placement.tubes["jobs"].partitions[usize::from(p)]
        .set
        .clone();
    // Through the primary of the other set than the owner's, so the takes are forwarded.
    let via = if owner == "a" { "b" } else { "a" };
    let (got, again) = drain(|| nodes.nodes[primary_of(nodes, via, None)].addr);
    let mut seen = HashSet::new();
    for d in &got {
        assert!(
            seen.insert(d) || again.contains(d),
            "{d} delivered twice though its ack was taken"
        );
    }
    let lost: Vec<&String> = put
        .acked
        .iter()
        .filter(|d| !seen.contains(d))
        .take(5)
        .collect();
    assert!(
        lost.is_empty(),
        "acknowledged puts lost, among them {lost:?}"
    );
    let stray: Vec<&&String> = (seen.iter())
        .filter(|d| !put.acked.contains(**d) && !put.unsure.contains(**d))
        .take(5)
        .collect();
    assert!(stray.is_empty(), "tasks nobody put: {stray:?}");
    owner
}

#[test]
fn the_source_killed_mid_copy_keeps_the_partition_whole_in_one_place() {
    let etcd = Etcd::start();
    let (mut nodes, p, put) = setup(&etcd);
    let (a, _) = primaries(&nodes);
    let mover = start_move(&nodes, a, p);
    nodes.kill(a);
    let answer = mover.join().unwrap();
    assert!(answer.is_err(), "the mover's connection closed: {answer:?}");
    // Back as a replica, so the set's changes have the replica --sync-replicas asks for.
    primaries(&nodes);
    nodes.start_node(a);
    let owner = check_every_task_once(&etcd, &nodes, p, &put);
    eprintln!("source killed: the partition is on {owner}");
}

#[test]
fn the_target_killed_mid_copy_leaves_the_partition_on_the_source() {
    let etcd = Etcd::start();
    let (mut nodes, p, put) = setup(&etcd);
    let (a, b) = primaries(&nodes);
    let mover = start_move(&nodes, a, p);
    nodes.kill(b);
    let answer = mover.join().unwrap();
    let e = answer.expect_err("the move is given up");
    assert!(e.contains("given up"), "{e}");
    primaries(&nodes);
    nodes.start_node(b);
    let owner = check_every_task_once(&etcd, &nodes, p, &put);
    assert_eq!(owner, "a");
}

#[test]
fn etcd_stopped_mid_move_leaves_the_partition_in_one_place() {
    let etcd = Etcd::start();
    let (nodes, p, put) = setup(&etcd);
    let (a, _) = primaries(&nodes);
    let mover = start_move(&nodes, a, p);
    etcd.pause();
    // The outage itself, not a wait for something: longer than a lease (2 s), so the commit
    // can be neither made nor read meanwhile, and the leaders' leases run out.
    std::thread::sleep(Duration::from_secs(3));
    etcd.resume();
    let answer = mover.join().unwrap();
    let owner = check_every_task_once(&etcd, &nodes, p, &put);
    match &answer {
        Ok(report) => assert_eq!(owner, "b", "committed: {report}"),
        Err(e) if e.contains("given up") => assert_eq!(owner, "a", "{e}"),
        Err(e) => eprintln!("the move ended without its report ({e}); the partition is on {owner}"),
    }
}

#[test]
fn a_commit_applied_whose_answer_is_lost_hands_the_partition_over() {
    let etcd = Etcd::start();
    let proxy = EtcdProxy::start(&etcd.url);
    let (nodes, p, put) = setup_at(&etcd, &proxy.url, 2, FEW_TASKS);
    let (a, _) = primaries(&nodes);
    // etcd out of reach a moment after: shorter than a request's timeout, so the leaders keep
    // their leases, and long enough that the old owner reads nothing new meanwhile.
    let then_pause = Duration::from_millis(700);
    proxy.arm(&commit_text(p), Fault::LoseAnswer { then_pause });
    let mover = spawn_move(&nodes, a, p);
    proxy.wait_answered();
    let answer = mover.join().unwrap();
    // etcd took the commit: the partition is set b's, whole, and the move says so.
    let owner = check_every_task_once(&etcd, &nodes, p, &put);
    assert_eq!(owner, "b", "the move's answer: {answer:?}");
    let report = answer.expect("the move committed");
    assert!(report.contains("\"to\":\"b\""), "{report}");
}

#[test]
fn a_copy_discarded_while_the_commit_is_in_flight_is_never_committed() {
    let etcd = Etcd::start();
    let proxy = EtcdProxy::start(&etcd.url);
    let (mut nodes, p, put) = setup_at(&etcd, &proxy.url, 2, FEW_TASKS);
    let (a, b) = primaries(&nodes);
    proxy.arm(&commit_text(p), Fault::Hold);
    let mover = spawn_move(&nodes, a, p);
    // The commit is on its way to etcd, held back, when the old owner dies.
    proxy.wait_arrived();
    let seen = nodes.nodes[b].tarq.as_ref().unwrap().log().len();
    nodes.kill(a);
    assert!(
        mover.join().unwrap().is_err(),
        "the mover's connection closed"
    );
    // The new owner's link from it closed: it discards its copy (once etcd says it may).
    let tarq_b = nodes.nodes[b].tarq.as_mut().unwrap();
    tarq_b.wait_for_line_after(seen, "letting go of a partition's tasks");
    // The commit reaches etcd now, after the copy is gone.
    proxy.release();
    proxy.wait_answered();
    let map = placement(&etcd.url);
    assert_eq!(
        map.placement.tubes["jobs"].partitions[usize::from(p)].set,
        "a",
        "the late commit took the partition to the set that discarded its copy"
    );
    // Back as a replica, so the set's changes have the replica --sync-replicas asks for.
    primaries(&nodes);
    nodes.start_node(a);
    let owner = check_every_task_once(&etcd, &nodes, p, &put);
    assert_eq!(owner, "a");
}

#[test]
fn a_commit_that_lands_after_its_primary_was_replaced_is_refused() {
    let etcd = Etcd::start();
    let proxy = EtcdProxy::start(&etcd.url);
    // Three nodes in set a: the one that replaces the stopped primary has a replica.
    let (nodes, p, mut put) = setup_at(&etcd, &proxy.url, 3, FEW_TASKS);
    let (a, _) = primaries(&nodes);
    proxy.arm(&commit_text(p), Fault::Hold);
    let mover = spawn_move(&nodes, a, p);
    proxy.wait_arrived();
    // The old primary stops with its commit on the way; its set elects another, which takes
    // puts into the partition (a put goes to a partition its node leads).
    nodes.signal(a, "STOP");
    let a2 = primary_of(&nodes, "a", Some(a));
    let (acked, unsure) = fill(nodes.nodes[a2].addr, 500, "u");
    put.acked.extend(acked);
    put.unsure.extend(unsure);
    // The commit reaches etcd only now.
    proxy.release();
    proxy.wait_answered();
    nodes.signal(a, "CONT");
    let _ = mover.join().unwrap();
    let owner = check_every_task_once(&etcd, &nodes, p, &put);
    assert_eq!(
        owner, "a",
        "a commit sent by a primary that no longer leads took effect"
    );
}
