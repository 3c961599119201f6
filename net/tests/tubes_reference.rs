//! The tarantool/queue client scripts of `tests/clients/tubes/` against the original
//! tarantool/queue 1.5.0 (`serve.lua` on Debian's tarantool): each real-client flow (net.box,
//! the PyPI `tarantool` connector, `asynctnt-queue`) passes in its `reference` mode, the
//! differential runner finds two fresh instances of the original identical, and the original
//! still produces the recorded transcript. This proves the scripts check what the original
//! does, so the same scripts can later be pointed at tarq. This file owns the processes and
//! their deadlines; what is checked lives in the scripts.
//!
//! A tool that is not installed fails the test, naming it (`bash .ci/test` installs them).
//! The original is not part of the repository: without it these tests pass as skipped, saying
//! where to get it, except under `CI=true` (see `tarq_testkit::reference`).

mod support;

use std::fs::File;
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use support::{listening_port, original, prerequisite, run_with_deadline, Proc};
use tarq_testkit::reference::Original as Reference;
use tempfile::TempDir;

/// How long the original gets to serve: it starts in about half a second; this leaves room
/// for a machine busy building.
const START_DEADLINE: Duration = Duration::from_secs(20);
/// How long a whole script may run: the flows take 3-6 s (short delays and TTRs); their own
/// calls are bounded by 20-30 s, so a hung server shows up as a script failure before this.
const SCRIPT_DEADLINE: Duration = Duration::from_secs(120);
/// Pause between two checks of a process or port being ready: a polling interval.
const POLL_INTERVAL: Duration = Duration::from_millis(10);
/// The tail of a log shown when something fails.
const LOG_TAIL_BYTES: usize = 4000;
/// The line of Tarantool's log that says the queue is defined and requests are served.
const READY_LINE: &str = "entering the event loop";

/// The original served by Tarantool in a temporary work dir, killed on drop.
struct Original {
    proc: Proc,
    /// The port it got from port 0, read from `/proc` once it listens (0 until then).
    port: u16,
    log: PathBuf,
    out: PathBuf,
    _dir: TempDir,
}

impl Original {
    fn start(serve_lua: &Path) -> Original {
        let dir = tempfile::tempdir().expect("temp dir");
        let out = dir.path().join("server.out");
        let file = File::create(&out).expect("create the server's output file");
        let log = dir.path().join("tarantool.log");
        let proc = Proc::spawn(
            Command::new("tarantool")
                .arg(serve_lua)
                .env("WORKDIR", dir.path())
                .env("LISTEN", "127.0.0.1:0")
                .env("LOGFILE", &log)
                .current_dir(dir.path())
                .stdin(Stdio::null())
                .stdout(Stdio::from(file.try_clone().expect("dup output file")))
                .stderr(Stdio::from(file)),
        );
        let mut original = Original {
            proc,
            port: 0,
            log,
            out,
            _dir: dir,
        };
        if let Err(e) = original.wait_ready() {
            panic!("the original tarantool/queue did not start: {e}");
        }
        original
    }

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
                return Err(format!("not ready (port {}):\n{}", self.port, self.logs()));
            }
            thread::sleep(POLL_INTERVAL);
        }
    }

    fn logs(&self) -> String {
        format!(
            "{}\n--- {} ---\n{}",
            tail(&read_lossy(&self.out)),
            self.log.display(),
            tail(&read_lossy(&self.log))
        )
    }
}

fn read_lossy(path: &Path) -> String {
    std::fs::read(path)
        .map(|b| String::from_utf8_lossy(&b).into_owned())
        .unwrap_or_default()
}

fn tail(s: &str) -> String {
    let start = s.len().saturating_sub(LOG_TAIL_BYTES);
    let start = (start..s.len())
        .find(|&i| s.is_char_boundary(i))
        .unwrap_or(s.len());
    s[start..].to_string()
}

fn scripts() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/clients/tubes")
}

/// `serve.lua` once Tarantool and the client are there (else the test fails saying why);
/// `None` when the original is absent and the test passes as skipped.
fn original_available(client: &str, client_check: &[&str]) -> Option<PathBuf> {
    let serve = original(Reference::TarantoolQueue)?;
    let runs = |program: &str, args: &[&str]| match Command::new(program).args(args).output() {
        Ok(out) if out.status.success() => Ok(()),
        Ok(out) => Err(format!(
            "`{program} {}` failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        )),
        Err(e) => Err(format!("cannot run `{program}`: {e}")),
    };
    prerequisite("Tarantool", runs("tarantool", &["--version"]));
    prerequisite(client, runs(client_check[0], &client_check[1..]));
    Some(serve)
}

/// Runs `cmd` to completion within SCRIPT_DEADLINE and fails with everything it and the
/// servers printed unless it exits 0 with its OK line.
fn run_script(cmd: Command, servers: &[&Original]) {
    let shown = format!("{cmd:?}");
    let run = run_with_deadline(cmd, SCRIPT_DEADLINE);
    if matches!(run.status, Some(s) if s.success()) && run.stdout.contains("OK: ") {
        print!("{}", run.stdout);
        return;
    }
    let logs: Vec<String> = servers.iter().map(|s| s.logs()).collect();
    panic!(
        "{shown} ended with {:?}\n--- stdout ---\n{}\n--- stderr ---\n{}\n\
         --- the original's output ---\n{}",
        run.status,
        run.stdout,
        run.stderr,
        logs.join("\n")
    );
}

fn flow_against_original(program: &str, script: &str, check: &[&str], client: &str) {
    let Some(serve) = original_available(client, check) else {
        return;
    };
    let original = Original::start(&serve);
    let mut cmd = Command::new(program);
    cmd.arg(scripts().join(script))
        .arg(original.port.to_string())
        .arg("reference");
    run_script(cmd, &[&original]);
}

#[test]
fn netbox_tubes_flow_holds_against_the_original() {
    flow_against_original(
        "tarantool",
        "netbox_tubes.lua",
        &["tarantool", "--version"],
        "net.box (Debian package `tarantool`)",
    );
}

#[test]
fn python_tubes_flow_holds_against_the_original() {
    flow_against_original(
        "python3",
        "python_tubes.py",
        &["python3", "-c", "import tarantool"],
        "the PyPI `tarantool` connector",
    );
}

#[test]
fn asynctnt_queue_flow_holds_against_the_original() {
    flow_against_original(
        "python3",
        "asynctnt_queue_flow.py",
        &["python3", "-c", "import asynctnt, asynctnt_queue"],
        "the PyPI `asynctnt` and `asynctnt-queue` packages",
    );
}

#[test]
fn differential_runner_finds_two_originals_identical() {
    let Some(serve) = original_available(
        "the PyPI `tarantool` connector",
        &["python3", "-c", "import tarantool"],
    ) else {
        return;
    };
    let (a, b) = (Original::start(&serve), Original::start(&serve));
    let mut cmd = Command::new("python3");
    cmd.arg(scripts().join("diff_tubes.py"))
        .arg(a.port.to_string())
        .arg(b.port.to_string());
    run_script(cmd, &[&a, &b]);
}

#[test]
fn the_original_still_gives_the_recorded_transcript() {
    let Some(serve) = original_available(
        "the PyPI `tarantool` connector",
        &["python3", "-c", "import tarantool"],
    ) else {
        return;
    };
    let original = Original::start(&serve);
    let mut cmd = Command::new("python3");
    cmd.arg(scripts().join("diff_tubes.py"))
        .arg(original.port.to_string())
        .arg("--against")
        .arg(scripts().join("reference_transcript.jsonl"));
    run_script(cmd, &[&original]);
}
