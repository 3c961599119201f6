//! Signals on the event loop: SIGTERM and SIGINT ask for a graceful stop, SIGHUP for a reload of
//! the `--config` file. The handlers only write to a pipe that the loop polls
//! (signal-hook-mio), so a signal never runs server code at an arbitrary point: the loop sees a
//! [`Request`] between two turns and acts on it there. What a stop and a reload then do is the
//! loop's business (`server`), with [`super::reload`] deciding what can change live.

use std::io;

use mio::{Interest, Registry, Token};
use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM};
use signal_hook_mio::v1_0::Signals;

/// What a signal asks of the server.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Request {
    /// SIGTERM or SIGINT: stop accepting, finish the replies in flight, sync the WAL, exit 0.
    Stop { signal: i32 },
    /// SIGHUP: re-read the configuration and apply what can change live.
    Reload,
}

/// The signals the server handles, as a mio event source.
pub struct SignalSource {
    signals: Signals,
}

impl SignalSource {
    /// Installs the handlers (process-wide: only the binary does this, never a test server).
    pub fn install() -> io::Result<SignalSource> {
        Ok(SignalSource {
            signals: Signals::new([SIGTERM, SIGINT, SIGHUP])?,
        })
    }

    pub fn register(&mut self, registry: &Registry, token: Token) -> io::Result<()> {
        registry.register(&mut self.signals, token, Interest::READABLE)
    }

    /// The requests of the signals that arrived since the last call, in order (repeats of
    /// one signal between two calls may be merged).
    pub fn drain(&mut self) -> Vec<Request> {
        self.signals
            .pending()
            .filter_map(|signal| match signal {
                SIGTERM | SIGINT => Some(Request::Stop { signal }),
                SIGHUP => Some(Request::Reload),
                _ => None,
            })
            .collect()
    }
}

/// A signal's name for the log.
pub fn name(signal: i32) -> &'static str {
    match signal {
        SIGTERM => "SIGTERM",
        SIGINT => "SIGINT",
        SIGHUP => "SIGHUP",
        _ => "signal",
    }
}
