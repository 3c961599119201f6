//! `hostile`: the slow-frame attack, measured. Starts the `tarq` binary, runs a well-behaved
//! client (depth-1 put → take → ack over IPROTO) alone, then opens N attacking connections that
//! each send the size prefix of a big frame and most of its body and stall, holding them open
//! while the client goes on. Records the server's RSS (from /proc, sampled every few ms) before
//! and at its peak, the client's round-trip percentiles alone and under attack, and the
//! server's limit figures; writes one JSON record (commit, machine, arguments, figures).
//!
//! ```sh
//! cargo build --release -p tarq-net -p tarq-benches
//! target/release/hostile --tarq target/release/tarq --connections 200 \
//!     --out results/hostile/<date>-<commit>-200.json
//! ```
//!
//! Flags: `--connections N` (attackers), `--frame-bytes B` (announced; default 16 MiB, the
//! default frame cap), `--sent-bytes B` (sent of each; default 15 MiB), `--hold-seconds S`
//! (how long the stalled connections are held while the client measures; default 5), and any
//! `--server-cpu C` / `--client-cpu C` pin the server's loop and this tool to cores, and any
//! flags after `--` go to `tarq` (for example `-- --input-budget-bytes 268435456`).

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use rustix::event::{poll, PollFd, PollFlags, Timespec};
use serde_json::{json, Value};
use tarq_benches::report;
use tarq_iproto::client::{self, GREETING_LEN};
use tarq_iproto::mp::write;
use tarq_iproto::split_frame;

/// How long the client runs alone first, for its baseline percentiles.
const BASELINE: Duration = Duration::from_secs(2);
/// Between RSS samples: fine enough to catch a peak that lasts a turn of the attack.
const SAMPLE_EVERY: Duration = Duration::from_millis(5);
/// Longest any step (start, connect, a reply) may take before the run fails.
const WAIT: Duration = Duration::from_secs(60);
/// Bytes per write of an attacker.
const CHUNK: usize = 64 * 1024;
/// What an attacker sends as body.
static BODY: [u8; CHUNK] = [0x42; CHUNK];

struct Args {
    tarq: String,
    connections: usize,
    frame_bytes: usize,
    sent_bytes: usize,
    hold: Duration,
    out: String,
    /// Core of the server's loop (`tarq --cpu`) and core of this tool, when set.
    server_cpu: Option<usize>,
    client_cpu: Option<usize>,
    tarq_args: Vec<String>,
}

fn parse_args() -> Args {
    let mut a = Args {
        tarq: "target/release/tarq".into(),
        connections: 200,
        frame_bytes: 16 << 20,
        sent_bytes: 15 << 20,
        hold: Duration::from_secs(5),
        out: String::new(),
        server_cpu: None,
        client_cpu: None,
        tarq_args: Vec::new(),
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        if flag == "--" {
            a.tarq_args = it.by_ref().collect();
            break;
        }
        let v = it.next().unwrap_or_else(|| panic!("{flag} needs a value"));
        let num = || v.parse::<usize>().unwrap_or_else(|_| panic!("{flag} {v}"));
        match flag.as_str() {
            "--tarq" => a.tarq = v.clone(),
            "--connections" => a.connections = num(),
            "--frame-bytes" => a.frame_bytes = num(),
            "--sent-bytes" => a.sent_bytes = num(),
            "--hold-seconds" => a.hold = Duration::from_secs(num() as u64),
            "--out" => a.out = v.clone(),
            "--server-cpu" => a.server_cpu = Some(num()),
            "--client-cpu" => a.client_cpu = Some(num()),
            _ => panic!("unknown flag {flag}"),
        }
    }
    assert!(!a.out.is_empty(), "--out FILE.json is required");
    a
}

