//! The log's records that are not durable yet: one byte buffer, plus big payloads held by
//! reference rather than copied into it. A put of a 256 MiB payload logs a record of 256 MiB;
//! copying it would hold the payload twice (the task's and the record's) until the write
//! returns, or until the sync does. The queue keeps a big payload in a shared buffer
//! ([`tarq_engine::Queue::shared_payload`]), so the record keeps a reference to that buffer
//! and its bytes go to the file straight from it.
//!
//! Positions are offsets in the byte buffer. A held payload sits *at* an offset: its bytes
//! come after the buffer's bytes before that offset and before the ones from it on. It is
//! always inside a record (its tail), so inside a batch, never at a batch's edge.

use std::collections::VecDeque;

use tarq_engine::Bytes;

#[derive(Debug, Default)]
pub(crate) struct Pending {
    pub buf: Vec<u8>,
    /// Payloads held by reference, in offset order: `(offset in buf, bytes)`.
    held: VecDeque<(usize, Bytes)>,
    /// Bytes of the held payloads.
    held_bytes: usize,
}

impl Pending {
    /// Positions in use: the byte buffer's length (held payloads take no position).
    pub fn len(&self) -> usize {
        self.buf.len()
    }

    /// Bytes of records, the held payloads included: what a write of everything would write.
    pub fn bytes(&self) -> usize {
        self.buf.len() + self.held_bytes
    }

    /// Holds `payload` at the buffer's end: the next bytes appended follow it.
    pub fn hold(&mut self, payload: Bytes) {
        self.held_bytes += payload.len();
        self.held.push_back((self.buf.len(), payload));
    }

    /// The bytes of positions `from..to`, in order, as slices of the buffer and the held
    /// payloads between them (a payload at `to` included, one at `from` not: it belongs to
    /// the range that ends there).
    pub fn pieces(&self, from: usize, to: usize) -> impl Iterator<Item = &[u8]> {
        let mut at = from;
        let mut held = self.held.iter().filter(move |(o, _)| *o > from && *o <= to);
        let mut next = held.next();
        std::iter::from_fn(move || match next {
            Some((o, p)) if *o == at => {
                next = held.next();
                Some(&p[..])
            }
            Some((o, _)) => {
                let piece = &self.buf[at..*o];
                at = *o;
                Some(piece)
            }
            None if at < to => {
                let piece = &self.buf[at..to];
                at = to;
                Some(piece)
            }
            None => None,
        })
        .filter(|p| !p.is_empty())
    }

    /// Positions `from..to` as one slice of the buffer, when no payload is held among them
    /// (the usual turn: no big put).
    pub fn contiguous(&self, from: usize, to: usize) -> Option<&[u8]> {
        let held_within = self.held.iter().any(|(o, _)| *o > from && *o <= to);
        (!held_within).then(|| &self.buf[from..to])
    }

    /// Bytes of positions `from..to` with the held payloads among them.
    pub fn bytes_between(&self, from: usize, to: usize) -> usize {
        to - from
            + self
                .held
                .iter()
                .filter(|(o, _)| *o > from && *o <= to)
                .map(|(_, p)| p.len())
                .sum::<usize>()
    }

    /// Drops positions `..cut` and the payloads held up to it; later positions move down.
    pub fn drain_front(&mut self, cut: usize) {
        self.buf.drain(..cut);
        while self.held.front().is_some_and(|(o, _)| *o <= cut) {
            let (_, p) = self.held.pop_front().expect("checked");
            self.held_bytes -= p.len();
        }
        for (o, _) in &mut self.held {
            *o -= cut;
        }
    }

    /// Drops positions from `at` on and the payloads held past it.
    pub fn truncate(&mut self, at: usize) {
        self.buf.truncate(at);
        while self.held.back().is_some_and(|(o, _)| *o > at) {
            let (_, p) = self.held.pop_back().expect("checked");
            self.held_bytes -= p.len();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn joined(p: &Pending, from: usize, to: usize) -> Vec<u8> {
        p.pieces(from, to).flatten().copied().collect()
    }

    #[test]
    fn held_payloads_come_between_the_bytes_around_their_offset() {
        let mut p = Pending::default();
        p.buf.extend_from_slice(b"ab");
        p.hold(Bytes::from_static(b"XY"));
        p.buf.extend_from_slice(b"cd");
        p.hold(Bytes::from_static(b"Z"));
        p.buf.extend_from_slice(b"e");
        assert_eq!(p.bytes(), 8);
        assert_eq!(joined(&p, 0, 5), b"abXYcdZe");
        assert_eq!(p.bytes_between(0, 5), 8);
        // A range ending at an offset takes its payload; the next range does not.
        assert_eq!(joined(&p, 0, 2), b"abXY");
        assert_eq!(joined(&p, 2, 4), b"cdZ");
        assert_eq!(joined(&p, 4, 5), b"e");
        assert_eq!(p.bytes_between(2, 4), 3);
    }

    #[test]
    fn draining_and_truncating_keep_offsets_and_counts_in_step() {
        let mut p = Pending::default();
        p.buf.extend_from_slice(b"ab");
        p.hold(Bytes::from_static(b"XY"));
        p.buf.extend_from_slice(b"cd");
        p.hold(Bytes::from_static(b"Z"));
        p.buf.extend_from_slice(b"e");
        p.drain_front(2);
        assert_eq!(joined(&p, 0, p.len()), b"cdZe");
        assert_eq!(p.bytes(), 4);
        p.truncate(1);
        assert_eq!(joined(&p, 0, p.len()), b"c");
        assert_eq!(p.bytes(), 1);
        p.drain_front(1);
        assert_eq!(p.bytes(), 0);
        assert_eq!(p.pieces(0, 0).count(), 0);
    }
}
