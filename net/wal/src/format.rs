//! The bytes on disk: file names, file headers, the record frame, and the encoding of tasks and
//! state changes inside records. Shared by WAL segments (`.xlog`) and snapshots (`.snap`).
//! Nothing here does I/O; `Wal`, `recovery` and `snapshot` move the bytes.
//!
//! A file starts with a 32-byte header: 8-byte magic, u32 version, u32 hint, u64 sequence
//! number (a segment's first record; a snapshot's WAL position), u32 crc32c of the 24 bytes
//! before it, u32 zero. The hint is 0 in a segment; in a snapshot, the tasks the queue held
//! when its walk began (saturated), so a load sizes its tables once (files written before it
//! existed hold 0 there, and older builds ignore it: no version change). Records follow, each a 24-byte header and a body:
//!
//! ```text
//! 0  u32 marker 0x71726174    lets --force-recovery find the next record after damage
//! 4  u32 body length
//! 8  u64 sequence number      consecutive across segments; block number in a snapshot
//! 16 u8  kind                 see `Kind`
//! 17 [u8; 3] zero
//! 20 u32 crc32c of bytes 4..20 and the body
//! ```
//! Every integer is little-endian. A `Commit` record closes the records of one loop turn:
//! recovery applies a turn whole or not at all.
//!
//! A task moved in from another node (`tarq_engine::Queue::import_task`) needs no record kind
//! of its own: a `Put` holds a task whole in any status, and replays as one.
//!
//! Versions: 7 adds a user's own limits (`tarq_engine::UserLimits`: its connections and its put
//! rate, over the server's defaults) to its entry in a `Users` record or `SnapUsers` block: two
//! more flag bits, each followed by its u32 (nothing for a user without them, so the table of a
//! server that sets none is written as in version 6). An older build refuses the flags, never
//! drops them.
//! 6 adds the operation counters (`Counts`: after a turn that changed them, the
//! counters of each tube it changed and of the dropped tubes, as they stand; a snapshot's
//! `SnapCounts` block, right after `SnapUsers`, the same as of its start): a tube's `put`,
//! `take`, `ack`... go on from where they were after a restart and on a replica made primary.
//! Nothing else changes, so files of version 5 and older read as before, counting from 0.
//! 5 adds the users and their grants (`tarq_engine::users`): a `Users` record holds
//! the whole table after a turn that changed it, and a snapshot's `SnapUsers` block the table
//! at its start (right after `SnapFloors`); nothing else changes, so files of version 4 and
//! older read as before, with no users.
//! 4 (each tube numbers its own tasks; an id packs the tube's index and the number,
//! `tarq_engine::task_id`) adds to a tube's entry (snapshot table, `TubeCreate` record) its
//! next number, its `legacy_below` mark and its `first` number (where the numbers of its
//! index stood when it was made: a tube at a dropped one's index numbers on from it, so an id
//! is never given twice; a snapshot's `SnapFloors` record carries where they stand at each
//! free index), and a `Spent` record for a put whose task was gone
//! by the end of its turn, so a restart never numbers a task twice, even when the newest was
//! deleted before the snapshot or within its own turn; a tube's `on_demand` mark (a flag bit of
//! its options); and each task's counters (releases, buries, kicks, TTR returns; four u16
//! after the utube key, flagged `HAS_COUNTS`, only when one is not zero) in Put, Replace and
//! snapshot entries, and at the end of a Status record (absent: all zero). Older files still
//! load: their ids are kept as they are, and the snapshot loader starts every tube of an older
//! snapshot numbering above its global last id (`legacy_below`, see
//! `tarq_engine::TubeNumbers`).
//! 3 (failover) closes each turn with a `Commit` that carries the term of the
//! leader that wrote it and the log's history id (`encode_commit`), and a snapshot's end record
//! carries both as of its start: a replica refuses a deposed primary's turns, and a node tells
//! a log it shares from one that diverged or is unrelated. 2 carries tubes (a task names its tube, delivery count and utube key; records
//! for tube creation, drop and truncation and for dedup keys; snapshots hold the tube table
//! and the dedup windows). Versions 2 and 1 (one anonymous queue, its tasks land in the tube
//! `default`) are still read; their turns have term 0 and no history id; versions before 4 keep
//! their global ids, their tasks' counters are zero and a Status record leaves them as they
//! are. Any other version is refused with `HeaderError::Version`, never guessed.

use tarq_engine::{
    users::Users, JobCounts, Micros, RestoredTask, Rights, Stats, Status, TaskId, TaskRef,
    TubeInfo, TubeIx, TubeNumbers, TubeOptions, TubeType, User, DEFAULT_TUBE, OP_COUNTERS,
};

pub const WAL_MAGIC: [u8; 8] = *b"TARQWAL\0";
pub const SNAP_MAGIC: [u8; 8] = *b"TARQSNP\0";
/// Bumped on any incompatible change of this file's layout; new files are written in it.
pub const FORMAT_VERSION: u32 = 7;
/// The oldest version this build still reads (the format before tubes).
pub const OLDEST_READABLE_VERSION: u32 = 1;
/// The version of a replication peer that names none: builds from before the stream carried
/// its format (`tarq_iproto::replication::FORMAT`) wrote version 3.
pub const UNNAMED_PEER_VERSION: u32 = 3;
pub const FILE_HEADER_LEN: usize = 32;
pub const RECORD_MARKER: u32 = 0x7172_6174;
pub const RECORD_HEADER_LEN: usize = 24;
/// The largest record body accepted: well above the largest payload a client can send (the
/// frame limit is 16 MiB by default) and the snapshot block size, yet small enough that a
/// damaged length field is recognised as damage instead of a reason to read gigabytes.
pub const MAX_RECORD_BODY: usize = 1 << 30;
/// A task's fields around its payload at their largest (the utube key at its limit): the
/// fixed part of `encode_task`, the key, and a snapshot block's task count.
pub const MAX_TASK_OVERHEAD: usize =
    TASK_FIXED_BYTES + tarq_engine::MAX_UTUBE_KEY_BYTES + COUNTS_BYTES + 4;
