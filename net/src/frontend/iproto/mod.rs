//! The IPROTO front-end: Tarantool's binary protocol (codec `tarq-iproto`). It answers the
//! protocol's own requests (PING, AUTH, ID, SELECT of system spaces, EVAL), translates CALL
//! and CALL_16 of the queue's functions into [`Command`]s ([`calls`]: the seed API;
//! [`tubes`]: the tarantool/queue API), and encodes [`Outcome`]s as IPROTO replies in the
//! shape the asking API expects ([`Style`]).

pub mod calls;
pub mod errors;
pub mod sessions;
pub mod tostring;
mod tube_api;
pub mod tubes;
pub mod users;

use tarq_engine::{TaskRef, TubeIx};
use tarq_iproto::codes::*;
use tarq_iproto::mp::write;
use tarq_iproto::request::{self, RequestKind};
use tarq_iproto::{auth, response, SYSTEM_SPACES};

use super::{Loop, ReplyTo, Then};
use crate::core::access::{self, Need, Who, GUEST};
use crate::core::{Command, On, Outcome};
use calls::{Call, CallError};
use errors::error;
use sessions::TubeSessions;
pub use tostring::NumberText;

/// What an IPROTO reply needs: the request's sync, whether it came as CALL_16 (results
/// wrapped as tuples), which API's shapes to use, and, for the tube API, the tube the call
/// named and the number its first task got (`TubeNumbers::first`), read once when the call is
/// decoded so that showing a task's number in the tube (`tarq_engine::number_from`) needs no
/// tube lookup. A task of another index (a partition after a sharded tube's first) is shown
/// by its whole id, which names its partition.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Reply {
    pub sync: u64,
    pub call16: bool,
    pub style: Style,
    pub tube: TubeIx,
    pub first: u64,
}

/// The reply shapes of one API.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Style {
    /// The seed's: a task is a string-keyed map, errors are ER_PROC_LUA with the seed's texts.
    Seed,
    /// tarantool/queue's: a task is the tuple `[id, status letter, data]`.
    Tube,
    /// One item of a batch reply the front-end frames itself: the task's tuple, or nil.
    Item,
    /// A call whose value the client does not read (an EVAL without `return`): no value, or
    /// the error.
    Silent,
}

/// The IPROTO front-end's server-wide state: the tube API's sessions and its replicaset mode.
#[derive(Debug)]
pub struct IprotoState {
    /// Sessions of the tube API (`queue.identify`, `queue.cfg{ttr}`).
    pub sessions: TubeSessions,
    /// `queue.cfg{in_replicaset = true}`: `create_tube` refuses temporary tubes, as the
    /// original does. Not kept across a restart (the original keeps it in memory too).
    pub in_replicaset: bool,
    /// Calls refused for want of a grant since start (`/metrics`: `access_denied`).
    pub access_denied: u64,
}

impl IprotoState {
    pub fn new(sessions: TubeSessions) -> Self {
        IprotoState {
            sessions,
            in_replicaset: false,
            access_denied: 0,
        }
    }
}

/// Why an AUTH is refused: its check failed (code and Tarantool's text), or its user holds
/// as many connections as it may (the connection is then closed).
enum Denied {
    Auth(u32, String),
    Limit(access::UserRefused),
}

/// The IPROTO front-end at work for the loop `L`: it answers the protocol's own requests and
/// translates the queue's calls into the core's commands.
pub struct Iproto<'a, L: Loop> {
    l: &'a mut L,
}

impl<'a, L: Loop> Iproto<'a, L> {
    pub fn new(l: &'a mut L) -> Self {
        Iproto { l }
    }
}

