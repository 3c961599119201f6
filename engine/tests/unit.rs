//! Unit tests of the engine's public API: each error (the engine's own texts; the wire's are
//! the front-ends') and each
//! transition (put, take, ack, release, session close, promote, expire, TTR, recovery), the
//! calls the beanstalkd front-end needs (peek_first, kick_delayed, kick_task, touch_ttr,
//! bury_taken, ttr_deadline, soonest_ttr, ready_urgent) with their errors, with
//! `check_invariants()` after every step that changes the queue.

use tarq_engine::{
    id_number, task_id, Event, Hold, PutOptions, PutOutcome, Queue, QueueError, ReleaseOptions,
    RestoredTask, Stats, Status, Task, TaskId, TubeIx, TubeNumbers, TubeOptions, TubePut, TubeType,
    DEFAULT_TUBE, MAX_TASK_NUMBER, URGENT_PRI,
};

const T0: u64 = 1_700_000_000_000_000;

fn data(s: &str) -> Box<[u8]> {
    s.as_bytes().into()
}

fn put(q: &mut Queue, now: u64, payload: &str, opts: PutOptions) -> TaskId {
    let id = q.put(now, data(payload), opts).id;
    q.check_invariants();
    id
}

fn take(q: &mut Queue, now: u64, sid: u64) -> Option<TaskId> {
    let id = q.take(now, sid).map(|t| t.id);
    q.check_invariants();
    id
}

fn ready_ids(q: &mut Queue, sid: u64) -> Vec<TaskId> {
    let mut out = vec![];
    while let Some(id) = take(q, T0, sid) {
        out.push(id);
    }
    out
}

/// Session `caller` does not hold task `id`, for the reason `hold`.
fn not_held(id: TaskId, caller: u64, hold: Hold) -> QueueError {
    QueueError::NotHeld { id, caller, hold }
}

#[test]
fn error_messages_name_what_was_refused() {
    let cases = [
        (QueueError::NotFound(5), "no task 5"),
        (
            not_held(5, 8, Hold::NoTask),
            "session 8 does not hold task 5: there is no such task",
        ),
        (
            not_held(1, 8, Hold::Untaken(Status::Ready)),
            "session 8 does not hold task 1: it is Ready, not taken",
        ),
        (
            not_held(1, 8, Hold::TakenBy(7)),
            "session 8 does not hold task 1: session 7 holds it",
        ),
        (
            QueueError::NotInTube { id: 4, tube: 2 },
            "no task 4 in tube 2",
        ),
        (QueueError::Duplicate(3), "task 3 is live already"),
    ];
    for (err, text) in cases {
        assert_eq!(err.to_string(), text);
    }
}

#[test]
fn status_letters() {
    assert_eq!(Status::Ready.as_str(), "R");
    assert_eq!(Status::Taken.as_str(), "T");
    assert_eq!(Status::Waiting.as_str(), "W");
}

#[test]
fn put_ready_returns_the_task_and_keeps_bytes() {
    let mut q = Queue::new();
    let t = q.put(
        T0,
        vec![0xa5, b'h', b'e', b'l', b'l', b'o'],
        PutOptions::default(),
    );
    assert_eq!(t.id, 1);
    assert_eq!(t.status, Status::Ready);
    assert_eq!(t.runat, 0);
    assert_eq!(t.created, T0);
    assert_eq!((t.ttl, t.ttr, t.pri, t.owner), (None, None, 0, None));
    assert_eq!(t.data, &[0xa5, b'h', b'e', b'l', b'l', b'o']);
    assert_eq!(q.put(T0, data("x"), PutOptions::default()).id, 2);
    assert_eq!(q.last_id(), 2);
    assert_eq!(q.len(), 2);
    assert!(!q.is_empty());
    q.check_invariants();
}

#[test]
fn put_with_delay_waits_until_runat() {
    let mut q = Queue::new();
    let opts = PutOptions {
        delay: 500,
        ttl: Some(10_000),
        ttr: Some(70),
        pri: -3,
    };
    let t = q.put(T0, data("w"), opts);
    assert_eq!((t.status, t.runat), (Status::Waiting, T0 + 500));
    assert_eq!((t.ttl, t.ttr, t.pri), (Some(10_000), Some(70), -3));
    assert_eq!(q.next_deadline(), Some(T0 + 500));
    assert_eq!(take(&mut q, T0 + 499, 1), None);
    let adv = q.advance(T0 + 499, 100);
    assert_eq!((adv.processed, adv.next_deadline), (0, Some(T0 + 500)));
    let adv = q.advance(T0 + 500, 100);
    assert_eq!((adv.processed, adv.next_deadline), (1, Some(T0 + 10_000)));
    q.check_invariants();
    let t = q.get(1).unwrap();
    assert_eq!((t.status, t.runat), (Status::Ready, 0));
    assert_eq!(q.stats().promoted, 1);
}

#[test]
fn take_by_pri_then_id() {
    let mut q = Queue::new();
    for pri in [5, 0, 5, -1, 0] {
        put(
            &mut q,
            T0,
            "p",
            PutOptions {
                pri,
                ..Default::default()
            },
        );
    }
    assert_eq!(ready_ids(&mut q, 1), vec![4, 2, 5, 1, 3]);
}

#[test]
fn take_marks_taken_by_the_session() {
    let mut q = Queue::new();
    put(&mut q, T0, "a", PutOptions::default());
    assert!(q
        .take(T0, 9)
        .is_some_and(|t| t.status == Status::Taken && t.owner == Some(9)));
    q.check_invariants();
    assert!(q.take(T0, 9).is_none(), "nothing else is ready");
    assert_eq!(q.get(1).unwrap().owner, Some(9));
}

#[test]
fn ack_deletes_and_returns_the_task_as_taken() {
    let mut q = Queue::new();
    put(
        &mut q,
        T0,
        "a",
        PutOptions {
            ttr: Some(10),
            ..Default::default()
        },
    );
    take(&mut q, T0, 1);
    let t: Task = q.ack(1, 1).unwrap();
    q.check_invariants();
    assert_eq!((t.id, t.status, t.owner), (1, Status::Taken, Some(1)));
    assert_eq!(&*t.data, b"a");
    assert_eq!(t.as_ref().data, b"a");
    assert!(q.get(1).is_none());
    assert!(q.is_empty());
    assert_eq!(
        q.next_deadline(),
        None,
        "the TTR deadline left with the task"
    );
    assert_eq!(q.ack(1, 1), Err(not_held(1, 1, Hold::NoTask)));
}

