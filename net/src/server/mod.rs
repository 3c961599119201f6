//! The event loop: one mio thread does everything a request needs — accept, read, decode, call
//! the engine, encode, write — like Tarantool's TX thread, with no locks and no thread hops.
//!
//! A turn is: poll (timeout = the nearest engine deadline, parked-take deadline or journal wake-up;
//! with `--busy-poll`, non-blocking polls first: [`wait`]) → read the clock once → accept and
//! collect readable connections → fire due engine deadlines → read each connection until it would
//! block (or its per-turn budget) and execute every complete frame, handing engine events to the
//! journal after each call → time out parked takes → commit the turn to the journal → write each
//! connection's released replies with one write. Connections return their fate through `closing`;
//! only the flush phase frees a slot, and tokens carry a generation so a stale event for a reused
//! slot is ignored.
//!
//! The operator's side ([`tarq_ops::Ops`]: Graphite, signals) rides on the same
//! loop: its tokens and timers are polled here, it gets a [`Snapshot`] when a report is due, and
//! a stop (signal or [`ServerHandle::shutdown`]) ends with [`Server::stop_gracefully`].

mod beanstalk_port;
mod clock;
mod cluster;
pub mod conn;
mod conns;
mod enforce;
mod front;
mod host;
mod http;
pub mod limits;
mod link_sockets;
pub mod quotas;
mod relay;
pub mod reload;
mod replica;
mod routing;
mod shards;
mod sync;
mod systemd;
mod throttle;
mod timers;
pub mod tls;
mod wait;

use std::io::{self, Read, Write};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use mio::net::{TcpListener, TcpStream};
use mio::{Events, Interest, Poll, Token, Waker};
use tarq_engine::{Bytes, Micros, Queue, SessionId};
use tracing::{debug, info, warn};

use crate::frontend::iproto::errors::refusal_text;

use crate::config::Config;
use crate::core::access::Who;
use crate::core::journal::{Journal, Ticket};
use crate::core::{Core, Outcome, Unneeded};
use crate::frontend::beanstalk::BsConn;
use crate::frontend::http::Http;
use crate::frontend::iproto::sessions::{OnClose, TubeSessions};
use crate::frontend::iproto::{Iproto, IprotoState, NumberText};
use crate::frontend::ReplyTo;
pub use conn::{set_mmap_threshold, MMAP_THRESHOLD_BYTES};
use conn::{
    Closing, Conn, OutBuf, Protocol, ReadBuf, ReadOutcome, READ_BUDGET_BYTES, READ_BUF_BYTES,
};
use conns::Conns;
use limits::Limits;
use link_sockets::LinkSockets;
use tarq_iproto::codes::*;
use tarq_iproto::{auth, greeting, response, split_frame};
use tarq_ops::signals::{self, Request};
use tarq_ops::stats::{ServerFigures, Snapshot};
use tarq_ops::tubes::TubeFigures;
use tarq_ops::Ops;
use timers::{Timer, Timers};

const LISTENER: Token = Token(0);
const WAKER: Token = Token(1);
/// The beanstalk port's listener (`--beanstalk-listen`).
const BEANSTALK_LISTENER: Token = Token(2);
// Token 3 is the HTTP port's listener (`http::HTTP_LISTENER`).

/// Which protocol a listener (and the connections it accepts) speaks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Proto {
    Iproto,
    Beanstalk,
    Http,
}

/// Engine deadlines (promotions, expiries, TTR returns) fired per turn. Enough to keep up with
/// any realistic rate (it runs every turn, and the loop spins while work is left), small enough
/// that a million tasks expiring at once keep every turn under the 1 ms turn budget: draining 1M due
/// tasks, the worst (cache-cold) step took 0.77–0.97 ms of thread CPU at 1024, too close to
/// the target, and 0.39–0.58 ms at 512 (`results/engine/2026-11-22-293912279d2f.json`,
/// `…-ae312e9a48b7.json`).
pub const ADVANCE_BUDGET: usize = 512;

/// Readiness events taken per poll; more simply wait for the next turn.
const EVENTS_CAPACITY: usize = 1024;

/// Pause before accepting again after running out of file descriptors, so the loop keeps serving
/// the connections it has instead of spinning on a failing accept.
const ACCEPT_BACKOFF: Micros = 50_000;

/// Where the frame decoder stops buffering: the largest frame plus its largest size prefix.
const MAX_PREFIX: usize = 9;

/// Error code sent to a connection refused at `--max-connections`. Tarantool has no such limit
/// and so no code for it; 0 (ER_UNKNOWN) still makes every client raise an error with the
/// message.
const ER_UNKNOWN: u32 = 0;

/// Longest a graceful stop waits for replies in flight to become durable and be written; a
/// client that does not read its replies cannot hold the exit longer than this.
pub const STOP_GRACE: Duration = Duration::from_secs(5);

/// How long a closing connection that is owed replies (its client shut its side after sending,
/// or sent broken framing) gets to take them, however many writes that needs. A client that
/// has stopped reading cannot hold its slot and buffers longer; one that reads gets every reply.
pub const CLOSE_LINGER: Micros = 5_000_000;

/// After the replies of a stop are out, how long clients get to close their side (they see our
/// FIN and normally close at once); one that does not is closed regardless.
pub const STOP_LINGER: Duration = Duration::from_secs(1);

/// Re-reads the configuration for a SIGHUP (given by `main`: the same command line over the
/// `--config` file as at start).
pub type Reloader = Box<dyn FnMut() -> Result<Config, String> + Send>;

pub use clock::wall_clock;
use clock::LoopClock;

/// Stops a running server from another thread.
#[derive(Clone)]
pub struct ServerHandle {
    stop: Arc<AtomicBool>,
    waker: Arc<Waker>,
    wall_step: Arc<AtomicI64>,
}

impl ServerHandle {
    /// Asks the loop to stop; `run` returns after the current turn.
    pub fn shutdown(&self) {
        self.stop.store(true, Ordering::SeqCst);
        // A failed wake only delays the stop until the next event.
        let _ = self.waker.wake();
    }

    /// Steps the server's wall clock by `micros` (back when negative), as NTP or an operator
    /// steps a machine's clock, and wakes the loop: task deadlines follow the step, in-process
    /// timeouts do not. For tests of exactly that.
    pub fn step_wall_clock(&self, micros: i64) {
        self.wall_step.fetch_add(micros, Ordering::SeqCst);
        let _ = self.waker.wake();
    }
}

/// The server: a listener, the queue and every connection, driven by [`Server::run`].
pub struct Server {
    poll: Poll,
    listener: TcpListener,
    /// The beanstalk port, when served.
    beanstalk_listener: Option<TcpListener>,
    /// The beanstalk front-end's counters, tube uses and pauses.
    pub(crate) beanstalk: crate::frontend::beanstalk::BeanstalkState,
    /// The HTTP port: its listener, its front-end's counts, the live figures and streams.
    pub(crate) http: http::HttpPort,
    waker: Arc<Waker>,
    stop: Arc<AtomicBool>,
    cfg: Config,
    /// TLS's configuration for new connections, and the IPROTO ones awaiting their ClientHello.
    tls: tls::TlsPorts,
    /// `sha1(sha1(password))` of the configured user, if any.
    hash2: Option<[u8; auth::SCRAMBLE_LEN]>,
    uuid: [u8; 16],
    /// The queue, the journal, parked takes and waiting puts: every command runs there.
    core: Core<ReplyTo>,
    /// Every connection and the turn's lists of them.
    conns: Conns,
    /// The engine has due deadlines left over from its budget.
    engine_behind: bool,
    /// The loop's own deadlines (replication's, the reports', the accept back-off, lingering
    /// closes), registered by their owners.
    timers: Timers,
    next_sid: u64,
    /// A sharded cluster's router (`--replica-set`).
    router: Option<shards::Router>,
    /// Other nodes' clients' sessions run here (a sharded cluster's links).
    pub(crate) link_sessions: crate::frontend::link::LinkSessions,
    /// The sockets of the router's links to other sets' primaries.
    link_sockets: LinkSockets,
    /// Outcomes the core answered to the router this call (`ReplyTo::Router`).
    routed: Vec<(u64, host::Digest)>,
    /// The wall and the monotonic clocks.
    clock: LoopClock,
    /// The turn's wall-clock reading: the `now` of every engine call in the turn.
    now: Micros,
    /// The turn's monotonic reading: every in-process timeout's `now`.
    mono: Micros,
    /// Graphite, signals, and the service-time histogram.
    ops: Ops,
    reloader: Option<Reloader>,
    /// The input budget, per-address counts and connection deadlines.
    limits: Limits,
    /// Per-user connection counts, put rates and mutes.
    quotas: quotas::Quotas,
    /// Connections whose puts this turn went over their user's rate: muted at its end.
    throttled: Vec<usize>,
    connections_accepted: u64,
    /// Sessions of the tube API (`queue.identify`, `queue.cfg{ttr}`).
    pub(crate) iproto: IprotoState,
    /// Connections streaming this tarq's WAL to replicas, and their feed's buffers.
    relays: relay::Relays,
    /// With `--replica-of`: the stream from the primary.
    upstream: Option<replica::Upstream>,
    /// With `--etcd`: the election and this node's role in the cluster.
    cluster: Option<cluster::ClusterNode>,
    /// `--sync-replicas`: which turns wait for the replicas' acknowledgements.
    sync: sync::SyncGate,
}

fn random_bytes<const N: usize>() -> io::Result<[u8; N]> {
    let mut b = [0u8; N];
    getrandom::fill(&mut b).map_err(|e| io::Error::other(format!("no randomness: {e}")))?;
    Ok(b)
}

impl Server {
    /// Binds the listener and creates the data directory; no WAL.
    pub fn bind(cfg: Config) -> io::Result<Server> {
        Server::with_journal(cfg, Journal::none())
    }

