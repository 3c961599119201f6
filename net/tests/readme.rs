//! The examples of the README and of docs/, run as written against real servers, and what they
//! print held to what the pages say they print.
//!
//! Every ```sh, ```lua and ```python block is either run here or skipped with the reason
//! (another test runs the same commands, or the block needs a release build, etcd or perf); a
//! block or a line this file does not know fails the test, so the pages cannot grow a command
//! nobody ran. The pages run in order (README.md, then docs/), in one shared set of servers,
//! starting with the one `cargo run --release` starts (its defaults, on port 0). A Lua block
//! runs as a `tarantool` script (net.box), a Python block with `python3` (the `tarantool`
//! connector): each must end without an error. An sh block runs line by line:
//!
//! - a line that starts a server (`tarq ... &`) starts the test build of `tarq` on port 0 in a
//!   temporary directory; the README's addresses are mapped to the ports the servers report
//!   (`--listen`, `--beanstalk-listen`, `--metrics-listen`; the default `127.0.0.1:3301` when
//!   none is given), and `/tmp/...` data directories to temporary ones;
//! - `TARQ_PID=$!` is that server's pid;
//! - any other line runs in bash with the test build first on `PATH`, the README's addresses
//!   replaced by the real ones (`tarq ctl` without `--addr` gets the default's), and its output
//!   is checked against the expectation this file keeps for that line.
//!
//! The Graphite address of the Operating example is a listener of this test, which checks that
//! the pushed lines arrive.

mod support;

use std::collections::HashMap;
use std::io::{BufRead, BufReader};
use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::mpsc;
use std::time::Instant;

use support::{addr_in, Tarq, BIN, WAIT};
use tarq_net::config::Settings;

/// The README's default address, where `tarq` listens without `--listen` and `tarq ctl` calls
/// without `--addr`.
const DEFAULT_ADDR: &str = "127.0.0.1:3301";

