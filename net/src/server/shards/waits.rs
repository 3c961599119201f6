//! Takes that wait across partitions. Instead of polling, every partition is watched
//! (`Command::Watch`): the ones led here in the core, the others by their owners, one watch a
//! remote partition; a wake-up lets the oldest waiter try that partition.

use super::ctx::Ctx;
use super::*;
use waiting::Publish;

/// A take waiting for a task of any partition of its tubes (one for a take; a beanstalk
/// reserve's are the tubes its connection watches).
#[derive(Clone, Debug)]
pub(super) struct Waiter {
    pub(super) client: Client,
    pub(super) on: On,
    /// The tubes it waits on, by their first partition's index.
    pub(super) heads: Vec<TubeIx>,
    /// The watch of the partitions this node leads, while parked in the core.
    pub(super) local: Option<u64>,
}

/// Router tokens with this bit are a waiting take's local watch (the rest: its number);
/// without it, a whole-tube figure's.
pub(super) const WATCH: u64 = 1 << 63;

impl Router {
    /// Waiter `id` no longer waits: out of the books and the counts (its queue entries go
    /// when they come to the front).
    fn forget_waiter(&mut self, id: u64) -> Option<Waiter> {
        let w = self.waiters.remove(&id)?;
        for &head in &w.heads {
            self.wait_counts.ended(head);
        }
        Some(w)
    }
}

impl Router {
    /// Tells the owners of the tubes whose waiting takes changed how many wait here now (its
    /// core, when this node owns the tube; else an [`Ask::Waiting`] to the owner's set).
    pub(in crate::server) fn publish_waiting(&mut self, cx: &mut Ctx<'_>) {
        let leads = cx.leads();
        if !self.wait_counts.is_dirty() {
            return;
        }
        let mut counts = std::mem::take(&mut self.wait_counts);
        let orders = counts.publish(|head| self.counter_of(head, leads));
        self.wait_counts = counts;
        for order in orders {
            match order {
                Publish::Core { head, count } => cx.core.set_routed_waiting(head, count),
                Publish::Tell { set, head, count } => {
                    let ask = Ask::Waiting { tube: head, count };
                    if !self.send_own(cx, set, &ask) {
                        let now = cx.mono;
                        self.wait_counts.not_told(set, head, now);
                    }
                }
            }
        }
    }

    /// Node `from`, on link `idx`, says `count` of its takes wait on tube `head`.
    pub(in crate::server) fn heard_waiting(
        &mut self,
        idx: usize,
        from: &str,
        head: TubeIx,
        count: u64,
    ) {
        self.wait_counts.heard(idx, from, head, count);
    }

    /// Link `idx` closed: what its node said of its waiting takes no longer counts.
    pub(in crate::server) fn waiting_link_closed(&mut self, idx: usize) {
        self.wait_counts.link_closed(idx);
    }

    /// This node's takes waiting on tube `head` in its router now.
    pub(in crate::server) fn routed_waiting_on(&self, head: TubeIx) -> u64 {
        self.wait_counts.own(head)
    }

    /// Takes the outcomes the core answered to the router.
    pub(in crate::server) fn take_routed(&mut self, cx: &mut Ctx<'_>) {
        while !cx.wire.routed.is_empty() {
            for (token, digest) in std::mem::take(cx.wire.routed) {
                if token & WATCH != 0 {
                    self.local_woke(cx, token & !WATCH, digest);
                } else {
                    self.gathered(cx, token, None, digest);
                }
            }
        }
    }

    /// A take that found no task in any partition waits: every partition of its tubes is
    /// watched (the ones led here, and tubes that are this node's own, in the core; the others
    /// by their owners), and the first to have a task serves it.
    pub(super) fn wait(
        &mut self,
        cx: &mut Ctx<'_>,
        client: Client,
        on: On,
        heads: Vec<TubeIx>,
        timeout: Option<Micros>,
    ) {
        let leads = cx.leads();
        let deadline = timeout.map_or(Micros::MAX, |t| cx.mono.saturating_add(t));
        if let Some(why) = self.over_bound(self.waiters.len(), "takes waiting across partitions") {
            return self.answer(cx, client, &Outcome::Error(Refusal::Shards(why)));
        }
        let (mut here, mut there) = (Vec::new(), Vec::new());
        for &head in &heads {
            match self.tubes.get(&head) {
                Some(t) => {
                    for &p in &t.parts {
                        match self.here(p, leads) {
                            true => here.push(p),
                            false => there.push(p),
                        }
                    }
                }
                // A tube of this node's own; on a replica, one whose placement is not applied
                // yet: watched once it is (`watch_again`).
                None if leads => here.push(head),
                None => {}
            }
        }
        let id = self.next_waiter;
        self.next_waiter += 1;
        for &head in &heads {
            self.queues.entry(head).or_default().push_back(id);
            self.wait_counts.started(head);
        }
        self.waiters.insert(
            id,
            Waiter {
                client,
                on,
                heads,
                local: None,
            },
        );
        if deadline != Micros::MAX {
            self.deadlines.push(Reverse((deadline, id)));
        }
        for ix in there {
            self.watch_remote(cx, ix, client);
        }
        if !here.is_empty() {
            let caller = Caller::new(client.idx, client.gen, client.sid);
            let (core, wire) = cx.split();
            let group = core.watch_any(caller, ReplyTo::Router(WATCH | id), &here, wire);
            if let Some(w) = self.waiters.get_mut(&id) {
                w.local = group;
            }
            self.take_routed(cx);
        }
    }

