//! End-to-end tests of the `tarq` server: a real server on a free loopback port, driven with raw
//! IPROTO frames built by the codec's client side. Covers the queue calls and their errors,
//! sessions, parked takes, delays, and bad input (broken framing, oversized frames, bad headers
//! and bodies, deep nesting, unknown requests, clients that never read).

mod support;

use std::io::Write;
use std::time::{Duration, Instant};

use rmpv::Value;
use support::*;
use tarq_iproto::client;
use tarq_iproto::codes::*;
use tarq_iproto::mp::write;
use tarq_iproto::{auth, types};

fn s(v: &str) -> Value {
    Value::from(v)
}

#[test]
fn greeting_is_128_bytes_with_version_uuid_and_salt() {
    let srv = TestServer::start();
    let c = srv.connect();
    assert_eq!(c.greeting.version, "2.6.0");
    assert_eq!(c.greeting.protocol, "Binary");
    assert_eq!(c.greeting.uuid.len(), 36);
    assert_eq!(c.greeting.salt.len(), 32);
    let c2 = srv.connect();
    assert_ne!(
        c.greeting.salt, c2.greeting.salt,
        "a fresh salt per connection"
    );
    assert_eq!(c.greeting.uuid, c2.greeting.uuid, "one uuid per server");
}

#[test]
fn ping_echoes_sync_with_schema_version_and_empty_body() {
    let srv = TestServer::start();
    let mut c = srv.connect();
    let r = c.ping();
    assert_eq!((r.code, r.schema_version), (0, Some(1)));
    assert_eq!(r.body, [0x80]);
    // A python-style ping: fixint length, sync 0, schema version 0 in the header.
    c.send(&[0x07, 0x83, 0x00, 0x40, 0x01, 0x00, 0x05, 0x00]);
    let r = c.recv();
    assert_eq!((r.sync, r.code), (0, 0));
}

#[test]
fn put_take_release_ack_round_trip() {
    let srv = TestServer::start();
    let mut c = srv.connect();
    let t = c.call("queue.put", &[s("hello")]).one();
    assert_eq!(
        t.to_string(),
        r#"{"id": 1, "status": "R", "runat": 0, "data": "hello"}"#
    );
    let payload = Value::Array(vec![Value::from(1), map(&[("k", Value::Nil)])]);
    let t2 = c.call("queue.put", std::slice::from_ref(&payload)).one();
    assert_eq!(
        (id_of(&t2), field(&t2, "data")),
        (2, &payload),
        "payload comes back as sent"
    );

    let t = c.call("queue.take", &[]).one();
    assert_eq!((id_of(&t), status_of(&t)), (1, "T"));
    let t = c.call("queue.release", &[Value::from(1)]).one();
    assert_eq!((id_of(&t), status_of(&t)), (1, "R"));
    // Released back to its place by id: taken again before task 2.
    let t = c.call("queue.take", &[Value::from(0)]).one();
    assert_eq!(id_of(&t), 1);
    let t = c.call("queue.ack", &[s("1")]).one(); // id as a decimal string
    assert_eq!((id_of(&t), status_of(&t)), (1, "T"));
    let t = c.call("queue.take", &[]).one();
    assert_eq!(id_of(&t), 2);
    c.call("queue.ack", &[Value::from(2)]).one();
    assert_eq!(
        c.call("queue.take", &[]).ok(),
        Vec::<Value>::new(),
        "nothing ready: no value"
    );

    let st = c.call("queue.stats", &[]).one();
    for (k, v) in [
        ("total", 0),
        ("ready", 0),
        ("taken", 0),
        ("waiting", 0),
        ("puts", 2),
        ("acks", 2),
    ] {
        assert_eq!(field(&st, k).as_u64(), Some(v), "stats.{k} in {st}");
    }
}

#[test]
fn call16_wraps_results_as_tuples() {
    let srv = TestServer::start();
    let mut c = srv.connect();
    let r = c.call16("queue.put", &[s("x")]).ok();
    assert_eq!(r.len(), 1);
    let tuple = r[0].as_array().expect("a tuple");
    assert_eq!(status_of(&tuple[0]), "R");
    assert_eq!(c.call16("queue.take", &[]).ok().len(), 1);
    assert_eq!(c.call16("queue.take", &[]).ok(), Vec::<Value>::new());
}

