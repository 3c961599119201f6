//! Replication over IPROTO, both directions, bytes only. Borrowed from Tarantool: a replica
//! connects to the primary's ordinary port, sends `SUBSCRIBE` (66) with its position as a
//! one-component vclock (`{0x26: {1: lsn}}`), or `JOIN` (65) when it has no usable position;
//! the primary answers `OK` with the position the stream starts after, and from then on the
//! connection carries the stream, never a request/reply again. Not borrowed: Tarantool ships
//! its rows as DML requests; tarq ships its own WAL records (checksummed, numbered, whole
//! turns) as the `DATA` of `XLOG` frames, so a replica writes them to its WAL byte for byte.
//!
//! Primary → replica, after the `OK`:
//! - `SNAPSHOT` (JOIN only): `{0x30: bin}`, the next bytes of the primary's snapshot file;
//! - `SNAPSHOT_END` (JOIN only): the file is complete; the records after its start follow;
//! - `XLOG`: `{0x30: bin}`, WAL records in sequence order (a turn may span frames);
//! - `HEARTBEAT`: `{0x26: {1: lsn}, 0x04: micros, 0x7b: bytes}`: the last record the primary
//!   has written, its clock, and the stream bytes it holds for this replica not yet sent (the
//!   replica's figures of lag; a silent stream also tells the replica the primary lives);
//! - an error reply (`0x8000 | code`, `{0x31: message}`) ends the stream:
//!   [`codes::ER_WAL_NOT_RETAINED`](super::codes::ER_WAL_NOT_RETAINED) asks the replica to join.
//!
//! Replica → primary: `OK` `{0x26: {1: lsn}}` acknowledges what the replica has applied (once
//! per heartbeat; the primary's figures, and what synchronous replication will count on).
//!
//! The WAL format version (`FORMAT`, tarq's own key) goes both ways before the stream: JOIN and
//! SUBSCRIBE carry the one the replica's build stores, the primary's `OK` the one its records
//! are in. A replica stores the records byte for byte, so the two must be equal; each side
//! refuses another, and takes a peer that names none (a build from before the exchange) for
//! format 3. Unknown keys are skipped both ways, so an older peer reads the new frames.

use super::mp::{write, MpError, Reader};
use super::{keys, response, types, LEN_PREFIX};

/// JOIN: the replica wants a snapshot, then the stream.
pub const JOIN: u32 = 65;
/// SUBSCRIBE: the replica wants the stream after its position.
pub const SUBSCRIBE: u32 = 66;
/// tarq's own stream frame types (Tarantool's rows are DML types instead).
pub const XLOG: u32 = 0x7a01;
pub const SNAPSHOT: u32 = 0x7a02;
pub const SNAPSHOT_END: u32 = 0x7a03;
pub const HEARTBEAT: u32 = 0x7a04;

/// Body keys: Tarantool's vclock and timestamp, and tarq's backlog, history id and term.
pub const VCLOCK: u64 = 0x26;
pub const TIMESTAMP: u64 = 0x04;
pub const BACKLOG: u64 = 0x7b;
/// SUBSCRIBE: the history id of the replica's log (Tarantool sends its replicaset UUID).
pub const HISTORY: u64 = 0x7c;
/// SUBSCRIBE: the term of the replica's record at its position.
pub const TERM: u64 = 0x7d;
/// JOIN, SUBSCRIBE and the `OK` answering them: the WAL format version the replica stores, or
/// the one the primary streams.
pub const FORMAT: u64 = 0x7e;
/// The one vclock component: one primary writes the log.
const REPLICA_ID: u64 = 1;

fn vclock(out: &mut Vec<u8>, lsn: u64) {
    write::uint(out, VCLOCK);
    write::map_len(out, 1);
    write::uint(out, REPLICA_ID);
    write::uint(out, lsn);
}

fn read_vclock(r: &mut Reader<'_>) -> Result<u64, MpError> {
    let mut lsn = 0;
    for _ in 0..r.read_map_len()? {
        let id = r.read_uint()?;
        let v = r.read_uint()?;
        if id == REPLICA_ID {
            lsn = v;
        }
    }
    Ok(lsn)
}

/// A request frame without the codec's usual schema key: type, sync and a body.
fn frame(out: &mut Vec<u8>, rtype: u32, sync: u64, body: impl FnOnce(&mut Vec<u8>)) {
    super::client::request(out, rtype, sync, body);
}

/// Replica → primary: JOIN, from a replica whose build stores WAL format `format`.
pub fn join(out: &mut Vec<u8>, sync: u64, format: u32) {
    frame(out, JOIN, sync, |o| {
        write::map_len(o, 1);
        write::uint(o, FORMAT);
        write::uint(o, u64::from(format));
    });
}

