//! Failover through etcd (`--etcd URL --cluster NAME --node-name NAME`): the server's side of
//! `tarq_cluster`. The election runs on its own thread; its events arrive through a channel and
//! wake the loop through its `mio::Waker`, and the loop never waits for etcd. What each event
//! does to this node:
//! - `BecameLeader { term }`: promotion. The upstream goes, the WAL writes the new term,
//!   tasks taken under the previous primary come back ready as a restart brings them (logged,
//!   so the replicas see it too), and the engine fires deadlines from now on.
//! - `Follow { addr, term }`: this node replicates `addr` (its WAL refuses a turn of a lower
//!   term than the last it holds: a log's terms never go down).
//!   A node that led before closes its clients (their sessions belonged to its leadership) and
//!   its relays; its log may hold turns the new leader never had, which the subscribe check
//!   finds (the terms differ at its position), so it joins the new primary again.
//! - `Deposed`: the claim is void (the fence was cleared before the event was sent); changes
//!   are refused, and replies to changes not yet sent become errors.
//! - `Electing`, `EtcdUnavailable`, `NameInUse`: no primary is known; changes are refused
//!   with an error that says why.
//!
//! The fence is checked twice for a change: before it runs (`Server::refusal`) and before its
//! reply is released (`Server::fenced`), so nothing is acknowledged after the claim's
//! deadline, which lies a safety margin before etcd can let the lease pass to another node.

use std::net::SocketAddr;
use std::time::Instant;

use tarq_engine::Micros;

use rmpv::Value;
use tarq_cluster::{Cluster, DeposeReason, EventKind, Fence, Position};
use tracing::{info, warn};

use super::{random_bytes, replica, Server};

/// This node's part in the cluster, as the loop sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum NodeRole {
    /// No primary known (starting, electing, etcd unreachable, name in use): why.
    Unknown(String),
    Leading {
        term: u64,
    },
    Following {
        leader: String,
        addr: String,
        term: u64,
    },
}

/// The election's handle and this node's view of it.
pub(crate) struct ClusterNode {
    handle: Cluster,
    fence: Fence,
    pub role: NodeRole,
    name: String,
    cluster: String,
    /// etcd's client URLs, as `--etcd` gave them: `queue.cluster()` shows them, so `tarq ctl`
    /// commands that talk to etcd need not be told.
    endpoints: Vec<String>,
    published: Position,
    /// This node led since it last followed: its clients' sessions belong to that leadership.
    led: bool,
    /// The set's layout was judged against `--sync-replicas` (`judge_layout`).
    pub(super) layout_judged: bool,
    /// When this node last became the primary (monotonic µs).
    promoted_at: Option<Micros>,
    /// The last etcd failure, while etcd does not answer.
    etcd_error: Option<String>,
    /// A committed position asked of etcd and not answered yet (one at a time).
    recording: Option<Position>,
}

/// How long a primary leads before it judges its set's layout (`judge_layout`), µs.
const LAYOUT_GRACE: Micros = 5_000_000;

impl ClusterNode {
    /// The placement and the replica sets as last read.
    pub fn map(
        &self,
    ) -> (
        std::sync::Arc<tarq_cluster::Placement>,
        Vec<tarq_cluster::SetView>,
    ) {
        (self.handle.placement(), self.handle.overview().sets)
    }

    /// The election thread's handle: placement changes (`create_tube`, `drop_tube`), the
    /// placement and its fence, as the cluster crate gives them.
    pub fn handle(&self) -> &tarq_cluster::Cluster {
        &self.handle
    }

    pub fn start(
        config: tarq_cluster::Config,
        waker: std::sync::Arc<mio::Waker>,
    ) -> std::io::Result<ClusterNode> {
        let (name, cluster) = (config.name.clone(), config.cluster.clone());
        let endpoints = config.endpoints.clone();
        let handle = Cluster::start(
            config,
            Box::new(move || {
                if let Err(e) = waker.wake() {
                    warn!(error = %e, "waking the loop failed");
                }
            }),
        )
        .map_err(std::io::Error::other)?;
        Ok(ClusterNode {
            fence: handle.fence(),
            handle,
            role: NodeRole::Unknown("waiting for etcd's first answer".into()),
            name,
            cluster,
            endpoints,
            published: Position::default(),
            led: false,
            layout_judged: false,
            promoted_at: None,
            etcd_error: None,
            recording: None,
        })
    }

