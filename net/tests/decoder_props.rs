//! The stable twin of the cargo-fuzz target in `net/fuzz`: the same decoder entry point
//! (`tarq_net::fuzz::decode_stream`) driven by proptest with random bytes, mutated seed-corpus
//! entries and random well-formed calls, so it runs in CI on stable. The committed corpus is
//! replayed as regression input too.

use std::path::PathBuf;

use proptest::prelude::*;
use rmpv::Value;
use tarq_iproto::request::{self, RequestKind};
use tarq_iproto::{client, split_frame};
use tarq_net::fuzz::{decode_stream, Summary};

fn corpus() -> Vec<(String, Vec<u8>)> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("fuzz/corpus/decode_frames");
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| {
            let p = e.unwrap().path();
            let name = p.file_name().unwrap().to_string_lossy().into_owned();
            (name, std::fs::read(&p).unwrap())
        })
        .collect();
    files.sort();
    assert!(files.len() >= 20, "the seed corpus is committed");
    files
}

fn seed(name: &str) -> Vec<u8> {
    corpus().into_iter().find(|(n, _)| n == name).unwrap().1
}

#[test]
fn the_seed_corpus_decodes_as_expected() {
    for (_, bytes) in corpus() {
        decode_stream(&bytes); // never panics
    }
    let s = decode_stream(&seed("pipelined"));
    assert_eq!(
        s,
        Summary {
            frames: 4,
            requests: 4,
            calls: 3,
            framing_error: false
        }
    );
    assert!(decode_stream(&seed("huge_frame")).framing_error);
    assert!(decode_stream(&seed("bad_length_prefix")).framing_error);
    let s = decode_stream(&seed("deep_nesting"));
    assert_eq!((s.frames, s.requests), (1, 0), "over MAX_DEPTH: refused");
    let s = decode_stream(&seed("select_vspace_netbox26"));
    assert_eq!((s.frames, s.requests), (1, 1));
}

/// An arbitrary MessagePack value, nested a few levels.
fn value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Nil),
        any::<bool>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        any::<f64>().prop_map(Value::from),
        ".{0,40}".prop_map(Value::from),
        proptest::collection::vec(any::<u8>(), 0..40).prop_map(Value::from),
        (any::<i8>(), proptest::collection::vec(any::<u8>(), 0..20))
            .prop_map(|(t, d)| Value::Ext(t, d)),
    ];
    leaf.prop_recursive(6, 64, 8, |inner| {
        prop_oneof![
            proptest::collection::vec(inner.clone(), 0..8).prop_map(Value::Array),
            proptest::collection::vec((inner.clone(), inner), 0..8).prop_map(Value::Map),
        ]
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn random_bytes_never_panic(data in proptest::collection::vec(any::<u8>(), 0..512)) {
        decode_stream(&data);
    }

    #[test]
    fn mutated_seeds_never_panic(
        pick in any::<prop::sample::Index>(),
        edits in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>(), 0u8..3), 1..8),
    ) {
        let seeds = corpus();
        let mut data = seeds[pick.index(seeds.len())].1.clone();
        for (at, byte, op) in edits {
            if data.is_empty() { data.push(byte); continue; }
            let i = at.index(data.len());
            match op {
                0 => data[i] = byte,
                1 => data.insert(i, byte),
                _ => { data.truncate(i); }
            }
        }
        decode_stream(&data);
    }

    #[test]
    fn well_formed_calls_decode_with_their_args_verbatim(
        args in proptest::collection::vec(value(), 0..4),
        sync in any::<u64>(),
        name in "[a-z.]{1,20}",
    ) {
        let mut raw = Vec::new();
        rmpv::encode::write_value(&mut raw, &Value::Array(args)).unwrap();
        let mut out = Vec::new();
        client::call(&mut out, sync, &name, &raw);
        let f = split_frame(&out, usize::MAX).unwrap().unwrap();
        prop_assert_eq!(f.total(), out.len());
        let req = request::decode(&out[f.prefix..]).unwrap();
        prop_assert_eq!(req.sync, sync);
        prop_assert_eq!(req.kind, RequestKind::Call { function: &name, args: &raw, call16: false });
        let s = decode_stream(&out);
        prop_assert_eq!((s.frames, s.requests, s.calls), (1, 1, 1));
    }

    #[test]
    fn a_stream_cut_anywhere_waits_for_more(cut in 0usize..200) {
        let data = seed("pipelined");
        let cut = cut.min(data.len());
        let s = decode_stream(&data[..cut]);
        prop_assert!(!s.framing_error);
        prop_assert!(s.frames <= 4);
    }
}
