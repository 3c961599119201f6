//! One run from the command line's point of view: the flags, starting the target when asked,
//! pinning, running the load, and writing the table, JSON, `.hgrm` and SVG outputs. The suite
//! builds the same `RunArgs` for each cell of its matrix, so a suite row and a hand-typed
//! command measure exactly the same thing.

use crate::proto::beanstalk::{BeanstalkDriver, DEFAULT_MAX_JOB_BYTES};
use crate::proto::iproto::IprotoDriver;
use crate::proto::resp::RedisDriver;
use crate::report::{self, ConfigRecord, Machine, Summary};
use crate::runner::{self, Outcome, RunConfig};
use crate::target::{self, SpawnOptions, Spawned, Target};
use anyhow::{bail, Context, Result};
use clap::Args;
use std::net::{SocketAddr, ToSocketAddrs};
use std::path::PathBuf;
use std::time::Duration;

/// Default core for a spawned target; the loadgen takes `LOADGEN_CORE`.
pub const TARGET_CORE: usize = 0;
pub const LOADGEN_CORE: usize = 1;

#[derive(Args, Clone, Debug)]
pub struct RunArgs {
    /// System under test.
    #[arg(long, value_enum, default_value_t = Target::Tarq)]
    pub target: Target,
    /// Address of a running target (default 127.0.0.1 and the target's usual port).
    #[arg(long)]
    pub addr: Option<String>,
    /// Start the target on a free port and a fresh temporary data dir, pinned to
    /// --target-cpu, and stop it afterwards.
    #[arg(long)]
    pub spawn: bool,
    /// Producer connections.
    #[arg(long, default_value_t = 4)]
    pub producers: usize,
    /// Consumer connections.
    #[arg(long, default_value_t = 4)]
    pub consumers: usize,
    /// Requests in flight per connection (pipelining depth).
    #[arg(long, default_value_t = 16)]
    pub depth: usize,
    /// Payload bytes per message (at least 24: the timing stamp).
    #[arg(long, default_value_t = 64)]
    pub payload: usize,
    /// Measured time, e.g. 10s, 500ms, 1m.
    #[arg(long, default_value = "10s", value_parser = humantime::parse_duration)]
    pub duration: Duration,
    /// Load applied before measuring starts.
    #[arg(long, default_value = "1s", value_parser = humantime::parse_duration)]
    pub warmup: Duration,
    /// Pin the loadgen to this core (default with --spawn: 1).
    #[arg(long)]
    pub cpu: Option<usize>,
    /// Pin the spawned target to this core (default with --spawn: 0).
    #[arg(long)]
    pub target_cpu: Option<usize>,
    /// Open loop: this many messages a second, latency from each intended send time.
    /// Without it, closed loop (as fast as the target answers).
    #[arg(long)]
    pub rate: Option<f64>,
    /// Closed loop: at most this many messages put but not yet acked
    /// (default (producers + consumers) × depth).
    #[arg(long)]
    pub window: Option<usize>,
    /// Seconds a take waits when nothing is ready (beanstalkd rounds up to whole seconds).
    #[arg(long, default_value_t = 0.1)]
    pub take_timeout: f64,
    /// Write every figure as JSON to this file.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// Write the percentile spectra to PREFIX-put.hgrm, PREFIX-cycle.hgrm, PREFIX-e2e.hgrm.
    #[arg(long)]
    pub hgrm: Option<String>,
    /// Draw PREFIX-throughput.svg and PREFIX-latency.svg.
    #[arg(long)]
    pub svg: Option<String>,
    /// tarq binary to spawn (default: target/release/tarq, built when missing).
    #[arg(long)]
    pub tarq_bin: Option<PathBuf>,
    /// Busy-poll instead of sleeping between events: exact send times and latencies without
    /// the loadgen's own wake-up delay, at the price of a whole core (its CPU then reads 100%).
    /// For a loadgen pinned to a core of its own on a quiet machine.
    #[arg(long)]
    pub spin: bool,
    /// No progress bar.
    #[arg(long)]
    pub quiet: bool,
    /// Pin neither the target nor the loadgen (tests on a shared machine).
    #[arg(long, conflicts_with_all = ["cpu", "target_cpu"])]
    pub no_pin: bool,
}

