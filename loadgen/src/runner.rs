//! The load loop: one thread, one mio `Poll`, every producer and consumer connection on it.
//! Each connection keeps up to `depth` requests in flight (pipelining), so a single core drives
//! hundreds of thousands of operations a second and the loadgen is not what is measured.
//!
//! One message is a put by a producer, then a take and an ack by a consumer. A consumer
//! connection runs `depth` independent slots, each looping take → ack → take. Producers run
//! either closed loop — as fast as replies come back, with at most `window` messages put but not
//! yet acked (unbounded when the window is `usize::MAX`: producers never wait for consumers) —
//! or open loop at `--rate` messages a second, where every message has an intended send time
//! fixed in advance and every latency counts from it, so a stall delays the schedule's
//! measurements instead of hiding them (no coordinated omission).
//!
//! A run is a sequence of phases on the same connections: an optional fill (producers only, a
//! fixed number of puts as fast as the target answers), the steady phase (both sides, warm-up
//! then the measured duration), and an optional drain (consumers only, until every message the
//! run put is acked). A fill before the steady phase leaves the producers that many messages
//! ahead of the consumers: a backlog. Each phase reports its own figures.
//!
//! Latencies: `put` = put sent (intended, in open loop) → reply; `e2e` = put sent (intended) →
//! ack answered, read from the stamp in the payload; `cycle` = take → ack answered, counted from
//! the later of the take's send and the message's put, so a take parked on an empty queue does
//! not count its idle wait (then cycle ≈ e2e), while with a backlog it is the consumer's take +
//! ack round trips and e2e adds the time spent queued. The stall is the longest a connection
//! waited for a reply with a request outstanding (waiting takes excepted): a growth stall in
//! the target shows there even when it is too rare to move a percentile.

use crate::payload::{self, PayloadWriter};
use crate::proto::{Driver, Kind, Reply, Request, Role};
use crate::stats::{Latency, Series, Stall};
use crate::tls::{self, Stream};
use anyhow::{anyhow, bail, Context, Result};
use indicatif::{ProgressBar, ProgressStyle};
use mio::net::TcpStream;
use mio::unix::SourceFd;
use mio::{Events, Interest, Poll, Token};
use rustix::time::{
    timerfd_create, timerfd_settime, Itimerspec, TimerfdClockId, TimerfdFlags, TimerfdTimerFlags,
    Timespec,
};
use serde::{Deserialize, Serialize};
use std::collections::VecDeque;
use std::io::{self, Read, Write};
use std::net::{SocketAddr, ToSocketAddrs};
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Initial read buffer per connection: holds a full pipeline of replies of ordinary size, so the
/// common case is one read per readiness.
const READ_BUF_BYTES: usize = 64 * 1024;
/// The read buffer may grow to hold one large reply, but never past this: a reply this large
/// means the stream is out of sync (payloads are at most `MAX_PAYLOAD_BYTES`).
const MAX_READ_BUF_BYTES: usize = 64 << 20;
/// Largest `--payload`: well under every target's frame limit (tarq's is 16 MiB).
pub const MAX_PAYLOAD_BYTES: usize = 1 << 20;
/// Time allowed to connect and finish a handshake.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// Progress bar refresh and closed-loop poll timeout: often enough to look live, rarely enough
/// to cost nothing.
const TICK: Duration = Duration::from_millis(100);
/// In open loop the thread sleeps until the next send on a timerfd (epoll's own timeout has
/// millisecond granularity: puts would go out late and the delay would count as the target's
/// latency), but wakes at most once per this quantum and sends everything due as one batch:
/// at high rates a wake-up and a write per message would make the loadgen the bottleneck. A
/// put can thus leave up to this much after its intended time, which its latency includes.
/// Without `--spin` it never spins: on a shared core a thread that never sleeps loses the
/// scheduler's favour and then runs late by whole time slices.
const SEND_QUANTUM: Duration = Duration::from_micros(50);
/// A loop that never slept, run under a real-time policy (as it must be on a shared machine),
/// would starve the ordinary tasks of its core: Linux's fair server (a deadline server, 50 ms
/// a second by default) then takes the core for up to 50 ms at once to run them, once a
/// second, which puts a put→ack p99 near 50 ms against a null target. So a spinning loop rests
/// `SPIN_REST` after every `SPIN_SLICE`, 7% of the core in slices short enough to stay far
/// below the latencies measured, which is more than the fair server reserves, so it need not
/// step in (it still may, rarely).
const SPIN_SLICE: Duration = Duration::from_millis(2);
const SPIN_REST: Duration = Duration::from_micros(150);
/// The poll token of the open-loop timer; connections use their index.
const TIMER_TOKEN: Token = Token(usize::MAX);
/// A run stops early when errors pass this count and outnumber successes: the target is
/// refusing the workload and the figures would mean nothing.
const MAX_ERRORS: u64 = 10_000;
/// Events taken per `poll` call: one per connection at most matters, the rest wait a turn.
const EVENTS_CAPACITY: usize = 1024;
/// A drain gives up on the messages still out after this long without an ack: far longer than
/// any take timeout or stall a target shows, so a drain that ends this way has lost messages.
const DRAIN_IDLE_TIMEOUT: Duration = Duration::from_secs(10);
/// Seconds of per-second series a fill or drain keeps at most: a day, past any run's length.
const MAX_SERIES_SECONDS: usize = 86_400;
/// With `RunConfig::failover`: how long a connection may go without a reply that worked while
/// it is being moved to a new leader, before the run stops. An election takes seconds.
pub const FAILOVER_WAIT: Duration = Duration::from_secs(15);
/// First pause before a connection reconnects again after a reconnect that brought no working
/// reply (a replica still naming a primary that is gone); it doubles up to `MAX_BACKOFF`.
const FIRST_BACKOFF: Duration = Duration::from_millis(50);
const MAX_BACKOFF: Duration = Duration::from_millis(500);

/// Everything one run needs to know.
#[derive(Clone, Debug)]
pub struct RunConfig {
    pub addr: SocketAddr,
    pub producers: usize,
    pub consumers: usize,
    pub depth: usize,
    pub payload: usize,
    pub duration: Duration,
    pub warmup: Duration,
    /// Open loop at this many messages a second; closed loop when `None`.
    pub rate: Option<f64>,
    /// Closed loop: at most this many messages put and not yet acked; `usize::MAX` for none.
    pub window: usize,
    /// Put this many messages first, producers only (the fill phase).
    pub fill: Option<u64>,
    /// Producers and consumers together for warm-up + duration (the steady phase).
    pub steady: bool,
    /// End with consumers only until every message this run put is acked (the drain phase).
    pub drain: bool,
    /// Null target: the server answers every call with an empty result, so the loadgen keeps
    /// the queue itself (a put's reply makes a message available to a take).
    pub null_mode: bool,
    /// Busy-poll instead of sleeping in `poll`: no wake-up delay on the loadgen's side, so
    /// send times and latencies are exact, at the price of a whole core (use it pinned to a
    /// core of its own on a quiet machine; its CPU share then reads 100%).
    pub spin: bool,
    /// Draw a progress bar on stderr (hidden anyway when stderr is not a terminal).
    pub progress: bool,
    /// Shown next to the progress bar.
    pub label: String,
    /// The target's process, when the loadgen started it, for CPU accounting.
    pub target_pid: Option<u32>,
    /// Every address of a tarq cluster; empty for a single target. With addresses, a
    /// connection that is lost, or whose request is refused as read-only naming the primary,
    /// is replaced (by one to that primary, or to these in turn) instead of ending the run:
    /// its requests in flight count as errors — a put whose reply was lost may or may not be
    /// in the queue, and is never sent again.
    pub failover: Vec<String>,
    /// TLS on every connection, trusting this configuration's CA (`--tls-ca`).
    pub tls: Option<Arc<rustls::ClientConfig>>,
}

