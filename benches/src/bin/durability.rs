//! `durability`: the WAL's figures that need no network — recovery time (snapshot + WAL, and
//! WAL only), snapshot time and the longest loop step while a snapshot runs under load — for a
//! queue of N tasks on the real disk. Writes one JSON record (commit, machine, figures).
//!
//! ```sh
//! cargo run --release -p tarq-benches --bin durability -- 1000000 results/durability/recovery-1m.json
//! cargo run --release -p tarq-benches --bin durability -- restart-loop 50 results/durability/restart-loop.json
//! ```
//!
//! `restart-loop CYCLES`: a service manager restarting tarq: each lifetime opens the data
//! directory (timing recovery), writes less WAL than the snapshot threshold, acks most of it,
//! and stops cleanly; the data directory's size, its files and the recovery time are recorded
//! per cycle. Then a queue with a long history (a billion ids issued, a few thousand live)
//! is snapshotted, timing the walk.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde_json::{json, Map, Value};
use tarq_engine::{PutOptions, Queue};
use tarq_wal::{Wal, WalConfig, WalMode};

/// Payload bytes per task: the loadgen's default message size.
const PAYLOAD: usize = 64;
/// Puts per simulated loop turn while filling: a busy turn's worth of pipelined requests.
const FILL_PER_TURN: usize = 1000;
/// Work per turn while the snapshot runs: puts, and as many take + ack pairs.
const LOAD_PER_TURN: usize = 64;
/// Turns of load after the snapshot, so recovery replays WAL on top of it.
const TURNS_AFTER: usize = 1000;
const WAIT: Duration = Duration::from_secs(600);

fn now_us() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_micros() as u64
}

fn turn(wal: &mut Wal, q: &mut Queue) -> Duration {
    let t = Instant::now();
    wal.append_turn(q);
    wal.submit();
    wal.poll(q);
    t.elapsed()
}

fn load(q: &mut Queue, n: &mut u64) {
    let now = now_us();
    for _ in 0..LOAD_PER_TURN {
        *n += 1;
        q.put(now, payload(*n), PutOptions::default());
        if let Some(t) = q.take(now, 1) {
            let id = t.id;
            q.ack(1, id).expect("owner acks");
        }
    }
}

fn sh(cmd: &str, args: &[&str]) -> String {
    std::process::Command::new(cmd)
        .args(args)
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
        .unwrap_or_default()
}

/// Task `n`'s payload: its number, zero-padded to `PAYLOAD` bytes.
fn payload(n: u64) -> Vec<u8> {
    let mut data = format!("{n:0width$}", width = PAYLOAD).into_bytes();
    data.truncate(PAYLOAD);
    data
}

/// The figures, by JSON key.
type Figures = Map<String, Value>;

fn secs(d: Duration) -> Value {
    json!((d.as_secs_f64() * 1e3).round() / 1e3)
}

fn ms(d: Duration) -> Value {
    json!((d.as_secs_f64() * 1e6).round() / 1e3)
}

/// Where the run works and writes: `durability TASKS OUT.json [DIR]`.
struct Args {
    tasks: u64,
    out: String,
    dir: PathBuf,
}

fn args() -> Args {
    const USAGE: &str = "usage: durability TASKS OUT.json [DIR]";
    let mut args = std::env::args().skip(1);
    let tasks: u64 = args.next().and_then(|s| s.parse().ok()).expect(USAGE);
    let out = args.next().expect(USAGE);
    let base = args
        .next()
        .map(PathBuf::from)
        .unwrap_or_else(std::env::temp_dir);
    let dir = base.join(format!("tarq-durability-{}", std::process::id()));
    Args { tasks, out, dir }
}

