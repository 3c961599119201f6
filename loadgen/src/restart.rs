//! The restart loop: tarq as a service manager runs it, started and stopped again and again
//! on one data directory. Each lifetime recovers what the last one left, carries a batch of
//! messages through (put, then taken and acked: the queue is empty again at the stop) and
//! stops with SIGTERM. Per cycle it records how long the start took until tarq answered
//! (recovery), the rate of the batch, and the data directory's size and files after the stop —
//! the figures that show whether snapshots keep the directory and the recovery bounded when
//! no single lifetime writes enough WAL to reach the snapshot threshold.

use crate::proto::iproto::IprotoDriver;
use crate::runner::{self, RunConfig};
use crate::target::{self, SpawnOptions, Target};
use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// Producer and consumer connections and pipelining depth of each lifetime's batch.
const CONNECTIONS: usize = 4;
const DEPTH: usize = 16;
/// How long a take waits on an empty queue (s): the drain ends on counts, not on it.
const TAKE_TIMEOUT_S: f64 = 0.5;

/// What to run.
#[derive(Clone, Debug)]
pub struct RestartArgs {
    pub cycles: usize,
    /// Messages each lifetime puts and acks.
    pub messages: u64,
    pub payload: usize,
    pub tarq_bin: Option<PathBuf>,
    /// Extra arguments for tarq (snapshot settings, WAL mode).
    pub target_args: Vec<String>,
    /// Cores for tarq and for the load, as in a single run.
    pub target_cpu: Option<usize>,
    pub cpu: Option<usize>,
}

/// One lifetime.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct Cycle {
    pub cycle: usize,
    /// From starting the process to its first answer: recovery, and the process's start.
    pub start_ms: f64,
    pub msgs_per_s: f64,
    pub errors: u64,
    /// Messages put and never acked (must be 0: nothing acknowledged is lost).
    pub unacked: u64,
    /// The data directory after the stop: bytes, snapshots and WAL segments in it.
    pub dir_bytes: u64,
    pub snapshots: usize,
    pub wal_segments: usize,
}

/// The whole loop, as the suite stores it (`restart-loop.json`).
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct RestartRecord {
    pub messages_per_cycle: u64,
    pub payload: usize,
    pub target_args: Vec<String>,
    pub cycles: Vec<Cycle>,
}

impl RestartRecord {
    /// The largest data directory after any stop.
    pub fn peak_dir_bytes(&self) -> u64 {
        self.cycles.iter().map(|c| c.dir_bytes).max().unwrap_or(0)
    }
}

/// Runs the loop; `progress` is told each cycle as it ends.
pub fn run(a: &RestartArgs, mut progress: impl FnMut(&Cycle)) -> Result<RestartRecord> {
    let data = tempfile::Builder::new()
        .prefix("tarq-loadgen-restart-")
        .tempdir()
        .context("creating the data directory")?;
    let opts = SpawnOptions {
        cpu: a.target_cpu,
        tarq_bin: a.tarq_bin.clone(),
        rebuild: false,
        args: a.target_args.clone(),
    };
    if let Some(cpu) = a.cpu {
        tarq_affinity::pin(cpu).with_context(|| format!("pinning the loadgen to core {cpu}"))?;
    }
    let mut cycles = Vec::with_capacity(a.cycles);
    for cycle in 1..=a.cycles {
        let c = lifetime(a, &opts, data.path(), cycle)?;
        progress(&c);
        cycles.push(c);
    }
    Ok(RestartRecord {
        messages_per_cycle: a.messages,
        payload: a.payload,
        target_args: a.target_args.clone(),
        cycles,
    })
}

/// Start, carry a batch through, stop; then look at the directory.
fn lifetime(a: &RestartArgs, opts: &SpawnOptions, data: &Path, cycle: usize) -> Result<Cycle> {
    let t0 = Instant::now();
    let spawned = target::spawn_in(Target::Tarq, opts, Some(data))
        .with_context(|| format!("starting tarq, cycle {cycle}"))?;
    let start = t0.elapsed();
    let cfg = RunConfig {
        addr: spawned.addr,
        producers: CONNECTIONS,
        consumers: CONNECTIONS,
        depth: DEPTH,
        payload: a.payload,
        duration: Duration::ZERO,
        warmup: Duration::ZERO,
        rate: None,
        window: RunConfig::default_window(CONNECTIONS, CONNECTIONS, DEPTH),
        fill: Some(a.messages),
        steady: false,
        drain: true,
        null_mode: false,
        spin: false,
        progress: false,
        label: format!("restart {cycle}"),
        target_pid: Some(spawned.pid()),
        failover: Vec::new(),
        tls: None,
    };
    let outcome = runner::run(&cfg, |_| IprotoDriver::with_calls(None, TAKE_TIMEOUT_S))
        .with_context(|| {
            format!(
                "cycle {cycle}: tarq's log ends with:\n{}",
                spawned.log_tail()
            )
        })?;
    spawned
        .stop()
        .with_context(|| format!("stopping tarq, cycle {cycle}"))?;
    let (dir_bytes, snapshots, wal_segments) = dir_figures(data)?;
    let measured = outcome.main.measured.as_secs_f64();
    Ok(Cycle {
        cycle,
        start_ms: start.as_secs_f64() * 1e3,
        msgs_per_s: if measured > 0.0 {
            outcome.main.acks as f64 / measured
        } else {
            0.0
        },
        errors: outcome.main.errors,
        unacked: outcome.unacked,
        dir_bytes,
        snapshots,
        wal_segments,
    })
}

/// Bytes in `dir` (not recursing: tarq keeps a flat directory), its `.snap` and `.xlog` files.
fn dir_figures(dir: &Path) -> Result<(u64, usize, usize)> {
    let (mut bytes, mut snaps, mut xlogs) = (0, 0, 0);
    for entry in std::fs::read_dir(dir).with_context(|| format!("listing {}", dir.display()))? {
        let entry = entry?;
        let meta = entry.metadata()?;
        if !meta.is_file() {
            continue;
        }
        bytes += meta.len();
        let name = entry.file_name();
        let name = name.to_string_lossy();
        snaps += usize::from(name.ends_with(".snap"));
        xlogs += usize::from(name.ends_with(".xlog"));
    }
    if bytes == 0 {
        bail!(
            "{} is empty after a stop: tarq wrote nothing",
            dir.display()
        );
    }
    Ok((bytes, snaps, xlogs))
}
