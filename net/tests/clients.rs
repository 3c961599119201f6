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
#[path = "support/tarantool.rs"]
mod tarantool;

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use support::{original, prerequisite, run_with_deadline, Tarq};
use tarantool::{tail, LuaServer, POLL_INTERVAL};
use tarq_testkit::reference::Original;

/// How long a whole script may run: the flows take 1-2 s (one 1 s delay); their own calls are
/// bounded by 10-20 s, so a hung server shows up as a script failure before this.
const SCRIPT_DEADLINE: Duration = Duration::from_secs(90);

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

fn against_tarq(client: Client, args: &[&str]) {
    prerequisite(client.name(), client.available());
    let mut server = Tarq::start(args);
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
    let server = LuaServer::start(&init, "the reference Tarantool queue");
    run_flow(client, server.port, true, || server.logs());
}

#[test]
fn netbox_runs_the_seed_flow_against_tarq() {
    against_tarq(Client::NetBox, &[]);
}

#[test]
fn python_connector_runs_the_seed_flow_against_tarq() {
    against_tarq(Client::Python, &[]);
}

/// A loop that spins before it sleeps serves the same flow: requests that come while it spins,
/// and the flow's delays and take timeouts, which it sleeps through.
#[test]
fn netbox_runs_the_seed_flow_against_a_busy_polling_tarq() {
    against_tarq(Client::NetBox, &["--busy-poll", "200"]);
}

#[test]
fn python_connector_runs_the_seed_flow_against_a_busy_polling_tarq() {
    against_tarq(Client::Python, &["--busy-poll", "200"]);
}

#[test]
fn netbox_flow_holds_against_the_reference_queue() {
    against_reference(Client::NetBox);
}

#[test]
fn python_flow_holds_against_the_reference_queue() {
    against_reference(Client::Python);
}
