//! The verdict over a history. A chaos run is only as good as its checker: faults that break
//! nothing visible prove nothing, so every rule here is one the queue promises (a task
//! acknowledged is delivered, a refused put is not, one consumer holds a task at a time, a
//! utube key's tasks come in put order, the nodes agree on what is left) stated over what
//! the clients *saw*: each operation is an interval from its invoke to its completion, and a
//! rule flags only what no order of the operations inside their intervals could explain. Where
//! the history cannot tell (an `info` put, a take still open when a node died), the checker
//! gives the queue the benefit of the doubt and counts the case instead, so a failure is
//! always a real bug (or a harness bug, which the first check names as such). Each failed
//! check lists up to [`MAX_EXAMPLES`] concrete cases with payloads, ids, times, processes,
//! sessions and nodes: enough to find the run's log lines.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt;

use serde::{Serialize, Serializer};
use serde_json::Value;

use crate::history::{Event, Kind, Protocol, F, HARNESS};

/// How many examples a failed check keeps; the count covers all of them.
pub const MAX_EXAMPLES: usize = 20;

/// The checks' names, as [`Check::name`] and the JSON report spell them.
pub const WELL_FORMED: &str = "history well-formed";
pub const LOST: &str = "lost";
pub const UNEXPECTED: &str = "delivered after a definite failure / never put";
pub const IDS_UNIQUE: &str = "ids unique";
pub const ONE_HOLDER: &str = "one holder at a time";
pub const AFTER_ACK: &str = "delivered after ack";
pub const UTUBE_ORDER: &str = "utube order";
pub const STATS_AGREE: &str = "statistics agree";
pub const AFTER_DROP: &str = "acknowledged after its tube's drop";

/// A check's outcome.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Status {
    Pass,
    Fail,
    /// The history holds nothing to check (no `stats` events): neither a pass nor a failure.
    NotRun,
}

/// The verdict: one entry per check, in a fixed order (well-formedness first: when the
/// history itself is broken, the other verdicts are suspect).
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub checks: Vec<Check>,
}

/// One check's verdict.
#[derive(Debug, Clone, Serialize)]
pub struct Check {
    pub name: &'static str,
    /// The rule, in one line.
    pub rule: &'static str,
    pub status: Status,
    /// How many cases broke the rule (all of them, not only the examples kept).
    pub violations: u64,
    /// What was looked at, in the order printed ("puts ok", "delivered", ...).
    #[serde(serialize_with = "as_map")]
    pub counts: Vec<(&'static str, u64)>,
    /// Up to [`MAX_EXAMPLES`] violations.
    pub examples: Vec<Example>,
    /// Why the check did not run, or what it could not see.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
}

/// One violation: what is wrong and the operations that show it.
#[derive(Debug, Clone, Serialize)]
pub struct Example {
    pub problem: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub payload: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tube: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub id: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub ops: Vec<OpView>,
}

/// An operation as an example shows it.
#[derive(Debug, Clone, Serialize)]
pub struct OpView {
    /// Its part in the example: "put", "first take", "ack", ...
    pub role: &'static str,
    pub f: F,
    pub process: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub session: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tube: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub id: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub payload: Option<String>,
    pub invoke_us: u64,
    /// `None`: never completed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub done_us: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub outcome: Option<Kind>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// Anything else the example needs: when and why a hold ended, per-node values, ...
    #[serde(skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
}

fn as_map<S: Serializer>(counts: &[(&'static str, u64)], s: S) -> Result<S::Ok, S::Error> {
    s.collect_map(counts.iter().map(|(k, v)| (k, v)))
}

impl Report {
    /// No check failed. A check that did not run is not a failure (it is printed as such).
    pub fn ok(&self) -> bool {
        self.checks.iter().all(|c| c.status != Status::Fail)
    }

    /// The check of that name (one of the constants above).
    pub fn get(&self, name: &str) -> Option<&Check> {
        self.checks.iter().find(|c| c.name == name)
    }

    /// The checks that failed.
    pub fn failed(&self) -> impl Iterator<Item = &Check> {
        self.checks.iter().filter(|c| c.status == Status::Fail)
    }
}

/// Checks a history: every rule in the module's list, each reported on its own.
pub fn check(events: &[Event]) -> Report {
    let h = History::parse(events);
    let ix = Index::build(&h);
    Report {
        checks: vec![
            h.well_formed.clone().finish(),
            check_lost(&h, &ix),
            check_unexpected(&h, &ix),
            check_ids_unique(&h, &ix),
            check_one_holder(&h, &ix),
            check_after_ack(&h, &ix),
            check_utube_order(&h, &ix),
            check_stats(&h),
            check_after_drop(&h, &ix),
        ],
    }
}

// ---------------------------------------------------------------------------------------------
// Building a check's verdict.

/// A check while it is being made: counts and the first examples.
#[derive(Debug, Clone)]
struct Verdict {
    name: &'static str,
    rule: &'static str,
    violations: u64,
    counts: Vec<(&'static str, u64)>,
    examples: Vec<Example>,
    note: Option<String>,
}

impl Verdict {
    fn new(name: &'static str, rule: &'static str) -> Verdict {
        Verdict {
            name,
            rule,
            violations: 0,
            counts: Vec::new(),
            examples: Vec::new(),
            note: None,
        }
    }

    fn count(&mut self, what: &'static str, n: usize) {
        self.counts.push((what, n as u64));
    }

    /// A violation; built only while examples are still kept, since building one costs.
    fn violation(&mut self, example: impl FnOnce() -> Example) {
        self.violations += 1;
        if self.examples.len() < MAX_EXAMPLES {
            self.examples.push(example());
        }
    }

    fn finish(self) -> Check {
        let status = if self.violations > 0 {
            Status::Fail
        } else {
            Status::Pass
        };
        self.finish_as(status)
    }

    fn finish_as(self, status: Status) -> Check {
        Check {
            name: self.name,
            rule: self.rule,
            status,
            violations: self.violations,
            counts: self.counts,
            examples: self.examples,
            note: self.note,
        }
    }
}

fn example(problem: String) -> Example {
    Example {
        problem,
        payload: None,
        tube: None,
        id: None,
        key: None,
        ops: Vec::new(),
    }
}

// ---------------------------------------------------------------------------------------------
// The history as operations.

/// One operation: its invoke and its completion (either may be missing in a broken history).
#[derive(Debug, Clone, Copy)]
struct Op<'a> {
    f: F,
    process: u64,
    /// The invoke's time; for a completion with no invoke, the process's previous event (the
    /// latest the operation can have begun, so every rule stays on the safe side).
    invoke_us: u64,
    inv: Option<&'a Event>,
    done: Option<&'a Event>,
}

impl<'a> Op<'a> {
    /// A field as the completion says it, else as the invoke did (a put's ok carries the id,
    /// its invoke the payload).
    fn pick<T>(&self, field: impl Fn(&'a Event) -> Option<T>) -> Option<T> {
        self.done
            .and_then(&field)
            .or_else(|| self.inv.and_then(&field))
    }
    fn payload(&self) -> Option<&'a str> {
        self.pick(|e| e.payload.as_deref())
    }
    fn tube(&self) -> Option<&'a str> {
        self.pick(|e| e.tube.as_deref())
    }
    fn key(&self) -> Option<&'a str> {
        self.pick(|e| e.key.as_deref())
    }
    fn id(&self) -> Option<u64> {
        self.pick(|e| e.id)
    }
    fn protocol(&self) -> Option<Protocol> {
        self.pick(|e| e.protocol)
    }
    /// The task this operation names, if it names one by id.
    fn task_key(&self) -> Option<TaskKey<'a>> {
        Some((self.tube().unwrap_or(""), self.protocol(), self.id()?))
    }
    fn session(&self) -> Option<u64> {
        self.pick(|e| e.session)
    }
    fn outcome(&self) -> Option<Kind> {
        self.done.map(|e| e.kind)
    }
    fn done_us(&self) -> Option<u64> {
        self.done.map(|e| e.time_us)
    }
    fn is(&self, f: F, kind: Kind) -> bool {
        self.f == f && self.outcome() == Some(kind)
    }
    /// What a take delivered: only an ok that carries a payload (an empty take delivers
    /// nothing).
    fn delivered(&self) -> Option<&'a str> {
        if self.is(F::Take, Kind::Ok) {
            self.done.and_then(|e| e.payload.as_deref())
        } else {
            None
        }
    }

    fn view(&self, role: &'static str) -> OpView {
        OpView {
            role,
            f: self.f,
            process: self.process,
            session: self.session(),
            node: self.pick(|e| e.node.clone()),
            tube: self.tube().map(str::to_owned),
            id: self.id(),
            payload: self.payload().map(str::to_owned),
            invoke_us: self.invoke_us,
            done_us: self.done_us(),
            outcome: self.outcome(),
            error: self.done.and_then(|e| e.error.clone()),
            note: None,
        }
    }
}

/// A fault: a nemesis invoke and its completion. The harness may run faults that overlap, so
/// they are paired by name rather than by process.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Fault<'a> {
    /// The invoke, or an orphan completion standing in for it.
    pub start: &'a Event,
    pub end: Option<&'a Event>,
}

impl Fault<'_> {
    /// The fault's name for a picture or a report: `value.name`, else `value.description`,
    /// else the value itself.
    pub fn label(&self) -> String {
        fault_label(
            self.start
                .value
                .as_ref()
                .or(self.end.and_then(|e| e.value.as_ref())),
        )
    }

    /// The harness marks a kill or restart `{"frees_holds": true}`: the tasks its node held
    /// are free again once it dies.
    pub fn frees_holds(&self) -> bool {
        let marked = |e: &Event| {
            e.value
                .as_ref()
                .and_then(|v| v.get("frees_holds"))
                .and_then(Value::as_bool)
                == Some(true)
        };
        marked(self.start) || self.end.is_some_and(marked)
    }
}

