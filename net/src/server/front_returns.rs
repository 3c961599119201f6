//! The front-ends return what should happen and the loop does it: a request read is the
//! core's command (or a change of hands) handed back, not run by the front-end. Each test
//! reads a request through its front-end alone, checks that nothing ran, then has the loop
//! apply what came back.

use tarq_engine::DEFAULT_TUBE;
use tarq_iproto::{client, split_frame};

use super::conn::Protocol;
use super::tests::{connect, server};
use crate::core::Command;
use crate::frontend::beanstalk::{Beanstalk, BsConn, Reply as BsReply, Room};
use crate::frontend::iproto::{Iproto, NumberText};
use crate::frontend::link::wire::{self, Hello};
use crate::frontend::{ReplyTo, Then};

/// The frame `write` makes, without its length prefix (as the loop hands it on).
fn frame(write: impl FnOnce(&mut Vec<u8>)) -> Vec<u8> {
    let mut buf = Vec::new();
    write(&mut buf);
    let f = split_frame(&buf, usize::MAX).unwrap().unwrap();
    buf[f.prefix..f.total()].to_vec()
}

#[test]
fn an_iproto_put_comes_back_as_the_cores_command_and_runs_when_the_loop_applies_it() {
    let (mut s, _dir) = server();
    let (idx, _client) = connect(&mut s);
    s.read_clocks();
    let put = frame(|o| client::call(o, 9, "queue.put", &[0x91, 0xa2, b'h', b'i']));
    let greeting = s.conns[idx].out.out.len();
    let mut key = NumberText::default();
    let then = Iproto::new(&mut s).execute(idx, &put, &mut key);
    let Then::Run(ReplyTo::Iproto(reply), Command::Put { data, .. }) = then else {
        panic!("a put is the core's to run: {then:?}");
    };
    assert_eq!((reply.sync, data), (9, &[0xa2, b'h', b'i'][..]));
    assert_eq!(s.core.queue().len(), 0, "the front-end ran nothing");
    assert_eq!(s.conns[idx].out.out.len(), greeting, "nor answered");
    s.apply(idx, then);
    assert_eq!(s.core.queue().len(), 1, "the loop ran it");
    assert!(
        s.conns[idx].out.out.len() > greeting,
        "and the front-end's encoder answered"
    );
}

#[test]
fn a_ping_is_answered_by_the_front_end_with_nothing_for_the_loop() {
    let (mut s, _dir) = server();
    let (idx, _client) = connect(&mut s);
    let ping = frame(|o| client::ping(o, 3));
    let greeting = s.conns[idx].out.out.len();
    let mut key = NumberText::default();
    let then = Iproto::new(&mut s).execute(idx, &ping, &mut key);
    assert!(matches!(then, Then::Done), "{then:?}");
    assert!(s.conns[idx].out.out.len() > greeting, "answered");
}

#[test]
fn join_and_a_link_call_hand_the_connection_to_the_loop() {
    let (mut s, _dir) = server();
    let (idx, _client) = connect(&mut s);
    let join = frame(|o| tarq_iproto::replication::join(o, 4, 1));
    let (mut key, mut key2) = (NumberText::default(), NumberText::default());
    let then = Iproto::new(&mut s).execute(idx, &join, &mut key);
    assert!(
        matches!(
            then,
            Then::Relay {
                sync: 4,
                format: Some(1),
                subscribe: None
            }
        ),
        "{then:?}"
    );
    let hello = Hello {
        origin: "b1",
        version: wire::LINK_VERSION,
        cluster: "c",
        proof: b"p",
    };
    let mut args = Vec::new();
    wire::write_link_args(&mut args, &hello);
    let link = frame(|o| client::call(o, 5, wire::LINK, &args));
    let then = Iproto::new(&mut s).execute(idx, &link, &mut key2);
    let Then::Link {
        sync: 5,
        hello: got,
    } = &then
    else {
        panic!("a link call is the loop's: {then:?}");
    };
    assert_eq!((got.origin, got.version), ("b1", wire::LINK_VERSION));
    // Applied on a single node, the link is refused and the connection stays IPROTO's.
    s.apply(idx, then);
    assert!(matches!(s.conns[idx].proto, Protocol::Iproto { .. }));
}

#[test]
fn a_beanstalk_put_comes_back_as_the_cores_command_and_quit_as_a_close() {
    let (mut s, _dir) = server();
    let (idx, _client) = connect(&mut s);
    s.read_clocks();
    // The connection speaks beanstalk from here (as one accepted on its port would).
    s.conns[idx].proto = Protocol::Beanstalk(Box::new(BsConn::new(1 << 16)));
    s.beanstalk.connections += 1;
    let greeting = s.conns[idx].out.out.len();
    let mut room = Room::default();
    let input = b"put 5 0 60 2\r\nhi\r\nquit\r\n";
    let step = Beanstalk::new(&mut s).next(idx, input, &mut room).unwrap();
    assert!(step.command);
    let Then::Run(ReplyTo::Beanstalk(BsReply::Put), Command::PutIn { tube, data, .. }) = step.then
    else {
        panic!("a put is the core's to run: {:?}", step.then);
    };
    assert_eq!(tube, DEFAULT_TUBE);
    assert_eq!(
        data,
        &[0xa2, b'h', b'i'][..],
        "the body as one MessagePack string"
    );
    assert_eq!(s.core.queue().len(), 0, "the front-end ran nothing");
    let used = step.used;
    s.apply(idx, step.then);
    Beanstalk::new(&mut s).ran(idx);
    assert_eq!(s.core.queue().len(), 1, "the loop ran it");
    assert!(s.conns[idx].out.out[greeting..].starts_with(b"INSERTED "));
    let step = Beanstalk::new(&mut s)
        .next(idx, &input[used..], &mut room)
        .unwrap();
    assert!(matches!(step.then, Then::Close("quit")), "{:?}", step.then);
}

#[test]
fn an_http_request_asking_to_close_and_a_bad_one_come_back_as_closes() {
    use crate::frontend::http::{Http, HttpConn};
    let (mut s, _dir) = server();
    let (idx, _client) = connect(&mut s);
    s.read_clocks();
    // The connection speaks HTTP from here (as one accepted on its port would).
    s.conns[idx].proto = Protocol::Http(Box::<HttpConn>::default());
    s.http.state.connections += 1;
    let asks = b"GET /api/server HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n";
    let (used, then) = Http::new(&mut s).execute_input(idx, asks);
    assert_eq!(used, asks.len());
    assert!(matches!(then, Then::Close(_)), "{then:?}");
    assert!(
        s.conns[idx].closing.is_none(),
        "the loop closes, not the front-end"
    );
    let (_, then) = Http::new(&mut s).execute_input(idx, b"NOT HTTP\x00\r\n\r\n");
    assert!(matches!(then, Then::Close("bad HTTP request")), "{then:?}");
    s.apply(idx, then);
    assert!(s.conns[idx].closing.is_some(), "closed once applied");
}
