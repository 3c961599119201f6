//! cargo-fuzz target: any byte stream through the server's frame splitter, request decoder,
//! call-argument parser and the client's reply decoder (`tarq_net::fuzz::decode_stream`).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    tarq_net::fuzz::decode_stream(data);
});
