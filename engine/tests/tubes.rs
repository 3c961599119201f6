//! Unit tests of the tube API: every error it returns, and each type's behaviour — ordering,
//! priorities, delays, TTL, TTR, touch, utube exclusivity, bury / kick, capacity,
//! max_deliveries, dedup windows, drop and truncate, `default` under the tube API, how a tube
//! numbers its tasks (from 0, never twice, ids kept from an older format), and the drop of a
//! tube made on demand once it is empty (`drop_if_unneeded`).
//! `check_invariants()` runs after every call that changes the queue.

use tarq_engine::{
    id_number, task_id, Event, Hold, Micros, PutOptions, PutOutcome, Queue, QueueError,
    ReleaseOptions, RestoredTask, Status, TaskId, TubeIx, TubeNumbers, TubeOptions, TubePut,
    TubeType, MAX_TASKS, MAX_TASK_NUMBER, MAX_TUBES, MAX_TUBE_NAME_BYTES, MAX_UTUBE_KEY_BYTES,
};

const T0: Micros = 1_000_000;
const S: u64 = 1;

fn tube(q: &mut Queue, name: &str, kind: TubeType, opts: TubeOptions) -> TubeIx {
    let t = q.create_tube(name, kind, opts).unwrap();
    q.check_invariants();
    t
}

fn put(q: &mut Queue, t: TubeIx, p: TubePut<'_>) -> TaskId {
    let id = match q.put_in(T0, t, Box::new([0x90]), p).unwrap() {
        PutOutcome::Created(r) => r.id,
        other => panic!("a new task, got {other:?}"),
    };
    q.check_invariants();
    id
}

fn take(q: &mut Queue, t: TubeIx, now: Micros) -> Option<TaskId> {
    let id = q.take_from(now, t, S).unwrap().map(|r| r.id);
    q.check_invariants();
    id
}

fn utube(key: &[u8]) -> TubePut<'_> {
    TubePut {
        utube: key,
        ..TubePut::default()
    }
}

/// Session `caller` does not hold task `id`, for the reason `hold`.
fn not_held(id: TaskId, caller: u64, hold: Hold) -> QueueError {
    QueueError::NotHeld { id, caller, hold }
}

#[test]
fn tube_calls_say_what_they_refused() {
    let mut q = Queue::new();
    let f = tube(&mut q, "q", TubeType::Fifo, TubeOptions::default());
    let no_task = not_held(99, S, Hold::NoTask);
    let not_in_f = QueueError::NotInTube { id: 99, tube: f };
    let cases: Vec<(QueueError, QueueError)> = vec![
        (
            TubeType::parse("lifo").unwrap_err(),
            QueueError::UnknownTubeType("lifo".into()),
        ),
        (
            q.create_tube("q", TubeType::Fifo, TubeOptions::default())
                .unwrap_err(),
            QueueError::TubeExists("q".into()),
        ),
        (q.ack_in(f, S, 99).unwrap_err(), no_task.clone()),
        (
            q.release_in(T0, f, S, 99, ReleaseOptions::default())
                .unwrap_err(),
            no_task.clone(),
        ),
        (q.peek(f, 99).unwrap_err(), not_in_f.clone()),
        (q.bury(f, 99).unwrap_err(), not_in_f.clone()),
        (q.delete(f, 99).unwrap_err(), not_in_f),
        // Ownership is checked before the type, as in the original.
        (q.touch(f, S, 99, Some(5)).unwrap_err(), no_task),
        (
            q.drop_tube(0).unwrap_err(),
            QueueError::DefaultTubeUndroppable,
        ),
        (q.kick(9, 1).unwrap_err(), QueueError::TubeNotFound(9)),
        (
            q.create_tube("", TubeType::Fifo, TubeOptions::default())
                .unwrap_err(),
            QueueError::BadTubeName {
                len: 0,
                max: MAX_TUBE_NAME_BYTES,
            },
        ),
    ];
    for (got, want) in cases {
        assert_eq!(got, want);
    }
    let id = put(&mut q, f, TubePut::default());
    take(&mut q, f, T0);
    assert_eq!(
        q.touch(f, S, id, Some(5)).unwrap_err(),
        QueueError::TouchUnsupported(TubeType::Fifo)
    );
    let long = "n".repeat(MAX_TUBE_NAME_BYTES + 1);
    assert_eq!(
        q.create_tube(&long, TubeType::Fifo, TubeOptions::default()),
        Err(QueueError::BadTubeName {
            len: MAX_TUBE_NAME_BYTES + 1,
            max: MAX_TUBE_NAME_BYTES
        })
    );
}

#[test]
fn a_task_is_not_taken_by_another_session_or_in_another_tube() {
    let mut q = Queue::new();
    let a = tube(&mut q, "a", TubeType::FifoTtl, TubeOptions::default());
    let b = tube(&mut q, "b", TubeType::FifoTtl, TubeOptions::default());
    let id = put(&mut q, a, TubePut::default());
    assert_eq!(take(&mut q, a, T0), Some(id));
    assert_eq!(q.ack_in(a, 2, id), Err(not_held(id, 2, Hold::TakenBy(S))));
    assert_eq!(q.ack_in(b, S, id), Err(not_held(id, S, Hold::NoTask)));
    assert_eq!(
        q.peek(b, id).unwrap_err(),
        QueueError::NotInTube { id, tube: b }
    );
    // The tube API names a task as its caller gave it: a number of the tube, or a whole id
    // of another tube.
    assert_eq!((q.task_number(b, id), q.task_number(a, id)), (id, 0));
    let missing = q.task_id_in(a, 9);
    assert_eq!(
        q.peek(a, missing).unwrap_err(),
        QueueError::NotInTube {
            id: missing,
            tube: a
        }
    );
    assert_eq!(q.task_number(a, missing), 9);
    // The seed API sees only `default`.
    assert_eq!(q.ack(S, id), Err(not_held(id, S, Hold::NoTask)));
    assert_eq!(q.ack_in(a, S, id).unwrap().id, id);
    q.check_invariants();
}

#[test]
fn limits_on_tubes_and_utube_keys() {
    let mut q = Queue::new();
    for i in 1..MAX_TUBES {
        q.create_tube(&format!("t{i}"), TubeType::Fifo, TubeOptions::default())
            .unwrap();
    }
    assert_eq!(
        q.create_tube("one-more", TubeType::Fifo, TubeOptions::default()),
        Err(QueueError::TooManyTubes { max: MAX_TUBES })
    );
    // A dropped tube's index is reused.
    let t5 = q.tube_ix("t5").unwrap();
    q.drop_tube(t5).unwrap();
    let u = q
        .create_tube("u", TubeType::Utube, TubeOptions::default())
        .unwrap();
    assert_eq!(u, t5);
    let key = vec![b'k'; MAX_UTUBE_KEY_BYTES + 1];
    let err = q.put_in(T0, u, Box::new([0x90]), utube(&key)).unwrap_err();
    assert_eq!(
        err,
        QueueError::UtubeKeyTooLong {
            len: 257,
            max: MAX_UTUBE_KEY_BYTES
        }
    );
    q.check_invariants();
}

