//! The console's live figures: a ring of per-second samples, overall and per tube, kept for
//! [`RING_SECONDS`], so a chart opened now is full at once instead of filling while it is
//! watched. The server calls [`Live::sample`] once a second with the engine's counters, or, on
//! a sharded cluster's node, [`Live::sample_whole`] with each whole tube's counters as the
//! partitions' owners gave them; this file turns them into rates and levels and writes them as
//! JSON (the history a page loads first, and the one event a second the event stream sends). A
//! whole tube's second that is not known (an owner did not answer in time, its counters read
//! lower than before) is a gap ([`GAP`], `null` in the JSON), never a zero nor, once known
//! again, a spike. It knows figures only: which connections listen is the server's, who asks
//! the owners the router's, and the HTTP framing the front-end's.

use std::collections::HashMap;
use std::fmt::Write as _;

use tarq_engine::Stats;

/// Seconds of history kept: fifteen minutes, what an operator scrolls back to when something
/// just happened, at 28 bytes a second per charted tube.
pub const RING_SECONDS: usize = 900;

/// Tubes with a history of their own (the first ones seen, by the order the queue lists them).
/// Every tube has its current rates; a ring costs 25 KiB, so 256 of them bound the memory at
/// about 6.5 MiB whatever the number of tubes (up to 4,096), and bound each event's size.
pub const MAX_CHARTED_TUBES: usize = 256;

/// A figure not known for its second (`null` in the JSON); a known one is below it.
pub const GAP: u32 = u32::MAX;

/// Seconds in a row a whole tube's counters may read lower than the last known ones (a
/// partition read from its old owner after it moved, a turn lost in a failover) before they
/// are taken as they are: each of them is a gap meanwhile.
const DIP_SECONDS: u8 = 3;

/// Where a history's figures come from: this node's engine, or the whole sharded cluster's
/// tubes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Scope {
    #[default]
    Node,
    Cluster,
}

impl Scope {
    pub fn as_str(self) -> &'static str {
        match self {
            Scope::Node => "node",
            Scope::Cluster => "cluster",
        }
    }
}

/// One second's figures: the rates of puts, takes and acks over that second, and the levels
/// by status at its end.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Sample {
    pub put: u32,
    pub take: u32,
    pub ack: u32,
    pub ready: u32,
    pub taken: u32,
    pub delayed: u32,
    pub buried: u32,
}

/// The names of [`Sample`]'s fields, in the order the JSON arrays give them.
pub const SERIES: [&str; 7] = ["put", "take", "ack", "ready", "taken", "delayed", "buried"];

impl Sample {
    /// A second of which nothing is known.
    pub const GAP: Sample = Sample {
        put: GAP,
        take: GAP,
        ack: GAP,
        ready: GAP,
        taken: GAP,
        delayed: GAP,
        buried: GAP,
    };

    /// Each figure the sum of `self`'s and `other`'s; unknown where either is.
    fn plus(&self, other: &Sample) -> Sample {
        let (a, b) = (self.values(), other.values());
        let v: [u32; 7] = std::array::from_fn(|i| match (a[i], b[i]) {
            (GAP, _) | (_, GAP) => GAP,
            (x, y) => x.saturating_add(y).min(GAP - 1),
        });
        Sample {
            put: v[0],
            take: v[1],
            ack: v[2],
            ready: v[3],
            taken: v[4],
            delayed: v[5],
            buried: v[6],
        }
    }

    fn values(&self) -> [u32; 7] {
        [
            self.put,
            self.take,
            self.ack,
            self.ready,
            self.taken,
            self.delayed,
            self.buried,
        ]
    }

    /// The second since `before` (counters) ending at `now`.
    fn between(before: &Counters, now: &Stats) -> Sample {
        let rate = |a: u64, b: u64| u32::try_from(a.saturating_sub(b)).unwrap_or(GAP - 1);
        let level = |v: u64| u32::try_from(v).unwrap_or(GAP - 1);
        Sample {
            put: rate(now.puts, before.puts),
            take: rate(now.takes, before.takes),
            ack: rate(now.acks, before.acks),
            ready: level(now.ready),
            taken: level(now.taken),
            delayed: level(now.waiting),
            buried: level(now.buried),
        }
    }
}

