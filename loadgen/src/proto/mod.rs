//! The protocol drivers: how one queue operation (put, take, ack) is written on the wire for each
//! target, and how its reply is recognised. Each driver is a pure encoder/decoder over byte
//! buffers plus a blocking handshake; sockets, pipelining and timing belong to `runner`.
//!
//! A driver splits the read buffer into frames without knowing which request a frame answers
//! (`split`), then the runner pairs the frame with its request — by sync for IPROTO, whose
//! replies may come out of order, by position for RESP and beanstalkd — and asks the driver to
//! interpret it (`decode`).

pub mod beanstalk;
pub mod iproto;
pub mod resp;

use std::io;

/// Which side of the queue a connection plays.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    Producer,
    Consumer,
}

/// The operation a request performs, remembered until its reply arrives.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Put,
    Take,
    Ack,
}

/// One request to encode.
#[derive(Clone, Copy, Debug)]
pub enum Request<'a> {
    /// Enqueue a message with this payload.
    Put(&'a [u8]),
    /// Take one message. With `wait`, wait up to the driver's take timeout when none is ready;
    /// without, answer at once (only drivers whose waiting take blocks the connection use that).
    Take { wait: bool },
    /// Acknowledge a taken message: IPROTO and beanstalkd use the id, Redis the value itself.
    Ack { id: u64, data: &'a [u8] },
}

/// A decoded reply; `data` borrows from the read buffer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Reply<'a> {
    /// The put was accepted.
    Put,
    /// The take delivered a message.
    Task { id: u64, data: &'a [u8] },
    /// The take timed out (or found nothing).
    NoTask,
    /// The ack removed the message.
    Acked,
    /// The target refused the request; the message is kept for the report.
    Error(String),
}

/// One complete reply frame at the front of the read buffer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Frame<'a> {
    /// Bytes the frame occupies, prefix included.
    pub len: usize,
    /// The request it answers, for protocols that match replies by sync.
    pub sync: Option<u64>,
    /// The reply, when finding the frame's end meant decoding it anyway and the reply says by
    /// itself what it answers (beanstalkd's); the runner then checks it fits the request
    /// instead of asking `decode`.
    pub reply: Option<Reply<'a>>,
}

impl Reply<'_> {
    /// True when this reply can answer a request of `kind`.
    pub fn answers(&self, kind: Kind) -> bool {
        match self {
            Reply::Put => kind == Kind::Put,
            Reply::Task { .. } | Reply::NoTask => kind == Kind::Take,
            Reply::Acked => kind == Kind::Ack,
            Reply::Error(_) => true,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ProtoError {
    #[error("malformed reply: {0}")]
    Malformed(String),
    #[error("reply frame of {len} bytes exceeds the limit of {limit} bytes")]
    TooBig { len: usize, limit: usize },
    #[error("handshake failed: {0}")]
    Handshake(String),
    #[error("unexpected reply to {kind:?}: {reply}")]
    Unexpected { kind: Kind, reply: String },
    #[error(transparent)]
    Io(#[from] io::Error),
}

/// A connection's byte stream during the handshake: a plain socket or a TLS session.
pub trait Duplex: io::Read + io::Write {}

impl<T: io::Read + io::Write> Duplex for T {}

/// A wire protocol spoken by one connection.
pub trait Driver {
    /// Run the blocking part of the connection set-up (greeting, tube selection) on a fresh
    /// stream, before it switches to non-blocking pipelined mode.
    fn handshake(&mut self, stream: &mut dyn Duplex, role: Role) -> Result<(), ProtoError>;

    /// Append one request to `out`; returns the sync it carries (a counter for ordered
    /// protocols, so the runner can still tell requests apart).
    fn encode(&mut self, out: &mut Vec<u8>, req: Request<'_>) -> u64;

    /// Find the first complete frame in `buf`; `Ok(None)` when more bytes are needed.
    fn split<'a>(&self, buf: &'a [u8]) -> Result<Option<Frame<'a>>, ProtoError>;

    /// Interpret a complete frame as the reply to a request of `kind`.
    fn decode<'a>(&self, frame: &'a [u8], kind: Kind) -> Result<Reply<'a>, ProtoError>;

    /// The primary a refusal's text (a `Reply::Error`) names, when the target is a read-only
    /// replica that says where changes go (tarq's ER_READONLY); the runner reconnects there.
    fn primary_in<'a>(&self, _error: &'a str) -> Option<&'a str> {
        None
    }

    /// True when replies come back in request order (RESP, beanstalkd), false when they are
    /// matched by sync (IPROTO).
    fn ordered(&self) -> bool;

    /// True when a waiting take holds up every later request on its connection (Redis's
    /// `BLMOVE`, beanstalkd's `reserve-with-timeout`): the runner then keeps at most one such
    /// take in flight per connection, and only at the tail of its pipeline. IPROTO's parked
    /// take does not block the connection.
    fn blocking_takes(&self) -> bool;
}

/// Short printable excerpt of raw bytes for error messages.
pub(crate) fn excerpt(bytes: &[u8]) -> String {
    /// Enough to recognise a reply without flooding the terminal.
    const EXCERPT_BYTES: usize = 64;
    let cut = &bytes[..bytes.len().min(EXCERPT_BYTES)];
    let mut s = String::from_utf8_lossy(cut).escape_debug().to_string();
    if bytes.len() > EXCERPT_BYTES {
        s.push('…');
    }
    s
}
