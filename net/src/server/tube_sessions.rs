//! Sessions of the tarantool/queue API: a connection that calls `queue.identify()` gets a
//! 16-byte UUID naming its session (the engine's session id its tasks are taken by). With
//! `queue.cfg{ttr = N}`, when the last connection of an identified session closes, its tasks
//! stay taken for N seconds, and a connection that calls `queue.identify(uuid)` in that time
//! owns them again (ack and release work). Without it (N = 0, the default), or for a
//! connection that never identified, a disconnect releases at once, as the seed does.
//!
//! This holds no tasks: it says which engine session to release and when.

use std::collections::HashMap;

use tarq_engine::{Micros, SessionId};

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

/// The identified sessions and the grace they get.
#[derive(Debug, Default)]
pub struct TubeSessions {
    ttr: Micros,
    by_uuid: HashMap<[u8; 16], Entry>,
    /// The earliest `expires`, so a turn looks at the table only when one is due.
    next_expiry: Option<Micros>,
}

impl TubeSessions {
    /// `queue.cfg{ttr = N}`: the grace of sessions whose last connection closes from now on.
    pub fn set_ttr(&mut self, ttr: Micros) {
        self.ttr = ttr;
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
        e.expires = None;
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
        if self.ttr == 0 {
            self.by_uuid.remove(&uuid);
            return OnClose::Release(sid);
        }
        let at = now.saturating_add(self.ttr);
        e.expires = Some(at);
        self.next_expiry = Some(self.next_expiry.map_or(at, |n| n.min(at)));
        OnClose::Keep
    }

    /// When the next session's grace ends, for the loop's sleep.
    pub fn next_deadline(&self) -> Option<Micros> {
        self.next_expiry
    }

    /// Sessions whose grace ended by `now`: forgotten here, their tasks for the caller to
    /// release.
    pub fn expired(&mut self, now: Micros) -> Vec<SessionId> {
        if self.next_expiry.is_none_or(|n| n > now) {
            return Vec::new();
        }
        let mut gone = Vec::new();
        let mut next = None::<Micros>;
        self.by_uuid.retain(|_, e| match e.expires {
            Some(at) if at <= now => {
                gone.push(e.sid);
                false
            }
            Some(at) => {
                next = Some(next.map_or(at, |n| n.min(at)));
                true
            }
            None => true,
        });
        self.next_expiry = next;
        gone
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
        s.set_ttr(60);
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
    fn a_session_with_two_connections_outlives_one() {
        let mut s = TubeSessions::default();
        s.create(U, 6);
        assert_eq!(s.attach(&U), Some(6));
        assert_eq!(s.detach(6, Some(U), 0), OnClose::Keep);
        assert_eq!(s.detach(6, Some(U), 0), OnClose::Release(6));
    }
}