fn main() {
    // Big blocks as the server allocates them: fresh mappings, not zeroed or copied heap.
    tarq_net::server::set_mmap_threshold();
    match std::env::args().nth(1).as_deref() {
        Some("restart-loop") => return restart_loop::main(),
        Some("recover") => return recover_only(),
        _ => {}
    }
    let a = args();
    let _ = std::fs::remove_dir_all(&a.dir);
    let cfg = bench_config();
    let load_before = sh("cat", &["/proc/loadavg"]);
    let mut f = Figures::new();
    fill(&a.dir, &cfg, a.tasks, &mut f);
    let (wal, q) = recover_from_wal(&a.dir, &cfg, a.tasks, &mut f);
    let mut m = a.tasks;
    let live = snapshot_under_load(&a.dir, (wal, q), &mut m, &mut f);
    let (wal, q) = recover_from_snapshot(&a.dir, &cfg, live, &mut f);
    recover_from_idle_snapshot(&a.dir, &cfg, (wal, q), &mut m, &mut f);
    if std::env::var_os("TARQ_BENCH_KEEP_DIR").is_some() {
        eprintln!("kept {}", a.dir.display());
    } else {
        let _ = std::fs::remove_dir_all(&a.dir);
    }
    write_record(&a, &load_before, f);
}

/// Write mode, snapshots only when the bench asks for one.
fn bench_config() -> WalConfig {
    WalConfig {
        mode: WalMode::Write,
        snapshot_every_bytes: 0,
        ..WalConfig::default()
    }
}

/// `durability recover DIR [TIMES]`: opens a data directory kept by a run with
/// `TARQ_BENCH_KEEP_DIR` set, `TIMES` times, printing each recovery's time and its snapshot
/// load's: for profiling the load (`perf record`) without filling the queue every time.
fn recover_only() {
    const USAGE: &str = "usage: durability recover DIR [TIMES]";
    let mut args = std::env::args().skip(2);
    let dir = PathBuf::from(args.next().expect(USAGE));
    let times: usize = args.next().map_or(1, |s| s.parse().expect(USAGE));
    let cfg = bench_config();
    for _ in 0..times {
        let t = Instant::now();
        let (wal, q, report) = Wal::open_dir(&dir, cfg.clone()).expect("recover");
        let took = t.elapsed();
        println!(
            "{} tasks in {:.3} s (snapshot load {:.3} s, {} WAL records)",
            q.len(),
            took.as_secs_f64(),
            report.snapshot_load.as_secs_f64(),
            report.records
        );
        drop(wal);
        drop(q);
    }
}

/// Fill the queue with `tasks` tasks, a turn of `FILL_PER_TURN` at a time, and flush.
fn fill(dir: &Path, cfg: &WalConfig, tasks: u64, f: &mut Figures) {
    let (mut wal, mut q, _) = Wal::open_dir(dir, cfg.clone()).expect("open");
    let t = Instant::now();
    let mut n = 0u64;
    let now = now_us();
    while n < tasks {
        for _ in 0..FILL_PER_TURN.min((tasks - n) as usize) {
            n += 1;
            // Every tenth task delayed, every seventh with a TTL: the snapshot carries both.
            let opts = PutOptions {
                delay: if n.is_multiple_of(10) {
                    3_600_000_000
                } else {
                    0
                },
                ttl: n.is_multiple_of(7).then_some(86_400_000_000),
                ..PutOptions::default()
            };
            q.put(now, payload(n), opts);
        }
        turn(&mut wal, &mut q);
    }
    wal.flush(&mut q, WAIT).expect("flush");
    let fill = t.elapsed();
    f.insert("fill_s".into(), secs(fill));
    f.insert(
        "fill_puts_per_s".into(),
        json!((tasks as f64 / fill.as_secs_f64()).round()),
    );
    f.insert("wal_bytes".into(), json!(wal.stats().bytes_written));
}

/// Reopen from the WAL alone: every task comes back.
fn recover_from_wal(dir: &Path, cfg: &WalConfig, tasks: u64, f: &mut Figures) -> (Wal, Queue) {
    let t = Instant::now();
    let (wal, q, report) = Wal::open_dir(dir, cfg.clone()).expect("recover from WAL");
    f.insert("recover_from_wal_s".into(), secs(t.elapsed()));
    assert_eq!(q.len() as u64, tasks);
    assert!(report.snapshot.is_none());
    (wal, q)
}

