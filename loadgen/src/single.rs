//! One run from the command line's point of view: the flags, starting the target when asked,
//! pinning, running the load, and writing the table, JSON, `.hgrm` and SVG outputs. The suite
//! builds the same `RunArgs` for each cell of its matrix, so a suite row and a hand-typed
//! command measure exactly the same thing.

use crate::proto::beanstalk::{BeanstalkDriver, DEFAULT_MAX_JOB_BYTES};
use crate::proto::iproto::{Api, IprotoDriver, Tube, TubeType, DEFAULT_TUBE, MAX_UTUBES};
use crate::proto::resp::RedisDriver;
use crate::report::{self, ConfigRecord, Machine, Summary};
use crate::runner::{self, Outcome, RunConfig};
use crate::target::{self, Protocol, SpawnOptions, Spawned, Target};
use anyhow::{bail, Context, Result};
use clap::Args;
use std::net::{SocketAddr, ToSocketAddrs};
use std::path::PathBuf;
use std::time::Duration;

/// Default core for a spawned target; the loadgen takes `LOADGEN_CORE`.
pub const TARGET_CORE: usize = 0;
pub const LOADGEN_CORE: usize = 1;
/// Longest `--tube` name: it goes into every call's function name, and tarantool/queue keeps
/// tubes in a space whose names this comfortably fits.
pub const MAX_TUBE_NAME: usize = 64;

#[derive(Args, Clone, Debug)]
pub struct RunArgs {
    /// System under test.
    #[arg(long, value_enum, default_value_t = Target::Tarq)]
    pub target: Target,
    /// Address of a running target (default 127.0.0.1 and the target's usual port). For a
    /// tarq cluster, several, comma-separated: the run finds the leader, and reconnects to the
    /// new one after a failover (errors counted, not fatal).
    #[arg(long, value_name = "HOST:PORT[,...]")]
    pub addr: Option<String>,
    /// Start the target on a port of its own and a fresh temporary data dir, pinned to
    /// --target-cpu, and stop it afterwards.
    #[arg(long)]
    pub spawn: bool,
    /// Producer connections.
    #[arg(long, default_value_t = 4)]
    pub producers: usize,
    /// Call set over IPROTO: `seed` (queue.put / take / ack) or `tubes` (tarantool/queue's
    /// queue.tube.<name>:put / take / ack). Default: tubes for tarantool-queue, else seed.
    #[arg(long, value_enum)]
    pub api: Option<Api>,
    /// Tube the tubes API drives (created with if_not_exists before the run).
    #[arg(long)]
    pub tube: Option<String>,
    /// Type of the tube: fifo, fifottl, limfifottl, utube, utubettl (default fifottl).
    #[arg(long, value_enum)]
    pub tube_type: Option<TubeType>,
    /// utube types: spread the puts over this many utube keys, round robin (default 1).
    #[arg(long)]
    pub utubes: Option<usize>,
    /// Consumer connections.
    #[arg(long, default_value_t = 4)]
    pub consumers: usize,
    /// Requests in flight per connection (pipelining depth).
    #[arg(long, default_value_t = 16)]
    pub depth: usize,
    /// Payload bytes per message (at least 24: the timing stamp).
    #[arg(long, default_value_t = 64)]
    pub payload: usize,
    /// Measured time: seconds (5, 0.5) or with a unit (10s, 500ms, 1m).
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    pub duration: Duration,
    /// Load applied before measuring starts, as --duration.
    #[arg(long, default_value = "1s", value_parser = parse_duration)]
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
    /// Closed loop: producers never wait for consumers (no window), so the queue grows for as
    /// long as puts outrun takes.
    #[arg(long, conflicts_with_all = ["window", "rate"])]
    pub unbounded: bool,
    /// Put this many messages first, producers only, then run with producers this many
    /// messages ahead of consumers (the window grows by as much): a standing backlog.
    #[arg(long, conflicts_with_all = ["fill", "unbounded"])]
    pub backlog: Option<u64>,
    /// Only put this many messages, as fast as the target answers (no steady phase); with
    /// --drain, then take and ack them all: fill-then-drain.
    #[arg(long, conflicts_with_all = ["rate", "unbounded", "window"])]
    pub fill: Option<u64>,
    /// End with consumers only until every message the run put is acked, and report whether
    /// any was lost.
    #[arg(long)]
    pub drain: bool,
    /// Extra arguments for the spawned target, split as a shell would: for tarq e.g.
    /// --target-args '--wal-mode fsync'.
    #[arg(long, requires = "spawn", allow_hyphen_values = true)]
    pub target_args: Option<String>,
    /// How long a take waits when nothing is ready: seconds (0.1) or with a unit (100ms);
    /// beanstalkd rounds up to whole seconds.
    #[arg(long, default_value = "0.1", value_parser = parse_seconds)]
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
    /// Every load connection over TLS, trusting the CA certificates in this PEM file (the
    /// server's certificate is checked against its IP address): what TLS costs the server,
    /// against the same run without. The set-up (probes, tube) stays plain, so give tarq
    /// `--listen-tls optional`.
    #[arg(long = "tls-ca", value_name = "FILE", value_parser = parse_tls_ca)]
    pub tls: Option<std::sync::Arc<rustls::ClientConfig>>,
}

