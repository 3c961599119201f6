//! The systems under test and how to start them: our `tarq` release build (also in its `--null`
//! mode, the loadgen's ceiling, and with its beanstalk port), Debian's `tarantool` running the
//! reference queue or the original tarantool/queue 1.5.0, `beanstalkd` (in memory or with its
//! binlog) and `redis-server`. `--spawn` starts one on a fresh temporary data directory, pinned
//! to one core, waits until it answers (with a deadline), and stops it when the run is over.
//! A target binds port 0 and the loadgen learns the port it got: tarq says it in its log, the
//! others' is read from `/proc` (`tarq_testkit::ports`); only Redis, for which port 0 means no
//! TCP at all, gets a port held for it here (`Refusing::reserve`) and is checked to listen there.
//! The originals Tarantool runs are found by `tarq_testkit::reference`; a target whose program
//! or original is missing fails with [`CannotStart`], which the suite does not try again.

use anyhow::{anyhow, bail, Context, Result};
use rustix::process::{kill_process, Pid, Signal};
use serde::{Deserialize, Serialize};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use tarq_testkit::ports::{self, Refusing};
use tarq_testkit::reference::{self, Original};

/// How long a spawned target gets to answer: Tarantool needs about a second to create its
/// spaces; a debug build of tarq or a loaded machine more.
const READY_TIMEOUT: Duration = Duration::from_secs(30);
/// Pause between readiness probes: short against the start-up times above, long enough not to
/// flood the starting process with connections.
const PROBE_INTERVAL: Duration = Duration::from_millis(25);
/// Grace period after SIGTERM before SIGKILL.
const STOP_TIMEOUT: Duration = Duration::from_secs(5);
/// Time allowed for one probe connection's round trip.
const PROBE_IO_TIMEOUT: Duration = Duration::from_secs(2);
/// Why a target cannot be started here at all: its program is not installed, or the original it
/// runs is absent. Trying again cannot help, unlike a run that failed.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct CannotStart(pub String);

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum Target {
    /// tarq over IPROTO.
    Tarq,
    /// Debian's Tarantool running the reference queue, over IPROTO.
    Tarantool,
    /// The original tarantool/queue 1.5.0 on Debian's Tarantool (serve.lua), over IPROTO: the
    /// tubes API.
    TarantoolQueue,
    /// beanstalkd in memory: put / reserve-with-timeout / delete.
    Beanstalkd,
    /// beanstalkd with its binlog (`-b` in the temporary data directory).
    BeanstalkdBinlog,
    /// tarq's beanstalk port (`--beanstalk-listen`), the same commands as beanstalkd.
    TarqBeanstalk,
    /// Redis reliable queue: LPUSH / BLMOVE into a processing list / LREM.
    Redis,
    /// tarq --null: every call answered at once with an empty result (the loadgen's ceiling).
    Null,
}

/// The wire protocol a target speaks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Protocol {
    Iproto,
    Beanstalk,
    Resp,
}

