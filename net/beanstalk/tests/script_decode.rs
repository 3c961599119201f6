//! Decodes each differential script's client bytes with this crate's [`Decoder`] and lines the
//! result up with real beanstalkd's recorded replies, connection by connection: every command
//! the decoder accepts got a non-error reply, every request it refuses got exactly the error
//! beanstalkd sent, `quit` got the connection closed, and nothing is left over on either side.

mod support;

use std::path::Path;

use support::script::{client_bytes, read_script, scripts};
use tarq_beanstalk::{Command, Decoded, Decoder, DEFAULT_MAX_JOB_SIZE};

/// The replies beanstalkd uses for a request it could not read.
const REFUSALS: [&str; 4] = [
    "BAD_FORMAT",
    "UNKNOWN_COMMAND",
    "EXPECTED_CRLF",
    "JOB_TOO_BIG",
];

/// Connection `c`'s reply words from a recording, in order, up to and including `eof`.
fn reply_words(recording: &str, c: u8) -> Vec<String> {
    let prefix = format!("{c}< ");
    recording
        .lines()
        .filter_map(|l| l.strip_prefix(&prefix))
        .filter(|r| !r.starts_with(' '))
        .map(|r| r.split(' ').next().unwrap().to_string())
        .collect()
}

fn check(name: &str, c: u8, bytes: &[u8], replies: &[String]) {
    let mut decoder = Decoder::new(DEFAULT_MAX_JOB_SIZE);
    let mut at = 0;
    let mut replies = replies.iter();
    while let Some((step, n)) = decoder.decode(&bytes[at..]) {
        at += n;
        let expected = match step {
            Decoded::Discarded => continue,
            Decoded::Error(e) => Some(e.reply()),
            Decoded::Command(_) => None,
        };
        let got = replies
            .next()
            .unwrap_or_else(|| panic!("{name} conn {c}: no reply for {step:?}"));
        match (step, expected) {
            (Decoded::Command(Command::Quit), _) => {
                assert_eq!(got, "eof", "{name} conn {c}: quit");
                return;
            }
            (_, Some(reply)) => {
                let mut word = Vec::new();
                reply.encode(&mut word);
                assert_eq!(
                    got.as_bytes(),
                    &word[..word.len() - 2],
                    "{name} conn {c}: {step:?}"
                );
            }
            _ => assert!(
                !REFUSALS.contains(&got.as_str()) && got != "eof",
                "{name} conn {c}: {step:?} was accepted, beanstalkd answered {got}"
            ),
        }
    }
    let rest: Vec<_> = replies.collect();
    assert_eq!(
        rest,
        ["eof"],
        "{name} conn {c}: replies beyond the decoded commands"
    );
}

#[test]
fn the_decoder_reads_every_script_as_beanstalkd_did() {
    for path in scripts(&Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/scripts")) {
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        let steps = read_script(&path);
        let recording = std::fs::read_to_string(path.with_extension("out"))
            .unwrap_or_else(|e| panic!("{name}: recording: {e}"));
        for (c, bytes) in client_bytes(&steps) {
            check(&name, c, &bytes, &reply_words(&recording, c));
        }
    }
}
