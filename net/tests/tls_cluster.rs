//! Mutual TLS between the nodes of a cluster on a real etcd (`--tls-ca`): a three-node replica
//! set fails over as it does in the clear, its replicas streaming over TLS from each new
//! primary; a sharded cluster's links carry forwarded puts and takes over TLS; and a node whose
//! certificate another CA signed gets no link (a move to it fails), the node that tried saying
//! why. Every node's port is TLS `optional`, so the test's plain clients read their state while
//! node-to-node traffic needs the cluster CA's certificate whatever the port allows.

#[path = "support/cluster.rs"]
mod cluster;
#[path = "support/pki.rs"]
mod pki;
mod support;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use cluster::{field, overview_at, peek_data, str_field, wait_for, Etcd, Nodes};
use pki::Pki;
use rmpv::Value;
use support::{Proc, Refusing, Tarq, BIN};
use tarq_client::{pack_args, Client};

/// A node's TLS flags: its port optional, its certificate, the cluster CA.
fn tls_args(node: &(PathBuf, PathBuf), ca: &Path) -> Vec<String> {
    [
        "--listen-tls",
        "optional",
        "--tls-cert",
        node.0.to_str().unwrap(),
        "--tls-key",
        node.1.to_str().unwrap(),
        "--tls-ca",
        ca.to_str().unwrap(),
    ]
    .map(String::from)
    .to_vec()
}

fn connect(addr: std::net::SocketAddr) -> Client {
    Client::connect_addr(addr, Duration::from_secs(10)).expect("connect")
}

#[test]
fn a_three_node_cluster_with_mutual_tls_fails_over_as_in_the_clear() {
    let dir = tempfile::tempdir().unwrap();
    let pki = Pki::new(dir.path());
    // One certificate for every node: they are told apart by name in etcd, not by certificate.
    let node = pki.node("node");
    let extra = tls_args(&node, &pki.ca());
    let extra: Vec<&str> = extra.iter().map(String::as_str).collect();
    let etcd = Etcd::start();
    let mut nodes = Nodes::start(&etcd, 3, &extra);
    let leader = nodes.wait_leader();
    let others: Vec<usize> = (0..3).filter(|&i| i != leader).collect();
    for &i in &others {
        nodes.wait_following(i);
    }
    let mut c = connect(nodes.nodes[leader].addr);
    let put = c
        .call("queue.put", &pack_args(&[Value::from("kept")]), None)
        .expect("put");
    let id = field(&put[0], "id")
        .and_then(Value::as_u64)
        .expect("the task's id");
    drop(c);
    // Replication is asynchronous here: the put is answered before the replicas have it, so
    // the kill waits until both hold it (over TLS) or a lost put would be correct behaviour.
    for &i in &others {
        wait_for(&format!("node {i} to hold the put"), || {
            peek_data(nodes.nodes[i].addr, id).as_deref() == Some("kept")
        });
    }
    nodes.kill(leader);
    let new = nodes.wait_leader_among(&others);
    let last = others.iter().copied().find(|&i| i != new).unwrap();
    nodes.wait_following(last);
    assert_eq!(
        peek_data(nodes.nodes[new].addr, id).as_deref(),
        Some("kept")
    );
    assert!(
        !nodes.log(new).contains("TLS connection failed"),
        "{}",
        nodes.log(new)
    );
}

#[test]
fn shard_links_run_over_mutual_tls_and_a_node_of_another_ca_gets_none() {
    let dir = tempfile::tempdir().unwrap();
    let pki = Pki::new(dir.path());
    let node = pki.node("node");
    let extra = tls_args(&node, &pki.ca());
    let extra: Vec<&str> = extra.iter().map(String::as_str).collect();
    let etcd = Etcd::start();
    let mut nodes = Nodes::start_sets(&etcd, &[("a", 1), ("b", 1)], &extra);
    nodes.wait_leader_among(&[0]);
    nodes.wait_leader_among(&[1]);
    let (a, b) = (nodes.nodes[0].addr, nodes.nodes[1].addr);

    // A tube over both sets: puts through a and takes through b cross the links both ways.
    let mut ca = connect(a);
    let opts = Value::Map(vec![("partitions".into(), Value::from(2))]);
    let args = pack_args(&[Value::from("jobs"), Value::from("fifo"), opts]);
    ca.call("queue.create_tube", &args, None)
        .expect("create_tube");
    for i in 0..10 {
        let args = pack_args(&[Value::from(format!("task {i}"))]);
        ca.call("queue.tube.jobs:put", &args, None)
            .unwrap_or_else(|e| panic!("put {i} through a: {e}"));
    }
    let mut cb = connect(b);
    for i in 0..10 {
        let got = cb
            .call("queue.tube.jobs:take", &pack_args(&[Value::from(5)]), None)
            .unwrap_or_else(|e| panic!("take {i} through b: {e}"));
        assert!(
            got.first().is_some_and(|t| !t.is_nil()),
            "take {i} through b found nothing: {got:?}"
        );
    }

    // A set whose node shows a certificate another CA signed: it joins etcd, but a partition
    // moved to it has no link to go over, and its owner says why.
    let foreign = pki.foreign_node("stranger");
    let port = Refusing::reserve();
    let data = dir.path().join("x0");
    let (addr, ca_path) = (port.addr.to_string(), pki.ca());
    let mut args = vec![
        "--listen",
        &addr,
        "--data-dir",
        data.to_str().unwrap(),
        "--etcd",
        &nodes.etcd_url,
        "--cluster",
        "c",
        "--node-name",
        "x0",
        "--replica-set",
        "x",
        "--lease-ttl",
        "2",
    ];
    let tls = tls_args(&foreign, &ca_path);
    args.extend(tls.iter().map(String::as_str));
    let _x = Tarq::start_with_args(tempfile::tempdir().unwrap(), &args);
    wait_for("x0 to lead set x", || {
        overview_at(port.addr).is_some_and(|o| str_field(&o, "role") == "leader")
    });
    let _move = Proc::spawn(
        Command::new(BIN)
            .args(["ctl", "--addr"])
            .arg(a.to_string())
            .args(["move", "jobs", "0", "--to", "x"])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null()),
    );
    wait_for(
        "the owner of partition 0 to say why it has no link to x",
        || {
            (0..2).any(|i| {
                let log = nodes.log(i);
                log.lines().any(|l| {
                    l.contains("link to a replica set") && l.contains("invalid peer certificate")
                })
            })
        },
    );
}

