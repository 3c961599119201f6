//! Replica sets and the placement against a real etcd: sets elect their leaders independently
//! (the default set where an unsharded cluster keeps its keys), the map every sharded node reads,
//! tube creation spread over the live sets, drops that leave floors, one winner of racing
//! creates, the epoch that every change raises, moves that other nodes hear of, a move's commit
//! and its release excluding each other through its claim (and the commit refused to a primary
//! that no longer leads), and the placement fence that runs out when etcd stops answering. Every wait is for an event or a
//! value with a deadline.

mod support;

use std::time::{Duration, Instant};

use support::{config, etcd, wait_until, Node, TTL};
use tarq_cluster::etcd::{Client, Op};
use tarq_cluster::placement::{self, MAX_INDEX};
use tarq_cluster::{
    moves, Config, DropCommit, EventKind, MoveClaim, Overview, PlacementError, TubePlacement,
};

/// The budget of the test's own etcd calls.
const CALL: Duration = Duration::from_secs(2);

fn sharded(endpoint: &str, name: &str, set: &str) -> Config {
    config(endpoint, name).with_replica_set(set)
}

/// Waits until `node`'s overview satisfies `cond`, re-checking after each `MapChanged`.
fn wait_map(node: &Node, what: &str, cond: impl Fn(&Overview) -> bool) -> Overview {
    loop {
        let o = node.cluster.overview();
        if cond(&o) {
            return o;
        }
        node.wait(&format!("MapChanged until {what}"), |e| {
            matches!(e.kind, EventKind::MapChanged { .. }).then_some(())
        });
    }
}

fn leaders(o: &Overview) -> Vec<(String, String)> {
    o.sets
        .iter()
        .filter_map(|s| Some((s.name.clone(), s.leader.as_ref()?.0.name.clone())))
        .collect()
}

/// The answer to the change sent with `token`.
fn done(node: &Node, token: u64) -> Result<TubePlacement, PlacementError> {
    node.wait(&format!("PlacementDone {token}"), |e| match &e.kind {
        EventKind::PlacementDone { token: t, result } if *t == token => Some(result.clone()),
        _ => None,
    })
}

fn owners(t: &TubePlacement) -> Vec<(u16, &str, u64)> {
    t.partitions
        .iter()
        .map(|p| (p.index, p.set.as_str(), p.first))
        .collect()
}

fn read(client: &mut Client) -> tarq_cluster::ClusterMap {
    placement::read(client, "test", CALL).expect("read the map")
}

/// Two sets `s1` (x1) and `s2` (y1), both led, seen by x1, with the tube `default` placed.
fn two_sets(url: &str) -> (Node, Node) {
    let x1 = Node::start(sharded(url, "x1", "s1"));
    let y1 = Node::start(sharded(url, "y1", "s2"));
    x1.wait_leader();
    y1.wait_leader();
    for n in [&x1, &y1] {
        wait_map(n, "both sets led and default placed", |o| {
            leaders(o).len() == 2 && o.placement.tubes.contains_key("default")
        });
    }
    (x1, y1)
}