#[test]
fn ack_and_release_refuse_a_task_the_caller_does_not_hold() {
    let mut q = Queue::new();
    put(&mut q, T0, "ready", PutOptions::default());
    put(
        &mut q,
        T0,
        "waiting",
        PutOptions {
            delay: 10,
            ..Default::default()
        },
    );
    put(
        &mut q,
        T0,
        "taken",
        PutOptions {
            pri: -1,
            ..Default::default()
        },
    );
    assert_eq!(take(&mut q, T0, 7), Some(3));
    let before = q.stats();
    for (sid, id, err) in [
        (7, 99, not_held(99, 7, Hold::NoTask)),
        (7, 1, not_held(1, 7, Hold::Untaken(Status::Ready))),
        (7, 2, not_held(2, 7, Hold::Untaken(Status::Waiting))),
        (8, 3, not_held(3, 8, Hold::TakenBy(7))),
    ] {
        assert_eq!(q.ack(sid, id).unwrap_err(), err);
        assert_eq!(q.release(T0, sid, id, 0).unwrap_err(), err);
        assert_eq!(q.release(T0, sid, id, 5).unwrap_err(), err);
        q.check_invariants();
    }
    assert_eq!(q.stats(), before, "refused calls change nothing");
    assert_eq!(q.get(3).unwrap().owner, Some(7));
}

#[test]
fn release_goes_back_to_its_place_by_id() {
    let mut q = Queue::new();
    for _ in 0..4 {
        put(&mut q, T0, "x", PutOptions::default());
    }
    assert_eq!(take(&mut q, T0, 1), Some(1));
    assert_eq!(take(&mut q, T0, 1), Some(2));
    let t = q.release(T0, 1, 2, 0).unwrap();
    assert_eq!((t.status, t.runat, t.owner), (Status::Ready, 0, None));
    q.check_invariants();
    assert_eq!(ready_ids(&mut q, 2), vec![2, 3, 4]);
    assert_eq!(q.stats().releases, 1);
}

#[test]
fn release_with_delay_waits_then_returns() {
    let mut q = Queue::new();
    put(
        &mut q,
        T0,
        "x",
        PutOptions {
            ttr: Some(50),
            ..Default::default()
        },
    );
    take(&mut q, T0, 1);
    let t = q.release(T0 + 10, 1, 1, 1000).unwrap();
    assert_eq!(
        (t.status, t.runat, t.owner),
        (Status::Waiting, T0 + 1010, None)
    );
    q.check_invariants();
    assert_eq!(
        q.next_deadline(),
        Some(T0 + 1010),
        "the TTR entry is gone, runat is due"
    );
    assert_eq!(take(&mut q, T0 + 20, 1), None);
    assert_eq!(q.advance(T0 + 1010, 10).processed, 1);
    assert_eq!(take(&mut q, T0 + 1010, 2), Some(1));
}

#[test]
fn release_session_returns_its_tasks_in_take_order() {
    let mut q = Queue::new();
    q.set_journal(true);
    for _ in 0..5 {
        put(
            &mut q,
            T0,
            "x",
            PutOptions {
                ttr: Some(100),
                ..Default::default()
            },
        );
    }
    for sid in [1, 2, 1, 2, 1] {
        take(&mut q, T0, sid);
    }
    q.ack(1, 3).unwrap();
    q.drain_events().for_each(drop);
    assert_eq!(q.release_session(1), 2);
    q.check_invariants();
    assert_eq!(
        q.drain_events().collect::<Vec<_>>(),
        vec![Event::AutoReleased { id: 1 }, Event::AutoReleased { id: 5 }]
    );
    assert_eq!(q.release_session(1), 0, "nothing left");
    assert_eq!(q.release_session(42), 0, "unknown session");
    let s = q.stats();
    assert_eq!((s.ready, s.taken, s.auto_released), (2, 2, 2));
    assert_eq!(q.get(2).unwrap().owner, Some(2));
    assert_eq!(
        q.next_deadline(),
        Some(T0 + 100),
        "session 2 keeps its TTR deadlines"
    );
}

#[test]
fn release_all_taken_in_pri_id_order() {
    let mut q = Queue::new();
    for pri in [3, 1, 2] {
        put(
            &mut q,
            T0,
            "x",
            PutOptions {
                pri,
                ..Default::default()
            },
        );
    }
    for sid in [1, 2, 3] {
        take(&mut q, T0, sid);
    }
    q.set_journal(true);
    assert_eq!(q.release_all_taken(), 3);
    q.check_invariants();
    let ev: Vec<_> = q.drain_events().collect();
    assert_eq!(
        ev,
        vec![
            Event::AutoReleased { id: 2 },
            Event::AutoReleased { id: 3 },
            Event::AutoReleased { id: 1 }
        ]
    );
    assert_eq!(q.stats().taken, 0);
}

#[test]
fn ttl_expires_in_every_state() {
    let mut q = Queue::new();
    let ttl = Some(1000);
    put(
        &mut q,
        T0,
        "ready",
        PutOptions {
            ttl,
            ..Default::default()
        },
    );
    put(
        &mut q,
        T0 + 1,
        "waiting",
        PutOptions {
            ttl,
            delay: 5000,
            ..Default::default()
        },
    );
    put(
        &mut q,
        T0 + 2,
        "taken",
        PutOptions {
            ttl,
            pri: -1,
            ..Default::default()
        },
    );
    assert_eq!(take(&mut q, T0 + 3, 4), Some(3));
    q.set_journal(true);
    assert_eq!(q.advance(T0 + 999, 100).processed, 0);
    let adv = q.advance(T0 + 1002, 100);
    q.check_invariants();
    assert_eq!((adv.processed, adv.next_deadline), (3, None));
    let ev: Vec<_> = q.drain_events().collect();
    assert_eq!(
        ev,
        vec![
            Event::Expired { id: 1 },
            Event::Expired { id: 2 },
            Event::Expired { id: 3 }
        ]
    );
    assert!(q.is_empty());
    assert_eq!(q.stats().expired, 3);
    assert_eq!(q.release_session(4), 0, "the expired task left its session");
    assert_eq!(q.ack(4, 3), Err(not_held(3, 4, Hold::NoTask)));
}

#[test]
fn ttr_returns_a_taken_task_to_ready() {
    let mut q = Queue::new();
    put(
        &mut q,
        T0,
        "x",
        PutOptions {
            ttr: Some(300),
            ..Default::default()
        },
    );
    put(&mut q, T0, "y", PutOptions::default());
    take(&mut q, T0 + 100, 1);
    assert_eq!(
        q.next_deadline(),
        Some(T0 + 400),
        "ttr counts from the take"
    );
    q.set_journal(true);
    let adv = q.advance(T0 + 400, 10);
    q.check_invariants();
    assert_eq!((adv.processed, adv.next_deadline), (1, None));
    assert_eq!(
        q.drain_events().collect::<Vec<_>>(),
        vec![Event::TtrReturned { id: 1 }]
    );
    assert_eq!(q.get(1).unwrap().status, Status::Ready);
    assert_eq!(
        q.ack(1, 1),
        Err(not_held(1, 1, Hold::Untaken(Status::Ready)))
    );
    assert_eq!(q.stats().ttr_returned, 1);
    assert_eq!(
        take(&mut q, T0 + 400, 2),
        Some(1),
        "back at its place, before 2"
    );
}

