//! The tarq server library: the configuration ([`config`]), the
//! event loop with its sessions and parked takes ([`server`]), and durability ([`wal`]: WAL,
//! snapshots, recovery), and operating it ([`ops`]: stats, Graphite, Prometheus, signals, `tarq
//! ctl`). The `tarq` binary in `main.rs` only parses flags, sets up logging and
//! runs a [`server::Server`].

pub mod config;
pub mod fuzz;
pub mod ops;
pub mod server;
