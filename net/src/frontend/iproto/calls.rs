//! The queue's stored functions as seen on the wire: decoding a CALL's raw args into a [`Call`]
//! (with errors that name the option or argument at fault, in the seed's wording where it has
//! one), and encoding tasks into a reply (`queue.stats()` is [`tarq_ops::stats::Snapshot`]).
//! Executing a call is the loop's job.

use tarq_engine::{Micros, PutOptions, Status, TaskId, TaskRef};

use tarq_iproto::mp::{marker_name, write, MpError, Reader};

/// Longest duration accepted for delay/ttl/ttr/timeout: a century, far beyond any real use,
/// and small enough that `now + duration` in microseconds can never overflow.
pub const MAX_SECONDS: f64 = 100.0 * 365.0 * 86_400.0;

/// The function names served.
pub const PUT: &str = "queue.put";
pub const TAKE: &str = "queue.take";
pub const ACK: &str = "queue.ack";
pub const RELEASE: &str = "queue.release";
pub const STATS: &str = "queue.stats";
/// The cluster as this node sees it (members, leader, term, each replica's lag).
pub const CLUSTER: &str = "queue.cluster";
/// Reserved for durability: answered by the journal, or "not defined" without one.
pub const SNAPSHOT: &str = "queue.snapshot";
/// A sharded cluster's move of a partition: `tarq.move(tube, partition, replica_set)`.
pub const MOVE: &str = "tarq.move";

/// A decoded call. `data` borrows the payload's raw bytes from the request.
#[derive(Debug, Clone, PartialEq)]
pub enum Call<'a> {
    Put {
        data: &'a [u8],
        opts: PutOptions,
    },
    /// `timeout` 0 answers at once.
    Take {
        timeout: Micros,
    },
    Ack {
        id: TaskId,
    },
    Release {
        id: TaskId,
        delay: Micros,
    },
    Stats,
    Snapshot,
    Move {
        tube: &'a str,
        partition: u16,
        to: &'a str,
    },
}

/// Why a call was refused before reaching the queue.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CallError {
    /// ER_NO_SUCH_PROC.
    #[error("Procedure '{0}' is not defined")]
    NoSuchProc(String),
    /// ER_PROC_LUA: a bad argument; the message names it.
    #[error("{0}")]
    BadArgs(String),
}

pub(super) fn bad(msg: impl Into<String>) -> CallError {
    CallError::BadArgs(msg.into())
}

pub(super) fn mp(what: &str, e: MpError) -> CallError {
    bad(format!("bad {what}: {e}"))
}

/// The MessagePack kind of the next value, for "got <kind>" messages.
pub(super) fn kind(r: &Reader<'_>) -> &'static str {
    r.peek_marker().map(marker_name).unwrap_or("nothing")
}

/// Decodes the args of `function` (a raw MessagePack array, validated by the codec).
pub fn parse<'a>(function: &str, args: &'a [u8]) -> Result<Call<'a>, CallError> {
    let mut r = Reader::new(args);
    let n = r.read_array_len().map_err(|e| mp("arguments", e))?;
    match function {
        PUT => parse_put(&mut r, n),
        TAKE => {
            let timeout = if n == 0 || r.eat_nil() {
                0
            } else {
                seconds(&mut r, "timeout", true)?
            };
            Ok(Call::Take { timeout })
        }
        ACK => Ok(Call::Ack {
            id: task_id(&mut r, n)?,
        }),
        RELEASE => {
            let id = task_id(&mut r, n)?;
            let mut delay = 0;
            if n >= 2 {
                read_options(&mut r, |name, r| match name {
                    "delay" => {
                        delay = duration(r, name, true)?;
                        Ok(())
                    }
                    _ => Err(bad(format!("unknown option '{name}'"))),
                })?;
            }
            Ok(Call::Release { id, delay })
        }
        STATS => Ok(Call::Stats),
        SNAPSHOT => Ok(Call::Snapshot),
        MOVE => parse_move(&mut r, n),
        other => Err(CallError::NoSuchProc(other.to_string())),
    }
}

