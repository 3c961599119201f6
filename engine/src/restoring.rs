//! [`Restoring`]: a queue being loaded from a snapshot, which owns the queue and the load's
//! bookkeeping (which arena slots it has restored but not yet listed, and the order they are
//! listed in) until [`Restoring::finish`] hands the queue back whole.
//!
//! A snapshot lists its tasks in arena order, which after churn is no list's order, so
//! inserting each into its skiplist as it comes would search the list (O(log n) steps, a cache
//! miss each). A `Restoring` instead holds them unlisted — status and time already in the slot,
//! no tower yet — and lists them at the end sorted by [`list_key`] and id, so that every task
//! is appended at its list's tail in O(height). The sort is either the engine's own
//! ([`Restoring::finish`]) or given by the loader, which can compute it on another thread
//! while the loop thread restores ([`Restoring::finish_in`]): the order names tasks by their
//! *ordinal*, the how-manieth `restore_in` each was. Only the calls a snapshot load makes are
//! offered meanwhile; the queue, whose lists miss the held tasks, is out of reach until the
//! end, so no call can see it half listed. WAL replay, which changes tasks already listed,
//! uses the `Queue`'s own `restore*` calls afterwards.

use crate::{
    JobCounts, Micros, PutPayload, Queue, QueueError, RestoredTask, Room, RoomWanted, Status,
    TaskId, TubeIx, TubeNumbers, TubeOptions, TubeType,
};

/// How `restore_in` treats ids while [`Restoring`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BulkIds {
    /// Each restore looks its id up and refuses a duplicate.
    Check,
    /// The caller has made sure the ids are distinct and none is in the queue already, so no
    /// restore looks one up (in a churned queue's snapshot the lookup is a cache miss or two
    /// per task, a sixth of the load). A snapshot's ids are distinct by construction and its
    /// loader checks them on its reading thread; should they not be, the queue holds two index
    /// entries for one id and must be discarded, as a failed load's is.
    Distinct,
}

/// A held task's place in the order it is listed in, before its id: which of the two list
/// orders it has — 0 by pri (Ready, Buried; pri with the sign bit flipped, so it sorts as
/// unsigned), 1 by time (Waiting; runat) — and its key in that order. Sorted by (this, id),
/// all tasks together, each list still receives its own tasks in its own order; and so does
/// each half sorted alone, which a loader can use (tasks in arena order are often near their
/// list's order within each half, seldom across the two). `None` for a Taken task, which is
/// entered at once (its order is its session's, by time).
pub fn list_key(status: Status, pri: i64, runat: Micros) -> Option<(u8, u64)> {
    match status {
        Status::Taken => None,
        Status::Waiting => Some((1, runat)),
        Status::Ready | Status::Buried => Some((0, (pri as u64) ^ (1 << 63))),
    }
}

/// A queue being loaded from a snapshot ([`Queue::restoring`]): tasks restored Ready, Waiting
/// or Buried are held unlisted until [`finish`](Self::finish) (or
/// [`finish_in`](Self::finish_in)) lists them all and returns the queue. Taken tasks are
/// entered at once. Dropped unfinished, the queue goes with it, as a failed load's should.
#[derive(Debug)]
pub struct Restoring {
    queue: Queue,
    bulk: Bulk,
}

impl Restoring {
    pub(crate) fn new(queue: Queue, ids: BulkIds) -> Self {
        Restoring {
            queue,
            bulk: Bulk::new(ids),
        }
    }

    /// The queue as restored so far, to read: its lists miss the held tasks.
    pub fn queue(&self) -> &Queue {
        &self.queue
    }

    /// [`Queue::restore_in`], the task held unlisted unless Taken.
    #[inline]
    pub fn restore_in(
        &mut self,
        tube: TubeIx,
        task: RestoredTask<impl PutPayload>,
        utube: Option<&[u8]>,
        deliveries: u16,
    ) -> Result<(), QueueError> {
        (self.queue).restore_task(tube, task, utube, deliveries, Some(&mut self.bulk))
    }

    /// [`Queue::restore_counts`].
    pub fn restore_counts(&mut self, id: TaskId, counts: JobCounts) -> Result<(), QueueError> {
        self.queue.restore_counts(id, counts)
    }

