//! The hot path allocates nothing per request beyond the task's payload: an in-process server
//! runs on a thread whose allocations the counting `#[global_allocator]` of `tarq-testkit`
//! tallies (this binary's
//! other threads — the test's client — are not counted), and put → take → ack cycles go through
//! the whole request path (read → split → decode → calls → engine → encode → write) at depth 1,
//! pipelined on one connection, and across several connections in one turn. After a warm-up
//! (buffers and engine structures at their working size) a cycle allocates nothing: a payload
//! up to `INLINE_PAYLOAD` bytes is copied from the frame into the engine's records and leaves
//! them inline in the acked task. And a frame announced far larger than what arrives
//! makes the server allocate for what arrives, never for the announced size.
//!
//! Its own test binary because the allocator is process-wide.

mod support;

use std::sync::Mutex;

use rmpv::Value;
use support::{args, field, id_of, wait_until, Client, TestServer};
use tarq_iproto::client;
use tarq_net::config::Config;
use tarq_net::server::Server;

#[global_allocator]
static GLOBAL: tarq_testkit::Counting = tarq_testkit::Counting;

/// The counters are process-wide: under `cargo test` (threads, not processes) the tests of this
/// binary run one at a time, servers included.
static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

/// Cycles run before counting, so every buffer and table reaches its working size.
const WARM_UP: u64 = 2_000;
/// Cycles counted.
const CYCLES: u64 = 20_000;
/// Requests in flight per connection in the pipelined runs (the loadgen's usual depth).
const DEPTH: u64 = 16;
/// Connections driven together in the many-connections run.
const CONNS: usize = 8;
/// Allocations allowed over a counted run: engine arrays that double when
/// they first reach a new size (the skiplist's tower arena grows the first time more towers of
/// one height are live than ever before). Amortised growth, a handful in a run, never one per
/// request; 8 leaves room for a few such firsts (one was seen in 20 000 cycles).
const GROWTH_SLACK: u64 = 8;

/// A server whose thread's allocations are counted.
fn tracked_server(tweak: impl FnOnce(&mut Config)) -> TestServer {
    let (cfg, dir) = TestServer::config(tweak);
    let server = Server::bind(cfg).expect("server binds");
    TestServer::spawn(server, dir, tarq_testkit::track_this_thread)
}

/// A payload like the loadgen's: a short binary string.
fn payload(i: u64) -> Vec<u8> {
    args(&[Value::Binary(i.to_le_bytes().repeat(4))])
}

