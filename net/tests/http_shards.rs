//! The HTTP API's task listing on a sharded cluster (issue 39): two replica sets of one real
//! `tarq` node each on one real etcd, a tube of four partitions, tasks in all of them.
//! - `GET /api/tubes/jobs/tasks` from either node lists the whole tube: paged with its
//!   `next_after` cursor, every task comes once, each with its partition, partition by
//!   partition, in the same order from both nodes, for each status; a request that asks to
//!   close gets its answer from the other set's owner first;
//! - with one set's node gone, a listing is still answered promptly: the other set's tasks,
//!   and the gone set's partitions named in `unanswered`; the link to it is `failing`;
//! - `GET /api/cluster` on one node shows its link to the other set (up, nothing in flight)
//!   and the move the other set's primary runs, in progress with its step and tasks sent, then
//!   its record (committed, tasks moved) — a node that takes no part in the move shows it,
//!   and the tube's per-second puts, on either node, count no put twice for it;
//! - the console's per-second figures are the whole cluster's: with puts through one node
//!   only, into a tube of one partition and a utube spread over both sets, the node that
//!   owns none of the one partition's tube shows its put rate, and both nodes' histories
//!   add up to about the puts made (node-local figures would be 0 and a quarter);
//! - a tube's kick of another tube's task (by its whole id) finds none through either node.
//!
//! Every wait has a deadline.

#[path = "support/cluster.rs"]
mod cluster;
mod support;

use std::collections::HashSet;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use cluster::{wait_for, Etcd, Nodes};
use rmpv::Value;
use serde_json::Value as Json;
use support::http_get;
use tarq_client::{pack_args, Client};

fn call(c: &mut Client, f: &str, args: &[Value]) -> Vec<Value> {
    c.call(f, &pack_args(args), None)
        .unwrap_or_else(|e| panic!("{f}: {e}"))
}

