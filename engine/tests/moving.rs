//! Moving a tube's tasks to another node, case by case: a task of each status comes across
//! exactly (its Taken owner the importer's, its TTR deadline kept, its wake-up kept); an
//! import is journaled and counts no operation; a second import of an id, an id of another
//! numbering, a Taken task of a busy utube and a full queue are refused with nothing changed;
//! the numbering and the dedup keys come across; export pages are in id order whether the
//! tube's ids are dense or sparse (the arena walk). The property test over random queues is
//! `moved_copy_matches` in model.rs.

use tarq_engine::{
    id_number, task_id, Event, MovedDedup, MovedTask, PutOutcome, Queue, QueueError,
    ReleaseOptions, SessionId, Status, TaskId, TubeIx, TubeOptions, TubePut, TubeType,
    EXPORT_MIN_PROBES,
};

const T0: u64 = 1_700_000_000_000_000;

/// A fifottl tube at index 1 on a fresh queue, as both ends of a move hold it.
fn node(opts: TubeOptions, kind: TubeType) -> (Queue, TubeIx) {
    let mut q = Queue::new();
    q.set_journal(true);
    assert_eq!(q.create_tube_at(1, "moved", kind, opts, 0), Ok(true));
    q.drain_events().for_each(drop);
    (q, 1)
}

fn put(q: &mut Queue, tube: TubeIx, p: TubePut<'_>) -> TaskId {
    match q.put_in(T0, tube, b"payload".to_vec(), p) {
        Ok(PutOutcome::Created(t)) => t.id,
        other => panic!("a new task, got {other:?}"),
    }
}

/// Every page of `tube`, `limit` tasks at a time.
fn export_all(q: &Queue, tube: TubeIx, limit: usize) -> Vec<MovedTask> {
    let mut out: Vec<MovedTask> = Vec::new();
    loop {
        let page = q
            .export_tube(tube, out.last().map(|t| t.id), limit, usize::MAX)
            .unwrap();
        assert!(page.len() <= limit, "a page of {} past {limit}", page.len());
        if page.is_empty() {
            return out;
        }
        out.extend(page);
    }
}

const TTL: u64 = 1_000;
const TTR: u64 = 50;

/// A source holding one task of each status (the taken one by session 7, released once
/// before so it has counters), and the copy of its tube on a fresh node.
fn moved_pair() -> (Queue, Queue, [TaskId; 4]) {
    let opts = TubeOptions {
        ttl: Some(TTL),
        ttr: Some(TTR),
        ..TubeOptions::default()
    };
    let (mut src, t) = node(opts, TubeType::FifoTtl);
    let taken = put(&mut src, t, TubePut::default());
    let ready = put(&mut src, t, TubePut::default());
    let buried = put(&mut src, t, TubePut::default());
    let waiting = put(
        &mut src,
        t,
        TubePut {
            delay: 30,
            pri: Some(-3),
            ..TubePut::default()
        },
    );
    assert_eq!(src.take_from(T0, t, 7).unwrap().map(|t| t.id), Some(taken));
    src.release_in(T0 + 1, t, 7, taken, ReleaseOptions::default())
        .unwrap();
    assert_eq!(
        src.take_from(T0 + 2, t, 7).unwrap().map(|t| t.id),
        Some(taken)
    );
    src.bury(t, buried).unwrap();
    src.drain_events().for_each(drop);

    let (mut dst, _) = node(opts, TubeType::FifoTtl);
    for task in export_all(&src, t, 3) {
        dst.import_task(t, task, 70).unwrap();
        dst.check_invariants();
    }
    (src, dst, [ready, taken, waiting, buried])
}

