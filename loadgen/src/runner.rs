//! The load loop: one thread, one mio `Poll`, every producer and consumer connection on it.
//! Each connection keeps up to `depth` requests in flight (pipelining), so a single core drives
//! hundreds of thousands of operations a second and the loadgen is not what is measured.
//!
//! One message is a put by a producer, then a take and an ack by a consumer. A consumer
//! connection runs `depth` independent slots, each looping take → ack → take. Producers run
//! either closed loop — as fast as replies come back, with at most `window` messages put but not
//! yet acked so the queue cannot grow without bound — or open loop at `--rate` messages a
//! second, where every message has an intended send time fixed in advance and every latency
//! counts from it, so a stall delays the schedule's measurements instead of hiding them
//! (no coordinated omission).
//!
//! Latencies: `put` = put sent (intended, in open loop) → reply; `e2e` = put sent (intended) →
//! ack answered, read from the stamp in the payload; `cycle` = take → ack answered, counted from
//! the later of the take's send and the message's put, so a take parked on an empty queue does
//! not count its idle wait (then cycle ≈ e2e), while with a backlog it is the consumer's take +
//! ack round trips and e2e adds the time spent queued.

use crate::payload::{self, PayloadWriter};
use crate::proto::{Driver, Kind, Reply, Request, Role};
use crate::stats::{Latency, Series};
use anyhow::{anyhow, bail, Context, Result};
use indicatif::{ProgressBar, ProgressStyle};
use mio::net::TcpStream;
use mio::unix::SourceFd;
use mio::{Events, Interest, Poll, Token};
use std::collections::VecDeque;
use std::io::{self, Read, Write};
use std::net::SocketAddr;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
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
/// It never spins: on a shared core a thread that never sleeps loses the scheduler's favour
/// and then runs late by whole time slices.
const SEND_QUANTUM: Duration = Duration::from_micros(50);
/// The poll token of the open-loop timer; connections use their index.
const TIMER_TOKEN: Token = Token(usize::MAX);
/// A run stops early when errors pass this count and outnumber successes: the target is
/// refusing the workload and the figures would mean nothing.
const MAX_ERRORS: u64 = 10_000;
/// Events taken per `poll` call: one per connection at most matters, the rest wait a turn.
const EVENTS_CAPACITY: usize = 1024;

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
    /// Closed loop: at most this many messages put and not yet acked.
    pub window: usize,
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
}

impl RunConfig {
    /// The closed-loop window when none is given: every producer and consumer slot busy, with
    /// as much again queued so consumers never wait on a producer's round trip.
    pub fn default_window(producers: usize, consumers: usize, depth: usize) -> usize {
        (producers + consumers) * depth
    }
}

/// What a run measured, over the measured window only (warm-up excluded).
#[derive(Debug)]
pub struct Outcome {
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
    /// CPU time the loadgen used over the window, in cores (1.0 = one core busy all the time).
    pub loadgen_cpu: f64,
    /// The same for the target process, when known.
    pub target_cpu: Option<f64>,
    /// CPU the whole machine used over the window, in cores (all processes, from /proc/stat):
    /// what is left after the loadgen and the target is other work disturbing the run.
    pub machine_cpu: Option<f64>,
}

impl Outcome {
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
    /// Ack: the message was put by this run (counted in the window and the figures).
    ours: bool,
    /// Take: it may wait for a message (always, unless the driver's takes block).
    wait: bool,
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
    /// Invariant: a consumer's `pending.len() + parked == depth`.
    parked: usize,
    /// The driver's waiting take blocks the connection (`Driver::blocking_takes`).
    blocking: bool,
    /// A blocking take is in flight (then it is the last request in the pipeline).
    waiting: bool,
}