fn fault_label(value: Option<&Value>) -> String {
    let Some(v) = value else {
        return "fault".into();
    };
    for field in ["name", "description"] {
        if let Some(s) = v.get(field).and_then(Value::as_str) {
            return s.into();
        }
    }
    match v {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

/// Pairs the nemesis events into faults; a completion that matches no open fault, or a fault
/// never healed, is a harness problem, returned as a message.
pub(crate) fn faults(events: &[Event]) -> (Vec<Fault<'_>>, Vec<String>) {
    let mut faults: Vec<Fault<'_>> = Vec::new();
    let mut open: Vec<usize> = Vec::new();
    let mut problems = Vec::new();
    for e in events.iter().filter(|e| e.f == F::Nemesis) {
        if e.kind == Kind::Invoke {
            open.push(faults.len());
            faults.push(Fault {
                start: e,
                end: None,
            });
            continue;
        }
        // The open fault of the same name, else the oldest open one.
        let name = e.value.as_ref().map(|v| fault_label(Some(v)));
        let same = open
            .iter()
            .position(|&i| Some(faults[i].label()) == name)
            .or((!open.is_empty()).then_some(0));
        match same {
            Some(at) => faults[open.remove(at)].end = Some(e),
            None => {
                problems.push(format!(
                    "a nemesis {:?} at {} matches no fault begun",
                    e.kind,
                    secs(e.time_us)
                ));
                faults.push(Fault {
                    start: e,
                    end: Some(e),
                });
            }
        }
    }
    for &i in &open {
        problems.push(format!(
            "the fault {} begun at {} was never healed",
            faults[i].label(),
            secs(faults[i].start.time_us)
        ));
    }
    (faults, problems)
}

/// The history taken apart: client operations paired, the harness's observations set aside.
struct History<'a> {
    ops: Vec<Op<'a>>,
    faults: Vec<Fault<'a>>,
    /// Session -> the times of its `disconnect` events.
    disconnects: HashMap<u64, Vec<u64>>,
    leaders: Vec<&'a Event>,
    stats: Vec<&'a Event>,
    /// The well-formedness check, filled while pairing.
    well_formed: Verdict,
}

impl<'a> History<'a> {
    fn parse(events: &'a [Event]) -> History<'a> {
        let mut h = History {
            ops: Vec::new(),
            faults: Vec::new(),
            disconnects: HashMap::new(),
            leaders: Vec::new(),
            stats: Vec::new(),
            well_formed: Verdict::new(
                WELL_FORMED,
                "each invoke has exactly one completion from its process, which never has two \
                 operations open; payloads of puts are unique (a failure is a harness bug)",
            ),
        };
        let mut open: HashMap<u64, usize> = HashMap::new();
        let mut last_time: HashMap<u64, u64> = HashMap::new();
        let mut last_session: HashMap<u64, u64> = HashMap::new();
        for e in events {
            if let Some(s) = e.session {
                last_session.insert(e.process, s);
            }
            match e.f {
                // Faults are paired apart (they may overlap); see `faults`.
                F::Nemesis => {}
                // Observations, not operations: only their time and value matter.
                F::Leader | F::Stats if e.kind == Kind::Invoke => {}
                F::Leader => h.leaders.push(e),
                F::Stats => h.stats.push(e),
                F::Disconnect => {
                    // A disconnect without a session ends the one its process used last; one
                    // the server made may have ended the session from `since_us` on.
                    let since = (e.value.as_ref())
                        .and_then(|v| v.get("since_us"))
                        .and_then(Value::as_u64);
                    if let Some(s) = e.session.or(last_session.get(&e.process).copied()) {
                        let at = since.map_or(e.time_us, |t| t.min(e.time_us));
                        h.disconnects.entry(s).or_default().push(at);
                    }
                }
                _ if e.kind == Kind::Invoke => h.invoke(e, &mut open),
                _ => h.complete(e, &mut open, &last_time),
            }
            last_time.insert(e.process, e.time_us);
        }
        let mut still_open: Vec<usize> = open.into_values().collect();
        still_open.sort_unstable();
        for i in still_open {
            let op = h.ops[i];
            h.well_formed.violation(|| Example {
                ops: vec![op.view("never completed")],
                ..example(format!(
                    "process {} invoked {:?} at {} and never completed it",
                    op.process,
                    op.f,
                    secs(op.invoke_us)
                ))
            });
        }
        let (faults, problems) = faults(events);
        h.faults = faults;
        for p in problems {
            h.well_formed.violation(|| example(p));
        }
        h.duplicate_payloads();
        h.count();
        h
    }

    fn invoke(&mut self, e: &'a Event, open: &mut HashMap<u64, usize>) {
        if let Some(&before) = open.get(&e.process) {
            let prev = self.ops[before];
            self.well_formed.violation(|| Example {
                ops: vec![prev.view("still open")],
                ..example(format!(
                    "process {} invoked {:?} at {} while its {:?} of {} was still open",
                    e.process,
                    e.f,
                    secs(e.time_us),
                    prev.f,
                    secs(prev.invoke_us)
                ))
            });
        }
        open.insert(e.process, self.ops.len());
        self.ops.push(Op {
            f: e.f,
            process: e.process,
            invoke_us: e.time_us,
            inv: Some(e),
            done: None,
        });
    }

    fn complete(
        &mut self,
        e: &'a Event,
        open: &mut HashMap<u64, usize>,
        last_time: &HashMap<u64, u64>,
    ) {
        if let Some(&i) = open.get(&e.process) {
            if self.ops[i].f == e.f {
                open.remove(&e.process);
                self.ops[i].done = Some(e);
                return;
            }
        }
        // An orphan: kept as an operation (a delivery it reports still counts), begun at the
        // latest time it can have been invoked.
        let op = Op {
            f: e.f,
            process: e.process,
            invoke_us: last_time.get(&e.process).copied().unwrap_or(0),
            inv: None,
            done: Some(e),
        };
        let open_f = open.get(&e.process).map(|&i| self.ops[i].f);
        self.well_formed.violation(|| Example {
            ops: vec![op.view("orphan completion")],
            ..example(match open_f {
                Some(f) => format!(
                    "process {} completed {:?} at {} while its open operation is {f:?}",
                    e.process,
                    e.f,
                    secs(e.time_us)
                ),
                None => format!(
                    "process {} completed {:?} at {} with no invoke open",
                    e.process,
                    e.f,
                    secs(e.time_us)
                ),
            })
        });
        self.ops.push(op);
    }

    /// Tubes a drop removed, with the completion of the first drop seen to answer ok
    /// (`u64::MAX` for a tube only known gone: a later drop found it so, after one of unknown
    /// outcome).
    fn dropped_tubes(&self) -> HashMap<&'a str, u64> {
        let mut out: HashMap<&'a str, u64> = HashMap::new();
        for op in self.ops.iter().filter(|o| o.f == F::Drop) {
            let Some(tube) = op.tube() else { continue };
            let at = match (op.outcome(), op.done.and_then(|e| e.error.as_deref())) {
                (Some(Kind::Ok), _) => op.done_us().unwrap_or(u64::MAX),
                (Some(Kind::Fail), Some(e)) if e.contains(crate::drops::GONE) => u64::MAX,
                _ => continue,
            };
            let first = out.entry(tube).or_insert(at);
            *first = (*first).min(at);
        }
        out
    }

    /// Payloads name tasks: the harness makes each put's unique, and a duplicate would make
    /// every other check ambiguous.
    fn duplicate_payloads(&mut self) {
        let mut seen: HashMap<&str, Op<'a>> = HashMap::new();
        for op in self.ops.iter().filter(|o| o.f == F::Put) {
            let Some(p) = op.payload() else { continue };
            if let Some(first) = seen.get(p) {
                let (first, op) = (*first, *op);
                self.well_formed.violation(|| Example {
                    payload: Some(p.into()),
                    ops: vec![first.view("first put"), op.view("second put")],
                    ..example(format!("two puts of the payload {p:?}"))
                });
            } else {
                seen.insert(p, *op);
            }
        }
    }

    fn count(&mut self) {
        let open = self.ops.iter().filter(|o| o.done.is_none()).count();
        let orphans = self.ops.iter().filter(|o| o.inv.is_none()).count();
        let ops = self.ops.len();
        let faults = self.faults.len();
        let v = &mut self.well_formed;
        v.count("operations", ops);
        v.count("never completed", open);
        v.count("completions without invoke", orphans);
        v.count("faults", faults);
    }
}

// ---------------------------------------------------------------------------------------------
// Indexes shared by the checks.

/// A take that delivered a payload.
#[derive(Debug, Clone, Copy)]
struct Delivery<'a> {
    op: Op<'a>,
    payload: &'a str,
    ok_us: u64,
}

/// A task as the client names it: its tube (`""` when the operation named none) and id.
/// A task as an operation names it: (tube, port, id). Each port numbers tasks its own way (a
/// beanstalk job id is not the tube API's id of the same task), so ids are compared within a
/// port only; across ports the payload names the task.
type TaskKey<'a> = (&'a str, Option<Protocol>, u64);

struct Index<'a> {
    /// Payload -> its (first) put.
    puts: HashMap<&'a str, Op<'a>>,
    /// Payload -> its deliveries, by completion time.
    deliveries: HashMap<&'a str, Vec<Delivery<'a>>>,
    /// (tube, id) -> the first put ok that returned it.
    put_ids: HashMap<TaskKey<'a>, Op<'a>>,
    /// id -> the acks, releases and buries naming it (whatever their tube).
    by_id: HashMap<u64, Vec<Op<'a>>>,
    /// Payload -> the earliest invoke of a bury naming it.
    buried: HashMap<&'a str, u64>,
    /// Tubes a drop removed (`History::dropped_tubes`).
    dropped: HashMap<&'a str, u64>,
}

