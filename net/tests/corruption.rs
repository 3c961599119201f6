//! Disk corruption under the real binary: a byte flipped in, or a cut of, a node's WAL segment
//! or snapshot, and what the node does with it at its next start.
//! - a single node refuses to start on a flipped byte — in the middle of its WAL, or in its
//!   acknowledged last turn (which a start used to cut as if torn) — naming the file, the
//!   offset and what to do, and on all its snapshots damaged with the WAL gone before them,
//!   naming each snapshot; a damaged newest snapshot is passed over for the older one and the
//!   WAL after it, and moved into `damaged-<time>/` beside them;
//! - a replica of a three-node etcd cluster whose WAL rots moves its log aside, copies the
//!   primary again and ends with exactly the primary's tasks; left alone with its empty log, it
//!   wins the election and resigns: it never leads with data it does not hold.
//!
//! Every wait has a deadline; ports are held as the support code holds them.

#[path = "support/cluster.rs"]
mod cluster;
mod support;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use cluster::{field, peek_data, str_field, wait_for, Etcd, Nodes, Put, Writer};
use rmpv::Value;
use support::{Lines, Proc, Tarq, BIN, WAIT};
use tarq_client::{pack_args, Client as Blocking};

/// A record's header: marker, length, sequence number, kind, checksum (`tarq_wal::format`).
const RECORD_HEADER: usize = 24;
const FILE_HEADER: usize = 32;
const PUT: u8 = 1;
const COMMIT: u8 = 4;

/// A record as it lies in a segment.
#[derive(Clone, Copy, Debug)]
struct Rec {
    off: usize,
    kind: u8,
}

/// The records of a segment, read by their headers.
fn records(bytes: &[u8]) -> Vec<Rec> {
    let mut out = Vec::new();
    let mut off = FILE_HEADER;
    while off + RECORD_HEADER <= bytes.len() {
        let len = u32::from_le_bytes(bytes[off + 4..off + 8].try_into().unwrap()) as usize;
        out.push(Rec {
            off,
            kind: bytes[off + 16],
        });
        off += RECORD_HEADER + len;
    }
    out
}

/// The files of `dir` ending in `suffix`, sorted (so in log order).
fn files(dir: &Path, suffix: &str) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|n| n.ends_with(suffix))
        .collect();
    v.sort();
    v
}

/// The `damaged-*` folders of `dir`.
fn damaged_folders(dir: &Path) -> Vec<PathBuf> {
    std::fs::read_dir(dir)
        .unwrap()
        .filter_map(|e| Some(e.ok()?.path()))
        .filter(|p| {
            p.is_dir()
                && p.file_name()
                    .unwrap()
                    .to_str()
                    .unwrap()
                    .starts_with("damaged-")
        })
        .collect()
}

fn flip(path: &Path, offset: usize) {
    let mut bytes = std::fs::read(path).unwrap();
    bytes[offset] ^= 0x20;
    std::fs::write(path, bytes).unwrap();
}

fn call(addr: std::net::SocketAddr, name: &str, args: &[Value]) -> Value {
    let mut c = Blocking::connect_addr(addr, WAIT).expect("connect");
    let v = c.call(name, &pack_args(args), None).expect(name);
    v.into_iter().next().unwrap_or(Value::Nil)
}

/// `n` puts of `tag`-numbered payloads of 300 bytes (so a few fill a small segment).
fn put_many(addr: std::net::SocketAddr, tag: &str, n: usize) {
    let mut c = Blocking::connect_addr(addr, WAIT).expect("connect");
    for i in 0..n {
        let data = format!("{tag}-{i}-{}", "x".repeat(300));
        c.call("queue.put", &pack_args(&[Value::from(data)]), None)
            .expect("put");
    }
}

fn total(addr: std::net::SocketAddr) -> u64 {
    let stats = call(addr, "queue.stats", &[]);
    field(&stats, "total")
        .and_then(Value::as_u64)
        .expect("total")
}

/// Starts `tarq` on `data` with `args`, expecting it to refuse: its exit status must be a
/// failure; returns what it wrote to stderr.
fn refused_start(data: &Path, args: &[&str]) -> String {
    let mut cmd = Command::new(BIN);
    cmd.args([
        "--listen",
        "127.0.0.1:0",
        "--data-dir",
        data.to_str().unwrap(),
    ])
    .args(args)
    .env_remove("RUST_LOG")
    .env("RUST_BACKTRACE", "0")
    .stdin(Stdio::null())
    .stdout(Stdio::null())
    .stderr(Stdio::piped());
    let mut proc = Proc::spawn(&mut cmd);
    let mut lines = Lines::read(proc.0.stderr.take().unwrap());
    let status = proc.wait_exit();
    lines.drain(Duration::from_secs(1));
    let log = lines.log.join("\n");
    assert!(!status.success(), "the start must fail; it logged:\n{log}");
    assert!(!log.contains("tarq serving"), "it served:\n{log}");
    log
}

