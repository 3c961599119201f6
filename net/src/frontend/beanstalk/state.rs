//! The beanstalk front-end's server-wide state: command and error counters (`stats`), and per
//! tube what only beanstalk has — how many connections use and watch it, its `cmd-delete` and
//! `cmd-pause-tube` counts, and its pause. The pause is the server's to enforce (a paused
//! tube's tasks are handed to no take, on either protocol, until it ends), so the loop reads
//! [`BeanstalkState::paused`] and wakes at [`BeanstalkState::next_unpause`].

use tarq_beanstalk::CommandKind;
use tarq_engine::{Micros, TubeIx};

/// One tube's beanstalk figures.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct TubeState {
    /// Beanstalk connections whose `use` is this tube.
    pub using: u64,
    /// Beanstalk connections watching it.
    pub watching: u64,
    pub cmd_delete: u64,
    pub cmd_pause_tube: u64,
    /// Paused until, and the pause asked for in seconds.
    pub pause: Option<(Micros, u32)>,
}

#[derive(Debug, Default)]
pub struct BeanstalkState {
    /// Commands run, by [`CommandKind::ALL`] position.
    cmds: [u64; CommandKind::ALL.len()],
    /// Requests refused by the protocol (`BAD_FORMAT`, `UNKNOWN_COMMAND`, `EXPECTED_CRLF`,
    /// `JOB_TOO_BIG`).
    pub errors: u64,
    /// Beanstalk connections open now, and accepted since start.
    pub connections: u64,
    pub connections_accepted: u64,
    /// By tube index; a dropped tube's entry is reset ([`BeanstalkState::forget_tube`]).
    tubes: Vec<TubeState>,
    /// A put's wrapped body, reused.
    pub scratch: Vec<u8>,
    /// A reserve's watched tubes, reused.
    pub tubes_scratch: Vec<TubeIx>,
}

impl BeanstalkState {
    /// Counts one command: on every request, so indexed by the kind's discriminant, which is
    /// its position in [`CommandKind::ALL`] (a test checks it), not searched for.
    pub fn count(&mut self, kind: CommandKind) {
        self.cmds[kind as usize] += 1;
    }

    /// Commands of `kind` run since start.
    pub fn cmds(&self, kind: CommandKind) -> u64 {
        self.cmds[kind as usize]
    }

    /// Every command run since start.
    pub fn commands(&self) -> u64 {
        self.cmds.iter().sum()
    }

    pub fn tube(&self, t: TubeIx) -> TubeState {
        self.tubes.get(t as usize).copied().unwrap_or_default()
    }

    pub fn tube_mut(&mut self, t: TubeIx) -> &mut TubeState {
        let i = t as usize;
        if self.tubes.len() <= i {
            self.tubes.resize_with(i + 1, Default::default);
        }
        &mut self.tubes[i]
    }

    /// Whether beanstalk connections use or watch `t` (it may not be dropped under them).
    pub fn in_use(&self, t: TubeIx) -> bool {
        let s = self.tube(t);
        s.using > 0 || s.watching > 0
    }

    /// A dropped tube's figures go with it (its index may be reused).
    pub fn forget_tube(&mut self, t: TubeIx) {
        if let Some(s) = self.tubes.get_mut(t as usize) {
            *s = TubeState::default();
        }
    }

    /// Whether `t` is paused at `now`.
    pub fn paused(&self, t: TubeIx, now: Micros) -> bool {
        self.tubes
            .get(t as usize)
            .and_then(|s| s.pause)
            .is_some_and(|(until, _)| until > now)
    }

    /// The earliest end of a pause still in force.
    pub fn next_unpause(&self) -> Option<Micros> {
        self.tubes
            .iter()
            .filter_map(|s| s.pause)
            .map(|(u, _)| u)
            .min()
    }

    /// Ends the pauses that are over at `now`; returns their tubes (their waiters are served).
    pub fn unpause_due(&mut self, now: Micros, ended: &mut Vec<TubeIx>) {
        for (i, s) in self.tubes.iter_mut().enumerate() {
            if s.pause.is_some_and(|(until, _)| until <= now) {
                s.pause = None;
                ended.push(i as TubeIx);
            }
        }
    }

    /// A closing connection lets go of the tubes it used and watched.
    pub fn release_tubes(&mut self, used: TubeIx, watched: &[TubeIx]) {
        self.tube_mut(used).using -= 1;
        for &t in watched {
            self.tube_mut(t).watching -= 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pause_holds_until_its_end_and_is_then_reported_once() {
        let mut s = BeanstalkState::default();
        s.tube_mut(3).pause = Some((100, 1));
        assert!(s.paused(3, 99));
        assert!(!s.paused(3, 100));
        assert!(!s.paused(2, 0));
        assert_eq!(s.next_unpause(), Some(100));
        let mut ended = Vec::new();
        s.unpause_due(99, &mut ended);
        assert!(ended.is_empty());
        s.unpause_due(100, &mut ended);
        assert_eq!(ended, [3]);
        assert_eq!(s.next_unpause(), None);
    }

    #[test]
    fn a_kinds_discriminant_is_its_position_in_all() {
        for (i, &k) in CommandKind::ALL.iter().enumerate() {
            assert_eq!(k as usize, i, "{k:?}");
        }
    }

    #[test]
    fn commands_are_counted_by_kind() {
        let mut s = BeanstalkState::default();
        s.count(CommandKind::Put);
        s.count(CommandKind::Put);
        s.count(CommandKind::Quit);
        assert_eq!(s.cmds(CommandKind::Put), 2);
        assert_eq!(s.cmds(CommandKind::Quit), 1);
        assert_eq!(s.cmds(CommandKind::Peek), 0);
        assert_eq!(s.commands(), 3);
    }

    #[test]
    fn a_tube_is_in_use_while_used_or_watched_and_forgotten_when_dropped() {
        let mut s = BeanstalkState::default();
        s.tube_mut(0).using += 1;
        s.tube_mut(1).watching += 1;
        assert!(s.in_use(1));
        s.release_tubes(0, &[1]);
        assert!(!s.in_use(1));
        s.tube_mut(1).cmd_delete = 5;
        s.forget_tube(1);
        assert_eq!(s.tube(1), TubeState::default());
    }
}