impl RunConfig {
    /// The closed-loop window when none is given: every producer and consumer slot busy, with
    /// as much again queued so consumers never wait on a producer's round trip.
    pub fn default_window(producers: usize, consumers: usize, depth: usize) -> usize {
        (producers + consumers) * depth
    }

    /// The phases this run goes through, in order.
    pub fn phases(&self) -> Vec<Phase> {
        let mut phases = Vec::new();
        if self.fill.is_some() {
            phases.push(Phase::Fill);
        }
        if self.steady {
            phases.push(Phase::Steady);
        }
        if self.drain {
            phases.push(Phase::Drain);
        }
        phases
    }
}

/// One stage of a run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Phase {
    /// Producers only: put `RunConfig::fill` messages as fast as the target answers.
    Fill,
    /// Producers and consumers together: warm-up, then the measured duration.
    Steady,
    /// Consumers only, until every message the run put is acked.
    Drain,
}

/// What one phase measured, over its measured window (the steady phase's warm-up excluded).
#[derive(Clone, Debug)]
pub struct PhaseOutcome {
    pub phase: Phase,
    pub put: Latency,
    pub cycle: Latency,
    pub e2e: Latency,
    /// Open loop: how late each put left after its intended time (the loadgen's own delay,
    /// already included in the put and e2e latencies).
    pub send_lag: Latency,
    pub puts: u64,
    pub acks: u64,
    pub errors: u64,
    /// Takes that came back with nothing (timed out) — waiting, not failing.
    pub empty_takes: u64,
    /// Messages taken that another run had put (a target not started fresh); acked, not counted.
    pub foreign: u64,
    pub first_error: Option<String>,
    pub measured: Duration,
    pub series: Series,
    /// The longest wait for a reply on one connection.
    pub stall: Stall,
    /// CPU time the loadgen used over the window, in cores (1.0 = one core busy all the time).
    pub loadgen_cpu: f64,
    /// The same for the target process, when known.
    pub target_cpu: Option<f64>,
    /// CPU the whole machine used over the window, in cores (all processes, from /proc/stat):
    /// what is left after the loadgen and the target is other work disturbing the run.
    pub machine_cpu: Option<f64>,
    /// Messages this run put (or was putting) and had not seen acked when the phase ended.
    pub unacked: u64,
}

impl PhaseOutcome {
    fn new(phase: Phase, series_seconds: usize) -> PhaseOutcome {
        PhaseOutcome {
            phase,
            put: Latency::new(),
            cycle: Latency::new(),
            e2e: Latency::new(),
            send_lag: Latency::new(),
            puts: 0,
            acks: 0,
            errors: 0,
            empty_takes: 0,
            foreign: 0,
            first_error: None,
            measured: Duration::ZERO,
            series: Series::new(series_seconds),
            stall: Stall::default(),
            loadgen_cpu: 0.0,
            target_cpu: None,
            machine_cpu: None,
            unacked: 0,
        }
    }

    /// Phases one after the other as one window: counts and histograms add, series follow
    /// each other in time, CPU shares are weighted by each phase's length. Takes the first
    /// phase's name.
    fn merge(parts: &[&PhaseOutcome]) -> PhaseOutcome {
        let Some((first, rest)) = parts.split_first() else {
            return PhaseOutcome::new(Phase::Steady, 0);
        };
        let mut m = (*first).clone();
        for p in rest {
            let (a, b) = (m.measured.as_secs_f64(), p.measured.as_secs_f64());
            let weigh = |x: f64, y: f64| (x * a + y * b) / (a + b).max(1e-9);
            m.loadgen_cpu = weigh(m.loadgen_cpu, p.loadgen_cpu);
            m.target_cpu = m.target_cpu.zip(p.target_cpu).map(|(x, y)| weigh(x, y));
            m.machine_cpu = m.machine_cpu.zip(p.machine_cpu).map(|(x, y)| weigh(x, y));
            m.put.add(&p.put);
            m.cycle.add(&p.cycle);
            m.e2e.add(&p.e2e);
            m.send_lag.add(&p.send_lag);
            m.puts += p.puts;
            m.acks += p.acks;
            m.errors += p.errors;
            m.empty_takes += p.empty_takes;
            m.foreign += p.foreign;
            m.first_error = m.first_error.or_else(|| p.first_error.clone());
            m.measured += p.measured;
            m.series.append(&p.series);
            m.stall = m.stall.max(p.stall.clone());
            m.unacked = p.unacked;
        }
        m
    }

    pub fn secs(&self) -> f64 {
        self.measured.as_secs_f64().max(1e-9)
    }
    pub fn msgs_per_s(&self) -> f64 {
        self.acks as f64 / self.secs()
    }
    pub fn puts_per_s(&self) -> f64 {
        self.puts as f64 / self.secs()
    }
    pub fn acks_per_s(&self) -> f64 {
        self.acks as f64 / self.secs()
    }
}

/// What a run measured.
#[derive(Debug)]
pub struct Outcome {
    /// The headline figures: the steady phase when the run has one, else every phase taken
    /// together (a fill, or a fill and its drain).
    pub main: PhaseOutcome,
    /// Each phase on its own, in the order they ran.
    pub phases: Vec<PhaseOutcome>,
    /// Over the whole run, warm-up included: puts the target accepted, and acks of messages
    /// this run put. Equal after a complete drain: nothing acknowledged was lost.
    pub total_puts: u64,
    pub total_acks: u64,
    /// Messages this run put (or was putting) and never saw acked.
    pub unacked: u64,
}

impl Outcome {
    fn new(phases: Vec<PhaseOutcome>, sh: &Shared) -> Outcome {
        let steady: Vec<&PhaseOutcome> =
            phases.iter().filter(|p| p.phase == Phase::Steady).collect();
        let main = if steady.is_empty() {
            PhaseOutcome::merge(&phases.iter().collect::<Vec<_>>())
        } else {
            PhaseOutcome::merge(&steady)
        };
        Outcome {
            main,
            phases,
            total_puts: sh.puts_ok_all,
            total_acks: sh.acks_ours_all,
            unacked: sh.in_system as u64,
        }
    }
}

/// A request awaiting its reply.
#[derive(Clone, Copy, Debug)]
struct Pending {
    sync: u64,
    kind: Kind,
    /// Put: the (intended) send time. Take: when it was sent. Ack: where the cycle latency
    /// starts (the later of the take's send and the message's put).
    start_ns: u64,
    /// Ack: the message's put time from its stamp.
    origin_ns: u64,
    /// When it was actually written to the connection's buffer.
    sent_ns: u64,
    /// Ack: the message was put by this run (counted in the window and the figures).
    ours: bool,
    /// Take: it may wait for a message (always, unless the driver's takes block).
    wait: bool,
}

impl Pending {
    fn new(kind: Kind, now: u64) -> Pending {
        Pending {
            sync: 0,
            kind,
            start_ns: now,
            origin_ns: 0,
            sent_ns: now,
            ours: false,
            wait: false,
        }
    }
}

