//! The router's bounds, on real nodes and a real etcd: with `--max-routed-calls 2`, a third
//! take waiting across a sharded tube's partitions and a third call forwarded to a set that
//! does not answer are each refused at once with a message naming the limit (nothing done),
//! the calls within the bound complete, and `queue.stats()` counts what waits and what was
//! refused; the router's own words (a count of waiting takes told to a tube's owner) are not
//! held to that bound.

#[path = "support/cluster.rs"]
mod cluster;
mod support;

use std::net::SocketAddr;
use std::time::Duration;

use cluster::{wait_for, wait_for_or, Etcd, Nodes};
use rmpv::Value;
use tarq_client::{pack_args, Client};

fn connect(addr: SocketAddr) -> Client {
    Client::connect_addr(addr, Duration::from_secs(10)).expect("connect")
}

fn stat(addr: SocketAddr, key: &str) -> u64 {
    let r = connect(addr)
        .call("queue.stats", &pack_args(&[]), None)
        .unwrap();
    let stats = r.into_iter().next().unwrap_or(Value::Nil);
    support::field(&stats, key).as_u64().expect(key)
}

/// Sends `queue.tube.t:<op>` with each of `args` on `c` at once; their syncs in order.
fn send_all(c: &mut Client, op: &str, args: &[Vec<u8>]) -> Vec<u64> {
    let f = format!("queue.tube.t:{op}");
    (args.iter())
        .map(|a| {
            c.send_request(|o, s| tarq_iproto::client::call(o, s, &f, a))
                .unwrap()
        })
        .collect()
}

/// The next reply: its sync and its error message, if it is an error.
fn next(c: &mut Client) -> (u64, Option<String>) {
    let r = c.recv().unwrap().expect("the node closed the connection");
    let err = (!r.is_ok()).then(|| r.error.clone().unwrap_or_default());
    (r.sync, err)
}

#[test]
fn a_call_past_max_routed_calls_is_refused_at_once_and_the_others_complete() {
    let etcd = Etcd::start();
    let nodes = Nodes::start_sets(&etcd, &[("a", 1), ("b", 1)], &["--max-routed-calls", "2"]);
    let (a, b) = (nodes.wait_leader_among(&[0]), nodes.wait_leader_among(&[1]));
    let addr = nodes.nodes[a].addr;
    let mut c = connect(addr);
    nodes.create_tube(&mut c, "t", "utube", 2);

    // Takes waiting on the empty tube: two wait, the third is refused at once.
    let take = pack_args(&[Value::from(30)]);
    let mut waiting = connect(addr);
    let syncs = send_all(&mut waiting, "take", &[take.clone(), take.clone(), take]);
    let (sync, err) = next(&mut waiting);
    assert_eq!(sync, syncs[2], "the third take is answered first");
    // Refused where it met the bound: the takes it would wait with, or (sent together) the
    // forwarded takes that look at set b's partition first.
    let err = err.expect("refused");
    assert!(
        err.starts_with("busy: this node holds 2 ")
            && err.ends_with("already (--max-routed-calls 2); nothing was done"),
        "{err}"
    );
    wait_for("two takes waiting", || stat(addr, "routed_waiting") == 2);
    assert_eq!(stat(addr, "routed_refused"), 1);
    // Two puts wake them.
    for k in 0..2 {
        let opts = Value::Map(vec![(Value::from("utube"), Value::from(format!("w{k}")))]);
        c.call(
            "queue.tube.t:put",
            &pack_args(&[Value::from("x"), opts]),
            None,
        )
        .unwrap();
    }
    let mut woken: Vec<u64> = (0..2)
        .map(|_| next(&mut waiting))
        .map(|(s, e)| {
            assert_eq!(e, None, "a waiting take is served");
            s
        })
        .collect();
    woken.sort();
    assert_eq!(woken, syncs[..2]);
    wait_for("no take waiting, no watch left", || {
        stat(addr, "routed_waiting") == 0 && stat(addr, "routed_forwarded") == 0
    });

    // Puts for set b's partition while its node does not answer: two go over the link and
    // wait; the third is refused at once.
    let keys: Vec<String> = (0..16).map(|k| format!("k{k}")).collect();
    let put = |key: &str| {
        let opts = Value::Map(vec![(Value::from("utube"), Value::from(key))]);
        pack_args(&[Value::from("x"), opts])
    };
    // The keys whose partition is b's: a put of each through node a, timed by where it went
    // (node b stopped, a put for b's partition does not come back at once).
    nodes.signal(b, "STOP");
    let mut probe = connect(addr);
    let mut b_keys = Vec::new();
    for k in &keys {
        let s = send_all(&mut probe, "put", &[put(k)])[0];
        match probe.recv_within(Duration::from_millis(300)) {
            Ok(Some(r)) => assert_eq!(r.sync, s),
            _ => {
                b_keys.push(k.clone());
                break;
            }
        }
    }
    assert!(!b_keys.is_empty(), "one of 16 keys is set b's");
    // One put for b is in flight on `probe`; two more: one fits, one is refused.
    let mut more = connect(addr);
    let syncs = send_all(&mut more, "put", &[put(&b_keys[0]), put(&b_keys[0])]);
    let (sync, err) = next(&mut more);
    assert_eq!(sync, syncs[1]);
    let err = err.expect("refused");
    assert!(
        err.contains("calls forwarded and not answered already (--max-routed-calls 2)"),
        "{err}"
    );
    assert_eq!(stat(addr, "routed_forwarded"), 2);
    assert_eq!(stat(addr, "routed_refused"), 2);
    // Set b back: the two calls within the bound complete.
    nodes.signal(b, "CONT");
    let (s, e) = next(&mut more);
    assert_eq!((s, e), (syncs[0], None));
    let r = probe.recv().unwrap().expect("the probe's put is answered");
    assert!(r.is_ok(), "{:?}", r.error);
    wait_for("nothing forwarded is left waiting", || {
        stat(addr, "routed_forwarded") == 0
    });
}