    /// Binds with a journal (durability) behind the commit hook.
    pub fn with_journal(cfg: Config, mut journal: Journal) -> io::Result<Server> {
        cfg.validate().map_err(io::Error::other)?;
        tarq_wal::lock::create_dir_durably(&cfg.data_dir).map_err(|e| {
            io::Error::new(
                e.kind(),
                format!("cannot create data dir {}: {e}", cfg.data_dir.display()),
            )
        })?;
        let poll = Poll::new()?;
        let (listener, beanstalk_listener) = bind_listeners(&cfg, &poll)?;
        let http = http::bind(cfg.http_listen, &cfg.http_hosts, &poll)?;
        let waker = Arc::new(Waker::new(poll.registry(), WAKER)?);
        journal.attach_waker(Arc::clone(&waker));
        let queue = recover(&mut journal, &cfg)?;
        let clock = LoopClock::default();
        let (now, mono) = (clock.wall(), clock.mono());
        let hash2 = cfg.auth.as_ref().map(|c| auth::hash2(&c.password));
        let cluster = match &cfg.cluster {
            Some(c) => Some(cluster::ClusterNode::start(
                c.election.clone(),
                Arc::clone(&waker),
            )?),
            None => None,
        };
        let router = router_of(&cfg, cluster.as_ref());
        let ops = Ops::new(poll.registry(), &cfg.ops, wall_clock())?;
        let tls = tls::TlsPorts::load(&cfg.tls).map_err(io::Error::other)?;
        let link_sockets = LinkSockets::new(poll.registry().try_clone()?);
        let mut server = Server {
            tls,
            poll,
            listener,
            beanstalk_listener,
            beanstalk: Default::default(),
            http,
            waker,
            stop: Arc::new(AtomicBool::new(false)),
            hash2,
            uuid: random_bytes()?,
            core: Core::new(queue, journal, now, mono),
            conns: Conns::default(),
            engine_behind: false,
            timers: Timers::default(),
            next_sid: 1,
            router,
            link_sockets,
            link_sessions: crate::frontend::link::LinkSessions::new(
                cfg.cluster
                    .as_ref()
                    .map(|c| c.election.name.as_str().into()),
            ),
            routed: Vec::new(),
            clock,
            now,
            mono,
            ops,
            reloader: None,
            limits: Limits::new(cfg.limits),
            quotas: quotas::Quotas::default(),
            throttled: Vec::new(),
            connections_accepted: 0,
            iproto: IprotoState::new(TubeSessions::new(
                cfg.max_session_grace,
                cfg.max_detached_sessions,
            )),
            relays: relay::Relays::default(),
            upstream: cfg.replica_of.map(replica::Upstream::new),
            cluster,
            sync: sync_gate(&cfg),
            cfg,
        };
        server.register_timers();
        Ok(server)
    }

