//! Forwarding over the links: a call sent to a set's primary with what to do with its
//! answer, answers read where they arrived, a failed link's calls answered with why, and the
//! end of a session told to every set it reached.

use super::ctx::Ctx;
use super::*;
use crate::frontend::link::call::Call;
use out_link::Identity;

use std::time::Duration;

/// While a set's link keeps failing (its primary down and not yet replaced, every call
/// trying again), how often the log says so again: each call that needs the set reconnects,
/// and a warning per drop was a dozen lines a second.
const LINK_WARN_EVERY: Duration = Duration::from_secs(60);

/// One set's link trouble, for the log: a warning when the link starts failing, one more
/// every [`LINK_WARN_EVERY`] while it goes on (with the drops since), and a line when an
/// answer comes again. The drops in between are logged at debug.
#[derive(Debug, Default)]
pub(super) struct Trouble {
    /// When this episode began and when it was last warned of, while the link fails.
    since: Option<(Instant, Instant)>,
    /// Drops in this episode, and since the last warning.
    drops: u64,
    unwarned: u64,
    /// Drops since start, for the cluster page.
    total: u64,
}

/// What the log says of a drop.
#[derive(Debug, PartialEq, Eq)]
enum Say {
    /// The link started failing.
    Started,
    /// It still fails: `drops` since the last warning, `secs` since it started.
    Still { drops: u64, secs: u64 },
    /// Nothing new: at debug.
    Quiet,
}

impl Trouble {
    fn dropped(&mut self, now: Instant) -> Say {
        self.drops += 1;
        self.total += 1;
        match &mut self.since {
            None => {
                self.since = Some((now, now));
                self.unwarned = 0;
                Say::Started
            }
            Some((start, warned)) if now.duration_since(*warned) >= LINK_WARN_EVERY => {
                *warned = now;
                let drops = std::mem::take(&mut self.unwarned) + 1;
                Say::Still {
                    drops,
                    secs: now.duration_since(*start).as_secs(),
                }
            }
            Some(_) => {
                self.unwarned += 1;
                Say::Quiet
            }
        }
    }

    /// Drops since start.
    pub(super) fn total(&self) -> u64 {
        self.total
    }

    /// Drops in the episode going on (0 when the link is not failing).
    pub(super) fn episode_drops(&self) -> u64 {
        if self.since.is_some() {
            self.drops
        } else {
            0
        }
    }

    /// When the episode going on began, while the link fails.
    pub(super) fn failing_since(&self) -> Option<Instant> {
        self.since.map(|(start, _)| start)
    }

    /// An answer came: the episode, if there was one, ends; its drops and seconds.
    fn answered(&mut self, now: Instant) -> Option<(u64, u64)> {
        let (start, _) = self.since.take()?;
        let drops = std::mem::take(&mut self.drops);
        self.unwarned = 0;
        Some((drops, now.duration_since(start).as_secs()))
    }
}

impl Router {
    /// Sends `cmd` to the primary of set `set` for `client`; its answer goes where `then`
    /// says, a failure to send it too (a watch's failure is no answer to its client's take).
    pub(super) fn forward(
        &mut self,
        cx: &mut Ctx<'_>,
        set: usize,
        client: Client,
        cmd: Command<'_>,
        then: Then,
    ) {
        self.forward_as(cx, set, client, &cmd, Some(then));
    }

    /// Sends `cmd` to the primary of set `set` for `client` as the router's own word
    /// ([`Router::send_own`]): what a call already answered owes, such as a task taken for a
    /// wait that ended meanwhile, released. Not held to the call bound; its answer is not
    /// waited for.
    pub(super) fn forward_owed(
        &mut self,
        cx: &mut Ctx<'_>,
        set: usize,
        client: Client,
        cmd: Command<'_>,
    ) {
        self.forward_as(cx, set, client, &cmd, None);
    }

    /// [`Router::forward`] with `Some(then)`, [`Router::forward_owed`] with `None`.
    fn forward_as(
        &mut self,
        cx: &mut Ctx<'_>,
        set: usize,
        client: Client,
        cmd: &Command<'_>,
        then: Option<Then>,
    ) {
        // A pause travels as the time it has left: the owner's clock is its own.
        let call = match Call::of(cmd, cx.mono) {
            Ok(call) => call,
            Err(what) => {
                let why = format!("{what} is not sent to another node");
                return self.answer(cx, client, &Outcome::Error(Refusal::Shards(why)));
            }
        };
        // A session this node runs for another node's client is named as that node names it.
        let remote = cx.link_sessions.remote_of(client.sid);
        let origin: Option<Arc<str>> = remote.map(|(o, _)| Arc::clone(o));
        let session = remote.map_or(client.sid, |(_, r)| r);
        let ask = Ask::Run {
            session,
            origin: origin.as_deref(),
            call,
        };
        let sent = match then {
            Some(then) => self.send_ask(cx, set, client, &ask, then),
            None => self.send_own(cx, set, &ask),
        };
        if sent {
            *self.forwarded.entry(client.sid).or_default() |= set_bit(set);
        }
    }