#[test]
fn a_task_of_each_status_comes_across_as_it_was() {
    let (src, dst, [ready, taken, waiting, buried]) = moved_pair();
    let t = 1;
    for (id, status) in [
        (ready, Status::Ready),
        (taken, Status::Taken),
        (waiting, Status::Waiting),
        (buried, Status::Buried),
    ] {
        let (a, b) = (src.get(id).unwrap(), dst.get(id).unwrap());
        assert_eq!(b.status, status);
        let owner = |o: Option<SessionId>| o.map(|_| 70);
        // Everything but the session holding it, which is the importer's.
        assert_eq!(
            tarq_engine::TaskRef {
                owner: owner(a.owner),
                ..a
            },
            b,
            "{status:?} task"
        );
    }
    let held = dst.get(taken).unwrap();
    assert_eq!((held.owner, held.deliveries), (Some(70), 2));
    assert_eq!(held.counts.releases, 1, "its counters came along");
    assert_eq!(
        dst.ttr_deadline(taken),
        Some(T0 + 2 + TTR),
        "TTR deadline kept"
    );
    assert_eq!(dst.ttr_deadline(taken), src.ttr_deadline(taken));
    assert_eq!(dst.soonest_ttr(70), Some(T0 + 2 + TTR));
    assert_eq!(
        dst.get(waiting).unwrap().runat,
        T0 + 30,
        "wakes when it would have"
    );
    assert_eq!(dst.next_deadline(), src.next_deadline());
    // The owner may ack it; the session that held it on the old node holds nothing here.
    let mut dst = dst;
    assert!(matches!(
        dst.ack_in(t, 7, taken),
        Err(QueueError::NotHeld { .. })
    ));
    assert_eq!(dst.ack_in(t, 70, taken).map(|t| t.id), Ok(taken));
}

#[test]
fn deadlines_fire_on_the_copy_as_on_the_original() {
    let (mut src, mut dst, [_, taken, waiting, _]) = moved_pair();
    for q in [&mut src, &mut dst] {
        q.drain_events().for_each(drop);
        q.advance(T0 + 60, usize::MAX);
    }
    let (a, b): (Vec<Event>, Vec<Event>) =
        (src.drain_events().collect(), dst.drain_events().collect());
    assert_eq!(
        a,
        [
            Event::Promoted { id: waiting },
            Event::TtrReturned { id: taken }
        ]
    );
    assert_eq!(b, a);
    for q in [&mut src, &mut dst] {
        q.advance(T0 + 10 * TTL, usize::MAX);
        assert!(q.is_empty(), "every task expired at its TTL");
    }
}

#[test]
fn an_import_is_journaled_and_counts_no_operation() {
    let (src, mut dst, ids) = moved_pair();
    let events: Vec<Event> = dst.drain_events().collect();
    let mut want: Vec<Event> = ids.iter().map(|&id| Event::Imported { id }).collect();
    want.sort_by_key(|e| match e {
        Event::Imported { id } => *id,
        _ => unreachable!(),
    });
    assert_eq!(events, want, "one event a task, in id order");
    let (a, b) = (src.tube_stats(1).unwrap(), dst.tube_stats(1).unwrap());
    assert_eq!(
        (b.total, b.ready, b.taken, b.waiting, b.buried),
        (a.total, a.ready, a.taken, a.waiting, a.buried)
    );
    assert_eq!(
        (b.puts, b.takes, b.releases, b.buries),
        (0, 0, 0, 0),
        "the operations happened on the old node"
    );
}

#[test]
fn an_id_live_already_is_refused_and_nothing_changes() {
    let (src, mut dst, [ready, taken, ..]) = moved_pair();
    dst.drain_events().for_each(drop);
    for id in [ready, taken] {
        let again = src
            .export_tube(1, Some(id - 1), 1, usize::MAX)
            .unwrap()
            .remove(0);
        assert_eq!(
            dst.import_task(1, again, 70),
            Err(QueueError::Duplicate(id))
        );
    }
    assert_eq!(dst.len(), 4);
    assert_eq!(dst.drain_events().count(), 0);
    dst.check_invariants();
}

#[test]
fn the_numbering_rises_past_an_imported_id() {
    let (mut src, t) = node(TubeOptions::default(), TubeType::Fifo);
    let ids: Vec<TaskId> = (0..5)
        .map(|_| put(&mut src, t, TubePut::default()))
        .collect();
    let (mut dst, _) = node(TubeOptions::default(), TubeType::Fifo);
    let last = src.export_tube(t, Some(ids[3]), 10, usize::MAX).unwrap();
    assert_eq!(last.len(), 1);
    dst.import_task(t, last[0].clone(), 0).unwrap();
    assert_eq!(id_number(put(&mut dst, t, TubePut::default())), 5);
}