#[test]
fn fifo_ignores_pri_delay_and_ttl_and_keeps_id_order() {
    let mut q = Queue::new();
    let f = tube(&mut q, "f", TubeType::Fifo, TubeOptions::default());
    let p = TubePut {
        pri: Some(-5),
        delay: 10,
        ttl: Some(1),
        ..TubePut::default()
    };
    let a = put(&mut q, f, TubePut::default());
    let b = put(&mut q, f, p);
    let t = q.peek(f, b).unwrap();
    assert_eq!(
        (t.status, t.pri, t.ttl, t.ttr),
        (Status::Ready, 0, None, None)
    );
    assert_eq!(q.advance(T0 + 1_000, 100).processed, 0);
    assert_eq!(take(&mut q, f, T0), Some(a));
    assert_eq!(take(&mut q, f, T0), Some(b));
}

#[test]
fn fifottl_applies_tube_defaults_and_extends_ttl_by_delay() {
    let mut q = Queue::new();
    let opts = TubeOptions {
        ttl: Some(100),
        pri: 3,
        ..TubeOptions::default()
    };
    let t = tube(&mut q, "t", TubeType::FifoTtl, opts);
    // The tube's ttr defaults to its ttl, as in the original.
    assert_eq!(q.tube_info(t).unwrap().opts.ttr, Some(100));
    let a = put(&mut q, t, TubePut::default());
    let b = put(
        &mut q,
        t,
        TubePut {
            pri: Some(1),
            delay: 50,
            ..TubePut::default()
        },
    );
    let ta = q.peek(t, a).unwrap();
    assert_eq!((ta.pri, ta.ttl, ta.ttr), (3, Some(100), Some(100)));
    let tb = q.peek(t, b).unwrap();
    assert_eq!(
        (tb.status, tb.runat, tb.ttl),
        (Status::Waiting, T0 + 50, Some(150))
    );
    q.advance(T0 + 50, 10);
    // b has the lower pri once ready.
    assert_eq!(take(&mut q, t, T0 + 50), Some(b));
    let s = q.tube_stats(t).unwrap();
    assert_eq!((s.promoted, s.takes, s.ready, s.taken), (1, 1, 1, 1));
    // a expires at 100, b's TTR returns it at 150, then its TTL ends it at 150 too.
    q.advance(T0 + 100, 10);
    assert!(q.peek(t, a).is_err());
    q.advance(T0 + 150, 10);
    assert!(q.peek(t, b).is_err());
    assert_eq!(q.tube_stats(t).unwrap().expired, 2);
    q.check_invariants();
}

#[test]
fn touch_extends_ttl_ttr_and_the_pending_return() {
    let mut q = Queue::new();
    let opts = TubeOptions {
        ttl: Some(100),
        ttr: Some(10),
        ..TubeOptions::default()
    };
    let t = tube(&mut q, "t", TubeType::UtubeTtl, opts);
    let id = put(&mut q, t, utube(b"x"));
    take(&mut q, t, T0);
    let r = q.touch(t, S, id, Some(30)).unwrap();
    assert_eq!((r.ttl, r.ttr), (Some(130), Some(40)));
    q.check_invariants();
    assert_eq!(q.advance(T0 + 39, 10).processed, 0);
    assert_eq!(q.advance(T0 + 40, 10).processed, 1);
    assert_eq!(q.peek(t, id).unwrap().status, Status::Ready);
    take(&mut q, t, T0 + 40);
    let r = q.touch(t, S, id, None).unwrap();
    assert_eq!((r.ttl, r.ttr), (None, None));
    assert_eq!(q.advance(T0 + 10_000, 10).processed, 0);
    // Two successful touches, each counted twice (the call, then its success), as the
    // original counts them.
    assert_eq!(q.tube_stats(t).unwrap().touches, 4);
    assert_eq!(
        q.touch(t, 2, id, Some(1)),
        Err(not_held(id, 2, Hold::TakenBy(S)))
    );
}

#[test]
fn utube_takes_one_task_per_key_in_order() {
    let mut q = Queue::new();
    let u = tube(&mut q, "u", TubeType::Utube, TubeOptions::default());
    let a1 = put(&mut q, u, utube(b"a"));
    let a2 = put(&mut q, u, utube(b"a"));
    let b1 = put(&mut q, u, utube(b"b"));
    assert_eq!(q.peek(u, a1).unwrap().utube, Some(&b"a"[..]));
    assert_eq!(take(&mut q, u, T0), Some(a1));
    // a2 waits behind a1; b1 is next.
    assert_eq!(take(&mut q, u, T0), Some(b1));
    assert_eq!(take(&mut q, u, T0), None);
    assert!(!q.can_take(u));
    assert_eq!(q.tube_stats(u).unwrap().ready, 1);
    q.release_in(T0, u, S, a1, ReleaseOptions::default())
        .unwrap();
    q.check_invariants();
    assert_eq!(take(&mut q, u, T0), Some(a1));
    q.ack_in(u, S, a1).unwrap();
    q.check_invariants();
    assert_eq!(take(&mut q, u, T0), Some(a2));
    // A buried or deleted taken task frees its utube too.
    let a3 = put(&mut q, u, utube(b"a"));
    q.bury(u, a2).unwrap();
    assert_eq!(take(&mut q, u, T0), Some(a3));
    q.delete(u, a3).unwrap();
    q.check_invariants();
    assert_eq!(q.kick(u, 5), Ok(1));
    assert_eq!(take(&mut q, u, T0), Some(a2));
}

#[test]
fn utubettl_orders_by_pri_inside_and_across_utubes() {
    let mut q = Queue::new();
    let u = tube(&mut q, "u", TubeType::UtubeTtl, TubeOptions::default());
    let pri = |key, p| TubePut {
        utube: key,
        pri: Some(p),
        ..TubePut::default()
    };
    let a = put(&mut q, u, pri(b"a", 5));
    let b = put(&mut q, u, pri(b"b", 3));
    let a_urgent = put(&mut q, u, pri(b"a", 1));
    assert_eq!(take(&mut q, u, T0), Some(a_urgent));
    assert_eq!(take(&mut q, u, T0), Some(b));
    assert_eq!(take(&mut q, u, T0), None);
    q.ack_in(u, S, a_urgent).unwrap();
    assert_eq!(take(&mut q, u, T0), Some(a));
}

