//! A real full disk under the real `tarq` binary and real clients: the data directory is a
//! small tmpfs the test mounts (CI runs as root) and fills with a file of its own. Every change
//! that meets the full disk is answered at once with "WAL write failed: No space left on
//! device" — a seed put, a tube put, a `put_many`, an ack, a release, a beanstalk put
//! (`OUT_OF_MEMORY`) — none hangs (each answer must come within `PROMPT`); takes, peeks and
//! stats answer, `queue.stats()` and `/metrics` show `wal_disk_full` and the refusals; once
//! the filler is removed tarq writes again by itself (no restart, no operator), and after a
//! restart every put whose reply said OK is there, and no put that was refused. A replica
//! whose disk fills applies none of its primary's turns it cannot log, and catches up from
//! its own position once there is room.
//!
//! Where mounting is not allowed, the same flow runs under a file size limit instead
//! (`RLIMIT_FSIZE`, set with `prlimit` on a `tarq` that ignores SIGXFSZ, as a shell `trap`
//! leaves it): below a WAL segment's header, so no room can be allocated ("File too large")
//! until the test raises the limit of the running process. That variant also runs on its own,
//! so CI covers it too. Where neither works the test fails and says why: a test that skips
//! itself proves nothing.

#[path = "support/beanstalk.rs"]
mod beanstalk;
mod support;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use beanstalk::Bs;
use rmpv::Value;
use support::{field, http_get, id_of, Tarq, WAIT};
use tarq_client::{pack_args, Client, ClientError};

/// The tmpfs: room for a few segments' worth of puts once the filler is gone.
const TMPFS_BYTES: u64 = 8 << 20;
/// Left free beside the filler: the WAL's first segment with its reserve for takes (1 MiB)
/// and a few hundred puts fit, then the disk is full.
const LEFT_FREE: u64 = 1536 << 10;
/// Payload per put: a few hundred fill the space left.
const PAYLOAD: usize = 2048;
/// Puts tried before the disk must have filled (more than fit).
const MAX_PUTS: usize = 2 * (LEFT_FREE as usize / PAYLOAD) + 100;
/// The longest any request may take to be answered while the disk is full: a refusal is
/// immediate, so this only absorbs a loaded machine; a request that waits for room (until the
/// test makes some, after this) fails the test.
const PROMPT: Duration = Duration::from_secs(5);
/// The tube the tube-API calls use.
const TUBE: &str = "jobs";

/// A tmpfs mounted at a path, unmounted on drop.
struct Tmpfs(PathBuf);

impl Tmpfs {
    fn mount(at: &Path) -> Result<Tmpfs, String> {
        std::fs::create_dir_all(at).map_err(|e| format!("creating {}: {e}", at.display()))?;
        let out = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={TMPFS_BYTES}"), "tmpfs"])
            .arg(at)
            .output()
            .map_err(|e| format!("running mount: {e}"))?;
        if !out.status.success() {
            return Err(format!(
                "mount -t tmpfs failed ({}): {}",
                out.status,
                String::from_utf8_lossy(&out.stderr).trim()
            ));
        }
        Ok(Tmpfs(at.to_owned()))
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).status();
    }
}

/// A client whose every answer must come within [`PROMPT`].
fn client(addr: std::net::SocketAddr) -> Client {
    Client::connect_addr(addr, PROMPT).expect("connects")
}

/// `function(args)`: the reply, or the server's refusal; a reply not within `PROMPT` (the
/// request waits for room) or a broken connection fails the test.
fn call(c: &mut Client, function: &str, args: &[Value]) -> Result<Vec<Value>, String> {
    let sent = Instant::now();
    match c.call(function, &pack_args(args), None) {
        Ok(v) => Ok(v),
        Err(ClientError::Server { message, .. }) => Err(message),
        Err(e) => panic!(
            "{function} got no answer after {:?} (it waits for room?): {e}",
            sent.elapsed()
        ),
    }
}