/// The counters a rate is the difference of.
#[derive(Debug, Clone, Copy, Default)]
struct Counters {
    puts: u64,
    takes: u64,
    acks: u64,
}

impl Counters {
    /// Whether any of them reads lower than in `before`.
    fn below(&self, before: &Counters) -> bool {
        self.puts < before.puts || self.takes < before.takes || self.acks < before.acks
    }
}

impl From<&Stats> for Counters {
    fn from(s: &Stats) -> Self {
        Counters {
            puts: s.puts,
            takes: s.takes,
            acks: s.acks,
        }
    }
}

/// The last [`RING_SECONDS`] samples, oldest first once full.
#[derive(Debug, Default)]
struct Ring {
    samples: Vec<Sample>,
    /// Where the next sample goes once the ring is full.
    next: usize,
}

impl Ring {
    fn push(&mut self, s: Sample) {
        if self.samples.len() < RING_SECONDS {
            self.samples.push(s);
        } else {
            self.samples[self.next] = s;
            self.next = (self.next + 1) % RING_SECONDS;
        }
    }

    fn iter(&self) -> impl Iterator<Item = &Sample> {
        let (new, old) = self.samples.split_at(self.next);
        old.iter().chain(new)
    }

    /// The newest `n` samples at most, oldest first.
    fn last(&self, n: usize) -> impl Iterator<Item = &Sample> {
        let skip = self.samples.len().saturating_sub(n);
        self.iter().skip(skip)
    }
}

#[derive(Debug, Default)]
struct TubeLive {
    last: Counters,
    now: Sample,
    /// Its history, for the first [`MAX_CHARTED_TUBES`] tubes.
    ring: Option<Ring>,
    /// The sample that last saw it (a tube not seen in a sample is gone).
    seen: u64,
    /// A whole tube's: the sample its counters `last` are of, once known.
    since: Option<u64>,
    /// A whole tube's: samples in a row whose counters read lower than `last`.
    dips: u8,
}

/// The figures of the last [`RING_SECONDS`] seconds; see the module doc.
#[derive(Debug, Default)]
pub struct Live {
    /// Samples taken since start.
    samples: u64,
    /// The wall-clock second (since the epoch) of the newest sample.
    second: u64,
    last: Counters,
    overall: Ring,
    tubes: HashMap<String, TubeLive>,
    charted: usize,
    scope: Scope,
}

impl Live {
    /// Takes the sample of the second ending at `second` (since the epoch) from each live
    /// tube's counters; the whole queue's are their sum. A tube without a name (`None`: one
    /// that is only part of another) counts in the sum only. O(tubes).
    pub fn sample<'a>(
        &mut self,
        second: u64,
        tubes: impl Iterator<Item = (Option<&'a str>, Stats)>,
    ) {
        self.samples += 1;
        let n = self.samples;
        self.second = second;
        let mut overall = Stats::default();
        for (name, stats) in tubes {
            overall += &stats;
            let Some(name) = name else { continue };
            let t = self.tube(name, Counters::from(&stats));
            t.now = Sample::between(&t.last, &stats);
            t.last = Counters::from(&stats);
            t.seen = n;
            if let Some(r) = &mut t.ring {
                r.push(t.now);
            }
        }
        // A dropped tube takes its counts with it: a rate never goes below 0 for that.
        let mut s = Sample::between(&self.last, &overall);
        if n == 1 {
            (s.put, s.take, s.ack) = (0, 0, 0);
        }
        self.overall.push(s);
        self.last = Counters::from(&overall);
        self.forget_gone();
    }

