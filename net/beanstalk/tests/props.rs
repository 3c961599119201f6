//! The stable twin of the cargo-fuzz target in `net/beanstalk/fuzz`: the same entry point
//! (`tarq_beanstalk::decode_stream`, which never panics and re-encodes every command it
//! decodes) driven by proptest with random bytes, mutated valid commands and random
//! well-formed commands; and the chunking property: a stream fed in arbitrary pieces decodes
//! to the same steps as the stream fed whole. The committed fuzz corpus is replayed too.

use proptest::prelude::*;
use tarq_beanstalk::{decode_stream, Command, Decoded, Decoder, MAX_LINE};

/// Max job size for the chunking property: small, so oversized bodies are common.
const MAX_JOB: u32 = 64;

fn tube() -> impl Strategy<Value = String> {
    "[A-Za-z0-9+/;.$_()][A-Za-z0-9+/;.$_()-]{0,30}"
}

/// Any command, well-formed.
fn command() -> impl Strategy<Value = Raw> {
    (
        0u8..25,
        any::<u32>(),
        any::<u32>(),
        any::<u32>(),
        any::<u64>(),
        any::<i32>(),
        tube(),
        proptest::collection::vec(any::<u8>(), 0..80),
    )
}

/// The raw fields a command is built from.
type Raw = (u8, u32, u32, u32, u64, i32, String, Vec<u8>);

fn build(raw: &Raw) -> Command<'_> {
    let (k, a, b, c, id, s, t, body) = raw;
    let (a, b, c, id, s, t, body) = (*a, *b, *c, *id, *s, t.as_str(), body.as_slice());
    match *k {
        0 => Command::Put {
            pri: a,
            delay: b,
            ttr: c,
            body,
        },
        1 => Command::Use { tube: t },
        2 => Command::Reserve,
        3 => Command::ReserveWithTimeout { seconds: s },
        4 => Command::ReserveJob { id },
        5 => Command::Delete { id },
        6 => Command::Release {
            id,
            pri: a,
            delay: b,
        },
        7 => Command::Bury { id, pri: a },
        8 => Command::Touch { id },
        9 => Command::Watch { tube: t },
        10 => Command::Ignore { tube: t },
        11 => Command::Peek { id },
        12 => Command::PeekReady,
        13 => Command::PeekDelayed,
        14 => Command::PeekBuried,
        15 => Command::Kick { bound: a },
        16 => Command::KickJob { id },
        17 => Command::StatsJob { id },
        18 => Command::StatsTube { tube: t },
        19 => Command::Stats,
        20 => Command::ListTubes,
        21 => Command::ListTubeUsed,
        22 => Command::ListTubesWatched,
        23 => Command::PauseTube { tube: t, delay: a },
        _ => Command::Quit,
    }
}

/// A stream of well-formed commands, some with bodies over the max job size.
fn valid_stream() -> impl Strategy<Value = Vec<u8>> {
    proptest::collection::vec(command(), 1..12).prop_map(|cmds| {
        let mut out = Vec::new();
        for raw in &cmds {
            build(raw).encode(&mut out);
        }
        out
    })
}

fn corpus() -> Vec<Vec<u8>> {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/fuzz/corpus/decode_stream");
    let mut v: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| std::fs::read(e.unwrap().path()).unwrap())
        .collect();
    v.sort();
    assert!(v.len() >= 10, "the seed corpus is committed");
    v
}

/// Steps as owned strings, from feeding `data` in pieces cut at `cuts` into a buffer that
/// keeps the unconsumed tail, as a server's read buffer does.
fn decode_chunked(data: &[u8], cuts: &[usize]) -> Vec<String> {
    let mut decoder = Decoder::new(MAX_JOB);
    let mut buf = Vec::new();
    let mut steps = Vec::new();
    let mut fed = 0;
    let mut bounds: Vec<usize> = cuts.iter().map(|c| c % (data.len() + 1)).collect();
    bounds.push(data.len());
    bounds.sort();
    for end in bounds {
        buf.extend_from_slice(&data[fed..end.max(fed)]);
        fed = end.max(fed);
        while let Some((step, n)) = decoder.decode(&buf) {
            // `Discarded` pieces depend on the chunking; what they lead to does not.
            if !matches!(step, Decoded::Discarded) {
                steps.push(format!("{step:?}"));
            }
            buf.drain(..n);
        }
        assert!(buf.len() < decoder.max_request());
    }
    steps
}

fn mutate(mut data: Vec<u8>, edits: &[(prop::sample::Index, u8, u8)]) -> Vec<u8> {
    for (at, byte, op) in edits {
        if data.is_empty() {
            data.push(*byte);
            continue;
        }
        let i = at.index(data.len());
        match op {
            0 => data[i] = *byte,
            1 => data.insert(i, *byte),
            2 => data.insert(i, b"\r\n \0-+"[*byte as usize % 6]),
            _ => {
                data.remove(i);
            }
        }
    }
    data
}

#[test]
fn the_seed_corpus_decodes() {
    for bytes in corpus() {
        decode_stream(&bytes);
    }
}

#[test]
fn every_split_of_a_mixed_stream_decodes_the_same() {
    let mut data = Vec::new();
    for c in corpus() {
        data.extend(c);
    }
    data.truncate(4 * MAX_LINE);
    let whole = decode_chunked(&data, &[]);
    for cut in 0..=data.len() {
        assert_eq!(decode_chunked(&data, &[cut]), whole, "cut at {cut}");
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn random_bytes_never_panic(data in proptest::collection::vec(any::<u8>(), 0..600)) {
        decode_stream(&data);
    }

    #[test]
    fn mutated_commands_never_panic(
        data in valid_stream(),
        edits in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>(), 0u8..4), 1..8),
    ) {
        decode_stream(&mutate(data, &edits));
    }

    #[test]
    fn well_formed_commands_decode_to_themselves(cmd in command()) {
        let command = build(&cmd);
        let mut bytes = Vec::new();
        command.encode(&mut bytes);
        let mut decoder = Decoder::new(u32::MAX);
        prop_assert_eq!(decoder.decode(&bytes), Some((Decoded::Command(command), bytes.len())));
        prop_assert_eq!(command.kind().as_str().as_bytes(), &bytes[..command.kind().as_str().len()]);
    }

    #[test]
    fn chunking_does_not_change_the_steps(
        data in valid_stream(),
        edits in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>(), 0u8..4), 0..4),
        cuts in proptest::collection::vec(any::<usize>(), 0..12),
    ) {
        let data = mutate(data, &edits);
        prop_assert_eq!(decode_chunked(&data, &cuts), decode_chunked(&data, &[]));
    }
}