    /// Asks the owner of partition `ix` to say when it has a task, unless asked already.
    pub(super) fn watch_remote(&mut self, cx: &mut Ctx<'_>, ix: TubeIx, client: Client) {
        let Some(part) = self.part(ix) else { return };
        if self.watching.contains_key(&ix) {
            return;
        }
        // `forward` sends it as this request (kept to drop it should no take need it).
        self.watching.insert(ix, self.next_sync);
        self.forward(
            cx,
            part.set,
            client,
            Command::Watch { tube: ix },
            Then::Woke { ix },
        );
    }

    /// Watches again the partitions the waiting takes need that nothing watches now (a watch
    /// lost with its link, answered while its set had no primary): after each new map.
    pub(super) fn watch_again(&mut self, cx: &mut Ctx<'_>) {
        let leads = cx.leads();
        // Owners may have changed: each tube's count goes to its owner now.
        self.wait_counts.all_dirty();
        let heads: Vec<TubeIx> = self.queues.keys().copied().collect();
        for head in heads {
            let Some((_, w)) = self.oldest_waiter(cx, head) else {
                continue;
            };
            let parts: Vec<TubeIx> = (self.tubes.get(&head))
                .map(|t| {
                    t.parts
                        .iter()
                        .copied()
                        .filter(|&p| !self.here(p, leads))
                        .collect()
                })
                .unwrap_or_default();
            for ix in parts {
                self.watch_remote(cx, ix, w.client);
            }
        }
    }

    /// The oldest take still waiting on `head`'s tube (the others gone are dropped).
    pub(super) fn oldest_waiter(&mut self, cx: &Ctx<'_>, head: TubeIx) -> Option<(u64, Waiter)> {
        while let Some(&id) = self.queues.get(&head)?.front() {
            match self.waiters.get(&id) {
                Some(w)
                    if cx
                        .wire
                        .conns
                        .get(w.client.idx)
                        .is_some_and(|c| c.gen == w.client.gen) =>
                {
                    return Some((id, w.clone()));
                }
                _ => {
                    self.queues.get_mut(&head).map(VecDeque::pop_front);
                    self.forget_waiter(id);
                }
            }
        }
        self.unwatch_idle(head);
        None
    }

    /// When no take waits on tube `head` any more, the watches of its partitions led
    /// elsewhere are dropped: each is a call forwarded and not answered (counted, and held by
    /// its owner) until a task comes there, which may be never. The owner drops it too
    /// (`Ask::Unwatch`); an answer already on its way finds nothing and is ignored.
    pub(super) fn unwatch_idle(&mut self, head: TubeIx) {
        if self.queues.get(&head).is_some_and(|q| !q.is_empty()) {
            return;
        }
        let Some(t) = self.tubes.get(&head) else {
            return;
        };
        for ix in &t.parts {
            let Some(sync) = self.watching.remove(ix) else {
                continue;
            };
            let Some(p) = self.pending.remove(&sync) else {
                continue;
            };
            // No link: it failed, and its calls with it.
            if let Some(link) = self.sets[p.set].link.as_mut() {
                link.send(self.next_sync, &Ask::Unwatch { sync });
                self.next_sync += 1;
            }
        }
    }

    /// Waiter `id` is answered (or gone): it stops waiting everywhere.
    pub(super) fn end_wait(&mut self, cx: &mut Ctx<'_>, id: u64) {
        let Some(w) = self.forget_waiter(id) else {
            return;
        };
        for head in &w.heads {
            if let Some(q) = self.queues.get_mut(head) {
                q.retain(|&x| x != id);
            }
            self.unwatch_idle(*head);
        }
        if let Some(group) = w.local {
            cx.core.unwatch(w.client.idx, group);
        }
    }

    /// Connection `idx` stops waiting (a beanstalk reserve its front-end ended): its waiting
    /// takes end without an answer.
    pub(in crate::server) fn end_waits_of(&mut self, cx: &mut Ctx<'_>, idx: usize) {
        let ids: Vec<u64> = (self.waiters.iter())
            .filter(|(_, w)| w.client.idx == idx)
            .map(|(&id, _)| id)
            .collect();
        for id in ids {
            self.end_wait(cx, id);
        }
    }