/// A snapshot under load: every turn does `LOAD_PER_TURN` put + take + ack while the walk
/// runs; then `TURNS_AFTER` turns more, so recovery replays WAL on top of it. Returns the
/// tasks left.
fn snapshot_under_load(
    dir: &Path,
    (mut wal, mut q): (Wal, Queue),
    m: &mut u64,
    f: &mut Figures,
) -> usize {
    let mut turns = 0u32;
    let mut longest = Duration::ZERO;
    let mut total_step = Duration::ZERO;
    let t = Instant::now();
    assert!(wal.request_snapshot());
    let mut started = false;
    while !started || wal.snapshot_running() {
        load(&mut q, m);
        let step = turn(&mut wal, &mut q);
        started |= wal.snapshot_running();
        longest = longest.max(step);
        total_step += step;
        turns += 1;
        assert!(t.elapsed() < WAIT, "the snapshot finishes");
        if wal.snapshot_running() && wal.timeout() != Some(Duration::ZERO) {
            // Sealed: waiting for the writer thread; let it run instead of spinning.
            std::thread::yield_now();
        }
    }
    f.insert("snapshot_s".into(), secs(t.elapsed()));
    f.insert("snapshot_bytes".into(), json!(snapshot_bytes(dir)));
    f.insert("snapshot_turns".into(), json!(turns));
    f.insert("snapshot_longest_turn_ms".into(), ms(longest));
    f.insert(
        "snapshot_longest_walk_step_ms".into(),
        json!(wal.stats().snapshot_longest_step_us as f64 / 1e3),
    );
    f.insert(
        "snapshot_mean_turn_ms".into(),
        ms(total_step / turns.max(1)),
    );
    load_turns(&mut wal, &mut q, m);
    q.len()
}

/// Bytes of every `.snap` file in `dir`.
fn snapshot_bytes(dir: &Path) -> u64 {
    std::fs::read_dir(dir)
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().ends_with(".snap"))
        .map(|e| e.metadata().unwrap().len())
        .sum()
}

/// `TURNS_AFTER` turns of load, then a flush.
fn load_turns(wal: &mut Wal, q: &mut Queue, m: &mut u64) {
    for _ in 0..TURNS_AFTER {
        load(q, m);
        turn(wal, q);
    }
    wal.flush(q, WAIT).expect("flush");
}

/// Recovery from that snapshot: the WAL from its start on is replayed, so everything the
/// load did while the walk ran is in it.
fn recover_from_snapshot(
    dir: &Path,
    cfg: &WalConfig,
    live: usize,
    f: &mut Figures,
) -> (Wal, Queue) {
    let t = Instant::now();
    let (wal, q, report) = Wal::open_dir(dir, cfg.clone()).expect("recover from snapshot");
    f.insert("recover_from_snapshot_s".into(), secs(t.elapsed()));
    assert_eq!(q.len(), live);
    assert!(report.snapshot.is_some());
    f.insert(
        "recover_from_snapshot_wal_records".into(),
        json!(report.records),
    );
    f.insert("recover_snapshot_load_s".into(), secs(report.snapshot_load));
    (wal, q)
}

/// A snapshot of the idle queue, then a short tail of load, then recovery: the common restart.
fn recover_from_idle_snapshot(
    dir: &Path,
    cfg: &WalConfig,
    (mut wal, mut q): (Wal, Queue),
    m: &mut u64,
    f: &mut Figures,
) {
    wal.snapshot_now(&mut q, WAIT).expect("idle snapshot");
    load_turns(&mut wal, &mut q, m);
    let live = q.len();
    drop(wal);
    drop(q);
    let t = Instant::now();
    let (_wal, q, report) = Wal::open_dir(dir, cfg.clone()).expect("recover from idle snapshot");
    f.insert("recover_from_idle_snapshot_s".into(), secs(t.elapsed()));
    assert_eq!(q.len(), live);
    f.insert(
        "recover_from_idle_snapshot_load_s".into(),
        secs(report.snapshot_load),
    );
    f.insert(
        "recover_from_idle_snapshot_wal_records".into(),
        json!(report.records),
    );
    f.insert("live_tasks_at_recovery".into(), json!(live));
}

