//! Tasks held across a link, kept to one holder at a time when the link breaks.
//!
//! A client of node F that takes a task of a partition set S owns holds it in a session the
//! owner runs for F's session. When the link between them breaks, both ends must agree that
//! the hold is over, and the client must hear it before anyone else can take the task:
//!
//! - **F, the forwarding node**, remembers which of its sessions were given a task by each set
//!   ([`Holds::took`]). When its link to S fails, for any reason (silence past
//!   `--link-timeout`, a new primary, a reset), it ends those sessions at once — closes their
//!   connections, and forgets an identified session so it cannot be resumed — the way a
//!   Tarantool client learns that its session, and with it its holds, ended. A session's end
//!   that could not be told to S (no link) is owed and told first on the next link
//!   ([`Holds::owe`]), so an owner that never saw the link break still lets go.
//! - **The owner** forgets a forwarding node's sessions when that node's last link closes —
//!   a call arriving later starts a new session — but releases their tasks only after a grace
//!   ([`Holds::orphan`]) of `--link-timeout`: by then F has seen the break too (it takes a
//!   link for dead after that much silence) and has told its clients.
//!
//! Before this, the owner released at once and F's clients were never told: in a fault run a
//! node cut from etcd dropped its links on seeing new primaries, the owner released two held
//! tasks, a move carried them to the other set as ready, and a second consumer took each
//! while the first still held it.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

use tarq_engine::{Micros, SessionId};
use tracing::{info, warn};

use super::ctx::{Ctx, Effect};
use super::{set_bit, Router};

/// The grace when links have no timeout (`--link-timeout 0`): the default timeout.
pub(super) const DEFAULT_GRACE: Micros = 5_000_000;

/// A session as its owner names it: the origin node (`None`: the node that sends it) and
/// that node's number for the session.
pub(super) type RemoteSession = (Option<Arc<str>>, u64);

/// Held tasks across links, from both ends.
#[derive(Debug, Default)]
pub(super) struct Holds {
    /// This node's sessions that were given a task by another set, with those sets' bits.
    took: HashMap<SessionId, u64>,
    /// Session ends owed to a set with no link now: (origin, session) as the owner names them.
    owed: HashMap<usize, Vec<RemoteSession>>,
    /// Another node's sessions whose last link closed, in the order their grace ends.
    orphans: VecDeque<(Micros, SessionId)>,
}

impl Holds {
    /// Session `sid` was given a task by set `bit`'s owner.
    pub fn took(&mut self, sid: SessionId, bit: u64) {
        *self.took.entry(sid).or_default() |= bit;
    }

    /// Session `sid` ended: nothing it held is held any more.
    pub fn ended(&mut self, sid: SessionId) {
        self.took.remove(&sid);
    }

    /// The link to the set of bit `bit` failed: the sessions given a task there, which lost
    /// their holds with it (forgotten here; the caller ends them).
    pub fn lost(&mut self, bit: u64) -> Vec<SessionId> {
        let mut lost = Vec::new();
        self.took.retain(|&sid, mask| {
            if *mask & bit == 0 {
                return true;
            }
            lost.push(sid);
            *mask &= !bit;
            *mask != 0
        });
        lost.sort_unstable();
        lost
    }

    /// The end of `origin`'s `session` could not be told to set `set`: tell it on the next
    /// link.
    pub fn owe(&mut self, set: usize, origin: Option<Arc<str>>, session: u64) {
        self.owed.entry(set).or_default().push((origin, session));
    }

    /// The session ends owed to set `set`, to send first on a new link.
    pub fn owed(&mut self, set: usize) -> Vec<RemoteSession> {
        self.owed.remove(&set).unwrap_or_default()
    }

    /// Sessions `sids` of a forwarding node whose last link closed at `now`: released after
    /// `grace`.
    pub fn orphan(
        &mut self,
        sids: impl IntoIterator<Item = SessionId>,
        now: Micros,
        grace: Micros,
    ) {
        let at = now.saturating_add(grace);
        // One grace for all: deadlines arrive in order, and the queue stays sorted.
        self.orphans.extend(sids.into_iter().map(|sid| (at, sid)));
    }

