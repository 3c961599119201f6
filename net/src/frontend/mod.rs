//! Front-ends: one per wire protocol. A front-end turns its frames into the core's
//! front-end-neutral [`Command`](crate::core::Command)s and the
//! [`Outcome`](crate::core::Outcome)s back into its replies. It returns what the loop should do
//! with a request ([`Then`]: the core's command, a close, a change of hands) and asks the loop
//! what it must know only through [`Loop`] (the loop implements it), so the loop calls
//! front-ends and never the other way; the queue, parked takes and the journal are the core's,
//! shared by all. Adding a
//! protocol is a codec crate (bytes only, like `tarq-iproto`), a translator here over `Loop`,
//! and a [`ReplyTo`] variant carrying what its replies need (the IPROTO sync, say).

pub mod beanstalk;
pub mod http;
pub mod iproto;
pub mod link;

use tarq_engine::{Micros, Queue, SessionId, Stats, TubeIx};
use tarq_ops::stats::Snapshot;

use crate::config::Config;
use crate::core::{Command, Outcome, Pauses, Refusal};

/// How to answer a command: the front-end of the asking connection and what its reply needs.
/// Kept by a parked take, so it is answered in its own protocol whenever it is served.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReplyTo {
    Iproto(iproto::Reply),
    Beanstalk(beanstalk::Reply),
    /// A command another node of a sharded cluster forwarded.
    Link(link::Reply),
    /// Answered to the loop itself (a sharded cluster's router gathering a whole tube's
    /// figures, or a watch), never to a connection: the token says which of its questions.
    Router(u64),
    Http(http::Reply),
}

