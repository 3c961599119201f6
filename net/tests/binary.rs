//! Tests of the built `tarq` binary: `--help` documents every flag, a `--config` TOML file is
//! honoured, the server answers on the configured port, logs one line per connection open and
//! close, and exits cleanly on SIGTERM.

mod support;

use std::process::Command;

use support::{Client, Tarq, BIN, WAIT};

#[test]
fn help_documents_every_flag() {
    let out = Command::new(BIN).arg("--help").output().unwrap();
    assert!(out.status.success());
    let help = String::from_utf8(out.stdout).unwrap();
    for flag in [
        "--config",
        "--listen",
        "--data-dir",
        "--cpu",
        "--max-connections",
        "--max-frame-bytes",
        "--max-write-backlog",
        "--log-level",
        "--user",
        "--password",
        "--null",
    ] {
        assert!(help.contains(flag), "--help lacks {flag}:\n{help}");
    }
    assert!(help.contains("127.0.0.1:3301") && help.contains("16777216"));
}

#[test]
fn bad_flags_fail_with_a_message_naming_them() {
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(BIN)
        .args(["--log-level", "chatty", "--data-dir"])
        .arg(dir.path())
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("log-level 'chatty'"), "{err}");
}

#[test]
fn serves_from_a_config_file_and_stops_on_sigterm() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("tarq.toml");
    let data = dir.path().join("data");
    // Port 0 from the file: the kernel picks a free port, and the log says which.
    std::fs::write(
        &cfg,
        format!(
            "listen = \"127.0.0.1:0\"\ndata-dir = \"{}\"\nmax-connections = 5\n",
            data.display()
        ),
    )
    .unwrap();
    let cfg = cfg.to_str().unwrap().to_string();
    let mut run = Tarq::start_with_args(dir, &["--config", &cfg, "--log-level", "info"]);
    let addr = run.addr;
    assert_ne!(
        addr.port(),
        tarq_net::config::DEFAULT_LISTEN
            .parse::<std::net::SocketAddr>()
            .unwrap()
            .port(),
        "the listen address comes from the file"
    );
    assert!(data.is_dir(), "the data dir is created");

    let mut c = Client::connect(addr);
    assert_eq!(c.ping().code, 0);
    assert_eq!(
        c.call("queue.put", &[rmpv::Value::from("x")])
            .one()
            .as_map()
            .map(|m| m.len()),
        Some(4)
    );
    run.wait_for_line("connection opened");
    drop(c);
    let closed = run.wait_for_line("connection closed");
    assert!(closed.contains("released=0"), "{closed}");

    run.signal("TERM");
    let exited = run.wait_exit();
    assert!(exited.success(), "exit status {exited:?}");
    run.wait_for_line("tarq stopped");
}

/// The cores in a `Cpus_allowed_list` line of `/proc/.../status` ("0-1", "0,2-3").
fn cores_in(status: &str) -> Vec<usize> {
    let list = status
        .lines()
        .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))
        .expect("Cpus_allowed_list")
        .trim();
    let mut cores = Vec::new();
    for part in list.split(',') {
        let (a, b) = part.split_once('-').unwrap_or((part, part));
        cores.extend(a.parse::<usize>().unwrap()..=b.parse::<usize>().unwrap());
    }
    cores
}

#[test]
fn with_cpu_the_loop_has_its_core_and_the_wal_threads_the_others() {
    let allowed = cores_in(&std::fs::read_to_string("/proc/self/status").unwrap());
    let cpu = allowed[0].to_string();
    let t = Tarq::start(&["--cpu", &cpu, "--wal-mode", "fsync"]);
    let pid = t.proc.0.id();
    let threads = || {
        let mut seen = Vec::new();
        for task in std::fs::read_dir(format!("/proc/{pid}/task")).unwrap() {
            let task = task.unwrap().path();
            let name = std::fs::read_to_string(task.join("comm")).unwrap();
            let cores = cores_in(&std::fs::read_to_string(task.join("status")).unwrap());
            seen.push((name.trim().to_owned(), cores));
        }
        seen
    };
    let cores_of = |seen: &[(String, Vec<usize>)], name: &str| {
        seen.iter()
            .find(|(n, _)| n == name)
            .map(|(_, cores)| cores.clone())
    };
    // The main thread runs the loop, pinned; the WAL's threads on every other core (on a
    // machine of one core, that core).
    let others = if allowed.len() > 1 {
        allowed[1..].to_vec()
    } else {
        allowed.clone()
    };
    // A thread takes its name and its cores once it runs, which may be after the server says
    // it serves: the state is read until it holds or the wait runs out.
    let helpers = ["tarq-wal-sync", "tarq-snapshot"];
    let deadline = std::time::Instant::now() + WAIT;
    let seen = loop {
        let seen = threads();
        let settled = helpers
            .iter()
            .all(|h| cores_of(&seen, h).as_ref() == Some(&others));
        if settled || std::time::Instant::now() > deadline {
            break seen;
        }
        std::thread::sleep(std::time::Duration::from_millis(5));
    };
    assert_eq!(cores_of(&seen, "tarq"), Some(vec![allowed[0]]), "{seen:?}");
    for helper in helpers {
        assert_eq!(
            cores_of(&seen, helper),
            Some(others.clone()),
            "{helper}: {seen:?}"
        );
    }
}
