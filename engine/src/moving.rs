//! Moving a tube's tasks to another node (`tarq ctl move`): what the engine offers so a copy is
//! exact. The old owner pages through the tube with [`Queue::export_tube`] (and its dedup keys
//! with [`Queue::export_dedup`], its numbering with [`Queue::tube_numbers`]); the new owner,
//! holding a tube at the same index made with the same options, takes each page in with
//! [`Queue::import_task`] (and [`Queue::import_dedup`], [`Queue::import_numbers`]). A
//! [`MovedTask`] is everything the engine keeps of a task, owned, so it can cross the wire
//! (serde, behind the `serde` feature); imported, the task is the one exported — id, status,
//! times, deadlines, delivery count, counters, utube key, payload — and only the session
//! holding a Taken one is the importer's to name.
//!
//! An import is a live change, not a replay: it is journaled (`Event::Imported`, logged as the
//! whole task) and keeps every invariant, but counts no operation in the tube's figures (the
//! task was put once, on the old owner). Which pages to send, when to stop the traffic of the
//! old copy and when to drop it are the server's: each export page is the tube as it is at
//! that call, and tasks that change between pages are the mover's to follow.

use std::collections::BinaryHeap;

use super::Queue;
use crate::slots::TTR_ARMED;
use crate::tubes::{task_id, MAX_DEDUP_KEY_BYTES, MAX_UTUBE_KEY_BYTES};
use crate::{
    Event, JobCounts, Micros, QueueError, RestoredTask, SessionId, Status, TaskId, TubeIx,
    TubeNumbers,
};

/// An export page looks for its tasks by id, one index probe per id from the page's start:
/// cheap where the tube's ids are dense (the usual queue: its live tasks are its newest
/// puts). After this many probes per task asked for, with the page still short, the rest of
/// the page is found by one walk of the arena instead, so a tube whose ids are sparse (most
/// acked long ago) costs a page at most this many probes and one walk, never a probe per
/// number the tube ever gave.
pub const EXPORT_PROBES_PER_TASK: usize = 4;

/// The probes an export page may make whatever its size: a page of a few tasks over a
/// stretch of acked ids still finds them without walking the arena.
pub const EXPORT_MIN_PROBES: usize = 1024;

/// A task as it moves between nodes: everything the engine keeps of it, owned. What
/// [`Queue::export_tube`] reads and [`Queue::import_task`] puts back as it was.
#[derive(Clone, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct MovedTask {
    pub id: TaskId,
    pub status: Status,
    /// When a Waiting task becomes Ready; 0 in any other status.
    pub runat: Micros,
    /// When a Taken task's TTR runs out and it returns; `None` in any other status, and for a
    /// Taken task with no TTR armed (no TTR, or taken before a restart as recovery restores).
    pub ttr_deadline: Option<Micros>,
    pub pri: i64,
    /// Put time: the TTL counts from here, on the new node too.
    pub created: Micros,
    pub ttl: Option<Micros>,
    pub ttr: Option<Micros>,
    /// The payload, the bytes the client put.
    #[cfg_attr(feature = "serde", serde(with = "serde_bytes"))]
    pub data: Vec<u8>,
    /// The utube key, in a utube / utubettl tube.
    #[cfg_attr(feature = "serde", serde(with = "serde_bytes"))]
    pub utube: Option<Vec<u8>>,
    /// Times taken (`max_deliveries` counts on from it).
    pub deliveries: u16,
    /// Releases, buries, kicks and TTR returns so far (beanstalk's `stats-job`).
    pub counts: JobCounts,
    /// The session holding a Taken task on the node it is exported from: the importer maps it
    /// to a session of its own (`import_task`'s `owner`). `None` unless Taken.
    pub owner: Option<SessionId>,
}

impl MovedTask {
    /// The bytes it carries that a client gave (payload and utube key): what bounds a move's
    /// page.
    pub fn payload_bytes(&self) -> usize {
        self.data.len() + self.utube.as_ref().map_or(0, Vec::len)
    }

    /// Its instants (the delay's end, the TTR's deadline, the put time the TTL counts from)
    /// moved by `by` µs: from the exporting node's wall clock to the importing node's, so each
    /// keeps what was left of it (nodes' wall clocks differ).
    pub fn shift_clock(&mut self, by: i64) {
        if self.runat != 0 {
            self.runat = self.runat.saturating_add_signed(by);
        }
        self.ttr_deadline = self.ttr_deadline.map(|t| t.saturating_add_signed(by));
        self.created = self.created.saturating_add_signed(by);
    }
}

