//! A primary's side of the log: what a replica that connects is sent before the live stream.
//! [`Cursor`] reads the retained WAL segments from a replica's position on, record by record,
//! a bounded number of bytes per call (the loop calls it once per turn while the replica's
//! socket has room), until it reaches what the log has written; from there the server streams
//! the WAL's tap. [`join_source`] opens the newest snapshot for a replica whose position is no
//! longer retained (or that has none).
//!
//! Only reads: the files are the WAL's. A file removed while it is read stays readable (the
//! descriptor is open); a segment removed before the cursor reaches it is `NotRetained`, and
//! the replica joins again.

use std::io::Read;
use std::sync::Arc;

use super::format::{self, Frame, FILE_HEADER_LEN, SNAP_SUFFIX, WAL_SUFFIX};
use super::storage::Storage;

/// Bytes asked of the file per read: a few records of a busy turn at once.
const READ_CHUNK: usize = 64 * 1024;

/// Why a relay cannot go on.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RelayError {
    /// The WAL after the position was removed (a snapshot covers it): join from a snapshot.
    #[error("the primary no longer has the WAL after record {after}: join from a snapshot")]
    NotRetained { after: u64 },
    /// The replica has records the primary never wrote: another history. Join again.
    #[error(
        "the replica has record {after}, the primary's log ends at {last}: join from a snapshot"
    )]
    Ahead { after: u64, last: u64 },
    #[error("reading the WAL for a replica: {0}")]
    Io(String),
}

impl RelayError {
    /// Whether the replica must join from a snapshot (rather than retry the same position).
    pub fn needs_join(&self) -> bool {
        !matches!(self, RelayError::Io(_))
    }
}

/// What a replica joins from: the newest snapshot (its file, opened) at position `start_seq`,
/// or, when the primary has none and its whole log is retained, nothing at position 0.
pub struct JoinSource {
    pub start_seq: u64,
    pub snapshot: Option<Box<dyn Read + Send>>,
}

fn names(storage: &dyn Storage, suffix: &str) -> Result<Vec<(u64, String)>, RelayError> {
    let all = storage
        .list()
        .map_err(|e| RelayError::Io(format!("listing the data directory: {e}")))?;
    let mut out: Vec<(u64, String)> = all
        .into_iter()
        .filter_map(|n| Some((format::parse_name(&n, suffix)?, n)))
        .collect();
    out.sort_unstable();
    Ok(out)
}

/// The snapshot a joining replica gets: the newest one.
pub fn join_source(storage: &dyn Storage) -> Result<JoinSource, RelayError> {
    match names(storage, SNAP_SUFFIX)?.pop() {
        Some((start_seq, name)) => {
            let reader = storage
                .open_read(&name)
                .map_err(|e| RelayError::Io(format!("opening {name}: {e}")))?;
            Ok(JoinSource {
                start_seq,
                snapshot: Some(reader),
            })
        }
        None => Ok(JoinSource {
            start_seq: 0,
            snapshot: None,
        }),
    }
}

/// Reads the retained WAL after a position, whole records in sequence order.
pub struct Cursor {
    storage: Arc<dyn Storage>,
    /// The segment being read: its first sequence number and its reader.
    seg: Option<(u64, Box<dyn Read + Send>)>,
    /// Bytes read from the segment, `pending[pos..]` not yet consumed.
    pending: Vec<u8>,
    pos: usize,
    /// The next record to hand out.
    next: u64,
}

impl Cursor {
    /// A cursor after record `after`, the log having written up to `written`.
    pub fn new(storage: Arc<dyn Storage>, after: u64, written: u64) -> Result<Cursor, RelayError> {
        if after > written {
            return Err(RelayError::Ahead {
                after,
                last: written,
            });
        }
        let mut c = Cursor {
            storage,
            seg: None,
            pending: Vec::new(),
            pos: 0,
            next: after + 1,
        };
        if after < written {
            c.open_segment()?;
        }
        Ok(c)
    }

    /// The last record handed out (the replica's position once it has them).
    pub fn position(&self) -> u64 {
        self.next - 1
    }