/// What a code block is to this test, chosen by the block's first line.
enum Plan {
    Run,
    Skip(&'static str),
}

/// Every sh, lua and python block of the README and docs/, by a prefix of its first line.
const BLOCKS: &[(&str, Plan)] = &[
    (
        "cargo run --release -p tarq-loadgen -- suite",
        Plan::Skip("the benchmark suite: minutes per target on a quiet machine"),
    ),
    (
        "cargo run --release        # start the server",
        Plan::Skip(
            "this test starts the same server (its defaults, port 0) first; the second runs it",
        ),
    ),
    // The client examples in Lua (net.box, run by `tarantool`) and Python (the `tarantool`
    // connector), against the server `cargo run --release` starts.
    ("-- Tarantool's net.box", Plan::Run),
    (
        "local conn = require('net.box').connect('127.0.0.1:3301')",
        Plan::Run,
    ),
    ("import tarantool", Plan::Run),
    // docs/users.md: its calls need a server with --user and users; net/tests/users.rs makes
    // each of them there.
    (
        "conn:call('box.schema.user.create'",
        Plan::Skip("net/tests/users.rs makes these calls against a server with --user"),
    ),
    (
        "echo SECRET | tarq ctl --user admin",
        Plan::Skip("net/tests/users.rs runs tarq ctl user against a server with --user"),
    ),
    (
        "conn:call('tarq.user_limits'",
        Plan::Skip("net/tests/user_limits.rs sets a user's own limits on a server with --user"),
    ),
    (
        "tarq ctl --user admin --password ... user limit",
        Plan::Skip("net/tests/user_limits.rs runs tarq ctl user limit against a server with --user"),
    ),
    (
        "cargo install --locked --path net",
        Plan::Skip("a release build of the same binary; package.rs installs the packaged one"),
    ),
    (
        "cargo install --locked cargo-deb",
        Plan::Skip("net/tests/package.rs builds, installs and serves from the package"),
    ),
    (
        "tarq --listen 127.0.0.1:3301 --data-dir /tmp/tarq-bs",
        Plan::Run,
    ),
    (
        "tarq --listen 127.0.0.1:3301 --data-dir /tmp/primary",
        Plan::Run,
    ),
    (
        "tarq-loadgen --target tarq --addr 127.0.0.1:3301 --depth 16 --tls-ca",
        Plan::Skip("a TLS load run: loadgen/tests/end_to_end.rs runs the loadgen over TLS"),
    ),
    (
        "etcd --data-dir",
        Plan::Skip("needs etcd: net/tests/failover.rs runs three such nodes on one etcd"),
    ),
    (
        "tarq ctl --addr 127.0.0.1:3303 cluster",
        Plan::Skip("needs etcd and two replica sets: net/tests/shards_ops.rs runs ctl cluster"),
    ),
    (
        "tarq ctl --addr 127.0.0.1:3301 place jobs 2 --to a",
        Plan::Skip("needs etcd and two replica sets: net/tests/shards_ops.rs runs ctl place"),
    ),
    (
        "tarq --listen 127.0.0.1:3305 --data-dir /var/lib/tarq-c0",
        Plan::Skip("a new set joins a sharded cluster: net/tests/shards_rebalance.rs does it"),
    ),
    (
        "tarq ctl --addr 127.0.0.1:3305 rebalance --dry-run",
        Plan::Skip("needs etcd and three sets: net/tests/shards_rebalance.rs runs rebalance"),
    ),
    (
        "tarq ctl --addr 127.0.0.1:3305 drain c",
        Plan::Skip("needs etcd and three sets: net/tests/shards_rebalance.rs runs drain"),
    ),
    (
        "tarq ctl --addr 127.0.0.1:3302,127.0.0.1:3301 put hello",
        Plan::Run,
    ),
    (
        "tarantool net/tests/clients/netbox_flow.lua",
        Plan::Skip("net/tests/clients.rs runs both scripts against a fresh tarq"),
    ),
    (
        "python3 net/tests/clients/beanstalk/greenstalk_flow.py",
        Plan::Skip("net/tests/beanstalk_clients.rs runs both flows against a fresh tarq"),
    ),
    ("# push stats to Graphite", Plan::Run),
    (
        "# tarantool-python over TLS",
        Plan::Skip("needs a node's certificate and name: net/tests/tls.rs runs this connector over TLS"),
    ),
    (
        "-- Tarantool Enterprise's net.box",
        Plan::Skip("Tarantool Enterprise; open-source net.box has no TLS"),
    ),
    (
        "# the HTTP API and the beanstalk port over TLS",
        Plan::Skip("needs a node's certificate and name: net/tests/tls.rs runs curl and openssl against TLS ports"),
    ),
    (
        "# The cluster's CA: keep ca.key off the nodes.",
        Plan::Skip("net/tests/tls.rs makes a CA and node certificates with these openssl commands"),
    ),
    (
        "sudo systemctl enable --now tarq",
        Plan::Skip("needs a running systemd: package.rs installs the unit and verifies it"),
    ),
    ("tarq ctl stats", Plan::Run),
    (
        "cargo build --release -p tarq-net -p tarq-loadgen",
        Plan::Skip("release builds and minutes of load; loadgen/tests/ run the loadgen"),
    ),
    (
        "target/release/tarq --listen 127.0.0.1:3301 --data-dir /tmp/tarq-prof",
        Plan::Skip("perf on a release build"),
    ),
    (
        "cargo build --release -p tarq-net -p tarq-chaos",
        Plan::Skip("root, release builds and 30 minutes of faults: chaos/tests/schedule.rs runs a short schedule"),
    ),
    (
        "sudo tarq-chaos run --nemesis all",
        Plan::Skip("root and 30 minutes of faults: chaos/tests/schedule.rs runs a short schedule"),
    ),
];

/// What a line run in bash must do, chosen by a prefix of the line.
enum Check {
    /// Exit 0; its stdout passes the check.
    Prints(fn(&str, &Servers)),
    /// Exit 0, and stdout passes the check within [`WAIT`] (the line is run again until then):
    /// for what a replica shows once replication caught up.
    Eventually(fn(&str) -> bool),
    /// Exit 0; then the last started server logs a line with this text.
    Logs(&'static str),
    /// Exit 0; then the last started server exits 0.
    Stops,
}

fn json(out: &str) -> serde_json::Value {
    serde_json::from_str(out.trim()).unwrap_or_else(|e| panic!("not JSON ({e}): {out:?}"))
}

/// The expectation of every line the README runs, by a prefix of the line.
fn checks() -> Vec<(&'static str, Check)> {
    use Check::*;
    vec![
        ("until ", Prints(|_, _| {})),
        (
            "printf 'put 0 0 60 5",
            Prints(|out, _| assert_eq!(out, "INSERTED 1\r\nRESERVED 1 5\r\nhello\r\n")),
        ),
        (
            "tarq ctl --addr 127.0.0.1:3301 put hello",
            Prints(|out, _| {
                let t = json(out);
                assert_eq!(t["id"], 1, "{t}");
                assert_eq!(t["status"], "R", "{t}");
                assert_eq!(t["data"], "hello", "{t}");
            }),
        ),
        (
            "tarq ctl --addr 127.0.0.1:3302 stats",
            Eventually(|out| {
                let s = json(out);
                s["total"] == 1 && s["replication_lag_records"] == 0
            }),
        ),
        (
            "tarq ctl --addr 127.0.0.1:3302 put hi",
            Prints(|out, _| {
                let t = json(out);
                assert_eq!(t["id"], 2, "put on the primary, after hello: {t}");
                assert_eq!(t["data"], "hi", "{t}");
            }),
        ),
        (
            "tarq ctl --addr 127.0.0.1:3302,127.0.0.1:3301 put hello",
            Prints(|out, _| {
                let t = json(out);
                assert_eq!(t["status"], "R", "{t}");
                assert_eq!(t["data"], "hello", "{t}");
            }),
        ),
        (
            "tarq ctl --addr 127.0.0.1:3301,127.0.0.1:3302 cluster",
            Prints(|out, s| assert!(out.contains(&s.real(DEFAULT_ADDR)), "{out}")),
        ),
        (
            "curl -s 127.0.0.1:9100/metrics",
            Prints(|out, _| {
                assert!(out.contains("\ntarq_tasks "), "{out}");
                assert!(
                    out.contains("tarq_request_duration_seconds_bucket"),
                    "{out}"
                );
            }),
        ),
        (
            "tarq ctl stats",
            Prints(|out, _| assert!(json(out)["total"].is_u64(), "{out}")),
        ),
        (
            "tarq ctl --tube default stats",
            Prints(|out, _| assert!(json(out)["tasks"]["total"].is_u64(), "{out}")),
        ),
        (
            "echo 'queue.stats()' | tarq ctl console",
            Prints(|out, _| assert!(json(out)[0]["total"].is_u64(), "{out}")),
        ),
        (
            "tarq ctl put '{\"job\":7}' --delay 5 --pri -1",
            Prints(|out, _| {
                let t = json(out);
                assert_eq!(t["status"], "W", "{t}");
                assert_eq!(t["pri"], -1, "{t}");
                assert_eq!(t["data"], serde_json::json!({"job": 7}), "{t}");
            }),
        ),
        (
            "tarq ctl take --timeout 2",
            Prints(|out, _| assert_eq!(out.trim(), "null")),
        ),
        (
            "echo \"queue.put('x', {ttl=60})\" | tarq ctl console",
            Prints(|out, _| {
                let t = &json(out)[0];
                assert_eq!(t["data"], "x", "{t}");
                assert_eq!(t["ttl"], 60.0, "{t}");
            }),
        ),
        ("kill -HUP \"$TARQ_PID\"", Logs("configuration reloaded")),
        ("kill -TERM \"$TARQ_PID\"", Stops),
    ]
}

/// The servers started so far, the README's addresses and directories mapped to theirs.
struct Servers {
    tmp: tempfile::TempDir,
    addrs: HashMap<String, SocketAddr>,
    running: Vec<Tarq>,
    /// `$!` of the last `&` line.
    last_pid: Option<u32>,
}

impl Servers {
    fn real(&self, readme: &str) -> String {
        self.addrs
            .get(readme)
            .unwrap_or_else(|| panic!("the README uses {readme} before a server listens there"))
            .to_string()
    }

