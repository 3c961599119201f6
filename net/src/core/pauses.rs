//! Paused tubes: a paused tube hands its tasks to no take, on any protocol, until its pause
//! ends (beanstalk's `pause-tube` sets one). Few tubes are ever paused, so the pauses are a
//! short list, scanned.

use tarq_engine::{Micros, TubeIx};

/// A tube's pause: until when, and for how long it was asked (in seconds, as reported).
/// Between nodes `until` travels as the time left, since each node has its own monotonic
/// clock (`frontend::link::call` converts it both ways).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Pause {
    pub until: Micros,
    pub seconds: u32,
}

#[derive(Debug, Default)]
pub struct Pauses {
    /// Pauses in force (or over and not yet ended by [`Pauses::end_due`]), by tube.
    list: Vec<(TubeIx, Pause)>,
    /// Tubes held without end while a sharded cluster moves them to another node: nothing
    /// is taken from them, and no waiting put enters, until they are thawed (or dropped).
    frozen: Vec<TubeIx>,
}

impl Pauses {
    /// Pauses `tube` until `until` (replacing a pause it had).
    pub fn pause(&mut self, tube: TubeIx, pause: Pause) {
        self.list.retain(|(t, _)| *t != tube);
        self.list.push((tube, pause));
    }

    /// `tube`'s pause, in force or not yet ended.
    pub fn of(&self, tube: TubeIx) -> Option<Pause> {
        self.list.iter().find(|(t, _)| *t == tube).map(|&(_, p)| p)
    }

    /// Whether `tube` is paused at `now` (or frozen).
    #[inline]
    pub fn paused(&self, tube: TubeIx, now: Micros) -> bool {
        (!self.list.is_empty() && self.of(tube).is_some_and(|p| p.until > now))
            || (!self.frozen.is_empty() && self.frozen(tube))
    }

    /// Holds `tube` until [`thaw`](Self::thaw): a move is copying it.
    pub fn freeze(&mut self, tube: TubeIx) {
        if !self.frozen(tube) {
            self.frozen.push(tube);
        }
    }

    /// Ends `tube`'s hold.
    pub fn thaw(&mut self, tube: TubeIx) {
        self.frozen.retain(|&t| t != tube);
    }

    /// Whether `tube` is held for a move.
    pub fn frozen(&self, tube: TubeIx) -> bool {
        self.frozen.contains(&tube)
    }

    /// The earliest end of a pause.
    pub fn next_end(&self) -> Option<Micros> {
        self.list.iter().map(|(_, p)| p.until).min()
    }

    /// Ends the pauses that are over at `now`, adding their tubes to `ended`.
    pub fn end_due(&mut self, now: Micros, ended: &mut Vec<TubeIx>) {
        self.list.retain(|&(t, p)| {
            let over = p.until <= now;
            if over {
                ended.push(t);
            }
            !over
        });
    }

    /// A dropped tube's pause goes with it.
    pub fn forget(&mut self, tube: TubeIx) {
        self.list.retain(|(t, _)| *t != tube);
        self.thaw(tube);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pause_holds_until_its_end_and_is_then_ended_once() {
        let mut p = Pauses::default();
        p.pause(
            3,
            Pause {
                until: 100,
                seconds: 1,
            },
        );
        assert!(p.paused(3, 99));
        assert!(!p.paused(3, 100));
        assert!(!p.paused(2, 0));
        assert_eq!(p.next_end(), Some(100));
        let mut ended = Vec::new();
        p.end_due(99, &mut ended);
        assert!(ended.is_empty());
        p.end_due(100, &mut ended);
        assert_eq!(ended, [3]);
        p.end_due(200, &mut ended);
        assert_eq!(ended, [3], "ended once");
        assert_eq!(p.next_end(), None);
    }
}
