//! Messages that say what to do, end to end with the real binary: a refused setting names the
//! flag and its range, a config file's error is printed once, and `tarq ctl` says what really
//! happened (a login refused, a tube that does not exist) rather than a nearby symptom. Each
//! test reads what a user reads: the process's stderr and exit code.

mod support;

use std::process::{Command, Output};

use support::{Client, Tarq, BIN};

/// `tarq args...` run to its end (it must refuse to start, so it ends at once).
fn tarq(args: &[&str]) -> Output {
    Command::new(BIN)
        .args(args)
        .env("RUST_BACKTRACE", "0")
        .output()
        .unwrap()
}

/// The stderr of a run that failed.
fn failure(out: &Output) -> String {
    assert!(!out.status.success(), "it succeeded: {out:?}");
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn a_negative_or_out_of_range_number_names_the_range() {
    let err = failure(&tarq(&["--max-connections", "-5"]));
    assert!(
        err.contains("invalid value '-5' for '--max-connections <N>': must be a whole number from 1 to 16777216"),
        "{err}"
    );
    assert!(!err.contains("unexpected argument"), "{err}");
    let err = failure(&tarq(&["--lease-ttl", "0"]));
    assert!(
        err.contains("'--lease-ttl <SECONDS>': must be whole seconds from 2 to 60"),
        "{err}"
    );
}

#[test]
fn etcd_without_its_companions_names_the_flags() {
    let err = failure(&tarq(&["--etcd", "http://127.0.0.1:2379"]));
    assert!(
        err.starts_with("Error: --etcd needs --cluster NAME, the cluster's name in etcd"),
        "{err}"
    );
    let err = failure(&tarq(&[
        "--etcd",
        "http://127.0.0.1:2379",
        "--cluster",
        "c",
    ]));
    assert!(
        err.starts_with("Error: --etcd needs --node-name NAME"),
        "{err}"
    );
}

#[test]
fn a_wrong_key_in_the_config_file_is_printed_once() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tarq.toml");
    std::fs::write(&path, "max-conections = 7\n").unwrap();
    let err = failure(&tarq(&["--config", path.to_str().unwrap()]));
    assert!(err.starts_with("Error: bad config file"), "{err}");
    assert_eq!(
        err.matches("unknown field `max-conections`").count(),
        1,
        "{err}"
    );
    assert!(!err.contains("Caused by"), "{err}");
}

#[test]
fn a_wrong_password_says_the_server_answered_and_refused_it() {
    let server = Tarq::start(&["--user", "u", "--password", "right"]);
    let addr = server.addr.to_string();
    let out = server.ctl(&["--user", "u", "--password", "wrong", "stats"]);
    let err = failure(&out);
    assert_eq!(
        err.trim_end(),
        format!(
            "Error: {addr} answered but refused the login as \"u\": Incorrect password supplied \
             for user 'u' (code 47); check the user name and password"
        )
    );
    let ok = server.ctl(&["--user", "u", "--password", "right", "stats"]);
    assert!(ok.status.success(), "{ok:?}");
}

#[test]
fn a_missing_tube_is_named_by_ctl_while_iproto_keeps_the_original_text() {
    let server = Tarq::start(&[]);
    let err = failure(&server.ctl(&["drop-tube", "work"]));
    assert_eq!(
        err.trim_end(),
        "Error: tube 'work' does not exist (`tarq ctl list-tubes` lists the tubes, \
         `tarq ctl create-tube` makes one)"
    );
    let err = failure(&server.ctl(&["--namespace", "box.queue", "drop-tube", "work"]));
    assert!(
        err.contains("no tarantool/queue API under the namespace 'box.queue': give --namespace"),
        "{err}"
    );
    // A net.box client meets what tarantool/queue answers: the missing tube's method is not
    // defined.
    let mut c = Client::connect(server.addr);
    let r = c.call("queue.tube.work:drop", &[]);
    assert_eq!(r.code, tarq_iproto::codes::ER_NO_SUCH_PROC);
    assert_eq!(
        r.error.as_deref(),
        Some("Procedure 'queue.tube.work:drop' is not defined")
    );
}

#[test]
fn no_server_at_the_address_says_what_to_check() {
    // A port held without listening: connections to it are refused, and no other test's
    // server can take it meanwhile.
    let dead = tarq_testkit::ports::Refusing::open();
    let addr = dead.addr.to_string();
    let out = Command::new(BIN)
        .args(["ctl", "--addr", &addr, "stats"])
        .env("RUST_BACKTRACE", "0")
        .output()
        .unwrap();
    let err = failure(&out);
    assert!(
        err.starts_with(&format!(
            "Error: no server answered: {addr} (cannot connect to {addr}"
        )),
        "{err}"
    );
    assert!(
        err.trim_end()
            .ends_with("; is tarq running and listening there? --addr gives the addresses to try"),
        "{err}"
    );
}

#[test]
fn ctl_cluster_says_a_node_cannot_reach_etcd_when_it_never_did() {
    // Port 1 (tcpmux) has no listener on a test machine: every call is refused at once.
    let etcd = "http://127.0.0.1:1".to_string();
    // Listening on port 0 needs an address to publish; no other node ever reads this one.
    let mut node = Tarq::start(&[
        "--etcd",
        &etcd,
        "--cluster",
        "c",
        "--node-name",
        "n9",
        "--advertise",
        "127.0.0.1:1",
    ]);
    node.wait_for_line("etcd unavailable");
    let out = node.ctl(&["cluster"]);
    assert!(out.status.success(), "{out:?}");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.starts_with(
            "leader none (no leader elected)  term 0\n  n9 is not following a leader: "
        ),
        "{text}"
    );
    assert!(
        text.contains(&format!(
            "\n  etcd unavailable to n9: etcd at {etcd} unreachable"
        )),
        "{text}"
    );
}

/// Issue 39: with RUST_BACKTRACE set (as many shells and service files have it), a refused
/// `tarq ctl` printed a backtrace under its message. Its reader is a person: the message, its
/// causes, exit 1, and nothing else.
#[test]
fn ctl_errors_carry_no_backtrace_whatever_rust_backtrace_says() {
    let dead = tarq_testkit::ports::Refusing::open();
    let addr = dead.addr.to_string();
    for backtrace in ["1", "full"] {
        let out = Command::new(BIN)
            .args(["ctl", "--addr", &addr, "--failover-wait", "0", "stats"])
            .env("RUST_BACKTRACE", backtrace)
            .env("RUST_LIB_BACKTRACE", backtrace)
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(1), "{out:?}");
        let err = failure(&out);
        assert!(
            err.starts_with(&format!("Error: no server answered: {addr}")),
            "{err}"
        );
        assert!(!err.to_lowercase().contains("backtrace"), "{err}");
        assert_eq!(err.trim_end().lines().count(), 1, "{err}");
    }
    // A cause is listed under the message, as before.
    let server = Tarq::start(&[]);
    let out = Command::new(BIN)
        .args(["ctl", "--addr", &server.addr.to_string(), "--timeout", "1"])
        .args([
            "rebalance",
            "--etcd",
            "http://127.0.0.1:1",
            "--cluster",
            "c",
        ])
        .env("RUST_BACKTRACE", "1")
        .output()
        .unwrap();
    let err = failure(&out);
    assert!(
        err.starts_with("Error: reading cluster c's map from etcd\n\nCaused by:\n    "),
        "{err}"
    );
    assert!(!err.to_lowercase().contains("backtrace"), "{err}");
}
