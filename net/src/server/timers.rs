//! The loop's own deadlines in one structure, each registered by its owner when it changes:
//! replication's (the relays' next heartbeat, the upstream's retry or silence limit), the
//! operator's reports (Graphite's push, `/metrics` timeouts: on the wall clock, like the
//! reports' timestamps), the accept back-off and lingering closes. The loop reads the nearest
//! before each poll. The core, the limits, the sessions and the sync gate keep their many
//! deadlines in ordered structures of their own (heaps, an ordered set, a queue) and are asked
//! for the first. A debug build checks at every poll that each slot holds exactly what its
//! owner would say, so a change that forgets to register fails the tests.

use tarq_engine::Micros;

/// Who registers a deadline.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Timer {
    /// The soonest heartbeat a relay owes its replica.
    Heartbeats,
    /// The upstream's next connection attempt, or the limit of its primary's silence.
    Upstream,
    /// Accepting again after running out of file descriptors.
    AcceptPause,
    /// The soonest a lingering close is freed regardless.
    Linger,
    /// The operator's reports (wall clock).
    Ops,
    /// The soonest deadline of a take waiting across a sharded tube's partitions.
    Shards,
    /// The web console's per-second sample of the live figures and its events.
    Live,
    /// The soonest an IPROTO connection on a TLS port is taken for plain (no ClientHello).
    TlsHello,
}

const TIMERS: usize = 8;

impl Timer {
    const ALL: [Timer; TIMERS] = [
        Timer::Heartbeats,
        Timer::Upstream,
        Timer::AcceptPause,
        Timer::Linger,
        Timer::Ops,
        Timer::Shards,
        Timer::Live,
        Timer::TlsHello,
    ];

    /// Whether its deadlines are on the wall clock (else the monotonic one).
    fn on_wall_clock(self) -> bool {
        self == Timer::Ops
    }
}

/// One slot per [`Timer`]: its next deadline, if any.
#[derive(Debug, Default)]
pub struct Timers {
    at: [Option<Micros>; TIMERS],
}

impl Timers {
    /// `timer`'s next deadline is now `at`.
    #[inline]
    pub fn set(&mut self, timer: Timer, at: Option<Micros>) {
        self.at[timer as usize] = at;
    }

    pub fn get(&self, timer: Timer) -> Option<Micros> {
        self.at[timer as usize]
    }

    /// The nearest deadline on the monotonic clock, and the nearest on the wall clock.
    pub fn next(&self) -> (Option<Micros>, Option<Micros>) {
        let nearest = |wall: bool| {
            (Timer::ALL.iter())
                .filter(|t| t.on_wall_clock() == wall)
                .filter_map(|&t| self.get(t))
                .min()
        };
        (nearest(false), nearest(true))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_nearest_of_each_clock() {
        let mut t = Timers::default();
        assert_eq!(t.next(), (None, None));
        t.set(Timer::Heartbeats, Some(30));
        t.set(Timer::Linger, Some(20));
        t.set(Timer::Ops, Some(1_000));
        assert_eq!(t.next(), (Some(20), Some(1_000)));
        t.set(Timer::Linger, None);
        assert_eq!(t.next(), (Some(30), Some(1_000)));
    }
}
