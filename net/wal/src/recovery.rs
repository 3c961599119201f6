//! Recovery: the newest valid snapshot, then every WAL turn after it, into a fresh `Queue`.
//!
//! The WAL is read turn by turn (a `Commit` record closes each): a turn is applied whole or not
//! at all. Damage is judged by what follows it and by what it looks like. In the last segment,
//! damage followed by no valid `Commit` that looks like a torn write — the file ends inside
//! the record, or a sector of it reads as zeros, as a power loss leaves a page the file's size
//! already counted — is the turn being written when the process or the machine died, never
//! acknowledged: it is cut and logged. Any other damage is corruption: a whole record failing
//! its checksum (a bit flip, even in the last turn, which was acknowledged), or damage followed
//! by a valid turn. The start stops with an error naming the file and the offset, unless
//! `--force-recovery`, which skips to the next valid record and logs what was lost. Damage in
//! records the snapshot covers whole loses nothing and is only logged (so the start after a
//! `--force-recovery`, whose snapshot covers the damage it skipped, is a clean one).
//! A segment's tail from the next segment's first sequence number on is ignored: after a
//! failed write the WAL rewrites the turns that were not yet durable into a new segment.
//!
//! A snapshot that does not load is passed over for the next older one (its WAL is kept); with
//! none left, the WAL must reach back to its first record, or the start stops naming the
//! snapshots and what is wrong with each.
//!
//! Recovery only reads; cutting the torn tail and setting damaged snapshots aside
//! (`damage`) is `Wal::open`'s job.

use std::sync::mpsc;
use std::time::{Duration, Instant};

use tarq_engine::Queue;

use super::format::{
    self, Change, Frame, HeaderError, Kind, StoredTask, FILE_HEADER_LEN, RECORD_MARKER,
    SNAP_SUFFIX, WAL_SUFFIX,
};
use super::snapshot;
use super::storage::{read_all, Storage};
use super::WalError;

/// A torn tail found at the end of the last segment.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TornTail {
    pub file: String,
    /// Where the last complete turn ends: the file is cut here.
    pub offset: u64,
    /// Bytes after `offset`.
    pub bytes: u64,
}

/// A snapshot that did not load, and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DamagedSnapshot {
    pub file: String,
    /// What is wrong, and at which offset.
    pub reason: String,
}

/// What recovery found and did.
#[derive(Clone, Debug, Default)]
pub struct RecoveryReport {
    pub snapshot: Option<String>,
    /// Newer snapshots than the one loaded that did not load (set aside by `Wal::open`).
    pub damaged_snapshots: Vec<DamagedSnapshot>,
    /// A replica's damaged log, moved aside so that it copies its primary again.
    pub set_aside: Option<crate::damage::SetAside>,
    pub snapshot_tasks: u64,
    pub segments: usize,
    pub records: u64,
    pub turns: u64,
    pub torn: Option<TornTail>,
    /// What `--force-recovery` skipped, one line each.
    pub lost: Vec<String>,
    /// Tasks that were taken and came back ready.
    pub released: usize,
    /// Size of the snapshot loaded: the trigger weighs the WAL against it.
    pub snapshot_bytes: u64,
    /// Bytes of WAL records after the snapshot's position: the WAL written since it, counted
    /// from the files, so the snapshot trigger survives restarts.
    pub wal_bytes_since_snapshot: u64,
    /// Time spent loading the snapshot (the rest of `elapsed` is the WAL).
    pub snapshot_load: Duration,
    /// The last complete turn applied (the snapshot's start when no WAL follows it): where a
    /// replica resumes its primary's stream.
    pub last_commit: u64,
    /// Records up to here may meet a task in a later state than they expect (the snapshot's
    /// end): a replica applies the stream up to it as recovery does.
    pub fuzzy_upto: u64,
    /// The terms of the records kept and the log's history id.
    pub terms: crate::terms::Terms,
    /// A file read was written in an older format version: a snapshot soon holds the state
    /// in the current one (and a relay can stream the WAL after it, which it does only from
    /// segments of the current version).
    pub older_format: bool,
    pub elapsed: Duration,
}

