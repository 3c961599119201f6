//! The new owner's side of a move: it takes a partition in (`Ask::MoveIn`, `MoveTasks`,
//! `MoveDone` over the old owner's link), and lets go — a batch a turn — of copies of
//! partitions placed elsewhere (a move given up, a node stopped across one, the old owner
//! after a commit).
//!
//! A copy is **claimed** in etcd before the old owner is told to send it (`MoveIn` is answered
//! only then), and the move's commit requires that claim (`tarq_cluster::moves`). A copy is
//! discarded only after its claim is **released** in etcd: its sender's link closed, no page
//! came for 30 s, the old owner gave the move up, or — after a restart — no move this process
//! knows of brings it. etcd runs the release before the commit or after it, and answers where
//! the partition is once the commit can no longer happen: this set's (the move committed after
//! all: the copy is kept and served) or not (let go). So a copy is never discarded under a
//! commit still on its way to etcd, and this side and the old owner's (`moving.rs`, which
//! releases the claim itself when its commit goes unanswered) end the move the same way.

use super::ctx::Ctx;
use super::*;
use crate::core::Page;
use tarq_cluster::moves::owner_at;
use tarq_cluster::{MoveClaim, PlacementError};
use tarq_engine::TubeNumbers;

/// A copy arriving here whose pages stop coming this long is given up (its sender gone).
const STALL: Micros = 30_000_000;
/// Tasks of a partition that moved away let go of at once.
const LET_GO_BATCH: usize = 1024;

/// A partition being copied here, or a copy whose fate etcd is asked.
pub(super) struct Incoming {
    /// The move bringing it; `None`: a copy found here that no move this process knows of
    /// brings (a move across a restart, or one given up while this node did not hear).
    id: Option<u64>,
    /// The node sending it.
    origin: Option<Arc<str>>,
    /// The tube it is a partition of (its claim names it).
    tube: String,
    /// When its last page came (monotonic µs).
    touched: Micros,
    state: CopyState,
}

enum CopyState {
    /// Its claim is being made (etcd request `token`); the move's first step is answered
    /// once it is, and the copy is made as `setup` says.
    Claiming {
        token: u64,
        asker: Client,
        setup: Box<Setup>,
    },
    /// Claimed: pages arrive.
    Copying,
    /// Its claim is withdrawn (etcd request `token` while etcd has it, else asked at
    /// `retry_at`): the copy is kept or let go as etcd's answer says.
    Releasing {
        token: Option<u64>,
        retry_at: Micros,
    },
}

/// The partition as the old owner has it (`Ask::MoveIn`), made here once claimed.
struct Setup {
    kind: TubeType,
    opts: TubeOptions,
    numbers: TubeNumbers,
}

impl Incoming {
    fn releasing(&mut self, now: Micros) {
        if !matches!(self.state, CopyState::Releasing { .. }) {
            self.state = CopyState::Releasing {
                token: None,
                retry_at: now,
            };
        }
    }
}

impl Router {
    /// A step of a move into this node (from link `idx`'s node).
    pub(crate) fn move_step(
        &mut self,
        cx: &mut Ctx<'_>,
        idx: usize,
        reply: ReplyTo,
        step: Ask<'_>,
    ) {
        let outcome = match self.take_move_step(cx, idx, reply, step) {
            Ok(Some(o)) => o,
            // Answered once etcd has the copy's claim.
            Ok(None) => return,
            Err(why) => Outcome::Error(Refusal::Shards(why)),
        };
        cx.deliver(idx, reply, &outcome);
    }

