//! Tubes through `kill -9` of the real `tarq` binary, in every WAL mode that promises it:
//! producers put into a utubettl tube (with utube keys), a fifottl tube with a dedup window and
//! `max_deliveries`, and a limfifottl tube with delayed tasks, while a consumer takes, buries
//! and acks, until the server is killed. After a restart on the same directory, every tube is
//! back with its type and options, a dropped tube stays dropped, every put whose reply arrived
//! is there with its payload (unless its ack was sent), buried if its bury was answered,
//! delayed if it was put with a delay, a dedup key answered before the kill still returns its
//! task, and nothing is taken. And a data directory written in format 3 (one global id
//! counter) starts with its ids: the tube API and the beanstalk port reach the old tasks by
//! them, and new tasks are numbered above them, also after a restart; and a tube whose numbers
//! are spent refuses puts on both protocols, saying why.

mod support;

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use std::io::{BufRead, BufReader, Write};
use std::net::TcpStream;

use rmpv::Value;
use support::{addr_in, Client, Tarq, WAIT};
use tarq_client::{pack_args, ClientError};
use tarq_engine::{
    task_id, RestoredTask, Status, TaskId, TubeInfo, TubeIx, TubeNumbers, TubeOptions, TubeType,
    MAX_TASK_NUMBER,
};
use tarq_wal::format::{self, Kind, SNAP_MAGIC};

const PRODUCERS: usize = 4;
/// Puts answered before the kill: enough that it lands amid steady load.
const PUTS_BEFORE_KILL: u64 = 1500;
const BURIES_BEFORE_KILL: u64 = 50;
const UTUBES: u64 = 7;

fn call(c: &mut tarq_client::Client, f: &str, args: &[Value]) -> Result<Vec<Value>, ClientError> {
    c.call(f, &pack_args(args), None)
}

/// `[id, status, data]` as (id, status, data).
fn task(v: &Value) -> (u64, String, String) {
    let a = v.as_array().expect("a task is an array");
    (
        a[0].as_u64().unwrap(),
        a[1].as_str().unwrap().to_owned(),
        a[2].as_str().unwrap_or_default().to_owned(),
    )
}

