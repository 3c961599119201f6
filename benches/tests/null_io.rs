//! The null prototype of issue 40 (`tarq_benches::null_io`) answers real IPROTO clients over
//! each of its loops: started on port 0, it is driven through the project's client with the
//! loadgen's put → take → ack calls, pipelined requests and frames cut across writes, and
//! must answer each with its sync and the null server's empty result. The binary is started
//! too, and read for the port it reports.

use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpListener};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use rmpv::Value;
use tarq_benches::null_io::{self, Io, UringOptions};
use tarq_client::{pack_args, Client};
use tarq_iproto::client;

const WAIT: Duration = Duration::from_secs(10);

fn loops() -> Vec<Io> {
    let uring = |multishot, sqpoll_idle_ms| {
        Io::Uring(UringOptions {
            multishot,
            sqpoll_idle_ms,
            sqpoll_cpu: None,
        })
    };
    vec![
        Io::Epoll,
        uring(false, None),
        uring(true, None),
        uring(true, Some(10)),
    ]
}

/// Serves on a free port in a thread of its own (the ring is made there: a `SINGLE_ISSUER`
/// ring belongs to the thread that made it); the port is known before the thread starts.
fn start(io: Io) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind port 0");
    let addr = listener.local_addr().expect("the bound port");
    std::thread::spawn(move || null_io::serve(listener, io).expect("the loop runs"));
    addr
}

/// put → take → ack as the loadgen sends them, each answered with its sync and an empty result.
fn cycle(c: &mut Client) {
    let put = pack_args(&[Value::from("payload of a task"), Value::Map(vec![])]);
    let take = pack_args(&[Value::F64(0.5)]);
    let ack = pack_args(&[Value::from(1u64)]);
    for (function, args) in [
        ("queue.tube.q:put", &put),
        ("queue.tube.q:take", &take),
        ("queue.tube.q:ack", &ack),
    ] {
        let reply = c
            .request(|out, sync| client::call(out, sync, function, args), None)
            .unwrap_or_else(|e| panic!("{function}: {e}"));
        assert!(reply.is_ok(), "{function}: {reply:?}");
        assert_eq!(
            reply.values().expect("DATA"),
            Vec::<Value>::new(),
            "{function}"
        );
    }
}

#[test]
fn every_loop_answers_a_put_take_ack_cycle_and_pings() {
    for io in loops() {
        let addr = start(io);
        let mut c = Client::connect_addr(addr, WAIT).unwrap_or_else(|e| panic!("{io:?}: {e}"));
        assert_eq!(c.greeting().protocol, "Binary", "{io:?}");
        for _ in 0..3 {
            cycle(&mut c);
        }
        let pong = c.request(client::ping, None).expect("ping");
        assert!(pong.is_ok() && pong.data.is_none(), "{io:?}: {pong:?}");
        // A second connection beside the first: the accept stays armed.
        let mut other = Client::connect_addr(addr, WAIT).expect("second connection");
        cycle(&mut other);
        cycle(&mut c);
    }
}

#[test]
fn pipelined_and_split_frames_are_answered_in_order() {
    for io in loops() {
        let mut c = Client::connect_addr(start(io), WAIT).expect("connect");
        // 64 calls in one write: answered in order, every sync once.
        let mut batch = Vec::new();
        let syncs: Vec<u64> = (0..64)
            .map(|_| {
                let sync = c.next_sync();
                client::call(&mut batch, sync, "queue.tube.q:put", &pack_args(&[]));
                sync
            })
            .collect();
        c.send(&batch).expect("send the batch");
        for &sync in &syncs {
            let r = c.recv().expect("a reply").expect("not closed");
            assert_eq!((r.sync, r.is_ok()), (sync, true), "{io:?}");
        }
        // One frame in two writes, the cut inside its body: answered once it is whole.
        let mut frame = Vec::new();
        let sync = c.next_sync();
        client::call(&mut frame, sync, "queue.tube.q:take", &pack_args(&[]));
        let (head, tail) = frame.split_at(frame.len() / 2);
        c.send(head).expect("first half");
        c.socket().flush().expect("flush");
        c.send(tail).expect("second half");
        let r = c.recv().expect("a reply").expect("not closed");
        assert_eq!((r.sync, r.is_ok()), (sync, true), "{io:?}");
    }
}

#[test]
fn broken_framing_is_answered_then_closed() {
    for io in loops() {
        let mut c = Client::connect_addr(start(io), WAIT).expect("connect");
        c.send(&[0xc1]).expect("a byte that is no size prefix");
        let r = c.recv().expect("the error").expect("not closed before it");
        assert_eq!((r.sync, r.is_ok()), (0, false), "{io:?}: {r:?}");
        assert!(c.recv().expect("then the close").is_none(), "{io:?}");
    }
}

/// The binary, killed when the test ends.
struct Server(Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn the_binary_reports_its_port_and_serves_it() {
    for flags in [&["--io", "epoll"][..], &["--io", "uring", "--multishot"]] {
        let mut child = Server(
            Command::new(env!("CARGO_BIN_EXE_null_io"))
                .args(["--listen", "127.0.0.1:0"])
                .args(flags)
                .stdout(Stdio::piped())
                .spawn()
                .expect("start null_io"),
        );
        let mut line = String::new();
        BufReader::new(child.0.stdout.take().expect("stdout"))
            .read_line(&mut line)
            .expect("its first line");
        let addr = line
            .strip_prefix("listening on ")
            .and_then(|l| l.split_whitespace().next())
            .unwrap_or_else(|| panic!("{flags:?}: {line:?}"));
        let mut c = Client::connect(addr, WAIT).expect("connect to the reported port");
        cycle(&mut c);
    }
}