impl MovedDedup {
    /// Its expiry moved by `by` µs to the importing node's wall clock
    /// ([`MovedTask::shift_clock`]).
    pub fn shift_clock(&mut self, by: i64) {
        self.expires = self.expires.saturating_add_signed(by);
    }
}

/// A dedup key as it moves between nodes ([`Queue::export_dedup`], [`Queue::import_dedup`]):
/// a retry of a put with the key must find its task on the new owner as it did on the old.
#[derive(Clone, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct MovedDedup {
    /// Its place in the old owner's window, for paging (`export_dedup`'s `after`); the
    /// import does not keep it.
    pub seq: u64,
    #[cfg_attr(feature = "serde", serde(with = "serde_bytes"))]
    pub key: Vec<u8>,
    /// The task the key names (it may be gone: done).
    pub id: TaskId,
    /// When the key is forgotten.
    pub expires: Micros,
}

impl Queue {
    /// Up to `limit` tasks of `tube`, in every status, in id order, from the first id after
    /// `after` (the last id of the previous page; `None` for the first page): a page of a
    /// move's copy. The page ends early once its payloads reach `max_bytes` (it holds one task
    /// at least, whatever its size), so a page of big tasks stays a frame a link can carry. An
    /// empty page is the end. Each page is the tube as it is now. Costs O(limit) index probes
    /// where the tube's ids are dense, else at most `limit * EXPORT_PROBES_PER_TASK`
    /// (`EXPORT_MIN_PROBES` at least) and one walk of the arena (O(tasks of every tube)).
    pub fn export_tube(
        &self,
        tube: TubeIx,
        after: Option<TaskId>,
        limit: usize,
        max_bytes: usize,
    ) -> Result<Vec<MovedTask>, QueueError> {
        let slots = self.tube_slots(tube, after, limit)?;
        let mut bytes = 0usize;
        let mut page = Vec::with_capacity(slots.len());
        for k in slots {
            if !page.is_empty() && bytes >= max_bytes {
                break;
            }
            let task = self.moved(k);
            bytes = bytes.saturating_add(task.payload_bytes());
            page.push(task);
        }
        Ok(page)
    }

    /// The ids of up to `limit` tasks of `tube` after `after`, in id order, found as
    /// [`export_tube`](Self::export_tube) finds its page (nothing copied).
    pub fn tube_ids(
        &self,
        tube: TubeIx,
        after: Option<TaskId>,
        limit: usize,
    ) -> Result<Vec<TaskId>, QueueError> {
        let slots = self.tube_slots(tube, after, limit)?;
        Ok(slots
            .into_iter()
            .map(|k| self.slots[k as usize].id)
            .collect())
    }

    /// The slots of up to `limit` tasks of `tube` after `after`, in id order.
    fn tube_slots(
        &self,
        tube: TubeIx,
        after: Option<TaskId>,
        limit: usize,
    ) -> Result<Vec<u32>, QueueError> {
        let t = self.live_tube(tube)?;
        let mut out = Vec::with_capacity(limit.min(EXPORT_MIN_PROBES));
        let n = t.numbers;
        // The ids the tube's tasks can have, in id order: those kept from before tubes
        // numbered their own (`default`'s numbers, below the tube's mark), then its own.
        let base = task_id(tube, 0);
        let ranges = [(1, n.legacy_below), (base + n.first, base + n.next)];
        let mut from = after.map_or(0, |a| a.saturating_add(1));
        let mut probes = limit
            .saturating_mul(EXPORT_PROBES_PER_TASK)
            .max(EXPORT_MIN_PROBES);
        for (lo, hi) in ranges {
            let mut id = lo.max(from);
            while id < hi && out.len() < limit && probes > 0 {
                probes -= 1;
                if let Some(k) = self.find(id) {
                    if self.slots[k as usize].tube == tube {
                        out.push(k);
                    }
                }
                id += 1;
            }
            from = id.max(from);
            if out.len() == limit {
                return Ok(out);
            }
            if id < hi {
                // Out of probes: the tube is sparse here.
                out.extend(self.lowest_ids_from(tube, from, limit - out.len()));
                return Ok(out);
            }
        }
        Ok(out)
    }

    /// Task `id` of `tube` as it is now, for a move that copied the tube while it served and
    /// sends again what changed since (`None`: it is gone, or not of `tube`).
    pub fn export_task(&self, tube: TubeIx, id: TaskId) -> Option<MovedTask> {
        let k = self.find(id)?;
        (self.slots[k as usize].tube == tube).then(|| self.moved(k))
    }

    /// Forgets task `id` of `tube`, a partition that moved to another node: removed here
    /// without a record of its own (the caller ends with `truncate`, whose one record the
    /// journal and the replicas take the whole removal from), counting nothing.
    pub fn forget_moved(&mut self, tube: TubeIx, id: TaskId) -> Result<(), QueueError> {
        self.live_tube(tube)?;
        let k = self.in_tube(tube, id)?;
        self.remove_slot(k);
        Ok(())
    }

