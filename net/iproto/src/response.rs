//! Server side: encode replies into a connection's output buffer.
//!
//! Every reply is `0xce` + big-endian u32 length (clients rely on that exact width), then the
//! header `{0x00: type, 0x01: sync, 0x05: SCHEMA_VERSION}` in its compact form, then a body. A
//! body of any shape is written between [`begin`] and [`finish`], which patches the length, so
//! nothing is built in a temporary buffer.

use super::auth::CHAP_SHA1;
use super::mp::write;
use super::{keys, types, LEN_PREFIX, SCHEMA_VERSION};

/// The protocol version answered to ID. 3 is what IPROTO.md §11 verified with net.box and
/// tarantool-python; it promises no feature, and the feature list stays empty.
pub const ID_VERSION: u64 = 3;

/// The error type named in the MP_ERROR stack. `ClientError` makes every client report the
/// header's code (net.box leaves `err.code` nil for other types).
pub const ERROR_TYPE: &str = "ClientError";

/// Starts a reply: the length placeholder and the header. Returns where the reply starts, to
/// hand to [`finish`] once the body is written.
pub fn begin(out: &mut Vec<u8>, code: u32, sync: u64) -> usize {
    let start = out.len();
    write::u32_fixed(out, 0);
    write::map_len(out, 3);
    write::uint(out, keys::REQUEST_TYPE);
    write::uint(out, u64::from(code));
    write::uint(out, keys::SYNC);
    write::uint(out, sync);
    write::uint(out, keys::SCHEMA_VERSION);
    write::uint(out, SCHEMA_VERSION);
    start
}

/// Ends the reply begun at `start`: writes its length into the placeholder.
pub fn finish(out: &mut [u8], start: usize) {
    let len = out.len() - start - LEN_PREFIX;
    // Replies are built from frames capped far below 4 GiB; saturate rather than wrap if a
    // caller ever broke that.
    let len = u32::try_from(len).unwrap_or(u32::MAX);
    out[start + 1..start + LEN_PREFIX].copy_from_slice(&len.to_be_bytes());
}

/// `{}`: the reply to PING and AUTH.
pub fn ok_empty(out: &mut Vec<u8>, sync: u64) {
    let start = begin(out, types::OK, sync);
    write::map_len(out, 0);
    finish(out, start);
}

/// `{0x30: []}`: an empty result (SELECT on a system space, a call with no return value).
pub fn empty_data(out: &mut Vec<u8>, sync: u64) {
    let start = begin(out, types::OK, sync);
    write::map_len(out, 1);
    write::uint(out, keys::DATA);
    write::array_len(out, 0);
    finish(out, start);
}

/// Starts an OK reply whose body is `{0x30: [...]}` with `items` values, written by the caller
/// before [`finish`].
pub fn begin_data(out: &mut Vec<u8>, sync: u64, items: u32) -> usize {
    let start = begin(out, types::OK, sync);
    write::map_len(out, 1);
    write::uint(out, keys::DATA);
    write::array_len(out, items);
    start
}

/// Starts a `{0x30: [...]}` reply whose number of items is known only once they are written:
/// the array's length is a fixed-width placeholder. Returns where the reply starts and where
/// the placeholder is, for [`finish_counted`].
pub fn begin_data_counted(out: &mut Vec<u8>, sync: u64) -> (usize, usize) {
    let start = begin(out, types::OK, sync);
    write::map_len(out, 1);
    write::uint(out, keys::DATA);
    out.push(0xdd);
    let at = out.len();
    out.extend_from_slice(&[0; 4]);
    (start, at)
}

/// Ends a reply begun with [`begin_data_counted`] holding `items` values.
pub fn finish_counted(out: &mut [u8], (start, at): (usize, usize), items: u32) {
    out[at..at + 4].copy_from_slice(&items.to_be_bytes());
    finish(out, start);
}

/// The reply to ID: `{0x54: version, 0x55: [], 0x5b: "chap-sha1"}`.
pub fn id(out: &mut Vec<u8>, sync: u64, version: u64) {
    let start = begin(out, types::OK, sync);
    write::map_len(out, 3);
    write::uint(out, keys::VERSION);
    write::uint(out, version);
    write::uint(out, keys::FEATURES);
    write::array_len(out, 0);
    write::uint(out, keys::AUTH_TYPE);
    write::str(out, CHAP_SHA1);
    finish(out, start);
}

/// An error reply: type `0x8000 | code`, body `{0x31: message, 0x52: stack}` with the complete
/// six-key MP_ERROR entry (tarantool-python indexes all six). The file and line in the stack are
/// the caller's.
#[track_caller]
pub fn error(out: &mut Vec<u8>, sync: u64, code: u32, message: &str) {
    let at = std::panic::Location::caller();
    error_at(out, sync, code, message, at.file(), at.line());
}

