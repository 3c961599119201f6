//! Takes waiting on a partitioned tube, counted once for the whole cluster. A take that
//! waits across partitions lives in the router of the node it came through, and watches every
//! partition of its tube (one watch a partition however many takes wait, in the owners'
//! cores): counting parked entries per partition counted a take once per partition it
//! watched, and a watch once however many takes it stood for. So a watch is not counted as a
//! taker, and each node's router tells the owner of the tube's first partition (its head)
//! how many of its takes wait on the tube; that owner's core adds them all to the head
//! partition's `takers_waiting`. A tube's figure summed over its partitions — from any node,
//! as `queue.statistics` and the console do, or over every node's `/metrics` — then counts each
//! waiting take once.
//!
//! [`WaitCounts`] is the bookkeeping alone, with no I/O: what changed goes out as
//! [`Publish`] orders that the router carries out (`waits.rs`) (the owner's core, or an
//! [`Ask::Waiting`](crate::frontend::link::wire::Ask::Waiting) on the link to the owner's set).
//! A link that closes takes its node's counts with it; a node that opens a link to a set
//! tells it again, as it does after every new map, and a node whose link failed opens one to
//! tell it again a second later (not every turn: the set may have no primary). An owner that no longer serves a head
//! forgets what it heard of it: the others tell the new owner once their maps say so.

use std::collections::{BTreeSet, HashMap};

use tarq_engine::{Micros, TubeIx};

/// Where a tube's head partition is served, as this node sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Owner {
    /// Here: this node's core carries the tube's count.
    Here,
    /// By the primary of this set (its slot).
    Set(usize),
    /// Nowhere this node knows of now (no map yet, or the tube is gone).
    Unknown,
}

/// What the counts ask to be done.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Publish {
    /// Set the takes waiting on tube `head` elsewhere than in this core's own parked takes.
    Core { head: TubeIx, count: u64 },
    /// Tell set `set`'s primary that `count` of this node's takes wait on tube `head`.
    Tell {
        set: usize,
        head: TubeIx,
        count: u64,
    },
}

/// Counts of takes waiting across partitions: this node's own, and — for the tubes whose head
/// it owns — the other nodes'.
#[derive(Debug, Default)]
pub(super) struct WaitCounts {
    /// This node's routed takes waiting, by tube head.
    own: HashMap<TubeIx, u64>,
    /// What other nodes said of their takes, by tube head and node, with the link connection
    /// they said it on (a node's newer link replaces its older one's word).
    heard: HashMap<TubeIx, HashMap<String, (usize, u64)>>,
    /// What this node last told each head's owner: the set, and the count.
    told: HashMap<TubeIx, (usize, u64)>,
    /// What this node's core was last given, by head.
    in_core: HashMap<TubeIx, u64>,
    /// Heads whose figure may have changed since the last [`WaitCounts::publish`].
    dirty: BTreeSet<TubeIx>,
    /// Heads whose owner lost what it was told (its link failed, or the tell could not be
    /// sent), told again at `retry_at`.
    lost: BTreeSet<TubeIx>,
    retry_at: Option<Micros>,
}

/// How long after a lost tell it is tried again: a set whose primary is down is not asked to
/// connect every turn.
pub(super) const RETRY: Micros = 1_000_000;

impl WaitCounts {
    /// One more of this node's takes waits on tube `head`.
    pub(super) fn started(&mut self, head: TubeIx) {
        *self.own.entry(head).or_default() += 1;
        self.dirty.insert(head);
    }

