//! Durability: the write-ahead log with group commit, snapshots, recovery and the data
//! directory's lock. The server loop drives it; it owns every file in the data directory.
//!
//! How the loop uses it, once per turn:
//! 1. execute the requests of the turn against the `Queue` (journal on);
//!    before a put/ack/release, `reserve(bytes)` with a bound of its records (`room`) —
//!    when the disk has no room for them, or failed, the call gets `WalError::WriteFailed`
//!    ("WAL write failed: No space left on device") without touching the queue; before a
//!    take, `reserve_take()`; takes and stats go on;
//! 2. `append_turn(&mut queue)` encodes the turn's events, `submit()` writes them as one batch
//!    (one `write`) and returns its `BatchId`; replies to put/ack/release wait for that batch;
//!    take replies need not (a take lost in a crash comes back ready, as every taken task does
//!    at start, so it is the same either way);
//! 3. `poll(&mut queue)` learns what the sync thread made durable, retries a failed disk, and
//!    walks a running snapshot a bounded step;
//! 4. send the held replies of every batch `<= durable_upto()`; sleep no longer than
//!    `timeout()`. The sync and snapshot threads wake the loop through the [`Wake`] callback
//!    given to `set_waker` (the server's `mio::Waker`; the WAL does not know the loop).
//!
//! `WalMode::Write` makes a batch durable when `write` returns (it survives the process, not
//! the machine); `WalMode::Fsync` when the sync thread's `fdatasync` returns; `WalMode::None`
//! writes no WAL (snapshots still work).

mod clock;
pub mod damage;
mod follow;
pub mod format;
mod list_order;
pub mod lock;
#[cfg(feature = "test-storage")]
pub mod mem_storage;
mod pending;
pub mod recovery;
pub mod relay;
pub mod room;
pub mod snapshot;
pub mod storage;
mod sync;
pub mod terms;

use std::collections::VecDeque;
use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use tarq_engine::{Event, JobCounts, Queue, Status, TaskId, TubeIx};

#[cfg(feature = "test-storage")]
pub use clock::ManualClock;
pub use clock::{Clock, SystemClock};
pub use damage::SetAside;
pub use format::{check_payload, TooLarge, MAX_PAYLOAD_BYTES};
use format::{Kind, FILE_HEADER_LEN, INPROGRESS_SUFFIX, SNAP_SUFFIX, WAL_SUFFIX};
pub use lock::DirLock;
#[cfg(feature = "test-storage")]
pub use mem_storage::{Crash, MemStorage};
pub use recovery::{DamagedSnapshot, RecoveryReport, TornTail};
pub use storage::{FsStorage, Storage, StorageFile};
pub use terms::Terms;

/// Numbers the batches (loop turns) submitted: 1, 2, ...; 0 means "none".
pub type BatchId = u64;

/// A segment is closed and a new one started past this size: small enough that removing
/// obsolete WAL after a snapshot frees space in useful steps, large enough that rotation
/// (one file creation and directory sync) is rare.
pub const DEFAULT_SEGMENT_BYTES: u64 = 64 << 20;
/// A snapshot starts once this much WAL was written since the last one: replaying 256 MiB
/// (a few million records) adds well under a second to recovery.
pub const DEFAULT_SNAPSHOT_EVERY_BYTES: u64 = 256 << 20;
/// A snapshot is due once the WAL since the last one reaches this many times the last
/// snapshot's size (and `snapshot_every_bytes`): as LSM compaction weighs a level against the
/// next, rewriting a backlog of S bytes is paid for by at least S bytes of new WAL, so
/// snapshot work stays at most the WAL's own at any backlog, and recovery replays at most
/// that much WAL on top of the snapshot.
pub const SNAPSHOT_WAL_RATIO: u64 = 1;
/// How long a snapshot walk's step may be: a share of a serving loop's turn, or long when
/// nobody waits for the loop (`snapshot_now`, a stop).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Pace {
    Serving,
    Unpaced,
}

/// A put's payload from this size up is not copied into its record: the record holds the
/// queue's buffer (`pending`) and the write takes the bytes from there.
const SHARED_RECORD_BYTES: usize = 64 * 1024;
/// The WAL buffer's capacity kept between turns: a busy turn's records fit many times over;
/// a buffer a big record grew shrinks back to this once its turns are durable.
const WAL_BUF_RESTING_BYTES: usize = 1 << 20;
/// Snapshots kept; the WAL from the oldest kept one on is kept too. Two, so a snapshot found
/// damaged at start still has a predecessor.
pub const DEFAULT_KEEP_SNAPSHOTS: usize = 2;
/// After a write or sync failure the WAL retries this often: soon enough that service
/// resumes within a blink of the disk having room again, rare enough to cost nothing.
pub const RETRY_INTERVAL: Duration = Duration::from_millis(200);
/// While the disk fails, takes and timers still change the queue and their records wait in
/// memory; past this many bytes takes are refused too, so a long outage cannot eat the RAM.
pub const MAX_PENDING_BYTES: usize = 64 << 20;
/// Write mode: rotated segments `close` still syncs (each holds a descriptor). Older ones were
/// written back by the kernel long ago (dirty pages expire after 30 s by default; this many
/// segments are 512 MiB of WAL).
const MAX_ROTATED_UNSYNCED: usize = 8;
/// A snapshot walk whose writer queue is full looks again after this long: the disk writes a
/// 1 MiB block in about this time, and the loop does not spin meanwhile.
const SNAPSHOT_STALL_RECHECK: Duration = Duration::from_millis(1);
/// `flush`/`snapshot_now` re-check their deadline at least this often while blocked.
const BLOCKING_STEP: Duration = Duration::from_millis(10);

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum WalMode {
    /// No WAL: only snapshots persist.
    None,
    /// A turn is durable once written (survives a process crash, not a power loss).
    #[default]
    Write,
    /// A turn is durable once synced (survives a power loss).
    Fsync,
}

impl FromStr for WalMode {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "none" => Ok(WalMode::None),
            "write" => Ok(WalMode::Write),
            "fsync" => Ok(WalMode::Fsync),
            _ => Err(format!(
                "unknown WAL mode {s:?}: expected none, write or fsync"
            )),
        }
    }
}

impl fmt::Display for WalMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            WalMode::None => "none",
            WalMode::Write => "write",
            WalMode::Fsync => "fsync",
        })
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WalConfig {
    pub mode: WalMode,
    pub segment_bytes: u64,
    /// 0: no size trigger.
    pub snapshot_every_bytes: u64,
    /// A snapshot is due this long after the last one if any WAL was written since
    /// (Tarantool's `checkpoint_interval`); `None`: no time trigger.
    pub snapshot_interval: Option<Duration>,
    pub keep_snapshots: usize,
    pub force_recovery: bool,
    /// This WAL follows a primary's (a replica): recovery keeps taken tasks taken and the
    /// position is the last complete turn; records come from `apply_replicated`.
    pub replica: bool,
    /// The loop thread's core (`--cpu`): the WAL's long-lived threads (sync, snapshot
    /// writer) run on the process's other cores when it has others. Recovery's threads use
    /// every core: the loop does not run yet.
    pub loop_cpu: Option<usize>,
}

