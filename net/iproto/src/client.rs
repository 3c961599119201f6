//! Client side of the codec, for the end-to-end tests and the load generator: parse the greeting
//! ([`greeting::parse`](super::greeting::parse)), encode requests (CALL/CALL_16 with raw
//! MessagePack args, PING, AUTH, ID, SELECT, EVAL, or any type with a raw body), split replies
//! with [`split_frame`](super::split_frame) and decode them into a [`Response`] that borrows the
//! raw DATA bytes or the error message. Reply values are bounded by the reply limits of
//! [`mp`](super::mp), which leave room for the task map and body around a payload the server
//! accepted at the request limits.
//!
//! Requests are framed like net.box's: `0xce` + u32 length, header `{0x00: type, 0x01: sync}`.

use super::auth::CHAP_SHA1;
use super::mp::{write, MpError, Reader};
use super::{keys, types, LEN_PREFIX};

pub use super::greeting::{parse as parse_greeting, Greeting, GREETING_LEN};

/// Writes one request frame whose body (if any) is written by `body`.
pub fn request(out: &mut Vec<u8>, rtype: u32, sync: u64, body: impl FnOnce(&mut Vec<u8>)) {
    let start = out.len();
    write::u32_fixed(out, 0);
    write::map_len(out, 2);
    write::uint(out, keys::REQUEST_TYPE);
    write::uint(out, u64::from(rtype));
    write::uint(out, keys::SYNC);
    write::uint(out, sync);
    body(out);
    let len = u32::try_from(out.len() - start - LEN_PREFIX).unwrap_or(u32::MAX);
    out[start + 1..start + LEN_PREFIX].copy_from_slice(&len.to_be_bytes());
}

/// A request with an arbitrary raw body (tests use it to send broken bodies).
pub fn raw(out: &mut Vec<u8>, rtype: u32, sync: u64, body: &[u8]) {
    request(out, rtype, sync, |o| o.extend_from_slice(body));
}

/// PING, without a body (as net.box and python send it).
pub fn ping(out: &mut Vec<u8>, sync: u64) {
    request(out, types::PING, sync, |_| {});
}

/// CALL (10): `args` is a complete MessagePack array, sent as is.
pub fn call(out: &mut Vec<u8>, sync: u64, function: &str, args: &[u8]) {
    call_type(out, types::CALL, sync, function, args);
}

/// CALL_16 (6): like [`call`], replies wrap each value as a tuple.
pub fn call16(out: &mut Vec<u8>, sync: u64, function: &str, args: &[u8]) {
    call_type(out, types::CALL_16, sync, function, args);
}

fn call_type(out: &mut Vec<u8>, rtype: u32, sync: u64, function: &str, args: &[u8]) {
    request(out, rtype, sync, |o| {
        call_head_into(o, function);
        o.extend_from_slice(args);
    });
}

/// The body of a CALL up to its args (`{FUNCTION_NAME: function, TUPLE: `): the same bytes in
/// every call of `function`, so a client sending many encodes it once for [`call_with_head`].
pub fn call_head(function: &str) -> Vec<u8> {
    let mut head = Vec::new();
    call_head_into(&mut head, function);
    head
}

fn call_head_into(out: &mut Vec<u8>, function: &str) {
    write::map_len(out, 2);
    write::uint(out, keys::FUNCTION_NAME);
    write::str(out, function);
    write::uint(out, keys::TUPLE);
}

/// CALL with a body head from [`call_head`]; `args` writes the args array in place.
pub fn call_with_head(out: &mut Vec<u8>, sync: u64, head: &[u8], args: impl FnOnce(&mut Vec<u8>)) {
    request(out, types::CALL, sync, |o| {
        o.extend_from_slice(head);
        args(o);
    });
}

/// AUTH with chap-sha1: `scramble` from [`auth::scramble`](super::auth::scramble).
pub fn auth(out: &mut Vec<u8>, sync: u64, user: &str, scramble: &[u8]) {
    request(out, types::AUTH, sync, |o| {
        write::map_len(o, 2);
        write::uint(o, keys::USER_NAME);
        write::str(o, user);
        write::uint(o, keys::TUPLE);
        write::array_len(o, 2);
        write::str(o, CHAP_SHA1);
        write::bin(o, scramble);
    });
}

