//! A hostile or broken client cannot take the server's memory or hold its connections: the
//! input budget under slow partial frames from many connections (the server's RSS, read from
//! /proc, stays within the budget plus a fixed overhead while a well-behaved client gets every
//! answer), the frame, authentication and idle deadlines (each closure logged and counted), the
//! small frame cap before authentication, and the per-address cap (the `/metrics` endpoint
//! included). Real `tarq` processes over real sockets; deadlines are short settings, waited for
//! as events.

mod support;

use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use rmpv::Value;
use support::{field, Client, Tarq, WAIT};
use tarq_iproto::{auth, client};

const ER_ACCESS_DENIED: u32 = 42;
const ER_TIMEOUT: u32 = 78;
const ER_MEMORY_ISSUE: u32 = 2;

/// Every figure of `queue.stats()` as (name, value).
fn stats(c: &mut Client) -> Value {
    c.call("queue.stats", &[]).one()
}

fn figure(stats: &Value, name: &str) -> u64 {
    field(stats, name).as_u64().expect("a figure is a uint")
}

/// The resident set of a process, from /proc.
fn rss_bytes(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let kib: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmRSS in /proc/<pid>/status");
    kib * 1024
}

/// The size prefix of a frame of `len` bytes.
fn frame_header(len: u32) -> [u8; 5] {
    let b = len.to_be_bytes();
    [0xce, b[0], b[1], b[2], b[3]]
}

/// Connects and authenticates as `user`.
fn authenticated(addr: SocketAddr, user: &str, password: &str) -> Client {
    let mut c = Client::connect(addr);
    let salt = c.greeting.salt.clone();
    let r = c.request(|o, sync| client::auth(o, sync, user, &auth::scramble(&salt, password)));
    assert_eq!(r.code, 0, "{r:?}");
    c
}

/// One put → take → ack, asserting each answer.
fn cycle(c: &mut Client, i: u64) {
    let put = c
        .call("queue.put", &[Value::from(format!("job {i}"))])
        .one();
    let id = field(&put, "id").as_u64().unwrap();
    let taken = c.call("queue.take", &[Value::from(0)]).one();
    assert_eq!(field(&taken, "id").as_u64(), Some(id));
    let acked = c.call("queue.ack", &[Value::from(id)]).one();
    assert_eq!(field(&acked, "id").as_u64(), Some(id));
}

/// Sends `header` and `body_bytes` of body (in 64 KiB writes), then returns the socket, still
/// open; a server that closes it first is fine (the socket is returned all the same).
fn send_partial(addr: SocketAddr, header: &[u8], body_bytes: usize) -> TcpStream {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_write_timeout(Some(WAIT)).unwrap();
    let chunk = vec![0x42u8; 64 * 1024];
    let mut sent = 0;
    let mut ok = s.write_all(header).is_ok();
    while ok && sent < body_bytes {
        let n = chunk.len().min(body_bytes - sent);
        ok = s.write_all(&chunk[..n]).is_ok();
        sent += n;
    }
    s
}

/// A reply as (code, error message).
#[derive(Debug)]
struct Answer {
    code: u32,
    error: Option<String>,
}

/// Reads what the server sends until it closes: the greeting, then any replies. The bytes
/// after the greeting are decoded as replies.
fn read_until_closed(s: &mut TcpStream) -> Vec<Answer> {
    s.set_read_timeout(Some(WAIT)).unwrap();
    let mut all = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        match s.read(&mut chunk) {
            Ok(0) => break,
            Ok(n) => all.extend_from_slice(&chunk[..n]),
            Err(e) if e.kind() == ErrorKind::ConnectionReset => break,
            Err(e) => panic!("the server did not close the connection: {e}"),
        }
    }
    let mut rest = &all[client::GREETING_LEN.min(all.len())..];
    let mut replies = Vec::new();
    while let Ok(Some(f)) = tarq_iproto::split_frame(rest, usize::MAX) {
        let r = client::decode(&rest[f.prefix..f.total()]).unwrap();
        replies.push(Answer {
            code: r.code,
            error: r.error.map(str::to_string),
        });
        rest = &rest[f.total()..];
    }
    replies
}