    /// Takes the sample of the second at `second` (since the epoch) of a sharded cluster's
    /// whole tubes, each with its counters summed over its partitions, or `None` when not
    /// every partition's owner answered; the whole cluster's figures are their sum. A tube's
    /// rates are known when its counters were known the sample before too and read no lower;
    /// its levels, when its counters are known. From the first call on the history is the
    /// cluster's. O(tubes).
    pub fn sample_whole<'a>(
        &mut self,
        second: u64,
        tubes: impl Iterator<Item = (&'a str, Option<Stats>)>,
    ) {
        self.scope = Scope::Cluster;
        self.samples += 1;
        let n = self.samples;
        self.second = second;
        let mut overall = Sample::default();
        for (name, stats) in tubes {
            let t = self.tube(name, Counters::default());
            t.now = t.whole(n, stats.as_ref());
            t.seen = n;
            if let Some(r) = &mut t.ring {
                r.push(t.now);
            }
            overall = overall.plus(&t.now);
        }
        self.overall.push(overall);
        self.forget_gone();
    }

    /// Tube `name`'s figures, made with counters `last` when it is new. Looked up by
    /// reference: a tube seen before costs no allocation a second.
    fn tube(&mut self, name: &str, last: Counters) -> &mut TubeLive {
        if !self.tubes.contains_key(name) {
            let ring = (self.charted < MAX_CHARTED_TUBES).then(Ring::default);
            self.charted += ring.is_some() as usize;
            let t = TubeLive {
                last,
                ..TubeLive::default()
            };
            self.tubes.insert(name.to_owned(), t.with_ring(ring));
        }
        self.tubes.get_mut(name).expect("inserted above")
    }

    /// Tubes the newest sample did not see are gone, their histories with them.
    fn forget_gone(&mut self) {
        let n = self.samples;
        let charted = &mut self.charted;
        self.tubes.retain(|_, t| {
            let live = t.seen == n;
            if !live && t.ring.is_some() {
                *charted -= 1;
            }
            live
        });
    }

    /// The newest second's figures of tube `name`, if it was sampled.
    pub fn tube_now(&self, name: &str) -> Option<Sample> {
        self.tubes.get(name).map(|t| t.now)
    }

    /// The newest second's figures of the whole queue.
    pub fn overall_now(&self) -> Sample {
        self.overall.last(1).next().copied().unwrap_or_default()
    }

    /// Samples taken since start.
    pub fn samples(&self) -> u64 {
        self.samples
    }

    /// Where the figures come from.
    pub fn scope(&self) -> Scope {
        self.scope
    }

    /// The history as JSON: `{"end": second, "start": second, "step": 1, "scope": "node",
    /// "series": [...names], "overall": [[...], ...], "tube": [[...], ...]}`, each inner array
    /// one series over time, oldest first, from the second `start` (the first sample kept:
    /// `null` before any) to the second `end`, a figure not known `null`; `scope` says whose
    /// figures they are (`node` or `cluster`); `tube` only when `tube` names a charted tube
    /// (`null` for one without a history).
    pub fn history_json(&self, out: &mut String, tube: Option<&str>) {
        let kept = self.overall.samples.len() as u64;
        let _ = write!(out, "{{\"end\":{},\"start\":", self.second);
        match kept {
            0 => out.push_str("null"),
            k => {
                let _ = write!(out, "{}", (self.second + 1).saturating_sub(k));
            }
        }
        let scope = self.scope.as_str();
        let _ = write!(out, ",\"step\":1,\"scope\":\"{scope}\",\"series\":[");
        for (i, name) in SERIES.iter().enumerate() {
            let _ = write!(out, "{}\"{name}\"", if i > 0 { "," } else { "" });
        }
        out.push_str("],\"overall\":");
        series_json(out, &self.overall, RING_SECONDS);
        if let Some(name) = tube {
            out.push_str(",\"tube\":");
            match self.tubes.get(name).and_then(|t| t.ring.as_ref()) {
                Some(r) => series_json(out, r, RING_SECONDS),
                None => out.push_str("null"),
            }
        }
        out.push('}');
    }

