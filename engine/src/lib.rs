//! The tarq queue engine: named tubes of tasks in one slab arena, per-tube ordered lists (and
//! per-utube lists), one deadline heap, per-session taken lists and O(1) per-tube stats. It does no I/O, reads no clock and starts no
//! threads: `now` is always an argument, so a property test can drive it step by step and a
//! bench can measure it without noise. Parked takes, the wire protocol and durability live in
//! `tarq-net`; this crate only reports what changed through an optional journal of [`Event`]s.

mod arena;
mod heap;
mod index;
mod lists;
mod queue;
mod restoring;
mod room;
mod sessions;
mod slots;
mod tubes;
pub mod users;

pub use bytes::Bytes;
pub use queue::{
    MovedDedup, MovedTask, Queue, EXPORT_MIN_PROBES, EXPORT_PROBES_PER_TASK, MAX_TAKEN_WALK,
    MAX_TASKS,
};
pub use restoring::{list_key, BulkIds, Restoring};
pub use room::{Room, RoomWanted};
pub use tubes::{
    id_number, id_tube, number_from, task_id, PutOutcome, ReleaseOptions, TubeInfo, TubeNumbers,
    TubeOptions, TubePut, TubeType, DEFAULT_TUBE, DEFAULT_TUBE_NAME, MAX_DEDUP_KEY_BYTES,
    MAX_TASK_NUMBER, MAX_TUBES, MAX_TUBE_NAME_BYTES, MAX_UTUBE_KEY_BYTES, TUBE_ID_SHIFT,
};
pub use users::{Rights, User, UserError, UserLimits, Users};

/// beanstalkd's "urgent" line: a task with a lower pri is urgent (`ready_urgent`,
/// beanstalk's `current-jobs-urgent`). beanstalkd's own constant (`URGENT_THRESHOLD`), so
/// `stats` over the beanstalk port reads as beanstalkd's would.
pub const URGENT_PRI: i64 = 1024;

/// Asks the CPU to bring the cache line holding `r` in: a hint, which changes no result (and
/// on other architectures is nothing).
#[inline(always)]
pub(crate) fn prefetch<T>(r: &T) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: SSE is part of the x86_64 baseline, and a prefetch never faults, whatever the
    // address (here a live reference).
    unsafe {
        use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
        _mm_prefetch::<_MM_HINT_T0>(std::ptr::from_ref(r).cast());
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = r;
}

/// A tube's index: stable for the tube's life and across restarts (`restore_tube` puts a
/// tube back at its index); a dropped tube's index is reused by a later `create_tube`, whose
/// tube numbers on from the dropped one's.
/// "No position": the slot has no entry, or a link points nowhere.
pub(crate) const NIL: u32 = u32::MAX;

pub type TubeIx = u16;

/// A task's id: its tube's index and a number at that index ([`task_id`]); numbers count up
/// from 0 at each index (from 1 in `default`), on through every tube the index holds in turn
/// (`TubeNumbers::first`), and are never given twice (also across restarts: `restore_in`,
/// `restore_tube` and `restore_floor` carry each index's counter). Unique across tubes and
/// over a data directory's life.
pub type TaskId = u64;
/// The session (connection) that owns a taken task.
pub type SessionId = u64;
/// Microseconds since the Unix epoch. The engine never reads a clock: callers pass `now`.
pub type Micros = u64;

/// Where a task is in its life.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub enum Status {
    Ready,
    Taken,
    /// Delayed: becomes Ready at `runat`.
    Waiting,
    /// Set aside by `bury` (or by `max_deliveries`) until `kick`.
    Buried,
}

impl Status {
    /// The one-letter status the seed queue shows clients (it has no buried tasks of its own;
    /// a task buried through the tube API shows as `B`).
    pub fn as_str(self) -> &'static str {
        match self {
            Status::Ready => "R",
            Status::Taken => "T",
            Status::Waiting => "W",
            Status::Buried => "B",
        }
    }
}

/// Options of `put`. The default is the seed's plain put: ready now, no TTL, no TTR, pri 0.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct PutOptions {
    /// 0 = ready now; else Waiting until `now + delay`.
    pub delay: Micros,
    /// Deleted when `created + ttl` passes, in any state.
    pub ttl: Option<Micros>,
    /// A taken task goes back to Ready after being taken this long.
    pub ttr: Option<Micros>,
    /// Lower is taken first; equal pri keeps id order.
    pub pri: i64,
}

