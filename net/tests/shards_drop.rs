//! Dropping a partitioned tube against the calls that race it, on real nodes and a real etcd:
//! - a put for a partition whose owner has not read the drop yet (its node cannot reach etcd:
//!   a proxy in front of etcd holds its requests) reaches it after the drop answered: it is
//!   not acknowledged (the owner held the partition's changes from the drop's check on, and
//!   answers them once it reads that the tube is gone), and nothing put after the drop
//!   answered is found anywhere;
//! - a drop refused by one partition's check (a task taken there) leaves the partitions that
//!   passed theirs serving at once (told by the dropping node), not after their hold runs out;
//! - a dropping node that dies between its checks and its commit (the commit held back by a
//!   proxy in front of etcd) leaves the owner holding its partition only until the hold runs
//!   out: it reads the placement, finds the tube, and serves the held put;
//! - a drop whose commit etcd applies but whose answer is lost is answered "outcome unknown"
//!   (1003), and the puts after that answer are not acknowledged: both owners hold their
//!   partitions until they read that the tube is gone;
//! - a set whose primary passed its check fails over before the commit reaches etcd: the new
//!   primary holds nothing for the drop, so the commit (fenced on the checking primary's
//!   term) is refused and the tube stays.
//!
//! Every wait has a deadline.

#[path = "support/cluster.rs"]
mod cluster;
#[path = "support/etcd_proxy.rs"]
mod etcd_proxy;
mod support;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use cluster::{field, str_field, wait_for, Etcd, Nodes};
use etcd_proxy::{EtcdProxy, Fault};
use rmpv::Value;
use tarq_client::{pack_args, Client};

/// A lease long enough that a node cut off from etcd for the test's few seconds still leads
/// and still trusts its view of the placement (three quarters of it): its calls are decided by
/// its view, not refused as stale.
const LONG_TTL: &[&str] = &["--lease-ttl", "10"];

/// How long the owners hold a partition after a drop's check with no word of the drop
/// (`DROP_HOLD`): a partition told of a drop given up serves well before.
const HOLD: Duration = Duration::from_secs(5);

fn connect(addr: SocketAddr) -> Client {
    Client::connect_addr(addr, Duration::from_secs(10)).expect("connect")
}

fn create(addr: SocketAddr, name: &str, kind: &str, partitions: u64) {
    let opts = Value::Map(vec![(Value::from("partitions"), Value::from(partitions))]);
    let args = pack_args(&[Value::from(name), Value::from(kind), opts]);
    connect(addr)
        .call("queue.create_tube", &args, None)
        .expect("create the tube");
}

fn knows(addr: SocketAddr, tube: &str) -> bool {
    connect(addr)
        .call("queue.statistics", &pack_args(&[Value::from(tube)]), None)
        .is_ok()
}

/// A put of `data` into `tube` through the node at `addr` (with utube key `key`): the task's
/// id, or the error's words.
fn put(addr: SocketAddr, tube: &str, data: &str, key: Option<&str>) -> Result<Value, String> {
    let opts = match key {
        Some(k) => Value::Map(vec![(Value::from("utube"), Value::from(k))]),
        None => Value::Map(Vec::new()),
    };
    let args = pack_args(&[Value::from(data), opts]);
    connect(addr)
        .call(
            &format!("queue.tube.{tube}:put"),
            &args,
            Some(Duration::from_secs(60)),
        )
        .map(|r| r.into_iter().next().unwrap_or(Value::Nil))
        .map_err(|e| e.to_string())
}

/// A figure of `queue.stats` of the node at `addr`.
/// `queue.tube.<tube>:drop()` through `addr`; an error as its text.
fn drop_tube(addr: SocketAddr, tube: &str) -> Result<Vec<Value>, String> {
    let function = format!("queue.tube.{tube}:drop");
    connect(addr)
        .call(&function, &pack_args(&[]), None)
        .map_err(|e| e.to_string())
}

fn stat(addr: SocketAddr, key: &str) -> u64 {
    let r = connect(addr).call("queue.stats", &pack_args(&[]), None);
    let stats = r.unwrap().into_iter().next().unwrap_or(Value::Nil);
    support::field(&stats, key).as_u64().expect(key)
}

