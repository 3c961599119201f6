//! End-to-end runs of the loadgen against real, spawned targets on 127.0.0.1: tarq (a debug
//! build, built here when missing), tarq `--null`, and the peers redis-server, beanstalkd and
//! Tarantool's reference queue. Each run lasts well under a second and ends with a drain; the
//! test checks that messages flowed without errors, that every message put was acked (nothing
//! lost), that each backlog shape runs its phases, and that every output (JSON keys, `.hgrm`
//! files, the suite's README) has its shape. Figures are never asserted: performance is
//! measured, not tested.
//!
//! The peers are Debian packages that `.ci/test` installs. A test whose peer is missing fails
//! and says how to install it. The originals Tarantool runs are not part of the repository:
//! without them their tests pass as skipped, except under `CI=true` (`tarq_testkit::reference`).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::time::Duration;
use tarq_loadgen::proto::iproto::{Api, TubeType};
use tarq_loadgen::report::Summary;
use tarq_loadgen::runner::Phase;
use tarq_loadgen::single::{self, RunArgs};
use tarq_loadgen::suite::{self, SuiteArgs};
use tarq_loadgen::target::{self, Target};
use tarq_testkit::reference;

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

/// The original a Tarantool target runs, when it has one: not part of the repository, so
/// without it the test passes as skipped (saying where to get it), except under `CI=true`.
fn original_present(t: Target) -> bool {
    t.original()
        .is_none_or(|o| reference::needed(o, &target::workspace_root()).is_some())
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
    if !original_present(Target::Tarantool) {
        return;
    }
    require_peer(Target::Tarantool);
    let out = tempfile::tempdir().unwrap();
    // The reference's ids are ~1.8e18 (uint64 on the wire): acks that go through prove the
    // driver reads and writes them at full width.
    run_and_check(&args(Target::Tarantool, out.path()), out.path());
}

#[test]
fn the_original_tarantool_queue_fifottl_and_utube() {
    if !original_present(Target::TarantoolQueue) {
        return;
    }
    require_peer(Target::TarantoolQueue);
    let out = tempfile::tempdir().unwrap();
    // tarantool/queue 1.5.0 spawned from serve.lua, the tube created by the loadgen.
    let s = run_and_check(&args(Target::TarantoolQueue, out.path()), out.path());
    assert_eq!(s.config.api, Api::Tubes);
    assert_eq!(s.config.tube_type, Some(TubeType::Fifottl));
    assert!(
        s.label.starts_with("tarantool-queue-fifottl-"),
        "{}",
        s.label
    );
    // utube: tasks spread over keys, each key taken by one consumer at a time.
    let mut a = args(Target::TarantoolQueue, out.path());
    a.tube = Some("keyed".into());
    a.tube_type = Some(TubeType::Utube);
    a.utubes = Some(8);
    let s = run_and_check(&a, out.path());
    assert_eq!(s.config.utubes, Some(8));
    assert!(s.config.command.contains("--tube-type utube --utubes 8"));
}

/// The text tarq's IPROTO front-end answers for a procedure it does not know.
const NOT_DEFINED: &str = "Procedure 'queue.create_tube' is not defined";

#[test]
fn tubes_api_against_tarq_runs_or_names_the_missing_api() {
    let out = tempfile::tempdir().unwrap();
    let mut a = args(Target::Tarq, out.path());
    a.api = Some(Api::Tubes);
    a.tube_type = Some(TubeType::Fifottl);
    // Once tarq serves tubes this is a full run; until then the one acceptable failure is the
    // clear refusal of queue.create_tube.
    match single::run(&a) {
        Ok(f) => {
            check(&f.summary, out.path());
            assert!(f.summary.label.starts_with("tarq-tubes-fifottl-"));
        }
        Err(e) => {
            let msg = format!("{e:#}");
            assert!(
                msg.contains("does not serve the tarantool/queue API") && msg.contains(NOT_DEFINED),
                "{msg}"
            );
        }
    }
}