#[test]
fn put_options_and_their_errors() {
    let srv = TestServer::start();
    let mut c = srv.connect();
    let opts = map(&[
        ("pri", Value::from(-5)),
        ("ttl", Value::from(60)),
        ("ttr", Value::from(1.5)),
    ]);
    let t = c.call("queue.put", &[s("p"), opts]).one();
    assert_eq!(field(&t, "pri").as_i64(), Some(-5));
    assert_eq!(field(&t, "ttl").as_f64(), Some(60.0));
    assert_eq!(field(&t, "ttr").as_f64(), Some(1.5));
    let bad = c.call("queue.put", &[s("p"), map(&[("foo", Value::from(1))])]);
    assert_eq!(bad.err(ER_PROC_LUA), "unknown option 'foo'");
    assert!(bad.has_stack, "errors carry the MP_ERROR stack too");
    let bad = c.call("queue.put", &[s("p"), map(&[("delay", s("soon"))])]);
    assert_eq!(
        bad.err(ER_PROC_LUA),
        "option 'delay' must be a number, got string"
    );
    let bad = c.call("queue.take", &[s("x")]);
    assert_eq!(
        bad.err(ER_PROC_LUA),
        "option 'timeout' must be a number, got string"
    );
    let bad = c.call("queue.nope", &[]);
    assert_eq!(
        bad.err(ER_NO_SUCH_PROC),
        "Procedure 'queue.nope' is not defined"
    );
    let bad = c.call("queue.snapshot", &[]);
    assert_eq!(
        bad.err(ER_NO_SUCH_PROC),
        "Procedure 'queue.snapshot' is not defined"
    );
    assert_eq!(c.ping().code, 0, "errors keep the connection");
}

#[test]
fn ownership_errors_use_the_seed_wording() {
    let srv = TestServer::start();
    let mut a = srv.connect(); // session 1
    let mut b = srv.connect(); // session 2
    a.call("queue.put", &[s("one")]).one();
    a.call("queue.put", &[s("two")]).one();
    let t = a.call("queue.take", &[]).one();
    assert_eq!(id_of(&t), 1);
    assert_eq!(
        b.call("queue.ack", &[Value::from(1)]).err(ER_PROC_LUA),
        "Task 1 taken by 1. Not you (2)"
    );
    assert_eq!(
        b.call("queue.release", &[Value::from(1)]).err(ER_PROC_LUA),
        "Task 1 taken by 1. Not you (2)"
    );
    assert_eq!(
        b.call("queue.ack", &[Value::from(2)]).err(ER_PROC_LUA),
        "Task 2 not taken by anybody"
    );
    assert_eq!(
        b.call("queue.ack", &[Value::from(99)]).err(ER_PROC_LUA),
        "Task {99} was not found"
    );
    assert_eq!(
        b.call("queue.ack", &[]).err(ER_PROC_LUA),
        "Task id required"
    );
    assert_eq!(
        b.call("queue.release", &[Value::Nil]).err(ER_PROC_LUA),
        "Task id required"
    );
    assert_eq!(
        a.call("queue.ack", &[Value::from(1)]).code,
        0,
        "the owner still can"
    );
}

#[test]
fn disconnect_returns_taken_tasks_and_wakes_a_parked_take() {
    let srv = TestServer::start();
    let mut a = srv.connect();
    let mut b = srv.connect();
    a.call("queue.put", &[s("job")]).one();
    assert_eq!(id_of(&a.call("queue.take", &[]).one()), 1);
    let sync = b.send_call("queue.take", &[Value::from(10)]);
    // b is parked (nothing ready); prove it by a ping overtaking it.
    assert_eq!(b.ping().code, 0);
    drop(a);
    let r = b.recv();
    assert_eq!(r.sync, sync);
    let t = r.one();
    assert_eq!((id_of(&t), status_of(&t)), (1, "T"));
    let st = b.call("queue.stats", &[]).one();
    assert_eq!(field(&st, "auto_released").as_u64(), Some(1));
}

