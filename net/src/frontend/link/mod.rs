//! The owner's side of a sharded cluster's links: another node forwards the calls of its
//! clients for partitions this node's replica set owns. A link is an IPROTO connection that
//! called [`wire::LINK`]; from then on each frame is an [`wire::Ask`]: a core [`Command`] run
//! for one of the forwarding node's sessions, or the end of such a session. Each remote
//! session gets a session of this node's own ([`LinkConn`]), so a forwarded take is held by
//! that session as a local one by its connection: an ack through the same node finds it, and
//! the session's end (or the link's) puts its tasks back to ready. Outcomes go back as
//! [`wire::Answer`]s. Nothing here knows how the forwarding node chose this owner.
//!
//! A remote session is named by its origin — the node whose client it is — and that node's
//! number for it ([`LinkSessions`]), not by the link it came on: a call relayed by a node
//! that no longer owns a partition, or a task taken before its partition moved here, belongs
//! to the same session as the origin's own calls on its own link.

pub mod call;
#[cfg(test)]
mod golden;
pub mod wire;

use std::collections::HashMap;
use std::sync::Arc;

use tarq_engine::SessionId;

use crate::core::Outcome;
use call::Call;
use wire::Ask;

/// How to answer a forwarded command: the request's sync.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Reply {
    pub sync: u64,
}

/// A link's own state: the node at its other end.
#[derive(Debug)]
pub struct LinkConn {
    pub origin: Arc<str>,
}

/// Other nodes' clients' sessions run here, each as a session of this node: by origin node
/// and the origin's number for it, and back.
#[derive(Debug, Default)]
pub struct LinkSessions {
    /// This node's own name: a call relayed back here for one of its own clients runs as
    /// that client's session.
    pub me: Option<Arc<str>>,
    /// By origin, then the origin's number: looked up by the name without a key to build.
    by_remote: HashMap<Arc<str>, HashMap<u64, SessionId>>,
    by_local: HashMap<SessionId, (Arc<str>, u64)>,
    /// Links open from each origin: its sessions end when its last link closes.
    links: HashMap<Arc<str>, usize>,
}

impl LinkSessions {
    /// The sessions of a node named `me` (`None`: no cluster).
    pub fn new(me: Option<Arc<str>>) -> LinkSessions {
        LinkSessions {
            me,
            ..Default::default()
        }
    }

    /// This node's session for `origin`'s session `remote`, if it has one.
    pub fn get(&self, origin: &str, remote: u64) -> Option<SessionId> {
        self.by_remote.get(origin)?.get(&remote).copied()
    }

    /// Runs `origin`'s session `remote` as this node's session `sid` from now on.
    pub fn insert(&mut self, origin: &Arc<str>, remote: u64, sid: SessionId) {
        (self.by_remote.entry(Arc::clone(origin)).or_default()).insert(remote, sid);
        self.by_local.insert(sid, (Arc::clone(origin), remote));
    }

    /// Forgets session `sid` (its end was handled: it named its origin's session while
    /// that was told on to the sets it reached).
    pub fn forget(&mut self, sid: SessionId) {
        let Some((origin, remote)) = self.by_local.remove(&sid) else {
            return;
        };
        if let Some(sessions) = self.by_remote.get_mut(&origin) {
            sessions.remove(&remote);
            if sessions.is_empty() {
                self.by_remote.remove(&origin);
            }
        }
    }

    /// The origin and remote number of this node's session `sid`, if it runs one of another
    /// node's.
    pub fn remote_of(&self, sid: SessionId) -> Option<(&Arc<str>, u64)> {
        self.by_local.get(&sid).map(|(o, r)| (o, *r))
    }

    /// A link from `origin` opened.
    pub fn opened(&mut self, origin: &Arc<str>) {
        *self.links.entry(Arc::clone(origin)).or_default() += 1;
    }

    /// A link from `origin` closed: when it was the last, every session of `origin` ends
    /// (returned, for their tasks to go back to ready, and then forgotten).
    pub fn closed(&mut self, origin: &str) -> Vec<SessionId> {
        let Some(n) = self.links.get_mut(origin) else {
            return Vec::new();
        };
        *n -= 1;
        if *n > 0 {
            return Vec::new();
        }
        self.links.remove(origin);
        (self.by_remote.get(origin))
            .map(|sessions| sessions.values().copied().collect())
            .unwrap_or_default()
    }
}

/// Encodes `outcome` as the answer to a link's request.
#[inline(never)]
pub fn encode(out: &mut Vec<u8>, r: Reply, outcome: &Outcome<'_>) {
    wire::write_answer(out, r.sync, outcome);
}

/// What a link's request asks of this node, decided from its frame alone (the mini-redis
/// way: a frame becomes a request, the loop applies it). The front-end holds no state and
/// calls nothing: the sessions, the core and the router are the loop's.
#[derive(Debug)]
pub enum Request<'f> {
    /// A frame that does not decode, or a call other than `tarq.ask`: answered with the
    /// error.
    Refuse {
        sync: u64,
        code: u32,
        message: String,
    },
    /// A PING (the link's silence check): answered at once.
    Ping { sync: u64 },
    /// Run `call` for session `session` of node `origin`; `may_relay`: this node may relay it
    /// on (a call relayed once already names its origin and is not relayed again).
    Run {
        reply: Reply,
        origin: Arc<str>,
        session: u64,
        call: Call<'f>,
        may_relay: bool,
    },
    /// Session `session` of node `origin` ended: its tasks go back.
    End {
        reply: Reply,
        origin: Arc<str>,
        session: u64,
    },
    /// The forwarding node no longer waits on the watch it sent as `sync`.
    Unwatch { reply: Reply, sync: u64 },
    /// The link's node has `count` takes waiting on tube `tube`.
    Waiting {
        reply: Reply,
        tube: tarq_engine::TubeIx,
        count: u64,
    },
    /// A step of a partition's move (or a question about moves): the router's.
    Move { reply: Reply, step: Ask<'f> },
}