/// AUTH as guest: an empty tuple, no password.
pub fn auth_guest(out: &mut Vec<u8>, sync: u64) {
    request(out, types::AUTH, sync, |o| {
        write::map_len(o, 2);
        write::uint(o, keys::USER_NAME);
        write::str(o, "guest");
        write::uint(o, keys::TUPLE);
        write::array_len(o, 0);
    });
}

/// ID (73) with a protocol version and a feature list.
pub fn id(out: &mut Vec<u8>, sync: u64, version: u64, features: &[u64]) {
    request(out, types::ID, sync, |o| {
        write::map_len(o, 2);
        write::uint(o, keys::VERSION);
        write::uint(o, version);
        write::uint(o, keys::FEATURES);
        write::array_len(o, features.len() as u32);
        for &f in features {
            write::uint(o, f);
        }
    });
}

/// SELECT everything from `space` (the 3-key form of net.box 2.10+).
pub fn select(out: &mut Vec<u8>, sync: u64, space: u64) {
    request(out, types::SELECT, sync, |o| {
        write::map_len(o, 3);
        write::uint(o, keys::SPACE_ID);
        write::uint(o, space);
        write::uint(o, 0x12); // LIMIT
        write::uint(o, u64::from(u32::MAX));
        write::uint(o, 0x20); // KEY
        write::array_len(o, 0);
    });
}

/// EVAL (8) of `expr` with raw args.
pub fn eval(out: &mut Vec<u8>, sync: u64, expr: &str, args: &[u8]) {
    request(out, types::EVAL, sync, |o| {
        write::map_len(o, 2);
        write::uint(o, keys::EXPR);
        write::str(o, expr);
        write::uint(o, keys::TUPLE);
        o.extend_from_slice(args);
    });
}

/// A decoded reply. Borrowed pieces are raw MessagePack bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Response<'a> {
    pub sync: u64,
    /// 0 for OK, else the error code (`type & 0x7fff`).
    pub code: u32,
    /// An error reply (the type's 0x8000 bit): Tarantool's ER_UNKNOWN is code 0, so the code
    /// alone does not tell.
    pub failed: bool,
    /// The header's 0x05, if present.
    pub schema_version: Option<u64>,
    /// The body's 0x30 (DATA), a raw array.
    pub data: Option<&'a [u8]>,
    /// The body's 0x31 (the error message).
    pub error: Option<&'a str>,
    /// The body's 0x52 (MP_ERROR stack), raw.
    pub error_stack: Option<&'a [u8]>,
    /// The whole body map, raw (empty if there was none).
    pub body: &'a [u8],
}

impl Response<'_> {
    pub fn is_ok(&self) -> bool {
        !self.failed
    }
}

/// Why a reply could not be decoded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ResponseError {
    #[error("bad reply: {0}")]
    Msgpack(#[from] MpError),
    #[error("reply header has no type (key 0x00)")]
    NoType,
    #[error("reply has {0} bytes after its body")]
    Trailing(usize),
}

/// Decodes one reply frame (without its size prefix).
pub fn decode(frame: &[u8]) -> Result<Response<'_>, ResponseError> {
    let mut r = Reader::new(frame);
    let (mut rtype, mut sync, mut schema_version) = (None, 0, None);
    for _ in 0..r.read_map_len()? {
        match r.read_uint()? {
            keys::REQUEST_TYPE => rtype = Some(r.read_uint()?),
            keys::SYNC => sync = r.read_uint()?,
            keys::SCHEMA_VERSION => schema_version = Some(r.read_uint()?),
            _ => {
                r.skip_reply_value()?;
            }
        }
    }
    let rtype = rtype.ok_or(ResponseError::NoType)?;
    let failed = rtype & u64::from(types::ERROR) != 0;
    let code = if failed { (rtype & 0x7fff) as u32 } else { 0 };
    let mut resp = Response {
        sync,
        code,
        failed,
        schema_version,
        data: None,
        error: None,
        error_stack: None,
        body: r.remaining(),
    };
    if !r.is_empty() {
        for _ in 0..r.read_map_len()? {
            match r.read_uint()? {
                keys::DATA => resp.data = Some(r.skip_reply_value()?),
                keys::ERROR_24 => resp.error = Some(r.read_str()?),
                keys::ERROR => resp.error_stack = Some(r.skip_reply_value()?),
                _ => {
                    r.skip_reply_value()?;
                }
            }
        }
    }
    if !r.is_empty() {
        return Err(ResponseError::Trailing(r.remaining().len()));
    }
    Ok(resp)
}

