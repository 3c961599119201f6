//! The ring loop. A turn is one `io_uring_enter`: it submits what the last turn queued (a
//! send per connection with replies, the recvs to re-arm) and waits for at least one
//! completion; then every completion ready is handled — accepted sockets, received bytes
//! answered into the connection's reply buffer, sends done — and the next turn's submissions
//! are queued. Nothing else enters the kernel on the request path: no readiness wait
//! separate from the reads, no read or write call per connection.
//!
//! Without SQPOLL the ring is `SINGLE_ISSUER | DEFER_TASKRUN` (kernel 6.1+): completions'
//! task work runs only inside our wait, in one batch, not as interrupts of the loop. With
//! SQPOLL a kernel thread submits, and the loop enters the kernel only to sleep.
//!
//! A send's bytes must stay put until it completes, so a connection has two reply buffers:
//! the one in flight (`sending`) and the one the turn's answers go to (`Buffers::out`),
//! swapped when a send completes.

use std::io;
use std::net::{Shutdown, TcpListener, TcpStream};
use std::os::fd::{AsRawFd, FromRawFd};

use io_uring::{cqueue, opcode, squeue, types, IoUring};
use slab::Slab;

use super::bufring::{self, BufRing};
use super::{Buffers, UringOptions};

/// Submission queue entries; the completion queue has twice as many, and with
/// `IORING_FEAT_NODROP` an overflow is held by the kernel, not lost.
const RING_ENTRIES: u32 = 1024;
/// Provided buffers for multishot recv: 256 of 16 KiB, the real loop's resting read buffer.
const PBUF_ENTRIES: u16 = 256;
const PBUF_BYTES: usize = 16 * 1024;
/// What a one-shot recv offers, as the real loop's resting read buffer.
const RECV_BYTES: usize = 16 * 1024;

/// A completion's `user_data`: the connection's slot above the low 8 bits, the kind below.
const ACCEPT: u64 = 1;
const RECV: u64 = 2;
const SEND: u64 = 3;

struct Conn {
    stream: TcpStream,
    bufs: Buffers,
    /// The bytes a send in flight reads, and how many of them the kernel took so far.
    sending: Vec<u8>,
    sent: usize,
    /// One-shot recv's own buffer (empty with multishot: the kernel picks a provided one).
    own: Box<[u8]>,
    recv_armed: bool,
    send_armed: bool,
    /// The peer closed, an error, or a framing error answered: no more recvs; the slot is
    /// freed once no operation on it is left in flight.
    closing: bool,
    shut: bool,
}

/// The loop. `ring` is declared before `pbufs` so that it is dropped (and so unregisters the
/// buffer ring) before the buffers' memory is freed.
pub struct Loop {
    ring: IoUring,
    pbufs: Option<BufRing>,
    listener: TcpListener,
    conns: Slab<Conn>,
    opts: UringOptions,
    /// Completions copied out of the ring, so their handling may queue submissions.
    cqes: Vec<(u64, i32, u32)>,
    /// Connections to look at at the end of this turn (send, re-arm, close).
    dirty: Vec<usize>,
    /// Buffers given back this turn, not yet published.
    returned: bool,
}

impl Loop {
    pub fn new(listener: TcpListener, opts: UringOptions) -> io::Result<Loop> {
        let ring = build_ring(&opts)?;
        let pbufs = if opts.multishot {
            Some(BufRing::register(&ring, PBUF_ENTRIES, PBUF_BYTES)?)
        } else {
            None
        };
        Ok(Loop {
            ring,
            pbufs,
            listener,
            conns: Slab::new(),
            opts,
            cqes: Vec::with_capacity(RING_ENTRIES as usize * 2),
            dirty: Vec::new(),
            returned: false,
        })
    }

