//! A partition move's **claim** in etcd: the one key through which the move commits or is
//! called off, so the two cannot both happen.
//!
//! Key `/tarq/<cluster>/moves/<index>`: a [`MoveClaim`] as JSON, `{"id","tube","to"}`. The new
//! owner's primary puts it when a copy of the partition at `index` begins there ([`claim`]),
//! and answers the old owner only then. The move's commit ([`commit`]) requires that claim,
//! unchanged since it read it, and deletes it in the same transaction that gives the partition
//! to the new set (the commit also requires its sender to lead the old set still). Whoever
//! calls the move off deletes the claim if it is still there, and reads in the same
//! transaction where the partition is ([`release`]): the new owner before it discards its copy
//! (its sender's link closed, the copy stalled, the old owner gave up, a copy found after a
//! restart), the old owner whose commit went unanswered.
//!
//! etcd orders the commit and a release. A release that comes first leaves no claim, so the
//! commit — however late it arrives — fails; a commit that comes first leaves the partition
//! placed on the new set, which the release reads. So the new owner discards its copy only once
//! the commit can no longer happen, and an old owner whose commit's answer was lost learns from
//! etcd which way it went, not from how recently it read the placement (a read made after the
//! commit was sent may still come before a commit that is in flight).
//!
//! A claim supersedes the one before it at that index (a newer copy of the partition begins):
//! the older move's commit then fails too. A claim left behind (its holder stopped) is
//! harmless: no commit but its own move's can use it, and the next claim replaces it.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::etcd::{Client, Compare, EtcdError, Kv, Op};
use crate::placement::{
    commit_if, json_of, map_ops, parse_map, plan_place_from, put_json, tube_key, ClusterMap,
    PlacementError, TubePlacement, MAX_ATTEMPTS,
};

/// A copy of a partition under way on replica set `to` for move `id` (chosen by the old
/// owner, unique to the move).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MoveClaim {
    pub id: u64,
    pub tube: String,
    pub to: String,
}

/// What a change of the claims answers: the tube as placed, or why not, inside etcd's own
/// failure.
type Answer = Result<Result<TubePlacement, PlacementError>, EtcdError>;

/// The claim key of the partition at `index`.
pub fn claim_key(cluster: &str, index: u16) -> Vec<u8> {
    format!("/tarq/{cluster}/moves/{index}").into_bytes()
}

/// The set owning the partition at `index` of `t`, if `t` has it.
pub fn owner_at(t: &TubePlacement, index: u16) -> Option<&str> {
    t.partitions
        .iter()
        .find(|p| p.index == index)
        .map(|p| p.set.as_str())
}

/// Claims the partition at `index` of tube `claim.tube` for a copy on set `claim.to`, unless
/// that set owns it already (then nothing is written). Answers the tube as placed when the
/// claim was made: from then on no earlier claim's move can commit.
pub fn claim(
    client: &mut Client,
    cluster: &str,
    index: u16,
    claim: &MoveClaim,
    budget: Duration,
) -> Answer {
    let (tkey, ckey) = (tube_key(cluster, &claim.tube), claim_key(cluster, index));
    for _ in 0..MAX_ATTEMPTS {
        let (tube, _) = read_tube_and_claim(client, &tkey, &ckey, budget)?;
        let (t, tube_rev) = match tube_at(tube, &claim.tube, index) {
            Ok(t) => t,
            Err(e) => return Ok(Err(e)),
        };
        if owner_at(&t, index) == Some(claim.to.as_str()) {
            return Ok(Ok(t));
        }
        // Put while the tube is as read, so the owner answered is the one at the claim.
        let compare = [Compare::ModRevision(tkey.clone(), tube_rev)];
        let put = [put_json(ckey.clone(), claim)];
        if client.txn(&compare, &put, &[], budget)?.succeeded {
            return Ok(Ok(t));
        }
    }
    Ok(Err(PlacementError::Conflict {
        attempts: MAX_ATTEMPTS,
    }))
}

