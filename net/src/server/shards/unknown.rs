//! A tube this node does not know yet: another node has just placed it in etcd, and this
//! node's poll has not brought the placement in (or, on a replica, its primary's copy of the
//! tube's first partition has not come). Before it says a tube does not exist, a node reads
//! the placement at etcd's current revision (`Cluster::read_placement`), and the call runs
//! again after that read: so a tube exists on every node once `create_tube` has answered, as
//! on one node, and sharded-queue's clients need no pause after creating one.
//!
//! Two ways in. A front-end that cannot resolve a tube's name asks
//! [`Router::hold_for_placement`]: the request's frame is kept (with the rest of the
//! connection's input, which waits behind it so the replies keep their order) and run again
//! once the read is in. A command the router gets for a partition its routes do not have (a
//! replica that holds the tube's first partition from its primary before its own view has the
//! tube) is kept encoded and dispatched again after the read. Each waits for a read that
//! began after it was held; the second run is final (a tube still unknown is unknown). The
//! loop runs them again (`Server::shards_placement_read`): a frame through its front-end.

use super::ctx::Ctx;
use super::*;

/// A request kept until the placement is read: a connection's frame (the front-end could not
/// resolve its tube's name) or a routed command (its partition is not in the routes).
pub(in crate::server) struct Unknown {
    pub idx: usize,
    pub gen: u32,
    /// The read (`Router::reads_asked`) whose answer releases it.
    read: u64,
    pub what: Kept,
}

pub(in crate::server) enum Kept {
    Frame(Vec<u8>),
    Command {
        reply: ReplyTo,
        cmd: Vec<u8>,
    },
    /// Forwarded by another node, for session `sid` of the link.
    Forwarded {
        sid: SessionId,
        reply: ReplyTo,
        cmd: Vec<u8>,
        may_relay: bool,
    },
}

/// The router's reads of the placement asked for calls naming an unknown tube.
#[derive(Default)]
pub(super) struct Reads {
    /// Reads asked of the election thread, and answered (each ask is answered once, in order).
    asked: u64,
    answered: u64,
    pub(super) held: Vec<Unknown>,
    /// The front-end asked to hold the frame being executed now.
    hold_frame: bool,
    /// A held request runs again: a tube still unknown then is unknown.
    again: bool,
}

impl Reads {
    /// Whether connection `idx`'s input waits for a read.
    fn holds_input(&self, idx: usize, gen: u32) -> bool {
        self.held
            .iter()
            .any(|u| u.idx == idx && u.gen == gen && matches!(u.what, Kept::Frame(_)))
    }
}

impl Router {
    /// The tube named `name` on a sharded node (the loop's `tube_named`), `q` the engine's.
    #[inline(never)]
    pub(in crate::server) fn tube_routed(
        &self,
        q: &tarq_engine::Queue,
        name: &str,
    ) -> Option<(TubeIx, tarq_engine::TubeNumbers)> {
        let held = q.tube_ix(name);
        // On a sharded node the name is a tube's this node routes. An engine's tube it does
        // not route is a copy of a tube dropped a moment ago (a replica's primary has not let
        // go of it yet), or one this node's view has not caught up with: the call waits for a
        // read of the placement (the caller holds it when this answers `None`), and is
        // resolved again after it, when the name's routed tube, a new one made since the
        // drop, wins.
        let routed = |ix: TubeIx| self.tubes.contains_key(&ix);
        if let Some(ix) = held.filter(|&ix| routed(ix)) {
            return Some((ix, q.tube_numbers(ix)));
        }
        let placed = (self.placement.tubes.get(name)).and_then(|t| t.partitions.first());
        let again = self.reads.again;
        let first = match (held, placed) {
            (_, Some(first)) if routed(first.index) => first,
            (Some(ix), _) if again => return Some((ix, q.tube_numbers(ix))),
            (_, Some(first)) if again => first,
            _ => return None,
        };
        // A replica shows the tube's tasks numbered as its primary does: from the partition's
        // `first`, as placed.
        let numbers = tarq_engine::TubeNumbers {
            next: first.first,
            first: first.first,
            legacy_below: 0,
        };
        Some((first.index, numbers))
    }

