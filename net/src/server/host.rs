//! The loop as the core's [`Host`]: outcomes are encoded by the asking connection's front-end
//! into its reply buffer, queued for the turn's flush; the node's role (a replica, a cluster
//! node that does not lead) refuses changes; beanstalk's connections hold the tubes they use.
//! [`Server::dispatch`] is the one way a front-end's command reaches the core;
//! [`Server::apply`] does what a front-end returned.

use std::net::SocketAddr;

use tarq_engine::{Stats, TubeIx};

use super::cluster::ClusterNode;
use super::conns::Conns;
use super::Server;
use crate::core::{Caller, Command, Core, Host, Outcome, Refusal};
use crate::frontend::beanstalk::BeanstalkState;
use crate::frontend::{ReplyTo, Then};

/// Who may change the queue here, read when a change comes.
pub(super) struct Role<'a> {
    pub cluster: Option<&'a ClusterNode>,
    /// `--replica-of`: the primary changes go to.
    pub replica_of: &'a Option<SocketAddr>,
    /// A stream from a primary is set up (`--replica-of`).
    pub follows: bool,
}

impl<'a> Role<'a> {
    /// The role of a node of `cluster` (if any), configured by `cfg`, following `upstream`.
    pub fn of(
        cluster: &'a Option<ClusterNode>,
        cfg: &'a crate::config::Config,
        upstream: &Option<super::replica::Upstream>,
    ) -> Role<'a> {
        Role {
            cluster: cluster.as_ref(),
            replica_of: &cfg.replica_of,
            follows: upstream.is_some(),
        }
    }

    /// Whether this node takes changes now.
    #[inline]
    pub fn leads(&self) -> bool {
        match self.cluster {
            None => !self.follows,
            Some(c) => c.leading_term().is_some(),
        }
    }

    /// Why this node takes no changes now (when it does not lead).
    #[cold]
    pub fn refusal(&self) -> Refusal {
        match (self.cluster, self.replica_of) {
            (Some(c), _) => c.not_leading(),
            (None, Some(primary)) => Refusal::ReadOnly(primary.to_string()),
            (None, None) => Refusal::NoPrimary("this tarq is not the primary".into()),
        }
    }
}

/// The loop's side of a core call: the connections and what the front-ends keep.
pub(super) struct Wire<'a> {
    /// The connections; a beanstalk reserve answered lets the commands behind it run next
    /// turn (`Conns::read_again`).
    pub conns: &'a mut Conns,
    pub beanstalk: &'a mut BeanstalkState,
    pub role: Role<'a>,
    /// Outcomes answered to the router (`ReplyTo::Router`), for it to take after the call.
    pub routed: &'a mut Vec<(u64, Digest)>,
}

impl Host<ReplyTo> for Wire<'_> {
    #[inline]
    fn deliver(&mut self, to: Caller, reply: ReplyTo, outcome: &Outcome<'_>) {
        if let ReplyTo::Router(token) = reply {
            return self.route_back(token, outcome);
        }
        self.conns.deliver(to.slot(), reply, outcome);
    }

    #[inline]
    fn changed(&mut self, to: Caller) {
        self.conns[to.slot()].out.changed = true;
    }

    fn is_live(&self, to: Caller) -> bool {
        self.conns.is_live(to)
    }

    #[inline]
    fn leads(&self) -> bool {
        self.role.leads()
    }

    fn not_leading(&self) -> Refusal {
        self.role.refusal()
    }

    fn tube_in_use(&self, tube: TubeIx) -> bool {
        self.beanstalk.in_use(tube)
    }

    fn tube_dropped(&mut self, tube: TubeIx, last: &Stats) {
        self.beanstalk.forget_tube(tube, last);
    }
}

impl Wire<'_> {
    /// An outcome the core answered to the router: kept for it (a sharded node's only).
    #[cold]
    #[inline(never)]
    fn route_back(&mut self, token: u64, outcome: &Outcome<'_>) {
        self.routed.push((token, Digest::of(outcome)));
    }
}

impl Server {
    /// The core and the loop's side of a call into it, borrowed apart.
    pub(super) fn split(&mut self) -> (&mut Core<ReplyTo>, Wire<'_>) {
        let wire = Wire {
            conns: &mut self.conns,
            beanstalk: &mut self.beanstalk,
            routed: &mut self.routed,
            role: Role::of(&self.cluster, &self.cfg, &self.upstream),
        };
        (&mut self.core, wire)
    }

