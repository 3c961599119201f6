//! The election thread's state machine: on each poll it revokes leases it abandoned, grants or
//! refreshes its own lease, publishes its member key, reads the leader and member keys in one
//! snapshot, and then follows, campaigns or steps down. Between polls it sleeps on the command
//! channel, waking early for a command or for the instant its leadership claim runs out.
//!
//! Timing rule of the fence: a refresh sent at `s` that etcd confirms keeps the lease alive on
//! etcd until at least `s + ttl` (etcd starts the TTL when it receives the refresh, after `s`);
//! the claim runs to `s + ttl - safety_margin` on the local monotonic clock. Every etcd call a
//! leader makes is bounded by the time left on its claim, so a hung etcd cannot hold the thread
//! past it; and the loop reads the claim's deadline itself, so even a stalled thread cannot.

use std::sync::mpsc::{Receiver, RecvTimeoutError, Sender};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use tracing::{info, warn};

use crate::election::{
    behind_committed, may_campaign, Claim, Fence, LeaderRecord, Member, Position, Role,
};
use crate::etcd::{Client, Compare, EtcdError, Kv, Op};
use crate::link_key::{self, LinkKey, LINK_KEY_LEN};
use crate::moves;
use crate::placement::{self, ClusterMap, Placement, PlacementError, PlacementFence};
use crate::users::{self, UsersChange, UsersError, UsersRead};
use crate::{Change, Command, Config, DeposeReason, Event, EventKind, Overview};

/// Shortest budget given to a call: below this a call cannot even connect, and failing it
/// early is the honest outcome.
const MIN_CALL_BUDGET: Duration = Duration::from_millis(5);

/// Where events go: the channel, then the loop's wake-up.
pub struct Outbox {
    pub events: Sender<Event>,
    pub wake: Box<dyn Fn() + Send>,
}

/// This node's lease as last confirmed.
#[derive(Debug, Clone, Copy)]
struct Lease {
    id: i64,
    /// The smaller of the TTL asked for and the TTL granted.
    ttl: Duration,
    /// When the request that last granted or refreshed it was sent.
    sent: Instant,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum State {
    /// Not yet looked, or just stepped down.
    Unknown,
    Leaderless {
        since: Instant,
    },
    Following {
        name: String,
        term: u64,
    },
    Leading {
        term: u64,
    },
}

/// The leader key and the member keys at one revision, and on a sharded node the cluster map
/// at the same revision.
struct View {
    revision: i64,
    leader: Option<(LeaderRecord, Kv)>,
    members: Vec<Member>,
    /// The set's committed position, as its leaders recorded it (`record_committed`).
    committed: Option<Position>,
    map: Option<MapRead>,
    /// A sharded node's read of the cluster's users (`Err`: the key is damaged).
    users: Option<Result<UsersRead, String>>,
}

/// The cluster map with the instants its read was sent and answered.
struct MapRead {
    map: ClusterMap,
    /// Whether the placement was read; if not, its epoch was the one already held.
    full: bool,
    sent: Instant,
    answered: Instant,
}

/// What `MapChanged` announces a change of: the epoch and every set's leader.
type MapSignature = (i64, Vec<(String, (LeaderRecord, u64))>);

struct Keys {
    leader: Vec<u8>,
    members: Vec<u8>,
    me: Vec<u8>,
    /// The set's committed position: no lease, so it outlives every member.
    committed: Vec<u8>,
}

pub struct Node {
    config: Config,
    client: Client,
    out: Outbox,
    keys: Keys,
    position: Arc<Mutex<Position>>,
    fence: Fence,
    placement_fence: PlacementFence,
    overview: Arc<Mutex<Overview>>,
    /// The placement as last read, with `owned_since` kept from one read to the next.
    placement: Arc<Placement>,
    /// `ensure_default` was refused and said so.
    default_refused: bool,
    /// The cluster's link key once read (sharded nodes), and whether a damaged one was said.
    link_key: Option<LinkKey>,
    link_key_refused: bool,
    /// Whether `placement` was read from etcd at least once.
    map_read: bool,
    /// What the last `MapChanged` announced.
    announced: Option<MapSignature>,
    /// The cluster's users as last read (sharded nodes), and whether a damaged key was said.
    users: Arc<UsersRead>,
    users_announced: Option<i64>,
    users_refused: bool,
    /// A `MapChanged` to send once the overview is updated.
    pending_map_event: Option<i64>,
    state: State,
    lease: Option<Lease>,
    /// Leases given up without being sure etcd dropped them; revoked once etcd answers, so
    /// keys a deposed leader held vanish before it campaigns again.
    abandoned: Vec<i64>,
    /// The member record etcd holds for this node under its current lease.
    published: Option<Member>,
    /// `None` before the first call, then whether the last call succeeded.
    etcd_up: Option<bool>,
    name_in_use: bool,
    /// After a resignation this node stays out of elections until another leader appears or
    /// this instant passes.
    resigned_until: Option<Instant>,
    /// Why this node may not lead, last said (so it is said once).
    held_back: Option<String>,
    next_poll: Instant,
    /// The loop asked for a read of the placement (`Cluster::read_placement`) that no poll has
    /// answered yet.
    read_asked: bool,
}

impl Node {
    pub fn new(
        config: Config,
        client: Client,
        out: Outbox,
        position: Arc<Mutex<Position>>,
        fence: Fence,
        placement_fence: PlacementFence,
        overview: Arc<Mutex<Overview>>,
    ) -> Node {
        let prefix = config.set_prefix();
        let keys = Keys {
            leader: format!("{prefix}leader").into_bytes(),
            members: format!("{prefix}members/").into_bytes(),
            me: format!("{prefix}members/{}", config.name).into_bytes(),
            committed: format!("{prefix}committed").into_bytes(),
        };
        Node {
            config,
            client,
            out,
            keys,
            position,
            fence,
            placement_fence,
            overview,
            placement: Arc::default(),
            map_read: false,
            default_refused: false,
            link_key: None,
            link_key_refused: false,
            users: Arc::default(),
            users_announced: None,
            users_refused: false,
            announced: None,
            pending_map_event: None,
            state: State::Unknown,
            lease: None,
            abandoned: Vec::new(),
            published: None,
            etcd_up: None,
            name_in_use: false,
            resigned_until: None,
            held_back: None,
            next_poll: Instant::now(),
            read_asked: false,
        }
    }

