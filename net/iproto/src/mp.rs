//! MessagePack primitives for the IPROTO codec: a borrowing reader over a byte slice (typed
//! reads through `rmp::decode`, plus an iterative, bounded skipper that validates an arbitrary
//! value and returns its raw bytes) and thin writers over `rmp::encode` into a `Vec<u8>`.
//!
//! Nothing here allocates while reading: every string or value read borrows from the input.
//! The skipper never recurses, so no input — however deeply nested — can overflow the stack;
//! its depth and element count are bounded by [`MAX_DEPTH`] and [`MAX_ELEMENTS`] (requests), or
//! by [`REPLY_MAX_DEPTH`] and [`REPLY_MAX_ELEMENTS`] (replies, which wrap what was accepted).

use rmp::decode::bytes::BytesReadError;
use rmp::decode::{self, Bytes, NumValueReadError, ValueReadError};
use rmp::Marker;

/// Deepest nesting accepted inside one value. Tarantool's own encoder stops at 128 levels
/// (`msgpack.cfg.encode_max_depth`), so no real client sends deeper; the skipper keeps one
/// counter per level in a fixed array of this size, on the stack.
pub const MAX_DEPTH: usize = 128;
/// Nesting a skip handles with its first, small stack; deeper values are skipped again with
/// the full one (see [`Reader::skip_value_within`]).
const SHALLOW_DEPTH: usize = 16;

/// Most values a flat fixarray holds: itself and 15 elements.
const FLAT_MAX_ELEMENTS: usize = 16;

/// Most values (scalars and containers, counted together) accepted inside one value. A task
/// payload is a message, not a database: a million elements is far beyond any real one, and the
/// cap bounds the decode work a single frame can cost the loop to a few milliseconds.
pub const MAX_ELEMENTS: usize = 1 << 20;

/// Levels a reply adds around a value the server accepted: the body map, the DATA array,
/// CALL_16's tuple and the task map. A payload at [`MAX_DEPTH`] must come back decodable.
pub const REPLY_WRAP_DEPTH: usize = 4;

/// Values a reply adds around an accepted payload: those four containers, the task's other keys
/// and values (id, status, runat, pri, ttl, ttr: 12) and the `data` key; 32 covers them.
pub const REPLY_WRAP_ELEMENTS: usize = 32;

/// Deepest nesting a client accepts in a reply.
pub const REPLY_MAX_DEPTH: usize = MAX_DEPTH + REPLY_WRAP_DEPTH;

/// Most values a client accepts in one reply value.
pub const REPLY_MAX_ELEMENTS: usize = MAX_ELEMENTS + REPLY_WRAP_ELEMENTS;

/// Why a MessagePack value could not be read: an [`MpFault`], boxed. Every read returns a
/// `Result` and almost none fails, so the error is kept to one pointer: a read's `Result`
/// then comes back in two registers instead of through memory (the fault is 40 bytes).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(transparent)]
pub struct MpError(Box<MpFault>);

impl MpError {
    /// What went wrong, and where.
    pub fn fault(&self) -> &MpFault {
        &self.0
    }
}

impl From<MpFault> for MpError {
    #[cold]
    fn from(fault: MpFault) -> MpError {
        MpError(Box::new(fault))
    }
}

/// What went wrong reading a MessagePack value, and at which byte.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MpFault {
    #[error("truncated value at byte {0}")]
    Truncated(usize),
    #[error("expected {expected} at byte {at}, found {found}")]
    Type {
        expected: &'static str,
        found: &'static str,
        at: usize,
    },
    #[error("integer out of range at byte {0}")]
    OutOfRange(usize),
    #[error("invalid UTF-8 in a string at byte {0}")]
    Utf8(usize),
    #[error("reserved byte 0xc1 at byte {0}")]
    Reserved(usize),
    #[error("nesting deeper than {limit} levels at byte {at}")]
    TooDeep { at: usize, limit: usize },
    #[error("more than {limit} elements in one value at byte {at}")]
    TooManyElements { at: usize, limit: usize },
}

/// A short name of the MessagePack family a marker belongs to, for error messages.
pub fn marker_name(m: Marker) -> &'static str {
    match m {
        Marker::FixPos(_) | Marker::U8 | Marker::U16 | Marker::U32 | Marker::U64 => "unsigned",
        Marker::FixNeg(_) | Marker::I8 | Marker::I16 | Marker::I32 | Marker::I64 => "integer",
        Marker::Null => "nil",
        Marker::True | Marker::False => "boolean",
        Marker::F32 | Marker::F64 => "number",
        Marker::FixStr(_) | Marker::Str8 | Marker::Str16 | Marker::Str32 => "string",
        Marker::Bin8 | Marker::Bin16 | Marker::Bin32 => "binary",
        Marker::FixArray(_) | Marker::Array16 | Marker::Array32 => "array",
        Marker::FixMap(_) | Marker::Map16 | Marker::Map32 => "map",
        Marker::FixExt1
        | Marker::FixExt2
        | Marker::FixExt4
        | Marker::FixExt8
        | Marker::FixExt16
        | Marker::Ext8
        | Marker::Ext16
        | Marker::Ext32 => "extension",
        Marker::Reserved => "reserved byte",
    }
}