/// The writing half of a connection, apart from its read buffer so a reply borrowed from that
/// buffer can be answered (an ack needs the taken message's bytes for Redis).
struct Tx<D> {
    idx: usize,
    role: Role,
    driver: D,
    wbuf: Vec<u8>,
    wpos: usize,
    dirty: bool,
    pending: VecDeque<Pending>,
    /// Open loop: puts that fell due while the pipeline was full, by intended time.
    backlog: VecDeque<u64>,
    /// Consumer slots with nothing in flight: in null mode waiting for a message to exist;
    /// with blocking takes, waiting for the connection's one blocking take to return.
    /// Invariant: once consumers start, a consumer's `pending.len() + parked == depth`.
    parked: usize,
    /// The driver's waiting take blocks the connection (`Driver::blocking_takes`).
    blocking: bool,
    /// A blocking take is in flight (then it is the last request in the pipeline).
    waiting: bool,
}

impl<D: Driver> Tx<D> {
    fn send(&mut self, req: Request<'_>, mut p: Pending, dirty: &mut Vec<usize>) {
        p.sync = self.driver.encode(&mut self.wbuf, req);
        self.pending.push_back(p);
        if !self.dirty {
            self.dirty = true;
            dirty.push(self.idx);
        }
    }

    fn send_take(&mut self, wait: bool, now: u64, dirty: &mut Vec<usize>) {
        let p = Pending {
            wait,
            ..Pending::new(Kind::Take, now)
        };
        self.send(Request::Take { wait }, p, dirty);
        if self.blocking && wait {
            self.waiting = true;
        }
    }

    /// An ack for a message taken; its cycle latency starts at `start_ns`.
    fn send_ack(
        &mut self,
        req: Request<'_>,
        (start_ns, origin_ns, ours): (u64, u64, bool),
        now: u64,
        dirty: &mut Vec<usize>,
    ) {
        let p = Pending {
            start_ns,
            origin_ns,
            ours,
            ..Pending::new(Kind::Ack, now)
        };
        self.send(req, p, dirty);
    }

    /// A consumer slot needs a take. Where a waiting take blocks the connection, only the
    /// tail of an otherwise empty pipeline may wait; other slots take without waiting, or park
    /// while the blocking take is out (anything sent behind it would be stuck anyway).
    fn want_take(&mut self, now: u64, dirty: &mut Vec<usize>) {
        if !self.blocking {
            self.send_take(true, now, dirty);
        } else if self.waiting {
            self.parked += 1;
        } else {
            let wait = self.pending.is_empty();
            self.send_take(wait, now, dirty);
        }
    }

    /// With blocking takes, a parked slot waits once the pipeline has drained.
    fn settle(&mut self, now: u64, dirty: &mut Vec<usize>) {
        if self.blocking && !self.waiting && self.pending.is_empty() && self.parked > 0 {
            self.parked -= 1;
            self.send_take(true, now, dirty);
        }
    }

    /// The request a frame answers: the oldest one for ordered protocols, else by sync.
    fn complete(&mut self, sync: Option<u64>) -> Result<Pending> {
        let found = match sync {
            Some(s) if !self.driver.ordered() => self
                .pending
                .iter()
                .position(|p| p.sync == s)
                .and_then(|i| self.pending.remove(i)),
            _ => self.pending.pop_front(),
        };
        found.ok_or_else(|| {
            anyhow!(
                "reply with sync {sync:?} matches no request in flight on {:?} connection {}",
                self.role,
                self.idx
            )
        })
    }
}

/// Why a connection must be replaced.
#[derive(Clone, Debug)]
enum Trouble {
    Lost(String),
    /// A refusal named the primary.
    Redirect(String),
}

impl std::fmt::Display for Trouble {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Trouble::Lost(why) => f.write_str(why),
            Trouble::Redirect(p) => write!(f, "refused as read-only: the primary is {p}"),
        }
    }
}

struct Conn<D> {
    stream: Stream,
    /// The address it is connected to.
    addr: String,
    /// Set when it must be replaced (failover only); the loop does it between polls.
    trouble: Option<Trouble>,
    /// Since when it has been replaced without a reply that worked since.
    troubled_since: Option<Instant>,
    backoff: Duration,
    rbuf: Vec<u8>,
    rlen: usize,
    /// When the last reply arrived, for the stall figure.
    last_reply_ns: u64,
    tx: Tx<D>,
}

/// Run-wide state shared by every connection's reply handling.
struct Shared {
    clock: Instant,
    phase: Phase,
    measure_start_ns: u64,
    /// End of the measured window; `u64::MAX` while a fill or drain runs (they end on counts).
    end_ns: u64,
    depth: usize,
    window: usize,
    /// Puts follow the open-loop schedule (the steady phase with a rate).
    open_loop: bool,
    /// Lost or redirected connections are replaced (`RunConfig::failover`).
    failover: bool,
    null_mode: bool,
    run: u64,
    payload: PayloadWriter,
    seq: u64,
    /// Messages this run put (or is putting) and has not seen acked.
    in_system: usize,
    /// Null mode: origins of messages "in the queue", which the loadgen keeps itself.
    virtual_ready: VecDeque<u64>,
    dirty: Vec<usize>,
    /// The current phase's figures.
    fig: PhaseOutcome,
    /// Fill: puts still to send, and replies still to come.
    fill_unsent: u64,
    fill_unanswered: u64,
    /// Drain: when the last of our messages was acked (or the drain began).
    last_ack_ns: u64,
    acks_all: u64,
    errors_all: u64,
    puts_ok_all: u64,
    acks_ours_all: u64,
    first_error_all: Option<String>,
}

impl Shared {
    fn now(&self) -> u64 {
        self.clock.elapsed().as_nanos() as u64
    }

    fn measuring(&self, now: u64) -> bool {
        now >= self.measure_start_ns && now < self.end_ns
    }

    fn since_start(&self, now: u64) -> u64 {
        now - self.measure_start_ns
    }

    fn error(&mut self, now: u64, kind: Kind, msg: String) {
        self.errors_all += 1;
        if self.measuring(now) {
            self.fig.errors += 1;
        }
        let text = format!("{kind:?}: {msg}");
        self.fig.first_error.get_or_insert_with(|| text.clone());
        self.first_error_all.get_or_insert(text);
    }

    /// Whether a producer may put one more message now (open loop aside).
    fn may_put(&self) -> bool {
        match self.phase {
            Phase::Fill => self.fill_unsent > 0,
            Phase::Steady => self.in_system < self.window,
            Phase::Drain => false,
        }
    }

    fn send_put<D: Driver>(&mut self, tx: &mut Tx<D>, origin_ns: u64, now: u64) {
        if self.open_loop && self.measuring(now) {
            self.fig.send_lag.record_ns(now.saturating_sub(origin_ns));
        }
        if self.phase == Phase::Fill {
            self.fill_unsent -= 1;
        }
        let seq = self.seq;
        self.seq += 1;
        let data = self.payload.write(seq, origin_ns);
        let p = Pending {
            start_ns: origin_ns,
            origin_ns,
            ours: true,
            ..Pending::new(Kind::Put, now)
        };
        tx.send(Request::Put(data), p, &mut self.dirty);
        self.in_system += 1;
    }

    /// A put was answered (accepted or refused): the fill counts it, and in open loop the
    /// producer's next overdue put takes its place in the pipeline.
    fn put_answered<D: Driver>(&mut self, tx: &mut Tx<D>, now: u64) {
        if self.phase == Phase::Fill {
            self.fill_unanswered = self.fill_unanswered.saturating_sub(1);
        }
        if self.open_loop {
            if let Some(due) = tx.backlog.pop_front() {
                self.send_put(tx, due, now);
            }
        }
    }