    /// The bound address (useful with port 0).
    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        self.listener.local_addr()
    }

    pub fn handle(&self) -> ServerHandle {
        ServerHandle {
            stop: Arc::clone(&self.stop),
            waker: Arc::clone(&self.waker),
            wall_step: self.clock.stepper(),
        }
    }

    /// The bound beanstalk address, when `--beanstalk-listen` is set (useful with port 0).
    pub fn beanstalk_addr(&self) -> Option<SocketAddr> {
        self.beanstalk_listener
            .as_ref()
            .and_then(|l| l.local_addr().ok())
    }

    /// The bound `/metrics` address: the HTTP port's, when `--http-listen` (or its old name
    /// `--metrics-listen`) is set (useful with port 0).
    pub fn metrics_addr(&self) -> Option<SocketAddr> {
        self.http_addr()
    }

    /// Handles SIGTERM/SIGINT (graceful stop) and SIGHUP (`reloader` re-reads the
    /// configuration) on this loop. Process-wide: for the binary, not for servers in tests.
    pub fn handle_signals(&mut self, reloader: Reloader) -> io::Result<()> {
        self.reloader = Some(reloader);
        self.ops.handle_signals()
    }

    /// Every figure of `queue.stats()`, Graphite and `/metrics`, as of now.
    pub fn snapshot(&self) -> Snapshot {
        let queue = self.core.queue();
        let (parked_takes, takes_parked) = self.core.parked_takes();
        // A partitioned tube's partitions share its name: each is told by its number, known
        // from the placement (a tube of one partition keeps its series as before shards).
        let placement = (self.router.as_ref())
            .and(self.cluster.as_ref())
            .map(|c| c.handle().placement());
        let routed = (self.router.as_ref()).map_or_else(Default::default, |s| s.router_figures());
        let moves = (self.router.as_ref()).map_or((0, Default::default()), |s| {
            let (now, done) = s.move_figures();
            (u64::from(now.is_some()), done)
        });
        let holders = queue.holders();
        Snapshot {
            engine: queue.all_stats(),
            tubes: queue
                .tubes()
                .map(|t| TubeFigures {
                    name: t.name.to_owned(),
                    partition: placement
                        .as_deref()
                        .and_then(|p| p.at_index(t.ix))
                        .filter(|(tube, _)| tube.name == t.name && tube.partitions.len() > 1)
                        .map(|(_, p)| p)
                        .or((t.opts.part > 0).then_some(t.opts.part)),
                    stats: self.core.tube_figures(t.ix, &holders).unwrap_or_default(),
                })
                .collect(),
            server: ServerFigures {
                // The queue's clients: the HTTP port's connections are counted apart
                // (`/api/server`), as its old `/metrics` clients were.
                connections: (self.conns.len() as u64).saturating_sub(self.http.state.connections),
                connections_accepted: self.connections_accepted,
                parked_takes: parked_takes as u64,
                takes_parked,
                requests: self.ops.service.requests(),
                beanstalk_connections: self.beanstalk.connections,
                beanstalk_commands: self.beanstalk.commands(),
                beanstalk_errors: self.beanstalk.errors,
                beanstalk_refused: self.beanstalk.refused,
                access_denied: self.iproto.access_denied,
                moves_running: moves.0,
                moves_committed: moves.1.committed,
                moves_given_up: moves.1.given_up,
                moved_tasks: moves.1.tasks_moved,
                last_move_ms: moves.1.last_ms.unwrap_or(0),
                links_refused: self.router.as_ref().map_or(0, |s| s.refused_links()),
                routed_forwarded: routed.forwarded,
                routed_held: routed.held,
                routed_waiting: routed.waiting,
                routed_refused: routed.refused,
            },
            limits: self.limit_figures(),
            users: self.quotas.figures(),
            wal: self.core.journal().figures(),
            replication: tarq_ops::stats::ReplicationFigures {
                replicas: self.replica_count(),
                sync_waiting: self.sync.waiting(),
                sync_timeouts: self.sync.timeouts,
                upstream: self.upstream_figures(),
            },
            last_id: queue.last_id(),
            uptime: self.ops.uptime(self.now),
            now: self.now,
        }
    }

    /// Runs the loop on the calling thread (pinned to `--cpu` if set) until shut down.
    pub fn run(&mut self) -> io::Result<()> {
        if let Some(cpu) = self.cfg.cpu {
            pin_to(cpu)?;
        }
        self.announce()?;
        // Only the binary, which handles the process's signals, speaks for the process to
        // systemd; servers run in-process by tests do not.
        let service = self.reloader.is_some();
        if service {
            systemd::ready();
        }
        let mut events = Events::with_capacity(EVENTS_CAPACITY);
        while !self.stop.load(Ordering::SeqCst) {
            let timeout = self.poll_timeout();
            let busy = Duration::from_micros(self.cfg.busy_poll);
            if let Err(e) = wait::wait(&mut self.poll, &mut events, timeout, busy) {
                if e.kind() == io::ErrorKind::Interrupted {
                    continue;
                }
                return Err(e);
            }
            self.read_clocks();
            if (self.timers.get(Timer::AcceptPause)).is_some_and(|t| t <= self.mono) {
                self.timers.set(Timer::AcceptPause, None);
                self.accept_all(Proto::Iproto);
                self.accept_all(Proto::Beanstalk);
                self.accept_all(Proto::Http);
            }
            for ev in events.iter() {
                self.on_event(ev);
            }
            for request in self.ops.take_requests() {
                self.on_signal(request, service);
            }
            self.turn();
        }
        self.stop_gracefully();
        info!(connections = self.conns.len(), "tarq stopped");
        Ok(())
    }

    /// Logs what this server serves, and where.
    fn announce(&self) -> io::Result<()> {
        if let Some(addr) = self.beanstalk_addr() {
            info!(listen = %addr, "serving the beanstalk protocol");
            match (&self.cfg.auth, &self.cfg.beanstalk_user) {
                (Some(_), Some(user)) => {
                    info!(listen = %addr, %user, "the beanstalk port acts as its user")
                }
                // The protocol has no login: without --beanstalk-user the port may do
                // everything, as before users existed.
                (Some(_), None) => {
                    warn!(listen = %addr, "the beanstalk port has no user (--beanstalk-user): it may do everything; serve it on a trusted address only")
                }
                (None, _) => {}
            }
        }
        self.announce_http();
        info!(
            listen = %self.local_addr()?,
            null = self.cfg.null,
            busy_poll_us = self.cfg.busy_poll,
            auth = self.cfg.auth.is_some(),
            "tarq serving"
        );
        Ok(())
    }

    /// One readiness event: a listener accepts, a connection is queued to be read or
    /// flushed, the upstream and ops take theirs.
    #[inline]
    fn on_event(&mut self, ev: &mio::event::Event) {
        match ev.token() {
            LISTENER => self.accept_all(Proto::Iproto),
            BEANSTALK_LISTENER => self.accept_all(Proto::Beanstalk),
            http::HTTP_LISTENER => self.accept_all(Proto::Http),
            WAKER => {}
            replica::UPSTREAM => self.upstream_ready(),
            Token(t) if LinkSockets::slot_of(t).is_some() => {
                if let Some(set) = LinkSockets::slot_of(t) {
                    self.with_router(|r, cx| r.link_ready(cx, set));
                }
            }
            t if Ops::owns(t) => {
                self.ops.on_event(ev, self.now);
                self.timers.set(Timer::Ops, self.ops.next_timer());
            }
            Token(t) => {
                let Some(idx) = self.conns.slot_of(t) else {
                    return;
                };
                let c = &mut self.conns[idx];
                if c.closing.is_some() {
                    // Only the replies it is owed matter now.
                    if ev.is_writable() || ev.is_error() || ev.is_write_closed() {
                        self.conns.mark_flush(idx);
                    }
                    return;
                }
                if ev.is_read_closed() || ev.is_error() {
                    c.read_closed = true;
                }
                if (ev.is_readable() || ev.is_read_closed() || ev.is_error()) && !c.to_read {
                    c.to_read = true;
                    self.conns.read.push(idx);
                }
                if ev.is_writable() {
                    self.conns.mark_flush(idx);
                }
            }
        }
    }

    /// A signal's request: stop (SIGTERM, SIGINT) or reload (SIGHUP), told to systemd when
    /// this process is its `service`.
    fn on_signal(&mut self, request: Request, service: bool) {
        match request {
            Request::Stop { signal } => {
                info!(signal = signals::name(signal), "stopping");
                if service {
                    systemd::stopping();
                }
                self.stop.store(true, Ordering::SeqCst);
            }
            Request::Reload => {
                if service {
                    systemd::reloading();
                }
                self.reload();
                if service {
                    systemd::ready();
                }
            }
        }
    }

    /// SIGHUP: re-reads the configuration and applies what can change live.
    fn reload(&mut self) {
        let Some(load) = &mut self.reloader else {
            return;
        };
        match load() {
            Ok(new) => {
                reload::apply(&mut self.cfg, new, &mut self.ops, self.now);
                self.timers.set(Timer::Ops, self.ops.next_timer());
                self.limits.reconfigure(self.cfg.limits);
                self.hash2 = self.cfg.auth.as_ref().map(|c| auth::hash2(&c.password));
                self.reload_certificate();
            }
            Err(e) => warn!(
                error = %reload::one_line(&e),
                "configuration not reloaded: the running one stays"
            ),
        }
    }

    /// The end of `run`: stops accepting, answers parked takes with no value (as a timeout
    /// would), writes the replies in flight once durable (within [`STOP_GRACE`]), then has the
    /// journal write and sync everything.
    pub fn stop_gracefully(&mut self) {
        // Deregistered, new connections wait in the kernel's backlog until the exit resets them.
        let _ = self.poll.registry().deregister(&mut self.listener);
        if let Some(l) = &mut self.beanstalk_listener {
            let _ = self.poll.registry().deregister(l);
        }
        if let Some(l) = &mut self.http.listener {
            let _ = self.poll.registry().deregister(l);
        }
        self.answer_waiters();
        // A stop does not wait out the put rate: replies held by a mute go with the others.
        self.unmute_all();
        let deadline = Instant::now() + STOP_GRACE;
        let mut events = Events::with_capacity(EVENTS_CAPACITY);
        loop {
            self.read_clocks();
            self.core.begin_turn(self.now, self.mono);
            // No events are dispatched here: retry every connection with replies left.
            self.conns.flush_released();
            self.commit_and_flush();
            let pending = self.conns.holding.len()
                + self
                    .conns
                    .iter()
                    .filter(|(_, c)| c.out.backlog() > 0)
                    .count();
            if pending == 0 {
                break;
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                warn!(
                    pending,
                    "stopping with replies not written (clients not reading)"
                );
                break;
            }
            // Woken by writability or by the journal's sync; the short cap covers neither.
            let wait = left.min(Duration::from_millis(10));
            if let Err(e) = self.poll.poll(&mut events, Some(wait)) {
                if e.kind() != io::ErrorKind::Interrupted {
                    warn!(error = %e, "poll failed while stopping");
                    break;
                }
            }
        }
        let (queue, journal) = self.core.queue_and_journal();
        if let Err(e) = journal.shutdown(queue) {
            warn!(error = %e, "the journal did not stop cleanly");
        }
        self.linger(deadline.min(Instant::now() + STOP_LINGER), &mut events);
    }

    /// The replies are out: send each client a FIN after them and read (and drop) what it
    /// still sends until it closes, or until `until`. Exiting with unread input would make the
    /// kernel send a reset, and a reset can destroy replies the client has not read yet.
    fn linger(&mut self, until: Instant, events: &mut Events) {
        for (_, c) in self.conns.iter_mut() {
            let _ = c.stream.shutdown(std::net::Shutdown::Write);
        }
        let mut open: Vec<usize> = self.conns.iter().map(|(idx, _)| idx).collect();
        let mut chunk = [0u8; 4096];
        while !open.is_empty() {
            open.retain(|&idx| loop {
                match self.conns[idx].stream.read(&mut chunk) {
                    Ok(0) => return false,
                    Ok(_) => {}
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => return true,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    Err(_) => return false,
                }
            });
            let left = until.saturating_duration_since(Instant::now());
            if open.is_empty() || left.is_zero() {
                break;
            }
            if let Err(e) = self.poll.poll(events, Some(left)) {
                if e.kind() != io::ErrorKind::Interrupted {
                    break;
                }
            }
        }
    }

    fn poll_timeout(&mut self) -> Option<Duration> {
        if self.engine_behind
            || !self.conns.read_again.is_empty()
            || !self.conns.flush.is_empty()
            // Outcomes the core answered to the router after its turn's step (a close's
            // released tasks woke a watch): taken next turn.
            || !self.routed.is_empty()
            || self.relays_busy()
            || self.upstream.as_ref().is_some_and(|u| u.has_work())
        {
            return Some(Duration::ZERO);
        }
        #[cfg(debug_assertions)]
        self.check_timers();
        // The engine's deadlines and the operator's reports are on the wall clock, every
        // in-process timeout on the monotonic one.
        let (mono, wall) = self.timers.next();
        // A wall-clock deadline is as far from the turn's wall reading as its monotonic
        // equivalent is from the turn's monotonic one: one clock read serves both.
        let wall_as_mono = |t: Micros| self.mono.saturating_add(t).saturating_sub(self.now);
        let next = (wall.map(wall_as_mono).into_iter()).chain(mono).min()?;
        // mio rounds a sub-millisecond timeout up, so a deadline is never slept past.
        Some(Duration::from_micros(
            next.saturating_sub(self.clock.mono()),
        ))
    }

    /// Registers the deadlines a new server starts with: the reports', and a replica's first
    /// connection attempt.
    fn register_timers(&mut self) {
        self.timers.set(Timer::Ops, self.ops.next_timer());
        self.register_upstream();
        self.register_live();
        self.register_turn_timers();
    }

    /// The first deadlines of the parts that keep theirs in ordered structures of their own,
    /// registered at the end of each turn (`timers`).
    fn register_turn_timers(&mut self) {
        // A replica's deadlines fire on its primary: its engine never advances by itself.
        let engine = self.core.next_engine_deadline().filter(|_| self.leads());
        self.timers.set(Timer::Engine, engine);
        self.timers.set(Timer::Core, self.core.next_timer());
        self.timers
            .set(Timer::Journal, self.core.next_journal_wakeup());
        self.timers.set(Timer::Sync, self.sync.next_deadline());
        self.timers.set(Timer::Limits, self.limits.next_deadline());
        self.timers
            .set(Timer::Sessions, self.iproto.sessions.next_deadline());
        self.timers.set(Timer::Quotas, self.quotas.next_deadline());
    }

    /// The upstream's deadline, after it changed (or went away, or came).
    pub(super) fn register_upstream(&mut self) {
        let at = self.upstream.as_ref().and_then(|u| u.next_timer());
        self.timers.set(Timer::Upstream, at);
    }

    /// The relays' soonest heartbeat, after it changed.
    pub(super) fn register_heartbeats(&mut self) {
        self.timers.set(Timer::Heartbeats, self.next_heartbeat());
    }

    /// A debug build's check that every owner registered its deadline: each slot holds what
    /// the owner says now.
    #[cfg(debug_assertions)]
    fn check_timers(&mut self) {
        let truth = [
            (Timer::Heartbeats, self.next_heartbeat()),
            (
                Timer::Upstream,
                self.upstream.as_ref().and_then(|u| u.next_timer()),
            ),
            (Timer::Linger, self.conns.next_linger()),
            (Timer::TlsHello, self.tls.next_wait()),
            (Timer::Ops, self.ops.next_timer()),
            (
                Timer::Shards,
                self.router.as_ref().and_then(shards::Router::next_deadline),
            ),
            (Timer::Core, self.core.next_timer()),
            (Timer::Sync, self.sync.next_deadline()),
            (Timer::Limits, self.limits.next_deadline()),
            (Timer::Sessions, self.iproto.sessions.next_deadline()),
            (Timer::Quotas, self.quotas.next_deadline()),
        ];
        for (timer, at) in truth {
            assert_eq!(
                self.timers.get(timer),
                at,
                "{timer:?} did not register its deadline"
            );
        }
        // The journal's wake-up is read against the clock (a retry at an instant, a snapshot's
        // step after a pause), so it is not compared; what its writer thread does between a
        // turn and the poll comes through the waker.
        // Leadership starts in a turn but may run out between a turn and the poll (a lease
        // read against the clock: the deadline registered is merely early), and a lapsed
        // lease may be extended again by the election thread in between (the deadline comes
        // at the next turn's end, as the old reading at the poll would have missed it too).
        let engine = self.core.next_engine_deadline();
        let registered = self.timers.get(Timer::Engine);
        assert!(
            registered.is_none() || registered == engine,
            "a stale engine deadline"
        );
    }

    fn accept_all(&mut self, proto: Proto) {
        loop {
            let listener = match proto {
                Proto::Iproto => &self.listener,
                Proto::Beanstalk => match &self.beanstalk_listener {
                    Some(l) => l,
                    None => return,
                },
                Proto::Http => match &self.http.listener {
                    Some(l) => l,
                    None => return,
                },
            };
            match listener.accept() {
                Ok((stream, peer)) => self.admit(stream, peer, proto),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) if e.kind() == io::ErrorKind::ConnectionAborted => {}
                Err(e) => {
                    // Out of file descriptors (or memory): keep serving, retry a little later.
                    warn!(error = %e, "accept failed; pausing accepts");
                    let until = self.mono + ACCEPT_BACKOFF;
                    self.timers.set(Timer::AcceptPause, Some(until));
                    return;
                }
            }
        }
    }

    fn admit(&mut self, mut tcp: TcpStream, peer: SocketAddr, proto: Proto) {
        let salt = match random_bytes::<{ greeting::SALT_LEN }>() {
            Ok(s) => s,
            Err(e) => {
                warn!(%peer, error = %e, "connection dropped");
                return;
            }
        };
        let hello = greeting::encode(&self.uuid, &salt);
        if self.conns.len() >= self.cfg.max_connections {
            self.refuse_over_limit(tcp, peer, proto, &hello);
            return;
        }
        if proto == Proto::Http {
            if !self.admit_http_peer(&mut tcp, peer) {
                return;
            }
        } else if !self.admit_peer(&mut tcp, peer, &hello) {
            return;
        }
        // beanstalk has no authentication; HTTP asks for it with each request (Basic).
        let who = Self::who_at_open(&self.cfg, proto);
        // The beanstalk port's user is counted from the accept: there is no login to refuse.
        let Ok(quota) = self.admit_beanstalk_user(&mut tcp, peer, proto, &who) else {
            return;
        };
        // Latency over batching: each turn already coalesces its replies into one write.
        if let Err(e) = tcp.set_nodelay(true) {
            debug!(%peer, error = %e, "TCP_NODELAY not set");
        }
        self.open_conn(tcp, peer, proto, (salt, hello), who, quota);
    }

    /// Registers an admitted connection and sends what it is sent first (IPROTO's greeting,
    /// unless it waits for a ClientHello).
    fn open_conn(
        &mut self,
        tcp: TcpStream,
        peer: SocketAddr,
        proto: Proto,
        (salt, hello): ([u8; greeting::SALT_LEN], [u8; greeting::GREETING_LEN]),
        who: crate::core::access::Who,
        quota: Option<usize>,
    ) {
        let mode = match proto {
            Proto::Iproto => self.cfg.tls.iproto,
            Proto::Beanstalk => self.cfg.tls.beanstalk,
            Proto::Http => self.cfg.tls.http,
        };
        let mut stream = tls::Stream::accepted(tcp, mode, self.tls.config.as_ref());
        let (idx, gen, token) = self.conns.next_slot();
        if let Err(e) = self
            .poll
            .registry()
            .register(&mut stream, token, Interest::READABLE)
        {
            warn!(%peer, error = %e, "connection dropped: cannot register");
            self.limits.release(peer.ip());
            if let Some(key) = quota {
                self.quotas.release(key);
            }
            return;
        }
        let sid = self.next_sid;
        self.next_sid += 1;
        let mut out = OutBuf::default();
        let (bs, max_job) = (&mut self.beanstalk, self.cfg.beanstalk_max_job_size);
        let (conn_proto, rbuf) = open_protocol(proto, bs, max_job, salt, &hello, &mut out);
        if proto == Proto::Http {
            self.http.state.connections += 1;
        }
        // A `guest` that was granted something may call without AUTH: the auth timeout is for
        // connections that may do nothing until they authenticate.
        let authenticated = proto != Proto::Iproto || who.may_call(self.core.queue().users());
        let guard = self
            .limits
            .open(READ_BUF_BYTES, self.mono, authenticated, (idx, gen));
        self.conns.insert(Conn {
            stream,
            peer,
            gen,
            sid,
            authenticated,
            who,
            quota,
            throttle: 0,
            muted_until: None,
            rbuf,
            out,
            token,
            want_write: false,
            to_read: false,
            read_closed: false,
            to_flush: false,
            closing: None,
            guard,
            proto: conn_proto,
        });
        self.opened(idx, gen, peer, proto);
    }

    /// The bookkeeping of a connection just opened: its wait for a ClientHello, the counts,
    /// the per-address limits' sweep, the log line.
    fn opened(&mut self, idx: usize, gen: u32, peer: SocketAddr, proto: Proto) {
        let sid = self.conns[idx].sid;
        if proto == Proto::Iproto && self.conns[idx].stream.undecided() {
            // The client speaks TLS if its ClientHello comes before the wait ends; its greeting
            // goes out then, inside TLS or in the clear.
            let at = self.mono.saturating_add(self.cfg.tls.hello_wait);
            self.tls.waits.push_back((at, idx, gen));
            self.timers.set(Timer::TlsHello, self.tls.next_wait());
        }
        self.connections_accepted += 1;
        let conns = &self.conns;
        self.limits
            .sweep(|slot, gen| conns.get(slot).is_some_and(|c| c.gen == gen));
        info!(sid, %peer, ?proto, connections = self.conns.len(), "connection opened");
    }

    /// A connection past `--max-connections`: an IPROTO client gets the greeting, then an
    /// error every client reports, then the close; beanstalk has no greeting and no error a
    /// client reads unasked, so its connection is just closed.
    fn refuse_over_limit(
        &self,
        mut stream: TcpStream,
        peer: SocketAddr,
        proto: Proto,
        hello: &[u8],
    ) {
        let limit = self.cfg.max_connections;
        if proto == Proto::Beanstalk {
            let _ = stream.shutdown(std::net::Shutdown::Both);
            warn!(%peer, limit, "beanstalk connection refused: limit reached");
            return;
        }
        if proto == Proto::Http {
            let mut msg = Vec::new();
            let why = format!("Too many connections: the limit is {limit} (--max-connections)");
            crate::frontend::http::refusal(&mut msg, 503, &why);
            let _ = stream.write(&msg);
            let _ = stream.shutdown(std::net::Shutdown::Write);
            warn!(%peer, limit, "HTTP connection refused: limit reached");
            return;
        }
        let mut msg = hello.to_vec();
        let text = format!("Too many connections: the limit is {limit} (--max-connections)");
        response::error(&mut msg, 0, ER_UNKNOWN, &text);
        // One best-effort write into a fresh socket buffer; the close follows regardless.
        let _ = stream.write(&msg);
        let _ = stream.shutdown(std::net::Shutdown::Write);
        warn!(%peer, limit, "connection refused: limit reached");
    }

    /// Everything after the poll: deadlines, reads and calls, parked timeouts, commit, flush.
    fn turn(&mut self) {
        self.turn_begin();
        if self.quotas.next_deadline().is_some_and(|t| t <= self.mono) {
            self.unmute_due();
        }
        self.read_ready();
        self.expire_deadlines();
        if self.tls.next_wait().is_some_and(|t| t <= self.mono) {
            self.end_hello_waits();
        }
        self.answer_expired_waits();
        self.turn_side_work();
        // Before the commit, so a tube's drop is in this turn's batch.
        self.collect_tubes();
        self.with_router(shards::Router::flush_links);
        if !self.throttled.is_empty() {
            self.mute_throttled();
        }
        self.commit_and_flush();
        self.register_turn_timers();
    }

    /// The turn's start: the clocks, the election's news, the replication stream, the
    /// engine's due deadlines, expired sessions and ended pauses.
    fn turn_begin(&mut self) {
        self.core.begin_turn(self.now, self.mono);
        self.limits.turn_start();
        self.cluster_turn();
        if self.upstream.is_some() {
            self.upstream_turn();
        }
        if self.leads() && !self.cfg.null {
            let (core, mut wire) = self.split();
            self.engine_behind = core.advance(ADVANCE_BUDGET, &mut wire);
        }

        for sid in self.iproto.sessions.expired(self.mono) {
            let released = self.release_session(sid);
            info!(sid, released, "session expired");
        }
        if self.core.pauses_due() {
            let (core, mut wire) = self.split();
            core.end_pauses(&mut wire);
        }
    }

    /// Reads and runs what every readable connection sent (and those with input left over).
    fn read_ready(&mut self) {
        let mut list = std::mem::take(&mut self.conns.read);
        list.append(&mut self.conns.read_again);
        for &idx in &list {
            if let Some(c) = self.conns.get_mut(idx) {
                c.to_read = false;
                self.read_and_execute(idx);
            }
        }
        list.clear();
        self.conns.read = list;
        self.conns.read_again.append(&mut self.conns.read_again_fed);
    }

    /// Answers the takes and puts whose wait ran out, and frees lingering connections past
    /// their deadline.
    fn answer_expired_waits(&mut self) {
        while let Some((caller, reply)) = self.core.expired_take() {
            if self.is_live(caller) {
                match reply {
                    // The front-end decides: TIMED_OUT, DEADLINE_SOON, or wait on.
                    ReplyTo::Beanstalk(_) => self.beanstalk_reserve_woke(caller.slot()),
                    _ => self.deliver(caller.slot(), reply, &Outcome::Nothing),
                }
            }
        }
        if self.core.has_waiting_puts() {
            let (core, mut wire) = self.split();
            core.expire_waiting_puts(&mut wire);
        }

        if !self.conns.lingering.is_empty() {
            self.conns.end_lingering(self.mono);
            self.timers.set(Timer::Linger, self.conns.next_linger());
        }
    }

    /// The work of the parts beside the queue: the router's, the console's, the cluster
    /// layout's check, the figures pushed out.
    fn turn_side_work(&mut self) {
        if self.router.is_some() {
            // Watches answered while the turn served others' calls, and waits that ran out.
            let steps: [fn(&mut shards::Router, &mut shards::Ctx<'_>); 8] = [
                shards::Router::take_routed,
                shards::Router::expire_waiters,
                shards::Router::tick_move,
                shards::Router::check_orphaned_copies,
                shards::Router::let_go_gradually,
                shards::Router::check_links,
                shards::Router::expire_drop_holds,
                shards::Router::release_orphans,
            ];
            for step in steps {
                self.with_router(step);
            }
        }
        if self.http.listener.is_some() {
            self.live_tick();
        }
        if self.cluster.as_ref().is_some_and(|c| !c.layout_judged) {
            self.judge_layout();
        }
        if self.ops.is_due(self.now) {
            let snapshot = self.snapshot();
            self.ops.tick(self.now, &snapshot);
            self.timers.set(Timer::Ops, self.ops.next_timer());
        }
    }

    /// Answers every parked take with no value (as a timeout would) and every waiting put
    /// with "full": the server stops.
    fn answer_waiters(&mut self) {
        self.answer_parked_with_nothing();
        while let Some((caller, reply)) = self.core.any_waiting_put() {
            if self.is_live(caller) {
                self.deliver(caller.slot(), reply, &Outcome::Full);
            }
        }
    }

    /// Answers every parked take with no task, as a timeout would (nothing may be taken here
    /// now: the server stops, or this node stops leading).
    pub(super) fn answer_parked_with_nothing(&mut self) {
        while let Some((caller, reply)) = self.core.any_parked() {
            if self.is_live(caller) {
                self.deliver(caller.slot(), reply, &Outcome::Nothing);
                // A beanstalk reserve parked on several tubes is answered once.
                self.parked_answered(caller.slot(), reply);
            }
        }
    }

    /// Whether `caller`'s connection is still the one that asked.
    fn is_live(&self, caller: crate::core::Caller) -> bool {
        self.conns.is_live(caller)
    }

    /// Reads what the connection has and executes every complete frame in it.
    fn read_and_execute(&mut self, idx: usize) {
        let gen = self.conns[idx].gen;
        if (self.router.as_ref()).is_some_and(|r| r.input_held(idx, gen)) || self.conns[idx].muted()
        {
            // Read again once the held request has run (`shards_placement_read`), or once its
            // mute ends (`unmute_due`).
            return;
        }
        let c = &self.conns[idx];
        let request_cap = match (c.beanstalk(), c.http()) {
            (Some(bs), _) => bs.decoder.max_request(),
            (_, Some(_)) => crate::frontend::http::MAX_REQUEST_BYTES,
            _ => self.frame_cap(c) + MAX_PREFIX,
        };
        let c = &mut self.conns[idx];
        if c.closing.is_some() {
            return;
        }
        // The buffer grows only as far as the input budget has room for; what is read, by no
        // more than the turn's input allowance.
        let cap = self.limits.read_cap(&c.guard, request_cap);
        let before = c.rbuf.data().len();
        let allowance = self.limits.read_allowance(&c.guard, READ_BUDGET_BYTES);
        let to_eof = c.read_closed || c.stream.reads_to_block();
        let outcome = c.rbuf.fill(&mut c.stream, cap.bytes, allowance, to_eof);
        if c.stream.refused() {
            self.refuse_plain(idx);
            return;
        }
        if c.stream.is_tls() {
            // The handshake may have left records to send, and the greeting waits for it.
            self.conns.mark_flush(idx);
        }
        let c = &mut self.conns[idx];
        let got = c.rbuf.data().len() - before;
        self.limits.spend(&c.guard, got);
        let read = got > 0;
        self.limits.settle(&mut c.guard, c.rbuf.allocated());
        let used = self.execute_buffered(idx);
        if self.conns[idx].closing.is_some() {
            self.drop_input(idx);
            return;
        }
        self.after_read(idx, outcome, cap.by_budget, read, used);
    }

    /// Runs every complete request in connection `idx`'s input; returns the bytes used.
    fn execute_buffered(&mut self, idx: usize) -> usize {
        let c = &mut self.conns[idx];
        // Borrow the input out of the connection while executing: replies go to `self.conns`.
        let mut rbuf = std::mem::take(&mut c.rbuf);
        let beanstalk = c.beanstalk().is_some();
        let web = c.http().is_some();
        let big_frame = match beanstalk || web {
            true => None,
            false => rbuf.take_whole_big_frame(),
        };
        let used = if let Some(frame) = big_frame {
            self.execute_big_frame(idx, frame)
        } else {
            let data = rbuf.data();
            let used = if beanstalk {
                self.execute_beanstalk_input(idx, data)
            } else if web {
                let (used, then) = Http::new(self).execute_input(idx, data);
                self.apply(idx, then);
                used
            } else {
                self.execute_iproto_input(idx, data)
            };
            rbuf.consume(used);
            used
        };
        self.conns[idx].rbuf = rbuf;
        used
    }

    /// What follows a read of connection `idx` that ran `used` bytes of requests: the input
    /// budget settled, and — as the read ended (`outcome`; `by_budget`: the buffer could grow
    /// no further for the input budget; `read`: bytes came in) — nothing, another read this
    /// turn or the next, or the connection's end.
    fn after_read(
        &mut self,
        idx: usize,
        outcome: ReadOutcome,
        by_budget: bool,
        read: bool,
        used: usize,
    ) {
        let c = &mut self.conns[idx];
        self.limits.settle(&mut c.guard, c.rbuf.allocated());
        // A beanstalk connection whose reserve waits holds whole commands, not a partial one:
        // they run when the reserve is answered ([`Server::resume_input`]), which reads again.
        let blocked = c.beanstalk().is_some_and(|b| b.waiting.is_some());
        // A muted connection's input waits for the mute, not for its client.
        let muted = c.muted();
        let partial = !c.rbuf.data().is_empty() && !blocked && !muted;
        let id = (idx, c.gen);
        self.limits
            .note_input(&mut c.guard, id, self.mono, read, used > 0, partial);
        match outcome {
            ReadOutcome::Drained => {}
            ReadOutcome::Budget | ReadOutcome::Full if blocked || muted => {}
            // What it sent before its end runs after the mute, which reads to the end again.
            ReadOutcome::Eof if muted => c.read_closed = true,
            // Only a partial frame is buffered and the budget lets it grow no further.
            ReadOutcome::Full if by_budget && used == 0 => self.input_budget_full(idx),
            ReadOutcome::Budget | ReadOutcome::Full if read => self.conns.read_again_fed.push(idx),
            ReadOutcome::Budget | ReadOutcome::Full => self.conns.read_again.push(idx),
            ReadOutcome::Eof if blocked => {
                // beanstalkd answers a reserve waiting on a half-closed connection at once.
                self.beanstalk_half_closed(idx);
                self.begin_close(idx, "closed by peer", true);
            }
            ReadOutcome::Eof => self.begin_close(idx, "closed by peer", true),
            ReadOutcome::Error(e) if c.stream.is_tls() => {
                // A failed handshake says why here: a certificate the CA did not sign, a
                // client that does not trust this one, no protocol in common.
                warn!(sid = c.sid, peer = %c.peer, error = %e, "TLS connection failed");
                self.begin_close(idx, "TLS error", false);
            }
            ReadOutcome::Error(e) => {
                debug!(sid = c.sid, error = %e, "read failed");
                self.begin_close(idx, "read error", false);
            }
        }
    }

    /// Executes one big frame whose read buffer was handed over: a big put may keep its
    /// payload in it (`frame_payload`). Out of line: rare, and the usual read path stays small.
    #[cold]
    #[inline(never)]
    fn execute_big_frame(&mut self, idx: usize, frame: Bytes) -> usize {
        self.core.set_big_frame(Some(frame.clone()));
        let used = self.execute_iproto_input(idx, &frame);
        self.core.set_big_frame(None);
        debug_assert!(used == frame.len() || self.conns[idx].closing.is_some());
        used
    }

    /// Executes one IPROTO frame of connection `idx`: through its front-end, or, on a
    /// connection a protocol of the loop's own took over, as a replica's acknowledgement (a
    /// relay) or a forwarded call (a link).
    /// `key` is room for a numeric utube key the frame's command may borrow.
    #[inline(always)]
    fn execute_iproto_frame(&mut self, idx: usize, frame: &[u8], key: &mut NumberText) {
        match self.conns[idx].proto {
            Protocol::Iproto { .. } => {
                let then = Iproto::new(self).execute(idx, frame, key);
                self.apply(idx, then);
            }
            Protocol::Link(_) => self.link_request(idx, frame),
            // A relay; beanstalk's and HTTP's ports split no IPROTO frames.
            _ => self.relay_input(idx, frame),
        }
    }

    /// Executes every complete IPROTO frame at the front of `data`; returns the bytes used.
    fn execute_iproto_input(&mut self, idx: usize, data: &[u8]) -> usize {
        let mut used = 0;
        // Made once for all the frames read: the zeroing is not free.
        let mut key = NumberText::default();
        // A put over its user's rate stops the connection's input until its mute ends.
        while self.conns[idx].closing.is_none() && self.conns[idx].throttle == 0 {
            let max = self.frame_cap(&self.conns[idx]);
            match split_frame(&data[used..], max) {
                Ok(Some(f)) => {
                    // Every request counted, one in `TIME_ONE_IN` timed (a clock read is not free).
                    let started = self.ops.service.count_request().then(Instant::now);
                    let frame = &data[used + f.prefix..used + f.total()];
                    self.execute_iproto_frame(idx, frame, &mut key);
                    used += f.total();
                    if let Some(t0) = started {
                        self.ops.service.record(t0.elapsed());
                    }
                    // A tube this node does not know yet: the frame runs again after a read
                    // of the placement, and what follows it waits for that.
                    if (self.router.as_ref()).is_some_and(|r| r.frame_to_hold())
                        && self.with_router(|r, cx| r.hold_frame(cx, idx, frame)) == Some(true)
                    {
                        break;
                    }
                }
                Ok(None) => break,
                Err(e) if self.refuse_pre_auth_frame(idx, &e) => break,
                Err(e) => {
                    // The stream cannot be resynchronised: say why (sync 0), then close.
                    let out = self.conns.out(idx);
                    response::error(out, 0, ER_INVALID_MSGPACK, &e.to_string());
                    self.begin_close(idx, "framing error", true);
                    break;
                }
            }
        }
        used
    }

    /// Connection `idx`'s reply buffer, queued for this turn's flush (for front-ends).
    pub(crate) fn reply_buf(&mut self, idx: usize) -> &mut Vec<u8> {
        self.conns.out(idx)
    }

    /// Writes a reply to connection `idx` that reads the queue (for front-ends: peeks, stats,
    /// lists), queued for this turn's flush.
    pub(crate) fn reply_with_queue(
        &mut self,
        idx: usize,
        write: impl FnOnce(&mut Vec<u8>, &Queue),
    ) {
        let out = self.conns.out(idx);
        write(out, self.core.queue());
    }

    /// beanstalk connections that have put, that have reserved, and that wait in a reserve now.
    pub(crate) fn beanstalk_roles(&self) -> (u64, u64, u64) {
        let mut roles = (0, 0, 0);
        for (_, c) in self.conns.iter() {
            if let Some(bs) = c.beanstalk() {
                roles.0 += bs.producer as u64;
                roles.1 += bs.worker as u64;
                roles.2 += bs.waiting.is_some() as u64;
            }
        }
        roles
    }

    /// This process's random id (the greeting's instance UUID), as a number.
    pub(crate) fn server_id(&self) -> u64 {
        u64::from_le_bytes(self.uuid[..8].try_into().expect("8 bytes"))
    }

    /// Closes connection `idx` at the client's request, after the replies it is owed.
    pub(crate) fn close_quietly(&mut self, idx: usize, reason: &'static str) {
        self.begin_close(idx, reason, true);
    }

    /// Connection `idx` may run the commands waiting in its buffer again: read it next turn.
    pub(crate) fn resume_input(&mut self, idx: usize) {
        if self.conns.get(idx).is_some_and(|c| c.closing.is_none()) {
            self.conns.read_again.push(idx);
        }
    }

    /// Creates tube `name` (`fifottl`, default options) for a front-end that creates tubes on
    /// first use, logging it to the journal like `create_tube`.
    pub(crate) fn create_tube_for(
        &mut self,
        idx: usize,
        name: &str,
    ) -> Result<tarq_engine::TubeIx, crate::core::Refusal> {
        if self.router.is_some() {
            // A sharded cluster's tubes are placed through etcd, each index once: a tube made
            // here alone could take an index the placement gives another.
            return Err(crate::core::Refusal::Shards(format!(
                "tube {name} does not exist: a sharded cluster's tubes are made with \
                 queue.create_tube"
            )));
        }
        let caller = self.caller(idx);
        let (core, mut wire) = self.split();
        core.create_tube_on_demand(caller, name, &mut wire)
    }

    /// Drops the tubes made on demand that hold no task and that nothing uses any more
    /// (beanstalkd forgets such a tube), each journaled as a drop. Looks only at the tubes
    /// let go of since the last call (or at every such tube after a start, and once this node
    /// leads), so a turn with none pays two loads. A replica drops nothing: its primary's
    /// drops reach it as records.
    pub(crate) fn collect_tubes(&mut self) {
        if !self.beanstalk.rescan && self.beanstalk.orphans.is_empty() {
            return;
        }
        if !self.leads() {
            self.beanstalk.orphans.clear();
            self.beanstalk.rescan = true;
            return;
        }
        if std::mem::take(&mut self.beanstalk.rescan) {
            let made: Vec<tarq_engine::TubeIx> = (self.core.queue().tubes())
                .filter(|t| t.opts.on_demand)
                .map(|t| t.ix)
                .collect();
            for t in made {
                if !self.beanstalk.in_use(t) && !self.beanstalk.orphans.contains(&t) {
                    self.beanstalk.orphans.push(t);
                }
            }
        }
        let mut orphans = std::mem::take(&mut self.beanstalk.orphans);
        orphans.retain(|&t| {
            let queue = self.core.queue();
            let made = queue.tube_info(t).is_some_and(|i| i.opts.on_demand);
            if !made || self.beanstalk.in_use(t) {
                return false; // gone (its index perhaps reused), or used again
            }
            if queue.tube_stats(t).is_ok_and(|s| s.total > 0) {
                return true; // looked at again (O(1)) until its last task goes
            }
            let (core, mut wire) = self.split();
            match core.drop_if_unneeded(t, &mut wire) {
                Unneeded::Dropped(last) => {
                    self.beanstalk.forget_tube(t, &last);
                    false
                }
                // A take waits on it, or nothing can change now.
                Unneeded::Later => true,
                Unneeded::Kept => false,
            }
        });
        // Tubes let go of while this ran (none: nothing here lets go) keep their place.
        orphans.append(&mut self.beanstalk.orphans);
        self.beanstalk.orphans = orphans;
    }

    /// Connection `idx` (for front-ends: its authentication, salt, session).
    pub(crate) fn conn_mut(&mut self, idx: usize) -> &mut Conn {
        &mut self.conns[idx]
    }

    /// Reads both clocks for a turn.
    fn read_clocks(&mut self) {
        self.now = self.clock.wall();
        self.mono = self.clock.mono();
    }

    /// `sha1(sha1(password))` of the configured user, if any.
    pub(crate) fn auth_hash(&self) -> Option<[u8; auth::SCRAMBLE_LEN]> {
        self.hash2
    }

    /// Who a new connection of `proto` acts as: anyone on an open server (no `--user`);
    /// `guest` on the IPROTO port until it authenticates; `--beanstalk-user` on the beanstalk
    /// port (anyone without it, as before users existed); HTTP checks each request itself.
    fn who_at_open(cfg: &Config, proto: Proto) -> Who {
        let Some(cred) = &cfg.auth else {
            return Who::Everyone;
        };
        match proto {
            Proto::Iproto => Who::guest(),
            Proto::Beanstalk => match &cfg.beanstalk_user {
                Some(u) if *u != cred.user => Who::User(u.as_str().into()),
                _ => Who::Everyone,
            },
            Proto::Http => Who::Everyone,
        }
    }

    /// Ends a session: its parked takes are dropped, its tasks go back to ready at once (waking
    /// parked takes of others), and the slot is freed in the flush phase — after one last write
    /// of what is released when `flush` is set.
    fn begin_close(&mut self, idx: usize, reason: &'static str, flush: bool) {
        let c = &mut self.conns[idx];
        if c.closing.is_some() {
            return;
        }
        c.closing = Some(Closing {
            reason,
            flush,
            until: self.mono.saturating_add(CLOSE_LINGER),
        });
        let (sid, peer, uuid) = (c.sid, c.peer, c.session_uuid());
        if let Some(key) = c.quota.take() {
            // Its user may open another at once.
            self.quotas.release(key);
        }
        self.core.unpark(idx);
        if let Some(bs) = c.beanstalk() {
            self.beanstalk.release_tubes(bs.used, &bs.watched);
            self.beanstalk.connections -= 1;
        }
        if c.http().is_some() {
            self.http.state.connections -= 1;
        }
        self.drop_input(idx);
        // Its takes waiting across partitions end too.
        self.with_router(|r, cx| r.end_waits_of(cx, idx));
        // A link's sessions are its forwarding node's clients': theirs go back to ready too,
        // after a grace in which that node tells its clients (`shards::holds`).
        if let Some(origin) = self.conns[idx].link_mut().map(|l| Arc::clone(&l.origin)) {
            self.link_conn_closed(idx, &origin);
        }
        let released = match self.iproto.sessions.detach(sid, uuid, self.mono) {
            OnClose::Release(sid) => self.release_session(sid),
            OnClose::Keep => 0,
        };
        self.conns.mark_flush(idx);
        info!(sid, %peer, reason, released, "connection closed");
    }

    /// Releases every task session `sid` holds (its connection closed, or its grace ended)
    /// and serves the takes that wait for them. Returns how many.
    pub(crate) fn release_session(&mut self, sid: SessionId) -> usize {
        if self.cfg.null {
            return 0;
        }
        if let Some(released) = self.with_router(|r, cx| r.release_session(cx, sid)) {
            return released;
        }
        let leads = self.leads();
        let (core, mut wire) = self.split();
        core.release_session(sid, leads, &mut wire)
    }

    /// Registers the connection for writability too (`on`) or for reading only. False when the
    /// poll refused: the caller closes the connection.
    fn set_write_interest(&mut self, idx: usize, on: bool) -> bool {
        let c = &mut self.conns[idx];
        let interest = if on {
            Interest::READABLE | Interest::WRITABLE
        } else {
            Interest::READABLE
        };
        match self
            .poll
            .registry()
            .reregister(&mut c.stream, c.token, interest)
        {
            Ok(()) => {
                c.want_write = on;
                true
            }
            Err(e) => {
                warn!(sid = c.sid, error = %e, "cannot change socket interest");
                false
            }
        }
    }

    fn finish_close(&mut self, idx: usize) {
        let mut c = self.conns.remove(idx);
        self.limits.release(c.peer.ip());
        if let Some(key) = c.quota.take() {
            self.quotas.release(key);
        }
        // Deregistering a socket about to be closed cannot matter if it fails.
        let _ = self.poll.registry().deregister(&mut c.stream);
        if c.relay().is_some() {
            self.register_heartbeats();
        }
    }

    /// Commits the turn, releases the replies that are durable, and writes them: one write per
    /// connection.
    fn commit_and_flush(&mut self) {
        let ticket: Ticket = self.core.commit();
        if self.sync.enabled() && self.leads() {
            let change = self.core.journal().committed_change();
            self.sync.on_commit(ticket, change, self.mono);
        }
        self.relay_turn();
        if self.sync.enabled() {
            let acked = self.relays.acks(&self.conns);
            self.sync.advance(acked, self.mono);
            self.record_committed();
        }
        let mut list = std::mem::take(&mut self.conns.flush);
        self.release_durable(ticket, &mut list);
        // Out of the list before any write: a close below may queue a reply to a connection
        // further down (a task released to its parked take). That reply was appended after
        // this turn's hold, so this pass cannot write it; unflagged, the connection goes into
        // the next turn's list instead of waiting for its client's next request.
        for &idx in &list {
            if let Some(c) = self.conns.get_mut(idx) {
                c.to_flush = false;
            }
        }
        for &idx in &list {
            self.write_out(idx);
        }
        list.clear();
        // Closes above may have queued replies to others: they go out next turn (timeout 0).
        if self.conns.flush.is_empty() {
            self.conns.flush = list;
        }
    }

    /// Holds this turn's replies behind `ticket`, then releases every held reply that is
    /// durable, adding connections held from earlier turns whose replies became durable to
    /// `list`.
    fn release_durable(&mut self, ticket: Ticket, list: &mut Vec<usize>) {
        for &idx in list.iter() {
            if let Some(c) = self.conns.get_mut(idx) {
                c.out.hold(ticket);
            }
        }
        let durable = self.core.journal_mut().durable();
        let journal = self.core.journal();
        let gate = &self.sync;
        let fenced = self.fenced();
        let is_durable = |t: Ticket| t <= durable || journal.is_durable(t);
        // A relay's stream waits for local durability only: the replicas' acknowledgements
        // the gate counts come after it.
        // Only replies that answer a change wait for the replicas: a read or a take in the
        // same turn goes out once the turn is durable here.
        // A cluster node whose leadership ran out acknowledges no change: the lease may be
        // another node's already.
        let verdict = |t: Ticket, changed: bool| match is_durable(t) {
            false => sync::Verdict::Hold,
            true if !changed => sync::Verdict::Release,
            true if fenced => sync::Verdict::TimedOut,
            true => gate.verdict(t),
        };
        let fence_message = fenced.then(|| self.unacknowledged_text());
        let message = fence_message.as_deref().unwrap_or_else(|| gate.message());
        let mut cut_off = Vec::new();
        for &idx in list.iter() {
            if let Some(c) = self.conns.get_mut(idx) {
                release_conn(c, &verdict, message, &mut cut_off, idx);
                if c.out.has_holds() {
                    let gen = c.gen;
                    self.conns.holding.push((idx, gen));
                }
            }
        }
        self.conns.release_holding(list, |idx, c| {
            release_conn(c, &verdict, message, &mut cut_off, idx)
        });
        if self.sync.has_timed_out() {
            self.forget_timed_out();
        }
        for idx in cut_off {
            // A beanstalk reply cannot be turned into an error in place: its client sees the
            // connection end instead, as it would if the primary had died.
            self.begin_close(idx, "synchronous replication timed out", true);
        }
    }

    /// What a change is answered with when this node's leadership ran out before it was
    /// acknowledged.
    fn unacknowledged_text(&self) -> String {
        let why = (self.cluster.as_ref())
            .map(|c| refusal_text(&c.not_leading()))
            .unwrap_or_default();
        format!("outcome unknown: not acknowledged: {why}; the change may or may not survive")
    }

    /// After a timeout of synchronous replication: the gate forgets what no held reply waits
    /// for any more.
    fn forget_timed_out(&mut self) {
        self.sync.forget_before(self.conns.oldest_hold());
    }

    /// Writes connection `idx`'s released replies with one write; closes it on a write error,
    /// an over-limit backlog, or when it was closing and owes nothing more.
    fn write_out(&mut self, idx: usize) {
        let Some(c) = self.conns.get_mut(idx) else {
            return;
        };
        if let Some(closing) = c.closing {
            self.write_closing(idx, closing);
            return;
        }
        if c.muted_until.is_some() {
            // Its replies go when the mute ends (`unmute_due`).
            return;
        }
        match c
            .stream
            .flush_tls()
            .and_then(|()| c.out.write_to(&mut c.stream))
        {
            Ok(_) if c.out.backlog() > self.cfg.max_write_backlog => {
                let (sid, backlog) = (c.sid, c.out.backlog());
                warn!(
                    sid,
                    backlog,
                    limit = self.cfg.max_write_backlog,
                    "client does not read its replies"
                );
                self.begin_close(idx, "write backlog over limit", false);
                self.finish_close(idx);
            }
            Ok(_) => {
                // Ask for writability only while the socket is full: an always-on
                // edge-triggered WRITABLE would wake the loop after every ACK.
                // Nothing is written before a TLS port's client says whether it speaks TLS.
                let blocked =
                    (c.out.has_released() && !c.stream.undecided()) || c.stream.wants_write();
                if blocked != c.want_write && !self.set_write_interest(idx, blocked) {
                    self.begin_close(idx, "poll error", false);
                    self.finish_close(idx);
                }
            }
            Err(e) => {
                debug!(sid = c.sid, error = %e, "write failed");
                self.begin_close(idx, "write error", false);
                self.finish_close(idx);
            }
        }
    }

    /// A closing connection: the replies it is owed go out in as many writes as it takes,
    /// until its deadline; then (or when it owes nothing) its slot is freed.
    fn write_closing(&mut self, idx: usize, closing: Closing) {
        let c = &mut self.conns[idx];
        // With holds it waits in `holding` for its replies to become durable.
        if closing.flush && c.out.has_holds() {
            return;
        }
        let wrote = closing.flush && c.out.write_to(&mut c.stream).is_ok();
        if wrote && !c.out.has_released() {
            // Everything owed is with TLS: close it properly after them.
            c.stream.close_notify();
        }
        let owed =
            wrote && (c.out.has_released() || c.stream.wants_write()) && self.mono < closing.until;
        if owed && (c.want_write || self.set_write_interest(idx, true)) {
            let gen = self.conns[idx].gen;
            if !self
                .conns
                .lingering
                .iter()
                .any(|&(i, g, _)| (i, g) == (idx, gen))
            {
                self.conns.lingering.push((idx, gen, closing.until));
                self.timers.set(Timer::Linger, self.conns.next_linger());
            }
        } else {
            self.finish_close(idx);
        }
    }
}

