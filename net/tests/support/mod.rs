//! The one harness of the end-to-end tests. Every wait has a deadline; nothing sleeps a fixed
//! time; every server listens on `127.0.0.1:0` and says which port it got, so tests running in
//! parallel can never collide on a port.
//!
//! - [`TestServer`]: a server in-process on a thread, stopped and joined on drop;
//! - [`Tarq`]: the built `tarq` binary as a child process, its log lines read as events (the
//!   address it serves on is taken from its "tarq serving" line), killed on drop;
//! - [`Proc`] and [`Lines`]: any child process killed on drop, and an output stream of it read
//!   line by line (also for carbon-cache and the like);
//! - [`Client`]: a blocking raw-frame client on the codec's client side, and [`Reply`];
//! - [`prerequisite`] and [`tool`]: external tools (missing, the test fails naming it), and
//!   [`original`]: the originals compared against (missing, skipped; required under `CI=true`);
//! - [`listening_port`]: the port a server started on port 0 got, for servers that cannot say;
//!   [`Refusing`]: an address that refuses connections, its port held so no server takes it;
//! - Graphite lines and a raw HTTP GET, for the operating tests.
#![allow(dead_code)] // each test binary uses a different part of the harness

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use rmpv::Value;
use tarq_iproto::client::{self, Greeting};
use tarq_net::config::Config;
use tarq_net::server::{Server, ServerHandle};

/// The `tarq` binary cargo built for these tests.
pub const BIN: &str = env!("CARGO_BIN_EXE_tarq");

/// How long any single wait in a test may take before it fails: generous, since the machine
/// may be busy building; a healthy server answers in milliseconds.
pub const WAIT: Duration = Duration::from_secs(15);

// ---------------------------------------------------------------------------------------------
// In-process server

/// A server running in this process on its own thread, on a free port with a temporary data
/// dir; stopped gracefully and joined on drop.
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

    /// The running server's handle (to step its wall clock, say).
    pub fn handle(&self) -> &ServerHandle {
        &self.handle
    }

    /// A server with the default configuration changed by `tweak`.
    pub fn with(tweak: impl FnOnce(&mut Config)) -> TestServer {
        let (cfg, dir) = TestServer::config(tweak);
        TestServer::spawn(Server::bind(cfg).expect("server binds"), dir, || {})
    }

    /// A configuration listening on `127.0.0.1:0` with its data dir in a new temporary
    /// directory (returned: it must live as long as the server), changed by `tweak`.
    pub fn config(tweak: impl FnOnce(&mut Config)) -> (Config, tempfile::TempDir) {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut cfg = Config {
            listen: "127.0.0.1:0".parse().unwrap(),
            data_dir: dir.path().join("data"),
            ..Config::default()
        };
        tweak(&mut cfg);
        (cfg, dir)
    }

    /// Runs a server built by the caller (a journal, a hook) on a new thread; `on_thread`
    /// runs first on that thread.
    pub fn spawn(
        mut server: Server,
        dir: tempfile::TempDir,
        on_thread: impl FnOnce() + Send + 'static,
    ) -> TestServer {
        let addr = server.local_addr().unwrap();
        let handle = server.handle();
        let thread = std::thread::spawn(move || {
            on_thread();
            server.run()
        });
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

// ---------------------------------------------------------------------------------------------
// Child processes

/// Lines of a child's output stream, read on a thread into a channel; every line read so far is
/// kept in `log` for assertions about what was (not) written.
pub struct Lines {
    rx: mpsc::Receiver<String>,
    pub log: Vec<String>,
}

impl Lines {
    /// Starts reading `stream` line by line.
    pub fn read(stream: impl Read + Send + 'static) -> Lines {
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stream).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Lines {
            rx,
            log: Vec::new(),
        }
    }

    /// The first line from index `from` of `log` on that contains `needle`, reading more
    /// lines while none does; `None` after `within`, or once the stream has ended without it.
    pub fn find_after(&mut self, from: usize, needle: &str, within: Duration) -> Option<String> {
        if let Some(l) = self.log.iter().skip(from).find(|l| l.contains(needle)) {
            return Some(l.clone());
        }
        let deadline = Instant::now() + within;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.rx.recv_timeout(left) {
                Ok(l) => {
                    self.log.push(l.clone());
                    if l.contains(needle) {
                        return Some(l);
                    }
                }
                Err(RecvTimeoutError::Timeout | RecvTimeoutError::Disconnected) => return None,
            }
        }
    }

    /// A line containing `needle`, among those already read too; fails after `within`.
    pub fn wait_for(&mut self, needle: &str, within: Duration) -> String {
        self.wait_for_after(0, needle, within)
    }

    /// A line containing `needle` from index `from` of `log` on; fails after `within`.
    pub fn wait_for_after(&mut self, from: usize, needle: &str, within: Duration) -> String {
        self.find_after(from, needle, within).unwrap_or_else(|| {
            panic!(
                "no line with {needle:?} within {within:?}; lines:\n{}",
                self.log.join("\n")
            )
        })
    }

    /// The next line not read yet that contains `needle`; fails after `within`.
    pub fn wait_for_new(&mut self, needle: &str, within: Duration) -> String {
        let from = self.log.len();
        self.wait_for_after(from, needle, within)
    }

    /// Takes in every line that arrives within `within` (until the stream ends, at most).
    pub fn drain(&mut self, within: Duration) {
        let deadline = Instant::now() + within;
        while let Ok(l) = self
            .rx
            .recv_timeout(deadline.saturating_duration_since(Instant::now()))
        {
            self.log.push(l);
        }
    }
}