    /// A connection waited from the later of its previous reply and this request's send until
    /// now; waiting takes wait by design and are left out.
    fn observe_gap(&mut self, p: &Pending, last_reply_ns: u64, conn: usize, now: u64) {
        if p.wait || !self.measuring(now) {
            return;
        }
        let gap = now.saturating_sub(p.sent_ns.max(last_reply_ns));
        let since = self.since_start(now);
        let request = match p.kind {
            Kind::Put => "put",
            Kind::Take => "take",
            Kind::Ack => "ack",
        };
        self.fig.stall.observe(gap, since, conn, request);
        self.fig.series.gap(since, gap);
    }
}

/// CPU counters at the start of a measured window.
struct CpuMark {
    loadgen: f64,
    target: Option<f64>,
    machine: Option<f64>,
}

impl CpuMark {
    fn take(target_pid: Option<u32>) -> CpuMark {
        CpuMark {
            loadgen: cpu_seconds("self").unwrap_or(0.0),
            target: target_pid.and_then(|pid| cpu_seconds(&pid.to_string())),
            machine: machine_cpu_seconds(),
        }
    }

    /// Cores' worth of CPU used since the mark over `secs` seconds: the loadgen, the target,
    /// the whole machine.
    fn since(&self, target_pid: Option<u32>, secs: f64) -> (f64, Option<f64>, Option<f64>) {
        let secs = secs.max(1e-9);
        let loadgen = (cpu_seconds("self").unwrap_or(0.0) - self.loadgen) / secs;
        let target = match (target_pid, self.target) {
            (Some(pid), Some(t0)) => cpu_seconds(&pid.to_string()).map(|t| (t - t0) / secs),
            _ => None,
        };
        let machine = self
            .machine
            .zip(machine_cpu_seconds())
            .map(|(a, b)| (b - a) / secs);
        (loadgen, target, machine)
    }
}

/// Run the load against `cfg.addr` with one driver per connection made by `make`.
pub fn run<D: Driver>(cfg: &RunConfig, make: impl Fn(u64) -> D) -> Result<Outcome> {
    validate(cfg)?;
    let run_id = run_nonce();
    let poll = Poll::new().context("creating the poll")?;
    let conns = (0..cfg.producers + cfg.consumers)
        .map(|idx| connect(cfg, idx, make(run_id), &poll))
        .collect::<Result<Vec<_>>>()?;
    let mut run = Run::new(cfg, poll, conns, run_id)?;
    let mut phases = Vec::new();
    for phase in cfg.phases() {
        phases.push(run.phase(phase)?);
    }
    Ok(Outcome::new(phases, &run.sh))
}

fn validate(cfg: &RunConfig) -> Result<()> {
    if cfg.producers == 0 || cfg.consumers == 0 || cfg.depth == 0 {
        bail!("producers, consumers and depth must each be at least 1");
    }
    if cfg.payload > MAX_PAYLOAD_BYTES {
        bail!(
            "--payload {} exceeds the limit of {MAX_PAYLOAD_BYTES} bytes",
            cfg.payload
        );
    }
    if cfg.phases().is_empty() {
        bail!("a run needs at least one phase: a fill, the steady phase or a drain");
    }
    Ok(())
}

/// Open connection `idx` (producers first, then consumers), shake hands, register it.
fn connect<D: Driver>(cfg: &RunConfig, idx: usize, mut driver: D, poll: &Poll) -> Result<Conn<D>> {
    let role = if idx < cfg.producers {
        Role::Producer
    } else {
        Role::Consumer
    };
    let blocking = driver.blocking_takes();
    let addr = cfg.addr.to_string();
    let mut stream = open_stream(&addr, cfg.tls.as_ref(), &mut driver, role, idx)?;
    poll.registry()
        .register(
            &mut stream,
            Token(idx),
            Interest::READABLE | Interest::WRITABLE,
        )
        .context("registering a connection")?;
    Ok(Conn {
        stream,
        addr,
        trouble: None,
        troubled_since: None,
        backoff: FIRST_BACKOFF,
        rbuf: vec![0; READ_BUF_BYTES],
        rlen: 0,
        last_reply_ns: 0,
        tx: Tx {
            idx,
            role,
            driver,
            wbuf: Vec::with_capacity(READ_BUF_BYTES),
            wpos: 0,
            dirty: false,
            pending: VecDeque::with_capacity(cfg.depth),
            backlog: VecDeque::new(),
            parked: 0,
            blocking,
            waiting: false,
        },
    })
}

/// Connects to `addr` and shakes hands (blocking, bounded by `CONNECT_TIMEOUT`; TLS first with
/// `tls`), then leaves the stream non-blocking for the loop.
fn open_stream<D: Driver>(
    addr: &str,
    tls: Option<&Arc<rustls::ClientConfig>>,
    driver: &mut D,
    role: Role,
    idx: usize,
) -> Result<Stream> {
    let sa = addr
        .to_socket_addrs()
        .with_context(|| format!("resolving {addr}"))?
        .next()
        .with_context(|| format!("{addr} resolves to no address"))?;
    let mut s = std::net::TcpStream::connect_timeout(&sa, CONNECT_TIMEOUT)
        .with_context(|| format!("connecting to {addr}"))?;
    s.set_nodelay(true)?;
    s.set_read_timeout(Some(CONNECT_TIMEOUT))?;
    s.set_write_timeout(Some(CONNECT_TIMEOUT))?;
    let Some(tls) = tls else {
        driver
            .handshake(&mut s, role)
            .with_context(|| format!("handshake with {addr} ({role:?} {idx})"))?;
        s.set_nonblocking(true)?;
        return Ok(Stream::Plain(TcpStream::from_std(s)));
    };
    let mut session = tls::handshake(s, sa, tls)?;
    driver
        .handshake(&mut session, role)
        .with_context(|| format!("handshake with {addr} over TLS ({role:?} {idx})"))?;
    session.sock.set_nonblocking(true)?;
    Ok(Stream::tls(session))
}

/// The loop's state across phases.
struct Run<'c, D> {
    cfg: &'c RunConfig,
    poll: Poll,
    events: Events,
    conns: Vec<Conn<D>>,
    sh: Shared,
    /// Open loop without `--spin`: wakes the loop for the next send.
    timer: Option<Timer>,
    armed_for: u64,
    /// `--spin`: when the loop last rested (see `SPIN_SLICE`).
    rested_at: u64,
    consumers_started: bool,
    /// Open loop: the schedule's origin and the next message's place on it.
    schedule_start_ns: u64,
    next_due_k: u64,
    /// Which producer goes first this turn, so none is always last.
    rr: usize,
    /// The cluster's addresses, given and learned from refusals (`RunConfig::failover`).
    addrs: Vec<String>,
}

impl<'c, D: Driver> Run<'c, D> {
    fn new(cfg: &'c RunConfig, poll: Poll, conns: Vec<Conn<D>>, run_id: u64) -> Result<Self> {
        // Timer wake-ups (the send timer's, a spinning loop's rest) may otherwise be deferred
        // by the default 50 µs slack.
        // Best effort: a run with the default slack is only less punctual.
        let _ = rustix::thread::set_current_timer_slack(std::num::NonZeroU64::new(1));
        let timer = match cfg.rate {
            Some(_) if !cfg.spin && cfg.steady => Some(send_timer(&poll)?),
            _ => None,
        };
        let sh = Shared {
            clock: Instant::now(),
            phase: Phase::Steady,
            measure_start_ns: 0,
            end_ns: 0,
            depth: cfg.depth,
            window: cfg.window.max(1),
            open_loop: false,
            failover: !cfg.failover.is_empty(),
            null_mode: cfg.null_mode,
            run: run_id,
            payload: PayloadWriter::new(run_id, cfg.payload),
            seq: 0,
            in_system: 0,
            virtual_ready: VecDeque::new(),
            dirty: Vec::with_capacity(conns.len()),
            fig: PhaseOutcome::new(Phase::Steady, 0),
            fill_unsent: 0,
            fill_unanswered: 0,
            last_ack_ns: 0,
            acks_all: 0,
            errors_all: 0,
            puts_ok_all: 0,
            acks_ours_all: 0,
            first_error_all: None,
        };
        Ok(Run {
            cfg,
            poll,
            events: Events::with_capacity(EVENTS_CAPACITY),
            conns,
            sh,
            timer,
            armed_for: u64::MAX,
            rested_at: 0,
            consumers_started: false,
            schedule_start_ns: 0,
            next_due_k: 0,
            rr: 0,
            addrs: cfg.failover.clone(),
        })
    }

