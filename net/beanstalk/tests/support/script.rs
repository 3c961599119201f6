//! Raw-socket byte scripts for differential testing against beanstalkd and tarq: the script
//! format, a player that sends each script's bytes to a server and writes a normalised
//! transcript of the replies (ids, times and process facts replaced by placeholders), and a
//! real-beanstalkd launcher. Shared by `tests/differential.rs`, `tests/script_decode.rs` and
//! `examples/play.rs`, and by tarq's beanstalk-port tests, which include it with `#[path]`
//! (`net/tests/support/beanstalk.rs`) so both servers are judged by the same code.
//!
//! Script lines (`#` starts a comment; `C` is an optional connection digit, default 0; a
//! connection opens on first use):
//! - `C> TEXT`: send TEXT, with escapes `\r \n \t \0 \\ \$ \xHH` and `$N` for the N-th job id
//!   seen in replies (1-based, all connections);
//! - `C>* COUNT TEXT`: send TEXT repeated COUNT times;
//! - `C< N`: read N replies; `C< eof`: expect the server to close the connection.
//!
//! At the end each connection is half-closed and read to EOF, so a surplus reply shows.
//!
//! Normalisation: job ids read `$1`, `$2` in order of first appearance; facts of the process
//! (pid, version, rusage, uptime, binlog, host) are `*`; a time that moves while the script
//! runs is shown by its bound (`time-left: <=ttr`, `pause-time-left: <=pause`, `age: <=60`)
//! when it lies within it, else as it is; tube lists are sorted; keys beanstalkd does not write
//! are left out. Counters and every other value are compared as they are.
#![allow(dead_code)] // each test binary uses a different part

use std::collections::BTreeMap;
use std::io::{ErrorKind, Read, Write};
use std::net::{Shutdown, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use tarq_beanstalk::Reply;
use tarq_testkit::ports::listening_ports;

/// How long a step waits for its replies: far above any reply time of a local server, so a
/// timeout means a missing reply.
const REPLY_DEADLINE: Duration = Duration::from_secs(5);
/// Largest reply body the player accepts: above beanstalkd's default max job size and any
/// stats body.
const MAX_REPLY_BODY: usize = 1 << 20;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    Send {
        conn: u8,
        text: String,
        repeat: usize,
    },
    Recv {
        conn: u8,
        count: usize,
    },
    Eof {
        conn: u8,
    },
}

pub fn parse(script: &str) -> Result<Vec<Step>, String> {
    let mut steps = Vec::new();
    for (i, line) in script.lines().enumerate() {
        if line.trim().is_empty() || line.starts_with('#') {
            continue;
        }
        let bad = || format!("line {}: cannot read {line:?}", i + 1);
        let (conn, rest) = match line.as_bytes()[0] {
            d @ b'0'..=b'9' => (d - b'0', &line[1..]),
            _ => (0, line),
        };
        let step = if let Some(r) = rest.strip_prefix(">* ") {
            let (count, text) = r.split_once(' ').ok_or_else(bad)?;
            let repeat = count.parse().map_err(|_| bad())?;
            Step::Send {
                conn,
                text: text.to_string(),
                repeat,
            }
        } else if let Some(text) = rest.strip_prefix("> ") {
            Step::Send {
                conn,
                text: text.to_string(),
                repeat: 1,
            }
        } else if rest == "< eof" {
            Step::Eof { conn }
        } else if let Some(n) = rest.strip_prefix("< ") {
            Step::Recv {
                conn,
                count: n.parse().map_err(|_| bad())?,
            }
        } else {
            return Err(bad());
        };
        steps.push(step);
    }
    Ok(steps)
}

