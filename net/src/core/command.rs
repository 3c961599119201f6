//! What a front-end asks of the core and what it gets back, in no wire format: a [`Command`]
//! (payloads and keys borrow the request frame), an [`Outcome`] (tasks borrow the queue) or a
//! [`Refusal`] (why the change was not made). Front-ends word and code these for their
//! clients; the core never sees a wire text.

use serde::{Deserialize, Serialize};
use tarq_engine::{
    JobCounts, Micros, PutOptions, QueueError, ReleaseOptions, Stats, Status, Task, TaskId,
    TaskRef, TubeInfo, TubeIx, TubeOptions, TubePut, TubeType, DEFAULT_TUBE,
};
use tarq_ops::stats::Snapshot;

use super::parked::MAX_PARKED_PER_CONN;
use super::pauses::Pause;

/// Which API a command speaks, when the two differ in wording: the seed calls (`queue.put`,
/// ... on the tube `default`, with the seed's error texts) or the tube API on any tube.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum On {
    Seed,
    Tube(TubeIx),
}

impl On {
    pub fn tube(self) -> TubeIx {
        match self {
            On::Seed => DEFAULT_TUBE,
            On::Tube(t) => t,
        }
    }
}

/// A front-end-neutral request. Payloads and keys borrow the request frame. It is the loop's
/// own and is never encoded: a sharded cluster's links carry the link protocol's `Call`
/// (`frontend::link::call`), which the commands that may run on another node convert to and
/// from.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Command<'a> {
    /// The seed's put into `default`.
    Put {
        data: &'a [u8],
        opts: PutOptions,
    },
    /// A put into a tube; `wait` is how long a put into a full tube waits for room (0: none).
    PutIn {
        tube: TubeIx,
        data: &'a [u8],
        opts: TubePut<'a>,
        wait: Micros,
    },
    /// `timeout` 0 answers at once; `None` waits without end.
    Take {
        on: On,
        timeout: Option<Micros>,
    },
    Ack {
        on: On,
        id: TaskId,
    },
    Release {
        on: On,
        id: TaskId,
        opts: ReleaseOptions,
    },
    /// `delta` `None`: no TTL or TTR from now on.
    Touch {
        tube: TubeIx,
        id: TaskId,
        delta: Option<Micros>,
    },
    Peek {
        tube: TubeIx,
        id: TaskId,
    },
    Bury {
        tube: TubeIx,
        id: TaskId,
    },
    Kick {
        tube: TubeIx,
        count: u64,
    },
    Delete {
        tube: TubeIx,
        id: TaskId,
    },
    ReleaseAll {
        tube: TubeIx,
    },
    Truncate {
        tube: TubeIx,
    },
    DropTube {
        tube: TubeIx,
    },
    CreateTube {
        name: &'a str,
        kind: TubeType,
        opts: TubeOptions,
        if_not_exists: bool,
        /// How many partitions (a sharded cluster's; 1 elsewhere).
        partitions: u16,
    },
    /// A take from whichever of `tubes` has the lowest (pri, id) task ready (beanstalk's
    /// reserve over its watched tubes). Parked on all of them while none has one; the parked
    /// entries wake at `wake` (at most the timeout's deadline) for the front-end to decide.
    TakeAny {
        tubes: &'a [TubeIx],
        timeout: Option<Micros>,
        wake: Micros,
    },
    /// Take this task (beanstalk's reserve-job): Ready, Waiting or Buried, in any tube.
    TakeTask {
        id: TaskId,
    },
    /// Bury a task this session holds, with a new pri (beanstalk's bury).
    BuryTaken {
        id: TaskId,
        pri: i64,
    },
    /// Restart the TTR of a task this session holds (beanstalk's touch).
    TouchTtr {
        id: TaskId,
    },
    /// Delete a task unless another session holds it (beanstalk's delete: a job reserved by
    /// another connection is not found).
    DeleteJob {
        id: TaskId,
    },
    /// The first task of `tube` in `status` as a take, a wake-up or a kick would meet it
    /// (beanstalk's peek-ready, peek-delayed, peek-buried); `Nothing` when it has none.
    PeekFirst {
        tube: TubeIx,
        status: Status,
    },
    /// One task's figures (beanstalk's stats-job).
    TaskFigures {
        id: TaskId,
    },
    /// One tube's counters and its urgent ready tasks (beanstalk's stats-tube).
    TubeFigures {
        tube: TubeIx,
    },
    /// Kick up to `count` buried tasks of `tube`, or if it has none, delayed ones (beanstalk's
    /// kick).
    KickAny {
        tube: TubeIx,
        count: u64,
    },
    /// Make one buried or delayed task ready (beanstalk's kick-job).
    KickTask {
        id: TaskId,
    },
    /// One tube's counters.
    TubeStats {
        tube: TubeIx,
    },
    /// Every tube's counters by name, `default` aside (`queue.statistics()`).
    AllTubeStats,
    /// Pause `tube`'s takes (beanstalk's pause-tube): no take of any protocol gets its tasks
    /// until the pause ends.
    Pause {
        tube: TubeIx,
        pause: Pause,
    },
    Snapshot,
    /// Answer `Ok` once `tube` has a task a take would get (at once if it has one now);
    /// nothing is taken. A sharded cluster's nodes watch the partitions their waiting takes
    /// could be served from, instead of polling them.
    Watch {
        tube: TubeIx,
    },
    /// Move partition `partition` of tube `tube` to replica set `to` with its tasks (a sharded
    /// cluster's; run by the primary of the set that owns it, answered with a report once the
    /// move committed or was given up).
    Move {
        tube: &'a str,
        partition: u16,
        to: &'a str,
    },
    /// Whether `tube` may be dropped now: `Count` of the next number it would give (a
    /// sharded cluster records it, so a tube placed later at its index never gives an id
    /// twice), or why not (a task taken, a take waiting). Changes nothing.
    DropCheck {
        tube: TubeIx,
    },
    /// Add or replace a user (its password hash, admin right and grants, whole), journaled.
    /// The front-end has checked who asks and worded the change in its protocol's terms.
    /// Users are this node's and its replicas' (a sharded cluster's other sets keep theirs).
    PutUser {
        user: &'a tarq_engine::User,
    },
    /// Remove a user, journaled.
    DropUser {
        name: &'a str,
    },
    /// Up to `limit` tasks of `tube` in `status`, in the order the tube keeps them, after task
    /// `after` (from the first when `None`, or when `after` is no longer of that status):
    /// what the console lists. On a sharded cluster the router lists the whole tube, asking
    /// each partition's owner with this command (`Outcome::Tasks`) and answering with the
    /// page (`Outcome::TaskPage`).
    ListTasks {
        tube: TubeIx,
        status: Status,
        after: Option<TaskId>,
        limit: u32,
    },
}

