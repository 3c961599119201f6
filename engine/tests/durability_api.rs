//! The calls the WAL's snapshot walk and replay use: the arena cursor (`arena_end`,
//! `task_at`), `restore_deliveries`, `dedup_seqs`.

use tarq_engine::{PutOptions, Queue, TubeOptions, TubePut, TubeType};

#[test]
fn arena_cursor_visits_live_tasks_only_and_is_bounded_by_the_most_ever_live() {
    let mut q = Queue::new();
    for round in 0..100u64 {
        let ids: Vec<u64> = (0..50)
            .map(|i| q.put(0, vec![i as u8], PutOptions::default()).id)
            .collect();
        for _ in &ids[..49] {
            let t = q.take(0, round).expect("ready").id;
            q.ack(round, t).expect("taken");
        }
    }
    // 5000 ids issued, 100 live, the arena never held more than 51 at once.
    assert_eq!(q.last_id(), 5000);
    assert_eq!(q.len(), 100);
    assert!(q.arena_end() < 1000, "arena_end {}", q.arena_end());
    let mut seen: Vec<u64> = (0..q.arena_end())
        .filter_map(|p| q.task_at(p).map(|t| t.id))
        .collect();
    seen.sort_unstable();
    let mut live: Vec<u64> = q.iter().map(|t| t.id).collect();
    live.sort_unstable();
    assert_eq!(seen, live);
    assert!(q.task_at(usize::MAX).is_none());
}

#[test]
fn restore_deliveries_sets_the_count_and_names_a_missing_task() {
    let mut q = Queue::new();
    let id = q.put(0, Box::new([]), PutOptions::default()).id;
    q.restore_deliveries(id, 7).expect("live");
    assert_eq!(q.get(id).expect("live").deliveries, 7);
    assert!(q.restore_deliveries(id + 1, 1).is_err());
}

#[test]
fn dedup_seqs_cover_the_live_entries() {
    let mut q = Queue::new();
    let opts = TubeOptions {
        dedup_window: 10,
        ..TubeOptions::default()
    };
    let t = q.create_tube("d", TubeType::Fifo, opts).expect("created");
    assert_eq!(q.dedup_seqs(0), 0..0);
    for key in [b"a", b"b", b"c"] {
        let p = TubePut {
            dedup_key: Some(key),
            ..TubePut::default()
        };
        q.put_in(0, t, Box::new([]), p).expect("put");
    }
    let r = q.dedup_seqs(t);
    assert_eq!(r.end - r.start, 3);
    let keys: Vec<&[u8]> = r.map(|s| q.dedup_entry(t, s).expect("live").0).collect();
    assert_eq!(keys, [b"a", b"b", b"c"]);
}

mod bulk_restore {
    //! A snapshot's tasks come in arena order; a `Restoring` lists them sorted instead of one
    //! search each, in the engine's sort (`finish`) or in one the caller gives (`finish_in`).
    //! The queue must come out the same every way.

    use proptest::prelude::*;
    use tarq_engine::{
        list_key, BulkIds, Queue, QueueError, RestoredTask, Restoring, Status, TaskId, TubeIx,
        TubeOptions, TubeType,
    };

    /// How the tasks are restored.
    #[derive(Clone, Copy)]
    enum Mode {
        OneByOne,
        Bulk(BulkIds),
        /// A bulk listed in an order computed as a snapshot's loader does; `false`: that
        /// order reversed (no list's order: slower, the same queue).
        Given {
            sorted: bool,
        },
    }

    /// (tube: 0 default / 1 a utube tube, status, pri, runat, ttl, utube key) per task.
    type Spec = (bool, u8, i8, u8, Option<u8>, u8);

    /// Where the tasks go: the queue itself, or a bulk restore into it.
    enum Target {
        Queue(Queue),
        Bulk(Restoring),
    }

    impl Target {
        fn restore_in(
            &mut self,
            tube: TubeIx,
            task: RestoredTask,
            key: Option<&[u8]>,
        ) -> Result<(), QueueError> {
            match self {
                Target::Queue(q) => q.restore_in(tube, task, key, 0),
                Target::Bulk(r) => r.restore_in(tube, task, key, 0),
            }
        }
    }