/// Payloads up to this many bytes come back from the queue (`ack`, `delete`, ...) inside the
/// [`Payload`] itself, with no allocation: the queue keeps them in its own records.
pub const INLINE_PAYLOAD: usize = 128;

/// An owned payload: the bytes of a task that left the queue. A small one (up to
/// [`INLINE_PAYLOAD`] bytes) is held inline, so an ack allocates nothing; a bigger one is the
/// buffer it was put with. Reads as `&[u8]`.
#[derive(Clone)]
pub struct Payload(PayloadRepr);

#[derive(Clone)]
enum PayloadRepr {
    Inline {
        len: u8,
        bytes: [u8; INLINE_PAYLOAD],
    },
    Shared(Bytes),
}

impl std::ops::Deref for Payload {
    type Target = [u8];
    #[inline]
    fn deref(&self) -> &[u8] {
        match &self.0 {
            PayloadRepr::Inline { len, bytes } => &bytes[..usize::from(*len)],
            PayloadRepr::Shared(b) => b,
        }
    }
}

impl From<&[u8]> for Payload {
    #[inline]
    fn from(b: &[u8]) -> Payload {
        if b.len() <= INLINE_PAYLOAD {
            let mut bytes = [0u8; INLINE_PAYLOAD];
            bytes[..b.len()].copy_from_slice(b);
            Payload(PayloadRepr::Inline {
                len: b.len() as u8,
                bytes,
            })
        } else {
            Payload(PayloadRepr::Shared(Bytes::copy_from_slice(b)))
        }
    }
}

impl From<Bytes> for Payload {
    fn from(b: Bytes) -> Payload {
        Payload(PayloadRepr::Shared(b))
    }
}

impl From<Vec<u8>> for Payload {
    fn from(v: Vec<u8>) -> Payload {
        Payload::from(v.as_slice())
    }
}

impl From<Payload> for Bytes {
    fn from(p: Payload) -> Bytes {
        match p.0 {
            PayloadRepr::Shared(b) => b,
            PayloadRepr::Inline { .. } => Bytes::copy_from_slice(&p),
        }
    }
}

impl PartialEq for Payload {
    fn eq(&self, other: &Payload) -> bool {
        **self == **other
    }
}

impl Eq for Payload {}

impl std::fmt::Debug for Payload {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Debug::fmt(&**self, f)
    }
}

/// What a put hands the queue: bytes it copies into its own records when they are small, or
/// a buffer it keeps as it is when they are big. A borrowed slice costs a put no allocation
/// for a small payload (the server passes the request frame's bytes); an owned buffer saves
/// a copy of a big one (the server hands over the frame a big put arrived in, and the log and
/// the reply share it with the task rather than copy it: [`Queue::shared_payload`]).
pub trait PutPayload {
    fn bytes(&self) -> &[u8];
    /// The payload as an owned buffer (a slice is copied).
    fn into_shared(self) -> Bytes;
}

impl PutPayload for &[u8] {
    fn bytes(&self) -> &[u8] {
        self
    }
    fn into_shared(self) -> Bytes {
        Bytes::copy_from_slice(self)
    }
}

impl PutPayload for Bytes {
    fn bytes(&self) -> &[u8] {
        self
    }
    fn into_shared(self) -> Bytes {
        self
    }
}

impl PutPayload for Box<[u8]> {
    fn bytes(&self) -> &[u8] {
        self
    }
    fn into_shared(self) -> Bytes {
        self.into()
    }
}

impl<const N: usize> PutPayload for &[u8; N] {
    fn bytes(&self) -> &[u8] {
        &self[..]
    }
    fn into_shared(self) -> Bytes {
        Bytes::copy_from_slice(self)
    }
}

impl<const N: usize> PutPayload for Box<[u8; N]> {
    fn bytes(&self) -> &[u8] {
        &self[..]
    }
    fn into_shared(self) -> Bytes {
        let unsized_box: Box<[u8]> = self;
        unsized_box.into()
    }
}

impl PutPayload for Vec<u8> {
    fn bytes(&self) -> &[u8] {
        self
    }
    fn into_shared(self) -> Bytes {
        self.into()
    }
}