    /// The term this node may act as leader in now: its role says so and the fence holds.
    pub fn leading_term(&self) -> Option<u64> {
        match self.role {
            NodeRole::Leading { term } => self.fence.term_at(Instant::now()).filter(|&t| t == term),
            _ => None,
        }
    }

    /// Why this node takes no changes now: a leader's address (the stable, parseable form
    /// `read-only replica: the primary is ADDR`), or a reason with no address.
    pub fn not_leading(&self) -> crate::core::Refusal {
        use crate::core::Refusal;
        match &self.role {
            NodeRole::Following { addr, .. } => Refusal::ReadOnly(addr.clone()),
            NodeRole::Leading { term } => Refusal::NoPrimary(format!(
                "this node's leadership of term {term} ran out before etcd confirmed it"
            )),
            NodeRole::Unknown(why) => Refusal::NoPrimary(match &self.etcd_error {
                Some(e) => format!("{why}; etcd: {e}"),
                None => why.clone(),
            }),
        }
    }
}

impl ClusterNode {
    /// Takes in an event that only changes what this node says of itself: its role's text
    /// while an election runs, etcd's state.
    fn note(&mut self, kind: EventKind) {
        match kind {
            EventKind::Electing { .. } if !matches!(self.role, NodeRole::Leading { .. }) => {
                self.role = NodeRole::Unknown("electing a primary".into());
            }
            EventKind::EtcdUnavailable { error } => self.etcd_error = Some(error),
            EventKind::EtcdRestored => self.etcd_error = None,
            EventKind::HeldBack { why } => {
                // Said in the role's text, which queue.cluster() shows as `state`.
                if let NodeRole::Unknown(_) = self.role {
                    self.role = NodeRole::Unknown(match why {
                        Some(why) => format!("electing a primary; this node may not lead: {why}"),
                        None => "electing a primary".into(),
                    });
                }
            }
            EventKind::NameInUse { name } => {
                self.role =
                    NodeRole::Unknown(format!("another live process holds the node name {name}"))
            }
            _ => {}
        }
    }
}

impl Server {
    /// A cluster node that does not lead now (its claim ran out, or it was deposed): replies
    /// to changes it made while it led are not sent as successes.
    pub(super) fn fenced(&self) -> bool {
        self.cluster
            .as_ref()
            .is_some_and(|c| c.leading_term().is_none())
    }

    /// Once per turn: takes in the election's events and publishes this node's position.
    pub(super) fn cluster_turn(&mut self) {
        while let Some(ev) = self.cluster.as_ref().and_then(|c| c.handle.try_event()) {
            match ev.kind {
                EventKind::BecameLeader { term } => self.became_leader(term),
                EventKind::Follow { leader, addr, term } => self.follow(leader, addr, term),
                EventKind::Deposed { term, reason, .. } => self.deposed(term, reason),
                EventKind::MapChanged { .. } => {
                    let (placement, sets) = self.cluster_mut().map();
                    self.with_router(|r, cx| r.shards_map_changed(cx, placement, &sets));
                }
                EventKind::PlacementDone { token, result } => {
                    self.with_router(|r, cx| r.shards_placement_done(cx, token, result));
                }
                EventKind::PlacementRead => self.shards_placement_read(),
                EventKind::UsersChanged { .. } => {
                    self.with_router(|r, cx| r.shards_users_changed(cx));
                }
                EventKind::UsersDone { token, result } => {
                    self.with_router(|r, cx| r.shards_users_done(cx, token, result));
                }
                EventKind::CommitRecorded { position, result } => {
                    self.commit_recorded(position, result)
                }
                kind => self.cluster_mut().note(kind),
            }
        }
        // Roles change only above: from here to the next turn, a node that does not lead logs
        // nothing of its own (its WAL refuses such a turn: a path that changes the queue
        // without asking `leads()` is a bug, and a loud one).
        if self.cluster.is_some() && !self.leads() {
            if let Some(wal) = self.core.journal_mut().wal() {
                wal.stop_leading();
            }
        }
        let Some(position) = self.core.journal_mut().wal().map(|wal| Position {
            term: wal.last_term(),
            lsn: wal.durable_seq(),
        }) else {
            return;
        };
        if let Some(c) = &mut self.cluster {
            if position != c.published {
                c.handle.publish_position(position);
                c.published = position;
            }
        }
    }

