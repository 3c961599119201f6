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
