//! The workload: client threads that put unique payloads, take, ack and release through the
//! tube API of any node, as a user's client would, and record every operation in the history
//! (`Recorder`). Each client keeps one connection (one session); an operation whose outcome it
//! cannot know (a lost connection, a timeout, `ER_OUTCOME_UNKNOWN`) is recorded `info` and the
//! connection is dropped, which ends the session and frees what it held. A refusal with code 7
//! names the primary: the client goes there, as the README tells clients to. Clients never
//! sleep to wait for the cluster; they only back off a little after a failed connect, so a
//! dead node is not hammered.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::net::SocketAddr;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use rmpv::Value;
use tarq_client::{pack_args, Client, ClientError};

use crate::beanstalk::Beanstalk;
use crate::history::{self, Event, Kind, Protocol, F};
use crate::net::Host;

/// tarq's own code for a change that may or may not have been made.
const ER_OUTCOME_UNKNOWN: u32 = 1003;
/// Tarantool's ER_READONLY: nothing was done; the message names the primary.
const ER_READONLY: u32 = 7;
/// How long a client waits for a reply before it counts the outcome unknown.
const REPLY_TIMEOUT: Duration = Duration::from_secs(3);
/// How long a take waits for a task on the server.
const TAKE_WAIT_SECS: f64 = 0.05;
/// The pause after a connect that failed, or a refusal, so a dead or leaderless node is not
/// hammered (a client's retry back-off, not a wait for anything).
const CONNECT_BACKOFF: Duration = Duration::from_millis(50);

/// Where the history goes: one JSON line an event, stamped on the run's clock.
pub struct Recorder {
    start: Instant,
    out: Mutex<BufWriter<File>>,
    sessions: AtomicU64,
}

impl Recorder {
    pub fn create(path: &Path, start: Instant) -> Result<Recorder> {
        let file =
            File::create(path).with_context(|| format!("cannot create {}", path.display()))?;
        Ok(Recorder {
            start,
            out: Mutex::new(BufWriter::new(file)),
            sessions: AtomicU64::new(0),
        })
    }

    /// Microseconds since the run started.
    pub fn now_us(&self) -> u64 {
        self.start.elapsed().as_micros() as u64
    }

    /// An event of `process` stamped now.
    pub fn event(&self, process: u64, kind: Kind, f: F) -> Event {
        Event::new(self.now_us(), process, kind, f)
    }

    pub fn record(&self, event: &Event) {
        let mut out = self.out.lock().unwrap_or_else(PoisonError::into_inner);
        // A history that cannot be written makes the run worthless: stop loudly.
        history::write(&mut *out, event).expect("write the history");
    }

    pub fn flush(&self) -> Result<()> {
        let mut out = self.out.lock().unwrap_or_else(PoisonError::into_inner);
        out.flush().context("flush the history")
    }

    /// A session number unique in the run.
    pub fn next_session(&self) -> u64 {
        self.sessions.fetch_add(1, Ordering::Relaxed) + 1
    }
}

/// A node a client may talk to.
#[derive(Debug, Clone)]
pub struct Target {
    pub name: String,
    pub addr: SocketAddr,
    /// Its replica set.
    pub set: String,
    /// Its beanstalk port, if it has one.
    pub beanstalk: Option<SocketAddr>,
}

/// One client thread's settings.
#[derive(Debug, Clone)]
pub struct ClientSpec {
    pub process: u64,
    pub tube: String,
    pub targets: Vec<Target>,
    /// The host whose namespace the client's sockets are in.
    pub host: Host,
    pub seed: u64,
    /// The ttr every put asks for, in seconds.
    pub ttr_secs: u64,
    /// utube keys to spread puts over (none: a plain tube).
    pub keys: u32,
    /// The port the client uses: the tube API over IPROTO, or beanstalk.
    pub protocol: Protocol,
}

/// What an operation returned when it was done: a task's id, and the payload a take got.
#[derive(Default)]
pub(crate) struct Done {
    pub(crate) id: Option<u64>,
    payload: Option<String>,
}

/// How an operation came out.
pub(crate) enum Outcome {
    Ok(Done),
    /// A definite error.
    Fail(String),
    /// Unknown; the connection is dropped.
    Info(String),
    /// Refused by a node that does not lead, naming the primary if it knows one.
    ReadOnly(String, Option<String>),
}

/// An operation, whatever the wire.
#[derive(Clone, Copy)]
enum Op<'a> {
    Put {
        payload: &'a str,
        key: Option<&'a str>,
    },
    Take,
    Ack(u64),
    Release(u64),
    Bury(u64),
}

/// The connection's protocol.
enum Wire {
    Iproto(Client),
    Beanstalk(Beanstalk),
}

