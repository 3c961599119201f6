//! Per-user limits (issue 38, item 5), end to end on a real server over real sockets:
//! `--user-max-connections` refuses a user's next connection when it authenticates, with
//! Tarantool's ER_ACCESS_DENIED and a text naming the limit, closes it, lets the user's other
//! connections go on and admits it again once one closes — the beanstalk port's connections
//! counting as `--beanstalk-user` — while the bootstrap administrator is never limited;
//! `--user-put-rate` holds a producer to the rate by answering its puts late, never with an
//! error (a lower bound on its time that no unthrottled run meets), pipelined or not, on the
//! IPROTO and the beanstalk port, while
//! another user's puts in the same seconds are answered at once; and the figures of both in
//! `/metrics` and `queue.stats()`; and a user's own limits (`tarq ctl user limit`) over the
//! defaults, kept over a kill -9.

#[path = "support/beanstalk.rs"]
mod beanstalk;
mod support;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rmpv::Value;
use support::{field, map, wait_until, Client, Reply, Tarq, TestServer};
use tarq_iproto::{auth, client};
use tarq_net::config::{Config, Credentials};

const ER_ACCESS_DENIED: u32 = 42;

fn s(v: &str) -> Value {
    Value::from(v)
}

fn auth_as(c: &mut Client, user: &str, password: &str) -> Reply {
    let salt = c.greeting.salt.clone();
    c.request(|o, sync| client::auth(o, sync, user, &auth::scramble(&salt, password)))
}

fn login(addr: SocketAddr, user: &str, password: &str) -> Client {
    let mut c = Client::connect(addr);
    let r = auth_as(&mut c, user, password);
    assert_eq!(r.code, 0, "{user} logs in: {r:?}");
    c
}

fn ok(r: Reply) -> Reply {
    assert_eq!(r.code, 0, "{r:?}");
    r
}

/// A server with a bootstrap administrator `admin`, the HTTP port (for `/metrics`) and the
/// beanstalk port acting as `worker`, changed by `tweak`; with the tubes `jobs`, `mail` and
/// `ops`, and users `bob`, `carl` and `worker` (password `pw`), each granted `put` and `take`
/// on every tube.
struct Limited {
    srv: TestServer,
    http: SocketAddr,
    beanstalk: SocketAddr,
}

impl Limited {
    fn start(tweak: impl FnOnce(&mut Config)) -> Limited {
        let (cfg, dir) = TestServer::config(|c| {
            c.http_listen = Some("127.0.0.1:0".parse().unwrap());
            c.beanstalk_listen = Some("127.0.0.1:0".parse().unwrap());
            c.beanstalk_user = Some("worker".into());
            c.auth = Some(Credentials {
                user: "admin".into(),
                password: "boot".into(),
            });
            tweak(c);
        });
        let server = tarq_net::server::Server::bind(cfg).expect("server binds");
        let http = server.http_addr().expect("the HTTP port");
        let beanstalk = server.beanstalk_addr().expect("the beanstalk port");
        let srv = TestServer::spawn(server, dir, || {});
        let mut admin = login(srv.addr, "admin", "boot");
        for tube in ["jobs", "mail", "ops"] {
            ok(admin.call("queue.create_tube", &[s(tube), s("fifo")]));
        }
        for user in ["bob", "carl", "worker"] {
            ok(admin.call(
                "box.schema.user.create",
                &[s(user), map(&[("password", s("pw"))])],
            ));
            ok(admin.call(
                "box.schema.user.grant",
                &[s(user), s("put,take"), s("tube"), s("*")],
            ));
        }
        Limited {
            srv,
            http,
            beanstalk,
        }
    }

    fn addr(&self) -> SocketAddr {
        self.srv.addr
    }

    /// The `/metrics` sample `name` (a whole line's name and labels), as a number.
    fn metric(&self, name: &str) -> f64 {
        self.try_metric(name)
            .unwrap_or_else(|| panic!("no {name} in /metrics"))
    }

    /// [`metric`](Self::metric), `None` while the page has no such sample (a user's series
    /// appear with its first connection).
    fn try_metric(&self, name: &str) -> Option<f64> {
        let (status, page) = support::http_get(self.http, "/metrics");
        assert_eq!(status, 200, "{page}");
        let prefix = format!("{name} ");
        page.lines()
            .find_map(|l| l.strip_prefix(&prefix))
            .map(|v| v.parse().unwrap())
    }
}

