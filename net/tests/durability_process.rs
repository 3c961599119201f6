//! Durability of the real `tarq` binary: `kill -9` in the middle of load in fsync mode, then a
//! restart on the same directory must hold every put whose reply arrived (unless the ack's
//! reply arrived too), none whose ack was answered, and nothing taken. And a second `tarq` on
//! a directory in use is refused with a clear message.

mod support;

use std::collections::{BTreeMap, BTreeSet};

use std::net::SocketAddr;
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rmpv::Value;
use support::{field, id_of, Client, Tarq, BIN, WAIT};
use tarq_client::{pack_args, ClientError};

const PRODUCERS: usize = 8;
const CONSUMERS: usize = 8;
/// Puts and acks answered before the kill: enough that the kill lands amid steady load.
const PUTS_BEFORE_KILL: u64 = 2000;
const ACKS_BEFORE_KILL: u64 = 500;

/// `tarq` with its data dir in `dir` (a restart passes the previous run's directory), logging
/// at info level (recovery and snapshots are logged there), once it serves.
fn tarq_in(dir: tempfile::TempDir, extra: &[&str]) -> Tarq {
    let mut args = vec!["--log-level", "info"];
    args.extend_from_slice(extra);
    Tarq::start_in(dir, &args)
}

/// A client that reports a dead server as an error instead of panicking.
struct Conn(tarq_client::Client);

enum Answer {
    Data(Vec<Value>),
    Error(String),
}

impl Conn {
    fn open(addr: SocketAddr) -> Result<Conn, ClientError> {
        tarq_client::Client::connect_addr(addr, WAIT).map(Conn)
    }

    fn call(&mut self, function: &str, args: &[Value]) -> Result<Answer, ClientError> {
        match self.0.call(function, &pack_args(args), None) {
            Ok(values) => Ok(Answer::Data(values)),
            Err(ClientError::Server { message, .. }) => Ok(Answer::Error(message)),
            Err(e) => Err(e),
        }
    }
}

#[derive(Default)]
struct Seen {
    /// id → payload of every put whose reply arrived.
    put: BTreeMap<u64, String>,
    /// ids whose ack's reply arrived.
    acked: BTreeSet<u64>,
    /// ids an ack was sent for (it may have been done and made durable without its reply
    /// arriving before the kill).
    ack_sent: BTreeSet<u64>,
}

/// What the client threads share: what they saw answered, how far the load got, and the stop.
#[derive(Clone, Default)]
struct Load {
    seen: Arc<Mutex<Seen>>,
    puts: Arc<AtomicU64>,
    acks: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
}

impl Load {
    fn stopped(&self) -> bool {
        self.stop.load(Ordering::Relaxed)
    }

    /// Puts distinct payloads until stopped or the server is gone, noting each answered put.
    fn produce(self, addr: SocketAddr, p: usize) {
        let Ok(mut c) = Conn::open(addr) else { return };
        for n in 0.. {
            if self.stopped() {
                return;
            }
            let payload = format!("p{p}-{n}");
            match c.call("queue.put", &[Value::from(payload.as_str())]) {
                Ok(Answer::Data(v)) => {
                    let id = id_of(&v[0]);
                    self.seen.lock().unwrap().put.insert(id, payload);
                    self.puts.fetch_add(1, Ordering::Relaxed);
                }
                Ok(Answer::Error(e)) => panic!("put refused: {e}"),
                Err(_) => return, // the server is gone
            }
        }
    }

    /// Takes and acks (one task in eight is released once first) until stopped or the server
    /// is gone, noting each ack sent and each ack answered.
    fn consume(self, addr: SocketAddr) {
        let Ok(mut c) = Conn::open(addr) else { return };
        let mut released = BTreeSet::new();
        while !self.stopped() {
            let task = match c.call("queue.take", &[Value::from(0.05)]) {
                Ok(Answer::Data(v)) if v.is_empty() => continue,
                Ok(Answer::Data(v)) => v[0].clone(),
                Ok(Answer::Error(e)) => panic!("take failed: {e}"),
                Err(_) => return,
            };
            let id = id_of(&task);
            let release = id.is_multiple_of(8) && released.insert(id);
            let f = if release {
                "queue.release"
            } else {
                "queue.ack"
            };
            if !release {
                self.seen.lock().unwrap().ack_sent.insert(id);
            }
            match c.call(f, &[Value::from(id)]) {
                Ok(Answer::Data(_)) if !release => {
                    self.seen.lock().unwrap().acked.insert(id);
                    self.acks.fetch_add(1, Ordering::Relaxed);
                }
                Ok(Answer::Data(_)) => {}
                Ok(Answer::Error(e)) => panic!("{f} {id} failed: {e}"),
                Err(_) => return,
            }
        }
    }

