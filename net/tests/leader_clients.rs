//! Clients with several addresses, end to end with the real binary: `tarq ctl --addr A,B`
//! uses the first that answers, follows a replica's refusal to the primary it names, skips a
//! dead address, and `tarq ctl cluster` prints each node's replication figures (from
//! `queue.stats()`, the fallback for a server without `queue.cluster()`); the console, its
//! node killed, reads from another and refuses to resend a change it cannot place, naming
//! every address it tried. Every wait has a deadline.

mod support;

use std::io::Write;
use std::process::{Command, Output, Stdio};

use rmpv::Value;
use support::{field, wait_until, Client, Refusing, Tarq, BIN};

/// A primary and a replica of it, the replica caught up with the primary's task count.
fn pair() -> (Tarq, Tarq) {
    let primary = Tarq::start(&[]);
    let paddr = primary.addr.to_string();
    let replica = Tarq::start(&["--replica-of", &paddr]);
    let mut r = Client::connect(replica.addr);
    wait_until("the replica is connected", || {
        stat(&mut r, "replication_connected") == 1
    });
    (primary, replica)
}

/// A figure of `queue.stats()`.
fn stat(c: &mut Client, name: &str) -> u64 {
    let stats = c.call("queue.stats", &[]).one();
    field(&stats, name).as_u64().unwrap_or(0)
}

/// `tarq ctl --addr <addrs> args...`.
fn ctl(addrs: &str, args: &[&str]) -> Output {
    Command::new(BIN)
        .args(["ctl", "--addr", addrs, "--timeout", "5"])
        .args(args)
        .env("RUST_BACKTRACE", "0")
        .output()
        .unwrap()
}

fn ok(out: &Output) -> String {
    assert!(
        out.status.success(),
        "ctl failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout.clone()).unwrap()
}

fn json(out: &Output) -> serde_json::Value {
    let text = ok(out);
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("not JSON ({e}): {text}"))
}

/// The data of task `id` on the server at `c`, or nil when it has none.
fn data_of(c: &mut Client, id: u64) -> Value {
    let r = c.call("queue.tube.default:peek", &[id.into()]);
    if r.code != 0 {
        return Value::Nil;
    }
    r.one()
        .as_array()
        .map(|t| t[2].clone())
        .unwrap_or(Value::Nil)
}

#[test]
fn ctl_puts_on_the_primary_whichever_address_comes_first() {
    let (primary, replica) = pair();
    let (p, r) = (primary.addr.to_string(), replica.addr.to_string());
    let mut pc = Client::connect(primary.addr);

    // The replica answers first, refuses, names the primary: the put lands there.
    let put = json(&ctl(&format!("{r},{p}"), &["put", "first"]));
    assert_eq!(put["status"], "R");
    let id = put["id"].as_u64().unwrap();
    assert_eq!(data_of(&mut pc, id), Value::from("first"));

    // The replica alone: its refusal is the only way to the primary.
    let put = json(&ctl(&r, &["put", "second"]));
    assert_eq!(
        data_of(&mut pc, put["id"].as_u64().unwrap()),
        Value::from("second")
    );

    // Repeated --addr is the same list; a dead first address is skipped.
    let refusing = Refusing::open();
    let dead = refusing.addr.to_string();
    let out = Command::new(BIN)
        .args(["ctl", "--addr", &dead, "--addr", &r, "put", "third"])
        .output()
        .unwrap();
    let put = json(&out);
    assert_eq!(
        data_of(&mut pc, put["id"].as_u64().unwrap()),
        Value::from("third")
    );

    // Reads are answered where they land: the replica has the primary's tasks.
    let mut rc = Client::connect(replica.addr);
    wait_until("the replica has the three tasks", || {
        stat(&mut rc, "total") == 3
    });
    assert_eq!(json(&ctl(&format!("{r},{p}"), &["stats"]))["total"], 3);
    assert_eq!(stat(&mut pc, "total"), 3);
}

