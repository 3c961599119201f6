//! The bytes on disk: file names, file headers, the record frame, and the encoding of tasks and
//! state changes inside records. Shared by WAL segments (`.xlog`) and snapshots (`.snap`).
//! Nothing here does I/O; `Wal`, `recovery` and `snapshot` move the bytes.
//!
//! A file starts with a 32-byte header: 8-byte magic, u32 version, u32 zero, u64 sequence
//! number (a segment's first record; a snapshot's WAL position), u32 crc32c of the 24 bytes
//! before it, u32 zero. Records follow, each a 24-byte header and a body:
//!
//! ```text
//! 0  u32 marker 0x71726174    lets --force-recovery find the next record after damage
//! 4  u32 body length
//! 8  u64 sequence number      consecutive across segments; block number in a snapshot
//! 16 u8  kind                 Put | Status | Remove | Commit | SnapTasks | SnapEnd
//! 17 [u8; 3] zero
//! 20 u32 crc32c of bytes 4..20 and the body
//! ```
//! Every integer is little-endian. A `Commit` record closes the records of one loop turn:
//! recovery applies a turn whole or not at all.

use tarq_engine::{Micros, RestoredTask, Status, TaskId, TaskRef};

pub const WAL_MAGIC: [u8; 8] = *b"TARQWAL\0";
pub const SNAP_MAGIC: [u8; 8] = *b"TARQSNP\0";
/// Bumped on any incompatible change of this file's layout.
pub const FORMAT_VERSION: u32 = 1;
pub const FILE_HEADER_LEN: usize = 32;
pub const RECORD_MARKER: u32 = 0x7172_6174;
pub const RECORD_HEADER_LEN: usize = 24;
/// The largest record body accepted: well above the largest payload a client can send (the
/// frame limit is 16 MiB by default) and the snapshot block size, yet small enough that a
/// damaged length field is recognised as damage instead of a reason to read gigabytes.
pub const MAX_RECORD_BODY: usize = 1 << 30;

pub const WAL_SUFFIX: &str = ".xlog";
pub const SNAP_SUFFIX: &str = ".snap";
/// A snapshot being written; renamed to `.snap` once complete and synced.
pub const INPROGRESS_SUFFIX: &str = ".inprogress";

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum Kind {
    Put = 1,
    Status = 2,
    Remove = 3,
    Commit = 4,
    SnapTasks = 16,
    SnapEnd = 17,
}

