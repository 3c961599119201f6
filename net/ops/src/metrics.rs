//! `/metrics`' page: the Prometheus text format of the shared figure list
//! ([`Snapshot::metrics`]: gauges and counters under `tarq_<name>`), the service-time
//! histogram and the Graphite pusher's own counters ([`render`]), and [`ServiceTimes`], the
//! histogram of request service time the loop feeds per request. The HTTP port's front-end
//! (`tarq_net::frontend::http`) serves the page on the loop's own connections.

use std::fmt::Write as _;
use std::time::Duration;

use super::graphite::GraphiteCounters;
use super::stats::{Kind, Snapshot};

/// Buckets of [`ServiceTimes`]: upper bounds 1 µs · 2^k for k in 0..BUCKETS, so 1 µs to about
/// 1 s; a request slower than a second lands in `+Inf`, and one second is already an outage
/// for a queue answering in microseconds.
pub const BUCKETS: usize = 21;

/// The histogram's name on the page.
const SERVICE_TIME: &str = "tarq_request_duration_seconds";

/// One request in this many is timed. A clock read costs 20-60 ns, a request about 1 µs at
/// the target rate: timing every request would cost the loop several percent, one in 16 costs
/// a fraction of one, and thousands of timed requests a second still draw the distribution.
/// A power of two, so the check is a mask.
pub const TIME_ONE_IN: u64 = 16;

/// Histogram of request service time, with fixed power-of-two buckets so that recording is a
/// division, a `leading_zeros` and an increment; every request is counted, one in
/// [`TIME_ONE_IN`] is timed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServiceTimes {
    /// `counts[k]` holds timed requests that took at most 2^k µs and more than 2^(k-1) µs;
    /// `counts[BUCKETS]` holds the slower ones.
    counts: [u64; BUCKETS + 1],
    sum_nanos: u64,
    /// Every request executed since start.
    requests: u64,
}

impl Default for ServiceTimes {
    fn default() -> Self {
        ServiceTimes {
            counts: [0; BUCKETS + 1],
            sum_nanos: 0,
            requests: 0,
        }
    }
}

impl ServiceTimes {
    /// Counts a request about to run; true when this one is to be timed.
    #[inline]
    pub fn count_request(&mut self) -> bool {
        self.requests += 1;
        self.requests & (TIME_ONE_IN - 1) == 0
    }

    /// Whether the next request counted will be timed ([`count_request`] answers the same):
    /// a front-end that learns a request's kind only by reading it starts the clock first.
    ///
    /// [`count_request`]: Self::count_request
    #[inline]
    pub fn next_is_timed(&self) -> bool {
        self.requests.wrapping_add(1) & (TIME_ONE_IN - 1) == 0
    }

    /// Requests executed since start.
    pub fn requests(&self) -> u64 {
        self.requests
    }

    /// Counts one request that took `nanos` nanoseconds.
    #[inline]
    pub fn record_nanos(&mut self, nanos: u64) {
        let micros = nanos.div_ceil(1000);
        let k = if micros <= 1 {
            0
        } else {
            (u64::BITS - (micros - 1).leading_zeros()) as usize
        };
        self.counts[k.min(BUCKETS)] += 1;
        self.sum_nanos = self.sum_nanos.wrapping_add(nanos);
    }

    #[inline]
    pub fn record(&mut self, d: Duration) {
        self.record_nanos(d.as_nanos().min(u128::from(u64::MAX)) as u64);
    }

    /// Requests timed.
    pub fn count(&self) -> u64 {
        self.counts.iter().sum()
    }

    /// Upper bound of bucket `k` in seconds.
    fn bound(k: usize) -> f64 {
        (1u64 << k) as f64 / 1e6
    }

