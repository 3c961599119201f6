//! The HTTP API's task listing on a sharded cluster (issue 39): two replica sets of one real
//! `tarq` node each on one real etcd, a tube of four partitions, tasks in all of them.
//! - `GET /api/tubes/jobs/tasks` from either node lists the whole tube: paged with its
//!   `next_after` cursor, every task comes once, each with its partition, partition by
//!   partition, in the same order from both nodes, for each status;
//! - with one set's node gone, a listing is still answered promptly: the other set's tasks,
//!   and the gone set's partitions named in `unanswered`.
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
use serde_json::Value as Json;
use support::http_get;
use tarq_client::{pack_args, Client};

fn call(c: &mut Client, f: &str, args: &[Value]) -> Vec<Value> {
    c.call(f, &pack_args(args), None)
        .unwrap_or_else(|e| panic!("{f}: {e}"))
}

/// Two sets of one node each, both led and known to each other, with a tube `jobs` of four
/// partitions: 30 tasks put through a, 20 through b (each node puts into the partitions it
/// leads), 3 of them buried.
fn cluster(etcd: &Etcd) -> Nodes {
    let nodes = Nodes::start_sets(
        etcd,
        &[("a", 1), ("b", 1)],
        &["--http-listen", "127.0.0.1:0"],
    );
    nodes.wait_leader_among(&[0]);
    nodes.wait_leader_among(&[1]);
    for i in 0..2 {
        wait_for("both sets' primaries known", || {
            nodes.overview(i).is_some_and(|o| {
                let sets = field(&o, "sets").and_then(Value::as_array).cloned();
                let led = (sets.unwrap_or_default().iter())
                    .filter(|s| field(s, "primary").is_some_and(|p| !p.is_nil()))
                    .count();
                led == 2
            })
        });
    }
    let connect = |i: usize| {
        Client::connect_addr(nodes.nodes[i].addr, Duration::from_secs(10)).expect("connect")
    };
    let (mut a, mut b) = (connect(0), connect(1));
    let opts = Value::Map(vec![(Value::from("partitions"), Value::from(4))]);
    call(
        &mut a,
        "queue.create_tube",
        &[Value::from("jobs"), Value::from("fifottl"), opts],
    );
    for (c, n, who) in [(&mut a, 30, "a"), (&mut b, 20, "b")] {
        for k in 0..n {
            let data = format!("{who}{k}");
            call(c, "queue.tube.jobs:put", &[Value::from(data)]);
        }
    }
    for c in [&mut a, &mut b] {
        let t = call(c, "queue.tube.jobs:take", &[Value::from(0)]);
        let id = t[0].as_array().unwrap()[0].clone();
        call(c, "queue.tube.jobs:bury", &[id]);
    }
    let t = call(&mut b, "queue.tube.jobs:take", &[Value::from(0)]);
    let id = t[0].as_array().unwrap()[0].clone();
    call(&mut b, "queue.tube.jobs:bury", &[id]);
    nodes
}

fn web(nodes: &Nodes, i: usize) -> SocketAddr {
    let t = nodes.nodes[i].tarq.as_ref().unwrap();
    t.metrics.expect("the HTTP address is logged")
}

fn get(addr: SocketAddr, path: &str) -> Json {
    let (status, body) = http_get(addr, path);
    assert_eq!(status, 200, "GET {path}: {body}");
    serde_json::from_str(&body).unwrap_or_else(|e| panic!("GET {path}: {e}: {body}"))
}

/// Every task of `status` listed from the node at `addr`, `limit` a page, following the
/// cursor: (partition, id, data) in the order listed.
fn list_all(addr: SocketAddr, status: &str, limit: usize) -> Vec<(u64, u64, String)> {
    let mut out = Vec::new();
    let mut after = String::new();
    for _ in 0..100 {
        let page = get(
            addr,
            &format!("/api/tubes/jobs/tasks?status={status}&limit={limit}{after}"),
        );
        assert_eq!(page["unanswered"], Json::Array(vec![]), "{page}");
        let tasks = page["tasks"].as_array().unwrap();
        assert!(tasks.len() <= limit, "{page}");
        for t in tasks {
            let p = t["partition"].as_u64().unwrap_or_else(|| panic!("{t}"));
            let data = t["data"].as_str().unwrap().to_owned();
            out.push((p, t["id"].as_u64().unwrap(), data));
        }
        match page["next_after"].as_u64() {
            Some(n) => {
                assert_eq!(tasks.len(), limit, "a page with a next one is full: {page}");
                after = format!("&after={n}");
            }
            None => return out,
        }
    }
    panic!("more than 100 pages")
}

