//! The election's rules as pure functions and plain values, so they are tested without etcd:
//! what a node publishes about itself (`Member`), what the leader key holds (`LeaderRecord`),
//! how replication positions compare (`Position`), who may campaign (`may_campaign`), and the
//! fence that tells the loop, from its own monotonic clock, whether it may still act as leader
//! (`Fence`). Talking to etcd is `node`'s business.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Instant;

use serde::{Deserialize, Serialize};

/// How far a node's copy of the log reaches: the term of its last record, then the record's
/// sequence number. Ordered term first, as Raft compares logs: records of a newer term win
/// over more records of an older one, because the older term's tail past the newer leader's
/// start was never acknowledged by that leader's cluster.
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
pub struct Position {
    pub term: u64,
    pub lsn: u64,
}

/// What a node holds as a leader or a follower, as written in its member key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    Leader,
    Replica,
}

/// The value of a member key (`<prefix>/members/<name>`), bound to the member's lease: it
/// exists while the member keeps its lease alive.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Member {
    pub name: String,
    pub addr: String,
    pub role: Role,
    /// Whether the member takes part in elections: false for a node configured never to lead
    /// and for a leader that has just resigned.
    pub eligible: bool,
    pub position: Position,
}

/// The value of the leader key (`<prefix>/leader`), bound to the leader's lease.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeaderRecord {
    pub name: String,
    pub addr: String,
}

/// The rule "the most up-to-date replica wins": with no leader, a node campaigns only when no
/// other live eligible member has published a position ahead of its own. Equal positions all
/// campaign and the create-if-absent transaction picks one. The campaign transaction also
/// requires that no member key changed since `members` was read, so a position published in
/// between makes the attempt fail and the rule is applied again to the newer values.
///
/// And a node campaigns only when it holds the set's committed position (`committed`, what a
/// leader with synchronous replicas recorded in etcd before it acknowledged anything up to
/// it): the live members are not enough, because those that acknowledged may all be down.
/// Raft elects no candidate whose log lacks a committed entry for the same reason; Kafka
/// learnt it as KIP-966. Such a set stays without a primary until a member that holds the
/// position returns.
pub fn may_campaign(me: &Member, members: &[Member], committed: Option<Position>) -> bool {
    me.eligible
        && committed.is_none_or(|c| me.position >= c)
        && members
            .iter()
            .filter(|m| m.eligible && m.name != me.name)
            .all(|m| m.position <= me.position)
}

/// Why a member is held back by the committed position, for operators: `None` when it holds
/// it (or nothing was recorded).
pub fn behind_committed(me: &Member, committed: Option<Position>) -> Option<String> {
    let c = committed.filter(|&c| me.position < c)?;
    Some(format!(
        "this node's log ends at term {} lsn {}, before the committed position term {} lsn {}: \
         only a member that holds every acknowledged change may lead, so the set waits for one \
         (the primary or a synchronous replica that acknowledged it) to return",
        me.position.term, me.position.lsn, c.term, c.lsn
    ))
}

/// The leadership claim the loop checks before it acknowledges a change: a term and the
/// instant, on this process's monotonic clock, after which the claim is void. The election
/// thread extends it after each successful lease refresh and clears it when deposed; the
/// loop reads it without waiting on etcd, so a stalled election thread cannot keep a stale
/// claim alive: the deadline passes by itself.
#[derive(Debug, Clone, Default)]
pub struct Fence {
    claim: Arc<Mutex<Option<Claim>>>,
}

/// A term held until an instant.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Claim {
    pub term: u64,
    pub until: Instant,
}

impl Fence {
    /// The term this node leads at `now`, or `None` when it does not lead (or its claim has
    /// run out).
    pub fn term_at(&self, now: Instant) -> Option<u64> {
        self.claim().filter(|c| now < c.until).map(|c| c.term)
    }

    /// The current claim, expired or not.
    pub fn claim(&self) -> Option<Claim> {
        *self.claim.lock().unwrap_or_else(PoisonError::into_inner)
    }