    /// Appends the histogram in the Prometheus text format.
    fn render(&self, page: &mut String) {
        let _ = writeln!(
            page,
            "# HELP {SERVICE_TIME} Time to execute one request, from its decoded frame to its \
             encoded reply (waits of parked takes excluded); one request in {TIME_ONE_IN} is \
             timed.\n# TYPE {SERVICE_TIME} histogram"
        );
        let mut cumulative = 0;
        for k in 0..BUCKETS {
            cumulative += self.counts[k];
            let _ = writeln!(
                page,
                "{SERVICE_TIME}_bucket{{le=\"{}\"}} {cumulative}",
                Self::bound(k)
            );
        }
        cumulative += self.counts[BUCKETS];
        let _ = writeln!(page, "{SERVICE_TIME}_bucket{{le=\"+Inf\"}} {cumulative}");
        let _ = writeln!(page, "{SERVICE_TIME}_sum {}", self.sum_nanos as f64 / 1e9);
        let _ = writeln!(page, "{SERVICE_TIME}_count {cumulative}");
    }
}

/// Renders the page into `page` (cleared first).
pub fn render(
    page: &mut String,
    stats: &Snapshot,
    service: &ServiceTimes,
    graphite: Option<GraphiteCounters>,
) {
    page.clear();
    for m in stats.metrics() {
        let (kind, suffix) = match m.kind {
            Kind::Gauge => ("gauge", ""),
            Kind::Counter => ("counter", "_total"),
        };
        let name = prometheus_name(m.name);
        let _ = writeln!(
            page,
            "# HELP tarq_{name}{suffix} {}\n# TYPE tarq_{name}{suffix} {kind}\ntarq_{name}{suffix} {}",
            m.help, m.value
        );
    }
    render_tubes(page, stats);
    render_users(page, stats);
    // In seconds, as Prometheus measures time (the shared list holds whole numbers).
    let _ = writeln!(
        page,
        "# HELP tarq_last_move_duration_seconds How long the last committed partition move \
         from this node took.\n# TYPE tarq_last_move_duration_seconds gauge\n\
         tarq_last_move_duration_seconds {}",
        stats.server.last_move_ms as f64 / 1e3
    );
    service.render(page);
    if let Some(g) = graphite {
        for (name, help, value) in [
            (
                "samples",
                "Samples queued for Graphite since start.",
                g.samples,
            ),
            (
                "samples_dropped",
                "Samples dropped since start: Graphite away or slow and the buffer full.",
                g.dropped,
            ),
            (
                "connects",
                "Connections made to Graphite since start.",
                g.connects,
            ),
        ] {
            let _ = writeln!(
                page,
                "# HELP tarq_graphite_{name}_total {help}\n\
                 # TYPE tarq_graphite_{name}_total counter\ntarq_graphite_{name}_total {value}"
            );
        }
    }
}

/// A figure's name under Prometheus: `tarq_<name>`, except where that would read as something
/// else (`total`, the seed's count of tasks, would look like a counter's `_total` suffix).
/// Each per-tube figure as one family, `tarq_tube_<name>{tube="..."}`, a sample per tube; a
/// partition of a partitioned tube adds `partition="<p>"`, so each series is its own.
fn render_tubes(page: &mut String, stats: &Snapshot) {
    use crate::tubes::{prometheus_label, tube_metrics, TUBE_METRICS};
    if stats.tubes.is_empty() {
        return;
    }
    let figures: Vec<_> = stats.tubes.iter().map(|t| tube_metrics(&t.stats)).collect();
    for i in 0..TUBE_METRICS {
        let m = figures[0][i];
        let (kind, suffix) = match m.kind {
            Kind::Gauge => ("gauge", ""),
            Kind::Counter => ("counter", "_total"),
        };
        let name = format!("tarq_tube_{}{suffix}", prometheus_name(m.name));
        let _ = writeln!(page, "# HELP {name} {}\n# TYPE {name} {kind}", m.help);
        for (t, f) in stats.tubes.iter().zip(&figures) {
            let tube = prometheus_label(&t.name);
            let _ = match t.partition {
                None => writeln!(page, "{name}{{tube=\"{tube}\"}} {}", f[i].value),
                Some(p) => writeln!(
                    page,
                    "{name}{{tube=\"{tube}\",partition=\"{p}\"}} {}",
                    f[i].value
                ),
            };
        }
    }
    // In seconds, as Prometheus measures time (the shared list holds whole numbers).
    let name = "tarq_tube_oldest_ready_age_seconds";
    let _ = writeln!(
        page,
        "# HELP {name} How long the ready task a take gets next has waited since its put (0 \
         while none is ready).\n# TYPE {name} gauge"
    );
    for t in &stats.tubes {
        let tube = prometheus_label(&t.name);
        let age = match t.stats.ready_since {
            0 => 0.0,
            since => stats.now.saturating_sub(since) as f64 / 1e6,
        };
        let _ = match t.partition {
            None => writeln!(page, "{name}{{tube=\"{tube}\"}} {age}"),
            Some(p) => writeln!(page, "{name}{{tube=\"{tube}\",partition=\"{p}\"}} {age}"),
        };
    }
}

