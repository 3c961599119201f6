//! Growing and shrinking a sharded cluster with `tarq ctl rebalance` and `tarq ctl drain`, end
//! to end: real `tarq` nodes of one-node replica sets, one real etcd on loopback, the `tarq`
//! binary as an operator runs it.
//! - one set `a` holds a tube of 6 partitions with tasks; sets `b` and `c` join; `rebalance
//!   --dry-run` prints the plan and changes nothing (the placement's epoch stays); `rebalance`
//!   leaves every set owning 2 of the tube's partitions, and every task is delivered once;
//! - `move` answers a partition already on its target as such, and refuses an unknown set or
//!   tube saying nothing was changed;
//! - with tasks put through every set, `drain c` leaves `c` owning nothing, and every task is
//!   delivered once;
//! - SIGINT once the plan shows stops `rebalance` between moves: the moves it reports made are
//!   in etcd, the others not, no task is lost, and a second `rebalance` finishes the job.
//!
//! Every wait has a deadline.

#[path = "support/cluster.rs"]
mod cluster;
mod support;

use std::collections::{BTreeMap, BTreeSet};
use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use cluster::{field, str_field, wait_for, Etcd, Nodes};
use rmpv::Value;
use support::{BIN, WAIT};
use tarq_client::{pack_args, Client, ClientError};
use tarq_cluster::placement::{self, ClusterMap};

const PARTITIONS: u64 = 6;
/// Tasks put in each round: enough that each move copies several pages.
const TASKS: usize = 3000;

fn connect(addr: SocketAddr) -> Client {
    Client::connect_addr(addr, Duration::from_secs(10)).expect("connect")
}

/// A call; one refused for a reason that passes by itself (the node's view of etcd not read
/// lately, a partition that has just moved to its set and is held a moment, a call relayed
/// between two nodes whose views of a move just made differ) is made again, as a client
/// would: the refusal says nothing was done.
fn call(c: &mut Client, f: &str, args: &[Value]) -> Vec<Value> {
    let mut answer = None;
    wait_for(&format!("{f} not to be refused"), || {
        match c.call(f, &pack_args(args), None) {
            Ok(values) => answer = Some(values),
            Err(ClientError::Server { message, .. })
                if message.contains("view of the placement is stale")
                    || message.contains("has just moved")
                    || message.contains("relayed once already") => {}
            Err(e) => panic!("{f}: {e}"),
        }
        answer.is_some()
    });
    answer.unwrap()
}

fn text(out: &[u8]) -> String {
    String::from_utf8_lossy(out).into_owned()
}

/// The number just before `tail` in `line` (`moved jobs/2 a -> c: 500 tasks in 7 ms`).
fn number_before(line: &str, tail: &str) -> u64 {
    let head = &line[..line
        .find(tail)
        .unwrap_or_else(|| panic!("{tail:?} in {line:?}"))];
    let n = head.rsplit([' ', '(']).next().unwrap();
    n.parse()
        .unwrap_or_else(|_| panic!("a number before {tail:?} in {line:?}"))
}

/// The cluster's map as etcd holds it.
fn map(etcd: &str) -> ClusterMap {
    let mut client = tarq_cluster::etcd::Client::connect(&[etcd.to_string()]).unwrap();
    placement::read(&mut client, "c", Duration::from_secs(5)).unwrap()
}

/// How many partitions of `jobs` each set owns, in etcd.
fn owned(etcd: &str) -> BTreeMap<String, usize> {
    let mut n = BTreeMap::new();
    for p in &map(etcd).placement.tubes["jobs"].partitions {
        *n.entry(p.set.clone()).or_default() += 1;
    }
    n
}

/// Puts `n` tasks `<prefix><i>` into `jobs` through the node at `addr`.
fn put_all(addr: SocketAddr, prefix: &str, n: usize) -> Vec<String> {
    let mut c = connect(addr);
    (0..n)
        .map(|i| {
            let data = format!("{prefix}{i}");
            call(&mut c, "queue.tube.jobs:put", &[Value::from(data.as_str())]);
            data
        })
        .collect()
}

