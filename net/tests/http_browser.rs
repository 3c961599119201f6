//! The dashboard in a real browser: Debian's `chromium`, driven through `chromedriver`
//! (WebDriver; nothing downloads a browser), opens the console of a running `tarq` binary under
//! traffic. The tube table shows what `queue.statistics` gives, a chart has points, the page
//! follows a dark theme, stops listening to the event stream while hidden behind another tab
//! (and listens again when shown), pressing a buried task's Kick makes it ready, and a page
//! listing 4,096 tubes renders in under a second, and a user without `admin` is offered no
//! action button.
//! Screenshots go to `results/http-console-2026-11-27/`. Without chromium and chromedriver the
//! tests say what they skipped; under `CI=true` a missing browser fails them (`.ci/test`
//! installs both).

#[path = "support/browser.rs"]
mod browser;
#[path = "support/pki.rs"]
mod pki;
mod support;

use std::io::Write as _;
use std::net::{SocketAddr, TcpStream};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use base64::Engine as _;
use browser::{browser_present, Browser};
use rmpv::Value;
use serde_json::{json, Value as Json};
use support::{read_http_response, Client, Tarq, WAIT};

/// Where the screenshots go.
fn results() -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../results/http-console-2026-11-27");
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn s(v: &str) -> Value {
    Value::from(v)
}

const USER: &str = "ops";
const PASSWORD: &str = "s3cret";

fn start_tarq() -> (Tarq, SocketAddr) {
    let t = Tarq::start(&[
        "--http-listen",
        "127.0.0.1:0",
        "--user",
        USER,
        "--password",
        PASSWORD,
    ]);
    let http = t.metrics.expect("the HTTP address is logged");
    (t, http)
}

fn login(addr: SocketAddr) -> Client {
    let mut c = Client::connect(addr);
    let salt = c.greeting.salt.clone();
    let r = c.request(|o, sync| {
        tarq_iproto::client::auth(o, sync, USER, &tarq_iproto::auth::scramble(&salt, PASSWORD))
    });
    assert_eq!(r.code, 0);
    c
}

fn basic() -> String {
    base64::engine::general_purpose::STANDARD.encode(format!("{USER}:{PASSWORD}"))
}

/// `GET path` of the console's API with its credentials, as JSON.
fn console_get(addr: SocketAddr, path: &str) -> Json {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(WAIT)).unwrap();
    let req = format!(
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Basic {}\r\n\r\n",
        basic()
    );
    s.write_all(req.as_bytes()).unwrap();
    let got = read_http_response(&mut s);
    let text = String::from_utf8_lossy(&got);
    let (_, body) = text.split_once("\r\n\r\n").unwrap_or_default();
    serde_json::from_str(body).unwrap_or_else(|e| panic!("GET {path}: {e}: {text}"))
}

/// `queue.statistics(tube)`'s task counts.
fn task_counts(c: &mut Client, tube: &str) -> Json {
    tarq_net::ctl::to_json(&c.call("queue.statistics", &[s(tube)]).one())["tasks"].clone()
}

