//! `tarq-loadgen suite`: the standard comparison matrix. Every target × connection shape ×
//! pipelining depth in closed loop, the null target for the loadgen's own ceiling, then tarq in
//! open loop at fractions of its best closed-loop rate. Each run is spawned fresh and pinned
//! (target on core 0, loadgen on core 1). Everything lands in `results/<date>-<commit>/`
//! (one JSON and three `.hgrm` per run, `suite.json`, SVG charts), and the suite's section of
//! `results/README.md` is regenerated from those files: the comparison table, ratios to each peer, the goals, the
//! plots and the exact commands. Nobody edits a result by hand.

use crate::plot;
use crate::proto::iproto::{Api, TubeType};
use crate::report::{self, thousands, Machine, Summary};
use crate::restart::{self, RestartArgs, RestartRecord};
use crate::single::{self, RunArgs};
use crate::target::{self, SpawnOptions, Target};
use anyhow::{bail, Context, Result};
use clap::Args;
use serde::{Deserialize, Serialize};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// The goals the table is checked against, on this 2-core machine.
const GOAL_VS_TARANTOOL: f64 = 10.0;
const GOAL_VS_TARANTOOL_QUEUE: f64 = 10.0;
/// tarq's tubes API against its own seed API at the same shape.
const GOAL_TUBES_VS_SEED: f64 = 0.9;
const GOAL_BEANSTALK_VS_BEANSTALKD: f64 = 3.0;
const GOAL_BEANSTALK_AT_DEPTH_1: f64 = 1.0;
const GOAL_BEANSTALK_VS_BINLOG: f64 = 8.0;
const GOAL_VS_BEANSTALKD: f64 = 3.0;
const GOAL_VS_REDIS: f64 = 1.0;
const GOAL_DEPTH16_MSGS: f64 = 300_000.0;
const GOAL_P99_US_AT_HALF: f64 = 1_000.0;
/// Messages in the `--backlog-rows` runs: the big backlog users bring (ten million).
const BACKLOG_ROWS_TASKS: &str = "10000000";

#[derive(Args, Clone, Debug)]
pub struct SuiteArgs {
    /// Measured time per run: seconds (5) or with a unit (5s, 500ms).
    #[arg(long, default_value = "5s", value_parser = single::parse_duration)]
    pub duration: Duration,
    /// Warm-up per run, as --duration.
    #[arg(long, default_value = "1s", value_parser = single::parse_duration)]
    pub warmup: Duration,
    /// Targets to measure (missing peers are skipped and reported).
    #[arg(long, value_enum, value_delimiter = ',', default_values_t = Target::ALL)]
    pub targets: Vec<Target>,
    /// Connection shapes as PRODUCERSxCONSUMERS.
    #[arg(long, value_delimiter = ',', default_values_t = ["4x4".to_string(), "32x32".to_string()])]
    pub shapes: Vec<String>,
    /// Pipelining depths.
    #[arg(long, value_delimiter = ',', default_values_t = [1usize, 16])]
    pub depths: Vec<usize>,
    /// Open-loop rates, as percentages of tarq's best closed-loop rate.
    #[arg(long, value_delimiter = ',', default_values_t = [25u32, 50, 75])]
    pub open_loop: Vec<u32>,
    /// Connection shape of the open-loop runs.
    #[arg(long, default_value = "4x4")]
    pub open_shape: String,
    /// Pipelining depth of the open-loop runs.
    #[arg(long, default_value_t = 16)]
    pub open_depth: usize,
    /// Payload bytes per message.
    #[arg(long, default_value_t = 64)]
    pub payload: usize,
    /// Results directory (default: the workspace's results/).
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// A remark recorded with the results, e.g. what else the machine was doing.
    #[arg(long)]
    pub note: Option<String>,
    /// tarq binary (default: target/release/tarq, rebuilt first).
    #[arg(long)]
    pub tarq_bin: Option<PathBuf>,
    /// Pin neither the targets nor the loadgen.
    #[arg(long)]
    pub no_pin: bool,
    /// Runs per cell at most: a run that other processes disturbed (they used more than 15%
    /// of a core meanwhile) or that failed is made again once the machine is quiet.
    #[arg(long, default_value_t = 3)]
    pub attempts: u32,
    /// Let the open-loop runs sleep between events instead of busy-polling (for a shared
    /// machine: the loadgen's wake-up delay then adds to every latency).
    #[arg(long)]
    pub no_spin: bool,
    /// tarq WAL modes measured beside its default (`write`), as extra rows at --open-shape and
    /// each depth (`--wal-modes ''` for none).
    #[arg(long, value_delimiter = ',', default_values_t = ["fsync".to_string(), "none".to_string()])]
    pub wal_modes: Vec<String>,
    /// Redis AOF fsync policies measured beside Redis in memory, as extra rows at
    /// --open-shape and each depth (`--aof ''` for none).
    #[arg(long, value_delimiter = ',', default_values_t = ["everysec".to_string(), "always".to_string()])]
    pub aof: Vec<String>,
    /// Leave out tarq's tubes API (queue.tube.<name>:*, fifottl) rows; they run only when tarq
    /// answers queue.create_tube.
    #[arg(long)]
    pub no_tubes: bool,
    /// Add the backlog rows: tarq filling N messages (default 10M) then draining them, and an
    /// N backlog kept while producers and consumers run (at 10M: minutes, and gigabytes of
    /// memory).
    #[arg(long, value_name = "N", num_args = 0..=1, default_missing_value = BACKLOG_ROWS_TASKS)]
    pub backlog_rows: Option<u64>,
    /// Add the restart loop: tarq started and stopped CYCLES times (default 20) on one data
    /// directory, each lifetime putting and acking `--restart-messages` (less WAL than the
    /// snapshot threshold); recovery time and the directory's size per cycle.
    #[arg(long, value_name = "CYCLES", num_args = 0..=1, default_missing_value = "20")]
    pub restart_rows: Option<usize>,
    /// Messages each lifetime of the restart loop puts and acks (~230 bytes of WAL each).
    #[arg(long, default_value_t = 400_000)]
    pub restart_messages: u64,
    /// Only regenerate the suite's section of README.md and the charts, without running
    /// anything: from the newest suite directory under --out (default results/), or from DIR,
    /// whose README is the one in DIR's parent (or in --out, which must hold DIR).
    #[arg(long, value_name = "DIR", num_args = 0..=1)]
    pub report_only: Option<Option<PathBuf>>,
}

/// `suite.json`: what the suite ran, in order, and where each run's figures are.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct SuiteRecord {
    pub commit: String,
    pub started_at: String,
    pub finished_at: String,
    pub machine: Machine,
    pub note: Option<String>,
    pub command: String,
    pub duration_s: f64,
    pub warmup_s: f64,
    pub payload: usize,
    pub runs: Vec<RunEntry>,
    /// Targets that could not run here, with the reason.
    pub skipped: Vec<String>,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct RunEntry {
    pub label: String,
    pub target: Target,
    pub producers: usize,
    pub consumers: usize,
    pub depth: usize,
    pub rate: Option<f64>,
    /// Percentage of tarq's best closed-loop rate, for open-loop runs.
    pub rate_pct: Option<u32>,
    pub command: String,
    /// File name of the run's JSON inside the suite directory, when it succeeded.
    pub json: Option<String>,
    pub error: Option<String>,
    /// Runs made for this cell: more than one when other processes disturbed the earlier
    /// ones (or they failed); the figures are the last attempt's.
    #[serde(default)]
    pub attempts: u32,
    /// The run's shape beyond connections and depth, so tables never mix shapes: the call set
    /// and tube type (IPROTO), the target's own arguments, what it keeps on disk, and the
    /// backlog phases. Suites written before these fields read as the seed API, closed loop.
    #[serde(default)]
    pub api: Api,
    #[serde(default)]
    pub tube_type: Option<TubeType>,
    #[serde(default)]
    pub target_args: Option<String>,
    /// What the target promised about durability: "in memory", "binlog", "WAL write", ...
    #[serde(default)]
    pub durability: Option<String>,
    #[serde(default)]
    pub backlog: Option<u64>,
    #[serde(default)]
    pub fill: Option<u64>,
    #[serde(default)]
    pub drain: bool,
    #[serde(default)]
    pub unbounded: bool,
}

