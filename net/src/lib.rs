//! The tarq server library: the IPROTO codec ([`iproto`]), the event loop, sessions and parked
//! takes, and durability ([`wal`]: WAL, snapshots, recovery). The `tarq` binary in `main.rs`
//! only parses flags and starts the loop.

pub mod iproto;
pub mod wal;