#[test]
fn sets_elect_their_own_leaders_and_the_default_set_keeps_its_keys() {
    let etcd = etcd();
    let url = &etcd.client_url;
    // An unsharded node of the default set, exactly as before replica sets.
    let a1 = Node::start(config(url, "a1"));
    let (ta, _) = a1.wait_leader();
    let x1 = Node::start(sharded(url, "x1", "s1"));
    let (tx, _) = x1.wait_leader();
    let x2 = Node::start(sharded(url, "x2", "s1"));
    assert_eq!(x2.wait_follow("x1"), tx);
    let y1 = Node::start(sharded(url, "y1", "s2"));
    let (ty, _) = y1.wait_leader();
    assert!(ta < tx && tx < ty, "terms {ta} {tx} {ty}");

    assert_eq!(
        etcd.get_json("/tarq/test/leader").unwrap(),
        serde_json::json!({"name": "a1", "addr": "a1.local:3301"})
    );
    assert_eq!(
        etcd.get_json("/tarq/test/members/a1").unwrap()["role"],
        "leader"
    );
    assert_eq!(
        etcd.get_json("/tarq/test/sets/s1/leader").unwrap()["name"],
        "x1"
    );
    assert_eq!(
        etcd.get_json("/tarq/test/sets/s2/leader").unwrap()["name"],
        "y1"
    );
    assert_eq!(
        etcd.get_json("/tarq/test/sets/s1/members/x2").unwrap()["role"],
        "replica"
    );
    assert!(etcd.get_json("/tarq/test/members/x1").is_none());

    // Every sharded node sees every set, the default one included.
    let o = wait_map(&x2, "three led sets", |o| leaders(o).len() == 3);
    assert_eq!(
        leaders(&o),
        [
            ("default".into(), "a1".into()),
            ("s1".into(), "x1".into()),
            ("s2".into(), "y1".into())
        ]
    );
    let s1 = &o.sets[1];
    assert_eq!(s1.leader.as_ref().unwrap().1, tx);
    let names: Vec<_> = s1.members.iter().map(|m| m.name.as_str()).collect();
    assert_eq!(names, ["x1", "x2"]);
    // The first sharded leader placed `default` at index 0 on its own set.
    let o = wait_map(&y1, "default placed", |o| {
        o.placement.tubes.contains_key("default")
    });
    let t = &o.placement.tubes["default"];
    assert_eq!((t.kind.as_str(), t.partitions.len()), ("fifottl", 1));
    assert_eq!((t.partitions[0].index, t.partitions[0].first), (0, 0));
    assert!(["s1", "s2"].contains(&t.partitions[0].set.as_str()));
    // The unsharded node reads no map and has no placement view.
    assert!(a1.cluster.overview().sets.is_empty());
    assert_eq!(a1.cluster.placement_fence().valid_at(Instant::now()), None);
    assert!(!a1
        .events_seen()
        .iter()
        .any(|e| matches!(e, EventKind::MapChanged { .. })));

    // A set's failover leaves the other set's leader alone.
    drop(x1);
    assert!(x2.wait_leader().0 > ty);
    let o = wait_map(&y1, "x2 leads s1", |o| {
        leaders(o).contains(&("s1".into(), "x2".into()))
    });
    assert_eq!(
        o.set_leader("s2").map(|(l, term)| (l.name.as_str(), *term)),
        Some(("y1", ty))
    );
    assert_eq!(y1.cluster.fence().term_at(Instant::now()), Some(ty));
}

#[test]
fn create_tube_spreads_partitions_over_the_live_sets_and_every_change_raises_the_epoch() {
    let etcd = etcd();
    let (x1, _y1) = two_sets(&etcd.client_url);
    let mut client = Client::connect(std::slice::from_ref(&etcd.client_url)).unwrap();
    let map = read(&mut client);
    let default_owner = map.placement.tubes["default"].partitions[0].set.clone();
    let other = if default_owner == "s1" { "s2" } else { "s1" };
    let mut epoch = map.placement.epoch;
    assert!(epoch > 0);
    let mut check_epoch = |client: &mut Client| {
        let now = read(client).placement.epoch;
        assert!(now > epoch, "epoch {now} after {epoch}");
        epoch = now;
    };

    x1.cluster
        .create_tube(1, "q", "fifo", serde_json::json!({"temporary": true}), 4);
    let q = done(&x1, 1).unwrap();
    // The set without `default` owns fewer: it comes first.
    assert_eq!(
        owners(&q),
        [
            (1, other, 0),
            (2, &*default_owner, 0),
            (3, other, 0),
            (4, &*default_owner, 0)
        ]
    );
    assert_eq!(q.options, serde_json::json!({"temporary": true}));
    check_epoch(&mut client);
    assert_eq!(
        etcd.get_json("/tarq/test/placement/indexes/3").unwrap(),
        serde_json::json!({"tube": "q", "partition": 2})
    );

    // Loads are 3 and 2 (with default): the next tube evens them, then one-partition tubes
    // alternate, ties going to the first name.
    let mut sets = Vec::new();
    for (i, name) in ["t0", "t1", "t2", "t3", "t4"].into_iter().enumerate() {
        let token = 10 + i as u64;
        x1.cluster
            .create_tube(token, name, "utube", serde_json::Value::Null, 1);
        let t = done(&x1, token).unwrap();
        assert_eq!(t.partitions[0].index, 5 + i as u16);
        sets.push(t.partitions[0].set.clone());
        check_epoch(&mut client);
    }
    assert_eq!(sets, [other, "s1", "s2", "s1", "s2"]);

    x1.cluster
        .create_tube(20, "q", "fifottl", serde_json::Value::Null, 1);
    assert_eq!(
        done(&x1, 20),
        Err(PlacementError::Exists(Box::new(q.clone())))
    );
    x1.cluster
        .create_tube(21, "big", "fifo", serde_json::Value::Null, 300);
    assert_eq!(done(&x1, 21), Err(PlacementError::Partitions(300)));
    assert_eq!(
        read(&mut client).placement.epoch,
        epoch,
        "refusals write nothing"
    );

    // The node's own map follows: MapChanged carries the epoch of the last change.
    let o = wait_map(&x1, "the last epoch", |o| o.placement.epoch == epoch);
    assert_eq!(o.placement.tubes["q"], q);
    assert_eq!(
        x1.cluster.placement_fence().valid_at(Instant::now()),
        Some(epoch)
    );
}

