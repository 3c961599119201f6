//! What the cluster page shows of a sharded cluster that no one node's map holds: this node's
//! links to the other replica sets (to whom, in what state since when, calls in flight,
//! drops), and every set's primary's moves — the one it runs now with its progress, and its
//! counts of those done — asked over the links (`Ask::Moves`) and kept for a second, as the
//! console's figures are (`console.rs`): a page reads what is there and never waits on other
//! nodes, so every move in flight anywhere shows on any node's page within a second or two.

use std::time::Duration;

use serde_json::{json, Value};

use super::ctx::Ctx;
use super::*;
use crate::core::MoveReport;

/// How old the sets' move reports may be before a page's read asks for new ones.
const FRESH: Duration = Duration::from_secs(1);

/// An ask whose answers were lost is asked again after this long.
const GIVE_UP: Duration = Duration::from_secs(5);

/// One set's answer: its primary's report, or why there is none.
type SetMoves = (String, Option<Result<MoveReport, String>>);

/// The sets' move reports and the ask that renews them.
#[derive(Default)]
pub(super) struct ClusterMoves {
    /// The last complete answers, and when they came.
    got: Option<(Instant, Vec<SetMoves>)>,
    /// The ask in flight: its key, when it began, the answers so far.
    asking: Option<(u64, Instant, Vec<SetMoves>)>,
}

impl Router {
    /// The cluster page's links and moves (`None` on a node that is no sharded cluster's):
    /// `links` now, `moves` as the sets' primaries last told them (asking again when more
    /// than a second old; `null` until the first answers).
    pub(crate) fn cluster_picture(&mut self, cx: &mut Ctx<'_>) -> Option<Value> {
        let now = Instant::now();
        // Read before this read's own ask is in flight.
        let links = self.links_json(cx.mono);
        let c = &self.cluster_moves;
        let stale = (c.got.as_ref()).is_none_or(|(at, _)| now.duration_since(*at) > FRESH);
        let asking =
            (c.asking.as_ref()).is_some_and(|(_, at, _)| now.duration_since(*at) < GIVE_UP);
        if stale && !asking {
            self.ask_moves(cx);
        }
        let moves = self.cluster_moves.got.as_ref().map(|(at, sets)| {
            let sets: Vec<Value> = sets.iter().map(set_moves_json).collect();
            let in_progress: Vec<Value> = (sets.iter())
                .filter(|s| !s["in_progress"].is_null())
                .map(|s| {
                    let mut m = s["in_progress"].clone();
                    m["from"] = s["set"].clone();
                    m
                })
                .collect();
            json!({
                "age_ms": now.duration_since(*at).as_millis() as u64,
                "in_progress": in_progress,
                "sets": sets,
            })
        });
        Some(json!({
            "links": links,
            "moves": moves.unwrap_or(Value::Null),
        }))
    }

    /// Asks every set's primary for its moves: this node's own when it leads its set.
    fn ask_moves(&mut self, cx: &mut Ctx<'_>) {
        let sid = match self.console_sid() {
            Some(sid) => sid,
            None => cx.new_session(),
        };
        let leads = cx.leads();
        let mine = self.move_report(cx.core.queue());
        self.set_console_sid(sid);
        let key = self.next_gather;
        self.next_gather += 1;
        let mut answers = Vec::new();
        let mut asks = Vec::new();
        for (i, s) in self.sets.iter().enumerate() {
            let answer = if s.name == self.set && leads {
                Some(Ok(mine.clone()))
            } else if s.primary.is_none() {
                Some(Err(format!("replica set {} has no primary now", s.name)))
            } else {
                asks.push((answers.len(), i));
                None
            };
            answers.push((s.name.clone(), answer));
        }
        self.cluster_moves.asking = Some((key, Instant::now(), answers));
        let client = Client::router(sid, key);
        for (at, set) in asks {
            self.send_ask(cx, set, client, &Ask::Moves, Then::Moves { key, at });
        }
        self.moves_answered(key, None, Outcome::Ok);
    }

    /// Set `at`'s primary answered ask `key` (`None`: look whether every set has).
    pub(super) fn moves_answered(&mut self, key: u64, at: Option<usize>, outcome: Outcome<'_>) {
        let c = &mut self.cluster_moves;
        let Some((_, _, answers)) = c.asking.as_mut().filter(|(k, _, _)| *k == key) else {
            return;
        };
        if let Some(a) = at.and_then(|at| answers.get_mut(at)) {
            a.1 = Some(match outcome {
                Outcome::Moves(m) => Ok(*m),
                Outcome::Error(e) => Err(e.to_string()),
                other => Err(format!("an answer that is no move report: {other:?}")),
            });
        }
        if answers.iter().all(|(_, a)| a.is_some()) {
            let (_, _, answers) = c.asking.take().expect("matched above");
            c.got = Some((Instant::now(), answers));
        }
    }

    /// This node's links to the other sets: to whom, in what state since when, the calls in
    /// flight on it and the drops counted.
    fn links_json(&self, mono: Micros) -> Value {
        let now = Instant::now();
        let links: Vec<Value> = (self.sets.iter().enumerate())
            .filter(|(_, s)| s.name != self.set)
            .map(|(i, s)| {
                let in_flight = self.pending.values().filter(|p| p.set == i).count();
                let (state, since) = link_state(s, mono, now);
                json!({
                    "set": s.name,
                    "primary": s.primary,
                    "state": state,
                    "for_ms": since,
                    "in_flight": in_flight,
                    "drops": s.trouble.total(),
                    "failing_drops": s.trouble.episode_drops(),
                })
            })
            .collect();
        Value::Array(links)
    }
}

/// A link's state — `up` (greeted, answering), `connecting`, `failing` (dropped, and not
/// answering again yet), `idle` (none open: one opens when a call needs it) — and for how
/// long, in ms, where that is known.
fn link_state(s: &SetSlot, mono: Micros, now: Instant) -> (&'static str, Option<u64>) {
    let failing = s
        .trouble
        .failing_since()
        .map(|t| now.duration_since(t).as_millis() as u64);
    match (&s.link, failing) {
        (_, Some(ms)) => ("failing", Some(ms)),
        (Some(l), None) => match l.greeted_at() {
            Some(at) => ("up", Some(mono.saturating_sub(at) / 1000)),
            None => (
                "connecting",
                Some(mono.saturating_sub(l.opened_at()) / 1000),
            ),
        },
        (None, None) => ("idle", None),
    }
}

/// One set's answer as the page shows it.
fn set_moves_json((set, answer): &SetMoves) -> Value {
    match answer {
        Some(Ok(r)) => {
            let mut v = serde_json::to_value(r).unwrap_or_default();
            v["set"] = json!(set);
            v["error"] = Value::Null;
            v
        }
        Some(Err(why)) => json!({ "set": set, "in_progress": null, "error": why }),
        None => json!({ "set": set, "in_progress": null, "error": "no answer" }),
    }
}