#[test]
fn bury_takes_any_status_and_kick_goes_in_pri_id_order() {
    let mut q = Queue::new();
    let t = tube(&mut q, "t", TubeType::FifoTtl, TubeOptions::default());
    let a = put(
        &mut q,
        t,
        TubePut {
            pri: Some(2),
            ..TubePut::default()
        },
    );
    let b = put(
        &mut q,
        t,
        TubePut {
            pri: Some(1),
            ..TubePut::default()
        },
    );
    let c = put(
        &mut q,
        t,
        TubePut {
            delay: 9,
            ..TubePut::default()
        },
    );
    assert_eq!(take(&mut q, t, T0), Some(b));
    for id in [a, b, c] {
        assert_eq!(q.bury(t, id).unwrap().status, Status::Buried);
        q.check_invariants();
    }
    // Burying a buried task changes and counts nothing.
    q.bury(t, a).unwrap();
    let s = q.tube_stats(t).unwrap();
    assert_eq!((s.buried, s.buries, s.taken, s.waiting), (3, 3, 0, 0));
    assert_eq!(q.kick(t, 2), Ok(2));
    assert_eq!(q.peek(t, c).unwrap().status, Status::Ready);
    assert_eq!(q.peek(t, b).unwrap().status, Status::Ready);
    assert_eq!(q.peek(t, a).unwrap().status, Status::Buried);
    assert_eq!(q.kick(t, 10), Ok(1));
    assert_eq!(q.tube_stats(t).unwrap().kicks, 3);
}

#[test]
fn limfifottl_refuses_a_put_at_capacity() {
    let mut q = Queue::new();
    let opts = TubeOptions {
        capacity: 2,
        ..TubeOptions::default()
    };
    let t = tube(&mut q, "lim", TubeType::LimFifoTtl, opts);
    let a = put(&mut q, t, TubePut::default());
    put(&mut q, t, TubePut::default());
    take(&mut q, t, T0);
    let err = q
        .put_in(T0, t, Box::new([0x90]), TubePut::default())
        .unwrap_err();
    assert_eq!(
        err,
        QueueError::TubeFull {
            name: "lim".into(),
            capacity: 2
        }
    );
    q.ack_in(t, S, a).unwrap();
    put(&mut q, t, TubePut::default());
}

/// Past its task limit a queue refuses puts (seed and tube calls alike) instead of panicking,
/// names the limit, counts no put and journals nothing; a dedup hit, which adds no task, and
/// a restore still go through; an ack makes room again.
#[test]
fn the_task_limit_refuses_puts_and_names_itself() {
    let mut q = Queue::new();
    assert_eq!(
        q.max_tasks(),
        MAX_TASKS,
        "the default is what the index can address"
    );
    q.set_max_tasks(usize::MAX);
    assert_eq!(q.max_tasks(), MAX_TASKS, "never above it");
    q.set_max_tasks(3);
    q.set_journal(true);
    let opts = TubeOptions {
        dedup_window: 60_000_000,
        ..TubeOptions::default()
    };
    let t = tube(&mut q, "t", TubeType::FifoTtl, opts);
    let keyed = |key: &'static [u8]| TubePut {
        dedup_key: Some(key),
        ..TubePut::default()
    };
    let first = put(&mut q, t, keyed(b"a"));
    q.put(T0, Box::new([0x90]), PutOptions::default());
    put(&mut q, t, TubePut::default());
    q.drain_events();
    let full = QueueError::TooManyTasks { max: 3 };
    assert_eq!(
        q.put_in(T0, t, Box::new([0x90]), TubePut::default())
            .unwrap_err(),
        full
    );
    assert_eq!(
        q.try_put(T0, Box::new([0x90]), PutOptions::default())
            .unwrap_err(),
        full
    );
    assert_eq!(full, QueueError::TooManyTasks { max: 3 });
    assert_eq!(full.to_string(), "the queue holds 3 tasks, its limit");
    q.check_invariants();
    assert_eq!(q.drain_events().count(), 0, "a refused put changes nothing");
    assert_eq!(
        q.tube_stats(t).unwrap().puts,
        2,
        "refused puts are not counted"
    );
    // A dedup hit returns the task it has: no new task, so no refusal.
    assert!(matches!(
        q.put_in(T0, t, Box::new([0x90]), keyed(b"a")),
        Ok(PutOutcome::Duplicate(r)) if r.id == first
    ));
    // A restore replays what was accepted once, whatever the limit is now.
    q.restore_in(t, restored(task_id(t, 40)), None, 0).unwrap();
    q.check_invariants();
    q.set_max_tasks(4);
    assert_eq!(
        q.try_put(T0, Box::new([0x90]), PutOptions::default())
            .unwrap_err(),
        QueueError::TooManyTasks { max: 4 },
        "a limit below the tasks held refuses until they drop below it"
    );
    assert_eq!(take(&mut q, t, T0), Some(first));
    q.ack_in(t, S, first).unwrap();
    q.check_invariants();
    assert_eq!(q.len(), 3);
    q.try_put(T0, Box::new([0x90]), PutOptions::default())
        .unwrap();
    q.check_invariants();
}

#[test]
fn max_deliveries_buries_instead_of_returning() {
    let mut q = Queue::new();
    q.set_journal(true);
    let opts = TubeOptions {
        ttr: Some(10),
        max_deliveries: 2,
        ..TubeOptions::default()
    };
    let t = tube(&mut q, "t", TubeType::FifoTtl, opts);
    let id = put(&mut q, t, TubePut::default());
    take(&mut q, t, T0);
    q.release_in(T0, t, S, id, ReleaseOptions::default())
        .unwrap();
    assert_eq!(take(&mut q, t, T0), Some(id));
    assert_eq!(q.peek(t, id).unwrap().deliveries, 2);
    // The TTR returns it a second time: buried.
    q.advance(T0 + 10, 10);
    q.check_invariants();
    assert_eq!(q.peek(t, id).unwrap().status, Status::Buried);
    let s = q.tube_stats(t).unwrap();
    assert_eq!((s.dead_lettered, s.ttr_returned, s.releases), (1, 1, 1));
    assert!(q.drain_events().any(|e| e == Event::DeadLettered { id }));
    // A session closing with the task is the same.
    q.kick(t, 1).unwrap();
    take(&mut q, t, T0 + 10);
    q.release_session(S);
    assert_eq!(q.peek(t, id).unwrap().status, Status::Buried);
}

