//! What a run leaves behind: the JSON record (configuration, commit, machine, every figure),
//! the human table printed at the end, and the `.hgrm` spectrum files. Results are data: they
//! are written by the loadgen and never edited by hand.

use crate::runner::{Outcome, Phase, PhaseOutcome};
use crate::stats::{Percentiles, SeriesPoint, Stall};
use crate::target::Target;
use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};
use std::fmt::Write as _;
use std::path::Path;
use std::process::Command;

/// The configuration as recorded in the JSON.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ConfigRecord {
    pub target: Target,
    pub addr: String,
    pub spawn: bool,
    pub producers: usize,
    pub consumers: usize,
    pub depth: usize,
    pub payload: usize,
    pub duration_s: f64,
    pub warmup_s: f64,
    /// Open-loop rate in msgs/s; `null` for closed loop.
    pub rate: Option<f64>,
    /// Closed-loop cap on messages put and not yet acked.
    pub window: usize,
    pub take_timeout_s: f64,
    /// Core the loadgen was pinned to.
    pub cpu: Option<usize>,
    /// Core the spawned target was pinned to.
    pub target_cpu: Option<usize>,
    /// A command line that repeats this run.
    pub command: String,
    /// Messages put before the steady phase, producers only (`--backlog`).
    #[serde(default)]
    pub backlog: Option<u64>,
    /// Messages put as fast as possible with no steady phase (`--fill`).
    #[serde(default)]
    pub fill: Option<u64>,
    /// A drain phase ends the run: consumers only until every message is acked.
    #[serde(default)]
    pub drain: bool,
    /// Producers never wait for consumers (no window).
    #[serde(default)]
    pub unbounded: bool,
    /// Extra arguments given to the spawned target.
    #[serde(default)]
    pub target_args: Option<String>,
}

/// The machine the run happened on.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Machine {
    pub cores: usize,
    pub cpu_model: String,
    pub kernel: String,
    /// `/proc/loadavg` before and after: other work on the machine shows up here.
    pub loadavg_before: String,
    pub loadavg_after: String,
}

impl Machine {
    pub fn probe() -> Machine {
        let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
        let cpu_model = cpuinfo
            .lines()
            .find(|l| l.starts_with("model name"))
            .and_then(|l| l.split_once(':'))
            .map(|(_, v)| v.trim().to_string())
            .unwrap_or_else(|| "unknown".into());
        Machine {
            cores: crate::target::online_cores(),
            cpu_model,
            kernel: read_trimmed("/proc/sys/kernel/osrelease"),
            loadavg_before: loadavg(),
            loadavg_after: String::new(),
        }
    }
}

fn read_trimmed(path: &str) -> String {
    std::fs::read_to_string(path)
        .map(|s| s.trim().to_string())
        .unwrap_or_default()
}

pub fn loadavg() -> String {
    read_trimmed("/proc/loadavg")
}

/// `git rev-parse --short HEAD` of the workspace, with `-dirty` when it has local changes.
pub fn commit() -> String {
    let root = crate::target::workspace_root();
    let git = |args: &[&str]| {
        Command::new("git")
            .args(args)
            .current_dir(&root)
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
    };
    let Some(head) = git(&["rev-parse", "--short=10", "HEAD"]) else {
        return "unknown".into();
    };
    let dirty = git(&["status", "--porcelain", "--untracked-files=no"])
        .map(|s| !s.is_empty())
        .unwrap_or(false);
    if dirty {
        format!("{head}-dirty")
    } else {
        head
    }
}

/// Percentile spectra kept in the JSON so plots can be redrawn from the files alone.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Spectra {
    /// (percentile, µs) points.
    pub put: Vec<(f64, f64)>,
    pub cycle: Vec<(f64, f64)>,
    pub e2e: Vec<(f64, f64)>,
}

/// Everything one run measured: the `--json` file.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Summary {
    pub label: String,
    pub config: ConfigRecord,
    pub commit: String,
    pub machine: Machine,
    pub started_at: String,
    pub msgs_per_s: f64,
    pub puts_per_s: f64,
    pub acks_per_s: f64,
    pub errors: u64,
    pub first_error: Option<String>,
    pub empty_takes: u64,
    pub foreign_messages: u64,
    pub measured_s: f64,
    pub put_us: Percentiles,
    pub cycle_us: Percentiles,
    pub e2e_us: Percentiles,
    /// Open loop only: how late puts left after their intended send time (the loadgen's own
    /// delay; a large value means the loadgen could not keep the schedule).
    pub send_lag_us: Option<Percentiles>,
    /// Fraction of a core the loadgen used: near 1.0 means it may be the bottleneck.
    pub loadgen_cpu: f64,
    /// Fraction of a core the spawned target used.
    pub target_cpu: Option<f64>,
    /// Cores' worth of CPU every other process on the machine used during the window (known
    /// when the target's is): other work that disturbed the run.
    pub other_cpu: Option<f64>,
    pub series: Vec<SeriesPoint>,
    pub spectra: Spectra,
    /// The longest wait for a reply on one connection in the headline window.
    #[serde(default)]
    pub stall: Stall,
    /// Over the whole run: puts accepted and acks of this run's messages; equal, with nothing
    /// unacked, when the run ends with a complete drain.
    #[serde(default)]
    pub total_puts: u64,
    #[serde(default)]
    pub total_acks: u64,
    #[serde(default)]
    pub unacked: u64,
    /// Each phase's own figures (fill, steady, drain), in the order they ran.
    #[serde(default)]
    pub phases: Vec<PhaseSummary>,
}