/// Releases connection `c`'s held replies as `verdict` says. A timed-out turn's IPROTO
/// replies become ER_OUTCOME_UNKNOWN errors with their syncs; a beanstalk connection's
/// are dropped and the connection is put in `cut_off` to be closed.
fn release_conn(
    c: &mut Conn,
    verdict: &dyn Fn(Ticket, bool) -> sync::Verdict,
    message: &str,
    cut_off: &mut Vec<usize>,
    idx: usize,
) {
    let beanstalk = c.beanstalk().is_some();
    let mut failed = false;
    c.out
        .release_with(verdict, &mut |held: &[u8], new: &mut Vec<u8>| {
            failed = true;
            if beanstalk {
                return;
            }
            let mut at = 0;
            while let Ok(Some(f)) = split_frame(&held[at..], usize::MAX) {
                let sync = tarq_iproto::client::decode(&held[at + f.prefix..at + f.total()])
                    .map_or(0, |r| r.sync);
                response::error(new, sync, ER_OUTCOME_UNKNOWN, message);
                at += f.total();
            }
        });
    if failed && beanstalk {
        cut_off.push(idx);
    }
}

/// A new connection's protocol state and read buffer; an IPROTO client's greeting goes into
/// `out`, a beanstalk client is counted (`beanstalk`, with jobs of at most `max_job` bytes).
fn open_protocol(
    proto: Proto,
    beanstalk: &mut crate::frontend::beanstalk::BeanstalkState,
    max_job: u32,
    salt: [u8; greeting::SALT_LEN],
    hello: &[u8],
    out: &mut OutBuf,
) -> (Protocol, ReadBuf) {
    match proto {
        Proto::Http => (Protocol::Http(Box::default()), ReadBuf::new()),
        Proto::Beanstalk => {
            beanstalk.opened();
            let bs = BsConn::new(max_job);
            (Protocol::Beanstalk(Box::new(bs)), ReadBuf::new())
        }
        Proto::Iproto => {
            out.out.extend_from_slice(hello);
            // The greeting depends on no state change: it goes out at once, ahead of any
            // ticket.
            out.hold(0);
            out.release(0);
            let session_uuid = None;
            let framed = ReadBuf::framed(tarq_iproto::announced_total);
            (Protocol::Iproto { salt, session_uuid }, framed)
        }
    }
}