/// The per-user limits' figures, a family each, `tarq_user_<name>{user="..."}`, a sample per
/// user that has connected since start (none: no family).
fn render_users(page: &mut String, stats: &Snapshot) {
    use crate::stats::UserFigures;
    use crate::tubes::prometheus_label;
    if stats.users.is_empty() {
        return;
    }
    type Value = fn(&UserFigures) -> String;
    let families: [(&str, &str, &str, Value); 4] = [
        (
            "tarq_user_connections",
            "gauge",
            "Connections acting as the user now.",
            |u| u.connections.to_string(),
        ),
        (
            "tarq_user_connections_refused_total",
            "counter",
            "Connections of the user refused at user-max-connections, since start.",
            |u| u.refused.to_string(),
        ),
        (
            "tarq_user_puts_delayed_total",
            "counter",
            "Puts of the user answered late for user-put-rate, since start.",
            |u| u.puts_delayed.to_string(),
        ),
        (
            "tarq_user_put_delay_seconds_total",
            "counter",
            "Time the user's connections were muted for user-put-rate, since start.",
            |u| (u.delay as f64 / 1e6).to_string(),
        ),
    ];
    for (name, kind, help, value) in families {
        let _ = writeln!(page, "# HELP {name} {help}\n# TYPE {name} {kind}");
        for u in &stats.users {
            let user = prometheus_label(&u.name);
            let _ = writeln!(page, "{name}{{user=\"{user}\"}} {}", value(u));
        }
    }
}

