//! What the beanstalk-port tests share: a `tarq` serving `--beanstalk-listen 127.0.0.1:0`
//! (its address read from the log), a blocking beanstalk client on the `tarq-beanstalk` codec
//! whose errors are values (a test may kill the server under it), and the byte-script player of
//! `net/beanstalk/tests/support/script.rs`, included here by path so tarq and real beanstalkd
//! are judged by the same code and the same recordings. A test binary includes this file with
//! `#[path = "support/beanstalk.rs"] mod beanstalk;` beside `mod support;`.
#![allow(dead_code)] // each test binary uses a different part

use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use tarq_beanstalk::{Command, Reply};

use crate::support::{addr_in, Tarq, WAIT};

#[path = "../../beanstalk/tests/support/script.rs"]
pub mod script;

/// The byte scripts and their beanstalkd recordings, kept by the codec crate.
pub fn scripts_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("beanstalk/tests/scripts")
}

/// `tarq` with its beanstalk port on `127.0.0.1:0` and `extra` flags, once it serves; the port
/// it got is read from its "serving the beanstalk protocol" line.
pub fn start(extra: &[&str]) -> (Tarq, SocketAddr) {
    start_in(tempfile::tempdir().unwrap(), extra)
}

/// [`start`] with the data dir under `dir` (a restart passes the previous run's directory).
pub fn start_in(dir: tempfile::TempDir, extra: &[&str]) -> (Tarq, SocketAddr) {
    let mut args = vec!["--beanstalk-listen", "127.0.0.1:0"];
    args.extend_from_slice(extra);
    let mut tarq = Tarq::start_in(dir, &args);
    let line = tarq.wait_for_line("serving the beanstalk protocol");
    let addr = addr_in(&line, "listen=").expect("the line names the beanstalk address");
    (tarq, addr)
}

/// A reply, owned: its line as the server wrote it (no CRLF) and the body after it, if any.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Answer {
    pub line: String,
    pub body: Option<Vec<u8>>,
}

impl Answer {
    fn of(reply: &Reply<'_>) -> Answer {
        let mut bytes = Vec::new();
        reply.encode(&mut bytes);
        let end = bytes.windows(2).position(|w| w == b"\r\n").unwrap();
        let body = (bytes.len() > end + 2).then(|| bytes[end + 2..bytes.len() - 2].to_vec());
        Answer {
            line: String::from_utf8_lossy(&bytes[..end]).into_owned(),
            body,
        }
    }

    /// The first word of the line (`INSERTED`, `NOT_FOUND`, ...).
    pub fn word(&self) -> &str {
        self.line.split(' ').next().unwrap()
    }

    /// The number after the word (`INSERTED <id>`, `RESERVED <id> ...`, `KICKED <n>`).
    pub fn number(&self) -> Option<u64> {
        self.line.split(' ').nth(1)?.parse().ok()
    }

    /// A YAML list body's items (`list-tubes`), sorted.
    pub fn yaml_list(&self) -> Vec<String> {
        let body = String::from_utf8_lossy(self.body.as_deref().unwrap_or_default()).into_owned();
        let mut items: Vec<String> = body
            .lines()
            .filter_map(|l| l.strip_prefix("- ").map(str::to_owned))
            .collect();
        items.sort();
        items
    }

    /// A YAML body's `key: value` pairs.
    pub fn yaml(&self, key: &str) -> Option<String> {
        let body = String::from_utf8_lossy(self.body.as_deref()?).into_owned();
        body.lines()
            .find_map(|l| l.strip_prefix(key)?.strip_prefix(": ").map(str::to_owned))
    }
}

/// Largest reply body a test accepts: above any job or stats body the tests make.
const MAX_REPLY_BODY: usize = 1 << 20;

/// A blocking beanstalk connection. Every wait is bounded by [`WAIT`].
pub struct Bs {
    pub stream: TcpStream,
    buf: Vec<u8>,
}

impl Bs {
    pub fn connect(addr: SocketAddr) -> Bs {
        Bs::try_connect(addr).unwrap_or_else(|e| panic!("connect {addr}: {e}"))
    }

    pub fn try_connect(addr: SocketAddr) -> std::io::Result<Bs> {
        let stream = TcpStream::connect_timeout(&addr, WAIT)?;
        stream.set_write_timeout(Some(WAIT))?;
        stream.set_nodelay(true)?;
        Ok(Bs {
            stream,
            buf: Vec::new(),
        })
    }

    /// A second handle on the same connection, with its own read buffer: one thread writes
    /// while another reads.
    pub fn try_clone(&self) -> std::io::Result<Bs> {
        Ok(Bs {
            stream: self.stream.try_clone()?,
            buf: Vec::new(),
        })
    }

    pub fn send(&mut self, cmd: &Command<'_>) -> std::io::Result<()> {
        let mut out = Vec::new();
        cmd.encode(&mut out);
        self.stream.write_all(&out)
    }

    pub fn send_raw(&mut self, bytes: &[u8]) -> std::io::Result<()> {
        self.stream.write_all(bytes)
    }

