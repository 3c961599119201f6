//! Snapshots: the whole queue in one `.snap` file, so recovery does not replay the WAL from the
//! beginning of time and old WAL segments can go.
//!
//! The loop walks the engine's arena positions (`Queue::task_at`) a step per turn and encodes
//! the live tasks into blocks, so a walk costs what the queue holds, never the ids ever issued.
//! A step lasts `SNAPSHOT_DUTY_PERCENT` of the turn's other work (`step_budget`, within
//! `SNAPSHOT_STEP_MIN..=SNAPSHOT_STEP_MAX`, at most `SNAPSHOT_SLOTS_PER_TURN` positions): a
//! snapshot takes a bounded share of a busy loop, and an idle loop walks as fast as it spins.
//! A writer thread writes the blocks to
//! `<start>.snap.inprogress`, syncs it, and — once the WAL is durable up to the last record
//! the walk could have seen — renames it to `<start>.snap`, syncs the directory and removes what
//! the new snapshot makes unnecessary. The image is "fuzzy": each task is captured at the turn
//! the walk reached it. Recovery replays the WAL from `start` on top of it; WAL records are
//! absolute (a whole task, a new status, a removal), so replaying the changes a task saw after
//! the walk captured it converges to its final state (see docs/design/durability.md).
//!
//! Tubes: the tube table is captured whole at the start (a turn boundary), so the WAL after
//! `start` applies to it exactly. A tube created, dropped or truncated during the walk is
//! replayed from the WAL whole, so the walk stops capturing its tasks and dedup keys
//! (`Walk::tube_changed`); dedup keys are walked by their sequence numbers up to where they
//! stood at the start (later ones are in the WAL).
//!
//! File: header (`SNAP_MAGIC`, start sequence), records numbered from 1: one `SnapTubes` (a u32
//! count and that many tubes), from version 4 one `SnapFloors` (a u32 count and that many
//! (u16 index, u64 floor) pairs: where the numbers of each free index a dropped tube used
//! stand, `Queue::floors`), from version 5 one `SnapUsers` (the users and their grants), from version 6 one `SnapCounts` (a u32 count and that many
//! `format::CountsEntry`: each tube's operation counters and the dropped tubes'), `SnapTasks` blocks (a u32 count and that many tasks), `SnapDedup`
//! blocks (a u32 count and that many keys), then one `SnapEnd`: u64 end sequence (the last WAL
//! record the walk could have seen), u64 last id (`default`'s from version 4, where each tube's
//! numbering is in its entry), u64 task count, u64 dedup key count. Version 1
//! files hold only `SnapTasks` blocks and an end without the dedup count.

use std::io::Read;
use std::sync::mpsc::{self, Receiver, SyncSender, TrySendError};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use tarq_engine::{
    BulkIds, Bytes, Queue, Restoring, Room, TaskId, TaskRef, TubeIx, TubeNumbers, DEFAULT_TUBE,
};

use super::format::{
    self, Body, HeaderError, Kind, StoredDedup, StoredTask, StoredTube, FILE_HEADER_LEN,
    INPROGRESS_SUFFIX, RECORD_HEADER_LEN,
};
use super::list_order::ListOrder;
use super::storage::{Storage, StorageFile};
use super::{files_to_remove, Notify, SHARED_RECORD_BYTES};

/// The share of the loop's time a walk takes while the loop serves requests: each step may
/// last this fraction of the step and the work before it (`step_budget`). A share, not a fixed
/// number of tasks per turn: a fixed count (1024) costs a busy loop with short turns half its
/// throughput for the whole walk of a 10M backlog. At a fifth, a snapshot takes at most a
/// fifth of the loop while it runs, and lasts longer in turn.
pub const SNAPSHOT_DUTY_PERCENT: u32 = 20;
/// The shortest step, however short the turns: an idle loop (which spins while a walk is
/// under way) walks in steps of this, and a loop answering one request per turn gives the walk
/// at most about this much per request.
pub const SNAPSHOT_STEP_MIN: Duration = Duration::from_micros(10);
/// The longest step: the most a walk adds to one turn's latency.
pub const SNAPSHOT_STEP_MAX: Duration = Duration::from_micros(250);
/// A step when nobody waits for the loop (`Wal::snapshot_now`, a stop): long, so a blocking
/// snapshot is not slowed by pacing meant for a serving loop.
pub const SNAPSHOT_STEP_UNPACED: Duration = Duration::from_millis(5);
/// Arena positions the walk looks at per turn at most: an empty position costs a byte
/// compare, so 16k of them (a drained arena) stay within tens of µs.
pub const SNAPSHOT_SLOTS_PER_TURN: usize = 16 * 1024;
/// Positions walked between two looks at the clock (~25 ns each).
const CLOCK_EVERY: usize = 16;

/// How long the next walk step may take, after `foreground` of other work since the last one:
/// `SNAPSHOT_DUTY_PERCENT` of the two together, within `SNAPSHOT_STEP_MIN..=SNAPSHOT_STEP_MAX`.
pub fn step_budget(foreground: Duration) -> Duration {
    let duty = SNAPSHOT_DUTY_PERCENT;
    (foreground * duty / (100 - duty)).clamp(SNAPSHOT_STEP_MIN, SNAPSHOT_STEP_MAX)
}
/// Dedup keys the walk encodes per turn: like tasks, small copies.
pub const SNAPSHOT_DEDUP_PER_TURN: usize = 1024;
/// A block is handed to the writer thread once it holds this much: large enough that the
/// per-block record header and channel hop cost nothing, small enough to bound the copy.
pub const SNAPSHOT_BLOCK_BYTES: usize = 1 << 20;
/// The writer thread syncs the snapshot file each time this many bytes went in since its last
/// sync, as Redis's `rdb-save-incremental-fsync` (32 MB) and RocksDB's `bytes_per_sync` do: the
/// kernel then never holds a whole snapshot's worth of dirty pages (a gigabyte for a 10M
/// backlog) to flush at the final sync, a flush during which the WAL's own writes — the loop's
/// — queue behind it on the same disk and journal.
pub const SNAPSHOT_SYNC_EVERY_BYTES: u64 = 32 << 20;
/// Blocks in flight to the writer thread; the walk pauses when the disk is this far behind,
/// so a slow disk bounds the memory a snapshot takes to this many blocks.
pub const SNAPSHOT_QUEUE_BLOCKS: usize = 16;