/// `put(data[, {delay, ttl, ttr, pri}])`, `n` arguments.
#[inline]
fn parse_put<'a>(r: &mut Reader<'a>, n: u32) -> Result<Call<'a>, CallError> {
    // A missing payload is nil, as in the seed (`insert{id, status, runat, nil}`).
    let data: &'a [u8] = if n == 0 {
        &[0xc0]
    } else {
        r.skip_value().map_err(|e| mp("task data", e))?
    };
    let mut opts = PutOptions::default();
    if n >= 2 {
        read_options(r, |name, r| {
            match name {
                "delay" => opts.delay = duration(r, name, true)?,
                "ttl" => opts.ttl = Some(duration(r, name, false)?),
                "ttr" => opts.ttr = Some(duration(r, name, false)?),
                "pri" => opts.pri = priority(r)?,
                _ => return Err(bad(format!("unknown option '{name}'"))),
            }
            Ok(())
        })?;
    }
    Ok(Call::Put { data, opts })
}

/// `tarq.move(tube, partition, replica_set)`.
fn parse_move<'a>(r: &mut Reader<'a>, n: u32) -> Result<Call<'a>, CallError> {
    if n != 3 {
        return Err(bad(format!(
            "{MOVE} takes (tube, partition, replica_set), got {n} arguments"
        )));
    }
    let tube = r.read_str().map_err(|e| mp("tube name", e))?;
    let partition = r.read_uint().map_err(|e| mp("partition", e))?;
    let partition = u16::try_from(partition)
        .map_err(|_| bad(format!("partition {partition} is out of range")))?;
    let to = r.read_str().map_err(|e| mp("replica set", e))?;
    Ok(Call::Move {
        tube,
        partition,
        to,
    })
}

/// Reads an options argument: nil, an empty array (Lua's `{}`), or a map with string keys.
/// A nil value means the option is absent.
pub(super) fn read_options<'a>(
    r: &mut Reader<'a>,
    mut option: impl FnMut(&str, &mut Reader<'a>) -> Result<(), CallError>,
) -> Result<(), CallError> {
    if r.eat_nil() {
        return Ok(());
    }
    if let Ok(rmp::Marker::FixArray(0)) = r.peek_marker() {
        r.read_array_len().map_err(|e| mp("options", e))?;
        return Ok(());
    }
    let n = r
        .read_map_len()
        .map_err(|_| bad(format!("options must be a map, got {}", kind(r))))?;
    for _ in 0..n {
        let name = r
            .read_str()
            .map_err(|_| bad(format!("option names must be strings, got {}", kind(r))))?;
        if r.eat_nil() {
            continue;
        }
        option(name, r)?;
    }
    Ok(())
}

/// A number of seconds, finite, >= 0 (or > 0 when `zero_ok` is false), at most [`MAX_SECONDS`],
/// as microseconds.
pub(super) fn seconds(r: &mut Reader<'_>, name: &str, zero_ok: bool) -> Result<Micros, CallError> {
    let got = kind(r);
    let s = r
        .read_number()
        .map_err(|_| bad(format!("option '{name}' must be a number, got {got}")))?;
    let ok = s.is_finite() && (s > 0.0 || (zero_ok && s == 0.0));
    if !ok {
        let rel = if zero_ok { ">= 0" } else { "> 0" };
        return Err(bad(format!("option '{name}' must be {rel}, got {s}")));
    }
    if s > MAX_SECONDS {
        return Err(bad(format!(
            "option '{name}' is {s} seconds, the most is {MAX_SECONDS}"
        )));
    }
    Ok((s * 1e6).round() as Micros)
}

use seconds as duration;

pub(super) fn priority(r: &mut Reader<'_>) -> Result<i64, CallError> {
    let got = kind(r);
    r.read_int()
        .map_err(|_| bad(format!("option 'pri' must be an integer, got {got}")))
}