/// How many times a task was released, buried, kicked and returned at its TTR, each saturating
/// at `u16::MAX` (beanstalkd's `stats-job` counters; its `reserves` is `deliveries`). Kept
/// only for the tasks that have a non-zero one: most never do.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct JobCounts {
    /// Released by the holder (`release`, `release_in`); a disconnect or `release_all` is not
    /// a release, as in beanstalkd.
    pub releases: u16,
    /// Buried: `bury`, `bury_taken`, or a return past `max_deliveries`.
    pub buries: u16,
    /// Kicked out of Buried or Waiting (`kick`, `kick_delayed`, `kick_task`).
    pub kicks: u16,
    /// Returned because its TTR ran out.
    pub timeouts: u16,
}

impl JobCounts {
    pub fn is_zero(&self) -> bool {
        *self == JobCounts::default()
    }
}

/// Borrowed view of a live task.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct TaskRef<'a> {
    pub id: TaskId,
    pub status: Status,
    /// When Waiting becomes Ready; 0 unless Waiting.
    pub runat: Micros,
    pub pri: i64,
    pub ttl: Option<Micros>,
    pub ttr: Option<Micros>,
    /// Put time; TTL counts from here (also after a restart).
    pub created: Micros,
    /// Some while Taken.
    pub owner: Option<SessionId>,
    /// The raw MessagePack bytes received, never re-encoded.
    #[cfg_attr(feature = "serde", serde(borrow, with = "serde_bytes"))]
    pub data: &'a [u8],
    pub tube: TubeIx,
    /// Times taken (saturates at `u16::MAX`).
    pub deliveries: u16,
    /// The utube key, in a utube / utubettl tube.
    #[cfg_attr(feature = "serde", serde(borrow, with = "serde_bytes"))]
    pub utube: Option<&'a [u8]>,
    /// Releases, buries, kicks and TTR returns so far.
    pub counts: JobCounts,
}

impl TaskRef<'_> {
    /// An owned copy (copies the payload).
    pub fn to_task(&self) -> Task {
        Task {
            id: self.id,
            status: self.status,
            runat: self.runat,
            pri: self.pri,
            ttl: self.ttl,
            ttr: self.ttr,
            created: self.created,
            owner: self.owner,
            data: self.data.into(),
            tube: self.tube,
            deliveries: self.deliveries,
        }
    }
}

/// Owned task, as returned by `ack` and `restore_remove` (the task is gone from the queue).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Task {
    pub id: TaskId,
    pub status: Status,
    pub runat: Micros,
    pub pri: i64,
    pub ttl: Option<Micros>,
    pub ttr: Option<Micros>,
    pub created: Micros,
    pub owner: Option<SessionId>,
    pub data: Payload,
    pub tube: TubeIx,
    pub deliveries: u16,
}

impl Task {
    pub fn as_ref(&self) -> TaskRef<'_> {
        TaskRef {
            id: self.id,
            status: self.status,
            runat: self.runat,
            pri: self.pri,
            ttl: self.ttl,
            ttr: self.ttr,
            created: self.created,
            owner: self.owner,
            data: &self.data,
            tube: self.tube,
            deliveries: self.deliveries,
            // Not kept: an owned task is one that left the queue, and copying the key on
            // every ack would allocate.
            utube: None,
            counts: JobCounts::default(),
        }
    }
}

