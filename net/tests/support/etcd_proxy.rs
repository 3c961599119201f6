//! A TCP proxy between the tarq nodes and etcd that can fail one chosen request, for the tests
//! of what a lost or late etcd answer does: the nodes are given the proxy's URL, and a fault
//! armed with [`EtcdProxy::arm`] strikes the first transaction that writes a given placement
//! change (the epoch key's value, `{"change": "<what>"}`, as `placement.rs` writes it).
//!
//! - [`Fault::LoseAnswer`]: the request goes to etcd, which applies it; its answer is thrown
//!   away and the node's connection closed, as a network that fails at that instant would.
//!   Every request of every node then waits `then_pause` before it goes on (etcd out of reach
//!   for that long), so no node learns what happened meanwhile from a read of its own.
//! - [`Fault::Hold`]: the request is held back, unsent, until [`EtcdProxy::release`]: a request
//!   still in flight (a slow network, a stalled etcd) that etcd applies late, even after its
//!   sender is gone.
//! - [`EtcdProxy::block`]: every request is held until [`EtcdProxy::unblock`] (the nodes behind
//!   the proxy cannot reach etcd for a while; others, given etcd itself, can).
//!
//! Requests are read as HTTP/1.1 with a `content-length` (the etcd client's POSTs); answers are
//! passed back as bytes. Every thread ends when its sockets close.

#![allow(dead_code)]

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::time::{Duration, Instant};

use base64::Engine as _;

use crate::support::WAIT;

/// What happens to the request a fault strikes.
#[derive(Clone, Copy, Debug)]
pub enum Fault {
    /// etcd applies it; its answer is lost; then every request waits this long.
    LoseAnswer { then_pause: Duration },
    /// It waits, unsent, for [`EtcdProxy::release`].
    Hold,
}

pub struct EtcdProxy {
    /// What the nodes are given as `--etcd`.
    pub url: String,
    shared: Arc<Shared>,
}

struct Shared {
    upstream: SocketAddr,
    state: Mutex<State>,
    changed: Condvar,
}

#[derive(Default)]
struct State {
    /// The armed fault: the base64 of the value its request writes, and the fault.
    armed: Option<(String, Fault)>,
    /// The armed request arrived.
    arrived: bool,
    /// etcd answered it (and, losing its answer, the answer was thrown away).
    answered: bool,
    /// A held request may go on.
    released: bool,
    /// The pause that follows the lost answer, once it is lost.
    pause: Option<Duration>,
    /// Every request waits until this instant.
    paused_until: Option<Instant>,
    /// Every request waits while this holds ([`EtcdProxy::block`]).
    blocked: bool,
}

impl EtcdProxy {
    /// A proxy on a loopback port of its own to the etcd at `etcd_url` (`http://host:port`).
    pub fn start(etcd_url: &str) -> EtcdProxy {
        let upstream: SocketAddr = etcd_url
            .trim_start_matches("http://")
            .parse()
            .expect("etcd's URL is http://ip:port");
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind the proxy");
        let url = format!("http://{}", listener.local_addr().unwrap());
        let shared = Arc::new(Shared {
            upstream,
            state: Mutex::default(),
            changed: Condvar::new(),
        });
        let s = Arc::clone(&shared);
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                let Ok(conn) = conn else { continue };
                let s = Arc::clone(&s);
                std::thread::spawn(move || s.serve(conn));
            }
        });
        EtcdProxy { url, shared }
    }

    /// Arms `fault` for the first transaction that writes placement change `what` (the text
    /// `placement.rs` puts in the epoch key, e.g. "move jobs partition 1 from a to b").
    pub fn arm(&self, what: &str, fault: Fault) {
        let value = serde_json::json!({ "change": what }).to_string();
        let needle = base64::engine::general_purpose::STANDARD.encode(value);
        let mut st = self.shared.lock();
        *st = State {
            armed: Some((needle, fault)),
            ..State::default()
        };
    }

    /// Waits until the armed request has come (a held one waits now).
    pub fn wait_arrived(&self) {
        self.wait("the armed etcd request to come", |st| st.arrived);
    }

    /// Waits until etcd has answered the armed request (its answer thrown away, for
    /// [`Fault::LoseAnswer`]).
    pub fn wait_answered(&self) {
        self.wait("etcd to answer the armed request", |st| st.answered);
    }

    fn wait(&self, what: &str, done: impl Fn(&State) -> bool) {
        let deadline = Instant::now() + WAIT * 4;
        let mut st = self.shared.lock();
        while !done(&st) {
            let left = deadline.saturating_duration_since(Instant::now());
            assert!(!left.is_zero(), "timed out waiting for {what}");
            st = (self.shared.changed.wait_timeout(st, left))
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
    }

    /// Holds every request from now on, unsent, until [`unblock`](Self::unblock): etcd out of
    /// reach of the nodes behind the proxy. Once this returns, no request reaches etcd.
    pub fn block(&self) {
        self.shared.lock().blocked = true;
    }

    /// Lets the requests [`block`](Self::block) held go on, and the next ones.
    pub fn unblock(&self) {
        self.shared.lock().blocked = false;
        self.shared.changed.notify_all();
    }

    /// Lets a held request go on to etcd.
    pub fn release(&self) {
        self.shared.lock().released = true;
        self.shared.changed.notify_all();
    }
}

