//! Dropping a partitioned tube. Every partition is asked first whether it may go
//! (`Command::DropCheck`: no task taken, no take waiting) and for the next number it would
//! give; a partition that passes is held by its owner from then on (`drop_hold.rs`: its
//! changes wait, its reads run) until the drop's fate is known. Then the tube leaves the
//! placement in etcd: that transaction is the commit point, and it records each index's
//! floor, so a tube placed there later never gives an id twice. Every node lets go of what it
//! held of the tube when its map no longer has it, and answers the calls its hold kept as for
//! a tube that does not exist: nothing is acknowledged after the drop that goes with it.
//!
//! The commit is fenced on the checks: each set that checked must be led still by the
//! primary that checked, and every partition must be owned, in etcd, by one of those sets (a
//! partition that moved, or a check relayed past this node's stale view to an owner it did not
//! name, gets the drop refused: that owner's successor is not fenced).
//!
//! A drop given up before the commit (a partition refused its check, a check went
//! unanswered, etcd refused the commit, or the commit could not begin within
//! `DROP_COMMIT_WITHIN` of the checks) tells each owner it asked (`Ask::DropOff`), and the
//! partitions serve again at once; an owner that does not hear of it reads the placement when
//! its hold runs out.

use super::ctx::Ctx;
use super::*;

/// A drop this node asked etcd for: who asked, the tube's partitions, and the checks it
/// asked other sets' primaries for (set, partition), told if the drop is given up.
pub(super) struct Dropping {
    client: Client,
    parts: Vec<TubeIx>,
    asked: Vec<(usize, TubeIx)>,
}

/// A drop's checks: the partitions led here (their next numbers), the others' owners to ask.
type Checks = (Vec<(TubeIx, u64)>, Vec<(usize, TubeIx)>);

impl Router {
    /// Why drop `g` of tube `head`, its checks begun at `since`, cannot be committed (a check
    /// refused, the tube gone, too late, or a checked set whose primary's term is not known),
    /// or `None`; then `g.checked_by` names every set that checked (this node's own, in the
    /// term it checked in), which the commit requires to lead still.
    fn drop_refusal(&self, g: &mut Gather, head: TubeIx, since: Instant) -> Option<Refusal> {
        if let Some(e) = g.error.take() {
            return Some(e);
        }
        let Some(t) = self.tubes.get(&head) else {
            return Some(tarq_engine::QueueError::TubeNotFound(head).into());
        };
        let nothing = "nothing was dropped";
        if since.elapsed() >= drop_hold::DROP_COMMIT_WITHIN {
            return Some(Refusal::Shards(format!(
                "the checks of tube {}'s partitions took {} ms, longer than a drop may hold \
                 them: {nothing}",
                t.name,
                since.elapsed().as_millis()
            )));
        }
        for &(set, _) in &g.asked {
            let name = &self.sets[set].name;
            if !g.checked_by.iter().any(|(s, _)| s == name) {
                let why = format!(
                    "replica set {name} had no known primary when it passed its check of tube \
                     {}: {nothing}",
                    t.name
                );
                return Some(Refusal::Shards(why));
            }
        }
        None
    }
}

impl Router {
    /// `drop` of placed tube `head` for `client`.
    pub(super) fn drop_placed(
        &mut self,
        cx: &mut Ctx<'_>,
        client: Client,
        head: TubeIx,
        leads: bool,
    ) {
        let Some(t) = self.tubes.get(&head) else {
            return;
        };
        let (name, parts) = (t.name.clone(), t.parts.clone());
        let under_way = (self.gathers.values()).any(|g| g.kind == GatherKind::Drop { head })
            || self.drops.values().any(|d| d.parts.first() == Some(&head));
        if under_way {
            let why = format!("a drop of tube {name} through this node is under way already");
            return self.answer(cx, client, &Outcome::Error(Refusal::Shards(why)));
        }
        let (floors, asks) = match self.check_own_parts(cx, &parts, leads) {
            Ok(checks) => checks,
            Err(e) => return self.answer(cx, client, &Outcome::Error(e)),
        };
        // Its own partitions were checked in the term it leads in now (they were `here`).
        let term = cx.cluster().and_then(|c| c.leading_term());
        let own_check = match (floors.is_empty(), term) {
            (false, Some(term)) => Some((self.set.clone(), term)),
            _ => None,
        };
        let key = self.next_gather;
        self.next_gather += 1;
        let mut gather = Gather::new(client, asks.len(), GatherKind::Drop { head });
        gather.floors = floors;
        gather.asked = asks.clone();
        gather.since = Some(Instant::now());
        gather.checked_by.extend(own_check);
        self.gathers.insert(key, gather);
        if asks.is_empty() {
            return self.drop_checked(cx, key);
        }
        for (set, ix) in asks {
            let cmd = Command::DropCheck { tube: ix };
            self.forward(cx, set, client, cmd, Then::GatherTube { key, head: ix });
        }
    }