/// A task as the tube API names it: its tube and its number there (each tube numbers its own).
type Key = (&'static str, u64);

#[derive(Default)]
struct Seen {
    /// Payload of every put answered.
    put: BTreeMap<Key, String>,
    /// Tasks whose bury was answered (and not acked after).
    buried: BTreeSet<Key>,
    /// Tasks a bury was sent for (done and durable, perhaps, without its reply arriving).
    bury_sent: BTreeSet<Key>,
    /// Tasks an ack was sent for.
    ack_sent: BTreeSet<Key>,
    /// dedup key → the number its put into `d` was answered with.
    dedup: BTreeMap<String, u64>,
    /// Tasks put with a delay (an hour: still delayed after the restart).
    delayed: BTreeSet<Key>,
}

#[derive(Clone, Default)]
struct Load {
    seen: Arc<Mutex<Seen>>,
    puts: Arc<AtomicU64>,
    buries: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
}

impl Load {
    fn produce(self, addr: SocketAddr, p: usize) {
        let Ok(mut c) = tarq_client::Client::connect_addr(addr, WAIT) else {
            return;
        };
        for n in 0u64.. {
            if self.stop.load(Ordering::Relaxed) {
                return;
            }
            let payload = format!("p{p}-{n}");
            let opt = |k: &str, v: Value| Value::Map(vec![(Value::from(k), v)]);
            let (tube, opts, key) = match n % 4 {
                0 => {
                    let key = format!("dk{p}-{n}");
                    ("d", opt("dedup_key", Value::from(key.as_str())), Some(key))
                }
                1 => ("lim", opt("delay", Value::from(3600)), None),
                _ => {
                    let u = format!("k{}", n % UTUBES);
                    ("u", opt("utube", Value::from(u.as_str())), None)
                }
            };
            let f = format!("queue.tube.{tube}:put");
            let r = match call(&mut c, &f, &[Value::from(payload.as_str()), opts]) {
                Ok(r) => r,
                Err(ClientError::Server { message, .. }) => panic!("{f} refused: {message}"),
                Err(_) => return, // the server is gone
            };
            let (id, _, data) = task(&r[0]);
            assert_eq!(data, payload);
            let mut seen = self.seen.lock().unwrap();
            seen.put.insert((tube, id), payload);
            if tube == "lim" {
                seen.delayed.insert((tube, id));
            }
            if let Some(key) = key {
                seen.dedup.insert(key, id);
            }
            self.puts.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Takes from `u`; buries one task in three, acks the rest.
    fn consume(self, addr: SocketAddr) {
        let Ok(mut c) = tarq_client::Client::connect_addr(addr, WAIT) else {
            return;
        };
        let mut n = 0u64;
        while !self.stop.load(Ordering::Relaxed) {
            let Ok(r) = call(&mut c, "queue.tube.u:take", &[Value::from(0.05)]) else {
                return;
            };
            let Some(t) = r.first() else { continue };
            let (id, ..) = task(t);
            n += 1;
            let bury = n.is_multiple_of(3);
            if bury {
                self.seen.lock().unwrap().bury_sent.insert(("u", id));
            } else {
                self.seen.lock().unwrap().ack_sent.insert(("u", id));
            }
            let f = if bury {
                "queue.tube.u:bury"
            } else {
                "queue.tube.u:ack"
            };
            let Ok(_) = call(&mut c, f, &[Value::from(id)]) else {
                return;
            };
            if bury {
                self.seen.lock().unwrap().buried.insert(("u", id));
                self.buries.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    fn wait_until_under_way(&self) {
        let deadline = Instant::now() + Duration::from_secs(60);
        while self.puts.load(Ordering::Relaxed) < PUTS_BEFORE_KILL
            || self.buries.load(Ordering::Relaxed) < BURIES_BEFORE_KILL
        {
            let (p, b) = (
                self.puts.load(Ordering::Relaxed),
                self.buries.load(Ordering::Relaxed),
            );
            assert!(
                Instant::now() < deadline,
                "the load makes progress: {p} puts, {b} buries"
            );
            std::thread::yield_now();
        }
    }
}

/// Tubes before the load: `u` (utubettl), `d` (fifottl with dedup and max_deliveries), `lim`
/// (limfifottl), and `gone`, created and dropped.
fn create_tubes(addr: SocketAddr) {
    let mut c = Client::connect(addr);
    let opts = |pairs: &[(&str, Value)]| {
        Value::Map(
            pairs
                .iter()
                .map(|(k, v)| (Value::from(*k), v.clone()))
                .collect(),
        )
    };
    c.call(
        "queue.create_tube",
        &[Value::from("u"), Value::from("utubettl")],
    )
    .one();
    let d = opts(&[
        ("dedup_window", Value::from(3600)),
        ("max_deliveries", Value::from(3)),
        ("ttl", Value::from(86_400)),
    ]);
    c.call(
        "queue.create_tube",
        &[Value::from("d"), Value::from("fifottl"), d],
    )
    .one();
    let lim = opts(&[("capacity", Value::from(1_000_000))]);
    c.call(
        "queue.create_tube",
        &[Value::from("lim"), Value::from("limfifottl"), lim],
    )
    .one();
    c.call(
        "queue.create_tube",
        &[Value::from("gone"), Value::from("fifo")],
    )
    .one();
    c.call("queue.tube.gone:put", &[Value::from("x")]).one();
    c.call("queue.tube.gone:drop", &[]).one();
}

/// Checks the restarted server against what was answered before the kill.
fn check_after_restart(addr: SocketAddr, seen: &Seen) {
    let mut c = tarq_client::Client::connect_addr(addr, WAIT).unwrap();
    let err = call(&mut c, "queue.tube.gone:peek", &[Value::from(1)]).unwrap_err();
    assert!(err.to_string().contains("is not defined"), "{err}");
    let stats = call(&mut c, "queue.statistics", &[]).unwrap();
    let stats = &stats[0];
    for tube in ["u", "d", "lim"] {
        let s = stats
            .as_map()
            .unwrap()
            .iter()
            .find(|(k, _)| k.as_str() == Some(tube))
            .unwrap_or_else(|| panic!("tube {tube} is back: {stats}"))
            .1
            .clone();
        let taken = s["tasks"]["taken"].as_u64();
        assert_eq!(taken, Some(0), "nothing taken in {tube}: {s}");
    }
    let mut checked = 0;
    for (key, payload) in &seen.put {
        let (tube, id) = *key;
        if seen.ack_sent.contains(key) {
            continue;
        }
        let f = format!("queue.tube.{tube}:peek");
        let r = call(&mut c, &f, &[Value::from(id)])
            .unwrap_or_else(|e| panic!("task {id}'s put was answered, yet {f} says {e}"));
        let (_, status, data) = task(&r[0]);
        assert_eq!(&data, payload, "task {id} of {tube}");
        let want = if seen.buried.contains(key) {
            "!"
        } else if seen.delayed.contains(key) {
            "~"
        } else {
            "r"
        };
        // A bury sent without its reply may have been done before the kill, or not.
        let unanswered_bury = seen.bury_sent.contains(key) && !seen.buried.contains(key);
        if !(unanswered_bury && status == "!") {
            assert_eq!(status, want, "task {id} of {tube}: status");
        }
        checked += 1;
    }
    assert!(checked > 0);
    // A dedup key answered before the kill still names its task.
    let (key, id) = seen
        .dedup
        .iter()
        .next()
        .expect("dedup puts before the kill");
    let opts = Value::Map(vec![(Value::from("dedup_key"), Value::from(key.as_str()))]);
    let r = call(&mut c, "queue.tube.d:put", &[Value::from("again"), opts]).unwrap();
    assert_eq!(task(&r[0]).0, *id, "the dedup key {key} survived");
}

fn kill_9_keeps_tubes(mode: &str) {
    let mut tarq = Tarq::start(&["--wal-mode", mode]);
    let addr = tarq.addr;
    create_tubes(addr);
    let load = Load::default();
    let mut threads = Vec::new();
    for p in 0..PRODUCERS {
        let load = load.clone();
        threads.push(std::thread::spawn(move || load.produce(addr, p)));
    }
    let consumer = load.clone();
    threads.push(std::thread::spawn(move || consumer.consume(addr)));
    load.wait_until_under_way();
    tarq.proc.0.kill().unwrap(); // SIGKILL
    tarq.proc.0.wait().unwrap();
    load.stop.store(true, Ordering::Relaxed);
    for t in threads {
        t.join().expect("client thread");
    }
    let seen = std::mem::take(&mut *load.seen.lock().unwrap());
    let again = Tarq::start_in(tarq.take_dir(), &["--wal-mode", mode]);
    check_after_restart(again.addr, &seen);
}

#[test]
fn kill_9_keeps_tubes_and_their_tasks_in_fsync_mode() {
    kill_9_keeps_tubes("fsync");
}

#[test]
fn kill_9_keeps_tubes_and_their_tasks_in_write_mode() {
    kill_9_keeps_tubes("write");
}

/// A task of `tube` in the layout formats 2 to 4 share.
fn older_task(buf: &mut Vec<u8>, tube: TubeIx, id: TaskId, status: Status) {
    let mut q = tarq_engine::Queue::new();
    if tube != 0 {
        q.restore_tube(
            tube,
            "t",
            TubeType::FifoTtl,
            TubeOptions::default(),
            TubeNumbers::default(),
        )
        .expect("tube");
    }
    let task = RestoredTask {
        id,
        status,
        runat: 0,
        pri: 0,
        ttl: None,
        ttr: None,
        created: 1_700_000_000_000_000,
        data: rmp_str(&format!("task {id}")),
    };
    q.restore_in(tube, task, None, 0).expect("restored");
    format::encode_task(buf, &q.get(id).expect("live")).expect("small");
}

/// A MessagePack string, as a payload.
fn rmp_str(s: &str) -> Box<[u8]> {
    let mut b = Vec::new();
    rmp::encode::write_str(&mut b, s).expect("to a Vec");
    b.into_boxed_slice()
}

/// A format-3 snapshot at position 2, from one global id counter at 9: tube 1 `old` holds
/// tasks 5 (ready) and 7 (buried), `default` task 6.
fn format_3_snapshot() -> Vec<u8> {
    let mut snap = format::file_header_version(SNAP_MAGIC, 3, 2).to_vec();
    let at = format::begin_record(&mut snap, 1, Kind::SnapTubes);
    snap.extend_from_slice(&2u32.to_le_bytes());
    for (ix, name) in [(0, "default"), (1, "old")] {
        let info = TubeInfo {
            ix,
            name,
            kind: TubeType::FifoTtl,
            opts: TubeOptions::default(),
            numbers: TubeNumbers::default(),
        };
        format::encode_tube_v3(&mut snap, &info);
    }
    format::end_record(&mut snap, at).expect("small");
    let at = format::begin_record(&mut snap, 2, Kind::SnapTasks);
    snap.extend_from_slice(&3u32.to_le_bytes());
    older_task(&mut snap, 1, 5, Status::Ready);
    older_task(&mut snap, 0, 6, Status::Ready);
    older_task(&mut snap, 1, 7, Status::Buried);
    format::end_record(&mut snap, at).expect("small");
    let at = format::begin_record(&mut snap, 3, Kind::SnapEnd);
    for v in [2u64, 9, 3, 0] {
        snap.extend_from_slice(&v.to_le_bytes());
    }
    format::encode_commit(&mut snap, 0, 0);
    format::end_small_record(&mut snap, at);
    snap
}

/// The first line of the beanstalk port's answer to `cmd`.
fn beanstalk_line(addr: std::net::SocketAddr, cmd: &str) -> String {
    let mut s = TcpStream::connect(addr).expect("connect");
    s.set_read_timeout(Some(WAIT)).unwrap();
    s.write_all(cmd.as_bytes()).unwrap();
    let mut line = String::new();
    BufReader::new(s).read_line(&mut line).expect("a reply");
    line.trim_end().to_owned()
}

fn start_on(dir: tempfile::TempDir) -> (Tarq, std::net::SocketAddr) {
    let mut tarq = Tarq::start_in(dir, &["--beanstalk-listen", "127.0.0.1:0"]);
    let line = tarq.wait_for_line("serving the beanstalk protocol");
    let bs = addr_in(&line, "listen=").expect("the beanstalk address");
    (tarq, bs)
}

#[test]
fn a_format_3_data_directory_starts_with_its_ids_over_the_wire() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    std::fs::create_dir_all(&data).unwrap();
    std::fs::write(data.join(format::snapshot_name(2)), format_3_snapshot()).unwrap();
    let (mut tarq, bs) = start_on(dir);
    let mut c = Client::connect(tarq.addr);
    let task = |v: Value| {
        let a = v.as_array().expect("a task").clone();
        (a[0].as_u64().unwrap(), a[1].as_str().unwrap().to_owned())
    };
    // The old tasks, by their old ids, on both protocols.
    let peek = |c: &mut Client, n: u64| task(c.call("queue.tube.old:peek", &[n.into()]).one());
    assert_eq!(peek(&mut c, 5), (5, "r".into()));
    assert_eq!(peek(&mut c, 7), (7, "!".into()));
    assert!(beanstalk_line(bs, "peek 7\r\n").starts_with("FOUND 7 "));
    assert!(beanstalk_line(bs, "peek 6\r\n").starts_with("FOUND 6 "));
    // New tasks: `old` numbers above the old counter (9), `default` too.
    let put = task(c.call("queue.tube.old:put", &[Value::from("new")]).one());
    assert_eq!(put, (10, "r".into()));
    let seed = support::id_of(&c.call("queue.put", &[Value::from("seed")]).one());
    assert_eq!(seed, 10);
    let whole = task_id(1, 10);
    assert!(
        beanstalk_line(bs, &format!("peek {whole}\r\n")).starts_with(&format!("FOUND {whole} "))
    );
    // An old task is taken and acked by its old id; the tube API's 6 is `default`'s, not old's.
    assert_eq!(
        task(c.call("queue.tube.old:take", &[0.into()]).one()),
        (5, "t".into())
    );
    assert_eq!(
        task(c.call("queue.tube.old:ack", &[5.into()]).one()),
        (5, "-".into())
    );
    let e = c.call("queue.tube.old:peek", &[6.into()]).err(32);
    assert!(e.contains("Task 6 not found"), "{e}");
    drop(c);
    // After a restart (a snapshot in the new format on the way out), the same.
    tarq.proc.signal("TERM");
    tarq.proc.wait_exit();
    let (tarq, _bs) = start_on(tarq.take_dir());
    let mut c = Client::connect(tarq.addr);
    assert_eq!(peek(&mut c, 7), (7, "!".into()));
    assert_eq!(peek(&mut c, 10), (10, "r".into()));
    let put = task(c.call("queue.tube.old:put", &[Value::from("newer")]).one());
    assert_eq!(put, (11, "r".into()));
}

#[test]
fn a_tube_whose_numbers_are_spent_refuses_puts_on_both_protocols() {
    // A data directory whose tube `full` has one number left and whose `default` has none
    // (2^41 puts each would take weeks): written by the WAL itself, as a snapshot carries it.
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    std::fs::create_dir_all(&data).unwrap();
    {
        let storage = std::sync::Arc::new(tarq_wal::FsStorage::new(&data).expect("storage"));
        let (mut wal, mut q, _) =
            tarq_wal::Wal::open(storage, tarq_wal::WalConfig::default()).expect("opens");
        let full = q
            .create_tube("full", TubeType::FifoTtl, TubeOptions::default())
            .expect("new");
        wal.append_turn(&mut q);
        let last = TubeNumbers {
            next: MAX_TASK_NUMBER,
            legacy_below: 0,
            first: 0,
        };
        q.restore_tube_numbers(full, last).expect("live");
        q.set_last_id(MAX_TASK_NUMBER);
        wal.snapshot_now(&mut q, WAIT).expect("snapshot");
    }
    let (tarq, bs) = start_on(dir);
    let mut c = Client::connect(tarq.addr);
    let put = c.call("queue.tube.full:put", &[Value::from("last")]).one();
    assert_eq!(put.as_array().unwrap()[0].as_u64(), Some(MAX_TASK_NUMBER));
    let e = c
        .call("queue.tube.full:put", &[Value::from("one more")])
        .err(32);
    assert!(e.contains("Tube 'full' has given out every task id"), "{e}");
    let e = c.call("queue.put", &[Value::from("seed")]).err(32);
    assert!(
        e.contains("Tube 'default' has given out every task id"),
        "{e}"
    );
    let mut s = TcpStream::connect(bs).expect("connect");
    s.set_read_timeout(Some(WAIT)).unwrap();
    s.write_all(b"use full\r\nput 0 0 60 1\r\nx\r\n").unwrap();
    let mut r = BufReader::new(s);
    let mut line = String::new();
    r.read_line(&mut line).unwrap();
    assert_eq!(line.trim_end(), "USING full");
    line.clear();
    r.read_line(&mut line).unwrap();
    assert_eq!(line.trim_end(), "OUT_OF_MEMORY");
}
