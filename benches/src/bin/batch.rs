//! `put_many` on a running tarq: N connections each send `queue.tube.<tube>:put_many` of SIZE
//! tasks in a loop for S seconds; prints the tasks put per second (what the loop sustains, one
//! WAL batch per call) and writes one JSON record (commit, machine, figures).
//!
//! ```sh
//! taskset -c 0 target/release/tarq --data-dir /tmp/d &
//! taskset -c 1 target/release/batch --addr 127.0.0.1:3301 --out results/tubes/batch.json
//! ```
//!
//! Flags: `--addr HOST:PORT`, `--connections N` (4), `--size N` (100 tasks a call),
//! `--seconds S` (3), `--tube NAME` (`batch`, created as fifo if missing), `--out FILE`.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rmpv::Value;
use serde_json::json;
use tarq_benches::report;
use tarq_client::{pack_args, Client};

const WAIT: Duration = Duration::from_secs(30);

struct Args {
    addr: SocketAddr,
    connections: usize,
    size: usize,
    seconds: f64,
    tube: String,
    out: Option<String>,
}

fn parse_args() -> Args {
    let mut a = Args {
        addr: "127.0.0.1:3301".parse().unwrap(),
        connections: 4,
        size: 100,
        seconds: 3.0,
        tube: "batch".into(),
        out: None,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().unwrap_or_else(|| panic!("{flag} needs a value"));
        match flag.as_str() {
            "--addr" => a.addr = value().parse().expect("--addr HOST:PORT"),
            "--connections" => a.connections = value().parse().expect("--connections N"),
            "--size" => a.size = value().parse().expect("--size N"),
            "--seconds" => a.seconds = value().parse().expect("--seconds S"),
            "--tube" => a.tube = value(),
            "--out" => a.out = Some(value()),
            other => panic!("unknown flag {other}"),
        }
    }
    a
}

/// Puts batches until `stop`, counting the tasks the server answered.
fn producer(a: &Args, put: &AtomicU64, stop: &AtomicBool) {
    let mut c = Client::connect_addr(a.addr, WAIT).expect("connecting");
    let items: Vec<Value> = (0..a.size).map(|i| Value::from(i as u64)).collect();
    let args = pack_args(&[Value::Array(items)]);
    let f = format!("queue.tube.{}:put_many", a.tube);
    while !stop.load(Ordering::Relaxed) {
        let r = c.call(&f, &args, None).expect("put_many");
        assert_eq!(r.len(), a.size, "one task per item");
        put.fetch_add(a.size as u64, Ordering::Relaxed);
    }
}

fn main() {
    let a = Arc::new(parse_args());
    let mut c = Client::connect_addr(a.addr, WAIT).expect("connecting");
    let opts = Value::Map(vec![(Value::from("if_not_exists"), Value::Boolean(true))]);
    let create = [Value::from(a.tube.as_str()), Value::from("fifo"), opts];
    c.call("queue.create_tube", &pack_args(&create), None)
        .expect("create_tube");
    let put = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let threads: Vec<_> = (0..a.connections)
        .map(|_| {
            let (a, put, stop) = (a.clone(), put.clone(), stop.clone());
            std::thread::spawn(move || producer(&a, &put, &stop))
        })
        .collect();
    // A warm-up second, then the measured window.
    std::thread::sleep(Duration::from_secs(1)); // a measuring window, not a synchronisation
    let (from, start) = (put.load(Ordering::Relaxed), Instant::now());
    std::thread::sleep(Duration::from_secs_f64(a.seconds)); // the measured window
    let (tasks, secs) = (
        put.load(Ordering::Relaxed) - from,
        start.elapsed().as_secs_f64(),
    );
    stop.store(true, Ordering::Relaxed);
    for t in threads {
        t.join().expect("producer");
    }
    let rate = tasks as f64 / secs;
    println!(
        "put_many of {}: {rate:.0} tasks/s over {} connections",
        a.size, a.connections
    );
    let record = json!({
        "commit": report::commit(),
        "date": report::date_utc(),
        "machine": report::machine(),
        "args": std::env::args().skip(1).collect::<Vec<_>>(),
        "batch_size": a.size,
        "connections": a.connections,
        "seconds": secs,
        "tasks": tasks,
        "tasks_per_s": rate,
    });
    if let Some(out) = &a.out {
        std::fs::write(out, serde_json::to_string_pretty(&record).unwrap() + "\n")
            .expect("writing the record");
    }
}