    /// The next reply; `Ok(None)` when the server closed the connection first. An error when
    /// none comes within `within`, the connection fails, or the bytes are no reply.
    pub fn recv_within(&mut self, within: Duration) -> std::io::Result<Option<Answer>> {
        let deadline = Instant::now() + within;
        loop {
            match Reply::decode(&self.buf, MAX_REPLY_BODY) {
                Ok(Some((reply, n))) => {
                    let answer = Answer::of(&reply);
                    self.buf.drain(..n);
                    return Ok(Some(answer));
                }
                Ok(None) => {}
                Err(e) => return Err(std::io::Error::new(ErrorKind::InvalidData, e)),
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(ErrorKind::TimedOut.into());
            }
            self.stream.set_read_timeout(Some(left))?;
            let mut chunk = [0u8; 64 * 1024];
            match self.stream.read(&mut chunk) {
                Ok(0) if self.buf.is_empty() => return Ok(None),
                Ok(0) => return Err(ErrorKind::UnexpectedEof.into()),
                Ok(n) => self.buf.extend_from_slice(&chunk[..n]),
                Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) if e.kind() == ErrorKind::ConnectionReset => return Ok(None),
                Err(e) => return Err(e),
            }
        }
    }

    /// The next reply, within [`WAIT`], panicking on a closed connection or anything else.
    pub fn recv(&mut self) -> Answer {
        match self.recv_within(WAIT) {
            Ok(Some(a)) => a,
            Ok(None) => panic!("the server closed the connection instead of replying"),
            Err(e) => panic!("no reply: {e}"),
        }
    }

    /// Sends `cmd` and returns its reply (panics on failure).
    pub fn call(&mut self, cmd: &Command<'_>) -> Answer {
        self.send(cmd).expect("send");
        self.recv()
    }

    /// Sends `cmd` and returns the line it is answered with (no CRLF), whatever it says: tarq's
    /// own lines (`READ_ONLY <primary>`) are no reply the codec knows.
    pub fn call_line(&mut self, cmd: &Command<'_>) -> String {
        self.send(cmd).expect("send");
        let deadline = Instant::now() + WAIT;
        loop {
            if let Some(end) = self.buf.windows(2).position(|w| w == b"\r\n") {
                let line = String::from_utf8_lossy(&self.buf[..end]).into_owned();
                self.buf.drain(..end + 2);
                return line;
            }
            let left = deadline.saturating_duration_since(Instant::now());
            assert!(!left.is_zero(), "no line in answer to {cmd:?}");
            self.stream.set_read_timeout(Some(left)).unwrap();
            let mut chunk = [0u8; 4096];
            match self.stream.read(&mut chunk) {
                Ok(0) => panic!("closed before answering {cmd:?}"),
                Ok(n) => self.buf.extend_from_slice(&chunk[..n]),
                Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
                Err(e) => panic!("reading the answer to {cmd:?}: {e}"),
            }
        }
    }

    /// `put` with a TTR of 60 s, returning the id; panics unless `INSERTED`.
    pub fn put(&mut self, pri: u32, body: &[u8]) -> u64 {
        let a = self.call(&Command::Put {
            pri,
            delay: 0,
            ttr: 60,
            body,
        });
        assert_eq!(a.word(), "INSERTED", "{a:?}");
        a.number().unwrap()
    }

    /// Half-closes and reads every reply left until the server closes.
    pub fn finish(&mut self) -> Vec<Answer> {
        let _ = self.stream.shutdown(std::net::Shutdown::Write);
        let mut rest = Vec::new();
        while let Some(a) = self.recv_within(WAIT).expect("replies, then the close") {
            rest.push(a);
        }
        rest
    }
}

/// A beanstalk server under test, stopped on drop: tarq's port, or real beanstalkd for the
/// same bytes' reference replies.
pub enum Server {
    Tarq(Tarq),
    Beanstalkd(script::Beanstalkd),
}

/// A running [`Server`], its name for messages and its address.
pub struct Target {
    pub name: &'static str,
    pub addr: SocketAddr,
    pub server: Server,
}

impl Target {
    /// tarq with its beanstalk port and `extra` flags.
    pub fn tarq(extra: &[&str]) -> Target {
        let (tarq, addr) = start(extra);
        Target {
            name: "tarq",
            addr,
            server: Server::Tarq(tarq),
        }
    }

    /// Real beanstalkd with `args` (`-z N`, `-b DIR`); a missing binary fails the test.
    pub fn beanstalkd(args: &[&str]) -> Target {
        crate::support::prerequisite("beanstalkd", crate::support::tool("beanstalkd"));
        let b = script::Beanstalkd::spawn_with(args).expect("beanstalkd starts");
        Target {
            name: "beanstalkd",
            addr: b.addr.parse().unwrap(),
            server: Server::Beanstalkd(b),
        }
    }

    /// tarq's process, for its resident memory.
    pub fn tarq_pid(&self) -> Option<u32> {
        match &self.server {
            Server::Tarq(t) => Some(t.proc.id()),
            Server::Beanstalkd(_) => None,
        }
    }
}

/// The resident set of a process, from /proc.
pub fn rss_bytes(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let kib: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmRSS in /proc/<pid>/status");
    kib * 1024
}
