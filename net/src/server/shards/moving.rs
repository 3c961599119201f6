//! Moving a partition to another replica set with its tasks (`tarq.move`, `tarq ctl move`),
//! run by the primary that owns it, while traffic runs.
//!
//! 1. **Copy while serving.** The new owner's primary is told to hold the partition
//!    (`Ask::MoveIn`: made as here, numbering on from here), then gets the tasks there were
//!    when the move began page by page (`Ask::MoveTasks`, a few pages in flight, kept to
//!    `--move-rate`) over the link, each task as it is — ready, delayed, buried, taken (its
//!    holder named by origin node and session, so the taker's ack finds it there) — and
//!    answers each page once it is durable. The partition serves meanwhile; the core notes
//!    which of its tasks change (`Core::follow`).
//! 2. **Catch up.** What changed is sent again (a task as it is now, or that it went), in
//!    rounds while it serves.
//! 3. **Freeze.** Once few changes are left (or after a few rounds), the partition hands out
//!    nothing and takes no waiting put (the core's freeze), and every command that would
//!    change it — from this node's clients, or forwarded by others — waits (`held.rs`); the
//!    last changes are sent. What still changes here while frozen is what the tasks' own
//!    times change (a TTR running out, a delay ending, a TTL), which the copy does on its own
//!    at the same instants, and a holder's session ending, which is told on to the new owner.
//!    The new owner answered the first step only once it had claimed the copy in etcd for
//!    this move (`tarq_cluster::moves`: a key per partition, naming the move's id).
//! 4. **Commit.** One transaction in etcd gives the partition to the new set if this set
//!    still owns it, this node still leads it (its term), and the move's claim is still
//!    there, and deletes the claim: the commit point. Before it the partition is here; after
//!    it, there.
//! 5. **Hand over.** The new owner is told (`Ask::MoveDone`) and serves at once; this node
//!    lets go of its copy, sends the held commands and the takes parked here on to the new
//!    owner, and answers the mover. A call that still reaches this node for the partition is
//!    relayed there, not refused.
//!
//! Given up before the commit (the new owner refused or its link failed, etcd refused), the
//! partition thaws here and the held commands run here; the new owner withdraws its claim and
//! drops its copy when told, when its sender's link closes or its copy stalls (`incoming.rs`,
//! the new owner's side). When etcd's answer to the commit is lost, the partition stays frozen
//! and this node withdraws the claim itself: etcd runs that after the commit or before it, and
//! answers where the partition is once the commit can no longer happen — the new set's (the
//! move committed: hand over) or still this one's (it never will: thaw). Never in two places,
//! never in none. A view of the placement, however recent, does not decide it: the commit may
//! still be on its way to etcd when the view is read.

use super::ctx::{Ctx, Effect};
use super::held::Held;
use super::move_machine::{Fate, Input, MoveMachine, Output, Phase};
use super::*;
use crate::core::Page;
use tarq_engine::TaskId;

/// Tasks a page of the copy carries at most.
const PAGE_TASKS: usize = 2048;
/// Payload bytes past which a page ends (a task bigger than this goes alone): pages of big
/// tasks stay frames a link carries (`LINK_ENVELOPE_BYTES` above the client frame limit) and
/// a move's window holds a few of these, not gigabytes.
const PAGE_BYTES: usize = 4 << 20;

/// A page read for the move: its tasks, the numbering (with the frozen phase's last page),
/// and whether it is its phase's last.
type PageOut = (Page, Option<tarq_engine::TubeNumbers>, bool);