/// Two sets of one node each with `extra` flags, both led and known to each other, with a
/// tube `jobs` of four partitions: `puts.0` tasks put through a, `puts.1` through b (each node
/// puts into the partitions it leads), 3 of them buried.
fn cluster(etcd: &Etcd, extra: &[&str], puts: (usize, usize)) -> Nodes {
    let mut flags = vec!["--http-listen", "127.0.0.1:0"];
    flags.extend_from_slice(extra);
    let nodes = Nodes::start_sets(etcd, &[("a", 1), ("b", 1)], &flags);
    nodes.wait_leader_among(&[0]);
    nodes.wait_leader_among(&[1]);
    nodes.wait_primaries_known(&[0, 1], 2);
    let connect = |i: usize| {
        let addr = nodes.nodes[i].addr;
        let mut c = Client::connect_addr(addr, Duration::from_secs(10)).expect("connect");
        // Started with `--user` and `--password`: as that user.
        let flag = |name: &str| (extra.iter().position(|&f| f == name)).map(|at| extra[at + 1]);
        if let (Some(user), Some(password)) = (flag("--user"), flag("--password")) {
            c.auth(user, password).expect("auth");
        }
        c
    };
    let (mut a, mut b) = (connect(0), connect(1));
    let opts = Value::Map(vec![(Value::from("partitions"), Value::from(4))]);
    call(
        &mut a,
        "queue.create_tube",
        &[Value::from("jobs"), Value::from("fifottl"), opts],
    );
    for (c, n, who) in [(&mut a, puts.0, "a"), (&mut b, puts.1, "b")] {
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
    let nodes = cluster(&etcd, &[], (30, 20));
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
    // A client that asks to close after the answer gets it (the answer comes later).
    let req =
        "GET /api/tubes/jobs/tasks?limit=1000 HTTP/1.1\r\nHost: tarq\r\nConnection: close\r\n\r\n";
    let (status, body) = support::http_raw(wa, req.as_bytes());
    assert_eq!(status, 200, "{body}");
    let page: Json = serde_json::from_str(&body).unwrap();
    assert_eq!(page["tasks"].as_array().unwrap().len(), 47, "{page}");
    // Buried: the three, from either node.
    let buried = list_all(wb, "buried", 2);
    assert_eq!(buried.len(), 3, "{buried:?}");
    assert_eq!(list_all(wa, "buried", 2), buried);
    // A task listed is found by its id from either node.
    for (_, id, d) in [&ready[0], &ready[46], &buried[0]] {
        for w in [wa, wb] {
            let t = get(w, &format!("/api/tubes/jobs/tasks/{id}"));
            assert_eq!(t["task"]["data"], Json::from(d.as_str()), "{t}");
            // Also when the request asks to close after its answer.
            let req = format!(
                "GET /api/tubes/jobs/tasks/{id} HTTP/1.1\r\nHost: tarq\r\nConnection: close\r\n\r\n"
            );
            let (status, body) = support::http_raw(w, req.as_bytes());
            assert_eq!(status, 200, "{body}");
            assert!(body.contains(&format!("\"{d}\"")), "{body}");
        }
    }
}

#[test]
fn a_listing_with_a_set_gone_names_its_partitions_and_lists_the_others() {
    let etcd = Etcd::start();
    let mut nodes = cluster(&etcd, &[], (30, 20));
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
    // The cluster page says the link to b fails, and counts its drops.
    let link = get(wa, "/api/cluster")["links"][0].clone();
    assert_eq!(link["set"], "b", "{link}");
    assert_eq!(link["state"], "failing", "{link}");
    assert!(link["drops"].as_u64() >= Some(1), "{link}");
    assert!(link["failing_drops"].as_u64() >= Some(1), "{link}");
}

/// `GET /api/cluster` of the node at `addr`.
fn overview(addr: SocketAddr) -> Json {
    get(addr, "/api/cluster")
}

#[test]
fn the_cluster_api_shows_the_links_and_a_move_another_set_runs() {
    let etcd = Etcd::start();
    // Moves copy 10 tasks a second: a partition of 50 takes seconds to move.
    let nodes = cluster(&etcd, &["--move-rate", "10"], (100, 4));
    let (wa, wb) = (web(&nodes, 0), web(&nodes, 1));
    // A listing from b asks a's partitions over b's link to a.
    list_all(wb, "ready", 1000);
    let link = &overview(wb)["links"][0];
    assert_eq!(link["set"], "a", "{link}");
    assert_eq!(link["state"], "up", "{link}");
    assert_eq!(link["in_flight"], 0, "{link}");
    assert_eq!(link["drops"], 0, "{link}");
    assert_eq!(link["primary"], nodes.nodes[0].addr.to_string(), "{link}");
    // A partition of set a's, moved to b by a's primary.
    let placed = overview(wa);
    let part = (placed["placement"]["tubes"].as_array().unwrap().iter())
        .find(|t| t["name"] == "jobs")
        .and_then(|t| (t["partitions"].as_array().unwrap().iter()).find(|p| p["set"] == "a"))
        .map(|p| p["partition"].as_u64().unwrap())
        .expect("a partition of set a");
    let mover = nodes.nodes[0].addr;
    let moving = std::thread::spawn(move || {
        let mut c = Client::connect_addr(mover, Duration::from_secs(10)).expect("connect");
        let args = pack_args(&[Value::from("jobs"), Value::from(part), Value::from("b")]);
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            match c.call("tarq.move", &args, Some(Duration::from_secs(60))) {
                Ok(r) => return r[0].as_str().unwrap_or_default().to_owned(),
                // A view of the placement too old to act on yet: asked again.
                Err(tarq_client::ClientError::Server { code: 32, message })
                    if (message.contains("stale") || message.contains("has just moved"))
                        && Instant::now() < deadline =>
                {
                    std::thread::sleep(Duration::from_millis(50));
                }
                Err(e) => panic!("tarq.move: {e}"),
            }
        }
    });
    // Node b, which only receives it, shows it in flight as a's primary runs it.
    let mut seen = Json::Null;
    wait_for("the move in flight on b's cluster page", || {
        seen = overview(wb)["moves_in_cluster"]["in_progress"][0].clone();
        !seen.is_null()
    });
    assert_eq!(seen["tube"], "jobs", "{seen}");
    assert_eq!(seen["partition"], part, "{seen}");
    assert_eq!(seen["from"], "a", "{seen}");
    assert_eq!(seen["to"], "b", "{seen}");
    assert!(
        seen["phase"].is_string() && seen["tasks_here"].as_u64() > Some(0),
        "{seen}"
    );
    let report = moving.join().expect("the move");
    // Then its record: committed by set a, with its tasks.
    let mut a = Json::Null;
    wait_for("the move's record on b's cluster page", || {
        let sets = overview(wb)["moves_in_cluster"]["sets"].clone();
        a = (sets.as_array().unwrap().iter())
            .find(|s| s["set"] == "a")
            .cloned()
            .unwrap_or_default();
        a["committed"] == 1
    });
    assert!(a["in_progress"].is_null(), "{a}");
    assert!(a["tasks_moved"].as_u64() > Some(0), "{a} ({report})");
    assert!(a["error"].is_null(), "{a}");
    // The partition's counts travelled with it: no second of the history counts its puts
    // again (104 were made, some before the history began).
    for w in [wa, wb] {
        let end = tube_history(w, "jobs")["end"].as_u64().unwrap();
        wait_for("two samples after the move", || {
            tube_history(w, "jobs")["end"].as_u64() > Some(end + 1)
        });
        let (puts, _) = known_puts(&tube_history(w, "jobs"));
        assert!(puts <= 104, "{puts} puts counted");
    }
}