/// One phase of a run as it appears in the JSON.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PhaseSummary {
    pub phase: Phase,
    pub measured_s: f64,
    pub puts: u64,
    pub acks: u64,
    pub puts_per_s: f64,
    pub acks_per_s: f64,
    pub errors: u64,
    pub first_error: Option<String>,
    /// Messages put and not yet acked when the phase ended: the backlog it leaves.
    pub unacked: u64,
    pub put_us: Percentiles,
    pub cycle_us: Percentiles,
    pub e2e_us: Percentiles,
    pub stall: Stall,
    pub loadgen_cpu: f64,
    pub target_cpu: Option<f64>,
    pub series: Vec<SeriesPoint>,
}

impl PhaseSummary {
    fn new(p: &PhaseOutcome) -> PhaseSummary {
        PhaseSummary {
            phase: p.phase,
            measured_s: p.secs(),
            puts: p.puts,
            acks: p.acks,
            puts_per_s: p.puts_per_s(),
            acks_per_s: p.acks_per_s(),
            errors: p.errors,
            first_error: p.first_error.clone(),
            unacked: p.unacked,
            put_us: p.put.percentiles(),
            cycle_us: p.cycle.percentiles(),
            e2e_us: p.e2e.percentiles(),
            stall: p.stall.clone(),
            loadgen_cpu: p.loadgen_cpu,
            target_cpu: p.target_cpu,
            series: p.series.points(),
        }
    }
}

impl Summary {
    pub fn new(
        label: String,
        config: ConfigRecord,
        mut machine: Machine,
        started_at: String,
        o: &Outcome,
    ) -> Summary {
        machine.loadavg_after = loadavg();
        let open_loop = config.rate.is_some();
        let m = &o.main;
        Summary {
            label,
            config,
            commit: commit(),
            machine,
            started_at,
            msgs_per_s: m.msgs_per_s(),
            puts_per_s: m.puts_per_s(),
            acks_per_s: m.acks_per_s(),
            errors: m.errors,
            first_error: m.first_error.clone(),
            empty_takes: m.empty_takes,
            foreign_messages: m.foreign,
            measured_s: m.secs(),
            put_us: m.put.percentiles(),
            cycle_us: m.cycle.percentiles(),
            e2e_us: m.e2e.percentiles(),
            send_lag_us: open_loop.then(|| m.send_lag.percentiles()),
            loadgen_cpu: m.loadgen_cpu,
            target_cpu: m.target_cpu,
            other_cpu: match (m.machine_cpu, m.target_cpu) {
                (Some(all), Some(t)) => Some((all - t - m.loadgen_cpu).max(0.0)),
                _ => None,
            },
            series: m.series.points(),
            spectra: Spectra {
                put: m.put.spectrum(),
                cycle: m.cycle.spectrum(),
                e2e: m.e2e.spectrum(),
            },
            stall: m.stall.clone(),
            total_puts: o.total_puts,
            total_acks: o.total_acks,
            unacked: o.unacked,
            phases: o.phases.iter().map(PhaseSummary::new).collect(),
        }
    }

    pub fn write_json(&self, path: &Path) -> Result<()> {
        let text = serde_json::to_string_pretty(self)?;
        std::fs::write(path, text + "\n").with_context(|| format!("writing {}", path.display()))
    }

    pub fn read_json(path: &Path) -> Result<Summary> {
        let text =
            std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
        serde_json::from_str(&text).with_context(|| format!("parsing {}", path.display()))
    }