#[test]
fn delayed_put_becomes_ready_on_time() {
    let srv = TestServer::start();
    let mut c = srv.connect();
    let start = Instant::now();
    let t = c
        .call(
            "queue.put",
            &[s("later"), map(&[("delay", Value::from(0.2))])],
        )
        .one();
    assert_eq!(status_of(&t), "W");
    let runat = field(&t, "runat").as_f64().expect("runat is a float");
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64();
    assert!(
        (runat - now - 0.2).abs() < 1.0,
        "runat {runat} is about now + 0.2 ({now})"
    );
    assert_eq!(
        c.call("queue.take", &[]).ok(),
        Vec::<Value>::new(),
        "not ready yet"
    );
    let t = c.call("queue.take", &[Value::from(5)]).one();
    let waited = start.elapsed();
    assert_eq!(id_of(&t), 1);
    assert!(
        waited >= Duration::from_millis(190),
        "ready too early: {waited:?}"
    );
    assert!(
        waited < Duration::from_secs(4),
        "ready far too late: {waited:?}"
    );
}

#[test]
fn take_timeout_answers_with_no_value() {
    let srv = TestServer::start();
    let mut c = srv.connect();
    let start = Instant::now();
    assert_eq!(
        c.call("queue.take", &[Value::from(0.1)]).ok(),
        Vec::<Value>::new()
    );
    let waited = start.elapsed();
    assert!(
        waited >= Duration::from_millis(95),
        "timed out early: {waited:?}"
    );
}

#[test]
fn blocking_take_is_woken_by_a_put_from_another_connection() {
    let srv = TestServer::start();
    let mut consumer = srv.connect();
    let mut producer = srv.connect();
    let sync = consumer.send_call("queue.take", &[Value::from(10)]);
    assert_eq!(consumer.ping().code, 0); // the take is parked by now
    producer.call("queue.put", &[s("wake")]).one();
    let r = consumer.recv();
    assert_eq!(r.sync, sync);
    assert_eq!(field(&r.one(), "data").as_str(), Some("wake"));
}

#[test]
fn parked_takes_are_served_oldest_first() {
    let srv = TestServer::start();
    let mut first = srv.connect();
    let mut second = srv.connect();
    let mut producer = srv.connect();
    first.send_call("queue.take", &[Value::from(10)]);
    assert_eq!(first.ping().code, 0);
    second.send_call("queue.take", &[Value::from(10)]);
    assert_eq!(second.ping().code, 0);
    producer.call("queue.put", &[s("a")]).one();
    assert_eq!(field(&first.recv().one(), "data").as_str(), Some("a"));
    producer.call("queue.put", &[s("b")]).one();
    assert_eq!(field(&second.recv().one(), "data").as_str(), Some("b"));
}

#[test]
fn pipelined_requests_are_not_blocked_by_a_parked_take() {
    let srv = TestServer::start();
    let mut c = srv.connect();
    let mut out = Vec::new();
    client::call(&mut out, 1, "queue.take", &args(&[Value::from(10)]));
    client::ping(&mut out, 2);
    client::call(&mut out, 3, "queue.stats", &args(&[]));
    client::call(&mut out, 4, "queue.put", &args(&[s("later")]));
    c.send(&out); // all four in one write
    let syncs: Vec<u64> = (0..4).map(|_| c.recv().sync).collect();
    // The put (4) wakes the parked take (1) in the same turn; 2 and 3 never wait for 1.
    assert_eq!(syncs[..2], [2, 3], "replies: {syncs:?}");
    let mut rest = syncs[2..].to_vec();
    rest.sort();
    assert_eq!(rest, [1, 4]);
}

#[test]
fn broken_framing_gets_an_error_then_close() {
    let srv = TestServer::start();
    let mut c = srv.connect();
    c.send(&[0xa1, b'x']); // a string where the length should be
    let replies = c.expect_closed();
    assert_eq!(replies.len(), 1, "{replies:?}");
    assert_eq!(replies[0].sync, 0);
    assert!(replies[0].err(ER_INVALID_MSGPACK).contains("packet length"));
}

#[test]
fn a_huge_announced_frame_is_refused_at_once() {
    let srv = TestServer::start();
    let mut c = srv.connect();
    let start = Instant::now();
    c.send(&[0xce, 0xff, 0xff, 0xff, 0xff, 0x82]);
    let replies = c.expect_closed();
    assert_eq!(replies.len(), 1);
    let msg = replies[0].err(ER_INVALID_MSGPACK);
    assert_eq!(
        msg,
        "Invalid MsgPack - too big packet size in the header: 4294967295 (the limit is 16777216)"
    );
    assert!(start.elapsed() < Duration::from_secs(5));
    // The server is fine.
    assert_eq!(srv.connect().ping().code, 0);
}

