//! Where each command goes: run here rewritten to its partition, forwarded to its owner,
//! or a plan over several partitions (a take trying each in turn, a limfifottl put looking for
//! room).

use super::ctx::Ctx;
use super::*;

/// `make(partition)` for the partition `id` names; `cmd` as it is for an id that names none
/// (the core answers it as it would anywhere).
pub(super) fn by_id<'c>(
    id: u64,
    cmd: Command<'c>,
    make: impl FnOnce(TubeIx) -> Command<'c>,
) -> (TubeIx, Command<'c>) {
    match id_tube(id) {
        Some(ix) => (ix, make(ix)),
        None => (TubeIx::MAX, cmd),
    }
}

/// The tube a whole-tube change names (its first partition's index).
fn whole_tube(cmd: &Command<'_>) -> Option<TubeIx> {
    match *cmd {
        Command::Kick { tube, .. }
        | Command::KickAny { tube, .. }
        | Command::Truncate { tube }
        | Command::ReleaseAll { tube }
        | Command::DropTube { tube } => Some(tube),
        _ => None,
    }
}

/// A whole-tube command answered by gathering its partitions' answers: the tube, and what
/// the answers are.
fn gathered(cmd: &Command<'_>) -> Option<(TubeIx, GatherKind)> {
    match *cmd {
        Command::TubeFigures { tube } => Some((tube, GatherKind::Figures)),
        Command::TubeStats { tube } => Some((tube, GatherKind::Stats)),
        Command::Kick { tube, .. } | Command::KickAny { tube, .. } => {
            Some((tube, GatherKind::Count))
        }
        Command::Truncate { tube } | Command::Pause { tube, .. } | Command::ReleaseAll { tube } => {
            Some((tube, GatherKind::Ok))
        }
        _ => None,
    }
}

