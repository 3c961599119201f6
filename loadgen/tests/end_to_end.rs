//! End-to-end runs of the loadgen against real, spawned targets on 127.0.0.1: tarq (a debug
//! build, built here when missing), tarq `--null`, and the peers redis-server, beanstalkd and
//! Tarantool's reference queue. Each run lasts well under a second; the test checks that messages
//! flowed without errors and that every output (JSON keys, `.hgrm` files, the suite's README)
//! has its shape. Figures are never asserted: performance is measured, not tested.
//!
//! The peers are Debian packages that `.ci/test` installs. A test whose peer is missing says
//! so and returns, except under `CI=true`, where a missing peer fails the test.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::time::Duration;
use tarq_loadgen::report::Summary;
use tarq_loadgen::single::{self, RunArgs};
use tarq_loadgen::suite::{self, SuiteArgs};
use tarq_loadgen::target::{self, Target};

/// Measured time per test run: enough for hundreds of messages even on a loaded machine.
const DURATION: Duration = Duration::from_millis(500);
/// Warm-up per test run.
const WARMUP: Duration = Duration::from_millis(100);

/// The tarq debug binary, built once for all tests of this file.
fn tarq_bin() -> PathBuf {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| {
        let root = target::workspace_root();
        let status = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
            .args(["build", "-q", "-p", "tarq-net", "--bin", "tarq"])
            .current_dir(&root)
            .status()
            .expect("running cargo build -p tarq-net");
        assert!(
            status.success(),
            "cargo build -p tarq-net --bin tarq failed"
        );
        let dir = std::env::var_os("CARGO_TARGET_DIR")
            .map(PathBuf::from)
            .unwrap_or_else(|| root.join("target"));
        let bin = dir.join("debug/tarq");
        assert!(bin.exists(), "{} missing after the build", bin.display());
        bin
    })
    .clone()
}

/// The peer can run here, or the test fails saying why: a test that cannot run never passes.
fn peer_present(t: Target) -> bool {
    if let Some(why) = t.unavailable() {
        panic!("this test needs {t}: {why} (`bash .ci/test` installs it)")
    }
    true
}

fn args(t: Target, out: &Path) -> RunArgs {
    let mut a = RunArgs::shape(t, 2, 2, 4);
    a.duration = DURATION;
    a.warmup = WARMUP;
    a.quiet = true;
    a.no_pin = true;
    a.tarq_bin = Some(tarq_bin());
    a.json = Some(out.join("run.json"));
    a.hgrm = Some(out.join("run").to_string_lossy().into_owned());
    a
}

/// The run worked: messages went round, nothing failed, the figures are consistent, and the
/// JSON on disk has every key the issue names.
fn check(s: &Summary, out: &Path) {
    assert_eq!(s.errors, 0, "first error: {:?}", s.first_error);
    assert!(
        s.msgs_per_s > 0.0 && s.e2e_us.count > 0,
        "no message completed: {s:?}"
    );
    assert_eq!(s.e2e_us.count, s.cycle_us.count);
    assert_eq!(s.foreign_messages, 0);
    // The loadgen's own send delay is measured exactly when there is a schedule to keep.
    assert_eq!(s.send_lag_us.is_some(), s.config.rate.is_some());
    assert!(
        s.target_cpu.is_some() && s.other_cpu.is_some(),
        "spawned: CPU is accounted"
    );
    for p in [&s.put_us, &s.cycle_us, &s.e2e_us] {
        assert!(p.count > 0);
        assert!(
            0.0 < p.p50 && p.p50 <= p.p90 && p.p90 <= p.p99 && p.p99 <= p.p999 && p.p999 <= p.max,
            "{p:?}"
        );
    }
    // Each message's take→ack lies inside its put→ack, so every percentile keeps that order.
    assert!(
        s.e2e_us.p50 >= s.cycle_us.p50,
        "{:?} vs {:?}",
        s.e2e_us,
        s.cycle_us
    );
    assert!(
        s.e2e_us.max >= s.cycle_us.max,
        "{:?} vs {:?}",
        s.e2e_us,
        s.cycle_us
    );

    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("run.json")).unwrap()).unwrap();
    for key in ["msgs_per_s", "puts_per_s", "acks_per_s", "errors"] {
        assert!(json[key].is_number(), "JSON lacks {key}: {json}");
    }
    for lat in ["put_us", "cycle_us", "e2e_us"] {
        for key in ["p50", "p90", "p99", "p999", "max"] {
            assert!(json[lat][key].is_number(), "JSON lacks {lat}.{key}");
        }
    }
    for key in ["config", "commit", "machine", "series"] {
        assert!(!json[key].is_null(), "JSON lacks {key}");
    }
    assert!(json["machine"]["cores"].as_u64().unwrap() >= 1);
    assert!(json["series"].as_array().is_some_and(|s| !s.is_empty()));
    for name in ["put", "cycle", "e2e"] {
        let hgrm = std::fs::read_to_string(out.join(format!("run-{name}.hgrm"))).unwrap();
        assert!(
            hgrm.contains("Percentile") && hgrm.contains("#[Max"),
            "{hgrm}"
        );
    }
}

