//! Sessions of the tarantool/queue API: a connection that calls `queue.identify()` gets a
//! 16-byte UUID naming its session (the engine's session id its tasks are taken by). With
//! `queue.cfg{ttr = N}`, when the last connection of an identified session closes, its tasks
//! stay taken for N seconds, and a connection that calls `queue.identify(uuid)` in that time
//! owns them again (ack and release work). Without it (N = 0, the default), or for a
//! connection that never identified, a disconnect releases at once, as the seed does.
//!
//! Both bounds a client could otherwise walk past are here: N is at most `max_grace`
//! (`--max-session-grace`), and at most `max_detached` sessions wait out their grace
//! (`--max-detached-sessions`): past it, the one whose grace ends first is evicted (its tasks
//! released) to make room, so a flood of identify-and-disconnect churns its own sessions
//! rather than growing the table or pinning tasks. The waiting sessions are kept in deadline
//! order, so a turn finds those due in O(log n) each, whatever the table holds.
//!
//! This holds no tasks: it says which engine session to release and when.

use std::collections::{BTreeSet, HashMap};

use tarq_engine::{Micros, SessionId};

use crate::config::{DEFAULT_MAX_DETACHED_SESSIONS, DEFAULT_MAX_SESSION_GRACE};

/// An identified session.
#[derive(Debug)]
struct Entry {
    sid: SessionId,
    /// Connections attached to it now.
    conns: u32,
    /// With no connection: when its tasks are released.
    expires: Option<Micros>,
}

/// What a connection's close means for its session's tasks.
#[derive(Debug, PartialEq, Eq)]
pub enum OnClose {
    /// Release the session's tasks now.
    Release(SessionId),
    /// Another connection holds the session, or it waits out `ttr`.
    Keep,
}

/// `queue.cfg{ttr = N}` with N above `--max-session-grace`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GraceTooLong {
    pub asked: Micros,
    pub max: Micros,
}

/// The identified sessions and the grace they get.
#[derive(Debug)]
pub struct TubeSessions {
    ttr: Micros,
    max_grace: Micros,
    max_detached: usize,
    by_uuid: HashMap<[u8; 16], Entry>,
    /// The sessions waiting out their grace, as (expires, uuid): the first is due first.
    detached: BTreeSet<(Micros, [u8; 16])>,
    /// Sessions evicted to make room, released on the next turn with the expired.
    evicted: Vec<SessionId>,
}

impl Default for TubeSessions {
    fn default() -> Self {
        TubeSessions::new(DEFAULT_MAX_SESSION_GRACE, DEFAULT_MAX_DETACHED_SESSIONS)
    }
}

impl TubeSessions {
    /// No grace until `queue.cfg{ttr}` asks for one, at most `max_grace`, kept for at most
    /// `max_detached` sessions at once.
    pub fn new(max_grace: Micros, max_detached: usize) -> Self {
        TubeSessions {
            ttr: 0,
            max_grace,
            max_detached,
            by_uuid: HashMap::new(),
            detached: BTreeSet::new(),
            evicted: Vec::new(),
        }
    }

    /// `queue.cfg{ttr = N}`: the grace of sessions whose last connection closes from now on;
    /// refused (and the grace left as it was) above `max_grace`.
    pub fn set_ttr(&mut self, ttr: Micros) -> Result<(), GraceTooLong> {
        if ttr > self.max_grace {
            return Err(GraceTooLong {
                asked: ttr,
                max: self.max_grace,
            });
        }
        self.ttr = ttr;
        Ok(())
    }

    /// Gives a new session `uuid` to the connection whose session is `sid`.
    pub fn create(&mut self, uuid: [u8; 16], sid: SessionId) {
        self.by_uuid.insert(
            uuid,
            Entry {
                sid,
                conns: 1,
                expires: None,
            },
        );
    }

    /// Attaches a connection to the known session `uuid`: its session id, or `None` when the
    /// UUID was never issued or its grace ran out.
    pub fn attach(&mut self, uuid: &[u8; 16]) -> Option<SessionId> {
        let e = self.by_uuid.get_mut(uuid)?;
        e.conns += 1;
        if let Some(at) = e.expires.take() {
            self.detached.remove(&(at, *uuid));
        }
        Some(e.sid)
    }

