//! One client connection: its socket, session id, read buffer and reply buffer. The loop owns
//! control flow; this file only moves bytes between the socket and the two buffers and reports
//! what happened, so that only the loop ever frees a connection's slot.

use std::collections::VecDeque;
use std::io::{self, Read, Write};
use std::net::SocketAddr;

use tarq_engine::{Bytes, Micros, SessionId};

use super::limits::Guard;
use super::sync::Verdict;
use crate::core::journal::Ticket;
use tarq_iproto::greeting::SALT_LEN;

/// Allocations from this size up get their own mapping (`main` sets glibc's threshold), which
/// goes back to the system when freed. glibc otherwise raises the threshold to the size of any
/// large block freed (up to 32 MiB), after which big read buffers come from the heap, and a
/// storm of big frames that the input budget closes leaves their memory fragmented and
/// resident: at 1,000 stalled 16 MiB frames the RSS peaked 60% above the budget. A fresh
/// mapping is also zero pages the kernel fills on first write, which is what lets a read buffer
/// grow for a big frame without writing to memory the frame has not sent yet.
pub const MMAP_THRESHOLD_BYTES: usize = 1 << 20;

/// Sets glibc's mmap threshold to [`MMAP_THRESHOLD_BYTES`] (fixed: no longer raised as big
/// blocks are freed). `main` calls it first; benches of the engine call it too, so they
/// allocate as the server does.
pub fn set_mmap_threshold() {
    // SAFETY: mallopt only sets an allocator parameter; called before any other thread runs.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES as libc::c_int);
    }
}

/// Initial (and resting) read buffer: Tarantool's `readahead`, enough for a pipelined burst of
/// small requests in one read.
pub const READ_BUF_BYTES: usize = 16 * 1024;

/// Bytes read from one connection in one turn before the loop moves on to the others; the rest
/// waits for the next turn, so a fast sender cannot starve the others.
pub const READ_BUDGET_BYTES: usize = 1024 * 1024;

/// A reply buffer that grew past this (for a burst of replies) shrinks back to
/// `READ_BUF_BYTES` once it has been written out, so an idle connection holds little memory
/// (at `--max-connections` 1000, 64 MiB at most rather than a GiB). The reallocation is paid
/// once per emptied burst of at least this many bytes: nothing next to writing them.
pub const SHRINK_ABOVE_BYTES: usize = 64 * 1024;

/// Sent bytes at the front of the reply buffer are dropped once they exceed this, keeping the
/// buffer from creeping while replies are still held behind a durability ticket.
const COMPACT_SENT_BYTES: usize = 64 * 1024;

/// Bytes received but not yet executed. `buf[head..tail]` is live. When it is full it grows
/// once to the size the protocol's prefix announces for the frame in it (`announced`, within the
/// cap the caller passes), or doubles while none is known. A buffer from
/// [`MMAP_THRESHOLD_BYTES`] up is fresh zero pages, backed only as bytes arrive: announcing a
/// big frame and sending little of it holds little memory, and a big frame that does arrive is
/// neither copied nor faulted in twice on its way (doubling a 16 MiB frame into place copies
/// and faults its bytes again at every step: at 1,000 such frames, most of the loop's time).
#[derive(Debug)]
pub struct ReadBuf {
    buf: Vec<u8>,
    head: usize,
    tail: usize,
    /// The total size of the frame at the start of the data, once its prefix is in.
    announced: fn(&[u8]) -> Option<usize>,
}

fn nothing_announced(_: &[u8]) -> Option<usize> {
    None
}

impl Default for ReadBuf {
    /// An empty placeholder, allocating nothing (the loop swaps it in while executing).
    fn default() -> Self {
        ReadBuf {
            buf: Vec::new(),
            head: 0,
            tail: 0,
            announced: nothing_announced,
        }
    }
}