    /// Asks etcd to record the position the replicas acknowledged as committed, when turns
    /// wait for it and no record is in flight (see `sync`).
    pub(super) fn record_committed(&mut self) {
        let Some(lsn) = self.sync.to_record() else {
            return;
        };
        let Some(c) = self.cluster.as_mut() else {
            return;
        };
        let (Some(term), None) = (c.leading_term(), c.recording) else {
            return;
        };
        let position = Position { term, lsn };
        c.recording = Some(position);
        c.handle.record_committed(position);
    }

    /// etcd answered a record: turns up to it pass if it is this leadership's.
    fn commit_recorded(&mut self, position: Position, result: Result<(), String>) {
        let c = self.cluster_mut();
        c.recording = None;
        let leading = matches!(c.role, NodeRole::Leading { term } if term == position.term);
        match result {
            Ok(()) if leading => {
                self.sync.on_recorded(position.lsn);
                // Let the turns it covers go now, not at the next acknowledgement.
                self.record_committed();
            }
            Ok(()) => {}
            // Asked again on the next turn that has acknowledgements; the turns wait, and time
            // out as "outcome unknown" if etcd stays away.
            Err(e) => warn!(error = %e, term = position.term, lsn = position.lsn,
                "could not record the committed position in etcd"),
        }
    }

    fn cluster_mut(&mut self) -> &mut ClusterNode {
        self.cluster.as_mut().expect("a cluster node")
    }

    /// Won an election: leads, unless its log was set aside as damaged at start and it has
    /// not copied a primary's since. Such a node holds nothing, or only part, of what clients
    /// were told is stored, so it steps down and sits elections out; the set waits for a node
    /// that holds the data (or this one, once it has copied it).
    fn became_leader(&mut self, term: u64) {
        let Some(aside) = self
            .core
            .journal_mut()
            .wal()
            .and_then(|w| w.started_over().map(|a| a.folder.clone()))
        else {
            return self.promote(term);
        };
        let why = format!(
            "this node set its damaged log aside (into {aside} in its data directory) and may \
             not lead until it has copied a primary's"
        );
        warn!(term, reason = %why, "won an election: resigning");
        let c = self.cluster_mut();
        c.handle.resign();
        c.role = NodeRole::Unknown(format!("electing a primary; {why}"));
    }

    fn promote(&mut self, term: u64) {
        if let Some(mut up) = self.upstream.take() {
            up.close(self.poll.registry());
        }
        self.register_upstream();
        let fresh = random_bytes::<8>().map_or(1, u64::from_le_bytes) | 1;
        if let Some(wal) = self.core.journal_mut().wal() {
            wal.set_term(term);
            wal.adopt_history(fresh);
        }
        // Taken under the previous primary: its clients are gone with it, so the tasks come
        // back ready as a restart brings them. Logged, so the replicas release them too.
        let mono = self.mono;
        let c = self.cluster_mut();
        c.role = NodeRole::Leading { term };
        c.led = true;
        c.promoted_at = Some(mono);
        let (name, cluster) = (c.name.clone(), c.cluster.clone());
        // Whatever waited for replicas belongs to an earlier leadership (and was refused).
        self.sync.restart();
        let (core, mut wire) = self.split();
        let released = core.release_all_taken(&mut wire);
        self.with_router(|r, cx| r.shards_start_leading(cx));
        info!(term, released, node = %name, %cluster, "became the primary");
    }

    /// A primary with `--sync-replicas N` in a set of fewer than N + 2 members cannot
    /// acknowledge a change once any one member is down (N acknowledgements need N replicas
    /// up besides the primary): judged once, by a primary that has led for `LAYOUT_GRACE`
    /// (its members have registered by then), and warned of. The loop calls it every turn
    /// until it has judged.
    pub(super) fn judge_layout(&mut self) {
        let (need, mono) = (self.cfg.sync_replicas, self.mono);
        let Some(c) = self.cluster.as_mut() else {
            return;
        };
        if need == 0 {
            c.layout_judged = true;
            return;
        }
        let settled = c
            .promoted_at
            .is_some_and(|t| mono >= t.saturating_add(LAYOUT_GRACE));
        if !settled || !matches!(c.role, NodeRole::Leading { .. }) {
            return;
        }
        c.layout_judged = true;
        let members = c.handle.overview().members.len();
        if members < need + 2 {
            warn!(
                members,
                sync_replicas = need,
                "this replica set cannot lose a member: with --sync-replicas {need}, a change \
                 needs {need} replicas besides the primary, and the set has {members} members; \
                 add members (at least {}) or lower --sync-replicas",
                need + 2
            );
        } else {
            info!(
                members,
                sync_replicas = need,
                "replica set layout judged: it can lose a member"
            );
        }
    }

