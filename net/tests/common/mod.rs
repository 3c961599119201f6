//! The durability tests' name for the shared harness: everything here is `tests/support`'s
//! (the other end-to-end tests use `mod support;` directly).
#![allow(unused_imports)]

#[path = "../support/mod.rs"]
mod support;

pub use support::*;