    /// The orphaned sessions whose grace ended by `now`, to release.
    pub fn due(&mut self, now: Micros) -> Vec<SessionId> {
        let mut due = Vec::new();
        while let Some(&(at, sid)) = self.orphans.front() {
            if at > now {
                break;
            }
            self.orphans.pop_front();
            due.push(sid);
        }
        due
    }

    /// When the next orphaned session's grace ends.
    pub fn next_deadline(&self) -> Option<Micros> {
        self.orphans.front().map(|&(at, _)| at)
    }
}

impl Router {
    /// The link to set `set` failed: this node's sessions given a task there end now, before
    /// the owner's grace lets the tasks go to anyone else.
    pub(super) fn end_holders(&mut self, cx: &mut Ctx<'_>, set: usize) {
        let name = self.sets[set].name.clone();
        for sid in self.holds.lost(set_bit(set)) {
            // Another node's session, relayed: its owner knows it by that node's name, and
            // this link's end releases nothing of it.
            if cx.link_sessions.remote_of(sid).is_some() {
                continue;
            }
            warn!(
                sid,
                set = %name,
                "a session held tasks of a replica set whose link failed: the session ends \
                 (its connections close), as its holds did"
            );
            // It holds nothing from now (another link failing in this call does not name it
            // again); the loop ends it once the call is over.
            self.holds.ended(sid);
            self.effects.push(Effect::EndSession(sid));
        }
    }

    /// The last link from another node closed, and with it the sessions it carried (`sids`):
    /// forgotten now, their tasks released after the grace.
    pub(in crate::server) fn orphan_link_sessions(
        &mut self,
        cx: &mut Ctx<'_>,
        sids: Vec<SessionId>,
    ) {
        for &sid in &sids {
            cx.link_sessions.forget(sid);
        }
        let grace = match self.limits.link_timeout {
            0 => DEFAULT_GRACE,
            t => t,
        };
        self.holds.orphan(sids, cx.mono, grace);
    }

    /// Releases the orphaned sessions whose grace ended.
    pub(in crate::server) fn release_orphans(&mut self, cx: &mut Ctx<'_>) {
        let due = self.holds.due(cx.mono);
        if due.is_empty() {
            return;
        }
        for sid in due {
            let released = self.release_session(cx, sid);
            info!(
                sid,
                released, "a closed link's session ended after its grace"
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_broken_link_ends_only_the_sessions_that_took_through_it() {
        let mut h = Holds::default();
        h.took(1, 0b01);
        h.took(2, 0b10);
        h.took(3, 0b11);
        h.took(4, 0b01);
        h.ended(4);
        assert_eq!(h.lost(0b01), vec![1, 3]);
        // Session 3 still holds through the other set; a second break there ends it.
        assert_eq!(h.lost(0b01), Vec::<SessionId>::new());
        assert_eq!(h.lost(0b10), vec![2, 3]);
        assert!(h.took.is_empty());
    }

    #[test]
    fn owed_ends_are_given_once_to_their_set() {
        let mut h = Holds::default();
        h.owe(2, None, 7);
        h.owe(2, Some(Arc::from("n1")), 8);
        h.owe(3, None, 9);
        assert_eq!(h.owed(2), vec![(None, 7), (Some(Arc::from("n1")), 8)]);
        assert!(h.owed(2).is_empty());
        assert_eq!(h.owed(3), vec![(None, 9)]);
    }

    #[test]
    fn orphans_are_due_after_their_grace_in_order() {
        let mut h = Holds::default();
        h.orphan([5, 6], 1_000, 500);
        h.orphan([7], 1_200, 500);
        assert_eq!(h.next_deadline(), Some(1_500));
        assert!(h.due(1_499).is_empty());
        assert_eq!(h.due(1_500), vec![5, 6]);
        assert_eq!((h.orphans.len(), h.next_deadline()), (1, Some(1_700)));
        assert_eq!(h.due(10_000), vec![7]);
        assert_eq!(h.next_deadline(), None);
    }
}