/// An etcd serving https only, asking its clients for a certificate the test CA signed.
struct TlsEtcd {
    _proc: Proc,
    url: String,
    _ports: (Refusing, Refusing),
}

impl TlsEtcd {
    fn start(pki: &Pki, dir: &Path) -> TlsEtcd {
        let bin = support::prerequisite("etcd (Debian package etcd-server)", support::tool("etcd"));
        let (cert, key) = pki.node("etcd");
        let ports = (Refusing::reserve(), Refusing::reserve());
        let url = format!("https://{}", ports.0.addr);
        let peer = format!("http://{}", ports.1.addr);
        let log = std::fs::File::create(dir.join("etcd.log")).unwrap();
        let proc = Proc::spawn(
            Command::new(bin)
                .arg("--name=test")
                .arg(format!("--data-dir={}", dir.join("etcd-data").display()))
                .arg(format!("--listen-client-urls={url}"))
                .arg(format!("--advertise-client-urls={url}"))
                .arg(format!("--listen-peer-urls={peer}"))
                .arg(format!("--initial-advertise-peer-urls={peer}"))
                .arg(format!("--initial-cluster=test={peer}"))
                .arg(format!("--cert-file={}", cert.display()))
                .arg(format!("--key-file={}", key.display()))
                .arg(format!("--trusted-ca-file={}", pki.ca().display()))
                .arg("--client-cert-auth")
                .stdin(std::process::Stdio::null())
                .stdout(log.try_clone().unwrap())
                .stderr(log),
        );
        let (client, client_key) = pki.node("etcd-client");
        wait_for("etcd to answer over TLS", || {
            Command::new("curl")
                .args(["-sf", "--cacert"])
                .arg(pki.ca())
                .arg("--cert")
                .arg(&client)
                .arg("--key")
                .arg(&client_key)
                .arg(format!("{url}/health"))
                .output()
                .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).contains("\"true\""))
        });
        TlsEtcd {
            _proc: proc,
            url,
            _ports: ports,
        }
    }
}

#[test]
fn nodes_reach_etcd_over_tls_with_their_certificate_and_without_one_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let pki = Pki::new(dir.path());
    let etcd = TlsEtcd::start(&pki, dir.path());
    let node = pki.node("node");
    let ca = pki.ca();
    let mut extra = vec![
        "--etcd-ca".to_string(),
        ca.to_str().unwrap().into(),
        "--etcd-cert".into(),
        node.0.to_str().unwrap().into(),
        "--etcd-key".into(),
        node.1.to_str().unwrap().into(),
    ];
    let args: Vec<&str> = extra.iter().map(String::as_str).collect();
    let nodes = Nodes::start_sets_at(&etcd.url, &[("a", 2)], &args);
    let leader = nodes.wait_leader_among(&[0, 1]);
    nodes.wait_following(1 - leader);

    // `tarq ctl` reaches the same etcd over TLS with the same flags (the URL from the node),
    // and without the CA says which flag it needs.
    let t = nodes.nodes[leader].tarq.as_ref().unwrap();
    let out = t.ctl(&["rebalance", "--dry-run"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("needs etcd-ca"),
        "{err}"
    );
    let mut ctl_args = vec!["rebalance", "--dry-run"];
    ctl_args.extend(args.iter().copied());
    let out = t.ctl(&ctl_args);
    let (stdout, err) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert!(out.status.success(), "{stdout}{err}");
    assert!(stdout.contains("balanced already"), "a plan: {stdout}");
    // `place` reads the map over TLS too: it gets as far as the tube it is asked for.
    let mut ctl_args = vec!["place", "nosuch", "0", "--to", "a"];
    ctl_args.extend(args.iter().copied());
    let out = t.ctl(&ctl_args);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("no tube \"nosuch\""), "{err}");

    // Without a client certificate etcd refuses the node (in TLS 1.3 after the handshake, which
    // the node sees as its connection cut): it says etcd is unavailable and never leads.
    extra.truncate(2);
    let args: Vec<&str> = extra.iter().map(String::as_str).collect();
    let mut lone = Nodes::start_sets_at(&etcd.url, &[("b", 1)], &args);
    let deadline = std::time::Instant::now() + support::WAIT;
    loop {
        let log = lone.log(0);
        if log.contains("etcd unavailable") && log.contains("https://") {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no refusal in the log:\n{log}"
        );
    }
    let role = lone.overview(0).map(|o| str_field(&o, "role"));
    assert_ne!(role.as_deref(), Some("leader"));
    assert!(nodes.overview(leader).is_some());
}