#[test]
fn the_dashboard_shows_the_queue_live_and_its_kick_moves_a_buried_task_to_ready() {
    if !browser_present("the_dashboard_shows_the_queue_live") {
        return;
    }
    let (t, http_addr) = start_tarq();
    let mut c = login(t.addr);
    for tube in ["work", "dead"] {
        c.call("queue.create_tube", &[s(tube), s("fifottl")]).ok();
    }
    for d in ["a", "b", "c"] {
        c.call("queue.tube.dead:put", &[s(d)]).one();
    }
    c.call("queue.tube.dead:bury", &[Value::from(1)]).one();

    // Traffic on `work` while the page is open: puts, takes, acks.
    let stop = Arc::new(AtomicBool::new(false));
    let traffic = {
        let stop = Arc::clone(&stop);
        let addr = t.addr;
        std::thread::spawn(move || {
            let mut c = login(addr);
            while !stop.load(Ordering::Relaxed) {
                c.call("queue.tube.work:put", &[s("job")]).one();
                let task = c.call("queue.tube.work:take", &[Value::from(0)]).one();
                let id = task[0].as_u64().unwrap();
                c.call("queue.tube.work:ack", &[Value::from(id)]).one();
                c.call("queue.tube.work:put", &[s("left")]).one();
            }
        })
    };

    let b = Browser::start(&basic());
    b.open(&format!("http://{http_addr}/"));
    b.until("the page is ready", "return document.body.dataset.ready");
    // A chart with points: the history loaded, then events added to it.
    b.until(
        "the rates chart has points",
        "const el = document.getElementById('chart-rates'); \
         return el.querySelector('canvas') && Number(el.dataset.points) >= 2",
    );
    b.until(
        "traffic shows in the chart",
        "const el = document.getElementById('chart-rates'); return el.dataset.nonzero === 'true' && \
         document.querySelector('tr[data-tube=\"work\"] td[data-status=\"put-rate\"]').textContent !== '0'",
    );
    // The table shows what queue.statistics gives.
    let stats = task_counts(&mut c, "dead");
    let row = b.until(
        "the dead tube's row",
        "const r = document.querySelector('tr[data-tube=\"dead\"]'); if (!r) return null; \
         const v = {}; for (const s of ['ready','taken','delayed','buried','done','total']) \
         v[s] = Number(r.querySelector(`td[data-status=\"${s}\"]`).textContent); return v;",
    );
    assert_eq!(row, stats, "the table against queue.statistics");
    // `dead` has ready tasks and no consumer: marked idle beside its name, as
    // queue.statistics says, with its consumers and its head's age in their cells.
    let st = tarq_net::ctl::to_json(&c.call("queue.statistics", &[s("dead")]).one());
    assert_eq!(st["idle"], true, "{st}");
    b.until(
        "the dead tube marked idle",
        "const r = document.querySelector('tr[data-tube=\"dead\"]'); \
         return r && r.dataset.idle === 'true' && \
         getComputedStyle(r.children[0], '::after').content === '\"idle\"' && \
         r.querySelector('td[data-status=\"takers-waiting\"]').textContent === '0' && \
         r.querySelector('td[data-status=\"takers-holding\"]').textContent === '0' && \
         r.querySelector('td[data-status=\"oldest-age\"]').textContent !== '0'",
    );
    assert_eq!(stats["buried"], 1);
    b.screenshot(&results().join("overview.png"));
    // The system's dark theme, followed.
    b.cmd(
        "POST",
        "goog/cdp/execute",
        json!({"cmd": "Emulation.setEmulatedMedia", "params": {"features": [{"name": "prefers-color-scheme", "value": "dark"}]}}),
    );
    let bg = b.script("return getComputedStyle(document.body).backgroundColor");
    assert_eq!(bg, "rgb(17, 19, 24)", "the dark background");
    b.screenshot(&results().join("overview-dark.png"));
    b.cmd(
        "POST",
        "goog/cdp/execute",
        json!({"cmd": "Emulation.setEmulatedMedia", "params": {"features": [{"name": "prefers-color-scheme", "value": "light"}]}}),
    );

    // Hidden behind another tab, the page stops listening; shown again, it listens again.
    let streams = || console_get(http_addr, "/api/server")["connections"]["event_streams"].clone();
    support::wait_until("the page's stream is open", || streams() == 1);
    let console = b.cmd("GET", "window", json!(null));
    let tab = b.cmd("POST", "window/new", json!({"type": "tab"}));
    b.cmd("POST", "window", json!({"handle": tab["handle"]}));
    support::wait_until("the hidden page's stream is closed", || streams() == 0);
    b.cmd("DELETE", "window", json!(null));
    b.cmd("POST", "window", json!({"handle": console}));
    support::wait_until("the shown page's stream is open again", || streams() == 1);

    // The tube page: its buried task, and a press of its Kick.
    b.open(&format!("http://{http_addr}/#/tube/dead"));
    b.until(
        "the tube page",
        "return document.querySelector('[data-tab=\"buried\"]')",
    );
    b.click("[data-tab=\"buried\"]");
    b.until(
        "the buried task listed",
        "return document.querySelector('#tasks tr[data-task=\"1\"] button[data-action=\"kick\"]')",
    );
    b.screenshot(&results().join("tube-buried.png"));
    b.click("#tasks tr[data-task=\"1\"] button[data-action=\"kick\"]");
    support::wait_until("the kicked task is ready", || {
        let counts = task_counts(&mut c, "dead");
        counts["buried"] == 0 && counts["ready"] == 3
    });
    b.until(
        "the page shows it",
        "const f = document.querySelector('[data-figure=\"buried\"] b'); return f && f.textContent === '0'",
    );
    b.screenshot(&results().join("tube-after-kick.png"));
    b.open(&format!("http://{http_addr}/#/cluster"));
    b.until(
        "the cluster page",
        "return document.querySelector('#cluster table')",
    );
    b.screenshot(&results().join("cluster.png"));

    stop.store(true, Ordering::Relaxed);
    traffic.join().unwrap();
}