/// A user at `--user-max-connections` has its next connection refused when it authenticates
/// (the error names the limit, the connection is closed) while its others go on; another user
/// and the bootstrap administrator are not limited; a closed connection makes room; the
/// beanstalk port's connections count as its user's; and the figures move.
#[test]
fn a_user_at_its_connection_limit_is_refused_until_one_closes() {
    let t = Limited::start(|c| c.user_max_connections = 2);
    let mut bob1 = login(t.addr(), "bob", "pw");
    let mut bob2 = login(t.addr(), "bob", "pw");
    let mut third = Client::connect(t.addr());
    let r = auth_as(&mut third, "bob", "pw");
    assert_eq!(r.code, ER_ACCESS_DENIED, "{r:?}");
    assert_eq!(
        r.error.as_deref(),
        Some("Too many connections for user 'bob': the limit is 2 (--user-max-connections)")
    );
    assert!(third.expect_closed().is_empty(), "closed after the refusal");
    // bob's two connections go on; carl and the administrator are not bob.
    for c in [&mut bob1, &mut bob2] {
        ok(c.call("queue.tube.jobs:put", &[s("x")]));
    }
    let _carl = login(t.addr(), "carl", "pw");
    let admins: Vec<Client> = (0..4).map(|_| login(t.addr(), "admin", "boot")).collect();
    assert_eq!(t.metric("tarq_user_connections{user=\"bob\"}"), 2.0);
    assert_eq!(
        t.metric("tarq_user_connections_refused_total{user=\"bob\"}"),
        1.0
    );
    assert_eq!(t.metric("tarq_user_connections{user=\"carl\"}"), 1.0);
    assert_eq!(t.metric("tarq_refused_per_user_total"), 1.0);
    assert!(
        !support::http_get(t.http, "/metrics")
            .1
            .contains("user=\"admin\""),
        "the bootstrap administrator is no limited user"
    );
    drop(admins);

    // One of bob's closes: bob may connect again (once the server has seen the close).
    drop(bob1);
    wait_until("bob's closed connection to be let go", || {
        t.metric("tarq_user_connections{user=\"bob\"}") == 1.0
    });
    let mut bob3 = login(t.addr(), "bob", "pw");
    ok(bob3.call("queue.tube.jobs:put", &[s("y")]));
    let stats = ok(bob3.call("queue.stats", &[])).one();
    assert_eq!(field(&stats, "refused_per_user").as_u64(), Some(1));

    // The beanstalk port acts as worker: its connections are worker's.
    let mut w1 = beanstalk::Bs::connect(t.beanstalk);
    w1.call(&tarq_beanstalk::Command::Use { tube: "jobs" });
    let _w2 = login(t.addr(), "worker", "pw");
    let mut w3 = beanstalk::Bs::connect(t.beanstalk);
    assert_eq!(
        w3.recv_within(support::WAIT).expect("a clean close"),
        None,
        "worker's third connection is closed at once"
    );
    let mut w4 = Client::connect(t.addr());
    assert_eq!(auth_as(&mut w4, "worker", "pw").code, ER_ACCESS_DENIED);
    assert_eq!(
        t.metric("tarq_user_connections_refused_total{user=\"worker\"}"),
        2.0
    );
    w1.put(0, b"still served");
}

/// Puts `n` tasks into `tube` one after another as `c`'s user, asserting every answer is a
/// success; returns how long they took and the slowest answer.
fn put_each(c: &mut Client, tube: &str, n: usize) -> (Duration, Duration) {
    let start = Instant::now();
    let mut slowest = Duration::ZERO;
    for i in 0..n {
        let t0 = Instant::now();
        let r = c.call(&format!("queue.tube.{tube}:put"), &[s(&format!("job {i}"))]);
        assert_eq!(r.code, 0, "put {i} answered with an error: {r:?}");
        slowest = slowest.max(t0.elapsed());
    }
    (start.elapsed(), slowest)
}