/// Withdraws the claim of move `id` on the partition at `index` (with `id` `None`: any claim
/// for set `to`) if it is there. Answers the tube as placed once no such claim is left: if it
/// gives the partition to `to`, the move committed; if not, it never will.
pub fn release(
    client: &mut Client,
    cluster: &str,
    index: u16,
    tube: &str,
    to: &str,
    id: Option<u64>,
    budget: Duration,
) -> Answer {
    let (tkey, ckey) = (tube_key(cluster, tube), claim_key(cluster, index));
    for _ in 0..MAX_ATTEMPTS {
        let (read, claimed) = read_tube_and_claim(client, &tkey, &ckey, budget)?;
        let ours = claimed.filter(|kv| {
            json_of::<MoveClaim>(kv).is_some_and(|c| c.to == to && id.is_none_or(|i| c.id == i))
        });
        let Some(kv) = ours else {
            // Not claimed for this move: nothing can commit it, the tube says where it is.
            return Ok(tube_at(read, tube, index).map(|(t, _)| t));
        };
        let compare = [Compare::ModRevision(ckey.clone(), kv.mod_revision)];
        let ops = [Op::Delete(ckey.clone()), Op::Get(tkey.clone())];
        let reply = client.txn(&compare, &ops, &[], budget)?;
        if reply.succeeded {
            let tube_kv = reply.ranges.into_iter().next().unwrap_or_default();
            return Ok(tube_at(tube_kv.into_iter().next(), tube, index).map(|(t, _)| t));
        }
    }
    Ok(Err(PlacementError::Conflict {
        attempts: MAX_ATTEMPTS,
    }))
}

/// A move's commit, as the old owner's primary asks for it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Commit {
    pub tube: String,
    pub partition: u16,
    /// The partition's index (its claim's key).
    pub index: u16,
    pub from: String,
    pub to: String,
    /// The number the partition numbers on from at least on its new owner.
    pub first: u64,
    /// The move's id: its claim must name it.
    pub id: u64,
    /// The term of `from`'s primary that sends it: that primary must lead its set still, or a
    /// commit that reaches etcd late could hand over a copy its successor has written past.
    pub term: u64,
    /// What `from` did with the partition while it owned it, by counter: added to the
    /// partition's `carried`.
    pub carried: std::collections::BTreeMap<String, u64>,
}

/// A move's commit: gives the partition to set `to`, numbering from `first` at least there,
/// if set `from` owns it, its primary of term `term` still leads it, and move `id`'s claim on
/// the partition for `to` is still there — deleting the claim in the same transaction. Answers
/// the tube as placed now; the tube as it stands if the partition is `to`'s already (an
/// attempt whose answer was lost); `Err(CalledOff)` if the claim is gone, `Err(Deposed)` if
/// the term no longer leads, `Err(Moved)` if another set owns the partition.
pub fn commit(client: &mut Client, cluster: &str, c: &Commit, budget: Duration) -> Answer {
    let ckey = claim_key(cluster, c.index);
    let leader_key = crate::placement::leader_key(cluster, &c.from);
    for _ in 0..MAX_ATTEMPTS {
        let mut reads = map_ops(cluster, true);
        reads.push(Op::Get(ckey.clone()));
        let mut ranges = client.txn(&[], &reads, &[], budget)?.ranges.into_iter();
        let map = parse_map(cluster, &mut ranges);
        let claimed = ranges.next().unwrap_or_default().into_iter().next();
        let claim_rev = match check_commit(&map, claimed, c) {
            Ok(Ok(rev)) => rev,
            Ok(Err(done)) => return Ok(Ok(done)),
            Err(e) => return Ok(Err(e)),
        };
        let mut t = match plan_place_from(&map, &c.tube, c.partition, &c.to, c.first) {
            Ok(t) => t,
            Err(e) => return Ok(Err(e)),
        };
        if let Some(p) = t.partitions.get_mut(usize::from(c.partition)) {
            for (counter, n) in &c.carried {
                *p.carried.entry(counter.clone()).or_default() += n;
            }
        }
        let compare = vec![
            Compare::ModRevision(ckey.clone(), claim_rev),
            Compare::CreateRevision(leader_key.clone(), c.term as i64),
        ];
        let ops = vec![
            put_json(tube_key(cluster, &c.tube), &t),
            Op::Delete(ckey.clone()),
        ];
        let what = format!(
            "move {} partition {} from {} to {}",
            c.tube, c.partition, c.from, c.to
        );
        let epoch = map.placement.epoch;
        if commit_if(client, cluster, epoch, compare, ops, &what, budget)?.succeeded {
            return Ok(Ok(t));
        }
    }
    Ok(Err(PlacementError::Conflict {
        attempts: MAX_ATTEMPTS,
    }))
}