#[test]
fn advance_honours_the_budget_and_reports_work_left() {
    let mut q = Queue::new();
    for i in 0..10 {
        put(
            &mut q,
            T0,
            "x",
            PutOptions {
                delay: 10 + i,
                ..Default::default()
            },
        );
    }
    let now = T0 + 100;
    let adv = q.advance(now, 0);
    assert_eq!((adv.processed, adv.next_deadline), (0, Some(T0 + 10)));
    let adv = q.advance(now, 4);
    assert_eq!((adv.processed, adv.next_deadline), (4, Some(T0 + 14)));
    assert!(
        adv.next_deadline.unwrap() <= now,
        "work left shows as a deadline already due"
    );
    let adv = q.advance(now, 4);
    assert_eq!(adv.processed, 4);
    let adv = q.advance(now, 4);
    assert_eq!((adv.processed, adv.next_deadline), (2, None));
    q.check_invariants();
    assert_eq!(ready_ids(&mut q, 1), (1..=10).collect::<Vec<_>>());
}

#[test]
fn ties_on_time_fire_in_id_order_and_expiry_first() {
    let mut q = Queue::new();
    // Task 1 waits until exactly its expiry: it expires, never becomes ready.
    put(
        &mut q,
        T0,
        "a",
        PutOptions {
            delay: 50,
            ttl: Some(50),
            ..Default::default()
        },
    );
    put(
        &mut q,
        T0,
        "b",
        PutOptions {
            delay: 50,
            ..Default::default()
        },
    );
    q.set_journal(true);
    assert_eq!(q.advance(T0 + 50, 10).processed, 2);
    let ev: Vec<_> = q.drain_events().collect();
    assert_eq!(
        ev,
        vec![Event::Expired { id: 1 }, Event::Promoted { id: 2 }]
    );
}

#[test]
fn journal_records_every_change_in_order_only_when_on() {
    let mut q = Queue::new();
    put(&mut q, T0, "x", PutOptions::default());
    assert_eq!(q.drain_events().count(), 0, "off by default");
    q.set_journal(true);
    put(&mut q, T0, "y", PutOptions::default());
    take(&mut q, T0, 3);
    take(&mut q, T0, 3);
    q.ack(3, 1).unwrap();
    q.release(T0, 3, 2, 7).unwrap();
    q.advance(T0 + 7, 10);
    let ev: Vec<_> = q.drain_events().collect();
    assert_eq!(
        ev,
        vec![
            Event::Put { id: 2 },
            Event::Taken { id: 1, sid: 3 },
            Event::Taken { id: 2, sid: 3 },
            Event::Acked { id: 1 },
            Event::Released {
                id: 2,
                runat: T0 + 7
            },
            Event::Promoted { id: 2 },
        ]
    );
    assert_eq!(q.drain_events().count(), 0, "drained");
    q.set_journal(false);
    take(&mut q, T0, 3);
    assert_eq!(q.drain_events().count(), 0);
}

#[test]
fn stats_count_states_and_operations() {
    let mut q = Queue::new();
    put(&mut q, T0, "a", PutOptions::default());
    put(
        &mut q,
        T0,
        "b",
        PutOptions {
            delay: 5,
            ..Default::default()
        },
    );
    put(&mut q, T0, "c", PutOptions::default());
    take(&mut q, T0, 1);
    assert_eq!(
        q.stats(),
        Stats {
            total: 3,
            ready: 1,
            taken: 1,
            waiting: 1,
            puts: 3,
            takes: 1,
            ..Default::default()
        }
    );
}

#[test]
fn restore_rebuilds_state_silently() {
    let mut q = Queue::new();
    q.set_journal(true);
    let task = |id, status, runat| RestoredTask {
        id,
        status,
        runat,
        pri: 0,
        ttl: Some(1_000_000),
        ttr: Some(10),
        created: T0,
        data: data("r"),
    };
    q.restore(task(10, Status::Ready, 0)).unwrap();
    q.restore(task(12, Status::Waiting, T0 + 40)).unwrap();
    q.restore(task(11, Status::Taken, 0)).unwrap();
    q.check_invariants();
    assert_eq!(
        q.restore(task(11, Status::Ready, 0)),
        Err(QueueError::Duplicate(11))
    );
    assert_eq!(q.last_id(), 12);
    assert_eq!(
        q.get(11).unwrap().owner,
        Some(0),
        "restored Taken belongs to session 0"
    );
    assert_eq!(q.get(12).unwrap().runat, T0 + 40);
    assert_eq!(
        q.restore_status(99, Status::Ready, 0),
        Err(QueueError::NotFound(99))
    );
    q.restore_status(10, Status::Taken, 0).unwrap();
    q.restore_status(12, Status::Ready, 0).unwrap();
    q.check_invariants();
    assert_eq!(q.get(12).unwrap().runat, 0);
    assert_eq!(q.restore_remove(12).map(|t| t.id), Some(12));
    assert_eq!(q.restore_remove(12), None);
    assert_eq!(q.drain_events().count(), 0, "recovery journals nothing");
    assert_eq!(q.stats().puts, 0);
    assert_eq!(q.release_all_taken(), 2);
    q.check_invariants();
    assert_eq!(ready_ids(&mut q, 1), vec![10, 11]);
    q.set_last_id(100);
    q.set_last_id(50);
    assert_eq!(q.put(T0, data("n"), PutOptions::default()).id, 101);
}

#[test]
fn restore_remove_returns_the_task_as_it_was() {
    let mut q = Queue::new();
    put(
        &mut q,
        T0,
        "w",
        PutOptions {
            delay: 9,
            ..Default::default()
        },
    );
    let t = q.restore_remove(1).unwrap();
    assert_eq!(
        (t.status, t.runat, &*t.data),
        (Status::Waiting, T0 + 9, &b"w"[..])
    );
    assert_eq!(q.next_deadline(), None);
    q.check_invariants();
}

#[test]
fn iter_visits_every_task() {
    let mut q = Queue::new();
    for i in 0..20 {
        put(
            &mut q,
            T0,
            "x",
            PutOptions {
                delay: i % 3,
                ..Default::default()
            },
        );
    }
    take(&mut q, T0, 1);
    let mut ids: Vec<_> = q.iter().map(|t| t.id).collect();
    ids.sort();
    assert_eq!(ids, (1..=20).collect::<Vec<_>>());
    let copy = q.get(1).unwrap().to_task();
    assert_eq!(copy.status, Status::Taken);
}