impl RunEntry {
    /// The column a run belongs to: the target, its call set and tube type, and its
    /// durability when the suite set one (`tarq`, `tarq tubes fifottl`, `tarq WAL fsync`,
    /// `tarantool-queue fifottl`, `redis AOF always`).
    pub fn series(&self) -> String {
        let mut s = self.target.to_string();
        if self.api == Api::Tubes && self.target != Target::TarantoolQueue {
            s.push_str(" tubes");
        }
        if let Some(t) = self.tube_type {
            s.push_str(&format!(" {t}"));
        }
        if self.target_args.is_some() {
            if let Some(d) = &self.durability {
                s.push_str(&format!(" {d}"));
            }
        }
        s
    }

    /// A closed-loop run with a steady phase only (what the comparison table holds).
    pub fn is_plain(&self) -> bool {
        self.rate.is_none() && self.backlog.is_none() && self.fill.is_none() && !self.unbounded
    }

    /// The backlog phases in words: `fill 10,000,000 then drain`, `backlog 1,000`.
    pub fn shape(&self) -> String {
        let mut parts = Vec::new();
        if let Some(n) = self.fill {
            parts.push(format!("fill {}", thousands(n as f64)));
        }
        if let Some(n) = self.backlog {
            parts.push(format!("backlog {}", thousands(n as f64)));
        }
        if self.unbounded {
            parts.push("unbounded".into());
        }
        if self.rate.is_some() {
            parts.push("open loop".into());
        }
        if parts.is_empty() {
            parts.push("closed loop".into());
        }
        if self.drain {
            parts.push("then drain".into());
        }
        parts.join(", ")
    }
}

/// What a spawned target keeps on disk, from its kind and the arguments the suite gave it.
pub fn durability(target: Target, target_args: Option<&str>) -> String {
    let args: Vec<&str> = target_args.unwrap_or("").split_whitespace().collect();
    let after = |flag: &str| {
        args.iter()
            .position(|a| *a == flag)
            .and_then(|i| args.get(i + 1))
            .copied()
    };
    match target {
        Target::Tarq | Target::TarqBeanstalk => {
            format!("WAL {}", after("--wal-mode").unwrap_or("write"))
        }
        Target::Tarantool | Target::TarantoolQueue => "WAL write".into(),
        Target::BeanstalkdBinlog => "binlog".into(),
        Target::Redis if after("--appendonly") == Some("yes") => {
            format!("AOF {}", after("--appendfsync").unwrap_or("everysec"))
        }
        Target::Beanstalkd | Target::Redis => "in memory".into(),
        Target::Null => "none".into(),
    }
}

fn parse_shape(s: &str) -> Result<(usize, usize)> {
    let (p, c) = s
        .split_once(['x', '+'])
        .with_context(|| format!("shape {s:?} is not PRODUCERSxCONSUMERS"))?;
    let p: usize = p.trim().parse().with_context(|| format!("shape {s:?}"))?;
    let c: usize = c.trim().parse().with_context(|| format!("shape {s:?}"))?;
    if p == 0 || c == 0 {
        bail!("shape {s:?} needs at least one producer and one consumer");
    }
    Ok((p, c))
}

pub fn run(args: &SuiteArgs) -> Result<()> {
    if let Some(dir) = &args.report_only {
        return report_only(args.out.as_deref(), dir.as_deref());
    }
    let results = args
        .out
        .clone()
        .unwrap_or_else(|| target::workspace_root().join("results"));
    let shapes: Vec<(usize, usize)> = args
        .shapes
        .iter()
        .map(|s| parse_shape(s))
        .collect::<Result<_>>()?;
    let tarq_bin = suite_tarq_bin(args, &args.targets)?;
    let (targets, skipped) = available_targets(&args.targets, tarq_bin.as_ref());
    let mut record = new_record(args, skipped);
    let dir = fresh_dir(
        &results,
        &format!("{}-{}", &record.started_at[..10], record.commit),
    )?;
    eprintln!("writing results to {}", dir.display());
    warn_if_busy();

    let open_shape = parse_shape(&args.open_shape)?;
    let base = |t: Target, p: usize, c: usize, d: usize| {
        let mut a = RunArgs::shape(t, p, c, d);
        a.duration = args.duration;
        a.warmup = args.warmup;
        a.payload = args.payload;
        a.tarq_bin = tarq_bin.clone();
        a.no_pin = args.no_pin;
        a
    };
    let (tarq_at_open, tarq_best) = run_matrix(
        args,
        &dir,
        &targets,
        &shapes,
        open_shape,
        &base,
        &mut record,
    )?;
    for a in variant_rows(args, &targets, open_shape, &base, &mut record.skipped) {
        one(&dir, &a, None, args.attempts, &mut record)?;
    }
    let reference = tarq_at_open.as_ref().or(tarq_best.as_ref());
    run_open_loop(args, &dir, reference, &mut record)?;
    if let Some(cycles) = args
        .restart_rows
        .filter(|_| targets.contains(&Target::Tarq))
    {
        run_restart_loop(args, &dir, cycles, tarq_bin.clone())?;
    }

    finish(&results, &dir, &mut record)
}

/// The restart loop (`restart::run`), its record written beside the runs as
/// `RESTART_FILE`.
fn run_restart_loop(
    args: &SuiteArgs,
    dir: &Path,
    cycles: usize,
    tarq_bin: Option<PathBuf>,
) -> Result<()> {
    // Pinned as a spawned run of the matrix is.
    let mut shape = RunArgs::shape(Target::Tarq, 1, 1, 1);
    shape.no_pin = args.no_pin;
    let (target_cpu, cpu) = single::cores(&shape);
    let a = RestartArgs {
        cycles,
        messages: args.restart_messages,
        payload: args.payload,
        tarq_bin,
        target_args: Vec::new(),
        target_cpu,
        cpu,
    };
    eprintln!(
        "restart loop: {cycles} lifetimes of {} messages",
        a.messages
    );
    let record = restart::run(&a, |c| {
        eprintln!(
            "  cycle {}: started in {:.0} ms, {:.0} msgs/s, directory {} bytes ({} snapshots, {} WAL segments)",
            c.cycle, c.start_ms, c.msgs_per_s, c.dir_bytes, c.snapshots, c.wal_segments
        )
    })?;
    let text = serde_json::to_string_pretty(&record)? + "\n";
    std::fs::write(dir.join(RESTART_FILE), text)
        .with_context(|| format!("writing {}", dir.join(RESTART_FILE).display()))
}

/// The restart loop's record in a suite's directory.
const RESTART_FILE: &str = "restart-loop.json";

/// tarq's rate at a shape and the arguments that reached it.
type TarqRate = Option<(f64, RunArgs)>;

/// Runs every target at every shape and depth of the matrix (the original tarantool/queue at
/// the open-loop shape only). Returns tarq's rate at the open-loop shape and its best rate.
fn run_matrix(
    args: &SuiteArgs,
    dir: &Path,
    targets: &[Target],
    shapes: &[(usize, usize)],
    open_shape: (usize, usize),
    base: &dyn Fn(Target, usize, usize, usize) -> RunArgs,
    record: &mut SuiteRecord,
) -> Result<(TarqRate, TarqRate)> {
    // The open-loop runs take fractions of tarq's rate at their own shape (every message sent
    // on its own costs the loadgen more than a closed loop's batches, so a rate reached with
    // many connections in closed loop says little about an open loop with few), or of its
    // best rate when that shape is not in the matrix.
    let mut tarq_at_open: Option<(f64, RunArgs)> = None;
    let mut tarq_best: Option<(f64, RunArgs)> = None;
    for &t in targets {
        // The original tarantool/queue is measured at the open-loop shape only: at 32+32 it
        // adds minutes and nothing the 4+4 rows do not show.
        let t_shapes = if t == Target::TarantoolQueue {
            vec![open_shape]
        } else {
            shapes.to_vec()
        };
        for &(p, c) in &t_shapes {
            for &d in &args.depths {
                let a = base(t, p, c, d);
                if let Some(s) = one(dir, &a, None, args.attempts, record)? {
                    if t == Target::Tarq && tarq_best.as_ref().is_none_or(|b| s.msgs_per_s > b.0) {
                        tarq_best = Some((s.msgs_per_s, a.clone()));
                    }
                    if t == Target::Tarq && (p, c) == open_shape && d == args.open_depth {
                        tarq_at_open = Some((s.msgs_per_s, a.clone()));
                    }
                }
            }
        }
    }
    Ok((tarq_at_open, tarq_best))
}