    /// Waits until the load is well under way, so the kill lands amid steady traffic.
    fn wait_until_under_way(&self) {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let (p, a) = (
                self.puts.load(Ordering::Relaxed),
                self.acks.load(Ordering::Relaxed),
            );
            if p >= PUTS_BEFORE_KILL && a >= ACKS_BEFORE_KILL {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "the load makes progress ({p} puts, {a} acks)"
            );
            std::thread::yield_now();
        }
    }
}

/// Takes every task the restarted server holds, once each: id → payload.
fn take_everything(c: &mut Client) -> BTreeMap<u64, String> {
    // The seed queue's own figures: `queue.stats()` counts every tube's tasks.
    let stats = c.call("queue.statistics", &[Value::from("default")]).one();
    let tasks = field(&stats, "tasks");
    assert_eq!(
        field(tasks, "taken").as_u64(),
        Some(0),
        "nothing is left taken: {stats}"
    );
    let total = field(tasks, "total").as_u64().unwrap();
    let mut present = BTreeMap::new();
    loop {
        let r = c.call("queue.take", &[]).ok();
        let Some(t) = r.first() else { break };
        present.insert(id_of(t), field(t, "data").as_str().unwrap().to_owned());
        assert!(present.len() as u64 <= total, "take returns each task once");
    }
    assert_eq!(
        present.len() as u64,
        total,
        "every task was ready and taken once"
    );
    present
}

/// Every answered put is back unless its ack may have been done; no answered ack is back.
fn check_against_what_was_answered(seen: &Seen, present: &BTreeMap<u64, String>) {
    for (id, payload) in &seen.put {
        if seen.acked.contains(id) {
            assert!(
                !present.contains_key(id),
                "task {id} was acked, yet it is back"
            );
        } else if !seen.ack_sent.contains(id) {
            assert_eq!(
                present.get(id),
                Some(payload),
                "task {id}'s put was answered, yet it is missing"
            );
        }
    }
}

#[test]
fn kill_9_under_load_in_fsync_mode_loses_nothing_acknowledged() {
    let mut tarq = tarq_in(tempfile::tempdir().unwrap(), &["--wal-mode", "fsync"]);
    let addr = tarq.addr;
    let load = Load::default();
    let mut threads = Vec::new();
    for p in 0..PRODUCERS {
        let load = load.clone();
        threads.push(std::thread::spawn(move || load.produce(addr, p)));
    }
    for _ in 0..CONSUMERS {
        let load = load.clone();
        threads.push(std::thread::spawn(move || load.consume(addr)));
    }
    load.wait_until_under_way();
    tarq.proc.0.kill().unwrap(); // SIGKILL
    tarq.proc.0.wait().unwrap();
    load.stop.store(true, Ordering::Relaxed);
    for t in threads {
        t.join().expect("client thread");
    }
    let seen = std::mem::take(&mut *load.seen.lock().unwrap());
    assert!(
        seen.acked.len() as u64 >= ACKS_BEFORE_KILL,
        "acks before the kill: {}",
        seen.acked.len()
    );

    let tarq = tarq_in(tarq.take_dir(), &["--wal-mode", "fsync"]);
    let mut c = Client::connect(tarq.addr);
    let present = take_everything(&mut c);
    check_against_what_was_answered(&seen, &present);
    let max = present
        .keys()
        .chain(seen.put.keys())
        .max()
        .copied()
        .unwrap_or(0);
    let fresh = id_of(&c.call("queue.put", &[Value::from("after restart")]).one());
    assert!(
        fresh > max,
        "ids continue above the largest seen: {fresh} after {max}"
    );
}

#[test]
fn a_second_tarq_on_the_same_data_dir_is_refused() {
    let first = tarq_in(tempfile::tempdir().unwrap(), &[]);
    let data = first.path("data");
    let out = Command::new(BIN)
        .args([
            "--listen",
            "127.0.0.1:0",
            "--data-dir",
            data.to_str().unwrap(),
        ])
        .output()
        .unwrap();
    assert!(!out.status.success(), "the second process must not start");
    let err = String::from_utf8_lossy(&out.stderr);
    let pid = first.proc.id().to_string();
    assert!(
        err.contains("in use by another tarq process") && err.contains(&pid),
        "{err}"
    );
}