#[test]
fn release_options_set_pri_ttl_and_delay() {
    let mut q = Queue::new();
    let t = tube(&mut q, "t", TubeType::FifoTtl, TubeOptions::default());
    let id = put(&mut q, t, TubePut::default());
    take(&mut q, t, T0 + 5);
    let o = ReleaseOptions {
        delay: 20,
        pri: Some(-1),
        ttl: Some(100),
    };
    let r = q.release_in(T0 + 10, t, S, id, o).unwrap();
    // Remaining life 100 from now (10 after the put), plus the delay.
    assert_eq!(
        (r.status, r.runat, r.pri, r.ttl),
        (Status::Waiting, T0 + 30, -1, Some(130))
    );
    q.check_invariants();
}

#[test]
fn dedup_returns_the_first_task_within_the_window() {
    let mut q = Queue::new();
    let opts = TubeOptions {
        dedup_window: 100,
        ..TubeOptions::default()
    };
    let t = tube(&mut q, "t", TubeType::Fifo, opts);
    let p = TubePut {
        dedup_key: Some(b"k"),
        ..TubePut::default()
    };
    let first = put(&mut q, t, p);
    match q.put_in(T0 + 50, t, Box::new([0x90]), p).unwrap() {
        PutOutcome::Duplicate(r) => assert_eq!(r.id, first),
        other => panic!("{other:?}"),
    }
    take(&mut q, t, T0);
    q.ack_in(t, S, first).unwrap();
    assert_eq!(
        q.put_in(T0 + 99, t, Box::new([0x90]), p).unwrap(),
        PutOutcome::DuplicateDone(first)
    );
    q.advance(T0 + 100, 10);
    q.check_invariants();
    match q.put_in(T0 + 100, t, Box::new([0x90]), p).unwrap() {
        PutOutcome::Created(r) => assert!(r.id > first),
        other => panic!("{other:?}"),
    }
    assert_eq!(q.tube_stats(t).unwrap().deduplicated, 2);
}

#[test]
fn drop_and_truncate() {
    let mut q = Queue::new();
    let u = tube(&mut q, "u", TubeType::Utube, TubeOptions::default());
    for key in [&b"a"[..], b"a", b"b"] {
        put(&mut q, u, utube(key));
    }
    take(&mut q, u, T0);
    assert_eq!(q.drop_tube(u), Err(QueueError::TubeHasTaken(u)));
    // Truncate takes Taken tasks too; counters stay.
    assert_eq!(q.truncate(u), Ok(3));
    q.check_invariants();
    let s = q.tube_stats(u).unwrap();
    assert_eq!((s.total, s.puts, s.takes), (0, 3, 1));
    put(&mut q, u, utube(b"a"));
    q.drop_tube(u).unwrap();
    q.check_invariants();
    assert_eq!(q.tube_ix("u"), None);
    assert!(q.is_empty());
    assert_eq!(
        q.take_from(T0, u, S).unwrap_err(),
        QueueError::TubeNotFound(u)
    );
}

#[test]
fn release_all_returns_only_the_tubes_taken_tasks() {
    let mut q = Queue::new();
    let a = tube(&mut q, "a", TubeType::Fifo, TubeOptions::default());
    let b = tube(&mut q, "b", TubeType::Fifo, TubeOptions::default());
    let x = put(&mut q, a, TubePut::default());
    let y = put(&mut q, b, TubePut::default());
    take(&mut q, a, T0);
    take(&mut q, b, T0);
    assert_eq!(q.release_all(a), Ok(1));
    q.check_invariants();
    assert_eq!(q.peek(a, x).unwrap().status, Status::Ready);
    assert_eq!(q.peek(b, y).unwrap().status, Status::Taken);
}

#[test]
fn the_seed_api_and_the_tube_api_share_default() {
    let mut q = Queue::new();
    let id = q.put(T0, Box::new([0x90]), Default::default()).id;
    assert_eq!(q.tube_ix("default"), Some(0));
    let r = q.take_from(T0, 0, S).unwrap().unwrap();
    assert_eq!((r.id, r.tube, r.deliveries), (id, 0, 1));
    // In `default` a delay does not extend the TTL (the seed's rule).
    q.release_in(
        T0,
        0,
        S,
        id,
        ReleaseOptions {
            delay: 5,
            ttl: Some(10),
            ..Default::default()
        },
    )
    .unwrap();
    assert_eq!(q.get(id).unwrap().ttl, Some(10));
    assert_eq!(q.stats().releases, 1);
    assert_eq!(q.stats(), q.tube_stats(0).unwrap());
    q.check_invariants();
}

/// A Ready task `id` as recovery brings it back.
fn restored(id: TaskId) -> RestoredTask {
    RestoredTask {
        id,
        status: Status::Ready,
        runat: 0,
        pri: 0,
        ttl: None,
        ttr: None,
        created: T0,
        data: Box::new([0x90]),
    }
}

/// Rebuilds the queue as recovery does from a snapshot: each tube with its numbering, the
/// free indexes' floors, each task, the seed's last id; then taken tasks go back.
fn restart(q: &Queue) -> Queue {
    let mut fresh = Queue::new();
    for t in q.tubes() {
        if t.ix != 0 {
            fresh
                .restore_tube(t.ix, t.name, t.kind, t.opts, t.numbers)
                .unwrap();
        } else {
            fresh.restore_tube_numbers(t.ix, t.numbers).unwrap();
        }
    }
    for (ix, floor) in q.floors() {
        fresh.restore_floor(ix, floor).unwrap();
    }
    for t in q.iter() {
        let task: RestoredTask = RestoredTask {
            id: t.id,
            status: t.status,
            runat: t.runat,
            pri: t.pri,
            ttl: t.ttl,
            ttr: t.ttr,
            created: t.created,
            data: t.data.into(),
        };
        fresh
            .restore_in(t.tube, task, t.utube, t.deliveries)
            .unwrap();
    }
    fresh.set_last_id(q.last_id());
    fresh.release_all_taken();
    fresh.check_invariants();
    fresh
}

#[test]
fn a_fresh_tube_numbers_its_tasks_from_0_and_default_keeps_its_ids() {
    let mut q = Queue::new();
    assert_eq!(q.put(T0, Box::new([0x90]), PutOptions::default()).id, 1);
    let a = tube(&mut q, "a", TubeType::FifoTtl, TubeOptions::default());
    let b = tube(&mut q, "b", TubeType::Fifo, TubeOptions::default());
    for n in 0..5 {
        let id = put(&mut q, a, TubePut::default());
        assert_eq!((id, id_number(id)), (task_id(a, n), n));
        assert_eq!(q.task_id_in(a, n), id);
    }
    // Each tube counts its own; ids stay unique across tubes and below 2^53.
    let first_b = put(&mut q, b, TubePut::default());
    assert_eq!(id_number(first_b), 0);
    assert_ne!(first_b, task_id(a, 0));
    assert!(task_id(MAX_TUBES as TubeIx - 1, MAX_TASK_NUMBER) < 1 << 53);
    // `default` under either API: the number is the seed's id.
    assert_eq!(q.put(T0, Box::new([0x90]), PutOptions::default()).id, 2);
    assert_eq!(q.task_id_in(0, 2), 2);
    assert_eq!(q.last_id(), 2);
}

