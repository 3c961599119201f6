//! The order a snapshot's tasks are listed in, worked out on the reading thread while the
//! loop thread restores them; and the check that no id comes twice.
//!
//! The engine lists a bulk restore's tasks sorted by ([`list_key`], id) so that each goes at
//! its list's tail ([`tarq_engine::Restoring::finish_in`]). Sorting 10M tasks once all
//! are in took ~0.55 s on the loop thread, with the other thread idle. The reading thread,
//! which waits on the loop thread for most of a load, instead sorts each block's tasks as it
//! decodes them and merges the sorted runs as a binary counter does (a run is merged into the
//! one before it as soon as it is as long), so that when the last block is in, runs of
//! halving lengths are left: one merge pass, ~n moves.
//!
//! The two list orders (by pri, by time) are sorted apart and put one after the other, which
//! is the same order: in arena order a queue's tasks are often already in order within each
//! (ids only grow, and a put's runat with them), seldom across the two, so a block's run is
//! found sorted in one pass and a run that follows the one before it needs no merge. Written
//! by hand: a merge of adjacent runs with a scratch buffer kept between merges (the standard
//! library's stable sort would merge the same runs, but allocates its scratch anew each call:
//! fresh pages, faulted in, every block).
//!
//! The id check: every id set in a bitmap over the span of ids the snapshot holds, when that
//! span is at most 64 ids a task (8 bytes a task, 1.25 MB for 10M tasks filled in order);
//! a long history with few live tasks sorts the ids instead.

use tarq_engine::{list_key, Micros, Status, TaskId};

/// A held task: its key in its list order, id and ordinal (its place among the snapshot's
/// tasks).
type Entry = (u64, TaskId, u32);

/// The id span, in ids per task, up to which the check uses a bitmap (one bit an id).
const BITMAP_IDS_PER_TASK: u64 = 64;

#[derive(Default)]
pub(crate) struct ListOrder {
    /// The tasks of each list order ([`list_key`]'s first part).
    by: [Runs; 2],
    /// The ids of Taken tasks, which the engine enters at once and which have no place here.
    taken: Vec<TaskId>,
    /// The ordinal of the next task.
    next: u32,
    /// Merge scratch: as long as the longest left run merged so far.
    scratch: Vec<Entry>,
}

/// Tasks of one list order: sorted runs, then the current block's tasks unsorted.
#[derive(Default)]
struct Runs {
    entries: Vec<Entry>,
    /// Where each sorted run begins; each run is shorter than the one before it.
    starts: Vec<usize>,
    /// Where the runs end and the current block's tasks begin.
    runs_end: usize,
}

impl ListOrder {
    /// Room for `tasks` (a hint: the snapshot header's count) in the order by pri, which
    /// most tasks of most queues have.
    pub(crate) fn with_capacity(tasks: usize) -> Self {
        let mut o = ListOrder::default();
        o.by[0].entries.reserve(tasks);
        o
    }

    /// The next task of the snapshot, in file order.
    pub(crate) fn task(&mut self, id: TaskId, status: Status, pri: i64, runat: Micros) {
        match list_key(status, pri, runat) {
            Some((by, key)) => self.by[usize::from(by)].entries.push((key, id, self.next)),
            None => self.taken.push(id),
        }
        self.next += 1;
    }

    /// Ends a run: the tasks since the last call are sorted and merged into the runs before
    /// them while the newest run is at least as long as the one before it.
    pub(crate) fn end_run(&mut self) {
        for runs in &mut self.by {
            runs.end_run(&mut self.scratch);
        }
    }

    /// The ordinals of the held tasks in list order, or an id that occurs twice.
    pub(crate) fn finish(mut self) -> Result<Vec<u32>, TaskId> {
        for runs in &mut self.by {
            runs.end_run(&mut self.scratch);
            while runs.starts.len() >= 2 {
                runs.merge_last_two(&mut self.scratch);
            }
        }
        self.scratch = Vec::new();
        let [by_pri, by_time] = &self.by;
        let held = || by_pri.entries.iter().chain(&by_time.entries);
        let ids = held().map(|e| e.1).chain(self.taken.iter().copied());
        if let Some(id) = repeated_id(ids) {
            return Err(id);
        }
        Ok(held().map(|e| e.2).collect())
    }
}