    /// The front-end's [`Loop::hold_for_placement`](crate::frontend::Loop::hold_for_placement).
    pub(crate) fn hold_for_placement(&mut self, _idx: usize) -> bool {
        if self.reads.again {
            return false;
        }
        self.reads.hold_frame = true;
        true
    }

    /// Whether the front-end asked to hold the frame it just ran (the loop then keeps it with
    /// [`hold_frame`](Self::hold_frame) and reads no further on the connection).
    #[inline]
    pub(crate) fn frame_to_hold(&self) -> bool {
        self.reads.hold_frame
    }

    /// Keeps `frame` of connection `idx` until the placement is read (`false`: refused at the
    /// router's bound, and answered so).
    pub(crate) fn hold_frame(&mut self, cx: &mut Ctx<'_>, idx: usize, frame: &[u8]) -> bool {
        let gen = cx.wire.conns[idx].gen;
        self.reads.hold_frame = false;
        let len = self.reads.held.len();
        if let Some(why) = self.over_bound(len, "calls waiting for a read of the placement") {
            let e = tarq_iproto::request::decode(frame).map(|r| r.sync);
            let out = cx.reply_buf(idx);
            tarq_iproto::response::error(out, e.unwrap_or(0), super::super::ER_UNKNOWN, &why);
            return false;
        }
        let read = self.ask_read(cx);
        let what = Kept::Frame(frame.to_vec());
        self.reads.held.push(Unknown {
            idx,
            gen,
            read,
            what,
        });
        true
    }

    /// Whether connection `idx`'s input waits for a read of the placement (it is read again
    /// once the held frame has run).
    #[inline]
    pub(in crate::server) fn input_held(&self, idx: usize, gen: u32) -> bool {
        !self.reads.held.is_empty() && self.reads.holds_input(idx, gen)
    }

    /// A command another node forwarded on link `idx` for a partition this node has not
    /// heard of: kept until the placement is read (`true`), then run as forwarded.
    pub(super) fn hold_unplaced_forwarded(
        &mut self,
        cx: &mut Ctx<'_>,
        idx: usize,
        sid: SessionId,
        reply: ReplyTo,
        cmd: &Command<'_>,
        may_relay: bool,
    ) -> bool {
        let gen = cx.wire.conns[idx].gen;
        let Some(ix) = named_partition(cmd) else {
            return false;
        };
        if self.reads.again || self.part(ix).is_some() {
            return false;
        }
        let len = self.reads.held.len();
        if let Some(why) = self.over_bound(len, "calls waiting for a read of the placement") {
            cx.deliver(idx, reply, &Outcome::Error(Refusal::Shards(why)));
            return true;
        }
        let Ok(cmd) = crate::frontend::link::call::encode_command(cmd) else {
            return false;
        };
        let read = self.ask_read(cx);
        let what = Kept::Forwarded {
            sid,
            reply,
            cmd,
            may_relay,
        };
        self.reads.held.push(Unknown {
            idx,
            gen,
            read,
            what,
        });
        true
    }

    /// In the router: whether `cmd` names a partition its routes lack and should wait for a
    /// read of the placement (it is then kept; `false`: route it as it is).
    pub(super) fn hold_unrouted(
        &mut self,
        cx: &mut Ctx<'_>,
        client: Client,
        cmd: &Command<'_>,
    ) -> bool {
        let Some(ix) = named_partition(cmd) else {
            return false;
        };
        if self.reads.again || self.part(ix).is_some() {
            return false;
        }
        self.keep_for_read(cx, client, cmd)
    }

    /// In the router: whether a whole-tube figure should wait for a read of the placement —
    /// a partition of the tube moved here and this node's view does not have that move yet,
    /// so it lacks the counts the move carried (`carried`) — and is kept for it.
    pub(super) fn hold_figures_for_view(
        &mut self,
        cx: &mut Ctx<'_>,
        client: Client,
        cmd: &Command<'_>,
    ) -> bool {
        if self.adopted.is_empty() || self.reads.again {
            return false;
        }
        let stale = match *cmd {
            Command::TubeStats { tube } | Command::TubeFigures { tube } => (self.tubes)
                .get(&tube)
                .is_some_and(|t| t.parts.iter().any(|p| self.adopted.contains_key(p))),
            Command::AllTubeStats => true,
            _ => false,
        };
        stale && self.keep_for_read(cx, client, cmd)
    }

