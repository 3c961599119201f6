//! The HTTP port over real HTTP: every route of the JSON API answered as documented, against
//! what `queue.statistics` and the tube API say over IPROTO; paging; the security defaults
//! (read-only without credentials, HTTP Basic with them, foreign origins refused); bad input
//! (a huge head, bad JSON, a non-UTF-8 path, a slow client) answered with a clear status and
//! nothing else affected; the event stream and its cap. Servers bind port 0 and say which
//! port they got; every wait has a deadline.

mod support;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use base64::Engine as _;
use rmpv::Value;
use serde_json::{json, Value as Json};
use support::{read_http_response, TestServer, WAIT};
use tarq_net::config::{Config, Credentials};
use tarq_net::server::Server;

/// A server with its HTTP port on 127.0.0.1:0, changed by `tweak`; its HTTP address.
fn start(tweak: impl FnOnce(&mut Config)) -> (TestServer, SocketAddr) {
    let (cfg, dir) = TestServer::config(|c| {
        c.http_listen = Some("127.0.0.1:0".parse().unwrap());
        tweak(c);
    });
    let server = Server::bind(cfg).expect("server binds");
    let http = server.http_addr().expect("the HTTP port is bound");
    (TestServer::spawn(server, dir, || {}), http)
}

fn with_user(c: &mut Config) {
    c.auth = Some(Credentials {
        user: "ops".into(),
        password: "s3cret".into(),
    });
}

/// One keep-alive HTTP connection, with or without credentials.
struct Web {
    addr: SocketAddr,
    s: TcpStream,
    auth: Option<String>,
}

/// A response: status, head, body as JSON (`Null` when not JSON).
struct Resp {
    status: u16,
    head: String,
    body: String,
}

impl Resp {
    fn json(&self) -> Json {
        serde_json::from_str(&self.body).unwrap_or(Json::Null)
    }

    fn error(&self) -> String {
        self.json()["error"].as_str().unwrap_or_default().to_owned()
    }
}

impl Web {
    fn new(addr: SocketAddr) -> Web {
        let s = TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(WAIT)).unwrap();
        Web {
            addr,
            s,
            auth: None,
        }
    }

    fn user(addr: SocketAddr) -> Web {
        let mut w = Web::new(addr);
        let b64 = base64::engine::general_purpose::STANDARD.encode("ops:s3cret");
        w.auth = Some(format!("Authorization: Basic {b64}\r\n"));
        w
    }

    fn raw(&mut self, bytes: &[u8]) -> Resp {
        self.s.write_all(bytes).unwrap();
        let got = read_http_response(&mut self.s);
        let text = String::from_utf8_lossy(&got).into_owned();
        let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
        let status = head
            .split_whitespace()
            .nth(1)
            .and_then(|c| c.parse().ok())
            .unwrap_or_else(|| panic!("not an HTTP response: {text:?}"));
        Resp {
            status,
            head: head.to_owned(),
            body: body.to_owned(),
        }
    }

    fn request(&mut self, method: &str, path: &str, body: Option<&Json>, extra: &str) -> Resp {
        let body = body.map(|b| b.to_string()).unwrap_or_default();
        let req = format!(
            "{method} {path} HTTP/1.1\r\nHost: {}\r\n{}{extra}Content-Length: {}\r\n\r\n{body}",
            self.addr,
            self.auth.as_deref().unwrap_or(""),
            body.len()
        );
        self.raw(req.as_bytes())
    }

    fn get(&mut self, path: &str) -> Resp {
        self.request("GET", path, None, "")
    }

    fn post(&mut self, path: &str, body: Json) -> Resp {
        self.request("POST", path, Some(&body), "")
    }

    fn ok(&mut self, method: &str, path: &str, body: Option<Json>) -> Json {
        let r = self.request(method, path, body.as_ref(), "");
        assert!(
            r.status == 200 || r.status == 201,
            "{method} {path}: {} {}",
            r.status,
            r.body
        );
        r.json()
    }

    /// Whether the server closed this connection (reads until the end, within the wait).
    fn closed(&mut self) -> bool {
        let mut rest = Vec::new();
        self.s.read_to_end(&mut rest).is_ok()
    }
}

fn s(v: &str) -> Value {
    Value::from(v)
}

/// An IPROTO client authenticated as the configured user.
fn login(srv: &TestServer) -> support::Client {
    let mut c = srv.connect();
    let salt = c.greeting.salt.clone();
    let r = c.request(|o, sync| {
        tarq_iproto::client::auth(
            o,
            sync,
            "ops",
            &tarq_iproto::auth::scramble(&salt, "s3cret"),
        )
    });
    assert_eq!(r.code, 0);
    c
}

