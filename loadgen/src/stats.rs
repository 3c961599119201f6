//! Latency recording and its summaries: HdrHistograms in nanoseconds, the percentile record
//! that goes into the JSON, the full percentile spectrum (`.hgrm` text, the format of
//! HdrHistogram's `outputPercentileDistribution`, values in microseconds) and the
//! per-second throughput series.

use hdrhistogram::Histogram;
use serde::{Deserialize, Serialize};
use std::fmt::Write as _;

/// Highest latency the histograms track: one minute covers any stall a run can see (runs last
/// seconds); larger values are clamped to it and still counted.
pub const MAX_LATENCY_NS: u64 = 60_000_000_000;
/// Significant digits kept: 3 gives 0.1% resolution, HdrHistogram's usual choice.
pub const SIGFIG: u8 = 3;
/// Spectrum resolution: quantile iteration steps per halving of the distance to 100%, as in
/// HdrHistogram's own percentile output.
const TICKS_PER_HALF: u32 = 5;

/// One latency distribution.
#[derive(Clone, Debug)]
pub struct Latency {
    hist: Histogram<u64>,
}

impl Default for Latency {
    fn default() -> Self {
        Latency::new()
    }
}

impl Latency {
    pub fn new() -> Self {
        Latency {
            hist: Histogram::new_with_bounds(1, MAX_LATENCY_NS, SIGFIG)
                .expect("static histogram bounds are valid"),
        }
    }

    /// Record one latency in nanoseconds (0 counts as 1 ns, over the bound as the bound).
    pub fn record_ns(&mut self, ns: u64) {
        self.hist.saturating_record(ns.max(1));
    }

    pub fn count(&self) -> u64 {
        self.hist.len()
    }

    pub fn reset(&mut self) {
        self.hist.reset();
    }

    /// Add every value recorded in `other` (both share the same bounds, so nothing is lost).
    pub fn add(&mut self, other: &Latency) {
        self.hist
            .add(&other.hist)
            .expect("histograms with the same bounds add");
    }

    pub fn histogram(&self) -> &Histogram<u64> {
        &self.hist
    }

    /// The summary that goes into the JSON, in microseconds.
    pub fn percentiles(&self) -> Percentiles {
        let h = &self.hist;
        let q = |p: f64| {
            if h.is_empty() {
                0.0
            } else {
                us(h.value_at_quantile(p))
            }
        };
        Percentiles {
            p50: q(0.50),
            p90: q(0.90),
            p99: q(0.99),
            p999: q(0.999),
            max: if h.is_empty() { 0.0 } else { us(h.max()) },
            mean: if h.is_empty() { 0.0 } else { h.mean() / 1e3 },
            count: h.len(),
        }
    }

    /// (percentile in [0, 100], value in µs) points, HdrHistogram's quantile iteration.
    pub fn spectrum(&self) -> Vec<(f64, f64)> {
        if self.hist.is_empty() {
            return Vec::new();
        }
        self.hist
            .iter_quantiles(TICKS_PER_HALF)
            .map(|v| {
                (
                    v.quantile_iterated_to() * 100.0,
                    us(self.hist.highest_equivalent(v.value_iterated_to())),
                )
            })
            .collect()
    }

    /// The `.hgrm` percentile distribution, values in microseconds.
    pub fn hgrm(&self) -> String {
        let h = &self.hist;
        let mut out = String::new();
        let _ = writeln!(
            out,
            "{:>12} {:>14} {:>10} {:>14}\n",
            "Value", "Percentile", "TotalCount", "1/(1-Percentile)"
        );
        if !h.is_empty() {
            for v in h.iter_quantiles(TICKS_PER_HALF) {
                let value = us(h.highest_equivalent(v.value_iterated_to()));
                let q = v.quantile_iterated_to();
                let cumulative = h.count_between(0, v.value_iterated_to());
                if q < 1.0 {
                    let _ = writeln!(
                        out,
                        "{value:12.3} {q:2.12} {cumulative:10} {:14.2}",
                        1.0 / (1.0 - q)
                    );
                } else {
                    let _ = writeln!(out, "{value:12.3} {q:2.12} {cumulative:10}");
                }
            }
        }
        let mean = if h.is_empty() { 0.0 } else { h.mean() / 1e3 };
        let _ = writeln!(
            out,
            "#[Mean    = {mean:12.3}, StdDeviation   = {:12.3}]",
            if h.is_empty() { 0.0 } else { h.stdev() / 1e3 }
        );
        let _ = writeln!(
            out,
            "#[Max     = {:12.3}, Total count    = {:12}]",
            if h.is_empty() { 0.0 } else { us(h.max()) },
            h.len()
        );
        let _ = writeln!(
            out,
            "#[Buckets = {:12}, SubBuckets     = {:12}]",
            h.buckets(),
            // HdrHistogram's sub-bucket count: the power of two that holds 2 × 10^SIGFIG.
            (2u64 * 10u64.pow(u32::from(SIGFIG))).next_power_of_two()
        );
        out
    }
}

