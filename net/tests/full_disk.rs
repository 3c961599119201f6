//! A real full disk under the real `tarq` binary and a real client: the data directory is a
//! small tmpfs the test mounts (CI runs as root) and fills with a file of its own. While full,
//! puts get "WAL write failed: No space left on device", takes go on; once the filler is
//! removed tarq writes again by itself (no restart, no operator), and after a restart every
//! put whose reply said OK is there, and no put that was refused.
//!
//! Where mounting is not allowed, the same flow runs under a file size limit instead
//! (`RLIMIT_FSIZE`, set with `prlimit` on a `tarq` that ignores SIGXFSZ, as a shell `trap`
//! leaves it): below a WAL segment's header, so every write fails with "File too large" until
//! the test raises the limit of the running process. That variant also runs on its own, so CI
//! covers it too. Where neither works the test fails and says why: a test that skips itself
//! proves nothing.

mod support;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use rmpv::Value;
use support::{field, id_of, Tarq, WAIT};
use tarq_client::{pack_args, ClientError};

/// The tmpfs: room for a few segments' worth of puts once the filler is gone.
const TMPFS_BYTES: u64 = 8 << 20;
/// Left free beside the filler: the first segment and some puts fit, then the disk is full.
const LEFT_FREE: u64 = 192 << 10;
/// Payload per put: a few hundred fill the space left.
const PAYLOAD: usize = 2048;
/// Puts tried before the disk must have filled (more than fit).
const MAX_PUTS: usize = 2 * (LEFT_FREE as usize / PAYLOAD) + 100;

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