#[test]
fn slow_partial_frames_from_many_connections_stay_within_the_budget() {
    const FRAME: usize = 4 << 20;
    const BUDGET: usize = 16 << 20;
    const ATTACKERS: usize = 48;
    /// Each attacker's resting read buffer and socket, plus allocator slack: the overhead the
    /// budget does not cover. Without the budget the attack would hold 48 × 4 MiB = 192 MiB.
    const OVERHEAD: u64 = 24 << 20;
    let mut t = Tarq::start(&[
        "--max-frame-bytes",
        &FRAME.to_string(),
        "--input-budget-bytes",
        &BUDGET.to_string(),
    ]);
    let addr = t.addr;
    let mut good = Client::connect(addr);
    for i in 0..100 {
        cycle(&mut good, i);
    }
    let base = rss_bytes(t.proc.id());
    let header = frame_header(FRAME as u32);
    let (attackers, peak, cycles) = std::thread::scope(|scope| {
        let attack = scope.spawn(|| {
            let handles: Vec<_> = (0..ATTACKERS)
                .map(|_| scope.spawn(|| send_partial(addr, &header, FRAME * 7 / 8)))
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().unwrap())
                .collect::<Vec<_>>()
        });
        // The well-behaved client works through the whole attack and gets every answer.
        let mut peak = 0;
        let mut i = 100;
        while !attack.is_finished() {
            cycle(&mut good, i);
            peak = peak.max(rss_bytes(t.proc.id()));
            i += 1;
        }
        let attackers = attack.join().unwrap();
        for _ in 0..100 {
            cycle(&mut good, i);
            peak = peak.max(rss_bytes(t.proc.id()));
            i += 1;
        }
        (attackers, peak, i)
    });
    let s = stats(&mut good);
    println!(
        "rss base {} MiB, peak {} MiB; {cycles} cycles; stats {s}",
        base >> 20,
        peak >> 20
    );
    assert!(
        peak <= base + BUDGET as u64 + OVERHEAD,
        "RSS peaked at {peak} bytes: over {base} + the budget {BUDGET} + {OVERHEAD}"
    );
    assert!(figure(&s, "input_bytes") <= BUDGET as u64);
    assert_eq!(figure(&s, "input_budget_bytes"), BUDGET as u64);
    assert!(figure(&s, "closed_input_budget") > 0, "{s}");
    t.wait_for_line("closing the connection holding the most unfinished input");
    drop(attackers);
}

#[test]
fn the_closest_offender_is_told_why() {
    // One frame fills the budget; the next one to grow closes the one holding the most.
    const FRAME: usize = 1 << 20;
    let t = Tarq::start(&[
        "--max-frame-bytes",
        &FRAME.to_string(),
        "--input-budget-bytes",
        &FRAME.to_string(),
    ]);
    let mut first = send_partial(t.addr, &frame_header(FRAME as u32), FRAME - 4096);
    let mut good = Client::connect(t.addr);
    support::wait_until("the first frame to be buffered", || {
        figure(&stats(&mut good), "input_bytes") > (FRAME / 2) as u64
    });
    let _second = send_partial(t.addr, &frame_header(FRAME as u32), FRAME - 4096);
    let replies = read_until_closed(&mut first);
    let e = replies.last().expect("an error before the close");
    assert_eq!(e.code, ER_MEMORY_ISSUE);
    let msg = e.error.clone().unwrap();
    assert!(
        msg.contains(&format!("Input memory budget of {FRAME} bytes is full")),
        "{msg}"
    );
    assert_eq!(figure(&stats(&mut good), "closed_input_budget"), 1);
}

#[test]
fn a_stalled_frame_is_closed_at_frame_timeout_and_a_working_client_is_not() {
    let mut t = Tarq::start(&["--frame-timeout", "0.3"]);
    let mut good = Client::connect(t.addr);
    let mut stalled = send_partial(t.addr, &frame_header(1000), 10);
    let started = Instant::now();
    // The working client keeps going until the stalled one is closed, and after.
    let closer = std::thread::spawn(move || read_until_closed(&mut stalled));
    let mut i = 0;
    while !closer.is_finished() {
        cycle(&mut good, i);
        i += 1;
    }
    let replies = closer.join().unwrap();
    assert!(started.elapsed() >= Duration::from_millis(300));
    let e = replies.last().expect("an error before the close");
    assert_eq!(e.code, ER_TIMEOUT);
    assert_eq!(
        e.error.as_deref(),
        Some("Connection closed: frame not finished within frame-timeout (frame-timeout 0.3 s)")
    );
    t.wait_for_line("frame not finished within frame-timeout");
    cycle(&mut good, i);
    let s = stats(&mut good);
    assert_eq!(figure(&s, "closed_frame_timeout"), 1);
    assert_eq!(figure(&s, "closed_auth_timeout"), 0);
}

#[test]
fn an_unauthenticated_connection_is_closed_at_auth_timeout_and_an_authenticated_one_stays() {
    let mut t = Tarq::start(&["--user", "app", "--password", "pw", "--auth-timeout", "0.3"]);
    let mut good = authenticated(t.addr, "app", "pw");
    let mut silent = TcpStream::connect(t.addr).unwrap();
    // Pings need no authentication, but do not stand in for it.
    let mut pinger = Client::connect(t.addr);
    assert_eq!(pinger.ping().code, 0);
    let replies = read_until_closed(&mut silent);
    let e = replies.last().expect("an error before the close");
    assert_eq!(e.code, ER_TIMEOUT);
    assert_eq!(
        e.error.as_deref(),
        Some("Connection closed: not authenticated within auth-timeout (auth-timeout 0.3 s)")
    );
    assert!(pinger
        .expect_closed()
        .last()
        .is_some_and(|r| r.code == ER_TIMEOUT));
    t.wait_for_line("not authenticated within auth-timeout");
    // Well past its own auth deadline, the authenticated client is served as before.
    cycle(&mut good, 0);
    assert_eq!(figure(&stats(&mut good), "closed_auth_timeout"), 2);
}

