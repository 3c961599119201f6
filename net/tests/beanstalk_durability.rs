//! Beanstalk puts through `kill -9` of the real `tarq` binary with `--wal-mode fsync`: four
//! producers, each on its own tube (`use`; `default` among them), put jobs (some delayed an
//! hour, priorities mixed) while a worker reserves and deletes in one of the tubes, until the
//! server is killed mid-load. After a restart on the same directory every job whose `INSERTED`
//! arrived is there with its body (`peek <id>`), in the tube it was put into and in its state
//! (`stats-job <id>`: delayed if put with a delay, else ready: a reservation does not outlive
//! the process), unless its `DELETED` arrived (then it is gone) or its delete was sent
//! unanswered (either is right). The same load against beanstalkd with a binlog (`-b`), killed
//! the same way, passes the same checks: the checks ask only what beanstalkd itself keeps.
//! Beside it, a job's `stats-job` counters (reserves, releases, buries, kicks, timeouts)
//! survive a `kill -9` (replayed from the WAL) and a clean stop without a WAL (from the
//! snapshot alone); and a tube `use` made is forgotten after a restart once empty (no
//! connection uses anything then), while one with a job, or made by `create_tube`, stays; and
//! a tube made after a restart at a forgotten tube's index gives none of its job ids again.

#[path = "support/beanstalk.rs"]
mod beanstalk;
mod support;

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use beanstalk::script::Beanstalkd;
use beanstalk::Bs;
use support::{prerequisite, tool, WAIT};
use tarq_beanstalk::Command;

/// The producers' tubes, one each; the worker takes from the second.
const TUBES: [&str; 4] = ["default", "alpha", "beta", "gamma"];
const WORKER_TUBE: &str = "alpha";
/// Puts answered and deletes answered before the kill: enough that it lands amid steady load.
const PUTS_BEFORE_KILL: u64 = 1500;
const DELETES_BEFORE_KILL: u64 = 100;
/// How long the load may take to get there on a busy machine.
const LOAD_DEADLINE: Duration = Duration::from_secs(60);

/// A job whose `INSERTED` arrived.
struct Put {
    tube: &'static str,
    body: String,
    delayed: bool,
}

#[derive(Default)]
struct Seen {
    put: BTreeMap<u64, Put>,
    /// Ids a delete was sent for (done, perhaps, without its reply arriving).
    delete_sent: BTreeSet<u64>,
    /// Ids whose `DELETED` arrived.
    deleted: BTreeSet<u64>,
}

/// What the client threads share: what they were answered, how far the load got, the stop.
#[derive(Clone, Default)]
struct Load {
    seen: Arc<Mutex<Seen>>,
    puts: Arc<AtomicU64>,
    deletes: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
}

/// The reply to `cmd`, or `None` once the server is gone.
fn call(c: &mut Bs, cmd: &Command<'_>) -> Option<beanstalk::Answer> {
    c.send(cmd).ok()?;
    c.recv_within(WAIT).ok().flatten()
}

impl Load {
    fn stopped(&self) -> bool {
        self.stop.load(Ordering::Relaxed)
    }

