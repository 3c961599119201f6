//! The processes of a run: etcd members ([`Etcd`]) and tarq nodes ([`Node`]), each started in
//! its own [`Host`]'s namespace, its output appended to a log file that outlives its restarts.
//! A fault is done to a process as an operator's bad day would: `kill -9` and a restart on the
//! same data directory, or SIGSTOP/SIGCONT (a process frozen while the world goes on, as a long
//! GC pause or a stalled VM looks to its peers).
//!
//! Readiness is checked from inside the process's own host: a short-lived thread enters that
//! namespace ([`Host::in_thread`]) and polls with plain std sockets. That needs no tool in the
//! namespace (no `curl` under `ip netns exec`, no process per probe), and it checks the process
//! rather than the network: the host always reaches its own address, whatever faults are in
//! place between hosts. Every wait has a deadline, and its error names what was waited for,
//! the last answer seen and the tail of the process's log.
//!
//! The tarq binary is found by [`tarq_bin`], etcd's by [`etcd_bin`].

use std::ffi::OsString;
use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use tarq_client::Client;

use crate::net::Host;

/// How long a start may take: an etcd cluster electing its first leader on a busy machine,
/// a tarq node replaying a long WAL.
pub const START_TIMEOUT: Duration = Duration::from_secs(30);
/// How long one probe (a connect, an HTTP answer, a greeting) may take.
const PROBE_TIMEOUT: Duration = Duration::from_secs(1);
/// Between two probes.
const POLL_EVERY: Duration = Duration::from_millis(50);
/// Lines of a process's log an error quotes.
const LOG_TAIL_LINES: usize = 30;

/// The tarq binary: `$TARQ_BIN` when set; else the newest of `release/tarq` and `debug/tarq`
/// under `$CARGO_TARGET_DIR` (when set) or else the workspace's `target/`. The newest, because
/// either may be a leftover of an older build; cargo cannot build it for us (a package's tests
/// only get `CARGO_BIN_EXE_*` of its own binaries, and tarq is tarq-net's).
pub fn tarq_bin() -> Result<PathBuf> {
    if let Some(bin) = std::env::var_os("TARQ_BIN").filter(|b| !b.is_empty()) {
        let bin = PathBuf::from(bin);
        return match bin.is_file() {
            true => Ok(bin),
            false => Err(anyhow!("TARQ_BIN={} is not a file", bin.display())),
        };
    }
    let target = match std::env::var_os("CARGO_TARGET_DIR").filter(|d| !d.is_empty()) {
        Some(dir) => PathBuf::from(dir),
        None => workspace_root().join("target"),
    };
    let candidates = [target.join("release/tarq"), target.join("debug/tarq")];
    candidates
        .iter()
        .filter_map(|p| Some((p.metadata().ok()?.modified().ok()?, p)))
        .max()
        .map(|(_, p)| p.clone())
        .ok_or_else(|| {
            anyhow!(
                "no tarq binary: TARQ_BIN is unset and neither {} nor {} exists; build it with \
                 `cargo build -p tarq-net --release` (same CARGO_TARGET_DIR) or set TARQ_BIN",
                candidates[0].display(),
                candidates[1].display()
            )
        })
}

/// The etcd binary: `$ETCD_BIN` when set, else `etcd` on PATH.
pub fn etcd_bin() -> Result<PathBuf> {
    if let Some(bin) = std::env::var_os("ETCD_BIN").filter(|b| !b.is_empty()) {
        return Ok(PathBuf::from(bin));
    }
    std::env::var_os("PATH")
        .iter()
        .flat_map(std::env::split_paths)
        .map(|d| d.join("etcd"))
        .find(|p| p.is_file())
        .ok_or_else(|| anyhow!("etcd is not on PATH (Debian package etcd-server) nor in ETCD_BIN"))
}

/// The workspace this crate was built in (the parent of `chaos/`).
fn workspace_root() -> PathBuf {
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    manifest.parent().unwrap_or(manifest).to_path_buf()
}

// ---------------------------------------------------------------------------------------------
// A process in a host