/// The started server: its process, address and the path of its data dir.
struct Server {
    child: Child,
    addr: SocketAddr,
    dir: std::path::PathBuf,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn start(a: &Args) -> Server {
    let dir = std::env::temp_dir().join(format!("tarq-hostile-{}", std::process::id()));
    let child = Command::new(&a.tarq)
        .args(["--listen", "127.0.0.1:0", "--data-dir"])
        .arg(&dir)
        .args(["--max-connections", &(a.connections + 16).to_string()])
        .args(a.server_cpu.map(|c| format!("--cpu={c}")))
        .args(&a.tarq_args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start {}: {e}", a.tarq));
    // Owned at once, so that every way out of here kills the child.
    let mut server = Server {
        child,
        addr: "127.0.0.1:0".parse().unwrap(),
        dir,
    };
    let (tx, rx) = mpsc::channel();
    let mut err = server.child.stderr.take().unwrap();
    std::thread::spawn(move || {
        // Forwards the log lines; the serving line carries the address.
        let mut text = String::new();
        let mut buf = [0u8; 4096];
        while let Ok(n) = err.read(&mut buf) {
            if n == 0 {
                break;
            }
            text.push_str(&String::from_utf8_lossy(&buf[..n]));
            while let Some(end) = text.find('\n') {
                let line: String = text.drain(..=end).collect();
                let _ = tx.send(line);
            }
        }
    });
    let deadline = Instant::now() + WAIT;
    loop {
        let line = rx
            .recv_timeout(deadline.saturating_duration_since(Instant::now()))
            .expect("tarq did not say it serves");
        if let Some(rest) = line.split("listen=").nth(1) {
            server.addr = rest.split_whitespace().next().unwrap().parse().unwrap();
            // Keep draining the log so the server never blocks on a full pipe.
            std::thread::spawn(move || while rx.recv().is_ok() {});
            return server;
        }
    }
}

/// The load average, to say how busy the shared machine was.
fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.trim().to_string())
        .unwrap_or_default()
}

fn rss_bytes(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        })
        .map_or(0, |kib| kib * 1024)
}

/// A blocking depth-1 IPROTO client.
struct Client {
    s: TcpStream,
    buf: Vec<u8>,
    sync: u64,
}

impl Client {
    fn connect(addr: SocketAddr) -> Client {
        let mut s = TcpStream::connect(addr).unwrap();
        s.set_nodelay(true).unwrap();
        s.set_read_timeout(Some(WAIT)).unwrap();
        let mut g = [0u8; GREETING_LEN];
        s.read_exact(&mut g).unwrap();
        Client {
            s,
            buf: Vec::new(),
            sync: 0,
        }
    }

    /// One call; returns the reply's DATA bytes, panicking on an error reply.
    fn call(&mut self, function: &str, args: &[u8]) -> Vec<u8> {
        self.sync += 1;
        let mut out = Vec::new();
        client::call(&mut out, self.sync, function, args);
        self.s.write_all(&out).unwrap();
        loop {
            if let Some(f) = split_frame(&self.buf, usize::MAX).unwrap() {
                let r = client::decode(&self.buf[f.prefix..f.total()]).unwrap();
                assert_eq!(r.sync, self.sync);
                assert_eq!(r.code, 0, "error reply: {:?}", r.error);
                let data = r.data.unwrap_or_default().to_vec();
                self.buf.drain(..f.total());
                return data;
            }
            let mut chunk = [0u8; 16 * 1024];
            let n = self.s.read(&mut chunk).unwrap();
            assert!(n > 0, "the server closed the well-behaved client");
            self.buf.extend_from_slice(&chunk[..n]);
        }
    }

    /// put → take → ack, recording each round trip in nanoseconds.
    fn cycle(&mut self, rtts: &mut Vec<u64>) {
        let mut args = Vec::new();
        write::array_len(&mut args, 1);
        write::str(
            &mut args,
            "a well-behaved client's 64-byte payload, nothing more or less",
        );
        let t = Instant::now();
        self.call("queue.put", &args);
        rtts.push(t.elapsed().as_nanos() as u64);
        let mut take = Vec::new();
        write::array_len(&mut take, 1);
        write::uint(&mut take, 0);
        let t = Instant::now();
        let data = self.call("queue.take", &take);
        rtts.push(t.elapsed().as_nanos() as u64);
        let id = client::task_id(&data).unwrap().expect("a task");
        let mut ack = Vec::new();
        write::array_len(&mut ack, 1);
        write::uint(&mut ack, id);
        let t = Instant::now();
        self.call("queue.ack", &ack);
        rtts.push(t.elapsed().as_nanos() as u64);
    }

