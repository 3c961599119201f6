//! Real bytes per task: a counting global allocator measures what the engine allocates for
//! 1M tasks beyond their payloads (arena, id index, towers, heap, sessions), for plain tasks
//! and for tasks with every deadline kind, next to the `BTreeMap` baseline. The figures go to
//! the "memory" section of `results/engine/<date>-<commit>.json`. Not a criterion bench: it
//! measures bytes, not time, so it runs once.

use serde_json::{json, Value};
use tarq_benches::baseline::Baseline;
use tarq_benches::report;
use tarq_engine::{PutOptions, Queue};

#[global_allocator]
static GLOBAL: tarq_testkit::Counting = tarq_testkit::Counting;

/// Tasks per measurement.
const N: usize = 1_000_000;
/// Payload size: a short MessagePack string. Payload bytes are subtracted from the figure.
const PAYLOAD: usize = 8;
/// Sessions holding the taken tasks in the "taken" case.
const SESSIONS: u64 = 64;
const T0: u64 = 1_700_000_000_000_000;

/// Fills a queue with N tasks of one kind.
type Build = Box<dyn FnOnce(&mut Queue)>;

fn live() -> usize {
    tarq_testkit::live_bytes()
}

fn payload() -> Box<[u8]> {
    vec![0xa7; PAYLOAD].into_boxed_slice()
}

/// Bytes per task beyond the payload, measured and as the engine counts its own capacity.
fn measure(name: &str, build: impl FnOnce(&mut Queue)) -> (String, Value) {
    let before = live();
    let mut q = Queue::new();
    build(&mut q);
    let bytes = live() - before;
    assert_eq!(q.len(), N);
    let per_task = (bytes - N * PAYLOAD) as f64 / N as f64;
    let own = q.overhead_bytes() as f64 / N as f64;
    println!("{name}: {per_task:.1} bytes per task beyond the payload (engine's count {own:.1})");
    drop(q);
    (
        name.to_string(),
        json!({ "bytes_per_task": per_task, "engine_count": own }),
    )
}

fn main() {
    if std::env::args().any(|a| a == "--test" || a == "--list") {
        return;
    }
    let mut out = serde_json::Map::new();
    let cases: Vec<(&str, Build)> = vec![
        (
            "ready",
            Box::new(|q: &mut Queue| {
                for _ in 0..N {
                    q.put(T0, payload(), PutOptions::default());
                }
            }),
        ),
        (
            "ready_ttl",
            Box::new(|q: &mut Queue| {
                let o = PutOptions {
                    ttl: Some(60_000_000),
                    ..Default::default()
                };
                for _ in 0..N {
                    q.put(T0, payload(), o);
                }
            }),
        ),
        (
            "waiting_delay_ttl",
            Box::new(|q: &mut Queue| {
                let o = PutOptions {
                    delay: 1_000_000,
                    ttl: Some(60_000_000),
                    ..Default::default()
                };
                for _ in 0..N {
                    q.put(T0, payload(), o);
                }
            }),
        ),
        (
            "taken_ttl_ttr",
            Box::new(|q: &mut Queue| {
                let o = PutOptions {
                    ttl: Some(60_000_000),
                    ttr: Some(30_000_000),
                    ..Default::default()
                };
                for _ in 0..N {
                    q.put(T0, payload(), o);
                }
                for i in 0..N as u64 {
                    q.take(T0, 1 + i % SESSIONS).expect("ready");
                }
            }),
        ),
    ];
    for (name, build) in cases {
        let (k, v) = measure(name, build);
        out.insert(k, v);
    }
    let before = live();
    let mut b = Baseline::new();
    for _ in 0..N {
        b.put(T0, payload(), 0, Some(60_000_000));
    }
    let per_task = (live() - before - N * PAYLOAD) as f64 / N as f64;
    assert_eq!(b.len(), N);
    drop(b);
    println!("btreemap baseline (ready, ttl): {per_task:.1} bytes per task beyond the payload");
    out.insert(
        "btreemap_ready_ttl".into(),
        json!({ "bytes_per_task": per_task }),
    );
    let doc = json!({ "tasks": N, "payload_bytes": PAYLOAD, "cases": Value::Object(out) });
    match report::update("memory", doc) {
        Ok(path) => println!("results written to {}", path.display()),
        Err(e) => eprintln!("could not write results: {e}"),
    }
}