    /// Sends the router's own word to the primary of set `set`: how many of this node's takes
    /// wait on a tube, a move's or a drop's end, a release a call owes. It is no client's
    /// call, so it is neither held to `--max-routed-calls` nor counted with the calls
    /// forwarded (a full bound would refuse it with no client to tell, and a client's call
    /// could be refused for it), and its answer is not waited for: a link that fails says so
    /// to whoever needs to know (`link_failed`). There are few of them, each bounded by what
    /// it reports (a tube's count, a move, a drop's partition). False when no link could be
    /// opened.
    pub(super) fn send_own(&mut self, cx: &mut Ctx<'_>, set: usize, ask: &Ask<'_>) -> bool {
        let sync = self.next_sync;
        self.next_sync += 1;
        if self.sets[set].link.is_none() {
            if let Err(why) = self.open_link(cx, set, sync) {
                tracing::debug!(set = %self.sets[set].name, why, "a word of the router's own not sent");
                return false;
            }
        }
        let link = self.sets[set].link.as_mut().expect("opened above");
        link.send(sync, ask);
        true
    }

    /// Sends `ask` to the primary of set `set` for `client`; its answer goes where `then` says
    /// (a failure to send it too). False when it could not be sent.
    pub(super) fn send_ask(
        &mut self,
        cx: &mut Ctx<'_>,
        set: usize,
        client: Client,
        ask: &Ask<'_>,
        then: Then,
    ) -> bool {
        let sync = self.next_sync;
        self.next_sync += 1;
        let refused = match self.busy(set) {
            Some(why) => Some(Refusal::Shards(why)),
            None if self.sets[set].link.is_none() => {
                self.open_link(cx, set, sync).err().map(Refusal::NoPrimary)
            }
            None => None,
        };
        if let Some(refusal) = refused {
            self.pending.insert(sync, Pending { set, client, then });
            self.on_answer(cx, sync, Err(refusal));
            return false;
        }
        let link = self.sets[set].link.as_mut().expect("opened above");
        link.send(sync, ask);
        self.pending.insert(sync, Pending { set, client, then });
        let wait = match ask {
            Ask::Run { call, .. } => call.waits_at_most(),
            _ => Some(0),
        };
        let grace = (self.limits.link_timeout).saturating_mul(deadlines::CALL_GRACE_LINK_TIMEOUTS);
        self.call_deadlines.sent(sync, cx.mono, wait, grace);
        true
    }

    /// Opens the link to `set`, its first call `sync`: the ends of sessions owed to the set
    /// (told while it had no link) go first. `Err`: why not (no primary, no link key yet, or
    /// the primary cannot be reached).
    fn open_link(&mut self, cx: &mut Ctx<'_>, set: usize, sync: u64) -> Result<(), String> {
        let s = &self.sets[set];
        let key = cx.cluster().and_then(|c| c.handle().link_key());
        let addr = (s.primary.as_ref().and_then(|a| resolve(a)))
            .ok_or_else(|| format!("replica set {} has no primary now", s.name))?;
        let key = key.ok_or_else(|| {
            format!(
                "no link to replica set {} yet: this node has not read the cluster's link key \
                 from etcd",
                s.name
            )
        })?;
        let who = Identity {
            me: Arc::clone(&self.me),
            cluster: Arc::clone(&self.cluster),
            key,
        };
        (cx.links.connect(set, addr, cx.tls_nodes))
            .map_err(|e| format!("cannot reach replica set {} at {addr}: {e}", s.name))?;
        let link = self.sets[set].link.insert(OutLink::new(sync, who, cx.mono));
        // The set's primary lost what this node told it of its waiting takes with the last link.
        self.wait_counts.set_linked(set);
        for (origin, session) in self.holds.owed(set) {
            let origin = origin.as_deref();
            link.send(self.next_sync, &Ask::End { session, origin });
            self.next_sync += 1;
        }
        Ok(())
    }

