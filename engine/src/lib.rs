//! The tarq queue engine: tasks in a slab arena, per-status ordered lists, a deadline heap,
//! per-session taken lists and O(1) stats. It does no I/O, reads no clock and starts no
//! threads: `now` is always an argument, so a property test can drive it step by step and a
//! bench can measure it without noise. Parked takes, the wire protocol and durability live in
//! `tarq-net`; this crate only reports what changed through an optional journal of [`Event`]s.

mod heap;
mod lists;
mod queue;
mod sessions;

pub use queue::Queue;

/// A task's id: a counter from 1, never reused (also across restarts, see `set_last_id`).
pub type TaskId = u64;
/// The session (connection) that owns a taken task.
pub type SessionId = u64;
/// Microseconds since the Unix epoch. The engine never reads a clock: callers pass `now`.
pub type Micros = u64;

/// Where a task is in its life.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Status {
    Ready,
    Taken,
    Waiting,
}

impl Status {
    /// The one-letter status the seed queue shows clients.
    pub fn as_str(self) -> &'static str {
        match self {
            Status::Ready => "R",
            Status::Taken => "T",
            Status::Waiting => "W",
        }
    }
}

/// Options of `put`. The default is the seed's plain put: ready now, no TTL, no TTR, pri 0.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
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

/// Borrowed view of a live task.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
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
    pub data: &'a [u8],
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
    pub data: Box<[u8]>,
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
        }
    }
}

/// Domain errors, worded as the seed queue words them since clients match on the text.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum QueueError {
    #[error("Task {{{0}}} was not found")]
    NotFound(TaskId),
    #[error("Task {0} not taken by anybody")]
    NotTaken(TaskId),
    #[error("Task {id} taken by {owner}. Not you ({caller})")]
    NotOwner {
        id: TaskId,
        owner: SessionId,
        caller: SessionId,
    },
    /// Recovery only: `restore` of an id that is already live.
    #[error("Task {0} already exists")]
    Duplicate(TaskId),
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
    /// `release_session` / `release_all_taken`.
    AutoReleased {
        id: TaskId,
    },
}

/// What one `advance` did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Advance {
    /// Deadlines handled (each one an event: promoted, expired or returned).
    pub processed: usize,
    /// The earliest pending deadline; `<= now` when the budget ran out with work left.
    pub next_deadline: Option<Micros>,
}

/// Counts now and operations since start; kept as counters, O(1) to read.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    pub total: u64,
    pub ready: u64,
    pub taken: u64,
    pub waiting: u64,
    pub puts: u64,
    pub takes: u64,
    pub acks: u64,
    pub releases: u64,
    pub promoted: u64,
    pub expired: u64,
    pub ttr_returned: u64,
    pub auto_released: u64,
}

/// A full task for recovery (snapshot load / WAL replay).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RestoredTask {
    pub id: TaskId,
    pub status: Status,
    pub runat: Micros,
    pub pri: i64,
    pub ttl: Option<Micros>,
    pub ttr: Option<Micros>,
    pub created: Micros,
    pub data: Box<[u8]>,
}