impl<D: Driver> Tx<D> {
    fn send(
        &mut self,
        req: Request<'_>,
        kind: Kind,
        start_ns: u64,
        origin_ns: u64,
        ours: bool,
        dirty: &mut Vec<usize>,
    ) {
        let sync = self.driver.encode(&mut self.wbuf, req);
        self.pending.push_back(Pending {
            sync,
            kind,
            start_ns,
            origin_ns,
            ours,
            wait: false,
        });
        if !self.dirty {
            self.dirty = true;
            dirty.push(self.idx);
        }
    }

    fn send_take(&mut self, wait: bool, now: u64, dirty: &mut Vec<usize>) {
        self.send(Request::Take { wait }, Kind::Take, now, 0, false, dirty);
        if let Some(p) = self.pending.back_mut() {
            p.wait = wait;
        }
        if self.blocking && wait {
            self.waiting = true;
        }
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

struct Conn<D> {
    stream: TcpStream,
    rbuf: Vec<u8>,
    rlen: usize,
    tx: Tx<D>,
}

/// Run-wide state shared by every connection's reply handling.
struct Shared {
    clock: Instant,
    measure_start_ns: u64,
    end_ns: u64,
    depth: usize,
    window: usize,
    open_loop: bool,
    null_mode: bool,
    run: u64,
    payload: PayloadWriter,
    seq: u64,
    in_system: usize,
    /// Null mode: origins of messages "in the queue", which the loadgen keeps itself.
    virtual_ready: VecDeque<u64>,
    dirty: Vec<usize>,
    put: Latency,
    cycle: Latency,
    e2e: Latency,
    send_lag: Latency,
    puts: u64,
    acks: u64,
    acks_all: u64,
    errors: u64,
    errors_all: u64,
    empty_takes: u64,
    foreign: u64,
    first_error: Option<String>,
    series: Series,
}

impl Shared {
    fn now(&self) -> u64 {
        self.clock.elapsed().as_nanos() as u64
    }

    fn measuring(&self, now: u64) -> bool {
        now >= self.measure_start_ns && now < self.end_ns
    }

    fn error(&mut self, now: u64, kind: Kind, msg: String) {
        self.errors_all += 1;
        if self.measuring(now) {
            self.errors += 1;
        }
        if self.first_error.is_none() {
            self.first_error = Some(format!("{kind:?}: {msg}"));
        }
    }

    fn send_put<D: Driver>(&mut self, tx: &mut Tx<D>, origin_ns: u64, now: u64) {
        if self.open_loop && self.measuring(now) {
            self.send_lag.record_ns(now.saturating_sub(origin_ns));
        }
        let seq = self.seq;
        self.seq += 1;
        let data = self.payload.write(seq, origin_ns);
        tx.send(
            Request::Put(data),
            Kind::Put,
            origin_ns,
            origin_ns,
            true,
            &mut self.dirty,
        );
        self.in_system += 1;
    }
}

/// Run the load against `cfg.addr` with one driver per connection made by `make`.
pub fn run<D: Driver>(cfg: &RunConfig, make: impl Fn(u64) -> D) -> Result<Outcome> {
    if cfg.producers == 0 || cfg.consumers == 0 || cfg.depth == 0 {
        bail!("producers, consumers and depth must each be at least 1");
    }
    if cfg.payload > MAX_PAYLOAD_BYTES {
        bail!(
            "--payload {} exceeds the limit of {MAX_PAYLOAD_BYTES} bytes",
            cfg.payload
        );
    }
    let run_id = run_nonce();
    let mut poll = Poll::new().context("creating the poll")?;
    let mut conns: Vec<Conn<D>> = Vec::with_capacity(cfg.producers + cfg.consumers);
    for idx in 0..cfg.producers + cfg.consumers {
        let role = if idx < cfg.producers {
            Role::Producer
        } else {
            Role::Consumer
        };
        let mut driver = make(run_id);
        let blocking = driver.blocking_takes();
        let mut std_stream = std::net::TcpStream::connect_timeout(&cfg.addr, CONNECT_TIMEOUT)
            .with_context(|| format!("connecting to {}", cfg.addr))?;
        std_stream.set_nodelay(true)?;
        std_stream.set_read_timeout(Some(CONNECT_TIMEOUT))?;
        std_stream.set_write_timeout(Some(CONNECT_TIMEOUT))?;
        driver
            .handshake(&mut std_stream, role)
            .with_context(|| format!("handshake with {} ({role:?} {idx})", cfg.addr))?;
        std_stream.set_nonblocking(true)?;
        let mut stream = TcpStream::from_std(std_stream);
        poll.registry()
            .register(
                &mut stream,
                Token(idx),
                Interest::READABLE | Interest::WRITABLE,
            )
            .context("registering a connection")?;
        conns.push(Conn {
            stream,
            rbuf: vec![0; READ_BUF_BYTES],
            rlen: 0,
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
        });
    }

    let warmup_ns = cfg.warmup.as_nanos() as u64;
    let total_ns = warmup_ns + cfg.duration.as_nanos() as u64;
    let mut sh = Shared {
        clock: Instant::now(),
        measure_start_ns: warmup_ns,
        end_ns: total_ns,
        depth: cfg.depth,
        window: cfg.window.max(1),
        open_loop: cfg.rate.is_some(),
        null_mode: cfg.null_mode,
        run: run_id,
        payload: PayloadWriter::new(run_id, cfg.payload),
        seq: 0,
        in_system: 0,
        virtual_ready: VecDeque::new(),
        dirty: Vec::with_capacity(conns.len()),
        put: Latency::new(),
        cycle: Latency::new(),
        e2e: Latency::new(),
        send_lag: Latency::new(),
        puts: 0,
        acks: 0,
        acks_all: 0,
        errors: 0,
        errors_all: 0,
        empty_takes: 0,
        foreign: 0,
        first_error: None,
        series: Series::new(cfg.duration.as_secs_f64().ceil() as usize),
    };
    let interval_ns = cfg.rate.map(|r| 1e9 / r.max(1e-3));
    let mut next_due_k: u64 = 0;
    let mut rr_open = 0usize;
    let mut rr_closed = 0usize;

    // Every consumer slot starts by asking for a message.
    for conn in conns[cfg.producers..].iter_mut() {
        for _ in 0..cfg.depth {
            conn.tx.want_take(0, &mut sh.dirty);
        }
    }

    let timer = match cfg.rate {
        Some(_) if !cfg.spin => {
            // Timer wake-ups may otherwise be deferred by the default 50 µs slack.
            // SAFETY: PR_SET_TIMERSLACK takes a plain integer and affects this thread only.
            unsafe {
                libc::prctl(libc::PR_SET_TIMERSLACK, 1 as libc::c_ulong);
            }
            let t = Timer::new().context("creating the send timer")?;
            poll.registry()
                .register(
                    &mut SourceFd(&t.fd.as_raw_fd()),
                    TIMER_TOKEN,
                    Interest::READABLE,
                )
                .context("registering the send timer")?;
            Some(t)
        }
        _ => None,
    };
    let mut armed_for = u64::MAX;

    let progress = progress_bar(cfg, total_ns);
    let mut last_tick = Instant::now();
    let mut last_acks = 0u64;
    let mut cpu_at_start: Option<(f64, Option<f64>, Option<f64>)> = None;
    let mut events = Events::with_capacity(EVENTS_CAPACITY);

    loop {
        let now = sh.now();
        if now >= sh.end_ns {
            break;
        }
        if cpu_at_start.is_none() && now >= sh.measure_start_ns {
            cpu_at_start = Some((
                cpu_seconds("self").unwrap_or(0.0),
                cfg.target_pid.and_then(|pid| cpu_seconds(&pid.to_string())),
                machine_cpu_seconds(),
            ));
        }

        // Open loop: issue every put that has fallen due, as one batch on as few producers as
        // possible (one write each), starting with a different producer every batch.
        if let Some(interval) = interval_ns {
            let mut p = 0;
            loop {
                let due = (next_due_k as f64 * interval) as u64;
                if due > now {
                    break;
                }
                next_due_k += 1;
                while p < cfg.producers
                    && conns[(rr_open + p) % cfg.producers].tx.pending.len() >= cfg.depth
                {
                    p += 1;
                }
                if p < cfg.producers {
                    let conn = &mut conns[(rr_open + p) % cfg.producers];
                    sh.send_put(&mut conn.tx, due, now);
                } else {
                    // Every pipeline is full: the put waits for a reply, already late.
                    conns[rr_open % cfg.producers].tx.backlog.push_back(due);
                }
            }
            rr_open = rr_open.wrapping_add(1);
        } else {
            // Closed loop: top every producer up, rotating who goes first.
            for k in 0..cfg.producers {
                let conn = &mut conns[(rr_closed + k) % cfg.producers];
                while conn.tx.pending.len() < cfg.depth && sh.in_system < sh.window {
                    sh.send_put(&mut conn.tx, now, now);
                }
            }
            rr_closed = rr_closed.wrapping_add(1);
        }

        // Null mode: wake consumer slots parked for lack of a message.
        if sh.null_mode && !sh.virtual_ready.is_empty() {
            let mut budget = sh.virtual_ready.len();
            for conn in conns[cfg.producers..].iter_mut() {
                while conn.tx.parked > 0 && budget > 0 {
                    conn.tx.parked -= 1;
                    budget -= 1;
                    conn.tx.send_take(true, now, &mut sh.dirty);
                }
            }
        }

        // Write everything this turn produced: one write per connection.
        while let Some(idx) = sh.dirty.pop() {
            flush(&mut conns[idx])?;
        }

        let until_end = Duration::from_nanos(sh.end_ns.saturating_sub(now));
        let timeout = match (interval_ns, &timer) {
            _ if cfg.spin => Duration::ZERO,
            (Some(interval), Some(timer)) => {
                let due = (next_due_k as f64 * interval) as u64;
                let wake = due.max(now + SEND_QUANTUM.as_nanos() as u64);
                if armed_for != wake {
                    let wait = Duration::from_nanos(wake.saturating_sub(sh.now()));
                    timer.arm_in(wait).context("arming the send timer")?;
                    armed_for = wake;
                }
                TICK.min(until_end)
            }
            _ => TICK.min(until_end),
        };
        match poll.poll(&mut events, Some(timeout)) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e).context("polling"),
        }
        for ev in events.iter() {
            if ev.token() == TIMER_TOKEN {
                if let Some(t) = &timer {
                    t.clear();
                }
                continue;
            }
            let idx = ev.token().0;
            let conn = &mut conns[idx];
            if ev.is_readable() || ev.is_read_closed() || ev.is_error() {
                read_ready(conn, &mut sh)?;
            }
            if ev.is_writable() && !conn.tx.dirty && conn.tx.wpos < conn.tx.wbuf.len() {
                conn.tx.dirty = true;
                sh.dirty.push(idx);
            }
        }
        if sh.errors_all > MAX_ERRORS && sh.errors_all > sh.acks_all {
            bail!(
                "stopping: {} errors and only {} acks; first error: {}",
                sh.errors_all,
                sh.acks_all,
                sh.first_error.as_deref().unwrap_or("?")
            );
        }

        if last_tick.elapsed() >= TICK {
            let dt = last_tick.elapsed().as_secs_f64();
            last_tick = Instant::now();
            let rate = (sh.acks_all - last_acks) as f64 / dt;
            last_acks = sh.acks_all;
            progress.set_position(sh.now().min(total_ns) / 1_000_000);
            progress.set_message(format!("{rate:>9.0} msg/s"));
        }
    }
    progress.finish_and_clear();