/// A move this node runs as the partition's owner.
pub(super) struct Move {
    asker: Client,
    /// The move's own number, random: its steps and their answers carry it, and its claim in
    /// etcd names it.
    id: u64,
    tube: String,
    partition: u16,
    ix: TubeIx,
    to: usize,
    /// The placement's epoch when the move began.
    epoch: i64,
    /// The move's steps and their order (`move_machine`); what follows is what it moves.
    machine: MoveMachine,
    after: Option<TaskId>,
    dedup_after: Option<u64>,
    /// The first id a task put after the move began gets: the bulk copy stops below it
    /// (later tasks are followed as changes).
    bulk_end: TaskId,
    pub(super) held: Vec<Held>,
    started: Instant,
    tasks: u64,
    /// The number the partition's next task would get here.
    next: u64,
    /// Tasks to send again (changed since their copy), in id order.
    changed: Vec<TaskId>,
    /// Tasks sent again, and gone ones told.
    resent: u64,
    /// When the partition froze (the last changes' copy began).
    frozen_at: Option<Instant>,
    /// etcd's placement of the tube once it said the partition is the new owner's, for the
    /// hand-over.
    settled: Option<TubePlacement>,
}

/// The moves this node has run, for `queue.cluster()` and the metrics.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct MoveFigures {
    pub committed: u64,
    pub given_up: u64,
    pub tasks_moved: u64,
    /// The last committed move's length, and how long its partition was frozen (the same
    /// here: the freeze spans the copy).
    pub last_ms: Option<u64>,
}

impl Move {
    /// Commands held while the partition is frozen.
    pub(super) fn held_len(&self) -> usize {
        self.held.len()
    }

    /// Whether its partition is frozen (from the last changes' copy to the end).
    fn frozen(&self) -> bool {
        self.machine.frozen()
    }
}

impl Router {
    /// Whether partition `ix` is frozen here for a move or held for a drop (changes to it
    /// are held).
    pub(super) fn frozen(&self, ix: TubeIx) -> bool {
        self.moving
            .as_ref()
            .is_some_and(|m| m.ix == ix && m.frozen())
            || self.drop_holds.holds(ix)
    }

    /// Whether any partition of tube `head` is frozen here (a move, a drop).
    pub(super) fn tube_frozen(&self, head: TubeIx) -> bool {
        self.moving
            .as_ref()
            .is_some_and(|m| m.frozen() && self.part(m.ix).is_some_and(|p| p.head == head))
            || (self.drop_holds.any() && self.tube_held_for_drop(head))
    }

    /// When the move should be looked at again: its unanswered commit, or its next page
    /// held back by `--move-rate`.
    pub(super) fn move_check_at(&self) -> Option<Micros> {
        self.moving.as_ref()?.machine.next_deadline()
    }

    /// The moves this node runs as a partition's owner, as the cluster page shows them: the
    /// one in progress with its step and progress (`tasks_here`: the partition's tasks here
    /// now, `q`'s), and the counts of those done.
    pub(crate) fn move_report(&self, q: &tarq_engine::Queue) -> crate::core::MoveReport {
        use move_machine::Phase;
        let in_progress = self.moving.as_ref().map(|m| {
            let phase = match m.machine.phase() {
                Phase::Prepare => "prepare",
                Phase::Bulk => "bulk",
                Phase::CatchUp => "catch-up",
                Phase::Final => "final",
                Phase::Commit { .. } => "commit",
                Phase::Unknown { .. } => "unknown",
                Phase::Ended => "ended",
            };
            crate::core::MoveProgress {
                tube: m.tube.clone(),
                partition: m.partition,
                index: m.ix,
                to: self.sets[m.to].name.clone(),
                phase: phase.to_owned(),
                tasks_sent: m.tasks,
                tasks_here: q.tube_stats(m.ix).map_or(0, |s| s.total),
                elapsed_ms: m.started.elapsed().as_millis() as u64,
                frozen: m.frozen(),
            }
        });
        let f = self.move_figures;
        crate::core::MoveReport {
            in_progress,
            committed: f.committed,
            given_up: f.given_up,
            tasks_moved: f.tasks_moved,
            last_ms: f.last_ms,
        }
    }

    /// The moves: in progress here (`Some` while one runs) and done.
    pub(crate) fn move_figures(&self) -> (Option<(String, u16, String, u64)>, MoveFigures) {
        let now = self.moving.as_ref().map(|m| {
            let to = self.sets[m.to].name.clone();
            (m.tube.clone(), m.partition, to, m.tasks)
        });
        (now, self.move_figures)
    }
}

/// What [`Router::move_plan`] found: the move can start, or the partition is there already.
enum MovePlan {
    Go {
        ix: TubeIx,
        to_slot: usize,
    },
    /// The report `tarq.move` answers.
    Already(String),
}

