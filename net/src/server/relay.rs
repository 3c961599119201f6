//! The primary's side of replication: a connection on the ordinary IPROTO port that sent JOIN
//! or SUBSCRIBE becomes a relay, and from then on carries the stream (wire in
//! `tarq_iproto::replication`). A relay goes through up to three phases, all on the loop and
//! none of them blocking it:
//! 1. `Snapshot` (JOIN only): the newest snapshot file, a bounded chunk per turn;
//! 2. `CatchUp`: the retained WAL after the replica's position, read from the segment files
//!    (`tarq_wal::relay::Cursor`) a bounded chunk per turn, up to what the log has written;
//! 3. `Live`: each turn, the bytes the WAL wrote in that turn (its tap), as they are.
//!
//! The first two read only while the replica's socket has taken what was queued before
//! (`LOW_WATER`), so a slow replica costs neither memory nor turns. A live relay gets each
//! turn's records however slow its replica: past `--max-write-backlog` unsent bytes it is cut
//! off, like any client that does not read, and its replica subscribes again from its position
//! (catching up from the files, or joining from a snapshot when they are gone). Whatever is
//! queued in a turn is held with the turn's replies until the turn is durable: a replica never
//! receives a record its primary could still lose.

use std::io::Read;
use std::sync::Arc;

use tarq_engine::Micros;
use tarq_iproto::codes::{
    ER_ACCESS_DENIED, ER_HISTORY_MISMATCH, ER_REPLICATION, ER_WAL_NOT_RETAINED,
};
use tarq_iproto::{replication, response};
use tarq_wal::format::{FORMAT_VERSION, UNNAMED_PEER_VERSION};
use tarq_wal::relay::{self as wal_relay, Cursor, RelayError};
use tarq_wal::WalMode;
use tracing::{info, warn};

use super::conn::Conn;
use super::conns::Conns;
use super::Server;
use crate::frontend::iproto::errors::refusal_text;

/// Snapshot and catch-up bytes are read only while a replica has fewer unsent bytes than this:
/// a few turns of reading ahead keep its socket busy without holding much.
const LOW_WATER: usize = 1 << 20;
/// Bytes of snapshot or retained WAL read for one replica per turn: about a millisecond of
/// reading from the page cache, so catching up never stretches a turn.
const READ_PER_TURN: usize = 256 * 1024;
/// Live bytes go out in frames of at most this much (a turn of big puts spans several).
const FRAME_BYTES: usize = 1 << 20;
/// How often a relay tells its replica where the log is, even when nothing is written: the
/// replica's lag figures, and its proof that the primary lives.
pub const HEARTBEAT_INTERVAL: Micros = 1_000_000;

enum Phase {
    /// Sending the snapshot file; the records after `start` follow.
    Snapshot {
        reader: Box<dyn Read + Send>,
        start: u64,
    },
    CatchUp(Cursor),
    Live,
}

/// One replica's stream.
pub struct Relay {
    phase: Phase,
    /// What the replica says it has applied.
    pub acked: u64,
    next_heartbeat: Micros,
}

impl std::fmt::Debug for Relay {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let phase = match self.phase {
            Phase::Snapshot { .. } => "snapshot",
            Phase::CatchUp(_) => "catch-up",
            Phase::Live => "live",
        };
        f.debug_struct("Relay")
            .field("phase", &phase)
            .field("acked", &self.acked)
            .finish()
    }
}

impl Relay {
    /// Whether the relay has files to read and room to queue them.
    fn has_work(&self, backlog: usize) -> bool {
        !matches!(self.phase, Phase::Live) && backlog < LOW_WATER
    }
}

/// Refused before any stream starts: the code and the message for the replica.
type Refused = (u32, String);

fn refused(e: RelayError) -> Refused {
    let code = if e.needs_join() {
        ER_WAL_NOT_RETAINED
    } else {
        ER_REPLICATION
    };
    (code, e.to_string())
}

impl Server {
    /// JOIN (`after` None) or SUBSCRIBE after record `after` (with the replica's term there and
    /// its history id) from a replica storing WAL `format`: connection `idx` becomes a relay.
    pub(crate) fn start_relay(
        &mut self,
        idx: usize,
        sync: u64,
        format: Option<u32>,
        after: Option<(u64, u64, u64)>,
    ) {
        match self.open_relay(idx, sync, format, after) {
            Ok(relay) => {
                let c = self.conn_mut(idx);
                c.become_relay(relay);
                let (peer, gen) = (c.peer, c.gen);
                self.relays.add(idx, gen);
                self.register_heartbeats();
                info!(%peer, ?after, "replica subscribed");
            }
            Err((code, msg)) => {
                warn!(peer = %self.conn_mut(idx).peer, error = %msg, "replica refused");
                response::error(self.reply_buf(idx), sync, code, &msg);
            }
        }
    }

