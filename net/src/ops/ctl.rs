//! `tarq ctl`: a command-line client of a running server — `put`, `take`, `ack`, `release`,
//! `stats` print their result as JSON, `console` opens the interactive console
//! ([`super::console`]). It speaks IPROTO through the shared codec
//! ([`crate::iproto::client`]) over a plain blocking socket: it is an operator's tool, not part
//! of the server's hot path.

use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::path::PathBuf;
use std::time::Duration;

use base64::Engine as _;
use clap::{Args, Subcommand};
use rmpv::Value;

use crate::iproto::client::{self, parse_greeting, GREETING_LEN};
use crate::iproto::{auth, split_frame};

/// Default `--addr`: the server's default `--listen`.
pub const DEFAULT_ADDR: &str = "127.0.0.1:3301";

/// Default `--timeout` in seconds: for connecting and for each reply. A healthy server answers
/// in microseconds; ten seconds only rules out waiting for ever on a wedged one.
pub const DEFAULT_TIMEOUT_SECS: f64 = 10.0;

/// Largest reply accepted: the server's default frame cap (a task's data can be that big).
pub const MAX_REPLY_BYTES: usize = crate::iproto::DEFAULT_MAX_FRAME_BYTES + 1024;

/// `tarq ctl`: talk to a running tarq.
#[derive(Debug, Clone, Args)]
pub struct CtlArgs {
    /// The server's address, HOST:PORT.
    #[arg(long, value_name = "HOST:PORT", default_value = DEFAULT_ADDR)]
    pub addr: String,

    /// Authenticate as this user (chap-sha1); guest when absent.
    #[arg(long, value_name = "NAME", requires = "password")]
    pub user: Option<String>,

    /// The password of --user.
    #[arg(long, value_name = "SECRET", requires = "user")]
    pub password: Option<String>,

    /// Seconds to wait for the connection and for each reply (a take also gets its own timeout).
    #[arg(long, value_name = "SECONDS", default_value_t = DEFAULT_TIMEOUT_SECS)]
    pub timeout: f64,

    #[command(subcommand)]
    pub command: CtlCommand,
}

#[derive(Debug, Clone, Subcommand)]
pub enum CtlCommand {
    /// Put a task; DATA is JSON (`'{"a":1}'`, `42`, `'"s"'`), or else taken as a plain string.
    Put {
        data: String,
        /// Seconds before the task becomes ready.
        #[arg(long, value_name = "SECONDS")]
        delay: Option<f64>,
        /// Seconds after which the task is deleted, in any state.
        #[arg(long, value_name = "SECONDS")]
        ttl: Option<f64>,
        /// Seconds a taken task may stay taken before it is ready again.
        #[arg(long, value_name = "SECONDS")]
        ttr: Option<f64>,
        /// Priority: lower is taken first.
        #[arg(long, allow_negative_numbers = true)]
        pri: Option<i64>,
    },
    /// Take a task (prints null when none is ready in time). The task is released when ctl
    /// exits, since the connection that took it closes: use the console to take and ack.
    Take {
        /// Seconds to wait for a task.
        #[arg(long, value_name = "SECONDS", default_value_t = 0.0)]
        timeout: f64,
    },
    /// Ack a task (only its taker's connection may).
    Ack { id: u64 },
    /// Release a task (only its taker's connection may).
    Release {
        id: u64,
        /// Seconds before it is ready again.
        #[arg(long, value_name = "SECONDS")]
        delay: Option<f64>,
    },
    /// Print queue.stats().
    Stats,
    /// Interactive console: type queue.put('x') and the like.
    Console {
        /// History file [default: ~/.tarq_history].
        #[arg(long, value_name = "FILE")]
        history: Option<PathBuf>,
    },
}