    /// The checks of the partitions `parts` this node leads, each held once it passes (all
    /// let go again if one refuses), and the other partitions' owners to ask.
    fn check_own_parts(
        &mut self,
        cx: &mut Ctx<'_>,
        parts: &[TubeIx],
        leads: bool,
    ) -> Result<Checks, Refusal> {
        let me = Arc::clone(&self.me);
        let (mut floors, mut asks) = (Vec::new(), Vec::new());
        for &ix in parts {
            let (here, part) = (self.here(ix, leads), self.part(ix));
            if here {
                let (core, wire) = cx.split();
                match core.may_drop(ix, wire) {
                    Ok(next) => floors.push((ix, next)),
                    Err(e) => {
                        let held: Vec<TubeIx> = floors.iter().map(|&(ix, _)| ix).collect();
                        self.end_own_drop_holds(cx, &held);
                        return Err(e);
                    }
                }
                self.hold_for_drop(cx, ix, &me);
            } else if let Some(p) = part {
                asks.push((p.set, ix));
            }
        }
        Ok((floors, asks))
    }

    /// Every partition was asked: if each may go, the tube leaves the placement, with each
    /// index's floor; else the drop is given up.
    pub(super) fn drop_checked(&mut self, cx: &mut Ctx<'_>, key: u64) {
        let Some(mut g) = self.gathers.remove(&key) else {
            return;
        };
        let GatherKind::Drop { head } = g.kind else {
            return;
        };
        let own: Vec<TubeIx> = g.floors.iter().map(|&(ix, _)| ix).collect();
        let since = g.since.unwrap_or_else(Instant::now);
        if let Some(e) = self.drop_refusal(&mut g, head, since) {
            self.give_up_drop(cx, &own, &g.asked);
            return self.answer(cx, g.client, &Outcome::Error(e));
        }
        let Some(t) = self.tubes.get(&head) else {
            return;
        };
        // The placement names floors by partition number.
        let floors = (g.floors.iter())
            .filter_map(|&(ix, next)| Some((t.parts.iter().position(|&p| p == ix)? as u16, next)))
            .collect();
        let (name, parts) = (t.name.clone(), t.parts.clone());
        let token = self.next_token;
        self.next_token += 1;
        let dropping = Dropping {
            client: g.client,
            parts,
            asked: g.asked,
        };
        self.drops.insert(token, dropping);
        if let Some(c) = cx.cluster() {
            let drop = tarq_cluster::DropCommit {
                name,
                floors,
                checked_by: g.checked_by,
                not_after: since + drop_hold::DROP_COMMIT_WITHIN,
            };
            c.handle().drop_tube(token, drop);
        }
    }

    /// A drop given up before its commit: this node's holds of `own` end, and every owner
    /// asked is told, so its partition serves again at once (one that does not hear of it
    /// reads the placement when its hold runs out).
    fn give_up_drop(&mut self, cx: &mut Ctx<'_>, own: &[TubeIx], asked: &[(usize, TubeIx)]) {
        self.end_own_drop_holds(cx, own);
        for &(set, ix) in asked {
            self.send_own(cx, set, &Ask::DropOff { index: ix });
        }
    }

    /// A drop this node asked etcd for was made (or refused, or its fate is unknown).
    pub(super) fn drop_done(
        &mut self,
        cx: &mut Ctx<'_>,
        d: Dropping,
        result: Result<tarq_cluster::TubePlacement, tarq_cluster::PlacementError>,
    ) {
        match result {
            Ok(_) => {
                for ix in &d.parts {
                    if let Some(p) = self.parts.get_mut(*ix as usize) {
                        *p = None;
                    }
                }
                self.tubes.remove(&d.parts[0]);
                self.let_go(cx, &d.parts);
                // The tube is gone: every hold of its partitions ends, another drop's too.
                self.end_drop_holds_of(cx, &d.parts);
                self.answer(cx, d.client, &Outcome::Dropped);
            }
            // etcd may have made it and lost only the answer: the holds stay until they run
            // out and the placement is read.
            Err(tarq_cluster::PlacementError::Etcd(e)) => {
                let why = format!(
                    "etcd did not answer the drop's commit ({e}): it may or may not have been made"
                );
                self.answer(cx, d.client, &Outcome::Error(Refusal::Unknown(why)));
            }
            Err(e) => {
                self.give_up_drop(cx, &d.parts, &d.asked);
                self.answer(
                    cx,
                    d.client,
                    &Outcome::Error(Refusal::Shards(e.to_string())),
                );
            }
        }
    }

    /// Lets go of the partitions at `indexes`, no longer placed: waiting takes on their tube
    /// are answered with no task, and a primary drops what it held of them.
    pub(super) fn let_go(&mut self, cx: &mut Ctx<'_>, indexes: &[TubeIx]) {
        if indexes.is_empty() {
            return;
        }
        let waiting: Vec<u64> = (self.waiters.iter())
            .filter(|(_, w)| w.heads.iter().any(|h| indexes.contains(h)))
            .map(|(&id, _)| id)
            .collect();
        for id in waiting {
            if let Some(w) = self.waiters.get(&id).map(|w| w.client) {
                self.end_wait(cx, id);
                self.answer(cx, w, &Outcome::Nothing);
            }
        }
        // What others said of takes waiting on the tube goes with it (they end theirs).
        for &ix in indexes {
            self.wait_counts.forget(ix);
        }
        self.watching.retain(|ix, _| !indexes.contains(ix));
        if !cx.leads() {
            return;
        }
        for &ix in indexes {
            let (core, wire) = cx.split();
            core.drop_placed(ix, wire);
        }
        self.take_routed(cx);
    }
}