    /// Bytes read from the files and not handed out yet (for the lag figures).
    pub fn buffered(&self) -> usize {
        self.pending.len() - self.pos
    }

    /// Opens the segment holding record `next`: the newest whose first record is at or
    /// before it (a segment rewritten after a failed write supersedes the older one's tail).
    /// Returns false when that is the one being read already.
    fn open_segment(&mut self) -> Result<bool, RelayError> {
        let segs = names(&*self.storage, WAL_SUFFIX)?;
        let Some((first, name)) = segs.into_iter().rev().find(|(s, _)| *s <= self.next) else {
            return Err(RelayError::NotRetained {
                after: self.next - 1,
            });
        };
        if self.seg.as_ref().is_some_and(|(s, _)| *s == first) {
            return Ok(false);
        }
        let mut r = self
            .storage
            .open_read(&name)
            .map_err(|e| RelayError::Io(format!("opening {name}: {e}")))?;
        let mut header = [0u8; FILE_HEADER_LEN];
        r.read_exact(&mut header)
            .map_err(|e| RelayError::Io(format!("reading {name}'s header: {e}")))?;
        match format::parse_file_header(&header, format::WAL_MAGIC) {
            Ok(h) if h.version == format::FORMAT_VERSION && h.seq == first => {}
            // An older format's records would be misread by the replica: it joins instead.
            Ok(_) | Err(format::HeaderError::Version(_)) => {
                return Err(RelayError::NotRetained {
                    after: self.next - 1,
                })
            }
            Err(format::HeaderError::Damaged(e)) => {
                return Err(RelayError::Io(format!("{name}: {e}")))
            }
        }
        self.seg = Some((first, r));
        self.pending.clear();
        self.pos = 0;
        Ok(true)
    }

    /// Appends whole records after the position to `out`, up to record `upto` (what the log
    /// has written) and about `max` bytes. Returns whether it reached `upto`.
    pub fn read(&mut self, out: &mut Vec<u8>, max: usize, upto: u64) -> Result<bool, RelayError> {
        let limit = out.len() + max;
        while self.next <= upto && out.len() < limit {
            let got = format::parse_record(&self.pending, self.pos);
            match got {
                Ok(rec) => {
                    let (seq, end) = (rec.seq, rec.end);
                    if seq > self.next {
                        // The rest of this file was superseded, or records are missing.
                        if !self.open_segment()? {
                            return Err(RelayError::NotRetained {
                                after: self.next - 1,
                            });
                        }
                        continue;
                    }
                    if seq == self.next {
                        out.extend_from_slice(&self.pending[self.pos..end]);
                        self.next += 1;
                    }
                    self.pos = end;
                }
                Err(Frame::Incomplete) => {
                    if !self.fill()? && !self.open_segment()? {
                        // Written (the log says so) yet in no file: it was removed.
                        return Err(RelayError::NotRetained {
                            after: self.next - 1,
                        });
                    }
                }
                Err(Frame::Bad(why)) => {
                    // A failed write's abandoned tail: the next segment rewrote it.
                    if !self.open_segment()? {
                        return Err(RelayError::Io(format!(
                            "damaged WAL before record {}: {why}",
                            self.next
                        )));
                    }
                }
            }
        }
        if self.pos > READ_CHUNK && self.pos * 2 > self.pending.len() {
            self.pending.drain(..self.pos);
            self.pos = 0;
        }
        Ok(self.next > upto)
    }

    /// Reads the next chunk of the segment; false at its end.
    fn fill(&mut self) -> Result<bool, RelayError> {
        let Some((_, r)) = &mut self.seg else {
            return Ok(false);
        };
        if self.pos > 0 {
            self.pending.drain(..self.pos);
            self.pos = 0;
        }
        let len = self.pending.len();
        self.pending.resize(len + READ_CHUNK, 0);
        let n = loop {
            match r.read(&mut self.pending[len..]) {
                Ok(n) => break n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => {
                    self.pending.truncate(len);
                    return Err(RelayError::Io(format!("reading a WAL segment: {e}")));
                }
            }
        };
        self.pending.truncate(len + n);
        Ok(n > 0)
    }
}
