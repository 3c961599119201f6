//! Forwarding over the links: a call sent to a set's primary with what to do with its
//! answer, answers read where they arrived, a failed link's calls answered with why, and the
//! end of a session told to every set it reached.

use super::*;

impl Server {
    /// Sends `cmd` to the primary of set `set` for `client`; its answer goes where `then`
    /// says, a failure to send it too (a watch's failure is no answer to its client's take).
    pub(super) fn forward(&mut self, set: usize, client: Client, cmd: Command<'_>, then: Then) {
        // A pause travels as the time it has left: the owner's clock is its own.
        let cmd = match cmd {
            Command::Pause { tube, pause } => Command::Pause {
                tube,
                pause: Pause {
                    until: pause.until.saturating_sub(self.mono),
                    ..pause
                },
            },
            other => other,
        };
        // A session this node runs for another node's client is named as that node names it.
        let remote = self.link_sessions.remote_of(client.sid);
        let origin: Option<Arc<str>> = remote.map(|(o, _)| Arc::clone(o));
        let session = remote.map_or(client.sid, |(_, r)| r);
        let ask = Ask::Run {
            session,
            origin: origin.as_deref(),
            command: cmd,
        };
        if self.send_ask(set, client, &ask, then) {
            if let Some(shards) = self.shards.as_mut() {
                *shards.forwarded.entry(client.sid).or_default() |= set_bit(set);
            }
        }
    }

    /// Sends `ask` to the primary of set `set` for `client`; its answer goes where `then` says
    /// (a failure to send it too). False when it could not be sent.
    pub(super) fn send_ask(
        &mut self,
        set: usize,
        client: Client,
        ask: &Ask<'_>,
        then: Then,
    ) -> bool {
        let Some(shards) = self.shards.as_mut() else {
            return false;
        };
        let sync = shards.next_sync;
        shards.next_sync += 1;
        if shards.sets[set].link.is_none() {
            let s = &shards.sets[set];
            let opened = match s.primary.as_ref().and_then(|a| resolve(a)) {
                None => Err(format!("replica set {} has no primary now", s.name)),
                Some(addr) => {
                    let me = Arc::clone(&shards.me);
                    OutLink::connect(addr, set, sync, me, self.poll.registry())
                }
                .map_err(|e| format!("cannot reach replica set {} at {addr}: {e}", s.name)),
            };
            match opened {
                Ok(l) => shards.sets[set].link = Some(l),
                Err(why) => {
                    shards.pending.insert(sync, Pending { set, client, then });
                    self.on_answer(sync, Err(Refusal::NoPrimary(why)));
                    return false;
                }
            }
        }
        let link = shards.sets[set].link.as_mut().expect("opened above");
        link.send(sync, ask);
        shards.pending.insert(sync, Pending { set, client, then });
        true
    }

    /// A link's socket is ready.
    pub(in crate::server) fn link_ready(&mut self, token: usize) {
        let set = token - LINK_TOKEN_BASE;
        let cred = self.cfg.auth.as_ref();
        let Some(link) = (self.shards.as_mut())
            .and_then(|s| s.sets.get_mut(set))
            .and_then(|s| s.link.as_mut())
        else {
            return;
        };
        if let Err(why) = link.read(cred) {
            return self.link_failed(set, &why);
        }
        // Answers are handled where they were read: their tasks borrow the buffer.
        let (id, input) = (link.id, link.take_input());
        let mut used = 0;
        loop {
            match out_link::next_answer(&input, &mut used) {
                Ok(Some((sync, answer))) => self.on_answer(sync, answer),
                Ok(None) => break,
                Err(why) => return self.link_failed(set, &why),
            }
        }
        let link = self.shards.as_mut().and_then(|s| s.sets[set].link.as_mut());
        if let Some(link) = link.filter(|l| l.id == id) {
            link.give_back(input, used);
        }
        self.flush_links();
    }