/// The largest payload a task may carry: its record (or a snapshot block holding it alone)
/// then stays within `MAX_RECORD_BODY`. The server checks its frame limit against this at
/// start, so no client can send a task the WAL cannot hold.
pub const MAX_PAYLOAD_BYTES: usize = MAX_RECORD_BODY - MAX_TASK_OVERHEAD;
/// id, status, flags, runat, pri, ttl, ttr, created, tube, deliveries, key length, payload
/// length.
const TASK_FIXED_BYTES: usize = TASK_HEAD_BYTES + 4;
/// The fixed fields before the utube key: id, status, flags, runat, pri, ttl, ttr, created,
/// tube, deliveries, key length.
const TASK_HEAD_BYTES: usize = 8 + 1 + 1 + 8 * 5 + 2 + 2 + 2;
/// A task's counters when one is not zero (version 4): releases, buries, kicks, timeouts.
const COUNTS_BYTES: usize = 2 * 4;

/// A record or payload the format cannot hold.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{what} of {len} bytes: the WAL holds at most {max}")]
pub struct TooLarge {
    pub what: &'static str,
    pub len: usize,
    pub max: usize,
}

/// `Ok` when a task with a payload of `len` bytes fits a WAL record and a snapshot block;
/// else the error names both sizes. Call it before the queue changes.
pub fn check_payload(len: usize) -> Result<(), TooLarge> {
    if len > MAX_PAYLOAD_BYTES {
        return Err(TooLarge {
            what: "task payload",
            len,
            max: MAX_PAYLOAD_BYTES,
        });
    }
    Ok(())
}

pub const WAL_SUFFIX: &str = ".xlog";
pub const SNAP_SUFFIX: &str = ".snap";
/// A snapshot being written; renamed to `.snap` once complete and synced.
pub const INPROGRESS_SUFFIX: &str = ".inprogress";

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum Kind {
    /// A new task, whole, in any status: a put (taken already if it was within its turn), or
    /// a task moved in from another node (`Event::Imported`), Taken, Waiting or Buried as it
    /// was there.
    Put = 1,
    /// A task's status (and, from version 2, its delivery count).
    Status = 2,
    /// A task is gone: ack, delete, expiry.
    Remove = 3,
    Commit = 4,
    /// A task's new pri / ttl / ttr (touch, release with options): the whole task, replacing it.
    Replace = 5,
    TubeCreate = 6,
    TubeDrop = 7,
    TubeTruncate = 8,
    /// A dedup key a put recorded.
    Dedup = 9,
    /// A number a tube gave to a put whose task was gone by the end of its turn, so no `Put`
    /// holds it (the id; version 4): replayed, the tube numbers its next tasks above it — or,
    /// its tube dropped in the same turn, the next tube at its index does.
    Spent = 10,
    /// The whole table of users and grants, after a turn that changed it (version 5).
    Users = 11,
    /// Operation counters as they stand after the turn (version 6): a u16 count of entries,
    /// each a `CountsEntry`. Absolute, so replaying one twice, or over a snapshot that
    /// already has it, lands on the same figures.
    Counts = 12,
    SnapTasks = 16,
    SnapEnd = 17,
    /// The tube table at the snapshot's start.
    SnapTubes = 18,
    /// Dedup keys of the tubes, oldest first.
    SnapDedup = 19,
    /// Where the numbers of each free tube index stand at the snapshot's start, for the
    /// indexes a dropped tube used (version 4): a u32 count and that many (u16 index, u64
    /// floor) pairs, right after `SnapTubes`.
    SnapFloors = 20,
    /// The table of users at the snapshot's start (version 5), after `SnapFloors`.
    SnapUsers = 21,
    /// The operation counters at the snapshot's start (version 6): a u32 count and that many
    /// `CountsEntry`s, right after `SnapUsers`.
    SnapCounts = 22,
}

impl Kind {
    fn from_u8(b: u8) -> Option<Kind> {
        Some(match b {
            1 => Kind::Put,
            2 => Kind::Status,
            3 => Kind::Remove,
            4 => Kind::Commit,
            5 => Kind::Replace,
            6 => Kind::TubeCreate,
            7 => Kind::TubeDrop,
            8 => Kind::TubeTruncate,
            9 => Kind::Dedup,
            10 => Kind::Spent,
            11 => Kind::Users,
            12 => Kind::Counts,
            16 => Kind::SnapTasks,
            17 => Kind::SnapEnd,
            18 => Kind::SnapTubes,
            19 => Kind::SnapDedup,
            20 => Kind::SnapFloors,
            21 => Kind::SnapUsers,
            22 => Kind::SnapCounts,
            _ => return None,
        })
    }
}

/// `00000000000000000001.xlog`: named by the first sequence number inside, so names sort in
/// log order (Tarantool's scheme).
pub fn segment_name(first_seq: u64) -> String {
    format!("{first_seq:020}{WAL_SUFFIX}")
}

/// Named by the WAL position the snapshot starts from: replay continues after it.
pub fn snapshot_name(start_seq: u64) -> String {
    format!("{start_seq:020}{SNAP_SUFFIX}")
}

/// The number in a name made by `segment_name`/`snapshot_name` with that suffix.
pub fn parse_name(name: &str, suffix: &str) -> Option<u64> {
    let digits = name.strip_suffix(suffix)?;
    if digits.len() != 20 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

pub fn file_header(magic: [u8; 8], seq: u64) -> [u8; FILE_HEADER_LEN] {
    file_header_version(magic, FORMAT_VERSION, seq)
}

/// A snapshot's file header, with the tasks its walk began with as the hint.
pub fn snapshot_header(seq: u64, tasks: usize) -> [u8; FILE_HEADER_LEN] {
    let hint = u32::try_from(tasks).unwrap_or(u32::MAX);
    header(SNAP_MAGIC, FORMAT_VERSION, hint, seq)
}

/// A file header of any version (tests write older formats with it).
pub fn file_header_version(magic: [u8; 8], version: u32, seq: u64) -> [u8; FILE_HEADER_LEN] {
    header(magic, version, 0, seq)
}

fn header(magic: [u8; 8], version: u32, hint: u32, seq: u64) -> [u8; FILE_HEADER_LEN] {
    let mut h = [0u8; FILE_HEADER_LEN];
    h[0..8].copy_from_slice(&magic);
    h[8..12].copy_from_slice(&version.to_le_bytes());
    h[12..16].copy_from_slice(&hint.to_le_bytes());
    h[16..24].copy_from_slice(&seq.to_le_bytes());
    let crc = crc32c::crc32c(&h[0..24]);
    h[24..28].copy_from_slice(&crc.to_le_bytes());
    h
}

/// A parsed file header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FileHeader {
    pub seq: u64,
    pub version: u32,
    /// A snapshot's task count at its start (0: not known); see the module doc.
    pub hint: u32,
}