#[test]
fn beanstalk_port_of_tarq_runs() {
    let out = tempfile::tempdir().unwrap();
    let a = args(Target::TarqBeanstalk, out.path());
    let f = single::run(&a).unwrap_or_else(|e| panic!("{e:#}"));
    check(&f.summary, out.path());
}

/// beanstalkd's `binlog-current-index` from `stats`: 0 without a binlog.
fn binlog_index(addr: std::net::SocketAddr) -> u64 {
    use std::io::{BufRead, BufReader, Write};
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    s.write_all(b"stats\r\n").unwrap();
    let reader = BufReader::new(s);
    for line in reader.lines() {
        let line = line.unwrap();
        if let Some(v) = line.strip_prefix("binlog-current-index: ") {
            return v.trim().parse().unwrap();
        }
    }
    panic!("stats without binlog-current-index")
}

#[test]
fn beanstalkd_with_binlog() {
    require_peer(Target::BeanstalkdBinlog);
    let out = tempfile::tempdir().unwrap();
    let opts = target::SpawnOptions {
        cpu: None,
        tarq_bin: None,
        rebuild: false,
        args: Vec::new(),
    };
    for (t, logging) in [
        (Target::BeanstalkdBinlog, true),
        (Target::Beanstalkd, false),
    ] {
        let spawned = target::spawn(t, &opts).unwrap();
        assert_eq!(binlog_index(spawned.addr) > 0, logging, "{t}");
        spawned.stop().unwrap();
    }
    let s = run_and_check(&args(Target::BeanstalkdBinlog, out.path()), out.path());
    assert!(s.label.starts_with("beanstalkd-binlog-"), "{}", s.label);
}

/// Redis's answer to `CONFIG GET <key>`, as raw RESP.
fn redis_config(addr: std::net::SocketAddr, key: &str) -> String {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    s.write_all(format!("CONFIG GET {key}\r\n").as_bytes())
        .unwrap();
    let mut buf = [0u8; 256];
    let n = s.read(&mut buf).unwrap();
    String::from_utf8_lossy(&buf[..n]).into_owned()
}

#[test]
fn redis_with_aof_everysec_and_always() {
    require_peer(Target::Redis);
    let out = tempfile::tempdir().unwrap();
    // The suite's arguments come after the loadgen's own `--appendonly no` and win.
    let spawned = target::spawn(
        Target::Redis,
        &target::SpawnOptions {
            cpu: None,
            tarq_bin: None,
            rebuild: false,
            args: ["--appendonly", "yes", "--appendfsync", "always"]
                .map(String::from)
                .to_vec(),
        },
    )
    .unwrap();
    assert!(redis_config(spawned.addr, "appendonly").contains("yes"));
    assert!(redis_config(spawned.addr, "appendfsync").contains("always"));
    spawned.stop().unwrap();
    for fsync in ["everysec", "always"] {
        let mut a = args(Target::Redis, out.path());
        a.target_args = Some(format!("--appendonly yes --appendfsync {fsync}"));
        let s = run_and_check(&a, out.path());
        assert!(
            s.label
                .starts_with(&format!("redis-appendonly-yes-appendfsync-{fsync}-")),
            "{}",
            s.label
        );
    }
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
    let sa = small_suite(out.path());
    suite::run(&sa).unwrap();
    let readme = std::fs::read_to_string(out.path().join("README.md")).unwrap();
    for needle in [
        // Each WAL mode and the tube API have their own column, never mixed into tarq's.
        "| connections | depth | tarq | null | tarq WAL fsync | tarq tubes fifottl | tarq / null |",
        "| 1+1 | 1 |",
        "| 1+1 | 4 |",
        "## tarq open loop",
        "latency-p1c1-d4.svg",
        "tarq-loadgen --target tarq --spawn --producers 1 --consumers 1 --depth 4",
        "note: test run",
        "--target-args '--wal-mode fsync'",
        // Backlog runs have their own table, a line per phase, and stay out of the comparison.
        "### Backlog shapes",
        "| tarq | fill 2,000, then drain | Fill |",
        "| tarq | fill 2,000, then drain | Drain |",
        "| tarq | backlog 2,000 | Steady |",
        "tarq-loadgen --target tarq --spawn --producers 1 --consumers 1 --depth 4 --payload 32 --duration 300ms --warmup 50ms --fill 2000 --drain",
        // The restart loop has its own table, a row per lifetime.
        "### Restart loop",
        "| cycle | start (ms) | msgs/s | errors | unacked | directory | snapshots | WAL segments |",
    ] {
        assert!(
            readme.contains(needle),
            "README lacks {needle:?}:\n{readme}"
        );
    }
    // tarq's tubes API gets rows once tarq serves it; until then the skip says why.
    assert!(
        readme.contains("| tarq tubes fifottl |")
            || (readme.contains("skipped tarq tubes:") && readme.contains(NOT_DEFINED)),
        "{readme}"
    );
    let dir = the_suite_dir(out.path());
    check_wal_mode_row(&dir);
    // Redrawing from the files alone gives the same page.
    std::fs::remove_file(out.path().join("README.md")).unwrap();
    let mut again = sa.clone();
    again.report_only = Some(None);
    suite::run(&again).unwrap();
    assert_eq!(
        std::fs::read_to_string(out.path().join("README.md")).unwrap(),
        readme
    );
}