/// A program started in a host's namespace with fixed arguments, restartable; its stdout and
/// stderr appended to one log file, each start marked in it. Killed (SIGKILL) on drop.
#[derive(Debug)]
pub struct Proc {
    /// What it is, for messages: "etcd member e0", "tarq node n1".
    what: String,
    host: Host,
    program: PathBuf,
    args: Vec<OsString>,
    log: PathBuf,
    child: Option<Child>,
    starts: u32,
    /// Its clocks, if they are made to differ from the machine's.
    clocks: Clocks,
}

/// How a process's clocks differ from the machine's, to show that nothing in tarq compares
/// one process's clock readings with another's, or trusts the wall clock to be steady.
#[derive(Debug, Clone, Default)]
pub struct Clocks {
    /// Monotonic (and boot-time) offsets in seconds, one per start in turn (a time namespace,
    /// `unshare --time`): each start of the process sees a monotonic clock of its own, lower
    /// or higher than its last life's, as after a reboot. Empty: the machine's.
    pub monotonic_offsets: Vec<i64>,
    /// A file libfaketime reads the wall clock's offset from (`+30`, `-120`, in seconds):
    /// writing it steps the process's wall clock while it runs, as NTP or an operator would.
    /// The monotonic clock is left alone. `None`: the machine's wall clock.
    pub wall_offset_file: Option<PathBuf>,
}

/// libfaketime's library as Debian's `faketime` package installs it.
pub fn faketime_lib() -> Result<PathBuf> {
    let found = std::fs::read_dir("/usr/lib")
        .into_iter()
        .flatten()
        .flatten()
        .map(|d| d.path().join("faketime/libfaketime.so.1"))
        .find(|p| p.is_file());
    found.ok_or_else(|| anyhow!("libfaketime (Debian package faketime) is not installed"))
}

impl Proc {
    /// `program` with `args` on `host`, not started yet; `what` names it in messages.
    pub fn new(
        what: String,
        host: &Host,
        program: &Path,
        args: Vec<OsString>,
        log: PathBuf,
    ) -> Proc {
        Proc {
            what,
            host: host.clone(),
            program: program.to_path_buf(),
            args,
            log,
            child: None,
            starts: 0,
            clocks: Clocks::default(),
        }
    }

    /// Runs it with `clocks` from its next start on.
    pub fn with_clocks(mut self, clocks: Clocks) -> Proc {
        self.clocks = clocks;
        self
    }

    /// The command for this start: the program itself, or through `unshare --time` with this
    /// start's monotonic offset, with libfaketime preloaded when the wall clock is faked.
    fn command(&self) -> Result<std::process::Command> {
        let offsets = &self.clocks.monotonic_offsets;
        let mut cmd = if offsets.is_empty() {
            self.host.command(&self.program)
        } else {
            let offset = offsets[self.starts as usize % offsets.len()].to_string();
            let mut cmd = self.host.command("unshare");
            cmd.args(["--time", "--monotonic", &offset, "--boottime", &offset])
                .arg(&self.program);
            cmd
        };
        if let Some(file) = &self.clocks.wall_offset_file {
            cmd.env("LD_PRELOAD", faketime_lib()?)
                .env("FAKETIME_TIMESTAMP_FILE", file)
                .env("FAKETIME_DONT_FAKE_MONOTONIC", "1")
                // Read the file again at most every second: a step takes effect within one.
                .env("FAKETIME_CACHE_DURATION", "1");
        }
        cmd.args(&self.args);
        Ok(cmd)
    }

    /// Starts it (again); a run still going is killed first.
    pub fn start(&mut self) -> Result<()> {
        self.kill()?;
        self.starts += 1;
        let mut log = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .with_context(|| format!("cannot open {}", self.log.display()))?;
        // A marker per start: a restarted process's lines are told from the last run's.
        writeln!(
            log,
            "==== tarq-chaos: start {} of {}",
            self.starts, self.what
        )?;
        let child = self
            .command()?
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .with_context(|| format!("cannot start {} ({})", self.what, self.program.display()))?;
        self.child = Some(child);
        Ok(())
    }

