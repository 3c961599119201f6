//! `Cluster`'s rules against scripted fake nodes (a greeting, then each call answered as the
//! test says): refusals followed to the primary they name and no further than
//! `MAX_REDIRECTS`, a refusal naming no primary waited out, a read sent again after a lost
//! connection, a change never sent twice, and a connection that died while idle replaced
//! before anything is sent on it. The real server's refusals are in `net/tests/leader_clients.rs`.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tarq_client::cluster::{Cluster, ClusterError, Effect, Options, MAX_REDIRECTS};
use tarq_iproto::codes::ER_READONLY;
use tarq_iproto::request::{self, RequestKind};
use tarq_iproto::{greeting, response, split_frame};

/// What a fake node does with a call.
#[derive(Clone)]
enum Act {
    /// Answers `[name]`: which node took it.
    Ok,
    Refuse(String),
    /// Answers `[value]`.
    Value(rmpv::Value),
    /// Closes the connection without a reply.
    Close,
}

/// A node on a free port answering every call of every connection with `act(function)`;
/// counts the calls it saw.
struct Node {
    addr: String,
    calls: Arc<AtomicUsize>,
}

fn node(name: &'static str, act: impl Fn(&str) -> Act + Send + Sync + 'static) -> Node {
    node_on(TcpListener::bind("127.0.0.1:0").unwrap(), name, act)
}

fn node_on(
    l: TcpListener,
    name: &'static str,
    act: impl Fn(&str) -> Act + Send + Sync + 'static,
) -> Node {
    let addr = l.local_addr().unwrap().to_string();
    let calls = Arc::new(AtomicUsize::new(0));
    let (seen, act) = (calls.clone(), Arc::new(act));
    std::thread::spawn(move || {
        for s in l.incoming() {
            let (seen, act) = (seen.clone(), act.clone());
            std::thread::spawn(move || serve(s.unwrap(), name, &*act, &seen));
        }
    });
    Node { addr, calls }
}

