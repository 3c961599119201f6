//! The Graphite push, as the seed's monitor fiber does it: every interval, one line per figure,
//! `queue.stats.<name> <value> <unix_seconds>\n`, to Graphite's plaintext port over TCP or UDP.
//!
//! It is a component the event loop drives, never a thread and never a blocking call: the loop
//! registers its socket ([`Graphite::register`]), hands it the socket's readiness
//! ([`Graphite::on_event`]), sleeps no longer than [`Graphite::next_timer`], and calls
//! [`Graphite::tick`] with the figures when that time comes. The TCP connect is non-blocking;
//! lines wait in a bounded buffer while Graphite is slow or away (a sample that does not fit is
//! dropped and counted); a broken or refused connection is retried with exponential backoff.
//! Gathering the figures is the loop's job ([`Snapshot`]); this file owns only the socket.

use std::fmt;
use std::io::{self, Read, Write};
use std::net::{SocketAddr, ToSocketAddrs};
use std::str::FromStr;

use mio::event::Event;
use mio::net::{TcpStream, UdpSocket};
use mio::{Interest, Registry, Token};
use tarq_engine::Micros;
use tracing::{debug, info, warn};

use super::stats::Snapshot;

/// Default `--graphite-interval`: the seed pushes once a second.
pub const DEFAULT_INTERVAL: Micros = 1_000_000;

/// Shortest interval accepted: pushes faster than this would cost the loop more than they tell.
pub const MIN_INTERVAL: Micros = 10_000;

/// Lines waiting for a slow or absent Graphite. A sample is about 1 KiB, so this keeps about a
/// minute of one-second samples across a Graphite restart, and no more: past it a sample is
/// dropped rather than the buffer grown.
pub const MAX_BUFFER_BYTES: usize = 64 * 1024;

/// One UDP datagram at most: below the common 1500-byte Ethernet MTU after IP/UDP headers, so a
/// datagram is never fragmented (a lost fragment loses the whole datagram).
pub const MAX_DATAGRAM_BYTES: usize = 1400;

/// First wait before reconnecting after a failure: short, since a restarting carbon is usually
/// back quickly.
pub const BACKOFF_START: Micros = 100_000;

/// Longest wait between reconnects: a Graphite that is down for good costs one connect attempt
/// per half minute.
pub const BACKOFF_MAX: Micros = 30_000_000;

/// Bytes read (and thrown away) per read: Graphite sends nothing, a read only notices a close.
const DISCARD_CHUNK: usize = 512;

/// The transport of `--graphite`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Proto {
    Tcp,
    Udp,
}

/// Where to push: `tcp://HOST:PORT` or `udp://HOST:PORT`. The host is resolved once, when the
/// target is parsed (at start and at reload), never on the loop.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Target {
    pub proto: Proto,
    pub addr: SocketAddr,
}

/// A `--graphite` value that cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TargetError {
    #[error("graphite target '{0}' must start with tcp:// or udp://")]
    Scheme(String),
    #[error("graphite target '{0}' must be HOST:PORT after the scheme")]
    Address(String),
    #[error("graphite target '{target}': cannot resolve the host: {reason}")]
    Resolve { target: String, reason: String },
}

impl FromStr for Target {
    type Err = TargetError;

    fn from_str(s: &str) -> Result<Target, TargetError> {
        let (proto, rest) = if let Some(rest) = s.strip_prefix("tcp://") {
            (Proto::Tcp, rest)
        } else if let Some(rest) = s.strip_prefix("udp://") {
            (Proto::Udp, rest)
        } else {
            return Err(TargetError::Scheme(s.to_string()));
        };
        let rest = rest.trim_end_matches('/');
        let port_ok = rest
            .rsplit_once(':')
            .is_some_and(|(host, port)| !host.is_empty() && port.parse::<u16>().is_ok());
        if !port_ok {
            return Err(TargetError::Address(s.to_string()));
        }
        let addr = rest
            .to_socket_addrs()
            .map_err(|e| TargetError::Resolve {
                target: s.to_string(),
                reason: e.to_string(),
            })?
            .next()
            .ok_or_else(|| TargetError::Resolve {
                target: s.to_string(),
                reason: "no address".into(),
            })?;
        Ok(Target { proto, addr })
    }
}