fn put(c: &mut Client, payload: &str) -> Result<u64, String> {
    call(c, "queue.put", &[Value::from(payload)]).map(|v| id_of(&v[0]))
}

fn tube_put(c: &mut Client, payload: &str) -> Result<u64, String> {
    call(
        c,
        &format!("queue.tube.{TUBE}:put"),
        &[Value::from(payload)],
    )
    .map(|v| v[0][0].as_u64().expect("a task tuple"))
}

/// Fills the disk up to `LEFT_FREE` bytes free with a file of the test's own.
fn fill(dir: &Path) -> PathBuf {
    let filler = dir.join("filler");
    let bytes = vec![0xA5u8; (TMPFS_BYTES - LEFT_FREE) as usize];
    std::fs::write(&filler, bytes).expect("the filler fits the tmpfs");
    filler
}

/// How the disk fills and how space comes back.
enum Disk {
    /// A tmpfs with the test's filler file: removing it makes room.
    Tmpfs { filler: PathBuf, _mnt: Tmpfs },
    /// A file size limit on the process: raising it makes room.
    Rlimit,
}

/// Below a segment header (32 bytes) and above the lock file's pid line: no WAL room at all.
const FSIZE_LIMIT: u64 = 16;

impl Disk {
    /// The tmpfs if it can be mounted, else the file size limit, else the test fails.
    fn any(data: &Path) -> Disk {
        match Tmpfs::mount(data) {
            Ok(mnt) => Disk::Tmpfs {
                filler: fill(data),
                _mnt: mnt,
            },
            Err(why) => {
                if let Err(e) = support::tool("prlimit") {
                    panic!(
                        "the full-disk test needs a filesystem that fills up: mounting a tmpfs \
                         failed ({why}) and the fallback needs prlimit ({e})"
                    );
                }
                eprintln!("mounting a tmpfs failed ({why}): limiting the file size instead");
                Disk::Rlimit
            }
        }
    }

    fn full_message(&self) -> &'static str {
        match self {
            Disk::Tmpfs { .. } => "WAL write failed: No space left on device",
            Disk::Rlimit => "WAL write failed: File too large",
        }
    }

    /// Starts the `tarq` that meets the full disk, on `outer/data`, with a beanstalk port and
    /// `/metrics`; returns it and its beanstalk address.
    fn start(&self, outer: tempfile::TempDir) -> (Tarq, std::net::SocketAddr) {
        let args = [
            "--log-level",
            "info",
            "--wal-mode",
            "fsync",
            "--beanstalk-listen",
            "127.0.0.1:0",
            "--metrics-listen",
            "127.0.0.1:0",
        ];
        let mut tarq = match self {
            Disk::Tmpfs { .. } => Tarq::start_in(outer, &args),
            Disk::Rlimit => {
                let data = outer.path().join("data");
                let mut all = vec!["--listen", "127.0.0.1:0", "--data-dir"];
                all.push(data.to_str().expect("utf-8 path"));
                all.extend_from_slice(&args);
                let script = format!(
                    "trap '' XFSZ; exec prlimit --fsize={FSIZE_LIMIT}:unlimited \"$0\" \"$@\""
                );
                let mut cmd = Command::new("sh");
                cmd.arg("-c").arg(script).arg(support::BIN).args(&all);
                Tarq::spawn_cmd(outer, cmd)
            }
        };
        let line = tarq.wait_for_line("serving the beanstalk protocol");
        let bs = support::addr_in(&line, "listen=").expect("the beanstalk address");
        (tarq, bs)
    }

    fn make_room(&self, tarq: &Tarq) {
        match self {
            Disk::Tmpfs { filler, .. } => std::fs::remove_file(filler).expect("filler removed"),
            Disk::Rlimit => {
                let out = Command::new("prlimit")
                    .arg("--pid")
                    .arg(tarq.proc.id().to_string())
                    .arg("--fsize=unlimited:unlimited")
                    .output()
                    .expect("prlimit runs");
                assert!(out.status.success(), "prlimit: {out:?}");
            }
        }
    }
}

