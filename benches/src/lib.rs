//! Shared helpers for the criterion benches under `benches/`: the `BTreeMap` baseline queue
//! the engine's skiplists are measured against (`baseline`), and the code that turns a bench
//! run into a dated JSON record under `results/` with the commit and the machine (`report`).
//! Benches of the engine's stalls and recovery first set the allocator as the server does
//! (`tarq_net::server::set_mmap_threshold`).

pub mod baseline;
pub mod report;