fn prometheus_name(name: &str) -> &str {
    match name {
        "total" => "tasks",
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn next_is_timed_says_what_count_request_will() {
        let mut s = ServiceTimes::default();
        let mut timed = 0;
        for _ in 0..3 * TIME_ONE_IN {
            let said = s.next_is_timed();
            assert_eq!(said, s.count_request());
            timed += u64::from(said);
        }
        assert_eq!(timed, 3, "one request in TIME_ONE_IN is timed");
    }

    #[test]
    fn service_times_land_in_power_of_two_buckets() {
        let mut h = ServiceTimes::default();
        // (nanoseconds, bucket): bucket k holds (2^(k-1), 2^k] microseconds.
        for (nanos, k) in [
            (0, 0),
            (1, 0),
            (1_000, 0),
            (1_001, 1),
            (2_000, 1),
            (2_001, 2),
            (4_000, 2),
            (1_000_000, 10),
            (1_048_576_000, 20),
            (1_048_576_001, 21),
            (u64::MAX, 21),
        ] {
            let before = h.counts[k];
            h.record_nanos(nanos);
            assert_eq!(
                h.counts[k],
                before + 1,
                "{nanos} ns should land in bucket {k}"
            );
        }
        assert_eq!(h.count(), 11);
        assert_eq!(ServiceTimes::bound(0), 0.000001);
        assert_eq!(ServiceTimes::bound(20), 1.048576);
    }

    #[test]
    fn every_request_is_counted_and_one_in_sixteen_timed() {
        let mut h = ServiceTimes::default();
        let timed = (0..TIME_ONE_IN * 10).filter(|_| h.count_request()).count();
        assert_eq!(timed, 10);
        assert_eq!(h.requests(), TIME_ONE_IN * 10);
        assert!(TIME_ONE_IN.is_power_of_two());
    }

    #[test]
    fn the_page_names_every_figure_once_with_its_type() {
        let mut snap = Snapshot::default();
        snap.engine.ready = 3;
        snap.engine.puts = 7;
        let mut h = ServiceTimes::default();
        h.record_nanos(1500);
        let mut page = String::new();
        render(&mut page, &snap, &h, Some(GraphiteCounters::default()));
        assert!(
            page.contains("# TYPE tarq_ready gauge\ntarq_ready 3\n"),
            "{page}"
        );
        assert!(page.contains("# TYPE tarq_puts_total counter\ntarq_puts_total 7\n"));
        assert!(page.contains("# TYPE tarq_tasks gauge\n"));
        assert!(page.contains("tarq_request_duration_seconds_bucket{le=\"0.000002\"} 1\n"));
        assert!(page.contains("tarq_request_duration_seconds_count 1\n"));
        assert!(page.contains("tarq_graphite_samples_dropped_total 0\n"));
        for m in snap.metrics() {
            let suffix = if m.kind == Kind::Counter {
                "_total"
            } else {
                ""
            };
            let line = format!("\ntarq_{}{suffix} {}\n", prometheus_name(m.name), m.value);
            assert_eq!(page.matches(&line).count(), 1, "{}", m.name);
            let n = page
                .matches(&format!("# TYPE tarq_{}{suffix} ", prometheus_name(m.name)))
                .count();
            assert_eq!(n, 1, "{}", m.name);
        }
    }

    #[test]
    fn each_user_is_a_series_of_each_user_family() {
        let snap = Snapshot {
            users: vec![crate::stats::UserFigures {
                name: "bob \"b\"".into(),
                connections: 2,
                refused: 1,
                puts_delayed: 7,
                delay: 1_500_000,
            }],
            ..Default::default()
        };
        let mut page = String::new();
        render(&mut page, &snap, &ServiceTimes::default(), None);
        for line in [
            "tarq_user_connections{user=\"bob \\\"b\\\"\"} 2\n",
            "tarq_user_connections_refused_total{user=\"bob \\\"b\\\"\"} 1\n",
            "tarq_user_puts_delayed_total{user=\"bob \\\"b\\\"\"} 7\n",
            "tarq_user_put_delay_seconds_total{user=\"bob \\\"b\\\"\"} 1.5\n",
        ] {
            assert!(page.contains(line), "{line} in {page}");
        }
        let none = Snapshot::default();
        render(&mut page, &none, &ServiceTimes::default(), None);
        assert!(!page.contains("tarq_user_"), "no users, no families");
    }

    #[test]
    fn partitions_of_one_tube_are_series_of_their_own() {
        let figures = |name: &str, partition, ready| crate::stats::TubeFigures {
            name: name.into(),
            partition,
            stats: tarq_engine::Stats {
                ready,
                ..Default::default()
            },
        };
        let snap = Snapshot {
            tubes: vec![
                figures("default", None, 1),
                figures("jobs", Some(0), 2),
                figures("jobs", Some(3), 5),
            ],
            ..Default::default()
        };
        let mut page = String::new();
        render(&mut page, &snap, &ServiceTimes::default(), None);
        assert!(
            page.contains(
                "# TYPE tarq_tube_ready gauge\n\
                 tarq_tube_ready{tube=\"default\"} 1\n\
                 tarq_tube_ready{tube=\"jobs\",partition=\"0\"} 2\n\
                 tarq_tube_ready{tube=\"jobs\",partition=\"3\"} 5\n"
            ),
            "{page}"
        );
    }
}
