//! Where a command for one partition runs, as a pure decision: the facts this node knows of
//! the partition ([`Facts`]: whose it is, whether this node leads it, whether it is frozen for
//! a move, how fresh the view of the placement is, whether it has just moved here) and what
//! the command does ([`Kind`]) give a [`Decision`] — run here, forward to the owner, wait for
//! the move or for the map, or refuse with why. No I/O, no state: the server gathers the facts
//! (`Router::facts`), decides, and one small function does what was decided
//! (`Router::run_on_partition` for a client's command, `dispatch_forwarded` for another
//! node's). Tested here alone, by hand and over every combination of facts.
//!
//! Commands over several partitions (a take trying each, a put looking for room, a figure
//! summed over a tube) are plans that ask this decision once for each partition they try.

use std::time::Duration;

/// What a command does to its partition.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Kind {
    /// It may change the partition (`Command::changes`): held while the partition is frozen.
    pub changes: bool,
    /// It only reads (`Command::reads_only`): served from any view this node has.
    pub reads_only: bool,
}

/// How this node's view of the placement stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Freshness {
    /// Read recently enough, and applied.
    Current,
    /// A newer placement was read and is not applied yet (a moment's gap in the loop).
    Pending,
    /// Not read lately (etcd out of reach): not trusted for changes.
    Stale,
}

/// What this node knows of one partition, at one instant.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Facts {
    /// The placement gives it to this node's replica set (or a move handed it over here).
    pub mine: bool,
    /// The owning set's slot (where a forwarded call goes).
    pub owner: usize,
    /// This node leads its set.
    pub leads: bool,
    /// It is frozen here for a move away.
    pub frozen: bool,
    pub view: Freshness,
    /// It has just moved here: served only after this long, once every view that showed
    /// the old owner has expired.
    pub moved_in: Option<Duration>,
    /// The partition's engine index and this set's name, for the refusals' words.
    pub index: u16,
}

/// What to do with the command.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum Decision {
    /// Run here.
    Local,
    /// Forward to the primary of the set in this slot (a forwarded call: relay it, once).
    Forward(usize),
    /// Wait for the move of its partition to end.
    AwaitMove,
    /// Wait until this node applies the placement it has read.
    AwaitMap,
    /// Refuse (nothing was done): why.
    Refuse(String),
}

/// Why a node whose view of the placement is not trusted changes nothing (ctl retries on it).
pub(super) const STALE_VIEW: &str =
    "this node's view of the placement is stale (etcd not read lately): no change now";

/// A client's command of this node, for the partition `f` describes.
pub(super) fn for_client(f: &Facts, k: Kind, set: &str) -> Decision {
    if !(f.mine && f.leads) {
        return Decision::Forward(f.owner);
    }
    served_here(f, k, set)
}

/// A command another node forwarded here, for the partition `f` describes: a partition this
/// node's set does not own in this node's view (the forwarder's view is older or newer — the
/// fence on placement, as the term is on leadership) is relayed to its owner; a change to
/// one moving from here waits; the rest as for a client. A node that does not lead runs it,
/// and the core refuses a change as any replica does, naming its primary.
pub(super) fn for_link(f: &Facts, k: Kind, set: &str) -> Decision {
    if !f.mine {
        return Decision::Forward(f.owner);
    }
    served_here(f, k, set)
}

/// A call for a partition this node serves: a change to one moving away waits for the move's
/// end, the rest is served (a take finds nothing to take until then); a read runs from any
/// view; a change runs if [`change_here`] says so.
fn served_here(f: &Facts, k: Kind, set: &str) -> Decision {
    if f.frozen {
        return match k.changes {
            true => Decision::AwaitMove,
            false => Decision::Local,
        };
    }
    if k.reads_only {
        return Decision::Local;
    }
    change_here(f, set)
}

