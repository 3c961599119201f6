//! The tarantool/queue 1.5.0 API as it arrives over IPROTO: `<ns>.create_tube`,
//! `<ns>.tube.<name>:<method>` (the colon form Lua, Python and Go clients send: the caller's
//! arguments are the method's), `<ns>.statistics`, `<ns>.identify`, `<ns>.cfg` and
//! `<ns>.state`, where `<ns>` is the configured namespace (`queue`, or `box.queue`). This file
//! decodes a call's raw args into a [`TubeCall`] and encodes what the original answers: a task
//! as the tuple `[id, status letter, data]`, statistics as its nested map. Resolving tube names
//! and executing are the loop's.

use tarq_engine::{
    Micros, ReleaseOptions, Stats, Status, TaskId, TaskRef, TubeInfo, TubeIx, TubeOptions, TubePut,
    TubeType,
};
use tarq_iproto::mp::{write, Reader};

use super::calls::{self, bad, kind, mp, read_options, seconds, task_id, CallError};
use super::tostring::{self, NumberText};

/// Most items one `put_many`, `take_many` or `ack_many` handles.
pub const MAX_BATCH: u32 = 10_000;

/// The original's default TTL (and TTR) of a `*ttl` tube: 100 years, which it treats as none.
const FOREVER_SECONDS: f64 = 3_153_600_000.0;

/// A decoded call of the tube API. Strings and payloads borrow the request.
#[derive(Debug, Clone, PartialEq)]
pub enum TubeCall<'a> {
    CreateTube {
        name: &'a str,
        kind: TubeType,
        opts: TubeOptions,
        if_not_exists: bool,
        partitions: u16,
    },
    Method {
        tube: &'a str,
        method: Method<'a>,
    },
    /// `None`: every tube.
    Statistics {
        tube: Option<&'a str>,
    },
    /// `None`: the connection's own session.
    Identify {
        uuid: Option<&'a [u8]>,
    },
    /// `queue.cfg{ttr = N, in_replicaset = B}`: how long a disconnected session keeps its
    /// tasks; whether temporary tubes are refused (false unless given, on every call, as the
    /// original resets it).
    Cfg {
        ttr: Option<Micros>,
        in_replicaset: bool,
    },
    State,
}

/// A method of `queue.tube.<name>`.
#[derive(Debug, Clone, PartialEq)]
pub enum Method<'a> {
    /// `wait`: how long a put into a full limfifottl tube waits for room (`opts.timeout`).
    Put {
        data: &'a [u8],
        opts: TubePut<'a>,
        wait: Micros,
    },
    /// `None`: wait without end (no argument).
    Take {
        timeout: Option<Micros>,
    },
    /// `delta` `None`: nil, zero or negative, answered with nothing and no check at all (the
    /// original returns before looking at the task). `Some(None)`: past a century, no TTL or
    /// TTR from now on.
    Touch {
        id: TaskId,
        delta: Option<Option<Micros>>,
    },
    Ack {
        id: TaskId,
    },
    Release {
        id: TaskId,
        opts: ReleaseOptions,
    },
    Peek {
        id: TaskId,
    },
    Bury {
        id: TaskId,
    },
    /// Negative counts are answered as given and change nothing (the original's no-op).
    Kick {
        count: i64,
    },
    Delete {
        id: TaskId,
    },
    Drop,
    Truncate,
    ReleaseAll,
    /// Several puts with the same options, in one round trip and one WAL batch.
    PutMany {
        items: Vec<&'a [u8]>,
        opts: TubePut<'a>,
    },
    /// Up to `n` ready tasks at once; with none ready, a take of one waiting up to `timeout`.
    TakeMany {
        n: u32,
        timeout: Option<Micros>,
    },
    AckMany {
        ids: Vec<TaskId>,
    },
}

/// A function name of the tube API, split; its args are decoded by [`method`] or
/// [`module_call`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Name<'a> {
    /// `<ns>.tube.<tube>:<method>`.
    Method { tube: &'a str, method: &'a str },
    /// `<ns>.<call>`: the module's own calls (`create_tube`, `statistics`, ...).
    Module(&'a str),
}

/// Splits `function` if it belongs to the tube API under namespace `ns`; `None` leaves it to
/// the seed API. Deciding that allocates nothing, so the seed's hot path stays free of
/// allocations.
pub fn split<'a>(ns: &str, function: &'a str) -> Option<Result<Name<'a>, CallError>> {
    let rest = function.strip_prefix(ns)?.strip_prefix('.')?;
    if let Some(path) = rest.strip_prefix("tube.") {
        // The last ':' (a tube name may hold one): ASCII, so a byte search splits the str.
        let Some(colon) = path.bytes().rposition(|b| b == b':') else {
            return Some(Err(bad(format!(
                "'{function}': call a tube's methods in the colon form, \
                 {ns}.tube.<name>:<method>"
            ))));
        };
        let (tube, method) = (&path[..colon], &path[colon + 1..]);
        return Some(Ok(Name::Method { tube, method }));
    }
    is_api_name(rest).then_some(Ok(Name::Module(rest)))
}

