//! Tests of the built `tarq` binary: `--help` documents every flag, a `--config` TOML file is
//! honoured, the server answers on the configured port, logs one line per connection open and
//! close, and exits cleanly on SIGTERM.

mod support;

use std::process::Command;

use support::{Client, Tarq, BIN};

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