fn parse_tls_ca(path: &str) -> Result<std::sync::Arc<rustls::ClientConfig>, String> {
    crate::tls::client_config(std::path::Path::new(path)).map_err(|e| format!("{e:#}"))
}

impl RunArgs {
    /// Arguments for a spawned closed-loop run of one shape; the suite starts from this.
    pub fn shape(target: Target, producers: usize, consumers: usize, depth: usize) -> RunArgs {
        RunArgs {
            target,
            addr: None,
            spawn: true,
            api: None,
            tube: None,
            tube_type: None,
            utubes: None,
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
            unbounded: false,
            backlog: None,
            fill: None,
            drain: false,
            target_args: None,
            take_timeout: 0.1,
            json: None,
            hgrm: None,
            svg: None,
            tarq_bin: None,
            spin: false,
            quiet: false,
            no_pin: false,
            tls: None,
        }
    }

    /// The closed-loop window: unbounded, or the given (or default) one plus the backlog.
    pub fn window(&self) -> usize {
        if self.unbounded {
            return usize::MAX;
        }
        let base = self.window.unwrap_or_else(|| {
            RunConfig::default_window(self.producers, self.consumers, self.depth)
        });
        let backlog = usize::try_from(self.backlog.unwrap_or(0)).unwrap_or(usize::MAX);
        base.saturating_add(backlog)
    }

    /// The call set: as given, or the target's own (tubes for tarantool/queue).
    pub fn api(&self) -> Api {
        self.api
            .unwrap_or(if self.target == Target::TarantoolQueue {
                Api::Tubes
            } else {
                Api::Seed
            })
    }

    /// The tube a tubes-API run drives; `None` for the seed API and non-IPROTO targets.
    pub fn tube(&self) -> Option<Tube> {
        (self.target.protocol() == Protocol::Iproto && self.api() == Api::Tubes).then(|| Tube {
            name: self.tube.clone().unwrap_or_else(|| DEFAULT_TUBE.into()),
            kind: self.tube_type.unwrap_or_default(),
            utubes: self.utubes.unwrap_or(1),
        })
    }

    /// A name for this run's files: `tarq-p4c4-d16`, `tarq-p4c4-d16-r150000`,
    /// `tarq-p4c4-d16-backlog1000000`, `tarq-p4c4-d16-fill1000000-drain`,
    /// `tarq-tubes-utube-u100-p4c4-d16`, `redis-appendonly-yes-p4c4-d16`.
    pub fn label(&self) -> String {
        let mut s = self.target.to_string();
        if let Some(t) = self.tube() {
            if self.target != Target::TarantoolQueue {
                s.push_str("-tubes");
            }
            s.push_str(&format!("-{}", t.kind));
            if t.kind.keyed() {
                s.push_str(&format!("-u{}", t.utubes));
            }
        }
        if let Some(a) = &self.target_args {
            let slug = slug(a);
            if !slug.is_empty() {
                s.push_str(&format!("-{slug}"));
            }
        }
        s.push_str(&format!(
            "-p{}c{}-d{}",
            self.producers, self.consumers, self.depth
        ));
        if let Some(r) = self.rate {
            s.push_str(&format!("-r{}", r.round() as u64));
        }
        if self.unbounded {
            s.push_str("-unbounded");
        }
        if let Some(n) = self.backlog {
            s.push_str(&format!("-backlog{n}"));
        }
        if let Some(n) = self.fill {
            s.push_str(&format!("-fill{n}"));
        }
        if self.drain {
            s.push_str("-drain");
        }
        s
    }

