//! The cluster map of a sharded tarq cluster: which replica sets exist and who leads each
//! (`SetView`), and where every partition of every tube lives (`Placement`), as stored in etcd
//! under `/tarq/<cluster>/`; the rules that change the placement (`plan_create`, `plan_drop`,
//! `plan_place`, pure functions over a read map), and the blocking calls that read it and
//! commit a change (`read`, `create_tube`, `drop_tube`, `place`, `ensure_default`), shared by
//! the election thread and by tools such as `tarq ctl`. What a partition holds and how calls
//! reach it is the server's business.
//!
//! Keys, under `/tarq/<cluster>/placement/`:
//! - `tubes/<name>`: a `TubePlacement` as JSON. The tube's name follows `tubes/` as its own
//!   UTF-8 bytes, not encoded (etcd keys are bytes; the name is the key's whole remainder, so
//!   a `/` in it is harmless); the value's `name` is the authority.
//! - `indexes/<ix>` (decimal, 0 to `MAX_INDEX`): an `IndexUse`, `{"tube","partition"}` while a
//!   partition lives there, `{"floor": n}` once its tube was dropped: the task number the next
//!   tube at that index starts from, so ids never repeat. Never written: floor 0.
//! - `epoch`: its value says what the last change was; its **mod revision is the placement
//!   epoch**. Every change is one transaction that compares the epoch key's mod revision with
//!   the epoch its writer read (or requires the key absent at epoch 0) and puts the epoch key,
//!   so changes are serialized, a writer that read a stale map retries on a fresh one, and
//!   every node can tell which of two maps is newer.
//!
//! Index 0 is always the tube `default` (the seed API's tube): `ensure_default` creates it,
//! owned by the set whose primary gets there first.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use tracing::warn;

use crate::election::{LeaderRecord, Member};
use crate::etcd::{Client, Compare, EtcdError, Kv, Op, TxnReply};
use crate::DEFAULT_SET;

/// Highest partition index. A task id is `index << 41 | number` (the engine's
/// `TUBE_ID_SHIFT`), and ids stay below 2^53 for JavaScript clients: 12 bits of index, 0 to
/// 4095, the engine's `MAX_TUBES` slots. Index 0 is `default`'s.
pub const MAX_INDEX: u16 = 4095;
/// Most partitions of one tube. A take that finds its local partitions empty tries the others,
/// and whole-tube calls (`statistics`, `kick`, `truncate`) visit every one: their cost grows
/// with the count. 256 is far more owners than a cluster has sets (spreading needs no more
/// partitions than sets, a few times over for later moves), and leaves the 4095 indexes room
/// for at least fifteen such tubes beside many small ones.
pub const MAX_PARTITIONS: u16 = 256;
/// Attempts of one change before it gives up with `PlacementError::Conflict`: each failed
/// attempt means another change committed in between, so this many in a row is a storm of
/// changes that a caller should hear about rather than wait out.
pub const MAX_ATTEMPTS: usize = 8;
/// The tube kinds a placement may name (the engine's `TubeType`s).
pub const TUBE_KINDS: [&str; 5] = ["fifo", "fifottl", "limfifottl", "utube", "utubettl"];
/// The seed API's tube: at index 0, made by `ensure_default`.
pub const DEFAULT_TUBE: &str = "default";
/// Longest tube name: the engine's `MAX_TUBE_NAME_BYTES` (beanstalkd's limit).
pub const MAX_TUBE_NAME_BYTES: usize = 200;

/// Where a tube's partitions live, as stored in `placement/tubes/<name>`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TubePlacement {
    pub name: String,
    /// "fifo", "fifottl", "limfifottl", "utube" or "utubettl".
    pub kind: String,
    /// The tube's options as the caller gave them; this crate does not read them.
    pub options: serde_json::Value,
    /// Partition `p` is `partitions[p]`.
    pub partitions: Vec<PartitionPlacement>,
}

/// One partition: the engine index it lives at (the high bits of its task ids), the replica
/// set that owns it, and the task number it starts from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PartitionPlacement {
    pub index: u16,
    pub set: String,
    pub first: u64,
    /// What the partition's earlier owners did with it, by counter (`puts`, `takes`, ...):
    /// each move's commit adds the old owner's counts, so the tube's figures, summed over the
    /// owners' own counts and these, never go back when a partition changes hands.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub carried: BTreeMap<String, u64>,
}

/// What an index key holds.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum IndexUse {
    /// Partition `partition` of `tube` lives here.
    Used { tube: String, partition: u16 },
    /// Free; a tube placed here starts its numbers at `floor`.
    Free { floor: u64 },
}

/// One replica set as last read: its leader with the leader's term, and its member keys.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SetView {
    pub name: String,
    pub leader: Option<(LeaderRecord, u64)>,
    pub members: Vec<Member>,
}

/// The placement at one epoch.
///
/// `owned_since` is this node's own observation, not etcd's: for each index that this node's
/// replica set owns in this view, the instant (this process's monotonic clock) at which this
/// node's reads first showed its set owning it, taken when the reply of that read arrived. The
/// read that showed the previous owner its ownership for the last time was served before the
/// change committed, hence before that instant; so that owner's `PlacementFence` has run out
/// by `owned_since + validity` (validity = lease TTL minus the safety margin), and a new owner
/// that waits until then never overlaps an old one that still believes it owns the partition.
/// The first read after start counts as a first sighting, so the hold is conservative for a
/// restarted node and for a freshly created tube (its owner may skip the hold for a tube it
/// saw created at an index that was free in its previous view, if it wants to).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Placement {
    /// The mod revision of the epoch key; 0 before the first change ever.
    pub epoch: i64,
    pub tubes: BTreeMap<String, TubePlacement>,
    pub indexes: BTreeMap<u16, IndexUse>,
    owned_since: BTreeMap<u16, (String, Instant)>,
}