/// `queue.statistics(tube)` over IPROTO, as JSON.
fn statistics(c: &mut support::Client, tube: &str) -> Json {
    tarq_net::ctl::to_json(&c.call("queue.statistics", &[s(tube)]).one())
}

#[test]
fn every_route_answers_as_documented() {
    let (srv, http) = start(with_user);
    let mut c = login(&srv);
    let mut w = Web::user(http);

    // Create, and the tube API's words for a tube that exists.
    let made = w.ok(
        "POST",
        "/api/tubes",
        Some(json!({"name": "jobs", "type": "fifottl", "options": {"ttr": 30}})),
    );
    assert_eq!(made["name"], "jobs");
    assert_eq!(made["options"]["ttr"], 30.0);
    let again = w.post("/api/tubes", json!({"name": "jobs"}));
    assert_eq!(
        (again.status, again.error()),
        (409, "Space 'jobs' already exists".to_owned())
    );

    // Puts: text, bytes, any JSON value, delayed; each answered with its id.
    let t0 = w.ok(
        "POST",
        "/api/tubes/jobs/tasks",
        Some(json!({"data": "hello", "pri": 5})),
    );
    assert_eq!(t0["task"]["id"], 0);
    assert_eq!(t0["task"]["status"], "ready");
    assert_eq!(t0["task"]["data"], "hello");
    let t1 = w.ok(
        "POST",
        "/api/tubes/jobs/tasks",
        Some(json!({"data_base64": "/wA="})),
    );
    assert_eq!(t1["task"]["data_base64"], "/wA=");
    let t2 = w.ok(
        "POST",
        "/api/tubes/jobs/tasks",
        Some(json!({"data": {"n": 1}})),
    );
    assert_eq!(t2["task"]["data"], json!({"n": 1}));
    let t3 = w.ok(
        "POST",
        "/api/tubes/jobs/tasks",
        Some(json!({"data": "later", "delay": 3600})),
    );
    assert_eq!(t3["task"]["status"], "delayed");

    // The tube: tasks and calls exactly as queue.statistics reports them.
    let tube = w.ok("GET", "/api/tubes/jobs", None);
    let st = statistics(&mut c, "jobs");
    assert_eq!(tube["tasks"], st["tasks"]);
    assert_eq!(tube["calls"], st["calls"]);
    assert_eq!(
        (tube["name"].as_str(), tube["type"].as_str()),
        (Some("jobs"), Some("fifottl"))
    );
    assert!(tube["rates"]["put"].is_u64());

    // Ready tasks in take order (pri 0 first, then pri 5), paged by `after`.
    let page = w.ok("GET", "/api/tubes/jobs/tasks?status=ready&limit=1", None);
    assert_eq!(page["tasks"][0]["id"], 1);
    let after = page["next_after"].as_u64().expect("another page");
    let page2 = w.ok(
        "GET",
        &format!("/api/tubes/jobs/tasks?status=ready&limit=1&after={after}"),
        None,
    );
    assert_eq!(page2["tasks"][0]["id"], 2);
    let page3 = w.ok("GET", "/api/tubes/jobs/tasks?status=ready&after=2", None);
    assert_eq!(page3["tasks"][0]["id"], 0);
    assert_eq!(page3["next_after"], Json::Null);
    let delayed = w.ok("GET", "/api/tubes/jobs/tasks?status=delayed", None);
    assert_eq!(delayed["tasks"][0]["id"], 3);
    assert!(delayed["tasks"][0]["runat"].is_number());

    // Per task: peek, bury, kick, delete.
    assert_eq!(
        w.ok("GET", "/api/tubes/jobs/tasks/0", None)["task"]["data"],
        "hello"
    );
    let b = w.ok("POST", "/api/tubes/jobs/tasks/0/bury", Some(json!({})));
    assert_eq!(b["task"]["status"], "buried");
    assert_eq!(
        w.ok("GET", "/api/tubes/jobs/tasks?status=buried", None)["tasks"][0]["id"],
        0
    );
    let k = w.ok("POST", "/api/tubes/jobs/tasks/0/kick", None);
    assert_eq!(k["task"]["status"], "ready");
    let d = w.ok("POST", "/api/tubes/jobs/tasks/1/delete", None);
    assert_eq!(d["task"]["status"], "done");
    let gone = w.get("/api/tubes/jobs/tasks/1");
    assert_eq!(
        (gone.status, gone.error()),
        (404, "Task 1 not found".to_owned())
    );

    // A tube's kick with a count.
    w.ok("POST", "/api/tubes/jobs/tasks/0/bury", None);
    w.ok("POST", "/api/tubes/jobs/tasks/2/bury", None);
    assert_eq!(
        w.ok("POST", "/api/tubes/jobs/kick", Some(json!({"count": 5})))["kicked"],
        2
    );

    // Pause holds takes of every protocol; resume lets them have tasks again.
    w.ok(
        "POST",
        "/api/tubes/jobs/pause",
        Some(json!({"seconds": 600})),
    );
    assert!(
        w.ok("GET", "/api/tubes/jobs", None)["paused"]
            .as_f64()
            .unwrap()
            > 590.0
    );
    let held = c.call("queue.tube.jobs:take", &[Value::from(0)]).ok();
    assert!(
        held.is_empty() || held[0].is_nil(),
        "a paused tube gave {held:?}"
    );
    w.ok("POST", "/api/tubes/jobs/resume", None);
    support::wait_until("the pause ends", || {
        let got = c.call("queue.tube.jobs:take", &[Value::from(0)]).ok();
        !got.is_empty() && !got[0].is_nil()
    });
    assert_eq!(w.ok("GET", "/api/tubes/jobs", None)["paused"], Json::Null);
    let taken = w.ok("GET", "/api/tubes/jobs/tasks?status=taken", None);
    assert_eq!(taken["tasks"].as_array().unwrap().len(), 1);

    // Truncate, then drop: the tube is gone (404). A taken task keeps a drop from happening.
    drop(c);
    w.ok("POST", "/api/tubes/jobs/truncate", None);
    support::wait_until("the truncate shows", || {
        w.ok("GET", "/api/tubes/jobs", None)["tasks"]["total"] == 0
    });
    w.ok("POST", "/api/tubes/jobs/drop", None);
    let r = w.get("/api/tubes/jobs");
    assert_eq!((r.status, r.error()), (404, "Tube not found".to_owned()));
    assert_eq!(
        w.post("/api/tubes/jobs/tasks", json!({"data": "x"})).status,
        404
    );

    // The server, the cluster, the history, the OpenAPI document, the page and its assets.
    let server = w.ok("GET", "/api/server", None);
    assert_eq!(server["version"], env!("CARGO_PKG_VERSION"));
    assert!(server["connections"]["http"].as_u64().unwrap() >= 1);
    assert_eq!(server["read_only"], false);
    assert_eq!(server["listen"]["http"], http.to_string());
    assert!(server["http"]["requests"].as_u64().unwrap() > 20);
    assert!(server["http"]["errors"].as_u64().unwrap() >= 2);
    assert_eq!(server["listen"]["iproto"], srv.addr.to_string());
    assert!(server["figures"]["puts"].is_u64());
    let cluster = w.ok("GET", "/api/cluster", None);
    assert_eq!(cluster["role"], "leader");
    let history = w.ok("GET", "/api/history", None);
    assert_eq!(history["series"][0], "put");
    assert_eq!(history["overall"].as_array().unwrap().len(), 7);
    let openapi = w.ok("GET", "/api/openapi.json", None);
    assert_eq!(openapi["openapi"], "3.1.0");
    for path in [
        "/api/tubes",
        "/api/tubes/{name}/tasks/{id}/kick",
        "/api/events",
        "/metrics",
    ] {
        assert!(openapi["paths"].get(path).is_some(), "{path} documented");
    }
    let page = w.get("/");
    assert_eq!(page.status, 200);
    assert!(page.head.contains("text/html"), "{}", page.head);
    assert!(page.body.contains("<title>tarq console</title>"));
    for asset in [
        "app.js",
        "app.css",
        "uPlot.iife.min.js",
        "uPlot.min.css",
        "uPlot.LICENSE",
    ] {
        assert_eq!(w.get(&format!("/assets/{asset}")).status, 200, "{asset}");
    }
    assert_eq!(w.get("/assets/nope.js").status, 404);
    drop(srv);
}

