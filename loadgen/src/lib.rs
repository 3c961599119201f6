//! `tarq-loadgen` as a library, so its tests reach the parts: protocol drivers (`proto`), the
//! single-threaded pipelining load loop (`runner`), latency statistics (`stats`), reports and
//! plots (`report`, `plot`), starting targets (`target`), one command-line run (`single`) and
//! the comparison matrix (`suite`). The binary in `main.rs` is only the command line.
//!
//! The loadgen talks to tarq through the wire only: it depends on `tarq-net` for the IPROTO
//! codec, never on the engine.

pub mod payload;
pub mod plot;
pub mod proto;
pub mod report;
pub mod restart;
pub mod runner;
pub mod single;
pub mod stats;
pub mod suite;
pub mod target;
pub mod tls;