    /// The role of this node now.
    pub(super) fn role(&self) -> Role<'_> {
        Role::of(&self.cluster, &self.cfg, &self.upstream)
    }

    /// Connection `idx` as the core knows it.
    #[inline]
    pub(crate) fn caller(&self, idx: usize) -> Caller {
        self.conns.caller(idx)
    }

    /// Runs a front-end's command for connection `idx` in the core, answered through `reply`.
    #[inline]
    pub(crate) fn dispatch(&mut self, idx: usize, reply: ReplyTo, cmd: &Command<'_>) {
        if self.conns.get(idx).is_some_and(|c| c.quota.is_some())
            && (self.cfg.user_put_rate > 0 || self.core.queue().users().any_put_rate())
        {
            self.charge_put(idx, cmd);
        }
        if self.router.is_some() {
            return self.dispatch_routed(idx, reply, *cmd);
        }
        let caller = self.caller(idx);
        let (core, mut wire) = self.split();
        core.execute(caller, reply, cmd, &mut wire);
    }

    /// Does what a front-end returned for connection `idx`'s request: runs its command (the
    /// hot path, inlined), or hands the connection over, or closes it.
    #[inline(always)]
    pub(crate) fn apply(&mut self, idx: usize, then: Then<'_>) {
        match then {
            Then::Done => {}
            Then::Run(reply, ref cmd) => self.dispatch(idx, reply, cmd),
            other => self.apply_rare(idx, other),
        }
    }

    /// What a front-end returned that is not a command: out of line, off the hot path.
    #[cold]
    #[inline(never)]
    fn apply_rare(&mut self, idx: usize, then: Then<'_>) {
        match then {
            Then::Done | Then::Run(..) => unreachable!("`apply` runs these itself"),
            Then::Close(reason) => self.close_quietly(idx, reason),
            Then::Relay {
                sync,
                format,
                subscribe,
            } => self.start_relay(idx, sync, format, subscribe),
            Then::Link { sync, hello } => self.start_link(idx, sync, &hello),
        }
    }

    /// [`dispatch`](Self::dispatch) on a sharded node: the router first. Out of line, so a
    /// single node's dispatch stays the core's call alone.
    #[inline(never)]
    fn dispatch_routed(&mut self, idx: usize, reply: ReplyTo, cmd: Command<'_>) {
        self.with_router(|r, cx| r.dispatch(cx, idx, reply, cmd));
    }

    /// Encodes `outcome` into connection `idx`'s replies, queued for this turn's flush.
    pub(crate) fn deliver(&mut self, idx: usize, reply: ReplyTo, outcome: &Outcome<'_>) {
        self.conns.deliver(idx, reply, outcome);
    }

    /// Why a batch of `commands` (or a take of many, `first`) may not run now: the room for
    /// all its items' records is reserved at once.
    pub(crate) fn batch_refusal(
        &mut self,
        first: &Command<'_>,
        commands: &[Command<'_>],
    ) -> Option<Refusal> {
        let (core, wire) = self.split();
        let bytes = commands.iter().map(|c| core.record_bound(c)).sum();
        core.batch_refusal(first, bytes, &wire)
    }

    /// Whether this node takes changes now.
    pub(crate) fn leads(&self) -> bool {
        self.role().leads()
    }
}

/// What the router keeps of an outcome answered to it (`ReplyTo::Router`).
#[derive(Debug, Clone)]
pub(crate) enum Digest {
    Ready(TubeIx),
    Count(u64),
    Stats(Stats),
    /// A tube's counts and urgent ready tasks (`Outcome::TubeFigures`).
    Figures(Stats, u64),
    Nothing,
    Ok,
    Error(Refusal),
    Other,
}

impl Digest {
    pub fn of(outcome: &Outcome<'_>) -> Digest {
        match outcome {
            Outcome::Ready(t) => Digest::Ready(*t),
            Outcome::Count(n) => Digest::Count(*n),
            Outcome::TubeStats(s) => Digest::Stats(*s),
            Outcome::TubeFigures { stats, urgent } => Digest::Figures(*stats, *urgent),
            Outcome::Nothing => Digest::Nothing,
            Outcome::Ok => Digest::Ok,
            Outcome::Error(e) => Digest::Error(e.clone()),
            _ => Digest::Other,
        }
    }
}
