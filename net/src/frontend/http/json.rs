//! The JSON shapes of the HTTP API: a task, a tube with its `tasks` and `calls` exactly as
//! `queue.statistics` reports them, and an error with the same text the tube API's clients
//! read (`frontend::iproto::errors`), under the status that fits it. [`encode`] turns the
//! core's outcomes into responses.

use base64::Engine as _;
use serde_json::{json, Map, Value};
use tarq_engine::{number_from, Micros, QueueError, Stats, Status, TaskRef, TubeInfo, TubeIx};
use tarq_ops::live::Sample;

use super::response;
use super::Reply;
use crate::core::{Listed, Outcome, Refusal, TaskPage};
use crate::frontend::iproto::errors::{refusal_text, text};
use crate::frontend::iproto::Style;

/// What an answer shows; the outcome fills it in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Answer {
    /// A new task (201).
    Put,
    /// A task as it is now (bury, kick).
    Task,
    /// A task that left the queue (delete).
    Done,
    /// How many tasks were kicked.
    Kicked,
    /// A tube created (201).
    Created,
    /// Done, nothing to show (truncate, pause, resume, drop).
    Ok,
}

/// The status word of a task in the API (the tube API's letters spelled out, beanstalk's
/// `delayed` for waiting).
pub fn status_name(s: Status) -> &'static str {
    match s {
        Status::Ready => "ready",
        Status::Taken => "taken",
        Status::Waiting => "delayed",
        Status::Buried => "buried",
    }
}

/// The API's word for a status, as a query names it.
pub fn parse_status(s: &str) -> Option<Status> {
    Some(match s {
        "ready" => Status::Ready,
        "taken" => Status::Taken,
        "delayed" => Status::Waiting,
        "buried" => Status::Buried,
        _ => return None,
    })
}

fn secs(m: Micros) -> Value {
    json!(m as f64 / 1e6)
}

fn opt_secs(m: Option<Micros>) -> Value {
    m.map_or(Value::Null, secs)
}

/// Bytes of a payload a listing shows (the task's own page, a peek, shows it whole): a page
/// of [`MAX_PAGE`](super::MAX_PAGE) tasks stays about a megabyte however big the tasks are.
pub const PREVIEW_BYTES: usize = crate::core::LIST_PREVIEW_BYTES;

/// A task's payload, shown safely: a MessagePack string as `data` (text), bytes as
/// `data_base64`, any other value as `data` in its JSON form. With `preview`, at most
/// [`PREVIEW_BYTES`] of it, and `truncated` with the payload's `size` when it is longer.
fn payload(obj: &mut Map<String, Value>, data: &[u8], preview: Option<usize>) {
    let b64 = |b: &[u8]| json!(base64::engine::general_purpose::STANDARD.encode(b));
    let limit = preview.unwrap_or(usize::MAX);
    let cut = |obj: &mut Map<String, Value>, size: usize| {
        obj.insert("truncated".into(), json!(true));
        obj.insert("size".into(), json!(size));
    };
    let mut r = tarq_iproto::mp::Reader::new(data);
    match r.read_str_or_bin() {
        Ok(body) if r.is_empty() => {
            let shown = &body[..body.len().min(limit)];
            // A string is text unless it is not UTF-8 (then its bytes are shown).
            let text = std::str::from_utf8(body)
                .ok()
                .filter(|_| data.first().is_some_and(|&b| is_str_marker(b)));
            match text {
                Some(t) => {
                    let mut end = shown.len();
                    while !t.is_char_boundary(end) {
                        end -= 1;
                    }
                    obj.insert("data".into(), json!(&t[..end]));
                }
                None => {
                    obj.insert("data_base64".into(), b64(shown));
                }
            }
            if body.len() > limit {
                cut(obj, body.len());
            }
        }
        _ if data.len() > limit => cut(obj, data.len()),
        _ => match rmpv::decode::read_value(&mut &data[..]) {
            Ok(v) => {
                obj.insert("data".into(), crate::ctl::to_json(&v));
            }
            // Not one MessagePack value (never stored so, but shown rather than hidden).
            Err(_) => {
                obj.insert("data_base64".into(), b64(data));
            }
        },
    }
}