pub struct Recovered {
    pub queue: Queue,
    /// The last WAL sequence number in use: the next record gets `last_seq + 1`.
    pub last_seq: u64,
    pub report: RecoveryReport,
}

struct Pending {
    seq: u64,
    offset: usize,
    change: Change,
}

/// A damaged region and what follows it.
struct Scan {
    /// The next valid record after the damage (its offset), if any.
    resume: Option<usize>,
    /// A valid `Commit` follows the damage: complete turns were written after it.
    commit_follows: bool,
}

fn scan_after(buf: &[u8], from: usize, prev_seq: u64) -> Scan {
    let marker = RECORD_MARKER.to_le_bytes();
    let mut scan = Scan {
        resume: None,
        commit_follows: false,
    };
    let mut p = from;
    while p + format::RECORD_HEADER_LEN <= buf.len() {
        if buf[p..p + 4] != marker {
            p += 1;
            continue;
        }
        match format::parse_record(buf, p) {
            Ok(rec) if rec.seq > prev_seq => {
                scan.resume.get_or_insert(p);
                if rec.kind == Kind::Commit {
                    scan.commit_follows = true;
                    return scan;
                }
                p = rec.end;
            }
            _ => p += 1,
        }
    }
    scan
}

/// The unit a disk writes whole: a power loss leaves each sector of a write old or new.
const SECTOR: usize = 512;

/// Whether damage at `off` with no valid turn after it looks like a write the process or the
/// machine did not finish, rather than a record that rotted after it was written: the file ends
/// inside the record (and not because its length field alone is damaged); or a sector of the
/// damaged record reads as zeros — the page of a write lost with the power, which the file's
/// size already counted (etcd's rule for its WAL's torn entries); or only zeros follow it — a
/// write cut short in a file whose length was set ahead of it. A whole record failing its
/// checksum at the end of the file is damage, even in the last turn: that turn was
/// acknowledged.
fn looks_torn(buf: &[u8], off: usize) -> bool {
    if let Err(Frame::Incomplete) = format::parse_record(buf, off) {
        return !format::whole_record_to_end(buf, off);
    }
    let end = damaged_span_end(buf, off);
    let after = &buf[end..];
    (!after.is_empty() && after.iter().all(|&b| b == 0)) || has_zeroed_sector(buf, off, end)
}

/// Where the damaged record at `off` ends: as its header says when that is sound and fits the
/// file, else at the end of the file.
fn damaged_span_end(buf: &[u8], off: usize) -> usize {
    let header = &buf[off..(off + format::RECORD_HEADER_LEN).min(buf.len())];
    if header.len() < format::RECORD_HEADER_LEN || header[0..4] != RECORD_MARKER.to_le_bytes() {
        return buf.len();
    }
    let len = u32::from_le_bytes(header[4..8].try_into().expect("4 bytes")) as usize;
    (off + format::RECORD_HEADER_LEN)
        .checked_add(len)
        .filter(|&end| end <= buf.len())
        .unwrap_or(buf.len())
}

/// Whether a sector's share of `buf[from..to]` is all zeros.
fn has_zeroed_sector(buf: &[u8], from: usize, to: usize) -> bool {
    let mut a = from;
    while a < to {
        let b = ((a / SECTOR + 1) * SECTOR).min(to);
        if buf[a..b].iter().all(|&x| x == 0) {
            return true;
        }
        a = b;
    }
    false
}

struct Replay {
    force: bool,
    queue: Queue,
    report: RecoveryReport,
    /// The snapshot's position: records up to it are skipped.
    start: u64,
    /// Records up to here may meet a task in a later state than they expect: the snapshot walk
    /// captured it after they were written.
    fuzzy_upto: u64,
    /// The segment being read.
    file: String,
    /// The last sequence number read.
    prev_seq: u64,
    /// The last turn applied.
    last_commit: u64,
    /// Terms of the turns read (covered by the snapshot or not).
    terms: crate::terms::Terms,
    /// The first record of the turn being read.
    turn_first: Option<u64>,
}

impl Replay {
    /// Reports damage: an error, or under --force-recovery a line in the report.
    fn damage(&mut self, offset: usize, reason: String, lost: String) -> Result<(), WalError> {
        if !self.force {
            return Err(WalError::Corrupt {
                file: self.file.clone(),
                offset: offset as u64,
                reason,
            });
        }
        let line = format!("{} at offset {offset}: {reason}; {lost}", self.file);
        tracing::warn!("--force-recovery: {line}");
        self.report.lost.push(line);
        Ok(())
    }

