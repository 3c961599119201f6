//! Who holds what: the sessions that have taken tasks and, per session, the list of its taken
//! tasks in take order, so that `release_session` costs O(tasks it holds) and an ack or
//! release unlinks its task in O(1). The list is intrusive and costs a taken task no byte
//! beyond its slot: a Taken task is in no status skiplist (nothing needs Taken tasks in
//! (pri, id) order but a restart, which sorts them once), so its level-0 links (`next0`,
//! `prev0`) thread it into its session's list instead, and the slot word that holds a
//! listed task's tower (free of it while Taken) names the session (`Slot::owner_ix`).

use std::collections::HashMap;
use std::hash::BuildHasherDefault;

use slab::Slab;

use crate::index::IdHasher;
use crate::slots::Slots;
use crate::NIL;
use crate::{SessionId, Status};

/// One session holding tasks: its id and the ends of its list of taken slots (take order).
#[derive(Clone, Copy, Debug)]
struct Session {
    sid: SessionId,
    head: u32,
    tail: u32,
    len: u32,
}

#[derive(Debug, Default)]
pub(crate) struct Sessions {
    /// Taken tasks, over all sessions.
    live: usize,
    list: Slab<Session>,
    by_sid: HashMap<SessionId, u32, BuildHasherDefault<IdHasher>>,
    /// The last session that took, `(sid, index + 1)` (0 = none): a connection usually takes
    /// several times in a row, and this skips the hash lookup.
    last: (SessionId, u32),
}

impl Sessions {
    /// By tube index (`tubes` of them), how many sessions hold at least one of its tasks.
    /// O(taken tasks).
    pub fn holders(&self, slots: &Slots, tubes: usize) -> Vec<u64> {
        let mut count = vec![0u64; tubes];
        let mut seen: Vec<crate::TubeIx> = Vec::new();
        for (_, s) in self.list.iter() {
            seen.clear();
            let mut k = s.head;
            while k != NIL {
                let slot = &slots[k as usize];
                if !seen.contains(&slot.tube) {
                    seen.push(slot.tube);
                    if let Some(c) = count.get_mut(slot.tube as usize) {
                        *c += 1;
                    }
                }
                k = slot.next0;
            }
        }
        count
    }

    /// Taken tasks, over all sessions. O(1).
    pub fn len(&self) -> usize {
        self.live
    }

    /// Records that session `sid` took slot `k` (in no list), after its earlier tasks: links
    /// the slot's `next0` / `prev0` into the session's list and sets its `owner_ix` to the session. A session's
    /// entry is made on its first take and kept until `detach`.
    pub fn append(&mut self, slots: &mut Slots, sid: SessionId, k: u32) {
        let ix = if self.last.1 != 0 && self.last.0 == sid {
            self.last.1 - 1
        } else if let Some(&ix) = self.by_sid.get(&sid) {
            ix
        } else {
            let ix = u32::try_from(self.list.insert(Session {
                sid,
                head: NIL,
                tail: NIL,
                len: 0,
            }))
            .expect("sessions fit u32");
            self.by_sid.insert(sid, ix);
            ix
        };
        self.last = (sid, ix + 1);
        let session = &mut self.list[ix as usize];
        let tail = session.tail;
        let s = &mut slots[k as usize];
        s.set_owner_ix(ix);
        s.prev0 = tail;
        s.next0 = NIL;
        if tail == NIL {
            session.head = k;
        } else {
            slots[tail as usize].next0 = k;
        }
        session.tail = k;
        session.len += 1;
        self.live += 1;
    }

    /// The first slot session `sid` holds (take order; walk on with `next0`), NIL if none.
    pub fn first(&self, sid: SessionId) -> u32 {
        match self.by_sid.get(&sid) {
            Some(&ix) => self.list[ix as usize].head,
            None => NIL,
        }
    }