/// Stamps the record's end, writes `suite.json` into `dir` and, when every run succeeded,
/// regenerates the README. A failed run, or no run at all (every target skipped), leaves the
/// README as it was (it is tracked: a table of failures is no result) and fails the suite;
/// its directory keeps what did run.
fn finish(results: &Path, dir: &Path, record: &mut SuiteRecord) -> Result<()> {
    record.finished_at = chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
    record.machine.loadavg_after = report::loadavg();
    std::fs::write(
        dir.join("suite.json"),
        serde_json::to_string_pretty(&record)? + "\n",
    )?;
    if record.runs.is_empty() {
        bail!(
            "nothing ran ({}); {} left as it was",
            if record.skipped.is_empty() {
                "no run was asked for".to_string()
            } else {
                format!("skipped: {}", record.skipped.join("; "))
            },
            results.join("README.md").display()
        );
    }
    let failed: Vec<&str> = record
        .runs
        .iter()
        .filter(|r| r.error.is_some())
        .map(|r| r.label.as_str())
        .collect();
    if !failed.is_empty() {
        bail!(
            "{} of {} runs failed ({}); {} left as it was. The runs that succeeded are in {}; \
             `tarq-loadgen suite --report-only {}` draws the README from them anyway",
            failed.len(),
            record.runs.len(),
            failed.join(", "),
            results.join("README.md").display(),
            dir.display(),
            dir.display()
        );
    }
    write_readme(results, dir)?;
    eprintln!("done: {}", results.join("README.md").display());
    Ok(())
}

/// `--report-only [DIR]`: the README beside the newest suite under `out` (default results/),
/// or beside DIR: in `out` when given (which must hold DIR), else in DIR's parent, so the
/// links, relative to the README, reach DIR.
fn report_only(out: Option<&Path>, dir: Option<&Path>) -> Result<()> {
    let (results, dir) = match dir {
        None => {
            let results = out.map_or_else(
                || target::workspace_root().join("results"),
                Path::to_path_buf,
            );
            let dir = newest_suite(&results)?;
            (results, dir)
        }
        Some(dir) => {
            let dir = dir
                .canonicalize()
                .with_context(|| format!("--report-only {}", dir.display()))?;
            let results = match out {
                Some(out) => out
                    .canonicalize()
                    .with_context(|| format!("--out {}", out.display()))?,
                None => dir
                    .parent()
                    .with_context(|| format!("{} has no parent directory", dir.display()))?
                    .to_path_buf(),
            };
            if !dir.starts_with(&results) {
                bail!(
                    "{} is not under {}: the README links to a suite directory below its own",
                    dir.display(),
                    results.display()
                );
            }
            (results, dir)
        }
    };
    write_readme(&results, &dir)?;
    eprintln!("done: {}", results.join("README.md").display());
    Ok(())
}

/// The rows beside the matrix, at the open-loop shape and each depth: tarq per WAL mode,
/// Redis per AOF policy, tarq's tubes API (when tarq serves it), and with `--backlog-rows`
/// tarq's 10M fill-then-drain and 10M standing backlog. A row whose target does not answer
/// is skipped with the reason.
fn variant_rows(
    args: &SuiteArgs,
    targets: &[Target],
    (p, c): (usize, usize),
    base: &dyn Fn(Target, usize, usize, usize) -> RunArgs,
    skipped: &mut Vec<String>,
) -> Vec<RunArgs> {
    let mut rows = Vec::new();
    let has = |t: Target| targets.contains(&t);
    for &d in &args.depths {
        if has(Target::Tarq) {
            for mode in args.wal_modes.iter().filter(|m| !m.is_empty()) {
                let mut a = base(Target::Tarq, p, c, d);
                a.target_args = Some(format!("--wal-mode {mode}"));
                rows.push(a);
            }
        }
        if has(Target::Redis) {
            for fsync in args.aof.iter().filter(|m| !m.is_empty()) {
                let mut a = base(Target::Redis, p, c, d);
                a.target_args = Some(format!("--appendonly yes --appendfsync {fsync}"));
                rows.push(a);
            }
        }
    }
    if has(Target::Tarq) && !args.no_tubes {
        let mut probe = base(Target::Tarq, p, c, 1);
        probe.api = Some(Api::Tubes);
        probe.tube_type = Some(TubeType::Fifottl);
        match answers(&probe) {
            None => rows.extend(args.depths.iter().map(|&d| {
                let mut a = probe.clone();
                a.depth = d;
                a
            })),
            Some(why) => {
                eprintln!("skipping tarq's tubes API: {why}");
                skipped.push(format!("tarq tubes: {why}"));
            }
        }
    }
    if let Some(n) = args.backlog_rows.filter(|_| has(Target::Tarq)) {
        let mut fill = base(Target::Tarq, p, c, args.open_depth);
        fill.fill = Some(n);
        fill.drain = true;
        rows.push(fill);
        let mut backlog = base(Target::Tarq, p, c, args.open_depth);
        backlog.backlog = Some(n);
        rows.push(backlog);
    }
    rows
}

/// `None` when the target of `a` starts and takes its set-up calls (the tube), else why not:
/// the suite measures tarq's tubes API and beanstalk port only once tarq serves them.
fn answers(a: &RunArgs) -> Option<String> {
    let opts = SpawnOptions {
        cpu: None,
        tarq_bin: a.tarq_bin.clone(),
        rebuild: false,
        args: a.target_argv().ok()?,
    };
    let spawned = match target::spawn(a.target, &opts) {
        Ok(s) => s,
        Err(e) => return Some(first_line(&format!("{e:#}"))),
    };
    let result = a.tube().map(|t| target::create_tube(spawned.addr, &t));
    let _ = spawned.stop();
    match result {
        Some(Err(e)) => Some(first_line(&format!("{e:#}"))),
        _ => None,
    }
}

/// The first line of an error (spawn errors go on with the target's log).
fn first_line(text: &str) -> String {
    let mut lines = text.lines().filter(|l| !l.trim().is_empty());
    let first = lines.next().unwrap_or("").to_string();
    // A start-up failure's reason is the log's first meaningful line after the header.
    match lines.next() {
        Some(next) if first.ends_with("its log ends with:") => format!("{first} {}", next.trim()),
        _ => first,
    }
}

/// The targets asked for that can run here, each once, and why the others cannot.
fn available_targets(asked: &[Target], tarq_bin: Option<&PathBuf>) -> (Vec<Target>, Vec<String>) {
    let mut skipped = Vec::new();
    let mut targets = Vec::new();
    for &t in asked {
        let why = t.unavailable().or_else(|| {
            // tarq's beanstalk port runs only once tarq has the flag.
            (t == Target::TarqBeanstalk)
                .then(|| {
                    let mut a = RunArgs::shape(t, 1, 1, 1);
                    a.tarq_bin = tarq_bin.cloned();
                    answers(&a)
                })
                .flatten()
        });
        match why {
            Some(why) => {
                eprintln!("skipping {t}: {why}");
                skipped.push(format!("{t}: {why}"));
            }
            None if !targets.contains(&t) => targets.push(t),
            None => {}
        }
    }
    (targets, skipped)
}

/// The tarq binary every run spawns, rebuilt once first unless one is given.
fn suite_tarq_bin(args: &SuiteArgs, targets: &[Target]) -> Result<Option<PathBuf>> {
    let needs_tarq = targets.iter().any(|t| t.is_tarq());
    if !needs_tarq {
        return Ok(None);
    }
    target::tarq_binary(&SpawnOptions {
        cpu: None,
        tarq_bin: args.tarq_bin.clone(),
        rebuild: args.tarq_bin.is_none(),
        args: Vec::new(),
    })
    .map(Some)
}