/// `GET /api/tubes/NAME/history` of the node at `addr`.
fn tube_history(addr: SocketAddr, name: &str) -> Json {
    get(addr, &format!("/api/tubes/{name}/history"))
}

/// The sum of a tube history's known per-second puts, and its seconds not known.
fn known_puts(h: &Json) -> (u64, usize) {
    let puts = h["tube"][0].as_array().unwrap_or_else(|| panic!("{h}"));
    let sum = puts.iter().filter_map(Json::as_u64).sum();
    (sum, puts.iter().filter(|v| v.is_null()).count())
}

/// `n` puts into `solo` and `n` into `keyed` (each with one of 16 utube keys), through the
/// node at `addr`, 40 of each a second.
fn traffic(addr: SocketAddr, n: usize) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        let mut c = Client::connect_addr(addr, Duration::from_secs(10)).expect("connect");
        let start = Instant::now();
        for k in 0..n {
            // Paced, so the figures are a rate: step k is due at k / 40 s.
            let due = start + Duration::from_millis(25 * k as u64);
            std::thread::sleep(due.saturating_duration_since(Instant::now()));
            call(&mut c, "queue.tube.solo:put", &[Value::from(k)]);
            let key = Value::Map(vec![(Value::from("utube"), Value::from(k % 16))]);
            call(&mut c, "queue.tube.keyed:put", &[Value::from(k), key]);
        }
    })
}

#[test]
fn the_per_second_figures_are_the_whole_clusters_from_either_node() {
    let etcd = Etcd::start();
    let nodes = cluster(&etcd, &[], (1, 2));
    let web = [web(&nodes, 0), web(&nodes, 1)];
    let mut a = Client::connect_addr(nodes.nodes[0].addr, Duration::from_secs(10)).unwrap();
    for (name, kind, parts) in [("solo", "fifottl", 1), ("keyed", "utube", 4)] {
        let opts = Value::Map(vec![(Value::from("partitions"), Value::from(parts))]);
        let args = [Value::from(name), Value::from(kind), opts];
        call(&mut a, "queue.create_tube", &args);
    }
    // The node of the set that does not own solo's one partition reads.
    let owner = get(web[0], "/api/tubes/solo")["partitions"][0]["set"].clone();
    let reader = web[usize::from(owner == "a")];
    for (w, name) in [(reader, "solo"), (reader, "keyed"), (web[0], "solo")] {
        wait_for("the tube in the cluster's history", || {
            let h = tube_history(w, name);
            h["scope"] == "cluster" && h["tube"][0].as_array().is_some_and(|p| p.len() >= 2)
        });
    }
    const N: usize = 200;
    let puts = traffic(nodes.nodes[0].addr, N);
    let mut rate = Json::Null;
    wait_for("solo's put rate on the node that owns none of it", || {
        rate = get(reader, "/api/tubes/solo")["rates"]["put"].clone();
        rate.as_u64() > Some(0)
    });
    assert!(rate.as_u64() <= Some(N as u64), "{rate}");
    puts.join().expect("the puts");
    // Once a second after the last put is in the history, it adds up to the puts made.
    for (w, name) in [(reader, "solo"), (reader, "keyed"), (web[0], "solo")] {
        let mut h = Json::Null;
        wait_for("a quiet second after the puts", || {
            h = tube_history(w, name);
            let done = get(w, &format!("/api/tubes/{name}"))["calls"]["put"] == N;
            done && h["tube"][0].as_array().and_then(|p| p.last()) == Some(&Json::from(0))
        });
        let (sum, gaps) = known_puts(&h);
        // Every second's sum is a difference of the owners' counters: none counted twice,
        // and few lost in seconds an owner was late.
        assert!(
            sum <= N as u64 && sum >= (N * 3 / 4) as u64,
            "{name}: {sum} ({gaps} gaps): {h}"
        );
        assert!(h["start"].as_u64() <= h["end"].as_u64(), "{h}");
    }
    let overall = get(reader, "/api/history");
    assert_eq!(overall["scope"], "cluster", "{overall}");
    let all: u64 = (overall["overall"][0].as_array().unwrap().iter())
        .filter_map(Json::as_u64)
        .sum();
    assert!(
        all >= (N * 3 / 2) as u64 && all <= 2 * N as u64 + 3,
        "{all}: {overall}"
    );
}