impl Router {
    /// Whether partition `partition` of `tube` may move to set `to` from here, now: only one
    /// move at a time, by its owner's primary, to a set with a primary, of a partition this
    /// node's view may act on. A partition there already is answered with a report.
    fn move_plan(
        &self,
        cx: &mut Ctx<'_>,
        tube: &str,
        partition: u16,
        to: &str,
    ) -> Result<MovePlan, String> {
        let leads = cx.leads();
        if let Some(m) = &self.moving {
            return Err(format!(
                "this node is moving partition {} of tube {} now: one move at a time",
                m.partition, m.tube
            ));
        }
        let placed =
            (self.placement.tubes.get(tube)).and_then(|t| t.partitions.get(usize::from(partition)));
        let Some(p) = placed else {
            return Err(format!("no partition {partition} of tube {tube} is placed"));
        };
        let (ix, owner) = (p.index, p.set.as_str());
        if owner == to {
            let report = serde_json::json!({
                "tube": tube, "partition": partition, "from": owner, "to": to,
                "tasks": 0, "ms": 0, "already": true,
            });
            return Ok(MovePlan::Already(report.to_string()));
        }
        if owner != self.set || !leads {
            let primary = (self.sets.iter())
                .find(|s| s.name == owner)
                .and_then(|s| s.primary.clone())
                .unwrap_or_else(|| "none now".into());
            return Err(format!(
                "partition {partition} of tube {tube} is owned by replica set {owner}: ask its \
                 primary ({primary})"
            ));
        }
        match self.hold(ix) {
            Some(Hold::Refuse(why)) => return Err(why),
            // Read and not applied yet: as stale as before it was read (ctl asks again).
            Some(Hold::AwaitMap) => return Err(STALE_VIEW.into()),
            None => {}
        }
        let Some(to_slot) = self.sets.iter().position(|s| s.name == to) else {
            return Err(format!("no replica set {to} in the cluster"));
        };
        if self.sets[to_slot].primary.is_none() {
            return Err(format!("replica set {to} has no primary now"));
        }
        Ok(MovePlan::Go { ix, to_slot })
    }