#[test]
fn tubes_are_listed_in_pages() {
    let (srv, http) = start(with_user);
    let mut w = Web::user(http);
    for i in 0..250 {
        w.ok(
            "POST",
            "/api/tubes",
            Some(json!({"name": format!("t{i:03}")})),
        );
    }
    let mut names = Vec::new();
    let mut offset = Some(0);
    while let Some(o) = offset {
        let page = w.ok("GET", &format!("/api/tubes?offset={o}&limit=100"), None);
        assert_eq!(page["total"], 251);
        let tubes = page["tubes"].as_array().unwrap();
        assert!(tubes.len() <= 100);
        names.extend(tubes.iter().map(|t| t["name"].as_str().unwrap().to_owned()));
        offset = page["next"].as_u64();
    }
    assert_eq!(names.len(), 251);
    assert_eq!(names[0], "default");
    assert_eq!(names[250], "t249");
    let r = w.get("/api/tubes?limit=1001");
    assert_eq!(
        (r.status, r.error()),
        (400, "limit 1001: 1 to 1000".to_owned())
    );
    drop(srv);
}

#[test]
fn without_credentials_the_console_reads_and_refuses_actions_with_the_reason() {
    let (srv, http) = start(|_| {});
    let mut w = Web::new(http);
    assert_eq!(w.get("/api/tubes").status, 200);
    assert_eq!(w.ok("GET", "/api/server", None)["read_only"], true);
    for (path, body) in [
        ("/api/tubes", json!({"name": "x"})),
        ("/api/tubes/default/tasks", json!({"data": "x"})),
        ("/api/tubes/default/kick", json!({})),
        ("/api/tubes/default/truncate", json!({})),
        ("/api/tubes/default/tasks/1/delete", json!({})),
    ] {
        let r = w.post(path, body);
        assert_eq!(r.status, 403, "{path}");
        assert!(r.error().contains("--user and --password"), "{}", r.body);
    }
    assert_eq!(w.ok("GET", "/api/tubes/default", None)["tasks"]["total"], 0);
    drop(srv);
}