impl Kind {
    fn from_u8(b: u8) -> Option<Kind> {
        Some(match b {
            1 => Kind::Put,
            2 => Kind::Status,
            3 => Kind::Remove,
            4 => Kind::Commit,
            16 => Kind::SnapTasks,
            17 => Kind::SnapEnd,
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
    let mut h = [0u8; FILE_HEADER_LEN];
    h[0..8].copy_from_slice(&magic);
    h[8..12].copy_from_slice(&FORMAT_VERSION.to_le_bytes());
    h[16..24].copy_from_slice(&seq.to_le_bytes());
    let crc = crc32c::crc32c(&h[0..24]);
    h[24..28].copy_from_slice(&crc.to_le_bytes());
    h
}

/// The sequence number of a file header, or what is wrong with it.
pub fn parse_file_header(buf: &[u8], magic: [u8; 8]) -> Result<u64, String> {
    if buf.len() < FILE_HEADER_LEN {
        return Err(format!(
            "file header cut short: {} of {FILE_HEADER_LEN} bytes",
            buf.len()
        ));
    }
    if buf[0..8] != magic {
        return Err(format!("bad magic {:?}, expected {:?}", &buf[0..8], magic));
    }
    let crc = u32::from_le_bytes(buf[24..28].try_into().expect("4 bytes"));
    if crc != crc32c::crc32c(&buf[0..24]) {
        return Err("file header checksum mismatch".into());
    }
    let version = u32::from_le_bytes(buf[8..12].try_into().expect("4 bytes"));
    if version != FORMAT_VERSION {
        return Err(format!(
            "format version {version}, this build reads {FORMAT_VERSION}"
        ));
    }
    Ok(u64::from_le_bytes(buf[16..24].try_into().expect("8 bytes")))
}

/// Starts a record at the end of `buf`; returns where it starts for `end_record`.
pub fn begin_record(buf: &mut Vec<u8>, seq: u64, kind: Kind) -> usize {
    let start = buf.len();
    buf.extend_from_slice(&RECORD_MARKER.to_le_bytes());
    buf.extend_from_slice(&[0; 4]);
    buf.extend_from_slice(&seq.to_le_bytes());
    buf.extend_from_slice(&[kind as u8, 0, 0, 0]);
    buf.extend_from_slice(&[0; 4]);
    start
}

/// Fills in the length and checksum of the record begun at `start`.
pub fn end_record(buf: &mut [u8], start: usize) {
    let body_len = buf.len() - start - RECORD_HEADER_LEN;
    assert!(
        body_len <= MAX_RECORD_BODY,
        "record body of {body_len} bytes over the limit"
    );
    buf[start + 4..start + 8].copy_from_slice(&(body_len as u32).to_le_bytes());
    let crc = crc32c::crc32c(&buf[start + 4..start + 20]);
    let crc = crc32c::crc32c_append(crc, &buf[start + RECORD_HEADER_LEN..]);
    buf[start + 20..start + 24].copy_from_slice(&crc.to_le_bytes());
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
    let crc = crc32c::crc32c_append(crc32c::crc32c(&rest[4..20]), body);
    if crc != word(20) {
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

/// Appends a whole task (a Put record's body, or one entry of a snapshot block).
pub fn encode_task(buf: &mut Vec<u8>, t: &TaskRef<'_>) {
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
    let len = u32::try_from(t.data.len()).expect("payload under 4 GiB: frames are limited");
    buf.extend_from_slice(&len.to_le_bytes());
    buf.extend_from_slice(t.data);
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

    pub fn task(&mut self) -> Result<RestoredTask, String> {
        let id = self.u64()?;
        let status = status_from(self.u8()?)?;
        let flags = self.u8()?;
        let runat = self.u64()?;
        let pri = self.u64()? as i64;
        let ttl = self.u64()?;
        let ttr = self.u64()?;
        let created = self.u64()?;
        let len = self.u32()? as usize;
        let data = self.take(len)?.into();
        Ok(RestoredTask {
            id,
            status,
            runat,
            pri,
            ttl: (flags & HAS_TTL != 0).then_some(ttl),
            ttr: (flags & HAS_TTR != 0).then_some(ttr),
            created,
            data,
        })
    }
}

/// A decoded WAL record.
pub enum Change {
    Put(RestoredTask),
    Status {
        id: TaskId,
        status: Status,
        runat: Micros,
    },
    Remove {
        id: TaskId,
    },
    Commit,
}

pub fn encode_status(buf: &mut Vec<u8>, id: TaskId, status: Status, runat: Micros) {
    buf.extend_from_slice(&id.to_le_bytes());
    buf.push(status_byte(status));
    buf.extend_from_slice(&runat.to_le_bytes());
}

/// Decodes the body of a WAL record.
pub fn decode_change(kind: Kind, body: &[u8]) -> Result<Change, String> {
    let mut b = Body(body);
    let change = match kind {
        Kind::Put => Change::Put(b.task()?),
        Kind::Status => {
            let id = b.u64()?;
            let status = status_from(b.u8()?)?;
            let runat = b.u64()?;
            Change::Status { id, status, runat }
        }
        Kind::Remove => Change::Remove { id: b.u64()? },
        Kind::Commit => Change::Commit,
        Kind::SnapTasks | Kind::SnapEnd => {
            return Err(format!("snapshot record {kind:?} inside a WAL segment"))
        }
    };
    b.finish()?;
    Ok(change)
}