    fn follow(&mut self, leader: String, addr: String, term: u64) {
        let Ok(primary) = addr.parse::<SocketAddr>() else {
            warn!(%leader, %addr, "the leader's address does not parse; not following it");
            self.cluster_mut().role =
                NodeRole::Unknown(format!("the leader {leader} published address {addr:?}"));
            return;
        };
        self.with_router(|r, cx| r.shards_stop_leading(cx));
        let c = self.cluster_mut();
        let led = std::mem::take(&mut c.led);
        // The role first: what closing does below happens on a replica (silently).
        c.role = NodeRole::Following {
            leader: leader.clone(),
            addr: addr.clone(),
            term,
        };
        if led {
            // Sessions and parked takes of this node's leadership: the new primary released
            // their tasks; their clients go and find it.
            self.close_clients("the primary changed");
        }
        self.close_relays("this node is a replica now");
        let keep = self
            .upstream
            .as_ref()
            .is_some_and(|u| u.primary() == primary);
        if !keep {
            if let Some(mut up) = self.upstream.take() {
                up.close(self.poll.registry());
            }
            let mut up = replica::Upstream::new(primary);
            up.in_cluster();
            self.upstream = Some(up);
            self.register_upstream();
        }
        info!(%leader, %addr, term, "following the primary");
    }

    fn deposed(&mut self, term: u64, reason: DeposeReason) {
        let why = match reason {
            DeposeReason::LeaseExpiring => "its lease could not be refreshed in time",
            DeposeReason::LeaseLost => "etcd no longer has its lease",
            DeposeReason::KeyLost => "the leader key is gone or another's",
            DeposeReason::Resigned => "it resigned",
            DeposeReason::Shutdown => "it is stopping",
        };
        warn!(
            term,
            reason = why,
            "no longer the primary: refusing changes"
        );
        self.cluster_mut().role = NodeRole::Unknown(format!(
            "this node stopped leading term {term}: {why}; no primary is known"
        ));
        self.with_router(|r, cx| r.shards_stop_leading(cx));
        self.answer_parked_with_nothing();
    }

    /// Closes every client connection (not relays), after the replies it is owed.
    fn close_clients(&mut self, reason: &'static str) {
        let idxs: Vec<usize> = self
            .conns
            .iter()
            .filter(|(_, c)| c.relay().is_none() && c.closing.is_none())
            .map(|(i, _)| i)
            .collect();
        for idx in idxs {
            self.close_quietly(idx, reason);
        }
    }

    pub(super) fn close_relays(&mut self, reason: &'static str) {
        // The turn's relay step turns the WAL's tap off once no relay is left.
        let relays = self.relays.take_all(&self.conns);
        self.register_heartbeats();
        for idx in relays {
            self.close_quietly(idx, reason);
        }
    }

