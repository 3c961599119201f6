//! Lua's `tostring` of a MessagePack scalar as the original sees it (Tarantool 2.6 decoding the
//! request, LuaJIT printing the value), for the places where the original keys something by
//! that text: the utube of a put (`tostring(opts.utube)`) and the value an error names.
//! Strings are their bytes; booleans `true` / `false`; a number is a Lua number printed with
//! `%.14g` (`1`, `-5`, `1.5`, `1e+14`, `-0`, `inf`, `nan`), except an integer of magnitude 1e14
//! or more, which Tarantool decodes as a 64-bit cdata (`100000000000000ULL`,
//! `-100000000000000LL`). Measured on the original: `net/tests/clients/tubes/NOTES.md`.

use std::fmt::Write as _;

use tarq_iproto::mp::Reader;

/// The longest text of a number: `18446744073709551615ULL` (a `%.14g` text is at most 21
/// bytes, as in `-1.2345678901234e-308`).
pub const MAX_NUMBER_TEXT: usize = 24;

/// From this magnitude on Tarantool hands an integer to Lua as a 64-bit cdata, not a number:
/// `%.14g` could not print it exactly.
const CDATA_FROM: u64 = 100_000_000_000_000;

/// Room for the text of a number, so a decoded request can borrow it like its own bytes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NumberText {
    len: u8,
    buf: [u8; MAX_NUMBER_TEXT],
}

impl Default for NumberText {
    fn default() -> Self {
        NumberText {
            len: 0,
            buf: [0; MAX_NUMBER_TEXT],
        }
    }
}

impl NumberText {
    pub fn as_bytes(&self) -> &[u8] {
        &self.buf[..usize::from(self.len)]
    }
}

impl std::fmt::Write for NumberText {
    fn write_str(&mut self, s: &str) -> std::fmt::Result {
        let at = usize::from(self.len);
        let end = at + s.len();
        let room = self.buf.get_mut(at..end).ok_or(std::fmt::Error)?;
        room.copy_from_slice(s.as_bytes());
        self.len = end as u8;
        Ok(())
    }
}

/// The text of the scalar `value` (one whole MessagePack value): borrowed for a string or a
/// boolean, written into `room` for a number. `None` for nil, an array, a map or an
/// extension: the original's text of those is an address or a type name, not a key anyone
/// could reproduce.
pub fn scalar<'a>(value: &'a [u8], room: &'a mut NumberText) -> Option<&'a [u8]> {
    use rmp::Marker as M;
    let mut r = Reader::new(value);
    match r.peek_marker().ok()? {
        M::FixStr(_) | M::Str8 | M::Str16 | M::Str32 | M::Bin8 | M::Bin16 | M::Bin32 => {
            r.read_str_or_bin().ok()
        }
        M::True => Some(b"true"),
        M::False => Some(b"false"),
        M::FixPos(_) | M::U8 | M::U16 | M::U32 | M::U64 => {
            let v = r.read_uint().ok()?;
            *room = NumberText::default();
            if v < CDATA_FROM {
                write!(room, "{v}")
            } else {
                write!(room, "{v}ULL")
            }
            .expect("fits");
            Some(room.as_bytes())
        }
        M::FixNeg(_) | M::I8 | M::I16 | M::I32 | M::I64 => {
            let v = r.read_int().ok()?;
            *room = NumberText::default();
            if v.unsigned_abs() < CDATA_FROM {
                write!(room, "{v}")
            } else {
                write!(room, "{v}LL")
            }
            .expect("fits");
            Some(room.as_bytes())
        }
        M::F32 | M::F64 => {
            let v = r.read_number().ok()?;
            *room = NumberText::default();
            lua_number(v, room);
            Some(room.as_bytes())
        }
        _ => None,
    }
}