    /// `kill -9` and reaps it; nothing when it is not running.
    pub fn kill(&mut self) -> Result<()> {
        let Some(mut child) = self.child.take() else {
            return Ok(());
        };
        // SIGKILL ends a stopped (paused) process too: no SIGCONT needed first. A child that
        // already exited is fine (older std says InvalidInput): the wait below reaps it.
        if let Err(e) = child.kill() {
            if e.kind() != std::io::ErrorKind::InvalidInput {
                let what = format!("cannot kill {} (pid {})", self.what, child.id());
                self.child = Some(child);
                return Err(e).context(what);
            }
        }
        child
            .wait()
            .with_context(|| format!("cannot reap {}", self.what))?;
        Ok(())
    }

    /// SIGSTOP: frozen, its sockets open, answering nothing.
    pub fn pause(&self) -> Result<()> {
        self.signal(libc::SIGSTOP, "SIGSTOP")
    }

    /// SIGCONT after [`Proc::pause`].
    pub fn resume(&self) -> Result<()> {
        self.signal(libc::SIGCONT, "SIGCONT")
    }

    fn signal(&self, sig: libc::c_int, name: &str) -> Result<()> {
        let pid = self
            .pid()
            .ok_or_else(|| anyhow!("{} is not running", self.what))?;
        let pid = libc::pid_t::try_from(pid)?;
        // SAFETY: sending a signal to a child of ours has no memory effects on this process.
        if unsafe { libc::kill(pid, sig) } != 0 {
            let e = std::io::Error::last_os_error();
            bail!("{name} to {} (pid {pid}) failed: {e}", self.what);
        }
        Ok(())
    }

    /// Its pid while started (it may have exited since; see [`Proc::is_running`]).
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// True when started and not exited (a paused process is running).
    pub fn is_running(&mut self) -> bool {
        self.exited().is_none() && self.child.is_some()
    }

    /// How it ended, when it has (reaping it).
    fn exited(&mut self) -> Option<ExitStatus> {
        self.child.as_mut()?.try_wait().ok().flatten()
    }

    pub fn host(&self) -> &Host {
        &self.host
    }

    pub fn log_path(&self) -> &Path {
        &self.log
    }

    /// The last `lines` lines of its log.
    pub fn log_tail(&self, lines: usize) -> String {
        let mut text = String::new();
        if let Ok(mut f) = File::open(&self.log) {
            let _ = f.read_to_string(&mut text);
        }
        let all: Vec<&str> = text.lines().collect();
        all[all.len().saturating_sub(lines)..].join("\n")
    }

    /// Polls `probe` from inside its host until it answers `Ok`, failing when the process
    /// exits or `timeout` passes; `what` says what was waited for.
    fn wait(
        &mut self,
        what: &str,
        timeout: Duration,
        mut probe: impl FnMut() -> Result<(), String> + Send,
    ) -> Result<()> {
        let host = self.host.clone();
        let deadline = Instant::now() + timeout;
        let outcome = host.in_thread(|| loop {
            let last = match probe() {
                Ok(()) => return Ok(()),
                Err(why) => why,
            };
            if let Some(status) = self.exited() {
                return Err(format!("it exited ({status})"));
            }
            if Instant::now() >= deadline {
                return Err(format!("timed out after {timeout:?}; last: {last}"));
            }
            std::thread::sleep(POLL_EVERY);
        })?;
        outcome.map_err(|why| {
            anyhow!(
                "{} never came to {what}: {why}\n--- last lines of {}:\n{}",
                self.what,
                self.log.display(),
                self.log_tail(LOG_TAIL_LINES)
            )
        })
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        if let Err(e) = self.kill() {
            eprintln!("tarq-chaos: {e:#}");
        }
    }
}

/// Whether something accepts TCP connections at `addr` (from the calling thread's namespace).
fn accepts(addr: SocketAddr) -> Result<(), String> {
    TcpStream::connect_timeout(&addr, PROBE_TIMEOUT)
        .map(drop)
        .map_err(|e| format!("connect to {addr}: {e}"))
}

