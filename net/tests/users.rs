//! Users and grants over IPROTO (issue 38, item 2), end to end: `box.schema.user.*` and
//! `queue.tube.NAME:grant` as a net.box client calls them, each refusal in Tarantool's words
//! and code; every call of the seed API and the tube API tried by a user with and a user
//! without the right it needs (table-driven); `guest` holding only what it was granted; users
//! surviving kill -9 and reaching a replica; the beanstalk port acting as `--beanstalk-user`,
//! a refused tube answered as a missing one and counted in `/metrics`; and a server without
//! `--user` open as before, whatever users its data holds; `tarq ctl user ...`; and users
//! surviving a failover of a three-node cluster on a real etcd; and, on a sharded cluster,
//! the beanstalk port checking the rights on a job another set holds.

#[path = "support/beanstalk.rs"]
mod beanstalk;
#[path = "support/cluster.rs"]
mod cluster;
mod support;

use std::net::SocketAddr;

use rmpv::Value;
use support::{map, wait_until, Client, Reply, Tarq, TestServer};
use tarq_iproto::{auth, client};
use tarq_net::config::Credentials;

const ER_ACCESS_DENIED: u32 = 42;
const ER_NO_SUCH_PROC: u32 = 33;
const ER_DROP_USER: u32 = 44;
const ER_NO_SUCH_USER: u32 = 45;
const ER_USER_EXISTS: u32 = 46;
const ER_PASSWORD_MISMATCH: u32 = 47;
const ER_UNKNOWN_OBJECT_TYPE: u32 = 49;
const ER_PRIV_GRANTED: u32 = 89;
const ER_PRIV_NOT_GRANTED: u32 = 91;

fn s(v: &str) -> Value {
    Value::from(v)
}

fn login(addr: SocketAddr, user: &str, password: &str) -> Client {
    let mut c = Client::connect(addr);
    let r = auth_as(&mut c, user, password);
    assert_eq!(r.code, 0, "{user} logs in: {r:?}");
    c
}

fn auth_as(c: &mut Client, user: &str, password: &str) -> Reply {
    let salt = c.greeting.salt.clone();
    c.request(|o, sync| client::auth(o, sync, user, &auth::scramble(&salt, password)))
}

fn locked() -> TestServer {
    TestServer::with(|cfg| {
        cfg.auth = Some(Credentials {
            user: "admin".into(),
            password: "boot".into(),
        })
    })
}

fn ok(r: Reply) {
    assert_eq!(r.code, 0, "{r:?}");
}

/// Creates user `name` (password `pw`) through `admin`, and grants it each `(privileges,
/// tube)` of `grants`.
fn add_user(admin: &mut Client, name: &str, grants: &[(&str, &str)]) {
    ok(admin.call(
        "box.schema.user.create",
        &[s(name), map(&[("password", s("pw"))])],
    ));
    for &(privs, tube) in grants {
        ok(admin.call(
            "box.schema.user.grant",
            &[s(name), s(privs), s("tube"), s(tube)],
        ));
    }
}

/// What a call needs, in the table below.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Needs {
    Put,
    Take,
    TubeAdmin,
    AnyRight,
    ClusterAdmin,
}

/// Who holds which needs: the users the table is tried with.
const USERS: [(&str, &[Needs]); 5] = [
    ("putter", &[Needs::Put, Needs::AnyRight]),
    ("taker", &[Needs::Take, Needs::AnyRight]),
    (
        "keeper",
        &[Needs::Put, Needs::Take, Needs::TubeAdmin, Needs::AnyRight],
    ),
    ("nobody", &[]),
    (
        "ops",
        &[
            Needs::Put,
            Needs::Take,
            Needs::TubeAdmin,
            Needs::AnyRight,
            Needs::ClusterAdmin,
        ],
    ),
];

/// Every call of the seed API and the tube API, with its arguments and what it needs.
fn calls() -> Vec<(&'static str, Vec<Value>, Needs)> {
    use Needs::*;
    vec![
        ("queue.put", vec![s("x")], Put),
        ("queue.take", vec![Value::from(0)], Take),
        ("queue.ack", vec![Value::from(999)], Take),
        ("queue.release", vec![Value::from(999)], Take),
        ("queue.stats", vec![], AnyRight),
        ("queue.snapshot", vec![], ClusterAdmin),
        ("queue.tube.jobs:put", vec![s("x")], Put),
        (
            "queue.tube.jobs:put_many",
            vec![Value::Array(vec![s("x")])],
            Put,
        ),
        ("queue.tube.jobs:take", vec![Value::from(0)], Take),
        (
            "queue.tube.jobs:take_many",
            vec![Value::from(1), Value::from(0)],
            Take,
        ),
        ("queue.tube.jobs:ack", vec![Value::from(999)], Take),
        (
            "queue.tube.jobs:ack_many",
            vec![Value::Array(vec![Value::from(999)])],
            Take,
        ),
        ("queue.tube.jobs:release", vec![Value::from(999)], Take),
        (
            "queue.tube.jobs:touch",
            vec![Value::from(999), Value::from(1)],
            Take,
        ),
        ("queue.tube.jobs:peek", vec![Value::from(0)], Take),
        ("queue.tube.jobs:kick", vec![Value::from(1)], TubeAdmin),
        ("queue.tube.jobs:delete", vec![Value::from(999)], TubeAdmin),
        ("queue.tube.jobs:release_all", vec![], TubeAdmin),
        ("queue.tube.jobs:truncate", vec![], TubeAdmin),
        ("queue.statistics", vec![s("jobs")], AnyRight),
        ("queue.statistics", vec![], AnyRight),
        ("queue.identify", vec![], AnyRight),
        ("queue.state", vec![], AnyRight),
        (
            "queue.cfg",
            vec![map(&[("ttr", Value::from(0))])],
            ClusterAdmin,
        ),
        (
            "queue.create_tube",
            vec![
                s("jobs"),
                s("fifo"),
                map(&[("if_not_exists", Value::from(true))]),
            ],
            TubeAdmin,
        ),
        (
            "queue.create_tube",
            vec![s("elsewhere"), s("fifo")],
            ClusterAdmin,
        ),
        ("queue.tube.spare:drop", vec![], ClusterAdmin),
    ]
}