/// A suite small enough for a test on a debug build: tarq and the null target at one shape,
/// two depths, one WAL-mode row and both backlog rows, written under `out`.
fn small_suite(out: &Path) -> SuiteArgs {
    /// Messages in the suite's backlog rows: a moment's fill on a debug build.
    const BACKLOG_ROWS: u64 = 2_000;
    SuiteArgs {
        duration: Duration::from_millis(300),
        warmup: Duration::from_millis(50),
        targets: vec![Target::Tarq, Target::Null],
        shapes: vec!["1x1".into()],
        depths: vec![1, 4],
        open_loop: vec![50],
        open_shape: "1x1".into(),
        open_depth: 4,
        payload: 32,
        out: Some(out.to_path_buf()),
        note: Some("test run".into()),
        tarq_bin: Some(tarq_bin()),
        no_pin: true,
        no_spin: true,
        attempts: 1,
        wal_modes: vec!["fsync".into()],
        aof: vec![],
        no_tubes: false,
        backlog_rows: Some(BACKLOG_ROWS),
        restart_rows: Some(2),
        restart_messages: 500,
        report_only: None,
    }
}

/// The one suite directory under `out`, checked to hold the record, a run's JSON and
/// histograms, and the plots.
fn the_suite_dir(out: &Path) -> PathBuf {
    let dirs: Vec<_> = std::fs::read_dir(out)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.is_dir())
        .collect();
    assert_eq!(dirs.len(), 1, "one suite directory: {dirs:?}");
    let dir = dirs[0].clone();
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
    dir
}

/// The WAL-mode row is recorded as its own run, with its durability, API and phase named.
fn check_wal_mode_row(dir: &Path) {
    let record: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("suite.json")).unwrap()).unwrap();
    let fsync = record["runs"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["label"] == "tarq-wal-mode-fsync-p1c1-d1")
        .expect("a row per WAL mode");
    assert_eq!(fsync["durability"], "WAL fsync");
    assert_eq!(fsync["api"], "seed");
    assert_eq!(fsync["drain"], false);
}

