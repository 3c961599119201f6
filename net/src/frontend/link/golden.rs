//! The link protocol's bytes, recorded: a sample of every [`Ask`], of the calls an
//! [`Ask::Run`] carries and of the answers, encoded as a link sends them and compared with
//! `golden.txt`, which names the [`LINK_VERSION`] they were recorded for. Nodes of one version
//! must understand each other, so a change to any of these bytes (a field added to an engine
//! type, a variant renamed) fails here until the version is raised and the bytes recorded
//! again (`TARQ_BLESS=1 cargo test -p tarq-net --lib golden`).

use std::fmt::Write as _;

use tarq_engine::{JobCounts, MovedTask, ReleaseOptions, Stats, Status, TaskRef, TubeNumbers};
use tarq_engine::{TubeOptions, TubePut, TubeType};

use super::call::{Api, Call};
use super::wire::{self, Ask, LINK_VERSION};
use crate::core::{Outcome, Refusal};

fn task() -> TaskRef<'static> {
    TaskRef {
        id: 0x0003_0000_0000_0007,
        status: Status::Taken,
        runat: 0,
        pri: 5,
        ttl: Some(60_000_000),
        ttr: None,
        created: 1_700_000_000_000_000,
        owner: Some(42),
        data: b"\xa5hello",
        tube: 3,
        deliveries: 1,
        utube: Some(b"k1"),
        counts: JobCounts::default(),
    }
}

fn asks() -> Vec<(&'static str, Ask<'static>)> {
    let run = |name, call| {
        let ask = Ask::Run {
            session: 9,
            origin: Some("a0"),
            call,
        };
        (name, ask)
    };
    let put = TubePut {
        delay: 0,
        ttl: Some(1),
        ttr: None,
        pri: Some(2),
        utube: b"u",
        dedup_key: Some(b"d"),
    };
    let moved = MovedTask {
        id: 7,
        status: Status::Ready,
        runat: 0,
        ttr_deadline: None,
        pri: 0,
        created: 11,
        ttl: None,
        ttr: Some(3),
        data: b"x".to_vec(),
        utube: None,
        deliveries: 0,
        counts: JobCounts::default(),
        owner: None,
    };
    vec![
        run(
            "run put_in",
            Call::PutIn {
                tube: 3,
                data: b"\xa1x",
                opts: put,
                wait: 5,
            },
        ),
        run(
            "run take",
            Call::Take {
                api: Api::Tube(3),
                timeout: Some(0),
            },
        ),
        run(
            "run release",
            Call::Release {
                api: Api::Seed,
                id: 8,
                opts: ReleaseOptions::default(),
            },
        ),
        run(
            "run pause",
            Call::Pause {
                tube: 3,
                left: 1_000,
                seconds: 1,
            },
        ),
        run(
            "run create_tube",
            Call::CreateTube {
                name: "jobs",
                kind: TubeType::FifoTtl,
                opts: TubeOptions::default(),
                if_not_exists: true,
                partitions: 4,
            },
        ),
        run(
            "run list_tasks",
            Call::ListTasks {
                tube: 3,
                status: Status::Buried,
                after: Some(2),
                limit: 50,
            },
        ),
        run("run watch", Call::Watch { tube: 3 }),
        (
            "end",
            Ask::End {
                session: 9,
                origin: None,
            },
        ),
        (
            "move_in",
            Ask::MoveIn {
                id: 1,
                index: 3,
                name: "jobs",
                kind: TubeType::Fifo,
                opts: TubeOptions::default(),
                numbers: TubeNumbers::default(),
                to: "b",
            },
        ),
        (
            "move_tasks",
            Ask::MoveTasks {
                id: 1,
                index: 3,
                tasks: vec![moved],
                holders: vec![Some((Some("a1".to_owned()), 4))],
                dedup: Vec::new(),
                gone: vec![6],
                again: false,
                numbers: None,
                read_at: 12,
            },
        ),
        (
            "move_done",
            Ask::MoveDone {
                id: 1,
                index: 3,
                committed: true,
                epoch: 17,
            },
        ),
        ("moves", Ask::Moves),
        ("unwatch", Ask::Unwatch { sync: 5 }),
        ("waiting", Ask::Waiting { tube: 3, count: 2 }),
        ("drop_off", Ask::DropOff { index: 3 }),
    ]
}

fn outcomes() -> Vec<(&'static str, Outcome<'static>)> {
    vec![
        ("task", Outcome::Task(task())),
        ("done_id", Outcome::DoneId { id: 7, number: 1 }),
        ("nothing", Outcome::Nothing),
        ("ready", Outcome::Ready(3)),
        ("count", Outcome::Count(12)),
        ("ok", Outcome::Ok),
        ("tube_stats", Outcome::TubeStats(Stats::default())),
        ("error", Outcome::Error(Refusal::Consumers)),
        ("tasks", Outcome::Tasks(Vec::new())),
    ]
}

/// Every sample as `name hex` lines, under the version they belong to.
fn record() -> String {
    let mut out = format!("link protocol version {LINK_VERSION}\n");
    for (name, ask) in asks() {
        let mut bytes = Vec::new();
        wire::write_ask(&mut bytes, 1, &ask);
        writeln!(out, "ask {name} {}", tarq_cluster::hex::encode(&bytes)).unwrap();
    }
    for (name, outcome) in outcomes() {
        let mut bytes = Vec::new();
        wire::write_answer(&mut bytes, 1, &outcome);
        writeln!(out, "answer {name} {}", tarq_cluster::hex::encode(&bytes)).unwrap();
    }
    out
}

#[test]
fn the_link_protocol_is_what_its_version_says() {
    let path =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src/frontend/link/golden.txt");
    let now = record();
    if std::env::var_os("TARQ_BLESS").is_some() {
        std::fs::write(&path, &now).unwrap();
        return;
    }
    let was = std::fs::read_to_string(&path).unwrap_or_default();
    let version_line = was.lines().next().unwrap_or("");
    assert_eq!(
        version_line,
        format!("link protocol version {LINK_VERSION}"),
        "golden.txt was recorded for another version: record it again (TARQ_BLESS=1)"
    );
    let changed: Vec<String> = (now.lines().zip(was.lines()))
        .filter(|(a, b)| a != b)
        .map(|(a, _)| a.split(' ').take(2).collect::<Vec<_>>().join(" "))
        .collect();
    assert!(
        changed.is_empty() && now.lines().count() == was.lines().count(),
        "the link protocol's bytes changed ({changed:?}) while LINK_VERSION stayed \
         {LINK_VERSION}: nodes of one version would not understand each other. Raise \
         LINK_VERSION in frontend/link/wire.rs, then record the bytes again (TARQ_BLESS=1)"
    );
}