#[test]
fn idle_connections_are_closed_but_not_those_waiting_for_a_task() {
    let mut t = Tarq::start(&["--idle-timeout", "0.3"]);
    let mut idle = Client::connect(t.addr);
    let mut waiter = Client::connect(t.addr);
    let sync = waiter.send_call("queue.take", &[Value::from(30)]);
    let replies = idle.expect_closed();
    assert_eq!(
        replies.last().and_then(|r| r.error.clone()).as_deref(),
        Some("Connection closed: idle for idle-timeout (idle-timeout 0.3 s)")
    );
    t.wait_for_line("closing an idle connection");
    // The waiting take outlived the idle deadline: a put now reaches it.
    let mut producer = Client::connect(t.addr);
    producer.call("queue.put", &[Value::from("late")]).one();
    let r = waiter.recv();
    assert_eq!(r.sync, sync);
    assert_eq!(field(&r.one(), "data").as_str(), Some("late"));
    assert!(figure(&stats(&mut producer), "closed_idle") >= 1);
}

#[test]
fn before_authentication_a_big_frame_is_refused_from_its_header() {
    let t = Tarq::start(&["--user", "app", "--password", "pw"]);
    let mut good = authenticated(t.addr, "app", "pw");
    let base = rss_bytes(t.proc.id());
    // Many unauthenticated clients announce 16 MiB frames and send 1 MiB of each.
    let mut refused = Vec::new();
    for _ in 0..32 {
        refused.push(send_partial(t.addr, &frame_header(16 << 20), 1 << 20));
    }
    for s in &mut refused {
        let replies = read_until_closed(s);
        let e = replies.last().expect("an error before the close");
        assert_eq!(e.code, ER_ACCESS_DENIED);
        assert_eq!(
            e.error.as_deref(),
            Some(
                "Frame of 16777216 bytes refused before authentication: the limit is 4096 \
                 bytes until AUTH succeeds"
            )
        );
    }
    let s = stats(&mut good);
    assert_eq!(figure(&s, "closed_pre_auth_frame"), 32);
    assert_eq!(
        figure(&s, "input_bytes"),
        0,
        "nothing beyond resting buffers"
    );
    let grew = rss_bytes(t.proc.id()).saturating_sub(base);
    assert!(grew < 8 << 20, "RSS grew by {grew} bytes");
    // A frame under the limit is not refused: it waits for the rest, like any.
    let mut small = Client::connect(t.addr);
    assert_eq!(small.ping().code, 0);
    // Once authenticated, big frames are fine.
    let big = "x".repeat(64 * 1024);
    let put = good.call("queue.put", &[Value::from(big.as_str())]).one();
    assert_eq!(field(&put, "data").as_str(), Some(big.as_str()));
}

#[test]
fn connections_per_address_are_capped_and_metrics_clients_count_too() {
    let t = Tarq::start(&[
        "--max-connections-per-peer",
        "2",
        "--metrics-listen",
        "127.0.0.1:0",
    ]);
    let metrics = t.metrics.expect("metrics address");
    let mut a = Client::connect(t.addr);
    let _b = Client::connect(t.addr);
    let mut refused = TcpStream::connect(t.addr).unwrap();
    let replies = read_until_closed(&mut refused);
    assert_eq!(
        replies.last().and_then(|r| r.error.as_deref()),
        Some(
            "Too many connections from 127.0.0.1: the limit is 2 per address \
             (--max-connections-per-peer)"
        )
    );
    // The scraper from the same address is refused too: a 503 naming the limit, then closed.
    let mut scrape = TcpStream::connect(metrics).unwrap();
    scrape.set_read_timeout(Some(WAIT)).unwrap();
    let _ = scrape.write_all(b"GET /metrics HTTP/1.1\r\n\r\n");
    let mut got = Vec::new();
    let _ = scrape.read_to_end(&mut got);
    let got = String::from_utf8_lossy(&got);
    assert!(got.starts_with("HTTP/1.1 503 "), "{got}");
    assert!(got.contains("the limit is 2 per address"), "{got}");
    // One gone, the next is admitted (once the server has seen the close).
    drop(_b);
    support::wait_until("a slot for the address", || {
        figure(&stats(&mut a), "connections") == 1
    });
    let (code, body) = support::http_get(metrics, "/metrics");
    assert_eq!(code, 200);
    assert!(body.contains("tarq_refused_per_peer_total 2\n"), "{body}");
    assert!(
        body.contains("tarq_closed_frame_timeout_total 0\n"),
        "{body}"
    );
}
