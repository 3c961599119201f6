//! beanstalkd driver: `put` / `reserve-with-timeout` / `delete`, on a tube private to the run
//! (producers `use` it, consumers `watch` it and `ignore default`), for beanstalkd and tarq's
//! beanstalk port alike. beanstalkd answers each connection's commands in order, one text line
//! per reply, plus the job body after `RESERVED`. The bytes are the workspace codec's
//! (`tarq_beanstalk`: `Command::encode`, `Reply::decode`), the one tarq's own front-end
//! uses, so the loadgen and the server cannot disagree about the protocol.

use super::{excerpt, Driver, Duplex, Frame, Kind, ProtoError, Reply, Request, Role};
use std::io::{BufRead, BufReader};
use tarq_beanstalk::{Command, Reply as Answer, ReplyError};

/// Largest job body accepted in a reply: beanstalkd's own `-z` maximum job size is 1 GiB, its
/// default 65535; 64 MiB catches garbage long before memory does.
pub const MAX_JOB_BYTES: usize = 64 << 20;
/// beanstalkd's default maximum job size (`-z`): a larger `--payload` is refused up front.
pub const DEFAULT_MAX_JOB_BYTES: usize = tarq_beanstalk::DEFAULT_MAX_JOB_SIZE as usize;
/// Priority given to every job: beanstalkd's conventional default (lower runs first).
const PRIORITY: u32 = 1024;
/// Time-to-run in seconds: the consumer deletes within microseconds, so this never fires
/// unless the loadgen dies.
const TTR_S: u32 = 60;

pub struct BeanstalkDriver {
    tube: String,
    /// `reserve-with-timeout` argument (whole seconds, beanstalkd's granularity).
    timeout_s: i32,
    seq: u64,
}

impl BeanstalkDriver {
    pub fn new(run: u64, take_timeout_s: f64) -> Self {
        BeanstalkDriver {
            tube: format!("tarq-loadgen-{run:016x}"),
            timeout_s: take_timeout_s.ceil().clamp(1.0, f64::from(i32::MAX)) as i32,
            seq: 0,
        }
    }
}

/// One handshake command whose answer must start with `expect`.
fn command(stream: &mut dyn Duplex, cmd: Command<'_>, expect: &str) -> Result<(), ProtoError> {
    let mut line = Vec::new();
    cmd.encode(&mut line);
    stream.write_all(&line)?;
    let mut reader = BufReader::new(stream);
    let mut reply = String::new();
    reader.read_line(&mut reply)?;
    if reply.starts_with(expect) {
        Ok(())
    } else {
        Err(ProtoError::Handshake(format!(
            "beanstalkd answered {:?} to {:?}",
            reply.trim_end(),
            String::from_utf8_lossy(&line).trim_end()
        )))
    }
}

/// A reply stream the codec cannot follow, as the runner reports it.
fn stream_error(e: ReplyError) -> ProtoError {
    match e {
        ReplyError::LineTooLong => ProtoError::TooBig {
            len: tarq_beanstalk::MAX_LINE + 1,
            limit: tarq_beanstalk::MAX_LINE,
        },
        ReplyError::BodyTooBig { len, max } => ProtoError::TooBig {
            len: usize::try_from(len).unwrap_or(usize::MAX),
            limit: max,
        },
        e => ProtoError::Malformed(e.to_string()),
    }
}

impl Driver for BeanstalkDriver {
    fn handshake(&mut self, stream: &mut dyn Duplex, role: Role) -> Result<(), ProtoError> {
        // Each command gets exactly one line back, so the BufReader never reads ahead.
        let tube = self.tube.as_str();
        match role {
            Role::Producer => command(stream, Command::Use { tube }, "USING "),
            Role::Consumer => {
                command(stream, Command::Watch { tube }, "WATCHING ")?;
                command(stream, Command::Ignore { tube: "default" }, "WATCHING ")
            }
        }
    }

    fn encode(&mut self, out: &mut Vec<u8>, req: Request<'_>) -> u64 {
        let cmd = match req {
            Request::Put(body) => Command::Put {
                pri: PRIORITY,
                delay: 0,
                ttr: TTR_S,
                body,
            },
            Request::Take { wait } => Command::ReserveWithTimeout {
                seconds: if wait { self.timeout_s } else { 0 },
            },
            Request::Ack { id, .. } => Command::Delete { id },
        };
        cmd.encode(out);
        self.seq += 1;
        self.seq
    }

