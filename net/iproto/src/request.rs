//! Server side: decode one request frame (header + optional body, the size prefix already cut by
//! [`split_frame`](super::split_frame)) into a [`Request`] that borrows from the read buffer.
//!
//! Every byte of the body is validated, unknown keys included, with the bounded skipper of
//! [`mp`](super::mp); call arguments come back as the raw bytes of their array so the queue can
//! keep a payload exactly as sent. A bad body is a [`DecodeError`] carrying the request's sync
//! and the error to answer with; the connection stays usable (only framing errors are fatal).

use super::codes::{ER_INVALID_MSGPACK, ER_MISSING_REQUEST_FIELD};
use super::mp::{MpError, Reader};
use super::{keys, types};

/// An empty MessagePack array: the args of a CALL that carries no 0x21.
const NO_ARGS: &[u8] = &[0x90];

/// A decoded request.
#[derive(Debug, Clone, PartialEq)]
pub struct Request<'a> {
    /// Echoed in the reply; 0 when the client sent none.
    pub sync: u64,
    pub kind: RequestKind<'a>,
}

#[derive(Debug, Clone, PartialEq)]
pub enum RequestKind<'a> {
    Ping,
    /// CALL (10) or CALL_16 (6). `args` is the raw MessagePack array, already validated.
    Call {
        function: &'a str,
        args: &'a [u8],
        call16: bool,
    },
    /// AUTH (7). `method`/`scramble` are absent for a guest's empty tuple.
    Auth {
        user: &'a str,
        method: Option<&'a str>,
        scramble: Option<&'a [u8]>,
    },
    /// ID (73): the client's protocol version.
    Id {
        version: u64,
    },
    /// SELECT (1): only the space matters here.
    Select {
        space: u64,
    },
    /// EVAL (8): the Lua expression and its raw MessagePack args. tarq runs no Lua: the server
    /// recognises the few expressions clients send and refuses the rest.
    Eval {
        expr: &'a str,
        args: &'a [u8],
    },
    /// JOIN (65): a replica asks for a snapshot and the stream after it; its build stores WAL
    /// format `format` (`None`: a replica from before the format was exchanged).
    Join {
        format: Option<u32>,
    },
    /// SUBSCRIBE (66): a replica asks for the stream after record `after`, which it holds
    /// as of `term` in the log of history `history` (0: unknown); `format` as for JOIN.
    Subscribe {
        after: u64,
        term: u64,
        history: u64,
        format: Option<u32>,
    },
    /// Any other request type, answered with error 48; its body is not read.
    Other(u32),
}

/// A request that could not be decoded: reply with `code`/`message` under `sync`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message} (code {code}, sync {sync})")]
pub struct DecodeError {
    pub sync: u64,
    pub code: u32,
    pub message: String,
}

fn invalid(sync: u64, part: &str, e: MpError) -> DecodeError {
    DecodeError {
        sync,
        code: ER_INVALID_MSGPACK,
        message: format!("Invalid MsgPack - {part}: {e}"),
    }
}

fn missing(sync: u64, field: &str) -> DecodeError {
    DecodeError {
        sync,
        code: ER_MISSING_REQUEST_FIELD,
        message: format!("Missing mandatory field '{field}' in request"),
    }
}