impl<'a> Index<'a> {
    fn build(h: &History<'a>) -> Index<'a> {
        let mut ix = Index {
            puts: HashMap::new(),
            deliveries: HashMap::new(),
            put_ids: HashMap::new(),
            by_id: HashMap::new(),
            buried: HashMap::new(),
            dropped: h.dropped_tubes(),
        };
        for op in &h.ops {
            match op.f {
                F::Put => ix.add_put(*op),
                F::Take => {
                    if let Some(payload) = op.delivered() {
                        let ok_us = op.done_us().unwrap_or(op.invoke_us);
                        ix.deliveries.entry(payload).or_default().push(Delivery {
                            op: *op,
                            payload,
                            ok_us,
                        });
                    }
                }
                F::Ack | F::Release | F::Bury => {
                    if let Some(id) = op.id() {
                        ix.by_id.entry(id).or_default().push(*op);
                    }
                }
                _ => {}
            }
        }
        // After the puts: a bury names its task by (tube, id), which the puts resolve.
        for op in h.ops.iter().filter(|o| o.f == F::Bury) {
            if let Some(p) = ix.payload_of(op) {
                let at = ix.buried.entry(p).or_insert(op.invoke_us);
                *at = (*at).min(op.invoke_us);
            }
        }
        for list in ix.deliveries.values_mut() {
            list.sort_by_key(|d| (d.ok_us, d.op.invoke_us));
        }
        ix
    }

    fn add_put(&mut self, op: Op<'a>) {
        if let Some(p) = op.payload() {
            self.puts.entry(p).or_insert(op);
        }
        if let (Some(Kind::Ok), Some(key)) = (op.outcome(), op.task_key()) {
            self.put_ids.entry(key).or_insert(op);
        }
    }

    fn delivered(&self, payload: &str) -> &[Delivery<'a>] {
        self.deliveries.get(payload).map_or(&[], Vec::as_slice)
    }

    /// The payload an ack, release or bury names: its own, else the one delivered or put
    /// under its (tube, id).
    fn payload_of(&self, op: &Op<'a>) -> Option<&'a str> {
        if let Some(p) = op.payload() {
            return Some(p);
        }
        self.put_ids
            .get(&op.task_key()?)
            .and_then(|put| put.payload())
    }
}

// ---------------------------------------------------------------------------------------------
// 1. lost

fn check_lost(h: &History<'_>, ix: &Index<'_>) -> Check {
    let mut v = Verdict::new(
        LOST,
        "every put that completed ok is delivered by some take (the final drain included)",
    );
    // A dropped tube's tasks go with it: its puts are the drop check's (`check_after_drop`).
    let dropped = &ix.dropped;
    let (puts_ok, into_dropped): (Vec<&Op<'_>>, Vec<&Op<'_>>) = (h.ops.iter())
        .filter(|o| o.is(F::Put, Kind::Ok))
        .partition(|o| o.tube().is_none_or(|t| !dropped.contains_key(t)));
    let mut delivered = 0;
    for put in &puts_ok {
        let payload = put.payload().unwrap_or_default();
        if !ix.delivered(payload).is_empty() {
            delivered += 1;
            continue;
        }
        v.violation(|| Example {
            payload: Some(payload.into()),
            tube: put.tube().map(str::to_owned),
            id: put.id(),
            key: put.key().map(str::to_owned),
            ops: vec![put.view("put")],
            ..example("put ok, never delivered".into())
        });
    }
    v.count("puts ok", puts_ok.len());
    v.count("delivered", delivered);
    v.count("lost", puts_ok.len() - delivered);
    v.count("puts ok into tubes since dropped", into_dropped.len());
    v.finish()
}

// ---------------------------------------------------------------------------------------------
// 2. delivered after a definite failure, or never put

fn check_unexpected(h: &History<'_>, ix: &Index<'_>) -> Check {
    let mut v = Verdict::new(
        UNEXPECTED,
        "nothing is delivered whose put failed, was never invoked, or was invoked after the \
         delivery; a put of unknown outcome may be delivered or not",
    );
    let mut payloads: Vec<&str> = ix.deliveries.keys().copied().collect();
    payloads.sort_unstable();
    for payload in payloads {
        let first = ix.delivered(payload)[0];
        let problem = match ix.puts.get(payload) {
            None => Some("delivered, never put".to_owned()),
            Some(put) if put.outcome() == Some(Kind::Fail) => Some(format!(
                "delivered although its put failed ({})",
                put.done
                    .and_then(|e| e.error.as_deref())
                    .unwrap_or("no error")
            )),
            Some(put) if put.invoke_us > first.ok_us => {
                Some("delivered before its put was invoked".to_owned())
            }
            Some(_) => None,
        };
        let Some(problem) = problem else { continue };
        v.violation(|| Example {
            payload: Some(payload.into()),
            tube: first.op.tube().map(str::to_owned),
            id: first.op.id(),
            ops: ix
                .puts
                .get(payload)
                .map(|p| p.view("put"))
                .into_iter()
                .chain(std::iter::once(first.op.view("first take")))
                .collect(),
            ..example(problem)
        });
    }
    let unknown: Vec<&Op<'_>> = h
        .ops
        .iter()
        .filter(|o| o.f == F::Put && matches!(o.outcome(), Some(Kind::Info) | None))
        .collect();
    let unknown_delivered = unknown
        .iter()
        .filter(|o| o.payload().is_some_and(|p| !ix.delivered(p).is_empty()))
        .count();
    v.count("payloads delivered", ix.deliveries.len());
    v.count("unknown puts delivered", unknown_delivered);
    v.count(
        "unknown puts not delivered",
        unknown.len() - unknown_delivered,
    );
    v.finish()
}

// ---------------------------------------------------------------------------------------------
// 3. ids unique

fn check_ids_unique(h: &History<'_>, ix: &Index<'_>) -> Check {
    let mut v = Verdict::new(
        IDS_UNIQUE,
        "no two payloads are put ok under one (tube, id), and a take of (tube, id) delivers \
         the payload put ok under it",
    );
    for put in h.ops.iter().filter(|o| o.is(F::Put, Kind::Ok)) {
        let (Some(id), Some(key)) = (put.id(), put.task_key()) else {
            continue;
        };
        let first = ix.put_ids[&key];
        if first.payload() != put.payload() {
            v.violation(|| Example {
                tube: put.tube().map(str::to_owned),
                id: Some(id),
                ops: vec![first.view("first put"), put.view("second put")],
                ..example(format!(
                    "two payloads put ok under one id: {:?} and {:?}",
                    first.payload().unwrap_or_default(),
                    put.payload().unwrap_or_default()
                ))
            });
        }
    }
    let mut takes = 0;
    for d in ix.deliveries.values().flatten() {
        let (Some(id), Some(key)) = (d.op.id(), d.op.task_key()) else {
            continue;
        };
        takes += 1;
        let Some(put) = ix.put_ids.get(&key) else {
            continue;
        };
        if put.payload() != Some(d.payload) {
            v.violation(|| Example {
                payload: Some(d.payload.into()),
                tube: d.op.tube().map(str::to_owned),
                id: Some(id),
                ops: vec![put.view("put"), d.op.view("take")],
                ..example(format!(
                    "a take of this id delivered {:?}, but the put ok that returned it had {:?}",
                    d.payload,
                    put.payload().unwrap_or_default()
                ))
            });
        }
    }
    v.count("ids put ok", ix.put_ids.len());
    v.count("takes with an id", takes);
    v.finish()
}

// ---------------------------------------------------------------------------------------------
// 4. one holder at a time

/// When a hold may have ended, at the earliest, and what ended it.
#[derive(Debug, Clone)]
struct HoldEnd {
    at_us: u64,
    by: String,
}

impl HoldEnd {
    fn never() -> HoldEnd {
        HoldEnd {
            at_us: u64::MAX,
            by: "nothing in the history".into(),
        }
    }

    fn earlier(self, at_us: u64, by: impl FnOnce() -> String) -> HoldEnd {
        if at_us < self.at_us {
            HoldEnd { at_us, by: by() }
        } else {
            self
        }
    }
}

/// What frees every hold, whoever has it: new primaries and faults marked `frees_holds`.
struct Freers {
    /// (seen, since, description) of each leader event that raised its set's term, by the
    /// time it was seen: the term began between `since` and then.
    new_terms: Vec<(u64, u64, String)>,
    /// (from, to, label): a marked fault may have struck anywhere in its interval.
    faults: Vec<(u64, u64, String)>,
}

impl Freers {
    fn build(h: &History<'_>) -> Freers {
        let mut max_term: HashMap<String, u64> = HashMap::new();
        let mut new_terms = Vec::new();
        for e in &h.leaders {
            let value = e.value.as_ref();
            let set = value.and_then(|v| v.get("set")).map_or(String::new(), |s| {
                s.as_str().map_or_else(|| s.to_string(), str::to_owned)
            });
            let term = value.and_then(|v| v.get("term")).and_then(Value::as_u64);
            // A leader seen again in its term changes nothing; a term the event does not give
            // is taken as new (the safe side).
            if let Some(t) = term {
                if max_term.get(&set).is_some_and(|&m| t <= m) {
                    continue;
                }
                max_term.insert(set.clone(), t);
            }
            let node = e.node.as_deref().unwrap_or("?");
            let term = term.map_or("?".into(), |t| t.to_string());
            let set = if set.is_empty() {
                String::new()
            } else {
                format!(" of set {set}")
            };
            // Histories before the watcher said since when take the time seen.
            let since = (value
                .and_then(|v| v.get("since_us"))
                .and_then(Value::as_u64))
            .map_or(e.time_us, |s| s.min(e.time_us));
            let what = format!("leader {node}{set} in term {term}");
            new_terms.push((e.time_us, since, what));
        }
        new_terms.sort_by_key(|t| t.0);
        let faults = h
            .faults
            .iter()
            .filter(|f| f.frees_holds())
            .map(|f| {
                let to = f.end.map_or(u64::MAX, |e| e.time_us);
                (f.start.time_us, to, f.label())
            })
            .collect();
        Freers { new_terms, faults }
    }

    /// The earliest moment one of them may have freed a hold taken by a take invoked at
    /// `invoked_us`.
    fn end(&self, invoked_us: u64, mut end: HoldEnd) -> HoldEnd {
        let i = self.new_terms.partition_point(|t| t.0 < invoked_us);
        // The first term seen after the invoke began earliest (each began after the round
        // before the one that saw it), as late as the invoke: a term seen earlier began
        // before the take.
        if let Some((_, since, what)) = self.new_terms.get(i) {
            let at = (*since).max(invoked_us);
            end = end.earlier(at, || format!("a new primary: {what}"));
        }
        for (from, to, label) in &self.faults {
            if *to >= invoked_us {
                end = end.earlier((*from).max(invoked_us), || format!("the fault {label}"));
            }
        }
        end
    }
}

/// The earliest moment the hold a delivery began may have ended: the holder's first ack,
/// release or bury of the task invoked after the take (whatever its outcome), its session's
/// end, the take's invoke plus the task's ttr, a new primary of any set seen after the take
/// was invoked, or a fault marked `frees_holds` that may have struck after it was invoked.
/// Every bound is taken from the take's invoke, not its ok: the server may have handed the
/// task out at any moment in between.
fn hold_end(d: &Delivery<'_>, h: &History<'_>, ix: &Index<'_>, freers: &Freers) -> HoldEnd {
    let take = &d.op;
    let mut end = HoldEnd::never();
    if let Some(id) = take.id() {
        let own = ix.by_id.get(&id).into_iter().flatten().filter(|op| {
            same_holder(op, take)
                && op.invoke_us >= d.ok_us
                && same_tube(op.tube(), take.tube())
                && op.payload().is_none_or(|p| p == d.payload)
        });
        for op in own {
            end = end.earlier(op.invoke_us, || format!("its {:?} by the holder", op.f));
        }
    }
    if let Some(s) = take.session() {
        let gone = h.disconnects.get(&s).into_iter().flatten();
        for &at in gone.filter(|&&at| at >= take.invoke_us) {
            end = end.earlier(at, || format!("session {s} disconnected"));
        }
    }
    if let Some(ttr) = take.pick(|e| e.ttr_ms) {
        let at = take.invoke_us.saturating_add(ttr.saturating_mul(1000));
        end = end.earlier(at, || format!("ttr {ttr} ms from the take's invoke"));
    }
    freers.end(take.invoke_us, end)
}

/// The holder is the session (the server's view); without sessions, the process.
fn same_holder(op: &Op<'_>, take: &Op<'_>) -> bool {
    match (op.session(), take.session()) {
        (Some(a), Some(b)) => a == b,
        _ => op.process == take.process,
    }
}

/// Tubes match unless both are named and differ (a beanstalk op may name none).
fn same_tube(a: Option<&str>, b: Option<&str>) -> bool {
    a.zip(b).is_none_or(|(a, b)| a == b)
}

fn check_one_holder(h: &History<'_>, ix: &Index<'_>) -> Check {
    let mut v = Verdict::new(
        ONE_HOLDER,
        "a task is delivered again only once the earlier hold may have ended (holder's \
         ack/release/bury invoked, its session ended, ttr, a new primary, a fault that frees \
         holds)",
    );
    let freers = Freers::build(h);
    let mut redelivered = 0;
    let mut payloads: Vec<&&str> = ix.deliveries.keys().collect();
    payloads.sort_unstable();
    for payload in payloads {
        let ds = ix.delivered(payload);
        if ds.len() < 2 {
            continue;
        }
        redelivered += 1;
        let ends: Vec<HoldEnd> = ds.iter().map(|d| hold_end(d, h, ix, &freers)).collect();
        for i in 0..ds.len() {
            for j in i + 1..ds.len() {
                // Both takes in either order would overlap their holds: the one ordered
                // first still held the task when the other completed. For takes that do not
                // overlap (j invoked after i's ok), the second condition always holds.
                if ends[i].at_us > ds[j].ok_us && ends[j].at_us > ds[i].ok_us {
                    v.violation(|| double_hold(&ds[i], &ds[j], &ends[i]));
                }
            }
        }
    }
    v.count("payloads delivered", ix.deliveries.len());
    v.count("delivered more than once", redelivered);
    v.count("new primaries seen", freers.new_terms.len());
    v.count("faults that free holds", freers.faults.len());
    v.note = Some(
        "a new term of any replica set frees every hold: the checker does not know which set \
         holds a task"
            .into(),
    );
    v.finish()
}

fn double_hold(first: &Delivery<'_>, second: &Delivery<'_>, end: &HoldEnd) -> Example {
    let mut held = first.op.view("first take");
    held.note = Some(if end.at_us == u64::MAX {
        format!("hold not ended by {}", secs(second.ok_us))
    } else {
        format!("hold may end at {} ({})", secs(end.at_us), end.by)
    });
    let overlap = if second.op.invoke_us > first.ok_us {
        ""
    } else {
        " (the takes overlapped, and held it together in either order)"
    };
    Example {
        payload: Some(first.payload.into()),
        tube: first.op.tube().map(str::to_owned),
        id: first.op.id(),
        ops: vec![held, second.op.view("second take")],
        ..example(format!(
            "held by two at once: taken again at {} while the hold taken at {} lasted{overlap}",
            secs(second.ok_us),
            secs(first.ok_us)
        ))
    }
}

// ---------------------------------------------------------------------------------------------
// 5. delivered after ack

fn check_after_ack(h: &History<'_>, ix: &Index<'_>) -> Check {
    let mut v = Verdict::new(
        AFTER_ACK,
        "no take invoked after an ack of the task completed ok delivers it",
    );
    let acks: Vec<&Op<'_>> = h.ops.iter().filter(|o| o.is(F::Ack, Kind::Ok)).collect();
    let mut unnamed = 0;
    for ack in &acks {
        let Some(payload) = ix.payload_of(ack) else {
            unnamed += 1;
            continue;
        };
        let acked_us = ack.done_us().unwrap_or(u64::MAX);
        for d in ix.delivered(payload) {
            if d.op.invoke_us > acked_us {
                v.violation(|| Example {
                    payload: Some(payload.into()),
                    tube: d.op.tube().map(str::to_owned),
                    id: d.op.id(),
                    ops: vec![ack.view("ack"), d.op.view("take after it")],
                    ..example(format!(
                        "acked ok at {}, delivered again at {}",
                        secs(acked_us),
                        secs(d.ok_us)
                    ))
                });
            }
        }
    }
    v.count("acks ok", acks.len());
    v.count("acks naming no known task", unnamed);
    v.finish()
}

// ---------------------------------------------------------------------------------------------
// 6. utube order

/// A keyed put with what the check needs: when it was put, and its first delivery's bounds.
#[derive(Debug, Clone, Copy)]
struct Keyed<'a> {
    put: Op<'a>,
    payload: &'a str,
    /// The earliest invoke of a take that delivered it: it was not delivered before.
    first_take_invoked: u64,
    /// The earliest ok of a take that delivered it: it was delivered by then.
    first_take_ok: u64,
    first: Delivery<'a>,
    /// The earliest bury of it invoked: a buried task no longer blocks its key.
    buried_us: u64,
}

fn check_utube_order(h: &History<'_>, ix: &Index<'_>) -> Check {
    let mut v = Verdict::new(
        UTUBE_ORDER,
        "of two tasks of one utube key, where A's put completed ok before B's was invoked, B is \
         not delivered before A (unless A was buried first); each such B counts once",
    );
    let mut groups: BTreeMap<(&str, &str), Vec<Keyed<'_>>> = BTreeMap::new();
    let mut keyed = 0;
    for put in h.ops.iter().filter(|o| o.f == F::Put) {
        let (Some(key), Some(payload)) = (put.key(), put.payload()) else {
            continue;
        };
        keyed += 1;
        let Some(k) = keyed_delivery(*put, payload, ix) else {
            continue;
        };
        let tube = put.tube().unwrap_or("");
        groups.entry((tube, key)).or_default().push(k);
    }
    for ((_, key), tasks) in &groups {
        utube_group(key, tasks, &mut v);
    }
    v.count("keyed puts", keyed);
    v.count("keys", groups.len());
    v.finish()
}

fn keyed_delivery<'a>(put: Op<'a>, payload: &'a str, ix: &Index<'a>) -> Option<Keyed<'a>> {
    let ds = ix.delivered(payload);
    let first = *ds.first()?;
    let buried_us = ix.buried.get(payload).copied().unwrap_or(u64::MAX);
    Some(Keyed {
        put,
        payload,
        first_take_invoked: ds.iter().map(|d| d.op.invoke_us).min()?,
        first_take_ok: first.ok_us,
        first,
        buried_us,
    })
}

