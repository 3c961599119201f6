//! What the election tests share: a real etcd on loopback ports held for it, with its own data
//! directory (`Etcd`, killed on drop, pausable with SIGSTOP), a TCP relay that can black-hole
//! one node's traffic to etcd to cut it off like a network partition (`Relay`), a node under
//! test with its event log (`Node`), and the rule for the `etcd` binary (missing, the test
//! fails saying so).

#![allow(dead_code)]

use std::cell::RefCell;
use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine as _;
use rustix::process::{kill_process, Pid, Signal};
use tarq_cluster::{Cluster, Config, Event, EventKind};
use tarq_testkit::ports::Refusing;

/// Longest wait for any one event or condition: a failover takes a TTL plus a few polls, and a
/// loaded 2-core machine can stretch that.
pub const WAIT: Duration = Duration::from_secs(20);
/// Longest wait for etcd to answer its health check after starting.
const ETCD_START: Duration = Duration::from_secs(20);
/// Lease TTL of the nodes under test: the shortest etcd honours, so failovers are quick.
pub const TTL: Duration = Duration::from_secs(2);

// ---------------------------------------------------------------------------------------------
// etcd

pub struct Etcd {
    child: Child,
    pub client_url: String,
    pub client_addr: SocketAddr,
    dir: tempfile::TempDir,
    /// Its client and peer ports, held for it.
    _ports: (Refusing, Refusing),
}

/// An etcd to test against. A missing binary fails the test with the reason, in CI and out
/// of it: a test that cannot run never passes.
pub fn etcd() -> Etcd {
    match which("etcd") {
        Some(bin) => Etcd::start(bin),
        None => panic!(
            "etcd is required but is not on PATH (`bash .ci/test` installs the Debian package \
             etcd-server)"
        ),
    }
}

fn which(name: &str) -> Option<PathBuf> {
    std::env::var_os("PATH")
        .iter()
        .flat_map(std::env::split_paths)
        .map(|d| d.join(name))
        .find(|p| p.is_file())
}

impl Etcd {
    /// A fresh etcd on two ports held for it (it cannot report a port it got from port 0),
    /// once it answers its health check there.
    fn start(bin: PathBuf) -> Etcd {
        let dir = tempfile::tempdir().expect("temp dir");
        let ports = (Refusing::reserve(), Refusing::reserve());
        let client_url = format!("http://{}", ports.0.addr);
        let peer_url = format!("http://{}", ports.1.addr);
        let log = std::fs::File::create(dir.path().join("etcd.log")).expect("etcd log file");
        let child = Command::new(bin)
            .arg("--name=test")
            .arg(format!("--data-dir={}", dir.path().join("data").display()))
            .arg(format!("--listen-client-urls={client_url}"))
            .arg(format!("--advertise-client-urls={client_url}"))
            .arg(format!("--listen-peer-urls={peer_url}"))
            .arg(format!("--initial-advertise-peer-urls={peer_url}"))
            .arg(format!("--initial-cluster=test={peer_url}"))
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("dup log"))
            .stderr(log)
            .spawn()
            .expect("spawn etcd");
        let mut etcd = Etcd {
            child,
            client_addr: ports.0.addr,
            client_url,
            dir,
            _ports: ports,
        };
        let deadline = Instant::now() + ETCD_START;
        while !etcd.healthy() {
            if let Some(status) = etcd.child.try_wait().expect("try_wait etcd") {
                panic!("etcd exited with {status}; its log:\n{}", etcd.log());
            }
            assert!(
                Instant::now() < deadline,
                "etcd did not become healthy within {ETCD_START:?}; its log:\n{}",
                etcd.log()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        etcd
    }

    fn healthy(&self) -> bool {
        ureq::get(format!("{}/health", self.client_url))
            .call()
            .ok()
            .and_then(|mut r| r.body_mut().read_to_string().ok())
            .is_some_and(|body| body.contains("\"true\""))
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("etcd.log")).unwrap_or_default()
    }

    /// Our own child's pid stays its own: the child is not reaped before drop.
    fn signal(&self, sig: Signal) {
        kill_process(Pid::from_child(&self.child), sig)
            .unwrap_or_else(|e| panic!("kill({sig:?}) on etcd: {e}"));
    }

    /// Freezes etcd: connections stay open, nothing is answered.
    pub fn pause(&self) {
        self.signal(Signal::STOP);
    }

    pub fn resume(&self) {
        self.signal(Signal::CONT);
    }

    /// The JSON value stored under `key`, read straight from etcd's gateway.
    pub fn get_json(&self, key: &str) -> Option<serde_json::Value> {
        let body = serde_json::json!({ "key": B64.encode(key) }).to_string();
        let reply: serde_json::Value = ureq::post(format!("{}/v3/kv/range", self.client_url))
            .send(body)
            .expect("range request")
            .body_mut()
            .read_json_value();
        let value = reply["kvs"].get(0)?["value"].as_str()?.to_owned();
        Some(serde_json::from_slice(&B64.decode(value).expect("base64 value")).expect("json value"))
    }
}

impl Etcd {
    /// Writes `value` as JSON under `key`, straight through etcd's gateway, as an operator's
    /// `etcdctl put` would.
    pub fn put_json(&self, key: &str, value: &serde_json::Value) {
        let body = serde_json::json!({
            "key": B64.encode(key),
            "value": B64.encode(value.to_string()),
        })
        .to_string();
        ureq::post(format!("{}/v3/kv/put", self.client_url))
            .send(body)
            .expect("put request");
    }
}

trait ReadJson {
    fn read_json_value(&mut self) -> serde_json::Value;
}

