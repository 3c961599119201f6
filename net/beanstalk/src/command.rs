//! Client commands: the [`Command`] type, the server-side [`Decoder`] that turns a byte stream
//! into commands exactly as beanstalkd 1.12 reads it (its line scan, its prefix table, its
//! discard modes), and the client-side [`Command::encode`] used by the loadgen and the tests.
//! Replies live in `reply.rs`; the argument scanners in `parse.rs`.

use crate::parse;
use crate::{ProtocolError, MAX_LINE};

/// One client command. Tube names and job bodies borrow from the read buffer.
///
/// Numbers are kept as sent: a `ttr` or a `pause-tube` delay of 0 is raised to 1 second by the
/// server (beanstalkd does that after parsing, not the parser).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Command<'a> {
    Put {
        pri: u32,
        delay: u32,
        ttr: u32,
        body: &'a [u8],
    },
    Use {
        tube: &'a str,
    },
    Reserve,
    /// `seconds` is what beanstalkd computes, `(int) strtol(arg)`: negative waits forever.
    ReserveWithTimeout {
        seconds: i32,
    },
    ReserveJob {
        id: u64,
    },
    Delete {
        id: u64,
    },
    Release {
        id: u64,
        pri: u32,
        delay: u32,
    },
    Bury {
        id: u64,
        pri: u32,
    },
    Touch {
        id: u64,
    },
    Watch {
        tube: &'a str,
    },
    Ignore {
        tube: &'a str,
    },
    Peek {
        id: u64,
    },
    PeekReady,
    PeekDelayed,
    PeekBuried,
    Kick {
        bound: u32,
    },
    KickJob {
        id: u64,
    },
    StatsJob {
        id: u64,
    },
    StatsTube {
        tube: &'a str,
    },
    Stats,
    ListTubes,
    ListTubeUsed,
    ListTubesWatched,
    PauseTube {
        tube: &'a str,
        delay: u32,
    },
    Quit,
}

/// The name of each command, for counters (`cmd-put`, ...) and messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CommandKind {
    Put,
    Use,
    Reserve,
    ReserveWithTimeout,
    ReserveJob,
    Delete,
    Release,
    Bury,
    Touch,
    Watch,
    Ignore,
    Peek,
    PeekReady,
    PeekDelayed,
    PeekBuried,
    Kick,
    KickJob,
    StatsJob,
    StatsTube,
    Stats,
    ListTubes,
    ListTubeUsed,
    ListTubesWatched,
    PauseTube,
    Quit,
}

impl CommandKind {
    /// Every kind, in protocol.txt's order.
    pub const ALL: [CommandKind; 25] = [
        CommandKind::Put,
        CommandKind::Use,
        CommandKind::Reserve,
        CommandKind::ReserveWithTimeout,
        CommandKind::ReserveJob,
        CommandKind::Delete,
        CommandKind::Release,
        CommandKind::Bury,
        CommandKind::Touch,
        CommandKind::Watch,
        CommandKind::Ignore,
        CommandKind::Peek,
        CommandKind::PeekReady,
        CommandKind::PeekDelayed,
        CommandKind::PeekBuried,
        CommandKind::Kick,
        CommandKind::KickJob,
        CommandKind::StatsJob,
        CommandKind::StatsTube,
        CommandKind::Stats,
        CommandKind::ListTubes,
        CommandKind::ListTubeUsed,
        CommandKind::ListTubesWatched,
        CommandKind::PauseTube,
        CommandKind::Quit,
    ];

