//! Fixed-size byte strings as lowercase hex, the form etcd values hold them in (the link key,
//! a user's password hash): readable with `etcdctl get`, and checked for length on the way
//! back, so a value edited by hand is refused rather than half read.

/// `bytes` as lowercase hex digits, two a byte.
pub fn encode(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The `N` bytes `text` holds as `2 * N` hex digits (either case, surrounding whitespace
/// ignored); `None` for any other length or a character that is not a hex digit.
pub fn decode<const N: usize>(text: &str) -> Option<[u8; N]> {
    let text = text.trim();
    if text.len() != N * 2 {
        return None;
    }
    let mut out = [0; N];
    for (i, b) in out.iter_mut().enumerate() {
        *b = u8::from_str_radix(text.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_round_trip_and_a_wrong_length_or_digit_is_refused() {
        let b: [u8; 4] = [0, 0x7f, 0xab, 0xff];
        assert_eq!(encode(&b), "007fabff");
        assert_eq!(decode::<4>(" 007FABff\n"), Some(b));
        assert_eq!(decode::<4>("007fab"), None);
        assert_eq!(decode::<4>("007fabfg"), None);
        assert_eq!(decode::<2>("é1"), None);
    }
}