#[test]
fn a_frame_over_a_custom_limit_is_refused() {
    let srv = TestServer::with(|c| c.max_frame_bytes = 1024);
    let mut c = srv.connect();
    c.call("queue.put", &[s(&"x".repeat(900))]).one();
    let sync = c.send_call("queue.put", &[s(&"x".repeat(2000))]);
    assert!(sync > 0);
    let replies = c.expect_closed();
    assert!(replies[0]
        .err(ER_INVALID_MSGPACK)
        .contains("the limit is 1024"));
}

#[test]
fn a_bad_body_gets_an_error_with_its_sync_and_the_connection_stays() {
    let srv = TestServer::start();
    let mut c = srv.connect();
    // CALL whose args are a number, not an array.
    let r = c.request(|o, sync| {
        client::raw(o, types::CALL, sync, &[0x82, 0x22, 0xa1, b'f', 0x21, 0x05])
    });
    assert!(r.err(ER_INVALID_MSGPACK).contains("expected array"));
    // CALL without a function name.
    let r = c.request(|o, sync| client::raw(o, types::CALL, sync, &[0x81, 0x21, 0x90]));
    assert_eq!(
        r.err(ER_MISSING_REQUEST_FIELD),
        "Missing mandatory field 'function name' in request"
    );
    // Truncated MessagePack inside a complete frame.
    let r = c.request(|o, sync| client::raw(o, types::CALL, sync, &[0x82, 0x22, 0xa5, b'f']));
    assert!(r.err(ER_INVALID_MSGPACK).contains("packet body"));
    assert_eq!(c.ping().code, 0);
}

#[test]
fn deep_nesting_is_refused_without_crashing() {
    let srv = TestServer::start();
    let mut c = srv.connect();
    let mut a = vec![0x91];
    a.extend(std::iter::repeat_n(0x91, 100_000));
    a.push(0x01);
    let r = c.request(|o, sync| client::call(o, sync, "queue.put", &a));
    assert!(
        r.err(ER_INVALID_MSGPACK)
            .contains("nesting deeper than 128 levels"),
        "{r:?}"
    );
    assert_eq!(
        c.call("queue.stats", &[]).one().as_map().map(|_| ()),
        Some(())
    );
    assert_eq!(
        field(&c.call("queue.stats", &[]).one(), "total").as_u64(),
        Some(0),
        "nothing was put"
    );
}

#[test]
fn unknown_request_types_and_eval_get_48_and_the_connection_stays() {
    let srv = TestServer::start();
    let mut c = srv.connect();
    let r = c.request(|o, sync| client::raw(o, 2, sync, &[0x80]));
    assert_eq!(r.err(ER_UNKNOWN_REQUEST_TYPE), "Unknown request type 2");
    let r = c.request(|o, sync| client::eval(o, sync, "return 1", &[0x90]));
    let msg = r.err(ER_UNKNOWN_REQUEST_TYPE);
    assert!(
        msg.starts_with("EVAL is not supported: tarq runs no Lua") && msg.ends_with("return 1"),
        "{msg}"
    );
    assert_eq!(c.ping().code, 0);
}