/// Decodes `function` if it belongs to the tube API under namespace `ns`; `None` leaves it to
/// the seed API. (The loop splits the name first and resolves the tube before it decodes a
/// method's args; this is the whole decoding in one step.)
pub fn parse<'a>(
    ns: &str,
    function: &'a str,
    args: &'a [u8],
    key: &'a mut NumberText,
) -> Option<Result<TubeCall<'a>, CallError>> {
    Some(match split(ns, function)? {
        Ok(Name::Method { tube, method: name }) => {
            method(function, name, args, key).map(|method| TubeCall::Method { tube, method })
        }
        Ok(Name::Module(call)) => module_call(function, call, args),
        Err(e) => Err(e),
    })
}

/// The args of method `name` (of `function`, named in the error of a method the API does not
/// have). A put's utube key that is a number is written into `key` as the original's text.
#[inline]
pub fn method<'a>(
    function: &str,
    name: &str,
    args: &'a [u8],
    key: &'a mut NumberText,
) -> Result<Method<'a>, CallError> {
    let mut r = Reader::new(args);
    let n = r.read_array_len().map_err(|e| mp("arguments", e))?;
    method_args(name, &mut r, n, key)?.ok_or_else(|| CallError::NoSuchProc(function.to_string()))
}

/// The args of the module's call `call` (of `function`).
pub fn module_call<'a>(
    function: &str,
    call: &str,
    args: &'a [u8],
) -> Result<TubeCall<'a>, CallError> {
    let mut r = Reader::new(args);
    let n = r.read_array_len().map_err(|e| mp("arguments", e))?;
    Ok(match call {
        "create_tube" => create_tube(&mut r, n)?,
        "statistics" => TubeCall::Statistics {
            tube: optional_str(&mut r, n, "tube name")?,
        },
        "identify" => TubeCall::Identify {
            uuid: if n == 0 || r.eat_nil() {
                None
            } else {
                Some(
                    r.read_str_or_bin()
                        .map_err(|_| bad("Invalid UUID format."))?,
                )
            },
        },
        "cfg" => cfg(&mut r, n)?,
        "state" => TubeCall::State,
        _ => return Err(CallError::NoSuchProc(function.to_string())),
    })
}

fn is_api_name(rest: &str) -> bool {
    matches!(
        rest,
        "create_tube" | "statistics" | "identify" | "cfg" | "state"
    )
}

fn optional_str<'a>(r: &mut Reader<'a>, n: u32, what: &str) -> Result<Option<&'a str>, CallError> {
    if n == 0 || r.eat_nil() {
        return Ok(None);
    }
    let got = kind(r);
    r.read_str()
        .map(Some)
        .map_err(|_| bad(format!("{what} must be a string, got {got}")))
}

fn create_tube<'a>(r: &mut Reader<'a>, n: u32) -> Result<TubeCall<'a>, CallError> {
    let name = optional_str(r, n, "tube name")?.ok_or_else(|| bad("tube name required"))?;
    // An empty Lua table goes as an empty array.
    if n >= 2 && r.peek_marker().is_ok_and(is_options) {
        return sharded_queue_create(r, name);
    }
    let kind = match optional_str(r, n.saturating_sub(1), "tube type")? {
        Some(t) => TubeType::parse(t)
            .map_err(|e| bad(super::errors::text(super::Style::Tube, 0, 0, &e)))?,
        None => return Err(bad("Unknown tube type nil")),
    };
    let mut create = Create::new(name, kind, false);
    if n >= 3 {
        read_options(r, |option, r| create.option(option, r))?;
    }
    create.done()
}

fn is_options(m: rmp::Marker) -> bool {
    matches!(
        m,
        rmp::Marker::FixMap(_) | rmp::Marker::Map16 | rmp::Marker::Map32 | rmp::Marker::FixArray(0)
    )
}