/// A [`gathered`] command for partition `t` of its tube.
fn on_partition(cmd: Command<'_>, t: TubeIx) -> Command<'_> {
    match cmd {
        Command::TubeFigures { .. } => Command::TubeFigures { tube: t },
        Command::TubeStats { .. } => Command::TubeStats { tube: t },
        Command::Kick { count, .. } => Command::Kick { tube: t, count },
        Command::KickAny { count, .. } => Command::KickAny { tube: t, count },
        Command::Truncate { .. } => Command::Truncate { tube: t },
        Command::Pause { pause, .. } => Command::Pause { tube: t, pause },
        Command::ReleaseAll { .. } => Command::ReleaseAll { tube: t },
        other => other,
    }
}

/// The tube a tube API call naming a task names too, and the task's id: a tube's calls act
/// on its own tasks only, whatever partition holds them. `None` for any other command
/// (beanstalk's and the seed API's ids are the whole queue's).
fn named_tube_and_id(cmd: &Command<'_>) -> Option<(TubeIx, u64)> {
    match *cmd {
        Command::Ack {
            on: On::Tube(tube),
            id,
        }
        | Command::Release {
            on: On::Tube(tube),
            id,
            ..
        }
        | Command::Touch { tube, id, .. }
        | Command::Peek { tube, id }
        | Command::Bury { tube, id }
        | Command::Delete { tube, id } => Some((tube, id)),
        _ => None,
    }
}

/// A command naming a task, for the partition its id names (see [`by_id`]); `None` for a
/// command that names none.
fn by_id_of(cmd: Command<'_>) -> Option<(TubeIx, Command<'_>)> {
    Some(match cmd {
        Command::Ack { on, id } => by_id(id, cmd, |ix| Command::Ack {
            on: on_ix(on, ix),
            id,
        }),
        Command::Release { on, id, opts } => by_id(id, cmd, |ix| Command::Release {
            on: on_ix(on, ix),
            id,
            opts,
        }),
        Command::Touch { id, delta, .. } => {
            by_id(id, cmd, |tube| Command::Touch { tube, id, delta })
        }
        Command::Peek { id, .. } => by_id(id, cmd, |tube| Command::Peek { tube, id }),
        Command::Bury { id, .. } => by_id(id, cmd, |tube| Command::Bury { tube, id }),
        Command::Delete { id, .. } => by_id(id, cmd, |tube| Command::Delete { tube, id }),
        Command::TakeTask { id }
        | Command::BuryTaken { id, .. }
        | Command::TouchTtr { id }
        | Command::KickTask { id }
        | Command::DeleteJob { id }
        | Command::TaskFigures { id } => by_id(id, cmd, |_| cmd),
        _ => return None,
    })
}

impl Router {
    /// A command another node forwarded, run for session `sid` of link `idx`: run here, held
    /// while its partition moves away from here, relayed once to the partition's owner when
    /// this node's set does not own it (`may_relay`: it was not relayed already), or refused.
    pub(crate) fn dispatch_forwarded(
        &mut self,
        cx: &mut Ctx<'_>,
        idx: usize,
        sid: SessionId,
        reply: ReplyTo,
        cmd: Command<'_>,
        may_relay: bool,
    ) {
        // A call relayed back here names one of this node's own sessions: only one that
        // forwarded calls (to the set that relayed it) and has not ended may be acted for.
        let own = cx.link_sessions.remote_of(sid).is_none();
        if own && !self.forwarded.contains_key(&sid) {
            let why = format!(
                "a link may act only for its own node's sessions: session {sid} of {} forwarded \
                 nothing, or has ended",
                self.me
            );
            return cx.deliver(idx, reply, &Outcome::Error(Refusal::Shards(why)));
        }
        // A partition this node has not heard of: its tube was placed since this node's last
        // read of the placement (the forwarder read it first); it runs after a read.
        if self.hold_unplaced_forwarded(cx, idx, sid, reply, &cmd, may_relay) {
            return;
        }
        let decision = self.forwarded_decision(&cmd);
        let gen = cx.wire.conns[idx].gen;
        match decision {
            Decision::Local => {}
            Decision::AwaitMove => {
                return self.hold_for_move(cx, idx, sid, reply, (true, None), &cmd);
            }
            Decision::AwaitMap => {
                return self.hold_for_map(cx, idx, sid, reply, (true, None), &cmd);
            }
            // Its partition is another set's in this node's view: relayed there, once.
            Decision::Forward(set) if may_relay => {
                let client = Client {
                    idx,
                    gen,
                    sid,
                    reply,
                };
                return self.forward(cx, set, client, cmd, Then::Deliver);
            }
            Decision::Forward(set) => {
                let why = format!(
                    "partition named by the call belongs to replica set {}, not {} (placement \
                     epoch {}); relayed once already",
                    self.sets[set].name, self.set, self.placement.epoch
                );
                return cx.deliver(idx, reply, &Outcome::Error(Refusal::Shards(why)));
            }
            Decision::Refuse(why) => {
                return cx.deliver(idx, reply, &Outcome::Error(Refusal::Shards(why)));
            }
        }
        if let Command::DropCheck { tube } = cmd {
            // One that passes holds the partition until the drop's fate is known.
            return self.drop_check_here(cx, idx, sid, reply, tube);
        }
        let caller = Caller::new(idx, gen, sid);
        self.execute_as(cx, caller, reply, cmd);
    }
}

/// The partition a utube key goes to: the same on every node (a fixed hasher).
pub(super) fn key_partition(key: &[u8], n: usize) -> usize {
    let h = BuildHasherDefault::<DefaultHasher>::default().hash_one(key);
    (h % n as u64) as usize
}

/// A take across a tube's partitions: the ones still to try, and how long it may wait.
#[derive(Clone, Debug)]
pub(super) struct TakePlan {
    pub(super) on: On,
    /// The tubes it takes from, by their first partition's index (a beanstalk reserve's
    /// watched tubes; one for the tube API's take).
    pub(super) heads: Vec<TubeIx>,
    pub(super) left: Vec<TubeIx>,
    pub(super) timeout: Option<Micros>,
}

/// A put into a partitioned limfifottl tube, owned (it outlives the request's frame): the
/// partitions still to try for room.
#[derive(Clone, Debug)]
pub(super) struct PutPlan {
    pub(super) data: Vec<u8>,
    pub(super) utube: Vec<u8>,
    pub(super) dedup_key: Option<Vec<u8>>,
    /// The put's scalar options (its keys are the fields above).
    pub(super) opts: TubePut<'static>,
    pub(super) wait: Micros,
    pub(super) left: Vec<TubeIx>,
}

impl Router {
    /// Routes `cmd` of connection `idx`: `Some` to run it here (rewritten to its partition),
    /// `None` when it was forwarded or answered.
    pub(crate) fn route<'c>(
        &mut self,
        cx: &mut Ctx<'_>,
        idx: usize,
        reply: ReplyTo,
        cmd: Command<'c>,
    ) -> Option<Command<'c>> {
        let leads = cx.leads();
        let c = &cx.wire.conns[idx];
        let client = Client {
            idx,
            gen: c.gen,
            sid: c.sid,
            reply,
        };
        if self.held_before_routing(cx, client, &cmd) {
            return None;
        }
        self.route_command(cx, client, cmd, leads)
    }

    /// Where each kind of command goes: a move, a tube's creation or a user change to etcd,
    /// a put to the partition its tube's kind picks, a take or a read across partitions, a
    /// call naming a task to its partition, anything else here as it is.
    fn route_command<'c>(
        &mut self,
        cx: &mut Ctx<'_>,
        client: Client,
        cmd: Command<'c>,
        leads: bool,
    ) -> Option<Command<'c>> {
        let (ix, cmd) = match cmd {
            Command::Move {
                tube,
                partition,
                to,
            } => {
                self.start_move(cx, client, tube, partition, to);
                return None;
            }
            Command::CreateTube { .. } => return self.create_placed(cx, client, cmd),
            Command::PutUser { .. } | Command::DropUser { .. } => {
                return self.change_user_placed(cx, client, cmd);
            }
            Command::Put { .. } => (0, cmd),
            Command::PutIn { .. } => return self.route_put(cx, client, cmd, leads),
            Command::Take { on, timeout } => {
                return self.take_across(cx, client, on, timeout, leads);
            }
            Command::TakeAny {
                tubes,
                timeout,
                wake,
            } => return self.take_any_across(cx, client, tubes, timeout, wake, leads),
            Command::PeekFirst { tube, status } => {
                return self.peek_across(cx, client, tube, status, leads);
            }
            Command::AllTubeStats => {
                self.gather_all(cx, client, leads);
                return None;
            }
            Command::ListTasks {
                tube,
                status,
                after,
                limit,
            } => {
                self.list_across(cx, client, tube, status, after, limit as usize);
                return None;
            }
            Command::DropTube { tube } if self.tubes.contains_key(&tube) => {
                self.drop_placed(cx, client, tube, leads);
                return None;
            }
            cmd => {
                if let Some((tube, kind)) = gathered(&cmd) {
                    return self.gather(cx, client, tube, kind, leads, |t| on_partition(cmd, t));
                }
                // A tube's call naming another tube's task (by its whole id) runs here as it
                // is: the core answers it as one node does (no such task in this tube).
                if named_tube_and_id(&cmd).is_some_and(|(t, id)| !self.of_tube(id, t)) {
                    return Some(cmd);
                }
                // A call naming a task goes to the partition its id names; any other runs
                // here as it is.
                match by_id_of(cmd) {
                    Some(routed) => routed,
                    None => return Some(cmd),
                }
            }
        };
        self.run_on_partition(cx, client, ix, cmd, Then::Deliver, leads)
    }

    /// Whether `cmd` waits before it is routed: a partition the routes lack (another node may
    /// have just placed its tube: it runs once this node has read the placement), figures
    /// that need a fresher view, or a change to a whole tube one of whose partitions is
    /// moving (it runs after the move).
    fn held_before_routing(&mut self, cx: &mut Ctx<'_>, client: Client, cmd: &Command<'_>) -> bool {
        if self.hold_unrouted(cx, client, cmd) || self.hold_figures_for_view(cx, client, cmd) {
            return true;
        }
        let frozen = (self.moving.is_some() || self.drop_holds.any())
            && cmd.changes()
            && whole_tube(cmd).is_some_and(|h| self.tube_frozen(h));
        if frozen {
            let (idx, sid, reply) = (client.idx, client.sid, client.reply);
            self.hold_for_move(cx, idx, sid, reply, (false, None), cmd);
        }
        frozen
    }

    /// `create_tube` on a sharded node: answered from the placement when the tube is there
    /// and the call lets it be, else placed in etcd (answered when etcd has it). Any node
    /// places a tube, replica or primary: the placement is etcd's, and each set's primary
    /// holds what it owns of the tube as it reads it.
    fn create_placed<'c>(
        &mut self,
        cx: &mut Ctx<'_>,
        client: Client,
        cmd: Command<'_>,
    ) -> Option<Command<'c>> {
        let Command::CreateTube {
            name,
            kind,
            opts,
            if_not_exists,
            partitions,
        } = cmd
        else {
            return None;
        };
        // A tube that may be there already is asked of etcd too (not answered from this
        // node's view): another node may have dropped it a moment ago. etcd's answer, made or
        // there, is the call's.
        if kind == TubeType::LimFifoTtl
            && opts.capacity > 0
            && opts.capacity < u64::from(partitions)
        {
            let why = format!(
                "a limfifottl tube's capacity ({}) is shared by its partitions: it needs at least \
                 one a partition ({partitions})",
                opts.capacity
            );
            self.answer(cx, client, &Outcome::Error(Refusal::Shards(why)));
            return None;
        }
        let token = self.next_token;
        self.next_token += 1;
        self.creates.insert(token, (client, if_not_exists));
        let cluster = (cx.cluster()).expect("a sharded node is a cluster node");
        cluster
            .handle()
            .create_tube(token, name, kind.as_str(), options_json(&opts), partitions);
        None
    }

    /// A put into a placed tube: a utube key's partition, a limfifottl tube's plan for room,
    /// or the partition [`Router::put_partition`] picks; run there. A tube the routes lack
    /// runs here as it is (the core answers it as it would anywhere).
    fn route_put<'c>(
        &mut self,
        cx: &mut Ctx<'_>,
        client: Client,
        cmd: Command<'c>,
        leads: bool,
    ) -> Option<Command<'c>> {
        let Command::PutIn {
            tube: head,
            data,
            opts,
            wait,
        } = cmd
        else {
            return Some(cmd);
        };
        let Some(t) = self.tubes.get(&head) else {
            return Some(cmd);
        };
        let n = t.parts.len();
        if t.capped && n > 1 {
            return self.put_capped(cx, client, head, data, opts, wait);
        }
        let ix = if t.utube {
            t.parts[key_partition(opts.utube, n)]
        } else {
            self.put_partition(head, leads)?
        };
        let cmd = Command::PutIn {
            tube: ix,
            data,
            opts,
            wait,
        };
        self.run_on_partition(cx, client, ix, cmd, Then::Deliver, leads)
    }

    /// Runs `cmd` on partition `ix`: here (`Some`) or forwarded to its owner, held or
    /// refused, as [`decide::for_client`] says.
    pub(super) fn run_on_partition<'c>(
        &mut self,
        cx: &mut Ctx<'_>,
        client: Client,
        ix: TubeIx,
        cmd: Command<'c>,
        then: Then,
        leads: bool,
    ) -> Option<Command<'c>> {
        // Not a placed partition (a tube of this node's own, or no such index, or a held
        // call's tube dropped meanwhile): the core answers as it would anywhere.
        let Some(f) = self.facts(self.view(), ix, leads) else {
            return Some(cmd);
        };
        let kind = Kind {
            changes: cmd.changes(),
            reads_only: cmd.reads_only(),
        };
        let (idx, sid, reply) = (client.idx, client.sid, client.reply);
        match decide::for_client(&f, kind, &self.set) {
            Decision::Local => return Some(cmd),
            Decision::Forward(set) => self.forward(cx, set, client, cmd, then),
            Decision::AwaitMove => self.hold_for_move(cx, idx, sid, reply, (false, Some(ix)), &cmd),
            Decision::AwaitMap => self.hold_for_map(cx, idx, sid, reply, (false, Some(ix)), &cmd),
            Decision::Refuse(why) => self.answer(cx, client, &Outcome::Error(Refusal::Shards(why))),
        }
        None
    }

    /// A take on `on`'s tube: the partitions this node leads first, then the others. `Some`:
    /// a take to run here; `None`: it was forwarded, or it waits.
    pub(super) fn take_across<'c>(
        &mut self,
        cx: &mut Ctx<'_>,
        client: Client,
        on: On,
        timeout: Option<Micros>,
        leads: bool,
    ) -> Option<Command<'c>> {
        let head = on.tube();
        let Some(t) = self.tubes.get(&head) else {
            return Some(Command::Take { on, timeout });
        };
        let (mut here, mut there): (Vec<TubeIx>, Vec<TubeIx>) =
            t.parts.iter().partition(|&&p| self.here(p, leads));
        // A partition led here that may not be served now (a stale view, a move) is skipped.
        let v = self.view();
        here.retain(|&ix| self.hold_in(v, ix).is_none());
        if there.is_empty() && here.len() == 1 {
            // One partition, led here: the core's own take, waiting as it does.
            let ix = here[0];
            return Some(Command::Take {
                on: on_ix(on, ix),
                timeout,
            });
        }
        self.rr = self.rr.wrapping_add(1);
        let rr = self.rr;
        let (nh, nt) = (here.len().max(1), there.len().max(1));
        here.rotate_left(rr % nh);
        there.rotate_left(rr % nt);
        if let Some(&ix) = here.iter().find(|&&ix| cx.core.queue().can_take(ix)) {
            return Some(Command::Take {
                on: on_ix(on, ix),
                timeout: Some(0),
            });
        }
        self.take_next(
            cx,
            client,
            TakePlan {
                on,
                heads: vec![head],
                left: there,
                timeout,
            },
        );
        None
    }

    /// A beanstalk reserve over the tubes its connection watches: a partition led here with a
    /// task ready, else the others in turn, else it waits on every partition of them all.
    /// When every watched tube is one partition led here, the core's own reserve (waiting,
    /// and woken for `DEADLINE_SOON`, as on a single node).
    pub(super) fn take_any_across<'c>(
        &mut self,
        cx: &mut Ctx<'_>,
        client: Client,
        tubes: &'c [TubeIx],
        timeout: Option<Micros>,
        wake: Micros,
        leads: bool,
    ) -> Option<Command<'c>> {
        let cmd = Command::TakeAny {
            tubes,
            timeout,
            wake,
        };
        let Some(&first) = tubes.first() else {
            return Some(cmd);
        };
        let (here, mut there, own) = self.watched_partitions(tubes, leads);
        if own {
            return Some(cmd);
        }
        self.rr = self.rr.wrapping_add(1);
        let n = there.len().max(1);
        there.rotate_left(self.rr % n);
        let (q, pauses, mono) = (cx.core.queue(), cx.core.pauses(), cx.mono);
        if here
            .iter()
            .any(|&ix| !pauses.paused(ix, mono) && q.can_take(ix))
        {
            let caller = Caller::new(client.idx, client.gen, client.sid);
            let now = Command::TakeAny {
                tubes: &here,
                timeout: Some(0),
                wake,
            };
            self.execute_as(cx, caller, client.reply, now);
            return None;
        }
        let plan = TakePlan {
            on: On::Tube(first),
            heads: tubes.to_vec(),
            left: there,
            timeout,
        };
        self.take_next(cx, client, plan);
        None
    }

    /// beanstalk's peek-ready / -delayed / -buried on a partitioned tube: the first partition
    /// (led here first, then the others in turn) that has such a task shows it.
    pub(super) fn peek_across<'c>(
        &mut self,
        cx: &mut Ctx<'_>,
        client: Client,
        tube: TubeIx,
        status: tarq_engine::Status,
        leads: bool,
    ) -> Option<Command<'c>> {
        let cmd = Command::PeekFirst { tube, status };
        let Some(t) = self.tubes.get(&tube) else {
            return Some(cmd);
        };
        if t.parts.len() == 1 {
            return self.run_on_partition(cx, client, tube, cmd, Then::Deliver, leads);
        }
        let (here, there): (Vec<TubeIx>, Vec<TubeIx>) =
            t.parts.iter().partition(|&&p| self.here(p, leads));
        let q = cx.core.queue();
        if let Some(&ix) =
            (here.iter()).find(|&&ix| q.peek_first(ix, status).is_ok_and(|t| t.is_some()))
        {
            return Some(Command::PeekFirst { tube: ix, status });
        }
        self.peek_next(cx, client, status, there);
        None
    }

    /// Asks the next partition of a peek across partitions, or answers that none has one.
    pub(super) fn peek_next(
        &mut self,
        cx: &mut Ctx<'_>,
        client: Client,
        status: tarq_engine::Status,
        mut left: Vec<TubeIx>,
    ) {
        if left.is_empty() {
            return self.answer(cx, client, &Outcome::Nothing);
        }
        let ix = left.remove(0);
        let Some(set) = self.part(ix).map(|p| p.set) else {
            return self.peek_next(cx, client, status, left);
        };
        let cmd = Command::PeekFirst { tube: ix, status };
        self.forward(cx, set, client, cmd, Then::Peek { status, left });
    }

    /// A put into a partitioned limfifottl tube: a partition led here with room, else the
    /// others in turn until one has room (the last waits for room as the put asks).
    pub(super) fn put_capped<'c>(
        &mut self,
        cx: &mut Ctx<'_>,
        client: Client,
        head: TubeIx,
        data: &'c [u8],
        opts: TubePut<'c>,
        wait: Micros,
    ) -> Option<Command<'c>> {
        let leads = cx.leads();
        let mut order = self.tubes.get(&head)?.parts.clone();
        self.rr = self.rr.wrapping_add(1);
        let n = order.len();
        order.rotate_left(self.rr % n);
        let q = cx.core.queue();
        let has_room = |ix: TubeIx| {
            q.tube_info(ix).is_some_and(|t| {
                t.opts.capacity == 0 || q.tube_stats(ix).is_ok_and(|s| s.total < t.opts.capacity)
            })
        };
        let put = |ix: TubeIx| Command::PutIn {
            tube: ix,
            data,
            opts,
            wait,
        };
        if let Some(&ix) = order
            .iter()
            .find(|&&ix| self.here(ix, leads) && has_room(ix))
        {
            return Some(put(ix));
        }
        let left: Vec<TubeIx> = order
            .iter()
            .copied()
            .filter(|&ix| !self.here(ix, leads))
            .collect();
        if left.is_empty() {
            // Every partition is led here and full: the core answers (or waits) on one.
            return Some(put(order[0]));
        }
        let plan = PutPlan {
            data: data.to_vec(),
            utube: opts.utube.to_vec(),
            dedup_key: opts.dedup_key.map(<[u8]>::to_vec),
            opts: TubePut {
                utube: &[],
                dedup_key: None,
                ..opts
            },
            wait,
            left,
        };
        self.put_next(cx, client, plan);
        None
    }

    /// Tries the next partition of a limfifottl put.
    pub(super) fn put_next(&mut self, cx: &mut Ctx<'_>, client: Client, mut plan: PutPlan) {
        let ix = plan.left.remove(0);
        let Some(set) = self.part(ix).map(|p| p.set) else {
            return self.answer(cx, client, &Outcome::Full);
        };
        let next = plan.clone();
        let cmd = Command::PutIn {
            tube: ix,
            data: &plan.data,
            opts: TubePut {
                utube: &plan.utube,
                dedup_key: plan.dedup_key.as_deref(),
                ..plan.opts
            },
            wait: if plan.left.is_empty() { plan.wait } else { 0 },
        };
        self.forward(cx, set, client, cmd, Then::Put { plan: next });
    }

    /// Tries the next remote partition of `plan`, or ends the take.
    pub(super) fn take_next(&mut self, cx: &mut Ctx<'_>, client: Client, mut plan: TakePlan) {
        if plan.left.is_empty() {
            return match plan.timeout {
                Some(0) => self.answer(cx, client, &Outcome::Nothing),
                timeout => self.wait(cx, client, plan.on, plan.heads, timeout),
            };
        }
        let ix = plan.left.remove(0);
        let set = match self.part(ix) {
            Some(p) => p.set,
            None => return self.take_next(cx, client, plan),
        };
        let cmd = Command::Take {
            on: on_ix(plan.on, ix),
            timeout: Some(0),
        };
        self.forward(cx, set, client, cmd, Then::Take { plan });
    }
}