#[test]
fn eval_answers_the_two_expressions_go_tarantool_queue_sends() {
    let srv = TestServer::start();
    let mut c = srv.connect();
    let exists = |c: &mut Client, name: &str, expr: &str| {
        let mut args = Vec::new();
        write::array_len(&mut args, 1);
        write::str(&mut args, name);
        let r = c.request(|o, sync| client::eval(o, sync, expr, &args));
        r.ok()
    };
    let is_there = "local name = ... ; return queue.tube[name] ~= nil";
    assert_eq!(
        exists(&mut c, "jobs", is_there),
        vec![Value::Boolean(false)]
    );
    let mut args = Vec::new();
    write::array_len(&mut args, 3);
    write::str(&mut args, "jobs");
    write::str(&mut args, "fifottl");
    write::map_len(&mut args, 1);
    write::str(&mut args, "ttl");
    write::uint(&mut args, 60);
    let create = "local name, type, cfg = ... ; queue.create_tube(name, type, cfg)";
    let r = c.request(|o, sync| client::eval(o, sync, create, &args));
    assert_eq!(
        r.ok(),
        Vec::<Value>::new(),
        "no value, as the expression returns none"
    );
    // Both spellings of the check, as older releases send `~= null`.
    assert_eq!(exists(&mut c, "jobs", is_there), vec![Value::Boolean(true)]);
    let old = "local name = ... ; return queue.tube[name] ~= null";
    assert_eq!(exists(&mut c, "jobs", old), vec![Value::Boolean(true)]);
    // Creating it again is the original's error.
    let r = c.request(|o, sync| client::eval(o, sync, create, &args));
    assert_eq!(r.err(ER_PROC_LUA), "Space 'jobs' already exists");
}

#[test]
fn id_and_schema_selects_answer_like_tarantool() {
    let srv = TestServer::start();
    let mut c = srv.connect();
    let r = c.request(|o, sync| client::id(o, sync, 6, &[2]));
    assert_eq!(r.code, 0);
    assert_eq!(r.body, b"\x83\x54\x03\x55\x90\x5b\xa9chap-sha1");
    for space in [281, 289, 277, 341] {
        let r = c.request(|o, sync| client::select(o, sync, space));
        assert_eq!(r.ok(), Vec::<Value>::new(), "space {space}");
    }
    let r = c.request(|o, sync| client::select(o, sync, 512));
    assert_eq!(r.err(ER_NO_SUCH_SPACE), "Space '512' does not exist");
}

#[test]
fn auth_with_a_configured_user() {
    let srv = TestServer::with(|c| {
        c.auth = Some(tarq_net::config::Credentials {
            user: "app".into(),
            password: "s3cret".into(),
        })
    });
    let mut c = srv.connect();
    assert_eq!(
        c.call("queue.put", &[s("x")]).err(ER_ACCESS_DENIED),
        "Execute access to function 'queue.put' is denied for user 'guest'"
    );
    assert_eq!(c.ping().code, 0, "ping needs no auth");
    let r = c.request(client::auth_guest);
    assert_eq!(r.code, 0, "guest may authenticate");
    let salt = c.greeting.salt.clone();
    let r = c.request(|o, sync| client::auth(o, sync, "app", &auth::scramble(&salt, "wrong")));
    assert_eq!(
        r.err(ER_PASSWORD_MISMATCH),
        "Incorrect password supplied for user 'app'"
    );
    let r = c.request(|o, sync| client::auth(o, sync, "bob", &auth::scramble(&salt, "s3cret")));
    assert_eq!(r.err(ER_NO_SUCH_USER), "User 'bob' is not found");
    assert_eq!(c.call("queue.put", &[s("x")]).code, ER_ACCESS_DENIED);
    let r = c.request(|o, sync| client::auth(o, sync, "app", &auth::scramble(&salt, "s3cret")));
    assert_eq!(r.code, 0);
    assert_eq!(status_of(&c.call("queue.put", &[s("x")]).one()), "R");
    // The scramble is bound to this connection's salt.
    let mut other = srv.connect();
    let r = other.request(|o, sync| client::auth(o, sync, "app", &auth::scramble(&salt, "s3cret")));
    assert_eq!(r.code, ER_PASSWORD_MISMATCH);
}

#[test]
fn connection_limit_refuses_cleanly() {
    let srv = TestServer::with(|c| c.max_connections = 2);
    let mut a = srv.connect();
    let mut b = srv.connect();
    assert_eq!(a.ping().code, 0);
    assert_eq!(b.ping().code, 0);
    let mut refused = srv.connect(); // the greeting still comes
    let replies = refused.expect_closed();
    assert_eq!(replies.len(), 1);
    assert_eq!(
        replies[0].err(0),
        "Too many connections: the limit is 2 (--max-connections)"
    );
    assert_eq!(a.ping().code, 0, "the others are unaffected");
    drop(b);
    // Once the server has seen the close, a new connection gets in.
    wait_until("a free connection slot", || {
        let mut c = srv.connect();
        let mut out = Vec::new();
        client::ping(&mut out, 7);
        c.send(&out);
        c.try_recv().is_some_and(|r| r.code == 0 && r.sync == 7)
    });
}

