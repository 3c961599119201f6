//! The beanstalk port's grants: beanstalkd has no login, so with `--user` set the port acts as
//! `--beanstalk-user` and each command is checked against that user's rights on the tube it
//! touches (`core::access`). A refusal reads as the tube not being there: `NOT_FOUND`, which
//! beanstalkd answers for a tube it does not have (`stats-tube`, `pause-tube`) and every client
//! handles; beanstalkd itself never refuses `use` or `watch`, it makes the tube. Every refusal
//! is counted (`beanstalk_refused` in `/metrics`).
//!
//! What each command needs: `use` and `put` the `put` right on the tube; `watch`, `reserve`
//! (from the watched tubes it may take from), `reserve-job` and the peeks `take`; `kick`,
//! `kick-job`, `pause-tube` and a `delete` of a job the connection does not hold `admin`;
//! `stats-tube` and `stats-job` any right. `release`, `bury`, `touch` and `delete` of a held job
//! need nothing more: holding it took `take`.

use tarq_beanstalk::{Command as Bs, Reply as Out};
use tarq_engine::{Rights, TaskId, TubeIx};

use super::Beanstalk;
use crate::core::access::{Need, Who};
use crate::frontend::Loop;

/// The tube a command touches and what it needs there.
enum Wants<'a> {
    Named(&'a str, Option<Rights>),
    Ix(TubeIx, Option<Rights>),
    Task(TaskId, Option<Rights>),
}

impl<L: Loop> Beanstalk<'_, L> {
    /// Whether the connection may run `cmd`; a refusal is answered `NOT_FOUND` and counted.
    #[inline]
    pub(super) fn permitted(&mut self, idx: usize, cmd: &Bs<'_>) -> bool {
        if *self.l.who(idx) == Who::Everyone {
            return true;
        }
        self.check(idx, cmd)
    }

    #[cold]
    fn check(&mut self, idx: usize, cmd: &Bs<'_>) -> bool {
        let (put, take, admin) = (Some(Rights::PUT), Some(Rights::TAKE), Some(Rights::ADMIN));
        let used = self.bs(idx).used;
        let wants = match *cmd {
            Bs::Put { .. } => Wants::Ix(used, put),
            Bs::Use { tube } => Wants::Named(tube, put),
            Bs::Watch { tube } => Wants::Named(tube, take),
            Bs::ReserveJob { id } | Bs::Peek { id } => Wants::Task(id, take),
            Bs::Delete { id } if !self.holds(idx, id) => Wants::Task(id, admin),
            Bs::PeekReady | Bs::PeekDelayed | Bs::PeekBuried => Wants::Ix(used, take),
            Bs::Kick { .. } => Wants::Ix(used, admin),
            Bs::KickJob { id } => Wants::Task(id, admin),
            Bs::StatsJob { id } => Wants::Task(id, None),
            Bs::StatsTube { tube } => Wants::Named(tube, None),
            Bs::PauseTube { tube, .. } => Wants::Named(tube, admin),
            _ => return true,
        };
        let (name, rights) = match wants {
            Wants::Named(n, r) => (n.to_owned(), r),
            Wants::Ix(t, r) => (self.tube_name(t), r),
            // Wherever the job is (another set's, on a sharded node); one that no tube could
            // hold is answered NOT_FOUND by the command itself.
            Wants::Task(id, r) => match self.l.task_tube_name(id) {
                Some(name) => (name, r),
                None => return true,
            },
        };
        if self.may(idx, &name, rights) {
            return true;
        }
        self.refuse(idx);
        false
    }

    /// Whether the connection's user has `rights` on tube `name` (`None`: any right).
    pub(super) fn may(&self, idx: usize, name: &str, rights: Option<Rights>) -> bool {
        let need = match rights {
            Some(r) => Need::Tube(name, r),
            None => Need::AnyOn(name),
        };
        self.l.who(idx).allows(self.l.queue().users(), need)
    }

    /// Answers a refused command as a missing tube, counted.
    pub(super) fn refuse(&mut self, idx: usize) {
        self.state().refused += 1;
        tracing::debug!(
            sid = self.l.sid(idx),
            "beanstalk command refused by the grants"
        );
        let _answered = self.bs_answer(idx, Out::NotFound);
    }

    /// Of `tubes` (a reserve's watched ones), keeps those the connection may take from.
    pub(super) fn takeable(&self, idx: usize, tubes: &mut Vec<TubeIx>) {
        if *self.l.who(idx) == Who::Everyone {
            return;
        }
        tubes.retain(|&t| self.may(idx, &self.tube_name(t), Some(Rights::TAKE)));
    }

    fn holds(&self, idx: usize, id: TaskId) -> bool {
        let sid = self.l.sid(idx);
        self.l.served(id).and_then(|t| t.owner) == Some(sid)
    }
}
