//! Snapshots: the whole queue in one `.snap` file, so recovery does not replay the WAL from the
//! beginning of time and old WAL segments can go.
//!
//! The loop walks the ids `1..=last_id` a bounded number per turn (`SNAPSHOT_IDS_PER_TURN`) and
//! encodes the live tasks into blocks; a writer thread writes the blocks to
//! `<start>.snap.inprogress`, syncs it, and — once the WAL is durable up to the last record
//! the walk could have seen — renames it to `<start>.snap`, syncs the directory and removes what
//! the new snapshot makes unnecessary. The image is "fuzzy": each task is captured at the turn
//! the walk reached it. Recovery replays the WAL from `start` on top of it; WAL records are
//! absolute (a whole task, a new status, a removal), so replaying the changes a task saw after
//! the walk captured it converges to its final state (see ARCHITECTURE.md, Durability).
//!
//! File: header (`SNAP_MAGIC`, start sequence), `SnapTasks` records numbered from 1, each a u32
//! count and that many encoded tasks, then one `SnapEnd` record: u64 end sequence (the last WAL
//! record the walk could have seen), u64 last id, u64 task count.

use std::io::Read;
use std::sync::mpsc::{self, Receiver, SyncSender, TrySendError};
use std::sync::Arc;
use std::thread::JoinHandle;

use tarq_engine::{Queue, RestoredTask, TaskId};

use super::format::{self, Body, Kind, FILE_HEADER_LEN, INPROGRESS_SUFFIX, RECORD_HEADER_LEN};
use super::storage::{Storage, StorageFile};
use super::{files_to_remove, Notify};

/// Ids the walk visits per loop turn: about 50 µs of lookups and copying at ~50 ns each, far
/// under the few-millisecond pause budget, yet a 1M-task queue is walked in ~250 turns.
pub const SNAPSHOT_IDS_PER_TURN: u64 = 1024;
/// A block is handed to the writer thread once it holds this much: large enough that the
/// per-block record header and channel hop cost nothing, small enough to bound the copy.
pub const SNAPSHOT_BLOCK_BYTES: usize = 1 << 20;
/// Blocks in flight to the writer thread; the walk pauses when the disk is this far behind,
/// so a slow disk bounds the memory a snapshot takes to this many blocks.
pub const SNAPSHOT_QUEUE_BLOCKS: usize = 16;

pub(super) enum ToWriter {
    Begin {
        start_seq: u64,
    },
    Block(Vec<u8>),
    /// The end record; the thread syncs and reports `Synced`.
    End(Vec<u8>),
    /// The WAL covers the snapshot: rename, sync the directory, clean up.
    Commit {
        keep: usize,
    },
}

#[derive(Debug)]
pub(super) enum FromWriter {
    Synced,
    Committed { name: String, removed: Vec<String> },
    Failed(std::io::Error),
}

pub(super) struct Writer {
    pub tx: SyncSender<ToWriter>,
    pub rx: Receiver<FromWriter>,
    handle: Option<JoinHandle<()>>,
}