/// A drop's deadline no test reaches.
fn soon() -> Instant {
    Instant::now() + Duration::from_secs(60)
}

#[test]
fn a_dropped_tube_leaves_floors_and_new_tubes_take_indexes_never_used_first() {
    let etcd = etcd();
    let (x1, _y1) = two_sets(&etcd.client_url);
    x1.cluster
        .create_tube(1, "q", "fifo", serde_json::Value::Null, 2);
    let q = done(&x1, 1).unwrap();
    assert_eq!(
        q.partitions.iter().map(|p| p.index).collect::<Vec<_>>(),
        [1, 2]
    );

    // Past its deadline a drop is not begun: nothing written, the tube stays.
    let drop = |floors: Vec<(u16, u64)>, checked_by: Vec<(String, u64)>, not_after| DropCommit {
        name: "q".into(),
        floors,
        checked_by,
        not_after,
    };
    x1.cluster
        .drop_tube(9, drop(vec![(0, 500)], Vec::new(), Instant::now()));
    assert_eq!(done(&x1, 9), Err(PlacementError::TooLate("q".into())));
    assert!(etcd.get_json("/tarq/test/placement/tubes/q").is_some());

    // Checked by a primary that does not lead its set (not in that term): refused.
    x1.cluster.drop_tube(
        3,
        drop(vec![(0, 500)], vec![("s1".into(), 999_999)], soon()),
    );
    assert_eq!(
        done(&x1, 3),
        Err(PlacementError::CheckedByDeposed {
            set: "s1".into(),
            term: 999_999
        })
    );
    assert!(etcd.get_json("/tarq/test/placement/tubes/q").is_some());

    let overview = x1.cluster.overview();
    let term_of = |name: &str| {
        let set = overview.sets.iter().find(|s| s.name == name).expect("set");
        set.leader.as_ref().expect("the set is led").1
    };
    let term = term_of("s1");
    let (owner, other) = match q.partitions[0].set.as_str() {
        "s1" => ("s1", "s2"),
        _ => ("s2", "s1"),
    };
    assert_eq!(q.partitions[1].set, other, "one partition a set: {q:?}");
    // Checked by a primary that leads, but not by the one that owns partition 0 (a check
    // relayed past a stale view, or a partition moved since): refused, nothing written.
    x1.cluster.drop_tube(
        4,
        drop(vec![(0, 500)], vec![(other.into(), term_of(other))], soon()),
    );
    assert_eq!(
        done(&x1, 4),
        Err(PlacementError::CheckedElsewhere {
            tube: "q".into(),
            partition: 0,
            set: owner.into()
        })
    );
    assert!(etcd.get_json("/tarq/test/placement/tubes/q").is_some());
    x1.cluster.drop_tube(
        2,
        drop(
            vec![(0, 500), (1, 7)],
            vec![("s1".into(), term), ("s2".into(), term_of("s2"))],
            soon(),
        ),
    );
    assert_eq!(done(&x1, 2), Ok(q));
    assert!(etcd.get_json("/tarq/test/placement/tubes/q").is_none());
    assert_eq!(
        etcd.get_json("/tarq/test/placement/indexes/1").unwrap(),
        serde_json::json!({"floor": 500})
    );
    assert_eq!(
        etcd.get_json("/tarq/test/placement/indexes/2").unwrap(),
        serde_json::json!({"floor": 7})
    );
    x1.cluster.drop_tube(
        3,
        DropCommit {
            name: "q".into(),
            floors: vec![],
            checked_by: vec![],
            not_after: soon(),
        },
    );
    assert_eq!(done(&x1, 3), Err(PlacementError::NoTube("q".into())));

    // Indexes never used come first: a node that missed the drop may still hold 1 and 2, and
    // would take them for the new tube's, tasks and all. The floors stay recorded for when
    // the fresh indexes run out (`plan_create`'s unit tests reuse them).
    x1.cluster
        .create_tube(4, "r", "fifo", serde_json::Value::Null, 1);
    let r = done(&x1, 4).unwrap();
    assert_eq!((r.partitions[0].index, r.partitions[0].first), (3, 0));
    x1.cluster
        .create_tube(5, "q", "utubettl", serde_json::Value::Null, 2);
    let q2 = done(&x1, 5).unwrap();
    let firsts: Vec<_> = q2.partitions.iter().map(|p| (p.index, p.first)).collect();
    assert_eq!(firsts, [(4, 0), (5, 0)]);
    for (ix, floor) in [(1, 500), (2, 7)] {
        assert_eq!(
            etcd.get_json(&format!("/tarq/test/placement/indexes/{ix}"))
                .unwrap(),
            serde_json::json!({ "floor": floor })
        );
    }
    // A drop records its own floors at the indexes it leaves.
    x1.cluster.drop_tube(
        6,
        DropCommit {
            name: "r".into(),
            floors: vec![(0, 3)],
            checked_by: vec![(r.partitions[0].set.clone(), term_of(&r.partitions[0].set))],
            not_after: soon(),
        },
    );
    done(&x1, 6).unwrap();
    assert_eq!(
        etcd.get_json("/tarq/test/placement/indexes/3").unwrap(),
        serde_json::json!({"floor": 3})
    );
    assert!(u16::try_from(firsts.len()).unwrap() < MAX_INDEX);
}