    pub fn run(mut self, commands: Receiver<Command>) {
        info!(node = %self.config.name, cluster = %self.config.cluster, "election thread started");
        loop {
            let wake_at = match self.fence.claim() {
                Some(claim) => self.next_poll.min(claim.until),
                None => self.next_poll,
            };
            match commands.recv_timeout(wake_at.saturating_duration_since(Instant::now())) {
                Ok(Command::Resign) => self.resign(),
                Ok(Command::Placement { token, change }) => self.change(token, change),
                Ok(Command::Users { token, change }) => self.change_users(token, change),
                Ok(Command::RecordCommitted(position)) => self.record_committed(position),
                Ok(Command::ReadPlacement) => {
                    self.read_asked = true;
                    self.next_poll = Instant::now();
                }
                Ok(Command::Shutdown) | Err(RecvTimeoutError::Disconnected) => break,
                Err(RecvTimeoutError::Timeout) => {}
            }
            self.check_claim();
            if Instant::now() >= self.next_poll {
                // Asked before this poll began: its read is at least as new as the ask.
                let asked = std::mem::take(&mut self.read_asked);
                if let Err(e) = self.poll() {
                    self.etcd_failed(e);
                }
                if asked {
                    self.emit(EventKind::PlacementRead);
                }
                self.check_claim();
                self.next_poll = Instant::now() + self.config.poll_interval;
            }
        }
        self.shutdown();
    }

    fn poll(&mut self) -> Result<(), EtcdError> {
        self.revoke_abandoned()?;
        self.keep_lease()?;
        self.ensure_link_key()?;
        if !self.publish()? {
            return Ok(());
        }
        let view = self.observe()?;
        self.decide(view)?;
        self.ensure_default()
    }

    /// A sharded leader makes sure the tube `default` exists, owned by its set if it is first.
    fn ensure_default(&mut self) -> Result<(), EtcdError> {
        let leading = matches!(self.state, State::Leading { .. });
        if !self.config.sharded()
            || !leading
            || self.placement.tubes.contains_key(placement::DEFAULT_TUBE)
        {
            return Ok(());
        }
        let (cluster, set) = (
            self.config.cluster.clone(),
            self.config.set_name().to_owned(),
        );
        match self.call(|c, b| placement::ensure_default(c, &cluster, &set, b))? {
            Ok(t) => {
                info!(owner = %t.partitions[0].set, "the tube default is placed");
                self.next_poll = Instant::now();
            }
            Err(e) if !self.default_refused => {
                // Only a damaged map refuses it, and it stays damaged poll after poll: once.
                self.default_refused = true;
                warn!(error = %e, "cannot place the tube default");
            }
            Err(_) => {}
        }
        Ok(())
    }