impl Command<'_> {
    /// How long the command may wait where it runs before it is answered, by its own terms
    /// (`None`: without end — a watch, a take without a timeout).
    pub(crate) fn waits_at_most(&self) -> Option<Micros> {
        match *self {
            Command::Take { timeout, .. } | Command::TakeAny { timeout, .. } => timeout,
            Command::PutIn { wait, .. } => Some(wait),
            Command::Watch { .. } => None,
            _ => Some(0),
        }
    }

    /// Whether the command changes the queue (refused while the journal cannot take changes).
    pub(crate) fn changes(&self) -> bool {
        !matches!(
            self,
            Command::Peek { .. }
                | Command::PeekFirst { .. }
                | Command::ListTasks { .. }
                | Command::TaskFigures { .. }
                | Command::TubeFigures { .. }
                | Command::TubeStats { .. }
                | Command::AllTubeStats
                | Command::Pause { .. }
                | Command::Snapshot
                | Command::Take { .. }
                | Command::TakeAny { .. }
                | Command::TouchTtr { .. }
                | Command::Watch { .. }
                | Command::DropCheck { .. }
                | Command::Move { .. }
        )
    }

    /// Whether the command only reads (all a replica serves). A snapshot is the replica's
    /// own, and a pause is this node's: neither changes a task.
    pub(crate) fn reads_only(&self) -> bool {
        matches!(
            self,
            Command::Peek { .. }
                | Command::PeekFirst { .. }
                | Command::ListTasks { .. }
                | Command::TaskFigures { .. }
                | Command::TubeFigures { .. }
                | Command::TubeStats { .. }
                | Command::AllTubeStats
                | Command::Pause { .. }
                | Command::Snapshot
        )
    }
}

