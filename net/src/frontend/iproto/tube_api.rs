//! The tube API's translation table: a decoded [`TubeCall`] becomes a [`Command`] on the tube
//! it names (resolved here, so a missing tube gets Tarantool's "not defined"), or is answered
//! here when it needs no engine call (a touch with nothing to add, a negative kick, the
//! session calls, `state`, statistics of every tube). A task id the caller gives is its
//! number in the tube, made the engine's id here (`Queue::task_id_in`); the replies show the
//! number again (`tubes::write_task`).

use tarq_engine::{Micros, TubeIx, TubeNumbers};
use tarq_iproto::codes::{ER_NO_SUCH_PROC, ER_PROC_LUA, ER_UNKNOWN_REQUEST_TYPE};
use tarq_iproto::mp::write;
use tarq_iproto::mp::Reader;
use tarq_iproto::response;

use super::sessions::OnClose;
use super::tostring::NumberText;
use super::tubes::{self, Method, Name, TubeCall};
use super::Iproto;
use super::{one_value, Reply, Style};
use crate::core::{Command, On};
use crate::frontend::{Loop, ReplyTo, Then};

impl<L: Loop> Iproto<'_, L> {
    /// A call of the tube API: a method, or one of the module's own calls.
    #[inline(always)]
    pub(super) fn tube_api<'f>(
        &mut self,
        idx: usize,
        function: &str,
        r: Reply,
        name: Name<'_>,
        args: &'f [u8],
        key: &'f mut NumberText,
    ) -> Then<'f> {
        match name {
            Name::Method { tube, method } => {
                self.tube_method(idx, function, r, tube, method, args, key)
            }
            Name::Module(call) => match tubes::module_call(function, call, args) {
                Ok(call) => self.tube_call(idx, function, r, call),
                Err(e) => super::call_error(self.l.reply_buf(idx), r.sync, &e),
            },
        }
    }

    /// `<ns>.tube.<tube>:<method>(args)`, the hot path: the tube is resolved before the args
    /// are decoded (a missing tube is a missing function to Tarantool, whatever the args), and
    /// the args become the command without a detour through [`TubeCall`].
    #[inline]
    #[allow(clippy::too_many_arguments)]
    fn tube_method<'f>(
        &mut self,
        idx: usize,
        function: &str,
        r: Reply,
        tube: &str,
        method: &str,
        args: &'f [u8],
        key: &'f mut NumberText,
    ) -> Then<'f> {
        let r = tube_style(r);
        let name = tube;
        let Some((tube, numbers)) = self.l.tube_named(tube) else {
            return self.no_such_tube(idx, r, function);
        };
        if method == "grant" {
            self.tube_grant(idx, r.sync, name, args);
            return Then::Done;
        }
        match tubes::method(function, method, args, key) {
            Ok(Method::Bury { id: n }) if !self.may_bury(idx, name, numbers.id_of(tube, n)) => {
                self.deny(idx, r.sync, function);
                Then::Done
            }
            Ok(method) => self.run_method(idx, r, tube, numbers, method),
            Err(e) => super::call_error(self.l.reply_buf(idx), r.sync, &e),
        }
    }

    /// A bury with the `take` right alone buries only a task the caller holds; `admin` on the
    /// tube buries any (the original's bury asks no holder).
    fn may_bury(&self, idx: usize, tube: &str, id: tarq_engine::TaskId) -> bool {
        let who = self.l.who(idx);
        let rights = who.rights_on(self.l.queue().users(), tube);
        rights.contains(tarq_engine::Rights::ADMIN)
            || self.l.served(id).and_then(|t| t.owner) == Some(self.l.sid(idx))
    }

    /// Runs `method` on `tube`: a batch as a batch, anything else as one command (or the
    /// answer that needs none).
    #[inline(always)]
    fn run_method<'f>(
        &mut self,
        idx: usize,
        r: Reply,
        tube: u16,
        numbers: TubeNumbers,
        method: Method<'f>,
    ) -> Then<'f> {
        // One lookup a call: the numbers a method names become ids, and the tasks it answers
        // with show their numbers, without another look at the tube.
        let r = Reply {
            tube,
            first: numbers.first,
            ..r
        };
        let on = On::Tube(tube);
        // The cycle's three calls build their command in the returned value: one built first
        // and moved in is a copy of its 120 bytes a call (callgrind).
        match method {
            Method::Put { data, opts, wait } => Then::Run(
                ReplyTo::Iproto(r),
                Command::PutIn {
                    tube,
                    data,
                    opts,
                    wait,
                },
            ),
            Method::Take { timeout } => {
                Then::Run(ReplyTo::Iproto(r), Command::Take { on, timeout })
            }
            Method::Ack { id } => {
                let id = numbers.id_of(tube, id);
                Then::Run(ReplyTo::Iproto(r), Command::Ack { on, id })
            }
            Method::PutMany { .. } | Method::TakeMany { .. } | Method::AckMany { .. } => {
                match self.batch(idx, r, tube, batch_ids(numbers, tube, method)) {
                    Ok(()) => Then::Done,
                    Err(single) => self.run_single(idx, r, tube, numbers, single),
                }
            }
            other => self.run_single(idx, r, tube, numbers, other),
        }
    }

    /// A method of a tube this node does not know: held for a read of the placement on a
    /// sharded node (a tube another node has just created), else Tarantool's missing function.
    fn no_such_tube(&mut self, idx: usize, r: Reply, function: &str) -> Then<'static> {
        if self.l.hold_for_placement(idx) {
            return Then::Done;
        }
        let msg = format!("Procedure '{function}' is not defined");
        self.refuse(idx, r.sync, ER_NO_SUCH_PROC, &msg)
    }

    /// Runs a method that is not a batch as its command, or answers it when it needs none.
    fn run_single<'f>(
        &mut self,
        idx: usize,
        r: Reply,
        tube: u16,
        numbers: TubeNumbers,
        method: Method<'f>,
    ) -> Then<'f> {
        match method_command(tube, numbers, method) {
            Ok(command) => Then::Run(ReplyTo::Iproto(r), command),
            Err(answer) => self.answer(idx, r, answer),
        }
    }

    /// Answers or dispatches a call of the tube API.
    pub(super) fn tube_call<'f>(
        &mut self,
        idx: usize,
        function: &str,
        r: Reply,
        call: TubeCall<'f>,
    ) -> Then<'f> {
        let r = tube_style(r);
        let command = match call {
            TubeCall::CreateTube {
                name,
                opts,
                if_not_exists,
                ..
            } if self.l.iproto().in_replicaset
                && opts.temporary
                && !(if_not_exists && self.l.queue().tube_ix(name).is_some()) =>
            {
                let msg = "Cannot create temporary tube in replicaset mode";
                return self.refuse(idx, r.sync, ER_PROC_LUA, msg);
            }
            TubeCall::CreateTube {
                name,
                kind,
                opts,
                if_not_exists,
                partitions,
            } => Command::CreateTube {
                name,
                kind,
                opts,
                if_not_exists,
                partitions,
            },
            TubeCall::Method { tube, method } => {
                let Some((tube, numbers)) = self.l.tube_named(tube) else {
                    return self.no_such_tube(idx, r, function);
                };
                return self.run_method(idx, r, tube, numbers, method);
            }
            TubeCall::Statistics { tube: Some(name) } => match self.l.tube_named(name) {
                Some((tube, _)) => Command::TubeStats { tube },
                None => {
                    if self.l.hold_for_placement(idx) {
                        return Then::Done;
                    }
                    let msg = format!("Tube '{name}' does not exist");
                    return self.refuse(idx, r.sync, ER_PROC_LUA, &msg);
                }
            },
            // `queue.statistics()`: every tube but the seed's `default`, by name (an empty Lua
            // table, an array, when there is none, as the original sends it). Tubes
            // beanstalk's `use` made and left empty are gone first, as in its list.
            TubeCall::Statistics { tube: None } => {
                self.l.collect_tubes();
                Command::AllTubeStats
            }
            TubeCall::Identify { uuid } => return self.identify(idx, r, uuid),
            TubeCall::Cfg { ttr, in_replicaset } => return self.cfg(idx, r, ttr, in_replicaset),
            TubeCall::State => return self.answer(idx, r, Answer::Str("RUNNING")),
        };
        Then::Run(ReplyTo::Iproto(r), command)
    }

    /// `queue.cfg{ttr = ..., in_replicaset = ...}`.
    fn cfg(
        &mut self,
        idx: usize,
        r: Reply,
        ttr: Option<tarq_engine::Micros>,
        in_replicaset: bool,
    ) -> Then<'static> {
        // Checked before anything is set, as the original checks every option first.
        if let Some(Err(e)) = ttr.map(|ttr| self.l.iproto().sessions.set_ttr(ttr)) {
            let msg = format!(
                "Invalid value of ttr: {}: above this server's limit of {} seconds \
                 (max-session-grace)",
                seconds_text(e.asked),
                seconds_text(e.max)
            );
            return self.refuse(idx, r.sync, ER_PROC_LUA, &msg);
        }
        self.l.iproto().in_replicaset = in_replicaset;
        // As the original: with temporary tubes present the mode stays off, logged.
        if in_replicaset {
            let temporary: Vec<String> = (self.l.queue().named_tubes())
                .filter(|t| t.opts.temporary)
                .map(|t| t.name.to_string())
                .collect();
            if !temporary.is_empty() {
                self.l.iproto().in_replicaset = false;
                tracing::error!(
                    "queue.cfg: cannot set `in_replicaset = true`: temporary tube(s) exist: {}",
                    temporary.join(", ")
                );
            }
        }
        response::empty_data(self.l.reply_buf(idx), r.sync);
        Then::Done
    }

    /// Runs a batch method (`put_many`, `take_many`, `ack_many`) as one command per item, all in
    /// this turn (so one WAL batch), answered as one array with a value per item: the task, or
    /// nil for an item not done (a full tube, an id this session has not taken). A method that
    /// is not a batch comes back, as does a `take_many` that finds nothing ready and may wait:
    /// it waits as a take of one.
    fn batch<'m>(
        &mut self,
        idx: usize,
        r: Reply,
        tube: u16,
        method: Method<'m>,
    ) -> Result<(), Method<'m>> {
        let on = On::Tube(tube);
        let take = Command::Take {
            on,
            timeout: Some(0),
        };
        let (commands, takes): (Vec<Command<'m>>, u32) = match method {
            Method::PutMany { items, opts } => {
                let put = |data| Command::PutIn {
                    tube,
                    data,
                    opts,
                    wait: 0,
                };
                (items.into_iter().map(put).collect(), 0)
            }
            Method::AckMany { ids } => (
                ids.into_iter().map(|id| Command::Ack { on, id }).collect(),
                0,
            ),
            Method::TakeMany { timeout, .. }
                if timeout != Some(0) && !self.l.queue().can_take(tube) =>
            {
                return Err(Method::Take { timeout });
            }
            Method::TakeMany { n, .. } => (Vec::new(), n),
            single => return Err(single),
        };
        // Refused as a whole (a full disk, say) with the reason, rather than item by item.
        let first = commands.first().unwrap_or(&take);
        if let Some(refusal) = self.l.batch_refusal(first, &commands) {
            super::error(self.l.reply_buf(idx), r, &refusal);
            return Ok(());
        }
        let item = ReplyTo::Iproto(Reply {
            style: Style::Item,
            ..r
        });
        let at = response::begin_data_counted(self.l.reply_buf(idx), r.sync);
        // Each command answers at once with one value: none of them can park.
        let mut items = 0;
        for command in commands {
            self.l.dispatch(idx, item, command);
            items += 1;
        }
        while items < takes && self.l.queue().can_take(tube) {
            self.l.dispatch(idx, item, take);
            items += 1;
        }
        response::finish_counted(self.l.reply_buf(idx), at, items);
        Ok(())
    }

    /// EVAL: tarq runs no Lua, but go-tarantool's queue package sends two fixed expressions
    /// (create a tube; does a tube exist), answered as Tarantool would. Any other expression
    /// gets the error Tarantool gives for an unknown request type, naming it.
    pub(crate) fn eval<'f>(
        &mut self,
        idx: usize,
        sync: u64,
        expr: &str,
        args: &'f [u8],
        key: &'f mut NumberText,
    ) -> Then<'f> {
        let ns = &self.l.config().queue_namespace;
        let create = format!("local name, type, cfg = ... ; {ns}.create_tube(name, type, cfg)");
        let exists = format!("local name = ... ; return {ns}.tube[name] ~= nil");
        let exists_old = format!("local name = ... ; return {ns}.tube[name] ~= null");
        let r = Reply {
            sync,
            call16: false,
            style: Style::Silent,
            tube: 0,
            first: 0,
        };
        if expr == create {
            let function = format!("{ns}.create_tube");
            return match tubes::split(ns, &function) {
                Some(Ok(name)) => self.tube_api(idx, &function, r, name, args, key),
                Some(Err(e)) => super::call_error(self.l.reply_buf(idx), sync, &e),
                None => unreachable!("create_tube is the tube API's"),
            };
        } else if expr == exists || expr == exists_old {
            let mut a = Reader::new(args);
            let name = a.read_array_len().ok().and_then(|_| a.read_str().ok());
            let found = name.is_some_and(|n| self.l.tube_named(n).is_some());
            if !found && self.l.hold_for_placement(idx) {
                return Then::Done;
            }
            one_value(
                self.l.reply_buf(idx),
                Reply {
                    style: Style::Tube,
                    ..r
                },
                |o| write::bool(o, found),
            );
        } else {
            let msg = format!(
                "EVAL is not supported: tarq runs no Lua (it answers only the expressions \
                 go-tarantool's queue sends), got: {expr}"
            );
            response::error(self.l.reply_buf(idx), sync, ER_UNKNOWN_REQUEST_TYPE, &msg);
        }
        Then::Done
    }

    fn answer(&mut self, idx: usize, r: Reply, answer: Answer) -> Then<'static> {
        let out = self.l.reply_buf(idx);
        match answer {
            Answer::Nothing => response::empty_data(out, r.sync),
            Answer::Int(n) => one_value(out, r, |o| write::sint(o, n)),
            Answer::Str(s) => one_value(out, r, |o| write::str(o, s)),
        }
        Then::Done
    }

    /// `queue.identify([uuid])`: the connection's session UUID (drawn on first use), or, given
    /// a UUID the server issued whose session is live or within its `ttr`, that session for
    /// this connection from now on: it owns that session's tasks, and its former session is
    /// left as a close would leave it.
    fn identify(&mut self, idx: usize, r: Reply, uuid: Option<&[u8]>) -> Then<'static> {
        let (sid, own) = (self.l.sid(idx), self.l.session_uuid(idx));
        let result = match uuid {
            None => match own {
                Some(u) => Ok(u),
                None => new_session_uuid()
                    .inspect(|&u| {
                        self.l.iproto().sessions.create(u, sid);
                        self.l.set_session(idx, sid, u);
                    })
                    .map_err(|e| e.to_string()),
            },
            Some(u) => match <[u8; 16]>::try_from(u) {
                Err(_) => Err("Invalid UUID format.".to_string()),
                Ok(u) if Some(u) == own => Ok(u),
                Ok(u) => match self.l.iproto().sessions.attach(&u) {
                    None => Err(format!("The UUID {} is unknown.", tubes::uuid_text(&u))),
                    Some(new_sid) => {
                        let mono = self.l.mono();
                        if let OnClose::Release(old) =
                            self.l.iproto().sessions.detach(sid, own, mono)
                        {
                            self.l.release_session(old);
                        }
                        self.l.set_session(idx, new_sid, u);
                        Ok(u)
                    }
                },
            },
        };
        let out = self.l.reply_buf(idx);
        match result {
            Err(msg) => response::error(out, r.sync, ER_PROC_LUA, &msg),
            // The original sends the 16 raw bytes as a MessagePack string.
            Ok(u) => one_value(out, r, |o| {
                rmp::encode::write_str_len(o, 16).expect("writing to a Vec");
                o.extend_from_slice(&u);
            }),
        }
        Then::Done
    }
}