#[test]
fn the_statistics_flow_of_the_original_runs_on_numbers() {
    // The original's statistics tests: five puts into a fresh tube, then delete(4),
    // release(0), ack(0), bury(1), bury(2).
    let mut q = Queue::new();
    tube(&mut q, "other", TubeType::FifoTtl, TubeOptions::default());
    let t = tube(&mut q, "stats", TubeType::FifoTtl, TubeOptions::default());
    for _ in 0..5 {
        put(&mut q, t, TubePut::default());
    }
    let id = |n| q.task_id_in(t, n);
    let (d4, r0, b1, b2) = (id(4), id(0), id(1), id(2));
    assert_eq!(id_number(q.delete(t, d4).unwrap().id), 4);
    assert_eq!(take(&mut q, t, T0), Some(r0));
    let r = q
        .release_in(T0, t, S, r0, ReleaseOptions::default())
        .unwrap();
    assert_eq!((id_number(r.id), r.status), (0, Status::Ready));
    assert_eq!(take(&mut q, t, T0), Some(r0));
    assert_eq!(id_number(q.ack_in(t, S, r0).unwrap().id), 0);
    assert_eq!(q.bury(t, b1).unwrap().status, Status::Buried);
    assert_eq!(q.bury(t, b2).unwrap().status, Status::Buried);
    q.check_invariants();
    let st = q.tube_stats(t).unwrap();
    assert_eq!((st.total, st.ready, st.buried), (3, 1, 2));
    assert_eq!(
        (st.puts, st.deletes, st.releases, st.acks, st.buries),
        (5, 1, 1, 1, 2)
    );
}

#[test]
fn a_number_is_never_given_twice_even_after_the_newest_is_deleted_and_a_restart() {
    let mut q = Queue::new();
    let t = tube(&mut q, "q", TubeType::FifoTtl, TubeOptions::default());
    for _ in 0..3 {
        put(&mut q, t, TubePut::default());
    }
    q.delete(t, q.task_id_in(t, 2)).unwrap();
    // The original's max + 1 would hand out 2 again.
    assert_eq!(id_number(put(&mut q, t, TubePut::default())), 3);
    q.delete(t, q.task_id_in(t, 3)).unwrap();
    let taken = take(&mut q, t, T0).unwrap();
    q.ack_in(t, S, taken).unwrap();
    // A late ack of the deleted newest finds nothing rather than another task.
    let late = q.task_id_in(t, 3);
    assert_eq!(q.ack_in(t, S, late), Err(not_held(late, S, Hold::NoTask)));
    // The snapshot carries the tube's numbering: restored, it goes on from 4, not from the
    // newest live task (1).
    let mut q = restart(&q);
    assert_eq!(q.tube_info(t).unwrap().numbers.next, 4);
    assert_eq!(id_number(put(&mut q, t, TubePut::default())), 4);
    // Replayed puts carry it too: a restore past the counter raises it.
    let mut r = Queue::new();
    r.restore_tube(
        t,
        "q",
        TubeType::FifoTtl,
        TubeOptions::default(),
        TubeNumbers::default(),
    )
    .unwrap();
    let task = restored(task_id(t, 9));
    r.restore_in(t, task, None, 0).unwrap();
    r.restore_remove(task_id(t, 9));
    assert_eq!(id_number(put(&mut r, t, TubePut::default())), 10);
}

/// Puts into `t` and returns the whole id and the number the tube API shows (from the task
/// the put returns, and from `task_number`, which must agree).
fn put_shown(q: &mut Queue, t: TubeIx) -> (TaskId, u64) {
    let id = match q
        .put_in(T0, t, Box::new([0x90]), TubePut::default())
        .unwrap()
    {
        PutOutcome::Created(r) => r.id,
        other => panic!("a new task, got {other:?}"),
    };
    let number = (id, q.task_number(t, id));
    assert_eq!(
        tarq_engine::number_from(t, q.tube_numbers(t).first, id),
        number.1,
        "the front-end's mapping"
    );
    assert_eq!(q.task_id_in(t, number.1), number.0);
    q.check_invariants();
    number
}

#[test]
fn a_tube_created_at_a_dropped_ones_index_numbers_from_0_and_gives_no_id_again() {
    // The original's new space numbers from 0; beanstalkd never gives a job id twice. A tube
    // at a dropped one's index shows its numbers from 0 and takes its ids above the old ones.
    let mut q = Queue::new();
    let t = tube(&mut q, "q", TubeType::Fifo, TubeOptions::default());
    let old: Vec<(TaskId, u64)> = (0..3).map(|_| put_shown(&mut q, t)).collect();
    assert_eq!(old.iter().map(|o| o.1).collect::<Vec<_>>(), [0, 1, 2]);
    q.drop_tube(t).unwrap();
    assert_eq!(q.floors().collect::<Vec<_>>(), [(t, 3)]);
    let again = tube(&mut q, "r", TubeType::FifoTtl, TubeOptions::default());
    assert_eq!(again, t);
    assert_eq!(q.tube_info(again).unwrap().numbers.first, 3);
    assert_eq!(q.floors().count(), 0, "a live index has no floor to keep");
    let (id, n) = put_shown(&mut q, again);
    assert_eq!((id, n), (task_id(t, 3), 0));
    assert!(old.iter().all(|o| o.0 != id));
    // Truncate keeps the numbering: the tube lives on.
    q.truncate(again).unwrap();
    assert_eq!(put_shown(&mut q, again), (task_id(t, 4), 1));
    // By number: the tube's own; a number it has not given finds nothing, named as given.
    let by_number = q.peek(again, q.task_id_in(again, 1)).unwrap().id;
    assert_eq!(by_number, task_id(t, 4));
    let seven = q.task_id_in(again, 7);
    assert_eq!(
        q.peek(again, seven).unwrap_err(),
        QueueError::NotInTube {
            id: seven,
            tube: again
        }
    );
    assert_eq!(q.task_number(again, seven), 7);
    // The dropped tube's whole ids name nothing, and read as no number of the new tube.
    assert!(q.get(old[0].0).is_none());
    assert_eq!(q.task_number(again, old[0].0), old[0].0);
    // A third tube at the index numbers on from the second's counter.
    q.drop_tube(again).unwrap();
    let third = tube(&mut q, "s", TubeType::Fifo, TubeOptions::default());
    assert_eq!(put_shown(&mut q, third), (task_id(t, 5), 0));
    // Restarted from a snapshot of this state (a live index keeps its tube's first).
    let mut r = restart(&q);
    assert_eq!(
        r.tube_info(third).unwrap().numbers,
        q.tube_info(third).unwrap().numbers
    );
    assert_eq!(put_shown(&mut r, third), (task_id(t, 6), 1));
}

