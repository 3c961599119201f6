//! Bad input on tarq's beanstalk port, with real beanstalkd fed the same bytes as the
//! reference: garbage from several connections at once (lines over the 224-byte limit, NUL
//! bytes, unknown commands, bodies of the wrong length or without CRLF, bodies over the max job
//! size, sizes that are no 32-bit number) is answered reply for reply as beanstalkd answers it
//! while a worker on another tube is served throughout, and every job answered `INSERTED` can
//! be reserved afterwards; a body far over the limit, or announced as 4 GiB, is thrown away as
//! it streams (tarq's memory stays flat) and the connection goes on. A client that never reads
//! its replies is tarq's own case (beanstalkd just stops reading it): it is cut off at the
//! per-connection write backlog while another client keeps working, and nothing acknowledged
//! is lost. The scripted single-connection cases are in the differential
//! (`net/beanstalk/tests/scripts/bad_input.bs`, `malformed.bs`, `producer.bs`).

#[path = "support/beanstalk.rs"]
mod beanstalk;
mod support;

use std::collections::BTreeMap;
use std::io::{ErrorKind, Write};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use beanstalk::{rss_bytes, Answer, Bs, Target};
use support::WAIT;
use tarq_beanstalk::Command;

/// How often each garbage connection repeats its stream: enough that the streams overlap.
const REPEAT: usize = 20;

/// Connection `c`'s stream: one kind of bad input per connection, with a few valid puts in
/// between whose bodies name the connection. Nothing in it reads shared state (no peek, kick
/// or stats), so its replies depend on its own bytes only and both servers must agree.
fn garbage(c: usize) -> Vec<u8> {
    let unit: Vec<u8> = match c % 6 {
        // A line over the limit is thrown away up to its end, then BAD_FORMAT.
        0 => [&b"x".repeat(3000)[..], b"\r\nlist-tube-used\r\n"].concat(),
        // NUL bytes, bytes that are no command, prefixes of commands.
        1 => b"\0\r\nhello\r\nPUT 0 0 60 1\r\nx\r\n\xff\xfe\r\nreservex\r\nuse \r\n".to_vec(),
        // Bodies shorter and longer than announced, and one ending in LF only.
        2 => b"put 0 0 60 10\r\nabc\r\nput 0 0 60 1\r\nx\r\nput 0 0 60 1\r\nxyz\r\n\
               put 0 0 60 1\r\nx\nlist-tube-used\r\n"
            .to_vec(),
        // A body over the max job size: read to its end, thrown away, JOB_TOO_BIG.
        3 => [
            &b"put 0 0 60 70000\r\n"[..],
            &b"b".repeat(70_000),
            b"\r\nput 0 0 60 70000 junk\r\n",
            &b"b".repeat(70_000),
            b"\r\n",
        ]
        .concat(),
        // Sizes and ids that are no number of their width; the body is read as a command.
        4 => b"put 0 0 60 4294967296\r\nabcd\r\nput 0 0 60 -1\r\nabcd\r\n\
               delete 18446744073709551616\r\nrelease 1 2\r\nbury\r\ntouch x\r\n"
            .to_vec(),
        // Tube names that are not names.
        _ => [
            &b"use -x\r\nwatch a*b\r\nignore \r\nuse "[..],
            &b"n".repeat(201),
            b"\r\n",
        ]
        .concat(),
    };
    let mut out = Vec::new();
    for i in 0..REPEAT {
        out.extend_from_slice(&unit);
        let body = format!("g{c}-{i}");
        out.extend_from_slice(format!("put 0 0 60 {}\r\n{body}\r\n", body.len()).as_bytes());
    }
    out
}

/// A reply with its job id taken out (ids differ between servers).
fn shape(a: &Answer) -> String {
    match a.word() {
        "INSERTED" => "INSERTED".into(),
        _ => a.line.clone(),
    }
}

/// What one server answered: each garbage connection's replies, and the bodies of the jobs
/// reservable afterwards, sorted.
#[derive(Debug, PartialEq)]
struct Outcome {
    replies: BTreeMap<usize, Vec<String>>,
    bodies: Vec<String>,
}

const GARBAGE_CONNECTIONS: usize = 6;

