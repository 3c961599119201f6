//! A forwarded call has a deadline even when its link is alive: a replica set whose primary
//! greets, accepts the link and answers every ping but never answers one call (stuck on it, a
//! bug) does not hold that call's client for ever. Here the owner is a stand-in that does just
//! that, registered in a real etcd as set `f`'s leader; a real node forwards an ack for a task
//! of `f`'s partition, and answers it with code 1003 (outcome unknown) after the call's wait
//! plus six link timeouts.

#[path = "support/cluster.rs"]
mod cluster;
mod support;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use cluster::{field, str_field, wait_for, Etcd, Nodes};
use rmpv::Value;
use tarq_client::{pack_args, Client, ClientError};
use tarq_cluster::etcd;
use tarq_iproto::request::{self, RequestKind};

fn connect(addr: SocketAddr) -> Client {
    Client::connect_addr(addr, Duration::from_secs(20)).expect("connect")
}

/// A replica set's primary that links and pings but answers no forwarded call: each
/// `tarq.ask` it reads is counted in `asks`.
fn silent_owner(asks: Arc<AtomicU64>) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            let asks = Arc::clone(&asks);
            std::thread::spawn(move || serve_silently(stream, &asks));
        }
    });
    addr
}

fn serve_silently(mut s: TcpStream, asks: &AtomicU64) {
    let greeting = tarq_iproto::greeting::encode(&[7; 16], &[1; tarq_iproto::greeting::SALT_LEN]);
    if s.write_all(&greeting).is_err() {
        return;
    }
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        while buf.len() >= 5 {
            let len = u32::from_be_bytes(buf[1..5].try_into().unwrap()) as usize;
            if buf.len() < 5 + len {
                break;
            }
            let frame: Vec<u8> = buf.drain(..5 + len).skip(5).collect();
            let Ok(req) = request::decode(&frame) else {
                return;
            };
            let mut out = Vec::new();
            match req.kind {
                RequestKind::Call {
                    function: "tarq.ask",
                    ..
                } => {
                    asks.fetch_add(1, Ordering::SeqCst);
                }
                _ => tarq_iproto::response::ok_empty(&mut out, req.sync),
            }
            if s.write_all(&out).is_err() {
                return;
            }
        }
        match s.read(&mut chunk) {
            Ok(0) | Err(_) => return,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    }
}

#[test]
fn a_call_a_live_link_never_answers_is_answered_outcome_unknown_after_its_deadline() {
    let etcd = Etcd::start();
    let asks = Arc::new(AtomicU64::new(0));
    let owner = silent_owner(Arc::clone(&asks));
    // Set f's leader, as etcd would show a live primary of it.
    let mut e = etcd::Client::new(vec![etcd.url.clone()]);
    let leader = format!(r#"{{"name":"f0","addr":"{owner}"}}"#);
    let put = etcd::Op::Put {
        key: b"/tarq/c/sets/f/leader".to_vec(),
        value: leader.into_bytes(),
        lease: 0,
    };
    e.txn(&[], &[put], &[], Duration::from_secs(5)).unwrap();

    let mut nodes = Nodes::start_sets(&etcd, &[("a", 1)], &["--link-timeout", "0.2"]);
    let a = nodes.wait_leader_among(&[0]);
    let a_addr = nodes.nodes[a].addr;
    let opts = Value::Map(vec![(Value::from("partitions"), Value::from(2))]);
    let args = [Value::from("t"), Value::from("fifottl"), opts];
    let mut c = connect(a_addr);
    c.call("queue.create_tube", &pack_args(&args), None)
        .expect("create_tube");
    // The partition placed on f, and its engine index.
    let mut index = None;
    wait_for("a partition on set f", || {
        let o = c.call("queue.cluster", &pack_args(&[]), None).unwrap();
        let tubes = field(field(&o[0], "placement").unwrap(), "tubes").unwrap();
        let t = (tubes.as_array().unwrap().iter()).find(|t| str_field(t, "name") == "t");
        index = t
            .and_then(|t| field(t, "partitions"))
            .and_then(Value::as_array)
            .and_then(|ps| ps.iter().find(|p| str_field(p, "set") == "f"))
            .and_then(|p| field(p, "index"))
            .and_then(Value::as_u64);
        index.is_some()
    });
    let id = (index.unwrap() << tarq_engine::TUBE_ID_SHIFT) | 1;

    // An ack of a task of f's partition goes to f's primary, which never answers it.
    let started = Instant::now();
    let r = c.call("queue.tube.t:ack", &pack_args(&[Value::from(id)]), None);
    let took = started.elapsed();
    match r {
        Err(ClientError::Server { code, message }) => {
            assert_eq!(code, tarq_iproto::codes::ER_OUTCOME_UNKNOWN, "{message}");
            assert!(
                message.contains("did not answer a forwarded call") && message.contains("alive"),
                "{message}"
            );
        }
        other => panic!("expected outcome unknown, got {other:?}"),
    }
    assert!(
        asks.load(Ordering::SeqCst) >= 1,
        "the call reached the owner"
    );
    // Six link timeouts (1.2 s) after it was sent, not as soon as the link fell silent.
    assert!(
        took >= Duration::from_millis(1100) && took < Duration::from_secs(15),
        "answered after {took:?}"
    );
    assert!(
        !nodes.log(a).contains("link to a replica set dropped"),
        "the link stayed up"
    );
}