    /// Run one phase to its end and return its figures.
    fn phase(&mut self, phase: Phase) -> Result<PhaseOutcome> {
        self.begin(phase);
        let mut progress = Progress::new(self.cfg, phase, self.progress_len(), self.completions());
        let mut cpu = None;
        loop {
            let now = self.sh.now();
            if self.phase_over(now) {
                break;
            }
            if cpu.is_none() && now >= self.sh.measure_start_ns {
                cpu = Some(CpuMark::take(self.cfg.target_pid));
            }
            self.send_puts(now);
            self.wake_parked_null_consumers(now);
            self.flush_dirty()?;
            let timeout = self.poll_timeout(now)?;
            self.poll_once(timeout)?;
            self.repair()?;
            self.check_error_budget()?;
            progress.tick(self.progress_position(), self.completions());
        }
        progress.bar.finish_and_clear();
        Ok(self.finish(cpu))
    }

    /// Set the measured window and what each side does in `phase`.
    fn begin(&mut self, phase: Phase) {
        let now = self.sh.now();
        let sh = &mut self.sh;
        sh.phase = phase;
        sh.measure_start_ns = now;
        sh.end_ns = u64::MAX;
        sh.open_loop = false;
        let mut series_seconds = MAX_SERIES_SECONDS;
        match phase {
            Phase::Fill => {
                let n = self.cfg.fill.unwrap_or(0);
                sh.fill_unsent = n;
                sh.fill_unanswered = n;
            }
            Phase::Steady => {
                sh.measure_start_ns = now + self.cfg.warmup.as_nanos() as u64;
                sh.end_ns = sh.measure_start_ns + self.cfg.duration.as_nanos() as u64;
                sh.open_loop = self.cfg.rate.is_some();
                series_seconds = self.cfg.duration.as_secs_f64().ceil() as usize;
                self.schedule_start_ns = now;
                self.next_due_k = 0;
            }
            Phase::Drain => {
                sh.last_ack_ns = now;
                // Overdue open-loop puts were never sent: nothing to wait for.
                for conn in &mut self.conns {
                    conn.tx.backlog.clear();
                }
            }
        }
        self.sh.fig = PhaseOutcome::new(phase, series_seconds);
        if phase != Phase::Fill {
            self.start_consumers(now);
        }
    }

    /// Every consumer slot asks for a message, once per run.
    fn start_consumers(&mut self, now: u64) {
        if std::mem::replace(&mut self.consumers_started, true) {
            return;
        }
        for conn in self.conns[self.cfg.producers..].iter_mut() {
            for _ in 0..self.cfg.depth {
                conn.tx.want_take(now, &mut self.sh.dirty);
            }
        }
    }

    fn phase_over(&mut self, now: u64) -> bool {
        let sh = &mut self.sh;
        match sh.phase {
            Phase::Steady => now >= sh.end_ns,
            Phase::Fill => sh.fill_unanswered == 0,
            Phase::Drain if sh.in_system == 0 => true,
            Phase::Drain => {
                let idle = Duration::from_nanos(now.saturating_sub(sh.last_ack_ns));
                if idle < DRAIN_IDLE_TIMEOUT {
                    return false;
                }
                let msg = format!(
                    "drain: {} messages put by this run were not acked within {DRAIN_IDLE_TIMEOUT:?} of the last ack",
                    sh.in_system
                );
                sh.fig.first_error.get_or_insert_with(|| msg.clone());
                sh.first_error_all.get_or_insert(msg);
                true
            }
        }
    }

    /// Close the phase: its window's length, CPU shares and what is still unacked.
    fn finish(&mut self, cpu: Option<CpuMark>) -> PhaseOutcome {
        let now = self.sh.now();
        let end = now.min(self.sh.end_ns);
        let measured = Duration::from_nanos(end.saturating_sub(self.sh.measure_start_ns));
        let phase = self.sh.phase;
        let mut fig = std::mem::replace(&mut self.sh.fig, PhaseOutcome::new(phase, 0));
        fig.measured = measured;
        fig.unacked = self.sh.in_system as u64;
        if let Some(mark) = cpu {
            let (loadgen, target, machine) =
                mark.since(self.cfg.target_pid, measured.as_secs_f64());
            fig.loadgen_cpu = loadgen;
            fig.target_cpu = target;
            fig.machine_cpu = machine;
        }
        if phase == Phase::Steady {
            fig.series
                .pad_to(self.cfg.duration.as_secs_f64().ceil() as usize);
        }
        fig
    }

    fn send_puts(&mut self, now: u64) {
        match self.cfg.rate {
            Some(rate) if self.sh.open_loop => self.send_due_puts(now, 1e9 / rate.max(1e-3)),
            _ => self.top_up_producers(now),
        }
    }

    /// Open loop: issue every put that has fallen due, as one batch on as few producers as
    /// possible (one write each), starting with a different producer every batch.
    fn send_due_puts(&mut self, now: u64, interval: f64) {
        let producers = self.cfg.producers;
        let mut p = 0;
        loop {
            let due = self.due(self.next_due_k, interval);
            if due > now {
                break;
            }
            self.next_due_k += 1;
            while p < producers
                && self.conns[(self.rr + p) % producers].tx.pending.len() >= self.cfg.depth
            {
                p += 1;
            }
            if p < producers {
                let conn = &mut self.conns[(self.rr + p) % producers];
                self.sh.send_put(&mut conn.tx, due, now);
            } else {
                // Every pipeline is full: the put waits for a reply, already late.
                self.conns[self.rr % producers].tx.backlog.push_back(due);
            }
        }
        self.rr = self.rr.wrapping_add(1);
    }

    /// The intended send time of the schedule's `k`th message.
    fn due(&self, k: u64, interval: f64) -> u64 {
        self.schedule_start_ns + (k as f64 * interval) as u64
    }

    /// Closed loop and fill: top every producer up, rotating who goes first.
    fn top_up_producers(&mut self, now: u64) {
        let producers = self.cfg.producers;
        for k in 0..producers {
            let conn = &mut self.conns[(self.rr + k) % producers];
            while conn.tx.pending.len() < self.cfg.depth && self.sh.may_put() {
                self.sh.send_put(&mut conn.tx, now, now);
            }
        }
        self.rr = self.rr.wrapping_add(1);
    }

    /// Null mode: wake consumer slots parked for lack of a message.
    fn wake_parked_null_consumers(&mut self, now: u64) {
        let sh = &mut self.sh;
        if !sh.null_mode || sh.virtual_ready.is_empty() {
            return;
        }
        let mut budget = sh.virtual_ready.len();
        for conn in self.conns[self.cfg.producers..].iter_mut() {
            while conn.tx.parked > 0 && budget > 0 {
                conn.tx.parked -= 1;
                budget -= 1;
                conn.tx.send_take(true, now, &mut sh.dirty);
            }
        }
    }

