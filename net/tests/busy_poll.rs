//! `--busy-poll`: the `tarq` binary started with it says so, and its loop — which spins on
//! non-blocking polls before it sleeps — serves depth-1 producers and consumers on their own
//! connections exactly as a sleeping loop does (every task put is taken and acked once), wakes
//! a parked take when a put comes from another connection, and still sleeps until a take's
//! timeout; the null server honours the setting too. The real clients' flows against a
//! busy-polling tarq are in `clients.rs`; what the option buys is measured in `results/`, never
//! asserted here.

mod support;

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use rmpv::Value;
use support::{field, id_of, Client, Tarq, WAIT};

/// Producers and consumers, each on its own connection, one request in flight on each.
const PAIRS: usize = 3;
/// Tasks each producer puts.
const PER_PRODUCER: usize = 300;

fn payload(producer: usize, n: usize) -> Value {
    Value::from(format!("p{producer}-{n}"))
}

/// Runs PAIRS producers and PAIRS consumers at depth 1 against `addr`; returns the payloads
/// the consumers took and acked.
fn cycle(addr: SocketAddr) -> Vec<String> {
    let producers: Vec<_> = (0..PAIRS)
        .map(|p| {
            std::thread::spawn(move || {
                let mut c = Client::connect(addr);
                for n in 0..PER_PRODUCER {
                    let t = c.call("queue.put", &[payload(p, n)]).one();
                    assert_eq!(field(&t, "data"), &payload(p, n));
                }
            })
        })
        .collect();
    let consumers: Vec<_> = (0..PAIRS)
        .map(|_| {
            std::thread::spawn(move || {
                let mut c = Client::connect(addr);
                let mut got = Vec::new();
                let deadline = Instant::now() + WAIT;
                // Until every producer's tasks are taken by someone: an empty take ends it.
                loop {
                    assert!(Instant::now() < deadline, "consumers took too long");
                    let r = c.call("queue.take", &[Value::from(0.5)]);
                    let Some(task) = r.ok().into_iter().next() else {
                        break;
                    };
                    let id = id_of(&task);
                    let acked = c.call("queue.ack", &[Value::from(id)]).one();
                    assert_eq!(id_of(&acked), id);
                    got.push(field(&task, "data").as_str().unwrap().to_owned());
                }
                got
            })
        })
        .collect();
    for p in producers {
        p.join().unwrap();
    }
    consumers
        .into_iter()
        .flat_map(|c| c.join().unwrap())
        .collect()
}

#[test]
fn a_busy_polling_tarq_serves_depth_one_cycles_and_sleeps_through_timeouts() {
    let mut server = Tarq::start(&["--busy-poll", "200"]);
    let serving = server.wait_for_line("tarq serving");
    assert!(serving.contains("busy_poll_us=200"), "{serving}");

    let got = cycle(server.addr);
    let want: BTreeSet<String> = (0..PAIRS)
        .flat_map(|p| (0..PER_PRODUCER).map(move |n| payload(p, n)))
        .map(|v| v.as_str().unwrap().to_owned())
        .collect();
    assert_eq!(got.len(), want.len(), "each task is taken and acked once");
    assert_eq!(got.into_iter().collect::<BTreeSet<_>>(), want);

    // A parked take is woken by a put from another connection, spinning or asleep.
    let mut taker = Client::connect(server.addr);
    let mut putter = Client::connect(server.addr);
    let sync = taker.send_call("queue.take", &[Value::from(10)]);
    assert_eq!(
        taker.ping().code,
        0,
        "answered after the take: the take is parked"
    );
    putter.call("queue.put", &[Value::from("late")]).one();
    let r = taker.recv();
    assert_eq!(r.sync, sync);
    assert_eq!(field(&r.one(), "data"), &Value::from("late"));

    // A take's timeout comes from the sleep after the spin: answered with nothing, on time.
    let start = Instant::now();
    let r = taker.call("queue.take", &[Value::from(0.3)]);
    assert_eq!(r.ok(), Vec::<Value>::new());
    let waited = start.elapsed();
    assert!(
        waited >= Duration::from_millis(300) && waited < WAIT,
        "{waited:?}"
    );
}

#[test]
fn the_null_server_busy_polls_too() {
    let mut server = Tarq::start(&["--null", "--busy-poll", "100"]);
    let serving = server.wait_for_line("tarq serving");
    assert!(
        serving.contains("null=true") && serving.contains("busy_poll_us=100"),
        "{serving}"
    );
    let clients: Vec<_> = (0..PAIRS)
        .map(|_| {
            let addr = server.addr;
            std::thread::spawn(move || {
                let mut c = Client::connect(addr);
                for n in 0..PER_PRODUCER {
                    assert_eq!(
                        c.call("queue.put", &[Value::from(n)]).ok(),
                        Vec::<Value>::new()
                    );
                }
            })
        })
        .collect();
    for c in clients {
        c.join().unwrap();
    }
}
