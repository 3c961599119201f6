//! The loop's side of a sharded node's router ([`shards::Router`]): it lends the router the core
//! and the wire for one call ([`Server::with_router`]), then sets the router's timer and runs
//! what the router asked of it ([`Effect`]): closes, session ends, beanstalk reserves woken,
//! live samples. Those lead back into the router, so they run once it is no longer borrowed.

use std::sync::Arc;

use tarq_engine::{SessionId, TubeIx, TubeNumbers};
use tracing::warn;

use super::host::{Role, Wire};
use super::shards::{self, Ctx, Effect, Kept};
use super::timers::Timer;
use super::{Server, ER_UNKNOWN};
use crate::core::{Outcome, Refusal};
use crate::frontend::iproto::NumberText;
use crate::frontend::link::call::decode_command;
use crate::frontend::link::{self, wire::Hello};
use crate::frontend::ReplyTo;

impl Server {
    /// Runs `f` on the router with the parts it acts on; `None` on a node that is no sharded
    /// cluster's. The router's timer is set from what it holds after the call, and what it
    /// asked of the loop is done.
    pub(super) fn with_router<T>(
        &mut self,
        f: impl FnOnce(&mut shards::Router, &mut Ctx<'_>) -> T,
    ) -> Option<T> {
        let router = self.router.as_mut()?;
        let wire = Wire {
            conns: &mut self.conns,
            beanstalk: &mut self.beanstalk,
            routed: &mut self.routed,
            role: Role::of(&self.cluster, &self.cfg, &self.upstream),
        };
        let mut cx = Ctx::new(
            &mut self.core,
            wire,
            (self.now, self.mono),
            &mut self.link_sessions,
            &self.cfg,
            &mut self.link_sockets,
            self.tls.nodes.as_ref(),
            &mut self.next_sid,
        );
        let out = f(router, &mut cx);
        let next = router.next_deadline();
        let effects = std::mem::take(&mut router.effects);
        self.timers.set(Timer::Shards, next);
        for effect in effects {
            self.run_effect(effect);
        }
        Some(out)
    }

    /// Does what the router asked.
    fn run_effect(&mut self, effect: Effect) {
        match effect {
            Effect::Close { idx, gen, reason } => {
                if self.conns.holds(idx, gen) {
                    self.close_quietly(idx, reason);
                }
            }
            Effect::EndSession(sid) => self.end_session(sid),
            Effect::ReserveWoke(caller) => {
                if self.conns.is_live(caller) {
                    self.beanstalk_reserve_woke(caller.slot());
                }
            }
            Effect::LiveSample {
                second,
                tubes,
                partial,
            } => {
                let sample = (tubes.iter())
                    .map(|(n, t)| (n.as_str(), (!partial.contains(n)).then_some(t.stats)));
                self.http.live.sample_whole(second, sample);
                self.send_live_event();
            }
        }
    }

    /// Ends session `sid` now: its connections close (after the replies they are owed) and an
    /// identified session is forgotten; one waiting out its grace is released.
    fn end_session(&mut self, sid: SessionId) {
        let conns: Vec<usize> = (self.conns.iter())
            .filter(|(_, c)| c.sid == sid && !c.is_link())
            .map(|(idx, _)| idx)
            .collect();
        self.iproto.sessions.end(sid);
        if conns.is_empty() {
            self.release_session(sid);
        }
        for idx in conns {
            self.begin_close(idx, "its session's held tasks were lost with a link", true);
        }
    }
}

impl Server {
    /// The election thread answered a read of the placement: what waited for it runs again,
    /// once — a frame through its front-end, a command through the router.
    pub(super) fn shards_placement_read(&mut self) {
        let Some(due) = self.with_router(|r, cx| r.placement_read(cx)) else {
            return;
        };
        for u in due {
            if !self.conns.holds(u.idx, u.gen) {
                continue;
            }
            self.set_again(true);
            match u.what {
                Kept::Frame(frame) => {
                    self.execute_iproto_frame(u.idx, &frame, &mut NumberText::default());
                    self.resume_input(u.idx);
                }
                // Its put was charged to the user's rate when it first came.
                Kept::Command { reply, cmd } => match decode_command(&cmd) {
                    Ok(cmd) => {
                        self.with_router(|r, cx| r.dispatch(cx, u.idx, reply, cmd));
                    }
                    Err(e) => self.held_undecodable(u.idx, reply, e),
                },
                Kept::Forwarded {
                    sid,
                    reply,
                    cmd,
                    may_relay,
                } => match decode_command(&cmd) {
                    Ok(cmd) => {
                        self.with_router(|r, cx| {
                            r.dispatch_forwarded(cx, u.idx, sid, reply, cmd, may_relay)
                        });
                    }
                    Err(e) => self.held_undecodable(u.idx, reply, e),
                },
            }
            self.set_again(false);
        }
    }