/// id → payload of every task acknowledged as put (and not acked since).
type Acked = BTreeMap<u64, String>;

/// Some tasks put before the disk is full, for the file size variant (its limit leaves no
/// room for the WAL, so they are put by an unlimited `tarq` first): the tube with one task,
/// and `n` in `default`.
fn put_before(outer: tempfile::TempDir, n: usize) -> (tempfile::TempDir, Acked, Acked) {
    let mut tarq = Tarq::start_in(outer, &["--log-level", "info"]);
    let mut c = client(tarq.addr);
    let tube = tube_with_a_task(&mut c);
    let acked = (0..n)
        .map(|i| {
            let payload = format!("before {i}");
            (put(&mut c, &payload).expect("room"), payload)
        })
        .collect();
    tarq.signal("TERM");
    assert!(tarq.wait_exit().success(), "a clean stop");
    (tarq.take_dir(), acked, tube)
}

/// Creates the tube and puts one task in it.
fn tube_with_a_task(c: &mut Client) -> Acked {
    create_tube(c);
    let id = tube_put(c, "in the tube before").expect("room");
    BTreeMap::from([(id, "in the tube before".to_owned())])
}

fn create_tube(c: &mut Client) {
    call(
        c,
        "queue.create_tube",
        &[
            Value::from(TUBE),
            Value::from("fifo"),
            support::map(&[("if_not_exists", Value::from(true))]),
        ],
    )
    .expect("the tube is created");
}

#[test]
fn a_full_disk_refuses_every_change_at_once_serves_takes_and_recovers_by_itself() {
    let outer = tempfile::tempdir().expect("tempdir");
    let disk = Disk::any(&outer.path().join("data"));
    full_disk_flow(outer, disk);
}

#[test]
fn a_file_size_limit_refuses_every_change_at_once_serves_takes_and_recovers_by_itself() {
    support::tool("prlimit").unwrap_or_else(|e| panic!("this test needs prlimit: {e}"));
    full_disk_flow(tempfile::tempdir().expect("tempdir"), Disk::Rlimit);
}

