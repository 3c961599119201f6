//! A graceful stop (SIGTERM) followed by a start on the same data directory loses nothing, in
//! every WAL mode (`none` saves a snapshot at the stop): tasks keep their data, state and
//! delays, a task that was taken is ready again, ids continue; and every reply a client got
//! before the stop names a task that is there after it.

mod support;

use rmpv::Value;
use support::*;

fn stats(c: &mut Client) -> Value {
    c.call("queue.stats", &[]).one()
}

fn count(stats: &Value, key: &str) -> u64 {
    field(stats, key).as_u64().unwrap()
}

/// Stops `t` with SIGTERM, checks the clean exit, and starts a new server on its data dir.
fn restart(mut t: Tarq, mode: &str) -> Tarq {
    t.signal("TERM");
    let status = t.wait_exit();
    assert!(
        status.success(),
        "{mode}: exit status {status:?}\n{}",
        t.log().join("\n")
    );
    assert!(
        !t.log().iter().any(|l| l.contains("did not stop cleanly")),
        "{mode}: {}",
        t.log().join("\n")
    );
    let dir = t.take_dir();
    Tarq::start_in(dir, &["--wal-mode", mode])
}

#[test]
fn a_stop_and_a_start_lose_nothing_in_every_wal_mode() {
    for mode in ["write", "fsync", "none"] {
        let t = Tarq::start(&["--wal-mode", mode]);
        let mut producer = Client::connect(t.addr);
        let data = Value::Map(vec![(
            Value::from("k"),
            Value::Array(vec![Value::from(1), Value::Binary(vec![0, 255])]),
        )]);
        let a = producer
            .call("queue.put", std::slice::from_ref(&data))
            .one();
        let b = producer
            .call(
                "queue.put",
                &[Value::from("later"), map(&[("delay", Value::from(3600))])],
            )
            .one();
        let c = producer
            .call(
                "queue.put",
                &[Value::from("urgent"), map(&[("pri", Value::from(-5))])],
            )
            .one();
        let d = producer.call("queue.put", &[Value::from("plain")]).one();
        assert_eq!(status_of(&b), "W");
        // The urgent one is taken first and acked: gone for good.
        let first = producer.call("queue.take", &[]).one();
        assert_eq!(id_of(&first), id_of(&c));
        producer.call("queue.ack", &[Value::from(id_of(&c))]).one();
        // A holder keeps A taken across the stop.
        let mut holder = Client::connect(t.addr);
        let held = holder.call("queue.take", &[]).one();
        assert_eq!(id_of(&held), id_of(&a));
        let before = stats(&mut producer);
        assert_eq!(
            (count(&before, "total"), count(&before, "taken")),
            (3, 1),
            "{mode}: {before}"
        );
        drop(producer);

        let t = restart(t, mode);
        let mut c2 = Client::connect(t.addr);
        let after = stats(&mut c2);
        assert_eq!(
            [
                count(&after, "total"),
                count(&after, "ready"),
                count(&after, "waiting"),
                count(&after, "taken")
            ],
            [3, 2, 1, 0],
            "{mode}: the taken task is ready again, the delayed one still waits: {after}"
        );
        // A comes back first (lowest id among equal pri), with its data byte for byte.
        let again = c2.call("queue.take", &[]).one();
        assert_eq!(id_of(&again), id_of(&a), "{mode}");
        assert_eq!(field(&again, "data"), &data, "{mode}");
        let next = c2.call("queue.take", &[]).one();
        assert_eq!(id_of(&next), id_of(&d), "{mode}");
        // Ids continue above the last one given out.
        let e = c2.call("queue.put", &[Value::from("new")]).one();
        assert_eq!(id_of(&e), id_of(&d) + 1, "{mode}");
        drop(holder);
    }
}

#[test]
fn every_reply_sent_before_a_stop_names_a_task_that_survives_it() {
    const PUTS: u64 = 3000;
    for mode in ["write", "fsync"] {
        let t = Tarq::start(&["--wal-mode", mode]);
        let mut c = Client::connect(t.addr);
        // All the puts in one write, then the stop: it lands while they are being executed
        // or right after; either way each put answered must survive, and only those.
        let mut burst = Vec::new();
        for i in 0..PUTS {
            tarq_iproto::client::call(
                &mut burst,
                i + 1,
                "queue.put",
                &support::args(&[Value::from(i)]),
            );
        }
        c.send(&burst);
        t.signal("TERM");
        let replies = c.expect_closed();
        let answered = replies.len() as u64;
        for (i, r) in replies.iter().enumerate() {
            assert_eq!(r.sync, i as u64 + 1, "{mode}: replies in order");
            assert_eq!(id_of(&r.one()), i as u64 + 1, "{mode}");
        }
        drop(c);

        let t = restart(t, mode);
        let mut c = Client::connect(t.addr);
        let after = stats(&mut c);
        assert_eq!(
            count(&after, "total"),
            answered,
            "{mode}: {answered} puts answered before the stop, {after} after it"
        );
        assert_eq!(count(&after, "last_id"), answered, "{mode}");
    }
}

#[test]
fn wal_figures_are_in_the_stats_when_a_wal_is_written() {
    let t = Tarq::start(&["--wal-mode", "write"]);
    let mut c = Client::connect(t.addr);
    c.call("queue.put", &[Value::from("x")]).one();
    let s = stats(&mut c);
    assert_eq!(count(&s, "wal_enabled"), 1);
    assert!(count(&s, "wal_records") >= 1, "{s}");
    assert!(count(&s, "wal_bytes") > count(&s, "wal_records"), "{s}");

    let t = Tarq::start(&["--wal-mode", "none"]);
    let s = stats(&mut Client::connect(t.addr));
    assert_eq!(count(&s, "wal_enabled"), 0);
    assert!(
        s.as_map()
            .unwrap()
            .iter()
            .all(|(k, _)| k.as_str() != Some("wal_records")),
        "{s}"
    );
}
