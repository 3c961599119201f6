//! The tarq server: the configuration ([`config`]); the core, where every command runs against
//! the queue, the WAL and the parked takes ([`core`]); the front-ends that translate each
//! protocol to and from it ([`frontend`]); the event loop with its connections, sessions and
//! replication ([`server`]); and `tarq ctl` with its console ([`ctl`]).
//! It sits on the crates below it: `tarq-engine` (the queue), `tarq-iproto` (the wire codec),
//! `tarq-wal` (durability), `tarq-ops` (stats, Graphite, Prometheus, signals, logging) and
//! `tarq-client` (the blocking client `tarq ctl` uses). The `tarq` binary in `main.rs` only
//! parses flags, sets up logging and runs a [`server::Server`].

pub mod config;
pub mod core;
pub mod ctl;
pub mod frontend;
pub mod fuzz;
pub mod server;
