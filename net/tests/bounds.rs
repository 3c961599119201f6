//! The bounds a hostile client would otherwise walk past, on the real binary over real sockets:
//! the session grace `queue.cfg{ttr}` may ask is capped (`--max-session-grace`), the sessions
//! waiting out their grace are capped (`--max-detached-sessions`, the first due evicted), and a
//! put past the task limit (`--max-tasks`) is refused through the seed API, the tube API and
//! beanstalk while the server goes on serving. The limits are set small so that no test needs
//! millions of anything. A close is waited for as its log line, never slept for.

#[path = "support/beanstalk.rs"]
mod beanstalk;
mod support;

use beanstalk::Bs;
use rmpv::Value;
use support::{field, map, Client, Tarq, WAIT};
use tarq_beanstalk::Command;

/// ER_PROC_LUA: how the original's Lua `error()` reaches a client.
const ER_PROC_LUA: u32 = 32;

fn s(v: &str) -> Value {
    Value::from(v)
}

fn cfg_ttr(c: &mut Client, ttr: impl Into<Value>) -> support::Reply {
    c.call("queue.cfg", &[map(&[("ttr", ttr.into())])])
}

/// Closes `c` and waits until the server has logged the close, so that what the close does
/// (a session detached, its grace started) has happened before the next step.
fn close(tarq: &mut Tarq, c: Client) {
    drop(c);
    tarq.lines.wait_for_new("connection closed", WAIT);
}

/// A new connection's session UUID (`queue.identify()`).
fn identify(c: &mut Client) -> Value {
    let u = c.call("queue.identify", &[]).one();
    assert_eq!(u.as_slice().map(<[u8]>::len), Some(16), "{u}");
    u
}

/// The count `name` of tube `tube`'s `tasks` statistics.
fn tasks(c: &mut Client, tube: &str, name: &str) -> u64 {
    let st = c.call("queue.statistics", &[s(tube)]).one();
    field(field(&st, "tasks"), name).as_u64().unwrap()
}

#[test]
fn a_session_grace_past_the_limit_is_refused_naming_the_limit_and_the_setting() {
    let tarq = Tarq::start(&["--max-session-grace", "60"]);
    let mut c = Client::connect(tarq.addr);
    // 100 years, the hostile ask: the original's error, with why and which setting.
    let e = cfg_ttr(&mut c, 3_153_600_000u64).err(ER_PROC_LUA);
    assert_eq!(
        e,
        "Invalid value of ttr: 3153600000: above this server's limit of 60 seconds \
         (max-session-grace)"
    );
    let e = cfg_ttr(&mut c, 60.5).err(ER_PROC_LUA);
    assert!(e.starts_with("Invalid value of ttr: 60.5: "), "{e}");
    // Refused as a whole: `in_replicaset` beside a bad ttr is not applied either.
    let both = map(&[
        ("ttr", Value::from(61)),
        ("in_replicaset", Value::from(true)),
    ]);
    c.call("queue.cfg", &[both]).err(ER_PROC_LUA);
    // At the limit, accepted; the connection goes on.
    assert_eq!(cfg_ttr(&mut c, 60).code, 0);
    assert_eq!(c.call("queue.state", &[]).one(), s("RUNNING"));
}

