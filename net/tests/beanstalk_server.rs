//! The beanstalk port against a real in-process tarq: what only tarq has to get right beyond
//! beanstalkd's replies (those are compared byte for byte with beanstalkd by
//! `beanstalk_diff.rs`): one engine behind both protocols (a job put on one is taken, buried,
//! kicked and deleted on the other, by its id there and its number in the tube API), a reserve waiting on several tubes, commands queued behind a waiting reserve,
//! pause-tube holding takes of both protocols, tubes in use kept from being dropped, and the
//! figures in `queue.stats()`.

mod support;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use rmpv::Value;
use support::{TestServer, WAIT};
use tarq_beanstalk::Reply;
use tarq_engine::id_number;
use tarq_net::server::Server;

/// A tarq serving both protocols: the IPROTO test server and its beanstalk address.
fn start() -> (TestServer, SocketAddr) {
    let (cfg, dir) = TestServer::config(|c| {
        c.beanstalk_listen = Some("127.0.0.1:0".parse().unwrap());
    });
    let server = Server::bind(cfg).expect("server binds");
    let bs = server
        .beanstalk_addr()
        .expect("the beanstalk port is bound");
    (TestServer::spawn(server, dir, || {}), bs)
}

/// A raw beanstalk connection: sends command lines, reads whole replies.
struct Bs {
    stream: TcpStream,
    buf: Vec<u8>,
}

impl Bs {
    fn connect(addr: SocketAddr) -> Bs {
        let stream = TcpStream::connect(addr).expect("connect");
        stream.set_read_timeout(Some(WAIT)).unwrap();
        Bs {
            stream,
            buf: Vec::new(),
        }
    }

    fn send(&mut self, bytes: &[u8]) {
        self.stream.write_all(bytes).expect("send");
    }

    /// The next reply, as its line and body (if it has one).
    fn reply(&mut self) -> (String, Vec<u8>) {
        loop {
            if let Some((r, n)) = Reply::decode(&self.buf, 1 << 20).expect("a well-formed reply") {
                let (line, body) = describe(&r);
                self.buf.drain(..n);
                return (line, body);
            }
            let mut chunk = [0u8; 4096];
            let n = self
                .stream
                .read(&mut chunk)
                .expect("a reply within the wait");
            assert!(n > 0, "closed before a reply");
            self.buf.extend_from_slice(&chunk[..n]);
        }
    }

    /// Sends `cmd` and returns the reply's line.
    fn line(&mut self, cmd: &str) -> String {
        self.send(cmd.as_bytes());
        self.reply().0
    }

    /// Whether a reply arrives within `d` (it must not, for a waiting reserve).
    fn nothing_within(&mut self, d: Duration) -> bool {
        self.stream.set_read_timeout(Some(d)).unwrap();
        let mut chunk = [0u8; 64];
        let quiet = match self.stream.read(&mut chunk) {
            Ok(n) => {
                self.buf.extend_from_slice(&chunk[..n]);
                false
            }
            Err(_) => true,
        };
        self.stream.set_read_timeout(Some(WAIT)).unwrap();
        quiet
    }
}

/// A reply as its first line (numbers kept) and its body.
fn describe(r: &Reply<'_>) -> (String, Vec<u8>) {
    let mut out = Vec::new();
    r.encode(&mut out);
    let end = out.windows(2).position(|w| w == b"\r\n").unwrap();
    let line = String::from_utf8_lossy(&out[..end]).into_owned();
    let body = match r {
        Reply::Reserved { body, .. } | Reply::Found { body, .. } | Reply::Ok { yaml: body } => {
            body.to_vec()
        }
        _ => Vec::new(),
    };
    (line, body)
}

fn id_in(line: &str) -> u64 {
    line.split(' ').nth(1).unwrap().parse().unwrap()
}

