//! chap-sha1, Tarantool's password scramble (IPROTO.md §8, `src/scramble.c`): clients build a
//! scramble from the greeting's salt and the password; the server checks it against the stored
//! `sha1(sha1(password))` without ever holding the password itself.

use sha1::{Digest, Sha1};

/// Bytes of a scramble, and of the salt prefix that enters it (`SCRAMBLE_SIZE`).
pub const SCRAMBLE_LEN: usize = 20;

/// The method name sent in AUTH and advertised in the ID reply.
pub const CHAP_SHA1: &str = "chap-sha1";

fn sha1(parts: &[&[u8]]) -> [u8; SCRAMBLE_LEN] {
    let mut h = Sha1::new();
    for p in parts {
        h.update(p);
    }
    h.finalize().into()
}

fn salt20(salt: &[u8]) -> &[u8] {
    &salt[..salt.len().min(SCRAMBLE_LEN)]
}

/// `sha1(sha1(password))`: what the server keeps instead of the password.
pub fn hash2(password: &str) -> [u8; SCRAMBLE_LEN] {
    sha1(&[&sha1(&[password.as_bytes()])])
}

/// The client side: `sha1(pw) XOR sha1(salt[0..20] ++ sha1(sha1(pw)))`.
pub fn scramble(salt: &[u8], password: &str) -> [u8; SCRAMBLE_LEN] {
    let hash1 = sha1(&[password.as_bytes()]);
    let h2 = sha1(&[&hash1]);
    let mask = sha1(&[salt20(salt), &h2]);
    std::array::from_fn(|i| hash1[i] ^ mask[i])
}

/// The server side (`scramble_check`): unmask with `sha1(salt ++ hash2)` and check that the
/// result hashes to `hash2`.
pub fn check(salt: &[u8], scramble: &[u8], hash2: &[u8; SCRAMBLE_LEN]) -> bool {
    if scramble.len() != SCRAMBLE_LEN {
        return false;
    }
    let mask = sha1(&[salt20(salt), hash2]);
    let candidate: [u8; SCRAMBLE_LEN] = std::array::from_fn(|i| scramble[i] ^ mask[i]);
    sha1(&[&candidate]) == *hash2
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_right_password_passes_and_others_fail() {
        let salt: Vec<u8> = (0..32).collect();
        let stored = hash2("secret");
        assert!(check(&salt, &scramble(&salt, "secret"), &stored));
        assert!(!check(&salt, &scramble(&salt, "Secret"), &stored));
        let other_salt: Vec<u8> = (1..33).collect();
        assert!(!check(&other_salt, &scramble(&salt, "secret"), &stored));
        assert!(!check(&salt, b"short", &stored));
    }

    #[test]
    fn hash2_matches_a_known_value() {
        // sha1(sha1("")) computed independently.
        let h: String = hash2("").iter().map(|b| format!("{b:02x}")).collect();
        assert_eq!(h, "be1bdec0aa74b4dcb079943e70528096cca985f8");
    }
}