impl Target {
    pub const ALL: [Target; 8] = [
        Target::Tarq,
        Target::Tarantool,
        Target::TarantoolQueue,
        Target::Beanstalkd,
        Target::BeanstalkdBinlog,
        Target::TarqBeanstalk,
        Target::Redis,
        Target::Null,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Target::Tarq => "tarq",
            Target::Tarantool => "tarantool",
            Target::TarantoolQueue => "tarantool-queue",
            Target::Beanstalkd => "beanstalkd",
            Target::BeanstalkdBinlog => "beanstalkd-binlog",
            Target::TarqBeanstalk => "tarq-beanstalk",
            Target::Redis => "redis",
            Target::Null => "null",
        }
    }

    pub fn protocol(self) -> Protocol {
        match self {
            Target::Tarq | Target::Tarantool | Target::TarantoolQueue | Target::Null => {
                Protocol::Iproto
            }
            Target::Beanstalkd | Target::BeanstalkdBinlog | Target::TarqBeanstalk => {
                Protocol::Beanstalk
            }
            Target::Redis => Protocol::Resp,
        }
    }

    /// True for tarq in any of its modes (our own binary, not a peer).
    pub fn is_tarq(self) -> bool {
        matches!(self, Target::Tarq | Target::TarqBeanstalk | Target::Null)
    }

    /// The port a target listens on by default, for `--addr` without `--spawn`.
    pub fn default_port(self) -> u16 {
        match self {
            Target::Tarq | Target::Tarantool | Target::Null => 3301,
            // serve.lua's own default, so it can run beside a seed reference on 3301.
            Target::TarantoolQueue => 3302,
            Target::Beanstalkd | Target::BeanstalkdBinlog | Target::TarqBeanstalk => 11300,
            Target::Redis => 6379,
        }
    }

    /// Debian package and program for the peers; `None` for our own binary.
    pub fn package(self) -> Option<(&'static str, &'static str)> {
        match self {
            Target::Tarantool | Target::TarantoolQueue => Some(("tarantool", "tarantool")),
            Target::Beanstalkd | Target::BeanstalkdBinlog => Some(("beanstalkd", "beanstalkd")),
            Target::Redis => Some(("redis-server", "redis-server")),
            Target::Tarq | Target::TarqBeanstalk | Target::Null => None,
        }
    }

    /// True when the target is Tarantool running a Lua script, which takes no arguments.
    pub fn is_lua_script(self) -> bool {
        matches!(self, Target::Tarantool | Target::TarantoolQueue)
    }

    /// `None` when the target can be started here, else why not: the program with its install
    /// line, or the original it runs with where to get it.
    pub fn unavailable(self) -> Option<String> {
        if let Some((package, program)) = self.package() {
            if find_in_path(program).is_none() {
                return Some(format!(
                    "{program} is not installed; install it with: apt-get install -y {package}"
                ));
            }
        }
        self.original()
            .and_then(|o| reference::locate(o, &workspace_root()).err())
    }

    /// The original a target runs on Tarantool, when it runs one.
    pub fn original(self) -> Option<Original> {
        match self {
            Target::Tarantool => Some(Original::SeedQueue),
            Target::TarantoolQueue => Some(Original::TarantoolQueue),
            _ => None,
        }
    }
}

impl std::fmt::Display for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// How to start a target.
#[derive(Clone, Debug)]
pub struct SpawnOptions {
    /// Pin the target to this core.
    pub cpu: Option<usize>,
    /// The tarq binary; default `<workspace>/target/release/tarq`.
    pub tarq_bin: Option<PathBuf>,
    /// Run `cargo build --release -p tarq-net` first even if the binary exists (the suite does,
    /// so it never measures a stale build; cargo makes it a no-op when nothing changed).
    pub rebuild: bool,
    /// Extra arguments after the loadgen's own (WAL mode, snapshot settings, persistence).
    pub args: Vec<String>,
}

/// A started target; stopped when dropped.
pub struct Spawned {
    pub target: Target,
    pub addr: SocketAddr,
    child: Child,
    log: PathBuf,
    /// The port held for a target that cannot bind port 0 (Redis).
    _port: Option<Refusing>,
    // Kept for its Drop: the temporary directory (the data, unless given, and the log)
    // disappears with the target.
    _dir: tempfile::TempDir,
}

impl Spawned {
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Stop with SIGTERM, then SIGKILL after a grace period.
    pub fn stop(mut self) -> Result<()> {
        self.terminate()
    }

    fn terminate(&mut self) -> Result<()> {
        if self.child.try_wait()?.is_some() {
            return Ok(());
        }
        // Our own child, not reaped yet (try_wait above): its pid is still its own. An error
        // (it just exited) is met below, by the wait and then the kill.
        let _ = kill_process(Pid::from_child(&self.child), Signal::TERM);
        let deadline = Instant::now() + STOP_TIMEOUT;
        while Instant::now() < deadline {
            if self.child.try_wait()?.is_some() {
                return Ok(());
            }
            std::thread::sleep(PROBE_INTERVAL);
        }
        self.child.kill()?;
        self.child.wait()?;
        Ok(())
    }

