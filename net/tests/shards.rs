//! Shards, end to end: two replica sets of two real `tarq` nodes each and one real etcd on
//! loopback, clients connected to any node with tarq's own IPROTO client.
//! - a tube of 4 partitions: 100k puts through a node of set a, takes and acks through a node
//!   of set b: each task delivered exactly once, and `queue.statistics` agrees from every node;
//! - a take waiting on the empty partitioned tube is woken by a put through a node of the
//!   other set (owners push wake-ups; nothing polls);
//! - a client that disconnects gets the tasks it took through a forwarding node released;
//! - `consumers.waiting` counts each waiting take once, whichever node it came through and
//!   however many partitions it watches, the same from every node (`queue.statistics`, the
//!   HTTP API, the primaries' /metrics summed), across a move of the tube's first partition
//!   and a failover.
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
use tarq_client::{pack_args, Client};

const TASKS: usize = 100_000;
/// Requests a load client keeps in flight.
const WINDOW: usize = 64;

fn connect(addr: SocketAddr) -> Client {
    Client::connect_addr(addr, Duration::from_secs(10)).expect("connect")
}

fn map(pairs: &[(&str, Value)]) -> Value {
    Value::Map(
        pairs
            .iter()
            .map(|(k, v)| (Value::from(*k), v.clone()))
            .collect(),
    )
}

fn get<'a>(v: &'a Value, key: &str) -> &'a Value {
    v.as_map()
        .and_then(|m| m.iter().find(|(k, _)| k.as_str() == Some(key)))
        .map(|(_, v)| v)
        .unwrap_or(&Value::Nil)
}

/// Two sets (a0 a1, b0 b1) with their leaders.
struct Cluster {
    _etcd: Etcd,
    nodes: Nodes,
    a: usize,
    b: usize,
}

fn start() -> Cluster {
    start_with(&[])
}