impl Runs {
    fn end_run(&mut self, scratch: &mut Vec<Entry>) {
        let start = self.runs_end;
        if start == self.entries.len() {
            return;
        }
        // O(n) for a block already in order (pattern-defeating quicksort checks first).
        self.entries[start..].sort_unstable();
        self.starts.push(start);
        self.runs_end = self.entries.len();
        while let [.., prev, last] = self.starts[..] {
            if self.runs_end - last < last - prev {
                break;
            }
            self.merge_last_two(scratch);
        }
    }

    /// Merges the last run into the one before it.
    fn merge_last_two(&mut self, scratch: &mut Vec<Entry>) {
        let last = self.starts.pop().expect("two runs");
        let prev = *self.starts.last().expect("two runs");
        merge(&mut self.entries[prev..self.runs_end], last - prev, scratch);
    }
}

/// Merges `v[..mid]` and `v[mid..]`, each sorted, into `v` sorted: the left run is copied out
/// and merged back in from the front, which never overwrites an element of the right run not
/// yet read (the write position stays behind the right run's read position).
fn merge<T: Copy + Ord>(v: &mut [T], mid: usize, scratch: &mut Vec<T>) {
    if mid == 0 || mid == v.len() || v[mid - 1] <= v[mid] {
        return; // already in order
    }
    scratch.clear();
    scratch.extend_from_slice(&v[..mid]);
    let (mut i, mut j, mut out) = (0, mid, 0);
    while i < scratch.len() && j < v.len() {
        if v[j] < scratch[i] {
            v[out] = v[j];
            j += 1;
        } else {
            v[out] = scratch[i];
            i += 1;
        }
        out += 1;
    }
    // What is left of the left run fills the gap; what is left of the right run is in place.
    let rest = &scratch[i..];
    v[out..out + rest.len()].copy_from_slice(rest);
}

