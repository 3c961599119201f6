//! Parked takes: take requests (of any front-end) waiting for a task of their tube. They live in
//! the server, not the engine. Each tube's waiters are served oldest first from its own FIFO
//! (no scan of all waiters), and one min-heap of deadlines answers "who timed out" and "when
//! must the loop wake". Both are lazy: an entry whose take was served, timed out or whose
//! connection closed is skipped when it reaches the front, and both are compacted when stale
//! entries outnumber live ones. A parked take keeps its front-end's reply token `R`, so it is
//! answered in the protocol of the connection that parked it; each connection's takes are
//! listed, so a close drops them without a search.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};

use slab::Slab;
use tarq_engine::{Micros, TubeIx};

use super::Caller;

/// Parked takes one connection may hold: Tarantool runs each request in a fiber and caps them
/// at `net_msg_max` = 768 per connection, so no real client parks more.
pub const MAX_PARKED_PER_CONN: usize = 768;

/// Stale FIFO/heap entries tolerated beyond the live ones before a compaction.
const COMPACT_SLACK: usize = 1024;

/// A waiting take.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ParkedTake<R> {
    /// Who waits (its connection may be gone by the time it is served).
    pub caller: Caller,
    pub tube: TubeIx,
    /// How its front-end answers it.
    pub reply: R,
    /// The takes parked by one request share it (a beanstalk reserve parks on every tube it
    /// watches): the first served ends the others.
    pub group: u64,
    /// `Micros::MAX`: no deadline.
    pub deadline: Micros,
    /// A watch (`Command::Watch`): answered when the tube has a task, which it leaves there.
    pub wake_only: bool,
    /// Unique per park, so a reused slab key is never mistaken for the old entry.
    seq: u64,
}

#[derive(Debug)]
pub struct Parked<R> {
    takes: Slab<ParkedTake<R>>,
    /// By connection slot: the keys of its parked takes (at most [`MAX_PARKED_PER_CONN`]).
    by_conn: Vec<Vec<usize>>,
    /// By tube index: that tube's waiters in arrival order, with their live count.
    fifos: Vec<(VecDeque<(usize, u64)>, usize)>,
    /// By tube index: its live takes that are not watches (a consumer's figure).
    takers: Vec<usize>,
    /// Tubes with live waiters, in no order.
    busy: Vec<TubeIx>,
    deadlines: BinaryHeap<Reverse<(Micros, u64, usize)>>,
    next_seq: u64,
}

impl<R> Default for Parked<R> {
    fn default() -> Self {
        Parked {
            takes: Slab::new(),
            by_conn: Vec::new(),
            fifos: Vec::new(),
            takers: Vec::new(),
            busy: Vec::new(),
            deadlines: BinaryHeap::new(),
            next_seq: 0,
        }
    }
}

impl<R> Parked<R> {
    pub fn len(&self) -> usize {
        self.takes.len()
    }

    pub fn is_empty(&self) -> bool {
        self.takes.is_empty()
    }

    /// A new group for the takes one request parks.
    pub fn new_group(&mut self) -> u64 {
        self.next_seq += 1;
        self.next_seq
    }

    /// Parks a take of `caller` on `tube`, in `group`; returns its key.
    pub fn park(
        &mut self,
        caller: Caller,
        tube: TubeIx,
        reply: R,
        deadline: Micros,
        group: u64,
    ) -> usize {
        self.park_entry(caller, tube, reply, deadline, group, false)
    }

    fn park_entry(
        &mut self,
        caller: Caller,
        tube: TubeIx,
        reply: R,
        deadline: Micros,
        group: u64,
        wake_only: bool,
    ) -> usize {
        self.next_seq += 1;
        let seq = self.next_seq;
        let key = self.takes.insert(ParkedTake {
            caller,
            tube,
            group,
            reply,
            deadline,
            wake_only,
            seq,
        });
        let c = caller.slot();
        if self.by_conn.len() <= c {
            self.by_conn.resize_with(c + 1, Vec::new);
        }
        self.by_conn[c].push(key);
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
        if !wake_only {
            if self.takers.len() <= t {
                self.takers.resize(t + 1, 0);
            }
            self.takers[t] += 1;
        }
        if deadline != Micros::MAX {
            self.deadlines.push(Reverse((deadline, seq, key)));
        }
        key
    }

