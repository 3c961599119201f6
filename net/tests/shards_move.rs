//! Moving a partition between replica sets with its tasks (`tarq.move`, `tarq ctl move`), end
//! to end: real `tarq` nodes, one real etcd on loopback.
//! - a partition holding tasks in every status moves: the counts are the same after, tasks
//!   taken before the move are acked after it through the node their taker used, the rest
//!   is delivered once, and a taker that disconnects after the move gets its tasks released
//!   on the new owner;
//!
//! Every wait has a deadline.

#[path = "support/cluster.rs"]
mod cluster;
mod support;

use std::collections::HashSet;
use std::net::SocketAddr;
use std::time::Duration;

use cluster::{field, str_field, wait_for, Etcd, Nodes};
use rmpv::Value;
use tarq_client::{pack_args, Client};

fn connect(addr: SocketAddr) -> Client {
    Client::connect_addr(addr, Duration::from_secs(10)).expect("connect")
}

fn get<'a>(v: &'a Value, key: &str) -> &'a Value {
    field(v, key).unwrap_or(&Value::Nil)
}

fn call(c: &mut Client, f: &str, args: &[Value]) -> Vec<Value> {
    c.call(f, &pack_args(args), None)
        .unwrap_or_else(|e| panic!("{f}: {e}"))
}

/// The id of the task a tube call answered, if it answered one.
fn task_id(values: &[Value]) -> Option<u64> {
    values.first()?.as_array()?.first()?.as_u64()
}

fn statistics(addr: SocketAddr, tube: &str) -> Value {
    let mut c = connect(addr);
    call(&mut c, "queue.statistics", &[Value::from(tube)])
        .into_iter()
        .next()
        .unwrap()
}

fn count(stats: &Value, status: &str) -> u64 {
    get(get(stats, "tasks"), status).as_u64().unwrap()
}

/// The owning set of each partition of `tube`, as node `addr` sees the placement, once it
/// sees the tube there (a `create_tube` answers once etcd has the tube; the node that asked
/// may apply the placement that has it a moment later).
fn owners(addr: SocketAddr, tube: &str) -> Vec<String> {
    let mut found = None;
    wait_for(&format!("node {addr} to see tube {tube} placed"), || {
        found = placed_owners(addr, tube);
        found.is_some()
    });
    found.expect("waited for")
}

fn placed_owners(addr: SocketAddr, tube: &str) -> Option<Vec<String>> {
    let mut c = connect(addr);
    let o = call(&mut c, "queue.cluster", &[])
        .into_iter()
        .next()
        .unwrap();
    let tubes = get(get(&o, "placement"), "tubes")
        .as_array()
        .unwrap()
        .clone();
    let t = tubes.iter().find(|t| str_field(t, "name") == tube)?;
    let sets = get(t, "partitions")
        .as_array()
        .unwrap()
        .iter()
        .map(|p| str_field(p, "set"))
        .collect();
    Some(sets)
}

/// `tarq.move` on `addr`: the report it answers.
/// A refusal with code 32 that did nothing (a view of the placement not trusted this
/// moment, a partition that has just moved here) is asked again, as `tarq ctl move` does.
fn move_partition(addr: SocketAddr, tube: &str, partition: u64, to: &str) -> serde_json::Value {
    let mut c = connect(addr);
    let args = pack_args(&[Value::from(tube), Value::from(partition), Value::from(to)]);
    let mut text = String::new();
    wait_for("the move to be taken", || {
        match c.call("tarq.move", &args, None) {
            Ok(r) => {
                text = r[0].as_str().expect("a report").to_owned();
                true
            }
            Err(tarq_client::ClientError::Server { code: 32, message })
                if message.contains("stale") || message.contains("has just moved") =>
            {
                false
            }
            Err(e) => panic!("tarq.move: {e}"),
        }
    });
    serde_json::from_str(&text).unwrap()
}