/// Domain errors: what the engine refused, naming the values it refused. The texts are the
/// engine's own, for logs and recovery reports; what a client reads (Tarantool's and the
/// original queue's wording, beanstalk's answers) is its front-end's, chosen by variant.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub enum QueueError {
    /// No live task has this id (a call that names a task in any tube).
    #[error("no task {0}")]
    NotFound(TaskId),
    /// No live task of `tube` has this id (peek, bury, delete: one in another tube does not
    /// count).
    #[error("no task {id} in tube {tube}")]
    NotInTube { id: TaskId, tube: TubeIx },
    /// A call on a task its caller must hold (ack, release, touch, `bury_taken`,
    /// `touch_ttr`) named one that `caller` does not hold; `hold` says why.
    #[error("session {caller} does not hold task {id}: {hold}")]
    NotHeld {
        id: TaskId,
        caller: SessionId,
        hold: Hold,
    },
    /// Recovery only: an order given to `Restoring::finish_in` that names a number of tasks
    /// other than the `held` ones.
    #[error("restore order refused: it names {named} tasks, {held} are held")]
    RestoreOrderLength { named: usize, held: usize },
    /// Recovery only: an order given to `Restoring::finish_in` that names `ordinal` twice, or
    /// names no held task by it (a Taken one, one past the last restored).
    #[error("restore order refused: ordinal {ordinal} is no held task, or named twice")]
    RestoreOrderOrdinal { ordinal: u32 },
    /// Recovery, and a move's `import_task`: an id that is already live.
    #[error("task {0} is live already")]
    Duplicate(TaskId),
    #[error("unknown tube type {0:?}")]
    UnknownTubeType(String),
    #[error("a tube named {0:?} exists already")]
    TubeExists(String),
    /// A tube index that names no tube (dropped, or never created).
    #[error("no tube at index {0}")]
    TubeNotFound(TubeIx),
    /// drop of a tube that holds Taken tasks.
    #[error("tube {0} holds taken tasks")]
    TubeHasTaken(TubeIx),
    #[error("the tube default cannot be dropped")]
    DefaultTubeUndroppable,
    /// limfifottl: a put into a tube holding `capacity` tasks (the server may wait for room).
    #[error("tube {name:?} holds {capacity} tasks, its capacity")]
    TubeFull { name: String, capacity: u64 },
    #[error("a tube name of {len} bytes: 1 to {max} are allowed")]
    BadTubeName { len: usize, max: usize },
    /// A put into a queue that holds `max` live tasks, its limit ([`Queue::set_max_tasks`]);
    /// also a restore past [`MAX_TASKS`].
    #[error("the queue holds {max} tasks, its limit")]
    TooManyTasks { max: usize },
    #[error("{max} tubes exist, the limit")]
    TooManyTubes { max: usize },
    #[error("a utube key of {len} bytes: at most {max} are allowed")]
    UtubeKeyTooLong { len: usize, max: usize },
    #[error("a dedup key of {len} bytes: at most {max} are allowed")]
    DedupKeyTooLong { len: usize, max: usize },
    /// fifo and utube tasks have no TTL or TTR to extend.
    #[error("a {0} tube has no touch")]
    TouchUnsupported(TubeType),
    /// `kick_task` of a task that is neither Buried nor Waiting (delayed).
    #[error("task {id} is {status:?}: only a buried or delayed task can be kicked")]
    NotKickable { id: TaskId, status: Status },
    /// beanstalk's reserve-job of a task that is taken already, or of a utube task that is
    /// not its utube's head.
    #[error("task {id} is {status:?}: it cannot be taken now")]
    NotTakeable { id: TaskId, status: Status },
    /// A put into a tube that has given out all its numbers (`MAX_TASK_NUMBER`).
    #[error("tube {name:?} has given out all its task numbers")]
    TubeNumbersSpent { name: String },
    /// Recovery and a move's imports: a task id that packs another tube's index than the tube
    /// it is restored in, or a number the tube did not give (below its `TubeNumbers::first`).
    #[error("task {id} is not an id of tube {tube}")]
    IdNotOfTube { id: TaskId, tube: TubeIx },
    /// Recovery and a move's `import_numbers`: a tube's numbering that cannot be: `first`
    /// other than the tube's own, or above 0 in `default` or beside a `legacy_below` mark.
    #[error("tube {tube} cannot number its tasks from {first}")]
    TubeNumbering { tube: TubeIx, first: u64 },
}

/// Why a session does not hold a task it named ([`QueueError::NotHeld`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub enum Hold {
    /// No live task has the id (in the tube the call names, if it names one).
    NoTask,
    /// The task is not Taken: it is in this status.
    Untaken(Status),
    /// Another session holds it.
    TakenBy(SessionId),
}

impl std::fmt::Display for Hold {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Hold::NoTask => f.write_str("there is no such task"),
            Hold::Untaken(status) => write!(f, "it is {status:?}, not taken"),
            Hold::TakenBy(owner) => write!(f, "session {owner} holds it"),
        }
    }
}

