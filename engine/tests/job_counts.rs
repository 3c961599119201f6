//! Per-task counters (`TaskRef::counts`, beanstalkd's `stats-job` `releases`, `buries`,
//! `kicks`, `timeouts`): which call bumps which, as the real beanstalkd counts them (a
//! disconnect is no release, a take of a buried task no kick), that they saturate, that a task
//! leaving takes its entry with it, and that `restore_counts` puts them back.
//! `check_invariants()` (which checks the side table against the slots' flag) runs after every
//! call that changes the queue.

use tarq_engine::{
    JobCounts, PutOptions, Queue, QueueError, ReleaseOptions, Status, TaskId, TubeOptions, TubePut,
    TubeType, DEFAULT_TUBE,
};

const T0: u64 = 1_000_000;
const S: u64 = 1;

fn counts(q: &Queue, id: TaskId) -> JobCounts {
    q.get(id).expect("live").counts
}

fn jc(releases: u16, buries: u16, kicks: u16, timeouts: u16) -> JobCounts {
    JobCounts {
        releases,
        buries,
        kicks,
        timeouts,
    }
}

fn put(q: &mut Queue, opts: PutOptions) -> TaskId {
    let id = q.put(T0, Box::new([0xa1, b'x']), opts).id;
    q.check_invariants();
    id
}

fn take(q: &mut Queue, now: u64, sid: u64, want: TaskId) {
    assert_eq!(q.take(now, sid).map(|t| t.id), Some(want));
    q.check_invariants();
}

#[test]
fn each_call_bumps_the_counter_beanstalkd_bumps() {
    let mut q = Queue::new();
    q.set_journal(true);
    let id = put(&mut q, PutOptions::default());
    assert_eq!(counts(&q, id), JobCounts::default());

    take(&mut q, T0, S, id);
    q.release(T0, S, id, 0).unwrap();
    assert_eq!(counts(&q, id), jc(1, 0, 0, 0), "release");

    take(&mut q, T0, S, id);
    q.release(T0, S, id, 5_000_000).unwrap();
    q.kick_task(T0, id).unwrap();
    assert_eq!(
        counts(&q, id),
        jc(2, 0, 1, 0),
        "release with a delay, kick-job"
    );

    take(&mut q, T0, S, id);
    q.bury_taken(S, id, 0).unwrap();
    assert_eq!(counts(&q, id), jc(2, 1, 1, 0), "bury");
    assert_eq!(q.kick(DEFAULT_TUBE, 1), Ok(1));
    assert_eq!(counts(&q, id), jc(2, 1, 2, 0), "kick of a buried task");

    // A disconnect gives the task back uncounted, as beanstalkd does.
    take(&mut q, T0, 7, id);
    assert_eq!(q.release_session(7), 1);
    q.check_invariants();
    assert_eq!(counts(&q, id), jc(2, 1, 2, 0), "disconnect");

    // reserve-job of a buried task is a take, not a kick.
    q.bury(DEFAULT_TUBE, id).unwrap();
    q.take_task(T0, S, id).unwrap();
    q.check_invariants();
    assert_eq!(counts(&q, id), jc(2, 2, 2, 0), "reserve-job");
    q.release(T0, S, id, 0).unwrap();

    // touch counts nothing.
    take(&mut q, T0, S, id);
    q.touch_ttr(T0, S, id).unwrap();
    assert_eq!(counts(&q, id), jc(3, 2, 2, 0));
    q.release(T0, S, id, 0).unwrap();

    // A delayed task kicked by the tube's kick (nothing buried).
    let later = put(
        &mut q,
        PutOptions {
            delay: 10_000_000,
            ..PutOptions::default()
        },
    );
    assert_eq!(q.kick_delayed(T0, DEFAULT_TUBE, 5), Ok(1));
    q.check_invariants();
    assert_eq!(counts(&q, later), jc(0, 0, 1, 0), "kick of a delayed task");
    // The counters are the task's own: the first task's are only its releases.
    assert_eq!(counts(&q, id), jc(4, 2, 2, 0));
}