/// What the loop does about a request a front-end read: mini-redis's `Command::from_frame`
/// then `apply`, with the loop applying. The front-end answers what it can itself (then
/// [`Then::Done`]) and returns the rest, so the hot path runs loop → front-end → loop →
/// core, and the front-end never holds the loop while the core works.
#[must_use]
#[derive(Debug)]
pub enum Then<'f> {
    /// Answered (or held) by the front-end: nothing more to do.
    Done,
    /// The core runs the command, answered through `ReplyTo`.
    Run(ReplyTo, Command<'f>),
    /// The connection closes once the replies it is owed are written (its client asked, or
    /// its user holds as many connections as it may).
    Close(&'static str),
    /// JOIN (`subscribe` `None`) or SUBSCRIBE after `(position, term, history)`: the
    /// connection becomes a relay streaming this node's WAL, or is refused.
    Relay {
        sync: u64,
        format: Option<u32>,
        subscribe: Option<(u64, u64, u64)>,
    },
    /// `tarq.link`: the connection becomes a link another node of a sharded cluster forwards
    /// its clients' calls on (answered on `sync`), or is refused.
    Link {
        sync: u64,
        hello: link::wire::Hello<'f>,
    },
}

/// Encodes `outcome` as the reply `to` asks for, appended to `out`. Inlined into the loop's
/// delivery, with the HTTP and link encoders out of line, so an IPROTO reply (the hot path)
/// pays no call for the others' sake.
#[inline]
pub fn encode(out: &mut Vec<u8>, to: ReplyTo, outcome: &Outcome<'_>) {
    match to {
        ReplyTo::Iproto(r) => iproto::encode(out, r, outcome),
        ReplyTo::Beanstalk(r) => beanstalk::encode(out, r, outcome),
        ReplyTo::Link(r) => link::encode(out, r, outcome),
        // The loop takes these before any encoding.
        ReplyTo::Router(_) => {}
        ReplyTo::Http(r) => http::encode(out, r, outcome),
    }
}

/// What a front-end may ask of the loop it runs in: its connection's replies and state, what
/// the core and the node read, the loop's clocks and figures, and the few changes whose
/// answer the front-end needs at once (a tube made on `use`, a user at its connection limit,
/// an event stream under the limit, a request held for the placement). What a request comes
/// to, the front-end returns ([`Then`]). The loop (`server::Server`) implements it; a
/// front-end knows nothing else of it, so the arrows go one way.
pub trait Loop {
    /// Runs `cmd` for connection `idx` in the core, answered through `reply`: for a command
    /// that borrows what the front-end built in the call (a batch's items, framed around their
    /// answers; an HTTP route's decoded body), which it cannot return.
    fn dispatch(&mut self, idx: usize, reply: ReplyTo, cmd: Command<'_>);
    /// Connection `idx`'s reply buffer, queued for the turn's flush.
    fn reply_buf(&mut self, idx: usize) -> &mut Vec<u8>;
    /// Writes a reply to `idx` that reads the queue (peeks, stats, lists).
    fn reply_with_queue(&mut self, idx: usize, write: &mut dyn FnMut(&mut Vec<u8>, &Queue));
    /// Whether connection `idx` is closing (nothing more of its input runs).
    fn closing(&self, idx: usize) -> bool;
    /// Connection `idx`'s engine session.
    fn sid(&self, idx: usize) -> SessionId;

    fn queue(&self) -> &Queue;
    /// Task `id` as this node's core serves it: `None` when it is not here, or when the copy
    /// here is not the one that counts — a replica's (its holders are the primary's sessions,
    /// numbered there) or a partition another set serves. A front-end's early answer about a
    /// task's holder reads this, never [`Loop::queue`]'s copy.
    fn served(&self, id: tarq_engine::TaskId) -> Option<tarq_engine::TaskRef<'_>>;
    /// The name of the tube task `id` is of, wherever it is: this node's queue's (a replica's
    /// copy has the same tube), or on a sharded node the placement's tube of the partition
    /// the id names. `None` when no tube could hold it.
    fn task_tube_name(&self, id: tarq_engine::TaskId) -> Option<String>;
    /// The tube named `name` (its first partition's index) and its numbering: the engine's,
    /// or on a sharded node one the placement has whose first partition this node does not
    /// hold yet (a replica before its primary's copy of it came).
    fn tube_named(&self, name: &str) -> Option<(TubeIx, tarq_engine::TubeNumbers)>;
    /// A request of connection `idx` named a tube this node knows nothing of: on a sharded
    /// node, it is held (with what follows it on the connection) until the placement is
    /// read from etcd, then run again (`true`: the front-end answers nothing now). `false`
    /// on a single node, or when this is that second run: the tube does not exist.
    fn hold_for_placement(&mut self, idx: usize) -> bool;
    /// A tube's figures with its consumers (the takes parked on it, the sessions holding its
    /// tasks); `holders` as `Queue::holders` gives them, read once for several tubes.
    fn tube_figures(&self, tube: TubeIx, holders: &[u64]) -> Option<Stats>;
    fn pauses(&self) -> &Pauses;
    /// Takes parked on `tube` now.
    fn parked_count(&self, tube: TubeIx) -> u64;
    /// Creates tube `name` on first use (`fifottl`, made on demand: dropped once unused).
    fn create_tube_for(&mut self, idx: usize, name: &str) -> Result<TubeIx, Refusal>;
    /// Whether this node makes a tube on first use at once ([`create_tube_for`]); a sharded
    /// cluster's node does not: its tubes are placed through the core's `CreateTube` (every
    /// node must agree on a tube's index), answered when the placement is made.
    ///
    /// [`create_tube_for`]: Loop::create_tube_for
    fn makes_tubes_on_demand(&self) -> bool;
    /// Drops the tubes made on demand that nothing uses any more and that hold no task.
    fn collect_tubes(&mut self);

    /// The turn's wall-clock time (task deadlines).
    fn now(&self) -> Micros;
    /// The turn's monotonic time (in-process timeouts).
    fn mono(&self) -> Micros;
    /// Every figure of `queue.stats()`.
    fn snapshot(&self) -> Snapshot;
    /// This process's random id.
    fn server_id(&self) -> u64;
    fn config(&self) -> &Config;

    /// The beanstalk front-end's server-wide state, and connection `idx`'s own (`None` unless
    /// it is a beanstalk connection).
    fn beanstalk_parts(
        &mut self,
        idx: usize,
    ) -> (
        &mut beanstalk::BeanstalkState,
        Option<&mut beanstalk::BsConn>,
    );
    /// beanstalk connections that have put, that have reserved, and that wait in a reserve.
    fn beanstalk_roles(&self) -> (u64, u64, u64);

    /// Why a batch of `commands` (or a take of many, `first`) may not run now.
    fn batch_refusal(&mut self, first: &Command<'_>, commands: &[Command<'_>]) -> Option<Refusal>;
    /// Releases every task session `sid` holds and serves the takes that wait for them.
    fn release_session(&mut self, sid: SessionId) -> usize;
    /// The IPROTO front-end's server-wide state.
    fn iproto(&mut self) -> &mut iproto::IprotoState;
    /// Who connection `idx` acts as (what its requests are checked against).
    fn who(&self, idx: usize) -> &crate::core::access::Who;
    /// Connection `idx` acts as `who` from now on (an AUTH passed), and may call functions if
    /// `may_call`; counted against that user's connections, or refused at its limit
    /// (`--user-max-connections`; it then stays as it was).
    fn act_as(
        &mut self,
        idx: usize,
        who: crate::core::access::Who,
        may_call: bool,
    ) -> Result<(), crate::core::access::UserRefused>;
    /// Connection `idx`'s greeting salt (for chap-sha1).
    fn salt(&self, idx: usize) -> [u8; tarq_iproto::greeting::SALT_LEN];
    /// `sha1(sha1(password))` of the configured user, if any.
    fn auth_hash(&self) -> Option<[u8; tarq_iproto::auth::SCRAMBLE_LEN]>;
    /// Connection `idx`'s tube-API session UUID, once drawn.
    fn session_uuid(&self, idx: usize) -> Option<[u8; 16]>;
    /// Connection `idx` acts as engine session `sid`, named `uuid` in the tube API.
    fn set_session(&mut self, idx: usize, sid: SessionId, uuid: [u8; 16]);
    /// `queue.cluster()`.
    fn cluster_overview(&mut self) -> rmpv::Value;

    /// Whether this node is a sharded cluster's (`--replica-set`): a tube's tasks are its
    /// partitions' owners' to list.
    fn sharded(&self) -> bool;
    /// A sharded cluster's links from this node and every set's moves, as the cluster page
    /// shows them (`None` on a node that is no sharded cluster's); never waits on other nodes.
    fn cluster_picture(&mut self) -> Option<serde_json::Value>;
    /// A sharded cluster's tubes as the console shows them (`None` on a single node): each
    /// summed over its partitions, the same from every node, at most a second old.
    fn cluster_tubes(
        &mut self,
    ) -> Option<std::sync::Arc<std::collections::HashMap<String, http::TubeTotals>>>;
    /// The HTTP front-end's server-wide counts.
    fn http(&mut self) -> &mut http::HttpState;
    /// Connection `idx`'s HTTP state (`None` unless it is an HTTP connection).
    fn http_conn(&mut self, idx: usize) -> Option<&mut http::HttpConn>;
    /// Connection `idx` carries the event stream from now on, or the streams open at the
    /// limit refuse it.
    fn start_stream(&mut self, idx: usize) -> Result<(), usize>;
    /// The Prometheus page of every figure, into `page`.
    fn metrics_page(&mut self, page: &mut String);
    /// The per-second figures of the last minutes.
    fn live(&self) -> &tarq_ops::live::Live;
    /// Open connections by protocol.
    fn connection_counts(&self) -> serde_json::Value;
    /// The HTTP port's own figures (requests, refusals, the live ticks' cost).
    fn console_figures(&self) -> serde_json::Value;
    /// The bound addresses: IPROTO's, beanstalk's and HTTP's (each `None` when not served).
    fn addresses(&self) -> [Option<std::net::SocketAddr>; 3];
}