    /// Removes task `id` of `tube` that a move copied here and that changed or went on the
    /// node it is copied from since: the copy is replaced by the task as it is now there
    /// (`import_task`), or goes. Journaled as a deletion; counts no operation in the tube's
    /// figures. `NotFound` when it is not here.
    pub fn remove_moved(&mut self, tube: TubeIx, id: TaskId) -> Result<(), QueueError> {
        self.live_tube(tube)?;
        let k = self.in_tube(tube, id)?;
        self.remove_slot(k);
        self.log(Event::Deleted { id });
        Ok(())
    }

    /// The slots of the `want` lowest ids from `from` on in `tube`, in id order: one walk of
    /// the arena keeping the lowest in a bounded heap.
    fn lowest_ids_from(&self, tube: TubeIx, from: TaskId, want: usize) -> Vec<u32> {
        let mut lowest: BinaryHeap<(TaskId, u32)> = BinaryHeap::with_capacity(want + 1);
        for (k, s) in self.slots.iter() {
            if s.tube != tube || s.id < from {
                continue;
            }
            if lowest.len() < want {
                lowest.push((s.id, k as u32));
            } else if lowest.peek().is_some_and(|&(top, _)| s.id < top) {
                lowest.pop();
                lowest.push((s.id, k as u32));
            }
        }
        lowest
            .into_sorted_vec()
            .into_iter()
            .map(|(_, k)| k)
            .collect()
    }

    /// Slot `k` as a [`MovedTask`].
    fn moved(&self, k: u32) -> MovedTask {
        let v = self.view(k);
        let armed = self.slots[k as usize].flags & TTR_ARMED != 0;
        MovedTask {
            id: v.id,
            status: v.status,
            runat: v.runat,
            ttr_deadline: (v.status == Status::Taken && armed).then(|| self.slots.t(k)),
            pri: v.pri,
            created: v.created,
            ttl: v.ttl,
            ttr: v.ttr,
            data: v.data.to_vec(),
            utube: v.utube.map(<[u8]>::to_vec),
            deliveries: v.deliveries,
            counts: v.counts,
            owner: v.owner,
        }
    }

    /// Adds a task exported from another node's tube at this index ([`export_tube`]) to
    /// `tube` exactly as it was there: same id, status and times; Waiting until its `runat`;
    /// Taken by session `owner` (the importer's session for the one that held it there),
    /// its TTR deadline kept (armed only when the task has a TTR), last in `owner`'s take
    /// order. A time already past fires at the next `advance`, as it would have there. The
    /// tube's numbering rises past the id, so no later put gets it. Journaled as
    /// `Event::Imported`; no operation is counted in the tube's figures (the task was put
    /// once, there), its counts by status are. Restoring's insertion path, listed at once.
    ///
    /// Refused: a missing tube (`TubeNotFound`); an id of another tube's numbering, or below
    /// this tube's `first` (`IdNotOfTube`: the tube here was made numbering from elsewhere
    /// than the exported one); a live id (`Duplicate`: an import sent twice); a queue at
    /// [`max_tasks`](Self::max_tasks) (`TooManyTasks`); a utube key over
    /// `MAX_UTUBE_KEY_BYTES` (`UtubeKeyTooLong`); a Taken task of a utube that has one Taken
    /// already here (`NotTakeable`: one taken task a utube). Nothing changes when refused. A
    /// limfifottl tube's capacity is not checked: the task was accepted under it once.
    ///
    /// [`export_tube`]: Self::export_tube
    pub fn import_task(
        &mut self,
        tube: TubeIx,
        task: MovedTask,
        owner: SessionId,
    ) -> Result<(), QueueError> {
        let t = self.live_tube(tube)?;
        let is_utube = t.kind.is_utube();
        let id = task.id;
        let numbering = self.check_restorable(tube, id, false)?;
        self.room_for_a_task()?;
        let key = task.utube.as_deref().unwrap_or_default();
        if is_utube {
            if key.len() > MAX_UTUBE_KEY_BYTES {
                return Err(QueueError::UtubeKeyTooLong {
                    len: key.len(),
                    max: MAX_UTUBE_KEY_BYTES,
                });
            }
            let utubes = self.tube(tube).utubes.as_ref().expect("utube tube");
            let busy = utubes
                .find(key)
                .is_some_and(|u| utubes.list[u as usize].busy);
            if busy && task.status == Status::Taken {
                return Err(QueueError::NotTakeable {
                    id,
                    status: Status::Taken,
                });
            }
        }
        let ttr_at = task.ttr_deadline.filter(|_| task.ttr.is_some());
        let restored = RestoredTask {
            id,
            status: task.status,
            runat: task.runat,
            pri: task.pri,
            ttl: task.ttl,
            ttr: task.ttr,
            created: task.created,
            data: task.data,
        };
        let utube = task.utube.as_deref();
        let k = self.insert_restored(tube, numbering, restored, utube, task.deliveries);
        self.slots.set_counts(k, task.counts);
        match task.status {
            Status::Taken => {
                if ttr_at.is_some() {
                    self.slots[k as usize].flags |= TTR_ARMED;
                }
                self.enter_taken(k, owner, ttr_at.unwrap_or(0));
            }
            Status::Waiting => self.enter(k, Status::Waiting, task.runat),
            status => self.enter(k, status, 0),
        }
        self.reschedule(k);
        self.log(Event::Imported { id });
        // The journal reads the task right after this call.
        self.recent = (id, k);
        Ok(())
    }