    /// Whether connection `idx` may become a relay: authenticated, not one already, and this
    /// node the primary.
    fn may_relay(&mut self, idx: usize) -> Result<(), Refused> {
        if let Some(why) = self.node_refusal(idx) {
            return Err((ER_ACCESS_DENIED, why));
        }
        let c = self.conn_mut(idx);
        // A replica receives every task and every user: only a node (which logs in as the
        // bootstrap administrator) may stream, never a user with grants.
        if !c.authenticated || c.who != crate::core::access::Who::Everyone {
            let who = c.who.name().to_owned();
            return Err((
                ER_ACCESS_DENIED,
                format!("Replication access is denied for user '{who}'"),
            ));
        }
        if c.relay().is_some() {
            return Err((ER_REPLICATION, "this connection already streams".into()));
        }
        if !self.leads() {
            let why = match (&self.cluster, self.cfg.replica_of) {
                (Some(c), _) => refusal_text(&c.not_leading()),
                (None, Some(primary)) => format!("the primary is {primary}"),
                (None, None) => "not the primary".into(),
            };
            return Err((
                ER_REPLICATION,
                format!("this tarq does not feed replicas: {why}"),
            ));
        }
        Ok(())
    }

    fn open_relay(
        &mut self,
        idx: usize,
        sync: u64,
        format: Option<u32>,
        subscribe: Option<(u64, u64, u64)>,
    ) -> Result<Relay, Refused> {
        let after = subscribe.map(|s| s.0);
        self.may_relay(idx)?;
        let Some(wal) = self
            .core
            .journal_mut()
            .wal()
            .filter(|w| w.mode() != WalMode::None)
        else {
            // As Tarantool: a log that is not kept cannot be streamed.
            return Err((
                ER_REPLICATION,
                "Replication does not support wal_mode = 'none'".into(),
            ));
        };
        check_format(format)?;
        if let Some((after, term, history)) = subscribe {
            check_history(wal, after, term, history)?;
        }
        let (storage, written) = (wal.storage(), wal.written_seq());
        let now = self.mono;
        let (start, phase) = relay_start(storage, after, written)?;
        let out = self.reply_buf(idx);
        replication::start(out, sync, start, FORMAT_VERSION);
        if after.is_none() && matches!(phase, Phase::CatchUp(_)) {
            replication::snapshot_end(out);
        }
        Ok(Relay {
            phase,
            acked: after.unwrap_or(0),
            next_heartbeat: now,
        })
    }

    /// Input from a replica on its relay: acknowledgements of what it applied.
    pub(crate) fn relay_input(&mut self, idx: usize, frame: &[u8]) {
        if let Ok(replication::Frame::Position { lsn, .. }) = replication::decode(frame) {
            if let Some(r) = self.conn_mut(idx).relay_mut() {
                r.acked = r.acked.max(lsn);
            }
        }
    }

    /// Replicas streaming from this tarq now.
    pub(crate) fn replica_count(&self) -> u64 {
        self.relays.count()
    }

    /// Whether a relay has files to read this turn (the loop does not sleep then).
    pub(super) fn relays_busy(&self) -> bool {
        self.relays.busy(&self.conns)
    }

    /// The next heartbeat due.
    pub(super) fn next_heartbeat(&self) -> Option<Micros> {
        self.relays.next_heartbeat(&self.conns)
    }

    /// After the turn's commit: queues each relay's share of what the WAL wrote (live), of the
    /// files (catching up), and its heartbeat. Runs before the turn's replies are held, so all
    /// of it waits for the turn's durability with them.
    pub(super) fn relay_turn(&mut self) {
        if self.relays.list.is_empty() {
            // With no relay the tap is off, or every write from now on is kept for none: the
            // relays may have been taken since the last turn (a demotion closes them all), and
            // `feed`, which sets the tap from the live relays, runs only while some are left.
            if let Some(wal) = self.core.journal_mut().wal() {
                wal.set_tap(false);
            }
            return;
        }
        if let Some(wal) = self.core.journal_mut().wal() {
            let ended = self.relays.feed(&mut self.conns, wal, self.now, self.mono);
            for (idx, msg) in ended {
                warn!(peer = %self.conns[idx].peer, error = %msg, "replication stream ended");
                self.close_quietly(idx, "replication stream ended");
            }
        }
        self.register_heartbeats();
    }
}