/// An id that occurs twice in `ids`, if any.
fn repeated_id(ids: impl Iterator<Item = TaskId> + Clone) -> Option<TaskId> {
    let (n, lo, hi) = ids.clone().fold((0u64, u64::MAX, 0), |(n, lo, hi), id| {
        (n + 1, lo.min(id), hi.max(id))
    });
    if n == 0 {
        return None;
    }
    // The span less one: ids 0 and u64::MAX (a damaged file) must not overflow it.
    let span = hi - lo;
    if span < n.saturating_mul(BITMAP_IDS_PER_TASK) {
        let mut seen = vec![0u64; (span / 64 + 1) as usize];
        for id in ids {
            let (word, bit) = (((id - lo) / 64) as usize, 1u64 << ((id - lo) % 64));
            if seen[word] & bit != 0 {
                return Some(id);
            }
            seen[word] |= bit;
        }
        return None;
    }
    let mut sorted: Vec<TaskId> = ids.collect();
    sorted.sort_unstable();
    sorted.windows(2).find(|w| w[0] == w[1]).map(|w| w[0])
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn status_of(n: u8) -> Status {
        [
            Status::Ready,
            Status::Waiting,
            Status::Buried,
            Status::Taken,
        ][n as usize % 4]
    }

    /// (status 0..4, pri, runat, id) per task, in blocks of the given sizes.
    fn order_of(tasks: &[(u8, i8, u8, u64)], blocks: &[usize]) -> Result<Vec<u32>, TaskId> {
        let mut o = ListOrder::with_capacity(0);
        let mut sizes = blocks.iter().cycle();
        let mut in_block = 0;
        for &(status, pri, runat, id) in tasks {
            let status = status_of(status);
            o.task(id, status, i64::from(pri), u64::from(runat));
            in_block += 1;
            if in_block >= *sizes.next().expect("cycle") {
                o.end_run();
                in_block = 0;
            }
        }
        o.finish()
    }

    /// The order a single sort of everything gives.
    fn sorted_once(tasks: &[(u8, i8, u8, u64)]) -> Vec<u32> {
        let mut all: Vec<((u8, u64), TaskId, u32)> = Vec::new();
        for (i, &(status, pri, runat, id)) in tasks.iter().enumerate() {
            let status = status_of(status);
            if let Some(key) = list_key(status, i64::from(pri), u64::from(runat)) {
                all.push((key, id, i as u32));
            }
        }
        all.sort_unstable();
        all.iter().map(|e| e.2).collect()
    }

    proptest! {
        #[test]
        fn merged_runs_give_the_order_of_one_sort(
            ids in prop::collection::hash_set(1u64..5_000, 0..400),
            meta in prop::collection::vec((0u8..4, -3i8..3, 0u8..4), 400),
            blocks in prop::collection::vec(1usize..40, 1..6),
            ascending in any::<bool>(),
        ) {
            // Ascending ids: a queue filled in order, whose runs are mostly in order already.
            let mut ids: Vec<u64> = ids.into_iter().collect();
            if ascending {
                ids.sort_unstable();
            }
            let tasks: Vec<_> = ids
                .iter()
                .zip(&meta)
                .map(|(&id, &(s, p, r))| (s, p, r, id))
                .collect();
            prop_assert_eq!(order_of(&tasks, &blocks), Ok(sorted_once(&tasks)));
        }

        #[test]
        fn a_repeated_id_is_found_in_any_status_and_over_any_span(
            ids in prop::collection::hash_set(1u64..u64::MAX / 2, 1..200),
            dup_of in any::<prop::sample::Index>(),
            statuses in prop::collection::vec(0u8..4, 201),
            dense in any::<bool>(),
        ) {
            // Dense ids take the bitmap, sparse ones the sort.
            let mut ids: Vec<u64> = if dense {
                (1..=ids.len() as u64).collect()
            } else {
                ids.into_iter().collect()
            };
            let twice = ids[dup_of.index(ids.len())];
            ids.push(twice);
            let tasks: Vec<_> = ids
                .iter()
                .zip(&statuses)
                .map(|(&id, &s)| (s, 0, 0, id))
                .collect();
            let tasks_ok = &tasks[..tasks.len() - 1];
            prop_assert!(order_of(tasks_ok, &[7]).is_ok());
            prop_assert_eq!(order_of(&tasks, &[7]), Err(twice));
        }
    }

    #[test]
    fn ids_at_both_ends_of_the_range_are_checked_without_overflow() {
        // A damaged file may hold any id: the span of 0 and u64::MAX must not wrap.
        let far = [(0, 0, 0, 0), (0, 0, 0, u64::MAX)];
        assert_eq!(order_of(&far, &[1]), Ok(vec![0, 1]));
        let twice = [(0, 0, 0, u64::MAX), (2, 0, 0, 0), (3, 0, 0, u64::MAX)];
        assert_eq!(order_of(&twice, &[2]), Err(u64::MAX));
        // Dense at the top of the range: the bitmap, its last word included.
        let top: Vec<_> = (0..130).map(|i| (0, 0, 0, u64::MAX - i)).collect();
        assert!(order_of(&top, &[10]).is_ok());
        let mut top_twice = top.clone();
        top_twice.push((1, 0, 0, u64::MAX - 129));
        assert_eq!(order_of(&top_twice, &[10]), Err(u64::MAX - 129));
    }

    #[test]
    fn runs_are_merged_as_a_binary_counter_so_few_are_left() {
        let mut o = ListOrder::with_capacity(0);
        // Ids descending: every run must be merged, none is in order already.
        let mut id = 1 << 20;
        for _ in 0..1000 {
            for _ in 0..10 {
                o.task(id, Status::Ready, 0, 0);
                id -= 1;
            }
            o.end_run();
            assert!(o.by[0].starts.len() <= 11, "{} runs", o.by[0].starts.len());
        }
        let order = o.finish().expect("distinct");
        assert_eq!(order.len(), 10_000);
        assert!(
            order.windows(2).all(|w| w[0] > w[1]),
            "ids ascend: ordinals descend"
        );
    }

    #[test]
    fn a_merge_interleaves_two_runs_and_skips_runs_already_in_order() {
        let mut scratch = Vec::new();
        let mut v = [2, 5, 9, 1, 3, 4, 10];
        merge(&mut v, 3, &mut scratch);
        assert_eq!(v, [1, 2, 3, 4, 5, 9, 10]);
        assert_eq!(scratch.len(), 3);
        scratch.clear();
        let mut ordered = [1, 2, 3, 4];
        merge(&mut ordered, 2, &mut scratch);
        assert_eq!(ordered, [1, 2, 3, 4]);
        assert!(scratch.is_empty(), "runs in order: nothing copied");
    }
}