    /// Parks a watch of `caller` on `tubes`, in a group of its own (returned): served like a
    /// take, answered without taking.
    pub fn park_watch(&mut self, caller: Caller, tubes: &[TubeIx], reply: R) -> u64
    where
        R: Copy,
    {
        let group = self.new_group();
        for &tube in tubes {
            self.park_entry(caller, tube, reply, Micros::MAX, group, true);
        }
        group
    }

    fn live(&self, key: usize, seq: u64) -> bool {
        self.takes.get(key).is_some_and(|t| t.seq == seq)
    }

    /// Takes a live entry out, keeping its tube's live count.
    fn take_out(&mut self, key: usize) -> ParkedTake<R> {
        let t = self.takes.remove(key);
        let keys = &mut self.by_conn[t.caller.slot()];
        if let Some(pos) = keys.iter().position(|&k| k == key) {
            keys.swap_remove(pos);
        }
        if !t.wake_only {
            self.takers[t.tube as usize] -= 1;
        }
        let live = &mut self.fifos[t.tube as usize].1;
        *live -= 1;
        if *live == 0 {
            self.busy.retain(|&b| b != t.tube);
            self.fifos[t.tube as usize].0.clear();
        }
        t
    }

    /// Removes a parked take. Its queue entries go stale.
    pub fn remove(&mut self, key: usize) -> Option<ParkedTake<R>> {
        let t = self.takes.contains(key).then(|| self.take_out(key));
        self.maybe_compact();
        t
    }

    /// Removes every take connection `conn` parked (it closed, or its wait ended).
    pub fn remove_conn(&mut self, conn: usize) {
        while let Some(&key) = self.by_conn.get(conn).and_then(|keys| keys.last()) {
            self.remove(key);
        }
    }

    /// Removes the takes of connection `conn` in `group` (one of them was answered).
    pub fn remove_group(&mut self, conn: usize, group: u64) {
        let Some(keys) = self.by_conn.get(conn) else {
            return;
        };
        let takes = &self.takes;
        let same: Vec<usize> = (keys.iter().copied())
            .filter(|&k| takes.get(k).is_some_and(|t| t.group == group))
            .collect();
        for key in same {
            self.remove(key);
        }
    }

    /// Removes the watches of connection `conn` answered as `reply` (their whole groups).
    pub fn remove_watches(&mut self, conn: usize, reply: R)
    where
        R: PartialEq,
    {
        let Some(keys) = self.by_conn.get(conn) else {
            return;
        };
        let takes = &self.takes;
        let groups: Vec<u64> = (keys.iter())
            .filter_map(|&k| takes.get(k))
            .filter(|t| t.wake_only && t.reply == reply)
            .map(|t| t.group)
            .collect();
        for group in groups {
            self.remove_group(conn, group);
        }
    }

    /// How many takes connection `conn` has parked.
    pub fn count_of(&self, conn: usize) -> usize {
        self.by_conn.get(conn).map_or(0, Vec::len)
    }

    /// How many takes wait on `tube`.
    pub fn count_in(&self, tube: TubeIx) -> usize {
        self.fifos.get(tube as usize).map_or(0, |f| f.1)
    }

