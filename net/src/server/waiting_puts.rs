//! Puts waiting for room: a put into a full `limfifottl` tube with a timeout waits, like a parked
//! take, until a task leaves the tube (ack, delete, bury-free expiry, truncate) or its deadline
//! passes; then it is answered through its front-end's [`ReplyTo`] — the task, or "full". The
//! original polls every 10 ms; here the put is retried when the tube changes, in arrival order.
//! The put's payload and keys are copied out of the request (the frame is gone by then).

use std::collections::VecDeque;

use tarq_engine::{Micros, PutOutcome, QueueError, TubeIx, TubePut};

use super::dispatch::{Outcome, Refusal};
use super::Server;
use crate::frontend::ReplyTo;

/// Puts that may wait at once, server-wide: each holds its payload, so the bound caps the
/// memory held for producers that outrun their consumers (at the 16 MiB frame cap, the worst
/// case is large; real waiting puts are small, and 4096 producers blocked on one tube is
/// already far past any deployment of the original, which holds a fiber per waiting put).
pub const MAX_WAITING_PUTS: usize = 4096;

/// A put into a full tube, waiting for room.
#[derive(Debug)]
pub struct WaitingPut {
    pub(super) conn: usize,
    pub(super) gen: u32,
    tube: TubeIx,
    pub(super) reply: ReplyTo,
    deadline: Micros,
    data: Box<[u8]>,
    utube: Box<[u8]>,
    dedup_key: Option<Box<[u8]>>,
    delay: Micros,
    ttl: Option<Micros>,
    ttr: Option<Micros>,
    pri: Option<i64>,
}

impl WaitingPut {
    fn opts(&self) -> TubePut<'_> {
        TubePut {
            delay: self.delay,
            ttl: self.ttl,
            ttr: self.ttr,
            pri: self.pri,
            utube: &self.utube,
            dedup_key: self.dedup_key.as_deref(),
        }
    }
}

/// Every waiting put, in arrival order (few, and served per tube).
pub type WaitingPuts = VecDeque<WaitingPut>;

impl Server {
    /// Queues a put into the full `tube` for up to `wait`.
    pub(super) fn park_put(
        &mut self,
        idx: usize,
        reply: ReplyTo,
        tube: TubeIx,
        data: &[u8],
        opts: TubePut<'_>,
        wait: Micros,
    ) {
        if self.waiting_puts.len() >= MAX_WAITING_PUTS {
            self.deliver(idx, reply, &Outcome::Full);
            return;
        }
        self.waiting_puts.push_back(WaitingPut {
            conn: idx,
            gen: self.conns[idx].gen,
            tube,
            reply,
            deadline: self.now.saturating_add(wait),
            data: data.into(),
            utube: opts.utube.into(),
            dedup_key: opts.dedup_key.map(Into::into),
            delay: opts.delay,
            ttl: opts.ttl,
            ttr: opts.ttr,
            pri: opts.pri,
        });
    }

    pub(super) fn waiting_puts_in(&self, tube: TubeIx) -> bool {
        self.waiting_puts.iter().any(|p| p.tube == tube)
    }

    /// The `i`-th waiting put's tube (for serving every tube after deadlines fired).
    pub(super) fn waiting_put_tube(&self, i: usize) -> Option<TubeIx> {
        self.waiting_puts.get(i).map(|p| p.tube)
    }

    /// Retries the waiting puts of `tube`, oldest first, while they find room.
    pub(super) fn serve_waiting_puts(&mut self, tube: TubeIx) {
        let mut i = 0;
        while i < self.waiting_puts.len() {
            if self.waiting_puts[i].tube != tube {
                i += 1;
                continue;
            }
            let p = &self.waiting_puts[i];
            if self.conns.get(p.conn).is_none_or(|c| c.gen != p.gen) {
                self.waiting_puts.remove(i);
                continue;
            }
            // The put may run now: the disk must have room for it, as for any change; on a
            // full disk it is answered with the refusal instead of waiting on.
            let cmd = super::dispatch::Command::PutIn {
                tube,
                data: &p.data,
                opts: p.opts(),
                wait: 0,
            };
            let bytes = self.record_bound(&cmd);
            if let Err(message) = self.journal.admit_change(bytes) {
                let p = self.waiting_puts.remove(i).expect("the waiting put");
                self.conns[p.conn].out.changed = true;
                super::dispatch::deliver_to(
                    &mut self.conns,
                    &mut self.flush_list,
                    p.conn,
                    p.reply,
                    &Outcome::Error(Refusal::Journal(message)),
                );
                continue;
            }
            let p = &self.waiting_puts[i];
            let res = self.queue.put_in(self.now, tube, &*p.data, p.opts());
            let outcome = match res {
                Err(QueueError::TubeFull { .. }) => return,
                Ok(PutOutcome::Created(t) | PutOutcome::Duplicate(t)) => Outcome::Task(t),
                Ok(PutOutcome::DuplicateDone(id)) => Outcome::DoneId {
                    id,
                    number: self.queue.task_number(tube, id),
                },
                Err(e) => Outcome::Error(Refusal::Queue(e)),
            };
            let (conn, reply) = (p.conn, p.reply);
            self.conns[conn].out.changed = true;
            super::dispatch::deliver_to(
                &mut self.conns,
                &mut self.flush_list,
                conn,
                reply,
                &outcome,
            );
            self.waiting_puts.remove(i);
        }
    }

    /// Answers "full" to the waiting puts whose deadline passed.
    pub(super) fn expire_waiting_puts(&mut self) {
        let now = self.now;
        let mut i = 0;
        while i < self.waiting_puts.len() {
            let p = &self.waiting_puts[i];
            if p.deadline <= now {
                let (conn, gen, reply) = (p.conn, p.gen, p.reply);
                self.waiting_puts.remove(i);
                if self
                    .conns
                    .get(conn)
                    .is_some_and(|c| c.gen == gen && c.closing.is_none())
                {
                    self.deliver(conn, reply, &Outcome::Full);
                }
            } else {
                i += 1;
            }
        }
    }

    /// The earliest deadline of a waiting put.
    pub(super) fn next_waiting_put_deadline(&self) -> Option<Micros> {
        self.waiting_puts.iter().map(|p| p.deadline).min()
    }

    /// The tube was dropped: its waiting puts get the error a put into it would.
    pub(super) fn refuse_waiting_puts(&mut self, tube: TubeIx) {
        while let Some(pos) = self.waiting_puts.iter().position(|p| p.tube == tube) {
            let p = self.waiting_puts.remove(pos).expect("found above");
            if self.conns.get(p.conn).is_some_and(|c| c.gen == p.gen) {
                let e = Refusal::Queue(QueueError::TubeNotFound(tube));
                self.deliver(p.conn, p.reply, &Outcome::Error(e));
            }
        }
    }
}