/// Why a file header was not accepted.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum HeaderError {
    #[error("{0}")]
    Damaged(String),
    /// A sound header of a format this build does not read: refused, never guessed at.
    #[error(
        "format version {0}; this build reads versions {OLDEST_READABLE_VERSION} to {FORMAT_VERSION}"
    )]
    Version(u32),
}

/// The sequence number and version of a file header, or what is wrong with it.
pub fn parse_file_header(buf: &[u8], magic: [u8; 8]) -> Result<FileHeader, HeaderError> {
    let damaged = |s: String| Err(HeaderError::Damaged(s));
    if buf.len() < FILE_HEADER_LEN {
        return damaged(format!(
            "file header cut short: {} of {FILE_HEADER_LEN} bytes",
            buf.len()
        ));
    }
    if buf[0..8] != magic {
        return damaged(format!("bad magic {:?}, expected {:?}", &buf[0..8], magic));
    }
    let crc = u32::from_le_bytes(buf[24..28].try_into().expect("4 bytes"));
    if crc != crc32c::crc32c(&buf[0..24]) {
        return damaged("file header checksum mismatch".into());
    }
    let version = u32::from_le_bytes(buf[8..12].try_into().expect("4 bytes"));
    if !(OLDEST_READABLE_VERSION..=FORMAT_VERSION).contains(&version) {
        return Err(HeaderError::Version(version));
    }
    Ok(FileHeader {
        seq: u64::from_le_bytes(buf[16..24].try_into().expect("8 bytes")),
        version,
        hint: u32::from_le_bytes(buf[12..16].try_into().expect("4 bytes")),
    })
}

/// Starts a record at the end of `buf`; returns where it starts for `end_record`.
pub fn begin_record(buf: &mut Vec<u8>, seq: u64, kind: Kind) -> usize {
    let start = buf.len();
    // Built on the stack and appended in one copy (one capacity check, not five).
    let mut h = [0u8; RECORD_HEADER_LEN];
    h[0..4].copy_from_slice(&RECORD_MARKER.to_le_bytes());
    h[8..16].copy_from_slice(&seq.to_le_bytes());
    h[16] = kind as u8;
    buf.extend_from_slice(&h);
    start
}

/// Fills in the length and checksum of the record begun at `start`. A body over
/// `MAX_RECORD_BODY` is cut away (the buffer ends at `start` again) and refused: the callers
/// check sizes before anything changes, so this is the last line, not the rule.
pub fn end_record(buf: &mut Vec<u8>, start: usize) -> Result<(), TooLarge> {
    let body_len = buf.len() - start - RECORD_HEADER_LEN;
    if body_len > MAX_RECORD_BODY {
        buf.truncate(start);
        return Err(TooLarge {
            what: "record body",
            len: body_len,
            max: MAX_RECORD_BODY,
        });
    }
    seal_record(buf, start, body_len);
    Ok(())
}

/// `end_record` for a record whose body is `buf[start + header..]` followed by `tail`, which
/// the caller writes after those bytes without copying it into `buf` (a big payload).
pub fn end_record_with_tail(buf: &mut Vec<u8>, start: usize, tail: &[u8]) -> Result<(), TooLarge> {
    let body_len = buf.len() - start - RECORD_HEADER_LEN + tail.len();
    if body_len > MAX_RECORD_BODY {
        buf.truncate(start);
        return Err(TooLarge {
            what: "record body",
            len: body_len,
            max: MAX_RECORD_BODY,
        });
    }
    buf[start + 4..start + 8].copy_from_slice(&(body_len as u32).to_le_bytes());
    let crc = record_crc(
        &buf[start + 4..start + 20],
        &buf[start + RECORD_HEADER_LEN..],
    );
    let crc = crc32c::crc32c_append(crc, tail);
    buf[start + 20..start + 24].copy_from_slice(&crc.to_le_bytes());
    Ok(())
}

/// `end_record` for records whose size is bounded by construction (fixed fields only).
pub fn end_small_record(buf: &mut [u8], start: usize) {
    let body_len = buf.len() - start - RECORD_HEADER_LEN;
    debug_assert!(body_len < 1 << 16, "a small record of {body_len} bytes");
    seal_record(buf, start, body_len);
}

fn seal_record(buf: &mut [u8], start: usize, body_len: usize) {
    buf[start + 4..start + 8].copy_from_slice(&(body_len as u32).to_le_bytes());
    let crc = record_crc(
        &buf[start + 4..start + 20],
        &buf[start + RECORD_HEADER_LEN..],
    );
    buf[start + 20..start + 24].copy_from_slice(&crc.to_le_bytes());
}

/// The checksum of a record: crc32c of its header bytes 4..20, then of its body.
fn record_crc(header: &[u8], body: &[u8]) -> u32 {
    let crc = crc_small(0, header);
    if body.len() < CRC_SMALL_BODY {
        crc_small(crc, body)
    } else {
        crc32c::crc32c_append(crc, body)
    }
}

/// Bodies shorter than this are checksummed by [`crc_small`]; longer ones (snapshot blocks, big
/// payloads) by the crate, whose three interleaved streams win once there are a few hundred
/// bytes.
const CRC_SMALL_BODY: usize = 512;

/// crc32c of `data` continuing from `crc`, as `crc32c::crc32c_append`, for the short inputs of
/// the WAL's records: one instruction per 8 bytes read unaligned, then 4, 2 and 1. The crate
/// first steps byte by byte to an 8-byte boundary and through its parallel set-up, which costs a
/// record of ~100 bytes more than the checksum itself (callgrind: ~250 instructions a record).
fn crc_small(crc: u32, data: &[u8]) -> u32 {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("sse4.2") {
        // SAFETY: the CPU has SSE4.2, checked just above.
        return unsafe { crc_sse42(crc, data) };
    }
    crc32c::crc32c_append(crc, data)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "sse4.2")]