/// Takes and acks every task of `jobs` through each of `addrs` in turn, and returns the
/// payloads; a payload delivered twice fails the test.
fn take_all(addrs: &[SocketAddr]) -> BTreeSet<String> {
    let mut seen = BTreeSet::new();
    for &addr in addrs {
        let mut c = connect(addr);
        loop {
            let r = call(&mut c, "queue.tube.jobs:take", &[Value::from(0)]);
            let Some(task) = r.first().and_then(Value::as_array) else {
                break;
            };
            let id = task[0].as_u64().unwrap();
            let data = task[2].as_str().unwrap().to_owned();
            assert!(seen.insert(data.clone()), "{data} delivered twice");
            call(&mut c, "queue.tube.jobs:ack", &[Value::from(id)]);
        }
    }
    seen
}

/// The tasks the owners count in `jobs`, once every owner's primary counts the partitions
/// etcd gives its set (each node takes in a move at its next read of etcd).
fn counted(nodes: &Nodes, etcd: &str) -> u64 {
    let placed = map(etcd);
    let mut total = 0;
    wait_for("every owner to count its partitions of jobs", || {
        total = 0;
        let jobs = &placed.placement.tubes["jobs"];
        for i in 0..nodes.nodes.len() {
            let Some(o) = nodes.overview(i) else {
                return false;
            };
            let set = str_field(&o, "replica_set");
            let parts = field(&o, "placement")
                .and_then(|p| field(p, "tubes"))
                .and_then(Value::as_array)
                .and_then(|ts| ts.iter().find(|t| str_field(t, "name") == "jobs"))
                .and_then(|t| field(t, "partitions"))
                .and_then(Value::as_array)
                .cloned()
                .unwrap_or_default();
            for (p, placed) in jobs.partitions.iter().enumerate() {
                let Some(shown) = parts.get(p) else {
                    return false;
                };
                if str_field(shown, "set") != placed.set {
                    return false;
                }
                if placed.set == set {
                    match field(shown, "total").and_then(Value::as_u64) {
                        Some(n) => total += n,
                        None => return false,
                    }
                }
            }
        }
        true
    });
    total
}

/// A cluster of set `a` (one node) with tube `jobs` of 6 partitions holding `TASKS` tasks,
/// then sets `b` and `c` (one node each) joined, every primary known to node a.
struct Grown {
    _etcd: Etcd,
    etcd: String,
    nodes: Nodes,
    put: Vec<String>,
}

/// A failing test shows every node's log.
impl Drop for Grown {
    fn drop(&mut self) {
        if std::thread::panicking() {
            for i in 0..self.nodes.nodes.len() {
                let name = self.nodes.nodes[i].name.clone();
                eprintln!("--- log of {name}:\n{}", self.nodes.log(i));
            }
        }
    }
}

impl Grown {
    fn start() -> Grown {
        let etcd = Etcd::start();
        let nodes = Nodes::start_sets(&etcd, &[("a", 1)], &[]);
        let mut g = Grown {
            etcd: etcd.url.clone(),
            _etcd: etcd,
            nodes,
            put: Vec::new(),
        };
        let nodes = &mut g.nodes;
        nodes.wait_leader_among(&[0]);
        let a = nodes.nodes[0].addr;
        let opts = Value::Map(vec![(Value::from("partitions"), Value::from(PARTITIONS))]);
        let mut admin = connect(a);
        call(
            &mut admin,
            "queue.create_tube",
            &[Value::from("jobs"), Value::from("fifo"), opts],
        );
        wait_for("node a to hold tube jobs", || {
            nodes.overview(0).is_some_and(|o| {
                let tubes = field(&o, "placement").and_then(|p| field(p, "tubes"));
                let tubes = tubes.and_then(Value::as_array).cloned().unwrap_or_default();
                tubes.iter().any(|t| str_field(t, "name") == "jobs")
            })
        });
        g.put = put_all(a, "t", TASKS);
        let nodes = &mut g.nodes;
        let b = nodes.add_set_node("b");
        let c = nodes.add_set_node("c");
        nodes.wait_leader_among(&[b]);
        nodes.wait_leader_among(&[c]);
        // What an operator waits for in `tarq ctl cluster`: the new sets' primaries.
        wait_for("node a to see the primaries of b and c", || {
            nodes.overview(0).is_some_and(|o| {
                let sets = field(&o, "sets").and_then(Value::as_array).cloned();
                sets.unwrap_or_default()
                    .iter()
                    .filter(|s| field(s, "primary").is_some_and(|p| !p.is_nil()))
                    .count()
                    == 3
            })
        });
        g
    }