impl<L: Loop> Iproto<'_, L> {
    /// Reads one IPROTO request frame: answers it, or returns the queue call it carries as the
    /// command the loop runs (or the connection's change of hands). `key` is room for a numeric
    /// utube key the command may borrow. Inlined into the loop's read
    /// (`Server::execute_iproto_input`): out of line it cost about 1% more instructions a
    /// message (callgrind, depth 16).
    #[inline(always)]
    pub fn execute<'f>(
        &mut self,
        idx: usize,
        frame: &'f [u8],
        key: &'f mut NumberText,
    ) -> Then<'f> {
        let req = match request::decode(frame) {
            Ok(r) => r,
            Err(e) => {
                response::error(self.l.reply_buf(idx), e.sync, e.code, &e.message);
                return Then::Done;
            }
        };
        let sync = req.sync;
        match req.kind {
            RequestKind::Ping => response::ok_empty(self.l.reply_buf(idx), sync),
            RequestKind::Call {
                function,
                args,
                call16,
            } => {
                if !self.may_call(idx, function, args) {
                    self.deny(idx, sync, function);
                } else if self.l.config().null {
                    response::empty_data(self.l.reply_buf(idx), sync);
                } else {
                    return self.call(idx, sync, function, args, call16, key);
                }
            }
            RequestKind::Auth {
                user,
                method,
                scramble,
            } => return self.authenticate(idx, sync, user, method, scramble),
            RequestKind::Id { .. } => {
                response::id(self.l.reply_buf(idx), sync, response::ID_VERSION)
            }
            RequestKind::Select { space } => return self.select(idx, sync, space),
            RequestKind::Eval { expr, args } => return self.eval(idx, sync, expr, args, key),
            RequestKind::Join { format } => return relay(sync, format, None),
            RequestKind::Subscribe {
                after,
                term,
                history,
                format,
            } => return relay(sync, format, Some((after, term, history))),
            RequestKind::Other(t) => {
                let msg = format!("Unknown request type {t}");
                return self.refuse(idx, sync, ER_UNKNOWN_REQUEST_TYPE, &msg);
            }
        }
        Then::Done
    }

    /// A SELECT: of the system spaces a client's connector reads, empty; of any other, Tarantool's
    /// missing space.
    fn select(&mut self, idx: usize, sync: u64, space: u64) -> Then<'static> {
        if !SYSTEM_SPACES.contains(&space) {
            let msg = format!("Space '{space}' does not exist");
            return self.refuse(idx, sync, ER_NO_SUCH_SPACE, &msg);
        }
        response::empty_data(self.l.reply_buf(idx), sync);
        Then::Done
    }

    /// Answers the request `sync` with error `code` and `msg`: nothing more is done about it.
    pub(super) fn refuse(&mut self, idx: usize, sync: u64, code: u32, msg: &str) -> Then<'static> {
        response::error(self.l.reply_buf(idx), sync, code, msg);
        Then::Done
    }

    /// Whether connection `idx` may call `function` with `args` (`core::access` decides; an
    /// open server or the bootstrap administrator skips the check, so the hot path reads one
    /// word).
    #[inline(always)]
    fn may_call(&self, idx: usize, function: &str, args: &[u8]) -> bool {
        let who = self.l.who(idx);
        if *who == Who::Everyone {
            return true;
        }
        // A link or a management call is checked where it runs.
        if function == super::link::wire::LINK {
            return false;
        }
        let need = call_needs(&self.l.config().queue_namespace, function, args);
        who.allows(self.l.queue().users(), need)
    }

    /// Refuses a call as Tarantool refuses a function the user may not execute.
    #[cold]
    fn deny(&mut self, idx: usize, sync: u64, function: &str) {
        self.l.iproto().access_denied += 1;
        let who = self.l.who(idx).name().to_owned();
        let msg = format!("Execute access to function '{function}' is denied for user '{who}'");
        response::error(self.l.reply_buf(idx), sync, ER_ACCESS_DENIED, &msg);
    }

    fn authenticate(
        &mut self,
        idx: usize,
        sync: u64,
        user: &str,
        method: Option<&str>,
        scramble: Option<&[u8]>,
    ) -> Then<'static> {
        let verdict = self.check_auth(idx, user, method, scramble);
        let refused = matches!(verdict, Err(Denied::Limit(_)));
        let out = self.l.reply_buf(idx);
        match verdict {
            Ok(()) => response::ok_empty(out, sync),
            Err(Denied::Auth(code, msg)) => response::error(out, sync, code, &msg),
            // Tarantool refuses a session with ER_ACCESS_DENIED; the text names the limit.
            Err(Denied::Limit(e)) => response::error(out, sync, ER_ACCESS_DENIED, &e.to_string()),
        }
        match refused {
            true => Then::Close("user-max-connections reached"),
            false => Then::Done,
        }
    }

    /// Checks an AUTH and, when it passes, makes the connection act as its user.
    fn check_auth(
        &mut self,
        idx: usize,
        user: &str,
        method: Option<&str>,
        scramble: Option<&[u8]>,
    ) -> Result<(), Denied> {
        let (cred, hash2) = (self.l.config().auth.clone(), self.l.auth_hash());
        let salt = self.l.salt(idx);
        let mismatch = || {
            Denied::Auth(
                ER_PASSWORD_MISMATCH,
                format!("Incorrect password supplied for user '{user}'"),
            )
        };
        match (&cred, &hash2) {
            // An open server accepts every AUTH, as Tarantool's guest-everything setup does.
            (None, _) | (_, None) => Ok(()),
            (Some(_), _) if user == GUEST && scramble.is_none() => {
                // Becoming guest is allowed; it may call what guest was granted.
                let guest = Who::guest();
                let may = guest.may_call(self.l.queue().users());
                self.l.act_as(idx, guest, may).map_err(Denied::Limit)?;
                Ok(())
            }
            (Some(cred), Some(hash2)) => {
                // The bootstrap administrator's hash is the config's; anyone else's is data.
                let stored = self.l.queue().users().get(user).and_then(|u| u.hash2);
                let (hash, who) = if user == cred.user {
                    (Some(*hash2), Who::Everyone)
                } else {
                    (stored, Who::User(user.into()))
                };
                if hash.is_none() && self.l.queue().users().get(user).is_none() {
                    Err(Denied::Auth(
                        ER_NO_SUCH_USER,
                        format!("User '{user}' is not found"),
                    ))
                } else if method.is_some_and(|m| m != auth::CHAP_SHA1) {
                    let m = method.unwrap_or_default();
                    Err(Denied::Auth(
                        ER_ILLEGAL_PARAMS,
                        format!("Illegal parameters, unknown authentication method '{m}'"),
                    ))
                } else if let (Some(s), Some(h)) = (scramble, hash.as_ref()) {
                    if !auth::check(&salt, s, h) {
                        return Err(mismatch());
                    }
                    self.l.act_as(idx, who, true).map_err(Denied::Limit)?;
                    Ok(())
                } else {
                    Err(mismatch())
                }
            }
        }
    }

    /// `queue.stats()`: the server's own figures, not the queue's alone.
    #[inline(never)]
    fn answer_stats(&mut self, idx: usize, reply: Reply) {
        let figures = Outcome::ServerStats(Box::new(self.l.snapshot()));
        encode(self.l.reply_buf(idx), reply, &figures);
    }

    /// A CALL: decoded by the API its name belongs to, then dispatched. Always inlined, as
    /// `execute` is: the request path's hottest frame.
    #[inline(always)]
    pub fn call<'f>(
        &mut self,
        idx: usize,
        sync: u64,
        function: &'f str,
        args: &'f [u8],
        call16: bool,
        key: &'f mut NumberText,
    ) -> Then<'f> {
        let reply = Reply {
            sync,
            call16,
            style: Style::Seed,
            tube: 0,
            first: 0,
        };
        if let Some(name) = tubes::split(&self.l.config().queue_namespace, function) {
            return match name {
                Ok(name) => self.tube_api(idx, function, reply, name, args, key),
                Err(e) => call_error(self.l.reply_buf(idx), sync, &e),
            };
        }
        if let Some(op) = function.strip_prefix(users::PREFIX) {
            self.user_call(idx, sync, function, op, args);
            return Then::Done;
        }
        if function == users::LIST {
            self.list_users(idx, sync);
            return Then::Done;
        }
        if function == users::LIMITS {
            self.user_limits(idx, sync, args);
            return Then::Done;
        }
        if function == super::link::wire::LINK {
            // Another node of a sharded cluster, naming itself: the loop hands it the
            // connection, or refuses it.
            return match super::link::wire::read_link_hello(args) {
                Ok(hello) => Then::Link { sync, hello },
                Err(e) => call_error(self.l.reply_buf(idx), sync, &CallError::BadArgs(e)),
            };
        }
        if function == calls::CLUSTER {
            let overview = self.l.cluster_overview();
            let out = self.l.reply_buf(idx);
            let at = response::begin_data(out, sync, 1);
            if call16 {
                // CALL_16 answers tuples: the map goes in one.
                tarq_iproto::mp::write::array_len(out, 1);
            }
            rmpv::encode::write_value(out, &overview).expect("a Vec takes every byte");
            response::finish(out, at);
            return Then::Done;
        }
        match calls::parse(function, args) {
            Ok(call) => self.seed_call(idx, reply, call),
            Err(e) => call_error(self.l.reply_buf(idx), sync, &e),
        }
    }

    /// The seed API's translation table: a call becomes the core's command, or, for
    /// `queue.stats()`, the server's own figures. Always inlined: the command is built where
    /// the loop runs it, not copied out of a call.
    #[inline(always)]
    fn seed_call<'f>(&mut self, idx: usize, reply: Reply, call: Call<'f>) -> Then<'f> {
        // Each arm builds its command in the returned value: one built first and moved in is
        // a copy of its 120 bytes a call (callgrind).
        let r = ReplyTo::Iproto(reply);
        match call {
            Call::Put { data, opts } => Then::Run(r, Command::Put { data, opts }),
            Call::Take { timeout } => Then::Run(
                r,
                Command::Take {
                    on: On::Seed,
                    timeout: Some(timeout),
                },
            ),
            Call::Ack { id } => Then::Run(r, Command::Ack { on: On::Seed, id }),
            Call::Release { id, delay } => {
                let opts = tarq_engine::ReleaseOptions {
                    delay,
                    ..Default::default()
                };
                Then::Run(
                    r,
                    Command::Release {
                        on: On::Seed,
                        id,
                        opts,
                    },
                )
            }
            Call::Snapshot => Then::Run(r, Command::Snapshot),
            Call::Move {
                tube,
                partition,
                to,
            } => Then::Run(
                r,
                Command::Move {
                    tube,
                    partition,
                    to,
                },
            ),
            Call::Stats => {
                self.answer_stats(idx, reply);
                Then::Done
            }
        }
    }
}