    /// `queue.stats()` as name → value.
    fn stats(&mut self) -> Value {
        let mut args = Vec::new();
        write::array_len(&mut args, 0);
        let data = self.call("queue.stats", &args);
        let v: Value = decode_stats(&data);
        v
    }
}

/// The stats map in DATA (`[{name: uint, ...}]`) as JSON.
fn decode_stats(data: &[u8]) -> Value {
    let mut r = tarq_iproto::mp::Reader::new(data);
    assert_eq!(r.read_array_len().unwrap(), 1);
    let mut m = serde_json::Map::new();
    for _ in 0..r.read_map_len().unwrap() {
        let k = r.read_str().unwrap().to_string();
        m.insert(k, json!(r.read_uint().unwrap()));
    }
    Value::Object(m)
}

/// Percentiles of round trips, in microseconds.
fn percentiles(rtts: &mut [u64]) -> Value {
    rtts.sort_unstable();
    let at = |p: f64| {
        let i = ((rtts.len() as f64 * p).ceil() as usize).clamp(1, rtts.len()) - 1;
        rtts[i] as f64 / 1000.0
    };
    json!({
        "requests": rtts.len(),
        "p50_us": at(0.50),
        "p99_us": at(0.99),
        "p999_us": at(0.999),
        "max_us": at(1.0),
    })
}

/// Every attacker, on one thread (attackers are other machines in real life: here they must
/// not crowd the well-behaved client off its core, so they share one niced thread): each
/// connection sends the size prefix of a `frame`-byte frame, then `sent` bytes of its body,
/// then nothing. Non-blocking writes, `poll` for room. Returns the sockets (held open by the
/// caller) and how many sent every byte.
fn attack(addr: SocketAddr, n: usize, frame: usize, sent: usize) -> (Vec<TcpStream>, usize) {
    // This thread's own priority (a thread id is a process id to setpriority); best effort.
    let _ = rustix::process::setpriority_process(Some(rustix::thread::gettid()), 10);
    let mut socks: Vec<TcpStream> = (0..n)
        .filter_map(|_| TcpStream::connect(addr).ok())
        .collect();
    let mut header = vec![0xce];
    header.extend_from_slice(&(frame as u32).to_be_bytes());
    let total = header.len() + sent;
    // Bytes each has sent; None once the server closed it.
    let mut done: Vec<Option<usize>> = vec![Some(0); socks.len()];
    for s in &mut socks {
        s.set_nonblocking(true).unwrap();
    }
    let deadline = Instant::now() + WAIT * 5;
    loop {
        let mut waiting = Vec::new();
        for (i, s) in socks.iter_mut().enumerate() {
            while let Some(d) = done[i].filter(|&d| d < total) {
                let buf = if d < header.len() {
                    &header[d..]
                } else {
                    &BODY[..CHUNK.min(total - d)]
                };
                match s.write(buf) {
                    Ok(k) => done[i] = Some(d + k),
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                        waiting.push(i);
                        break;
                    }
                    Err(_) => done[i] = None,
                }
            }
        }
        if waiting.is_empty() || Instant::now() > deadline {
            break;
        }
        let mut fds: Vec<PollFd<'_>> = waiting
            .iter()
            .map(|&i| PollFd::new(&socks[i], PollFlags::OUT))
            .collect();
        // A timeout or an interruption only means another round of writes.
        let _ = poll(
            &mut fds,
            Some(&Timespec {
                tv_sec: 1,
                tv_nsec: 0,
            }),
        );
    }
    let complete = done.iter().filter(|d| **d == Some(total)).count();
    (socks, complete)
}

/// What the attack phase measured.
struct UnderAttack {
    /// Round trips in nanoseconds.
    rtts: Vec<u64>,
    rss_peak: u64,
    sent_ok: usize,
    sending: Duration,
    /// The attackers' sockets, held open until the server's figures are read.
    held: Vec<TcpStream>,
}