impl fmt::Display for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let scheme = match self.proto {
            Proto::Tcp => "tcp",
            Proto::Udp => "udp",
        };
        write!(f, "{scheme}://{}", self.addr)
    }
}

/// The socket's state.
enum Link {
    /// Nothing open: before `register`, or waiting to retry.
    Down,
    /// A TCP connect in progress.
    Connecting(TcpStream),
    Tcp(TcpStream),
    Udp(UdpSocket),
}

/// Counts kept for the operator (shown on the Prometheus page).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct GraphiteCounters {
    /// Samples put into the buffer.
    pub samples: u64,
    /// Samples dropped: the buffer was full, or a datagram could not be sent.
    pub dropped: u64,
    /// Connections made (TCP).
    pub connects: u64,
}

/// The Graphite pusher. See the module doc for how the loop drives it.
pub struct Graphite {
    target: Target,
    interval: Micros,
    token: Token,
    registry: Option<Registry>,
    link: Link,
    /// Lines not sent yet. Starts at a line boundary, except when `mid_line`.
    out: Vec<u8>,
    /// The last write stopped inside a line: a new connection must not get its tail.
    mid_line: bool,
    /// One sample's lines, rendered before it is known whether they fit.
    scratch: Vec<u8>,
    next_push: Micros,
    retry_at: Option<Micros>,
    backoff: Micros,
    /// Failures since the last success: only the first of a streak is logged as a warning.
    failures: u32,
    counters: GraphiteCounters,
}

impl Graphite {
    /// A pusher to `target` every `interval` (at least [`MIN_INTERVAL`]); nothing is opened
    /// until [`register`](Self::register).
    pub fn new(target: Target, interval: Micros, now: Micros) -> Graphite {
        let interval = interval.max(MIN_INTERVAL);
        Graphite {
            target,
            interval,
            token: Token(usize::MAX),
            registry: None,
            link: Link::Down,
            out: Vec::new(),
            mid_line: false,
            scratch: Vec::new(),
            next_push: now + interval,
            retry_at: None,
            backoff: BACKOFF_START,
            failures: 0,
            counters: GraphiteCounters::default(),
        }
    }

    pub fn target(&self) -> Target {
        self.target
    }

    pub fn interval(&self) -> Micros {
        self.interval
    }

    pub fn counters(&self) -> GraphiteCounters {
        self.counters
    }

    /// Whether a TCP connection is up (always false for UDP).
    pub fn is_connected(&self) -> bool {
        matches!(self.link, Link::Tcp(_))
    }

    /// Bytes waiting to be sent.
    pub fn buffered(&self) -> usize {
        self.out.len()
    }

    /// Attaches the pusher to the loop's registry under `token` and opens the socket. A failure
    /// to open is not an error here: it is retried like any other.
    pub fn register(&mut self, registry: &Registry, token: Token, now: Micros) -> io::Result<()> {
        self.registry = Some(registry.try_clone()?);
        self.token = token;
        self.open(now);
        Ok(())
    }

    /// Points the pusher somewhere else (a reload): the old socket is closed and what was
    /// buffered for the old target is dropped.
    pub fn retarget(&mut self, target: Target, interval: Micros, now: Micros) {
        let interval = interval.max(MIN_INTERVAL);
        if interval != self.interval {
            self.interval = interval;
            self.next_push = now + interval;
        }
        if target != self.target {
            self.close();
            self.target = target;
            self.out.clear();
            self.mid_line = false;
            self.backoff = BACKOFF_START;
            self.failures = 0;
            self.open(now);
        }
    }

    /// When the loop must call [`tick`](Self::tick) next.
    pub fn next_timer(&self) -> Option<Micros> {
        Some(match self.retry_at {
            Some(r) => r.min(self.next_push),
            None => self.next_push,
        })
    }