impl Default for WalConfig {
    fn default() -> Self {
        Self {
            mode: WalMode::default(),
            segment_bytes: DEFAULT_SEGMENT_BYTES,
            snapshot_every_bytes: DEFAULT_SNAPSHOT_EVERY_BYTES,
            snapshot_interval: None,
            keep_snapshots: DEFAULT_KEEP_SNAPSHOTS,
            force_recovery: false,
            replica: false,
            loop_cpu: None,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum WalError {
    #[error("{what}: {source}")]
    Io {
        what: String,
        source: std::io::Error,
    },
    #[error(
        "WAL file {file} is damaged at offset {offset}: {reason}. Restore the data directory \
         from a backup, or start with --force-recovery to skip the damage (what it held is \
         lost); a replica copies its primary again by itself"
    )]
    Corrupt {
        file: String,
        offset: u64,
        reason: String,
    },
    /// The disk failed; changing calls are refused until a retry succeeds.
    #[error("WAL write failed: {0}")]
    WriteFailed(String),
    #[error("data directory {} is in use by another tarq process (pid {holder}); refusing to start", dir.display())]
    Locked { dir: PathBuf, holder: String },
    /// No snapshot loads and the WAL does not reach back to its first record (`wal_first`,
    /// `None`: there is no WAL): what the snapshots held is in no other file.
    #[error(
        "every snapshot in the data directory is damaged ({snapshots}) and {}: the tasks they \
         held are in no other file. Restore the data directory from a backup, or start with \
         --force-recovery to start from {} (what the snapshots held is lost)",
        wal_start(wal_first),
        wal_first.map_or("an empty queue".to_owned(), |s| format!("the WAL alone, at record {s}"))
    )]
    SnapshotsDamaged {
        snapshots: String,
        wal_first: Option<u64>,
    },
    /// A file of a format version this build does not read: refused, never misread.
    #[error(
        "{file} is written in WAL/snapshot format version {version}; this build reads versions \
         {}..={}: start the tarq that wrote it, or move the data directory aside",
        format::OLDEST_READABLE_VERSION,
        format::FORMAT_VERSION
    )]
    UnsupportedFormat { file: String, version: u32 },
    /// A task bigger than a WAL record holds: refused before the queue changes.
    #[error(transparent)]
    TooLarge(#[from] format::TooLarge),
}

impl WalError {
    pub(crate) fn io(what: impl Into<String>, source: std::io::Error) -> Self {
        WalError::Io {
            what: what.into(),
            source,
        }
    }
}

/// Where the WAL starts, for [`WalError::SnapshotsDamaged`].
fn wal_start(first: &Option<u64>) -> String {
    match first {
        Some(s) => format!("the WAL starts at record {s}, after what they held"),
        None => "there is no WAL to replay instead".to_owned(),
    }
}

/// "No space left on device", without Rust's " (os error 28)".
fn describe(e: &std::io::Error) -> String {
    let s = e.to_string();
    match s.find(" (os error") {
        Some(i) => s[..i].to_owned(),
        None => s,
    }
}

/// How the WAL's threads wake the loop: called from the sync and snapshot threads when a
/// sync or a snapshot step completes. It must not block.
pub type Wake = Arc<dyn Fn() + Send + Sync>;

/// Wakes the loop from the WAL's threads, once the server has handed over its [`Wake`].
#[derive(Clone, Default)]
pub(crate) struct Notify(Arc<OnceLock<Wake>>);

impl Notify {
    fn wake(&self) {
        if let Some(wake) = self.0.get() {
            wake();
        }
    }
}

/// Figures for `queue.stats()` and logs.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct WalStats {
    pub records: u64,
    pub batches: u64,
    pub bytes_written: u64,
    pub writes: u64,
    pub syncs: u64,
    pub write_errors: u64,
    pub snapshots: u64,
    /// Bytes of records not yet durable (waiting for a write, a sync, or a failed disk).
    pub pending_bytes: u64,
    /// The running or last snapshot: loop turns its walk took, and the longest of them (µs),
    /// the pause a snapshot adds to a turn.
    pub snapshot_walk_steps: u64,
    pub snapshot_longest_step_us: u64,
    /// WAL bytes written since the newest snapshot's position (counted from the files at start).
    pub wal_bytes_since_snapshot: u64,
    /// The disk has no room for changes now: they are refused until a retry finds it.
    pub disk_full: bool,
    /// Changes (and takes) refused since start because the disk had no room or failed.
    pub refusals: u64,
    /// Bytes allocated ahead of the current segment's written end.
    pub allocated_ahead: u64,
}

struct Batch {
    id: BatchId,
    first_seq: u64,
    last_seq: u64,
    /// Its bytes in `Wal::buf`.
    start: usize,
    end: usize,
}

struct Segment {
    file: Arc<dyn StorageFile>,
    name: String,
    bytes: u64,
    /// Bytes from the file's start that have disk space (`room`): appends below this cannot
    /// meet a full disk.
    allocated: u64,
}

struct Failure {
    message: String,
    retry_at: Instant,
}

enum SnapState {
    Idle,
    Walking(Box<snapshot::Walk>),
    /// The end record is queued; commit once synced and the WAL covers `end_seq`.
    Sealed {
        end_seq: u64,
        synced: bool,
        committing: bool,
        started: Instant,
    },
}

pub struct Wal {
    storage: Arc<dyn Storage>,
    /// Reads the time for the retry of a failed disk and a snapshot's duration.
    clock: Arc<dyn Clock>,
    cfg: WalConfig,
    notify: Notify,
    /// The last sequence number given to a record.
    last_seq: u64,
    /// Bytes of every batch not yet durable, then the open batch; `batches` index into it.
    pending: pending::Pending,
    batches: VecDeque<Batch>,
    /// `buf[unwritten..]` is not yet written to the current segment.
    unwritten: usize,
    /// The open batch (records appended since the last submit): its start in `buf`, first seq.
    open: Option<(usize, u64)>,
    /// The open batch holds a put, ack or release.
    open_needs_durability: bool,
    /// Turns with a put, ack or release whose batch is not durable yet, oldest first. A batch
    /// of takes and timer changes only may be lost in a crash without anyone noticing
    /// (recovery returns taken tasks to ready and redoes due timers): its replies need not wait.
    held: VecDeque<BatchId>,
    submitted: BatchId,
    durable: BatchId,
    /// Records up to here are durable.
    durable_seq: u64,
    /// The last record of the batch last submitted, when that batch holds a change whose
    /// reply must wait for durability (synchronous replication waits for it too).
    submitted_change: Option<u64>,
    segment: Option<Segment>,
    /// Write mode: segments rotated away since the start, never synced (for `close`).
    rotated_unsynced: Vec<Arc<dyn StorageFile>>,
    failed: Option<Failure>,
    /// The disk space allocated ahead for changes, and whether the disk has run out of it.
    room: room::Room,
    /// `reserve` admits a change at once while the pending records and its bound stay within
    /// this (`room::update_room_budget`); every change of the segment, the failed or the full
    /// state sets it lower or to 0, so it never claims room that is not allocated.
    room_budget: u64,
    sync: Option<sync::SyncThread>,
    writer: snapshot::Writer,
    snap: SnapState,
    snapshot_requested: bool,
    /// WAL bytes written since the newest snapshot's position, counted from the files at
    /// start and then by every write: the size trigger survives restarts.
    bytes_since_snapshot: u64,
    /// The newest snapshot's size: a snapshot is due only after as much WAL (times
    /// `SNAPSHOT_WAL_RATIO`), so a big backlog is not rewritten over and over.
    last_snapshot_bytes: u64,
    /// When the newest snapshot was committed (or the WAL opened): the interval trigger.
    last_snapshot_at: Instant,
    /// When the walk's last step ended (`None` before a walk's first): the work since then
    /// sets the next step's share (`snapshot::step_budget`).
    last_walk_end: Option<Instant>,
    events: Vec<Event>,
    /// The tubes whose counters a turn changed (`record_counts`), a buffer kept warm.
    counted: Vec<TubeIx>,
    vanished: Vec<TaskId>,
    /// Tubes created and dropped within the open turn: nothing of them is logged.
    vanished_tubes: Vec<TubeIx>,
    /// A change too big for the format reached the log: changes are refused until a restart.
    unloggable: bool,
    stats: WalStats,
    /// Records written (to the current segment) up to here: what a relay may stream.
    written_seq: u64,
    /// A copy of every byte written, for the server's relays to stream; `None` while no
    /// replica follows (nothing is copied).
    tap: Option<Vec<u8>>,
    /// A replica's side: the fuzzy window of the snapshot it started from, and a snapshot
    /// being received from its primary.
    follow: follow::Follow,
    /// Which term wrote which records, and the log's history id.
    terms: Terms,
    /// The term this node's own turns are written in (its leadership's; 0 without etcd).
    term: u64,
    /// Whether this node may log turns of its own: false from `stop_leading` until the next
    /// `set_term` (a cluster node that does not lead; see `refuse_own_turn`).
    leading: bool,
    /// A replica whose damaged log was set aside at start: it holds nothing of its primary's
    /// until it has copied it again, and must not lead meanwhile.
    started_over: Option<SetAside>,
    _lock: Option<DirLock>,
}

