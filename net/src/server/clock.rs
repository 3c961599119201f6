//! The loop's two clocks. The wall clock (µs since the Unix epoch) is what the engine stores
//! in tasks — put times, delays, TTLs, TTRs — because those deadlines outlive the process and
//! are persisted. Every in-process timeout — a frame, an idle or unauthenticated connection,
//! a parked take, a waiting put, a pause, a session's grace, the synchronous-replication wait,
//! a replica's retry and silence, a relay's heartbeat, a closing connection's linger — runs on
//! the monotonic clock (µs since the loop's start), so a step of the wall clock neither
//! freezes nor fires them.

use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;

use nix::sys::time::TimeSpec;
use nix::time::{clock_gettime, ClockId};
use tarq_engine::Micros;

/// Reads both clocks. The wall clock can be stepped by hand ([`LoopClock::stepper`]), as an
/// operator or NTP steps a machine's clock: tests use it to show which deadlines follow it.
#[derive(Debug, Clone)]
pub struct LoopClock {
    /// The monotonic clock's reading when the loop started.
    start: Micros,
    wall_step: Arc<AtomicI64>,
}

impl Default for LoopClock {
    fn default() -> Self {
        LoopClock {
            start: read(ClockId::CLOCK_MONOTONIC),
            wall_step: Arc::new(AtomicI64::new(0)),
        }
    }
}

impl LoopClock {
    /// The wall clock, µs since the Unix epoch (with any step applied).
    pub fn wall(&self) -> Micros {
        let step = self.wall_step.load(Ordering::Relaxed);
        wall_clock().saturating_add_signed(step)
    }

    /// The monotonic clock, µs since the loop's start.
    pub fn mono(&self) -> Micros {
        read(ClockId::CLOCK_MONOTONIC).saturating_sub(self.start)
    }

    /// The step applied to the wall clock, in µs: adding to it steps the clock.
    pub fn stepper(&self) -> Arc<AtomicI64> {
        Arc::clone(&self.wall_step)
    }
}

/// The machine's wall clock as µs since the Unix epoch.
pub fn wall_clock() -> Micros {
    read(ClockId::CLOCK_REALTIME)
}

/// A clock's reading in µs. Read straight from `clock_gettime` (a vDSO call, no system call):
/// a turn reads its clocks once or twice, and `SystemTime`'s and `Instant`'s checked
/// subtractions cost more than the read itself.
fn read(clock: ClockId) -> Micros {
    clock_gettime(clock).map_or(0, |t: TimeSpec| {
        (t.tv_sec().max(0) as Micros) * 1_000_000 + (t.tv_nsec().max(0) as Micros) / 1_000
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_step_moves_the_wall_clock_and_not_the_monotonic_one() {
        let c = LoopClock::default();
        let (wall, mono) = (c.wall(), c.mono());
        c.stepper().fetch_add(-3_600_000_000, Ordering::Relaxed);
        assert!(c.wall() < wall, "stepped back an hour");
        assert!(c.mono() >= mono, "the monotonic clock never goes back");
        assert!(c.mono() < mono + 60_000_000);
    }
}
