//! Room for tasks to come, made ready away from the loop.
//!
//! A task's slot and record land in memory the engine allocates in chunks (3 MiB of slots,
//! 4 MiB of records), and the first write to each page of a fresh chunk is a page fault: the
//! kernel finds, zeroes and maps a page. On the VMs tarq is measured on that costs ~4 µs a
//! page, and loading a snapshot of 10M tasks touches ~900 MB of slots and records: about a
//! third of the loop thread's load time went to faults, while the snapshot's reading thread
//! waited for it. A [`Room`] is such memory, allocated and faulted in by whichever thread
//! makes it (a snapshot load's reading thread, in the time it would wait), then handed to the
//! queue ([`crate::Queue::add_room`]), whose next inserts fill it without a fault.
//!
//! Safe by construction: the memory is owned, made on one thread and moved to the other; no
//! thread touches the queue's memory but its own.

use crate::arena::{Arena, Chunk};
use crate::slots::{faulted_record_chunk, record_bytes, Slot, RECORD_CHUNK_BYTES};

/// Which kinds of room a queue's next inserts would use ([`crate::Queue::room_wanted`]):
/// `slots` when no slot chunk made ready waits past the one in use, `records` when no record
/// chunk does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RoomWanted {
    pub slots: bool,
    pub records: bool,
}

/// Memory for tasks to come: slot and record chunks, their pages already faulted in.
#[derive(Default)]
pub struct Room {
    pub(crate) slots: Vec<Chunk<Slot>>,
    pub(crate) records: Vec<Box<[u8]>>,
}

impl std::fmt::Debug for Room {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Room")
            .field("slot_chunks", &self.slots.len())
            .field("record_chunks", &self.records.len())
            .finish()
    }
}

impl Room {
    /// Tasks one slot chunk holds.
    pub const SLOTS: usize = Arena::<Slot>::CHUNK_ENTRIES;
    /// Record bytes one record chunk holds.
    pub const RECORD_BYTES: usize = RECORD_CHUNK_BYTES;

    /// One chunk of slots: room for [`Room::SLOTS`] tasks.
    pub fn slots() -> Room {
        Room {
            slots: vec![Arena::<Slot>::faulted_chunk()],
            records: Vec::new(),
        }
    }

    /// One chunk of records: [`Room::RECORD_BYTES`] bytes.
    pub fn records() -> Room {
        Room {
            slots: Vec::new(),
            records: vec![faulted_record_chunk()],
        }
    }

    /// The record bytes a task with a payload of `len` bytes takes (the put time, and the
    /// payload itself when it is small).
    pub fn record_bytes(payload_len: usize) -> usize {
        record_bytes(payload_len)
    }
}
