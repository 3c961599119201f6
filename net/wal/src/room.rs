//! Room on the disk for what the WAL accepts. The current segment is allocated ahead of its
//! written end (`StorageFile::allocate`: `fallocate` with `FALLOC_FL_KEEP_SIZE`, so the file's
//! length stays what was written and every reader — recovery, relays, replicas — sees no
//! difference), and before a change runs, [`Wal::reserve`] makes sure that the bytes its
//! records can take, everything the open turn holds so far, the turn's `Commit` and
//! [`TAKE_RESERVE_BYTES`] fit in what is allocated, growing the allocation when they do not.
//! When the disk cannot give that room the change is refused at once, before the queue
//! changes ("WAL write failed: No space left on device"), and every later change too until a
//! retry (`RETRY_INTERVAL`) finds room: no turn holding a change can then meet a full disk,
//! so no reply waits on one. Takes and timers are not refused: their records use the reserve,
//! and past it they end in the failed state (`Wal::fail`) whose records wait in
//! memory. A take in a turn that already holds a change is the one exception: it is refused
//! rather than let it take that change's room ([`Wal::reserve_take`]).
//!
//! The check runs before every change and take, so its common case is one compare: the WAL
//! keeps a budget (`room_budget`) from the segment's allocation, which every write lowers and
//! every change of the segment, a failure or a full disk sets to 0; past it `reserve_slow`
//! looks at the segment and grows the allocation. `RLIMIT_FSIZE` is the same class of error
//! as a full disk: `fallocate` does not check it, so `FsStorage`'s `allocate` does ("File too
//! large").
//!
//! A filesystem without `fallocate` (`EOPNOTSUPP`, ZFS among them) turns all this off, logged
//! once: a change that meets a full disk there puts the WAL in the failed state, and its
//! reply waits for room. A
//! copy-on-write filesystem that allocates (btrfs) promises less than ext4, XFS or tmpfs: a
//! write into allocated blocks may still meet a full disk, and the failed state takes over
//! (the change's reply waits for room). What a request's records can take is bounded by the
//! functions here, from the sizes the request carries; the server adds them up
//! (`server::disk_room` in `tarq-net`).

use std::io;
use std::time::Instant;

use rustix::io::Errno;

use super::format::{MAX_TASK_OVERHEAD, RECORD_HEADER_LEN};
use super::{describe, format, Segment, Wal, WalError, WalMode, FILE_HEADER_LEN, RETRY_INTERVAL};

/// The segment is allocated this far past what a change needs, when the disk has it: one
/// `fallocate` per 4 MiB of log (some twenty thousand put → take → ack cycles of small
/// tasks), and room a snapshot being written cannot take from the log.
pub const PREALLOC_CHUNK_BYTES: u64 = 4 << 20;
/// Room kept for records that are never refused — takes, promotions, expiries, TTR returns,
/// releases of a closed connection's tasks: about 24,000 of them before their writes meet the
/// full disk themselves.
pub const TAKE_RESERVE_BYTES: u64 = 1 << 20;
/// At least the size of any record but a task's, a tube's or a dedup key's (a status, a
/// removal, a commit, a tube drop or truncate: 24 to 43 bytes), with room for their fields to
/// grow.
pub const SMALL_RECORD_BYTES: u64 = 128;
/// The records a change may add beside its own: a status record for the take a parked
/// consumer makes of the task, a dead-lettering, and slack.
pub const CHANGE_SLACK_BYTES: u64 = 4 * SMALL_RECORD_BYTES;
/// A `Dedup` record at its largest key.
pub const DEDUP_RECORD_BYTES: u64 =
    (RECORD_HEADER_LEN + tarq_engine::MAX_DEDUP_KEY_BYTES) as u64 + SMALL_RECORD_BYTES;
/// A `TubeCreate` record at its longest name.
pub const TUBE_RECORD_BYTES: u64 =
    (RECORD_HEADER_LEN + tarq_engine::MAX_TUBE_NAME_BYTES) as u64 + SMALL_RECORD_BYTES;

/// A `Put` or `Replace` record of a task whose payload has `payload` bytes (its utube key at
/// the longest).
pub fn task_record_bytes(payload: usize) -> u64 {
    (RECORD_HEADER_LEN + MAX_TASK_OVERHEAD + payload) as u64
}