fn crc_sse42(crc: u32, data: &[u8]) -> u32 {
    use std::arch::x86_64::{_mm_crc32_u16, _mm_crc32_u32, _mm_crc32_u64, _mm_crc32_u8};
    let mut c = u64::from(!crc);
    let mut words = data.chunks_exact(8);
    for w in &mut words {
        c = _mm_crc32_u64(c, u64::from_le_bytes(w.try_into().expect("8 bytes")));
    }
    let mut c = c as u32;
    let mut rest = words.remainder();
    if let Some((w, tail)) = rest.split_first_chunk::<4>() {
        c = _mm_crc32_u32(c, u32::from_le_bytes(*w));
        rest = tail;
    }
    if let Some((w, tail)) = rest.split_first_chunk::<2>() {
        c = _mm_crc32_u16(c, u16::from_le_bytes(*w));
        rest = tail;
    }
    if let Some(&b) = rest.first() {
        c = _mm_crc32_u8(c, b);
    }
    !c
}

/// One framed record, borrowed from the buffer it was read from.
#[derive(Debug)]
pub struct RawRecord<'a> {
    pub seq: u64,
    pub kind: Kind,
    pub body: &'a [u8],
    /// Offset just past the record.
    pub end: usize,
}

#[derive(Debug, PartialEq, Eq)]
pub enum Frame {
    /// The buffer ends before the record does.
    Incomplete,
    /// Not a valid record: damage, or the garbage a torn write leaves.
    Bad(String),
}

impl std::fmt::Display for Frame {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Frame::Incomplete => f.write_str("record cut short"),
            Frame::Bad(why) => f.write_str(why),
        }
    }
}

/// Whether the bytes from `off` to the end of `buf` are one whole record whose length field
/// alone is wrong: its checksum holds once the length is taken as what is there. A torn write
/// leaves a record short, never its length wrong; this is a damaged length.
pub fn whole_record_to_end(buf: &[u8], off: usize) -> bool {
    let Some(rest) = buf.get(off..).filter(|r| r.len() >= RECORD_HEADER_LEN) else {
        return false;
    };
    let Ok(body_len) = u32::try_from(rest.len() - RECORD_HEADER_LEN) else {
        return false;
    };
    if rest[0..4] != RECORD_MARKER.to_le_bytes() {
        return false;
    }
    let mut header = [0u8; 16];
    header.copy_from_slice(&rest[4..20]);
    header[0..4].copy_from_slice(&body_len.to_le_bytes());
    let crc = u32::from_le_bytes(rest[20..24].try_into().expect("4 bytes"));
    record_crc(&header, &rest[RECORD_HEADER_LEN..]) == crc
}

/// Reads the record at `off` of `buf`.
pub fn parse_record(buf: &[u8], off: usize) -> Result<RawRecord<'_>, Frame> {
    let rest = &buf[off..];
    if rest.len() < RECORD_HEADER_LEN {
        return Err(Frame::Incomplete);
    }
    let word = |at: usize| u32::from_le_bytes(rest[at..at + 4].try_into().expect("4 bytes"));
    if word(0) != RECORD_MARKER {
        return Err(Frame::Bad("no record marker".into()));
    }
    let body_len = word(4) as usize;
    if body_len > MAX_RECORD_BODY {
        return Err(Frame::Bad(format!(
            "record length {body_len} over {MAX_RECORD_BODY}"
        )));
    }
    if rest.len() < RECORD_HEADER_LEN + body_len {
        return Err(Frame::Incomplete);
    }
    let body = &rest[RECORD_HEADER_LEN..RECORD_HEADER_LEN + body_len];
    if record_crc(&rest[4..20], body) != word(20) {
        return Err(Frame::Bad("record checksum mismatch".into()));
    }
    let kind = Kind::from_u8(rest[16])
        .ok_or_else(|| Frame::Bad(format!("unknown record kind {}", rest[16])))?;
    Ok(RawRecord {
        seq: u64::from_le_bytes(rest[8..16].try_into().expect("8 bytes")),
        kind,
        body,
        end: off + RECORD_HEADER_LEN + body_len,
    })
}

fn status_byte(s: Status) -> u8 {
    match s {
        Status::Ready => 0,
        Status::Taken => 1,
        Status::Waiting => 2,
        Status::Buried => 3,
    }
}

fn status_from(b: u8) -> Result<Status, String> {
    Ok(match b {
        0 => Status::Ready,
        1 => Status::Taken,
        2 => Status::Waiting,
        3 => Status::Buried,
        _ => return Err(format!("unknown task status {b}")),
    })
}

const HAS_TTL: u8 = 1;
const HAS_TTR: u8 = 2;
/// Version 2: the task carries a utube key (possibly empty).
const HAS_UTUBE: u8 = 4;
/// Tube options: the tube is temporary.
const TEMPORARY: u8 = 8;
/// Version 4: the task's counters follow its utube key.
const HAS_COUNTS: u8 = 16;
/// Tube options, version 4: made on demand by beanstalk's `use` / `watch`.
const ON_DEMAND: u8 = 32;
/// Tube options, version 4: a partition after its tube's first (`TubeOptions::part`); its
/// number follows the tube's numbering as a u16.
const PART: u8 = 64;

fn counts_bytes(c: &JobCounts) -> [u8; COUNTS_BYTES] {
    let mut b = [0u8; COUNTS_BYTES];
    for (at, v) in [c.releases, c.buries, c.kicks, c.timeouts]
        .into_iter()
        .enumerate()
    {
        b[2 * at..2 * at + 2].copy_from_slice(&v.to_le_bytes());
    }
    b
}

fn u16_len(what: &'static str, len: usize) -> Result<u16, TooLarge> {
    u16::try_from(len).map_err(|_| TooLarge {
        what,
        len,
        max: u16::MAX as usize,
    })
}

/// The bytes `encode_task` appends for `t`.
pub fn task_len(t: &TaskRef<'_>) -> usize {
    let counts = if t.counts.is_zero() { 0 } else { COUNTS_BYTES };
    TASK_FIXED_BYTES + t.utube.map_or(0, <[u8]>::len) + counts + t.data.len()
}

/// Appends a whole task (a Put or Replace record's body, or one entry of a snapshot block).
/// A payload over `MAX_PAYLOAD_BYTES` or a key over 64 KiB is refused and nothing appended.
pub fn encode_task(buf: &mut Vec<u8>, t: &TaskRef<'_>) -> Result<(), TooLarge> {
    buf.reserve(task_len(t));
    encode_task_head(buf, t)?;
    buf.extend_from_slice(t.data);
    Ok(())
}