/// `GET path` at `addr` over HTTP/1.1; the whole response, headers and body.
fn http_get(addr: SocketAddr, path: &str) -> Result<String, String> {
    let fail = |e: std::io::Error| format!("GET http://{addr}{path}: {e}");
    let mut s = TcpStream::connect_timeout(&addr, PROBE_TIMEOUT).map_err(fail)?;
    s.set_read_timeout(Some(PROBE_TIMEOUT)).map_err(fail)?;
    s.set_write_timeout(Some(PROBE_TIMEOUT)).map_err(fail)?;
    let req = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
    s.write_all(req.as_bytes()).map_err(fail)?;
    let mut resp = String::new();
    s.read_to_string(&mut resp).map_err(fail)?;
    Ok(resp)
}

/// Whether the etcd member at `addr` answers `GET /health` with `"health":"true"`; what it
/// answered instead.
fn health(addr: SocketAddr) -> Result<(), String> {
    let resp = http_get(addr, "/health")?;
    let body = resp.rsplit("\r\n\r\n").next().unwrap_or_default();
    match body.contains("\"health\":\"true\"") {
        true => Ok(()),
        false => Err(format!("it answered {}", body.trim())),
    }
}

// ---------------------------------------------------------------------------------------------
// etcd

/// An etcd cluster, one member per host.
#[derive(Debug)]
pub struct Etcd {
    members: Vec<EtcdMember>,
}

/// One etcd member: `e<i>` on its host, ports [`Etcd::CLIENT_PORT`] and [`Etcd::PEER_PORT`]
/// on the host's address (fixed ports are safe: the address is the run's own).
#[derive(Debug)]
pub struct EtcdMember {
    name: String,
    proc: Proc,
}

impl Etcd {
    pub const CLIENT_PORT: u16 = 2379;
    pub const PEER_PORT: u16 = 2380;

    /// Starts one member on each of `hosts` (1 or 3, usually), their data directories and
    /// logs under `dir` (`e<i>/data`, `e<i>.log`), and waits until each says it is healthy
    /// (which takes an elected leader).
    pub fn start(bin: &Path, hosts: &[&Host], dir: &Path) -> Result<Etcd> {
        if hosts.is_empty() {
            bail!("an etcd cluster needs at least one member");
        }
        let names: Vec<String> = (0..hosts.len()).map(|i| format!("e{i}")).collect();
        let initial = names
            .iter()
            .zip(hosts)
            .map(|(n, h)| format!("{n}={}", peer_url(h)))
            .collect::<Vec<_>>()
            .join(",");
        let mut etcd = Etcd {
            members: Vec::new(),
        };
        for (name, host) in names.iter().zip(hosts) {
            let args = member_args(name, host, &dir.join(name).join("data"), &initial);
            let log = dir.join(format!("{name}.log"));
            std::fs::create_dir_all(dir.join(name))
                .with_context(|| format!("cannot create {}", dir.join(name).display()))?;
            let what = format!("etcd member {name} ({})", host.name());
            let proc = Proc::new(what, host, bin, args, log);
            etcd.members.push(EtcdMember {
                name: name.clone(),
                proc,
            });
        }
        // All started before any is waited for: none is healthy before a quorum runs.
        for m in &mut etcd.members {
            m.proc.start()?;
        }
        for m in &mut etcd.members {
            m.wait_healthy()?;
        }
        Ok(etcd)
    }

    /// The members' client URLs, comma-separated: tarq's `--etcd`.
    pub fn client_urls(&self) -> String {
        let urls: Vec<String> = self.members.iter().map(EtcdMember::client_url).collect();
        urls.join(",")
    }

    pub fn members(&self) -> &[EtcdMember] {
        &self.members
    }

    pub fn member(&self, i: usize) -> &EtcdMember {
        &self.members[i]
    }

    pub fn member_mut(&mut self, i: usize) -> &mut EtcdMember {
        &mut self.members[i]
    }
}

/// A member's command line; `initial` is `--initial-cluster`, which a restart on an existing
/// data directory ignores (so the same arguments serve every start).
fn member_args(name: &str, host: &Host, data: &Path, initial: &str) -> Vec<OsString> {
    let client = client_url(host);
    let peer = peer_url(host);
    let token = format!("tarq-chaos-{}", std::process::id());
    [
        format!("--name={name}"),
        format!("--data-dir={}", data.display()),
        format!("--listen-client-urls={client}"),
        format!("--advertise-client-urls={client}"),
        format!("--listen-peer-urls={peer}"),
        format!("--initial-advertise-peer-urls={peer}"),
        format!("--initial-cluster={initial}"),
        "--initial-cluster-state=new".into(),
        format!("--initial-cluster-token={token}"),
    ]
    .into_iter()
    .map(OsString::from)
    .collect()
}