impl Placement {
    /// When this node first saw its replica set own the partition at `index` (see the type's
    /// doc); `None` if its set does not own it in this view, or for a placement read by a tool.
    pub fn owned_since(&self, index: u16) -> Option<Instant> {
        self.owned_since.get(&index).map(|(_, at)| *at)
    }

    /// The tube and partition living at `index`.
    pub fn at_index(&self, index: u16) -> Option<(&TubePlacement, u16)> {
        self.tubes.values().find_map(|t| {
            t.partitions
                .iter()
                .position(|p| p.index == index)
                .map(|p| (t, p as u16))
        })
    }

    /// The replica set owning partition `partition` of `tube`.
    pub fn owner(&self, tube: &str, partition: u16) -> Option<&str> {
        let t = self.tubes.get(tube)?;
        t.partitions
            .get(usize::from(partition))
            .map(|p| p.set.as_str())
    }

    /// The number the next tube at `index` starts from: its recorded floor, 0 if none.
    pub fn floor(&self, index: u16) -> u64 {
        match self.indexes.get(&index) {
            Some(IndexUse::Free { floor }) => *floor,
            _ => 0,
        }
    }

    /// How many partitions each set owns, over every tube.
    pub fn load(&self) -> BTreeMap<&str, usize> {
        let mut load = BTreeMap::new();
        for p in self.tubes.values().flat_map(|t| &t.partitions) {
            *load.entry(p.set.as_str()).or_default() += 1;
        }
        load
    }

    fn used(&self, index: u16) -> bool {
        matches!(self.indexes.get(&index), Some(IndexUse::Used { .. }))
            || self.at_index(index).is_some()
    }

    /// Carries `owned_since` over from the previous view of this node (set `set`): an index
    /// whose tube and owner are unchanged keeps its instant, one newly owned gets `seen`.
    pub(crate) fn track_ownership(
        &mut self,
        previous: Option<&Placement>,
        set: &str,
        seen: Instant,
    ) {
        let mut owned = BTreeMap::new();
        for t in self.tubes.values() {
            for p in t.partitions.iter().filter(|p| p.set == set) {
                let kept = previous
                    .and_then(|prev| prev.owned_since.get(&p.index))
                    .filter(|(tube, _)| *tube == t.name)
                    .map(|(_, at)| *at);
                owned.insert(p.index, (t.name.clone(), kept.unwrap_or(seen)));
            }
        }
        self.owned_since = owned;
    }
}

/// Every set and the placement, read at one revision.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ClusterMap {
    /// Sorted by name; `default` only if it has a leader or a member.
    pub sets: Vec<SetView>,
    pub placement: Placement,
}

impl ClusterMap {
    fn live_sets(&self) -> impl Iterator<Item = &SetView> {
        self.sets.iter().filter(|s| s.leader.is_some())
    }

    /// Whether set `set` is led, as read, by its primary of term `term`.
    pub(crate) fn led_in(&self, set: &str, term: u64) -> bool {
        (self.sets.iter())
            .find(|s| s.name == set)
            .and_then(|s| s.leader.as_ref())
            .is_some_and(|(_, t)| *t == term)
    }
}

/// The key whose create revision is set `set`'s leader's term: a transaction comparing it
/// holds only while that primary leads.
pub(crate) fn leader_key(cluster: &str, set: &str) -> Vec<u8> {
    format!("{}leader", crate::set_prefix(cluster, set)).into_bytes()
}

/// Why a placement change was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PlacementError {
    /// Boxed: a whole tube beside the other variants' few words.
    #[error("tube {:?} exists already", .0.name)]
    Exists(Box<TubePlacement>),
    #[error("no tube {0:?} in the placement")]
    NoTube(String),
    #[error("tube {tube:?} has {partitions} partitions: no partition {partition}")]
    NoPartition {
        tube: String,
        partition: u16,
        partitions: usize,
    },
    #[error("a tube name of {0} bytes: 1 to {MAX_TUBE_NAME_BYTES} are allowed")]
    BadName(usize),
    #[error("tube kind {0:?} is not one of fifo, fifottl, limfifottl, utube, utubettl")]
    BadKind(String),
    #[error("{0} partitions: a tube has 1 to {MAX_PARTITIONS}")]
    Partitions(u16),
    #[error("no replica set has a leader now: a tube's partitions need live owners")]
    NoLiveSet,
    #[error("replica set {0:?} has no member in the cluster")]
    UnknownSet(String),
    #[error(
        "{needed} partitions need {needed} free indexes; only {free} of the {MAX_INDEX} are free"
    )]
    IndexesExhausted { needed: u16, free: usize },
    #[error("index 0 belongs to the tube default, not {0:?}")]
    IndexZeroTaken(String),
    #[error("the placement changed under {attempts} attempts in a row; try again")]
    Conflict { attempts: usize },
    #[error("partition {partition} of tube {tube:?} is owned by replica set {owner:?} now")]
    Moved {
        tube: String,
        partition: u16,
        owner: String,
    },
    /// A move's commit found its claim gone (`moves`): the copy on the new owner was
    /// discarded, or the move called off.
    #[error(
        "the move of partition {partition} of tube {tube:?} to replica set {to:?} was called off: \
         its copy there is no longer claimed in etcd"
    )]
    CalledOff {
        tube: String,
        partition: u16,
        to: String,
    },
    /// A move's commit sent by a primary that no longer leads its set (`moves`).
    #[error(
        "the primary of replica set {set:?} in term {term} no longer leads it: its move's commit \
         is refused"
    )]
    Deposed { set: String, term: u64 },
    /// A drop's check passed on a primary that no longer leads its set: its successor holds
    /// nothing for the drop and may have taken changes since. Nothing was written.
    #[error(
        "the primary of replica set {set:?} that checked the drop (term {term}) no longer \
         leads it: nothing was dropped"
    )]
    CheckedByDeposed { set: String, term: u64 },
    /// A drop's partition is owned now by a set that did not pass its check: it moved since,
    /// or the check was relayed past a stale view to an owner the commit cannot fence. That
    /// owner's successor could hold nothing for the drop. Nothing was written.
    #[error(
        "partition {partition} of tube {tube:?} is owned by replica set {set:?}, which did not \
         check the drop: nothing was dropped"
    )]
    CheckedElsewhere {
        tube: String,
        partition: u16,
        set: String,
    },
    /// A drop's commit not begun by its deadline: the partitions' owners hold the tube's
    /// changes only so long after its checks (`Cluster::drop_tube`). Nothing was written.
    #[error(
        "the drop of tube {0:?} was not committed in time after its checks; nothing was dropped"
    )]
    TooLate(String),
    #[error("etcd: {0}")]
    Etcd(String),
}

