//! Synchronous replication's gate (`--sync-replicas N`): a turn that holds a change is
//! answered only once N replicas acknowledged its last record as durable in their own WAL.
//! It rides on the hold the loop already keeps for local durability (`OutBuf::hold`): a turn's
//! ticket passes when the WAL made it durable *and* this gate lets it through, so one wait
//! covers every change of the turn (group commit batches the replicas' acknowledgements as it
//! batches the disk's syncs). A relay's own stream waits only for local durability, or
//! nothing would ever reach the replicas.
//!
//! A turn that waits longer than `--sync-timeout` is answered with ER_SYNC_QUORUM_TIMEOUT: the
//! engine has no rollback, so, as Tarantool does with `replication_synchro_timeout` in its new
//! behaviour (`compat.replication_synchro_timeout = 'new'`), the change is not undone; it stays
//! applied on the primary and keeps replicating, only its client stops waiting for it.
//! Which replica acknowledged what is read from the relays (`Relay::acked`); this file only
//! counts.
//!
//! A primary elected through etcd passes a turn only once etcd also holds a committed position
//! at or past it (`record_needed`; the loop asks the election thread for the record and hands
//! the answer to `on_recorded`). Replicas' acknowledgements alone would not do: if those that
//! acknowledged all fail, a replica that never had the change could be elected and the
//! acknowledged change would be gone. With the record, such a replica may not campaign
//! (`tarq_cluster::election::may_campaign`). One record covers every turn up to it, so the cost
//! is one etcd write a round of acknowledgements, not one a change.

use std::collections::VecDeque;

use tarq_engine::Micros;
use tracing::warn;

use crate::core::journal::Ticket;

/// What to do with a turn's held replies, once the local WAL has them durable.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    Hold,
    Release,
    /// The quorum did not come in time: each reply becomes the timeout error.
    TimedOut,
}

#[derive(Debug, Default)]
pub struct SyncGate {
    /// Replicas that must acknowledge a change (0: the gate is open).
    need: usize,
    timeout: Micros,
    /// Turns with a change waiting for the quorum: (ticket, last record, deadline), oldest
    /// first (tickets and records both grow).
    waiting: VecDeque<(Ticket, u64, Micros)>,
    /// Turns whose wait timed out and whose replies may still be held somewhere, oldest first.
    timed_out: VecDeque<Ticket>,
    /// The error text the timed-out turns' replies carry.
    message: String,
    /// The highest record at least `need` replicas acknowledged.
    quorum: u64,
    /// Whether a turn also waits for etcd to record a committed position past it.
    record_needed: bool,
    /// The highest record etcd holds as committed in this leadership.
    recorded: u64,
    /// Turns that timed out since the start (a figure).
    pub timeouts: u64,
}

impl SyncGate {
    pub fn new(need: usize, timeout: Micros) -> Self {
        SyncGate {
            need,
            timeout,
            ..Default::default()
        }
    }

    pub fn enabled(&self) -> bool {
        self.need > 0
    }

    /// Makes every turn wait for etcd's record of a committed position too (a primary of a
    /// cluster elected through etcd).
    pub fn require_record(&mut self) {
        self.record_needed = true;
    }

    /// The record up to which turns pass: what the replicas acknowledged and, where needed,
    /// etcd recorded.
    fn passed(&self) -> u64 {
        if self.record_needed {
            self.quorum.min(self.recorded)
        } else {
            self.quorum
        }
    }

    /// The record to ask etcd to hold as committed: acknowledged by the quorum, not yet
    /// recorded, and waited for by a turn (nothing is written for turns nobody waits on).
    pub fn to_record(&self) -> Option<u64> {
        (self.record_needed && self.quorum > self.recorded && !self.waiting.is_empty())
            .then_some(self.quorum)
    }

    /// etcd holds `record` as committed: turns up to it may pass (at the next `advance`).
    pub fn on_recorded(&mut self, record: u64) {
        self.recorded = self.recorded.max(record);
    }

    /// A turn was committed; `change` is its last record when it holds a change.
    pub fn on_commit(&mut self, ticket: Ticket, change: Option<u64>, now: Micros) {
        if let (true, Some(seq)) = (self.enabled(), change) {
            if seq > self.quorum {
                self.waiting.push_back((ticket, seq, now + self.timeout));
            }
        }
    }

    /// Takes in the replicas' acknowledgements (`acked`, one per connected replica) and the
    /// clock: turns the quorum reached pass, turns past their deadline time out.
    pub fn advance(&mut self, acked: &mut [u64], now: Micros) {
        if self.waiting.is_empty() {
            return;
        }
        self.quorum = self.quorum.max(quorum(acked, self.need));
        let passed = self.passed();
        while self
            .waiting
            .front()
            .is_some_and(|&(_, seq, _)| seq <= passed)
        {
            self.waiting.pop_front();
        }
        if self.waiting.front().is_some_and(|&(_, _, d)| d <= now) {
            let seq = self.waiting[0].1;
            let why = if seq <= self.quorum {
                format!(
                    "the replicas acknowledged it, but etcd did not record it as committed \
                     within {} s",
                    self.timeout as f64 / 1e6
                )
            } else {
                format!(
                    "{} of the {} replicas --sync-replicas asks for acknowledged it within {} s \
                     ({} connected)",
                    acked.iter().filter(|&&a| a >= seq).count(),
                    self.need,
                    self.timeout as f64 / 1e6,
                    acked.len(),
                )
            };
            self.message = format!(
                "outcome unknown: Quorum collection for a synchronous transaction is timed out: \
                 {why}; the change is applied on this primary and keeps replicating, so it \
                 may survive or be lost in a failover: do not retry it blindly"
            );
            warn!(error = %self.message, "synchronous replication");
            while let Some(&(t, _, d)) = self.waiting.front() {
                if d > now {
                    break;
                }
                self.waiting.pop_front();
                self.timed_out.push_back(t);
                self.timeouts += 1;
            }
        }
    }