/// Appends a task up to its payload (its length included): the record's tail is the payload,
/// which the caller appends or, for a big one, hands to [`end_record_with_tail`].
pub fn encode_task_head(buf: &mut Vec<u8>, t: &TaskRef<'_>) -> Result<(), TooLarge> {
    check_payload(t.data.len())?;
    let key = t.utube.unwrap_or_default();
    let key_len = u16_len("utube key", key.len())?;
    let counted = !t.counts.is_zero();
    let flags = if t.ttl.is_some() { HAS_TTL } else { 0 }
        | if t.ttr.is_some() { HAS_TTR } else { 0 }
        | if t.utube.is_some() { HAS_UTUBE } else { 0 }
        | if counted { HAS_COUNTS } else { 0 };
    // The fixed fields before the key, built on the stack and appended in one copy.
    let mut head = [0u8; TASK_HEAD_BYTES];
    head[0..8].copy_from_slice(&t.id.to_le_bytes());
    head[8] = status_byte(t.status);
    head[9] = flags;
    head[10..18].copy_from_slice(&t.runat.to_le_bytes());
    head[18..26].copy_from_slice(&t.pri.to_le_bytes());
    head[26..34].copy_from_slice(&t.ttl.unwrap_or(0).to_le_bytes());
    head[34..42].copy_from_slice(&t.ttr.unwrap_or(0).to_le_bytes());
    head[42..50].copy_from_slice(&t.created.to_le_bytes());
    head[50..52].copy_from_slice(&t.tube.to_le_bytes());
    head[52..54].copy_from_slice(&t.deliveries.to_le_bytes());
    head[54..56].copy_from_slice(&key_len.to_le_bytes());
    buf.extend_from_slice(&head);
    buf.extend_from_slice(key);
    if counted {
        buf.extend_from_slice(&counts_bytes(&t.counts));
    }
    // Fits: checked against MAX_PAYLOAD_BYTES, which is below u32::MAX.
    buf.extend_from_slice(&(t.data.len() as u32).to_le_bytes());
    Ok(())
}

/// Appends a task in the version-1 layout (no tube, deliveries or key): only tests write it,
/// to check that a data directory of that format is still read.
pub fn encode_task_v1(buf: &mut Vec<u8>, t: &TaskRef<'_>) {
    let flags =
        if t.ttl.is_some() { HAS_TTL } else { 0 } | if t.ttr.is_some() { HAS_TTR } else { 0 };
    buf.extend_from_slice(&t.id.to_le_bytes());
    buf.push(status_byte(t.status));
    buf.push(flags);
    buf.extend_from_slice(&t.runat.to_le_bytes());
    buf.extend_from_slice(&t.pri.to_le_bytes());
    buf.extend_from_slice(&t.ttl.unwrap_or(0).to_le_bytes());
    buf.extend_from_slice(&t.ttr.unwrap_or(0).to_le_bytes());
    buf.extend_from_slice(&t.created.to_le_bytes());
    buf.extend_from_slice(&(t.data.len() as u32).to_le_bytes());
    buf.extend_from_slice(t.data);
}

/// A task as a record holds it: what `Queue::restore_in` needs. Its byte fields (payload,
/// utube key) are `D`: owned boxes for WAL replay, spans of the block read for a snapshot
/// load (see [`Body::task_with`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoredTask<D = Box<[u8]>> {
    pub task: RestoredTask<D>,
    pub tube: TubeIx,
    pub deliveries: u16,
    pub utube: Option<D>,
    /// Zero before version 4.
    pub counts: JobCounts,
}

/// A tube as a record holds it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoredTube {
    pub ix: TubeIx,
    pub name: String,
    pub kind: TubeType,
    pub opts: TubeOptions,
    /// From version 4; all zero before (the tube's ids were then the global counter's).
    pub numbers: TubeNumbers,
}

/// A dedup key as a record holds it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoredDedup {
    pub tube: TubeIx,
    pub key: Box<[u8]>,
    pub id: TaskId,
    pub expires: Micros,
}

fn kind_byte(k: TubeType) -> u8 {
    match k {
        TubeType::Fifo => 1,
        TubeType::FifoTtl => 2,
        TubeType::LimFifoTtl => 3,
        TubeType::Utube => 4,
        TubeType::UtubeTtl => 5,
    }
}

fn kind_from(b: u8) -> Result<TubeType, String> {
    Ok(match b {
        1 => TubeType::Fifo,
        2 => TubeType::FifoTtl,
        3 => TubeType::LimFifoTtl,
        4 => TubeType::Utube,
        5 => TubeType::UtubeTtl,
        _ => return Err(format!("unknown tube type {b}")),
    })
}

/// Appends a tube (a TubeCreate record's body, or one entry of a snapshot's tube table).
/// Names are bounded by the engine (`MAX_TUBE_NAME_BYTES`), so this never fails.
pub fn encode_tube(buf: &mut Vec<u8>, t: &TubeInfo<'_>) {
    let o = &t.opts;
    let flags = if o.ttl.is_some() { HAS_TTL } else { 0 }
        | if o.ttr.is_some() { HAS_TTR } else { 0 }
        | if o.temporary { TEMPORARY } else { 0 }
        | if o.on_demand { ON_DEMAND } else { 0 }
        | if o.part > 0 { PART } else { 0 };
    buf.extend_from_slice(&t.ix.to_le_bytes());
    buf.push(kind_byte(t.kind));
    buf.push(flags);
    buf.extend_from_slice(&o.ttl.unwrap_or(0).to_le_bytes());
    buf.extend_from_slice(&o.ttr.unwrap_or(0).to_le_bytes());
    buf.extend_from_slice(&o.pri.to_le_bytes());
    buf.extend_from_slice(&o.capacity.to_le_bytes());
    buf.extend_from_slice(&o.max_deliveries.to_le_bytes());
    buf.extend_from_slice(&o.dedup_window.to_le_bytes());
    let name = &t.name.as_bytes()[..t.name.len().min(u16::MAX as usize)];
    buf.extend_from_slice(&(name.len() as u16).to_le_bytes());
    buf.extend_from_slice(name);
    buf.extend_from_slice(&t.numbers.next.to_le_bytes());
    buf.extend_from_slice(&t.numbers.legacy_below.to_le_bytes());
    buf.extend_from_slice(&t.numbers.first.to_le_bytes());
    if o.part > 0 {
        buf.extend_from_slice(&o.part.to_le_bytes());
    }
}

/// A tube's numbering at the end of its entry (version 4): next number, `legacy_below`,
/// `first`.
const TUBE_NUMBERS_BYTES: usize = 24;

