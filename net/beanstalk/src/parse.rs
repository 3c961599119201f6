//! The argument scanners beanstalkd 1.12 applies to a command line, reproduced rule for rule:
//! its `read_u64`/`read_u32` (spaces skipped, a digit first, no sign, overflow refused), the
//! C library's `strtol`/`strtoul` behind `reserve-with-timeout` and `kick` (any C whitespace
//! skipped, a sign allowed, trailing bytes ignored, the result truncated to a C `int`/`uint`),
//! and its tube-name rules. The command table lives in `command.rs`; this file only scans.

/// Longest tube name in bytes: beanstalkd's `MAX_TUBE_NAME_LEN` (201) less its NUL.
pub const MAX_TUBE_NAME: usize = 200;

/// The bytes a tube name may hold: beanstalkd's `NAME_CHARS`.
pub fn is_name_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"-+/;.$_()".contains(&b)
}

/// What C's `isspace` accepts in the "C" locale: `strtol` and `strtoul` skip these.
fn is_c_space(b: u8) -> bool {
    matches!(b, b' ' | b'\t' | b'\n' | 0x0b | 0x0c | b'\r')
}

fn skip_spaces(s: &[u8]) -> &[u8] {
    let n = s.iter().take_while(|&&b| b == b' ').count();
    &s[n..]
}

/// Leading decimal digits of `s` as a `u64`; `None` when there are none or they overflow
/// (`strtoumax` sets `ERANGE`). Returns the value and the bytes after the digits.
fn digits_u64(s: &[u8]) -> Option<(u64, &[u8])> {
    let n = s.iter().take_while(|b| b.is_ascii_digit()).count();
    if n == 0 {
        return None;
    }
    let mut v: u64 = 0;
    for &b in &s[..n] {
        v = v.checked_mul(10)?.checked_add(u64::from(b - b'0'))?;
    }
    Some((v, &s[n..]))
}

/// beanstalkd's `read_u64` with an `end` pointer: spaces, then a digit, then digits that fit.
pub fn u64_then(s: &[u8]) -> Option<(u64, &[u8])> {
    digits_u64(skip_spaces(s))
}

/// beanstalkd's `read_u32` with an `end` pointer.
pub fn u32_then(s: &[u8]) -> Option<(u32, &[u8])> {
    let (v, rest) = u64_then(s)?;
    Some((u32::try_from(v).ok()?, rest))
}

/// beanstalkd's `read_u64` without an `end` pointer: the number must end the line.
pub fn u64_last(s: &[u8]) -> Option<u64> {
    match u64_then(s)? {
        (v, []) => Some(v),
        _ => None,
    }
}

/// beanstalkd's `read_u32` without an `end` pointer.
pub fn u32_last(s: &[u8]) -> Option<u32> {
    match u32_then(s)? {
        (v, []) => Some(v),
        _ => None,
    }
}

/// C whitespace, an optional sign, then digits, as `strtol`/`strtoul` scan them. Returns the
/// sign and the magnitude, or `Ok(None)` when no digit follows (no conversion), or `Err` when
/// the magnitude overflows a `u64` (`ERANGE` either way).
fn c_signed_digits(s: &[u8]) -> Result<Option<(bool, u64)>, ()> {
    let n = s.iter().take_while(|&&b| is_c_space(b)).count();
    let s = &s[n..];
    let (negative, s) = match s.first() {
        Some(b'-') => (true, &s[1..]),
        Some(b'+') => (false, &s[1..]),
        _ => (false, s),
    };
    if !s.first().is_some_and(u8::is_ascii_digit) {
        return Ok(None);
    }
    digits_u64(s).map(|(v, _)| Some((negative, v))).ok_or(())
}

/// `reserve-with-timeout`'s argument: `(int) strtol(s, ..., 10)`, refused only on `ERANGE`.
/// No digits read as 0 and trailing bytes are ignored, as in beanstalkd.
pub fn c_strtol_as_int(s: &[u8]) -> Option<i32> {
    match c_signed_digits(s) {
        Err(()) => None,
        Ok(None) => Some(0),
        Ok(Some((negative, magnitude))) => {
            let v: i64 = if negative {
                // -(2^63) is the one negative magnitude past i64::MAX that strtol accepts.
                0i64.checked_sub_unsigned(magnitude)?
            } else {
                i64::try_from(magnitude).ok()?
            };
            Some(v as i32) // the C conversion to `int` keeps the low 32 bits
        }
    }
}