    fn ctl(&self, args: &[&str]) -> std::process::Output {
        let mut argv: Vec<&str> = args.to_vec();
        argv.extend(["--etcd", &self.etcd, "--cluster", "c"]);
        self.nodes.nodes[0].tarq.as_ref().unwrap().ctl(&argv)
    }

    fn addrs(&self) -> Vec<SocketAddr> {
        self.nodes.nodes.iter().map(|n| n.addr).collect()
    }
}

#[test]
fn rebalance_spreads_a_tube_over_new_sets_and_drain_empties_one() {
    let g = Grown::start();
    let etcd = g.etcd.clone();
    assert_eq!(owned(&etcd), BTreeMap::from([("a".to_string(), 6)]));
    assert_eq!(counted(&g.nodes, &etcd), TASKS as u64);

    // A dry run prints the plan and changes nothing.
    let epoch = map(&etcd).placement.epoch;
    let out = g.ctl(&["rebalance", "--dry-run"]);
    let shown = text(&out.stdout);
    assert!(out.status.success(), "{shown}{}", text(&out.stderr));
    let planned: Vec<&str> = shown.lines().filter(|l| l.starts_with("move ")).collect();
    // a owns the tube default too: 7, 0, 0 become 3, 2, 2.
    assert_eq!(planned.len(), 4, "{shown}");
    assert!(
        planned.iter().all(|l| l.starts_with("move jobs/")),
        "{shown}"
    );
    assert!(shown.contains("dry run: nothing was moved"), "{shown}");
    assert_eq!(
        map(&etcd).placement.epoch,
        epoch,
        "the dry run changed etcd"
    );

    let out = g.ctl(&["rebalance"]);
    let shown = text(&out.stdout);
    assert!(out.status.success(), "{shown}{}", text(&out.stderr));
    let moved: Vec<&str> = shown.lines().filter(|l| l.starts_with("moved ")).collect();
    assert_eq!(moved.len(), 4, "{shown}");
    assert!(shown.contains("rebalanced: 4 moved"), "{shown}");
    assert_eq!(
        owned(&etcd),
        BTreeMap::from([
            ("a".to_string(), 2),
            ("b".to_string(), 2),
            ("c".to_string(), 2)
        ]),
        "{shown}"
    );
    // The tasks the moves report are the ones the plan counted (nothing else ran meanwhile).
    let planned: u64 = shown
        .lines()
        .filter(|l| l.starts_with("move "))
        .map(|l| number_before(l, " tasks)"))
        .sum();
    let reported: u64 = moved.iter().map(|l| number_before(l, " tasks in")).sum();
    assert!(reported > 0, "{shown}");
    assert_eq!(reported, planned, "{shown}");
    assert_eq!(counted(&g.nodes, &etcd), TASKS as u64);
    // Balanced now: nothing more to do.
    let out = g.ctl(&["rebalance"]);
    assert!(
        text(&out.stdout).contains("balanced already"),
        "{}",
        text(&out.stdout)
    );

    // One move by hand: to where it is already, and two refusals.
    let on_b = map(&etcd).placement.tubes["jobs"]
        .partitions
        .iter()
        .position(|p| p.set == "b")
        .unwrap()
        .to_string();
    let out = g.ctl(&["move", "jobs", &on_b, "--to", "b"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["already"], true, "{report}");
    for (args, why) in [
        (["move", "jobs", &on_b, "--to", "zz"], "replica set \"zz\""),
        (["move", "nosuch", "0", "--to", "a"], "no tube \"nosuch\""),
    ] {
        let out = g.ctl(&args);
        let err = text(&out.stderr);
        assert!(!out.status.success(), "{args:?}");
        assert!(
            err.contains(why) && err.contains("nothing was changed"),
            "{err}"
        );
    }

    // Every task is there, delivered once.
    let all = g.addrs();
    let delivered = take_all(&all);
    let want: BTreeSet<String> = g.put.iter().cloned().collect();
    assert_eq!(delivered, want);

    // New tasks through every set land on each set's own partitions; then c is drained.
    let mut put = Vec::new();
    for (i, addr) in all.iter().enumerate() {
        put.extend(put_all(*addr, &format!("n{i}-"), TASKS / 3));
    }
    assert_eq!(counted(&g.nodes, &etcd), TASKS as u64);
    let out = g.ctl(&["drain", "c", "--dry-run"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(owned(&etcd)["c"], 2, "the dry run moved something");
    let out = g.ctl(&["drain", "c"]);
    let shown = text(&out.stdout);
    assert!(out.status.success(), "{shown}{}", text(&out.stderr));
    assert!(
        shown.contains("replica set c owns no partition now"),
        "{shown}"
    );
    let now = owned(&etcd);
    assert_eq!(now.get("c"), None, "{shown}");
    assert_eq!(now.values().sum::<usize>(), PARTITIONS as usize);
    assert_eq!(counted(&g.nodes, &etcd), TASKS as u64);
    let out = g.ctl(&["drain", "c"]);
    assert!(
        text(&out.stdout).contains("owns no partition: nothing to move"),
        "{}",
        text(&out.stdout)
    );
    let delivered = take_all(&all);
    let want: BTreeSet<String> = put.into_iter().collect();
    assert_eq!(delivered, want);
}

#[test]
fn sigint_stops_rebalance_between_moves_and_a_second_run_finishes() {
    let g = Grown::start();
    let etcd = g.etcd.clone();
    let mut child = Command::new(BIN)
        .args(["ctl", "rebalance", "--etcd", &etcd, "--cluster", "c"])
        .env("RUST_BACKTRACE", "0")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let (tx, lines) = mpsc::channel();
    let stdout = child.stdout.take().unwrap();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let mut shown = Vec::new();
    // The plan shows once SIGINT is caught: stop it there.
    loop {
        let line = lines.recv_timeout(WAIT).expect("the plan within the wait");
        let plan = line.starts_with("plan: ");
        shown.push(line);
        if plan {
            break;
        }
    }
    let ok = Command::new("kill")
        .args(["-INT", &child.id().to_string()])
        .status()
        .unwrap()
        .success();
    assert!(ok, "kill -INT ctl");
    while let Ok(line) = lines.recv_timeout(WAIT) {
        shown.push(line);
    }
    let mut status = None;
    wait_for("ctl to exit", || {
        status = child.try_wait().unwrap();
        status.is_some()
    });
    let mut err = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut err).unwrap();
    let shown = shown.join("\n");
    assert!(!status.unwrap().success(), "{shown}\n{err}");
    assert!(
        err.contains("stopped by SIGINT before move"),
        "{shown}\n{err}"
    );
    let moved: Vec<&str> = shown.lines().filter(|l| l.starts_with("moved ")).collect();
    assert!(moved.len() < 4, "every move made after SIGINT:\n{shown}");

    // What it reports made is in etcd; the rest stayed on a.
    let placed = map(&etcd).placement.tubes["jobs"].clone();
    for (p, part) in placed.partitions.iter().enumerate() {
        let line = moved
            .iter()
            .find(|l| l.starts_with(&format!("moved jobs/{p} ")));
        let want = match line {
            Some(l) => l.split(" -> ").nth(1).unwrap().split(':').next().unwrap(),
            None => "a",
        };
        assert_eq!(part.set, want, "partition {p}:\n{shown}");
    }
    assert_eq!(counted(&g.nodes, &etcd), TASKS as u64);

    let out = g.ctl(&["rebalance"]);
    let again = text(&out.stdout);
    assert!(out.status.success(), "{again}{}", text(&out.stderr));
    assert_eq!(
        owned(&etcd),
        BTreeMap::from([
            ("a".to_string(), 2),
            ("b".to_string(), 2),
            ("c".to_string(), 2)
        ]),
        "{again}"
    );
    let delivered = take_all(&g.addrs());
    assert_eq!(delivered, g.put.iter().cloned().collect());
}