/// The administrator makes the tubes and users of the table.
fn set_up(admin: &mut Client) {
    for t in ["jobs", "spare"] {
        ok(admin.call("queue.create_tube", &[s(t), s("fifo")]));
    }
    for (name, _) in USERS {
        ok(admin.call(
            "box.schema.user.create",
            &[s(name), map(&[("password", s(&format!("pw-{name}")))])],
        ));
    }
    for (name, privs) in [
        ("putter", "put"),
        ("taker", "take"),
        ("keeper", "put,take,admin"),
    ] {
        for tube in ["jobs", "default"] {
            ok(admin.call(
                "box.schema.user.grant",
                &[s(name), s(privs), s("tube"), s(tube)],
            ));
        }
    }
    ok(admin.call(
        "box.schema.user.grant",
        &[s("ops"), s("read,write,execute"), s("universe")],
    ));
}

#[test]
fn every_call_is_refused_without_its_right_and_runs_with_it() {
    let srv = locked();
    let mut admin = login(srv.addr, "admin", "boot");
    set_up(&mut admin);
    for (function, args, needs) in calls() {
        for (user, holds) in USERS {
            let mut c = login(srv.addr, user, &format!("pw-{user}"));
            let r = c.call(function, &args);
            if holds.contains(&needs) {
                assert_ne!(
                    r.code, ER_ACCESS_DENIED,
                    "{user} may call {function}: {r:?}"
                );
            } else {
                let want =
                    format!("Execute access to function '{function}' is denied for user '{user}'");
                assert_eq!(r.err(ER_ACCESS_DENIED), want, "{user} calling {function}");
            }
        }
    }
    // The drop ran for ops last: the tube is gone.
    let r = admin.call("queue.tube.spare:put", &[s("x")]);
    r.err(ER_NO_SUCH_PROC);
}

#[test]
fn bury_with_take_alone_buries_only_a_task_one_holds() {
    let srv = locked();
    let mut admin = login(srv.addr, "admin", "boot");
    set_up(&mut admin);
    let mut taker = login(srv.addr, "taker", "pw-taker");
    ok(admin.call("queue.tube.jobs:put", &[s("a")]));
    ok(admin.call("queue.tube.jobs:put", &[s("b")]));
    let held = taker.call("queue.tube.jobs:take", &[Value::from(0)]).one();
    let held_id = held[0].clone();
    let other = if held_id.as_u64() == Some(0) { 1 } else { 0 };
    let r = taker.call("queue.tube.jobs:bury", &[Value::from(other)]);
    r.err(ER_ACCESS_DENIED);
    let buried = taker.call("queue.tube.jobs:bury", &[held_id]).one();
    assert_eq!(buried[1], s("!"), "{buried}");
    // An admin of the tube buries any.
    let mut keeper = login(srv.addr, "keeper", "pw-keeper");
    let buried = keeper
        .call("queue.tube.jobs:bury", &[Value::from(other)])
        .one();
    assert_eq!(buried[1], s("!"), "{buried}");
}