#[test]
fn a_free_index_keeps_its_floor_through_a_restart_and_a_replayed_spent_number() {
    let mut q = Queue::new();
    let t = tube(&mut q, "q", TubeType::Fifo, TubeOptions::default());
    for _ in 0..4 {
        put_shown(&mut q, t);
    }
    q.drop_tube(t).unwrap();
    // A snapshot taken while the index is free carries its floor.
    let mut r = restart(&q);
    assert_eq!(r.floors().collect::<Vec<_>>(), [(t, 4)]);
    let again = tube(&mut r, "q", TubeType::Fifo, TubeOptions::default());
    assert_eq!(put_shown(&mut r, again), (task_id(t, 4), 0));
    // The log names a number spent at a free index (a put into a tube dropped within its
    // turn): the next tube there numbers above it.
    let mut w = Queue::new();
    w.set_last_id(task_id(9, 11));
    assert_eq!(w.floors().collect::<Vec<_>>(), [(9, 12)]);
    w.restore_floor(9, 5).unwrap();
    assert_eq!(
        w.floors().collect::<Vec<_>>(),
        [(9, 12)],
        "a floor never goes down"
    );
    assert_eq!(
        w.restore_floor(0, 1).unwrap_err(),
        QueueError::TubeExists("default".into())
    );
    for i in 1..=9 {
        tube(
            &mut w,
            &format!("t{i}"),
            TubeType::Fifo,
            TubeOptions::default(),
        );
    }
    assert_eq!(put_shown(&mut w, 9), (task_id(9, 12), 0));
    assert_eq!(put_shown(&mut w, 8), (task_id(8, 0), 0));
}

#[test]
fn an_index_whose_numbers_are_spent_refuses_puts_in_every_tube_created_there() {
    let mut q = Queue::new();
    let t = tube(&mut q, "q", TubeType::Fifo, TubeOptions::default());
    q.drop_tube(t).unwrap();
    q.restore_floor(t, MAX_TASK_NUMBER).unwrap();
    let again = tube(&mut q, "q", TubeType::Fifo, TubeOptions::default());
    assert_eq!(put_shown(&mut q, again), (task_id(t, MAX_TASK_NUMBER), 0));
    assert!(!q.numbers_left(again));
    let refused = q.put_in(T0, again, Box::new([0x90]), TubePut::default());
    assert_eq!(
        refused.unwrap_err(),
        QueueError::TubeNumbersSpent { name: "q".into() }
    );
    // A number past what the index has left names no task of the tube.
    assert_eq!(q.task_id_in(again, 1), 1);
    assert_eq!(
        q.peek(again, 1).unwrap_err(),
        QueueError::NotInTube { id: 1, tube: again }
    );
    assert_eq!(q.task_number(again, 1), 1);
    q.drop_tube(again).unwrap();
    let third = tube(&mut q, "q", TubeType::Fifo, TubeOptions::default());
    assert!(!q.numbers_left(third));
}

#[test]
fn a_restored_tube_keeps_the_first_number_it_was_made_with() {
    let mut q = Queue::new();
    let numbers = TubeNumbers {
        next: 7,
        legacy_below: 0,
        first: 5,
    };
    q.restore_tube(1, "q", TubeType::Fifo, TubeOptions::default(), numbers)
        .unwrap();
    assert_eq!(q.tube_info(1).unwrap().numbers, numbers);
    // A task below the tube's first was a tube's before it: not this one's.
    let below = restored(task_id(1, 4));
    assert_eq!(
        q.restore_in(1, below, None, 0).unwrap_err(),
        QueueError::IdNotOfTube {
            id: task_id(1, 4),
            tube: 1
        }
    );
    // Nor one kept from before tubes numbered their own: those live in tubes numbering from 0.
    assert!(q.restore_in(1, restored(3), None, 0).is_err());
    q.restore_in(1, restored(task_id(1, 6)), None, 0).unwrap();
    q.get(task_id(1, 6)).unwrap();
    assert_eq!(q.task_number(1, task_id(1, 6)), 1);
    // Its first is its own: a mark or another first is refused.
    let other = TubeNumbers {
        first: 2,
        ..numbers
    };
    assert!(q.restore_tube_numbers(1, other).is_err());
    let mark = TubeNumbers {
        legacy_below: 3,
        ..numbers
    };
    assert!(q.restore_tube_numbers(1, mark).is_err());
    let default_first = TubeNumbers {
        first: 1,
        ..TubeNumbers::default()
    };
    assert!(q.restore_tube_numbers(0, default_first).is_err());
    q.check_invariants();
}

#[test]
fn a_job_put_by_id_is_handled_by_number_and_the_other_way_round() {
    // beanstalk's calls take the whole id, the tube API's the number: the same task.
    let mut q = Queue::new();
    let t = tube(&mut q, "jobs", TubeType::FifoTtl, TubeOptions::default());
    let ids: Vec<TaskId> = (0..4).map(|_| put(&mut q, t, TubePut::default())).collect();
    // Taken by id (reserve-job), acked by number.
    q.take_task(T0, S, ids[0]).unwrap();
    q.ack_in(t, S, q.task_id_in(t, 0)).unwrap();
    // Buried by its holder by id, kicked by the tube's kick, deleted by number.
    q.take_task(T0, S, ids[1]).unwrap();
    q.bury_taken(S, ids[1], 7).unwrap();
    assert_eq!(
        q.peek(t, q.task_id_in(t, 1)).unwrap().status,
        Status::Buried
    );
    assert_eq!(q.kick(t, 1).unwrap(), 1);
    q.delete(t, q.task_id_in(t, 1)).unwrap();
    assert!(q.get(ids[1]).is_none());
    // Buried by number, kicked by id (kick-job), taken by the tube API, touched by id.
    q.bury(t, q.task_id_in(t, 2)).unwrap();
    q.kick_task(T0, ids[2]).unwrap();
    assert_eq!(take(&mut q, t, T0), Some(ids[2]));
    q.touch_ttr(T0, S, ids[2]).unwrap();
    q.release_in(T0, t, S, q.task_id_in(t, 2), ReleaseOptions::default())
        .unwrap();
    // The whole id is accepted by the tube API too; a number of another tube is not found.
    assert_eq!(q.task_id_in(t, ids[3]), ids[3]);
    assert_eq!(q.peek(t, ids[3]).unwrap().id, ids[3]);
    let elsewhere = q.task_id_in(0, 3);
    assert_eq!(
        q.peek(t, elsewhere).unwrap_err(),
        QueueError::NotInTube {
            id: elsewhere,
            tube: t
        }
    );
    assert_eq!(q.task_number(t, elsewhere), 3);
    q.check_invariants();
}