#[test]
fn a_ttr_run_out_is_a_timeout() {
    let mut q = Queue::new();
    let id = put(
        &mut q,
        PutOptions {
            ttr: Some(1_000_000),
            ..PutOptions::default()
        },
    );
    take(&mut q, T0, S, id);
    q.advance(T0 + 2_000_000, 100);
    q.check_invariants();
    let t = q.get(id).unwrap();
    assert_eq!((t.status, t.counts), (Status::Ready, jc(0, 0, 0, 1)));
}

#[test]
fn a_return_past_max_deliveries_is_the_return_and_a_bury() {
    let mut q = Queue::new();
    let opts = TubeOptions {
        max_deliveries: 1,
        ttr: Some(1_000_000),
        ..TubeOptions::default()
    };
    let t = q.create_tube("dl", TubeType::FifoTtl, opts).unwrap();
    let put = |q: &mut Queue| match q.put_in(T0, t, Box::new([0xc0]), TubePut::default()) {
        Ok(tarq_engine::PutOutcome::Created(r)) => r.id,
        other => panic!("{other:?}"),
    };
    let a = put(&mut q);
    let b = put(&mut q);
    q.take_from(T0, t, S).unwrap();
    q.release_in(T0, t, S, a, ReleaseOptions::default())
        .unwrap();
    q.check_invariants();
    let ta = q.get(a).unwrap();
    assert_eq!((ta.status, ta.counts), (Status::Buried, jc(1, 1, 0, 0)));
    q.take_from(T0, t, S).unwrap();
    q.advance(T0 + 2_000_000, 100);
    q.check_invariants();
    let tb = q.get(b).unwrap();
    assert_eq!((tb.status, tb.counts), (Status::Buried, jc(0, 1, 0, 1)));
}

#[test]
fn counters_saturate_and_leave_with_their_task() {
    let mut q = Queue::new();
    let id = put(&mut q, PutOptions::default());
    for _ in 0..u32::from(u16::MAX) + 3 {
        q.bury(DEFAULT_TUBE, id).unwrap();
        q.kick(DEFAULT_TUBE, 1).unwrap();
    }
    q.check_invariants();
    assert_eq!(counts(&q, id), jc(0, u16::MAX, u16::MAX, 0));
    // Gone by ack, delete and truncate: each takes its entry (check_invariants counts them).
    take(&mut q, T0, S, id);
    q.ack(S, id).unwrap();
    q.check_invariants();
    let other = put(&mut q, PutOptions::default());
    q.bury(DEFAULT_TUBE, other).unwrap();
    q.delete(DEFAULT_TUBE, other).unwrap();
    q.check_invariants();
    let t = q
        .create_tube("t", TubeType::Fifo, TubeOptions::default())
        .unwrap();
    let Ok(tarq_engine::PutOutcome::Created(r)) =
        q.put_in(T0, t, Box::new([0xc0]), TubePut::default())
    else {
        panic!()
    };
    let in_t = r.id;
    q.bury(t, in_t).unwrap();
    q.truncate(t).unwrap();
    q.check_invariants();
    // A slot reused by a new task starts from zero.
    let fresh = put(&mut q, PutOptions::default());
    assert_eq!(counts(&q, fresh), JobCounts::default());
}

#[test]
fn restore_counts_sets_them_absolutely_and_names_a_missing_task() {
    let mut q = Queue::new();
    let id = put(&mut q, PutOptions::default());
    q.restore_counts(id, jc(4, 3, 2, 1)).unwrap();
    q.check_invariants();
    assert_eq!(counts(&q, id), jc(4, 3, 2, 1));
    q.restore_counts(id, JobCounts::default()).unwrap();
    q.check_invariants();
    assert_eq!(counts(&q, id), JobCounts::default());
    assert_eq!(
        q.restore_counts(id + 1, jc(1, 0, 0, 0)),
        Err(QueueError::NotFound(id + 1))
    );
}
