//! Leader election and fencing for tarq on etcd v3, as a component the server's loop drives
//! without ever waiting on etcd. `Cluster::start` spawns one thread that keeps this node's
//! lease, publishes its member key (name, address, role, replication position), campaigns for
//! the cluster's leader key when the rules allow, and reports every change as an `Event`
//! through a channel, calling the wake-up callback after each one. The loop sends commands
//! back (`resign`, `publish_position`) and checks the `Fence` before it acknowledges a change.
//!
//! Keys, under `/tarq/<cluster>/`:
//! - `leader`: `{"name","addr"}` bound to the leader's lease; written only by a
//!   create-if-absent transaction. Its create revision is the leader's **term**, the fencing
//!   token: etcd's revisions only grow, so each won election has a larger term than all before.
//! - `members/<name>`: a `Member` bound to that node's lease.
//!
//! Those are the default replica set's keys. A node given a replica set `S` (`Config::
//! replica_set`) elects under `sets/S/leader` and `sets/S/members/<name>` by the same rules,
//! and is *sharded*: each poll's read also takes the cluster map (every set's leader and
//! members, the placement under `placement/`, see `placement`), published in `Overview` and
//! announced by `MapChanged`. Placement changes are asked of the thread (`create_tube`,
//! `drop_tube`, `place`, and a move's `claim_move`, `move_partition`, `release_move`, see
//! `moves`) and answered by `PlacementDone`; `PlacementFence` says whether the node's view of
//! the placement may still be acted on.
//!
//! The wire is etcd's v3 JSON gateway (`etcd`), the rules are pure functions (`election`),
//! the thread's state machine is `node`. Not here: replication itself, the WAL, the server.

mod config;
mod node;

pub mod election;
pub mod etcd;
pub mod hex;
pub mod link_key;
pub mod moves;
pub mod placement;
pub mod users;

use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::Instant;

pub use config::*;
pub use election::{Claim, Fence, LeaderRecord, Member, Position, Role};
pub use etcd::EtcdError;
pub use link_key::LinkKey;
pub use moves::MoveClaim;
pub use placement::{
    ClusterMap, DropCommit, IndexUse, PartitionPlacement, Placement, PlacementError,
    PlacementFence, SetView, TubePlacement,
};
pub use users::{UsersChange, UsersError, UsersRead, UsersTable};

/// What the election thread last read from etcd, for operators (`queue.cluster()`): the leader
/// with its term, and every member key. Read under a lock the thread holds only to replace it.
#[derive(Debug, Clone, Default)]
pub struct Overview {
    pub leader: Option<(LeaderRecord, u64)>,
    pub members: Vec<Member>,
    /// When it was read; `None` before etcd first answered.
    pub read_at: Option<Instant>,
    /// A sharded node's view of every replica set, sorted by name (`default` only when it has
    /// a leader or a member); empty on an unsharded node.
    pub sets: Vec<SetView>,
    /// A sharded node's view of the placement, with this node's `owned_since`; empty (epoch 0)
    /// on an unsharded node.
    pub placement: Arc<Placement>,
    /// The cluster's link key (`link_key`), once a sharded node has read it.
    pub link_key: Option<LinkKey>,
    /// A sharded node's view of the cluster's users (`users`); empty, revision 0, on an
    /// unsharded node or before etcd answered.
    pub users: Arc<UsersRead>,
}

impl Overview {
    /// The leader of replica set `set` and its term, as last read (sharded nodes).
    pub fn set_leader(&self, set: &str) -> Option<&(LeaderRecord, u64)> {
        self.sets.iter().find(|s| s.name == set)?.leader.as_ref()
    }
}

