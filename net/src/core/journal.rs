//! Durability, held directly: the WAL (`tarq_wal::Wal`), or nothing (`--null`, and servers
//! tests run without a data directory's log). The loop runs each turn as read → execute (engine
//! events handed to [`Journal::record`] after every call) → [`Journal::commit`] → flush, and
//! holds each connection's replies of a turn until [`Journal::durable`] reaches that turn's
//! ticket; without a WAL every turn is durable the moment it commits. Replication reads and
//! writes the WAL itself ([`Journal::wal`]): a replica's stream is the log.

use std::sync::Arc;
use std::time::Duration;

use tarq_engine::{Event, Micros, Queue};
use tarq_ops::stats::WalFigures;
use tarq_wal::{Wal, WalMode};

/// Names one loop turn's batch of records. Tickets grow by one per commit, from 1.
pub type Ticket = u64;

/// Longest a graceful stop waits for the WAL (or, without one, the snapshot) to be on disk:
/// well under the 90 s a service manager gives a stop before it kills.
pub const SHUTDOWN_TIMEOUT: Duration = Duration::from_secs(60);

/// The WAL behind the core, or none.
pub struct Journal {
    wal: Option<Wal>,
    /// Without a WAL: the last turn's ticket (durable at once).
    ticket: Ticket,
    /// The queue the WAL recovered, taken once when the server is built.
    recovered: Option<Queue>,
}

impl Journal {
    /// No durability: every turn is durable the moment it commits.
    pub fn none() -> Journal {
        Journal {
            wal: None,
            ticket: 0,
            recovered: None,
        }
    }

    /// `wal` with the queue `Wal::open` recovered.
    pub fn wal_with(wal: Wal, recovered: Queue) -> Journal {
        Journal {
            wal: Some(wal),
            ticket: 0,
            recovered: Some(recovered),
        }
    }

    /// The WAL, for replication: a primary's relays read its files and tap; a replica applies
    /// and logs its primary's records through it. `None` without one.
    pub fn wal(&mut self) -> Option<&mut Wal> {
        self.wal.as_mut()
    }

    /// The recovered queue (empty without a WAL), taken once.
    pub fn recovered_queue(&mut self) -> Queue {
        self.recovered.take().unwrap_or_default()
    }

    /// Whether the engine must keep its event journal (`Queue::set_journal`): when false the
    /// loop never drains events and `record` is never called.
    #[inline]
    pub fn wants_events(&self) -> bool {
        self.wal.as_ref().is_some_and(|w| w.mode() != WalMode::None)
    }

    /// One engine event of the current turn, in order. `queue` is the state right after the
    /// call that produced it.
    #[inline]
    pub fn record(&mut self, queue: &Queue, event: Event) {
        if let Some(wal) = &mut self.wal {
            wal.record_event(queue, event);
        }
    }

    /// Once per turn, right after the poll and before any request runs: takes in a finished
    /// sync or snapshot.
    pub fn turn_start(&mut self, queue: &mut Queue, _now: Micros) {
        if let Some(wal) = &mut self.wal {
            wal.poll(queue);
        }
    }

    /// The turn's execution is over: starts making its records durable. Returns the turn's
    /// ticket; its replies are held until [`durable`](Self::durable) reaches it. Whatever the
    /// loop did not hand to `record` is still journaled in the queue.
    pub fn commit(&mut self, queue: &mut Queue, _now: Micros) -> Ticket {
        match &mut self.wal {
            Some(wal) => {
                wal.append_turn(queue);
                wal.submit()
            }
            None => {
                self.ticket += 1;
                self.ticket
            }
        }
    }

    /// The last record of the turn just committed, when the turn holds a change whose reply
    /// waits for durability (synchronous replication waits for replicas to pass it too).
    pub fn committed_change(&self) -> Option<u64> {
        self.wal.as_ref()?.submitted_change()
    }

    /// The newest ticket whose records are durable (every earlier one is too).
    pub fn durable(&mut self) -> Ticket {
        match &self.wal {
            Some(wal) => wal.durable_upto(),
            None => self.ticket,
        }
    }