/// Every state change, in order, for the WAL and the stats; kept only while the journal is on.
/// The `restore*` calls are replay, not change, and journal nothing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Event {
    /// Read the task with `get(id)` to log it.
    Put {
        id: TaskId,
    },
    Taken {
        id: TaskId,
        sid: SessionId,
    },
    Acked {
        id: TaskId,
    },
    /// `runat` 0 = Ready, else Waiting.
    Released {
        id: TaskId,
        runat: Micros,
    },
    /// Waiting -> Ready at runat.
    Promoted {
        id: TaskId,
    },
    /// TTL passed: deleted.
    Expired {
        id: TaskId,
    },
    /// Taken -> Ready after ttr.
    TtrReturned {
        id: TaskId,
    },
    /// `release_session` / `release_all_taken` / `release_all`.
    AutoReleased {
        id: TaskId,
    },
    /// `bury`: the task is Buried.
    Buried {
        id: TaskId,
    },
    /// Taken `max_deliveries` times and returned (release, TTR, auto-release): Buried instead.
    DeadLettered {
        id: TaskId,
    },
    /// `kick`, `kick_task`: Buried -> Ready; `kick_delayed`, `kick_task`: Waiting -> Ready
    /// before its runat.
    Kicked {
        id: TaskId,
    },
    /// `delete`: gone, whatever its status.
    Deleted {
        id: TaskId,
    },
    /// Its pri / ttl / ttr changed (`touch`, `release` with options, `bury_taken` with a new
    /// pri): read it with `get(id)`.
    Updated {
        id: TaskId,
    },
    /// Read the tube with `tube_info(tube)` to log it.
    TubeCreated {
        tube: TubeIx,
    },
    /// The tube and every task in it are gone (no per-task events).
    TubeDropped {
        tube: TubeIx,
    },
    /// Every task of the tube is gone (no per-task events); the tube stays.
    TubeTruncated {
        tube: TubeIx,
    },
    /// A put recorded a dedup key: read it with `dedup_entry(tube, seq)` (absent if it
    /// expired within the same turn). Also `import_dedup`'s key, moved in from another node.
    DedupRecorded {
        tube: TubeIx,
        seq: u64,
    },
    /// `import_task`: a task moved in from another node, in whatever status it had there (a
    /// Taken one held by the session the import named). Read it with `get(id)` to log it
    /// whole, as a put is: its status, delivery count, utube key and counters are part of it.
    Imported {
        id: TaskId,
    },
    /// A user was added, changed or dropped: read `users()` to log the whole table.
    UsersChanged,
}

impl Event {
    /// The task the event is about, or `None` for a tube's own (created, dropped, truncated,
    /// a dedup key recorded).
    #[inline]
    pub fn task(&self) -> Option<TaskId> {
        match *self {
            Event::Put { id }
            | Event::Taken { id, .. }
            | Event::Acked { id }
            | Event::Released { id, .. }
            | Event::Promoted { id }
            | Event::Expired { id }
            | Event::TtrReturned { id }
            | Event::AutoReleased { id }
            | Event::Buried { id }
            | Event::DeadLettered { id }
            | Event::Kicked { id }
            | Event::Deleted { id }
            | Event::Updated { id }
            | Event::Imported { id } => Some(id),
            Event::TubeCreated { .. }
            | Event::TubeDropped { .. }
            | Event::TubeTruncated { .. }
            | Event::DedupRecorded { .. }
            | Event::UsersChanged => None,
        }
    }
}

/// What one `advance` did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Advance {
    /// Deadlines handled (each one an event: promoted, expired or returned).
    pub processed: usize,
    /// The earliest pending deadline; `<= now` when the budget ran out with work left.
    pub next_deadline: Option<Micros>,
}

/// One tube's counts now and operations since it was created (or since start for `default`);
/// kept as counters, O(1) to read. tarantool/queue's `statistics` reads: tasks `ready`,
/// `taken`, `delayed` (= `waiting`), `buried`, `done` (= `acks + deletes`), `total`; calls
/// `put`, `take`, `ack`, `release` (= `releases + auto_released`), `bury` (= `buries`), `kick`
/// (tasks kicked), `delete`, `touch`, `ttl` (= `expired`), `ttr` (= `ttr_returned`), `delay`
/// (= `promoted`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct Stats {
    pub total: u64,
    pub ready: u64,
    pub taken: u64,
    pub waiting: u64,
    pub buried: u64,
    pub puts: u64,
    pub takes: u64,
    pub acks: u64,
    pub releases: u64,
    pub promoted: u64,
    pub expired: u64,
    pub ttr_returned: u64,
    pub auto_released: u64,
    /// `bury` calls that buried a task.
    pub buries: u64,
    /// Tasks kicked.
    pub kicks: u64,
    pub deletes: u64,
    pub touches: u64,
    /// Tasks buried by `max_deliveries` instead of returning to ready.
    pub dead_lettered: u64,
    /// Puts answered with an earlier task of the same dedup key.
    pub deduplicated: u64,
    /// When the ready task a take gets next was put (the queue's clock, µs), 0 while none is
    /// ready: how long the tube's head has waited is `now - ready_since`. Over several tubes
    /// or partitions, the earliest. `Queue::tube_stats` leaves it 0 (`Queue::ready_since`).
    pub ready_since: Micros,
    /// Takes waiting for a task of the tube now. The server's figure (its parked takes): the
    /// engine leaves it 0.
    pub takers_waiting: u64,
    /// Sessions holding a task of the tube now (`Queue::holders`; `tube_stats` leaves it 0:
    /// counting them walks the taken tasks).
    pub takers_holding: u64,
}

