//! Recovery: the newest valid snapshot, then every WAL turn after it, into a fresh `Queue`.
//!
//! The WAL is read turn by turn (a `Commit` record closes each): a turn is applied whole or not
//! at all. Damage is judged by what follows it. In the last segment, damage followed by no
//! valid `Commit` is a torn tail — the turn being written when the process or the machine died,
//! never acknowledged — and is cut and logged. Damage followed by a valid turn is corruption in
//! the middle of the log: the start stops with an error naming the file and the offset, unless
//! `--force-recovery`, which skips to the next valid record and logs what was lost.
//! A segment's tail from the next segment's first sequence number on is ignored: after a
//! failed write the WAL rewrites the turns that were not yet durable into a new segment.
//!
//! Recovery only reads; cutting the torn tail is `Wal::open`'s job.

use std::time::{Duration, Instant};

use tarq_engine::{Queue, TaskId};

use super::format::{
    self, Change, Frame, Kind, FILE_HEADER_LEN, RECORD_MARKER, SNAP_SUFFIX, WAL_SUFFIX,
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

/// What recovery found and did.
#[derive(Clone, Debug, Default)]
pub struct RecoveryReport {
    pub snapshot: Option<String>,
    pub snapshot_tasks: u64,
    pub segments: usize,
    pub records: u64,
    pub turns: u64,
    pub torn: Option<TornTail>,
    /// What `--force-recovery` skipped, one line each.
    pub lost: Vec<String>,
    /// Tasks that were taken and came back ready.
    pub released: usize,
    /// Time spent loading the snapshot (the rest of `elapsed` is the WAL).
    pub snapshot_load: Duration,
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

struct Replay<'a> {
    force: bool,
    queue: Queue,
    report: RecoveryReport,
    /// Records up to here may meet a task in a later state than they expect: the snapshot walk
    /// captured it after they were written.
    fuzzy_upto: u64,
    max_id: TaskId,
    file: &'a str,
}

impl Replay<'_> {
    /// Reports damage: an error, or under --force-recovery a line in the report.
    fn damage(&mut self, offset: usize, reason: String, lost: String) -> Result<(), WalError> {
        if !self.force {
            return Err(WalError::Corrupt {
                file: self.file.to_owned(),
                offset: offset as u64,
                reason,
            });
        }
        let line = format!("{} at offset {offset}: {reason}; {lost}", self.file);
        tracing::warn!("--force-recovery: {line}");
        self.report.lost.push(line);
        Ok(())
    }

    fn apply(&mut self, turn: Vec<Pending>) -> Result<(), WalError> {
        self.report.turns += 1;
        for p in turn {
            self.report.records += 1;
            let fuzzy = p.seq <= self.fuzzy_upto;
            let problem = match p.change {
                Change::Put(t) => {
                    let id = t.id;
                    self.max_id = self.max_id.max(id);
                    if fuzzy && self.queue.get(id).is_some() {
                        self.queue.restore_remove(id);
                    }
                    self.queue
                        .restore(t)
                        .err()
                        .map(|e| format!("put of task {id}: {e}"))
                }
                Change::Status { id, status, runat } => {
                    match self.queue.restore_status(id, status, runat) {
                        Err(_) if fuzzy => None,
                        r => r
                            .err()
                            .map(|e| format!("status {} of task {id}: {e}", status.as_str())),
                    }
                }
                Change::Remove { id } => match self.queue.restore_remove(id) {
                    None if !fuzzy => Some(format!("removal of task {id}: no such task")),
                    _ => None,
                },
                Change::Commit => None,
            };
            if let Some(reason) = problem {
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
}

/// Rebuilds the queue from `storage`. `force` skips damage in the middle of the log.
pub fn recover(storage: &dyn Storage, force: bool) -> Result<Recovered, WalError> {
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
    let mut queue = Queue::new();
    let (mut start, mut fuzzy_upto, mut last_id) = (0, 0, 0);
    for (_, name) in &snaps {
        let mut q = Queue::new();
        match snapshot::load(storage, name, &mut q) {
            Ok(l) => {
                tracing::info!(file = %name, tasks = l.tasks, "snapshot loaded");
                queue = q;
                (start, fuzzy_upto, last_id) = (l.start_seq, l.end_seq, l.last_id);
                report.snapshot = Some((*name).clone());
                report.snapshot_tasks = l.tasks;
                break;
            }
            Err(e) => tracing::warn!(file = %name, "snapshot unusable, trying an older one: {e}"),
        }
    }
    if report.snapshot.is_none() && !snaps.is_empty() {
        tracing::warn!("no usable snapshot: replaying the WAL from its beginning");
    }

    report.snapshot_load = t0.elapsed();
    let mut r = Replay {
        force,
        queue,
        report,
        fuzzy_upto,
        max_id: last_id,
        file: "",
    };
    let first = segs.iter().rposition(|(s, _)| *s <= start + 1).unwrap_or(0);
    let mut prev_seq = start;
    let mut last_commit = start;
    if let Some(&(s, name)) = segs.get(first) {
        if s > start + 1 {
            r.file = name;
            r.damage(
                0,
                format!("the WAL starts at record {s}, but the snapshot covers only up to {start}"),
                format!("records {}..{} are lost", start + 1, s - 1),
            )?;
        }
        // Sequence numbers start at 1; a segment named 0 holds nothing before its first record.
        prev_seq = s.saturating_sub(1);
    }
    for i in first..segs.len() {
        let (hdr_seq, name) = segs[i];
        let last = i + 1 == segs.len();
        let next_first = segs.get(i + 1).map(|s| s.0);
        r.file = name;
        r.report.segments += 1;
        let buf =
            read_all(storage, name).map_err(|e| WalError::io(format!("reading {name}"), e))?;
        match format::parse_file_header(&buf, format::WAL_MAGIC) {
            Ok(s) if s == hdr_seq => {}
            Ok(s) => {
                r.damage(
                    0,
                    format!("header says record {s}, the name says {hdr_seq}"),
                    "file skipped".into(),
                )?;
                continue;
            }
            Err(_) if last && buf.len() < FILE_HEADER_LEN => {
                // The segment was being created when the process died.
                r.report.torn = Some(TornTail {
                    file: name.clone(),
                    offset: 0,
                    bytes: buf.len() as u64,
                });
                break;
            }
            Err(e) => {
                r.damage(0, e, "file skipped".into())?;
                continue;
            }
        }
        if hdr_seq > prev_seq + 1 {
            r.damage(
                0,
                format!(
                    "records {}..{} are missing before this file",
                    prev_seq + 1,
                    hdr_seq - 1
                ),
                "they are lost".into(),
            )?;
        }
        prev_seq = hdr_seq.saturating_sub(1);
        let mut off = FILE_HEADER_LEN;
        let mut turn_end = off;
        let mut turn: Vec<Pending> = Vec::new();
        let mut superseded = false;
        while off < buf.len() {
            let problem = match format::parse_record(&buf, off) {
                Ok(rec) if next_first.is_some_and(|nf| rec.seq >= nf) => {
                    superseded = true;
                    break;
                }
                Ok(rec) if rec.seq != prev_seq + 1 => {
                    format!("record {} where {} was due", rec.seq, prev_seq + 1)
                }
                Ok(rec) => {
                    let at = off;
                    prev_seq = rec.seq;
                    off = rec.end;
                    if rec.seq <= start {
                        continue;
                    }
                    match format::decode_change(rec.kind, rec.body) {
                        Ok(Change::Commit) => {
                            r.apply(std::mem::take(&mut turn))?;
                            last_commit = rec.seq;
                            turn_end = off;
                        }
                        Ok(change) => turn.push(Pending {
                            seq: rec.seq,
                            offset: at,
                            change,
                        }),
                        Err(e) => r.damage(
                            at,
                            format!("record {}: {e}", rec.seq),
                            "the record was skipped".into(),
                        )?,
                    }
                    continue;
                }
                Err(Frame::Incomplete) => "record cut short".to_owned(),
                Err(Frame::Bad(why)) => why,
            };
            // Damage at `off`.
            if next_first.is_some_and(|nf| prev_seq + 1 >= nf) {
                superseded = true;
                break;
            }
            let scan = scan_after(&buf, off + 1, prev_seq);
            if last && !scan.commit_follows {
                break; // a torn tail: handled below
            }
            match scan.resume {
                Some(p) => {
                    let next = format::parse_record(&buf, p)
                        .expect("scan found a valid record")
                        .seq;
                    r.damage(
                        off,
                        problem,
                        format!(
                            "{} bytes skipped, records {}..{} lost",
                            p - off,
                            prev_seq + 1,
                            next.saturating_sub(1)
                        ),
                    )?;
                    prev_seq = next.saturating_sub(1);
                    off = p;
                }
                None => {
                    let upto = next_first.map_or("the end".to_owned(), |nf| (nf - 1).to_string());
                    r.damage(
                        off,
                        problem,
                        format!("records {}..{upto} lost", prev_seq + 1),
                    )?;
                    turn.clear();
                    off = buf.len();
                    turn_end = off;
                }
            }
        }
        if superseded {
            turn.clear();
            continue;
        }
        if turn_end < buf.len() {
            if last {
                let torn = TornTail {
                    file: name.clone(),
                    offset: turn_end as u64,
                    bytes: (buf.len() - turn_end) as u64,
                };
                tracing::warn!(file = %torn.file, offset = torn.offset, bytes = torn.bytes, "WAL torn tail: the last turn was never completed; cutting it");
                r.report.torn = Some(torn);
                turn.clear();
            } else if !turn.is_empty() {
                r.damage(
                    turn_end,
                    "the file ends inside a turn".into(),
                    format!("{} records dropped", turn.len()),
                )?;
                turn.clear();
            }
        }
    }

    let mut queue = r.queue;
    queue.set_last_id(r.max_id);
    r.report.released = queue.release_all_taken();
    queue.drain_events().for_each(drop);
    #[cfg(debug_assertions)]
    queue.check_invariants();
    r.report.elapsed = t0.elapsed();
    Ok(Recovered {
        queue,
        last_seq: last_commit.max(fuzzy_upto),
        report: r.report,
    })
}
