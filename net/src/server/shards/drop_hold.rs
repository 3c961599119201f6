//! A partition held for a drop, on the primary that owns it: from the moment it passes a
//! drop's check (`Command::DropCheck` forwarded by the dropping node, or that node's own
//! `Core::may_drop` of a partition it leads) until it learns the drop's fate, the calls that
//! would change it wait here — puts, takes, releases, acks, whole-tube changes, the calls a
//! move's freeze holds (`held.rs`) — and reads run. The core's freeze is on too: nothing is
//! taken from it and no waiting put enters. Without the hold, a put that reached the owner
//! after the drop had answered and before the owner's next read of etcd was acknowledged and
//! then went with the tube.
//!
//! The hold ends when
//! - the placement no longer has the tube (the drop's commit, read at a poll): the held calls
//!   run again and are answered as calls on a tube that does not exist are;
//! - the dropping node says the drop was given up (`Ask::DropOff`: another partition's check
//!   refused, etcd refused the commit, the commit came too late): they run here;
//! - its time is up ([`DROP_HOLD`]) with no word: the dropping node died, its link broke, its
//!   word or etcd's answer to it was lost. The dropping node begins no commit later than
//!   [`DROP_COMMIT_WITHIN`] after its checks, well inside the hold, so a drop cannot be
//!   committed after the hold ends; the node still reads the placement at etcd's current
//!   revision first, and lets the calls run once a read newer than its ask has come in (the
//!   tube gone: refused; there: served) or its view of the placement has gone stale (then
//!   every change is refused anyway).
//!
//! Each hold is a partition and the node whose drop made it, so one drop's end does not end
//! another's hold of the same partition. The calls held are bounded with the others
//! (`--max-routed-calls`); a hold by time, as above.

use std::time::{Duration, Instant};

use super::ctx::Ctx;
use super::held::Held;
use super::*;

/// How long an owner holds a partition's changes after passing a drop's check before it reads
/// the placement and lets them run.
pub(super) const DROP_HOLD: Micros = 5_000_000;

/// How long after its checks began the dropping node may still send the commit to etcd (no
/// request after it): well inside [`DROP_HOLD`], with room for etcd to answer.
pub(super) const DROP_COMMIT_WITHIN: Duration = Duration::from_secs(3);

/// One drop's hold of one partition.
pub(super) struct DropHold {
    ix: TubeIx,
    /// The node whose drop checked it (its word ends the hold).
    origin: Arc<str>,
    /// When the hold runs out (monotonic µs), or asks the placement again.
    until: Micros,
    /// Once it ran out: the read of the placement asked, and when (a read sent since then
    /// that succeeded lets the calls run).
    read: Option<(u64, Instant)>,
    /// It ran out and said so in the log (once).
    warned: bool,
}

/// The partitions held for drops here, and the calls waiting for them.
#[derive(Default)]
pub(super) struct DropHolds {
    holds: Vec<DropHold>,
    pub(super) held: Vec<Held>,
}

impl DropHolds {
    /// Whether partition `ix` is held for a drop.
    pub(super) fn holds(&self, ix: TubeIx) -> bool {
        !self.holds.is_empty() && self.holds.iter().any(|h| h.ix == ix)
    }

    /// Whether any partition is held for a drop.
    pub(super) fn any(&self) -> bool {
        !self.holds.is_empty()
    }

    /// When the next hold runs out.
    pub(super) fn next_deadline(&self) -> Option<Micros> {
        (self.holds.iter())
            .filter(|h| h.read.is_none())
            .map(|h| h.until)
            .min()
    }
}

impl Router {
    /// Whether any partition of tube `head` is held here for a drop.
    pub(super) fn tube_held_for_drop(&self, head: TubeIx) -> bool {
        (self.drop_holds.holds.iter())
            .any(|h| h.ix == head || self.part(h.ix).is_some_and(|p| p.head == head))
    }

    /// Whether a call for partition `ix` (or, whole-tube, its tube) waits with the drops'
    /// held calls rather than the move's: its tube is held for a drop, or no move runs and
    /// some drop holds a partition here. (A call released with the wrong list is decided
    /// again and waits again.)
    pub(super) fn holds_for_drop(&self, ix: Option<TubeIx>) -> bool {
        (self.moving.is_none() && self.drop_holds.any())
            || ix.is_some_and(|ix| {
                self.drop_holds.holds(ix)
                    || self
                        .part(ix)
                        .is_some_and(|p| self.tube_held_for_drop(p.head))
            })
    }
}

impl Router {
    /// Holds partition `ix`'s changes for a drop node `origin` checks (again: for as long
    /// again).
    pub(super) fn hold_for_drop(&mut self, cx: &mut Ctx<'_>, ix: TubeIx, origin: &Arc<str>) {
        let until = cx.mono.saturating_add(DROP_HOLD);
        let holds = &mut self.drop_holds.holds;
        match holds.iter_mut().find(|h| h.ix == ix && h.origin == *origin) {
            Some(h) => {
                h.until = until;
                h.read = None;
                h.warned = false;
            }
            None => holds.push(DropHold {
                ix,
                origin: Arc::clone(origin),
                until,
                read: None,
                warned: false,
            }),
        }
        cx.core.freeze(ix);
    }

