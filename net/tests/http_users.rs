//! The HTTP API and console with stored users (issue 38, item 4): HTTP Basic takes the
//! bootstrap administrator or any user with a password, and every route is tried by users
//! with and without the right it needs (table-driven): reads of a tube need some right on it
//! (without one the tube is not there, as on the beanstalk port), its tasks need `take` or
//! `admin`, a put `put`, tube and task actions `admin` on the tube, users the cluster's
//! `admin`; a refusal names the user and the right. `/api/server` says who the console acts
//! as, a tube what that user may do on it; `/metrics` asks for a user when
//! `--metrics-auth` says so.

mod support;

use std::net::SocketAddr;

use base64::Engine as _;
use rmpv::Value;
use serde_json::{json, Value as Json};
use support::{map, Client, TestServer};
use tarq_iproto::{auth, client};
use tarq_net::config::Credentials;

fn s(v: &str) -> Value {
    Value::from(v)
}

fn admin(addr: SocketAddr) -> Client {
    let mut c = Client::connect(addr);
    let salt = c.greeting.salt.clone();
    let r = c.request(|o, sync| client::auth(o, sync, "root", &auth::scramble(&salt, "boot")));
    assert_eq!(r.code, 0, "{r:?}");
    c
}

fn ok(c: &mut Client, f: &str, args: &[Value]) {
    let r = c.call(f, args);
    assert_eq!(r.code, 0, "{f}: {r:?}");
}

/// A locked server with an HTTP port; `metrics_auth` as given.
fn start(metrics_auth: bool) -> (TestServer, SocketAddr) {
    let (cfg, dir) = TestServer::config(|c| {
        c.http_listen = Some("127.0.0.1:0".parse().unwrap());
        c.metrics_auth = metrics_auth;
        c.auth = Some(Credentials {
            user: "root".into(),
            password: "boot".into(),
        });
    });
    let server = tarq_net::server::Server::bind(cfg).expect("server binds");
    let http = server.http_addr().expect("the HTTP port is bound");
    (TestServer::spawn(server, dir, || {}), http)
}

/// The users of the table, each with the password `pw`: `putter` (put on jobs), `taker`
/// (take on jobs), `keeper` (admin on jobs), `ops` (the cluster's admin), `nobody` (no
/// right), and a tube `jobs` with one ready task (id 0) and one more to act on (id 1).
fn set_up(addr: SocketAddr) {
    let mut root = admin(addr);
    ok(&mut root, "queue.create_tube", &[s("jobs"), s("fifottl")]);
    ok(&mut root, "queue.tube.jobs:put", &[s("first")]);
    ok(&mut root, "queue.tube.jobs:put", &[s("second")]);
    for (user, grant) in [
        ("putter", Some(("put", "tube", "jobs"))),
        ("taker", Some(("take", "tube", "jobs"))),
        ("keeper", Some(("admin", "tube", "jobs"))),
        ("ops", Some(("read,write,execute", "universe", ""))),
        ("nobody", None),
    ] {
        let opts = map(&[("password", s("pw"))]);
        ok(&mut root, "box.schema.user.create", &[s(user), opts]);
        if let Some((rights, kind, object)) = grant {
            let mut args = vec![s(user), s(rights), s(kind)];
            if !object.is_empty() {
                args.push(s(object));
            }
            ok(&mut root, "box.schema.user.grant", &args);
        }
    }
}

/// `method path` with `body`, as `who` (`user:password`, or no Authorization for `None`).
fn request(
    http: SocketAddr,
    who: Option<&str>,
    method: &str,
    path: &str,
    body: &Json,
) -> (u16, String) {
    let auth = who.map_or(String::new(), |w| {
        let b64 = base64::engine::general_purpose::STANDARD.encode(w);
        format!("Authorization: Basic {b64}\r\n")
    });
    let body = if method == "GET" {
        String::new()
    } else {
        body.to_string()
    };
    let req = format!(
        "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n{auth}Content-Type: application/json\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    support::http_raw(http, req.as_bytes())
}

/// What a route needs, in the table below.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Needs {
    /// Some right somewhere.
    Any,
    /// Some right on jobs: without one, jobs is 404.
    SeeJobs,
    /// take or admin on jobs (its tasks); no right at all: 404.
    Tasks,
    Put,
    /// admin on jobs.
    TubeAdmin,
    /// the cluster's admin.
    Admin,
}