    /// The command word as sent on the wire.
    pub fn as_str(self) -> &'static str {
        match self {
            CommandKind::Put => "put",
            CommandKind::Use => "use",
            CommandKind::Reserve => "reserve",
            CommandKind::ReserveWithTimeout => "reserve-with-timeout",
            CommandKind::ReserveJob => "reserve-job",
            CommandKind::Delete => "delete",
            CommandKind::Release => "release",
            CommandKind::Bury => "bury",
            CommandKind::Touch => "touch",
            CommandKind::Watch => "watch",
            CommandKind::Ignore => "ignore",
            CommandKind::Peek => "peek",
            CommandKind::PeekReady => "peek-ready",
            CommandKind::PeekDelayed => "peek-delayed",
            CommandKind::PeekBuried => "peek-buried",
            CommandKind::Kick => "kick",
            CommandKind::KickJob => "kick-job",
            CommandKind::StatsJob => "stats-job",
            CommandKind::StatsTube => "stats-tube",
            CommandKind::Stats => "stats",
            CommandKind::ListTubes => "list-tubes",
            CommandKind::ListTubeUsed => "list-tube-used",
            CommandKind::ListTubesWatched => "list-tubes-watched",
            CommandKind::PauseTube => "pause-tube",
            CommandKind::Quit => "quit",
        }
    }
}

impl std::fmt::Display for CommandKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// How a command line's prefix selects a command: beanstalkd's `which_cmd` table, tried in
/// this order with `strncmp`, so `reservefoo` is `reserve` (and then malformed) and `quitter`
/// is `quit`. The trailing space is part of the prefix where beanstalkd has one.
const PREFIXES: [(&[u8], CommandKind); 25] = [
    (b"put ", CommandKind::Put),
    (b"peek ", CommandKind::Peek),
    (b"peek-ready", CommandKind::PeekReady),
    (b"peek-delayed", CommandKind::PeekDelayed),
    (b"peek-buried", CommandKind::PeekBuried),
    (b"reserve-with-timeout ", CommandKind::ReserveWithTimeout),
    (b"reserve-job ", CommandKind::ReserveJob),
    (b"reserve", CommandKind::Reserve),
    (b"delete ", CommandKind::Delete),
    (b"release ", CommandKind::Release),
    (b"bury ", CommandKind::Bury),
    (b"kick ", CommandKind::Kick),
    (b"kick-job ", CommandKind::KickJob),
    (b"touch ", CommandKind::Touch),
    (b"stats-job ", CommandKind::StatsJob),
    (b"stats-tube ", CommandKind::StatsTube),
    (b"stats", CommandKind::Stats),
    (b"use ", CommandKind::Use),
    (b"watch ", CommandKind::Watch),
    (b"ignore ", CommandKind::Ignore),
    (b"list-tubes-watched", CommandKind::ListTubesWatched),
    (b"list-tube-used", CommandKind::ListTubeUsed),
    (b"list-tubes", CommandKind::ListTubes),
    (b"quit", CommandKind::Quit),
    (b"pause-tube", CommandKind::PauseTube),
];

/// What one call to [`Decoder::decode`] found at the front of the buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decoded<'a> {
    /// A whole command: run it.
    Command(Command<'a>),
    /// A request beanstalkd refuses: answer [`ProtocolError::reply`] and go on reading.
    Error(ProtocolError),
    /// Bytes thrown away (part of a too-big job body, or a block of an over-long line):
    /// nothing to answer yet.
    Discarded,
}

/// Where the decoder is in the stream between calls.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// At the start of a command line.
    Line,
    /// After a line of [`MAX_LINE`] bytes without CRLF: beanstalkd throws input away in
    /// blocks of [`MAX_LINE`] until a block holds a line end, then answers `BAD_FORMAT`.
    DiscardLine,
    /// After `put` with a body over the max job size: `remaining` bytes of body and CRLF are
    /// thrown away, then `JOB_TOO_BIG { bytes }` is answered.
    DiscardBody { remaining: u64, bytes: u32 },
}

/// Where a command line ends, by beanstalkd's `scan_line_end`.
enum LineEnd {
    /// The line is this many bytes long, CRLF included.
    At(usize),
    /// [`MAX_LINE`] bytes hold no line end: the line is too long.
    Overflow,
    /// Read more.
    Incomplete,
}