/// JOIN (`subscribe` `None`) or SUBSCRIBE: the loop makes the connection a relay, or refuses.
fn relay(sync: u64, format: Option<u32>, subscribe: Option<(u64, u64, u64)>) -> Then<'static> {
    Then::Relay {
        sync,
        format,
        subscribe,
    }
}

/// A call refused before reaching the queue: ER_NO_SUCH_PROC or ER_PROC_LUA. Nothing more is
/// done about it.
fn call_error(out: &mut Vec<u8>, sync: u64, e: &CallError) -> Then<'static> {
    let code = match e {
        CallError::NoSuchProc(_) => ER_NO_SUCH_PROC,
        CallError::BadArgs(_) => ER_PROC_LUA,
    };
    response::error(out, sync, code, &e.to_string());
    Then::Done
}

/// Encodes `outcome` as the IPROTO reply `r` asks for.
pub fn encode(out: &mut Vec<u8>, r: Reply, outcome: &Outcome<'_>) {
    match r.style {
        Style::Item => return encode_item(out, r, outcome),
        Style::Silent => {
            return match outcome {
                Outcome::Error(e) => error(out, r, e),
                _ => response::empty_data(out, r.sync),
            }
        }
        Style::Tube if encode_tube(out, r, outcome) => return,
        _ => {}
    }
    let sync = r.sync;
    match outcome {
        Outcome::Task(t) => seed_task(out, r, t),
        Outcome::Done(t) => seed_task(out, r, &t.as_ref()),
        Outcome::Nothing | Outcome::Ok | Outcome::Ready(_) => response::empty_data(out, sync),
        Outcome::ServerStats(s) => one_value(out, r, |o| s.write_msgpack(o)),
        Outcome::Text(text) => one_value(out, r, |o| write::str(o, text)),
        Outcome::DoneId { id, .. } => one_value(out, r, |o| write::uint(o, *id)),
        Outcome::Full => one_value(out, r, write::nil),
        Outcome::Count(n) => one_value(out, r, |o| write::uint(o, *n)),
        Outcome::Dropped => one_value(out, r, |o| write::bool(o, true)),
        // Shapes the tube API gives its own way (or, for beanstalk's figures, never asks).
        Outcome::Tube(_)
        | Outcome::TubeStats(_)
        | Outcome::AllStats(_)
        | Outcome::TubeFigures { .. }
        | Outcome::TaskFigures(_)
        | Outcome::Tasks(_)
        | Outcome::TaskPage(_)
        | Outcome::Moves(_) => one_value(out, r, write::nil),
        Outcome::Error(e) => error(out, r, e),
    }
}

