//! A link this node opened to another replica set's primary, to forward its clients' calls
//! for the partitions that set owns: one non-blocking IPROTO connection per set, driven by the
//! loop like any socket, many calls in flight on it (each its own sync). It reads the
//! greeting, authenticates with this tarq's own `--user`/`--password` (a cluster shares its
//! credentials), calls `tarq.link` with its name, the link protocol's version and a proof of the
//! cluster's link key over the greeting's salt (`wire::proof`), and then carries [`Ask`]s; the frames queued before the
//! greeting arrived follow it in order. A link that fails is dropped: the calls in flight on it
//! are answered with the failure, and the next forwarded call opens a new one.

use std::io::{self, Read, Write};
use std::net::SocketAddr;

use mio::net::TcpStream;
use mio::{Interest, Registry, Token};
use tarq_engine::Micros;
use tarq_iproto::codes::{ER_OUTCOME_UNKNOWN, ER_READONLY};
use tarq_iproto::greeting::GREETING_LEN;
use tarq_iproto::{auth, client, split_frame};

use crate::config::Credentials;
use crate::core::Refusal;
use crate::frontend::link::wire::{self, Ask};

/// A forwarded call's answer: the DATA of its reply, or what its error means here.
pub(crate) type Answered<'a> = Result<&'a [u8], Refusal>;

/// What an owner's error reply means to the node that forwarded the call: a refusal by a node
/// that does not lead did nothing (`NoPrimary`, so a take moves on and a client may retry); an
/// owner that could not confirm a change it made says so (`Unknown`); anything else failed.
pub(crate) fn refusal_of(code: u32, message: &str) -> Refusal {
    match code {
        ER_READONLY => Refusal::NoPrimary(format!("the owner refused: {message}")),
        ER_OUTCOME_UNKNOWN => Refusal::Unknown(format!("the owner says: {message}")),
        _ => Refusal::Shards(message.to_owned()),
    }
}

/// The next whole answer in `input` from `*used` on: its sync and its DATA, or the error it
/// carries. The handshake's answers are checked here and not returned. Err: the link is
/// unusable (a frame that does not decode, the link refused).
pub(crate) fn next_answer<'a>(
    input: &'a [u8],
    used: &mut usize,
) -> Result<Option<(u64, Answered<'a>)>, String> {
    loop {
        let Some(f) = split_frame(&input[*used..], MAX_ANSWER).map_err(|e| e.to_string())? else {
            return Ok(None);
        };
        let frame = &input[*used + f.prefix..*used + f.total()];
        *used += f.total();
        let resp = client::decode(frame).map_err(|e| e.to_string())?;
        if resp.sync < FIRST_CALL_SYNC {
            if !resp.is_ok() {
                let why = resp.error.unwrap_or("no message");
                return Err(format!("the primary refused the link: {why}"));
            }
            continue;
        }
        let answer = match (resp.is_ok(), resp.data) {
            (true, Some(data)) => Ok(data),
            (true, None) => Err(Refusal::Shards("an answer without data".to_owned())),
            (false, _) => Err(refusal_of(
                resp.code,
                resp.error.unwrap_or("an error without a message"),
            )),
        };
        return Ok(Some((resp.sync, answer)));
    }
}

/// Links' tokens: this base plus the set's slot. Above the upstream's, below the ops'.
pub(crate) const LINK_TOKEN_BASE: usize = 0xE100_0000;
/// The largest answer accepted: a task at the payload limit and its envelope.
const MAX_ANSWER: usize = 64 << 20;

/// Sync numbers below this are the link's own (AUTH, the `tarq.link` call).
pub(crate) const FIRST_CALL_SYNC: u64 = 16;
const AUTH_SYNC: u64 = 1;
const LINK_SYNC: u64 = 2;
/// A PING asking whether a silent link's other end is still there.
const PING_SYNC: u64 = 3;

