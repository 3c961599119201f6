//! Shards under failure, end to end, with real `tarq` processes and a real etcd:
//! - kill -9 one replica set's primary under load with `--sync-replicas 1`: the other set keeps
//!   serving its partitions throughout, the killed set elects a new primary within 5 s, and
//!   every acknowledged put is delivered afterwards;
//! - a primary stopped (SIGSTOP) across a placement change that moves its partition away never
//!   acknowledges a change into the partition it no longer owns: resumed, it refuses (its view
//!   of the placement is stale) or forwards to the new owner.
//!
//! Every wait has a deadline.

#[path = "support/cluster.rs"]
mod cluster;
mod support;

use std::collections::HashSet;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use cluster::{wait_for, Etcd, Nodes};
use rmpv::Value;
use tarq_client::{pack_args, Client};

/// The longest a set's failover may take, kill to its new primary.
const FAILOVER_LIMIT: Duration = Duration::from_secs(5);

fn connect(addr: SocketAddr) -> Option<Client> {
    Client::connect_addr(addr, Duration::from_secs(3)).ok()
}

fn create(addr: SocketAddr, name: &str, partitions: u64) {
    let mut c = connect(addr).expect("connect");
    let opts = Value::Map(vec![(Value::from("partitions"), Value::from(partitions))]);
    let args = pack_args(&[Value::from(name), Value::from("fifo"), opts]);
    c.call("queue.create_tube", &args, None)
        .expect("create_tube");
}

fn knows(addr: SocketAddr, tube: &str) -> bool {
    connect(addr).is_some_and(|mut c| {
        c.call("queue.statistics", &pack_args(&[Value::from(tube)]), None)
            .is_ok()
    })
}

fn task(values: &[Value]) -> Option<(u64, String)> {
    let t = values.first()?.as_array()?;
    Some((t.first()?.as_u64()?, t.get(2)?.as_str()?.to_owned()))
}

/// The placement as etcd holds it.
fn placement(etcd: &str) -> tarq_cluster::ClusterMap {
    let mut client = tarq_cluster::etcd::Client::connect(&[etcd.to_owned()]).unwrap();
    tarq_cluster::placement::read(&mut client, "c", Duration::from_secs(2)).unwrap()
}