#[test]
fn creates_of_one_name_racing_from_two_nodes_have_one_winner() {
    let etcd = etcd();
    let (x1, y1) = two_sets(&etcd.client_url);
    for round in 0..5u64 {
        let name = format!("race{round}");
        x1.cluster
            .create_tube(round, &name, "fifo", serde_json::Value::Null, 2);
        y1.cluster
            .create_tube(round, &name, "fifo", serde_json::Value::Null, 3);
        let (a, b) = (done(&x1, round), done(&y1, round));
        let (won, lost) = match (a, b) {
            (Ok(w), Err(l)) | (Err(l), Ok(w)) => (w, l),
            other => panic!("round {round}: not exactly one winner: {other:?}"),
        };
        assert_eq!(lost, PlacementError::Exists(Box::new(won.clone())));
    }
    // No index was handed out twice.
    let mut client = Client::connect(std::slice::from_ref(&etcd.client_url)).unwrap();
    let map = read(&mut client);
    let mut indexes: Vec<u16> = map
        .placement
        .tubes
        .values()
        .flat_map(|t| t.partitions.iter().map(|p| p.index))
        .collect();
    let count = indexes.len();
    indexes.sort_unstable();
    indexes.dedup();
    assert_eq!(indexes.len(), count, "{:?}", map.placement.tubes);
}