/// At `--user-put-rate` R, a producer's N puts take at least (N - R) / R seconds (R go at
/// once, then R a second), none answered with an error, sent one by one or pipelined; in the
/// same seconds another user's puts are answered at once, and the bootstrap administrator is
/// not limited at all.
#[test]
fn puts_over_a_users_rate_are_answered_late_and_nobody_else_waits() {
    const RATE: u64 = 20;
    const N: usize = 80;
    // (N - R) / R = 3 s; the server's delays round up, so the bound is exact, less the
    // microseconds between the client's clock and the server's.
    let floor = Duration::from_millis(2_950);
    let t = Limited::start(|c| c.user_put_rate = RATE);
    let addr = t.addr();

    let bob_done = Arc::new(AtomicBool::new(false));
    let producer = {
        let done = Arc::clone(&bob_done);
        std::thread::spawn(move || {
            let mut bob = login(addr, "bob", "pw");
            let (took, _) = put_each(&mut bob, "jobs", N);
            done.store(true, Ordering::SeqCst);
            took
        })
    };
    // Once bob is being held back, carl puts (fewer than a second's worth: within his own
    // rate) and is answered at once, while bob still waits.
    wait_until("bob's puts to be delayed", || {
        t.try_metric("tarq_user_puts_delayed_total{user=\"bob\"}") > Some(0.0)
    });
    let mut carl = login(addr, "carl", "pw");
    let (carl_took, carl_slowest) = put_each(&mut carl, "mail", RATE as usize / 2);
    assert!(
        !bob_done.load(Ordering::SeqCst),
        "carl's puts ({carl_took:?}) were not answered while bob was held back"
    );
    assert!(
        carl_slowest < Duration::from_millis(1_000),
        "another user's put waited {carl_slowest:?}"
    );
    let mut admin = login(addr, "admin", "boot");
    let (admin_took, _) = put_each(&mut admin, "ops", 4 * N);
    assert!(
        admin_took < floor,
        "the bootstrap administrator is not limited: {} puts took {admin_took:?}",
        4 * N
    );

    let bob_took = producer.join().unwrap();
    assert!(
        bob_took >= floor,
        "{N} puts at {RATE}/s took {bob_took:?}, under {floor:?}: not throttled"
    );
    let delayed = t.metric("tarq_user_puts_delayed_total{user=\"bob\"}");
    // About N - R of them: fewer when the machine is slow enough that bob's puts fall
    // behind the rate for a while (its schedule then lets some through on time).
    assert!(
        delayed >= (N - RATE as usize) as f64 / 2.0 && delayed <= N as f64,
        "{delayed}"
    );
    let seconds = t.metric("tarq_user_put_delay_seconds_total{user=\"bob\"}");
    // Muted for most of the run: the round trips between one late answer and the next put
    // count against the next delay, so the sum falls short of the run by them.
    assert!(
        seconds >= 1.5 && seconds <= bob_took.as_secs_f64() + 0.01,
        "bob's connection was muted {seconds} s of {bob_took:?}"
    );
    assert_eq!(t.metric("tarq_user_puts_delayed_total{user=\"carl\"}"), 0.0);
    let stats = ok(carl.call("queue.stats", &[])).one();
    assert!(field(&stats, "puts_delayed").as_u64().unwrap() >= delayed as u64);

    // Pipelined: every put sent at once still takes its time, the connection's later requests
    // waiting unread behind the one that went over; no put fails.
    let mut bob = login(addr, "bob", "pw");
    let start = Instant::now();
    let syncs: Vec<u64> = (0..N)
        .map(|i| bob.send_call("queue.tube.jobs:put", &[s(&format!("p {i}"))]))
        .collect();
    for sync in syncs {
        let r = bob.recv();
        assert_eq!((r.sync, r.code), (sync, 0), "{r:?}");
    }
    // bob's rate is spent already: all N are late.
    let took = start.elapsed();
    let floor = Duration::from_millis(N as u64 * 1_000 / RATE - 1_050);
    assert!(took >= floor, "pipelined: {took:?}, under {floor:?}");
}