    /// A connection of session `sid` (identified as `uuid`, if it did) leaves it: it closed, or
    /// it attached to another session.
    pub fn detach(&mut self, sid: SessionId, uuid: Option<[u8; 16]>, now: Micros) -> OnClose {
        let Some(uuid) = uuid else {
            return OnClose::Release(sid);
        };
        let Some(e) = self.by_uuid.get_mut(&uuid) else {
            return OnClose::Release(sid);
        };
        e.conns = e.conns.saturating_sub(1);
        if e.conns > 0 {
            return OnClose::Keep;
        }
        if self.ttr == 0 || self.max_detached == 0 {
            self.by_uuid.remove(&uuid);
            return OnClose::Release(sid);
        }
        let at = now.saturating_add(self.ttr);
        e.expires = Some(at);
        if self.detached.len() >= self.max_detached {
            let (_, first) = self.detached.pop_first().expect("the table is full");
            let gone = self
                .by_uuid
                .remove(&first)
                .expect("a detached session is known");
            self.evicted.push(gone.sid);
        }
        self.detached.insert((at, uuid));
        OnClose::Keep
    }

    /// Session `sid` ends now, whoever is attached: its UUID is forgotten, so no connection
    /// resumes it (its holds went with a link to their owner). O(sessions); true when it had
    /// one.
    pub fn end(&mut self, sid: SessionId) -> bool {
        let Some(uuid) = (self.by_uuid.iter())
            .find(|(_, e)| e.sid == sid)
            .map(|(u, _)| *u)
        else {
            return false;
        };
        if let Some(e) = self.by_uuid.remove(&uuid) {
            if let Some(at) = e.expires {
                self.detached.remove(&(at, uuid));
            }
        }
        true
    }

    /// When the next session's grace ends (now, when one was evicted), for the loop's sleep.
    pub fn next_deadline(&self) -> Option<Micros> {
        if self.evicted.is_empty() {
            self.detached.first().map(|&(at, _)| at)
        } else {
            Some(0)
        }
    }

    /// Sessions whose grace ended by `now`, and those evicted: forgotten here, their tasks for
    /// the caller to release. O(log n) for each.
    pub fn expired(&mut self, now: Micros) -> Vec<SessionId> {
        let mut gone = std::mem::take(&mut self.evicted);
        while let Some(&(at, uuid)) = self.detached.first() {
            if at > now {
                break;
            }
            self.detached.pop_first();
            let e = self
                .by_uuid
                .remove(&uuid)
                .expect("a detached session is known");
            gone.push(e.sid);
        }
        gone
    }