impl RunArgs {
    /// Arguments for a spawned closed-loop run of one shape; the suite starts from this.
    pub fn shape(target: Target, producers: usize, consumers: usize, depth: usize) -> RunArgs {
        RunArgs {
            target,
            addr: None,
            spawn: true,
            producers,
            consumers,
            depth,
            payload: 64,
            duration: Duration::from_secs(10),
            warmup: Duration::from_secs(1),
            cpu: None,
            target_cpu: None,
            rate: None,
            window: None,
            take_timeout: 0.1,
            json: None,
            hgrm: None,
            svg: None,
            tarq_bin: None,
            spin: false,
            quiet: false,
            no_pin: false,
        }
    }

    pub fn window(&self) -> usize {
        self.window.unwrap_or_else(|| {
            RunConfig::default_window(self.producers, self.consumers, self.depth)
        })
    }

    /// A name for this run's files: `tarq-p4c4-d16`, `tarq-p4c4-d16-r150000`.
    pub fn label(&self) -> String {
        let mut s = format!(
            "{}-p{}c{}-d{}",
            self.target, self.producers, self.consumers, self.depth
        );
        if let Some(r) = self.rate {
            s.push_str(&format!("-r{}", r.round() as u64));
        }
        s
    }

    /// A command line that repeats this run (outputs left out).
    pub fn command_line(&self) -> String {
        let mut s = format!("tarq-loadgen --target {}", self.target);
        if self.spawn {
            s.push_str(" --spawn");
        } else if let Some(a) = &self.addr {
            s.push_str(&format!(" --addr {a}"));
        }
        s.push_str(&format!(
            " --producers {} --consumers {} --depth {} --payload {} --duration {} --warmup {}",
            self.producers,
            self.consumers,
            self.depth,
            self.payload,
            humantime::format_duration(self.duration),
            humantime::format_duration(self.warmup)
        ));
        if let Some(r) = self.rate {
            s.push_str(&format!(" --rate {}", r.round() as u64));
        }
        if let Some(w) = self.window {
            s.push_str(&format!(" --window {w}"));
        }
        if self.spin {
            s.push_str(" --spin");
        }
        if self.no_pin {
            s.push_str(" --no-pin");
        }
        if self.take_timeout != 0.1 {
            s.push_str(&format!(" --take-timeout {}", self.take_timeout));
        }
        s
    }

    fn validate(&self) -> Result<()> {
        if self.payload < crate::payload::HEADER_BYTES {
            bail!(
                "--payload {} is below the {}-byte timing stamp every message carries",
                self.payload,
                crate::payload::HEADER_BYTES
            );
        }
        if self.target == Target::Beanstalkd && self.payload > DEFAULT_MAX_JOB_BYTES {
            bail!(
                "--payload {} exceeds beanstalkd's default maximum job size of {DEFAULT_MAX_JOB_BYTES} bytes",
                self.payload
            );
        }
        if let Some(r) = self.rate {
            if !(r.is_finite() && r > 0.0) {
                bail!("--rate {r} must be a positive number of messages a second");
            }
        }
        if !(self.take_timeout.is_finite() && self.take_timeout > 0.0) {
            bail!(
                "--take-timeout {} must be a positive number of seconds",
                self.take_timeout
            );
        }
        if self.duration < Duration::from_millis(100) {
            bail!(
                "--duration {:?} is too short to measure anything",
                self.duration
            );
        }
        Ok(())
    }
}

/// A finished run: the JSON record and the in-memory histograms.
pub struct Finished {
    pub summary: Summary,
    pub outcome: Outcome,
}