#[test]
fn equal_deadlines_fire_by_number_then_id_past_the_heaps_32_bit_tie() {
    // Heap entries keep the task's number in its tube in 32 bits for ties; beyond it, and for
    // the same number in two tubes, they compare full keys. The named tube's puts come first
    // and the two tubes give the same numbers, so neither put order nor id order is the
    // order of firing.
    let mut q = Queue::new();
    let a = q
        .create_tube("a", TubeType::FifoTtl, TubeOptions::default())
        .unwrap();
    let near = (1u64 << 32) - 4;
    let numbers = TubeNumbers {
        next: near,
        legacy_below: 0,
        first: 0,
    };
    q.restore_tube_numbers(a, numbers).unwrap();
    let ttl = TubePut {
        ttl: Some(10),
        ..Default::default()
    };
    let mut want = vec![];
    for _ in 0..8 {
        let id = match q.put_in(T0, a, data("x"), ttl).unwrap() {
            PutOutcome::Created(t) => t.id,
            other => panic!("{other:?}"),
        };
        want.push(id);
    }
    let ttl = PutOptions {
        ttl: Some(10),
        ..Default::default()
    };
    q.set_last_id(near - 1);
    for _ in 0..8 {
        want.push(put(&mut q, T0, "x", ttl));
    }
    q.set_last_id(MAX_TASK_NUMBER - 5);
    for _ in 0..4 {
        want.push(put(&mut q, T0, "x", ttl));
    }
    want.sort_unstable_by_key(|&id| (id_number(id), id));
    assert_eq!(want[..2], [near, task_id(a, near)]);
    q.set_journal(true);
    for _ in 0..20 {
        assert_eq!(q.advance(T0 + 10, 1).processed, 1);
        q.check_invariants();
    }
    let ids: Vec<TaskId> = q
        .drain_events()
        .map(|e| match e {
            Event::Expired { id } => id,
            other => panic!("unexpected {other:?}"),
        })
        .collect();
    assert_eq!(ids, want);
}

#[test]
fn deep_lists_keep_order_through_releases_and_expiry() {
    // Enough tasks for tall skiplists; releases land in the middle, expiry removes anywhere.
    let mut q = Queue::new();
    for i in 0..3000u64 {
        let ttl = (i % 7 == 0).then_some(100 + i % 50);
        put(
            &mut q,
            T0,
            "x",
            PutOptions {
                pri: (i % 5) as i64,
                ttl,
                ..Default::default()
            },
        );
    }
    let mut taken = vec![];
    for _ in 0..1000 {
        taken.push(q.take(T0, 1).unwrap().id);
    }
    for id in taken.iter().step_by(3) {
        q.release(T0, 1, *id, 0).unwrap();
    }
    q.check_invariants();
    q.advance(T0 + 120, usize::MAX);
    q.check_invariants();
    let held = q.stats().taken as usize;
    assert!(held < 1000 - 334, "some taken tasks expired");
    assert_eq!(q.release_session(1), held);
    q.check_invariants();
    let mut last = (i64::MIN, 0);
    while let Some(t) = q.take(T0, 2) {
        assert!((t.pri, t.id) > last, "taken out of (pri, id) order");
        last = (t.pri, t.id);
    }
    q.check_invariants();
}

#[test]
fn reserve_keeps_every_task_and_makes_room() {
    const MORE: usize = 200_000;
    let mut q = Queue::new();
    let ids: Vec<TaskId> = (0..3)
        .map(|i| put(&mut q, T0, &format!("t{i}"), PutOptions::default()))
        .collect();
    take(&mut q, T0, 7);
    let before = q.overhead_bytes();
    q.reserve(MORE);
    q.check_invariants();
    // Arena and index room for MORE more (several arena chunks): a slot alone is 48 bytes.
    assert!(
        q.overhead_bytes() >= before + MORE * 48,
        "reserve grew {before} to only {}",
        q.overhead_bytes()
    );
    for &id in &ids {
        assert_eq!(
            q.get(id).map(|t| t.id),
            Some(id),
            "task {id} lost by reserve"
        );
    }
    assert_eq!(q.get(ids[0]).unwrap().owner, Some(7));
    for i in 0..MORE {
        q.put(T0, data(&format!("n{i}")), PutOptions::default());
    }
    q.check_invariants();
    assert_eq!(q.len(), MORE + 3);
    assert_eq!(q.release_session(7), 1);
    let first: Vec<_> = (0..3).filter_map(|_| take(&mut q, T0, 1)).collect();
    assert_eq!(first, ids);
}

// ---- the beanstalkd front-end's calls ----

fn put_in(q: &mut Queue, now: u64, tube: TubeIx, p: TubePut<'_>) -> TaskId {
    let id = match q.put_in(now, tube, data("b"), p).unwrap() {
        PutOutcome::Created(t) => t.id,
        other => panic!("a new task, got {other:?}"),
    };
    q.check_invariants();
    id
}

fn pri_delay(pri: i64, delay: u64) -> TubePut<'static> {
    TubePut {
        pri: Some(pri),
        delay,
        ..Default::default()
    }
}

fn first(q: &Queue, tube: TubeIx, status: Status) -> Option<TaskId> {
    q.peek_first(tube, status).unwrap().map(|t| t.id)
}

fn fifottl(q: &mut Queue, name: &str, opts: TubeOptions) -> TubeIx {
    let t = q.create_tube(name, TubeType::FifoTtl, opts).unwrap();
    q.check_invariants();
    t
}

#[test]
fn peek_first_names_the_next_task_of_each_status() {
    let mut q = Queue::new();
    let t = fifottl(&mut q, "b", TubeOptions::default());
    for status in [
        Status::Ready,
        Status::Taken,
        Status::Waiting,
        Status::Buried,
    ] {
        assert_eq!(
            q.peek_first(t, status),
            Ok(None),
            "{status:?} of an empty tube"
        );
    }
    let a = put_in(&mut q, T0, t, pri_delay(5, 0));
    let b = put_in(&mut q, T0, t, pri_delay(2, 0));
    // Waiting: by runat, not pri; ties by id.
    let late = put_in(&mut q, T0, t, pri_delay(-9, 300));
    let early = put_in(&mut q, T0, t, pri_delay(9, 100));
    let early_too = put_in(&mut q, T0, t, pri_delay(-1, 100));
    assert_eq!(first(&q, t, Status::Ready), Some(b));
    assert_eq!(first(&q, t, Status::Waiting), Some(early));
    let got = q.peek_first(t, Status::Waiting).unwrap().unwrap();
    assert_eq!((got.status, got.runat), (Status::Waiting, T0 + 100));
    q.kick_task(T0, early).unwrap();
    assert_eq!(first(&q, t, Status::Waiting), Some(early_too));
    q.kick_task(T0, early_too).unwrap();
    assert_eq!(first(&q, t, Status::Waiting), Some(late));
    // Buried: the one `kick` takes next, by (pri, id).
    q.bury(t, a).unwrap();
    q.bury(t, b).unwrap();
    assert_eq!(first(&q, t, Status::Buried), Some(b));
    // Ready is what `take_from` returns: now `early_too` (pri -1).
    assert_eq!(first(&q, t, Status::Ready), Some(early_too));
    assert_eq!(
        q.take_from(T0, t, 1).unwrap().map(|r| r.id),
        Some(early_too)
    );
    assert_eq!(q.peek_first(t, Status::Taken), Ok(None), "taken: no peek");
    // Peeking changes nothing.
    let before = q.tube_stats(t).unwrap();
    first(&q, t, Status::Ready);
    assert_eq!(q.tube_stats(t).unwrap(), before);
    q.check_invariants();
}