#[test]
fn a_job_put_on_one_protocol_is_taken_on_the_other() {
    let (srv, addr) = start();
    let mut bs = Bs::connect(addr);
    let mut ip = srv.connect();

    // beanstalk → IPROTO: the body arrives as the string it was. The job id is the task's
    // whole id (its tube's index and its number, below 2^53), the tube API shows its number.
    assert_eq!(bs.line("use jobs\r\n"), "USING jobs");
    let put = bs.line("put 10 0 60 5\r\nhello\r\n");
    assert!(put.starts_with("INSERTED "), "{put}");
    let job = id_in(&put);
    assert!((1 << 41..1 << 53).contains(&job), "job id {job}");
    assert_eq!(id_number(job), 0, "the first task of `jobs`");
    let task = ip.call("queue.tube.jobs:take", &[Value::from(0)]).one();
    let t = task.as_array().unwrap();
    assert_eq!(t[0].as_u64(), Some(id_number(job)));
    assert_eq!(t[1].as_str(), Some("t"));
    assert_eq!(t[2].as_str(), Some("hello"));
    ip.call("queue.tube.jobs:ack", &[t[0].clone()]).one();

    // IPROTO → beanstalk: a string's bytes are the body; another value is its MessagePack.
    let put = ip
        .call("queue.tube.jobs:put", &[Value::from("from iproto")])
        .one();
    let n = put.as_array().unwrap()[0].as_u64().unwrap();
    assert_eq!(n, 1, "numbered after the beanstalk job");
    let id = job - id_number(job) + n;
    assert_eq!(bs.line("watch jobs\r\n"), "WATCHING 2");
    bs.send(b"reserve-with-timeout 0\r\n");
    let (line, body) = bs.reply();
    assert_eq!(line, format!("RESERVED {id} 11"));
    assert_eq!(body, b"from iproto");
    assert_eq!(bs.line(&format!("delete {id}\r\n")), "DELETED");
    let map = Value::Map(vec![(Value::from("k"), Value::from(1))]);
    ip.call("queue.tube.jobs:put", std::slice::from_ref(&map))
        .one();
    bs.send(b"reserve-with-timeout 0\r\n");
    let (_, body) = bs.reply();
    let mut raw = Vec::new();
    rmpv::encode::write_value(&mut raw, &map).unwrap();
    assert_eq!(body, raw);

    // A body that is not UTF-8 goes through as MessagePack bin.
    bs.send(b"put 0 0 60 2\r\n\xff\xfe\r\n");
    let put = bs.reply().0;
    let task = ip
        .call(
            "queue.tube.jobs:peek",
            &[Value::from(id_number(id_in(&put)))],
        )
        .one();
    assert_eq!(task.as_array().unwrap()[2], Value::Binary(vec![0xff, 0xfe]));
}

#[test]
fn a_job_is_buried_kicked_and_deleted_on_either_protocol_by_its_id_or_its_number() {
    let (srv, addr) = start();
    let mut bs = Bs::connect(addr);
    let mut ip = srv.connect();
    ip.call(
        "queue.create_tube",
        &[Value::from("work"), Value::from("fifottl")],
    )
    .one();
    let state = |ip: &mut support::Client, n: u64| {
        let t = ip.call("queue.tube.work:peek", &[Value::from(n)]).one();
        t.as_array().unwrap()[1].as_str().unwrap().to_owned()
    };

    // Put over IPROTO: reserved over beanstalk by its id, buried there; seen buried and
    // kicked by the tube API; released over beanstalk; deleted by the tube API.
    let put = ip.call("queue.tube.work:put", &[Value::from("a")]).one();
    let n = put.as_array().unwrap()[0].as_u64().unwrap();
    assert_eq!(n, 0, "a fresh tube numbers from 0");
    assert_eq!(bs.line("watch work\r\n"), "WATCHING 2");
    bs.send(b"reserve-with-timeout 0\r\n");
    let id = id_in(&bs.reply().0);
    assert_eq!(id_number(id), n);
    assert_eq!(bs.line(&format!("bury {id} 5\r\n")), "BURIED");
    assert_eq!(state(&mut ip, n), "!");
    let kicked = ip.call("queue.tube.work:kick", &[Value::from(1)]).one();
    assert_eq!(kicked.as_u64(), Some(1));
    assert_eq!(
        bs.line(&format!("reserve-job {id}\r\n")),
        format!("RESERVED {id} 1")
    );
    assert_eq!(bs.line(&format!("release {id} 0 0\r\n")), "RELEASED");
    let gone = ip.call("queue.tube.work:delete", &[Value::from(n)]).one();
    assert_eq!(gone.as_array().unwrap()[1].as_str(), Some("-"));
    assert_eq!(bs.line(&format!("peek {id}\r\n")), "NOT_FOUND");

    // Put over beanstalk: buried by the tube API, kicked by id over beanstalk, taken and
    // acked by the tube API; then gone for beanstalk too.
    assert_eq!(bs.line("use work\r\n"), "USING work");
    let id = id_in(&bs.line("put 0 0 60 1\r\nb\r\n"));
    let n = id_number(id);
    assert_eq!(
        n, 1,
        "the next number of the tube, whichever protocol put it"
    );
    let buried = ip.call("queue.tube.work:bury", &[Value::from(n)]).one();
    assert_eq!(buried.as_array().unwrap()[1].as_str(), Some("!"));
    assert_eq!(bs.line(&format!("kick-job {id}\r\n")), "KICKED");
    let t = ip.call("queue.tube.work:take", &[Value::from(0)]).one();
    assert_eq!(t.as_array().unwrap()[0].as_u64(), Some(n));
    ip.call("queue.tube.work:ack", &[Value::from(n)]).one();
    assert_eq!(bs.line(&format!("peek {id}\r\n")), "NOT_FOUND");

    // Deleted over beanstalk: the tube API no longer finds its number, and the next put does
    // not get it back.
    let id = id_in(&bs.line("put 0 0 60 1\r\nc\r\n"));
    assert_eq!(bs.line(&format!("delete {id}\r\n")), "DELETED");
    let n = id_number(id);
    let e = ip.call("queue.tube.work:peek", &[Value::from(n)]).err(32);
    assert!(e.contains(&format!("Task {n} not found")), "{e}");
    let put = ip.call("queue.tube.work:put", &[Value::from("d")]).one();
    assert_eq!(put.as_array().unwrap()[0].as_u64(), Some(n + 1));
}

