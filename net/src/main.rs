//! `tarq`: the task-queue broker binary. Parses flags (and `--config`), sets up logging, binds
//! the server and runs its loop on the main thread until SIGINT or SIGTERM (SIGHUP reloads the
//! configuration). `tarq ctl ...` is a client of a running server instead.

use std::io::IsTerminal;

use anyhow::Context;
use clap::Parser;
use tarq_net::config::{Cli, Command, Config};
use tarq_net::ctl;
use tarq_net::server::{Server, WalJournal};
use tarq_ops::logging;
use tarq_wal::Wal;

fn main() -> anyhow::Result<()> {
    tarq_net::server::set_mmap_threshold();
    let mut cli = Cli::parse();
    if let Some(Command::Ctl(args)) = cli.command.take() {
        return ctl::run(args, &mut std::io::stdout().lock());
    }
    let cfg = Config::from_cli(cli.clone())?;
    // Colours only for a person at a terminal, never into log files or pipes.
    logging::init(&cfg.log_level, std::io::stderr().is_terminal())?;

    let mut server = if cfg.null {
        Server::bind(cfg)?
    } else {
        // The WAL's threads (sync, snapshot writer, snapshot loader) start in here: off the
        // loop's core when there is another.
        let helpers = cfg.cpu.map(HelpersOff::enter).transpose()?;
        // Locks the data directory, then recovers the queue from its snapshot and WAL.
        let (wal, queue, _report) = Wal::open_dir(&cfg.data_dir, cfg.wal.clone())
            .with_context(|| format!("opening the data directory {}", cfg.data_dir.display()))?;
        drop(helpers);
        Server::with_journal(cfg, Box::new(WalJournal::new(wal, queue)))?
    };
    // SIGHUP reads the same command line over the (possibly edited) --config file.
    server
        .handle_signals(Box::new(move || {
            Config::from_cli(cli.clone()).map_err(|e| e.to_string())
        }))
        .context("installing signal handlers")?;
    server.run().context("event loop failed")?;
    Ok(())
}

/// With `--cpu N`, the threads started while this lives (the WAL's sync and snapshot threads,
/// the snapshot loader) may run on every core the process is allowed but N, which the loop
/// thread takes when it runs: the loop keeps its core to itself, as Tarantool's TX thread has
/// its WAL thread beside it, not on it. When N is the only core allowed (`taskset -c N`), or
/// not allowed at all (the loop's pinning reports that), nothing changes. Dropping it gives
/// the main thread its former cores back, so the loop can pin itself to N.
struct HelpersOff {
    former: libc::cpu_set_t,
}

impl HelpersOff {
    fn enter(cpu: usize) -> anyhow::Result<Option<HelpersOff>> {
        let size = std::mem::size_of::<libc::cpu_set_t>();
        // SAFETY: cpu_set_t is plain data (all zero is the empty set); sched_getaffinity and
        // sched_setaffinity read or write exactly `size` bytes of the sets given, and
        // CPU_ISSET, CPU_CLR and CPU_COUNT only touch the set, `cpu` checked below CPU_SETSIZE.
        unsafe {
            let mut former: libc::cpu_set_t = std::mem::zeroed();
            if libc::sched_getaffinity(0, size, &mut former) != 0 {
                return Err(std::io::Error::last_os_error()).context("reading the CPU affinity");
            }
            if cpu >= libc::CPU_SETSIZE as usize || !libc::CPU_ISSET(cpu, &former) {
                return Ok(None);
            }
            let mut others = former;
            libc::CPU_CLR(cpu, &mut others);
            if libc::CPU_COUNT(&others) == 0 {
                return Ok(None);
            }
            if libc::sched_setaffinity(0, size, &others) != 0 {
                return Err(std::io::Error::last_os_error())
                    .context("keeping the WAL's threads off the loop's core");
            }
            Ok(Some(HelpersOff { former }))
        }
    }
}

impl Drop for HelpersOff {
    fn drop(&mut self) {
        let size = std::mem::size_of::<libc::cpu_set_t>();
        // SAFETY: as in `enter`: the set is `size` bytes of plain data.
        if unsafe { libc::sched_setaffinity(0, size, &self.former) } != 0 {
            tracing::warn!(
                error = %std::io::Error::last_os_error(),
                "could not give the main thread its cores back"
            );
        }
    }
}
