//! Elections against a real etcd: who leads, who follows, how terms grow, that a leader cut
//! off from etcd stops claiming to lead before another node can win, what an etcd outage does,
//! and that the most up-to-date member wins. Every wait is for an event (or a value in etcd)
//! with a deadline; timestamps compared are the ones the nodes stamped on their events.

mod support;

use std::time::{Duration, Instant};

use support::{config, etcd, wait_until, Node, Relay, TTL};
use tarq_cluster::{Cluster, ConfigError, DeposeReason, Error, EventKind, Position};

fn wait_deposed(node: &Node, want: DeposeReason) -> (u64, Instant, Instant) {
    node.wait("Deposed", |e| match e.kind {
        EventKind::Deposed {
            term,
            reason,
            claimed_until,
        } => {
            assert_eq!(reason, want, "{}: deposed for another reason", node.name);
            Some((term, e.at, claimed_until))
        }
        _ => None,
    })
}

fn wait_kind(node: &Node, want: EventKind) {
    node.wait(&format!("{want:?}"), |e| (e.kind == want).then_some(()));
}

fn wait_etcd_unavailable(node: &Node) -> Instant {
    node.wait("EtcdUnavailable", |e| {
        matches!(e.kind, EventKind::EtcdUnavailable { .. }).then_some(e.at)
    })
}

#[test]
fn one_node_leads_a_second_follows_and_members_are_published() {
    let etcd = etcd();
    let a = Node::start(config(&etcd.client_url, "a"));
    let (term, _) = a.wait_leader();
    assert!(term > 0);
    assert_eq!(a.cluster.fence().term_at(Instant::now()), Some(term));
    assert!(a.wakes.load(std::sync::atomic::Ordering::SeqCst) >= 1);

    let b = Node::start(config(&etcd.client_url, "b"));
    assert_eq!(b.wait_follow("a"), term);
    assert_eq!(b.cluster.fence().term_at(Instant::now()), None);
    assert_eq!(
        etcd.get_json("/tarq/test/leader").unwrap(),
        serde_json::json!({"name": "a", "addr": "a.local:3301"})
    );

    b.cluster.publish_position(Position { term, lsn: 42 });
    wait_until("b's position in etcd", || {
        etcd.get_json("/tarq/test/members/b").is_some_and(|m| {
            m["position"] == serde_json::json!({"term": term, "lsn": 42})
                && m["role"] == "replica"
                && m["eligible"] == true
        })
    });
    let a_member = etcd.get_json("/tarq/test/members/a").unwrap();
    assert_eq!(a_member["role"], "leader");
    assert_eq!(a_member["addr"], "a.local:3301");
}

#[test]
fn a_dropped_leader_hands_over_at_once_with_a_higher_term() {
    let etcd = etcd();
    let a = Node::start(config(&etcd.client_url, "a"));
    let (t1, _) = a.wait_leader();
    let b = Node::start(config(&etcd.client_url, "b"));
    assert_eq!(b.wait_follow("a"), t1);

    let dropped = Instant::now();
    drop(a);
    wait_kind(
        &b,
        EventKind::Electing {
            last_term: Some(t1),
        },
    );
    let (t2, at) = b.wait_leader();
    assert!(t2 > t1, "term {t2} after term {t1}");
    // The lease was revoked on the way out: no waiting for it to expire.
    assert!(
        at - dropped < TTL,
        "took {:?}, a lease TTL is {TTL:?}",
        at - dropped
    );
    assert!(etcd.get_json("/tarq/test/members/a").is_none());
}

#[test]
fn a_leader_cut_off_from_etcd_steps_down_before_another_node_wins() {
    let etcd = etcd();
    let relay = Relay::new(etcd.client_addr);
    let a = Node::start(config(&relay.url(), "a"));
    let (t1, _) = a.wait_leader();
    let b = Node::start(config(&etcd.client_url, "b"));
    assert_eq!(b.wait_follow("a"), t1);

    let cut = Instant::now();
    relay.cut();
    let (term, deposed_at, claimed_until) = wait_deposed(&a, DeposeReason::LeaseExpiring);
    assert_eq!(term, t1);
    assert!(
        deposed_at - cut < TTL,
        "stepped down {:?} after the cut",
        deposed_at - cut
    );
    wait_etcd_unavailable(&a);
    let (t2, won_at) = b.wait_leader();
    assert!(t2 > t1);
    assert!(
        deposed_at < won_at && claimed_until < won_at,
        "a stopped claiming at {:?} (claim to {:?}), b won at {:?}, all after the cut",
        deposed_at - cut,
        claimed_until - cut,
        won_at - cut
    );
    assert_eq!(a.cluster.fence().term_at(won_at), None);

    // Back on the network, the old leader follows the new one.
    relay.heal();
    wait_kind(&a, EventKind::EtcdRestored);
    assert_eq!(a.wait_follow("b"), t2);
    assert_eq!(a.cluster.fence().term_at(Instant::now()), None);
}

#[test]
fn etcd_paused_deposes_the_leader_within_a_ttl_and_its_return_brings_an_election() {
    let etcd = etcd();
    let a = Node::start(config(&etcd.client_url, "a"));
    let (t1, _) = a.wait_leader();
    let b = Node::start(config(&etcd.client_url, "b"));
    assert_eq!(b.wait_follow("a"), t1);

    let paused = Instant::now();
    etcd.pause();
    let (term, deposed_at, _) = wait_deposed(&a, DeposeReason::LeaseExpiring);
    assert_eq!(term, t1);
    assert!(deposed_at - paused < TTL, "{:?}", deposed_at - paused);
    assert_eq!(a.cluster.fence().term_at(Instant::now()), None);
    wait_etcd_unavailable(&a);
    wait_etcd_unavailable(&b);

    etcd.resume();
    wait_kind(&a, EventKind::EtcdRestored);
    wait_kind(&b, EventKind::EtcdRestored);
    // One of them wins a new, higher term; the other follows it.
    let outcome = |n: &Node| {
        n.wait("a leader after etcd returned", |e| match &e.kind {
            EventKind::BecameLeader { term } => Some((n.name.clone(), *term)),
            EventKind::Follow { leader, term, .. } if *term > t1 => Some((leader.clone(), *term)),
            _ => None,
        })
    };
    let (leader_a, term_a) = outcome(&a);
    let (leader_b, term_b) = outcome(&b);
    assert_eq!((&leader_a, term_a), (&leader_b, term_b));
    assert!(term_a > t1);
}