pub(super) enum ToWriter {
    Begin {
        start_seq: u64,
        /// The queue's tasks as the walk begins: the header's hint (`format::snapshot_header`).
        tasks: usize,
    },
    /// A block record; `tail` is the end of its body when that is a big task's payload held
    /// by reference (the queue's buffer, not a copy: see `pending`).
    Block { bytes: Vec<u8>, tail: Option<Bytes> },
    /// The end record; the thread syncs and reports `Synced`.
    End(Vec<u8>),
    /// The WAL covers the snapshot: rename, sync the directory, clean up.
    Commit { keep: usize },
}

#[derive(Debug)]
pub(super) enum FromWriter {
    Synced,
    Committed {
        name: String,
        removed: Vec<String>,
        /// The snapshot's size.
        bytes: u64,
    },
    Failed(std::io::Error),
}

pub(super) struct Writer {
    pub tx: SyncSender<ToWriter>,
    pub rx: Receiver<FromWriter>,
    /// Blocks the thread has written, emptied, for the walk to fill again: a fresh 1 MiB
    /// block is an mmap the loop faults in page by page (256 faults) and a munmap after,
    /// 120 blocks a second while a growing queue is snapshotted.
    pub free: Receiver<Vec<u8>>,
    handle: Option<JoinHandle<()>>,
}

impl Writer {
    /// Starts the thread, off core `loop_cpu` when there is another (see `tarq_affinity`).
    pub fn start(
        storage: Arc<dyn Storage>,
        notify: Notify,
        loop_cpu: Option<usize>,
    ) -> std::io::Result<Self> {
        let (tx, from_loop) = mpsc::sync_channel(SNAPSHOT_QUEUE_BLOCKS);
        let (to_loop, rx) = mpsc::channel();
        let (emptied, free) = mpsc::channel();
        let handle = tarq_affinity::spawn_off_core("tarq-snapshot", loop_cpu, move || {
            writer(&*storage, from_loop, to_loop, emptied, notify)
        })?;
        Ok(Self {
            tx,
            rx,
            free,
            handle: Some(handle),
        })
    }
}

impl Drop for Writer {
    fn drop(&mut self) {
        // Closing the channel ends the thread: swap in a dangling sender, then join.
        let (dummy, _) = mpsc::sync_channel(1);
        drop(std::mem::replace(&mut self.tx, dummy));
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
    }
}

fn writer(
    storage: &dyn Storage,
    rx: Receiver<ToWriter>,
    tx: mpsc::Sender<FromWriter>,
    emptied: mpsc::Sender<Vec<u8>>,
    notify: Notify,
) {
    let mut file: Option<(Arc<dyn StorageFile>, u64)> = None;
    let mut bytes = 0u64;
    let mut synced = 0u64;
    // After a failure the rest of that snapshot's messages are dropped until the next Begin.
    let mut failed = false;
    for msg in rx {
        let result = match msg {
            ToWriter::Begin { start_seq, tasks } => {
                failed = false;
                let tmp = inprogress_name(start_seq);
                storage.create(&tmp).and_then(|f| {
                    f.write_all(&format::snapshot_header(start_seq, tasks))?;
                    bytes = FILE_HEADER_LEN as u64;
                    synced = 0;
                    file = Some((f, start_seq));
                    Ok(None)
                })
            }
            _ if failed => continue,
            ToWriter::Block {
                bytes: mut block,
                tail,
            } => match &file {
                Some((f, _)) => {
                    let tail = tail.as_deref().unwrap_or_default();
                    bytes += (block.len() + tail.len()) as u64;
                    let mut written = f.write_all_vectored(&[&block, tail]).map(|()| None);
                    if written.is_ok() && bytes - synced >= SNAPSHOT_SYNC_EVERY_BYTES {
                        written = f.sync().map(|()| None);
                        synced = bytes;
                    }
                    block.clear();
                    // The walk may be over (its blocks are then dropped with the rest).
                    let _ = emptied.send(block);
                    written
                }
                None => continue,
            },
            ToWriter::End(end) => match &file {
                Some((f, _)) => f
                    .write_all(&end)
                    .and_then(|()| f.sync())
                    .map(|()| Some(FromWriter::Synced)),
                None => continue,
            },
            ToWriter::Commit { keep } => match file.take() {
                Some((_, start_seq)) => commit(storage, start_seq, keep, bytes),
                None => continue,
            },
        };
        let report = match result {
            Ok(None) => continue,
            Ok(Some(r)) => r,
            Err(e) => {
                failed = true;
                if let Some((_, start_seq)) = file.take() {
                    let _ = storage.remove(&inprogress_name(start_seq));
                }
                FromWriter::Failed(e)
            }
        };
        if tx.send(report).is_err() {
            return;
        }
        notify.wake();
    }
}

fn commit(
    storage: &dyn Storage,
    start_seq: u64,
    keep: usize,
    bytes: u64,
) -> std::io::Result<Option<FromWriter>> {
    let name = format::snapshot_name(start_seq);
    storage.rename(&inprogress_name(start_seq), &name)?;
    storage.sync_dir()?;
    let mut removed = Vec::new();
    for old in files_to_remove(&storage.list()?, keep) {
        match storage.remove(&old) {
            Ok(()) => removed.push(old),
            Err(e) => tracing::warn!(file = %old, error = %e, "could not remove an old file"),
        }
    }
    if !removed.is_empty() {
        storage.sync_dir()?;
    }
    Ok(Some(FromWriter::Committed {
        name,
        removed,
        bytes,
    }))
}

pub fn inprogress_name(start_seq: u64) -> String {
    format!("{}{INPROGRESS_SUFFIX}", format::snapshot_name(start_seq))
}