/// LuaJIT's `tostring` of a number: C's `%.14g`, with `nan` for every NaN and `inf` / `-inf`.
fn lua_number(v: f64, out: &mut NumberText) {
    if v.is_nan() {
        return out.write_str("nan").expect("fits");
    }
    if v.is_infinite() {
        return out
            .write_str(if v < 0.0 { "-inf" } else { "inf" })
            .expect("fits");
    }
    if v == 0.0 {
        return out
            .write_str(if v.is_sign_negative() { "-0" } else { "0" })
            .expect("fits");
    }
    // 14 significant digits, rounded as printf rounds (both exact, to nearest): "d.ddddddddddddde±x".
    let mut sci = NumberText::default();
    write!(sci, "{:.13e}", v.abs()).expect("fits");
    let sci = std::str::from_utf8(sci.as_bytes()).expect("ascii");
    let (mantissa, exp) = sci.split_once('e').expect("an exponent");
    let exp: i32 = exp.parse().expect("an integer exponent");
    let mut digits = [0u8; 14];
    let mut n = 0;
    for b in mantissa.bytes().filter(u8::is_ascii_digit) {
        digits[n] = b;
        n += 1;
    }
    // %g drops trailing zeros of the fraction (and the point with them).
    while n > 1 && digits[n - 1] == b'0' {
        n -= 1;
    }
    let digits = std::str::from_utf8(&digits[..n]).expect("ascii");
    if v < 0.0 {
        out.write_str("-").expect("fits");
    }
    if !(-4..14).contains(&exp) {
        let (first, rest) = digits.split_at(1);
        out.write_str(first).expect("fits");
        if !rest.is_empty() {
            write!(out, ".{rest}").expect("fits");
        }
        let sign = if exp < 0 { '-' } else { '+' };
        write!(out, "e{sign}{:02}", exp.unsigned_abs()).expect("fits");
    } else if exp < 0 {
        out.write_str("0.").expect("fits");
        for _ in 0..(-exp - 1) {
            out.write_str("0").expect("fits");
        }
        out.write_str(digits).expect("fits");
    } else {
        let int_len = exp as usize + 1;
        if digits.len() <= int_len {
            out.write_str(digits).expect("fits");
            for _ in digits.len()..int_len {
                out.write_str("0").expect("fits");
            }
        } else {
            let (int, frac) = digits.split_at(int_len);
            write!(out, "{int}.{frac}").expect("fits");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tarq_iproto::mp::write;

    fn text(build: impl FnOnce(&mut Vec<u8>)) -> String {
        let mut v = Vec::new();
        build(&mut v);
        let mut room = NumberText::default();
        String::from_utf8(scalar(&v, &mut room).expect("a scalar").to_vec()).expect("utf-8")
    }

    fn float(v: f64) -> String {
        text(|o| write::f64(o, v))
    }

    #[test]
    fn numbers_print_as_the_original_printed_them() {
        // Each pair as the original stored `tostring(opts.utube)` for that value, sent by
        // tarantool-python (NOTES.md).
        for (v, want) in [
            (1.5, "1.5"),
            (0.1, "0.1"),
            (1e20, "1e+20"),
            (1.0, "1"),
            (100.0, "100"),
            (1e15, "1e+15"),
            (1e14, "1e+14"),
            (f64::INFINITY, "inf"),
            (f64::NEG_INFINITY, "-inf"),
            (f64::NAN, "nan"),
            (-f64::NAN, "nan"),
            (-0.0, "-0"),
            (0.0, "0"),
            (1e-5, "1e-05"),
            (0.0001, "0.0001"),
            (123.456, "123.456"),
            (1.0 / 3.0, "0.33333333333333"),
            (2.5e-300, "2.5e-300"),
            (f64::MAX, "1.7976931348623e+308"),
            (5e-324, "4.9406564584125e-324"),
            (-2.5, "-2.5"),
            (99999999999999.0, "99999999999999"),
            (123456.789, "123456.789"),
        ] {
            assert_eq!(float(v), want, "{v:e}");
        }
        for (v, want) in [
            (1, "1"),
            (0, "0"),
            (99_999_999_999_999, "99999999999999"),
            (100_000_000_000_000, "100000000000000ULL"),
            (123_456_789_012_345, "123456789012345ULL"),
            (u64::MAX, "18446744073709551615ULL"),
            (1 << 53, "9007199254740992ULL"),
            (2_147_483_648, "2147483648"),
        ] {
            assert_eq!(text(|o| write::uint(o, v)), want);
        }
        for (v, want) in [
            (-1, "-1"),
            (-5, "-5"),
            (-2_147_483_649, "-2147483649"),
            (-99_999_999_999_999, "-99999999999999"),
            (-100_000_000_000_000, "-100000000000000LL"),
            (i64::MIN, "-9223372036854775808LL"),
        ] {
            assert_eq!(text(|o| write::sint(o, v)), want);
        }
        // A float32 is widened first, as Lua numbers are doubles.
        assert_eq!(
            text(|o| o.extend_from_slice(&[0xca, 0x3f, 0xc0, 0, 0])),
            "1.5"
        );
        assert_eq!(
            text(|o| o.extend_from_slice(&[0xca, 0x3d, 0xcc, 0xcc, 0xcd])),
            "0.10000000149012"
        );
    }

    #[test]
    fn strings_and_booleans_are_their_own_text_and_the_rest_is_refused() {
        assert_eq!(text(|o| write::str(o, "user-1")), "user-1");
        assert_eq!(text(|o| write::bin(o, b"k")), "k");
        assert_eq!(text(|o| write::bool(o, true)), "true");
        assert_eq!(text(|o| write::bool(o, false)), "false");
        let mut room = NumberText::default();
        for v in [vec![0xc0], vec![0x91, 0x01], vec![0x80], vec![0xd4, 1, 0]] {
            assert_eq!(scalar(&v, &mut room), None, "{v:?}");
        }
    }
}