#[test]
fn import_numbers_carries_the_numbers_of_tasks_gone_and_checks_first() {
    let (mut src, t) = node(TubeOptions::default(), TubeType::Fifo);
    for _ in 0..3 {
        let id = put(&mut src, t, TubePut::default());
        src.delete(t, id).unwrap();
    }
    let (mut dst, _) = node(TubeOptions::default(), TubeType::Fifo);
    assert_eq!(dst.import_numbers(t, src.tube_numbers(t)), Ok(true));
    assert_eq!(
        dst.drain_events().collect::<Vec<_>>(),
        [Event::TubeCreated { tube: t }],
        "journaled as the tube's record"
    );
    assert_eq!(dst.import_numbers(t, src.tube_numbers(t)), Ok(false));
    assert_eq!(
        dst.drain_events().count(),
        0,
        "nothing changed, nothing logged"
    );
    assert_eq!(id_number(put(&mut dst, t, TubePut::default())), 3);
    // A copy made numbering from elsewhere would show other numbers: refused.
    let mut elsewhere = src.tube_numbers(t);
    elsewhere.first = 2;
    assert_eq!(
        dst.import_numbers(t, elsewhere),
        Err(QueueError::TubeNumbering { tube: t, first: 2 })
    );
}

#[test]
fn ids_of_another_numbering_or_a_missing_tube_are_refused() {
    let (src, dst_pair, _) = moved_pair();
    let mut dst = dst_pair;
    let task = src.export_tube(1, None, 1, usize::MAX).unwrap().remove(0);
    assert_eq!(
        dst.import_task(9, task.clone(), 0),
        Err(QueueError::TubeNotFound(9))
    );
    dst.create_tube_at(2, "other", TubeType::FifoTtl, TubeOptions::default(), 0)
        .unwrap();
    assert_eq!(
        dst.import_task(2, task.clone(), 0),
        Err(QueueError::IdNotOfTube {
            id: task.id,
            tube: 2
        })
    );
}

#[test]
fn a_taken_task_of_a_utube_taken_here_already_is_refused() {
    let (mut src, t) = node(TubeOptions::default(), TubeType::Utube);
    let key = TubePut {
        utube: b"k",
        ..TubePut::default()
    };
    let first = put(&mut src, t, key);
    let second = put(&mut src, t, key);
    src.take_from(T0, t, 1).unwrap();
    let exported = export_all(&src, t, 10);
    assert_eq!(exported[0].utube.as_deref(), Some(&b"k"[..]));

    let (mut dst, _) = node(TubeOptions::default(), TubeType::Utube);
    // The second first: it waits behind nothing, and is the utube's head.
    dst.import_task(t, exported[1].clone(), 5).unwrap();
    assert!(dst.can_take(t));
    // The taken one makes it wait, as on the old node.
    dst.import_task(t, exported[0].clone(), 5).unwrap();
    dst.check_invariants();
    assert!(!dst.can_take(t), "its utube is busy");
    assert_eq!(dst.get(first).unwrap().owner, Some(5));
    assert_eq!(dst.ack_in(t, 5, first).map(|t| t.id), Ok(first));
    assert_eq!(dst.take_from(T0, t, 5).unwrap().map(|t| t.id), Some(second));
    // A second taken task of the utube would break its one-at-a-time rule.
    let mut again = exported[0].clone();
    again.id = task_id(t, 10);
    assert_eq!(
        dst.import_task(t, again, 5),
        Err(QueueError::NotTakeable {
            id: task_id(t, 10),
            status: Status::Taken
        })
    );
    dst.check_invariants();
}

#[test]
fn a_full_queue_refuses_an_import() {
    let (src, _, _) = moved_pair();
    let (mut dst, t) = node(
        TubeOptions {
            ttl: Some(TTL),
            ttr: Some(TTR),
            ..TubeOptions::default()
        },
        TubeType::FifoTtl,
    );
    dst.set_max_tasks(1);
    let mut tasks = export_all(&src, t, 10).into_iter();
    dst.import_task(t, tasks.next().unwrap(), 0).unwrap();
    assert_eq!(
        dst.import_task(t, tasks.next().unwrap(), 0),
        Err(QueueError::TooManyTasks { max: 1 })
    );
}