/// What can go wrong talking to the server.
#[derive(Debug, thiserror::Error)]
pub enum CtlError {
    #[error("cannot resolve {addr}: {reason}")]
    Resolve { addr: String, reason: String },
    #[error("cannot connect to {addr}: {source}")]
    Connect { addr: String, source: io::Error },
    #[error("{0}")]
    Io(#[from] io::Error),
    #[error("not a tarq/Tarantool server: {0}")]
    Greeting(String),
    #[error("bad reply from the server: {0}")]
    Protocol(String),
    /// The server answered with an error.
    #[error("{message} (code {code})")]
    Server { code: u32, message: String },
}

/// A blocking IPROTO connection.
pub struct Client {
    stream: TcpStream,
    salt: Vec<u8>,
    buf: Vec<u8>,
    sync: u64,
    timeout: Duration,
}

impl Client {
    /// Connects, reads the greeting, and authenticates when `credentials` are given.
    pub fn connect(
        addr: &str,
        timeout: Duration,
        credentials: Option<(&str, &str)>,
    ) -> Result<Client, CtlError> {
        let resolved: Vec<SocketAddr> = addr
            .to_socket_addrs()
            .map_err(|e| CtlError::Resolve {
                addr: addr.to_string(),
                reason: e.to_string(),
            })?
            .collect();
        let mut last = None;
        let mut stream = None;
        for a in &resolved {
            match TcpStream::connect_timeout(a, timeout) {
                Ok(s) => {
                    stream = Some(s);
                    break;
                }
                Err(e) => last = Some(e),
            }
        }
        let stream = stream.ok_or_else(|| CtlError::Connect {
            addr: addr.to_string(),
            source: last.unwrap_or_else(|| io::Error::other("no address")),
        })?;
        stream.set_nodelay(true)?;
        stream.set_read_timeout(Some(timeout))?;
        stream.set_write_timeout(Some(timeout))?;
        let mut client = Client {
            stream,
            salt: Vec::new(),
            buf: Vec::new(),
            sync: 0,
            timeout,
        };
        let mut hello = [0u8; GREETING_LEN];
        client.stream.read_exact(&mut hello)?;
        let greeting = parse_greeting(&hello).map_err(|e| CtlError::Greeting(e.to_string()))?;
        client.salt = greeting.salt.to_vec();
        if let Some((user, password)) = credentials {
            client.auth(user, password)?;
        }
        Ok(client)
    }

    fn auth(&mut self, user: &str, password: &str) -> Result<(), CtlError> {
        let scramble = auth::scramble(&self.salt, password);
        self.sync += 1;
        let mut out = Vec::new();
        client::auth(&mut out, self.sync, user, &scramble);
        self.roundtrip(&out, None).map(|_| ())
    }

    /// Calls `function` with `args` (a MessagePack array) and returns its results.
    /// `extra_wait` lengthens the reply timeout for a call that may wait (a take).
    pub fn call(
        &mut self,
        function: &str,
        args: &[u8],
        extra_wait: Option<Duration>,
    ) -> Result<Vec<Value>, CtlError> {
        self.sync += 1;
        let mut out = Vec::new();
        client::call(&mut out, self.sync, function, args);
        let data = self.roundtrip(&out, extra_wait)?;
        match data {
            None => Ok(Vec::new()),
            Some(bytes) => match rmpv::decode::read_value(&mut &bytes[..]) {
                Ok(Value::Array(values)) => Ok(values),
                Ok(other) => Err(CtlError::Protocol(format!("DATA is not an array: {other}"))),
                Err(e) => Err(CtlError::Protocol(e.to_string())),
            },
        }
    }