#[test]
fn queue_snapshot_over_the_wire_then_a_restart_recovers_from_it() {
    let mut tarq = tarq_in(
        tempfile::tempdir().unwrap(),
        &["--snapshot-every-bytes", "0", "--keep-snapshots", "1"],
    );
    let data = tarq.path("data");
    let mut c = Client::connect(tarq.addr);
    let mut ids = Vec::new();
    for i in 0..50 {
        ids.push(id_of(
            &c.call("queue.put", &[Value::from(format!("s{i}"))]).one(),
        ));
    }
    let taken = id_of(&c.call("queue.take", &[]).one());
    c.call("queue.ack", &[Value::from(taken)]).one();
    let answer = c.call("queue.snapshot", &[]).one();
    assert_eq!(answer.as_str(), Some("snapshot started"), "{answer}");
    tarq.wait_for_line("snapshot done");
    let snaps: Vec<_> = std::fs::read_dir(&data)
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().ends_with(".snap"))
        .collect();
    assert_eq!(snaps.len(), 1, "one snapshot file");
    // A change after the snapshot lives only in the WAL.
    let late = id_of(&c.call("queue.put", &[Value::from("late")]).one());
    drop(c);
    tarq.proc.0.kill().unwrap(); // SIGKILL
    tarq.proc.0.wait().unwrap();

    let mut tarq = tarq_in(tarq.take_dir(), &[]);
    let line = tarq.wait_for_line("recovered");
    assert!(line.contains(".snap"), "recovery used the snapshot: {line}");
    let mut c = Client::connect(tarq.addr);
    let stats = c.call("queue.stats", &[]).one();
    assert_eq!(
        field(&stats, "total").as_u64(),
        Some(50),
        "49 left of the first 50, plus the late one: {stats}"
    );
    let mut back = BTreeSet::new();
    loop {
        let r = c.call("queue.take", &[]).ok();
        let Some(t) = r.first() else { break };
        back.insert(id_of(t));
    }
    let want: BTreeSet<u64> = ids
        .iter()
        .copied()
        .filter(|&id| id != taken)
        .chain([late])
        .collect();
    assert_eq!(back, want);
}

/// A payload of `len` bytes that differs along its length (a misplaced piece cannot compare
/// equal), as a msgpack string.
fn big_payload(len: usize, seed: u8) -> String {
    (0..len)
        .map(|i| (b'a' + ((i / 11) as u8 ^ seed) % 26) as char)
        .collect()
}

/// Big puts arrive in frames whose read buffer the task keeps, and the log and the snapshot
/// write them from the queue's buffer: over the wire, with the seed's and the tube API's put,
/// each comes back byte for byte in its reply, from the WAL after a kill, and from a snapshot.
#[test]
fn big_puts_come_back_byte_for_byte_in_the_reply_from_the_wal_and_from_a_snapshot() {
    const ARGS: [&str; 4] = [
        "--max-frame-bytes",
        "16777216",
        "--snapshot-every-bytes",
        "0",
    ];
    let tarq = tarq_in(tempfile::tempdir().unwrap(), &ARGS);
    let mut c = Client::connect(tarq.addr);
    c.call(
        "queue.create_tube",
        &[Value::from("big"), Value::from("fifo")],
    )
    .one();
    let seed_put = big_payload(6 << 20, 1);
    let r = c.call("queue.put", &[Value::from(seed_put.as_str())]).one();
    assert!(
        field(&r, "data").as_str() == Some(seed_put.as_str()),
        "the seed's reply"
    );
    let seed_id = id_of(&r);
    let tube_put = big_payload(3 << 20, 2);
    let r = c
        .call("queue.tube.big:put", &[Value::from(tube_put.as_str())])
        .one();
    assert!(r[2].as_str() == Some(tube_put.as_str()), "the tube's reply");
    let small_id = id_of(&c.call("queue.put", &[Value::from("small")]).one());
    drop(c);

    // Every task present, its bytes whole: the seed's two by take (left taken: a restart
    // makes them ready again), the tube's by take and release.
    let check = |c: &mut Client, from: &str| {
        let back = take_everything(c);
        assert!(
            back.get(&seed_id) == Some(&seed_put),
            "the 6 MiB task from {from}"
        );
        assert_eq!(back.get(&small_id).map(String::as_str), Some("small"));
        let t = c.call("queue.tube.big:take", &[Value::from(0)]).one();
        assert!(
            t[2].as_str() == Some(tube_put.as_str()),
            "the 3 MiB task from {from}"
        );
        c.call("queue.tube.big:release", &[t[0].clone()]).one();
    };

    let mut tarq = kill_and_restart(tarq, &ARGS);
    let line = tarq.wait_for_line("recovered");
    assert!(!line.contains(".snap"), "no snapshot yet: {line}");
    let mut c = Client::connect(tarq.addr);
    check(&mut c, "the WAL");
    let answer = c.call("queue.snapshot", &[]).one();
    assert_eq!(answer.as_str(), Some("snapshot started"), "{answer}");
    tarq.wait_for_line("snapshot done");
    drop(c);

    let mut tarq = kill_and_restart(tarq, &ARGS);
    let line = tarq.wait_for_line("recovered");
    assert!(line.contains(".snap"), "recovery used the snapshot: {line}");
    let mut c = Client::connect(tarq.addr);
    check(&mut c, "the snapshot");
}

/// SIGKILL, then a new `tarq` on the same directory.
fn kill_and_restart(mut tarq: Tarq, args: &[&str]) -> Tarq {
    tarq.proc.0.kill().unwrap();
    tarq.proc.0.wait().unwrap();
    tarq_in(tarq.take_dir(), args)
}