    /// A local watch of waiter `id` fired: a partition led here has a task.
    pub(super) fn local_woke(&mut self, cx: &mut Ctx<'_>, id: u64, digest: Digest) {
        let Some(w) = self.waiters.get(&id).cloned() else {
            return;
        };
        // Its connection closed since the watch fired (this turn): the wait ends unanswered.
        if cx
            .wire
            .conns
            .get(w.client.idx)
            .is_none_or(|c| c.gen != w.client.gen || c.closing.is_some())
        {
            return self.end_wait(cx, id);
        }
        let Digest::Ready(ix) = digest else {
            // Refused (too many waiting takes on the connection): the take ends so.
            self.end_wait(cx, id);
            let outcome = match digest {
                Digest::Error(e) => Outcome::Error(e),
                _ => Outcome::Nothing,
            };
            return self.answer(cx, w.client, &outcome);
        };
        if let Some(x) = self.waiters.get_mut(&id) {
            x.local = None;
        }
        let leads = cx.leads();
        if !(self.here(ix, leads)) {
            // The partition moved away meanwhile: its new owner is watched.
            return self.watch_remote(cx, ix, w.client);
        }
        if cx.core.queue().can_take(ix) {
            self.end_wait(cx, id);
            let caller = Caller::new(w.client.idx, w.client.gen, w.client.sid);
            let cmd = Command::Take {
                on: on_ix(w.on, ix),
                timeout: Some(0),
            };
            self.execute_as(cx, caller, w.client.reply, cmd);
        } else {
            // Taken by another first: watch again.
            let caller = Caller::new(w.client.idx, w.client.gen, w.client.sid);
            let (core, wire) = cx.split();
            let group = core.watch_any(caller, ReplyTo::Router(WATCH | id), &[ix], wire);
            if let Some(x) = self.waiters.get_mut(&id) {
                x.local = group;
            }
        }
    }

    /// The owner of partition `ix` says it has a task: the oldest waiter tries it.
    pub(super) fn remote_woke(&mut self, cx: &mut Ctx<'_>, ix: TubeIx, outcome: &Outcome<'_>) {
        self.watching.remove(&ix);
        let Some(head) = self.part(ix).map(|p| p.head) else {
            return;
        };
        if !matches!(outcome, Outcome::Ready(_)) {
            // The link failed or the owner refused: the waiters' deadlines end them, and the
            // next waiter asks again.
            return;
        }
        let Some((id, w)) = self.oldest_waiter(cx, head) else {
            return;
        };
        let Some(set) = self.part(ix).map(|p| p.set) else {
            return;
        };
        let cmd = Command::Take {
            on: on_ix(w.on, ix),
            timeout: Some(0),
        };
        self.forward(cx, set, w.client, cmd, Then::WaitTake { waiter: id, ix });
    }

    /// A waiting take's try of partition `ix` was answered.
    pub(super) fn wait_took(
        &mut self,
        cx: &mut Ctx<'_>,
        id: u64,
        ix: TubeIx,
        client: Client,
        outcome: &Outcome<'_>,
    ) {
        let head = self.part(ix).map(|p| p.head);
        let waiting = self.waiters.contains_key(&id);
        match outcome {
            // Taken by another first, or the owner unreachable now: the take waits on.
            Outcome::Nothing | Outcome::Error(_) => {}
            Outcome::Task(t) if !waiting => {
                // It was served another way, timed out or its connection closed meanwhile:
                // this task goes back (only it: the session may hold others it was given).
                let release = Command::Release {
                    on: On::Tube(ix),
                    id: t.id,
                    opts: tarq_engine::ReleaseOptions::default(),
                };
                if let Some(set) = self.part(ix).map(|p| p.set) {
                    self.forward_owed(cx, set, client, release);
                }
            }
            other => {
                self.end_wait(cx, id);
                self.answer(cx, client, other);
            }
        }
        // More waiters, or this one again: watch the partition again (answered at once if it
        // still has tasks).
        if let Some(head) = head {
            if let Some((_, w)) = self.oldest_waiter(cx, head) {
                self.watch_remote(cx, ix, w.client);
            }
        }
    }

    /// Ends the waiting takes whose deadline passed.
    pub(in crate::server) fn expire_waiters(&mut self, cx: &mut Ctx<'_>) {
        let now = cx.mono;
        loop {
            match self.deadlines.peek() {
                Some(Reverse((t, _))) if *t <= now => {}
                _ => break,
            }
            let Reverse((_, id)) = self.deadlines.pop().expect("peeked");
            let Some(w) = self.waiters.get(&id).cloned() else {
                continue;
            };
            self.end_wait(cx, id);
            self.answer(cx, w.client, &Outcome::Nothing);
        }
    }
}