/// A cursor over a MessagePack byte slice; every read borrows from it.
#[derive(Clone, Copy, Debug)]
pub struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    pub fn new(buf: &'a [u8]) -> Self {
        Reader { buf, pos: 0 }
    }

    /// Bytes consumed so far.
    pub fn position(&self) -> usize {
        self.pos
    }

    pub fn is_empty(&self) -> bool {
        self.pos >= self.buf.len()
    }

    pub fn remaining(&self) -> &'a [u8] {
        &self.buf[self.pos..]
    }

    /// The marker of the next value, without consuming it.
    pub fn peek_marker(&self) -> Result<Marker, MpError> {
        self.buf
            .get(self.pos)
            .map(|&b| Marker::from_u8(b))
            .ok_or_else(|| MpError::from(MpFault::Truncated(self.pos)))
    }

    /// Runs one `rmp::decode` read on the rest of the buffer and advances past what it consumed.
    fn with_rmp<T, E>(
        &mut self,
        read: impl FnOnce(&mut Bytes<'a>) -> Result<T, E>,
        conv: impl FnOnce(E, usize) -> MpError,
    ) -> Result<T, MpError> {
        let rest = self.remaining();
        let mut rd = Bytes::new(rest);
        match read(&mut rd) {
            Ok(v) => {
                self.pos += rest.len() - rd.remaining_slice().len();
                Ok(v)
            }
            Err(e) => Err(conv(e, self.pos)),
        }
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8], MpError> {
        let end = self
            .pos
            .checked_add(n)
            .filter(|&e| e <= self.buf.len())
            .ok_or_else(|| MpError::from(MpFault::Truncated(self.pos)))?;
        let s = &self.buf[self.pos..end];
        self.pos = end;
        Ok(s)
    }

    fn be(&mut self, n: usize) -> Result<u64, MpError> {
        Ok(self
            .take(n)?
            .iter()
            .fold(0u64, |acc, &b| (acc << 8) | u64::from(b)))
    }

    /// The `N` bytes after the marker at `pos`, consumed with it; `None` (nothing consumed)
    /// when the value is cut short.
    #[inline]
    fn be_array<const N: usize>(&mut self) -> Option<[u8; N]> {
        let raw = self.buf.get(self.pos + 1..self.pos + 1 + N)?;
        self.pos += 1 + N;
        raw.try_into().ok()
    }

    /// Any non-negative integer, whatever its width.
    ///
    /// The reads every request makes (header keys, the sync, a map's or an array's length, a
    /// short string) are small inlined fast paths; anything else, an error included, goes to
    /// an out-of-line read, so the fast path costs a compare and a load.
    #[inline]
    pub fn read_uint(&mut self) -> Result<u64, MpError> {
        match self.buf.get(self.pos) {
            Some(&b) if b < 0x80 => {
                self.pos += 1;
                Ok(u64::from(b))
            }
            _ => self.read_uint_wide(),
        }
    }

    /// [`read_uint`](Self::read_uint) past a positive fixint.
    #[inline(never)]
    fn read_uint_wide(&mut self) -> Result<u64, MpError> {
        // The unsigned widths (sync and task ids) read here; rmp's generic integer read, which
        // also takes signed markers, costs ~3x as much. Anything else, a truncated value
        // included, is rmp's to read or refuse.
        match self.buf.get(self.pos) {
            // Each width read as one big-endian load (syncs are u32s in a long run).
            Some(0xcc) => {
                if let Some([v]) = self.be_array::<1>() {
                    return Ok(u64::from(v));
                }
            }
            Some(0xcd) => {
                if let Some(v) = self.be_array::<2>() {
                    return Ok(u64::from(u16::from_be_bytes(v)));
                }
            }
            Some(0xce) => {
                if let Some(v) = self.be_array::<4>() {
                    return Ok(u64::from(u32::from_be_bytes(v)));
                }
            }
            Some(0xcf) => {
                if let Some(v) = self.be_array::<8>() {
                    return Ok(u64::from_be_bytes(v));
                }
            }
            _ => {}
        }
        self.read_uint_rmp()
    }

    #[cold]
    #[inline(never)]
    fn read_uint_rmp(&mut self) -> Result<u64, MpError> {
        self.with_rmp(decode::read_int::<u64, _>, |e, at| {
            num_err(e, at, "unsigned")
        })
    }

    /// Any integer that fits an i64, whatever its width.
    pub fn read_int(&mut self) -> Result<i64, MpError> {
        self.with_rmp(decode::read_int::<i64, _>, |e, at| {
            num_err(e, at, "integer")
        })
    }

    /// An integer or a float, as f64 (Lua sends integral numbers as integers).
    pub fn read_number(&mut self) -> Result<f64, MpError> {
        match self.peek_marker()? {
            Marker::F32 => self
                .with_rmp(decode::read_f32, |e, at| val_err(e, at, "number"))
                .map(f64::from),
            Marker::F64 => self.with_rmp(decode::read_f64, |e, at| val_err(e, at, "number")),
            Marker::FixNeg(_) | Marker::I8 | Marker::I16 | Marker::I32 | Marker::I64 => {
                self.read_int().map(|v| v as f64)
            }
            Marker::FixPos(_) | Marker::U8 | Marker::U16 | Marker::U32 | Marker::U64 => {
                self.read_uint().map(|v| v as f64)
            }
            m => Err(MpFault::Type {
                expected: "number",
                found: marker_name(m),
                at: self.pos,
            }
            .into()),
        }
    }

    /// A string, borrowed; it must be valid UTF-8.
    pub fn read_str(&mut self) -> Result<&'a str, MpError> {
        let at = self.pos;
        let raw = self.read_str_bytes()?;
        // Names (every call's function name) are ASCII: a word-wide check instead of the full
        // decoder, which costs ~110 instructions for a 16-byte name.
        if raw.is_ascii() {
            // SAFETY: ASCII bytes are valid UTF-8.
            return Ok(unsafe { std::str::from_utf8_unchecked(raw) });
        }
        std::str::from_utf8(raw).map_err(|_| MpFault::Utf8(at).into())
    }

    /// A string's bytes, borrowed, without checking UTF-8.
    #[inline]
    pub fn read_str_bytes(&mut self) -> Result<&'a [u8], MpError> {
        // A fixstr (names, keys, status letters) without rmp's generic read.
        if let Some(&b @ 0xa0..=0xbf) = self.buf.get(self.pos) {
            let end = self.pos + 1 + usize::from(b & 0x1f);
            if let Some(s) = self.buf.get(self.pos + 1..end) {
                self.pos = end;
                return Ok(s);
            }
        }
        self.read_str_bytes_rmp()
    }

    #[cold]
    #[inline(never)]
    fn read_str_bytes_rmp(&mut self) -> Result<&'a [u8], MpError> {
        if let Some(0xa0..=0xbf) = self.buf.get(self.pos) {
            // A fixstr longer than what is left: cut short after its marker, and the reader
            // stays where it was.
            return Err(MpFault::Truncated(self.pos + 1).into());
        }
        let len = self.with_rmp(decode::read_str_len, |e, at| val_err(e, at, "string"))?;
        self.take(len as usize)
    }

    /// A string or a binary, borrowed (scrambles come as either).
    pub fn read_str_or_bin(&mut self) -> Result<&'a [u8], MpError> {
        match self.peek_marker()? {
            Marker::Bin8 | Marker::Bin16 | Marker::Bin32 => {
                let len = self.with_rmp(decode::read_bin_len, |e, at| val_err(e, at, "binary"))?;
                self.take(len as usize)
            }
            _ => self.read_str_bytes(),
        }
    }

    #[inline]
    pub fn read_array_len(&mut self) -> Result<u32, MpError> {
        // A fixarray (every call's args, every task tuple) without rmp's generic read.
        if let Some(&b @ 0x90..=0x9f) = self.buf.get(self.pos) {
            self.pos += 1;
            return Ok(u32::from(b & 0x0f));
        }
        self.read_array_len_rmp()
    }

    #[cold]
    #[inline(never)]
    fn read_array_len_rmp(&mut self) -> Result<u32, MpError> {
        self.with_rmp(decode::read_array_len, |e, at| val_err(e, at, "array"))
    }

    #[inline]
    pub fn read_map_len(&mut self) -> Result<u32, MpError> {
        // A fixmap (every header and body) without rmp's generic read.
        if let Some(&b @ 0x80..=0x8f) = self.buf.get(self.pos) {
            self.pos += 1;
            return Ok(u32::from(b & 0x0f));
        }
        self.read_map_len_rmp()
    }

    #[cold]
    #[inline(never)]
    fn read_map_len_rmp(&mut self) -> Result<u32, MpError> {
        self.with_rmp(decode::read_map_len, |e, at| val_err(e, at, "map"))
    }

    /// Consumes a nil if one is next; says whether it did.
    pub fn eat_nil(&mut self) -> bool {
        if self.peek_marker() == Ok(Marker::Null) {
            self.pos += 1;
            true
        } else {
            false
        }
    }

    /// Skips one complete value of any type, validating it, and returns its raw bytes.
    ///
    /// Iterative: a fixed stack of "children still to read" counters, one per open container,
    /// bounded by [`MAX_DEPTH`]; the total number of values by [`MAX_ELEMENTS`].
    pub fn skip_value(&mut self) -> Result<&'a [u8], MpError> {
        self.skip_value_within::<MAX_DEPTH>(MAX_ELEMENTS)
    }

    /// [`skip_value`](Self::skip_value) bounded by [`REPLY_MAX_DEPTH`] and
    /// [`REPLY_MAX_ELEMENTS`]: a reply holds a value the server accepted, wrapped.
    pub fn skip_reply_value(&mut self) -> Result<&'a [u8], MpError> {
        self.skip_value_within::<REPLY_MAX_DEPTH>(REPLY_MAX_ELEMENTS)
    }

    /// [`skip_value`](Self::skip_value) with `DEPTH` levels and `max_elements` values at most.
    pub fn skip_value_within<const DEPTH: usize>(
        &mut self,
        max_elements: usize,
    ) -> Result<&'a [u8], MpError> {
        // Every call's args are a short array of scalars and strings: walked without the
        // stack. Anything else, a cut-short value included, takes the general walk, which
        // names what is wrong.
        if max_elements >= FLAT_MAX_ELEMENTS && DEPTH >= 1 {
            if let Some(flat) = self.skip_flat_fixarray() {
                return Ok(flat);
            }
        }
        let start = self.pos;
        // Almost every value is shallow: a stack of `SHALLOW_DEPTH` counters costs a few
        // stores to clear where `DEPTH` (128, 1 KiB) cost a memset on every call. A value that
        // goes deeper is skipped again from its start with the full stack, so the bound and the
        // error stay `DEPTH`'s and nothing is allocated.
        let mut shallow = [0u64; SHALLOW_DEPTH];
        match self.skip_nested(
            &mut shallow[..SHALLOW_DEPTH.min(DEPTH)],
            start,
            max_elements,
        ) {
            Err(e) if DEPTH > SHALLOW_DEPTH && matches!(e.fault(), MpFault::TooDeep { .. }) => {
                self.pos = start;
                let mut pending = [0u64; DEPTH];
                self.skip_nested(&mut pending, start, max_elements)
            }
            r => r,
        }
    }

    /// A fixarray whose elements are scalars, strings or binaries, skipped; `None` (nothing
    /// consumed) for any other value, or one cut short. Where it answers, the general walk
    /// answers the same (a property test holds it to that).
    #[inline]
    fn skip_flat_fixarray(&mut self) -> Option<&'a [u8]> {
        let start = self.pos;
        let &head @ 0x90..=0x9f = self.buf.get(start)? else {
            return None;
        };
        let mut at = start + 1;
        for _ in 0..head & 0x0f {
            let marker = *self.buf.get(at)?;
            let len = match marker {
                // fixint, nil, false, true, negative fixint
                0x00..=0x7f | 0xc0 | 0xc2 | 0xc3 | 0xe0..=0xff => 1,
                0xa0..=0xbf => 1 + usize::from(marker & 0x1f),
                0xcc | 0xd0 => 2,
                0xcd | 0xd1 => 3,
                0xca | 0xce | 0xd2 => 5,
                0xcb | 0xcf | 0xd3 => 9,
                // bin8, str8
                0xc4 | 0xd9 => 2 + usize::from(*self.buf.get(at + 1)?),
                // bin16, str16
                0xc5 | 0xda => {
                    let n: [u8; 2] = self.buf.get(at + 1..at + 3)?.try_into().ok()?;
                    3 + usize::from(u16::from_be_bytes(n))
                }
                _ => return None,
            };
            at += len;
            if at > self.buf.len() {
                return None;
            }
        }
        self.pos = at;
        Some(&self.buf[start..at])
    }

    /// The skip itself, `pending.len()` levels deep at most: a fixed stack of "children still
    /// to read" counters, one per open container.
    fn skip_nested(
        &mut self,
        pending: &mut [u64],
        start: usize,
        max_elements: usize,
    ) -> Result<&'a [u8], MpError> {
        let mut depth = 0usize;
        let mut elements = 0usize;
        loop {
            let at = self.pos;
            let marker = Marker::from_u8(self.take(1)?[0]);
            elements += 1;
            if elements > max_elements {
                return Err(MpFault::TooManyElements {
                    at,
                    limit: max_elements,
                }
                .into());
            }
            let children = match marker {
                Marker::FixPos(_)
                | Marker::FixNeg(_)
                | Marker::Null
                | Marker::True
                | Marker::False => 0,
                Marker::U8 | Marker::I8 => self.take(1).map(|_| 0)?,
                Marker::U16 | Marker::I16 => self.take(2).map(|_| 0)?,
                Marker::U32 | Marker::I32 | Marker::F32 => self.take(4).map(|_| 0)?,
                Marker::U64 | Marker::I64 | Marker::F64 => self.take(8).map(|_| 0)?,
                Marker::FixStr(n) => self.take(n as usize).map(|_| 0)?,
                Marker::Str8 | Marker::Bin8 => self.skip_sized(1, 0)?,
                Marker::Str16 | Marker::Bin16 => self.skip_sized(2, 0)?,
                Marker::Str32 | Marker::Bin32 => self.skip_sized(4, 0)?,
                Marker::FixExt1 => self.take(2).map(|_| 0)?,
                Marker::FixExt2 => self.take(3).map(|_| 0)?,
                Marker::FixExt4 => self.take(5).map(|_| 0)?,
                Marker::FixExt8 => self.take(9).map(|_| 0)?,
                Marker::FixExt16 => self.take(17).map(|_| 0)?,
                Marker::Ext8 => self.skip_sized(1, 1)?,
                Marker::Ext16 => self.skip_sized(2, 1)?,
                Marker::Ext32 => self.skip_sized(4, 1)?,
                Marker::FixArray(n) => u64::from(n),
                Marker::Array16 => self.be(2)?,
                Marker::Array32 => self.be(4)?,
                Marker::FixMap(n) => 2 * u64::from(n),
                Marker::Map16 => 2 * self.be(2)?,
                Marker::Map32 => 2 * self.be(4)?,
                Marker::Reserved => return Err(MpFault::Reserved(at).into()),
            };
            if children > 0 {
                if depth == pending.len() {
                    return Err(MpFault::TooDeep {
                        at,
                        limit: pending.len(),
                    }
                    .into());
                }
                // Every child takes at least one byte: a count beyond the input is a lie.
                if children > (self.buf.len() - self.pos) as u64 {
                    return Err(MpFault::Truncated(at).into());
                }
                pending[depth] = children;
                depth += 1;
                continue;
            }
            // A value is complete: close every container it completes.
            loop {
                if depth == 0 {
                    return Ok(&self.buf[start..self.pos]);
                }
                pending[depth - 1] -= 1;
                if pending[depth - 1] > 0 {
                    break;
                }
                depth -= 1;
            }
        }
    }

    /// Skips a length-prefixed str/bin/ext body: `len_bytes` of length, `extra` bytes (the ext
    /// type), then the data.
    fn skip_sized(&mut self, len_bytes: usize, extra: usize) -> Result<u64, MpError> {
        let len = self.be(len_bytes)? as usize;
        self.take(extra + len)?;
        Ok(0)
    }
}

