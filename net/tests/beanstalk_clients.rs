//! Real beanstalkd clients against tarq's beanstalk port (`--beanstalk-listen`): greenstalk
//! (PyPI) and the `beanstalkd` npm client each run a flow of every command a client can send
//! (`tests/clients/beanstalk/`), once against a real beanstalkd and once against a fresh tarq,
//! and the two normalised transcripts must be equal. Running the same script against beanstalkd
//! is what proves it checks what beanstalkd users get. This file owns the processes and their
//! deadlines; what is driven and how it is normalised lives in the scripts.
//!
//! A tool that is not installed (beanstalkd, python3 with greenstalk, node with the npm
//! packages) fails the test, naming it (`bash .ci/test` installs them).

mod support;

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Duration;

use support::{
    addr_in, listening_port, prerequisite, run_with_deadline, tool, wait_until, Proc, Tarq,
};

/// How long a whole script may run: the flows take about 3 s (three 1 s waits for a delay, a
/// TTR and a pause); their own calls are bounded by 20 s, so a hung server shows up as a script
/// failure before this.
const SCRIPT_DEADLINE: Duration = Duration::from_secs(90);
/// The tail of tarq's log shown when a script fails, and how long to collect it.
const LOG_TAIL_LINES: usize = 40;
const LOG_DRAIN: Duration = Duration::from_millis(200);
/// The line each flow prints last: a transcript without it did not run to its end.
const END: &str = "end of flow";

fn scripts() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/clients/beanstalk")
}

/// A real beanstalkd on port 0, killed on drop; its port is the one its process listens on.
struct Beanstalkd {
    _proc: Proc,
    port: u16,
}

impl Beanstalkd {
    fn start() -> Beanstalkd {
        let bin = prerequisite(
            "beanstalkd (Debian package `beanstalkd`)",
            tool("beanstalkd"),
        );
        let mut proc = Proc::spawn(
            Command::new(bin)
                .args(["-l", "127.0.0.1", "-p", "0"])
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null()),
        );
        let mut port = None;
        wait_until("beanstalkd to listen", || {
            if let Some(status) = proc.0.try_wait().unwrap() {
                panic!("beanstalkd exited with {status}");
            }
            // Listening is enough (connections wait in its backlog); a probe connection
            // would be counted in beanstalkd's `current-connections` until it read the close.
            port = listening_port(proc.id());
            port.is_some()
        });
        Beanstalkd {
            _proc: proc,
            port: port.expect("listening"),
        }
    }
}

/// A fresh tarq (temporary data dir) also serving beanstalk on a free port, and that port (from
/// its "serving the beanstalk protocol" line, logged before it serves).
fn start_tarq() -> (Tarq, u16) {
    let mut tarq = Tarq::start(&["--beanstalk-listen", "127.0.0.1:0"]);
    let line = tarq.wait_for_line("serving the beanstalk protocol");
    let addr = addr_in(&line, "listen=").expect("the line names the beanstalk address");
    (tarq, addr.port())
}

/// Runs `program script 127.0.0.1 port` to its end (bounded) and returns its transcript, or
/// what went wrong with its output unless it exits 0 having printed [`END`] last.
fn transcript(program: &str, script: &str, server: &str, port: u16) -> Result<String, String> {
    let mut cmd = Command::new(program);
    cmd.arg(scripts().join(script))
        .arg("127.0.0.1")
        .arg(port.to_string())
        .current_dir(scripts());
    let shown = format!("{cmd:?} against {server}");
    let run = run_with_deadline(cmd, SCRIPT_DEADLINE);
    if matches!(run.status, Some(s) if s.success()) && run.stdout.trim_end().ends_with(END) {
        return Ok(run.stdout);
    }
    Err(format!(
        "{shown} ended with {:?}\n--- stdout ---\n{}\n--- stderr ---\n{}",
        run.status, run.stdout, run.stderr
    ))
}

/// The flow's transcript against real beanstalkd, then against tarq; they must be equal.
fn same_replies_from_beanstalkd_and_tarq(program: &str, script: &str) {
    let want = {
        let reference = Beanstalkd::start();
        transcript(program, script, "beanstalkd", reference.port).unwrap_or_else(|e| panic!("{e}"))
    };
    let (mut tarq, port) = start_tarq();
    let got = transcript(program, script, "tarq", port).unwrap_or_else(|e| {
        tarq.lines.drain(LOG_DRAIN);
        let log = tarq.log();
        let tail = &log[log.len().saturating_sub(LOG_TAIL_LINES)..];
        panic!("{e}\n--- tarq's log ---\n{}", tail.join("\n"))
    });
    if got == want {
        print!("{got}");
        return;
    }
    let first = want
        .lines()
        .zip(got.lines())
        .position(|(w, g)| w != g)
        .unwrap_or_else(|| want.lines().count().min(got.lines().count()));
    panic!(
        "{script}: tarq's transcript differs from beanstalkd's from line {}\n\
         --- beanstalkd ---\n{want}--- tarq ---\n{got}",
        first + 1
    );
}

#[test]
fn greenstalk_gets_the_same_replies_from_tarq_as_from_beanstalkd() {
    support::require_command(
        "python3 with the PyPI `greenstalk` client",
        &["python3", "-c", "import greenstalk"],
    );
    same_replies_from_beanstalkd_and_tarq("python3", "greenstalk_flow.py");
}

#[test]
fn the_npm_beanstalkd_client_gets_the_same_replies_from_tarq_as_from_beanstalkd() {
    support::require_command(
        "node with the npm `beanstalkd` client (`npm ci` in net/tests/clients/beanstalk)",
        &[
            "node",
            "-e",
            "require(require('path').resolve(process.argv[1], 'node_modules/beanstalkd'))",
            scripts().to_str().unwrap(),
        ],
    );
    same_replies_from_beanstalkd_and_tarq("node", "node_flow.js");
}