/// Whether a MessagePack value starting with `b` is a string (fixstr, str8/16/32).
fn is_str_marker(b: u8) -> bool {
    (0xa0..=0xbf).contains(&b) || (0xd9..=0xdb).contains(&b)
}

/// A task: `id` is its number in its tube (what the tube API shows), `job_id` the whole id
/// (what beanstalk and the seed API show); its payload whole.
pub fn task(t: &TaskRef<'_>, tube: TubeIx, first: u64, done: bool) -> Value {
    task_shown(t, tube, first, done, None)
}

/// A task in a listing: its payload up to [`PREVIEW_BYTES`].
pub fn task_preview(t: &TaskRef<'_>, tube: TubeIx, first: u64) -> Value {
    task_shown(t, tube, first, false, Some(PREVIEW_BYTES))
}

/// Task `t` of tube `tube` (the tube a route names: a task of its later partitions shows its
/// whole id, as the tube API shows it, and the per-task routes take it back).
fn task_shown(
    t: &TaskRef<'_>,
    tube: TubeIx,
    first: u64,
    done: bool,
    preview: Option<usize>,
) -> Value {
    let mut o = Map::new();
    o.insert("id".into(), json!(number_from(tube, first, t.id)));
    o.insert("job_id".into(), json!(t.id));
    let status = if done { "done" } else { status_name(t.status) };
    o.insert("status".into(), json!(status));
    o.insert("pri".into(), json!(t.pri));
    o.insert("created".into(), secs(t.created));
    if t.status == Status::Waiting {
        o.insert("runat".into(), secs(t.runat));
    }
    o.insert("ttl".into(), opt_secs(t.ttl));
    o.insert("ttr".into(), opt_secs(t.ttr));
    o.insert("deliveries".into(), json!(t.deliveries));
    if let Some(k) = t.utube {
        o.insert("utube".into(), json!(String::from_utf8_lossy(k)));
    }
    payload(&mut o, t.data, preview);
    Value::Object(o)
}

/// A task of a listing (`Listed`) of partition `ix` of the tube whose first partition is
/// `head`, as [`task_preview`] shows a task here: its payload's preview, cut by its owner.
pub fn listed(t: &Listed, ix: TubeIx, head: TubeIx, first: u64) -> Value {
    let mut v = task_preview(&t.task_ref(ix), head, first);
    if t.cut {
        v["truncated"] = json!(true);
        v["size"] = json!(t.size);
    }
    v
}

/// A sharded cluster's listing of tube `head` (first partition's numbers from `first`):
/// each task with its `partition`, the cursor of the next page, and the partitions whose
/// owners did not answer in time (their tasks are not in the page).
pub fn task_page(page: &TaskPage, head: TubeIx, first: u64) -> Value {
    let tasks: Vec<Value> = (page.tasks.iter())
        .map(|(p, ix, t)| {
            let mut v = listed(t, *ix, head, first);
            v["partition"] = json!(p);
            v
        })
        .collect();
    let next = page.next_after.map(|id| number_from(head, first, id));
    let unanswered: Vec<Value> = (page.unanswered.iter())
        .map(|(p, set, why)| json!({ "partition": p, "set": set, "error": why }))
        .collect();
    json!({
        "tube": page.tube,
        "status": status_name(page.status),
        "tasks": tasks,
        "next_after": next,
        "unanswered": unanswered,
    })
}

/// `queue.statistics(NAME)`: `{tasks = {...}, calls = {...}}`, the same keys and values.
pub fn statistics(s: &Stats) -> Value {
    json!({
        "tasks": {
            "ready": s.ready,
            "taken": s.taken,
            "done": s.acks + s.deletes + s.expired,
            "buried": s.buried,
            "delayed": s.waiting,
            "total": s.total,
        },
        "calls": {
            "put": s.puts,
            "take": s.takes,
            "ack": s.acks,
            "release": s.releases + s.auto_released,
            "bury": s.buries,
            "kick": s.kicks,
            "delete": s.deletes + s.expired,
            "touch": s.touches,
            "ttl": s.expired,
            "ttr": s.ttr_returned,
            "delay": s.promoted,
        },
        "consumers": {
            "waiting": s.takers_waiting,
            "holding": s.takers_holding,
        },
        "oldest_ready_age": crate::frontend::iproto::tubes::oldest_ready_age(s),
        "idle": crate::frontend::iproto::tubes::is_idle(s),
    })
}

