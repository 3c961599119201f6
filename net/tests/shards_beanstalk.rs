//! beanstalk clients on a sharded cluster, end to end: replica sets a (two nodes) and b (one)
//! and one real etcd on loopback, every node serving the beanstalk port too. A client talks
//! to any node, over a tube of 4 partitions spread over both sets:
//! - jobs put through a replica of set a are reserved once each through set b's primary, in
//!   every state a job can be in: peeked, released, buried, kicked, deleted, by id and by
//!   tube, with `stats-job` and `stats-tube` (summed over the partitions) from every node;
//! - a job reserved by one connection is not another's to delete, and goes back to ready
//!   when its connection closes;
//! - a reserve waiting on the empty tube is woken by a put through another set's node, and
//!   the commands behind a forwarded one answer in the order sent;
//! - `use` of a new name places a tube through etcd, which every node then serves;
//! - a job reserved through a replica of its partition's owner is deleted there (the
//!   replica's copy of the job names a holder of the primary's, not of the replica's).
//!
//! Every wait has a deadline.

#[path = "support/beanstalk.rs"]
mod beanstalk;
#[path = "support/cluster.rs"]
mod cluster;
mod support;

use std::collections::HashSet;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use beanstalk::{Answer, Bs};
use cluster::{wait_for, Etcd, Nodes};
use rmpv::Value;
use tarq_beanstalk::Command;
use tarq_client::{pack_args, Client};

const JOBS: usize = 200;

/// The beanstalk address of each node, from its "serving the beanstalk protocol" line.
fn beanstalk_addrs(nodes: &mut Nodes) -> Vec<SocketAddr> {
    (0..nodes.nodes.len())
        .map(|i| {
            let t = nodes.nodes[i].tarq.as_mut().expect("running");
            let line = t.wait_for_line("serving the beanstalk protocol");
            support::addr_in(&line, "listen=").expect("the line names the address")
        })
        .collect()
}

/// Sets a (two nodes) and b (one) on `etcd`, every node serving beanstalk, with tube `jobs`
/// of `partitions` made through set a's primary and listed by every node: the nodes, the
/// indexes of a's primary, a's replica and b's primary, and each node's beanstalk address.
fn start_with_jobs(etcd: &Etcd, partitions: u64) -> (Nodes, [usize; 3], Vec<SocketAddr>) {
    let mut nodes = Nodes::start_sets(
        etcd,
        &[("a", 2), ("b", 1)],
        &["--beanstalk-listen", "127.0.0.1:0"],
    );
    let a = nodes.wait_leader_among(&[0, 1]);
    let b = nodes.wait_leader_among(&[2]);
    let bs = beanstalk_addrs(&mut nodes);
    let mut admin = Client::connect_addr(nodes.nodes[a].addr, Duration::from_secs(10)).unwrap();
    let opts = Value::Map(vec![(Value::from("partitions"), Value::from(partitions))]);
    let args = pack_args(&[Value::from("jobs"), Value::from("fifottl"), opts]);
    admin.call("queue.create_tube", &args, None).unwrap();
    for (i, &addr) in bs.iter().enumerate() {
        wait_for(&format!("node {i} to list the tube"), || {
            Bs::connect(addr)
                .call(&Command::ListTubes)
                .yaml_list()
                .contains(&"jobs".to_owned())
        });
    }
    (nodes, [a, 1 - a, b], bs)
}

fn use_tube(c: &mut Bs, tube: &str) {
    let a = c.call(&Command::Use { tube });
    assert_eq!(a.line, format!("USING {tube}"));
}

fn watch_only(c: &mut Bs, tube: &str) {
    assert_eq!(c.call(&Command::Watch { tube }).word(), "WATCHING");
    let a = c.call(&Command::Ignore { tube: "default" });
    assert_eq!(a.line, "WATCHING 1");
}

fn reserve(c: &mut Bs, seconds: i32) -> Answer {
    c.call(&Command::ReserveWithTimeout { seconds })
}

fn stats_tube(addr: SocketAddr, tube: &str, key: &str) -> u64 {
    let a = Bs::connect(addr).call(&Command::StatsTube { tube });
    assert_eq!(a.word(), "OK", "stats-tube {tube}: {a:?}");
    a.yaml(key)
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("{key} in {a:?}"))
}

