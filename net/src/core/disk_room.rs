//! How many bytes of WAL records a command can write at most, so the journal reserves that
//! room on the disk before the command runs (`Journal::admit_change`): a change the disk has
//! no room for is refused at once rather than applied and left waiting for room. The bound
//! comes from what the request carries (its payload, so its frame size bounds it; a count)
//! and, for a change that logs a whole task it does not carry (touch, release with options,
//! bury with a priority) or many tasks (kick, release_all), from the queue, in O(1) or one
//! lookup. Record sizes are `tarq_wal::room`'s; what a change logs beside its own records (the
//! take a parked consumer makes of a task it freed) is in its slack. A debug build checks, after
//! every change `execute` runs, that it logged no more than this (so every test that runs a
//! server checks the bounds of the commands it sends).

use tarq_engine::TaskId;
use tarq_wal::room::{
    task_record_bytes, CHANGE_SLACK_BYTES, DEDUP_RECORD_BYTES, SMALL_RECORD_BYTES,
    TUBE_RECORD_BYTES,
};

use super::{Command, Core};

/// A task a change frees may be taken by a parked consumer in the same turn: its status
/// record, and the freed task's own.
const PER_FREED_TASK_BYTES: u64 = 2 * SMALL_RECORD_BYTES;

impl<R> Core<R> {
    /// The most bytes of records `cmd` can add to the turn's batch. Computed whatever the
    /// journal (one that keeps no records ignores it): asking it first costs the hot path a
    /// call more than the bound of a put does. The put and the ack are answered here, inline;
    /// the rest out of line.
    #[inline]
    pub(crate) fn record_bound(&self, cmd: &Command<'_>) -> u64 {
        CHANGE_SLACK_BYTES
            + match *cmd {
                Command::Put { data, .. } => task_record_bytes(data.len()),
                Command::PutIn { data, .. } => task_record_bytes(data.len()) + DEDUP_RECORD_BYTES,
                // One status or removal record, within the slack.
                Command::Ack { .. } | Command::Delete { .. } => 0,
                _ => self.rarer_record_bound(cmd),
            }
    }

    /// [`record_bound`](Self::record_bound) beyond the slack, for the commands off the
    /// put → take → ack path.
    #[inline(never)]
    fn rarer_record_bound(&self, cmd: &Command<'_>) -> u64 {
        let q = &self.queue;
        let task = |id: TaskId| q.get(id).map_or(0, |t| task_record_bytes(t.data.len()));
        let tube_stats = |tube| q.tube_stats(tube).unwrap_or_default();
        match *cmd {
            Command::Release { id, opts, .. } if opts.pri.is_some() || opts.ttl.is_some() => {
                task(id)
            }
            Command::Touch { id, .. } | Command::BuryTaken { id, .. } => task(id),
            Command::Kick { tube, count } | Command::KickAny { tube, count } => {
                let s = tube_stats(tube);
                count.min(s.buried + s.waiting) * PER_FREED_TASK_BYTES
            }
            Command::ReleaseAll { tube } => tube_stats(tube).taken * PER_FREED_TASK_BYTES,
            Command::CreateTube { .. } | Command::DropTube { .. } | Command::Truncate { .. } => {
                TUBE_RECORD_BYTES
            }
            // The whole table is logged: as it is, with the new user beside it.
            Command::PutUser { user } => {
                users_record_bytes(q.users().iter()) + users_record_bytes(std::iter::once(user))
            }
            Command::DropUser { .. } => users_record_bytes(q.users().iter()),
            // One status record (bury, kick-job, reserve-job, release), within the slack.
            _ => 0,
        }
    }
}

/// The largest a `Users` record of these users can be: per user its name, flags, hash and
/// grant count and own limits, per grant its tube name and rights (as
/// `tarq_wal::format::encode_users`).
fn users_record_bytes<'u>(users: impl Iterator<Item = &'u tarq_engine::User>) -> u64 {
    users
        .map(|u| {
            let grants: usize = u.tubes.keys().map(|t| 2 + t.len() + 1).sum();
            (2 + u.name.len() + 1 + 20 + 8 + 2 + grants) as u64
        })
        .sum::<u64>()
        + 4
}