/// A snapshot being walked by the loop.
pub(super) struct Walk {
    /// The next arena position to look at.
    cursor: usize,
    /// By tube index: the tube was in the table at the start and has not been created,
    /// dropped or truncated since, so its tasks and keys are captured.
    capture: Vec<bool>,
    /// Dedup keys to capture: per tube, the sequence numbers live at the start.
    dedup: Vec<(TubeIx, std::ops::Range<u64>)>,
    block: Vec<u8>,
    /// Emptied blocks back from the writer thread, filled before a new one is allocated.
    spare: Vec<Vec<u8>>,
    block_start: usize,
    block_count: u32,
    blocks: u64,
    pub tasks: u64,
    pub dedup_keys: u64,
    /// The arena is walked; dedup keys are next.
    tasks_done: bool,
    /// A message the writer could not take yet (its queue was full).
    stalled: Option<ToWriter>,
    /// Set once the end record is built: the WAL position it names.
    sealed: Option<u64>,
    /// The term of the record at the snapshot's start and the log's history id.
    term: u64,
    history: u64,
}

pub(super) enum Step {
    /// More turns needed.
    Walking,
    /// The walk is over; the end record is queued. `end_seq` must be durable before commit.
    Sealed { end_seq: u64 },
    /// The writer thread is gone.
    Broken,
    /// A task the format cannot hold (the server lets none in: see `check_payload`).
    Failed(String),
}

impl Walk {
    /// Starts a walk at a turn boundary: the tube table goes out as the first block.
    pub fn new(queue: &Queue, term: u64, history: u64) -> Self {
        let mut w = Walk {
            term,
            history,
            cursor: 0,
            capture: Vec::new(),
            dedup: Vec::new(),
            block: Vec::with_capacity(SNAPSHOT_BLOCK_BYTES + 4096),
            spare: Vec::new(),
            block_start: 0,
            block_count: 0,
            blocks: 0,
            tasks: 0,
            dedup_keys: 0,
            tasks_done: false,
            stalled: None,
            sealed: None,
        };
        w.open_block(Kind::SnapTubes);
        for t in queue.tubes() {
            let ix = t.ix as usize;
            if w.capture.len() <= ix {
                w.capture.resize(ix + 1, false);
            }
            w.capture[ix] = true;
            format::encode_tube(&mut w.block, &t);
            w.block_count += 1;
            let seqs = queue.dedup_seqs(t.ix);
            if !seqs.is_empty() {
                w.dedup.push((t.ix, seqs));
            }
        }
        let mut table = w.close_block(&[]);
        // The floors as of the same turn, so a tube created after a restart from this
        // snapshot (before any WAL) does not give a dropped tube's ids again. One buffer
        // with the table: the writer writes its bytes as they are.
        w.open_block(Kind::SnapFloors);
        for (ix, floor) in queue.floors() {
            w.block.extend_from_slice(&ix.to_le_bytes());
            w.block.extend_from_slice(&floor.to_le_bytes());
            w.block_count += 1;
        }
        table.extend_from_slice(&w.close_block(&[]));
        // The users as of the same turn (a `Users` record after the start replaces them).
        w.open_block(Kind::SnapUsers);
        format::encode_user_entries(&mut w.block, queue.users());
        w.block_count = queue.users().len() as u32;
        table.extend_from_slice(&w.close_block(&[]));
        // The operation counters as of the same turn (version 6): a `Counts` record after
        // the start replaces a tube's.
        w.open_block(Kind::SnapCounts);
        for t in queue.tubes() {
            let ops = queue.tube_stats(t.ix).unwrap_or_default();
            format::encode_counts_entry(&mut w.block, Some(t.ix), &ops);
            w.block_count += 1;
        }
        format::encode_counts_entry(&mut w.block, None, &queue.retired());
        w.block_count += 1;
        table.extend_from_slice(&w.close_block(&[]));
        w.stalled = Some(ToWriter::Block {
            bytes: table,
            tail: None,
        });
        w.open_block(Kind::SnapTasks);
        w
    }

    /// A tube was created, dropped or truncated while the walk runs: the WAL after the start
    /// rebuilds it whole, so its tasks and keys are not captured from here on.
    pub fn tube_changed(&mut self, tube: TubeIx) {
        if let Some(c) = self.capture.get_mut(tube as usize) {
            *c = false;
        }
        for (t, seqs) in &mut self.dedup {
            if *t == tube {
                seqs.start = seqs.end;
            }
        }
    }

    fn captures(&self, tube: TubeIx) -> bool {
        self.capture.get(tube as usize).copied().unwrap_or(false)
    }

    fn open_block(&mut self, kind: Kind) {
        self.blocks += 1;
        self.block_start = format::begin_record(&mut self.block, self.blocks, kind);
        self.block.extend_from_slice(&[0; 4]);
        self.block_count = 0;
    }

    /// Seals the block; `tail` ends its body (a big task's payload the writer sends after it).
    fn close_block(&mut self, tail: &[u8]) -> Vec<u8> {
        let at = self.block_start + RECORD_HEADER_LEN;
        self.block[at..at + 4].copy_from_slice(&self.block_count.to_le_bytes());
        // A block holds one task past SNAPSHOT_BLOCK_BYTES at most, and a task fits a record
        // alone (`MAX_PAYLOAD_BYTES`): within the limit.
        let sealed = format::end_record_with_tail(&mut self.block, self.block_start, tail);
        debug_assert!(sealed.is_ok(), "snapshot block over the record limit");
        let next = self
            .spare
            .pop()
            .unwrap_or_else(|| Vec::with_capacity(SNAPSHOT_BLOCK_BYTES + 4096));
        std::mem::replace(&mut self.block, next)
    }

    /// The writer's queue was full at the last step.
    pub fn is_stalled(&self) -> bool {
        self.stalled.is_some()
    }