/// Whether this node's view of the placement may still be acted on: the epoch of the last
/// successful read and the instant it stops being trustworthy, `read started + (lease TTL -
/// safety margin)`. A change committed after that read could by then have moved a partition
/// away and its new owner may act (it holds a moved partition until its own `owned_since +
/// validity`), so the loop refuses changes on partitioned tubes when `valid_at` is `None`, as
/// the leader fence makes a stale primary refuse. The election thread extends it after each
/// read; a stalled thread (SIGSTOP, etcd unreachable) cannot keep it alive: the deadline passes
/// by itself.
#[derive(Debug, Clone, Default)]
pub struct PlacementFence {
    view: Arc<Mutex<Option<(i64, Instant)>>>,
}

impl PlacementFence {
    /// The epoch this node's view holds at `now`, or `None` once it may be stale (or before
    /// the first read).
    pub fn valid_at(&self, now: Instant) -> Option<i64> {
        self.view()
            .filter(|(_, until)| now < *until)
            .map(|(e, _)| e)
    }

    /// The epoch and deadline last stored, expired or not.
    pub fn view(&self) -> Option<(i64, Instant)> {
        *self.view.lock().unwrap_or_else(PoisonError::into_inner)
    }

    pub(crate) fn set(&self, epoch: i64, until: Instant) {
        *self.view.lock().unwrap_or_else(PoisonError::into_inner) = Some((epoch, until));
    }
}

// ---------------------------------------------------------------------------------------------
// Keys and reading

/// The keys of the map of `cluster`.
struct Keys {
    default_leader: Vec<u8>,
    default_members: Vec<u8>,
    sets: Vec<u8>,
    placement: Vec<u8>,
}

impl Keys {
    fn of(cluster: &str) -> Keys {
        Keys {
            default_leader: format!("/tarq/{cluster}/leader").into_bytes(),
            default_members: format!("/tarq/{cluster}/members/").into_bytes(),
            sets: format!("/tarq/{cluster}/sets/").into_bytes(),
            placement: format!("/tarq/{cluster}/placement/").into_bytes(),
        }
    }
}

pub(crate) fn epoch_key(cluster: &str) -> Vec<u8> {
    format!("/tarq/{cluster}/placement/epoch").into_bytes()
}

pub(crate) fn tube_key(cluster: &str, tube: &str) -> Vec<u8> {
    format!("/tarq/{cluster}/placement/tubes/{tube}").into_bytes()
}

fn index_key(cluster: &str, index: u16) -> Vec<u8> {
    format!("/tarq/{cluster}/placement/indexes/{index}").into_bytes()
}

/// The reads of the map, in the order `parse_map` takes their results; the election thread
/// appends them to its own read so the whole view is one revision. Without `placement` only
/// the epoch key is read of the placement: the election thread asks for that much when the
/// epoch is the one it holds (every change puts the epoch key), so a poll does not carry the
/// whole placement while nothing changes.
pub(crate) fn map_ops(cluster: &str, placement: bool) -> Vec<Op> {
    let k = Keys::of(cluster);
    vec![
        Op::Get(k.default_leader),
        Op::GetPrefix(k.default_members),
        Op::GetPrefix(k.sets),
        if placement {
            Op::GetPrefix(k.placement)
        } else {
            Op::Get(epoch_key(cluster))
        },
    ]
}

