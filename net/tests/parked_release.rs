//! Takes parked on several tubes are all served when a closed session's tasks come back ready
//! (`Core::serve_all_parked`). The walk over the tubes with waiters used to skip a tube: serving
//! one tube's last waiter took that tube out of the list being walked, so the next tube moved
//! into the slot already passed, and its take waited on beside a ready task.

mod support;

use rmpv::Value;
use support::*;

const TUBES: [&str; 3] = ["a", "b", "c"];

#[test]
fn a_closed_session_serves_the_parked_takes_of_every_tube() {
    let srv = TestServer::start();
    let mut admin = srv.connect();
    let mut holder = srv.connect();
    for t in TUBES {
        admin
            .call("queue.create_tube", &[Value::from(t), Value::from("fifo")])
            .one();
        let data = format!("task-{t}");
        admin
            .call(&format!("queue.tube.{t}:put"), &[Value::from(data)])
            .one();
        // One session holds a task of each tube.
        holder
            .call(&format!("queue.tube.{t}:take"), &[Value::from(0)])
            .one();
    }
    // A take waits on each tube, which is empty now.
    let mut waiters: Vec<(Client, u64)> = TUBES
        .iter()
        .map(|t| {
            let mut c = srv.connect();
            let sync = c.send_call(&format!("queue.tube.{t}:take"), &[Value::from(60)]);
            (c, sync)
        })
        .collect();
    wait_until("the three takes are parked", || {
        field(&admin.call("queue.stats", &[]).one(), "parked_takes").as_u64() == Some(3)
    });

    // The holder's session ends: its three tasks are ready again, each for its tube's waiter.
    drop(holder);
    for (t, (c, sync)) in TUBES.iter().zip(&mut waiters) {
        let r = c.recv();
        assert_eq!(r.sync, *sync);
        let task = r.one();
        assert_eq!(
            task.as_array()
                .and_then(|a| a.get(2))
                .and_then(Value::as_str),
            Some(format!("task-{t}").as_str()),
            "the take parked on tube {t} gets its task: {task:?}"
        );
    }
}