#[test]
fn a_reserve_waits_on_every_watched_tube_and_the_commands_behind_it_wait_too() {
    let (_srv, addr) = start();
    let mut worker = Bs::connect(addr);
    let mut producer = Bs::connect(addr);
    assert_eq!(worker.line("watch a\r\n"), "WATCHING 2");
    assert_eq!(worker.line("watch b\r\n"), "WATCHING 3");
    // Pipelined: the stats-tube must not be answered before the reserve.
    worker.send(b"reserve\r\nlist-tube-used\r\n");
    assert!(worker.nothing_within(Duration::from_millis(200)));
    assert_eq!(producer.line("use b\r\n"), "USING b");
    let put = producer.line("put 1 0 60 1\r\nx\r\n");
    let (line, body) = worker.reply();
    assert_eq!(line, format!("RESERVED {} 1", id_in(&put)));
    assert_eq!(body, b"x");
    assert_eq!(worker.reply().0, "USING default");
    // The waiting reserve left nothing parked in the other tubes: a put into `a` stays ready.
    assert_eq!(producer.line("use a\r\n"), "USING a");
    producer.line("put 1 0 60 1\r\ny\r\n");
    producer.send(b"stats-tube a\r\n");
    let yaml = String::from_utf8(producer.reply().1).unwrap();
    assert!(yaml.contains("current-jobs-ready: 1\n"), "{yaml}");
    assert!(yaml.contains("current-waiting: 0\n"), "{yaml}");
}

#[test]
fn of_several_watched_tubes_the_lowest_priority_job_is_reserved_first() {
    let (_srv, addr) = start();
    let mut c = Bs::connect(addr);
    c.line("use low\r\n");
    let low = c.line("put 100 0 60 1\r\nl\r\n");
    c.line("use high\r\n");
    let high = c.line("put 5 0 60 1\r\nh\r\n");
    c.line("watch low\r\n");
    c.line("watch high\r\n");
    assert_eq!(
        c.line("reserve\r\n"),
        format!("RESERVED {} 1", id_in(&high))
    );
    assert_eq!(c.line("reserve\r\n"), format!("RESERVED {} 1", id_in(&low)));
}

#[test]
fn a_reservation_goes_back_to_ready_when_its_connection_closes() {
    let (_srv, addr) = start();
    let mut a = Bs::connect(addr);
    let put = a.line("put 0 0 60 1\r\nz\r\n");
    assert!(a.line("reserve\r\n").starts_with("RESERVED"));
    let mut b = Bs::connect(addr);
    assert_eq!(b.line("reserve-with-timeout 0\r\n"), "TIMED_OUT");
    b.send(b"reserve-with-timeout 10\r\n");
    drop(a);
    assert_eq!(b.reply().0, format!("RESERVED {} 1", id_in(&put)));
}

#[test]
fn a_paused_tube_hands_out_nothing_on_either_protocol_until_the_pause_ends() {
    let (srv, addr) = start();
    let mut c = Bs::connect(addr);
    c.line("use p\r\n");
    c.line("watch p\r\n");
    c.line("ignore default\r\n");
    let put = c.line("put 0 0 60 1\r\nq\r\n");
    let started = Instant::now();
    assert_eq!(c.line("pause-tube p 1\r\n"), "PAUSED");
    let mut ip = srv.connect();
    let none = ip.call("queue.tube.p:take", &[Value::from(0)]).ok();
    assert!(none.is_empty(), "a paused tube gives nothing: {none:?}");
    // A reserve waits out the pause and then gets the job.
    assert_eq!(c.line("reserve\r\n"), format!("RESERVED {} 1", id_in(&put)));
    assert!(started.elapsed() >= Duration::from_millis(900));
}