    /// Sends one request and waits for the reply with its sync; returns its raw DATA.
    fn roundtrip(
        &mut self,
        request: &[u8],
        extra_wait: Option<Duration>,
    ) -> Result<Option<Vec<u8>>, CtlError> {
        self.stream.write_all(request)?;
        let wait = self.timeout + extra_wait.unwrap_or_default();
        self.stream.set_read_timeout(Some(wait))?;
        loop {
            if let Some(frame) = split_frame(&self.buf, MAX_REPLY_BYTES)
                .map_err(|e| CtlError::Protocol(e.to_string()))?
            {
                let body = &self.buf[frame.prefix..frame.total()];
                let reply = client::decode(body).map_err(|e| CtlError::Protocol(e.to_string()))?;
                let result = if reply.sync != self.sync {
                    None // a reply to something else (the server's goodbye carries sync 0)
                } else if reply.is_ok() {
                    Some(Ok(reply.data.map(<[u8]>::to_vec)))
                } else {
                    Some(Err(CtlError::Server {
                        code: reply.code,
                        message: reply.error.unwrap_or("(no message)").to_string(),
                    }))
                };
                let error_without_sync = reply.sync == 0 && !reply.is_ok();
                let message = reply.error.unwrap_or_default().to_string();
                let code = reply.code;
                self.buf.drain(..frame.total());
                if let Some(r) = result {
                    return r;
                }
                if error_without_sync {
                    return Err(CtlError::Server { code, message });
                }
                continue;
            }
            let mut chunk = [0u8; 64 * 1024];
            let n = match self.stream.read(&mut chunk) {
                Ok(0) => {
                    return Err(CtlError::Io(io::Error::new(
                        io::ErrorKind::UnexpectedEof,
                        "the server closed the connection",
                    )))
                }
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e)
                    if matches!(
                        e.kind(),
                        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                    ) =>
                {
                    return Err(CtlError::Io(io::Error::new(
                        io::ErrorKind::TimedOut,
                        format!("no reply within {:.1} s", wait.as_secs_f64()),
                    )))
                }
                Err(e) => return Err(e.into()),
            };
            self.buf.extend_from_slice(&chunk[..n]);
        }
    }
}

/// Seconds as a `Duration`, refusing what cannot be one.
fn seconds(what: &str, s: f64) -> anyhow::Result<Duration> {
    Duration::try_from_secs_f64(s)
        .map_err(|_| anyhow::anyhow!("{what} {s} is not a number of seconds"))
}

/// The value `tarq ctl put` sends for DATA: its JSON reading, else the string itself.
pub fn data_value(data: &str) -> Value {
    match serde_json::from_str::<serde_json::Value>(data) {
        Ok(json) => from_json(&json),
        Err(_) => Value::from(data),
    }
}

fn from_json(v: &serde_json::Value) -> Value {
    use serde_json::Value as J;
    match v {
        J::Null => Value::Nil,
        J::Bool(b) => Value::Boolean(*b),
        J::Number(n) => {
            if let Some(u) = n.as_u64() {
                Value::from(u)
            } else if let Some(i) = n.as_i64() {
                Value::from(i)
            } else {
                Value::F64(n.as_f64().unwrap_or(f64::NAN))
            }
        }
        J::String(s) => Value::from(s.as_str()),
        J::Array(a) => Value::Array(a.iter().map(from_json).collect()),
        J::Object(o) => Value::Map(
            o.iter()
                .map(|(k, v)| (Value::from(k.as_str()), from_json(v)))
                .collect(),
        ),
    }
}

/// A MessagePack value as JSON: binary and extension values become base64 strings (extensions
/// as `{"ext": type, "data": base64}`), non-string map keys their JSON text, and non-finite
/// floats their name as a string.
pub fn to_json(v: &Value) -> serde_json::Value {
    use serde_json::Value as J;
    let b64 = |b: &[u8]| base64::engine::general_purpose::STANDARD.encode(b);
    match v {
        Value::Nil => J::Null,
        Value::Boolean(b) => J::Bool(*b),
        Value::Integer(i) => match (i.as_u64(), i.as_i64()) {
            (Some(u), _) => J::from(u),
            (None, Some(s)) => J::from(s),
            _ => J::Null,
        },
        Value::F32(f) => float(f64::from(*f)),
        Value::F64(f) => float(*f),
        Value::String(s) => match s.as_str() {
            Some(s) => J::from(s),
            None => J::from(String::from_utf8_lossy(s.as_bytes()).into_owned()),
        },
        Value::Binary(b) => J::from(b64(b)),
        Value::Array(a) => J::Array(a.iter().map(to_json).collect()),
        Value::Map(m) => J::Object(
            m.iter()
                .map(|(k, v)| {
                    let key = match k {
                        Value::String(s) => String::from_utf8_lossy(s.as_bytes()).into_owned(),
                        other => to_json(other).to_string(),
                    };
                    (key, to_json(v))
                })
                .collect(),
        ),
        Value::Ext(t, data) => serde_json::json!({ "ext": t, "data": b64(data) }),
    }
}

fn float(f: f64) -> serde_json::Value {
    serde_json::Number::from_f64(f).map_or_else(
        || serde_json::Value::from(f.to_string()),
        serde_json::Value::Number,
    )
}

