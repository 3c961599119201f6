//! [`Core::execute`]: every front-end's commands run here, against the engine, the parked
//! takes, the waiting puts and the journal's refusals, and every result goes to the host as an
//! [`Outcome`] with the caller's reply token. A take that parks keeps its token, so it is
//! answered in its own connection's protocol when a task or its deadline comes.

use tarq_engine::{
    Bytes, Micros, PutOptions, PutOutcome, QueueError, ReleaseOptions, Status, Task, TaskId,
    TaskRef, TubeIx, TubePut, DEFAULT_TUBE,
};

use super::command::{Listed, TaskFigures};
use super::parked::MAX_PARKED_PER_CONN;
use super::{Caller, Command, Core, Host, On, Outcome, Refusal};

impl<R: Copy> Core<R> {
    /// Runs `cmd` for `caller` and answers it through `host` with `reply` (now, or when a
    /// parked take is served or times out, or a waiting put finds room). Inlined into its two
    /// callers, the loop's dispatch and its out-of-line twin for a sharded node's commands.
    ///
    /// `cmd` is lent, not moved: the front-end's request it sits in is read in place, with no
    /// copy of its 120 bytes on the hot path.
    #[inline(always)]
    pub fn execute(
        &mut self,
        caller: Caller,
        reply: R,
        cmd: &Command<'_>,
        host: &mut impl Host<R>,
    ) {
        if let Some(r) = self.refusal(cmd, host) {
            host.deliver(caller, reply, &Outcome::Error(r));
            return;
        }
        if cmd.changes() {
            host.changed(caller);
        }
        // The pair of the reservation: what the change logged stays within what it reserved.
        #[cfg(debug_assertions)]
        let reserved = cmd
            .changes()
            .then(|| (self.record_bound(cmd), self.journal.pending_bytes()));
        let woke = match *cmd {
            Command::Put { data, opts } => self.put(caller, reply, data, opts, host),
            Command::PutIn {
                tube,
                data,
                opts,
                wait,
            } => self.put_in(caller, reply, (tube, data, opts, wait), host),
            Command::Take { on, timeout } => {
                self.take(caller, reply, on.tube(), timeout, host);
                None
            }
            Command::TakeAny {
                tubes,
                timeout,
                wake,
            } => {
                self.take_any(caller, reply, tubes, timeout, wake, host);
                None
            }
            Command::Watch { tube } => {
                self.watch(caller, reply, tube, host);
                None
            }
            Command::DropCheck { tube } => {
                self.drop_check(caller, reply, tube, host);
                None
            }
            Command::Ack { on, id } => self.ack(caller, reply, on, id, host),
            Command::Release { on, id, opts } => self.release(caller, reply, on, id, opts, host),
            other => self.execute_admin(caller, reply, other, host),
        };
        self.drain_events();
        if let Some(tube) = woke {
            self.serve_parked(tube, host);
        }
        #[cfg(debug_assertions)]
        if let Some((bound, before)) = reserved {
            self.drain_events();
            let logged = self.journal.pending_bytes().saturating_sub(before);
            assert!(
                logged <= bound,
                "{cmd:?} logged {logged} bytes of records, over the {bound} it reserved"
            );
        }
    }

    /// Why `cmd` may not run now: the node's role, or the journal's refusal of a change it
    /// cannot make durable, checked before the queue is touched (the journal reserves the room
    /// for the change's records otherwise).
    #[inline(always)]
    pub fn refusal(&mut self, cmd: &Command<'_>, host: &impl Host<R>) -> Option<Refusal> {
        // Only the primary's records change a replica's queue; a take would too. A cluster
        // node checks its fence here, before the change runs.
        if !cmd.reads_only() && !host.leads() {
            return Some(host.not_leading());
        }
        let admitted = match cmd {
            Command::Take { .. } | Command::TakeAny { .. } | Command::TakeTask { .. } => {
                self.journal.admit_take()
            }
            c if c.changes() => {
                let bytes = self.record_bound(c);
                self.journal.admit_change(bytes)
            }
            _ => return None,
        };
        admitted.err().map(Refusal::Journal)
    }