#[test]
fn a_partition_moves_with_its_tasks_in_every_status() {
    let etcd = Etcd::start();
    let nodes = Nodes::start_sets(&etcd, &[("a", 1), ("b", 1)], &[]);
    let (a, b) = (nodes.nodes[0].addr, nodes.nodes[1].addr);
    nodes.wait_leader_among(&[0]);
    nodes.wait_leader_among(&[1]);
    let mut admin = connect(a);
    let opts = Value::Map(vec![(Value::from("partitions"), Value::from(2))]);
    call(
        &mut admin,
        "queue.create_tube",
        &[Value::from("jobs"), Value::from("fifottl"), opts],
    );
    wait_for("node b to know the tube", || {
        connect(b)
            .call("queue.statistics", &pack_args(&[Value::from("jobs")]), None)
            .is_ok()
    });
    let placed = owners(a, "jobs");
    let p = placed
        .iter()
        .position(|s| s == "a")
        .expect("a partition on a") as u64;

    // Puts through a node of set a go to its own partition.
    let mut producer = connect(a);
    let mut ids = Vec::new();
    for n in 0..2000 {
        let r = call(
            &mut producer,
            "queue.tube.jobs:put",
            &[Value::from(format!("t{n}"))],
        );
        ids.push(task_id(&r).unwrap());
    }
    let delay = Value::Map(vec![(Value::from("delay"), Value::from(600))]);
    for n in 0..20 {
        let args = [Value::from(format!("d{n}")), delay.clone()];
        call(&mut producer, "queue.tube.jobs:put", &args);
    }
    // Buried, taken through the other set's node (forwarded), and taken here.
    for &id in &ids[1900..1930] {
        call(&mut producer, "queue.tube.jobs:bury", &[Value::from(id)]);
    }
    let take = |c: &mut Client, n: usize| -> Vec<u64> {
        (0..n)
            .map(|_| task_id(&call(c, "queue.tube.jobs:take", &[Value::from(0)])).unwrap())
            .collect()
    };
    let mut remote_taker = connect(b);
    let mut local_taker = connect(a);
    let mut leaving_taker = connect(a);
    let remote_held = take(&mut remote_taker, 100);
    let local_held = take(&mut local_taker, 50);
    let leaving_held = take(&mut leaving_taker, 10);
    let before = statistics(a, "jobs");
    assert_eq!(count(&before, "taken"), 160);
    assert_eq!(count(&before, "buried"), 30);
    assert_eq!(count(&before, "delayed"), 20);

    let report = move_partition(a, "jobs", p, "b");
    assert_eq!(report["tasks"], 2020, "{report}");
    assert_eq!(report["to"], "b");
    wait_for("node a to read the new owner", || {
        owners(a, "jobs")[p as usize] == "b"
    });
    let after = statistics(a, "jobs");
    for status in ["ready", "taken", "buried", "delayed", "total"] {
        assert_eq!(
            count(&after, status),
            count(&before, status),
            "{status}: {after:?}"
        );
    }
    // The same from either node (the head's age aside: it grows between the two reads).
    let from_b = statistics(b, "jobs");
    for key in ["tasks", "calls", "consumers"] {
        assert_eq!(get(&after, key), get(&from_b, key), "{key}");
    }

    // The takers ack through the nodes they took through.
    for id in remote_held {
        let r = call(&mut remote_taker, "queue.tube.jobs:ack", &[Value::from(id)]);
        assert_eq!(task_id(&r), Some(id));
    }
    for id in local_held {
        let r = call(&mut local_taker, "queue.tube.jobs:ack", &[Value::from(id)]);
        assert_eq!(task_id(&r), Some(id));
    }
    // A taker gone after the move: its tasks go back to ready on the new owner.
    drop(leaving_taker);
    wait_for("the gone taker's tasks to be ready again", || {
        count(&statistics(b, "jobs"), "taken") == 0
    });
    // Every ready task once.
    let mut seen = HashSet::new();
    let mut consumer = connect(a);
    loop {
        let r = call(&mut consumer, "queue.tube.jobs:take", &[Value::from(0)]);
        let Some(id) = task_id(&r) else { break };
        assert!(seen.insert(id), "task {id} delivered twice");
        call(&mut consumer, "queue.tube.jobs:ack", &[Value::from(id)]);
    }
    assert_eq!(seen.len(), 2000 - 150 - 30);
    assert!(leaving_held.iter().all(|id| seen.contains(id)));
    let last = statistics(b, "jobs");
    assert_eq!(count(&last, "buried"), 30);
    assert_eq!(count(&last, "delayed"), 20);

    let mut c = connect(a);
    let o = call(&mut c, "queue.cluster", &[])
        .into_iter()
        .next()
        .unwrap();
    let moves = get(&o, "moves");
    assert_eq!(get(moves, "committed").as_u64(), Some(1), "{moves:?}");
    assert_eq!(get(moves, "tasks_moved").as_u64(), Some(2020));
    // `tarq ctl cluster` shows each set primary's moves.
    let out = nodes.nodes[1].tarq.as_ref().unwrap().ctl(&["cluster"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    let row = text
        .lines()
        .skip_while(|l| !l.starts_with("moves"))
        .find(|l| l.trim_start().starts_with("a "))
        .unwrap_or_else(|| panic!("no moves row for set a in:\n{text}"));
    let cols: Vec<&str> = row.split_whitespace().collect();
    assert_eq!(cols, ["a", "-", "1", "0", "2020", cols[5]], "{text}");
}

/// Calls `f` until it answers (a refusal while a view of the placement catches up is
/// retried), within 10 s; the answer, and how long the call waited in all.
fn call_until_answered(c: &mut Client, f: &str, args: &[u8]) -> (Vec<Value>, Duration) {
    let started = std::time::Instant::now();
    loop {
        match c.call(f, args, None) {
            Ok(r) => return (r, started.elapsed()),
            Err(e) if started.elapsed() < Duration::from_secs(10) => {
                eprintln!("{f} retried: {e}");
            }
            Err(e) => panic!("{f}: {e}"),
        }
    }
}

#[test]
fn a_partition_moves_under_four_producers_and_four_consumers_and_each_task_is_delivered_once() {
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    use std::sync::{Arc, Mutex};

    let etcd = Etcd::start();
    let nodes = Nodes::start_sets(&etcd, &[("a", 1), ("b", 1)], &[]);
    let addrs = [nodes.nodes[0].addr, nodes.nodes[1].addr];
    nodes.wait_leader_among(&[0]);
    nodes.wait_leader_among(&[1]);
    let mut admin = connect(addrs[0]);
    let opts = Value::Map(vec![(Value::from("partitions"), Value::from(2))]);
    call(
        &mut admin,
        "queue.create_tube",
        &[Value::from("jobs"), Value::from("fifottl"), opts],
    );
    wait_for("node b to know the tube", || {
        connect(addrs[1])
            .call("queue.statistics", &pack_args(&[Value::from("jobs")]), None)
            .is_ok()
    });
    let p = owners(addrs[0], "jobs")
        .iter()
        .position(|s| s == "a")
        .unwrap() as u64;

    let stop = Arc::new(AtomicBool::new(false));
    let draining = Arc::new(AtomicBool::new(false));
    let acked_puts = Arc::new(Mutex::new(HashSet::new()));
    let delivered = Arc::new(Mutex::new(HashSet::new()));
    let puts = Arc::new(AtomicU64::new(0));
    let worst = Arc::new(Mutex::new(Duration::ZERO));
    let mut threads = Vec::new();
    for t in 0..4 {
        let (stop, acked, puts, worst) = (
            Arc::clone(&stop),
            Arc::clone(&acked_puts),
            Arc::clone(&puts),
            Arc::clone(&worst),
        );
        let addr = addrs[t % 2];
        threads.push(std::thread::spawn(move || {
            let mut c = connect(addr);
            let mut n = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let payload = format!("p{t}-{n}");
                n += 1;
                let args = pack_args(&[Value::from(payload.as_str())]);
                let (r, waited) = call_until_answered(&mut c, "queue.tube.jobs:put", &args);
                assert!(task_id(&r).is_some(), "{r:?}");
                acked.lock().unwrap().insert(payload);
                puts.fetch_add(1, Ordering::Relaxed);
                let mut w = worst.lock().unwrap();
                *w = (*w).max(waited);
            }
        }));
    }
    for t in 0..4 {
        let (draining, delivered, acked, worst) = (
            Arc::clone(&draining),
            Arc::clone(&delivered),
            Arc::clone(&acked_puts),
            Arc::clone(&worst),
        );
        let addr = addrs[(t + 1) % 2];
        threads.push(std::thread::spawn(move || {
            let mut c = connect(addr);
            let addrs = addrs;
            let take = pack_args(&[Value::from(0.05)]);
            let mut drain_deadline = None;
            loop {
                if draining.load(Ordering::Relaxed) {
                    let deadline = *drain_deadline
                        .get_or_insert_with(|| std::time::Instant::now() + Duration::from_secs(30));
                    if std::time::Instant::now() > deadline {
                        let d = delivered.lock().unwrap();
                        let lost: Vec<String> = (acked.lock().unwrap().iter())
                            .filter(|p| !d.contains(*p))
                            .take(10)
                            .cloned()
                            .collect();
                        let stats: Vec<u64> = (addrs.iter())
                            .map(|&a| count(&statistics(a, "jobs"), "done"))
                            .collect();
                        let (na, nd) = (acked.lock().unwrap().len(), d.len());
                        panic!(
                            "acked puts never delivered, among them {lost:?}; {na} acked, \
                             {nd} delivered, done {stats:?}"
                        );
                    }
                }
                let (r, waited) = call_until_answered(&mut c, "queue.tube.jobs:take", &take);
                let Some(id) = task_id(&r) else {
                    // Empty: done once the producers stopped and everything acked came.
                    if draining.load(Ordering::Relaxed) {
                        let d = delivered.lock().unwrap();
                        if acked.lock().unwrap().iter().all(|p| d.contains(p)) {
                            return;
                        }
                    }
                    continue;
                };
                let data = r[0].as_array().unwrap()[2].as_str().unwrap().to_owned();
                assert!(
                    delivered.lock().unwrap().insert(data.clone()),
                    "{data} delivered twice"
                );
                let args = pack_args(&[Value::from(id)]);
                let (a, waited_ack) = call_until_answered(&mut c, "queue.tube.jobs:ack", &args);
                assert_eq!(task_id(&a), Some(id), "the ack of {data}");
                let mut w = worst.lock().unwrap();
                *w = (*w).max(waited).max(waited_ack);
            }
        }));
    }
    wait_for("some traffic before the move", || {
        puts.load(Ordering::Relaxed) > 3000
    });
    let report = move_partition(addrs[0], "jobs", p, "b");
    let at_move = puts.load(Ordering::Relaxed);
    eprintln!("moved: {report}");
    assert_eq!(report["to"], "b");
    wait_for("some traffic after the move", || {
        puts.load(Ordering::Relaxed) > at_move + 3000
    });
    stop.store(true, Ordering::Relaxed);
    draining.store(true, Ordering::Relaxed);
    for t in threads {
        t.join().expect("a client thread failed");
    }
    let acked = acked_puts.lock().unwrap();
    let delivered = delivered.lock().unwrap();
    assert!(
        acked.iter().all(|p| delivered.contains(p)),
        "an acked put was lost"
    );
    // Nothing delivered that nobody put.
    assert!(delivered.iter().all(|d| d.starts_with('p')));
    eprintln!(
        "{} puts acked, {} delivered, worst wait {:?}",
        acked.len(),
        delivered.len(),
        worst.lock().unwrap()
    );
    assert_eq!(owners(addrs[1], "jobs"), ["b", "b"]);
}

/// The bytes of a put of `data` under utube `key` into tube `big`, as a frame's body (after
/// its size prefix): what the server's frame limit counts.
fn put_frame_len(key: &str, data: &[u8]) -> usize {
    let opts = Value::Map(vec![(Value::from("utube"), Value::from(key))]);
    let args = pack_args(&[Value::Binary(data.to_vec()), opts]);
    let mut out = Vec::new();
    tarq_iproto::client::call(&mut out, 1, "queue.tube.big:put", &args);
    let f = tarq_iproto::split_frame(&out, usize::MAX).unwrap().unwrap();
    f.len
}

#[test]
fn big_tasks_move_and_a_put_of_the_largest_frame_is_forwarded() {
    let etcd = Etcd::start();
    let nodes = Nodes::start_sets(&etcd, &[("a", 1), ("b", 1)], &[]);
    let (a, b) = (nodes.nodes[0].addr, nodes.nodes[1].addr);
    nodes.wait_leader_among(&[0]);
    nodes.wait_leader_among(&[1]);
    let mut c = connect(a);
    let opts = Value::Map(vec![(Value::from("partitions"), Value::from(2))]);
    call(
        &mut c,
        "queue.create_tube",
        &[Value::from("big"), Value::from("utube"), opts],
    );
    wait_for("node b to know the tube", || {
        connect(b)
            .call("queue.statistics", &pack_args(&[Value::from("big")]), None)
            .is_ok()
    });
    // Both partitions on set b: every put through node a is forwarded over the link.
    for (p, owner) in owners(a, "big").into_iter().enumerate() {
        if owner != "b" {
            move_partition(a, "big", p as u64, "b");
        }
    }
    wait_for("node a to route both partitions to b", || {
        owners(a, "big").iter().all(|o| o == "b")
    });
    let put = |c: &mut Client, key: &str, data: Vec<u8>| {
        let opts = Value::Map(vec![(Value::from("utube"), Value::from(key))]);
        c.call(
            "queue.tube.big:put",
            &pack_args(&[Value::Binary(data), opts]),
            Some(Duration::from_secs(30)),
        )
    };
    // The largest put a client may send, to the byte: accepted at node a, forwarded, stored.
    let max = tarq_iproto::DEFAULT_MAX_FRAME_BYTES;
    let overhead = put_frame_len("k-max", &vec![0; max - 4096]) - (max - 4096);
    let largest = vec![b'M'; max - overhead];
    assert_eq!(put_frame_len("k-max", &largest), max);
    let r = put(&mut c, "k-max", largest.clone()).expect("the largest put, forwarded");
    assert!(task_id(&r).is_some(), "{r:?}");
    // One byte more is refused at node a (the connection is closed), and the link and the
    // other clients are not harmed.
    let too_big = put(&mut connect(a), "k-max", vec![b'M'; max - overhead + 1]);
    assert!(too_big.is_err(), "{too_big:?}");
    // Tasks of 10 MiB, on both partitions (keys hash apart), moved back to set a.
    let tens: Vec<(String, Vec<u8>)> = (0..4u8)
        .map(|k| (format!("k{k}"), vec![b'a' + k; 10 << 20]))
        .collect();
    for (key, data) in &tens {
        put(&mut c, key, data.clone()).expect("a 10 MiB put, forwarded");
    }
    for p in 0..2u64 {
        let report = move_partition(b, "big", p, "a");
        assert_eq!(report["to"], "a", "{report}");
    }
    wait_for("both nodes to route both partitions to a", || {
        [a, b]
            .iter()
            .all(|&n| owners(n, "big").iter().all(|o| o == "a"))
    });
    // Every task there once, whole, through either node.
    let mut want: Vec<Vec<u8>> = tens.into_iter().map(|(_, d)| d).collect();
    want.push(largest);
    let mut got = Vec::new();
    let mut t = connect(b);
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let r = t.call(
            "queue.tube.big:take",
            &pack_args(&[Value::from(0)]),
            Some(Duration::from_secs(30)),
        );
        let r = match r {
            Ok(r) => r,
            // A new owner that read the placement before it heard of the move's end waits
            // out the old owner's view first (`serves it in N ms`): asked again.
            Err(e) if e.to_string().contains("serves it in") => {
                assert!(std::time::Instant::now() < deadline, "{e}");
                continue;
            }
            Err(e) => panic!("take: {e}"),
        };
        let Some(id) = task_id(&r) else { break };
        let task = r[0].as_array().unwrap();
        let data = match &task[2] {
            Value::Binary(b) => b.clone(),
            Value::String(s) => s.as_bytes().to_vec(),
            other => panic!("a payload, got {other}"),
        };
        got.push(data);
        call(&mut t, "queue.tube.big:ack", &[Value::from(id)]);
    }
    want.sort();
    got.sort();
    assert_eq!(got.len(), want.len(), "tasks taken after the moves");
    assert!(got == want, "a payload changed on the way");
}