fn new_record(args: &SuiteArgs, skipped: Vec<String>) -> SuiteRecord {
    SuiteRecord {
        commit: report::commit(),
        started_at: chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
        finished_at: String::new(),
        machine: Machine::probe(),
        note: args.note.clone(),
        command: std::env::args()
            .map(|a| shell_quote(&a))
            .collect::<Vec<_>>()
            .join(" "),
        duration_s: args.duration.as_secs_f64(),
        warmup_s: args.warmup.as_secs_f64(),
        payload: args.payload,
        runs: Vec::new(),
        skipped,
    }
}

/// Say so when other work already loads the machine: it depresses every figure.
fn warn_if_busy() {
    /// Above this 1-minute load average other work competes for the two pinned cores.
    const BUSY_LOAD: f64 = 1.0;
    let load = report::loadavg()
        .split_whitespace()
        .next()
        .and_then(|l| l.parse::<f64>().ok());
    if let Some(load) = load.filter(|&l| l > BUSY_LOAD) {
        eprintln!(
            "warning: load average {load} before the suite; other work on the machine will depress the figures (say so with --note)"
        );
    }
}

/// tarq in open loop at each `--open-loop` percentage of the reference closed-loop rate.
fn run_open_loop(
    args: &SuiteArgs,
    dir: &Path,
    reference: Option<&(f64, RunArgs)>,
    record: &mut SuiteRecord,
) -> Result<()> {
    let Some((best, a)) = reference else {
        if !args.open_loop.is_empty() {
            eprintln!("no open-loop runs: tarq has no closed-loop result to take fractions of");
        }
        return Ok(());
    };
    for &pct in &args.open_loop {
        let mut open = a.clone();
        open.rate = Some((best * f64::from(pct) / 100.0).round().max(1.0));
        // Latency is what open loop measures: no wake-up delay of the loadgen's own in it.
        open.spin = !args.no_spin;
        one(dir, &open, Some(pct), args.attempts, record)?;
    }
    Ok(())
}

/// Run one cell, record it, and keep going when it fails (the failure is recorded).
fn one(
    dir: &Path,
    a: &RunArgs,
    rate_pct: Option<u32>,
    max_attempts: u32,
    record: &mut SuiteRecord,
) -> Result<Option<Summary>> {
    let label = a.label();
    let mut a = a.clone();
    a.json = Some(dir.join(format!("{label}.json")));
    a.hgrm = Some(dir.join(&label).to_string_lossy().into_owned());
    let mut entry = RunEntry {
        label: label.clone(),
        target: a.target,
        producers: a.producers,
        consumers: a.consumers,
        depth: a.depth,
        rate: a.rate,
        rate_pct,
        command: a.command_line(),
        json: None,
        error: None,
        attempts: 0,
        api: a.api(),
        tube_type: a.tube().map(|t| t.kind),
        target_args: a.target_args.clone(),
        durability: Some(durability(a.target, a.target_args.as_deref())),
        backlog: a.backlog,
        fill: a.fill,
        drain: a.drain,
        unbounded: a.unbounded,
    };
    let mut result = None;
    for attempt in 1..=max_attempts.max(1) {
        entry.attempts = attempt;
        match single::run(&a) {
            Ok(f) => {
                let s = f.summary;
                eprintln!(
                    "{label:<32} {:>10} msgs/s  e2e p50 {:>8.1} µs  p99 {:>9.1} µs  CPU: loadgen {:>3.0}%  target {}  others {}",
                    thousands(s.msgs_per_s),
                    s.e2e_us.p50,
                    s.e2e_us.p99,
                    s.loadgen_cpu * 100.0,
                    pct(s.target_cpu),
                    pct(s.other_cpu)
                );
                entry.json = Some(format!("{label}.json"));
                entry.error = None;
                let disturbed = s.other_cpu.is_some_and(|o| o > MAX_OTHER_CPU);
                result = Some(s);
                if !disturbed || attempt == max_attempts {
                    break;
                }
                eprintln!(
                    "{label:<32} disturbed by other processes: waiting for a quiet machine, then again"
                );
            }
            Err(e) => {
                eprintln!("{label:<32} FAILED: {e:#}");
                // The table gets the root cause; the full chain (with the target's log) went
                // to stderr.
                entry.error = Some(e.root_cause().to_string());
                // A target that cannot start here (missing program or original) will not
                // start on the next attempt either.
                let cannot_start = e.chain().any(|c| c.is::<target::CannotStart>());
                if cannot_start || attempt == max_attempts {
                    break;
                }
            }
        }
        wait_quiet();
    }
    record.runs.push(entry);
    Ok(result)
}

/// Other processes may use this much of a core during a run before the suite calls it
/// disturbed and runs it again: a few percent is the machine's own housekeeping.
const MAX_OTHER_CPU: f64 = 0.15;
/// How long the suite waits for other work to stop before retrying a disturbed run anyway.
const QUIET_DEADLINE: Duration = Duration::from_secs(90);
/// Window over which the machine's CPU use is sampled while waiting.
const QUIET_SAMPLE: Duration = Duration::from_secs(1);

/// Wait (at most `QUIET_DEADLINE`) until the machine is nearly idle: our target is stopped
/// between runs, so whatever uses CPU now is someone else's.
fn wait_quiet() {
    let deadline = std::time::Instant::now() + QUIET_DEADLINE;
    while std::time::Instant::now() < deadline {
        let Some(before) = crate::runner::machine_cpu_seconds() else {
            return;
        };
        std::thread::sleep(QUIET_SAMPLE);
        let Some(after) = crate::runner::machine_cpu_seconds() else {
            return;
        };
        if (after - before) / QUIET_SAMPLE.as_secs_f64() < MAX_OTHER_CPU {
            return;
        }
    }
    eprintln!("the machine stayed busy for {QUIET_DEADLINE:?}; running anyway");
}

/// `results/<name>`, or `<name>-2`, `-3`… when a suite already wrote there.
fn fresh_dir(results: &Path, name: &str) -> Result<PathBuf> {
    /// More same-day, same-commit suites than anyone runs.
    const MAX_SUFFIX: usize = 100;
    for i in 1..=MAX_SUFFIX {
        let dir = if i == 1 {
            results.join(name)
        } else {
            results.join(format!("{name}-{i}"))
        };
        if !dir.exists() {
            std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
            return Ok(dir);
        }
    }
    bail!("{MAX_SUFFIX} result directories named {name} already exist")
}

/// Every suite directory under `results/` (those holding a `suite.json`), oldest first.
fn suites(results: &Path) -> Result<Vec<PathBuf>> {
    let mut dirs: Vec<(String, PathBuf)> = Vec::new();
    for entry in
        std::fs::read_dir(results).with_context(|| format!("reading {}", results.display()))?
    {
        let path = entry?.path();
        if let Ok(text) = std::fs::read_to_string(path.join("suite.json")) {
            if let Ok(rec) = serde_json::from_str::<SuiteRecord>(&text) {
                dirs.push((rec.started_at, path));
            }
        }
    }
    dirs.sort();
    Ok(dirs.into_iter().map(|(_, p)| p).collect())
}

fn newest_suite(results: &Path) -> Result<PathBuf> {
    suites(results)?
        .pop()
        .with_context(|| format!("no suite results under {}", results.display()))
}

/// A loaded suite: its record and each successful run's summary (same order as the record).
struct Loaded {
    record: SuiteRecord,
    runs: Vec<(RunEntry, Option<Summary>)>,
    restart: Option<RestartRecord>,
}

fn load(dir: &Path) -> Result<Loaded> {
    let text = std::fs::read_to_string(dir.join("suite.json"))
        .with_context(|| format!("reading {}/suite.json", dir.display()))?;
    let record: SuiteRecord = serde_json::from_str(&text)?;
    let mut runs = Vec::new();
    for e in &record.runs {
        let s = match &e.json {
            Some(f) => Some(Summary::read_json(&dir.join(f))?),
            None => None,
        };
        runs.push((e.clone(), s));
    }
    let restart = match std::fs::read_to_string(dir.join(RESTART_FILE)) {
        Ok(text) => Some(
            serde_json::from_str(&text)
                .with_context(|| format!("reading {}/{RESTART_FILE}", dir.display()))?,
        ),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        Err(e) => return Err(e).context(format!("reading {}/{RESTART_FILE}", dir.display())),
    };
    Ok(Loaded {
        record,
        runs,
        restart,
    })
}