    fn take_move_step(
        &mut self,
        cx: &mut Ctx<'_>,
        idx: usize,
        reply: ReplyTo,
        step: Ask<'_>,
    ) -> Result<Option<Outcome<'static>>, String> {
        let Some(origin) = cx.wire.conns[idx].link_mut().map(|l| Arc::clone(&l.origin)) else {
            return Err("a move step not on a link".into());
        };
        if let Ask::Moves = step {
            // A question, not a step: what this node runs as an owner's primary.
            return Ok(Some(Outcome::Moves(Box::new(
                self.move_report(cx.core.queue()),
            ))));
        }
        if let Ask::DropOff { index } = step {
            // The word of a drop given up by the node whose check froze the partition.
            self.thaw_for_drop(cx, index, &origin);
            return Ok(Some(Outcome::Ok));
        }
        // Every step changes the queue (a copy made, a page taken in, a copy served): only a
        // primary's changes may be logged. A node deposed during a move refuses the rest of
        // it, and the old owner gives the move up.
        if !cx.leads() {
            return Err("this node does not lead its replica set now".into());
        }
        match step {
            Ask::MoveIn {
                id,
                index,
                name,
                kind,
                opts,
                numbers,
                to,
            } => {
                let setup = Box::new(Setup {
                    kind,
                    opts,
                    numbers,
                });
                let asker = Client {
                    idx,
                    gen: cx.wire.conns[idx].gen,
                    sid: 0,
                    reply,
                };
                self.move_in(cx, asker, origin, id, index, name, to, setup)?;
                Ok(None)
            }
            step @ Ask::MoveTasks { .. } => {
                let n = self.move_page(cx, &origin, step)?;
                // Answered once durable, as any change.
                cx.wire.conns[idx].out.changed = true;
                Ok(Some(Outcome::Count(n)))
            }
            Ask::MoveDone {
                id,
                index,
                committed,
                epoch,
            } => {
                self.move_done(cx, &origin, id, index, committed, epoch)?;
                Ok(Some(Outcome::Ok))
            }
            _ => Err("not a move step".into()),
        }
    }

    /// A page of a move (`Ask::MoveTasks`), its times moved from the old owner's wall clock
    /// to this node's (each instant keeps what was left of it, plus the page's time in
    /// flight), taken in: how many tasks.
    fn move_page(
        &mut self,
        cx: &mut Ctx<'_>,
        origin: &Arc<str>,
        step: Ask<'_>,
    ) -> Result<u64, String> {
        let Ask::MoveTasks {
            id,
            index,
            mut tasks,
            holders,
            mut dedup,
            gone,
            again,
            numbers,
            read_at,
        } = step
        else {
            return Err("not a move's page".into());
        };
        let shift = (cx.now as i64).saturating_sub(read_at as i64);
        tasks.iter_mut().for_each(|t| t.shift_clock(shift));
        dedup.iter_mut().for_each(|d| d.shift_clock(shift));
        let page = Page {
            tasks,
            dedup,
            gone,
            again,
        };
        self.move_tasks(cx, origin, (id, index), page, holders, numbers)
    }

    /// A move's first step: the copy is claimed in etcd, and made (and the step answered)
    /// once it is. A copy an earlier move left stays until then: etcd's answer says whether
    /// that move committed.
    #[allow(clippy::too_many_arguments)]
    fn move_in(
        &mut self,
        cx: &mut Ctx<'_>,
        asker: Client,
        origin: Arc<str>,
        id: u64,
        index: TubeIx,
        name: &str,
        to: &str,
        setup: Box<Setup>,
    ) -> Result<(), String> {
        let leads = cx.leads();
        let mono = cx.mono;
        if !leads || to != self.set {
            return Err(format!(
                "this node is not replica set {to}'s primary (it is in {}, leading: {leads})",
                self.set
            ));
        }
        if self
            .part(index)
            .is_some_and(|p| self.sets[p.set].name == self.set)
            || self.adopted.contains_key(&index)
        {
            return Err(format!("partition at index {index} is this set's already"));
        }
        match cx.core.queue().tube_info(index) {
            Some(t) if t.name != name => {
                return Err(format!(
                    "index {index} holds tube {} here, not {name}",
                    t.name
                ))
            }
            _ => {}
        }
        let token = self.next_token;
        self.next_token += 1;
        let incoming = Incoming {
            id: Some(id),
            origin: Some(origin),
            tube: name.to_owned(),
            touched: mono,
            state: CopyState::Claiming {
                token,
                asker,
                setup,
            },
        };
        let before = self.incoming.insert(index, incoming);
        if let Some(CopyState::Claiming { asker, .. }) = before.map(|b| b.state) {
            let why = format!("a newer move of partition at index {index} began");
            self.answer(cx, asker, &Outcome::Error(Refusal::Shards(why)));
        }
        let claim = MoveClaim {
            id,
            tube: name.to_owned(),
            to: to.to_owned(),
        };
        cx.cluster_handle().claim_move(token, index, claim);
        info!(
            tube = name,
            index, "a partition is moving here: claiming it"
        );
        Ok(())
    }

    /// A page of move `id`'s copy: taken in (its holders named as this node knows them).
    fn move_tasks(
        &mut self,
        cx: &mut Ctx<'_>,
        origin: &Arc<str>,
        (id, index): (u64, TubeIx),
        page: Page,
        holders: Vec<Option<(Option<String>, u64)>>,
        numbers: Option<TubeNumbers>,
    ) -> Result<u64, String> {
        let mono = cx.mono;
        let inc = (self.incoming.get_mut(&index)).filter(|i| {
            i.id == Some(id)
                && i.origin.as_ref() == Some(origin)
                && matches!(i.state, CopyState::Copying)
        });
        let Some(inc) = inc else {
            return Err(format!(
                "no move into index {index} from {origin} is under way here"
            ));
        };
        inc.touched = mono;
        let me = Arc::clone(&self.me);
        let mut sids = Vec::with_capacity(holders.len());
        for h in holders {
            let sid = match h {
                None => 0,
                // A client of this node's own, which took through the old owner.
                Some((Some(o), remote)) if *o == *me => remote,
                Some((o, remote)) => {
                    let o: Arc<str> = o.map_or_else(|| Arc::clone(origin), Arc::from);
                    match cx.link_sessions.get(&o, remote) {
                        Some(sid) => sid,
                        None => {
                            let sid = cx.new_session();
                            cx.link_sessions.insert(&o, remote, sid);
                            sid
                        }
                    }
                }
            };
            sids.push(sid);
        }
        let n = cx
            .core
            .import_page(index, page, |i| sids.get(i).copied().unwrap_or(0))
            .map_err(|e| format!("taking the partition's tasks in: {e}"))?;
        if let Some(numbers) = numbers {
            cx.core
                .import_numbers(index, numbers)
                .map_err(|e| format!("the partition's numbering: {e}"))?;
        }
        Ok(n as u64)
    }

    /// Move `id`'s end, as the old owner `origin` tells it: committed, the copy is served;
    /// not, its claim is withdrawn and the copy kept or let go as etcd then says (the old
    /// owner's word alone does not discard a copy). Only the node sending a copy here ends its
    /// move: the end of a move this node does not know from that node is refused, and a
    /// partition it did not copy (this node became its set's primary during the move) is served
    /// once this node's own read of the placement says so, not on another node's word.
    fn move_done(
        &mut self,
        cx: &mut Ctx<'_>,
        origin: &Arc<str>,
        id: u64,
        index: TubeIx,
        committed: bool,
        epoch: i64,
    ) -> Result<(), String> {
        let mono = cx.mono;
        let ours = (self.incoming.get_mut(&index))
            .filter(|i| i.id == Some(id) && i.origin.as_ref() == Some(origin));
        let Some(inc) = ours else {
            return Err(format!(
                "no move {id} into index {index} from {origin} is under way here"
            ));
        };
        if committed {
            self.incoming.remove(&index);
            self.adopt(cx, index, epoch);
        } else {
            inc.releasing(mono);
            self.release_copies(cx);
        }
        Ok(())
    }

    /// Partition `ix` is this set's by a move: served from now on, before this node's view
    /// is newer than `epoch` (a view that is newer already says who owns it).
    fn adopt(&mut self, cx: &mut Ctx<'_>, ix: TubeIx, epoch: i64) {
        // What this node counted when it served the partition before travelled with it (the
        // placement's `carried`): from now on its counters say what it does itself.
        cx.core.restart_counts(ix);
        if self.placement.epoch <= epoch {
            self.adopted.insert(ix, epoch);
        }
        info!(index = ix, "a partition moved here: served from now on");
        let (core, wire) = cx.split();
        core.serve_parked(ix, wire);
        self.take_routed(cx);
    }

    /// The link from `origin` closed: the copies it was sending here are released (their
    /// move may have committed just before: etcd says).
    pub(in crate::server) fn link_closed(&mut self, cx: &mut Ctx<'_>, origin: &str) {
        let mono = cx.mono;
        let mut any = false;
        for inc in self.incoming.values_mut() {
            let from_it = inc.origin.as_deref() == Some(origin);
            if from_it && matches!(inc.state, CopyState::Copying) {
                inc.releasing(mono);
                any = true;
            }
        }
        if any {
            self.release_copies(cx);
        }
    }

    /// The turn's look at copies due a look (a stall, a release to ask again), and at
    /// commands that wait for a placement read.
    pub(in crate::server) fn check_orphaned_copies(&mut self, cx: &mut Ctx<'_>) {
        if self.recheck_at.is_some_and(|t| t <= cx.mono) {
            self.recheck_at = None;
            self.let_go_strays(cx);
            // Commands that wait for a placement read: run (or refused) once there is none
            // pending any more, else looked at again.
            if !self.awaiting_map.is_empty() {
                if self.map_pending() {
                    self.recheck_by(cx.mono.saturating_add(RECHECK));
                } else {
                    self.release_awaiting_map(cx);
                }
            }
        }
    }

    /// On a primary, after a new map (and when copies are due a look): copies this node holds
    /// of partitions placed elsewhere that no move brings here (left by a move given up, or
    /// across a restart) are released like a move's, then let go unless etcd says this set
    /// owns them; copies whose pages stopped coming are released; releases etcd did not
    /// answer are asked again.
    pub(super) fn let_go_strays(&mut self, cx: &mut Ctx<'_>) {
        if !cx.leads() {
            return;
        }
        let mono = cx.mono;
        let mut strays = Vec::new();
        for (ix, p) in self.parts.iter().enumerate() {
            let Some(p) = p else { continue };
            let ix = ix as TubeIx;
            let mine = self.sets[p.set].name == self.set;
            if mine
                || self.incoming.contains_key(&ix)
                || self.adopted.contains_key(&ix)
                || self.frozen(ix)
                || self.letting_go.iter().any(|&(t, _)| t == ix)
            {
                continue;
            }
            if cx.core.queue().tube_stats(ix).is_ok_and(|s| s.total > 0) {
                strays.push((ix, self.tubes.get(&p.head).map(|r| r.name.clone())));
            }
        }
        for (ix, tube) in strays {
            warn!(
                index = ix,
                "a copy of a partition placed elsewhere: releasing any claim on it"
            );
            let Some(tube) = tube else {
                self.let_go_of(cx, ix);
                continue;
            };
            let stray = Incoming {
                id: None,
                origin: None,
                tube,
                touched: mono,
                state: CopyState::Releasing {
                    token: None,
                    retry_at: mono,
                },
            };
            self.incoming.insert(ix, stray);
        }
        self.release_copies(cx);
    }

    /// Copies whose claim is to be withdrawn, asked of etcd (one request for each at a
    /// time); a copy whose pages stopped coming is one of them.
    fn release_copies(&mut self, cx: &mut Ctx<'_>) {
        let mono = cx.mono;
        let mut asks = Vec::new();
        let mut next: Option<Micros> = None;
        let mut at = |t: Micros| next = Some(next.map_or(t, |n: Micros| n.min(t)));
        for (&ix, inc) in self.incoming.iter_mut() {
            if matches!(inc.state, CopyState::Copying) && mono.saturating_sub(inc.touched) >= STALL
            {
                warn!(
                    index = ix,
                    "a copy arriving here stalled: releasing its claim"
                );
                inc.releasing(mono);
            }
            match inc.state {
                CopyState::Copying => at(inc.touched.saturating_add(STALL)),
                CopyState::Releasing {
                    token: None,
                    retry_at,
                } if retry_at <= mono => {
                    let token = self.next_token;
                    self.next_token += 1;
                    inc.state = CopyState::Releasing {
                        token: Some(token),
                        retry_at,
                    };
                    asks.push((token, ix, inc.tube.clone(), inc.id));
                }
                CopyState::Releasing {
                    token: None,
                    retry_at,
                } => at(retry_at),
                _ => {}
            }
        }
        if let Some(t) = next {
            self.recheck_by(t);
        }
        let me = self.set.clone();
        for (token, ix, tube, id) in asks {
            cx.cluster_handle().release_move(token, ix, &tube, &me, id);
        }
    }

    /// Whether `token` is etcd's answer to a copy's claim or release; if so, it is taken in.
    pub(super) fn copy_etcd_done(
        &mut self,
        cx: &mut Ctx<'_>,
        token: u64,
        result: &Result<TubePlacement, PlacementError>,
    ) -> bool {
        let found = self.incoming.iter().find_map(|(&ix, i)| match i.state {
            CopyState::Claiming { token: t, .. } if t == token => Some((ix, true)),
            CopyState::Releasing { token: Some(t), .. } if t == token => Some((ix, false)),
            _ => None,
        });
        match found {
            Some((ix, true)) => self.copy_claimed(cx, ix, result),
            Some((ix, false)) => self.copy_released(cx, ix, result),
            None => return false,
        }
        true
    }

    /// etcd answered a copy's claim: the copy is made and the old owner told to send it —
    /// unless an earlier move of the partition turns out to have committed (its copy here is
    /// kept and served), or the old owner went away meanwhile (the claim is released).
    fn copy_claimed(
        &mut self,
        cx: &mut Ctx<'_>,
        ix: TubeIx,
        result: &Result<TubePlacement, PlacementError>,
    ) {
        let mono = cx.mono;
        let mine = result
            .as_ref()
            .is_ok_and(|t| owner_at(t, ix) == Some(self.set.as_str()));
        let epoch = self.placement.epoch;
        let Some(inc) = self.incoming.get_mut(&ix) else {
            return;
        };
        let state = std::mem::replace(&mut inc.state, CopyState::Copying);
        let CopyState::Claiming { asker, setup, .. } = state else {
            return;
        };
        let tube = inc.tube.clone();
        let refuse = |s: &mut Router, cx: &mut Ctx<'_>, why: String| {
            s.answer(cx, asker, &Outcome::Error(Refusal::Shards(why)));
        };
        if mine {
            self.incoming.remove(&ix);
            warn!(
                index = ix,
                "an earlier move of this partition committed: its copy is served"
            );
            self.adopt(cx, ix, epoch);
            return refuse(
                self,
                cx,
                format!("partition at index {ix} is this set's already"),
            );
        }
        if let Err(e) = result {
            self.incoming.remove(&ix);
            refuse(self, cx, format!("cannot claim the copy in etcd: {e}"));
            // A copy an earlier move left here is released as a stray.
            return self.let_go_strays(cx);
        }
        // The old owner went away meanwhile: nobody sends the copy.
        if cx
            .wire
            .conns
            .get(asker.idx)
            .is_none_or(|c| c.gen != asker.gen)
        {
            return self.release_copy(cx, ix, mono);
        }
        match self.make_copy(cx, ix, &tube, &setup) {
            Ok(()) => {
                if let Some(inc) = self.incoming.get_mut(&ix) {
                    inc.touched = mono;
                }
                info!(tube, index = ix, "a partition is moving here");
                // Answered once durable, as any change.
                cx.wire.conns[asker.idx].out.changed = true;
                self.answer(cx, asker, &Outcome::Ok);
            }
            Err(why) => {
                refuse(self, cx, why);
                self.release_copy(cx, ix, mono);
            }
        }
    }

    /// Copy `ix`'s claim is withdrawn now.
    fn release_copy(&mut self, cx: &mut Ctx<'_>, ix: TubeIx, mono: Micros) {
        if let Some(inc) = self.incoming.get_mut(&ix) {
            inc.releasing(mono);
        }
        self.release_copies(cx);
    }

    /// Makes partition `ix` of `tube` here as the old owner has it, empty (a copy an earlier
    /// move left, which etcd says did not commit, is emptied).
    fn make_copy(
        &mut self,
        cx: &mut Ctx<'_>,
        ix: TubeIx,
        tube: &str,
        setup: &Setup,
    ) -> Result<(), String> {
        let q = cx.core.queue();
        match q.tube_info(ix) {
            Some(t) if t.name != tube => {
                return Err(format!("index {ix} holds tube {} here, not {tube}", t.name))
            }
            Some(_) if q.tube_stats(ix).is_ok_and(|s| s.total > 0) => {
                cx.core.let_go_moved(ix);
            }
            Some(_) => {}
            None => {
                cx.core
                    .place_tube(ix, tube, setup.kind, setup.opts, setup.numbers.first)
                    .map_err(|e| format!("cannot hold the partition: {e}"))?;
            }
        }
        // Emptied at once: a letting go a batch a turn would take the copy's tasks too.
        self.letting_go.retain(|&(t, _)| t != ix);
        cx.core
            .import_numbers(ix, setup.numbers)
            .map_err(|e| format!("the partition's numbering: {e}"))
    }

    /// etcd answered a copy's release: no move can commit the partition here any more, and
    /// the placement says whether one did — kept and served if so, else let go.
    fn copy_released(
        &mut self,
        cx: &mut Ctx<'_>,
        ix: TubeIx,
        result: &Result<TubePlacement, PlacementError>,
    ) {
        let mono = cx.mono;
        match result {
            Err(PlacementError::Etcd(_) | PlacementError::Conflict { .. }) => {
                if let Some(inc) = self.incoming.get_mut(&ix) {
                    let retry_at = mono.saturating_add(RECHECK);
                    inc.state = CopyState::Releasing {
                        token: None,
                        retry_at,
                    };
                    self.recheck_by(retry_at);
                }
            }
            Ok(t) if owner_at(t, ix) == Some(self.set.as_str()) => {
                self.incoming.remove(&ix);
                warn!(index = ix, "the move committed after all: its copy is kept");
                let epoch = self.placement.epoch;
                self.adopt(cx, ix, epoch);
            }
            _ => {
                self.incoming.remove(&ix);
                info!(index = ix, "a copy's claim is released: the copy is let go");
                self.let_go_of(cx, ix);
            }
        }
    }

    /// Lets go of the tasks this node holds of partition `ix` (it moved away, or a copy did
    /// not commit), a batch a turn ([`let_go_gradually`](Self::let_go_gradually)), so a big
    /// partition does not stop the loop; the tube stays, empty, at its index.
    pub(super) fn let_go_of(&mut self, cx: &mut Ctx<'_>, ix: TubeIx) {
        cx.core.thaw_only(ix);
        if !self.letting_go.iter().any(|&(t, _)| t == ix) {
            self.letting_go.push((ix, None));
            info!(
                index = ix,
                "letting go of a partition's tasks, a batch a turn"
            );
        }
    }

    /// This node stopped leading its set: what it was doing to the queue for the shards stops
    /// here, as every change of its own does (its WAL would refuse them). Copies arriving are
    /// dropped from its books (a claim waiting for etcd is answered with a refusal, so the old
    /// owner gives its move up), and so is the letting go of partitions. Whoever leads next
    /// finds the tasks left of either as a partition placed elsewhere (`let_go_strays`),
    /// withdraws any claim, and lets go of them unless etcd says the set owns them.
    pub(in crate::server) fn shards_stop_leading(&mut self, cx: &mut Ctx<'_>) {
        self.letting_go.clear();
        let askers: Vec<Client> = (self.incoming.drain())
            .filter_map(|(_, i)| match i.state {
                CopyState::Claiming { asker, .. } => Some(asker),
                _ => None,
            })
            .collect();
        for asker in askers {
            let why = "this node stopped leading its replica set during the move".to_owned();
            self.answer(cx, asker, &Outcome::Error(Refusal::Shards(why)));
        }
    }

    /// This node became its set's primary: copies and partitions left of an earlier
    /// leadership (see [`shards_stop_leading`](Self::shards_stop_leading)) get their look on
    /// the next turn.
    pub(in crate::server) fn shards_start_leading(&mut self, cx: &mut Ctx<'_>) {
        let mono = cx.mono;
        self.recheck_by(mono);
        // What the cluster's users became while another node led.
        self.shards_users_changed(cx);
    }

    /// A batch of tasks let go of, when due (see [`let_go_of`](Self::let_go_of)): kept to
    /// `--move-rate`, as the copy is, so the clients of this node (which forwards them all
    /// now) keep their pace. Only a primary lets go: its replicas follow its records.
    pub(in crate::server) fn let_go_gradually(&mut self, cx: &mut Ctx<'_>) {
        if !cx.leads() {
            return;
        }
        let mono = cx.mono;
        let Some(&(ix, after)) = self.letting_go.first() else {
            return;
        };
        if self.let_go_at > mono {
            return;
        }
        let next = cx.core.let_go_some(ix, after, LET_GO_BATCH);
        let rate = cx.cfg.move_rate;
        if let Some(spent) = (LET_GO_BATCH as u64 * 1_000_000).checked_div(rate) {
            self.let_go_at = mono.saturating_add(spent);
        }
        match next {
            Some(last) => self.letting_go[0].1 = Some(last),
            None => {
                self.letting_go.remove(0);
                info!(index = ix, "let go of a partition's tasks");
            }
        }
    }
}
