//! The IPROTO codec: Tarantool's binary protocol, the subset in `shared/spec/IPROTO.md`, in both
//! directions so that the server, the end-to-end tests and the load generator share one codec.
//!
//! - [`greeting`]: the 128-byte greeting (encode for the server, parse for clients);
//! - [`split_frame`]: cut a byte stream into frames (`Ok(None)` while incomplete), for both sides;
//! - [`request`]: server side, decode a request frame borrowing from the read buffer;
//! - [`response`]: server side, encode replies and errors;
//! - [`client`]: client side, encode requests and decode replies;
//! - [`auth`]: chap-sha1 scrambles, both sides;
//! - [`replication`]: JOIN / SUBSCRIBE and the stream of WAL records, both sides;
//! - [`mp`]: MessagePack primitives over `rmp`, with the bounded iterative skipper.
//!
//! The codec owns bytes only: it never touches a socket, the engine or a clock.

pub mod auth;
pub mod client;
pub mod greeting;
pub mod mp;
pub mod replication;
pub mod request;
pub mod response;

/// Request types (header key 0x00), as in Tarantool's `iproto_constants.h`.
pub mod types {
    pub const OK: u32 = 0;
    pub const SELECT: u32 = 1;
    pub const CALL_16: u32 = 6;
    pub const AUTH: u32 = 7;
    pub const EVAL: u32 = 8;
    pub const CALL: u32 = 10;
    pub const PING: u32 = 64;
    pub const ID: u32 = 73;
    /// Set in a response's type when it carries an error: `ERROR | code`.
    pub const ERROR: u32 = 0x8000;
}

/// Header and body keys.
pub mod keys {
    pub const REQUEST_TYPE: u64 = 0x00;
    pub const SYNC: u64 = 0x01;
    pub const SCHEMA_VERSION: u64 = 0x05;
    pub const SPACE_ID: u64 = 0x10;
    pub const TUPLE: u64 = 0x21;
    pub const FUNCTION_NAME: u64 = 0x22;
    pub const USER_NAME: u64 = 0x23;
    pub const EXPR: u64 = 0x27;
    pub const DATA: u64 = 0x30;
    /// The error message string (`IPROTO_ERROR_24`).
    pub const ERROR_24: u64 = 0x31;
    /// The MP_ERROR stack map (`IPROTO_ERROR`).
    pub const ERROR: u64 = 0x52;
    pub const VERSION: u64 = 0x54;
    pub const FEATURES: u64 = 0x55;
    pub const AUTH_TYPE: u64 = 0x5b;
}

/// Error codes (Tarantool's `errcode.h`) this server sends.
pub mod codes {
    pub const ER_ILLEGAL_PARAMS: u32 = 1;
    /// A change sent to a read-only instance (a replica); the message names the primary.
    pub const ER_READONLY: u32 = 7;
    pub const ER_INVALID_MSGPACK: u32 = 20;
    pub const ER_PROC_LUA: u32 = 32;
    pub const ER_NO_SUCH_PROC: u32 = 33;
    pub const ER_NO_SUCH_SPACE: u32 = 36;
    pub const ER_ACCESS_DENIED: u32 = 42;
    pub const ER_NO_SUCH_USER: u32 = 45;
    pub const ER_PASSWORD_MISMATCH: u32 = 47;
    pub const ER_UNKNOWN_REQUEST_TYPE: u32 = 48;
    pub const ER_MISSING_REQUEST_FIELD: u32 = 69;
    /// A synchronous change not acknowledged by its quorum of replicas in time (Tarantool's
    /// wording and code); the change is not undone.
    pub const ER_SYNC_QUORUM_TIMEOUT: u32 = 216;
    /// tarq's own (above Tarantool's range): the primary no longer has the WAL after a
    /// replica's position; the replica joins from a snapshot.
    pub const ER_WAL_NOT_RETAINED: u32 = 1000;
    /// tarq's own: the instance asked cannot feed replicas (no WAL, or it is a replica).
    pub const ER_REPLICATION: u32 = 1001;
    /// tarq's own: the replica's log is of another history than the primary's (Tarantool's
    /// ER_REPLICASET_UUID_MISMATCH); a replica outside a cluster keeps its data and retries.
    pub const ER_HISTORY_MISMATCH: u32 = 1002;
    /// tarq's own: a change was applied here but could not be confirmed (its synchronous
    /// quorum or etcd's record of it did not come in time, the leadership ran out, or the link
    /// that carried it failed): it may survive or be lost. Unlike ER_READONLY, where nothing
    /// was done, a client must not simply retry it.
    pub const ER_OUTCOME_UNKNOWN: u32 = 1003;
}

/// The schema version sent in every reply header (key 0x05). Constant because our "schema"
/// never changes; net.box re-fetches the schema whenever this value moves, and fails outright
/// when the key is missing.
pub const SCHEMA_VERSION: u64 = 1;

/// The system spaces clients SELECT from at connect; answered with an empty result.
/// `_vspace` 281, `_vindex` 289, `_vcollation` 277, `_vspace_sequence` 341.
pub const SYSTEM_SPACES: [u64; 4] = [281, 289, 277, 341];

/// Default cap on one frame (header + body). Tarantool allows 2 GiB; a task queue's messages are
/// small, and the cap bounds the read buffer one connection can make the server hold.
pub const DEFAULT_MAX_FRAME_BYTES: usize = 16 * 1024 * 1024;