    /// `queue.cluster()`: this node, the leader and its term, the members as etcd has them,
    /// and each replica's lag as the primary sees it (or this replica's own). `role` stays
    /// `leader`/`replica` (tools and tests read it); a sharded node adds its set, every set
    /// with its `primary`, and the placement (`shard_fields`).
    pub(crate) fn cluster_overview(&mut self) -> Value {
        let s = |v: &str| Value::from(v);
        let (written, last_term, history) = self
            .core
            .journal_mut()
            .wal()
            .map_or((0, 0, 0), |w| (w.written_seq(), w.last_term(), w.history()));
        let mut replicas = Vec::new();
        for (c, r) in self.relays.streams(&self.conns) {
            replicas.push(Value::Map(vec![
                (s("peer"), s(&c.peer.to_string())),
                (s("acked"), r.acked.into()),
                (s("lag_records"), written.saturating_sub(r.acked).into()),
                (s("lag_bytes"), (c.out.backlog() as u64).into()),
            ]));
        }
        let upstream = self.upstream_figures().map(|u| {
            Value::Map(vec![
                (s("connected"), u.connected.into()),
                (s("position"), u.position.into()),
                (s("lag_records"), u.lag_records.into()),
                (s("lag_bytes"), u.lag_bytes.into()),
                (s("lag_ms"), u.lag_ms.into()),
            ])
        });
        let mut fields = vec![
            (
                s("role"),
                s(if self.leads() { "leader" } else { "replica" }),
            ),
            (s("position"), written.into()),
            (s("position_term"), last_term.into()),
            (s("history"), s(&format!("{history:016x}"))),
            (s("replicas"), Value::Array(replicas)),
            (s("upstream"), upstream.unwrap_or(Value::Nil)),
        ];
        let Some(c) = &self.cluster else {
            let primary = self.cfg.replica_of.map(|a| a.to_string());
            fields.push((s("primary"), primary.map_or(Value::Nil, |p| s(&p))));
            return Value::Map(fields);
        };
        fields.extend(c.overview_fields());
        if let Some(set) = self.sharded_set() {
            fields.extend(self.shard_fields(c, set));
        }
        Value::Map(fields)
    }

    /// This node's replica set, on a sharded node (`--replica-set`).
    fn sharded_set(&self) -> Option<&str> {
        self.router.as_ref()?;
        self.cfg.cluster.as_ref()?.election.replica_set.as_deref()
    }

    /// `queue.cluster()`'s fields of a sharded node: its set (`replica_set`), every set with
    /// its primary and members (`sets`), and the placement as this node last read it, with the
    /// counts of each partition its set owns (`placement`; the other sets' partitions have
    /// theirs on their own nodes: `tarq ctl cluster` asks each set's primary).
    fn shard_fields(&self, c: &ClusterNode, set: &str) -> Vec<(Value, Value)> {
        let s = |v: &str| Value::from(v);
        let (placement, sets) = c.map();
        let sets = sets.iter().map(set_fields).collect();
        let tubes = (placement.tubes.values())
            .map(|t| self.placed_tube_fields(t, set))
            .collect();
        let valid = c
            .handle()
            .placement_fence()
            .valid_at(Instant::now())
            .is_some();
        vec![
            (s("replica_set"), s(set)),
            (s("sets"), Value::Array(sets)),
            (
                s("placement"),
                Value::Map(vec![
                    (s("epoch"), placement.epoch.into()),
                    (s("valid"), valid.into()),
                    (s("tubes"), Value::Array(tubes)),
                ]),
            ),
            (s("moves"), self.move_fields()),
        ]
    }

    /// A placed tube with its partitions: where each is, and the counts of those this node's
    /// set owns (`set`) and its engine holds under the tube's name (a replica may not yet).
    fn placed_tube_fields(&self, t: &tarq_cluster::TubePlacement, set: &str) -> Value {
        let s = |v: &str| Value::from(v);
        let queue = self.core.queue();
        let partitions = (t.partitions.iter().enumerate())
            .map(|(p, part)| {
                let here = part.set == set;
                let mut f = vec![
                    (s("partition"), (p as u64).into()),
                    (s("index"), u64::from(part.index).into()),
                    (s("set"), s(&part.set)),
                    (s("owner_here"), here.into()),
                ];
                let held = (queue.tube_info(part.index)).is_some_and(|i| i.name == t.name);
                if let Some(st) = queue.tube_stats(part.index).ok().filter(|_| here && held) {
                    f.extend([
                        (s("ready"), st.ready.into()),
                        (s("taken"), st.taken.into()),
                        (s("delayed"), st.waiting.into()),
                        (s("buried"), st.buried.into()),
                        (s("total"), st.total.into()),
                        // The number its next task gets: a partition placed on another set
                        // numbers on from it (`tarq ctl place`).
                        (s("next"), queue.tube_numbers(part.index).next.into()),
                    ]);
                }
                Value::Map(f)
            })
            .collect();
        Value::Map(vec![
            (s("name"), s(&t.name)),
            (s("type"), s(&t.kind)),
            (s("partitions"), Value::Array(partitions)),
        ])
    }