/// The bytes of a send: escapes resolved, `$N` replaced by `id(N)`.
pub fn expand(text: &str, id: &dyn Fn(usize) -> u64) -> Vec<u8> {
    let b = text.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        match (b[i], b.get(i + 1)) {
            (b'\\', Some(&c)) => {
                i += 2;
                match c {
                    b'r' => out.push(b'\r'),
                    b'n' => out.push(b'\n'),
                    b't' => out.push(b'\t'),
                    b'0' => out.push(0),
                    b'x' => {
                        let hex = std::str::from_utf8(&b[i..i + 2]).unwrap();
                        out.push(u8::from_str_radix(hex, 16).expect("\\xHH"));
                        i += 2;
                    }
                    other => out.push(other),
                }
            }
            (b'$', Some(c)) if c.is_ascii_digit() => {
                let n = b[i + 1..].iter().take_while(|c| c.is_ascii_digit()).count();
                let k: usize = text[i + 1..i + 1 + n].parse().unwrap();
                out.extend_from_slice(id(k).to_string().as_bytes());
                i += 1 + n;
            }
            (c, _) => {
                out.push(c);
                i += 1;
            }
        }
    }
    out
}

/// Each connection's client bytes in order, `$N` read as the number N (what a fresh
/// beanstalkd assigns when ids appear in order).
pub fn client_bytes(steps: &[Step]) -> BTreeMap<u8, Vec<u8>> {
    let mut out: BTreeMap<u8, Vec<u8>> = BTreeMap::new();
    for s in steps {
        if let Step::Send { conn, text, repeat } = s {
            let bytes = expand(text, &|k| k as u64);
            out.entry(*conn).or_default().extend(bytes.repeat(*repeat));
        }
    }
    out
}

/// Values that differ between runs or servers: shown as `*`.
const MASKED: [&str; 14] = [
    "pid",
    "version",
    "rusage-utime",
    "rusage-stime",
    "uptime",
    "hostname",
    "os",
    "platform",
    "binlog-oldest-index",
    "binlog-current-index",
    "binlog-records-migrated",
    "binlog-records-written",
    "binlog-max-size",
    "total-connections",
];

/// Longest a script may run, in seconds: a job's `age` is at most this.
const MAX_SCRIPT_SECS: u64 = 60;

/// Every key beanstalkd writes in a stats body: any other key (a server's own) is left out
/// of the transcript.
const KNOWN_KEYS: &str = "current-jobs-urgent current-jobs-ready current-jobs-reserved \
    current-jobs-delayed current-jobs-buried cmd-put cmd-peek cmd-peek-ready cmd-peek-delayed \
    cmd-peek-buried cmd-reserve cmd-reserve-with-timeout cmd-delete cmd-release cmd-use \
    cmd-watch cmd-ignore cmd-bury cmd-kick cmd-touch cmd-stats cmd-stats-job cmd-stats-tube \
    cmd-list-tubes cmd-list-tube-used cmd-list-tubes-watched cmd-pause-tube job-timeouts \
    total-jobs max-job-size current-tubes current-connections current-producers \
    current-workers current-waiting total-connections pid version rusage-utime rusage-stime \
    uptime binlog-oldest-index binlog-current-index binlog-records-migrated \
    binlog-records-written binlog-max-size draining id hostname os platform \
    tube state pri delay ttr time-left file reserves timeouts releases buries kicks age \
    name current-using current-watching pause pause-time-left";

/// Job ids in order of first appearance, so transcripts read `$1`, `$2` whatever the server's
/// numbering.
#[derive(Default)]
struct Ids(Vec<u64>);

impl Ids {
    fn name(&mut self, id: u64) -> String {
        let k = match self.0.iter().position(|&x| x == id) {
            Some(k) => k,
            None => {
                self.0.push(id);
                self.0.len() - 1
            }
        };
        format!("${}", k + 1)
    }

    fn get(&self, k: usize) -> u64 {
        // An id the script has not seen yet: one no server has handed out.
        self.0
            .get(k.wrapping_sub(1))
            .copied()
            .unwrap_or(u64::MAX - k as u64)
    }
}

fn escape(b: &[u8]) -> String {
    b.escape_ascii().to_string()
}

