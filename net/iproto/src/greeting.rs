//! The 128-byte greeting a server sends on accept (IPROTO.md §1): encoded by the server from a
//! UUID and a 32-byte salt, parsed by clients for the salt that chap-sha1 needs.

use base64::engine::general_purpose::STANDARD;
use base64::Engine as _;

/// Bytes in a greeting: two 64-byte lines.
pub const GREETING_LEN: usize = 128;

/// Bytes of salt the server generates. Tarantool uses 32 (44 base64 characters); go-tarantool
/// reads exactly 44 characters, so any other size breaks its authentication.
pub const SALT_LEN: usize = 32;

/// The version advertised. 2.6.0 is the one whose client behaviour IPROTO.md verified byte for
/// byte: net.box 2.6 sends no ID, and newer clients fall back cleanly.
pub const VERSION: &str = "2.6.0";

/// Builds the greeting: `Tarantool 2.6.0 (Binary) <uuid>` and the base64 salt, each line padded
/// with spaces to 63 bytes and ended by `\n`. The UUID is shown as an RFC 4122 version 4 UUID
/// (see [`uuid_v4`]), whatever random bytes it was made from.
pub fn encode(uuid: &[u8; 16], salt: &[u8; SALT_LEN]) -> [u8; GREETING_LEN] {
    let mut out = [b' '; GREETING_LEN];
    let line1 = format!(
        "Tarantool {VERSION} (Binary) {}",
        format_uuid(&uuid_v4(*uuid))
    );
    out[..line1.len()].copy_from_slice(line1.as_bytes());
    out[63] = b'\n';
    let line2 = STANDARD.encode(salt);
    out[64..64 + line2.len()].copy_from_slice(line2.as_bytes());
    out[127] = b'\n';
    out
}

/// Stamps 16 random bytes as an RFC 4122 version 4 UUID (version nibble 4, variant bits 10).
/// net.box 2.6 validates the greeting's UUID (`tt_uuid_validate`) and refuses the connection
/// with "Invalid greeting" when the variant bits are 111: raw random bytes did that on one
/// server start in eight.
pub fn uuid_v4(mut b: [u8; 16]) -> [u8; 16] {
    b[6] = (b[6] & 0x0f) | 0x40;
    b[8] = (b[8] & 0x3f) | 0x80;
    b
}

/// Formats 16 bytes as a canonical 8-4-4-4-12 lowercase UUID.
pub fn format_uuid(b: &[u8; 16]) -> String {
    let hex: String = b.iter().map(|x| format!("{x:02x}")).collect();
    format!(
        "{}-{}-{}-{}-{}",
        &hex[0..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..32]
    )
}

/// What a client learns from a greeting.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Greeting {
    /// e.g. "2.6.0"
    pub version: String,
    /// e.g. "Binary"
    pub protocol: String,
    pub uuid: String,
    /// The decoded salt; only its first 20 bytes enter chap-sha1.
    pub salt: Vec<u8>,
}

/// Why a greeting was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GreetingError {
    #[error("greeting must be {GREETING_LEN} bytes, got {0}")]
    Length(usize),
    #[error("greeting lines must end with '\\n' at bytes 63 and 127")]
    Lines,
    #[error("greeting does not start with 'Tarantool ': {0:?}")]
    NotTarantool(String),
    #[error("greeting salt is not valid base64")]
    Salt,
    #[error("greeting salt has {0} bytes, need at least 20")]
    ShortSalt(usize),
}

/// Parses a greeting as net.box does: `Tarantool <version> (<protocol>) <uuid>`, then a base64
/// salt of at least 20 bytes.
pub fn parse(buf: &[u8]) -> Result<Greeting, GreetingError> {
    if buf.len() != GREETING_LEN {
        return Err(GreetingError::Length(buf.len()));
    }
    if buf[63] != b'\n' || buf[127] != b'\n' {
        return Err(GreetingError::Lines);
    }
    let line1 = String::from_utf8_lossy(&buf[..63]).trim_end().to_string();
    let mut words = line1.split(' ');
    if words.next() != Some("Tarantool") {
        return Err(GreetingError::NotTarantool(line1));
    }
    let version = words.next().unwrap_or_default().to_string();
    let protocol = words
        .next()
        .unwrap_or_default()
        .trim_matches(|c| c == '(' || c == ')')
        .to_string();
    let uuid = words.next().unwrap_or_default().to_string();
    let salt_text = String::from_utf8_lossy(&buf[64..127]);
    let salt = STANDARD
        .decode(salt_text.trim_end())
        .map_err(|_| GreetingError::Salt)?;
    if salt.len() < 20 {
        return Err(GreetingError::ShortSalt(salt.len()));
    }
    Ok(Greeting {
        version,
        protocol,
        uuid,
        salt,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const UUID: [u8; 16] = [
        0xff, 0x19, 0x42, 0x1f, 0xf5, 0xbb, 0x4b, 0x5f, 0xb8, 0xc6, 0xbc, 0x44, 0x11, 0xf8, 0x73,
        0xda,
    ];

    fn salt() -> [u8; 32] {
        std::array::from_fn(|i| i as u8)
    }

    /// IPROTO.md §1, the example greeting, byte for byte.
    #[test]
    fn greeting_matches_the_spec_example() {
        let mut expected = Vec::new();
        expected.extend_from_slice(
            b"Tarantool 2.6.0 (Binary) ff19421f-f5bb-4b5f-b8c6-bc4411f873da  \n",
        );
        expected.extend_from_slice(b"AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8=");
        expected.resize(127, b' ');
        expected.push(b'\n');
        assert_eq!(encode(&UUID, &salt()).to_vec(), expected);
    }

    #[test]
    fn greeting_round_trips() {
        let g = parse(&encode(&UUID, &salt())).unwrap();
        assert_eq!(g.version, "2.6.0");
        assert_eq!(g.protocol, "Binary");
        assert_eq!(g.uuid, "ff19421f-f5bb-4b5f-b8c6-bc4411f873da");
        assert_eq!(g.salt, salt().to_vec());
    }

    /// Regression: a UUID with variant bits 111 made net.box 2.6 refuse the greeting.
    #[test]
    fn greeting_uuid_is_always_rfc4122_v4() {
        for byte in 0..=255u8 {
            let g = parse(&encode(&[byte; 16], &salt())).unwrap();
            let version = &g.uuid[14..15];
            let variant = u8::from_str_radix(&g.uuid[19..20], 16).unwrap();
            assert_eq!(version, "4", "uuid {} from byte {byte:#x}", g.uuid);
            assert_eq!(
                variant & 0b1100,
                0b1000,
                "uuid {} from byte {byte:#x}",
                g.uuid
            );
        }
    }

    #[test]
    fn bad_greetings_are_refused() {
        assert_eq!(parse(&[b' '; 10]), Err(GreetingError::Length(10)));
        let mut g = encode(&UUID, &salt());
        g[63] = b' ';
        assert_eq!(parse(&g), Err(GreetingError::Lines));
        let mut g = encode(&UUID, &salt());
        g[..9].copy_from_slice(b"Memcached");
        assert!(matches!(parse(&g), Err(GreetingError::NotTarantool(_))));
    }
}