    /// The moves this node ran as a partition's owner: the one in progress (its tasks sent
    /// so far), and the ones done.
    fn move_fields(&self) -> Value {
        let s = |v: &str| Value::from(v);
        let Some((now, f)) = self.router.as_ref().map(|sh| sh.move_figures()) else {
            return Value::Nil;
        };
        let in_progress = now.map_or(Value::Nil, |(tube, partition, to, tasks)| {
            Value::Map(vec![
                (s("tube"), s(&tube)),
                (s("partition"), u64::from(partition).into()),
                (s("to"), s(&to)),
                (s("tasks"), tasks.into()),
            ])
        });
        Value::Map(vec![
            (s("in_progress"), in_progress),
            (s("committed"), f.committed.into()),
            (s("given_up"), f.given_up.into()),
            (s("tasks_moved"), f.tasks_moved.into()),
            (s("last_ms"), f.last_ms.map_or(Value::Nil, Value::from)),
        ])
    }
}

impl ClusterNode {
    /// `queue.cluster()`'s fields from the election: the cluster, this node and its state,
    /// the term, the leader and the members as etcd has them.
    fn overview_fields(&self) -> Vec<(Value, Value)> {
        let s = |v: &str| Value::from(v);
        let c = self;
        let o = c.handle.overview();
        let term = match &c.role {
            NodeRole::Leading { term } | NodeRole::Following { term, .. } => *term,
            NodeRole::Unknown(_) => o.leader.as_ref().map_or(0, |l| l.1),
        };
        let members = o
            .members
            .iter()
            .map(|m| {
                Value::Map(vec![
                    (s("name"), s(&m.name)),
                    (s("addr"), s(&m.addr)),
                    (
                        s("role"),
                        s(if m.role == tarq_cluster::Role::Leader {
                            "leader"
                        } else {
                            "replica"
                        }),
                    ),
                    (s("eligible"), m.eligible.into()),
                    (s("term"), m.position.term.into()),
                    (s("lsn"), m.position.lsn.into()),
                ])
            })
            .collect();
        let leader = o.leader.as_ref().map_or(Value::Nil, |(l, _)| {
            Value::Map(vec![(s("name"), s(&l.name)), (s("addr"), s(&l.addr))])
        });
        let state = match &c.role {
            NodeRole::Unknown(why) => why.clone(),
            NodeRole::Leading { .. } if c.leading_term().is_none() => "leadership ran out".into(),
            NodeRole::Leading { .. } => "leading".into(),
            NodeRole::Following { .. } => "following".into(),
        };
        vec![
            (s("cluster"), s(&c.cluster)),
            (
                s("etcd"),
                Value::Array(c.endpoints.iter().map(|e| s(e)).collect()),
            ),
            (s("node"), s(&c.name)),
            (s("state"), s(&state)),
            (s("term"), term.into()),
            (s("leader"), leader),
            (s("members"), Value::Array(members)),
            (
                s("etcd_error"),
                c.etcd_error.as_deref().map_or(Value::Nil, s),
            ),
        ]
    }
}

/// A replica set as `queue.cluster()` shows it: its primary and its members.
fn set_fields(v: &tarq_cluster::SetView) -> Value {
    let s = |v: &str| Value::from(v);
    let primary = v.leader.as_ref().map_or(Value::Nil, |(l, term)| {
        Value::Map(vec![
            (s("name"), s(&l.name)),
            (s("addr"), s(&l.addr)),
            (s("term"), (*term).into()),
        ])
    });
    let members = (v.members.iter())
        .map(|m| {
            // The word for a set's leader; etcd's member key says whether the member
            // led when it last wrote it, the set's leader key who does.
            let leads = v.leader.as_ref().is_some_and(|(l, _)| l.name == m.name);
            Value::Map(vec![
                (s("name"), s(&m.name)),
                (s("addr"), s(&m.addr)),
                (s("role"), s(if leads { "primary" } else { "replica" })),
                (s("eligible"), m.eligible.into()),
                (s("term"), m.position.term.into()),
                (s("lsn"), m.position.lsn.into()),
            ])
        })
        .collect();
    Value::Map(vec![
        (s("name"), s(&v.name)),
        (s("primary"), primary),
        (s("members"), Value::Array(members)),
    ])
}
