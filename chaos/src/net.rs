//! The harness's network: every etcd member, tarq node and client of a run is a host in a
//! network namespace of its own, wired by a veth pair to a Linux bridge in one more namespace
//! (the "switch"), with an address in [`SUBNET`]. Nothing is added to the root namespace: the
//! subnet, its routes and the bridge exist only inside the run's namespaces, so two runs at once
//! (each with the same addresses) never clash, and the machine's own networking is untouched.
//!
//! Faults are nftables rules in a table of our own in each host's namespace ([`TABLE`]); healing
//! flushes that table. The alternatives fall short: stopping or killing processes is not a
//! network fault, and a proxy in front of each port only cuts what goes through it (not etcd's
//! peer traffic, not connections already open when the fault starts). A rule in the kernel drops
//! the packets themselves, of new and established connections alike, and the processes cannot
//! tell a dropped packet from a lost one: they see exactly what a real partition shows them,
//! retransmissions, timeouts and elections. Each drop is made by the receiving host, at its
//! `input` hook (`ip saddr PEER drop`), so both directions are cut and the packet has left its
//! sender as a lost one would have: a drop at the sender's `output` hook is a local error
//! instead (a UDP send fails with EPERM, TCP retries on another timer than for a loss).
//!
//! Namespace names are `tqc-<pid>-<run>` (the switch) and `tqc-<pid>-<run>-<host>`: the pid
//! says whose they are, so [`Net::clean_stale`] can remove what a run that died left behind,
//! and the run id keeps two `Net`s of one process (tests running on threads) apart.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::Write;
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::os::fd::AsRawFd;
use std::process::{Command, Stdio};
use std::sync::Mutex;

use anyhow::{anyhow, bail, Context, Result};

/// The prefix of every namespace the harness makes.
pub const PREFIX: &str = "tqc";
/// The first three octets of the hosts' /24: host `i` (from 0) gets `.i+1`.
pub const SUBNET: [u8; 3] = [10, 77, 0];
/// The nftables table (family `inet`) each host's faults live in.
pub const TABLE: &str = "chaos";
/// The most hosts one `Net` holds: the usable addresses of the /24 (.1 to .254).
pub const MAX_HOSTS: usize = 254;

/// Where `ip netns` keeps a namespace's handle (its bind mount).
const NETNS_DIR: &str = "/run/netns";
/// The bridge's name inside the switch namespace.
const BRIDGE: &str = "br0";
/// A host's end of its veth pair, inside the host's namespace.
const HOST_IF: &str = "eth0";

/// One host: a namespace with an address on the run's bridge. Plain data, cheap to clone and
/// to send to another thread; it stays valid as long as the [`Net`] that made it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Host {
    name: String,
    ns: String,
    addr: Ipv4Addr,
}

impl Host {
    /// The name it was added with.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Its namespace's name (as `ip netns` knows it).
    pub fn ns(&self) -> &str {
        &self.ns
    }

    /// Its address on the bridge.
    pub fn addr(&self) -> Ipv4Addr {
        self.addr
    }

    /// Its address with `port`.
    pub fn sockaddr(&self, port: u16) -> SocketAddr {
        SocketAddr::V4(SocketAddrV4::new(self.addr, port))
    }

    /// A command running `program` inside this host's namespace (`ip netns exec NS program`);
    /// `ip` execs the program, so the child's pid is the program's own.
    pub fn command(&self, program: impl AsRef<std::ffi::OsStr>) -> Command {
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", &self.ns]).arg(program);
        cmd
    }

    /// Moves the calling thread, and only it, into this host's namespace: sockets it opens from
    /// now on are this host's, and stay so whichever thread later uses them. There is no way
    /// back; a thread meant to act as a host is started for it ([`Host::in_thread`]).
    pub fn enter_current_thread(&self) -> Result<()> {
        let path = format!("{NETNS_DIR}/{}", self.ns);
        let handle = File::open(&path).with_context(|| format!("cannot open {path}"))?;
        // SAFETY: setns only reads the descriptor, which `handle` keeps open for the call;
        // CLONE_NEWNET changes the namespace of the calling thread alone.
        let rc = unsafe { libc::setns(handle.as_raw_fd(), libc::CLONE_NEWNET) };
        if rc != 0 {
            let e = std::io::Error::last_os_error();
            bail!("setns({path}, CLONE_NEWNET) failed: {e} (it needs root)");
        }
        Ok(())
    }

