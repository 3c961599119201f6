//! Every open connection and the turn's lists over them: which to read, which to read again,
//! which to flush, which wait for a durability ticket, which linger while closing. One owned
//! value, so the parts of the server that answer clients (the core's host, the front-ends, the
//! router) are handed the connections alone instead of reaching into the loop.
//!
//! A slot is freed only by the loop's flush phase; a connection's token carries its
//! generation, so an event or an answer for a slot since reused is told apart
//! ([`Conns::slot_of`], [`Conns::is_live`]).

use std::ops::{Index, IndexMut};

use mio::Token;
use slab::Slab;
use tarq_engine::Micros;

use super::conn::{Conn, Protocol};
use crate::core::journal::Ticket;
use crate::core::{Caller, Outcome};
use crate::frontend::{self, beanstalk, ReplyTo};

/// Connection tokens are `generation << 32 | (slot + FIRST_CONN_TOKEN)`; the tokens below are
/// the listeners' and the waker's.
pub(super) const FIRST_CONN_TOKEN: usize = 4;

/// The connections and the turn's lists of them.
#[derive(Default)]
pub(crate) struct Conns {
    slab: Slab<Conn>,
    /// Connections to read this turn (readable events, or left over from the budget).
    pub read: Vec<usize>,
    /// Connections that stopped at their read budget: read again next turn. Those that read
    /// nothing this turn come first, those that read go in `read_again_fed` and after them,
    /// so the turn's input allowance goes round the connections instead of to the same few.
    pub read_again: Vec<usize>,
    pub read_again_fed: Vec<usize>,
    /// Connections with replies or a close to flush this turn.
    pub flush: Vec<usize>,
    /// Connections whose replies wait for a durability ticket: (slot, generation).
    pub holding: Vec<(usize, u32)>,
    /// Closing connections still writing the replies owed to them: (slot, generation, the
    /// time their slot is freed regardless).
    pub lingering: Vec<(usize, u32, Micros)>,
    next_gen: u32,
}

impl Conns {
    /// The slot and token the next connection gets, with its generation.
    pub fn next_slot(&mut self) -> (usize, u32, Token) {
        let idx = self.slab.vacant_key();
        self.next_gen = self.next_gen.wrapping_add(1);
        let gen = self.next_gen;
        (
            idx,
            gen,
            Token(((gen as usize) << 32) | (idx + FIRST_CONN_TOKEN)),
        )
    }

    /// Opens connection `conn` in the slot [`next_slot`](Self::next_slot) gave, queued for
    /// this turn's flush (its greeting).
    pub fn insert(&mut self, conn: Conn) -> usize {
        let idx = self.slab.insert(conn);
        self.mark_flush(idx);
        idx
    }

    /// Frees slot `idx` (the flush phase's, once its close is written).
    pub fn remove(&mut self, idx: usize) -> Conn {
        self.slab.remove(idx)
    }

    /// The connection an event's token names, if that connection is still open.
    pub fn slot_of(&self, token: usize) -> Option<usize> {
        let idx = (token & 0xffff_ffff).checked_sub(FIRST_CONN_TOKEN)?;
        let gen = (token >> 32) as u32;
        self.slab.get(idx).filter(|c| c.gen == gen).map(|_| idx)
    }

    /// Whether slot `idx` still holds the connection of generation `gen`.
    pub fn holds(&self, idx: usize, gen: u32) -> bool {
        self.slab.get(idx).is_some_and(|c| c.gen == gen)
    }

    /// Whether `caller`'s connection is still the one that asked.
    pub fn is_live(&self, caller: Caller) -> bool {
        self.holds(caller.slot(), caller.gen)
    }

    /// Connection `idx` as the core knows it.
    #[inline]
    pub fn caller(&self, idx: usize) -> Caller {
        let c = &self.slab[idx];
        Caller::new(idx, c.gen, c.sid)
    }

    pub fn get(&self, idx: usize) -> Option<&Conn> {
        self.slab.get(idx)
    }

    pub fn get_mut(&mut self, idx: usize) -> Option<&mut Conn> {
        self.slab.get_mut(idx)
    }

