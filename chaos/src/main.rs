//! `tarq-chaos`: runs a fault schedule against a tarq cluster in network namespaces and checks
//! what the clients saw (`run`), checks a recorded history again (`check`), or removes what
//! interrupted runs left behind (`clean`). It needs root, `ip`, `nft` and `etcd`; the tarq
//! binary is `$TARQ_BIN` or the workspace's newest build.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use clap::{Parser, Subcommand};
use tarq_chaos::nemesis::Fault;
use tarq_chaos::{checker, history, net, run};

#[derive(Parser)]
#[command(
    name = "tarq-chaos",
    about = "Faults against a tarq cluster, and a verdict on what clients saw"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Start a cluster in network namespaces, run clients under a seeded fault schedule, heal,
    /// drain, check. Exits 1 when the checker finds a violation.
    Run {
        /// Faults to draw from: `all`, or names separated by commas (kill-primary,
        /// pause-primary, isolate-primary, primary-from-etcd, primary-from-replicas,
        /// minority-primary, bridge, lagging-replica, loss, kill-etcd, pause-etcd,
        /// clients-from-primary).
        #[arg(long, default_value = "all")]
        nemesis: String,
        /// How long faults are scheduled for: `90s`, `4m`, `30m`.
        #[arg(long, default_value = "2m", value_parser = parse_duration)]
        time: Duration,
        /// The seed of the schedule and of the clients' choices.
        #[arg(long, default_value_t = 1)]
        seed: u64,
        /// Client threads.
        #[arg(long, default_value_t = 4)]
        clients: usize,
        /// tarq nodes a replica set.
        #[arg(long, default_value_t = 3)]
        nodes: usize,
        /// Replica sets: more than one makes a sharded cluster whose tube has two partitions a
        /// set, moved between the sets while the faults run.
        #[arg(long, default_value_t = 1)]
        sets: usize,
        /// The ttr of every put, in seconds.
        #[arg(long, default_value_t = 30)]
        ttr: u64,
        /// Where the history, report, timeline and logs go.
        #[arg(long, default_value = "chaos-run")]
        out: PathBuf,
        /// Flags for every tarq node (after `--`), default
        /// `--sync-replicas 1 --lease-ttl 2 --wal-mode fsync`.
        #[arg(last = true)]
        tarq_args: Vec<String>,
    },
    /// Check a history written by `run` again and print the verdict.
    Check { history: PathBuf },
    /// Remove the namespaces of runs whose process is gone, and the lazyfs mounts they left
    /// under DIR.
    Clean {
        #[arg(default_value = "/")]
        dir: PathBuf,
    },
}

fn parse_duration(s: &str) -> Result<Duration, String> {
    let (n, unit) = s.split_at(s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len()));
    let n: u64 = n
        .parse()
        .map_err(|_| format!("{s:?} is not a duration such as 90s or 30m"))?;
    match unit {
        "s" | "" => Ok(Duration::from_secs(n)),
        "m" => Ok(Duration::from_secs(n * 60)),
        "h" => Ok(Duration::from_secs(n * 3600)),
        _ => Err(format!("{s:?}: the unit must be s, m or h")),
    }
}

fn faults(list: &str) -> Result<Vec<Fault>> {
    if list == "all" {
        return Ok(Fault::ALL.to_vec());
    }
    list.split(',')
        .map(|name| {
            Fault::ALL
                .into_iter()
                .find(|f| f.name() == name.trim())
                .with_context(|| format!("no fault named {name:?}"))
        })
        .collect()
}

fn main() -> Result<ExitCode> {
    match Cli::parse().command {
        Command::Run {
            nemesis,
            time,
            seed,
            clients,
            nodes,
            sets,
            ttr,
            out,
            tarq_args,
        } => {
            if nodes < 3 {
                bail!("--nodes must be at least 3 (a primary and two replicas)");
            }
            let tarq_args = if tarq_args.is_empty() {
                run::DEFAULT_TARQ_ARGS.map(String::from).to_vec()
            } else {
                tarq_args
            };
            let opts = run::Options {
                seed,
                time,
                faults: faults(&nemesis)?,
                clients,
                nodes,
                sets: sets.clamp(1, 26),
                ttr_secs: ttr,
                tarq_args,
                out: out.clone(),
            };
            let report = run::run(&opts)?;
            println!("{report}");
            println!("history, report and timeline in {}", out.display());
            Ok(if report.ok() {
                ExitCode::SUCCESS
            } else {
                ExitCode::from(1)
            })
        }
        Command::Check { history: path } => {
            let file = std::fs::File::open(&path)
                .with_context(|| format!("cannot open {}", path.display()))?;
            let events = history::read(std::io::BufReader::new(file))?;
            let report = checker::check(&events);
            println!("{report}");
            Ok(if report.ok() {
                ExitCode::SUCCESS
            } else {
                ExitCode::from(1)
            })
        }
        Command::Clean { dir } => {
            for ns in net::Net::clean_stale()? {
                println!("removed {ns}");
            }
            for m in tarq_chaos::lazyfs::unmount_stale(&dir)? {
                println!("unmounted {}", m.display());
            }
            Ok(ExitCode::SUCCESS)
        }
    }
}