    /// `text` with every `127.0.0.1:PORT` (and `127.0.0.1 PORT`, nc's form, and
    /// `'127.0.0.1', PORT`, Python's) the README uses replaced by the address it stands for
    /// here.
    fn map(&self, text: &str) -> String {
        const HOST: &str = "127.0.0.1";
        let mut out = String::new();
        let mut rest = text;
        while let Some(at) = rest.find(HOST) {
            out.push_str(&rest[..at]);
            let after = &rest[at + HOST.len()..];
            let sep = [":", " ", "', "].into_iter().find(|s| after.starts_with(s));
            let digits = sep.map_or(0, |s| {
                after[s.len()..]
                    .chars()
                    .take_while(char::is_ascii_digit)
                    .count()
            });
            match sep {
                Some(sep) if digits > 0 => {
                    let port = &after[sep.len()..sep.len() + digits];
                    let real = self.real(&format!("{HOST}:{port}"));
                    let real: SocketAddr = real.parse().unwrap();
                    out.push_str(&format!("{HOST}{sep}{}", real.port()));
                    rest = &after[sep.len() + digits..];
                }
                _ => {
                    out.push_str(HOST);
                    rest = after;
                }
            }
        }
        out.push_str(rest);
        out
    }

    /// Starts the server of a `tarq ... &` line (its words, comment and `&` cut off).
    fn start(&mut self, words: &[&str]) {
        let mut args: Vec<String> = Vec::new();
        let mut listens: Vec<(&str, String)> = Vec::new();
        let mut i = 1;
        while i < words.len() {
            let w = words[i];
            let value = words.get(i + 1).copied();
            match (w, value) {
                ("--listen" | "--beanstalk-listen" | "--metrics-listen", Some(v)) => {
                    listens.push((w, v.to_string()));
                    args.extend([w.to_string(), "127.0.0.1:0".into()]);
                    i += 2;
                }
                ("--data-dir", Some(v)) => {
                    // Each start its own directory: the README's examples stand alone, so
                    // two of them may name the same one.
                    let name = Path::new(v).file_name().unwrap().to_str().unwrap();
                    let dir = self
                        .tmp
                        .path()
                        .join(format!("{}-{name}", self.running.len()));
                    args.extend([w.to_string(), dir.to_str().unwrap().to_string()]);
                    i += 2;
                }
                _ => {
                    args.push(self.map(w));
                    i += 1;
                }
            }
        }
        if !listens.iter().any(|(f, _)| *f == "--listen") {
            listens.push(("--listen", DEFAULT_ADDR.into()));
            args.extend(["--listen".into(), "127.0.0.1:0".into()]);
        }
        // Its own working directory, where a default `--data-dir` (./data) goes.
        let cwd = tempfile::tempdir().unwrap();
        let mut cmd = Command::new(BIN);
        cmd.args(&args).current_dir(cwd.path());
        let t = Tarq::spawn_cmd(cwd, cmd);
        for (flag, readme) in listens {
            let real = match flag {
                "--listen" => t.addr,
                "--metrics-listen" => t.metrics.expect("the metrics address is logged"),
                _ => t
                    .log()
                    .iter()
                    .find_map(|l| {
                        l.contains("serving the beanstalk protocol")
                            .then(|| addr_in(l, "listen=").unwrap())
                    })
                    .expect("the beanstalk address is logged"),
            };
            self.addrs.insert(readme, real);
        }
        self.last_pid = Some(t.proc.id());
        self.running.push(t);
    }