    /// A sharded node reads the cluster's link key, making it if it is the first (once: the
    /// key never changes while nodes run).
    fn ensure_link_key(&mut self) -> Result<(), EtcdError> {
        if !self.config.sharded() || self.link_key.is_some() {
            return Ok(());
        }
        let mut fresh = LinkKey([0; LINK_KEY_LEN]);
        if let Err(e) = getrandom::fill(&mut fresh.0) {
            warn!(error = %e, "no randomness for the cluster's link key");
            return Ok(());
        }
        let cluster = self.config.cluster.clone();
        match self.call(|c, b| link_key::ensure(c, &cluster, &fresh, b))? {
            Ok(key) => self.link_key = Some(key),
            Err(why) if !self.link_key_refused => {
                self.link_key_refused = true;
                warn!(%why, "no link key: this node can neither open nor accept links");
            }
            Err(_) => {}
        }
        Ok(())
    }

    /// Runs a placement change the loop asked for and answers it.
    fn change(&mut self, token: u64, change: Change) {
        let cluster = self.config.cluster.clone();
        let outcome = self.call(|c, b| match &change {
            Change::Create {
                name,
                kind,
                options,
                partitions,
            } => placement::create_tube(c, &cluster, name, kind, options, *partitions, b),
            Change::Drop(drop) => placement::drop_tube(c, &cluster, drop, b),
            Change::Place {
                tube,
                partition,
                set,
            } => placement::place(c, &cluster, tube, *partition, set, b),
            Change::Move(commit) => moves::commit(c, &cluster, commit, b),
            Change::Claim { index, claim } => moves::claim(c, &cluster, *index, claim, b),
            Change::Release {
                index,
                tube,
                to,
                id,
            } => moves::release(c, &cluster, *index, tube, to, *id, b),
        });
        let result = match outcome {
            Ok(result) => result,
            Err(e) => {
                let message = e.to_string();
                self.etcd_failed(e);
                Err(PlacementError::Etcd(message))
            }
        };
        if result.is_ok() {
            // Read the new map soon, so the fence and overview carry the change's epoch.
            self.next_poll = Instant::now();
        }
        self.emit(EventKind::PlacementDone { token, result });
    }

    /// Runs a change of the cluster's users the loop asked for and answers it.
    fn change_users(&mut self, token: u64, change: UsersChange) {
        let cluster = self.config.cluster.clone();
        let result = match self.call(|c, b| users::change(c, &cluster, &change, b)) {
            Ok(result) => result.map_err(UsersError::Refused),
            Err(e) => {
                let message = e.to_string();
                self.etcd_failed(e);
                Err(UsersError::Etcd(message))
            }
        };
        if result.is_ok() {
            // Read the users soon: the loop applies what it reads.
            self.next_poll = Instant::now();
        }
        self.emit(EventKind::UsersDone { token, result });
    }

    /// Steps down when the claim has run out: the refreshes that would have extended it failed.
    fn check_claim(&mut self) {
        if let Some(claim) = self.fence.claim() {
            if Instant::now() >= claim.until {
                self.depose(DeposeReason::LeaseExpiring);
            }
        }
    }

    fn revoke_abandoned(&mut self) -> Result<(), EtcdError> {
        while let Some(&id) = self.abandoned.last() {
            self.call(|c, budget| c.revoke(id, budget))?;
            self.abandoned.pop();
        }
        Ok(())
    }

    /// Grants a lease when there is none, refreshes it when a refresh is due, and extends the
    /// claim of a leader from the refresh's send time.
    fn keep_lease(&mut self) -> Result<(), EtcdError> {
        let due = match self.lease {
            None => true,
            Some(l) => l.sent.elapsed() >= self.config.refresh_interval(),
        };
        if due {
            self.refresh_lease()?;
        }
        Ok(())
    }