    pub(crate) fn set(&self, claim: Option<Claim>) {
        *self.claim.lock().unwrap_or_else(PoisonError::into_inner) = claim;
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn member(name: &str, term: u64, lsn: u64, eligible: bool) -> Member {
        Member {
            name: name.into(),
            addr: format!("{name}:3301"),
            role: Role::Replica,
            eligible,
            position: Position { term, lsn },
        }
    }

    #[test]
    fn positions_compare_term_first() {
        assert!(Position { term: 2, lsn: 1 } > Position { term: 1, lsn: 1000 });
        assert!(Position { term: 2, lsn: 5 } > Position { term: 2, lsn: 4 });
    }

    #[test]
    fn only_the_most_up_to_date_eligible_member_campaigns() {
        let a = member("a", 3, 10, true);
        let b = member("b", 3, 20, true);
        let c = member("c", 2, 99, true);
        let all = [a.clone(), b.clone(), c.clone()];
        assert!(!may_campaign(&a, &all, None));
        assert!(may_campaign(&b, &all, None));
        assert!(
            !may_campaign(&c, &all, None),
            "an older term loses to more records"
        );
    }

    #[test]
    fn equal_positions_all_campaign() {
        let a = member("a", 3, 20, true);
        let b = member("b", 3, 20, true);
        let all = [a.clone(), b.clone()];
        assert!(may_campaign(&a, &all, None) && may_campaign(&b, &all, None));
    }

    #[test]
    fn ineligible_members_neither_campaign_nor_hold_others_back() {
        let a = member("a", 3, 10, true);
        let resigned = member("old", 3, 50, false);
        let all = [a.clone(), resigned.clone()];
        assert!(may_campaign(&a, &all, None));
        assert!(!may_campaign(&resigned, &all, None));
    }

    #[test]
    fn a_member_alone_campaigns() {
        let a = member("a", 0, 0, true);
        assert!(may_campaign(&a, std::slice::from_ref(&a), None));
        assert!(may_campaign(&a, &[], None));
    }

    #[test]
    fn a_member_behind_the_committed_position_never_campaigns_even_alone() {
        // A lagging replica whose up-to-date peers are all down: alone, so the most up to date
        // of the living, it must still wait.
        let lagging = member("c", 3, 10, true);
        let committed = Some(Position { term: 3, lsn: 50 });
        let alone = std::slice::from_ref(&lagging);
        assert!(!may_campaign(&lagging, alone, committed));
        let why = behind_committed(&lagging, committed).unwrap();
        assert!(
            why.contains("term 3 lsn 10") && why.contains("term 3 lsn 50"),
            "{why}"
        );
        let holder = member("b", 3, 50, true);
        let both = [holder.clone(), lagging.clone()];
        assert!(may_campaign(&holder, &both, committed));
        assert_eq!(behind_committed(&holder, committed), None);
        // A newer term's records hold everything the older term committed.
        let newer = member("d", 4, 1, true);
        assert!(may_campaign(
            &newer,
            std::slice::from_ref(&newer),
            committed
        ));
    }

    #[test]
    fn member_value_is_readable_json() {
        let text = serde_json::to_string(&member("a", 3, 10, true)).unwrap();
        assert_eq!(
            text,
            r#"{"name":"a","addr":"a:3301","role":"replica","eligible":true,"position":{"term":3,"lsn":10}}"#
        );
    }

    #[test]
    fn fence_claim_runs_out_by_itself() {
        let fence = Fence::default();
        let t0 = Instant::now();
        assert_eq!(fence.term_at(t0), None);
        fence.set(Some(Claim {
            term: 7,
            until: t0 + Duration::from_secs(1),
        }));
        assert_eq!(fence.term_at(t0), Some(7));
        assert_eq!(fence.term_at(t0 + Duration::from_millis(999)), Some(7));
        assert_eq!(fence.term_at(t0 + Duration::from_secs(1)), None);
        fence.set(None);
        assert_eq!(fence.term_at(t0), None);
    }
}