/// Whether `user` has what `need` asks.
fn has(user: &str, need: Needs) -> bool {
    use Needs::*;
    match (user, need) {
        ("ops", _) => true,
        ("nobody", _) => false,
        (_, Any | SeeJobs) => true,
        ("taker" | "keeper", Tasks) => true,
        ("putter", Put) => true,
        ("keeper", TubeAdmin) => true,
        _ => false,
    }
}

/// Every route of the API but the users' own (tried last, since they change the users), with
/// what it needs. A route that changes the queue acts on task 1 or on a tube of its own.
fn routes() -> Vec<(&'static str, &'static str, Json, Needs)> {
    use Needs::*;
    vec![
        ("GET", "/api/server", json!({}), Any),
        ("GET", "/api/cluster", json!({}), Any),
        ("GET", "/api/history", json!({}), Any),
        ("GET", "/api/tubes", json!({}), Any),
        ("GET", "/api/tubes/jobs", json!({}), SeeJobs),
        ("GET", "/api/tubes/jobs/history", json!({}), SeeJobs),
        (
            "GET",
            "/api/tubes/jobs/tasks?status=ready",
            json!({}),
            Tasks,
        ),
        ("GET", "/api/tubes/jobs/tasks/0", json!({}), Tasks),
        ("POST", "/api/tubes/jobs/tasks", json!({"data": "x"}), Put),
        (
            "POST",
            "/api/tubes/jobs/pause",
            json!({"seconds": 1}),
            TubeAdmin,
        ),
        ("POST", "/api/tubes/jobs/resume", json!({}), TubeAdmin),
        (
            "POST",
            "/api/tubes/jobs/kick",
            json!({"count": 1}),
            TubeAdmin,
        ),
        ("POST", "/api/tubes/jobs/tasks/1/bury", json!({}), TubeAdmin),
        ("POST", "/api/tubes/jobs/tasks/1/kick", json!({}), TubeAdmin),
        (
            "POST",
            "/api/tubes",
            json!({"name": "more", "if_not_exists": true}),
            Admin,
        ),
        ("GET", "/api/users", json!({}), Admin),
    ]
}

#[test]
fn every_route_is_refused_without_its_right_and_served_with_it() {
    let (_srv, http) = start(false);
    set_up(_srv.addr);
    for user in ["putter", "taker", "keeper", "ops", "nobody"] {
        let who = format!("{user}:pw");
        for (method, path, body, need) in routes() {
            let (status, text) = request(http, Some(&who), method, path, &body);
            let what = format!("{user}: {method} {path} -> {status} {text}");
            if has(user, need) {
                assert!((200..300).contains(&status), "served: {what}");
            } else if matches!(need, Needs::SeeJobs | Needs::Tasks) && !has(user, Needs::SeeJobs) {
                // A tube one has no right on is not there.
                assert_eq!(status, 404, "{what}");
                assert!(text.contains("Tube not found"), "{what}");
            } else {
                assert_eq!(status, 403, "{what}");
                assert!(
                    text.contains(&format!("is denied for user '{user}'")),
                    "the refusal names the user: {what}"
                );
            }
        }
    }
    // The refusal says which right is missing.
    let (status, text) = request(
        http,
        Some("taker:pw"),
        "POST",
        "/api/tubes/jobs/drop",
        &json!({}),
    );
    assert_eq!(status, 403, "{text}");
    assert!(
        text.contains(
            "access to drop of tube 'jobs' is denied for user 'taker': it needs the admin right \
             on tube 'jobs'"
        ),
        "{text}"
    );
    // An action on a tube one cannot see is refused alike whether or not the tube is there.
    for tube in ["jobs", "absent"] {
        let path = format!("/api/tubes/{tube}/truncate");
        let (status, _) = request(http, Some("nobody:pw"), "POST", &path, &json!({}));
        assert_eq!(status, 403, "{tube}");
    }
    // The tube list shows only the tubes a user may see.
    let mut root = admin(_srv.addr);
    ok(&mut root, "queue.create_tube", &[s("secret"), s("fifo")]);
    let names = |who: &str| {
        let (status, text) = request(http, Some(who), "GET", "/api/tubes", &json!({}));
        assert_eq!(status, 200, "{text}");
        let v: Json = serde_json::from_str(&text).unwrap();
        let names: Vec<String> = (v["tubes"].as_array().unwrap().iter())
            .map(|t| t["name"].as_str().unwrap().to_owned())
            .collect();
        (names, v["total"].as_u64().unwrap())
    };
    assert_eq!(names("taker:pw"), (vec!["jobs".to_owned()], 1));
    let (all, total) = names("ops:pw");
    assert!(all.contains(&"secret".to_owned()) && total >= 3, "{all:?}");
}