/// The tasks in the partition of `tube` that node `i`'s set owns, as that node counts them.
fn own_total(nodes: &Nodes, i: usize, tube: &str) -> u64 {
    let o = nodes.overview(i).expect("the node answers");
    let tubes = field(&o, "placement").and_then(|p| field(p, "tubes"));
    let t = (tubes.and_then(Value::as_array).into_iter().flatten())
        .find(|t| str_field(t, "name") == tube)
        .unwrap_or_else(|| panic!("node {i} places tube {tube}"));
    let parts = field(t, "partitions").and_then(Value::as_array);
    let own = (parts.into_iter().flatten())
        .find(|p| field(p, "owner_here").and_then(Value::as_bool) == Some(true))
        .unwrap_or_else(|| panic!("node {i}'s set owns a partition of {tube}"));
    field(own, "total").and_then(Value::as_u64).unwrap_or(0)
}

/// A utube key of `tube` whose partition node `i`'s set owns: a put of each through node `i`
/// until one lands in its own partition.
fn own_key(nodes: &Nodes, i: usize, tube: &str) -> String {
    let addr = nodes.nodes[i].addr;
    (0..64)
        .map(|k| format!("k{k}"))
        .find(|k| {
            let before = own_total(nodes, i, tube);
            put(addr, tube, "before", Some(k)).expect("a put before the drop");
            own_total(nodes, i, tube) > before
        })
        .expect("one of 64 keys is this set's")
}

/// Sets a and b of one node each (the long lease), the one named by `proxied` ('a' or 'b')
/// reaching etcd through `proxy`, the other directly; both led, each knowing both primaries.
fn two_sets(etcd: &Etcd, proxy: &EtcdProxy, proxied: char) -> (Nodes, Nodes) {
    let start = |set: &str| match set.starts_with(proxied) {
        true => Nodes::start_sets_at(&proxy.url, &[(set, 1)], LONG_TTL),
        false => Nodes::start_sets(etcd, &[(set, 1)], LONG_TTL),
    };
    let (a, b) = (start("a"), start("b"));
    for n in [&a, &b] {
        n.wait_leader_among(&[0]);
    }
    for n in [&a, &b] {
        n.wait_primaries_known(&[0], 2);
    }
    (a, b)
}

/// Creates utube `name` of two partitions through `via`, and waits until every node at
/// `addrs` knows it.
fn create_known(via: SocketAddr, addrs: &[SocketAddr], name: &str) {
    create(via, name, "utube", 2);
    for &addr in addrs {
        wait_for("every node to know the tube", || knows(addr, name));
    }
}

#[test]
fn a_put_reaching_an_owner_that_has_not_read_the_drop_is_not_acknowledged() {
    let etcd = Etcd::start();
    let proxy = EtcdProxy::start(&etcd.url);
    // Set a's node reads etcd itself; set b's through the proxy.
    let (a, b) = two_sets(&etcd, &proxy, 'b');
    let (a0, b0) = (a.nodes[0].addr, b.nodes[0].addr);
    create_known(a0, &[a0, b0], "doomed");
    let b_key = own_key(&b, 0, "doomed");

    // From now on set b's node cannot read etcd: it does not learn of the drop by itself.
    proxy.block();
    drop_tube(a0, "doomed").expect("the drop is answered");
    // After the drop's answer: a put for set b's partition through b's node, and plain puts
    // through each node.
    let racers = [(b0, Some(b_key)), (b0, None), (a0, None)].map(|(addr, key)| {
        std::thread::spawn(move || put(addr, "doomed", "after the drop", key.as_deref()))
    });
    // Held by b's node (the drop's check held the partition), or answered.
    wait_for(
        "the put for set b's partition to be held or answered",
        || racers[0].is_finished() || stat(b0, "routed_held") >= 1,
    );
    // Before b's node reads etcd, what the puts got so far: nothing acknowledged.
    let early: Vec<String> = (racers.iter().enumerate())
        .filter(|(_, r)| r.is_finished())
        .map(|(i, _)| format!("put {i}"))
        .collect();
    proxy.unblock();
    let acked: Vec<(usize, Value)> = (racers.into_iter().enumerate())
        .filter_map(|(i, r)| r.join().unwrap().ok().map(|id| (i, id)))
        .collect();
    assert!(
        acked.is_empty(),
        "puts acknowledged after the drop had answered (put, task id): {acked:?}; answered \
         before b's node read etcd: {early:?}"
    );
    // Nowhere: the tube is gone from both nodes, and what was put into it with it.
    for addr in [a0, b0] {
        wait_for("both nodes to let the tube go", || !knows(addr, "doomed"));
    }
    assert_eq!(stat(b0, "routed_held"), 0, "no call left held");
}