    /// Runs `f` on a new thread inside this host's namespace and returns what it returned (a
    /// panic in `f` is the caller's). Sockets `f` makes, returned, remain this host's.
    pub fn in_thread<T: Send>(&self, f: impl FnOnce() -> T + Send) -> Result<T> {
        std::thread::scope(|s| {
            let thread = s.spawn(|| self.enter_current_thread().map(|()| f()));
            thread
                .join()
                .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
        })
    }
}

/// A run's network: the switch namespace with its bridge, and the hosts added to it. Dropped,
/// it kills whatever still runs in its namespaces and deletes them.
#[derive(Debug)]
pub struct Net {
    /// `tqc-<pid>-<run>`: the switch's namespace, and the start of every host's.
    switch: String,
    hosts: Mutex<Vec<Host>>,
}

impl Net {
    /// Makes the switch namespace of run `run_id` (letters, digits and `_`; unique among the
    /// `Net`s of this process) with its bridge up. Call [`Net::clean_stale`] first to remove
    /// what interrupted runs left.
    pub fn create(run_id: &str) -> Result<Net> {
        check_name("run id", run_id)?;
        let switch = format!("{PREFIX}-{}-{run_id}", std::process::id());
        ip(&["netns", "add", &switch])?;
        // From here on a failure leaves a namespace: the Net's drop removes it.
        let net = Net {
            switch,
            hosts: Mutex::new(Vec::new()),
        };
        let sw = net.switch.as_str();
        ip(&["-n", sw, "link", "set", "lo", "up"])?;
        ip(&["-n", sw, "link", "add", BRIDGE, "type", "bridge"])?;
        ip(&["-n", sw, "link", "set", BRIDGE, "up"])?;
        Ok(net)
    }

    /// The switch's namespace, the prefix of every host's.
    pub fn switch_ns(&self) -> &str {
        &self.switch
    }

    /// The hosts added so far, in order.
    pub fn hosts(&self) -> Vec<Host> {
        self.lock_hosts().clone()
    }

    /// Adds host `name` (letters, digits and `_`, unique in this run): its namespace with `lo`
    /// up, a veth pair to the bridge, the next address of [`SUBNET`], and an empty [`TABLE`].
    pub fn add_host(&self, name: &str) -> Result<Host> {
        check_name("host name", name)?;
        let mut hosts = self.lock_hosts();
        if hosts.iter().any(|h| h.name == name) {
            bail!("host {name} already exists in {}", self.switch);
        }
        let index = hosts.len();
        if index >= MAX_HOSTS {
            bail!("at most {MAX_HOSTS} hosts fit the /24 of one run");
        }
        let [a, b, c] = SUBNET;
        let host = Host {
            name: name.to_owned(),
            ns: format!("{}-{name}", self.switch),
            addr: Ipv4Addr::new(a, b, c, index as u8 + 1),
        };
        ip(&["netns", "add", &host.ns])?;
        // Listed before it is wired, so a failure below still leaves it to the drop.
        hosts.push(host.clone());
        drop(hosts);
        self.wire(&host, index)?;
        install_table(&host)?;
        Ok(host)
    }

    /// Joins `host` to the bridge and gives it its address. The pair is made inside the switch
    /// namespace with its other end moved straight into the host's, so the root namespace
    /// never sees an interface (and two runs' interface names never meet).
    fn wire(&self, host: &Host, index: usize) -> Result<()> {
        let sw = self.switch.as_str();
        let port = format!("v{index}");
        ip(&[
            "-n", sw, "link", "add", &port, "type", "veth", "peer", "name", HOST_IF, "netns",
            &host.ns,
        ])?;
        ip(&["-n", sw, "link", "set", &port, "master", BRIDGE, "up"])?;
        let ns = host.ns.as_str();
        let cidr = format!("{}/24", host.addr);
        ip(&["-n", ns, "addr", "add", &cidr, "dev", HOST_IF])?;
        ip(&["-n", ns, "link", "set", HOST_IF, "up"])?;
        ip(&["-n", ns, "link", "set", "lo", "up"])?;
        Ok(())
    }