    /// Puts into tube `TUBES[p]` until stopped or the server is gone: one job in five delayed
    /// an hour, priorities cycling.
    fn produce(self, addr: SocketAddr, p: usize) {
        let Ok(mut c) = Bs::try_connect(addr) else {
            return;
        };
        let tube = TUBES[p];
        if call(&mut c, &Command::Use { tube }).is_none() {
            return;
        }
        for n in 0u32.. {
            if self.stopped() {
                return;
            }
            let body = format!("p{p}-{n}");
            let delayed = n % 5 == 0;
            let cmd = Command::Put {
                pri: n % 3,
                delay: if delayed { 3600 } else { 0 },
                ttr: 60,
                body: body.as_bytes(),
            };
            let Some(r) = call(&mut c, &cmd) else {
                return; // the server is gone
            };
            assert_eq!(r.word(), "INSERTED", "put {body}: {r:?}");
            let id = r.number().unwrap();
            let put = Put {
                tube,
                body,
                delayed,
            };
            self.seen.lock().unwrap().put.insert(id, put);
            self.puts.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Reserves from the worker's tube and deletes, until stopped or the server is gone.
    fn work(self, addr: SocketAddr) {
        let Ok(mut c) = Bs::try_connect(addr) else {
            return;
        };
        for cmd in [
            Command::Watch { tube: WORKER_TUBE },
            Command::Ignore { tube: "default" },
        ] {
            if call(&mut c, &cmd).is_none() {
                return;
            }
        }
        while !self.stopped() {
            let Some(r) = call(&mut c, &Command::ReserveWithTimeout { seconds: 1 }) else {
                return;
            };
            if r.line == "TIMED_OUT" {
                continue;
            }
            assert_eq!(r.word(), "RESERVED", "{r:?}");
            let id = r.number().unwrap();
            self.seen.lock().unwrap().delete_sent.insert(id);
            let Some(r) = call(&mut c, &Command::Delete { id }) else {
                return;
            };
            assert_eq!(r.line, "DELETED", "delete {id}");
            self.seen.lock().unwrap().deleted.insert(id);
            self.deletes.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Starts the producers and the worker.
    fn start(&self, addr: SocketAddr) -> Vec<std::thread::JoinHandle<()>> {
        let mut threads: Vec<_> = (0..TUBES.len())
            .map(|p| {
                let load = self.clone();
                std::thread::spawn(move || load.produce(addr, p))
            })
            .collect();
        let load = self.clone();
        threads.push(std::thread::spawn(move || load.work(addr)));
        threads
    }

    fn wait_until_under_way(&self) {
        let deadline = Instant::now() + LOAD_DEADLINE;
        loop {
            let (p, d) = (
                self.puts.load(Ordering::Relaxed),
                self.deletes.load(Ordering::Relaxed),
            );
            if p >= PUTS_BEFORE_KILL && d >= DELETES_BEFORE_KILL {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "the load makes progress: {p} puts, {d} deletes answered"
            );
            std::thread::yield_now();
        }
    }

    /// Stops the clients once the server is dead and hands over what they were answered.
    fn finish(self, threads: Vec<std::thread::JoinHandle<()>>) -> Seen {
        self.stop.store(true, Ordering::Relaxed);
        for t in threads {
            t.join().expect("client thread");
        }
        std::mem::take(&mut *self.seen.lock().unwrap())
    }
}

/// Checks the restarted server against what was answered before the kill.
fn check_after_restart(name: &str, addr: SocketAddr, seen: &Seen) {
    let mut c = Bs::connect(addr);
    let stats = c.call(&Command::Stats);
    assert_eq!(
        stats.yaml("current-jobs-reserved").as_deref(),
        Some("0"),
        "{name}: no reservation outlives the process"
    );
    let (mut present, mut gone) = (0, 0);
    for (&id, put) in &seen.put {
        let peek = c.call(&Command::Peek { id });
        if seen.deleted.contains(&id) {
            assert_eq!(peek.line, "NOT_FOUND", "{name}: job {id}'s DELETED arrived");
            gone += 1;
            continue;
        }
        if seen.delete_sent.contains(&id) && peek.line == "NOT_FOUND" {
            gone += 1; // deleted, its reply lost with the process
            continue;
        }
        assert_eq!(
            (peek.word(), peek.number(), peek.body.as_deref()),
            ("FOUND", Some(id), Some(put.body.as_bytes())),
            "{name}: job {id} ({}) was INSERTED",
            put.body
        );
        let stats = c.call(&Command::StatsJob { id });
        let want_state = if put.delayed { "delayed" } else { "ready" };
        assert_eq!(
            (
                stats.yaml("tube").as_deref(),
                stats.yaml("state").as_deref()
            ),
            (Some(put.tube), Some(want_state)),
            "{name}: job {id} ({})",
            put.body
        );
        present += 1;
    }
    assert!(
        present > 0 && gone > 0,
        "{name}: {present} kept, {gone} gone"
    );
}

#[test]
fn kill_9_keeps_every_inserted_beanstalk_job_in_fsync_mode() {
    let args = ["--wal-mode", "fsync"];
    // Step 1: tarq with a beanstalk port, under load.
    let (mut tarq, addr) = beanstalk::start(&args);
    let load = Load::default();
    let threads = load.start(addr);
    load.wait_until_under_way();
    // Step 2: kill -9 while puts and deletes are in flight.
    tarq.proc.0.kill().unwrap(); // SIGKILL
    tarq.proc.0.wait().unwrap();
    let seen = load.finish(threads);
    // Step 3: restart on the same directory and check every answered put.
    let (_again, addr) = beanstalk::start_in(tarq.take_dir(), &args);
    check_after_restart("tarq", addr, &seen);
}

/// The reference: beanstalkd with a binlog passes the same checks.
#[test]
fn kill_9_keeps_every_inserted_job_in_beanstalkd_with_a_binlog() {
    prerequisite("beanstalkd", tool("beanstalkd"));
    let dir = tempfile::tempdir().unwrap();
    let binlog = dir.path().to_str().unwrap();
    let server = Beanstalkd::spawn_with(&["-b", binlog, "-f", "0"]).expect("beanstalkd starts");
    let load = Load::default();
    let threads = load.start(server.addr.parse().unwrap());
    load.wait_until_under_way();
    drop(server); // SIGKILL
    let seen = load.finish(threads);
    let again = Beanstalkd::spawn_with(&["-b", binlog, "-f", "0"]).expect("beanstalkd restarts");
    check_after_restart("beanstalkd", again.addr.parse().unwrap(), &seen);
}

/// Drives one job through a release, a release with a delay and a kick-job, a bury and a kick,
/// and a TTR run out; returns its id and the counters `stats-job` then shows.
fn count_up(addr: SocketAddr) -> (u64, Vec<(&'static str, String)>) {
    let mut c = Bs::connect(addr);
    let id = c
        .call(&Command::Put {
            pri: 0,
            delay: 0,
            ttr: 1,
            body: b"counted",
        })
        .number()
        .expect("INSERTED <id>");
    let reserve = |c: &mut Bs| {
        let r = c.call(&Command::ReserveWithTimeout { seconds: 0 });
        assert_eq!((r.word(), r.number()), ("RESERVED", Some(id)), "{r:?}");
    };
    reserve(&mut c);
    assert_eq!(
        c.call(&Command::Release {
            id,
            pri: 0,
            delay: 0
        })
        .line,
        "RELEASED"
    );
    reserve(&mut c);
    assert_eq!(
        c.call(&Command::Release {
            id,
            pri: 0,
            delay: 60
        })
        .line,
        "RELEASED"
    );
    assert_eq!(c.call(&Command::KickJob { id }).line, "KICKED");
    reserve(&mut c);
    assert_eq!(c.call(&Command::Bury { id, pri: 0 }).line, "BURIED");
    assert_eq!(c.call(&Command::Kick { bound: 1 }).line, "KICKED 1");
    // Held by an idle connection, the job comes back at its 1 s TTR: a timeout.
    let mut holder = Bs::connect(addr);
    reserve(&mut holder);
    let r = c.call(&Command::ReserveWithTimeout { seconds: 10 });
    assert_eq!((r.word(), r.number()), ("RESERVED", Some(id)), "{r:?}");
    assert_eq!(
        c.call(&Command::Release {
            id,
            pri: 0,
            delay: 0
        })
        .line,
        "RELEASED"
    );
    let counters = job_counters(&mut c, id);
    let want: Vec<(&str, String)> = [
        ("reserves", 5),
        ("timeouts", 1),
        ("releases", 3),
        ("buries", 1),
        ("kicks", 2),
    ]
    .into_iter()
    .map(|(k, v)| (k, v.to_string()))
    .collect();
    assert_eq!(counters, want, "counted before the restart");
    (id, counters)
}

fn job_counters(c: &mut Bs, id: u64) -> Vec<(&'static str, String)> {
    let stats = c.call(&Command::StatsJob { id });
    ["reserves", "timeouts", "releases", "buries", "kicks"]
        .into_iter()
        .map(|k| {
            (
                k,
                stats
                    .yaml(k)
                    .unwrap_or_else(|| panic!("{k} missing: {stats:?}")),
            )
        })
        .collect()
}

#[test]
fn job_counters_survive_a_kill_9_and_a_snapshot() {
    // From the WAL: killed, restarted on the same directory.
    let args = ["--wal-mode", "write"];
    let (mut tarq, addr) = beanstalk::start(&args);
    let (id, counters) = count_up(addr);
    tarq.proc.0.kill().unwrap(); // SIGKILL
    tarq.proc.0.wait().unwrap();
    let (_again, addr) = beanstalk::start_in(tarq.take_dir(), &args);
    assert_eq!(
        job_counters(&mut Bs::connect(addr), id),
        counters,
        "after kill -9"
    );

    // From a snapshot alone: without a WAL a clean stop writes one, and the restart reads it.
    let args = ["--wal-mode", "none"];
    let (mut tarq, addr) = beanstalk::start(&args);
    let (id, counters) = count_up(addr);
    tarq.proc.signal("TERM");
    assert!(tarq.proc.wait_exit().success());
    let (_again, addr) = beanstalk::start_in(tarq.take_dir(), &args);
    assert_eq!(
        job_counters(&mut Bs::connect(addr), id),
        counters,
        "after the snapshot"
    );
}

fn list_tubes(addr: SocketAddr) -> Vec<String> {
    Bs::connect(addr).call(&Command::ListTubes).yaml_list()
}

#[test]
fn a_tube_use_made_goes_after_a_restart_once_empty() {
    let args = ["--wal-mode", "write"];
    let (mut tarq, addr) = beanstalk::start(&args);
    // Made by `create_tube`: stays, empty.
    let mut iproto = support::Client::connect(tarq.addr);
    iproto
        .call("queue.create_tube", &["made".into(), "fifottl".into()])
        .one();
    // Used, left empty, still used when the process dies; used and left with a job.
    let mut user = Bs::connect(addr);
    assert_eq!(
        user.call(&Command::Use { tube: "empty" }).line,
        "USING empty"
    );
    let mut producer = Bs::connect(addr);
    assert_eq!(
        producer.call(&Command::Use { tube: "full" }).line,
        "USING full"
    );
    let id = producer.put(0, b"job");
    drop(producer);
    let want = ["default", "empty", "full", "made"];
    assert_eq!(
        list_tubes(addr),
        want,
        "a tube with a job outlives its user"
    );
    tarq.proc.0.kill().unwrap(); // SIGKILL, `empty` still in use
    tarq.proc.0.wait().unwrap();
    drop(user);
    let (_again, addr) = beanstalk::start_in(tarq.take_dir(), &args);
    assert_eq!(
        list_tubes(addr),
        ["default", "full", "made"],
        "after the restart"
    );
    let mut c = Bs::connect(addr);
    assert_eq!(c.call(&Command::Delete { id }).line, "DELETED");
    assert_eq!(list_tubes(addr), ["default", "made"], "its last job gone");
}

/// `create_tube(..., {if_not_exists = true})` of a tube beanstalk's `use` made keeps it, as the
/// original keeps every tube it creates: it stays once its users leave, and after a restart
/// (the log says it is permanent now).
#[test]
fn a_tube_use_made_and_then_created_is_kept() {
    let args = ["--wal-mode", "write"];
    let (mut tarq, addr) = beanstalk::start(&args);
    let mut user = Bs::connect(addr);
    assert_eq!(user.call(&Command::Use { tube: "kept" }).line, "USING kept");
    let mut iproto = support::Client::connect(tarq.addr);
    let opts = support::map(&[("if_not_exists", true.into())]);
    iproto
        .call(
            "queue.create_tube",
            &["kept".into(), "fifottl".into(), opts],
        )
        .one();
    drop(user);
    // `list-tubes` collects the tubes nobody uses first.
    assert_eq!(
        list_tubes(addr),
        ["default", "kept"],
        "kept once its user left"
    );
    tarq.proc.0.kill().unwrap(); // SIGKILL: what the log says is all there is
    tarq.proc.0.wait().unwrap();
    let (_again, addr) = beanstalk::start_in(tarq.take_dir(), &args);
    assert_eq!(list_tubes(addr), ["default", "kept"], "after the restart");
    // Used and left again: still kept.
    let mut c = Bs::connect(addr);
    assert_eq!(c.call(&Command::Use { tube: "kept" }).line, "USING kept");
    drop(c);
    assert_eq!(list_tubes(addr), ["default", "kept"]);
}

/// Puts a job into `tube` (made by `use`), deletes it and leaves the tube, which is then
/// forgotten; returns the job's id.
fn put_and_forget(addr: SocketAddr, tube: &str) -> u64 {
    let mut c = Bs::connect(addr);
    assert_eq!(c.call(&Command::Use { tube }).line, format!("USING {tube}"));
    let id = c.put(0, b"job");
    assert_eq!(c.call(&Command::Delete { id }).line, "DELETED");
    assert_eq!(
        c.call(&Command::Use { tube: "default" }).line,
        "USING default"
    );
    assert!(
        !list_tubes(addr).iter().any(|t| t == tube),
        "{tube} forgotten"
    );
    id
}

#[test]
fn a_forgotten_tubes_job_ids_are_not_given_again_after_a_restart() {
    // beanstalkd never gives a job id twice; a tube `use` made comes and goes, and the next
    // one takes its index. From the WAL: killed, restarted on the same directory.
    let args = ["--wal-mode", "write"];
    let (mut tarq, addr) = beanstalk::start(&args);
    let mut given = vec![put_and_forget(addr, "t3"), put_and_forget(addr, "t4")];
    tarq.proc.0.kill().unwrap(); // SIGKILL
    tarq.proc.0.wait().unwrap();
    let (_again, addr) = beanstalk::start_in(tarq.take_dir(), &args);
    given.push(put_and_forget(addr, "t5"));
    let distinct: BTreeSet<u64> = given.iter().copied().collect();
    assert_eq!(distinct.len(), given.len(), "after kill -9: {given:?}");

    // From a snapshot alone: without a WAL a clean stop writes one while the index is free.
    let args = ["--wal-mode", "none"];
    let (mut tarq, addr) = beanstalk::start(&args);
    let before = put_and_forget(addr, "x");
    tarq.proc.signal("TERM");
    assert!(tarq.proc.wait_exit().success());
    let (_again, addr) = beanstalk::start_in(tarq.take_dir(), &args);
    let after = put_and_forget(addr, "y");
    assert_ne!(before, after, "after the snapshot");
}
