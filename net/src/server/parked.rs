//! Parked takes: take requests (of any front-end) waiting for a task of their tube. They live in
//! the server, not the engine. Each tube's waiters are served oldest first from its own FIFO
//! (no scan of all waiters), and one min-heap of deadlines answers "who timed out" and "when
//! must the loop wake". Both are lazy: an entry whose take was served, timed out or whose
//! connection closed is skipped when it reaches the front, and both are compacted when stale
//! entries outnumber live ones. A parked take keeps its front-end's [`ReplyTo`], so it is
//! answered in the protocol of the connection that parked it.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};

use slab::Slab;
use tarq_engine::{Micros, TubeIx};

use crate::frontend::ReplyTo;

/// Parked takes one connection may hold: Tarantool runs each request in a fiber and caps them
/// at `net_msg_max` = 768 per connection, so no real client parks more.
pub const MAX_PARKED_PER_CONN: usize = 768;

/// Stale FIFO/heap entries tolerated beyond the live ones before a compaction.
const COMPACT_SLACK: usize = 1024;

/// A waiting take.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ParkedTake {
    /// The connection's slot and generation, to find it (or learn it is gone).
    pub conn: usize,
    pub gen: u32,
    pub tube: TubeIx,
    /// How its front-end answers it.
    pub reply: ReplyTo,
    /// `Micros::MAX`: no deadline.
    pub deadline: Micros,
    /// Unique per park, so a reused slab key is never mistaken for the old entry.
    seq: u64,
}

#[derive(Debug, Default)]
pub struct Parked {
    takes: Slab<ParkedTake>,
    /// By tube index: that tube's waiters in arrival order, with their live count.
    fifos: Vec<(VecDeque<(usize, u64)>, usize)>,
    /// Tubes with live waiters, in no order.
    busy: Vec<TubeIx>,
    deadlines: BinaryHeap<Reverse<(Micros, u64, usize)>>,
    next_seq: u64,
}

impl Parked {
    pub fn len(&self) -> usize {
        self.takes.len()
    }

    pub fn is_empty(&self) -> bool {
        self.takes.is_empty()
    }

    /// Parks a take on `tube`; returns its key (the connection keeps it to drop it on close).
    pub fn park(
        &mut self,
        conn: usize,
        gen: u32,
        tube: TubeIx,
        reply: ReplyTo,
        deadline: Micros,
    ) -> usize {
        self.next_seq += 1;
        let seq = self.next_seq;
        let key = self.takes.insert(ParkedTake {
            conn,
            gen,
            tube,
            reply,
            deadline,
            seq,
        });
        let t = tube as usize;
        if self.fifos.len() <= t {
            self.fifos.resize_with(t + 1, Default::default);
        }
        let (fifo, live) = &mut self.fifos[t];
        fifo.push_back((key, seq));
        *live += 1;
        if *live == 1 {
            self.busy.push(tube);
        }
        if deadline != Micros::MAX {
            self.deadlines.push(Reverse((deadline, seq, key)));
        }
        key
    }

    fn live(&self, key: usize, seq: u64) -> bool {
        self.takes.get(key).is_some_and(|t| t.seq == seq)
    }

    /// Takes a live entry out, keeping its tube's live count.
    fn take_out(&mut self, key: usize) -> ParkedTake {
        let t = self.takes.remove(key);
        let live = &mut self.fifos[t.tube as usize].1;
        *live -= 1;
        if *live == 0 {
            self.busy.retain(|&b| b != t.tube);
            self.fifos[t.tube as usize].0.clear();
        }
        t
    }

    /// Removes a parked take (its connection closed). Its queue entries go stale.
    pub fn remove(&mut self, key: usize) -> Option<ParkedTake> {
        let t = self.takes.contains(key).then(|| self.take_out(key));
        self.maybe_compact();
        t
    }

    /// How many takes wait on `tube`.
    pub fn count_in(&self, tube: TubeIx) -> usize {
        self.fifos.get(tube as usize).map_or(0, |f| f.1)
    }

    /// Whether a take waits on `tube`.
    pub fn waiting_in(&self, tube: TubeIx) -> bool {
        self.fifos.get(tube as usize).is_some_and(|f| f.1 > 0)
    }

    /// The `i`-th tube with waiters (for serving every tube after deadlines fired).
    pub fn waiting_tube(&self, i: usize) -> Option<TubeIx> {
        self.busy.get(i).copied()
    }

    /// The oldest waiter of `tube`, removed from the queue.
    pub fn pop_oldest(&mut self, tube: TubeIx) -> Option<(usize, ParkedTake)> {
        while let Some((key, seq)) = self.fifos.get_mut(tube as usize)?.0.pop_front() {
            if self.live(key, seq) {
                return Some((key, self.take_out(key)));
            }
        }
        None
    }