    /// Hands `msg` to the writer without blocking the loop: `Ok(false)` keeps it for the next
    /// turn when the writer's queue is full.
    fn send(&mut self, tx: &SyncSender<ToWriter>, msg: ToWriter) -> Result<bool, ()> {
        match tx.try_send(msg) {
            Ok(()) => Ok(true),
            Err(TrySendError::Full(m)) => {
                self.stalled = Some(m);
                Ok(false)
            }
            Err(TrySendError::Disconnected(_)) => Err(()),
        }
    }

    /// Closes the block and hands it over, opening the next one of `next` kind.
    fn ship(&mut self, tx: &SyncSender<ToWriter>, next: Kind) -> Result<bool, ()> {
        let b = self.close_block(&[]);
        self.open_block(next);
        self.send(
            tx,
            ToWriter::Block {
                bytes: b,
                tail: None,
            },
        )
    }

    /// One turn's share of the walk. `last_seq` is the last WAL sequence number assigned;
    /// `free` brings back the blocks the writer thread has written.
    pub fn step(
        &mut self,
        queue: &Queue,
        tx: &SyncSender<ToWriter>,
        free: &Receiver<Vec<u8>>,
        last_seq: u64,
        until: Instant,
    ) -> Step {
        self.spare.extend(free.try_iter());
        if let Some(m) = self.stalled.take() {
            match self.send(tx, m) {
                Ok(true) => {}
                Ok(false) => return Step::Walking,
                Err(()) => return Step::Broken,
            }
        }
        if let Some(end_seq) = self.sealed {
            return Step::Sealed { end_seq };
        }
        // Tasks put after the start may take positions beyond the arena's end at the start;
        // their puts are in the WAL, so the walk does not go back once the arena is done.
        let r = if !self.tasks_done && self.cursor < queue.arena_end() {
            self.walk_tasks(queue, tx, until)
        } else if !self.tasks_done {
            self.end_tasks(tx)
        } else if self.dedup.iter().any(|(_, s)| !s.is_empty()) {
            self.walk_dedup(queue, tx, until)
        } else {
            return self.seal(queue, tx, last_seq);
        };
        match r {
            Ok(_) => Step::Walking,
            Err(None) => Step::Broken,
            Err(Some(e)) => Step::Failed(e),
        }
    }

    /// Encodes the live tasks of the next arena positions. `Err(None)`: the writer is gone.
    fn walk_tasks(
        &mut self,
        queue: &Queue,
        tx: &SyncSender<ToWriter>,
        until: Instant,
    ) -> Result<(), Option<String>> {
        let start = self.cursor;
        let stop = self.cursor.saturating_add(SNAPSHOT_SLOTS_PER_TURN);
        while self.cursor < stop && self.cursor < queue.arena_end() {
            if (self.cursor - start) % CLOCK_EVERY == CLOCK_EVERY - 1 && Instant::now() >= until {
                break;
            }
            let Some(t) = queue.task_at(self.cursor).filter(|t| self.captures(t.tube)) else {
                self.cursor += 1;
                continue;
            };
            if t.data.len() >= SHARED_RECORD_BYTES {
                if let Some(payload) = queue.shared_payload(t.id) {
                    if !self.ship_big_task(tx, &t, payload)? {
                        return Ok(());
                    }
                    continue;
                }
            }
            if self.block_count > 0
                && self.block.len() + format::task_len(&t) > SNAPSHOT_BLOCK_BYTES
            {
                // The task starts a new block, so no block grows past the record limit.
                if !self.ship(tx, Kind::SnapTasks).map_err(|()| None)? {
                    return Ok(());
                }
            }
            format::encode_task(&mut self.block, &t)
                .map_err(|e| Some(format!("task {} cannot be written: {e}", t.id)))?;
            self.block_count += 1;
            self.tasks += 1;
            self.cursor += 1;
        }
        Ok(())
    }

    /// A big task goes out in a block of its own whose payload is the queue's buffer, held
    /// by reference rather than copied into the block (a 256 MiB task would double the memory
    /// it takes while the snapshot writes it). `Ok(false)`: the writer's queue is full, and
    /// the walk resumes at this task (the block before it is kept for the next step) or after
    /// it (its own block is).
    fn ship_big_task(
        &mut self,
        tx: &SyncSender<ToWriter>,
        t: &TaskRef<'_>,
        payload: Bytes,
    ) -> Result<bool, Option<String>> {
        if self.block_count > 0 && !self.ship(tx, Kind::SnapTasks).map_err(|()| None)? {
            return Ok(false);
        }
        format::encode_task_head(&mut self.block, t)
            .map_err(|e| Some(format!("task {} cannot be written: {e}", t.id)))?;
        self.block_count = 1;
        self.tasks += 1;
        self.cursor += 1;
        let bytes = self.close_block(&payload);
        self.open_block(Kind::SnapTasks);
        let msg = ToWriter::Block {
            bytes,
            tail: Some(payload),
        };
        self.send(tx, msg).map_err(|()| None)
    }

    /// The arena is walked: the last task block goes out and the keys' blocks begin.
    fn end_tasks(&mut self, tx: &SyncSender<ToWriter>) -> Result<(), Option<String>> {
        self.tasks_done = true;
        if self.block_count > 0 {
            self.ship(tx, Kind::SnapDedup).map_err(|()| None)?;
        } else {
            // An empty task block: its number goes to the keys' block.
            self.block.clear();
            self.blocks -= 1;
            self.open_block(Kind::SnapDedup);
        }
        Ok(())
    }

    /// Encodes the next dedup keys that were live at the start.
    fn walk_dedup(
        &mut self,
        queue: &Queue,
        tx: &SyncSender<ToWriter>,
        until: Instant,
    ) -> Result<(), Option<String>> {
        let mut encoded = 0;
        for i in 0..self.dedup.len() {
            let tube = self.dedup[i].0;
            while encoded < SNAPSHOT_DEDUP_PER_TURN {
                if encoded % CLOCK_EVERY == CLOCK_EVERY - 1 && Instant::now() >= until {
                    return Ok(());
                }
                let Some(seq) = self.dedup[i].1.next() else {
                    break;
                };
                // Expired and pruned since the start: nothing to keep.
                let Some((key, id, expires)) = queue.dedup_entry(tube, seq) else {
                    continue;
                };
                format::encode_dedup(&mut self.block, tube, key, id, expires);
                self.block_count += 1;
                self.dedup_keys += 1;
                encoded += 1;
                if self.block.len() >= SNAPSHOT_BLOCK_BYTES
                    && !self.ship(tx, Kind::SnapDedup).map_err(|()| None)?
                {
                    return Ok(());
                }
            }
        }
        Ok(())
    }