    /// Serves until the ring itself fails.
    pub fn run(mut self) -> io::Result<()> {
        let accept = opcode::AcceptMulti::new(types::Fd(self.listener.as_raw_fd()));
        self.push(accept.build().user_data(ACCEPT));
        loop {
            match self.ring.submit_and_wait(1) {
                Err(e) if matches!(e.raw_os_error(), Some(code) if is_retry(code)) => {}
                r => {
                    r?;
                }
            }
            self.cqes.extend(
                self.ring
                    .completion()
                    .map(|c| (c.user_data(), c.result(), c.flags())),
            );
            for i in 0..self.cqes.len() {
                let (data, res, flags) = self.cqes[i];
                self.complete(data, res, flags);
            }
            self.cqes.clear();
            if std::mem::take(&mut self.returned) {
                if let Some(p) = &self.pbufs {
                    p.publish();
                }
            }
            for idx in std::mem::take(&mut self.dirty) {
                self.turn_end(idx);
            }
        }
    }

    fn complete(&mut self, data: u64, res: i32, flags: u32) {
        let idx = (data >> 8) as usize;
        match data & 0xff {
            ACCEPT => self.accepted(res, flags),
            RECV => self.received(idx, res, flags),
            SEND => self.sent(idx, res),
            _ => {}
        }
    }

    fn accepted(&mut self, res: i32, flags: u32) {
        if !cqueue::more(flags) {
            // The multishot accept ended (an error, or the kernel's choice): arm it again.
            let accept = opcode::AcceptMulti::new(types::Fd(self.listener.as_raw_fd()));
            self.push(accept.build().user_data(ACCEPT));
        }
        if res < 0 {
            return;
        }
        // SAFETY: a successful accept's result is a new descriptor that nothing else owns.
        let stream = unsafe { TcpStream::from_raw_fd(res) };
        if stream.set_nodelay(true).is_err() {
            return;
        }
        let own = if self.opts.multishot {
            Box::default()
        } else {
            vec![0; RECV_BYTES].into_boxed_slice()
        };
        let idx = self.conns.insert(Conn {
            stream,
            bufs: Buffers::new(),
            sending: Vec::new(),
            sent: 0,
            own,
            recv_armed: false,
            send_armed: false,
            closing: false,
            shut: false,
        });
        self.dirty.push(idx);
    }

    fn received(&mut self, idx: usize, res: i32, flags: u32) {
        let Loop {
            conns,
            pbufs,
            dirty,
            returned,
            ..
        } = self;
        let c = &mut conns[idx];
        if !cqueue::more(flags) {
            c.recv_armed = false;
        }
        dirty.push(idx);
        let bid = cqueue::buffer_select(flags);
        match (res, pbufs.as_mut()) {
            (n, Some(p)) if n > 0 => {
                let bid = bid.expect("a multishot recv's bytes are in a provided buffer");
                c.bufs.take_input(p.get(bid, n as usize));
                p.give_back(bid);
                *returned = true;
            }
            (n, None) if n > 0 => c.bufs.take_input(&c.own[..n as usize]),
            // Every provided buffer in use: arm again once this turn gives them back.
            (n, _) if n == -rustix::io::Errno::NOBUFS.raw_os_error() => {}
            _ => c.closing = true,
        }
    }

    fn sent(&mut self, idx: usize, res: i32) {
        let c = &mut self.conns[idx];
        c.send_armed = false;
        self.dirty.push(idx);
        if res < 0 {
            c.closing = true;
            return;
        }
        c.sent += res as usize;
        if c.sent == c.sending.len() {
            c.sending.clear();
            c.sent = 0;
        }
    }

    /// What a connection needs after this turn's completions: its next send, its recv armed
    /// again, or its close.
    fn turn_end(&mut self, idx: usize) {
        let Some(c) = self.conns.get_mut(idx) else {
            return;
        };
        if !c.send_armed {
            if c.sent == 0 && c.sending.is_empty() && !c.bufs.out.is_empty() {
                std::mem::swap(&mut c.sending, &mut c.bufs.out);
            }
            if c.sent < c.sending.len() {
                let left = &c.sending[c.sent..];
                let fd = types::Fd(c.stream.as_raw_fd());
                let send = opcode::Send::new(fd, left.as_ptr(), left.len() as u32);
                c.send_armed = true;
                self.push(send.build().user_data((idx as u64) << 8 | SEND));
            } else if c.bufs.broken {
                c.closing = true;
            }
        }
        self.arm_or_close(idx);
    }