#[test]
fn report_only_reads_a_suite_written_before_run_shapes_were_recorded() {
    /// A suite committed before the entries named their API, tube type, durability and
    /// backlog phases.
    const OLD_SUITE: &str = "results/2026-11-22-3e36adf2fe";
    let src = target::workspace_root().join(OLD_SUITE);
    let out = tempfile::tempdir().unwrap();
    let dir = out.path().join("2026-11-22-3e36adf2fe");
    std::fs::create_dir(&dir).unwrap();
    for entry in std::fs::read_dir(&src).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "json") {
            std::fs::copy(&path, dir.join(path.file_name().unwrap())).unwrap();
        }
    }
    let text = std::fs::read_to_string(dir.join("suite.json")).unwrap();
    assert!(
        !text.contains("\"durability\""),
        "{OLD_SUITE} is an old suite"
    );
    let sa = SuiteArgs {
        duration: Duration::from_secs(1),
        warmup: Duration::from_secs(1),
        targets: vec![],
        shapes: vec![],
        depths: vec![],
        open_loop: vec![],
        open_shape: "4x4".into(),
        open_depth: 16,
        payload: 64,
        out: Some(out.path().to_path_buf()),
        note: None,
        tarq_bin: None,
        no_pin: true,
        no_spin: true,
        attempts: 1,
        wal_modes: vec![],
        aof: vec![],
        no_tubes: true,
        backlog_rows: None,
        restart_rows: None,
        restart_messages: 0,
        report_only: Some(Some(dir.clone())),
    };
    suite::run(&sa).unwrap();
    let readme = std::fs::read_to_string(out.path().join("README.md")).unwrap();
    for needle in [
        "| connections | depth | tarq | tarantool | beanstalkd | redis | null |",
        "| 4+4 | 16 |",
        "| tarq ≥ 10× tarantool at every shape |",
        "latency-p4c4-d16.svg",
    ] {
        assert!(
            readme.contains(needle),
            "README lacks {needle:?}:\n{readme}"
        );
    }
    assert!(!readme.contains("### Backlog shapes"), "{readme}");
    // Given only the directory, the README redrawn is the one beside it, linking to it.
    std::fs::remove_file(out.path().join("README.md")).unwrap();
    let mut beside = sa.clone();
    beside.out = None;
    suite::run(&beside).unwrap();
    let again = std::fs::read_to_string(out.path().join("README.md")).unwrap();
    assert!(
        again.contains("[`2026-11-22-3e36adf2fe/`](2026-11-22-3e36adf2fe/)"),
        "{again}"
    );
}

/// A tarq spawned for the cluster tests, with `extra` arguments, unpinned.
fn spawn_tarq(extra: &[String]) -> target::Spawned {
    let opts = target::SpawnOptions {
        cpu: None,
        tarq_bin: Some(tarq_bin()),
        rebuild: false,
        args: extra.to_vec(),
    };
    target::spawn(Target::Tarq, &opts).expect("tarq starts")
}

/// A figure of `queue.stats()` at `addr`.
fn stat(addr: std::net::SocketAddr, name: &str) -> u64 {
    let mut c = tarq_client::Client::connect(&addr.to_string(), Duration::from_secs(5)).unwrap();
    let stats = c.call("queue.stats", &[0x90], None).unwrap();
    tarq_client::cluster::map_get(&stats[0], name)
        .and_then(rmpv::Value::as_u64)
        .unwrap_or(0)
}