    /// Link `idx` from node `origin` closed: what its node said of its waiting takes no longer
    /// counts, the copies it was sending are released, and when it was that node's last link,
    /// the sessions it carried are forgotten, their tasks released after a grace.
    pub(super) fn link_conn_closed(&mut self, idx: usize, origin: &str) {
        let sessions = self.link_sessions.closed(origin);
        // Links are opened to a sharded node only (`start_link`).
        self.with_router(|r, cx| {
            r.waiting_link_closed(idx);
            r.link_closed(cx, origin);
            if !sessions.is_empty() {
                r.orphan_link_sessions(cx, sessions);
            }
        });
    }

    /// Connection `idx` asked to become a link (`tarq.link`): the router decides; a node that
    /// is no sharded cluster's refuses.
    pub(super) fn start_link(&mut self, idx: usize, sync: u64, hello: &Hello<'_>) {
        if self
            .with_router(|r, cx| r.start_link(cx, idx, sync, hello))
            .is_none()
        {
            let why = "this tarq is no sharded cluster's node (--replica-set)";
            tarq_iproto::response::error(self.conns.out(idx), sync, ER_UNKNOWN, why);
            warn!(origin = hello.origin, why, "a link was refused");
        }
    }

    /// Applies what a link's request frame asks (`link::Request`): a forwarded call run for
    /// its session, a session's end, an unwatch, the link node's waiting takes, a move's step.
    pub(super) fn link_request(&mut self, idx: usize, frame: &[u8]) {
        let Some(origin) = self.conns[idx].link_mut().map(|l| Arc::clone(&l.origin)) else {
            return;
        };
        let answer_ok = |s: &mut Server, reply| s.deliver(idx, ReplyTo::Link(reply), &Outcome::Ok);
        match link::Request::from_frame(frame, &origin) {
            link::Request::Refuse {
                sync,
                code,
                message,
            } => tarq_iproto::response::error(self.conns.out(idx), sync, code, &message),
            link::Request::Ping { sync } => {
                tarq_iproto::response::ok_empty(self.conns.out(idx), sync)
            }
            link::Request::Run {
                reply,
                origin,
                session,
                call,
                may_relay,
            } => {
                // A pause travels as the time it has left: from now on, on this node's clock.
                let cmd = call.command(self.mono);
                // A link is opened to a sharded node only (`start_link`).
                let reply = ReplyTo::Link(reply);
                self.with_router(|r, cx| {
                    let sid = cx.link_session(&origin, session);
                    r.dispatch_forwarded(cx, idx, sid, reply, cmd, may_relay)
                });
            }
            link::Request::End {
                reply,
                origin,
                session,
            } => {
                if let Some(sid) = self.link_sessions.get(&origin, session) {
                    self.release_session(sid);
                    self.link_sessions.forget(sid);
                }
                answer_ok(self, reply);
            }
            link::Request::Unwatch { reply, sync } => {
                let watch = ReplyTo::Link(link::Reply { sync });
                self.core.unwatch_reply(idx, watch);
                answer_ok(self, reply);
            }
            link::Request::Waiting { reply, tube, count } => {
                if let Some(r) = self.router.as_mut() {
                    r.heard_waiting(idx, &origin, tube, count);
                }
                answer_ok(self, reply);
            }
            link::Request::Move { reply, step } => {
                let reply = ReplyTo::Link(reply);
                if self
                    .with_router(|r, cx| r.move_step(cx, idx, reply, step))
                    .is_none()
                {
                    let why = "this tarq is no sharded cluster's node".to_owned();
                    self.deliver(idx, reply, &Outcome::Error(Refusal::Shards(why)));
                }
            }
        }
    }

    fn set_again(&mut self, again: bool) {
        if let Some(r) = self.router.as_mut() {
            r.set_again(again);
        }
    }

    #[cold]
    fn held_undecodable(&mut self, idx: usize, reply: ReplyTo, e: impl std::fmt::Display) {
        let why = format!("a held command that does not decode: {e}");
        self.deliver(idx, reply, &Outcome::Error(Refusal::Shards(why)));
    }

    /// The tube named `name`: the engine's, else (sharded) the routes'. Every call of the
    /// tube API asks it: one node's path stays a lookup, inlined into the caller.
    #[inline]
    pub(crate) fn tube_named(&self, name: &str) -> Option<(TubeIx, TubeNumbers)> {
        let q = self.core.queue();
        if let Some(r) = &self.router {
            return r.tube_routed(q, name);
        }
        q.tube_ix(name).map(|ix| (ix, q.tube_numbers(ix)))
    }
}