    /// Every position and key was visited: the last block and the end record go out.
    fn seal(&mut self, queue: &Queue, tx: &SyncSender<ToWriter>, last_seq: u64) -> Step {
        let mut bytes = if self.block_count > 0 {
            self.close_block(&[])
        } else {
            self.blocks -= 1;
            Vec::new()
        };
        let start = format::begin_record(&mut bytes, self.blocks + 1, Kind::SnapEnd);
        bytes.extend_from_slice(&last_seq.to_le_bytes());
        bytes.extend_from_slice(&queue.last_id().to_le_bytes());
        bytes.extend_from_slice(&self.tasks.to_le_bytes());
        bytes.extend_from_slice(&self.dedup_keys.to_le_bytes());
        format::encode_commit(&mut bytes, self.term, self.history);
        format::end_small_record(&mut bytes, start);
        self.sealed = Some(last_seq);
        match self.send(tx, ToWriter::End(bytes)) {
            Ok(true) => Step::Sealed { end_seq: last_seq },
            Ok(false) => Step::Walking,
            Err(()) => Step::Broken,
        }
    }
}

/// What a snapshot file holds once loaded.
pub struct Loaded {
    pub start_seq: u64,
    pub end_seq: u64,
    pub last_id: TaskId,
    pub tasks: u64,
    pub dedup_keys: u64,
    /// The file's size.
    pub bytes: u64,
    /// The term of the record at `start_seq` and the log's history id (0 before version 3).
    pub term: u64,
    pub history: u64,
    /// The file's format version.
    pub version: u32,
    /// Written before tubes numbered their own tasks (version 3 or older): every id in it is
    /// the global counter's.
    pub global_ids: bool,
}

/// Why a snapshot was not loaded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LoadError {
    /// Damaged or incomplete: an older snapshot may do instead.
    Damaged(String),
    /// Written in a format version this build does not read: recovery must stop.
    Version(u32),
}

impl std::fmt::Display for LoadError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            LoadError::Damaged(s) => f.write_str(s),
            LoadError::Version(v) => write!(f, "{}", HeaderError::Version(*v)),
        }
    }
}

impl From<String> for LoadError {
    fn from(s: String) -> Self {
        LoadError::Damaged(s)
    }
}

/// Decoded blocks in flight from the reading thread to the restoring one: enough to keep both
/// busy, few enough that a fast reader holds at most a few MiB of decoded tasks.
const LOAD_QUEUE_BLOCKS: usize = 4;

/// The most tasks a snapshot header's hint may size tables for (64M: ~6 GB of tasks).
const HINT_CAP: u32 = 1 << 26;

/// Tasks restored ahead of the one being restored whose id-index line is asked for: a few
/// hundred ns of lead, the time of a cache miss.
const PREFETCH_AHEAD: usize = 8;

/// Where a byte field (payload, utube key) lies in its block's body.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Span {
    start: u32,
    len: u32,
}

/// A block of tasks as read: the record's bytes and its tasks, whose payloads and keys are
/// spans of those bytes. The engine copies a payload into its own records, so lending it
/// from the block spares an allocation and a free per task (and the free would be on the
/// other thread's heap). The bytes go back to the reader for the next block.
#[derive(Default)]
struct TaskBlock {
    bytes: Vec<u8>,
    /// Where the record's body begins in `bytes` (spans count from there).
    body_start: usize,
    tasks: Vec<StoredTask<Span>>,
}

impl TaskBlock {
    fn at(&self, s: Span) -> &[u8] {
        &self.bytes[self.body_start + s.start as usize..][..s.len as usize]
    }
}

enum Loading {
    /// The header's hint: about this many tasks follow (0: not known).
    Expect(u32),
    Tubes(Vec<StoredTube>),
    /// Free tube indexes and where their numbers stand.
    Floors(Vec<(TubeIx, u64)>),
    /// The table of users (version 5).
    Users(Vec<tarq_engine::User>),
    /// Operation counters.
    Counts(Vec<format::CountsEntry>),
    /// The tasks of one block and the block's offset (for error messages).
    Tasks(TaskBlock, u64),
    Dedup(Vec<StoredDedup>, u64),
    /// The end, with the order to list the held tasks in (ordinals, see `list_order`).
    End(Loaded, Vec<u32>),
}