/// Binds the IPROTO listener and, with `--beanstalk-listen`, the beanstalk one, registered
/// with `poll`.
/// A sharded node's router (`--replica-set`), or `None`.
fn router_of(cfg: &Config, cluster: Option<&cluster::ClusterNode>) -> Option<shards::Router> {
    let (c, node) = (cfg.cluster.as_ref()?, cluster?);
    let set = c.election.replica_set.clone()?;
    Some(shards::Router::new(
        set,
        c.election.name.as_str().into(),
        c.election.cluster.as_str().into(),
        node.handle().placement_fence(),
        c.election.placement_validity(),
        shards::RouterLimits {
            link_timeout: cfg.link_timeout,
            max_calls: cfg.max_routed_calls,
            link_buffer: cfg.max_frame_bytes.saturating_mul(4),
        },
    ))
}

/// What holds a change's answer until replicas have it (`--sync-replicas`), and until etcd
/// records it on a cluster node.
fn sync_gate(cfg: &Config) -> sync::SyncGate {
    let mut gate = sync::SyncGate::new(cfg.sync_replicas, cfg.sync_timeout);
    if cfg.cluster.is_some() {
        gate.require_record();
    }
    gate
}

fn bind_listeners(cfg: &Config, poll: &Poll) -> io::Result<(TcpListener, Option<TcpListener>)> {
    let mut listener = TcpListener::bind(cfg.listen)
        .map_err(|e| io::Error::new(e.kind(), format!("cannot listen on {}: {e}", cfg.listen)))?;
    poll.registry()
        .register(&mut listener, LISTENER, Interest::READABLE)?;
    let Some(addr) = cfg.beanstalk_listen else {
        return Ok((listener, None));
    };
    let mut beanstalk = TcpListener::bind(addr).map_err(|e| {
        let why = format!("cannot listen on {addr} (--beanstalk-listen): {e}");
        io::Error::new(e.kind(), why)
    })?;
    poll.registry()
        .register(&mut beanstalk, BEANSTALK_LISTENER, Interest::READABLE)?;
    Ok((listener, Some(beanstalk)))
}