/// Appends a tube in the layout of versions 2 and 3 (no numbering): only tests write it, to
/// check that a data directory of those formats starts with its ids.
pub fn encode_tube_v3(buf: &mut Vec<u8>, t: &TubeInfo<'_>) {
    encode_tube(buf, t);
    buf.truncate(buf.len() - TUBE_NUMBERS_BYTES);
}

/// User flags: a password hash follows; the user is a cluster administrator; (version 7) its
/// own connection limit follows, its own put rate follows (after the hash, each a u32).
const USER_HAS_HASH: u8 = 1;
const USER_ADMIN: u8 = 2;
const USER_MAX_CONNECTIONS: u8 = 4;
const USER_PUT_RATE: u8 = 8;

/// Appends the whole table of users (a `Users` record's body or a `SnapUsers` block): a u32
/// count, then per user a u16-long name, a flags byte, the 20-byte hash when flagged, its
/// connection limit and its put rate (u32 each) when flagged, a u16
/// count of grants and per grant a u16-long tube name and its rights byte. Names are bounded
/// by the engine (`MAX_USER_NAME_BYTES`, `MAX_TUBE_NAME_BYTES`), grants by
/// `MAX_GRANTS_PER_USER`.
pub fn encode_users(buf: &mut Vec<u8>, users: &Users) {
    buf.extend_from_slice(&(users.len() as u32).to_le_bytes());
    encode_user_entries(buf, users);
}

/// The users of [`encode_users`] without their count (a snapshot block counts its entries
/// itself).
pub fn encode_user_entries(buf: &mut Vec<u8>, users: &Users) {
    for u in users.iter() {
        short_bytes(buf, u.name.as_bytes());
        let flag = |on: bool, bit: u8| if on { bit } else { 0 };
        let l = u.limits;
        buf.push(
            flag(u.hash2.is_some(), USER_HAS_HASH)
                | flag(u.admin, USER_ADMIN)
                | flag(l.max_connections.is_some(), USER_MAX_CONNECTIONS)
                | flag(l.put_rate.is_some(), USER_PUT_RATE),
        );
        if let Some(h) = &u.hash2 {
            buf.extend_from_slice(h);
        }
        for n in [l.max_connections, l.put_rate].into_iter().flatten() {
            buf.extend_from_slice(&n.to_le_bytes());
        }
        buf.extend_from_slice(&(u.tubes.len().min(u16::MAX as usize) as u16).to_le_bytes());
        for (tube, rights) in u.tubes.iter().take(u16::MAX as usize) {
            short_bytes(buf, tube.as_bytes());
            buf.push(rights.0);
        }
    }
}

fn short_bytes(buf: &mut Vec<u8>, b: &[u8]) {
    let b = &b[..b.len().min(u16::MAX as usize)];
    buf.extend_from_slice(&(b.len() as u16).to_le_bytes());
    buf.extend_from_slice(b);
}

/// Appends a dedup key (a Dedup record's body, or one entry of a snapshot's dedup block).
/// Keys are bounded by the engine (`MAX_DEDUP_KEY_BYTES`).
pub fn encode_dedup(buf: &mut Vec<u8>, tube: TubeIx, key: &[u8], id: TaskId, expires: Micros) {
    let key = &key[..key.len().min(u16::MAX as usize)];
    buf.extend_from_slice(&tube.to_le_bytes());
    buf.extend_from_slice(&id.to_le_bytes());
    buf.extend_from_slice(&expires.to_le_bytes());
    buf.extend_from_slice(&(key.len() as u16).to_le_bytes());
    buf.extend_from_slice(key);
}

/// The tube index a `CountsEntry` names for the dropped tubes' counters (no tube has it:
/// `tarq_engine::MAX_TUBES` is far below).
const RETIRED_TUBES: u16 = u16::MAX;

/// One tube's operation counters as they stand (`tube` `None`: those of the dropped tubes,
/// `Queue::retired`), in `Stats::OP_NAMES` order. Encoded as a u16 tube index (`u16::MAX` for
/// the dropped tubes), a u8 count of counters, and that many unsigned LEB128 numbers: most
/// counters are small or 0, so an entry is ~20 bytes, not 114.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CountsEntry {
    pub tube: Option<TubeIx>,
    pub counts: [u64; OP_COUNTERS],
}

fn varint(buf: &mut Vec<u8>, mut n: u64) {
    while n >= 0x80 {
        buf.push(n as u8 | 0x80);
        n >>= 7;
    }
    buf.push(n as u8);
}

/// Appends one `CountsEntry` of tube `tube` (`None`: the dropped tubes) counting `stats`.
pub fn encode_counts_entry(buf: &mut Vec<u8>, tube: Option<TubeIx>, stats: &Stats) {
    buf.extend_from_slice(&tube.unwrap_or(RETIRED_TUBES).to_le_bytes());
    buf.push(OP_COUNTERS as u8);
    for n in stats.op_counts() {
        varint(buf, n);
    }
}

/// A cursor over a record body.
pub struct Body<'a>(pub &'a [u8]);