#[test]
fn a_drop_refused_by_one_partition_leaves_the_others_serving_at_once() {
    let etcd = Etcd::start();
    let nodes = Nodes::start_sets(&etcd, &[("a", 1), ("b", 1), ("c", 1)], &[]);
    for i in 0..3 {
        nodes.wait_leader_among(&[i]);
    }
    nodes.wait_primaries_known(&[0, 1, 2], 3);
    let addr = |i: usize| nodes.nodes[i].addr;
    create(addr(0), "kept", "utube", 3);
    for i in 0..3 {
        wait_for("every node to know the tube", || knows(addr(i), "kept"));
    }
    let keys: Vec<String> = (0..3).map(|i| own_key(&nodes, i, "kept")).collect();
    // A task taken from set c's partition (its node takes from its own first) holds the tube.
    let mut taker = connect(addr(2));
    let r = taker
        .call("queue.tube.kept:take", &pack_args(&[Value::from(0)]), None)
        .unwrap();
    let taken = r.first().and_then(|t| t.as_array()).map(|t| t[0].clone());
    let taken = taken.expect("a task taken");

    // Dropped through set a's node: its own partition and set b's pass their checks (and are
    // held), set c's refuses.
    let e = drop_tube(addr(0), "kept").unwrap_err();
    assert!(e.contains("There are taken tasks in the tube"), "{e}");
    // At once, a put into set a's partition and one into set b's, each through its own node
    // (held there until the drop's fate is known): taken, well before the hold runs out.
    let before = [own_total(&nodes, 0, "kept"), own_total(&nodes, 1, "kept")];
    for i in [0, 1] {
        let started = Instant::now();
        put(addr(i), "kept", "after", Some(&keys[i])).expect("a put after the refused drop");
        let took = started.elapsed();
        assert!(
            took < HOLD / 2,
            "the put into set {i}'s partition took {took:?}: held as if the drop were not given up"
        );
        assert_eq!(
            own_total(&nodes, i, "kept"),
            before[i] + 1,
            "set {i}'s put is there"
        );
    }
    assert_eq!(stat(addr(1), "routed_held"), 0, "no call left held");

    // Acknowledged, the task no longer holds the tube: the drop goes through.
    taker
        .call("queue.tube.kept:ack", &pack_args(&[taken]), None)
        .unwrap();
    drop_tube(addr(0), "kept").expect("the drop is answered");
    for i in 0..3 {
        wait_for("every node to let the tube go", || !knows(addr(i), "kept"));
    }
}

#[test]
fn an_owner_serves_again_once_its_hold_runs_out_when_the_dropping_node_died() {
    let etcd = Etcd::start();
    let proxy = EtcdProxy::start(&etcd.url);
    // Set a's node reaches etcd through the proxy, which holds its drop's commit back.
    let (mut a, b) = two_sets(&etcd, &proxy, 'a');
    let (a0, b0) = (a.nodes[0].addr, b.nodes[0].addr);
    create_known(b0, &[a0, b0], "orphan");
    let b_key = own_key(&b, 0, "orphan");
    let before = own_total(&b, 0, "orphan");

    proxy.arm("drop tube orphan", Fault::Hold);
    let dropper = std::thread::spawn(move || drop_tube(a0, "orphan"));
    // Every check passed (set b's partition is held): the commit is on its way. The dropping
    // node dies before it reaches etcd.
    proxy.wait_arrived();
    let checked = Instant::now();
    a.kill(0);
    assert!(
        dropper.join().unwrap().is_err(),
        "a dead node answers no drop"
    );
    let held_at = Instant::now();
    let putter = std::thread::spawn(move || put(b0, "orphan", "after", Some(&b_key)));
    wait_for("the put to be held", || stat(b0, "routed_held") >= 1);
    // Not for ever: once the hold runs out, the owner reads the placement (the tube is still
    // there) and the put is served.
    putter
        .join()
        .unwrap()
        .expect("the put is served once the hold runs out");
    assert!(held_at.elapsed() < HOLD * 3, "held {:?}", held_at.elapsed());
    // Nor released early (the dropping node's link closing is no word of the drop's fate).
    assert!(
        checked.elapsed() >= HOLD - Duration::from_secs(1),
        "served {:?} after the checks, before the hold ran out",
        checked.elapsed()
    );
    // Still placed (its figures as b's node reads the placement), the put in it.
    assert_eq!(own_total(&b, 0, "orphan"), before + 1, "the put is there");
    assert_eq!(stat(b0, "routed_held"), 0, "no call left held");
}