    fn restore(specs: &[Spec], mode: Mode) -> (Queue, TubeIx) {
        let mut q = Queue::new();
        let u: TubeIx = 1;
        q.restore_tube(
            u,
            "u",
            TubeType::UtubeTtl,
            TubeOptions::default(),
            tarq_engine::TubeNumbers::default(),
        )
        .expect("tube");
        let mut into = match mode {
            Mode::OneByOne => Target::Queue(q),
            Mode::Bulk(ids) => Target::Bulk(q.restoring(ids)),
            Mode::Given { .. } => Target::Bulk(q.restoring(BulkIds::Distinct)),
        };
        // (list key, id, ordinal) of each held task, as the loader computes them.
        let mut order = Vec::new();
        // Ids scrambled (7919 is a prime above any length here, so this is a permutation of
        // 1..=n), pri and runat at random: no list receives its tasks in its own order, as
        // after churn, when a snapshot's arena order is no list's order.
        let n = specs.len() as u64;
        for (i, &(in_utube, status, pri, runat, ttl, key)) in specs.iter().enumerate() {
            let id: TaskId = (i as u64 * 7919) % n + 1;
            let status = match status % 4 {
                0 => Status::Ready,
                1 => Status::Waiting,
                2 => Status::Buried,
                _ => Status::Taken,
            };
            let task: RestoredTask = RestoredTask {
                id,
                status,
                runat: if status == Status::Waiting {
                    1_000 + u64::from(runat)
                } else {
                    0
                },
                pri: i64::from(pri),
                ttl: ttl.map(|t| 10_000 + u64::from(t)),
                ttr: None,
                created: 500,
                data: vec![i as u8].into(),
            };
            let (tube, key) = if in_utube {
                (u, Some(&[key % 3][..]))
            } else {
                (0, None)
            };
            if let Some(key) = list_key(task.status, task.pri, task.runat) {
                order.push((key, id, i as u32));
            }
            into.restore_in(tube, task, key).expect("restored");
        }
        order.sort_unstable();
        let mut ordinals: Vec<u32> = order.iter().map(|o| o.2).collect();
        let mut q = match (into, mode) {
            (Target::Queue(q), _) => q,
            (Target::Bulk(r), Mode::Given { sorted }) => {
                if !sorted {
                    ordinals.reverse();
                }
                r.finish_in(&ordinals).expect("a whole order")
            }
            (Target::Bulk(r), _) => r.finish(),
        };
        q.release_all_taken();
        q.check_invariants();
        (q, u)
    }

    /// Everything a client can observe, in order: takes now, then after the delays end, then
    /// the buried tasks kicked and taken.
    fn observe(q: &mut Queue, u: TubeIx) -> Vec<(TubeIx, TaskId)> {
        let mut seen = Vec::new();
        for phase in 0..3 {
            if phase == 1 {
                q.advance(2_000, usize::MAX);
            }
            if phase == 2 {
                for t in [0, u] {
                    q.kick(t, u64::MAX).expect("kick");
                }
            }
            for t in [0, u] {
                while let Some(task) = q.take_from(2_000, t, 1).expect("tube") {
                    seen.push((t, task.id));
                    let id = task.id;
                    q.ack_in(t, 1, id).expect("ack");
                }
            }
        }
        q.check_invariants();
        seen
    }

    proptest! {
        #[test]
        fn bulk_restore_lists_tasks_as_one_by_one_restore_does(
            specs in prop::collection::vec(
                (any::<bool>(), any::<u8>(), -3i8..3, any::<u8>(), prop::option::of(any::<u8>()), any::<u8>()),
                0..300,
            )
        ) {
            let (mut one, u) = restore(&specs, Mode::OneByOne);
            let want = observe(&mut one, u);
            for mode in [
                Mode::Bulk(BulkIds::Check),
                Mode::Bulk(BulkIds::Distinct),
                Mode::Given { sorted: true },
                Mode::Given { sorted: false },
            ] {
                let (mut bulk, _) = restore(&specs, mode);
                prop_assert_eq!(&want, &observe(&mut bulk, u));
            }
        }
    }