fn val_err(e: ValueReadError<BytesReadError>, at: usize, expected: &'static str) -> MpError {
    let fault = match e {
        ValueReadError::TypeMismatch(found) => MpFault::Type {
            expected,
            found: marker_name(found),
            at,
        },
        ValueReadError::InvalidMarkerRead(_) | ValueReadError::InvalidDataRead(_) => {
            MpFault::Truncated(at)
        }
    };
    fault.into()
}

fn num_err(e: NumValueReadError<BytesReadError>, at: usize, expected: &'static str) -> MpError {
    let fault = match e {
        NumValueReadError::TypeMismatch(found) => MpFault::Type {
            expected,
            found: marker_name(found),
            at,
        },
        NumValueReadError::OutOfRange => MpFault::OutOfRange(at),
        NumValueReadError::InvalidMarkerRead(_) | NumValueReadError::InvalidDataRead(_) => {
            MpFault::Truncated(at)
        }
    };
    fault.into()
}

/// Unwraps the result of an `rmp::encode` write into a `Vec<u8>`, which cannot fail: `Vec`'s
/// `io::Write` never errors (allocation failure aborts before it could).
fn vec<T, E: std::fmt::Debug>(r: Result<T, E>) -> T {
    match r {
        Ok(v) => v,
        Err(e) => unreachable!("writing MessagePack into a Vec<u8> failed: {e:?}"),
    }
}