#[test]
fn a_drop_checked_by_a_primary_deposed_before_the_commit_is_refused() {
    let etcd = Etcd::start();
    let proxy = EtcdProxy::start(&etcd.url);
    // Set a's node reaches etcd through the proxy, which holds its drop's commit back; set
    // b's two nodes fail over quickly (the tests' short lease).
    let a = Nodes::start_sets_at(&proxy.url, &[("a", 1)], LONG_TTL);
    let mut b = Nodes::start_sets(&etcd, &[("b", 2)], &[]);
    a.wait_leader_among(&[0]);
    let b_leader = b.wait_leader_among(&[0, 1]);
    a.wait_primaries_known(&[0], 2);
    let a0 = a.nodes[0].addr;
    create_known(a0, &[a0, b.nodes[0].addr, b.nodes[1].addr], "fenced");

    proxy.arm("drop tube fenced", Fault::Hold);
    let dropper = std::thread::spawn(move || drop_tube(a0, "fenced"));
    // Every check passed (set b's primary holds its partition); the commit waits at the
    // proxy while set b's primary dies and the other node takes over, holding nothing.
    proxy.wait_arrived();
    b.kill(b_leader);
    let other = 1 - b_leader;
    b.wait_leader_among(&[other]);
    proxy.release();
    proxy.wait_answered();
    let answer = dropper.join().unwrap();
    let e = answer.expect_err("a drop checked by a deposed primary is not made");
    assert!(
        e.contains("no longer leads it") || e.contains("may or may not have been made"),
        "{e}"
    );
    // etcd refused it: the tube is placed still.
    let mut client = tarq_cluster::etcd::Client::new(vec![etcd.url.clone()]);
    let map = tarq_cluster::placement::read(&mut client, "c", Duration::from_secs(5))
        .expect("etcd answers");
    assert!(
        map.placement.tubes.contains_key("fenced"),
        "the commit went through against a new primary: {:?}",
        map.placement.tubes.keys().collect::<Vec<_>>()
    );
    // And the new primary serves it.
    let key = own_key(&b, other, "fenced");
    put(b.nodes[other].addr, "fenced", "after", Some(&key)).expect("a put on the new primary");
}

#[test]
fn a_drop_whose_answer_is_lost_is_of_unknown_outcome_and_nothing_after_it_is_acknowledged() {
    let etcd = Etcd::start();
    let proxy = EtcdProxy::start(&etcd.url);
    // Set a's node (the dropping one) reaches etcd through the proxy, which loses the answer
    // to its drop's commit and then holds its requests a while; set b's reads etcd itself.
    let (a, b) = two_sets(&etcd, &proxy, 'a');
    let (a0, b0) = (a.nodes[0].addr, b.nodes[0].addr);
    create_known(a0, &[a0, b0], "unsure");
    let keys = [own_key(&a, 0, "unsure"), own_key(&b, 0, "unsure")];

    let pause = Duration::from_secs(2);
    proxy.arm("drop tube unsure", Fault::LoseAnswer { then_pause: pause });
    let e =
        drop_tube(a0, "unsure").expect_err("a drop whose answer was lost is not answered as done");
    assert!(e.contains("may or may not have been made"), "{e}");
    proxy.wait_answered();
    // etcd made it. After the drop's answer, a put into each set's partition through its own
    // node: each owner holds it until it reads that the tube is gone, then refuses it.
    let racers = [(a0, &keys[0]), (b0, &keys[1])].map(|(addr, key)| {
        let key = key.clone();
        std::thread::spawn(move || put(addr, "unsure", "after the drop", Some(&key)))
    });
    let acked: Vec<(usize, Value)> = (racers.into_iter().enumerate())
        .filter_map(|(i, r)| r.join().unwrap().ok().map(|id| (i, id)))
        .collect();
    assert!(
        acked.is_empty(),
        "puts acknowledged after a drop etcd had made (set, task id): {acked:?}"
    );
    for addr in [a0, b0] {
        wait_for("both nodes to let the tube go", || !knows(addr, "unsure"));
    }
}
