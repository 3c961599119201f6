//! Server replies: the [`Reply`] type, its encoding byte for byte as beanstalkd 1.12 writes
//! it (`Reply::encode`, used by the server front-end), and the client-side splitter
//! [`Reply::decode`] used by the loadgen and the differential tests. The YAML bodies of `OK`
//! replies are built in `yaml.rs`.

use std::io::Write;

use crate::MAX_LINE;

/// One reply. Job bodies, YAML bodies and tube names borrow.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reply<'a> {
    Inserted {
        id: u64,
    },
    /// `BURIED <id>`: a `put` whose job went straight to the buried list.
    BuriedId {
        id: u64,
    },
    Using {
        tube: &'a str,
    },
    Reserved {
        id: u64,
        body: &'a [u8],
    },
    DeadlineSoon,
    TimedOut,
    Deleted,
    Released,
    /// `BURIED`: the answer to `bury` (and to a `release` that had to bury).
    Buried,
    Touched,
    Watching {
        count: u64,
    },
    NotIgnored,
    Found {
        id: u64,
        body: &'a [u8],
    },
    /// `KICKED <count>`: the answer to `kick`.
    KickedCount {
        count: u32,
    },
    /// `KICKED`: the answer to `kick-job`.
    Kicked,
    /// `OK <bytes>` and a YAML body (stats, stats-job, stats-tube, list-tubes*).
    Ok {
        yaml: &'a [u8],
    },
    Paused,
    NotFound,
    Draining,
    OutOfMemory,
    InternalError,
    BadFormat,
    UnknownCommand,
    ExpectedCrlf,
    JobTooBig,
}

/// The replies that are a fixed word.
const WORDS: [(&str, Reply<'static>); 17] = [
    ("DEADLINE_SOON", Reply::DeadlineSoon),
    ("TIMED_OUT", Reply::TimedOut),
    ("DELETED", Reply::Deleted),
    ("RELEASED", Reply::Released),
    ("BURIED", Reply::Buried),
    ("TOUCHED", Reply::Touched),
    ("NOT_IGNORED", Reply::NotIgnored),
    ("KICKED", Reply::Kicked),
    ("PAUSED", Reply::Paused),
    ("NOT_FOUND", Reply::NotFound),
    ("DRAINING", Reply::Draining),
    ("OUT_OF_MEMORY", Reply::OutOfMemory),
    ("INTERNAL_ERROR", Reply::InternalError),
    ("BAD_FORMAT", Reply::BadFormat),
    ("UNKNOWN_COMMAND", Reply::UnknownCommand),
    ("EXPECTED_CRLF", Reply::ExpectedCrlf),
    ("JOB_TOO_BIG", Reply::JobTooBig),
];

/// A reply stream a client cannot follow.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ReplyError {
    #[error("a reply line over {MAX_LINE} bytes without CRLF")]
    LineTooLong,
    #[error("unknown reply line {0:?}")]
    Unknown(String),
    #[error("a {len}-byte reply body over the {max}-byte limit")]
    BodyTooBig { len: u64, max: usize },
    #[error("the {len}-byte reply body is not followed by CRLF")]
    ExpectedCrlf { len: usize },
}

impl<'a> Reply<'a> {
    /// Appends the reply exactly as beanstalkd writes it: the line, then for `RESERVED`,
    /// `FOUND` and `OK` the body and CRLF, so a reply goes out in one write.
    pub fn encode(&self, out: &mut Vec<u8>) {
        // Writing into a Vec cannot fail.
        let _ = match *self {
            Reply::Inserted { id } => write!(out, "INSERTED {id}\r\n"),
            Reply::BuriedId { id } => write!(out, "BURIED {id}\r\n"),
            Reply::Using { tube } => write!(out, "USING {tube}\r\n"),
            Reply::Watching { count } => write!(out, "WATCHING {count}\r\n"),
            Reply::KickedCount { count } => write!(out, "KICKED {count}\r\n"),
            Reply::Reserved { id, body } => with_body(out, "RESERVED", Some(id), body),
            Reply::Found { id, body } => with_body(out, "FOUND", Some(id), body),
            Reply::Ok { yaml } => with_body(out, "OK", None, yaml),
            word => {
                let (w, _) = WORDS.iter().find(|(_, r)| *r == word).expect("every word");
                write!(out, "{w}\r\n")
            }
        };
    }

