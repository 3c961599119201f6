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
//! `--seconds S` (3), `--tube NAME` (`batch`, created as fifo if missing), `--out FILE`,
//! `--prefill N` (first put N tasks and `truncate` the tube, unmeasured: the server's arena
//! and id index have then grown to N once, so the run measures puts, not first growth),
//! `--pid P` (the server's pid: the record gets the CPU its loop thread and its other threads
//! used over the measured window, from `/proc`).

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
    prefill: u64,
    pid: Option<u32>,
}

fn parse_args() -> Args {
    let mut a = Args {
        addr: "127.0.0.1:3301".parse().unwrap(),
        connections: 4,
        size: 100,
        seconds: 3.0,
        tube: "batch".into(),
        out: None,
        prefill: 0,
        pid: None,
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
            "--prefill" => a.prefill = value().parse().expect("--prefill N"),
            "--pid" => a.pid = Some(value().parse().expect("--pid P")),
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

/// CPU seconds (user + system) the server's threads used so far: its loop (the main thread,
/// whose tid is the pid) and all the others together. Clock ticks are 1/100 s on Linux.
fn server_cpu(pid: u32) -> (f64, f64) {
    let ticks = |path: String| {
        let stat = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
        // The fields after the command name (which may hold spaces) in parentheses.
        let rest = &stat[stat.rfind(')').expect("a stat line") + 2..];
        let f: Vec<&str> = rest.split_whitespace().collect();
        (f[11].parse::<f64>().unwrap() + f[12].parse::<f64>().unwrap()) / 100.0
    };
    let all = ticks(format!("/proc/{pid}/stat"));
    let main = ticks(format!("/proc/{pid}/task/{pid}/stat"));
    (main, all - main)
}

/// Busy CPU seconds of the whole machine (every core, all but idle and iowait) and of this
/// process, so far: how loaded the machine was, and by whom.
fn machine_cpu() -> (f64, f64) {
    let stat = std::fs::read_to_string("/proc/stat").expect("/proc/stat");
    let f: Vec<f64> = stat
        .lines()
        .next()
        .expect("the cpu line")
        .split_whitespace()
        .skip(1)
        .map(|v| v.parse().unwrap())
        .collect();
    // user nice system idle iowait irq softirq steal ...: busy is all but idle and iowait.
    let busy = f.iter().sum::<f64>() - f[3] - f[4];
    let own = std::fs::read_to_string("/proc/self/stat").expect("/proc/self/stat");
    let rest = &own[own.rfind(')').expect("a stat line") + 2..];
    let g: Vec<&str> = rest.split_whitespace().collect();
    let own = g[11].parse::<f64>().unwrap() + g[12].parse::<f64>().unwrap();
    (busy / 100.0, own / 100.0)
}

/// Puts `n` tasks in calls of `size`, then empties the tube with `truncate`.
fn prefill(a: &Args, n: u64) {
    let mut c = Client::connect_addr(a.addr, WAIT).expect("connecting");
    let items: Vec<Value> = (0..a.size).map(|i| Value::from(i as u64)).collect();
    let args = pack_args(&[Value::Array(items)]);
    let f = format!("queue.tube.{}:put_many", a.tube);
    let mut put = 0;
    while put < n {
        c.call(&f, &args, None).expect("put_many");
        put += a.size as u64;
    }
    c.call(
        &format!("queue.tube.{}:truncate", a.tube),
        &pack_args(&[]),
        None,
    )
    .expect("truncate");
}

fn main() {
    let a = Arc::new(parse_args());
    let mut c = Client::connect_addr(a.addr, WAIT).expect("connecting");
    let opts = Value::Map(vec![(Value::from("if_not_exists"), Value::Boolean(true))]);
    let create = [Value::from(a.tube.as_str()), Value::from("fifo"), opts];
    c.call("queue.create_tube", &pack_args(&create), None)
        .expect("create_tube");
    if a.prefill > 0 {
        prefill(&a, a.prefill);
    }
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
    let cpu_from = a.pid.map(server_cpu);
    let machine_from = machine_cpu();
    let (from, start) = (put.load(Ordering::Relaxed), Instant::now());
    std::thread::sleep(Duration::from_secs_f64(a.seconds)); // the measured window
    let (tasks, secs) = (
        put.load(Ordering::Relaxed) - from,
        start.elapsed().as_secs_f64(),
    );
    let machine_to = machine_cpu();
    let (busy, tool) = (
        (machine_to.0 - machine_from.0) / secs,
        (machine_to.1 - machine_from.1) / secs,
    );
    // Shares of one core over the window: the loop thread, and the server's other threads.
    let cpu = cpu_from
        .zip(a.pid.map(server_cpu))
        .map(|((m0, o0), (m1, o1))| ((m1 - m0) / secs, (o1 - o0) / secs));
    stop.store(true, Ordering::Relaxed);
    for t in threads {
        t.join().expect("producer");
    }
    let rate = tasks as f64 / secs;
    println!(
        "put_many of {}: {rate:.0} tasks/s over {} connections",
        a.size, a.connections
    );
    if let Some((main, others)) = cpu {
        println!(
            "server CPU: loop thread {:.0}% of a core, other threads {:.0}%",
            main * 100.0,
            others * 100.0
        );
    }
    println!(
        "machine: {:.0}% of a core busy in all, this tool {:.0}%",
        busy * 100.0,
        tool * 100.0
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
        "prefill": a.prefill,
        "loop_cpu": cpu.map(|c| c.0),
        "other_threads_cpu": cpu.map(|c| c.1),
        "tool_cpu": tool,
        // Cores' worth of CPU the whole machine used over the window (the server, this tool
        // and everything else): what is left after the first two is other load.
        "machine_busy_cpu": busy,
        "loadavg": std::fs::read_to_string("/proc/loadavg").ok().map(|l| l.trim().to_string()),
    });
    if let Some(out) = &a.out {
        std::fs::write(out, serde_json::to_string_pretty(&record).unwrap() + "\n")
            .expect("writing the record");
    }
}