    /// Hosts in different groups of `groups` exchange no packets at all (each direction dropped
    /// by its receiver); hosts within a group, and hosts not listed, are unaffected. Adds to
    /// the faults already in place.
    pub fn partition(&self, groups: &[Vec<&Host>]) -> Result<()> {
        self.check_groups(groups)?;
        let mut drops = Vec::new();
        for (i, group) in groups.iter().enumerate() {
            for other in &groups[i + 1..] {
                for a in group {
                    for b in other {
                        drops.push(Rule::both(a, b, 100));
                    }
                }
            }
        }
        self.apply(drops.into_iter().flatten())
    }

    /// `a` and `b` exchange no packets; everything else is as it was. Composable: cutting A–C
    /// alone leaves A–B and B–C working (a "bridge" through B that is not transitive).
    pub fn cut(&self, a: &Host, b: &Host) -> Result<()> {
        self.check_hosts(&[a, b])?;
        if a == b {
            bail!("cannot cut {} from itself", a.name);
        }
        self.apply(Rule::both(a, b, 100))
    }

    /// Each packet between `host` and each of `peers`, either way, is dropped with probability
    /// `percent`/100 (nftables `numgen random mod 100 < percent`); 100 drops them all.
    pub fn loss(&self, host: &Host, peers: &[&Host], percent: u8) -> Result<()> {
        if percent > 100 {
            bail!("loss of {percent}%: at most 100");
        }
        self.check_hosts(&[host])?;
        self.check_hosts(peers)?;
        let drops = peers.iter().flat_map(|p| Rule::both(host, p, percent));
        self.apply(drops)
    }

    /// Removes every fault from every host (flushes each host's [`TABLE`]).
    pub fn heal(&self) -> Result<()> {
        for host in self.hosts() {
            nft(&host, &format!("flush table inet {TABLE}\n"))?;
        }
        Ok(())
    }

    /// Installs `drops`, one `nft -f` batch per receiving host (each batch is atomic).
    fn apply(&self, drops: impl IntoIterator<Item = Rule>) -> Result<()> {
        let mut by_host: BTreeMap<String, (Host, String)> = BTreeMap::new();
        for d in drops {
            let entry = by_host
                .entry(d.at.ns.clone())
                .or_insert_with(|| (d.at.clone(), String::new()));
            entry.1.push_str(&d.nft_line());
        }
        for (host, script) in by_host.values() {
            nft(host, script)?;
        }
        Ok(())
    }

    /// Every host of `groups` is this run's, and none is in two groups.
    fn check_groups(&self, groups: &[Vec<&Host>]) -> Result<()> {
        let all: Vec<&Host> = groups.iter().flatten().copied().collect();
        self.check_hosts(&all)?;
        for (i, h) in all.iter().enumerate() {
            if all[..i].contains(h) {
                bail!("host {} is in two groups of the partition", h.name);
            }
        }
        Ok(())
    }

    /// Every host of `hosts` was added to this `Net` (not to another run's).
    fn check_hosts(&self, hosts: &[&Host]) -> Result<()> {
        let mine = self.lock_hosts();
        match hosts.iter().find(|h| !mine.contains(h)) {
            Some(h) => Err(anyhow!(
                "host {} ({}) is not in {}",
                h.name,
                h.ns,
                self.switch
            )),
            None => Ok(()),
        }
    }

    fn lock_hosts(&self) -> std::sync::MutexGuard<'_, Vec<Host>> {
        // The list is only ever pushed to: a panic elsewhere cannot leave it half changed.
        self.hosts.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Deletes the namespaces (and kills what runs in them) of runs whose process is gone: the
    /// ones named `tqc-<pid>-...` with no process `pid`. The current process's are left alone,
    /// as are those of any process alive. Returns the names deleted.
    pub fn clean_stale() -> Result<Vec<String>> {
        let mut removed = Vec::new();
        for ns in list_namespaces()? {
            let Some(pid) = owner_pid(&ns) else { continue };
            if pid == std::process::id() || pid_alive(pid) {
                continue;
            }
            remove_namespace(&ns)?;
            removed.push(ns);
        }
        Ok(removed)
    }
}

/// What building a `Net` needs that this machine lacks, each named with where to get it:
/// root, `ip` and `nft`. Empty when a `Net` can be made.
pub fn missing() -> Vec<String> {
    let mut missing = Vec::new();
    // SAFETY: geteuid has no preconditions and cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        missing.push("root (network namespaces and nftables need it)".to_owned());
    }
    for (tool, package) in [("ip", "iproute2"), ("nft", "nftables")] {
        let found = std::env::var_os("PATH")
            .iter()
            .flat_map(std::env::split_paths)
            .any(|d| d.join(tool).is_file());
        if !found {
            missing.push(format!("{tool} (Debian package {package})"));
        }
    }
    missing
}