impl<'a> Body<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], String> {
        if self.0.len() < n {
            return Err(format!(
                "record body cut short: need {n} more bytes, {} left",
                self.0.len()
            ));
        }
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        Ok(head)
    }
    pub fn u8(&mut self) -> Result<u8, String> {
        Ok(self.take(1)?[0])
    }
    pub fn u16(&mut self) -> Result<u16, String> {
        Ok(u16::from_le_bytes(
            self.take(2)?.try_into().expect("2 bytes"),
        ))
    }
    pub fn u32(&mut self) -> Result<u32, String> {
        Ok(u32::from_le_bytes(
            self.take(4)?.try_into().expect("4 bytes"),
        ))
    }
    pub fn u64(&mut self) -> Result<u64, String> {
        Ok(u64::from_le_bytes(
            self.take(8)?.try_into().expect("8 bytes"),
        ))
    }
    /// An unsigned LEB128 number of at most 10 bytes.
    pub fn varint(&mut self) -> Result<u64, String> {
        let mut n = 0u64;
        for i in 0..10 {
            let b = self.u8()?;
            n |= u64::from(b & 0x7f) << (7 * i);
            if b & 0x80 == 0 {
                return Ok(n);
            }
        }
        Err("a number longer than 10 bytes".into())
    }
    /// One entry of a `Counts` record or `SnapCounts` block.
    pub fn counts_entry(&mut self) -> Result<CountsEntry, String> {
        let tube = self.u16()?;
        let n = self.u8()?;
        let mut counts = [0u64; OP_COUNTERS];
        for i in 0..usize::from(n) {
            let v = self.varint()?;
            // A later build's extra counters: read past, not kept.
            if let Some(c) = counts.get_mut(i) {
                *c = v;
            }
        }
        let tube = (tube != RETIRED_TUBES).then_some(tube);
        Ok(CountsEntry { tube, counts })
    }
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
    /// Checks that nothing is left over after the last field.
    pub fn finish(&self) -> Result<(), String> {
        if self.0.is_empty() {
            Ok(())
        } else {
            Err(format!(
                "{} bytes left over after the record's fields",
                self.0.len()
            ))
        }
    }

    fn short_str(&mut self, what: &str) -> Result<String, String> {
        let len = self.u16()? as usize;
        let b = self.take(len)?;
        String::from_utf8(b.to_vec()).map_err(|_| format!("{what} is not UTF-8"))
    }

    /// The table of users, as `encode_users` wrote it in format `version`.
    pub fn users(&mut self, version: u32) -> Result<Vec<User>, String> {
        let known = match version {
            ..=6 => USER_HAS_HASH | USER_ADMIN,
            _ => USER_HAS_HASH | USER_ADMIN | USER_MAX_CONNECTIONS | USER_PUT_RATE,
        };
        let count = self.u32()?;
        // Each user takes more than a byte: a damaged count cannot make this allocate much.
        let mut users = Vec::with_capacity((count as usize).min(self.0.len()));
        for _ in 0..count {
            let mut u = User::new(&self.short_str("a user name")?);
            let flags = self.u8()?;
            if flags & !known != 0 {
                return Err(format!("user {:?} has unknown flags {flags:#x}", u.name));
            }
            u.admin = flags & USER_ADMIN != 0;
            if flags & USER_HAS_HASH != 0 {
                u.hash2 = Some(self.take(20)?.try_into().expect("20 bytes"));
            }
            if flags & USER_MAX_CONNECTIONS != 0 {
                u.limits.max_connections = Some(self.u32()?);
            }
            if flags & USER_PUT_RATE != 0 {
                u.limits.put_rate = Some(self.u32()?);
            }
            for _ in 0..self.u16()? {
                let tube = self.short_str("a tube name in a grant")?;
                let bits = self.u8()?;
                let rights = Rights::from_bits(bits)
                    .ok_or_else(|| format!("grant of {tube:?} has unknown rights {bits:#x}"))?;
                u.tubes.insert(tube, rights);
            }
            users.push(u);
        }
        Ok(users)
    }

    /// A task in the layout of format `version`.
    pub fn task(&mut self, version: u32) -> Result<StoredTask, String> {
        self.task_with(version, |bytes| bytes.into())
    }

    /// [`task`](Self::task), keeping each byte field (payload, utube key) as `keep` makes it
    /// from the body's bytes: a snapshot load keeps where they are, not copies.
    pub fn task_with<D>(
        &mut self,
        version: u32,
        mut keep: impl FnMut(&'a [u8]) -> D,
    ) -> Result<StoredTask<D>, String> {
        let id = self.u64()?;
        let status = status_from(self.u8()?)?;
        let flags = self.u8()?;
        let runat = self.u64()?;
        let pri = self.u64()? as i64;
        let ttl = self.u64()?;
        let ttr = self.u64()?;
        let created = self.u64()?;
        let (mut tube, mut deliveries, mut utube) = (DEFAULT_TUBE, 0, None);
        let mut counts = JobCounts::default();
        if version >= 2 {
            tube = self.u16()?;
            deliveries = self.u16()?;
            let key_len = self.u16()? as usize;
            let key = self.take(key_len)?;
            utube = (flags & HAS_UTUBE != 0).then(|| keep(key));
        }
        if version >= 4 && flags & HAS_COUNTS != 0 {
            counts = self.counts()?;
        }
        let len = self.u32()? as usize;
        let data = keep(self.take(len)?);
        let task = RestoredTask {
            id,
            status,
            runat,
            pri,
            ttl: (flags & HAS_TTL != 0).then_some(ttl),
            ttr: (flags & HAS_TTR != 0).then_some(ttr),
            created,
            data,
        };
        Ok(StoredTask {
            task,
            tube,
            deliveries,
            utube,
            counts,
        })
    }

    /// A task's counters (version 4).
    fn counts(&mut self) -> Result<JobCounts, String> {
        Ok(JobCounts {
            releases: self.u16()?,
            buries: self.u16()?,
            kicks: self.u16()?,
            timeouts: self.u16()?,
        })
    }

    /// A tube entry in the layout of format `version`.
    pub fn tube(&mut self, version: u32) -> Result<StoredTube, String> {
        let ix = self.u16()?;
        let kind = kind_from(self.u8()?)?;
        let flags = self.u8()?;
        let ttl = self.u64()?;
        let ttr = self.u64()?;
        let pri = self.u64()? as i64;
        let capacity = self.u64()?;
        let max_deliveries = self.u16()?;
        let dedup_window = self.u64()?;
        let len = self.u16()? as usize;
        let name = std::str::from_utf8(self.take(len)?)
            .map_err(|e| format!("tube name is not UTF-8: {e}"))?
            .to_owned();
        let numbers = if version >= 4 {
            TubeNumbers {
                next: self.u64()?,
                legacy_below: self.u64()?,
                first: self.u64()?,
            }
        } else {
            TubeNumbers::default()
        };
        let part = if flags & PART != 0 { self.u16()? } else { 0 };
        let opts = TubeOptions {
            ttl: (flags & HAS_TTL != 0).then_some(ttl),
            ttr: (flags & HAS_TTR != 0).then_some(ttr),
            pri,
            capacity,
            max_deliveries,
            dedup_window,
            temporary: flags & TEMPORARY != 0,
            on_demand: flags & ON_DEMAND != 0,
            part,
        };
        Ok(StoredTube {
            ix,
            name,
            kind,
            opts,
            numbers,
        })
    }

    pub fn dedup(&mut self) -> Result<StoredDedup, String> {
        let tube = self.u16()?;
        let id = self.u64()?;
        let expires = self.u64()?;
        let len = self.u16()? as usize;
        let key = self.take(len)?.into();
        Ok(StoredDedup {
            tube,
            key,
            id,
            expires,
        })
    }
}

