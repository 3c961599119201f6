//! Shared helpers for the criterion benches under `benches/`: the `BTreeMap` baseline queue
//! the engine's skiplists are measured against (`baseline`), and the code that turns a bench
//! run into a dated JSON record under `results/` with the commit and the machine (`report`),
//! and the allocator setting the server runs with (`allocator_as_in_the_server`).

pub mod baseline;
pub mod report;

/// Sets glibc's allocator as `tarq` does at start (`tarq_net::server::MMAP_THRESHOLD_BYTES`):
/// blocks from 1 MiB up are their own fresh mappings. Without it glibc raises its threshold as
/// big blocks are freed, and later big blocks (a 4 MiB record chunk, a grown table) may come
/// from the heap instead, zeroed or copied where the server maps them fresh: a bench of the
/// engine's stalls and recovery must allocate as the server does. Call first in `main`.
pub fn allocator_as_in_the_server() {
    // SAFETY: mallopt only sets an allocator parameter; called before any other thread runs.
    unsafe {
        libc::mallopt(
            libc::M_MMAP_THRESHOLD,
            tarq_net::server::MMAP_THRESHOLD_BYTES as libc::c_int,
        );
    }
}