    /// Readiness of the pusher's socket.
    pub fn on_event(&mut self, event: &Event, now: Micros) {
        if event.token() != self.token {
            return;
        }
        if let Link::Connecting(stream) = &self.link {
            // mio's recipe for a non-blocking connect: writable (or an error) means it is over;
            // an error or no peer means it failed, `NotConnected` means not yet.
            let outcome = match stream.take_error() {
                Ok(Some(e)) | Err(e) => Err(e),
                Ok(None) => match stream.peer_addr() {
                    Ok(_) => Ok(true),
                    Err(e) if e.kind() == io::ErrorKind::NotConnected => Ok(false),
                    Err(e) => Err(e),
                },
            };
            match outcome {
                Ok(false) => return,
                Ok(true) => {
                    let Link::Connecting(stream) = std::mem::replace(&mut self.link, Link::Down)
                    else {
                        unreachable!("matched above")
                    };
                    self.link = Link::Tcp(stream);
                    self.counters.connects += 1;
                    if self.failures > 0 {
                        info!(target = %self.target, "graphite connected");
                    } else {
                        debug!(target = %self.target, "graphite connected");
                    }
                    self.failures = 0;
                    self.backoff = BACKOFF_START;
                }
                Err(e) => return self.fail(now, "cannot connect", &e),
            }
        }
        if let Link::Tcp(stream) = &mut self.link {
            if event.is_readable() || event.is_read_closed() || event.is_error() {
                let mut chunk = [0u8; DISCARD_CHUNK];
                loop {
                    match stream.read(&mut chunk) {
                        Ok(0) => {
                            let e = io::Error::from(io::ErrorKind::UnexpectedEof);
                            return self.fail(now, "connection closed by graphite", &e);
                        }
                        Ok(_) => {}
                        Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                        Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                        Err(e) => return self.fail(now, "connection lost", &e),
                    }
                }
            }
        }
        self.flush(now);
    }

    /// Does what is due at `now`: a reconnect, and a sample of `stats` when the interval is up.
    pub fn tick(&mut self, now: Micros, stats: &Snapshot) {
        if self.retry_at.is_some_and(|r| r <= now) {
            self.retry_at = None;
            self.open(now);
        }
        // The clock stepped back: restart the cadence from now instead of going quiet.
        if self.next_push > now + self.interval {
            self.next_push = now + self.interval;
        }
        if now >= self.next_push {
            self.next_push += self.interval;
            // Behind by more than one interval (a stall): restart the cadence from now instead
            // of pushing a burst of samples with the same figures.
            if self.next_push <= now {
                self.next_push = now + self.interval;
            }
            self.sample(now, stats);
            self.flush(now);
        }
    }

    /// Appends one sample's lines, or drops the sample when the buffer has no room for it.
    fn sample(&mut self, now: Micros, stats: &Snapshot) {
        use std::io::Write as _;
        let seconds = now / 1_000_000;
        self.scratch.clear();
        for m in stats.metrics() {
            // Writing into a Vec cannot fail.
            let _ = writeln!(self.scratch, "queue.stats.{} {} {seconds}", m.name, m.value);
        }
        for t in &stats.tubes {
            let tube = crate::tubes::graphite_path(&t.name, t.partition);
            for m in crate::tubes::tube_metrics(&t.stats) {
                let _ = writeln!(
                    self.scratch,
                    "queue.stats.{tube}.{} {} {seconds}",
                    m.name, m.value
                );
            }
        }
        if self.out.len() + self.scratch.len() > MAX_BUFFER_BYTES {
            self.counters.dropped += 1;
            if self.counters.dropped.is_power_of_two() {
                warn!(
                    target = %self.target,
                    dropped = self.counters.dropped,
                    limit = MAX_BUFFER_BYTES,
                    "graphite is not keeping up: samples dropped"
                );
            }
            return;
        }
        self.out.extend_from_slice(&self.scratch);
        self.counters.samples += 1;
    }

