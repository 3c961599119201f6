//! A Lua script served by a real Tarantool (the originals tarq is compared with: the seed queue's
//! `init.lua`, tarantool/queue's `serve.lua`), on port 0 in a temporary work directory, killed
//! on drop. The scripts take `WORKDIR`, `LISTEN` and `LOGFILE` from the environment and listen
//! before their queue is defined, so readiness is the log's ready line plus a connection to the
//! port read from `/proc`. A test binary includes this file with
//! `#[path = "support/tarantool.rs"] mod tarantool;` beside `mod support;`.

use std::fs::File;
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use tempfile::TempDir;

use crate::support::{listening_port, Proc};

/// How long Tarantool may take to start and define the queue (a cold start on a loaded
/// machine takes a few seconds).
const START_DEADLINE: Duration = Duration::from_secs(20);
/// How often the log and the port are looked at meanwhile.
pub const POLL_INTERVAL: Duration = Duration::from_millis(10);
/// How much of each output a failure message shows.
const LOG_TAIL_BYTES: usize = 4000;
/// The log line that says the script has run: its functions are defined.
const READY_LINE: &str = "entering the event loop";

/// The Tarantool serving a script, with its work directory.
pub struct LuaServer {
    proc: Proc,
    /// The port it got from port 0, read from `/proc` once it listens.
    pub port: u16,
    /// What the process printed (stdout and stderr).
    out: PathBuf,
    /// Its log file, which shows the ready line once it serves requests.
    log: PathBuf,
    _dir: TempDir,
}

impl LuaServer {
    /// Starts `script` and waits until it serves; `what` names it in a failure.
    pub fn start(script: &Path, what: &str) -> LuaServer {
        let dir = tempfile::tempdir().expect("temp dir");
        let out = dir.path().join("server.out");
        let file = File::create(&out).expect("create the server's output file");
        let log = dir.path().join("tarantool.log");
        let proc = Proc::spawn(
            Command::new("tarantool")
                .arg(script)
                .env("WORKDIR", dir.path())
                .env("LISTEN", "127.0.0.1:0")
                .env("LOGFILE", &log)
                .current_dir(dir.path())
                .stdin(Stdio::null())
                .stdout(Stdio::from(file.try_clone().expect("dup output file")))
                .stderr(Stdio::from(file)),
        );
        let mut server = LuaServer {
            proc,
            port: 0,
            out,
            log,
            _dir: dir,
        };
        if let Err(e) = server.wait_ready() {
            panic!("{what} did not start: {e}");
        }
        server
    }

    /// Waits until the server shows its ready line and accepts connections, or fails with its
    /// output if it exits or the deadline passes.
    fn wait_ready(&mut self) -> Result<(), String> {
        let deadline = Instant::now() + START_DEADLINE;
        loop {
            if let Some(status) = self.proc.0.try_wait().expect("try_wait") {
                return Err(format!("exited with {status}:\n{}", self.logs()));
            }
            if read_lossy(&self.log).contains(READY_LINE) {
                if let Some(port) = listening_port(self.proc.id()) {
                    self.port = port;
                    let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
                    if TcpStream::connect_timeout(&addr, POLL_INTERVAL).is_ok() {
                        return Ok(());
                    }
                }
            }
            if Instant::now() > deadline {
                return Err(format!(
                    "not ready (port {}) after {START_DEADLINE:?}:\n{}",
                    self.port,
                    self.logs()
                ));
            }
            thread::sleep(POLL_INTERVAL);
        }
    }

    /// The tails of what the server wrote, for failure messages.
    pub fn logs(&self) -> String {
        format!(
            "{}\n--- {} ---\n{}",
            tail(&read_lossy(&self.out)),
            self.log.display(),
            tail(&read_lossy(&self.log))
        )
    }
}

/// A file's text, or "" while it does not exist yet.
fn read_lossy(path: &Path) -> String {
    std::fs::read(path)
        .map(|b| String::from_utf8_lossy(&b).into_owned())
        .unwrap_or_default()
}

/// The last `LOG_TAIL_BYTES` of `s`, for a failure message.
pub fn tail(s: &str) -> String {
    let start = s.len().saturating_sub(LOG_TAIL_BYTES);
    let start = (start..s.len())
        .find(|&i| s.is_char_boundary(i))
        .unwrap_or(s.len());
    s[start..].to_string()
}
