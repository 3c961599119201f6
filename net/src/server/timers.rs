//! Every deadline the loop sleeps toward, in one structure: the poll's timeout is the nearest.
//! The loop's own are registered by their owners when they change: replication's (the relays'
//! next heartbeat, the upstream's retry or silence limit), the operator's reports (Graphite's
//! push, `/metrics` timeouts: on the wall clock, like the reports' timestamps), the accept
//! back-off, lingering closes, the router's. The engine, the core, the limits, the sessions,
//! the quotas and the sync gate keep their many deadlines in ordered structures of their own
//! (heaps, an ordered set, a queue) that change with nearly every command: their first is
//! registered once a turn, at its end, which costs less than telling the loop at each change.
//! A debug build checks at every poll that each slot holds exactly what its owner would say,
//! so a change that forgets to register fails the tests.

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
    /// The engine's next deadline: a delay's end, a TTR, a TTL (wall clock; a node that
    /// does not lead has none: its primary's records move its tasks).
    Engine,
    /// The core's: a parked take's or a waiting put's timeout, a pause's end.
    Core,
    /// The journal's: a snapshot's next step, a failed write's retry.
    Journal,
    /// The sync gate's: a change waiting for replicas times out.
    Sync,
    /// The limits': a connection's authentication or idle deadline.
    Limits,
    /// The tube API's sessions: a detached session's grace ends.
    Sessions,
    /// The quotas': a muted connection's put rate allows it again.
    Quotas,
}

const TIMERS: usize = 15;

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
        Timer::Engine,
        Timer::Core,
        Timer::Journal,
        Timer::Sync,
        Timer::Limits,
        Timer::Sessions,
        Timer::Quotas,
    ];

    /// Whether its deadlines are on the wall clock (else the monotonic one).
    fn on_wall_clock(self) -> bool {
        matches!(self, Timer::Ops | Timer::Engine)
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
        let (mut mono, mut wall) = (None, None);
        for t in Timer::ALL {
            if let Some(at) = self.get(t) {
                let nearest = if t.on_wall_clock() {
                    &mut wall
                } else {
                    &mut mono
                };
                *nearest = Some(nearest.map_or(at, |n: Micros| n.min(at)));
            }
        }
        (mono, wall)
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