#[test]
fn peek_first_in_a_utube_tube_skips_busy_utubes() {
    let mut q = Queue::new();
    let t = q
        .create_tube("u", TubeType::UtubeTtl, TubeOptions::default())
        .unwrap();
    let key = |k: &'static [u8], pri| TubePut {
        utube: k,
        pri: Some(pri),
        ..Default::default()
    };
    let a1 = put_in(&mut q, T0, t, key(b"a", 0));
    let a2 = put_in(&mut q, T0, t, key(b"a", 0));
    let b1 = put_in(&mut q, T0, t, key(b"b", 1));
    assert_eq!(first(&q, t, Status::Ready), Some(a1), "the lowest head");
    q.take_from(T0, t, 1).unwrap();
    // a2 waits behind the busy utube `a`: the next take returns b1.
    assert_eq!(first(&q, t, Status::Ready), Some(b1));
    q.take_from(T0, t, 1).unwrap();
    assert_eq!(q.tube_stats(t).unwrap().ready, 1);
    assert_eq!(first(&q, t, Status::Ready), None, "every utube is busy");
    q.ack_in(t, 1, a1).unwrap();
    assert_eq!(first(&q, t, Status::Ready), Some(a2));
    q.check_invariants();
}

#[test]
fn peek_first_and_kicks_refuse_a_dead_tube() {
    let mut q = Queue::new();
    let t = fifottl(&mut q, "gone", TubeOptions::default());
    q.drop_tube(t).unwrap();
    for status in [
        Status::Ready,
        Status::Waiting,
        Status::Buried,
        Status::Taken,
    ] {
        assert_eq!(q.peek_first(t, status), Err(QueueError::TubeNotFound(t)));
    }
    assert_eq!(q.kick_delayed(T0, t, 5), Err(QueueError::TubeNotFound(t)));
    assert_eq!(q.ready_urgent(t), Err(QueueError::TubeNotFound(t)));
    assert_eq!(q.ready_urgent(999), Err(QueueError::TubeNotFound(999)));
}

#[test]
fn kick_delayed_makes_the_earliest_due_ready() {
    let mut q = Queue::new();
    let t = fifottl(
        &mut q,
        "d",
        TubeOptions {
            ttl: Some(1_000),
            ..Default::default()
        },
    );
    let c = put_in(&mut q, T0, t, pri_delay(0, 300));
    let a = put_in(&mut q, T0, t, pri_delay(7, 100));
    let b = put_in(&mut q, T0, t, pri_delay(3, 200));
    put_in(&mut q, T0, t, pri_delay(0, 0));
    q.bury(t, c).unwrap();
    q.set_journal(true);
    assert_eq!(q.kick_delayed(T0 + 1, t, 0), Ok(0));
    assert_eq!(q.kick_delayed(T0 + 1, t, 1), Ok(1));
    q.check_invariants();
    let got = q.get(a).unwrap();
    assert_eq!((got.status, got.runat), (Status::Ready, 0));
    // A buried task is not delayed: only `b` is left to kick.
    assert_eq!(q.kick_delayed(T0 + 1, t, 10), Ok(1));
    assert_eq!(q.kick_delayed(T0 + 1, t, 10), Ok(0));
    q.check_invariants();
    assert_eq!(
        q.drain_events().collect::<Vec<_>>(),
        vec![Event::Kicked { id: a }, Event::Kicked { id: b }]
    );
    let st = q.tube_stats(t).unwrap();
    assert_eq!((st.kicks, st.ready, st.waiting, st.buried), (2, 3, 0, 1));
    assert_eq!(st.promoted, 0, "a kick is not a promotion");
    // The TTL stays: the put's delay extended it to 1000 + 200 from T0.
    assert_eq!(q.get(b).unwrap().ttl, Some(1_200));
    assert_eq!(
        q.next_deadline(),
        Some(T0 + 1_000),
        "the undelayed task's expiry; no promotion left"
    );
    // The default tube, and the order of a tube with no TTL.
    let d1 = q
        .put(
            T0,
            data("x"),
            PutOptions {
                delay: 50,
                ..Default::default()
            },
        )
        .id;
    let d0 = q
        .put(
            T0,
            data("x"),
            PutOptions {
                delay: 40,
                pri: 9,
                ..Default::default()
            },
        )
        .id;
    assert_eq!(first(&q, DEFAULT_TUBE, Status::Waiting), Some(d0));
    assert_eq!(q.kick_delayed(T0, DEFAULT_TUBE, 1), Ok(1));
    assert_eq!(q.get(d0).unwrap().status, Status::Ready);
    assert_eq!(q.get(d1).unwrap().status, Status::Waiting);
    assert_eq!(q.stats().kicks, 1);
    q.check_invariants();
}

#[test]
fn kick_delayed_in_a_utube_tube_and_a_full_limfifottl() {
    let mut q = Queue::new();
    let u = q
        .create_tube("u", TubeType::UtubeTtl, TubeOptions::default())
        .unwrap();
    let p = |delay| TubePut {
        utube: b"k",
        delay,
        ..Default::default()
    };
    let first_k = put_in(&mut q, T0, u, p(0));
    let later_k = put_in(&mut q, T0, u, p(50));
    q.take_from(T0, u, 1).unwrap();
    // Kicked behind a busy utube: Ready, but not takeable until its utube is free.
    assert_eq!(q.kick_delayed(T0, u, 1), Ok(1));
    q.check_invariants();
    assert_eq!(q.get(later_k).unwrap().status, Status::Ready);
    assert!(!q.can_take(u));
    assert_eq!(q.ready_urgent(u), Ok(1));
    q.ack_in(u, 1, first_k).unwrap();
    assert!(q.can_take(u));
    // limfifottl at capacity: a kick moves a task, it adds none.
    let l = q
        .create_tube(
            "l",
            TubeType::LimFifoTtl,
            TubeOptions {
                capacity: 2,
                ..Default::default()
            },
        )
        .unwrap();
    put_in(&mut q, T0, l, pri_delay(0, 10));
    put_in(&mut q, T0, l, pri_delay(0, 20));
    assert_eq!(q.kick_delayed(T0, l, 2), Ok(2));
    assert!(matches!(
        q.put_in(T0, l, data("x"), TubePut::default()),
        Err(QueueError::TubeFull { capacity: 2, .. })
    ));
    q.check_invariants();
}