/// One value of a batch: the task's tuple, or nil for anything else.
fn encode_item(out: &mut Vec<u8>, r: Reply, outcome: &Outcome<'_>) {
    match outcome {
        Outcome::Task(t) => tubes::write_task(out, t, r.tube, r.first, false),
        Outcome::Done(t) => tubes::write_task(out, &t.as_ref(), r.tube, r.first, true),
        _ => write::nil(out),
    }
}

/// The outcomes the tube API shapes its own way; false for the rest (shaped as the seed's).
fn encode_tube(out: &mut Vec<u8>, r: Reply, outcome: &Outcome<'_>) -> bool {
    match outcome {
        Outcome::Task(t) => task_tuple(out, r, t, false),
        Outcome::Done(t) => task_tuple(out, r, &t.as_ref(), true),
        Outcome::DoneId { number, .. } => {
            let start = response::begin_data(out, r.sync, 1);
            write::array_len(out, 3);
            write::uint(out, *number);
            write::str(out, "-");
            write::nil(out);
            response::finish(out, start);
        }
        Outcome::Tube(t) => one_value(out, r, |o| tubes::write_tube(o, t)),
        Outcome::TubeStats(s) => one_value(out, r, |o| tubes::write_stats(o, s)),
        Outcome::AllStats(all) => one_value(out, r, |o| tubes::write_all_stats(o, all)),
        _ => return false,
    }
    true
}