/// A decoded WAL record.
pub enum Change {
    Put(StoredTask),
    /// The whole task as it is now: replaces it (inserted if absent).
    Replace(StoredTask),
    Status {
        id: TaskId,
        status: Status,
        runat: Micros,
        /// Version 2: the delivery count.
        deliveries: Option<u16>,
        /// Version 4: the task's counters (all zero when the record has none).
        counts: Option<JobCounts>,
    },
    Remove {
        id: TaskId,
    },
    TubeCreate(StoredTube),
    TubeDrop(TubeIx),
    TubeTruncate(TubeIx),
    Dedup(StoredDedup),
    /// The whole table of users (version 5).
    Users(Vec<User>),
    /// A number given to a put the log holds no task of: the id.
    Spent {
        id: TaskId,
    },
    /// Operation counters as they stand (version 6).
    Counts(Vec<CountsEntry>),
    /// The end of a turn: the term of the leader that wrote it and the log's history id
    /// (both 0 before version 3).
    Commit {
        term: u64,
        history: u64,
    },
}

/// The body of a version 3 `Commit`: the leader's term, then the log's history id.
pub fn encode_commit(buf: &mut Vec<u8>, term: u64, history: u64) {
    buf.extend_from_slice(&term.to_le_bytes());
    buf.extend_from_slice(&history.to_le_bytes());
}

/// The body of a Status record; the task's counters end it only when one is not zero, so the
/// record of a take of a task never released, buried, kicked or timed out (most takes)
/// carries none.
pub fn encode_status(
    buf: &mut Vec<u8>,
    id: TaskId,
    status: Status,
    runat: Micros,
    deliveries: u16,
    counts: &JobCounts,
) {
    let mut b = [0u8; 8 + 1 + 8 + 2];
    b[0..8].copy_from_slice(&id.to_le_bytes());
    b[8] = status_byte(status);
    b[9..17].copy_from_slice(&runat.to_le_bytes());
    b[17..19].copy_from_slice(&deliveries.to_le_bytes());
    buf.extend_from_slice(&b);
    if !counts.is_zero() {
        buf.extend_from_slice(&counts_bytes(counts));
    }
}

/// Decodes the body of a WAL record of format `version`.
pub fn decode_change(kind: Kind, body: &[u8], version: u32) -> Result<Change, String> {
    let mut b = Body(body);
    let v2 = |what: &str| {
        if version < 2 {
            Err(format!("{what} record in a version {version} file"))
        } else {
            Ok(())
        }
    };
    let change = match kind {
        Kind::Put => Change::Put(b.task(version)?),
        Kind::Replace => {
            v2("Replace")?;
            Change::Replace(b.task(version)?)
        }
        Kind::Status => {
            let id = b.u64()?;
            let status = status_from(b.u8()?)?;
            let runat = b.u64()?;
            let deliveries = if version >= 2 { Some(b.u16()?) } else { None };
            let counts = match version {
                ..=3 => None,
                _ if b.is_empty() => Some(JobCounts::default()),
                _ => Some(b.counts()?),
            };
            Change::Status {
                id,
                status,
                runat,
                deliveries,
                counts,
            }
        }
        Kind::Remove => Change::Remove { id: b.u64()? },
        Kind::TubeCreate => {
            v2("TubeCreate")?;
            Change::TubeCreate(b.tube(version)?)
        }
        Kind::TubeDrop => {
            v2("TubeDrop")?;
            Change::TubeDrop(b.u16()?)
        }
        Kind::TubeTruncate => {
            v2("TubeTruncate")?;
            Change::TubeTruncate(b.u16()?)
        }
        Kind::Dedup => {
            v2("Dedup")?;
            Change::Dedup(b.dedup()?)
        }
        Kind::Spent if version >= 4 => Change::Spent { id: b.u64()? },
        Kind::Spent => return Err(format!("Spent record in a version {version} file")),
        Kind::Users if version >= 5 => Change::Users(b.users(version)?),
        Kind::Users => return Err(format!("Users record in a version {version} file")),
        Kind::Counts if version >= 6 => {
            let n = b.u16()?;
            let mut entries = Vec::with_capacity(usize::from(n).min(b.0.len()));
            for _ in 0..n {
                entries.push(b.counts_entry()?);
            }
            Change::Counts(entries)
        }
        Kind::Counts => return Err(format!("Counts record in a version {version} file")),
        Kind::Commit if version >= 3 => Change::Commit {
            term: b.u64()?,
            history: b.u64()?,
        },
        Kind::Commit => Change::Commit {
            term: 0,
            history: 0,
        },
        Kind::SnapTasks
        | Kind::SnapEnd
        | Kind::SnapTubes
        | Kind::SnapDedup
        | Kind::SnapFloors
        | Kind::SnapUsers
        | Kind::SnapCounts => return Err(format!("snapshot record {kind:?} inside a WAL segment")),
    };
    b.finish()?;
    Ok(change)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The short-input checksum is the crate's crc32c, byte for byte: records written before it
    /// and after it check the same, whatever the length, the start in memory or the crc so far.
    #[test]
    fn crc_small_is_crc32c() {
        let bytes: Vec<u8> = (0..700u32)
            .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
            .collect();
        for start in 0..8 {
            for len in 0..bytes.len() - start {
                let data = &bytes[start..start + len];
                for crc in [0, 1, 0xdead_beef, u32::MAX] {
                    assert_eq!(
                        crc_small(crc, data),
                        crc32c::crc32c_append(crc, data),
                        "start {start} len {len} crc {crc:#x}"
                    );
                }
            }
        }
    }

    /// A record's checksum covers header bytes 4..20 and the body, as the format says, on
    /// either side of the length where the crate takes over.
    #[test]
    fn a_record_checksum_is_the_documented_crc32c() {
        for body_len in [0, 1, 7, 63, CRC_SMALL_BODY - 1, CRC_SMALL_BODY, 4096] {
            let mut buf = vec![0xaa; 3];
            let at = begin_record(&mut buf, 42, Kind::Put);
            buf.extend((0..body_len).map(|i| i as u8));
            end_record(&mut buf, at).unwrap();
            let rec = &buf[at..];
            let want = crc32c::crc32c_append(crc32c::crc32c(&rec[4..20]), &rec[24..]);
            assert_eq!(rec[20..24], want.to_le_bytes(), "body of {body_len} bytes");
            assert_eq!(parse_record(&buf, at).unwrap().body.len(), body_len);
        }
    }
}