#[test]
fn dedup_keys_come_across_and_answer_a_retry() {
    let opts = TubeOptions {
        dedup_window: 100,
        ..TubeOptions::default()
    };
    let (mut src, t) = node(opts, TubeType::FifoTtl);
    let keys: [&[u8]; 3] = [b"a", b"b", b"c"];
    let ids: Vec<TaskId> = keys
        .iter()
        .map(|k| {
            put(
                &mut src,
                t,
                TubePut {
                    dedup_key: Some(k),
                    ..TubePut::default()
                },
            )
        })
        .collect();
    src.delete(t, ids[2]).unwrap();
    let mut entries: Vec<MovedDedup> = Vec::new();
    loop {
        let page = src
            .export_dedup(t, entries.last().map(|e| e.seq), 2)
            .unwrap();
        if page.is_empty() {
            break;
        }
        entries.extend(page);
    }
    let got: Vec<(&[u8], TaskId)> = entries.iter().map(|e| (&e.key[..], e.id)).collect();
    assert_eq!(got, [(&b"a"[..], ids[0]), (b"b", ids[1]), (b"c", ids[2])]);

    let (mut dst, _) = node(opts, TubeType::FifoTtl);
    for task in export_all(&src, t, 10) {
        dst.import_task(t, task, 0).unwrap();
    }
    for e in entries {
        dst.import_dedup(t, e).unwrap();
    }
    dst.check_invariants();
    let retry = |q: &mut Queue, key: &[u8]| match q.put_in(
        T0 + 1,
        t,
        b"again".to_vec(),
        TubePut {
            dedup_key: Some(key),
            ..TubePut::default()
        },
    ) {
        Ok(PutOutcome::Duplicate(task)) => Some(task.id),
        Ok(PutOutcome::DuplicateDone(id)) => Some(id),
        Ok(PutOutcome::Created(_)) => None,
        Err(e) => panic!("{e}"),
    };
    assert_eq!(retry(&mut dst, b"a"), Some(ids[0]));
    // The key of a task already done names it still, and its id is never given again.
    assert_eq!(retry(&mut dst, b"c"), Some(ids[2]));
    assert!(id_number(put(&mut dst, t, TubePut::default())) > id_number(ids[2]));
}

#[test]
fn pages_are_in_id_order_in_a_dense_and_a_sparse_tube() {
    let (mut q, t) = node(TubeOptions::default(), TubeType::Fifo);
    let other = (q.create_tube("other", TubeType::Fifo, TubeOptions::default())).unwrap();
    let mut kept = Vec::new();
    // Sparse: runs of deleted ids longer than a page's probes, so pages walk the arena;
    // tasks of another tube among them.
    let gap = EXPORT_MIN_PROBES as u64 * 3;
    for n in 0..4 * gap {
        let id = put(&mut q, t, TubePut::default());
        put(&mut q, other, TubePut::default());
        if n % gap == gap - 1 || n < 5 {
            kept.push(id);
        } else {
            q.delete(t, id).unwrap();
        }
    }
    for limit in [1, 2, 3, 100] {
        let ids: Vec<TaskId> = export_all(&q, t, limit).iter().map(|t| t.id).collect();
        assert_eq!(ids, kept, "pages of {limit}");
    }
    // A page starting after an id that is gone starts at the next live one.
    let from = q.export_tube(t, Some(kept[5] - 1), 1, usize::MAX).unwrap();
    assert_eq!(from[0].id, kept[5]);
    assert_eq!(
        q.export_tube(t, Some(*kept.last().unwrap()), 9, usize::MAX),
        Ok(vec![])
    );
    assert_eq!(q.export_tube(t, None, 0, usize::MAX), Ok(vec![]));
    assert_eq!(
        q.export_tube(7, None, 1, usize::MAX),
        Err(QueueError::TubeNotFound(7))
    );
}