fn start_with(extra: &[&str]) -> Cluster {
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

impl Cluster {
    fn addr(&self, i: usize) -> SocketAddr {
        self.nodes.nodes[i].addr
    }

    /// Creates `name` through node `i` and waits until every node knows it.
    fn create(&self, i: usize, name: &str, kind: &str, partitions: u64) {
        let mut c = connect(self.addr(i));
        let opts = map(&[("partitions", Value::from(partitions))]);
        let args = pack_args(&[Value::from(name), Value::from(kind), opts]);
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

    fn statistics(&self, i: usize, tube: &str) -> Value {
        let mut c = connect(self.addr(i));
        let r = c
            .call("queue.statistics", &pack_args(&[Value::from(tube)]), None)
            .unwrap();
        r.into_iter().next().unwrap_or(Value::Nil)
    }
}

/// Calls `function` with each of `args`, `WINDOW` in flight at a time; the replies in the
/// order of the calls (a node answers a forwarded call when its owner has, so replies may
/// come in another order: IPROTO matches them by sync).
fn pipelined(
    c: &mut Client,
    function: &str,
    args: impl Iterator<Item = Vec<u8>>,
) -> Vec<Vec<Value>> {
    let mut out: Vec<Option<Vec<Value>>> = Vec::new();
    let mut in_flight = std::collections::HashMap::new();
    let mut args = args.peekable();
    while args.peek().is_some() || !in_flight.is_empty() {
        while in_flight.len() < WINDOW {
            let Some(a) = args.next() else { break };
            let sync = c
                .send_request(|o, s| tarq_iproto::client::call(o, s, function, &a))
                .unwrap();
            in_flight.insert(sync, out.len());
            out.push(None);
        }
        let reply = c.recv().unwrap().expect("the node closed the connection");
        let at = in_flight
            .remove(&reply.sync)
            .expect("a reply to a call in flight");
        out[at] = Some(reply.into_result().unwrap().values().unwrap());
    }
    out.into_iter().map(|r| r.expect("answered")).collect()
}

fn task_id(values: &[Value]) -> Option<u64> {
    values.first()?.as_array()?.first()?.as_u64()
}

fn task_data(values: &[Value]) -> Option<String> {
    Some(values.first()?.as_array()?.get(2)?.as_str()?.to_owned())
}

#[test]
fn a_partitioned_tube_delivers_each_task_once_through_any_node() {
    let cl = start();
    cl.create(cl.a, "jobs", "fifo", 4);
    // Made again with if_not_exists through the other set's primary, at once: the tube as it
    // is, whether or not that node has read the new placement yet.
    let mut b = connect(cl.addr(cl.b));
    let opts = map(&[
        ("partitions", Value::from(4)),
        ("if_not_exists", Value::from(true)),
    ]);
    let args = pack_args(&[Value::from("again"), Value::from("fifo"), opts.clone()]);
    let mut a = connect(cl.addr(cl.a));
    a.call("queue.create_tube", &args, None).unwrap();
    b.call("queue.create_tube", &args, None)
        .unwrap_or_else(|e| panic!("if_not_exists right after another node made it: {e}"));

    // Puts through a node of set a (a replica: every put is forwarded or led there).
    let producer = [0, 1].into_iter().find(|&i| i != cl.a).unwrap();
    let mut p = connect(cl.addr(producer));
    let puts = pipelined(
        &mut p,
        "queue.tube.jobs:put",
        (0..TASKS).map(|n| pack_args(&[Value::from(format!("t{n}"))])),
    );
    let ids: HashSet<u64> = puts.iter().map(|r| task_id(r).expect("a task")).collect();
    assert_eq!(ids.len(), TASKS, "every put got its own id");

    // Takes and acks through a node of set b (its replica too).
    let consumer = [2, 3].into_iter().find(|&i| i != cl.b).unwrap();
    let mut c = connect(cl.addr(consumer));
    let mut seen = HashSet::new();
    let started = Instant::now();
    while seen.len() < TASKS {
        assert!(
            started.elapsed() < Duration::from_secs(120),
            "took {} of {TASKS}",
            seen.len()
        );
        let takes = pipelined(
            &mut c,
            "queue.tube.jobs:take",
            (0..WINDOW).map(|_| pack_args(&[Value::from(0)])),
        );
        let mut acks = Vec::new();
        for t in &takes {
            let (Some(id), Some(data)) = (task_id(t), task_data(t)) else {
                continue;
            };
            assert!(seen.insert(data.clone()), "{data} delivered twice");
            acks.push(pack_args(&[Value::from(id)]));
        }
        for a in pipelined(&mut c, "queue.tube.jobs:ack", acks.into_iter()) {
            assert!(task_id(&a).is_some(), "ack answered a task: {a:?}");
        }
    }
    assert_eq!(seen.len(), TASKS);

    let stats: Vec<Value> = (0..4).map(|i| cl.statistics(i, "jobs")).collect();
    for (i, s) in stats.iter().enumerate() {
        assert_eq!(s, &stats[0], "node {i}'s statistics differ from node 0's");
    }
    let tasks = get(&stats[0], "tasks");
    assert_eq!(get(tasks, "done").as_u64(), Some(TASKS as u64), "{stats:?}");
    assert_eq!(get(tasks, "ready").as_u64(), Some(0));
    let calls = get(&stats[0], "calls");
    assert_eq!(get(calls, "put").as_u64(), Some(TASKS as u64));
    assert_eq!(get(calls, "ack").as_u64(), Some(TASKS as u64));

    // Every tube's statistics, from every node: the same sums.
    let all: Vec<Value> = (0..4)
        .map(|i| {
            let mut c = connect(cl.addr(i));
            let r = c.call("queue.statistics", &pack_args(&[]), None).unwrap();
            r.into_iter().next().unwrap()
        })
        .collect();
    for (i, s) in all.iter().enumerate() {
        assert_eq!(s, &all[0], "node {i}'s statistics() differ from node 0's");
    }
    assert_eq!(get(&all[0], "jobs"), &stats[0], "{:?}", all[0]);
}

#[test]
fn a_waiting_take_is_woken_by_a_put_on_another_set_and_a_closed_client_releases() {
    let cl = start();
    cl.create(cl.b, "wake", "fifottl", 4);

    // A take waits through a node of set a; a put goes through a node of set b.
    let mut waiter = connect(cl.addr(cl.a));
    let sync = waiter
        .send_request(|o, s| {
            tarq_iproto::client::call(o, s, "queue.tube.wake:take", &pack_args(&[Value::from(30)]))
        })
        .unwrap();
    // Nothing answers it while the tube is empty.
    assert!(
        waiter.recv_within(Duration::from_millis(300)).is_err(),
        "answered while empty"
    );
    let mut producer = connect(cl.addr(cl.b));
    let put_at = Instant::now();
    producer
        .call(
            "queue.tube.wake:put",
            &pack_args(&[Value::from("hello")]),
            None,
        )
        .unwrap();
    let reply = waiter
        .recv_within(Duration::from_secs(10))
        .unwrap()
        .unwrap();
    assert_eq!(reply.sync, sync);
    let values = reply.into_result().unwrap().values().unwrap();
    assert_eq!(task_data(&values).as_deref(), Some("hello"));
    assert!(
        put_at.elapsed() < Duration::from_secs(2),
        "woken {:?} after the put",
        put_at.elapsed()
    );

    // The waiter's connection closes holding the task: it goes back to ready, on its owner.
    drop(waiter);
    let mut other = connect(cl.addr(cl.b));
    let mut again = None;
    wait_for("the released task to be taken again", || {
        let r = other
            .call("queue.tube.wake:take", &pack_args(&[Value::from(0)]), None)
            .unwrap();
        again = task_data(&r);
        again.is_some()
    });
    assert_eq!(again.as_deref(), Some("hello"));
}

/// What node `i` says of the takes waiting on `tube`: `queue.statistics`'
/// `consumers.waiting`, and the HTTP API's.
fn waiting_on(cl: &Cluster, i: usize, tube: &str) -> (Option<u64>, Option<u64>) {
    // While a set fails over a whole-tube figure may be refused: not yet, then.
    let args = pack_args(&[Value::from(tube)]);
    let stats = (connect(cl.addr(i))
        .call("queue.statistics", &args, None)
        .ok())
    .and_then(|r| r.into_iter().next())
    .and_then(|s| get(get(&s, "consumers"), "waiting").as_u64());
    let (status, body) = support::http_get(web(cl, i), &format!("/api/tubes/{tube}"));
    let api: Option<serde_json::Value> = (status == 200)
        .then(|| serde_json::from_str(&body).ok())
        .flatten();
    (stats, api.and_then(|a| a["consumers"]["waiting"].as_u64()))
}

/// `tarq_tube_takers_waiting` of `tube` in node `i`'s /metrics, summed over its partitions.
fn waiting_metric(cl: &Cluster, i: usize, tube: &str) -> u64 {
    let (_, page) = support::http_get(web(cl, i), "/metrics");
    let label = format!("tube=\"{tube}\"");
    (page.lines())
        .filter(|l| l.starts_with("tarq_tube_takers_waiting{") && l.contains(&label))
        .map(|l| l.rsplit(' ').next().unwrap().parse::<u64>().unwrap())
        .sum()
}

fn web(cl: &Cluster, i: usize) -> SocketAddr {
    let t = cl.nodes.nodes[i].tarq.as_ref().unwrap();
    t.metrics.expect("the HTTP address is logged")
}

/// Waits until every running node says `n` takes wait on `tube`, through IPROTO and HTTP,
/// and the `primaries`' /metrics add up to `n`.
fn wait_waiting(cl: &Cluster, primaries: [usize; 2], tube: &str, n: u64, when: &str) {
    let deadline = Instant::now() + Duration::from_secs(20);
    for i in 0..cl.nodes.nodes.len() {
        if cl.nodes.nodes[i].tarq.is_none() {
            continue;
        }
        loop {
            let said = waiting_on(cl, i, tube);
            if said == (Some(n), Some(n)) {
                break;
            }
            if Instant::now() >= deadline {
                let all: Vec<_> = (0..cl.nodes.nodes.len())
                    .filter(|&j| cl.nodes.nodes[j].tarq.is_some())
                    .map(|j| {
                        let r = connect(cl.addr(j)).call("queue.stats", &pack_args(&[]), None);
                        let st = r
                            .ok()
                            .and_then(|r| r.into_iter().next())
                            .unwrap_or(Value::Nil);
                        let routed = get(&st, "routed_waiting").as_u64();
                        (j, waiting_on(cl, j, tube), routed)
                    })
                    .collect();
                panic!(
                    "node {i} counts {said:?} takes waiting {when} (statistics, API), not {n}; \
                     every node: {all:?}; primaries {primaries:?}"
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    loop {
        let metrics = (primaries.iter())
            .map(|&p| waiting_metric(cl, p, tube))
            .sum::<u64>();
        if metrics == n {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the primaries' /metrics count {metrics} takes waiting {when}, not {n}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Sends a take of `tube` (waiting up to a minute) on a connection of its own to node `i`.
fn waiting_take(cl: &Cluster, i: usize, tube: &str) -> Client {
    let mut c = connect(cl.addr(i));
    let function = format!("queue.tube.{tube}:take");
    c.send_request(|o, s| {
        tarq_iproto::client::call(o, s, &function, &pack_args(&[Value::from(60)]))
    })
    .unwrap();
    c
}

#[test]
fn waiting_takes_are_counted_once_from_every_node() {
    let mut cl = start_with(&["--http-listen", "127.0.0.1:0"]);
    cl.create(cl.a, "cw", "fifottl", 4);
    let primaries = [cl.a, cl.b];
    let replica_b = [2, 3].into_iter().find(|&i| i != cl.b).unwrap();
    // Three takes through set a's primary, two through set b's, one through b's replica:
    // each watches all four partitions, two of them led by the other set.
    let mut takes: Vec<Client> = Vec::new();
    for i in [cl.a, cl.a, cl.a, cl.b, cl.b, replica_b] {
        takes.push(waiting_take(&cl, i, "cw"));
    }
    wait_waiting(&cl, primaries, "cw", 6, "at first");

    // The replica's take goes with its connection.
    drop(takes.pop());
    wait_waiting(&cl, primaries, "cw", 5, "after a client left");

    // The tube's first partition, whose owner counts the whole tube, moves to the other set:
    // the count follows it.
    move_head(&cl, "cw");
    wait_waiting(&cl, primaries, "cw", 5, "after the first partition moved");

    // Two puts serve two takes.
    let mut producer = connect(cl.addr(replica_b));
    for data in ["x", "y"] {
        producer
            .call("queue.tube.cw:put", &pack_args(&[Value::from(data)]), None)
            .unwrap();
    }
    wait_waiting(&cl, primaries, "cw", 3, "after two were served");
    let mut served = 0;
    wait_for("two takes answered", || {
        for c in &mut takes {
            if let Ok(Some(r)) = c.recv_within(Duration::from_millis(5)) {
                let values = r.into_result().unwrap().values().unwrap();
                assert!(task_data(&values).is_some(), "{values:?}");
                served += 1;
            }
        }
        served >= 2
    });
    assert_eq!(served, 2, "takes answered for two puts");

    // Set a's primary dies with its clients: their takes end, and a task one of them held goes
    // back to ready and may serve a take waiting through set b. Three more takes through set
    // b's nodes: at least one waits (two tasks at most are ready). The figure, counted by
    // whoever owns the first partition now (a new primary of a is told again once b's link to
    // a reopens), is what the routers' own books say wait.
    cl.nodes.kill(cl.a);
    let new_a = cl.nodes.wait_leader_among(&[0, 1]);
    for i in [cl.b, cl.b, replica_b] {
        takes.push(waiting_take(&cl, i, "cw"));
    }
    let live: Vec<usize> = (0..4).filter(|&i| i != cl.a).collect();
    let routed = |i: usize| {
        let r = connect(cl.addr(i)).call("queue.stats", &pack_args(&[]), None);
        let st = r
            .ok()
            .and_then(|r| r.into_iter().next())
            .unwrap_or(Value::Nil);
        get(&st, "routed_waiting").as_u64().unwrap_or(0)
    };
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let truth: u64 = live.iter().map(|&i| routed(i)).sum();
        let said: Vec<_> = live.iter().map(|&i| waiting_on(&cl, i, "cw")).collect();
        let metrics: u64 = [new_a, cl.b]
            .iter()
            .map(|&p| waiting_metric(&cl, p, "cw"))
            .sum();
        let agree = said.iter().all(|&s| s == (Some(truth), Some(truth)));
        if truth > 0 && metrics == truth && agree {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "after set a failed over, the routers hold {truth} waiting takes; the nodes say \
             {said:?}, the primaries' /metrics {metrics}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Moves partition 0 of `tube` to the other set, through its owner's primary.
fn move_head(cl: &Cluster, tube: &str) {
    let args = |to: &str| pack_args(&[Value::from(tube), Value::from(0), Value::from(to)]);
    let (mut on_a, mut on_b) = (connect(cl.addr(cl.a)), connect(cl.addr(cl.b)));
    wait_for("the move to be taken", || {
        match on_a.call("tarq.move", &args("b"), None) {
            Ok(_) => return true,
            Err(tarq_client::ClientError::Server { code: 32, message })
                if message.contains("owned by replica set b") => {}
            // A view of the placement not yet fresh enough to move on.
            Err(tarq_client::ClientError::Server { code: 32, .. }) => return false,
            Err(e) => panic!("tarq.move: {e}"),
        }
        match on_b.call("tarq.move", &args("a"), None) {
            Ok(_) => true,
            Err(tarq_client::ClientError::Server { code: 32, .. }) => false,
            Err(e) => panic!("tarq.move: {e}"),
        }
    });
}

#[test]
fn utube_order_per_key_and_limfifottl_capacity_hold_across_partitions() {
    let cl = start();
    cl.create(cl.a, "u", "utube", 4);
    let producer = [0, 1].into_iter().find(|&i| i != cl.a).unwrap();
    let mut p = connect(cl.addr(producer));
    const KEYS: usize = 10;
    const PER_KEY: usize = 20;
    let puts = (0..KEYS * PER_KEY).map(|n| {
        let (key, seq) = (n % KEYS, n / KEYS);
        let opts = map(&[("utube", Value::from(format!("k{key}")))]);
        pack_args(&[Value::from(format!("k{key}:{seq}")), opts])
    });
    for r in pipelined(&mut p, "queue.tube.u:put", puts) {
        assert!(task_id(&r).is_some(), "{r:?}");
    }
    // Through a node of the other set: at most one task of a key taken at a time, and each
    // key's tasks in the order they were put.
    let mut c = connect(cl.addr(cl.b));
    let mut next = [0usize; KEYS];
    let mut done = 0;
    while done < KEYS * PER_KEY {
        let mut held = Vec::new();
        loop {
            let r = c
                .call("queue.tube.u:take", &pack_args(&[Value::from(0)]), None)
                .unwrap();
            let (Some(id), Some(data)) = (task_id(&r), task_data(&r)) else {
                break;
            };
            let (key, seq) = data.split_once(':').unwrap();
            let key: usize = key[1..].parse().unwrap();
            let seq: usize = seq.parse().unwrap();
            assert!(
                held.iter().all(|&(k, _)| k != key),
                "two tasks of key {key} taken at once"
            );
            assert_eq!(seq, next[key], "key {key} out of order");
            next[key] += 1;
            held.push((key, id));
        }
        assert!(
            !held.is_empty(),
            "nothing to take with {done} of {} done",
            KEYS * PER_KEY
        );
        for (_, id) in held {
            c.call("queue.tube.u:ack", &pack_args(&[Value::from(id)]), None)
                .unwrap();
            done += 1;
        }
    }

    // A limfifottl tube of capacity 8 over 4 partitions holds 8 tasks, whichever node puts.
    let mut c = connect(cl.addr(cl.b));
    let opts = map(&[("partitions", Value::from(4)), ("capacity", Value::from(8))]);
    let args = pack_args(&[Value::from("lim"), Value::from("limfifottl"), opts]);
    c.call("queue.create_tube", &args, None).unwrap();
    let mut accepted = 0;
    for n in 0..12 {
        let node = if n % 2 == 0 { cl.a } else { cl.b };
        let mut c = connect(cl.addr(node));
        wait_for("the tube lim on every node", || {
            c.call("queue.statistics", &pack_args(&[Value::from("lim")]), None)
                .is_ok()
        });
        let r = c
            .call("queue.tube.lim:put", &pack_args(&[Value::from(n)]), None)
            .unwrap();
        if task_id(&r).is_some() {
            accepted += 1;
        }
    }
    assert_eq!(accepted, 8, "the whole tube's capacity");
    let stats = cl.statistics(cl.a, "lim");
    assert_eq!(get(get(&stats, "tasks"), "total").as_u64(), Some(8));
    // Fewer than one a partition is refused, naming why.
    let opts = map(&[("partitions", Value::from(4)), ("capacity", Value::from(3))]);
    let args = pack_args(&[Value::from("tiny"), Value::from("limfifottl"), opts]);
    let e = c.call("queue.create_tube", &args, None).unwrap_err();
    assert!(e.to_string().contains("shared by its partitions"), "{e}");
}

#[test]
fn bury_kick_and_truncate_act_on_the_whole_tube_from_any_node() {
    let cl = start();
    cl.create(cl.a, "whole", "fifottl", 4);
    let mut a = connect(cl.addr(cl.a));
    let mut b = connect(cl.addr(cl.b));
    for n in 0..8 {
        let r = a
            .call("queue.tube.whole:put", &pack_args(&[Value::from(n)]), None)
            .unwrap();
        assert!(task_id(&r).is_some());
    }
    // Taken and buried through the other set's primary: each id finds its partition.
    for _ in 0..8 {
        let r = b
            .call("queue.tube.whole:take", &pack_args(&[Value::from(0)]), None)
            .unwrap();
        let id = task_id(&r).expect("a task");
        let r = b
            .call(
                "queue.tube.whole:bury",
                &pack_args(&[Value::from(id)]),
                None,
            )
            .unwrap();
        assert_eq!(r[0].as_array().unwrap()[1].as_str(), Some("!"), "{r:?}");
    }
    let tasks = |i: usize| get(&cl.statistics(i, "whole"), "tasks").clone();
    for i in 0..4 {
        assert_eq!(get(&tasks(i), "buried").as_u64(), Some(8), "node {i}");
    }
    // Kick through set a: every partition's buried tasks, counted once.
    let r = a
        .call(
            "queue.tube.whole:kick",
            &pack_args(&[Value::from(100)]),
            None,
        )
        .unwrap();
    assert_eq!(r[0].as_u64(), Some(8), "{r:?}");
    assert_eq!(get(&tasks(cl.b), "ready").as_u64(), Some(8));
    // Truncate through a replica of set b: the whole tube is empty, seen from every node.
    let replica_b = [2, 3].into_iter().find(|&i| i != cl.b).unwrap();
    let mut rb = connect(cl.addr(replica_b));
    rb.call("queue.tube.whole:truncate", &pack_args(&[]), None)
        .unwrap();
    for i in 0..4 {
        assert_eq!(get(&tasks(i), "total").as_u64(), Some(0), "node {i}");
    }
}

#[test]
fn a_link_that_sends_garbage_gets_errors_naming_it_and_nothing_else_changes() {
    let cl = start();
    let mut c = connect(cl.addr(cl.a));
    // A link names the node it comes from.
    let e = c.call("tarq.link", &pack_args(&[]), None).unwrap_err();
    assert!(e.to_string().contains("the calling node's name"), "{e}");
    // A node of the cluster, proving its link key over this connection's salt.
    let mut e = tarq_cluster::etcd::Client::new(vec![cl._etcd.url.clone()]);
    let key = tarq_cluster::link_key::read(&mut e, "c", Duration::from_secs(5))
        .unwrap()
        .expect("the nodes made the cluster's link key");
    let salt = c.greeting().salt.clone();
    let hello = tarq_net::frontend::link::wire::handshake_args(&key, &salt, "c", "x9");
    c.call("tarq.link", &hello, None)
        .expect("a sharded node takes a member's link");
    // Not an ask at all, then an ask that does not decode: each refused, naming why.
    let not_bin = pack_args(&[Value::from(7)]);
    let e = c.call("tarq.ask", &not_bin, None).unwrap_err().to_string();
    assert!(e.contains("not [bin]"), "{e}");
    let garbage = pack_args(&[Value::Binary(vec![0xc1, 0xff, 0x00])]);
    let e = c.call("tarq.ask", &garbage, None).unwrap_err().to_string();
    assert!(e.contains("does not decode"), "{e}");
    let e = c
        .call("queue.put", &pack_args(&[Value::from(1)]), None)
        .unwrap_err()
        .to_string();
    assert!(e.contains("a link carries only tarq.ask calls"), "{e}");
    // The node serves its other clients as before.
    cl.create(cl.a, "after", "fifo", 2);
    let mut other = connect(cl.addr(cl.b));
    let r = other
        .call(
            "queue.tube.after:put",
            &pack_args(&[Value::from("x")]),
            None,
        )
        .unwrap();
    assert!(task_id(&r).is_some());
}

#[test]
fn a_partitioned_tube_is_dropped_from_any_node_and_its_ids_are_never_given_again() {
    let cl = start();
    cl.create(cl.a, "gone", "fifottl", 4);
    let mut a = connect(cl.addr(cl.a));
    let mut b = connect(cl.addr(cl.b));
    let mut ids = HashSet::new();
    for n in 0..8 {
        let r = a
            .call("queue.tube.gone:put", &pack_args(&[Value::from(n)]), None)
            .unwrap();
        ids.insert(task_id(&r).unwrap());
    }
    // A task taken somewhere holds the whole tube: refused, the original's words.
    let r = b
        .call("queue.tube.gone:take", &pack_args(&[Value::from(0)]), None)
        .unwrap();
    let taken = task_id(&r).expect("a task");
    let e = b
        .call("queue.tube.gone:drop", &pack_args(&[]), None)
        .unwrap_err()
        .to_string();
    assert!(e.contains("There are taken tasks in the tube"), "{e}");
    b.call(
        "queue.tube.gone:ack",
        &pack_args(&[Value::from(taken)]),
        None,
    )
    .unwrap();
    // Dropped through set b's primary: gone from every node.
    b.call("queue.tube.gone:drop", &pack_args(&[]), None)
        .unwrap();
    for i in 0..4 {
        let mut c = connect(cl.addr(i));
        wait_for(&format!("node {i} to let the tube go"), || {
            c.call("queue.statistics", &pack_args(&[Value::from("gone")]), None)
                .is_err()
        });
    }
    // Made again at the same indexes: their numbers go on from where the dropped tube's
    // stopped. A task of a later partition is shown by its whole id, which is never given
    // twice; the first partition's numbers count from 0 in the new tube, as the original's do.
    cl.create(cl.a, "gone", "fifottl", 4);
    let mut whole = 0;
    for n in 0..8 {
        let r = a
            .call("queue.tube.gone:put", &pack_args(&[Value::from(n)]), None)
            .unwrap();
        let id = task_id(&r).unwrap();
        if id >= 1 << 41 {
            whole += 1;
            assert!(ids.insert(id), "id {id} given again after the drop");
        }
    }
    assert!(whole > 0, "puts reached a later partition");
}

#[test]
fn a_pause_through_the_console_holds_every_partitions_takes_on_every_node() {
    let etcd = Etcd::start();
    let auth = [
        "--user",
        "u",
        "--password",
        "p",
        "--http-listen",
        "127.0.0.1:0",
    ];
    let nodes = Nodes::start_sets(&etcd, &[("a", 1), ("b", 1)], &auth);
    let (a, b) = (nodes.wait_leader_among(&[0]), nodes.wait_leader_among(&[1]));
    let client = |i: usize| {
        let mut c = connect(nodes.nodes[i].addr);
        c.auth("u", "p").unwrap();
        c
    };
    let mut ca = client(a);
    let opts = map(&[("partitions", Value::from(4))]);
    let args = pack_args(&[Value::from("held"), Value::from("fifottl"), opts]);
    ca.call("queue.create_tube", &args, None).unwrap();
    let mut cb = client(b);
    wait_for("node b to know the tube", || {
        cb.call("queue.statistics", &pack_args(&[Value::from("held")]), None)
            .is_ok()
    });
    for n in 0..8 {
        ca.call("queue.tube.held:put", &pack_args(&[Value::from(n)]), None)
            .unwrap();
    }
    // Paused for 30 s through set b's console: no take of any node gets a task.
    let http = nodes.nodes[b]
        .tarq
        .as_ref()
        .unwrap()
        .metrics
        .expect("the HTTP port");
    let body = r#"{"seconds": 30}"#;
    let request = format!(
        "POST /api/tubes/held/pause HTTP/1.1\r\nHost: tarq\r\nAuthorization: Basic dTpw\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    let (status, answer) = support::http_raw(http, request.as_bytes());
    assert_eq!(status, 200, "{answer}");
    for c in [&mut ca, &mut cb] {
        let r = c
            .call("queue.tube.held:take", &pack_args(&[Value::from(0)]), None)
            .unwrap();
        assert!(task_id(&r).is_none(), "a take got {r:?} from a paused tube");
    }
    // Resumed (a pause of 0 s): every task can be taken again, through either node.
    let body = r#"{"seconds": 0}"#;
    let request = format!(
        "POST /api/tubes/held/pause HTTP/1.1\r\nHost: tarq\r\nAuthorization: Basic dTpw\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    assert_eq!(support::http_raw(http, request.as_bytes()).0, 200);
    let mut taken = 0;
    wait_for("the tasks after the pause", || {
        let c = if taken % 2 == 0 { &mut ca } else { &mut cb };
        let r = c
            .call("queue.tube.held:take", &pack_args(&[Value::from(0)]), None)
            .unwrap();
        taken += usize::from(task_id(&r).is_some());
        taken == 8
    });
}