/// tarantool/sharded-queue's `queue.create_tube(name, options)`: the type is the `driver`
/// option (its two drivers; `sharded_queue.drivers.fifottl` when none is named), and a tube
/// that exists already is answered as it is, not refused, as that API does (its applications
/// create their tubes at every start). Its take's polling options (`wait_factor`,
/// `wait_max`) are checked as it checks them and have nothing to tune here: a waiting take is
/// woken by the put. `release_limit` and `release_limit_policy` are refused: tarq would
/// neither delete nor move the task, and a client counting on that must not be told it will.
fn sharded_queue_create<'a>(r: &mut Reader<'a>, name: &'a str) -> Result<TubeCall<'a>, CallError> {
    let mut create = Create::new(name, TubeType::FifoTtl, true);
    let mut pri_given = false;
    read_options(r, |option, r| {
        match option {
            "driver" => {
                let got = kind(r);
                let driver = r.read_str().map_err(|_| {
                    bad(format!(
                        "Driver name must be a valid module name for tube {name}, got {got}"
                    ))
                })?;
                create.kind = match driver {
                    "sharded_queue.drivers.fifottl" => TubeType::FifoTtl,
                    "sharded_queue.drivers.fifo" => TubeType::Fifo,
                    other => {
                        return Err(bad(format!(
                            "Driver {other} could not be loaded for tube {name}"
                        )))
                    }
                };
            }
            "wait_factor" => {
                if !r.read_number().is_ok_and(|f| f >= 1.0) {
                    return Err(bad("wait_factor must be number greater than or equal to 1"));
                }
            }
            "wait_max" => {
                if !r.read_number().is_ok_and(|m| m > 0.0) {
                    return Err(bad("wait_max must be number greater than 0"));
                }
            }
            "log_request" => {
                flag(r, option).map_err(|_| bad("log_request must be boolean"))?;
            }
            "release_limit" | "release_limit_policy" => {
                return Err(bad(format!(
                    "option '{option}' is not supported (tarq's max_deliveries buries a task \
                     taken that many times)"
                )))
            }
            // Its name for the tube's default priority; `pri` wins when both are given.
            "priority" if pri_given => {
                r.skip_value().map_err(|e| mp(option, e))?;
            }
            "priority" | "pri" => {
                pri_given |= option == "pri";
                create.option("pri", r)?
            }
            _ => create.option(option, r)?,
        }
        Ok(())
    })?;
    create.done()
}

/// A `create_tube` as its options are read.
struct Create<'a> {
    name: &'a str,
    kind: TubeType,
    opts: TubeOptions,
    if_not_exists: bool,
    partitions: u16,
    vinyl: bool,
}

impl<'a> Create<'a> {
    fn new(name: &'a str, kind: TubeType, if_not_exists: bool) -> Create<'a> {
        Create {
            name,
            kind,
            opts: TubeOptions::default(),
            if_not_exists,
            partitions: 1,
            vinyl: false,
        }
    }

    /// Reads option `name`; what the original does not know is skipped, as its driver
    /// ignores it.
    fn option(&mut self, name: &str, r: &mut Reader<'_>) -> Result<(), CallError> {
        let opts = &mut self.opts;
        match name {
            "ttl" => opts.ttl = forever_is_none(seconds(r, name, false)?),
            "ttr" => opts.ttr = forever_is_none(seconds(r, name, false)?),
            "pri" => opts.pri = calls::priority(r)?,
            "capacity" => opts.capacity = count(r, name)?,
            "max_deliveries" => {
                opts.max_deliveries = u16::try_from(count(r, name)?)
                    .map_err(|_| bad("option 'max_deliveries' is at most 65535"))?
            }
            "dedup_window" => opts.dedup_window = seconds(r, name, true)?,
            "temporary" => opts.temporary = flag(r, name)?,
            "if_not_exists" => self.if_not_exists = flag(r, name)?,
            "partitions" => {
                self.partitions = u16::try_from(count(r, name)?)
                    .ok()
                    .filter(|&n| n >= 1)
                    .ok_or_else(|| bad("option 'partitions' is 1 to 65535"))?
            }
            "engine" => self.vinyl = r.read_str().is_ok_and(|e| e == "vinyl"),
            _ => {
                r.skip_value().map_err(|e| mp(name, e))?;
            }
        }
        Ok(())
    }

    fn done(self) -> Result<TubeCall<'a>, CallError> {
        if self.vinyl && self.kind == TubeType::LimFifoTtl {
            return Err(bad("limfifottl queue does not support vinyl engine"));
        }
        Ok(TubeCall::CreateTube {
            name: self.name,
            kind: self.kind,
            opts: self.opts,
            if_not_exists: self.if_not_exists,
            partitions: self.partitions,
        })
    }
}

/// The original's "forever" (100 years and more) is no limit at all.
fn forever_is_none(micros: Micros) -> Option<Micros> {
    (micros as f64 / 1e6 < FOREVER_SECONDS).then_some(micros)
}

fn count(r: &mut Reader<'_>, name: &str) -> Result<u64, CallError> {
    let got = kind(r);
    r.read_uint().map_err(|_| {
        bad(format!(
            "option '{name}' must be a non-negative integer, got {got}"
        ))
    })
}

fn flag(r: &mut Reader<'_>, name: &str) -> Result<bool, CallError> {
    use rmp::Marker as M;
    match r.peek_marker() {
        Ok(M::True) => {
            r.skip_value().map_err(|e| mp(name, e))?;
            Ok(true)
        }
        Ok(M::False) => {
            r.skip_value().map_err(|e| mp(name, e))?;
            Ok(false)
        }
        _ => Err(bad(format!(
            "option '{name}' must be a boolean, got {}",
            kind(r)
        ))),
    }
}