#[test]
fn a_task_that_changed_after_its_copy_is_sent_again_and_replaces_it() {
    let (mut src, t) = node(TubeOptions::default(), TubeType::FifoTtl);
    let (mut dst, _) = node(TubeOptions::default(), TubeType::FifoTtl);
    let a = put(&mut src, t, TubePut::default());
    let b = put(&mut src, t, TubePut::default());
    for task in export_all(&src, t, 10) {
        dst.import_task(t, task, 0).unwrap();
    }
    // After the copy: a is taken, b is acked.
    let sid: SessionId = 3;
    assert_eq!(src.take_from(T0, t, sid).unwrap().map(|x| x.id), Some(a));
    src.delete(t, b).unwrap();
    dst.drain_events().for_each(drop);
    let deletes_before = dst.tube_stats(t).unwrap();
    // a again as it is now; b gone.
    let now_a = src.export_task(t, a).expect("a is there");
    assert_eq!(now_a.status, Status::Taken);
    assert_eq!(src.export_task(t, b), None);
    dst.remove_moved(t, a).unwrap();
    dst.import_task(t, now_a, 9).unwrap();
    dst.remove_moved(t, b).unwrap();
    let again = dst.remove_moved(t, b);
    assert!(again.is_err(), "a second removal finds nothing: {again:?}");
    let got = dst.get(a).unwrap();
    assert_eq!((got.status, got.owner), (Status::Taken, Some(9)));
    assert!(dst.get(b).is_none());
    let after = dst.tube_stats(t).unwrap();
    assert_eq!(after.total, 1);
    assert_eq!(after.taken, 1);
    // Replacing counts no operation.
    assert_eq!(after.deletes, deletes_before.deletes);
    let logged: Vec<Event> = dst.drain_events().collect();
    assert!(logged.contains(&Event::Deleted { id: b }), "{logged:?}");
    dst.check_invariants();
}

#[test]
fn a_moved_away_tube_is_forgotten_a_batch_at_a_time_and_logged_once() {
    let (mut q, t) = node(TubeOptions::default(), TubeType::FifoTtl);
    let ids: Vec<TaskId> = (0..10)
        .map(|_| put(&mut q, t, TubePut::default()))
        .collect();
    q.take_from(T0, t, 4).unwrap();
    q.drain_events().for_each(drop);
    let mut after = None;
    loop {
        let page = q.tube_ids(t, after, 3).unwrap();
        let Some(&last) = page.last() else { break };
        for id in page {
            q.forget_moved(t, id).unwrap();
        }
        q.check_invariants();
        after = Some(last);
    }
    assert!(ids.iter().all(|&id| q.get(id).is_none()));
    assert_eq!(q.tube_stats(t).unwrap().total, 0);
    assert_eq!(
        q.drain_events().count(),
        0,
        "forgetting logs nothing of its own"
    );
    q.truncate(t).unwrap();
    let logged: Vec<Event> = q.drain_events().collect();
    assert_eq!(logged, [Event::TubeTruncated { tube: t }]);
}

#[test]
fn a_page_ends_once_its_payloads_reach_the_byte_bound_and_holds_one_task_at_least() {
    let mut q = Queue::new();
    let t = (q.create_tube("big", TubeType::Fifo, TubeOptions::default())).unwrap();
    let sizes = [100usize, 100, 100, 100, 1000, 10];
    let ids: Vec<TaskId> = (sizes.iter())
        .map(|&n| match q.put_in(T0, t, vec![7; n], TubePut::default()) {
            Ok(PutOutcome::Created(task)) => task.id,
            other => panic!("a new task, got {other:?}"),
        })
        .collect();
    let page = |after: Option<TaskId>, max: usize| -> Vec<TaskId> {
        let p = q.export_tube(t, after, 100, max).unwrap();
        p.iter().map(|task| task.id).collect()
    };
    // 250 bytes: the third task passes the bound, and ends the page.
    assert_eq!(page(None, 250), ids[..3]);
    // A task bigger than the bound makes a page of its own.
    assert_eq!(page(Some(ids[3]), 250), ids[4..5]);
    assert_eq!(page(Some(ids[4]), 250), ids[5..]);
    // Paged so, every task is exported once, in order.
    let mut all = Vec::new();
    loop {
        let next = page(all.last().copied(), 150);
        if next.is_empty() {
            break;
        }
        all.extend(next);
    }
    assert_eq!(all, ids);
}