    /// Sends what the socket takes now.
    fn flush(&mut self, now: Micros) {
        match &mut self.link {
            Link::Down | Link::Connecting(_) => {}
            Link::Tcp(stream) => {
                let mut sent = 0;
                let mut error = None;
                while sent < self.out.len() {
                    match stream.write(&self.out[sent..]) {
                        Ok(0) => {
                            error = Some(io::Error::from(io::ErrorKind::WriteZero));
                            break;
                        }
                        Ok(n) => sent += n,
                        Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                        Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                        Err(e) => {
                            error = Some(e);
                            break;
                        }
                    }
                }
                if sent > 0 {
                    self.mid_line = self.out[sent - 1] != b'\n';
                    self.out.drain(..sent);
                }
                if let Some(e) = error {
                    self.fail(now, "write failed", &e);
                }
            }
            Link::Udp(socket) => {
                while !self.out.is_empty() {
                    let len = datagram_len(&self.out);
                    match socket.send(&self.out[..len]) {
                        Ok(_) => {}
                        Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                        Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                        Err(e) => {
                            // Typically ECONNREFUSED from an earlier datagram: nobody listens.
                            // UDP has no connection to retry; the datagram is lost.
                            self.counters.dropped += 1;
                            self.failures += 1;
                            if self.failures == 1 {
                                warn!(target = %self.target, error = %e, "graphite send failed");
                            }
                        }
                    }
                    self.out.drain(..len);
                }
            }
        }
    }

    /// Opens the socket; a failure schedules a retry.
    fn open(&mut self, now: Micros) {
        let Some(registry) = &self.registry else {
            return;
        };
        let opened = match self.target.proto {
            Proto::Tcp => TcpStream::connect(self.target.addr).and_then(|mut s| {
                registry.register(&mut s, self.token, Interest::READABLE | Interest::WRITABLE)?;
                Ok(Link::Connecting(s))
            }),
            Proto::Udp => {
                let local: SocketAddr = if self.target.addr.is_ipv4() {
                    (std::net::Ipv4Addr::UNSPECIFIED, 0).into()
                } else {
                    (std::net::Ipv6Addr::UNSPECIFIED, 0).into()
                };
                UdpSocket::bind(local).and_then(|s| {
                    s.connect(self.target.addr)?;
                    Ok(Link::Udp(s))
                })
            }
        };
        match opened {
            Ok(link) => {
                self.link = link;
                if matches!(self.link, Link::Udp(_)) {
                    self.failures = 0;
                }
                self.flush(now);
            }
            Err(e) => self.fail(now, "cannot open a socket", &e),
        }
    }

    fn close(&mut self) {
        let link = std::mem::replace(&mut self.link, Link::Down);
        if let (Some(registry), Link::Connecting(mut s) | Link::Tcp(mut s)) = (&self.registry, link)
        {
            // The socket is dropped right after: a failed deregister changes nothing.
            let _ = registry.deregister(&mut s);
        }
    }

    /// Closes the link and schedules a reconnect after the current backoff, which doubles.
    fn fail(&mut self, now: Micros, what: &str, e: &io::Error) {
        self.close();
        if self.mid_line {
            // The head of the buffer is the tail of a line the old connection got half of.
            let cut = self
                .out
                .iter()
                .position(|&b| b == b'\n')
                .map_or(0, |i| i + 1);
            self.out.drain(..cut);
            self.mid_line = false;
        }
        self.failures += 1;
        let delay = self.backoff;
        self.backoff = (self.backoff * 2).min(BACKOFF_MAX);
        self.retry_at = Some(now + delay);
        if self.failures == 1 {
            warn!(target = %self.target, error = %e, retry_ms = delay / 1000, "graphite: {what}");
        } else {
            debug!(target = %self.target, error = %e, retry_ms = delay / 1000, "graphite: {what}");
        }
    }
}

