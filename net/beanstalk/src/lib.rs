//! beanstalkd's text protocol (version 1.12, `protocol.txt`) as a codec with no I/O: bytes in,
//! commands and replies out, and back.
//!
//! - Server side: a [`Decoder`] per connection turns the read buffer into [`Command`]s that
//!   borrow from it (tube names, `put` bodies), or into the [`ProtocolError`] beanstalkd answers
//!   (`BAD_FORMAT`, `UNKNOWN_COMMAND`, `EXPECTED_CRLF`, `JOB_TOO_BIG`), and it continues the
//!   stream the way beanstalkd does: a too-big body is read and thrown away before
//!   `JOB_TOO_BIG` is answered; a line over [`MAX_LINE`] bytes is thrown away up to the next
//!   line end, then answered `BAD_FORMAT`; a malformed `put` line is answered and its body is
//!   read as commands. [`Reply::encode`] and the YAML writers ([`Stats`], [`StatsJob`],
//!   [`StatsTube`], [`write_list`], [`ok_yaml`]) write answers byte for byte as beanstalkd does.
//! - Client side (the loadgen, the tests): [`Command::encode`] and [`Reply::decode`].
//!
//! Parsing copies beanstalkd's own rules rather than protocol.txt's prose where they differ,
//! because clients are written against the server: commands are matched by prefix in
//! beanstalkd's order (`reservefoo` is a malformed `reserve`, `quitter` is `quit`), numbers
//! take leading spaces but no sign, `reserve-with-timeout` and `kick` go through C's
//! `strtol`/`strtoul` (sign allowed, trailing bytes ignored), and a line ends at the first CR
//! only if LF follows it. The raw-socket scripts in `tests/scripts/` pin each rule against a
//! real beanstalkd.
//!
//! What a command *does* (tubes, reservations, timeouts, stats values) is the server's
//! business; this crate neither reads clocks nor holds queue state.

mod command;
mod parse;
mod reply;
mod yaml;

pub use command::{Command, CommandKind, Decoded, Decoder};
pub use parse::{is_name_byte, MAX_TUBE_NAME};
pub use reply::{Reply, ReplyError};
pub use yaml::{ok_yaml, write_list, CpuTime, JobState, Stats, StatsJob, StatsTube};

/// Longest command line in bytes, CRLF included: beanstalkd's `LINE_BUF_SIZE`. Its line
/// buffer is this big, so a longer line cannot be read as a command.
pub const MAX_LINE: usize = 224;

/// beanstalkd's default max job size (`-z`): the largest `put` body accepted.
pub const DEFAULT_MAX_JOB_SIZE: u32 = 65_535;

/// A request beanstalkd answers with an error and then keeps reading.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum ProtocolError {
    #[error("BAD_FORMAT: a command line over {MAX_LINE} bytes (CRLF included)")]
    LineTooLong,
    #[error("BAD_FORMAT: a NUL byte in the command line")]
    NulByte,
    #[error("BAD_FORMAT: malformed arguments to `{0}`")]
    BadFormat(CommandKind),
    #[error("UNKNOWN_COMMAND: the line starts with no command word")]
    UnknownCommand,
    #[error("EXPECTED_CRLF: the {bytes}-byte job body is not followed by CRLF")]
    ExpectedCrlf { bytes: u32 },
    #[error("JOB_TOO_BIG: a {bytes}-byte job body is over the max job size of {max} bytes")]
    JobTooBig { bytes: u32, max: u32 },
}

impl ProtocolError {
    /// The reply beanstalkd sends for this error.
    pub fn reply(&self) -> Reply<'static> {
        match self {
            ProtocolError::LineTooLong | ProtocolError::NulByte | ProtocolError::BadFormat(_) => {
                Reply::BadFormat
            }
            ProtocolError::UnknownCommand => Reply::UnknownCommand,
            ProtocolError::ExpectedCrlf { .. } => Reply::ExpectedCrlf,
            ProtocolError::JobTooBig { .. } => Reply::JobTooBig,
        }
    }
}

/// Fuzzing entry point shared by the cargo-fuzz target (`net/beanstalk/fuzz`) and the stable
/// property test (`tests/props.rs`): decodes `data` as one connection's stream with a small
/// max job size (so the discard paths are reached), checks every step's bookkeeping, and
/// returns what it found.
pub fn decode_stream(data: &[u8]) -> Vec<Decoded<'_>> {
    /// Small enough that random input reaches `JOB_TOO_BIG`.
    const FUZZ_MAX_JOB_SIZE: u32 = 64;
    let mut decoder = Decoder::new(FUZZ_MAX_JOB_SIZE);
    let mut out = Vec::new();
    let mut at = 0;
    while let Some((step, n)) = decoder.decode(&data[at..]) {
        assert!(
            n > 0 && n <= data.len() - at,
            "a step consumes 1..=rest bytes"
        );
        if let Decoded::Command(c) = step {
            // A decoded command encodes to bytes that decode to it again.
            let mut bytes = Vec::new();
            c.encode(&mut bytes);
            let again = Decoder::new(FUZZ_MAX_JOB_SIZE).decode(&bytes);
            assert_eq!(again, Some((Decoded::Command(c), bytes.len())));
        }
        out.push(step);
        at += n;
    }
    assert!(
        data.len() - at < decoder.max_request(),
        "a stalled decoder holds a bounded tail"
    );
    out
}