fn cfg<'a>(r: &mut Reader<'a>, n: u32) -> Result<TubeCall<'a>, CallError> {
    let mut ttr = None;
    let mut in_replicaset = false;
    if n >= 1 {
        read_options(r, |name, r| {
            match name {
                "ttr" => {
                    let got = kind(r);
                    let s = r
                        .read_number()
                        .map_err(|_| bad(format!("Invalid value of ttr: {got}")))?;
                    if !s.is_finite() || s < 0.0 {
                        return Err(bad(format!("Invalid value of ttr: {s}")));
                    }
                    ttr = Some((s.min(calls::MAX_SECONDS) * 1e6).round() as Micros);
                }
                "in_replicaset" => {
                    let value = r.skip_value().map_err(|e| mp(name, e))?;
                    in_replicaset = match value {
                        [0xc3] => true,
                        [0xc2] => false,
                        _ => {
                            let mut room = NumberText::default();
                            let text = tostring::scalar(value, &mut room).map_or_else(
                                || kind(&Reader::new(value)).to_string(),
                                |t| String::from_utf8_lossy(t).into_owned(),
                            );
                            return Err(bad(format!("Invalid value of in_replicaset: {text}")));
                        }
                    };
                }
                other => return Err(bad(format!("Unknown option {other}"))),
            }
            Ok(())
        })?;
    }
    Ok(TubeCall::Cfg { ttr, in_replicaset })
}

/// The args of a method; `None` for a method the API does not have.
#[inline]
fn method_args<'a>(
    method: &str,
    r: &mut Reader<'a>,
    n: u32,
    key: &'a mut NumberText,
) -> Result<Option<Method<'a>>, CallError> {
    let id = |r: &mut Reader<'_>| task_id(r, n);
    Ok(Some(match method {
        "put" => put(r, n, key)?,
        "take" => Method::Take {
            timeout: take_timeout(r, n)?,
        },
        "touch" => {
            let id = id(r)?;
            Method::Touch {
                id,
                delta: touch_delta(r, n)?,
            }
        }
        "ack" => Method::Ack { id: id(r)? },
        "release" => {
            let id = id(r)?;
            Method::Release {
                id,
                opts: release_opts(r, n)?,
            }
        }
        "peek" => Method::Peek { id: id(r)? },
        "bury" => Method::Bury { id: id(r)? },
        "delete" => Method::Delete { id: id(r)? },
        "kick" => Method::Kick {
            count: if n == 0 || r.eat_nil() {
                1
            } else {
                let got = kind(r);
                r.read_int()
                    .map_err(|_| bad(format!("kick count must be an integer, got {got}")))?
            },
        },
        "put_many" => put_many(r, n, key)?,
        "take_many" => {
            let got = kind(r);
            let count = if n == 0 {
                Err(())
            } else {
                r.read_uint().map_err(|_| ())
            };
            let n_tasks = count
                .ok()
                .filter(|c| (1..=u64::from(MAX_BATCH)).contains(c))
                .ok_or_else(|| {
                    bad(format!(
                        "take_many needs a count from 1 to {MAX_BATCH}, got {got}"
                    ))
                })?;
            Method::TakeMany {
                n: n_tasks as u32,
                timeout: take_timeout(r, n.saturating_sub(1))?,
            }
        }
        "ack_many" => Method::AckMany {
            ids: batch(r, n, "ack_many", |r| task_id(r, 1))?,
        },
        "drop" => Method::Drop,
        "truncate" => Method::Truncate,
        "release_all" => Method::ReleaseAll,
        _ => return Ok(None),
    }))
}

/// The array argument of a batch call, each element read by `item`.
fn batch<'a, T>(
    r: &mut Reader<'a>,
    n: u32,
    call: &str,
    mut item: impl FnMut(&mut Reader<'a>) -> Result<T, CallError>,
) -> Result<Vec<T>, CallError> {
    let got = kind(r);
    let len = if n == 0 {
        None
    } else {
        r.read_array_len().ok()
    };
    let len = len.ok_or_else(|| bad(format!("{call} needs an array, got {got}")))?;
    if len > MAX_BATCH {
        return Err(bad(format!(
            "{call} of {len} items: the most is {MAX_BATCH}"
        )));
    }
    (0..len).map(|_| item(r)).collect()
}

fn put_many<'a>(
    r: &mut Reader<'a>,
    n: u32,
    key: &'a mut NumberText,
) -> Result<Method<'a>, CallError> {
    let items = batch(r, n, "put_many", |r| {
        r.skip_value().map_err(|e| mp("task data", e))
    })?;
    // The options are put's; a batch never waits for room.
    let Method::Put { opts, .. } = put_options(&[0xc0], r, n, key)? else {
        unreachable!("put_options makes a Put")
    };
    Ok(Method::PutMany { items, opts })
}