struct Conn {
    target: usize,
    wire: Wire,
    session: u64,
    /// Tasks this session holds (taken, not yet acked or released), with their payloads.
    held: Vec<(u64, Option<String>)>,
    /// The invoke of the last operation the server answered on this connection (or the
    /// connect): a server that closes the connection ends the session after that answer.
    answered_us: u64,
}

/// The client loop's state.
struct Worker {
    spec: ClientSpec,
    rec: Arc<Recorder>,
    rng: fastrand::Rng,
    conn: Option<Conn>,
    /// The next target to try.
    next_target: usize,
    /// Payloads put so far.
    puts: u64,
}

/// Starts a client thread that runs until `stop`, then closes its connection (recorded).
pub fn spawn(
    spec: ClientSpec,
    rec: Arc<Recorder>,
    stop: Arc<AtomicBool>,
) -> Result<JoinHandle<()>> {
    let name = format!("client-{}", spec.process);
    let thread = std::thread::Builder::new().name(name).spawn(move || {
        spec.host
            .enter_current_thread()
            .expect("enter the clients' namespace");
        let first = spec.process as usize % spec.targets.len().max(1);
        let mut w = Worker {
            rng: fastrand::Rng::with_seed(spec.seed),
            spec,
            rec,
            conn: None,
            next_target: first,
            puts: 0,
        };
        while !stop.load(Ordering::Relaxed) {
            w.step();
        }
        w.disconnect("the workload stopped");
    })?;
    Ok(thread)
}

impl Worker {
    fn step(&mut self) {
        if self.conn.is_none() && !self.connect() {
            std::thread::sleep(CONNECT_BACKOFF);
            return;
        }
        let held = self.conn.as_ref().map_or(0, |c| c.held.len());
        let roll = self.rng.u32(0..100);
        if held > 0 && (roll < 50 || held >= 4) {
            let at = self.rng.usize(0..held);
            let (id, payload) = self.conn.as_mut().expect("connected").held.swap_remove(at);
            // Mostly acks; some go back, a few are buried (the drain kicks them out again).
            match self.rng.u32(0..100) {
                0..75 => self.finish(F::Ack, Op::Ack(id), payload),
                75..95 => self.finish(F::Release, Op::Release(id), payload),
                _ => self.finish(F::Bury, Op::Bury(id), payload),
            }
        } else if roll < 70 {
            // Puts and takes about even (a take half the time finds nothing while faults
            // run), so the backlog left for the drain stays small.
            self.put();
        } else {
            self.take();
        }
    }

    fn connect(&mut self) -> bool {
        let target = &self.spec.targets[self.next_target];
        let wire = match self.spec.protocol {
            Protocol::Iproto => Client::connect_addr(target.addr, REPLY_TIMEOUT)
                .ok()
                .map(Wire::Iproto),
            Protocol::Beanstalk => target
                .beanstalk
                .and_then(|a| Beanstalk::connect(a, &self.spec.tube, REPLY_TIMEOUT).ok())
                .map(Wire::Beanstalk),
        };
        match wire {
            Some(wire) => {
                self.conn = Some(Conn {
                    target: self.next_target,
                    wire,
                    session: self.rec.next_session(),
                    held: Vec::new(),
                    answered_us: self.rec.now_us(),
                });
                true
            }
            None => {
                self.next_target = (self.next_target + 1) % self.spec.targets.len();
                false
            }
        }
    }

    /// Ends the session (its tasks are free from now on, as far as this client knows).
    fn disconnect(&mut self, why: &str) {
        self.disconnect_since(why, None);
    }

    /// Ends the session, which may have ended on the server already at `since_us` (a
    /// server that closed the connection did so after its last answer, at a moment the
    /// client learns only when it next reads): the checker takes the session's holds as
    /// ended from then.
    fn disconnect_since(&mut self, why: &str, since_us: Option<u64>) {
        if let Some(c) = self.conn.take() {
            let mut e = self.rec.event(self.spec.process, Kind::Info, F::Disconnect);
            e.session = Some(c.session);
            e.node = Some(self.spec.targets[c.target].name.clone());
            e.error = Some(why.to_owned());
            e.value = since_us.map(|t| serde_json::json!({ "since_us": t }));
            self.rec.record(&e);
        }
    }

    /// An invoke event of this client's session, recorded.
    fn invoke(&self, f: F) -> Event {
        let c = self.conn.as_ref().expect("connected");
        let mut e = self.rec.event(self.spec.process, Kind::Invoke, f);
        e.node = Some(self.spec.targets[c.target].name.clone());
        e.protocol = Some(self.spec.protocol);
        e.session = Some(c.session);
        e.tube = Some(self.spec.tube.clone());
        e
    }

