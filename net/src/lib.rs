//! The tarq server: the configuration ([`config`]), the event loop with its sessions, parked
//! takes and the seam to durability ([`server`]), and `tarq ctl` with its console ([`ctl`]).
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