#[test]
fn managing_users_answers_as_tarantool_does() {
    let srv = locked();
    let mut admin = login(srv.addr, "admin", "boot");
    ok(admin.call("queue.create_tube", &[s("jobs"), s("fifo")]));
    let create = |c: &mut Client, name: &str| {
        c.call(
            "box.schema.user.create",
            &[s(name), map(&[("password", s("pw"))])],
        )
    };
    ok(create(&mut admin, "bob"));
    let r = create(&mut admin, "bob");
    assert_eq!(r.err(ER_USER_EXISTS), "User 'bob' already exists");
    ok(admin.call(
        "box.schema.user.create",
        &[s("bob"), map(&[("if_not_exists", Value::from(true))])],
    ));
    let r = admin.call("box.schema.user.passwd", &[s("nobody"), s("x")]);
    assert_eq!(r.err(ER_NO_SUCH_USER), "User 'nobody' is not found");
    for system in ["guest", "admin"] {
        let r = admin.call("box.schema.user.drop", &[s(system)]);
        assert_eq!(
            r.err(ER_DROP_USER),
            format!("Failed to drop user or role '{system}': the user or the role is a system")
        );
    }
    let grant = ["box.schema.user.grant", "box.schema.user.revoke"];
    ok(admin.call(grant[0], &[s("bob"), s("put"), s("tube"), s("jobs")]));
    let r = admin.call(grant[0], &[s("bob"), s("put"), s("tube"), s("jobs")]);
    assert_eq!(
        r.err(ER_PRIV_GRANTED),
        "User 'bob' already has put access on tube 'jobs'"
    );
    let r = admin.call(grant[1], &[s("bob"), s("take"), s("tube"), s("jobs")]);
    assert_eq!(
        r.err(ER_PRIV_NOT_GRANTED),
        "User 'bob' does not have take access on tube 'jobs'"
    );
    let r = admin.call(grant[0], &[s("bob"), s("read"), s("space"), s("jobs")]);
    assert_eq!(r.err(ER_UNKNOWN_OBJECT_TYPE), "Unknown object type 'space'");
    let r = admin.call(grant[0], &[s("bob"), s("fly"), s("tube"), s("jobs")]);
    assert_eq!(r.err(98), "Unsupported tube privilege 'fly'");

    // bob may not manage users, but may change his own password.
    let mut bob = login(srv.addr, "bob", "pw");
    let r = create(&mut bob, "carl");
    assert_eq!(
        r.err(ER_ACCESS_DENIED),
        "Execute access to function 'box.schema.user.create' is denied for user 'bob'"
    );
    ok(bob.call("box.schema.user.passwd", &[s("new")]));
    let mut again = Client::connect(srv.addr);
    let r = auth_as(&mut again, "bob", "pw");
    assert_eq!(
        r.err(ER_PASSWORD_MISMATCH),
        "Incorrect password supplied for user 'bob'"
    );
    ok(auth_as(&mut again, "bob", "new"));

    // A drop applies to connections already open.
    ok(bob.call("queue.tube.jobs:put", &[s("x")]));
    ok(admin.call("box.schema.user.drop", &[s("bob")]));
    bob.call("queue.tube.jobs:put", &[s("x")])
        .err(ER_ACCESS_DENIED);
    let r = auth_as(&mut Client::connect(srv.addr), "bob", "new");
    assert_eq!(r.err(ER_NO_SUCH_USER), "User 'bob' is not found");
}

#[test]
fn tube_grant_with_call_gives_put_and_take_and_guest_holds_only_what_it_was_given() {
    let srv = locked();
    let mut admin = login(srv.addr, "admin", "boot");
    ok(admin.call("queue.create_tube", &[s("jobs"), s("fifo")]));
    ok(admin.call(
        "box.schema.user.create",
        &[s("carl"), map(&[("password", s("pw"))])],
    ));
    let mut carl = login(srv.addr, "carl", "pw");
    carl.call("queue.tube.jobs:put", &[s("x")])
        .err(ER_ACCESS_DENIED);
    ok(admin.call(
        "queue.tube.jobs:grant",
        &[s("carl"), map(&[("call", Value::from(true))])],
    ));
    let put = carl.call("queue.tube.jobs:put", &[s("x")]).one();
    let taken = carl.call("queue.tube.jobs:take", &[Value::from(0)]).one();
    assert_eq!(put[0], taken[0]);
    ok(carl.call("queue.tube.jobs:ack", &[taken[0].clone()]));
    carl.call("queue.tube.jobs:truncate", &[])
        .err(ER_ACCESS_DENIED);

    // guest: nothing until granted, on a connection that never authenticates.
    let mut guest = Client::connect(srv.addr);
    let r = guest.call("queue.tube.jobs:put", &[s("y")]);
    assert_eq!(
        r.err(ER_ACCESS_DENIED),
        "Execute access to function 'queue.tube.jobs:put' is denied for user 'guest'"
    );
    ok(admin.call(
        "box.schema.user.grant",
        &[s("guest"), s("put"), s("tube"), s("jobs")],
    ));
    ok(guest.call("queue.tube.jobs:put", &[s("y")]));
    guest
        .call("queue.tube.jobs:take", &[Value::from(0)])
        .err(ER_ACCESS_DENIED);
    // A replica's stream is a node's alone.
    let mut c = login(srv.addr, "carl", "pw");
    let r = c.request(|o, sync| tarq_iproto::replication::join(o, sync, 5));
    assert_eq!(
        r.err(ER_ACCESS_DENIED),
        "Replication access is denied for user 'carl'"
    );
}

#[test]
fn a_server_without_a_user_stays_open_whatever_users_it_holds() {
    let srv = TestServer::start();
    let mut c = Client::connect(srv.addr);
    ok(c.call(
        "box.schema.user.create",
        &[s("bob"), map(&[("password", s("pw"))])],
    ));
    // Any AUTH is accepted and every call runs, as before users existed.
    let mut anyone = Client::connect(srv.addr);
    ok(auth_as(&mut anyone, "bob", "wrong"));
    ok(anyone.call("queue.put", &[s("x")]));
}