/// Whether commit `c` may be written on `map` (with the partition's claim as read): the
/// claim's mod revision to compare; the tube as it stands if the partition is `to`'s already;
/// or why not.
fn check_commit(
    map: &ClusterMap,
    claimed: Option<Kv>,
    c: &Commit,
) -> Result<Result<i64, TubePlacement>, PlacementError> {
    match map.placement.owner(&c.tube, c.partition) {
        Some(o) if o == c.to => return Ok(Err(map.placement.tubes[&c.tube].clone())),
        Some(o) if o != c.from => {
            return Err(PlacementError::Moved {
                tube: c.tube.clone(),
                partition: c.partition,
                owner: o.into(),
            })
        }
        _ => {}
    }
    if !map.led_in(&c.from, c.term) {
        return Err(PlacementError::Deposed {
            set: c.from.clone(),
            term: c.term,
        });
    }
    let ours = claimed.filter(|kv| {
        json_of::<MoveClaim>(kv).is_some_and(|m| m.id == c.id && m.to == c.to && m.tube == c.tube)
    });
    match ours {
        Some(kv) => Ok(Ok(kv.mod_revision)),
        None => Err(PlacementError::CalledOff {
            tube: c.tube.clone(),
            partition: c.partition,
            to: c.to.clone(),
        }),
    }
}

/// The tube key and the claim key, read at one revision.
fn read_tube_and_claim(
    client: &mut Client,
    tkey: &[u8],
    ckey: &[u8],
    budget: Duration,
) -> Result<(Option<Kv>, Option<Kv>), EtcdError> {
    let reads = [Op::Get(tkey.to_vec()), Op::Get(ckey.to_vec())];
    let mut ranges = client.txn(&[], &reads, &[], budget)?.ranges.into_iter();
    let mut first = || ranges.next().unwrap_or_default().into_iter().next();
    Ok((first(), first()))
}

/// Tube `name` from its key as read, with the key's mod revision; `NoTube` if it is absent
/// or does not hold the partition at `index` (the tube was dropped, maybe made again).
fn tube_at(kv: Option<Kv>, name: &str, index: u16) -> Result<(TubePlacement, i64), PlacementError> {
    let gone = || PlacementError::NoTube(name.to_owned());
    let kv = kv.ok_or_else(gone)?;
    let t: TubePlacement = json_of(&kv).ok_or_else(gone)?;
    if t.name != name || owner_at(&t, index).is_none() {
        return Err(gone());
    }
    Ok((t, kv.mod_revision))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_claim_is_readable_json_under_its_index() {
        let c = MoveClaim {
            id: 7,
            tube: "jobs".into(),
            to: "b".into(),
        };
        let json = serde_json::to_string(&c).unwrap();
        assert_eq!(json, r#"{"id":7,"tube":"jobs","to":"b"}"#);
        assert_eq!(claim_key("c", 12), b"/tarq/c/moves/12");
    }

    #[test]
    fn the_owner_is_found_by_index() {
        let t = TubePlacement {
            name: "q".into(),
            kind: "fifo".into(),
            options: serde_json::Value::Null,
            partitions: vec![
                crate::placement::PartitionPlacement {
                    carried: Default::default(),
                    index: 3,
                    set: "a".into(),
                    first: 0,
                },
                crate::placement::PartitionPlacement {
                    carried: Default::default(),
                    index: 9,
                    set: "b".into(),
                    first: 0,
                },
            ],
        };
        assert_eq!(owner_at(&t, 9), Some("b"));
        assert_eq!(owner_at(&t, 4), None);
    }
}