/// `kick`'s argument: `(unsigned) strtoul(s, ..., 10)`, refused when no digit is read or on
/// `ERANGE`; a minus sign negates modulo 2^64, trailing bytes are ignored.
pub fn c_strtoul_as_uint(s: &[u8]) -> Option<u32> {
    match c_signed_digits(s) {
        Err(()) | Ok(None) => None,
        Ok(Some((negative, magnitude))) => {
            let v = if negative {
                magnitude.wrapping_neg()
            } else {
                magnitude
            };
            Some(v as u32) // the C conversion to `unsigned int` keeps the low 32 bits
        }
    }
}

/// beanstalkd's `is_valid_tube`: 1 to 200 name bytes, not starting with '-'.
pub fn tube_name(s: &[u8]) -> Option<&str> {
    let ok = !s.is_empty()
        && s.len() <= MAX_TUBE_NAME
        && s[0] != b'-'
        && s.iter().all(|&b| is_name_byte(b));
    // Name bytes are ASCII, so this never fails once `ok` holds.
    ok.then(|| std::str::from_utf8(s).ok()).flatten()
}

/// beanstalkd's `read_tube_name` for `pause-tube`: spaces, then the longest run of name
/// bytes (at least one). Returns the run and the bytes after it; the name's length and first
/// byte are checked later by [`tube_name`].
pub fn name_run_then(s: &[u8]) -> Option<(&[u8], &[u8])> {
    let s = skip_spaces(s);
    let n = s.iter().take_while(|&&b| is_name_byte(b)).count();
    (n > 0).then(|| s.split_at(n))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strict_numbers_follow_read_u32() {
        assert_eq!(u32_last(b"  42"), Some(42));
        assert_eq!(u32_last(b"4294967295"), Some(u32::MAX));
        assert_eq!(u32_last(b"4294967296"), None);
        assert_eq!(u32_last(b"+1"), None);
        assert_eq!(u32_last(b"-1"), None);
        assert_eq!(u32_last(b"1 "), None);
        assert_eq!(u32_last(b""), None);
        assert_eq!(u64_last(b"18446744073709551615"), Some(u64::MAX));
        assert_eq!(u64_last(b"18446744073709551616"), None);
        assert_eq!(u32_then(b"7 8"), Some((7, &b" 8"[..])));
    }

    #[test]
    fn loose_numbers_follow_strtol_and_strtoul() {
        assert_eq!(c_strtol_as_int(b"abc"), Some(0));
        assert_eq!(c_strtol_as_int(b"5abc"), Some(5));
        assert_eq!(c_strtol_as_int(b"\t-3"), Some(-3));
        assert_eq!(c_strtol_as_int(b"4294967296"), Some(0));
        assert_eq!(c_strtol_as_int(b"4294967295"), Some(-1));
        assert_eq!(c_strtol_as_int(b"-9223372036854775808"), Some(0));
        assert_eq!(c_strtol_as_int(b"9223372036854775808"), None);
        assert_eq!(c_strtoul_as_uint(b"abc"), None);
        assert_eq!(c_strtoul_as_uint(b"  +3x"), Some(3));
        assert_eq!(c_strtoul_as_uint(b"-1"), Some(u32::MAX));
        assert_eq!(c_strtoul_as_uint(b"18446744073709551616"), None);
    }

    #[test]
    fn tube_names_follow_is_valid_tube() {
        assert_eq!(tube_name(b"a_b(1);$+/."), Some("a_b(1);$+/."));
        assert_eq!(tube_name(b"-a"), None);
        assert_eq!(tube_name(b""), None);
        assert_eq!(tube_name(b"a b"), None);
        assert!(tube_name(&[b'a'; MAX_TUBE_NAME]).is_some());
        assert!(tube_name(&[b'a'; MAX_TUBE_NAME + 1]).is_none());
    }
}