#[test]
fn ctl_names_every_address_when_none_answers() {
    let refusing = (Refusing::open(), Refusing::open());
    let (a, b) = (refusing.0.addr.to_string(), refusing.1.addr.to_string());
    let out = ctl(&format!("{a},{b}"), &["stats"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    for x in [&a, &b] {
        assert!(err.contains(&format!("cannot connect to {x}")), "{err}");
    }
    let out = ctl("127.0.0.1:1,,x", &["stats"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("empty address"),
        "{err}"
    );
}

#[test]
fn ctl_cluster_prints_the_replication_figures_of_each_address() {
    let (primary, replica) = pair();
    let (p, r) = (primary.addr.to_string(), replica.addr.to_string());
    ok(&ctl(&p, &["put", "x"]));
    let mut rc = Client::connect(replica.addr);
    wait_until("the replica applied the put", || {
        stat(&mut rc, "total") == 1 && stat(&mut rc, "replication_lag_records") == 0
    });
    let refusing = Refusing::open();
    let dead = refusing.addr.to_string();

    let text = ok(&ctl(&format!("{p},{r},{dead}"), &["cluster"]));
    assert!(text.contains("no etcd cluster (no failover) at"), "{text}");
    let row = |addr: &str| -> Vec<String> {
        text.lines()
            .find(|l| l.starts_with(&format!("{addr} ")))
            .unwrap_or_else(|| panic!("no row for {addr}:\n{text}"))
            .split_whitespace()
            .map(str::to_string)
            .collect()
    };
    // ADDRESS ROLE REPLICAS CONNECTED POSITION LAG_RECORDS LAG_BYTES LAG_MS JOINS
    assert_eq!(row(&p)[1..4], ["primary", "1", "-"]);
    let rr = row(&r);
    assert_eq!(rr[1..4], ["replica", "0", "1"]);
    assert!(rr[4].parse::<u64>().unwrap() > 0, "a position: {rr:?}");
    assert_eq!(rr[5], "0", "no lag in records: {rr:?}");
    assert!(
        text.contains(&format!("{dead}: unreachable: cannot connect to {dead}")),
        "{text}"
    );

    let doc = json(&ctl(&format!("{r},{p}"), &["cluster", "--json"]));
    assert_eq!(doc[&p]["role"], "primary");
    assert_eq!(doc[&p]["replicas"], 1);
    assert_eq!(doc[&r]["role"], "replica");
    assert_eq!(doc[&r]["replication_connected"], 1);
    assert_eq!(doc[&r]["replication_lag_records"], 0);
}

/// Runs the console on `addrs` with `input`; its stdout and stderr.
fn console(addrs: &str, extra: &[&str], input: &str, dir: &std::path::Path) -> (String, String) {
    let mut child = Command::new(BIN)
        .args(["ctl", "--addr", addrs, "--timeout", "5"])
        .args(extra)
        .args(["console", "--history"])
        .arg(dir.join("history"))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(input.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn the_console_follows_the_primary() {
    let (primary, replica) = pair();
    let r = replica.addr.to_string();
    let (out, err) = console(
        &r,
        &[],
        "queue.put('via console')\nreturn queue.stats()\n",
        replica.dir.path(),
    );
    assert!(out.contains("\"via console\""), "{out}\n{err}");
    // Once redirected the console stays on the primary: its stats show the replica.
    assert!(out.contains("\"replicas\": 1"), "{out}");
    let mut pc = Client::connect(primary.addr);
    assert_eq!(data_of(&mut pc, 1), Value::from("via console"));
}

#[test]
fn a_lost_primary_leaves_reads_to_the_replica_and_changes_unsent() {
    let (mut primary, replica) = pair();
    let (p, r) = (primary.addr.to_string(), replica.addr.to_string());
    let mut child = Command::new(BIN)
        .args(["ctl", "--addr", &format!("{p},{r}"), "--timeout", "5"])
        .args(["--failover-wait", "1", "console", "--history"])
        .arg(replica.dir.path().join("history"))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    stdin.write_all(b"queue.put('before')\n").unwrap();
    // Wait until the put is on the replica, so the console has used its connection.
    let mut rc = Client::connect(replica.addr);
    wait_until("the put reached the replica", || {
        stat(&mut rc, "total") == 1
    });
    primary.signal("KILL");
    primary.wait_exit();
    // A read goes to the replica; a put goes there too, is refused naming the dead primary,
    // and after --failover-wait fails naming both addresses.
    stdin
        .write_all(b"return queue.stats()\nqueue.put('after')\n")
        .unwrap();
    drop(stdin);
    let out = child.wait_with_output().unwrap();
    let (text, err) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert!(text.contains("\"replication_position\""), "{text}\n{err}");
    let failure = format!("{text}{err}");
    assert!(
        failure.contains("no leader took queue.put within"),
        "{failure}"
    );
    assert!(
        failure.contains(&format!("{p} (cannot connect to {p}")),
        "{failure}"
    );
    assert!(
        failure.contains(&format!("{r} (read-only replica: the primary is {p})")),
        "{failure}"
    );
    assert_eq!(stat(&mut rc, "total"), 1, "nothing was put twice");
}
