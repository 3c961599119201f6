//! A tube this node does not know yet: another node has just placed it in etcd, and this
//! node's poll has not brought the placement in (or, on a replica, its primary's copy of the
//! tube's first partition has not come). Before it says a tube does not exist, a node reads
//! the placement at etcd's current revision (`Cluster::read_placement`), and the call runs
//! again after that read: so a tube exists on every node once `create_tube` has answered, as
//! on one node, and sharded-queue's clients need no pause after creating one.
//!
//! Two ways in. A front-end that cannot resolve a tube's name asks
//! [`Server::hold_for_placement`]: the request's frame is kept (with the rest of the
//! connection's input, which waits behind it so the replies keep their order) and run again
//! once the read is in. A command the router gets for a partition its routes do not have (a
//! replica that holds the tube's first partition from its primary before its own view has the
//! tube) is kept encoded and dispatched again after the read. Each waits for a read that
//! began after it was held; the second run is final (a tube still unknown is unknown).

use super::*;

/// A request kept until the placement is read: a connection's frame (the front-end could not
/// resolve its tube's name) or a routed command (its partition is not in the routes).
pub(super) struct Unknown {
    idx: usize,
    gen: u32,
    /// The read (`Shards::reads_asked`) whose answer releases it.
    read: u64,
    what: Kept,
}

enum Kept {
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

impl Server {
    /// The tube named `name`: the engine's, else (sharded) the routes'. Every call of the
    /// tube API asks it: one node's path stays a lookup, inlined into the caller.
    #[inline]
    pub(crate) fn tube_named(&self, name: &str) -> Option<(TubeIx, tarq_engine::TubeNumbers)> {
        if self.shards.is_some() {
            return self.tube_routed(name);
        }
        let q = self.core.queue();
        q.tube_ix(name).map(|ix| (ix, q.tube_numbers(ix)))
    }

    /// [`Self::tube_named`] on a sharded node.
    #[inline(never)]
    fn tube_routed(&self, name: &str) -> Option<(TubeIx, tarq_engine::TubeNumbers)> {
        let q = self.core.queue();
        let held = q.tube_ix(name);
        let shards = self.shards.as_ref()?;
        // On a sharded node the name is a tube's this node routes. An engine's tube it does
        // not route is a copy of a tube dropped a moment ago (a replica's primary has not let
        // go of it yet), or one this node's view has not caught up with: the call waits for a
        // read of the placement (the caller holds it when this answers `None`), and is
        // resolved again after it, when the name's routed tube, a new one made since the
        // drop, wins.
        let routed = |ix: TubeIx| shards.tubes.contains_key(&ix);
        if let Some(ix) = held.filter(|&ix| routed(ix)) {
            return Some((ix, q.tube_numbers(ix)));
        }
        let placed = (shards.placement.tubes.get(name)).and_then(|t| t.partitions.first());
        let again = shards.reads.again;
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
        let Some(shards) = self.shards.as_mut() else {
            return false;
        };
        if shards.reads.again {
            return false;
        }
        shards.reads.hold_frame = true;
        true
    }

    /// Whether the front-end asked to hold the frame it just ran (the loop then keeps it with
    /// [`hold_frame`](Self::hold_frame) and reads no further on the connection).
    #[inline]
    pub(crate) fn frame_to_hold(&self) -> bool {
        self.shards.as_ref().is_some_and(|s| s.reads.hold_frame)
    }

    /// Keeps `frame` of connection `idx` until the placement is read (`false`: refused at the
    /// router's bound, and answered so).
    pub(crate) fn hold_frame(&mut self, idx: usize, frame: &[u8]) -> bool {
        let gen = self.conns[idx].gen;
        let Some(shards) = self.shards.as_mut() else {
            return false;
        };
        shards.reads.hold_frame = false;
        let len = shards.reads.held.len();
        if let Some(why) = shards.over_bound(len, "calls waiting for a read of the placement") {
            let e = tarq_iproto::request::decode(frame).map(|r| r.sync);
            let out = self.reply_buf(idx);
            tarq_iproto::response::error(out, e.unwrap_or(0), super::super::ER_UNKNOWN, &why);
            return false;
        }
        let read = self.ask_read();
        if let Some(s) = self.shards.as_mut() {
            let what = Kept::Frame(frame.to_vec());
            s.reads.held.push(Unknown {
                idx,
                gen,
                read,
                what,
            });
        }
        true
    }