fn describe(reply: &Reply<'_>, ids: &mut Ids) -> Vec<String> {
    match *reply {
        Reply::Inserted { id } => vec![format!("INSERTED {}", ids.name(id))],
        Reply::BuriedId { id } => vec![format!("BURIED {}", ids.name(id))],
        Reply::Reserved { id, body } | Reply::Found { id, body } => {
            let word = if matches!(reply, Reply::Reserved { .. }) {
                "RESERVED"
            } else {
                "FOUND"
            };
            vec![format!(
                "{word} {} {} \"{}\"",
                ids.name(id),
                body.len(),
                escape(body)
            )]
        }
        Reply::Ok { yaml } => describe_yaml(yaml, ids),
        other => {
            let mut out = Vec::new();
            other.encode(&mut out);
            vec![escape(&out[..out.len() - 2])]
        }
    }
}

fn describe_yaml(yaml: &[u8], ids: &mut Ids) -> Vec<String> {
    let text = String::from_utf8_lossy(yaml);
    let mut lines = vec!["OK".to_string()];
    let mut list = Vec::new();
    let mut pairs = Vec::new();
    for line in text.split_inclusive('\n') {
        let Some(line) = line.strip_suffix('\n') else {
            lines.push(format!("  !! unterminated {line:?}"));
            continue;
        };
        if line == "---" {
            lines.push(format!("  {line}"));
        } else if let Some(name) = line.strip_prefix("- ") {
            list.push(format!("  - {name}"));
        } else if let Some((key, value)) = line.split_once(": ") {
            pairs.push((key, value));
        } else {
            lines.push(format!("  !! {line:?}"));
        }
    }
    let get = |key: &str| pairs.iter().find(|(k, _)| *k == key).map(|(_, v)| *v);
    // A `stats` body has a server `id` (random) beside `hostname`; a `stats-job` body's `id`
    // is a job id.
    let is_stats = get("hostname").is_some();
    for &(key, value) in &pairs {
        if !KNOWN_KEYS.split_whitespace().any(|k| k == key) {
            continue;
        }
        let value = if MASKED.contains(&key) || (key == "id" && is_stats) {
            "*".to_string()
        } else if key == "id" {
            value
                .parse()
                .map(|id| ids.name(id))
                .unwrap_or(value.to_string())
        } else if let Some(bound) = time_bound(key, &get) {
            within(value, bound)
        } else {
            value.to_string()
        };
        lines.push(format!("  {key}: {value}"));
    }
    // protocol.txt promises no order for tube lists.
    list.sort();
    lines.extend(list);
    lines
}

/// For a time in seconds that moves while a script runs, the key of the same body that bounds
/// it (its value, or a fixed bound): `time-left` counts down from `delay` while delayed and from
/// `ttr` while reserved, `pause-time-left` from `pause`, and `age` counts up from 0 for at most
/// the script's run. `None` for every other key, and for `time-left` in a state it does not
/// count in (beanstalkd writes 0 there, compared as is).
fn time_bound<'a>(key: &str, get: &dyn Fn(&str) -> Option<&'a str>) -> Option<(String, u64)> {
    let named = |name: &str| Some((name.to_string(), get(name)?.parse().ok()?));
    match (key, get("state")) {
        ("age", _) => Some((MAX_SCRIPT_SECS.to_string(), MAX_SCRIPT_SECS)),
        ("time-left", Some("delayed")) => named("delay"),
        ("time-left", Some("reserved")) => named("ttr"),
        ("pause-time-left", _) => named("pause"),
        _ => None,
    }
}

/// A moving time shown as `<=BOUND` when it lies in `0..=bound`, so the transcript is the same
/// from run to run and server to server yet a value in other units (ms) or counted the wrong
/// way still shows; anything else is shown as it is.
fn within(value: &str, (name, bound): (String, u64)) -> String {
    match value.parse::<u64>() {
        Ok(v) if v <= bound => format!("<={name}"),
        _ => value.to_string(),
    }
}

struct Conn {
    stream: TcpStream,
    buf: Vec<u8>,
}