    /// A drop's check of partition `ix` another node forwarded (for session `sid` of link
    /// `idx`): the core's answer, and the partition held from then on. Only a primary holds
    /// its set's partitions: a replica refuses, and the drop is refused with it.
    pub(super) fn drop_check_here(
        &mut self,
        cx: &mut Ctx<'_>,
        idx: usize,
        sid: SessionId,
        reply: ReplyTo,
        ix: TubeIx,
    ) {
        if !cx.leads() {
            let why = "this node does not lead its replica set now: no drop's check here";
            return cx.deliver(idx, reply, &Outcome::Error(Refusal::Shards(why.into())));
        }
        let origin = match cx.link_sessions.remote_of(sid) {
            Some((o, _)) => Arc::clone(o),
            None => Arc::clone(&self.me),
        };
        let (core, wire) = cx.split();
        let outcome = match core.may_drop(ix, wire) {
            Ok(next) => {
                self.hold_for_drop(cx, ix, &origin);
                Outcome::Count(next)
            }
            Err(e) => Outcome::Error(e),
        };
        cx.deliver(idx, reply, &outcome);
    }

    /// Node `origin` gave its drop up: its hold of partition `ix` ends.
    pub(super) fn thaw_for_drop(&mut self, cx: &mut Ctx<'_>, ix: TubeIx, origin: &str) {
        self.end_drop_holds(cx, |h| h.ix == ix && &*h.origin == origin);
    }

    /// The placement no longer has the partitions at `indexes` (let go of already): their
    /// holds end, and their calls are answered as for a tube that does not exist.
    pub(super) fn end_drop_holds_of(&mut self, cx: &mut Ctx<'_>, indexes: &[TubeIx]) {
        if !indexes.is_empty() {
            self.end_drop_holds(cx, |h| indexes.contains(&h.ix));
        }
    }

    /// This node's own holds of `indexes` (its drop of their tube was given up or made).
    pub(super) fn end_own_drop_holds(&mut self, cx: &mut Ctx<'_>, indexes: &[TubeIx]) {
        let me = Arc::clone(&self.me);
        self.end_drop_holds(cx, |h| h.origin == me && indexes.contains(&h.ix));
    }

    /// Ends the holds `which` picks: a partition no longer held (for a drop or a move) thaws,
    /// and every call held for a drop runs again (one still held waits again).
    fn end_drop_holds(&mut self, cx: &mut Ctx<'_>, which: impl Fn(&DropHold) -> bool) {
        if !self.drop_holds.any() {
            return;
        }
        let (ended, kept): (Vec<DropHold>, Vec<DropHold>) =
            std::mem::take(&mut self.drop_holds.holds)
                .into_iter()
                .partition(which);
        self.drop_holds.holds = kept;
        if ended.is_empty() {
            return;
        }
        let thaw: Vec<TubeIx> = (ended.iter().map(|h| h.ix))
            .filter(|&ix| !self.frozen(ix))
            .collect();
        let held = std::mem::take(&mut self.drop_holds.held);
        for ix in thaw {
            let (core, wire) = cx.split();
            core.thaw(ix, wire);
        }
        self.take_routed(cx);
        for h in held {
            self.release_held(cx, h);
        }
    }

    /// The holds whose time ran out with no word of their drop: the placement is read at
    /// etcd's current revision before their calls run ([`drop_holds_read`]).
    ///
    /// [`drop_holds_read`]: Self::drop_holds_read
    pub(in crate::server) fn expire_drop_holds(&mut self, cx: &mut Ctx<'_>) {
        let mono = cx.mono;
        let due = |h: &DropHold| h.read.is_none() && h.until <= mono;
        if !self.drop_holds.holds.iter().any(due) {
            return;
        }
        let read = self.ask_read(cx);
        let now = Instant::now();
        for h in self.drop_holds.holds.iter_mut().filter(|h| due(h)) {
            if !h.warned {
                warn!(
                    index = h.ix, origin = %h.origin,
                    "no word of a drop within its hold: reading the placement before the \
                     partition serves changes again"
                );
                h.warned = true;
            }
            h.read = Some((read, now));
        }
    }

    /// Read `answered` of the placement is in (after the map it brought, if any, was
    /// applied: a tube gone has ended its holds already). A hold waiting for it ends if a
    /// read sent since its ask succeeded (the tube is still placed: the drop was not made) or
    /// this node's view has gone stale (every change is refused now); else it asks again a
    /// moment later (etcd refusing at once must not be asked in a loop).
    pub(super) fn drop_holds_read(&mut self, cx: &mut Ctx<'_>, answered: u64) {
        let mono = cx.mono;
        if !self.drop_holds.any() {
            return;
        }
        // A read's fence runs to its sending instant plus the validity.
        let read_since = |asked: Instant| {
            (self.fence.view()).is_some_and(|(_, until)| until >= asked + self.validity)
        };
        let stale = self.fence.valid_at(Instant::now()).is_none();
        let mut done = Vec::new();
        for h in self.drop_holds.holds.iter_mut() {
            let Some((token, asked)) = h.read.filter(|&(t, _)| t <= answered) else {
                continue;
            };
            if stale || read_since(asked) {
                done.push((h.ix, Arc::clone(&h.origin), token));
            } else {
                h.read = None;
                h.until = mono.saturating_add(RECHECK);
            }
        }
        self.end_drop_holds(cx, |h| {
            (done.iter()).any(|(ix, o, t)| {
                h.ix == *ix && h.origin == *o && h.read.is_some_and(|r| r.0 == *t)
            })
        });
    }
}