/// The `id` of the task in a queue call's DATA (`[{id=..., ...}]`, or `[[{...}]]` from
/// CALL_16); `None` when DATA is empty (a take that found nothing).
pub fn task_id(data: &[u8]) -> Result<Option<u64>, MpError> {
    let mut r = Reader::new(data);
    if r.read_array_len()? == 0 {
        return Ok(None);
    }
    let call16 = matches!(
        r.peek_marker()?,
        rmp::Marker::FixArray(_) | rmp::Marker::Array16 | rmp::Marker::Array32
    );
    if call16 && r.read_array_len()? == 0 {
        return Ok(None);
    }
    for _ in 0..r.read_map_len()? {
        let is_id = r.read_str_bytes()? == b"id";
        if is_id {
            return r.read_uint().map(Some);
        }
        r.skip_reply_value()?;
    }
    Ok(None)
}

/// The fields of a task a consumer acts on: its `id` and its `data` as raw MessagePack bytes
/// (exactly what the server stored or re-encoded: a bin, a string, anything).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TaskFields<'a> {
    pub id: Option<u64>,
    pub data: Option<&'a [u8]>,
}

/// The task in a queue call's DATA (`[{...}]`, or `[[{...}]]` from CALL_16) with its payload,
/// for clients that need the data back (the loadgen reads its timing stamp from it); `None`
/// when DATA is empty or holds nil (a take that found nothing).
pub fn task(data: &[u8]) -> Result<Option<TaskFields<'_>>, MpError> {
    let mut r = Reader::new(data);
    if r.read_array_len()? == 0 || r.eat_nil() {
        return Ok(None);
    }
    let call16 = matches!(
        r.peek_marker()?,
        rmp::Marker::FixArray(_) | rmp::Marker::Array16 | rmp::Marker::Array32
    );
    if call16 && (r.read_array_len()? == 0 || r.eat_nil()) {
        return Ok(None);
    }
    let mut fields = TaskFields {
        id: None,
        data: None,
    };
    for _ in 0..r.read_map_len()? {
        match r.read_str_bytes()? {
            b"id" => fields.id = Some(r.read_uint()?),
            b"data" => fields.data = Some(r.skip_reply_value()?),
            _ => {
                r.skip_reply_value()?;
            }
        }
    }
    Ok(Some(fields))
}

#[cfg(test)]
mod tests {
    use super::super::codes::ER_PROC_LUA;
    use super::super::{request as server_request, response, split_frame};
    use super::*;

    #[test]
    fn call_matches_the_netbox_capture() {
        let mut out = Vec::new();
        call(&mut out, 5, "queue.put", b"\x91\xa5hello");
        let mut expected = vec![0xce, 0, 0, 0, 0x19, 0x82, 0x00, 0x0a, 0x01, 0x05];
        expected.extend_from_slice(b"\x82\x22\xa9queue.put\x21\x91\xa5hello");
        assert_eq!(out, expected);
    }

    #[test]
    fn ping_matches_the_netbox_capture_up_to_key_order() {
        let mut out = Vec::new();
        ping(&mut out, 4);
        assert_eq!(out, [0xce, 0, 0, 0, 5, 0x82, 0x00, 0x40, 0x01, 0x04]);
    }