impl ReadBuf {
    /// A resting buffer for a protocol whose frames announce no size ahead.
    pub fn new() -> Self {
        Self::framed(nothing_announced)
    }

    /// A resting buffer for a protocol whose frames announce their size: `announced(data)` is
    /// the size of the frame `data` starts with, once its prefix is in.
    pub fn framed(announced: fn(&[u8]) -> Option<usize>) -> Self {
        ReadBuf {
            buf: vec![0; READ_BUF_BYTES],
            head: 0,
            tail: 0,
            announced,
        }
    }

    pub fn data(&self) -> &[u8] {
        &self.buf[self.head..self.tail]
    }

    /// Bytes the buffer holds allocated (what the input budget charges beyond the resting size).
    pub fn allocated(&self) -> usize {
        self.buf.len()
    }

    /// Drops the first `n` live bytes (every frame executed in a turn, at once). A buffer that
    /// grew for a burst goes back to [`READ_BUF_BYTES`] once it is empty, so a connection
    /// holds its resting size between bursts. That costs one reallocation per burst that
    /// outgrew the resting size (thousands of requests), never one per request: the loop calls
    /// this once per read, and a burst that fits never grows.
    pub fn consume(&mut self, n: usize) {
        self.head += n;
        debug_assert!(self.head <= self.tail);
        if self.head == self.tail {
            self.head = 0;
            self.tail = 0;
            if self.buf.len() > READ_BUF_BYTES {
                self.buf.truncate(READ_BUF_BYTES);
                self.buf.shrink_to_fit();
            }
        }
    }

    /// Hands over the buffer when it holds exactly one whole frame of [`MMAP_THRESHOLD_BYTES`]
    /// or more (the buffer grew to the size it announced, and the frame filled it), leaving a
    /// resting buffer in its place. A big put's task then keeps the payload where it was read
    /// instead of a copy of it ([`Server::frame_payload`](super::Server)).
    pub fn take_whole_big_frame(&mut self) -> Option<Bytes> {
        let whole = self.head == 0
            && self.tail == self.buf.len()
            && self.tail >= MMAP_THRESHOLD_BYTES
            && (self.announced)(&self.buf[..self.tail]) == Some(self.tail);
        if !whole {
            return None;
        }
        self.tail = 0;
        Some(Bytes::from(std::mem::replace(
            &mut self.buf,
            vec![0; READ_BUF_BYTES],
        )))
    }

    /// Makes room for more input: compacts, or grows to the announced frame size (else double)
    /// up to `max` bytes. False when the buffer is full and may not grow: it is at `max` (the
    /// frame in it exceeds the cap; the caller refuses it), or it holds a whole big frame
    /// (executed before more is read, rather than doubling a buffer sized to it).
    fn make_room(&mut self, max: usize) -> bool {
        if self.tail < self.buf.len() {
            return true;
        }
        if self.head > 0 {
            self.buf.copy_within(self.head..self.tail, 0);
            self.tail -= self.head;
            self.head = 0;
            return true;
        }
        if self.buf.len() >= max {
            return false;
        }
        let want = (self.announced)(&self.buf[..self.tail]).unwrap_or(0);
        if want >= MMAP_THRESHOLD_BYTES && want <= self.tail {
            return false;
        }
        let new_len = (self.buf.len() * 2).max(want).min(max);
        if new_len >= MMAP_THRESHOLD_BYTES {
            // Fresh zeroed pages, backed as the kernel writes received bytes into them;
            // `resize` would write zeros over all of it now.
            let mut grown = vec![0; new_len];
            grown[..self.tail].copy_from_slice(&self.buf[..self.tail]);
            self.buf = grown;
        } else {
            self.buf.resize(new_len, 0);
        }
        true
    }