    /// The newest second as one event's JSON: `{"t": second, "scope": "node", "overall": [7
    /// figures], "tubes": {"name": [7 figures], ...}}` (the charted tubes; the figures in
    /// [`SERIES`] order, `null` where not known).
    pub fn event_json(&self, out: &mut String) {
        let scope = self.scope.as_str();
        let _ = write!(
            out,
            "{{\"t\":{},\"scope\":\"{scope}\",\"overall\":",
            self.second
        );
        values_json(out, &self.overall_now());
        out.push_str(",\"tubes\":{");
        let mut first = true;
        for (name, t) in &self.tubes {
            if t.ring.is_none() {
                continue;
            }
            if !first {
                out.push(',');
            }
            first = false;
            json_str(out, name);
            out.push(':');
            values_json(out, &t.now);
        }
        out.push_str("}}");
    }
}

impl TubeLive {
    fn with_ring(mut self, ring: Option<Ring>) -> Self {
        self.ring = ring;
        self
    }

    /// Sample `n` of a whole tube whose counters are `now` (`None`: not known). The counters
    /// are the last known ones' base only when known the sample before: after a gap the
    /// first second has levels, not rates (they would count the gap's seconds too).
    fn whole(&mut self, n: u64, now: Option<&Stats>) -> Sample {
        let Some(now) = now else {
            return Sample::GAP;
        };
        let c = Counters::from(now);
        let lower = self.since.is_some() && c.below(&self.last);
        if lower && self.dips < DIP_SECONDS {
            self.dips += 1;
            return Sample::GAP;
        }
        let mut s = Sample::between(&self.last, now);
        if lower || self.since.is_none_or(|at| at + 1 != n) {
            (s.put, s.take, s.ack) = (GAP, GAP, GAP);
        }
        (self.last, self.since, self.dips) = (c, Some(n), 0);
        s
    }
}

/// A figure as JSON: `null` when not known.
fn value_json(out: &mut String, v: u32) {
    match v {
        GAP => out.push_str("null"),
        v => {
            let _ = write!(out, "{v}");
        }
    }
}

fn values_json(out: &mut String, s: &Sample) {
    out.push('[');
    for (i, v) in s.values().iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        value_json(out, *v);
    }
    out.push(']');
}

/// `[[put...], [take...], ...]`: each series over the newest `n` seconds.
fn series_json(out: &mut String, ring: &Ring, n: usize) {
    out.push('[');
    for i in 0..SERIES.len() {
        if i > 0 {
            out.push(',');
        }
        out.push('[');
        for (j, s) in ring.last(n).enumerate() {
            if j > 0 {
                out.push(',');
            }
            value_json(out, s.values()[i]);
        }
        out.push(']');
    }
    out.push(']');
}