    /// Keeps `cmd` of `client` until a read of the placement (`false`: it cannot be kept,
    /// and is routed as it is).
    fn keep_for_read(&mut self, cx: &mut Ctx<'_>, client: Client, cmd: &Command<'_>) -> bool {
        let len = self.reads.held.len();
        if let Some(why) = self.over_bound(len, "calls waiting for a read of the placement") {
            self.answer(cx, client, &Outcome::Error(Refusal::Shards(why)));
            return true;
        }
        let cmd = match crate::frontend::link::call::encode_command(cmd) {
            Ok(cmd) => cmd,
            Err(_) => return false,
        };
        let read = self.ask_read(cx);
        let what = Kept::Command {
            reply: client.reply,
            cmd,
        };
        self.reads.held.push(Unknown {
            idx: client.idx,
            gen: client.gen,
            read,
            what,
        });
        true
    }

    /// The read a request held now waits for: the last one asked if its poll cannot have
    /// begun yet (an earlier one is still unanswered, and the election thread takes asks
    /// between polls, in order), else a new one.
    pub(super) fn ask_read(&mut self, cx: &mut Ctx<'_>) -> u64 {
        let r = &mut self.reads;
        if r.asked >= r.answered + 2 {
            return r.asked;
        }
        r.asked += 1;
        if let Some(c) = cx.cluster() {
            c.handle().read_placement();
        }
        r.asked
    }

    /// The election thread answered a read of the placement (after the `MapChanged` it
    /// brought, if any): what waited for it, to run again once (by the loop).
    pub(in crate::server) fn placement_read(&mut self, cx: &mut Ctx<'_>) -> Vec<Unknown> {
        self.reads.answered += 1;
        let answered = self.reads.answered;
        let (due, wait): (Vec<Unknown>, Vec<Unknown>) = std::mem::take(&mut self.reads.held)
            .into_iter()
            .partition(|u| u.read <= answered);
        self.reads.held = wait;
        self.drop_holds_read(cx, answered);
        due
    }

    /// Whether a request held for a read runs again now (a tube still unknown then is
    /// unknown).
    pub(in crate::server) fn set_again(&mut self, again: bool) {
        self.reads.again = again;
        self.reads.hold_frame = false;
    }
}

/// A placed tube as `create_tube` answers it: this node's engine's copy of its first
/// partition, else as the placement has it (a replica before its primary's copy came, or a
/// node whose set does not lead now).
pub(super) struct PlacedTube {
    ix: TubeIx,
    name: String,
    kind: TubeType,
    opts: TubeOptions,
    numbers: tarq_engine::TubeNumbers,
}

impl PlacedTube {
    /// Tube `t` as placed.
    pub(super) fn of(t: &TubePlacement) -> Option<PlacedTube> {
        let first = t.partitions.first()?;
        Some(PlacedTube {
            ix: first.index,
            name: t.name.clone(),
            kind: TubeType::parse(&t.kind).ok()?,
            opts: options_from(&t.options, 0),
            numbers: tarq_engine::TubeNumbers {
                next: first.first,
                first: first.first,
                legacy_below: 0,
            },
        })
    }
}

impl Router {
    /// Tube `name` as this node knows it: held here, or placed.
    pub(super) fn placed_tube(&self, q: &tarq_engine::Queue, name: &str) -> Option<PlacedTube> {
        if let Some(info) = q.tube_ix(name).and_then(|ix| q.tube_info(ix)) {
            return Some(PlacedTube {
                ix: info.ix,
                name: info.name.to_owned(),
                kind: info.kind,
                opts: info.opts,
                numbers: info.numbers,
            });
        }
        PlacedTube::of(self.placement.tubes.get(name)?)
    }

    /// Answers `client` with tube `t` (`create_tube`'s answer).
    pub(super) fn answer_tube<'c>(
        &mut self,
        cx: &mut Ctx<'_>,
        client: Client,
        t: PlacedTube,
    ) -> Option<Command<'c>> {
        let info = tarq_engine::TubeInfo {
            ix: t.ix,
            name: &t.name,
            kind: t.kind,
            opts: t.opts,
            numbers: t.numbers,
        };
        self.answer(cx, client, &Outcome::Tube(info));
        None
    }
}