    /// [`refusal`](Self::refusal) of a batch whose first command is `first` and whose records
    /// take at most `bytes`: the room for all its items is reserved at once.
    pub fn batch_refusal(
        &mut self,
        first: &Command<'_>,
        bytes: u64,
        host: &impl Host<R>,
    ) -> Option<Refusal> {
        if !first.reads_only() && !host.leads() {
            return Some(host.not_leading());
        }
        let admitted = match first {
            Command::Take { .. } => self.journal.admit_take(),
            _ => self.journal.admit_change(bytes),
        };
        admitted.err().map(Refusal::Journal)
    }

    /// `data` as a handle into the big frame it arrived in, when that frame's buffer was
    /// handed over and the payload is most of it: the task keeps the payload where it was
    /// read instead of a copy, and holds at most as much again of the rest of the frame (a
    /// batch of smaller payloads in one frame is copied, or one left in the queue would keep
    /// the whole frame).
    fn frame_payload(&self, data: &[u8]) -> Option<Bytes> {
        let frame = self.big_frame.as_ref()?;
        let within = frame.as_ptr_range();
        let ptrs = data.as_ptr_range();
        let inside = within.start <= ptrs.start && ptrs.end <= within.end;
        (inside && data.len() * 2 >= frame.len()).then(|| frame.slice_ref(data))
    }

    #[inline(always)]
    fn put(
        &mut self,
        caller: Caller,
        reply: R,
        data: &[u8],
        opts: PutOptions,
        host: &mut impl Host<R>,
    ) -> Option<TubeIx> {
        let put = match self.frame_payload(data) {
            Some(payload) => self.queue.try_put(self.now, payload, opts),
            None => self.queue.try_put(self.now, data, opts),
        };
        match put {
            Ok(t) => host.deliver(caller, reply, &Outcome::Task(t)),
            Err(e) => {
                host.deliver(caller, reply, &Outcome::Error(e.into()));
                return None;
            }
        }
        (opts.delay == 0).then_some(DEFAULT_TUBE)
    }