/// A duration as the seconds a client gave it: whole when it is, else with its fraction.
fn seconds_text(us: Micros) -> String {
    if us.is_multiple_of(1_000_000) {
        (us / 1_000_000).to_string()
    } else {
        (us as f64 / 1e6).to_string()
    }
}

/// The tube API's shapes, unless the caller asked for none (an EVAL).
fn tube_style(r: Reply) -> Reply {
    match r.style {
        Style::Silent => r,
        _ => Reply {
            style: Style::Tube,
            ..r
        },
    }
}

/// A reply the front-end gives without the engine.
enum Answer {
    Nothing,
    Int(i64),
    Str(&'static str),
}

/// A batch `method` with the task numbers it names in `tube` (numbered as `numbers` says)
/// made the engine's ids. O(1) a number.
fn batch_ids(numbers: TubeNumbers, tube: TubeIx, method: Method<'_>) -> Method<'_> {
    match method {
        Method::AckMany { mut ids } => {
            for n in &mut ids {
                *n = numbers.id_of(tube, *n);
            }
            Method::AckMany { ids }
        }
        other => other,
    }
}

/// The method's command on `tube`, the task numbers it names made the engine's ids (`tube`
/// numbers its tasks as `numbers` says), or the answer that needs none.
#[inline]
fn method_command(
    tube: u16,
    numbers: TubeNumbers,
    method: Method<'_>,
) -> Result<Command<'_>, Answer> {
    let on = On::Tube(tube);
    let id = |n| numbers.id_of(tube, n);
    Ok(match method {
        Method::Put { data, opts, wait } => Command::PutIn {
            tube,
            data,
            opts,
            wait,
        },
        Method::Take { timeout } => Command::Take { on, timeout },
        Method::Touch { delta: None, .. } => return Err(Answer::Nothing),
        Method::Touch {
            id: n,
            delta: Some(delta),
        } => Command::Touch {
            tube,
            id: id(n),
            delta,
        },
        Method::Ack { id: n } => Command::Ack { on, id: id(n) },
        Method::Release { id: n, opts } => Command::Release {
            on,
            id: id(n),
            opts,
        },
        Method::Peek { id: n } => Command::Peek { tube, id: id(n) },
        Method::Bury { id: n } => Command::Bury { tube, id: id(n) },
        Method::Kick { count } if count < 0 => return Err(Answer::Int(count)),
        Method::Kick { count } => Command::Kick {
            tube,
            count: count as u64,
        },
        Method::Delete { id: n } => Command::Delete { tube, id: id(n) },
        Method::Drop => Command::DropTube { tube },
        Method::Truncate => Command::Truncate { tube },
        Method::ReleaseAll => Command::ReleaseAll { tube },
        Method::PutMany { .. } | Method::TakeMany { .. } | Method::AckMany { .. } => {
            unreachable!("batches are run by `batch`")
        }
    })
}

/// 16 random bytes, for a session's UUID.
fn new_session_uuid() -> std::io::Result<[u8; 16]> {
    let mut b = [0u8; 16];
    getrandom::fill(&mut b).map_err(|e| std::io::Error::other(format!("no randomness: {e}")))?;
    Ok(b)
}