    /// Damage whose records, up to `upto`, the snapshot holds: nothing is lost, so the start
    /// goes on (the segment goes with the next snapshot's clean-up). Logged, since the disk
    /// that rotted here may rot elsewhere.
    fn covered_damage(&mut self, offset: usize, problem: &str, upto: u64) {
        tracing::warn!(
            file = %self.file,
            offset,
            "WAL damaged in records the snapshot holds ({problem}); nothing is lost"
        );
        self.prev_seq = self.prev_seq.max(upto);
    }

    /// No snapshot loaded, though there were some: the state they held must come from the WAL.
    fn snapshots_lost(&self) -> bool {
        self.report.snapshot.is_none() && !self.report.damaged_snapshots.is_empty()
    }

    /// Every snapshot is damaged and the WAL starts after record 1 (`wal_first`) or is absent:
    /// the tasks the snapshots held are in no file. An error, or under --force-recovery a
    /// line in the report and an empty start.
    fn every_snapshot_damaged(&mut self, wal_first: Option<u64>) -> Result<(), WalError> {
        let snapshots = self
            .report
            .damaged_snapshots
            .iter()
            .map(|d| format!("{} {}", d.file, d.reason))
            .collect::<Vec<_>>()
            .join("; ");
        if !self.force {
            return Err(WalError::SnapshotsDamaged {
                snapshots,
                wal_first,
            });
        }
        let lost = match wal_first {
            Some(s) => format!("what they held before record {s} is lost"),
            None => "all they held is lost".to_owned(),
        };
        let line = format!("every snapshot is damaged ({snapshots}); {lost}");
        tracing::warn!("--force-recovery: {line}");
        self.report.lost.push(line);
        Ok(())
    }

    fn apply(&mut self, turn: Vec<Pending>) -> Result<(), WalError> {
        self.report.turns += 1;
        for p in turn {
            self.report.records += 1;
            let fuzzy = p.seq <= self.fuzzy_upto;
            if let Some(reason) = self.apply_one(p.change, fuzzy) {
                self.damage(
                    p.offset,
                    format!(
                        "record {} does not fit the state before it: {reason}",
                        p.seq
                    ),
                    "the record was skipped".into(),
                )?;
            }
        }
        Ok(())
    }

    fn apply_one(&mut self, change: Change, fuzzy: bool) -> Option<String> {
        apply_change(&mut self.queue, change, fuzzy)
    }
}

