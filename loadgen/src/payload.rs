//! The message payload: a fixed header that lets a consumer measure put-to-ack time without
//! any shared map, followed by filler up to `--payload` bytes.
//!
//! Layout (little-endian): `run` nonce (8 bytes) | sequence number (8) | origin time (8, ns
//! since the run's clock started: the intended send time in open loop, the send time in closed
//! loop) | filler. The nonce tells this run's messages from leftovers of earlier runs on a
//! target that was not started fresh; the sequence number makes every value unique, which
//! Redis's `LREM` needs to remove exactly the message that was taken.

/// Bytes of the header every payload starts with; `--payload` cannot be smaller.
pub const HEADER_BYTES: usize = 24;

/// Byte used for the filler: printable, so a payload inspected in a Redis or Tarantool console
/// reads as text after the header.
const FILLER: u8 = b'x';

/// What a consumer reads back from a payload.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Stamp {
    pub seq: u64,
    pub origin_ns: u64,
}

/// Builds payloads of one size for one run, reusing a buffer.
pub struct PayloadWriter {
    run: u64,
    buf: Vec<u8>,
}

impl PayloadWriter {
    /// `size` is clamped up to `HEADER_BYTES`; the CLI refuses smaller sizes before this.
    pub fn new(run: u64, size: usize) -> Self {
        let mut buf = vec![FILLER; size.max(HEADER_BYTES)];
        buf[..8].copy_from_slice(&run.to_le_bytes());
        PayloadWriter { run, buf }
    }

    pub fn run(&self) -> u64 {
        self.run
    }

    /// The payload for message `seq` sent (or due) at `origin_ns`.
    pub fn write(&mut self, seq: u64, origin_ns: u64) -> &[u8] {
        self.buf[8..16].copy_from_slice(&seq.to_le_bytes());
        self.buf[16..24].copy_from_slice(&origin_ns.to_le_bytes());
        &self.buf
    }
}

/// Reads the stamp back; `None` for a payload from another run or another producer.
pub fn read(run: u64, data: &[u8]) -> Option<Stamp> {
    if data.len() < HEADER_BYTES || data[..8] != run.to_le_bytes() {
        return None;
    }
    let word = |i: usize| u64::from_le_bytes(data[i..i + 8].try_into().expect("8 bytes"));
    Some(Stamp {
        seq: word(8),
        origin_ns: word(16),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stamp_round_trips() {
        let mut w = PayloadWriter::new(0xabcdef, 64);
        let p = w.write(7, 123_456_789).to_vec();
        assert_eq!(p.len(), 64);
        assert_eq!(
            read(0xabcdef, &p),
            Some(Stamp {
                seq: 7,
                origin_ns: 123_456_789
            })
        );
        assert!(p[HEADER_BYTES..].iter().all(|&b| b == FILLER));
    }

    #[test]
    fn foreign_or_short_payloads_have_no_stamp() {
        let mut w = PayloadWriter::new(1, 32);
        let p = w.write(1, 2).to_vec();
        assert_eq!(read(2, &p), None);
        assert_eq!(read(1, &p[..20]), None);
        assert_eq!(read(1, b"hello"), None);
    }

    #[test]
    fn small_sizes_still_carry_the_header() {
        let mut w = PayloadWriter::new(5, 3);
        assert_eq!(w.write(9, 9).len(), HEADER_BYTES);
    }
}