    /// Panics unless the deadline order and the table agree: each waiting session once, with
    /// its deadline, and none past the limit.
    #[cfg(test)]
    fn check(&self) {
        assert!(self.detached.len() <= self.max_detached);
        let waiting = self
            .by_uuid
            .values()
            .filter(|e| e.expires.is_some())
            .count();
        assert_eq!(
            waiting,
            self.detached.len(),
            "waiting sessions out of order"
        );
        for (at, uuid) in &self.detached {
            let e = &self.by_uuid[uuid];
            assert_eq!((e.expires, e.conns), (Some(*at), 0));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const U: [u8; 16] = [7; 16];

    #[test]
    fn without_ttr_a_close_releases_at_once() {
        let mut s = TubeSessions::default();
        assert_eq!(
            s.detach(5, None, 0),
            OnClose::Release(5),
            "never identified"
        );
        s.create(U, 6);
        assert_eq!(s.detach(6, Some(U), 0), OnClose::Release(6));
        assert_eq!(s.attach(&U), None, "forgotten");
    }

    #[test]
    fn with_ttr_a_session_waits_for_its_uuid_and_then_is_released() {
        let mut s = TubeSessions::default();
        s.set_ttr(60).unwrap();
        s.create(U, 6);
        assert_eq!(s.detach(6, Some(U), 100), OnClose::Keep);
        assert_eq!(s.next_deadline(), Some(160));
        assert!(s.expired(159).is_empty());
        assert_eq!(
            s.attach(&U),
            Some(6),
            "reconnected in time: the same session"
        );
        assert!(s.expired(1_000).is_empty(), "attached: no grace runs");
        assert_eq!(s.detach(6, Some(U), 200), OnClose::Keep);
        assert_eq!(s.expired(260), vec![6]);
        assert_eq!(s.attach(&U), None);
        assert_eq!(s.next_deadline(), None);
    }

    #[test]
    fn an_ended_session_cannot_be_resumed_attached_or_waiting() {
        let mut s = TubeSessions::default();
        s.set_ttr(60).unwrap();
        s.create(U, 6);
        assert!(s.end(6));
        assert_eq!(s.detach(6, Some(U), 100), OnClose::Release(6));
        assert_eq!(s.attach(&U), None);
        s.create(U, 7);
        assert_eq!(s.detach(7, Some(U), 100), OnClose::Keep);
        assert!(s.end(7), "waiting out its grace");
        assert_eq!((s.next_deadline(), s.attach(&U)), (None, None));
        assert!(!s.end(8), "never identified");
        s.check();
    }

    #[test]
    fn a_session_with_two_connections_outlives_one() {
        let mut s = TubeSessions::default();
        s.create(U, 6);
        assert_eq!(s.attach(&U), Some(6));
        assert_eq!(s.detach(6, Some(U), 0), OnClose::Keep);
        assert_eq!(s.detach(6, Some(U), 0), OnClose::Release(6));
    }

    #[test]
    fn a_grace_above_the_limit_is_refused_and_the_old_one_kept() {
        let mut s = TubeSessions::new(100, 10);
        s.set_ttr(100).unwrap();
        assert_eq!(
            s.set_ttr(101),
            Err(GraceTooLong {
                asked: 101,
                max: 100
            })
        );
        s.create(U, 6);
        assert_eq!(s.detach(6, Some(U), 1_000), OnClose::Keep);
        assert_eq!(s.next_deadline(), Some(1_100), "the grace set before");
    }

    fn uuid(i: u32) -> [u8; 16] {
        let mut u = [0; 16];
        u[..4].copy_from_slice(&i.to_le_bytes());
        u
    }

    /// The hostile loop (identify, disconnect, again): the table never holds more than its
    /// limit, the session whose grace ends first makes room, and its tasks are due at once.
    #[test]
    fn a_flood_of_detached_sessions_evicts_the_first_due() {
        let mut s = TubeSessions::new(1_000, 3);
        s.set_ttr(1_000).unwrap();
        for i in 0..3 {
            s.create(uuid(i), u64::from(i));
            assert_eq!(
                s.detach(u64::from(i), Some(uuid(i)), u64::from(i)),
                OnClose::Keep
            );
            s.check();
        }
        assert_eq!(s.next_deadline(), Some(1_000));
        for i in 3..10 {
            s.create(uuid(i), u64::from(i));
            assert_eq!(
                s.detach(u64::from(i), Some(uuid(i)), u64::from(i)),
                OnClose::Keep
            );
            s.check();
            assert_eq!(s.next_deadline(), Some(0), "an eviction is released now");
            assert_eq!(s.expired(u64::from(i)), vec![u64::from(i) - 3]);
            assert_eq!(s.attach(&uuid(i - 3)), None, "evicted: forgotten");
        }
        assert_eq!(s.attach(&uuid(9)), Some(9), "the newest kept");
        s.check();
        assert_eq!(s.expired(1_007), vec![7]);
        assert_eq!(s.expired(10_000), vec![8]);
        assert_eq!(s.next_deadline(), None);
        s.check();
    }

    /// Expiry reads only what is due: a session attached again leaves the deadline order,
    /// and sessions expire in deadline order, not table order.
    #[test]
    fn sessions_expire_in_deadline_order() {
        let mut s = TubeSessions::new(1_000, 100);
        for (i, ttr) in [(0, 500), (1, 100), (2, 300)] {
            s.set_ttr(ttr).unwrap();
            s.create(uuid(i), u64::from(i));
            s.detach(u64::from(i), Some(uuid(i)), 0);
        }
        s.check();
        assert_eq!(s.next_deadline(), Some(100));
        assert_eq!(s.attach(&uuid(2)), Some(2));
        s.check();
        assert_eq!(s.expired(400), vec![1]);
        assert_eq!(s.next_deadline(), Some(500));
        assert_eq!(s.expired(500), vec![0]);
        assert_eq!(s.next_deadline(), None);
        s.check();
    }

    #[test]
    fn no_room_for_detached_sessions_releases_at_once() {
        let mut s = TubeSessions::new(1_000, 0);
        s.set_ttr(1_000).unwrap();
        s.create(U, 6);
        assert_eq!(s.detach(6, Some(U), 0), OnClose::Release(6));
        assert_eq!(s.attach(&U), None);
    }
}
