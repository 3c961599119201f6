//! Redis (RESP2) driver for the reliable-queue pattern: `LPUSH queue v` to put,
//! `BLMOVE queue processing RIGHT LEFT timeout` to take (the value moves atomically into a
//! processing list, so a crashed consumer loses nothing; `LMOVE` when the take must not block),
//! `LREM processing 1 v` to ack.
//! Replies come back in request order. The RESP value parser here is a small, bounded one:
//! only what those three commands can answer.

use super::{excerpt, Driver, Duplex, Frame, Kind, ProtoError, Reply, Request, Role};

/// Largest bulk string accepted: Redis's own default `proto-max-bulk-len` (512 MiB) is far
/// beyond any payload the loadgen sends, so 64 MiB flags a desynchronised stream early.
pub const MAX_BULK_BYTES: usize = 64 << 20;
/// Longest `+`/`-`/`:` line: error messages are short; a longer line means garbage.
pub const MAX_LINE_BYTES: usize = 4096;
/// Nesting limit for arrays: none of our commands returns nested arrays.
const MAX_DEPTH: usize = 4;

/// A parsed RESP value, borrowing from the buffer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Value<'a> {
    Simple(&'a [u8]),
    Error(&'a [u8]),
    Int(i64),
    Bulk(&'a [u8]),
    Null,
    Array(Vec<Value<'a>>),
}

/// Parse one RESP value at the front of `buf`: `Ok(None)` if incomplete, else the value and the
/// bytes it used.
pub fn parse(buf: &[u8]) -> Result<Option<(Value<'_>, usize)>, ProtoError> {
    parse_at(buf, 0)
}

fn parse_at(buf: &[u8], depth: usize) -> Result<Option<(Value<'_>, usize)>, ProtoError> {
    if depth > MAX_DEPTH {
        return Err(ProtoError::Malformed(format!(
            "RESP arrays nested deeper than {MAX_DEPTH}"
        )));
    }
    let Some(line_end) = find_crlf(buf)? else {
        return Ok(None);
    };
    let line = &buf[1..line_end];
    let after = line_end + 2;
    match buf[0] {
        b'+' => Ok(Some((Value::Simple(line), after))),
        b'-' => Ok(Some((Value::Error(line), after))),
        b':' => Ok(Some((Value::Int(parse_int(line)?), after))),
        b'$' => {
            let n = parse_int(line)?;
            if n < 0 {
                return Ok(Some((Value::Null, after)));
            }
            let n = n as usize;
            if n > MAX_BULK_BYTES {
                return Err(ProtoError::TooBig {
                    len: n,
                    limit: MAX_BULK_BYTES,
                });
            }
            if buf.len() < after + n + 2 {
                return Ok(None);
            }
            if &buf[after + n..after + n + 2] != b"\r\n" {
                return Err(ProtoError::Malformed(format!(
                    "bulk string of {n} bytes not followed by CRLF"
                )));
            }
            Ok(Some((Value::Bulk(&buf[after..after + n]), after + n + 2)))
        }
        b'*' => {
            let n = parse_int(line)?;
            if n < 0 {
                return Ok(Some((Value::Null, after)));
            }
            let mut items = Vec::with_capacity((n as usize).min(16));
            let mut pos = after;
            for _ in 0..n {
                match parse_at(&buf[pos..], depth + 1)? {
                    Some((v, used)) => {
                        items.push(v);
                        pos += used;
                    }
                    None => return Ok(None),
                }
            }
            Ok(Some((Value::Array(items), pos)))
        }
        other => Err(ProtoError::Malformed(format!(
            "unknown RESP type byte {other:#04x} in {}",
            excerpt(buf)
        ))),
    }
}

/// Index of the first CRLF, refusing lines longer than `MAX_LINE_BYTES`.
fn find_crlf(buf: &[u8]) -> Result<Option<usize>, ProtoError> {
    let window = &buf[..buf.len().min(MAX_LINE_BYTES + 2)];
    match window.windows(2).position(|w| w == b"\r\n") {
        Some(i) => Ok(Some(i)),
        None if buf.len() > MAX_LINE_BYTES + 1 => Err(ProtoError::TooBig {
            len: buf.len(),
            limit: MAX_LINE_BYTES,
        }),
        None => Ok(None),
    }
}

fn parse_int(line: &[u8]) -> Result<i64, ProtoError> {
    std::str::from_utf8(line)
        .ok()
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| ProtoError::Malformed(format!("bad RESP integer {}", excerpt(line))))
}

/// Append a command as a RESP array of bulk strings.
pub fn write_command(out: &mut Vec<u8>, args: &[&[u8]]) {
    out.push(b'*');
    push_decimal(out, args.len());
    out.extend_from_slice(b"\r\n");
    for a in args {
        out.push(b'$');
        push_decimal(out, a.len());
        out.extend_from_slice(b"\r\n");
        out.extend_from_slice(a);
        out.extend_from_slice(b"\r\n");
    }
}

fn push_decimal(out: &mut Vec<u8>, n: usize) {
    let mut tmp = [0u8; 20];
    let mut i = tmp.len();
    let mut n = n;
    loop {
        i -= 1;
        tmp[i] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    out.extend_from_slice(&tmp[i..]);
}

/// The reliable-queue driver.
pub struct RedisDriver {
    queue: Vec<u8>,
    processing: Vec<u8>,
    /// `BLMOVE` timeout, as Redis reads it (seconds, decimal).
    timeout: Vec<u8>,
    seq: u64,
}

impl RedisDriver {
    /// Keys are namespaced by `run` so concurrent or earlier runs never mix their messages.
    pub fn new(run: u64, take_timeout_s: f64) -> Self {
        RedisDriver {
            queue: format!("tarq-loadgen:{run:016x}:queue").into_bytes(),
            processing: format!("tarq-loadgen:{run:016x}:processing").into_bytes(),
            timeout: format!("{take_timeout_s}").into_bytes(),
            seq: 0,
        }
    }
}

impl Driver for RedisDriver {
    fn handshake(&mut self, _stream: &mut dyn Duplex, _role: Role) -> Result<(), ProtoError> {
        Ok(())
    }

    fn encode(&mut self, out: &mut Vec<u8>, req: Request<'_>) -> u64 {
        match req {
            Request::Put(v) => write_command(out, &[b"LPUSH", &self.queue, v]),
            Request::Take { wait: true } => write_command(
                out,
                &[
                    b"BLMOVE",
                    &self.queue,
                    &self.processing,
                    b"RIGHT",
                    b"LEFT",
                    &self.timeout,
                ],
            ),
            Request::Take { wait: false } => write_command(
                out,
                &[b"LMOVE", &self.queue, &self.processing, b"RIGHT", b"LEFT"],
            ),
            Request::Ack { data, .. } => {
                write_command(out, &[b"LREM", &self.processing, b"1", data])
            }
        }
        self.seq += 1;
        self.seq
    }

    fn split<'a>(&self, buf: &'a [u8]) -> Result<Option<Frame<'a>>, ProtoError> {
        if buf.is_empty() {
            return Ok(None);
        }
        Ok(parse(buf)?.map(|(_, len)| Frame {
            len,
            sync: None,
            reply: None,
        }))
    }

    fn decode<'a>(&self, frame: &'a [u8], kind: Kind) -> Result<Reply<'a>, ProtoError> {
        let (value, _) =
            parse(frame)?.ok_or_else(|| ProtoError::Malformed("incomplete RESP frame".into()))?;
        match (kind, value) {
            (_, Value::Error(msg)) => Ok(Reply::Error(String::from_utf8_lossy(msg).into_owned())),
            (Kind::Put, Value::Int(_)) => Ok(Reply::Put),
            (Kind::Take, Value::Bulk(data)) => Ok(Reply::Task { id: 0, data }),
            (Kind::Take, Value::Null) => Ok(Reply::NoTask),
            (Kind::Ack, Value::Int(1)) => Ok(Reply::Acked),
            (Kind::Ack, Value::Int(n)) => Ok(Reply::Error(format!(
                "LREM removed {n} values from the processing list, expected 1"
            ))),
            (kind, other) => Err(ProtoError::Unexpected {
                kind,
                reply: format!("{other:?}"),
            }),
        }
    }

    fn ordered(&self) -> bool {
        true
    }

    fn blocking_takes(&self) -> bool {
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(input: &[u8], expected: Option<(Value<'_>, usize)>) {
        assert_eq!(parse(input).unwrap(), expected, "input {input:?}");
    }

    #[test]
    fn parses_each_reply_type() {
        check(b"+OK\r\n", Some((Value::Simple(b"OK"), 5)));
        check(
            b"-ERR wrong\r\nrest",
            Some((Value::Error(b"ERR wrong"), 12)),
        );
        check(b":42\r\n", Some((Value::Int(42), 5)));
        check(b":-3\r\n", Some((Value::Int(-3), 5)));
        check(b"$5\r\nhello\r\n", Some((Value::Bulk(b"hello"), 11)));
        check(b"$0\r\n\r\n", Some((Value::Bulk(b""), 6)));
        check(b"$-1\r\n", Some((Value::Null, 5)));
        check(b"*-1\r\n", Some((Value::Null, 5)));
        check(
            b"*2\r\n$1\r\na\r\n:7\r\n",
            Some((Value::Array(vec![Value::Bulk(b"a"), Value::Int(7)]), 15)),
        );
    }

    #[test]
    fn binary_bulk_strings_keep_crlf_inside() {
        check(b"$4\r\n\r\n\r\n\r\n", Some((Value::Bulk(b"\r\n\r\n"), 10)));
    }

    #[test]
    fn incomplete_input_asks_for_more() {
        for input in [
            &b""[..],
            b"+OK",
            b"+OK\r",
            b"$5\r\nhel",
            b"$5\r\nhello",
            b"$5\r\nhello\r",
            b"*2\r\n$1\r\na\r\n",
        ] {
            assert_eq!(parse(input).unwrap(), None, "input {input:?}");
        }
    }

    #[test]
    fn garbage_is_an_error_naming_it() {
        let err = parse(b"?what\r\n").unwrap_err().to_string();
        assert!(err.contains("0x3f"), "{err}");
        let err = parse(b":x1\r\n").unwrap_err().to_string();
        assert!(err.contains("bad RESP integer"), "{err}");
        let err = parse(b"$3\r\nabcXY").unwrap_err().to_string();
        assert!(err.contains("not followed by CRLF"), "{err}");
        let long = vec![b'+'; MAX_LINE_BYTES + 10];
        assert!(matches!(parse(&long), Err(ProtoError::TooBig { .. })));
        let huge = format!("${}\r\n", MAX_BULK_BYTES + 1);
        assert!(matches!(
            parse(huge.as_bytes()),
            Err(ProtoError::TooBig { .. })
        ));
    }

    #[test]
    fn commands_are_arrays_of_bulk_strings() {
        let mut out = Vec::new();
        write_command(&mut out, &[b"LPUSH", b"q", b"a\r\nb"]);
        assert_eq!(out, b"*3\r\n$5\r\nLPUSH\r\n$1\r\nq\r\n$4\r\na\r\nb\r\n");
        let mut d = RedisDriver::new(1, 0.1);
        let mut out = Vec::new();
        d.encode(&mut out, Request::Take { wait: true });
        let (v, used) = parse(&out).unwrap().unwrap();
        let Value::Array(items) = v else {
            panic!("not an array")
        };
        assert_eq!(items[0], Value::Bulk(b"BLMOVE"));
        assert_eq!(items[5], Value::Bulk(b"0.1"));
        d.encode(&mut out, Request::Take { wait: false });
        let (v, _) = parse(&out[used..]).unwrap().unwrap();
        let Value::Array(items) = v else {
            panic!("not an array")
        };
        assert_eq!(items.len(), 5);
        assert_eq!(items[0], Value::Bulk(b"LMOVE"));
    }

    #[test]
    fn replies_map_to_queue_outcomes() {
        let d = RedisDriver::new(1, 0.1);
        assert_eq!(d.decode(b":3\r\n", Kind::Put).unwrap(), Reply::Put);
        assert_eq!(
            d.decode(b"$2\r\nab\r\n", Kind::Take).unwrap(),
            Reply::Task { id: 0, data: b"ab" }
        );
        assert_eq!(d.decode(b"*-1\r\n", Kind::Take).unwrap(), Reply::NoTask);
        assert_eq!(d.decode(b":1\r\n", Kind::Ack).unwrap(), Reply::Acked);
        assert!(matches!(
            d.decode(b":0\r\n", Kind::Ack).unwrap(),
            Reply::Error(_)
        ));
        assert_eq!(
            d.decode(b"-WRONGTYPE x\r\n", Kind::Put).unwrap(),
            Reply::Error("WRONGTYPE x".into())
        );
        assert!(d.decode(b"+OK\r\n", Kind::Take).is_err());
    }
}