fn garbage_beside_a_worker(t: &Target) -> Outcome {
    let done = Arc::new(AtomicBool::new(false));
    let cycles = Arc::new(AtomicU64::new(0));
    let worker = {
        let (addr, done, cycles) = (t.addr, done.clone(), cycles.clone());
        std::thread::spawn(move || {
            // A worker on a tube of its own: each job it puts is the one it reserves.
            let mut w = Bs::connect(addr);
            for cmd in [
                Command::Use { tube: "w" },
                Command::Watch { tube: "w" },
                Command::Ignore { tube: "default" },
            ] {
                w.call(&cmd);
            }
            let mut i = 0u64;
            while !done.load(Ordering::Relaxed) || i < 10 {
                let body = format!("w-{i}");
                let id = w.put(0, body.as_bytes());
                let r = w.call(&Command::ReserveWithTimeout { seconds: 0 });
                assert_eq!(
                    (r.word(), r.number(), r.body.as_deref()),
                    ("RESERVED", Some(id), Some(body.as_bytes())),
                    "the worker's own job"
                );
                assert_eq!(w.call(&Command::Delete { id }).line, "DELETED");
                i += 1;
                cycles.store(i, Ordering::Relaxed);
            }
        })
    };
    let senders: Vec<_> = (0..GARBAGE_CONNECTIONS)
        .map(|c| {
            let addr = t.addr;
            std::thread::spawn(move || {
                let mut g = Bs::connect(addr);
                let bytes = garbage(c);
                let mut reader = g.try_clone().unwrap();
                // Write and read at once, so neither side's buffers can fill up and stall.
                let writer = std::thread::spawn(move || {
                    g.send_raw(&bytes).expect("the garbage is read");
                    g.stream.shutdown(std::net::Shutdown::Write).unwrap();
                });
                let mut replies = Vec::new();
                while let Some(a) = reader.recv_within(WAIT).expect("replies, then the close") {
                    replies.push(shape(&a));
                }
                writer.join().unwrap();
                (c, replies)
            })
        })
        .collect();
    let replies: BTreeMap<usize, Vec<String>> =
        senders.into_iter().map(|s| s.join().unwrap()).collect();
    done.store(true, Ordering::Relaxed);
    worker.join().expect("the worker was served throughout");
    assert!(cycles.load(Ordering::Relaxed) >= 10);
    let inserted = replies
        .values()
        .flatten()
        .filter(|r| *r == "INSERTED")
        .count();
    // Everything answered INSERTED is there.
    let mut check = Bs::connect(t.addr);
    let mut bodies = Vec::new();
    loop {
        let r = check.call(&Command::ReserveWithTimeout { seconds: 0 });
        if r.line == "TIMED_OUT" {
            break;
        }
        assert_eq!(r.word(), "RESERVED", "{}: {r:?}", t.name);
        bodies.push(String::from_utf8_lossy(r.body.as_deref().unwrap()).into_owned());
        let id = r.number().unwrap();
        assert_eq!(check.call(&Command::Delete { id }).line, "DELETED");
    }
    assert_eq!(
        bodies.len(),
        inserted,
        "{}: every INSERTED job is reservable",
        t.name
    );
    bodies.sort();
    Outcome { replies, bodies }
}

#[test]
fn garbage_from_many_connections_is_answered_as_beanstalkd_answers_and_loses_nothing() {
    let reference = garbage_beside_a_worker(&Target::beanstalkd(&[]));
    // The streams do reach every refusal, and their valid puts get through.
    let words: Vec<&str> = reference
        .replies
        .values()
        .flatten()
        .map(|s| &s[..])
        .collect();
    for w in [
        "BAD_FORMAT",
        "UNKNOWN_COMMAND",
        "EXPECTED_CRLF",
        "JOB_TOO_BIG",
        "INSERTED",
    ] {
        assert!(words.contains(&w), "beanstalkd never answered {w}");
    }
    let got = garbage_beside_a_worker(&Target::tarq(&[]));
    for (c, want) in &reference.replies {
        assert_eq!(
            &got.replies[c], want,
            "connection {c}'s replies, tarq against beanstalkd"
        );
    }
    assert_eq!(got.bodies, reference.bodies);
}

/// Bytes sent in one write while streaming a huge body.
const CHUNK: usize = 1 << 20;
/// The body far over the limit: 64 MiB.
const HUGE: usize = 64 << 20;
/// How much tarq's resident memory may grow while throwing a huge body away: far below the
/// body (a copy of it would be 64 MiB), above the read buffers and allocator noise.
const MAX_RSS_GROWTH: u64 = 24 << 20;

/// Streams `len` bytes of body in chunks, checking between chunks that `other` is served and
/// that tarq's memory stays flat.
fn stream_body(t: &Target, c: &mut Bs, other: &mut Bs, len: usize) {
    let rss0 = t.tarq_pid().map(rss_bytes);
    let chunk = vec![b'b'; CHUNK];
    let mut sent = 0;
    while sent < len {
        let n = CHUNK.min(len - sent);
        c.stream.write_all(&chunk[..n]).expect("the body is read");
        sent += n;
        if sent % (16 * CHUNK) == 0 {
            let r = other.call(&Command::ListTubeUsed);
            assert_eq!(r.line, "USING default", "{}: the other connection", t.name);
            if let (Some(pid), Some(rss0)) = (t.tarq_pid(), rss0) {
                let grown = rss_bytes(pid).saturating_sub(rss0);
                assert!(
                    grown < MAX_RSS_GROWTH,
                    "tarq grew {grown} bytes while {sent} bytes of a refused body streamed"
                );
            }
        }
    }
}

