//! Commands that wait: those for a partition frozen while it moves away (run where it is once
//! the move ends) or held for its tube's drop (`drop_hold.rs`), and those that arrive between this node's read of a new placement and its
//! applying it (run once it is applied, so they never act on a route the placement no longer
//! has). Each is kept encoded as it came (`rmp-serde`, the links' encoding), with the
//! partition it was routed to.

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

impl Server {
    /// Holds `cmd` of a client (`link`: a forwarded one, run as session `sid`; `ix`: the
    /// partition it was routed to) until the move of its partition ends.
    pub(super) fn hold_for_move(
        &mut self,
        idx: usize,
        sid: SessionId,
        reply: ReplyTo,
        (link, ix): (bool, Option<TubeIx>),
        cmd: &Command<'_>,
    ) {
        self.hold_command(false, idx, sid, reply, (link, ix), cmd);
    }

    /// Holds `cmd` until this node applies the placement it has read already (its view is
    /// newer than its routes: the routes may name an old owner); see [`hold_for_move`].
    ///
    /// [`hold_for_move`]: Self::hold_for_move
    pub(super) fn hold_for_map(
        &mut self,
        idx: usize,
        sid: SessionId,
        reply: ReplyTo,
        (link, ix): (bool, Option<TubeIx>),
        cmd: &Command<'_>,
    ) {
        self.hold_command(true, idx, sid, reply, (link, ix), cmd);
    }

    fn hold_command(
        &mut self,
        for_map: bool,
        idx: usize,
        sid: SessionId,
        reply: ReplyTo,
        (link, ix): (bool, Option<TubeIx>),
        cmd: &Command<'_>,
    ) {
        let gen = self.conns[idx].gen;
        let mono = self.mono;
        let Some(shards) = self.shards.as_mut() else {
            return;
        };
        if for_map {
            // Looked at again soon: the view may go stale instead (etcd unreachable).
            shards.recheck_by(mono.saturating_add(RECHECK));
        }
        let held = shards.awaiting_map.len()
            + shards.drop_holds.held.len()
            + shards.moving.as_ref().map_or(0, |m| m.held_len());
        let what = "calls waiting for a move, a drop or a placement";
        if let Some(why) = shards.over_bound(held, what) {
            let outcome = Outcome::Error(Refusal::Shards(why));
            return self.deliver(idx, reply, &outcome);
        }
        let for_drop = !for_map && shards.holds_for_drop(ix.or_else(|| named_partition(cmd)));
        let list = match (for_map, for_drop, shards.moving.as_mut()) {
            (true, _, _) => &mut shards.awaiting_map,
            (false, true, _) => &mut shards.drop_holds.held,
            (false, false, Some(m)) => &mut m.held,
            (false, false, None) => {
                // Frozen with no move nor drop in flight here: nothing would ever release it.
                let why = "the partition is held with no move or drop in flight here: not \
                           done, try again"
                    .to_owned();
                return self.deliver(idx, reply, &Outcome::Error(Refusal::Shards(why)));
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
                self.deliver(idx, reply, &outcome);
            }
        }
        self.timers_changed();
    }

    /// The placement read is applied: the commands that waited for it run.
    pub(super) fn release_awaiting_map(&mut self) {
        let held = self
            .shards
            .as_mut()
            .map(|s| std::mem::take(&mut s.awaiting_map));
        for h in held.unwrap_or_default() {
            self.release_held(h);
        }
    }

    /// Runs a held command now that the move ended or the map is applied (here, or on to
    /// the partition's owner).
    pub(super) fn release_held(&mut self, h: Held) {
        if self.conns.get(h.idx).is_none_or(|c| c.gen != h.gen) {
            return;
        }
        let cmd = match crate::frontend::link::call::decode_command(&h.cmd) {
            Ok(c) => c,
            Err(e) => {
                let why = format!("a held command that does not decode: {e}");
                return self.deliver(h.idx, h.reply, &Outcome::Error(Refusal::Shards(why)));
            }
        };
        let client = Client {
            idx: h.idx,
            gen: h.gen,
            sid: h.sid,
            reply: h.reply,
        };
        match (h.link, h.ix) {
            (true, _) => self.dispatch_forwarded(h.idx, h.sid, h.reply, cmd, true),
            // Routed to its partition already: run there (here, or at its new owner).
            (false, Some(ix)) => {
                let leads = self.leads();
                if let Some(cmd) = self.run_on_partition(client, ix, cmd, Then::Deliver, leads) {
                    let caller = Caller::new(h.idx, h.gen, h.sid);
                    self.execute_as(caller, h.reply, cmd);
                }
            }
            (false, None) => self.dispatch(h.idx, h.reply, cmd),
        }
    }
}
