//! Puts waiting for room: a put into a full `limfifottl` tube with a timeout waits, like a parked
//! take, until a task leaves the tube (ack, delete, bury-free expiry, truncate) or its deadline
//! passes; then it is answered through its front-end's reply token — the task, or "full". The
//! original polls every 10 ms; here the put is retried when the tube changes, in arrival order.
//! The put's payload and keys are copied out of the request (the frame is gone by then).

use std::collections::VecDeque;

use tarq_engine::{Micros, PutOutcome, QueueError, TubeIx, TubePut};

use super::{Caller, Command, Core, Host, Outcome, Refusal};

/// Puts that may wait at once, server-wide: each holds its payload, so the bound caps the
/// memory held for producers that outrun their consumers (at the 16 MiB frame cap, the worst
/// case is large; real waiting puts are small, and 4096 producers blocked on one tube is
/// already far past any deployment of the original, which holds a fiber per waiting put).
pub const MAX_WAITING_PUTS: usize = 4096;

/// A put into a full tube, waiting for room.
#[derive(Debug)]
pub struct WaitingPut<R> {
    pub caller: Caller,
    tube: TubeIx,
    pub reply: R,
    deadline: Micros,
    data: Box<[u8]>,
    utube: Box<[u8]>,
    dedup_key: Option<Box<[u8]>>,
    delay: Micros,
    ttl: Option<Micros>,
    ttr: Option<Micros>,
    pri: Option<i64>,
}

impl<R> WaitingPut<R> {
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
#[derive(Debug)]
pub struct WaitingPuts<R>(VecDeque<WaitingPut<R>>);

impl<R> Default for WaitingPuts<R> {
    fn default() -> Self {
        WaitingPuts(VecDeque::new())
    }
}

impl<R> WaitingPuts<R> {
    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub fn waiting_in(&self, tube: TubeIx) -> bool {
        self.0.iter().any(|p| p.tube == tube)
    }

    /// The `i`-th waiting put's tube (for serving every tube after deadlines fired).
    pub fn tube_at(&self, i: usize) -> Option<TubeIx> {
        self.0.get(i).map(|p| p.tube)
    }

    /// The earliest deadline of a waiting put.
    pub fn next_deadline(&self) -> Option<Micros> {
        self.0.iter().map(|p| p.deadline).min()
    }

    pub fn pop_front(&mut self) -> Option<WaitingPut<R>> {
        self.0.pop_front()
    }
}

impl<R: Copy> Core<R> {
    /// Queues a put into the full `tube` for up to `wait`.
    pub(super) fn park_put(
        &mut self,
        caller: Caller,
        reply: R,
        put: (TubeIx, &[u8], TubePut<'_>, Micros),
        host: &mut impl Host<R>,
    ) {
        let (tube, data, opts, wait) = put;
        if self.waiting_puts.len() >= MAX_WAITING_PUTS {
            host.deliver(caller, reply, &Outcome::Full);
            return;
        }
        self.waiting_puts.0.push_back(WaitingPut {
            caller,
            tube,
            reply,
            deadline: self.mono.saturating_add(wait),
            data: data.into(),
            utube: opts.utube.into(),
            dedup_key: opts.dedup_key.map(Into::into),
            delay: opts.delay,
            ttl: opts.ttl,
            ttr: opts.ttr,
            pri: opts.pri,
        });
    }

    /// Retries the waiting puts of `tube`, oldest first, while they find room.
    pub(super) fn serve_waiting_puts(&mut self, tube: TubeIx, host: &mut impl Host<R>) {
        let mut i = 0;
        while i < self.waiting_puts.len() {
            let p = &self.waiting_puts.0[i];
            if p.tube != tube {
                i += 1;
                continue;
            }
            if !host.is_live(p.caller) {
                self.waiting_puts.0.remove(i);
                continue;
            }
            // The put may run now: the disk must have room for it, as for any change; on a
            // full disk it is answered with the refusal instead of waiting on.
            let cmd = Command::PutIn {
                tube,
                data: &p.data,
                opts: p.opts(),
                wait: 0,
            };
            let bytes = self.record_bound(&cmd);
            if let Err(message) = self.journal.admit_change(bytes) {
                let p = self.waiting_puts.0.remove(i).expect("the waiting put");
                host.changed(p.caller);
                host.deliver(
                    p.caller,
                    p.reply,
                    &Outcome::Error(Refusal::Journal(message)),
                );
                continue;
            }
            let p = &self.waiting_puts.0[i];
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
            host.changed(p.caller);
            host.deliver(p.caller, p.reply, &outcome);
            self.waiting_puts.0.remove(i);
        }
    }

    /// Answers "full" to the waiting puts whose deadline passed.
    pub fn expire_waiting_puts(&mut self, host: &mut impl Host<R>) {
        let now = self.mono;
        self.waiting_puts.0.retain(|p| {
            if p.deadline > now {
                return true;
            }
            if host.is_live(p.caller) {
                host.deliver(p.caller, p.reply, &Outcome::Full);
            }
            false
        });
    }

    /// The tube was dropped: its waiting puts get the error a put into it would.
    pub(super) fn refuse_waiting_puts(&mut self, tube: TubeIx, host: &mut impl Host<R>) {
        self.waiting_puts.0.retain(|p| {
            if p.tube != tube {
                return true;
            }
            if host.is_live(p.caller) {
                let e = Refusal::Queue(QueueError::TubeNotFound(tube));
                host.deliver(p.caller, p.reply, &Outcome::Error(e));
            }
            false
        });
    }
}