    /// `tarq.move(tube, partition, to)`: starts moving the partition, if this node is its
    /// owner's primary; the asker is answered when the move ends.
    pub(super) fn start_move(
        &mut self,
        cx: &mut Ctx<'_>,
        client: Client,
        tube: &str,
        partition: u16,
        to: &str,
    ) {
        let refuse = |s: &mut Router, cx: &mut Ctx<'_>, why: String| {
            s.answer(cx, client, &Outcome::Error(Refusal::Shards(why)));
        };
        let (ix, to_slot) = match self.move_plan(cx, tube, partition, to) {
            Ok(MovePlan::Go { ix, to_slot }) => (ix, to_slot),
            Ok(MovePlan::Already(report)) => {
                return self.answer(cx, client, &Outcome::Text(report));
            }
            Err(why) => return refuse(self, cx, why),
        };
        let Some(info) = cx.core.queue().tube_info(ix) else {
            return refuse(self, cx, format!("partition at index {ix} is not here"));
        };
        let (name, kind, opts) = (info.name.to_owned(), info.kind, info.opts);
        let id = match getrandom::u64() {
            Ok(id) => id,
            Err(e) => return refuse(self, cx, format!("no randomness for the move's id: {e}")),
        };
        let numbers = cx.core.numbers(ix);
        let epoch = self.placement.epoch;
        // Its changes are followed from now on; the copy runs while it serves.
        cx.core.follow(ix);
        info!(tube, partition, to, index = ix, "move started");
        self.moving = Some(Move {
            asker: client,
            id,
            tube: tube.to_owned(),
            partition,
            ix,
            to: to_slot,
            epoch,
            machine: MoveMachine::new(cx.cfg.move_rate, cx.mono),
            after: None,
            dedup_after: None,
            bulk_end: tarq_engine::task_id(ix, numbers.next),
            held: Vec::new(),
            started: Instant::now(),
            tasks: 0,
            next: numbers.next,
            changed: Vec::new(),
            resent: 0,
            frozen_at: None,
            settled: None,
        });
        let ask = Ask::MoveIn {
            id,
            index: ix,
            name: &name,
            kind,
            opts,
            numbers,
            to,
        };
        self.send_ask(cx, to_slot, client, &ask, Then::Move { id });
    }

    /// The new owner answered a step of move `id`: the move's, if it is the one under way (a
    /// late answer of an earlier move is not this one's). Once the commit is sent, nothing
    /// but etcd decides the move (the machine ignores the rest).
    pub(super) fn move_answered(&mut self, cx: &mut Ctx<'_>, id: u64, outcome: &Outcome<'_>) {
        if self.moving.as_ref().map(|m| m.id) != Some(id) {
            return;
        }
        let input = match outcome {
            Outcome::Ok => Input::Accepted,
            Outcome::Count(_) => Input::PageAnswered,
            Outcome::Error(e) => Input::Failed(format!("the new owner: {e}")),
            other => Input::Failed(format!("an answer the move did not expect: {other:?}")),
        };
        self.drive_move(cx, input);
    }

    /// Feeds `input` to the move's machine and does what it says, feeding back what came of
    /// each step, until it waits for something outside (an answer, etcd, time).
    fn drive_move(&mut self, cx: &mut Ctx<'_>, input: Input) {
        let mut next = VecDeque::from([input]);
        while let Some(input) = next.pop_front() {
            let mono = cx.mono;
            let Some(m) = self.moving.as_mut() else {
                break;
            };
            for step in m.machine.on(input, mono) {
                next.extend(self.do_move_step(cx, step));
            }
        }
        // When the move is looked at next may have changed (its rate, its phase).
    }

    /// Does one step of the move; what came of it, when the machine asked.
    fn do_move_step(&mut self, cx: &mut Ctx<'_>, step: Output) -> Option<Input> {
        match step {
            Output::SendPage => Some(match self.next_page(cx) {
                Ok(Some((page, numbers, last))) => {
                    let items = (page.tasks.len() + page.gone.len()) as u64;
                    self.send_page(cx, (page, numbers));
                    Input::Sent { items, last }
                }
                Ok(None) => Input::Exhausted,
                Err(e) => Input::Failed(format!("reading the partition: {e}")),
            }),
            Output::CollectChanges => Some(self.collect_changes(cx)),
            Output::Freeze => {
                let m = self.moving.as_mut()?;
                cx.core.freeze(m.ix);
                m.frozen_at = Some(Instant::now());
                None
            }
            Output::Commit => {
                cx.core.unfollow();
                Some(Input::CommitAsked(self.ask_commit(cx)))
            }
            Output::Withdraw => Some(Input::WithdrawAsked(self.withdraw_claim(cx))),
            Output::HandOver => {
                let t = self.moving.as_mut()?.settled.take()?;
                self.move_committed(cx, &t);
                None
            }
            Output::GiveUp(why) => {
                self.give_up_move(cx, &why);
                None
            }
        }
    }

    /// The next page of the phase (`None`: the phase has no more, marked exported).
    /// (The page, the numbering with the frozen phase's last page, and whether it is the
    /// phase's last.)
    fn next_page(&mut self, cx: &mut Ctx<'_>) -> Result<Option<PageOut>, String> {
        let Some(m) = self.moving.as_mut() else {
            return Ok(None);
        };
        let ix = m.ix;
        let phase = m.machine.phase();
        match phase {
            Phase::Bulk => {
                let mut page = (cx.core)
                    .export_page(ix, m.after, m.dedup_after, PAGE_TASKS, PAGE_BYTES)
                    .map_err(|e| e.to_string())?;
                m.after = page.tasks.last().map(|t| t.id).or(m.after);
                m.dedup_after = page.dedup.last().map(|d| d.seq).or(m.dedup_after);
                // Tasks put since the move began are followed as changes.
                let end = m.bulk_end;
                let past = page.tasks.iter().any(|t| t.id >= end);
                page.tasks.retain(|t| t.id < end);
                if page.tasks.is_empty() && (past || page.dedup.is_empty()) {
                    return Ok(None);
                }
                m.tasks += page.tasks.len() as u64;
                Ok(Some((page, None, false)))
            }
            Phase::CatchUp | Phase::Final => {
                let mut page = Page {
                    again: true,
                    ..Page::default()
                };
                // Up to PAGE_TASKS changed tasks, ending once their payloads reach PAGE_BYTES.
                let mut bytes = 0;
                let mut taken = 0;
                for &id in m.changed.iter().take(PAGE_TASKS) {
                    if taken > 0 && bytes >= PAGE_BYTES {
                        break;
                    }
                    taken += 1;
                    match cx.core.export_task(ix, id) {
                        Some(t) => {
                            bytes += t.payload_bytes();
                            page.tasks.push(t);
                        }
                        None => page.gone.push(id),
                    }
                }
                m.changed.drain(..taken);
                m.resent += (page.tasks.len() + page.gone.len()) as u64;
                if phase == Phase::Final {
                    // The dedup keys recorded meanwhile, and the numbering as it ends here.
                    page.dedup = (cx.core)
                        .export_page(ix, Some(TaskId::MAX), m.dedup_after, PAGE_TASKS, 0)
                        .map_err(|e| e.to_string())?
                        .dedup;
                    m.dedup_after = page.dedup.last().map(|d| d.seq).or(m.dedup_after);
                }
                let last = m.changed.is_empty() && page.dedup.is_empty();
                let empty = page.tasks.is_empty() && page.gone.is_empty() && page.dedup.is_empty();
                // The frozen phase sends its last page even empty: it carries the numbering.
                if empty && phase != Phase::Final {
                    return Ok(None);
                }
                let numbers = (last && phase == Phase::Final).then(|| cx.core.numbers(ix));
                Ok(Some((page, numbers, last)))
            }
            _ => Ok(None),
        }
    }

    /// Sends a page of the move to the new owner.
    fn send_page(
        &mut self,
        cx: &mut Ctx<'_>,
        (page, numbers): (Page, Option<tarq_engine::TubeNumbers>),
    ) {
        let Some(m) = self.moving.as_mut() else {
            return;
        };
        let (to, asker, ix, id) = (m.to, m.asker, m.ix, m.id);
        // A Taken task's holder, named as the new owner will know it; the holder's end is
        // told there too.
        let mut holders = Vec::with_capacity(page.tasks.len());
        for t in &page.tasks {
            holders.push(t.owner.map(|sid| {
                *self.forwarded.entry(sid).or_default() |= set_bit(to);
                self.holds.took(sid, set_bit(to));
                match cx.link_sessions.remote_of(sid) {
                    Some((origin, remote)) => (Some(origin.to_string()), remote),
                    None => (None, sid),
                }
            }));
        }
        let ask = Ask::MoveTasks {
            id,
            index: ix,
            tasks: page.tasks,
            holders,
            dedup: page.dedup,
            gone: page.gone,
            again: page.again,
            numbers,
            read_at: cx.now,
        };
        self.send_ask(cx, to, asker, &ask, Then::Move { id });
    }

    /// A phase's pages are all answered: what changed meanwhile, to send again (kept in id
    /// order), and how much — the machine decides whether to freeze for it.
    fn collect_changes(&mut self, cx: &mut Ctx<'_>) -> Input {
        let changed = cx.core.take_changed();
        let Some(m) = self.moving.as_mut() else {
            return Input::Failed("the move is gone".into());
        };
        if changed.whole {
            return Input::Changes {
                count: 0,
                whole: true,
            };
        }
        let mut ids: Vec<TaskId> = changed.ids.into_iter().collect();
        ids.sort_unstable();
        let count = ids.len();
        m.changed = ids;
        Input::Changes {
            count,
            whole: false,
        }
    }

    /// The copy is whole and durable there: asks etcd to change the placement, if the copy
    /// is still claimed there and this node still leads its set (a successor may have served
    /// the partition past the copy). The request's token, or why it cannot be made.
    fn ask_commit(&mut self, cx: &mut Ctx<'_>) -> Result<u64, String> {
        let Some(term) = cx.cluster().and_then(|c| c.leading_term()) else {
            return Err("this node no longer leads its replica set".into());
        };
        let token = self.next_token;
        self.next_token += 1;
        let m = self.moving.as_ref().ok_or("the move is gone")?;
        let commit = tarq_cluster::moves::Commit {
            tube: m.tube.clone(),
            partition: m.partition,
            index: m.ix,
            from: self.set.clone(),
            to: self.sets[m.to].name.clone(),
            // The new owner numbers on from here, also past tasks put and gone meanwhile.
            first: cx.core.numbers(m.ix).next.max(m.next),
            id: m.id,
            term,
            // Frozen: its counts are final here, and travel with it.
            carried: gather::counters_of(&cx.core.queue().tube_stats(m.ix).unwrap_or_default()),
        };
        cx.cluster_handle().move_partition(token, commit);
        Ok(token)
    }

    /// Asks etcd to withdraw the claim of a move whose commit went unanswered (which decides
    /// it): the request's token.
    fn withdraw_claim(&mut self, cx: &Ctx<'_>) -> u64 {
        let token = self.next_token;
        self.next_token += 1;
        let Some(m) = self.moving.as_ref() else {
            return token;
        };
        let (ix, tube, id) = (m.ix, m.tube.clone(), m.id);
        let to = self.sets[m.to].name.clone();
        cx.cluster_handle()
            .release_move(token, ix, &tube, &to, Some(id));
        token
    }

    /// Whether `token` is the move's commit, or the withdrawal of its claim after the commit
    /// went unanswered; if so, its result is taken in: what etcd says of the partition.
    pub(super) fn move_commit_done(
        &mut self,
        cx: &mut Ctx<'_>,
        token: u64,
        result: &Result<TubePlacement, tarq_cluster::PlacementError>,
    ) -> bool {
        let Some(m) = self.moving.as_mut() else {
            return false;
        };
        let commit = m.machine.commit_token() == Some(token);
        if !commit && m.machine.withdraw_token() != Some(token) {
            return false;
        }
        let to = self.sets[m.to].name.as_str();
        let fate = match result {
            // The commit's answer is the placement it made; the withdrawal's, etcd's placement
            // once the commit can no longer happen.
            Ok(t) if commit || tarq_cluster::moves::owner_at(t, m.ix) == Some(to) => {
                m.settled = Some(t.clone());
                Fate::There
            }
            Ok(_) => Fate::Here,
            Err(tarq_cluster::PlacementError::Etcd(why)) => {
                warn!(
                    why,
                    commit, "a move's fate is not known: withdrawing its claim to learn it"
                );
                Fate::Lost(why.clone())
            }
            Err(e) => Fate::Refused(e.to_string()),
        };
        let input = if commit {
            Input::Committed(fate)
        } else {
            Input::Withdrawn(fate)
        };
        self.drive_move(cx, input);
        true
    }

    /// The turn's look at a move: a page its rate held back, or the fate of a lost commit,
    /// when due.
    pub(in crate::server) fn tick_move(&mut self, cx: &mut Ctx<'_>) {
        let due = (self.moving.as_ref())
            .and_then(|m| m.machine.next_deadline())
            .is_some_and(|at| at <= cx.mono);
        if due {
            self.drive_move(cx, Input::Tick);
        }
    }

    /// The placement gives the partition to the new owner now: hand over.
    fn move_committed(&mut self, cx: &mut Ctx<'_>, t: &TubePlacement) {
        let Some(m) = self.moving.take() else {
            return;
        };
        self.add_tube(t);
        let took = m.started.elapsed();
        self.move_figures.committed += 1;
        self.move_figures.tasks_moved += m.tasks;
        self.move_figures.last_ms = Some(took.as_millis() as u64);
        let to_name = self.sets[m.to].name.clone();
        let done = Ask::MoveDone {
            id: m.id,
            index: m.ix,
            committed: true,
            epoch: m.epoch,
        };
        self.send_own(cx, m.to, &done);
        info!(
            tube = %m.tube, partition = m.partition, to = %to_name, tasks = m.tasks,
            ms = took.as_millis() as u64, "move committed"
        );
        // The takes that waited here wait for the new owner now.
        let parked = cx.core.take_parked_in(m.ix);
        self.let_go_of(cx, m.ix);
        let head = self.part(m.ix).map_or(m.ix, |p| p.head);
        for p in parked {
            self.repark(cx, p, m.ix, head);
        }
        for h in m.held {
            self.release_held(cx, h);
        }
        self.watch_again(cx);
        let frozen = m.frozen_at.map_or(0, |t| t.elapsed().as_millis() as u64);
        let report = serde_json::json!({
            "tube": m.tube, "partition": m.partition, "from": self.set,
            "to": to_name, "tasks": m.tasks, "resent": m.resent, "rounds": m.machine.rounds(),
            "ms": took.as_millis() as u64, "frozen_ms": frozen,
        });
        self.answer(cx, m.asker, &Outcome::Text(report.to_string()));
    }

    /// Gives the move up before its commit: the partition stays and thaws here.
    pub(super) fn give_up_move(&mut self, cx: &mut Ctx<'_>, why: &str) {
        let Some(m) = self.moving.take() else {
            return;
        };
        self.move_figures.given_up += 1;
        let set = self.set.clone();
        let to = self.sets[m.to].name.clone();
        // Tidiness, not safety (the commit cannot happen now): the claim goes even if the
        // new owner does not hear of the end; nobody waits for the answer.
        let token = self.next_token;
        self.next_token += 1;
        cx.cluster_handle()
            .release_move(token, m.ix, &m.tube, &to, Some(m.id));
        let done = Ask::MoveDone {
            id: m.id,
            index: m.ix,
            committed: false,
            epoch: m.epoch,
        };
        self.send_own(cx, m.to, &done);
        warn!(tube = %m.tube, partition = m.partition, why, "move given up");
        cx.core.unfollow();
        // A drop's hold of the partition keeps it frozen (its end thaws it).
        if !self.drop_holds.holds(m.ix) {
            let (core, wire) = cx.split();
            core.thaw(m.ix, wire);
            self.take_routed(cx);
        }
        for h in m.held {
            self.release_held(cx, h);
        }
        let why = format!(
            "the move of partition {} of tube {} was given up: {why}; it stays on replica set \
             {set}",
            m.partition, m.tube
        );
        self.answer(cx, m.asker, &Outcome::Error(Refusal::Shards(why)));
    }

    /// A take or watch parked here on partition `ix` that moved away: it waits on (or is
    /// woken) through the router.
    fn repark(
        &mut self,
        cx: &mut Ctx<'_>,
        p: crate::core::parked::ParkedTake<ReplyTo>,
        ix: TubeIx,
        head: TubeIx,
    ) {
        if !cx.is_live(p.caller) {
            return;
        }
        let idx = p.caller.slot();
        if p.wake_only {
            return match p.reply {
                ReplyTo::Router(token) => self.gathered_or_woke(cx, token, Digest::Ready(ix)),
                // Another node's watch: it tries the partition, and is relayed.
                reply => cx.deliver(idx, reply, &Outcome::Ready(ix)),
            };
        }
        let timeout = (p.deadline != Micros::MAX).then(|| p.deadline.saturating_sub(cx.mono));
        match p.reply {
            ReplyTo::Beanstalk(_) => self.effects.push(Effect::ReserveWoke(p.caller)),
            ReplyTo::Link(_) => {
                let cmd = Command::Take {
                    on: On::Tube(ix),
                    timeout,
                };
                self.dispatch_forwarded(cx, idx, p.caller.sid, p.reply, cmd, true);
            }
            reply => {
                let cmd = Command::Take {
                    on: On::Tube(head),
                    timeout,
                };
                self.dispatch(cx, idx, reply, cmd);
            }
        }
    }

    /// An outcome meant for the router, handed to it directly.
    fn gathered_or_woke(&mut self, cx: &mut Ctx<'_>, token: u64, digest: Digest) {
        cx.wire.routed.push((token, digest));
        self.take_routed(cx);
    }
}
