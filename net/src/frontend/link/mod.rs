//! The owner's side of a sharded cluster's links: another node forwards the calls of its
//! clients for partitions this node's replica set owns. A link is an IPROTO connection that
//! called [`wire::LINK`]; from then on each frame is an [`wire::Ask`]: a core [`Command`] run
//! for one of the forwarding node's sessions, or the end of such a session. Each remote
//! session gets a session of this node's own ([`LinkConn`]), so a forwarded take is held by
//! that session as a local one by its connection: an ack through the same node finds it, and
//! the session's end (or the link's) puts its tasks back to ready. Outcomes go back as
//! [`wire::Answer`]s. Nothing here knows how the forwarding node chose this owner.

pub mod wire;

use std::collections::HashMap;

use tarq_engine::SessionId;

use super::{Loop, ReplyTo};
use crate::core::{Command, Outcome, Pause};
use wire::Ask;

/// How to answer a forwarded command: the request's sync.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Reply {
    pub sync: u64,
}

/// A link's own state: this node's session for each of the forwarding node's sessions.
#[derive(Debug, Default)]
pub struct LinkConn {
    sessions: HashMap<u64, SessionId>,
}

impl LinkConn {
    /// Every session of this node the link's remote sessions hold (the link closed).
    pub fn sessions(&self) -> impl Iterator<Item = SessionId> + '_ {
        self.sessions.values().copied()
    }
}

/// Encodes `outcome` as the answer to a link's request.
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
        match ask {
            Ok(Ask::Run { session, command }) => self.run(idx, reply, session, command),
            Ok(Ask::End { session }) => {
                if let Some(sid) = self
                    .l
                    .link_conn(idx)
                    .and_then(|l| l.sessions.remove(&session))
                {
                    self.l.release_session(sid);
                }
                self.l.deliver(idx, ReplyTo::Link(reply), &Outcome::Ok);
            }
            Err(e) => {
                let code = tarq_iproto::codes::ER_ILLEGAL_PARAMS;
                tarq_iproto::response::error(self.l.reply_buf(idx), req.sync, code, &e);
            }
        }
    }

    fn run(&mut self, idx: usize, reply: Reply, session: u64, command: Command<'_>) {
        // A pause travels as the time it has left: from now on, on this node's clock.
        let command = match command {
            Command::Pause { tube, pause } => Command::Pause {
                tube,
                pause: Pause {
                    until: self.l.mono().saturating_add(pause.until),
                    ..pause
                },
            },
            other => other,
        };
        let known = self
            .l
            .link_conn(idx)
            .and_then(|l| l.sessions.get(&session).copied());
        let sid = match known {
            Some(sid) => sid,
            None => {
                let sid = self.l.new_session();
                if let Some(l) = self.l.link_conn(idx) {
                    l.sessions.insert(session, sid);
                }
                sid
            }
        };
        self.l.dispatch_as(idx, sid, ReplyTo::Link(reply), command);
    }
}