fn us(ns: u64) -> f64 {
    ns as f64 / 1e3
}

/// Percentiles of one latency, in microseconds, under the JSON keys the reports and plots read.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Percentiles {
    pub p50: f64,
    pub p90: f64,
    pub p99: f64,
    pub p999: f64,
    pub max: f64,
    pub mean: f64,
    pub count: u64,
}

/// Completions per whole second of a measured window, with the slowest put and the longest gap
/// between replies in each second (a stall shows as one second's spike, not as a shift of the
/// whole distribution).
#[derive(Clone, Debug, Default)]
pub struct Series {
    seconds: Vec<SeriesPoint>,
    /// Seconds kept at most; later completions are dropped (the window is over by then).
    max_seconds: usize,
}

/// One second of the series as it appears in the JSON.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct SeriesPoint {
    /// Seconds since the measured window began (the bucket's start).
    pub t_s: u64,
    pub puts: u64,
    pub acks: u64,
    /// The slowest put answered in this second, in µs.
    #[serde(default)]
    pub put_max_us: f64,
    /// The longest wait for a reply that ended in this second on any connection, in µs.
    #[serde(default)]
    pub gap_max_us: f64,
}

impl Series {
    /// Room for up to `max_seconds` buckets, made as they fill.
    pub fn new(max_seconds: usize) -> Self {
        Series {
            seconds: Vec::new(),
            max_seconds,
        }
    }

    fn at(&mut self, since_start_ns: u64) -> Option<&mut SeriesPoint> {
        let i = (since_start_ns / 1_000_000_000) as usize;
        if i >= self.max_seconds {
            return None;
        }
        while self.seconds.len() <= i {
            let t_s = self.seconds.len() as u64;
            self.seconds.push(SeriesPoint {
                t_s,
                ..SeriesPoint::default()
            });
        }
        self.seconds.get_mut(i)
    }

    /// A put answered `since_start_ns` into the window, after `latency_ns`.
    pub fn put(&mut self, since_start_ns: u64, latency_ns: u64) {
        if let Some(p) = self.at(since_start_ns) {
            p.puts += 1;
            p.put_max_us = p.put_max_us.max(us(latency_ns));
        }
    }

    pub fn ack(&mut self, since_start_ns: u64) {
        if let Some(p) = self.at(since_start_ns) {
            p.acks += 1;
        }
    }

    /// A connection waited `gap_ns` for a reply that came `since_start_ns` into the window.
    pub fn gap(&mut self, since_start_ns: u64, gap_ns: u64) {
        if let Some(p) = self.at(since_start_ns) {
            p.gap_max_us = p.gap_max_us.max(us(gap_ns));
        }
    }

    /// Pad to `seconds` buckets (a window's quiet tail still shows as zeros).
    pub fn pad_to(&mut self, seconds: usize) {
        if let Some(last) = seconds.checked_sub(1) {
            self.at(last as u64 * 1_000_000_000);
        }
    }

    /// `other` continues this series in time (a later phase of the same run).
    pub fn append(&mut self, other: &Series) {
        let offset = self.seconds.len() as u64;
        self.max_seconds = self
            .max_seconds
            .max(self.seconds.len() + other.seconds.len());
        self.seconds
            .extend(other.seconds.iter().map(|p| SeriesPoint {
                t_s: p.t_s + offset,
                ..*p
            }));
    }

    pub fn points(&self) -> Vec<SeriesPoint> {
        self.seconds.clone()
    }
}

/// The longest wait for a reply on any one connection while it had a request outstanding:
/// a growth stall in the target (a rehash, a snapshot step) shows here even when it is too rare
/// to move a percentile.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Stall {
    /// The gap, in µs: from the later of the connection's previous reply and this request's send
    /// to this reply.
    pub gap_us: f64,
    /// When it ended, in seconds since the measured window began.
    pub at_s: f64,
    /// The connection that waited, and the request whose reply ended the wait.
    pub connection: usize,
    pub request: String,
}

