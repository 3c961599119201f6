//! The loop's side of the HTTP port (`--http-listen`): its listener, the per-second sample of
//! the live figures ([`tarq_ops::live::Live`]) and the event streams that carry it. An HTTP
//! connection is one of the loop's connections like any other — the same slots, limits, read
//! budget and write backlog — whose input goes to the HTTP front-end
//! ([`crate::frontend::http`]); what is left here is what only the loop can do: accept, tick
//! once a second, and write each tick's event into every open stream. On a sharded node the
//! tick asks the partitions' owners instead, and the event goes out once they have answered
//! (`shards::console`).

use std::io;
use std::net::SocketAddr;

use mio::net::TcpListener;
use mio::{Interest, Poll, Token};
use tarq_engine::Micros;
use tarq_ops::live::Live;
use tracing::{info, warn};

use super::timers::Timer;
use super::Server;
use crate::frontend::http::{self, MAX_EVENT_STREAMS};

/// The HTTP port's listener.
pub(super) const HTTP_LISTENER: Token = Token(3);

/// One tick of the live figures a second (monotonic µs).
const TICK: Micros = 1_000_000;

/// What the loop keeps for the HTTP port.
#[derive(Default)]
pub(crate) struct HttpPort {
    pub listener: Option<TcpListener>,
    /// The HTTP front-end's counts.
    pub state: http::HttpState,
    /// The last 15 minutes of per-second figures.
    pub live: Live,
    /// Connections carrying the event stream: (slot, generation).
    pub streams: Vec<(usize, u32)>,
    /// The event's text (reused).
    event: String,
    /// Ticks taken, and the loop's time they took (sampling and writing the events), in ns:
    /// what open dashboards cost the loop, shown by `/api/server`.
    pub ticks: u64,
    pub tick_nanos: u64,
}

/// Binds `--http-listen`, registered with `poll`, answering the `Host` names `hosts`
/// (`--http-host`).
pub(super) fn bind(
    addr: Option<SocketAddr>,
    hosts: &[String],
    poll: &Poll,
) -> io::Result<HttpPort> {
    let Some(addr) = addr else {
        return Ok(HttpPort::default());
    };
    let mut l = TcpListener::bind(addr).map_err(|e| {
        let why = format!("cannot listen on {addr} (--http-listen): {e}");
        io::Error::new(e.kind(), why)
    })?;
    poll.registry()
        .register(&mut l, HTTP_LISTENER, Interest::READABLE)?;
    let state = http::HttpState {
        hosts: http::Hosts::new(hosts, addr.ip().is_loopback()),
        ..http::HttpState::default()
    };
    Ok(HttpPort {
        listener: Some(l),
        state,
        ..HttpPort::default()
    })
}

impl Server {
    /// The bound HTTP address, when `--http-listen` is set (useful with port 0).
    pub fn http_addr(&self) -> Option<SocketAddr> {
        (self.http.listener.as_ref()).and_then(|l| l.local_addr().ok())
    }

    /// Logs where the console is served.
    pub(super) fn announce_http(&self) {
        if let Some(addr) = self.http_addr() {
            info!(listen = %addr, read_only = self.cfg.auth.is_none(), "serving the web console at /, the JSON API at /api/");
            info!(listen = %addr, "serving Prometheus metrics at /metrics");
            if self.http.state.hosts.any() {
                warn!(
                    listen = %addr,
                    "the HTTP port is on a network address and answers any Host name: a page \
                     of another site could reach it by pointing its name here (DNS \
                     rebinding); set http-host to the names clients use"
                );
            }
        }
    }

    /// The first tick, a second after start, when the port is served.
    pub(super) fn register_live(&mut self) {
        let at = self.http.listener.as_ref().map(|_| self.mono + TICK);
        self.timers.set(Timer::Live, at);
    }

    /// A second has passed: samples the figures, writes the event to every stream.
    pub(super) fn live_tick(&mut self) {
        let Some(due) = self.timers.get(Timer::Live) else {
            return;
        };
        if due > self.mono {
            return;
        }
        // The next tick a second after this one, or after now when the loop was late.
        let next = (due + TICK).max(self.mono + TICK / 2);
        self.timers.set(Timer::Live, Some(next));
        // Two clock reads a second: what the console costs the loop, measured where it is paid.
        let started = std::time::Instant::now();
        self.sample_and_send();
        self.http.ticks += 1;
        self.http.tick_nanos += started.elapsed().as_nanos() as u64;
    }