/// Decodes the header and body of one frame (`frame` excludes the size prefix).
pub fn decode(frame: &[u8]) -> Result<Request<'_>, DecodeError> {
    let mut r = Reader::new(frame);
    let (rtype, sync) = decode_header(&mut r).map_err(|e| invalid(0, "packet header", e))?;
    let Some(rtype) = rtype else {
        return Err(DecodeError {
            sync,
            code: ER_INVALID_MSGPACK,
            message: "Invalid MsgPack - packet header: no request type (key 0x00)".into(),
        });
    };
    let kind = match u32::try_from(rtype).unwrap_or(u32::MAX) {
        types::PING => {
            // PING has no body, but a client may send an empty one: validate what is there.
            body_fields(&mut r, sync, |_, _| Ok(false))?;
            RequestKind::Ping
        }
        t @ (types::CALL | types::CALL_16) => decode_call(&mut r, sync, t == types::CALL_16)?,
        types::AUTH => decode_auth(&mut r, sync)?,
        types::ID => {
            let mut version = 0;
            body_fields(&mut r, sync, |key, r| {
                if key == keys::VERSION {
                    version = r.read_uint()?;
                    return Ok(true);
                }
                Ok(false)
            })?;
            RequestKind::Id { version }
        }
        types::SELECT => {
            let mut space = None;
            body_fields(&mut r, sync, |key, r| {
                if key == keys::SPACE_ID {
                    space = Some(r.read_uint()?);
                    return Ok(true);
                }
                Ok(false)
            })?;
            RequestKind::Select {
                space: space.ok_or_else(|| missing(sync, "space id"))?,
            }
        }
        types::EVAL => decode_eval(&mut r, sync)?,
        super::replication::JOIN => {
            let format = super::replication::join_format(r.remaining())
                .map_err(|e| invalid(sync, "packet body", e))?;
            RequestKind::Join { format }
        }
        super::replication::SUBSCRIBE => {
            let s = super::replication::subscribe_position(r.remaining())
                .map_err(|e| invalid(sync, "packet body", e))?;
            RequestKind::Subscribe {
                after: s.after,
                term: s.term,
                history: s.history,
                format: s.format,
            }
        }
        other => RequestKind::Other(other),
    };
    Ok(Request { sync, kind })
}

/// Reads the header map: (request type, sync), skipping (and validating) any other key.
fn decode_header(r: &mut Reader<'_>) -> Result<(Option<u64>, u64), MpError> {
    let n = r.read_map_len()?;
    let (mut rtype, mut sync) = (None, 0);
    for _ in 0..n {
        match r.read_uint()? {
            keys::REQUEST_TYPE => rtype = Some(r.read_uint()?),
            keys::SYNC => sync = r.read_uint()?,
            _ => {
                r.skip_value()?;
            }
        }
    }
    Ok((rtype, sync))
}

/// Walks the body map, if there is one: `field(key, reader)` consumes the value of a key it
/// knows and returns true; every other value is skipped (and validated). The body must end
/// exactly at the end of the frame.
fn body_fields<'a>(
    r: &mut Reader<'a>,
    sync: u64,
    mut field: impl FnMut(u64, &mut Reader<'a>) -> Result<bool, MpError>,
) -> Result<(), DecodeError> {
    if r.is_empty() {
        return Ok(());
    }
    let mut walk = |r: &mut Reader<'a>| -> Result<(), MpError> {
        let n = r.read_map_len()?;
        for _ in 0..n {
            let key = r.read_uint()?;
            if !field(key, r)? {
                r.skip_value()?;
            }
        }
        Ok(())
    };
    walk(r).map_err(|e| invalid(sync, "packet body", e))?;
    if !r.is_empty() {
        return Err(DecodeError {
            sync,
            code: ER_INVALID_MSGPACK,
            message: format!(
                "Invalid MsgPack - packet body: {} bytes after the body map",
                r.remaining().len()
            ),
        });
    }
    Ok(())
}

fn decode_call<'a>(
    r: &mut Reader<'a>,
    sync: u64,
    call16: bool,
) -> Result<RequestKind<'a>, DecodeError> {
    let (mut function, mut args) = (None, NO_ARGS);
    body_fields(r, sync, |key, r| match key {
        keys::FUNCTION_NAME => {
            function = Some(r.read_str()?);
            Ok(true)
        }
        keys::TUPLE => {
            // The args must be an array; skipping it validates every value inside.
            let mut probe = *r;
            probe.read_array_len()?;
            args = r.skip_value()?;
            Ok(true)
        }
        _ => Ok(false),
    })?;
    Ok(RequestKind::Call {
        function: function.ok_or_else(|| missing(sync, "function name"))?,
        args,
        call16,
    })
}

fn decode_eval<'a>(r: &mut Reader<'a>, sync: u64) -> Result<RequestKind<'a>, DecodeError> {
    let (mut expr, mut args) = (None, NO_ARGS);
    body_fields(r, sync, |key, r| match key {
        keys::EXPR => {
            expr = Some(r.read_str()?);
            Ok(true)
        }
        keys::TUPLE => {
            let mut probe = *r;
            probe.read_array_len()?;
            args = r.skip_value()?;
            Ok(true)
        }
        _ => Ok(false),
    })?;
    Ok(RequestKind::Eval {
        expr: expr.ok_or_else(|| missing(sync, "expression"))?,
        args,
    })
}