#[test]
fn a_page_listing_4096_tubes_renders_in_under_a_second() {
    if !browser_present("a_page_listing_4096_tubes_renders") {
        return;
    }
    let (t, http_addr) = start_tarq();
    let mut c = login(t.addr);
    // `default` and 4,095 more: the most tubes a queue holds.
    for i in 0..4095 {
        c.call(
            "queue.create_tube",
            &[s(&format!("tube-{i:04}")), s("fifottl")],
        )
        .ok();
    }
    let b = Browser::start(&basic());
    // The page's build of the table, at its best of up to three loads: one load's time is
    // the machine's as much as the page's when other tests share its two cores.
    let (mut fetch, mut ms) = (f64::MAX, f64::MAX);
    for _ in 0..3 {
        b.open(&format!("http://{http_addr}/"));
        b.until("the page is ready", "return document.body.dataset.ready");
        let times = b.until(
            "the table rendered",
            "const d = document.body.dataset; return d.tubesRendered === '4096' && \
             [Number(d.tubesFetchMs), Number(d.tubesRenderMs)]",
        );
        let (f, r) = (times[0].as_f64().unwrap(), times[1].as_f64().unwrap());
        eprintln!("4096 tubes: fetched in {f} ms, rendered in {r} ms");
        (fetch, ms) = (fetch.min(f), ms.min(r));
        if ms < 1000.0 {
            break;
        }
    }
    let rows = b.script("return document.querySelectorAll('#tubes tbody tr[data-tube]').length");
    assert_eq!(rows, 4096);
    b.screenshot(&results().join("tubes-4096.png"));
    let figure = json!({
        "what": "the dashboard's tube table: 4,096 tubes fetched (5 pages of /api/tubes) and the \
                 table built from them, in the browser (the best of up to three loads)",
        "browser": "chromium (Debian), headless",
        "server": "the test build of tarq (debug)",
        "tubes": 4096,
        "fetch_ms": fetch,
        "render_ms": ms,
        "limit_ms": 1000,
    });
    std::fs::write(
        results().join("tubes-4096-render.json"),
        serde_json::to_string_pretty(&figure).unwrap() + "\n",
    )
    .unwrap();
    // The page's own work is what must fit in a second; the fetch is the server's (a debug
    // build here) and the machine's.
    assert!(ms < 1000.0, "4,096 tubes took {ms} ms to render");
}

/// The console over TLS (`--http-tls required`) in a browser that trusts the test CA as an
/// operator's would once the CA is in the system's store: the page loads over https with its
/// certificate checked (an untrusted one would stop at chromium's warning page, with no
/// console in it), under its Content-Security-Policy, and shows the queue.
#[test]
fn the_console_over_tls_opens_in_a_browser_that_trusts_the_ca() {
    if !browser_present("the_console_over_tls_opens_in_a_browser_that_trusts_the_ca") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let pki = pki::Pki::new(dir.path());
    let (crt, key) = pki.node("console");
    let t = Tarq::start(&[
        "--http-listen",
        "127.0.0.1:0",
        "--http-tls",
        "required",
        "--tls-cert",
        crt.to_str().unwrap(),
        "--tls-key",
        key.to_str().unwrap(),
        "--user",
        USER,
        "--password",
        PASSWORD,
    ]);
    let http = t.metrics.expect("the HTTP address is logged");
    let mut c = login(t.addr);
    c.call("queue.create_tube", &[s("secure"), s("fifottl")])
        .ok();
    for d in ["a", "b"] {
        c.call("queue.tube.secure:put", &[s(d)]).one();
    }

    let b = Browser::start_trusting(&basic(), &pki.ca());
    b.open(&format!("https://{http}/"));
    b.until("the page is ready", "return document.body.dataset.ready");
    let ready = b.until(
        "the secure tube's row",
        "const r = document.querySelector('tr[data-tube=\"secure\"]'); \
         return r && r.querySelector('td[data-status=\"ready\"]').textContent;",
    );
    assert_eq!(ready, "2");
    assert_eq!(b.script("return location.protocol"), "https:");
    b.screenshot(&results().join("over-tls.png"));
}