impl Conn {
    /// Reads until one reply is whole: `Ok(None)` on EOF.
    fn reply(&mut self, ids: &mut Ids) -> Result<Option<Vec<String>>, String> {
        let deadline = Instant::now() + REPLY_DEADLINE;
        loop {
            match Reply::decode(&self.buf, MAX_REPLY_BODY) {
                Ok(Some((r, n))) => {
                    let lines = describe(&r, ids);
                    self.buf.drain(..n);
                    return Ok(Some(lines));
                }
                Ok(None) => {}
                Err(e) => return Err(format!("!! {e}")),
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(format!("!! no reply within {REPLY_DEADLINE:?}"));
            }
            self.stream.set_read_timeout(Some(left)).unwrap();
            let mut chunk = [0u8; 64 * 1024];
            match self.stream.read(&mut chunk) {
                Ok(0) if self.buf.is_empty() => return Ok(None),
                Ok(0) => return Err(format!("!! eof inside a reply {:?}", escape(&self.buf))),
                Ok(n) => self.buf.extend_from_slice(&chunk[..n]),
                Err(e)
                    if matches!(
                        e.kind(),
                        ErrorKind::Interrupted | ErrorKind::WouldBlock | ErrorKind::TimedOut
                    ) => {}
                Err(e) if e.kind() == ErrorKind::ConnectionReset => return Ok(None),
                Err(e) => return Err(format!("!! read: {e}")),
            }
        }
    }
}

/// Plays `steps` against `addr` and returns the normalised transcript.
pub fn play(addr: &str, steps: &[Step]) -> String {
    let mut conns: BTreeMap<u8, Conn> = BTreeMap::new();
    let mut ids = Ids::default();
    let mut out = String::new();
    let open = |conns: &mut BTreeMap<u8, Conn>, c: u8| {
        conns.entry(c).or_insert_with(|| Conn {
            stream: TcpStream::connect(addr).unwrap_or_else(|e| panic!("connect {addr}: {e}")),
            buf: Vec::new(),
        });
    };
    for step in steps {
        match step {
            Step::Send { conn, text, repeat } => {
                open(&mut conns, *conn);
                let bytes = expand(text, &|k| ids.get(k)).repeat(*repeat);
                let shown = if *repeat == 1 {
                    text.clone()
                } else {
                    format!("{text} *{repeat}")
                };
                out += &format!("{conn}> {shown}\n");
                if let Err(e) = conns.get_mut(conn).unwrap().stream.write_all(&bytes) {
                    out += &format!("{conn}< !! write: {e}\n");
                }
            }
            Step::Recv { conn, count } => {
                open(&mut conns, *conn);
                for _ in 0..*count {
                    out += &recv_one(conns.get_mut(conn).unwrap(), *conn, &mut ids);
                }
            }
            Step::Eof { conn } => {
                open(&mut conns, *conn);
                out += &recv_one(conns.get_mut(conn).unwrap(), *conn, &mut ids);
                conns.remove(conn);
            }
        }
    }
    for (c, mut conn) in conns {
        let _ = conn.stream.shutdown(Shutdown::Write);
        out += &format!("{c}: half-closed\n");
        loop {
            let line = recv_one(&mut conn, c, &mut ids);
            out += &line;
            if line.ends_with("< eof\n") || line.contains("!!") {
                break;
            }
        }
    }
    out
}

fn recv_one(conn: &mut Conn, c: u8, ids: &mut Ids) -> String {
    match conn.reply(ids) {
        Ok(Some(lines)) => lines.iter().map(|l| format!("{c}< {l}\n")).collect(),
        Ok(None) => format!("{c}< eof\n"),
        Err(e) => format!("{c}< {e}\n"),
    }
}

/// The `*.bs` files in `dir` (a crate names its own path to `net/beanstalk/tests/scripts`),
/// sorted.
pub fn scripts(dir: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "bs"))
        .collect();
    v.sort();
    assert!(!v.is_empty(), "no scripts in {}", dir.display());
    v
}

