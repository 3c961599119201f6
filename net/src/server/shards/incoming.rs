//! The new owner's side of a move: it takes a partition in (`Ask::MoveIn`, `MoveTasks`,
//! `MoveDone` over the old owner's link), keeps a copy whose sender went away until a read of
//! the placement says whether the move committed, and lets go — a batch a turn — of copies of
//! partitions placed elsewhere (a move given up, a node stopped across one, the old owner
//! after a commit).

use super::*;
use crate::core::Page;

/// A copy arriving here that makes no progress this long is given up (its sender gone).
const STALL: std::time::Duration = std::time::Duration::from_secs(30);
/// Tasks of a partition that moved away let go of at once.
const LET_GO_BATCH: usize = 1024;

/// A partition being copied here.
pub(super) struct Incoming {
    origin: Arc<str>,
    touched: Instant,
    /// Its sender's link closed (or the copy stalled) at this instant: the copy is kept or
    /// let go as a placement read after it says (the move may have committed just before).
    orphaned: Option<Instant>,
}

impl Server {
    /// A step of a move into this node (from link `idx`'s node).
    pub(crate) fn move_step(&mut self, idx: usize, reply: ReplyTo, step: Ask<'_>) {
        let outcome = match self.take_move_step(idx, step) {
            Ok(o) => o,
            Err(why) => Outcome::Error(Refusal::Shards(why)),
        };
        self.deliver(idx, reply, &outcome);
    }

