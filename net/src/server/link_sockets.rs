//! The sockets of this node's links to other replica sets' primaries: one per set the router
//! knows (its slot), registered with the loop's poll at [`LINK_TOKEN_BASE`] + slot. They only
//! move bytes. What the bytes say — the greeting, the handshake, calls and answers, silence —
//! is the router's (`shards::out_link`), which is handed these sockets for a call and holds
//! no socket of its own, so it can be driven without a network.

use std::io::{self, Read, Write};
use std::net::SocketAddr;
use std::sync::Arc;

use mio::net::TcpStream;
use mio::{Interest, Registry, Token};

use super::tls::Stream;

/// Links' tokens: this base plus the set's slot. Above the upstream's, below the ops'.
pub(crate) const LINK_TOKEN_BASE: usize = 0xE100_0000;

/// Link tokens available: one per replica set the router has known.
const MAX_LINKS: usize = 1 << 16;

/// The links' sockets, by set slot.
pub(crate) struct LinkSockets {
    registry: Registry,
    slots: Vec<Option<LinkSocket>>,
}

struct LinkSocket {
    stream: Stream,
    /// Registered for writability too: bytes wait, or the connection or TLS is under way.
    want_write: bool,
}

impl LinkSockets {
    /// No links yet; `registry` is the loop's (a handle of its own).
    pub fn new(registry: Registry) -> LinkSockets {
        LinkSockets {
            registry,
            slots: Vec::new(),
        }
    }

    /// The set slot whose link `token` names, if it is a link's.
    pub fn slot_of(token: usize) -> Option<usize> {
        let slot = token.checked_sub(LINK_TOKEN_BASE)?;
        (slot < MAX_LINKS).then_some(slot)
    }

    /// Starts connecting slot `slot`'s link to `addr` (over TLS with the cluster CA's
    /// configuration `tls`), closing the one it had.
    pub fn connect(
        &mut self,
        slot: usize,
        addr: SocketAddr,
        tls: Option<&Arc<rustls::ClientConfig>>,
    ) -> io::Result<()> {
        if slot >= MAX_LINKS {
            return Err(io::Error::other(format!(
                "more than {MAX_LINKS} replica sets"
            )));
        }
        self.close(slot);
        let tcp = TcpStream::connect(addr)?;
        let _ = tcp.set_nodelay(true);
        let mut stream = match tls {
            Some(cfg) => Stream::to_node(tcp, cfg, addr)?,
            None => Stream::plain(tcp),
        };
        let token = Token(LINK_TOKEN_BASE + slot);
        (self.registry).register(&mut stream, token, Interest::READABLE | Interest::WRITABLE)?;
        if self.slots.len() <= slot {
            self.slots.resize_with(slot + 1, || None);
        }
        self.slots[slot] = Some(LinkSocket {
            stream,
            want_write: true,
        });
        Ok(())
    }

    /// Reads what slot `slot`'s link has into `into`: how many bytes. Err: the link is gone.
    pub fn read(&mut self, slot: usize, into: &mut Vec<u8>) -> Result<usize, String> {
        let s = socket(&mut self.slots, slot)?;
        let mut chunk = [0u8; 64 * 1024];
        let mut read = 0;
        loop {
            match s.stream.read(&mut chunk) {
                Ok(0) => return Err("the primary closed the link".into()),
                Ok(n) => {
                    into.extend_from_slice(&chunk[..n]);
                    read += n;
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(read),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(format!("reading the link: {e}")),
            }
        }
    }

    /// Writes what it can of `out` (draining what went) to slot `slot`'s link, and watches
    /// for writability while bytes are left or `more` is to come. Err: the link is gone.
    pub fn write(&mut self, slot: usize, out: &mut Vec<u8>, more: bool) -> Result<(), String> {
        let s = socket(&mut self.slots, slot)?;
        (s.stream.flush_tls()).map_err(|e| format!("writing the link: {e}"))?;
        while !out.is_empty() {
            match s.stream.write(out) {
                Ok(0) => return Err("the link closed while writing".into()),
                Ok(n) => {
                    out.drain(..n);
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                // Still connecting: written once it is.
                Err(e) if e.kind() == io::ErrorKind::NotConnected => break,
                Err(e) => return Err(format!("writing the link: {e}")),
            }
        }
        let want = !out.is_empty() || more || s.stream.wants_write();
        if want != s.want_write {
            let interest = if want {
                Interest::READABLE | Interest::WRITABLE
            } else {
                Interest::READABLE
            };
            let token = Token(LINK_TOKEN_BASE + slot);
            (self.registry.reregister(&mut s.stream, token, interest))
                .map_err(|e| format!("the link's interest: {e}"))?;
            s.want_write = want;
        }
        Ok(())
    }

    /// Closes slot `slot`'s link, if it has one.
    pub fn close(&mut self, slot: usize) {
        if let Some(mut s) = self.slots.get_mut(slot).and_then(Option::take) {
            let _ = self.registry.deregister(&mut s.stream);
            let _ = s.stream.shutdown(std::net::Shutdown::Both);
        }
    }
}

fn socket(slots: &mut [Option<LinkSocket>], slot: usize) -> Result<&mut LinkSocket, String> {
    (slots.get_mut(slot).and_then(Option::as_mut))
        .ok_or_else(|| "the link has no socket".to_owned())
}
