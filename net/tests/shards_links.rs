//! Links between members only, on a real sharded node and a real etcd: `tarq.link` is open
//! only to a caller that names the node's cluster, speaks its link protocol version and proves
//! the cluster's link key (kept in etcd) over the connection's greeting salt. A plain client,
//! a node of another version, another cluster's node and a wrong proof are each refused with a
//! message that says why (which node to upgrade, for a version); an accepted link still may
//! not act for one of the node's own sessions that forwarded nothing, nor end a move it never
//! began. Every refusal is counted in `/metrics`-style figures (`queue.stats()`).

#[path = "support/cluster.rs"]
mod cluster;
mod support;

use std::net::SocketAddr;
use std::time::Duration;

use cluster::{wait_for, Etcd, Nodes};
use rmpv::Value;
use tarq_client::{pack_args, Client, ClientError};
use tarq_cluster::{etcd, link_key, LinkKey};
use tarq_net::frontend::link::call::{Api, Call};
use tarq_net::frontend::link::wire::{self, Ask, Hello};

fn connect(addr: SocketAddr) -> Client {
    Client::connect_addr(addr, Duration::from_secs(10)).expect("connect")
}

/// The cluster `c`'s link key, once its first node has made it.
fn key_of(etcd_url: &str) -> LinkKey {
    let mut e = etcd::Client::new(vec![etcd_url.to_owned()]);
    let mut key = None;
    wait_for("the cluster's link key in etcd", || {
        key = link_key::read(&mut e, "c", Duration::from_secs(2))
            .ok()
            .flatten();
        key.is_some()
    });
    key.unwrap()
}

/// `tarq.link` with `hello`'s fields, the proof made by `prove` over this connection's salt.
fn link_call(
    c: &mut Client,
    version: u32,
    cluster: &str,
    origin: &str,
    prove: impl Fn(&[u8]) -> Vec<u8>,
) -> Result<Vec<Value>, ClientError> {
    let proof = prove(&c.greeting().salt);
    let hello = Hello {
        origin,
        version,
        cluster,
        proof: &proof,
    };
    let mut args = Vec::new();
    wire::write_link_args(&mut args, &hello);
    c.call(wire::LINK, &args, None)
}

fn refusal(r: Result<Vec<Value>, ClientError>) -> (u32, String) {
    match r {
        Err(ClientError::Server { code, message }) => (code, message),
        other => panic!("expected a refusal, got {other:?}"),
    }
}

/// One ask on a link: its answer, as text (a refusal is an `Error(..)` answer).
fn ask(c: &mut Client, a: &Ask<'_>) -> String {
    c.send_request(|o, s| wire::write_ask(o, s, a)).unwrap();
    let reply = c.recv().unwrap().expect("the node closed the link");
    assert!(reply.is_ok(), "a link's answers are in DATA: {reply:?}");
    let data = reply.data.expect("an answer");
    format!("{:?}", wire::read_answer(&data).expect("an answer decodes"))
}

fn links_refused(addr: SocketAddr) -> u64 {
    let mut c = connect(addr);
    let r = c.call("queue.stats", &pack_args(&[]), None).unwrap();
    let stats = r.into_iter().next().unwrap_or(Value::Nil);
    support::field(&stats, "links_refused")
        .as_u64()
        .expect("queue.stats has links_refused")
}

