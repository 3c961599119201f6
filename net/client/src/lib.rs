//! A blocking IPROTO client: one `std::net::TcpStream` with timeouts, the greeting, chap-sha1
//! authentication, and request/reply round trips matched by sync. It owns the socket side of
//! being a client; the bytes on the wire are `tarq_iproto::client`'s. `tarq ctl`, the console,
//! the end-to-end tests and the load generator's readiness probe all talk through it. It is an
//! operator's and a test's tool, not a hot path: each reply is copied out of the read buffer.
//!
//! [`cluster`] puts several addresses behind it: the first that answers, redirects to the
//! primary a read-only refusal names, and another address when the node in use is lost.

pub mod cluster;

use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::time::Duration;

use rmpv::Value;
use tarq_iproto::client::{self, parse_greeting, Greeting, GREETING_LEN};
use tarq_iproto::{auth, split_frame};

/// Largest reply accepted: the server's default frame cap plus room for the reply's own header
/// (a task's data can be as big as the largest request).
pub const MAX_REPLY_BYTES: usize = tarq_iproto::DEFAULT_MAX_FRAME_BYTES + 1024;

/// Bytes read from the socket at a time: a typical reply fits many times over.
const READ_CHUNK_BYTES: usize = 64 * 1024;

/// What can go wrong talking to a server.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("cannot resolve {addr}: {reason}")]
    Resolve { addr: String, reason: String },
    #[error("cannot connect to {addr}: {source}")]
    Connect { addr: String, source: io::Error },
    #[error("{0}")]
    Io(#[from] io::Error),
    #[error("the server closed the connection")]
    Closed,
    #[error("no reply within {0:.1} s")]
    Timeout(f64),
    #[error("not a tarq/Tarantool server: {0}")]
    Greeting(String),
    #[error("bad reply from the server: {0}")]
    Protocol(String),
    /// The server answered with an error.
    #[error("{message} (code {code})")]
    Server { code: u32, message: String },
}

/// A decoded reply, owned.
#[derive(Debug, Clone, PartialEq)]
pub struct Reply {
    pub sync: u64,
    /// 0 for OK, else the error code.
    pub code: u32,
    /// An error reply (Tarantool's ER_UNKNOWN is code 0: the code alone does not tell).
    pub failed: bool,
    pub schema_version: Option<u64>,
    /// DATA as raw MessagePack.
    pub data: Option<Vec<u8>>,
    /// The error message (IPROTO_ERROR_24).
    pub error: Option<String>,
    /// The reply carries an error stack (IPROTO_ERROR).
    pub has_stack: bool,
    /// The whole body, raw.
    pub body: Vec<u8>,
    /// The first byte of the size prefix (0xce: a u32, as both tarq and Tarantool send).
    pub prefix_marker: u8,
}

impl Reply {
    pub fn is_ok(&self) -> bool {
        !self.failed
    }

    /// DATA decoded: an array's items (empty when the reply has no DATA).
    pub fn values(&self) -> Result<Vec<Value>, ClientError> {
        let Some(bytes) = &self.data else {
            return Ok(Vec::new());
        };
        match rmpv::decode::read_value(&mut &bytes[..]) {
            Ok(Value::Array(values)) => Ok(values),
            Ok(other) => Err(ClientError::Protocol(format!(
                "DATA is not an array: {other}"
            ))),
            Err(e) => Err(ClientError::Protocol(e.to_string())),
        }
    }

    /// `Ok(self)` for an OK reply, else the server's error.
    pub fn into_result(self) -> Result<Reply, ClientError> {
        if self.is_ok() {
            return Ok(self);
        }
        Err(ClientError::Server {
            code: self.code,
            message: self.error.unwrap_or_else(|| "(no message)".into()),
        })
    }
}

/// Encodes values as a MessagePack array: the arguments of a CALL.
pub fn pack_args(values: &[Value]) -> Vec<u8> {
    let mut out = Vec::new();
    rmpv::encode::write_value(&mut out, &Value::Array(values.to_vec()))
        .expect("writing to a Vec cannot fail");
    out
}

/// A blocking IPROTO connection.
pub struct Client {
    stream: TcpStream,
    greeting: Greeting,
    buf: Vec<u8>,
    sync: u64,
    timeout: Duration,
}

impl Client {
    /// Resolves `addr` (HOST:PORT), connects within `timeout` and reads the greeting; every
    /// later reply is waited for at most `timeout`.
    pub fn connect(addr: &str, timeout: Duration) -> Result<Client, ClientError> {
        let resolved: Vec<SocketAddr> = addr
            .to_socket_addrs()
            .map_err(|e| ClientError::Resolve {
                addr: addr.to_string(),
                reason: e.to_string(),
            })?
            .collect();
        let mut last = None;
        for a in &resolved {
            match TcpStream::connect_timeout(a, timeout) {
                Ok(s) => return Client::over(s, timeout),
                Err(e) => last = Some(e),
            }
        }
        Err(ClientError::Connect {
            addr: addr.to_string(),
            source: last.unwrap_or_else(|| io::Error::other("no address")),
        })
    }

    /// [`Client::connect`] to one socket address.
    pub fn connect_addr(addr: SocketAddr, timeout: Duration) -> Result<Client, ClientError> {
        let stream =
            TcpStream::connect_timeout(&addr, timeout).map_err(|source| ClientError::Connect {
                addr: addr.to_string(),
                source,
            })?;
        Client::over(stream, timeout)
    }