    /// The last lines of the target's log, for error messages.
    pub fn log_tail(&self) -> String {
        log_tail(&self.log)
    }
}

impl Drop for Spawned {
    fn drop(&mut self) {
        let _ = self.terminate();
    }
}

/// The workspace root (where `target/` and `results/` live).
pub fn workspace_root() -> PathBuf {
    let built_in = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    if built_in.join("Cargo.toml").exists() {
        built_in.canonicalize().unwrap_or(built_in)
    } else {
        std::env::current_dir().unwrap_or_else(|_| PathBuf::from("."))
    }
}

/// The tarq release binary, built when missing (or always with `rebuild`).
pub fn tarq_binary(opts: &SpawnOptions) -> Result<PathBuf> {
    if let Some(bin) = &opts.tarq_bin {
        // The target starts in its data directory: a relative path would not resolve there.
        return bin
            .canonicalize()
            .with_context(|| format!("--tarq-bin {}", bin.display()));
    }
    let root = workspace_root();
    let bin = root.join("target/release/tarq");
    if opts.rebuild || !bin.exists() {
        eprintln!("building the tarq release binary: cargo build --release -p tarq-net");
        let status = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
            .args(["build", "--release", "-p", "tarq-net"])
            .current_dir(&root)
            .status()
            .context("running cargo build --release -p tarq-net")?;
        if !status.success() {
            bail!("cargo build --release -p tarq-net failed ({status})");
        }
    }
    if !bin.exists() {
        bail!("{} does not exist after the build", bin.display());
    }
    Ok(bin)
}

/// Start `target` on a port of its own and a fresh data directory and wait until it answers.
pub fn spawn(target: Target, opts: &SpawnOptions) -> Result<Spawned> {
    spawn_in(target, opts, None)
}

/// [`spawn`], with the data in `data_dir` when given: kept after the target stops, so the
/// next start recovers from it (the restart loop). The log goes to a temporary directory.
pub fn spawn_in(target: Target, opts: &SpawnOptions, data_dir: Option<&Path>) -> Result<Spawned> {
    if let Some(why) = target.unavailable() {
        return Err(CannotStart(why).into());
    }
    if !opts.args.is_empty() && target.is_lua_script() {
        return Err(CannotStart(format!(
            "{target} runs a Lua script on Tarantool, which takes no extra arguments"
        ))
        .into());
    }
    let dir = tempfile::Builder::new()
        .prefix(&format!("tarq-loadgen-{}-", target.name()))
        .tempdir()
        .context("creating a temporary data directory")?;
    let data = data_dir.unwrap_or(dir.path());
    // Port 0 but for Redis, where it means no TCP listener at all: its port is held for it.
    let held = (target == Target::Redis).then(Refusing::reserve);
    let addr: SocketAddr = held.as_ref().map_or(([127, 0, 0, 1], 0).into(), |h| h.addr);
    let log = dir.path().join(format!("{}.log", target.name()));
    let mut cmd = command(target, opts, data, addr, &log)?;
    cmd.args(&opts.args);
    let log_file = std::fs::File::create(if target.is_lua_script() {
        dir.path().join("stdout.log")
    } else {
        log.clone()
    })?;
    cmd.current_dir(dir.path())
        .stdin(Stdio::null())
        .stdout(log_file.try_clone()?)
        .stderr(log_file);
    if let Some(cpu) = opts.cpu {
        tarq_affinity::pin_child(&mut cmd, cpu);
    }
    let child = cmd
        .spawn()
        .with_context(|| format!("starting {target}: {cmd:?}"))?;
    let spawned = Spawned {
        target,
        addr,
        child,
        log,
        _port: held,
        _dir: dir,
    };
    wait_ready(spawned)
}