#[test]
fn kick_task_kicks_one_buried_or_delayed_task_of_any_tube() {
    let mut q = Queue::new();
    let t = fifottl(&mut q, "k", TubeOptions::default());
    let buried = put_in(&mut q, T0, t, pri_delay(4, 0));
    let delayed = put_in(&mut q, T0, t, pri_delay(1, 100));
    let ready = put_in(&mut q, T0, t, pri_delay(0, 0));
    let taken = put_in(&mut q, T0, t, pri_delay(-1, 0));
    assert_eq!(q.take_from(T0, t, 1).unwrap().map(|r| r.id), Some(taken));
    q.bury(t, buried).unwrap();
    q.set_journal(true);
    let got = q.kick_task(T0, buried).unwrap();
    assert_eq!((got.id, got.status, got.pri), (buried, Status::Ready, 4));
    let got = q.kick_task(T0, delayed).unwrap();
    assert_eq!((got.id, got.status, got.runat), (delayed, Status::Ready, 0));
    q.check_invariants();
    assert_eq!(q.next_deadline(), None, "its promotion is gone");
    let before = q.tube_stats(t).unwrap();
    assert_eq!(
        q.kick_task(T0, ready).unwrap_err(),
        QueueError::NotKickable {
            id: ready,
            status: Status::Ready
        }
    );
    assert_eq!(
        q.kick_task(T0, taken).unwrap_err().to_string(),
        format!("task {taken} is Taken: only a buried or delayed task can be kicked")
    );
    assert_eq!(q.kick_task(T0, 99), Err(QueueError::NotFound(99)));
    assert_eq!(
        q.tube_stats(t).unwrap(),
        before,
        "refused kicks change nothing"
    );
    assert_eq!(before.kicks, 2);
    assert_eq!(
        q.drain_events().collect::<Vec<_>>(),
        vec![Event::Kicked { id: buried }, Event::Kicked { id: delayed }]
    );
    // The default tube too.
    let d = q
        .put(
            T0,
            data("x"),
            PutOptions {
                delay: 5,
                ..Default::default()
            },
        )
        .id;
    assert_eq!(q.kick_task(T0, d).unwrap().status, Status::Ready);
    assert_eq!(q.stats().kicks, 1);
    q.check_invariants();
}

#[test]
fn touch_ttr_restarts_the_ttr_and_journals_nothing() {
    let mut q = Queue::new();
    let t = fifottl(
        &mut q,
        "t",
        TubeOptions {
            ttr: Some(100),
            ..Default::default()
        },
    );
    let id = put_in(&mut q, T0, t, TubePut::default());
    let plain = q.put(T0, data("no ttr"), PutOptions::default()).id;
    q.take_from(T0, t, 1).unwrap();
    assert_eq!(q.take(T0, 1).map(|r| r.id), Some(plain));
    assert_eq!(q.ttr_deadline(id), Some(T0 + 100));
    q.set_journal(true);
    let got = q.touch_ttr(T0 + 60, 1, id).unwrap();
    assert_eq!(
        (got.status, got.ttr, got.owner),
        (Status::Taken, Some(100), Some(1))
    );
    q.check_invariants();
    assert_eq!(q.ttr_deadline(id), Some(T0 + 160));
    assert_eq!(q.next_deadline(), Some(T0 + 160));
    assert_eq!(q.advance(T0 + 159, 10).processed, 0);
    assert_eq!(q.get(id).unwrap().status, Status::Taken);
    assert_eq!(
        q.drain_events().count(),
        0,
        "a TTR restart is not durable state"
    );
    assert_eq!(q.tube_stats(t).unwrap().touches, 1);
    // No TTR: nothing to restart, still answered (beanstalkd's `TOUCHED`).
    let got = q.touch_ttr(T0 + 60, 1, plain).unwrap();
    assert_eq!((got.id, got.ttr), (plain, None));
    assert_eq!(q.ttr_deadline(plain), None);
    assert_eq!(q.stats().touches, 1);
    assert_eq!(q.advance(T0 + 160, 10).processed, 1);
    assert_eq!(q.get(id).unwrap().status, Status::Ready);
    assert_eq!(q.ttr_deadline(id), None);
    q.check_invariants();
}

#[test]
fn touch_ttr_and_bury_taken_refuse_with_the_ack_errors() {
    let mut q = Queue::new();
    let t = fifottl(&mut q, "e", TubeOptions::default());
    let ready = put_in(&mut q, T0, t, TubePut::default());
    let held = put_in(&mut q, T0, t, pri_delay(-1, 0));
    let seed = q
        .put(
            T0,
            data("s"),
            PutOptions {
                pri: -1,
                ..Default::default()
            },
        )
        .id;
    assert_eq!(q.take_from(T0, t, 7).unwrap().map(|r| r.id), Some(held));
    assert_eq!(q.take(T0, 7).map(|r| r.id), Some(seed));
    let before = (q.tube_stats(t).unwrap(), q.stats());
    for (sid, id, err) in [
        (7, 99, not_held(99, 7, Hold::NoTask)),
        (7, ready, not_held(ready, 7, Hold::Untaken(Status::Ready))),
        (8, held, not_held(held, 8, Hold::TakenBy(7))),
        (8, seed, not_held(seed, 8, Hold::TakenBy(7))),
    ] {
        assert_eq!(q.touch_ttr(T0, sid, id).unwrap_err(), err);
        assert_eq!(q.bury_taken(sid, id, 5).unwrap_err(), err);
        // The same refusal the seed's ack gives (for a task of `default`).
        if id == seed || id == 99 {
            assert_eq!(q.ack(sid, id).unwrap_err(), err);
        }
        q.check_invariants();
    }
    assert_eq!((q.tube_stats(t).unwrap(), q.stats()), before);
}

#[test]
fn bury_taken_buries_with_the_new_pri() {
    let mut q = Queue::new();
    let t = fifottl(
        &mut q,
        "b",
        TubeOptions {
            ttr: Some(50),
            max_deliveries: 1,
            ..Default::default()
        },
    );
    let id = put_in(&mut q, T0, t, pri_delay(3, 0));
    let same = put_in(&mut q, T0, t, pri_delay(3, 0));
    q.take_from(T0, t, 1).unwrap();
    q.take_from(T0, t, 1).unwrap();
    q.set_journal(true);
    let got = q.bury_taken(1, id, 2_000).unwrap();
    assert_eq!(
        (got.status, got.pri, got.owner),
        (Status::Buried, 2_000, None)
    );
    q.check_invariants();
    assert_eq!(q.ttr_deadline(id), None);
    // The pri unchanged: no `Updated`, nothing to replace in the WAL.
    q.bury_taken(1, same, 3).unwrap();
    assert_eq!(
        q.drain_events().collect::<Vec<_>>(),
        vec![
            Event::Updated { id },
            Event::Buried { id },
            Event::Buried { id: same }
        ]
    );
    let st = q.tube_stats(t).unwrap();
    assert_eq!((st.buries, st.buried, st.taken), (2, 2, 0));
    assert_eq!(st.dead_lettered, 0, "a bury is not a dead letter");
    assert_eq!(q.next_deadline(), None, "no TTR left to fire");
    assert_eq!(q.soonest_ttr(1), None);
    // Kicked, it keeps the new pri: kicked after the other, taken after it.
    assert_eq!(first(&q, t, Status::Buried), Some(same));
    assert_eq!(q.kick(t, 2), Ok(2));
    assert_eq!(first(&q, t, Status::Ready), Some(same));
    q.check_invariants();
}