/// Whether a change to a partition this node serves may run now.
pub(super) fn change_here(f: &Facts, set: &str) -> Decision {
    match f.view {
        Freshness::Stale => return Decision::Refuse(STALE_VIEW.into()),
        // Read, not applied yet: a change waits for it.
        Freshness::Pending => return Decision::AwaitMap,
        Freshness::Current => {}
    }
    match f.moved_in {
        Some(left) => Decision::Refuse(format!(
            "partition at index {} has just moved to replica set {set}: it serves it in {} ms",
            f.index,
            left.as_millis()
        )),
        None => Decision::Local,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const CHANGE: Kind = Kind {
        changes: true,
        reads_only: false,
    };
    const READ: Kind = Kind {
        changes: false,
        reads_only: true,
    };

    fn mine() -> Facts {
        Facts {
            mine: true,
            owner: 0,
            leads: true,
            frozen: false,
            view: Freshness::Current,
            moved_in: None,
            index: 3,
        }
    }

    #[test]
    fn a_partition_led_here_runs_here_and_anothers_is_forwarded() {
        assert_eq!(for_client(&mine(), CHANGE, "a"), Decision::Local);
        let theirs = Facts {
            mine: false,
            owner: 2,
            ..mine()
        };
        assert_eq!(for_client(&theirs, CHANGE, "a"), Decision::Forward(2));
        assert_eq!(for_link(&theirs, READ, "a"), Decision::Forward(2));
        // A replica forwards its clients' calls to its own set's primary.
        let replica = Facts {
            leads: false,
            ..mine()
        };
        assert_eq!(for_client(&replica, CHANGE, "a"), Decision::Forward(0));
    }

    #[test]
    fn a_change_waits_for_a_move_and_the_map_and_is_refused_on_a_stale_view_or_just_moved() {
        let frozen = Facts {
            frozen: true,
            ..mine()
        };
        assert_eq!(for_client(&frozen, CHANGE, "a"), Decision::AwaitMove);
        assert_eq!(for_client(&frozen, READ, "a"), Decision::Local);
        let pending = Facts {
            view: Freshness::Pending,
            ..mine()
        };
        assert_eq!(for_link(&pending, CHANGE, "a"), Decision::AwaitMap);
        let stale = Facts {
            view: Freshness::Stale,
            ..mine()
        };
        assert_eq!(
            for_client(&stale, CHANGE, "a"),
            Decision::Refuse(STALE_VIEW.into())
        );
        assert_eq!(for_client(&stale, READ, "a"), Decision::Local);
        let moved = Facts {
            moved_in: Some(Duration::from_millis(250)),
            ..mine()
        };
        assert_eq!(
            for_client(&moved, CHANGE, "b"),
            Decision::Refuse(
                "partition at index 3 has just moved to replica set b: it serves it in 250 ms"
                    .into()
            )
        );
    }

    fn facts() -> impl Strategy<Value = Facts> {
        (
            any::<bool>(),
            0usize..4,
            any::<bool>(),
            any::<bool>(),
            prop_oneof![
                Just(Freshness::Current),
                Just(Freshness::Pending),
                Just(Freshness::Stale)
            ],
            proptest::option::of(0u64..5000),
        )
            .prop_map(|(mine, owner, leads, frozen, view, moved)| Facts {
                mine,
                owner,
                leads,
                frozen,
                view,
                moved_in: moved.map(Duration::from_millis),
                index: 1,
            })
    }

    fn kind() -> impl Strategy<Value = Kind> {
        // A command that only reads changes nothing.
        (any::<bool>(), any::<bool>()).prop_map(|(changes, reads_only)| Kind {
            changes: changes && !reads_only,
            reads_only,
        })
    }

    proptest! {
        /// Over every combination of facts: a change runs here only on a partition this node
        /// serves, not frozen, with a current view, not just moved; what is not this set's
        /// goes to its owner; a read of a partition served here is never refused or held.
        #[test]
        fn one_server_a_partition_for_every_fact(f in facts(), k in kind(), link in any::<bool>()) {
            let d = if link { for_link(&f, k, "a") } else { for_client(&f, k, "a") };
            if d == Decision::Local && k.changes {
                prop_assert!(f.mine && !f.frozen, "{f:?} {k:?}");
                prop_assert!(link || f.leads, "{f:?} {k:?}");
                prop_assert!(k.reads_only || (f.view == Freshness::Current && f.moved_in.is_none()));
            }
            if !f.mine {
                prop_assert_eq!(d.clone(), Decision::Forward(f.owner));
            }
            if f.mine && (f.leads || link) && k.reads_only {
                prop_assert_eq!(d.clone(), Decision::Local);
            }
            if d == Decision::AwaitMove {
                prop_assert!(f.frozen && k.changes);
            }
            if let Decision::Refuse(why) = &d {
                prop_assert!(!why.is_empty() && !k.reads_only);
            }
        }
    }
}
