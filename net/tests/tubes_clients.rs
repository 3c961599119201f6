//! The tarantool/queue client scripts of `tests/clients/tubes/` against tarq: each real-client
//! flow (net.box, the PyPI `tarantool` connector, `asynctnt-queue`) passes against a fresh
//! `tarq`, the differential runner finds tarq's replies identical to the original's recorded
//! transcript (`reference_transcript.jsonl`, 295 calls), and the API works under another
//! namespace. `tubes_reference.rs` runs the same scripts against the original, which proves
//! they check what tarantool/queue users get. This file owns the processes and their
//! deadlines; what is checked lives in the scripts.
//!
//! A tool that is not installed fails the test, naming it (`bash .ci/test` installs them).

mod support;

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use support::{run_with_deadline, Tarq};

/// How long a whole script may run: the flows take 3-6 s (short delays and TTRs); their own
/// calls are bounded by 20-30 s, so a hung server shows up as a script failure before this.
const SCRIPT_DEADLINE: Duration = Duration::from_secs(120);
/// The tail of tarq's log shown when a script fails.
const LOG_TAIL_LINES: usize = 40;

fn scripts() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/clients/tubes")
}

/// Runs `cmd` to its end (bounded) and fails with its output and tarq's log unless it exits
/// 0 having printed its "OK: " line.
fn run_script(cmd: Command, tarq: &Tarq) {
    let shown = format!("{cmd:?}");
    let run = run_with_deadline(cmd, SCRIPT_DEADLINE);
    if matches!(run.status, Some(s) if s.success()) && run.stdout.contains("OK: ") {
        print!("{}", run.stdout);
        return;
    }
    let log = tarq.log();
    let tail = &log[log.len().saturating_sub(LOG_TAIL_LINES)..];
    panic!(
        "{shown} ended with {:?}\n--- stdout ---\n{}\n--- stderr ---\n{}\n--- tarq's log ---\n{}",
        run.status,
        run.stdout,
        run.stderr,
        tail.join("\n")
    );
}

fn script(program: &str, name: &str, tarq: &Tarq) -> Command {
    let mut cmd = Command::new(program);
    cmd.arg(scripts().join(name))
        .arg(tarq.addr.port().to_string());
    cmd
}

#[test]
fn python_tubes_flow_passes_against_tarq() {
    support::require_command(
        "the PyPI `tarantool` connector",
        &["python3", "-c", "import tarantool"],
    );
    let tarq = Tarq::start(&[]);
    run_script(script("python3", "python_tubes.py", &tarq), &tarq);
}

#[test]
fn asynctnt_queue_flow_passes_against_tarq() {
    support::require_command(
        "the PyPI `asynctnt` and `asynctnt-queue` packages",
        &["python3", "-c", "import asynctnt, asynctnt_queue"],
    );
    let tarq = Tarq::start(&[]);
    run_script(script("python3", "asynctnt_queue_flow.py", &tarq), &tarq);
}

#[test]
fn netbox_tubes_flow_passes_against_tarq() {
    support::require_command(
        "net.box (Debian package `tarantool`)",
        &["tarantool", "--version"],
    );
    let tarq = Tarq::start(&[]);
    run_script(script("tarantool", "netbox_tubes.lua", &tarq), &tarq);
}

#[test]
fn tarq_answers_the_scenario_as_the_original_did() {
    support::require_command(
        "the PyPI `tarantool` connector",
        &["python3", "-c", "import tarantool"],
    );
    let tarq = Tarq::start(&[]);
    let mut cmd = script("python3", "diff_tubes.py", &tarq);
    cmd.arg("--script")
        .arg(scripts().join("scenario.json"))
        .arg("--against")
        .arg(scripts().join("reference_transcript.jsonl"));
    run_script(cmd, &tarq);
}

#[test]
fn the_api_is_served_under_another_namespace() {
    support::require_command(
        "the PyPI `tarantool` connector",
        &["python3", "-c", "import tarantool"],
    );
    let tarq = Tarq::start(&["--queue-namespace", "box.queue"]);
    let program = r#"
import sys, tarantool
c = tarantool.connect('127.0.0.1', int(sys.argv[1]))
c.call('box.queue.create_tube', ('jobs', 'fifottl'))
task = c.call('box.queue.tube.jobs:put', ('hello', {'pri': 1})).data[0]
assert task[1:] == ['r', 'hello'], task
taken = c.call('box.queue.tube.jobs:take', (0,)).data[0]
assert taken[:2] == [task[0], 't'], taken
done = c.call('box.queue.tube.jobs:ack', (task[0],)).data[0]
assert done[1] == '-', done
try:
    c.call('queue.tube.jobs:put', ('x',))
    sys.exit('the default namespace answered although another is configured')
except tarantool.DatabaseError as e:
    assert 'is not defined' in str(e), e
print('OK: the tube API under box.queue')
"#;
    let mut cmd = Command::new("python3");
    cmd.arg("-c").arg(program).arg(tarq.addr.port().to_string());
    run_script(cmd, &tarq);
}

#[test]
fn batches_put_take_and_ack_many_in_one_call_and_survive_a_restart() {
    support::require_command(
        "the PyPI `tarantool` connector",
        &["python3", "-c", "import tarantool"],
    );
    let tarq = Tarq::start(&[]);
    let first = r#"
import sys, tarantool
c = tarantool.connect('127.0.0.1', int(sys.argv[1]))
c.call('queue.create_tube', ('b', 'limfifottl', {'capacity': 3}))
put = c.call('queue.tube.b:put_many', (['a', 'b', {'x': 1}, 'd'], {'pri': 1})).data
assert [t[1:] for t in put[:3]] == [['r', 'a'], ['r', 'b'], ['r', {'x': 1}]], put
assert put[3] is None, 'the fourth finds the tube full: ' + repr(put)
taken = c.call('queue.tube.b:take_many', (2, 0)).data
assert [t[1] for t in taken] == ['t', 't'] and [t[0] for t in taken] == [t[0] for t in put[:2]], taken
acked = c.call('queue.tube.b:ack_many', ([taken[0][0], put[2][0], 999999],)).data
assert acked[0][1] == '-' and acked[1] is None and acked[2] is None, acked
assert c.call('queue.tube.b:take_many', (5, 0)).data == [[put[2][0], 't', {'x': 1}]]
try:
    c.call('queue.tube.b:take_many', (0,))
    sys.exit('a count of 0 was accepted')
except tarantool.DatabaseError as e:
    assert 'take_many needs a count from 1 to 10000' in str(e), e
print('OK: batches')
"#;
    let mut cmd = Command::new("python3");
    cmd.arg("-c").arg(first).arg(tarq.addr.port().to_string());
    run_script(cmd, &tarq);
    // A clean stop and a start on the same data: the tube and its two unacked tasks are back
    // (taken ones released, as after any restart).
    tarq.signal("TERM");
    let mut tarq = tarq;
    assert!(tarq.wait_exit().success());
    let dir = std::mem::replace(&mut tarq.dir, tempfile::tempdir().unwrap());
    let again = Tarq::start_in(dir, &[]);
    let second = r#"
import sys, tarantool
c = tarantool.connect('127.0.0.1', int(sys.argv[1]))
s = c.call('queue.statistics', ('b',)).data[0]
assert s['tasks']['ready'] == 2 and s['tasks']['total'] == 2, s
print('OK: batches survive a restart')
"#;
    let mut cmd = Command::new("python3");
    cmd.arg("-c").arg(second).arg(again.addr.port().to_string());
    run_script(cmd, &again);
}