/// The command line that starts `target` listening on `addr` (port 0 but for Redis) with its
/// data in `dir`.
fn command(
    target: Target,
    opts: &SpawnOptions,
    dir: &Path,
    addr: SocketAddr,
    log: &Path,
) -> Result<Command> {
    let port = addr.port().to_string();
    let cmd = match target {
        Target::Tarq | Target::Null => {
            let mut c = Command::new(tarq_binary(opts)?);
            if target == Target::Null {
                c.arg("--null");
            }
            c.arg("--listen")
                .arg(addr.to_string())
                .arg("--data-dir")
                .arg(dir);
            c
        }
        Target::TarqBeanstalk => {
            // The measured port is the beanstalk one; IPROTO listens on a port of its own.
            let mut c = Command::new(tarq_binary(opts)?);
            c.arg("--listen")
                .arg(addr.to_string())
                .arg("--beanstalk-listen")
                .arg(addr.to_string())
                .arg("--data-dir")
                .arg(dir);
            c
        }
        Target::Tarantool | Target::TarantoolQueue => {
            let original = target
                .original()
                .expect("a Tarantool target runs an original");
            let script = reference::locate(original, &workspace_root()).map_err(CannotStart)?;
            let mut c = Command::new("tarantool");
            c.arg(script)
                .env("WORKDIR", dir)
                .env("LISTEN", addr.to_string())
                .env("LOGFILE", log);
            c
        }
        Target::Beanstalkd | Target::BeanstalkdBinlog => {
            let mut c = Command::new("beanstalkd");
            c.args(["-l", "127.0.0.1", "-p", &port]);
            if target == Target::BeanstalkdBinlog {
                c.arg("-b").arg(dir);
            }
            c
        }
        Target::Redis => {
            let mut c = Command::new("redis-server");
            c.args([
                "--bind",
                "127.0.0.1",
                "--port",
                &port,
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
            ])
            .arg(dir);
            c
        }
    };
    Ok(cmd)
}

/// Where the target serves, once it says or listens: tarq names its address in its log (the
/// beanstalk one for tarq-beanstalk); the port of beanstalkd or Tarantool, started on port 0, is
/// the one its process listens on; Redis must be the process listening on the port it was
/// given. `None` until then.
fn served_addr(spawned: &Spawned) -> Option<SocketAddr> {
    let pid = spawned.pid();
    match spawned.target {
        Target::Tarq | Target::Null => addr_in_log(&spawned.log, "tarq serving"),
        Target::TarqBeanstalk => addr_in_log(&spawned.log, "serving the beanstalk protocol"),
        Target::Redis => ports::listens_on(pid, spawned.addr.port()).then_some(spawned.addr),
        Target::Tarantool
        | Target::TarantoolQueue
        | Target::Beanstalkd
        | Target::BeanstalkdBinlog => match ports::listening_ports(pid).ok()?[..] {
            [port] => Some(([127, 0, 0, 1], port).into()),
            _ => None,
        },
    }
}

/// The address after `listen=` on the first line of the log at `path` that holds `needle`.
fn addr_in_log(path: &Path, needle: &str) -> Option<SocketAddr> {
    let text = std::fs::read_to_string(path).ok()?;
    let line = text.lines().find(|l| l.contains(needle))?;
    let rest = &line[line.find("listen=")? + "listen=".len()..];
    rest.split_whitespace().next()?.parse().ok()
}

/// Probe until the target answers, it exits, or `READY_TIMEOUT` passes.
fn wait_ready(mut spawned: Spawned) -> Result<Spawned> {
    let target = spawned.target;
    let deadline = Instant::now() + READY_TIMEOUT;
    let mut known = None;
    loop {
        if let Some(status) = spawned.child.try_wait()? {
            bail!(
                "{target} exited during start-up ({status}); its log ends with:\n{}",
                spawned.log_tail()
            );
        }
        if known.is_none() {
            known = served_addr(&spawned);
        }
        let result = match known {
            Some(addr) => probe(target, addr),
            None => Err(anyhow!("not listening yet")),
        };
        match result {
            Ok(()) => {
                spawned.addr = known.expect("probed an address");
                return Ok(spawned);
            }
            Err(e) if Instant::now() >= deadline => {
                let _ = spawned.terminate();
                bail!(
                    "{target} did not answer on {} within {READY_TIMEOUT:?} (last probe: {e:#}); its log ends with:\n{}",
                    known.map_or("its port".to_string(), |a| a.to_string()),
                    spawned.log_tail()
                );
            }
            Err(_) => std::thread::sleep(PROBE_INTERVAL),
        }
    }
}

