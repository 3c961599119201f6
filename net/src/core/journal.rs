//! The seam between the event loop and durability. The loop runs each turn as
//! read → execute (engine events handed to [`Journal::record`] after every call) →
//! [`Journal::commit`] → flush, and holds each connection's replies of a turn until
//! [`Journal::durable`] reaches that turn's ticket. [`NoJournal`] (no WAL) makes every turn
//! durable at once; [`super::WalJournal`] puts the WAL crate (`tarq-wal`) behind the same
//! trait, with group commit, and wakes the loop through the [`mio::Waker`] it is given.

use std::sync::Arc;

use tarq_engine::{Event, Micros, Queue};

use tarq_ops::stats::WalFigures;

/// Names one loop turn's batch of records. Tickets grow by one per commit, from 1.
pub type Ticket = u64;

/// What the loop needs from durability.
pub trait Journal: Send {
    /// Whether the engine must keep its event journal (`Queue::set_journal`). When false the
    /// loop never drains events and `record` is never called.
    fn wants_events(&self) -> bool;

    /// One engine event of the current turn, in order. `queue` is the state right after the
    /// call that produced it (read a put task with `queue.get(id)`).
    fn record(&mut self, queue: &Queue, event: Event);

    /// Called once per turn right after the poll, before any request runs: the place to take
    /// in a finished sync or snapshot.
    fn turn_start(&mut self, _queue: &mut Queue, _now: Micros) {}

    /// The turn's execution is over: start making its records durable. Returns the turn's
    /// ticket; the replies of the turn are held until [`durable`](Self::durable) reaches it.
    /// A journal that prefers to read the engine's events in one go may drain
    /// `queue.drain_events()` here instead of taking them one by one in `record` (whatever the
    /// loop has not handed to `record` is still in the queue).
    fn commit(&mut self, queue: &mut Queue, now: Micros) -> Ticket;

    /// The last record of the turn just committed, when the turn holds a change whose reply
    /// waits for durability (synchronous replication waits for replicas to pass it too).
    fn committed_change(&self) -> Option<u64> {
        None
    }

    /// The newest ticket whose records are durable (every earlier one is too).
    fn durable(&mut self) -> Ticket;

    /// How soon the loop must wake up for the journal's sake (a group-commit timer), if ever.
    fn next_wakeup(&self) -> Option<std::time::Duration> {
        None
    }

    /// Gives the journal the loop's waker, for a sync finished on another thread.
    fn attach_waker(&mut self, _waker: Arc<mio::Waker>) {}

    /// The queue recovered from disk, taken once when the server is built (`None`: start
    /// with an empty queue).
    fn recovered_queue(&mut self) -> Option<Queue> {
        None
    }

    /// Whether turn `ticket`'s replies may go out although an earlier turn still waits (a turn
    /// of takes only while a put's sync runs or the disk is full). Beyond the prefix rule of
    /// [`durable`](Self::durable), which always holds.
    fn is_durable(&self, _ticket: Ticket) -> bool {
        false
    }

    /// Before a change whose records take at most `bytes` (`server::disk_room`):
    /// `Err(message)` when it cannot be made durable now (no room on the disk, or a failing
    /// disk), and it is refused with that message before it touches the queue; otherwise the
    /// room for it is kept.
    fn admit_change(&mut self, _bytes: u64) -> Result<(), String> {
        Ok(())
    }

    /// Before a take: `Err(message)` only when even takes must be refused (the records a
    /// failing disk holds back piled up, or the take's record would take the room of a
    /// change in the same turn).
    fn admit_take(&mut self) -> Result<(), String> {
        Ok(())
    }

    /// Bytes of records logged and not durable yet: a debug build checks that a change logs
    /// no more than the room it reserved (`admit_change`).
    fn pending_bytes(&self) -> u64 {
        0
    }

    /// `queue.snapshot()`: `None` when this journal has no snapshots (the call is then not
    /// defined), else the result to report or an error message.
    fn snapshot(&mut self, _queue: &Queue, _now: Micros) -> Option<Result<String, String>> {
        None
    }

    /// Whether the journal can log tube changes (tubes, buried tasks, task updates). A journal
    /// that wants events but cannot has the server refuse those changes with a clear error
    /// rather than lose them.
    fn logs_tubes(&self) -> bool {
        false
    }

    /// The WAL's figures for `queue.stats()`, Graphite and Prometheus; `None` without a WAL.
    fn figures(&self) -> Option<WalFigures> {
        None
    }

    /// The WAL behind this journal, for replication (a primary's relays read its files and
    /// tap; a replica applies and logs its primary's records through it); `None` without one.
    fn wal(&mut self) -> Option<&mut tarq_wal::Wal> {
        None
    }

    /// The server is stopping (SIGTERM/SIGINT): write and sync everything recorded so far, then
    /// return. Called once, after the last turn; an error is logged and the exit stays clean.
    fn shutdown(&mut self, _queue: &mut Queue) -> Result<(), String> {
        Ok(())
    }
}

/// No durability: every turn is durable the moment it commits.
#[derive(Debug, Default)]
pub struct NoJournal {
    ticket: Ticket,
}

impl Journal for NoJournal {
    fn wants_events(&self) -> bool {
        false
    }

    fn record(&mut self, _queue: &Queue, _event: Event) {}

    fn commit(&mut self, _queue: &mut Queue, _now: Micros) -> Ticket {
        self.ticket += 1;
        self.ticket
    }

    fn durable(&mut self) -> Ticket {
        self.ticket
    }
}