impl Wal {
    /// Locks `dir`, recovers the queue from it and opens the WAL for writing.
    pub fn open_dir(
        dir: impl Into<PathBuf>,
        cfg: WalConfig,
    ) -> Result<(Wal, Queue, RecoveryReport), WalError> {
        let dir = dir.into();
        let lock = DirLock::acquire(&dir)?;
        let storage = FsStorage::new(&dir)
            .map_err(|e| WalError::io(format!("opening {}", dir.display()), e))?;
        let (mut wal, queue, report) = Wal::open(Arc::new(storage), cfg)?;
        wal._lock = Some(lock);
        Ok((wal, queue, report))
    }

    /// Recovers the queue from `storage` and opens the WAL for writing, on the system clock.
    pub fn open(
        storage: Arc<dyn Storage>,
        cfg: WalConfig,
    ) -> Result<(Wal, Queue, RecoveryReport), WalError> {
        Wal::open_with_clock(storage, cfg, Arc::new(SystemClock))
    }

    /// [`Wal::open`] reading the time from `clock` (a test's manual clock makes the retry of a
    /// failed disk exact instead of a sleep).
    pub fn open_with_clock(
        storage: Arc<dyn Storage>,
        cfg: WalConfig,
        clock: Arc<dyn Clock>,
    ) -> Result<(Wal, Queue, RecoveryReport), WalError> {
        let rec = match recovery::recover(&*storage, cfg.force_recovery, cfg.replica) {
            // A replica's primary holds what the damage took: start over from it rather
            // than refuse (`damage`). --force-recovery asked to keep what is readable instead.
            Err(e) if cfg.replica && !cfg.force_recovery && damage::is_damage(&e) => {
                damage::start_over(&*storage, e)?
            }
            r => r?,
        };
        let report = rec.report;
        tidy_after_recovery(&*storage, &report)?;
        let notify = Notify::default();
        let sync = match cfg.mode {
            WalMode::Fsync => Some(
                sync::SyncThread::start(storage.clone(), notify.clone(), cfg.loop_cpu)
                    .map_err(|e| WalError::io("starting the sync thread", e))?,
            ),
            _ => None,
        };
        let writer = snapshot::Writer::start(storage.clone(), notify.clone(), cfg.loop_cpu)
            .map_err(|e| WalError::io("starting the snapshot thread", e))?;
        let mut queue = rec.queue;
        queue.set_journal(cfg.mode != WalMode::None);
        tracing::info!(
            tasks = queue.len(),
            snapshot = ?report.snapshot,
            records = report.records,
            released = report.released,
            elapsed_ms = report.elapsed.as_millis() as u64,
            "recovered"
        );
        let opened_at = clock.now();
        // A replica resumes after the last complete turn it has: records in the snapshot's
        // fuzzy window after it are applied again, as recovery would.
        let last_seq = if cfg.replica {
            report.last_commit
        } else {
            rec.last_seq
        };
        let wal = Wal {
            // A fresh snapshot soon: after skipped damage, an older format, or a damaged
            // snapshot set aside (the kept snapshots are one fewer).
            snapshot_requested: !report.lost.is_empty()
                || report.older_format
                || !report.damaged_snapshots.is_empty(),
            started_over: report.set_aside.clone(),
            storage,
            clock,
            cfg,
            notify,
            last_seq,
            pending: pending::Pending::default(),
            batches: VecDeque::new(),
            unwritten: 0,
            open: None,
            open_needs_durability: false,
            held: VecDeque::new(),
            submitted: 0,
            durable: 0,
            durable_seq: last_seq,
            submitted_change: None,
            segment: None,
            rotated_unsynced: Vec::new(),
            failed: None,
            room: room::Room::default(),
            room_budget: 0,
            sync,
            writer,
            snap: SnapState::Idle,
            bytes_since_snapshot: report.wal_bytes_since_snapshot,
            last_snapshot_bytes: report.snapshot_bytes,
            last_snapshot_at: opened_at,
            last_walk_end: None,
            events: Vec::new(),
            counted: Vec::new(),
            vanished: Vec::new(),
            vanished_tubes: Vec::new(),
            unloggable: false,
            stats: WalStats::default(),
            written_seq: last_seq,
            tap: None,
            follow: follow::Follow::new(report.fuzzy_upto),
            terms: report.terms.clone(),
            term: report.terms.last_term(),
            leading: true,
            _lock: None,
        };
        Ok((wal, queue, report))
    }

    /// The threads wake the loop through `wake` when a sync or a snapshot step completes.
    pub fn set_waker(&self, wake: Wake) {
        let _ = self.notify.0.set(wake);
    }

    /// The damaged log this replica set aside at start, if it did (`damage`).
    pub fn started_over(&self) -> Option<&SetAside> {
        self.started_over.as_ref()
    }

    /// The replica that started over holds all its primary has written: it is whole again.
    /// Returns what it had set aside, the first time.
    pub fn finish_start_over(&mut self) -> Option<SetAside> {
        self.started_over.take()
    }

    pub fn mode(&self) -> WalMode {
        self.cfg.mode
    }

    /// `Err(WriteFailed)` while the disk fails or has no room: changes must be refused
    /// (`reserve` says so too, and makes the room).
    pub fn check_writable(&self) -> Result<(), WalError> {
        if let Some(f) = &self.failed {
            return Err(WalError::WriteFailed(f.message.clone()));
        }
        match self.room.full() {
            Some(f) => Err(WalError::WriteFailed(f.message.clone())),
            None => Ok(()),
        }
    }

    /// False once records of a failing disk pile up past `MAX_PENDING_BYTES`: refuse takes too.
    pub fn accepts_takes(&self) -> bool {
        self.pending.bytes() < MAX_PENDING_BYTES
    }