/// beanstalkd looks only at its 224-byte line buffer and only at the *first* CR in it: a CR
/// not followed by LF means the line cannot end inside this buffer at all.
fn scan_line(buf: &[u8]) -> LineEnd {
    let window = &buf[..buf.len().min(MAX_LINE)];
    let searched = &window[..window.len().saturating_sub(1)];
    if let Some(i) = searched.iter().position(|&b| b == b'\r') {
        if window[i + 1] == b'\n' {
            return LineEnd::At(i + 2);
        }
    }
    if window.len() == MAX_LINE {
        LineEnd::Overflow
    } else {
        LineEnd::Incomplete
    }
}

/// A server's view of one connection's request stream.
///
/// `decode` is called with the unconsumed bytes in the read buffer; it returns `None` when
/// they hold no whole command yet (keep them, read more), or what it found and how many bytes
/// to drop from the front. The buffer never needs more than
/// [`Decoder::max_request`] bytes.
#[derive(Debug, Clone)]
pub struct Decoder {
    max_job_size: u32,
    state: State,
}

impl Decoder {
    /// `max_job_size` is the largest `put` body accepted (beanstalkd's `-z`, default 65535).
    pub fn new(max_job_size: u32) -> Self {
        Decoder {
            max_job_size,
            state: State::Line,
        }
    }

    pub fn max_job_size(&self) -> u32 {
        self.max_job_size
    }

    /// The most bytes a read buffer must hold for `decode` to make progress: a full command
    /// line plus the largest body and its CRLF.
    pub fn max_request(&self) -> usize {
        MAX_LINE + self.max_job_size as usize + 2
    }

    pub fn decode<'a>(&mut self, buf: &'a [u8]) -> Option<(Decoded<'a>, usize)> {
        match self.state {
            State::Line => self.decode_line(buf),
            State::DiscardLine => match scan_line(buf) {
                LineEnd::At(n) => {
                    self.state = State::Line;
                    Some((Decoded::Error(ProtocolError::LineTooLong), n))
                }
                LineEnd::Overflow => Some((Decoded::Discarded, MAX_LINE)),
                LineEnd::Incomplete => None,
            },
            State::DiscardBody { .. } if buf.is_empty() => None,
            State::DiscardBody { .. } => Some(self.discard_body(buf, 0)),
        }
    }

    fn decode_line<'a>(&mut self, buf: &'a [u8]) -> Option<(Decoded<'a>, usize)> {
        let n = match scan_line(buf) {
            LineEnd::At(n) => n,
            LineEnd::Overflow => {
                self.state = State::DiscardLine;
                return Some((Decoded::Discarded, MAX_LINE));
            }
            LineEnd::Incomplete => return None,
        };
        let line = &buf[..n - 2];
        let refuse = |e| Some((Decoded::Error(e), n));
        // beanstalkd NUL-terminates the line and checks `strlen`: a NUL inside is malformed.
        if line.contains(&0) {
            return refuse(ProtocolError::NulByte);
        }
        let Some(&(prefix, kind)) = PREFIXES.iter().find(|(p, _)| line.starts_with(p)) else {
            return refuse(ProtocolError::UnknownCommand);
        };
        if kind != CommandKind::Put {
            return match parse_args(kind, line, &line[prefix.len()..]) {
                Some(c) => Some((Decoded::Command(c), n)),
                None => refuse(ProtocolError::BadFormat(kind)),
            };
        }
        let Some(put) = parse_put(&line[prefix.len()..]) else {
            return refuse(ProtocolError::BadFormat(kind));
        };
        // beanstalkd checks the size before the trailing bytes: an oversized put with
        // garbage after `<bytes>` is still JOB_TOO_BIG, body discarded.
        if put.bytes > self.max_job_size {
            self.state = State::DiscardBody {
                remaining: u64::from(put.bytes) + 2,
                bytes: put.bytes,
            };
            return Some(self.discard_body(&buf[n..], n));
        }
        if !put.trailing_ok {
            return refuse(ProtocolError::BadFormat(kind));
        }
        let total = n + put.bytes as usize + 2;
        if buf.len() < total {
            return None;
        }
        let body = &buf[n..total - 2];
        if &buf[total - 2..total] != b"\r\n" {
            let e = ProtocolError::ExpectedCrlf { bytes: put.bytes };
            return Some((Decoded::Error(e), total));
        }
        let command = Command::Put {
            pri: put.pri,
            delay: put.delay,
            ttr: put.ttr,
            body,
        };
        Some((Decoded::Command(command), total))
    }

    /// Throws away what `rest` holds of a too-big body; `before` bytes were consumed already.
    fn discard_body<'a>(&mut self, rest: &[u8], before: usize) -> (Decoded<'a>, usize) {
        let State::DiscardBody { remaining, bytes } = self.state else {
            unreachable!("discard_body outside DiscardBody");
        };
        let take = remaining.min(rest.len() as u64);
        let consumed = before + take as usize;
        if take == remaining {
            self.state = State::Line;
            let e = ProtocolError::JobTooBig {
                bytes,
                max: self.max_job_size,
            };
            (Decoded::Error(e), consumed)
        } else {
            self.state = State::DiscardBody {
                remaining: remaining - take,
                bytes,
            };
            (Decoded::Discarded, consumed)
        }
    }
}