#[test]
fn ids_kept_from_before_tubes_numbered_their_own_stay_reachable_and_unshadowed() {
    // A data directory of the older format: one global counter (60 here); tube 1 holds tasks
    // 57 and 58 under it, `default` task 59.
    let mut q = Queue::new();
    q.restore_tube(
        1,
        "old",
        TubeType::FifoTtl,
        TubeOptions::default(),
        TubeNumbers::default(),
    )
    .unwrap();
    for (tube, id) in [(1, 57), (1, 58), (0, 59)] {
        q.restore_in(tube, restored(id), None, 0).unwrap();
    }
    q.set_last_id(60);
    // What the older snapshot's loader adds: the tube's numbers go on above the old counter.
    let mark = TubeNumbers {
        next: 61,
        legacy_below: 61,
        first: 0,
    };
    q.restore_tube_numbers(1, mark).unwrap();
    q.check_invariants();
    // The tube API reaches the old tasks by their old ids.
    assert_eq!(q.task_id_in(1, 57), 57);
    assert_eq!(q.peek(1, q.task_id_in(1, 58)).unwrap().id, 58);
    // New tasks: the tube's own numbers from the mark, `default`'s above the old counter.
    let new = put(&mut q, 1, TubePut::default());
    assert_eq!((new, id_number(new)), (task_id(1, 61), 61));
    assert_eq!(q.task_id_in(1, 61), new);
    assert_eq!(q.put(T0, Box::new([0x90]), PutOptions::default()).id, 61);
    // A number below the mark never reaches a new task, nor one of `default`.
    let old = q.task_id_in(1, 59);
    assert_eq!(
        q.peek(1, old).unwrap_err(),
        QueueError::NotInTube { id: old, tube: 1 }
    );
    assert_eq!(q.task_number(1, old), 59);
    q.check_invariants();
    // The mark survives a snapshot.
    let q = restart(&q);
    let after = TubeNumbers {
        next: 62,
        legacy_below: 61,
        first: 0,
    };
    assert_eq!(q.tube_info(1).unwrap().numbers, after);
    assert_eq!(q.peek(1, q.task_id_in(1, 57)).unwrap().id, 57);

    // Replaying an older WAL (no snapshot): the old ids themselves set the mark.
    let mut r = Queue::new();
    r.restore_tube(
        2,
        "replayed",
        TubeType::Fifo,
        TubeOptions::default(),
        TubeNumbers::default(),
    )
    .unwrap();
    let task = restored(33);
    r.restore_in(2, task, None, 0).unwrap();
    let numbers = r.tube_info(2).unwrap().numbers;
    assert_eq!((numbers.next, numbers.legacy_below), (34, 34));
    assert_eq!(r.put(T0, Box::new([0x90]), PutOptions::default()).id, 34);
    r.check_invariants();
}

#[test]
fn a_tube_whose_numbers_run_out_refuses_puts_and_ids_of_another_tube_are_refused() {
    let mut q = Queue::new();
    let t = tube(&mut q, "q", TubeType::Fifo, TubeOptions::default());
    let last = TubeNumbers {
        next: MAX_TASK_NUMBER,
        legacy_below: 0,
        first: 0,
    };
    q.restore_tube_numbers(t, last).unwrap();
    assert!(q.numbers_left(t));
    let id = put(&mut q, t, TubePut::default());
    assert_eq!(id_number(id), MAX_TASK_NUMBER);
    assert!(!q.numbers_left(t));
    assert_eq!(
        q.put_in(T0, t, Box::new([0x90]), TubePut::default())
            .unwrap_err(),
        QueueError::TubeNumbersSpent { name: "q".into() }
    );
    // Recovery refuses an id that packs another tube's index, or none at all (from 2^57 on:
    // not the tube its low bits name), as a task or as a dedup key's task.
    let other = tube(&mut q, "other", TubeType::Fifo, TubeOptions::default());
    for id in [task_id(t, 5), 1 << 57 | task_id(other, 5)] {
        let refused = Err(QueueError::IdNotOfTube { id, tube: other });
        assert_eq!(q.restore_in(other, restored(id), None, 0), refused);
        assert_eq!(q.restore_dedup(other, b"k", id, T0), refused);
    }
    assert_eq!(q.len(), 1, "nothing restored");
    q.check_invariants();
}

#[test]
fn a_restored_dedup_key_raises_its_tubes_numbering_past_its_task() {
    // The key's task is gone (put and deleted in one turn, so no record of it): the tube must
    // not give its number to a new task, which a retry with the key would then name.
    let mut q = Queue::new();
    let opts = TubeOptions {
        dedup_window: 60_000_000,
        ..TubeOptions::default()
    };
    q.restore_tube(1, "d", TubeType::Fifo, opts, TubeNumbers::default())
        .unwrap();
    q.restore_dedup(1, b"k", task_id(1, 4), T0 + 1).unwrap();
    assert_eq!(q.tube_info(1).unwrap().numbers.next, 5);
    assert_eq!(id_number(put(&mut q, 1, TubePut::default())), 5);
    // A key kept from before tubes numbered their own: `default` goes on above its id and
    // the tube reads the number as that id.
    q.restore_tube(2, "old", TubeType::Fifo, opts, TubeNumbers::default())
        .unwrap();
    q.restore_dedup(2, b"k", 40, T0 + 1).unwrap();
    assert_eq!(q.tube_info(2).unwrap().numbers.legacy_below, 41);
    assert_eq!(q.put(T0, Box::new([0x90]), PutOptions::default()).id, 41);
    q.check_invariants();
}

