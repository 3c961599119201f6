//! The replica's side of replication (`--replica-of ADDR`): one non-blocking connection to the
//! primary's IPROTO port, driven by the loop like any socket (token [`UPSTREAM`]). It reads the
//! greeting, authenticates with this tarq's own `--user`/`--password` when set (a cluster
//! shares its credentials), then SUBSCRIBEs after its position (the last primary record its WAL
//! holds whole) or, when the primary no longer retains that, JOINs: a snapshot, then the
//! records after its start. Records are applied a whole turn at a time
//! (`Wal::apply_replicated`: the restore calls recovery uses, then the replica's own WAL); a
//! snapshot replaces the replica's files and queue (`Wal::join_finish`).
//!
//! Anything unexpected (a refused connection, a primary silent for `SILENCE`, a record that
//! does not fit) drops the connection; it is tried again with a backoff, and a replica whose
//! state cannot be trusted joins again. The replica's own engine never advances deadlines
//! (its primary's promotions, expiries and TTR returns arrive as records), and every change a
//! client asks for is refused naming the primary (`Server::refusal`).

use std::io::{self, Read, Write};
use std::net::SocketAddr;

use mio::net::TcpStream;
use mio::{Interest, Token};
use tarq_engine::Micros;
use tarq_iproto::codes::{ER_HISTORY_MISMATCH, ER_WAL_NOT_RETAINED};
use tarq_iproto::greeting::GREETING_LEN;
use tarq_iproto::replication::{self, Frame};
use tarq_iproto::{auth, client, split_frame};
use tarq_ops::stats::UpstreamFigures;
use tarq_wal::format;
use tracing::{debug, info, warn};

use super::relay::HEARTBEAT_INTERVAL;
use super::Server;

/// The upstream socket's token: its low 32 bits are no connection's slot (those are small) and
/// below the ops components' `TOKEN_BASE`.
pub(super) const UPSTREAM: Token = Token(0xE000_0000);

/// First pause before connecting again after a failure, doubling up to `RETRY_MAX`.
const RETRY_MIN: Micros = 100_000;
const RETRY_MAX: Micros = 5_000_000;
/// A primary that sends nothing (not even a heartbeat) this long is taken for gone.
const SILENCE: Micros = 5 * HEARTBEAT_INTERVAL;
/// Stream bytes read per turn: applying them is the turn's work, so the replica's readers
/// keep their latency while it catches up.
const READ_PER_TURN: usize = 4 << 20;
/// The largest stream frame accepted: a chunk of whole records may carry one record at the WAL's
/// limit beside the relay's chunk.
const MAX_STREAM_FRAME: usize = format::MAX_RECORD_BODY + (4 << 20);

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    Down,
    Greeting,
    Auth,
    /// JOIN or SUBSCRIBE sent; the answer names the position.
    Asked {
        join: bool,
    },
    /// Receiving the snapshot of a JOIN that starts at `start`.
    Snapshot {
        start: u64,
        begun: bool,
    },
    Streaming,
}

/// The stream from the primary.
pub(crate) struct Upstream {
    primary: SocketAddr,
    stream: Option<super::tls::Stream>,
    phase: Phase,
    rbuf: Vec<u8>,
    wbuf: Vec<u8>,
    /// Records received and not yet applied (a turn may span frames).
    records: Vec<u8>,
    retry_at: Micros,
    backoff: Micros,
    last_heard: Micros,
    /// The last read stopped at the turn's budget: read again at once.
    more: bool,
    /// Join next time instead of subscribing.
    need_join: bool,
    /// The primary's last word: what its log has written, and the bytes it held for us.
    primary_lsn: u64,
    primary_backlog: u64,
    /// When this replica last had everything the primary had said it wrote.
    caught_up_at: Micros,
    joins: u64,
    /// The last primary record applied here (kept beside the WAL for the figures).
    position: u64,
    /// The last position acknowledged to the primary on this connection.
    acked: u64,
    /// A cluster node: etcd chose this primary, so a log of another history is replaced by
    /// joining it (outside a cluster such a replica keeps its data and waits for an operator).
    in_cluster: bool,
    /// Why replication last stopped, as logged: the same reason again (a primary that keeps
    /// refusing, every few seconds) is logged at debug only, until the stream is back.
    last_logged: Option<String>,
}