    fn record(&mut self, kind: Kind) -> usize {
        self.last_seq += 1;
        if self.open.is_none() {
            self.open = Some((self.pending.len(), self.last_seq));
        }
        self.stats.records += 1;
        format::begin_record(&mut self.pending.buf, self.last_seq, kind)
    }

    fn status_record(
        &mut self,
        id: TaskId,
        status: Status,
        runat: u64,
        deliveries: u16,
        counts: &JobCounts,
    ) {
        let at = self.record(Kind::Status);
        format::encode_status(&mut self.pending.buf, id, status, runat, deliveries, counts);
        format::end_small_record(&mut self.pending.buf, at);
    }

    /// Encodes the events the queue journaled since the last call into the open batch.
    pub fn append_turn(&mut self, queue: &mut Queue) {
        if self.cfg.mode == WalMode::None {
            queue.drain_events().for_each(drop);
            return;
        }
        let mut events = std::mem::take(&mut self.events);
        events.extend(queue.drain_events());
        for &ev in &events {
            self.record_event(queue, ev);
        }
        events.clear();
        self.events = events;
        self.record_counts(queue);
    }

    /// The operation counters the turn changed, as they stand at its end (`Kind::Counts`):
    /// a restart and a replica go on counting from them. A turn that changed none (a read)
    /// logs nothing.
    fn record_counts(&mut self, queue: &mut Queue) {
        let mut tubes = std::mem::take(&mut self.counted);
        let retired = queue.take_counted(&mut tubes);
        if !tubes.is_empty() || retired {
            let at = self.record(Kind::Counts);
            let buf = &mut self.pending.buf;
            let n = tubes.len() + usize::from(retired);
            buf.extend_from_slice(&(n as u16).to_le_bytes());
            for &ix in &tubes {
                let ops = queue.tube_stats(ix).unwrap_or_default();
                format::encode_counts_entry(buf, Some(ix), &ops);
            }
            if retired {
                format::encode_counts_entry(buf, None, &queue.retired());
            }
            // At most `MAX_TUBES` + 1 entries of at most 143 bytes: far below a record's limit.
            format::end_record(buf, at).expect("a Counts record fits a record");
        }
        self.counted = tubes;
    }

    /// Encodes one event into the open batch. `queue` is the state after the event's call or
    /// later in the same turn: records are absolute, each says what a task or tube is at the
    /// end of the turn, so later events of the turn replay on top of it.
    ///
    /// A put (or update) of a payload of `SHARED_RECORD_BYTES` or more holds the queue's
    /// buffer of it instead of a copy (`pending`).
    pub fn record_event(&mut self, queue: &Queue, ev: Event) {
        if self.cfg.mode == WalMode::None {
            return;
        }
        match ev {
            Event::TubeCreated { tube }
            | Event::TubeDropped { tube }
            | Event::TubeTruncated { tube } => self.record_tube_event(queue, ev, tube),
            Event::DedupRecorded { tube, seq } => {
                // Absent when the key expired within the same turn: nothing to keep.
                if let Some((key, id, expires)) = queue.dedup_entry(tube, seq) {
                    let at = self.record(Kind::Dedup);
                    format::encode_dedup(&mut self.pending.buf, tube, key, id, expires);
                    format::end_small_record(&mut self.pending.buf, at);
                }
            }
            Event::UsersChanged => {
                // The whole table, as it is at the end of the turn: a second change in the
                // same turn logs it again, which replays to the same table.
                self.open_needs_durability = true;
                let at = self.record(Kind::Users);
                format::encode_users(&mut self.pending.buf, queue.users());
                format::end_small_record(&mut self.pending.buf, at);
            }
            _ => self.record_task_event(queue, ev),
        }
    }

    fn record_task_event(&mut self, queue: &Queue, ev: Event) {
        let Some(id) = ev.task() else {
            return;
        };
        if self.vanished.contains(&id) {
            return;
        }
        if let Event::Acked { id } | Event::Expired { id } | Event::Deleted { id } = ev {
            // A removal names the id only: no lookup (the task is gone, and a lookup that
            // misses walks its whole probe chain).
            self.open_needs_durability |= !matches!(ev, Event::Expired { .. });
            let at = self.record(Kind::Remove);
            self.pending.buf.extend_from_slice(&id.to_le_bytes());
            format::end_small_record(&mut self.pending.buf, at);
            return;
        }
        let task = queue.get(id);
        let deliveries = task.map_or(0, |t| t.deliveries);
        let counts = task.map_or_else(JobCounts::default, |t| t.counts);
        match ev {
            // A task moved in from another node is logged as a put of it whole: a `Put`
            // record carries any status (a put taken in its own turn is logged Taken) with
            // the delivery count, utube key and counters, and replays through `restore_in`
            // as recovery restores every task, a Taken one as the other Taken ones. No record
            // kind of its own, so the format keeps its version: older builds of version 4,
            // a replica among them, read it.
            Event::Put { id } | Event::Imported { id } | Event::Updated { id } => match task {
                Some(t) => {
                    self.open_needs_durability = true;
                    let kind = if matches!(ev, Event::Updated { .. }) {
                        Kind::Replace
                    } else {
                        Kind::Put
                    };
                    let shared = if t.data.len() >= SHARED_RECORD_BYTES {
                        queue.shared_payload(id)
                    } else {
                        None
                    };
                    let at = self.record(kind);
                    let buf = &mut self.pending.buf;
                    let encoded = match &shared {
                        Some(payload) => format::encode_task_head(buf, &t)
                            .and_then(|()| format::end_record_with_tail(buf, at, payload)),
                        None => {
                            format::encode_task(buf, &t).and_then(|()| format::end_record(buf, at))
                        }
                    };
                    match (encoded, shared) {
                        (Err(e), _) => self.refuse_unloggable(at, e),
                        (Ok(()), Some(payload)) => self.pending.hold(payload),
                        (Ok(()), None) => {}
                    }
                }
                // Put (or imported) and removed within this turn: no task to log, only its
                // number, which this node's tube has counted past.
                None if matches!(ev, Event::Put { .. } | Event::Imported { .. }) => {
                    self.vanished.push(id);
                    self.spent_record(id);
                }
                // Updated, then removed in this turn: the removal is logged next.
                None => {}
            },
            Event::Taken { id, .. } => {
                self.status_record(id, Status::Taken, 0, deliveries, &counts)
            }
            Event::Released { id, runat } => {
                self.open_needs_durability = true;
                let status = if runat == 0 {
                    Status::Ready
                } else {
                    Status::Waiting
                };
                self.status_record(id, status, runat, deliveries, &counts)
            }
            Event::Promoted { id }
            | Event::TtrReturned { id }
            | Event::AutoReleased { id }
            | Event::Kicked { id } => {
                self.open_needs_durability |= matches!(ev, Event::Kicked { .. });
                self.status_record(id, Status::Ready, 0, deliveries, &counts)
            }
            Event::Buried { id } | Event::DeadLettered { id } => {
                self.open_needs_durability |= matches!(ev, Event::Buried { .. });
                self.status_record(id, Status::Buried, 0, deliveries, &counts)
            }
            _ => {}
        }
    }

