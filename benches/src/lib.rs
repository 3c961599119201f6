//! Shared helpers for the criterion benches under `benches/`: the `BTreeMap` baseline queue
//! the engine's skiplists are measured against (`baseline`), and the code that turns a bench
//! run into a dated JSON record under `results/` with the commit and the machine (`report`).
//! Benches of the engine's stalls and recovery first set the allocator as the server does
//! (`tarq_net::server::set_mmap_threshold`). `null_io` is the io_uring prototype of issue 40
//! (item 4): a null IPROTO server over an epoll or an io_uring loop, for `bin/null_io.rs` and
//! results/io-uring-2026-11-29/.

pub mod baseline;
pub mod null_io;
pub mod report;
