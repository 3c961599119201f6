//! The one adapter between the server and the WAL crate: `tarq_wal::Wal` behind the server's
//! `Journal` seam (`super::journal`): the loop hands over every
//! engine event, commits once per turn, and releases a turn's replies when `is_durable` says so.
//! The recovered queue is handed to the server once, when it is built.

use std::sync::Arc;
use std::time::Duration;

use tarq_engine::{Event, Micros, Queue};

use tarq_wal::{Wal, WalMode};

use crate::core::journal::{Journal, Ticket};
use tarq_ops::stats::WalFigures;

/// Longest a graceful stop waits for the WAL (or, without one, the snapshot) to be on disk:
/// well under the 90 s a service manager gives a stop before it kills.
pub const SHUTDOWN_TIMEOUT: Duration = Duration::from_secs(60);

pub struct WalJournal {
    wal: Wal,
    recovered: Option<Queue>,
}

impl WalJournal {
    /// `queue` is what `Wal::open` recovered.
    pub fn new(wal: Wal, queue: Queue) -> Self {
        Self {
            wal,
            recovered: Some(queue),
        }
    }
}

impl WalJournal {
    /// A change the fast check did not admit: the WAL makes room, or says why not.
    #[cold]
    fn change_refusal(&mut self, bytes: u64) -> Result<(), String> {
        self.wal.reserve(bytes).map_err(|e| e.to_string())
    }

    /// A take the fast check did not admit: refused while the records a failing disk holds
    /// back piled up, or when it would take a change's room.
    #[cold]
    fn take_refusal(&mut self) -> Result<(), String> {
        if !self.wal.accepts_takes() {
            self.wal.check_writable().map_err(|e| e.to_string())?;
        }
        self.wal.reserve_take().map_err(|e| e.to_string())
    }
}

impl Journal for WalJournal {
    fn wants_events(&self) -> bool {
        self.wal.mode() != WalMode::None
    }

    fn record(&mut self, queue: &Queue, event: Event) {
        self.wal.record_event(queue, event);
    }

    fn turn_start(&mut self, queue: &mut Queue, _now: Micros) {
        self.wal.poll(queue);
    }

    fn commit(&mut self, queue: &mut Queue, _now: Micros) -> Ticket {
        // Whatever the loop did not hand to `record` is still journaled in the queue.
        self.wal.append_turn(queue);
        self.wal.submit()
    }

    fn committed_change(&self) -> Option<u64> {
        self.wal.submitted_change()
    }

    fn durable(&mut self) -> Ticket {
        self.wal.durable_upto()
    }

    fn is_durable(&self, ticket: Ticket) -> bool {
        self.wal.is_durable(ticket)
    }

    fn next_wakeup(&self) -> Option<std::time::Duration> {
        self.wal.timeout()
    }

    fn attach_waker(&mut self, waker: Arc<mio::Waker>) {
        self.wal.set_waker(Arc::new(move || {
            if let Err(e) = waker.wake() {
                tracing::warn!(error = %e, "waking the loop failed");
            }
        }));
    }

    fn snapshot(&mut self, _queue: &Queue, _now: Micros) -> Option<Result<String, String>> {
        Some(Ok(if self.wal.request_snapshot() {
            "snapshot started".to_owned()
        } else {
            "a snapshot is already running".to_owned()
        }))
    }

    fn recovered_queue(&mut self) -> Option<Queue> {
        self.recovered.take()
    }

    /// The WAL's format (version 2) logs every tube event.
    fn logs_tubes(&self) -> bool {
        true
    }

    fn admit_change(&mut self, bytes: u64) -> Result<(), String> {
        if self.wal.fits(bytes) {
            return Ok(());
        }
        self.change_refusal(bytes)
    }

    fn admit_take(&mut self) -> Result<(), String> {
        if self.wal.take_fits() && self.wal.accepts_takes() {
            return Ok(());
        }
        self.take_refusal()
    }

    fn pending_bytes(&self) -> u64 {
        self.wal.pending_bytes()
    }

    fn figures(&self) -> Option<WalFigures> {
        if self.wal.mode() == WalMode::None {
            return None;
        }
        let s = self.wal.stats();
        Some(WalFigures {
            records: s.records,
            bytes: s.bytes_written,
            disk_full: u64::from(s.disk_full),
            refusals: s.refusals,
            allocated_ahead: s.allocated_ahead,
        })
    }

    fn wal(&mut self) -> Option<&mut Wal> {
        Some(&mut self.wal)
    }

    fn shutdown(&mut self, queue: &mut Queue) -> Result<(), String> {
        self.wal
            .close(queue, SHUTDOWN_TIMEOUT)
            .map_err(|e| e.to_string())
    }
}