impl Drop for Net {
    fn drop(&mut self) {
        // Hosts first: their veth ends go with them, then the switch holds nothing.
        let hosts = std::mem::take(&mut *self.lock_hosts());
        let names = hosts.iter().map(|h| h.ns.clone()).rev();
        for ns in names.chain([self.switch.clone()]) {
            if let Err(e) = remove_namespace(&ns) {
                eprintln!("tarq-chaos: cannot remove namespace {ns}: {e:#}");
            }
        }
    }
}

/// One drop rule: packets from `from` arriving at `at`, with probability `percent`/100.
struct Rule {
    at: Host,
    from: Ipv4Addr,
    percent: u8,
}

impl Rule {
    /// The two rules that stop traffic between `a` and `b` both ways.
    fn both(a: &Host, b: &Host, percent: u8) -> [Rule; 2] {
        let one = |at: &Host, from: &Host| Rule {
            at: at.clone(),
            from: from.addr,
            percent,
        };
        [one(a, b), one(b, a)]
    }

    /// The rule as a line of an `nft -f` script.
    fn nft_line(&self) -> String {
        // No connection tracking state is matched: established connections lose their
        // packets as new ones do.
        let chance = if self.percent >= 100 {
            String::new()
        } else {
            format!("numgen random mod 100 < {} ", self.percent)
        };
        format!(
            "add rule inet {TABLE} input ip saddr {} {chance}drop\n",
            self.from
        )
    }
}

/// Creates the host's empty fault table: an `input` chain that accepts by default.
fn install_table(host: &Host) -> Result<()> {
    let script = format!(
        "table inet {TABLE} {{\n  chain input {{ type filter hook input priority 0; policy accept; }}\n}}\n"
    );
    nft(host, &script).map(|_| ())
}

/// Letters, digits and `_`: safe in a namespace name and unambiguous between the `-`s.
fn check_name(what: &str, name: &str) -> Result<()> {
    let ok = !name.is_empty()
        && name.len() <= 32
        && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
    if !ok {
        bail!("{what} {name:?}: 1 to 32 letters, digits or _");
    }
    Ok(())
}

/// The namespaces `ip netns list` shows (its lines are `NAME` or `NAME (id: N)`).
fn list_namespaces() -> Result<Vec<String>> {
    let out = ip(&["netns", "list"])?;
    Ok(out
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .map(str::to_owned)
        .collect())
}

/// The pid in a harness namespace's name `tqc-<pid>-...`; `None` for anyone else's.
fn owner_pid(ns: &str) -> Option<u32> {
    let rest = ns.strip_prefix(PREFIX)?.strip_prefix('-')?;
    let (pid, _) = rest.split_once('-')?;
    pid.parse().ok()
}

/// True while process `pid` exists and is not a zombie (signal 0 checks without sending, and
/// EPERM still means alive). A killed run whose parent has not reaped it yet is a zombie: it
/// will never use its namespaces again.
fn pid_alive(pid: u32) -> bool {
    let Ok(pid) = libc::pid_t::try_from(pid) else {
        return false;
    };
    // SAFETY: kill with signal 0 sends nothing; it only checks the process exists.
    let rc = unsafe { libc::kill(pid, 0) };
    let exists = rc == 0 || std::io::Error::last_os_error().raw_os_error() == Some(libc::EPERM);
    exists && !is_zombie(pid)
}

/// Whether `/proc/<pid>/stat` says state `Z` (the field after the command's closing paren).
fn is_zombie(pid: libc::pid_t) -> bool {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return false;
    };
    let state = stat.rsplit_once(')').map(|(_, rest)| rest.trim_start());
    state.is_some_and(|s| s.starts_with('Z'))
}

/// Kills every process in namespace `ns` (never this one) and deletes it. A namespace already
/// gone (another run cleaning at the same time) is not an error.
fn remove_namespace(ns: &str) -> Result<()> {
    let pids = match ip(&["netns", "pids", ns]) {
        Ok(out) => out,
        Err(_) if !namespace_exists(ns) => return Ok(()),
        Err(e) => return Err(e),
    };
    for pid in pids
        .split_whitespace()
        .filter_map(|p| p.parse::<u32>().ok())
    {
        kill_pid(pid);
    }
    match ip(&["netns", "del", ns]) {
        Err(_) if !namespace_exists(ns) => Ok(()),
        other => other.map(|_| ()),
    }
}