#[test]
fn only_members_of_the_cluster_that_prove_its_key_open_links() {
    let etcd = Etcd::start();
    let nodes = Nodes::start_sets(&etcd, &[("a", 1)], &[]);
    let a = nodes.wait_leader_among(&[0]);
    let addr = nodes.nodes[a].addr;
    let me = nodes.nodes[a].name.clone();
    let key = key_of(&etcd.url);
    let good = |salt: &[u8]| wire::proof(&key, salt, "c", "x9").to_vec();

    // A plain client calling tarq.link with a node's name (what version 1 sent): refused,
    // naming the node to upgrade.
    let mut c = connect(addr);
    let r = c.call(wire::LINK, &pack_args(&[Value::from("x9")]), None);
    let (_, msg) = refusal(r);
    assert!(
        msg.contains("link protocol version 1 from node x9") && msg.contains("upgrade node x9"),
        "{msg}"
    );
    // A newer node: this node is the one to upgrade.
    let (_, msg) = refusal(link_call(&mut c, wire::LINK_VERSION + 1, "c", "x9", good));
    assert!(msg.contains(&format!("upgrade node {me}")), "{msg}");
    // The right version without the key: access denied.
    let (code, msg) = refusal(link_call(&mut c, wire::LINK_VERSION, "c", "x9", |_| {
        vec![0; 32]
    }));
    assert_eq!(code, tarq_iproto::codes::ER_ACCESS_DENIED, "{msg}");
    assert!(
        msg.contains("did not prove the cluster's link key"),
        "{msg}"
    );
    // A proof made for another connection's salt opens nothing here.
    let (code, _) = refusal(link_call(&mut c, wire::LINK_VERSION, "c", "x9", |_| {
        wire::proof(&key, &[7; 32], "c", "x9").to_vec()
    }));
    assert_eq!(code, tarq_iproto::codes::ER_ACCESS_DENIED);
    // Another cluster's node, proving its own cluster's name with this key.
    let other = |salt: &[u8]| wire::proof(&key, salt, "d", "x9").to_vec();
    let (code, msg) = refusal(link_call(&mut c, wire::LINK_VERSION, "d", "x9", other));
    assert_eq!(code, tarq_iproto::codes::ER_ACCESS_DENIED);
    assert!(msg.contains("cluster \"d\" refused"), "{msg}");
    // The connection was never made a link: it is still a client's.
    c.call("queue.stats", &pack_args(&[]), None)
        .expect("a refused link leaves a client connection");
    assert_eq!(links_refused(addr), 5);

    // A member: accepted.
    let mut l = connect(addr);
    link_call(&mut l, wire::LINK_VERSION, "c", "x9", good).expect("a member's link");
    // It acts for its own node's sessions...
    let take = |origin| Ask::Run {
        session: 1,
        origin,
        call: Call::Take {
            api: Api::Seed,
            timeout: Some(0),
        },
    };
    assert_eq!(ask(&mut l, &take(None)), "Nothing");
    // ...not for a session of this node that forwarded nothing.
    let e = ask(&mut l, &take(Some(me.as_str())));
    assert!(
        e.starts_with("Error(") && e.contains("may act only for its own node's sessions"),
        "{e}"
    );
    // Nor does it end a move it never began: the partition is not taken on its word.
    let done = Ask::MoveDone {
        id: 7,
        index: 5,
        committed: true,
        epoch: 1_000_000,
    };
    let e = ask(&mut l, &done);
    assert!(
        e.starts_with("Error(") && e.contains("no move 7 into index 5 from x9"),
        "{e}"
    );
    let mut c = connect(addr);
    let r = c.call("queue.take", &pack_args(&[Value::from(0)]), None);
    assert!(r.is_ok(), "the node serves its clients as before: {r:?}");
}

/// A link whose other end falls silent (its node stopped: the TCP connection stays open, as it
/// does when the network between drops everything) is pinged and then taken for dead after
/// `--link-timeout`: a call in flight on it is answered — code 1003, outcome unknown, since it
/// was sent — instead of waiting for as long as the other end is gone.
#[test]
fn a_silent_link_is_taken_for_dead_after_the_link_timeout() {
    let etcd = Etcd::start();
    let mut nodes = Nodes::start_sets(&etcd, &[("a", 1), ("b", 1)], &["--link-timeout", "0.5"]);
    let (a, b) = (nodes.wait_leader_among(&[0]), nodes.wait_leader_among(&[1]));
    let mut c = connect(nodes.nodes[a].addr);
    nodes.create_tube(&mut c, "t", "utube", 2);
    // A primary puts a plain put into its own set's partitions; a utube key has its own
    // partition, wherever it is. Of 16 keys, some hash to set b's partition (all 16 to a's:
    // one chance in 65536): their puts open the link to b.
    let keys: Vec<String> = (0..16).map(|k| format!("k{k}")).collect();
    let put = |c: &mut Client, key: &str| {
        let opts = Value::Map(vec![(Value::from("utube"), Value::from(key))]);
        c.call(
            "queue.tube.t:put",
            &pack_args(&[Value::from("x"), opts]),
            None,
        )
    };
    for k in &keys {
        put(&mut c, k).expect("set b serves");
    }

    nodes.signal(b, "STOP");
    // The first put whose key is b's goes over the silent link.
    let started = std::time::Instant::now();
    let refused = (keys.iter())
        .find_map(|k| put(&mut c, k).err())
        .expect("a put for set b's partition");
    let took = started.elapsed();
    nodes.signal(b, "CONT");
    match &refused {
        ClientError::Server { code, message } => {
            assert_eq!(*code, tarq_iproto::codes::ER_OUTCOME_UNKNOWN, "{message}");
            assert!(message.contains("nothing heard for 0.5 s"), "{message}");
        }
        other => panic!("expected the link's failure, got {other:?}"),
    }
    assert!(
        took < Duration::from_secs(5),
        "the put waited {took:?} for a link silent since"
    );
    assert!(nodes.log(a).contains("link to a replica set dropped"));
    // Set b back: the next call opens a new link, and puts reach b again.
    wait_for("every key served again", || {
        keys.iter().all(|k| put(&mut c, k).is_ok())
    });
}