    #[test]
    fn an_order_that_does_not_name_each_held_task_once_is_refused() {
        let restoring = || {
            let mut r = Queue::new().restoring(BulkIds::Distinct);
            for (id, status) in [(1, Status::Ready), (2, Status::Taken), (3, Status::Ready)] {
                let task: RestoredTask = RestoredTask {
                    id,
                    status,
                    runat: 0,
                    pri: 0,
                    ttl: None,
                    ttr: None,
                    created: 0,
                    data: vec![id as u8].into(),
                };
                r.restore_in(0, task, None, 0).expect("restored");
            }
            r
        };
        // Ordinal 1 is the Taken task; 3 was never restored.
        let length = |named| QueueError::RestoreOrderLength { named, held: 2 };
        let ordinal = |ordinal| QueueError::RestoreOrderOrdinal { ordinal };
        for (bad, e) in [
            (&[0][..], length(1)),
            (&[0, 0], ordinal(0)),
            (&[0, 1], ordinal(1)),
            (&[0, 3], ordinal(3)),
            (&[2, 0, 0], length(3)),
        ] {
            assert_eq!(restoring().finish_in(bad).map(|_| ()), Err(e));
        }
        let mut q = restoring().finish_in(&[2, 0]).expect("each held task once");
        q.release_all_taken();
        q.check_invariants();
        let ids: Vec<TaskId> = std::iter::from_fn(|| q.take(0, 1).map(|t| t.id)).collect();
        // A reversed order lists the same (only slower); the Taken task, released, takes its
        // place by id among them.
        assert_eq!(ids, [1, 2, 3]);
    }
}

#[test]
fn tasks_restored_in_scrambled_id_order_are_all_found() {
    // A churned queue's snapshot lists its tasks in arena order, which is no id order: each
    // restore looks its id up first. A lookup in a lane with no empty bucket once never ended.
    for n in [50u64, 300, 1000, 20_000] {
        let mut q = Queue::new();
        let ids: Vec<u64> = (0..n).map(|i| (i * 7919) % n + 1).collect();
        for &id in &ids {
            q.restore(ready(id, vec![id as u8].into()))
                .expect("restored");
        }
        q.check_invariants();
        assert_eq!(q.len(), n as usize);
        for &id in &ids {
            assert_eq!(q.get(id).expect("restored").data[0], id as u8);
        }
        assert!(q.get(n + 1).is_none());
    }
}

#[test]
fn a_checked_bulk_restore_refuses_a_duplicate_id() {
    use tarq_engine::{BulkIds, QueueError, DEFAULT_TUBE};
    let mut r = Queue::new().restoring(BulkIds::Check);
    for id in [5, 3, 9] {
        r.restore_in(DEFAULT_TUBE, ready(id, Box::new([])), None, 0)
            .expect("new id");
    }
    assert_eq!(
        r.restore_in(DEFAULT_TUBE, ready(3, Box::new([])), None, 0),
        Err(QueueError::Duplicate(3)),
        "3 is there already"
    );
    let q = r.finish();
    q.check_invariants();
    assert_eq!(q.len(), 3);
}

/// A Ready task of `default` as recovery brings it back, put at time 0.
fn ready(id: u64, data: Box<[u8]>) -> tarq_engine::RestoredTask {
    tarq_engine::RestoredTask {
        id,
        status: tarq_engine::Status::Ready,
        runat: 0,
        pri: 0,
        ttl: None,
        ttr: None,
        created: 0,
        data,
    }
}

#[test]
fn tasks_fill_room_made_on_another_thread_before_the_queue_allocates() {
    use tarq_engine::{Queue, Room};
    // Room for 2 chunks of slots and the records of their tasks, made on another thread.
    let tasks = 2 * Room::SLOTS;
    let record_chunks = (tasks * Room::record_bytes(3)).div_ceil(Room::RECORD_BYTES);
    let rooms = std::thread::spawn(move || {
        let mut rooms = vec![Room::slots(), Room::slots()];
        rooms.extend((0..record_chunks).map(|_| Room::records()));
        rooms
    })
    .join()
    .expect("made");
    let mut q = Queue::new();
    for r in rooms {
        q.add_room(r);
    }
    let before = q.overhead_bytes();
    for i in 0..tasks as u64 {
        q.restore(ready(i + 1, vec![i as u8, 1, 2].into()))
            .expect("restored");
    }
    q.check_invariants();
    assert_eq!(q.len(), tasks);
    assert_eq!(q.get(5).expect("there").data[..], [4, 1, 2]);
    // Slots and records came from the room: what grew is the index and the lists' towers.
    let slots_and_records = tasks * 48 + record_chunks * Room::RECORD_BYTES;
    assert!(
        q.overhead_bytes() - before < slots_and_records / 2,
        "{} -> {}: the room was not used",
        before,
        q.overhead_bytes()
    );
}