    fn refresh_lease(&mut self) -> Result<(), EtcdError> {
        let sent = Instant::now();
        let Some(lease) = self.lease else {
            let ttl_secs = self.config.lease_ttl.as_secs() as i64;
            let granted = self.call(|c, budget| c.grant(ttl_secs, budget))?;
            self.lease = Some(Lease {
                id: granted.id,
                ttl: self.ttl_of(granted.ttl_secs),
                sent,
            });
            self.published = None;
            return Ok(());
        };
        match self.call(|c, budget| c.keep_alive(lease.id, budget))? {
            Some(ttl_secs) => {
                let ttl = self.ttl_of(ttl_secs);
                self.lease = Some(Lease { ttl, sent, ..lease });
                if let State::Leading { term } = self.state {
                    let until = sent + ttl - self.config.safety_margin;
                    self.fence.set(Some(Claim { term, until }));
                }
            }
            None => {
                warn!(lease = lease.id, "etcd no longer has this node's lease");
                self.lease = None;
                self.published = None;
                self.depose(DeposeReason::LeaseLost);
                self.refresh_lease()?;
            }
        }
        Ok(())
    }

    fn ttl_of(&self, granted_secs: i64) -> Duration {
        Duration::from_secs(granted_secs.max(0) as u64).min(self.config.lease_ttl)
    }

    fn member_record(&self) -> Member {
        let resigned = self.resigned_until.is_some_and(|t| Instant::now() < t);
        Member {
            name: self.config.name.clone(),
            addr: self.config.addr.clone(),
            role: match self.state {
                State::Leading { .. } => Role::Leader,
                _ => Role::Replica,
            },
            eligible: self.config.eligible && !resigned,
            position: *self.position.lock().unwrap_or_else(PoisonError::into_inner),
        }
    }

    /// Writes this node's member key when it differs from what etcd holds. `Ok(false)` when
    /// another live process holds the key: this node then takes no part until it expires.
    fn publish(&mut self) -> Result<bool, EtcdError> {
        let me = self.member_record();
        if self.published.as_ref() == Some(&me) {
            return Ok(true);
        }
        let lease = self.lease.expect("keep_lease leaves a lease").id;
        let put = [Op::Put {
            key: self.keys.me.clone(),
            value: serde_json::to_vec(&me).expect("a member serializes"),
            lease,
        }];
        let key = self.keys.me.clone();
        let ours = [Compare::Lease(key.clone(), lease)];
        let mut written = self.call(|c, b| c.txn(&ours, &put, &[], b))?.succeeded;
        if !written {
            let absent = [Compare::CreateRevision(key, 0)];
            written = self.call(|c, b| c.txn(&absent, &put, &[], b))?.succeeded;
        }
        if written {
            self.published = Some(me);
            self.name_in_use = false;
        } else if !self.name_in_use {
            self.name_in_use = true;
            warn!(name = %self.config.name, "another live process holds this node's member key");
            let name = self.config.name.clone();
            self.emit(EventKind::NameInUse { name });
        }
        Ok(written)
    }

