//! Operating tarq: what an operator needs around the queue, kept apart from the request path.
//! It knows the engine's figures and plain data, never the server: the server hands it a
//! [`stats::Snapshot`] and routes its events here. Which settings a SIGHUP changes live is the
//! server's business (`tarq_net::server::reload`); `tarq ctl` lives with the binary.
//!
//! - [`stats`]: the one list of figures behind `queue.stats()`, Graphite and Prometheus;
//! - [`live`]: the per-second ring of figures behind the web console's charts and events;
//! - [`graphite`]: the periodic push to Graphite's plaintext port (TCP or UDP);
//! - [`metrics`]: the `/metrics` page for Prometheus (served by the HTTP port's front-end) and
//!   the request service-time histogram;
//! - [`signals`]: SIGTERM/SIGINT (graceful stop) and SIGHUP (reload) as loop events;
//! - [`logging`]: the log subscriber with a level that a reload can change;
//!
//! [`Ops`] bundles the loop-driven parts so the server loop deals with one value: it routes the
//! events of [`Ops::owns`] tokens to [`Ops::on_event`], sleeps no longer than
//! [`Ops::next_timer`], and when [`Ops::is_due`] hands a fresh [`stats::Snapshot`] to
//! [`Ops::tick`]. Nothing here blocks, and nothing here runs per request except
//! [`metrics::ServiceTimes::record`].

pub mod graphite;
pub mod live;
pub mod logging;
pub mod metrics;
pub mod signals;
pub mod stats;
pub mod tubes;

use std::io;

use mio::event::Event;
use mio::{Registry, Token};
use tarq_engine::Micros;
use tracing::info;

use graphite::{Graphite, Target};
use metrics::ServiceTimes;
use signals::{Request, SignalSource};
use stats::Snapshot;

/// First token of the ops components. The server's connection tokens keep their slot index
/// (below 2^24 + 2) in the low 32 bits, so a low half this high is never one of theirs.
pub const TOKEN_BASE: usize = 0xF000_0000;
/// The signal pipe.
pub const SIGNALS_TOKEN: Token = Token(TOKEN_BASE);
/// The Graphite socket.
pub const GRAPHITE_TOKEN: Token = Token(TOKEN_BASE + 1);
/// One past the last ops token.
const TOKEN_END: usize = TOKEN_BASE + 2;

/// The ops settings, as resolved from flags and the config file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OpsConfig {
    pub graphite: Option<Target>,
    pub graphite_interval: Micros,
}

impl Default for OpsConfig {
    fn default() -> Self {
        OpsConfig {
            graphite: None,
            graphite_interval: graphite::DEFAULT_INTERVAL,
        }
    }
}

/// The loop-driven ops components; see the module doc.
pub struct Ops {
    registry: Registry,
    cfg: OpsConfig,
    graphite: Option<Graphite>,
    signals: Option<SignalSource>,
    requests: Vec<Request>,
    /// Request service times, recorded by the loop per request.
    pub service: ServiceTimes,
    started: Micros,
}

impl Ops {
    /// Starts the Graphite connection, as configured.
    pub fn new(registry: &Registry, cfg: &OpsConfig, now: Micros) -> io::Result<Ops> {
        let mut ops = Ops {
            registry: registry.try_clone()?,
            cfg: cfg.clone(),
            graphite: None,
            signals: None,
            requests: Vec::new(),
            service: ServiceTimes::default(),
            started: now,
        };
        if let Some(target) = cfg.graphite {
            ops.graphite = Some(ops.start_graphite(target, now)?);
        }
        Ok(ops)
    }

    fn start_graphite(&self, target: Target, now: Micros) -> io::Result<Graphite> {
        let mut g = Graphite::new(target, self.cfg.graphite_interval, now);
        g.register(&self.registry, GRAPHITE_TOKEN, now)?;
        info!(%target, interval_ms = g.interval() / 1000, "pushing stats to graphite");
        Ok(g)
    }

    /// Installs the SIGTERM/SIGINT/SIGHUP handlers (process-wide: the binary does this, test
    /// servers running in a thread do not).
    pub fn handle_signals(&mut self) -> io::Result<()> {
        let mut s = SignalSource::install()?;
        s.register(&self.registry, SIGNALS_TOKEN)?;
        self.signals = Some(s);
        Ok(())
    }

    /// Whether `token` belongs to an ops component.
    pub fn owns(token: Token) -> bool {
        (TOKEN_BASE..TOKEN_END).contains(&token.0)
    }

    /// Routes an event to its component.
    pub fn on_event(&mut self, event: &Event, now: Micros) {
        let token = event.token();
        if token == SIGNALS_TOKEN {
            if let Some(s) = &mut self.signals {
                self.requests.extend(s.drain());
            }
        } else if token == GRAPHITE_TOKEN {
            if let Some(g) = &mut self.graphite {
                g.on_event(event, now);
            }
        }
    }

    /// The signals' requests since the last call, oldest first.
    pub fn take_requests(&mut self) -> Vec<Request> {
        std::mem::take(&mut self.requests)
    }

    /// The earliest time [`tick`](Self::tick) has work.
    pub fn next_timer(&self) -> Option<Micros> {
        self.graphite.as_ref().and_then(Graphite::next_timer)
    }

    /// Whether the loop should build a [`Snapshot`] and call [`tick`](Self::tick) now.
    pub fn is_due(&self, now: Micros) -> bool {
        self.next_timer().is_some_and(|t| t <= now)
    }

    /// Pushes a due Graphite sample.
    pub fn tick(&mut self, now: Micros, stats: &Snapshot) {
        if let Some(g) = &mut self.graphite {
            g.tick(now, stats);
        }
    }

    /// Time since the ops (and so the server) started.
    pub fn uptime(&self, now: Micros) -> Micros {
        now.saturating_sub(self.started)
    }

    /// The Graphite pusher, if one runs.
    pub fn graphite(&self) -> Option<&Graphite> {
        self.graphite.as_ref()
    }

    /// Applies new ops settings live (a reload). Returns what could not be applied.
    pub fn reconfigure(&mut self, cfg: &OpsConfig, now: Micros) -> Vec<String> {
        let mut refused = Vec::new();
        let interval_changed = cfg.graphite_interval != self.cfg.graphite_interval;
        self.cfg.graphite_interval = cfg.graphite_interval;
        match (cfg.graphite, self.graphite.as_mut()) {
            (None, Some(g)) => {
                info!(target = %g.target(), "graphite push stopped");
                self.graphite = None;
            }
            (Some(target), Some(g)) => {
                if target != g.target() || interval_changed {
                    info!(from = %g.target(), to = %target, "graphite target changed");
                    g.retarget(target, cfg.graphite_interval, now);
                }
            }
            (Some(target), None) => match self.start_graphite(target, now) {
                Ok(g) => self.graphite = Some(g),
                Err(e) => refused.push(format!("graphite {target}: {e}")),
            },
            (None, None) => {}
        }
        self.cfg.graphite = self.graphite.as_ref().map(Graphite::target);
        refused
    }
}