/// `s` as a JSON string literal.
pub fn json_str(out: &mut String, s: &str) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stats(puts: u64, ready: u64) -> Stats {
        Stats {
            puts,
            ready,
            ..Stats::default()
        }
    }

    #[test]
    fn rates_are_differences_and_the_ring_keeps_the_newest() {
        let mut l = Live::default();
        for i in 0..(RING_SECONDS as u64 + 10) {
            let s = stats(i * 3, i);
            l.sample(1000 + i, [(Some("a"), s), (None, s)].into_iter());
        }
        assert_eq!(
            l.overall_now().put,
            6,
            "the unnamed part counts in the whole"
        );
        assert_eq!(l.tube_now("a").unwrap().ready, RING_SECONDS as u32 + 9);
        let mut h = String::new();
        l.history_json(&mut h, Some("a"));
        let v: Vec<&str> = h.split("\"overall\":[[").collect();
        let puts = v[1].split(']').next().unwrap();
        assert_eq!(puts.split(',').count(), RING_SECONDS);
        assert!(h.starts_with("{\"end\":1909,"), "{h}");
        let mut e = String::new();
        l.event_json(&mut e);
        assert_eq!(
            e,
            format!("{{\"t\":1909,\"scope\":\"node\",\"overall\":[6,0,0,{1},0,0,0],\"tubes\":{{\"a\":[3,0,0,{0},0,0,0]}}}}", RING_SECONDS + 9, 2 * (RING_SECONDS + 9))
        );
    }

    #[test]
    fn a_gone_tube_is_forgotten_and_only_the_first_tubes_are_charted() {
        let mut l = Live::default();
        let names: Vec<String> = (0..MAX_CHARTED_TUBES + 5)
            .map(|i| format!("t{i}"))
            .collect();
        let s = Stats::default();
        l.sample(1, names.iter().map(|n| (Some(n.as_str()), s)));
        assert_eq!(l.charted, MAX_CHARTED_TUBES);
        l.sample(2, names[1..].iter().map(|n| (Some(n.as_str()), s)));
        assert!(l.tube_now("t0").is_none());
        assert_eq!(l.charted, MAX_CHARTED_TUBES - 1);
        let mut out = String::new();
        json_str(&mut out, "a\"b\\\n");
        assert_eq!(out, "\"a\\\"b\\\\\\u000a\"");
    }

    fn whole(puts: u64, ready: u64) -> Option<Stats> {
        Some(stats(puts, ready))
    }

    fn event(l: &Live) -> String {
        let mut e = String::new();
        l.event_json(&mut e);
        e
    }

    #[test]
    fn a_whole_tubes_unknown_second_is_a_gap_not_a_zero_nor_a_spike_after() {
        let mut l = Live::default();
        let mut second = 100;
        let mut step = |l: &mut Live, a: Option<Stats>| {
            second += 1;
            l.sample_whole(second, [("a", a), ("b", whole(0, 1))].into_iter());
        };
        // The first second: levels, no rates (nothing to take them from).
        step(&mut l, whole(1000, 5));
        let e = event(&l);
        assert!(
            e.starts_with("{\"t\":101,\"scope\":\"cluster\",\"overall\":[null,null,null,6,0,0,0],"),
            "{e}"
        );
        assert!(e.contains("\"a\":[null,null,null,5,0,0,0]"), "{e}");
        step(&mut l, whole(1010, 5));
        assert_eq!(l.tube_now("a").unwrap().put, 10);
        assert_eq!(l.overall_now().put, 10, "b's 0 puts add to a's");
        // An owner did not answer: a gap, and the first second back has no rates.
        step(&mut l, None);
        assert_eq!(l.tube_now("a").unwrap(), Sample::GAP);
        assert_eq!(l.overall_now().put, GAP);
        step(&mut l, whole(1030, 5));
        assert_eq!(
            l.tube_now("a").unwrap().put,
            GAP,
            "not the gap's 20 at once"
        );
        assert_eq!(l.tube_now("a").unwrap().ready, 5);
        step(&mut l, whole(1040, 5));
        assert_eq!(l.tube_now("a").unwrap().put, 10);
        // Counters that read lower (an old owner's answer): gaps, the base kept, so no spike
        // when they read right again.
        step(&mut l, whole(900, 5));
        assert_eq!(l.tube_now("a").unwrap(), Sample::GAP);
        step(&mut l, whole(1050, 5));
        assert_eq!(l.tube_now("a").unwrap().put, GAP);
        step(&mut l, whole(1060, 5));
        assert_eq!(l.tube_now("a").unwrap().put, 10);
        // Lower for longer than DIP_SECONDS: taken as they are.
        for _ in 0..DIP_SECONDS {
            step(&mut l, whole(10, 5));
            assert_eq!(l.tube_now("a").unwrap(), Sample::GAP);
        }
        step(&mut l, whole(10, 5));
        assert_eq!(l.tube_now("a").unwrap().ready, 5);
        step(&mut l, whole(13, 5));
        assert_eq!(l.tube_now("a").unwrap().put, 3);
        let mut h = String::new();
        l.history_json(&mut h, Some("a"));
        let n = l.samples();
        assert!(
            h.starts_with(&format!(
                "{{\"end\":{second},\"start\":{},\"step\":1,\"scope\":\"cluster\",",
                second + 1 - n
            )),
            "{h}"
        );
        assert!(h.contains("\"tube\":[[null,10,null,null,10,"), "{h}");
    }

    #[test]
    fn an_empty_history_has_no_start() {
        let mut h = String::new();
        Live::default().history_json(&mut h, None);
        assert!(
            h.starts_with("{\"end\":0,\"start\":null,\"step\":1,\"scope\":\"node\","),
            "{h}"
        );
    }
}
