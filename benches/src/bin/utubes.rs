//! Take latency of a utube tube as its busy utubes grow: N utubes each hold a taken task and a
//! ready one behind it (so none of them may hand out a task), and one free utube holds the
//! ready tasks a take can get. Each step takes that task and acks it, timing the take; the
//! engine must not walk the busy utubes to find the free one. Prints and writes one JSON record
//! (commit, machine, p50 / p99 / max take latency per N) to
//! `results/engine/utubes/<date>-<commit>.json`.
//!
//! `cargo run --release -p tarq-benches --bin utubes`, pinned with `taskset -c 0`.

use std::time::Instant;

use serde_json::json;
use tarq_benches::report;
use tarq_engine::{PutOutcome, Queue, TubeOptions, TubePut, TubeType};

const BUSY: [usize; 5] = [10, 100, 1_000, 10_000, 100_000];
const TAKES: usize = 200_000;
const NOW: u64 = 1_000_000;

/// p50, p99 and max of the take latencies (ns) with `busy` busy utubes.
fn take_latencies(busy: usize) -> (u64, u64, u64) {
    let mut q = Queue::new();
    let t = q
        .create_tube("u", TubeType::Utube, TubeOptions::default())
        .expect("a new tube");
    let put = |q: &mut Queue, key: &[u8]| {
        let p = TubePut {
            utube: key,
            ..TubePut::default()
        };
        match q.put_in(NOW, t, vec![0xa5], p) {
            Ok(PutOutcome::Created(r)) => r.id,
            other => panic!("a put, got {other:?}"),
        }
    };
    for u in 0..busy {
        let key = u.to_string();
        put(&mut q, key.as_bytes());
        put(&mut q, key.as_bytes());
    }
    for _ in 0..busy {
        q.take_from(NOW, t, 1)
            .unwrap()
            .expect("a free utube's head");
    }
    let mut ns = Vec::with_capacity(TAKES);
    for _ in 0..TAKES {
        put(&mut q, b"free");
        let start = Instant::now();
        let id = q
            .take_from(NOW, t, 2)
            .unwrap()
            .expect("the free utube's task")
            .id;
        ns.push(start.elapsed().as_nanos() as u64);
        q.ack_in(t, 2, id).expect("taken by session 2");
    }
    ns.sort_unstable();
    let at = |p: f64| ns[((ns.len() as f64 * p) as usize).min(ns.len() - 1)];
    (at(0.5), at(0.99), ns[ns.len() - 1])
}

fn main() {
    let mut rows = Vec::new();
    for busy in BUSY {
        let (p50, p99, max) = take_latencies(busy);
        println!("{busy:>7} busy utubes: take p50 {p50} ns, p99 {p99} ns, max {max} ns");
        rows.push(json!({"busy_utubes": busy, "take_p50_ns": p50, "take_p99_ns": p99, "take_max_ns": max}));
    }
    let record = json!({
        "commit": report::commit(),
        "date": report::date_utc(),
        "machine": report::machine(),
        "takes_per_shape": TAKES,
        "rows": rows,
    });
    let dir = report::workspace_root().join("results/engine/utubes");
    std::fs::create_dir_all(&dir).expect("creating results/engine/utubes");
    let path = dir.join(format!("{}-{}.json", report::date_utc(), report::commit()));
    std::fs::write(&path, serde_json::to_string_pretty(&record).expect("json"))
        .expect("writing the record");
    println!("{}", path.display());
}
