//! cargo-fuzz target: any byte stream through the beanstalk command decoder, with every
//! decoded command re-encoded and decoded again (`tarq_beanstalk::decode_stream`).
//! Run: `cd net/beanstalk/fuzz && cargo +nightly fuzz run decode_stream corpus/decode_stream`.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    tarq_beanstalk::decode_stream(data);
});
