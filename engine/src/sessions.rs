//! Who holds what: the sessions that have taken tasks and, per session, the list of its
//! claims in take order, so that `release_session` costs O(tasks it holds) and an ack or
//! release unlinks its claim in O(1). A claim ("held" record, 16 bytes) exists only while a
//! task is Taken and lives in a pool of its own rather than in the task's slot: most tasks are
//! Ready or Waiting, and keeping the owner and its links out of the slot keeps every slot
//! 12 bytes smaller.

use std::collections::HashMap;
use std::hash::BuildHasherDefault;

use slab::Slab;

use crate::heap::NIL;
use crate::queue::IdHasher;
use crate::SessionId;

/// One claim: a taken slot, its session and its neighbours in the session's list.
#[derive(Clone, Copy, Debug)]
struct Held {
    /// The task's slot key; on the free list, unused.
    slot: u32,
    /// Index of the owner in `Sessions::list`.
    sess: u32,
    prev: u32,
    /// Next claim of the session; on the free list, the next free record.
    next: u32,
}

/// One session holding tasks: its id and the ends of its claim list (take order).
#[derive(Clone, Copy, Debug)]
struct Session {
    sid: SessionId,
    head: u32,
    tail: u32,
    len: u32,
}

#[derive(Debug, Default)]
pub(crate) struct Sessions {
    held: Vec<Held>,
    /// Head of the free records of `held`, chained through `next` (0 = none, else index + 1,
    /// so that `Default` gives an empty pool).
    free: u32,
    live: usize,
    list: Slab<Session>,
    by_sid: HashMap<SessionId, u32, BuildHasherDefault<IdHasher>>,
    /// The last session that took, `(sid, index + 1)` (0 = none): a connection usually takes
    /// several times in a row, and this skips the hash lookup.
    last: (SessionId, u32),
}

impl Sessions {
    /// Records that session `sid` took `slot`, after its earlier claims; returns the claim.
    /// A session's entry is made on its first take and kept until `detach`.
    pub fn append(&mut self, sid: SessionId, slot: u32) -> u32 {
        let ix = if self.last.1 != 0 && self.last.0 == sid {
            self.last.1 - 1
        } else if let Some(&ix) = self.by_sid.get(&sid) {
            ix
        } else {
            let ix = self.list.insert(Session {
                sid,
                head: NIL,
                tail: NIL,
                len: 0,
            }) as u32;
            self.by_sid.insert(sid, ix);
            ix
        };
        self.last = (sid, ix + 1);
        let tail = self.list[ix as usize].tail;
        let rec = Held {
            slot,
            sess: ix,
            prev: tail,
            next: NIL,
        };
        let h = if self.free != 0 {
            let h = self.free - 1;
            let next_free = self.held[h as usize].next;
            self.free = if next_free == NIL { 0 } else { next_free + 1 };
            self.held[h as usize] = rec;
            h
        } else {
            self.held.push(rec);
            u32::try_from(self.held.len() - 1).expect("claims fit u32")
        };
        let session = &mut self.list[ix as usize];
        if tail == NIL {
            session.head = h;
        } else {
            self.held[tail as usize].next = h;
        }
        session.tail = h;
        session.len += 1;
        self.live += 1;
        h
    }

    /// The session holding claim `h`.
    pub fn owner(&self, h: u32) -> SessionId {
        self.list[self.held[h as usize].sess as usize].sid
    }

    /// Drops claim `h` (ack, release, TTR, expiry). O(1).
    pub fn remove(&mut self, h: u32) {
        let Held {
            sess, prev, next, ..
        } = self.held[h as usize];
        let session = &mut self.list[sess as usize];
        if prev == NIL {
            session.head = next;
        } else {
            self.held[prev as usize].next = next;
        }
        if next == NIL {
            session.tail = prev;
        } else {
            self.held[next as usize].prev = prev;
        }
        session.len -= 1;
        self.free_record(h);
    }

    fn free_record(&mut self, h: u32) {
        let rec = &mut self.held[h as usize];
        rec.slot = NIL;
        rec.sess = NIL;
        rec.prev = NIL;
        rec.next = if self.free == 0 { NIL } else { self.free - 1 };
        self.free = h + 1;
        self.live -= 1;
    }

    /// Forgets session `sid` and returns its first claim (NIL if none); walk the rest with
    /// `pop_detached`.
    pub fn detach(&mut self, sid: SessionId) -> Option<u32> {
        let ix = self.by_sid.remove(&sid)?;
        if self.last.0 == sid {
            self.last = (0, 0);
        }
        Some(self.list.remove(ix as usize).head)
    }

    /// Frees claim `h` of a detached session; returns its slot and the next claim.
    pub fn pop_detached(&mut self, h: u32) -> (u32, u32) {
        let Held { slot, next, .. } = self.held[h as usize];
        self.free_record(h);
        (slot, next)
    }

    /// Forgets every session (all claims must be gone).
    pub fn clear(&mut self) {
        debug_assert_eq!(self.live, 0, "sessions cleared while tasks are held");
        self.held.clear();
        self.free = 0;
        self.list.clear();
        self.by_sid.clear();
        self.last = (0, 0);
    }

    pub fn capacity_bytes(&self) -> usize {
        use std::mem::size_of;
        self.held.capacity() * size_of::<Held>()
            + self.list.capacity() * (size_of::<Session>() + 8)
            + self.by_sid.capacity() * (size_of::<(SessionId, u32)>() + 1)
    }

    /// Panics unless every session's list is consistent; calls `visit(slot, sid, h)` for
    /// each claim so the queue can check the slot's side. Returns the claims walked.
    pub fn check(&self, mut visit: impl FnMut(u32, SessionId, u32)) -> usize {
        assert_eq!(
            self.list.len(),
            self.by_sid.len(),
            "session tables disagree"
        );
        let mut walked = 0;
        for (&sid, &ix) in &self.by_sid {
            let session = self
                .list
                .get(ix as usize)
                .unwrap_or_else(|| panic!("session {sid} maps to free entry {ix}"));
            assert_eq!(
                session.sid, sid,
                "session {sid} maps to session {}",
                session.sid
            );
            let (mut h, mut prev, mut len) = (session.head, NIL, 0);
            while h != NIL {
                let rec = self.held[h as usize];
                assert_eq!(
                    rec.sess, ix,
                    "claim {h} of session {sid} points at {}",
                    rec.sess
                );
                assert_eq!(rec.prev, prev, "session {sid}: claim {h} back link");
                visit(rec.slot, sid, h);
                prev = h;
                h = rec.next;
                len += 1;
                assert!(
                    len <= session.len,
                    "session {sid} list longer than {}",
                    session.len
                );
            }
            assert_eq!(prev, session.tail, "session {sid} tail");
            assert_eq!(len, session.len, "session {sid} length");
            walked += len as usize;
        }
        assert_eq!(
            walked, self.live,
            "{} claims live, {walked} in sessions",
            self.live
        );
        walked
    }
}