/// Applies one WAL change to `q` through the engine's silent restore calls (recovery, and a
/// replica applying its primary's stream); returns what does not fit the state before it. In
/// the fuzzy window (records up to a snapshot's end) a record may meet a task in a later state:
/// the snapshot walk captured it after the record was written. Each tube's numbering rises
/// past the ids restored in it (`restore_in`, `restore_dedup`) and the ids `Spent` records
/// name, and only its: a tube at the index of a dropped one keeps its own.
pub fn apply_change(q: &mut Queue, change: Change, fuzzy: bool) -> Option<String> {
    match change {
        // A put in the window whose task is present: the walk captured the task after this
        // put, in the same state or a later one, and every change since is a record after
        // this one. Status records set status, runat and deliveries absolutely, and a Replace
        // (the only other change to a task's fields) is replayed as one, so keeping the
        // captured task lands on the same final state as putting it back — without taking it
        // out of its list and searching its place again (a put behind a list's tail is a
        // search: ~1 µs a task, most of the replay after a snapshot taken while puts poured
        // in).
        Change::Put(t) if fuzzy && q.get(t.task.id).is_some() => None,
        Change::Replace(t) => {
            let id = t.task.id;
            if q.get(id).is_some() {
                q.restore_remove(id);
            }
            restore(q, t)
        }
        Change::Put(t) => restore(q, t),
        Change::Status {
            id,
            status,
            runat,
            deliveries,
            counts,
        } => {
            let r = q
                .restore_status(id, status, runat)
                .and_then(|()| match deliveries {
                    Some(d) => q.restore_deliveries(id, d),
                    None => Ok(()),
                })
                .and_then(|()| match counts {
                    Some(c) => q.restore_counts(id, c),
                    None => Ok(()),
                });
            match r {
                Err(_) if fuzzy => None,
                r => r
                    .err()
                    .map(|e| format!("status {} of task {id}: {e}", status.as_str())),
            }
        }
        Change::Remove { id } => match q.restore_remove(id) {
            None if !fuzzy => Some(format!("removal of task {id}: no such task")),
            _ => None,
        },
        Change::TubeCreate(t) => q
            .restore_tube(t.ix, &t.name, t.kind, t.opts, t.numbers)
            .err()
            .map(|e| format!("creation of tube {} {:?}: {e}", t.ix, t.name)),
        Change::TubeDrop(ix) => q
            .restore_drop_tube(ix)
            .err()
            .map(|e| format!("drop of tube {ix}: {e}")),
        Change::TubeTruncate(ix) => q
            .restore_truncate(ix)
            .err()
            .map(|e| format!("truncation of tube {ix}: {e}")),
        Change::Dedup(d) => q
            .restore_dedup(d.tube, &d.key, d.id, d.expires)
            .err()
            .map(|e| format!("dedup key of tube {}: {e}", d.tube)),
        Change::Spent { id } => {
            q.set_last_id(id);
            None
        }
        Change::Users(users) => {
            q.restore_users(users);
            None
        }
        Change::Counts(entries) => {
            let mut why = None;
            for e in entries {
                match e.tube {
                    None => q.restore_retired(&e.counts),
                    Some(tube) => {
                        if let Err(err) = q.restore_ops(tube, &e.counts) {
                            why.get_or_insert(format!("counters of tube {tube}: {err}"));
                        }
                    }
                }
            }
            why.filter(|_| !fuzzy)
        }
        Change::Commit { .. } => None,
    }
}

fn restore(q: &mut Queue, t: StoredTask) -> Option<String> {
    let (id, tube, counts) = (t.task.id, t.tube, t.counts);
    q.restore_in(tube, t.task, t.utube.as_deref(), t.deliveries)
        .and_then(|()| {
            if counts.is_zero() {
                Ok(())
            } else {
                q.restore_counts(id, counts)
            }
        })
        .err()
        .map(|e| format!("task {id} in tube {tube}: {e}"))
}

/// Rebuilds the queue from `storage`. `force` skips damage in the middle of the log.
/// `keep_taken` leaves taken tasks taken (a replica: its primary still holds them); otherwise
/// they come back ready, as no session survives a restart.
pub fn recover(
    storage: &dyn Storage,
    force: bool,
    keep_taken: bool,
) -> Result<Recovered, WalError> {
    let t0 = Instant::now();
    let names = storage
        .list()
        .map_err(|e| WalError::io("listing the data directory", e))?;
    let mut snaps: Vec<(u64, &String)> = names
        .iter()
        .filter_map(|n| Some((format::parse_name(n, SNAP_SUFFIX)?, n)))
        .collect();
    snaps.sort_unstable_by(|a, b| b.cmp(a));
    let mut segs: Vec<(u64, &String)> = names
        .iter()
        .filter_map(|n| Some((format::parse_name(n, WAL_SUFFIX)?, n)))
        .collect();
    segs.sort_unstable();

    let mut report = RecoveryReport::default();
    let base = load_newest_snapshot(storage, &snaps, &mut report)?;
    report.snapshot_load = t0.elapsed();
    let mut r = Replay {
        force,
        queue: base.queue,
        report,
        start: base.start,
        fuzzy_upto: base.fuzzy_upto,
        file: String::new(),
        prev_seq: base.start,
        last_commit: base.start,
        terms: Default::default(),
        turn_first: None,
    };
    r.replay_segments(storage, &segs)?;

    let mut queue = r.queue;
    r.report.last_commit = r.last_commit;
    r.report.fuzzy_upto = base.fuzzy_upto;
    r.report.terms = if r.report.snapshot.is_some() {
        r.terms.after_snapshot(base.start, base.term, base.history)
    } else {
        r.terms
    };
    if !keep_taken {
        r.report.released = queue.release_all_taken();
    }
    queue.drain_events().for_each(drop);
    #[cfg(debug_assertions)]
    queue.check_invariants();
    r.report.elapsed = t0.elapsed();
    Ok(Recovered {
        queue,
        last_seq: r.last_commit.max(base.fuzzy_upto),
        report: r.report,
    })
}