    /// [`Queue::restore_tube`].
    pub fn restore_tube(
        &mut self,
        tube: TubeIx,
        name: &str,
        kind: TubeType,
        opts: TubeOptions,
        numbers: TubeNumbers,
    ) -> Result<(), QueueError> {
        self.queue.restore_tube(tube, name, kind, opts, numbers)
    }

    /// [`Queue::restore_tube_numbers`].
    pub fn restore_tube_numbers(
        &mut self,
        tube: TubeIx,
        numbers: TubeNumbers,
    ) -> Result<(), QueueError> {
        self.queue.restore_tube_numbers(tube, numbers)
    }

    /// [`Queue::restore_ops`].
    pub fn restore_ops(&mut self, tube: TubeIx, counts: &[u64]) -> Result<(), QueueError> {
        self.queue.restore_ops(tube, counts)
    }

    /// [`Queue::restore_retired`].
    pub fn restore_retired(&mut self, counts: &[u64]) {
        self.queue.restore_retired(counts)
    }

    /// [`Queue::restore_floor`].
    pub fn restore_floor(&mut self, tube: TubeIx, floor: u64) -> Result<(), QueueError> {
        self.queue.restore_floor(tube, floor)
    }

    /// [`Queue::restore_users`].
    pub fn restore_users(&mut self, users: Vec<crate::User>) {
        self.queue.restore_users(users);
    }

    /// [`Queue::restore_dedup`].
    pub fn restore_dedup(
        &mut self,
        tube: TubeIx,
        key: &[u8],
        id: TaskId,
        expires: Micros,
    ) -> Result<(), QueueError> {
        self.queue.restore_dedup(tube, key, id, expires)
    }

    /// [`Queue::set_last_id`].
    pub fn set_last_id(&mut self, id: TaskId) {
        self.queue.set_last_id(id);
    }

    /// [`Queue::reserve`].
    pub fn reserve(&mut self, additional: usize) {
        self.queue.reserve(additional);
    }

    /// [`Queue::add_room`].
    pub fn add_room(&mut self, room: Room) {
        self.queue.add_room(room);
    }

    /// [`Queue::room_wanted`].
    pub fn room_wanted(&self) -> RoomWanted {
        self.queue.room_wanted()
    }

    /// [`Queue::prefetch_id`].
    #[inline]
    pub fn prefetch_id(&self, id: TaskId) {
        self.queue.prefetch_id(id);
    }

    /// Lists the held tasks, each list in its own order, and returns the queue: sorted here,
    /// O(n log n) (O(n) for a snapshot already in order), then O(height) a task.
    pub fn finish(self) -> Queue {
        let Restoring { mut queue, bulk } = self;
        let mut held: Vec<((u8, u64), TaskId, u32)> = Vec::with_capacity(bulk.held());
        for k in (0..bulk.len() as u32).filter_map(|i| bulk.key(i)) {
            if let Some((key, id)) = queue.held_list_key(k) {
                held.push((key, id, k));
            }
        }
        held.sort_unstable();
        for (_, _, k) in held {
            queue.list_held(k);
        }
        queue
    }

    /// [`finish`](Self::finish) in an order the caller sorted: `order` names each held task
    /// by its ordinal (the how-manieth `restore_in` it was), sorted by ([`list_key`], id). A
    /// snapshot's loader computes it on its reading thread while this one restores. An order
    /// that is not sorted lists every task all the same, only slower (each insert then
    /// searches its list); one that names a task twice, leaves one out or names a Taken one
    /// or none is refused before anything is listed, and the half-restored queue dropped.
    // A function of its own: inlined into the loader's large function, the listing loop (a
    // good part of a load) compiles to slower code.
    #[inline(never)]
    pub fn finish_in(self, order: &[u32]) -> Result<Queue, QueueError> {
        let Restoring { mut queue, bulk } = self;
        bulk.check_order(order)?;
        for &i in order {
            queue.list_held(bulk.key(i).expect("checked held"));
        }
        Ok(queue)
    }
}

