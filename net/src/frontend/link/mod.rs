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

use super::{Loop, ReplyTo};
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

/// The link front-end at work for the loop `L`.
pub struct Link<'a, L: Loop> {
    l: &'a mut L,
}

impl<'a, L: Loop> Link<'a, L> {
    pub fn new(l: &'a mut L) -> Self {
        Link { l }
    }
}

impl<L: Loop> Link<'_, L> {
    /// Executes one request frame of link `idx`.
    pub fn execute(&mut self, idx: usize, frame: &[u8]) {
        use tarq_iproto::request::{self, RequestKind};
        let req = match request::decode(frame) {
            Ok(r) => r,
            Err(e) => {
                tarq_iproto::response::error(self.l.reply_buf(idx), e.sync, e.code, &e.message);
                return;
            }
        };
        let reply = Reply { sync: req.sync };
        let ask = match req.kind {
            RequestKind::Call { function, args, .. } if function == wire::ASK => {
                wire::read_ask(args)
            }
            RequestKind::Ping => {
                tarq_iproto::response::ok_empty(self.l.reply_buf(idx), req.sync);
                return;
            }
            _ => Err("a link carries only tarq.ask calls".to_owned()),
        };
        let Some(link_origin) = self.l.link_conn(idx).map(|l| Arc::clone(&l.origin)) else {
            return;
        };
        match ask {
            Ok(Ask::Run {
                session,
                origin,
                call,
            }) => {
                // A call naming another origin was relayed once already.
                let may_relay = origin.is_none();
                let origin = origin.map_or(link_origin, Arc::from);
                self.run(idx, reply, &origin, session, call, may_relay)
            }
            Ok(Ask::End { session, origin }) => {
                let origin = origin.map_or(link_origin, Arc::from);
                if let Some(sid) = self.l.link_sessions().get(&origin, session) {
                    self.l.release_session(sid);
                    self.l.link_sessions().forget(sid);
                }
                self.l.deliver(idx, ReplyTo::Link(reply), &Outcome::Ok);
            }
            Ok(Ask::Unwatch { sync }) => {
                self.l.unwatch_link(idx, sync);
                self.l.deliver(idx, ReplyTo::Link(reply), &Outcome::Ok);
            }
            Ok(Ask::Waiting { tube, count }) => {
                self.l.heard_waiting(idx, &link_origin, tube, count);
                self.l.deliver(idx, ReplyTo::Link(reply), &Outcome::Ok);
            }
            Ok(
                step @ (Ask::MoveIn { .. }
                | Ask::MoveTasks { .. }
                | Ask::MoveDone { .. }
                | Ask::Moves
                | Ask::DropOff { .. }),
            ) => self.l.move_step(idx, ReplyTo::Link(reply), step),
            Err(e) => {
                let code = tarq_iproto::codes::ER_ILLEGAL_PARAMS;
                tarq_iproto::response::error(self.l.reply_buf(idx), req.sync, code, &e);
            }
        }
    }

    fn run(
        &mut self,
        idx: usize,
        reply: Reply,
        origin: &Arc<str>,
        session: u64,
        call: Call<'_>,
        may_relay: bool,
    ) {
        // A pause travels as the time it has left: from now on, on this node's clock.
        let command = call.command(self.l.mono());
        let sessions = self.l.link_sessions();
        let own = sessions.me.as_ref().is_some_and(|me| me == origin);
        let sid = match sessions.get(origin, session) {
            // One of this node's own clients, whose call another node relayed back.
            _ if own => session,
            Some(sid) => sid,
            None => {
                let sid = self.l.new_session();
                self.l.link_sessions().insert(origin, session, sid);
                sid
            }
        };
        self.l
            .dispatch_as(idx, sid, ReplyTo::Link(reply), command, may_relay);
    }
}