    /// Write everything this turn produced: one write per connection.
    fn flush_dirty(&mut self) -> Result<()> {
        while let Some(idx) = self.sh.dirty.pop() {
            let conn = &mut self.conns[idx];
            if let Err(e) = flush(conn) {
                if !self.sh.failover {
                    return Err(e);
                }
                conn.tx.dirty = false;
                conn.trouble.get_or_insert(Trouble::Lost(format!("{e:#}")));
            }
        }
        Ok(())
    }

    /// How long `poll` may sleep: until the next tick or the window's end, and in open loop
    /// the send timer wakes it for the next put that falls due.
    fn poll_timeout(&mut self, now: u64) -> Result<Duration> {
        if self.cfg.spin {
            if now.saturating_sub(self.rested_at) >= SPIN_SLICE.as_nanos() as u64 {
                std::thread::sleep(SPIN_REST);
                self.rested_at = self.sh.now();
            }
            return Ok(Duration::ZERO);
        }
        if let (Some(rate), Some(timer), true) = (self.cfg.rate, &self.timer, self.sh.open_loop) {
            let due = self.due(self.next_due_k, 1e9 / rate.max(1e-3));
            let wake = due.max(now + SEND_QUANTUM.as_nanos() as u64);
            // An armed timer that has not fired and falls between the next put and `wake`
            // is kept: re-arming it on every turn costs a fifth of the loadgen's CPU (on a VM
            // each timerfd_settime programs the hypervisor's timer), and a turn comes with
            // every reply.
            let keep = self.armed_for > now && (due..=wake).contains(&self.armed_for);
            if !keep {
                let wait = Duration::from_nanos(wake.saturating_sub(self.sh.now()));
                timer.arm_in(wait).context("arming the send timer")?;
                self.armed_for = wake;
            }
        }
        let until_end = Duration::from_nanos(self.sh.end_ns.saturating_sub(now));
        Ok(TICK.min(until_end))
    }

    /// Wait for readiness and handle it: replies read and answered, writes resumed.
    fn poll_once(&mut self, timeout: Duration) -> Result<()> {
        match self.poll.poll(&mut self.events, Some(timeout)) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::Interrupted => return Ok(()),
            Err(e) => return Err(e).context("polling"),
        }
        for ev in self.events.iter() {
            if ev.token() == TIMER_TOKEN {
                // Not read: it fired, so `poll_timeout` arms it again, and arming resets its
                // count, so its next expiry is a new edge (one syscall a wake-up saved).
                continue;
            }
            let idx = ev.token().0;
            let conn = &mut self.conns[idx];
            if conn.trouble.is_some() {
                continue;
            }
            if ev.is_readable() || ev.is_read_closed() || ev.is_error() {
                let until_eof = ev.is_read_closed() || ev.is_error();
                read_ready(conn, &mut self.sh, until_eof)?;
            }
            if ev.is_writable() {
                // TLS records an earlier write left behind go out now (plain: nothing).
                (conn.stream.flush()).with_context(|| format!("writing connection {idx}"))?;
            }
            if ev.is_writable() && !conn.tx.dirty && conn.tx.wpos < conn.tx.wbuf.len() {
                conn.tx.dirty = true;
                self.sh.dirty.push(idx);
            }
        }
        Ok(())
    }

    /// Replaces every connection in trouble (failover only): its requests in flight count as
    /// errors, a new connection goes to the primary a refusal named or to the addresses in
    /// turn, and its consumer slots take again.
    fn repair(&mut self) -> Result<()> {
        let troubled: Vec<usize> = (0..self.conns.len())
            .filter(|&i| self.conns[i].trouble.is_some())
            .collect();
        // Connections whose last reconnect brought no working reply (a replica still naming
        // a primary that is gone) wait before the next: once for all of them, not in turn.
        let pause = troubled
            .iter()
            .map(|&i| &self.conns[i])
            .filter(|c| c.troubled_since.is_some())
            .map(|c| c.backoff)
            .max();
        if let Some(pause) = pause {
            std::thread::sleep(pause);
        }
        for idx in troubled {
            let Some(trouble) = self.conns[idx].trouble.take() else {
                continue;
            };
            let now = self.sh.now();
            self.drop_in_flight(idx, &trouble, now);
            self.reconnect(idx, &trouble)?;
            let conn = &mut self.conns[idx];
            if conn.tx.role == Role::Consumer && self.consumers_started {
                for _ in 0..self.cfg.depth {
                    conn.tx.want_take(now, &mut self.sh.dirty);
                }
            }
        }
        Ok(())
    }

    /// Counts every request of connection `idx` still waiting for its reply as an error and
    /// forgets it, with whatever was read or queued on the connection.
    fn drop_in_flight(&mut self, idx: usize, trouble: &Trouble, now: u64) {
        let sh = &mut self.sh;
        let conn = &mut self.conns[idx];
        for p in std::mem::take(&mut conn.tx.pending) {
            sh.error(
                now,
                p.kind,
                format!("no reply from {}: {trouble}", conn.addr),
            );
            match p.kind {
                Kind::Put => {
                    sh.in_system = sh.in_system.saturating_sub(1);
                    if sh.phase == Phase::Fill {
                        sh.fill_unanswered = sh.fill_unanswered.saturating_sub(1);
                    }
                }
                Kind::Ack if p.ours => sh.in_system = sh.in_system.saturating_sub(1),
                Kind::Take | Kind::Ack => {}
            }
        }
        conn.tx.wbuf.clear();
        conn.tx.wpos = 0;
        conn.tx.parked = 0;
        conn.tx.waiting = false;
        conn.rlen = 0;
    }

    /// Connects `idx` again: first to the primary a refusal named, then to the addresses in
    /// turn starting after the one it had, round after round, until one takes it or the
    /// connection has gone `FAILOVER_WAIT` without a reply that worked.
    fn reconnect(&mut self, idx: usize, trouble: &Trouble) -> Result<()> {
        let conn = &mut self.conns[idx];
        let _ = self.poll.registry().deregister(&mut conn.stream);
        // A reconnect that brought no working reply: `repair` waited; the next waits longer.
        if conn.troubled_since.is_some() {
            conn.backoff = (conn.backoff * 2).min(MAX_BACKOFF);
        }
        let since = *conn.troubled_since.get_or_insert_with(Instant::now);
        let mut order = Vec::new();
        if let Trouble::Redirect(primary) = trouble {
            if !self.addrs.contains(primary) {
                self.addrs.push(primary.clone());
            }
            order.push(primary.clone());
        }
        let n = self.addrs.len();
        let start = self
            .addrs
            .iter()
            .position(|a| *a == conn.addr)
            .map_or(0, |i| i + 1);
        for k in 0..n {
            let a = &self.addrs[(start + k) % n];
            if !order.contains(a) {
                order.push(a.clone());
            }
        }
        let (role, mut tried) = (conn.tx.role, Vec::new());
        let mut pause = FIRST_BACKOFF;
        loop {
            for addr in &order {
                match open_stream(addr, self.cfg.tls.as_ref(), &mut conn.tx.driver, role, idx) {
                    Ok(s) => {
                        conn.stream = s;
                        conn.addr = addr.clone();
                        return self
                            .poll
                            .registry()
                            .register(
                                &mut conn.stream,
                                Token(idx),
                                Interest::READABLE | Interest::WRITABLE,
                            )
                            .context("registering a connection");
                    }
                    Err(e) => tried.push(format!("{addr} ({e:#})")),
                }
            }
            if since.elapsed() >= FAILOVER_WAIT {
                bail!(
                    "{role:?} connection {idx}: {trouble}; no address took it back within {FAILOVER_WAIT:?}: tried {}",
                    tried.join(", ")
                );
            }
            std::thread::sleep(pause);
            pause = (pause * 2).min(MAX_BACKOFF);
        }
    }

    fn check_error_budget(&self) -> Result<()> {
        let sh = &self.sh;
        if sh.errors_all > MAX_ERRORS && sh.errors_all > sh.acks_all {
            bail!(
                "stopping: {} errors and only {} acks; first error: {}",
                sh.errors_all,
                sh.acks_all,
                sh.first_error_all.as_deref().unwrap_or("?")
            );
        }
        Ok(())
    }

    /// The progress bar's length: milliseconds of the steady phase, messages to fill or drain.
    fn progress_len(&self) -> u64 {
        match self.sh.phase {
            Phase::Steady => self.sh.end_ns.saturating_sub(self.sh.now()) / 1_000_000,
            Phase::Fill => self.sh.fill_unanswered,
            Phase::Drain => self.sh.in_system as u64,
        }
    }

    fn progress_position(&self) -> u64 {
        match self.sh.phase {
            Phase::Steady => {
                let start = self.schedule_start_ns;
                self.sh.now().saturating_sub(start) / 1_000_000
            }
            Phase::Fill => self.cfg.fill.unwrap_or(0) - self.sh.fill_unanswered,
            Phase::Drain => self.sh.fig.acks,
        }
    }

    /// What the progress bar's rate counts: puts while filling, acks otherwise.
    fn completions(&self) -> u64 {
        match self.sh.phase {
            Phase::Fill => self.sh.puts_ok_all,
            _ => self.sh.acks_all,
        }
    }
}

