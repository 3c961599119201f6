//! Which leader wrote which part of the log: each turn's `Commit` (format version 3) carries
//! the term of the leader that wrote it and the log's history id. A node keeps, for the part of
//! its log it still holds, where each term starts; a replica that subscribes names its
//! position and the term of its record there, and the primary serves it only if its own record
//! at that position has the same term (Raft's log-matching rule): otherwise the two logs
//! diverged after a failover and the replica must join again. The history id tells a log that
//! shares its beginning with this one from an unrelated one (Tarantool's replicaset UUID).

/// The terms of a log's records, from `known_from` on.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Terms {
    /// (term, first record of the first turn written in it), in log order.
    starts: Vec<(u64, u64)>,
    /// The first record whose term is known here (records before it are in no file kept).
    known_from: u64,
    /// The log's history id; 0 until a primary names one (or for logs before version 3).
    pub history: u64,
}

impl Terms {
    /// Terms known from record `from` on, where the term is `term` (a snapshot's start).
    pub fn starting(from: u64, term: u64, history: u64) -> Terms {
        Terms {
            starts: vec![(term, from)],
            known_from: from,
            history,
        }
    }

    /// A turn of `term` whose first record is `first` was logged.
    pub fn note(&mut self, term: u64, first: u64, history: u64) {
        if self.starts.is_empty() {
            self.known_from = first;
        }
        if self.starts.last().is_none_or(|&(t, _)| t != term) {
            self.starts.push((term, first));
        }
        if history != 0 {
            self.history = history;
        }
    }

    /// The term of the last turn logged (0 for none).
    pub fn last_term(&self) -> u64 {
        self.starts.last().map_or(0, |s| s.0)
    }

    /// The first record whose term is known.
    pub fn known_from(&self) -> u64 {
        self.known_from
    }

    /// The term of record `seq` (the log's last record is `last_seq`), `None` when this log
    /// no longer holds it or never had it. Record 0 is the empty log's start: always term 0.
    pub fn term_of(&self, seq: u64, last_seq: u64) -> Option<u64> {
        if seq == 0 {
            return Some(0);
        }
        if seq < self.known_from || seq > last_seq {
            return None;
        }
        let i = self.starts.partition_point(|&(_, first)| first <= seq);
        Some(self.starts[i.checked_sub(1)?].0)
    }

    /// These terms from record `from` on, as a snapshot at `from` of term `term` sees them.
    pub fn after_snapshot(self, from: u64, term: u64, history: u64) -> Terms {
        if !self.starts.is_empty() && self.known_from <= from {
            return self;
        }
        let mut t = Terms::starting(from, term, history);
        for &(term, first) in self.starts.iter().filter(|s| s.1 > from) {
            t.note(term, first, 0);
        }
        if self.history != 0 {
            t.history = self.history;
        }
        t
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_has_the_term_of_the_turn_that_wrote_it() {
        let mut t = Terms::default();
        t.note(5, 1, 9);
        t.note(5, 4, 0);
        t.note(8, 10, 0);
        assert_eq!(t.history, 9);
        assert_eq!(t.term_of(0, 12), Some(0));
        assert_eq!(t.term_of(3, 12), Some(5));
        assert_eq!(t.term_of(9, 12), Some(5));
        assert_eq!(t.term_of(10, 12), Some(8));
        assert_eq!(t.term_of(13, 12), None, "beyond the log");
        assert_eq!(t.last_term(), 8);
    }

    #[test]
    fn a_snapshot_bounds_what_is_known_unless_older_turns_are_kept() {
        let mut seen = Terms::default();
        seen.note(8, 21, 0);
        let t = seen.clone().after_snapshot(20, 5, 9);
        assert_eq!(t.term_of(19, 30), None);
        assert_eq!(t.term_of(20, 30), Some(5));
        assert_eq!(t.term_of(21, 30), Some(8));
        assert_eq!(t.history, 9);
        let mut kept = Terms::default();
        kept.note(4, 11, 9);
        kept.note(5, 15, 0);
        let t = kept.clone().after_snapshot(20, 5, 9);
        assert_eq!(t, kept, "segments before the snapshot tell more");
    }
}
