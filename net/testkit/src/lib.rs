//! Helpers shared by tests and benches of several crates. [`Counting`] is the one counting
//! global allocator: it forwards every call to the system allocator and keeps two tallies —
//! bytes live across the whole process (what a data structure costs), and allocations made on
//! threads that opted in with [`track_this_thread`] (what a hot path allocates while other
//! threads, such as a test's client, run beside it). A binary installs it with
//! `#[global_allocator] static GLOBAL: Counting = Counting;`.
//!
//! Beside it: [`reference`], where the originals tarq is compared against are found and what
//! a test does without them, and [`ports`], the ports a spawned server really listens on.

pub mod ports;
pub mod reference;

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

/// The counting allocator.
pub struct Counting;

thread_local! {
    /// Set on threads whose allocations [`tracked_allocs`] and [`tracked_bytes`] count.
    static TRACKED: Cell<bool> = const { Cell::new(false) };
}

/// Bytes currently allocated, as requested (malloc's own per-block header is the allocator's,
/// not the caller's, so it is not counted).
static LIVE: AtomicUsize = AtomicUsize::new(0);
/// Allocations and reallocations (which may move) on tracked threads.
static ALLOCS: AtomicU64 = AtomicU64::new(0);
/// Bytes asked for by those allocations (a reallocation counts its new size).
static BYTES: AtomicU64 = AtomicU64::new(0);

/// Counts the calling thread's allocations from now on.
pub fn track_this_thread() {
    TRACKED.set(true);
}

/// Bytes currently allocated by the whole process.
pub fn live_bytes() -> usize {
    LIVE.load(Ordering::Relaxed)
}

/// Allocations made so far on tracked threads.
pub fn tracked_allocs() -> u64 {
    ALLOCS.load(Ordering::Relaxed)
}

/// Bytes asked for so far by allocations on tracked threads.
pub fn tracked_bytes() -> u64 {
    BYTES.load(Ordering::Relaxed)
}

fn count(bytes: usize) {
    // `try_with`: a thread being torn down has no thread-locals left and is not tracked.
    if TRACKED.try_with(Cell::get).unwrap_or(false) {
        ALLOCS.fetch_add(1, Ordering::Relaxed);
        BYTES.fetch_add(bytes as u64, Ordering::Relaxed);
    }
}

// SAFETY: forwards every call to the system allocator unchanged; only counts sizes.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        count(layout.size());
        LIVE.fetch_add(layout.size(), Ordering::Relaxed);
        // SAFETY: the caller keeps `GlobalAlloc::alloc`'s contract, which is System's.
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        count(layout.size());
        LIVE.fetch_add(layout.size(), Ordering::Relaxed);
        // SAFETY: as for `alloc`.
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        count(new_size);
        LIVE.fetch_add(new_size, Ordering::Relaxed);
        LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
        // SAFETY: `ptr` and `layout` come from this allocator, which is System underneath.
        unsafe { System.realloc(ptr, layout, new_size) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
        // SAFETY: as for `realloc`.
        unsafe { System.dealloc(ptr, layout) }
    }
}