fn client_url(host: &Host) -> String {
    format!("http://{}", host.sockaddr(Etcd::CLIENT_PORT))
}

fn peer_url(host: &Host) -> String {
    format!("http://{}", host.sockaddr(Etcd::PEER_PORT))
}

impl EtcdMember {
    /// `e0`, `e1`, ...
    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn host(&self) -> &Host {
        self.proc.host()
    }

    /// `http://ADDR:2379`.
    pub fn client_url(&self) -> String {
        client_url(self.proc.host())
    }

    /// `kill -9` (its data directory stays).
    pub fn kill(&mut self) -> Result<()> {
        self.proc.kill()
    }

    /// Starts it again on the same data directory (killing it first if it still runs), and
    /// waits until its client port accepts connections. Not until it is healthy: that takes
    /// a quorum, which a fault may be keeping from it ([`EtcdMember::wait_healthy`] waits).
    pub fn restart(&mut self) -> Result<()> {
        self.proc.start()?;
        let addr = self.host().sockaddr(Etcd::CLIENT_PORT);
        self.proc
            .wait("accept connections", START_TIMEOUT, || accepts(addr))
    }

    /// Waits until `GET /health` answers `"health":"true"` (it is in a cluster with a leader).
    pub fn wait_healthy(&mut self) -> Result<()> {
        let addr = self.host().sockaddr(Etcd::CLIENT_PORT);
        let what = format!("answer GET http://{addr}/health with \"health\":\"true\"");
        self.proc.wait(&what, START_TIMEOUT, || health(addr))
    }

    /// One look at `GET /health`, asked from its own host: true when it says
    /// `"health":"true"`, false for any other answer or none.
    pub fn is_healthy(&self) -> Result<bool> {
        let addr = self.host().sockaddr(Etcd::CLIENT_PORT);
        self.host().in_thread(|| health(addr).is_ok())
    }

    /// SIGSTOP.
    pub fn pause(&self) -> Result<()> {
        self.proc.pause()
    }

    /// SIGCONT.
    pub fn resume(&self) -> Result<()> {
        self.proc.resume()
    }

    pub fn is_running(&mut self) -> bool {
        self.proc.is_running()
    }

    pub fn log_path(&self) -> &Path {
        self.proc.log_path()
    }

    pub fn log_tail(&self, lines: usize) -> String {
        self.proc.log_tail(lines)
    }
}

// ---------------------------------------------------------------------------------------------
// tarq

/// How to start a tarq node. The data directory is the caller's choice (a FUSE filesystem
/// that can lose unsynced writes may be mounted there); the log is kept apart from it, so a
/// simulated power loss never takes the evidence with it.
#[derive(Clone, Debug)]
pub struct NodeConfig {
    /// `--node-name`.
    pub name: String,
    /// `--cluster`.
    pub cluster: String,
    /// `--etcd`: comma-separated client URLs ([`Etcd::client_urls`]).
    pub etcd: String,
    /// `--data-dir`.
    pub data_dir: PathBuf,
    /// Where its stdout and stderr are appended.
    pub log: PathBuf,
    /// Flags after the standard ones: `--replica-set a --sync-replicas 1 --lease-ttl 2`.
    pub extra: Vec<String>,
    /// Its clocks, if they are to differ from the machine's.
    pub clocks: Clocks,
}

impl NodeConfig {
    /// A node `name` of `cluster` on `etcd`, its data in `dir/data` and its log `dir/tarq.log`.
    pub fn new(name: &str, cluster: &str, etcd: &str, dir: &Path) -> NodeConfig {
        NodeConfig {
            name: name.to_owned(),
            cluster: cluster.to_owned(),
            etcd: etcd.to_owned(),
            data_dir: dir.join("data"),
            log: dir.join("tarq.log"),
            extra: Vec::new(),
            clocks: Clocks::default(),
        }
    }

