//! Operating a sharded cluster, end to end: two replica sets of two real `tarq` nodes each and
//! one real etcd on loopback, a tube of 4 partitions.
//! - every node's `queue.cluster()` shows both sets with their primaries and the tube's
//!   placement (owner_here where its own set owns a partition), the owners count their
//!   partitions' tasks; `tarq ctl cluster` prints the sets, the partitions and the owners'
//!   counts; each primary's `/metrics` has a series per partition (`partition` label), none
//!   twice, and `promtool check metrics` accepts the page;
//! - `tarq ctl place` gives an empty partition to the other set (every node shows it after
//!   its next read of etcd) and refuses one that holds a task, and an unknown set.
//!
//! Every wait has a deadline.

#[path = "support/cluster.rs"]
mod cluster;
mod support;

use std::collections::{BTreeMap, HashSet};
use std::io::Write;
use std::net::SocketAddr;
use std::process::{Command, Stdio};
use std::time::Duration;

use cluster::{field, str_field, wait_for, Etcd, Nodes};
use rmpv::Value;
use support::{http_get, prerequisite, tool};
use tarq_client::{pack_args, Client};

const PARTITIONS: usize = 4;

fn connect(addr: SocketAddr) -> Client {
    Client::connect_addr(addr, Duration::from_secs(10)).expect("connect")
}

/// Two sets (a0 a1, b0 b1) with their leaders.
struct Cluster {
    _etcd: Etcd,
    nodes: Nodes,
    a: usize,
    b: usize,
}

fn start(extra: &[&str]) -> Cluster {
    let etcd = Etcd::start();
    let nodes = Nodes::start_sets(&etcd, &[("a", 2), ("b", 2)], extra);
    let a = nodes.wait_leader_among(&[0, 1]);
    let b = nodes.wait_leader_among(&[2, 3]);
    Cluster {
        _etcd: etcd,
        nodes,
        a,
        b,
    }
}

/// A partition as a node's `queue.cluster()` shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Part {
    index: u64,
    set: String,
    owner_here: bool,
    total: Option<u64>,
}

impl Cluster {
    fn addr(&self, i: usize) -> SocketAddr {
        self.nodes.nodes[i].addr
    }

    fn set_of(i: usize) -> &'static str {
        if i < 2 {
            "a"
        } else {
            "b"
        }
    }

    /// Creates `name` (fifo) through node `i` and waits until every node knows it.
    fn create(&self, i: usize, name: &str) {
        let mut c = connect(self.addr(i));
        let opts = Value::Map(vec![(
            Value::from("partitions"),
            Value::from(PARTITIONS as u64),
        )]);
        let args = pack_args(&[Value::from(name), Value::from("fifo"), opts]);
        c.call("queue.create_tube", &args, None)
            .unwrap_or_else(|e| panic!("create_tube {name}: {e}"));
        for n in 0..self.nodes.nodes.len() {
            let mut c = connect(self.addr(n));
            wait_for(&format!("node {n} to know tube {name}"), || {
                let args = pack_args(&[Value::from(name)]);
                c.call("queue.statistics", &args, None).is_ok()
            });
        }
    }

    fn overview(&self, i: usize) -> Value {
        self.nodes
            .overview(i)
            .unwrap_or_else(|| panic!("node {i} answers queue.cluster()"))
    }

    /// Tube `tube`'s partitions as node `i` shows them, if it shows the tube.
    fn parts(&self, i: usize, tube: &str) -> Option<Vec<Part>> {
        parts_in(&self.overview(i), tube)
    }

    fn ctl(&self, i: usize, args: &[&str]) -> std::process::Output {
        self.nodes.nodes[i]
            .tarq
            .as_ref()
            .expect("running")
            .ctl(args)
    }
}

fn array(v: Option<&Value>) -> &[Value] {
    v.and_then(Value::as_array).map_or(&[], Vec::as_slice)
}