/// How many operation counters a [`Stats`] has ([`Stats::OP_NAMES`]).
pub const OP_COUNTERS: usize = 14;

impl Stats {
    /// The operation counters' names, in the order [`op_counts`](Stats::op_counts) gives
    /// them: the WAL logs them in this order, a move's commit carries them by these names.
    /// New counters go at the end, so an older log's shorter list still reads.
    pub const OP_NAMES: [&'static str; OP_COUNTERS] = [
        "puts",
        "takes",
        "acks",
        "releases",
        "promoted",
        "expired",
        "ttr_returned",
        "auto_released",
        "buries",
        "kicks",
        "deletes",
        "touches",
        "dead_lettered",
        "deduplicated",
    ];

    /// The operation counters (what was done, not what is held now), in `OP_NAMES` order.
    pub fn op_counts(&self) -> [u64; OP_COUNTERS] {
        [
            self.puts,
            self.takes,
            self.acks,
            self.releases,
            self.promoted,
            self.expired,
            self.ttr_returned,
            self.auto_released,
            self.buries,
            self.kicks,
            self.deletes,
            self.touches,
            self.dead_lettered,
            self.deduplicated,
        ]
    }

    /// Figures with operation counters `counts` (in `OP_NAMES` order; missing ones 0, extra
    /// ones ignored) and nothing else.
    pub fn from_op_counts(counts: &[u64]) -> Stats {
        let mut s = Stats::default();
        let fields = [
            &mut s.puts,
            &mut s.takes,
            &mut s.acks,
            &mut s.releases,
            &mut s.promoted,
            &mut s.expired,
            &mut s.ttr_returned,
            &mut s.auto_released,
            &mut s.buries,
            &mut s.kicks,
            &mut s.deletes,
            &mut s.touches,
            &mut s.dead_lettered,
            &mut s.deduplicated,
        ];
        for (f, &n) in fields.into_iter().zip(counts) {
            *f = n;
        }
        s
    }
}

/// Figures of several tubes (or partitions) together: every counter summed.
impl std::ops::AddAssign<&Stats> for Stats {
    fn add_assign(&mut self, other: &Stats) {
        self.total += other.total;
        self.ready += other.ready;
        self.taken += other.taken;
        self.waiting += other.waiting;
        self.buried += other.buried;
        self.puts += other.puts;
        self.takes += other.takes;
        self.acks += other.acks;
        self.releases += other.releases;
        self.promoted += other.promoted;
        self.expired += other.expired;
        self.ttr_returned += other.ttr_returned;
        self.auto_released += other.auto_released;
        self.buries += other.buries;
        self.kicks += other.kicks;
        self.deletes += other.deletes;
        self.touches += other.touches;
        self.dead_lettered += other.dead_lettered;
        self.deduplicated += other.deduplicated;
        self.ready_since = match (self.ready_since, other.ready_since) {
            (0, t) | (t, 0) => t,
            (a, b) => a.min(b),
        };
        self.takers_waiting += other.takers_waiting;
        self.takers_holding += other.takers_holding;
    }
}

/// A full task for recovery (snapshot load / WAL replay); `restore_in` adds its tube, utube
/// key and delivery count. Any status, Buried included. The payload is any [`PutPayload`]: a
/// snapshot load lends it from the block it read (`&[u8]`), so a task costs no allocation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RestoredTask<D = Box<[u8]>> {
    pub id: TaskId,
    pub status: Status,
    pub runat: Micros,
    pub pri: i64,
    pub ttl: Option<Micros>,
    pub ttr: Option<Micros>,
    pub created: Micros,
    pub data: D,
}

impl<D> RestoredTask<D> {
    /// The same task with its payload turned into another form (a span into a block read,
    /// into the bytes it spans).
    pub fn map_data<E>(self, f: impl FnOnce(D) -> E) -> RestoredTask<E> {
        RestoredTask {
            id: self.id,
            status: self.status,
            runat: self.runat,
            pri: self.pri,
            ttl: self.ttl,
            ttr: self.ttr,
            created: self.created,
            data: f(self.data),
        }
    }
}
