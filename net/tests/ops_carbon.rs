//! Graphite for real: a carbon-cache (Debian's graphite-carbon) configured in a temporary
//! directory with its own storage and ports on 127.0.0.1, a running `tarq` pushing to it, and
//! what carbon stored read back from its whisper files with `whisper-fetch`. A missing tool fails
//! the test, naming it (`bash .ci/test` installs them).

mod support;

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use rmpv::Value;
use support::*;

/// carbon-cache is Python and Twisted: its start takes a second or two, more on a busy machine.
const CARBON_WAIT: Duration = Duration::from_secs(60);

/// A carbon-cache in the foreground, killed on drop, its stdout read line by line.
struct Carbon {
    _proc: Proc,
    lines: Lines,
}

impl Carbon {
    /// The next line carbon writes that contains `needle`.
    fn wait_for(&mut self, needle: &str) -> String {
        self.lines.wait_for_new(needle, CARBON_WAIT)
    }
}

/// A carbon-cache with its config in `dir`, and its line receiver's port, held for it: carbon
/// reads port 0 as "no line receiver", so it cannot bind port 0 and say which it got.
fn start_carbon(carbon: &Path, dir: &Path) -> (Carbon, Refusing) {
    let port = Refusing::reserve();
    let mut c = spawn_carbon(carbon, dir, port.addr.port());
    c.wait_for(&format!(
        "CarbonReceiverFactory starting on {}",
        port.addr.port()
    ));
    (c, port)
}

/// Writes carbon's config into `dir` and starts it with its line receiver on `port`, no
/// pickle receiver, and its cache query port on port 0 (unused here).
fn spawn_carbon(carbon: &Path, dir: &Path, port: u16) -> Carbon {
    let storage = dir.join("storage");
    for d in ["storage/whisper", "storage/lists", "log", "pid"] {
        std::fs::create_dir_all(dir.join(d)).unwrap();
    }
    let conf = format!(
        "[cache]\n\
         STORAGE_DIR = {storage}\n\
         LOCAL_DATA_DIR = {storage}/whisper\n\
         WHITELISTS_DIR = {storage}/lists\n\
         CONF_DIR = {dir}\n\
         LOG_DIR = {dir}/log\n\
         PID_DIR = {dir}/pid\n\
         USER =\n\
         ENABLE_TAGS = False\n\
         MAX_CACHE_SIZE = inf\n\
         MAX_UPDATES_PER_SECOND = inf\n\
         MAX_CREATES_PER_MINUTE = inf\n\
         LINE_RECEIVER_INTERFACE = 127.0.0.1\n\
         LINE_RECEIVER_PORT = {port}\n\
         ENABLE_UDP_LISTENER = False\n\
         PICKLE_RECEIVER_INTERFACE = 127.0.0.1\n\
         PICKLE_RECEIVER_PORT = 0\n\
         CACHE_QUERY_INTERFACE = 127.0.0.1\n\
         CACHE_QUERY_PORT = 0\n\
         LOG_UPDATES = True\n\
         LOG_CREATES = True\n\
         WHISPER_AUTOFLUSH = True\n",
        storage = storage.display(),
        dir = dir.display(),
    );
    std::fs::write(dir.join("carbon.conf"), conf).unwrap();
    // One-second points kept for an hour: every push of tarq lands in its own slot.
    std::fs::write(
        dir.join("storage-schemas.conf"),
        "[tarq]\npattern = .*\nretentions = 1s:1h\n",
    )
    .unwrap();
    let mut proc = Proc::spawn(
        Command::new(carbon)
            .arg(format!("--config={}", dir.join("carbon.conf").display()))
            .arg(format!(
                "--pidfile={}",
                dir.join("pid/carbon.pid").display()
            ))
            .args(["--debug", "start"])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null()),
    );
    let lines = Lines::read(proc.0.stdout.take().unwrap());
    Carbon { _proc: proc, lines }
}

/// The non-null points of a whisper file since `from`, as (unix seconds, value).
fn whisper_points(fetch: &Path, file: &Path, from: u64) -> Vec<(u64, f64)> {
    let out = Command::new(fetch)
        .arg(format!("--from={from}"))
        .arg(file)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "whisper-fetch {}: {}",
        file.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| {
            let (t, v) = l.split_once(char::is_whitespace)?;
            Some((t.trim().parse().ok()?, v.trim().parse().ok()?))
        })
        .collect()
}

#[test]
fn carbon_cache_stores_what_tarq_pushes() {
    let carbon = prerequisite(
        "carbon-cache (Debian package graphite-carbon)",
        tool("carbon-cache"),
    );
    let fetch = prerequisite(
        "whisper-fetch (Debian package python3-whisper)",
        tool("whisper-fetch"),
    );
    let dir = tempfile::tempdir().unwrap();
    let (mut carbon, line_port) = start_carbon(&carbon, dir.path());
    let port = line_port.addr.port();
    let started = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs();

    let target = format!("tcp://127.0.0.1:{port}");
    let t = Tarq::start(&["--graphite", &target, "--graphite-interval", "0.2"]);
    let mut c = Client::connect(t.addr);
    for i in 0..3 {
        c.call("queue.put", &[Value::from(i)]).one();
    }
    c.call("queue.take", &[]).one();

    // carbon logs each write (LOG_UPDATES); then the whisper file holds the points.
    carbon.wait_for("datapoints for queue.stats.taken");
    let whisper = dir.path().join("storage/whisper/queue/stats");
    let deadline = Instant::now() + CARBON_WAIT;
    let expect = [
        ("puts", 3.0),
        ("total", 3.0),
        ("taken", 1.0),
        ("ready", 2.0),
    ];
    loop {
        let stored: Vec<(&str, bool)> = expect
            .iter()
            .map(|&(name, want)| {
                let file = whisper.join(format!("{name}.wsp"));
                let ok = file.exists()
                    && whisper_points(&fetch, &file, started - 1)
                        .iter()
                        .any(|&(ts, v)| v == want && ts + 1 >= started);
                (name, ok)
            })
            .collect();
        if stored.iter().all(|&(_, ok)| ok) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "carbon did not store {stored:?} within {CARBON_WAIT:?}; its log:\n{}",
            carbon.lines.log.join("\n")
        );
        // New points arrive every 0.2 s; the next carbon write is the event to wait for.
        carbon.wait_for("datapoints for queue.stats.");
    }
    // Every figure got its own series, named queue.stats.<name>.
    let uptime = whisper.join("uptime_seconds.wsp");
    assert!(uptime.exists(), "no {}", uptime.display());
}