#[test]
fn either_node_lists_the_whole_tube_once_in_one_order_across_pages() {
    let etcd = Etcd::start();
    let nodes = cluster(&etcd);
    let (wa, wb) = (web(&nodes, 0), web(&nodes, 1));
    let ready = list_all(wa, "ready", 7);
    assert_eq!(ready.len(), 47, "{ready:?}");
    let data: HashSet<&str> = ready.iter().map(|(_, _, d)| d.as_str()).collect();
    assert_eq!(data.len(), 47, "each task once: {ready:?}");
    let ids: HashSet<u64> = ready.iter().map(|(_, id, _)| *id).collect();
    assert_eq!(ids.len(), 47, "each id once: {ready:?}");
    // Partition by partition, and tasks of both sets' partitions.
    let parts: Vec<u64> = ready.iter().map(|(p, _, _)| *p).collect();
    assert!(parts.windows(2).all(|w| w[0] <= w[1]), "{parts:?}");
    assert!(ready.iter().any(|(_, _, d)| d.starts_with('a')));
    assert!(ready.iter().any(|(_, _, d)| d.starts_with('b')));
    let distinct: HashSet<u64> = parts.iter().copied().collect();
    assert_eq!(distinct.len(), 4, "tasks in all four partitions: {parts:?}");
    // The same order from the other node, and in pages of another size.
    assert_eq!(list_all(wb, "ready", 7), ready);
    assert_eq!(list_all(wb, "ready", 1000), ready);
    assert_eq!(list_all(wa, "ready", 1), ready);
    // Buried: the three, from either node.
    let buried = list_all(wb, "buried", 2);
    assert_eq!(buried.len(), 3, "{buried:?}");
    assert_eq!(list_all(wa, "buried", 2), buried);
    // A task listed is found by its id from either node.
    for (_, id, d) in [&ready[0], &ready[46], &buried[0]] {
        for w in [wa, wb] {
            let t = get(w, &format!("/api/tubes/jobs/tasks/{id}"));
            assert_eq!(t["task"]["data"], Json::from(d.as_str()), "{t}");
        }
    }
}

#[test]
fn a_listing_with_a_set_gone_names_its_partitions_and_lists_the_others() {
    let etcd = Etcd::start();
    let mut nodes = cluster(&etcd);
    let wa = web(&nodes, 0);
    let whole = list_all(wa, "ready", 1000);
    nodes.kill(1);
    let started = Instant::now();
    let page = get(wa, "/api/tubes/jobs/tasks?limit=1000");
    assert!(
        started.elapsed() < Duration::from_secs(4),
        "answered within the listing's bounded wait: {:?}",
        started.elapsed()
    );
    let missing = page["unanswered"].as_array().unwrap();
    assert!(!missing.is_empty(), "{page}");
    let gone: HashSet<u64> = (missing.iter())
        .map(|m| {
            assert_eq!(m["set"], "b", "{m}");
            assert!(m["error"].as_str().is_some_and(|e| !e.is_empty()), "{m}");
            m["partition"].as_u64().unwrap()
        })
        .collect();
    let listed: Vec<(u64, u64, String)> = (page["tasks"].as_array().unwrap().iter())
        .map(|t| {
            let p = t["partition"].as_u64().unwrap();
            (
                p,
                t["id"].as_u64().unwrap(),
                t["data"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    let want: Vec<(u64, u64, String)> = whole
        .into_iter()
        .filter(|(p, _, _)| !gone.contains(p))
        .collect();
    assert!(!want.is_empty());
    assert_eq!(listed, want, "set a's partitions listed as before");
}