/// The queue the journal recovered (empty without one), its task limit set. A primary names
/// its log's history when the log has none (a new data directory, or one written before
/// format 3), so replicas of another log are told apart.
fn recover(journal: &mut Journal, cfg: &Config) -> io::Result<Queue> {
    let mut queue = journal.recovered_queue();
    if cfg.replica_of.is_none() && cfg.cluster.is_none() {
        if let Some(wal) = journal.wal() {
            wal.adopt_history(u64::from_le_bytes(random_bytes()?) | 1);
        }
    }
    queue.set_max_tasks(cfg.max_tasks);
    Ok(queue)
}

/// Pins the calling thread to a CPU core.
fn pin_to(cpu: usize) -> io::Result<()> {
    tarq_affinity::pin(cpu).map_err(|e| io::Error::new(e.kind(), format!("--cpu {cpu}: {e}")))?;
    info!(cpu, "event loop pinned");
    Ok(())
}

#[cfg(test)]
mod front_returns;
#[cfg(test)]
mod tests {
    use super::*;
    use crate::frontend::iproto::calls;
    use std::net::TcpStream as StdStream;
    use tarq_engine::PutOptions;
    use tarq_iproto::client;

    /// Every wait here ends by then.
    const WAIT: Duration = Duration::from_secs(10);

