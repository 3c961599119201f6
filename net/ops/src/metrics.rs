//! `--metrics-listen`: `GET /metrics` in the Prometheus text format, served by a tiny
//! non-blocking HTTP/1.x handler on the event loop (bounded request size, one response, close),
//! and [`ServiceTimes`], the histogram of request service time the loop feeds per request.
//!
//! The page is the shared figure list ([`Snapshot::metrics`]: gauges and counters under
//! `tarq_<name>`), the service-time histogram, and the Graphite pusher's own counters. The loop
//! owns the figures: a request that needs them waits (`wants_stats`) until the loop's next
//! [`MetricsServer::respond`] call renders the page once for every waiting client.
//!
//! Its clients are under the same limits as the server's other connections, through
//! [`Admission`] (the server's limits implement it): counted against the per-address cap, and
//! each closure by its deadline counted. Their input needs no share of the input budget: it is
//! capped here at [`MAX_HTTP_CLIENTS`] × [`MAX_REQUEST_BYTES`].

use std::fmt::Write as _;
use std::io::{self, Read, Write};
use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use mio::event::Event;
use mio::net::{TcpListener, TcpStream};
use mio::{Interest, Registry, Token};
use slab::Slab;
use tarq_engine::Micros;
use tracing::{debug, info};

use super::graphite::GraphiteCounters;
use super::stats::{Kind, Snapshot};

/// Buckets of [`ServiceTimes`]: upper bounds 1 µs · 2^k for k in 0..BUCKETS, so 1 µs to about
/// 1 s; a request slower than a second lands in `+Inf`, and one second is already an outage
/// for a queue answering in microseconds.
pub const BUCKETS: usize = 21;

/// Most HTTP clients at once. A scraper opens one connection per scrape; a handful covers a
/// Prometheus pair and a curl, and bounds what idle sockets can hold.
pub const MAX_HTTP_CLIENTS: usize = 16;

/// Largest request head accepted. A scrape's `GET /metrics` with its headers is a few hundred
/// bytes; 8 KiB is the common server default, and bounds each client's buffer.
pub const MAX_REQUEST_BYTES: usize = 8 * 1024;

/// A client that has not finished its request, or read its response, within this is closed, so
/// a stuck scraper cannot hold a slot for ever.
pub const HTTP_TIMEOUT: Micros = 5_000_000;

/// What the server's connection limits offer this endpoint: the per-address count and the
/// closure counts shared with every other front-end.
pub trait Admission {
    /// Counts a new client from `peer`, or refuses it with the reason.
    fn admit(&mut self, peer: IpAddr) -> Result<(), String>;
    /// A client admitted from `peer` is gone.
    fn release(&mut self, peer: IpAddr);
    /// A client was closed for not finishing its exchange in time.
    fn timed_out(&mut self);
}

/// Bytes read per read call.
const READ_CHUNK: usize = 2048;

/// The histogram's name on the page.
const SERVICE_TIME: &str = "tarq_request_duration_seconds";

/// One request in this many is timed. A clock read costs 20-60 ns, a request about 1 µs at
/// the target rate: timing every request would cost the loop several percent, one in 16 costs
/// a fraction of one, and thousands of timed requests a second still draw the distribution.
/// A power of two, so the check is a mask.
pub const TIME_ONE_IN: u64 = 16;

/// Histogram of request service time, with fixed power-of-two buckets so that recording is a
/// division, a `leading_zeros` and an increment; every request is counted, one in
/// [`TIME_ONE_IN`] is timed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServiceTimes {
    /// `counts[k]` holds timed requests that took at most 2^k µs and more than 2^(k-1) µs;
    /// `counts[BUCKETS]` holds the slower ones.
    counts: [u64; BUCKETS + 1],
    sum_nanos: u64,
    /// Every request executed since start.
    requests: u64,
}

impl Default for ServiceTimes {
    fn default() -> Self {
        ServiceTimes {
            counts: [0; BUCKETS + 1],
            sum_nanos: 0,
            requests: 0,
        }
    }
}