fn huge_bodies(t: &Target) -> Vec<String> {
    let mut c = Bs::connect(t.addr);
    let mut other = Bs::connect(t.addr);
    let mut seen = Vec::new();
    // A body 64 MiB long, then a valid put: JOB_TOO_BIG, and the connection goes on.
    c.send_raw(format!("put 0 0 60 {HUGE}\r\n").as_bytes())
        .unwrap();
    stream_body(t, &mut c, &mut other, HUGE);
    c.send_raw(b"\r\nput 0 0 60 2\r\nok\r\n").unwrap();
    seen.push(shape(&c.recv()));
    seen.push(shape(&c.recv()));
    // 4 GiB announced: tarq reads and drops what comes, holding none of it; the client gives
    // up and closes.
    let mut gives_up = Bs::connect(t.addr);
    gives_up
        .send_raw(format!("put 0 0 60 {}\r\n", u32::MAX).as_bytes())
        .unwrap();
    stream_body(t, &mut gives_up, &mut other, 16 * CHUNK);
    drop(gives_up);
    // Only the valid put is there.
    let r = other.call(&Command::ReserveWithTimeout { seconds: 0 });
    assert_eq!(r.body.as_deref(), Some(&b"ok"[..]), "{}: {r:?}", t.name);
    seen.push(r.word().to_string());
    seen.push(shape(
        &other.call(&Command::ReserveWithTimeout { seconds: 0 }),
    ));
    seen
}

#[test]
fn a_huge_body_is_thrown_away_as_it_streams_and_the_connection_goes_on() {
    let want = huge_bodies(&Target::beanstalkd(&[]));
    assert_eq!(want, ["JOB_TOO_BIG", "INSERTED", "RESERVED", "TIMED_OUT"]);
    assert_eq!(huge_bodies(&Target::tarq(&[])), want);
}

/// With a max job size of 1000 (`--beanstalk-max-job-size`, beanstalkd's `-z`), 1000 bytes
/// fit and 1001 do not, and `stats` says so.
fn max_job_size(t: &Target) -> Vec<String> {
    let mut c = Bs::connect(t.addr);
    let mut seen = Vec::new();
    for len in [1000, 1001, 0] {
        let body = vec![b'm'; len];
        seen.push(shape(&c.call(&Command::Put {
            pri: 0,
            delay: 0,
            ttr: 60,
            body: &body,
        })));
    }
    let stats = c.call(&Command::Stats);
    seen.push(format!("max-job-size: {:?}", stats.yaml("max-job-size")));
    seen
}

#[test]
fn the_max_job_size_is_the_flags() {
    let want = max_job_size(&Target::beanstalkd(&["-z", "1000"]));
    assert_eq!(
        want,
        [
            "INSERTED",
            "JOB_TOO_BIG",
            "INSERTED",
            "max-job-size: Some(\"1000\")"
        ]
    );
    let got = max_job_size(&Target::tarq(&["--beanstalk-max-job-size", "1000"]));
    assert_eq!(got, want);
}

/// Size of the job the hog peeks at over and over: each reply carries it.
const HOG_JOB: usize = 60_000;

#[test]
fn a_client_that_never_reads_is_cut_off_while_another_keeps_working() {
    let t = Target::tarq(&[]);
    let mut good = Bs::connect(t.addr);
    let mut hog = Bs::connect(t.addr);
    // The hog's job in a tube of its own, so the other client reserves only its own.
    assert_eq!(hog.call(&Command::Use { tube: "hog" }).line, "USING hog");
    let job = vec![b'h'; HOG_JOB];
    let hog_id = hog.put(0, &job);
    // Requests are small and their replies are not: a batch of peeks asks for 60 MB.
    let batch = format!("peek {hog_id}\r\n").repeat(1000).into_bytes();
    let mut kept = Vec::new();
    let deadline = Instant::now() + 4 * WAIT;
    let cut_off = loop {
        assert!(
            Instant::now() < deadline,
            "the hog was never cut off (tarq keeps reading a client that never reads)"
        );
        if let Err(e) = hog.send_raw(&batch) {
            break e;
        }
        // The other client is served meanwhile, and what it is told is kept.
        let body = format!("good-{}", kept.len());
        let id = good.put(1, body.as_bytes());
        kept.push((id, body));
    };
    assert_ne!(
        cut_off.kind(),
        ErrorKind::WouldBlock,
        "a write timed out: tarq stopped reading the hog instead of cutting it off"
    );
    assert_ne!(cut_off.kind(), ErrorKind::TimedOut, "{cut_off}");
    // The hog's connection ends: after whatever replies reached it, the server has closed it.
    loop {
        match hog.recv_within(WAIT) {
            Ok(Some(a)) => assert_eq!(a.word(), "FOUND"),
            Ok(None) => break,
            Err(e) => {
                assert_ne!(e.kind(), ErrorKind::TimedOut, "the hog is still open");
                break;
            }
        }
    }
    // Nothing acknowledged is lost: the hog's job and every job put by the other client.
    let r = good.call(&Command::Peek { id: hog_id });
    assert_eq!(
        (r.word(), r.body.as_ref().map(Vec::len)),
        ("FOUND", Some(HOG_JOB))
    );
    for (id, body) in &kept {
        let r = good.call(&Command::ReserveWithTimeout { seconds: 0 });
        assert_eq!(
            (r.number(), r.body.as_deref()),
            (Some(*id), Some(body.as_bytes()))
        );
    }
    let stats = good.call(&Command::Stats);
    assert_eq!(stats.yaml("current-connections").as_deref(), Some("1"));
}