/// Where replay starts: the newest snapshot that loads whole, or an empty queue.
struct Base {
    queue: Queue,
    /// The snapshot's WAL position: replay applies records after it.
    start: u64,
    fuzzy_upto: u64,
    /// The term of the record at `start` and the log's history id.
    term: u64,
    history: u64,
}

fn load_newest_snapshot(
    storage: &dyn Storage,
    snaps: &[(u64, &String)],
    report: &mut RecoveryReport,
) -> Result<Base, WalError> {
    for (_, name) in snaps {
        match snapshot::load(storage, name) {
            Ok((q, l)) => {
                tracing::info!(file = %name, tasks = l.tasks, "snapshot loaded");
                report.snapshot = Some((*name).clone());
                report.snapshot_tasks = l.tasks;
                report.snapshot_bytes = l.bytes;
                report.older_format |= l.version < format::FORMAT_VERSION;
                return Ok(Base {
                    queue: q,
                    start: l.start_seq,
                    fuzzy_upto: l.end_seq,
                    term: l.term,
                    history: l.history,
                });
            }
            // A format this build does not read is not damage: an older snapshot and the WAL
            // after it would be read as if the newer one had never been written.
            Err(snapshot::LoadError::Version(version)) => {
                return Err(WalError::UnsupportedFormat {
                    file: (*name).clone(),
                    version,
                })
            }
            Err(snapshot::LoadError::Damaged(e)) => {
                tracing::warn!(file = %name, "snapshot unusable, trying an older one: {e}");
                report.damaged_snapshots.push(DamagedSnapshot {
                    file: (*name).clone(),
                    reason: e,
                });
            }
        }
    }
    if !snaps.is_empty() {
        tracing::warn!("no usable snapshot: replaying the WAL from its beginning");
    }
    Ok(Base {
        queue: Queue::new(),
        start: 0,
        fuzzy_upto: 0,
        term: 0,
        history: 0,
    })
}

/// How the records of one segment ended.
struct SegmentEnd {
    /// Where the last complete turn ends.
    turn_end: usize,
    /// Records of a turn with no `Commit` after them.
    open_turn: usize,
    /// The rest of the file is superseded by the next segment (a rewrite after a failed write).
    superseded: bool,
}

impl Replay {
    fn replay_segments(
        &mut self,
        storage: &dyn Storage,
        segs: &[(u64, &String)],
    ) -> Result<(), WalError> {
        let start = self.start;
        let first = segs.iter().rposition(|(s, _)| *s <= start + 1).unwrap_or(0);
        let wal_first = segs.get(first).map(|s| s.0);
        if self.snapshots_lost() && wal_first.is_none_or(|s| s > 1) {
            self.every_snapshot_damaged(wal_first)?;
        }
        if let Some(&(s, name)) = segs.get(first) {
            if s > start + 1 {
                self.file = name.clone();
                self.damage(
                    0,
                    format!(
                        "the WAL starts at record {s}, but the snapshot covers only up to {start}"
                    ),
                    format!("records {}..{} are lost", start + 1, s - 1),
                )?;
            }
            // Sequence numbers start at 1; a segment named 0 holds nothing before its first record.
            self.prev_seq = s.saturating_sub(1);
        }
        // A second thread reads the next segment while this one replays the current one: a
        // 64 MiB read is ~65 ms of copying and page faults that would otherwise come between
        // two segments' replays. One segment ahead at most.
        let names: Vec<&str> = segs
            .get(first..)
            .unwrap_or_default()
            .iter()
            .map(|s| s.1.as_str())
            .collect();
        std::thread::scope(|scope| {
            let (tx, rx) = mpsc::sync_channel(0);
            std::thread::Builder::new()
                .name("tarq-wal-read".into())
                .spawn_scoped(scope, move || {
                    for name in names {
                        // The receiver gone (replay stopped early): nothing more to read.
                        if tx.send(read_all(storage, name)).is_err() {
                            break;
                        }
                    }
                })
                .map_err(|e| WalError::io("starting the WAL reader", e))?;
            for i in first..segs.len() {
                let (hdr_seq, name) = segs[i];
                let buf = rx
                    .recv()
                    .map_err(|_| {
                        WalError::io(
                            format!("reading {name}"),
                            std::io::ErrorKind::BrokenPipe.into(),
                        )
                    })?
                    .map_err(|e| WalError::io(format!("reading {name}"), e))?;
                let last = i + 1 == segs.len();
                let next_first = segs.get(i + 1).map(|s| s.0);
                if self.segment(&buf, name, hdr_seq, last, next_first)? {
                    break;
                }
            }
            Ok(())
        })
    }