    pub(super) fn server() -> (Server, tempfile::TempDir) {
        let dir = tempfile::tempdir().unwrap();
        let cfg = Config {
            listen: "127.0.0.1:0".parse().unwrap(),
            data_dir: dir.path().join("data"),
            ..Config::default()
        };
        (Server::bind(cfg).unwrap(), dir)
    }

    /// Connects a client and has the server accept it; returns its slot and the client side.
    pub(super) fn connect(s: &mut Server) -> (usize, StdStream) {
        let client = StdStream::connect(s.local_addr().unwrap()).unwrap();
        let known: Vec<usize> = s.conns.iter().map(|(i, _)| i).collect();
        let deadline = Instant::now() + WAIT;
        loop {
            s.accept_all(Proto::Iproto);
            if let Some((i, _)) = s.conns.iter().find(|(i, _)| !known.contains(i)) {
                return (i, client);
            }
            assert!(
                Instant::now() < deadline,
                "the connection was never accepted"
            );
            std::thread::yield_now();
        }
    }

    /// Runs loop turns (no poll: nothing here waits for readiness) until `client` has received
    /// `n` replies after the greeting; returns their syncs.
    fn replies(s: &mut Server, client: &mut StdStream, n: usize) -> Vec<u64> {
        client.set_nonblocking(true).unwrap();
        let deadline = Instant::now() + WAIT;
        let mut buf = Vec::new();
        let mut chunk = [0u8; 4096];
        let mut syncs = Vec::new();
        let mut greeted = false;
        while syncs.len() < n {
            assert!(
                Instant::now() < deadline,
                "only replies {syncs:?} arrived, {n} expected"
            );
            s.read_clocks();
            s.turn();
            match client.read(&mut chunk) {
                Ok(0) => panic!("closed after replies {syncs:?}"),
                Ok(k) => buf.extend_from_slice(&chunk[..k]),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => std::thread::yield_now(),
                Err(e) => panic!("read failed: {e}"),
            }
            if !greeted && buf.len() >= greeting::GREETING_LEN {
                buf.drain(..greeting::GREETING_LEN);
                greeted = true;
            }
            while let (true, Ok(Some(f))) = (greeted, split_frame(&buf, usize::MAX)) {
                syncs.push(client::decode(&buf[f.prefix..f.total()]).unwrap().sync);
                buf.drain(..f.total());
            }
        }
        syncs
    }