impl Loaded {
    /// The plain closed-loop run of `series` at this cell.
    fn closed(&self, series: &str, p: usize, c: usize, d: usize) -> Option<&Summary> {
        self.runs.iter().find_map(|(e, s)| {
            (e.is_plain()
                && e.series() == series
                && e.producers == p
                && e.consumers == c
                && e.depth == d)
                .then_some(s.as_ref())
                .flatten()
        })
    }

    /// The plain closed-loop cells, in the order they ran.
    fn cells(&self) -> Vec<(usize, usize, usize)> {
        let mut cells = Vec::new();
        for (e, _) in &self.runs {
            let cell = (e.producers, e.consumers, e.depth);
            if e.is_plain() && !cells.contains(&cell) {
                cells.push(cell);
            }
        }
        cells
    }

    /// The series of the plain closed-loop runs, in the order they ran.
    fn targets(&self) -> Vec<String> {
        let mut ts = Vec::new();
        for (e, _) in &self.runs {
            if e.is_plain() && !ts.contains(&e.series()) {
                ts.push(e.series());
            }
        }
        ts
    }

    /// The runs with backlog phases (fill, backlog, unbounded), in the order they ran.
    fn backlogs(&self) -> Vec<(&RunEntry, &Summary)> {
        self.runs
            .iter()
            .filter(|(e, _)| e.rate.is_none() && !e.is_plain())
            .filter_map(|(e, s)| s.as_ref().map(|s| (e, s)))
            .collect()
    }

    fn open(&self) -> Vec<(&RunEntry, &Summary)> {
        self.runs
            .iter()
            .filter(|(e, _)| e.rate.is_some())
            .filter_map(|(e, s)| s.as_ref().map(|s| (e, s)))
            .collect()
    }
}

fn cell_name(p: usize, c: usize, d: usize) -> String {
    format!("p{p}c{c}-d{d}")
}

/// Draw the suite's charts into its directory; returns (title, file name) pairs.
fn draw(dir: &Path, l: &Loaded) -> Result<Vec<(String, String)>> {
    let mut charts = Vec::new();
    for (p, c, d) in l.cells() {
        let present: Vec<(String, &Summary)> = l
            .targets()
            .into_iter()
            .filter_map(|t| l.closed(&t, p, c, d).map(|s| (t, s)))
            .collect();
        if present.is_empty() {
            continue;
        }
        let name = format!("latency-{}.svg", cell_name(p, c, d));
        let title = format!("put→ack latency by percentile, {p}+{c} connections, depth {d}");
        plot::latency(
            &dir.join(&name),
            &title,
            &present
                .iter()
                .map(|(t, s)| (t.clone(), s.spectra.e2e.clone()))
                .collect::<Vec<_>>(),
        )?;
        charts.push((title, name));
        let name = format!("throughput-{}.svg", cell_name(p, c, d));
        let title = format!("throughput over time, {p}+{c} connections, depth {d}");
        plot::throughput(
            &dir.join(&name),
            &title,
            &present
                .iter()
                .map(|(t, s)| (t.clone(), s.series.clone()))
                .collect::<Vec<_>>(),
        )?;
        charts.push((title, name));
    }
    let open = l.open();
    if !open.is_empty() {
        let name = "latency-open-loop.svg".to_string();
        let title =
            "tarq open loop: put→ack latency by percentile at fractions of its closed-loop rate"
                .to_string();
        plot::latency(
            &dir.join(&name),
            &title,
            &open
                .iter()
                .map(|(e, s)| {
                    (
                        format!(
                            "{}% ({} msgs/s)",
                            e.rate_pct.unwrap_or(0),
                            thousands(e.rate.unwrap_or(0.0))
                        ),
                        s.spectra.e2e.clone(),
                    )
                })
                .collect::<Vec<_>>(),
        )?;
        charts.push((title, name));
    }
    Ok(charts)
}

fn ratio(a: Option<&Summary>, b: Option<&Summary>) -> Option<f64> {
    let (a, b) = (a?, b?);
    (b.msgs_per_s > 0.0).then(|| a.msgs_per_s / b.msgs_per_s)
}

fn fmt_ratio(r: Option<f64>) -> String {
    r.map(|r| format!("{r:.2}×")).unwrap_or_else(|| "–".into())
}

fn fmt_msgs(s: Option<&Summary>) -> String {
    s.map(|s| thousands(s.msgs_per_s))
        .unwrap_or_else(|| "–".into())
}

/// The generated section of `results/README.md` lies between these lines; the rest of the file
/// (other crates' results) is left as it is.
const BLOCK_BEGIN: &str = "<!-- BEGIN tarq-loadgen suite: generated, do not edit by hand -->";
const BLOCK_END: &str = "<!-- END tarq-loadgen suite -->";

/// Put `block` into `readme`: in place of the previous block, or appended when there is none.
fn merge_block(readme: Option<&str>, block: &str) -> String {
    let Some(text) = readme else {
        return format!("# results\n\n{block}");
    };
    match (text.find(BLOCK_BEGIN), text.find(BLOCK_END)) {
        (Some(b), Some(e)) if b < e => {
            let after = &text[e + BLOCK_END.len()..];
            let after = after.strip_prefix('\n').unwrap_or(after);
            format!("{}{block}{after}", &text[..b])
        }
        _ => {
            let mut out = text.trim_end().to_string();
            out.push_str("\n\n");
            out.push_str(block);
            out
        }
    }
}

/// Regenerate the suite's section of `results/README.md` (and the charts) from `dir`, which
/// lies under `results`: the README's links are relative to `results`.
pub fn write_readme(results: &Path, dir: &Path) -> Result<()> {
    let results = &results
        .canonicalize()
        .with_context(|| format!("{}", results.display()))?;
    let dir = &dir
        .canonicalize()
        .with_context(|| format!("{}", dir.display()))?;
    let l = load(dir)?;
    let charts = draw(dir, &l)?;
    let rel = dir
        .strip_prefix(results)
        .unwrap_or(dir)
        .to_string_lossy()
        .into_owned();
    let block = render(&rel, &l, &charts, &suites(results)?, results);
    let path = results.join("README.md");
    let old = std::fs::read_to_string(&path).ok();
    let text = merge_block(old.as_deref(), &block);
    std::fs::write(&path, text).with_context(|| format!("writing {}/README.md", results.display()))
}

/// The suite's section of `results/README.md`, one part after another.
fn render(
    rel: &str,
    l: &Loaded,
    charts: &[(String, String)],
    all: &[PathBuf],
    results: &Path,
) -> String {
    let mut o = String::new();
    let _ = writeln!(o, "{BLOCK_BEGIN}");
    render_method(&mut o, rel);
    render_this_run(&mut o, &l.record);
    render_throughput(&mut o, l);
    render_goals(&mut o, l);
    render_open_loop(&mut o, l);
    render_backlogs(&mut o, l);
    render_restarts(&mut o, l);
    render_every_run(&mut o, rel, l);
    render_charts(&mut o, rel, charts);
    render_reproduce(&mut o, l);
    render_earlier(&mut o, rel, all, results);
    let _ = writeln!(o, "{BLOCK_END}");
    o
}

/// What one message is, how targets were started and what each latency counts.
fn render_method(o: &mut String, rel: &str) {
    let _ = writeln!(
        o,
        "## End to end: tarq and its peers (`tarq-loadgen suite`)\n"
    );
    let _ = writeln!(
        o,
        "Generated by `tarq-loadgen suite` from the files in [`{rel}/`]({rel}/); do not edit this \
         section by hand (re-run the suite, or `tarq-loadgen suite --report-only` to redraw it).\n"
    );
    let _ = writeln!(
        o,
        "One message is a put by a producer connection, then a take and an ack by a consumer \
         connection, each on its own connection. Every target was started fresh by the loadgen \
         (`--spawn`, empty temporary data directory) and pinned to core 0; the loadgen, one \
         single-threaded pipelining client, ran on core 1. Closed loop: as fast as the target \
         answers, with at most (producers + consumers) × depth messages put and not yet acked. \
         Latencies, in microseconds: `e2e` put sent → ack answered, per message (from the \
         intended send time in open loop); `put` the put's round trip; `cycle` take → ack \
         answered, counted from the later of the take's send and the message's put (so a \
         consumer's idle wait on an empty queue is not counted).\n\n\
         Durability as each target was started: tarq with its defaults (WAL mode `write`: every \
         change written to the OS before the reply, like the reference's `wal_mode = 'write'`), \
         and in the columns `tarq WAL fsync` / `tarq WAL none` with `--wal-mode`; `tarantool` \
         is Tarantool running the reference queue with its `init.lua` defaults, \
         `tarantool-queue fifottl` the original tarantool/queue 1.5.0 (`serve.lua`, \
         `wal_mode = 'write'`) driven through `queue.tube.<name>:put/take/ack` on a fifottl \
         tube, as `tarq tubes fifottl` drives tarq; Redis with `--save '' --appendonly no` (in \
         memory), and in the `redis AOF …` columns with `--appendonly yes --appendfsync …`; \
         beanstalkd without `-b` (in memory) and `beanstalkd-binlog` with `-b` in its data \
         directory (its default fsync, at most every 50 ms). Runs with a backlog (fill, \
         standing backlog, drain) are in their own table, never in the comparison.\n"
    );
}