    /// Adds flags to [`NodeConfig::extra`].
    pub fn args<S: AsRef<str>>(mut self, args: &[S]) -> NodeConfig {
        self.extra
            .extend(args.iter().map(|a| a.as_ref().to_owned()));
        self
    }

    /// The command line on `host`.
    fn command_line(&self, host: &Host) -> Vec<OsString> {
        let addr = host.sockaddr(Node::PORT).to_string();
        let mut args: Vec<OsString> = vec![
            "--listen".into(),
            addr.clone().into(),
            "--data-dir".into(),
            self.data_dir.clone().into(),
            "--etcd".into(),
            self.etcd.clone().into(),
            "--cluster".into(),
            self.cluster.clone().into(),
            "--node-name".into(),
            self.name.clone().into(),
            "--advertise".into(),
            addr.into(),
        ];
        args.extend(self.extra.iter().map(OsString::from));
        args
    }
}

/// A tarq process on its host, listening on [`Node::PORT`] of the host's address.
#[derive(Debug)]
pub struct Node {
    cfg: NodeConfig,
    proc: Proc,
}

impl Node {
    pub const PORT: u16 = 3301;

    /// Starts `bin` on `host` as `cfg` says and waits until it answers (its greeting).
    pub fn start(bin: &Path, host: &Host, cfg: NodeConfig) -> Result<Node> {
        if let Some(parent) = cfg.log.parent() {
            std::fs::create_dir_all(parent)
                .with_context(|| format!("cannot create {}", parent.display()))?;
        }
        let what = format!("tarq node {} ({})", cfg.name, host.name());
        let proc = Proc::new(what, host, bin, cfg.command_line(host), cfg.log.clone())
            .with_clocks(cfg.clocks.clone());
        let mut node = Node { cfg, proc };
        node.restart()?;
        Ok(node)
    }

    pub fn name(&self) -> &str {
        &self.cfg.name
    }

    pub fn host(&self) -> &Host {
        self.proc.host()
    }

    /// Where clients reach it: the host's address, port [`Node::PORT`].
    pub fn addr(&self) -> SocketAddr {
        self.host().sockaddr(Node::PORT)
    }

    pub fn config(&self) -> &NodeConfig {
        &self.cfg
    }

    pub fn data_dir(&self) -> &Path {
        &self.cfg.data_dir
    }

    pub fn log_path(&self) -> &Path {
        self.proc.log_path()
    }

    pub fn log_tail(&self, lines: usize) -> String {
        self.proc.log_tail(lines)
    }

    pub fn pid(&self) -> Option<u32> {
        self.proc.pid()
    }

    /// `kill -9` (its data directory stays).
    pub fn kill(&mut self) -> Result<()> {
        self.proc.kill()
    }

    /// Starts it again on the same data directory (killing it first if it still runs) and
    /// waits until it answers.
    pub fn restart(&mut self) -> Result<()> {
        self.proc.start()?;
        self.wait_ready()
    }

    /// Waits until it sends its greeting on a new connection. Only that: whether it leads,
    /// follows or waits for etcd is the caller's question (`queue.cluster()`).
    pub fn wait_ready(&mut self) -> Result<()> {
        let addr = self.addr();
        let what = format!("greet a client at {addr}");
        self.proc.wait(&what, START_TIMEOUT, || {
            Client::connect_addr(addr, PROBE_TIMEOUT)
                .map(drop)
                .map_err(|e| e.to_string())
        })
    }

    /// SIGSTOP.
    pub fn pause(&self) -> Result<()> {
        self.proc.pause()
    }

    /// SIGCONT.
    pub fn resume(&self) -> Result<()> {
        self.proc.resume()
    }

    pub fn is_running(&mut self) -> bool {
        self.proc.is_running()
    }

    /// A client connected to it from host `from` (the socket is `from`'s; the client can be
    /// used from any thread), replies waited for at most `timeout`.
    pub fn connect(&self, from: &Host, timeout: Duration) -> Result<Client> {
        let addr = self.addr();
        from.in_thread(|| Client::connect_addr(addr, timeout))?
            .with_context(|| format!("from {} to {}", from.name(), self.cfg.name))
    }
}
