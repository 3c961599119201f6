//! The console's live figures: a ring of per-second samples, overall and per tube, kept for
//! [`RING_SECONDS`], so a chart opened now is full at once instead of filling while it is
//! watched. The server calls [`Live::sample`] once a second with the engine's counters; this
//! file turns them into rates and levels and writes them as JSON (the history a page loads
//! first, and the one event a second the event stream sends). It knows figures only: which
//! connections listen is the server's, and the HTTP framing the front-end's.

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
        let rate = |a: u64, b: u64| u32::try_from(a.saturating_sub(b)).unwrap_or(u32::MAX);
        let level = |v: u64| u32::try_from(v).unwrap_or(u32::MAX);
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
            // Looked up by reference: a tube seen before costs no allocation a second.
            if !self.tubes.contains_key(name) {
                let ring = (self.charted < MAX_CHARTED_TUBES).then(Ring::default);
                self.charted += ring.is_some() as usize;
                let t = TubeLive {
                    last: Counters::from(&stats),
                    ..TubeLive::default()
                };
                self.tubes.insert(name.to_owned(), t.with_ring(ring));
            }
            let t = self.tubes.get_mut(name).expect("inserted above");
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

    /// The history as JSON: `{"end": second, "step": 1, "series": [...names],
    /// "overall": [[...], ...], "tube": [[...], ...]}`, each inner array one series over
    /// time, oldest first, ending at the second `end`; `tube` only when `tube` names a charted
    /// tube (`null` for one without a history).
    pub fn history_json(&self, out: &mut String, tube: Option<&str>) {
        let _ = write!(out, "{{\"end\":{},\"step\":1,\"series\":[", self.second);
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

    /// The newest second as one event's JSON: `{"t": second, "overall": [7 figures],
    /// "tubes": {"name": [7 figures], ...}}` (the charted tubes; the figures in [`SERIES`]
    /// order).
    pub fn event_json(&self, out: &mut String) {
        let _ = write!(out, "{{\"t\":{},\"overall\":", self.second);
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
}

fn values_json(out: &mut String, s: &Sample) {
    out.push('[');
    for (i, v) in s.values().iter().enumerate() {
        let _ = write!(out, "{}{v}", if i > 0 { "," } else { "" });
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
            let _ = write!(out, "{}{}", if j > 0 { "," } else { "" }, s.values()[i]);
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
            format!("{{\"t\":1909,\"overall\":[6,0,0,{1},0,0,0],\"tubes\":{{\"a\":[3,0,0,{0},0,0,0]}}}}", RING_SECONDS + 9, 2 * (RING_SECONDS + 9))
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
}