fn put(c: &mut tarq_client::Client, payload: &str) -> Result<u64, String> {
    match c.call("queue.put", &pack_args(&[Value::from(payload)]), None) {
        Ok(v) => Ok(id_of(&v[0])),
        Err(ClientError::Server { message, .. }) => Err(message),
        Err(e) => panic!("the connection broke: {e}"),
    }
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

/// Below a segment header (32 bytes) and above the lock file's pid line: every WAL write fails.
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

    fn is_full_message(&self, m: &str) -> bool {
        match self {
            Disk::Tmpfs { .. } => m.contains("WAL write failed: No space left on device"),
            Disk::Rlimit => m.contains("WAL write failed: File too large"),
        }
    }

    /// Starts the `tarq` that meets the full disk, on `outer/data`.
    fn start(&self, outer: tempfile::TempDir) -> Tarq {
        let args = ["--log-level", "info", "--wal-mode", "fsync"];
        match self {
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
        }
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

/// Some tasks put before the disk is full, for the file size variant (its limit fails every
/// write, so they are put by an unlimited `tarq` first).
fn put_before(outer: tempfile::TempDir, n: usize) -> (tempfile::TempDir, BTreeMap<u64, String>) {
    let mut tarq = Tarq::start_in(outer, &["--log-level", "info"]);
    let mut c = tarq_client::Client::connect_addr(tarq.addr, WAIT).expect("connects");
    let acked = (0..n)
        .map(|i| {
            let payload = format!("before {i}");
            (put(&mut c, &payload).expect("room"), payload)
        })
        .collect();
    tarq.signal("TERM");
    assert!(tarq.wait_exit().success(), "a clean stop");
    (tarq.take_dir(), acked)
}

#[test]
fn a_full_disk_refuses_puts_serves_takes_and_recovers_by_itself() {
    let outer = tempfile::tempdir().expect("tempdir");
    let disk = Disk::any(&outer.path().join("data"));
    full_disk_flow(outer, disk);
}

#[test]
fn a_file_size_limit_refuses_puts_serves_takes_and_recovers_by_itself() {
    support::tool("prlimit").unwrap_or_else(|e| panic!("this test needs prlimit: {e}"));
    full_disk_flow(tempfile::tempdir().expect("tempdir"), Disk::Rlimit);
}

fn full_disk_flow(outer: tempfile::TempDir, disk: Disk) {
    let (outer, before) = match disk {
        Disk::Rlimit => put_before(outer, 20),
        Disk::Tmpfs { .. } => (outer, BTreeMap::new()),
    };
    let mut tarq = disk.start(outer);

    let full = Arc::new(AtomicBool::new(false));
    let producer = produce_until_full(tarq.addr, full.clone());
    tarq.wait_for_line("WAL write failed");
    full.store(true, Ordering::SeqCst);
    let (mut c, taken_id) = refuse_put_serve_take(&tarq, &disk);

    // Space comes back: tarq notices by itself and accepts changes again.
    let from = tarq.log().len();
    disk.make_room(&tarq);
    tarq.wait_for_line_after(from, "WAL writes succeed again");
    let (mut acked, refused) = producer.join().expect("the producer ends");
    assert!(
        acked.len() < MAX_PUTS,
        "the disk filled before the producer ran out of puts"
    );
    if let Some(message) = refused {
        assert!(disk.is_full_message(&message), "{message}");
    }
    acked.extend(before);
    assert!(
        acked.contains_key(&taken_id),
        "the take returned an acknowledged task"
    );
    for i in 0..10 {
        let payload = format!("after {i}");
        let id = put(&mut c, &payload).expect("puts succeed once there is room");
        acked.insert(id, payload);
    }

    // A clean stop and a restart on the same (still mounted) directory: every acknowledged
    // put is there, with its payload, and nothing else.
    tarq.signal("TERM");
    assert!(tarq.wait_exit().success(), "a clean stop");
    let found = drain_after_restart(tarq.take_dir());
    assert_eq!(
        found.len(),
        acked.len(),
        "every acknowledged put, and only those"
    );
    assert!(found == acked, "payloads as acknowledged");
    drop(c);
}

/// What a producer thread returns: the puts it saw acknowledged (id → payload) and the
/// refusal that stopped it, if one did.
type Produced = (BTreeMap<u64, String>, Option<String>);

/// A producer that puts until its put meets the full disk (or `full` is raised). That put's
/// turn already changed the queue when its write failed, so its reply waits for the retry that
/// writes it; the producer blocks there until space comes back.
fn produce_until_full(
    addr: std::net::SocketAddr,
    full: Arc<AtomicBool>,
) -> std::thread::JoinHandle<Produced> {
    std::thread::spawn(move || {
        let mut c = tarq_client::Client::connect_addr(addr, WAIT).expect("connects");
        let mut acked: BTreeMap<u64, String> = BTreeMap::new();
        let pad = "d".repeat(PAYLOAD);
        for i in 0..MAX_PUTS {
            if full.load(Ordering::SeqCst) {
                return (acked, None);
            }
            let payload = format!("{i} {pad}");
            match put(&mut c, &payload) {
                Ok(id) => {
                    acked.insert(id, payload);
                }
                Err(message) => return (acked, Some(message)),
            }
        }
        (acked, None)
    })
}

/// While the disk is full: another client's put is refused before it changes anything, and a
/// take is served from what is in memory. Returns that client and the id it took.
fn refuse_put_serve_take(tarq: &Tarq, disk: &Disk) -> (tarq_client::Client, u64) {
    let mut c = tarq_client::Client::connect_addr(tarq.addr, WAIT).expect("connects");
    let refusal = put(&mut c, "refused").expect_err("the disk is full");
    assert!(disk.is_full_message(&refusal), "a clear error: {refusal}");
    let taken = c
        .call("queue.take", &pack_args(&[Value::from(0)]), None)
        .expect("a take goes on while the disk is full");
    assert_eq!(field(&taken[0], "status").as_str(), Some("T"));
    let taken_id = id_of(&taken[0]);
    (c, taken_id)
}

/// Restarts tarq on `dir` and takes everything it holds: id → payload, each task once.
fn drain_after_restart(dir: tempfile::TempDir) -> BTreeMap<u64, String> {
    let tarq = Tarq::start_in(dir, &["--log-level", "info"]);
    let mut c = tarq_client::Client::connect_addr(tarq.addr, WAIT).expect("connects");
    let mut found: BTreeMap<u64, String> = BTreeMap::new();
    loop {
        let r = c
            .call("queue.take", &pack_args(&[Value::from(0)]), None)
            .expect("take");
        let Some(t) = r.first().filter(|t| !t.is_nil()) else {
            break;
        };
        let data = field(t, "data")
            .as_str()
            .expect("string payload")
            .to_owned();
        assert!(found.insert(id_of(t), data).is_none(), "each task once");
    }
    found
}