#[test]
fn with_credentials_everything_but_metrics_asks_for_them_and_foreign_origins_are_refused() {
    let (srv, http) = start(with_user);
    let mut anon = Web::new(http);
    let r = anon.get("/api/tubes");
    assert_eq!(r.status, 401);
    assert!(
        r.head.contains("WWW-Authenticate: Basic realm=\"tarq\""),
        "{}",
        r.head
    );
    assert_eq!(anon.get("/").status, 401);
    let (code, page) = support::http_get(http, "/metrics");
    assert_eq!(code, 200);
    assert!(page.contains("tarq_tasks 0"), "{page}");
    let mut wrong = Web::new(http);
    let b64 = base64::engine::general_purpose::STANDARD.encode("ops:guess");
    wrong.auth = Some(format!("Authorization: Basic {b64}\r\n"));
    assert_eq!(wrong.get("/api/tubes").error(), "wrong user or password");

    let mut w = Web::user(http);
    let foreign = w.request(
        "POST",
        "/api/tubes",
        Some(&json!({"name": "x"})),
        "Origin: http://evil.example\r\n",
    );
    assert_eq!(foreign.status, 403);
    assert!(
        foreign.error().contains("origin http://evil.example"),
        "{}",
        foreign.body
    );
    let own = format!("Origin: http://{http}\r\n");
    let made = w.request("POST", "/api/tubes", Some(&json!({"name": "x"})), &own);
    assert_eq!(made.status, 201, "{}", made.body);
    drop(srv);
}

#[test]
fn bad_input_gets_a_clear_status_and_nothing_else_is_affected() {
    let (srv, http) = start(with_user);
    let mut c = login(&srv);
    let mut w = Web::user(http);

    // Bad JSON, a bad field, an unknown status, a bad id: answered, the connection lives on.
    let r = w.request("POST", "/api/tubes", None, "");
    assert_eq!(
        (r.status, r.error()),
        (400, "name: a string is required".to_owned())
    );
    let r = w.raw(
        format!(
            "POST /api/tubes HTTP/1.1\r\nHost: {http}\r\n{}Content-Length: 5\r\n\r\n{{oops",
            w.auth.clone().unwrap()
        )
        .as_bytes(),
    );
    assert_eq!(r.status, 400);
    assert!(r.error().starts_with("the body is not JSON"), "{}", r.body);
    assert_eq!(
        w.post(
            "/api/tubes/default/tasks",
            json!({"data": "x", "delay": "soon"})
        )
        .status,
        400
    );
    assert_eq!(w.get("/api/tubes/default/tasks?status=lost").status, 400);
    assert_eq!(w.get("/api/tubes/default/tasks/abc").status, 400);
    assert_eq!(w.get("/api/nothing").status, 404);
    assert_eq!(w.request("DELETE", "/api/tubes", None, "").status, 405);
    assert_eq!(w.get("/api/tubes/default").status, 200, "still served");

    // A non-UTF-8 path, escaped and raw.
    assert_eq!(w.get("/api/tubes/%ff").status, 400);
    let mut raw = b"GET /api/tubes/\xff HTTP/1.1\r\nHost: x\r\n".to_vec();
    raw.extend_from_slice(w.auth.clone().unwrap().as_bytes());
    raw.extend_from_slice(b"\r\n");
    let r = Web::new(http).raw(&raw);
    assert_eq!(r.status, 400, "{}", r.body);

    // A huge head: 431, closed.
    let mut big = Web::new(http);
    let huge = format!("GET / HTTP/1.1\r\nX: {}\r\n\r\n", "y".repeat(20_000));
    let r = big.raw(huge.as_bytes());
    assert_eq!(r.status, 431);
    assert!(big.closed());
    // A body over the limit: 413 from its length, before it is sent.
    let mut fat = Web::user(http);
    let r = fat.raw(b"POST /api/tubes HTTP/1.1\r\nContent-Length: 99999999\r\n\r\n");
    assert_eq!(r.status, 413);
    // Not HTTP at all; a chunked body.
    assert_eq!(Web::new(http).raw(b"HELLO THERE\r\n\r\n").status, 400);
    let r = Web::user(http).raw(b"POST /api/tubes HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n");
    assert_eq!(r.status, 411);

    // The queue's own ports were never disturbed.
    assert_eq!(c.ping().code, 0);
    assert_eq!(w.get("/api/tubes").status, 200);
    drop(srv);
}