    /// One of this node's takes waiting on tube `head` is answered or gone.
    pub(super) fn ended(&mut self, head: TubeIx) {
        if let Some(n) = self.own.get_mut(&head) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                self.own.remove(&head);
            }
        }
        self.dirty.insert(head);
    }

    /// Whether a head's figure may have changed since the last publish.
    pub(super) fn is_dirty(&self) -> bool {
        !self.dirty.is_empty()
    }

    /// This node's takes waiting on tube `head` now.
    pub(super) fn own(&self, head: TubeIx) -> u64 {
        self.own.get(&head).copied().unwrap_or(0)
    }

    /// Node `from`, on link connection `conn`, says `count` of its takes wait on tube `head`.
    pub(super) fn heard(&mut self, conn: usize, from: &str, head: TubeIx, count: u64) {
        let of = self.heard.entry(head).or_default();
        match count {
            0 => of.remove(from),
            n => of.insert(from.to_owned(), (conn, n)),
        };
        if of.is_empty() {
            self.heard.remove(&head);
        }
        self.dirty.insert(head);
    }

    /// Link connection `conn` closed: what its node said no longer counts (it tells again
    /// on its next link).
    pub(super) fn link_closed(&mut self, conn: usize) {
        for (&head, of) in &mut self.heard {
            let before = of.len();
            of.retain(|_, (c, _)| *c != conn);
            if of.len() != before {
                self.dirty.insert(head);
            }
        }
        self.heard.retain(|_, of| !of.is_empty());
    }

    /// The link to set `set` failed at `now`: what was told there is gone with it, and is
    /// told again a moment later (the link opens again to carry it).
    pub(super) fn set_lost(&mut self, set: usize, now: Micros) {
        let heads: Vec<TubeIx> = (self.told.iter())
            .filter(|(_, (s, _))| *s == set)
            .map(|(&h, _)| h)
            .collect();
        for head in heads {
            self.told.remove(&head);
            self.lose(head, now);
        }
    }

    fn lose(&mut self, head: TubeIx, now: Micros) {
        self.lost.insert(head);
        self.retry_at.get_or_insert(now.saturating_add(RETRY));
    }

    /// When lost tells are tried again.
    pub(super) fn next_retry(&self) -> Option<Micros> {
        self.retry_at
    }

    /// At `now`: the lost tells due are looked at again.
    pub(super) fn retry_due(&mut self, now: Micros) {
        if self.retry_at.is_some_and(|at| at <= now) {
            self.retry_at = None;
            let lost = std::mem::take(&mut self.lost);
            self.dirty.extend(lost);
        }
    }

    /// Tube `head` is gone (dropped): nothing of it is kept, and the core's count goes.
    pub(super) fn forget(&mut self, head: TubeIx) {
        self.heard.remove(&head);
        self.told.remove(&head);
        self.lost.remove(&head);
        if self.in_core.contains_key(&head) {
            self.dirty.insert(head);
        }
    }

    /// A new link to set `set` opened: tell it again (what it had went with the old link).
    /// Heads told elsewhere are left alone; a head whose owner is `set` but was never told
    /// is dirty already, or zero.
    pub(super) fn set_linked(&mut self, set: usize) {
        self.told.retain(|_, (s, _)| *s != set);
        self.dirty.extend(self.own.keys().copied());
    }

    /// Everything may have moved (a new map): every head is looked at again.
    pub(super) fn all_dirty(&mut self) {
        let heads = (self.own.keys())
            .chain(self.heard.keys())
            .chain(self.told.keys())
            .chain(self.in_core.keys());
        self.dirty.extend(heads.copied());
    }

    /// What must be done for the heads that changed, given where each is served. A `Tell`
    /// is taken as told when returned: the caller says [`WaitCounts::not_told`] if it could
    /// not send it.
    pub(super) fn publish(&mut self, owner: impl Fn(TubeIx) -> Owner) -> Vec<Publish> {
        let mut out = Vec::new();
        for head in std::mem::take(&mut self.dirty) {
            let own = self.own(head);
            let here = match owner(head) {
                Owner::Here => {
                    // Counts from the network: summed without overflow whatever they say.
                    let heard = (self.heard.get(&head).into_iter())
                        .flat_map(|of| of.values())
                        .fold(0u64, |a, &(_, n)| a.saturating_add(n));
                    Some(own.saturating_add(heard))
                }
                Owner::Set(set) => {
                    self.heard.remove(&head);
                    let before = self.told.get(&head).copied();
                    // Zero needs saying only where a count was said before.
                    let needed = own > 0 || before.is_some_and(|(s, n)| s == set && n > 0);
                    if needed && before != Some((set, own)) {
                        out.push(Publish::Tell {
                            set,
                            head,
                            count: own,
                        });
                    }
                    match own {
                        0 => self.told.remove(&head),
                        n => self.told.insert(head, (set, n)),
                    };
                    None
                }
                Owner::Unknown => {
                    self.heard.remove(&head);
                    None
                }
            };
            let core = here.unwrap_or(0);
            if self.in_core.get(&head).copied().unwrap_or(0) != core {
                out.push(Publish::Core { head, count: core });
            }
            match core {
                0 => self.in_core.remove(&head),
                n => self.in_core.insert(head, n),
            };
            if here.is_some() {
                self.told.remove(&head);
            }
        }
        out
    }

    /// A `Tell` to `set` for `head` could not be sent at `now` (the set has no link and none
    /// opens): said again a moment later, or when a link to it opens or the map changes.
    pub(super) fn not_told(&mut self, set: usize, head: TubeIx, now: Micros) {
        if self.told.get(&head).is_some_and(|(s, _)| *s == set) {
            self.told.remove(&head);
            self.lose(head, now);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tells(out: &[Publish]) -> Vec<(usize, TubeIx, u64)> {
        (out.iter())
            .filter_map(|p| match *p {
                Publish::Tell { set, head, count } => Some((set, head, count)),
                Publish::Core { .. } => None,
            })
            .collect()
    }

    fn cores(out: &[Publish]) -> Vec<(TubeIx, u64)> {
        (out.iter())
            .filter_map(|p| match *p {
                Publish::Core { head, count } => Some((head, count)),
                Publish::Tell { .. } => None,
            })
            .collect()
    }

    #[test]
    fn the_owner_of_the_head_counts_its_own_and_what_it_heard() {
        let mut w = WaitCounts::default();
        w.started(4);
        w.started(4);
        w.heard(17, "x", 4, 3);
        w.heard(18, "y", 4, 1);
        let out = w.publish(|_| Owner::Here);
        assert_eq!(cores(&out), vec![(4, 6)]);
        assert!(tells(&out).is_empty());
        w.heard(17, "x", 4, 0);
        w.ended(4);
        assert_eq!(cores(&w.publish(|_| Owner::Here)), vec![(4, 2)]);
        w.link_closed(18);
        w.ended(4);
        assert_eq!(cores(&w.publish(|_| Owner::Here)), vec![(4, 0)]);
        assert!(w.publish(|_| Owner::Here).is_empty(), "nothing changed");
    }

    #[test]
    fn a_nodes_new_link_replaces_its_old_ones_word() {
        let mut w = WaitCounts::default();
        w.heard(17, "x", 4, 3);
        // Node x's old link is half open; it tells again on a new one.
        w.heard(21, "x", 4, 2);
        assert_eq!(cores(&w.publish(|_| Owner::Here)), vec![(4, 2)]);
        // The old link's close takes nothing of the new one's word.
        w.link_closed(17);
        assert!(w.publish(|_| Owner::Here).is_empty());
        w.link_closed(21);
        assert_eq!(cores(&w.publish(|_| Owner::Here)), vec![(4, 0)]);
    }

    #[test]
    fn another_node_tells_the_owner_once_per_change() {
        let mut w = WaitCounts::default();
        w.started(4);
        w.started(4);
        w.started(9);
        let out = w.publish(|h| if h == 4 { Owner::Set(1) } else { Owner::Set(2) });
        let mut t = tells(&out);
        t.sort();
        assert_eq!(t, vec![(1, 4, 2), (2, 9, 1)]);
        assert!(
            cores(&out).is_empty(),
            "the core counts nothing it does not own"
        );
        // A start and an end in one turn: nothing to tell.
        w.started(4);
        w.ended(4);
        assert!(w.publish(|_| Owner::Set(1)).is_empty());
        w.ended(4);
        w.ended(4);
        assert_eq!(tells(&w.publish(|_| Owner::Set(1))), vec![(1, 4, 0)]);
        // Nothing waits, nothing was told: a new map says nothing.
        w.all_dirty();
        let out = w.publish(|h| if h == 4 { Owner::Set(3) } else { Owner::Set(2) });
        assert!(out.is_empty(), "{out:?}");
    }

    #[test]
    fn a_head_that_moves_is_told_to_its_new_owner_and_its_old_count_leaves_the_core() {
        let mut w = WaitCounts::default();
        w.started(4);
        w.heard(17, "x", 4, 2);
        assert_eq!(cores(&w.publish(|_| Owner::Here)), vec![(4, 3)]);
        // The head moved to set 1: the core drops the tube's count, the owner hears ours.
        w.all_dirty();
        let out = w.publish(|_| Owner::Set(1));
        assert_eq!(cores(&out), vec![(4, 0)]);
        assert_eq!(tells(&out), vec![(1, 4, 1)]);
        // And back: the core counts its own, and what the others tell it again (what it
        // heard while it owned the tube before was let go with it).
        w.all_dirty();
        assert_eq!(cores(&w.publish(|_| Owner::Here)), vec![(4, 1)]);
        w.heard(17, "x", 4, 2);
        assert_eq!(cores(&w.publish(|_| Owner::Here)), vec![(4, 3)]);
    }

    #[test]
    fn a_lost_link_is_told_again_a_moment_later_or_when_a_new_one_opens() {
        let mut w = WaitCounts::default();
        w.started(4);
        assert_eq!(tells(&w.publish(|_| Owner::Set(1))), vec![(1, 4, 1)]);
        w.set_lost(1, 10);
        assert!(w.publish(|_| Owner::Set(1)).is_empty(), "not at once");
        assert_eq!(w.next_retry(), Some(10 + RETRY));
        w.retry_due(10 + RETRY - 1);
        assert!(
            w.publish(|_| Owner::Set(1)).is_empty(),
            "not before its time"
        );
        w.retry_due(10 + RETRY);
        assert_eq!(tells(&w.publish(|_| Owner::Set(1))), vec![(1, 4, 1)]);
        assert_eq!(w.next_retry(), None);
        // A new link is told at once.
        w.set_linked(1);
        assert_eq!(tells(&w.publish(|_| Owner::Set(1))), vec![(1, 4, 1)]);
        // A tell that could not be sent goes again a moment later.
        w.started(4);
        assert_eq!(tells(&w.publish(|_| Owner::Set(1))), vec![(1, 4, 2)]);
        w.not_told(1, 4, 50);
        w.retry_due(50 + RETRY);
        assert_eq!(tells(&w.publish(|_| Owner::Set(1))), vec![(1, 4, 2)]);
    }

    #[test]
    fn a_dropped_tube_leaves_nothing_and_counts_from_the_network_do_not_overflow() {
        let mut w = WaitCounts::default();
        w.heard(17, "x", 4, u64::MAX);
        w.heard(18, "y", 4, 5);
        w.started(4);
        assert_eq!(cores(&w.publish(|_| Owner::Here)), vec![(4, u64::MAX)]);
        w.ended(4);
        w.forget(4);
        assert_eq!(cores(&w.publish(|_| Owner::Here)), vec![(4, 0)]);
        assert!(w.heard.is_empty() && w.in_core.is_empty());
    }

    #[test]
    fn an_unknown_owner_gets_nothing_and_the_core_nothing() {
        let mut w = WaitCounts::default();
        w.started(4);
        assert!(w.publish(|_| Owner::Unknown).is_empty());
        w.all_dirty();
        assert_eq!(tells(&w.publish(|_| Owner::Set(0))), vec![(0, 4, 1)]);
    }
}