    /// Connection `idx` calls `function` with `args` (answered on `sync`), as its frame would.
    fn call(s: &mut Server, idx: usize, sync: u64, function: &str, args: &[u8]) {
        let mut key = NumberText::default();
        let then = Iproto::new(s).call(idx, sync, function, args, false, &mut key);
        s.apply(idx, then);
    }

    /// Regression: a connection closed while the turn's replies were being written (over its
    /// write backlog) handed its task to the parked take of a connection further down the same
    /// flush list. That reply was appended after the turn's hold and the connection stayed
    /// flagged as queued, so the reply sat unsent until the client happened to send again.
    #[test]
    fn a_reply_queued_by_a_close_during_the_flush_is_written() {
        let (mut s, _dir) = server();
        let (hog, _hog_client) = connect(&mut s); // never reads
        let (waiter, mut waiter_client) = connect(&mut s);
        s.read_clocks();
        s.commit_and_flush(); // the greetings
        let now = s.now;
        (s.core.queue_mut()).put(now, Box::new([0xa1, b'x']), PutOptions::default());
        // The hog takes the task; the waiter's take(10) parks.
        call(&mut s, hog, 1, calls::TAKE, &[0x90]);
        call(&mut s, waiter, 7, calls::TAKE, &[0x91, 0x0a]);
        assert_eq!(s.core.parked_takes().0, 1);
        // The hog is flushed first, with far more than its socket takes: over its backlog
        // limit once that write returns. The waiter is flushed after it (a ping reply).
        s.cfg.max_write_backlog = 1 << 20;
        let junk = vec![0u8; 32 << 20];
        s.conns.out(hog).extend_from_slice(&junk);
        let ping = [0x82, 0x00, 0x40, 0x01, 0x08];
        s.execute_iproto_frame(waiter, &ping, &mut NumberText::default());
        assert_eq!(s.conns.flush, [hog, waiter]);
        s.commit_and_flush();
        assert!(s.conns.get(hog).is_none(), "the hog was cut off");
        let mut got = replies(&mut s, &mut waiter_client, 2);
        got.sort_unstable();
        assert_eq!(got, [7, 8], "the ping's reply and the woken take's");
    }

    /// Regression: a primary demoted while a replica streamed live from it left its WAL's tap
    /// on, so as a replica it kept a copy of every record it applied, for no relay, without
    /// bound.
    #[test]
    fn relays_closed_at_a_demotion_leave_the_wal_no_tap() {
        let dir = tempfile::tempdir().unwrap();
        let data_dir = dir.path().join("data");
        let wal_cfg = tarq_wal::WalConfig {
            mode: tarq_wal::WalMode::Write,
            ..tarq_wal::WalConfig::default()
        };
        let (wal, queue, _) = tarq_wal::Wal::open_dir(&data_dir, wal_cfg.clone()).unwrap();
        let cfg = Config {
            listen: "127.0.0.1:0".parse().unwrap(),
            data_dir,
            wal: wal_cfg,
            ..Config::default()
        };
        let mut s = Server::with_journal(cfg, Journal::wal_with(wal, queue)).unwrap();
        let (idx, _replica) = connect(&mut s);
        s.read_clocks();
        let wal = s.core.journal_mut().wal().unwrap();
        let at = (wal.written_seq(), wal.last_term(), wal.history());
        let format = Some(tarq_wal::format::FORMAT_VERSION);
        s.start_relay(idx, 1, format, Some(at));
        s.commit_and_flush(); // the relay is live: the tap is on for it
        assert!(s.core.journal_mut().wal().unwrap().tapping());
        s.close_relays("this node is a replica now");
        s.commit_and_flush(); // the next turn, as a replica's
        assert!(
            !s.core.journal_mut().wal().unwrap().tapping(),
            "no relay is left to read the tap"
        );
    }

    #[test]
    fn a_closing_client_that_does_not_read_is_freed_at_its_deadline() {
        let (mut s, _dir) = server();
        let (hog, _hog_client) = connect(&mut s); // never reads
        s.read_clocks();
        let junk = vec![0u8; 32 << 20];
        s.conns.out(hog).extend_from_slice(&junk);
        s.begin_close(hog, "closed by peer", true);
        s.commit_and_flush();
        assert!(s.conns.get(hog).is_some(), "still owed replies: lingering");
        assert_eq!(s.conns.lingering.len(), 1);
        // The linger is an in-process timeout: on the monotonic clock.
        s.mono = s.conns[hog].closing.unwrap().until - 1;
        s.turn();
        assert!(s.conns.get(hog).is_some(), "not before its deadline");
        s.mono += 1;
        s.turn();
        assert!(s.conns.get(hog).is_none(), "freed at its deadline");
        assert!(s.conns.lingering.is_empty());
    }
}