    let (cpu0, target0, machine0) = cpu_at_start.unwrap_or((0.0, None, None));
    let measured = Duration::from_nanos(sh.end_ns - sh.measure_start_ns);
    let secs = measured.as_secs_f64();
    let loadgen_cpu = (cpu_seconds("self").unwrap_or(0.0) - cpu0) / secs;
    let target_cpu = match (cfg.target_pid, target0) {
        (Some(pid), Some(t0)) => cpu_seconds(&pid.to_string()).map(|t| (t - t0) / secs),
        _ => None,
    };
    let machine_cpu = match (machine0, machine_cpu_seconds()) {
        (Some(a), Some(b)) => Some((b - a) / secs),
        _ => None,
    };
    Ok(Outcome {
        put: sh.put,
        cycle: sh.cycle,
        e2e: sh.e2e,
        send_lag: sh.send_lag,
        puts: sh.puts,
        acks: sh.acks,
        errors: sh.errors,
        empty_takes: sh.empty_takes,
        foreign: sh.foreign,
        first_error: sh.first_error,
        measured,
        series: sh.series,
        loadgen_cpu,
        target_cpu,
        machine_cpu,
    })
}

/// Read until the socket would block, handling every complete reply as it arrives.
fn read_ready<D: Driver>(conn: &mut Conn<D>, sh: &mut Shared) -> Result<()> {
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
        match conn.stream.read(&mut conn.rbuf[conn.rlen..]) {
            Ok(0) => bail!(
                "the target closed {:?} connection {} ({} requests in flight)",
                conn.tx.role,
                conn.tx.idx,
                conn.tx.pending.len()
            ),
            Ok(n) => {
                conn.rlen += n;
                handle_replies(conn, sh)?;
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(()),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => {
                return Err(e).with_context(|| {
                    format!("reading {:?} connection {}", conn.tx.role, conn.tx.idx)
                })
            }
        }
    }
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
        let reply = conn
            .tx
            .driver
            .decode(bytes, p.kind)
            .with_context(|| format!("{:?} connection {}", conn.tx.role, conn.tx.idx))?;
        on_reply(&mut conn.tx, sh, p, reply, now);
    }
    conn.rbuf.copy_within(pos..conn.rlen, 0);
    conn.rlen -= pos;
    Ok(())
}