/// The map from the results of `map_ops`. Values that do not parse are logged and skipped:
/// a hand-edited key must not stop every node.
pub(crate) fn parse_map(cluster: &str, ranges: &mut impl Iterator<Item = Vec<Kv>>) -> ClusterMap {
    let k = Keys::of(cluster);
    let mut sets: BTreeMap<String, SetView> = BTreeMap::new();
    fn set<'a>(sets: &'a mut BTreeMap<String, SetView>, name: &str) -> &'a mut SetView {
        sets.entry(name.to_owned()).or_insert_with(|| SetView {
            name: name.to_owned(),
            leader: None,
            members: Vec::new(),
        })
    }
    let default_leader = ranges.next().unwrap_or_default();
    let default_members = ranges.next().unwrap_or_default();
    let leader = default_leader.iter().find_map(leader_of);
    let members: Vec<Member> = default_members.iter().filter_map(json_of).collect();
    if leader.is_some() || !members.is_empty() {
        let s = set(&mut sets, DEFAULT_SET);
        s.leader = leader;
        s.members = members;
    }
    for kv in ranges.next().unwrap_or_default() {
        let Some(rest) = kv.key.strip_prefix(k.sets.as_slice()) else {
            continue;
        };
        let rest = String::from_utf8_lossy(rest);
        let Some((name, what)) = rest.split_once('/') else {
            continue;
        };
        if what == "leader" {
            set(&mut sets, name).leader = leader_of(&kv);
        } else if what.starts_with("members/") {
            if let Some(m) = json_of(&kv) {
                set(&mut sets, name).members.push(m);
            }
        }
    }
    let mut placement = Placement::default();
    for kv in ranges.next().unwrap_or_default() {
        let Some(rest) = kv.key.strip_prefix(k.placement.as_slice()) else {
            continue;
        };
        if rest == b"epoch" {
            placement.epoch = kv.mod_revision;
        } else if let Some(name) = rest.strip_prefix(b"tubes/") {
            if let Some(t) = json_of::<TubePlacement>(&kv) {
                if t.name.as_bytes() != name {
                    warn!(key = %String::from_utf8_lossy(&kv.key), tube = %t.name, "a tube key names another tube; ignored");
                    continue;
                }
                placement.tubes.insert(t.name.clone(), t);
            }
        } else if let Some(ix) = rest.strip_prefix(b"indexes/") {
            let ix = std::str::from_utf8(ix)
                .ok()
                .and_then(|s| s.parse::<u16>().ok());
            match (ix, json_of::<IndexUse>(&kv)) {
                (Some(ix), Some(u)) if ix <= MAX_INDEX => {
                    placement.indexes.insert(ix, u);
                }
                _ => warn!(key = %String::from_utf8_lossy(&kv.key), "not an index key; ignored"),
            }
        }
    }
    ClusterMap {
        sets: sets.into_values().collect(),
        placement,
    }
}

fn leader_of(kv: &Kv) -> Option<(LeaderRecord, u64)> {
    json_of(kv).map(|l| (l, kv.create_revision as u64))
}

pub(crate) fn json_of<T: serde::de::DeserializeOwned>(kv: &Kv) -> Option<T> {
    match serde_json::from_slice(&kv.value) {
        Ok(v) => Some(v),
        Err(e) => {
            let key = String::from_utf8_lossy(&kv.key);
            warn!(%key, error = %e, "a cluster map key does not parse; ignored");
            None
        }
    }
}

/// Reads every set and the placement of `cluster` in one transaction. `budget`: the call's
/// time limit.
pub fn read(client: &mut Client, cluster: &str, budget: Duration) -> Result<ClusterMap, EtcdError> {
    let reply = client.txn(&[], &map_ops(cluster, true), &[], budget)?;
    Ok(parse_map(cluster, &mut reply.ranges.into_iter()))
}

// ---------------------------------------------------------------------------------------------
// The rules of change, pure

/// The live sets in the order new partitions go to them.
///
/// **Spreading rule.** New partitions go only to sets that have a leader now. The live sets are
/// ordered by how many partitions (of all tubes) each owns, fewest first, ties broken by name;
/// partition `p` of the new tube goes to the `p mod n`-th of them. So a tube of N partitions
/// over S live sets gives each N/S (the least loaded the remainder), and successive
/// one-partition tubes alternate between sets as their counts even out.
pub fn spread_order(map: &ClusterMap) -> Vec<String> {
    let load = map.placement.load();
    let mut live: Vec<(usize, &str)> = map
        .live_sets()
        .map(|s| {
            (
                load.get(s.name.as_str()).copied().unwrap_or(0),
                s.name.as_str(),
            )
        })
        .collect();
    live.sort();
    live.into_iter().map(|(_, n)| n.to_owned()).collect()
}

fn check_tube(name: &str, kind: &str) -> Result<(), PlacementError> {
    if name.is_empty() || name.len() > MAX_TUBE_NAME_BYTES {
        return Err(PlacementError::BadName(name.len()));
    }
    if !TUBE_KINDS.contains(&kind) {
        return Err(PlacementError::BadKind(kind.to_owned()));
    }
    Ok(())
}

/// The tube `create_tube` would write into `map`: indexes the smallest free ones from 1 (the
/// tube `default` always has index 0 for its partition 0), those never used before those a
/// dropped tube left, each starting at its index's floor; owners by `spread_order`.
///
/// Why not a dropped tube's first: a node whose view goes from a dropped tube straight to a
/// new one (both came between two of its polls) still holds the dropped tube's partitions; at
/// other indexes they vanish from its view and it lets go of them, but at the same indexes
/// it would take them for the new tube's, tasks and all.
pub fn plan_create(
    map: &ClusterMap,
    name: &str,
    kind: &str,
    options: serde_json::Value,
    partitions: u16,
) -> Result<TubePlacement, PlacementError> {
    check_tube(name, kind)?;
    if let Some(t) = map.placement.tubes.get(name) {
        return Err(PlacementError::Exists(Box::new(t.clone())));
    }
    if !(1..=MAX_PARTITIONS).contains(&partitions) {
        return Err(PlacementError::Partitions(partitions));
    }
    let owners = spread_order(map);
    if owners.is_empty() {
        return Err(PlacementError::NoLiveSet);
    }
    let p = &map.placement;
    let mut indexes = Vec::with_capacity(usize::from(partitions));
    if name == DEFAULT_TUBE {
        if p.used(0) {
            // Only a damaged map has index 0 in use without a tube `default`.
            return Err(PlacementError::IndexZeroTaken(name.to_owned()));
        }
        indexes.push(0);
    }
    let free: Vec<u16> = (1..=MAX_INDEX)
        .filter(|&ix| !p.used(ix) && !p.indexes.contains_key(&ix))
        .chain((1..=MAX_INDEX).filter(|&ix| !p.used(ix) && p.indexes.contains_key(&ix)))
        .collect();
    let wanted = usize::from(partitions) - indexes.len();
    if free.len() < wanted {
        return Err(PlacementError::IndexesExhausted {
            needed: partitions,
            free: free.len(),
        });
    }
    indexes.extend_from_slice(&free[..wanted]);
    Ok(TubePlacement {
        name: name.to_owned(),
        kind: kind.to_owned(),
        options,
        partitions: indexes
            .into_iter()
            .enumerate()
            .map(|(i, index)| PartitionPlacement {
                carried: BTreeMap::new(),
                index,
                set: owners[i % owners.len()].clone(),
                first: p.floor(index),
            })
            .collect(),
    })
}