#[test]
fn a_slow_client_is_cut_and_the_others_are_served_meanwhile() {
    let (srv, http) = start(|c| c.limits.frame_timeout = 300_000);
    let mut slow = TcpStream::connect(http).unwrap();
    slow.set_read_timeout(Some(WAIT)).unwrap();
    slow.write_all(b"GET /api/tubes HTTP/1.1\r\nHost: x\r\n")
        .unwrap();
    let started = Instant::now();
    let mut w = Web::new(http);
    assert_eq!(
        w.get("/api/tubes").status,
        200,
        "served while the slow one waits"
    );
    let mut rest = Vec::new();
    let _ = slow.read_to_end(&mut rest);
    assert!(started.elapsed() < WAIT, "cut by the frame timeout");
    let told = String::from_utf8_lossy(&rest);
    assert!(told.starts_with("HTTP/1.1 408 Request Timeout"), "{told}");
    assert!(told.contains("frame-timeout"), "{told}");
    let server = w.ok("GET", "/api/server", None);
    assert_eq!(server["figures"]["closed_http_timeout"], 1);
    drop(srv);
}

#[test]
fn idle_timeout_closes_an_idle_connection_but_not_an_event_stream() {
    let (srv, http) = start(|c| c.limits.idle_timeout = 300_000);
    let mut stream = TcpStream::connect(http).unwrap();
    stream.set_read_timeout(Some(WAIT)).unwrap();
    stream
        .write_all(b"GET /api/events HTTP/1.1\r\nHost: x\r\n\r\n")
        .unwrap();
    let mut idle = Web::new(http);
    assert_eq!(idle.get("/api/tubes").status, 200);
    // Three events span two seconds, far past the idle timeout: the stream lives on.
    events(&mut stream, 3);
    let mut rest = Vec::new();
    let _ = idle.s.read_to_end(&mut rest);
    let told = String::from_utf8_lossy(&rest);
    assert!(told.starts_with("HTTP/1.1 408 "), "{told}");
    assert!(told.contains("idle-timeout"), "{told}");
    drop(srv);
}

/// Reads server-sent events' `data:` lines until `n` have come.
fn events(s: &mut TcpStream, n: usize) -> Vec<Json> {
    let mut got = Vec::new();
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    let deadline = Instant::now() + WAIT;
    while got.len() < n {
        assert!(Instant::now() < deadline, "no event within the wait");
        let k = s.read(&mut chunk).unwrap();
        assert!(k > 0, "the stream closed");
        buf.extend_from_slice(&chunk[..k]);
        while let Some(end) = buf.windows(2).position(|w| w == b"\n\n") {
            let ev: Vec<u8> = buf.drain(..end + 2).collect();
            let text = String::from_utf8(ev).unwrap();
            if let Some(data) = text.lines().find_map(|l| l.strip_prefix("data: ")) {
                got.push(serde_json::from_str(data).unwrap());
            }
        }
    }
    got
}