    fn observe(&mut self) -> Result<View, EtcdError> {
        let mut reads = vec![
            Op::Get(self.keys.leader.clone()),
            Op::GetPrefix(self.keys.members.clone()),
            Op::Get(self.keys.committed.clone()),
        ];
        let sharded = self.config.sharded();
        let mut compare = Vec::new();
        let mut otherwise = Vec::new();
        if sharded {
            let cluster = &self.config.cluster;
            if self.map_read {
                // The placement only if its epoch moved; the sets every time.
                let epoch = self.placement.epoch;
                compare.push(Compare::ModRevision(placement::epoch_key(cluster), epoch));
                otherwise = reads.clone();
                otherwise.extend(placement::map_ops(cluster, true));
                reads.extend(placement::map_ops(cluster, false));
            } else {
                reads.extend(placement::map_ops(cluster, true));
            }
        }
        if sharded {
            // The users, after the map in both branches: one small key, read every poll.
            let key = users::key_of(&self.config.cluster);
            reads.push(Op::Get(key.clone()));
            otherwise.push(Op::Get(key));
        }
        let sent = Instant::now();
        let reply = self.call(|c, b| c.txn(&compare, &reads, &otherwise, b))?;
        let answered = Instant::now();
        let full = compare.is_empty() || !reply.succeeded;
        let mut ranges = reply.ranges.into_iter();
        let leader = ranges.next().unwrap_or_default().into_iter().next();
        let leader = leader.and_then(|kv| match serde_json::from_slice(&kv.value) {
            Ok(record) => Some((record, kv)),
            Err(e) => {
                warn!(error = %e, "leader key holds no leader record; treating it as absent");
                None
            }
        });
        let members = ranges
            .next()
            .unwrap_or_default()
            .into_iter()
            .filter_map(|kv| match serde_json::from_slice(&kv.value) {
                Ok(m) => Some(m),
                Err(e) => {
                    let key = String::from_utf8_lossy(&kv.key);
                    warn!(%key, error = %e, "member key holds no member record; ignored");
                    None
                }
            })
            .collect();
        let committed = ranges.next().unwrap_or_default().into_iter().next();
        let committed = committed.map(|kv| match serde_json::from_slice(&kv.value) {
            Ok(position) => position,
            Err(e) => {
                // Ignoring it could elect a member without the acknowledged changes: refuse.
                warn!(error = %e, "the committed key holds no position; no member may lead");
                Position {
                    term: u64::MAX,
                    lsn: u64::MAX,
                }
            }
        });
        let map = sharded.then(|| MapRead {
            map: placement::parse_map(&self.config.cluster, &mut ranges),
            full,
            sent,
            answered,
        });
        let users = sharded.then(|| users::parse(ranges.next().unwrap_or_default().first()));
        Ok(View {
            revision: reply.revision,
            leader,
            members,
            committed,
            map,
            users,
        })
    }

    /// Takes in a new cluster map: dates ownership, extends the placement fence, and announces
    /// the map if its epoch or a set's leader changed.
    fn take_map(&mut self, read: MapRead) -> Vec<crate::SetView> {
        let MapRead {
            map,
            full,
            sent,
            answered,
        } = read;
        if full {
            let mut placement = map.placement;
            placement.track_ownership(Some(&self.placement), self.config.set_name(), answered);
            self.placement = Arc::new(placement);
            self.map_read = true;
        }
        let epoch = self.placement.epoch;
        let validity = self.config.placement_validity();
        self.placement_fence.set(epoch, sent + validity);
        let signature: MapSignature = (
            epoch,
            map.sets
                .iter()
                .filter_map(|s| Some((s.name.clone(), s.leader.clone()?)))
                .collect(),
        );
        if self.announced.as_ref() != Some(&signature) {
            self.announced = Some(signature);
            self.pending_map_event = Some(epoch);
        }
        map.sets
    }

    fn decide(&mut self, mut view: View) -> Result<(), EtcdError> {
        let sets = match view.map.take() {
            Some(read) => self.take_map(read),
            None => Vec::new(),
        };
        match view.users.take() {
            Some(Ok(read)) => self.users = Arc::new(read),
            Some(Err(why)) if !self.users_refused => {
                // Damaged by hand: the nodes keep the users they hold until it is mended.
                self.users_refused = true;
                warn!(%why, "the cluster's users cannot be read; each node keeps its own");
            }
            _ => {}
        }
        *self.overview.lock().unwrap_or_else(PoisonError::into_inner) = Overview {
            leader: view
                .leader
                .as_ref()
                .map(|(record, kv)| (record.clone(), kv.create_revision as u64)),
            members: view.members.clone(),
            read_at: Some(Instant::now()),
            sets,
            placement: Arc::clone(&self.placement),
            link_key: self.link_key,
            users: Arc::clone(&self.users),
        };
        if self.config.sharded() && self.users_announced != Some(self.users.revision) {
            self.users_announced = Some(self.users.revision);
            let revision = self.users.revision;
            self.emit(EventKind::UsersChanged { revision });
        }
        // Announced only once the overview holds the map, so the loop reads what it heard of.
        if let Some(epoch) = self.pending_map_event.take() {
            self.emit(EventKind::MapChanged { epoch });
        }
        if let State::Leading { term } = self.state {
            let mine = self.lease.map(|l| l.id);
            let held = view
                .leader
                .as_ref()
                .is_some_and(|(_, kv)| kv.create_revision as u64 == term && Some(kv.lease) == mine);
            if held {
                return Ok(());
            }
            self.depose(DeposeReason::KeyLost);
        }
        let mine = self.lease.map(|l| l.id);
        match view.leader {
            // Bound to this node's live lease while it does not lead: a campaign whose answer
            // was lost. Nobody else can have led in that term, so this node takes it up.
            Some((_, kv)) if Some(kv.lease) == mine => {
                self.lead(kv.create_revision as u64);
                Ok(())
            }
            Some((record, kv)) => {
                self.follow(record, kv.create_revision as u64);
                Ok(())
            }
            None => self.leaderless(view.revision, &view.members, view.committed),
        }
    }

