//! Shared harness for the end-to-end tests: a server started in-process on a free port with a
//! temporary data dir (stopped on drop), and a blocking raw-frame client built on the codec's
//! client side. Every wait has a deadline; nothing sleeps a fixed time.
#![allow(dead_code)] // each test binary uses a different part of the harness

use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use rmpv::Value;
use tarq_net::config::Config;
use tarq_net::iproto::client::{self, Greeting, GREETING_LEN};
use tarq_net::iproto::split_frame;
use tarq_net::server::{Server, ServerHandle};

/// How long any single wait in a test may take before it fails.
pub const WAIT: Duration = Duration::from_secs(10);

pub struct TestServer {
    pub addr: SocketAddr,
    handle: ServerHandle,
    thread: Option<JoinHandle<std::io::Result<()>>>,
    _dir: tempfile::TempDir,
}

impl TestServer {
    pub fn start() -> TestServer {
        TestServer::with(|_| {})
    }

    pub fn with(tweak: impl FnOnce(&mut Config)) -> TestServer {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut cfg = Config {
            listen: "127.0.0.1:0".parse().unwrap(),
            data_dir: dir.path().join("data"),
            ..Config::default()
        };
        tweak(&mut cfg);
        let mut server = Server::bind(cfg).expect("server binds");
        let addr = server.local_addr().unwrap();
        let handle = server.handle();
        let thread = std::thread::spawn(move || server.run());
        TestServer {
            addr,
            handle,
            thread: Some(thread),
            _dir: dir,
        }
    }

    /// Asks the server to stop (gracefully); `Drop` still waits for it.
    pub fn shutdown(&self) {
        self.handle.shutdown();
    }

    pub fn connect(&self) -> Client {
        Client::connect(self.addr)
    }
}

impl Drop for TestServer {
    fn drop(&mut self) {
        self.handle.shutdown();
        if let Some(t) = self.thread.take() {
            let res = t.join().expect("server thread panicked");
            if !std::thread::panicking() {
                res.expect("server loop failed");
            }
        }
    }
}

/// A decoded reply, owned.
#[derive(Debug, Clone, PartialEq)]
pub struct Reply {
    pub sync: u64,
    pub code: u32,
    pub schema_version: Option<u64>,
    pub data: Option<Value>,
    pub error: Option<String>,
    pub has_stack: bool,
    pub body: Vec<u8>,
}

impl Reply {
    /// The DATA array, asserting the reply is OK.
    pub fn ok(&self) -> Vec<Value> {
        assert_eq!(self.code, 0, "expected OK, got {self:?}");
        match &self.data {
            Some(Value::Array(a)) => a.clone(),
            other => panic!("no DATA array: {other:?}"),
        }
    }

    /// The single task (or stats map) a queue call returned.
    pub fn one(&self) -> Value {
        let d = self.ok();
        assert_eq!(d.len(), 1, "expected one value, got {d:?}");
        d[0].clone()
    }

    /// The error message, asserting the code.
    pub fn err(&self, code: u32) -> String {
        assert_eq!(self.code, code, "expected error {code}, got {self:?}");
        self.error.clone().expect("error message")
    }
}

/// A field of a map with string keys.
pub fn field<'a>(v: &'a Value, key: &str) -> &'a Value {
    v.as_map()
        .unwrap_or_else(|| panic!("not a map: {v}"))
        .iter()
        .find(|(k, _)| k.as_str() == Some(key))
        .map(|(_, v)| v)
        .unwrap_or_else(|| panic!("no key {key} in {v}"))
}

pub fn id_of(task: &Value) -> u64 {
    field(task, "id").as_u64().expect("id is a uint")
}

pub fn status_of(task: &Value) -> &str {
    field(task, "status").as_str().expect("status is a string")
}

/// Encodes call arguments.
pub fn args(values: &[Value]) -> Vec<u8> {
    let mut out = Vec::new();
    rmpv::encode::write_value(&mut out, &Value::Array(values.to_vec())).unwrap();
    out
}

pub fn map(pairs: &[(&str, Value)]) -> Value {
    Value::Map(
        pairs
            .iter()
            .map(|(k, v)| (Value::from(*k), v.clone()))
            .collect(),
    )
}

pub struct Client {
    pub stream: TcpStream,
    pub greeting: Greeting,
    buf: Vec<u8>,
    next_sync: u64,
}