#[test]
fn a_tube_made_on_demand_is_dropped_once_empty_and_no_other_is() {
    let mut q = Queue::new();
    q.set_journal(true);
    let on_demand = TubeOptions {
        on_demand: true,
        ..TubeOptions::default()
    };
    let made = tube(&mut q, "made", TubeType::FifoTtl, on_demand);
    let created = tube(&mut q, "created", TubeType::FifoTtl, TubeOptions::default());
    q.drain_events().for_each(drop);
    // Made by create_tube, or `default`: kept, empty as they are.
    assert_eq!(q.drop_if_unneeded(created), Ok(false));
    assert_eq!(q.drop_if_unneeded(tarq_engine::DEFAULT_TUBE), Ok(false));
    // Made on demand: kept while it holds a task in any status, Taken included.
    let id = put(&mut q, made, TubePut::default());
    assert_eq!(q.drop_if_unneeded(made), Ok(false));
    assert_eq!(take(&mut q, made, T0), Some(id));
    assert_eq!(q.drop_if_unneeded(made), Ok(false));
    q.bury(made, id).unwrap();
    assert_eq!(q.drop_if_unneeded(made), Ok(false));
    assert_eq!(
        q.drain_events()
            .filter(|e| matches!(e, Event::TubeDropped { .. }))
            .count(),
        0
    );
    q.delete(made, id).unwrap();
    assert_eq!(q.drop_if_unneeded(made), Ok(true));
    q.check_invariants();
    assert_eq!(q.tube_ix("made"), None);
    assert!(q
        .drain_events()
        .any(|e| e == Event::TubeDropped { tube: made }));
    // A dropped index is no tube any more.
    assert_eq!(
        q.drop_if_unneeded(made),
        Err(QueueError::TubeNotFound(made))
    );
    assert_eq!(q.tube_ix("created"), Some(created));
}

/// A sharded cluster's placement names each partition's index: `create_tube_at` puts a tube
/// there, applies again as a no-op, and a partition after the first shares its tube's name
/// without being found by it or listed under it.
#[test]
fn partitions_are_created_at_their_index_and_found_by_it_only() {
    let mut q = Queue::new();
    let head = TubeOptions::default();
    let part = TubeOptions {
        part: 1,
        ..TubeOptions::default()
    };
    assert_eq!(
        q.create_tube_at(7, "jobs", TubeType::Fifo, head, 0),
        Ok(true)
    );
    assert_eq!(
        q.create_tube_at(9, "jobs", TubeType::Fifo, part, 40),
        Ok(true)
    );
    assert_eq!(
        q.create_tube_at(9, "jobs", TubeType::Fifo, part, 40),
        Ok(false)
    );
    assert!(matches!(
        q.create_tube_at(9, "other", TubeType::Fifo, head, 0),
        Err(QueueError::TubeExists(_))
    ));
    assert_eq!(q.tube_ix("jobs"), Some(7));
    let named: Vec<_> = q.named_tubes().map(|t| (t.ix, t.name)).collect();
    assert_eq!(named, vec![(0, "default"), (7, "jobs")]);
    assert_eq!(q.tubes().count(), 3);
    // The partition numbers from the `first` its placement gave.
    assert_eq!(put(&mut q, 9, TubePut::default()), task_id(9, 40));
    q.check_invariants();
    // Dropping the partition leaves the name to its tube.
    q.drop_tube(9).unwrap();
    assert_eq!(q.tube_ix("jobs"), Some(7));
}

#[test]
fn list_walks_each_status_in_its_order_and_pages_after_a_task() {
    let mut q = Queue::new();
    let t = tube(&mut q, "jobs", TubeType::FifoTtl, TubeOptions::default());
    let pri = |p| TubePut {
        pri: Some(p),
        ..TubePut::default()
    };
    let a = put(&mut q, t, pri(5));
    let b = put(&mut q, t, pri(1));
    let c = put(&mut q, t, pri(5));
    let d = put(
        &mut q,
        t,
        TubePut {
            delay: 60 * 1_000_000,
            ..TubePut::default()
        },
    );
    let ids = |q: &Queue, s, after, n| -> Vec<TaskId> {
        q.list(t, s, after, n)
            .unwrap()
            .iter()
            .map(|r| r.id)
            .collect()
    };
    // Ready in take order: pri, then id.
    assert_eq!(ids(&q, Status::Ready, None, 10), vec![b, a, c]);
    assert_eq!(ids(&q, Status::Ready, None, 2), vec![b, a]);
    assert_eq!(ids(&q, Status::Ready, Some(a), 2), vec![c]);
    assert_eq!(ids(&q, Status::Ready, Some(c), 2), Vec::<TaskId>::new());
    // A cursor that left the list starts over at the head.
    assert_eq!(ids(&q, Status::Ready, Some(d), 1), vec![b]);
    assert_eq!(ids(&q, Status::Waiting, None, 10), vec![d]);
    q.bury(t, c).unwrap();
    assert_eq!(ids(&q, Status::Buried, None, 10), vec![c]);
    assert_eq!(take(&mut q, t, T0), Some(b));
    assert_eq!(take(&mut q, t, T0), Some(a));
    assert_eq!(ids(&q, Status::Taken, None, 10), vec![b, a]);
    assert_eq!(ids(&q, Status::Taken, Some(b), 10), vec![a]);
    assert!(q.list(99, Status::Ready, None, 1).is_err());
}

/// Issue 39: the node's headline figures counted the tube `default` only. `all_stats` sums
/// every tube, and keeps a dropped tube's operations, so a counter never goes down.
#[test]
fn all_stats_sum_every_tube_and_keep_a_dropped_tubes_counters() {
    let mut q = Queue::new();
    let a = tube(&mut q, "a", TubeType::Fifo, TubeOptions::default());
    let b = tube(&mut q, "b", TubeType::FifoTtl, TubeOptions::default());
    for _ in 0..3 {
        put(&mut q, a, TubePut::default());
    }
    put(&mut q, b, TubePut::default());
    let taken = take(&mut q, a, T0).unwrap();
    q.ack_in(a, S, taken).unwrap();
    let all = q.all_stats();
    assert_eq!((all.total, all.ready, all.taken), (3, 3, 0));
    // The head a take gets next was put at T0 in both tubes: the earliest over them.
    assert_eq!(q.ready_since(a), T0);
    assert_eq!(q.tube_stats(a).unwrap().ready_since, 0, "only on request");
    assert_eq!(all.ready_since, T0);
    assert_eq!((all.puts, all.takes, all.acks), (4, 1, 1));
    assert_eq!(q.stats().puts, 0, "`default`'s own figures stay its own");

    q.drop_tube(a).unwrap();
    q.check_invariants();
    let after = q.all_stats();
    assert_eq!((after.total, after.ready), (1, 1), "a's tasks are gone");
    assert_eq!(
        (after.puts, after.takes, after.acks),
        (4, 1, 1),
        "a's operations stay counted"
    );
    let a = tube(&mut q, "a", TubeType::Fifo, TubeOptions::default());
    put(&mut q, a, TubePut::default());
    assert_eq!(q.all_stats().puts, 5);
}
