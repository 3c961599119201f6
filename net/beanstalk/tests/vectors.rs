//! Protocol vectors as data: `check(input, expected)` decodes `input` as one connection's
//! stream and compares a one-line rendering of every step with `expected`. The renderings
//! name the command and its arguments, or the error reply, or `discard N` for thrown-away
//! bytes, and end with `rest N` for bytes left waiting. Replies are checked the same way by
//! `reply(...)`: encoded bytes, and decoded back.

use tarq_beanstalk::{
    ok_yaml, write_list, CpuTime, Decoded, Decoder, JobState, Reply, Stats, StatsJob, StatsTube,
};

/// Max job size for the vectors: small, so `JOB_TOO_BIG` is cheap to reach.
const MAX_JOB: u32 = 10;

fn check(input: &[u8], expected: &[&str]) {
    let mut decoder = Decoder::new(MAX_JOB);
    let mut got = Vec::new();
    let mut at = 0;
    while let Some((step, n)) = decoder.decode(&input[at..]) {
        got.push(match step {
            Decoded::Command(c) => format!("{c:?}"),
            Decoded::Error(e) => String::from_utf8_lossy(&encoded(e.reply()))
                .trim_end()
                .to_string(),
            Decoded::Discarded => format!("discard {n}"),
        });
        at += n;
    }
    if at < input.len() {
        got.push(format!("rest {}", input.len() - at));
    }
    assert_eq!(
        got,
        expected,
        "input {:?}",
        input.escape_ascii().to_string()
    );
}

fn encoded(r: Reply<'_>) -> Vec<u8> {
    let mut out = Vec::new();
    r.encode(&mut out);
    out
}