/// A drop's commit: tube `name` leaves the placement, each partition's next number kept as
/// its index's floor, if it begins before `not_after`, each set in `checked_by` is still led
/// by the primary (of that term) that passed its partitions' checks, and every partition is
/// owned by one of those sets.
#[derive(Clone, Debug)]
pub struct DropCommit {
    pub name: String,
    pub floors: Vec<(u16, u64)>,
    pub checked_by: Vec<(String, u64)>,
    pub not_after: Instant,
}

/// The floors `drop_tube` writes: for each partition, the largest of the given floor (by
/// partition number), the partition's `first`, and a floor already recorded at its index.
pub fn plan_drop(
    placement: &Placement,
    name: &str,
    floors: &[(u16, u64)],
) -> Result<(TubePlacement, Vec<(u16, u64)>), PlacementError> {
    let tube = placement
        .tubes
        .get(name)
        .ok_or_else(|| PlacementError::NoTube(name.to_owned()))?;
    let written = tube
        .partitions
        .iter()
        .enumerate()
        .map(|(i, p)| {
            let given = floors
                .iter()
                .filter(|(part, _)| usize::from(*part) == i)
                .map(|(_, f)| *f)
                .max()
                .unwrap_or(0);
            (p.index, given.max(p.first).max(placement.floor(p.index)))
        })
        .collect();
    Ok((tube.clone(), written))
}

/// `tube` with partition `partition` owned by `set`, which must have a member or a leader.
pub fn plan_place(
    map: &ClusterMap,
    tube: &str,
    partition: u16,
    set: &str,
) -> Result<TubePlacement, PlacementError> {
    plan_place_from(map, tube, partition, set, 0)
}

/// [`plan_place`], the partition numbering from `first` at least on its new owner (the old
/// owner's next number, so no id is given twice).
pub fn plan_place_from(
    map: &ClusterMap,
    tube: &str,
    partition: u16,
    set: &str,
    first: u64,
) -> Result<TubePlacement, PlacementError> {
    let mut t = map
        .placement
        .tubes
        .get(tube)
        .cloned()
        .ok_or_else(|| PlacementError::NoTube(tube.to_owned()))?;
    if !map.sets.iter().any(|s| s.name == set) {
        return Err(PlacementError::UnknownSet(set.to_owned()));
    }
    let partitions = t.partitions.len();
    let p = t
        .partitions
        .get_mut(usize::from(partition))
        .ok_or_else(|| PlacementError::NoPartition {
            tube: tube.to_owned(),
            partition,
            partitions,
        })?;
    p.set = set.to_owned();
    p.first = p.first.max(first);
    Ok(t)
}

// ---------------------------------------------------------------------------------------------
// Committing a change

/// What one attempt of a change decided on the map it read.
enum Plan {
    /// Nothing to write: the outcome as it stands.
    Done(TubePlacement),
    /// Write `ops` (the epoch key is added) if the epoch is still the one read and `compare`
    /// holds.
    Write {
        ops: Vec<Op>,
        compare: Vec<Compare>,
        what: String,
        outcome: TubePlacement,
    },
}

/// Reads the map, plans, commits under the epoch compare; on a conflict reads again, up to
/// `MAX_ATTEMPTS` times. The outer error is etcd's, the inner one the change's.
fn change(
    client: &mut Client,
    cluster: &str,
    budget: Duration,
    plan: impl FnMut(&ClusterMap) -> Result<Plan, PlacementError>,
) -> Result<Result<TubePlacement, PlacementError>, EtcdError> {
    change_by(client, cluster, budget, None, plan)
}

/// [`change`], no request sent after `not_after` (`None`: no end) nor given longer than until
/// then: past it, `Err(TooLate)` naming `what`.
fn change_by(
    client: &mut Client,
    cluster: &str,
    budget: Duration,
    not_after: Option<(Instant, &str)>,
    mut plan: impl FnMut(&ClusterMap) -> Result<Plan, PlacementError>,
) -> Result<Result<TubePlacement, PlacementError>, EtcdError> {
    // The budget of the next request, or `None` once the deadline has passed.
    let left = || match not_after {
        None => Some(budget),
        Some((at, _)) => {
            let left = at.saturating_duration_since(Instant::now());
            (!left.is_zero()).then(|| budget.min(left))
        }
    };
    let too_late = || PlacementError::TooLate(not_after.map_or("", |(_, w)| w).to_owned());
    for _ in 0..MAX_ATTEMPTS {
        let Some(b) = left() else {
            return Ok(Err(too_late()));
        };
        let map = read(client, cluster, b)?;
        let (ops, compare, what, outcome) = match plan(&map) {
            Err(e) => return Ok(Err(e)),
            Ok(Plan::Done(t)) => return Ok(Ok(t)),
            Ok(Plan::Write {
                ops,
                compare,
                what,
                outcome,
            }) => (ops, compare, what, outcome),
        };
        let Some(b) = left() else {
            return Ok(Err(too_late()));
        };
        let epoch = map.placement.epoch;
        if commit_if(client, cluster, epoch, compare, ops, &what, b)?.succeeded {
            return Ok(Ok(outcome));
        }
    }
    Ok(Err(PlacementError::Conflict {
        attempts: MAX_ATTEMPTS,
    }))
}