/// The JSON record: commit, date, machine, configuration, then every figure.
fn write_record(a: &Args, load_before: &str, figures: Figures) {
    let cpu = sh(
        "sh",
        &["-c", "grep -m1 'model name' /proc/cpuinfo | cut -d: -f2"],
    );
    let mut record = Figures::new();
    record.insert("bench".into(), json!("durability"));
    record.insert(
        "commit".into(),
        json!(sh("git", &["rev-parse", "--short", "HEAD"])),
    );
    record.insert(
        "date".into(),
        json!(sh("date", &["-u", "+%Y-%m-%dT%H:%M:%SZ"])),
    );
    record.insert(
        "machine".into(),
        json!({
            "cpu": cpu.trim(),
            "cores": sh("nproc", &[]).parse::<u64>().unwrap_or(0),
            "loadavg_before": load_before,
            "loadavg_after": sh("cat", &["/proc/loadavg"]),
            "note": "shared 2-core VM, other processes may run at the same time: figures are noisy",
        }),
    );
    record.insert(
        "config".into(),
        json!({
            "tasks": a.tasks,
            "payload_bytes": PAYLOAD,
            "wal_mode": "write",
            "fill_puts_per_turn": FILL_PER_TURN,
            "load_per_turn": LOAD_PER_TURN,
            "snapshot_duty_percent": tarq_wal::snapshot::SNAPSHOT_DUTY_PERCENT,
            "snapshot_step_us": [
                tarq_wal::snapshot::SNAPSHOT_STEP_MIN.as_micros() as u64,
                tarq_wal::snapshot::SNAPSHOT_STEP_MAX.as_micros() as u64,
            ],
            "snapshot_slots_per_turn": tarq_wal::snapshot::SNAPSHOT_SLOTS_PER_TURN,
        }),
    );
    record.extend(figures);
    let text = serde_json::to_string_pretty(&Value::Object(record)).expect("JSON") + "\n";
    if let Some(parent) = Path::new(&a.out).parent() {
        std::fs::create_dir_all(parent).unwrap();
    }
    std::fs::write(&a.out, &text).unwrap();
    print!("{text}");
}

mod restart_loop {
    //! The restart loop and the long-history snapshot (see the crate docs).

    use super::*;

    /// The snapshot threshold of the loop: small, so a short run crosses it many times.
    const THRESHOLD: u64 = 64 << 20;
    /// Puts per lifetime: ~15 MB of WAL at 64-byte payloads, a quarter of the threshold, so
    /// no single lifetime reaches it (the case that never snapshotted when the trigger
    /// counted per process).
    const PUTS_PER_CYCLE: u64 = 100_000;
    /// Of each lifetime's puts, this many stay (the rest are taken and acked): a backlog grows.
    const KEPT_PER_CYCLE: u64 = 2_000;
    /// Ids issued in the long-history case, and the tasks live then.
    const HISTORY_IDS: u64 = 1_000_000_000;
    const HISTORY_LIVE: u64 = 5_000;

    fn dir_figures(dir: &Path) -> (u64, usize, usize) {
        let mut bytes = 0;
        let (mut snaps, mut segs) = (0, 0);
        for e in std::fs::read_dir(dir).unwrap().filter_map(|e| e.ok()) {
            let name = e.file_name().to_string_lossy().into_owned();
            bytes += e.metadata().unwrap().len();
            snaps += usize::from(name.ends_with(".snap"));
            segs += usize::from(name.ends_with(".xlog"));
        }
        (bytes, snaps, segs)
    }