fn full_disk_flow(outer: tempfile::TempDir, disk: Disk) {
    let (outer, mut acked, mut tube_acked) = match disk {
        Disk::Rlimit => put_before(outer, 20),
        Disk::Tmpfs { .. } => (outer, BTreeMap::new(), BTreeMap::new()),
    };
    let (mut tarq, bs_addr) = disk.start(outer);
    let full = disk.full_message();
    let mut c = client(tarq.addr);

    // Puts until the disk is full: each answered at once, OK or refused.
    let mut filled = None;
    if let Disk::Tmpfs { .. } = disk {
        tube_acked = tube_with_a_task(&mut c);
        let pad = "d".repeat(PAYLOAD);
        for i in 0..MAX_PUTS {
            let payload = format!("{i} {pad}");
            match put(&mut c, &payload) {
                Ok(id) => {
                    acked.insert(id, payload);
                }
                Err(message) => {
                    filled = Some(message);
                    break;
                }
            }
        }
        assert!(
            acked.len() > 10,
            "puts fit before the disk filled: {}",
            acked.len()
        );
    } else {
        filled = put(&mut c, "refused under the limit").err();
    }
    assert_eq!(filled.as_deref(), Some(full), "the disk filled");

    // While full, every change is refused at once, with the reason.
    let taken = call(&mut c, "queue.take", &[Value::from(0)]).expect("a take goes on");
    assert_eq!(field(&taken[0], "status").as_str(), Some("T"));
    let taken_id = id_of(&taken[0]);
    assert!(
        acked.contains_key(&taken_id),
        "the take returned an acknowledged task"
    );
    let refusals = [
        put(&mut c, "refused").map(|_| ()),
        tube_put(&mut c, "refused in the tube").map(|_| ()),
        call(
            &mut c,
            &format!("queue.tube.{TUBE}:put_many"),
            &[Value::Array(vec![Value::from("refused in a batch")])],
        )
        .map(|_| ()),
        call(&mut c, "queue.ack", &[Value::from(taken_id)]).map(|_| ()),
        call(&mut c, "queue.release", &[Value::from(taken_id)]).map(|_| ()),
    ];
    for r in refusals {
        assert_eq!(r.err().as_deref(), Some(full));
    }
    let mut bs = Bs::connect(bs_addr);
    let answer = bs
        .recv_after_put(b"refused over beanstalk")
        .expect("a beanstalk put is answered at once");
    assert_eq!(answer, "OUT_OF_MEMORY");

    // Takes, peeks and stats answer, and say the disk is full.
    let (&in_tube, payload) = tube_acked.iter().next().expect("a task in the tube");
    let peek = call(
        &mut c,
        &format!("queue.tube.{TUBE}:peek"),
        &[Value::from(in_tube)],
    )
    .expect("a peek answers");
    assert_eq!(peek[0][2].as_str(), Some(payload.as_str()), "{peek:?}");
    let stats = call(&mut c, "queue.stats", &[]).expect("stats answer");
    assert_eq!(
        field(&stats[0], "wal_disk_full").as_u64(),
        Some(1),
        "{}",
        stats[0]
    );
    let refused = field(&stats[0], "wal_refusals").as_u64().unwrap();
    assert!(refused >= 7, "every refusal counted: {}", stats[0]);
    let metrics = tarq.metrics.expect("the metrics address");
    let (code, page) = http_get(metrics, "/metrics");
    assert_eq!(code, 200);
    assert!(page.lines().any(|l| l == "tarq_wal_disk_full 1"), "{page}");
    assert!(page.contains("tarq_wal_refusals_total "), "{page}");

    // Space comes back: tarq notices by itself (no request asks) and accepts changes again.
    let from = tarq.log().len();
    disk.make_room(&tarq);
    tarq.wait_for_line_after(from, "the WAL has room again: accepting changes");
    let first_after = put(&mut c, "after 0").expect("room again");
    acked.insert(first_after, "after 0".into());
    for i in 1..10 {
        let payload = format!("after {i}");
        acked.insert(put(&mut c, &payload).expect("room again"), payload);
    }
    let id = tube_put(&mut c, "in the tube after").expect("room again");
    tube_acked.insert(id, "in the tube after".into());
    call(&mut c, "queue.ack", &[Value::from(taken_id)]).expect("the ack goes through now");
    acked.remove(&taken_id);
    let stats = call(&mut c, "queue.stats", &[]).expect("stats answer");
    assert_eq!(
        field(&stats[0], "wal_disk_full").as_u64(),
        Some(0),
        "{}",
        stats[0]
    );
    drop(bs);

    // A clean stop and a restart on the same (still mounted) directory: every acknowledged
    // put is there, with its payload, and nothing else.
    tarq.signal("TERM");
    assert!(tarq.wait_exit().success(), "a clean stop");
    let (found, found_tube) = drain_after_restart(tarq.take_dir());
    assert_eq!(
        found.len(),
        acked.len(),
        "every acknowledged put, and only those"
    );
    assert!(found == acked, "payloads as acknowledged");
    assert_eq!(
        found_tube, tube_acked,
        "the tube holds its acknowledged put only"
    );
    drop(c);
}

impl Bs {
    /// Sends a beanstalk `put` and returns the first word of its answer within `PROMPT`.
    fn recv_after_put(&mut self, body: &[u8]) -> Result<String, std::io::Error> {
        self.send(&tarq_beanstalk::Command::Put {
            pri: 0,
            delay: 0,
            ttr: 60,
            body,
        })?;
        match self.recv_within(PROMPT)? {
            Some(a) => Ok(a.word().to_owned()),
            None => Err(std::io::ErrorKind::UnexpectedEof.into()),
        }
    }
}

