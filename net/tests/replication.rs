//! Replicas (`--replica-of`), end to end with the real binary: a replica holds every task its
//! primary acknowledged, task by task (id, tube, status, payload), in every WAL mode, for
//! tasks put before it joined and after; it refuses changes naming the primary, on IPROTO and
//! on its beanstalk port (a `use` there is `USING`, or `READ_ONLY` as a put when it would make
//! the tube); killed with SIGKILL it resumes from its own WAL; one whose position the primary
//! no longer retains joins again from a snapshot; a job's `stats-job` counters reach it, in the
//! snapshot it joins from and in the stream after; a tube `use` made and left empty goes from
//! it as from its primary; a primary and a replica of different WAL formats refuse each other,
//! saying what to do. Every wait has a deadline.

#[path = "support/beanstalk.rs"]
mod beanstalk;
mod support;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use rmpv::Value;
use support::{addr_in, field, wait_until, Client, Tarq, WAIT};
use tarq_iproto::codes::ER_REPLICATION;
use tarq_iproto::mp::write;
use tarq_iproto::replication::{self, JOIN, SUBSCRIBE, VCLOCK};
use tarq_wal::format::FORMAT_VERSION;

/// Tubes the workload uses (`default` is the seed API's).
const TUBES: [&str; 4] = ["default", "jobs", "u", "late"];

fn s(v: &str) -> Value {
    Value::from(v)
}

fn opts(pairs: &[(&str, Value)]) -> Value {
    support::map(pairs)
}

/// A figure of `queue.stats()`.
fn stat(c: &mut Client, name: &str) -> u64 {
    let stats = c.call("queue.stats", &[]).one();
    field(&stats, name).as_u64().unwrap_or(0)
}

/// Above every number a tube of the primary at `p` has given: each tube numbers its own
/// tasks, one a put (from 0; `default`'s from 1, its last id). A replica counts no calls, so
/// its tasks are read up to its primary's bound.
fn numbers_used(p: &mut Client) -> u64 {
    let all = p.call("queue.statistics", &[]).one();
    let puts = all.as_map().expect("a map of tubes").iter().map(|(_, st)| {
        let calls = field(st, "calls");
        field(calls, "put").as_u64().expect("a count")
    });
    puts.max().unwrap_or(0).max(stat(p, "last_id")) + 1
}

/// Every task of the queue at `c` numbered below `upto` in its tube, as (tube, number, status,
/// data), read with `peek`.
fn tasks(c: &mut Client, upto: u64) -> Vec<(String, u64, String, Value)> {
    let mut out = Vec::new();
    for tube in TUBES {
        for id in 0..upto {
            let r = c.call(&format!("queue.tube.{tube}:peek"), &[id.into()]);
            if r.code != 0 {
                continue;
            }
            let t = r.one();
            let t = t.as_array().expect("a task tuple");
            let status = t[1].as_str().unwrap_or_default().to_owned();
            out.push((
                tube.to_owned(),
                t[0].as_u64().unwrap(),
                status,
                t[2].clone(),
            ));
        }
    }
    out
}

/// Puts, takes, acks, releases, buries and deletes on the primary through `c` (which stays
/// open: what it took stays taken). `round` keeps the payloads of each call apart.
fn workload(c: &mut Client, round: u32) {
    for (name, kind) in [("jobs", "fifottl"), ("u", "utube")] {
        c.call(
            "queue.create_tube",
            &[s(name), s(kind), opts(&[("if_not_exists", true.into())])],
        )
        .one();
    }
    let mut ids = Vec::new();
    for i in 0..40 {
        let data = opts(&[("round", round.into()), ("i", i.into())]);
        let t = c.call(
            "queue.tube.jobs:put",
            &[data, opts(&[("pri", (i % 3).into())])],
        );
        ids.push(t.one().as_array().unwrap()[0].as_u64().unwrap());
    }
    for i in 0..10 {
        let key = format!("k{round}-{}", i % 3);
        c.call(
            "queue.tube.u:put",
            &[s(&format!("u{round}-{i}")), opts(&[("utube", s(&key))])],
        )
        .one();
        c.call("queue.put", &[s(&format!("seed{round}-{i}"))]).one();
    }
    let mut taken = Vec::new();
    for _ in 0..10 {
        let t = c.call("queue.tube.jobs:take", &[0.into()]).one();
        taken.push(t.as_array().unwrap()[0].as_u64().unwrap());
    }
    for &id in &taken[..5] {
        c.call("queue.tube.jobs:ack", &[id.into()]).one();
    }
    for &id in &taken[5..7] {
        c.call(
            "queue.tube.jobs:release",
            &[id.into(), opts(&[("delay", 3600.into())])],
        )
        .one();
    }
    c.call("queue.tube.jobs:bury", &[taken[7].into()]).one();
    let ready: Vec<u64> = ids.iter().copied().filter(|i| !taken.contains(i)).collect();
    for &id in &ready[..2] {
        c.call("queue.tube.jobs:delete", &[id.into()]).one();
    }
    c.call("queue.take", &[0.into()]).one();
    c.call("queue.tube.u:take", &[0.into()]).one();
}