/// A take waiting across a tube's partitions watches set b's partition over the link; served
/// here, it needs that watch no more: the watch is dropped on both nodes (it held a call
/// forwarded and not answered, a slot of `--max-routed-calls`, until b's partition had a task).
#[test]
fn a_take_served_here_leaves_no_watch_on_the_other_set() {
    let etcd = Etcd::start();
    let nodes = Nodes::start_sets(&etcd, &[("a", 1), ("b", 1)], &[]);
    let (a, b) = (nodes.wait_leader_among(&[0]), nodes.wait_leader_among(&[1]));
    let (addr, b_addr) = (nodes.nodes[a].addr, nodes.nodes[b].addr);
    let mut c = connect(addr);
    nodes.create_tube(&mut c, "t", "fifo", 2);
    let mut waiting = connect(addr);
    let sync = send_all(&mut waiting, "take", &[pack_args(&[Value::from(30)])])[0];
    wait_for("the take waiting, set b's partition watched", || {
        stat(addr, "routed_waiting") == 1
            && stat(addr, "routed_forwarded") == 1
            && stat(b_addr, "parked_takes") == 1
    });
    // A put through node a goes to its own partition: the take is served here.
    let put = pack_args(&[Value::from("x")]);
    c.call("queue.tube.t:put", &put, None).unwrap();
    assert_eq!(next(&mut waiting), (sync, None));
    wait_for("no watch left on either node", || {
        stat(addr, "routed_waiting") == 0
            && stat(addr, "routed_forwarded") == 0
            && stat(b_addr, "parked_takes") == 0
    });
}

/// What a router says on its own — how many of its takes wait on a tube, told to the owner of
/// the tube's first partition — is no client's call: with `--max-routed-calls 1` and each
/// node's one slot taken by its waiting take's watch of the other set's partition, the count
/// still reaches the owner (it was refused at the bound, counted as a refusal no client saw,
/// and a client's call forwarded beside it could be refused for it).
#[test]
fn the_routers_own_words_are_not_held_to_the_call_bound() {
    let etcd = Etcd::start();
    let web = ["--http-listen", "127.0.0.1:0", "--max-routed-calls", "1"];
    let nodes = Nodes::start_sets(&etcd, &[("a", 1), ("b", 1)], &web);
    let primaries = [nodes.wait_leader_among(&[0]), nodes.wait_leader_among(&[1])];
    let mut c = connect(nodes.nodes[primaries[0]].addr);
    nodes.create_tube(&mut c, "t", "fifo", 2);
    // A take through each set's primary: each watches the other set's partition (its one
    // slot), and the one not owning the tube's first partition tells the owner it waits.
    let mut takes: Vec<(Client, u64)> = (primaries.iter())
        .map(|&i| {
            let mut c = connect(nodes.nodes[i].addr);
            let sync = send_all(&mut c, "take", &[pack_args(&[Value::from(30)])])[0];
            (c, sync)
        })
        .collect();
    let metric = |i: usize| -> u64 {
        let web = nodes.nodes[i].tarq.as_ref().unwrap().metrics.unwrap();
        let (_, page) = support::http_get(web, "/metrics");
        (page.lines())
            .filter(|l| l.starts_with("tarq_tube_takers_waiting{") && l.contains("tube=\"t\""))
            .map(|l| l.rsplit(' ').next().unwrap().parse::<u64>().unwrap())
            .sum()
    };
    wait_for_or(
        "both takes waiting, each watching the other set's partition",
        || {
            primaries.iter().all(|&i| {
                let addr = nodes.nodes[i].addr;
                stat(addr, "routed_waiting") == 1 && stat(addr, "routed_forwarded") == 1
            })
        },
        || "; a node's take does not wait, or watches nothing".to_owned(),
    );
    wait_for_or(
        "the owner of the first partition to count both takes",
        || primaries.iter().map(|&i| metric(i)).sum::<u64>() == 2,
        || {
            let counts: Vec<u64> = primaries.iter().map(|&i| metric(i)).collect();
            format!("; the primaries' /metrics count {counts:?} takes waiting, not 2 in all")
        },
    );
    for &i in &primaries {
        let addr = nodes.nodes[i].addr;
        assert_eq!(stat(addr, "routed_refused"), 0, "node {i} refused nothing");
    }
    // Two puts serve both takes, whichever partition each lands in.
    for _ in 0..2 {
        let put = pack_args(&[Value::from("x")]);
        c.call("queue.tube.t:put", &put, None).unwrap();
    }
    for (c, sync) in &mut takes {
        assert_eq!(next(c), (*sync, None), "a waiting take is served");
    }
    wait_for("nothing waiting or forwarded, no count left", || {
        primaries.iter().all(|&i| {
            let addr = nodes.nodes[i].addr;
            stat(addr, "routed_waiting") == 0 && stat(addr, "routed_forwarded") == 0
        }) && primaries.iter().map(|&i| metric(i)).sum::<u64>() == 0
    });
}