fn serve(mut s: TcpStream, name: &str, act: &dyn Fn(&str) -> Act, seen: &AtomicUsize) {
    s.write_all(&greeting::encode(&[1; 16], &[2; 32])).unwrap();
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        while let Ok(Some(f)) = split_frame(&buf, 1 << 20) {
            let frame = buf[f.prefix..f.total()].to_vec();
            buf.drain(..f.total());
            let req = request::decode(&frame).unwrap();
            let RequestKind::Call { function, .. } = req.kind else {
                continue;
            };
            seen.fetch_add(1, Ordering::SeqCst);
            let mut out = Vec::new();
            match act(function) {
                Act::Ok => {
                    let start = response::begin_data(&mut out, req.sync, 1);
                    rmpv::encode::write_value(&mut out, &rmpv::Value::from(name)).unwrap();
                    response::finish(&mut out, start);
                }
                Act::Refuse(message) => response::error(&mut out, req.sync, ER_READONLY, &message),
                Act::Value(v) => {
                    let start = response::begin_data(&mut out, req.sync, 1);
                    rmpv::encode::write_value(&mut out, &v).unwrap();
                    response::finish(&mut out, start);
                }
                Act::Close => return,
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

fn refusing(primary: &str) -> impl Fn(&str) -> Act + Send + Sync + 'static {
    let message = format!("read-only replica: the primary is {primary}");
    move |_: &str| Act::Refuse(message.clone())
}

fn opts(failover_wait_ms: u64) -> Options {
    Options {
        failover_wait: Duration::from_millis(failover_wait_ms),
        ..Options::new(Duration::from_secs(5))
    }
}

fn took(values: Vec<rmpv::Value>) -> String {
    values[0].as_str().unwrap().to_string()
}

#[test]
fn a_refusal_leads_to_the_primary_it_names() {
    let primary = node("primary", |_| Act::Ok);
    let replica = node("replica", refusing(&primary.addr));
    let mut c = Cluster::connect(vec![replica.addr.clone()], opts(1000)).unwrap();
    let got = c.call("queue.put", &[0x90], None, Effect::Changes).unwrap();
    assert_eq!(took(got), "primary");
    assert_eq!(c.addr(), Some(primary.addr.as_str()));
    assert_eq!(c.addrs(), [replica.addr.clone(), primary.addr.clone()]);
    // It stays there.
    c.call("queue.put", &[0x90], None, Effect::Changes).unwrap();
    assert_eq!(replica.calls.load(Ordering::SeqCst), 1);
    assert_eq!(primary.calls.load(Ordering::SeqCst), 2);
}

/// `queue.cluster()` names the leader as `{name, addr}` (what tarq sends): `find_leader`
/// goes there, though only a replica's address was given, without asking anyone's stats.
#[test]
fn find_leader_follows_the_leader_queue_cluster_names() {
    let leader = node("leader", |_| Act::Ok);
    let named = rmpv::Value::Map(vec![
        ("name".into(), "b".into()),
        ("addr".into(), leader.addr.as_str().into()),
    ]);
    let cluster = rmpv::Value::Map(vec![("leader".into(), named)]);
    let replica = node("replica", move |f| match f {
        "queue.cluster" => Act::Value(cluster.clone()),
        _ => Act::Ok,
    });
    let mut c = Cluster::connect(vec![replica.addr.clone()], opts(1000)).unwrap();
    assert_eq!(c.find_leader().unwrap(), Some(leader.addr.clone()));
    assert_eq!(c.addr(), Some(leader.addr.as_str()));
    assert_eq!(
        replica.calls.load(Ordering::SeqCst),
        1,
        "only queue.cluster was asked"
    );
}

#[test]
fn refusals_in_a_circle_stop_after_max_redirects() {
    // a and b name each other: stale information that no redirect resolves.
    let la = TcpListener::bind("127.0.0.1:0").unwrap();
    let a_addr = la.local_addr().unwrap().to_string();
    let b = node("b", refusing(&a_addr));
    let _a = node_on(la, "a", refusing(&b.addr));
    let mut c = Cluster::connect(vec![a_addr.clone()], opts(1000)).unwrap();
    let e = c
        .call("queue.put", &[0x90], None, Effect::Changes)
        .unwrap_err();
    let ClusterError::TooManyRedirects { path, .. } = &e else {
        panic!("{e}");
    };
    assert_eq!(path.len(), MAX_REDIRECTS + 2, "{e}");
    assert_eq!(path[0], a_addr);
    assert_eq!(path[1], b.addr);
    assert!(e.to_string().contains(" -> "), "{e}");
}

#[test]
fn a_refusal_naming_no_primary_is_waited_out_then_named() {
    let electing = node("electing", |_| {
        Act::Refuse("read-only: no leader elected yet".into())
    });
    let mut c = Cluster::connect(vec![electing.addr.clone()], opts(300)).unwrap();
    let e = c
        .call("queue.put", &[0x90], None, Effect::Changes)
        .unwrap_err();
    let text = e.to_string();
    assert!(matches!(e, ClusterError::NoLeader { .. }), "{text}");
    assert!(
        text.contains(&format!(
            "{} (read-only: no leader elected yet)",
            electing.addr
        )),
        "{text}"
    );
    assert!(
        electing.calls.load(Ordering::SeqCst) > 1,
        "asked again while waiting"
    );
}

#[test]
fn a_lost_reply_resends_a_read_but_never_a_change() {
    // The first node closes on every call; the second answers.
    let closing = node("closing", |_| Act::Close);
    let good = node("good", |_| Act::Ok);
    let addrs = vec![closing.addr.clone(), good.addr.clone()];

    let mut c = Cluster::connect(addrs.clone(), opts(2000)).unwrap();
    assert_eq!(c.addr(), Some(closing.addr.as_str()));
    let e = c
        .call("queue.put", &[0x90], None, Effect::Changes)
        .unwrap_err();
    assert!(matches!(e, ClusterError::LostDuringChange { .. }), "{e}");
    assert!(
        e.to_string().contains("may or may not have been applied"),
        "{e}"
    );
    assert_eq!(closing.calls.load(Ordering::SeqCst), 1);
    assert_eq!(
        good.calls.load(Ordering::SeqCst),
        0,
        "the put was not sent again"
    );

    let mut c = Cluster::connect(addrs, opts(2000)).unwrap();
    let got = c.call("queue.stats", &[0x90], None, Effect::Reads).unwrap();
    assert_eq!(took(got), "good", "the read went to the next address");
}

#[test]
fn a_connection_dead_while_idle_is_replaced_before_sending() {
    let first = node("first", |_| Act::Ok);
    let second = node("second", |_| Act::Ok);
    let mut c =
        Cluster::connect(vec![first.addr.clone(), second.addr.clone()], opts(2000)).unwrap();
    assert_eq!(
        took(c.call("queue.put", &[0x90], None, Effect::Changes).unwrap()),
        "first"
    );
    // The connection dies while idle (shut down here: it then reads as closed). A put sent
    // on it would be lost; it is noticed before sending, so even a change goes through.
    let socket = c.client().unwrap().socket().try_clone().unwrap();
    socket.shutdown(std::net::Shutdown::Both).unwrap();
    let got = c.call("queue.put", &[0x90], None, Effect::Changes);
    assert_eq!(took(got.unwrap_or_else(|e| panic!("{e}"))), "first");
    assert_eq!(first.calls.load(Ordering::SeqCst), 2);
    assert_eq!(second.calls.load(Ordering::SeqCst), 0);
}
