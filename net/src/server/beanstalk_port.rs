//! The loop's side of the beanstalk port: it runs a connection's input step by step through
//! the front-end ([`Beanstalk::next`]), doing what each step returns — the core's command, a
//! close — and the reserve's turns the loop sees first (a wake-up, an answer, a half-close):
//! the parked entries and the read of the commands that waited are the loop's to handle, the
//! reply the front-end's.

use std::time::Instant;

use super::Server;
use crate::frontend::beanstalk::Beanstalk;
use crate::frontend::ReplyTo;

impl Server {
    /// Runs connection `idx`'s commands in `data`, one after another, until one's answer is
    /// still to come, the connection closes or is muted, or no whole command is left; returns
    /// the bytes used.
    pub(super) fn execute_beanstalk_input(&mut self, idx: usize, data: &[u8]) -> usize {
        // The room a command borrows is out of the front-end's state while the loop runs it.
        let mut room = std::mem::take(&mut self.beanstalk.room);
        let mut used = 0;
        while self.conns[idx].closing.is_none() && !self.conns[idx].muted() {
            // Timed from before its translation, as an IPROTO frame is; counted once read.
            let started = self.ops.service.next_is_timed().then(Instant::now);
            let Some(step) = Beanstalk::new(self).next(idx, &data[used..], &mut room) else {
                break;
            };
            used += step.used;
            let timed = step.command && self.ops.service.count_request();
            self.apply(idx, step.then);
            Beanstalk::new(self).ran(idx);
            if let Some(t0) = started.filter(|_| timed) {
                self.ops.service.record(t0.elapsed());
            }
        }
        self.beanstalk.room = room;
        used
    }

    /// A waiting reserve's parked entries woke (at its deadline, or for `DEADLINE_SOON`):
    /// they go, and the front-end answers or waits on; once answered, the commands behind it
    /// run.
    pub(super) fn beanstalk_reserve_woke(&mut self, idx: usize) {
        self.unpark_all(idx);
        if !self.beanstalk_waits(idx) {
            return; // answered already, a wake-up that came after
        }
        let mut room = std::mem::take(&mut self.beanstalk.room);
        let then = Beanstalk::new(self).reserve_woke(idx, &mut room);
        self.apply(idx, then);
        Beanstalk::new(self).ran(idx);
        self.beanstalk.room = room;
        if !self.beanstalk_waits(idx) {
            self.resume_input(idx);
        }
    }

    /// Whether connection `idx`'s reserve waits.
    fn beanstalk_waits(&self, idx: usize) -> bool {
        (self.conns.get(idx).and_then(|c| c.beanstalk())).is_some_and(|b| b.waiting.is_some())
    }

    /// The client shut its side while its reserve waited: the wait ends, answered
    /// `TIMED_OUT` as beanstalkd answers.
    pub(super) fn beanstalk_half_closed(&mut self, idx: usize) {
        self.unpark_all(idx);
        Beanstalk::new(self).half_closed(idx);
    }

    /// A parked take was answered: a beanstalk reserve drops its other entries and lets the
    /// commands behind it run.
    pub(crate) fn parked_answered(&mut self, idx: usize, reply: ReplyTo) {
        if matches!(reply, ReplyTo::Beanstalk(_)) {
            self.unpark_all(idx);
            Beanstalk::new(self).reserve_answered(idx);
            self.resume_input(idx);
        }
    }

    /// Drops every take connection `idx` has parked, here and on other nodes.
    pub(super) fn unpark_all(&mut self, idx: usize) {
        self.core.unpark(idx);
        self.with_router(|r, cx| r.end_waits_of(cx, idx));
    }
}
