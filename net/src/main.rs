//! `tarq`: the task-queue broker binary. Parses flags (and `--config`), sets up logging, binds
//! the server and runs its loop on the main thread until SIGINT or SIGTERM (SIGHUP reloads the
//! configuration). `tarq ctl ...` is a client of a running server instead.

use std::io::IsTerminal;

use anyhow::Context;
use clap::Parser;
use tarq_net::config::{Cli, Command, Config};
use tarq_net::ops::{ctl, logging};
use tarq_net::server::Server;

fn main() -> anyhow::Result<()> {
    let mut cli = Cli::parse();
    if let Some(Command::Ctl(args)) = cli.command.take() {
        return ctl::run(args, &mut std::io::stdout().lock());
    }
    let cfg = Config::from_cli(cli.clone())?;
    // Colours only for a person at a terminal, never into log files or pipes.
    logging::init(&cfg.log_level, std::io::stderr().is_terminal())?;

    let mut server = Server::bind(cfg)?;
    // SIGHUP reads the same command line over the (possibly edited) --config file.
    server
        .handle_signals(Box::new(move || {
            Config::from_cli(cli.clone()).map_err(|e| e.to_string())
        }))
        .context("installing signal handlers")?;
    server.run().context("event loop failed")?;
    Ok(())
}