impl Upstream {
    pub(crate) fn new(primary: SocketAddr) -> Self {
        Upstream {
            primary,
            stream: None,
            phase: Phase::Down,
            rbuf: Vec::new(),
            wbuf: Vec::new(),
            records: Vec::new(),
            retry_at: 0,
            backoff: RETRY_MIN,
            last_heard: 0,
            more: false,
            need_join: false,
            primary_lsn: 0,
            primary_backlog: 0,
            caught_up_at: 0,
            joins: 0,
            position: 0,
            acked: 0,
            in_cluster: false,
            last_logged: None,
        }
    }

    /// The primary this stream follows.
    pub(super) fn primary(&self) -> SocketAddr {
        self.primary
    }

    /// This replica belongs to a cluster whose primary etcd names.
    pub(super) fn in_cluster(&mut self) {
        self.in_cluster = true;
    }

    /// Drops the connection (a promotion, or another primary to follow).
    pub(super) fn close(&mut self, registry: &mio::Registry) {
        if let Some(mut s) = self.stream.take() {
            let _ = registry.deregister(&mut s);
        }
        self.phase = Phase::Down;
    }

    /// Work left for the next turn at once.
    pub(super) fn has_work(&self) -> bool {
        self.more
    }

    /// When the loop must look again: the next connection attempt, or the silence limit.
    pub(super) fn next_timer(&self) -> Option<Micros> {
        Some(match self.stream {
            None => self.retry_at,
            Some(_) => self.last_heard + SILENCE,
        })
    }

