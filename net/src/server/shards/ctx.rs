//! What the router is handed when it acts ([`Ctx`]): the core, the wire (the connections and
//! what the core's host keeps), the turn's clocks, the link sessions, and the few settings and
//! handles a link needs. The router owns its own state and borrows these for one call, so it
//! never reaches into the loop.
//!
//! What only the loop can do — close a connection, end a session whose holds a lost link took,
//! wake a beanstalk reserve through its front-end, push a live sample to the HTTP streams — the
//! router asks for as an [`Effect`], run by the loop once the router's call returns: those paths
//! lead back into the router, which is borrowed while it acts.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use tarq_engine::{Micros, SessionId};

use crate::config::Config;
use crate::core::{Caller, Core, Outcome};
use crate::frontend::http::TubeTotals;
use crate::frontend::link::{self, LinkSessions};
use crate::frontend::ReplyTo;
use crate::server::cluster::ClusterNode;
use crate::server::host::Wire;
use crate::server::link_sockets::LinkSockets;

/// The next session number, taken.
fn take_sid(next: &mut u64) -> SessionId {
    let sid = *next;
    *next += 1;
    sid
}

/// The parts of the server the router acts on during one call.
pub(in crate::server) struct Ctx<'a> {
    pub core: &'a mut Core<ReplyTo>,
    /// The core's host: the connections, the front-ends' state, the node's role, and the
    /// outcomes answered to the router.
    pub wire: Wire<'a>,
    /// The turn's wall-clock and monotonic readings.
    pub now: Micros,
    pub mono: Micros,
    /// Other nodes' clients' sessions run here.
    pub link_sessions: &'a mut LinkSessions,
    pub cfg: &'a Config,
    /// The sockets of the links to other sets' primaries.
    pub links: &'a mut LinkSockets,
    /// The TLS configuration of connections to other nodes (`--tls-ca`).
    pub tls_nodes: Option<&'a Arc<rustls::ClientConfig>>,
    next_sid: &'a mut u64,
}

/// What the router asks of the loop (`Router::effects`), run after its call, in order.
pub(in crate::server) enum Effect {
    /// Close connection `idx` (if still generation `gen`) after the replies it is owed.
    Close {
        idx: usize,
        gen: u32,
        reason: &'static str,
    },
    /// Session `sid` lost its holds with a link: its connections close, its tasks go back.
    EndSession(SessionId),
    /// A beanstalk reserve parked on a partition that moved away waits on through the router.
    ReserveWoke(Caller),
    /// The console's figures of every tube for the live second `second` (`partial`: tubes
    /// some partition of which did not answer).
    LiveSample {
        second: u64,
        tubes: Arc<HashMap<String, TubeTotals>>,
        partial: HashSet<String>,
    },
}

impl<'a> Ctx<'a> {
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        core: &'a mut Core<ReplyTo>,
        wire: Wire<'a>,
        (now, mono): (Micros, Micros),
        link_sessions: &'a mut LinkSessions,
        cfg: &'a Config,
        links: &'a mut LinkSockets,
        tls_nodes: Option<&'a Arc<rustls::ClientConfig>>,
        next_sid: &'a mut u64,
    ) -> Ctx<'a> {
        Ctx {
            core,
            wire,
            now,
            mono,
            link_sessions,
            cfg,
            links,
            tls_nodes,
            next_sid,
        }
    }

    /// The core and its host, borrowed apart.
    pub fn split(&mut self) -> (&mut Core<ReplyTo>, &mut Wire<'a>) {
        (self.core, &mut self.wire)
    }

    /// Whether this node takes changes now.
    pub fn leads(&self) -> bool {
        self.wire.role.leads()
    }

    /// This node's election (a sharded node is always a cluster node).
    pub fn cluster(&self) -> Option<&'a ClusterNode> {
        self.wire.role.cluster
    }

    /// The cluster's etcd client, where placement changes are asked.
    pub fn cluster_handle(&self) -> &'a tarq_cluster::Cluster {
        (self.wire.role.cluster)
            .expect("a sharded node is a cluster node")
            .handle()
    }

    /// Encodes `outcome` into connection `idx`'s replies, queued for this turn's flush.
    pub fn deliver(&mut self, idx: usize, reply: ReplyTo, outcome: &Outcome<'_>) {
        self.wire.conns.deliver(idx, reply, outcome);
    }

    /// Whether `caller`'s connection is still the one that asked.
    pub fn is_live(&self, caller: Caller) -> bool {
        self.wire.conns.is_live(caller)
    }

    /// Connection `idx`'s reply buffer, queued for this turn's flush.
    pub fn reply_buf(&mut self, idx: usize) -> &mut Vec<u8> {
        self.wire.conns.out(idx)
    }

    /// A new engine session.
    pub fn new_session(&mut self) -> SessionId {
        take_sid(self.next_sid)
    }

    /// This node's session for session `session` of node `origin` (made the first time).
    pub fn link_session(&mut self, origin: &Arc<str>, session: u64) -> SessionId {
        let next_sid = &mut *self.next_sid;
        link::session_of(self.link_sessions, origin, session, || take_sid(next_sid))
    }

    /// Why connection `idx` may not carry node-to-node traffic, or `None`.
    pub fn node_refusal(&self, idx: usize) -> Option<String> {
        crate::server::tls::node_refusal(self.tls_nodes.is_some(), &self.wire.conns[idx])
    }
}