#[test]
fn beanstalk_clients_reach_every_partition_through_any_node() {
    let etcd = Etcd::start();
    // The tube, placed over both sets through IPROTO.
    let (_nodes, [a, a_replica, b], bs) = start_with_jobs(&etcd, 4);
    for (i, &addr) in bs.iter().enumerate() {
        // Once, whatever partitions the node holds.
        let listed = Bs::connect(addr).call(&Command::ListTubes).yaml_list();
        assert_eq!(listed, ["default", "jobs"], "node {i}");
    }

    // Puts through a replica of set a: each is forwarded to a partition's owner.
    let mut producer = Bs::connect(bs[a_replica]);
    use_tube(&mut producer, "jobs");
    let mut ids = HashSet::new();
    for i in 0..JOBS {
        let id = producer.put(100, format!("job {i}").as_bytes());
        assert!(ids.insert(id), "id {id} given twice");
    }
    for (i, &addr) in bs.iter().enumerate() {
        assert_eq!(
            stats_tube(addr, "jobs", "total-jobs"),
            JOBS as u64,
            "node {i}"
        );
        assert_eq!(stats_tube(addr, "jobs", "current-jobs-ready"), JOBS as u64);
    }

    // Reserved through set b's primary, each once.
    let mut consumer = Bs::connect(bs[b]);
    watch_only(&mut consumer, "jobs");
    let mut bodies = HashSet::new();
    let mut held = Vec::new();
    for _ in 0..JOBS {
        let r = reserve(&mut consumer, 5);
        assert_eq!(r.word(), "RESERVED", "{r:?}");
        let id = r.number().unwrap();
        assert!(ids.contains(&id), "reserved an id never put: {id}");
        assert!(
            bodies.insert(r.body.clone().unwrap()),
            "a job reserved twice"
        );
        held.push(id);
    }
    assert_eq!(reserve(&mut consumer, 0).line, "TIMED_OUT");
    assert_eq!(
        stats_tube(bs[a], "jobs", "current-jobs-reserved"),
        JOBS as u64
    );

    // By id from any node: stats-job and peek reach the job's owner.
    let id = held[7];
    let job = Bs::connect(bs[a_replica]).call(&Command::StatsJob { id });
    assert_eq!(job.yaml("state").as_deref(), Some("reserved"), "{job:?}");
    assert_eq!(job.yaml("tube").as_deref(), Some("jobs"));
    assert_eq!(job.yaml("reserves").as_deref(), Some("1"));
    let peeked = Bs::connect(bs[a]).call(&Command::Peek { id });
    assert_eq!(
        peeked.line.split(' ').take(2).collect::<Vec<_>>(),
        ["FOUND", &id.to_string()]
    );

    // Another connection may not delete a job this one holds.
    let mut other = Bs::connect(bs[a]);
    assert_eq!(other.call(&Command::Delete { id }).line, "NOT_FOUND");

    // Release, bury, kick, all forwarded to the partitions' owners.
    let (released, buried) = (held[0], held[1]);
    let r = consumer.call(&Command::Release {
        id: released,
        pri: 5,
        delay: 0,
    });
    assert_eq!(r.line, "RELEASED");
    let b1 = consumer.call(&Command::Bury { id: buried, pri: 9 });
    assert_eq!(b1.line, "BURIED");
    assert_eq!(stats_tube(bs[a_replica], "jobs", "current-jobs-buried"), 1);
    assert_eq!(stats_tube(bs[a_replica], "jobs", "current-jobs-urgent"), 1);
    let p = producer.call(&Command::PeekReady);
    assert_eq!(p.number(), Some(released), "{p:?}");
    let p = producer.call(&Command::PeekBuried);
    assert_eq!(p.number(), Some(buried), "{p:?}");
    assert_eq!(producer.call(&Command::Kick { bound: 10 }).line, "KICKED 1");
    let mut again = HashSet::new();
    for _ in 0..2 {
        let r = reserve(&mut consumer, 5);
        assert_eq!(r.word(), "RESERVED", "{r:?}");
        again.insert(r.number().unwrap());
    }
    assert_eq!(again, HashSet::from([released, buried]));
    let job = Bs::connect(bs[b]).call(&Command::StatsJob { id: buried });
    assert_eq!(job.yaml("buries").as_deref(), Some("1"), "{job:?}");
    assert_eq!(job.yaml("kicks").as_deref(), Some("1"), "{job:?}");

    // Deleted, pipelined: every reply in the order sent, though the owners differ.
    let mut burst = Vec::new();
    for &id in &held[..JOBS - 1] {
        Command::Delete { id }.encode(&mut burst);
    }
    Command::StatsTube { tube: "jobs" }.encode(&mut burst);
    consumer.send_raw(&burst).unwrap();
    for _ in 0..JOBS - 1 {
        assert_eq!(consumer.recv().line, "DELETED");
    }
    let s = consumer.recv();
    assert_eq!(
        s.yaml("current-jobs-reserved").as_deref(),
        Some("1"),
        "{s:?}"
    );
    assert_eq!(s.yaml("total-jobs").as_deref(), Some(&*JOBS.to_string()));

    // The last held job goes back to ready when its connection closes.
    drop(consumer);
    wait_for("the closed connection's job to be ready", || {
        stats_tube(bs[a], "jobs", "current-jobs-ready") == 1
    });
    let mut consumer = Bs::connect(bs[a]);
    watch_only(&mut consumer, "jobs");
    let r = reserve(&mut consumer, 5);
    assert_eq!(r.number(), Some(held[JOBS - 1]), "{r:?}");
    assert_eq!(
        consumer.call(&Command::Delete { id: held[JOBS - 1] }).line,
        "DELETED"
    );

    // A reserve waiting on the empty tube is woken by a put through another set's node.
    consumer
        .send(&Command::ReserveWithTimeout { seconds: 20 })
        .unwrap();
    consumer.send(&Command::ListTubeUsed).unwrap();
    assert!(consumer
        .recv_within(Duration::from_millis(300))
        .unwrap_err()
        .kind()
        .eq(&std::io::ErrorKind::TimedOut));
    let started = Instant::now();
    let mut late = Bs::connect(bs[b]);
    use_tube(&mut late, "jobs");
    let id = late.put(1, b"late");
    let r = consumer.recv();
    assert_eq!((r.word(), r.number()), ("RESERVED", Some(id)), "{r:?}");
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "{:?}",
        started.elapsed()
    );
    // The command sent behind the reserve answers after it.
    assert_eq!(consumer.recv().line, "USING default");

    // `use` of a new name on a primary places a tube that every node serves.
    let mut maker = Bs::connect(bs[b]);
    use_tube(&mut maker, "made");
    let made = maker.put(3, b"made here");
    for (i, &addr) in bs.iter().enumerate() {
        wait_for(&format!("node {i} to serve the new tube"), || {
            Bs::connect(addr)
                .call(&Command::ListTubes)
                .yaml_list()
                .contains(&"made".to_owned())
        });
    }
    let mut taker = Bs::connect(bs[a_replica]);
    watch_only(&mut taker, "made");
    let r = reserve(&mut taker, 5);
    assert_eq!(
        (r.number(), r.body.as_deref()),
        (Some(made), Some(&b"made here"[..]))
    );
    assert_eq!(taker.call(&Command::Delete { id: made }).line, "DELETED");
}

