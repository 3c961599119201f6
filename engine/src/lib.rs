//! The tarq queue engine: tasks in a slab arena, per-status skiplists, a deadline heap.
//! It does no I/O, reads no clock and starts no threads; `now` is always an argument.