    /// A put whose task is gone by the end of its turn logs no `Put`, yet its tube gave it a
    /// number: a `Spent` record carries the id, so a restart or a replica numbers the tube's
    /// next task above it (neither a later put nor a `TubeCreate` need be logged to carry the
    /// numbering). Its reply waits for it, as any put's. A tube dropped within the turn logs
    /// them too: its numbers stay spent at its index (the replay raises the index's floor),
    /// though a tube created and dropped in one turn logs nothing else.
    fn spent_record(&mut self, id: TaskId) {
        self.open_needs_durability = true;
        let at = self.record(Kind::Spent);
        self.pending.buf.extend_from_slice(&id.to_le_bytes());
        format::end_small_record(&mut self.pending.buf, at);
    }

    /// A tube created, dropped or truncated: logged as the tube is at the end of the turn. A
    /// tube created and dropped within one turn logs nothing (neither its creation nor what
    /// happened to it before the drop).
    fn record_tube_event(&mut self, queue: &Queue, ev: Event, tube: TubeIx) {
        self.open_needs_durability = true;
        if let SnapState::Walking(w) = &mut self.snap {
            w.tube_changed(tube);
        }
        let vanished = self.vanished_tubes.contains(&tube);
        match ev {
            Event::TubeCreated { .. } => match queue.tube_info(tube) {
                Some(info) => {
                    let at = self.record(Kind::TubeCreate);
                    format::encode_tube(&mut self.pending.buf, &info);
                    format::end_small_record(&mut self.pending.buf, at);
                }
                None => self.vanished_tubes.push(tube),
            },
            Event::TubeDropped { .. } if vanished => self.vanished_tubes.retain(|&t| t != tube),
            Event::TubeTruncated { .. } if vanished => {}
            Event::TubeDropped { .. } | Event::TubeTruncated { .. } => {
                let kind = if matches!(ev, Event::TubeDropped { .. }) {
                    Kind::TubeDrop
                } else {
                    Kind::TubeTruncate
                };
                let at = self.record(kind);
                self.pending.buf.extend_from_slice(&tube.to_le_bytes());
                format::end_small_record(&mut self.pending.buf, at);
            }
            _ => {}
        }
    }

    /// A task the format cannot hold reached the log (the server checks sizes before the
    /// queue changes, so only a caller's bug gets here). The queue already changed and cannot
    /// be logged: the WAL stops accepting changes for good and the turn is never durable, so
    /// no reply claims what a restart would not bring back. Nothing panics.
    fn refuse_unloggable(&mut self, at: usize, e: format::TooLarge) {
        self.pending.truncate(at);
        self.last_seq -= 1;
        self.stats.records -= 1;
        if self.open.is_some_and(|(start, _)| start == at) {
            self.open = None;
        }
        let message = format!("a change cannot be logged: {e}; restart tarq");
        tracing::error!(error = %message, "WAL refusing all changes");
        self.open_needs_durability = true;
        self.unloggable = true;
        self.room_budget = 0;
        self.failed = Some(Failure {
            message,
            retry_at: self.clock.now(),
        });
    }

    /// A turn of this node's own while it does not lead, or after records of a newer term
    /// than it led: a server path changed the queue where only the primary's records may. Its
    /// records would sit at sequence numbers the primary gives its own (the replica skips
    /// those as already held), and a turn closed with an older term after a newer one is a
    /// log no replica can follow. So nothing of it is written, the turn is never durable (no
    /// reply claims it), and the WAL refuses every change until a restart recovers the queue
    /// from what is on disk: the primary's log, whole.
    #[cold]
    fn refuse_own_turn(&mut self, start: usize, first_seq: u64) {
        let records = self.last_seq + 1 - first_seq;
        self.pending.truncate(start);
        self.last_seq = first_seq - 1;
        self.stats.records -= records;
        let message = format!(
            "a change of this node's own while it does not lead (it led term {}, its log is at \
             term {}): not logged; restart tarq",
            self.term,
            self.terms.last_term()
        );
        tracing::error!(error = %message, records, "WAL refusing all changes");
        self.unloggable = true;
        self.room_budget = 0;
        self.held.push_back(self.submitted);
        self.open_needs_durability = false;
        self.failed = Some(Failure {
            message,
            retry_at: self.clock.now(),
        });
    }

    /// Ends the turn: closes the open batch and writes it (one write for the whole turn).
    /// Returns the turn's number, which its replies wait for (see `is_durable`).
    pub fn submit(&mut self) -> BatchId {
        self.submitted += 1;
        self.vanished.clear();
        self.vanished_tubes.clear();
        self.submitted_change = None;
        let Some((start, first_seq)) = self.open.take() else {
            return self.submitted;
        };
        if !self.leading || self.term < self.terms.last_term() {
            self.refuse_own_turn(start, first_seq);
            return self.submitted;
        }
        let at = self.record(Kind::Commit);
        format::encode_commit(&mut self.pending.buf, self.term, self.terms.history);
        format::end_small_record(&mut self.pending.buf, at);
        self.terms.note(self.term, first_seq, 0);
        self.open = None;
        self.stats.batches += 1;
        let needs_durability = std::mem::take(&mut self.open_needs_durability);
        if needs_durability {
            self.held.push_back(self.submitted);
            self.submitted_change = Some(self.last_seq);
        }
        self.batches.push_back(Batch {
            id: self.submitted,
            first_seq,
            last_seq: self.last_seq,
            start,
            end: self.pending.len(),
        });
        if self.failed.is_none() {
            self.write_pending();
        }
        self.submitted
    }

    /// Every turn up to this one may send its replies.
    pub fn durable_upto(&self) -> BatchId {
        self.held.front().map_or(self.submitted, |&t| t - 1)
    }

    /// Whether the replies of turn `t` may be sent: its put/ack/release records (if any) are
    /// durable in the configured mode. A later turn may go before an earlier one that waits
    /// (a take while a put's sync runs, or while the disk is full).
    pub fn is_durable(&self, t: BatchId) -> bool {
        t <= self.submitted && self.held.binary_search(&t).is_err()
    }

    /// Writes every submitted byte not yet written; on failure enters the failed state.
    fn write_pending(&mut self) {
        let end = self.batches.back().map_or(self.unwritten, |b| b.end);
        if self.unwritten >= end {
            return;
        }
        if let Err(e) = self.try_write(end) {
            self.fail(e);
        }
    }