#[test]
fn the_event_stream_sends_a_second_at_a_time_and_is_capped() {
    let (srv, http) = start(with_user);
    let mut w = Web::user(http);
    w.ok(
        "POST",
        "/api/tubes/default/tasks",
        Some(json!({"data": "x"})),
    );
    let mut s = TcpStream::connect(http).unwrap();
    s.set_read_timeout(Some(WAIT)).unwrap();
    let auth = w.auth.clone().unwrap();
    s.write_all(format!("GET /api/events HTTP/1.1\r\nHost: x\r\n{auth}\r\n").as_bytes())
        .unwrap();
    let evs = events(&mut s, 3);
    let (t0, t2) = (evs[0]["t"].as_u64().unwrap(), evs[2]["t"].as_u64().unwrap());
    assert!(t2 > t0, "a new second each: {evs:?}");
    assert_eq!(evs[2]["overall"][3], 1, "one ready task");
    assert_eq!(evs[2]["tubes"]["default"][3], 1);

    // The cap: the streams beyond it get 503, the others stay.
    let mut open = Vec::new();
    for _ in 1..tarq_net::frontend::http::MAX_EVENT_STREAMS {
        let mut o = TcpStream::connect(http).unwrap();
        o.set_read_timeout(Some(WAIT)).unwrap();
        o.write_all(format!("GET /api/events HTTP/1.1\r\n{auth}\r\n").as_bytes())
            .unwrap();
        events(&mut o, 1);
        open.push(o);
    }
    let r = Web::user(http).get("/api/events");
    assert_eq!(r.status, 503);
    assert!(r.error().contains("event streams are open"), "{}", r.body);
    let server = w.ok("GET", "/api/server", None);
    assert_eq!(
        server["connections"]["event_streams"].as_u64(),
        Some(tarq_net::frontend::http::MAX_EVENT_STREAMS as u64)
    );
    events(&mut s, 1);
    drop(open);
    drop(srv);
}

#[test]
fn the_history_is_full_once_figures_were_sampled() {
    let (srv, http) = start(|_| {});
    let mut w = Web::new(http);
    support::wait_until("two samples", || {
        let h = w.ok("GET", "/api/history", None);
        h["overall"][0].as_array().is_some_and(|a| a.len() >= 2)
    });
    let h = w.ok("GET", "/api/tubes/default/history", None);
    assert!(
        h["tube"][3].as_array().is_some_and(|a| !a.is_empty()),
        "{h}"
    );
    assert_eq!(w.get("/api/tubes/nope/history").status, 404);
    let _ = Duration::ZERO;
    drop(srv);
}

/// Issue 39: a tube named `a b/c` was made and then unreachable (the path was decoded before
/// it was split), and a misspelt key (`priority`) was ignored without a word.
#[test]
fn any_tube_name_is_reachable_percent_encoded_and_unknown_keys_are_refused_by_name() {
    let (srv, http) = start(with_user);
    let mut c = login(&srv);
    let mut w = Web::user(http);
    let made = w.ok("POST", "/api/tubes", Some(json!({"name": "a b/c"})));
    assert_eq!(made["name"], "a b/c");
    let put = w.ok(
        "POST",
        "/api/tubes/a%20b%2Fc/tasks",
        Some(json!({"data": "x", "pri": 3})),
    );
    assert_eq!(put["task"]["id"], 0);
    assert_eq!(w.ok("GET", "/api/tubes/a%20b%2Fc", None)["name"], "a b/c");
    assert_eq!(
        w.ok("GET", "/api/tubes/a%20b%2Fc/tasks/0", None)["task"]["data"],
        "x"
    );
    let listed = w.ok("GET", "/api/tubes/a%20b%2Fc/tasks?status=ready", None);
    assert_eq!(listed["tasks"].as_array().map(Vec::len), Some(1));
    assert_eq!(statistics(&mut c, "a b/c")["tasks"]["ready"], 1);
    // With the slash unencoded, the path is another route (a tube `a b`'s action `c`).
    assert_eq!(w.get("/api/tubes/a%20b/c").status, 405);
    // `.` and `..` are steps in a browser's path: refused when made here, by name.
    let r = w.post("/api/tubes", json!({"name": ".."}));
    assert_eq!(
        (r.status, r.error()),
        (
            400,
            "name \"..\": a URL path cannot name this tube; choose another name".to_owned()
        )
    );

    // Unknown keys, in a put, a creation and its options, a tube action.
    let r = w.post(
        "/api/tubes/a%20b%2Fc/tasks",
        json!({"data": "x", "priority": 1}),
    );
    assert_eq!(
        (r.status, r.error()),
        (
            400,
            "unknown key \"priority\" in a put: the keys are data, data_base64, delay, ttl, ttr, \
             pri, utube"
                .to_owned()
        )
    );
    let r = w.post(
        "/api/tubes",
        json!({"name": "jobs", "options": {"ttr": 1, "priority": 1}}),
    );
    assert_eq!(r.status, 400);
    assert!(
        r.error()
            .starts_with("unknown key \"priority\" in a tube's options: the keys are ttl, ttr"),
        "{}",
        r.body
    );
    let r = w.post("/api/tubes", json!({"name": "jobs", "kind": "fifo"}));
    assert_eq!(r.status, 400);
    assert!(
        r.error()
            .starts_with("unknown key \"kind\" in a tube's creation: the keys are name, type"),
        "{}",
        r.body
    );
    // With `options`, an option beside `name` would be ignored: refused too.
    let r = w.post(
        "/api/tubes",
        json!({"name": "jobs", "ttl": 5, "options": {"ttr": 1}}),
    );
    assert_eq!(r.status, 400);
    assert!(r.error().starts_with("unknown key \"ttl\""), "{}", r.body);
    let r = w.post("/api/tubes/a%20b%2Fc/kick", json!({"cuont": 1}));
    assert_eq!(
        (r.status, r.error()),
        (
            400,
            "unknown key \"cuont\" in a kick: the keys are count".to_owned()
        )
    );
    // Nothing refused was made or put.
    assert_eq!(w.get("/api/tubes/jobs").status, 404);
    assert_eq!(statistics(&mut c, "a b/c")["tasks"]["total"], 1);
    // Options beside `name`, without `options`, still work.
    let made = w.ok(
        "POST",
        "/api/tubes",
        Some(json!({"name": "jobs", "ttr": 7})),
    );
    assert_eq!(made["options"]["ttr"], 7.0);
    drop(srv);
}