/// Restarts tarq on `dir` and takes everything it holds, from `default` and from the tube:
/// id → payload, each task once.
fn drain_after_restart(dir: tempfile::TempDir) -> (Acked, Acked) {
    let tarq = Tarq::start_in(dir, &["--log-level", "info"]);
    let mut c = Client::connect_addr(tarq.addr, WAIT).expect("connects");
    let mut found = BTreeMap::new();
    loop {
        let r = call(&mut c, "queue.take", &[Value::from(0)]).expect("take");
        let Some(t) = r.first().filter(|t| !t.is_nil()) else {
            break;
        };
        let data = field(t, "data")
            .as_str()
            .expect("string payload")
            .to_owned();
        assert!(found.insert(id_of(t), data).is_none(), "each task once");
    }
    let mut tube = BTreeMap::new();
    loop {
        let r = call(
            &mut c,
            &format!("queue.tube.{TUBE}:take"),
            &[Value::from(0)],
        )
        .expect("take from the tube");
        let Some(t) = r
            .first()
            .filter(|t| t.as_array().is_some_and(|a| !a.is_empty()))
        else {
            break;
        };
        let id = t[0].as_u64().expect("an id");
        let data = t[2].as_str().expect("string payload").to_owned();
        assert!(tube.insert(id, data).is_none(), "each task once");
    }
    (found, tube)
}

/// A figure of `queue.stats()` at `c`.
fn stat(c: &mut Client, name: &str) -> u64 {
    let stats = call(c, "queue.stats", &[]).expect("stats answer");
    field(&stats[0], name).as_u64().unwrap_or(0)
}

#[test]
fn a_replica_on_a_full_disk_applies_nothing_it_cannot_log_and_catches_up_once_there_is_room() {
    let outer = tempfile::tempdir().expect("tempdir");
    let data = outer.path().join("data");
    let mnt = Tmpfs::mount(&data).unwrap_or_else(|why| panic!("this test needs a tmpfs: {why}"));
    let filler = fill(&data);
    let primary = Tarq::start(&["--log-level", "info"]);
    let mut p = client(primary.addr);
    let paddr = primary.addr.to_string();
    let mut replica = Tarq::start_in(
        outer,
        &[
            "--replica-of",
            &paddr,
            "--wal-mode",
            "write",
            "--log-level",
            "info",
        ],
    );
    let mut r = Client::connect_addr(replica.addr, WAIT).expect("connects");
    support::wait_until("the replica streams", || {
        stat(&mut r, "replication_connected") == 1
    });
    let joins = stat(&mut r, "replication_joins");

    // More than the replica's disk holds: the primary takes them all.
    let pad = "r".repeat(PAYLOAD);
    let n = 2 * LEFT_FREE as usize / PAYLOAD;
    for i in 0..n {
        put(&mut p, &format!("{i} {pad}")).expect("the primary has room");
    }
    support::wait_until("the replica's disk is full", || {
        stat(&mut r, "wal_disk_full") == 1
    });
    let behind = stat(&mut r, "last_id");
    assert!(
        behind < n as u64,
        "the replica stopped applying: {behind} of {n}"
    );
    assert!(
        stat(&mut r, "wal_refusals") > 0,
        "the primary's turns were refused"
    );

    // Room again: the replica resumes from its position and holds every task, logged.
    std::fs::remove_file(&filler).expect("filler removed");
    support::wait_until("the replica caught up", || {
        stat(&mut r, "last_id") == n as u64 && stat(&mut r, "total") == n as u64
    });
    assert_eq!(stat(&mut r, "wal_disk_full"), 0);
    assert_eq!(
        stat(&mut r, "replication_joins"),
        joins,
        "it resumed from its own position, without a join"
    );
    drop(r);
    replica.signal("TERM");
    assert!(replica.wait_exit().success(), "a clean stop");
    let dir = replica.take_dir();
    let replica = Tarq::start_in(dir, &["--log-level", "info"]);
    let mut r = client(replica.addr);
    assert_eq!(stat(&mut r, "total"), n as u64, "every task was in its WAL");
    drop(mnt);
}