/// The commit, machine and settings of the suite shown.
fn render_this_run(o: &mut String, r: &SuiteRecord) {
    let _ = writeln!(o, "### This run\n");
    let _ = writeln!(
        o,
        "- commit `{}`, {} → {}",
        r.commit, r.started_at, r.finished_at
    );
    let _ = writeln!(
        o,
        "- machine: {} cores, {}, Linux {}; load average {} before, {} after",
        r.machine.cores,
        r.machine.cpu_model,
        r.machine.kernel,
        loadavg3(&r.machine.loadavg_before),
        loadavg3(&r.machine.loadavg_after)
    );
    let _ = writeln!(
        o,
        "- each run: {} s measured after {} s warm-up, {}-byte payloads",
        r.duration_s, r.warmup_s, r.payload
    );
    if let Some(n) = &r.note {
        let _ = writeln!(o, "- note: {n}");
    }
    for s in &r.skipped {
        let _ = writeln!(o, "- skipped {s}");
    }
    let _ = writeln!(o, "- command: `{}`\n", r.command);
}

/// The comparison table: msgs/s per series and cell, and tarq's ratio to each peer.
fn render_throughput(o: &mut String, l: &Loaded) {
    let targets = l.targets();
    let (tarq, null) = ("tarq", "null");
    let has = |t: &str| targets.iter().any(|x| x == t);
    let peers: Vec<&String> = targets
        .iter()
        .filter(|t| !t.starts_with("tarq") && *t != null)
        .collect();
    let _ = writeln!(o, "### Throughput (msgs/s, closed loop)\n");
    let mut header = String::from("| connections | depth |");
    let mut rule = String::from("|---|---|");
    for t in &targets {
        let _ = write!(header, " {t} |");
        rule.push_str("---:|");
    }
    if has(tarq) {
        for p in &peers {
            let _ = write!(header, " tarq / {p} |");
            rule.push_str("---:|");
        }
        if has(null) {
            header.push_str(" tarq / null |");
            rule.push_str("---:|");
        }
    }
    let _ = writeln!(o, "{header}\n{rule}");
    for (p, c, d) in l.cells() {
        let mut row = format!("| {p}+{c} | {d} |");
        for t in &targets {
            let _ = write!(row, " {} |", fmt_msgs(l.closed(t, p, c, d)));
        }
        if has(tarq) {
            let ours = l.closed(tarq, p, c, d);
            for peer in &peers {
                let _ = write!(
                    row,
                    " {} |",
                    fmt_ratio(ratio(ours, l.closed(peer, p, c, d)))
                );
            }
            if has(null) {
                let _ = write!(
                    row,
                    " {} |",
                    ratio(ours, l.closed(null, p, c, d))
                        .map(|x| format!("{:.0}%", x * 100.0))
                        .unwrap_or_else(|| "–".into())
                );
            }
        }
        let _ = writeln!(o, "{row}");
    }
    if has(null) {
        let _ = writeln!(
            o,
            "\n`null` is tarq `--null`, which answers every call at once with an empty result: the \
         loadgen's ceiling on this machine at that shape, so `tarq / null` reads as the fraction \
         of what the load generator can drive."
        );
    }
    let _ = writeln!(o);
}

/// One goal: `ours` at least `min` times `theirs`, at every cell or at one depth.
struct Goal {
    ours: &'static str,
    theirs: &'static str,
    min: f64,
    depth: Option<usize>,
}

/// The ratios tarq is measured against (its goals beside each peer); a goal whose two series
/// did not both run is left out.
const GOALS: [Goal; 9] = [
    Goal {
        ours: "tarq",
        theirs: "tarantool",
        min: GOAL_VS_TARANTOOL,
        depth: None,
    },
    Goal {
        ours: "tarq",
        theirs: "tarantool-queue fifottl",
        min: GOAL_VS_TARANTOOL_QUEUE,
        depth: Some(16),
    },
    Goal {
        ours: "tarq",
        theirs: "beanstalkd",
        min: GOAL_VS_BEANSTALKD,
        depth: None,
    },
    Goal {
        ours: "tarq",
        theirs: "redis",
        min: GOAL_VS_REDIS,
        depth: None,
    },
    Goal {
        ours: "tarq tubes fifottl",
        theirs: "tarq",
        min: GOAL_TUBES_VS_SEED,
        depth: None,
    },
    Goal {
        ours: "tarq tubes fifottl",
        theirs: "tarantool-queue fifottl",
        min: GOAL_VS_TARANTOOL_QUEUE,
        depth: Some(16),
    },
    Goal {
        ours: "tarq-beanstalk",
        theirs: "beanstalkd",
        min: GOAL_BEANSTALK_VS_BEANSTALKD,
        depth: Some(16),
    },
    Goal {
        ours: "tarq-beanstalk",
        theirs: "beanstalkd",
        min: GOAL_BEANSTALK_AT_DEPTH_1,
        depth: Some(1),
    },
    Goal {
        ours: "tarq-beanstalk",
        theirs: "beanstalkd-binlog",
        min: GOAL_BEANSTALK_VS_BINLOG,
        depth: Some(16),
    },
];

/// The goals and whether this suite meets them.
fn render_goals(o: &mut String, l: &Loaded) {
    let _ = writeln!(o, "### Goals\n");
    let _ = writeln!(o, "| goal | measured | met |\n|---|---|---|");
    let cells = l.cells();
    for g in &GOALS {
        let ratios: Vec<f64> = cells
            .iter()
            .filter(|c| g.depth.is_none_or(|d| c.2 == d))
            .filter_map(|&(p, c, d)| ratio(l.closed(g.ours, p, c, d), l.closed(g.theirs, p, c, d)))
            .collect();
        if ratios.is_empty() {
            continue;
        }
        let min = ratios.iter().copied().fold(f64::INFINITY, f64::min);
        let max = ratios.iter().copied().fold(0.0, f64::max);
        let at = g
            .depth
            .map(|d| format!("at depth {d}"))
            .unwrap_or_else(|| "at every shape".into());
        let _ = writeln!(
            o,
            "| {} ≥ {}× {} {at} | {min:.2}× – {max:.2}× | {} |",
            g.ours,
            g.min,
            g.theirs,
            met(min >= g.min)
        );
    }
    let best16 = cells
        .iter()
        .filter(|c| c.2 == 16)
        .filter_map(|&(p, c, d)| l.closed("tarq", p, c, d))
        .map(|s| s.msgs_per_s)
        .fold(None, |a: Option<f64>, v| Some(a.map_or(v, |a| a.max(v))));
    if let Some(b) = best16 {
        let _ = writeln!(
            o,
            "| tarq closed loop ≥ {} msgs/s at depth 16 | {} msgs/s | {} |",
            thousands(GOAL_DEPTH16_MSGS),
            thousands(b),
            met(b >= GOAL_DEPTH16_MSGS)
        );
    }
    if let Some((e, s)) = l.open().into_iter().find(|(e, _)| e.rate_pct == Some(50)) {
        let _ = writeln!(
            o,
            "| put→ack p99 ≤ {} µs at 50% of tarq's maximum | {:.0} µs at {} msgs/s ({}+{}, depth {}) | {} |",
            GOAL_P99_US_AT_HALF,
            s.e2e_us.p99,
            thousands(e.rate.unwrap_or(0.0)),
            e.producers,
            e.consumers,
            e.depth,
            met(s.e2e_us.p99 <= GOAL_P99_US_AT_HALF)
        );
    }
    let _ = writeln!(o);
}