/// A tube's options as `create_tube` takes them (seconds; `null` for none).
pub fn options(t: &TubeInfo<'_>) -> Value {
    let o = &t.opts;
    json!({
        "ttl": opt_secs(o.ttl),
        "ttr": opt_secs(o.ttr),
        "pri": o.pri,
        "capacity": o.capacity,
        "max_deliveries": o.max_deliveries,
        "dedup_window": o.dedup_window as f64 / 1e6,
        "temporary": o.temporary,
        "on_demand": o.on_demand,
    })
}

/// Per-second rates of the last whole second (`null` where that second is not known: on a
/// sharded cluster, an owner of one of the tube's partitions did not answer).
pub fn rates(s: Option<Sample>) -> Value {
    let s = s.unwrap_or_default();
    let known = |v: u32| (v != tarq_ops::live::GAP).then_some(v);
    json!({ "put": known(s.put), "take": known(s.take), "ack": known(s.ack) })
}

/// A tube for the listing: name, type, options, `queue.statistics`' two maps, rates, and
/// whether its takes are paused (seconds left).
/// A sharded cluster's tube's partitions: where each is (`set`, its `primary`) and its counts
/// as its owner last gave them (null when it did not answer).
pub fn partitions(parts: &[super::PartitionFigures]) -> Value {
    let one = |p: &super::PartitionFigures| {
        let mut v = p.stats.as_ref().map_or_else(|| json!({}), statistics);
        let o = v.as_object_mut().expect("an object");
        o.insert("partition".into(), json!(p.partition));
        o.insert("index".into(), json!(p.index));
        o.insert("set".into(), json!(p.set));
        o.insert("primary".into(), json!(p.primary));
        v
    };
    Value::Array(parts.iter().map(one).collect())
}

pub fn tube(
    t: &TubeInfo<'_>,
    stats: &Stats,
    rate: Option<Sample>,
    paused_for: Option<f64>,
) -> Value {
    let mut v = statistics(stats);
    let o = v.as_object_mut().expect("an object");
    let mut head = Map::new();
    head.insert("name".into(), json!(t.name));
    head.insert("type".into(), json!(t.kind.as_str()));
    head.insert("options".into(), options(t));
    head.append(o);
    head.insert("rates".into(), rates(rate));
    head.insert("paused".into(), json!(paused_for));
    Value::Object(head)
}

/// The status a refusal is answered with.
pub fn status_of(e: &Refusal) -> u16 {
    use QueueError as E;
    match e {
        Refusal::Queue(q) => match q {
            E::TubeNotFound(_) | E::NotFound(_) | E::NotInTube { .. } | E::NotHeld { .. } => 404,
            E::TubeExists(_)
            | E::TubeHasTaken(_)
            | E::DefaultTubeUndroppable
            | E::TubeFull { .. }
            | E::NotKickable { .. } => 409,
            E::TooManyTasks { .. } | E::TooManyTubes { .. } => 507,
            _ => 400,
        },
        Refusal::Consumers => 409,
        Refusal::Journal(_) | Refusal::ReadOnly(_) | Refusal::NoPrimary(_) => 503,
        Refusal::Shards(_) => 503,
        // The gateway's word for "sent on, no answer": the change may have been made.
        Refusal::Unknown(_) => 504,
        Refusal::TooManyParked | Refusal::NoSnapshots | Refusal::User(_) => 400,
    }
}

/// The text a refusal is worded with: the tube API's.
pub fn error_text(e: &Refusal, tube: TubeIx, first: u64) -> String {
    match e {
        Refusal::Queue(q) => text(Style::Tube, tube, first, q),
        other => refusal_text(other),
    }
}