/// The steps of the script at `path`, failing with its name.
pub fn read_script(path: &Path) -> Vec<Step> {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    parse(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Runs `play_one` for every script at once, each on its own thread (a script waits for
/// seconds where its semantics need it, so one after another would add the waits up), and
/// returns the transcripts in the order of `paths`. `play_one` starts its own fresh server.
pub fn play_each(
    paths: &[PathBuf],
    play_one: impl Fn(&Path, &[Step]) -> String + Sync,
) -> Vec<String> {
    std::thread::scope(|s| {
        let threads: Vec<_> = paths
            .iter()
            .map(|path| {
                let play_one = &play_one;
                s.spawn(move || play_one(path, &read_script(path)))
            })
            .collect();
        threads
            .into_iter()
            .zip(paths)
            .map(|(t, path)| {
                t.join()
                    .unwrap_or_else(|_| panic!("playing {} panicked", path.display()))
            })
            .collect()
    })
}

/// The lines of `got` that differ from `want`, with a line of context each side, as a unified
/// diff reads (`-` recorded, `+` now); empty when they are equal.
pub fn diff(want: &str, got: &str) -> String {
    let (a, b): (Vec<&str>, Vec<&str>) = (want.lines().collect(), got.lines().collect());
    // Longest common subsequence table, from the ends: transcripts are a few hundred lines.
    let mut lcs = vec![vec![0u32; b.len() + 1]; a.len() + 1];
    for i in (0..a.len()).rev() {
        for j in (0..b.len()).rev() {
            lcs[i][j] = if a[i] == b[j] {
                lcs[i + 1][j + 1] + 1
            } else {
                lcs[i + 1][j].max(lcs[i][j + 1])
            };
        }
    }
    let mut ops = Vec::new(); // (' ' | '-' | '+', line)
    let (mut i, mut j) = (0, 0);
    while i < a.len() || j < b.len() {
        if i < a.len() && j < b.len() && a[i] == b[j] {
            ops.push((' ', a[i]));
            (i, j) = (i + 1, j + 1);
        } else if i < a.len() && (j == b.len() || lcs[i + 1][j] >= lcs[i][j + 1]) {
            ops.push(('-', a[i]));
            i += 1;
        } else {
            ops.push(('+', b[j]));
            j += 1;
        }
    }
    let changed = |k: usize| ops.get(k).is_some_and(|(op, _)| *op != ' ');
    let mut out = String::new();
    let mut last = None;
    for (k, (op, line)) in ops.iter().enumerate() {
        let near = changed(k) || changed(k + 1) || (k > 0 && changed(k - 1));
        if !near {
            continue;
        }
        if last.is_some_and(|l| l + 1 < k) {
            out += "  ...\n";
        }
        out += &format!("{op} {line}\n");
        last = Some(k);
    }
    out
}

/// A real beanstalkd on a port of its own, killed on drop. It binds port 0 and cannot say which
/// port it got, so the port is the one its process listens on (`/proc`): never a port picked
/// here and released, which another test's server could take first.
pub struct Beanstalkd {
    child: Child,
    pub addr: String,
}

impl Beanstalkd {
    /// `None` when the `beanstalkd` binary is not installed.
    pub fn spawn() -> Option<Beanstalkd> {
        Beanstalkd::spawn_with(&[])
    }

    /// With more arguments (`-z 100`, `-b DIR`).
    pub fn spawn_with(args: &[&str]) -> Option<Beanstalkd> {
        let child = Command::new("beanstalkd")
            .args(["-l", "127.0.0.1", "-p", "0"])
            .args(args)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .ok()?;
        let deadline = Instant::now() + Duration::from_secs(10);
        let mut server = Beanstalkd {
            child,
            addr: String::new(),
        };
        loop {
            if let Ok(Some(status)) = server.child.try_wait() {
                panic!("beanstalkd {args:?} exited: {status}");
            }
            // A socket in the LISTEN state takes connections (into its backlog) from now on,
            // so none is made to check: beanstalkd would count a probe in
            // `current-connections` until it read the probe's close, and a script's first
            // `stats` could see it (it did, once).
            if let Ok([port]) = listening_ports(server.child.id()).as_deref() {
                server.addr = format!("127.0.0.1:{port}");
                return Some(server);
            }
            assert!(
                Instant::now() < deadline,
                "beanstalkd {args:?} did not listen within 10 s"
            );
            std::thread::yield_now();
        }
    }
}

impl Drop for Beanstalkd {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