    pub fn verdict(&self, ticket: Ticket) -> Verdict {
        if self.waiting.binary_search_by_key(&ticket, |w| w.0).is_ok() {
            Verdict::Hold
        } else if self.timed_out.binary_search(&ticket).is_ok() {
            Verdict::TimedOut
        } else {
            Verdict::Release
        }
    }

    pub fn message(&self) -> &str {
        &self.message
    }

    /// Forgets timed-out turns older than `oldest_held` (no connection holds them any more).
    pub fn forget_before(&mut self, oldest_held: Option<Ticket>) {
        while self
            .timed_out
            .front()
            .is_some_and(|&t| oldest_held.is_none_or(|o| t < o))
        {
            self.timed_out.pop_front();
        }
    }

    pub fn has_timed_out(&self) -> bool {
        !self.timed_out.is_empty()
    }

    /// When the oldest waiting turn times out.
    pub fn next_deadline(&self) -> Option<Micros> {
        self.waiting.front().map(|w| w.2)
    }

    /// Turns waiting for the quorum now (a figure).
    pub fn waiting(&self) -> u64 {
        self.waiting.len() as u64
    }
}

impl SyncGate {
    /// A new leadership: turns still waiting count as timed out, and acknowledgements start
    /// again from nothing.
    pub fn restart(&mut self) {
        let waited: Vec<Ticket> = self.waiting.drain(..).map(|w| w.0).collect();
        self.timed_out.extend(waited);
        self.quorum = 0;
        self.recorded = 0;
    }
}

/// The highest record `need` of the replicas have: the `need`-th largest acknowledgement.
fn quorum(acked: &mut [u64], need: usize) -> u64 {
    if need == 0 || acked.len() < need {
        return 0;
    }
    acked.sort_unstable_by(|a, b| b.cmp(a));
    acked[need - 1]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_turn_passes_once_enough_replicas_acknowledged_it() {
        let mut g = SyncGate::new(2, 1000);
        g.on_commit(1, Some(10), 0);
        g.on_commit(2, None, 0);
        g.on_commit(3, Some(20), 0);
        assert_eq!(g.verdict(1), Verdict::Hold);
        assert_eq!(g.verdict(2), Verdict::Release, "takes only: no wait");
        g.advance(&mut [15, 9], 1);
        assert_eq!(g.verdict(1), Verdict::Hold, "one replica is not two");
        g.advance(&mut [15, 12], 1);
        assert_eq!(g.verdict(1), Verdict::Release);
        assert_eq!(g.verdict(3), Verdict::Hold);
        g.advance(&mut [25, 20, 3], 2);
        assert_eq!(g.verdict(3), Verdict::Release);
    }

    #[test]
    fn a_turn_times_out_into_an_error_and_is_forgotten_once_released() {
        let mut g = SyncGate::new(1, 1000);
        g.on_commit(1, Some(10), 0);
        g.on_commit(2, Some(11), 500);
        g.advance(&mut [], 999);
        assert_eq!(g.verdict(1), Verdict::Hold);
        g.advance(&mut [], 1000);
        assert_eq!(g.verdict(1), Verdict::TimedOut);
        assert_eq!(g.verdict(2), Verdict::Hold);
        assert!(
            g.message().contains("0 of the 1 replicas"),
            "{}",
            g.message()
        );
        assert_eq!(g.next_deadline(), Some(1500));
        g.forget_before(Some(2));
        assert_eq!(g.verdict(1), Verdict::Release);
        assert_eq!(g.timeouts, 1);
    }

    #[test]
    fn with_a_record_needed_a_turn_waits_for_etcd_as_well_as_the_replicas() {
        let mut g = SyncGate::new(1, 1000);
        g.require_record();
        g.on_commit(1, Some(10), 0);
        g.on_commit(2, Some(20), 0);
        assert_eq!(g.to_record(), None, "nothing acknowledged yet");
        g.advance(&mut [20], 1);
        assert_eq!(g.verdict(1), Verdict::Hold, "acknowledged, not recorded");
        assert_eq!(g.to_record(), Some(20));
        g.on_recorded(10);
        g.advance(&mut [20], 2);
        assert_eq!(
            (g.verdict(1), g.verdict(2)),
            (Verdict::Release, Verdict::Hold)
        );
        g.advance(&mut [20], 1000);
        assert_eq!(g.verdict(2), Verdict::TimedOut);
        assert!(
            g.message().starts_with("outcome unknown: "),
            "{}",
            g.message()
        );
        assert!(
            g.message().contains("etcd did not record"),
            "{}",
            g.message()
        );
        g.restart();
        g.on_commit(3, Some(30), 1000);
        g.advance(&mut [30], 1001);
        assert_eq!(g.to_record(), Some(30), "a new leadership records again");
    }
}
