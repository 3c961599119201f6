//! A replica behind the committed position never becomes primary, even when it is the only
//! member left: three real nodes with `--sync-replicas 1` on a real etcd. One replica is stopped
//! (SIGSTOP) and falls behind while the other acknowledges every put; then the primary and that
//! replica are killed together. Before the committed position was recorded in etcd, the lagging
//! replica was elected on its own and the puts only the dead two held were gone for good (their
//! logs were discarded when they came back and followed it). Now it says why it may not lead
//! and waits; once the others return, one of them leads and every acknowledged put is there.

#[path = "support/cluster.rs"]
mod cluster;
mod support;

use cluster::{peek_data, str_field, wait_for, Etcd, Nodes, Put, Writer};

/// Puts acknowledged while the lagging replica is stopped.
const PUTS: usize = 300;

#[test]
fn a_lagging_replica_does_not_lead_when_those_that_acknowledged_are_down() {
    let etcd = Etcd::start();
    let mut nodes = Nodes::start(&etcd, 3, &["--sync-replicas", "1"]);
    let leader = nodes.wait_leader();
    let others: Vec<usize> = (0..3).filter(|&i| i != leader).collect();
    let (lagging, acker) = (others[0], others[1]);
    wait_for("both replicas to follow", || {
        others.iter().all(|&i| {
            nodes
                .overview(i)
                .is_some_and(|o| str_field(&o, "state") == "following")
        })
    });

    nodes.signal(lagging, "STOP");
    let mut writer = Writer::new(&nodes);
    let mut acked = Vec::new();
    for n in 0..PUTS {
        let data = format!("task-{n}");
        match writer.put_once(&data) {
            Put::Acked { id, node } => {
                assert_eq!(node, leader, "acknowledged by the primary");
                acked.push((id, data));
            }
            other => panic!("put {n} with one replica up: {other:?}"),
        }
    }
    nodes.kill(leader);
    nodes.kill(acker);
    nodes.signal(lagging, "CONT");

    wait_for("the lagging replica to say it may not lead", || {
        let Some(o) = nodes.overview(lagging) else {
            return false;
        };
        assert_ne!(
            str_field(&o, "role"),
            "leader",
            "the replica that never had the last {PUTS} acknowledged puts became primary"
        );
        str_field(&o, "state").contains("may not lead")
    });
    let state = str_field(&nodes.overview(lagging).unwrap(), "state");
    assert!(
        state.contains("before the committed position"),
        "says why: {state}"
    );

    nodes.start_node(leader);
    nodes.start_node(acker);
    let new_leader = nodes.wait_leader();
    assert_ne!(
        new_leader, lagging,
        "a member that holds the committed position leads"
    );
    let addr = nodes.nodes[new_leader].addr;
    for (id, data) in &acked {
        assert_eq!(
            peek_data(addr, *id).as_deref(),
            Some(data.as_str()),
            "acknowledged task {id} on the new primary"
        );
    }
    // The lagging replica follows the new primary and catches up: nothing of it was lost either.
    let last = acked.last().unwrap().0;
    let lagging_addr = nodes.nodes[lagging].addr;
    wait_for("the lagging replica to follow and catch up", || {
        nodes
            .overview(lagging)
            .is_some_and(|o| str_field(&o, "state") == "following")
            && peek_data(lagging_addr, last).is_some()
    });
}