/// One readiness check: the target answers a real request (for Tarantool, a call into the
/// queue module, since it listens before the module is loaded).
pub fn probe(target: Target, addr: SocketAddr) -> Result<()> {
    let mut s = TcpStream::connect_timeout(&addr, PROBE_IO_TIMEOUT)?;
    s.set_read_timeout(Some(PROBE_IO_TIMEOUT))?;
    s.set_write_timeout(Some(PROBE_IO_TIMEOUT))?;
    match target.protocol() {
        Protocol::Iproto => {
            // The original tarantool/queue has no `queue.stats`; `queue.state` is its own.
            let function = if target == Target::TarantoolQueue {
                "queue.state"
            } else {
                "queue.stats"
            };
            crate::proto::iproto::probe(s, PROBE_IO_TIMEOUT, function)
        }
        Protocol::Resp => expect_reply(&mut s, b"PING\r\n", b"+PONG"),
        Protocol::Beanstalk => expect_reply(&mut s, b"stats\r\n", b"OK "),
    }
}

/// The leader of a running tarq cluster and every address known (see
/// [`crate::proto::iproto::leader`]); the tube of a tubes-API run is created on it.
pub fn leader(
    addrs: Vec<String>,
    tube: Option<&crate::proto::iproto::Tube>,
) -> Result<(String, Vec<String>)> {
    crate::proto::iproto::leader(addrs, PROBE_IO_TIMEOUT, tube)
}

/// Create the tube a tubes-API run drives, on a target that is up.
pub fn create_tube(addr: SocketAddr, tube: &crate::proto::iproto::Tube) -> Result<()> {
    let s = TcpStream::connect_timeout(&addr, PROBE_IO_TIMEOUT)
        .with_context(|| format!("connecting to {addr} to create tube {:?}", tube.name))?;
    crate::proto::iproto::create_tube(s, PROBE_IO_TIMEOUT, tube)
}

fn expect_reply(s: &mut TcpStream, request: &[u8], prefix: &[u8]) -> Result<()> {
    s.write_all(request)?;
    let mut buf = [0u8; 64];
    let mut got = 0;
    while got < prefix.len() {
        let n = s.read(&mut buf[got..])?;
        if n == 0 {
            bail!("connection closed after {got} bytes");
        }
        got += n;
    }
    if &buf[..prefix.len()] != prefix {
        bail!(
            "expected {:?}, got {:?}",
            String::from_utf8_lossy(prefix),
            String::from_utf8_lossy(&buf[..got])
        );
    }
    Ok(())
}

/// Online cores of the machine, not the affinity mask a pinned loadgen sees: the kernel's list
/// of online cores ("0-3,6"), which is what glibc's `_SC_NPROCESSORS_ONLN` reads.
pub fn online_cores() -> usize {
    std::fs::read_to_string("/sys/devices/system/cpu/online")
        .map(|list| cores_in_list(list.trim()))
        .unwrap_or(1)
        .max(1)
}

/// How many cores a kernel CPU list ("0-3,6") names.
fn cores_in_list(list: &str) -> usize {
    list.split(',')
        .filter_map(|range| {
            let (first, last) = range.split_once('-').unwrap_or((range, range));
            let (first, last): (usize, usize) = (first.parse().ok()?, last.parse().ok()?);
            last.checked_sub(first).map(|n| n + 1)
        })
        .sum()
}

fn find_in_path(program: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join(program))
        .find(|p| p.is_file())
}

fn log_tail(path: &Path) -> String {
    /// Lines of a target's log quoted in an error.
    const TAIL_LINES: usize = 15;
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(TAIL_LINES)..].join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cpu_list_counts_its_ranges_and_single_cores() {
        for (list, cores) in [("0", 1), ("0-3", 4), ("0-3,6", 5), ("0,2,4-5", 4), ("", 0)] {
            assert_eq!(cores_in_list(list), cores, "{list:?}");
        }
        assert!(online_cores() >= 1);
    }
}