/// A `put` line's numbers; `trailing_ok` says nothing follows `<bytes>`.
struct PutLine {
    pri: u32,
    delay: u32,
    ttr: u32,
    bytes: u32,
    trailing_ok: bool,
}

fn parse_put(args: &[u8]) -> Option<PutLine> {
    let (pri, rest) = parse::u32_then(args)?;
    let (delay, rest) = parse::u32_then(rest)?;
    let (ttr, rest) = parse::u32_then(rest)?;
    let (bytes, rest) = parse::u32_then(rest)?;
    Some(PutLine {
        pri,
        delay,
        ttr,
        bytes,
        trailing_ok: rest.is_empty(),
    })
}

/// The arguments of every command but `put`, as beanstalkd's `dispatch_cmd` reads them.
/// `line` is the whole line (for the commands that take none), `args` what follows the prefix.
fn parse_args<'a>(kind: CommandKind, line: &[u8], args: &'a [u8]) -> Option<Command<'a>> {
    use CommandKind as K;
    // Commands without arguments must be the bare word: no trailing bytes at all.
    let bare = |c: Command<'a>| (line == kind.as_str().as_bytes()).then_some(c);
    Some(match kind {
        K::Put => return None,
        K::Use => Command::Use {
            tube: parse::tube_name(args)?,
        },
        K::Watch => Command::Watch {
            tube: parse::tube_name(args)?,
        },
        K::Ignore => Command::Ignore {
            tube: parse::tube_name(args)?,
        },
        K::StatsTube => Command::StatsTube {
            tube: parse::tube_name(args)?,
        },
        K::Reserve => bare(Command::Reserve)?,
        K::PeekReady => bare(Command::PeekReady)?,
        K::PeekDelayed => bare(Command::PeekDelayed)?,
        K::PeekBuried => bare(Command::PeekBuried)?,
        K::Stats => bare(Command::Stats)?,
        K::ListTubes => bare(Command::ListTubes)?,
        K::ListTubeUsed => bare(Command::ListTubeUsed)?,
        K::ListTubesWatched => bare(Command::ListTubesWatched)?,
        // beanstalkd does not look past the prefix: `quitter` closes the connection too.
        K::Quit => Command::Quit,
        K::ReserveWithTimeout => Command::ReserveWithTimeout {
            seconds: parse::c_strtol_as_int(args)?,
        },
        K::Kick => Command::Kick {
            bound: parse::c_strtoul_as_uint(args)?,
        },
        K::ReserveJob => Command::ReserveJob {
            id: parse::u64_last(args)?,
        },
        K::Delete => Command::Delete {
            id: parse::u64_last(args)?,
        },
        K::Touch => Command::Touch {
            id: parse::u64_last(args)?,
        },
        K::Peek => Command::Peek {
            id: parse::u64_last(args)?,
        },
        K::KickJob => Command::KickJob {
            id: parse::u64_last(args)?,
        },
        K::StatsJob => Command::StatsJob {
            id: parse::u64_last(args)?,
        },
        K::Release => {
            let (id, rest) = parse::u64_then(args)?;
            let (pri, rest) = parse::u32_then(rest)?;
            let delay = parse::u32_last(rest)?;
            Command::Release { id, pri, delay }
        }
        K::Bury => {
            let (id, rest) = parse::u64_then(args)?;
            let pri = parse::u32_last(rest)?;
            Command::Bury { id, pri }
        }
        K::PauseTube => {
            let (name, rest) = parse::name_run_then(args)?;
            let delay = parse::u32_last(rest)?;
            let tube = parse::tube_name(name)?;
            Command::PauseTube { tube, delay }
        }
    })
}

