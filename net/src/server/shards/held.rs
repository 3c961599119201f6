//! Commands that wait: those for a partition frozen while it moves away (run where it is once
//! the move ends) or held for its tube's drop (`drop_hold.rs`), and those that arrive between this node's read of a new placement and its
//! applying it (run once it is applied, so they never act on a route the placement no longer
//! has). Each is kept encoded as it came (`rmp-serde`, the links' encoding), with the
//! partition it was routed to.

use super::ctx::Ctx;
use super::*;

/// A command held while its partition is frozen, encoded as it came.
pub(super) struct Held {
    idx: usize,
    gen: u32,
    sid: SessionId,
    reply: ReplyTo,
    /// Forwarded by another node (run as a link's session), not this node's client's.
    link: bool,
    /// The partition it was routed to (its tube rewritten to it), or `None`: a whole-tube
    /// command, routed again.
    ix: Option<TubeIx>,
    cmd: Vec<u8>,
}

impl Router {
    /// Holds `cmd` of a client (`link`: a forwarded one, run as session `sid`; `ix`: the
    /// partition it was routed to) until the move of its partition ends.
    pub(super) fn hold_for_move(
        &mut self,
        cx: &mut Ctx<'_>,
        idx: usize,
        sid: SessionId,
        reply: ReplyTo,
        (link, ix): (bool, Option<TubeIx>),
        cmd: &Command<'_>,
    ) {
        self.hold_command(cx, false, (idx, sid, reply), (link, ix), cmd);
    }

    /// Holds `cmd` until this node applies the placement it has read already (its view is
    /// newer than its routes: the routes may name an old owner); see [`hold_for_move`].
    ///
    /// [`hold_for_move`]: Self::hold_for_move
    pub(super) fn hold_for_map(
        &mut self,
        cx: &mut Ctx<'_>,
        idx: usize,
        sid: SessionId,
        reply: ReplyTo,
        (link, ix): (bool, Option<TubeIx>),
        cmd: &Command<'_>,
    ) {
        self.hold_command(cx, true, (idx, sid, reply), (link, ix), cmd);
    }

    fn hold_command(
        &mut self,
        cx: &mut Ctx<'_>,
        for_map: bool,
        (idx, sid, reply): (usize, SessionId, ReplyTo),
        (link, ix): (bool, Option<TubeIx>),
        cmd: &Command<'_>,
    ) {
        let gen = cx.wire.conns[idx].gen;
        let mono = cx.mono;
        if for_map {
            // Looked at again soon: the view may go stale instead (etcd unreachable).
            self.recheck_by(mono.saturating_add(RECHECK));
        }
        let held = self.awaiting_map.len()
            + self.drop_holds.held.len()
            + self.moving.as_ref().map_or(0, |m| m.held_len());
        let what = "calls waiting for a move, a drop or a placement";
        if let Some(why) = self.over_bound(held, what) {
            let outcome = Outcome::Error(Refusal::Shards(why));
            return cx.deliver(idx, reply, &outcome);
        }
        let for_drop = !for_map && self.holds_for_drop(ix.or_else(|| named_partition(cmd)));
        let list = match (for_map, for_drop, self.moving.as_mut()) {
            (true, _, _) => &mut self.awaiting_map,
            (false, true, _) => &mut self.drop_holds.held,
            (false, false, Some(m)) => &mut m.held,
            (false, false, None) => {
                // Frozen with no move nor drop in flight here: nothing would ever release it.
                let why = "the partition is held with no move or drop in flight here: not \
                           done, try again"
                    .to_owned();
                return cx.deliver(idx, reply, &Outcome::Error(Refusal::Shards(why)));
            }
        };
        match crate::frontend::link::call::encode_command(cmd) {
            Ok(cmd) => list.push(Held {
                idx,
                gen,
                sid,
                reply,
                link,
                ix,
                cmd,
            }),
            Err(e) => {
                let why = format!("a command that cannot wait: {e}");
                let outcome = Outcome::Error(Refusal::Shards(why));
                cx.deliver(idx, reply, &outcome);
            }
        }
    }

    /// The placement read is applied: the commands that waited for it run.
    pub(super) fn release_awaiting_map(&mut self, cx: &mut Ctx<'_>) {
        for h in std::mem::take(&mut self.awaiting_map) {
            self.release_held(cx, h);
        }
    }

    /// Runs a held command now that the move ended or the map is applied (here, or on to
    /// the partition's owner).
    pub(super) fn release_held(&mut self, cx: &mut Ctx<'_>, h: Held) {
        if cx.wire.conns.get(h.idx).is_none_or(|c| c.gen != h.gen) {
            return;
        }
        let cmd = match crate::frontend::link::call::decode_command(&h.cmd) {
            Ok(c) => c,
            Err(e) => {
                let why = format!("a held command that does not decode: {e}");
                return cx.deliver(h.idx, h.reply, &Outcome::Error(Refusal::Shards(why)));
            }
        };
        let client = Client {
            idx: h.idx,
            gen: h.gen,
            sid: h.sid,
            reply: h.reply,
        };
        match (h.link, h.ix) {
            (true, _) => self.dispatch_forwarded(cx, h.idx, h.sid, h.reply, cmd, true),
            // Routed to its partition already: run there (here, or at its new owner).
            (false, Some(ix)) => {
                let leads = cx.leads();
                if let Some(cmd) = self.run_on_partition(cx, client, ix, cmd, Then::Deliver, leads)
                {
                    let caller = Caller::new(h.idx, h.gen, h.sid);
                    self.execute_as(cx, caller, h.reply, cmd);
                }
            }
            (false, None) => self.dispatch(cx, h.idx, h.reply, cmd),
        }
    }
}