    #[test]
    fn every_request_decodes_on_the_server_side() {
        use server_request::RequestKind as K;
        let mut out = Vec::new();
        ping(&mut out, 1);
        call(&mut out, 2, "f", &[0x90]);
        call16(&mut out, 3, "g", &[0x91, 0x01]);
        auth(&mut out, 4, "u", &[9; 20]);
        auth_guest(&mut out, 5);
        id(&mut out, 6, 3, &[1, 2]);
        select(&mut out, 7, 281);
        eval(&mut out, 8, "return 1", &[0x90]);
        raw(&mut out, 2, 9, &[0x80]);
        let expected = [
            K::Ping,
            K::Call {
                function: "f",
                args: &[0x90],
                call16: false,
            },
            K::Call {
                function: "g",
                args: &[0x91, 0x01],
                call16: true,
            },
            K::Auth {
                user: "u",
                method: Some("chap-sha1"),
                scramble: Some(&[9; 20]),
            },
            K::Auth {
                user: "guest",
                method: None,
                scramble: None,
            },
            K::Id { version: 3 },
            K::Select { space: 281 },
            K::Eval {
                expr: "return 1",
                args: &[0x90],
            },
            K::Other(2),
        ];
        let mut buf = &out[..];
        for (i, want) in expected.into_iter().enumerate() {
            let f = split_frame(buf, 1 << 20).unwrap().unwrap();
            let req = server_request::decode(&buf[f.prefix..f.total()]).unwrap();
            assert_eq!(req.sync, i as u64 + 1);
            assert_eq!(req.kind, want);
            buf = &buf[f.total()..];
        }
        assert!(buf.is_empty());
    }

    #[test]
    fn replies_decode() {
        let mut out = Vec::new();
        let start = response::begin_data(&mut out, 5, 1);
        out.extend_from_slice(b"\x83\xa2id\x07\xa6status\xa1T\xa4data\x01");
        response::finish(&mut out, start);
        response::error(&mut out, 6, ER_PROC_LUA, "Task 3 not taken by anybody");
        response::ok_empty(&mut out, 7);

        let f = split_frame(&out, 1 << 20).unwrap().unwrap();
        let r = decode(&out[f.prefix..f.total()]).unwrap();
        assert_eq!((r.sync, r.code, r.schema_version), (5, 0, Some(1)));
        assert_eq!(task_id(r.data.unwrap()), Ok(Some(7)));
        let rest = &out[f.total()..];
        let f = split_frame(rest, 1 << 20).unwrap().unwrap();
        let r = decode(&rest[f.prefix..f.total()]).unwrap();
        assert_eq!((r.sync, r.code), (6, ER_PROC_LUA));
        assert_eq!(r.error, Some("Task 3 not taken by anybody"));
        assert!(r.error_stack.is_some());
        let rest = &rest[f.total()..];
        let r = decode(&rest[5..]).unwrap();
        assert!(r.is_ok());
        assert_eq!((r.data, r.body), (None, &[0x80][..]));
    }

    #[test]
    fn task_returns_id_and_raw_data_in_every_shape() {
        assert_eq!(task(&[0x90]), Ok(None));
        assert_eq!(task(&[0x91, 0xc0]), Ok(None));
        assert_eq!(task(&[0x91, 0x90]), Ok(None));
        let want = TaskFields {
            id: Some(u64::MAX),
            data: Some(&b"\xc4\x02hi"[..]),
        };
        let call =
            b"\x91\x83\xa2id\xcf\xff\xff\xff\xff\xff\xff\xff\xff\xa6status\xa1T\xa4data\xc4\x02hi";
        assert_eq!(task(call), Ok(Some(want)));
        let call16 = b"\x91\x91\x82\xa4data\xc4\x02hi\xa2id\xcf\xff\xff\xff\xff\xff\xff\xff\xff";
        assert_eq!(task(call16), Ok(Some(want)));
        assert_eq!(
            task(b"\x91\x81\xa6status\xa1R"),
            Ok(Some(TaskFields {
                id: None,
                data: None
            }))
        );
        assert!(task(b"\x91\x81\xa2id").is_err());
    }

    #[test]
    fn task_id_handles_empty_and_call16_shapes() {
        assert_eq!(task_id(&[0x90]), Ok(None));
        assert_eq!(task_id(b"\x91\x91\x81\xa2id\x05"), Ok(Some(5)));
        assert_eq!(
            task_id(b"\x91\x81\xa2id\xcf\0\0\0\0\0\0\0\x09"),
            Ok(Some(9))
        );
    }
}