/// One key's delivered tasks: each B whose first delivery completed before any take was
/// invoked of some A put ok before B's put was invoked (and not buried by then). One pass
/// over the A's in put order keeps the one that blocks the longest, so a key of many tasks
/// costs n log n; each B counts once, shown with that A.
fn utube_group(key: &str, tasks: &[Keyed<'_>], v: &mut Verdict) {
    // A blocks its key while it is neither taken nor buried: up to its first take's invoke,
    // or up to and including its first bury's invoke.
    let blocks_until = |a: &Keyed<'_>| a.first_take_invoked.min(a.buried_us.saturating_add(1));
    let mut put_ok: Vec<(u64, usize)> = tasks
        .iter()
        .enumerate()
        .filter(|(_, a)| a.put.outcome() == Some(Kind::Ok))
        .filter_map(|(i, a)| Some((a.put.done_us()?, i)))
        .collect();
    put_ok.sort_unstable();
    // longest[n]: of the first n + 1 A's put ok, the one that blocks the longest.
    let mut longest: Vec<usize> = Vec::with_capacity(put_ok.len());
    for &(_, i) in &put_ok {
        let keep = match longest.last() {
            Some(&j) if blocks_until(&tasks[j]) >= blocks_until(&tasks[i]) => j,
            _ => i,
        };
        longest.push(keep);
    }
    let mut by_put: Vec<usize> = (0..tasks.len()).collect();
    by_put.sort_by_key(|&i| tasks[i].put.invoke_us);
    for b in by_put.into_iter().map(|i| &tasks[i]) {
        let n = put_ok.partition_point(|&(ok, _)| ok < b.put.invoke_us);
        let Some(&a) = n.checked_sub(1).map(|m| &longest[m]) else {
            continue;
        };
        let a = &tasks[a];
        if b.first_take_ok < blocks_until(a) {
            v.violation(|| utube_example(key, a, b));
        }
    }
}

fn utube_example(key: &str, a: &Keyed<'_>, b: &Keyed<'_>) -> Example {
    Example {
        payload: Some(b.payload.into()),
        tube: b.put.tube().map(str::to_owned),
        key: Some(key.into()),
        ops: vec![
            a.put.view("put A"),
            b.put.view("put B"),
            b.first.op.view("B delivered"),
            a.first.op.view("A delivered"),
        ],
        ..example(format!(
            "{:?} (put after {:?} was put ok) delivered at {}, before any take of {:?} \
             (first invoked at {})",
            b.payload,
            a.payload,
            secs(b.first_take_ok),
            a.payload,
            secs(a.first_take_invoked)
        ))
    }
}

// ---------------------------------------------------------------------------------------------
// 7. statistics agree

/// A node's task counters: tube -> counter -> value.
type TaskCounts = BTreeMap<String, BTreeMap<String, Value>>;

fn check_stats(h: &History<'_>) -> Check {
    let mut v = Verdict::new(
        STATS_AGREE,
        "every node's final statistics give the same task counts (`tasks`) for every tube; \
         call counters and `tasks.done` (acks a node saw since it started) may differ",
    );
    // A node's last stats event is its final word.
    let mut nodes: BTreeMap<&str, TaskCounts> = BTreeMap::new();
    for e in &h.stats {
        let node = e.node.as_deref().unwrap_or("?");
        nodes.insert(node, task_counts(e.value.as_ref()));
    }
    v.count("nodes", nodes.len());
    if nodes.is_empty() {
        v.note = Some("no stats events in the history".into());
        return v.finish_as(Status::NotRun);
    }
    let tubes: BTreeSet<&String> = nodes.values().flat_map(BTreeMap::keys).collect();
    let mut compared = 0;
    for tube in &tubes {
        let counters: BTreeSet<&String> = nodes
            .values()
            .filter_map(|t| t.get(*tube))
            .flat_map(BTreeMap::keys)
            .collect();
        for counter in counters {
            compared += 1;
            let values: Vec<(&str, Option<&Value>)> = nodes
                .iter()
                .map(|(n, t)| (*n, t.get(*tube).and_then(|c| c.get(counter))))
                .collect();
            if values.windows(2).any(|w| w[0].1 != w[1].1) {
                v.violation(|| stats_example(tube, counter, &values));
            }
        }
    }
    v.count("tubes", tubes.len());
    v.count("counters compared", compared);
    if nodes.len() == 1 {
        v.note = Some("one node reported: nothing to compare".into());
    }
    v.finish()
}

/// The `tasks` counters of each tube, whether nested (`{"tasks": {"ready": 1}}`) or flat
/// (`{"tasks.ready": 1}`), as dotted names below `tasks`.
fn task_counts(value: Option<&Value>) -> TaskCounts {
    let mut out = TaskCounts::new();
    let Some(Value::Object(tubes)) = value else {
        return out;
    };
    for (tube, counters) in tubes {
        let mut flat = BTreeMap::new();
        flatten("", counters, &mut flat);
        let tasks: BTreeMap<String, Value> = flat
            .into_iter()
            .filter_map(|(k, v)| Some((k.strip_prefix("tasks.")?.to_owned(), v)))
            // A count of acks since the node started, not of tasks it holds: a node restarted
            // or joined later counts fewer, as tarantool/queue's does.
            .filter(|(k, _)| k != "done")
            .collect();
        out.insert(tube.clone(), tasks);
    }
    out
}

fn flatten(prefix: &str, value: &Value, out: &mut BTreeMap<String, Value>) {
    match value {
        Value::Object(map) => {
            for (k, v) in map {
                let name = if prefix.is_empty() {
                    k.clone()
                } else {
                    format!("{prefix}.{k}")
                };
                flatten(&name, v, out);
            }
        }
        other => {
            out.insert(prefix.to_owned(), other.clone());
        }
    }
}

fn stats_example(tube: &str, counter: &str, values: &[(&str, Option<&Value>)]) -> Example {
    let per_node: Vec<String> = values
        .iter()
        .map(|(n, v)| format!("{n}={}", v.map_or("absent".into(), Value::to_string)))
        .collect();
    Example {
        tube: Some(tube.into()),
        ..example(format!("tasks.{counter} differs: {}", per_node.join(", ")))
    }
}

// ---------------------------------------------------------------------------------------------
// 9. nothing acknowledged after a drop answered

fn check_after_drop(h: &History<'_>, ix: &Index<'_>) -> Check {
    let mut v = Verdict::new(
        AFTER_DROP,
        "no put invoked after its tube's drop answered ok is itself answered ok: a drop takes \
         with it only what was acknowledged before it answered",
    );
    let dropped = &ix.dropped;
    let drops_ok = (dropped.values()).filter(|&&at| at != u64::MAX).count();
    let (mut racing, mut after) = (0, 0);
    for put in h.ops.iter().filter(|o| o.f == F::Put) {
        let Some(&at) = put.tube().and_then(|t| dropped.get(t)) else {
            continue;
        };
        if put.invoke_us <= at {
            racing += 1;
            continue;
        }
        after += 1;
        if put.outcome() == Some(Kind::Ok) {
            v.violation(|| {
                let drop = h.ops.iter().find(|o| {
                    o.f == F::Drop && o.tube() == put.tube() && o.outcome() == Some(Kind::Ok)
                });
                Example {
                    payload: put.payload().map(str::to_owned),
                    tube: put.tube().map(str::to_owned),
                    id: put.id(),
                    ops: drop
                        .map(|d| d.view("drop"))
                        .into_iter()
                        .chain([put.view("put")])
                        .collect(),
                    ..example(format!(
                        "put invoked at {} into a tube dropped at {}, answered ok",
                        secs(put.invoke_us),
                        secs(at)
                    ))
                }
            });
        }
    }
    v.count("tubes dropped", dropped.len());
    v.count("drops ok", drops_ok);
    v.count("puts invoked before or during a drop", racing);
    v.count("puts invoked after a drop answered", after);
    if dropped.is_empty() {
        v.note = Some("no tube was dropped".into());
    }
    v.finish()
}

// ---------------------------------------------------------------------------------------------
// Printing.

/// µs as seconds since the start, to the µs: the history's own resolution.
fn secs(us: u64) -> String {
    if us == u64::MAX {
        return "never".into();
    }
    format!("{}.{:06}s", us / 1_000_000, us % 1_000_000)
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let failed = self.failed().count();
        if failed == 0 {
            writeln!(f, "verdict: PASS ({} checks)", self.checks.len())?;
        } else {
            writeln!(
                f,
                "verdict: FAIL ({failed} of {} checks failed)",
                self.checks.len()
            )?;
        }
        for c in &self.checks {
            write!(f, "{c}")?;
        }
        Ok(())
    }
}