impl ServiceTimes {
    /// Counts a request about to run; true when this one is to be timed.
    #[inline]
    pub fn count_request(&mut self) -> bool {
        self.requests += 1;
        self.requests & (TIME_ONE_IN - 1) == 0
    }

    /// Requests executed since start.
    pub fn requests(&self) -> u64 {
        self.requests
    }

    /// Counts one request that took `nanos` nanoseconds.
    #[inline]
    pub fn record_nanos(&mut self, nanos: u64) {
        let micros = nanos.div_ceil(1000);
        let k = if micros <= 1 {
            0
        } else {
            (u64::BITS - (micros - 1).leading_zeros()) as usize
        };
        self.counts[k.min(BUCKETS)] += 1;
        self.sum_nanos = self.sum_nanos.wrapping_add(nanos);
    }

    #[inline]
    pub fn record(&mut self, d: Duration) {
        self.record_nanos(d.as_nanos().min(u128::from(u64::MAX)) as u64);
    }

    /// Requests timed.
    pub fn count(&self) -> u64 {
        self.counts.iter().sum()
    }

    /// Upper bound of bucket `k` in seconds.
    fn bound(k: usize) -> f64 {
        (1u64 << k) as f64 / 1e6
    }

    /// Appends the histogram in the Prometheus text format.
    fn render(&self, page: &mut String) {
        let _ = writeln!(
            page,
            "# HELP {SERVICE_TIME} Time to execute one request, from its decoded frame to its \
             encoded reply (waits of parked takes excluded); one request in {TIME_ONE_IN} is \
             timed.\n# TYPE {SERVICE_TIME} histogram"
        );
        let mut cumulative = 0;
        for k in 0..BUCKETS {
            cumulative += self.counts[k];
            let _ = writeln!(
                page,
                "{SERVICE_TIME}_bucket{{le=\"{}\"}} {cumulative}",
                Self::bound(k)
            );
        }
        cumulative += self.counts[BUCKETS];
        let _ = writeln!(page, "{SERVICE_TIME}_bucket{{le=\"+Inf\"}} {cumulative}");
        let _ = writeln!(page, "{SERVICE_TIME}_sum {}", self.sum_nanos as f64 / 1e9);
        let _ = writeln!(page, "{SERVICE_TIME}_count {cumulative}");
    }
}

/// Renders the page into `page` (cleared first).
pub fn render(
    page: &mut String,
    stats: &Snapshot,
    service: &ServiceTimes,
    graphite: Option<GraphiteCounters>,
) {
    page.clear();
    for m in stats.metrics() {
        let (kind, suffix) = match m.kind {
            Kind::Gauge => ("gauge", ""),
            Kind::Counter => ("counter", "_total"),
        };
        let name = prometheus_name(m.name);
        let _ = writeln!(
            page,
            "# HELP tarq_{name}{suffix} {}\n# TYPE tarq_{name}{suffix} {kind}\ntarq_{name}{suffix} {}",
            m.help, m.value
        );
    }
    render_tubes(page, stats);
    service.render(page);
    if let Some(g) = graphite {
        for (name, help, value) in [
            (
                "samples",
                "Samples queued for Graphite since start.",
                g.samples,
            ),
            (
                "samples_dropped",
                "Samples dropped since start: Graphite away or slow and the buffer full.",
                g.dropped,
            ),
            (
                "connects",
                "Connections made to Graphite since start.",
                g.connects,
            ),
        ] {
            let _ = writeln!(
                page,
                "# HELP tarq_graphite_{name}_total {help}\n\
                 # TYPE tarq_graphite_{name}_total counter\ntarq_graphite_{name}_total {value}"
            );
        }
    }
}