/// Encodes `outcome` as the response `r` asks for.
pub fn encode(out: &mut Vec<u8>, r: Reply, outcome: &Outcome<'_>) {
    let created = matches!(r.answer, Answer::Put | Answer::Created);
    let ok = if created { 201 } else { 200 };
    let (status, body) = match outcome {
        Outcome::Task(t) => (ok, json!({ "task": task(t, r.tube, r.first, false) })),
        Outcome::Done(t) => (
            ok,
            json!({ "task": task(&t.as_ref(), r.tube, r.first, true) }),
        ),
        Outcome::DoneId { number, .. } => (
            200,
            json!({ "task": { "id": number, "status": "done" }, "deduplicated": true }),
        ),
        Outcome::Count(n) => (200, json!({ "kicked": n })),
        Outcome::Ok | Outcome::Nothing | Outcome::Dropped | Outcome::Ready(_) => {
            (200, json!({ "ok": true }))
        }
        Outcome::Tube(t) => (
            ok,
            json!({ "name": t.name, "type": t.kind.as_str(), "options": options(t) }),
        ),
        Outcome::TubeStats(s) | Outcome::TubeFigures { stats: s, .. } => (200, statistics(s)),
        // The HTTP API asks no task's figures (its tasks carry them).
        Outcome::TaskFigures(f) => (200, json!({ "task": { "id": f.id } })),
        Outcome::AllStats(all) => {
            let tubes: Map<String, Value> = (all.iter())
                .map(|(name, s)| (name.clone(), statistics(s)))
                .collect();
            (200, Value::Object(tubes))
        }
        Outcome::Tasks(tasks) => {
            let shown = (tasks.iter()).map(|t| listed(t, r.tube, r.tube, r.first));
            (200, json!({ "tasks": shown.collect::<Vec<_>>() }))
        }
        Outcome::TaskPage(page) => (200, task_page(page, r.tube, r.first)),
        Outcome::Moves(m) => (200, serde_json::to_value(m).unwrap_or_default()),
        Outcome::Full => (409, json!({ "error": "the tube is full", "status": 409 })),
        Outcome::ServerStats(_) | Outcome::Text(_) => (200, json!({ "ok": true })),
        Outcome::Error(e) => {
            let status = status_of(e);
            let why = error_text(e, r.tube, r.first);
            (status, json!({ "error": why, "status": status }))
        }
    };
    response::json(out, status, &body.to_string(), r.close);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn payloads_show_as_text_bytes_or_json() {
        let show = |data: &[u8]| {
            let mut o = Map::new();
            payload(&mut o, data, Some(4));
            Value::Object(o)
        };
        assert_eq!(show(&[0xa2, b'h', b'i']), json!({ "data": "hi" }));
        assert_eq!(
            show(&[0xc4, 2, 0xff, 0x00]),
            json!({ "data_base64": "/wA=" })
        );
        assert_eq!(show(&[0x81, 0xa1, b'a', 1]), json!({ "data": { "a": 1 } }));
        // Longer than the preview: cut (at a character's boundary), with the whole size.
        assert_eq!(
            show(&[0xa6, b'a', b'b', b'c', 0xc3, 0xa9, b'z']),
            json!({ "data": "abc", "truncated": true, "size": 6 })
        );
        assert_eq!(
            show(&[0x93, 1, 2, 0xa3, b'x', b'y', b'z']),
            json!({ "truncated": true, "size": 7 })
        );
    }

    #[test]
    fn refusals_map_to_statuses_with_the_tube_apis_words() {
        let e = Refusal::Queue(QueueError::TubeExists("q".into()));
        assert_eq!(
            (status_of(&e), error_text(&e, 0, 0)),
            (409, "Space 'q' already exists".into())
        );
        let e = Refusal::ReadOnly("10.0.0.1:3301".into());
        assert_eq!(status_of(&e), 503);
        assert_eq!(
            error_text(&e, 0, 0),
            "read-only replica: the primary is 10.0.0.1:3301"
        );
    }
}