    /// The table printed after a run.
    pub fn table(&self) -> String {
        let c = &self.config;
        let mut out = String::new();
        let mut mode = match (c.fill, c.rate) {
            (Some(n), _) => format!("fill {n} messages"),
            (None, Some(r)) => format!("open loop at {} msgs/s", thousands(r)),
            (None, None) if c.unbounded => "closed loop, unbounded".to_string(),
            (None, None) => format!("closed loop, window {}", c.window),
        };
        if let Some(n) = c.backlog {
            mode.push_str(&format!(", backlog {n}"));
        }
        if c.drain {
            mode.push_str(", then drain");
        }
        let warmup = if c.fill.is_none() {
            format!(" after {:.1} s warm-up", c.warmup_s)
        } else {
            String::new()
        };
        let _ = writeln!(
            out,
            "{} @ {}: {} producers + {} consumers, depth {}, payload {} B, {:.1} s measured{warmup}, {mode}",
            c.target, c.addr, c.producers, c.consumers, c.depth, c.payload, self.measured_s
        );
        let _ = writeln!(
            out,
            "  msgs/s {:>12}   puts/s {:>12}   acks/s {:>12}   errors {}   empty takes {}",
            thousands(self.msgs_per_s),
            thousands(self.puts_per_s),
            thousands(self.acks_per_s),
            self.errors,
            self.empty_takes
        );
        self.latency_rows(&mut out);
        let _ = writeln!(
            out,
            "  stall: {:.1} µs on connection {} ({} reply) {:.2} s into the window",
            self.stall.gap_us, self.stall.connection, self.stall.request, self.stall.at_s
        );
        if self.phases.len() > 1 {
            self.phase_rows(&mut out);
        }
        let _ = writeln!(
            out,
            "  whole run: {} puts accepted, {} acked, {} unacked",
            self.total_puts, self.total_acks, self.unacked
        );
        let target_cpu = self
            .target_cpu
            .map(|t| format!("{:.0}%", t * 100.0))
            .unwrap_or_else(|| "n/a".into());
        let others = self
            .other_cpu
            .map(|t| format!(", other processes {:.0}%", t * 100.0))
            .unwrap_or_default();
        let _ = writeln!(
            out,
            "  CPU: loadgen {:.0}% of a core, target {target_cpu}{others}; load average {} → {}",
            self.loadgen_cpu * 100.0,
            first_field(&self.machine.loadavg_before),
            first_field(&self.machine.loadavg_after)
        );
        if let Some(e) = &self.first_error {
            let _ = writeln!(out, "  first error: {e}");
        }
        if self.foreign_messages > 0 {
            let _ = writeln!(
                out,
                "  {} messages left by earlier runs were taken and acked (not counted)",
                self.foreign_messages
            );
        }
        out
    }
}

impl Summary {
    /// One line per latency of the headline window.
    fn latency_rows(&self, out: &mut String) {
        let _ = writeln!(
            out,
            "  {:<14}{:>10} {:>10} {:>10} {:>10} {:>10}{:>12}",
            "latency (µs)", "p50", "p90", "p99", "p99.9", "max", "count"
        );
        let mut rows = vec![
            ("put", &self.put_us),
            ("take→ack", &self.cycle_us),
            ("put→ack", &self.e2e_us),
        ];
        if let Some(lag) = &self.send_lag_us {
            rows.push(("send lag", lag));
        }
        for (name, p) in rows {
            let _ = writeln!(
                out,
                "  {name:<14}{:>10.1} {:>10.1} {:>10.1} {:>10.1} {:>10.1}{:>12}",
                p.p50, p.p90, p.p99, p.p999, p.max, p.count
            );
        }
    }

    /// One line per phase: its rates, tail latencies and stall.
    fn phase_rows(&self, out: &mut String) {
        let _ = writeln!(
            out,
            "  {:<8}{:>9}{:>12}{:>12}{:>12}{:>13}{:>13}{:>12}",
            "phase", "seconds", "puts/s", "acks/s", "put p99.9", "put max", "stall", "left"
        );
        for p in &self.phases {
            let _ = writeln!(
                out,
                "  {:<8}{:>9.2}{:>12}{:>12}{:>12.1}{:>13.1}{:>13.1}{:>12}",
                format!("{:?}", p.phase).to_lowercase(),
                p.measured_s,
                thousands(p.puts_per_s),
                thousands(p.acks_per_s),
                p.put_us.p999,
                p.put_us.max,
                p.stall.gap_us,
                p.unacked
            );
        }
    }
}

fn first_field(s: &str) -> &str {
    s.split_whitespace().next().unwrap_or("?")
}

/// Write the three `.hgrm` files: `<prefix>-put.hgrm`, `-cycle.hgrm`, `-e2e.hgrm`.
pub fn write_hgrm(prefix: &str, o: &Outcome) -> Result<()> {
    let m = &o.main;
    for (name, l) in [("put", &m.put), ("cycle", &m.cycle), ("e2e", &m.e2e)] {
        let path = format!("{prefix}-{name}.hgrm");
        std::fs::write(&path, l.hgrm()).with_context(|| format!("writing {path}"))?;
    }
    Ok(())
}

/// 1234567.8 → "1,234,568".
pub fn thousands(v: f64) -> String {
    let n = v.round() as i64;
    let digits = n.unsigned_abs().to_string();
    let mut out = String::new();
    for (i, ch) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(ch);
    }
    if n < 0 {
        out.insert(0, '-');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn thousands_groups_digits() {
        assert_eq!(thousands(0.0), "0");
        assert_eq!(thousands(999.4), "999");
        assert_eq!(thousands(1000.0), "1,000");
        assert_eq!(thousands(1234567.8), "1,234,568");
        assert_eq!(thousands(-12345.0), "-12,345");
    }

    #[test]
    fn machine_probe_reads_proc() {
        let m = Machine::probe();
        assert!(m.cores >= 1);
        assert!(!m.loadavg_before.is_empty());
    }
}