pub(crate) struct OutLink {
    /// Unique per link opened: input taken out is given back only to the link it came from.
    pub id: u64,
    stream: crate::server::tls::Stream,
    token: Token,
    greeted: bool,
    rbuf: Vec<u8>,
    /// Frames to write (after the greeting's answer: the handshake first).
    wbuf: Vec<u8>,
    /// Frames queued before the greeting arrived.
    held: Vec<u8>,
    want_write: bool,
    /// Who this node is, said in the handshake.
    who: Identity,
    /// When it began connecting, and when a byte last came from the other end (monotonic µs).
    opened_at: Micros,
    last_heard: Micros,
    /// When the last PING was sent, while the link was silent.
    pinged_at: Option<Micros>,
    /// When the other end's greeting came (monotonic µs).
    greeted_at: Option<Micros>,
}

/// What a node says of itself when it opens a link.
pub(crate) struct Identity {
    /// This node's name.
    pub me: std::sync::Arc<str>,
    /// Its cluster's name.
    pub cluster: std::sync::Arc<str>,
    /// The cluster's link key, proven, never sent.
    pub key: tarq_cluster::LinkKey,
}

impl OutLink {
    /// Starts connecting to `addr`.
    pub fn connect(
        addr: SocketAddr,
        slot: usize,
        id: u64,
        who: Identity,
        tls: Option<&std::sync::Arc<rustls::ClientConfig>>,
        now: Micros,
        registry: &Registry,
    ) -> io::Result<OutLink> {
        use crate::server::tls::Stream;
        let tcp = TcpStream::connect(addr)?;
        let _ = tcp.set_nodelay(true);
        // With a cluster CA (`--tls-ca`), over TLS, this node's certificate shown.
        let mut stream = match tls {
            Some(cfg) => Stream::to_node(tcp, cfg, addr)?,
            None => Stream::plain(tcp),
        };
        let token = Token(LINK_TOKEN_BASE + slot);
        registry.register(&mut stream, token, Interest::READABLE | Interest::WRITABLE)?;
        Ok(OutLink {
            id,
            stream,
            token,
            greeted: false,
            rbuf: Vec::new(),
            wbuf: Vec::new(),
            held: Vec::new(),
            want_write: true,
            who,
            opened_at: now,
            last_heard: now,
            pinged_at: None,
            greeted_at: None,
        })
    }

    /// Whether calls may have reached the other side: once greeted, queued calls are written
    /// behind the handshake, and the owner runs what it reads even if it refuses the link
    /// later in the same turn.
    pub fn may_have_sent(&self) -> bool {
        self.greeted
    }

    pub fn close(&mut self, registry: &Registry) {
        let _ = registry.deregister(&mut self.stream);
        let _ = self.stream.shutdown(std::net::Shutdown::Both);
    }

    /// When it began connecting (monotonic µs).
    pub fn opened_at(&self) -> Micros {
        self.opened_at
    }

    /// When the other end greeted it, once it has (monotonic µs).
    pub fn greeted_at(&self) -> Option<Micros> {
        self.greeted_at
    }

    /// Bytes queued and not written yet (behind the greeting, or unread by the other end).
    pub fn unsent_bytes(&self) -> usize {
        self.wbuf.len() + self.held.len()
    }

    /// Queues `ask` as request `sync`.
    pub fn send(&mut self, sync: u64, ask: &Ask<'_>) {
        let buf = if self.greeted {
            &mut self.wbuf
        } else {
            &mut self.held
        };
        wire::write_ask(buf, sync, ask);
    }