/// Writers into a growable buffer, each the smallest encoding of its value. Integers, lengths
/// and strings are written here directly: rmp's writers go through `io::Write` a byte at a time
/// (~50 instructions for a one-letter string); the rest are rmp's.
pub mod write {
    use super::vec;
    use rmp::encode;

    /// A marker byte followed by `v`'s low `n` bytes, big-endian (`n` of 1, 2, 4 or 8).
    #[inline]
    fn sized(out: &mut Vec<u8>, marker: u8, v: u64, n: usize) {
        let be = v.to_be_bytes();
        out.push(marker);
        out.extend_from_slice(&be[8 - n..]);
    }

    /// A length past the fix form: the first of `markers` (8-, 16-, 32-bit lengths; 0 where
    /// the type has no 8-bit form) that holds it. Lengths past `u32::MAX` cannot be encoded
    /// at all; as rmp's writers, refuse them loudly.
    #[inline(never)]
    fn long_len(out: &mut Vec<u8>, n: usize, markers: [u8; 3]) {
        if n <= 0xff && markers[0] != 0 {
            sized(out, markers[0], n as u64, 1);
        } else if n <= 0xffff {
            sized(out, markers[1], n as u64, 2);
        } else if n <= 0xffff_ffff {
            sized(out, markers[2], n as u64, 4);
        } else {
            unreachable!("a MessagePack length of {n}");
        }
    }