/// Users and grants are in the WAL: a kill -9 and a restart keep them; a replica gets them.
#[test]
fn users_survive_kill_9_and_reach_a_replica() {
    let boot = ["--user", "admin", "--password", "boot"];
    let mut primary = Tarq::start(&boot);
    let mut admin = login(primary.addr, "admin", "boot");
    ok(admin.call("queue.create_tube", &[s("jobs"), s("fifo")]));
    add_user(&mut admin, "bob", &[("put", "jobs")]);
    primary.signal("KILL");
    primary.wait_exit();
    let dir = primary.take_dir();
    let primary = Tarq::start_in(dir, &boot);
    let mut bob = login(primary.addr, "bob", "pw");
    ok(bob.call("queue.tube.jobs:put", &[s("after")]));
    bob.call("queue.tube.jobs:take", &[Value::from(0)])
        .err(ER_ACCESS_DENIED);

    // A replica of it: bob logs in there once the stream brought him, and stays a putter.
    let upstream = primary.addr.to_string();
    let mut args = vec!["--replica-of", upstream.as_str()];
    args.extend_from_slice(&boot);
    let replica = Tarq::start(&args);
    wait_until("bob reaches the replica", || {
        auth_as(&mut Client::connect(replica.addr), "bob", "pw").code == 0
    });
    let mut on_replica = login(replica.addr, "bob", "pw");
    ok(on_replica.call("queue.statistics", &[s("jobs")]));
    on_replica
        .call("queue.tube.jobs:truncate", &[])
        .err(ER_ACCESS_DENIED);
    // A revoke on the primary reaches it too.
    ok(admin_of(&primary).call(
        "box.schema.user.revoke",
        &[s("bob"), s("put"), s("tube"), s("jobs")],
    ));
    wait_until("the revoke reaches the replica", || {
        login(replica.addr, "bob", "pw")
            .call("queue.statistics", &[s("jobs")])
            .code
            == ER_ACCESS_DENIED
    });
}

fn admin_of(t: &Tarq) -> Client {
    login(t.addr, "admin", "boot")
}

/// The beanstalk port acts as `--beanstalk-user`: a tube it may not touch is not there, and
/// each refusal is counted.
#[test]
fn the_beanstalk_port_acts_as_its_user() {
    use tarq_beanstalk::Command as Bs;
    let (tarq, bs_addr) = beanstalk::start(&[
        "--user",
        "admin",
        "--password",
        "boot",
        "--beanstalk-user",
        "worker",
        "--metrics-listen",
        "127.0.0.1:0",
    ]);
    let mut admin = admin_of(&tarq);
    add_user(
        &mut admin,
        "worker",
        &[("put,take", "jobs"), ("take", "mail")],
    );
    let mut c = beanstalk::Bs::connect(bs_addr);
    // `default` is not the worker's: a put there is refused, as is a reserve from it alone.
    let put = c.call(&Bs::Put {
        pri: 0,
        delay: 0,
        ttr: 10,
        body: b"x",
    });
    assert_eq!(put.line, "NOT_FOUND");
    assert_eq!(
        c.call(&Bs::ReserveWithTimeout { seconds: 0 }).line,
        "NOT_FOUND"
    );
    assert_eq!(c.call(&Bs::Use { tube: "secret" }).line, "NOT_FOUND");
    assert_eq!(c.call(&Bs::Watch { tube: "secret" }).line, "NOT_FOUND");
    assert_eq!(
        c.call(&Bs::Use { tube: "mail" }).line,
        "NOT_FOUND",
        "take alone"
    );
    assert_eq!(c.call(&Bs::Use { tube: "jobs" }).line, "USING jobs");
    let id = c.put(0, b"job");
    assert_eq!(c.call(&Bs::Watch { tube: "jobs" }).line, "WATCHING 2");
    let r = c.call(&Bs::ReserveWithTimeout { seconds: 0 });
    assert_eq!(r.line, format!("RESERVED {id} 3"));
    assert_eq!(c.call(&Bs::Delete { id }).line, "DELETED");
    assert_eq!(
        c.call(&Bs::Kick { bound: 1 }).line,
        "NOT_FOUND",
        "kick is admin"
    );
    assert_eq!(c.call(&Bs::StatsTube { tube: "secret" }).line, "NOT_FOUND");
    let listed = c.call(&Bs::ListTubes).yaml_list();
    assert_eq!(
        listed,
        vec!["jobs".to_owned()],
        "only what the user may touch"
    );
    let (_, page) = support::http_get(tarq.metrics.expect("metrics"), "/metrics");
    let refused = page
        .lines()
        .find(|l| l.starts_with("tarq_beanstalk_refused_total "))
        .unwrap_or_else(|| panic!("no beanstalk_refused in {page}"));
    assert_eq!(refused, "tarq_beanstalk_refused_total 7");
}