    /// Whether turn `ticket`'s replies may go out although an earlier turn still waits (a turn
    /// of takes only while a put's sync runs or the disk is full). Beyond the prefix rule of
    /// [`durable`](Self::durable), which always holds.
    pub fn is_durable(&self, ticket: Ticket) -> bool {
        self.wal.as_ref().is_some_and(|w| w.is_durable(ticket))
    }

    /// How soon the loop must wake up for the WAL's sake (a group-commit timer), if ever.
    pub fn next_wakeup(&self) -> Option<Duration> {
        self.wal.as_ref()?.timeout()
    }

    /// Gives the WAL the loop's waker, for a sync finished on another thread.
    pub fn attach_waker(&mut self, waker: Arc<mio::Waker>) {
        if let Some(wal) = &mut self.wal {
            wal.set_waker(Arc::new(move || {
                if let Err(e) = waker.wake() {
                    tracing::warn!(error = %e, "waking the loop failed");
                }
            }));
        }
    }

    /// `queue.snapshot()`: `None` without a WAL (the call is then not defined), else what to
    /// report.
    pub fn snapshot(&mut self) -> Option<Result<String, String>> {
        let started = self.wal.as_mut()?.request_snapshot();
        Some(Ok(if started {
            "snapshot started".to_owned()
        } else {
            "a snapshot is already running".to_owned()
        }))
    }

    /// Before a change whose records take at most `bytes` (`core::disk_room`): `Err(message)`
    /// when it cannot be made durable now (no room on the disk, or a failing disk), and it is
    /// refused with that message before it touches the queue; otherwise the room for it is
    /// kept.
    #[inline]
    pub fn admit_change(&mut self, bytes: u64) -> Result<(), String> {
        match &mut self.wal {
            Some(wal) if !wal.fits(bytes) => change_refusal(wal, bytes),
            _ => Ok(()),
        }
    }

    /// Before a take: `Err(message)` only when even takes must be refused (the records a
    /// failing disk holds back piled up, or the take's record would take the room of a
    /// change in the same turn).
    #[inline]
    pub fn admit_take(&mut self) -> Result<(), String> {
        match &mut self.wal {
            Some(wal) if !(wal.take_fits() && wal.accepts_takes()) => take_refusal(wal),
            _ => Ok(()),
        }
    }

    /// Bytes of records logged and not durable yet: a debug build checks that a change logs
    /// no more than the room it reserved (`admit_change`).
    pub fn pending_bytes(&self) -> u64 {
        self.wal.as_ref().map_or(0, Wal::pending_bytes)
    }

    /// The WAL's figures for `queue.stats()`, Graphite and Prometheus; `None` without one.
    pub fn figures(&self) -> Option<WalFigures> {
        let wal = self.wal.as_ref().filter(|w| w.mode() != WalMode::None)?;
        let s = wal.stats();
        Some(WalFigures {
            records: s.records,
            bytes: s.bytes_written,
            disk_full: u64::from(s.disk_full),
            refusals: s.refusals,
            allocated_ahead: s.allocated_ahead,
        })
    }

    /// The server is stopping: writes and syncs everything recorded so far, then returns.
    /// Called once, after the last turn; an error is logged and the exit stays clean.
    pub fn shutdown(&mut self, queue: &mut Queue) -> Result<(), String> {
        match &mut self.wal {
            Some(wal) => wal
                .close(queue, SHUTDOWN_TIMEOUT)
                .map_err(|e| e.to_string()),
            None => Ok(()),
        }
    }
}

/// A change the fast check did not admit: the WAL makes room, or says why not.
#[cold]
fn change_refusal(wal: &mut Wal, bytes: u64) -> Result<(), String> {
    wal.reserve(bytes).map_err(|e| e.to_string())
}

/// A take the fast check did not admit: refused while the records a failing disk holds back
/// piled up, or when it would take a change's room.
#[cold]
fn take_refusal(wal: &mut Wal) -> Result<(), String> {
    if !wal.accepts_takes() {
        wal.check_writable().map_err(|e| e.to_string())?;
    }
    wal.reserve_take().map_err(|e| e.to_string())
}
