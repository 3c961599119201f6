//! Growth stalls of the engine: fills one queue with N tasks (32-byte payloads, no deadlines)
//! and times every put, so a put that pays for growing the arena, the id index, the lists or
//! the heap shows as a stall. Then drains it (take + ack) the same way. Prints and writes one
//! JSON record (commit, machine, worst put and take+ack, every put over 100 µs, RSS per task,
//! total times) to `results/engine/stalls/<date>-<commit>.json`. Last, the steady cost of a
//! put → take → ack cycle with 0, 100k and 1M tasks resident, for what growing-without-pauses
//! costs the hot path.
//!
//! `cargo run --release -p tarq-benches --bin growth -- [TASKS]` (default 10,000,000), pinned
//! with `taskset -c 0`: the figure is the worst single put, so other load on the core shows.
//!
//! Each slow call is listed with how many bytes the engine's own tables grew in it
//! (`Queue::overhead_bytes` after the call against after the one before): a slow call that
//! grew nothing was not the engine growing — the kernel, or the machine, took the time.

use std::time::Instant;

use serde_json::{json, Value};
use tarq_benches::report;
use tarq_engine::{PutOptions, Queue};

/// A put or take over this is listed by its position in the JSON.
const REPORTED_MICROS: u128 = 100;
const PAYLOAD: usize = 32;

/// Worst latency, every one over `REPORTED_MICROS` (position, µs, bytes the engine's tables
/// grew in it), and the total seconds.
struct Timed {
    worst_us: u128,
    over: Vec<(usize, u128, i64)>,
    seconds: f64,
}

/// Times `step(i)` for each `i`; `step` returns the engine's bytes after it
/// (`Queue::overhead_bytes`).
fn timed(n: usize, mut step: impl FnMut(usize) -> usize) -> Timed {
    let start = Instant::now();
    let mut worst_us = 0;
    let mut over = Vec::new();
    let mut bytes = 0;
    for i in 0..n {
        let t = Instant::now();
        let after = step(i);
        let us = t.elapsed().as_micros();
        worst_us = worst_us.max(us);
        if us > REPORTED_MICROS {
            over.push((i, us, after as i64 - bytes as i64));
        }
        bytes = after;
    }
    Timed {
        worst_us,
        over,
        seconds: start.elapsed().as_secs_f64(),
    }
}

fn rss_bytes() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").expect("reading /proc/self/status");
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse::<u64>().ok())
        .expect("VmRSS in /proc/self/status")
        * 1024
}

fn as_json(t: &Timed, n: usize) -> Value {
    json!({
        "worst_us": t.worst_us as u64,
        "seconds": t.seconds,
        "per_second": n as f64 / t.seconds,
        // [position, µs, bytes the engine grew in that call]
        "over_100us": t
            .over
            .iter()
            .map(|&(i, us, grew)| json!([i, us as u64, grew]))
            .collect::<Vec<_>>(),
    })
}

/// Nanoseconds per put → take → ack cycle with `resident` older tasks behind (FIFO: each
/// take gets the oldest, so the cycle walks the whole backlog's ids, as a queue in use does).
fn cycle_ns(resident: usize) -> f64 {
    const CYCLES: usize = 2_000_000;
    let mut q = Queue::new();
    for _ in 0..resident {
        q.put(0, vec![0xa5; PAYLOAD], PutOptions::default());
    }
    let start = Instant::now();
    for _ in 0..CYCLES {
        q.put(0, vec![0xa5; PAYLOAD], PutOptions::default());
        let id = q.take(0, 1).expect("a ready task").id;
        q.ack(1, id).expect("taken by this session");
    }
    start.elapsed().as_nanos() as f64 / CYCLES as f64
}

fn main() {
    // Big blocks as the server allocates them: fresh mappings, not zeroed or copied heap.
    tarq_net::server::set_mmap_threshold();
    let n: usize = std::env::args()
        .nth(1)
        .map(|s| s.parse().expect("TASKS is a number"))
        .unwrap_or(10_000_000);
    let rss_empty = rss_bytes();
    let mut q = Queue::new();
    // The payload is lent, as the server lends a request's bytes: a put allocates nothing.
    let payload = [0xa5u8; PAYLOAD];
    let fill = timed(n, |_| {
        q.put(0, &payload, PutOptions::default());
        q.overhead_bytes()
    });
    let rss_full = rss_bytes();
    let drain = timed(n, |_| {
        let id = q.take(0, 1).expect("a ready task").id;
        q.ack(1, id).expect("taken by this session");
        q.overhead_bytes()
    });
    let per_task = (rss_full - rss_empty) as f64 / n as f64;
    drop(q);
    let cycles: Vec<(usize, f64)> = [0, 100_000, 1_000_000]
        .into_iter()
        .map(|r| (r, cycle_ns(r)))
        .collect();
    println!(
        "{n} tasks: fill {:.2} s, worst put {} µs ({} over {REPORTED_MICROS} µs); drain {:.2} s, \
         worst take+ack {} µs; RSS {per_task:.0} bytes a task",
        fill.seconds,
        fill.worst_us,
        fill.over.len(),
        drain.seconds,
        drain.worst_us
    );
    for (r, ns) in &cycles {
        println!("put → take → ack with {r} resident: {ns:.0} ns");
    }
    let record = json!({
        "commit": report::commit(),
        "date": report::date_utc(),
        "machine": report::machine(),
        "tasks": n,
        "payload_bytes": PAYLOAD,
        "rss_bytes_per_task": per_task,
        "fill": as_json(&fill, n),
        "drain": as_json(&drain, n),
        "cycle_ns_by_resident": cycles.iter().map(|&(r, ns)| json!([r, ns])).collect::<Vec<_>>(),
    });
    let dir = report::workspace_root().join("results/engine/stalls");
    std::fs::create_dir_all(&dir).expect("creating results/engine/stalls");
    let path = dir.join(format!(
        "{}-{}.json",
        report::date_utc().get(..10).unwrap_or("undated"),
        report::commit()
    ));
    std::fs::write(&path, serde_json::to_string_pretty(&record).expect("json"))
        .expect("writing the record");
    println!("{}", path.display());
}