    /// Reads what arrived at `now`; handshakes once the greeting is whole. Err: the link is
    /// gone.
    pub fn read(&mut self, cred: Option<&Credentials>, now: Micros) -> Result<(), String> {
        let mut chunk = [0u8; 64 * 1024];
        loop {
            match self.stream.read(&mut chunk) {
                Ok(0) => return Err("the primary closed the link".into()),
                Ok(n) => {
                    self.rbuf.extend_from_slice(&chunk[..n]);
                    self.last_heard = now;
                    self.pinged_at = None;
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(format!("reading the link: {e}")),
            }
        }
        if !self.greeted && self.rbuf.len() >= GREETING_LEN {
            let greeting: Vec<u8> = self.rbuf.drain(..GREETING_LEN).collect();
            let g = client::parse_greeting(&greeting)
                .map_err(|e| format!("the link's greeting: {e}"))?;
            if let Some(cred) = cred {
                let scramble = auth::scramble(&g.salt, &cred.password);
                client::auth(&mut self.wbuf, AUTH_SYNC, &cred.user, &scramble);
            }
            let who = &self.who;
            let args = wire::handshake_args(&who.key, &g.salt, &who.cluster, &who.me);
            client::call(&mut self.wbuf, LINK_SYNC, wire::LINK, &args);
            self.wbuf.append(&mut self.held);
            self.greeted = true;
            self.greeted_at = Some(now);
        }
        Ok(())
    }

    /// The answers read so far, taken out to be handled in place (given back with
    /// [`give_back`](Self::give_back)); empty until the link is greeted.
    pub fn take_input(&mut self) -> Vec<u8> {
        if self.greeted {
            std::mem::take(&mut self.rbuf)
        } else {
            Vec::new()
        }
    }

    /// The input taken, less the `used` bytes of answers handled (a read may have added more
    /// meanwhile: it goes after).
    pub fn give_back(&mut self, mut input: Vec<u8>, used: usize) {
        input.drain(..used);
        input.append(&mut self.rbuf);
        self.rbuf = input;
    }

    /// Whether the other end still answers, at `now`, with `timeout` the longest silence (µs;
    /// 0: never taken for dead): a link silent for a quarter of it is pinged (the answer, like
    /// any byte, counts as heard), and one silent for all of it — or not greeted within it —
    /// is dead. A TCP connection to a host cut off by the network stays open for minutes;
    /// this is how the calls on it get their answer.
    /// Err: taken for dead, and why. [`next_check`](Self::next_check) says when to look again.
    pub fn check(&mut self, now: Micros, timeout: Micros) -> Result<(), String> {
        if timeout == 0 {
            return Ok(());
        }
        let secs = timeout as f64 / 1e6;
        if !self.greeted {
            if now >= self.opened_at + timeout {
                return Err(format!("no greeting within {secs} s of connecting"));
            }
            return Ok(());
        }
        if now >= self.last_heard + timeout {
            return Err(format!("nothing heard for {secs} s, pings unanswered"));
        }
        let every = (timeout / 4).max(1);
        if now >= self.pinged_at.unwrap_or(self.last_heard) + every {
            client::ping(&mut self.wbuf, PING_SYNC);
            self.pinged_at = Some(now);
        }
        Ok(())
    }

    /// When [`check`](Self::check) should look next, as it would say (no ping sent).
    pub fn next_check(&self, timeout: Micros) -> Option<Micros> {
        if timeout == 0 {
            return None;
        }
        if !self.greeted {
            return Some(self.opened_at + timeout);
        }
        let every = (timeout / 4).max(1);
        let next_ping = self.pinged_at.unwrap_or(self.last_heard) + every;
        Some(next_ping.min(self.last_heard + timeout))
    }

    /// Writes what is queued. Err: the link is gone.
    pub fn flush(&mut self, registry: &Registry) -> Result<(), String> {
        (self.stream.flush_tls()).map_err(|e| format!("writing the link: {e}"))?;
        while !self.wbuf.is_empty() {
            match self.stream.write(&self.wbuf) {
                Ok(0) => return Err("the link closed while writing".into()),
                Ok(n) => {
                    self.wbuf.drain(..n);
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) if e.kind() == io::ErrorKind::NotConnected => break,
                Err(e) => return Err(format!("writing the link: {e}")),
            }
        }
        let want = !self.wbuf.is_empty() || !self.greeted || self.stream.wants_write();
        if want != self.want_write {
            let interest = if want {
                Interest::READABLE | Interest::WRITABLE
            } else {
                Interest::READABLE
            };
            registry
                .reregister(&mut self.stream, self.token, interest)
                .map_err(|e| format!("the link's interest: {e}"))?;
            self.want_write = want;
        }
        Ok(())
    }
}