#[test]
fn every_command() {
    check(
        b"put 1 2 3 4\r\nbody\r\n",
        &[r#"Put { pri: 1, delay: 2, ttr: 3, body: [98, 111, 100, 121] }"#],
    );
    check(b"use a-b\r\n", &[r#"Use { tube: "a-b" }"#]);
    check(b"reserve\r\n", &["Reserve"]);
    check(
        b"reserve-with-timeout 7\r\n",
        &["ReserveWithTimeout { seconds: 7 }"],
    );
    check(b"reserve-job 9\r\n", &["ReserveJob { id: 9 }"]);
    check(
        b"delete 18446744073709551615\r\n",
        &["Delete { id: 18446744073709551615 }"],
    );
    check(
        b"release 1 2 3\r\n",
        &["Release { id: 1, pri: 2, delay: 3 }"],
    );
    check(b"bury 1 2\r\n", &["Bury { id: 1, pri: 2 }"]);
    check(b"touch 5\r\n", &["Touch { id: 5 }"]);
    check(b"watch w\r\n", &[r#"Watch { tube: "w" }"#]);
    check(b"ignore w\r\n", &[r#"Ignore { tube: "w" }"#]);
    check(b"peek 3\r\n", &["Peek { id: 3 }"]);
    check(b"peek-ready\r\n", &["PeekReady"]);
    check(b"peek-delayed\r\n", &["PeekDelayed"]);
    check(b"peek-buried\r\n", &["PeekBuried"]);
    check(b"kick 10\r\n", &["Kick { bound: 10 }"]);
    check(b"kick-job 4\r\n", &["KickJob { id: 4 }"]);
    check(b"stats-job 4\r\n", &["StatsJob { id: 4 }"]);
    check(b"stats-tube t\r\n", &[r#"StatsTube { tube: "t" }"#]);
    check(b"stats\r\n", &["Stats"]);
    check(b"list-tubes\r\n", &["ListTubes"]);
    check(b"list-tube-used\r\n", &["ListTubeUsed"]);
    check(b"list-tubes-watched\r\n", &["ListTubesWatched"]);
    check(
        b"pause-tube t 60\r\n",
        &[r#"PauseTube { tube: "t", delay: 60 }"#],
    );
    check(b"quit\r\n", &["Quit"]);
}

#[test]
fn incomplete_input_waits() {
    check(b"", &[]);
    check(b"reserve\r", &["rest 8"]);
    check(b"put 1 2 3 4\r\nbod", &["rest 16"]);
    check(b"put 1 2 3 4\r\nbody\r", &["rest 18"]);
    // a lone CR keeps the line open until 224 bytes
    check(b"use a\rb\r\n", &["rest 9"]);
}

#[test]
fn put_numbers_follow_beanstalkd() {
    check(
        b"put  0  0  0  1\r\nx\r\n",
        &["Put { pri: 0, delay: 0, ttr: 0, body: [120] }"],
    );
    check(
        b"put 4294967295 4294967295 4294967295 0\r\n\r\n",
        &["Put { pri: 4294967295, delay: 4294967295, ttr: 4294967295, body: [] }"],
    );
    // refused lines leave the body to be read as commands
    check(b"put +1 0 0 1\r\nx\r\n", &["BAD_FORMAT", "UNKNOWN_COMMAND"]);
    check(b"put -1 0 0 1\r\nx\r\n", &["BAD_FORMAT", "UNKNOWN_COMMAND"]);
    check(
        b"put 4294967296 0 0 1\r\nx\r\n",
        &["BAD_FORMAT", "UNKNOWN_COMMAND"],
    );
    check(b"put 0 0 0 1 \r\nx\r\n", &["BAD_FORMAT", "UNKNOWN_COMMAND"]);
    check(b"put 0 0 0\r\n", &["BAD_FORMAT"]);
    check(b"put\r\n", &["UNKNOWN_COMMAND"]);
    check(b"put\t0 0 0 1\r\n", &["UNKNOWN_COMMAND"]);
}

#[test]
fn bodies_too_big_or_unterminated() {
    check(
        b"put 0 0 0 10\r\n0123456789\r\n",
        &["Put { pri: 0, delay: 0, ttr: 0, body: [48, 49, 50, 51, 52, 53, 54, 55, 56, 57] }"],
    );
    check(
        b"put 0 0 0 11\r\n01234567890\r\nstats\r\n",
        &["JOB_TOO_BIG", "Stats"],
    );
    check(
        b"put 0 0 0 11 junk\r\n01234567890\r\nstats\r\n",
        &["JOB_TOO_BIG", "Stats"],
    );
    // the reply waits for the whole body and its CRLF to be thrown away
    check(b"put 0 0 0 11\r\n0123", &["discard 18"]);
    check(
        b"put 0 0 0 3\r\nabcde\r\n",
        &["EXPECTED_CRLF", "UNKNOWN_COMMAND"],
    );
    check(b"put 0 0 0 3\r\nabc\n\r", &["EXPECTED_CRLF"]);
}

#[test]
fn line_length_and_line_ends() {
    let line = |n: usize| [vec![b'x'; n], b"\r\nstats\r\n".to_vec()].concat();
    check(&line(222), &["UNKNOWN_COMMAND", "Stats"]);
    // 223 bytes: the CR is the 224th, its LF falls in the discarded block, so the next
    // line end (after `stats`) ends the discard
    check(&line(223), &["discard 224", "BAD_FORMAT"]);
    check(&line(300), &["discard 224", "BAD_FORMAT", "Stats"]);
    let mut lone_cr = b"use a\rb\r\n".to_vec();
    lone_cr.extend(vec![b'y'; 250]);
    lone_cr.extend(b"\r\nstats\r\n");
    check(&lone_cr, &["discard 224", "BAD_FORMAT", "Stats"]);
    check(b"stats\nstats\r\n", &["BAD_FORMAT"]);
    check(b"\r\n", &["UNKNOWN_COMMAND"]);
    check(b"use a\0b\r\n", &["BAD_FORMAT"]);
}

#[test]
fn prefixes_follow_which_cmd() {
    check(b"reservex\r\n", &["BAD_FORMAT"]);
    check(b"reserve-with-timeout\r\n", &["BAD_FORMAT"]);
    check(b"stats-job\r\n", &["BAD_FORMAT"]);
    check(b"quitter\r\n", &["Quit"]);
    check(b"USE x\r\n", &["UNKNOWN_COMMAND"]);
    check(b"use\r\n", &["UNKNOWN_COMMAND"]);
    check(b"kick\r\n", &["UNKNOWN_COMMAND"]);
    check(
        b"pause-tubefoo 1\r\n",
        &[r#"PauseTube { tube: "foo", delay: 1 }"#],
    );
}

#[test]
fn loose_and_strict_arguments() {
    check(
        b"reserve-with-timeout abc\r\n",
        &["ReserveWithTimeout { seconds: 0 }"],
    );
    check(
        b"reserve-with-timeout -1\r\n",
        &["ReserveWithTimeout { seconds: -1 }"],
    );
    check(
        b"reserve-with-timeout 4294967296\r\n",
        &["ReserveWithTimeout { seconds: 0 }"],
    );
    check(
        b"reserve-with-timeout 99999999999999999999\r\n",
        &["BAD_FORMAT"],
    );
    check(b"kick -1\r\n", &["Kick { bound: 4294967295 }"]);
    check(b"kick 5abc\r\n", &["Kick { bound: 5 }"]);
    check(b"kick abc\r\n", &["BAD_FORMAT"]);
    check(b"delete +1\r\n", &["BAD_FORMAT"]);
    check(b"delete 1 \r\n", &["BAD_FORMAT"]);
    check(b"delete 18446744073709551616\r\n", &["BAD_FORMAT"]);
    check(b"release 1 2\r\n", &["BAD_FORMAT"]);
    check(b"bury 1\r\n", &["BAD_FORMAT"]);
    check(b"pause-tube t\r\n", &["BAD_FORMAT"]);
    check(b"pause-tube -t 1\r\n", &["BAD_FORMAT"]);
    check(b"pause-tube t 1 \r\n", &["BAD_FORMAT"]);
}

#[test]
fn tube_names() {
    let name = "a".repeat(200);
    check(
        format!("use {name}\r\n").as_bytes(),
        &[&format!("Use {{ tube: {name:?} }}")],
    );
    check(format!("use a{name}\r\n").as_bytes(), &["BAD_FORMAT"]);
    check(b"use -a\r\n", &["BAD_FORMAT"]);
    check(b"use  a\r\n", &["BAD_FORMAT"]);
    check(b"use a \r\n", &["BAD_FORMAT"]);
    check(b"watch a*b\r\n", &["BAD_FORMAT"]);
    check(b"stats-tube \r\n", &["BAD_FORMAT"]);
    check(
        b"ignore A-Z_0+9/;.$()\r\n",
        &[r#"Ignore { tube: "A-Z_0+9/;.$()" }"#],
    );
}

fn reply(r: Reply<'_>, wire: &[u8]) {
    assert_eq!(encoded(r), wire, "{r:?}");
    assert_eq!(Reply::decode(wire, 1 << 20), Ok(Some((r, wire.len()))));
}

#[test]
fn every_reply() {
    reply(Reply::Inserted { id: 7 }, b"INSERTED 7\r\n");
    reply(Reply::BuriedId { id: 7 }, b"BURIED 7\r\n");
    reply(Reply::Using { tube: "t" }, b"USING t\r\n");
    reply(
        Reply::Reserved {
            id: 1,
            body: b"a\r\nb",
        },
        b"RESERVED 1 4\r\na\r\nb\r\n",
    );
    reply(Reply::Found { id: 2, body: b"" }, b"FOUND 2 0\r\n\r\n");
    reply(Reply::Watching { count: 3 }, b"WATCHING 3\r\n");
    reply(Reply::KickedCount { count: 0 }, b"KICKED 0\r\n");
    reply(
        Reply::Ok {
            yaml: b"---\n- default\n",
        },
        b"OK 14\r\n---\n- default\n\r\n",
    );
    for (r, w) in [
        (Reply::DeadlineSoon, "DEADLINE_SOON"),
        (Reply::TimedOut, "TIMED_OUT"),
        (Reply::Deleted, "DELETED"),
        (Reply::Released, "RELEASED"),
        (Reply::Buried, "BURIED"),
        (Reply::Touched, "TOUCHED"),
        (Reply::NotIgnored, "NOT_IGNORED"),
        (Reply::Kicked, "KICKED"),
        (Reply::Paused, "PAUSED"),
        (Reply::NotFound, "NOT_FOUND"),
        (Reply::Draining, "DRAINING"),
        (Reply::OutOfMemory, "OUT_OF_MEMORY"),
        (Reply::InternalError, "INTERNAL_ERROR"),
        (Reply::BadFormat, "BAD_FORMAT"),
        (Reply::UnknownCommand, "UNKNOWN_COMMAND"),
        (Reply::ExpectedCrlf, "EXPECTED_CRLF"),
        (Reply::JobTooBig, "JOB_TOO_BIG"),
    ] {
        reply(r, format!("{w}\r\n").as_bytes());
    }
    assert_eq!(Reply::decode(b"RESERVED 1 4\r\nab", 100), Ok(None));
    assert!(Reply::decode(b"RESERVED 1 4\r\nabcdXX", 100).is_err());
    assert!(Reply::decode(b"WHAT\r\n", 100).is_err());
}

/// The YAML bodies, byte for byte as beanstalkd 1.12 writes them (taken from a real server).
#[test]
fn yaml_bodies() {
    let mut out = Vec::new();
    ok_yaml(&mut out, |b| write_list(b, ["default", "a"]));
    assert_eq!(out, b"OK 18\r\n---\n- default\n- a\n\r\n");

    let job = StatsJob {
        id: 1,
        tube: "default",
        state: JobState::Ready,
        pri: 0,
        age: 16,
        delay: 0,
        ttr: 1,
        time_left: 0,
        file: 0,
        reserves: 3,
        timeouts: 0,
        releases: 0,
        buries: 0,
        kicks: 0,
    };
    let mut out = Vec::new();
    ok_yaml(&mut out, |b| job.write_yaml(b));
    assert_eq!(
        out,
        &b"OK 144\r\n---\nid: 1\ntube: default\nstate: ready\npri: 0\nage: 16\ndelay: 0\nttr: 1\n\
           time-left: 0\nfile: 0\nreserves: 3\ntimeouts: 0\nreleases: 0\nburies: 0\nkicks: 0\n\r\n"
            [..]
    );

    let tube = StatsTube {
        name: "default",
        current_jobs_urgent: 4,
        current_jobs_ready: 5,
        current_jobs_reserved: 0,
        current_jobs_delayed: 0,
        current_jobs_buried: 0,
        total_jobs: 5,
        current_using: 1,
        current_watching: 1,
        current_waiting: 0,
        cmd_delete: 0,
        cmd_pause_tube: 0,
        pause: 0,
        pause_time_left: 0,
    };
    let mut body = Vec::new();
    tube.write_yaml(&mut body);
    assert_eq!(
        body,
        &b"---\nname: default\ncurrent-jobs-urgent: 4\ncurrent-jobs-ready: 5\n\
           current-jobs-reserved: 0\ncurrent-jobs-delayed: 0\ncurrent-jobs-buried: 0\n\
           total-jobs: 5\ncurrent-using: 1\ncurrent-watching: 1\ncurrent-waiting: 0\n\
           cmd-delete: 0\ncmd-pause-tube: 0\npause: 0\npause-time-left: 0\n"[..]
    );
}

/// `stats` against the key list and format of the recorded real-beanstalkd body.
#[test]
fn stats_body_has_beanstalkds_keys_in_order() {
    let extra = [("tarq-wal-mode", "fsync".to_string())];
    let stats = Stats {
        pid: 14885,
        version: "1.12",
        max_job_size: 65535,
        binlog_max_size: 10485760,
        rusage_utime: CpuTime {
            secs: 0,
            micros: 6198,
        },
        id: "01e2f8da43af945c",
        hostname: "vm",
        os: "#1 SMP PREEMPT_DYNAMIC @0",
        platform: "x86_64",
        extra: &extra,
        ..Stats::default()
    };
    let mut body = Vec::new();
    stats.write_yaml(&mut body);
    let text = String::from_utf8(body).unwrap();
    let recorded = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/scripts/stats.out"
    ))
    .unwrap();
    let want: Vec<&str> = recorded
        .lines()
        .skip_while(|l| *l != "0< OK")
        .skip(2)
        .take_while(|l| l.starts_with("0<   "))
        .map(|l| l["0<   ".len()..].split(':').next().unwrap())
        .collect();
    let got: Vec<&str> = text
        .lines()
        .skip(1)
        .map(|l| l.split(':').next().unwrap())
        .collect();
    assert_eq!(got[..want.len()], want[..]);
    assert_eq!(got[want.len()..], ["tarq-wal-mode"]);
    assert!(
        text.contains("\nversion: \"1.12\"\nrusage-utime: 0.006198\n"),
        "{text}"
    );
    assert!(text.contains(
        "\ndraining: false\nid: 01e2f8da43af945c\nhostname: vm\nos: #1 SMP PREEMPT_DYNAMIC @0\n"
    ));
}
