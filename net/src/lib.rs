//! The tarq server library: the IPROTO codec, the event loop, sessions and parked takes.
