//! Parked takes: `queue.take(timeout)` requests waiting for a task. They live in the server, not
//! the engine. Waiters are served oldest first from a FIFO (no scan of all waiters), and a
//! min-heap of deadlines answers "who timed out" and "when must the loop wake". Both are lazy:
//! an entry whose take was served, timed out or whose connection closed is skipped when it
//! reaches the front, and both are compacted when stale entries outnumber live ones.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};

use slab::Slab;
use tarq_engine::{Micros, SessionId};

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
    pub sid: SessionId,
    pub sync: u64,
    pub call16: bool,
    pub deadline: Micros,
    /// Unique per park, so a reused slab key is never mistaken for the old entry.
    seq: u64,
}

#[derive(Debug, Default)]
pub struct Parked {
    takes: Slab<ParkedTake>,
    fifo: VecDeque<(usize, u64)>,
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

    /// Parks a take; returns its key (the connection keeps it to drop it on close).
    pub fn park(
        &mut self,
        conn: usize,
        gen: u32,
        sid: SessionId,
        sync: u64,
        call16: bool,
        deadline: Micros,
    ) -> usize {
        self.next_seq += 1;
        let seq = self.next_seq;
        let key = self.takes.insert(ParkedTake {
            conn,
            gen,
            sid,
            sync,
            call16,
            deadline,
            seq,
        });
        self.fifo.push_back((key, seq));
        self.deadlines.push(Reverse((deadline, seq, key)));
        key
    }

    fn live(&self, key: usize, seq: u64) -> bool {
        self.takes.get(key).is_some_and(|t| t.seq == seq)
    }

    /// Removes a parked take (its connection closed). Its queue entries go stale.
    pub fn remove(&mut self, key: usize) -> Option<ParkedTake> {
        let t = self.takes.try_remove(key);
        self.maybe_compact();
        t
    }

    /// The oldest waiter, removed from the queue.
    pub fn pop_oldest(&mut self) -> Option<(usize, ParkedTake)> {
        while let Some((key, seq)) = self.fifo.pop_front() {
            if self.live(key, seq) {
                return Some((key, self.takes.remove(key)));
            }
        }
        None
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
                return Some((key, self.takes.remove(key)));
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
        if self.fifo.len() > bound {
            let takes = &self.takes;
            self.fifo
                .retain(|&(k, s)| takes.get(k).is_some_and(|t| t.seq == s));
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

    #[test]
    fn oldest_first_and_expiry_by_deadline() {
        let mut p = Parked::default();
        let a = p.park(1, 1, 10, 100, false, 50);
        let _b = p.park(2, 1, 20, 200, false, 30);
        let c = p.park(3, 1, 30, 300, true, 40);
        assert_eq!(p.next_deadline(), Some(30));
        assert_eq!(p.pop_expired(29), None);
        let (_, t) = p.pop_expired(35).unwrap();
        assert_eq!(t.sync, 200);
        assert_eq!(p.pop_expired(35), None);
        assert_eq!(p.remove(c).map(|t| t.sid), Some(30));
        assert_eq!(p.next_deadline(), Some(50));
        let (k, t) = p.pop_oldest().unwrap();
        assert_eq!((k, t.sync), (a, 100));
        assert!(p.pop_oldest().is_none());
        assert_eq!(p.next_deadline(), None);
        assert!(p.is_empty());
    }

    #[test]
    fn reused_keys_are_not_confused_with_stale_entries() {
        let mut p = Parked::default();
        let a = p.park(1, 1, 10, 1, false, 100);
        p.remove(a);
        let b = p.park(1, 2, 11, 2, false, 200);
        assert_eq!(a, b, "the slab reuses the key");
        assert_eq!(
            p.pop_expired(150),
            None,
            "the stale entry at 100 is skipped"
        );
        assert_eq!(p.pop_oldest().map(|(_, t)| t.sync), Some(2));
    }

    #[test]
    fn stale_entries_are_compacted() {
        let mut p = Parked::default();
        for i in 0..10_000 {
            let k = p.park(1, 1, 1, i, false, 1_000_000 + i);
            p.remove(k);
        }
        assert!(p.fifo.len() <= COMPACT_SLACK + 1);
        assert!(p.deadlines.len() <= COMPACT_SLACK + 1);
    }
}