/// The reply a client library sees: the PyPI `tarantool` connector raises its DatabaseError
/// with the code and the message, as for the original's `Invalid value of ttr: -1`.
#[test]
fn the_python_connector_gets_the_grace_error_as_a_database_error() {
    support::require_command(
        "the PyPI `tarantool` connector",
        &["python3", "-c", "import tarantool"],
    );
    let tarq = Tarq::start(&["--max-session-grace", "60"]);
    let script = r#"
import sys, tarantool
from tarantool.error import DatabaseError
c = tarantool.connect("127.0.0.1", int(sys.argv[1]))
try:
    c.call("queue.cfg", {"ttr": 3153600000})
except DatabaseError as e:
    print(e.args[0], e.args[1])
    c.call("queue.cfg", {"ttr": 60})
    print("OK: accepted at the limit")
"#;
    let out = std::process::Command::new("python3")
        .args(["-c", script, &tarq.addr.port().to_string()])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains("32 Invalid value of ttr: 3153600000: above this server's limit of 60")
            && stdout.contains("OK: accepted at the limit"),
        "stdout: {stdout}\nstderr: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The hostile loop: `identify()` and disconnect, again and again, with the longest grace.
/// The sessions waiting out their grace never number more than `--max-detached-sessions`: the
/// one due first (here the victim's, detached first) is evicted and its task released at
/// once, and the newest are still there to reconnect to.
#[test]
fn identify_and_disconnect_in_a_loop_keeps_the_session_table_bounded() {
    const KEPT: usize = 3;
    let mut tarq = Tarq::start(&[
        "--max-session-grace",
        "86400",
        "--max-detached-sessions",
        &KEPT.to_string(),
    ]);
    let mut admin = Client::connect(tarq.addr);
    assert_eq!(cfg_ttr(&mut admin, 86_400).code, 0);
    admin
        .call("queue.create_tube", &[s("jobs"), s("fifo")])
        .ok();
    admin.call("queue.tube.jobs:put", &[s("work")]).one();

    let mut victim = Client::connect(tarq.addr);
    let victim_uuid = identify(&mut victim);
    victim.call("queue.tube.jobs:take", &[Value::from(0)]).one();
    close(&mut tarq, victim);
    assert_eq!(tasks(&mut admin, "jobs", "taken"), 1, "kept for its grace");

    let mut uuids = Vec::new();
    for i in 0..50 {
        let mut c = Client::connect(tarq.addr);
        uuids.push(identify(&mut c));
        close(&mut tarq, c);
        if i + 1 < KEPT {
            assert_eq!(tasks(&mut admin, "jobs", "taken"), 1, "room left: kept");
        }
    }
    // The victim's session, due first, was evicted when the table was full: its task is
    // released at once, not after its day of grace.
    let line = tarq.lines.wait_for("session expired", WAIT);
    assert!(line.contains("released=1"), "{line}");
    assert_eq!(tasks(&mut admin, "jobs", "ready"), 1);
    let unknown = |u: &Value| {
        let mut c = Client::connect(tarq.addr);
        let e = c
            .call("queue.identify", std::slice::from_ref(u))
            .err(ER_PROC_LUA);
        assert!(e.ends_with("is unknown."), "{e}");
    };
    unknown(&victim_uuid);
    // Of the flood, only the newest KEPT are left to reconnect to.
    unknown(&uuids[uuids.len() - KEPT - 1]);
    for u in &uuids[uuids.len() - KEPT..] {
        let mut c = Client::connect(tarq.addr);
        assert_eq!(&c.call("queue.identify", std::slice::from_ref(u)).one(), u);
    }
}

/// Past `--max-tasks` a put is refused through every protocol, with the limit in the message
/// (beanstalk: `OUT_OF_MEMORY`, its answer when it has no room); nothing else breaks, and an
/// ack makes room again.
#[test]
fn past_the_task_limit_every_protocol_refuses_the_put() {
    let (tarq, bs_addr) = beanstalk::start(&["--max-tasks", "3"]);
    let mut c = Client::connect(tarq.addr);
    let mut bs = Bs::connect(bs_addr);
    let first = c.call("queue.put", &[s("a")]).one();
    c.call("queue.create_tube", &[s("jobs"), s("fifottl")]).ok();
    c.call("queue.tube.jobs:put", &[s("b")]).one();
    bs.put(0, b"c");

    let full = "Too many tasks: the queue holds 3, its limit";
    assert_eq!(c.call("queue.put", &[s("x")]).err(ER_PROC_LUA), full);
    assert_eq!(
        c.call("queue.tube.jobs:put", &[s("x")]).err(ER_PROC_LUA),
        full
    );
    let batch = c.call(
        "queue.tube.jobs:put_many",
        &[Value::Array(vec![s("x"), s("y")])],
    );
    assert_eq!(
        batch.ok(),
        vec![Value::Nil, Value::Nil],
        "a batch answers nil for each item not done"
    );
    let refused = bs.call(&Command::Put {
        pri: 0,
        delay: 0,
        ttr: 60,
        body: b"x",
    });
    assert_eq!(refused.line, "OUT_OF_MEMORY");

    // Everything else goes on: stats, takes, acks; an ack makes room for one put.
    c.call("queue.stats", &[]).one();
    let id = field(&first, "id").clone();
    c.call("queue.take", &[Value::from(0)]).one();
    c.call("queue.ack", &[id]).one();
    bs.put(0, b"d");
    assert_eq!(c.call("queue.put", &[s("x")]).err(ER_PROC_LUA), full);
    assert_eq!(c.ping().code, 0);
}