/// The allocation's state beside the segment's own `allocated`.
#[derive(Default)]
pub(crate) struct Room {
    /// The filesystem cannot allocate: changes are admitted without room (a full disk then
    /// meets the write, and the failed state takes over).
    unsupported: bool,
    /// The disk had no room for a change: changes are refused until a retry finds it.
    full: Option<Full>,
    /// Changes (and takes) refused by the WAL since start.
    pub(crate) refusals: u64,
}

pub(crate) struct Full {
    pub(crate) message: String,
    retry_at: Instant,
    /// The room the refused change wanted: a retry must find as much.
    want: u64,
}

impl Room {
    pub(crate) fn full(&self) -> Option<&Full> {
        self.full.as_ref()
    }
}

fn no_room(e: &io::Error) -> bool {
    matches!(
        Errno::from_io_error(e),
        Some(Errno::NOSPC | Errno::DQUOT | Errno::FBIG)
    )
}

fn unsupported(e: &io::Error) -> bool {
    matches!(
        Errno::from_io_error(e),
        Some(Errno::OPNOTSUPP | Errno::NOSYS)
    )
}

impl Wal {
    /// Before a change (put, ack, release, ...) whose records take at most `bytes` (the
    /// bounds above): `Ok` once the room for it is allocated, else `WriteFailed` with the
    /// disk's reason, and the queue must not be touched. Also refuses while the disk fails.
    ///
    /// The common case is one compare against `room_budget`; anything else (the budget
    /// spent, a failing or full disk, no segment) takes the slow path.
    #[inline]
    pub fn reserve(&mut self, bytes: u64) -> Result<(), WalError> {
        if self.fits(bytes) {
            return Ok(());
        }
        self.reserve_slow(bytes)
    }

    /// Whether a change of at most `bytes` of records fits what is known to be allocated
    /// (`reserve`'s fast path, without its side effects: `false` only says to ask `reserve`).
    #[inline]
    pub fn fits(&self, bytes: u64) -> bool {
        (self.pending.bytes() as u64).saturating_add(bytes) <= self.room_budget
    }

    /// Before a take: `Err` only when the open turn holds a change and the take's record
    /// would not fit beside it (the disk is full past the reserve): the change's room is kept.
    #[inline]
    pub fn reserve_take(&mut self) -> Result<(), WalError> {
        if self.take_fits() {
            return Ok(());
        }
        self.reserve_take_slow()
    }

    /// Whether a take's record surely fits (`reserve_take`'s fast path, without its side
    /// effects): the open turn holds no change to keep room for, or the allocation has it.
    #[inline]
    pub fn take_fits(&self) -> bool {
        !self.open_needs_durability
            || (self.room_budget > 0
                && self.pending.bytes() as u64 + 2 * SMALL_RECORD_BYTES
                    <= self.room_budget.saturating_add(TAKE_RESERVE_BYTES))
    }

    #[cold]
    fn reserve_slow(&mut self, bytes: u64) -> Result<(), WalError> {
        if let Err(e) = self.check_writable() {
            self.room.refusals += 1;
            return Err(e);
        }
        if self.cfg.mode == WalMode::None || self.room.unsupported {
            self.room_budget = u64::MAX;
            return Ok(());
        }
        let want = self.unwritten_bytes() + bytes + SMALL_RECORD_BYTES + TAKE_RESERVE_BYTES;
        if !self.allocated_for(want) {
            self.grow(want).inspect_err(|_| self.room.refusals += 1)?;
        }
        self.update_room_budget();
        Ok(())
    }

    #[cold]
    fn reserve_take_slow(&mut self) -> Result<(), WalError> {
        if self.cfg.mode == WalMode::None || self.room.unsupported || self.failed.is_some() {
            return Ok(());
        }
        let want = self.unwritten_bytes() + 2 * SMALL_RECORD_BYTES;
        if self.allocated_for(want) {
            return Ok(());
        }
        self.grow(want).inspect_err(|_| self.room.refusals += 1)
    }

    /// Sets `room_budget` from the segment's allocation: what the pending records may reach
    /// (the records of the turns written but not durable counted again: a bound, not an
    /// exact figure) with a change's bound before the slow path must look; 0 unless the disk
    /// takes changes and a segment is open.
    pub(crate) fn update_room_budget(&mut self) {
        self.room_budget = match &self.segment {
            _ if self.room.unsupported && self.failed.is_none() => u64::MAX,
            Some(s) if self.failed.is_none() && self.room.full.is_none() => s
                .allocated
                .saturating_sub(s.bytes + SMALL_RECORD_BYTES + TAKE_RESERVE_BYTES),
            _ => 0,
        };
    }