/// Three nodes: `l` leads, then goes; of the two left, `slow` (polling every 250 ms) holds the
/// better position and `fast` (polling every 50 ms) the worse. Without the rule `fast` would
/// nearly always get to the leader key first.
fn most_up_to_date_wins(fast_pos: Position, slow_pos: Position) {
    let etcd = etcd();
    let l = Node::start(config(&etcd.client_url, "l"));
    let (t1, _) = l.wait_leader();
    let mut fast = config(&etcd.client_url, "fast");
    fast.poll_interval = Duration::from_millis(50);
    fast.settle = Duration::from_millis(50);
    let mut slow = config(&etcd.client_url, "slow");
    slow.poll_interval = Duration::from_millis(250);
    slow.settle = Duration::from_millis(250);
    let (fast, slow) = (Node::start(fast), Node::start(slow));
    fast.cluster.publish_position(fast_pos);
    slow.cluster.publish_position(slow_pos);
    assert_eq!(fast.wait_follow("l"), t1);
    assert_eq!(slow.wait_follow("l"), t1);
    for (name, pos) in [("fast", fast_pos), ("slow", slow_pos)] {
        wait_until(&format!("{name}'s position in etcd"), || {
            etcd.get_json(&format!("/tarq/test/members/{name}"))
                .is_some_and(|m| m["position"] == serde_json::to_value(pos).unwrap())
        });
    }

    drop(l);
    let (t2, _) = slow.wait_leader();
    assert!(t2 > t1);
    assert_eq!(fast.wait_follow("slow"), t2);
    assert!(
        !fast
            .events_seen()
            .iter()
            .any(|e| matches!(e, EventKind::BecameLeader { .. })),
        "the lagging node led: {:?}",
        fast.events_seen()
    );
}

#[test]
fn the_member_with_more_records_wins() {
    most_up_to_date_wins(Position { term: 5, lsn: 10 }, Position { term: 5, lsn: 20 });
}

#[test]
fn the_member_with_a_newer_term_wins_over_more_records() {
    most_up_to_date_wins(Position { term: 4, lsn: 900 }, Position { term: 5, lsn: 3 });
}

#[test]
fn resign_hands_leadership_to_the_other_node() {
    let etcd = etcd();
    let a = Node::start(config(&etcd.client_url, "a"));
    let (t1, _) = a.wait_leader();
    let b = Node::start(config(&etcd.client_url, "b"));
    assert_eq!(b.wait_follow("a"), t1);
    // a is ahead, yet after resigning it stays out of the next election.
    a.cluster.publish_position(Position { term: t1, lsn: 100 });

    a.cluster.resign();
    let (term, deposed_at, _) = wait_deposed(&a, DeposeReason::Resigned);
    assert_eq!(term, t1);
    assert_eq!(a.cluster.fence().term_at(Instant::now()), None);
    let (t2, won_at) = b.wait_leader();
    assert!(t2 > t1 && deposed_at < won_at);
    assert_eq!(a.wait_follow("b"), t2);
}

#[test]
fn a_second_process_with_the_same_name_stays_out() {
    let etcd = etcd();
    let a = Node::start(config(&etcd.client_url, "a"));
    let (term, _) = a.wait_leader();
    let twin = Node::start(config(&etcd.client_url, "a"));
    wait_kind(&twin, EventKind::NameInUse { name: "a".into() });
    assert_eq!(twin.cluster.fence().term_at(Instant::now()), None);
    // The first one keeps leading undisturbed.
    assert_eq!(a.cluster.fence().term_at(Instant::now()), Some(term));
    assert!(
        twin.cluster.try_event().is_none(),
        "{:?}",
        twin.events_seen()
    );
}

#[test]
fn a_bad_setting_is_refused_before_any_thread_starts() {
    let mut c = config("127.0.0.1:1", "a b");
    let err = Cluster::start(c.clone(), Box::new(|| {})).err().unwrap();
    assert!(matches!(&err, Error::Config(ConfigError::BadName { .. })));
    assert!(err.to_string().contains("node name \"a b\""), "{err}");
    c.name = "a".into();
    c.lease_ttl = Duration::from_secs(600);
    let err = Cluster::start(c, Box::new(|| {})).err().unwrap();
    assert!(
        err.to_string()
            .contains("lease TTL 600 s must be whole seconds from 2 s to 60 s"),
        "{err}"
    );
}

#[test]
fn a_node_started_while_etcd_is_down_reports_it_and_leads_once_etcd_answers() {
    let etcd = etcd();
    etcd.pause();
    let a = Node::start(config(&etcd.client_url, "a"));
    let down_at = wait_etcd_unavailable(&a);
    assert_eq!(a.cluster.fence().term_at(Instant::now()), None);
    etcd.resume();
    wait_kind(&a, EventKind::EtcdRestored);
    let (term, at) = a.wait_leader();
    assert!(term > 0 && at > down_at);
    assert_eq!(a.cluster.fence().term_at(Instant::now()), Some(term));
}