    /// Reads until the socket is drained, it closes, or `budget` bytes came in.
    ///
    /// Drained is a read that would block or, unless `until_eof`, a read shorter than the room
    /// offered: the kernel hands over all it holds, so a short read emptied the socket, and any
    /// byte arriving later raises a new edge-triggered event. That saves the read that would
    /// only say `WouldBlock`: one syscall per request for a client at depth 1. `until_eof` is
    /// for a peer that has shut its side (or failed): its end of stream raises no new event,
    /// so reading goes on until it shows.
    pub fn fill(
        &mut self,
        src: &mut impl Read,
        max: usize,
        budget: usize,
        until_eof: bool,
    ) -> ReadOutcome {
        let mut got = 0;
        loop {
            if got >= budget {
                return ReadOutcome::Budget;
            }
            if !self.make_room(max) {
                return ReadOutcome::Full;
            }
            let room = self.buf.len() - self.tail;
            match src.read(&mut self.buf[self.tail..]) {
                Ok(0) => return ReadOutcome::Eof,
                Ok(n) => {
                    self.tail += n;
                    got += n;
                    if n < room && !until_eof {
                        return ReadOutcome::Drained;
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return ReadOutcome::Drained,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return ReadOutcome::Error(e),
            }
        }
    }
}

/// How a read burst ended.
#[derive(Debug)]
pub enum ReadOutcome {
    /// Everything available was read.
    Drained,
    /// The per-turn budget ran out with more (maybe) waiting: read again next turn.
    Budget,
    /// The buffer is at its cap and full: a frame over the limit is being sent.
    Full,
    /// The peer closed its side.
    Eof,
    Error(io::Error),
}

/// Replies waiting to be written. `out[sent..released]` may be written now;
/// `out[released..]` is held until durability tickets in `holds` pass.
#[derive(Debug, Default)]
pub struct OutBuf {
    pub out: Vec<u8>,
    sent: usize,
    released: usize,
    /// (ticket, end offset in `out`, whether a reply in it answers a change) for replies held
    /// until that ticket is durable.
    holds: VecDeque<(Ticket, usize, bool)>,
    /// A reply appended since the last hold answers a change (put, ack, release, ...): in
    /// synchronous mode it waits for the replicas too.
    pub changed: bool,
}

impl OutBuf {
    /// Bytes queued and not yet written, held or not.
    pub fn backlog(&self) -> usize {
        self.out.len() - self.sent
    }

    /// Whether bytes were appended since the last [`hold`](Self::hold).
    fn unheld(&self) -> usize {
        self.holds.back().map_or(self.released, |&(_, end, _)| end)
    }

    /// Holds everything appended this turn until `ticket` is durable.
    pub fn hold(&mut self, ticket: Ticket) {
        if self.out.len() > self.unheld() {
            self.holds.push_back((ticket, self.out.len(), self.changed));
        }
        self.changed = false;
    }

    pub fn has_holds(&self) -> bool {
        !self.holds.is_empty()
    }

    /// Releases the replies of every ticket up to `durable`.
    pub fn release(&mut self, durable: Ticket) {
        self.release_if(|t| t <= durable);
    }

    /// Releases replies in order while their ticket is durable (see `Journal::is_durable`).
    pub fn release_if(&mut self, durable: impl Fn(Ticket) -> bool) {
        while let Some(&(t, end, _)) = self.holds.front() {
            if !durable(t) {
                break;
            }
            self.released = end;
            self.holds.pop_front();
        }
    }

    /// The oldest ticket whose replies are held.
    pub fn oldest_hold(&self) -> Option<Ticket> {
        self.holds.front().map(|h| h.0)
    }

    /// Releases replies in order as `verdict` says; a turn that failed (`TimedOut`) has its
    /// held bytes replaced by what `rewrite` makes of them before they are released.
    pub fn release_with(
        &mut self,
        verdict: impl Fn(Ticket, bool) -> Verdict,
        rewrite: &mut dyn FnMut(&[u8], &mut Vec<u8>),
    ) {
        while let Some(&(t, end, changed)) = self.holds.front() {
            match verdict(t, changed) {
                Verdict::Hold => break,
                Verdict::Release => self.released = end,
                Verdict::TimedOut => {
                    let mut new = Vec::new();
                    rewrite(&self.out[self.released..end], &mut new);
                    let len = new.len();
                    self.out.splice(self.released..end, new);
                    let old = end - self.released;
                    for h in self.holds.iter_mut().skip(1) {
                        h.1 = h.1 - old + len;
                    }
                    self.released += len;
                }
            }
            self.holds.pop_front();
        }
    }

    /// Whether released bytes wait to be written.
    pub fn has_released(&self) -> bool {
        self.released > self.sent
    }

    /// One write of everything released. Returns the bytes written (0 when the socket is full).
    pub fn write_to(&mut self, dst: &mut impl Write) -> io::Result<usize> {
        if self.released == self.sent {
            return Ok(0);
        }
        let n = loop {
            match dst.write(&self.out[self.sent..self.released]) {
                Ok(n) => break n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(0),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        };
        self.sent += n;
        if self.sent == self.out.len() {
            self.out.clear();
            self.sent = 0;
            self.released = 0;
            if self.out.capacity() > SHRINK_ABOVE_BYTES {
                self.out = Vec::with_capacity(READ_BUF_BYTES);
            }
        } else if self.sent == self.released && self.sent > COMPACT_SENT_BYTES {
            let sent = self.sent;
            self.out.drain(..sent);
            self.sent = 0;
            self.released -= sent;
            for h in &mut self.holds {
                h.1 -= sent;
            }
        }
        Ok(n)
    }
}

/// A live connection.
#[derive(Debug)]
pub struct Conn {
    /// Plain TCP or TLS over it.
    pub stream: super::tls::Stream,
    pub peer: SocketAddr,
    /// Distinguishes this connection from earlier ones in the same slot (tokens carry it).
    pub gen: u32,
    pub sid: SessionId,
    /// Allowed to call functions (always, unless the server requires a user; always on the
    /// beanstalk port, which has no authentication).
    pub authenticated: bool,
    /// Who the connection acts as: what its calls are checked against (`core::access`).
    pub who: crate::core::access::Who,
    /// Its user's key in `quotas::Quotas`, while it is counted against that user's limits
    /// (authenticated as a user other than the bootstrap administrator).
    pub quota: Option<usize>,
    /// How long its last put must wait for its user's put rate (0: not at all): set while
    /// its input runs, turned into a mute at the end of the turn.
    pub throttle: Micros,
    /// Muted for its user's put rate until then: neither read nor answered.
    pub muted_until: Option<Micros>,
    pub rbuf: ReadBuf,
    pub out: OutBuf,
    /// The poll token: slot and generation.
    pub token: mio::Token,
    /// Registered for WRITABLE: set only while replies wait for room in the socket.
    pub want_write: bool,
    /// Queued in the loop's list of connections to read this turn.
    pub to_read: bool,
    /// The peer shut its side or the socket failed (seen in an event): read until the end of
    /// stream shows, since no further event will announce it.
    pub read_closed: bool,
    /// Queued in the loop's list of connections to flush this turn.
    pub to_flush: bool,
    /// Closing: its session is released; flush what is released, then free the slot.
    pub closing: Option<Closing>,
    /// Its share of the input budget and its deadlines.
    pub guard: Guard,
    /// What it speaks, and what that protocol keeps for it.
    pub proto: Protocol,
}

/// What a connection speaks, with the state its protocol keeps for it.
#[derive(Debug)]
pub enum Protocol {
    /// IPROTO: the greeting's salt (for chap-sha1) and the tube API's session UUID, drawn at
    /// the first `queue.identify()`.
    Iproto {
        salt: [u8; SALT_LEN],
        session_uuid: Option<[u8; 16]>,
    },
    /// A replica streaming this tarq's WAL: an IPROTO connection after its JOIN or SUBSCRIBE.
    Relay(Box<super::relay::Relay>),
    /// The beanstalk port.
    Beanstalk(Box<crate::frontend::beanstalk::BsConn>),
    /// Another node of a sharded cluster forwarding its clients' calls: an IPROTO connection
    /// after its `tarq.link` call.
    Link(Box<crate::frontend::link::LinkConn>),
    /// The HTTP port (web console, JSON API, `/metrics`).
    Http(Box<crate::frontend::http::HttpConn>),
}

impl Conn {
    /// Held for its user's put rate: a put over it ran (`throttle`), or the mute it earned
    /// has not ended. Nothing more of its input runs until then.
    pub fn muted(&self) -> bool {
        self.throttle > 0 || self.muted_until.is_some()
    }

    /// Its beanstalk state, on the beanstalk port.
    pub fn beanstalk(&self) -> Option<&crate::frontend::beanstalk::BsConn> {
        match &self.proto {
            Protocol::Beanstalk(bs) => Some(bs),
            _ => None,
        }
    }

    pub fn beanstalk_mut(&mut self) -> Option<&mut crate::frontend::beanstalk::BsConn> {
        match &mut self.proto {
            Protocol::Beanstalk(bs) => Some(bs),
            _ => None,
        }
    }

    /// Its HTTP state, on the HTTP port.
    pub fn http(&self) -> Option<&crate::frontend::http::HttpConn> {
        match &self.proto {
            Protocol::Http(h) => Some(h),
            _ => None,
        }
    }

    pub fn http_mut(&mut self) -> Option<&mut crate::frontend::http::HttpConn> {
        match &mut self.proto {
            Protocol::Http(h) => Some(h),
            _ => None,
        }
    }

    /// Its relay, once a replica streams on it.
    pub fn relay(&self) -> Option<&super::relay::Relay> {
        match &self.proto {
            Protocol::Relay(r) => Some(r),
            _ => None,
        }
    }

    pub fn relay_mut(&mut self) -> Option<&mut super::relay::Relay> {
        match &mut self.proto {
            Protocol::Relay(r) => Some(r),
            _ => None,
        }
    }

    /// Its link state, once another node forwards on it.
    /// Whether it is a link from another node of a sharded cluster.
    pub fn is_link(&self) -> bool {
        matches!(self.proto, Protocol::Link(_))
    }

    pub fn link_mut(&mut self) -> Option<&mut crate::frontend::link::LinkConn> {
        match &mut self.proto {
            Protocol::Link(l) => Some(l),
            _ => None,
        }
    }

    /// Makes this IPROTO connection a relay: from now on it streams the WAL to a replica.
    pub fn become_relay(&mut self, relay: super::relay::Relay) {
        self.proto = Protocol::Relay(Box::new(relay));
    }

    /// Its relay and its replies, borrowed together (a relay's turn writes the stream into
    /// them).
    pub fn relay_and_out(&mut self) -> Option<(&mut super::relay::Relay, &mut OutBuf)> {
        match &mut self.proto {
            Protocol::Relay(r) => Some((r, &mut self.out)),
            _ => None,
        }
    }

    /// The tube API's session UUID, once `queue.identify()` drew one.
    pub fn session_uuid(&self) -> Option<[u8; 16]> {
        match self.proto {
            Protocol::Iproto { session_uuid, .. } => session_uuid,
            _ => None,
        }
    }

    /// Sets the tube API's session UUID (an IPROTO connection only).
    pub fn set_session_uuid(&mut self, uuid: [u8; 16]) {
        if let Protocol::Iproto { session_uuid, .. } = &mut self.proto {
            *session_uuid = Some(uuid);
        }
    }

    /// The greeting's salt (an IPROTO connection's; zeros for another).
    pub fn salt(&self) -> [u8; SALT_LEN] {
        match self.proto {
            Protocol::Iproto { salt, .. } => salt,
            _ => [0; SALT_LEN],
        }
    }
}

/// Why and how a connection is closing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Closing {
    pub reason: &'static str,
    /// Write what is released before closing (a goodbye error, replies to a half-close).
    pub flush: bool,
    /// With `flush`: when the slot is freed even if replies are still unwritten.
    pub until: Micros,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Hands out its chunks one per read, then an end of stream.
    struct Chunks(Vec<&'static [u8]>, usize);

    impl Read for Chunks {
        fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
            self.1 += 1;
            if self.0.is_empty() {
                return Ok(0);
            }
            let c = self.0.remove(0);
            buf[..c.len()].copy_from_slice(c);
            Ok(c.len())
        }
    }

    #[test]
    fn a_reply_buffer_grown_by_a_burst_shrinks_back_once_written() {
        let mut o = OutBuf::default();
        o.out.extend_from_slice(&[1u8; 4 * SHRINK_ABOVE_BYTES]);
        o.hold(Ticket::default());
        o.release(Ticket::default());
        let mut sink = Vec::new();
        // Written in part: the buffer keeps its room for the rest.
        let mut room = vec![0u8; 2 * SHRINK_ABOVE_BYTES];
        assert_eq!(o.write_to(&mut &mut room[..]).unwrap(), room.len());
        assert!(o.out.capacity() >= 4 * SHRINK_ABOVE_BYTES);
        // Written out: back to the base size.
        o.write_to(&mut sink).unwrap();
        assert_eq!(o.backlog(), 0);
        assert_eq!(o.out.capacity(), READ_BUF_BYTES);
    }

    #[test]
    fn a_short_read_ends_the_burst_unless_the_peer_closed() {
        let mut b = ReadBuf::new();
        let mut src = Chunks(vec![b"abc", b"def"], 0);
        assert!(matches!(
            b.fill(&mut src, 1 << 20, READ_BUDGET_BYTES, false),
            ReadOutcome::Drained
        ));
        assert_eq!(
            (b.data(), src.1),
            (&b"abc"[..], 1),
            "one read, no WouldBlock probe"
        );
        // The peer has shut its side: read on until the end of stream shows.
        assert!(matches!(
            b.fill(&mut src, 1 << 20, READ_BUDGET_BYTES, true),
            ReadOutcome::Eof
        ));
        assert_eq!(b.data(), b"abcdef");
    }

    #[test]
    fn a_read_that_fills_the_room_reads_again() {
        static FULL: [u8; READ_BUF_BYTES] = [7; READ_BUF_BYTES];
        let mut b = ReadBuf::new();
        let mut src = Chunks(vec![&FULL, b"x"], 0);
        assert!(matches!(
            b.fill(&mut src, 1 << 20, READ_BUDGET_BYTES, false),
            ReadOutcome::Drained
        ));
        assert_eq!((b.data().len(), src.1), (READ_BUF_BYTES + 1, 2));
    }

    #[test]
    fn a_buffer_grown_by_a_burst_returns_to_its_resting_size_once_drained() {
        /// A pipelined burst far over the resting size: the buffer doubles up to 1 MiB for it,
        /// and must not keep that size once the burst is executed.
        static BURST: [u8; 512 * 1024] = [7; 512 * 1024];
        let mut b = ReadBuf::new();
        // A slice reads like a socket holding the whole burst: every read fills the room.
        let mut src: &[u8] = &BURST;
        assert!(matches!(
            b.fill(&mut src, 4 << 20, 2 * BURST.len(), false),
            ReadOutcome::Drained | ReadOutcome::Eof
        ));
        assert_eq!(b.data().len(), BURST.len(), "the whole burst was read");
        assert!(b.buf.len() >= BURST.len(), "it grew: {}", b.buf.len());
        // Partly executed: the live bytes stay, and so does the room they need.
        b.consume(BURST.len() - 3);
        assert_eq!(b.data(), [7, 7, 7]);
        assert!(b.buf.len() >= BURST.len());
        // Drained: back to the resting size, in length and in memory held.
        b.consume(3);
        assert!(b.data().is_empty());
        assert_eq!(
            (b.buf.len(), b.buf.capacity()),
            (READ_BUF_BYTES, READ_BUF_BYTES)
        );
        // And it still reads (and grows) as before.
        let mut src = Chunks(vec![b"abc"], 0);
        assert!(matches!(
            b.fill(&mut src, 4 << 20, READ_BUDGET_BYTES, false),
            ReadOutcome::Drained
        ));
        assert_eq!(b.data(), b"abc");
    }

    #[test]
    fn a_buffer_grows_once_to_the_announced_frame_within_the_cap() {
        // A 3 MiB IPROTO frame (0xce + u32 size) arriving in pieces: after the first resting
        // read the buffer takes the frame's whole size at once, then reads into it in place.
        const BODY: usize = 3 << 20;
        let mut frame = vec![0xce];
        frame.extend_from_slice(&(BODY as u32).to_be_bytes());
        frame.resize(5 + BODY, 7);
        let mut b = ReadBuf::framed(tarq_iproto::announced_total);
        let mut src: &[u8] = &frame[..READ_BUF_BYTES + 100];
        b.fill(&mut src, 8 << 20, READ_BUDGET_BYTES, false);
        assert_eq!(b.buf.len(), 5 + BODY, "sized to the frame, not doubled");
        let at = b.buf.as_ptr();
        let mut src: &[u8] = &frame[READ_BUF_BYTES + 100..];
        b.fill(&mut src, 8 << 20, 8 << 20, false);
        assert_eq!(b.data(), &frame[..], "the whole frame, read in place");
        assert_eq!(b.buf.as_ptr(), at, "never moved");
        // The cap wins over the announcement.
        let mut b = ReadBuf::framed(tarq_iproto::announced_total);
        let mut src: &[u8] = &frame[..2 * READ_BUF_BYTES];
        b.fill(&mut src, 20_000, READ_BUDGET_BYTES, false);
        assert_eq!(b.buf.len(), 20_000);
    }

    #[test]
    fn a_whole_big_frame_is_handed_over_in_place_and_nothing_else_is() {
        const BODY: usize = 3 << 20;
        let mut frame = vec![0xce];
        frame.extend_from_slice(&(BODY as u32).to_be_bytes());
        frame.extend((0..BODY).map(|i| (i % 253) as u8));
        let mut b = ReadBuf::framed(tarq_iproto::announced_total);
        let mut src: &[u8] = &frame[..READ_BUF_BYTES];
        b.fill(&mut src, 8 << 20, READ_BUDGET_BYTES, false);
        let mut src: &[u8] = &frame[READ_BUF_BYTES..frame.len() - 1];
        b.fill(&mut src, 8 << 20, 8 << 20, false);
        assert!(b.take_whole_big_frame().is_none(), "one byte short");
        let mut src: &[u8] = &frame[frame.len() - 1..];
        b.fill(&mut src, 8 << 20, 8 << 20, false);
        let at = b.buf.as_ptr();
        let whole = b.take_whole_big_frame().expect("the whole frame");
        assert_eq!(&whole[..], &frame[..]);
        assert_eq!(whole.as_ptr(), at, "the buffer itself, not a copy");
        assert!(b.data().is_empty());
        assert_eq!(
            b.allocated(),
            READ_BUF_BYTES,
            "a resting buffer in its place"
        );
        // Small frames stay where they are.
        let small = [0xce, 0, 0, 0, 3, 1, 2, 3];
        let mut src: &[u8] = &small;
        b.fill(&mut src, 8 << 20, READ_BUDGET_BYTES, false);
        assert!(b.take_whole_big_frame().is_none());
        assert_eq!(b.data(), &small);
    }
}