    fn run(&mut self, op: Op<'_>) -> Outcome {
        let (tube, ttr) = (self.spec.tube.clone(), self.spec.ttr_secs);
        match &mut self.conn.as_mut().expect("connected").wire {
            Wire::Iproto(c) => iproto_op(c, &tube, ttr, op),
            Wire::Beanstalk(b) => beanstalk_op(b, ttr, op),
        }
    }

    /// Records how `invoked` came out; `ok` fills in an ok event. Unknown outcomes and lost
    /// connections end the session; a read-only refusal sends the client to the primary.
    fn complete(&mut self, invoked: &Event, outcome: Outcome) -> Option<Done> {
        let mut e = invoked.clone();
        e.time_us = self.rec.now_us();
        let answered = !matches!(outcome, Outcome::Info(_));
        if let Some(c) = self.conn.as_mut().filter(|_| answered) {
            c.answered_us = invoked.time_us;
        }
        match outcome {
            Outcome::Ok(done) => {
                e.kind = Kind::Ok;
                if !matches!(e.f, F::Ack | F::Release | F::Bury) {
                    e.id = done.id;
                }
                if e.f == F::Take && done.id.is_some() {
                    e.payload.clone_from(&done.payload);
                    e.ttr_ms = Some(self.spec.ttr_secs * 1000);
                }
                self.rec.record(&e);
                return Some(done);
            }
            Outcome::Fail(why) => {
                e.kind = Kind::Fail;
                e.error = Some(why);
                self.rec.record(&e);
            }
            Outcome::ReadOnly(why, primary) => {
                e.kind = Kind::Fail;
                e.error = Some(why);
                self.rec.record(&e);
                // The primary is named by its address; the beanstalk port is on the same host.
                let found = primary
                    .and_then(|p| p.parse::<SocketAddr>().ok())
                    .and_then(|p| self.spec.targets.iter().position(|t| t.addr.ip() == p.ip()));
                let here = self.conn.as_ref().map_or(0, |c| c.target);
                self.next_target = found.unwrap_or((here + 1) % self.spec.targets.len());
                self.disconnect("refused as read-only: going to the primary");
                if found.is_none() {
                    std::thread::sleep(CONNECT_BACKOFF);
                }
            }
            Outcome::Info(why) => {
                e.kind = Kind::Info;
                e.error = Some(why.clone());
                self.rec.record(&e);
                // A connection the server closed: the session ended there, after its last
                // answer; any other loss (a timeout) leaves it to the client's own close.
                let closed = why.contains("closed the connection");
                let since = (self.conn.as_ref())
                    .filter(|_| closed)
                    .map(|c| c.answered_us);
                self.disconnect_since(&format!("outcome unknown: {why}"), since);
                self.next_target = self.rng.usize(0..self.spec.targets.len());
                std::thread::sleep(CONNECT_BACKOFF);
            }
        }
        None
    }

    fn put(&mut self) {
        let payload = format!("c{}-{}", self.spec.process, self.puts);
        self.puts += 1;
        let mut e = self.invoke(F::Put);
        e.payload = Some(payload.clone());
        if self.spec.keys > 0 {
            e.key = Some(format!("k{}", self.rng.u32(0..self.spec.keys)));
        }
        self.rec.record(&e);
        let op = Op::Put {
            payload: &payload,
            key: e.key.as_deref(),
        };
        let outcome = self.run(op);
        self.complete(&e, outcome);
    }

    fn take(&mut self) {
        let e = self.invoke(F::Take);
        self.rec.record(&e);
        let outcome = self.run(Op::Take);
        let took = self.complete(&e, outcome);
        if let (
            Some(Done {
                id: Some(id),
                payload,
            }),
            Some(c),
        ) = (took, self.conn.as_mut())
        {
            c.held.push((id, payload));
        }
    }

    /// An ack or release of a task this session holds, named by its id and, in the history,
    /// by its payload too (each port numbers tasks its own way; the payload is the task).
    fn finish(&mut self, f: F, op: Op<'_>, payload: Option<String>) {
        let mut e = self.invoke(f);
        e.id = match op {
            Op::Ack(id) | Op::Release(id) | Op::Bury(id) => Some(id),
            _ => None,
        };
        e.payload = payload;
        self.rec.record(&e);
        let outcome = self.run(op);
        self.complete(&e, outcome);
    }
}