/// A single node's data directory with `puts` acknowledged puts in one segment; stopped.
fn stopped_node(puts: usize) -> (tempfile::TempDir, PathBuf) {
    let mut t = Tarq::start(&[]);
    put_many(t.addr, "task", puts);
    t.signal("TERM");
    assert!(t.wait_exit().success());
    let dir = t.take_dir();
    let data = dir.path().join("data");
    (dir, data)
}

#[test]
fn a_single_node_refuses_a_flipped_byte_in_its_wal_naming_file_and_offset() {
    for last_turn in [false, true] {
        let (_dir, data) = stopped_node(20);
        let seg = files(&data, ".xlog").remove(0);
        let path = data.join(&seg);
        let recs = records(&std::fs::read(&path).unwrap());
        // In the middle: a put's payload. In the last turn: its Commit, which a start used to
        // cut as a torn write, silently losing the acknowledged put before it.
        let victim = if last_turn {
            *recs.last().unwrap()
        } else {
            recs.iter()
                .filter(|r| r.kind == PUT)
                .nth(9)
                .copied()
                .unwrap()
        };
        assert_eq!(victim.kind, if last_turn { COMMIT } else { PUT });
        let len = std::fs::metadata(&path).unwrap().len();
        flip(&path, victim.off + RECORD_HEADER + 1);

        let log = refused_start(&data, &[]);
        let said = format!("WAL file {seg} is damaged at offset {}", victim.off);
        assert!(
            log.contains(&said),
            "last turn {last_turn}: {said:?} in:\n{log}"
        );
        assert!(log.contains("--force-recovery"), "says what to do:\n{log}");
        assert_eq!(std::fs::metadata(&path).unwrap().len(), len, "nothing cut");
    }
}

/// Asks for a snapshot and waits for a new snapshot file in `data`.
fn snapshot(addr: std::net::SocketAddr, data: &Path) -> String {
    let before = files(data, ".snap");
    call(addr, "queue.snapshot", &[]);
    let mut new = None;
    wait_for("the snapshot file", || {
        new = files(data, ".snap")
            .into_iter()
            .find(|s| !before.contains(s));
        new.is_some()
    });
    new.unwrap()
}

/// A single node's data directory with two snapshots and the WAL after the older one only
/// (small segments: older ones went), stopped; its task count and the snapshots, older first.
fn node_with_two_snapshots() -> (tempfile::TempDir, PathBuf, u64, Vec<String>) {
    let mut t = Tarq::start(&["--wal-segment-bytes", "4096"]);
    let data = t.path("data");
    put_many(t.addr, "a", 15);
    let older = snapshot(t.addr, &data);
    put_many(t.addr, "b", 15);
    let newer = snapshot(t.addr, &data);
    put_many(t.addr, "c", 5);
    let tasks = total(t.addr);
    t.signal("TERM");
    assert!(t.wait_exit().success());
    let dir = t.take_dir();
    (dir, data, tasks, vec![older, newer])
}

#[test]
fn a_single_node_falls_back_past_a_damaged_snapshot_and_refuses_when_none_is_left() {
    let (dir, data, tasks, snaps) = node_with_two_snapshots();
    assert!(
        files(&data, ".xlog")[0] != format!("{:020}.xlog", 1),
        "the WAL before the older snapshot went"
    );
    let middle = |s: &str| std::fs::metadata(data.join(s)).unwrap().len() as usize / 2;
    flip(&data.join(&snaps[1]), middle(&snaps[1]));
    let damaged = std::fs::read(data.join(&snaps[1])).unwrap();

    // The older snapshot and the WAL after it hold every task.
    let mut t = Tarq::start_in(dir, &[]);
    assert_eq!(total(t.addr), tasks);
    t.wait_for_line("moved the damaged snapshots aside");
    t.signal("TERM");
    assert!(t.wait_exit().success());
    let dir = t.take_dir();
    let folders = damaged_folders(&data);
    assert_eq!(folders.len(), 1, "{folders:?}");
    assert_eq!(
        std::fs::read(folders[0].join(&snaps[1])).unwrap(),
        damaged,
        "kept as it was"
    );
    assert!(!files(&data, ".snap").contains(&snaps[1]));

    // Every snapshot damaged: nothing holds what they held.
    for s in files(&data, ".snap") {
        flip(&data.join(&s), middle(&s));
    }
    let log = refused_start(&data, &[]);
    assert!(
        log.contains("every snapshot in the data directory is damaged"),
        "{log}"
    );
    for s in files(&data, ".snap") {
        assert!(log.contains(&format!("{s} at offset")), "names {s}:\n{log}");
    }
    drop(dir);
}

/// Waits until node `i` streams from the primary and holds all it has written.
fn wait_caught_up(nodes: &Nodes, leader: usize, i: usize) {
    wait_for(&format!("n{i} to hold all the primary wrote"), || {
        let (Some(l), Some(o)) = (nodes.overview(leader), nodes.overview(i)) else {
            return false;
        };
        let connected = field(&o, "upstream")
            .and_then(|u| field(u, "connected"))
            .and_then(Value::as_u64);
        let pos = |v: &Value| field(v, "position").and_then(Value::as_u64);
        connected == Some(1) && pos(&o).is_some() && pos(&o) == pos(&l)
    });
}