/// This primary's relays: the connections streaming its WAL, and the buffers their feed
/// reuses. The connections themselves are the loop's ([`Conns`]), lent to each call.
#[derive(Default)]
pub(super) struct Relays {
    /// Each relay's connection, by slot and generation.
    list: Vec<(usize, u32)>,
    /// What the WAL wrote in the turn (its tap), for the live relays.
    tap: Vec<u8>,
    /// A chunk of the files read for a relay catching up.
    chunk: Vec<u8>,
    /// What each relay acknowledged, gathered for the sync gate.
    acked: Vec<u64>,
}

impl Relays {
    /// Connection `idx` (of generation `gen`) streams from now on.
    pub fn add(&mut self, idx: usize, gen: u32) {
        self.list.push((idx, gen));
    }

    pub fn count(&self) -> u64 {
        self.list.len() as u64
    }

    /// Each relay's connection and stream, while it is open.
    pub fn streams<'a>(&'a self, conns: &'a Conns) -> impl Iterator<Item = (&'a Conn, &'a Relay)> {
        self.list.iter().filter_map(|&(idx, gen)| {
            let c = conns.get(idx).filter(|c| c.gen == gen)?;
            Some((c, c.relay()?))
        })
    }

    /// What each streaming replica acknowledged as durable, one entry per open relay.
    pub fn acks(&mut self, conns: &Conns) -> &mut Vec<u64> {
        self.acked.clear();
        self.acked
            .extend(self.list.iter().filter_map(|&(idx, gen)| {
                let c = conns
                    .get(idx)
                    .filter(|c| c.gen == gen && c.closing.is_none())?;
                Some(c.relay()?.acked)
            }));
        &mut self.acked
    }

    /// Whether a relay has files to read this turn.
    pub fn busy(&self, conns: &Conns) -> bool {
        self.list.iter().any(|&(idx, gen)| {
            conns.get(idx).is_some_and(|c| {
                c.gen == gen
                    && c.closing.is_none()
                    && c.relay().is_some_and(|r| r.has_work(c.out.backlog()))
            })
        })
    }

    /// The next heartbeat due.
    pub fn next_heartbeat(&self, conns: &Conns) -> Option<Micros> {
        self.streams(conns).map(|(_, r)| r.next_heartbeat).min()
    }

    /// Every relay goes from the list; their connections (those still open) are returned.
    pub fn take_all(&mut self, conns: &Conns) -> Vec<usize> {
        std::mem::take(&mut self.list)
            .into_iter()
            .filter(|&(idx, gen)| conns.get(idx).is_some_and(|c| c.gen == gen))
            .map(|(idx, _)| idx)
            .collect()
    }

    /// Sends each relay what is due: the turn's records (from `wal`'s tap) to live ones, the
    /// next part of the snapshot or the log to the others, a heartbeat when one is owed.
    /// Returns the relays whose stream failed, with why: the loop closes them.
    fn feed(
        &mut self,
        conns: &mut Conns,
        wal: &mut tarq_wal::Wal,
        now: Micros,
        mono: Micros,
    ) -> Vec<(usize, String)> {
        self.list.retain(|&(idx, gen)| {
            conns
                .get(idx)
                .is_some_and(|c| c.gen == gen && c.closing.is_none() && c.relay().is_some())
        });
        wal.take_tap(&mut self.tap);
        let (written, storage) = (wal.written_seq(), wal.storage());
        let mut live = 0;
        let mut failed = Vec::new();
        for &(idx, _) in &self.list {
            conns.mark_flush(idx);
            let (relay, out) = (conns[idx].relay_and_out()).expect("the list holds relays");
            let step = if matches!(relay.phase, Phase::Live) {
                for part in self.tap.chunks(FRAME_BYTES) {
                    replication::data(&mut out.out, replication::XLOG, part);
                }
                Ok(())
            } else if out.backlog() >= LOW_WATER {
                Ok(())
            } else {
                relay.feed(&mut out.out, &mut self.chunk, &storage, written)
            };
            if let Err((code, msg)) = step {
                response::error(&mut out.out, 0, code, &msg);
                failed.push((idx, msg));
                continue;
            }
            live += matches!(relay.phase, Phase::Live) as usize;
            if mono >= relay.next_heartbeat {
                let behind = match &relay.phase {
                    Phase::CatchUp(c) => c.buffered(),
                    _ => 0,
                };
                let backlog = (out.backlog() + behind) as u64;
                replication::heartbeat(&mut out.out, written, now, backlog);
                relay.next_heartbeat = mono + HEARTBEAT_INTERVAL;
            }
        }
        // Copy what the log writes only while some replica streams it live.
        wal.set_tap(live > 0);
        failed
    }
}