/// A bulk restore's bookkeeping.
#[derive(Debug)]
pub(crate) struct Bulk {
    pub(crate) ids: BulkIds,
    /// The arena key of each task restored since the bulk began, by ordinal.
    keys: Keys,
    /// The ordinals of the Taken ones (few), so a given order is checked without reading
    /// a slot per task; every other task restored is held.
    taken: Vec<u32>,
}

/// Ordinal → arena key. A fresh arena hands out keys in order, so in a snapshot load the key
/// of ordinal `i` is `i`: nothing is written unless a key differs.
#[derive(Debug)]
enum Keys {
    InOrder(u32),
    Mapped(Vec<u32>),
}

impl Bulk {
    pub(crate) fn new(ids: BulkIds) -> Self {
        Bulk {
            ids,
            keys: Keys::InOrder(0),
            taken: Vec::new(),
        }
    }

    /// Notes the next restored task's arena key; `held` unless it is Taken.
    pub(crate) fn restored(&mut self, k: u32, held: bool) {
        if !held {
            self.taken.push(self.len() as u32);
        }
        match &mut self.keys {
            Keys::InOrder(n) if *n == k => *n += 1,
            Keys::InOrder(n) => {
                let mut keys: Vec<u32> = (0..*n).collect();
                keys.push(k);
                self.keys = Keys::Mapped(keys);
            }
            Keys::Mapped(keys) => keys.push(k),
        }
    }

    /// Ok if `order` names each held task once by its ordinal.
    fn check_order(&self, order: &[u32]) -> Result<(), QueueError> {
        if order.len() != self.held() {
            return Err(QueueError::RestoreOrderLength {
                named: order.len(),
                held: self.held(),
            });
        }
        // One bit an ordinal: set for those named, and from the start for the Taken ones.
        let mut seen = vec![0u64; self.len().div_ceil(64)];
        for &i in &self.taken {
            seen[i as usize / 64] |= 1 << (i % 64);
        }
        for &ordinal in order {
            let (word, bit) = (ordinal as usize / 64, 1u64 << (ordinal % 64));
            if self.key(ordinal).is_none() || seen[word] & bit != 0 {
                return Err(QueueError::RestoreOrderOrdinal { ordinal });
            }
            seen[word] |= bit;
        }
        Ok(())
    }

    /// How many of the tasks restored are held (not Taken): the tasks the listing names.
    pub(crate) fn held(&self) -> usize {
        self.len() - self.taken.len()
    }

    /// How many tasks were restored.
    pub(crate) fn len(&self) -> usize {
        match &self.keys {
            Keys::InOrder(n) => *n as usize,
            Keys::Mapped(keys) => keys.len(),
        }
    }

    /// The arena key of the task restored `ordinal`-th, if there was one.
    pub(crate) fn key(&self, ordinal: u32) -> Option<u32> {
        match &self.keys {
            Keys::InOrder(n) => (ordinal < *n).then_some(ordinal),
            Keys::Mapped(keys) => keys.get(ordinal as usize).copied(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_written_out_only_once_one_is_out_of_order() {
        let mut b = Bulk::new(BulkIds::Distinct);
        for k in 0..3 {
            b.restored(k, true);
        }
        assert!(matches!(b.keys, Keys::InOrder(3)));
        b.restored(7, false);
        b.restored(3, true);
        assert_eq!(b.len(), 5);
        assert_eq!(b.held(), 4);
        assert_eq!(b.taken, [3], "the ordinal of the Taken one");
        let keys: Vec<_> = (0..6).map(|i| b.key(i)).collect();
        assert_eq!(keys, [Some(0), Some(1), Some(2), Some(7), Some(3), None]);
    }

    #[test]
    fn taken_tasks_have_no_list_key_and_pri_sorts_as_signed() {
        assert_eq!(list_key(Status::Taken, 0, 5), None);
        assert_eq!(list_key(Status::Waiting, 3, 5), Some((1, 5)));
        let ready = |pri| list_key(Status::Ready, pri, 0).expect("held");
        assert!(ready(-1) < ready(0) && ready(0) < ready(1));
        assert!(ready(i64::MIN) < ready(i64::MAX));
    }
}
