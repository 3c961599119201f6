//! The Debian package, as an operator meets it: `cargo deb` builds it from this workspace (the
//! `tarq` binary these tests were built with, so the test costs no second build), `dpkg -i`
//! installs it — the binary, the systemd unit, the sample configuration as a conffile, the
//! `tarq` user and `/var/lib/tarq` —, `systemd-analyze verify` accepts the installed unit
//! (systemd need not be running), and the installed `/usr/bin/tarq --config
//! /etc/tarq/tarq.toml`, started as the `tarq` user as the unit would, serves a real client.
//! Then `dpkg -r` keeps the configuration and the data, `dpkg -P` removes both.
//!
//! It installs a system package, so it needs root (or sudo) and refuses to run where a `tarq`
//! package is already installed: it would replace and then purge it. Two runs on one machine
//! (two work trees testing at once) take turns through a lock file. Only the listen address is
//! given on the command line (`127.0.0.1:0`, so tests running at the same time never collide);
//! everything else comes from the installed file.

mod support;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use rmpv::Value;
use support::{prerequisite, tool, Client, Tarq, BIN};

/// The workspace root, where `cargo deb` runs.
fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

/// `cmd` with `sudo` in front unless this process is root already.
fn as_root(args: &[&str]) -> Command {
    let root = effective_uid() == 0;
    let mut c = Command::new(if root { args[0] } else { "sudo" });
    c.args(if root { &args[1..] } else { args });
    c
}

/// This process's effective user id, read from `/proc` (no libc call needed).
fn effective_uid() -> u32 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let line = status.lines().find(|l| l.starts_with("Uid:")).unwrap();
    line.split_whitespace().nth(2).unwrap().parse().unwrap()
}

fn run(mut cmd: Command) -> Output {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?} failed ({}):\n{}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

fn installed() -> bool {
    Command::new("dpkg-query")
        .args(["-W", "-f=${Status}", "tarq"])
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).contains("installed"))
}

/// Purges the package when the test ends, also when it fails half-way.
struct Purge;

impl Drop for Purge {
    fn drop(&mut self) {
        let _ = as_root(&["dpkg", "--purge", "tarq"]).output();
    }
}

/// Owner, group and mode (octal) of a path, from `stat`.
fn stat(path: &str) -> String {
    let out = run({
        let mut c = Command::new("stat");
        c.args(["-c", "%U:%G %a", path]);
        c
    });
    String::from_utf8(out.stdout).unwrap().trim().to_string()
}

/// Waits for, then holds, the machine-wide lock of this test until dropped (the kernel
/// releases it with the file, also when the test process dies).
fn machine_lock() -> nix::fcntl::Flock<std::fs::File> {
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(std::env::temp_dir().join("tarq-package-test.lock"))
        .unwrap();
    nix::fcntl::Flock::lock(file, nix::fcntl::FlockArg::LockExclusive)
        .unwrap_or_else(|(_, e)| panic!("flock: {e}"))
}