    /// The extra target arguments, split as a shell would.
    pub fn target_argv(&self) -> Result<Vec<String>> {
        let Some(text) = &self.target_args else {
            return Ok(Vec::new());
        };
        shlex::split(text)
            .with_context(|| format!("--target-args {text:?} has an unbalanced quote"))
    }

    /// A command line that repeats this run (outputs left out).
    pub fn command_line(&self) -> String {
        let mut s = format!("tarq-loadgen --target {}", self.target);
        if self.spawn {
            s.push_str(" --spawn");
        } else if let Some(a) = &self.addr {
            s.push_str(&format!(" --addr {a}"));
        }
        if let Some(api) = self.api {
            s.push_str(&format!(" --api {}", api.name()));
        }
        if let Some(t) = &self.tube {
            s.push_str(&format!(" --tube {t}"));
        }
        if let Some(t) = self.tube_type {
            s.push_str(&format!(" --tube-type {t}"));
        }
        if let Some(k) = self.utubes {
            s.push_str(&format!(" --utubes {k}"));
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
        if self.unbounded {
            s.push_str(" --unbounded");
        }
        if let Some(n) = self.backlog {
            s.push_str(&format!(" --backlog {n}"));
        }
        if let Some(n) = self.fill {
            s.push_str(&format!(" --fill {n}"));
        }
        if self.drain {
            s.push_str(" --drain");
        }
        if let Some(t) = &self.target_args {
            s.push_str(&format!(
                " --target-args {}",
                shlex::try_quote(t).unwrap_or_default()
            ));
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

    fn validate_api(&self) -> Result<()> {
        validate_api_of(self)
    }

    fn validate(&self) -> Result<()> {
        if self.payload < crate::payload::HEADER_BYTES {
            bail!(
                "--payload {} is below the {}-byte timing stamp every message carries",
                self.payload,
                crate::payload::HEADER_BYTES
            );
        }
        if self.target.protocol() == Protocol::Beanstalk && self.payload > DEFAULT_MAX_JOB_BYTES {
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
        if self.target.is_lua_script() && self.target_args.is_some() {
            bail!(
                "--target-args: {} runs a Lua script on Tarantool, which takes no arguments",
                self.target
            );
        }
        self.validate_api()?;
        self.target_argv()?;
        if self.fill.is_none() && self.duration < Duration::from_millis(100) {
            bail!(
                "--duration {:?} is too short to measure anything",
                self.duration
            );
        }
        Ok(())
    }
}

/// The call-set flags fit the target and each other.
fn validate_api_of(a: &RunArgs) -> Result<()> {
    let api = a.api();
    let tubes_ok = matches!(
        a.target,
        Target::Tarq | Target::TarantoolQueue | Target::Null
    );
    if api == Api::Tubes && !tubes_ok {
        bail!(
            "--api tubes: {} does not serve tarantool/queue's tubes (tarq, tarantool-queue and null do)",
            a.target
        );
    }
    if a.target == Target::TarantoolQueue && api == Api::Seed {
        bail!("--api seed: tarantool-queue serves only the tubes API");
    }
    if api == Api::Seed && (a.tube.is_some() || a.tube_type.is_some() || a.utubes.is_some()) {
        bail!("--tube, --tube-type and --utubes need the tubes API (--api tubes)");
    }
    if let Some(name) = &a.tube {
        let plain = name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_');
        if name.is_empty() || name.len() > MAX_TUBE_NAME || !plain {
            bail!(
                "--tube {name:?} must be 1 to {MAX_TUBE_NAME} letters, digits or underscores (it is part of the function name queue.tube.<name>:put)"
            );
        }
    }
    if let Some(k) = a.utubes {
        if !a.tube_type.unwrap_or_default().keyed() {
            bail!("--utubes {k} needs a utube type (--tube-type utube or utubettl)");
        }
        if k == 0 || k > MAX_UTUBES {
            bail!("--utubes {k} must be between 1 and {MAX_UTUBES}");
        }
    }
    Ok(())
}

/// `text` as a file-name fragment: runs of anything but letters and digits become one `-`.
fn slug(text: &str) -> String {
    text.split(|c: char| !c.is_ascii_alphanumeric())
        .filter(|w| !w.is_empty())
        .collect::<Vec<_>>()
        .join("-")
}

/// A finished run: the JSON record and the in-memory histograms.
pub struct Finished {
    pub summary: Summary,
    pub outcome: Outcome,
}

/// Run once as the flags say; prints nothing but the progress bar.
pub fn run(args: &RunArgs) -> Result<Finished> {
    // Arguments that do not fit the target fail the same way on every attempt.
    args.validate()
        .map_err(|e| target::CannotStart(format!("{e:#}")))?;
    let (target_cpu, cpu) = cores(args);
    let spawned = spawn_target(args, target_cpu)?;
    let (addr, failover) = match &spawned {
        Some(s) => (s.addr, Vec::new()),
        // A tarq may be one node of a cluster: start on its leader, follow it after.
        None if args.target == Target::Tarq => {
            let addrs = addr_list(args)?;
            let (leader, all) = target::leader(addrs, args.tube().as_ref())
                .with_context(|| format!("{} at {}", args.target, all_addrs(args)))?;
            (resolve_one(&leader)?, all)
        }
        None => (resolve(args)?, Vec::new()),
    };
    // A tarq cluster's tube was created through the redirects, on its leader.
    if let (Some(tube), true) = (args.tube(), failover.is_empty()) {
        target::create_tube(addr, &tube).with_context(|| format!("{} at {addr}", args.target))?;
    }
    if let Some(cpu) = cpu {
        tarq_affinity::pin(cpu).with_context(|| format!("pinning the loadgen to core {cpu}"))?;
    }
    let mut cfg = run_config(args, addr, spawned.as_ref().map(|s| s.pid()));
    cfg.failover = failover;
    let machine = Machine::probe();
    let started_at = chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
    let outcome = drive(args, &cfg, spawned)?;
    let config = config_record(args, &cfg, cpu, target_cpu);
    let summary = Summary::new(args.label(), config, machine, started_at, &outcome);
    write_outputs(args, &summary, &outcome)?;
    Ok(Finished { summary, outcome })
}

/// The cores for the target and the loadgen: with --spawn on a machine of two cores or more,
/// each gets its own unless told otherwise.
pub fn cores(args: &RunArgs) -> (Option<usize>, Option<usize>) {
    if args.no_pin {
        (None, None)
    } else if args.spawn {
        let two_cores = target::online_cores() >= 2;
        (
            args.target_cpu.or(two_cores.then_some(TARGET_CORE)),
            args.cpu.or(two_cores.then_some(LOADGEN_CORE)),
        )
    } else {
        (None, args.cpu)
    }
}

fn spawn_target(args: &RunArgs, cpu: Option<usize>) -> Result<Option<Spawned>> {
    if !args.spawn {
        return Ok(None);
    }
    let opts = SpawnOptions {
        cpu,
        tarq_bin: args.tarq_bin.clone(),
        rebuild: false,
        args: args.target_argv()?,
    };
    target::spawn(args.target, &opts).map(Some)
}

fn run_config(args: &RunArgs, addr: SocketAddr, target_pid: Option<u32>) -> RunConfig {
    RunConfig {
        addr,
        producers: args.producers,
        consumers: args.consumers,
        depth: args.depth,
        payload: args.payload,
        duration: args.duration,
        warmup: args.warmup,
        rate: args.rate,
        window: args.window(),
        fill: args.fill.or(args.backlog),
        steady: args.fill.is_none(),
        drain: args.drain,
        null_mode: args.target == Target::Null,
        spin: args.spin,
        progress: !args.quiet,
        label: args.label(),
        target_pid,
        failover: Vec::new(),
        tls: args.tls.clone(),
    }
}

/// Run the load with the target's driver, then stop a spawned target; a failure quotes the
/// end of the target's log.
fn drive(args: &RunArgs, cfg: &RunConfig, spawned: Option<Spawned>) -> Result<Outcome> {
    let timeout = args.take_timeout;
    let tube = args.tube();
    let result = match args.target.protocol() {
        Protocol::Iproto => runner::run(cfg, |_| IprotoDriver::with_calls(tube.as_ref(), timeout)),
        Protocol::Resp => runner::run(cfg, |run| RedisDriver::new(run, timeout)),
        Protocol::Beanstalk => runner::run(cfg, |run| BeanstalkDriver::new(run, timeout)),
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
    Ok(outcome)
}

fn config_record(
    args: &RunArgs,
    cfg: &RunConfig,
    cpu: Option<usize>,
    target_cpu: Option<usize>,
) -> ConfigRecord {
    ConfigRecord {
        target: args.target,
        addr: cfg.addr.to_string(),
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
        backlog: args.backlog,
        fill: args.fill,
        drain: args.drain,
        unbounded: args.unbounded,
        target_args: args.target_args.clone(),
        api: args.api(),
        tube: args.tube().map(|t| t.name),
        tube_type: args.tube().map(|t| t.kind),
        utubes: args.tube().filter(|t| t.kind.keyed()).map(|t| t.utubes),
    }
}

/// The JSON, `.hgrm` and SVG files the flags ask for.
fn write_outputs(args: &RunArgs, summary: &Summary, outcome: &Outcome) -> Result<()> {
    if let Some(path) = &args.json {
        summary.write_json(path)?;
    }
    if let Some(prefix) = &args.hgrm {
        report::write_hgrm(prefix, outcome)?;
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
    Ok(())
}

/// A duration as `--duration` takes it: a bare number is seconds (`5`, `0.5`), anything else
/// goes to humantime (`10s`, `500ms`, `1m 30s`).
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let t = text.trim();
    if let Ok(secs) = t.parse::<f64>() {
        return Duration::try_from_secs_f64(secs)
            .map_err(|_| format!("{text:?} is not a duration of zero or more seconds"));
    }
    humantime::parse_duration(t).map_err(|e| {
        format!("{text:?} is not a duration (seconds, or a number with a unit: 10s, 500ms): {e}")
    })
}

/// A duration in seconds, as [`parse_duration`] reads it.
pub fn parse_seconds(text: &str) -> Result<f64, String> {
    parse_duration(text).map(|d| d.as_secs_f64())
}

/// `--addr`, or the target's usual address.
fn all_addrs(args: &RunArgs) -> String {
    args.addr
        .clone()
        .unwrap_or_else(|| format!("127.0.0.1:{}", args.target.default_port()))
}

/// `--addr` as a list (`A,B,C`): several only make sense for a tarq cluster.
fn addr_list(args: &RunArgs) -> Result<Vec<String>> {
    let text = all_addrs(args);
    tarq_client::cluster::parse_addrs(&[&text]).with_context(|| format!("--addr {text}"))
}

/// The single address of a target that is not a tarq cluster.
fn resolve(args: &RunArgs) -> Result<SocketAddr> {
    let addrs = addr_list(args)?;
    if addrs.len() > 1 {
        bail!(
            "--addr {}: several addresses are for a tarq cluster, not {}",
            all_addrs(args),
            args.target
        );
    }
    resolve_one(&addrs[0])
}

fn resolve_one(text: &str) -> Result<SocketAddr> {
    text.to_socket_addrs()
        .with_context(|| format!("--addr {text} is not host:port"))?
        .next()
        .with_context(|| format!("--addr {text} resolves to no address"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_take_bare_seconds_or_units() {
        assert_eq!(parse_duration("5"), Ok(Duration::from_secs(5)));
        assert_eq!(parse_duration("0.25"), Ok(Duration::from_millis(250)));
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("1m"), Ok(Duration::from_secs(60)));
        assert_eq!(parse_seconds("100ms"), Ok(0.1));
        assert!(parse_duration("-1").unwrap_err().contains("\"-1\""));
        assert!(parse_duration("soon").unwrap_err().contains("\"soon\""));
    }

    #[test]
    fn backlog_widens_the_window_and_unbounded_removes_it() {
        let mut a = RunArgs::shape(Target::Tarq, 4, 4, 16);
        assert_eq!(a.window(), 128);
        a.backlog = Some(1_000_000);
        assert_eq!(a.window(), 1_000_128);
        assert!(a.label().ends_with("-backlog1000000"));
        assert!(a.command_line().contains(" --backlog 1000000"));
        a.backlog = None;
        a.unbounded = true;
        assert_eq!(a.window(), usize::MAX);
    }

    #[test]
    fn target_args_split_like_a_shell() {
        let mut a = RunArgs::shape(Target::Tarq, 1, 1, 1);
        a.target_args = Some("--wal-mode fsync --note 'a b'".into());
        assert_eq!(
            a.target_argv().unwrap(),
            ["--wal-mode", "fsync", "--note", "a b"]
        );
        a.target_args = Some("'unclosed".into());
        assert!(a
            .target_argv()
            .unwrap_err()
            .to_string()
            .contains("unbalanced"));
    }
}