    fn follow(&mut self, leader: LeaderRecord, term: u64) {
        let same = matches!(&self.state, State::Following { name, term: t } if *name == leader.name && *t == term);
        if same {
            return;
        }
        self.resigned_until = None;
        self.state = State::Following {
            name: leader.name.clone(),
            term,
        };
        info!(leader = %leader.name, term, "following");
        self.emit(EventKind::Follow {
            leader: leader.name,
            addr: leader.addr,
            term,
        });
    }

    /// No leader: after the settle time, campaign if the rules allow.
    fn leaderless(
        &mut self,
        revision: i64,
        members: &[Member],
        committed: Option<Position>,
    ) -> Result<(), EtcdError> {
        let since = match self.state {
            State::Leaderless { since } => since,
            ref previous => {
                let last_term = match previous {
                    State::Following { term, .. } => Some(*term),
                    _ => None,
                };
                let since = Instant::now();
                self.state = State::Leaderless { since };
                self.emit(EventKind::Electing { last_term });
                since
            }
        };
        let me = self.published.clone().expect("publish ran before observe");
        if since.elapsed() < self.config.settle {
            return Ok(());
        }
        // Said where it would campaign otherwise, so whoever reads it knows the node had its turn.
        self.say_held_back(behind_committed(&me, committed));
        if !may_campaign(&me, members, committed) {
            return Ok(());
        }
        self.campaign(revision)
    }

    /// Tells the loop (once per change) why this node may not lead though no node does.
    fn say_held_back(&mut self, why: Option<String>) {
        if self.held_back == why {
            return;
        }
        self.held_back = why.clone();
        if let Some(why) = &why {
            warn!(reason = %why, "this node may not lead");
        }
        self.emit(EventKind::HeldBack { why });
    }

    /// Records `position` as the set's committed position, if this node still leads the term
    /// of the position (a deposed leader's record is refused by etcd): answered by
    /// `CommitRecorded`. The loop acknowledges nothing past it before that answer.
    fn record_committed(&mut self, position: Position) {
        let State::Leading { term } = self.state else {
            self.emit(EventKind::CommitRecorded {
                position,
                result: Err("this node does not lead".into()),
            });
            return;
        };
        let compare = [Compare::CreateRevision(
            self.keys.leader.clone(),
            term as i64,
        )];
        let put = [Op::Put {
            key: self.keys.committed.clone(),
            value: serde_json::to_vec(&position).expect("a position serializes"),
            lease: 0,
        }];
        let result = match self.call(|c, b| c.txn(&compare, &put, &[], b)) {
            Ok(reply) if reply.succeeded => Ok(()),
            Ok(_) => Err(format!(
                "etcd refused the record: term {term} no longer leads"
            )),
            Err(e) => {
                let message = e.to_string();
                self.etcd_failed(e);
                Err(message)
            }
        };
        self.emit(EventKind::CommitRecorded { position, result });
    }

    /// The create-if-absent transaction, valid only if no member key changed since `revision`
    /// (a member that published a better position in between must be considered first).
    fn campaign(&mut self, revision: i64) -> Result<(), EtcdError> {
        // A fresh refresh first, so the claim starts with a whole TTL ahead of it.
        self.refresh_lease()?;
        let lease = self.lease.expect("refresh_lease leaves a lease");
        let record = LeaderRecord {
            name: self.config.name.clone(),
            addr: self.config.addr.clone(),
        };
        let compare = [
            Compare::CreateRevision(self.keys.leader.clone(), 0),
            Compare::ModifiedBefore {
                prefix: self.keys.members.clone(),
                revision: revision + 1,
            },
        ];
        let put = [Op::Put {
            key: self.keys.leader.clone(),
            value: serde_json::to_vec(&record).expect("a leader record serializes"),
            lease: lease.id,
        }];
        let reply = self.call(|c, b| c.txn(&compare, &put, &[], b))?;
        if !reply.succeeded {
            return Ok(());
        }
        // The put is the transaction's only write, so it created the key at this revision.
        self.lead(reply.revision as u64);
        Ok(())
    }