    /// The socket of set `set`'s link is ready.
    pub(in crate::server) fn link_ready(&mut self, cx: &mut Ctx<'_>, set: usize) {
        let cred = cx.cfg.auth.as_ref();
        let Some(link) = self.sets.get_mut(set).and_then(|s| s.link.as_mut()) else {
            return;
        };
        let read = cx.links.read(set, link.input());
        if let Err(why) = read.and_then(|n| link.read_done(n, cred, cx.mono)) {
            return self.link_failed(cx, set, &why);
        }
        // Answers are handled where they were read: their tasks borrow the buffer.
        let (id, input) = (link.id, link.take_input());
        let mut used = 0;
        loop {
            match out_link::next_answer(&input, &mut used) {
                Ok(Some((sync, answer))) => {
                    self.link_answered(set);
                    self.on_answer(cx, sync, answer)
                }
                Ok(None) => break,
                Err(why) => return self.link_failed(cx, set, &why),
            }
        }
        let link = self.sets[set].link.as_mut();
        if let Some(link) = link.filter(|l| l.id == id) {
            link.give_back(input, used);
        }
        self.flush_links(cx);
    }

    /// Writes what the links have queued.
    pub(in crate::server) fn flush_links(&mut self, cx: &mut Ctx<'_>) {
        self.publish_waiting(cx);
        let mut failed = Vec::new();
        for (i, s) in self.sets.iter_mut().enumerate() {
            if let Some(link) = &mut s.link {
                let (out, more) = link.output();
                if let Err(why) = cx.links.write(i, out, more) {
                    failed.push((i, why));
                }
            }
        }
        for (set, why) in failed {
            self.link_failed(cx, set, &why);
        }
    }

    /// Pings the links that fell silent, and drops those silent past `--link-timeout` (their
    /// calls are answered: the other end is gone, or the network between).
    pub(in crate::server) fn check_links(&mut self, cx: &mut Ctx<'_>) {
        let (now, timeout) = (cx.mono, self.limits.link_timeout);
        let mut dead = Vec::new();
        for (i, s) in self.sets.iter_mut().enumerate() {
            if let Some(link) = &mut s.link {
                if let Err(why) = link.check(now, timeout) {
                    dead.push((i, why));
                }
            }
        }
        for (set, why) in dead {
            self.link_failed(cx, set, &why);
        }
        self.wait_counts.retry_due(cx.mono);
        self.expire_calls(cx);
        self.expire_listings(cx);
    }

    /// Answers the forwarded calls past their deadline (`deadlines`): the link is alive, the
    /// answer did not come.
    fn expire_calls(&mut self, cx: &mut Ctx<'_>) {
        let (calls, pending) = (&mut self.call_deadlines, &self.pending);
        let due = calls.due(cx.mono, |sync| pending.contains_key(&sync));
        for sync in due {
            let Some(p) = self.pending.get(&sync) else {
                continue;
            };
            let name = self.sets[p.set].name.clone();
            let why = format!(
                "replica set {name} did not answer a forwarded call within its wait and {} link \
                 timeouts, though the link is alive: it may or may not have run",
                deadlines::CALL_GRACE_LINK_TIMEOUTS
            );
            warn!(set = %name, sync, "a forwarded call went unanswered past its deadline");
            self.on_answer(cx, sync, Err(Refusal::Unknown(why)));
        }
    }

    /// A link is gone: its calls in flight are answered with why.
    pub(super) fn link_failed(&mut self, cx: &mut Ctx<'_>, set: usize, why: &str) {
        let name = self.sets[set].name.clone();
        self.wait_counts.set_lost(set, cx.mono);
        let mut sent = false;
        if let Some(link) = self.sets[set].link.take() {
            sent = link.may_have_sent();
            cx.links.close(set);
        }
        match self.sets[set].trouble.dropped(Instant::now()) {
            Say::Started => warn!(
                set = %name,
                why,
                "link to a replica set dropped (while it keeps failing, once a minute more)"
            ),
            Say::Still { drops, secs } => warn!(
                set = %name,
                why,
                drops,
                failing_secs = secs,
                "link to a replica set still failing"
            ),
            Say::Quiet => tracing::debug!(set = %name, why, "link to a replica set dropped"),
        }
        let syncs: Vec<u64> = (self.pending.iter())
            .filter(|(_, p)| p.set == set)
            .map(|(s, _)| *s)
            .collect();
        for sync in syncs {
            let why = format!("the link to replica set {name} failed: {why}");
            // A call that may have been sent may have been run: only one never sent was not.
            let refusal = if sent {
                Refusal::Unknown(format!("{why}; the call was sent and not answered"))
            } else {
                Refusal::NoPrimary(why)
            };
            self.on_answer(cx, sync, Err(refusal));
        }
        self.end_holders(cx, set);
    }

