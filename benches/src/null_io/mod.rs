//! A null IPROTO server for one question of issue 40 (item 4): does io_uring pay for tarq's
//! depth-1 shape on this machine? It answers as `tarq --null` does — the greeting, then every
//! CALL at once with an empty result, PING and ID as the real server — with the project's
//! codec (`tarq_iproto::split_frame`, `request::decode`, `response`), over one of three I/O
//! loops that share everything but the I/O: [`epoll`] (mio, the real loop's pattern: one
//! `recvfrom` until a short read, one `sendto` a connection a turn, one `epoll_wait` a turn)
//! and [`uring`] (a ring: multishot accept, recv — multishot with a provided-buffer ring, or
//! one recv at a time — and the turn's sends submitted together with the wait, one
//! `io_uring_enter` a turn; SQPOLL as a variant).
//!
//! It lives here, beside the benches, and not behind a setting of the real server: the real
//! loop is mio throughout (listeners, TLS, relays, links, timers, the WAL's waker), so an
//! io_uring path for the null server alone would fork the loop to measure a mechanism. The
//! epoll twin here isolates the mechanism (same code above the I/O), and `tarq --null` in the
//! same runs ties it to the real server. results/io-uring-2026-11-29/ holds what it measured.

pub mod bufring;
pub mod epoll;
pub mod uring;

use std::io;
use std::net::TcpListener;

use tarq_iproto::codes::{ER_INVALID_MSGPACK, ER_UNKNOWN_REQUEST_TYPE};
use tarq_iproto::greeting::GREETING_LEN;
use tarq_iproto::request::{self, RequestKind};
use tarq_iproto::{response, split_frame, FrameError, DEFAULT_MAX_FRAME_BYTES};

/// Which I/O loop serves the connections.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Io {
    /// mio (epoll), as the real server.
    Epoll,
    /// io_uring, with its options.
    Uring(UringOptions),
}

/// How the ring is used.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct UringOptions {
    /// Multishot recv into a provided-buffer ring (kernel 6.0+), instead of one recv a
    /// connection re-armed after each completion into the connection's own buffer.
    pub multishot: bool,
    /// SQPOLL: a kernel thread polls the submission queue and submits for us; the loop enters
    /// the kernel only to wait. The value is the thread's idle time before it sleeps, in ms.
    pub sqpoll_idle_ms: Option<u32>,
    /// The core the SQPOLL thread is pinned to (`IORING_SETUP_SQ_AFF`); unpinned without.
    pub sqpoll_cpu: Option<u32>,
}

/// Binds nothing itself: serves `listener` (already bound, so a caller can bind port 0 and
/// read the port first) with `io` until an I/O error of the loop itself.
pub fn serve(listener: TcpListener, io: Io) -> io::Result<()> {
    listener.set_nonblocking(true)?;
    match io {
        Io::Epoll => epoll::Loop::new(listener)?.run(),
        Io::Uring(opts) => uring::Loop::new(listener, opts)?.run(),
    }
}

/// The greeting every connection gets first. No authentication is offered, so the salt is
/// fixed; the UUID too (one instance).
pub fn greeting() -> [u8; GREETING_LEN] {
    tarq_iproto::greeting::encode(&[7; 16], &[b'n'; tarq_iproto::greeting::SALT_LEN])
}

/// Answers every complete frame at the front of `input` into `out`, as `tarq --null` does,
/// and returns the bytes used; `Err` when the framing is broken (the error is also written,
/// sync 0, and the caller closes once it is sent).
pub fn answer(input: &[u8], out: &mut Vec<u8>) -> Result<usize, FrameError> {
    let mut used = 0;
    loop {
        match split_frame(&input[used..], DEFAULT_MAX_FRAME_BYTES) {
            Ok(Some(f)) => {
                answer_one(&input[used + f.prefix..used + f.total()], out);
                used += f.total();
            }
            Ok(None) => return Ok(used),
            Err(e) => {
                response::error(out, 0, ER_INVALID_MSGPACK, &e.to_string());
                return Err(e);
            }
        }
    }
}

/// One request: a CALL (or CALL_16, EVAL, SELECT) gets an empty result, as from the null
/// server; PING and ID their usual answers; AUTH is accepted (nothing is guarded).
fn answer_one(frame: &[u8], out: &mut Vec<u8>) {
    let req = match request::decode(frame) {
        Ok(r) => r,
        Err(e) => return response::error(out, e.sync, e.code, &e.message),
    };
    match req.kind {
        RequestKind::Call { .. } | RequestKind::Eval { .. } | RequestKind::Select { .. } => {
            response::empty_data(out, req.sync)
        }
        RequestKind::Ping | RequestKind::Auth { .. } => response::ok_empty(out, req.sync),
        RequestKind::Id { .. } => response::id(out, req.sync, response::ID_VERSION),
        _ => response::error(
            out,
            req.sync,
            ER_UNKNOWN_REQUEST_TYPE,
            "not served by the null prototype",
        ),
    }
}

/// What one connection holds between turns, in either loop: the bytes of a frame not yet
/// complete, and the replies not yet handed to the kernel.
#[derive(Debug, Default)]
pub struct Buffers {
    pub input: Vec<u8>,
    pub out: Vec<u8>,
    /// A framing error was answered: close once `out` is sent.
    pub broken: bool,
}

impl Buffers {
    /// A new connection: the greeting waits to be sent.
    pub fn new() -> Buffers {
        Buffers {
            input: Vec::with_capacity(16 * 1024),
            out: greeting().to_vec(),
            broken: false,
        }
    }

    /// Takes `bytes` just read: answers the complete frames, keeping a partial one. The
    /// common case — the input empty and the bytes whole frames — copies nothing.
    pub fn take_input(&mut self, bytes: &[u8]) {
        if self.broken {
            return;
        }
        if self.input.is_empty() {
            match answer(bytes, &mut self.out) {
                Ok(used) => self.input.extend_from_slice(&bytes[used..]),
                Err(_) => self.broken = true,
            }
            return;
        }
        self.input.extend_from_slice(bytes);
        match answer(&self.input, &mut self.out) {
            Ok(used) => {
                self.input.drain(..used);
            }
            Err(_) => self.broken = true,
        }
    }
}