/// Pretty JSON text of a MessagePack value.
pub fn to_json_pretty(v: &Value) -> String {
    serde_json::to_string_pretty(&to_json(v)).expect("a JSON value always serialises")
}

fn pack(args: Vec<Value>) -> Vec<u8> {
    let mut out = Vec::new();
    rmpv::encode::write_value(&mut out, &Value::Array(args)).expect("writing to a Vec cannot fail");
    out
}

/// An options map of the given (name, value) pairs that are set.
fn options(pairs: &[(&str, Option<Value>)]) -> Option<Value> {
    let set: Vec<(Value, Value)> = pairs
        .iter()
        .filter_map(|(k, v)| v.clone().map(|v| (Value::from(*k), v)))
        .collect();
    (!set.is_empty()).then_some(Value::Map(set))
}

/// Runs one `tarq ctl` command, printing its result to `out`.
pub fn run(args: CtlArgs, out: &mut dyn Write) -> anyhow::Result<()> {
    let timeout = seconds("--timeout", args.timeout)?;
    let credentials = args.user.as_deref().zip(args.password.as_deref());
    let mut client = Client::connect(&args.addr, timeout, credentials)?;
    let (function, call_args, extra_wait) = match args.command {
        CtlCommand::Console { history } => {
            return super::console::run(&mut client, &args.addr, history);
        }
        CtlCommand::Put {
            data,
            delay,
            ttl,
            ttr,
            pri,
        } => {
            let mut a = vec![data_value(&data)];
            let f = |v: Option<f64>| v.map(Value::F64);
            if let Some(o) = options(&[
                ("delay", f(delay)),
                ("ttl", f(ttl)),
                ("ttr", f(ttr)),
                ("pri", pri.map(Value::from)),
            ]) {
                a.push(o);
            }
            ("queue.put", a, None)
        }
        CtlCommand::Take { timeout } => {
            let wait = seconds("--timeout of take", timeout)?;
            let a = if timeout > 0.0 {
                vec![Value::F64(timeout)]
            } else {
                vec![]
            };
            ("queue.take", a, Some(wait))
        }
        CtlCommand::Ack { id } => ("queue.ack", vec![Value::from(id)], None),
        CtlCommand::Release { id, delay } => {
            let mut a = vec![Value::from(id)];
            if let Some(o) = options(&[("delay", delay.map(Value::F64))]) {
                a.push(o);
            }
            ("queue.release", a, None)
        }
        CtlCommand::Stats => ("queue.stats", vec![], None),
    };
    let values = client.call(function, &pack(call_args), extra_wait)?;
    // One result prints as itself; none (a take that found nothing) as null.
    let shown = values.into_iter().next().unwrap_or(Value::Nil);
    writeln!(out, "{}", serde_json::to_string(&to_json(&shown))?)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn put_data_is_json_or_else_a_string() {
        for (arg, want) in [
            ("42", Value::from(42u64)),
            ("-1", Value::from(-1i64)),
            ("1.5", Value::F64(1.5)),
            ("\"s\"", Value::from("s")),
            ("hello world", Value::from("hello world")),
            (
                "{\"a\":[1,null]}",
                Value::Map(vec![(
                    Value::from("a"),
                    Value::Array(vec![Value::from(1u64), Value::Nil]),
                )]),
            ),
            ("{broken", Value::from("{broken")),
        ] {
            assert_eq!(data_value(arg), want, "{arg}");
        }
    }

    #[test]
    fn msgpack_shows_as_json() {
        let v = Value::Map(vec![
            (Value::from("id"), Value::from(7u64)),
            (Value::from("runat"), Value::F64(0.0)),
            (Value::from(1u64), Value::Binary(vec![0xff, 0])),
            (Value::from("inf"), Value::F64(f64::INFINITY)),
            (Value::from("e"), Value::Ext(3, vec![1])),
            (Value::from("neg"), Value::from(-5i64)),
        ]);
        assert_eq!(
            to_json(&v).to_string(),
            r#"{"id":7,"runat":0.0,"1":"/wA=","inf":"inf","e":{"ext":3,"data":"AQ=="},"neg":-5}"#
        );
    }
}