/// One change: `ops` and the epoch key's put, if the epoch key is still at `epoch` and
/// `compare` holds.
pub(crate) fn commit_if(
    client: &mut Client,
    cluster: &str,
    epoch: i64,
    mut compare: Vec<Compare>,
    mut ops: Vec<Op>,
    what: &str,
    budget: Duration,
) -> Result<TxnReply, EtcdError> {
    let key = epoch_key(cluster);
    compare.push(if epoch == 0 {
        Compare::CreateRevision(key.clone(), 0)
    } else {
        Compare::ModRevision(key.clone(), epoch)
    });
    ops.push(Op::Put {
        key,
        value: serde_json::to_vec(&serde_json::json!({ "change": what })).expect("json"),
        lease: 0,
    });
    client.txn(&compare, &ops, &[], budget)
}

pub(crate) fn put_json(key: Vec<u8>, value: &impl Serialize) -> Op {
    Op::Put {
        key,
        value: serde_json::to_vec(value).expect("a placement value serializes"),
        lease: 0,
    }
}

fn create_ops(cluster: &str, t: &TubePlacement) -> Vec<Op> {
    let mut ops = vec![put_json(tube_key(cluster, &t.name), t)];
    for (i, p) in t.partitions.iter().enumerate() {
        let used = IndexUse::Used {
            tube: t.name.clone(),
            partition: i as u16,
        };
        ops.push(put_json(index_key(cluster, p.index), &used));
    }
    ops
}

/// Creates tube `name` with `partitions` partitions spread by `spread_order` over the live
/// sets; `Err(Exists)` with the tube as it stands if the name is taken.
pub fn create_tube(
    client: &mut Client,
    cluster: &str,
    name: &str,
    kind: &str,
    options: &serde_json::Value,
    partitions: u16,
    budget: Duration,
) -> Result<Result<TubePlacement, PlacementError>, EtcdError> {
    change(client, cluster, budget, |map| {
        let t = plan_create(map, name, kind, options.clone(), partitions)?;
        Ok(Plan::Write {
            ops: create_ops(cluster, &t),
            compare: Vec::new(),
            what: format!("create tube {name}"),
            outcome: t,
        })
    })
}

/// Deletes tube `name` and leaves a floor at each of its indexes (see `plan_drop`); answers the
/// tube as it was. No request is sent after `not_after` (`Err(TooLate)`, nothing written).
pub fn drop_tube(
    client: &mut Client,
    cluster: &str,
    drop: &DropCommit,
    budget: Duration,
) -> Result<Result<TubePlacement, PlacementError>, EtcdError> {
    let name = drop.name.as_str();
    change_by(
        client,
        cluster,
        budget,
        Some((drop.not_after, name)),
        |map| {
            let (t, written) = plan_drop(&map.placement, name, &drop.floors)?;
            // Each set whose primary passed a check must be led by it still: its successor holds
            // nothing for the drop.
            let mut compare = Vec::new();
            for (set, term) in &drop.checked_by {
                if !map.led_in(set, *term) {
                    return Err(PlacementError::CheckedByDeposed {
                        set: set.clone(),
                        term: *term,
                    });
                }
                compare.push(Compare::CreateRevision(
                    leader_key(cluster, set),
                    *term as i64,
                ));
            }
            // Every partition is owned where a fenced primary checked it: a partition that
            // moved since its check, or whose check was relayed to an owner the dropping
            // node's view did not name, was held by a primary this commit does not fence.
            for (partition, p) in (0u16..).zip(&t.partitions) {
                if !drop.checked_by.iter().any(|(set, _)| *set == p.set) {
                    return Err(PlacementError::CheckedElsewhere {
                        tube: name.to_owned(),
                        partition,
                        set: p.set.clone(),
                    });
                }
            }
            let mut ops = vec![Op::Delete(tube_key(cluster, name))];
            for (index, floor) in written {
                ops.push(put_json(
                    index_key(cluster, index),
                    &IndexUse::Free { floor },
                ));
            }
            Ok(Plan::Write {
                ops,
                compare,
                what: format!("drop tube {name}"),
                outcome: t,
            })
        },
    )
}

/// Gives partition `partition` of `tube` to replica set `set`; answers the tube as placed now.
/// Moving the partition's tasks is not done here.
pub fn place(
    client: &mut Client,
    cluster: &str,
    tube: &str,
    partition: u16,
    set: &str,
    budget: Duration,
) -> Result<Result<TubePlacement, PlacementError>, EtcdError> {
    place_from(client, cluster, tube, partition, set, 0, budget)
}

/// [`place`], the partition numbering from `first` at least on its new owner
/// ([`plan_place_from`]).
pub fn place_from(
    client: &mut Client,
    cluster: &str,
    tube: &str,
    partition: u16,
    set: &str,
    first: u64,
    budget: Duration,
) -> Result<Result<TubePlacement, PlacementError>, EtcdError> {
    change(client, cluster, budget, |map| {
        let t = plan_place_from(map, tube, partition, set, first)?;
        if map.placement.tubes.get(tube) == Some(&t) {
            return Ok(Plan::Done(t));
        }
        Ok(Plan::Write {
            ops: vec![put_json(tube_key(cluster, tube), &t)],
            compare: Vec::new(),
            what: format!("place {tube} partition {partition} on {set}"),
            outcome: t,
        })
    })
}