/// Replica → primary: SUBSCRIBE after record `lsn`, which the replica holds as of `term` in
/// a log of history `history` (0: none yet), its build storing WAL format `format`.
pub fn subscribe(out: &mut Vec<u8>, sync: u64, lsn: u64, term: u64, history: u64, format: u32) {
    frame(out, SUBSCRIBE, sync, |o| {
        write::map_len(o, 4);
        vclock(o, lsn);
        write::uint(o, TERM);
        write::uint(o, term);
        write::uint(o, HISTORY);
        write::uint(o, history);
        write::uint(o, FORMAT);
        write::uint(o, u64::from(format));
    });
}

/// Replica → primary: records up to `lsn` are applied.
pub fn ack(out: &mut Vec<u8>, lsn: u64) {
    frame(out, types::OK, 0, |o| {
        write::map_len(o, 1);
        vclock(o, lsn);
    });
}

/// Primary → replica: the stream starts after record `lsn`, its records in WAL format
/// `format`.
pub fn start(out: &mut Vec<u8>, sync: u64, lsn: u64, format: u32) {
    let at = response::begin(out, types::OK, sync);
    write::map_len(out, 2);
    vclock(out, lsn);
    write::uint(out, FORMAT);
    write::uint(out, u64::from(format));
    response::finish(out, at);
}

/// Primary → replica: `bytes` as the DATA of a frame of `kind` (`XLOG` or `SNAPSHOT`).
pub fn data(out: &mut Vec<u8>, kind: u32, bytes: &[u8]) {
    let at = response::begin(out, kind, 0);
    write::map_len(out, 1);
    write::uint(out, keys::DATA);
    write::bin(out, bytes);
    response::finish(out, at);
}

/// The bytes `data` adds around a payload at most: length prefix, header, key, bin header.
pub const DATA_OVERHEAD: usize = LEN_PREFIX + 32;

/// Primary → replica: the snapshot file is complete.
pub fn snapshot_end(out: &mut Vec<u8>) {
    let at = response::begin(out, SNAPSHOT_END, 0);
    write::map_len(out, 0);
    response::finish(out, at);
}

/// Primary → replica: a heartbeat (see the module's description).
pub fn heartbeat(out: &mut Vec<u8>, lsn: u64, micros: u64, backlog: u64) {
    let at = response::begin(out, HEARTBEAT, 0);
    write::map_len(out, 3);
    vclock(out, lsn);
    write::uint(out, TIMESTAMP);
    write::uint(out, micros);
    write::uint(out, BACKLOG);
    write::uint(out, backlog);
    response::finish(out, at);
}

/// One frame of the stream, as the replica reads it (or an ack, as the primary reads it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Frame<'a> {
    /// `OK` with a vclock: the stream's start (from the primary, with the WAL format of its
    /// records; `None` from a primary that names none) or an ack (from a replica).
    Position {
        lsn: u64,
        format: Option<u32>,
    },
    Xlog(&'a [u8]),
    Snapshot(&'a [u8]),
    SnapshotEnd,
    Heartbeat {
        lsn: u64,
        micros: u64,
        backlog: u64,
    },
    Error {
        code: u32,
        message: String,
    },
}

/// Decodes one stream frame (without its size prefix).
pub fn decode<'a>(frame: &'a [u8]) -> Result<Frame<'a>, String> {
    let mut r = Reader::new(frame);
    let bad = |e: MpError| format!("bad replication frame: {e}");
    let mut rtype = None;
    for _ in 0..r.read_map_len().map_err(bad)? {
        match r.read_uint().map_err(bad)? {
            keys::REQUEST_TYPE => rtype = Some(r.read_uint().map_err(bad)?),
            _ => {
                r.skip_value().map_err(bad)?;
            }
        }
    }
    let rtype = rtype.ok_or("replication frame without a type")? as u32;
    let (mut lsn, mut micros, mut backlog, mut data, mut message) = (0, 0, 0, None, None);
    let mut format = None;
    if !r.is_empty() {
        for _ in 0..r.read_map_len().map_err(bad)? {
            match r.read_uint().map_err(bad)? {
                VCLOCK => lsn = read_vclock(&mut r).map_err(bad)?,
                TIMESTAMP => micros = r.read_uint().map_err(bad)?,
                BACKLOG => backlog = r.read_uint().map_err(bad)?,
                FORMAT => format = Some(read_format(&mut r).map_err(bad)?),
                keys::DATA => data = Some(r.read_str_or_bin().map_err(bad)?),
                keys::ERROR_24 => message = Some(r.read_str().map_err(bad)?.to_owned()),
                _ => {
                    r.skip_value().map_err(bad)?;
                }
            }
        }
    }
    let need_data = |d: Option<&'a [u8]>| d.ok_or_else(|| format!("frame {rtype:#x} without data"));
    Ok(match rtype {
        t if t & types::ERROR != 0 => Frame::Error {
            code: t & 0x7fff,
            message: message.unwrap_or_default(),
        },
        types::OK => Frame::Position { lsn, format },
        XLOG => Frame::Xlog(need_data(data)?),
        SNAPSHOT => Frame::Snapshot(need_data(data)?),
        SNAPSHOT_END => Frame::SnapshotEnd,
        HEARTBEAT => Frame::Heartbeat {
            lsn,
            micros,
            backlog,
        },
        t => return Err(format!("unknown replication frame type {t:#x}")),
    })
}

