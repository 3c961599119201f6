//! `tarq`: the task-queue broker binary.
fn main() {}