#[test]
fn bury_taken_ignores_the_pri_in_fifo_and_frees_a_utube() {
    let mut q = Queue::new();
    let f = q
        .create_tube("f", TubeType::Fifo, TubeOptions::default())
        .unwrap();
    let id = put_in(&mut q, T0, f, TubePut::default());
    q.take_from(T0, f, 1).unwrap();
    q.set_journal(true);
    assert_eq!(
        q.bury_taken(1, id, 77).unwrap().pri,
        0,
        "fifo tasks have no pri"
    );
    assert_eq!(
        q.drain_events().collect::<Vec<_>>(),
        vec![Event::Buried { id }]
    );
    let u = q
        .create_tube("u", TubeType::Utube, TubeOptions::default())
        .unwrap();
    let k = TubePut {
        utube: b"k",
        ..Default::default()
    };
    let a = put_in(&mut q, T0, u, k);
    let b = put_in(&mut q, T0, u, k);
    q.take_from(T0, u, 1).unwrap();
    assert!(!q.can_take(u));
    q.bury_taken(1, a, 0).unwrap();
    q.check_invariants();
    assert_eq!(
        first(&q, u, Status::Ready),
        Some(b),
        "the utube is free again"
    );
    // The default tube keeps the pri, as release does there.
    let d = q.put(T0, data("d"), PutOptions::default()).id;
    q.take(T0, 2).unwrap();
    assert_eq!(q.bury_taken(2, d, 9).unwrap().pri, 9);
    assert_eq!(q.stats().buries, 1);
    q.check_invariants();
}

#[test]
fn ttr_deadline_and_soonest_ttr_follow_the_sessions() {
    let mut q = Queue::new();
    let t = fifottl(&mut q, "s", TubeOptions::default());
    let ttr = |ttr| TubePut {
        ttr: Some(ttr),
        ..Default::default()
    };
    let a = put_in(&mut q, T0, t, ttr(300));
    let b = put_in(&mut q, T0, t, ttr(100));
    let c = put_in(&mut q, T0, t, TubePut::default());
    let other = put_in(&mut q, T0, t, ttr(10));
    assert_eq!(q.ttr_deadline(a), None, "ready");
    assert_eq!(q.ttr_deadline(99), None, "unknown");
    assert_eq!(q.soonest_ttr(1), None, "holds nothing");
    q.take_from(T0, t, 1).unwrap();
    q.take_from(T0 + 50, t, 1).unwrap();
    q.take_from(T0, t, 1).unwrap();
    q.take_from(T0, t, 2).unwrap();
    assert_eq!(q.ttr_deadline(a), Some(T0 + 300));
    assert_eq!(q.ttr_deadline(b), Some(T0 + 150));
    assert_eq!(q.ttr_deadline(c), None, "taken with no TTR");
    assert_eq!(q.soonest_ttr(1), Some(T0 + 150));
    assert_eq!(q.soonest_ttr(2), Some(T0 + 10));
    assert_eq!(q.soonest_ttr(3), None);
    q.touch_ttr(T0 + 290, 1, b).unwrap();
    assert_eq!(q.soonest_ttr(1), Some(T0 + 300));
    q.ack_in(t, 1, a).unwrap();
    assert_eq!(q.soonest_ttr(1), Some(T0 + 390));
    q.release_session(1);
    assert_eq!(q.soonest_ttr(1), None);
    assert_eq!(q.ttr_deadline(b), None);
    assert_eq!(q.ttr_deadline(other), Some(T0 + 10));
    q.check_invariants();
}

/// `ready_urgent` of a tube after each call, against a count over every task.
fn check_urgent(q: &Queue, t: TubeIx, want: u64) {
    q.check_invariants();
    let counted = q
        .iter()
        .filter(|r| r.tube == t && r.status == Status::Ready && r.pri < URGENT_PRI)
        .count() as u64;
    assert_eq!(counted, want, "the test's own count");
    assert_eq!(q.ready_urgent(t), Ok(want));
}

#[test]
fn ready_urgent_follows_every_transition() {
    let mut q = Queue::new();
    let t = fifottl(
        &mut q,
        "urgent",
        TubeOptions {
            ttr: Some(100),
            ..Default::default()
        },
    );
    check_urgent(&q, t, 0);
    let urgent = put_in(&mut q, T0, t, pri_delay(URGENT_PRI - 1, 0));
    let calm = put_in(&mut q, T0, t, pri_delay(URGENT_PRI, 0));
    check_urgent(&q, t, 1);
    let delayed = put_in(&mut q, T0, t, pri_delay(0, 10));
    check_urgent(&q, t, 1);
    q.advance(T0 + 10, 10); // promoted
    check_urgent(&q, t, 2);
    assert_eq!(q.take_from(T0 + 10, t, 1).unwrap().unwrap().id, delayed);
    check_urgent(&q, t, 1);
    // Released with a pri past the line: ready, not urgent.
    let o = ReleaseOptions {
        pri: Some(URGENT_PRI + 5),
        ..Default::default()
    };
    q.release_in(T0 + 10, t, 1, delayed, o).unwrap();
    check_urgent(&q, t, 1);
    q.bury(t, urgent).unwrap();
    check_urgent(&q, t, 0);
    q.kick(t, 1).unwrap();
    check_urgent(&q, t, 1);
    // Taken, then buried urgent by its holder, then kicked.
    assert_eq!(q.take_from(T0 + 10, t, 1).unwrap().unwrap().id, urgent);
    check_urgent(&q, t, 0);
    q.bury_taken(1, urgent, 3).unwrap();
    check_urgent(&q, t, 0);
    q.kick_task(T0 + 10, urgent).unwrap();
    check_urgent(&q, t, 1);
    // TTR return.
    q.take_from(T0 + 10, t, 1).unwrap();
    check_urgent(&q, t, 0);
    q.advance(T0 + 110, 10);
    check_urgent(&q, t, 1);
    // Taken and given back by a session close.
    q.take_from(T0 + 110, t, 2).unwrap();
    check_urgent(&q, t, 0);
    q.release_session(2);
    check_urgent(&q, t, 1);
    // Kicked from delayed.
    let d = put_in(&mut q, T0 + 110, t, pri_delay(1, 50));
    q.kick_delayed(T0 + 110, t, 1).unwrap();
    check_urgent(&q, t, 2);
    q.delete(t, d).unwrap();
    check_urgent(&q, t, 1);
    // Expiry of a ready task.
    put_in(
        &mut q,
        T0 + 110,
        t,
        TubePut {
            ttl: Some(5),
            ..Default::default()
        },
    );
    check_urgent(&q, t, 2);
    q.advance(T0 + 115, 10);
    check_urgent(&q, t, 1);
    assert_eq!(
        q.get(calm).unwrap().status,
        Status::Ready,
        "ready all along, never urgent"
    );
    assert_eq!(q.tube_stats(t).unwrap().ready, 3);
    q.truncate(t).unwrap();
    check_urgent(&q, t, 0);
}