    pub fn iter(&self) -> slab::Iter<'_, Conn> {
        self.slab.iter()
    }

    pub fn iter_mut(&mut self) -> slab::IterMut<'_, Conn> {
        self.slab.iter_mut()
    }

    /// How many connections are open.
    pub fn len(&self) -> usize {
        self.slab.len()
    }

    /// Queues connection `idx` for this turn's flush.
    #[inline]
    pub fn mark_flush(&mut self, idx: usize) {
        queue_flush(&mut self.slab[idx], idx, &mut self.flush);
    }

    /// Connection `idx`'s reply buffer, queued for this turn's flush.
    #[inline]
    pub fn out(&mut self, idx: usize) -> &mut Vec<u8> {
        self.mark_flush(idx);
        &mut self.slab[idx].out.out
    }

    /// Writes `outcome` for connection `idx` through its front-end, queued for the turn's
    /// flush. A beanstalk connection whose answer was still to come (a reserve that waited, a
    /// command sent on to another node) runs the commands behind it next turn (`read_again`).
    #[inline]
    pub fn deliver(&mut self, idx: usize, reply: ReplyTo, outcome: &Outcome<'_>) {
        self.mark_flush(idx);
        if let ReplyTo::Beanstalk(r) = reply {
            return self.deliver_beanstalk(idx, r, outcome);
        }
        frontend::encode(&mut self.slab[idx].out.out, reply, outcome);
    }

    /// [`deliver`](Self::deliver) for a beanstalk connection, out of the IPROTO path's way: the
    /// answer may end the hold on the commands behind it.
    #[inline(never)]
    fn deliver_beanstalk(&mut self, idx: usize, r: beanstalk::Reply, outcome: &Outcome<'_>) {
        let c = &mut self.slab[idx];
        match &mut c.proto {
            Protocol::Beanstalk(bs) => {
                if beanstalk::deliver(&mut c.out.out, bs, r, outcome) && c.closing.is_none() {
                    self.read_again.push(idx);
                }
            }
            _ => beanstalk::encode(&mut c.out.out, r, outcome),
        }
    }

    /// Lingering connections past their deadline `now` are flushed one last time (and so
    /// freed); closed ones are forgotten.
    pub fn end_lingering(&mut self, now: Micros) {
        let (slab, flush) = (&mut self.slab, &mut self.flush);
        self.lingering.retain(|&(idx, gen, until)| {
            let Some(c) = slab.get_mut(idx).filter(|c| c.gen == gen) else {
                return false;
            };
            if until <= now {
                queue_flush(c, idx, flush);
                return false;
            }
            true
        });
    }

    /// Queues for this turn's flush every connection with replies released and not queued
    /// (a stop's turns, which dispatch no events).
    pub fn flush_released(&mut self) {
        for (idx, c) in self.slab.iter_mut() {
            if c.out.has_released() {
                queue_flush(c, idx, &mut self.flush);
            }
        }
    }

    /// Runs `release` over every connection holding replies for a durability ticket: those
    /// with replies released are added to `list` (the turn's flush), those holding nothing
    /// more are forgotten, as are closed ones.
    pub fn release_holding(
        &mut self,
        list: &mut Vec<usize>,
        mut release: impl FnMut(usize, &mut Conn),
    ) {
        if self.holding.is_empty() {
            return;
        }
        let slab = &mut self.slab;
        self.holding.retain(|&(idx, gen)| {
            let Some(c) = slab.get_mut(idx).filter(|c| c.gen == gen) else {
                return false;
            };
            release(idx, c);
            if c.out.has_released() {
                queue_flush(c, idx, list);
            }
            c.out.has_holds()
        });
        self.holding.sort_unstable();
        self.holding.dedup();
    }

    /// The oldest ticket a held reply waits for, if any waits.
    pub fn oldest_hold(&self) -> Option<Ticket> {
        (self.holding.iter())
            .filter_map(|&(idx, _)| self.slab.get(idx)?.out.oldest_hold())
            .min()
    }

    /// When the next lingering connection is freed regardless.
    pub fn next_linger(&self) -> Option<Micros> {
        self.lingering.iter().map(|&(_, _, until)| until).min()
    }
}

/// Puts connection `c` (slot `idx`) on `list`, the turn's flush, once.
#[inline]
fn queue_flush(c: &mut Conn, idx: usize, list: &mut Vec<usize>) {
    if !c.to_flush {
        c.to_flush = true;
        list.push(idx);
    }
}

impl Index<usize> for Conns {
    type Output = Conn;

    #[inline]
    fn index(&self, idx: usize) -> &Conn {
        &self.slab[idx]
    }
}

impl IndexMut<usize> for Conns {
    #[inline]
    fn index_mut(&mut self, idx: usize) -> &mut Conn {
        &mut self.slab[idx]
    }
}