fn decode_auth<'a>(r: &mut Reader<'a>, sync: u64) -> Result<RequestKind<'a>, DecodeError> {
    let (mut user, mut tuple) = (None, None);
    body_fields(r, sync, |key, r| match key {
        keys::USER_NAME => {
            user = Some(r.read_str()?);
            Ok(true)
        }
        keys::TUPLE => {
            let n = r.read_array_len()?;
            let mut t = (None, None);
            for i in 0..n {
                match i {
                    0 => t.0 = Some(r.read_str()?),
                    1 => t.1 = Some(r.read_str_or_bin()?),
                    _ => {
                        r.skip_value()?;
                    }
                }
            }
            tuple = Some(t);
            Ok(true)
        }
        _ => Ok(false),
    })?;
    let user = user.ok_or_else(|| missing(sync, "username"))?;
    let (method, scramble) = tuple.ok_or_else(|| missing(sync, "tuple"))?;
    Ok(RequestKind::Auth {
        user,
        method,
        scramble,
    })
}

#[cfg(test)]
mod tests {
    use super::super::codes::ER_INVALID_MSGPACK;
    use super::super::split_frame;
    use super::*;

    /// Cuts the size prefix off a captured request and decodes it.
    fn check(bytes: &[u8]) -> Result<Request<'_>, DecodeError> {
        let f = split_frame(bytes, 1 << 20).unwrap().unwrap();
        assert_eq!(f.total(), bytes.len(), "the vector is exactly one frame");
        decode(&bytes[f.prefix..])
    }

    #[test]
    fn netbox_ping() {
        let req = check(&[0xce, 0, 0, 0, 5, 0x82, 0x01, 0x04, 0x00, 0x40]).unwrap();
        assert_eq!(
            req,
            Request {
                sync: 4,
                kind: RequestKind::Ping
            }
        );
    }

    #[test]
    fn python_ping_with_schema_version_and_fixint_length() {
        let req = check(&[0x07, 0x83, 0x00, 0x40, 0x01, 0x00, 0x05, 0x00]).unwrap();
        assert_eq!(
            req,
            Request {
                sync: 0,
                kind: RequestKind::Ping
            }
        );
    }

    #[test]
    fn netbox_call_put_hello() {
        let mut v = vec![
            0xce, 0, 0, 0, 0x19, 0x82, 0x01, 0x05, 0x00, 0x0a, 0x82, 0x22, 0xa9,
        ];
        v.extend_from_slice(b"queue.put");
        v.extend_from_slice(&[0x21, 0x91, 0xa5]);
        v.extend_from_slice(b"hello");
        let req = check(&v).unwrap();
        let mut args = vec![0x91, 0xa5];
        args.extend_from_slice(b"hello");
        assert_eq!(
            req,
            Request {
                sync: 5,
                kind: RequestKind::Call {
                    function: "queue.put",
                    args: &args,
                    call16: false
                }
            }
        );
    }

    #[test]
    fn python_call_put_hello() {
        let mut v = vec![
            0x1b, 0x83, 0x00, 0x0a, 0x01, 0x00, 0x05, 0x00, 0x82, 0x22, 0xa9,
        ];
        v.extend_from_slice(b"queue.put");
        v.extend_from_slice(&[0x21, 0x91, 0xa5]);
        v.extend_from_slice(b"hello");
        let req = check(&v).unwrap();
        assert!(matches!(
            req.kind,
            RequestKind::Call {
                function: "queue.put",
                call16: false,
                ..
            }
        ));
    }

    #[test]
    fn call_without_args_gets_an_empty_array_and_without_name_fails() {
        let f = [0x82, 0x00, 0x06, 0x01, 0x02, 0x81, 0x22, 0xa1, b'f'];
        let req = decode(&f).unwrap();
        assert_eq!(
            req.kind,
            RequestKind::Call {
                function: "f",
                args: &[0x90],
                call16: true
            }
        );
        let f = [0x82, 0x00, 0x0a, 0x01, 0x03, 0x81, 0x21, 0x90];
        let e = decode(&f).unwrap_err();
        assert_eq!((e.sync, e.code), (3, ER_MISSING_REQUEST_FIELD));
        assert_eq!(
            e.message,
            "Missing mandatory field 'function name' in request"
        );
    }

    #[test]
    fn bad_bodies_keep_the_sync() {
        // args not an array
        let f = [
            0x82, 0x00, 0x0a, 0x01, 0x07, 0x82, 0x22, 0xa1, b'f', 0x21, 0x05,
        ];
        let e = decode(&f).unwrap_err();
        assert_eq!((e.sync, e.code), (7, ER_INVALID_MSGPACK));
        assert!(e.message.contains("expected array"), "{}", e.message);
        // trailing garbage after the body
        let f = [0x82, 0x00, 0x40, 0x01, 0x08, 0x80, 0x00];
        let e = decode(&f).unwrap_err();
        assert_eq!(e.sync, 8);
        assert!(
            e.message.contains("1 bytes after the body map"),
            "{}",
            e.message
        );
        // a string key in the body
        let f = [0x82, 0x00, 0x0a, 0x01, 0x09, 0x81, 0xa1, b'k', 0x01];
        assert_eq!(decode(&f).unwrap_err().sync, 9);
        // a broken header gives sync 0
        let f = [0x82, 0x01, 0x09, 0x00];
        assert_eq!(decode(&f).unwrap_err().sync, 0);
        let f = [0x81, 0x01, 0x09];
        let e = decode(&f).unwrap_err();
        assert_eq!(e.sync, 9);
        assert!(e.message.contains("no request type"));
    }

    #[test]
    fn deep_nesting_in_args_is_refused_not_recursed() {
        let mut f = vec![
            0x82, 0x00, 0x0a, 0x01, 0x0b, 0x82, 0x22, 0xa1, b'f', 0x21, 0x91,
        ];
        f.extend(std::iter::repeat_n(0x91, 100_000));
        f.push(0x01);
        let e = decode(&f).unwrap_err();
        assert_eq!((e.sync, e.code), (11, ER_INVALID_MSGPACK));
        assert!(
            e.message.contains("nesting deeper than 128 levels"),
            "{}",
            e.message
        );
    }

    #[test]
    fn auth_select_id_eval_and_unknown_types() {
        // AUTH guest: {0x23: "guest", 0x21: []}
        let mut f = vec![0x82, 0x00, 0x07, 0x01, 0x01, 0x82, 0x23, 0xa5];
        f.extend_from_slice(b"guest");
        f.extend_from_slice(&[0x21, 0x90]);
        assert_eq!(
            decode(&f).unwrap().kind,
            RequestKind::Auth {
                user: "guest",
                method: None,
                scramble: None
            }
        );
        // AUTH with a bin scramble (python)
        let mut f = vec![
            0x82, 0x00, 0x07, 0x01, 0x01, 0x82, 0x23, 0xa1, b'u', 0x21, 0x92, 0xa9,
        ];
        f.extend_from_slice(b"chap-sha1");
        f.extend_from_slice(&[0xc4, 20]);
        f.extend_from_slice(&[7; 20]);
        assert_eq!(
            decode(&f).unwrap().kind,
            RequestKind::Auth {
                user: "u",
                method: Some("chap-sha1"),
                scramble: Some(&[7; 20])
            }
        );
        // net.box 2.6 SELECT _vspace
        let f = [
            0x82, 0x01, 0x01, 0x00, 0x01, 0x86, 0x10, 0xcd, 0x01, 0x19, 0x11, 0x00, 0x14, 0x02,
            0x13, 0x00, 0x12, 0xce, 0xff, 0xff, 0xff, 0xff, 0x20, 0x90,
        ];
        assert_eq!(
            decode(&f).unwrap(),
            Request {
                sync: 1,
                kind: RequestKind::Select { space: 281 }
            }
        );
        // ID {0x54: 6, 0x55: [2]}
        let f = [
            0x83, 0x00, 0x49, 0x01, 0x00, 0x05, 0x00, 0x82, 0x54, 0x06, 0x55, 0x91, 0x02,
        ];
        assert_eq!(decode(&f).unwrap().kind, RequestKind::Id { version: 6 });
        let f = [0x82, 0x00, 0x08, 0x01, 0x02, 0x81, 0x27, 0xa1, b'x'];
        assert_eq!(
            decode(&f).unwrap().kind,
            RequestKind::Eval {
                expr: "x",
                args: &[0x90]
            }
        );
        let f = [0x82, 0x00, 0x02, 0x01, 0x02, 0x81, 0x10, 0x05];
        assert_eq!(decode(&f).unwrap().kind, RequestKind::Other(2));
    }
}