/// Loads `name` into a new queue. Any flaw makes the whole snapshot invalid: the error says
/// what and where, and the half-restored queue is dropped. A second thread reads, checks and
/// decodes the blocks while this one restores the tasks into the queue: on two cores recovery
/// takes about as long as the engine needs to insert the tasks.
pub fn load(storage: &dyn Storage, name: &str) -> Result<(Queue, Loaded), LoadError> {
    let reader = storage.open_read(name).map_err(|e| e.to_string())?;
    let (tx, rx) = mpsc::sync_channel(LOAD_QUEUE_BLOCKS);
    // Blocks restored go back to the reader, their buffers to be filled again: the next
    // block is read and decoded into memory already mapped, not fresh pages the kernel must
    // fault in and zero (and, on this thread, unmap).
    let (recycle, recycled) = mpsc::sync_channel::<TaskBlock>(LOAD_QUEUE_BLOCKS + 2);
    // Memory for the tasks to come, made by the reader while it would wait (see `Room`): a
    // few chunks of each kind at most, taken when the queue's next inserts want them.
    let (slot_rooms_tx, slot_rooms) = mpsc::sync_channel::<Room>(ROOMS_AHEAD);
    let (record_rooms_tx, record_rooms) = mpsc::sync_channel::<Room>(ROOMS_AHEAD);
    std::thread::scope(|scope| {
        let decoder = std::thread::Builder::new()
            .name("tarq-snap-load".into())
            .spawn_scoped(scope, move || {
                let mut out = Out {
                    parts: &tx,
                    rooms: RoomMaker::new(slot_rooms_tx, record_rooms_tx),
                };
                let sent = decode(reader, &mut out, &recycled);
                if let Err(e) = sent {
                    // The receiver learns of the failure through the channel.
                    let _ = tx.send(Err(e));
                }
            })
            .map_err(|e| format!("starting the snapshot reader: {e}"))?;
        let mut counts = (0u64, 0u64);
        // Tasks come in arena order: list them once all are in, in the order the reading
        // thread sorted them into (see `list_order`).
        let mut queue = Queue::new().restoring(BulkIds::Distinct);
        let result = loop {
            let wanted = queue.room_wanted();
            for (want, rooms) in [(wanted.slots, &slot_rooms), (wanted.records, &record_rooms)] {
                if !want {
                    continue; // a room taken and not added would be made in vain
                }
                if let Ok(room) = rooms.try_recv() {
                    queue.add_room(room);
                }
            }
            match rx.recv() {
                Ok(Ok(Loading::End(l, order))) => break Ok((l, order)),
                Ok(Ok(part)) => {
                    if let Err(e) = restore_part(&mut queue, part, &mut counts, &recycle) {
                        break Err(LoadError::Damaged(e));
                    }
                }
                Ok(Err(e)) => break Err(e),
                Err(_) => break Err("the snapshot reader stopped".to_owned().into()),
            }
        };
        drop(rx);
        let _ = decoder.join();
        // On failure the queue is dropped as it is: its tasks are not listed (the ids may not
        // have been checked).
        let (loaded, order) = result?;
        if (loaded.tasks, loaded.dedup_keys) != counts {
            return Err(format!(
                "restored {} tasks and {} dedup keys, the file holds {} and {}",
                counts.0, counts.1, loaded.tasks, loaded.dedup_keys
            )
            .into());
        }
        let mut queue = queue.finish_in(&order).map_err(|e| e.to_string())?;
        if loaded.global_ids {
            continue_above_global_ids(&mut queue, loaded.last_id)?;
        }
        Ok((queue, loaded))
    })
}

/// Restores one decoded block; `counts` are the tasks and dedup keys restored so far.
fn restore_part(
    queue: &mut Restoring,
    part: Loading,
    counts: &mut (u64, u64),
    recycle: &SyncSender<TaskBlock>,
) -> Result<(), String> {
    match part {
        Loading::Tubes(tubes) => {
            for t in tubes {
                let restored = if t.ix == DEFAULT_TUBE {
                    queue.restore_tube_numbers(t.ix, t.numbers)
                } else {
                    queue.restore_tube(t.ix, &t.name, t.kind, t.opts, t.numbers)
                };
                restored.map_err(|e| format!("tube {} {:?}: {e}", t.ix, t.name))?;
            }
        }
        Loading::Users(users) => queue.restore_users(users),
        Loading::Floors(floors) => {
            for (ix, floor) in floors {
                queue
                    .restore_floor(ix, floor)
                    .map_err(|e| format!("floor of tube index {ix}: {e}"))?;
            }
        }
        Loading::Counts(entries) => {
            for e in entries {
                match e.tube {
                    None => queue.restore_retired(&e.counts),
                    Some(ix) => queue
                        .restore_ops(ix, &e.counts)
                        .map_err(|err| format!("counters of tube {ix}: {err}"))?,
                }
            }
        }
        Loading::Tasks(block, offset) => {
            queue.reserve(block.tasks.len());
            for (i, t) in block.tasks.iter().enumerate() {
                if let Some(ahead) = block.tasks.get(i + PREFETCH_AHEAD) {
                    queue.prefetch_id(ahead.task.id);
                }
                let (id, tube) = (t.task.id, t.tube);
                let task = t.task.clone().map_data(|s| block.at(s));
                queue
                    .restore_in(tube, task, t.utube.map(|s| block.at(s)), t.deliveries)
                    .and_then(|()| {
                        // Few tasks have counters: the rest pay this test only.
                        if t.counts.is_zero() {
                            Ok(())
                        } else {
                            queue.restore_counts(id, t.counts)
                        }
                    })
                    .map_err(|e| {
                        format!("block at offset {offset}: task {id} in tube {tube}: {e}")
                    })?;
                counts.0 += 1;
            }
            // The reader may have stopped (it then needs no buffers): nothing to do.
            let _ = recycle.try_send(block);
        }
        Loading::Dedup(keys, offset) => {
            for d in keys {
                queue
                    .restore_dedup(d.tube, &d.key, d.id, d.expires)
                    .map_err(|e| {
                        format!(
                            "block at offset {offset}: dedup key of tube {}: {e}",
                            d.tube
                        )
                    })?;
                counts.1 += 1;
            }
        }
        Loading::Expect(tasks) => queue.reserve(tasks as usize),
        Loading::End(..) => {}
    }
    Ok(())
}

/// A snapshot of the format before tubes numbered their own tasks: each of its tubes but
/// `default` (whose numbers are the seed's ids, as the global counter's were) numbers its next
/// tasks above the global counter, and the tube API reads a number below it as the id it was.
/// So no new task gets a number an old one had in the tube, nor an old id's number.
fn continue_above_global_ids(queue: &mut Queue, last_id: TaskId) -> Result<(), String> {
    let mark = TubeNumbers {
        next: last_id + 1,
        legacy_below: last_id + 1,
        first: 0,
    };
    let tubes: Vec<TubeIx> = queue.tubes().map(|t| t.ix).collect();
    for ix in tubes.into_iter().filter(|&ix| ix != DEFAULT_TUBE) {
        queue
            .restore_tube_numbers(ix, mark)
            .map_err(|e| format!("tube {ix}: {e}"))?;
    }
    queue.set_last_id(last_id);
    Ok(())
}