#[test]
fn the_debian_package_installs_a_service_that_serves_and_removes_cleanly() {
    prerequisite("cargo-deb (cargo install cargo-deb)", tool("cargo-deb"));
    prerequisite("dpkg", tool("dpkg"));
    prerequisite(
        "systemd-analyze (Debian's systemd)",
        tool("systemd-analyze"),
    );
    prerequisite("setpriv (util-linux)", tool("setpriv"));
    let _turn = machine_lock();
    assert!(
        !installed(),
        "a tarq package is installed on this machine: this test would replace and purge it \
         (`dpkg -P tarq` removes it)"
    );

    // The binary the tests were built with: cargo-deb's dev profile is target/debug, which is
    // where BIN is. cargo-deb strips it, so the package is small.
    let out = tempfile::tempdir().unwrap();
    assert!(Path::new(BIN).exists());
    let mut build = Command::new("cargo");
    build
        .current_dir(root())
        .args([
            "deb",
            "-p",
            "tarq-net",
            "--profile",
            "dev",
            "--no-build",
            "--fast",
        ])
        .arg("-o")
        .arg(out.path());
    run(build);
    let deb = std::fs::read_dir(out.path())
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.extension().is_some_and(|e| e == "deb"))
        .expect("cargo deb wrote a .deb");
    let name = deb.file_name().unwrap().to_str().unwrap();
    assert!(
        name.starts_with("tarq_"),
        "the package is called tarq: {name}"
    );

    let _purge = Purge;
    run(as_root(&["dpkg", "-i", deb.to_str().unwrap()]));
    assert!(installed());
    let listed = String::from_utf8(run(as_root(&["dpkg", "-L", "tarq"])).stdout).unwrap();
    for path in [
        "/usr/bin/tarq",
        "/etc/tarq/tarq.toml",
        "/usr/lib/systemd/system/tarq.service",
    ] {
        assert!(listed.lines().any(|l| l == path), "{path} in:\n{listed}");
    }
    let conffiles = std::fs::read_to_string("/var/lib/dpkg/info/tarq.conffiles").unwrap();
    assert_eq!(conffiles.trim(), "/etc/tarq/tarq.toml");
    // The maintainer script made the user, its data directory, and a file it alone may read.
    run({
        let mut c = Command::new("getent");
        c.args(["passwd", "tarq"]);
        c
    });
    assert_eq!(stat("/var/lib/tarq"), "tarq:tarq 750");
    assert_eq!(stat("/etc/tarq/tarq.toml"), "root:tarq 640");

    // systemd's own check of the installed unit (its binary must exist, its keys be known):
    // it needs no running systemd. It passes warnings with exit 0, so none may name the unit.
    let verify = Command::new("systemd-analyze")
        .args(["verify", "/usr/lib/systemd/system/tarq.service"])
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&verify.stderr).to_string()
        + &String::from_utf8_lossy(&verify.stdout);
    assert!(verify.status.success(), "systemd-analyze verify: {said}");
    assert!(
        !said.lines().any(|l| l.contains("tarq.service")),
        "systemd-analyze verify warns about the unit:\n{said}"
    );

    // The installed binary with the installed configuration, as the unit's user. setpriv execs
    // tarq, so the pid is tarq's and its log comes straight back.
    let mut cmd = as_root(&[
        "setpriv",
        "--reuid",
        "tarq",
        "--regid",
        "tarq",
        "--init-groups",
        "/usr/bin/tarq",
        "--config",
        "/etc/tarq/tarq.toml",
        "--listen",
        "127.0.0.1:0",
    ]);
    cmd.current_dir("/");
    let mut t = Tarq::spawn_cmd(tempfile::tempdir().unwrap(), cmd);
    let mut c = Client::connect(t.addr);
    let put = c.call("queue.put", &[Value::from("packaged")]);
    assert!(put.error.is_none(), "{put:?}");
    let taken = c.call("queue.take", &[Value::from(1)]).one();
    assert_eq!(taken["data"], Value::from("packaged"));
    let stats = c.call("queue.stats", &[]).one();
    assert_eq!(
        stats["wal_enabled"],
        Value::from(1),
        "the sample's wal-mode: {stats}"
    );
    // The data went where the installed file says, owned by the service's user.
    let files: Vec<_> = std::fs::read_dir("/var/lib/tarq")
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    assert!(
        files
            .iter()
            .any(|p| p.extension().is_some_and(|e| e == "xlog")),
        "a WAL segment in /var/lib/tarq: {files:?}"
    );
    drop(c);
    t.signal("TERM");
    assert!(t.proc.wait_exit().success(), "{:?}", t.log());

    // Remove keeps the configuration and the data; purge removes both.
    run(as_root(&["dpkg", "-r", "tarq"]));
    assert!(!Path::new("/usr/bin/tarq").exists());
    assert!(Path::new("/etc/tarq/tarq.toml").exists());
    assert!(Path::new("/var/lib/tarq").exists());
    run(as_root(&["dpkg", "-P", "tarq"]));
    assert!(!Path::new("/etc/tarq/tarq.toml").exists());
    assert!(!Path::new("/var/lib/tarq").exists());
    assert!(!installed());
}