    /// The session at index `ix` (a Taken slot's `owner_ix`).
    pub fn owner(&self, ix: u32) -> SessionId {
        self.list[ix as usize].sid
    }

    /// Unlinks Taken slot `k` from its session's list and clears its `owner_ix`. O(1).
    pub fn remove(&mut self, slots: &mut Slots, k: u32) {
        let s = &mut slots[k as usize];
        let (ix, prev, next) = (s.owner_ix(), s.prev0, s.next0);
        s.set_owner_ix(NIL);
        s.prev0 = NIL;
        s.next0 = NIL;
        let session = &mut self.list[ix as usize];
        if prev == NIL {
            session.head = next;
        } else {
            slots[prev as usize].next0 = next;
        }
        if next == NIL {
            session.tail = prev;
        } else {
            slots[next as usize].prev0 = prev;
        }
        session.len -= 1;
        self.live -= 1;
    }

    /// Forgets session `sid` and returns its first taken slot (NIL if none); walk the rest
    /// with `pop_detached`.
    pub fn detach(&mut self, sid: SessionId) -> Option<u32> {
        let ix = self.by_sid.remove(&sid)?;
        if self.last.0 == sid {
            self.last = (0, 0);
        }
        Some(self.list.remove(ix as usize).head)
    }

    /// Takes slot `k` of a detached session out of the session list (clearing its links and
    /// `owner_ix`); returns the next slot of that session.
    pub fn pop_detached(&mut self, slots: &mut Slots, k: u32) -> u32 {
        let s = &mut slots[k as usize];
        let next = s.next0;
        s.set_owner_ix(NIL);
        s.prev0 = NIL;
        s.next0 = NIL;
        self.live -= 1;
        next
    }

    /// Calls `f` with taken slots, session by session in take order, while it returns true.
    pub fn walk_taken(&self, slots: &Slots, mut f: impl FnMut(u32) -> bool) {
        for (_, session) in &self.list {
            let mut k = session.head;
            while k != NIL {
                if !f(k) {
                    return;
                }
                k = slots[k as usize].next0;
            }
        }
    }

    /// Every taken slot, session by session in take order.
    pub fn taken_slots(&self, slots: &Slots) -> Vec<u32> {
        let mut out = Vec::with_capacity(self.live);
        for (_, session) in &self.list {
            let mut k = session.head;
            while k != NIL {
                out.push(k);
                k = slots[k as usize].next0;
            }
        }
        out
    }

    /// Forgets every session (all taken tasks must be gone).
    pub fn clear(&mut self) {
        debug_assert_eq!(self.live, 0, "sessions cleared while tasks are held");
        self.list.clear();
        self.by_sid.clear();
        self.last = (0, 0);
    }

    pub fn capacity_bytes(&self) -> usize {
        use std::mem::size_of;
        self.list.capacity() * (size_of::<Session>() + 8)
            + self.by_sid.capacity() * (size_of::<(SessionId, u32)>() + 1)
    }

    /// Panics unless every session's list is consistent: each node is a live Taken slot
    /// pointing back at its session, back links mirror forward links, tail and length agree.
    /// Returns the taken slots walked.
    pub fn check(&self, slots: &Slots) -> usize {
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
            let (mut k, mut prev, mut len) = (session.head, NIL, 0);
            while k != NIL {
                let s = slots
                    .get(k as usize)
                    .unwrap_or_else(|| panic!("session {sid} holds free slot {k}"));
                assert_eq!(
                    s.status,
                    Status::Taken,
                    "task {} held by {sid} is {:?}",
                    s.id,
                    s.status
                );
                assert_eq!(
                    s.owner_ix(),
                    ix,
                    "task {} held by {sid} points at session {}",
                    s.id,
                    s.owner_ix()
                );
                assert_eq!(s.prev0, prev, "session {sid}: back link of task {}", s.id);
                prev = k;
                k = s.next0;
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
            "{} tasks taken, {walked} in sessions",
            self.live
        );
        walked
    }
}