/// Something the election thread tells the loop, stamped with the instant it happened on the
/// thread's monotonic clock.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Event {
    pub at: Instant,
    pub kind: EventKind,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EventKind {
    /// This node leads from now with this term; `Fence::term_at` agrees until the claim runs
    /// out or a `Deposed` follows.
    BecameLeader { term: u64 },
    /// Another node leads: replicate from `addr`.
    Follow {
        leader: String,
        addr: String,
        term: u64,
    },
    /// The cluster has no leader (the previous one, of `last_term` if this node followed it,
    /// is gone); an election is under way.
    Electing { last_term: Option<u64> },
    /// This node no longer leads. The fence was cleared before this was sent; `claimed_until`
    /// is when its claim would have run out by itself.
    Deposed {
        term: u64,
        reason: DeposeReason,
        claimed_until: Instant,
    },
    /// A call to etcd failed; sent once per outage. A leader keeps its claim until the claim
    /// runs out, then is `Deposed` with `LeaseExpiring`.
    EtcdUnavailable { error: String },
    /// etcd answers again after an `EtcdUnavailable`.
    EtcdRestored,
    /// Another live process holds this node's member key: this node neither campaigns nor
    /// follows until that key's lease expires. Sent once per conflict.
    NameInUse { name: String },
    /// A sharded node read a cluster map that differs from the last one announced: another
    /// placement epoch, or some set's leader (name, address or term) changed. Sent once after
    /// the first successful read too. `Cluster::overview` already holds the new map.
    MapChanged { epoch: i64 },
    /// A sharded node read the cluster's users at another revision than the last announced
    /// (sent once after the first read too). `Cluster::overview` already holds them.
    UsersChanged { revision: i64 },
    /// The answer to `change_users` with the caller's `token`. `UsersError::Etcd` does not
    /// prove that nothing was written (the answer may be what was lost): the next
    /// `UsersChanged` shows which.
    UsersDone {
        token: u64,
        result: Result<(), UsersError>,
    },
    /// The answer to `create_tube`, `drop_tube` or `place` with the caller's `token`: the tube
    /// as created, as it was before the drop, or as placed now. `Err(PlacementError::Etcd)`
    /// does not prove that nothing was written: a transaction may commit and its answer be
    /// lost; the next map shows which (a create retried then answers `Exists`).
    PlacementDone {
        token: u64,
        result: Result<TubePlacement, PlacementError>,
    },
    /// The answer to `record_committed`: `Ok` once etcd holds `position` as the set's
    /// committed position; `Err` says why not (not leading, etcd refused or unreachable), and
    /// the loop may ask again.
    CommitRecorded {
        position: Position,
        result: Result<(), String>,
    },
    /// The answer to `read_placement`: a poll that began after the ask has read etcd (or
    /// failed to). A `MapChanged` it brought came before this.
    PlacementRead,
    /// No node leads and this one may not campaign because its log lacks the committed
    /// position (`Some`, saying so), or it no longer is held back (`None`). Sent on changes.
    HeldBack { why: Option<String> },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeposeReason {
    /// The lease could not be refreshed before the claim ran out (etcd unreachable or slow):
    /// stepped down before etcd could expire the lease and let another node win.
    LeaseExpiring,
    /// etcd answered that the lease no longer exists.
    LeaseLost,
    /// The leader key is gone or belongs to another term (deleted by hand, or replaced).
    KeyLost,
    /// The loop asked to resign.
    Resigned,
    /// The component is shutting down.
    Shutdown,
}

/// Why the component could not start.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error("cannot start the election thread: {0}")]
    Spawn(#[from] std::io::Error),
}

pub(crate) enum Command {
    Resign,
    Shutdown,
    Placement { token: u64, change: Change },
    Users { token: u64, change: UsersChange },
    RecordCommitted(Position),
    ReadPlacement,
}

/// A placement change the loop asked for.
pub(crate) enum Change {
    Create {
        name: String,
        kind: String,
        options: serde_json::Value,
        partitions: u16,
    },
    Drop(DropCommit),
    Place {
        tube: String,
        partition: u16,
        set: String,
    },
    Move(moves::Commit),
    Claim {
        index: u16,
        claim: MoveClaim,
    },
    Release {
        index: u16,
        tube: String,
        to: String,
        id: Option<u64>,
    },
}

/// The loop's handle on the election thread. Dropping it stops the thread; a leader resigns
/// on the way out by revoking its lease, which hands over at once instead of after a TTL.
pub struct Cluster {
    commands: Sender<Command>,
    events: Receiver<Event>,
    position: Arc<Mutex<Position>>,
    fence: Fence,
    placement_fence: PlacementFence,
    overview: Arc<Mutex<Overview>>,
    thread: Option<JoinHandle<()>>,
}

impl Cluster {
    /// Checks the config and starts the election thread; never waits for etcd. `wake` is
    /// called after each event is queued (the loop passes its `mio::Waker`).
    pub fn start(config: Config, wake: Box<dyn Fn() + Send>) -> Result<Cluster, Error> {
        let endpoints = config.validate()?;
        let (commands, command_rx) = mpsc::channel();
        let (event_tx, events) = mpsc::channel();
        let position = Arc::new(Mutex::new(Position::default()));
        let fence = Fence::default();
        let placement_fence = PlacementFence::default();
        let overview = Arc::new(Mutex::new(Overview::default()));
        let node = node::Node::new(
            config.clone(),
            etcd::Client::with_tls(endpoints, config.tls.as_ref())?,
            node::Outbox {
                events: event_tx,
                wake,
            },
            Arc::clone(&position),
            fence.clone(),
            placement_fence.clone(),
            Arc::clone(&overview),
        );
        let thread = std::thread::Builder::new()
            .name(format!("cluster-{}", config.name))
            .spawn(move || node.run(command_rx))?;
        Ok(Cluster {
            commands,
            events,
            position,
            fence,
            placement_fence,
            overview,
            thread: Some(thread),
        })
    }

    /// The next event, if one is queued.
    pub fn try_event(&self) -> Option<Event> {
        self.events.try_recv().ok()
    }

    /// The event channel itself, for a caller that blocks on it (tests, tools).
    pub fn events(&self) -> &Receiver<Event> {
        &self.events
    }

    /// The leader and members as last read from etcd.
    pub fn overview(&self) -> Overview {
        self.overview
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// The cluster's users as last read (sharded nodes), without a copy of the rest.
    pub fn users(&self) -> Arc<UsersRead> {
        let overview = self.overview.lock().unwrap_or_else(PoisonError::into_inner);
        Arc::clone(&overview.users)
    }

    /// The cluster's link key, once read (sharded nodes; `None` before etcd answered).
    pub fn link_key(&self) -> Option<LinkKey> {
        self.overview
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .link_key
    }

    /// The leadership claim to check before acknowledging a change.
    pub fn fence(&self) -> Fence {
        self.fence.clone()
    }

    /// Whether this node's view of the placement may still be acted on (sharded nodes; never
    /// valid on an unsharded one).
    pub fn placement_fence(&self) -> PlacementFence {
        self.placement_fence.clone()
    }

    /// The placement as last read (empty on an unsharded node).
    pub fn placement(&self) -> Arc<Placement> {
        Arc::clone(
            &self
                .overview
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .placement,
        )
    }

    /// Asks for tube `name` of `kind` with `partitions` partitions (1 to
    /// `placement::MAX_PARTITIONS`), spread over the sets that have a leader (see
    /// `placement::spread_order`). Answered by `PlacementDone { token, .. }`;
    /// `Err(PlacementError::Exists(tube))` if the name is taken.
    pub fn create_tube(
        &self,
        token: u64,
        name: &str,
        kind: &str,
        options: serde_json::Value,
        partitions: u16,
    ) {
        self.change(
            token,
            Change::Create {
                name: name.into(),
                kind: kind.into(),
                options,
                partitions,
            },
        );
    }

    /// Asks to drop a tube ([`DropCommit`]): `floors` are `(partition, next task number)`, and
    /// each index the tube leaves records the largest of that, the partition's `first` and a
    /// floor already there. Answered by `PlacementDone` with the tube as it was. Not begun
    /// after `not_after`, nor given longer than until then (`Err(TooLate)`): the partitions'
    /// owners hold the tube's changes for a bounded time after its checks, and let them run
    /// after. Refused (`Err(CheckedByDeposed)`) unless every set in `checked_by` is led still by
    /// the primary of that term, which passed the check and holds the partition.
    pub fn drop_tube(&self, token: u64, drop: DropCommit) {
        self.change(token, Change::Drop(drop));
    }

    /// Asks to give partition `partition` of `tube` to replica set `set` (moving its tasks is
    /// not done). Answered by `PlacementDone` with the tube as placed now.
    pub fn place(&self, token: u64, tube: &str, partition: u16, set: &str) {
        let (tube, set) = (tube.into(), set.into());
        self.change(
            token,
            Change::Place {
                tube,
                partition,
                set,
            },
        );
    }

    /// Asks for a move's commit (`moves::commit`): partition `c.partition` of `c.tube` given
    /// to replica set `c.to` if `c.from` owns it, its primary of term `c.term` still leads it
    /// and move `c.id`'s claim is there (its tasks were copied). Answered by `PlacementDone`
    /// with the tube as placed now, `Err(Moved)` when `from` does not own it (any more),
    /// `Err(Deposed)` when the term no longer leads, `Err(CalledOff)` when the claim is gone.
    pub fn move_partition(&self, token: u64, c: moves::Commit) {
        self.change(token, Change::Move(c));
    }

    /// Claims the partition at `index` for a copy on `claim.to` (`moves::claim`). Answered by
    /// `PlacementDone` with the tube as placed at the claim (if that gives the partition to
    /// `claim.to`, nothing was claimed).
    pub fn claim_move(&self, token: u64, index: u16, claim: MoveClaim) {
        self.change(token, Change::Claim { index, claim });
    }

    /// Withdraws move `id`'s claim on the partition at `index` for set `to` (`None`: any
    /// claim for `to`; `moves::release`). Answered by `PlacementDone` with the tube as placed
    /// once no such claim is left: the move committed if that gives the partition to `to`.
    pub fn release_move(&self, token: u64, index: u16, tube: &str, to: &str, id: Option<u64>) {
        let (tube, to) = (tube.into(), to.into());
        self.change(
            token,
            Change::Release {
                index,
                tube,
                to,
                id,
            },
        );
    }

    /// Asks to change the cluster's users (a sharded node); answered by `UsersDone`.
    pub fn change_users(&self, token: u64, change: UsersChange) {
        // A send fails only while the handle is being dropped: nobody waits for the answer.
        let _ = self.commands.send(Command::Users { token, change });
    }

    fn change(&self, token: u64, change: Change) {
        // A send fails only while the handle is being dropped: nobody waits for the answer.
        let _ = self.commands.send(Command::Placement { token, change });
    }

    /// Records how far this node's log reaches; the thread publishes the latest value on its
    /// next poll. Cheap: call it after every durable write.
    pub fn publish_position(&self, position: Position) {
        *self.position.lock().unwrap_or_else(PoisonError::into_inner) = position;
    }

    /// Asks the thread to record `position` as the set's committed position in etcd (key
    /// `committed` beside `leader`, bound to no lease), fenced by this node's term. A leader
    /// with synchronous replicas acknowledges a change only once its position is recorded, so
    /// a member behind it can never be elected (`election::may_campaign`). Answered by
    /// `CommitRecorded`.
    pub fn record_committed(&self, position: Position) {
        // A send fails only while the handle is being dropped: nobody waits for the answer.
        let _ = self.commands.send(Command::RecordCommitted(position));
    }

    /// Asks for a read of etcd now rather than at the next poll: a node asked for a tube it
    /// does not know looks at the placement at etcd's current revision before it says there
    /// is no such tube. Answered by `PlacementRead` once a poll that began after this ask is
    /// over (a `MapChanged` first, if the map changed).
    pub fn read_placement(&self) {
        // A send fails only while the handle is being dropped: nobody waits for the answer.
        let _ = self.commands.send(Command::ReadPlacement);
    }

    /// Steps down if leading: the fence is cleared, then the leader key deleted; the node sits
    /// out elections until another leader appears or two TTLs pass.
    pub fn resign(&self) {
        // A send fails only when the thread is gone, and then there is nothing to resign.
        let _ = self.commands.send(Command::Resign);
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let _ = self.commands.send(Command::Shutdown);
        if let Some(thread) = self.thread.take() {
            // A panic on the election thread is already reported by the panic hook.
            let _ = thread.join();
        }
    }
}
