//! The beanstalk front-end's server-wide state: command and error counters (`stats`), and per
//! tube what only beanstalk has — how many connections use and watch it, its `cmd-delete` and
//! `cmd-pause-tube` counts (the pause itself is the core's: it holds takes of every protocol).
//! It also lists
//! the tubes nothing uses any more ([`BeanstalkState::orphans`]): a tube `use` or `watch` made
//! goes once it is empty too, as beanstalkd forgets it (`Server::collect_tubes`).

use tarq_beanstalk::CommandKind;
use tarq_engine::TubeIx;

/// One tube's beanstalk figures.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct TubeState {
    /// Beanstalk connections whose `use` is this tube.
    pub using: u64,
    /// Beanstalk connections watching it.
    pub watching: u64,
    pub cmd_delete: u64,
    pub cmd_pause_tube: u64,
}

#[derive(Debug)]
pub struct BeanstalkState {
    /// Commands run, by [`CommandKind::ALL`] position.
    cmds: [u64; CommandKind::ALL.len()],
    /// Requests refused by the protocol (`BAD_FORMAT`, `UNKNOWN_COMMAND`, `EXPECTED_CRLF`,
    /// `JOB_TOO_BIG`).
    pub errors: u64,
    /// Commands refused by the grants of the user the port acts as (`--beanstalk-user`).
    pub refused: u64,
    /// Beanstalk connections open now, and accepted since start.
    pub connections: u64,
    pub connections_accepted: u64,
    /// By tube index; a dropped tube's entry is reset ([`BeanstalkState::forget_tube`]).
    tubes: Vec<TubeState>,
    /// Room the commands borrow (a put's wrapped body, a reserve's watched tubes), lent to
    /// the front-end by the loop while a connection's input runs. Reused.
    pub room: super::Room,
    /// Tubes the last connection using or watching them let go of, to drop once empty if
    /// `use` / `watch` made them (a tube with tasks waits here until its last one goes).
    pub orphans: Vec<TubeIx>,
    /// Every made-on-demand tube is to be looked at: no connection uses any after a start,
    /// and a node that did not lead kept none.
    pub rescan: bool,
    /// Jobs put into and TTRs run out in tubes dropped since start: `stats`'s `total-jobs`
    /// and `job-timeouts` count them, as beanstalkd's do.
    pub dropped_puts: u64,
    pub dropped_timeouts: u64,
}

impl Default for BeanstalkState {
    fn default() -> Self {
        BeanstalkState {
            cmds: [0; CommandKind::ALL.len()],
            errors: 0,
            refused: 0,
            connections: 0,
            connections_accepted: 0,
            tubes: Vec::new(),
            room: super::Room::default(),
            orphans: Vec::new(),
            rescan: true,
            dropped_puts: 0,
            dropped_timeouts: 0,
        }
    }
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

    /// A beanstalk connection opened: it uses and watches `default`.
    pub fn opened(&mut self) {
        self.connections += 1;
        self.connections_accepted += 1;
        let default = self.tube_mut(tarq_engine::DEFAULT_TUBE);
        default.using += 1;
        default.watching += 1;
    }

    /// Whether beanstalk connections use or watch `t` (it may not be dropped under them).
    pub fn in_use(&self, t: TubeIx) -> bool {
        let s = self.tube(t);
        s.using > 0 || s.watching > 0
    }

    /// A dropped tube's figures go with it (its index may be reused); its puts and TTRs run
    /// out stay in the server's totals.
    pub fn forget_tube(&mut self, t: TubeIx, last: &tarq_engine::Stats) {
        if let Some(s) = self.tubes.get_mut(t as usize) {
            *s = TubeState::default();
        }
        self.dropped_puts += last.puts;
        self.dropped_timeouts += last.ttr_returned;
    }

    /// A closing connection lets go of the tubes it used and watched.
    pub fn release_tubes(&mut self, used: TubeIx, watched: &[TubeIx]) {
        self.stop_using(used);
        for &t in watched {
            self.stop_watching(t);
        }
    }

    /// A connection's `use` moved off `t` (or it closed).
    pub fn stop_using(&mut self, t: TubeIx) {
        self.tube_mut(t).using -= 1;
        self.let_go(t);
    }

    /// A connection ignores `t` (or it closed).
    pub fn stop_watching(&mut self, t: TubeIx) {
        self.tube_mut(t).watching -= 1;
        self.let_go(t);
    }

    /// `t` is an orphan once nothing uses or watches it.
    fn let_go(&mut self, t: TubeIx) {
        if !self.in_use(t) && !self.orphans.contains(&t) {
            self.orphans.push(t);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
        let last = tarq_engine::Stats {
            puts: 3,
            ttr_returned: 1,
            ..Default::default()
        };
        s.forget_tube(1, &last);
        assert_eq!(s.tube(1), TubeState::default());
        assert_eq!((s.dropped_puts, s.dropped_timeouts), (3, 1));
    }

    #[test]
    fn a_tube_is_an_orphan_once_the_last_user_and_watcher_let_go() {
        let mut s = BeanstalkState::default();
        for _ in 0..2 {
            s.tube_mut(4).using += 1;
        }
        s.tube_mut(4).watching += 1;
        s.stop_using(4);
        s.stop_watching(4);
        assert!(s.orphans.is_empty(), "still used by one connection");
        s.release_tubes(4, &[]);
        assert_eq!(s.orphans, [4]);
        // Let go of again after a new user: listed once.
        s.tube_mut(4).watching += 1;
        s.stop_watching(4);
        assert_eq!(s.orphans, [4]);
    }
}