#[test]
fn place_moves_a_partition_and_the_other_node_hears_of_it() {
    let etcd = etcd();
    let (x1, y1) = two_sets(&etcd.client_url);
    x1.cluster
        .create_tube(1, "q", "fifo", serde_json::Value::Null, 2);
    let q = done(&x1, 1).unwrap();
    let o = wait_map(&y1, "q placed", |o| o.placement.tubes.contains_key("q"));
    // Move the partition y1's set (s2) does not own to s2.
    let p = q.partitions.iter().position(|p| p.set == "s1").unwrap() as u16;
    let index = q.partitions[usize::from(p)].index;
    assert_eq!(o.placement.owned_since(index), None);

    let sent = Instant::now();
    x1.cluster.place(2, "q", p, "s2");
    let moved = done(&x1, 2).unwrap();
    assert_eq!(moved.partitions[usize::from(p)].set, "s2");
    let mut client = Client::connect(std::slice::from_ref(&etcd.client_url)).unwrap();
    let epoch = read(&mut client).placement.epoch;
    let seen = y1.wait("MapChanged of the move", |e| match e.kind {
        EventKind::MapChanged { epoch: e } if e >= epoch => Some(e),
        _ => None,
    });
    assert_eq!(seen, epoch);
    let placement = y1.cluster.placement();
    assert_eq!(placement.owner("q", p), Some("s2"));
    let since = placement.owned_since(index).expect("s2 owns it now");
    assert!(since > sent);
    // The loser's view drops it; the fence carries the new epoch.
    let x_view = wait_map(&x1, "the move", |o| o.placement.epoch == epoch);
    assert_eq!(x_view.placement.owned_since(index), None);
    assert_eq!(
        y1.cluster.placement_fence().valid_at(Instant::now()),
        Some(epoch)
    );

    // Placing where it already is writes nothing; unknown sets and partitions are refused.
    x1.cluster.place(3, "q", p, "s2");
    assert_eq!(done(&x1, 3), Ok(moved));
    assert_eq!(read(&mut client).placement.epoch, epoch);
    x1.cluster.place(4, "q", p, "nowhere");
    assert_eq!(
        done(&x1, 4),
        Err(PlacementError::UnknownSet("nowhere".into()))
    );
    x1.cluster.place(5, "q", 9, "s1");
    assert!(matches!(
        done(&x1, 5),
        Err(PlacementError::NoPartition { partition: 9, .. })
    ));
}

#[test]
fn a_moves_commit_and_its_release_exclude_each_other_through_its_claim() {
    let etcd = etcd();
    let (x1, _y1) = two_sets(&etcd.client_url);
    x1.cluster
        .create_tube(1, "q", "fifo", serde_json::Value::Null, 2);
    let q = done(&x1, 1).unwrap();
    let p = q.partitions.iter().position(|p| p.set == "s1").unwrap() as u16;
    let ix = q.partitions[usize::from(p)].index;
    let mut c = Client::connect(std::slice::from_ref(&etcd.client_url)).unwrap();
    let claim = |id| MoveClaim {
        id,
        tube: "q".into(),
        to: "s2".into(),
    };
    let term = read(&mut c)
        .sets
        .iter()
        .find(|s| s.name == "s1")
        .unwrap()
        .leader
        .clone();
    let term = term.expect("s1 leads").1;
    let move_q = |id, term| moves::Commit {
        tube: "q".into(),
        partition: p,
        index: ix,
        from: "s1".into(),
        to: "s2".into(),
        first: 0,
        id,
        term,
        carried: Default::default(),
    };
    let commit = |c: &mut Client, id| moves::commit(c, "test", &move_q(id, term), CALL);
    let owner = |r: Result<TubePlacement, PlacementError>| {
        moves::owner_at(&r.expect("a tube"), ix).unwrap().to_owned()
    };
    let claimed = |c: &mut Client| {
        let r = c.txn(&[], &[Op::Get(moves::claim_key("test", ix))], &[], CALL);
        !r.unwrap().ranges[0].is_empty()
    };

    // Released first: the commit finds no claim, and the release reads the old owner.
    let r = moves::claim(&mut c, "test", ix, &claim(1), CALL).unwrap();
    assert_eq!(owner(r), "s1");
    let r = moves::release(&mut c, "test", ix, "q", "s2", Some(1), CALL).unwrap();
    assert_eq!(owner(r), "s1");
    assert!(!claimed(&mut c));
    assert!(matches!(
        commit(&mut c, 1).unwrap(),
        Err(PlacementError::CalledOff { .. })
    ));
    assert_eq!(read(&mut c).placement.owner("q", p), Some("s1"));

    // A newer claim supersedes an older one: only the newer move can commit.
    moves::claim(&mut c, "test", ix, &claim(2), CALL)
        .unwrap()
        .unwrap();
    moves::claim(&mut c, "test", ix, &claim(3), CALL)
        .unwrap()
        .unwrap();
    assert!(matches!(
        commit(&mut c, 2).unwrap(),
        Err(PlacementError::CalledOff { .. })
    ));
    // A release of another move's claim leaves this one's.
    moves::release(&mut c, "test", ix, "q", "s2", Some(2), CALL)
        .unwrap()
        .unwrap();
    assert!(claimed(&mut c));

    // A commit sent by a primary of an earlier term is refused.
    assert!(matches!(
        moves::commit(&mut c, "test", &move_q(3, term - 1), CALL).unwrap(),
        Err(PlacementError::Deposed { .. })
    ));

    // Committed first: the claim is gone with it, and a release then reads the new owner.
    let epoch = read(&mut c).placement.epoch;
    assert_eq!(owner(commit(&mut c, 3).unwrap()), "s2");
    assert!(!claimed(&mut c));
    assert!(read(&mut c).placement.epoch > epoch);
    let r = moves::release(&mut c, "test", ix, "q", "s2", Some(3), CALL).unwrap();
    assert_eq!(owner(r), "s2");
    // A commit sent again (its answer lost) answers the tube as it stands.
    assert_eq!(owner(commit(&mut c, 3).unwrap()), "s2");
    // A set that owns the partition claims nothing.
    let r = moves::claim(&mut c, "test", ix, &claim(4), CALL).unwrap();
    assert_eq!(owner(r), "s2");
    assert!(!claimed(&mut c));
    // A release without a move's id takes any claim for the set.
    let back = MoveClaim {
        id: 5,
        tube: "q".into(),
        to: "s1".into(),
    };
    moves::claim(&mut c, "test", ix, &back, CALL)
        .unwrap()
        .unwrap();
    let r = moves::release(&mut c, "test", ix, "q", "s1", None, CALL).unwrap();
    assert_eq!(owner(r), "s2");
    assert!(!claimed(&mut c));
}