    /// Replays one segment, `buf` its bytes; `true` when recovery must stop here (a torn
    /// file creation).
    fn segment(
        &mut self,
        buf: &[u8],
        name: &str,
        hdr_seq: u64,
        last: bool,
        next_first: Option<u64>,
    ) -> Result<bool, WalError> {
        self.file = name.to_owned();
        self.report.segments += 1;
        let version = match format::parse_file_header(buf, format::WAL_MAGIC) {
            Ok(h) if h.seq == hdr_seq => {
                self.report.older_format |= h.version < format::FORMAT_VERSION;
                h.version
            }
            Ok(h) => {
                let seq = h.seq;
                self.damage(
                    0,
                    format!("header says record {seq}, the name says {hdr_seq}"),
                    "file skipped".into(),
                )?;
                return Ok(false);
            }
            Err(HeaderError::Version(version)) => {
                return Err(WalError::UnsupportedFormat {
                    file: name.to_owned(),
                    version,
                })
            }
            Err(_) if last && buf.len() < FILE_HEADER_LEN => {
                // The segment was being created when the process died.
                self.report.torn = Some(TornTail {
                    file: name.to_owned(),
                    offset: 0,
                    bytes: buf.len() as u64,
                });
                return Ok(true);
            }
            Err(HeaderError::Damaged(e)) => {
                match next_first.map(|nf| nf.saturating_sub(1)) {
                    Some(upto) if upto <= self.start => self.covered_damage(0, &e, upto),
                    _ => self.damage(0, e, "file skipped".into())?,
                }
                return Ok(false);
            }
        };
        if hdr_seq > self.prev_seq + 1 && hdr_seq - 1 <= self.start {
            // Records only the snapshot needed were lost with a damaged file before this one.
            self.prev_seq = hdr_seq - 1;
        }
        if hdr_seq > self.prev_seq + 1 {
            let (from, to) = (self.prev_seq + 1, hdr_seq - 1);
            self.damage(
                0,
                format!("records {from}..{to} are missing before this file"),
                "they are lost".into(),
            )?;
        }
        self.prev_seq = hdr_seq.saturating_sub(1);
        let end = self.records(buf, version, last, next_first)?;
        if end.superseded || end.turn_end >= buf.len() {
            return Ok(false);
        }
        if last {
            let torn = TornTail {
                file: name.to_owned(),
                offset: end.turn_end as u64,
                bytes: (buf.len() - end.turn_end) as u64,
            };
            tracing::warn!(file = %torn.file, offset = torn.offset, bytes = torn.bytes, "WAL torn tail: the last turn was never completed; cutting it");
            self.report.torn = Some(torn);
        } else if end.open_turn > 0 {
            self.damage(
                end.turn_end,
                "the file ends inside a turn".into(),
                format!("{} records dropped", end.open_turn),
            )?;
        }
        Ok(false)
    }