    /// A length: the one-byte `fix | n` when `n <= fix_max` (the usual case, inlined),
    /// else [`long_len`].
    #[inline]
    fn len(out: &mut Vec<u8>, n: usize, fix: u8, fix_max: usize, markers: [u8; 3]) {
        if n <= fix_max {
            out.push(fix | n as u8);
        } else {
            long_len(out, n, markers);
        }
    }

    #[inline]
    pub fn uint(out: &mut Vec<u8>, v: u64) {
        match v {
            0..=0x7f => out.push(v as u8),
            0x80..=0xff => sized(out, 0xcc, v, 1),
            0x100..=0xffff => sized(out, 0xcd, v, 2),
            0x1_0000..=0xffff_ffff => sized(out, 0xce, v, 4),
            _ => sized(out, 0xcf, v, 8),
        }
    }
    pub fn sint(out: &mut Vec<u8>, v: i64) {
        vec(encode::write_sint(out, v));
    }
    pub fn f64(out: &mut Vec<u8>, v: f64) {
        vec(encode::write_f64(out, v));
    }
    #[inline]
    pub fn str(out: &mut Vec<u8>, s: &str) {
        len(out, s.len(), 0xa0, 31, [0xd9, 0xda, 0xdb]);
        out.extend_from_slice(s.as_bytes());
    }
    #[inline]
    pub fn bin(out: &mut Vec<u8>, b: &[u8]) {
        // A bin has no fix form.
        if b.len() <= 0xff {
            sized(out, 0xc4, b.len() as u64, 1);
        } else {
            long_len(out, b.len(), [0xc4, 0xc5, 0xc6]);
        }
        out.extend_from_slice(b);
    }
    pub fn nil(out: &mut Vec<u8>) {
        out.push(0xc0);
    }
    pub fn bool(out: &mut Vec<u8>, v: bool) {
        out.push(if v { 0xc3 } else { 0xc2 });
    }
    #[inline]
    pub fn array_len(out: &mut Vec<u8>, n: u32) {
        len(out, n as usize, 0x90, 15, [0, 0xdc, 0xdd]);
    }
    #[inline]
    pub fn map_len(out: &mut Vec<u8>, n: u32) {
        len(out, n as usize, 0x80, 15, [0, 0xde, 0xdf]);
    }
    /// A u32 in its fixed 5-byte form (`0xce` + big-endian), as frame lengths need.
    pub fn u32_fixed(out: &mut Vec<u8>, v: u32) {
        sized(out, 0xce, u64::from(v), 4);
    }
}