/// A child process, killed and reaped on drop.
pub struct Proc(pub Child);

impl Proc {
    pub fn spawn(cmd: &mut Command) -> Proc {
        Proc(
            cmd.spawn()
                .unwrap_or_else(|e| panic!("cannot start {cmd:?}: {e}")),
        )
    }

    pub fn id(&self) -> u32 {
        self.0.id()
    }

    /// Sends a signal by name (`TERM`, `HUP`, ...) with `kill`.
    pub fn signal(&self, name: &str) {
        let ok = Command::new("kill")
            .args([&format!("-{name}"), &self.0.id().to_string()])
            .status()
            .unwrap()
            .success();
        assert!(ok, "kill -{name} failed");
    }

    /// Waits for the process to exit; fails after [`WAIT`].
    pub fn wait_exit(&mut self) -> ExitStatus {
        let deadline = Instant::now() + WAIT;
        loop {
            if let Some(status) = self.0.try_wait().unwrap() {
                return status;
            }
            assert!(
                Instant::now() < deadline,
                "process {} did not exit within {WAIT:?}",
                self.0.id()
            );
            std::thread::sleep(Duration::from_millis(5)); // polling a child has no event to wait on
        }
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A running `tarq` with its stderr read line by line; killed on drop.
pub struct Tarq {
    pub proc: Proc,
    pub lines: Lines,
    pub addr: SocketAddr,
    pub metrics: Option<SocketAddr>,
    pub dir: tempfile::TempDir,
}

impl Tarq {
    /// Starts `tarq` on a free port (`--listen 127.0.0.1:0`) with a data dir in a temporary
    /// directory and `args`, and waits until it serves.
    pub fn start(args: &[&str]) -> Tarq {
        let dir = tempfile::tempdir().unwrap();
        Tarq::start_in(dir, args)
    }

    /// Like [`start`](Self::start) in a given directory (its `data` subdirectory is the data
    /// dir), so a second server can reuse the first one's data.
    pub fn start_in(dir: tempfile::TempDir, args: &[&str]) -> Tarq {
        let data = dir.path().join("data");
        let mut all = vec![
            "--listen",
            "127.0.0.1:0",
            "--data-dir",
            data.to_str().unwrap(),
        ];
        all.extend_from_slice(args);
        Tarq::start_with_args(dir, &all)
    }

    /// Starts `tarq` with exactly `args` (no listen address or data dir added: a config file
    /// may give them) and waits until it serves; `dir` lives as long as the process.
    pub fn start_with_args(dir: tempfile::TempDir, args: &[&str]) -> Tarq {
        let mut cmd = Command::new(BIN);
        cmd.args(args);
        Tarq::spawn_cmd(dir, cmd)
    }

    /// Starts `cmd` (which runs `tarq`, possibly through a wrapper that `exec`s it, so the
    /// pid is tarq's) and waits until it serves.
    pub fn spawn_cmd(dir: tempfile::TempDir, mut cmd: Command) -> Tarq {
        cmd.env_remove("RUST_LOG")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        let mut proc = Proc::spawn(&mut cmd);
        let lines = Lines::read(proc.0.stderr.take().unwrap());
        let mut t = Tarq {
            proc,
            lines,
            addr: "127.0.0.1:0".parse().unwrap(),
            metrics: None,
            dir,
        };
        let serving = t.wait_for_line("tarq serving");
        t.addr = addr_in(&serving, "listen=").expect("the serving line names the address");
        t.metrics = t
            .lines
            .log
            .iter()
            .find(|l| l.contains("serving Prometheus metrics"))
            .and_then(|l| addr_in(l, "listen="));
        t
    }

    /// Every log line read so far.
    pub fn log(&self) -> &[String] {
        &self.lines.log
    }

    /// Waits for a log line containing `needle` (lines already read count) and returns it.
    pub fn wait_for_line(&mut self, needle: &str) -> String {
        self.lines.wait_for(needle, WAIT)
    }

    /// Waits for a line containing `needle` among the lines from index `from` on.
    pub fn wait_for_line_after(&mut self, from: usize, needle: &str) -> String {
        self.lines.wait_for_after(from, needle, WAIT)
    }

    pub fn signal(&self, name: &str) {
        self.proc.signal(name);
    }

    /// Waits for the process to exit, then takes in whatever it logged on the way out.
    pub fn wait_exit(&mut self) -> ExitStatus {
        let status = self.proc.wait_exit();
        self.lines.drain(Duration::from_secs(1));
        status
    }

    /// Runs `tarq ctl --addr <this server> args...`.
    pub fn ctl(&self, args: &[&str]) -> std::process::Output {
        Command::new(BIN)
            .args(["ctl", "--addr", &self.addr.to_string()])
            .args(args)
            .env("RUST_BACKTRACE", "0")
            .output()
            .unwrap()
    }

    /// The directory (with the data dir in it), for a next server; this one must have exited.
    pub fn take_dir(&mut self) -> tempfile::TempDir {
        std::mem::replace(&mut self.dir, tempfile::tempdir().unwrap())
    }

    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }
}

/// The address after `key` in a log line (`listen=127.0.0.1:3301`).
pub fn addr_in(line: &str, key: &str) -> Option<SocketAddr> {
    let rest = &line[line.find(key)? + key.len()..];
    rest.split_whitespace().next()?.parse().ok()
}

#[allow(unused_imports)] // each test binary uses a different part of the harness
pub use tarq_testkit::ports::Refusing;

/// The one TCP port process `pid` listens on, for a server started on port 0 that cannot say
/// which port it got (beanstalkd, Tarantool): read from `/proc`, so it is this process's port
/// and no other's. `None` while it listens on none; a failure when it listens on several.
pub fn listening_port(pid: u32) -> Option<u16> {
    let ports = tarq_testkit::ports::listening_ports(pid).ok()?;
    match ports[..] {
        [] => None,
        [port] => Some(port),
        _ => panic!("process {pid} listens on several ports: {ports:?}"),
    }
}

/// Where `original` is, for a test that compares against it; `None` when it is absent and the
/// test is to pass as skipped (it said so); absent under `CI=true`, a failure saying where to
/// get it. See `tarq_testkit::reference`.
pub fn original(original: tarq_testkit::reference::Original) -> Option<PathBuf> {
    let root = tarq_testkit::reference::workspace_root(Path::new(env!("CARGO_MANIFEST_DIR")));
    tarq_testkit::reference::needed(original, &root)
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

// ---------------------------------------------------------------------------------------------
// External tools

/// What a test needs, or a failure naming it and why it is unusable: a test that cannot run
/// fails, in CI and out of it, instead of passing without having run.
pub fn prerequisite<T>(what: &str, check: Result<T, String>) -> T {
    check.unwrap_or_else(|why| {
        panic!(
            "{what} is required but unusable: {why}\n\
             (`bash .ci/test` installs it before running the tests)"
        )
    })
}

/// Fails the test naming `what` unless the command `check` runs and exits 0 (a client
/// library that must import, a tool that must answer).
pub fn require_command(what: &str, check: &[&str]) {
    let ok = Command::new(check[0])
        .args(&check[1..])
        .output()
        .map_err(|e| format!("cannot run `{}`: {e}", check[0]))
        .and_then(|o| {
            o.status.success().then_some(()).ok_or_else(|| {
                format!(
                    "`{}` failed: {}",
                    check.join(" "),
                    String::from_utf8_lossy(&o.stderr).trim()
                )
            })
        });
    prerequisite(what, ok);
}

/// The path of an executable on PATH.
pub fn tool(name: &str) -> Result<PathBuf, String> {
    std::env::var_os("PATH")
        .iter()
        .flat_map(std::env::split_paths)
        .map(|d| d.join(name))
        .find(|p| is_executable(p))
        .ok_or_else(|| format!("{name} is not on PATH"))
}

fn is_executable(p: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    p.metadata()
        .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

// ---------------------------------------------------------------------------------------------
// Raw-frame client

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

/// A test's connection: [`tarq_client::Client`] with panics instead of errors, plus the raw
/// socket (a second handle on it) and the greeting for tests that poke at them directly.
pub struct Client {
    pub stream: TcpStream,
    pub greeting: Greeting,
    inner: tarq_client::Client,
}

impl Client {
    pub fn connect(addr: SocketAddr) -> Client {
        let inner = tarq_client::Client::connect_addr(addr, WAIT).expect("connect and greeting");
        let stream = inner.socket().try_clone().expect("a second socket handle");
        Client {
            stream,
            greeting: inner.greeting().clone(),
            inner,
        }
    }

    pub fn send(&mut self, bytes: &[u8]) {
        self.inner.send(bytes).expect("send");
    }

    /// Sends a CALL; returns its sync.
    pub fn send_call(&mut self, function: &str, a: &[Value]) -> u64 {
        let a = args(a);
        self.inner
            .send_request(|out, sync| client::call(out, sync, function, &a))
            .expect("send")
    }

    /// A CALL and its reply (asserting the sync matches).
    pub fn call(&mut self, function: &str, a: &[Value]) -> Reply {
        let a = args(a);
        self.request(|out, sync| client::call(out, sync, function, &a))
    }

    pub fn call16(&mut self, function: &str, a: &[Value]) -> Reply {
        let a = args(a);
        self.request(|out, sync| client::call16(out, sync, function, &a))
    }

    pub fn ping(&mut self) -> Reply {
        self.request(client::ping)
    }

    /// Sends a request built by `build(out, sync)` and returns its reply.
    pub fn request(&mut self, build: impl FnOnce(&mut Vec<u8>, u64)) -> Reply {
        let sync = self.inner.send_request(build).expect("send");
        let r = self.recv();
        assert_eq!(r.sync, sync, "reply to another request: {r:?}");
        r
    }

    /// The next reply, waiting at most [`WAIT`].
    pub fn recv(&mut self) -> Reply {
        self.try_recv()
            .expect("a reply before the connection closed")
    }

    /// The next reply, or None when the server closed the connection.
    pub fn try_recv(&mut self) -> Option<Reply> {
        let r = match self.inner.recv_within(WAIT) {
            Ok(r) => r?,
            Err(e) => panic!("no reply: {e}"),
        };
        assert_eq!(r.prefix_marker, 0xce, "replies use a 0xce length");
        Some(Reply {
            sync: r.sync,
            code: r.code,
            schema_version: r.schema_version,
            data: r
                .data
                .map(|d| rmpv::decode::read_value(&mut &d[..]).expect("DATA decodes")),
            error: r.error,
            has_stack: r.has_stack,
            body: r.body,
        })
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

// ---------------------------------------------------------------------------------------------
// Graphite and HTTP

/// `GET path` over a plain socket; returns the status code and the body.
pub fn http_get(addr: SocketAddr, path: &str) -> (u16, String) {
    http_raw(
        addr,
        format!("GET {path} HTTP/1.1\r\nHost: tarq\r\n\r\n").as_bytes(),
    )
}

/// Sends `request` as is and reads one response: its `Content-Length` bytes of body, or up to
/// the close when it has none.
pub fn http_raw(addr: SocketAddr, request: &[u8]) -> (u16, String) {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(WAIT)).unwrap();
    s.write_all(request).unwrap();
    let resp = String::from_utf8_lossy(&read_http_response(&mut s)).into_owned();
    let status = resp
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or_else(|| panic!("not an HTTP response: {resp:?}"));
    let body = resp
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default();
    (status, body)
}

/// Reads one HTTP response from `s`, head and body: the body is `Content-Length` bytes, or
/// what comes until the close when the head names no length.
pub fn read_http_response(s: &mut TcpStream) -> Vec<u8> {
    let mut got = Vec::new();
    let mut chunk = [0u8; 8192];
    loop {
        if let Some(end) = got.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&got[..end]).to_ascii_lowercase();
            let len = head
                .lines()
                .find_map(|l| l.strip_prefix("content-length:"))
                .and_then(|v| v.trim().parse::<usize>().ok());
            if let Some(len) = len {
                while got.len() < end + 4 + len {
                    match s.read(&mut chunk) {
                        Ok(0) | Err(_) => break,
                        Ok(n) => got.extend_from_slice(&chunk[..n]),
                    }
                }
                got.truncate(end + 4 + len);
                return got;
            }
        }
        match s.read(&mut chunk) {
            Ok(0) | Err(_) => return got,
            Ok(n) => got.extend_from_slice(&chunk[..n]),
        }
    }
}

/// How old a Graphite line's timestamp may be for a running server (a busy machine may delay
/// a push by seconds).
pub const GRAPHITE_MAX_AGE_SECS: u64 = 30;

/// One Graphite plaintext line, checked: `queue.stats.<name> <value> <unix_seconds>` with a
/// timestamp of about now (at most [`GRAPHITE_MAX_AGE_SECS`] old).
pub fn graphite_line(line: &str) -> (String, u64) {
    graphite_line_aged(line, GRAPHITE_MAX_AGE_SECS)
}

/// [`graphite_line`] with a timestamp at most `max_age` seconds old.
pub fn graphite_line_aged(line: &str, max_age: u64) -> (String, u64) {
    let parts: Vec<&str> = line.split(' ').collect();
    assert_eq!(parts.len(), 3, "not a Graphite line: {line:?}");
    let name = parts[0]
        .strip_prefix("queue.stats.")
        .unwrap_or_else(|| panic!("not a queue.stats line: {line:?}"));
    let value: u64 = parts[1]
        .parse()
        .unwrap_or_else(|_| panic!("bad value: {line:?}"));
    let ts: u64 = parts[2]
        .parse()
        .unwrap_or_else(|_| panic!("bad time: {line:?}"));
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs();
    assert!(
        ts <= now && ts + max_age >= now,
        "timestamp {ts} is not about now ({now})"
    );
    (name.to_string(), value)
}

/// Sent by [`collect_tcp_lines`] when a connection ends.
pub const CLOSED: &str = "<connection closed>";

/// Reads lines from every connection accepted on `listener` into a channel, then [`CLOSED`]
/// when that connection ends.
pub fn collect_tcp_lines(listener: TcpListener) -> mpsc::Receiver<String> {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(stream) = stream else { return };
            let tx = tx.clone();
            std::thread::spawn(move || {
                for line in BufReader::new(stream).lines().map_while(Result::ok) {
                    if tx.send(line).is_err() {
                        return;
                    }
                }
                let _ = tx.send(CLOSED.to_string());
            });
        }
    });
    rx
}