    fn try_write(&mut self, end: usize) -> std::io::Result<()> {
        if self.segment.is_none() {
            let first = self
                .batches
                .iter()
                .find(|b| b.start == self.unwritten)
                .expect("unwritten bytes start a batch");
            let name = format::segment_name(first.first_seq);
            let file = self.storage.create(&name)?;
            if let Some(s) = &self.sync {
                s.set_segment(file.clone());
            }
            // Set before the header write: a failure must abandon this file too.
            self.segment = Some(Segment {
                file: file.clone(),
                name,
                bytes: 0,
                allocated: 0,
            });
            file.write_all(&format::file_header(format::WAL_MAGIC, first.first_seq))?;
            self.segment.as_mut().expect("just set").bytes = FILE_HEADER_LEN as u64;
        }
        let seg = self.segment.as_mut().expect("segment open");
        match self.pending.contiguous(self.unwritten, end) {
            Some(bytes) => seg.file.write_all(bytes)?,
            None => {
                let pieces: Vec<&[u8]> = self.pending.pieces(self.unwritten, end).collect();
                seg.file.write_all_vectored(&pieces)?;
            }
        }
        if let Some(tap) = &mut self.tap {
            // Only once all of it is written: a failed write rewrites the turn, and the tap
            // must not carry a part of it twice.
            self.pending
                .pieces(self.unwritten, end)
                .for_each(|piece| tap.extend_from_slice(piece));
        }
        let n = self.pending.bytes_between(self.unwritten, end) as u64;
        seg.bytes += n;
        self.room_budget = self.room_budget.saturating_sub(n);
        self.stats.writes += 1;
        self.stats.bytes_written += n;
        self.bytes_since_snapshot += n;
        self.unwritten = end;
        let last = self.batches.back().expect("wrote a batch").id;
        self.written_seq = self.batches.back().expect("wrote a batch").last_seq;
        let rotate = seg.bytes >= self.cfg.segment_bytes;
        if rotate {
            tracing::debug!(segment = %seg.name, bytes = seg.bytes, "WAL segment full; the next turn starts a new one");
            Wal::trim_segment(seg);
            self.room_budget = 0;
            if self.sync.is_none() {
                // Write mode never syncs while serving; `close` syncs these before it returns.
                if self.rotated_unsynced.len() == MAX_ROTATED_UNSYNCED {
                    self.rotated_unsynced.remove(0);
                }
                self.rotated_unsynced.push(seg.file.clone());
            }
            self.segment = None;
        }
        match &self.sync {
            Some(s) => s.request(last),
            None => self.set_durable(last),
        }
        Ok(())
    }

    fn fail(&mut self, e: std::io::Error) {
        let message = describe(&e);
        self.stats.write_errors += 1;
        if self.failed.is_none() {
            tracing::error!(error = %message, "WAL write failed: refusing changes until the disk takes writes again");
        }
        self.failed = Some(Failure {
            message,
            retry_at: self.clock.now() + RETRY_INTERVAL,
        });
        // The segment may hold a partial turn: abandon it and rewrite every turn that is not
        // durable into a new segment starting at that turn's sequence number.
        if let Some(seg) = self.segment.take() {
            Wal::trim_segment(&seg);
        }
        self.room_budget = 0;
        self.unwritten = self.batches.front().map_or(self.pending.len(), |b| b.start);
        if let Some(s) = &self.sync {
            s.abandon(self.durable);
        }
    }

    fn set_durable(&mut self, upto: BatchId) {
        if upto <= self.durable {
            return;
        }
        self.durable = upto;
        while self.held.front().is_some_and(|&t| t <= upto) {
            self.held.pop_front();
        }
        let mut cut = 0;
        while let Some(b) = self.batches.front() {
            if b.id > upto {
                break;
            }
            cut = b.end;
            self.durable_seq = b.last_seq;
            self.batches.pop_front();
        }
        self.pending.drain_front(cut);
        let buf = &mut self.pending.buf;
        if buf.capacity() > WAL_BUF_RESTING_BYTES && buf.len() <= WAL_BUF_RESTING_BYTES / 2 {
            // A big turn grew the buffer: give it back, or the process keeps that memory
            // for good.
            buf.shrink_to(WAL_BUF_RESTING_BYTES);
        }
        self.unwritten -= cut;
        for b in &mut self.batches {
            b.start -= cut;
            b.end -= cut;
        }
        if let Some((start, _)) = &mut self.open {
            *start -= cut;
        }
    }

    /// Once per loop turn, after `submit`: collects sync results, retries a failed disk and
    /// advances a running snapshot by a bounded step.
    pub fn poll(&mut self, queue: &mut Queue) {
        self.poll_paced(queue, Pace::Serving);
    }

    fn poll_paced(&mut self, queue: &mut Queue, pace: Pace) {
        // Events the server did not append yet join the next batch (the snapshot needs them
        // logged before it names its end).
        self.append_turn(queue);
        if let Some(s) = &self.sync {
            let p = s.progress();
            self.stats.syncs = p.syncs;
            if let Some(e) = p.error {
                self.fail(e);
            } else if self.failed.is_none() {
                self.set_durable(p.done);
            }
        }
        if let Some(f) = self.failed.as_ref().filter(|_| !self.unloggable) {
            if self.clock.now() >= f.retry_at {
                self.failed = None;
                self.write_pending();
                if self.failed.is_none() {
                    tracing::info!("WAL writes succeed again: accepting changes");
                }
            }
        }
        self.retry_room();
        self.stats.pending_bytes = self.pending.bytes() as u64;
        self.stats.wal_bytes_since_snapshot = self.bytes_since_snapshot;
        self.poll_snapshot(queue, pace);
    }