    /// Whether connection `idx`'s input waits for a read of the placement (it is read again
    /// once the held frame has run).
    #[inline]
    pub(crate) fn input_held(&self, idx: usize) -> bool {
        self.shards.as_ref().is_some_and(|s| {
            !s.reads.held.is_empty() && s.reads.holds_input(idx, self.conns[idx].gen)
        })
    }

    /// A command another node forwarded on link `idx` for a partition this node has not
    /// heard of: kept until the placement is read (`true`), then run as forwarded.
    pub(super) fn hold_unplaced_forwarded(
        &mut self,
        idx: usize,
        sid: SessionId,
        reply: ReplyTo,
        cmd: &Command<'_>,
        may_relay: bool,
    ) -> bool {
        let gen = self.conns[idx].gen;
        let Some(shards) = self.shards.as_mut() else {
            return false;
        };
        let Some(ix) = named_partition(cmd) else {
            return false;
        };
        if shards.reads.again || shards.part(ix).is_some() {
            return false;
        }
        let len = shards.reads.held.len();
        if let Some(why) = shards.over_bound(len, "calls waiting for a read of the placement") {
            self.deliver(idx, reply, &Outcome::Error(Refusal::Shards(why)));
            return true;
        }
        let Ok(cmd) = crate::frontend::link::call::encode_command(cmd) else {
            return false;
        };
        let read = self.ask_read();
        if let Some(s) = self.shards.as_mut() {
            let what = Kept::Forwarded {
                sid,
                reply,
                cmd,
                may_relay,
            };
            s.reads.held.push(Unknown {
                idx,
                gen,
                read,
                what,
            });
        }
        true
    }

    /// In the router: whether `cmd` names a partition its routes lack and should wait for a
    /// read of the placement (it is then kept; `false`: route it as it is).
    pub(super) fn hold_unrouted(&mut self, client: Client, cmd: &Command<'_>) -> bool {
        let Some(shards) = self.shards.as_mut() else {
            return false;
        };
        let Some(ix) = named_partition(cmd) else {
            return false;
        };
        if shards.reads.again || shards.part(ix).is_some() {
            return false;
        }
        self.keep_for_read(client, cmd)
    }

    /// In the router: whether a whole-tube figure should wait for a read of the placement —
    /// a partition of the tube moved here and this node's view does not have that move yet,
    /// so it lacks the counts the move carried (`carried`) — and is kept for it.
    pub(super) fn hold_figures_for_view(&mut self, client: Client, cmd: &Command<'_>) -> bool {
        let Some(shards) = self.shards.as_ref() else {
            return false;
        };
        if shards.adopted.is_empty() || shards.reads.again {
            return false;
        }
        let stale = match *cmd {
            Command::TubeStats { tube } | Command::TubeFigures { tube } => (shards.tubes)
                .get(&tube)
                .is_some_and(|t| t.parts.iter().any(|p| shards.adopted.contains_key(p))),
            Command::AllTubeStats => true,
            _ => false,
        };
        stale && self.keep_for_read(client, cmd)
    }

    /// Keeps `cmd` of `client` until a read of the placement (`false`: it cannot be kept,
    /// and is routed as it is).
    fn keep_for_read(&mut self, client: Client, cmd: &Command<'_>) -> bool {
        let Some(shards) = self.shards.as_mut() else {
            return false;
        };
        let len = shards.reads.held.len();
        if let Some(why) = shards.over_bound(len, "calls waiting for a read of the placement") {
            self.answer(client, &Outcome::Error(Refusal::Shards(why)));
            return true;
        }
        let cmd = match crate::frontend::link::call::encode_command(cmd) {
            Ok(cmd) => cmd,
            Err(_) => return false,
        };
        let read = self.ask_read();
        if let Some(s) = self.shards.as_mut() {
            let what = Kept::Command {
                reply: client.reply,
                cmd,
            };
            s.reads.held.push(Unknown {
                idx: client.idx,
                gen: client.gen,
                read,
                what,
            });
        }
        true
    }