/// [`error`] with an explicit file and line for the stack entry.
pub fn error_at(out: &mut Vec<u8>, sync: u64, code: u32, message: &str, file: &str, line: u32) {
    // go-tarantool reports an error with an empty 0x31 as a success: never send one.
    let message = if message.is_empty() {
        "Unknown error"
    } else {
        message
    };
    let start = begin(out, types::ERROR | code, sync);
    write::map_len(out, 2);
    write::uint(out, keys::ERROR_24);
    write::str(out, message);
    write::uint(out, keys::ERROR);
    write::map_len(out, 1);
    write::uint(out, 0); // MP_ERROR_STACK
    write::array_len(out, 1);
    write::map_len(out, 6);
    write::uint(out, 0); // MP_ERROR_TYPE
    write::str(out, ERROR_TYPE);
    write::uint(out, 1); // MP_ERROR_FILE
    write::str(out, file);
    write::uint(out, 2); // MP_ERROR_LINE
    write::uint(out, u64::from(line));
    write::uint(out, 3); // MP_ERROR_MESSAGE
    write::str(out, message);
    write::uint(out, 4); // MP_ERROR_ERRNO
    write::uint(out, 0);
    write::uint(out, 5); // MP_ERROR_CODE
    write::uint(out, u64::from(code));
    finish(out, start);
}

/// An error reply with only 0x31 (the minimal form clients accept).
pub fn error_short(out: &mut Vec<u8>, sync: u64, code: u32, message: &str) {
    let start = begin(out, types::ERROR | code, sync);
    write::map_len(out, 1);
    write::uint(out, keys::ERROR_24);
    write::str(out, message);
    finish(out, start);
}

#[cfg(test)]
mod tests {
    use super::super::codes::*;
    use super::*;

    fn hex(s: &str) -> Vec<u8> {
        // Hex bytes separated by spaces; "quoted text" stands for its bytes.
        let mut out = Vec::new();
        for (i, part) in s.split('"').enumerate() {
            if i % 2 == 1 {
                out.extend_from_slice(part.as_bytes());
            } else {
                out.extend(
                    part.split_whitespace()
                        .map(|t| u8::from_str_radix(t, 16).unwrap()),
                );
            }
        }
        out
    }

    /// Every vector here is from IPROTO.md §10.
    fn check(expected: &str, encode: impl FnOnce(&mut Vec<u8>)) {
        let mut out = vec![0xaa]; // replies append; what was there stays
        encode(&mut out);
        assert_eq!(out[0], 0xaa);
        assert_eq!(hex(expected), out[1..], "{:02x?}", &out[1..]);
    }

    #[test]
    fn a_counted_reply_patches_its_item_count() {
        check(
            "ce 00 00 00 10 83 00 00 01 07 05 01 81 30 dd 00 00 00 02 01 02",
            |o| {
                let at = begin_data_counted(o, 7);
                write::uint(o, 1);
                write::uint(o, 2);
                finish_counted(o, at, 2);
            },
        );
    }

    #[test]
    fn ping_reply() {
        check("ce 00 00 00 08 83 00 00 01 04 05 01 80", |o| ok_empty(o, 4));
    }

    #[test]
    fn put_reply() {
        check(
            r#"ce 00 00 00 24 83 00 00 01 05 05 01
               81 30 91 83 a2 "id" 01 a6 "status" a1 "R" a4 "data" 91 a5 "hello""#,
            |o| {
                let start = begin_data(o, 5, 1);
                write::map_len(o, 3);
                write::str(o, "id");
                write::uint(o, 1);
                write::str(o, "status");
                write::str(o, "R");
                write::str(o, "data");
                o.extend_from_slice(&hex(r#"91 a5 "hello""#));
                finish(o, start);
            },
        );
    }

    #[test]
    fn error_reply_with_both_keys() {
        check(
            r#"ce 00 00 00 38 83 00 cd 80 20 01 09 05 01
               82 31 a4 "boom"
               52 81 00 91 86 00 ab "ClientError" 01 a8 "queue.rs" 02 01
               03 a4 "boom" 04 00 05 20"#,
            |o| error_at(o, 9, ER_PROC_LUA, "boom", "queue.rs", 1),
        );
    }

    #[test]
    fn short_error_reply() {
        check(
            r#"ce 00 00 00 32 83 00 cd 80 21 01 09 05 01 81 31 d9 25
               "Procedure 'queue.nope' is not defined""#,
            |o| {
                error_short(
                    o,
                    9,
                    ER_NO_SUCH_PROC,
                    "Procedure 'queue.nope' is not defined",
                )
            },
        );
        check(
            r#"ce 00 00 00 23 83 00 cd 80 30 01 01 05 01 81 31 b7 "Unknown request type 73""#,
            |o| error_short(o, 1, ER_UNKNOWN_REQUEST_TYPE, "Unknown request type 73"),
        );
    }

    #[test]
    fn id_and_empty_select_replies() {
        check(
            r#"ce 00 00 00 17 83 00 00 01 01 05 01 83 54 01 55 90 5b a9 "chap-sha1""#,
            |o| id(o, 1, 1),
        );
        check("ce 00 00 00 0a 83 00 00 01 01 05 01 81 30 90", |o| {
            empty_data(o, 1)
        });
    }

    #[test]
    fn an_empty_message_is_never_sent() {
        let mut out = Vec::new();
        error(&mut out, 1, ER_PROC_LUA, "");
        let needle = b"Unknown error";
        assert!(out.windows(needle.len()).any(|w| w == needle));
    }
}