    /// Finding a reply's end means decoding it, and a beanstalkd reply says what it answers:
    /// the frame carries the reply, so each reply is decoded once.
    fn split<'a>(&self, buf: &'a [u8]) -> Result<Option<Frame<'a>>, ProtoError> {
        let Some((answer, len)) = Answer::decode(buf, MAX_JOB_BYTES).map_err(stream_error)? else {
            return Ok(None);
        };
        let reply = reply(answer, &buf[..len])?;
        Ok(Some(Frame {
            len,
            sync: None,
            reply: Some(reply),
        }))
    }

    fn decode<'a>(&self, frame: &'a [u8], kind: Kind) -> Result<Reply<'a>, ProtoError> {
        let (answer, _) = Answer::decode(frame, MAX_JOB_BYTES)
            .map_err(stream_error)?
            .ok_or_else(|| ProtoError::Malformed("incomplete beanstalkd reply".into()))?;
        let r = reply(answer, frame)?;
        if r.answers(kind) {
            Ok(r)
        } else {
            Err(ProtoError::Unexpected {
                kind,
                reply: excerpt(frame),
            })
        }
    }

    fn ordered(&self) -> bool {
        true
    }

    fn blocking_takes(&self) -> bool {
        true
    }
}

/// What a beanstalkd answer means to the load loop; `frame` is its bytes, for error texts.
fn reply<'a>(answer: Answer<'a>, frame: &'a [u8]) -> Result<Reply<'a>, ProtoError> {
    match answer {
        Answer::Inserted { .. } => Ok(Reply::Put),
        Answer::Reserved { id, body } => Ok(Reply::Task { id, data: body }),
        Answer::TimedOut => Ok(Reply::NoTask),
        Answer::Deleted => Ok(Reply::Acked),
        Answer::BuriedId { .. }
        | Answer::Buried
        | Answer::NotFound
        | Answer::JobTooBig
        | Answer::Draining
        | Answer::ExpectedCrlf
        | Answer::OutOfMemory
        | Answer::InternalError
        | Answer::BadFormat
        | Answer::UnknownCommand
        | Answer::DeadlineSoon => {
            let eol = frame
                .iter()
                .position(|&b| b == b'\r')
                .unwrap_or(frame.len());
            Ok(Reply::Error(
                String::from_utf8_lossy(&frame[..eol]).into_owned(),
            ))
        }
        _ => Err(ProtoError::Malformed(format!(
            "a reply no put, reserve or delete gets: {}",
            excerpt(frame)
        ))),
    }
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
    fn split_decodes_each_reply_once_and_hands_it_over() {
        let d = driver();
        let f = d
            .split(b"RESERVED 9 3\r\nabc\r\nDELETED\r\n")
            .unwrap()
            .unwrap();
        assert_eq!(f.len, 19);
        assert_eq!(
            f.reply,
            Some(Reply::Task {
                id: 9,
                data: b"abc"
            })
        );
        let f = d.split(b"NOT_FOUND\r\n").unwrap().unwrap();
        assert_eq!(f.reply, Some(Reply::Error("NOT_FOUND".into())));
        // A reply none of the loadgen's commands gets is a broken stream, not a figure.
        assert!(d.split(b"WATCHING 2\r\n").is_err());
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
        assert!(err.contains("RESERVED x 3"), "{err}");
        let long = vec![b'A'; tarq_beanstalk::MAX_LINE + 5];
        assert!(matches!(
            driver().split(&long),
            Err(ProtoError::TooBig { .. })
        ));
        let err = driver()
            .decode(b"RESERVED 1 3\r\nabcd\r\n", Kind::Take)
            .unwrap_err()
            .to_string();
        assert!(err.contains("not followed by CRLF"), "{err}");
        let huge = format!("RESERVED 1 {}\r\n", MAX_JOB_BYTES + 1);
        assert!(matches!(
            driver().split(huge.as_bytes()),
            Err(ProtoError::TooBig { .. })
        ));
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
