//! Per-tube figures: each tube's counts and counters, named once here for Graphite
//! (`queue.stats.<tube>.<name>`) and Prometheus (`tarq_tube_<name>{tube="<tube>"}`), the way
//! [`crate::stats`] names the server-wide ones. A partition of a partitioned tube is told
//! apart by its number: `queue.stats.<tube>.partition.<p>.<name>` and
//! `tarq_tube_<name>{tube="<tube>",partition="<p>"}`; a tube of one partition keeps the plain
//! names. A tube's name is the operator's, so it is made safe for each format here: dots and
//! spaces become `_` in a Graphite path (a dot would add a level), and quotes, backslashes and
//! newlines are escaped in a Prometheus label.

use std::borrow::Cow;

use tarq_engine::Stats;

use crate::stats::{Kind, Metric};

pub use crate::stats::TubeFigures;

/// How many figures each tube has.
pub const TUBE_METRICS: usize = 22;

/// A tube's figures, in a stable order.
pub fn tube_metrics(s: &Stats) -> [Metric; TUBE_METRICS] {
    use Kind::{Counter, Gauge};
    let m = |name, kind, help, value| Metric {
        name,
        kind,
        help,
        value,
    };
    [
        m("total", Gauge, "Tasks in the tube now.", s.total),
        m("ready", Gauge, "Tasks of the tube ready now.", s.ready),
        m("taken", Gauge, "Tasks of the tube taken now.", s.taken),
        m(
            "waiting",
            Gauge,
            "Delayed tasks of the tube now.",
            s.waiting,
        ),
        m("buried", Gauge, "Buried tasks of the tube now.", s.buried),
        m("puts", Counter, "Puts into the tube so far.", s.puts),
        m(
            "takes",
            Counter,
            "Tasks taken from the tube so far.",
            s.takes,
        ),
        m("acks", Counter, "Tasks acked so far.", s.acks),
        m("releases", Counter, "Tasks released so far.", s.releases),
        m(
            "auto_released",
            Counter,
            "Tasks released because their session ended, so far.",
            s.auto_released,
        ),
        m(
            "promoted",
            Counter,
            "Delayed tasks that became ready, so far.",
            s.promoted,
        ),
        m(
            "expired",
            Counter,
            "Tasks whose TTL ended, so far.",
            s.expired,
        ),
        m(
            "ttr_returned",
            Counter,
            "Taken tasks returned by their TTR, so far.",
            s.ttr_returned,
        ),
        m("buries", Counter, "Tasks buried so far.", s.buries),
        m("kicks", Counter, "Tasks kicked so far.", s.kicks),
        m("deletes", Counter, "Tasks deleted so far.", s.deletes),
        m("touches", Counter, "Touches so far.", s.touches),
        m(
            "dead_lettered",
            Counter,
            "Tasks buried by max_deliveries instead of returning, so far.",
            s.dead_lettered,
        ),
        m(
            "deduplicated",
            Counter,
            "Puts answered with an earlier task of the same dedup key, so far.",
            s.deduplicated,
        ),
        m(
            "takers_waiting",
            Gauge,
            "Takes waiting for a task of the tube now.",
            s.takers_waiting,
        ),
        m(
            "takers_holding",
            Gauge,
            "Sessions holding a task of the tube now.",
            s.takers_holding,
        ),
        m(
            "idle",
            Gauge,
            "1 while the tube has ready tasks and no taker (none waiting, none holding one).",
            u64::from(s.ready > 0 && s.takers_waiting == 0 && s.takers_holding == 0),
        ),
    ]
}

/// The tube's name as one level of a Graphite path.
pub fn graphite_level(tube: &str) -> Cow<'_, str> {
    if tube.bytes().all(|b| b.is_ascii_graphic() && b != b'.') {
        Cow::Borrowed(tube)
    } else {
        Cow::Owned(
            tube.chars()
                .map(|c| {
                    if c == '.' || c.is_whitespace() || c.is_control() {
                        '_'
                    } else {
                        c
                    }
                })
                .collect(),
        )
    }
}

/// The Graphite path of a tube's figures below `queue.stats.`: its name as one level, then
/// `partition.<p>` for a partition of a partitioned tube.
pub fn graphite_path(tube: &str, partition: Option<u16>) -> Cow<'_, str> {
    let level = graphite_level(tube);
    match partition {
        None => level,
        Some(p) => Cow::Owned(format!("{level}.partition.{p}")),
    }
}

/// The tube's name as a Prometheus label value (without the quotes).
pub fn prometheus_label(tube: &str) -> Cow<'_, str> {
    if !tube.contains(['\\', '"', '\n']) {
        return Cow::Borrowed(tube);
    }
    let mut s = String::with_capacity(tube.len() + 2);
    for c in tube.chars() {
        match c {
            '\\' => s.push_str("\\\\"),
            '"' => s.push_str("\\\""),
            '\n' => s.push_str("\\n"),
            c => s.push(c),
        }
    }
    Cow::Owned(s)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tube_names_are_made_safe_for_each_format() {
        assert_eq!(graphite_level("emails"), "emails");
        assert_eq!(graphite_level("a.b c"), "a_b_c");
        assert_eq!(graphite_path("a.b", None), "a_b");
        assert_eq!(graphite_path("a.b", Some(3)), "a_b.partition.3");
        assert_eq!(prometheus_label("emails"), "emails");
        assert_eq!(prometheus_label("say \"hi\"\\\n"), "say \\\"hi\\\"\\\\\\n");
    }

    #[test]
    fn every_figure_is_named_once() {
        let names: std::collections::HashSet<_> = tube_metrics(&Stats::default())
            .iter()
            .map(|m| m.name)
            .collect();
        assert_eq!(names.len(), TUBE_METRICS);
    }
}
