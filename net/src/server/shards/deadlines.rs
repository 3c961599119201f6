//! Deadlines on forwarded calls: a call sent over a link that stays alive (its pings are
//! answered) but whose own answer never comes — an owner stuck on it, a bug — is answered
//! after its own wait plus [`CALL_GRACE_LINK_TIMEOUTS`] link timeouts, with "outcome unknown"
//! (code 1003), instead of holding its client, and a move frozen behind it, for ever. A watch
//! (answered when a task comes, however long that is) has none.
//!
//! Most calls wait for nothing at their owner, so their deadlines arrive in the order they were
//! sent: those are a queue, cleaned from its front as answers come. The few that wait (a take
//! with a timeout, a put waiting for room) are a heap. Both are cleaned lazily: an entry whose
//! call was answered is dropped when it reaches the front, so the structure holds about as
//! many entries as there are calls in flight, plus those answered behind an older one.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};

use tarq_engine::Micros;

/// A call's deadline past its own wait, in link timeouts: an owner slow to fsync a page of a
/// move under load is slow, not stuck.
pub(super) const CALL_GRACE_LINK_TIMEOUTS: u64 = 6;

/// The deadlines of calls in flight, by their sync.
#[derive(Debug, Default)]
pub(super) struct CallDeadlines {
    /// Calls that wait for nothing there, in the order sent: (deadline, sync).
    prompt: VecDeque<(Micros, u64)>,
    /// Calls that may wait there.
    waiting: BinaryHeap<Reverse<(Micros, u64)>>,
}

impl CallDeadlines {
    /// Call `sync`, sent at `now`, may wait `wait` at its owner (`None`: without end); the
    /// grace is `grace` (0: no deadlines).
    pub fn sent(&mut self, sync: u64, now: Micros, wait: Option<Micros>, grace: Micros) {
        let Some(wait) = wait.filter(|_| grace > 0) else {
            return;
        };
        let at = now.saturating_add(wait).saturating_add(grace);
        if wait == 0 {
            self.prompt.push_back((at, sync));
        } else {
            self.waiting.push(Reverse((at, sync)));
        }
    }

    /// The calls whose deadline passed by `now` and that are still in flight (`open`), taken
    /// out; answered calls met on the way are dropped.
    pub fn due(&mut self, now: Micros, open: impl Fn(u64) -> bool) -> Vec<u64> {
        let mut due = Vec::new();
        while let Some(&(at, sync)) = self.prompt.front() {
            if open(sync) && at > now {
                break;
            }
            self.prompt.pop_front();
            if open(sync) {
                due.push(sync);
            }
        }
        while let Some(&Reverse((at, sync))) = self.waiting.peek() {
            if open(sync) && at > now {
                break;
            }
            self.waiting.pop();
            if open(sync) {
                due.push(sync);
            }
        }
        due
    }

    /// The soonest deadline (perhaps of a call answered since: a wake-up that finds nothing).
    pub fn next(&self) -> Option<Micros> {
        let prompt = self.prompt.front().map(|&(at, _)| at);
        let waiting = self.waiting.peek().map(|Reverse((at, _))| *at);
        prompt.into_iter().chain(waiting).min()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    #[test]
    fn a_call_not_answered_by_its_wait_and_the_grace_is_due_and_an_answered_one_is_dropped() {
        let mut d = CallDeadlines::default();
        d.sent(1, 0, Some(0), 100);
        d.sent(2, 10, Some(0), 100);
        d.sent(3, 20, Some(1_000), 100);
        d.sent(4, 30, None, 100); // a watch: no deadline
        let mut open: HashSet<u64> = [1, 2, 3, 4].into();
        assert_eq!(d.next(), Some(100));
        assert!(d.due(99, |s| open.contains(&s)).is_empty());
        open.remove(&1); // answered
        assert_eq!(d.due(110, |s| open.contains(&s)), vec![2]);
        open.remove(&2);
        assert_eq!(d.next(), Some(1_120));
        assert!(d.due(1_119, |s| open.contains(&s)).is_empty());
        assert_eq!(d.due(1_120, |s| open.contains(&s)), vec![3]);
        assert_eq!(d.next(), None, "the watch has none");
    }

    #[test]
    fn answered_calls_are_cleaned_from_the_front_before_their_deadline() {
        let mut d = CallDeadlines::default();
        for sync in 0..1000 {
            d.sent(sync, sync, Some(0), 1_000_000);
        }
        // All answered but the last: one look keeps only it.
        assert!(d.due(2_000, |s| s == 999).is_empty());
        assert_eq!(d.prompt.len(), 1);
        assert_eq!(d.next(), Some(1_000_999));
    }

    #[test]
    fn without_a_link_timeout_there_are_no_deadlines() {
        let mut d = CallDeadlines::default();
        d.sent(1, 0, Some(0), 0);
        assert_eq!(d.next(), None);
    }
}