/// Register a send timer for the open-loop schedule.
fn send_timer(poll: &Poll) -> Result<Timer> {
    let t = Timer::new().context("creating the send timer")?;
    poll.registry()
        .register(
            &mut SourceFd(&t.fd.as_raw_fd()),
            TIMER_TOKEN,
            Interest::READABLE,
        )
        .context("registering the send timer")?;
    Ok(t)
}

/// Read until the socket is drained, handling every complete reply as it arrives.
///
/// Drained is a read that would block or, unless `until_eof` (the peer closed: its end must be
/// read), a read shorter than the room offered: the kernel hands over all it holds, so a short
/// read emptied the socket and any reply arriving later raises a new edge-triggered event.
/// That saves the read that would only say `WouldBlock`, one syscall per readable connection
/// per turn (the server's `ReadBuf::fill` does the same).
fn read_ready<D: Driver>(conn: &mut Conn<D>, sh: &mut Shared, until_eof: bool) -> Result<()> {
    loop {
        if conn.rlen == conn.rbuf.len() {
            let grown = conn.rbuf.len() * 2;
            if grown > MAX_READ_BUF_BYTES {
                bail!(
                    "a reply on {:?} connection {} exceeds the read buffer limit of {MAX_READ_BUF_BYTES} bytes",
                    conn.tx.role,
                    conn.tx.idx
                );
            }
            conn.rbuf.resize(grown, 0);
        }
        let room = conn.rbuf.len() - conn.rlen;
        match conn.stream.read(&mut conn.rbuf[conn.rlen..]) {
            Ok(0) => {
                let why = format!(
                    "the target closed {:?} connection {} ({} requests in flight)",
                    conn.tx.role,
                    conn.tx.idx,
                    conn.tx.pending.len()
                );
                return lose(conn, sh, why);
            }
            Ok(n) => {
                conn.rlen += n;
                handle_replies(conn, sh)?;
                if n < room && !until_eof {
                    return Ok(());
                }
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(()),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => {
                let why = format!("reading {:?} connection {}: {e}", conn.tx.role, conn.tx.idx);
                return lose(conn, sh, why);
            }
        }
    }
}

/// A connection that failed: the end of the run, or with failover, one to replace.
fn lose<D>(conn: &mut Conn<D>, sh: &Shared, why: String) -> Result<()> {
    if !sh.failover {
        bail!(why);
    }
    conn.trouble.get_or_insert(Trouble::Lost(why));
    Ok(())
}

fn handle_replies<D: Driver>(conn: &mut Conn<D>, sh: &mut Shared) -> Result<()> {
    let now = sh.now();
    let mut pos = 0;
    while let Some(frame) = conn
        .tx
        .driver
        .split(&conn.rbuf[pos..conn.rlen])
        .with_context(|| format!("{:?} connection {}", conn.tx.role, conn.tx.idx))?
    {
        let bytes = &conn.rbuf[pos..pos + frame.len];
        pos += frame.len;
        let p = conn.tx.complete(frame.sync)?;
        sh.observe_gap(&p, conn.last_reply_ns, conn.tx.idx, now);
        conn.last_reply_ns = now;
        let reply = match frame.reply {
            Some(r) if r.answers(p.kind) => Ok(r),
            Some(r) => Err(crate::proto::ProtoError::Unexpected {
                kind: p.kind,
                reply: format!("{r:?}"),
            }),
            None => conn.tx.driver.decode(bytes, p.kind),
        }
        .with_context(|| format!("{:?} connection {}", conn.tx.role, conn.tx.idx))?;
        match &reply {
            Reply::Error(text) if sh.failover => {
                if let Some(primary) = conn.tx.driver.primary_in(text) {
                    conn.trouble
                        .get_or_insert_with(|| Trouble::Redirect(primary.to_string()));
                }
            }
            Reply::Error(_) => {}
            _ => {
                conn.troubled_since = None;
                conn.backoff = FIRST_BACKOFF;
            }
        }
        on_reply(&mut conn.tx, sh, p, reply, now);
    }
    conn.rbuf.copy_within(pos..conn.rlen, 0);
    conn.rlen -= pos;
    Ok(())
}

fn on_reply<D: Driver>(tx: &mut Tx<D>, sh: &mut Shared, p: Pending, reply: Reply<'_>, now: u64) {
    match reply {
        Reply::Put => on_put(tx, sh, p, now),
        Reply::Task { id, data } => on_task(tx, sh, p, (id, data), now),
        Reply::NoTask if sh.null_mode => on_null_take(tx, sh, p, now),
        Reply::NoTask => on_no_task(tx, sh, p, now),
        Reply::Acked => on_acked(tx, sh, p, now),
        Reply::Error(msg) => on_error(tx, sh, p, msg, now),
    }
    if tx.role == Role::Consumer {
        tx.settle(now, &mut sh.dirty);
        debug_assert_eq!(tx.pending.len() + tx.parked, sh.depth, "consumer slots");
    }
}

fn on_put<D: Driver>(tx: &mut Tx<D>, sh: &mut Shared, p: Pending, now: u64) {
    sh.puts_ok_all += 1;
    if sh.measuring(now) {
        let latency = now.saturating_sub(p.start_ns);
        let since = sh.since_start(now);
        sh.fig.puts += 1;
        sh.fig.put.record_ns(latency);
        sh.fig.series.put(since, latency);
    }
    if sh.null_mode {
        sh.virtual_ready.push_back(p.origin_ns);
    }
    sh.put_answered(tx, now);
}

/// A take delivered a message (its id and bytes): ack it at once.
fn on_task<D: Driver>(
    tx: &mut Tx<D>,
    sh: &mut Shared,
    p: Pending,
    (id, data): (u64, &[u8]),
    now: u64,
) {
    if p.wait {
        tx.waiting = false;
    }
    let (origin, ours) = match payload::read(sh.run, data) {
        Some(stamp) => (stamp.origin_ns, true),
        None => {
            sh.fig.foreign += 1;
            (0, false)
        }
    };
    let ack = Request::Ack { id, data };
    tx.send_ack(
        ack,
        (p.start_ns.max(origin), origin, ours),
        now,
        &mut sh.dirty,
    );
    // A message was there, so more may be: one parked slot tries again without waiting. One
    // per delivery ramps every slot up within `depth` messages when there is a backlog, and
    // costs one empty take per message when there is none.
    if tx.blocking && tx.parked > 0 {
        tx.parked -= 1;
        tx.send_take(false, now, &mut sh.dirty);
    }
}

/// Null mode: the loadgen's own queue stands in for the target's.
fn on_null_take<D: Driver>(tx: &mut Tx<D>, sh: &mut Shared, p: Pending, now: u64) {
    match sh.virtual_ready.pop_front() {
        Some(origin) => tx.send_ack(
            Request::Ack { id: 0, data: &[] },
            (p.start_ns.max(origin), origin, true),
            now,
            &mut sh.dirty,
        ),
        None => tx.parked += 1,
    }
}

fn on_no_task<D: Driver>(tx: &mut Tx<D>, sh: &mut Shared, p: Pending, now: u64) {
    if sh.measuring(now) {
        sh.fig.empty_takes += 1;
    }
    if p.wait || !tx.blocking {
        // A waiting take timed out: wait again.
        tx.waiting = false;
        tx.want_take(now, &mut sh.dirty);
    } else {
        // Nothing ready: park until the pipeline drains, then one slot waits.
        tx.parked += 1;
    }
}

fn on_acked<D: Driver>(tx: &mut Tx<D>, sh: &mut Shared, p: Pending, now: u64) {
    sh.acks_all += 1;
    if p.ours {
        sh.acks_ours_all += 1;
        sh.last_ack_ns = now;
        sh.in_system = sh.in_system.saturating_sub(1);
        if sh.measuring(now) {
            let since = sh.since_start(now);
            sh.fig.acks += 1;
            sh.fig.cycle.record_ns(now.saturating_sub(p.start_ns));
            sh.fig.e2e.record_ns(now.saturating_sub(p.origin_ns));
            sh.fig.series.ack(since);
        }
    }
    tx.want_take(now, &mut sh.dirty);
}

fn on_error<D: Driver>(tx: &mut Tx<D>, sh: &mut Shared, p: Pending, msg: String, now: u64) {
    sh.error(now, p.kind, msg);
    match p.kind {
        Kind::Put => {
            // The message never entered the queue: free its window place.
            sh.in_system = sh.in_system.saturating_sub(1);
            sh.put_answered(tx, now);
        }
        Kind::Take | Kind::Ack => {
            if p.kind == Kind::Ack && p.ours {
                sh.in_system = sh.in_system.saturating_sub(1);
            }
            if p.wait {
                tx.waiting = false;
            }
            tx.want_take(now, &mut sh.dirty);
        }
    }
}

/// Write what is buffered; a would-block leaves the rest for the writable event.
fn flush<D>(conn: &mut Conn<D>) -> Result<()> {
    let tx = &mut conn.tx;
    while tx.wpos < tx.wbuf.len() {
        match conn.stream.write(&tx.wbuf[tx.wpos..]) {
            Ok(0) => bail!(
                "the target stopped accepting bytes on connection {}",
                tx.idx
            ),
            Ok(n) => tx.wpos += n,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                tx.dirty = false;
                return Ok(());
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e).with_context(|| format!("writing connection {}", tx.idx)),
        }
    }
    tx.wbuf.clear();
    tx.wpos = 0;
    tx.dirty = false;
    Ok(())
}

