//! The Graphite pusher driven by a minimal mio loop, against plain sockets on 127.0.0.1: the
//! line format, UDP, and reconnecting (with backoff) after Graphite goes away and comes back.
//! The same pusher inside the running server is tested in `ops_server.rs`.

mod support;

use std::io::{BufRead, BufReader};
use std::net::{TcpListener, UdpSocket};
use std::sync::mpsc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use mio::{Events, Poll};
use tarq_engine::Micros;
use tarq_ops::graphite::{Graphite, Target};
use tarq_ops::stats::Snapshot;
use tarq_ops::GRAPHITE_TOKEN;

use support::{collect_tcp_lines, graphite_line_aged, Refusing, CLOSED};

/// Every wait in these tests ends by this.
const DEADLINE: Duration = Duration::from_secs(10);
/// A fast cadence so the tests take milliseconds.
const INTERVAL: Micros = 20_000;

fn now() -> Micros {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_micros() as Micros
}

fn snapshot() -> Snapshot {
    let mut s = Snapshot::default();
    s.engine.ready = 3;
    s.engine.puts = 11;
    s.server.connections = 2;
    s
}

/// Runs the pusher's loop until `done` returns true (checked after each poll).
fn drive(g: &mut Graphite, poll: &mut Poll, mut done: impl FnMut(&Graphite) -> bool) {
    let mut events = Events::with_capacity(16);
    let end = Instant::now() + DEADLINE;
    while !done(g) {
        assert!(Instant::now() < end, "no progress within {DEADLINE:?}");
        let timeout = g
            .next_timer()
            .map(|t| Duration::from_micros(t.saturating_sub(now())))
            .unwrap_or(Duration::from_millis(10))
            .min(Duration::from_millis(50));
        poll.poll(&mut events, Some(timeout)).unwrap();
        let t = now();
        for ev in events.iter() {
            g.on_event(ev, t);
        }
        g.tick(t, &snapshot());
    }
}

/// How old a line's timestamp may be: the pusher runs right here, on this thread.
const MAX_AGE_SECS: u64 = 5;

fn check_line(line: &str) -> (String, u64) {
    graphite_line_aged(line, MAX_AGE_SECS)
}

/// The lines of every connection accepted on `listener`, without the end-of-connection marks.
fn collect_lines(listener: TcpListener) -> mpsc::Receiver<String> {
    let all = collect_tcp_lines(listener);
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in all {
            if line != CLOSED && tx.send(line).is_err() {
                return;
            }
        }
    });
    rx
}

#[test]
fn tcp_lines_carry_every_figure_with_a_timestamp() {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let target: Target = format!("tcp://{}", listener.local_addr().unwrap())
        .parse()
        .unwrap();
    let rx = collect_lines(listener);
    let mut poll = Poll::new().unwrap();
    let mut g = Graphite::new(target, INTERVAL, now());
    g.register(poll.registry(), GRAPHITE_TOKEN, now()).unwrap();

    let names: Vec<&str> = snapshot().metrics().map(|m| m.name).collect();
    let mut seen = std::collections::HashMap::new();
    drive(&mut g, &mut poll, |_| {
        while let Ok(line) = rx.try_recv() {
            let (name, value) = check_line(&line);
            seen.insert(name, value);
        }
        names.iter().all(|n| seen.contains_key(*n))
    });
    assert_eq!(seen["ready"], 3);
    assert_eq!(seen["puts"], 11);
    assert_eq!(seen["connections"], 2);
    assert_eq!(seen["total"], 0);
    assert!(g.is_connected());
    assert_eq!(g.counters().connects, 1);
}

#[test]
fn udp_datagrams_carry_the_same_lines() {
    let socket = UdpSocket::bind("127.0.0.1:0").unwrap();
    socket
        .set_read_timeout(Some(Duration::from_millis(20)))
        .unwrap();
    let target: Target = format!("udp://{}", socket.local_addr().unwrap())
        .parse()
        .unwrap();
    let mut poll = Poll::new().unwrap();
    let mut g = Graphite::new(target, INTERVAL, now());
    g.register(poll.registry(), GRAPHITE_TOKEN, now()).unwrap();

    let mut seen = std::collections::HashMap::new();
    let mut buf = [0u8; 2048];
    drive(&mut g, &mut poll, |_| {
        if let Ok(n) = socket.recv(&mut buf) {
            let text = std::str::from_utf8(&buf[..n]).unwrap();
            assert!(
                text.ends_with('\n'),
                "a datagram holds whole lines: {text:?}"
            );
            for line in text.lines() {
                let (name, value) = check_line(line);
                seen.insert(name, value);
            }
        }
        seen.contains_key("ready") && seen.contains_key("uptime_seconds")
    });
    assert_eq!(seen["ready"], 3);
}

#[test]
fn a_graphite_that_goes_away_and_comes_back_gets_lines_again() {
    // Graphite is down at start: its port refuses connections, and is held for it.
    let down = Refusing::open();
    let addr = down.addr;
    let target: Target = format!("tcp://{addr}").parse().unwrap();
    let mut poll = Poll::new().unwrap();
    let mut g = Graphite::new(target, INTERVAL, now());
    g.register(poll.registry(), GRAPHITE_TOKEN, now()).unwrap();

    // Refused connects are retried while samples wait in the buffer.
    drive(&mut g, &mut poll, |g| g.counters().samples >= 3);
    assert!(!g.is_connected());
    assert!(g.buffered() > 0, "samples wait for Graphite");

    // Graphite comes up: the buffered samples arrive (the retry is at most a few backoffs away).
    let listener = down.listen();
    let rx = collect_lines(listener.try_clone().unwrap());
    let mut lines = 0;
    drive(&mut g, &mut poll, |g| {
        while let Ok(line) = rx.try_recv() {
            check_line(&line);
            lines += 1;
        }
        g.is_connected() && lines > 3 * snapshot().metrics().count()
    });
    assert_eq!(g.counters().connects, 1);
    drop(listener);
}

#[test]
fn a_closed_connection_is_reopened() {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let target: Target = format!("tcp://{}", listener.local_addr().unwrap())
        .parse()
        .unwrap();
    let mut poll = Poll::new().unwrap();
    let mut g = Graphite::new(target, INTERVAL, now());
    g.register(poll.registry(), GRAPHITE_TOKEN, now()).unwrap();

    // Accept the first connection and close it at once: the pusher must notice and reconnect.
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let (first, _) = listener.accept().unwrap();
        drop(first);
        let (second, _) = listener.accept().unwrap();
        let mut r = BufReader::new(second);
        let mut line = String::new();
        r.read_line(&mut line).unwrap();
        tx.send(line).unwrap();
    });
    let mut got = None;
    drive(&mut g, &mut poll, |_| {
        got = got.take().or_else(|| rx.try_recv().ok());
        got.is_some()
    });
    let line = got.unwrap();
    // A whole line, not the tail of one cut by the first connection's close.
    check_line(line.trim_end());
    assert!(g.counters().connects >= 2, "{:?}", g.counters());
}
