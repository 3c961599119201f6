//! The loop's two clocks, seen from a client: a step of the wall clock (NTP, an operator)
//! moves the deadlines tasks keep — a task's TTL — and leaves every in-process timeout alone:
//! a waiting take still times out when its timeout says, neither frozen by a step back nor
//! fired early by a step forward.

mod support;

use std::time::{Duration, Instant};

use rmpv::Value;
use support::*;

const HOUR: i64 = 3_600_000_000;

/// Sends a seed `take(timeout)` on `c` and returns once it is parked (seen by `probe`).
fn park_take(c: &mut Client, probe: &mut Client, timeout: f64) -> Instant {
    let sent = Instant::now();
    c.send_call("queue.take", &[Value::from(timeout)]);
    wait_until("the take is parked", || {
        field(&probe.call("queue.stats", &[]).one(), "parked_takes").as_u64() == Some(1)
    });
    sent
}

#[test]
fn a_waiting_take_times_out_on_time_whatever_the_wall_clock_does() {
    let srv = TestServer::start();
    let mut probe = srv.connect();
    let mut c = srv.connect();

    // Back an hour while the take waits: on the wall clock it would wait an hour more.
    let sent = park_take(&mut c, &mut probe, 1.0);
    srv.handle().step_wall_clock(-HOUR);
    let r = c.recv();
    let waited = sent.elapsed();
    assert!(r.ok().is_empty(), "the take times out with no value");
    assert!(
        waited >= Duration::from_millis(900) && waited < Duration::from_secs(5),
        "answered after {waited:?}, not about 1 s"
    );

    // Forward two hours while a take of 2 s waits: on the wall clock it would fire at once.
    let sent = park_take(&mut c, &mut probe, 2.0);
    srv.handle().step_wall_clock(2 * HOUR);
    // A call answered after the step shows the loop has turned since.
    probe.call("queue.stats", &[]).one();
    let r = c.recv();
    let waited = sent.elapsed();
    assert!(r.ok().is_empty());
    assert!(
        waited >= Duration::from_millis(1900),
        "a step forward fired the take's timeout early: answered after {waited:?}"
    );
}

#[test]
fn a_tasks_ttl_follows_the_wall_clock() {
    let srv = TestServer::start();
    let mut c = srv.connect();
    let ttl = 3600.0;
    c.call(
        "queue.put",
        &[Value::from("x"), map(&[("ttl", Value::from(ttl))])],
    )
    .one();
    srv.handle().step_wall_clock(2 * HOUR);
    wait_until("the task expires", || {
        field(&c.call("queue.stats", &[]).one(), "expired").as_u64() == Some(1)
    });
    let r = c.call("queue.take", &[Value::from(0)]);
    assert!(r.ok().is_empty(), "no task is left to take");
}