    /// Up to `limit` dedup keys of `tube`, oldest first, from the one after sequence number
    /// `after` (the last `seq` of the previous page; `None` for the first page). Empty for a
    /// tube without a dedup window, and at the end.
    pub fn export_dedup(
        &self,
        tube: TubeIx,
        after: Option<u64>,
        limit: usize,
    ) -> Result<Vec<MovedDedup>, QueueError> {
        let t = self.live_tube(tube)?;
        let Some(d) = t.dedup.as_deref() else {
            return Ok(Vec::new());
        };
        let from = after.map_or(d.first_seq, |a| a.saturating_add(1).max(d.first_seq));
        let skip = usize::try_from(from - d.first_seq).unwrap_or(usize::MAX);
        let page = d.fifo.iter().skip(skip).take(limit);
        Ok((page.zip(from..))
            .map(|(e, seq)| MovedDedup {
                seq,
                key: e.key.to_vec(),
                id: e.id,
                expires: e.expires,
            })
            .collect())
    }

    /// Adds a dedup key exported from another node's tube at this index ([`export_dedup`]):
    /// a put with the key before `expires` answers with its task here as it did there. The
    /// numbering rises past the task's id (the task may be done: no later put may get its
    /// id). Journaled as `Event::DedupRecorded`, as a put's key is. A tube without a dedup
    /// window keeps nothing, as a put into it would not. Refused: a missing tube, a key over
    /// `MAX_DEDUP_KEY_BYTES`, an id not of the tube's numbering (`IdNotOfTube`).
    ///
    /// [`export_dedup`]: Self::export_dedup
    pub fn import_dedup(&mut self, tube: TubeIx, entry: MovedDedup) -> Result<(), QueueError> {
        self.live_tube(tube)?;
        if entry.key.len() > MAX_DEDUP_KEY_BYTES {
            return Err(QueueError::DedupKeyTooLong {
                len: entry.key.len(),
                max: MAX_DEDUP_KEY_BYTES,
            });
        }
        let numbering = self.numbering_of(tube, entry.id)?;
        self.count_restored_id(tube, numbering, entry.id);
        if let Some(d) = self.tube_mut(tube).dedup.as_mut() {
            let seq = d.record(&entry.key, entry.id, entry.expires);
            self.log(Event::DedupRecorded { tube, seq });
        }
        Ok(())
    }

    /// Raises `tube`'s numbering to another node's copy of it ([`tube_numbers`] there): the
    /// next put here gets a number past every one given there, also to tasks already gone, so
    /// no id of the moved tube is given twice. Numbers never go down (`next` and
    /// `legacy_below` are raised, as `restore_tube_numbers` does). Journaled as the tube's
    /// record (`Event::TubeCreated`) when it changed; `Ok(false)` when nothing did.
    /// Refused (`TubeNumbering`) unless `numbers.first` is this tube's own: the tube API
    /// shows a task's number counted from `first`, so a copy numbering from elsewhere would
    /// show its tasks under other numbers (and refuse the ones below its `first`) — the tube
    /// here must be made with the exported tube's `first`. Call it before the tasks: it is
    /// the check that the copy can be exact.
    ///
    /// [`tube_numbers`]: Self::tube_numbers
    pub fn import_numbers(
        &mut self,
        tube: TubeIx,
        numbers: TubeNumbers,
    ) -> Result<bool, QueueError> {
        let before = self.live_tube(tube)?.numbers;
        self.restore_tube_numbers(tube, numbers)?;
        let changed = self.tube(tube).numbers != before;
        if changed {
            self.log(Event::TubeCreated { tube });
        }
        Ok(changed)
    }
}