#[cfg(test)]
mod tests {
    /// A read's result with its error unboxed, to compare against a fault.
    trait Unboxed<T> {
        fn unboxed(self) -> Result<T, MpFault>;
    }

    impl<T> Unboxed<T> for Result<T, MpError> {
        fn unboxed(self) -> Result<T, MpFault> {
            self.map_err(|e| *e.0)
        }
    }

    use super::*;
    use proptest::prelude::*;

    /// One MessagePack value's bytes, of every kind the flat walk reads and some it does not
    /// (a map, a nested array, an ext, a str32, the reserved byte).
    fn any_value() -> impl Strategy<Value = Vec<u8>> {
        let marker_and_len = prop_oneof![
            (0x00u8..=0x7f).prop_map(|m| vec![m]),
            (0xe0u8..=0xff).prop_map(|m| vec![m]),
            prop::sample::select(vec![0xc0u8, 0xc1, 0xc2, 0xc3]).prop_map(|m| vec![m]),
            (0u8..32).prop_map(|n| {
                let mut v = vec![0xa0 | n];
                v.resize(1 + usize::from(n), b'x');
                v
            }),
            (prop::sample::select(vec![
                0xcc, 0xd0, 0xcd, 0xd1, 0xca, 0xce, 0xd2, 0xcb, 0xcf, 0xd3
            ]))
            .prop_map(|m: u8| {
                let width = match m {
                    0xcc | 0xd0 => 1,
                    0xcd | 0xd1 => 2,
                    0xca | 0xce | 0xd2 => 4,
                    _ => 8,
                };
                let mut v = vec![m];
                v.resize(1 + width, 7);
                v
            }),
            (prop::sample::select(vec![0xc4u8, 0xd9]), 0u8..=255).prop_map(|(m, n)| {
                let mut v = vec![m, n];
                v.resize(2 + usize::from(n), b'y');
                v
            }),
            (prop::sample::select(vec![0xc5u8, 0xda]), 0u16..600).prop_map(|(m, n)| {
                let mut v = vec![m];
                v.extend_from_slice(&n.to_be_bytes());
                v.resize(3 + usize::from(n), b'z');
                v
            }),
            Just(vec![0x81, 0x01, 0x02]),
            Just(vec![0x91, 0x91, 0x01]),
            Just(vec![0xd4, 0x01, 0x02]),
            Just(vec![0xdb, 0, 0, 0, 1, b'a']),
        ];
        marker_and_len
    }

