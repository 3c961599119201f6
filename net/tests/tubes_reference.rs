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
#[path = "support/tarantool.rs"]
mod tarantool;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use support::{original, prerequisite, run_with_deadline};
use tarantool::LuaServer;
use tarq_testkit::reference::Original as Reference;

/// How long a whole script may run: the flows take 3-6 s (short delays and TTRs); their own
/// calls are bounded by 20-30 s, so a hung server shows up as a script failure before this.
const SCRIPT_DEADLINE: Duration = Duration::from_secs(120);

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
fn run_script(cmd: Command, servers: &[&LuaServer]) {
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
    let original = LuaServer::start(&serve, "the original tarantool/queue");
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
    let (a, b) = (
        LuaServer::start(&serve, "the original tarantool/queue"),
        LuaServer::start(&serve, "the original tarantool/queue"),
    );
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
    let original = LuaServer::start(&serve, "the original tarantool/queue");
    let mut cmd = Command::new("python3");
    cmd.arg(scripts().join("diff_tubes.py"))
        .arg(original.port.to_string())
        .arg("--against")
        .arg(scripts().join("reference_transcript.jsonl"));
    run_script(cmd, &[&original]);
}