/// Runs with backlog phases, one line per phase: how fast the fill went, what the steady
/// phase did with the backlog standing, how fast it drained, and the worst stall in each.
fn render_backlogs(o: &mut String, l: &Loaded) {
    let runs = l.backlogs();
    if runs.is_empty() {
        return;
    }
    let _ = writeln!(o, "### Backlog shapes\n");
    let _ = writeln!(
        o,
        "| run | shape | phase | seconds | puts/s | acks/s | put p99.9 | put max | stall | left |\n|---|---|---|---:|---:|---:|---:|---:|---:|---:|"
    );
    for (e, s) in runs {
        for ph in &s.phases {
            let _ = writeln!(
                o,
                "| {} | {} | {:?} | {:.2} | {} | {} | {:.0} | {:.0} | {:.0} | {} |",
                e.series(),
                e.shape(),
                ph.phase,
                ph.measured_s,
                thousands(ph.puts_per_s),
                thousands(ph.acks_per_s),
                ph.put_us.p999,
                ph.put_us.max,
                ph.stall.gap_us,
                thousands(ph.unacked as f64)
            );
        }
    }
    let _ = writeln!(
        o,
        "\nLatencies and stalls in µs; `stall` is the longest a connection waited for a reply with \
         a request outstanding; `left` is the messages put and not yet acked when the phase ended.\n"
    );
}

/// The restart loop, a row per lifetime.
fn render_restarts(o: &mut String, l: &Loaded) {
    let Some(r) = &l.restart else {
        return;
    };
    let _ = writeln!(o, "### Restart loop\n");
    let _ = writeln!(
        o,
        "tarq started and stopped (SIGTERM) {} times on one data directory, with its defaults{}; \
         each lifetime puts {} messages of {} bytes and takes and acks them all, so the queue is \
         empty at every stop and no lifetime alone writes the WAL a snapshot waits for. `start` \
         is from starting the process to its first answer (recovery included, in 25 ms probe \
         steps); the directory is measured after the stop.\n",
        r.cycles.len(),
        if r.target_args.is_empty() {
            String::new()
        } else {
            format!(" and `{}`", r.target_args.join(" "))
        },
        thousands(r.messages_per_cycle as f64),
        r.payload
    );
    let _ = writeln!(
        o,
        "| cycle | start (ms) | msgs/s | errors | unacked | directory | snapshots | WAL segments |\n|---:|---:|---:|---:|---:|---:|---:|---:|"
    );
    for c in &r.cycles {
        let _ = writeln!(
            o,
            "| {} | {:.0} | {} | {} | {} | {:.1} MB | {} | {} |",
            c.cycle,
            c.start_ms,
            thousands(c.msgs_per_s),
            c.errors,
            c.unacked,
            c.dir_bytes as f64 / 1e6,
            c.snapshots,
            c.wal_segments
        );
    }
    let _ = writeln!(
        o,
        "\nLargest directory after a stop: {:.1} MB.\n",
        r.peak_dir_bytes() as f64 / 1e6
    );
}

/// tarq on a fixed schedule at fractions of its closed-loop rate.
fn render_open_loop(o: &mut String, l: &Loaded) {
    let open = l.open();
    if !open.is_empty() {
        let _ = writeln!(o, "### tarq open loop\n");
        let _ = writeln!(
            o,
            "Messages sent on a fixed schedule at a fraction of tarq's closed-loop rate at the same \
             shape; every latency counts from the intended send time, so a stall shows in full \
             (no coordinated omission). {}`send lag` is how late puts left after their intended \
             time (the loadgen's share of the latency).\n",
            if open.iter().all(|(e, _)| e.command.contains(" --spin")) {
                "The loadgen busy-polls here (`--spin`), so its own wake-up delay is not in the \
                 figures. "
            } else {
                "The loadgen slept between events here, so its own wake-up delay is in the figures. "
            }
        );
        let _ = writeln!(
            o,
            "| connections | depth | rate | of max | achieved msgs/s | put→ack p50 | p90 | p99 | p99.9 | max | send lag p99 |\n|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
        );
        for (e, s) in &open {
            let _ = writeln!(
                o,
                "| {}+{} | {} | {} | {}% | {} | {:.1} | {:.1} | {:.1} | {:.1} | {:.1} | {} |",
                e.producers,
                e.consumers,
                e.depth,
                thousands(e.rate.unwrap_or(0.0)),
                e.rate_pct.unwrap_or(0),
                thousands(s.msgs_per_s),
                s.e2e_us.p50,
                s.e2e_us.p90,
                s.e2e_us.p99,
                s.e2e_us.p999,
                s.e2e_us.max,
                s.send_lag_us
                    .map(|l| format!("{:.1}", l.p99))
                    .unwrap_or_else(|| "–".into())
            );
        }
        let _ = writeln!(o);
    }
}

/// One row per run with a link to its JSON, failures included.
fn render_every_run(o: &mut String, rel: &str, l: &Loaded) {
    let _ = writeln!(o, "### Every run\n");
    let _ = writeln!(
        o,
        "| run | msgs/s | errors | put p50 / p99 | cycle p50 / p99 | e2e p50 / p99 / p99.9 | loadgen CPU | target CPU | other CPU |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|"
    );
    for (e, s) in &l.runs {
        match s {
            Some(s) => {
                let _ = writeln!(
                    o,
                    "| [{}]({rel}/{}.json){} | {} | {} | {:.0} / {:.0} | {:.0} / {:.0} | {:.0} / {:.0} / {:.0} | {:.0}% | {} | {} |",
                    e.label,
                    e.label,
                    if e.attempts > 1 {
                        format!(" (attempt {})", e.attempts)
                    } else {
                        String::new()
                    },
                    thousands(s.msgs_per_s),
                    s.errors,
                    s.put_us.p50,
                    s.put_us.p99,
                    s.cycle_us.p50,
                    s.cycle_us.p99,
                    s.e2e_us.p50,
                    s.e2e_us.p99,
                    s.e2e_us.p999,
                    s.loadgen_cpu * 100.0,
                    pct(s.target_cpu),
                    pct(s.other_cpu)
                );
            }
            None => {
                let _ = writeln!(
                    o,
                    "| {} | failed: {} | | | | | | | |",
                    e.label,
                    e.error
                        .as_deref()
                        .unwrap_or("?")
                        .replace('\n', " ")
                        .replace('|', "\\|")
                );
            }
        }
    }
    let _ = writeln!(
        o,
        "\nCPU is the share of one core used over the measured window (from `/proc/<pid>/stat`): \
         a loadgen near 100% may be the bottleneck (except in `--spin` runs, which busy-poll); a \
         target near 100% is saturated. Other CPU is what every other process on the machine \
         used meanwhile (from `/proc/stat`): anything but a few percent means the run was \
         disturbed; the suite makes such a run again once the machine is quiet (up to `--attempts` \
         times, \"attempt N\" above) and keeps the last. Latencies in µs.\n"
    );
}

fn render_charts(o: &mut String, rel: &str, charts: &[(String, String)]) {
    if !charts.is_empty() {
        let _ = writeln!(o, "### Charts\n");
        for (title, file) in charts {
            let _ = writeln!(o, "#### {title}\n\n![{title}]({rel}/{file})\n");
        }
    }
}