impl Shared {
    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// One node's connection: requests read whole and passed on (or struck), answers piped
    /// back by a thread of their own.
    fn serve(self: Arc<Self>, mut client: TcpStream) {
        let Ok(mut upstream) = TcpStream::connect(self.upstream) else {
            return;
        };
        // What the next answer on this connection is: the armed request's (to be lost, or
        // only noted).
        let mark = Arc::new(Mutex::new(None));
        let answers = {
            let (from, to) = (upstream.try_clone().unwrap(), client.try_clone().unwrap());
            let (s, mark) = (Arc::clone(&self), Arc::clone(&mark));
            std::thread::spawn(move || s.pipe_answers(from, to, &mark))
        };
        while let Some(request) = read_request(&mut client) {
            self.wait_unpaused();
            let fault = self.strikes(&request);
            if let Some(Fault::Hold) = fault {
                self.wait_released();
            }
            *mark.lock().unwrap_or_else(PoisonError::into_inner) = fault;
            // Written under the lock, so a request is either sent before `block` returns or
            // held.
            let gate = self.wait_unblocked();
            if upstream.write_all(&request).is_err() {
                break;
            }
            drop(gate);
        }
        // The node is gone. A request sent on its behalf is still answered: etcd cancels one
        // whose connection it sees close, and a late request must reach it whole.
        let deadline = Instant::now() + Duration::from_secs(5);
        while !answers.is_finished() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = upstream.shutdown(Shutdown::Both);
        let _ = answers.join();
    }

    /// The fault `request` triggers, if it is the armed one (disarmed then).
    fn strikes(&self, request: &[u8]) -> Option<Fault> {
        let mut st = self.lock();
        let (needle, fault) = st.armed.as_ref()?;
        let body = String::from_utf8_lossy(request);
        if !body.contains("/v3/kv/txn") || !body.contains(needle.as_str()) {
            return None;
        }
        let fault = *fault;
        st.armed = None;
        st.arrived = true;
        if let Fault::LoseAnswer { then_pause } = fault {
            st.pause = Some(then_pause);
        }
        self.changed.notify_all();
        Some(fault)
    }

    fn wait_released(&self) {
        let mut st = self.lock();
        while !st.released {
            st = self
                .changed
                .wait(st)
                .unwrap_or_else(PoisonError::into_inner);
        }
    }

    /// The state's lock once no block holds requests.
    fn wait_unblocked(&self) -> std::sync::MutexGuard<'_, State> {
        let mut st = self.lock();
        while st.blocked {
            st = (self.changed.wait(st)).unwrap_or_else(PoisonError::into_inner);
        }
        st
    }

    fn wait_unpaused(&self) {
        loop {
            let until = self.lock().paused_until;
            match until {
                Some(t) if Instant::now() < t => std::thread::sleep(t - Instant::now()),
                _ => return,
            }
        }
    }

    /// etcd's answers back to the node. The armed request's answer is noted; if it is to be
    /// lost, it is thrown away and the node's connection closed.
    fn pipe_answers(&self, mut from: TcpStream, mut to: TcpStream, mark: &Mutex<Option<Fault>>) {
        let mut buf = vec![0; 64 << 10];
        loop {
            let n = match from.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => n,
            };
            let fault = mark.lock().unwrap_or_else(PoisonError::into_inner).take();
            if fault.is_some() {
                let mut st = self.lock();
                st.answered = true;
                st.paused_until = st.pause.take().map(|p| Instant::now() + p);
                self.changed.notify_all();
            }
            if let Some(Fault::LoseAnswer { .. }) = fault {
                let _ = to.shutdown(Shutdown::Both);
                let _ = from.shutdown(Shutdown::Both);
                return;
            }
            if to.write_all(&buf[..n]).is_err() {
                break;
            }
        }
        let _ = to.shutdown(Shutdown::Both);
    }
}

/// One whole HTTP/1.1 request (head and `content-length` body) as its bytes; `None` once the
/// connection ends.
fn read_request(conn: &mut TcpStream) -> Option<Vec<u8>> {
    let mut req = Vec::new();
    let mut byte = [0; 1];
    while !req.ends_with(b"\r\n\r\n") {
        match conn.read(&mut byte) {
            Ok(1) => req.push(byte[0]),
            _ => return None,
        }
    }
    let head = String::from_utf8_lossy(&req).to_ascii_lowercase();
    let len = head
        .lines()
        .find_map(|l| l.strip_prefix("content-length:"))
        .map_or(0, |n| n.trim().parse::<usize>().expect("a content-length"));
    assert!(
        !head.contains("transfer-encoding"),
        "the proxy reads only requests with a content-length"
    );
    let start = req.len();
    req.resize(start + len, 0);
    conn.read_exact(&mut req[start..]).ok()?;
    Some(req)
}