/// Receives from `rx` until `done` holds for the figures seen so far (latest value per name).
pub fn wait_for_figures(
    rx: &mpsc::Receiver<String>,
    what: &str,
    mut done: impl FnMut(&HashMap<String, u64>) -> bool,
) -> HashMap<String, u64> {
    let mut seen = HashMap::new();
    let deadline = Instant::now() + WAIT;
    while !done(&seen) {
        let left = deadline.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left) {
            Ok(line) if line == CLOSED => {}
            Ok(line) => {
                let (name, value) = graphite_line(&line);
                seen.insert(name, value);
            }
            Err(_) => panic!("{what}: not seen within {WAIT:?}; figures: {seen:?}"),
        }
    }
    seen
}

/// Between two checks of a script having exited.
const SCRIPT_POLL: Duration = Duration::from_millis(10);

/// How a script (a real client run by the tests) ended and what it printed.
pub struct Run {
    /// `None` when it was killed at the deadline.
    pub status: Option<ExitStatus>,
    pub stdout: String,
    pub stderr: String,
}

/// Runs `cmd` to completion, or kills it once `deadline` has passed.
pub fn run_with_deadline(mut cmd: Command, deadline: Duration) -> Run {
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e}"));
    let drain = |mut r: Box<dyn Read + Send>| {
        std::thread::spawn(move || {
            let mut s = Vec::new();
            let _ = r.read_to_end(&mut s);
            String::from_utf8_lossy(&s).into_owned()
        })
    };
    let stdout = drain(Box::new(child.stdout.take().expect("stdout")));
    let stderr = drain(Box::new(child.stderr.take().expect("stderr")));
    let until = Instant::now() + deadline;
    let status = loop {
        if let Some(status) = child.try_wait().expect("try_wait") {
            break Some(status);
        }
        if Instant::now() > until {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(SCRIPT_POLL); // polling a child has no event to wait on
    };
    Run {
        status,
        stdout: stdout.join().expect("stdout reader"),
        stderr: stderr.join().expect("stderr reader"),
    }
}