#[test]
fn basic_takes_the_bootstrap_administrator_and_users_with_their_password_only() {
    let (srv, http) = start(false);
    set_up(srv.addr);
    let get = |who: Option<&str>| request(http, who, "GET", "/api/server", &json!({})).0;
    assert_eq!(get(Some("root:boot")), 200);
    assert_eq!(get(Some("taker:pw")), 200);
    assert_eq!(get(Some("taker:wrong")), 401);
    assert_eq!(get(Some("root:pw")), 401);
    assert_eq!(get(Some("ghost:pw")), 401);
    assert_eq!(
        get(Some("guest:")),
        401,
        "guest has no password to log in with"
    );
    assert_eq!(get(None), 401);
    // A user's password changed over IPROTO applies to the next request.
    let mut root = admin(srv.addr);
    ok(&mut root, "box.schema.user.passwd", &[s("taker"), s("new")]);
    assert_eq!(get(Some("taker:pw")), 401);
    assert_eq!(get(Some("taker:new")), 200);
    // A dropped user is refused at once.
    ok(&mut root, "box.schema.user.drop", &[s("taker")]);
    assert_eq!(get(Some("taker:new")), 401);
}

#[test]
fn the_server_and_each_tube_say_what_the_console_may_offer() {
    let (srv, http) = start(false);
    set_up(srv.addr);
    let get = |who: &str, path: &str| {
        let (status, text) = request(http, Some(who), "GET", path, &json!({}));
        assert_eq!(status, 200, "{who} {path}: {text}");
        serde_json::from_str::<Json>(&text).unwrap()
    };
    assert_eq!(
        get("taker:pw", "/api/server")["you"],
        json!({"user": "taker", "admin": false, "every_tube": []})
    );
    assert_eq!(
        get("root:boot", "/api/server")["you"],
        json!({"user": "root", "admin": true, "every_tube": ["put", "take", "admin"]})
    );
    assert_eq!(
        get("taker:pw", "/api/tubes/jobs")["rights"],
        json!(["take"])
    );
    assert_eq!(
        get("keeper:pw", "/api/tubes/jobs")["rights"],
        json!(["admin"])
    );
    assert_eq!(
        get("ops:pw", "/api/tubes/jobs")["rights"],
        json!(["put", "take", "admin"])
    );
}

#[test]
fn metrics_ask_for_a_user_when_set() {
    let (open, http) = start(false);
    set_up(open.addr);
    assert_eq!(request(http, None, "GET", "/metrics", &json!({})).0, 200);

    let (locked, http) = start(true);
    set_up(locked.addr);
    let (status, text) = request(http, None, "GET", "/metrics", &json!({}));
    assert_eq!(status, 401, "{text}");
    assert_eq!(
        request(http, Some("nobody:pw"), "GET", "/metrics", &json!({})).0,
        403
    );
    let (status, text) = request(http, Some("putter:pw"), "GET", "/metrics", &json!({}));
    assert_eq!(status, 200, "{text}");
    assert!(text.contains("tarq_tasks"), "{text}");
    assert_eq!(
        request(http, Some("root:boot"), "GET", "/metrics", &json!({})).0,
        200
    );
}