/// A user without `admin` (item 4 of issue 38): logged in with its own password, it sees the
/// figures of the tubes it has a right on and no others, and not one action button — no
/// Drop, Truncate, Pause or Kick on its tube's row or page, no Create, no Put without `put`,
/// no Delete on a task — while the bootstrap administrator sees them all. The server refuses
/// the same actions (net/tests/http_users.rs); here the page offers none.
#[test]
fn a_user_without_admin_sees_figures_and_no_action_buttons() {
    if !browser_present("a_user_without_admin_sees_figures_and_no_action_buttons") {
        return;
    }
    let (t, http) = start_tarq();
    let mut c = login(t.addr);
    for tube in ["work", "private"] {
        c.call("queue.create_tube", &[s(tube), s("fifottl")]).ok();
        c.call(&format!("queue.tube.{tube}:put"), &[s("job")]).one();
    }
    let pw = support::map(&[("password", s("w4tch"))]);
    c.call("box.schema.user.create", &[s("watcher"), pw]).ok();
    let grant = [s("watcher"), s("take"), s("tube"), s("work")];
    c.call("box.schema.user.grant", &grant).ok();
    let watcher = base64::engine::general_purpose::STANDARD.encode("watcher:w4tch");

    let b = Browser::start(&watcher);
    b.open(&format!("http://{http}/"));
    b.until("the page is ready", "return document.body.dataset.ready");
    let ready = b.until(
        "the work tube's figures",
        "const r = document.querySelector('tr[data-tube=\"work\"]'); \
         return r && r.querySelector('td[data-status=\"ready\"]').textContent;",
    );
    assert_eq!(ready, "1");
    let seen = b.script(
        "return { rows: document.querySelectorAll('#tubes tbody tr').length, \
         private: !!document.querySelector('tr[data-tube=\"private\"]'), \
         buttons: document.querySelectorAll('#tubes button').length, \
         create: document.querySelector('#create').hidden, \
         who: document.querySelector('#server').textContent }",
    );
    assert_eq!(seen["rows"], 1, "{seen}");
    assert_eq!(seen["private"], false, "{seen}");
    assert_eq!(
        seen["buttons"], 0,
        "no Drop, Truncate, Pause or Kick: {seen}"
    );
    assert_eq!(seen["create"], true, "no Create: {seen}");
    assert!(
        seen["who"].as_str().unwrap().ends_with("· watcher"),
        "{seen}"
    );
    b.screenshot(&results().join("user-without-admin.png"));
    b.open(&format!("http://{http}/#/tube/work"));
    b.until(
        "the task listed, as take allows",
        "return document.querySelector('#tasks tr[data-task]')",
    );
    let page = b.script(
        "return { actions: document.querySelectorAll('#tube-actions button').length, \
         task_buttons: document.querySelectorAll('#tasks button').length, \
         put: document.querySelector('#put').hidden }",
    );
    assert_eq!(
        page,
        json!({"actions": 0, "task_buttons": 0, "put": true}),
        "the tube page offers nothing to a taker"
    );
    drop(b);

    // The administrator, on the same server, is offered every action.
    let b = Browser::start(&basic());
    b.open(&format!("http://{http}/"));
    b.until("the page is ready", "return document.body.dataset.ready");
    b.until(
        "the Drop buttons of both tubes",
        "return ['work', 'private'].every((t) => \
         document.querySelector(`tr[data-tube=\"${t}\"] button[data-action=\"drop\"]`))",
    );
    assert_eq!(
        b.script("return document.querySelector('#create').hidden"),
        false
    );
}