    /// The tick's work: the sample, and its event into every stream. A sharded node's sample
    /// is the whole cluster's, taken once the owners have answered (`shards::console`).
    fn sample_and_send(&mut self) {
        let second = self.now / 1_000_000;
        if self
            .with_router(|r, cx| r.console_tick(cx, second))
            .is_some()
        {
            return;
        }
        let queue = self.core.queue();
        // A partitioned tube's other partitions share its name: they count in the whole
        // queue's figures, and a tube's own are its first partition's (the one named).
        self.http.live.sample(
            second,
            queue.tubes().map(|t| {
                let name = (t.opts.part == 0).then_some(t.name);
                (name, queue.tube_stats(t.ix).unwrap_or_default())
            }),
        );
        self.send_live_event();
    }

    /// The newest second's event into every open stream.
    pub(super) fn send_live_event(&mut self) {
        let conns = &self.conns;
        self.http.streams.retain(|&(idx, gen)| {
            conns
                .get(idx)
                .is_some_and(|c| c.gen == gen && c.closing.is_none())
        });
        if self.http.streams.is_empty() {
            return;
        }
        let mut event = std::mem::take(&mut self.http.event);
        event.clear();
        self.http.live.event_json(&mut event);
        for i in 0..self.http.streams.len() {
            let (idx, _) = self.http.streams[i];
            self.conns.mark_flush(idx);
            http::event(&mut self.conns[idx].out.out, &event);
        }
        self.http.event = event;
    }

    /// Connection `idx` carries the event stream from now on; `Err(open)` at the limit.
    pub(crate) fn start_stream(&mut self, idx: usize) -> Result<(), usize> {
        let conns = &self.conns;
        self.http.streams.retain(|&(i, gen)| {
            conns
                .get(i)
                .is_some_and(|c| c.gen == gen && c.closing.is_none())
        });
        if self.http.streams.len() >= MAX_EVENT_STREAMS {
            return Err(self.http.streams.len());
        }
        let c = &mut self.conns[idx];
        if let Some(h) = c.http_mut() {
            h.streaming = true;
        }
        self.http.streams.push((idx, c.gen));
        Ok(())
    }

    /// The Prometheus page, as `/metrics` shows it.
    pub(crate) fn metrics_page(&self, page: &mut String) {
        let snapshot = self.snapshot();
        let graphite = self.ops.graphite().map(|g| g.counters());
        tarq_ops::metrics::render(page, &snapshot, &self.ops.service, graphite);
    }

    /// Open connections by protocol, and the event streams among the HTTP ones.
    pub(crate) fn connection_counts(&self) -> serde_json::Value {
        let (mut iproto, mut relays, mut beanstalk, mut web, mut links) = (0u64, 0, 0, 0, 0);
        for (_, c) in self.conns.iter() {
            match c.proto {
                super::conn::Protocol::Iproto { .. } => iproto += 1,
                super::conn::Protocol::Relay(_) => relays += 1,
                super::conn::Protocol::Beanstalk(_) => beanstalk += 1,
                super::conn::Protocol::Http(_) => web += 1,
                super::conn::Protocol::Link(_) => links += 1,
            }
        }
        serde_json::json!({
            "total": self.conns.len(),
            "iproto": iproto,
            "replicas": relays,
            "beanstalk": beanstalk,
            "http": web,
            "shard_links": links,
            "event_streams": self.http.streams.len(),
        })
    }

    /// The HTTP port's own figures: requests, refusals, and what the live figures cost the
    /// loop.
    pub(crate) fn console_figures(&self) -> serde_json::Value {
        let h = &self.http;
        serde_json::json!({
            "requests": h.state.requests,
            "errors": h.state.errors,
            "event_streams": h.streams.len(),
            "live_ticks": h.ticks,
            "live_tick_seconds": h.tick_nanos as f64 / 1e9,
        })
    }
}