fn run_and_check(a: &RunArgs, out: &Path) -> Summary {
    let finished = single::run(a).unwrap_or_else(|e| panic!("{} run failed: {e:#}", a.target));
    check(&finished.summary, out);
    finished.summary
}

#[test]
fn closed_loop_against_tarq() {
    let out = tempfile::tempdir().unwrap();
    let s = run_and_check(&args(Target::Tarq, out.path()), out.path());
    assert_eq!(s.config.target, Target::Tarq);
    assert!(s.target_cpu.is_some(), "a spawned target's CPU is measured");
    assert!(s.table().contains("put→ack"));
}

#[test]
fn null_target_keeps_the_queue_in_the_loadgen() {
    let out = tempfile::tempdir().unwrap();
    run_and_check(&args(Target::Null, out.path()), out.path());
}

#[test]
fn open_loop_sends_on_schedule() {
    /// Low enough that any machine keeps up, so the schedule, not the target, sets the pace.
    const RATE: f64 = 2_000.0;
    let out = tempfile::tempdir().unwrap();
    let mut a = args(Target::Tarq, out.path());
    a.rate = Some(RATE);
    let s = run_and_check(&a, out.path());
    assert_eq!(s.config.rate, Some(RATE));
    // The loadgen never sends ahead of the schedule; it may fall behind on a loaded machine.
    assert!(
        s.puts_per_s <= RATE * 1.05,
        "{} puts/s at rate {RATE}",
        s.puts_per_s
    );
    assert!(
        s.puts_per_s >= RATE * 0.5,
        "{} puts/s at rate {RATE}",
        s.puts_per_s
    );
}

#[test]
fn closed_and_open_loop_against_redis() {
    if !peer_present(Target::Redis) {
        return;
    }
    let out = tempfile::tempdir().unwrap();
    run_and_check(&args(Target::Redis, out.path()), out.path());
    // At a low open-loop rate the queue is mostly empty: consumers park behind one blocking
    // take per connection, and every message must still come through.
    let mut a = args(Target::Redis, out.path());
    a.rate = Some(1_000.0);
    run_and_check(&a, out.path());
}

#[test]
fn closed_and_open_loop_against_beanstalkd() {
    if !peer_present(Target::Beanstalkd) {
        return;
    }
    let out = tempfile::tempdir().unwrap();
    run_and_check(&args(Target::Beanstalkd, out.path()), out.path());
    // At a low open-loop rate the queue is mostly empty: consumers park behind one blocking
    // take per connection, and every message must still come through.
    let mut a = args(Target::Beanstalkd, out.path());
    a.rate = Some(1_000.0);
    run_and_check(&a, out.path());
}

#[test]
fn closed_loop_against_the_reference_tarantool_queue() {
    if !peer_present(Target::Tarantool) {
        return;
    }
    let out = tempfile::tempdir().unwrap();
    // The reference's ids are ~1.8e18 (uint64 on the wire): acks that go through prove the
    // driver reads and writes them at full width.
    run_and_check(&args(Target::Tarantool, out.path()), out.path());
}

#[test]
fn suite_writes_results_and_readme() {
    let out = tempfile::tempdir().unwrap();
    let sa = SuiteArgs {
        duration: Duration::from_millis(300),
        warmup: Duration::from_millis(50),
        targets: vec![Target::Tarq, Target::Null],
        shapes: vec!["1x1".into()],
        depths: vec![1, 4],
        open_loop: vec![50],
        open_shape: "1x1".into(),
        open_depth: 4,
        payload: 32,
        out: Some(out.path().to_path_buf()),
        note: Some("test run".into()),
        tarq_bin: Some(tarq_bin()),
        no_pin: true,
        no_spin: true,
        attempts: 1,
        report_only: None,
    };
    suite::run(&sa).unwrap();
    let readme = std::fs::read_to_string(out.path().join("README.md")).unwrap();
    for needle in [
        "| connections | depth | tarq | null | tarq / null |",
        "| 1+1 | 1 |",
        "| 1+1 | 4 |",
        "## tarq open loop",
        "latency-p1c1-d4.svg",
        "tarq-loadgen --target tarq --spawn --producers 1 --consumers 1 --depth 4",
        "note: test run",
    ] {
        assert!(
            readme.contains(needle),
            "README lacks {needle:?}:\n{readme}"
        );
    }
    let dirs: Vec<_> = std::fs::read_dir(out.path())
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.is_dir())
        .collect();
    assert_eq!(dirs.len(), 1, "one suite directory: {dirs:?}");
    let dir = &dirs[0];
    for f in [
        "suite.json",
        "tarq-p1c1-d1.json",
        "null-p1c1-d4.json",
        "tarq-p1c1-d4-e2e.hgrm",
        "throughput-p1c1-d1.svg",
        "latency-open-loop.svg",
    ] {
        assert!(dir.join(f).exists(), "{f} missing in {}", dir.display());
    }
    // Redrawing from the files alone gives the same page.
    std::fs::remove_file(out.path().join("README.md")).unwrap();
    let mut again = sa.clone();
    again.report_only = Some(PathBuf::new());
    suite::run(&again).unwrap();
    assert_eq!(
        std::fs::read_to_string(out.path().join("README.md")).unwrap(),
        readme
    );
}