    /// Replays the records of a segment turn by turn, judging damage by what follows it.
    fn records(
        &mut self,
        buf: &[u8],
        version: u32,
        last: bool,
        next_first: Option<u64>,
    ) -> Result<SegmentEnd, WalError> {
        let mut off = FILE_HEADER_LEN;
        let mut end = SegmentEnd {
            turn_end: off,
            open_turn: 0,
            superseded: false,
        };
        let mut turn: Vec<Pending> = Vec::new();
        while off < buf.len() {
            let problem = match format::parse_record(buf, off) {
                Ok(rec) if next_first.is_some_and(|nf| rec.seq >= nf) => {
                    end.superseded = true;
                    return Ok(end);
                }
                Ok(rec) if rec.seq != self.prev_seq + 1 => {
                    format!("record {} where {} was due", rec.seq, self.prev_seq + 1)
                }
                Ok(rec) => {
                    let at = off;
                    self.prev_seq = rec.seq;
                    off = rec.end;
                    let first = *self.turn_first.get_or_insert(rec.seq);
                    if rec.kind == Kind::Commit {
                        self.turn_first = None;
                        if let Ok(Change::Commit { term, history }) =
                            format::decode_change(rec.kind, rec.body, version)
                        {
                            self.terms.note(term, first, history);
                        }
                    }
                    if rec.seq <= self.start {
                        // Covered by the snapshot. Its turns are complete all the same: a
                        // Commit here moves the end of the valid log, or a clean segment the
                        // snapshot covers would look torn and be cut.
                        if rec.kind == Kind::Commit {
                            end.turn_end = off;
                        }
                        continue;
                    }
                    self.report.wal_bytes_since_snapshot += (rec.end - at) as u64;
                    match format::decode_change(rec.kind, rec.body, version) {
                        Ok(Change::Commit { .. }) => {
                            self.apply(std::mem::take(&mut turn))?;
                            self.last_commit = rec.seq;
                            end.turn_end = off;
                        }
                        Ok(change) => turn.push(Pending {
                            seq: rec.seq,
                            offset: at,
                            change,
                        }),
                        Err(e) => self.damage(
                            at,
                            format!("record {}: {e}", rec.seq),
                            "the record was skipped".into(),
                        )?,
                    }
                    continue;
                }
                Err(Frame::Incomplete) if format::whole_record_to_end(buf, off) => {
                    "the record's length field is damaged (the record is whole)".to_owned()
                }
                Err(Frame::Incomplete) => "record cut short".to_owned(),
                Err(Frame::Bad(why)) => why,
            };
            // Damage at `off`.
            if next_first.is_some_and(|nf| self.prev_seq + 1 >= nf) {
                end.superseded = true;
                return Ok(end);
            }
            let scan = scan_after(buf, off + 1, self.prev_seq);
            let tail = last && !scan.commit_follows;
            if tail && looks_torn(buf, off) {
                break; // a torn tail: the caller cuts it
            }
            let problem = if tail {
                format!(
                    "{problem}, in a record of the last turn that is whole on disk (a torn \
                     write leaves a record short or zeroed): the turn may have been acknowledged"
                )
            } else {
                problem
            };
            off = self.skip_damage(buf, off, problem, scan.resume, next_first)?;
            if scan.resume.is_none() {
                turn.clear();
                self.turn_first = None;
                end.turn_end = off;
            }
        }
        end.open_turn = turn.len();
        Ok(end)
    }

    /// Damage at `off` with complete turns after it (or in a segment that is not the last):
    /// an error, or under --force-recovery the offset to go on from.
    fn skip_damage(
        &mut self,
        buf: &[u8],
        off: usize,
        problem: String,
        resume: Option<usize>,
        next_first: Option<u64>,
    ) -> Result<usize, WalError> {
        let next = resume.map(|p| {
            format::parse_record(buf, p)
                .expect("scan found a valid record")
                .seq
        });
        if let Some(upto) = next.or(next_first).map(|n| n.saturating_sub(1)) {
            if upto <= self.start {
                self.covered_damage(off, &problem, upto);
                return Ok(resume.unwrap_or(buf.len()));
            }
        }
        match resume {
            Some(p) => {
                let next = next.expect("a record was found");
                let lost = format!(
                    "{} bytes skipped, records {}..{} lost",
                    p - off,
                    self.prev_seq + 1,
                    next.saturating_sub(1)
                );
                self.damage(off, problem, lost)?;
                self.prev_seq = next.saturating_sub(1);
                Ok(p)
            }
            None => {
                let upto = next_first.map_or("the end".to_owned(), |nf| (nf - 1).to_string());
                let lost = format!("records {}..{upto} lost", self.prev_seq + 1);
                self.damage(off, problem, lost)?;
                Ok(buf.len())
            }
        }
    }
}