impl fmt::Display for Check {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let status = match self.status {
            Status::Pass => "pass",
            Status::Fail => "FAIL",
            Status::NotRun => "not run",
        };
        let counts: Vec<String> = self
            .counts
            .iter()
            .map(|(k, v)| format!("{k} {v}"))
            .collect();
        writeln!(f, "[{status}] {}: {}", self.name, counts.join(", "))?;
        if self.status == Status::Fail {
            writeln!(f, "    rule: {}", self.rule)?;
            writeln!(
                f,
                "    {} violations, {} shown",
                self.violations,
                self.examples.len()
            )?;
        }
        if let Some(note) = &self.note {
            writeln!(f, "    note: {note}")?;
        }
        for e in &self.examples {
            write!(f, "{e}")?;
        }
        Ok(())
    }
}

impl fmt::Display for Example {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "  - {}", self.problem)?;
        if let Some(p) = &self.payload {
            write!(f, "; payload {p:?}")?;
        }
        if let Some(t) = &self.tube {
            write!(f, "; tube {t}")?;
        }
        if let Some(id) = self.id {
            write!(f, "; id {id}")?;
        }
        if let Some(k) = &self.key {
            write!(f, "; key {k:?}")?;
        }
        writeln!(f)?;
        for op in &self.ops {
            writeln!(f, "      {op}")?;
        }
        Ok(())
    }
}