/// A figure's name under Prometheus: `tarq_<name>`, except where that would read as something
/// else (`total`, the seed's count of tasks, would look like a counter's `_total` suffix).
/// Each per-tube figure as one family, `tarq_tube_<name>{tube="..."}`, a sample per tube; a
/// partition of a partitioned tube adds `partition="<p>"`, so each series is its own.
fn render_tubes(page: &mut String, stats: &Snapshot) {
    use crate::tubes::{prometheus_label, tube_metrics, TUBE_METRICS};
    if stats.tubes.is_empty() {
        return;
    }
    let figures: Vec<_> = stats.tubes.iter().map(|t| tube_metrics(&t.stats)).collect();
    for i in 0..TUBE_METRICS {
        let m = figures[0][i];
        let (kind, suffix) = match m.kind {
            Kind::Gauge => ("gauge", ""),
            Kind::Counter => ("counter", "_total"),
        };
        let name = format!("tarq_tube_{}{suffix}", prometheus_name(m.name));
        let _ = writeln!(page, "# HELP {name} {}\n# TYPE {name} {kind}", m.help);
        for (t, f) in stats.tubes.iter().zip(&figures) {
            let tube = prometheus_label(&t.name);
            let _ = match t.partition {
                None => writeln!(page, "{name}{{tube=\"{tube}\"}} {}", f[i].value),
                Some(p) => writeln!(
                    page,
                    "{name}{{tube=\"{tube}\",partition=\"{p}\"}} {}",
                    f[i].value
                ),
            };
        }
    }
}

fn prometheus_name(name: &str) -> &str {
    match name {
        "total" => "tasks",
        other => other,
    }
}

/// One HTTP client.
struct Client {
    stream: TcpStream,
    peer: SocketAddr,
    /// The request head, until it is complete.
    head: Vec<u8>,
    /// The response, once known.
    out: Vec<u8>,
    written: usize,
    /// Waiting for the page (the figures come from the loop).
    wants_stats: bool,
    /// The response is sent and the write side shut: reading until the client closes.
    draining: bool,
    deadline: Micros,
}

/// What a complete request head asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Route {
    Metrics,
    Status(u16, &'static str, &'static str),
}

/// The `/metrics` listener and its clients; see the module doc.
pub struct MetricsServer {
    listener: TcpListener,
    registry: Option<Registry>,
    /// The listener's token; client `i` has `base + 1 + i`.
    base: usize,
    clients: Slab<Client>,
    /// Some client waits for the page.
    wants_stats: bool,
    page: String,
}

