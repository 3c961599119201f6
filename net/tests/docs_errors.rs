//! The error tables of `docs/seed-api.md` and `docs/tubes.md` hold what the server says: each
//! error here is provoked on a real server (the bounds' errors on one with small limits), and
//! its code and message must stand on one row of the page's table (numbers — ids, session ids,
//! sizes — compared as "a number", since the page's examples cannot know them).

mod support;

use rmpv::Value;
use support::{Client, Reply, TestServer};

fn s(v: &str) -> Value {
    Value::from(v)
}

fn map(pairs: &[(&str, Value)]) -> Value {
    Value::Map(pairs.iter().map(|(k, v)| (s(k), v.clone())).collect())
}

/// `text` with every run of digits as `N`.
fn numbers_as_n(text: &str) -> String {
    let mut out = String::new();
    let mut in_number = false;
    for c in text.chars() {
        if c.is_ascii_digit() {
            if !in_number {
                out.push('N');
            }
            in_number = true;
        } else {
            out.push(c);
            in_number = false;
        }
    }
    out
}

/// Fails unless a table row of `page` (under docs/) has `code` in a cell and the reply's
/// message in backticks.
fn documented(page: &str, r: &Reply) {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../docs")
        .join(page);
    let doc = std::fs::read_to_string(path).unwrap();
    assert_ne!(r.code, 0, "an error was expected: {r:?}");
    let message = r.error.clone().expect("an error message");
    let (want_code, want_message) = (
        format!("| {} |", r.code),
        numbers_as_n(&format!("`{message}`")),
    );
    let found = doc
        .lines()
        .filter(|l| l.starts_with('|'))
        .any(|l| l.contains(&want_code) && numbers_as_n(l).contains(&want_message));
    assert!(
        found,
        "docs/{page} has no row with code {} and `{message}`",
        r.code
    );
}

#[test]
fn the_seed_api_errors_are_the_ones_docs_seed_api_lists() {
    let server = TestServer::start();
    let mut c = server.connect();
    let mut other = Client::connect(server.addr);
    let page = "seed-api.md";
    let put = |c: &mut Client, opts: Value| c.call("queue.put", &[s("x"), opts]);

    documented(page, &c.call("queue.ack", &[]));
    documented(page, &c.call("queue.ack", &[Value::from(7_000)]));
    let id = c.call("queue.put", &[s("x")]).one()["id"].clone();
    documented(page, &c.call("queue.release", std::slice::from_ref(&id)));
    c.call("queue.take", &[]).one();
    documented(page, &other.call("queue.ack", &[id]));
    documented(page, &c.call("queue.ack", &[s("x")]));
    documented(page, &put(&mut c, map(&[("tll", Value::from(1))])));
    documented(page, &put(&mut c, map(&[("delay", s("soon"))])));
    documented(page, &put(&mut c, map(&[("pri", Value::from(1.5))])));
    documented(page, &put(&mut c, map(&[("ttl", Value::from(0))])));
    documented(page, &put(&mut c, map(&[("delay", Value::from(-1))])));
    documented(page, &put(&mut c, map(&[("ttl", Value::from(1e10))])));
    documented(page, &put(&mut c, Value::from(5)));
    documented(page, &c.call("queue.nope", &[]));
}

#[test]
fn the_tube_api_errors_are_the_ones_docs_tubes_lists() {
    let server = TestServer::start();
    let mut c = server.connect();
    let page = "tubes.md";
    let create =
        |c: &mut Client, name: &str, kind: &str| c.call("queue.create_tube", &[s(name), s(kind)]);

    create(&mut c, "jobs", "fifo").one();
    documented(page, &create(&mut c, "jobs", "fifo"));
    documented(page, &create(&mut c, "other", "lifo"));
    documented(page, &create(&mut c, &"t".repeat(201), "fifo"));
    documented(page, &c.call("queue.tube.jobs:ack", &[Value::from(1)]));
    documented(page, &c.call("queue.tube.jobs:peek", &[Value::from(7)]));
    c.call("queue.tube.jobs:put", &[s("x")]).one();
    let taken = c.call("queue.tube.jobs:take", &[Value::from(0)]).one();
    let id = taken.as_array().unwrap()[0].clone();
    documented(
        page,
        &c.call("queue.tube.jobs:touch", &[id, Value::from(5)]),
    );
    documented(page, &c.call("queue.tube.jobs:drop", &[]));
    documented(page, &c.call("queue.tube.default:drop", &[]));
    documented(page, &c.call("queue.statistics", &[s("mail")]));
    documented(
        page,
        &c.call("queue.cfg", &[map(&[("foo", Value::from(1))])]),
    );
    documented(
        page,
        &c.call("queue.cfg", &[map(&[("ttr", Value::from(-1))])]),
    );
    documented(page, &c.call("queue.identify", &[s("abc")]));
    documented(page, &c.call("queue.tube.jobs:put", &[]));
    documented(page, &c.call("queue.tube.jobs:take", &[s("a")]));
    documented(page, &c.call("queue.tube.jobs:kick", &[s("a")]));
    documented(page, &c.call("queue.tube.jobs:take_many", &[]));
    documented(page, &c.call("queue.tube.mail:put", &[s("x")]));
}

#[test]
fn the_bounds_errors_are_the_ones_the_pages_list() {
    let server = TestServer::with(|cfg| {
        cfg.max_tasks = 1;
        cfg.max_session_grace = 60_000_000;
    });
    let mut c = server.connect();
    documented(
        "tubes.md",
        &c.call("queue.cfg", &[map(&[("ttr", Value::from(61))])]),
    );
    c.call("queue.put", &[s("x")]).one();
    documented("seed-api.md", &c.call("queue.put", &[s("x")]));
    c.call("queue.create_tube", &[s("jobs"), s("fifo")]).ok();
    documented("tubes.md", &c.call("queue.tube.jobs:put", &[s("x")]));
}