fn parts_in(overview: &Value, tube: &str) -> Option<Vec<Part>> {
    let placement = field(overview, "placement")?;
    let t = array(field(placement, "tubes"))
        .iter()
        .find(|t| str_field(t, "name") == tube)?;
    Some(
        array(field(t, "partitions"))
            .iter()
            .enumerate()
            .map(|(p, part)| {
                assert_eq!(
                    field(part, "partition").and_then(Value::as_u64),
                    Some(p as u64),
                    "{part:?}"
                );
                Part {
                    index: field(part, "index").and_then(Value::as_u64).unwrap(),
                    set: str_field(part, "set"),
                    owner_here: field(part, "owner_here").and_then(Value::as_bool).unwrap(),
                    total: field(part, "total").and_then(Value::as_u64),
                }
            })
            .collect(),
    )
}

/// Set name -> its primary's name, from `queue.cluster()`'s `sets`.
fn primaries(overview: &Value) -> BTreeMap<String, String> {
    array(field(overview, "sets"))
        .iter()
        .map(|s| {
            let primary = field(s, "primary").map_or(String::new(), |p| str_field(p, "name"));
            (str_field(s, "name"), primary)
        })
        .collect()
}

fn put(addr: SocketAddr, tube: &str, data: &str) -> u64 {
    let r = connect(addr)
        .call(
            &format!("queue.tube.{tube}:put"),
            &pack_args(&[Value::from(data)]),
            None,
        )
        .unwrap();
    r[0].as_array().unwrap()[0].as_u64().unwrap()
}

fn text(out: &[u8]) -> String {
    String::from_utf8_lossy(out).into_owned()
}