/// The task id argument: an integer or a decimal string, as the seed's `tonumber64` accepts.
pub(super) fn task_id(r: &mut Reader<'_>, n: u32) -> Result<TaskId, CallError> {
    if n == 0 || r.eat_nil() {
        return Err(bad("Task id required"));
    }
    use rmp::Marker as M;
    let got = kind(r);
    let wrong = || {
        bad(format!(
            "Task id must be an integer or a decimal string, got {got}"
        ))
    };
    match r.peek_marker() {
        Ok(M::FixStr(_) | M::Str8 | M::Str16 | M::Str32) => {
            let s = r.read_str().map_err(|e| mp("task id", e))?;
            s.trim().parse::<TaskId>().map_err(|_| {
                bad(format!(
                    "Task id must be an integer or a decimal string, got '{s}'"
                ))
            })
        }
        Ok(M::FixPos(_) | M::U8 | M::U16 | M::U32 | M::U64) => r.read_uint().map_err(|_| wrong()),
        Ok(M::FixNeg(_) | M::I8 | M::I16 | M::I32 | M::I64) => match r.read_int() {
            // A negative id names no task: answer as the seed would.
            Ok(v) if v < 0 => Err(bad(format!("Task {{{v}}} was not found"))),
            Ok(v) => Ok(v as TaskId),
            Err(_) => Err(wrong()),
        },
        _ => Err(wrong()),
    }
}

fn write_seconds(out: &mut Vec<u8>, micros: Micros) {
    write::f64(out, micros as f64 / 1e6);
}

