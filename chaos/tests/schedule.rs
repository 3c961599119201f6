//! The fault harness in CI: a short fixed-seed schedule of every fault against a replica set
//! of three tarq nodes (`--sync-replicas 1`, `--wal-mode fsync`) on three etcd members, each in
//! its own network namespace, with four clients; then the checker's verdict over what the
//! clients saw must be clean: nothing acknowledged lost, nothing refused delivered, no task
//! held twice within its ttr, every node's counts equal. The history, report and timeline are
//! kept under `target/chaos-ci/` for a failure's post-mortem.
//!
//! It needs root, `ip`, `nft`, etcd and a built tarq; without them it prints `SKIPPED: ...` and
//! passes, except under `CI=true`, where it fails saying what to install. A long run is
//! `tarq-chaos run --nemesis all --time 30m --seed N` (README, "Faults").

use std::path::PathBuf;
use std::time::Duration;

use tarq_chaos::nemesis::Fault;
use tarq_chaos::run::{self, Options};
use tarq_testkit::reference::{ci, skip};

/// The seed CI runs: fixed, so a failure replays with `tarq-chaos run --seed 36 --time 100s`.
const SEED: u64 = 36;
/// Faults are scheduled for this long; start, healing and the drain add about a minute.
const FAULT_TIME: Duration = Duration::from_secs(100);

#[test]
fn a_fixed_seed_schedule_of_every_fault_loses_nothing_acknowledged() {
    let missing = run::missing();
    if !missing.is_empty() {
        let why = format!("needs {}", missing.join("; "));
        if ci() {
            panic!("{why}\n(CI=true: nothing may be skipped)");
        }
        return skip(&why);
    }
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target"));
    let out = target.join("chaos-ci");
    // A run interrupted before (its mounts left behind) must not stop this one.
    tarq_chaos::lazyfs::unmount_stale(&out).expect("detach stale mounts");
    let _ = std::fs::remove_dir_all(&out);
    let opts = Options {
        seed: SEED,
        time: FAULT_TIME,
        faults: Fault::ALL.to_vec(),
        clients: 4,
        nodes: 3,
        sets: 1,
        ttr_secs: 30,
        tarq_args: run::DEFAULT_TARQ_ARGS.map(String::from).to_vec(),
        out: out.clone(),
    };
    let report = run::run(&opts).expect("the run");
    assert!(
        report.ok(),
        "{report}\n(history, report and timeline in {})",
        out.display()
    );
    let puts = report
        .get(tarq_chaos::checker::LOST)
        .and_then(|c| c.counts.iter().find(|(name, _)| *name == "puts ok"))
        .map_or(0, |(_, n)| *n);
    assert!(
        puts > 1000,
        "the clients got work done: {puts} puts acknowledged"
    );
}
