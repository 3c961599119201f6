//! The decoder entry point shared by the cargo-fuzz target (`net/fuzz`) and the stable property
//! test (`net/tests/decoder_props.rs`): feed it any bytes, it must never panic, loop forever,
//! recurse or allocate more than the input justifies.

use crate::frontend::iproto::calls;
use tarq_iproto::{client, request, split_frame};

/// Frame cap used while fuzzing: small, so size-limit paths are reached.
pub const FUZZ_MAX_FRAME: usize = 64 * 1024;

/// What one pass over a byte stream found, for the property test's own checks.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Summary {
    pub frames: usize,
    pub requests: usize,
    pub calls: usize,
    pub framing_error: bool,
}

/// Splits `data` into frames as the server does and runs every decoder on each: the request
/// decoder, the queue-call argument parser for each function the server serves, and the
/// client's reply decoder.
pub fn decode_stream(data: &[u8]) -> Summary {
    let mut s = Summary::default();
    let mut rest = data;
    loop {
        match split_frame(rest, FUZZ_MAX_FRAME) {
            Ok(Some(f)) => {
                assert!(f.total() <= rest.len() && f.len <= FUZZ_MAX_FRAME);
                let frame = &rest[f.prefix..f.total()];
                s.frames += 1;
                if let Ok(req) = request::decode(frame) {
                    s.requests += 1;
                    if let request::RequestKind::Call { args, .. } = req.kind {
                        s.calls += 1;
                        for function in [calls::PUT, calls::TAKE, calls::ACK, calls::RELEASE] {
                            let _ = calls::parse(function, args);
                        }
                    }
                }
                if let Ok(r) = client::decode(frame) {
                    if let Some(d) = r.data {
                        let _ = client::task_id(d);
                    }
                }
                rest = &rest[f.total()..];
            }
            Ok(None) => return s,
            Err(_) => {
                s.framing_error = true;
                return s;
            }
        }
    }
}