    /// Splits one reply off the front of `buf`: `Ok(None)` until it is whole, then the reply
    /// and its length. `max_body` bounds the body a client accepts.
    pub fn decode(
        buf: &'a [u8],
        max_body: usize,
    ) -> Result<Option<(Reply<'a>, usize)>, ReplyError> {
        let Some(end) = buf.windows(2).position(|w| w == b"\r\n") else {
            return if buf.len() > MAX_LINE {
                Err(ReplyError::LineTooLong)
            } else {
                Ok(None)
            };
        };
        let n = end + 2;
        let line = std::str::from_utf8(&buf[..end]).map_err(|_| unknown(&buf[..end]))?;
        let mut words = line.split(' ');
        let head = words.next().unwrap_or("");
        let args: Vec<&str> = words.collect();
        let num = |i: usize| -> Result<u64, ReplyError> {
            args.get(i)
                .and_then(|a| a.parse().ok())
                .ok_or_else(|| unknown(line.as_bytes()))
        };
        let reply = match (head, args.len()) {
            ("INSERTED", 1) => Reply::Inserted { id: num(0)? },
            ("BURIED", 1) => Reply::BuriedId { id: num(0)? },
            ("USING", 1) => Reply::Using { tube: args[0] },
            ("WATCHING", 1) => Reply::Watching { count: num(0)? },
            ("KICKED", 1) => Reply::KickedCount {
                count: u32::try_from(num(0)?).map_err(|_| unknown(line.as_bytes()))?,
            },
            ("RESERVED" | "FOUND", 2) | ("OK", 1) => {
                let (len_at, id) = if head == "OK" { (0, 0) } else { (1, num(0)?) };
                let len = num(len_at)?;
                let Some(body) = body_after(buf, n, len, max_body)? else {
                    return Ok(None);
                };
                let total = n + body.len() + 2;
                let reply = match head {
                    "RESERVED" => Reply::Reserved { id, body },
                    "FOUND" => Reply::Found { id, body },
                    _ => Reply::Ok { yaml: body },
                };
                return Ok(Some((reply, total)));
            }
            (word, 0) => WORDS
                .iter()
                .find(|(w, _)| *w == word)
                .map(|(_, r)| *r)
                .ok_or_else(|| unknown(line.as_bytes()))?,
            _ => return Err(unknown(line.as_bytes())),
        };
        Ok(Some((reply, n)))
    }
}

fn unknown(line: &[u8]) -> ReplyError {
    ReplyError::Unknown(String::from_utf8_lossy(line).into_owned())
}

fn with_body(out: &mut Vec<u8>, word: &str, id: Option<u64>, body: &[u8]) -> std::io::Result<()> {
    match id {
        Some(id) => write!(out, "{word} {id} {}\r\n", body.len())?,
        None => write!(out, "{word} {}\r\n", body.len())?,
    }
    out.extend_from_slice(body);
    out.extend_from_slice(b"\r\n");
    Ok(())
}

/// The `len`-byte body after a line of `n` bytes, once it and its CRLF are all in `buf`.
fn body_after(buf: &[u8], n: usize, len: u64, max: usize) -> Result<Option<&[u8]>, ReplyError> {
    let len = usize::try_from(len)
        .ok()
        .filter(|&l| l <= max)
        .ok_or(ReplyError::BodyTooBig { len, max })?;
    if buf.len() < n + len + 2 {
        return Ok(None);
    }
    if &buf[n + len..n + len + 2] != b"\r\n" {
        return Err(ReplyError::ExpectedCrlf { len });
    }
    Ok(Some(&buf[n..n + len]))
}