impl Command<'_> {
    pub fn kind(&self) -> CommandKind {
        use CommandKind as K;
        match self {
            Command::Put { .. } => K::Put,
            Command::Use { .. } => K::Use,
            Command::Reserve => K::Reserve,
            Command::ReserveWithTimeout { .. } => K::ReserveWithTimeout,
            Command::ReserveJob { .. } => K::ReserveJob,
            Command::Delete { .. } => K::Delete,
            Command::Release { .. } => K::Release,
            Command::Bury { .. } => K::Bury,
            Command::Touch { .. } => K::Touch,
            Command::Watch { .. } => K::Watch,
            Command::Ignore { .. } => K::Ignore,
            Command::Peek { .. } => K::Peek,
            Command::PeekReady => K::PeekReady,
            Command::PeekDelayed => K::PeekDelayed,
            Command::PeekBuried => K::PeekBuried,
            Command::Kick { .. } => K::Kick,
            Command::KickJob { .. } => K::KickJob,
            Command::StatsJob { .. } => K::StatsJob,
            Command::StatsTube { .. } => K::StatsTube,
            Command::Stats => K::Stats,
            Command::ListTubes => K::ListTubes,
            Command::ListTubeUsed => K::ListTubeUsed,
            Command::ListTubesWatched => K::ListTubesWatched,
            Command::PauseTube { .. } => K::PauseTube,
            Command::Quit => K::Quit,
        }
    }

    /// Appends the command as a client sends it (canonical form: single spaces, CRLF, and
    /// the body with its CRLF after `put`).
    pub fn encode(&self, out: &mut Vec<u8>) {
        use std::io::Write;
        let word = self.kind().as_str();
        // Writing into a Vec cannot fail.
        let _ = match *self {
            Command::Put {
                pri,
                delay,
                ttr,
                body,
            } => {
                let _ = write!(out, "put {pri} {delay} {ttr} {}\r\n", body.len());
                out.extend_from_slice(body);
                Ok(())
            }
            Command::Use { tube }
            | Command::Watch { tube }
            | Command::Ignore { tube }
            | Command::StatsTube { tube } => write!(out, "{word} {tube}"),
            Command::ReserveWithTimeout { seconds } => write!(out, "{word} {seconds}"),
            Command::ReserveJob { id }
            | Command::Delete { id }
            | Command::Touch { id }
            | Command::Peek { id }
            | Command::KickJob { id }
            | Command::StatsJob { id } => write!(out, "{word} {id}"),
            Command::Release { id, pri, delay } => write!(out, "{word} {id} {pri} {delay}"),
            Command::Bury { id, pri } => write!(out, "{word} {id} {pri}"),
            Command::Kick { bound } => write!(out, "{word} {bound}"),
            Command::PauseTube { tube, delay } => write!(out, "{word} {tube} {delay}"),
            Command::Reserve
            | Command::PeekReady
            | Command::PeekDelayed
            | Command::PeekBuried
            | Command::Stats
            | Command::ListTubes
            | Command::ListTubeUsed
            | Command::ListTubesWatched
            | Command::Quit => write!(out, "{word}"),
        };
        out.extend_from_slice(b"\r\n");
    }
}