/// `tarq ctl user ...` manages users through the same calls, and refuses as the server does.
#[test]
fn ctl_user_adds_grants_lists_revokes_and_drops() {
    let t = Tarq::start(&["--user", "admin", "--password", "boot"]);
    let ctl = |args: &[&str]| {
        let mut all = vec!["--user", "admin", "--password", "boot"];
        all.extend_from_slice(args);
        let out = t.ctl(&all);
        let text = String::from_utf8_lossy(&out.stdout).into_owned()
            + &String::from_utf8_lossy(&out.stderr);
        (out.status.success(), text)
    };
    let (done, text) = ctl(&["create-tube", "jobs", "fifo"]);
    assert!(done, "{text}");
    for args in [
        &["user", "add", "bob", "pw"][..],
        &["--tube", "jobs", "user", "grant", "bob", "put,take"],
        &["user", "add", "ops", "pw2"],
        &["user", "grant", "ops", "--cluster"],
    ] {
        let (done, text) = ctl(args);
        assert!(done, "{args:?}: {text}");
    }
    let (done, text) = ctl(&["user", "list"]);
    assert!(done, "{text}");
    let listed: serde_json::Value = serde_json::from_str(text.trim()).expect("JSON");
    assert_eq!(
        listed,
        serde_json::json!([
            {"name": "bob", "password": true, "admin": false, "tubes": {"jobs": "put,take"}},
            {"name": "ops", "password": true, "admin": true, "tubes": {}},
        ])
    );
    let mut bob = login(t.addr, "bob", "pw");
    ok(bob.call("queue.tube.jobs:put", &[s("x")]));
    let (done, text) = ctl(&["--tube", "jobs", "user", "revoke", "bob", "put"]);
    assert!(done, "{text}");
    bob.call("queue.tube.jobs:put", &[s("x")])
        .err(ER_ACCESS_DENIED);
    // A refusal is the server's, in Tarantool's words.
    let (done, text) = ctl(&["user", "add", "bob", "again"]);
    assert!(
        !done && text.contains("User 'bob' already exists"),
        "{text}"
    );
    let (done, text) = ctl(&["user", "grant", "bob", "put"]);
    assert!(!done && text.contains("--tube"), "{text}");
    // A user without the cluster's admin may not list.
    let out = t.ctl(&["--user", "bob", "--password", "pw", "user", "list"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success()
            && err.contains("Execute access to function 'tarq.users' is denied for user 'bob'"),
        "{err}"
    );
    let (done, text) = ctl(&["user", "drop", "bob"]);
    assert!(done, "{text}");
    let r = auth_as(&mut Client::connect(t.addr), "bob", "pw");
    assert_eq!(r.err(ER_NO_SUCH_USER), "User 'bob' is not found");
}

/// A three-node cluster on etcd: users made on the primary are on the replicas, and the
/// primary elected after a kill -9 of the first one knows them.
#[test]
fn users_survive_a_failover() {
    let etcd = cluster::Etcd::start();
    let boot = [
        "--user",
        "admin",
        "--password",
        "boot",
        "--sync-replicas",
        "1",
    ];
    let mut nodes = cluster::Nodes::start(&etcd, 3, &boot);
    let leader = nodes.wait_leader();
    let others: Vec<usize> = (0..3).filter(|&i| i != leader).collect();
    let mut admin = login(nodes.nodes[leader].addr, "admin", "boot");
    ok(admin.call("queue.create_tube", &[s("jobs"), s("fifo")]));
    add_user(&mut admin, "bob", &[("put", "jobs")]);
    for &i in &others {
        let addr = nodes.nodes[i].addr;
        wait_until("bob reaches every replica", || {
            auth_as(&mut Client::connect(addr), "bob", "pw").code == 0
        });
    }
    nodes.kill(leader);
    let new = nodes.wait_leader_among(&others);
    let mut bob = login(nodes.nodes[new].addr, "bob", "pw");
    ok(bob.call("queue.tube.jobs:put", &[s("after the failover")]));
    bob.call("queue.tube.jobs:take", &[Value::from(0)])
        .err(ER_ACCESS_DENIED);
}

/// Real clients: net.box (Tarantool's own) and tarantool-python create a user, grant it a
/// tube's right, log in as it, and read a refusal as Tarantool words it (code 42).
#[test]
fn net_box_and_tarantool_python_manage_users_and_read_refusals() {
    support::require_command("tarantool (net.box)", &["tarantool", "--version"]);
    support::require_command(
        "python3 with the tarantool connector",
        &["python3", "-c", "import tarantool"],
    );
    let scripts = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/clients/users");
    for (program, script) in [
        ("tarantool", "netbox_users.lua"),
        ("python3", "python_users.py"),
    ] {
        let t = Tarq::start(&["--user", "admin", "--password", "boot"]);
        let out = std::process::Command::new(program)
            .arg(scripts.join(script))
            .arg(t.addr.port().to_string())
            .output()
            .unwrap();
        let (stdout, stderr) = (
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr),
        );
        assert!(
            out.status.success() && stdout.contains("OK: "),
            "{script}: {}\n--- stdout ---\n{stdout}\n--- stderr ---\n{stderr}",
            out.status
        );
    }
}

