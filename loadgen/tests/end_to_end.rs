//! End-to-end runs of the loadgen against real, spawned targets on 127.0.0.1: tarq (a debug
//! build, built here when missing), tarq `--null`, and the peers redis-server, beanstalkd and
//! Tarantool's reference queue. Each run lasts well under a second and ends with a drain; the
//! test checks that messages flowed without errors, that every message put was acked (nothing
//! lost), that each backlog shape runs its phases, and that every output (JSON keys, `.hgrm`
//! files, the suite's README) has its shape. Figures are never asserted: performance is
//! measured, not tested.
//!
//! The peers are Debian packages that `.ci/test` installs. A test whose peer is missing fails
//! and says how to install it.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::time::Duration;
use tarq_loadgen::report::Summary;
use tarq_loadgen::runner::Phase;
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

/// The peer must be installed: a test that cannot run fails with the reason.
fn require_peer(t: Target) {
    if let Some(why) = t.unavailable() {
        panic!("this test needs {t}: {why} (`bash .ci/test` installs it)");
    }
}

fn args(t: Target, out: &Path) -> RunArgs {
    let mut a = RunArgs::shape(t, 2, 2, 4);
    a.duration = DURATION;
    a.warmup = WARMUP;
    a.quiet = true;
    a.no_pin = true;
    a.tarq_bin = Some(tarq_bin());
    a.drain = true;
    a.json = Some(out.join("run.json"));
    a.hgrm = Some(out.join("run").to_string_lossy().into_owned());
    a
}

/// The run drained: every message the target accepted was taken and acked, none is left.
fn check_nothing_lost(s: &Summary) {
    assert!(s.total_puts > 0, "no put was accepted: {s:?}");
    assert_eq!(
        s.total_puts, s.total_acks,
        "puts accepted vs acks of them; first error: {:?}",
        s.first_error
    );
    assert_eq!(s.unacked, 0, "messages left unacked after the drain");
    let last = s.phases.last().expect("a run has phases");
    assert_eq!(last.phase, Phase::Drain);
    assert_eq!(last.unacked, 0);
}

/// The run worked: messages went round, nothing failed or was lost, the figures are
/// consistent, and the JSON on disk has every key a reader of the results relies on.
fn check(s: &Summary, out: &Path) {
    assert_eq!(s.errors, 0, "first error: {:?}", s.first_error);
    check_nothing_lost(s);
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
    for key in ["config", "commit", "machine", "series", "stall", "phases"] {
        assert!(!json[key].is_null(), "JSON lacks {key}");
    }
    for key in ["total_puts", "total_acks", "unacked"] {
        assert!(json[key].is_u64(), "JSON lacks {key}: {json}");
    }
    for phase in json["phases"].as_array().unwrap() {
        for key in ["phase", "measured_s", "puts_per_s", "acks_per_s", "unacked"] {
            assert!(!phase[key].is_null(), "a phase lacks {key}: {phase}");
        }
        assert!(phase["stall"]["gap_us"].is_number(), "{phase}");
        assert!(phase["put_us"]["max"].is_number(), "{phase}");
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
    require_peer(Target::Redis);
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
    require_peer(Target::Beanstalkd);
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
    require_peer(Target::Tarantool);
    let out = tempfile::tempdir().unwrap();
    // The reference's ids are ~1.8e18 (uint64 on the wire): acks that go through prove the
    // driver reads and writes them at full width.
    run_and_check(&args(Target::Tarantool, out.path()), out.path());
}

/// The phases a run went through, by name.
fn phases(s: &Summary) -> Vec<Phase> {
    s.phases.iter().map(|p| p.phase).collect()
}

#[test]
fn a_backlog_is_filled_then_kept_and_drained() {
    /// Small enough to fill in a moment on a debug build, large against the window (16).
    const BACKLOG: u64 = 3_000;
    let out = tempfile::tempdir().unwrap();
    let mut a = args(Target::Tarq, out.path());
    a.backlog = Some(BACKLOG);
    let s = run_and_check(&a, out.path());
    assert_eq!(
        phases(&s),
        [Phase::Fill, Phase::Steady, Phase::Drain],
        "{s:?}"
    );
    let fill = &s.phases[0];
    assert_eq!(fill.puts, BACKLOG);
    assert_eq!(fill.acks, 0, "consumers wait for the fill");
    assert_eq!(fill.unacked, BACKLOG);
    assert!(fill.stall.gap_us > 0.0 && fill.put_us.max >= fill.put_us.p50);
    // Producers stay the backlog ahead: the steady phase ends with at least the backlog out,
    // and its headline window counts the steady phase alone.
    assert!(s.phases[1].unacked >= BACKLOG, "{:?}", s.phases[1]);
    assert_eq!(s.acks_per_s, s.phases[1].acks_per_s);
    assert!(s.phases[1].acks > 0);
    assert!(s.config.window as u64 >= BACKLOG);
    assert!(s.label.ends_with("-backlog3000-drain"), "{}", s.label);
}

#[test]
fn fill_then_drain_reports_both_phases() {
    const FILL: u64 = 5_000;
    let out = tempfile::tempdir().unwrap();
    let mut a = args(Target::Tarq, out.path());
    a.fill = Some(FILL);
    let s = single::run(&a).unwrap_or_else(|e| panic!("fill run failed: {e:#}"));
    let s = s.summary;
    assert_eq!(s.errors, 0, "first error: {:?}", s.first_error);
    check_nothing_lost(&s);
    assert_eq!(phases(&s), [Phase::Fill, Phase::Drain]);
    let (fill, drain) = (&s.phases[0], &s.phases[1]);
    assert_eq!((fill.puts, fill.acks, fill.unacked), (FILL, 0, FILL));
    assert_eq!((drain.puts, drain.acks, drain.unacked), (0, FILL, 0));
    assert!(fill.puts_per_s > 0.0 && drain.acks_per_s > 0.0);
    assert_eq!(fill.put_us.count, FILL);
    assert_eq!(drain.e2e_us.count, FILL);
    // Without a steady phase the headline is both phases together.
    assert_eq!((s.put_us.count, s.e2e_us.count), (FILL, FILL));
    // Every second of the fill has its slowest put.
    assert!(fill
        .series
        .iter()
        .all(|p| p.puts == 0 || p.put_max_us > 0.0));
    assert!(s.table().contains("fill"), "{}", s.table());
}

#[test]
fn unbounded_producers_never_wait_and_nothing_is_lost() {
    let out = tempfile::tempdir().unwrap();
    let mut a = args(Target::Tarq, out.path());
    a.unbounded = true;
    let s = run_and_check(&a, out.path());
    assert!(s.config.unbounded);
    assert_eq!(s.config.window, usize::MAX);
}

#[test]
fn target_args_reach_the_spawned_tarq() {
    let out = tempfile::tempdir().unwrap();
    let mut a = args(Target::Tarq, out.path());
    a.target_args = Some("--wal-mode fsync".into());
    let s = run_and_check(&a, out.path());
    assert!(
        s.config
            .command
            .contains("--target-args '--wal-mode fsync'"),
        "{}",
        s.config.command
    );
    // A flag tarq refuses stops it at start-up, so the arguments did reach it.
    a.target_args = Some("--wal-mode sometimes".into());
    let err = single::run(&a).err().expect("tarq refuses the WAL mode");
    assert!(
        format!("{err:#}").contains("exited during start-up"),
        "{err:#}"
    );
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