/// Where the reading thread sends what it decodes: the parts in order, and room made for the
/// restoring side while it waits.
struct Out<'a> {
    parts: &'a Sender,
    rooms: RoomMaker,
}

impl Out<'_> {
    /// Sends `part`. While the restoring side is behind (the channel is full), makes room for
    /// the tasks it will insert, a chunk at a time, instead of waiting; then waits. False:
    /// the restoring side gave up.
    fn send_making_room(&mut self, part: Loading) -> bool {
        let mut part = Ok(part);
        loop {
            match self.parts.try_send(part) {
                Ok(()) => return true,
                Err(TrySendError::Disconnected(_)) => return false,
                Err(TrySendError::Full(p)) => {
                    part = p;
                    if !self.rooms.make_one() {
                        return self.parts.send(part).is_ok();
                    }
                }
            }
        }
    }
}

/// Chunks of room made ready ahead of the restoring side, per kind.
const ROOMS_AHEAD: usize = 2;

/// Makes room of each kind into its channel while there is space: the restoring side takes
/// a room when its queue wants one, so what a load makes in vain is bounded by the channels
/// (and is given back when they are dropped).
struct RoomMaker {
    slots: SyncSender<Room>,
    records: SyncSender<Room>,
    /// A room made whose channel was full, sent first next time.
    held: [Option<Room>; 2],
    /// The restoring side is gone: nothing more to make.
    gone: bool,
}

impl RoomMaker {
    fn new(slots: SyncSender<Room>, records: SyncSender<Room>) -> Self {
        RoomMaker {
            slots,
            records,
            held: [None, None],
            gone: false,
        }
    }

    /// Makes or sends one room; false when both channels are full with one held for each.
    fn make_one(&mut self) -> bool {
        if self.gone {
            return false;
        }
        let kinds: [(_, fn() -> Room); 2] =
            [(&self.slots, Room::slots), (&self.records, Room::records)];
        for (kind, (tx, make)) in kinds.into_iter().enumerate() {
            match self.held[kind].take() {
                None => {
                    self.held[kind] = Some(make());
                    return true;
                }
                Some(room) => match tx.try_send(room) {
                    Ok(()) => return true,
                    Err(TrySendError::Full(room)) => self.held[kind] = Some(room),
                    Err(TrySendError::Disconnected(_)) => {
                        self.gone = true;
                        return false;
                    }
                },
            }
        }
        false
    }
}

type Sender = mpsc::SyncSender<Result<Loading, LoadError>>;

/// Reads the file header: the start sequence and the format version.
fn read_header(r: &mut impl Read) -> Result<format::FileHeader, LoadError> {
    let mut header = [0u8; FILE_HEADER_LEN];
    r.read_exact(&mut header)
        .map_err(|e| format!("reading the header: {e}"))?;
    format::parse_file_header(&header, format::SNAP_MAGIC).map_err(|e| match e {
        HeaderError::Version(v) => LoadError::Version(v),
        HeaderError::Damaged(s) => LoadError::Damaged(s),
    })
}

/// Reads the next record into `buf`; what is wrong with it, and where. Two reads straight
/// into `buf`, no buffered reader: a block is ~1 MiB, so a read more per block is nothing,
/// while a buffer in between copied every byte once more (a sixth of the reading thread's
/// time for 10M tasks). `buf` keeps its length between records (a recycled block buffer is
/// not zeroed again); the record is its first bytes.
fn read_record<'b>(
    r: &mut impl Read,
    buf: &'b mut Vec<u8>,
    offset: u64,
) -> Result<format::RawRecord<'b>, String> {
    if buf.len() < RECORD_HEADER_LEN {
        buf.resize(RECORD_HEADER_LEN, 0);
    }
    r.read_exact(&mut buf[..RECORD_HEADER_LEN])
        .map_err(|e| format!("at offset {offset}: no end record ({e})"))?;
    let body_len = u32::from_le_bytes(buf[4..8].try_into().expect("4 bytes")) as usize;
    if body_len > format::MAX_RECORD_BODY {
        return Err(format!(
            "at offset {offset}: record length {body_len} over the limit"
        ));
    }
    let len = RECORD_HEADER_LEN + body_len;
    if buf.len() < len {
        buf.resize(len, 0);
    }
    r.read_exact(&mut buf[RECORD_HEADER_LEN..len])
        .map_err(|e| format!("at offset {offset}: record cut short ({e})"))?;
    format::parse_record(&buf[..len], 0).map_err(|e| format!("at offset {offset}: {e}"))
}

/// Decodes the entries of a block body: a u32 count, then that many.
fn entries<'a, T>(
    body: &mut Body<'a>,
    one: impl Fn(&mut Body<'a>) -> Result<T, String>,
) -> Result<Vec<T>, String> {
    let mut out = Vec::new();
    entries_into(body, &mut out, one)?;
    Ok(out)
}

/// [`entries`] into `out` (emptied first), reusing its allocation.
fn entries_into<'a, T>(
    body: &mut Body<'a>,
    out: &mut Vec<T>,
    one: impl Fn(&mut Body<'a>) -> Result<T, String>,
) -> Result<(), String> {
    let count = body.u32()?;
    out.clear();
    // Each entry takes more than a byte: a damaged count cannot make this allocate much.
    out.reserve((count as usize).min(body.0.len()));
    for _ in 0..count {
        out.push(one(body)?);
    }
    body.finish()
}