#[inline]
fn put<'a>(r: &mut Reader<'a>, n: u32, key: &'a mut NumberText) -> Result<Method<'a>, CallError> {
    if n == 0 {
        return Err(bad(
            "put needs the task data (nil is data; no argument is not)",
        ));
    }
    let data = r.skip_value().map_err(|e| mp("task data", e))?;
    put_options(data, r, n, key)
}

/// The options of a put (the argument after the data, of `n`) around `data`; `key` holds the
/// text of a numeric utube key.
fn put_options<'a>(
    data: &'a [u8],
    r: &mut Reader<'a>,
    n: u32,
    key: &'a mut NumberText,
) -> Result<Method<'a>, CallError> {
    let mut opts = TubePut::default();
    let mut wait = 0;
    let mut utube = None;
    if n >= 2 {
        read_options(r, |name, r| {
            match name {
                "delay" => opts.delay = seconds(r, name, true)?,
                "ttl" => opts.ttl = Some(seconds(r, name, false)?),
                "ttr" => opts.ttr = Some(seconds(r, name, false)?),
                "pri" => opts.pri = Some(calls::priority(r)?),
                "utube" => utube = Some(r.skip_value().map_err(|e| mp(name, e))?),
                "timeout" => wait = seconds(r, name, true)?,
                "dedup_key" => {
                    opts.dedup_key = Some(
                        r.read_str_or_bin()
                            .map_err(|_| bad("option 'dedup_key' must be a string"))?,
                    )
                }
                // Options a type has no use for are ignored, as the original does.
                _ => {
                    r.skip_value().map_err(|e| mp(name, e))?;
                }
            }
            Ok(())
        })?;
    }
    // The last value given wins, as in a Lua table; it is read once the map is done, so
    // `key` is written once.
    if let Some(value) = utube {
        opts.utube = utube_key(value, key)?;
    }
    Ok(Method::Put { data, opts, wait })
}

/// The utube key as the original's `tostring(opts.utube)` makes it from any scalar: strings
/// as they are, numbers and booleans in their Lua text (`1` and `'1'` name one utube).
fn utube_key<'a>(value: &'a [u8], key: &'a mut NumberText) -> Result<&'a [u8], CallError> {
    tostring::scalar(value, key).ok_or_else(|| {
        bad(format!(
            "option 'utube' must be a string, a number or a boolean, got {}",
            kind(&Reader::new(value))
        ))
    })
}

#[inline]
fn take_timeout(r: &mut Reader<'_>, n: u32) -> Result<Option<Micros>, CallError> {
    if n == 0 || r.eat_nil() {
        return Ok(None);
    }
    let got = kind(r);
    let s = r
        .read_number()
        .map_err(|_| bad(format!("take timeout must be a number, got {got}")))?;
    if s.is_nan() {
        return Err(bad("take timeout must be a number, got NaN"));
    }
    Ok(Some(
        (s.clamp(0.0, calls::MAX_SECONDS) * 1e6).round() as Micros
    ))
}

fn touch_delta(r: &mut Reader<'_>, n: u32) -> Result<Option<Option<Micros>>, CallError> {
    if n < 2 || r.eat_nil() {
        return Ok(None);
    }
    let got = kind(r);
    let s = r
        .read_number()
        .map_err(|_| bad(format!("touch delta must be a number, got {got}")))?;
    if s.is_nan() || s <= 0.0 {
        return Ok(None);
    }
    Ok(Some((s < FOREVER_SECONDS).then(|| {
        (s.min(calls::MAX_SECONDS) * 1e6).round() as Micros
    })))
}

fn release_opts(r: &mut Reader<'_>, n: u32) -> Result<ReleaseOptions, CallError> {
    let mut opts = ReleaseOptions::default();
    if n >= 2 {
        read_options(r, |name, r| {
            match name {
                "delay" => opts.delay = seconds(r, name, true)?,
                "pri" => opts.pri = Some(calls::priority(r)?),
                "ttl" => opts.ttl = Some(seconds(r, name, false)?),
                _ => {
                    r.skip_value().map_err(|e| mp(name, e))?;
                }
            }
            Ok(())
        })?;
    }
    Ok(opts)
}

/// The original's one-letter statuses.
pub fn status_letter(s: Status) -> &'static str {
    match s {
        Status::Ready => "r",
        Status::Taken => "t",
        Status::Waiting => "~",
        Status::Buried => "!",
    }
}

/// A task as the original's tuple `[id, status, data]`, the id its number in `tube`, whose
/// first task got number `first` (`tarq_engine::number_from`); `done` writes the `-` of an
/// acked or deleted task.
pub fn write_task(out: &mut Vec<u8>, t: &TaskRef<'_>, tube: TubeIx, first: u64, done: bool) {
    write::array_len(out, 3);
    write::uint(out, tarq_engine::number_from(tube, first, t.id));
    write::str(out, if done { "-" } else { status_letter(t.status) });
    out.extend_from_slice(t.data);
}