/// Bytes of `buf` for the next datagram: whole lines up to [`MAX_DATAGRAM_BYTES`] (a longer
/// single line goes alone, cut at the limit).
fn datagram_len(buf: &[u8]) -> usize {
    if buf.len() <= MAX_DATAGRAM_BYTES {
        return buf.len();
    }
    match buf[..MAX_DATAGRAM_BYTES].iter().rposition(|&b| b == b'\n') {
        Some(i) => i + 1,
        None => MAX_DATAGRAM_BYTES,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn targets_parse_and_name_what_is_wrong() {
        let t: Target = "tcp://127.0.0.1:2003".parse().unwrap();
        assert_eq!(t.proto, Proto::Tcp);
        assert_eq!(t.addr, "127.0.0.1:2003".parse().unwrap());
        assert_eq!(t.to_string(), "tcp://127.0.0.1:2003");
        let u: Target = "udp://localhost:2003/".parse().unwrap();
        assert_eq!(u.proto, Proto::Udp);
        assert_eq!(u.addr.port(), 2003);
        for (bad, want) in [
            ("127.0.0.1:2003", "must start with tcp:// or udp://"),
            ("http://127.0.0.1:2003", "must start with tcp:// or udp://"),
            ("tcp://127.0.0.1", "must be HOST:PORT"),
            ("tcp://:2003", "must be HOST:PORT"),
            ("tcp://127.0.0.1:99999", "must be HOST:PORT"),
        ] {
            let e = bad.parse::<Target>().unwrap_err().to_string();
            assert!(e.contains(want) && e.contains(bad), "{bad}: {e}");
        }
    }

    #[test]
    fn datagrams_cut_at_line_boundaries() {
        let line = b"queue.stats.ready 1 1700000000\n";
        let buf: Vec<u8> = line
            .iter()
            .copied()
            .cycle()
            .take(line.len() * 100)
            .collect();
        let n = datagram_len(&buf);
        assert!(
            n <= MAX_DATAGRAM_BYTES && n.is_multiple_of(line.len()),
            "{n}"
        );
        assert_eq!(datagram_len(&buf[..line.len() * 3]), line.len() * 3);
        let long = vec![b'x'; MAX_DATAGRAM_BYTES * 2];
        assert_eq!(datagram_len(&long), MAX_DATAGRAM_BYTES);
    }

    #[test]
    fn a_full_buffer_drops_samples_instead_of_growing() {
        // Never registered: the link stays down, as with a Graphite that is away.
        let mut g = Graphite::new("tcp://127.0.0.1:9".parse().unwrap(), DEFAULT_INTERVAL, 0);
        let stats = Snapshot::default();
        let mut now = 0;
        for _ in 0..10_000 {
            now += DEFAULT_INTERVAL;
            g.tick(now, &stats);
            assert!(g.buffered() <= MAX_BUFFER_BYTES);
        }
        let c = g.counters();
        assert!(c.samples > 0 && c.dropped > 0, "{c:?}");
        assert_eq!(c.samples + c.dropped, 10_000);
    }

    #[test]
    fn the_cadence_survives_stalls_and_clock_steps() {
        const T0: Micros = 1_700_000_000_000_000;
        const S: Micros = 1_000_000;
        let mut g = Graphite::new("udp://127.0.0.1:9".parse().unwrap(), S, T0);
        let stats = Snapshot::default();
        assert_eq!(g.next_timer(), Some(T0 + S));
        g.tick(T0 + S - 1, &stats);
        assert_eq!(g.counters().samples, 0, "not due yet");
        g.tick(T0 + S, &stats);
        assert_eq!(g.counters().samples, 1);
        assert_eq!(g.next_timer(), Some(T0 + 2 * S));
        // A 10 s stall: one sample, then the cadence restarts from now.
        g.tick(T0 + 12 * S + 500, &stats);
        assert_eq!(g.counters().samples, 2);
        assert_eq!(g.next_timer(), Some(T0 + 13 * S + 500));
        // The clock stepped back an hour: the next push is one interval away, not an hour.
        let back = T0 - 3600 * S;
        g.tick(back, &stats);
        assert_eq!(g.next_timer(), Some(back + S));
    }

    #[test]
    fn a_partition_has_a_path_of_its_own() {
        let mut g = Graphite::new("udp://127.0.0.1:9".parse().unwrap(), DEFAULT_INTERVAL, 0);
        let figures = |name: &str, partition| crate::stats::TubeFigures {
            name: name.into(),
            partition,
            stats: tarq_engine::Stats::default(),
        };
        let stats = Snapshot {
            tubes: vec![figures("a.b", None), figures("jobs", Some(2))],
            ..Default::default()
        };
        g.sample(3_000_000, &stats);
        let text = String::from_utf8(g.out.clone()).unwrap();
        assert!(text.contains("\nqueue.stats.a_b.ready 0 3\n"), "{text}");
        assert!(
            text.contains("\nqueue.stats.jobs.partition.2.ready 0 3\n"),
            "{text}"
        );
    }
}