impl MetricsServer {
    /// Binds `addr`. Nothing is served until [`register`](Self::register).
    pub fn bind(addr: SocketAddr) -> io::Result<MetricsServer> {
        let listener = TcpListener::bind(addr).map_err(|e| {
            io::Error::new(
                e.kind(),
                format!("cannot listen for metrics on {addr}: {e}"),
            )
        })?;
        Ok(MetricsServer {
            listener,
            registry: None,
            base: usize::MAX - MAX_HTTP_CLIENTS - 1,
            clients: Slab::with_capacity(MAX_HTTP_CLIENTS),
            wants_stats: false,
            page: String::new(),
        })
    }

    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        self.listener.local_addr()
    }

    /// Registers the listener under `base`; clients get `base + 1 ..= base + MAX_HTTP_CLIENTS`.
    pub fn register(&mut self, registry: &Registry, base: Token) -> io::Result<()> {
        registry.register(&mut self.listener, base, Interest::READABLE)?;
        self.registry = Some(registry.try_clone()?);
        self.base = base.0;
        Ok(())
    }

    /// Whether `token` is one of this server's.
    pub fn owns(&self, token: Token) -> bool {
        (self.base..=self.base + MAX_HTTP_CLIENTS).contains(&token.0)
    }

    /// Whether a client waits for the page: the loop then calls [`respond`](Self::respond).
    pub fn wants_stats(&self) -> bool {
        self.wants_stats
    }

    /// The earliest client deadline.
    pub fn next_timer(&self) -> Option<Micros> {
        self.clients.iter().map(|(_, c)| c.deadline).min()
    }

    pub fn on_event(&mut self, event: &Event, now: Micros, limits: &mut dyn Admission) {
        let t = event.token().0;
        if t == self.base {
            self.accept(now, limits);
        } else if let Some(idx) = t.checked_sub(self.base + 1) {
            if self.clients.contains(idx) {
                self.serve(idx, limits);
            }
        }
    }

    /// Closes clients past their deadline, counting each.
    pub fn tick(&mut self, now: Micros, limits: &mut dyn Admission) {
        let late: Vec<usize> = self
            .clients
            .iter()
            .filter(|(_, c)| c.deadline <= now)
            .map(|(i, _)| i)
            .collect();
        for idx in late {
            limits.timed_out();
            let peer = self.clients[idx].peer;
            info!(%peer, seconds = HTTP_TIMEOUT / 1_000_000, "metrics client timed out: closing");
            self.close(idx, limits);
        }
    }

    /// Renders the page once and answers every client waiting for it.
    pub fn respond(
        &mut self,
        stats: &Snapshot,
        service: &ServiceTimes,
        graphite: Option<GraphiteCounters>,
        limits: &mut dyn Admission,
    ) {
        if !self.wants_stats {
            return;
        }
        self.wants_stats = false;
        render(&mut self.page, stats, service, graphite);
        let waiting: Vec<usize> = self
            .clients
            .iter()
            .filter(|(_, c)| c.wants_stats)
            .map(|(i, _)| i)
            .collect();
        for idx in waiting {
            let c = &mut self.clients[idx];
            c.wants_stats = false;
            write_response(
                &mut c.out,
                200,
                "OK",
                "text/plain; version=0.0.4; charset=utf-8",
                self.page.as_bytes(),
            );
            self.serve(idx, limits);
        }
    }

    fn accept(&mut self, now: Micros, limits: &mut dyn Admission) {
        loop {
            match self.listener.accept() {
                Ok((mut stream, peer)) => {
                    if self.clients.len() >= MAX_HTTP_CLIENTS {
                        debug!(%peer, limit = MAX_HTTP_CLIENTS, "metrics client refused");
                        continue; // dropped: closed at once
                    }
                    if let Err(e) = limits.admit(peer.ip()) {
                        debug!(%peer, error = %e, "metrics client refused");
                        continue;
                    }
                    let entry = self.clients.vacant_entry();
                    let token = Token(self.base + 1 + entry.key());
                    let Some(registry) = &self.registry else {
                        return;
                    };
                    if registry
                        .register(&mut stream, token, Interest::READABLE | Interest::WRITABLE)
                        .is_err()
                    {
                        limits.release(peer.ip());
                        continue;
                    }
                    entry.insert(Client {
                        stream,
                        peer,
                        head: Vec::new(),
                        out: Vec::new(),
                        written: 0,
                        wants_stats: false,
                        draining: false,
                        deadline: now + HTTP_TIMEOUT,
                    });
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => {
                    debug!(error = %e, "metrics accept failed");
                    return;
                }
            }
        }
    }

    /// Reads the request head, then writes the response; closes when done or broken.
    fn serve(&mut self, idx: usize, limits: &mut dyn Admission) {
        let c = &mut self.clients[idx];
        if c.out.is_empty() && !c.wants_stats {
            let mut chunk = [0u8; READ_CHUNK];
            loop {
                match c.stream.read(&mut chunk) {
                    Ok(0) => return self.close(idx, limits),
                    Ok(n) => {
                        c.head.extend_from_slice(&chunk[..n]);
                        if let Some(route) = parse_head(&c.head) {
                            match route {
                                Route::Metrics => {
                                    c.wants_stats = true;
                                    self.wants_stats = true;
                                }
                                Route::Status(code, reason, body) => write_response(
                                    &mut c.out,
                                    code,
                                    reason,
                                    "text/plain; charset=utf-8",
                                    body.as_bytes(),
                                ),
                            }
                            break;
                        }
                        if c.head.len() > MAX_REQUEST_BYTES {
                            write_response(
                                &mut c.out,
                                431,
                                "Request Header Fields Too Large",
                                "text/plain; charset=utf-8",
                                b"request head over 8192 bytes\n",
                            );
                            break;
                        }
                    }
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    Err(_) => return self.close(idx, limits),
                }
            }
        }
        while c.written < c.out.len() {
            match c.stream.write(&c.out[c.written..]) {
                Ok(0) => return self.close(idx, limits),
                Ok(n) => c.written += n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => return self.close(idx, limits),
            }
        }
        if c.out.is_empty() {
            return;
        }
        // Sent. Closing with unread input would make the kernel answer with a reset that can
        // destroy the response before the client reads it (a 431 leaves most of a request
        // unread), so: half-close, drain what the client still sends, close at its EOF (or at
        // the deadline).
        if !c.draining {
            c.draining = true;
            let _ = c.stream.shutdown(std::net::Shutdown::Write);
        }
        let mut chunk = [0u8; READ_CHUNK];
        loop {
            match c.stream.read(&mut chunk) {
                Ok(0) => return self.close(idx, limits),
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => return self.close(idx, limits),
            }
        }
    }

    fn close(&mut self, idx: usize, limits: &mut dyn Admission) {
        let mut c = self.clients.remove(idx);
        limits.release(c.peer.ip());
        if let Some(registry) = &self.registry {
            // The socket is closed right after: a failed deregister changes nothing.
            let _ = registry.deregister(&mut c.stream);
        }
        if c.wants_stats {
            self.wants_stats = self.clients.iter().any(|(_, c)| c.wants_stats);
        }
    }
}