/// One tube's `statistics`: `{tasks = {...}, calls = {...}}`, every key present.
/// `queue.statistics()`: each tube's figures by name, or an empty array (an empty Lua table,
/// as the original sends it) when there is none.
pub fn write_all_stats(out: &mut Vec<u8>, all: &[(String, Stats)]) {
    if all.is_empty() {
        return write::array_len(out, 0);
    }
    write::map_len(out, all.len() as u32);
    for (name, stats) in all {
        write::str(out, name);
        write_stats(out, stats);
    }
}

pub fn write_stats(out: &mut Vec<u8>, s: &Stats) {
    let pairs = |out: &mut Vec<u8>, kv: &[(&str, u64)]| {
        write::map_len(out, kv.len() as u32);
        for (k, v) in kv {
            write::str(out, k);
            write::uint(out, *v);
        }
    };
    // The original's two keys, then tarq's: the consumers, the head's age, the idle mark.
    write::map_len(out, 5);
    write::str(out, "tasks");
    pairs(
        out,
        &[
            ("ready", s.ready),
            ("taken", s.taken),
            ("done", s.acks + s.deletes + s.expired),
            ("buried", s.buried),
            ("delayed", s.waiting),
            ("total", s.total),
        ],
    );
    write::str(out, "calls");
    pairs(
        out,
        &[
            ("put", s.puts),
            ("take", s.takes),
            ("ack", s.acks),
            ("release", s.releases + s.auto_released),
            ("bury", s.buries),
            ("kick", s.kicks),
            ("delete", s.deletes + s.expired),
            ("touch", s.touches),
            ("ttl", s.expired),
            ("ttr", s.ttr_returned),
            ("delay", s.promoted),
        ],
    );
    write::str(out, "consumers");
    pairs(
        out,
        &[("waiting", s.takers_waiting), ("holding", s.takers_holding)],
    );
    write::str(out, "oldest_ready_age");
    write::f64(out, oldest_ready_age(s));
    write::str(out, "idle");
    write::bool(out, is_idle(s));
}

/// Seconds the ready task a take gets next has waited since it was put (0 while none is
/// ready), by this machine's clock: `ready_since` is the queue's clock, the wall clock.
pub fn oldest_ready_age(s: &Stats) -> f64 {
    if s.ready_since == 0 {
        return 0.0;
    }
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as u64);
    now.saturating_sub(s.ready_since) as f64 / 1e6
}

/// A tube no one consumes: tasks ready, and no take waiting nor any session holding one.
pub fn is_idle(s: &Stats) -> bool {
    s.ready > 0 && s.takers_waiting == 0 && s.takers_holding == 0
}

/// What `create_tube` returns: `{name, type, opts}` (the original's tube object holds
/// functions, which cannot cross the wire).
pub fn write_tube(out: &mut Vec<u8>, t: &TubeInfo<'_>) {
    let o = &t.opts;
    let secs = |m: Option<Micros>| m.map_or(FOREVER_SECONDS, |m| m as f64 / 1e6);
    write::map_len(out, 3);
    write::str(out, "name");
    write::str(out, t.name);
    write::str(out, "type");
    write::str(out, t.kind.as_str());
    write::str(out, "opts");
    write::map_len(out, 7);
    write::str(out, "ttl");
    write::f64(out, secs(o.ttl));
    write::str(out, "ttr");
    write::f64(out, secs(o.ttr));
    write::str(out, "pri");
    write::sint(out, o.pri);
    write::str(out, "capacity");
    write::uint(out, o.capacity);
    write::str(out, "max_deliveries");
    write::uint(out, u64::from(o.max_deliveries));
    write::str(out, "dedup_window");
    write::f64(out, o.dedup_window as f64 / 1e6);
    write::str(out, "temporary");
    write::bool(out, o.temporary);
}