/// Sends `depth` calls on every connection (all of them written before any reply is read, so
/// the server sees them together), then reads and checks every reply; returns each
/// connection's replies. `call(conn, i)` names the function and args of request `i`.
fn phase(
    conns: &mut [Client],
    depth: u64,
    call: impl Fn(usize, u64) -> (&'static str, Vec<u8>),
) -> Vec<Vec<Value>> {
    for (n, c) in conns.iter_mut().enumerate() {
        let mut out = Vec::new();
        for i in 0..depth {
            let (function, a) = call(n, i);
            client::call(&mut out, i + 1, function, &a);
        }
        c.send(&out);
    }
    conns
        .iter_mut()
        .map(|c| {
            (0..depth)
                .map(|i| {
                    let r = c.recv();
                    assert_eq!(r.sync, i + 1);
                    r.one()
                })
                .collect()
        })
        .collect()
}

/// One put → take → ack cycle per request in flight on every connection.
fn cycles(conns: &mut [Client], depth: u64) {
    phase(conns, depth, |_, i| ("queue.put", payload(i)));
    let taken = phase(conns, depth, |_, _| ("queue.take", args(&[])));
    phase(conns, depth, |n, i| {
        let id = id_of(&taken[n][i as usize]);
        ("queue.ack", args(&[Value::from(id)]))
    });
}

/// Runs `round` (which does `cycles_per_round` put/take/ack cycles) through a warm-up, then
/// counts the server's allocations over the rest; returns allocations per request.
fn per_request(what: &str, cycles_per_round: u64, mut round: impl FnMut()) -> f64 {
    for _ in 0..WARM_UP.div_ceil(cycles_per_round) {
        round();
    }
    let rounds = CYCLES.div_ceil(cycles_per_round);
    let before = tarq_testkit::tracked_allocs();
    for _ in 0..rounds {
        round();
    }
    let allocs = tarq_testkit::tracked_allocs() - before;
    let cycles = rounds * cycles_per_round;
    let requests = 3 * cycles;
    let per = allocs as f64 / requests as f64;
    println!("{what}: {allocs} allocations in {requests} requests ({per:.4} per request)");
    assert!(
        allocs <= GROWTH_SLACK,
        "{what}: {allocs} allocations for {cycles} put/take/ack cycles: a small payload is \
         copied into the engine's records and comes back inline, so a cycle allocates nothing"
    );
    per
}

#[test]
fn depth_one_cycles_allocate_nothing() {
    let _serial = serial();
    let srv = tracked_server(|_| {});
    let mut c = [Client::connect(srv.addr)];
    per_request("depth 1", 1, || cycles(&mut c, 1));
}

#[test]
fn pipelined_cycles_allocate_nothing() {
    let _serial = serial();
    let srv = tracked_server(|_| {});
    let mut c = [Client::connect(srv.addr)];
    per_request("depth 16", DEPTH, || cycles(&mut c, DEPTH));
}

#[test]
fn many_connections_in_one_turn_allocate_nothing() {
    let _serial = serial();
    let srv = tracked_server(|_| {});
    let mut conns: Vec<Client> = (0..CONNS).map(|_| Client::connect(srv.addr)).collect();
    per_request("8 connections at depth 16", CONNS as u64 * DEPTH, || {
        cycles(&mut conns, DEPTH)
    });
}

#[test]
fn an_announced_frame_is_not_allocated_before_it_arrives() {
    let _serial = serial();
    /// Announced: far more than the server may allocate for this test to pass.
    const ANNOUNCED: u32 = 256 << 20;
    /// What the server may allocate while it reads the start of that frame and closes.
    const MOST: u64 = 1 << 20;
    let srv = tracked_server(|c| {
        c.max_frame_bytes = 2 * ANNOUNCED as usize;
        c.max_write_backlog = 4 * ANNOUNCED as usize;
    });
    let mut watcher = Client::connect(srv.addr);
    let before = tarq_testkit::tracked_bytes();
    {
        let mut c = Client::connect(srv.addr);
        let mut start = vec![0xce];
        start.extend_from_slice(&ANNOUNCED.to_be_bytes());
        start.extend_from_slice(&[0x82, 0x00, 0x0a, 0x01, 0x01]);
        start.resize(4096, 0xc0);
        c.send(&start);
        // The close ends the frame short: the server reads it all, then the end of stream.
        c.stream.shutdown(std::net::Shutdown::Write).unwrap();
        assert!(
            c.expect_closed().is_empty(),
            "no reply to an unfinished frame"
        );
    }
    wait_until("the server to drop the connection", || {
        let st = watcher.call("queue.stats", &[]).one();
        field(&st, "connections").as_u64() == Some(1)
    });
    let allocated = tarq_testkit::tracked_bytes() - before;
    println!("a {ANNOUNCED}-byte frame announced, 4 KiB sent: {allocated} bytes allocated");
    assert!(
        allocated < MOST,
        "{allocated} bytes allocated for a frame announced as {ANNOUNCED} bytes of which \
         4 KiB arrived"
    );
}

/// The beanstalk port's put → reserve → delete cycles, pipelined `DEPTH` deep: as on IPROTO,
/// a cycle allocates nothing.
#[test]
fn beanstalk_cycles_allocate_nothing() {
    use std::io::{Read, Write};
    use tarq_beanstalk::Reply;

    let _serial = serial();
    let (cfg, dir) = TestServer::config(|c| {
        c.beanstalk_listen = Some("127.0.0.1:0".parse().unwrap());
    });
    let server = Server::bind(cfg).expect("server binds");
    let addr = server.beanstalk_addr().expect("the beanstalk port");
    let _srv = TestServer::spawn(server, dir, tarq_testkit::track_this_thread);
    let mut sock = std::net::TcpStream::connect(addr).unwrap();
    sock.set_read_timeout(Some(support::WAIT)).unwrap();
    let mut buf = Vec::new();
    // Sends `cmds`, then reads one reply per command; returns the ids they name.
    let mut exchange = |cmds: &[u8], n: u64| -> Vec<u64> {
        sock.write_all(cmds).unwrap();
        let mut ids = Vec::new();
        while (ids.len() as u64) < n {
            if let Some((r, used)) = Reply::decode(&buf, 1 << 16).unwrap() {
                ids.push(match r {
                    Reply::Inserted { id } | Reply::Reserved { id, .. } => id,
                    Reply::Deleted => 0,
                    other => panic!("unexpected reply {other:?}"),
                });
                buf.drain(..used);
                continue;
            }
            let mut chunk = [0u8; 16 * 1024];
            let k = sock.read(&mut chunk).unwrap();
            assert!(k > 0, "closed");
            buf.extend_from_slice(&chunk[..k]);
        }
        ids
    };
    per_request("beanstalk at depth 16", DEPTH, || {
        let puts = b"put 0 0 60 32\r\n0123456789abcdef0123456789abcdef\r\n".repeat(DEPTH as usize);
        exchange(&puts, DEPTH);
        let reserved = exchange(&b"reserve\r\n".repeat(DEPTH as usize), DEPTH);
        let deletes: String = reserved
            .iter()
            .map(|id| format!("delete {id}\r\n"))
            .collect();
        exchange(deletes.as_bytes(), DEPTH);
    });
}
