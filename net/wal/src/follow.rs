//! A replica's side of the log: its WAL follows a primary's. The server hands it whole turns of
//! the primary's records (`apply_replicated`): they are applied to the queue through the same
//! silent restore calls recovery uses (`recovery::apply_change`) and written to this WAL with
//! the primary's sequence numbers, byte for byte, so a restart recovers the replica as any
//! tarq recovers and resumes the stream after its last complete turn. A replica whose position
//! the primary no longer retains receives a snapshot instead (`join_begin`, `join_write`,
//! `join_finish`): its own files are replaced by that snapshot and the queue is reloaded
//! from it.
//!
//! What goes over the wire, and when, is the server's business; this file only turns records
//! into state and files.

use std::sync::Arc;

use tarq_engine::Queue;

use super::format::{self, Change, SNAP_SUFFIX, WAL_SUFFIX};
use super::storage::StorageFile;
use super::{
    pending, recovery, snapshot, Batch, SnapState, Terms, Wal, WalError, WalMode, BLOCKING_STEP,
};

/// Longest `join_finish` waits for a snapshot of the replica's own that is being committed
/// (its commit renames and removes files the join replaces).
const COMMIT_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

/// A snapshot being received from the primary.
struct Incoming {
    file: Arc<dyn StorageFile>,
    name: String,
    start_seq: u64,
}

/// The replica's state beside the log itself.
pub(crate) struct Follow {
    /// Records up to here may meet a task in a later state than they expect (the end of the
    /// snapshot the replica started from).
    fuzzy_upto: u64,
    incoming: Option<Incoming>,
}

impl Follow {
    pub(crate) fn new(fuzzy_upto: u64) -> Self {
        Self {
            fuzzy_upto,
            incoming: None,
        }
    }
}

/// A received snapshot's temporary name: removed by the next start if the replica dies first.
fn join_name(start_seq: u64) -> String {
    format!("{}.join{}", start_seq, format::INPROGRESS_SUFFIX)
}

impl Wal {
    /// Applies whole turns of the primary's records (`bytes` ends with a `Commit`) to `queue`
    /// and writes them to this WAL. Records at or below the position are skipped: a resumed
    /// stream, or a turn the primary rewrote after a failed write, comes again. Returns the
    /// records applied. An error (a gap, damage, a record that does not fit the state) leaves
    /// the queue partly changed: the replica must join again.
    pub fn apply_replicated(&mut self, queue: &mut Queue, bytes: &[u8]) -> Result<u64, String> {
        if self.open.is_some() {
            return Err("the replica journaled changes of its own".into());
        }
        let mut expect = self.last_seq + 1;
        let (mut off, mut new_from) = (0, None);
        let mut turn: Vec<(u64, Change)> = Vec::new();
        while off < bytes.len() {
            let rec = format::parse_record(bytes, off)
                .map_err(|e| format!("stream offset {off}: {e:?}"))?;
            let at = off;
            off = rec.end;
            if rec.seq < expect {
                continue;
            }
            if rec.seq != expect {
                return Err(format!("record {} where {expect} was due", rec.seq));
            }
            new_from.get_or_insert(at);
            expect += 1;
            // The stream is in this build's format: the handshake refuses a primary of another
            // (`tarq_iproto::replication::FORMAT`), as the bytes go to this WAL as they are.
            let change = format::decode_change(rec.kind, rec.body, format::FORMAT_VERSION)
                .map_err(|e| format!("record {}: {e}", rec.seq))?;
            let Change::Commit { term, history } = change else {
                turn.push((rec.seq, change));
                continue;
            };
            // A log's terms never go down, and a log keeps its history.
            if term < self.terms.last_term() {
                return Err(format!(
                    "record {} closes a turn of term {term} after term {}: a deposed primary's",
                    rec.seq,
                    self.terms.last_term()
                ));
            }
            if history != 0 && self.terms.history != 0 && history != self.terms.history {
                return Err(format!(
                    "record {} belongs to history {history:016x}, this log to {:016x}",
                    rec.seq, self.terms.history
                ));
            }
            let first = turn.first().map_or(rec.seq, |t| t.0);
            self.terms.note(term, first, history);
            for (seq, c) in turn.drain(..) {
                // A snapshot walk of the replica's own rebuilds such a tube from the WAL, as it
                // does for the tube events a primary journals itself.
                if let (
                    Change::TubeCreate(format::StoredTube { ix, .. })
                    | Change::TubeDrop(ix)
                    | Change::TubeTruncate(ix),
                    SnapState::Walking(w),
                ) = (&c, &mut self.snap)
                {
                    w.tube_changed(*ix);
                }
                let fuzzy = seq <= self.follow.fuzzy_upto;
                if let Some(why) = recovery::apply_change(queue, c, fuzzy) {
                    return Err(format!("record {seq} does not fit the replica: {why}"));
                }
            }
        }
        if !turn.is_empty() {
            return Err("the stream handed over ends inside a turn".into());
        }
        let Some(from) = new_from else {
            return Ok(0);
        };
        let (first, last) = (self.last_seq + 1, expect - 1);
        self.append_raw(&bytes[from..], first, last);
        Ok(last + 1 - first)
    }