    /// Takes over a connected stream: sets the timeouts and reads the greeting.
    pub fn over(stream: TcpStream, timeout: Duration) -> Result<Client, ClientError> {
        stream.set_nodelay(true)?;
        stream.set_read_timeout(Some(timeout))?;
        stream.set_write_timeout(Some(timeout))?;
        let mut stream = stream;
        let mut hello = [0u8; GREETING_LEN];
        stream.read_exact(&mut hello).map_err(|e| match e.kind() {
            io::ErrorKind::UnexpectedEof => ClientError::Closed,
            _ => ClientError::Io(e),
        })?;
        let greeting = parse_greeting(&hello).map_err(|e| ClientError::Greeting(e.to_string()))?;
        Ok(Client {
            stream,
            greeting,
            buf: Vec::new(),
            sync: 0,
            timeout,
        })
    }

    pub fn greeting(&self) -> &Greeting {
        &self.greeting
    }

    /// The socket, for a caller that writes raw bytes (malformed frames, half requests) or
    /// shuts a direction down; `try_clone` gives an owned handle on it.
    pub fn socket(&self) -> &TcpStream {
        &self.stream
    }

    /// True when the connection looks usable for a new request: the peer has not closed it
    /// and sent nothing unasked (a goodbye before closing). Checked without blocking, before
    /// a request is sent, so a connection that died while idle is replaced before anything is
    /// sent on it rather than after.
    pub fn is_open(&self) -> bool {
        if !self.buf.is_empty() || self.stream.set_nonblocking(true).is_err() {
            return false;
        }
        let mut byte = [0u8; 1];
        let peeked = self.stream.peek(&mut byte);
        let restored = self.stream.set_nonblocking(false).is_ok();
        restored && matches!(peeked, Err(e) if e.kind() == io::ErrorKind::WouldBlock)
    }

    /// The sync the next request gets.
    pub fn next_sync(&mut self) -> u64 {
        self.sync += 1;
        self.sync
    }

    /// Writes `bytes` as they are.
    pub fn send(&mut self, bytes: &[u8]) -> Result<(), ClientError> {
        self.stream.write_all(bytes)?;
        Ok(())
    }

    /// Sends the request `build(out, sync)` writes; returns its sync.
    pub fn send_request(
        &mut self,
        build: impl FnOnce(&mut Vec<u8>, u64),
    ) -> Result<u64, ClientError> {
        let sync = self.next_sync();
        let mut out = Vec::new();
        build(&mut out, sync);
        self.send(&out)?;
        Ok(sync)
    }

    /// Sends a request and waits for the reply with its sync, skipping replies to other
    /// requests; an error reply with sync 0 (the server's goodbye) ends the wait.
    pub fn request(
        &mut self,
        build: impl FnOnce(&mut Vec<u8>, u64),
        extra_wait: Option<Duration>,
    ) -> Result<Reply, ClientError> {
        let sync = self.send_request(build)?;
        loop {
            let reply = self
                .recv_within(self.timeout + extra_wait.unwrap_or_default())?
                .ok_or(ClientError::Closed)?;
            if reply.sync == sync || (reply.sync == 0 && !reply.is_ok()) {
                return Ok(reply);
            }
        }
    }

    /// Authenticates as `user` with chap-sha1.
    pub fn auth(&mut self, user: &str, password: &str) -> Result<(), ClientError> {
        let scramble = auth::scramble(&self.greeting.salt, password);
        self.request(|out, sync| client::auth(out, sync, user, &scramble), None)?
            .into_result()
            .map(|_| ())
    }

    /// Calls `function` with `args` (a MessagePack array) and returns its results; `extra_wait`
    /// lengthens the reply timeout for a call that may wait (a take).
    pub fn call(
        &mut self,
        function: &str,
        args: &[u8],
        extra_wait: Option<Duration>,
    ) -> Result<Vec<Value>, ClientError> {
        self.request(
            |out, sync| client::call(out, sync, function, args),
            extra_wait,
        )?
        .into_result()?
        .values()
    }

    /// The next reply, waiting at most the connection's timeout; `None` when the server closed.
    pub fn recv(&mut self) -> Result<Option<Reply>, ClientError> {
        self.recv_within(self.timeout)
    }

    /// The next reply, waiting at most `wait`; `None` when the server closed the connection.
    pub fn recv_within(&mut self, wait: Duration) -> Result<Option<Reply>, ClientError> {
        self.stream.set_read_timeout(Some(wait))?;
        loop {
            if let Some(reply) = self.take_frame()? {
                return Ok(Some(reply));
            }
            let mut chunk = [0u8; READ_CHUNK_BYTES];
            match self.stream.read(&mut chunk) {
                Ok(0) => return Ok(None),
                Ok(n) => self.buf.extend_from_slice(&chunk[..n]),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) if e.kind() == io::ErrorKind::ConnectionReset => return Ok(None),
                Err(e)
                    if matches!(
                        e.kind(),
                        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                    ) =>
                {
                    return Err(ClientError::Timeout(wait.as_secs_f64()))
                }
                Err(e) => return Err(e.into()),
            }
        }
    }

    /// Cuts one complete reply off the read buffer, if there is one.
    fn take_frame(&mut self) -> Result<Option<Reply>, ClientError> {
        let Some(frame) = split_frame(&self.buf, MAX_REPLY_BYTES)
            .map_err(|e| ClientError::Protocol(e.to_string()))?
        else {
            return Ok(None);
        };
        let r = client::decode(&self.buf[frame.prefix..frame.total()])
            .map_err(|e| ClientError::Protocol(e.to_string()))?;
        let reply = Reply {
            sync: r.sync,
            code: r.code,
            failed: r.failed,
            schema_version: r.schema_version,
            data: r.data.map(<[u8]>::to_vec),
            error: r.error.map(str::to_string),
            has_stack: r.error_stack.is_some(),
            body: r.body.to_vec(),
            prefix_marker: self.buf[0],
        };
        self.buf.drain(..frame.total());
        Ok(Some(reply))
    }
}