    fn one_lifetime(dir: &Path, cfg: &WalConfig, n: &mut u64) -> Value {
        let t = Instant::now();
        let (mut wal, mut q, report) = Wal::open_dir(dir, cfg.clone()).expect("open");
        let recovery = t.elapsed();
        let now = now_us();
        let mut left = PUTS_PER_CYCLE;
        while left > 0 {
            for _ in 0..FILL_PER_TURN.min(left as usize) {
                *n += 1;
                left -= 1;
                q.put(now, payload(*n), PutOptions::default());
            }
            turn(&mut wal, &mut q);
        }
        for _ in 0..(PUTS_PER_CYCLE - KEPT_PER_CYCLE) / FILL_PER_TURN as u64 {
            for _ in 0..FILL_PER_TURN {
                let id = q.take(now, 1).expect("ready").id;
                q.ack(1, id).expect("owner acks");
            }
            turn(&mut wal, &mut q);
        }
        let t = Instant::now();
        while wal.snapshot_running() {
            turn(&mut wal, &mut q);
            assert!(t.elapsed() < WAIT, "the snapshot finishes");
            std::thread::yield_now();
        }
        let stats = wal.stats();
        wal.close(&mut q, WAIT).expect("clean stop");
        drop(wal);
        let (bytes, snaps, segs) = dir_figures(dir);
        json!({
            "recovery_s": secs(recovery).as_f64(),
            "snapshot_tasks_loaded": report.snapshot_tasks,
            "wal_records_replayed": report.records,
            "live_tasks_at_stop": q.len(),
            "replayed_wal_bytes": report.wal_bytes_since_snapshot,
            "snapshots_taken": stats.snapshots,
            "dir_bytes_after_stop": bytes,
            "snapshot_files": snaps,
            "wal_files": segs,
        })
    }

    fn long_history(dir: &Path, f: &mut Figures) {
        let _ = std::fs::remove_dir_all(dir);
        let cfg = WalConfig {
            snapshot_every_bytes: 0,
            ..WalConfig::default()
        };
        let (mut wal, mut q, _) = Wal::open_dir(dir, cfg).expect("open");
        q.set_last_id(HISTORY_IDS);
        let now = now_us();
        for n in 0..HISTORY_LIVE {
            q.put(now, payload(n), PutOptions::default());
        }
        wal.flush(&mut q, WAIT).expect("flush");
        let t = Instant::now();
        wal.snapshot_now(&mut q, WAIT).expect("snapshot");
        f.insert("long_history_last_id".into(), json!(q.last_id()));
        f.insert("long_history_live_tasks".into(), json!(q.len()));
        f.insert("long_history_snapshot_s".into(), secs(t.elapsed()));
        f.insert(
            "long_history_walk_steps".into(),
            json!(wal.stats().snapshot_walk_steps),
        );
        f.insert(
            "long_history_longest_walk_step_ms".into(),
            json!(wal.stats().snapshot_longest_step_us as f64 / 1e3),
        );
    }

    pub fn main() {
        const USAGE: &str = "usage: durability restart-loop CYCLES OUT.json [DIR]";
        let mut args = std::env::args().skip(2);
        let cycles: usize = args.next().and_then(|s| s.parse().ok()).expect(USAGE);
        let out = args.next().expect(USAGE);
        let base = args
            .next()
            .map(PathBuf::from)
            .unwrap_or_else(std::env::temp_dir);
        let dir = base.join(format!("tarq-restart-loop-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let cfg = WalConfig {
            mode: WalMode::Write,
            snapshot_every_bytes: THRESHOLD,
            ..WalConfig::default()
        };
        let load_before = sh("cat", &["/proc/loadavg"]);
        let mut n = 0;
        let per_cycle: Vec<Value> = (0..cycles)
            .map(|_| one_lifetime(&dir, &cfg, &mut n))
            .collect();
        let mut f = Figures::new();
        let peak = per_cycle
            .iter()
            .filter_map(|c| c["dir_bytes_after_stop"].as_u64())
            .max();
        f.insert("restart_loop_threshold_bytes".into(), json!(THRESHOLD));
        f.insert("restart_loop_puts_per_cycle".into(), json!(PUTS_PER_CYCLE));
        f.insert("restart_loop_kept_per_cycle".into(), json!(KEPT_PER_CYCLE));
        f.insert("restart_loop_peak_dir_bytes".into(), json!(peak));
        f.insert("restart_loop".into(), Value::Array(per_cycle));
        let _ = std::fs::remove_dir_all(&dir);
        long_history(&dir, &mut f);
        let _ = std::fs::remove_dir_all(&dir);
        let a = Args {
            tasks: cycles as u64,
            out,
            dir,
        };
        write_record(&a, &load_before, f);
    }
}