/// `GET /api/users`: the users and grants as JSON, behind the bootstrap administrator's HTTP
/// Basic; no hash leaves the server.
#[test]
fn the_http_api_lists_users_to_the_administrator() {
    use base64::Engine as _;
    let (cfg, dir) = TestServer::config(|c| {
        c.http_listen = Some("127.0.0.1:0".parse().unwrap());
        c.auth = Some(Credentials {
            user: "admin".into(),
            password: "boot".into(),
        });
    });
    let server = tarq_net::server::Server::bind(cfg).expect("server binds");
    let http = server.http_addr().expect("the HTTP port is bound");
    let srv = TestServer::spawn(server, dir, || {});
    let mut admin = login(srv.addr, "admin", "boot");
    add_user(&mut admin, "bob", &[("put,take", "jobs")]);
    let get = |auth: &str| {
        let b64 = base64::engine::general_purpose::STANDARD.encode(auth);
        let request = format!(
            "GET /api/users HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Basic {b64}\r\nConnection: close\r\n\r\n"
        );
        support::http_raw(http, request.as_bytes())
    };
    let (status, body) = get("admin:boot");
    assert_eq!(status, 200, "{body}");
    let v: serde_json::Value = serde_json::from_str(&body).expect("JSON");
    assert_eq!(
        v,
        serde_json::json!({"users": [
            {"name": "bob", "password": true, "admin": false, "tubes": {"jobs": ["put", "take"]}}
        ]})
    );
    assert!(!body.contains("hash"), "{body}");
    let (status, body) = get("bob:pw");
    assert_eq!(status, 403, "bob logs in but is no administrator: {body}");

    // Managing: create, grant, revoke, password, drop, each seen over IPROTO.
    let post = |path: &str, body: serde_json::Value| {
        let b64 = base64::engine::general_purpose::STANDARD.encode("admin:boot");
        let body = body.to_string();
        let request = format!(
            "POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Basic {b64}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        );
        support::http_raw(http, request.as_bytes())
    };
    ok(admin.call("queue.create_tube", &[s("jobs"), s("fifo")]));
    let (status, body) = post(
        "/api/users",
        serde_json::json!({"name": "carl", "password": "c"}),
    );
    assert_eq!(status, 200, "{body}");
    let (status, body) = post("/api/users", serde_json::json!({"name": "carl"}));
    assert_eq!(
        (status, body.contains("User 'carl' already exists")),
        (409, true),
        "{body}"
    );
    let grant = serde_json::json!({"tube": "jobs", "rights": ["put"]});
    let (status, body) = post("/api/users/carl/grant", grant.clone());
    assert_eq!(status, 200, "{body}");
    let mut carl = login(srv.addr, "carl", "c");
    ok(carl.call("queue.tube.jobs:put", &[s("x")]));
    let (status, body) = post("/api/users/carl/revoke", grant);
    assert_eq!(status, 200, "{body}");
    carl.call("queue.tube.jobs:put", &[s("x")])
        .err(ER_ACCESS_DENIED);
    let (status, body) = post(
        "/api/users/carl/grant",
        serde_json::json!({"cluster": true}),
    );
    assert_eq!(status, 200, "{body}");
    ok(carl.call("queue.tube.jobs:truncate", &[]));
    let (status, body) = post(
        "/api/users/carl/password",
        serde_json::json!({"password": "d"}),
    );
    assert_eq!(status, 200, "{body}");
    ok(auth_as(&mut Client::connect(srv.addr), "carl", "d"));
    // Its own limits: set, listed, one given back to the server's, a bad one refused.
    let limits = serde_json::json!({"max_connections": 3, "put_rate": 10});
    let (status, body) = post("/api/users/carl/limits", limits);
    assert_eq!(status, 200, "{body}");
    let carl_listed = || {
        let (status, body) = get("admin:boot");
        assert_eq!(status, 200, "{body}");
        let v: serde_json::Value = serde_json::from_str(&body).unwrap();
        let users = v["users"].as_array().unwrap().clone();
        users.into_iter().find(|u| u["name"] == "carl").unwrap()
    };
    let carl_now = carl_listed();
    assert_eq!(
        (&carl_now["max_connections"], &carl_now["put_rate"]),
        (&3.into(), &10.into()),
        "{carl_now}"
    );
    let (status, body) = post(
        "/api/users/carl/limits",
        serde_json::json!({"put_rate": null}),
    );
    assert_eq!(status, 200, "{body}");
    let carl_now = carl_listed();
    assert_eq!(carl_now["max_connections"], 3, "{carl_now}");
    assert!(carl_now.get("put_rate").is_none(), "{carl_now}");
    let listed = admin.call("tarq.users", &[]).one();
    assert!(!tarq_net::ctl::to_json(&listed)
        .to_string()
        .contains("put_rate"));
    let (status, body) = post(
        "/api/users/carl/limits",
        serde_json::json!({"put_rate": -1}),
    );
    assert_eq!(status, 400, "{body}");
    assert!(body.contains("put_rate -1: a whole number"), "{body}");
    let (status, body) = post("/api/users/admin/drop", serde_json::json!({}));
    assert_eq!(status, 409, "{body}");
    let (status, body) = post("/api/users/carl/drop", serde_json::json!({}));
    assert_eq!(status, 200, "{body}");
    let (status, body) = post("/api/users/carl/drop", serde_json::json!({}));
    assert_eq!(
        (status, body.contains("User 'carl' is not found")),
        (404, true),
        "{body}"
    );
}

/// Users reach every replica set of a sharded cluster (issue 38): a user made through one
/// set's primary logs in on every node of both sets, its grant made through the other set's
/// replica applies everywhere, and its drop through the first set shuts it out of all of them.
/// etcd holds the cluster's table; each set's primary journals it, so its replica has it too.
#[test]
fn users_reach_every_replica_set_of_a_sharded_cluster() {
    let etcd = cluster::Etcd::start();
    let boot = ["--user", "admin", "--password", "boot"];
    let nodes = cluster::Nodes::start_sets(&etcd, &[("a", 2), ("b", 2)], &boot);
    let a = nodes.wait_leader_among(&[0, 1]);
    let b = nodes.wait_leader_among(&[2, 3]);
    let b_replica = if b == 2 { 3 } else { 2 };
    nodes.wait_following(b_replica);
    let addr = |i: usize| nodes.nodes[i].addr;
    let mut admin_a = login(addr(a), "admin", "boot");
    let opts = map(&[("partitions", Value::from(2))]);
    ok(admin_a.call("queue.create_tube", &[s("jobs"), s("fifo"), opts]));
    add_user(&mut admin_a, "bob", &[("put", "jobs")]);
    for i in 0..4 {
        wait_until(&format!("bob can log in on node {i}"), || {
            auth_as(&mut Client::connect(addr(i)), "bob", "pw").code == 0
        });
    }
    // Put through the other set: bob's right is there; take is not granted yet.
    let mut bob_b = login(addr(b), "bob", "pw");
    for n in 0..4 {
        ok(bob_b.call("queue.tube.jobs:put", &[Value::from(n)]));
    }
    bob_b
        .call("queue.tube.jobs:take", &[Value::from(0)])
        .err(ER_ACCESS_DENIED);

    // A grant through set b's replica: made in etcd, so every set's primary applies it.
    let mut admin_b_replica = login(addr(b_replica), "admin", "boot");
    ok(admin_b_replica.call(
        "box.schema.user.grant",
        &[s("bob"), s("take"), s("tube"), s("jobs")],
    ));
    let mut bob_a = login(addr(a), "bob", "pw");
    wait_until("bob's take right reaches set a", || {
        bob_a.call("queue.tube.jobs:take", &[Value::from(0)]).code == 0
    });
    for i in 0..4 {
        let listed = |c: &mut Client| {
            let users = tarq_net::ctl::to_json(&c.call("tarq.users", &[]).one());
            users.to_string().contains("put,take")
        };
        let mut admin = login(addr(i), "admin", "boot");
        wait_until(&format!("node {i} lists bob's take"), || listed(&mut admin));
    }

    // A drop through set a shuts bob out of every node.
    ok(admin_a.call("box.schema.user.drop", &[s("bob")]));
    for i in 0..4 {
        wait_until(&format!("bob is refused on node {i}"), || {
            auth_as(&mut Client::connect(addr(i)), "bob", "pw").code != 0
        });
    }

    // etcd's table lost (deleted by hand): the primaries seed it again with the users they
    // hold, and those stay everywhere.
    ok(admin_a.call(
        "box.schema.user.create",
        &[s("carl"), map(&[("password", s("c"))])],
    ));
    for i in 0..4 {
        wait_until(&format!("carl can log in on node {i}"), || {
            auth_as(&mut Client::connect(addr(i)), "carl", "c").code == 0
        });
    }
    let mut e = tarq_cluster::etcd::Client::new(vec![etcd.url.clone()]);
    let key = tarq_cluster::users::key_of("c");
    let budget = std::time::Duration::from_secs(5);
    let read = |e: &mut tarq_cluster::etcd::Client| {
        let got = e.txn(
            &[],
            &[tarq_cluster::etcd::Op::Get(key.clone())],
            &[],
            budget,
        );
        let kv = got
            .expect("etcd answers")
            .ranges
            .into_iter()
            .flatten()
            .next();
        tarq_cluster::users::parse(kv.as_ref()).expect("a table")
    };
    assert!(read(&mut e).table.contains_key("carl"));
    let del = [tarq_cluster::etcd::Op::Delete(key.clone())];
    e.txn(&[], &del, &[], budget).expect("etcd deletes");
    wait_until("the primaries seed the table again", || {
        let t = read(&mut e);
        t.revision != 0 && t.table.contains_key("carl") && !t.table.contains_key("bob")
    });
    for i in 0..4 {
        ok(auth_as(&mut Client::connect(addr(i)), "carl", "c"));
    }
}

/// A user change on a sharded cluster whose etcd does not answer is not called "not done":
/// etcd may have taken it and lost only the answer, so the reply is Tarantool's-style
/// "outcome unknown" (code 1003), and once etcd answers again the table says which.
#[test]
fn a_user_change_etcd_does_not_answer_is_of_unknown_outcome() {
    const ER_OUTCOME_UNKNOWN: u32 = 1003;
    let etcd = cluster::Etcd::start();
    let boot = ["--user", "admin", "--password", "boot"];
    let nodes = cluster::Nodes::start_sets(&etcd, &[("a", 1)], &boot);
    let a = nodes.wait_leader_among(&[0]);
    let mut admin = login(nodes.nodes[a].addr, "admin", "boot");
    etcd.pause();
    let r = admin.call(
        "box.schema.user.create",
        &[s("bob"), map(&[("password", s("pw"))])],
    );
    etcd.resume();
    let err = r.err(ER_OUTCOME_UNKNOWN);
    assert!(
        err.contains("may or may not have changed") && err.contains("etcd did not answer"),
        "{err}"
    );
}

/// On a sharded cluster the beanstalk port checks a job's tube wherever the job is: a job of
/// another set's partition is answered as one of this node's. The port looked for the job's
/// tube in this node's queue alone, and let a call naming a job it did not hold through
/// unchecked: `--beanstalk-user` peeked at a tube it has no right on and deleted, without
/// `admin`, a job of a tube it may only take from, when the job was another set's.
#[test]
fn the_beanstalk_port_checks_the_rights_on_jobs_another_set_holds() {
    use tarq_beanstalk::Command as Bs;
    let etcd = cluster::Etcd::start();
    let boot = [
        "--user",
        "admin",
        "--password",
        "boot",
        "--beanstalk-listen",
        "127.0.0.1:0",
        "--beanstalk-user",
        "worker",
    ];
    let mut nodes = cluster::Nodes::start_sets(&etcd, &[("a", 1), ("b", 1)], &boot);
    let primaries = [nodes.wait_leader_among(&[0]), nodes.wait_leader_among(&[1])];
    let addr = |i: usize| nodes.nodes[i].addr;
    let mut admin = login(addr(primaries[0]), "admin", "boot");
    for t in ["jobs", "secret"] {
        let opts = map(&[("partitions", Value::from(2))]);
        ok(admin.call("queue.create_tube", &[s(t), s("fifo"), opts]));
    }
    add_user(&mut admin, "worker", &[("take", "jobs")]);
    // A task of each tube in each set's partition: a put through a primary lands in the
    // partition it leads.
    for &p in &primaries {
        let mut c = login(addr(p), "admin", "boot");
        for t in ["jobs", "secret"] {
            let put = format!("queue.tube.{t}:put");
            wait_until(&format!("node {p} to take puts into {t}"), || {
                c.call(&put, &[s("x")]).code == 0
            });
        }
    }
    // Their whole ids, as beanstalk names them: the indexes and numbers each tube finds.
    let ids_of = |admin: &mut Client, t: &str| -> Vec<u64> {
        (1..8u64)
            .flat_map(|ix| (0..2u64).map(move |n| (ix << 41) | n))
            .filter(|&id| {
                let peek = format!("queue.tube.{t}:peek");
                admin.call(&peek, &[Value::from(id)]).code == 0
            })
            .collect()
    };
    let (jobs, secret) = (ids_of(&mut admin, "jobs"), ids_of(&mut admin, "secret"));
    assert_eq!((jobs.len(), secret.len()), (2, 2), "{jobs:?} {secret:?}");
    let bs = {
        let t = nodes.nodes[primaries[0]].tarq.as_mut().expect("running");
        let line = t.wait_for_line("serving the beanstalk protocol");
        support::addr_in(&line, "listen=").expect("the line names the address")
    };
    let mut worker = beanstalk::Bs::connect(bs);
    wait_until("the worker's right to reach set a", || {
        worker.call(&Bs::Watch { tube: "jobs" }).word() == "WATCHING"
    });
    for &id in &secret {
        assert_eq!(worker.call(&Bs::Peek { id }).line, "NOT_FOUND", "peek {id}");
        assert_eq!(worker.call(&Bs::StatsJob { id }).line, "NOT_FOUND");
    }
    for &id in &jobs {
        assert_eq!(worker.call(&Bs::Peek { id }).word(), "FOUND", "peek {id}");
        assert_eq!(worker.call(&Bs::Delete { id }).line, "NOT_FOUND", "admin");
        assert_eq!(worker.call(&Bs::KickJob { id }).line, "NOT_FOUND", "admin");
    }
    // Nothing was deleted.
    for (t, ids) in [("jobs", &jobs), ("secret", &secret)] {
        for &id in ids {
            let peek = format!("queue.tube.{t}:peek");
            ok(admin.call(&peek, &[Value::from(id)]));
        }
    }
}