#[test]
fn one_set_failing_over_leaves_the_other_serving_and_loses_nothing_acknowledged() {
    let etcd = Etcd::start();
    let mut nodes = Nodes::start_sets(&etcd, &[("a", 2), ("b", 2)], &["--sync-replicas", "1"]);
    let a = nodes.wait_leader_among(&[0, 1]);
    let b = nodes.wait_leader_among(&[2, 3]);
    create(nodes.nodes[a].addr, "f", 4);
    for n in &nodes.nodes {
        wait_for("every node to know the tube", || knows(n.addr, "f"));
    }
    let map = placement(&etcd.url);
    let a_indexes: HashSet<u64> = map.placement.tubes["f"]
        .partitions
        .iter()
        .filter(|p| p.set == "a")
        .map(|p| u64::from(p.index))
        .collect();
    assert_eq!(
        a_indexes.len(),
        2,
        "two partitions a set: {:?}",
        map.placement.tubes["f"]
    );

    // Producers through set a's primary (its partitions, no hop) and through set a's replica
    // (every partition in turn): each acknowledged put is sent with its time.
    let stop = Arc::new(AtomicBool::new(false));
    let count = Arc::new(AtomicU64::new(0));
    let (tx, rx) = mpsc::channel::<(u64, String, Instant)>();
    let replica_a = if a == 0 { 1 } else { 0 };
    let mut producers = Vec::new();
    for (k, node) in [a, replica_a].into_iter().enumerate() {
        let (addr, stop, tx) = (nodes.nodes[node].addr, Arc::clone(&stop), tx.clone());
        let count = Arc::clone(&count);
        producers.push(std::thread::spawn(move || {
            let mut c = connect(addr).expect("connect");
            let mut n = 0;
            while !stop.load(Ordering::Relaxed) {
                let data = format!("p{k}-{n}");
                n += 1;
                let args = pack_args(&[Value::from(data.as_str())]);
                // Refusals while set b fails over are expected; only acknowledgements count.
                if let Ok(r) = c.call("queue.tube.f:put", &args, None) {
                    if let Some((id, _)) = task(&r) {
                        count.fetch_add(1, Ordering::Relaxed);
                        let _ = tx.send((id, data, Instant::now()));
                    }
                }
            }
        }));
    }
    drop(tx);
    // The load runs a while before the kill (500 puts: on a loaded 2-core machine, with
    // --sync-replicas 1, 2000 did not always come within the wait's limit)...
    wait_for("500 puts acknowledged", || {
        count.load(Ordering::Relaxed) >= 500
    });
    let killed_at = Instant::now();
    nodes.kill(b);
    let survivor_b = if b == 2 { 3 } else { 2 };
    let new_b = nodes.wait_leader_among(&[survivor_b]);
    let failover = killed_at.elapsed();
    assert!(
        failover < FAILOVER_LIMIT,
        "set b failed over in {failover:?}"
    );
    // ...and a while after.
    let after = count.load(Ordering::Relaxed);
    wait_for("500 more puts acknowledged", || {
        count.load(Ordering::Relaxed) >= after + 500
    });
    stop.store(true, Ordering::Relaxed);
    for p in producers {
        p.join().unwrap();
    }
    let acked: Vec<(u64, String, Instant)> = rx.into_iter().collect();
    // Set a's partitions acknowledged puts all through set b's failover.
    let during = acked
        .iter()
        .filter(|(id, _, at)| {
            a_indexes.contains(&(id >> 41)) && *at > killed_at && *at < killed_at + failover
        })
        .count();
    assert!(
        during > 0,
        "set a acknowledged nothing while set b failed over ({failover:?})"
    );

    // The killed node comes back as a replica of b's new primary (with --sync-replicas 1 a
    // set's changes wait for one replica); then every acknowledged put is there to take.
    nodes.start_node(b);
    let want: HashSet<String> = acked.iter().map(|(_, d, _)| d.clone()).collect();
    let mut c = Client::connect_addr(nodes.nodes[new_b].addr, Duration::from_secs(10)).unwrap();
    let mut got = HashSet::new();
    let started = Instant::now();
    loop {
        assert!(started.elapsed() < Duration::from_secs(60), "draining");
        let r = match c.call("queue.tube.f:take", &pack_args(&[Value::from(0)]), None) {
            Ok(r) => r,
            Err(e) => panic!("take through {new_b}: {e}\n{}", nodes.log(new_b)),
        };
        let Some((id, data)) = task(&r) else { break };
        assert!(got.insert(data.clone()), "{data} delivered twice");
        if let Err(e) = c.call("queue.tube.f:ack", &pack_args(&[Value::from(id)]), None) {
            panic!(
                "ack {id} through {new_b}: {e}\n{}\n--- a:\n{}",
                nodes.log(new_b),
                nodes.log(a)
            );
        }
    }
    let lost: Vec<&String> = want.difference(&got).take(5).collect();
    assert!(
        lost.is_empty(),
        "{} acknowledged puts lost, e.g. {lost:?}",
        want.len() - got.len()
    );
}

