//! `tarq`: the task-queue broker binary. Reads its configuration (the command line, the
//! environment and `--config`), sets up logging, binds the server and runs its loop on the main
//! thread until SIGINT or SIGTERM (SIGHUP reloads the configuration). `tarq ctl ...` is a client
//! of a running server instead.

use std::io::IsTerminal;

use anyhow::Context;
use clap::FromArgMatches;
use tarq_net::config::{Cli, Command, Config};
use tarq_net::core::journal::Journal;
use tarq_net::ctl;
use tarq_net::server::Server;
use tarq_ops::logging;
use tarq_wal::Wal;

fn main() -> anyhow::Result<()> {
    tarq_net::server::set_mmap_threshold();
    // The matches, not only the parsed `Cli`: each (re)load lays them over the file again.
    let matches = Cli::matches();
    let cli = Cli::from_arg_matches(&matches).unwrap_or_else(|e| e.exit());
    if let Some(Command::Ctl(args)) = cli.command {
        // A person reads this: the message and its causes, never a backtrace (which
        // `anyhow`'s `Debug` adds when RUST_BACKTRACE is set).
        if let Err(e) = ctl::run(args, &mut std::io::stdout().lock()) {
            eprintln!("{}", ctl::error_text(&e));
            std::process::exit(1);
        }
        return Ok(());
    }
    let cfg = Config::load(&matches)?;
    // Colours only for a person at a terminal, never into log files or pipes.
    logging::init(&cfg.log_level, std::io::stderr().is_terminal())?;

    let mut server = if cfg.null {
        Server::bind(cfg)?
    } else {
        // Locks the data directory, then recovers the queue from its snapshot and WAL on every
        // core; the WAL's threads keep off the loop's core (`WalConfig::loop_cpu`).
        let (wal, queue, _report) = Wal::open_dir(&cfg.data_dir, cfg.wal.clone())
            .with_context(|| format!("opening the data directory {}", cfg.data_dir.display()))?;
        Server::with_journal(cfg, Journal::wal_with(wal, queue))?
    };
    // SIGHUP reads the (possibly edited) --config file and password file again, under the same
    // command line and environment.
    server
        .handle_signals(Box::new(move || {
            Config::load(&matches).map_err(|e| e.to_string())
        }))
        .context("installing signal handlers")?;
    server.run().context("event loop failed")?;
    Ok(())
}
