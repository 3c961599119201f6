//! beanstalkd driver: `put` / `reserve-with-timeout` / `delete`, on a tube private to the run
//! (producers `use` it, consumers `watch` it and `ignore default`). beanstalkd answers each
//! connection's commands in order, one text line per reply, plus the job body after `RESERVED`.

use super::{excerpt, Driver, Frame, Kind, ProtoError, Reply, Request, Role};
use std::io::{BufRead, BufReader, Write};
use std::net::TcpStream;

/// Longest reply line: the longest beanstalkd reply line (`RESERVED <u64> <u32>`) is under 50
/// bytes; anything past this is a desynchronised stream.
pub const MAX_LINE_BYTES: usize = 256;
/// Largest job body accepted in a reply: beanstalkd's own `-z` maximum job size is 1 GiB, its
/// default 65535; 64 MiB catches garbage long before memory does.
pub const MAX_JOB_BYTES: usize = 64 << 20;
/// beanstalkd's default maximum job size (`-z`): a larger `--payload` is refused up front.
pub const DEFAULT_MAX_JOB_BYTES: usize = 65_535;
/// Priority given to every job: beanstalkd's conventional default (lower runs first).
const PRIORITY: u32 = 1024;
/// Time-to-run in seconds: the consumer deletes within microseconds, so this never fires
/// unless the loadgen dies.
const TTR_S: u32 = 60;

pub struct BeanstalkDriver {
    tube: String,
    /// `reserve-with-timeout` argument (whole seconds, beanstalkd's granularity).
    timeout_s: u32,
    seq: u64,
}

impl BeanstalkDriver {
    pub fn new(run: u64, take_timeout_s: f64) -> Self {
        BeanstalkDriver {
            tube: format!("tarq-loadgen-{run:016x}"),
            timeout_s: take_timeout_s.ceil().max(1.0) as u32,
            seq: 0,
        }
    }
}

fn command(stream: &mut TcpStream, line: &str, expect: &str) -> Result<(), ProtoError> {
    stream.write_all(line.as_bytes())?;
    let mut reader = BufReader::new(&*stream);
    let mut reply = String::new();
    reader.read_line(&mut reply)?;
    if reply.starts_with(expect) {
        Ok(())
    } else {
        Err(ProtoError::Handshake(format!(
            "beanstalkd answered {:?} to {:?}",
            reply.trim_end(),
            line.trim_end()
        )))
    }
}

impl Driver for BeanstalkDriver {
    fn handshake(&mut self, stream: &mut TcpStream, role: Role) -> Result<(), ProtoError> {
        // Each command gets exactly one line back, so the BufReader never reads ahead.
        match role {
            Role::Producer => command(stream, &format!("use {}\r\n", self.tube), "USING "),
            Role::Consumer => {
                command(stream, &format!("watch {}\r\n", self.tube), "WATCHING ")?;
                command(stream, "ignore default\r\n", "WATCHING ")
            }
        }
    }

    fn encode(&mut self, out: &mut Vec<u8>, req: Request<'_>) -> u64 {
        match req {
            Request::Put(data) => {
                let _ = write!(out, "put {PRIORITY} 0 {TTR_S} {}\r\n", data.len());
                out.extend_from_slice(data);
                out.extend_from_slice(b"\r\n");
            }
            Request::Take { wait } => {
                let timeout = if wait { self.timeout_s } else { 0 };
                let _ = write!(out, "reserve-with-timeout {timeout}\r\n");
            }
            Request::Ack { id, .. } => {
                let _ = write!(out, "delete {id}\r\n");
            }
        }
        self.seq += 1;
        self.seq
    }

    fn split(&self, buf: &[u8]) -> Result<Option<Frame>, ProtoError> {
        let window = &buf[..buf.len().min(MAX_LINE_BYTES + 2)];
        let Some(eol) = window.windows(2).position(|w| w == b"\r\n") else {
            if buf.len() > MAX_LINE_BYTES + 1 {
                return Err(ProtoError::TooBig {
                    len: buf.len(),
                    limit: MAX_LINE_BYTES,
                });
            }
            return Ok(None);
        };
        let line = &buf[..eol];
        let mut len = eol + 2;
        if let Some(rest) = line.strip_prefix(b"RESERVED ") {
            let (_, bytes) = reserved_header(rest)?;
            if bytes > MAX_JOB_BYTES {
                return Err(ProtoError::TooBig {
                    len: bytes,
                    limit: MAX_JOB_BYTES,
                });
            }
            len += bytes + 2;
            if buf.len() < len {
                return Ok(None);
            }
        }
        Ok(Some(Frame { len, sync: None }))
    }