fn namespace_exists(ns: &str) -> bool {
    std::path::Path::new(NETNS_DIR).join(ns).exists()
}

/// SIGKILL to `pid`, unless it is this process (a thread of ours may have entered the
/// namespace, and `ip netns pids` names the process).
fn kill_pid(pid: u32) {
    if pid == std::process::id() {
        return;
    }
    if let Ok(pid) = libc::pid_t::try_from(pid) {
        // SAFETY: sending a signal has no memory effects on this process.
        unsafe { libc::kill(pid, libc::SIGKILL) };
    }
}

/// Runs `nft -f -` inside `host`'s namespace with `script` on its stdin.
fn nft(host: &Host, script: &str) -> Result<String> {
    let mut cmd = host.command("nft");
    cmd.args(["-f", "-"]);
    run(&mut cmd, Some(script))
}

/// Runs `ip ARGS`.
fn ip(args: &[&str]) -> Result<String> {
    run(Command::new("ip").args(args), None)
}

/// Runs `cmd` to completion, feeding it `stdin`; its stdout, or an error naming the command,
/// how it ended, its stderr and (for a script) what it was given.
pub(crate) fn run(cmd: &mut Command, stdin: Option<&str>) -> Result<String> {
    let shown = show(cmd);
    cmd.stdin(if stdin.is_some() {
        Stdio::piped()
    } else {
        Stdio::null()
    })
    .stdout(Stdio::piped())
    .stderr(Stdio::piped());
    let mut child = cmd
        .spawn()
        .with_context(|| format!("cannot run `{shown}`"))?;
    if let (Some(text), Some(mut pipe)) = (stdin, child.stdin.take()) {
        pipe.write_all(text.as_bytes())
            .with_context(|| format!("cannot write to `{shown}`"))?;
    }
    let out = child
        .wait_with_output()
        .with_context(|| format!("cannot wait for `{shown}`"))?;
    if !out.status.success() {
        let stderr = String::from_utf8_lossy(&out.stderr);
        let given = stdin.map_or(String::new(), |s| format!("\ninput was:\n{s}"));
        bail!(
            "`{shown}` failed ({}): {}{given}",
            out.status,
            stderr.trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// A command as it would be typed.
fn show(cmd: &Command) -> String {
    let program = cmd.get_program().to_string_lossy().into_owned();
    let args = cmd.get_args().map(|a| a.to_string_lossy().into_owned());
    std::iter::once(program)
        .chain(args)
        .collect::<Vec<_>>()
        .join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn owner_pid_reads_only_our_names() {
        assert_eq!(owner_pid("tqc-1234-run-n1"), Some(1234));
        assert_eq!(owner_pid("tqc-1234-run"), Some(1234));
        assert_eq!(owner_pid("tqc-x-run"), None);
        assert_eq!(owner_pid("tqcx-1234-run"), None);
        assert_eq!(owner_pid("docker-1234-a"), None);
    }

    #[test]
    fn names_are_checked() {
        assert!(check_name("host", "n_1").is_ok());
        assert!(check_name("host", "").is_err());
        assert!(check_name("host", "a-b").is_err());
        assert!(check_name("host", "a b").is_err());
    }

    #[test]
    fn rules_drop_at_the_receiver() {
        let h = |name: &str, last| Host {
            name: name.into(),
            ns: format!("tqc-1-r-{name}"),
            addr: Ipv4Addr::new(10, 77, 0, last),
        };
        let [ab, ba] = Rule::both(&h("a", 1), &h("b", 2), 100);
        assert_eq!(ab.at.name, "a");
        assert_eq!(
            ab.nft_line(),
            "add rule inet chaos input ip saddr 10.77.0.2 drop\n"
        );
        assert_eq!(ba.at.name, "b");
        let [lossy, _] = Rule::both(&h("a", 1), &h("b", 2), 30);
        assert_eq!(
            lossy.nft_line(),
            "add rule inet chaos input ip saddr 10.77.0.2 numgen random mod 100 < 30 drop\n"
        );
    }
}