impl ReadJson for ureq::Body {
    fn read_json_value(&mut self) -> serde_json::Value {
        serde_json::from_str(&self.read_to_string().expect("reply body")).expect("json reply")
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

// ---------------------------------------------------------------------------------------------
// A relay that can partition one node from etcd

/// Forwards connections to a target; when cut, it keeps every connection open but forwards
/// nothing either way, which is what a partition looks like to a client: calls hang until
/// their own timeout.
pub struct Relay {
    pub addr: SocketAddr,
    cut: Arc<AtomicBool>,
    open: Arc<Mutex<Vec<TcpStream>>>,
    closing: Arc<AtomicBool>,
}

impl Relay {
    pub fn new(target: SocketAddr) -> Relay {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind relay");
        let addr = listener.local_addr().expect("relay addr");
        let relay = Relay {
            addr,
            cut: Arc::default(),
            open: Arc::default(),
            closing: Arc::default(),
        };
        let (cut, open, closing) = (relay.cut.clone(), relay.open.clone(), relay.closing.clone());
        std::thread::spawn(move || {
            for client in listener.incoming() {
                if closing.load(Ordering::SeqCst) {
                    return;
                }
                let Ok(client) = client else { continue };
                let Ok(server) = TcpStream::connect(target) else {
                    continue;
                };
                let mut open = open.lock().unwrap();
                open.push(client.try_clone().unwrap());
                open.push(server.try_clone().unwrap());
                pump(
                    client.try_clone().unwrap(),
                    server.try_clone().unwrap(),
                    &cut,
                );
                pump(server, client, &cut);
            }
        });
        relay
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// From now on, nothing passes.
    pub fn cut(&self) {
        self.cut.store(true, Ordering::SeqCst);
    }

    /// Traffic passes again; the connections that lost bytes while cut are closed so clients
    /// open fresh ones.
    pub fn heal(&self) {
        for s in self.open.lock().unwrap().drain(..) {
            let _ = s.shutdown(Shutdown::Both);
        }
        self.cut.store(false, Ordering::SeqCst);
    }
}

fn pump(mut from: TcpStream, mut to: TcpStream, cut: &Arc<AtomicBool>) {
    let cut = cut.clone();
    std::thread::spawn(move || {
        let mut buf = [0u8; 16 * 1024];
        loop {
            match from.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(_) if cut.load(Ordering::SeqCst) => {}
                Ok(n) => {
                    if to.write_all(&buf[..n]).is_err() {
                        break;
                    }
                }
            }
        }
        let _ = to.shutdown(Shutdown::Write);
    });
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.closing.store(true, Ordering::SeqCst);
        let _ = TcpStream::connect(self.addr);
        self.heal();
    }
}

// ---------------------------------------------------------------------------------------------
// A node under test

/// Test timings: TTL 2 s (margin 500 ms), polls every 100 ms, settles 200 ms, calls get 500 ms.
pub fn config(endpoint: &str, name: &str) -> Config {
    let mut c = Config::new(
        vec![endpoint.to_owned()],
        "test",
        name,
        &format!("{name}.local:3301"),
    )
    .with_lease_ttl(TTL);
    c.poll_interval = Duration::from_millis(100);
    c.settle = Duration::from_millis(200);
    c.request_timeout = Duration::from_millis(500);
    c
}

pub struct Node {
    pub name: String,
    pub cluster: Cluster,
    pub wakes: Arc<AtomicUsize>,
    log: RefCell<Vec<Event>>,
    pending: RefCell<Vec<Event>>,
}

impl Node {
    pub fn start(config: Config) -> Node {
        let wakes = Arc::new(AtomicUsize::new(0));
        let counter = wakes.clone();
        let name = config.name.clone();
        let cluster = Cluster::start(
            config,
            Box::new(move || {
                counter.fetch_add(1, Ordering::SeqCst);
            }),
        )
        .expect("start the election thread");
        Node {
            name,
            cluster,
            wakes,
            log: RefCell::default(),
            pending: RefCell::default(),
        }
    }

    /// The first event that `pick` accepts, looking first at events already received but not
    /// yet accepted by an earlier wait, then at new ones; or a panic after `WAIT` listing every
    /// event seen.
    pub fn wait<T>(&self, what: &str, mut pick: impl FnMut(&Event) -> Option<T>) -> T {
        {
            let mut pending = self.pending.borrow_mut();
            for i in 0..pending.len() {
                if let Some(found) = pick(&pending[i]) {
                    pending.remove(i);
                    return found;
                }
            }
        }
        let deadline = Instant::now() + WAIT;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let Ok(event) = self.cluster.events().recv_timeout(left) else {
                panic!(
                    "{}: no {what} within {WAIT:?}; events seen: {:#?}",
                    self.name,
                    self.log.borrow()
                );
            };
            self.log.borrow_mut().push(event.clone());
            if let Some(found) = pick(&event) {
                return found;
            }
            self.pending.borrow_mut().push(event);
        }
    }

    pub fn wait_leader(&self) -> (u64, Instant) {
        self.wait("BecameLeader", |e| match e.kind {
            EventKind::BecameLeader { term } => Some((term, e.at)),
            _ => None,
        })
    }

    /// Waits for `Follow` of `leader` and returns its term.
    pub fn wait_follow(&self, leader: &str) -> u64 {
        self.wait(&format!("Follow of {leader}"), |e| match &e.kind {
            EventKind::Follow {
                leader: l,
                addr,
                term,
            } if l == leader => {
                assert_eq!(addr, &format!("{leader}.local:3301"));
                Some(*term)
            }
            _ => None,
        })
    }

    pub fn events_seen(&self) -> Vec<EventKind> {
        self.log.borrow().iter().map(|e| e.kind.clone()).collect()
    }
}

/// Polls `cond` until it holds or `WAIT` passes: for state that lives in etcd, which sends no
/// event.
pub fn wait_until(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + WAIT;
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}
