//! Tests of the built `tarq` binary: `--help` documents every flag, a `--config` TOML file is
//! honoured, the server answers on the configured port, logs one line per connection open and
//! close, and exits cleanly on SIGTERM.

mod common;

use std::io::{BufRead, BufReader};
use std::net::{SocketAddr, TcpListener};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Instant;

use common::{wait_until, Client, WAIT};

const BIN: &str = env!("CARGO_BIN_EXE_tarq");

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

/// A port that was free a moment ago (the binary binds it right after).
fn free_port() -> SocketAddr {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
}

struct Running {
    child: Child,
    lines: mpsc::Receiver<String>,
}

impl Running {
    fn wait_for_line(&self, needle: &str) -> String {
        let deadline = Instant::now() + WAIT;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(l) if l.contains(needle) => return l,
                Ok(_) => {}
                Err(_) => panic!("no log line with {needle:?} within {WAIT:?}"),
            }
        }
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn start(args: &[&str]) -> Running {
    let mut child = Command::new(BIN)
        .args(args)
        .stderr(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let stderr = child.stderr.take().unwrap();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    Running { child, lines: rx }
}

#[test]
fn serves_from_a_config_file_and_stops_on_sigterm() {
    let dir = tempfile::tempdir().unwrap();
    let addr = free_port();
    let cfg = dir.path().join("tarq.toml");
    let data = dir.path().join("data");
    std::fs::write(
        &cfg,
        format!(
            "listen = \"{addr}\"\ndata-dir = \"{}\"\nmax-connections = 5\n",
            data.display()
        ),
    )
    .unwrap();
    let mut run = start(&["--config", cfg.to_str().unwrap(), "--log-level", "info"]);
    run.wait_for_line("tarq serving");
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

    let status = Command::new("kill")
        .args(["-TERM", &run.child.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    let mut exited = None;
    wait_until("the server to exit after SIGTERM", || {
        exited = run.child.try_wait().unwrap();
        exited.is_some()
    });
    assert!(exited.unwrap().success(), "exit status {exited:?}");
    run.wait_for_line("tarq stopped");
}