    /// Writes what the links have queued.
    pub(in crate::server) fn flush_links(&mut self) {
        let Some(shards) = self.shards.as_mut() else {
            return;
        };
        let mut failed = Vec::new();
        for (i, s) in shards.sets.iter_mut().enumerate() {
            if let Some(link) = &mut s.link {
                if let Err(why) = link.flush(self.poll.registry()) {
                    failed.push((i, why));
                }
            }
        }
        for (set, why) in failed {
            self.link_failed(set, &why);
        }
    }

    /// A link is gone: its calls in flight are answered with why.
    pub(super) fn link_failed(&mut self, set: usize, why: &str) {
        let Some(shards) = self.shards.as_mut() else {
            return;
        };
        let name = shards.sets[set].name.clone();
        let mut sent = false;
        if let Some(mut link) = shards.sets[set].link.take() {
            sent = link.may_have_sent();
            link.close(self.poll.registry());
        }
        warn!(set = %name, why, "link to a replica set dropped");
        let syncs: Vec<u64> = (shards.pending.iter())
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
            self.on_answer(sync, Err(refusal));
        }
    }

    /// The answer to forwarded request `sync`.
    pub(super) fn on_answer(&mut self, sync: u64, answer: Answered<'_>) {
        let Some(p) = self.shards.as_mut().and_then(|s| s.pending.remove(&sync)) else {
            return;
        };
        let outcome = match answer {
            Ok(bytes) => match wire::read_answer(bytes) {
                Ok(a) => a.outcome(),
                Err(e) => Outcome::Error(Refusal::Shards(e)),
            },
            Err(refusal) => Outcome::Error(refusal),
        };
        match p.then {
            Then::Deliver => self.answer(p.client, &outcome),
            // A partition without a task, or unreachable now (its set failing over): the next.
            // A take whose answer was lost took nothing this client holds: if the owner ran it,
            // the task is released with the link's session there.
            Then::Take { plan } => match outcome {
                Outcome::Nothing | Outcome::Error(Refusal::NoPrimary(_) | Refusal::Unknown(_)) => {
                    self.take_next(p.client, plan)
                }
                other => self.answer(p.client, &other),
            },
            Then::Gather { key } => self.gathered(key, None, Digest::of(&outcome)),
            Then::GatherTube { key, head } => self.gathered(key, Some(head), Digest::of(&outcome)),
            Then::Woke { ix } => self.remote_woke(ix, &outcome),
            Then::WaitTake { waiter, ix } => self.wait_took(waiter, ix, p.client, &outcome),
            Then::Put { plan } => match outcome {
                Outcome::Full if !plan.left.is_empty() => self.put_next(p.client, plan),
                other => self.answer(p.client, &other),
            },
            Then::Move { id } => self.move_answered(id, &outcome),
            Then::Ignore => {}
            Then::Peek { status, left } => match outcome {
                Outcome::Nothing | Outcome::Error(Refusal::NoPrimary(_) | Refusal::Unknown(_)) => {
                    self.peek_next(p.client, status, left)
                }
                other => self.answer(p.client, &other),
            },
        }
    }

    /// Session `sid` of this node ended: the sets it reached release what it holds there.
    pub(in crate::server) fn shards_session_ended(&mut self, sid: SessionId) {
        let Some(shards) = self.shards.as_mut() else {
            return;
        };
        let Some(mask) = shards.forwarded.remove(&sid) else {
            return;
        };
        // A session run for another node's client is named as that node names it.
        let (origin, session) = match self.link_sessions.remote_of(sid) {
            Some((origin, remote)) => (Some(&**origin), remote),
            None => (None, sid),
        };
        for (i, s) in shards.sets.iter_mut().enumerate() {
            if mask & set_bit(i) != 0 {
                if let Some(link) = &mut s.link {
                    let sync = shards.next_sync;
                    shards.next_sync += 1;
                    link.send(sync, &Ask::End { session, origin });
                }
            }
        }
    }
}