    /// A put into a tube: `(tube, data, opts, wait)`.
    fn put_in(
        &mut self,
        caller: Caller,
        reply: R,
        put: (TubeIx, &[u8], TubePut<'_>, Micros),
        host: &mut impl Host<R>,
    ) -> Option<TubeIx> {
        let (tube, data, opts, wait) = put;
        let res = match self.frame_payload(data) {
            Some(payload) => self.queue.put_in(self.now, tube, payload, opts),
            None => self.queue.put_in(self.now, tube, data, opts),
        };
        let outcome = match res {
            Ok(PutOutcome::Created(t)) => {
                let ready = t.status == Status::Ready;
                host.deliver(caller, reply, &Outcome::Task(t));
                return ready.then_some(tube);
            }
            Ok(PutOutcome::Duplicate(t)) => Outcome::Task(t),
            Ok(PutOutcome::DuplicateDone(id)) => Outcome::DoneId {
                id,
                number: self.queue.task_number(tube, id),
            },
            Err(QueueError::TubeFull { .. }) if wait > 0 => {
                self.park_put(caller, reply, put, host);
                return None;
            }
            Err(QueueError::TubeFull { .. }) => Outcome::Full,
            Err(e) => Outcome::Error(e.into()),
        };
        host.deliver(caller, reply, &outcome);
        None
    }

    fn take(
        &mut self,
        caller: Caller,
        reply: R,
        tube: TubeIx,
        timeout: Option<Micros>,
        host: &mut impl Host<R>,
    ) {
        if self.pauses.paused(tube, self.mono) {
            return match timeout {
                Some(0) => host.deliver(caller, reply, &Outcome::Nothing),
                _ => self.park_take(caller, reply, tube, timeout, host),
            };
        }
        match self.queue.take_from(self.now, tube, caller.sid) {
            Ok(Some(t)) => host.deliver(caller, reply, &Outcome::Task(t)),
            Ok(None) if timeout == Some(0) => host.deliver(caller, reply, &Outcome::Nothing),
            Ok(None) => self.park_take(caller, reply, tube, timeout, host),
            Err(e) => host.deliver(caller, reply, &Outcome::Error(e.into())),
        }
    }

    /// `Command::Watch`: answered now if a take of `tube` would get a task, else parked. Out
    /// of line: only a sharded cluster's links send it.
    #[cold]
    #[inline(never)]
    fn watch(&mut self, caller: Caller, reply: R, tube: TubeIx, host: &mut impl Host<R>) {
        if self.queue.tube_info(tube).is_none() {
            let e = tarq_engine::QueueError::TubeNotFound(tube);
            return host.deliver(caller, reply, &Outcome::Error(e.into()));
        }
        self.watch_any(caller, reply, &[tube], host);
    }

    /// Watches `tubes` for `caller`: `Outcome::Ready` names the first of them that has a task
    /// a take would get — now, or once one has (then the watch's group ends, on every tube).
    /// Returns the group of a watch that waits, for [`unwatch`](Self::unwatch).
    pub fn watch_any(
        &mut self,
        caller: Caller,
        reply: R,
        tubes: &[TubeIx],
        host: &mut impl Host<R>,
    ) -> Option<u64> {
        let ready = tubes
            .iter()
            .copied()
            .find(|&t| !self.pauses.paused(t, self.mono) && self.queue.can_take(t));
        if let Some(tube) = ready {
            host.deliver(caller, reply, &Outcome::Ready(tube));
            return None;
        }
        if self.parked.count_of(caller.slot()) + tubes.len() > MAX_PARKED_PER_CONN {
            host.deliver(caller, reply, &Outcome::Error(Refusal::TooManyParked));
            return None;
        }
        Some(self.parked.park_watch(caller, tubes, reply))
    }

    /// Ends the watch `group` of connection `slot` (its waiter was served another way).
    pub fn unwatch(&mut self, slot: usize, group: u64) {
        self.parked.remove_group(slot, group);
    }

    /// Ends the watches connection `slot` parked to be answered as `reply` (a link's request
    /// whose node needs it no more), unanswered.
    pub fn unwatch_reply(&mut self, slot: usize, reply: R)
    where
        R: PartialEq,
    {
        self.parked.remove_watches(slot, reply);
    }

    fn park_take(
        &mut self,
        caller: Caller,
        reply: R,
        tube: TubeIx,
        timeout: Option<Micros>,
        host: &mut impl Host<R>,
    ) {
        let deadline = timeout.map_or(Micros::MAX, |t| self.mono.saturating_add(t));
        self.park_on(caller, reply, &[tube], deadline, host);
    }

    /// Parks one take on every tube of `tubes` (whichever gets a task first serves it; the
    /// front-end drops the other entries then).
    fn park_on(
        &mut self,
        caller: Caller,
        reply: R,
        tubes: &[TubeIx],
        deadline: Micros,
        host: &mut impl Host<R>,
    ) {
        if self.parked.count_of(caller.slot()) + tubes.len() > MAX_PARKED_PER_CONN {
            host.deliver(caller, reply, &Outcome::Error(Refusal::TooManyParked));
            return;
        }
        self.takes_parked += 1;
        let group = self.parked.new_group();
        for &tube in tubes {
            self.parked.park(caller, tube, reply, deadline, group);
        }
    }

    /// A take from the tube of `tubes` whose ready head is lowest in (pri, id), skipping
    /// paused tubes; parked on all of them when none has one.
    fn take_any(
        &mut self,
        caller: Caller,
        reply: R,
        tubes: &[TubeIx],
        timeout: Option<Micros>,
        wake: Micros,
        host: &mut impl Host<R>,
    ) {
        let (now, mono) = (self.now, self.mono);
        let best = tubes
            .iter()
            .filter(|&&t| !self.pauses.paused(t, mono) && self.queue.can_take(t))
            .filter_map(|&t| {
                let head = self.queue.peek_first(t, Status::Ready).ok().flatten()?;
                Some((head.pri, head.id, t))
            })
            .min();
        if let Some((_, _, tube)) = best {
            match self.queue.take_from(now, tube, caller.sid) {
                Ok(Some(t)) => host.deliver(caller, reply, &Outcome::Task(t)),
                Ok(None) => host.deliver(caller, reply, &Outcome::Nothing),
                Err(e) => host.deliver(caller, reply, &Outcome::Error(e.into())),
            }
            return;
        }
        match timeout {
            Some(0) => host.deliver(caller, reply, &Outcome::Nothing),
            _ => self.park_on(caller, reply, tubes, wake, host),
        }
    }

    #[inline(always)]
    fn ack(
        &mut self,
        caller: Caller,
        reply: R,
        on: On,
        id: TaskId,
        host: &mut impl Host<R>,
    ) -> Option<TubeIx> {
        let res = match on {
            On::Seed => self.queue.ack(caller.sid, id),
            On::Tube(t) => self.queue.ack_in(t, caller.sid, id),
        };
        let woke = self.room_or_head_freed(on.tube());
        match res {
            Ok(t) => host.deliver(caller, reply, &Outcome::Done(t)),
            Err(e) => host.deliver(caller, reply, &Outcome::Error(e.into())),
        }
        woke
    }

    fn release(
        &mut self,
        caller: Caller,
        reply: R,
        on: On,
        id: TaskId,
        opts: ReleaseOptions,
        host: &mut impl Host<R>,
    ) -> Option<TubeIx> {
        let res = match on {
            On::Seed => self.queue.release(self.now, caller.sid, id, opts.delay),
            On::Tube(t) => self.queue.release_in(self.now, t, caller.sid, id, opts),
        };
        match res {
            Ok(t) => {
                host.deliver(caller, reply, &Outcome::Task(t));
                Some(on.tube())
            }
            Err(e) => {
                host.deliver(caller, reply, &Outcome::Error(e.into()));
                None
            }
        }
    }

    /// After a task of `tube` left: a utube head may be free, a full tube may have room.
    fn room_or_head_freed(&self, tube: TubeIx) -> Option<TubeIx> {
        self.has_waiters(tube).then_some(tube)
    }

    /// The calls beyond put / take / ack / release: a change of tasks, a read of figures, or
    /// a call about the node (tubes, users, snapshots).
    fn execute_admin(
        &mut self,
        caller: Caller,
        reply: R,
        cmd: Command<'_>,
        host: &mut impl Host<R>,
    ) -> Option<TubeIx> {
        let (outcome, woke) = match cmd {
            Command::DropTube { tube } => return self.drop_tube(caller, reply, tube, host),
            Command::Peek { .. }
            | Command::PeekFirst { .. }
            | Command::ListTasks { .. }
            | Command::TaskFigures { .. }
            | Command::TubeFigures { .. }
            | Command::TubeStats { .. }
            | Command::AllTubeStats => (self.read_figures(cmd), None),
            Command::CreateTube { .. }
            | Command::Pause { .. }
            | Command::Move { .. }
            | Command::PutUser { .. }
            | Command::DropUser { .. }
            | Command::Snapshot => (self.node_call(cmd), None),
            Command::Put { .. }
            | Command::PutIn { .. }
            | Command::Take { .. }
            | Command::TakeAny { .. }
            | Command::Watch { .. }
            | Command::DropCheck { .. }
            | Command::Ack { .. }
            | Command::Release { .. } => unreachable!("run by `execute`"),
            cmd => self.change_tasks(caller.sid, cmd),
        };
        host.deliver(caller, reply, &outcome);
        woke
    }

    /// A change of tasks beyond put / take / ack / release, and the tube whose waiters it may
    /// wake.
    fn change_tasks(
        &mut self,
        sid: tarq_engine::SessionId,
        cmd: Command<'_>,
    ) -> (Outcome<'_>, Option<TubeIx>) {
        let now = self.now;
        let q = &mut self.queue;
        match cmd {
            Command::Touch { tube, id, delta } => (task(q.touch(tube, sid, id, delta)), None),
            Command::Bury { tube, id } => (task(q.bury(tube, id)), Some(tube)),
            Command::Kick { tube, count: n } => (count(q.kick(tube, n)), Some(tube)),
            Command::Delete { tube, id } => (done(q.delete(tube, id)), Some(tube)),
            Command::ReleaseAll { tube } => (ok(q.release_all(tube)), Some(tube)),
            Command::Truncate { tube } => (ok(q.truncate(tube)), Some(tube)),
            Command::TakeTask { id } => (task(q.take_task(now, sid, id)), None),
            Command::BuryTaken { id, pri } => {
                let r = q.bury_taken(sid, id, pri);
                let tube = r.as_ref().ok().map(|t| t.tube);
                (task(r), tube)
            }
            Command::TouchTtr { id } => (task(q.touch_ttr(now, sid, id)), None),
            Command::KickAny { tube, count: n } => {
                let buried = q.tube_stats(tube).map_or(0, |s| s.buried);
                let kicked = if buried > 0 {
                    q.kick(tube, n)
                } else {
                    q.kick_delayed(now, tube, n)
                };
                (count(kicked), Some(tube))
            }
            Command::KickTask { id } => {
                let r = q.kick_task(now, id);
                let tube = r.as_ref().ok().map(|t| t.tube);
                (task(r), tube)
            }
            Command::DeleteJob { id } => match q.get(id) {
                Some(t) if t.owner.is_none_or(|o| o == sid) => {
                    let tube = t.tube;
                    (done(q.delete(tube, id)), Some(tube))
                }
                _ => (Outcome::Error(QueueError::NotFound(id).into()), None),
            },
            other => unreachable!("{other:?} is not a change of tasks"),
        }
    }

    /// A read: a task, a tube's tasks or figures, every tube's.
    fn read_figures(&self, cmd: Command<'_>) -> Outcome<'_> {
        let q = &self.queue;
        let error = |e: QueueError| Outcome::Error(e.into());
        match cmd {
            Command::Peek { tube, id } => task(q.peek(tube, id)),
            Command::TubeStats { tube } => match q.tube_stats(tube) {
                Ok(s) => Outcome::TubeStats(super::with_takers(
                    s,
                    q,
                    &self.parked,
                    &self.routed_waiting,
                    tube,
                    &q.holders(),
                )),
                Err(e) => error(e),
            },
            Command::PeekFirst { tube, status } => match q.peek_first(tube, status) {
                Ok(Some(t)) => Outcome::Task(t),
                Ok(None) => Outcome::Nothing,
                Err(e) => error(e),
            },
            Command::ListTasks {
                tube,
                status,
                after,
                limit,
            } => match q.list(tube, status, after, limit as usize) {
                Ok(tasks) => Outcome::Tasks(tasks.iter().map(Listed::of).collect()),
                Err(e) => error(e),
            },
            Command::TaskFigures { id } => match task_figures(q, id, self.now) {
                Some(f) => Outcome::TaskFigures(Box::new(f)),
                None => error(QueueError::NotFound(id)),
            },
            Command::TubeFigures { tube } => match q.tube_stats(tube) {
                Ok(stats) => {
                    let urgent = q.ready_urgent(tube).unwrap_or(0);
                    Outcome::TubeFigures { stats, urgent }
                }
                Err(e) => error(e),
            },
            Command::AllTubeStats => {
                let holders = q.holders();
                let all = (q.named_tubes())
                    .filter(|t| t.name != tarq_engine::DEFAULT_TUBE_NAME)
                    .map(|t| {
                        let s = q.tube_stats(t.ix).unwrap_or_default();
                        let s = super::with_takers(
                            s,
                            q,
                            &self.parked,
                            &self.routed_waiting,
                            t.ix,
                            &holders,
                        );
                        (t.name.to_owned(), s)
                    })
                    .collect();
                Outcome::AllStats(all)
            }
            other => unreachable!("{other:?} is not a read"),
        }
    }

    /// A call about the node rather than tasks: a tube made, a pause, a user, a snapshot.
    fn node_call(&mut self, cmd: Command<'_>) -> Outcome<'_> {
        let q = &mut self.queue;
        match cmd {
            Command::CreateTube { partitions, .. } if partitions > 1 => {
                let why = format!(
                    "a tube of {partitions} partitions needs a sharded cluster (--replica-set)"
                );
                Outcome::Error(Refusal::Shards(why))
            }
            Command::CreateTube {
                name,
                kind,
                opts,
                if_not_exists,
                ..
            } => {
                let found = q.tube_ix(name).filter(|_| if_not_exists);
                // A tube beanstalk's `use` made is one `create_tube` keeps from now on.
                let kept = found.map(|t| q.keep_tube(t).map(|_| t));
                match kept.unwrap_or_else(|| q.create_tube(name, kind, opts)) {
                    Ok(t) => Outcome::Tube(q.tube_info(t).expect("live")),
                    Err(e) => Outcome::Error(e.into()),
                }
            }
            Command::Pause { tube, pause } => {
                self.pauses.pause(tube, pause);
                Outcome::Ok
            }
            Command::Move { .. } => {
                let why = "moving a partition needs a sharded cluster (--replica-set)".into();
                Outcome::Error(Refusal::Shards(why))
            }
            Command::PutUser { user } => match q.put_user(user.clone()) {
                Ok(()) => Outcome::Ok,
                Err(e) => Outcome::Error(Refusal::User(e.to_string())),
            },
            Command::DropUser { name } => {
                q.drop_user(name);
                Outcome::Ok
            }
            Command::Snapshot => match self.journal.snapshot() {
                None => Outcome::Error(Refusal::NoSnapshots),
                Some(Ok(text)) => Outcome::Text(text),
                Some(Err(msg)) => Outcome::Error(Refusal::Journal(msg)),
            },
            other => unreachable!("{other:?} is not a call about the node"),
        }
    }

    /// drop: refused while a take waits on the tube or a protocol's connections hold it; its
    /// waiting puts get the error a put into a missing tube gets.
    fn drop_tube(
        &mut self,
        caller: Caller,
        reply: R,
        tube: TubeIx,
        host: &mut impl Host<R>,
    ) -> Option<TubeIx> {
        if self.parked.waiting_in(tube) || host.tube_in_use(tube) {
            host.deliver(caller, reply, &Outcome::Error(Refusal::Consumers));
            return None;
        }
        let last = self.queue.tube_stats(tube);
        match self.queue.drop_tube(tube) {
            Ok(()) => {
                host.tube_dropped(tube, &last.unwrap_or_default());
                self.pauses.forget(tube);
                self.refuse_waiting_puts(tube, host);
                host.deliver(caller, reply, &Outcome::Dropped);
            }
            Err(e) => host.deliver(caller, reply, &Outcome::Error(e.into())),
        }
        None
    }

    /// `Command::DropCheck`: the next number `tube` gives, if nothing holds it.
    #[cold]
    #[inline(never)]
    fn drop_check(&mut self, caller: Caller, reply: R, tube: TubeIx, host: &mut impl Host<R>) {
        let outcome = match self.may_drop(tube, host) {
            Ok(next) => Outcome::Count(next),
            Err(e) => Outcome::Error(e),
        };
        host.deliver(caller, reply, &outcome);
    }

    /// Whether `tube` may be dropped now: the next number it would give, or why not (a task
    /// taken, a take waiting, a protocol's connections using it).
    pub fn may_drop(&self, tube: TubeIx, host: &impl Host<R>) -> Result<u64, Refusal> {
        let stats = self.queue.tube_stats(tube)?;
        if self.parked.waiting_in(tube) || host.tube_in_use(tube) {
            return Err(Refusal::Consumers);
        }
        if stats.taken > 0 {
            return Err(tarq_engine::QueueError::TubeHasTaken(tube).into());
        }
        Ok(self.queue.tube_numbers(tube).next)
    }

    /// Drops a tube a sharded cluster's placement no longer has (dropped through another
    /// node): whatever waits on it is answered with no task, its tasks go, then the tube
    /// (journaled as a truncate and a drop).
    pub fn drop_placed(&mut self, tube: TubeIx, host: &mut impl Host<R>) {
        if self.queue.tube_info(tube).is_none() || tube == tarq_engine::DEFAULT_TUBE {
            return;
        }
        while let Some((_, p)) = self.parked.pop_oldest(tube) {
            if host.is_live(p.caller) {
                self.parked.remove_group(p.caller.slot(), p.group);
                host.deliver(p.caller, p.reply, &Outcome::Nothing);
            }
        }
        let last = self.queue.tube_stats(tube).unwrap_or_default();
        let _ = self.queue.truncate(tube);
        if self.queue.drop_tube(tube).is_ok() {
            host.tube_dropped(tube, &last);
            self.pauses.forget(tube);
            self.refuse_waiting_puts(tube, host);
        }
        self.drain_events();
    }

    /// Creates tube `name` (`fifottl`, default options) for a front-end that creates tubes on
    /// first use (beanstalk's `use` and `watch`), logged to the journal like `create_tube`. It
    /// is marked made on demand: dropped once empty and unused.
    pub fn create_tube_on_demand(
        &mut self,
        caller: Caller,
        name: &str,
        host: &mut impl Host<R>,
    ) -> Result<TubeIx, Refusal> {
        let cmd = Command::CreateTube {
            name,
            kind: tarq_engine::TubeType::FifoTtl,
            opts: Default::default(),
            if_not_exists: true,
            partitions: 1,
        };
        if let Some(r) = self.refusal(&cmd, host) {
            return Err(r);
        }
        host.changed(caller);
        let opts = tarq_engine::TubeOptions {
            on_demand: true,
            ..Default::default()
        };
        let t = self
            .queue
            .create_tube(name, tarq_engine::TubeType::FifoTtl, opts)
            .map_err(Refusal::Queue)?;
        self.drain_events();
        Ok(t)
    }

    /// Drops tube `t` if it was made on demand, holds no task, and nothing waits on it or may
    /// not change now.
    pub fn drop_if_unneeded(&mut self, t: TubeIx, host: &mut impl Host<R>) -> Unneeded {
        let Ok(last) = self.queue.tube_stats(t) else {
            return Unneeded::Kept;
        };
        let drop = Command::DropTube { tube: t };
        if self.parked.waiting_in(t) || self.refusal(&drop, host).is_some() {
            return Unneeded::Later;
        }
        match self.queue.drop_if_unneeded(t) {
            Ok(true) => {
                self.pauses.forget(t);
                self.drain_events();
                Unneeded::Dropped(last)
            }
            _ => Unneeded::Kept,
        }
    }

    /// Hands ready tasks of `tube` to its parked takes, oldest waiter first, and room in it to
    /// its waiting puts.
    pub fn serve_parked(&mut self, tube: TubeIx, host: &mut impl Host<R>) {
        if self.pauses.frozen(tube) {
            // Being moved: nothing enters or leaves until the move ends.
            return;
        }
        self.serve_waiting_puts(tube, host);
        if self.pauses.paused(tube, self.mono) {
            return;
        }
        while self.parked.waiting_in(tube) && self.queue.can_take(tube) {
            let Some((_, p)) = self.parked.pop_oldest(tube) else {
                break;
            };
            if !host.is_live(p.caller) {
                continue;
            }
            if p.wake_only {
                // Woken, not served: the task stays for whoever takes it next.
                self.parked.remove_group(p.caller.slot(), p.group);
                host.deliver(p.caller, p.reply, &Outcome::Ready(tube));
                continue;
            }
            match self.queue.take_from(self.now, tube, p.caller.sid) {
                Ok(Some(t)) => host.deliver(p.caller, p.reply, &Outcome::Task(t)),
                _ => break,
            }
            // Answered once: the takes it parked on other tubes go.
            self.parked.remove_group(p.caller.slot(), p.group);
            self.drain_events();
        }
    }

    /// `serve_parked` for every tube with waiters, parked takes or waiting puts (after
    /// deadlines fired, a session closed or a pause ended). The tubes are listed first: serving
    /// a tube's last waiter takes it out of the lists, so walking them by position while
    /// serving skipped the tube that moved into the slot just passed.
    pub fn serve_all_parked(&mut self, host: &mut impl Host<R>) {
        let mut tubes: Vec<TubeIx> = Vec::new();
        let waiting = (0..).map_while(|i| self.parked.waiting_tube(i));
        let puts = (0..).map_while(|i| self.waiting_puts.tube_at(i));
        for tube in waiting.chain(puts) {
            // In the order they wait; a tube with both kinds of waiter once.
            if !tubes.contains(&tube) {
                tubes.push(tube);
            }
        }
        for tube in tubes {
            self.serve_parked(tube, host);
        }
    }

    /// Ends the pauses that are over: their tubes' waiters are served.
    pub fn end_pauses(&mut self, host: &mut impl Host<R>) {
        if self.pauses.next_end().is_none_or(|t| t > self.mono) {
            return;
        }
        let mut ended = Vec::new();
        self.pauses.end_due(self.mono, &mut ended);
        for tube in ended {
            self.serve_parked(tube, host);
        }
    }

    /// Every taken task goes back to ready (a node that became the primary: the takers were
    /// the old primary's clients), logged, and the takes that wait for them are served.
    /// Returns how many.
    pub fn release_all_taken(&mut self, host: &mut impl Host<R>) -> usize {
        let released = self.queue.release_all_taken();
        self.drain_events();
        if released > 0 {
            self.serve_all_parked(host);
        }
        released
    }

    /// Releases every task session `sid` holds (its connection closed, or its grace ended)
    /// and serves the takes that wait for them. A node that does not lead (`leads` false)
    /// releases them silently: its queue changes only through its primary's records, and a
    /// session that took tasks while it led had them released by the new primary. Returns
    /// how many.
    pub fn release_session(
        &mut self,
        sid: tarq_engine::SessionId,
        leads: bool,
        host: &mut impl Host<R>,
    ) -> usize {
        if !leads {
            self.queue.set_journal(false);
            let released = self.queue.release_session(sid);
            self.queue.set_journal(self.journal.wants_events());
            return released;
        }
        let released = self.queue.release_session(sid);
        self.drain_events();
        if released > 0 {
            self.serve_all_parked(host);
        }
        released
    }
}

/// What [`Core::drop_if_unneeded`] did.
#[derive(Debug)]
pub enum Unneeded {
    /// Dropped, with its final counters.
    Dropped(tarq_engine::Stats),
    /// Not now: a take waits on it, or this node may change nothing now.
    Later,
    /// Not dropped: gone already, or it still holds tasks, or it was not made on demand.
    Kept,
}

/// Task `id`'s figures at `now`, if it is live.
fn task_figures(q: &tarq_engine::Queue, id: TaskId, now: Micros) -> Option<TaskFigures> {
    let t = q.get(id)?;
    let left = |deadline: Micros| deadline.saturating_sub(now);
    Some(TaskFigures {
        id,
        tube: q
            .tube_info(t.tube)
            .map_or_else(String::new, |i| i.name.to_owned()),
        status: t.status,
        pri: t.pri,
        age: now.saturating_sub(t.created),
        delay_left: match t.status {
            Status::Waiting => left(t.runat),
            _ => 0,
        },
        ttr: t.ttr,
        ttr_left: q.ttr_deadline(id).map_or(0, left),
        deliveries: t.deliveries,
        counts: t.counts,
    })
}

fn task(r: Result<TaskRef<'_>, QueueError>) -> Outcome<'_> {
    r.map_or_else(|e| Outcome::Error(e.into()), Outcome::Task)
}

fn done(r: Result<Task, QueueError>) -> Outcome<'static> {
    r.map_or_else(|e| Outcome::Error(e.into()), Outcome::Done)
}

fn count(r: Result<u64, QueueError>) -> Outcome<'static> {
    r.map_or_else(|e| Outcome::Error(e.into()), Outcome::Count)
}

fn ok(r: Result<usize, QueueError>) -> Outcome<'static> {
    r.map_or_else(|e| Outcome::Error(e.into()), |_| Outcome::Ok)
}