    /// Takes up `term` with the claim the current lease allows.
    fn lead(&mut self, term: u64) {
        let lease = self.lease.expect("a leader key is bound to a lease");
        let until = lease.sent + lease.ttl - self.config.safety_margin;
        if Instant::now() >= until {
            // The calls took the whole claim: leading now would already be unsafe. Giving the
            // lease up deletes the key once etcd answers, and a new election follows.
            warn!(term, "won too late to lead safely; giving the term up");
            self.abandon_lease();
            return;
        }
        self.state = State::Leading { term };
        self.fence.set(Some(Claim { term, until }));
        info!(term, "became leader");
        self.emit(EventKind::BecameLeader { term });
    }

    /// Clears the fence first, then reports. A lease whose fate etcd has not confirmed is
    /// given up, so its leader key is deleted before this node campaigns again.
    fn depose(&mut self, reason: DeposeReason) {
        let State::Leading { term } = self.state else {
            return;
        };
        let claimed_until = self.fence.claim().map_or_else(Instant::now, |c| c.until);
        self.fence.set(None);
        self.state = State::Unknown;
        if reason == DeposeReason::LeaseExpiring {
            self.abandon_lease();
        }
        warn!(term, ?reason, "deposed");
        self.emit(EventKind::Deposed {
            term,
            reason,
            claimed_until,
        });
    }

    fn abandon_lease(&mut self) {
        if let Some(lease) = self.lease.take() {
            self.abandoned.push(lease.id);
        }
        self.published = None;
    }

    fn resign(&mut self) {
        let State::Leading { term } = self.state else {
            return;
        };
        self.depose(DeposeReason::Resigned);
        self.resigned_until = Some(Instant::now() + self.config.lease_ttl * 2);
        let compare = [Compare::CreateRevision(
            self.keys.leader.clone(),
            term as i64,
        )];
        let delete = [Op::Delete(self.keys.leader.clone())];
        if let Err(e) = self.call(|c, b| c.txn(&compare, &delete, &[], b)) {
            // The key outlives the failed delete only as long as the lease: give that up too.
            self.abandon_lease();
            self.etcd_failed(e);
        }
        self.next_poll = Instant::now();
    }

    fn shutdown(&mut self) {
        self.depose(DeposeReason::Shutdown);
        if let Some(lease) = self.lease.take() {
            self.abandoned.push(lease.id);
        }
        if let Err(e) = self.revoke_abandoned() {
            warn!(error = %e, "could not revoke the lease on shutdown; it expires by itself");
        }
    }

    /// One etcd call with its budget: the request timeout, cut to the time left on a claim.
    /// Reports etcd coming back after an outage.
    fn call<T>(
        &mut self,
        f: impl FnOnce(&mut Client, Duration) -> Result<T, EtcdError>,
    ) -> Result<T, EtcdError> {
        let mut budget = self.config.request_timeout;
        if let Some(claim) = self.fence.claim() {
            budget = budget.min(claim.until.saturating_duration_since(Instant::now()));
        }
        let result = f(&mut self.client, budget.max(MIN_CALL_BUDGET))?;
        if self.etcd_up == Some(false) {
            info!(endpoint = self.client.endpoint(), "etcd answers again");
            self.emit(EventKind::EtcdRestored);
        }
        self.etcd_up = Some(true);
        Ok(result)
    }

    /// Reports the first failure of an outage. A lease not confirmed for a whole TTL has
    /// expired on etcd by now: it is given up, and a new one granted when etcd returns.
    fn etcd_failed(&mut self, error: EtcdError) {
        if self.etcd_up != Some(false) {
            warn!(%error, "etcd unavailable");
            self.etcd_up = Some(false);
            self.emit(EventKind::EtcdUnavailable {
                error: error.to_string(),
            });
        }
        if self.lease.is_some_and(|l| l.sent.elapsed() >= l.ttl) {
            self.abandon_lease();
        }
    }

    fn emit(&self, kind: EventKind) {
        let event = Event {
            at: Instant::now(),
            kind,
        };
        // The receiver is gone only while the handle is being dropped; nobody is listening.
        if self.out.events.send(event).is_ok() {
            (self.out.wake)();
        }
    }
}