impl Writer {
    pub fn start(storage: Arc<dyn Storage>, notify: Notify) -> std::io::Result<Self> {
        let (tx, from_loop) = mpsc::sync_channel(SNAPSHOT_QUEUE_BLOCKS);
        let (to_loop, rx) = mpsc::channel();
        let handle = std::thread::Builder::new()
            .name("tarq-snapshot".into())
            .spawn(move || writer(&*storage, from_loop, to_loop, notify))?;
        Ok(Self {
            tx,
            rx,
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
    notify: Notify,
) {
    let mut file: Option<(Arc<dyn StorageFile>, u64)> = None;
    // After a failure the rest of that snapshot's messages are dropped until the next Begin.
    let mut failed = false;
    for msg in rx {
        let result = match msg {
            ToWriter::Begin { start_seq } => {
                failed = false;
                let tmp = inprogress_name(start_seq);
                storage.create(&tmp).and_then(|f| {
                    f.write_all(&format::file_header(format::SNAP_MAGIC, start_seq))?;
                    file = Some((f, start_seq));
                    Ok(None)
                })
            }
            _ if failed => continue,
            ToWriter::Block(bytes) => match &file {
                Some((f, _)) => f.write_all(&bytes).map(|()| None),
                None => continue,
            },
            ToWriter::End(bytes) => match &file {
                Some((f, _)) => f
                    .write_all(&bytes)
                    .and_then(|()| f.sync())
                    .map(|()| Some(FromWriter::Synced)),
                None => continue,
            },
            ToWriter::Commit { keep } => match file.take() {
                Some((_, start_seq)) => commit(storage, start_seq, keep),
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
    Ok(Some(FromWriter::Committed { name, removed }))
}

pub fn inprogress_name(start_seq: u64) -> String {
    format!("{}{INPROGRESS_SUFFIX}", format::snapshot_name(start_seq))
}

/// A snapshot being walked by the loop.
pub(super) struct Walk {
    /// The next id to look at.
    cursor: TaskId,
    block: Vec<u8>,
    block_start: usize,
    block_count: u32,
    blocks: u64,
    pub tasks: u64,
    /// A message the writer could not take yet (its queue was full).
    stalled: Option<ToWriter>,
    /// Set once the end record is built: the WAL position it names.
    sealed: Option<u64>,
}

pub(super) enum Step {
    /// More turns needed.
    Walking,
    /// The walk is over; the end record is queued. `end_seq` must be durable before commit.
    Sealed { end_seq: u64 },
    /// The writer thread is gone.
    Broken,
}

impl Walk {
    pub fn new() -> Self {
        let mut w = Walk {
            cursor: 1,
            block: Vec::with_capacity(SNAPSHOT_BLOCK_BYTES + 4096),
            block_start: 0,
            block_count: 0,
            blocks: 0,
            tasks: 0,
            stalled: None,
            sealed: None,
        };
        w.open_block();
        w
    }

    fn open_block(&mut self) {
        self.blocks += 1;
        self.block_start = format::begin_record(&mut self.block, self.blocks, Kind::SnapTasks);
        self.block.extend_from_slice(&[0; 4]);
        self.block_count = 0;
    }

    fn close_block(&mut self) -> Vec<u8> {
        let at = self.block_start + RECORD_HEADER_LEN;
        self.block[at..at + 4].copy_from_slice(&self.block_count.to_le_bytes());
        format::end_record(&mut self.block, self.block_start);
        std::mem::replace(
            &mut self.block,
            Vec::with_capacity(SNAPSHOT_BLOCK_BYTES + 4096),
        )
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

    /// One turn's share of the walk. `last_seq` is the last WAL sequence number assigned.
    pub fn step(&mut self, queue: &Queue, tx: &SyncSender<ToWriter>, last_seq: u64) -> Step {
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
        let stop = self.cursor.saturating_add(SNAPSHOT_IDS_PER_TURN);
        while self.cursor < stop && self.cursor <= queue.last_id() {
            if let Some(t) = queue.get(self.cursor) {
                format::encode_task(&mut self.block, &t);
                self.block_count += 1;
                self.tasks += 1;
            }
            self.cursor += 1;
            if self.block.len() >= SNAPSHOT_BLOCK_BYTES {
                let b = self.close_block();
                self.open_block();
                match self.send(tx, ToWriter::Block(b)) {
                    Ok(true) => {}
                    Ok(false) => return Step::Walking,
                    Err(()) => return Step::Broken,
                }
            }
        }
        if self.cursor <= queue.last_id() {
            return Step::Walking;
        }
        // Every id up to the last one was visited: seal.
        let mut bytes = if self.block_count > 0 {
            self.close_block()
        } else {
            Vec::new()
        };
        let start = format::begin_record(&mut bytes, self.blocks + 1, Kind::SnapEnd);
        bytes.extend_from_slice(&last_seq.to_le_bytes());
        bytes.extend_from_slice(&queue.last_id().to_le_bytes());
        bytes.extend_from_slice(&self.tasks.to_le_bytes());
        format::end_record(&mut bytes, start);
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
}

/// Decoded blocks in flight from the reading thread to the restoring one: enough to keep both
/// busy, few enough that a fast reader holds at most a few MiB of decoded tasks.
const LOAD_QUEUE_BLOCKS: usize = 4;

enum Loading {
    /// The tasks of one block and the block's offset (for error messages).
    Tasks(Vec<RestoredTask>, u64),
    End(Loaded),
}

/// Loads `name` into `queue` (which must be empty). Any flaw makes the whole snapshot invalid:
/// the error says what and where. A second thread reads, checks and decodes the blocks while
/// this one restores the tasks into the queue: on two cores recovery takes about as long as the
/// engine needs to insert the tasks.
pub fn load(storage: &dyn Storage, name: &str, queue: &mut Queue) -> Result<Loaded, String> {
    let reader = storage.open_read(name).map_err(|e| e.to_string())?;
    let (tx, rx) = mpsc::sync_channel(LOAD_QUEUE_BLOCKS);
    std::thread::scope(|scope| {
        let decoder = std::thread::Builder::new()
            .name("tarq-snap-load".into())
            .spawn_scoped(scope, move || {
                let sent = decode(reader, &tx);
                if let Err(e) = sent {
                    // The receiver learns of the failure through the channel.
                    let _ = tx.send(Err(e));
                }
            })
            .map_err(|e| format!("starting the snapshot reader: {e}"))?;
        let mut tasks = 0u64;
        let result = 'recv: loop {
            match rx.recv() {
                Ok(Ok(Loading::Tasks(batch, offset))) => {
                    for t in batch {
                        let id = t.id;
                        if let Err(e) = queue.restore(t) {
                            break 'recv Err(format!("block at offset {offset}: task {id}: {e}"));
                        }
                        tasks += 1;
                    }
                }
                Ok(Ok(Loading::End(l))) => break Ok(l),
                Ok(Err(e)) => break Err(e),
                Err(_) => break Err("the snapshot reader stopped".to_owned()),
            }
        };
        drop(rx);
        let _ = decoder.join();
        let loaded = result?;
        if loaded.tasks != tasks {
            return Err(format!(
                "restored {tasks} tasks, the file holds {}",
                loaded.tasks
            ));
        }
        Ok(loaded)
    })
}

type Sender = mpsc::SyncSender<Result<Loading, String>>;

/// Reads and checks every record of a snapshot, sending decoded blocks; `Err` says what is
/// wrong and where.
fn decode(reader: Box<dyn Read + Send>, tx: &Sender) -> Result<(), String> {
    let mut r = std::io::BufReader::with_capacity(1 << 20, reader);
    let mut header = [0u8; FILE_HEADER_LEN];
    r.read_exact(&mut header)
        .map_err(|e| format!("reading the header: {e}"))?;
    let start_seq = format::parse_file_header(&header, format::SNAP_MAGIC)?;
    let mut offset = FILE_HEADER_LEN as u64;
    let mut buf = Vec::new();
    let mut expect_block = 1u64;
    let mut tasks = 0u64;
    loop {
        buf.resize(RECORD_HEADER_LEN, 0);
        r.read_exact(&mut buf)
            .map_err(|e| format!("at offset {offset}: no end record ({e})"))?;
        let body_len = u32::from_le_bytes(buf[4..8].try_into().expect("4 bytes")) as usize;
        if body_len > format::MAX_RECORD_BODY {
            return Err(format!(
                "at offset {offset}: record length {body_len} over the limit"
            ));
        }
        buf.resize(RECORD_HEADER_LEN + body_len, 0);
        r.read_exact(&mut buf[RECORD_HEADER_LEN..])
            .map_err(|e| format!("at offset {offset}: record cut short ({e})"))?;
        let rec =
            format::parse_record(&buf, 0).map_err(|e| format!("at offset {offset}: {e:?}"))?;
        if rec.seq != expect_block {
            return Err(format!(
                "at offset {offset}: block {} where {expect_block} was due",
                rec.seq
            ));
        }
        expect_block += 1;
        let mut body = Body(rec.body);
        let at = |e: String| format!("at offset {offset}: {e}");
        match rec.kind {
            Kind::SnapTasks => {
                let count = body.u32().map_err(at)?;
                let mut batch = Vec::with_capacity(count as usize);
                for _ in 0..count {
                    batch.push(body.task().map_err(at)?);
                }
                body.finish().map_err(at)?;
                tasks += u64::from(count);
                if tx.send(Ok(Loading::Tasks(batch, offset))).is_err() {
                    return Ok(()); // the restoring side gave up
                }
            }
            Kind::SnapEnd => {
                let end_seq = body.u64().map_err(at)?;
                let last_id = body.u64().map_err(at)?;
                let count = body.u64().map_err(at)?;
                body.finish().map_err(at)?;
                if count != tasks {
                    return Err(format!(
                        "end record counts {count} tasks, the blocks hold {tasks}"
                    ));
                }
                let loaded = Loaded {
                    start_seq,
                    end_seq,
                    last_id,
                    tasks,
                };
                let _ = tx.send(Ok(Loading::End(loaded)));
                return Ok(());
            }
            other => return Err(at(format!("{other:?} record in a snapshot"))),
        }
        offset += rec.end as u64;
    }
}
