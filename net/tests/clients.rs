//! Real clients against a real server: Tarantool's own net.box (a Lua script run by the
//! `tarantool` binary) and the PyPI `tarantool` connector (a Python script) each run the seed's
//! flow from `tests/clients/` against the `tarq` binary, unchanged. The same scripts also run
//! against the seed queue itself on a real Tarantool (the reference), which proves the scripts
//! check the behaviour clients actually get. This file owns the processes (server, reference,
//! scripts) and their deadlines; what is checked lives in the scripts.
//!
//! A client that is not installed fails the test, naming it (`bash .ci/test` installs them).
//! The seed queue is not part of the repository: without it the reference tests pass as
//! skipped, saying where to get it, except under `CI=true` (see `tarq_testkit::reference`).

mod support;

use std::fs::File;
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use support::{listening_port, original, prerequisite, run_with_deadline, Proc, Tarq};
use tarq_testkit::reference::Original;
use tempfile::TempDir;

/// How long the reference Tarantool gets to accept connections: it starts in about half a
/// second; this leaves room for a machine busy building.
const START_DEADLINE: Duration = Duration::from_secs(20);
/// How long a whole script may run: the flows take 1-2 s (one 1 s delay); their own calls are
/// bounded by 10-20 s, so a hung server shows up as a script failure before this.
const SCRIPT_DEADLINE: Duration = Duration::from_secs(90);
/// Pause between two checks of a process or port being ready: a polling interval, not a wait
/// for anything in particular.
const POLL_INTERVAL: Duration = Duration::from_millis(10);
/// The tail of a server's log shown when a script fails.
const LOG_TAIL_BYTES: usize = 4000;

/// Which client drives the flow.
#[derive(Clone, Copy)]
enum Client {
    NetBox,
    Python,
}

impl Client {
    fn name(self) -> &'static str {
        match self {
            Client::NetBox => "net.box (Debian package `tarantool`)",
            Client::Python => "the PyPI `tarantool` connector",
        }
    }

    /// Whether the client can run here, or why not.
    fn available(self) -> Result<(), String> {
        let (program, args): (&str, &[&str]) = match self {
            Client::NetBox => ("tarantool", &["--version"]),
            Client::Python => ("python3", &["-c", "import tarantool"]),
        };
        match Command::new(program).args(args).output() {
            Ok(out) if out.status.success() => Ok(()),
            Ok(out) => Err(format!(
                "`{program} {}` failed: {}",
                args.join(" "),
                String::from_utf8_lossy(&out.stderr).trim()
            )),
            Err(e) => Err(format!("cannot run `{program}`: {e}")),
        }
    }

    fn command(self, port: u16, reference: bool) -> Command {
        let scripts = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/clients");
        let mut cmd = match self {
            Client::NetBox => {
                let mut c = Command::new("tarantool");
                c.arg(scripts.join("netbox_flow.lua"));
                c
            }
            Client::Python => {
                let mut c = Command::new("python3");
                c.arg(scripts.join("python_flow.py"));
                c
            }
        };
        cmd.arg(port.to_string());
        if reference {
            cmd.arg("reference");
        }
        cmd
    }
}

/// The reference Tarantool with its data directory, killed on drop (before the directory goes).
struct Reference {
    proc: Proc,
    /// The port it got from port 0, read from `/proc` once it listens (0 until then).
    port: u16,
    /// What the process printed (stdout and stderr).
    out: PathBuf,
    /// Its log file, which shows a line once it serves requests (it accepts connections
    /// before that).
    log: PathBuf,
    _dir: TempDir,
}

/// The name of the reference Tarantool's log file in its work dir.
const TARANTOOL_LOG: &str = "tarantool.log";
/// The line of that log that says the queue is defined.
const TARANTOOL_READY: &str = "entering the event loop";

impl Reference {
    /// Starts the seed queue on a real Tarantool on port 0 and waits until `queue` is defined
    /// (it listens before that, so a connect is not enough: its log says when it is ready).
    fn start(init_lua: &Path) -> Reference {
        let dir = tempfile::tempdir().expect("temp dir");
        let out = dir.path().join("server.out");
        let file = File::create(&out).expect("create the server's output file");
        let log = dir.path().join(TARANTOOL_LOG);
        let proc = Proc::spawn(
            Command::new("tarantool")
                .arg(init_lua)
                .env("WORKDIR", dir.path())
                .env("LISTEN", "127.0.0.1:0")
                .env("LOGFILE", &log)
                .current_dir(dir.path())
                .stdin(Stdio::null())
                .stdout(Stdio::from(file.try_clone().expect("dup output file")))
                .stderr(Stdio::from(file)),
        );
        let mut server = Reference {
            proc,
            port: 0,
            out,
            log,
            _dir: dir,
        };
        if let Err(e) = server.wait_ready() {
            panic!("the reference Tarantool queue did not start: {e}");
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
            if read_lossy(&self.log).contains(TARANTOOL_READY) {
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
    fn logs(&self) -> String {
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

fn tail(s: &str) -> String {
    let start = s.len().saturating_sub(LOG_TAIL_BYTES);
    let start = (start..s.len())
        .find(|&i| s.is_char_boundary(i))
        .unwrap_or(s.len());
    s[start..].to_string()
}

/// Runs the client's flow script against the server on `port` and fails with everything both
/// printed (`logs` gives the server's side).
fn run_flow(client: Client, port: u16, reference: bool, logs: impl FnOnce() -> String) {
    let target = if reference {
        "the reference queue"
    } else {
        "tarq"
    };
    let cmd = client.command(port, reference);
    let shown = format!("{cmd:?}");
    let run = run_with_deadline(cmd, SCRIPT_DEADLINE);
    let outcome = match run.status {
        Some(s) if s.success() && run.stdout.contains("\nOK: ") => {
            print!("{}", run.stdout);
            return;
        }
        Some(s) if s.success() => "exited 0 without its OK line".to_string(),
        Some(s) => format!("failed ({s})"),
        None => format!("did not finish within {SCRIPT_DEADLINE:?}"),
    };
    panic!(
        "{} flow against {target} {outcome}: {shown}\n--- script stdout ---\n{}\n\
         --- script stderr ---\n{}\n--- server output ---\n{}",
        client.name(),
        run.stdout,
        run.stderr,
        logs()
    );
}

fn against_tarq(client: Client) {
    prerequisite(client.name(), client.available());
    let mut server = Tarq::start(&[]);
    run_flow(client, server.addr.port(), false, || {
        server.lines.drain(POLL_INTERVAL);
        tail(&server.log().join("\n"))
    });
}

fn against_reference(client: Client) {
    let Some(init) = original(Original::SeedQueue) else {
        return;
    };
    prerequisite(client.name(), client.available());
    prerequisite(
        "Tarantool (runs the reference queue)",
        Client::NetBox.available(),
    );
    let server = Reference::start(&init);
    run_flow(client, server.port, true, || server.logs());
}

#[test]
fn netbox_runs_the_seed_flow_against_tarq() {
    against_tarq(Client::NetBox);
}

#[test]
fn python_connector_runs_the_seed_flow_against_tarq() {
    against_tarq(Client::Python);
}

#[test]
fn netbox_flow_holds_against_the_reference_queue() {
    against_reference(Client::NetBox);
}

#[test]
fn python_flow_holds_against_the_reference_queue() {
    against_reference(Client::Python);
}