fn on_reply<D: Driver>(tx: &mut Tx<D>, sh: &mut Shared, p: Pending, reply: Reply<'_>, now: u64) {
    let measuring = sh.measuring(now);
    match reply {
        Reply::Put => {
            if measuring {
                sh.puts += 1;
                sh.put.record_ns(now.saturating_sub(p.start_ns));
                sh.series.put(now - sh.measure_start_ns);
            }
            if sh.null_mode {
                sh.virtual_ready.push_back(p.origin_ns);
            }
            if sh.open_loop {
                if let Some(due) = tx.backlog.pop_front() {
                    sh.send_put(tx, due, now);
                }
            }
        }
        Reply::Task { id, data } => {
            if p.wait {
                tx.waiting = false;
            }
            let (origin, ours) = match payload::read(sh.run, data) {
                Some(stamp) => (stamp.origin_ns, true),
                None => {
                    sh.foreign += 1;
                    (0, false)
                }
            };
            tx.send(
                Request::Ack { id, data },
                Kind::Ack,
                p.start_ns.max(origin),
                origin,
                ours,
                &mut sh.dirty,
            );
            // A message was there, so more may be: one parked slot tries again without
            // waiting. One per delivery ramps every slot up within `depth` messages when there
            // is a backlog, and costs one empty take per message when there is none.
            if tx.blocking && tx.parked > 0 {
                tx.parked -= 1;
                tx.send_take(false, now, &mut sh.dirty);
            }
        }
        Reply::NoTask if sh.null_mode => match sh.virtual_ready.pop_front() {
            Some(origin) => tx.send(
                Request::Ack { id: 0, data: &[] },
                Kind::Ack,
                p.start_ns.max(origin),
                origin,
                true,
                &mut sh.dirty,
            ),
            None => tx.parked += 1,
        },
        Reply::NoTask => {
            if measuring {
                sh.empty_takes += 1;
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
        Reply::Acked => {
            sh.acks_all += 1;
            if p.ours {
                sh.in_system = sh.in_system.saturating_sub(1);
                if measuring {
                    sh.acks += 1;
                    sh.cycle.record_ns(now.saturating_sub(p.start_ns));
                    sh.e2e.record_ns(now.saturating_sub(p.origin_ns));
                    sh.series.ack(now - sh.measure_start_ns);
                }
            }
            tx.want_take(now, &mut sh.dirty);
        }
        Reply::Error(msg) => {
            sh.error(now, p.kind, msg);
            match p.kind {
                Kind::Put => {
                    // The message never entered the queue: free its window place.
                    sh.in_system = sh.in_system.saturating_sub(1);
                    if sh.open_loop {
                        if let Some(due) = tx.backlog.pop_front() {
                            sh.send_put(tx, due, now);
                        }
                    }
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
    }
    if tx.role == Role::Consumer {
        tx.settle(now, &mut sh.dirty);
        debug_assert_eq!(tx.pending.len() + tx.parked, sh.depth, "consumer slots");
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

fn progress_bar(cfg: &RunConfig, total_ns: u64) -> ProgressBar {
    if !cfg.progress {
        return ProgressBar::hidden();
    }
    let pb = ProgressBar::new(total_ns / 1_000_000);
    pb.set_style(
        ProgressStyle::with_template("{prefix:>28} [{bar:30}] {elapsed:>3} {msg}")
            .expect("static template")
            .progress_chars("=> "),
    );
    pb.set_prefix(cfg.label.clone());
    pb
}

/// A one-shot timerfd on CLOCK_MONOTONIC (the clock `Instant` reads), polled like a socket:
/// the open-loop schedule sleeps in epoll with microsecond precision.
struct Timer {
    fd: OwnedFd,
}

impl Timer {
    fn new() -> io::Result<Timer> {
        // SAFETY: timerfd_create has no memory preconditions; a non-negative result is a fresh
        // descriptor that we own from here on.
        let fd = unsafe {
            libc::timerfd_create(
                libc::CLOCK_MONOTONIC,
                libc::TFD_NONBLOCK | libc::TFD_CLOEXEC,
            )
        };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: fd was just returned by timerfd_create and nothing else owns it.
        Ok(Timer {
            fd: unsafe { OwnedFd::from_raw_fd(fd) },
        })
    }

    /// Fire once, `after` from now (at least 1 ns: zero would disarm it).
    fn arm_in(&self, after: Duration) -> io::Result<()> {
        let after = after.max(Duration::from_nanos(1));
        let spec = libc::itimerspec {
            it_interval: libc::timespec {
                tv_sec: 0,
                tv_nsec: 0,
            },
            it_value: libc::timespec {
                tv_sec: after.as_secs() as libc::time_t,
                tv_nsec: after.subsec_nanos() as libc::c_long,
            },
        };
        // SAFETY: spec is a valid itimerspec; a null old_value is allowed.
        let rc =
            unsafe { libc::timerfd_settime(self.fd.as_raw_fd(), 0, &spec, std::ptr::null_mut()) };
        if rc != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    /// Consume the expiry so the next one is a new readiness edge.
    fn clear(&self) {
        let mut ticks = [0u8; 8];
        // SAFETY: reads at most 8 bytes into an 8-byte buffer; EAGAIN is harmless.
        unsafe {
            libc::read(self.fd.as_raw_fd(), ticks.as_mut_ptr().cast(), ticks.len());
        }
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
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
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
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    Some((utime + stime) / hz.max(1) as f64)
}