/// What a command did, for the front-end to encode. Borrowed tasks live in the engine.
#[derive(Debug)]
pub enum Outcome<'q> {
    /// A task as it is now (put, take, release, peek, bury, touch).
    Task(TaskRef<'q>),
    /// A task that left the queue (ack, delete), as it was.
    Done(Task),
    /// A dedup put whose earlier task is already gone: its id, and its number as the tube API
    /// shows it (`Queue::task_number`).
    DoneId {
        id: TaskId,
        number: u64,
    },
    /// No task: a take that timed out, a touch with nothing to add.
    Nothing,
    /// A watched tube has a task a take would get (`Command::Watch`).
    Ready(TubeIx),
    /// A put into a full tube that waited (or could not wait) and found no room.
    Full,
    /// How many (kick).
    Count(u64),
    /// Done, nothing to show (truncate, release_all).
    Ok,
    /// drop.
    Dropped,
    /// A tube created or found (`if_not_exists`).
    Tube(TubeInfo<'q>),
    TubeStats(Stats),
    /// A tube's counters and how many of its ready tasks are urgent (`Command::TubeFigures`).
    TubeFigures {
        stats: Stats,
        urgent: u64,
    },
    /// One task's figures (`Command::TaskFigures`).
    TaskFigures(Box<TaskFigures>),
    /// Every tube's counters by name (`queue.statistics()`).
    AllStats(Vec<(String, Stats)>),
    /// One partition's tasks of a listing (`Command::ListTasks`), owned: they travel between
    /// nodes and wait for the other partitions' answers.
    Tasks(Vec<Listed>),
    /// A whole tube's listing across its partitions (`Command::ListTasks` on a sharded node).
    TaskPage(Box<TaskPage>),
    /// A set's primary's moves: the one it runs now and those it ran (a sharded cluster's
    /// console asks every primary for them).
    Moves(Box<MoveReport>),
    ServerStats(Box<Snapshot>),
    /// The snapshot call's report.
    Text(String),
    Error(Refusal),
}

/// One task's figures as the node that holds it read them (times in microseconds, on its
/// clock): what beanstalk's stats-job shows, owned so it can travel between nodes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TaskFigures {
    pub id: TaskId,
    /// Its tube's name.
    pub tube: String,
    pub status: Status,
    pub pri: i64,
    /// Since it was put.
    pub age: Micros,
    /// Waiting: until it is ready.
    pub delay_left: Micros,
    pub ttr: Option<Micros>,
    /// Taken: until its TTR runs out.
    pub ttr_left: Micros,
    pub deliveries: u16,
    pub counts: JobCounts,
}

/// How much of a task's payload a listing carries: a listing shows a preview, and a page of
/// [`MAX_PAGE`](crate::frontend::http::MAX_PAGE) tasks from each of a tube's partitions stays
/// about a megabyte a partition on the links however large the payloads are.
pub const LIST_PREVIEW_BYTES: usize = 1024;

/// A task as a listing shows it: its fields, and its payload whole or, when longer than
/// [`LIST_PREVIEW_BYTES`], cut to them (`cut`) — still one MessagePack value: a string or
/// bytes keep their first bytes (a string at a character's boundary), any other value is left
/// out. `size` is the payload's size as the console shows it (a string's or bytes' length,
/// else the MessagePack's).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Listed {
    pub id: TaskId,
    pub status: Status,
    pub runat: Micros,
    pub pri: i64,
    pub ttl: Option<Micros>,
    pub ttr: Option<Micros>,
    pub created: Micros,
    pub deliveries: u16,
    #[serde(with = "serde_bytes")]
    pub utube: Option<Vec<u8>>,
    #[serde(with = "serde_bytes")]
    pub data: Vec<u8>,
    pub size: u64,
    pub cut: bool,
}

impl Listed {
    /// Task `t` as a listing carries it.
    pub fn of(t: &TaskRef<'_>) -> Listed {
        let (data, size, cut) = preview(t.data, LIST_PREVIEW_BYTES);
        Listed {
            id: t.id,
            status: t.status,
            runat: t.runat,
            pri: t.pri,
            ttl: t.ttl,
            ttr: t.ttr,
            created: t.created,
            deliveries: t.deliveries,
            utube: t.utube.map(<[u8]>::to_vec),
            data,
            size,
            cut,
        }
    }

    /// The task as the front-ends show one (its tube and holder are the listing's business).
    pub fn task_ref(&self, tube: TubeIx) -> TaskRef<'_> {
        TaskRef {
            id: self.id,
            status: self.status,
            runat: self.runat,
            pri: self.pri,
            ttl: self.ttl,
            ttr: self.ttr,
            created: self.created,
            owner: None,
            data: &self.data,
            tube,
            deliveries: self.deliveries,
            utube: self.utube.as_deref(),
            counts: JobCounts::default(),
        }
    }
}

/// `data` (one MessagePack value) cut to `limit` bytes of its string or bytes: the preview,
/// the size shown, and whether it was cut.
fn preview(data: &[u8], limit: usize) -> (Vec<u8>, u64, bool) {
    use tarq_iproto::mp::write;
    let mut r = tarq_iproto::mp::Reader::new(data);
    match r.read_str_or_bin() {
        Ok(body) if r.is_empty() => {
            if body.len() <= limit {
                return (data.to_vec(), body.len() as u64, false);
            }
            let mut out = Vec::with_capacity(limit + 5);
            let is_str = (0xa0..=0xbf).contains(&data[0]) || (0xd9..=0xdb).contains(&data[0]);
            match std::str::from_utf8(body).ok().filter(|_| is_str) {
                Some(text) => {
                    let mut end = limit;
                    while !text.is_char_boundary(end) {
                        end -= 1;
                    }
                    write::str(&mut out, &text[..end]);
                }
                None => write::bin(&mut out, &body[..limit]),
            }
            (out, body.len() as u64, true)
        }
        _ if data.len() > limit => (Vec::new(), data.len() as u64, true),
        _ => (data.to_vec(), data.len() as u64, false),
    }
}