    /// How many takes wait on `tube`, watches left out: a watch stands for takes waiting in a
    /// router (of this node or another), which counts them itself.
    pub fn takers_in(&self, tube: TubeIx) -> usize {
        self.takers.get(tube as usize).copied().unwrap_or(0)
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
    pub fn pop_oldest(&mut self, tube: TubeIx) -> Option<(usize, ParkedTake<R>)> {
        while let Some((key, seq)) = self.fifos.get_mut(tube as usize)?.0.pop_front() {
            if self.live(key, seq) {
                return Some((key, self.take_out(key)));
            }
        }
        None
    }

    /// Any waiter, removed from the queue (a stop answers them all).
    pub fn pop_any(&mut self) -> Option<(usize, ParkedTake<R>)> {
        let tube = *self.busy.first()?;
        self.pop_oldest(tube)
    }

    /// A waiter whose deadline is `<= now`, removed from the queue.
    pub fn pop_expired(&mut self, now: Micros) -> Option<(usize, ParkedTake<R>)> {
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

    fn reply(sync: u64) -> u64 {
        sync
    }

    fn caller(conn: usize, gen: u32) -> Caller {
        Caller::new(conn, gen, 1)
    }

    #[test]
    fn a_watch_is_dropped_by_its_reply_and_nothing_else_is() {
        let mut p = Parked::<u64>::default();
        p.park_watch(caller(1, 1), &[0, 1], reply(7));
        p.park_watch(caller(1, 1), &[0], reply(8));
        let group = p.new_group();
        p.park(caller(1, 1), 0, reply(7), Micros::MAX, group);
        p.park_watch(caller(2, 1), &[0], reply(7));
        p.remove_watches(1, reply(7));
        assert_eq!(p.count_of(1), 2, "the other watch and the take stay");
        assert_eq!((p.count_in(0), p.count_in(1)), (3, 0));
        assert_eq!(
            (p.takers_in(0), p.takers_in(1)),
            (1, 0),
            "a watch is no taker"
        );
        assert_eq!(p.count_of(2), 1, "another connection's stays");
        p.remove_watches(1, reply(7));
        assert_eq!(p.len(), 3);
    }

    #[test]
    fn oldest_first_and_expiry_by_deadline() {
        let mut p = Parked::<u64>::default();
        let a = p.park(caller(1, 1), 0, reply(100), 50, 0);
        let _b = p.park(caller(2, 1), 0, reply(200), 30, 0);
        let c = p.park(caller(3, 1), 0, reply(300), 40, 0);
        assert_eq!(p.next_deadline(), Some(30));
        assert_eq!(p.pop_expired(29), None);
        let (_, t) = p.pop_expired(35).unwrap();
        assert_eq!(t.reply, reply(200));
        assert_eq!(p.pop_expired(35), None);
        assert_eq!(p.remove(c).map(|t| t.caller.slot()), Some(3));
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
        let mut p = Parked::<u64>::default();
        let a = p.park(caller(1, 1), 0, reply(1), 100, 0);
        p.remove(a);
        let b = p.park(caller(1, 2), 0, reply(2), 200, 0);
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
        let mut p = Parked::<u64>::default();
        p.park(caller(1, 1), 3, reply(1), Micros::MAX, 0);
        p.park(caller(2, 1), 0, reply(2), Micros::MAX, 0);
        p.park(caller(3, 1), 3, reply(3), 10, 0);
        assert!(p.waiting_in(3) && p.waiting_in(0) && !p.waiting_in(1));
        assert_eq!(p.pop_oldest(3).map(|(_, t)| t.reply), Some(reply(1)));
        assert_eq!(p.pop_expired(10).map(|(_, t)| t.caller.slot()), Some(3));
        assert!(!p.waiting_in(3), "the last waiter of tube 3 timed out");
        assert_eq!(p.waiting_tube(0), Some(0));
        assert_eq!(p.waiting_tube(1), None);
        assert_eq!(p.next_deadline(), None, "an endless take has no deadline");
    }

    #[test]
    fn a_group_goes_when_one_of_it_is_answered_and_a_close_drops_all() {
        let mut p = Parked::<u64>::default();
        let g = p.new_group();
        p.park(caller(1, 1), 0, reply(1), Micros::MAX, g);
        p.park(caller(1, 1), 2, reply(1), Micros::MAX, g);
        let other = p.new_group();
        p.park(caller(1, 1), 0, reply(2), Micros::MAX, other);
        p.park(caller(4, 1), 2, reply(3), 10, 99);
        assert_eq!(p.count_of(1), 3);
        let (_, t) = p.pop_oldest(0).unwrap();
        p.remove_group(t.caller.slot(), t.group);
        assert_eq!(p.count_of(1), 1, "the other take of the group went");
        assert!(p.waiting_in(2), "connection 4's take on tube 2 stays");
        p.remove_conn(1);
        assert_eq!(p.count_of(1), 0);
        assert!(!p.waiting_in(0));
        assert_eq!(p.len(), 1);
    }

    #[test]
    fn stale_entries_are_compacted() {
        let mut p = Parked::<u64>::default();
        for i in 0..10_000 {
            let k = p.park(caller(1, 1), 0, reply(i), 1_000_000 + i, 0);
            p.remove(k);
        }
        assert!(p.fifos[0].0.len() <= COMPACT_SLACK + 1);
        assert!(p.deadlines.len() <= COMPACT_SLACK + 1);
    }
}