impl fmt::Display for OpView {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {:?}", self.role, self.f)?;
        if self.process == HARNESS {
            write!(f, " by the harness")?;
        } else {
            write!(f, " by process {}", self.process)?;
        }
        if let Some(s) = self.session {
            write!(f, " session {s}")?;
        }
        if let Some(n) = &self.node {
            write!(f, " on {n}")?;
        }
        if let Some(id) = self.id {
            write!(f, " id {id}")?;
        }
        write!(f, ", invoked {}", secs(self.invoke_us))?;
        match (self.outcome, self.done_us) {
            (Some(k), Some(t)) => write!(f, ", {k:?} at {}", secs(t))?,
            _ => write!(f, ", never completed")?,
        }
        if let Some(e) = &self.error {
            write!(f, " ({e})")?;
        }
        if let Some(n) = &self.note {
            write!(f, "; {n}")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// A hand-built history: each helper appends an operation's events at the times given.
    #[derive(Default)]
    struct Hist {
        events: Vec<Event>,
    }

    fn ev(t: u64, p: u64, kind: Kind, f: F) -> Event {
        let mut e = Event::new(t, p, kind, f);
        e.tube = Some("q".into());
        e
    }

    impl Hist {
        fn put(&mut self, p: u64, (t0, t1): (u64, u64), payload: &str, out: Kind, id: u64) {
            self.keyed_put(p, (t0, t1), payload, None, out, id);
        }

        fn keyed_put(
            &mut self,
            p: u64,
            (t0, t1): (u64, u64),
            payload: &str,
            key: Option<&str>,
            out: Kind,
            id: u64,
        ) {
            let mut i = ev(t0, p, Kind::Invoke, F::Put);
            i.payload = Some(payload.into());
            i.key = key.map(Into::into);
            let mut d = ev(t1, p, out, F::Put);
            if out == Kind::Ok {
                d.id = Some(id);
            }
            if out == Kind::Fail {
                d.error = Some("READ_ONLY".into());
            }
            self.events.extend([i, d]);
        }

        /// A take by process `p` in session `s` that delivered `(payload, id)`, if any.
        fn take(&mut self, p: u64, s: u64, (t0, t1): (u64, u64), got: Option<(&str, u64)>) {
            self.take_ttr(p, s, (t0, t1), got, None);
        }

        fn take_ttr(
            &mut self,
            p: u64,
            s: u64,
            (t0, t1): (u64, u64),
            got: Option<(&str, u64)>,
            ttr_ms: Option<u64>,
        ) {
            let mut i = ev(t0, p, Kind::Invoke, F::Take);
            i.session = Some(s);
            i.node = Some("n1".into());
            let mut d = ev(t1, p, Kind::Ok, F::Take);
            if let Some((payload, id)) = got {
                d.payload = Some(payload.into());
                d.id = Some(id);
                d.ttr_ms = ttr_ms;
            }
            self.events.extend([i, d]);
        }

        /// An ack, release or bury of `id` by process `p` in session `s`.
        fn op(&mut self, p: u64, s: u64, f: F, (t0, t1): (u64, u64), id: u64, out: Kind) {
            let mut i = ev(t0, p, Kind::Invoke, f);
            i.session = Some(s);
            i.id = Some(id);
            self.events.extend([i, ev(t1, p, out, f)]);
        }

        fn disconnect(&mut self, p: u64, s: u64, t: u64) {
            let mut e = ev(t, p, Kind::Info, F::Disconnect);
            e.session = Some(s);
            self.events.push(e);
        }

        /// A connection the server closed at some moment after `since`, seen at `t`.
        fn closed_by_server(&mut self, p: u64, s: u64, since: u64, t: u64) {
            let mut e = ev(t, p, Kind::Info, F::Disconnect);
            e.session = Some(s);
            e.value = Some(json!({ "since_us": since }));
            self.events.push(e);
        }

        fn leader(&mut self, t: u64, node: &str, term: u64) {
            let mut e = Event::new(t, HARNESS, Kind::Info, F::Leader);
            e.node = Some(node.into());
            e.value = Some(json!({ "term": term }));
            self.events.push(e);
        }

        /// A leader seen at `t` whose term may have begun from `since` on.
        fn leader_since(&mut self, (since, t): (u64, u64), node: &str, term: u64) {
            let mut e = Event::new(t, HARNESS, Kind::Info, F::Leader);
            e.node = Some(node.into());
            e.value = Some(json!({ "term": term, "since_us": since }));
            self.events.push(e);
        }

        fn nemesis(&mut self, (t0, t1): (u64, u64), value: Value) {
            let mut i = Event::new(t0, HARNESS, Kind::Invoke, F::Nemesis);
            i.value = Some(value.clone());
            let mut d = Event::new(t1, HARNESS, Kind::Ok, F::Nemesis);
            d.value = Some(value);
            self.events.extend([i, d]);
        }

        fn stats(&mut self, t: u64, node: &str, value: Value) {
            let mut e = Event::new(t, HARNESS, Kind::Ok, F::Stats);
            e.node = Some(node.into());
            e.value = Some(value);
            self.events.push(e);
        }

        fn check(&self) -> Report {
            check(&self.events)
        }

        /// An operation of process `p` on tube `tube` (a put of `payload`, or a drop), with
        /// how it came out and the error a fail says.
        fn on_tube(
            &mut self,
            p: u64,
            f: F,
            (t0, t1): (u64, u64),
            tube: &str,
            payload: Option<&str>,
            (out, error): (Kind, Option<&str>),
        ) {
            let mut i = ev(t0, p, Kind::Invoke, f);
            i.tube = Some(tube.into());
            i.payload = payload.map(Into::into);
            let mut d = i.clone();
            d.time_us = t1;
            d.kind = out;
            d.error = error.map(Into::into);
            self.events.extend([i, d]);
        }
    }

    fn status(r: &Report, name: &str) -> Status {
        r.get(name).unwrap().status
    }

    fn count(r: &Report, name: &str, what: &str) -> u64 {
        let c = r.get(name).unwrap();
        c.counts.iter().find(|(k, _)| *k == what).unwrap().1
    }

    /// Only the named check failed, with these many violations.
    fn only_fails(r: &Report, name: &str, violations: u64) {
        for c in &r.checks {
            if c.name == name {
                assert_eq!(c.status, Status::Fail, "{r}");
                assert_eq!(c.violations, violations, "{r}");
                assert!(!c.examples.is_empty());
            } else {
                assert_ne!(c.status, Status::Fail, "{} failed too:\n{r}", c.name);
            }
        }
        assert!(!r.ok());
    }

    /// put a, take a by process 2, ack it.
    fn put_take_ack() -> Hist {
        let mut h = Hist::default();
        h.put(1, (10, 20), "a", Kind::Ok, 1);
        h.take(2, 7, (30, 40), Some(("a", 1)));
        h.op(2, 7, F::Ack, (50, 60), 1, Kind::Ok);
        h
    }

    fn same_stats(h: &mut Hist) {
        let s = json!({"q": {"tasks": {"total": 0, "ready": 0}, "calls": {"put": 3}}});
        h.stats(1000, "n1", s.clone());
        h.stats(1000, "n2", s);
    }

    #[test]
    fn a_clean_history_passes_every_check() {
        let mut h = put_take_ack();
        same_stats(&mut h);
        let r = h.check();
        assert!(r.ok(), "{r}");
        assert!(r.checks.iter().all(|c| c.status == Status::Pass), "{r}");
        assert_eq!(count(&r, LOST, "puts ok"), 1);
        assert!(r.to_string().starts_with("verdict: PASS"), "{r}");
    }

    #[test]
    fn a_put_acknowledged_after_its_tube_was_dropped_is_caught() {
        let mut h = put_take_ack();
        let ok = (Kind::Ok, None);
        // Acknowledged before the drop: it goes with the tube, and is not lost.
        h.on_tube(3, F::Put, (100, 110), "d1", Some("r1"), ok);
        h.on_tube(4, F::Drop, (120, 200), "d1", None, ok);
        // Invoked while the drop ran: either outcome is the drop's to order.
        h.on_tube(3, F::Put, (150, 210), "d1", Some("r2"), ok);
        // Invoked after the drop answered, and refused: as promised.
        let refused = (
            Kind::Fail,
            Some("Procedure 'queue.tube.d1:put' is not defined"),
        );
        h.on_tube(3, F::Put, (220, 230), "d1", Some("r3"), refused);
        let r = h.check();
        assert!(r.ok(), "{r}");
        assert_eq!(count(&r, LOST, "puts ok"), 1);
        assert_eq!(count(&r, LOST, "puts ok into tubes since dropped"), 2);
        assert_eq!(
            count(&r, AFTER_DROP, "puts invoked after a drop answered"),
            1
        );
        assert_eq!(count(&r, AFTER_DROP, "drops ok"), 1);

        // Invoked after the drop answered, and acknowledged: the bug the check is for.
        h.on_tube(3, F::Put, (240, 250), "d1", Some("r4"), ok);
        let r = h.check();
        only_fails(&r, AFTER_DROP, 1);
        let ex = &r.get(AFTER_DROP).unwrap().examples[0];
        assert_eq!(ex.payload.as_deref(), Some("r4"));
        assert_eq!(ex.ops[0].role, "drop");
    }

    #[test]
    fn a_tube_found_gone_after_a_drop_of_unknown_outcome_took_its_puts() {
        let mut h = put_take_ack();
        h.on_tube(3, F::Put, (100, 110), "d2", Some("r1"), (Kind::Ok, None));
        h.on_tube(
            4,
            F::Drop,
            (120, 130),
            "d2",
            None,
            (Kind::Info, Some("timed out")),
        );
        let r = h.check();
        // Nothing says the drop was made: the put is owed.
        only_fails(&r, LOST, 1);
        let gone = format!(
            "Procedure 'queue.tube.d2:drop' is not defined; {}",
            crate::drops::GONE
        );
        h.on_tube(
            4,
            F::Drop,
            (140, 150),
            "d2",
            None,
            (Kind::Fail, Some(&gone)),
        );
        let r = h.check();
        assert!(r.ok(), "{r}");
        assert_eq!(count(&r, AFTER_DROP, "tubes dropped"), 1);
        assert_eq!(count(&r, AFTER_DROP, "drops ok"), 0);
    }

    #[test]
    fn a_put_ok_never_delivered_is_lost() {
        let mut h = put_take_ack();
        h.put(1, (70, 80), "b", Kind::Ok, 2);
        h.take(2, 7, (90, 100), None); // an empty take delivers nothing
        let r = h.check();
        only_fails(&r, LOST, 1);
        let ex = &r.get(LOST).unwrap().examples[0];
        assert_eq!(ex.payload.as_deref(), Some("b"));
        assert_eq!(ex.id, Some(2));
        assert_eq!(ex.ops[0].done_us, Some(80));
        let text = r.to_string();
        assert!(
            text.contains("[FAIL] lost") && text.contains("\"b\""),
            "{text}"
        );
    }

    #[test]
    fn an_unknown_put_may_be_delivered_or_not() {
        let mut h = put_take_ack();
        h.put(1, (70, 80), "b", Kind::Info, 0);
        h.put(1, (90, 95), "c", Kind::Info, 0);
        h.take(2, 7, (100, 110), Some(("b", 2)));
        h.op(2, 7, F::Ack, (120, 130), 2, Kind::Ok);
        let r = h.check();
        assert!(r.ok(), "{r}");
        assert_eq!(count(&r, UNEXPECTED, "unknown puts delivered"), 1);
        assert_eq!(count(&r, UNEXPECTED, "unknown puts not delivered"), 1);
    }

    #[test]
    fn a_failed_put_delivered_is_caught() {
        let mut h = put_take_ack();
        h.put(1, (70, 80), "b", Kind::Fail, 0);
        h.take(2, 7, (90, 100), Some(("b", 2)));
        let r = h.check();
        only_fails(&r, UNEXPECTED, 1);
        let ex = &r.get(UNEXPECTED).unwrap().examples[0];
        assert!(ex.problem.contains("READ_ONLY"), "{}", ex.problem);
        assert_eq!(ex.ops.len(), 2);
    }

    #[test]
    fn a_payload_never_put_or_delivered_before_its_put_is_caught() {
        let mut h = put_take_ack();
        h.take(2, 7, (70, 80), Some(("ghost", 9)));
        h.take(2, 7, (90, 100), Some(("late", 10)));
        h.put(1, (110, 120), "late", Kind::Ok, 10);
        let r = h.check();
        only_fails(&r, UNEXPECTED, 2);
        let problems: Vec<&str> = r
            .get(UNEXPECTED)
            .unwrap()
            .examples
            .iter()
            .map(|e| e.problem.as_str())
            .collect();
        assert!(problems.contains(&"delivered, never put"), "{problems:?}");
        assert!(
            problems.contains(&"delivered before its put was invoked"),
            "{problems:?}"
        );
    }

    #[test]
    fn two_payloads_under_one_id_are_caught() {
        let mut h = put_take_ack();
        h.put(1, (70, 80), "b", Kind::Ok, 1); // id 1 again
        h.take(2, 7, (90, 100), Some(("b", 1)));
        let r = h.check();
        // The second put's id clashes, and the take of id 1 delivering "b" disagrees with the
        // first put ok of id 1.
        only_fails(&r, IDS_UNIQUE, 2);
    }

    #[test]
    fn a_take_of_an_id_delivering_another_payload_is_caught() {
        let mut h = Hist::default();
        h.put(1, (10, 20), "a", Kind::Ok, 1);
        h.put(1, (30, 40), "b", Kind::Ok, 2);
        h.take(2, 7, (50, 60), Some(("a", 2)));
        h.take(2, 7, (70, 80), Some(("b", 1)));
        let r = h.check();
        only_fails(&r, IDS_UNIQUE, 2);
        // Another tube's id 1 is another task.
        let mut h = Hist::default();
        h.put(1, (10, 20), "a", Kind::Ok, 1);
        h.put(1, (30, 40), "b", Kind::Ok, 1);
        h.events[3].tube = Some("other".into());
        h.events[2].tube = Some("other".into());
        h.take(2, 7, (50, 60), Some(("a", 1)));
        assert_eq!(status(&h.check(), IDS_UNIQUE), Status::Pass);
    }

    /// What happens between the two takes of [`taken_twice`].
    type Then = Box<dyn FnOnce(&mut Hist)>;

    /// put a; take by p2/s7 at [30,40]; a second take by p3/s8 at [t0,t1].
    fn taken_twice(ttr: Option<u64>, then: impl FnOnce(&mut Hist), second: (u64, u64)) -> Report {
        let mut h = Hist::default();
        h.put(1, (10, 20), "a", Kind::Ok, 1);
        h.take_ttr(2, 7, (30, 40), Some(("a", 1)), ttr);
        then(&mut h);
        h.take(3, 8, second, Some(("a", 1)));
        h.op(3, 8, F::Ack, (second.1 + 5, second.1 + 6), 1, Kind::Ok);
        h.events.sort_by_key(|e| e.time_us);
        h.check()
    }

    #[test]
    fn a_task_held_by_two_at_once_is_caught() {
        let r = taken_twice(None, |_| {}, (100, 110));
        only_fails(&r, ONE_HOLDER, 1);
        let ex = &r.get(ONE_HOLDER).unwrap().examples[0];
        assert_eq!(ex.ops[0].session, Some(7));
        assert_eq!(ex.ops[1].session, Some(8));
        assert_eq!((ex.ops[1].invoke_us, ex.ops[1].done_us), (100, Some(110)));
        assert!(
            ex.ops[0].note.as_deref().unwrap().contains("not ended"),
            "{r}"
        );
    }

    #[test]
    fn a_redelivery_after_the_hold_ended_is_accepted() {
        let cases: Vec<(&str, Option<u64>, Then)> = vec![
            (
                "release",
                None,
                Box::new(|h| h.op(2, 7, F::Release, (50, 60), 1, Kind::Ok)),
            ),
            (
                "failed ack",
                None,
                Box::new(|h| h.op(2, 7, F::Ack, (50, 60), 1, Kind::Fail)),
            ),
            (
                "unknown bury",
                None,
                Box::new(|h| h.op(2, 7, F::Bury, (50, 60), 1, Kind::Info)),
            ),
            ("disconnect", None, Box::new(|h| h.disconnect(2, 7, 50))),
            // The server closed the holder's connection after its take's answer; the holder
            // learned it only at 200, when it sent its ack.
            (
                "closed by the server",
                None,
                Box::new(|h| h.closed_by_server(2, 7, 30, 200)),
            ),
            ("ttr", Some(0), Box::new(|_| {})), // 0 ms: expired at the take's invoke
            ("leader", None, Box::new(|h| h.leader(50, "n2", 2))),
            (
                "kill",
                None,
                Box::new(|h| h.nemesis((50, 90), json!({"name": "kill n1", "frees_holds": true}))),
            ),
        ];
        for (name, ttr, then) in cases {
            let r = taken_twice(ttr, then, (100, 110));
            assert!(r.ok(), "{name}: {r}");
        }
        // 100 ms of ttr from the take's invoke at 30 µs: free from 100,030 µs on.
        assert!(taken_twice(Some(100), |_| {}, (100_031, 100_040)).ok());
        let r = taken_twice(Some(100), |_| {}, (100_000, 100_029));
        only_fails(&r, ONE_HOLDER, 1);
    }

    #[test]
    fn what_does_not_end_a_hold_is_not_taken_for_it() {
        let cases: Vec<(&str, Then)> = vec![
            // Another session's release, a leader seen again in its term, a fault not marked,
            // a disconnect of another session.
            (
                "other's release",
                Box::new(|h| h.op(4, 9, F::Release, (50, 60), 1, Kind::Ok)),
            ),
            (
                "same term",
                Box::new(|h| {
                    h.leader(5, "n1", 2);
                    h.leader(50, "n1", 2);
                }),
            ),
            (
                "partition",
                Box::new(|h| h.nemesis((50, 60), json!({"name": "partition"}))),
            ),
            ("other session", Box::new(|h| h.disconnect(4, 9, 50))),
        ];
        for (name, then) in cases {
            let r = taken_twice(None, then, (100, 110));
            assert_eq!(status(&r, ONE_HOLDER), Status::Fail, "{name}: {r}");
        }
    }

    #[test]
    fn a_new_primary_seen_while_the_take_was_open_frees_its_hold() {
        // The take may have been served by the old primary just before the change.
        let r = taken_twice(None, |h| h.leader(35, "n2", 3), (100, 110));
        assert!(r.ok(), "{r}");
        // A leader change before the take was invoked does not.
        let r = taken_twice(None, |h| h.leader(25, "n2", 3), (100, 110));
        assert_eq!(status(&r, ONE_HOLDER), Status::Fail, "{r}");
    }

    #[test]
    fn a_new_primary_seen_late_frees_holds_from_when_it_may_have_begun() {
        // Seen after the second take, but it may have begun before it (the watcher asks
        // every node in rounds): the hold may have ended then.
        let r = taken_twice(None, |h| h.leader_since((95, 120), "n2", 3), (100, 110));
        assert!(r.ok(), "{r}");
        // Seen as late, but it began after the second take was answered: still two holders.
        let r = taken_twice(None, |h| h.leader_since((115, 120), "n2", 3), (100, 110));
        assert_eq!(status(&r, ONE_HOLDER), Status::Fail, "{r}");
        // A history without `since_us` takes the time seen.
        let r = taken_twice(None, |h| h.leader(120, "n2", 3), (100, 110));
        assert_eq!(status(&r, ONE_HOLDER), Status::Fail, "{r}");
    }

    #[test]
    fn overlapping_takes_both_holding_are_caught() {
        // Take 2 at [35, 45] overlaps take 1 at [30, 40]: whichever came first, neither hold
        // ended before the other take completed.
        let r = taken_twice(None, |_| {}, (35, 45));
        only_fails(&r, ONE_HOLDER, 1);
        // ...but one released at 41 may have come first.
        let r = taken_twice(
            None,
            |h| h.op(2, 7, F::Release, (41, 42), 1, Kind::Ok),
            (35, 45),
        );
        assert!(r.ok(), "{r}");
    }

    #[test]
    fn a_delivery_after_an_ack_is_caught() {
        let mut h = put_take_ack();
        h.take(3, 8, (70, 80), Some(("a", 1)));
        let r = h.check();
        only_fails(&r, AFTER_ACK, 1);
        let ex = &r.get(AFTER_ACK).unwrap().examples[0];
        assert_eq!(ex.ops[0].f, F::Ack);
        // A failed ack frees the hold (the holder gave it up) and does not delete.
        let mut h = Hist::default();
        h.put(1, (10, 20), "a", Kind::Ok, 1);
        h.take(2, 7, (30, 40), Some(("a", 1)));
        h.op(2, 7, F::Ack, (50, 60), 1, Kind::Fail);
        h.take(3, 8, (70, 80), Some(("a", 1)));
        assert!(h.check().ok(), "{}", h.check());
    }

    #[test]
    fn utube_tasks_out_of_put_order_are_caught() {
        let mut h = Hist::default();
        h.keyed_put(1, (10, 20), "a", Some("k"), Kind::Ok, 1);
        h.keyed_put(1, (30, 40), "b", Some("k"), Kind::Ok, 2);
        h.keyed_put(1, (41, 42), "c", Some("other"), Kind::Ok, 3);
        h.take(2, 7, (50, 60), Some(("b", 2)));
        h.op(2, 7, F::Ack, (61, 62), 2, Kind::Ok);
        h.take(2, 7, (63, 64), Some(("c", 3)));
        h.op(2, 7, F::Ack, (65, 66), 3, Kind::Ok);
        h.take(2, 7, (70, 80), Some(("a", 1)));
        h.op(2, 7, F::Ack, (81, 82), 1, Kind::Ok);
        let r = h.check();
        only_fails(&r, UTUBE_ORDER, 1);
        let ex = &r.get(UTUBE_ORDER).unwrap().examples[0];
        assert_eq!(
            (ex.payload.as_deref(), ex.key.as_deref()),
            (Some("b"), Some("k"))
        );

        // The A that blocks B need not be the first of the key: a1 came in order, a2 did not.
        let mut h = Hist::default();
        h.keyed_put(1, (10, 20), "a1", Some("k"), Kind::Ok, 1);
        h.keyed_put(1, (21, 22), "a2", Some("k"), Kind::Ok, 2);
        h.keyed_put(1, (30, 40), "b", Some("k"), Kind::Ok, 3);
        for (i, (payload, id)) in [("a1", 1), ("b", 3), ("a2", 2)].into_iter().enumerate() {
            let t = 50 + 20 * i as u64;
            h.take(2, 7, (t, t + 5), Some((payload, id)));
            h.op(2, 7, F::Ack, (t + 6, t + 7), id, Kind::Ok);
        }
        let r = h.check();
        only_fails(&r, UTUBE_ORDER, 1);
        let ex = &r.get(UTUBE_ORDER).unwrap().examples[0];
        assert_eq!(ex.ops[0].payload.as_deref(), Some("a2"), "{r}");
    }

    #[test]
    fn utube_order_allows_what_the_history_cannot_order() {
        // b's put was invoked before a's completed: either may be first.
        let mut h = Hist::default();
        h.keyed_put(1, (10, 30), "a", Some("k"), Kind::Ok, 1);
        h.keyed_put(2, (20, 40), "b", Some("k"), Kind::Ok, 2);
        h.take(3, 7, (50, 60), Some(("b", 2)));
        h.op(3, 7, F::Ack, (61, 62), 2, Kind::Ok);
        h.take(3, 7, (70, 80), Some(("a", 1)));
        h.op(3, 7, F::Ack, (81, 82), 1, Kind::Ok);
        assert!(h.check().ok(), "{}", h.check());
        // a's take overlapped b's: a may have been handed out first.
        let mut h = Hist::default();
        h.keyed_put(1, (10, 20), "a", Some("k"), Kind::Ok, 1);
        h.keyed_put(1, (30, 40), "b", Some("k"), Kind::Ok, 2);
        h.take(3, 7, (50, 60), Some(("b", 2)));
        h.take(4, 8, (55, 65), Some(("a", 1)));
        assert!(h.check().ok(), "{}", h.check());
        // a buried (by its id, not taken) before b's delivery no longer blocks the key.
        let mut h = Hist::default();
        h.keyed_put(1, (10, 20), "a", Some("k"), Kind::Ok, 1);
        h.keyed_put(1, (30, 40), "b", Some("k"), Kind::Ok, 2);
        h.op(1, 6, F::Bury, (41, 42), 1, Kind::Ok);
        h.take(3, 7, (50, 60), Some(("b", 2)));
        h.take(4, 8, (70, 80), Some(("a", 1)));
        assert!(h.check().ok(), "{}", h.check());
    }

    #[test]
    fn statistics_must_agree_on_task_counts_only() {
        let mut h = put_take_ack();
        h.stats(
            1000,
            "n1",
            json!({"q": {"tasks": {"total": 0, "ready": 0}, "calls": {"put": 3}}}),
        );
        // Flat names, other call counts: the same tasks.
        h.stats(
            1000,
            "n2",
            json!({"q": {"tasks.total": 0, "tasks.ready": 0, "calls.put": 1}}),
        );
        assert!(h.check().ok(), "{}", h.check());
        h.stats(
            1000,
            "n3",
            json!({"q": {"tasks": {"total": 1, "ready": 1}}, "r": {"tasks": {"total": 0}}}),
        );
        let r = h.check();
        // total and ready differ on q; r's total is absent on n1 and n2.
        only_fails(&r, STATS_AGREE, 3);
        let problem = &r.get(STATS_AGREE).unwrap().examples[0].problem;
        assert!(
            problem.contains("n1=0") && problem.contains("n3=1"),
            "{problem}"
        );
    }

    #[test]
    fn statistics_absent_are_not_run_not_passed() {
        let r = put_take_ack().check();
        assert_eq!(status(&r, STATS_AGREE), Status::NotRun);
        assert!(r.ok());
        assert!(r.to_string().contains("[not run] statistics agree"), "{r}");
    }

    #[test]
    fn a_broken_history_is_a_harness_bug() {
        let mut h = put_take_ack();
        h.events.push(ev(70, 2, Kind::Invoke, F::Take));
        h.events.push(ev(80, 2, Kind::Invoke, F::Take)); // two open
        h.events.push(ev(90, 3, Kind::Ok, F::Ack)); // no invoke
        h.events
            .push(Event::new(95, HARNESS, Kind::Invoke, F::Nemesis)); // never healed
        let mut dup = ev(100, 4, Kind::Invoke, F::Put);
        dup.payload = Some("a".into());
        h.events.push(dup);
        h.events.push(ev(110, 4, Kind::Info, F::Put));
        let r = h.check();
        // 80's take is still open, as is 70's; the orphan ack; the fault; the payload twice.
        only_fails(&r, WELL_FORMED, 5);
        assert_eq!(count(&r, WELL_FORMED, "completions without invoke"), 1);
    }

    #[test]
    fn faults_pair_by_name_when_they_overlap() {
        let mut events = Vec::new();
        for (t, kind, name) in [
            (1, Kind::Invoke, "a"),
            (2, Kind::Invoke, "b"),
            (3, Kind::Ok, "b"),
            (4, Kind::Ok, "a"),
        ] {
            let mut e = Event::new(t, HARNESS, kind, F::Nemesis);
            e.value = Some(json!({ "name": name }));
            events.push(e);
        }
        let (faults, problems) = faults(&events);
        assert!(problems.is_empty(), "{problems:?}");
        let spans: Vec<(String, u64, u64)> = faults
            .iter()
            .map(|f| (f.label(), f.start.time_us, f.end.unwrap().time_us))
            .collect();
        assert_eq!(spans, [("a".into(), 1, 4), ("b".into(), 2, 3)]);
        assert!(check(&events).ok());
    }

    #[test]
    fn the_report_serializes_with_counts_as_a_map() {
        let mut h = put_take_ack();
        h.put(1, (70, 80), "b", Kind::Ok, 2);
        let r = h.check();
        let v = serde_json::to_value(&r).unwrap();
        let lost = &v["checks"][1];
        assert_eq!(lost["name"], "lost");
        assert_eq!(lost["status"], "fail");
        assert_eq!(lost["counts"]["lost"], 1);
        assert_eq!(lost["examples"][0]["payload"], "b");
        assert_eq!(lost["examples"][0]["ops"][0]["outcome"], "ok");
        assert_eq!(v["checks"][7]["status"], "not_run");
    }

    #[test]
    fn examples_are_capped_but_all_counted() {
        let mut h = Hist::default();
        for i in 0..30 {
            h.put(1, (10 * i, 10 * i + 5), &format!("p{i}"), Kind::Ok, i + 1);
        }
        let r = h.check();
        let lost = r.get(LOST).unwrap();
        assert_eq!(lost.violations, 30);
        assert_eq!(lost.examples.len(), MAX_EXAMPLES);
    }

    mod model {
        //! A legal sequential queue, run from random steps, writes a history the checker
        //! must find nothing in; dropping one task's deliveries must make it lost.

        use super::super::*;
        use proptest::prelude::*;
        use serde_json::json;
        use std::collections::BTreeMap;

        const PROCESSES: u64 = 3;
        const DRAIN: u64 = 99;

        #[derive(Debug, Clone)]
        enum Step {
            /// outcome: 0 ok, 1 fail, 2 info (done), 3 info (not done).
            Put {
                p: u64,
                utube: bool,
                key: u8,
                outcome: u8,
            },
            Take {
                p: u64,
                utube: bool,
            },
            Ack {
                p: u64,
            },
            Release {
                p: u64,
            },
            Bury {
                p: u64,
            },
            Disconnect {
                p: u64,
            },
            Leader,
        }

        fn step() -> impl Strategy<Value = Step> {
            let p = 0..PROCESSES;
            prop_oneof![
                3 => (p.clone(), any::<bool>(), 0..3u8, 0..4u8)
                    .prop_map(|(p, utube, key, outcome)| Step::Put { p, utube, key, outcome }),
                4 => (p.clone(), any::<bool>()).prop_map(|(p, utube)| Step::Take { p, utube }),
                2 => p.clone().prop_map(|p| Step::Ack { p }),
                1 => p.clone().prop_map(|p| Step::Release { p }),
                1 => p.clone().prop_map(|p| Step::Bury { p }),
                1 => p.prop_map(|p| Step::Disconnect { p }),
                1 => Just(Step::Leader),
            ]
        }

        #[derive(Debug, Clone)]
        struct Task {
            payload: String,
            key: Option<String>,
        }

        /// The queue and its clients: tubes "q" (fifo) and "u" (utube); ids count up per
        /// tube and are never given again.
        #[derive(Default)]
        struct Model {
            t: u64,
            events: Vec<Event>,
            ready: BTreeMap<(&'static str, u64), Task>,
            /// (tube, id) -> (process, session, task)
            held: BTreeMap<(&'static str, u64), (u64, u64, Task)>,
            buried: u64,
            next_id: BTreeMap<&'static str, u64>,
            sessions: BTreeMap<u64, u64>,
            next_session: u64,
            term: u64,
            puts: u64,
        }

        impl Model {
            fn emit(&mut self, p: u64, kind: Kind, f: F, fill: impl FnOnce(&mut Event)) {
                self.t += 7;
                let mut e = Event::new(self.t, p, kind, f);
                if p != HARNESS {
                    e.session = Some(self.session(p));
                    e.node = Some("n1".into());
                }
                fill(&mut e);
                self.events.push(e);
            }

            fn session(&mut self, p: u64) -> u64 {
                if let Some(&s) = self.sessions.get(&p) {
                    return s;
                }
                self.next_session += 1;
                self.sessions.insert(p, self.next_session);
                self.next_session
            }

            fn run(&mut self, step: &Step) {
                match *step {
                    Step::Put {
                        p,
                        utube,
                        key,
                        outcome,
                    } => self.put(p, utube, key, outcome),
                    Step::Take { p, utube } => {
                        self.take(p, if utube { "u" } else { "q" });
                    }
                    Step::Ack { p } => self.finish(p, F::Ack),
                    Step::Release { p } => self.finish(p, F::Release),
                    Step::Bury { p } => self.finish(p, F::Bury),
                    Step::Disconnect { p } => self.disconnect(p),
                    Step::Leader => self.leader(),
                }
            }

            fn put(&mut self, p: u64, utube: bool, key: u8, outcome: u8) {
                let tube = if utube { "u" } else { "q" };
                self.puts += 1;
                let task = Task {
                    payload: format!("p{}", self.puts),
                    key: utube.then(|| format!("k{key}")),
                };
                let t = task.clone();
                self.emit(p, Kind::Invoke, F::Put, |e| {
                    e.tube = Some(tube.into());
                    e.payload = Some(t.payload);
                    e.key = t.key;
                });
                let done = outcome == 0 || outcome == 2;
                let id = done.then(|| {
                    let id = self.next_id.entry(tube).or_insert(0);
                    *id += 1;
                    *id
                });
                if let Some(id) = id {
                    self.ready.insert((tube, id), task);
                }
                let kind = [Kind::Ok, Kind::Fail, Kind::Info, Kind::Info][outcome as usize];
                self.emit(p, kind, F::Put, |e| {
                    e.tube = Some(tube.into());
                    if kind == Kind::Ok {
                        e.id = id;
                    }
                });
            }

            /// The first ready task of the tube; in a utube, of a key none holds.
            fn next_ready(&self, tube: &'static str) -> Option<(&'static str, u64)> {
                let busy: Vec<&Option<String>> = self
                    .held
                    .iter()
                    .filter(|((t, _), _)| *t == tube)
                    .map(|(_, (_, _, task))| &task.key)
                    .collect();
                self.ready
                    .iter()
                    .filter(|((t, _), _)| *t == tube)
                    .find(|(_, task)| tube != "u" || !busy.contains(&&task.key))
                    .map(|(k, _)| *k)
            }

            fn take(&mut self, p: u64, tube: &'static str) -> Option<(&'static str, u64)> {
                self.emit(p, Kind::Invoke, F::Take, |e| e.tube = Some(tube.into()));
                let got = self.next_ready(tube);
                let task = got.map(|k| self.ready.remove(&k).unwrap());
                if let (Some(k), Some(task)) = (got, &task) {
                    let s = self.session(p);
                    self.held.insert(k, (p, s, task.clone()));
                }
                self.emit(p, Kind::Ok, F::Take, |e| {
                    e.tube = Some(tube.into());
                    if let (Some((_, id)), Some(task)) = (got, task) {
                        e.id = Some(id);
                        e.payload = Some(task.payload);
                        e.key = task.key;
                        e.ttr_ms = Some(3_600_000);
                    }
                });
                got
            }

            /// An ack, release or bury of the first task `p` holds, if any.
            fn finish(&mut self, p: u64, f: F) {
                let Some(k) = self.held.iter().find(|(_, h)| h.0 == p).map(|(k, _)| *k) else {
                    return;
                };
                let (_, _, task) = self.held.remove(&k).unwrap();
                let (tube, id) = k;
                self.emit(p, Kind::Invoke, f, |e| {
                    e.tube = Some(tube.into());
                    e.id = Some(id);
                });
                match f {
                    F::Release => {
                        self.ready.insert(k, task);
                    }
                    F::Bury => self.buried += 1,
                    _ => {}
                }
                self.emit(p, Kind::Ok, f, |e| e.tube = Some(tube.into()));
            }

            fn free(&mut self, which: impl Fn(u64) -> bool) {
                let keys: Vec<_> = self
                    .held
                    .iter()
                    .filter(|(_, h)| which(h.1))
                    .map(|(k, _)| *k)
                    .collect();
                for k in keys {
                    let (_, _, task) = self.held.remove(&k).unwrap();
                    self.ready.insert(k, task);
                }
            }

            fn disconnect(&mut self, p: u64) {
                let s = self.session(p);
                self.emit(p, Kind::Info, F::Disconnect, |_| {});
                self.free(|held_by| held_by == s);
                self.sessions.remove(&p);
            }

            fn leader(&mut self) {
                self.term += 1;
                let term = self.term;
                self.emit(HARNESS, Kind::Info, F::Leader, |e| {
                    e.node = Some(format!("n{}", term % 3 + 1));
                    e.value = Some(json!({ "term": term }));
                });
                self.free(|_| true);
            }

            /// The harness's end: every client disconnects, one drains both tubes (take and
            /// ack until empty), and two nodes report the same figures.
            fn drain(&mut self) {
                for p in 0..PROCESSES {
                    if self.sessions.contains_key(&p) {
                        self.disconnect(p);
                    }
                }
                for tube in ["q", "u"] {
                    while self.take(DRAIN, tube).is_some() {
                        self.finish(DRAIN, F::Ack);
                    }
                }
                let stats = json!({
                    "q": {"tasks": {"ready": 0, "taken": 0}},
                    "u": {"tasks": {"ready": 0, "taken": 0}},
                    "all": {"tasks": {"buried": self.buried}},
                });
                for node in ["n1", "n2"] {
                    let s = stats.clone();
                    self.emit(HARNESS, Kind::Ok, F::Stats, |e| {
                        e.node = Some(node.into());
                        e.value = Some(s);
                    });
                }
            }
        }

        fn history(steps: &[Step]) -> Vec<Event> {
            let mut m = Model::default();
            m.leader();
            for s in steps {
                m.run(s);
            }
            m.drain();
            m.events
        }

        proptest! {
            #[test]
            fn a_legal_history_passes_and_a_dropped_delivery_is_lost(
                steps in prop::collection::vec(step(), 0..120),
                pick in any::<prop::sample::Index>(),
            ) {
                let events = history(&steps);
                let r = check(&events);
                prop_assert!(r.ok(), "{}", r);
                prop_assert!(r.checks.iter().all(|c| c.status == Status::Pass), "{}", r);

                // Drop every take that delivered one put-ok payload (invoke and ok: the model
                // writes them one after the other).
                let delivered: Vec<String> = events
                    .iter()
                    .filter(|e| e.f == F::Put && e.kind == Kind::Ok)
                    .filter_map(|ok| {
                        events.iter().rev().find(|e| {
                            e.process == ok.process && e.kind == Kind::Invoke && e.time_us < ok.time_us
                        })?.payload.clone()
                    })
                    .collect();
                prop_assume!(!delivered.is_empty());
                let gone = pick.get(&delivered);
                let mut kept: Vec<Event> = Vec::new();
                for e in &events {
                    if e.f == F::Take && e.kind == Kind::Ok && e.payload.as_ref() == Some(gone) {
                        kept.pop(); // its invoke
                    } else {
                        kept.push(e.clone());
                    }
                }
                let r = check(&kept);
                let lost = r.get(LOST).unwrap();
                prop_assert_eq!(lost.status, Status::Fail, "{}", r);
                prop_assert_eq!(lost.violations, 1);
                prop_assert_eq!(lost.examples[0].payload.as_ref(), Some(gone));
                prop_assert!(r.failed().all(|c| c.name == LOST), "{}", r);
            }
        }
    }
}