/// The progress bar of one phase and the rate shown beside it.
struct Progress {
    bar: ProgressBar,
    last_tick: Instant,
    last_count: u64,
}

impl Progress {
    fn new(cfg: &RunConfig, phase: Phase, len: u64, count: u64) -> Progress {
        let bar = if cfg.progress {
            let pb = ProgressBar::new(len);
            pb.set_style(
                ProgressStyle::with_template("{prefix:>28} [{bar:30}] {elapsed:>3} {msg}")
                    .expect("static template")
                    .progress_chars("=> "),
            );
            pb.set_prefix(format!("{} {phase:?}", cfg.label).to_lowercase());
            pb
        } else {
            ProgressBar::hidden()
        };
        Progress {
            bar,
            last_tick: Instant::now(),
            last_count: count,
        }
    }

    /// Redraw once per `TICK` with the completions a second since the last redraw.
    fn tick(&mut self, position: u64, count: u64) {
        let dt = self.last_tick.elapsed();
        if dt < TICK {
            return;
        }
        self.last_tick = Instant::now();
        let rate = count.saturating_sub(self.last_count) as f64 / dt.as_secs_f64();
        self.last_count = count;
        self.bar.set_position(position);
        self.bar.set_message(format!("{rate:>9.0} msg/s"));
    }
}

/// A one-shot timerfd on CLOCK_MONOTONIC (the clock `Instant` reads), polled like a socket:
/// the open-loop schedule sleeps in epoll with microsecond precision.
struct Timer {
    fd: OwnedFd,
}

impl Timer {
    fn new() -> io::Result<Timer> {
        let fd = timerfd_create(
            TimerfdClockId::Monotonic,
            TimerfdFlags::NONBLOCK | TimerfdFlags::CLOEXEC,
        )?;
        Ok(Timer { fd })
    }

    /// Fire once, `after` from now (at least 1 ns: zero would disarm it).
    fn arm_in(&self, after: Duration) -> io::Result<()> {
        let after = after.max(Duration::from_nanos(1));
        let spec = Itimerspec {
            it_interval: Timespec {
                tv_sec: 0,
                tv_nsec: 0,
            },
            it_value: Timespec {
                tv_sec: after.as_secs().try_into().unwrap_or(i64::MAX),
                tv_nsec: after.subsec_nanos().into(),
            },
        };
        timerfd_settime(&self.fd, TimerfdTimerFlags::empty(), &spec)?;
        Ok(())
    }
}

/// A value unique to this run, stamped into every payload and used to name its keys/tubes.
fn run_nonce() -> u64 {
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0);
    t ^ (u64::from(std::process::id()) << 40)
}

/// Busy CPU time of the whole machine so far (every core, every process), in seconds.
pub fn machine_cpu_seconds() -> Option<f64> {
    let stat = std::fs::read_to_string("/proc/stat").ok()?;
    let line = stat.lines().next()?.strip_prefix("cpu ")?;
    let f: Vec<f64> = line
        .split_whitespace()
        .map(|x| x.parse().unwrap_or(0.0))
        .collect();
    // user nice system idle iowait irq softirq steal: busy is all but idle and iowait.
    let busy = f.get(..8)?.iter().sum::<f64>() - f[3] - f[4];
    let hz = rustix::param::clock_ticks_per_second();
    Some(busy / hz.max(1) as f64)
}

/// CPU time (user + system) consumed so far by `/proc/<pid>`, in seconds.
pub fn cpu_seconds(pid: &str) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name may contain spaces; the fields we want follow its closing parenthesis.
    let rest = &stat[stat.rfind(')')? + 2..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // utime and stime are fields 14 and 15 of the full line, 12 and 13 after the name.
    let utime: f64 = fields.get(11)?.parse().ok()?;
    let stime: f64 = fields.get(12)?.parse().ok()?;
    let hz = rustix::param::clock_ticks_per_second();
    Some((utime + stime) / hz.max(1) as f64)
}