#[test]
fn ready_urgent_counts_utube_tasks_behind_a_busy_utube() {
    let mut q = Queue::new();
    let u = q
        .create_tube("u", TubeType::UtubeTtl, TubeOptions::default())
        .unwrap();
    let p = |key: &'static [u8], pri| TubePut {
        utube: key,
        pri: Some(pri),
        ..Default::default()
    };
    let a1 = put_in(&mut q, T0, u, p(b"a", 0));
    put_in(&mut q, T0, u, p(b"a", 1));
    put_in(&mut q, T0, u, p(b"a", URGENT_PRI));
    put_in(&mut q, T0, u, p(b"b", 2));
    check_urgent(&q, u, 3);
    q.take_from(T0, u, 1).unwrap(); // a1: `a` busy, its two others wait
    check_urgent(&q, u, 2);
    assert_eq!(q.tube_stats(u).unwrap().ready, 3);
    q.release_in(T0, u, 1, a1, ReleaseOptions::default())
        .unwrap();
    check_urgent(&q, u, 3);
    q.take_from(T0, u, 1).unwrap();
    q.release_session(1);
    check_urgent(&q, u, 3);
    // A task head of its utube deleted: the next one takes its place, still counted once.
    q.delete(u, a1).unwrap();
    check_urgent(&q, u, 2);
    // fifo tubes have no pri: every ready task is urgent (pri 0), as in beanstalkd at pri 0.
    let f = q
        .create_tube("f", TubeType::Fifo, TubeOptions::default())
        .unwrap();
    put_in(&mut q, T0, f, p(b"", URGENT_PRI + 1));
    check_urgent(&q, f, 1);
}

#[test]
fn ready_urgent_survives_a_restore() {
    let mut q = Queue::new();
    let task = |id, status, pri| RestoredTask {
        id,
        status,
        runat: if status == Status::Waiting { T0 } else { 0 },
        pri,
        ttl: None,
        ttr: None,
        created: T0,
        data: data("r"),
    };
    q.restore(task(1, Status::Ready, 0)).unwrap();
    q.restore(task(2, Status::Ready, URGENT_PRI)).unwrap();
    q.restore(task(3, Status::Taken, 1)).unwrap();
    q.restore(task(4, Status::Buried, 1)).unwrap();
    q.restore(task(5, Status::Waiting, 1)).unwrap();
    check_urgent(&q, DEFAULT_TUBE, 1);
    q.release_all_taken();
    check_urgent(&q, DEFAULT_TUBE, 2);
    q.restore_status(4, Status::Ready, 0).unwrap();
    check_urgent(&q, DEFAULT_TUBE, 3);
    q.restore_remove(1);
    check_urgent(&q, DEFAULT_TUBE, 2);
}

#[test]
fn a_deep_waiting_list_kicks_in_runat_order() {
    let mut q = Queue::new();
    let mut x: u64 = 0x2545_F491_4F6C_DD1D;
    let mut due = vec![];
    for i in 0..3000u64 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        // Few distinct delays, so ties by id occur; pri runs against the delay.
        let delay = 1 + x % 500;
        let o = PutOptions {
            delay,
            pri: -(delay as i64),
            ..Default::default()
        };
        let id = q.put(T0 + i, data("w"), o).id;
        due.push((T0 + i + delay, id));
    }
    q.check_invariants();
    due.sort_unstable();
    assert_eq!(first(&q, DEFAULT_TUBE, Status::Waiting), Some(due[0].1));
    assert_eq!(q.kick_delayed(T0, DEFAULT_TUBE, 1000), Ok(1000));
    q.check_invariants();
    for (i, &(_, id)) in due.iter().enumerate() {
        let want = if i < 1000 {
            Status::Ready
        } else {
            Status::Waiting
        };
        assert_eq!(q.get(id).unwrap().status, want, "the {i}th due");
    }
    assert_eq!(first(&q, DEFAULT_TUBE, Status::Waiting), Some(due[1000].1));
}

mod take_task {
    use super::*;

    #[test]
    fn takes_a_ready_delayed_or_buried_task_by_id_and_arms_its_ttr() {
        let mut q = Queue::new();
        let now = 1_000;
        let t = q
            .create_tube("b", TubeType::FifoTtl, TubeOptions::default())
            .unwrap();
        let put = |q: &mut Queue, delay| {
            let opts = TubePut {
                delay,
                ttr: Some(50),
                ..Default::default()
            };
            match q.put_in(now, t, Box::new([0xa1, b'x']), opts).unwrap() {
                PutOutcome::Created(r) => r.id,
                other => panic!("{other:?}"),
            }
        };
        let ready = put(&mut q, 0);
        let delayed = put(&mut q, 1_000);
        let buried = put(&mut q, 0);
        q.bury(t, buried).unwrap();
        for id in [delayed, buried, ready] {
            let got = q.take_task(now, 7, id).unwrap();
            assert_eq!(
                (got.id, got.status, got.owner),
                (id, Status::Taken, Some(7))
            );
            assert_eq!(q.ttr_deadline(id), Some(now + 50));
            q.check_invariants();
        }
        assert_eq!(q.tube_stats(t).unwrap().taken, 3);
        // Taken already, or gone: refused.
        assert!(matches!(
            q.take_task(now, 8, ready),
            Err(QueueError::NotTakeable { .. })
        ));
        assert_eq!(q.take_task(now, 8, 999), Err(QueueError::NotFound(999)));
        // Each comes back ready when its session ends.
        assert_eq!(q.release_session(7), 3);
        q.check_invariants();
    }

    #[test]
    fn a_utube_task_is_taken_by_id_only_as_its_utubes_free_head() {
        let mut q = Queue::new();
        let t = q
            .create_tube("u", TubeType::Utube, TubeOptions::default())
            .unwrap();
        let put = |q: &mut Queue| match q
            .put_in(
                0,
                t,
                Box::new([0xc0]),
                TubePut {
                    utube: b"k",
                    ..Default::default()
                },
            )
            .unwrap()
        {
            PutOutcome::Created(r) => r.id,
            other => panic!("{other:?}"),
        };
        let head = put(&mut q);
        let second = put(&mut q);
        assert!(matches!(
            q.take_task(0, 1, second),
            Err(QueueError::NotTakeable { .. })
        ));
        q.take_task(0, 1, head).unwrap();
        q.check_invariants();
        // Busy now: not even its next task.
        assert!(q.take_task(0, 2, second).is_err());
        q.ack_in(t, 1, head).unwrap();
        q.take_task(0, 2, second).unwrap();
        q.check_invariants();
    }
}

#[test]
fn take_events_hands_over_the_events_in_order_and_the_buffers_take_turns() {
    let mut q = Queue::new();
    q.set_journal(true);
    let mut out = Vec::new();
    q.take_events(&mut out);
    assert!(out.is_empty(), "nothing happened yet");
    for _ in 0..3 {
        put(&mut q, T0, "x", PutOptions::default());
    }
    take(&mut q, T0, 1);
    q.release_session(1);
    q.take_events(&mut out);
    assert_eq!(out.len(), 5, "three puts, a take, a release: {out:?}");
    assert_eq!(out[4], Event::AutoReleased { id: 1 }, "{out:?}");
    // The caller empties its buffer and hands it back: the journal starts empty from it.
    out.clear();
    q.take_events(&mut out);
    assert!(out.is_empty(), "taken once: {out:?}");
    take(&mut q, T0, 2);
    q.take_events(&mut out);
    assert_eq!(
        out.len(),
        1,
        "only the events since the last hand-over: {out:?}"
    );
    assert_eq!(q.drain_events().count(), 0);
}