    /// Reads what the socket has, at most `READ_PER_TURN`; `Err` when the connection is over.
    fn read(&mut self) -> Result<(), String> {
        let Some(s) = &mut self.stream else {
            return Ok(());
        };
        self.more = false;
        let mut got = 0;
        let mut chunk = [0u8; 64 * 1024];
        loop {
            if got >= READ_PER_TURN {
                self.more = true;
                return Ok(());
            }
            match s.read(&mut chunk) {
                Ok(0) => return Err("the primary closed the connection".into()),
                Ok(n) => {
                    self.rbuf.extend_from_slice(&chunk[..n]);
                    got += n;
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(()),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(format!("reading from the primary: {e}")),
            }
        }
    }

    fn flush(&mut self) -> Result<(), String> {
        let Some(s) = &mut self.stream else {
            return Ok(());
        };
        (s.flush_tls()).map_err(|e| format!("writing to the primary: {e}"))?;
        while !self.wbuf.is_empty() {
            match s.write(&self.wbuf) {
                Ok(n) => {
                    self.wbuf.drain(..n);
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(()),
                // Still connecting: the greeting has not come either.
                Err(e) if e.kind() == io::ErrorKind::NotConnected => return Ok(()),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(format!("writing to the primary: {e}")),
            }
        }
        Ok(())
    }
}

/// Why a primary whose stream is in WAL format `format` (`None`: a primary from before the
/// format was exchanged, which wrote 3) cannot be followed, and what to do. This replica
/// stores the records byte for byte in its own WAL, in its own format, and reads them back as
/// such: it never takes another format's records for its own.
fn stream_format_refused(format: Option<u32>) -> String {
    let theirs = format.unwrap_or(format::UNNAMED_PEER_VERSION);
    let ours = format::FORMAT_VERSION;
    let todo = if theirs < ours {
        "upgrade the primary to this replica's tarq release"
    } else {
        "upgrade this replica to the primary's tarq release"
    };
    format!(
        "the primary streams WAL format {theirs} and this replica's tarq stores format {ours}: \
         {todo} (replicas and their primary run the same format; see CHANGELOG.md)"
    )
}

impl Server {
    /// The upstream socket is readable or writable: the turn reads it.
    pub(super) fn upstream_ready(&mut self) {
        if let Some(u) = &mut self.upstream {
            u.more = true;
        }
    }

    /// Once per turn on a replica: connect when due, read and apply what the primary sent,
    /// write acknowledgements.
    pub(super) fn upstream_turn(&mut self) {
        let Some(mut up) = self.upstream.take() else {
            return;
        };
        let result = self.drive_upstream(&mut up);
        if let Err(why) = result {
            self.upstream_down(&mut up, &why);
        }
        self.upstream = Some(up);
        self.register_upstream();
    }

    fn drive_upstream(&mut self, up: &mut Upstream) -> Result<(), String> {
        let now = self.mono;
        if up.stream.is_none() {
            if now < up.retry_at {
                return Ok(());
            }
            let tcp = TcpStream::connect(up.primary)
                .map_err(|e| format!("connecting to {}: {e}", up.primary))?;
            // Acknowledgements are small and a synchronous primary waits for each: Nagle's
            // algorithm would hold one back until the previous one's ACK came.
            tcp.set_nodelay(true)
                .map_err(|e| format!("setting TCP_NODELAY: {e}"))?;
            // With a cluster CA (`--tls-ca`), over TLS, this node's certificate shown.
            let mut s = match &self.tls.nodes {
                Some(cfg) => super::tls::Stream::to_node(tcp, cfg, up.primary)
                    .map_err(|e| format!("TLS to {}: {e}", up.primary))?,
                None => super::tls::Stream::plain(tcp),
            };
            self.poll
                .registry()
                .register(&mut s, UPSTREAM, Interest::READABLE | Interest::WRITABLE)
                .map_err(|e| format!("registering the upstream socket: {e}"))?;
            up.stream = Some(s);
            up.position = self.position();
            up.phase = Phase::Greeting;
            up.acked = 0;
            up.last_heard = now;
            up.rbuf.clear();
            up.records.clear();
        }
        up.read()?;
        // Out of `up` while its frames are handled: they borrow it, and handling changes `up`.
        let mut rbuf = std::mem::take(&mut up.rbuf);
        let mut used = 0;
        let stepped = loop {
            match self.upstream_step(up, &rbuf[used..], now) {
                Ok(Some(n)) => used += n,
                Ok(None) => break Ok(()),
                Err(e) => break Err(e),
            }
        };
        rbuf.drain(..used);
        up.rbuf = rbuf;
        stepped?;
        if used > 0 {
            up.last_heard = now;
        }
        // Each turn made durable here is acknowledged at once: a primary in synchronous mode
        // answers its clients on these.
        if up.phase == Phase::Streaming {
            let durable = self.durable_position();
            if durable > up.acked {
                replication::ack(&mut up.wbuf, durable);
                up.acked = durable;
            }
        }
        if now.saturating_sub(up.last_heard) > SILENCE {
            return Err(format!(
                "the primary sent nothing for {} s",
                SILENCE / 1_000_000
            ));
        }
        up.flush()
    }

    /// Handles the next complete piece of input at the start of `buf`; its length, or `None`
    /// when it is incomplete.
    fn upstream_step(
        &mut self,
        up: &mut Upstream,
        buf: &[u8],
        now: Micros,
    ) -> Result<Option<usize>, String> {
        if up.phase == Phase::Greeting {
            if buf.len() < GREETING_LEN {
                return Ok(None);
            }
            let g = client::parse_greeting(&buf[..GREETING_LEN])
                .map_err(|e| format!("the primary's greeting: {e}"))?;
            if let Some(cred) = &self.cfg.auth {
                let scramble = auth::scramble(&g.salt, &cred.password);
                client::auth(&mut up.wbuf, 1, &cred.user, &scramble);
                up.phase = Phase::Auth;
            } else {
                self.ask(up);
            }
            return Ok(Some(GREETING_LEN));
        }
        let Some(f) =
            split_frame(buf, MAX_STREAM_FRAME).map_err(|e| format!("the primary's stream: {e}"))?
        else {
            return Ok(None);
        };
        let frame = &buf[f.prefix..f.total()];
        let total = f.total();
        if up.phase == Phase::Auth {
            let r = client::decode(frame).map_err(|e| format!("the primary's reply: {e}"))?;
            if !r.is_ok() {
                return Err(format!(
                    "the primary refused authentication: {}",
                    r.error.unwrap_or_default()
                ));
            }
            self.ask(up);
            return Ok(Some(total));
        }
        self.on_frame(up, replication::decode(frame)?, now)?;
        Ok(Some(total))
    }

    /// One frame of the primary's stream: its position, a piece of its snapshot, records, a
    /// heartbeat, or its error.
    fn on_frame(&mut self, up: &mut Upstream, frame: Frame<'_>, now: Micros) -> Result<(), String> {
        match frame {
            Frame::Position { lsn: p, format } => match up.phase {
                Phase::Asked { .. }
                    if format.unwrap_or(format::UNNAMED_PEER_VERSION) != format::FORMAT_VERSION =>
                {
                    return Err(stream_format_refused(format));
                }
                Phase::Asked { join: true } => {
                    up.phase = Phase::Snapshot {
                        start: p,
                        begun: false,
                    }
                }
                _ => {
                    info!(primary = %up.primary, after = p, "streaming from the primary");
                    up.phase = Phase::Streaming;
                    up.backoff = RETRY_MIN;
                    up.last_logged = None;
                }
            },
            Frame::Snapshot(bytes) => {
                let Phase::Snapshot { start, begun } = &mut up.phase else {
                    return Err("a snapshot chunk outside a join".into());
                };
                let wal = self
                    .core
                    .journal_mut()
                    .wal()
                    .ok_or("a replica needs its WAL")?;
                if !*begun {
                    wal.join_begin(*start).map_err(|e| e.to_string())?;
                    *begun = true;
                }
                wal.join_write(bytes).map_err(|e| e.to_string())?;
            }
            Frame::SnapshotEnd => self.joined(up)?,
            Frame::Xlog(bytes) => {
                if up.phase != Phase::Streaming {
                    return Err("records before the stream's start".into());
                }
                up.records.extend_from_slice(bytes);
                self.apply_turns(up, now)?;
            }
            Frame::Heartbeat { lsn, backlog, .. } => {
                up.primary_lsn = up.primary_lsn.max(lsn);
                up.primary_backlog = backlog;
                let position = self.position();
                if position >= up.primary_lsn {
                    up.caught_up_at = now;
                    self.copied_after_start_over(up);
                }
                let durable = self.durable_position();
                replication::ack(&mut up.wbuf, durable);
                up.acked = durable;
            }
            Frame::Error { code, message } => return Err(self.primary_error(up, code, &message)),
        }
        Ok(())
    }

    /// The primary's snapshot is all here: it becomes this replica's queue.
    fn joined(&mut self, up: &mut Upstream) -> Result<(), String> {
        if !matches!(up.phase, Phase::Snapshot { .. }) {
            return Err("a snapshot end outside a join".into());
        }
        let wal = self
            .core
            .journal_mut()
            .wal()
            .ok_or("a replica needs its WAL")?;
        let mut queue = wal.join_finish().map_err(|e| e.to_string())?;
        queue.set_max_tasks(self.cfg.max_tasks);
        self.core.replace_queue(queue);
        up.position = self.position();
        up.joins += 1;
        up.need_join = false;
        up.phase = Phase::Streaming;
        up.backoff = RETRY_MIN;
        up.last_logged = None;
        info!(primary = %up.primary, position = self.position(), "joined the primary");
        Ok(())
    }

    /// The message for an error the primary sent, after marking what it asks of this
    /// replica (a new join, when its log no longer holds this replica's position).
    fn primary_error(&self, up: &mut Upstream, code: u32, message: &str) -> String {
        if code == ER_WAL_NOT_RETAINED || (code == ER_HISTORY_MISMATCH && up.in_cluster) {
            up.need_join = true;
            up.backoff = 0;
        }
        if code == ER_HISTORY_MISMATCH && !up.in_cluster {
            // Retrying cannot help: the operator pointed this replica at a primary that is not
            // the one its data came from, and only they can choose which.
            let dir = self.cfg.data_dir.display();
            return format!(
                "the primary: {message}. This replica's data directory {dir} holds another \
                 primary's log: point --replica-of at that primary, or move {dir} away so \
                 that this tarq copies {} afresh",
                up.primary
            );
        }
        format!("the primary: {message}")
    }

    /// SUBSCRIBE after the position, or JOIN.
    fn ask(&mut self, up: &mut Upstream) {
        if up.need_join {
            replication::join(&mut up.wbuf, 2, format::FORMAT_VERSION);
            info!(primary = %up.primary, "joining the primary from its snapshot");
        } else {
            let position = self.position();
            let (term, history) = self
                .core
                .journal_mut()
                .wal()
                .map_or((0, 0), |w| (w.last_term(), w.history()));
            replication::subscribe(
                &mut up.wbuf,
                2,
                position,
                term,
                history,
                format::FORMAT_VERSION,
            );
        }
        up.phase = Phase::Asked { join: up.need_join };
    }

    /// Applies every whole turn received.
    fn apply_turns(&mut self, up: &mut Upstream, now: Micros) -> Result<(), String> {
        let (mut off, mut commit_end) = (0, 0);
        loop {
            match format::parse_record(&up.records, off) {
                Ok(rec) => {
                    off = rec.end;
                    if rec.kind == format::Kind::Commit {
                        commit_end = off;
                    }
                }
                Err(format::Frame::Incomplete) => break,
                Err(format::Frame::Bad(why)) => {
                    up.need_join = true;
                    return Err(format!("a damaged record from the primary: {why}"));
                }
            }
        }
        if commit_end == 0 {
            return Ok(());
        }
        let (queue, journal) = self.core.queue_and_journal();
        let wal = journal.wal().ok_or("a replica needs its WAL")?;
        // Applied only once the disk has room to log them: on a full disk the stream stops
        // here with nothing applied, and resumes from the position once there is room.
        wal.reserve(commit_end as u64)
            .map_err(|e| format!("no room to log the primary's records: {e}"))?;
        if let Err(e) = wal.apply_replicated(queue, &up.records[..commit_end]) {
            up.need_join = true;
            return Err(format!("applying the primary's records: {e}"));
        }
        up.records.drain(..commit_end);
        let position = self.position();
        up.position = position;
        up.primary_lsn = up.primary_lsn.max(position);
        if position >= up.primary_lsn {
            up.caught_up_at = now;
        }
        Ok(())
    }

    /// This replica holds everything its primary has written: if it set a damaged log aside at
    /// start, it is whole again (and may lead).
    fn copied_after_start_over(&mut self, up: &Upstream) {
        if up.phase != Phase::Streaming {
            return;
        }
        let Some(wal) = self.core.journal_mut().wal() else {
            return;
        };
        if let Some(aside) = wal.finish_start_over() {
            info!(
                primary = %up.primary,
                position = up.position,
                set_aside = %aside.folder,
                "copied the primary again after setting the damaged log aside"
            );
        }
    }

    /// The last primary record this replica holds durably (in its WAL mode).
    fn durable_position(&mut self) -> u64 {
        self.core.journal_mut().wal().map_or(0, |w| w.durable_seq())
    }

    /// The last primary record this replica holds.
    fn position(&mut self) -> u64 {
        self.core.journal_mut().wal().map_or(0, |w| w.last_seq())
    }

    fn upstream_down(&mut self, up: &mut Upstream, why: &str) {
        if let Some(mut s) = up.stream.take() {
            let _ = self.poll.registry().deregister(&mut s);
        }
        let first = up.phase != Phase::Down || up.backoff <= RETRY_MIN;
        if first && up.last_logged.as_deref() != Some(why) {
            warn!(primary = %up.primary, error = why, join = up.need_join, "replication stopped; trying again");
            up.last_logged = Some(why.to_string());
        } else {
            debug!(primary = %up.primary, error = why, "replication still stopped; trying again");
        }
        up.phase = Phase::Down;
        up.more = false;
        up.rbuf.clear();
        up.wbuf.clear();
        up.records.clear();
        up.retry_at = self.mono + up.backoff;
        up.backoff = (up.backoff * 2).clamp(RETRY_MIN, RETRY_MAX);
    }

    /// The replica's figures (`None` on a primary).
    pub(super) fn upstream_figures(&self) -> Option<UpstreamFigures> {
        let up = self.upstream.as_ref()?;
        let position = up.position;
        let lag_records = up.primary_lsn.saturating_sub(position);
        let behind = lag_records > 0;
        Some(UpstreamFigures {
            connected: u64::from(up.phase == Phase::Streaming),
            position,
            lag_records,
            lag_bytes: if behind {
                up.primary_backlog + (up.records.len() + up.rbuf.len()) as u64
            } else {
                0
            },
            lag_ms: if behind {
                self.mono.saturating_sub(up.caught_up_at) / 1000
            } else {
                0
            },
            joins: up.joins,
        })
    }
}