/// The route of a complete request head, or `None` while the head is incomplete.
fn parse_head(head: &[u8]) -> Option<Route> {
    let end = head.windows(4).position(|w| w == b"\r\n\r\n").or_else(|| {
        // Bare LF line ends, as a hand-typed request may have.
        head.windows(2).position(|w| w == b"\n\n")
    })?;
    let line_end = head.iter().position(|&b| b == b'\n').unwrap_or(end);
    let line = String::from_utf8_lossy(&head[..line_end]);
    let mut parts = line.split_whitespace();
    let (method, target) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
    let path = target.split('?').next().unwrap_or("");
    Some(match (method, path) {
        ("GET", "/metrics") => Route::Metrics,
        ("GET", "/") => Route::Status(200, "OK", "tarq: the figures are at /metrics\n"),
        ("GET", _) => Route::Status(404, "Not Found", "not found: try /metrics\n"),
        _ => Route::Status(405, "Method Not Allowed", "only GET is served\n"),
    })
}

fn write_response(out: &mut Vec<u8>, code: u16, reason: &str, ctype: &str, body: &[u8]) {
    out.clear();
    let _ = write!(
        out,
        "HTTP/1.1 {code} {reason}\r\nContent-Type: {ctype}\r\nContent-Length: {}\r\n\
         Connection: close\r\n",
        body.len()
    );
    if code == 405 {
        out.extend_from_slice(b"Allow: GET\r\n");
    }
    out.extend_from_slice(b"\r\n");
    out.extend_from_slice(body);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn service_times_land_in_power_of_two_buckets() {
        let mut h = ServiceTimes::default();
        // (nanoseconds, bucket): bucket k holds (2^(k-1), 2^k] microseconds.
        for (nanos, k) in [
            (0, 0),
            (1, 0),
            (1_000, 0),
            (1_001, 1),
            (2_000, 1),
            (2_001, 2),
            (4_000, 2),
            (1_000_000, 10),
            (1_048_576_000, 20),
            (1_048_576_001, 21),
            (u64::MAX, 21),
        ] {
            let before = h.counts[k];
            h.record_nanos(nanos);
            assert_eq!(
                h.counts[k],
                before + 1,
                "{nanos} ns should land in bucket {k}"
            );
        }
        assert_eq!(h.count(), 11);
        assert_eq!(ServiceTimes::bound(0), 0.000001);
        assert_eq!(ServiceTimes::bound(20), 1.048576);
    }

    #[test]
    fn every_request_is_counted_and_one_in_sixteen_timed() {
        let mut h = ServiceTimes::default();
        let timed = (0..TIME_ONE_IN * 10).filter(|_| h.count_request()).count();
        assert_eq!(timed, 10);
        assert_eq!(h.requests(), TIME_ONE_IN * 10);
        assert!(TIME_ONE_IN.is_power_of_two());
    }

    #[test]
    fn heads_route() {
        for (head, want) in [
            (
                &b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n"[..],
                Some(Route::Metrics),
            ),
            (b"GET /metrics?x=1 HTTP/1.0\n\n", Some(Route::Metrics)),
            (b"GET /metrics HTTP/1.1\r\nHost: x\r\n", None),
            (
                b"GET /nope HTTP/1.1\r\n\r\n",
                Some(Route::Status(404, "", "")),
            ),
            (
                b"POST /metrics HTTP/1.1\r\n\r\n",
                Some(Route::Status(405, "", "")),
            ),
            (b"\r\n\r\n", Some(Route::Status(405, "", ""))),
        ] {
            let got = parse_head(head).map(|r| match r {
                Route::Status(code, _, _) => Route::Status(code, "", ""),
                r => r,
            });
            assert_eq!(got, want, "{}", String::from_utf8_lossy(head));
        }
    }

    #[test]
    fn the_page_names_every_figure_once_with_its_type() {
        let mut snap = Snapshot::default();
        snap.engine.ready = 3;
        snap.engine.puts = 7;
        let mut h = ServiceTimes::default();
        h.record_nanos(1500);
        let mut page = String::new();
        render(&mut page, &snap, &h, Some(GraphiteCounters::default()));
        assert!(
            page.contains("# TYPE tarq_ready gauge\ntarq_ready 3\n"),
            "{page}"
        );
        assert!(page.contains("# TYPE tarq_puts_total counter\ntarq_puts_total 7\n"));
        assert!(page.contains("# TYPE tarq_tasks gauge\n"));
        assert!(page.contains("tarq_request_duration_seconds_bucket{le=\"0.000002\"} 1\n"));
        assert!(page.contains("tarq_request_duration_seconds_count 1\n"));
        assert!(page.contains("tarq_graphite_samples_dropped_total 0\n"));
        for m in snap.metrics() {
            let suffix = if m.kind == Kind::Counter {
                "_total"
            } else {
                ""
            };
            let line = format!("\ntarq_{}{suffix} {}\n", prometheus_name(m.name), m.value);
            assert_eq!(page.matches(&line).count(), 1, "{}", m.name);
            let n = page
                .matches(&format!("# TYPE tarq_{}{suffix} ", prometheus_name(m.name)))
                .count();
            assert_eq!(n, 1, "{}", m.name);
        }
    }

    #[test]
    fn partitions_of_one_tube_are_series_of_their_own() {
        let figures = |name: &str, partition, ready| crate::stats::TubeFigures {
            name: name.into(),
            partition,
            stats: tarq_engine::Stats {
                ready,
                ..Default::default()
            },
        };
        let snap = Snapshot {
            tubes: vec![
                figures("default", None, 1),
                figures("jobs", Some(0), 2),
                figures("jobs", Some(3), 5),
            ],
            ..Default::default()
        };
        let mut page = String::new();
        render(&mut page, &snap, &ServiceTimes::default(), None);
        assert!(
            page.contains(
                "# TYPE tarq_tube_ready gauge\n\
                 tarq_tube_ready{tube=\"default\"} 1\n\
                 tarq_tube_ready{tube=\"jobs\",partition=\"0\"} 2\n\
                 tarq_tube_ready{tube=\"jobs\",partition=\"3\"} 5\n"
            ),
            "{page}"
        );
    }
}