/// Waits until the replica at `r` holds exactly the primary's tasks (read at `p`).
fn wait_for_same_tasks(p: &mut Client, r: &mut Client) {
    let upto = numbers_used(p);
    let want = tasks(p, upto);
    assert!(want.len() > 50, "the workload left tasks: {}", want.len());
    let mut got = Vec::new();
    let deadline = std::time::Instant::now() + WAIT;
    while std::time::Instant::now() < deadline {
        got = tasks(r, upto);
        if got == want {
            return;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let missing: Vec<_> = want.iter().filter(|t| !got.contains(t)).take(5).collect();
    let extra: Vec<_> = got.iter().filter(|t| !want.contains(t)).take(5).collect();
    panic!(
        "the replica differs from the primary ({} tasks against {}): missing {missing:?}, extra {extra:?}",
        got.len(),
        want.len()
    );
}

fn replica_args<'a>(primary: &'a str, mode: &'a str) -> Vec<&'a str> {
    vec!["--replica-of", primary, "--wal-mode", mode]
}

/// A primary in `primary_mode` and a replica in `replica_mode`: tasks put before the replica
/// joins and after are all on the replica, task by task.
fn check_mode(primary_mode: &str, replica_mode: &str) {
    let primary = Tarq::start(&["--wal-mode", primary_mode]);
    let mut p = Client::connect(primary.addr);
    workload(&mut p, 1);
    let paddr = primary.addr.to_string();
    let replica = Tarq::start(&replica_args(&paddr, replica_mode));
    let mut r = Client::connect(replica.addr);
    wait_for_same_tasks(&mut p, &mut r);
    workload(&mut p, 2);
    c_create_late(&mut p);
    wait_for_same_tasks(&mut p, &mut r);
    assert_eq!(stat(&mut p, "replicas"), 1);
    assert_eq!(stat(&mut r, "replication_connected"), 1);
    wait_until("no lag left", || {
        stat(&mut r, "replication_lag_records") == 0
    });
    assert_eq!(stat(&mut r, "last_id"), stat(&mut p, "last_id"));
}

/// A tube created after the replica joined, with tasks.
fn c_create_late(c: &mut Client) {
    c.call(
        "queue.create_tube",
        &[
            s("late"),
            s("fifo"),
            opts(&[("if_not_exists", true.into())]),
        ],
    )
    .one();
    for i in 0..5 {
        c.call("queue.tube.late:put", &[s(&format!("late{i}"))])
            .one();
    }
}

#[test]
fn a_replica_has_every_task_with_no_wal_of_its_own() {
    // A primary needs a WAL to stream (as Tarantool's); the replica may keep none.
    check_mode("write", "none");
}

#[test]
fn a_replica_has_every_task_in_write_mode() {
    check_mode("write", "write");
}

#[test]
fn a_replica_has_every_task_in_fsync_mode() {
    check_mode("fsync", "fsync");
}

#[test]
fn a_primary_without_a_wal_refuses_replicas() {
    let primary = Tarq::start(&["--wal-mode", "none"]);
    let mut c = Client::connect(primary.addr);
    let r = c.request(|out, sync| replication::subscribe(out, sync, 0, 0, 0, FORMAT_VERSION));
    let msg = r.err(ER_REPLICATION);
    assert!(msg.contains("wal_mode = 'none'"), "{msg}");
}

#[test]
fn a_change_sent_to_a_replica_is_refused_naming_the_primary() {
    let primary = Tarq::start(&[]);
    let mut p = Client::connect(primary.addr);
    workload(&mut p, 1);
    let paddr = primary.addr.to_string();
    let mut args = replica_args(&paddr, "write");
    args.extend(["--beanstalk-listen", "127.0.0.1:0"]);
    let mut replica = Tarq::start(&args);
    let mut r = Client::connect(replica.addr);
    wait_for_same_tasks(&mut p, &mut r);
    let want = format!("read-only replica: the primary is {paddr}");
    let changes: [(&str, Vec<Value>); 6] = [
        ("queue.put", vec![s("x")]),
        ("queue.take", vec![0.into()]),
        ("queue.ack", vec![1.into()]),
        ("queue.tube.jobs:put", vec![s("x")]),
        ("queue.tube.jobs:take", vec![0.into()]),
        (
            "queue.create_tube",
            vec![s("new"), s("fifo"), opts(&[("if_not_exists", true.into())])],
        ),
    ];
    for (f, a) in changes {
        let msg = r.call(f, &a).err(tarq_iproto::codes::ER_READONLY);
        assert_eq!(msg, want, "{f}");
    }
    // Reads work.
    assert!(stat(&mut r, "total") > 0);
    r.call("queue.statistics", &[]).ok();
    let upto = numbers_used(&mut p);
    let id = tasks(&mut p, upto)[0].1;
    r.call("queue.tube.default:peek", &[id.into()]).one();
    // And the beanstalk port says the same.
    let line = replica.wait_for_line("serving the beanstalk protocol");
    let bs = addr_in(&line, "listen=").unwrap();
    let mut b = TcpStream::connect(bs).unwrap();
    b.set_read_timeout(Some(WAIT)).unwrap();
    b.write_all(b"put 0 0 60 5\r\nhello\r\n").unwrap();
    let mut got = Vec::new();
    let mut chunk = [0u8; 256];
    while !got.ends_with(b"\r\n") {
        let n = b.read(&mut chunk).unwrap();
        assert!(n > 0, "closed after {got:?}");
        got.extend_from_slice(&chunk[..n]);
    }
    assert_eq!(
        String::from_utf8_lossy(&got),
        format!("READ_ONLY {paddr}\r\n")
    );
}

#[test]
fn a_replica_killed_and_restarted_catches_up_from_its_own_wal() {
    let primary = Tarq::start(&[]);
    let mut p = Client::connect(primary.addr);
    workload(&mut p, 1);
    let paddr = primary.addr.to_string();
    let args = replica_args(&paddr, "write");
    let mut replica = Tarq::start(&args);
    let mut r = Client::connect(replica.addr);
    wait_for_same_tasks(&mut p, &mut r);
    drop(r);
    replica.signal("KILL");
    replica.wait_exit();
    workload(&mut p, 2);
    c_create_late(&mut p);
    let dir = replica.take_dir();
    let mut replica = Tarq::start_in(dir, &args);
    let mut r = Client::connect(replica.addr);
    wait_for_same_tasks(&mut p, &mut r);
    // It resumed after its own position instead of joining again.
    let line = replica.wait_for_line("streaming from the primary");
    assert!(!line.contains("after=0"), "{line}");
    assert_eq!(stat(&mut r, "replication_joins"), 0);
}

#[test]
fn a_replica_behind_the_retained_wal_joins_from_a_snapshot() {
    let mut primary = Tarq::start(&["--wal-segment-bytes", "4096", "--keep-snapshots", "1"]);
    let mut p = Client::connect(primary.addr);
    workload(&mut p, 1);
    let paddr = primary.addr.to_string();
    let args = replica_args(&paddr, "write");
    let mut replica = Tarq::start(&args);
    let mut r = Client::connect(replica.addr);
    wait_for_same_tasks(&mut p, &mut r);
    drop(r);
    replica.signal("KILL");
    replica.wait_exit();
    workload(&mut p, 2);
    workload(&mut p, 3);
    c_create_late(&mut p);
    // A snapshot, after which the WAL the replica needs is removed.
    let from = primary.log().len();
    p.call("queue.snapshot", &[]).one();
    let done = primary.wait_for_line_after(from, "snapshot done");
    assert!(done.contains(".xlog"), "the snapshot removed WAL: {done}");
    workload(&mut p, 4);
    let dir = replica.take_dir();
    let mut replica = Tarq::start_in(dir, &args);
    let mut r = Client::connect(replica.addr);
    wait_for_same_tasks(&mut p, &mut r);
    replica.wait_for_line("joined the primary");
    assert_eq!(stat(&mut r, "replication_joins"), 1);
    // And it streams on from there.
    workload(&mut p, 5);
    wait_for_same_tasks(&mut p, &mut r);
}

#[test]
fn a_replica_pointed_at_an_unrelated_primary_is_refused_and_keeps_its_tasks() {
    let a = Tarq::start(&[]);
    let mut pa = Client::connect(a.addr);
    workload(&mut pa, 1);
    let aaddr = a.addr.to_string();
    let mut replica = Tarq::start(&replica_args(&aaddr, "write"));
    let mut r = Client::connect(replica.addr);
    wait_for_same_tasks(&mut pa, &mut r);
    let upto = numbers_used(&mut pa);
    let want = tasks(&mut r, upto);
    drop(r);
    replica.signal("KILL");
    replica.wait_exit();
    // Another primary with a longer log of its own: phase 1 would have streamed its records
    // on top of the replica's.
    let b = Tarq::start(&[]);
    let mut pb = Client::connect(b.addr);
    workload(&mut pb, 7);
    workload(&mut pb, 8);
    let baddr = b.addr.to_string();
    let dir = replica.take_dir();
    let mut args = replica_args(&baddr, "write");
    args.extend(["--log-level", "debug"]);
    let mut replica = Tarq::start_in(dir, &args);
    let line = replica.wait_for_line("replication stopped");
    assert!(line.contains("of history"), "{line}");
    // It says what to do, in one readable sentence, and once: the retries that follow are
    // refused the same way and logged at debug only.
    assert!(
        line.contains("they share nothing. This replica's data directory")
            && line.contains("point --replica-of at that primary, or move"),
        "{line}"
    );
    let error = &line[line.find("error=").expect("the error field")..];
    assert!(!error.contains("  "), "a run of spaces: {error}");
    let from = replica.log().len();
    replica.wait_for_line_after(from, "replication still stopped");
    let from = replica.log().len();
    replica.wait_for_line_after(from, "replication still stopped");
    let warnings = replica
        .log()
        .iter()
        .filter(|l| l.contains("replication stopped; trying again"))
        .count();
    assert_eq!(warnings, 1, "{:#?}", replica.log());
    let mut r = Client::connect(replica.addr);
    assert_eq!(tasks(&mut r, upto), want, "the replica kept its own tasks");
    assert_eq!(stat(&mut r, "replication_joins"), 0);
}

/// A job put through the beanstalk port into `tube` (a tube of its own: the workload's tasks
/// are in others), then released, buried and kicked: its id.
fn counted_job(addr: std::net::SocketAddr, tube: &str) -> u64 {
    use tarq_beanstalk::Command;
    let mut c = beanstalk::Bs::connect(addr);
    for cmd in [
        Command::Use { tube },
        Command::Watch { tube },
        Command::Ignore { tube: "default" },
    ] {
        c.call(&cmd);
    }
    let c = &mut c;
    let id = c.put(0, b"counted");
    let r = c.call(&Command::ReserveWithTimeout { seconds: 0 });
    assert_eq!(r.number(), Some(id), "{r:?}");
    assert_eq!(
        c.call(&Command::Release {
            id,
            pri: 0,
            delay: 0
        })
        .line,
        "RELEASED"
    );
    let r = c.call(&Command::ReserveWithTimeout { seconds: 0 });
    assert_eq!(r.number(), Some(id), "{r:?}");
    assert_eq!(c.call(&Command::Bury { id, pri: 0 }).line, "BURIED");
    assert_eq!(c.call(&Command::Kick { bound: 1 }).line, "KICKED 1");
    id
}

fn job_counters(c: &mut beanstalk::Bs, id: u64) -> Vec<Option<String>> {
    let stats = c.call(&tarq_beanstalk::Command::StatsJob { id });
    ["reserves", "releases", "buries", "kicks", "timeouts"]
        .into_iter()
        .map(|k| stats.yaml(k))
        .collect()
}

#[test]
fn job_counters_reach_a_replica_by_snapshot_and_by_stream() {
    let bs_args = ["--wal-segment-bytes", "4096", "--keep-snapshots", "1"];
    let (primary, pbs) = beanstalk::start(&bs_args);
    let mut p = Client::connect(primary.addr);
    let before = counted_job(pbs, "before");
    workload(&mut p, 1);
    workload(&mut p, 2);
    // A snapshot removes the WAL from the start, so the new replica joins from it.
    p.call("queue.snapshot", &[]).one();
    let paddr = primary.addr.to_string();
    let (mut replica, rbs) = beanstalk::start(&replica_args(&paddr, "write"));
    replica.wait_for_line("joined the primary");
    let after = counted_job(pbs, "after");
    let mut pb = beanstalk::Bs::connect(pbs);
    let mut rb = beanstalk::Bs::connect(rbs);
    for id in [before, after] {
        let want = job_counters(&mut pb, id);
        assert_eq!(
            want[..4],
            [
                Some("2".into()),
                Some("1".into()),
                Some("1".into()),
                Some("1".into())
            ]
        );
        wait_until("the replica's counters", || {
            job_counters(&mut rb, id) == want
        });
    }
}

#[test]
fn a_tube_use_made_and_left_empty_goes_from_the_replica_too() {
    use tarq_beanstalk::Command;
    let (primary, pbs) = beanstalk::start(&[]);
    let paddr = primary.addr.to_string();
    let (_replica, rbs) = beanstalk::start(&replica_args(&paddr, "write"));
    let list = |addr| {
        beanstalk::Bs::connect(addr)
            .call(&Command::ListTubes)
            .yaml_list()
    };
    let mut c = beanstalk::Bs::connect(pbs);
    assert_eq!(c.call(&Command::Use { tube: "brief" }).line, "USING brief");
    let id = c.put(0, b"job");
    assert_eq!(
        c.call(&Command::Use { tube: "default" }).line,
        "USING default"
    );
    wait_until("the tube on the replica", || {
        list(rbs) == ["brief", "default"]
    });
    assert_eq!(c.call(&Command::Delete { id }).line, "DELETED");
    assert_eq!(list(pbs), ["default"]);
    wait_until("the tube gone from the replica", || {
        list(rbs) == ["default"]
    });
}

/// Issue 39: `use` on a replica answered `OUT_OF_MEMORY`. A `use` (or `watch`) of a tube the
/// replica has changes nothing and is answered `USING`; one of a tube it has not would make
/// the tube, a change, and is refused as a put is, naming the primary — a put after either
/// gets the same refusal.
#[test]
fn a_use_on_a_replica_is_using_or_read_only_as_a_put() {
    use tarq_beanstalk::Command;
    let (primary, pbs) = beanstalk::start(&[]);
    let paddr = primary.addr.to_string();
    let (_replica, rbs) = beanstalk::start(&replica_args(&paddr, "write"));
    let mut p = beanstalk::Bs::connect(pbs);
    assert_eq!(p.call(&Command::Use { tube: "held" }).line, "USING held");
    p.put(0, b"job");
    let mut r = beanstalk::Bs::connect(rbs);
    wait_until("the tube on the replica", || {
        (r.call(&Command::ListTubes).yaml_list()).contains(&"held".to_owned())
    });
    let read_only = format!("READ_ONLY {paddr}");
    assert_eq!(r.call(&Command::Use { tube: "held" }).line, "USING held");
    assert_eq!(r.call(&Command::ListTubeUsed).line, "USING held");
    assert_eq!(r.call(&Command::Watch { tube: "held" }).line, "WATCHING 2");
    let put = Command::Put {
        pri: 0,
        delay: 0,
        ttr: 60,
        body: b"x",
    };
    assert_eq!(r.call_line(&put), read_only);
    assert_eq!(r.call_line(&Command::Use { tube: "absent" }), read_only);
    assert_eq!(r.call_line(&Command::Watch { tube: "absent" }), read_only);
    // Refused, the connection is as it was: still using `held`, watching two.
    assert_eq!(r.call(&Command::ListTubeUsed).line, "USING held");
    assert_eq!(
        r.call(&Command::ListTubesWatched).yaml_list(),
        ["default", "held"]
    );
    assert_eq!(r.call_line(&put), read_only);
    assert!(!(r.call(&Command::ListTubes).yaml_list()).contains(&"absent".to_owned()));
}

/// `{0x26: {1: lsn}}`, the position as Tarantool writes it.
fn position(out: &mut Vec<u8>, lsn: u64) {
    write::uint(out, VCLOCK);
    write::map_len(out, 1);
    write::uint(out, 1);
    write::uint(out, lsn);
}

/// A replica stores its primary's records byte for byte, so the two must share the WAL
/// format: the primary names its own in the `OK`, and refuses a replica of another — also one
/// of a build from before the exchange, which names none (format 3) — saying what to do.
#[test]
fn a_primary_streams_only_to_a_replica_of_its_wal_format() {
    let primary = Tarq::start(&[]);
    let mut c = Client::connect(primary.addr);
    let older = |msg: String| {
        assert!(
            msg.contains(&format!("this primary writes WAL format {FORMAT_VERSION}"))
                && msg.contains("the replica's tarq stores format 3: upgrade the replica"),
            "{msg}"
        );
    };
    // An older replica: SUBSCRIBE with its position only, JOIN with an empty map.
    older(
        c.request(|out, sync| {
            tarq_iproto::client::request(out, SUBSCRIBE, sync, |o| {
                write::map_len(o, 1);
                position(o, 0);
            })
        })
        .err(ER_REPLICATION),
    );
    older(
        c.request(|out, sync| {
            tarq_iproto::client::request(out, JOIN, sync, |o| write::map_len(o, 0))
        })
        .err(ER_REPLICATION),
    );
    let newer = FORMAT_VERSION + 1;
    let msg = c
        .request(|out, sync| replication::join(out, sync, newer))
        .err(ER_REPLICATION);
    assert!(msg.contains("upgrade this primary"), "{msg}");
    // Its own format: the stream starts, and the `OK` names the format.
    let r = c.request(|out, sync| replication::subscribe(out, sync, 0, 0, 0, FORMAT_VERSION));
    assert_eq!(r.code, 0, "{r:?}");
    let mut body = r.body.as_slice();
    let body = rmpv::decode::read_value(&mut body).expect("a body");
    let format = body
        .as_map()
        .expect("a map")
        .iter()
        .find(|(k, _)| k.as_u64() == Some(replication::FORMAT))
        .and_then(|(_, v)| v.as_u64());
    assert_eq!(format, Some(u64::from(FORMAT_VERSION)));
}

/// A replica names its format in SUBSCRIBE and refuses a primary whose `OK` names another, or
/// none (a primary from before the exchange: format 3), before a record arrives, saying what to
/// do. The primary here is the test, answering as an older tarq did.
#[test]
fn a_replica_refuses_a_primary_of_another_wal_format() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("a port");
    let paddr = listener.local_addr().expect("bound").to_string();
    let mut replica = Tarq::start(&replica_args(&paddr, "write"));
    let (mut s, _) = listener.accept().expect("the replica connects");
    s.set_read_timeout(Some(WAIT)).expect("a timeout");
    let salt = [1; tarq_iproto::greeting::SALT_LEN];
    s.write_all(&tarq_iproto::greeting::encode(&[7; 16], &salt))
        .expect("greeting sent");
    let mut got = Vec::new();
    let mut chunk = [0u8; 4096];
    let frame = loop {
        if let Some(f) = tarq_iproto::split_frame(&got, 1 << 20).expect("a frame") {
            break got[f.prefix..f.total()].to_vec();
        }
        let n = s.read(&mut chunk).expect("the replica asks");
        assert!(n > 0, "closed after {got:?}");
        got.extend_from_slice(&chunk[..n]);
    };
    let req = tarq_iproto::request::decode(&frame).expect("a request");
    match req.kind {
        tarq_iproto::request::RequestKind::Subscribe { format, .. } => {
            assert_eq!(format, Some(FORMAT_VERSION))
        }
        other => panic!("a SUBSCRIBE, got {other:?}"),
    }
    let mut ok = Vec::new();
    let at = tarq_iproto::response::begin(&mut ok, tarq_iproto::types::OK, req.sync);
    write::map_len(&mut ok, 1);
    position(&mut ok, 0);
    tarq_iproto::response::finish(&mut ok, at);
    s.write_all(&ok).expect("answered");
    let line = replica.wait_for_line("replication stopped");
    assert!(
        line.contains(&format!(
            "the primary streams WAL format 3 and this replica's tarq stores format {FORMAT_VERSION}: \
             upgrade the primary to this replica's tarq release"
        )),
        "{line}"
    );
}
