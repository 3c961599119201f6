//! `tarq ctl place TUBE PARTITION --to SET --etcd URL --cluster NAME`: gives one empty
//! partition of a partitioned tube to another replica set, by one change of the placement in
//! etcd (`tarq_cluster::placement::place`, under the epoch compare every placement change
//! uses). It is the primitive the moves of a later issue build on: it changes the owner only
//! and moves no task, so it refuses a partition that holds tasks, as its current owner's
//! primary counts them (`queue.cluster()`), and one whose emptiness nobody can vouch for (the
//! owner has no primary, or it does not answer). The check is made at one instant: a put that
//! reaches the old owner between the check and the change stays there; place a partition that
//! takes no traffic. Every node takes in the new owner at its next read of etcd; the new owner
//! serves the partition once the old owner's view of the placement can no longer be trusted
//! (the placement fence; see `tarq_cluster::placement::Placement`).
//!
//! It talks to etcd directly (the change is etcd's to make; no tarq node need be asked to
//! make it), and to the owner's primary for the counts.

use std::io::Write;

use anyhow::{anyhow, bail, Context};
use rmpv::Value;
use tarq_client::cluster::{map_get, Options};
use tarq_cluster::placement;

use super::cluster::call_on;

/// What `tarq ctl place` was asked.
#[derive(Debug, Clone)]
pub struct PlaceArgs {
    pub tube: String,
    pub partition: u16,
    pub to: String,
    /// etcd and the cluster's name, as given or as the `--addr` node has them.
    pub at: super::moves::Where,
}

/// Checks that the partition is empty on its owner, places it, and prints the tube as placed
/// now (JSON).
pub fn run(args: &PlaceArgs, opts: &Options, out: &mut dyn Write) -> anyhow::Result<()> {
    let PlaceArgs {
        tube,
        partition,
        to,
        at,
    } = args;
    let cluster = &at.cluster;
    // Each etcd call's time limit: the same --timeout as a call to a node.
    let budget = opts.timeout;
    let mut client = at.connect()?;
    let map = super::moves::read_map(&mut client, at, budget)?;
    // The same rules as the change itself, for an error before anything is asked of a node.
    placement::plan_place(&map, tube, *partition, to)?;
    let placed = &map.placement.tubes[tube.as_str()].partitions[usize::from(*partition)];
    // The new owner numbers the partition on from where the old one is, so no id is given
    // twice.
    let mut first = 0;
    if placed.set != *to {
        let owner = map.sets.iter().find(|s| s.name == placed.set);
        let Some((primary, _)) = owner.and_then(|s| s.leader.as_ref()) else {
            bail!(
                "partition {partition} of tube {tube} is owned by replica set {}, which has no \
                 primary now to say whether it is empty; nothing was changed",
                placed.set
            );
        };
        let (total, next) = partition_count(&primary.addr, opts, placed.index).map_err(|e| {
            anyhow!(
                "cannot tell whether partition {partition} of tube {tube} is empty: its owner \
                 {}'s primary {} ({}) {e}; nothing was changed",
                placed.set,
                primary.name,
                primary.addr
            )
        })?;
        if total > 0 {
            bail!(
                "partition {partition} of tube {tube} holds {total} tasks on replica set {}: \
                 place moves only an empty partition (it changes the owner, not the tasks); \
                 nothing was changed",
                placed.set
            );
        }
        first = next;
    }
    let now = placement::place_from(&mut client, cluster, tube, *partition, to, first, budget)
        .with_context(|| format!("placing partition {partition} of tube {tube} in etcd"))?
        .map_err(|e| anyhow!("{e}; nothing was changed"))?;
    writeln!(out, "{}", serde_json::to_string(&now)?)?;
    Ok(())
}

/// The tasks the partition at `index` holds, as the primary at `addr` counts them, and the
/// number its next task would get there.
fn partition_count(addr: &str, opts: &Options, index: u16) -> Result<(u64, u64), String> {
    let own = call_on(addr, opts, "queue.cluster").map_err(|e| format!("does not answer: {e}"))?;
    let tubes = match map_get(&own, "placement").and_then(|p| map_get(p, "tubes")) {
        Some(Value::Array(tubes)) => tubes.clone(),
        _ => return Err("gives no placement (not a sharded node?)".into()),
    };
    tubes
        .iter()
        .filter_map(|t| match map_get(t, "partitions") {
            Some(Value::Array(parts)) => Some(parts.clone()),
            _ => None,
        })
        .flatten()
        .find(|p| map_get(p, "index").and_then(Value::as_u64) == Some(u64::from(index)))
        .and_then(|p| {
            let total = map_get(&p, "total").and_then(Value::as_u64)?;
            Some((
                total,
                map_get(&p, "next").and_then(Value::as_u64).unwrap_or(0),
            ))
        })
        .ok_or_else(|| format!("gives no count for index {index} (it does not hold it yet?)"))
}