impl Stall {
    pub fn observe(&mut self, gap_ns: u64, since_start_ns: u64, connection: usize, request: &str) {
        if us(gap_ns) > self.gap_us {
            *self = Stall {
                gap_us: us(gap_ns),
                at_s: since_start_ns as f64 / 1e9,
                connection,
                request: request.to_string(),
            };
        }
    }

    /// The longer of the two.
    pub fn max(self, other: Stall) -> Stall {
        if other.gap_us > self.gap_us {
            other
        } else {
            self
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_of_a_uniform_distribution() {
        let mut l = Latency::new();
        for us in 1..=1000u64 {
            l.record_ns(us * 1000);
        }
        let p = l.percentiles();
        assert_eq!(p.count, 1000);
        // 3 significant digits: each value within 0.1% of the exact one.
        let close = |got: f64, want: f64| (got - want).abs() <= want * 0.001 + 0.001;
        assert!(close(p.p50, 500.0), "{p:?}");
        assert!(close(p.p90, 900.0), "{p:?}");
        assert!(close(p.p99, 990.0), "{p:?}");
        assert!(close(p.p999, 999.0), "{p:?}");
        assert!(close(p.max, 1000.0), "{p:?}");
        assert!(close(p.mean, 500.5), "{p:?}");
    }

    #[test]
    fn empty_histograms_report_zeros() {
        let p = Latency::new().percentiles();
        assert_eq!(p, Percentiles::default());
        assert!(Latency::new().spectrum().is_empty());
        assert!(Latency::new()
            .hgrm()
            .contains("Total count    =            0"));
    }

    #[test]
    fn out_of_range_values_are_clamped_not_lost() {
        let mut l = Latency::new();
        l.record_ns(0);
        l.record_ns(u64::MAX);
        assert_eq!(l.count(), 2);
        assert!(l.percentiles().max >= MAX_LATENCY_NS as f64 / 1e3 * 0.999);
    }

    #[test]
    fn hgrm_is_monotonic_and_ends_at_100_percent() {
        let mut l = Latency::new();
        for i in 0..10_000u64 {
            l.record_ns(10_000 + i * 37 % 5000);
        }
        let text = l.hgrm();
        let rows: Vec<(f64, f64, u64)> = text
            .lines()
            .skip(2)
            .take_while(|line| !line.starts_with('#'))
            .map(|line| {
                let f: Vec<&str> = line.split_whitespace().collect();
                (
                    f[0].parse().unwrap(),
                    f[1].parse().unwrap(),
                    f[2].parse().unwrap(),
                )
            })
            .collect();
        assert!(rows.len() > 10, "{text}");
        for w in rows.windows(2) {
            assert!(
                w[1].0 >= w[0].0 && w[1].1 >= w[0].1 && w[1].2 >= w[0].2,
                "{w:?}"
            );
        }
        let last = rows.last().unwrap();
        assert_eq!(last.1, 1.0);
        assert_eq!(last.2, 10_000);
        assert!(text.contains("Total count    =        10000"), "{text}");
    }

    #[test]
    fn series_counts_per_second_and_drops_the_overflow() {
        let mut s = Series::new(2);
        s.put(0, 1_000);
        s.put(999_999_999, 3_000);
        s.ack(1_000_000_000);
        s.gap(1_500_000_000, 7_000);
        s.ack(5_000_000_000);
        assert_eq!(
            s.points(),
            vec![
                SeriesPoint {
                    t_s: 0,
                    puts: 2,
                    put_max_us: 3.0,
                    ..SeriesPoint::default()
                },
                SeriesPoint {
                    t_s: 1,
                    acks: 1,
                    gap_max_us: 7.0,
                    ..SeriesPoint::default()
                }
            ]
        );
        let mut later = Series::new(10);
        later.ack(0);
        s.append(&later);
        assert_eq!(s.points()[2].t_s, 2);
        assert_eq!(s.points()[2].acks, 1);
    }

    #[test]
    fn the_longest_stall_is_kept_with_where_it_happened() {
        let mut st = Stall::default();
        st.observe(5_000, 1_000_000_000, 3, "put");
        st.observe(2_000, 2_000_000_000, 1, "ack");
        assert_eq!(st.gap_us, 5.0);
        assert_eq!(
            (st.at_s, st.connection, st.request.as_str()),
            (1.0, 3, "put")
        );
        let other = Stall {
            gap_us: 9.0,
            ..Stall::default()
        };
        assert_eq!(st.max(other).gap_us, 9.0);
    }
}