/// Issue 39: what operators of RabbitMQ and Sidekiq look at first — how many consumers a tube
/// has (waiting in a take now, holding a task now), how long its next task has waited, and
/// whether it is idle (tasks ready, no taker) — in `queue.statistics`, the API and /metrics.
#[test]
fn a_tubes_consumers_and_its_oldest_ready_age_are_shown_everywhere() {
    let (srv, http) = start(with_user);
    let mut c = login(&srv);
    let mut w = Web::user(http);
    w.ok("POST", "/api/tubes", Some(json!({"name": "jobs"})));
    for n in 0..2 {
        w.ok("POST", "/api/tubes/jobs/tasks", Some(json!({"data": n})));
    }
    let st = statistics(&mut c, "jobs");
    assert_eq!(st["consumers"], json!({"waiting": 0, "holding": 0}), "{st}");
    assert_eq!(st["idle"], true, "ready tasks and no taker: {st}");
    let age = st["oldest_ready_age"].as_f64().unwrap();
    assert!(age > 0.0, "{st}");
    // The tasks and calls are still the original's.
    assert_eq!(st["tasks"]["ready"], 2);

    // One consumer holds a task; another holds one and waits in a take for more.
    let mut holder = login(&srv);
    holder.call("queue.tube.jobs:take", &[Value::from(0)]).one();
    let mut waiter = login(&srv);
    waiter.call("queue.tube.jobs:take", &[Value::from(0)]).one();
    waiter.send_call("queue.tube.jobs:take", &[Value::from(30)]);
    support::wait_until("the waiting take to count", || {
        statistics(&mut c, "jobs")["consumers"]["waiting"] == 1
    });
    let st = statistics(&mut c, "jobs");
    assert_eq!(st["consumers"], json!({"waiting": 1, "holding": 2}), "{st}");
    assert_eq!(
        (&st["idle"], &st["oldest_ready_age"]),
        (&json!(false), &json!(0.0))
    );
    let all = tarq_net::ctl::to_json(&c.call("queue.statistics", &[]).one());
    assert_eq!(all["jobs"]["consumers"], st["consumers"]);

    let tube = w.ok("GET", "/api/tubes/jobs", None);
    assert_eq!(tube["consumers"], st["consumers"]);
    assert_eq!(tube["idle"], false);
    let listed = w.ok("GET", "/api/tubes", None);
    let row = listed["tubes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["name"] == "jobs")
        .cloned()
        .unwrap();
    assert_eq!(row["consumers"], st["consumers"]);

    // One scrape per connection: /metrics closes its connection.
    let page = Web::user(http).get("/metrics").body;
    for line in [
        "tarq_tube_takers_waiting{tube=\"jobs\"} 1\n",
        "tarq_tube_takers_holding{tube=\"jobs\"} 2\n",
        "tarq_tube_idle{tube=\"jobs\"} 0\n",
        "tarq_tube_oldest_ready_age_seconds{tube=\"jobs\"} 0\n",
        "tarq_tube_idle{tube=\"default\"} 0\n",
    ] {
        assert!(page.contains(line), "{line:?} not in:\n{page}");
    }

    // The consumers leave: their tasks come back ready and nobody takes them.
    drop(holder);
    drop(waiter);
    support::wait_until("the tube to be idle", || {
        w.ok("GET", "/api/tubes/jobs", None)["idle"] == true
    });
    let st = statistics(&mut c, "jobs");
    assert_eq!(st["consumers"], json!({"waiting": 0, "holding": 0}), "{st}");
    assert_eq!(st["tasks"]["ready"], 2);
    let page = Web::user(http).get("/metrics").body;
    assert!(page.contains("tarq_tube_idle{tube=\"jobs\"} 1\n"), "{page}");
    let aged = page
        .lines()
        .find_map(|l| l.strip_prefix("tarq_tube_oldest_ready_age_seconds{tube=\"jobs\"} "))
        .and_then(|v| v.parse::<f64>().ok())
        .expect("the age of jobs' head");
    assert!(
        aged >= age,
        "{aged} < {age}: the head is the same first task"
    );
}

/// DNS rebinding: a page of another site that points its own name at this port is, to the
/// browser, of that site, and may read what it is answered; its requests still carry that
/// name in `Host`, so they are refused (by `/metrics` too). Addresses, `localhost` and names
/// without a dot are served; once `--http-host` names the port, those names are too. Every
/// answer forbids framing by other sites and loading anything from elsewhere.
#[test]
fn a_page_of_another_site_reaching_the_port_by_its_own_name_is_refused() {
    let at = |w: &mut Web, path: &str, name: &str| {
        w.raw(format!("GET {path} HTTP/1.1\r\nHost: {name}\r\n\r\n").as_bytes())
    };
    let (_srv, http) = start(|_| {});
    let mut w = Web::new(http);
    for path in ["/api/server", "/", "/metrics"] {
        let r = at(&mut w, path, "evil.example:80");
        assert_eq!(r.status, 403, "{path}: {}", r.body);
        assert!(r.error().contains("http-host"), "{}", r.error());
    }
    let port = http.port();
    for name in [
        http.to_string(),
        format!("localhost:{port}"),
        format!("[::1]:{port}"),
        "tarq-box".into(),
    ] {
        assert_eq!(at(&mut w, "/api/server", &name).status, 200, "{name}");
    }
    let page = w.get("/");
    assert_eq!(page.status, 200);
    for header in [
        "frame-ancestors 'none'",
        "default-src 'self'",
        "X-Frame-Options: DENY",
    ] {
        assert!(page.head.contains(header), "{header}: {}", page.head);
    }

    let (_named, http) = start(|c| c.http_hosts = vec!["Tarq.Example".into()]);
    let mut w = Web::new(http);
    assert_eq!(at(&mut w, "/api/server", "tarq.example:9100").status, 200);
    assert_eq!(at(&mut w, "/api/server", "other.example").status, 403);
}

/// A tube's kick acts on its own tasks only (kick-job itself takes a task of any tube): a
/// whole id of another tube's buried task (the API takes ids past a tube's numbers) is not
/// found, and that task stays buried.
#[test]
fn a_tubes_kick_of_another_tubes_task_finds_none() {
    let (srv, http) = start(with_user);
    let mut w = Web::user(http);
    for name in ["mine", "theirs"] {
        w.ok(
            "POST",
            "/api/tubes",
            Some(json!({"name": name, "type": "fifo"})),
        );
    }
    w.ok(
        "POST",
        "/api/tubes/theirs/tasks",
        Some(json!({"data": "x"})),
    );
    w.ok("POST", "/api/tubes/theirs/tasks/0/bury", None);
    // Its whole id: the tube index (from 1) whose first number `theirs` finds.
    let id = (1..16u64)
        .map(|ix| ix << 41)
        .find(|id| w.get(&format!("/api/tubes/theirs/tasks/{id}")).status == 200)
        .expect("the task by its whole id");
    let kick = w.post(&format!("/api/tubes/mine/tasks/{id}/kick"), json!({}));
    assert_eq!(
        (kick.status, kick.error()),
        (404, format!("Task {id} not found"))
    );
    let t = w.ok("GET", "/api/tubes/theirs/tasks/0", None);
    assert_eq!(t["task"]["status"], "buried");
    drop(srv);
}