    /// Logs records numbered `first..=last` as they are (a batch of its own).
    fn append_raw(&mut self, bytes: &[u8], first: u64, last: u64) {
        self.last_seq = last;
        self.stats.records += last + 1 - first;
        if self.cfg.mode == WalMode::None {
            self.durable_seq = last;
            self.written_seq = last;
            return;
        }
        self.submitted += 1;
        self.stats.batches += 1;
        let start = self.pending.len();
        self.pending.buf.extend_from_slice(bytes);
        self.batches.push_back(Batch {
            id: self.submitted,
            first_seq: first,
            last_seq: last,
            start,
            end: self.pending.len(),
        });
        if self.failed.is_none() {
            self.write_pending();
        }
    }

    /// A snapshot of the primary's queue at position `start_seq` begins to arrive.
    pub fn join_begin(&mut self, start_seq: u64) -> Result<(), WalError> {
        let name = join_name(start_seq);
        let file = self
            .storage
            .create(&name)
            .map_err(|e| WalError::io(format!("creating {name}"), e))?;
        self.follow.incoming = Some(Incoming {
            file,
            name,
            start_seq,
        });
        Ok(())
    }

    /// The next bytes of the snapshot being received (the file as the primary has it).
    pub fn join_write(&mut self, bytes: &[u8]) -> Result<(), WalError> {
        let Some(inc) = &self.follow.incoming else {
            return Err(WalError::io(
                "receiving a snapshot",
                std::io::Error::other("no snapshot was announced"),
            ));
        };
        inc.file
            .write_all(bytes)
            .map_err(|e| WalError::io(format!("writing {}", inc.name), e))
    }

    /// The snapshot is complete (or, when none was announced, the primary's whole log is
    /// retained and the replica starts empty at position 0): this replica's files are replaced
    /// by it and the queue it holds is returned; the stream continues after its start.
    /// Blocks for the load (the replica serves no changes, and reads wait for it).
    pub fn join_finish(&mut self) -> Result<Queue, WalError> {
        let inc = self.follow.incoming.take();
        self.abandon_local_state()?;
        let storage = Arc::clone(&self.storage);
        let io = |what: String| move |e| WalError::io(what, e);
        let names = storage.list().map_err(io("listing".into()))?;
        let keep = inc.as_ref().map(|i| i.name.clone());
        for n in names.iter().filter(|n| Some(*n) != keep.as_ref()) {
            if n.ends_with(WAL_SUFFIX) || n.ends_with(SNAP_SUFFIX) || n.ends_with(".inprogress") {
                storage.remove(n).map_err(io(format!("removing {n}")))?;
            }
        }
        let mut loaded = None;
        let (mut queue, start, fuzzy, bytes) = match inc {
            Some(inc) => {
                inc.file
                    .sync()
                    .map_err(io(format!("syncing {}", inc.name)))?;
                let name = format::snapshot_name(inc.start_seq);
                storage
                    .rename(&inc.name, &name)
                    .map_err(io(format!("renaming {} to {name}", inc.name)))?;
                storage
                    .sync_dir()
                    .map_err(io("syncing the directory".into()))?;
                let (mut queue, l) = snapshot::load(&*storage, &name).map_err(|e| {
                    WalError::io(
                        format!("loading the snapshot {name} received"),
                        std::io::Error::other(e.to_string()),
                    )
                })?;
                queue.set_last_id(l.last_id);
                loaded = Some((l.term, l.history));
                (queue, l.start_seq, l.end_seq, l.bytes)
            }
            None => {
                storage
                    .sync_dir()
                    .map_err(io("syncing the directory".into()))?;
                (Queue::new(), 0, 0, 0)
            }
        };
        queue.set_journal(self.cfg.mode != WalMode::None);
        self.last_seq = start;
        self.durable_seq = start;
        self.written_seq = start;
        self.follow.fuzzy_upto = fuzzy;
        self.terms = match &loaded {
            Some((term, history)) => Terms::starting(start, *term, *history),
            None => Terms::default(),
        };
        self.bytes_since_snapshot = 0;
        self.last_snapshot_bytes = bytes;
        self.last_snapshot_at = self.clock.now();
        tracing::info!(
            start_seq = start,
            tasks = queue.len(),
            "joined from the primary's snapshot"
        );
        Ok(queue)
    }

    /// Forgets every turn not yet written and any snapshot of this replica's own in progress
    /// (waiting for one being committed: its commit renames and removes files).
    fn abandon_local_state(&mut self) -> Result<(), WalError> {
        if let SnapState::Sealed {
            committing: true, ..
        } = self.snap
        {
            let deadline = std::time::Instant::now() + COMMIT_WAIT;
            while matches!(self.snap, SnapState::Sealed { .. }) {
                if std::time::Instant::now() >= deadline {
                    return Err(WalError::io(
                        "waiting for a snapshot's commit",
                        std::io::Error::from(std::io::ErrorKind::TimedOut),
                    ));
                }
                if let Ok(msg) = self.writer.rx.recv_timeout(BLOCKING_STEP) {
                    self.on_writer(msg);
                }
            }
        }
        self.snap = SnapState::Idle;
        self.snapshot_requested = false;
        self.pending = pending::Pending::default();
        self.batches.clear();
        self.unwritten = 0;
        self.open = None;
        self.open_needs_durability = false;
        self.held.clear();
        self.durable = self.submitted;
        self.segment = None;
        self.room_budget = 0;
        self.rotated_unsynced.clear();
        self.failed = None;
        if let Some(s) = &self.sync {
            s.abandon(self.durable);
        }
        Ok(())
    }
}