/// `n` acknowledged puts through a client that follows the leader; their ids and payloads.
fn acked_puts(nodes: &Nodes, tag: &str, n: usize) -> Vec<(u64, String)> {
    let mut w = Writer::new(nodes);
    let mut acked = Vec::new();
    let deadline = Instant::now() + WAIT;
    while acked.len() < n {
        assert!(Instant::now() < deadline, "puts acknowledged in time");
        let data = format!("{tag}-{}", acked.len());
        match w.put_once(&data) {
            Put::Acked { id, .. } => acked.push((id, data)),
            Put::Refused(_) | Put::Lost(_) => std::thread::yield_now(),
        }
    }
    acked
}

/// Flips a byte of a put in the middle of node `i`'s (stopped) WAL, far from its tail.
fn rot_wal(data: &Path) -> String {
    let seg = files(data, ".xlog").remove(0);
    let path = data.join(&seg);
    let recs = records(&std::fs::read(&path).unwrap());
    let puts: Vec<&Rec> = recs.iter().filter(|r| r.kind == PUT).collect();
    assert!(puts.len() >= 10, "{seg} holds {} puts", puts.len());
    flip(&path, puts[puts.len() / 2].off + RECORD_HEADER + 1);
    seg
}

/// Node `i` holds exactly `acked` (each id with its payload) and nothing else.
fn holds_exactly(nodes: &Nodes, i: usize, acked: &[(u64, String)]) {
    let addr = nodes.nodes[i].addr;
    assert_eq!(total(addr), acked.len() as u64, "n{i}'s task count");
    for (id, data) in acked {
        assert_eq!(
            peek_data(addr, *id).as_deref(),
            Some(data.as_str()),
            "task {id} on n{i}"
        );
    }
}

#[test]
fn a_replica_whose_wal_rots_copies_the_primary_again() {
    let etcd = Etcd::start();
    let mut nodes = Nodes::start(&etcd, 3, &[]);
    let leader = nodes.wait_leader();
    let r = (leader + 1) % 3;
    let data = nodes.nodes[r].tarq.as_ref().unwrap().path("data");
    let mut acked = acked_puts(&nodes, "before", 30);
    wait_caught_up(&nodes, leader, r);
    nodes.kill(r);
    let seg = rot_wal(&data);
    let rotten = std::fs::read(data.join(&seg)).unwrap();
    // More for it to fetch than it had.
    acked.extend(acked_puts(&nodes, "while-down", 10));

    nodes.start_node(r);
    let t = nodes.nodes[r].tarq.as_mut().unwrap();
    let line = t.wait_for_line("moved it aside and copying the primary again");
    assert!(line.contains(&seg), "names the damaged file: {line}");
    t.wait_for_line("copied the primary again");
    wait_caught_up(&nodes, leader, r);
    holds_exactly(&nodes, r, &acked);
    holds_exactly(&nodes, leader, &acked);

    // Its log, set aside as it was; and it follows on.
    let folders = damaged_folders(&data);
    assert_eq!(folders.len(), 1, "{folders:?}");
    assert_eq!(std::fs::read(folders[0].join(&seg)).unwrap(), rotten);
    acked.extend(acked_puts(&nodes, "after", 5));
    wait_caught_up(&nodes, leader, r);
    holds_exactly(&nodes, r, &acked);
}

#[test]
fn a_replica_that_set_its_log_aside_never_leads_before_it_copied_a_primary() {
    let etcd = Etcd::start();
    let mut nodes = Nodes::start(&etcd, 3, &[]);
    let leader = nodes.wait_leader();
    let r = (leader + 1) % 3;
    let data = nodes.nodes[r].tarq.as_ref().unwrap().path("data");
    let acked = acked_puts(&nodes, "task", 30);
    wait_caught_up(&nodes, leader, r);
    // Every node down; r's log rots; r comes back alone, with nothing to copy from.
    for i in 0..3 {
        nodes.kill(i);
    }
    rot_wal(&data);
    nodes.start_node(r);
    let t = nodes.nodes[r].tarq.as_mut().unwrap();
    t.wait_for_line("moved it aside and copying the primary again");
    let line = t.wait_for_line("won an election: resigning");
    assert!(line.contains("damaged log aside"), "{line}");
    let o = nodes.overview(r).expect("r answers");
    assert_eq!(str_field(&o, "role"), "replica", "{o:?}");
    let put = Blocking::connect_addr(nodes.nodes[r].addr, WAIT)
        .expect("connect")
        .call("queue.put", &pack_args(&[Value::from("x")]), None);
    assert!(put.is_err(), "r takes no change: {put:?}");
    assert_eq!(total(nodes.nodes[r].addr), 0);

    // The nodes that hold the data return: one leads, r copies it and holds it all.
    for i in (0..3).filter(|&i| i != r) {
        nodes.start_node(i);
    }
    let leader = nodes.wait_leader();
    assert_ne!(leader, r);
    nodes.nodes[r]
        .tarq
        .as_mut()
        .unwrap()
        .wait_for_line("copied the primary again");
    wait_caught_up(&nodes, leader, r);
    holds_exactly(&nodes, r, &acked);
}
