//! `durability`: the WAL's figures that need no network — recovery time (snapshot + WAL, and
//! WAL only), snapshot time and the longest loop step while a snapshot runs under load — for a
//! queue of N tasks on the real disk. Writes one JSON record (commit, machine, figures).
//!
//! ```sh
//! cargo run --release -p tarq-benches --bin durability -- 1000000 results/durability/recovery-1m.json
//! ```

use std::fmt::Write as _;
use std::time::{Duration, Instant};

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
        let mut data = format!("{n:0width$}", width = PAYLOAD).into_bytes();
        data.truncate(PAYLOAD);
        q.put(now, data.into(), PutOptions::default());
        if let Some(t) = q.take(now, 1) {
            let id = t.id;
            q.ack(now, 1, id).expect("owner acks");
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

fn main() {
    let mut args = std::env::args().skip(1);
    let tasks: u64 = args
        .next()
        .and_then(|s| s.parse().ok())
        .expect("usage: durability TASKS OUT.json [DIR]");
    let out = args.next().expect("usage: durability TASKS OUT.json [DIR]");
    let base = args
        .next()
        .map(std::path::PathBuf::from)
        .unwrap_or_else(std::env::temp_dir);
    let dir = base.join(format!("tarq-durability-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let cfg = WalConfig {
        mode: WalMode::Write,
        snapshot_every_bytes: 0,
        ..WalConfig::default()
    };
    let load_before = sh("cat", &["/proc/loadavg"]);

    // Fill.
    let (mut wal, mut q, _) = Wal::open_dir(&dir, cfg.clone()).expect("open");
    let t = Instant::now();
    let mut n = 0u64;
    let now = now_us();
    while n < tasks {
        for _ in 0..FILL_PER_TURN.min((tasks - n) as usize) {
            n += 1;
            let mut data = format!("{n:0width$}", width = PAYLOAD).into_bytes();
            data.truncate(PAYLOAD);
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
            q.put(now, data.into(), opts);
        }
        turn(&mut wal, &mut q);
    }
    wal.flush(&mut q, WAIT).expect("flush");
    let fill_s = t.elapsed().as_secs_f64();
    let wal_bytes = wal.stats().bytes_written;
    drop(wal);
    drop(q);

    // Recovery from the WAL alone.
    let t = Instant::now();
    let (mut wal, mut q, report) = Wal::open_dir(&dir, cfg.clone()).expect("recover from WAL");
    let recover_wal_s = t.elapsed().as_secs_f64();
    assert_eq!(q.len() as u64, tasks);
    assert!(report.snapshot.is_none());

    // A snapshot under load: every turn does LOAD_PER_TURN put + take + ack.
    let mut turns = 0u64;
    let mut longest = Duration::ZERO;
    let mut total_step = Duration::ZERO;
    let t = Instant::now();
    assert!(wal.request_snapshot());
    let mut started = false;
    let mut m = tasks;
    while !started || wal.snapshot_running() {
        load(&mut q, &mut m);
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
    let snapshot_s = t.elapsed().as_secs_f64();
    let snap_bytes: u64 = std::fs::read_dir(&dir)
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().ends_with(".snap"))
        .map(|e| e.metadata().unwrap().len())
        .sum();
    for _ in 0..TURNS_AFTER {
        load(&mut q, &mut m);
        turn(&mut wal, &mut q);
    }
    wal.flush(&mut q, WAIT).expect("flush");
    let live = q.len();
    drop(wal);
    drop(q);

    // Recovery from that snapshot: the WAL from its start on is replayed, so everything the
    // load did while the walk ran is in it.
    let t = Instant::now();
    let (mut wal, mut q, report) = Wal::open_dir(&dir, cfg.clone()).expect("recover from snapshot");
    let recover_snap_s = t.elapsed().as_secs_f64();
    assert_eq!(q.len(), live);
    assert!(report.snapshot.is_some());
    let replayed = report.records;
    let snapshot_load_s = report.snapshot_load.as_secs_f64();

    // A snapshot of the idle queue, then a short tail of load: the common restart.
    wal.snapshot_now(&mut q, WAIT).expect("idle snapshot");
    for _ in 0..TURNS_AFTER {
        load(&mut q, &mut m);
        turn(&mut wal, &mut q);
    }
    wal.flush(&mut q, WAIT).expect("flush");
    let live = q.len();
    drop(wal);
    drop(q);
    let t = Instant::now();
    let (_wal, q, report) = Wal::open_dir(&dir, cfg).expect("recover from idle snapshot");
    let recover_idle_s = t.elapsed().as_secs_f64();
    assert_eq!(q.len(), live);
    let idle_replayed = report.records;
    let idle_load_s = report.snapshot_load.as_secs_f64();
    drop(q);
    let _ = std::fs::remove_dir_all(&dir);

    let mut j = String::new();
    let cpu = sh(
        "sh",
        &["-c", "grep -m1 'model name' /proc/cpuinfo | cut -d: -f2"],
    );
    writeln!(j, "{{").unwrap();
    writeln!(j, "  \"bench\": \"durability\",").unwrap();
    writeln!(
        j,
        "  \"commit\": \"{}\",",
        sh("git", &["rev-parse", "--short", "HEAD"])
    )
    .unwrap();
    writeln!(
        j,
        "  \"date\": \"{}\",",
        sh("date", &["-u", "+%Y-%m-%dT%H:%M:%SZ"])
    )
    .unwrap();
    writeln!(j, "  \"machine\": {{\"cpu\": \"{}\", \"cores\": {}, \"loadavg_before\": \"{load_before}\", \"loadavg_after\": \"{}\", \"note\": \"shared 2-core VM, other engineers building at the same time: figures are noisy\"}},", cpu.trim(), sh("nproc", &[]), sh("cat", &["/proc/loadavg"])).unwrap();
    writeln!(j, "  \"config\": {{\"tasks\": {tasks}, \"payload_bytes\": {PAYLOAD}, \"wal_mode\": \"write\", \"fill_puts_per_turn\": {FILL_PER_TURN}, \"load_per_turn\": {LOAD_PER_TURN}, \"snapshot_ids_per_turn\": {}}},", tarq_wal::snapshot::SNAPSHOT_IDS_PER_TURN).unwrap();
    writeln!(j, "  \"fill_s\": {fill_s:.3},").unwrap();
    writeln!(j, "  \"fill_puts_per_s\": {:.0},", tasks as f64 / fill_s).unwrap();
    writeln!(j, "  \"wal_bytes\": {wal_bytes},").unwrap();
    writeln!(j, "  \"recover_from_wal_s\": {recover_wal_s:.3},").unwrap();
    writeln!(j, "  \"snapshot_s\": {snapshot_s:.3},").unwrap();
    writeln!(j, "  \"snapshot_bytes\": {snap_bytes},").unwrap();
    writeln!(j, "  \"snapshot_turns\": {turns},").unwrap();
    writeln!(
        j,
        "  \"snapshot_longest_turn_ms\": {:.3},",
        longest.as_secs_f64() * 1e3
    )
    .unwrap();
    writeln!(
        j,
        "  \"snapshot_mean_turn_ms\": {:.3},",
        total_step.as_secs_f64() * 1e3 / turns.max(1) as f64
    )
    .unwrap();
    writeln!(j, "  \"recover_from_snapshot_s\": {recover_snap_s:.3},").unwrap();
    writeln!(j, "  \"recover_from_snapshot_wal_records\": {replayed},").unwrap();
    writeln!(j, "  \"recover_snapshot_load_s\": {snapshot_load_s:.3},").unwrap();
    writeln!(
        j,
        "  \"recover_from_idle_snapshot_s\": {recover_idle_s:.3},"
    )
    .unwrap();
    writeln!(
        j,
        "  \"recover_from_idle_snapshot_load_s\": {idle_load_s:.3},"
    )
    .unwrap();
    writeln!(
        j,
        "  \"recover_from_idle_snapshot_wal_records\": {idle_replayed},"
    )
    .unwrap();
    writeln!(j, "  \"live_tasks_at_recovery\": {live}").unwrap();
    writeln!(j, "}}").unwrap();
    if let Some(parent) = std::path::Path::new(&out).parent() {
        std::fs::create_dir_all(parent).unwrap();
    }
    std::fs::write(&out, &j).unwrap();
    print!("{j}");
}