/// A `FORMAT` value: a version past `u32` is no version any build writes, so it is kept
/// saturated (and refused as another format).
fn read_format(r: &mut Reader<'_>) -> Result<u32, MpError> {
    Ok(u32::try_from(r.read_uint()?).unwrap_or(u32::MAX))
}

/// What a SUBSCRIBE asks for: the position (`{0x26: {1: lsn}}`), its term and the history id,
/// each 0 when absent (a replica of an older tarq sends the position only), and the WAL format
/// the replica stores (`None`: a replica from before the exchange).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SubscribeBody {
    pub after: u64,
    pub term: u64,
    pub history: u64,
    pub format: Option<u32>,
}

/// The WAL format a JOIN body names (`None`: a replica from before the exchange).
pub fn join_format(body: &[u8]) -> Result<Option<u32>, MpError> {
    let mut r = Reader::new(body);
    let mut format = None;
    if r.is_empty() {
        return Ok(format);
    }
    for _ in 0..r.read_map_len()? {
        match r.read_uint()? {
            FORMAT => format = Some(read_format(&mut r)?),
            _ => {
                r.skip_value()?;
            }
        }
    }
    Ok(format)
}

/// Decodes a SUBSCRIBE body.
pub fn subscribe_position(body: &[u8]) -> Result<SubscribeBody, MpError> {
    let mut r = Reader::new(body);
    let mut s = SubscribeBody::default();
    if r.is_empty() {
        return Ok(s);
    }
    for _ in 0..r.read_map_len()? {
        match r.read_uint()? {
            VCLOCK => s.after = read_vclock(&mut r)?,
            TERM => s.term = r.read_uint()?,
            HISTORY => s.history = r.read_uint()?,
            FORMAT => s.format = Some(read_format(&mut r)?),
            _ => {
                r.skip_value()?;
            }
        }
    }
    Ok(s)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn one(buf: &[u8]) -> Frame<'_> {
        let f = crate::split_frame(buf, usize::MAX).unwrap().unwrap();
        assert_eq!(f.total(), buf.len());
        decode(&buf[f.prefix..]).unwrap()
    }

    #[test]
    fn frames_round_trip() {
        let mut b = Vec::new();
        start(&mut b, 7, 42, 4);
        assert_eq!(
            one(&b),
            Frame::Position {
                lsn: 42,
                format: Some(4)
            }
        );
        b.clear();
        data(&mut b, XLOG, b"records");
        assert_eq!(one(&b), Frame::Xlog(b"records"));
        b.clear();
        heartbeat(&mut b, 9, 1_000, 3);
        assert_eq!(
            one(&b),
            Frame::Heartbeat {
                lsn: 9,
                micros: 1_000,
                backlog: 3
            }
        );
        b.clear();
        ack(&mut b, 11);
        assert_eq!(
            one(&b),
            Frame::Position {
                lsn: 11,
                format: None
            }
        );
        b.clear();
        response::error(&mut b, 0, 1000, "gone");
        assert_eq!(
            one(&b),
            Frame::Error {
                code: 1000,
                message: "gone".into()
            }
        );
    }

    /// JOIN and SUBSCRIBE name the replica's WAL format; a body from an older replica, which
    /// names none, still decodes (its format `None`), as does an `OK` without one.
    #[test]
    fn the_wal_format_goes_both_ways_and_an_older_peer_names_none() {
        let body = |b: &[u8]| {
            let f = crate::split_frame(b, usize::MAX).unwrap().unwrap();
            let mut r = Reader::new(&b[f.prefix..f.total()]);
            r.read_map_len().unwrap();
            for _ in 0..4 {
                r.read_uint().unwrap();
            }
            r.remaining().to_vec()
        };
        let mut b = Vec::new();
        subscribe(&mut b, 2, 9, 1, 0xfeed, 4);
        let s = subscribe_position(&body(&b)).unwrap();
        assert_eq!(
            (s.after, s.term, s.history, s.format),
            (9, 1, 0xfeed, Some(4))
        );
        b.clear();
        join(&mut b, 2, 4);
        assert_eq!(join_format(&body(&b)).unwrap(), Some(4));
        // An older replica: a JOIN with an empty map, a SUBSCRIBE with the position only.
        b.clear();
        frame(&mut b, JOIN, 2, |o| write::map_len(o, 0));
        assert_eq!(join_format(&body(&b)).unwrap(), None);
        b.clear();
        frame(&mut b, SUBSCRIBE, 2, |o| {
            write::map_len(o, 1);
            vclock(o, 9);
        });
        assert_eq!(subscribe_position(&body(&b)).unwrap().format, None);
        // An older primary's OK.
        b.clear();
        let at = response::begin(&mut b, types::OK, 2);
        write::map_len(&mut b, 1);
        vclock(&mut b, 42);
        response::finish(&mut b, at);
        assert_eq!(
            one(&b),
            Frame::Position {
                lsn: 42,
                format: None
            }
        );
    }
}