impl Client {
    pub fn connect(addr: SocketAddr) -> Client {
        let mut stream = TcpStream::connect(addr).expect("connect");
        stream.set_read_timeout(Some(WAIT)).unwrap();
        stream.set_nodelay(true).unwrap();
        let mut g = [0u8; GREETING_LEN];
        stream.read_exact(&mut g).expect("greeting");
        let greeting = client::parse_greeting(&g).expect("valid greeting");
        Client {
            stream,
            greeting,
            buf: Vec::new(),
            next_sync: 1,
        }
    }

    pub fn send(&mut self, bytes: &[u8]) {
        self.stream.write_all(bytes).expect("send");
    }

    fn sync(&mut self) -> u64 {
        let s = self.next_sync;
        self.next_sync += 1;
        s
    }

    /// Sends a CALL; returns its sync.
    pub fn send_call(&mut self, function: &str, a: &[Value]) -> u64 {
        let sync = self.sync();
        let mut out = Vec::new();
        client::call(&mut out, sync, function, &args(a));
        self.send(&out);
        sync
    }

    /// A CALL and its reply (asserting the sync matches).
    pub fn call(&mut self, function: &str, a: &[Value]) -> Reply {
        let sync = self.send_call(function, a);
        let r = self.recv();
        assert_eq!(r.sync, sync, "reply to another request: {r:?}");
        r
    }

    pub fn call16(&mut self, function: &str, a: &[Value]) -> Reply {
        let sync = self.sync();
        let mut out = Vec::new();
        client::call16(&mut out, sync, function, &args(a));
        self.send(&out);
        let r = self.recv();
        assert_eq!(r.sync, sync);
        r
    }

    pub fn ping(&mut self) -> Reply {
        let sync = self.sync();
        let mut out = Vec::new();
        client::ping(&mut out, sync);
        self.send(&out);
        let r = self.recv();
        assert_eq!(r.sync, sync);
        r
    }

    /// Sends a request built by `build(out, sync)` and returns its reply.
    pub fn request(&mut self, build: impl FnOnce(&mut Vec<u8>, u64)) -> Reply {
        let sync = self.sync();
        let mut out = Vec::new();
        build(&mut out, sync);
        self.send(&out);
        let r = self.recv();
        assert_eq!(r.sync, sync);
        r
    }

    /// The next reply, waiting at most [`WAIT`].
    pub fn recv(&mut self) -> Reply {
        self.try_recv()
            .expect("a reply before the connection closed")
    }

    /// The next reply, or None when the server closed the connection.
    pub fn try_recv(&mut self) -> Option<Reply> {
        let deadline = Instant::now() + WAIT;
        loop {
            if let Some(f) = split_frame(&self.buf, usize::MAX).expect("reply framing") {
                assert_eq!(self.buf[0], 0xce, "replies use a 0xce length");
                let r = client::decode(&self.buf[f.prefix..f.total()]).expect("reply decodes");
                let reply = Reply {
                    sync: r.sync,
                    code: r.code,
                    schema_version: r.schema_version,
                    data: r
                        .data
                        .map(|d| rmpv::decode::read_value(&mut &d[..]).expect("DATA decodes")),
                    error: r.error.map(str::to_string),
                    has_stack: r.error_stack.is_some(),
                    body: r.body.to_vec(),
                };
                self.buf.drain(..f.total());
                return Some(reply);
            }
            assert!(Instant::now() < deadline, "no reply within {WAIT:?}");
            let mut chunk = [0u8; 64 * 1024];
            match self.stream.read(&mut chunk) {
                Ok(0) => return None,
                Ok(n) => self.buf.extend_from_slice(&chunk[..n]),
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) if e.kind() == ErrorKind::ConnectionReset => return None,
                Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                    panic!("no reply within {WAIT:?}")
                }
                Err(e) => panic!("read failed: {e}"),
            }
        }
    }

    /// Asserts the server closes the connection (after any replies, which are returned).
    pub fn expect_closed(&mut self) -> Vec<Reply> {
        let mut replies = Vec::new();
        while let Some(r) = self.try_recv() {
            replies.push(r);
        }
        replies
    }
}

/// Waits until `cond` holds, checking every few milliseconds, failing after [`WAIT`].
pub fn wait_until(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + WAIT;
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::yield_now();
        std::thread::sleep(Duration::from_millis(2));
    }
}