/// A task is a tuple: `[task]` over CALL and over CALL_16 alike.
fn task_tuple(out: &mut Vec<u8>, r: Reply, t: &TaskRef<'_>, done: bool) {
    let start = response::begin_data(out, r.sync, 1);
    tubes::write_task(out, t, r.tube, r.first, done);
    response::finish(out, start);
}

/// A reply of one value: `[v]` over CALL, `[[v]]` over CALL_16 (Tarantool wraps every
/// non-tuple result of a CALL_16 in a tuple).
fn one_value(out: &mut Vec<u8>, r: Reply, value: impl FnOnce(&mut Vec<u8>)) {
    let start = response::begin_data(out, r.sync, 1);
    if r.call16 {
        write::array_len(out, 1);
    }
    value(out);
    response::finish(out, start);
}

/// A task in the seed's shape: a map, so wrapped in a tuple over CALL_16.
fn seed_task(out: &mut Vec<u8>, r: Reply, t: &TaskRef<'_>) {
    one_value(out, r, |o| calls::write_task(o, t));
}

/// What a call of `function` with `args` needs, by its name: the seed's calls work on
/// `default`, a tube method on its tube, the module's calls on what they name. Management
/// calls check their own needs (a user may change its own password); anything else (a
/// function that is not there) needs some right, so that a user with none learns nothing of
/// which functions exist.
fn call_needs<'a>(ns: &str, function: &'a str, args: &'a [u8]) -> Need<'a> {
    use tarq_engine::Rights;
    const DEFAULT: &str = tarq_engine::DEFAULT_TUBE_NAME;
    if function.starts_with(users::PREFIX) {
        return Need::Nothing;
    }
    match tubes::split(ns, function) {
        Some(Ok(tubes::Name::Method { tube, method })) => access::method_needs(tube, method),
        Some(Ok(tubes::Name::Module(call))) => match call {
            "create_tube" => first_str(args).map_or(Need::Admin, |t| Need::Tube(t, Rights::ADMIN)),
            "statistics" => first_str(args).map_or(Need::Any, Need::AnyOn),
            "cfg" => Need::Admin,
            _ => Need::Any,
        },
        Some(Err(_)) => Need::Any,
        None => match function {
            calls::PUT => Need::Tube(DEFAULT, Rights::PUT),
            calls::TAKE | calls::ACK | calls::RELEASE => Need::Tube(DEFAULT, Rights::TAKE),
            calls::SNAPSHOT | calls::MOVE | users::LIST | users::LIMITS => Need::Admin,
            _ => Need::Any,
        },
    }
}

/// The first argument of a call, when it is a string (a tube's name).
fn first_str(args: &[u8]) -> Option<&str> {
    let mut r = tarq_iproto::mp::Reader::new(args);
    let n = r.read_array_len().ok()?;
    if n == 0 {
        return None;
    }
    r.read_str().ok()
}