impl Request<'_> {
    /// How a request of `link_origin`'s link reads from `frame`.
    pub fn from_frame<'f>(frame: &'f [u8], link_origin: &Arc<str>) -> Request<'f> {
        use tarq_iproto::request::{self, RequestKind};
        let req = match request::decode(frame) {
            Ok(r) => r,
            Err(e) => {
                return Request::Refuse {
                    sync: e.sync,
                    code: e.code,
                    message: e.message,
                }
            }
        };
        let reply = Reply { sync: req.sync };
        let ask = match req.kind {
            RequestKind::Call { function, args, .. } if function == wire::ASK => {
                wire::read_ask(args)
            }
            RequestKind::Ping => return Request::Ping { sync: req.sync },
            _ => Err("a link carries only tarq.ask calls".to_owned()),
        };
        let origin_or_link = |o: Option<&str>| o.map_or_else(|| Arc::clone(link_origin), Arc::from);
        match ask {
            Ok(Ask::Run {
                session,
                origin,
                call,
            }) => Request::Run {
                reply,
                // A call naming another origin was relayed once already.
                may_relay: origin.is_none(),
                origin: origin_or_link(origin),
                session,
                call,
            },
            Ok(Ask::End { session, origin }) => Request::End {
                reply,
                origin: origin_or_link(origin),
                session,
            },
            Ok(Ask::Unwatch { sync }) => Request::Unwatch { reply, sync },
            Ok(Ask::Waiting { tube, count }) => Request::Waiting { reply, tube, count },
            Ok(
                step @ (Ask::MoveIn { .. }
                | Ask::MoveTasks { .. }
                | Ask::MoveDone { .. }
                | Ask::Moves
                | Ask::DropOff { .. }),
            ) => Request::Move { reply, step },
            Err(message) => Request::Refuse {
                sync: req.sync,
                code: tarq_iproto::codes::ER_ILLEGAL_PARAMS,
                message,
            },
        }
    }
}

/// This node's session for session `session` of node `origin`: one of this node's own
/// clients when a call was relayed back here, else the one `sessions` keeps, made with
/// `new_session` the first time.
pub fn session_of(
    sessions: &mut LinkSessions,
    origin: &Arc<str>,
    session: u64,
    new_session: impl FnOnce() -> SessionId,
) -> SessionId {
    if sessions.me.as_ref().is_some_and(|me| me == origin) {
        return session;
    }
    if let Some(sid) = sessions.get(origin, session) {
        return sid;
    }
    let sid = new_session();
    sessions.insert(origin, session, sid);
    sid
}

#[cfg(test)]
mod tests {
    use super::*;

    fn link() -> Arc<str> {
        Arc::from("b1")
    }

    /// A request's frame without its size prefix.
    fn body(out: &[u8]) -> &[u8] {
        let f = tarq_iproto::split_frame(out, usize::MAX).unwrap().unwrap();
        &out[f.prefix..f.total()]
    }

    #[test]
    fn a_ping_is_answered_and_anything_but_an_ask_refused() {
        let mut out = Vec::new();
        tarq_iproto::client::ping(&mut out, 9);
        assert!(matches!(
            Request::from_frame(body(&out), &link()),
            Request::Ping { sync: 9 }
        ));
        out.clear();
        tarq_iproto::client::call(&mut out, 10, "box.info", &[0x90]);
        match Request::from_frame(body(&out), &link()) {
            Request::Refuse { sync, message, .. } => {
                assert_eq!(sync, 10);
                assert!(message.contains("only tarq.ask"), "{message}");
            }
            other => panic!("{other:?}"),
        }
        match Request::from_frame(&[0x81, 0xc1], &link()) {
            Request::Refuse { .. } => {}
            other => panic!("a frame that does not decode: {other:?}"),
        }
    }

    #[test]
    fn an_end_names_the_links_node_unless_it_was_relayed() {
        let ask = |a: &Ask<'_>| {
            let mut out = Vec::new();
            wire::write_ask(&mut out, 20, a);
            out
        };
        let own = ask(&Ask::End {
            session: 4,
            origin: None,
        });
        match Request::from_frame(body(&own), &link()) {
            Request::End {
                reply,
                origin,
                session,
            } => assert_eq!((reply.sync, &*origin, session), (20, "b1", 4)),
            other => panic!("{other:?}"),
        }
        let relayed = ask(&Ask::End {
            session: 4,
            origin: Some("c2"),
        });
        match Request::from_frame(body(&relayed), &link()) {
            Request::End { origin, .. } => assert_eq!(&*origin, "c2"),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_session_is_made_once_and_a_relayed_own_session_is_its_own() {
        let mut s = LinkSessions::new(Some(Arc::from("a1")));
        let b1: Arc<str> = Arc::from("b1");
        let mut next = 100;
        let mut make = || {
            next += 1;
            next
        };
        let first = session_of(&mut s, &b1, 7, &mut make);
        assert_eq!(first, 101);
        assert_eq!(session_of(&mut s, &b1, 7, &mut make), 101, "kept");
        assert_eq!(session_of(&mut s, &b1, 8, &mut make), 102);
        assert_eq!(
            session_of(&mut s, &Arc::from("a1"), 55, &mut make),
            55,
            "own"
        );
    }
}
