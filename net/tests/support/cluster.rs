//! What the failover tests share: a real etcd on loopback ports held for it (`Etcd`, killed on
//! drop, pausable with SIGSTOP), a cluster of real
//! `tarq` processes on fixed ports held for them (`Nodes`, their data directories kept across
//! kills), and a client that follows the leader as a user's would (`Writer`: on a refusal or a
//! dropped connection it asks the nodes who leads). A missing `etcd` fails the test with the
//! reason.

#![allow(dead_code)]

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use rmpv::Value;
use tarq_client::{pack_args, Client as Blocking, ClientError};

use crate::support::{prerequisite, tool, Refusing, Tarq, WAIT};

/// Lease TTL of the nodes under test: the shortest etcd honours, so failovers are quick.
pub const TTL_SECS: u64 = 2;

pub struct Etcd {
    child: Child,
    pub url: String,
    addr: SocketAddr,
    dir: tempfile::TempDir,
    /// Its client and peer ports, held for it: etcd cannot report a port it got from port 0.
    _ports: (Refusing, Refusing),
}

impl Etcd {
    /// A fresh etcd on two ports held for it, once it answers its health check there.
    pub fn start() -> Etcd {
        let bin = prerequisite("etcd (Debian package etcd-server)", tool("etcd"));
        let dir = tempfile::tempdir().unwrap();
        let ports = (Refusing::reserve(), Refusing::reserve());
        let (client, peer) = (ports.0.addr, ports.1.addr);
        let url = format!("http://{client}");
        let peer_url = format!("http://{peer}");
        let log = std::fs::File::create(dir.path().join("etcd.log")).unwrap();
        let child = Command::new(bin)
            .arg("--name=test")
            .arg(format!("--data-dir={}", dir.path().join("data").display()))
            .arg(format!("--listen-client-urls={url}"))
            .arg(format!("--advertise-client-urls={url}"))
            .arg(format!("--listen-peer-urls={peer_url}"))
            .arg(format!("--initial-advertise-peer-urls={peer_url}"))
            .arg(format!("--initial-cluster=test={peer_url}"))
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("spawn etcd");
        let mut etcd = Etcd {
            child,
            url,
            addr: client,
            dir,
            _ports: ports,
        };
        wait_for("etcd to answer its health check", || {
            if let Some(status) = etcd.child.try_wait().unwrap() {
                panic!(
                    "etcd exited with {status}; its log:\n{}",
                    std::fs::read_to_string(etcd.dir.path().join("etcd.log")).unwrap_or_default()
                );
            }
            etcd.healthy()
        });
        etcd
    }

    fn healthy(&self) -> bool {
        let Ok(mut s) = TcpStream::connect(self.addr) else {
            return false;
        };
        let _ = s.set_read_timeout(Some(Duration::from_secs(2)));
        let req = "GET /health HTTP/1.1\r\nHost: etcd\r\nConnection: close\r\n\r\n";
        let mut resp = String::new();
        s.write_all(req.as_bytes()).is_ok()
            && s.read_to_string(&mut resp).is_ok()
            && resp.contains("\"true\"")
    }

    fn signal(&self, sig: &str) {
        let ok = Command::new("kill")
            .args([&format!("-{sig}"), &self.child.id().to_string()])
            .status()
            .unwrap()
            .success();
        assert!(ok, "kill -{sig} etcd");
    }

    /// Freezes etcd: connections stay open, nothing is answered.
    pub fn pause(&self) {
        self.signal("STOP");
    }

    pub fn resume(&self) {
        self.signal("CONT");
    }
}