/// A tube's tasks of one status across its partitions, as a sharded node answers a listing:
/// the partitions in order, each one's tasks in the order it keeps them, cut at the page's
/// limit; the cursor for the next page; and the partitions whose owners did not answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TaskPage {
    /// The tube's name and the status listed.
    pub tube: String,
    pub status: Status,
    /// (partition number, its engine index, the task).
    pub tasks: Vec<(u16, TubeIx, Listed)>,
    /// The id of the last task shown when there are more: the next page's `after`.
    pub next_after: Option<TaskId>,
    /// Partitions not listed: (partition number, owning set, why).
    pub unanswered: Vec<(u16, String, String)>,
}

/// The moves a replica set's primary runs as a partition's owner: the one in progress, and
/// its counts of those done since it started. What every node's cluster page shows of every
/// set, so one look shows each move in flight.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct MoveReport {
    pub in_progress: Option<MoveProgress>,
    pub committed: u64,
    pub given_up: u64,
    pub tasks_moved: u64,
    /// The last committed move's length.
    pub last_ms: Option<u64>,
}

/// A move in progress, as its old owner's primary runs it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MoveProgress {
    pub tube: String,
    pub partition: u16,
    pub index: TubeIx,
    /// The set it goes to.
    pub to: String,
    /// Its step: `prepare`, `bulk`, `catch-up`, `final`, `commit`, `unknown` (etcd's answer
    /// to the commit was lost), `ended`.
    pub phase: String,
    /// Tasks sent so far, and left in the partition here (sent or not).
    pub tasks_sent: u64,
    pub tasks_here: u64,
    pub elapsed_ms: u64,
    /// Whether its partition is frozen (changes to it wait for the end).
    pub frozen: bool,
}

/// Why a command was refused, for the front-end to word and code (its Display is the core's
/// own words, for logs: what clients read is the front-end's).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error, Serialize, Deserialize)]
pub enum Refusal {
    #[error(transparent)]
    Queue(#[from] QueueError),
    /// The journal cannot make changes durable now (a full or failing disk): why.
    #[error("{0}")]
    Journal(String),
    /// The connection has [`MAX_PARKED_PER_CONN`] takes waiting already.
    #[error("the connection has {MAX_PARKED_PER_CONN} takes waiting already")]
    TooManyParked,
    /// drop of a tube a take waits on.
    #[error("a take waits on the tube")]
    Consumers,
    /// `queue.snapshot()` without a WAL.
    #[error("no snapshots without a WAL")]
    NoSnapshots,
    /// A change sent to a replica: the address of its primary, where a client can go.
    #[error("this node is a replica of {0}")]
    ReadOnly(String),
    /// A change sent to a cluster node while no primary is known to it (an election, etcd
    /// unreachable, a leadership that ran out): why.
    #[error("no primary now: {0}")]
    NoPrimary(String),
    /// A sharded cluster could not place or reach a tube's partition: why.
    #[error("{0}")]
    Shards(String),
    /// A user that cannot be stored: why.
    #[error("{0}")]
    User(String),
    /// A change may or may not have been made: it was sent to its partition's owner, whose
    /// answer never came (the link failed) or said so itself. Unlike `ReadOnly`/`NoPrimary`,
    /// where nothing was done, a client must not retry it blindly.
    #[error("outcome unknown: {0}")]
    Unknown(String),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_listing_carries_a_preview_that_is_still_one_messagepack_value() {
        // Short: whole.
        assert_eq!(
            preview(&[0xa2, b'h', b'i'], 4),
            (vec![0xa2, b'h', b'i'], 2, false)
        );
        // A string cut at a character's boundary (é is two bytes), its length kept.
        let (cut, size, was) = preview(&[0xa6, b'a', b'b', b'c', 0xc3, 0xa9, b'z'], 4);
        assert_eq!((cut, size, was), (vec![0xa3, b'a', b'b', b'c'], 6, true));
        // Bytes cut as bytes.
        let (cut, size, was) = preview(&[0xc4, 3, 1, 2, 3], 2);
        assert_eq!((cut, size, was), (vec![0xc4, 2, 1, 2], 3, true));
        // Any other value longer than the preview: left out, its size kept.
        let (cut, size, was) = preview(&[0x93, 1, 2, 3], 2);
        assert_eq!((cut, size, was), (vec![], 4, true));
        assert_eq!(
            preview(&[0x93, 1, 2, 3], 4),
            (vec![0x93, 1, 2, 3], 4, false)
        );
    }
}