#[test]
fn a_client_that_never_reads_is_cut_off_and_others_are_unaffected() {
    let srv = TestServer::with(|c| {
        c.max_frame_bytes = 16 * 1024;
        c.max_write_backlog = 64 * 1024;
    });
    let mut hog = srv.connect();
    let mut good = srv.connect();
    let payload = "y".repeat(8 * 1024);
    let mut batch = Vec::new();
    for _ in 0..64 {
        client::call(&mut batch, 1, "queue.put", &args(&[s(&payload)]));
    }
    // Send puts and never read: the replies pile up in the kernel, then in the server.
    hog.stream.set_write_timeout(Some(WAIT)).unwrap();
    let deadline = Instant::now() + WAIT;
    let mut cut_off = false;
    while Instant::now() < deadline {
        if hog.stream.write_all(&batch).is_err() {
            cut_off = true;
            break;
        }
        assert_eq!(good.ping().code, 0, "the other client is served meanwhile");
    }
    assert!(cut_off, "the non-reading client was never disconnected");
    assert_eq!(good.ping().code, 0);
    let st = good.call("queue.stats", &[]).one();
    assert_eq!(field(&st, "connections").as_u64(), Some(1), "{st}");
}

#[test]
fn null_mode_answers_every_call_empty() {
    let srv = TestServer::with(|c| c.null = true);
    let mut c = srv.connect();
    assert_eq!(c.call("queue.put", &[s("x")]).ok(), Vec::<Value>::new());
    assert_eq!(c.call("anything.at.all", &[]).ok(), Vec::<Value>::new());
    assert_eq!(c.ping().code, 0);
}

#[test]
fn many_pipelined_requests_in_one_write_all_get_replies_in_order() {
    let srv = TestServer::start();
    let mut c = srv.connect();
    let mut out = Vec::new();
    for i in 0..2000u64 {
        client::call(&mut out, i + 1, "queue.put", &args(&[Value::from(i)]));
    }
    c.send(&out);
    for i in 0..2000u64 {
        let r = c.recv();
        assert_eq!(r.sync, i + 1);
        assert_eq!(field(&r.one(), "data").as_u64(), Some(i));
    }
    // And a frame split across writes is reassembled.
    let mut out = Vec::new();
    client::call(&mut out, 9999, "queue.take", &args(&[]));
    for b in &out {
        c.stream.write_all(std::slice::from_ref(b)).unwrap();
    }
    let r = c.recv();
    assert_eq!((r.sync, id_of(&r.one())), (9999, 1));
}

#[test]
fn a_slow_reader_gets_every_reply_once_it_reads() {
    let srv = TestServer::start();
    let mut c = srv.connect();
    let payload = "z".repeat(8 * 1024);
    let mut out = Vec::new();
    for i in 0..1500u64 {
        client::call(&mut out, i + 1, "queue.put", &args(&[s(&payload)]));
    }
    // ~12 MB of replies: far more than the socket buffers hold, so the server must wait for
    // writability and resume; nothing is read until every request has been sent.
    c.stream.set_write_timeout(Some(WAIT)).unwrap();
    c.send(&out);
    for i in 0..1500u64 {
        let r = c.recv();
        assert_eq!((r.sync, r.code), (i + 1, 0));
    }
    assert_eq!(c.ping().code, 0);
}

#[test]
fn a_graceful_stop_writes_every_reply_to_a_slow_reader() {
    let srv = TestServer::start();
    let mut c = srv.connect();
    let payload = "w".repeat(8 * 1024);
    let mut out = Vec::new();
    for i in 0..1000u64 {
        client::call(&mut out, i + 1, "queue.put", &args(&[s(&payload)]));
    }
    client::ping(&mut out, 5000);
    c.stream.set_write_timeout(Some(WAIT)).unwrap();
    c.send(&out);
    // Once the server has executed every put, every reply is queued (the ping's last).
    wait_until("every request read", || {
        let mut probe = srv.connect();
        field(&probe.call("queue.stats", &[]).one(), "puts").as_u64() == Some(1000)
    });
    srv.shutdown();
    let replies = c.expect_closed();
    assert_eq!(replies.len(), 1001, "every reply written before the exit");
    assert_eq!(replies[1000].sync, 5000);
}