    fn decode<'a>(&self, frame: &'a [u8], kind: Kind) -> Result<Reply<'a>, ProtoError> {
        let eol = frame
            .windows(2)
            .position(|w| w == b"\r\n")
            .ok_or_else(|| ProtoError::Malformed("beanstalkd reply without CRLF".into()))?;
        let line = &frame[..eol];
        let word = line.split(|&b| b == b' ').next().unwrap_or(b"");
        match (kind, word) {
            (Kind::Put, b"INSERTED") => Ok(Reply::Put),
            (Kind::Take, b"RESERVED") => {
                let (id, bytes) = reserved_header(&line[b"RESERVED ".len()..])?;
                let body = &frame[eol + 2..];
                if body.len() != bytes + 2 || &body[bytes..] != b"\r\n" {
                    return Err(ProtoError::Malformed(format!(
                        "job body of {} bytes does not match RESERVED {bytes}",
                        body.len().saturating_sub(2)
                    )));
                }
                Ok(Reply::Task {
                    id,
                    data: &body[..bytes],
                })
            }
            (Kind::Take, b"TIMED_OUT") => Ok(Reply::NoTask),
            (Kind::Ack, b"DELETED") => Ok(Reply::Acked),
            (
                _,
                b"BURIED" | b"NOT_FOUND" | b"JOB_TOO_BIG" | b"DRAINING" | b"EXPECTED_CRLF"
                | b"OUT_OF_MEMORY" | b"INTERNAL_ERROR" | b"BAD_FORMAT" | b"UNKNOWN_COMMAND"
                | b"DEADLINE_SOON",
            ) => Ok(Reply::Error(String::from_utf8_lossy(line).into_owned())),
            (kind, _) => Err(ProtoError::Unexpected {
                kind,
                reply: excerpt(line),
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

/// `<id> <bytes>` after `RESERVED `.
fn reserved_header(rest: &[u8]) -> Result<(u64, usize), ProtoError> {
    let bad = || ProtoError::Malformed(format!("bad RESERVED line {}", excerpt(rest)));
    let text = std::str::from_utf8(rest).map_err(|_| bad())?;
    let mut parts = text.split(' ');
    let id = parts.next().and_then(|s| s.parse().ok()).ok_or_else(bad)?;
    let bytes = parts.next().and_then(|s| s.parse().ok()).ok_or_else(bad)?;
    if parts.next().is_some() {
        return Err(bad());
    }
    Ok((id, bytes))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn driver() -> BeanstalkDriver {
        BeanstalkDriver::new(7, 0.1)
    }

    fn check(input: &[u8], expected: Option<usize>) {
        let got = driver().split(input).unwrap().map(|f| f.len);
        assert_eq!(got, expected, "input {:?}", String::from_utf8_lossy(input));
    }

    #[test]
    fn splits_lines_and_job_bodies() {
        check(b"INSERTED 5\r\nDELETED\r\n", Some(12));
        check(b"DELETED\r\n", Some(9));
        check(b"RESERVED 9 3\r\nabc\r\nTIMED_OUT\r\n", Some(19));
        check(b"RESERVED 9 4\r\na\r\nb\r\n", Some(20));
        check(b"RESERVED 9 3\r\nabc\r", None);
        check(b"RESERVED 9 3\r\n", None);
        check(b"INSERTED 5\r", None);
        check(b"", None);
    }

    #[test]
    fn decodes_each_outcome() {
        let d = driver();
        assert_eq!(d.decode(b"INSERTED 5\r\n", Kind::Put).unwrap(), Reply::Put);
        assert_eq!(
            d.decode(b"RESERVED 18446744073709551615 2\r\nhi\r\n", Kind::Take)
                .unwrap(),
            Reply::Task {
                id: u64::MAX,
                data: b"hi"
            }
        );
        assert_eq!(
            d.decode(b"TIMED_OUT\r\n", Kind::Take).unwrap(),
            Reply::NoTask
        );
        assert_eq!(d.decode(b"DELETED\r\n", Kind::Ack).unwrap(), Reply::Acked);
        assert_eq!(
            d.decode(b"NOT_FOUND\r\n", Kind::Ack).unwrap(),
            Reply::Error("NOT_FOUND".into())
        );
        assert!(d.decode(b"DELETED\r\n", Kind::Take).is_err());
    }

    #[test]
    fn bad_input_names_the_problem() {
        let err = driver().split(b"RESERVED x 3\r\n").unwrap_err().to_string();
        assert!(err.contains("bad RESERVED line"), "{err}");
        let long = vec![b'A'; MAX_LINE_BYTES + 5];
        assert!(matches!(
            driver().split(&long),
            Err(ProtoError::TooBig { .. })
        ));
        let err = driver()
            .decode(b"RESERVED 1 3\r\nabcd\r\n", Kind::Take)
            .unwrap_err()
            .to_string();
        assert!(err.contains("does not match"), "{err}");
    }

    #[test]
    fn encodes_commands() {
        let mut d = driver();
        let mut out = Vec::new();
        d.encode(&mut out, Request::Put(b"a\r\nb"));
        d.encode(&mut out, Request::Take { wait: true });
        d.encode(&mut out, Request::Take { wait: false });
        d.encode(&mut out, Request::Ack { id: 42, data: b"" });
        assert_eq!(
            out,
            &b"put 1024 0 60 4\r\na\r\nb\r\nreserve-with-timeout 1\r\nreserve-with-timeout 0\r\ndelete 42\r\n"[..]
        );
    }
}