/// Run once as the flags say; prints nothing but the progress bar.
pub fn run(args: &RunArgs) -> Result<Finished> {
    args.validate()?;
    let (target_cpu, cpu) = if args.no_pin {
        (None, None)
    } else if args.spawn {
        let two_cores = target::online_cores() >= 2;
        (
            args.target_cpu.or(two_cores.then_some(TARGET_CORE)),
            args.cpu.or(two_cores.then_some(LOADGEN_CORE)),
        )
    } else {
        (None, args.cpu)
    };
    let spawned: Option<Spawned> = if args.spawn {
        Some(target::spawn(
            args.target,
            &SpawnOptions {
                cpu: target_cpu,
                tarq_bin: args.tarq_bin.clone(),
                rebuild: false,
            },
        )?)
    } else {
        None
    };
    let addr = match &spawned {
        Some(s) => s.addr,
        None => resolve(args)?,
    };
    if let Some(cpu) = cpu {
        target::set_affinity(cpu).with_context(|| format!("pinning the loadgen to core {cpu}"))?;
    }
    let cfg = RunConfig {
        addr,
        producers: args.producers,
        consumers: args.consumers,
        depth: args.depth,
        payload: args.payload,
        duration: args.duration,
        warmup: args.warmup,
        rate: args.rate,
        window: args.window(),
        null_mode: args.target == Target::Null,
        spin: args.spin,
        progress: !args.quiet,
        label: args.label(),
        target_pid: spawned.as_ref().map(|s| s.pid()),
    };
    let machine = Machine::probe();
    let started_at = chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
    let timeout = args.take_timeout;
    let result = match args.target {
        Target::Tarq | Target::Tarantool | Target::Null => {
            runner::run(&cfg, |_| IprotoDriver::new(timeout))
        }
        Target::Redis => runner::run(&cfg, |run| RedisDriver::new(run, timeout)),
        Target::Beanstalkd => runner::run(&cfg, |run| BeanstalkDriver::new(run, timeout)),
    };
    let outcome = match (result, &spawned) {
        (Ok(o), _) => o,
        (Err(e), Some(s)) => {
            return Err(e.context(format!(
                "{} run failed; the target's log ends with:\n{}",
                args.target,
                s.log_tail()
            )))
        }
        (Err(e), None) => return Err(e),
    };
    if let Some(s) = spawned {
        s.stop()
            .with_context(|| format!("stopping {}", args.target))?;
    }
    let config = ConfigRecord {
        target: args.target,
        addr: addr.to_string(),
        spawn: args.spawn,
        producers: args.producers,
        consumers: args.consumers,
        depth: args.depth,
        payload: args.payload,
        duration_s: args.duration.as_secs_f64(),
        warmup_s: args.warmup.as_secs_f64(),
        rate: args.rate,
        window: cfg.window,
        take_timeout_s: args.take_timeout,
        cpu,
        target_cpu,
        command: args.command_line(),
    };
    let summary = Summary::new(args.label(), config, machine, started_at, &outcome);
    if let Some(path) = &args.json {
        summary.write_json(path)?;
    }
    if let Some(prefix) = &args.hgrm {
        report::write_hgrm(prefix, &outcome)?;
    }
    if let Some(prefix) = &args.svg {
        crate::plot::throughput(
            &PathBuf::from(format!("{prefix}-throughput.svg")),
            &format!("{}: throughput", summary.label),
            &[(summary.label.clone(), summary.series.clone())],
        )?;
        crate::plot::latency(
            &PathBuf::from(format!("{prefix}-latency.svg")),
            &format!("{}: latency by percentile", summary.label),
            &[
                ("put".into(), summary.spectra.put.clone()),
                ("take→ack".into(), summary.spectra.cycle.clone()),
                ("put→ack".into(), summary.spectra.e2e.clone()),
            ],
        )?;
    }
    Ok(Finished { summary, outcome })
}

fn resolve(args: &RunArgs) -> Result<SocketAddr> {
    let text = args
        .addr
        .clone()
        .unwrap_or_else(|| format!("127.0.0.1:{}", args.target.default_port()));
    text.to_socket_addrs()
        .with_context(|| format!("--addr {text} is not host:port"))?
        .next()
        .with_context(|| format!("--addr {text} resolves to no address"))
}
