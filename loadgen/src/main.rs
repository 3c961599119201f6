//! `tarq-loadgen`: measures put→take→ack end to end against tarq and its peers.
fn main() {}