/// Reads and checks every record of a snapshot, sending decoded blocks; `Err` says what is
/// wrong and where.
fn decode(
    reader: Box<dyn Read + Send>,
    out: &mut Out<'_>,
    recycled: &Receiver<TaskBlock>,
) -> Result<(), LoadError> {
    let mut r = reader;
    let header = read_header(&mut r)?;
    let version = header.version;
    // The hint sizes tables before a task is read: trusted up to `HINT_CAP` tasks, so a
    // damaged one (the header's checksum passed, but still) reserves little; a bigger queue's
    // tables grow as its blocks come, as without a hint.
    let hint = header.hint.min(HINT_CAP);
    if hint > 0 && out.parts.send(Ok(Loading::Expect(hint))).is_err() {
        return Ok(()); // the restoring side gave up
    }
    let mut offset = FILE_HEADER_LEN as u64;
    let mut buf = Vec::new();
    let mut expect_block = 1u64;
    let (mut tasks, mut keys) = (0u64, 0u64);
    // The order the held tasks are listed in, and the check that no id comes twice (the
    // restoring thread looks none up: `BulkIds::Distinct`), worked out here as blocks come.
    let mut order = ListOrder::with_capacity(hint as usize);
    let mut spare_tasks = Vec::new();
    loop {
        let rec = read_record(&mut r, &mut buf, offset)?;
        let rec_end = rec.end as u64;
        if rec.seq != expect_block {
            return Err(format!(
                "at offset {offset}: block {} where {expect_block} was due",
                rec.seq
            )
            .into());
        }
        expect_block += 1;
        let mut body = Body(rec.body);
        let at = |e: String| format!("at offset {offset}: {e}");
        let part = match rec.kind {
            Kind::SnapTubes if version >= 2 => {
                Loading::Tubes(entries(&mut body, |b| b.tube(version)).map_err(at)?)
            }
            Kind::SnapFloors if version >= 4 => {
                let floor = |b: &mut Body<'_>| Ok((b.u16()?, b.u64()?));
                Loading::Floors(entries(&mut body, floor).map_err(at)?)
            }
            Kind::SnapUsers if version >= 5 => {
                let users = body.users(version).map_err(at)?;
                body.finish().map_err(at)?;
                Loading::Users(users)
            }
            Kind::SnapCounts if version >= 6 => {
                Loading::Counts(entries(&mut body, Body::counts_entry).map_err(at)?)
            }
            Kind::SnapTasks => {
                // Spans count from the body's start; where that is in `buf` is known once
                // the record's borrow of it ends.
                let origin = body.0.as_ptr() as usize;
                let span = |b: &[u8]| Span {
                    start: (b.as_ptr() as usize - origin) as u32,
                    len: b.len() as u32,
                };
                let mut batch = std::mem::take(&mut spare_tasks);
                entries_into(&mut body, &mut batch, |b| b.task_with(version, span)).map_err(at)?;
                tasks += batch.len() as u64;
                for t in &batch {
                    order.task(t.task.id, t.task.status, t.task.pri, t.task.runat);
                }
                let body_start = origin - buf.as_ptr() as usize;
                let next = recycled.try_recv().unwrap_or_else(|_| TaskBlock::default());
                spare_tasks = next.tasks;
                let block = TaskBlock {
                    bytes: std::mem::replace(&mut buf, next.bytes),
                    body_start,
                    tasks: batch,
                };
                Loading::Tasks(block, offset)
            }
            Kind::SnapDedup if version >= 2 => {
                let batch = entries(&mut body, Body::dedup).map_err(at)?;
                keys += batch.len() as u64;
                Loading::Dedup(batch, offset)
            }
            Kind::SnapEnd => {
                let end_seq = body.u64().map_err(at)?;
                let last_id = body.u64().map_err(at)?;
                let count = body.u64().map_err(at)?;
                let key_count = if version >= 2 {
                    body.u64().map_err(at)?
                } else {
                    0
                };
                let (term, history) = if version >= 3 {
                    (body.u64().map_err(at)?, body.u64().map_err(at)?)
                } else {
                    (0, 0)
                };
                body.finish().map_err(at)?;
                if (count, key_count) != (tasks, keys) {
                    return Err(format!(
                        "end record counts {count} tasks and {key_count} dedup keys, the blocks hold {tasks} and {keys}"
                    )
                    .into());
                }
                let loaded = Loaded {
                    start_seq: header.seq,
                    end_seq,
                    last_id,
                    tasks,
                    dedup_keys: keys,
                    bytes: offset + rec.end as u64,
                    term,
                    history,
                    version,
                    global_ids: version < 4,
                };
                let order = order
                    .finish()
                    .map_err(|id| format!("task {id} appears twice"))?;
                let _ = out.parts.send(Ok(Loading::End(loaded, order)));
                return Ok(());
            }
            other => {
                return Err(at(format!("{other:?} record in a version {version} snapshot")).into())
            }
        };
        if !out.send_making_room(part) {
            return Ok(()); // the restoring side gave up
        }
        // The block's sort and merges, while the restoring side inserts the block.
        order.end_run();
        offset += rec_end;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn room_is_made_ahead_only_as_far_as_its_channels_hold() {
        let (slots_tx, slots) = mpsc::sync_channel(ROOMS_AHEAD);
        let (records_tx, records) = mpsc::sync_channel(ROOMS_AHEAD);
        let mut maker = RoomMaker::new(slots_tx, records_tx);
        let mut steps = 0;
        while maker.make_one() {
            steps += 1;
            assert!(steps < 100, "made without end");
        }
        // Each kind: its channel full, and one more made and held.
        assert_eq!(steps, 2 * (2 * ROOMS_AHEAD + 1));
        assert!(maker.held.iter().all(Option::is_some));
        // The restoring side takes a slots room: the held one goes, one more is made.
        slots.try_recv().expect("a room");
        assert!(maker.make_one() && maker.make_one() && !maker.make_one());
        assert_eq!(slots.try_iter().count(), ROOMS_AHEAD);
        assert_eq!(records.try_iter().count(), ROOMS_AHEAD);
        // Gone: nothing more to make room for.
        drop((slots, records));
        assert!(!maker.make_one());
    }

    #[test]
    fn a_step_takes_its_share_of_the_turn_within_bounds() {
        let us = Duration::from_micros;
        assert_eq!(step_budget(Duration::ZERO), SNAPSHOT_STEP_MIN, "idle loop");
        // 400 µs of requests: a fifth of 500 µs is 100 µs of walk.
        assert_eq!(step_budget(us(400)), us(100));
        assert_eq!(step_budget(Duration::from_secs(1)), SNAPSHOT_STEP_MAX);
    }
}