    /// Runs a Lua block as a `tarantool` script (net.box) or a Python block with `python3`,
    /// the addresses mapped; it must end without an error (a failed call raises one).
    fn script(&self, lang: &str, code: &str) {
        let mut code = self.map(code);
        if lang == "lua" {
            // A script ends when it says so: net.box's fibers keep `tarantool` running.
            code.push_str("\nos.exit(0)\n");
        }
        let file = self.tmp.path().join(format!("example.{lang}"));
        std::fs::write(&file, &code).unwrap();
        let interpreter = if lang == "lua" {
            "tarantool"
        } else {
            "python3"
        };
        let out = Command::new("timeout")
            .args(["60", interpreter])
            .arg(&file)
            .current_dir(self.tmp.path())
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{interpreter} {code}\n-> {}\n{}{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// Runs one line in bash as a user would, the test build of `tarq` first on `PATH`.
    fn bash(&self, line: &str) -> std::process::Output {
        let bin_dir = Path::new(BIN).parent().unwrap();
        let path = format!(
            "{}:{}",
            bin_dir.display(),
            std::env::var("PATH").unwrap_or_default()
        );
        let mut cmd = Command::new("timeout");
        cmd.args(["60", "bash", "-c", line])
            .env("PATH", path)
            .env("HOME", self.tmp.path())
            .env_remove("RUST_BACKTRACE")
            .current_dir(workspace());
        if let Some(pid) = self.last_pid {
            cmd.env("TARQ_PID", pid.to_string());
        }
        cmd.output().unwrap()
    }
}

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

/// A page's code blocks: (line number of the first line, language, the lines with `\`
/// continuations joined).
fn code_blocks(page: &str) -> Vec<(usize, String, Vec<String>)> {
    let mut blocks = Vec::new();
    let mut current: Option<(usize, String, Vec<String>)> = None;
    let mut pending = String::new();
    for (n, line) in page.lines().enumerate() {
        let fence = line.trim_start().strip_prefix("```");
        match (&mut current, fence) {
            (None, Some(lang)) => current = Some((n + 2, lang.trim().to_string(), Vec::new())),
            (None, None) => {}
            (Some(_), Some(_)) => blocks.extend(current.take()),
            (Some((_, _, lines)), None) => {
                if let Some(head) = line.strip_suffix('\\') {
                    pending.push_str(head);
                    continue;
                }
                pending.push_str(line);
                lines.push(std::mem::take(&mut pending));
            }
        }
    }
    blocks
}

/// The words of a server line: its comment and the `&` cut off.
fn server_words(line: &str) -> Option<Vec<&str>> {
    let code = line.split(" #").next().unwrap().trim();
    let code = code.strip_suffix('&')?.trim();
    code.starts_with("tarq ")
        .then(|| code.split_whitespace().collect())
}

/// `tarq ctl` without `--addr` calls the README's default address: given here explicitly.
fn with_default_addr(line: &str, servers: &Servers) -> String {
    let code = line.split(" #").next().unwrap();
    if code.contains("tarq ctl") && !code.contains("--addr") {
        line.replacen(
            "tarq ctl",
            &format!("tarq ctl --addr {}", servers.real(DEFAULT_ADDR)),
            1,
        )
    } else {
        line.to_string()
    }
}

fn run_line(line: &str, servers: &mut Servers, checks: &[(&str, Check)]) {
    let trimmed = line.trim();
    if trimmed.is_empty() || trimmed.starts_with('#') {
        return;
    }
    if let Some(words) = server_words(trimmed) {
        return servers.start(&words);
    }
    if trimmed.starts_with("TARQ_PID=$!") {
        assert!(servers.last_pid.is_some(), "$! before any server");
        return;
    }
    let check = checks
        .iter()
        .find(|(prefix, _)| trimmed.starts_with(prefix))
        .map(|(_, c)| c)
        .unwrap_or_else(|| panic!("README line without a check in readme.rs: {trimmed}"));
    let mapped = with_default_addr(&servers.map(trimmed), servers);
    let deadline = Instant::now() + WAIT;
    loop {
        let out = servers.bash(&mapped);
        let stdout = String::from_utf8_lossy(&out.stdout).to_string();
        let stderr = String::from_utf8_lossy(&out.stderr).to_string();
        let said = || {
            format!(
                "{mapped}\n-> {}\nstdout: {stdout}\nstderr: {stderr}",
                out.status
            )
        };
        match check {
            Check::Eventually(ok) => {
                assert!(out.status.success(), "{}", said());
                if !ok(&stdout) {
                    assert!(
                        Instant::now() < deadline,
                        "never as the README says: {}",
                        said()
                    );
                    continue;
                }
            }
            Check::Prints(ok) => {
                assert!(out.status.success(), "{}", said());
                ok(&stdout, servers);
            }
            Check::Logs(text) => {
                assert!(out.status.success(), "{}", said());
                let t = servers.running.last_mut().unwrap();
                t.wait_for_line(text);
            }
            Check::Stops => {
                assert!(out.status.success(), "{}", said());
                let t = servers.running.last_mut().unwrap();
                assert!(t.proc.wait_exit().success(), "{:?}", t.log());
            }
        }
        return;
    }
}

#[test]
fn the_readme_commands_work_as_written_and_print_what_it_says() {
    support::prerequisite("nc (netcat-openbsd)", support::tool("nc"));
    support::prerequisite("curl", support::tool("curl"));
    support::prerequisite("tarantool (net.box)", support::tool("tarantool"));
    support::require_command(
        "the tarantool Python connector",
        &["python3", "-c", "import tarantool"],
    );
    // The README, then the pages of docs/, in one set of servers.
    let mut pages = vec![workspace().join("README.md")];
    pages.extend(doc_pages());
    // The Graphite receiver of the Operating example is this listener; its first line comes
    // back through the channel.
    let graphite = TcpListener::bind("127.0.0.1:0").unwrap();
    let graphite_addr = graphite.local_addr().unwrap();
    let (tx, pushed) = mpsc::channel();
    std::thread::spawn(move || {
        let (conn, _) = graphite.accept().unwrap();
        let mut line = String::new();
        let _ = BufReader::new(conn).read_line(&mut line);
        let _ = tx.send(line);
    });
    let mut servers = Servers {
        tmp: tempfile::tempdir().unwrap(),
        addrs: HashMap::from([("127.0.0.1:2003".to_string(), graphite_addr)]),
        running: Vec::new(),
        last_pid: None,
    };
    let checks = checks();
    let mut ran = 0;
    let blocks = pages.iter().flat_map(|page| {
        let text = std::fs::read_to_string(page).unwrap();
        let name = page
            .strip_prefix(workspace())
            .unwrap()
            .display()
            .to_string();
        code_blocks(&text)
            .into_iter()
            .map(move |(line, lang, lines)| (format!("{name}:{line}"), lang, lines))
    });
    // The server of the README's first command, `cargo run --release`: its defaults.
    servers.start(&["tarq"]);
    for (at, lang, lines) in blocks {
        if !["sh", "lua", "python"].contains(&lang.as_str()) {
            continue;
        }
        let first = lines.first().map(|l| l.trim()).unwrap_or_default();
        let plan = BLOCKS
            .iter()
            .find(|(prefix, _)| first.starts_with(prefix))
            .map(|(_, p)| p)
            .unwrap_or_else(|| {
                panic!("{at}: a ```{lang} block readme.rs neither runs nor skips: {first}")
            });
        match plan {
            Plan::Run if lang == "sh" => {
                for line in &lines {
                    run_line(line, &mut servers, &checks);
                }
                ran += 1;
            }
            Plan::Run => {
                servers.script(&lang, &lines.join("\n"));
                ran += 1;
            }
            Plan::Skip(why) => eprintln!("{at}: not run here: {why}"),
        }
    }
    assert_eq!(ran, 12, "the blocks marked Run were all found");

    // Graphite got the pushes of the Operating example's server.
    let first = pushed
        .recv_timeout(WAIT)
        .expect("the Operating example's tarq pushed to Graphite");
    assert!(first.starts_with("queue.stats."), "{first:?}");
}

/// A `--config` file with `text`, as the server reads it.
/// Every page under docs/ (the design notes in docs/design/ too), in name order.
fn doc_pages() -> Vec<PathBuf> {
    let mut pages = Vec::new();
    let mut dirs = vec![workspace().join("docs")];
    while let Some(dir) = dirs.pop() {
        for e in std::fs::read_dir(dir).unwrap() {
            let path = e.unwrap().path();
            if path.is_dir() {
                dirs.push(path);
            } else if path.extension().is_some_and(|x| x == "md") {
                pages.push(path);
            }
        }
    }
    pages.sort();
    pages
}

fn parse_config(text: &str) -> Result<Settings, String> {
    toml::from_str::<Settings>(text).map_err(|e| e.to_string())
}

/// Every key the README and docs/ name as a TOML key — `(TOML `key`...)` — is one the parser
/// takes, every `TARQ_` variable named beside one is a setting's, and every key of the sample
/// configuration is one the parser takes, its commented ones included.
#[test]
fn every_toml_key_the_docs_name_is_one_the_parser_takes() {
    let mut texts = vec![std::fs::read_to_string(workspace().join("README.md")).unwrap()];
    for page in doc_pages() {
        texts.push(std::fs::read_to_string(page).unwrap());
    }
    let mut named = Vec::new();
    let mut variables = Vec::new();
    for text in &texts {
        for group in text.split("(TOML").skip(1) {
            let group = group.split(')').next().unwrap();
            for (i, quoted) in group.split('`').enumerate() {
                // Odd pieces are inside backticks: `key` or `key = value` (or a `--flag`
                // or a `TARQ_` variable named beside them, checked below).
                if i % 2 == 1 && quoted.starts_with("TARQ_") {
                    variables.push(quoted.to_string());
                } else if i % 2 == 1 && !quoted.starts_with("--") {
                    named.push(quoted.split(" =").next().unwrap().trim().to_string());
                }
            }
        }
    }
    for key in [
        "queue-namespace",
        "beanstalk-listen",
        "replica-of",
        "etcd",
        "node-name",
    ] {
        assert!(named.iter().any(|k| k == key), "{key} among {named:?}");
    }
    for key in &named {
        // A string is the wrong type for most keys, but only an unknown key says "unknown".
        let err = parse_config(&format!("{key} = \"x\""))
            .err()
            .unwrap_or_default();
        assert!(!err.contains("unknown field"), "TOML key {key}: {err}");
    }

    let cli = <tarq_net::config::Cli as clap::CommandFactory>::command();
    for var in &variables {
        assert!(
            cli.get_arguments()
                .any(|a| a.get_env() == Some(std::ffi::OsStr::new(var))),
            "{var} is no setting's variable"
        );
    }

    let sample = std::fs::read_to_string(workspace().join("packaging/tarq.toml")).unwrap();
    parse_config(&sample).unwrap_or_else(|e| panic!("packaging/tarq.toml: {e}"));
    let uncommented: String = sample
        .lines()
        .map(|l| match l.strip_prefix("# ") {
            Some(rest) if rest.split(" = ").count() == 2 => rest,
            _ => l,
        })
        .map(|l| format!("{l}\n"))
        .collect();
    let all = parse_config(&uncommented)
        .unwrap_or_else(|e| panic!("packaging/tarq.toml with every key uncommented: {e}"));
    assert!(all.user.is_some() && all.etcd.is_some() && all.beanstalk_listen.is_some());
}
