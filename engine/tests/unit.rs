//! Unit tests of the engine's public API: each error message (worded as in API.md) and each
//! transition (put, take, ack, release, session close, promote, expire, TTR, recovery), with
//! `check_invariants()` after every step that changes the queue.

use tarq_engine::{
    Event, PutOptions, Queue, QueueError, RestoredTask, Stats, Status, Task, TaskId,
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

#[test]
fn error_messages_match_the_seed() {
    let cases = [
        (QueueError::NotFound(5), "Task {5} was not found"),
        (QueueError::NotTaken(1), "Task 1 not taken by anybody"),
        (
            QueueError::NotOwner {
                id: 1,
                owner: 7,
                caller: 8,
            },
            "Task 1 taken by 7. Not you (8)",
        ),
        (QueueError::Duplicate(3), "Task 3 already exists"),
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
        vec![0xa5, b'h', b'e', b'l', b'l', b'o'].into(),
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
    assert_eq!(q.ack(1, 1), Err(QueueError::NotFound(1)));
}

#[test]
fn ack_and_release_refuse_with_the_seed_errors() {
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
        (7, 99, QueueError::NotFound(99)),
        (7, 1, QueueError::NotTaken(1)),
        (7, 2, QueueError::NotTaken(2)),
        (
            8,
            3,
            QueueError::NotOwner {
                id: 3,
                owner: 7,
                caller: 8,
            },
        ),
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
    assert_eq!(q.ack(4, 3), Err(QueueError::NotFound(3)));
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
    assert_eq!(q.ack(1, 1), Err(QueueError::NotTaken(1)));
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
fn ids_past_32_bits_still_fire_in_id_order() {
    // Heap entries keep a 32-bit copy of the id for ties; beyond it they compare full ids.
    let mut q = Queue::new();
    q.set_last_id(u64::from(u32::MAX) - 3);
    for _ in 0..8 {
        put(
            &mut q,
            T0,
            "x",
            PutOptions {
                ttl: Some(10),
                ..Default::default()
            },
        );
    }
    q.set_last_id(u64::MAX - 20);
    for _ in 0..4 {
        put(
            &mut q,
            T0,
            "x",
            PutOptions {
                ttl: Some(10),
                ..Default::default()
            },
        );
    }
    q.set_journal(true);
    for _ in 0..12 {
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
    let first = u64::from(u32::MAX) - 2;
    let want: Vec<TaskId> = (first..first + 8)
        .chain(u64::MAX - 19..u64::MAX - 15)
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
    // Arena and index room for MORE more (several arena chunks): a slot alone is well over
    // 64 bytes.
    assert!(
        q.overhead_bytes() >= before + MORE * 64,
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