    /// How long the loop may sleep before the WAL needs `poll` again (threads use the waker).
    pub fn timeout(&self) -> Option<Duration> {
        // A requested snapshot starts, and a walk advances, at the next `poll`; a walk waiting
        // for the writer thread to take a block checks back a little later instead of spinning.
        match &self.snap {
            SnapState::Walking(w) if w.is_stalled() => return Some(SNAPSHOT_STALL_RECHECK),
            SnapState::Walking(_) => return Some(Duration::ZERO),
            SnapState::Idle if self.snapshot_requested && self.failed.is_none() => {
                return Some(Duration::ZERO)
            }
            _ => {}
        }
        let now = self.clock.now();
        let retry = self
            .failed
            .as_ref()
            .filter(|_| !self.unloggable)
            .map(|f| f.retry_at)
            .into_iter()
            .chain(self.room_retry_at())
            .min()
            .map(|at| at.saturating_duration_since(now));
        match (
            retry,
            self.interval_left()
                .filter(|_| matches!(self.snap, SnapState::Idle)),
        ) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Asks for a snapshot (`queue.snapshot()`); false when one is already running.
    pub fn request_snapshot(&mut self) -> bool {
        if matches!(self.snap, SnapState::Idle) {
            self.snapshot_requested = true;
            true
        } else {
            false
        }
    }

    pub fn snapshot_running(&self) -> bool {
        !matches!(self.snap, SnapState::Idle)
    }

    pub fn stats(&self) -> WalStats {
        WalStats {
            disk_full: self.room.full().is_some(),
            refusals: self.room.refusals,
            allocated_ahead: self.allocated_ahead(),
            ..self.stats.clone()
        }
    }

    /// The last record written to the log (a relay may stream up to it).
    pub fn written_seq(&self) -> u64 {
        self.written_seq
    }

    /// The log's history id (0: none named yet).
    pub fn history(&self) -> u64 {
        self.terms.history
    }

    /// Names the log's history when it has none: a primary starting a log of its own.
    pub fn adopt_history(&mut self, history: u64) {
        if self.terms.history == 0 {
            self.terms.history = history;
        }
    }

    /// The term this node's turns are written in from now on (it became the leader of it).
    pub fn set_term(&mut self, term: u64) {
        self.term = term;
        self.leading = true;
    }

    /// This node no longer leads (a cluster node that is deposed, follows, or has not won an
    /// election yet): a turn of its own is refused (see `refuse_own_turn`) until `set_term`.
    pub fn stop_leading(&mut self) {
        self.leading = false;
    }

    /// The term of the last turn logged.
    pub fn last_term(&self) -> u64 {
        self.terms.last_term()
    }

    /// The term of record `seq`, if this log holds it (see [`Terms::term_of`]).
    pub fn term_of(&self, seq: u64) -> Option<u64> {
        self.terms.term_of(seq, self.last_seq)
    }

    /// The last record durable in the configured mode (what a replica acknowledges).
    pub fn durable_seq(&self) -> u64 {
        self.durable_seq
    }

    /// The last record of the batch just submitted, when that batch holds a change (put,
    /// ack, release, ...) whose reply waits for durability; `None` for a batch of takes and
    /// timers only, or none at all.
    pub fn submitted_change(&self) -> Option<u64> {
        self.submitted_change
    }

    /// Bytes the log holds allocated for records not yet durable (its buffer's capacity; big
    /// payloads it holds are the queue's buffers, not its own).
    pub fn buffer_capacity(&self) -> usize {
        self.pending.buf.capacity()
    }

    /// Bytes of records not durable yet (the open turn's included).
    pub fn pending_bytes(&self) -> u64 {
        self.pending.bytes() as u64
    }

    /// The last sequence number given to a record (a replica's position once applied).
    pub fn last_seq(&self) -> u64 {
        self.last_seq
    }

    /// The directory the log lives in (relays read its files).
    pub fn storage(&self) -> Arc<dyn Storage> {
        Arc::clone(&self.storage)
    }

    /// Starts (or stops) copying every byte written into a tap the server drains each turn
    /// with [`take_tap`](Self::take_tap): replicas stream it.
    pub fn set_tap(&mut self, on: bool) {
        match (on, self.tap.is_some()) {
            (true, false) => self.tap = Some(Vec::new()),
            (false, true) => self.tap = None,
            _ => {}
        }
    }

    /// Whether what is written is copied into the tap now.
    pub fn tapping(&self) -> bool {
        self.tap.is_some()
    }

    /// Moves the bytes written since the last call into `out` (cleared first): whole turns,
    /// in sequence order. A turn rewritten after a failed write comes again.
    pub fn take_tap(&mut self, out: &mut Vec<u8>) {
        out.clear();
        if let Some(tap) = &mut self.tap {
            std::mem::swap(tap, out);
        }
    }

    fn on_writer(&mut self, msg: snapshot::FromWriter) {
        match msg {
            snapshot::FromWriter::Synced => {
                if let SnapState::Sealed { synced, .. } = &mut self.snap {
                    *synced = true;
                }
            }
            snapshot::FromWriter::Committed {
                name,
                removed,
                bytes,
            } => {
                self.stats.snapshots += 1;
                self.last_snapshot_bytes = bytes;
                self.last_snapshot_at = self.clock.now();
                tracing::info!(file = %name, bytes, removed = ?removed, "snapshot done");
                self.snap = SnapState::Idle;
                // Its blocks are written: none is kept between snapshots.
                self.writer.free.try_iter().for_each(drop);
            }
            snapshot::FromWriter::Failed(e) => {
                tracing::error!(error = %describe(&e), "snapshot failed; will try again later");
                self.snap = SnapState::Idle;
                self.writer.free.try_iter().for_each(drop);
                // Try again after as much WAL again as triggered this one, not at once.
                self.bytes_since_snapshot = 0;
            }
        }
    }

    fn poll_snapshot(&mut self, queue: &mut Queue, pace: Pace) {
        while let Ok(msg) = self.writer.rx.try_recv() {
            self.on_writer(msg);
        }
        if matches!(self.snap, SnapState::Idle)
            && self.failed.is_none()
            && (self.snapshot_requested || self.snapshot_due())
        {
            self.start_snapshot(queue);
        }
        if let SnapState::Walking(walk) = &mut self.snap {
            // `poll` appended every journaled event first, so `last_seq` covers all the walk saw.
            let t0 = Instant::now();
            let budget = match pace {
                Pace::Unpaced => snapshot::SNAPSHOT_STEP_UNPACED,
                // The work since the last step (the turn's requests) sets this one's share.
                Pace::Serving => {
                    snapshot::step_budget(self.last_walk_end.map_or(Duration::ZERO, |e| t0 - e))
                }
            };
            let step = walk.step(
                queue,
                &self.writer.tx,
                &self.writer.free,
                self.last_seq,
                t0 + budget,
            );
            let end = Instant::now();
            self.last_walk_end = Some(end);
            let took = (end - t0).as_micros() as u64;
            self.stats.snapshot_walk_steps += 1;
            self.stats.snapshot_longest_step_us = self.stats.snapshot_longest_step_us.max(took);
            match step {
                snapshot::Step::Walking => {}
                snapshot::Step::Sealed { end_seq } => {
                    self.snap = SnapState::Sealed {
                        end_seq,
                        synced: false,
                        committing: false,
                        started: self.clock.now(),
                    };
                }
                snapshot::Step::Broken => {
                    tracing::error!("snapshot writer thread is gone");
                    self.snap = SnapState::Idle;
                }
                snapshot::Step::Failed(e) => {
                    tracing::error!(error = %e, "snapshot abandoned");
                    self.snap = SnapState::Idle;
                    self.bytes_since_snapshot = 0;
                }
            }
        }
        if let SnapState::Sealed {
            end_seq,
            synced: true,
            committing,
            started,
        } = &mut self.snap
        {
            let covered = self.cfg.mode == WalMode::None || self.durable_seq >= *end_seq;
            if covered && !*committing {
                tracing::debug!(
                    end_seq = *end_seq,
                    waited_ms = self
                        .clock
                        .now()
                        .saturating_duration_since(*started)
                        .as_millis() as u64,
                    "committing the snapshot"
                );
                let keep = self.cfg.keep_snapshots.max(1);
                if self
                    .writer
                    .tx
                    .send(snapshot::ToWriter::Commit { keep })
                    .is_err()
                {
                    tracing::error!("snapshot writer thread is gone");
                    self.snap = SnapState::Idle;
                } else {
                    *committing = true;
                }
            }
        }
    }

    /// The WAL since the last snapshot passed the size trigger, or the interval passed with
    /// something written since.
    fn snapshot_due(&self) -> bool {
        let by_size = self.cfg.snapshot_every_bytes > 0
            && self.bytes_since_snapshot
                >= self
                    .cfg
                    .snapshot_every_bytes
                    .max(self.last_snapshot_bytes.saturating_mul(SNAPSHOT_WAL_RATIO));
        by_size || self.interval_left().is_some_and(|d| d.is_zero())
    }

    /// Time until the interval trigger fires; `None` when it is off or nothing was written.
    fn interval_left(&self) -> Option<Duration> {
        let every = self.cfg.snapshot_interval?;
        if self.bytes_since_snapshot == 0 {
            return None;
        }
        let due = self.last_snapshot_at + every;
        Some(due.saturating_duration_since(self.clock.now()))
    }

    fn start_snapshot(&mut self, queue: &mut Queue) {
        // The snapshot starts at a turn boundary: log what the queue journaled so far.
        self.append_turn(queue);
        self.submit();
        self.snapshot_requested = false;
        self.bytes_since_snapshot = 0;
        let start_seq = self.last_seq;
        if self
            .writer
            .tx
            .send(snapshot::ToWriter::Begin {
                start_seq,
                tasks: queue.len(),
            })
            .is_err()
        {
            tracing::error!("snapshot writer thread is gone");
            return;
        }
        tracing::info!(start_seq, tasks = queue.len(), "snapshot started");
        self.stats.snapshot_walk_steps = 0;
        self.stats.snapshot_longest_step_us = 0;
        self.last_walk_end = None;
        let (term, history) = (self.terms.last_term(), self.terms.history);
        self.snap = SnapState::Walking(Box::new(snapshot::Walk::new(queue, term, history)));
    }

    /// Tests and shutdown: drives `poll` until every submitted batch is durable.
    pub fn flush(&mut self, queue: &mut Queue, timeout: Duration) -> Result<(), WalError> {
        self.append_turn(queue);
        self.submit();
        let deadline = Instant::now() + timeout;
        loop {
            self.poll(queue);
            // Every batch, even one of takes only: tests compare exact states after a crash.
            if self.batches.is_empty() {
                return Ok(());
            }
            if let Some(f) = &self.failed {
                return Err(WalError::WriteFailed(f.message.clone()));
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(WalError::WriteFailed(
                    "timed out waiting for the WAL to sync".into(),
                ));
            }
            if let Some(s) = &self.sync {
                s.wait_done(self.batches.back().map_or(0, |b| b.id), left);
            }
        }
    }

    /// A graceful stop (SIGTERM/SIGINT): writes whatever the queue journaled, waits until it
    /// is durable, then syncs the segment and the directory whatever the mode, so a stop
    /// loses nothing even to a power cut right after it. Without a WAL (`WalMode::None`) the
    /// queue is saved as a snapshot instead.
    pub fn close(&mut self, queue: &mut Queue, timeout: Duration) -> Result<(), WalError> {
        if self.cfg.mode == WalMode::None {
            return self.snapshot_now(queue, timeout).map(|_| ());
        }
        self.flush(queue, timeout)?;
        for f in self.rotated_unsynced.drain(..) {
            f.sync()
                .map_err(|e| WalError::io("syncing a rotated WAL segment", e))?;
        }
        self.room_budget = 0;
        if let Some(seg) = &self.segment {
            Wal::trim_segment(seg);
            seg.file
                .sync()
                .map_err(|e| WalError::io(format!("syncing {}", seg.name), e))?;
        }
        self.storage
            .sync_dir()
            .map_err(|e| WalError::io("syncing the data directory", e))
    }

    /// Tests, shutdown and benches: takes a snapshot now and waits until it is committed.
    /// Returns the snapshot's file name.
    pub fn snapshot_now(
        &mut self,
        queue: &mut Queue,
        timeout: Duration,
    ) -> Result<String, WalError> {
        let deadline = Instant::now() + timeout;
        let before = self.stats.snapshots;
        while self.snapshot_running() {
            self.step_blocking(queue, deadline)?;
        }
        self.request_snapshot();
        let timed_out = || {
            WalError::io(
                "snapshot",
                std::io::Error::from(std::io::ErrorKind::TimedOut),
            )
        };
        loop {
            self.step_blocking(queue, deadline)?;
            self.check_writable()?;
            if !self.snapshot_running() && !self.snapshot_requested {
                if self.stats.snapshots > before {
                    let names = self
                        .storage
                        .list()
                        .map_err(|e| WalError::io("listing", e))?;
                    return names
                        .into_iter()
                        .filter(|n| n.ends_with(SNAP_SUFFIX))
                        .max()
                        .ok_or_else(|| {
                            WalError::io(
                                "snapshot",
                                std::io::Error::other("no snapshot file after commit"),
                            )
                        });
                }
                return Err(WalError::io(
                    "snapshot",
                    std::io::Error::other("the snapshot failed; see the log"),
                ));
            }
            if Instant::now() >= deadline {
                return Err(timed_out());
            }
        }
    }

    fn step_blocking(&mut self, queue: &mut Queue, deadline: Instant) -> Result<(), WalError> {
        self.append_turn(queue);
        self.submit();
        // Nobody waits for this loop: the walk is not paced.
        self.poll_paced(queue, Pace::Unpaced);
        if Instant::now() >= deadline {
            return Err(WalError::io(
                "snapshot",
                std::io::Error::from(std::io::ErrorKind::TimedOut),
            ));
        }
        if matches!(self.snap, SnapState::Sealed { .. }) {
            if let Some(s) = &self.sync {
                s.wait_done(self.batches.back().map_or(0, |b| b.id), BLOCKING_STEP);
            }
            // Wait for the writer's next report instead of spinning.
            if let Ok(msg) = self.writer.rx.recv_timeout(BLOCKING_STEP) {
                self.on_writer(msg);
            }
        }
        Ok(())
    }
}

/// Cuts the torn tail recovery found and removes snapshots left half-written by a crash.
fn tidy_after_recovery(storage: &dyn Storage, report: &RecoveryReport) -> Result<(), WalError> {
    if !report.damaged_snapshots.is_empty() {
        let names: Vec<String> = report
            .damaged_snapshots
            .iter()
            .map(|d| d.file.clone())
            .collect();
        let folder = damage::set_aside(storage, &names)?;
        tracing::warn!(files = ?names, folder = %folder, "moved the damaged snapshots aside");
    }
    if let Some(t) = &report.torn {
        let cut = if t.offset < FILE_HEADER_LEN as u64 {
            storage.remove(&t.file)
        } else {
            storage.open_append(&t.file).and_then(|f| {
                f.truncate(t.offset)?;
                f.sync()
            })
        };
        cut.map_err(|e| WalError::io(format!("cutting the torn tail of {}", t.file), e))?;
        tracing::warn!(file = %t.file, offset = t.offset, bytes = t.bytes, "cut the WAL's torn tail");
    }
    let names = storage
        .list()
        .map_err(|e| WalError::io("listing the data directory", e))?;
    // A segment the last process left open (or abandoned) may hold space allocated past its
    // end (`room`): give it back. Only space is at stake, so a failure is not fatal.
    for n in names.iter().filter(|n| n.ends_with(WAL_SUFFIX)) {
        if let Err(e) = storage.open_append(n).and_then(|f| f.trim()) {
            tracing::warn!(file = %n, error = %describe(&e), "could not give back the space allocated past a WAL segment's end");
        }
    }
    for n in names.iter().filter(|n| n.ends_with(INPROGRESS_SUFFIX)) {
        storage
            .remove(n)
            .map_err(|e| WalError::io(format!("removing {n}"), e))?;
    }
    storage
        .sync_dir()
        .map_err(|e| WalError::io("syncing the data directory", e))
}

/// Files a new snapshot makes unnecessary: snapshots beyond the newest `keep`, and WAL segments
/// whose every record precedes the oldest kept snapshot.
pub fn files_to_remove(names: &[String], keep: usize) -> Vec<String> {
    let mut snaps: Vec<(u64, &String)> = names
        .iter()
        .filter_map(|n| Some((format::parse_name(n, SNAP_SUFFIX)?, n)))
        .collect();
    snaps.sort_unstable_by(|a, b| b.cmp(a));
    if snaps.is_empty() || keep == 0 {
        return Vec::new();
    }
    let mut out: Vec<String> = snaps.iter().skip(keep).map(|(_, n)| (*n).clone()).collect();
    let oldest_kept = snaps[snaps.len().min(keep) - 1].0;
    let mut segs: Vec<(u64, &String)> = names
        .iter()
        .filter_map(|n| Some((format::parse_name(n, WAL_SUFFIX)?, n)))
        .collect();
    segs.sort_unstable();
    for w in segs.windows(2) {
        // Every record of w[0] is below w[1]'s first one.
        if w[1].0 <= oldest_kept + 1 {
            out.push(w[0].1.clone());
        }
    }
    out
}