/// A primary and a replica of it, the replica streaming.
fn primary_and_replica() -> (target::Spawned, target::Spawned) {
    let primary = spawn_tarq(&[]);
    let replica = spawn_tarq(&["--replica-of".into(), primary.addr.to_string()]);
    let deadline = std::time::Instant::now() + Duration::from_secs(15);
    while stat(replica.addr, "replication_connected") != 1 {
        assert!(
            std::time::Instant::now() < deadline,
            "the replica never connected"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    (primary, replica)
}

/// A run against a running cluster at `addrs` (nothing spawned by the run itself).
fn cluster_args(addrs: &str, out: &Path) -> RunArgs {
    let mut a = args(Target::Tarq, out);
    a.spawn = false;
    a.addr = Some(addrs.into());
    a
}

#[test]
fn a_tarq_cluster_is_driven_on_its_primary_whichever_address_comes_first() {
    let (primary, replica) = primary_and_replica();
    let out = tempfile::tempdir().unwrap();
    let a = cluster_args(&format!("{},{}", replica.addr, primary.addr), out.path());
    let s = single::run(&a)
        .unwrap_or_else(|e| panic!("run failed: {e:#}"))
        .summary;
    assert_eq!(s.errors, 0, "first error: {:?}", s.first_error);
    check_nothing_lost(&s);
    assert_eq!(
        s.config.addr,
        primary.addr.to_string(),
        "the leader was found"
    );
    assert_eq!(stat(primary.addr, "acks"), s.total_acks);

    // The tubes API with the replica alone: the tube is created through the redirect, and
    // the run starts on the primary without a refusal.
    let mut a = cluster_args(&replica.addr.to_string(), out.path());
    a.api = Some(Api::Tubes);
    a.tube = Some("clustered".into());
    let s = single::run(&a)
        .unwrap_or_else(|e| panic!("run failed: {e:#}"))
        .summary;
    assert_eq!(s.errors, 0, "first error: {:?}", s.first_error);
    check_nothing_lost(&s);
    assert_eq!(s.config.addr, primary.addr.to_string());
}

#[test]
fn a_run_started_on_a_replica_follows_its_refusals_to_the_primary() {
    // The seed API with only the replica's address: nothing tells the loadgen where the
    // primary is before the first refusal, which it follows, counting it as an error.
    let (primary, replica) = primary_and_replica();
    let out = tempfile::tempdir().unwrap();
    let a = cluster_args(&replica.addr.to_string(), out.path());
    let s = single::run(&a)
        .unwrap_or_else(|e| panic!("run failed: {e:#}"))
        .summary;
    // The refusals come in the warm-up, out of the measured counts, but the first is kept.
    let first = s.first_error.clone().unwrap_or_default();
    assert!(
        first.contains(&format!("the primary is {}", primary.addr)),
        "{first}"
    );
    assert!(s.total_acks > 0 && s.e2e_us.count > 0, "{s:?}");
    assert_eq!(stat(primary.addr, "acks"), s.total_acks);
    assert_eq!(s.unacked, 0);
}

#[test]
fn a_run_whose_target_dies_moves_to_the_next_address_and_keeps_counting() {
    // Two independent tarqs stand for a failover: the first is killed mid-run, the
    // connections move to the second, and the run goes on to its end.
    let first = spawn_tarq(&[]);
    let second = spawn_tarq(&[]);
    let out = tempfile::tempdir().unwrap();
    let mut a = cluster_args(&format!("{},{}", first.addr, second.addr), out.path());
    a.duration = Duration::from_secs(2);
    a.drain = false;
    let (pid, first_addr) = (first.pid(), first.addr);
    let killer = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(800));
        let _ = Command::new("kill")
            .args(["-KILL", &pid.to_string()])
            .status();
        first
    });
    let s = single::run(&a)
        .unwrap_or_else(|e| panic!("run failed: {e:#}"))
        .summary;
    drop(killer.join());
    assert_eq!(s.config.addr, first_addr.to_string());
    assert!(
        stat(second.addr, "acks") > 0,
        "the run went on against the second"
    );
    assert!(
        s.total_acks > stat(second.addr, "acks"),
        "and counted acks on both"
    );
}