    proptest! {
        /// Where the flat walk answers, the general walk gives the same bytes and position,
        /// over whole arrays, arrays cut short anywhere, and arrays with bytes after them.
        #[test]
        fn the_flat_walk_agrees_with_the_general_one(
            values in prop::collection::vec(any_value(), 0..16),
            cut in any::<prop::sample::Index>(),
            cut_it in any::<bool>(),
            tail in prop::collection::vec(any::<u8>(), 0..4),
        ) {
            let mut bytes = vec![0x90 | values.len() as u8];
            for v in &values {
                bytes.extend_from_slice(v);
            }
            if cut_it {
                bytes.truncate(cut.index(bytes.len() + 1));
            }
            bytes.extend_from_slice(&tail);
            let mut flat = Reader::new(&bytes);
            let fast = flat.skip_flat_fixarray();
            let mut general = Reader::new(&bytes);
            let mut pending = [0u64; MAX_DEPTH];
            let slow = general.skip_nested(&mut pending, 0, MAX_ELEMENTS);
            match fast {
                Some(v) => {
                    prop_assert_eq!(Ok(v), slow.map_err(|e| *e.0));
                    prop_assert_eq!(flat.pos, general.pos);
                }
                None => prop_assert_eq!(flat.pos, 0, "nothing consumed"),
            }
            // Whichever walk runs, skip_value answers as the general walk does.
            prop_assert_eq!(
                Reader::new(&bytes).skip_value().map_err(|e| *e.0),
                Reader::new(&bytes).skip_nested(&mut [0u64; MAX_DEPTH], 0, MAX_ELEMENTS).map_err(|e| *e.0)
            );
        }
    }

    #[test]
    fn the_flat_walk_takes_the_calls_args() {
        // [bin 32], [0.5], [987654], ["a", nil, true, -1]
        for args in [
            &[&[0x91, 0xc4, 32][..], &[b'x'; 32]].concat()[..],
            &[0x91, 0xcb, 0x3f, 0xe0, 0, 0, 0, 0, 0, 0],
            &[0x91, 0xce, 0, 0x0f, 0x12, 0x06],
            &[0x94, 0xa1, b'a', 0xc0, 0xc3, 0xff],
        ] {
            assert_eq!(
                Reader::new(args).skip_flat_fixarray(),
                Some(args),
                "{args:02x?}"
            );
        }
        // Nested, or a map, or cut short: the general walk's.
        for args in [&[0x91, 0x90][..], &[0x81, 1, 2], &[0x92, 0x01]] {
            assert_eq!(Reader::new(args).skip_flat_fixarray(), None, "{args:02x?}");
        }
    }

    fn nested(depth: usize) -> Vec<u8> {
        let mut v = vec![0x91; depth];
        v.push(0x01);
        v
    }

    #[test]
    fn skips_every_kind_of_value_and_returns_its_bytes() {
        let cases: &[&[u8]] = &[
            &[0x05],
            &[0xe0],
            &[0xc0],
            &[0xcc, 0xff],
            &[0xcd, 0, 1],
            &[0xce, 0, 0, 0, 1],
            &[0xcf, 0, 0, 0, 0, 0, 0, 0, 1],
            &[0xcb, 0, 0, 0, 0, 0, 0, 0, 0],
            &[0xa3, b'a', b'b', b'c'],
            &[0xd9, 1, b'x'],
            &[0xc4, 2, 1, 2],
            &[0xd4, 1, 9],
            &[0xc7, 1, 5, 9],
            &[0x92, 0x01, 0x91, 0x02],
            &[0x82, 0xa1, b'a', 0x90, 0x01, 0x80],
            &[0xdc, 0, 2, 0x01, 0x02],
        ];
        for case in cases {
            let mut input = case.to_vec();
            input.push(0x2a); // a trailing value that must stay unread
            let mut r = Reader::new(&input);
            assert_eq!(r.skip_value().unwrap(), *case, "case {case:02x?}");
            assert_eq!(r.read_uint().unwrap(), 42);
            assert!(r.is_empty());
        }
    }

    #[test]
    fn truncated_values_are_refused() {
        for case in [
            &[0x92, 0x01][..],
            &[0xa3, b'a'],
            &[0xcd, 0],
            &[0xdd, 0xff, 0xff, 0xff, 0xff],
        ] {
            assert!(
                matches!(
                    Reader::new(case).skip_value().unboxed(),
                    Err(MpFault::Truncated(_))
                ),
                "{case:02x?}"
            );
        }
        assert_eq!(
            Reader::new(&[0xc1]).skip_value().unboxed(),
            Err(MpFault::Reserved(0))
        );
    }

    #[test]
    fn depth_is_bounded_without_recursion() {
        assert_eq!(
            Reader::new(&nested(MAX_DEPTH)).skip_value().unwrap().len(),
            MAX_DEPTH + 1
        );
        assert_eq!(
            Reader::new(&nested(MAX_DEPTH + 1)).skip_value().unboxed(),
            Err(MpFault::TooDeep {
                at: MAX_DEPTH,
                limit: MAX_DEPTH
            })
        );
        assert!(matches!(
            Reader::new(&nested(100_000)).skip_value().unboxed(),
            Err(MpFault::TooDeep { .. })
        ));
    }

    #[test]
    fn replies_may_wrap_a_value_at_the_request_bounds() {
        let wrapped = nested(MAX_DEPTH + REPLY_WRAP_DEPTH);
        assert!(Reader::new(&wrapped).skip_value().is_err());
        assert_eq!(
            Reader::new(&wrapped).skip_reply_value().unwrap().len(),
            wrapped.len()
        );
        assert_eq!(
            Reader::new(&nested(REPLY_MAX_DEPTH + 1))
                .skip_reply_value()
                .unboxed(),
            Err(MpFault::TooDeep {
                at: REPLY_MAX_DEPTH,
                limit: REPLY_MAX_DEPTH
            })
        );
    }