    fn arm_or_close(&mut self, idx: usize) {
        let c = &mut self.conns[idx];
        if c.closing {
            if c.recv_armed && !c.shut {
                // Ends the armed recv (it completes with 0), after which the slot is freed.
                let _ = c.stream.shutdown(Shutdown::Both);
                c.shut = true;
            }
            if !c.recv_armed && !c.send_armed {
                self.conns.remove(idx);
            }
            return;
        }
        if c.recv_armed {
            return;
        }
        let fd = types::Fd(c.stream.as_raw_fd());
        let recv = match &self.pbufs {
            Some(_) => opcode::RecvMulti::new(fd, bufring::GROUP).build(),
            None => opcode::Recv::new(fd, c.own.as_mut_ptr(), c.own.len() as u32).build(),
        };
        c.recv_armed = true;
        self.push(recv.user_data((idx as u64) << 8 | RECV));
    }

    /// Queues `entry` for the next enter; a full queue is submitted first.
    fn push(&mut self, entry: squeue::Entry) {
        loop {
            // SAFETY: every buffer an entry names lives until its completion: a connection's
            // `own` and `sending` are neither freed nor moved while its recv or send is
            // armed (the slot is removed only with nothing armed), and `sending` is not
            // written to while a send reads it.
            if unsafe { self.ring.submission().push(&entry) }.is_ok() {
                return;
            }
            if let Err(e) = self.ring.submit() {
                assert!(
                    matches!(e.raw_os_error(), Some(c) if is_retry(c)),
                    "io_uring submit: {e}"
                );
            }
        }
    }
}

fn is_retry(code: i32) -> bool {
    code == rustix::io::Errno::INTR.raw_os_error() || code == rustix::io::Errno::BUSY.raw_os_error()
}

/// The ring: SQPOLL when asked, else one issuer with deferred task work.
fn build_ring(opts: &UringOptions) -> io::Result<IoUring> {
    let mut b = IoUring::builder();
    match opts.sqpoll_idle_ms {
        Some(idle) => {
            b.setup_sqpoll(idle);
            if let Some(cpu) = opts.sqpoll_cpu {
                b.setup_sqpoll_cpu(cpu);
            }
        }
        None => {
            b.setup_single_issuer().setup_defer_taskrun();
        }
    }
    b.build(RING_ENTRIES)
}

/// What this kernel offers of what the loop uses: a line per feature, and an error if the
/// ring cannot be made at all (io_uring disabled, or refused by a seccomp filter).
pub fn probe() -> io::Result<Vec<String>> {
    let ring = build_ring(&UringOptions::default())?;
    let mut p = io_uring::Probe::new();
    ring.submitter().register_probe(&mut p)?;
    let mut lines = vec!["ring with SINGLE_ISSUER | DEFER_TASKRUN: made".to_string()];
    for (name, code) in [
        ("ACCEPT", opcode::Accept::CODE),
        ("RECV", opcode::Recv::CODE),
        ("SEND", opcode::Send::CODE),
    ] {
        lines.push(format!("opcode {name}: {}", p.is_supported(code)));
    }
    // Unregistered before its memory is freed, as `Loop`'s field order does for the real one.
    let pbuf = BufRing::register(&ring, 8, 4096)
        .and_then(|b| {
            ring.submitter()
                .unregister_buf_ring(bufring::GROUP)
                .map(|()| b)
        })
        .map(|_| "registered");
    lines.push(format!("provided-buffer ring: {pbuf:?}"));
    lines.push(format!(
        "feature NODROP: {}",
        ring.params().is_feature_nodrop()
    ));
    lines.push(format!(
        "feature FAST_POLL: {}",
        ring.params().is_feature_fast_poll()
    ));
    let sq = build_ring(&UringOptions {
        sqpoll_idle_ms: Some(10),
        ..UringOptions::default()
    })
    .map(|_| "made");
    lines.push(format!("ring with SQPOLL: {sq:?}"));
    Ok(lines)
}