#[test]
fn the_placement_fence_runs_out_when_etcd_stops_answering() {
    let etcd = etcd();
    let x1 = Node::start(sharded(&etcd.client_url, "x1", "s1"));
    x1.wait_leader();
    let o = wait_map(&x1, "default placed", |o| {
        o.placement.tubes.contains_key("default")
    });
    let fence = x1.cluster.placement_fence();
    // Validity: the lease TTL less the safety margin (a quarter of it).
    let validity = TTL - TTL / 4;
    let (epoch, until) = fence.view().unwrap();
    assert!(epoch >= o.placement.epoch);
    assert!(until <= Instant::now() + validity);

    etcd.pause();
    let paused = Instant::now();
    // No read sent after the pause can succeed, so the view must lapse by then.
    assert_eq!(fence.valid_at(paused + validity), None);
    wait_until("the placement view to lapse", || {
        fence.valid_at(Instant::now()).is_none()
    });
    let lapsed = Instant::now();
    assert!(
        lapsed - paused <= validity + Duration::from_millis(500),
        "lapsed {:?} after the pause",
        lapsed - paused
    );
    // A change asked meanwhile fails with etcd's error, after its budget.
    x1.cluster
        .create_tube(1, "q", "fifo", serde_json::Value::Null, 1);
    assert!(matches!(done(&x1, 1), Err(PlacementError::Etcd(_))));

    etcd.resume();
    x1.wait("EtcdRestored", |e| {
        (e.kind == EventKind::EtcdRestored).then_some(())
    });
    wait_until("the placement view to hold again", || {
        fence.valid_at(Instant::now()).is_some()
    });
}

#[test]
fn a_poll_reads_the_placement_again_only_when_the_epoch_moved() {
    let etcd = etcd();
    let (x1, _y1) = two_sets(&etcd.client_url);
    let epoch = x1.cluster.placement().epoch;
    // A tube key written by hand, past the epoch: polls do not read it...
    let forged = serde_json::json!({
        "name": "forged", "kind": "fifo", "options": null,
        "partitions": [{"index": 77, "set": "s1", "first": 0}],
    });
    etcd.put_json("/tarq/test/placement/tubes/forged", &forged);
    // ...while they go on.
    let before = x1.cluster.overview().read_at.unwrap();
    wait_until("two more polls", || {
        x1.cluster.overview().read_at.unwrap() > before + Duration::from_millis(250)
    });
    assert!(!x1.cluster.placement().tubes.contains_key("forged"));
    assert_eq!(x1.cluster.placement().epoch, epoch);
    // ...until a change moves the epoch: then the whole placement is read.
    x1.cluster
        .create_tube(1, "q", "fifo", serde_json::Value::Null, 1);
    done(&x1, 1).unwrap();
    let o = wait_map(&x1, "the change", |o| o.placement.epoch > epoch);
    assert!(o.placement.tubes.contains_key("forged"));
    assert!(o.placement.owned_since(77).is_some());
}
