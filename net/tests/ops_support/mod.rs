//! Harness for the operating tests: the built `tarq` binary run as a child process (its log
//! lines read as events, its addresses taken from them, signals sent with `kill`), a raw HTTP
//! GET, a Graphite line parser and collectors, and the CI rule for external tools (missing under
//! `CI=true` fails; elsewhere a notice). Every wait has a deadline.
#![allow(dead_code)] // each test binary uses a different part of the harness

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

pub const BIN: &str = env!("CARGO_BIN_EXE_tarq");

/// How long any single wait may take before the test fails.
pub const WAIT: Duration = Duration::from_secs(15);

/// A running `tarq` with its stderr read line by line.
pub struct Tarq {
    pub child: Child,
    lines: mpsc::Receiver<String>,
    /// Every line read so far, for assertions about what was (not) logged.
    pub log: Vec<String>,
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
        let mut child = Command::new(BIN)
            .args(["--listen", "127.0.0.1:0", "--data-dir"])
            .arg(dir.path().join("data"))
            .args(args)
            .env_remove("RUST_LOG")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let stderr = child.stderr.take().unwrap();
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let mut t = Tarq {
            child,
            lines: rx,
            log: Vec::new(),
            addr: "127.0.0.1:0".parse().unwrap(),
            metrics: None,
            dir,
        };
        let serving = t.wait_for_line("tarq serving");
        t.addr = addr_in(&serving, "listen=").expect("the serving line names the address");
        t.metrics = t
            .log
            .iter()
            .find(|l| l.contains("serving Prometheus metrics"))
            .and_then(|l| addr_in(l, "listen="));
        t
    }

    /// Waits for a log line containing `needle` (lines already read count) and returns it.
    pub fn wait_for_line(&mut self, needle: &str) -> String {
        self.wait_for_line_after(0, needle)
    }

    /// Waits for a line containing `needle` among the lines from index `from` on.
    pub fn wait_for_line_after(&mut self, from: usize, needle: &str) -> String {
        if let Some(l) = self.log.iter().skip(from).find(|l| l.contains(needle)) {
            return l.clone();
        }
        let deadline = Instant::now() + WAIT;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(l) => {
                    self.log.push(l.clone());
                    if l.contains(needle) {
                        return l;
                    }
                }
                Err(_) => panic!(
                    "no log line with {needle:?} within {WAIT:?}; log:\n{}",
                    self.log.join("\n")
                ),
            }
        }
    }

    pub fn signal(&self, name: &str) {
        let ok = Command::new("kill")
            .args([&format!("-{name}"), &self.child.id().to_string()])
            .status()
            .unwrap()
            .success();
        assert!(ok, "kill -{name} failed");
    }

    /// Waits for the process to exit.
    pub fn wait_exit(&mut self) -> ExitStatus {
        let deadline = Instant::now() + WAIT;
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                // Whatever it logged on the way out.
                while let Ok(l) = self.lines.recv_timeout(Duration::from_secs(1)) {
                    self.log.push(l);
                }
                return status;
            }
            assert!(
                Instant::now() < deadline,
                "tarq did not exit within {WAIT:?}"
            );
            std::thread::sleep(Duration::from_millis(5)); // polling a child has no event to wait on
        }
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

impl Drop for Tarq {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The address after `key` in a log line (`listen=127.0.0.1:3301`).
pub fn addr_in(line: &str, key: &str) -> Option<SocketAddr> {
    let rest = &line[line.find(key)? + key.len()..];
    rest.split_whitespace().next()?.parse().ok()
}

/// `GET path` over a plain socket; returns the status code and the body.
pub fn http_get(addr: SocketAddr, path: &str) -> (u16, String) {
    http_raw(
        addr,
        format!("GET {path} HTTP/1.1\r\nHost: tarq\r\n\r\n").as_bytes(),
    )
}

/// Sends `request` as is and reads the response until the server closes.
pub fn http_raw(addr: SocketAddr, request: &[u8]) -> (u16, String) {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(WAIT)).unwrap();
    s.write_all(request).unwrap();
    let mut resp = String::new();
    s.read_to_string(&mut resp).unwrap();
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

/// One Graphite plaintext line, checked: `queue.stats.<name> <value> <unix_seconds>` with a
/// timestamp of about now.
pub fn graphite_line(line: &str) -> (String, u64) {
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
        ts <= now && ts + 30 >= now,
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
    mut done: impl FnMut(&std::collections::HashMap<String, u64>) -> bool,
) -> std::collections::HashMap<String, u64> {
    let mut seen = std::collections::HashMap::new();
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

fn in_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| v == "true")
}

/// Whether the test can go on: a missing tool fails under CI, elsewhere it is a notice.
pub fn prerequisite<T>(what: &str, check: Result<T, String>) -> Option<T> {
    match check {
        Ok(v) => Some(v),
        Err(why) if in_ci() => panic!(
            "{what} is required under CI=true but unusable: {why}\n\
             (`bash .ci/test` installs it before running the tests)"
        ),
        Err(why) => {
            eprintln!("NOTICE: skipping, {what} is unusable here: {why}");
            None
        }
    }
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

/// A port nobody listens on right now (bound, then released).
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}
