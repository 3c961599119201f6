//! Criterion benches of the IPROTO request decoder, on the frames the loadgen sends: the
//! tube API's `queue.tube.q:put([32-byte payload])`, `:take(0.5)` and `:ack(id)`, and the
//! seed API's `queue.put`, with syncs past 2^16 as a long run's are. The decoder reads every
//! request a client sends, so its instructions are a fixed share of every message's cost
//! (callgrind put it at a fifth of a tube-API message in 2026-11-29's profile).

use std::hint::black_box;

use criterion::{Criterion, Throughput};
use tarq_iproto::client;
use tarq_iproto::mp::write;
use tarq_iproto::request;

/// One frame's bytes after its length prefix, as the loop hands them to the decoder.
fn frame(sync: u64, function: &str, args: impl FnOnce(&mut Vec<u8>)) -> Vec<u8> {
    let mut out = Vec::new();
    client::call_with_head(&mut out, sync, &client::call_head(function), args);
    out.split_off(tarq_iproto::LEN_PREFIX)
}

fn frames() -> Vec<(&'static str, Vec<u8>)> {
    let payload = [b'x'; 32];
    vec![
        (
            "tube_put",
            frame(1_234_567, "queue.tube.q:put", |o| {
                write::array_len(o, 1);
                write::bin(o, &payload);
            }),
        ),
        (
            "tube_take",
            frame(1_234_568, "queue.tube.q:take", |o| {
                write::array_len(o, 1);
                write::f64(o, 0.5);
            }),
        ),
        (
            "tube_ack",
            frame(1_234_569, "queue.tube.q:ack", |o| {
                write::array_len(o, 1);
                write::uint(o, 987_654);
            }),
        ),
        (
            "seed_put",
            frame(70_000, "queue.put", |o| {
                write::array_len(o, 1);
                write::str(o, "0123456789abcdef0123456789abcdef");
            }),
        ),
    ]
}

fn bench_decode(c: &mut Criterion) {
    let mut g = c.benchmark_group("iproto_decode");
    g.throughput(Throughput::Elements(1));
    for (name, bytes) in frames() {
        assert!(request::decode(&bytes).is_ok(), "{name} decodes");
        g.bench_function(name, |b| {
            b.iter(|| request::decode(black_box(&bytes)).map(|r| r.sync))
        });
    }
    g.finish();
}

criterion::criterion_group!(benches, bench_decode);
criterion::criterion_main!(benches);
