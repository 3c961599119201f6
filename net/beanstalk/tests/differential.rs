//! Plays every byte script in `tests/scripts/` against a freshly spawned real beanstalkd and
//! compares the normalised transcript with the recording next to the script (`*.out`), line by
//! line. That proves the scripts, the player and the recordings right, so the same scripts can
//! judge tarq's beanstalk port (`net/tests/beanstalk_diff.rs`). `BEANSTALK_RECORD=1` rewrites
//! the recordings from beanstalkd instead; they are never edited by hand.

mod support;

use std::path::Path;

use support::script::{diff, play, play_each, scripts, Beanstalkd};

#[test]
fn every_script_replays_as_recorded_against_real_beanstalkd() {
    let record = std::env::var_os("BEANSTALK_RECORD").is_some_and(|v| v == "1");
    let paths = scripts(&Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/scripts"));
    let transcripts = play_each(&paths, |_, steps| {
        let Some(server) = Beanstalkd::spawn() else {
            panic!("beanstalkd is required but not installed (`bash .ci/test` installs it)");
        };
        play(&server.addr, steps)
    });
    let mut mismatches = Vec::new();
    for (path, got) in paths.iter().zip(transcripts) {
        let out = path.with_extension("out");
        if record {
            std::fs::write(&out, &got).unwrap();
            continue;
        }
        let want = std::fs::read_to_string(&out)
            .unwrap_or_else(|e| panic!("{}: {e} (record with BEANSTALK_RECORD=1)", out.display()));
        if got != want {
            mismatches.push(format!(
                "{} (- recorded, + now):\n{}",
                path.display(),
                diff(&want, &got)
            ));
        }
    }
    assert!(mismatches.is_empty(), "{}", mismatches.join("\n"));
}