/// The restart loop on a real tarq: every lifetime recovers what the last left, loses nothing,
/// and snapshots come from WAL that no single lifetime wrote enough of (counted across
/// restarts), so the directory stays bounded.
#[test]
fn restart_loop_recovers_each_lifetime_and_snapshots_across_restarts() {
    use tarq_loadgen::restart::{self, RestartArgs};
    const CYCLES: usize = 10;
    const THRESHOLD: u64 = 600_000;
    let a = RestartArgs {
        cycles: CYCLES,
        messages: 1_000,
        payload: 64,
        tarq_bin: Some(tarq_bin()),
        // A lifetime writes ~230 KB of WAL (put, take, ack of 1,000 messages): under this.
        target_args: vec!["--snapshot-every-bytes".into(), THRESHOLD.to_string()],
        target_cpu: None,
        cpu: None,
    };
    let mut seen = 0;
    let r = restart::run(&a, |_| seen += 1).unwrap();
    assert_eq!(seen, CYCLES);
    assert_eq!(r.cycles.len(), CYCLES);
    for c in &r.cycles {
        assert_eq!((c.errors, c.unacked), (0, 0), "cycle {}: {c:?}", c.cycle);
        assert!(c.msgs_per_s > 0.0 && c.dir_bytes > 0, "{c:?}");
    }
    let lifetime = r.cycles[0].dir_bytes;
    assert!(
        lifetime < THRESHOLD,
        "one lifetime is under the threshold: {r:?}"
    );
    assert_eq!(r.cycles[0].snapshots, 0, "{r:?}");
    assert!(
        r.cycles.last().unwrap().snapshots >= 1,
        "snapshots across restarts: {r:?}"
    );
    // The bound: two snapshots kept (tiny: the queue is empty at each stop), the WAL from the
    // older one (at most a threshold and a lifetime each), under three thresholds in all —
    // while the lifetimes together wrote more than that.
    let written = lifetime * CYCLES as u64;
    let bound = 3 * THRESHOLD;
    assert!(written > bound, "the test writes past the bound");
    assert!(
        r.peak_dir_bytes() <= bound,
        "the directory ({} bytes at its largest) stays under {bound}: {r:?}",
        r.peak_dir_bytes()
    );
}

/// A CA and a certificate for 127.0.0.1 it signed, made with the openssl command line under
/// `dir`: (CA, certificate, key).
fn certificates(dir: &Path, name: &str) -> (PathBuf, PathBuf, PathBuf) {
    let openssl = |args: &[&str]| {
        let out = Command::new("openssl")
            .args(args)
            .current_dir(dir)
            .output()
            .expect("this test needs openssl (Debian package `openssl`)");
        assert!(
            out.status.success(),
            "openssl {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    let f = |ext: &str| format!("{name}-{ext}");
    let ec = [
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:P-256",
        "-nodes",
    ];
    let (ca_key, ca, key, csr, crt) = (f("ca.key"), f("ca.crt"), f("key"), f("csr"), f("crt"));
    let subj = format!("/CN={name} test CA");
    let mut args = vec!["req", "-x509"];
    args.extend(ec);
    args.extend([
        "-keyout", &ca_key, "-out", &ca, "-days", "2", "-subj", &subj,
    ]);
    openssl(&args);
    let mut args = vec!["req"];
    args.extend(ec);
    args.extend(["-keyout", &key, "-out", &csr, "-subj", "/CN=127.0.0.1"]);
    openssl(&args);
    std::fs::write(dir.join(f("ext")), "subjectAltName=IP:127.0.0.1\n").unwrap();
    let ext = f("ext");
    openssl(&[
        "x509",
        "-req",
        "-in",
        &csr,
        "-CA",
        &ca,
        "-CAkey",
        &ca_key,
        "-CAcreateserial",
        "-out",
        &crt,
        "-days",
        "2",
        "-extfile",
        &ext,
    ]);
    (dir.join(ca), dir.join(crt), dir.join(key))
}

/// `--tls-ca`: every load connection goes over TLS (tarq's port `optional`, so the plain
/// set-up still works), and the run is as whole as a plain one; a loadgen that trusts another
/// CA is refused by its own check of the server's certificate, so the load did use TLS.
#[test]
fn closed_loop_against_tarq_over_tls() {
    let out = tempfile::tempdir().unwrap();
    let (ca, crt, key) = certificates(out.path(), "tarq");
    let mut a = args(Target::Tarq, out.path());
    a.target_args = Some(format!(
        "--listen-tls optional --tls-cert {} --tls-key {}",
        crt.display(),
        key.display()
    ));
    a.tls = Some(tarq_loadgen::tls::client_config(&ca).expect("the CA reads"));
    run_and_check(&a, out.path());

    let (other_ca, _, _) = certificates(out.path(), "other");
    a.tls = Some(tarq_loadgen::tls::client_config(&other_ca).expect("the CA reads"));
    let refused = single::run(&a)
        .err()
        .expect("another CA's server is not trusted");
    let why = format!("{refused:#}");
    assert!(why.contains("TLS handshake"), "{why}");
}