    /// Whether `want` bytes past the written end of the current segment are allocated.
    fn allocated_for(&self, want: u64) -> bool {
        self.segment
            .as_ref()
            .is_some_and(|s| s.allocated >= s.bytes + want)
    }

    /// Bytes recorded and not written yet: the open turn's (and, while the disk fails, the
    /// turns waiting for it).
    fn unwritten_bytes(&self) -> u64 {
        self.pending
            .bytes_between(self.unwritten, self.pending.len()) as u64
    }

    /// Allocates `want` bytes past the segment's written end (opening a segment first when
    /// none is open), or enters the full state.
    #[cold]
    fn grow(&mut self, want: u64) -> Result<(), WalError> {
        let result = match self.segment {
            None => self.open_reserved_segment(want),
            Some(_) => self.allocate_ahead(want),
        };
        match result {
            Ok(()) => Ok(()),
            Err(e) if unsupported(&e) => {
                self.room.unsupported = true;
                tracing::warn!(
                    error = %describe(&e),
                    "the filesystem cannot allocate WAL space ahead: a change that meets a full \
                     disk will wait for room instead of being refused"
                );
                Ok(())
            }
            Err(e) => Err(self.enter_full(&e, want)),
        }
    }

    /// Allocates the current segment to its written end plus `want`, and a chunk more when
    /// the disk has it (not past the segment's rotation size unless `want` needs it).
    fn allocate_ahead(&mut self, want: u64) -> io::Result<()> {
        let seg = self.segment.as_mut().expect("a segment is open");
        let needed = seg.bytes + want;
        let cap = self.cfg.segment_bytes.max(needed);
        let mut last = None;
        for extra in [PREALLOC_CHUNK_BYTES, PREALLOC_CHUNK_BYTES / 16, 0] {
            let target = (needed + extra).min(cap);
            if target <= seg.allocated {
                return Ok(());
            }
            match seg.file.allocate(seg.allocated, target - seg.allocated) {
                Ok(()) => {
                    seg.allocated = target;
                    return Ok(());
                }
                Err(e) if no_room(&e) => last = Some(e),
                Err(e) => return Err(e),
            }
        }
        Err(last.expect("an allocation was tried"))
    }

    /// Opens the segment the next turn goes to, allocated for `want` bytes of records, with
    /// its header: a rotation happens between turns, so a new segment is allocated before
    /// a change is admitted into it. On failure no segment is left behind.
    fn open_reserved_segment(&mut self, want: u64) -> io::Result<()> {
        let first = self.open.map_or(self.last_seq + 1, |(_, seq)| seq);
        let name = format::segment_name(first);
        let file = self.storage.create(&name)?;
        self.segment = Some(Segment {
            file: file.clone(),
            name: name.clone(),
            bytes: 0,
            allocated: 0,
        });
        let result = match self.allocate_ahead(FILE_HEADER_LEN as u64 + want) {
            Err(e) if !unsupported(&e) => Err(e),
            allocated => file
                .write_all(&format::file_header(format::WAL_MAGIC, first))
                .and(allocated),
        };
        match &result {
            Err(e) if !unsupported(e) => {
                self.segment = None;
                self.room_budget = 0;
                if let Err(e) = self.storage.remove(&name) {
                    tracing::warn!(file = %name, error = %e, "could not remove a WAL segment with no room");
                }
            }
            _ => {
                self.segment.as_mut().expect("just set").bytes = FILE_HEADER_LEN as u64;
                if let Some(s) = &self.sync {
                    s.set_segment(file);
                }
            }
        }
        result
    }

    fn enter_full(&mut self, e: &io::Error, want: u64) -> WalError {
        let message = describe(e);
        if self.room.full.is_none() {
            tracing::error!(
                error = %message,
                "WAL write failed: no room on the disk for changes; refusing them until there is (takes go on)"
            );
        }
        self.room.full = Some(Full {
            message: message.clone(),
            retry_at: self.clock.now() + RETRY_INTERVAL,
            want,
        });
        self.room_budget = 0;
        WalError::WriteFailed(message)
    }