/// A job of set a's partition, reserved through a replica of set a, is deleted through that
/// replica. The replica holds a copy of the job (it streams set a's log) whose holder is a
/// session of set a's primary, numbered there: the replica's beanstalk port took that copy's
/// holder for the job's and answered `NOT_FOUND` without asking the owner (seen in CI once
/// in about fifteen runs of the test above, when its tube `made` was placed on set a).
#[test]
fn a_job_reserved_through_a_replica_of_its_owner_is_deleted_there() {
    let etcd = Etcd::start();
    let (nodes, [a, a_replica, b], bs) = start_with_jobs(&etcd, 2);
    // Put through set a's primary: into the partition it leads.
    let mut producer = Bs::connect(bs[a]);
    use_tube(&mut producer, "jobs");
    let id = producer.put(1, b"mine");
    let mut consumer = Bs::connect(bs[a_replica]);
    watch_only(&mut consumer, "jobs");
    let r = reserve(&mut consumer, 5);
    assert_eq!((r.word(), r.number()), ("RESERVED", Some(id)), "{r:?}");
    // The replica's copy shows the job taken (by a session of the primary).
    let mut replica =
        Client::connect_addr(nodes.nodes[a_replica].addr, Duration::from_secs(10)).unwrap();
    wait_for("the replica's copy of the job to be taken", || {
        let stats = replica.call("queue.stats", &pack_args(&[]), None).unwrap();
        let stats = stats.into_iter().next().unwrap_or(Value::Nil);
        cluster::field(&stats, "taken").and_then(Value::as_u64) == Some(1)
    });
    assert_eq!(consumer.call(&Command::Delete { id }).line, "DELETED");
    let gone = Bs::connect(bs[b]).call(&Command::StatsJob { id });
    assert_eq!(gone.line, "NOT_FOUND", "{gone:?}");
}