/// Creates the tube `default` (fifottl, one partition at index 0, starting at index 0's floor)
/// owned by `set` unless it exists; answers the tube as it stands either way. The epoch
/// compare makes it create-if-absent: of sets racing, the first to commit wins.
pub fn ensure_default(
    client: &mut Client,
    cluster: &str,
    set: &str,
    budget: Duration,
) -> Result<Result<TubePlacement, PlacementError>, EtcdError> {
    change(client, cluster, budget, |map| {
        if let Some(t) = map.placement.tubes.get(DEFAULT_TUBE) {
            return Ok(Plan::Done(t.clone()));
        }
        if map.placement.used(0) {
            return Err(PlacementError::IndexZeroTaken(DEFAULT_TUBE.into()));
        }
        let t = TubePlacement {
            name: DEFAULT_TUBE.into(),
            kind: "fifottl".into(),
            options: serde_json::json!({}),
            partitions: vec![PartitionPlacement {
                carried: BTreeMap::new(),
                index: 0,
                set: set.to_owned(),
                first: map.placement.floor(0),
            }],
        };
        Ok(Plan::Write {
            ops: create_ops(cluster, &t),
            compare: Vec::new(),
            what: format!("create tube {DEFAULT_TUBE} on {set}"),
            outcome: t,
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::election::Role;

    fn set(name: &str, live: bool) -> SetView {
        SetView {
            name: name.into(),
            leader: live.then(|| {
                (
                    LeaderRecord {
                        name: format!("{name}-1"),
                        addr: "h:1".into(),
                    },
                    7,
                )
            }),
            members: vec![Member {
                name: format!("{name}-1"),
                addr: "h:1".into(),
                role: Role::Leader,
                eligible: true,
                position: Default::default(),
            }],
        }
    }

    fn map(sets: &[(&str, bool)]) -> ClusterMap {
        ClusterMap {
            sets: sets.iter().map(|(n, l)| set(n, *l)).collect(),
            placement: Placement::default(),
        }
    }

    fn add(map: &mut ClusterMap, t: TubePlacement) {
        for (i, p) in t.partitions.iter().enumerate() {
            map.placement.indexes.insert(
                p.index,
                IndexUse::Used {
                    tube: t.name.clone(),
                    partition: i as u16,
                },
            );
        }
        map.placement.tubes.insert(t.name.clone(), t);
    }

    fn owners(t: &TubePlacement) -> Vec<(u16, &str, u64)> {
        t.partitions
            .iter()
            .map(|p| (p.index, p.set.as_str(), p.first))
            .collect()
    }

    #[test]
    fn partitions_spread_over_live_sets_least_loaded_first() {
        let mut m = map(&[("a", true), ("b", true), ("dead", false)]);
        let t = plan_create(&m, "q", "fifo", serde_json::json!({}), 4).unwrap();
        assert_eq!(
            owners(&t),
            [(1, "a", 0), (2, "b", 0), (3, "a", 0), (4, "b", 0)]
        );
        add(&mut m, t);
        // Equal loads: one-partition tubes alternate.
        let mut got = Vec::new();
        for name in ["t1", "t2", "t3"] {
            let t = plan_create(&m, name, "utube", serde_json::Value::Null, 1).unwrap();
            got.push(t.partitions[0].set.clone());
            add(&mut m, t);
        }
        assert_eq!(got, ["a", "b", "a"]);
        // b owns fewer now: a tube of three starts there.
        let t = plan_create(&m, "t4", "fifo", serde_json::Value::Null, 3).unwrap();
        assert_eq!(owners(&t), [(8, "b", 0), (9, "a", 0), (10, "b", 0)]);
    }

    #[test]
    fn refusals_name_the_value() {
        let mut m = map(&[("a", true)]);
        let t = plan_create(&m, "q", "fifo", serde_json::Value::Null, 1).unwrap();
        add(&mut m, t.clone());
        let check = |r: Result<TubePlacement, PlacementError>, want: &str| {
            let e = r.unwrap_err().to_string();
            assert!(e.contains(want), "{e:?} lacks {want:?}");
        };
        assert_eq!(
            plan_create(&m, "q", "fifo", serde_json::Value::Null, 2),
            Err(PlacementError::Exists(Box::new(t)))
        );
        check(
            plan_create(&m, "x", "fifo", serde_json::Value::Null, 0),
            "0 partitions: a tube has 1 to 256",
        );
        check(
            plan_create(&m, "x", "fifo", serde_json::Value::Null, 257),
            "257 partitions",
        );
        check(
            plan_create(&m, "x", "lifo", serde_json::Value::Null, 1),
            "\"lifo\"",
        );
        check(
            plan_create(&m, "", "fifo", serde_json::Value::Null, 1),
            "of 0 bytes",
        );
        check(
            plan_create(
                &map(&[("a", false)]),
                "x",
                "fifo",
                serde_json::Value::Null,
                1,
            ),
            "no replica set has a leader",
        );
        check(
            plan_place(&m, "q", 3, "a"),
            "has 1 partitions: no partition 3",
        );
        check(plan_place(&m, "q", 0, "zz"), "replica set \"zz\"");
        check(plan_place(&m, "nope", 0, "a"), "no tube \"nope\"");
    }

    #[test]
    fn indexes_run_out_with_a_clear_error() {
        let mut m = map(&[("a", true)]);
        for ix in 1..=MAX_INDEX - 2 {
            m.placement.indexes.insert(
                ix,
                IndexUse::Used {
                    tube: format!("t{ix}"),
                    partition: 0,
                },
            );
        }
        let e = plan_create(&m, "x", "fifo", serde_json::Value::Null, 3).unwrap_err();
        assert_eq!(
            e.to_string(),
            "3 partitions need 3 free indexes; only 2 of the 4095 are free"
        );
        let t = plan_create(&m, "x", "fifo", serde_json::Value::Null, 2).unwrap();
        assert_eq!(owners(&t), [(4094, "a", 0), (4095, "a", 0)]);
    }

    #[test]
    fn a_dropped_tube_leaves_floors_that_a_new_tube_starts_from() {
        let mut m = map(&[("a", true)]);
        let t = plan_create(&m, "q", "fifo", serde_json::Value::Null, 2).unwrap();
        add(&mut m, t);
        let (_, floors) = plan_drop(&m.placement, "q", &[(0, 100), (1, 5)]).unwrap();
        assert_eq!(floors, [(1, 100), (2, 5)]);
        m.placement.tubes.remove("q");
        for (ix, floor) in floors {
            m.placement.indexes.insert(ix, IndexUse::Free { floor });
        }
        // Indexes never used come first: a node that missed the drop still holds 1 and 2.
        let t = plan_create(&m, "q", "fifo", serde_json::Value::Null, 2).unwrap();
        assert_eq!(owners(&t), [(3, "a", 0), (4, "a", 0)]);
        // Once those are taken, a dropped tube's indexes start at their floors.
        for ix in 3..=MAX_INDEX - 1 {
            let tube = format!("t{ix}");
            m.placement
                .indexes
                .insert(ix, IndexUse::Used { tube, partition: 0 });
        }
        let t = plan_create(&m, "r", "fifo", serde_json::Value::Null, 3).unwrap();
        assert_eq!(
            owners(&t),
            [(MAX_INDEX, "a", 0), (1, "a", 100), (2, "a", 5)]
        );
    }

    fn kv(key: &str, value: &str, mod_revision: i64) -> Kv {
        Kv {
            key: key.into(),
            value: value.into(),
            create_revision: mod_revision,
            mod_revision,
            lease: 0,
        }
    }

    #[test]
    fn the_map_parses_from_its_keys_and_skips_what_does_not() {
        let leader = r#"{"name":"n1","addr":"h:1"}"#;
        let member = r#"{"name":"n2","addr":"h:2","role":"replica","eligible":true,"position":{"term":0,"lsn":0}}"#;
        let tube = r#"{"name":"q/x","kind":"fifo","options":{},"partitions":[{"index":3,"set":"s1","first":9}]}"#;
        let ranges = vec![
            vec![],
            vec![],
            vec![
                kv("/tarq/c/sets/s1/leader", leader, 5),
                kv("/tarq/c/sets/s1/members/n2", member, 6),
                kv("/tarq/c/sets/s2/members/n3", "not json", 7),
                kv("/tarq/c/sets/s3", "{}", 8),
            ],
            vec![
                kv("/tarq/c/placement/epoch", "{}", 40),
                kv(
                    "/tarq/c/placement/indexes/3",
                    r#"{"tube":"q/x","partition":0}"#,
                    40,
                ),
                kv("/tarq/c/placement/indexes/4", r#"{"floor":12}"#, 30),
                kv("/tarq/c/placement/indexes/9999", r#"{"floor":1}"#, 30),
                kv("/tarq/c/placement/tubes/q/x", tube, 40),
                kv("/tarq/c/placement/tubes/other", tube, 40),
            ],
        ];
        let map = parse_map("c", &mut ranges.into_iter());
        // No default set: it has neither leader nor member; nor s2, whose only member does not
        // parse.
        let names: Vec<_> = map.sets.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(names, ["s1"]);
        assert_eq!(map.sets[0].leader.as_ref().unwrap().1, 5);
        assert_eq!(map.sets[0].members[0].name, "n2");
        let p = &map.placement;
        assert_eq!(p.epoch, 40);
        assert_eq!(
            p.tubes.keys().collect::<Vec<_>>(),
            ["q/x"],
            "a tube under another's key is skipped"
        );
        assert_eq!(p.owner("q/x", 0), Some("s1"));
        assert_eq!(
            p.at_index(3).map(|(t, part)| (t.name.as_str(), part)),
            Some(("q/x", 0))
        );
        assert_eq!((p.floor(4), p.floor(5)), (12, 0));
        assert_eq!(p.indexes.len(), 2, "index 9999 is past MAX_INDEX");
    }

    #[test]
    fn index_values_are_readable_json() {
        let used = IndexUse::Used {
            tube: "q".into(),
            partition: 2,
        };
        assert_eq!(
            serde_json::to_string(&used).unwrap(),
            r#"{"tube":"q","partition":2}"#
        );
        let free: IndexUse = serde_json::from_str(r#"{"floor":9}"#).unwrap();
        assert_eq!(free, IndexUse::Free { floor: 9 });
    }

    #[test]
    fn ownership_is_dated_from_the_first_view_that_shows_it() {
        let mut m = map(&[("a", true), ("b", true)]);
        let t = plan_create(&m, "q", "fifo", serde_json::Value::Null, 2).unwrap();
        add(&mut m, t);
        let t0 = Instant::now();
        let mut first = m.placement.clone();
        first.track_ownership(None, "a", t0);
        assert_eq!(
            (first.owned_since(1), first.owned_since(2)),
            (Some(t0), None)
        );
        let moved = plan_place(&m, "q", 1, "a").unwrap();
        let mut second = m.placement.clone();
        second.tubes.insert("q".into(), moved);
        let t1 = t0 + Duration::from_secs(1);
        second.track_ownership(Some(&first), "a", t1);
        assert_eq!(
            (second.owned_since(1), second.owned_since(2)),
            (Some(t0), Some(t1))
        );
    }
}