    /// `poll`'s part: once the retry is due, tries to allocate what the refused change
    /// wanted; on success changes are accepted again.
    pub(crate) fn retry_room(&mut self) {
        let Some(full) = &self.room.full else {
            return;
        };
        if self.clock.now() < full.retry_at || self.failed.is_some() {
            return;
        }
        let want = full.want;
        if self.allocated_for(want) || self.grow(want).is_ok() {
            self.room.full = None;
            tracing::info!("the WAL has room again: accepting changes");
        }
    }

    /// When the retry of a full disk is due (`timeout`).
    pub(crate) fn room_retry_at(&self) -> Option<Instant> {
        self.room.full.as_ref().map(|f| f.retry_at)
    }

    /// Gives back the space allocated past the current segment's end (a rotation, a stop,
    /// an abandoned segment).
    pub(crate) fn trim_segment(seg: &Segment) {
        if seg.allocated > seg.bytes {
            if let Err(e) = seg.file.trim() {
                tracing::warn!(file = %seg.name, error = %e, "could not give back the WAL segment's space allocated ahead");
            }
        }
    }

    /// Bytes allocated past the current segment's written end.
    pub(crate) fn allocated_ahead(&self) -> u64 {
        self.segment
            .as_ref()
            .map_or(0, |s| s.allocated.saturating_sub(s.bytes))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tarq_engine::{Queue, Status, TubeOptions, TubePut, TubeType};

    fn record(kind: format::Kind, body: impl FnOnce(&mut Vec<u8>)) -> u64 {
        let mut buf = Vec::new();
        let at = format::begin_record(&mut buf, 1, kind);
        body(&mut buf);
        format::end_record(&mut buf, at).expect("fits");
        buf.len() as u64
    }

    #[test]
    fn every_record_fits_its_bound() {
        let small = [
            record(format::Kind::Status, |b| {
                let counts = tarq_engine::JobCounts {
                    releases: u16::MAX,
                    buries: u16::MAX,
                    kicks: u16::MAX,
                    timeouts: u16::MAX,
                };
                format::encode_status(b, u64::MAX, Status::Waiting, u64::MAX, u16::MAX, &counts)
            }),
            record(format::Kind::Remove, |b| {
                b.extend_from_slice(&u64::MAX.to_le_bytes())
            }),
            record(format::Kind::Commit, |b| {
                format::encode_commit(b, u64::MAX, u64::MAX)
            }),
            record(format::Kind::TubeDrop, |b| {
                b.extend_from_slice(&u16::MAX.to_le_bytes())
            }),
        ];
        for bytes in small {
            assert!(bytes <= SMALL_RECORD_BYTES, "{bytes}");
        }
        let key = vec![b'k'; tarq_engine::MAX_DEDUP_KEY_BYTES];
        let dedup = record(format::Kind::Dedup, |b| {
            format::encode_dedup(b, u16::MAX, &key, u64::MAX, u64::MAX)
        });
        assert!(dedup <= DEDUP_RECORD_BYTES, "{dedup}");

        let mut q = Queue::new();
        let name = "t".repeat(tarq_engine::MAX_TUBE_NAME_BYTES);
        let opts = TubeOptions {
            ttl: Some(1),
            ttr: Some(1),
            ..TubeOptions::default()
        };
        let tube = q.create_tube(&name, TubeType::UtubeTtl, opts).unwrap();
        let info = q.tube_info(tube).unwrap();
        let created = record(format::Kind::TubeCreate, |b| format::encode_tube(b, &info));
        assert!(created <= TUBE_RECORD_BYTES, "{created}");

        let utube = vec![b'u'; tarq_engine::MAX_UTUBE_KEY_BYTES];
        let payload = vec![7u8; 1000];
        let put = TubePut {
            utube: &utube,
            ttl: Some(10),
            ttr: Some(10),
            ..TubePut::default()
        };
        let id = match q.put_in(1, tube, &payload[..], put).unwrap() {
            tarq_engine::PutOutcome::Created(t) => t.id,
            other => panic!("{other:?}"),
        };
        let t = q.get(id).unwrap();
        let task = record(format::Kind::Put, |b| {
            format::encode_task(b, &t).unwrap();
        });
        assert!(task <= task_record_bytes(payload.len()), "{task}");
    }
}