impl Drop for Etcd {
    fn drop(&mut self) {
        // One that exited at start (its port taken) has nothing to resume.
        if matches!(self.child.try_wait(), Ok(None)) {
            self.resume();
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Waits until `cond` holds, checking every 20 ms, failing after [`WAIT`].
pub fn wait_for(what: &str, cond: impl FnMut() -> bool) {
    wait_for_or(what, cond, String::new);
}

/// [`wait_for`], failing with what `explain` says then (the nodes' views, for a post-mortem).
pub fn wait_for_or(what: &str, mut cond: impl FnMut() -> bool, explain: impl FnOnce() -> String) {
    let deadline = Instant::now() + WAIT;
    while !cond() {
        if Instant::now() >= deadline {
            panic!("timed out waiting for {what}{}", explain());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// One node: its name, fixed port, and the process while it runs (its directory outlives it).
pub struct Node {
    pub name: String,
    pub addr: SocketAddr,
    /// Holds the node's port for the whole test, while it runs and while it is down between a
    /// kill and a restart, so no other test's server gets it (etcd advertises the address).
    _port: Refusing,
    pub tarq: Option<Tarq>,
    dir: Option<tempfile::TempDir>,
    /// Flags of this node's own (its replica set).
    own: Vec<String>,
    /// Environment of this node's own (a wall clock set off by libfaketime).
    env: Vec<(String, String)>,
}

/// A cluster of tarq nodes on one etcd.
pub struct Nodes {
    pub etcd_url: String,
    pub nodes: Vec<Node>,
    extra: Vec<String>,
}

impl Nodes {
    /// Starts `n` nodes named n0, n1, ... with `extra` flags each.
    pub fn start(etcd: &Etcd, n: usize, extra: &[&str]) -> Nodes {
        let mut nodes = Nodes {
            etcd_url: etcd.url.clone(),
            nodes: (0..n)
                .map(|i| {
                    let port = Refusing::reserve();
                    Node {
                        name: format!("n{i}"),
                        addr: port.addr,
                        _port: port,
                        tarq: None,
                        dir: Some(tempfile::tempdir().unwrap()),
                        own: Vec::new(),
                        env: Vec::new(),
                    }
                })
                .collect(),
            extra: extra.iter().map(|s| s.to_string()).collect(),
        };
        for i in 0..n {
            nodes.start_node(i);
        }
        nodes
    }

    /// Starts the replica sets `sets` (name, nodes) of one sharded cluster: node `<set><i>`
    /// with `--replica-set <set>` and `extra`, in the order given.
    pub fn start_sets(etcd: &Etcd, sets: &[(&str, usize)], extra: &[&str]) -> Nodes {
        Nodes::start_sets_at(&etcd.url, sets, extra)
    }

    /// [`start_sets`](Self::start_sets) with etcd at `etcd_url` (a proxy in front of it).
    pub fn start_sets_at(etcd_url: &str, sets: &[(&str, usize)], extra: &[&str]) -> Nodes {
        Nodes::start_sets_with(etcd_url, sets, extra, |_| Vec::new())
    }

    /// [`start_sets_at`](Self::start_sets_at), each node of set `s` with the environment
    /// `env_of(s)` besides.
    pub fn start_sets_with(
        etcd_url: &str,
        sets: &[(&str, usize)],
        extra: &[&str],
        env_of: impl Fn(&str) -> Vec<(String, String)>,
    ) -> Nodes {
        let mut nodes = Nodes {
            etcd_url: etcd_url.to_owned(),
            nodes: Vec::new(),
            extra: extra.iter().map(|s| s.to_string()).collect(),
        };
        for (set, n) in sets {
            for i in 0..*n {
                let port = Refusing::reserve();
                nodes.nodes.push(Node {
                    name: format!("{set}{i}"),
                    addr: port.addr,
                    _port: port,
                    tarq: None,
                    dir: Some(tempfile::tempdir().unwrap()),
                    own: vec!["--replica-set".into(), set.to_string()],
                    env: env_of(set),
                });
            }
        }
        for i in 0..nodes.nodes.len() {
            nodes.start_node(i);
        }
        nodes
    }

    /// Adds a node of replica set `set` to a running cluster (named `<set><i>`, `i` the next
    /// number in that set, with the cluster's extra flags) and starts it; its index.
    pub fn add_set_node(&mut self, set: &str) -> usize {
        let own = vec!["--replica-set".to_string(), set.to_string()];
        let i = self.nodes.iter().filter(|n| n.own == own).count();
        let port = Refusing::reserve();
        self.nodes.push(Node {
            name: format!("{set}{i}"),
            addr: port.addr,
            _port: port,
            tarq: None,
            dir: Some(tempfile::tempdir().unwrap()),
            own,
            env: Vec::new(),
        });
        let n = self.nodes.len() - 1;
        self.start_node(n);
        n
    }

    /// The node among `among` that says it leads its set.
    pub fn leader_among(&self, among: &[usize]) -> Option<usize> {
        among.iter().copied().find(|&i| {
            self.nodes[i].tarq.is_some()
                && self
                    .overview(i)
                    .is_some_and(|o| str_field(&o, "role") == "leader")
        })
    }

    pub fn wait_leader_among(&self, among: &[usize]) -> usize {
        let mut found = None;
        wait_for("a leader of the set", || {
            found = self.leader_among(among);
            found.is_some()
        });
        found.unwrap()
    }

    pub fn start_node(&mut self, i: usize) {
        let node = &mut self.nodes[i];
        let dir = node.dir.take().expect("the node is not running");
        let data = dir.path().join("data");
        let addr = node.addr.to_string();
        let mut args = vec![
            "--listen",
            &addr,
            "--data-dir",
            data.to_str().unwrap(),
            "--etcd",
            &self.etcd_url,
            "--cluster",
            "c",
            "--node-name",
            &node.name,
        ];
        // Short, so failovers are quick, unless a test sets its own.
        if !self.extra.iter().any(|a| a == "--lease-ttl") {
            args.extend(["--lease-ttl", "2"]);
        }
        args.extend(self.extra.iter().map(String::as_str));
        args.extend(node.own.iter().map(String::as_str));
        let mut cmd = Command::new(crate::support::BIN);
        cmd.args(&args).envs(node.env.iter().map(|(k, v)| (k, v)));
        node.tarq = Some(Tarq::spawn_cmd(dir, cmd));
    }

    /// kill -9 node `i`; its data directory stays for a restart.
    pub fn kill(&mut self, i: usize) {
        let mut t = self.nodes[i].tarq.take().expect("running");
        t.signal("KILL");
        t.wait_exit();
        self.nodes[i].dir = Some(t.take_dir());
    }

    pub fn signal(&self, i: usize, sig: &str) {
        self.nodes[i].tarq.as_ref().expect("running").signal(sig);
    }

    /// `queue.cluster()` of node `i`, if it answers within a second.
    pub fn overview(&self, i: usize) -> Option<Value> {
        let mut c = Blocking::connect_addr(self.nodes[i].addr, Duration::from_secs(1)).ok()?;
        // Nodes started with --user: the test's user, as a client of theirs would be.
        if let Some(at) = self.extra.iter().position(|a| a == "--user") {
            let password_at = self.extra.iter().position(|a| a == "--password")?;
            let (user, password) = (&self.extra[at + 1], &self.extra[password_at + 1]);
            c.auth(user, password).ok()?;
        }
        c.call("queue.cluster", &pack_args(&[]), None)
            .ok()?
            .into_iter()
            .next()
    }

    /// Whether node `i` says it is a replica streaming from its primary.
    pub fn follows(&self, i: usize) -> bool {
        self.overview(i).is_some_and(|o| {
            str_field(&o, "role") == "replica"
                && field(&o, "upstream")
                    .and_then(|u| field(u, "connected"))
                    .and_then(Value::as_u64)
                    == Some(1)
        })
    }

    /// Creates tube `name` of `kind` in `partitions` partitions through `c` (a client of a node
    /// that may), and waits until every running node knows it (`queue.statistics` answers).
    pub fn create_tube(&self, c: &mut Blocking, name: &str, kind: &str, partitions: u64) {
        let opts = Value::Map(vec![(Value::from("partitions"), Value::from(partitions))]);
        let args = pack_args(&[Value::from(name), Value::from(kind), opts]);
        (c.call("queue.create_tube", &args, None))
            .unwrap_or_else(|e| panic!("create_tube {name}: {e}"));
        let stats = pack_args(&[Value::from(name)]);
        for n in self.nodes.iter().filter(|n| n.tarq.is_some()) {
            wait_for(&format!("node {} to know tube {name}", n.name), || {
                Blocking::connect_addr(n.addr, Duration::from_secs(3))
                    .is_ok_and(|mut c| c.call("queue.statistics", &stats, None).is_ok())
            });
        }
    }

    /// Waits until nodes `among` each see `sets` replica sets with a primary in their own
    /// view of the cluster (`queue.cluster()`'s `sets`).
    pub fn wait_primaries_known(&self, among: &[usize], sets: usize) {
        for &i in among {
            wait_for("every set's primary known", || {
                self.overview(i).is_some_and(|o| {
                    let known = field(&o, "sets").and_then(Value::as_array).cloned();
                    let led = (known.unwrap_or_default().iter())
                        .filter(|s| field(s, "primary").is_some_and(|p| !p.is_nil()))
                        .count();
                    led == sets
                })
            });
        }
    }

    /// Waits until node `i` follows its primary with its stream up; on a timeout, says what
    /// every running node reports of the cluster (`queue.cluster()`), for the post-mortem.
    pub fn wait_following(&self, i: usize) {
        let explain = || {
            let seen: Vec<String> = (0..self.nodes.len())
                .filter(|&n| self.nodes[n].tarq.is_some())
                .map(|n| format!("node {n}: {:?}", self.overview(n)))
                .collect();
            format!("; the nodes say:\n{}", seen.join("\n"))
        };
        wait_for_or(
            &format!("node {i} to stream from the primary"),
            || self.follows(i),
            explain,
        );
    }

    /// The node that says it leads, among those running.
    pub fn leader(&self) -> Option<usize> {
        (0..self.nodes.len())
            .filter(|&i| self.nodes[i].tarq.is_some())
            .find(|&i| {
                self.overview(i)
                    .is_some_and(|o| str_field(&o, "role") == "leader")
            })
    }

    pub fn wait_leader(&self) -> usize {
        let mut found = None;
        wait_for("a leader", || {
            found = self.leader();
            found.is_some()
        });
        found.unwrap()
    }

    /// Every node's log so far, each headed by its name, for a failure message.
    pub fn logs(&mut self) -> String {
        let logs: Vec<String> = (0..self.nodes.len())
            .map(|i| format!("n{i}:\n{}", self.log(i)))
            .collect();
        logs.join("\n")
    }

    /// Every log line of node `i` so far (those written in the next 100 ms too), for a
    /// failure message; connection lines left out.
    pub fn log(&mut self, i: usize) -> String {
        let Some(t) = self.nodes[i].tarq.as_mut() else {
            return "(not running)".into();
        };
        t.lines.drain(Duration::from_millis(100));
        let lines: Vec<&str> = t
            .log()
            .iter()
            .map(String::as_str)
            .filter(|l| !l.contains("connection opened") && !l.contains("connection closed"))
            .collect();
        lines.join("\n")
    }
}

pub fn field<'a>(v: &'a Value, key: &str) -> Option<&'a Value> {
    v.as_map()?
        .iter()
        .find(|(k, _)| k.as_str() == Some(key))
        .map(|(_, v)| v)
}

pub fn str_field(v: &Value, key: &str) -> String {
    field(v, key)
        .and_then(|v| v.as_str())
        .unwrap_or_default()
        .to_owned()
}

/// What a put came to.
#[derive(Debug)]
pub enum Put {
    /// Acknowledged by node `node`: the task's id.
    Acked { id: u64, node: usize },
    /// Refused by a node that does not lead (its message).
    Refused(String),
    /// No answer: the connection failed or closed (the outcome is unknown).
    Lost(String),
}

/// `queue.cluster()` of the node at `addr`, if it answers within a second.
pub fn overview_at(addr: SocketAddr) -> Option<Value> {
    let mut c = Blocking::connect_addr(addr, Duration::from_secs(1)).ok()?;
    c.call("queue.cluster", &pack_args(&[]), None)
        .ok()?
        .into_iter()
        .next()
}

/// A client of the cluster, as a user's would be: one connection to whichever node it last
/// found leading; a refusal or a dropped connection sends it looking again.
pub struct Writer {
    addrs: Vec<SocketAddr>,
    conn: Option<(usize, Blocking)>,
}

impl Writer {
    pub fn new(nodes: &Nodes) -> Self {
        Writer {
            addrs: nodes.nodes.iter().map(|n| n.addr).collect(),
            conn: None,
        }
    }

    fn find_leader(&self) -> Option<usize> {
        (0..self.addrs.len()).find(|&i| {
            overview_at(self.addrs[i]).is_some_and(|o| str_field(&o, "role") == "leader")
        })
    }

    /// One put of `data` to the node last found leading (found first if none).
    pub fn put_once(&mut self, data: &str) -> Put {
        if self.conn.is_none() {
            let Some(i) = self.find_leader() else {
                return Put::Lost("no leader found".into());
            };
            match Blocking::connect_addr(self.addrs[i], Duration::from_secs(2)) {
                Ok(c) => self.conn = Some((i, c)),
                Err(e) => return Put::Lost(e.to_string()),
            }
        }
        let (node, c) = self.conn.as_mut().unwrap();
        let node = *node;
        match c.call("queue.put", &pack_args(&[Value::from(data)]), None) {
            Ok(v) => {
                let task = v.into_iter().next().expect("a task");
                let id = field(&task, "id").and_then(Value::as_u64).expect("an id");
                Put::Acked { id, node }
            }
            Err(ClientError::Server { message, .. }) => {
                self.conn = None;
                Put::Refused(message)
            }
            Err(e) => {
                self.conn = None;
                Put::Lost(e.to_string())
            }
        }
    }
}

/// The payload of task `id` on the node at `addr` (seed API), if it has it.
pub fn peek_data(addr: SocketAddr, id: u64) -> Option<String> {
    let mut c = Blocking::connect_addr(addr, WAIT).expect("connect");
    let v = c
        .call(
            "queue.tube.default:peek",
            &pack_args(&[Value::from(id)]),
            None,
        )
        .ok()?;
    let t = v.into_iter().next()?;
    t.as_array()?.get(2)?.as_str().map(str::to_owned)
}
