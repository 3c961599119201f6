//! The epoll twin of the ring loop: mio, with the real server's I/O pattern (docs/design/
//! server.md, "Loop") and nothing else — per turn one `epoll_wait`; per readable connection
//! reads until a read comes back shorter than the room offered (no `EAGAIN` probe at depth 1);
//! one write per connection with replies; WRITABLE interest only while a socket is full. It
//! exists so that the ring is compared with the same code above the I/O, not only with the
//! real server's null mode, which also keeps its figures, limits and timers.

use std::io::{self, Read, Write};
use std::net::TcpListener;

use mio::net::TcpStream;
use mio::{Events, Interest, Poll, Token};
use slab::Slab;

use super::Buffers;

const LISTENER: Token = Token(usize::MAX);
/// What one read offers, as the real loop's resting read buffer.
const READ_BYTES: usize = 16 * 1024;

struct Conn {
    stream: TcpStream,
    bufs: Buffers,
    want_write: bool,
}

/// The loop: a poll, the listener, the connections.
pub struct Loop {
    poll: Poll,
    listener: mio::net::TcpListener,
    conns: Slab<Conn>,
    /// Connections with replies to write at the end of this turn.
    dirty: Vec<usize>,
    scratch: Box<[u8; READ_BYTES]>,
}

impl Loop {
    pub fn new(listener: TcpListener) -> io::Result<Loop> {
        let poll = Poll::new()?;
        let mut listener = mio::net::TcpListener::from_std(listener);
        poll.registry()
            .register(&mut listener, LISTENER, Interest::READABLE)?;
        Ok(Loop {
            poll,
            listener,
            conns: Slab::new(),
            dirty: Vec::new(),
            scratch: Box::new([0; READ_BYTES]),
        })
    }

    /// Serves until the poll itself fails.
    pub fn run(mut self) -> io::Result<()> {
        let mut events = Events::with_capacity(1024);
        loop {
            match self.poll.poll(&mut events, None) {
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                r => r?,
            }
            for ev in events.iter() {
                match ev.token() {
                    LISTENER => self.accept_all()?,
                    Token(idx) if ev.is_readable() || ev.is_read_closed() => self.read(idx),
                    Token(idx) => self.dirty.push(idx),
                }
            }
            for idx in std::mem::take(&mut self.dirty) {
                self.flush(idx);
            }
        }
    }

    fn accept_all(&mut self) -> io::Result<()> {
        loop {
            let (mut stream, _) = match self.listener.accept() {
                Ok(s) => s,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(()),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                // A connection that died before it was accepted, or no fd left: the next.
                Err(_) => return Ok(()),
            };
            stream.set_nodelay(true)?;
            let entry = self.conns.vacant_entry();
            let idx = entry.key();
            self.poll
                .registry()
                .register(&mut stream, Token(idx), Interest::READABLE)?;
            entry.insert(Conn {
                stream,
                bufs: Buffers::new(),
                want_write: false,
            });
            self.dirty.push(idx);
        }
    }

    /// Reads until drained, answering as the bytes come.
    fn read(&mut self, idx: usize) {
        let Some(c) = self.conns.get_mut(idx) else {
            return;
        };
        loop {
            match c.stream.read(&mut self.scratch[..]) {
                Ok(0) => return self.close(idx),
                Ok(n) => {
                    c.bufs.take_input(&self.scratch[..n]);
                    if n < READ_BYTES {
                        break;
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => return self.close(idx),
            }
        }
        self.dirty.push(idx);
    }

    /// One write of what the connection's turn produced; WRITABLE interest while some is left.
    fn flush(&mut self, idx: usize) {
        let Some(c) = self.conns.get_mut(idx) else {
            return;
        };
        if !c.bufs.out.is_empty() {
            match c.stream.write(&c.bufs.out) {
                Ok(n) => {
                    c.bufs.out.drain(..n);
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(_) => return self.close(idx),
            }
        }
        let left = !c.bufs.out.is_empty();
        if !left && c.bufs.broken {
            return self.close(idx);
        }
        if left != c.want_write {
            let interest = if left {
                Interest::READABLE | Interest::WRITABLE
            } else {
                Interest::READABLE
            };
            if self
                .poll
                .registry()
                .reregister(&mut c.stream, Token(idx), interest)
                .is_err()
            {
                return self.close(idx);
            }
            c.want_write = left;
        }
    }

    fn close(&mut self, idx: usize) {
        if let Some(mut c) = self.conns.try_remove(idx) {
            let _ = self.poll.registry().deregister(&mut c.stream);
        }
    }
}