#[test]
fn a_tube_in_use_on_the_beanstalk_port_cannot_be_dropped() {
    let (srv, addr) = start();
    let mut c = Bs::connect(addr);
    c.line("watch w\r\n");
    c.line("use w\r\n");
    // A job keeps the tube once nothing uses it (an empty one would go by itself).
    c.line("put 0 0 60 1\r\nx\r\n");
    let mut ip = srv.connect();
    let e = ip.call("queue.tube.w:drop", &[]).err(32);
    assert!(e.contains("consumers"), "{e}");
    c.line("use default\r\n");
    let e = ip.call("queue.tube.w:drop", &[]).err(32);
    assert!(e.contains("consumers"), "still watched: {e}");
    c.line("ignore w\r\n");
    let dropped = ip.call("queue.tube.w:drop", &[]).one();
    assert_eq!(dropped, Value::Boolean(true));
}

#[test]
fn beanstalk_figures_reach_queue_stats() {
    let (srv, addr) = start();
    let mut c = Bs::connect(addr);
    c.line("put 0 0 60 1\r\na\r\n");
    c.send(b"bogus\r\n");
    assert_eq!(c.reply().0, "UNKNOWN_COMMAND");
    let stats = srv.connect().call("queue.stats", &[]).one();
    let get = |k: &str| support::field(&stats, k).as_u64().unwrap();
    assert_eq!(get("beanstalk_connections"), 1);
    assert_eq!(get("beanstalk_commands"), 1);
    assert_eq!(get("beanstalk_errors"), 1);
}

#[test]
fn deadline_soon_answers_a_waiting_reserve_before_the_ttr_runs_out() {
    let (_srv, addr) = start();
    let mut c = Bs::connect(addr);
    let put = c.line("put 0 0 2 1\r\nd\r\n");
    assert_eq!(c.line("reserve\r\n"), format!("RESERVED {} 1", id_in(&put)));
    let started = Instant::now();
    // Nothing else is ready: the reserve waits until the last second of the 2 s TTR.
    assert_eq!(c.line("reserve-with-timeout 10\r\n"), "DEADLINE_SOON");
    let waited = started.elapsed();
    assert!(
        waited >= Duration::from_millis(900) && waited < Duration::from_millis(1900),
        "{waited:?}"
    );
    // Touched, it has its full TTR again.
    assert_eq!(c.line(&format!("touch {}\r\n", id_in(&put))), "TOUCHED");
    assert_eq!(c.line("reserve-with-timeout 0\r\n"), "TIMED_OUT");
}

#[test]
fn a_tube_name_of_beanstalkds_longest_is_a_tarq_tube() {
    let (srv, addr) = start();
    let mut c = Bs::connect(addr);
    let name = "n".repeat(tarq_beanstalk::MAX_TUBE_NAME);
    assert_eq!(c.line(&format!("use {name}\r\n")), format!("USING {name}"));
    let put = c.line("put 0 0 60 1\r\nx\r\n");
    let task = srv
        .connect()
        .call(
            &format!("queue.tube.{name}:peek"),
            &[Value::from(id_in(&put))],
        )
        .one();
    assert_eq!(task.as_array().unwrap()[2].as_str(), Some("x"));
}

#[test]
fn the_binary_serves_the_port_and_shows_its_figures_in_ctl_and_metrics() {
    let mut tarq = support::Tarq::start(&[
        "--beanstalk-listen",
        "127.0.0.1:0",
        "--metrics-listen",
        "127.0.0.1:0",
    ]);
    let line = tarq.wait_for_line("serving the beanstalk protocol");
    let beanstalk = support::addr_in(&line, "listen=").expect("the line names the address");
    let mut c = Bs::connect(beanstalk);
    assert!(c.line("put 0 0 60 1\r\nx\r\n").starts_with("INSERTED"));
    let out = tarq.ctl(&["stats"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    assert!(text.contains("beanstalk_connections"), "{text}");
    let mut scrape = TcpStream::connect(tarq.metrics.expect("metrics address")).unwrap();
    scrape.set_read_timeout(Some(WAIT)).unwrap();
    scrape
        .write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        .unwrap();
    let mut page = String::new();
    let _ = scrape.read_to_string(&mut page);
    assert!(page.contains("tarq_beanstalk_connections 1"), "{page}");
    assert!(page.contains("tarq_beanstalk_commands_total 1"), "{page}");
}

#[test]
fn a_stop_answers_a_reserve_waiting_on_several_tubes_once() {
    let (srv, addr) = start();
    let mut c = Bs::connect(addr);
    c.line("watch one\r\n");
    c.line("watch two\r\n");
    c.send(b"reserve\r\n");
    // Parked on all three tubes before the stop.
    let mut ip = srv.connect();
    support::wait_until("the reserve is parked", || {
        support::field(&ip.call("queue.stats", &[]).one(), "parked_takes").as_u64() == Some(3)
    });
    srv.shutdown();
    let mut rest = Vec::new();
    c.stream
        .read_to_end(&mut rest)
        .expect("the stop closes the connection");
    assert_eq!(String::from_utf8_lossy(&rest), "TIMED_OUT\r\n");
}