/// A frame around raw header and body bytes, whatever they hold.
fn frame(header_and_body: &[u8]) -> Vec<u8> {
    let mut out = vec![0xce];
    out.extend_from_slice(&(header_and_body.len() as u32).to_be_bytes());
    out.extend_from_slice(header_and_body);
    out
}

#[test]
fn a_bad_header_in_a_good_frame_gets_an_error_and_the_connection_stays() {
    let srv = TestServer::start();
    let mut c = srv.connect();
    // (header and body bytes, the sync the error must carry, what the message names)
    let mut deep_header = vec![0x83, 0x00, 0x40, 0x01, 0x0d, 0x0b];
    deep_header.extend(std::iter::repeat_n(0x91, 100_000));
    deep_header.push(0x01);
    let cases: Vec<(Vec<u8>, u64, &str)> = vec![
        // The header is an array, not a map: no sync can be read.
        (vec![0x92, 0x00, 0x40], 0, "packet header"),
        // A map without the request type.
        (vec![0x81, 0x01, 0x0a], 10, "no request type"),
        // A header key that is a string.
        (vec![0x82, 0xa1, b'k', 0x00, 0x01, 0x0b], 0, "packet header"),
        // The reserved byte 0xc1 as the sync.
        (vec![0x82, 0x00, 0x40, 0x01, 0xc1], 0, "packet header"),
        // A ping with bytes after its body.
        (
            vec![0x82, 0x00, 0x40, 0x01, 0x0c, 0x80, 0x01],
            12,
            "after the body",
        ),
        // An unknown header key whose value nests 100k deep.
        (deep_header, 0, "nesting deeper than 128 levels"),
    ];
    for (bytes, sync, names) in cases {
        c.send(&frame(&bytes));
        let r = c.recv();
        assert_eq!(r.sync, sync, "{r:?}");
        let msg = r.err(ER_INVALID_MSGPACK);
        assert!(msg.contains(names), "{msg:?} should name {names:?}");
        assert_eq!(c.ping().code, 0, "the connection stays after {msg:?}");
    }
    // A function name that is not UTF-8, and the reserved byte inside the arguments.
    let r = c.request(|o, sync| {
        client::raw(
            o,
            types::CALL,
            sync,
            &[0x82, 0x22, 0xa2, 0xff, 0xfe, 0x21, 0x90],
        )
    });
    assert!(r.err(ER_INVALID_MSGPACK).contains("UTF-8"), "{r:?}");
    let r = c.request(|o, sync| client::call(o, sync, "queue.put", &[0x91, 0xc1]));
    assert!(r.err(ER_INVALID_MSGPACK).contains("reserved byte"), "{r:?}");
    let st = c.call("queue.stats", &[]).one();
    assert_eq!(
        field(&st, "total").as_u64(),
        Some(0),
        "nothing was put: {st}"
    );
}

#[test]
fn element_counts_are_bounded_and_a_task_at_the_bounds_comes_back() {
    use tarq_iproto::mp::{MAX_DEPTH, MAX_ELEMENTS};
    let srv = TestServer::start();
    let mut c = srv.connect();
    // A payload of `n` nils: with the args array and the payload array itself, `n + 2` values.
    let put = |c: &mut Client, n: usize| {
        let mut a = vec![0x91, 0xdd];
        a.extend_from_slice(&(n as u32).to_be_bytes());
        a.resize(a.len() + n, 0xc0);
        c.request(|o, sync| client::call(o, sync, "queue.put", &a))
    };
    let r = put(&mut c, MAX_ELEMENTS);
    assert!(
        r.err(ER_INVALID_MSGPACK)
            .contains(&format!("more than {MAX_ELEMENTS} elements")),
        "{r:?}"
    );
    // Just under the bound is a task like any other, and its reply (the payload wrapped in the
    // task map and the body) decodes.
    let t = put(&mut c, MAX_ELEMENTS - 2).one();
    assert_eq!(
        field(&t, "data").as_array().map(Vec::len),
        Some(MAX_ELEMENTS - 2)
    );
    // The same at the depth bound: the args array and 127 more levels.
    let mut a = vec![0x91; MAX_DEPTH];
    a.push(0x01);
    let t = c
        .request(|o, sync| client::call(o, sync, "queue.put", &a))
        .one();
    let taken = c.call("queue.take", &[]).one();
    assert_eq!(id_of(&taken), id_of(&t) - 1);
    let st = c.call("queue.stats", &[]).one();
    assert_eq!(field(&st, "total").as_u64(), Some(2), "{st}");
}