/// A task as a map with string keys: id, status, runat (float seconds; 0 unless waiting), data
/// (the payload bytes exactly as received), then pri/ttl/ttr when the task has them.
pub fn write_task(out: &mut Vec<u8>, t: &TaskRef<'_>) {
    let extras = u32::from(t.pri != 0) + u32::from(t.ttl.is_some()) + u32::from(t.ttr.is_some());
    write::map_len(out, 4 + extras);
    write::str(out, "id");
    write::uint(out, t.id);
    write::str(out, "status");
    write::str(out, t.status.as_str());
    write::str(out, "runat");
    if t.status == Status::Waiting && t.runat != 0 {
        write_seconds(out, t.runat);
    } else {
        write::uint(out, 0);
    }
    write::str(out, "data");
    out.extend_from_slice(t.data);
    if t.pri != 0 {
        write::str(out, "pri");
        write::sint(out, t.pri);
    }
    if let Some(ttl) = t.ttl {
        write::str(out, "ttl");
        write_seconds(out, ttl);
    }
    if let Some(ttr) = t.ttr {
        write::str(out, "ttr");
        write_seconds(out, ttr);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(build: impl FnOnce(&mut Vec<u8>)) -> Vec<u8> {
        let mut v = Vec::new();
        build(&mut v);
        v
    }

    fn err(function: &str, a: &[u8]) -> String {
        parse(function, a).unwrap_err().to_string()
    }

    #[test]
    fn put_keeps_the_payload_bytes_and_reads_options() {
        let a = args(|o| {
            write::array_len(o, 2);
            o.extend_from_slice(&[0x92, 0x01, 0xa1, b'x']);
            write::map_len(o, 4);
            write::str(o, "delay");
            write::f64(o, 1.5);
            write::str(o, "ttl");
            write::uint(o, 10);
            write::str(o, "pri");
            write::sint(o, -3);
            write::str(o, "ttr");
            write::nil(o);
        });
        let call = parse(PUT, &a).unwrap();
        let want = PutOptions {
            delay: 1_500_000,
            ttl: Some(10_000_000),
            ttr: None,
            pri: -3,
        };
        assert_eq!(
            call,
            Call::Put {
                data: &[0x92, 0x01, 0xa1, b'x'],
                opts: want
            }
        );
        // Lua's empty table comes as an empty array.
        let call = parse(PUT, &[0x92, 0x01, 0x90]).unwrap();
        assert_eq!(
            call,
            Call::Put {
                data: &[0x01],
                opts: PutOptions::default()
            }
        );
    }

    #[test]
    fn option_errors_name_the_option() {
        let opt = |k: &str, v: &[u8]| {
            args(|o| {
                write::array_len(o, 2);
                write::uint(o, 1);
                write::map_len(o, 1);
                write::str(o, k);
                o.extend_from_slice(v);
            })
        };
        assert_eq!(err(PUT, &opt("foo", &[0x01])), "unknown option 'foo'");
        assert_eq!(
            err(PUT, &opt("delay", &[0xa1, b'x'])),
            "option 'delay' must be a number, got string"
        );
        assert_eq!(
            err(PUT, &opt("delay", &[0xff])),
            "option 'delay' must be >= 0, got -1"
        );
        assert_eq!(
            err(PUT, &opt("ttl", &[0x00])),
            "option 'ttl' must be > 0, got 0"
        );
        assert_eq!(
            err(PUT, &opt("pri", &[0xcb, 0x3f, 0xf8, 0, 0, 0, 0, 0, 0])),
            "option 'pri' must be an integer, got number"
        );
        assert!(err(PUT, &opt("delay", &[0xcb, 0x7f, 0xf0, 0, 0, 0, 0, 0, 0])).contains("'delay'"));
        assert_eq!(
            err(PUT, &[0x92, 0x01, 0x05]),
            "options must be a map, got unsigned"
        );
        assert_eq!(err(RELEASE, &opt("ttl", &[0x01])), "unknown option 'ttl'");
    }

    #[test]
    fn ids_are_ints_or_decimal_strings() {
        assert_eq!(parse(ACK, &[0x91, 0x07]).unwrap(), Call::Ack { id: 7 });
        assert_eq!(
            parse(ACK, &[0x91, 0xcf, 0, 0, 0, 0, 0, 0, 0, 9]).unwrap(),
            Call::Ack { id: 9 }
        );
        assert_eq!(
            parse(ACK, &[0x91, 0xa2, b'4', b'2']).unwrap(),
            Call::Ack { id: 42 }
        );
        assert_eq!(
            parse(
                ACK,
                &[0x91, 0xcf, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff]
            )
            .unwrap(),
            Call::Ack { id: u64::MAX }
        );
        assert_eq!(err(ACK, &[0x90]), "Task id required");
        assert_eq!(err(ACK, &[0x91, 0xc0]), "Task id required");
        assert_eq!(err(ACK, &[0x91, 0xff]), "Task {-1} was not found");
        assert_eq!(
            err(ACK, &[0x91, 0xa1, b'x']),
            "Task id must be an integer or a decimal string, got 'x'"
        );
        assert_eq!(
            err(ACK, &[0x91, 0x80]),
            "Task id must be an integer or a decimal string, got map"
        );
        assert_eq!(
            parse(
                RELEASE,
                &[0x92, 0x03, 0x81, 0xa5, b'd', b'e', b'l', b'a', b'y', 0x02]
            )
            .unwrap(),
            Call::Release {
                id: 3,
                delay: 2_000_000
            }
        );
    }

    #[test]
    fn take_timeout_and_unknown_functions() {
        assert_eq!(parse(TAKE, &[0x90]).unwrap(), Call::Take { timeout: 0 });
        assert_eq!(
            parse(TAKE, &[0x91, 0xc0]).unwrap(),
            Call::Take { timeout: 0 }
        );
        assert_eq!(
            parse(TAKE, &[0x91, 0x02]).unwrap(),
            Call::Take { timeout: 2_000_000 }
        );
        assert_eq!(
            err(TAKE, &[0x91, 0xa1, b'x']),
            "option 'timeout' must be a number, got string"
        );
        assert_eq!(
            err("queue.nope", &[0x90]),
            "Procedure 'queue.nope' is not defined"
        );
    }

    #[test]
    fn tasks_encode_as_string_keyed_maps() {
        let t = TaskRef {
            id: 1,
            status: Status::Ready,
            runat: 0,
            pri: 0,
            ttl: None,
            ttr: None,
            created: 5,
            owner: None,
            data: &[0x91, 0xa5, b'h', b'e', b'l', b'l', b'o'],
            tube: 0,
            deliveries: 0,
            utube: None,
            counts: Default::default(),
        };
        let mut out = Vec::new();
        write_task(&mut out, &t);
        let v = rmpv::decode::read_value(&mut &out[..]).unwrap();
        assert_eq!(
            v.to_string(),
            r#"{"id": 1, "status": "R", "runat": 0, "data": ["hello"]}"#
        );
        let w = TaskRef {
            status: Status::Waiting,
            runat: 2_500_000,
            pri: 2,
            ttr: Some(1_000_000),
            ..t
        };
        out.clear();
        write_task(&mut out, &w);
        let v = rmpv::decode::read_value(&mut &out[..]).unwrap();
        assert_eq!(
            v.to_string(),
            r#"{"id": 1, "status": "W", "runat": 2.5, "data": ["hello"], "pri": 2, "ttr": 1}"#
        );
        let ttr = &v.as_map().unwrap()[5].1;
        assert!(
            matches!(ttr, rmpv::Value::F64(x) if *x == 1.0),
            "seconds are floats: {ttr:?}"
        );
    }
}