    fn take_move_step(&mut self, idx: usize, step: Ask<'_>) -> Result<Outcome<'static>, String> {
        let leads = self.leads();
        let Some(origin) = self.conns[idx].link_mut().map(|l| Arc::clone(&l.origin)) else {
            return Err("a move step not on a link".into());
        };
        let Some(shards) = self.shards.as_mut() else {
            return Err("this tarq is no sharded cluster's node".into());
        };
        match step {
            Ask::MoveIn {
                index,
                name,
                kind,
                opts,
                numbers,
                to,
            } => {
                if !leads || to != shards.set {
                    return Err(format!(
                        "this node is not replica set {to}'s primary (it is in {}, leading: \
                         {leads})",
                        shards.set
                    ));
                }
                if shards
                    .part(index)
                    .is_some_and(|p| shards.sets[p.set].name == shards.set)
                    || shards.adopted.contains_key(&index)
                {
                    return Err(format!("partition at index {index} is this set's already"));
                }
                let q = self.core.queue();
                match q.tube_info(index) {
                    Some(t) if t.name != name => {
                        return Err(format!(
                            "index {index} holds tube {} here, not {name}",
                            t.name
                        ))
                    }
                    // A copy left by a move that did not commit: emptied.
                    Some(_) if q.tube_stats(index).is_ok_and(|s| s.total > 0) => {
                        shards.letting_go.retain(|&(t, _)| t != index);
                        self.core.let_go_moved(index);
                    }
                    Some(_) => {}
                    None => {
                        self.core
                            .place_tube(index, name, kind, opts, numbers.first)
                            .map_err(|e| format!("cannot hold the partition: {e}"))?;
                    }
                }
                self.core
                    .import_numbers(index, numbers)
                    .map_err(|e| format!("the partition's numbering: {e}"))?;
                self.conns[idx].out.changed = true;
                let incoming = Incoming {
                    origin,
                    touched: Instant::now(),
                    orphaned: None,
                };
                if let Some(s) = self.shards.as_mut() {
                    s.incoming.insert(index, incoming);
                }
                info!(tube = name, index, "a partition is moving here");
                Ok(Outcome::Ok)
            }
            Ask::MoveTasks {
                index,
                tasks,
                holders,
                dedup,
                gone,
                again,
                numbers,
            } => {
                let inc = shards.incoming.get_mut(&index);
                let Some(inc) = inc.filter(|i| i.origin == origin) else {
                    return Err(format!(
                        "no move into index {index} from {origin} is under way here"
                    ));
                };
                inc.touched = Instant::now();
                let me = Arc::clone(&shards.me);
                let mut sids = Vec::with_capacity(holders.len());
                for h in holders {
                    let sid = match h {
                        None => 0,
                        // A client of this node's own, which took through the old owner.
                        Some((Some(o), remote)) if *o == *me => remote,
                        Some((o, remote)) => {
                            let o: Arc<str> = o.map_or_else(|| Arc::clone(&origin), Arc::from);
                            match self.link_sessions.get(&o, remote) {
                                Some(sid) => sid,
                                None => {
                                    let sid = self.new_session();
                                    self.link_sessions.insert(&o, remote, sid);
                                    sid
                                }
                            }
                        }
                    };
                    sids.push(sid);
                }
                let page = Page {
                    tasks,
                    dedup,
                    gone,
                    again,
                };
                let n = self
                    .core
                    .import_page(index, page, |i| sids.get(i).copied().unwrap_or(0))
                    .map_err(|e| format!("taking the partition's tasks in: {e}"))?;
                if let Some(numbers) = numbers {
                    self.core
                        .import_numbers(index, numbers)
                        .map_err(|e| format!("the partition's numbering: {e}"))?;
                }
                // Answered once durable, as any change.
                self.conns[idx].out.changed = true;
                Ok(Outcome::Count(n as u64))
            }
            Ask::MoveDone {
                index,
                committed,
                epoch,
            } => {
                shards.incoming.remove(&index);
                if committed {
                    // Adopted until this node's view is newer than the move's start (a view
                    // that is newer already says who owns it).
                    if shards.placement.epoch <= epoch {
                        shards.adopted.insert(index, epoch);
                    }
                    info!(index, "a partition moved here: served from now on");
                    let (core, mut wire) = self.split();
                    core.serve_parked(index, &mut wire);
                    self.take_routed();
                } else {
                    self.let_go_of(index);
                }
                Ok(Outcome::Ok)
            }
            _ => Err("not a move step".into()),
        }
    }

    /// The link from `origin` closed: the copies it was sending here are orphaned, kept or
    /// let go once a placement read after the close says whether their move committed.
    pub(in crate::server) fn link_closed(&mut self, origin: &str) {
        let Some(shards) = self.shards.as_mut() else {
            return;
        };
        let now = Instant::now();
        let mut any = false;
        for inc in shards.incoming.values_mut() {
            if &*inc.origin == origin && inc.orphaned.is_none() {
                inc.orphaned = Some(now);
                any = true;
            }
        }
        if any {
            shards.recheck_at = Some(self.mono.saturating_add(RECHECK));
            self.timers_changed();
        }
    }

    /// The turn's look at orphaned copies, when one is due.
    pub(in crate::server) fn check_orphaned_copies(&mut self) {
        let due = (self.shards.as_ref())
            .and_then(|s| s.recheck_at)
            .is_some_and(|t| t <= self.mono);
        if due {
            if let Some(s) = self.shards.as_mut() {
                s.recheck_at = None;
            }
            self.let_go_strays();
            // Commands that wait for a placement read: run (or refused) once there is none
            // pending any more, else looked at again.
            let mono = self.mono;
            if let Some(s) = self.shards.as_mut().filter(|s| !s.awaiting_map.is_empty()) {
                if s.map_pending() {
                    s.recheck_at = Some(mono.saturating_add(RECHECK));
                } else {
                    self.release_awaiting_map();
                }
            }
            self.timers_changed();
        }
    }

    /// On a primary, after a new map (and while copies are orphaned): copies this node holds
    /// of partitions placed elsewhere that no move brings here (left by a move that did not
    /// commit, or by a node that was stopped across one) are let go. A copy whose sender went
    /// away or quiet stops being one a move brings once a placement read since says who owns
    /// it: kept if this set does (the move committed), else let go.
    pub(super) fn let_go_strays(&mut self) {
        if !self.leads() {
            return;
        }
        let mono = self.mono;
        let Some(shards) = self.shards.as_mut() else {
            return;
        };
        let read = (shards.fence.view())
            .filter(|&(epoch, _)| epoch == shards.placement.epoch)
            .map(|(_, at)| at);
        shards.incoming.retain(|_, inc| {
            if inc.orphaned.is_none() && inc.touched.elapsed() >= STALL {
                inc.orphaned = Some(Instant::now());
            }
            // Decided by a read of the placement made after it went quiet.
            inc.orphaned.is_none_or(|t| read.is_none_or(|r| r <= t))
        });
        let waiting = shards.incoming.values().any(|i| i.orphaned.is_some());
        shards.recheck_at = waiting.then(|| mono.saturating_add(RECHECK));
        let mut strays = Vec::new();
        for (ix, p) in shards.parts.iter().enumerate() {
            let Some(p) = p else { continue };
            let ix = ix as TubeIx;
            let mine = shards.sets[p.set].name == shards.set;
            if mine
                || shards.incoming.contains_key(&ix)
                || shards.adopted.contains_key(&ix)
                || shards.frozen(ix)
                || shards.letting_go.iter().any(|&(t, _)| t == ix)
            {
                continue;
            }
            if self.core.queue().tube_stats(ix).is_ok_and(|s| s.total > 0) {
                strays.push(ix);
            }
        }
        for ix in strays {
            warn!(index = ix, "a copy of a partition placed elsewhere: let go");
            self.let_go_of(ix);
        }
    }

    /// Lets go of the tasks this node holds of partition `ix` (it moved away, or a copy did
    /// not commit), a batch a turn ([`let_go_gradually`](Self::let_go_gradually)), so a big
    /// partition does not stop the loop; the tube stays, empty, at its index.
    pub(super) fn let_go_of(&mut self, ix: TubeIx) {
        self.core.thaw_only(ix);
        let Some(shards) = self.shards.as_mut() else {
            return;
        };
        if !shards.letting_go.iter().any(|&(t, _)| t == ix) {
            shards.letting_go.push((ix, None));
            info!(
                index = ix,
                "letting go of a partition's tasks, a batch a turn"
            );
        }
        self.timers_changed();
    }

    /// A batch of tasks let go of, when due (see [`let_go_of`](Self::let_go_of)): kept to
    /// `--move-rate`, as the copy is, so the clients of this node (which forwards them all
    /// now) keep their pace.
    pub(in crate::server) fn let_go_gradually(&mut self) {
        let mono = self.mono;
        let Some(shards) = self.shards.as_ref() else {
            return;
        };
        let Some(&(ix, after)) = shards.letting_go.first() else {
            return;
        };
        if shards.let_go_at > mono {
            return;
        }
        let next = self.core.let_go_some(ix, after, LET_GO_BATCH);
        let rate = self.cfg.move_rate;
        let Some(shards) = self.shards.as_mut() else {
            return;
        };
        if let Some(spent) = (LET_GO_BATCH as u64 * 1_000_000).checked_div(rate) {
            shards.let_go_at = mono.saturating_add(spent);
        }
        match next {
            Some(last) => shards.letting_go[0].1 = Some(last),
            None => {
                shards.letting_go.remove(0);
                info!(index = ix, "let go of a partition's tasks");
            }
        }
        self.timers_changed();
    }
}