#[test]
fn misbehaving_clients_neither_crash_the_server_nor_touch_others_tasks() {
    let srv = TestServer::start();
    let mut owner = srv.connect();
    for data in ["a", "b", "c"] {
        owner.call("queue.put", &[s(data)]).one();
    }
    let held = id_of(&owner.call("queue.take", &[]).one());

    // Frames with a valid size and random contents, and raw random bytes, from a fixed seed.
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut next = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    for round in 0..64 {
        let mut c = srv.connect();
        let len = (next() % 64) as usize;
        let junk: Vec<u8> = (0..len).map(|_| next() as u8).collect();
        if round % 2 == 0 {
            c.send(&frame(&junk));
            c.send(&frame(&junk[..len / 2]));
        } else {
            c.send(&junk);
        }
        // Whatever it gets back, a half-close ends it.
        let _ = c.stream.shutdown(std::net::Shutdown::Write);
        c.expect_closed();
    }
    // The classic offenders, each on its own connection.
    for bytes in [
        vec![0xa1, b'x'],                         // not a size
        vec![0xce, 0xff, 0xff, 0xff, 0xff, 0x82], // 4 GiB announced
    ] {
        let mut c = srv.connect();
        c.send(&bytes);
        assert_eq!(c.expect_closed().len(), 1);
    }
    let mut deep = vec![0x91; 100_000];
    deep.push(0x01);
    let mut c = srv.connect();
    c.send(&frame(&deep)); // 100k levels where a header should be
    c.recv().err(ER_INVALID_MSGPACK);
    let r = c.request(|o, sync| client::call(o, sync, "queue.put", &[&[0x91][..], &deep].concat()));
    r.err(ER_INVALID_MSGPACK);
    drop(c);
    // Someone else's task can be neither acked nor released by another connection.
    let mut other = srv.connect();
    for f in ["queue.ack", "queue.release"] {
        let msg = other.call(f, &[Value::from(held)]).err(ER_PROC_LUA);
        assert!(msg.contains("Not you"), "{msg}");
    }
    drop(other);

    let st = owner.call("queue.stats", &[]).one();
    let count = |k: &str| field(&st, k).as_u64();
    assert_eq!(
        (count("total"), count("ready"), count("taken")),
        (Some(3), Some(2), Some(1)),
        "{st}"
    );
    assert_eq!(
        id_of(&owner.call("queue.ack", &[Value::from(held)]).one()),
        held
    );
    let mut rest: Vec<u64> = (0..2)
        .map(|_| id_of(&owner.call("queue.take", &[]).one()))
        .collect();
    rest.sort_unstable();
    assert_eq!(rest, [held + 1, held + 2]);
}

#[test]
fn a_client_that_half_closes_gets_every_reply_before_the_close() {
    const TASKS: u64 = 1000;
    let srv = TestServer::start();
    let mut c = srv.connect();
    let payload = "h".repeat(8 * 1024);
    let mut out = Vec::new();
    for i in 0..TASKS {
        client::call(&mut out, i + 1, "queue.put", &args(&[s(&payload)]));
    }
    c.stream.set_write_timeout(Some(WAIT)).unwrap();
    c.send(&out);
    for _ in 0..TASKS {
        c.recv().one();
    }
    // Small takes with big replies (~8 MB, far more than one write into the socket takes), all
    // read in one turn together with the end of the client's stream: it has said all it will
    // say, but still reads.
    out.clear();
    for i in 0..TASKS {
        client::call(&mut out, i + 1, "queue.take", &args(&[]));
    }
    c.send(&out);
    c.stream.shutdown(std::net::Shutdown::Write).unwrap();
    let replies = c.expect_closed();
    assert_eq!(
        replies.len(),
        TASKS as usize,
        "a reply to every request, then the close"
    );
    for (i, r) in replies.iter().enumerate() {
        assert_eq!((r.sync, r.code), (i as u64 + 1, 0));
    }
}
