//! `tarq`: the task-queue broker binary. Parses flags (and `--config`), sets up logging, binds
//! the server and runs its loop on the main thread until SIGINT or SIGTERM.

use std::io::IsTerminal;

use anyhow::Context;
use clap::Parser;
use signal_hook::consts::{SIGINT, SIGTERM};
use signal_hook::iterator::Signals;
use tarq_net::config::{Cli, Config};
use tarq_net::server::Server;
use tracing::info;

fn main() -> anyhow::Result<()> {
    let cfg = Config::from_cli(Cli::parse())?;
    let level: tracing::Level = cfg
        .log_level
        .parse()
        .with_context(|| format!("log-level '{}'", cfg.log_level))?;
    tracing_subscriber::fmt()
        .with_max_level(level)
        .with_writer(std::io::stderr)
        // Colours only for a person at a terminal, never into log files or pipes.
        .with_ansi(std::io::stderr().is_terminal())
        .init();

    let mut server = Server::bind(cfg)?;
    let handle = server.handle();
    let mut signals = Signals::new([SIGINT, SIGTERM]).context("installing signal handlers")?;
    // Signals arrive on their own thread, off the request path; it only wakes the loop.
    std::thread::Builder::new()
        .name("tarq-signals".into())
        .spawn(move || {
            if let Some(sig) = signals.forever().next() {
                info!(signal = sig, "shutting down");
                handle.shutdown();
            }
        })
        .context("starting the signal thread")?;
    server.run().context("event loop failed")?;
    Ok(())
}