/// The client alone for `BASELINE`: its round trips (ns).
fn baseline(good: &mut Client) -> Vec<u64> {
    let mut alone = Vec::new();
    let t = Instant::now();
    while t.elapsed() < BASELINE {
        good.cycle(&mut alone);
    }
    alone
}

/// Runs the attack while the client goes on and the server's RSS is sampled, then holds the
/// stalled connections for `a.hold`, still measuring.
fn under_attack(a: &Args, addr: SocketAddr, pid: u32, good: &mut Client) -> UnderAttack {
    let sending = AtomicBool::new(true);
    std::thread::scope(|scope| {
        let attackers = scope.spawn(|| {
            let t = Instant::now();
            let out = attack(addr, a.connections, a.frame_bytes, a.sent_bytes);
            sending.store(false, Ordering::SeqCst);
            (out, t.elapsed())
        });
        // RSS sampled on its own thread, so a slow reply cannot hide a peak.
        let sampler = scope.spawn(|| {
            let mut peak = 0;
            while sending.load(Ordering::SeqCst) {
                peak = peak.max(rss_bytes(pid));
                std::thread::sleep(SAMPLE_EVERY); // a sampling period, not a synchronisation
            }
            peak
        });
        let mut rtts = Vec::new();
        while sending.load(Ordering::SeqCst) {
            good.cycle(&mut rtts);
        }
        let ((held, sent_ok), sending) = attackers.join().unwrap();
        let mut rss_peak = sampler.join().unwrap();
        // The stalled connections are held; the client goes on and RSS is watched.
        let t = Instant::now();
        while t.elapsed() < a.hold {
            good.cycle(&mut rtts);
            rss_peak = rss_peak.max(rss_bytes(pid));
        }
        UnderAttack {
            rtts,
            rss_peak,
            sent_ok,
            sending,
            held,
        }
    })
}

/// Writes the JSON record to `a.out` and prints it.
fn write_record(record: &Value, out: &str) {
    let text = serde_json::to_string_pretty(record).unwrap();
    if let Some(dir) = std::path::Path::new(out).parent() {
        std::fs::create_dir_all(dir).unwrap();
    }
    std::fs::write(out, text.clone() + "\n").unwrap();
    println!("{text}");
}

fn main() {
    let a = parse_args();
    let server = start(&a);
    let pid = server.child.id();
    if let Some(cpu) = a.client_cpu {
        tarq_affinity::pin(cpu).unwrap_or_else(|e| panic!("{e}"));
    }
    let load_before = loadavg();
    let mut good = Client::connect(server.addr);
    let mut alone = baseline(&mut good);
    let rss_before = rss_bytes(pid);
    let mut attacked = under_attack(&a, server.addr, pid, &mut good);
    let rss_end = rss_bytes(pid);
    let stats = good.stats();
    drop(std::mem::take(&mut attacked.held));
    let mib = |b: u64| b as f64 / (1 << 20) as f64;
    let record = json!({
        "commit": report::commit(),
        "date": report::date_utc(),
        "machine": report::machine(),
        "args": std::env::args().skip(1).collect::<Vec<_>>(),
        "loadavg_before": load_before,
        "loadavg_after": loadavg(),
        "attack": {
            "connections": a.connections,
            "frame_bytes": a.frame_bytes,
            "sent_bytes_each": a.sent_bytes,
            "would_hold_without_a_budget_mib": (a.connections * a.frame_bytes) >> 20,
            "attackers_that_sent_everything": attacked.sent_ok,
            "sending_seconds": attacked.sending.as_secs_f64(),
            "held_seconds": a.hold.as_secs_f64(),
        },
        "server_rss_mib": {
            "before": mib(rss_before),
            "peak": mib(attacked.rss_peak),
            "end": mib(rss_end),
        },
        "input_budget_mib": stats["input_budget_bytes"].as_u64().unwrap_or(0) >> 20,
        "good_client": {
            "alone": percentiles(&mut alone),
            "under_attack": percentiles(&mut attacked.rtts),
            "errors": 0,
        },
        "server_stats": stats,
    });
    write_record(&record, &a.out);
}