    /// The read a request held now waits for: the last one asked if its poll cannot have
    /// begun yet (an earlier one is still unanswered, and the election thread takes asks
    /// between polls, in order), else a new one.
    pub(super) fn ask_read(&mut self) -> u64 {
        let Some(s) = self.shards.as_mut() else {
            return 0;
        };
        let r = &mut s.reads;
        if r.asked >= r.answered + 2 {
            return r.asked;
        }
        r.asked += 1;
        if let Some(c) = self.cluster.as_ref() {
            c.handle().read_placement();
        }
        r.asked
    }

    /// The election thread answered a read of the placement (after the `MapChanged` it
    /// brought, if any): what waited for it runs again, once.
    pub(in crate::server) fn shards_placement_read(&mut self) {
        let Some(s) = self.shards.as_mut() else {
            return;
        };
        s.reads.answered += 1;
        let answered = s.reads.answered;
        let (due, wait): (Vec<Unknown>, Vec<Unknown>) = std::mem::take(&mut s.reads.held)
            .into_iter()
            .partition(|u| u.read <= answered);
        s.reads.held = wait;
        self.drop_holds_read(answered);
        for u in due {
            if self.conns.get(u.idx).is_none_or(|c| c.gen != u.gen) {
                continue;
            }
            self.set_again(true);
            match u.what {
                Kept::Frame(frame) => {
                    crate::frontend::iproto::Iproto::new(self).execute(u.idx, &frame);
                    self.set_again(false);
                    self.resume_input(u.idx);
                }
                Kept::Command { reply, cmd } => {
                    match crate::frontend::link::call::decode_command(&cmd) {
                        Ok(cmd) => self.dispatch(u.idx, reply, cmd),
                        Err(e) => {
                            let why = format!("a held command that does not decode: {e}");
                            self.deliver(u.idx, reply, &Outcome::Error(Refusal::Shards(why)));
                        }
                    }
                    self.set_again(false);
                }
                Kept::Forwarded {
                    sid,
                    reply,
                    cmd,
                    may_relay,
                } => {
                    match crate::frontend::link::call::decode_command(&cmd) {
                        Ok(cmd) => self.dispatch_forwarded(u.idx, sid, reply, cmd, may_relay),
                        Err(e) => {
                            let why = format!("a held command that does not decode: {e}");
                            self.deliver(u.idx, reply, &Outcome::Error(Refusal::Shards(why)));
                        }
                    }
                    self.set_again(false);
                }
            }
        }
    }

    fn set_again(&mut self, again: bool) {
        if let Some(s) = self.shards.as_mut() {
            s.reads.again = again;
            s.reads.hold_frame = false;
        }
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

impl Server {
    /// Tube `name` as this node knows it: held here, or placed.
    pub(super) fn placed_tube(&self, name: &str) -> Option<PlacedTube> {
        let q = self.core.queue();
        if let Some(info) = q.tube_ix(name).and_then(|ix| q.tube_info(ix)) {
            return Some(PlacedTube {
                ix: info.ix,
                name: info.name.to_owned(),
                kind: info.kind,
                opts: info.opts,
                numbers: info.numbers,
            });
        }
        PlacedTube::of(self.shards.as_ref()?.placement.tubes.get(name)?)
    }

    /// Answers `client` with tube `t` (`create_tube`'s answer).
    pub(super) fn answer_tube<'c>(&mut self, client: Client, t: PlacedTube) -> Option<Command<'c>> {
        let info = tarq_engine::TubeInfo {
            ix: t.ix,
            name: &t.name,
            kind: t.kind,
            opts: t.opts,
            numbers: t.numbers,
        };
        self.answer(client, &Outcome::Tube(info));
        None
    }
}