#[test]
fn every_node_shows_the_sets_and_placement_and_metrics_have_a_series_per_partition() {
    let cl = start(&["--metrics-listen", "127.0.0.1:0"]);
    cl.create(cl.a, "jobs");
    let leaders = BTreeMap::from([
        ("a".to_string(), cl.nodes.nodes[cl.a].name.clone()),
        ("b".to_string(), cl.nodes.nodes[cl.b].name.clone()),
    ]);

    // Every node: its own set, both sets with their primaries, the tube's 4 partitions spread
    // 2 and 2 over the sets, owner_here where its own set owns one.
    let mut placed = None;
    for i in 0..4 {
        let mut last = Value::Nil;
        wait_for(&format!("node {i} to show both sets and tube jobs"), || {
            last = cl.overview(i);
            primaries(&last) == leaders && parts_in(&last, "jobs").is_some()
        });
        assert_eq!(str_field(&last, "replica_set"), Cluster::set_of(i));
        assert_eq!(
            str_field(&last, "role"),
            if i == cl.a || i == cl.b {
                "leader"
            } else {
                "replica"
            },
            "role keeps its word"
        );
        for s in array(field(&last, "sets")) {
            let primary = str_field(field(s, "primary").unwrap(), "name");
            let members = array(field(s, "members"));
            assert_eq!(members.len(), 2, "{s:?}");
            for m in members {
                let want = if str_field(m, "name") == primary {
                    "primary"
                } else {
                    "replica"
                };
                assert_eq!(str_field(m, "role"), want, "{s:?}");
            }
        }
        let parts = parts_in(&last, "jobs").unwrap();
        assert_eq!(parts.len(), PARTITIONS, "{parts:?}");
        for p in &parts {
            assert_eq!(p.owner_here, p.set == Cluster::set_of(i), "node {i}: {p:?}");
        }
        let owners: Vec<(u64, String)> = parts.iter().map(|p| (p.index, p.set.clone())).collect();
        assert_eq!(
            owners.iter().filter(|(_, s)| s == "a").count(),
            PARTITIONS / 2,
            "{owners:?}"
        );
        // Every node shows the same placement.
        assert_eq!(placed.get_or_insert_with(|| owners.clone()), &owners);
    }

    // Tasks put through a's primary land on a partition it leads; each owner counts its own.
    for n in 0..8 {
        put(cl.addr(cl.a), "jobs", &format!("t{n}"));
    }
    let counted = |i: usize| -> u64 {
        let parts = cl.parts(i, "jobs").unwrap();
        parts
            .iter()
            .filter(|p| p.owner_here)
            .map(|p| p.total.expect("an owner counts its partition"))
            .sum()
    };
    assert_eq!(counted(cl.a), 8);
    assert_eq!(counted(cl.b), 0);
    let other: Vec<Part> = cl.parts(cl.a, "jobs").unwrap();
    assert!(
        other.iter().all(|p| p.owner_here || p.total.is_none()),
        "no counts for another set's partition: {other:?}"
    );

    // ctl cluster, asked of a replica of b: both sets, their primaries, every partition with
    // the owners' counts.
    let replica_b = [2, 3].into_iter().find(|&i| i != cl.b).unwrap();
    let out = cl.ctl(replica_b, &["cluster"]);
    let shown = text(&out.stdout);
    assert!(out.status.success(), "{shown}{}", text(&out.stderr));
    assert!(
        shown.contains(&format!(
            "\nreplica sets (b of this node: {})\n",
            cl.nodes.nodes[replica_b].name
        )),
        "{shown}"
    );
    // SET PRIMARY TERM NODE ADDRESS ROLE, a row per member.
    let set_rows: Vec<Vec<&str>> = shown
        .split("\nreplica sets")
        .nth(1)
        .unwrap()
        .lines()
        .skip(2)
        .take_while(|l| !l.is_empty())
        .map(|l| l.split_whitespace().collect())
        .collect();
    for (set, primary) in &leaders {
        let rows: Vec<_> = set_rows.iter().filter(|r| r[0] == set).collect();
        assert_eq!(rows.len(), 2, "{shown}");
        assert!(rows.iter().all(|r| r[1] == primary), "{shown}");
        assert!(
            rows.iter().any(|r| r[3] == primary && r[5] == "primary"),
            "{shown}"
        );
    }
    let rows: Vec<Vec<&str>> = shown
        .lines()
        .filter(|l| l.starts_with("jobs "))
        .map(|l| l.split_whitespace().collect())
        .collect();
    assert_eq!(rows.len(), PARTITIONS, "{shown}");
    let mut total = 0;
    for (p, row) in rows.iter().enumerate() {
        // TUBE TYPE PARTITION INDEX SET READY TAKEN DELAYED BURIED TOTAL
        assert_eq!(row[..3], ["jobs", "fifo", &p.to_string()[..]], "{shown}");
        let (index, set) = &placed.as_ref().unwrap()[p];
        assert_eq!(
            (row[3], row[4]),
            (&index.to_string()[..], &set[..]),
            "{shown}"
        );
        total += row[9]
            .parse::<u64>()
            .unwrap_or_else(|_| panic!("a count in {row:?}"));
    }
    assert_eq!(total, 8, "{shown}");
    // The same as JSON: queue.cluster() with the owners' counts.
    let out = cl.ctl(replica_b, &["cluster", "--json"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let jobs = doc["placement"]["tubes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["name"] == "jobs")
        .unwrap_or_else(|| panic!("jobs in {doc}"));
    let totals: Vec<u64> = jobs["partitions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["total"].as_u64().expect("every partition counted"))
        .collect();
    assert_eq!(totals.len(), PARTITIONS, "{doc}");
    assert_eq!(totals.iter().sum::<u64>(), 8, "{doc}");

    // Each primary's /metrics: a series per partition it holds, none twice; promtool agrees.
    for i in [cl.a, cl.b] {
        let metrics = cl.nodes.nodes[i].tarq.as_ref().unwrap().metrics.unwrap();
        let (status, page) = http_get(metrics, "/metrics");
        assert_eq!(status, 200, "{page}");
        let mut series = HashSet::new();
        for line in page.lines().filter(|l| !l.starts_with('#')) {
            let name = line.rsplit_once(' ').unwrap().0;
            assert!(series.insert(name.to_owned()), "{name} twice in\n{page}");
        }
        let placed = placed.as_ref().unwrap();
        for (p, (_, set)) in placed.iter().enumerate() {
            let line = format!("tarq_tube_ready{{tube=\"jobs\",partition=\"{p}\"}} ");
            if set == Cluster::set_of(i) {
                assert!(page.contains(&line), "{line:?} in\n{page}");
            }
        }
        assert!(
            !page.contains("tarq_tube_ready{tube=\"jobs\"} "),
            "a partitioned tube has no series without its partition:\n{page}"
        );
        if i == cl.a {
            let ready: u64 = page
                .lines()
                .filter(|l| l.starts_with("tarq_tube_ready{tube=\"jobs\",partition="))
                .map(|l| l.rsplit_once(' ').unwrap().1.parse::<u64>().unwrap())
                .sum();
            assert_eq!(ready, 8, "{page}");
        }
        promtool_accepts(&page);
    }
}

fn promtool_accepts(page: &str) {
    let promtool = prerequisite("promtool (Debian package prometheus)", tool("promtool"));
    let mut check = Command::new(promtool)
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    check
        .stdin
        .take()
        .unwrap()
        .write_all(page.as_bytes())
        .unwrap();
    let out = check.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "promtool check metrics failed:\n{}{}\npage:\n{page}",
        text(&out.stdout),
        text(&out.stderr)
    );
}

#[test]
fn ctl_place_gives_an_empty_partition_to_another_set_and_refuses_a_full_one() {
    let cl = start(&[]);
    cl.create(cl.a, "moving");
    let mut parts = None;
    wait_for("a's primary to show tube moving", || {
        parts = cl.parts(cl.a, "moving");
        parts.is_some()
    });
    // One task, put through a's primary, lands on a partition a owns.
    put(cl.addr(cl.a), "moving", "x");
    let parts = cl.parts(cl.a, "moving").unwrap();
    let full = parts
        .iter()
        .position(|p| p.owner_here && p.total == Some(1))
        .expect("the task's partition");
    let empty = parts
        .iter()
        .position(|p| p.owner_here && p.total == Some(0))
        .expect("an empty partition of a's");

    let etcd = cl.nodes.etcd_url.clone();
    let place = |partition: usize, to: &str| {
        let p = partition.to_string();
        cl.ctl(
            cl.b,
            &[
                "place",
                "moving",
                &p,
                "--to",
                to,
                "--etcd",
                &etcd,
                "--cluster",
                "c",
            ],
        )
    };

    let out = place(full, "b");
    let err = text(&out.stderr);
    assert!(!out.status.success(), "placed a partition holding a task");
    assert!(
        err.contains(&format!(
            "partition {full} of tube moving holds 1 tasks on replica set a"
        )) && err.contains("nothing was changed"),
        "{err}"
    );
    let out = place(empty, "zz");
    let err = text(&out.stderr);
    assert!(!out.status.success());
    assert!(err.contains("replica set \"zz\""), "{err}");

    let out = place(empty, "b");
    assert!(out.status.success(), "{}", text(&out.stderr));
    let now: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(now["partitions"][empty]["set"], "b", "{now}");

    // Every node takes it in at its next read of etcd; nothing else moved.
    for i in 0..4 {
        let mut seen = None;
        wait_for(&format!("node {i} to show partition {empty} on b"), || {
            seen = cl.parts(i, "moving");
            seen.as_ref()
                .is_some_and(|ps| ps[empty].set == "b" && ps[empty].owner_here == (i >= 2))
        });
        let seen = seen.unwrap();
        for (p, part) in seen.iter().enumerate().filter(|(p, _)| *p != empty) {
            assert_eq!(part.set, parts[p].set, "node {i}: partition {p} stayed");
        }
    }
    // The task stayed where it was, on a.
    assert_eq!(cl.parts(cl.a, "moving").unwrap()[full].total, Some(1));

    // Once acked, its partition is empty and moves too; the new owner numbers on from where
    // a stopped (the placement's first is a's next number), so the id is never given again.
    take_and_ack(cl.addr(cl.a), "moving");
    let first_before = serde_json::to_value(&now).unwrap()["partitions"][full]["first"].clone();
    let out = place(full, "b");
    assert!(out.status.success(), "{}", text(&out.stderr));
    let moved: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(moved["partitions"][full]["set"], "b", "{moved}");
    let first = moved["partitions"][full]["first"].as_u64().unwrap();
    assert!(
        first > first_before.as_u64().unwrap_or(0),
        "numbers on from a's next: {moved}, was {first_before}"
    );
}

/// Takes the one task of `tube` through `addr` and acks it.
fn take_and_ack(addr: SocketAddr, tube: &str) {
    let mut c = connect(addr);
    let r = c
        .call(
            &format!("queue.tube.{tube}:take"),
            &pack_args(&[Value::from(1)]),
            None,
        )
        .unwrap();
    let id = r[0].as_array().unwrap()[0].as_u64().unwrap();
    c.call(
        &format!("queue.tube.{tube}:ack"),
        &pack_args(&[Value::from(id)]),
        None,
    )
    .unwrap();
}