    #[test]
    fn element_count_is_bounded() {
        let n = MAX_ELEMENTS; // the array itself plus n children is one too many
        let mut v = vec![0xdd];
        v.extend_from_slice(&(n as u32).to_be_bytes());
        v.resize(v.len() + n, 0x00);
        assert!(matches!(
            Reader::new(&v).skip_value().unboxed(),
            Err(MpFault::TooManyElements { .. })
        ));
        let mut ok = vec![0xdd];
        ok.extend_from_slice(&((n - 1) as u32).to_be_bytes());
        ok.resize(ok.len() + n - 1, 0x00);
        assert_eq!(Reader::new(&ok).skip_value().unwrap().len(), ok.len());
    }

    #[test]
    fn typed_reads_accept_any_width_and_name_the_mismatch() {
        assert_eq!(
            Reader::new(&[0xcf, 0, 0, 0, 0, 0, 0, 0, 7]).read_uint(),
            Ok(7)
        );
        assert_eq!(Reader::new(&[0xd0, 0xff]).read_int(), Ok(-1));
        assert_eq!(
            Reader::new(&[0xd0, 0xff]).read_uint().unboxed(),
            Err(MpFault::OutOfRange(0))
        );
        assert_eq!(
            Reader::new(&[0xcb, 0x3f, 0xf8, 0, 0, 0, 0, 0, 0]).read_number(),
            Ok(1.5)
        );
        assert_eq!(
            Reader::new(&[0xa1, b'x']).read_uint().unboxed(),
            Err(MpFault::Type {
                expected: "unsigned",
                found: "string",
                at: 0
            })
        );
        assert_eq!(
            Reader::new(&[0xa2, 0xff, 0xfe]).read_str().unboxed(),
            Err(MpFault::Utf8(0))
        );
        assert_eq!(Reader::new(&[0xc4, 1, 7]).read_str_or_bin(), Ok(&[7u8][..]));
    }

    #[test]
    fn the_direct_writers_and_fast_reads_agree_with_rmp() {
        // Every width boundary of the hand-written encodings, against rmp's.
        let uints = [
            0,
            1,
            0x7f,
            0x80,
            0xff,
            0x100,
            0xffff,
            0x1_0000,
            0xffff_ffff,
            0x1_0000_0000,
            u64::MAX,
        ];
        for v in uints {
            let (mut ours, mut theirs) = (Vec::new(), Vec::new());
            write::uint(&mut ours, v);
            rmp::encode::write_uint(&mut theirs, v).unwrap();
            assert_eq!(ours, theirs, "uint {v}");
            assert_eq!(Reader::new(&ours).read_uint(), Ok(v), "uint {v}");
            // Cut short, the fast path leaves the error to rmp.
            let cut = &ours[..ours.len() - 1];
            assert!(
                cut.is_empty() || Reader::new(cut).read_uint().is_err(),
                "uint {v}"
            );
        }
        for n in [0u32, 1, 15, 16, 31, 32, 255, 256, 0xffff, 0x1_0000] {
            let text = "x".repeat(n as usize);
            let (mut ours, mut theirs) = (Vec::new(), Vec::new());
            write::str(&mut ours, &text);
            rmp::encode::write_str(&mut theirs, &text).unwrap();
            assert_eq!(ours, theirs, "str of {n}");
            assert_eq!(Reader::new(&ours).read_str(), Ok(text.as_str()));
            let (mut ours, mut theirs) = (Vec::new(), Vec::new());
            write::bin(&mut ours, text.as_bytes());
            rmp::encode::write_bin(&mut theirs, text.as_bytes()).unwrap();
            assert_eq!(ours, theirs, "bin of {n}");
            let (mut ours, mut theirs) = (Vec::new(), Vec::new());
            write::array_len(&mut ours, n);
            rmp::encode::write_array_len(&mut theirs, n).unwrap();
            assert_eq!(ours, theirs, "array of {n}");
            assert_eq!(Reader::new(&ours).read_array_len(), Ok(n));
            let (mut ours, mut theirs) = (Vec::new(), Vec::new());
            write::map_len(&mut ours, n);
            rmp::encode::write_map_len(&mut theirs, n).unwrap();
            assert_eq!(ours, theirs, "map of {n}");
            assert_eq!(Reader::new(&ours).read_map_len(), Ok(n));
        }
        let mut out = Vec::new();
        write::u32_fixed(&mut out, 7);
        assert_eq!(out, [0xce, 0, 0, 0, 7]);
        // A fixstr longer than what is left is truncated, and the reader stays where it was.
        let mut r = Reader::new(&[0xa3, b'a']);
        assert_eq!(r.read_str_bytes().unboxed(), Err(MpFault::Truncated(1)));
        assert_eq!(r.position(), 0);
        // Signed markers holding a non-negative value are still unsigned to rmp's read.
        assert_eq!(Reader::new(&[0xd0, 0x05]).read_uint(), Ok(5));
    }
}