/// A session's UUID in the text form the original's errors show: Tarantool reads the first
/// three fields of the 16 bytes as little-endian integers (`tt_uuid`), the rest as they are.
pub fn uuid_text(u: &[u8; 16]) -> String {
    let hex = |b: &[u8]| b.iter().map(|b| format!("{b:02x}")).collect::<String>();
    let rev = |b: &[u8]| hex(&b.iter().rev().copied().collect::<Vec<_>>());
    format!(
        "{}-{}-{}-{}-{}",
        rev(&u[..4]),
        rev(&u[4..6]),
        rev(&u[6..8]),
        hex(&u[8..10]),
        hex(&u[10..])
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Room for a numeric utube key that lives as long as the test.
    fn key() -> &'static mut NumberText {
        Box::leak(Box::default())
    }

    fn args(build: impl FnOnce(&mut Vec<u8>)) -> Vec<u8> {
        let mut v = Vec::new();
        build(&mut v);
        v
    }

    #[test]
    fn the_colon_form_names_the_tube_and_the_method() {
        let a = args(|o| {
            write::array_len(o, 2);
            write::str(o, "hello");
            write::map_len(o, 2);
            write::str(o, "utube");
            write::str(o, "u1");
            write::str(o, "pri");
            write::sint(o, -3);
        });
        let call = parse("queue", "queue.tube.jobs:put", &a, key())
            .unwrap()
            .unwrap();
        let TubeCall::Method {
            tube,
            method: Method::Put { data, opts, wait },
        } = call
        else {
            panic!("{call:?}")
        };
        assert_eq!(
            (tube, data, opts.utube, opts.pri, wait),
            ("jobs", &a[1..7], &b"u1"[..], Some(-3), 0)
        );
        // Another namespace, as some clients use.
        let none = args(|o| write::array_len(o, 0));
        assert!(matches!(
            parse("box.queue", "box.queue.tube.a.b:take", &none, key()),
            Some(Ok(TubeCall::Method {
                tube: "a.b",
                method: Method::Take { timeout: None }
            }))
        ));
        assert!(parse("box.queue", "queue.tube.a:take", &none, key()).is_none());
    }

    #[test]
    fn a_utube_key_is_the_text_of_any_scalar_and_the_last_given_wins() {
        fn utube(a: &[u8]) -> Result<Vec<u8>, String> {
            match parse("queue", "queue.tube.u:put", a, key()).unwrap() {
                Ok(TubeCall::Method {
                    method: Method::Put { opts, .. },
                    ..
                }) => Ok(opts.utube.to_vec()),
                Ok(other) => panic!("{other:?}"),
                Err(e) => Err(e.to_string()),
            }
        }
        let put = |value: &dyn Fn(&mut Vec<u8>)| {
            args(|o| {
                write::array_len(o, 2);
                write::str(o, "x");
                write::map_len(o, 1);
                write::str(o, "utube");
                value(o);
            })
        };
        assert_eq!(utube(&put(&|o| write::uint(o, 1))), Ok(b"1".to_vec()));
        assert_eq!(utube(&put(&|o| write::sint(o, -5))), Ok(b"-5".to_vec()));
        assert_eq!(utube(&put(&|o| write::f64(o, 1.0))), Ok(b"1".to_vec()));
        assert_eq!(utube(&put(&|o| write::f64(o, 1.5))), Ok(b"1.5".to_vec()));
        assert_eq!(utube(&put(&|o| write::str(o, "1"))), Ok(b"1".to_vec()));
        assert_eq!(utube(&put(&|o| write::bool(o, true))), Ok(b"true".to_vec()));
        assert_eq!(
            utube(&put(&|o| write::array_len(o, 0))),
            Err("option 'utube' must be a string, a number or a boolean, got array".into())
        );
        let twice = args(|o| {
            write::array_len(o, 2);
            write::str(o, "x");
            write::map_len(o, 2);
            write::str(o, "utube");
            write::uint(o, 7);
            write::str(o, "utube");
            write::sint(o, -8);
        });
        assert_eq!(utube(&twice), Ok(b"-8".to_vec()));
        // put_many shares one key among its items.
        let many = args(|o| {
            write::array_len(o, 2);
            write::array_len(o, 1);
            write::str(o, "x");
            write::map_len(o, 1);
            write::str(o, "utube");
            write::uint(o, 42);
        });
        let Ok(TubeCall::Method {
            method: Method::PutMany { opts, .. },
            ..
        }) = parse("queue", "queue.tube.u:put_many", &many, key()).unwrap()
        else {
            panic!()
        };
        assert_eq!(opts.utube, b"42");
    }

    #[test]
    fn unknown_methods_and_the_dot_form_are_refused_with_what_to_do() {
        let none = args(|o| write::array_len(o, 0));
        assert_eq!(
            parse("queue", "queue.tube.q:fly", &none, key())
                .unwrap()
                .unwrap_err()
                .to_string(),
            "Procedure 'queue.tube.q:fly' is not defined"
        );
        let dot = parse("queue", "queue.tube.q.put", &none, key())
            .unwrap()
            .unwrap_err();
        assert!(dot.to_string().contains("colon form"), "{dot}");
        // The seed's names are left to the seed.
        assert!(parse("queue", "queue.put", &none, key()).is_none());
        assert!(parse("queue", "queue.stats", &none, key()).is_none());
    }

    #[test]
    fn take_touch_and_kick_read_their_arguments_as_the_original() {
        let none = args(|o| write::array_len(o, 0));
        fn t(a: &[u8]) -> TubeCall<'_> {
            parse("queue", "queue.tube.q:take", a, key())
                .unwrap()
                .unwrap()
        }
        assert!(matches!(
            t(&none),
            TubeCall::Method {
                method: Method::Take { timeout: None },
                ..
            }
        ));
        let neg = args(|o| {
            write::array_len(o, 1);
            write::f64(o, -1.0);
        });
        assert!(matches!(
            t(&neg),
            TubeCall::Method {
                method: Method::Take { timeout: Some(0) },
                ..
            }
        ));
        let touch0 = args(|o| {
            write::array_len(o, 2);
            write::uint(o, 5);
            write::uint(o, 0);
        });
        assert!(matches!(
            parse("queue", "queue.tube.q:touch", &touch0, key())
                .unwrap()
                .unwrap(),
            TubeCall::Method {
                method: Method::Touch { id: 5, delta: None },
                ..
            }
        ));
        assert!(matches!(
            parse("queue", "queue.tube.q:kick", &none, key())
                .unwrap()
                .unwrap(),
            TubeCall::Method {
                method: Method::Kick { count: 1 },
                ..
            }
        ));
    }

    #[test]
    fn create_tube_reads_type_and_options_and_names_what_is_wrong() {
        let a = args(|o| {
            write::array_len(o, 3);
            write::str(o, "q");
            write::str(o, "fifottl");
            write::map_len(o, 3);
            write::str(o, "ttl");
            write::uint(o, 60);
            write::str(o, "if_not_exists");
            write::bool(o, true);
            write::str(o, "engine");
            write::str(o, "memtx");
        });
        let TubeCall::CreateTube {
            name,
            kind,
            opts,
            if_not_exists,
            ..
        } = parse("queue", "queue.create_tube", &a, key())
            .unwrap()
            .unwrap()
        else {
            panic!()
        };
        assert_eq!(
            (name, kind, opts.ttl, if_not_exists),
            ("q", TubeType::FifoTtl, Some(60_000_000), true)
        );
        let bad_type = args(|o| {
            write::array_len(o, 2);
            write::str(o, "q");
            write::str(o, "stack");
        });
        assert_eq!(
            parse("queue", "queue.create_tube", &bad_type, key())
                .unwrap()
                .unwrap_err()
                .to_string(),
            "Unknown tube type stack"
        );
        let cfg = args(|o| {
            write::array_len(o, 1);
            write::map_len(o, 1);
            write::str(o, "speed");
            write::uint(o, 1);
        });
        assert_eq!(
            parse("queue", "queue.cfg", &cfg, key())
                .unwrap()
                .unwrap_err()
                .to_string(),
            "Unknown option speed"
        );
    }

    #[test]
    fn create_tube_reads_sharded_queues_options_map() {
        let create = |write_opts: &dyn Fn(&mut Vec<u8>)| {
            let a = args(|o| {
                write::array_len(o, 2);
                write::str(o, "q");
                write_opts(o);
            });
            match parse("queue", "queue.create_tube", &a, key()).unwrap() {
                Ok(TubeCall::CreateTube {
                    kind,
                    opts,
                    if_not_exists,
                    ..
                }) => Ok((kind, opts.pri, opts.temporary, if_not_exists)),
                Ok(other) => panic!("{other:?}"),
                Err(e) => Err(e.to_string()),
            }
        };
        // No driver: fifottl; a tube there already is answered, not refused.
        let made = create(&|o| write::array_len(o, 0)).unwrap();
        assert_eq!(made, (TubeType::FifoTtl, 0, false, true));
        let fifo = create(&|o| {
            write::map_len(o, 4);
            write::str(o, "driver");
            write::str(o, "sharded_queue.drivers.fifo");
            write::str(o, "priority");
            write::uint(o, 17);
            write::str(o, "wait_factor");
            write::uint(o, 1);
            write::str(o, "temporary");
            write::bool(o, true);
        })
        .unwrap();
        assert_eq!(fifo, (TubeType::Fifo, 17, true, true));
        let refused = |key: &str, value: &dyn Fn(&mut Vec<u8>)| {
            create(&|o| {
                write::map_len(o, 1);
                write::str(o, key);
                value(o);
            })
            .unwrap_err()
        };
        assert_eq!(
            refused("driver", &|o| write::str(o, "unexistent")),
            "Driver unexistent could not be loaded for tube q"
        );
        assert_eq!(
            refused("wait_factor", &|o| write::f64(o, 0.5)),
            "wait_factor must be number greater than or equal to 1"
        );
        assert_eq!(
            refused("wait_max", &|o| write::str(o, "not number")),
            "wait_max must be number greater than 0"
        );
        assert!(refused("release_limit", &|o| write::uint(o, 5)).contains("not supported"));
        // tarantool/queue's form keeps its words for a missing type.
        let one = args(|o| {
            write::array_len(o, 1);
            write::str(o, "q");
        });
        assert_eq!(
            parse("queue", "queue.create_tube", &one, key())
                .unwrap()
                .unwrap_err()
                .to_string(),
            "Unknown tube type nil"
        );
    }

    #[test]
    fn uuids_print_as_the_original_shows_them() {
        // As the original's error for `queue.identify('0123456789abcdef')` prints it.
        assert_eq!(
            uuid_text(b"0123456789abcdef"),
            "33323130-3534-3736-3839-616263646566"
        );
    }
}