/// `method path` on the HTTP port at `w`, as user `ops` (password `s3cret`), with no body.
fn as_ops(w: SocketAddr, method: &str, path: &str) -> (u16, String) {
    let req = format!(
        "{method} {path} HTTP/1.1\r\nHost: {w}\r\nAuthorization: Basic b3BzOnMzY3JldA==\r\n\
         Content-Length: 0\r\n\r\n"
    );
    support::http_raw(w, req.as_bytes())
}

/// A tube's kick acts on its own tasks only, on a sharded cluster too (kick-job itself takes
/// a task of any tube): `POST /api/tubes/mine/tasks/ID/kick` with the whole id of a buried
/// task of `jobs`, held by either set, is not found through either node, and the task stays
/// buried.
#[test]
fn a_tubes_kick_of_another_tubes_task_on_another_set_finds_none() {
    let etcd = Etcd::start();
    let nodes = cluster(&etcd, &["--user", "ops", "--password", "s3cret"], (2, 2));
    let mut a = Client::connect_addr(nodes.nodes[0].addr, Duration::from_secs(10)).unwrap();
    a.auth("ops", "s3cret").unwrap();
    call(
        &mut a,
        "queue.create_tube",
        &[Value::from("mine"), Value::from("fifo")],
    );
    let webs = [web(&nodes, 0), web(&nodes, 1)];
    for &w in &webs {
        wait_for("every node to know the tube", || {
            as_ops(w, "GET", "/api/tubes/mine").0 == 200
        });
    }
    // The buried tasks' whole ids: the indexes (from 1) and numbers each is found by.
    let buried: Vec<u64> = (1..16u64)
        .flat_map(|ix| (0..4u64).map(move |n| (ix << 41) | n))
        .filter(|id| {
            let (status, body) = as_ops(webs[0], "GET", &format!("/api/tubes/jobs/tasks/{id}"));
            status == 200 && body.contains("\"buried\"")
        })
        .collect();
    assert_eq!(buried.len(), 3, "{buried:?}");
    for &w in &webs {
        for &id in &buried {
            let (status, body) = as_ops(w, "POST", &format!("/api/tubes/mine/tasks/{id}/kick"));
            eprintln!("KICK {w} {id}: {status} {body}");
            assert_eq!(status, 404, "kick of jobs' task {id} through {w}: {body}");
            assert!(body.contains(&format!("Task {id} not found")), "{body}");
        }
    }
    let (_, jobs) = as_ops(webs[1], "GET", "/api/tubes/jobs");
    let jobs: Json = serde_json::from_str(&jobs).unwrap();
    assert_eq!(
        jobs["tasks"]["buried"], 3,
        "every task still buried: {jobs}"
    );
}