/// Runs `tarq ctl` as the bootstrap administrator against `t`; its standard output, asserting
/// success.
fn ctl(t: &Tarq, args: &[&str]) -> String {
    let mut all = vec!["--user", "admin", "--password", "boot"];
    all.extend_from_slice(args);
    let out = t.ctl(&all);
    assert!(
        out.status.success(),
        "tarq ctl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// A user's own limits (`tarq ctl user limit`, `tarq.user_limits`) override the server's:
/// bob may hold three connections where the default is one, and is held to 10 puts a second
/// where the default is no limit, while carl keeps the defaults; the limits are journaled, so
/// a kill -9 and a restart keep them; `default` gives the server's back; a bad value is
/// refused naming it.
#[test]
fn a_users_own_limits_override_the_defaults_and_survive_a_restart() {
    let args = [
        "--user",
        "admin",
        "--password",
        "boot",
        "--user-max-connections",
        "1",
    ];
    let mut t = Tarq::start(&args);
    for user in ["bob", "carl"] {
        ctl(&t, &["user", "add", user, "pw"]);
        ctl(&t, &["--tube", "*", "user", "grant", user, "put,take"]);
    }
    let mut admin = login(t.addr, "admin", "boot");
    ok(admin.call("queue.create_tube", &[s("jobs"), s("fifo")]));
    ctl(
        &t,
        &[
            "user",
            "limit",
            "bob",
            "--max-connections",
            "3",
            "--put-rate",
            "10",
        ],
    );
    let bad = admin.call(
        "tarq.user_limits",
        &[s("bob"), map(&[("put_rate", s("fast"))])],
    );
    assert_eq!(bad.code, 1, "{bad:?}");
    assert!(bad.error.unwrap().contains("put_rate \"fast\""));
    let listed: serde_json::Value = serde_json::from_str(&ctl(&t, &["user", "list"])).unwrap();
    let bob = listed
        .as_array()
        .unwrap()
        .iter()
        .find(|u| u["name"] == "bob")
        .unwrap();
    assert_eq!(
        (&bob["max_connections"], &bob["put_rate"]),
        (&3.into(), &10.into())
    );

    // bob: three connections, and 30 puts at 10 a second take at least (30 - 10) / 10 s.
    let check = |t: &Tarq| {
        let mut bobs: Vec<Client> = (0..3).map(|_| login(t.addr, "bob", "pw")).collect();
        let r = auth_as(&mut Client::connect(t.addr), "bob", "pw");
        assert_eq!(
            r.error.as_deref(),
            Some("Too many connections for user 'bob': the limit is 3 (its max_connections)")
        );
        let _carl = login(t.addr, "carl", "pw");
        let r = auth_as(&mut Client::connect(t.addr), "carl", "pw");
        assert_eq!(
            r.error.as_deref(),
            Some("Too many connections for user 'carl': the limit is 1 (--user-max-connections)")
        );
        let (took, _) = put_each(&mut bobs[0], "jobs", 30);
        assert!(
            took >= Duration::from_millis(1_950),
            "bob's 30 puts took {took:?}"
        );
        let mut carl_puts = Client::connect(t.addr);
        drop(_carl);
        wait_until("carl's connection to be let go", || {
            let mut c = Client::connect(t.addr);
            let ok = auth_as(&mut c, "carl", "pw").code == 0;
            if ok {
                carl_puts = c;
            }
            ok
        });
        let (took, _) = put_each(&mut carl_puts, "jobs", 60);
        assert!(
            took < Duration::from_millis(1_950),
            "carl has no rate: {took:?}"
        );
    };
    check(&t);

    t.signal("KILL");
    t.wait_exit();
    let mut t = Tarq::start_in(t.take_dir(), &args);
    check(&t);

    // `default`: bob is back to the server's one connection.
    ctl(
        &t,
        &["user", "limit", "bob", "--max-connections", "default"],
    );
    let _bob = login(t.addr, "bob", "pw");
    let r = auth_as(&mut Client::connect(t.addr), "bob", "pw");
    assert_eq!(
        r.error.as_deref(),
        Some("Too many connections for user 'bob': the limit is 1 (--user-max-connections)")
    );
    t.signal("TERM");
    t.wait_exit();
}

/// The beanstalk port acts as `--beanstalk-user`, and its puts are that user's: pipelined
/// puts over the rate are each answered `INSERTED`, late, the commands behind the late one
/// waiting unread, and the worker's figures move.
#[test]
fn the_beanstalk_ports_puts_are_held_to_its_users_rate() {
    const RATE: u64 = 10;
    const N: u64 = 25;
    let t = Limited::start(|c| c.user_put_rate = RATE);
    let mut w = beanstalk::Bs::connect(t.beanstalk);
    assert_eq!(
        w.call(&tarq_beanstalk::Command::Use { tube: "jobs" }).line,
        "USING jobs"
    );
    let start = Instant::now();
    for i in 0..N {
        let body = format!("job {i}");
        let put = tarq_beanstalk::Command::Put {
            pri: 0,
            delay: 0,
            ttr: 60,
            body: body.as_bytes(),
        };
        w.send(&put).expect("send");
    }
    for i in 0..N {
        let a = w.recv();
        assert_eq!(a.word(), "INSERTED", "put {i}: {a:?}");
    }
    let took = start.elapsed();
    let floor = Duration::from_millis((N - RATE) * 1_000 / RATE - 50);
    assert!(
        took >= floor,
        "{N} puts at {RATE}/s took {took:?}, under {floor:?}"
    );
    let delayed = t.metric("tarq_user_puts_delayed_total{user=\"worker\"}");
    assert!(delayed >= (N - RATE) as f64 / 2.0, "{delayed}");
    assert_eq!(t.metric("tarq_user_connections{user=\"worker\"}"), 1.0);
}