/// Length of a reply's size prefix: always `0xce` + big-endian u32, since tarantool-python reads
/// exactly 5 bytes and go-tarantool rejects any other width.
pub const LEN_PREFIX: usize = 5;

/// Where one frame lies in a buffer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Frame {
    /// Bytes of the size prefix (1 to 9: any MessagePack uint width is accepted).
    pub prefix: usize,
    /// Bytes of header + body, as announced.
    pub len: usize,
}

impl Frame {
    /// Bytes the frame takes in the stream, prefix included.
    pub fn total(&self) -> usize {
        self.prefix + self.len
    }
}

/// Broken framing: the connection cannot be resynchronised and must be closed after the error.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FrameError {
    #[error("Invalid MsgPack - packet length (byte 0x{0:02x} is not an unsigned integer)")]
    NotUint(u8),
    #[error("Invalid MsgPack - too big packet size in the header: {len} (the limit is {max})")]
    TooBig { len: u64, max: usize },
}

/// Finds the first frame in `buf`: `Ok(None)` while it is incomplete (read more), an error when
/// the size prefix is not a MessagePack uint or announces more than `max_len` bytes. Nothing is
/// allocated here: a caller can refuse a huge announced size before buffering any of it.
pub fn split_frame(buf: &[u8], max_len: usize) -> Result<Option<Frame>, FrameError> {
    let Some(frame) = read_prefix(buf)? else {
        return Ok(None);
    };
    if frame.len as u64 > max_len as u64 || frame.len == usize::MAX {
        return Err(FrameError::TooBig {
            len: frame.len as u64,
            max: max_len,
        });
    }
    Ok((buf.len() >= frame.total()).then_some(frame))
}

/// The bytes the first frame in `buf` takes, prefix included, once its prefix is complete and
/// valid (whether or not its body has arrived): what a reader sizes its buffer to.
pub fn announced_total(buf: &[u8]) -> Option<usize> {
    read_prefix(buf)
        .ok()
        .flatten()
        .and_then(|f| f.prefix.checked_add(f.len))
}

/// The size prefix: `Ok(None)` until it is complete. A length beyond `usize` reads as
/// `usize::MAX`, which no cap admits.
fn read_prefix(buf: &[u8]) -> Result<Option<Frame>, FrameError> {
    let Some(&first) = buf.first() else {
        return Ok(None);
    };
    let (prefix, len) = match first {
        0x00..=0x7f => (1, u64::from(first)),
        0xcc..=0xcf => {
            let width = 1usize << (first - 0xcc);
            let Some(bytes) = buf.get(1..1 + width) else {
                return Ok(None);
            };
            let len = bytes.iter().fold(0u64, |acc, &b| (acc << 8) | u64::from(b));
            (1 + width, len)
        }
        _ => return Err(FrameError::NotUint(first)),
    };
    Ok(Some(Frame {
        prefix,
        len: usize::try_from(len).unwrap_or(usize::MAX),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_accept_any_uint_width_and_wait_when_incomplete() {
        let ping = [0xce, 0, 0, 0, 5, 0x82, 0x01, 0x04, 0x00, 0x40];
        assert_eq!(
            split_frame(&ping, 100),
            Ok(Some(Frame { prefix: 5, len: 5 }))
        );
        for cut in 0..ping.len() {
            assert_eq!(split_frame(&ping[..cut], 100), Ok(None), "cut at {cut}");
        }
        let py = [0x07, 0x83, 0x00, 0x40, 0x01, 0x00, 0x05, 0x00];
        assert_eq!(split_frame(&py, 100), Ok(Some(Frame { prefix: 1, len: 7 })));
        assert_eq!(
            split_frame(&[0xcc, 3, 1, 2, 3], 100),
            Ok(Some(Frame { prefix: 2, len: 3 }))
        );
        assert_eq!(
            split_frame(&[0xcd, 0, 1, 9], 100),
            Ok(Some(Frame { prefix: 3, len: 1 }))
        );
        let mut u64f = vec![0xcf, 0, 0, 0, 0, 0, 0, 0, 1];
        u64f.push(0xc0);
        assert_eq!(
            split_frame(&u64f, 100),
            Ok(Some(Frame { prefix: 9, len: 1 }))
        );
    }

    #[test]
    fn bad_prefixes_and_huge_sizes_are_refused_before_buffering() {
        assert_eq!(
            split_frame(&[0xa1, b'x'], 100),
            Err(FrameError::NotUint(0xa1))
        );
        assert_eq!(
            split_frame(&[0xd0, 0x01], 100),
            Err(FrameError::NotUint(0xd0))
        );
        // 4 GiB announced in 5 bytes: refused at once, not waited for.
        assert_eq!(
            split_frame(&[0xce, 0xff, 0xff, 0xff, 0xff], DEFAULT_MAX_FRAME_BYTES),
            Err(FrameError::TooBig {
                len: 0xffff_ffff,
                max: DEFAULT_MAX_FRAME_BYTES
            })
        );
        assert_eq!(
            FrameError::TooBig { len: 20, max: 10 }.to_string(),
            "Invalid MsgPack - too big packet size in the header: 20 (the limit is 10)"
        );
    }
}