impl Relay {
    /// Sends a replica that is not live yet its next part: snapshot chunks, then the log
    /// after the snapshot (`CatchUp`), until it reaches the log's end (`Live`).
    fn feed(
        &mut self,
        out: &mut Vec<u8>,
        chunk: &mut Vec<u8>,
        storage: &Arc<dyn tarq_wal::storage::Storage>,
        written: u64,
    ) -> Result<(), Refused> {
        match &mut self.phase {
            Phase::Live => Ok(()),
            Phase::Snapshot { reader, start } => {
                let start = *start;
                if !send_snapshot(reader, chunk, out)? {
                    return Ok(());
                }
                replication::snapshot_end(out);
                let cursor = Cursor::new(Arc::clone(storage), start, written).map_err(refused)?;
                self.phase = Phase::CatchUp(cursor);
                Ok(())
            }
            Phase::CatchUp(cursor) => {
                chunk.clear();
                let done = cursor.read(chunk, READ_PER_TURN, written).map_err(refused);
                if !chunk.is_empty() {
                    replication::data(out, replication::XLOG, chunk);
                }
                if done? {
                    self.phase = Phase::Live;
                }
                Ok(())
            }
        }
    }
}

/// A replica stores the stream's records byte for byte in its own WAL, whose files say their
/// format: it must store the format this primary writes. One of another format is refused
/// with what to do (a replica from before the exchange names none: format 3).
fn check_format(format: Option<u32>) -> Result<(), Refused> {
    let theirs = format.unwrap_or(UNNAMED_PEER_VERSION);
    if theirs == FORMAT_VERSION {
        return Ok(());
    }
    let todo = if theirs < FORMAT_VERSION {
        "upgrade the replica to this primary's tarq release"
    } else {
        "upgrade this primary to the replica's tarq release"
    };
    Err((
        ER_REPLICATION,
        format!(
            "this primary writes WAL format {FORMAT_VERSION} and the replica's tarq stores \
             format {theirs}: {todo} (replicas and their primary run the same format; see \
             CHANGELOG.md)"
        ),
    ))
}

/// A replica may stream after record `after` only if its log is this one's up to there: the
/// same history, and the same term at `after` (the log-matching rule). A log that diverged
/// (a deposed primary's unacknowledged turns, or records this log never had) joins again; one
/// of another history is refused outright.
fn check_history(wal: &tarq_wal::Wal, after: u64, term: u64, history: u64) -> Result<(), Refused> {
    if history != 0 && wal.history() != 0 && history != wal.history() {
        return Err((
            ER_HISTORY_MISMATCH,
            format!(
                "the replica's log is of history {history:016x}, this primary's of {:016x}: \
                 they share nothing",
                wal.history()
            ),
        ));
    }
    match wal.term_of(after) {
        Some(t) if t == term => Ok(()),
        Some(t) => Err((
            ER_WAL_NOT_RETAINED,
            format!(
                "the replica's log diverged: record {after} is of term {t} here, of term {term} \
                 there; join again"
            ),
        )),
        None if after <= wal.last_seq() && (term != 0 || wal.last_term() != 0) => Err((
            ER_WAL_NOT_RETAINED,
            format!("the term of record {after} is not kept here, so the logs cannot be matched; join again"),
        )),
        // Past this log's end, or a log without terms: the cursor decides.
        None => Ok(()),
    }
}

/// Queues the next chunk of the snapshot file; true once the file is all sent.
fn send_snapshot(
    reader: &mut Box<dyn Read + Send>,
    chunk: &mut Vec<u8>,
    out: &mut Vec<u8>,
) -> Result<bool, Refused> {
    chunk.resize(READ_PER_TURN, 0);
    let n = loop {
        match reader.read(chunk) {
            Ok(n) => break n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err((ER_REPLICATION, format!("reading the snapshot: {e}"))),
        }
    };
    if n > 0 {
        replication::data(out, replication::SNAPSHOT, &chunk[..n]);
    }
    Ok(n == 0)
}

/// Where a relay starts and how: a SUBSCRIBE after `after` catches up from the log; a JOIN
/// sends the newest snapshot and the log after it, or, with no snapshot, the whole log from
/// record 1 (a log that cannot be joined so is refused).
fn relay_start(
    storage: std::sync::Arc<dyn tarq_wal::storage::Storage>,
    after: Option<u64>,
    written: u64,
) -> Result<(u64, Phase), Refused> {
    Ok(match after {
        Some(after) => (
            after,
            Phase::CatchUp(Cursor::new(storage, after, written).map_err(refused)?),
        ),
        None => {
            let src = wal_relay::join_source(&*storage).map_err(refused)?;
            match src.snapshot {
                Some(reader) => (
                    src.start_seq,
                    Phase::Snapshot {
                        reader,
                        start: src.start_seq,
                    },
                ),
                None => (
                    0,
                    Phase::CatchUp(Cursor::new(storage, 0, written).map_err(refused)?),
                ),
            }
        }
    })
}