/// The commands that repeat the suite and each of its runs.
fn render_reproduce(o: &mut String, l: &Loaded) {
    let r = &l.record;
    let _ = writeln!(o, "### How to reproduce\n");
    let _ = writeln!(
        o,
        "Peers come from Debian: `apt-get install -y tarantool beanstalkd redis-server` \
         (Tarantool runs the originals from `$TARQ_REFERENCE_DIR`: `tarantool-seed/init.lua`, the \
         article's queue, and `tarantool-queue/serve.lua`, tarantool/queue 1.5.0; see the \
         README's Tests). \
         The whole suite (it rebuilds `target/release/tarq` first):\n\n```sh\n\
         cargo run --release -p tarq-loadgen -- suite --duration {}s --warmup {}s\n```\n",
        r.duration_s, r.warmup_s
    );
    let _ = writeln!(o, "Each run on its own (add `--json FILE --hgrm PREFIX --svg PREFIX` for the outputs):\n\n```sh");
    for (e, _) in &l.runs {
        let _ = writeln!(o, "{}", e.command);
    }
    let _ = writeln!(o, "```\n");
    let _ = writeln!(
        o,
        "Files per run in the suite directory: `<run>.json` (configuration, commit, machine, \
         every figure, the per-second series and the percentile spectra) and \
         `<run>-{{put,cycle,e2e}}.hgrm` (HdrHistogram percentile distributions, values in µs).\n"
    );
}

/// Links to the other suites under `results/`.
fn render_earlier(o: &mut String, rel: &str, all: &[PathBuf], results: &Path) {
    if all.len() > 1 {
        let _ = writeln!(o, "### Earlier suites\n");
        for d in all.iter().rev() {
            let name = d.strip_prefix(results).unwrap_or(d).to_string_lossy();
            if name != rel {
                let _ = writeln!(o, "- [`{name}/`]({name}/)");
            }
        }
        let _ = writeln!(o);
    }
}

/// `a` as a POSIX shell word: unchanged when it is plain, else in single quotes.
fn shell_quote(a: &str) -> String {
    let plain = !a.is_empty()
        && a.chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_./:=,+@%".contains(c));
    if plain {
        a.to_string()
    } else {
        format!("'{}'", a.replace('\'', "'\\''"))
    }
}

fn pct(v: Option<f64>) -> String {
    v.map(|t| format!("{:.0}%", t * 100.0))
        .unwrap_or_else(|| "–".into())
}

/// The 1, 5 and 15 minute load averages of a `/proc/loadavg` line.
fn loadavg3(line: &str) -> String {
    line.split_whitespace()
        .take(3)
        .collect::<Vec<_>>()
        .join(" ")
}

fn met(ok: bool) -> &'static str {
    if ok {
        "yes"
    } else {
        "**no**"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shapes_parse() {
        assert_eq!(parse_shape("4x4").unwrap(), (4, 4));
        assert_eq!(parse_shape("32+16").unwrap(), (32, 16));
        assert!(parse_shape("4")
            .unwrap_err()
            .to_string()
            .contains("PRODUCERSxCONSUMERS"));
        assert!(parse_shape("0x1").is_err());
    }

    #[test]
    fn the_generated_block_replaces_itself_and_nothing_else() {
        let block = |n: u32| format!("{BLOCK_BEGIN}\n## suite {n}\n{BLOCK_END}\n");
        let fresh = merge_block(None, &block(1));
        assert!(fresh.starts_with("# results\n\n") && fresh.ends_with(&block(1)));
        let others = "# results\n\n## engine\n\nfigures\n";
        let once = merge_block(Some(others), &block(1));
        assert_eq!(once, format!("{others}\n{}", block(1)));
        let with_tail = format!("{once}\n## durability\n\nmore\n");
        let twice = merge_block(Some(&with_tail), &block(2));
        assert_eq!(
            twice,
            format!("{others}\n{}\n## durability\n\nmore\n", block(2))
        );
    }

    #[test]
    fn commands_are_quoted_for_the_shell() {
        assert_eq!(shell_quote("--duration"), "--duration");
        assert_eq!(shell_quote("a b"), "'a b'");
        assert_eq!(shell_quote("it's"), "'it'\\''s'");
        assert_eq!(shell_quote(""), "''");
    }

    /// The suite's arguments as the command line `suite ARGS` gives them.
    fn suite_args(args: &[&str]) -> SuiteArgs {
        #[derive(clap::Parser)]
        struct Cli {
            #[command(flatten)]
            suite: SuiteArgs,
        }
        <Cli as clap::Parser>::parse_from(std::iter::once("suite").chain(args.iter().copied()))
            .suite
    }

    #[test]
    fn report_only_takes_an_optional_directory() {
        assert_eq!(suite_args(&[]).report_only, None);
        assert_eq!(suite_args(&["--report-only"]).report_only, Some(None));
        assert_eq!(
            suite_args(&["--report-only", "results/x"]).report_only,
            Some(Some(PathBuf::from("results/x")))
        );
    }

    #[test]
    fn a_run_that_cannot_start_is_made_once_and_fails_the_suite_leaving_the_readme() {
        let out = tempfile::tempdir().unwrap();
        let readme = out.path().join("README.md");
        std::fs::write(&readme, "# results\n\nkept\n").unwrap();
        let args = suite_args(&["--out", out.path().to_str().unwrap(), "--attempts", "3"]);
        let dir = fresh_dir(out.path(), "suite").unwrap();
        let mut record = new_record(&args, Vec::new());
        // Tarantool runs a Lua script that takes no arguments: no start can succeed.
        let mut a = RunArgs::shape(Target::Tarantool, 1, 1, 1);
        a.target_args = Some("--wal-mode none".into());
        a.no_pin = true;
        a.quiet = true;
        assert!(one(&dir, &a, None, args.attempts, &mut record)
            .unwrap()
            .is_none());
        assert_eq!(record.runs[0].attempts, 1, "{:?}", record.runs[0]);
        let err = finish(out.path(), &dir, &mut record).unwrap_err();
        assert!(err.to_string().contains("1 of 1 runs failed"), "{err:#}");
        assert!(dir.join("suite.json").exists());
        assert_eq!(
            std::fs::read_to_string(&readme).unwrap(),
            "# results\n\nkept\n"
        );
        // Every target skipped: nothing ran, nothing is drawn.
        let mut record = new_record(
            &args,
            vec!["tarantool: the article's queue not found".into()],
        );
        let err = finish(out.path(), &dir, &mut record).unwrap_err();
        assert!(err.to_string().contains("nothing ran"), "{err:#}");
        assert_eq!(
            std::fs::read_to_string(&readme).unwrap(),
            "# results\n\nkept\n"
        );
    }

    #[test]
    fn fresh_dirs_never_reuse_a_name() {
        let tmp = tempfile::tempdir().unwrap();
        let a = fresh_dir(tmp.path(), "2024-01-01-abc").unwrap();
        let b = fresh_dir(tmp.path(), "2024-01-01-abc").unwrap();
        assert_ne!(a, b);
        assert!(b.ends_with("2024-01-01-abc-2"));
    }

    fn entry(target: Target, target_args: Option<&str>) -> RunEntry {
        RunEntry {
            label: String::new(),
            target,
            producers: 4,
            consumers: 4,
            depth: 16,
            rate: None,
            rate_pct: None,
            command: String::new(),
            json: None,
            error: None,
            attempts: 1,
            api: Api::Seed,
            tube_type: None,
            target_args: target_args.map(String::from),
            durability: Some(durability(target, target_args)),
            backlog: None,
            fill: None,
            drain: false,
            unbounded: false,
        }
    }

    #[test]
    fn series_keep_apis_durability_and_shapes_apart() {
        assert_eq!(entry(Target::Tarq, None).series(), "tarq");
        assert_eq!(
            entry(Target::Tarq, Some("--wal-mode fsync")).series(),
            "tarq WAL fsync"
        );
        let aof = "--appendonly yes --appendfsync always";
        assert_eq!(entry(Target::Redis, Some(aof)).series(), "redis AOF always");
        assert_eq!(durability(Target::Redis, None), "in memory");
        assert_eq!(durability(Target::BeanstalkdBinlog, None), "binlog");
        let mut tubes = entry(Target::Tarq, None);
        tubes.api = Api::Tubes;
        tubes.tube_type = Some(TubeType::Fifottl);
        assert_eq!(tubes.series(), "tarq tubes fifottl");
        let mut original = entry(Target::TarantoolQueue, None);
        original.api = Api::Tubes;
        original.tube_type = Some(TubeType::Fifottl);
        assert_eq!(original.series(), "tarantool-queue fifottl");
        let mut fill = entry(Target::Tarq, None);
        assert!(fill.is_plain());
        fill.fill = Some(10_000_000);
        fill.drain = true;
        assert!(!fill.is_plain());
        assert_eq!(fill.shape(), "fill 10,000,000, then drain");
    }
}