#[test]
fn a_primary_that_missed_a_placement_change_changes_nothing_it_no_longer_owns() {
    let etcd = Etcd::start();
    let nodes = Nodes::start_sets(&etcd, &[("a", 1), ("b", 1)], &[]);
    let (a, b) = (nodes.wait_leader_among(&[0]), nodes.wait_leader_among(&[1]));
    // A tube of one partition, placed on set a (the set with fewer partitions goes first; a
    // second tube makes sure one lands on a).
    create(nodes.nodes[a].addr, "solo1", 1);
    create(nodes.nodes[a].addr, "solo2", 1);
    let map = placement(&etcd.url);
    let on_a = ["solo1", "solo2"]
        .into_iter()
        .find(|t| map.placement.tubes[*t].partitions[0].set == "a")
        .expect("one tube on set a");
    for n in &nodes.nodes {
        wait_for("every node to know the tube", || knows(n.addr, on_a));
    }

    // Set a's primary is stopped past its view's validity; meanwhile the partition moves.
    nodes.signal(a, "STOP");
    let mut client = tarq_cluster::etcd::Client::connect(std::slice::from_ref(&etcd.url)).unwrap();
    let moved =
        tarq_cluster::placement::place(&mut client, "c", on_a, 0, "b", Duration::from_secs(2))
            .unwrap();
    assert!(moved.is_ok(), "{moved:?}");
    std::thread::sleep(Duration::from_secs(3)); // longer than a view is trusted (TTL 2 s)
    nodes.signal(a, "CONT");

    // Puts straight to the resumed node: refused, or forwarded to b — never kept on a. (A
    // put may wait for the node to read the placement: the client waits long enough that no
    // answer is lost to its own timeout.) Each put's payload is filed by its answer: stored,
    // refused (nothing done), or outcome unknown (code 1003, or no answer): only those may
    // be on b without having been acknowledged.
    let mut c =
        Client::connect_addr(nodes.nodes[a].addr, Duration::from_secs(30)).expect("connect");
    let put = format!("queue.tube.{on_a}:put");
    let (mut acked, mut unknown, mut refused) = (HashSet::new(), HashSet::new(), HashSet::new());
    // Whether the put was acknowledged.
    let mut put_one = |payload: String| -> bool {
        let args = pack_args(&[Value::from(payload.as_str())]);
        match c.call(&put, &args, None) {
            Ok(r) if task(&r).is_some() => acked.insert(payload),
            Ok(r) => panic!("a put answered {r:?}"),
            Err(tarq_client::ClientError::Server { code, .. })
                if code != tarq_iproto::codes::ER_OUTCOME_UNKNOWN =>
            {
                !refused.insert(payload)
            }
            Err(_) => !unknown.insert(payload),
        }
    };
    for n in 0..20 {
        put_one(format!("early {n}"));
    }
    // Once it has read the placement again, it forwards to the owner.
    let mut n = 0;
    wait_for("a put through the resumed node to be acknowledged", || {
        n += 1;
        put_one(format!("late {n}"))
    });
    // Everything acknowledged is on b, the owner now.
    let mut cb = connect(nodes.nodes[b].addr).expect("connect");
    wait_for("set b to hold the moved partition", || {
        knows(nodes.nodes[b].addr, on_a)
    });
    // Taken until every acknowledged put is found (on a loaded machine b's own view may lapse
    // for a moment, and then it hands nothing out: it waits, it does not guess), then until
    // none is left.
    let take = format!("queue.tube.{on_a}:take");
    let mut on_b = HashSet::new();
    let mut take_one = |on_b: &mut HashSet<String>| {
        let r = cb.call(&take, &pack_args(&[Value::from(0)]), None).ok();
        let got = r.as_deref().and_then(task).map(|(_, p)| p);
        got.map(|p| on_b.insert(p)).is_some()
    };
    wait_for("every acknowledged put to be taken from b", || {
        take_one(&mut on_b);
        acked.is_subset(&on_b)
    });
    while take_one(&mut on_b) {}
    let strays: Vec<&String> = (on_b.iter())
        .filter(|p| !acked.contains(*p) && !unknown.contains(*p))
        .collect();
    assert!(
        strays.is_empty(),
        "on b beside the acknowledged puts and those of unknown outcome: {strays:?} (refused: \
         {refused:?})"
    );
}

/// A fifo put through a node that owns none of the tube's partitions goes to a partition whose
/// set has a primary: with one owning set down, every put succeeds (before, every other one
/// was sent to the dead set and refused).
#[test]
fn puts_avoid_a_partition_whose_set_has_no_primary() {
    let etcd = Etcd::start();
    let mut nodes = Nodes::start_sets(&etcd, &[("a", 1), ("b", 1), ("c", 1)], &[]);
    for i in 0..3 {
        nodes.wait_leader_among(&[i]);
    }
    create(nodes.nodes[0].addr, "spread", 2);
    for n in &nodes.nodes {
        wait_for("every node to know the tube", || knows(n.addr, "spread"));
    }
    let map = placement(&etcd.url);
    let owners: HashSet<String> = (map.placement.tubes["spread"].partitions.iter())
        .map(|p| p.set.clone())
        .collect();
    assert_eq!(
        owners.len(),
        2,
        "two partitions on two sets: {:?}",
        map.placement
    );
    let set_of = |i: usize| ["a", "b", "c"][i];
    let outsider = (0..3).find(|&i| !owners.contains(set_of(i))).unwrap();
    let victim = (0..3).find(|&i| owners.contains(set_of(i))).unwrap();
    nodes.kill(victim);
    // Once the outsider's view has the victim's set without a primary (its lease ran out)...
    let mut c = connect(nodes.nodes[outsider].addr).expect("connect");
    let victim_set = set_of(victim);
    wait_for("the outsider to see the set without a primary", || {
        let o = c.call("queue.cluster", &pack_args(&[]), None).unwrap();
        let sets = cluster::field(&o[0], "sets")
            .and_then(Value::as_array)
            .cloned();
        // Gone from the sets, or listed without a primary.
        !sets.unwrap_or_default().iter().any(|s| {
            cluster::field(s, "name").and_then(Value::as_str) == Some(victim_set)
                && cluster::field(s, "primary").is_some_and(|p| !p.is_nil())
        })
    });
    // ...every put through it succeeds.
    for n in 0..20 {
        let r = c.call("queue.tube.spread:put", &pack_args(&[Value::from(n)]), None);
        assert!(r.is_ok(), "put {n}: {r:?}");
    }
}
