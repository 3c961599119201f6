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

/// Why a MessagePack value could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MpError {
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
            .ok_or(MpError::Truncated(self.pos))
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
            .ok_or(MpError::Truncated(self.pos))?;
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

    /// Any non-negative integer, whatever its width.
    pub fn read_uint(&mut self) -> Result<u64, MpError> {
        // The unsigned widths (every header key, sync and task id) read here; rmp's generic
        // integer read, which also takes signed markers, costs ~3x as much. Anything else, a
        // truncated value included, is rmp's to read or refuse.
        match self.buf.get(self.pos) {
            Some(&b) if b < 0x80 => {
                self.pos += 1;
                return Ok(u64::from(b));
            }
            Some(&b @ 0xcc..=0xcf) => {
                let n = 1usize << (b - 0xcc);
                if let Some(raw) = self.buf.get(self.pos + 1..self.pos + 1 + n) {
                    self.pos += 1 + n;
                    return Ok(raw.iter().fold(0u64, |acc, &b| (acc << 8) | u64::from(b)));
                }
            }
            _ => {}
        }
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
            m => Err(MpError::Type {
                expected: "number",
                found: marker_name(m),
                at: self.pos,
            }),
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
        std::str::from_utf8(raw).map_err(|_| MpError::Utf8(at))
    }

    /// A string's bytes, borrowed, without checking UTF-8.
    pub fn read_str_bytes(&mut self) -> Result<&'a [u8], MpError> {
        // A fixstr (names, keys, status letters) without rmp's generic read.
        if let Some(&b @ 0xa0..=0xbf) = self.buf.get(self.pos) {
            let at = self.pos;
            self.pos += 1;
            return self
                .take(usize::from(b & 0x1f))
                .inspect_err(|_| self.pos = at);
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

    pub fn read_array_len(&mut self) -> Result<u32, MpError> {
        // A fixarray (every call's args, every task tuple) without rmp's generic read.
        if let Some(&b @ 0x90..=0x9f) = self.buf.get(self.pos) {
            self.pos += 1;
            return Ok(u32::from(b & 0x0f));
        }
        self.with_rmp(decode::read_array_len, |e, at| val_err(e, at, "array"))
    }

    pub fn read_map_len(&mut self) -> Result<u32, MpError> {
        // A fixmap (every header and body) without rmp's generic read.
        if let Some(&b @ 0x80..=0x8f) = self.buf.get(self.pos) {
            self.pos += 1;
            return Ok(u32::from(b & 0x0f));
        }
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
            Err(MpError::TooDeep { .. }) if DEPTH > SHALLOW_DEPTH => {
                self.pos = start;
                let mut pending = [0u64; DEPTH];
                self.skip_nested(&mut pending, start, max_elements)
            }
            r => r,
        }
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
                return Err(MpError::TooManyElements {
                    at,
                    limit: max_elements,
                });
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
                Marker::Reserved => return Err(MpError::Reserved(at)),
            };
            if children > 0 {
                if depth == pending.len() {
                    return Err(MpError::TooDeep {
                        at,
                        limit: pending.len(),
                    });
                }
                // Every child takes at least one byte: a count beyond the input is a lie.
                if children > (self.buf.len() - self.pos) as u64 {
                    return Err(MpError::Truncated(at));
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
    match e {
        ValueReadError::TypeMismatch(found) => MpError::Type {
            expected,
            found: marker_name(found),
            at,
        },
        ValueReadError::InvalidMarkerRead(_) | ValueReadError::InvalidDataRead(_) => {
            MpError::Truncated(at)
        }
    }
}

fn num_err(e: NumValueReadError<BytesReadError>, at: usize, expected: &'static str) -> MpError {
    match e {
        NumValueReadError::TypeMismatch(found) => MpError::Type {
            expected,
            found: marker_name(found),
            at,
        },
        NumValueReadError::OutOfRange => MpError::OutOfRange(at),
        NumValueReadError::InvalidMarkerRead(_) | NumValueReadError::InvalidDataRead(_) => {
            MpError::Truncated(at)
        }
    }
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
    use super::*;

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
                matches!(Reader::new(case).skip_value(), Err(MpError::Truncated(_))),
                "{case:02x?}"
            );
        }
        assert_eq!(Reader::new(&[0xc1]).skip_value(), Err(MpError::Reserved(0)));
    }

    #[test]
    fn depth_is_bounded_without_recursion() {
        assert_eq!(
            Reader::new(&nested(MAX_DEPTH)).skip_value().unwrap().len(),
            MAX_DEPTH + 1
        );
        assert_eq!(
            Reader::new(&nested(MAX_DEPTH + 1)).skip_value(),
            Err(MpError::TooDeep {
                at: MAX_DEPTH,
                limit: MAX_DEPTH
            })
        );
        assert!(matches!(
            Reader::new(&nested(100_000)).skip_value(),
            Err(MpError::TooDeep { .. })
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
            Reader::new(&nested(REPLY_MAX_DEPTH + 1)).skip_reply_value(),
            Err(MpError::TooDeep {
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
            Reader::new(&v).skip_value(),
            Err(MpError::TooManyElements { .. })
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
            Reader::new(&[0xd0, 0xff]).read_uint(),
            Err(MpError::OutOfRange(0))
        );
        assert_eq!(
            Reader::new(&[0xcb, 0x3f, 0xf8, 0, 0, 0, 0, 0, 0]).read_number(),
            Ok(1.5)
        );
        assert_eq!(
            Reader::new(&[0xa1, b'x']).read_uint(),
            Err(MpError::Type {
                expected: "unsigned",
                found: "string",
                at: 0
            })
        );
        assert_eq!(
            Reader::new(&[0xa2, 0xff, 0xfe]).read_str(),
            Err(MpError::Utf8(0))
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
        assert_eq!(r.read_str_bytes(), Err(MpError::Truncated(1)));
        assert_eq!(r.position(), 0);
        // Signed markers holding a non-negative value are still unsigned to rmp's read.
        assert_eq!(Reader::new(&[0xd0, 0x05]).read_uint(), Ok(5));
    }
}