    /// An answer came on set `set`'s link: a failing episode ends, and the log says so.
    fn link_answered(&mut self, set: usize) {
        let Some(s) = self.sets.get_mut(set) else {
            return;
        };
        if let Some((drops, secs)) = s.trouble.answered(Instant::now()) {
            info!(set = %s.name, drops, failing_secs = secs, "link to a replica set works again");
        }
    }

    /// The answer to forwarded request `sync`.
    pub(super) fn on_answer(&mut self, cx: &mut Ctx<'_>, sync: u64, answer: Answered<'_>) {
        let Some(p) = self.pending.remove(&sync) else {
            return;
        };
        let outcome = match answer {
            Ok(bytes) => match wire::read_answer(bytes) {
                Ok(a) => a.outcome(),
                Err(e) => Outcome::Error(Refusal::Shards(e)),
            },
            Err(refusal) => Outcome::Error(refusal),
        };
        if matches!(&outcome, Outcome::Task(t) if t.status == tarq_engine::Status::Taken) {
            self.holds.took(p.client.sid, set_bit(p.set));
        }
        match p.then {
            Then::Deliver => self.answer(cx, p.client, &outcome),
            // A partition without a task, or unreachable now (its set failing over): the next.
            // A take whose answer was lost took nothing this client holds: if the owner ran it,
            // the task is released with the link's session there.
            Then::Take { plan } => match outcome {
                Outcome::Nothing | Outcome::Error(Refusal::NoPrimary(_) | Refusal::Unknown(_)) => {
                    self.take_next(cx, p.client, plan)
                }
                other => self.answer(cx, p.client, &other),
            },
            Then::Gather { key } => self.gathered(cx, key, None, Digest::of(&outcome)),
            Then::GatherTube { key, head } => {
                self.gathered(cx, key, Some(head), Digest::of(&outcome))
            }
            Then::Woke { ix } => self.remote_woke(cx, ix, &outcome),
            Then::WaitTake { waiter, ix } => self.wait_took(cx, waiter, ix, p.client, &outcome),
            Then::Put { plan } => match outcome {
                Outcome::Full if !plan.left.is_empty() => self.put_next(cx, p.client, plan),
                other => self.answer(cx, p.client, &other),
            },
            Then::Move { id } => self.move_answered(cx, id, &outcome),
            Then::List { key, at } => self.listed(cx, key, at, outcome),
            Then::Moves { key, at } => self.moves_answered(key, Some(at), outcome),
            Then::Peek { status, left } => match outcome {
                Outcome::Nothing | Outcome::Error(Refusal::NoPrimary(_) | Refusal::Unknown(_)) => {
                    self.peek_next(cx, p.client, status, left)
                }
                other => self.answer(cx, p.client, &other),
            },
        }
    }

    /// Session `sid` of this node ended: the sets it reached release what it holds there.
    pub(in crate::server) fn shards_session_ended(&mut self, cx: &mut Ctx<'_>, sid: SessionId) {
        self.holds.ended(sid);
        let Some(mask) = self.forwarded.remove(&sid) else {
            return;
        };
        // A session run for another node's client is named as that node names it.
        let (origin, session) = match cx.link_sessions.remote_of(sid) {
            Some((origin, remote)) => (Some(&**origin), remote),
            None => (None, sid),
        };
        for (i, s) in self.sets.iter_mut().enumerate() {
            if mask & set_bit(i) != 0 {
                match &mut s.link {
                    Some(link) => {
                        let sync = self.next_sync;
                        self.next_sync += 1;
                        link.send(sync, &Ask::End { session, origin });
                    }
                    // Told on the next link: an owner that never saw this one break holds
                    // the session's tasks until then.
                    None => self.holds.owe(i, origin.map(Arc::from), session),
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failing_link_is_warned_of_once_then_once_a_minute_and_its_end_said() {
        let t0 = Instant::now();
        let mut t = Trouble::default();
        assert_eq!(t.dropped(t0), Say::Started);
        for ms in 1..1000 {
            assert_eq!(t.dropped(t0 + Duration::from_millis(ms * 50)), Say::Quiet);
        }
        assert_eq!(
            t.dropped(t0 + LINK_WARN_EVERY),
            Say::Still {
                drops: 1000,
                secs: 60
            }
        );
        assert_eq!(t.dropped(t0 + LINK_WARN_EVERY), Say::Quiet);
        assert_eq!(t.answered(t0 + LINK_WARN_EVERY * 2), Some((1002, 120)));
        assert_eq!(t.answered(t0 + LINK_WARN_EVERY * 2), None);
        // A later failure is a new episode, warned of at once.
        assert_eq!(t.dropped(t0 + LINK_WARN_EVERY * 3), Say::Started);
    }
}