    /// Any waiter, removed from the queue (a stop answers them all).
    pub fn pop_any(&mut self) -> Option<(usize, ParkedTake)> {
        let tube = *self.busy.first()?;
        self.pop_oldest(tube)
    }

    /// A waiter whose deadline is `<= now`, removed from the queue.
    pub fn pop_expired(&mut self, now: Micros) -> Option<(usize, ParkedTake)> {
        while let Some(&Reverse((deadline, seq, key))) = self.deadlines.peek() {
            if deadline > now {
                if self.live(key, seq) {
                    return None;
                }
                self.deadlines.pop();
                continue;
            }
            self.deadlines.pop();
            if self.live(key, seq) {
                return Some((key, self.take_out(key)));
            }
        }
        None
    }

    /// The earliest deadline of a live waiter.
    pub fn next_deadline(&mut self) -> Option<Micros> {
        while let Some(&Reverse((deadline, seq, key))) = self.deadlines.peek() {
            if self.live(key, seq) {
                return Some(deadline);
            }
            self.deadlines.pop();
        }
        None
    }

    fn maybe_compact(&mut self) {
        let bound = 2 * self.takes.len() + COMPACT_SLACK;
        let takes = &self.takes;
        for (fifo, _) in &mut self.fifos {
            if fifo.len() > bound {
                fifo.retain(|&(k, s)| takes.get(k).is_some_and(|t| t.seq == s));
            }
        }
        if self.deadlines.len() > bound {
            let takes = &self.takes;
            self.deadlines
                .retain(|&Reverse((_, s, k))| takes.get(k).is_some_and(|t| t.seq == s));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::frontend::iproto::{Reply, Style};

    fn reply(sync: u64) -> ReplyTo {
        ReplyTo::Iproto(Reply {
            sync,
            call16: false,
            style: Style::Seed,
            first: 0,
        })
    }

    #[test]
    fn oldest_first_and_expiry_by_deadline() {
        let mut p = Parked::default();
        let a = p.park(1, 1, 0, reply(100), 50);
        let _b = p.park(2, 1, 0, reply(200), 30);
        let c = p.park(3, 1, 0, reply(300), 40);
        assert_eq!(p.next_deadline(), Some(30));
        assert_eq!(p.pop_expired(29), None);
        let (_, t) = p.pop_expired(35).unwrap();
        assert_eq!(t.reply, reply(200));
        assert_eq!(p.pop_expired(35), None);
        assert_eq!(p.remove(c).map(|t| t.conn), Some(3));
        assert_eq!(p.next_deadline(), Some(50));
        let (k, t) = p.pop_oldest(0).unwrap();
        assert_eq!((k, t.reply), (a, reply(100)));
        assert!(p.pop_oldest(0).is_none());
        assert_eq!(p.next_deadline(), None);
        assert!(p.is_empty());
        assert!(!p.waiting_in(0));
    }

    #[test]
    fn reused_keys_are_not_confused_with_stale_entries() {
        let mut p = Parked::default();
        let a = p.park(1, 1, 0, reply(1), 100);
        p.remove(a);
        let b = p.park(1, 2, 0, reply(2), 200);
        assert_eq!(a, b, "the slab reuses the key");
        assert_eq!(
            p.pop_expired(150),
            None,
            "the stale entry at 100 is skipped"
        );
        assert_eq!(p.pop_oldest(0).map(|(_, t)| t.reply), Some(reply(2)));
    }

    #[test]
    fn each_tube_has_its_own_waiters() {
        let mut p = Parked::default();
        p.park(1, 1, 3, reply(1), Micros::MAX);
        p.park(2, 1, 0, reply(2), Micros::MAX);
        p.park(3, 1, 3, reply(3), 10);
        assert!(p.waiting_in(3) && p.waiting_in(0) && !p.waiting_in(1));
        assert_eq!(p.pop_oldest(3).map(|(_, t)| t.reply), Some(reply(1)));
        assert_eq!(p.pop_expired(10).map(|(_, t)| t.conn), Some(3));
        assert!(!p.waiting_in(3), "the last waiter of tube 3 timed out");
        assert_eq!(p.waiting_tube(0), Some(0));
        assert_eq!(p.waiting_tube(1), None);
        assert_eq!(p.next_deadline(), None, "an endless take has no deadline");
    }

    #[test]
    fn stale_entries_are_compacted() {
        let mut p = Parked::default();
        for i in 0..10_000 {
            let k = p.park(1, 1, 0, reply(i), 1_000_000 + i);
            p.remove(k);
        }
        assert!(p.fifos[0].0.len() <= COMPACT_SLACK + 1);
        assert!(p.deadlines.len() <= COMPACT_SLACK + 1);
    }
}