/// `op` through the tube API of an IPROTO connection.
fn iproto_op(c: &mut Client, tube: &str, ttr_secs: u64, op: Op<'_>) -> Outcome {
    let (function, args, wait) = match op {
        Op::Put { payload, key } => {
            let mut opts = vec![(Value::from("ttr"), Value::from(ttr_secs))];
            if let Some(key) = key {
                opts.push((Value::from("utube"), Value::from(key)));
            }
            ("put", vec![Value::from(payload), Value::Map(opts)], None)
        }
        Op::Take => {
            let wait = Some(Duration::from_secs_f64(TAKE_WAIT_SECS));
            ("take", vec![Value::from(TAKE_WAIT_SECS)], wait)
        }
        Op::Ack(id) => ("ack", vec![Value::from(id)], None),
        Op::Release(id) => ("release", vec![Value::from(id)], None),
        Op::Bury(id) => ("bury", vec![Value::from(id)], None),
    };
    let name = format!("queue.tube.{tube}:{function}");
    outcome_of(c.call(&name, &pack_args(&args), wait))
}

/// How a tube-API call's answer came out: ok (with the task it returned), refused as
/// read-only (naming the primary), of unknown outcome, or refused.
pub(crate) fn outcome_of(answer: Result<Vec<Value>, ClientError>) -> Outcome {
    match answer {
        Ok(values) => {
            let (id, payload) = task_of(&values).map_or((None, None), |(i, p)| (Some(i), p));
            Outcome::Ok(Done { id, payload })
        }
        Err(ClientError::Server { code, message }) if code == ER_READONLY => {
            let primary = tarq_client::cluster::primary_in(&message).map(str::to_owned);
            Outcome::ReadOnly(message, primary)
        }
        Err(ClientError::Server { code, message }) if code == ER_OUTCOME_UNKNOWN => {
            Outcome::Info(message)
        }
        Err(ClientError::Server { code, message }) => {
            Outcome::Fail(format!("{message} (code {code})"))
        }
        Err(e) => Outcome::Info(e.to_string()),
    }
}

/// `op` on a beanstalk connection: put, reserve-with-timeout 0, delete, release.
fn beanstalk_op(b: &mut Beanstalk, ttr_secs: u64, op: Op<'_>) -> Outcome {
    let reply = match op {
        Op::Put { payload, .. } => b.put(payload.as_bytes(), ttr_secs),
        Op::Take => b.reserve(0),
        Op::Ack(id) => b.delete(id),
        Op::Release(id) => b.release(id),
        Op::Bury(id) => b.bury(id),
    };
    let reply = match reply {
        Ok(r) => r,
        Err(e) => return Outcome::Info(e.to_string()),
    };
    let word = reply.words.first().map_or("", String::as_str);
    match word {
        "INSERTED" => Outcome::Ok(Done {
            id: reply.number(1),
            payload: None,
        }),
        "RESERVED" => Outcome::Ok(Done {
            id: reply.number(1),
            payload: reply.body.map(|b| String::from_utf8_lossy(&b).into_owned()),
        }),
        "TIMED_OUT" | "DELETED" | "RELEASED" | "BURIED" => Outcome::Ok(Done::default()),
        "READ_ONLY" => Outcome::ReadOnly(reply.line(), reply.words.get(1).cloned()),
        // No reply of beanstalkd's says "unknown": tarq answers an open outcome so.
        "INTERNAL_ERROR" => Outcome::Info(reply.line()),
        _ => Outcome::Fail(reply.line()),
    }
}

/// The id and payload of the task a call returned, if it returned one.
pub fn task_of(values: &[Value]) -> Option<(u64, Option<String>)> {
    let t = values.first()?.as_array()?;
    let id = t.first()?.as_u64()?;
    Some((id, t.get(2).and_then(Value::as_str).map(str::to_owned)))
}

/// A MessagePack value as JSON, for the history (statistics, cluster overviews).
pub fn json_of(v: &Value) -> serde_json::Value {
    use serde_json::Value as J;
    match v {
        Value::Nil => J::Null,
        Value::Boolean(b) => J::Bool(*b),
        Value::Integer(i) => i
            .as_u64()
            .map(J::from)
            .or_else(|| i.as_i64().map(J::from))
            .unwrap_or(J::Null),
        Value::F32(f) => J::from(f64::from(*f)),
        Value::F64(f) => J::from(*f),
        Value::String(s) => J::from(s.as_str().unwrap_or_default()),
        Value::Binary(b) => J::from(String::from_utf8_lossy(b).into_owned()),
        Value::Array(a) => J::Array(a.iter().map(json_of).collect()),
        Value::Map(m) => J::Object(
            m.iter()
                .map(|(k, v)| {
                    let key = k.as_str().map_or_else(|| k.to_string(), str::to_owned);
                    (key, json_of(v))
                })
                .collect(),
        ),
        Value::Ext(_, b) => J::from(format!("{b:?}")),
    }
}
