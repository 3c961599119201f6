//! A sharded cluster's routing, at the loop's one dispatch (`Server::dispatch`): a command for
//! a partition another replica set owns — or this set owns while another node of it leads — is
//! forwarded to that set's primary over a link ([`out_link`]) and its answer handed to the
//! asking connection's front-end as if the core had given it; a command for a partition this
//! node leads runs here, rewritten to that partition's index. The front-ends know nothing of
//! this: they name a tube (its first partition's index, which every node holds) and ids, and
//! an id's high bits name its partition.
//!
//! The placement comes from etcd (`tarq_cluster`'s map): each tube's partitions, their
//! indexes and owning sets, and every set's primary. This node's primary creates every tube's
//! first partition (so names resolve on every node) and the partitions its set owns.
//!
//! What goes where: a put goes to a partition this node leads if it has one (no hop), else to
//! the tube's partitions in turn; a utube put to the partition its key hashes to (per-key
//! order holds). A take tries the partitions this node leads, then the others in turn; one
//! that waits watches every partition (`Command::Watch`, answered by the owner when it has a
//! task) instead of polling. A whole-tube figure is summed over the partitions.

mod out_link;

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, HashSet, VecDeque};
use std::hash::{BuildHasher, BuildHasherDefault, DefaultHasher};
use std::sync::Arc;
use std::time::Instant;

use tarq_cluster::{Placement, PlacementFence, SetView, TubePlacement};
use tarq_engine::{id_tube, Micros, SessionId, Stats, TubeIx, TubeOptions, TubePut, TubeType};
use tracing::{info, warn};

use super::host::deliver_to;
use super::Server;
use crate::core::{Caller, Command, On, Outcome, Refusal};
use crate::frontend::link::wire::{self, Ask};
use crate::frontend::ReplyTo;
pub(crate) use out_link::LINK_TOKEN_BASE;
use out_link::{Answered, OutLink, FIRST_CALL_SYNC};

/// The most replica sets a cluster routes to (a session's sets are a 64-bit mask).
const MAX_SETS: usize = 64;
/// Router tokens with this bit are a waiting take's local watch (the rest: its number);
/// without it, a whole-tube figure's.
const WATCH: u64 = 1 << 63;

/// What the router keeps of an outcome answered to it (`ReplyTo::Router`).
#[derive(Debug, Clone)]
pub(crate) enum Digest {
    Ready(TubeIx),
    Count(u64),
    Stats(Stats),
    Nothing,
    Ok,
    Error(Refusal),
    Other,
}

impl Digest {
    pub fn of(outcome: &Outcome<'_>) -> Digest {
        match outcome {
            Outcome::Ready(t) => Digest::Ready(*t),
            Outcome::Count(n) => Digest::Count(*n),
            Outcome::TubeStats(s) => Digest::Stats(*s),
            Outcome::Nothing => Digest::Nothing,
            Outcome::Ok => Digest::Ok,
            Outcome::Error(e) => Digest::Error(e.clone()),
            _ => Digest::Other,
        }
    }
}

/// A replica set as the router knows it.
struct SetSlot {
    name: String,
    /// Its primary's address, while it has one.
    primary: Option<String>,
    link: Option<OutLink>,
}

/// A partition: its tube (by its first partition's index) and owning set.
#[derive(Clone, Copy, Debug)]
struct Part {
    head: TubeIx,
    set: usize,
}

/// A placed tube: its partitions' indexes in order.
#[derive(Debug)]
struct Routed {
    name: String,
    parts: Vec<TubeIx>,
    utube: bool,
    /// limfifottl: its capacity is shared by its partitions, so a put tries each for room.
    capped: bool,
}

/// Who asked a forwarded command.
#[derive(Clone, Copy, Debug)]
struct Client {
    idx: usize,
    gen: u32,
    sid: SessionId,
    reply: ReplyTo,
}

/// What to do with a forwarded command's answer.
enum Then {
    Deliver,
    /// A take that found nothing there: try the next partitions.
    Take {
        plan: TakePlan,
    },
    /// One partition's share of a whole-tube figure.
    Gather {
        key: u64,
    },
    /// One partition's figures toward every tube's (`queue.statistics()`): tube `head`'s.
    GatherTube {
        key: u64,
        head: TubeIx,
    },
    /// A watch of a partition (for the waiting takes of its tube) was answered.
    Woke {
        ix: TubeIx,
    },
    /// A waiting take's try of a partition its watch said has a task.
    WaitTake {
        waiter: u64,
        ix: TubeIx,
    },
    /// A put into a limfifottl tube: on `Full`, the next partition.
    Put {
        plan: PutPlan,
    },
}

/// A put into a partitioned limfifottl tube, owned (it outlives the request's frame): the
/// partitions still to try for room.
#[derive(Clone, Debug)]
struct PutPlan {
    data: Vec<u8>,
    utube: Vec<u8>,
    dedup_key: Option<Vec<u8>>,
    /// The put's scalar options (its keys are the fields above).
    opts: TubePut<'static>,
    wait: Micros,
    left: Vec<TubeIx>,
}

struct Pending {
    set: usize,
    client: Client,
    then: Then,
}

/// A take across a tube's partitions: the ones still to try, and how long it may wait.
#[derive(Clone, Debug)]
struct TakePlan {
    on: On,
    left: Vec<TubeIx>,
    timeout: Option<Micros>,
}

/// A take waiting for a task of any partition of its tube.
#[derive(Clone, Copy, Debug)]
struct Waiter {
    client: Client,
    on: On,
    /// The watch of the partitions this node leads, while parked in the core.
    local: Option<u64>,
}

/// A whole-tube figure being summed.
struct Gather {
    client: Client,
    left: usize,
    stats: Stats,
    count: u64,
    kind: GatherKind,
    error: Option<Refusal>,
    /// Every tube's figures (`GatherKind::All`): name, first partition's index, sum.
    per: Vec<(String, TubeIx, Stats)>,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum GatherKind {
    Stats,
    All,
    Count,
    Ok,
}

/// The router's state.
pub(crate) struct Shards {
    /// This node's replica set.
    set: String,
    sets: Vec<SetSlot>,
    /// By engine index: the partition placed there.
    parts: Vec<Option<Part>>,
    /// By first partition's index: the tube's partitions.
    tubes: HashMap<TubeIx, Routed>,
    placement: Arc<Placement>,
    fence: PlacementFence,
    /// Whether this node's view of the placement may be acted on (read per call).
    valid: bool,
    /// How long a view of the placement is trusted (lease TTL less the safety margin).
    validity: std::time::Duration,
    /// Partitions that moved to this node's set: not served before these instants, when every
    /// view that showed the old owner has expired.
    held: HashMap<TubeIx, Instant>,
    pending: HashMap<u64, Pending>,
    next_sync: u64,
    gathers: HashMap<u64, Gather>,
    next_gather: u64,
    /// Sessions of this node that forwarded calls, with the sets they reached (told when the
    /// session ends).
    forwarded: HashMap<SessionId, u64>,
    /// create_tube calls waiting for etcd, by token.
    creates: HashMap<u64, (Client, bool)>,
    next_token: u64,
    rr: usize,
    /// Takes waiting across partitions, by number, and by tube in arrival order.
    waiters: HashMap<u64, Waiter>,
    queues: HashMap<TubeIx, VecDeque<u64>>,
    next_waiter: u64,
    deadlines: BinaryHeap<Reverse<(Micros, u64)>>,
    /// Partitions led elsewhere that this node watches now.
    watching: HashSet<TubeIx>,
}

impl Shards {
    pub fn new(set: String, fence: PlacementFence, validity: std::time::Duration) -> Shards {
        Shards {
            set,
            validity,
            held: HashMap::new(),
            sets: Vec::new(),
            parts: Vec::new(),
            tubes: HashMap::new(),
            placement: Arc::default(),
            fence,
            valid: false,
            pending: HashMap::new(),
            next_sync: FIRST_CALL_SYNC,
            gathers: HashMap::new(),
            next_gather: 0,
            forwarded: HashMap::new(),
            creates: HashMap::new(),
            next_token: 0,
            rr: 0,
            waiters: HashMap::new(),
            queues: HashMap::new(),
            next_waiter: 0,
            deadlines: BinaryHeap::new(),
            watching: HashSet::new(),
        }
    }

    /// Whether `token` is one of the links'.
    pub fn owns_token(token: usize) -> bool {
        (LINK_TOKEN_BASE..LINK_TOKEN_BASE + MAX_SETS).contains(&token)
    }

    fn slot_of(&mut self, name: &str) -> usize {
        if let Some(i) = self.sets.iter().position(|s| s.name == name) {
            return i;
        }
        self.sets.push(SetSlot {
            name: name.to_owned(),
            primary: None,
            link: None,
        });
        self.sets.len() - 1
    }

    /// Takes in a map read from etcd.
    fn apply(&mut self, placement: Arc<Placement>, sets: &[SetView]) {
        for s in sets {
            let slot = self.slot_of(&s.name);
            let primary = s.leader.as_ref().map(|(l, _)| l.addr.clone());
            if self.sets[slot].primary != primary {
                self.sets[slot].primary = primary;
            }
        }
        let before: Vec<Option<usize>> = self.parts.iter().map(|p| p.map(|p| p.set)).collect();
        self.parts.clear();
        self.tubes.clear();
        for t in placement.tubes.values() {
            self.add_tube(t);
        }
        // A partition another set owned until now: its old owner may act on its old view
        // until that expires, so this set waits as long before serving it.
        let now = Instant::now();
        self.held.retain(|_, until| *until > now);
        let mine = self.sets.iter().position(|s| s.name == self.set);
        for (ix, p) in self.parts.iter().enumerate() {
            let was = before.get(ix).copied().flatten();
            if let (Some(p), Some(was)) = (p, was) {
                if Some(p.set) == mine && was != p.set {
                    self.held.insert(ix as TubeIx, now + self.validity);
                }
            }
        }
        self.placement = placement;
    }

    /// Routes tube `t` as placed.
    fn add_tube(&mut self, t: &TubePlacement) {
        let Some(head) = t.partitions.first().map(|p| p.index) else {
            return;
        };
        let mut parts = Vec::with_capacity(t.partitions.len());
        for p in &t.partitions {
            let set = self.slot_of(&p.set);
            let ix = p.index as usize;
            if self.parts.len() <= ix {
                self.parts.resize(ix + 1, None);
            }
            self.parts[ix] = Some(Part { head, set });
            parts.push(p.index);
        }
        let utube = matches!(t.kind.as_str(), "utube" | "utubettl");
        let capped = t.kind == "limfifottl";
        self.tubes.insert(
            head,
            Routed {
                name: t.name.clone(),
                parts,
                utube,
                capped,
            },
        );
    }

    /// The earliest deadline of a waiting take.
    pub fn next_deadline(&self) -> Option<Micros> {
        self.deadlines.peek().map(|Reverse((t, _))| *t)
    }

    fn part(&self, ix: TubeIx) -> Option<Part> {
        self.parts.get(ix as usize).copied().flatten()
    }

    /// Why this node may not change partition `ix` now though its set owns it: its view of
    /// the placement may be stale, or the partition has just moved here.
    fn hold(&self, ix: TubeIx) -> Option<String> {
        if !self.valid {
            return Some(
                "this node's view of the placement is stale (etcd not read lately): no change now"
                    .into(),
            );
        }
        match self.held.get(&ix) {
            Some(until) if Instant::now() < *until => Some(format!(
                "partition at index {ix} has just moved to replica set {}: it serves it in {} ms",
                self.set,
                until.saturating_duration_since(Instant::now()).as_millis()
            )),
            _ => None,
        }
    }

    /// Why a command another node forwarded may not run here: it names a partition this
    /// node's set does not own in this node's view (the forwarder's view is older or newer —
    /// the fence on placement, as the term is on leadership), or one `hold` keeps.
    pub fn refuse_forwarded(&mut self, cmd: &Command<'_>) -> Option<String> {
        self.valid = self.fence.valid_at(Instant::now()).is_some();
        let ix = named_partition(cmd)?;
        let part = self.part(ix)?;
        if self.sets[part.set].name != self.set {
            return Some(format!(
                "partition at index {ix} belongs to replica set {}, not {} (placement epoch {})",
                self.sets[part.set].name, self.set, self.placement.epoch
            ));
        }
        if cmd.reads_only() {
            return None;
        }
        self.hold(ix)
    }

    /// Whether this node serves partition `ix` itself: its set owns it and it leads the set.
    fn here(&self, ix: TubeIx, leads: bool) -> bool {
        leads
            && self
                .part(ix)
                .is_some_and(|p| self.sets[p.set].name == self.set)
    }
}

/// A tube's options as a placement keeps them (JSON, times in microseconds).
pub(crate) fn options_json(o: &TubeOptions) -> serde_json::Value {
    serde_json::json!({
        "ttl": o.ttl, "ttr": o.ttr, "pri": o.pri, "capacity": o.capacity,
        "max_deliveries": o.max_deliveries, "dedup_window": o.dedup_window,
        "temporary": o.temporary,
    })
}

fn options_from(v: &serde_json::Value, part: u16) -> TubeOptions {
    let u = |k: &str| v.get(k).and_then(serde_json::Value::as_u64);
    TubeOptions {
        ttl: u("ttl"),
        ttr: u("ttr"),
        pri: v
            .get("pri")
            .and_then(serde_json::Value::as_i64)
            .unwrap_or(0),
        capacity: u("capacity").unwrap_or(0),
        max_deliveries: u("max_deliveries").map_or(0, |n| n.min(u64::from(u16::MAX)) as u16),
        dedup_window: u("dedup_window").unwrap_or(0),
        temporary: v
            .get("temporary")
            .and_then(serde_json::Value::as_bool)
            .unwrap_or(false),
        on_demand: false,
        part,
    }
}

fn add_stats(a: &mut Stats, b: &Stats) {
    a.total += b.total;
    a.ready += b.ready;
    a.taken += b.taken;
    a.waiting += b.waiting;
    a.buried += b.buried;
    a.puts += b.puts;
    a.takes += b.takes;
    a.acks += b.acks;
    a.releases += b.releases;
    a.promoted += b.promoted;
    a.expired += b.expired;
    a.ttr_returned += b.ttr_returned;
    a.auto_released += b.auto_released;
    a.buries += b.buries;
    a.kicks += b.kicks;
    a.deletes += b.deletes;
    a.touches += b.touches;
    a.dead_lettered += b.dead_lettered;
    a.deduplicated += b.deduplicated;
}

/// The partition a utube key goes to: the same on every node (a fixed hasher).
fn key_partition(key: &[u8], n: usize) -> usize {
    let h = BuildHasherDefault::<DefaultHasher>::default().hash_one(key);
    (h % n as u64) as usize
}

/// What the router does with a command.
enum Route<'c> {
    /// Run it here, as it is now.
    Here(Command<'c>),
    /// It was forwarded or answered.
    Done,
}

impl Server {
    /// Takes in a new map (etcd's `MapChanged`): the routes, and — on a primary — the tubes
    /// this node must hold.
    pub(super) fn shards_map_changed(&mut self, placement: Arc<Placement>, sets: &[SetView]) {
        let Some(shards) = self.shards.as_mut() else {
            return;
        };
        shards.apply(Arc::clone(&placement), sets);
        info!(
            epoch = placement.epoch,
            tubes = placement.tubes.len(),
            "placement applied"
        );
        for t in placement.tubes.values() {
            self.hold_tube(t);
        }
        self.watch_again();
    }

    /// Watches again the partitions the waiting takes need that nothing watches now (a watch
    /// lost with its link, answered while its set had no primary): after each new map.
    fn watch_again(&mut self) {
        let leads = self.leads();
        let Some(shards) = self.shards.as_ref() else {
            return;
        };
        let heads: Vec<TubeIx> = shards.queues.keys().copied().collect();
        for head in heads {
            let Some((_, w)) = self.oldest_waiter(head) else {
                continue;
            };
            let Some(shards) = self.shards.as_ref() else {
                return;
            };
            let parts: Vec<TubeIx> = (shards.tubes.get(&head))
                .map(|t| {
                    t.parts
                        .iter()
                        .copied()
                        .filter(|&p| !shards.here(p, leads))
                        .collect()
                })
                .unwrap_or_default();
            for ix in parts {
                self.watch_remote(ix, w.client);
            }
        }
    }

    /// On a primary, holds what of tube `t` this node must: every tube's first partition (so
    /// its name resolves on every node) and the partitions its set owns.
    fn hold_tube(&mut self, t: &TubePlacement) {
        if !self.leads() {
            return;
        }
        let Some(me) = self.shards.as_ref().map(|s| s.set.clone()) else {
            return;
        };
        let Ok(kind) = TubeType::parse(&t.kind) else {
            warn!(tube = %t.name, kind = %t.kind, "placement names an unknown tube type");
            return;
        };
        let n = t.partitions.len() as u64;
        for (p, part) in t.partitions.iter().enumerate() {
            if p > 0 && part.set != me {
                continue;
            }
            let mut opts = options_from(&t.options, p as u16);
            if opts.capacity > 0 {
                // A limfifottl tube's capacity is its partitions' together.
                opts.capacity = opts.capacity / n + u64::from((p as u64) < opts.capacity % n);
            }
            if let Err(e) = self
                .core
                .place_tube(part.index, &t.name, kind, opts, part.first)
            {
                warn!(tube = %t.name, partition = p, error = %e, "cannot hold a placed partition");
            }
        }
    }

    /// A placement change this node asked for was made (or refused).
    pub(super) fn shards_placement_done(
        &mut self,
        token: u64,
        result: Result<tarq_cluster::TubePlacement, tarq_cluster::PlacementError>,
    ) {
        let Some((client, if_not_exists)) =
            self.shards.as_mut().and_then(|s| s.creates.remove(&token))
        else {
            return;
        };
        // Made by another node meanwhile, and this call lets it be: the tube as placed.
        let result = match result {
            Err(tarq_cluster::PlacementError::Exists(t)) if if_not_exists => Ok(*t),
            other => other,
        };
        if let Ok(t) = &result {
            if let Some(s) = self.shards.as_mut() {
                s.add_tube(t);
            }
            self.hold_tube(t);
        }
        let outcome = match result {
            Ok(t) => match t.partitions.first().map(|p| p.index) {
                Some(ix) => match self.core.queue().tube_info(ix) {
                    Some(info) => {
                        if self
                            .conns
                            .get(client.idx)
                            .is_some_and(|x| x.gen == client.gen)
                        {
                            let (conns, flush) = (&mut self.conns, &mut self.flush_list);
                            deliver_to(
                                conns,
                                flush,
                                client.idx,
                                client.reply,
                                &Outcome::Tube(info),
                            );
                        }
                        return;
                    }
                    None => Outcome::Error(Refusal::Shards(format!(
                        "tube {} is placed; its first partition is not here yet",
                        t.name
                    ))),
                },
                None => Outcome::Error(Refusal::Shards("a tube placed without partitions".into())),
            },
            Err(tarq_cluster::PlacementError::Exists(t)) => {
                let e = tarq_engine::QueueError::TubeExists(t.name.clone());
                Outcome::Error(Refusal::Queue(e))
            }
            Err(e) => Outcome::Error(Refusal::Shards(e.to_string())),
        };
        self.answer(client, &outcome);
    }

    fn answer(&mut self, c: Client, outcome: &Outcome<'_>) {
        if self.conns.get(c.idx).is_some_and(|x| x.gen == c.gen) {
            deliver_to(
                &mut self.conns,
                &mut self.flush_list,
                c.idx,
                c.reply,
                outcome,
            );
        }
    }

    /// Routes `cmd` of connection `idx`: `Some` to run it here (rewritten to its partition),
    /// `None` when it was forwarded or answered.
    pub(crate) fn route<'c>(
        &mut self,
        idx: usize,
        reply: ReplyTo,
        cmd: Command<'c>,
    ) -> Option<Command<'c>> {
        let leads = self.leads();
        let c = &self.conns[idx];
        let client = Client {
            idx,
            gen: c.gen,
            sid: c.sid,
            reply,
        };
        let shards = self.shards.as_mut()?;
        shards.valid = shards.fence.valid_at(Instant::now()).is_some();
        let to = |ix: TubeIx, cmd: Command<'c>| (ix, cmd);
        let (ix, cmd) = match cmd {
            Command::CreateTube {
                name,
                kind,
                opts,
                if_not_exists,
                partitions,
            } => {
                // A tube that is here already, or a node that does not lead its set (it
                // refuses a change as any replica does, naming its primary): the core's.
                if !leads || (if_not_exists && self.core.queue().tube_ix(name).is_some()) {
                    return Some(cmd);
                }
                if kind == TubeType::LimFifoTtl
                    && opts.capacity > 0
                    && opts.capacity < u64::from(partitions)
                {
                    let why = format!(
                        "a limfifottl tube's capacity ({}) is shared by its partitions: it needs at least one a partition ({partitions})",
                        opts.capacity
                    );
                    self.answer(client, &Outcome::Error(Refusal::Shards(why)));
                    return None;
                }
                let token = shards.next_token;
                shards.next_token += 1;
                shards.creates.insert(token, (client, if_not_exists));
                let cluster = self
                    .cluster
                    .as_ref()
                    .expect("a sharded node is a cluster node");
                cluster.create_tube(token, name, kind.as_str(), options_json(&opts), partitions);
                return None;
            }
            Command::Put { .. } => to(0, cmd),
            Command::PutIn {
                tube,
                data,
                opts,
                wait,
            } => {
                let Some(t) = shards.tubes.get(&tube) else {
                    return Some(cmd);
                };
                let n = t.parts.len();
                if t.capped && n > 1 {
                    return self.put_capped(client, tube, data, opts, wait, leads);
                }
                let ix = if t.utube {
                    t.parts[key_partition(opts.utube, n)]
                } else {
                    // A partition led here, in turn (no hop); else any, in turn.
                    let here = |p: &&TubeIx| shards.here(**p, leads) && shards.hold(**p).is_none();
                    let rr = shards.rr;
                    let local = t.parts.iter().filter(here).count();
                    let ix = match local {
                        0 => t.parts[rr % n],
                        _ => *t
                            .parts
                            .iter()
                            .filter(here)
                            .nth(rr % local)
                            .expect("counted"),
                    };
                    shards.rr = rr.wrapping_add(1);
                    ix
                };
                let cmd = Command::PutIn {
                    tube: ix,
                    data,
                    opts,
                    wait,
                };
                (ix, cmd)
            }
            Command::Take { on, timeout } => {
                return match self.take_across(client, on, timeout, leads) {
                    Route::Here(c) => Some(c),
                    Route::Done => None,
                };
            }
            Command::Ack { on, id } => by_id(id, cmd, |ix| Command::Ack {
                on: on_ix(on, ix),
                id,
            }),
            Command::Release { on, id, opts } => by_id(id, cmd, |ix| Command::Release {
                on: on_ix(on, ix),
                id,
                opts,
            }),
            Command::Touch { id, delta, .. } => {
                by_id(id, cmd, |tube| Command::Touch { tube, id, delta })
            }
            Command::Peek { id, .. } => by_id(id, cmd, |tube| Command::Peek { tube, id }),
            Command::Bury { id, .. } => by_id(id, cmd, |tube| Command::Bury { tube, id }),
            Command::Delete { id, .. } => by_id(id, cmd, |tube| Command::Delete { tube, id }),
            Command::TakeTask { id }
            | Command::BuryTaken { id, .. }
            | Command::TouchTtr { id }
            | Command::KickTask { id } => by_id(id, cmd, |_| cmd),
            Command::TubeStats { tube } => {
                return self.gather(client, tube, GatherKind::Stats, leads, |t| {
                    Command::TubeStats { tube: t }
                });
            }
            Command::Kick { tube, count } => {
                return self.gather(client, tube, GatherKind::Count, leads, |t| Command::Kick {
                    tube: t,
                    count,
                });
            }
            Command::KickAny { tube, count } => {
                return self.gather(client, tube, GatherKind::Count, leads, |t| {
                    Command::KickAny { tube: t, count }
                });
            }
            Command::Truncate { tube } => {
                return self.gather(client, tube, GatherKind::Ok, leads, |t| Command::Truncate {
                    tube: t,
                });
            }
            Command::AllTubeStats => {
                self.gather_all(client, leads);
                return None;
            }
            Command::DropTube { tube } if shards.tubes.contains_key(&tube) => {
                let why = "dropping a tube placed over a sharded cluster is not built yet: \
                           truncate it instead";
                self.answer(client, &Outcome::Error(Refusal::Shards(why.into())));
                return None;
            }
            Command::ReleaseAll { tube } => {
                return self.gather(client, tube, GatherKind::Ok, leads, |t| {
                    Command::ReleaseAll { tube: t }
                });
            }
            other => return Some(other),
        };
        self.run_on_partition(client, ix, cmd, Then::Deliver, leads)
    }

    /// Runs `cmd` on partition `ix`: here (`Some`) or forwarded to its owner.
    fn run_on_partition<'c>(
        &mut self,
        client: Client,
        ix: TubeIx,
        cmd: Command<'c>,
        then: Then,
        leads: bool,
    ) -> Option<Command<'c>> {
        let shards = self.shards.as_mut()?;
        let Some(part) = shards.part(ix) else {
            // Not a placed partition (a tube of this node's own, or no such index): the core
            // answers as it would anywhere.
            return Some(cmd);
        };
        if shards.here(ix, leads) {
            if !cmd.reads_only() {
                if let Some(why) = shards.hold(ix) {
                    self.answer(client, &Outcome::Error(Refusal::Shards(why)));
                    return None;
                }
            }
            return Some(cmd);
        }
        self.forward(part.set, client, cmd, then);
        None
    }

    /// Sends `cmd` to the primary of set `set` for `client`; its answer goes where `then`
    /// says, a failure to send it too (a watch's failure is no answer to its client's take).
    fn forward(&mut self, set: usize, client: Client, cmd: Command<'_>, then: Then) {
        let Some(shards) = self.shards.as_mut() else {
            return;
        };
        let sync = shards.next_sync;
        shards.next_sync += 1;
        if shards.sets[set].link.is_none() {
            let s = &shards.sets[set];
            let opened = match s.primary.as_ref().and_then(|a| resolve(a)) {
                None => Err(format!("replica set {} has no primary now", s.name)),
                Some(addr) => OutLink::connect(addr, set, sync, self.poll.registry())
                    .map_err(|e| format!("cannot reach replica set {} at {addr}: {e}", s.name)),
            };
            match opened {
                Ok(l) => shards.sets[set].link = Some(l),
                Err(why) => {
                    shards.pending.insert(sync, Pending { set, client, then });
                    return self.on_answer(sync, Err(why));
                }
            }
        }
        let link = shards.sets[set].link.as_mut().expect("opened above");
        link.send(
            sync,
            &Ask::Run {
                session: client.sid,
                command: cmd,
            },
        );
        *shards.forwarded.entry(client.sid).or_default() |= 1 << set;
        shards.pending.insert(sync, Pending { set, client, then });
    }

    /// A take on `on`'s tube: the partitions this node leads first, then the others.
    fn take_across<'c>(
        &mut self,
        client: Client,
        on: On,
        timeout: Option<Micros>,
        leads: bool,
    ) -> Route<'c> {
        let head = on.tube();
        let Some(shards) = self.shards.as_mut() else {
            return Route::Here(Command::Take { on, timeout });
        };
        let Some(t) = shards.tubes.get(&head) else {
            return Route::Here(Command::Take { on, timeout });
        };
        let (mut here, mut there): (Vec<TubeIx>, Vec<TubeIx>) =
            t.parts.iter().partition(|&&p| shards.here(p, leads));
        // A partition led here that may not be served now (a stale view, a move) is skipped.
        here.retain(|&ix| shards.hold(ix).is_none());
        if there.is_empty() && here.len() == 1 {
            // One partition, led here: the core's own take, waiting as it does.
            let ix = here[0];
            return Route::Here(Command::Take {
                on: on_ix(on, ix),
                timeout,
            });
        }
        shards.rr = shards.rr.wrapping_add(1);
        let rr = shards.rr;
        let (nh, nt) = (here.len().max(1), there.len().max(1));
        here.rotate_left(rr % nh);
        there.rotate_left(rr % nt);
        if let Some(&ix) = here.iter().find(|&&ix| self.core.queue().can_take(ix)) {
            return Route::Here(Command::Take {
                on: on_ix(on, ix),
                timeout: Some(0),
            });
        }
        self.take_next(
            client,
            TakePlan {
                on,
                left: there,
                timeout,
            },
        );
        Route::Done
    }

    /// A put into a partitioned limfifottl tube: a partition led here with room, else the
    /// others in turn until one has room (the last waits for room as the put asks).
    fn put_capped<'c>(
        &mut self,
        client: Client,
        head: TubeIx,
        data: &'c [u8],
        opts: TubePut<'c>,
        wait: Micros,
        leads: bool,
    ) -> Option<Command<'c>> {
        let shards = self.shards.as_mut()?;
        let mut order = shards.tubes.get(&head)?.parts.clone();
        shards.rr = shards.rr.wrapping_add(1);
        let n = order.len();
        order.rotate_left(shards.rr % n);
        let q = self.core.queue();
        let has_room = |ix: TubeIx| {
            q.tube_info(ix).is_some_and(|t| {
                t.opts.capacity == 0 || q.tube_stats(ix).is_ok_and(|s| s.total < t.opts.capacity)
            })
        };
        let put = |ix: TubeIx| Command::PutIn {
            tube: ix,
            data,
            opts,
            wait,
        };
        if let Some(&ix) = order
            .iter()
            .find(|&&ix| shards.here(ix, leads) && has_room(ix))
        {
            return Some(put(ix));
        }
        let left: Vec<TubeIx> = order
            .iter()
            .copied()
            .filter(|&ix| !shards.here(ix, leads))
            .collect();
        if left.is_empty() {
            // Every partition is led here and full: the core answers (or waits) on one.
            return Some(put(order[0]));
        }
        let plan = PutPlan {
            data: data.to_vec(),
            utube: opts.utube.to_vec(),
            dedup_key: opts.dedup_key.map(<[u8]>::to_vec),
            opts: TubePut {
                utube: &[],
                dedup_key: None,
                ..opts
            },
            wait,
            left,
        };
        self.put_next(client, plan);
        None
    }

    /// Tries the next partition of a limfifottl put.
    fn put_next(&mut self, client: Client, mut plan: PutPlan) {
        let ix = plan.left.remove(0);
        let Some(set) = self.shards.as_ref().and_then(|s| s.part(ix)).map(|p| p.set) else {
            return self.answer(client, &Outcome::Full);
        };
        let next = plan.clone();
        let cmd = Command::PutIn {
            tube: ix,
            data: &plan.data,
            opts: TubePut {
                utube: &plan.utube,
                dedup_key: plan.dedup_key.as_deref(),
                ..plan.opts
            },
            wait: if plan.left.is_empty() { plan.wait } else { 0 },
        };
        self.forward(set, client, cmd, Then::Put { plan: next });
    }

    /// Tries the next remote partition of `plan`, or ends the take.
    fn take_next(&mut self, client: Client, mut plan: TakePlan) {
        if plan.left.is_empty() {
            return match plan.timeout {
                Some(0) => self.answer(client, &Outcome::Nothing),
                timeout => self.wait(client, plan.on, timeout),
            };
        }
        let ix = plan.left.remove(0);
        let set = match self.shards.as_ref().and_then(|s| s.part(ix)) {
            Some(p) => p.set,
            None => return self.take_next(client, plan),
        };
        let cmd = Command::Take {
            on: on_ix(plan.on, ix),
            timeout: Some(0),
        };
        self.forward(set, client, cmd, Then::Take { plan });
    }

    /// Runs `make(partition)` on every partition of `tube` and answers the sum.
    fn gather<'c>(
        &mut self,
        client: Client,
        tube: TubeIx,
        kind: GatherKind,
        leads: bool,
        make: impl Fn(TubeIx) -> Command<'c>,
    ) -> Option<Command<'c>> {
        let shards = self.shards.as_mut()?;
        let parts = match shards.tubes.get(&tube) {
            Some(t) if t.parts.len() > 1 || !shards.here(tube, leads) => t.parts.clone(),
            _ => return Some(make(tube)),
        };
        let key = shards.next_gather;
        shards.next_gather += 1;
        shards.gathers.insert(
            key,
            Gather {
                client,
                left: parts.len(),
                stats: Stats::default(),
                count: 0,
                kind,
                error: None,
                per: Vec::new(),
            },
        );
        for ix in parts {
            let here = self.shards.as_ref().is_some_and(|s| s.here(ix, leads));
            if here {
                let caller = Caller::new(client.idx, client.gen, client.sid);
                self.execute_as(caller, ReplyTo::Router(key), make(ix));
            } else if let Some(set) = self.shards.as_ref().and_then(|s| s.part(ix)).map(|p| p.set) {
                self.forward(set, client, make(ix), Then::Gather { key });
            }
        }
        None
    }

    /// `queue.statistics()` on a sharded node: every placed tube's figures summed over its
    /// partitions (the ones led here read at once, the others asked of their owners).
    fn gather_all(&mut self, client: Client, leads: bool) {
        let Some(shards) = self.shards.as_mut() else {
            return;
        };
        let mut tubes: Vec<(String, TubeIx, Vec<TubeIx>)> = (shards.tubes.iter())
            .filter(|(_, t)| t.name != tarq_engine::DEFAULT_TUBE_NAME)
            .map(|(&head, t)| (t.name.clone(), head, t.parts.clone()))
            .collect();
        tubes.sort();
        let key = shards.next_gather;
        shards.next_gather += 1;
        let mut per = Vec::with_capacity(tubes.len());
        let mut asks = Vec::new();
        for (name, head, parts) in tubes {
            let mut sum = Stats::default();
            for ix in parts {
                if shards.here(ix, leads) {
                    add_stats(
                        &mut sum,
                        &self.core.queue().tube_stats(ix).unwrap_or_default(),
                    );
                } else if let Some(p) = shards.part(ix) {
                    asks.push((p.set, ix, head));
                }
            }
            per.push((name, head, sum));
        }
        let gather = Gather {
            client,
            left: asks.len(),
            stats: Stats::default(),
            count: 0,
            kind: GatherKind::All,
            error: None,
            per,
        };
        if asks.is_empty() {
            let all = gather.per.into_iter().map(|(n, _, s)| (n, s)).collect();
            return self.answer(client, &Outcome::AllStats(all));
        }
        shards.gathers.insert(key, gather);
        for (set, ix, head) in asks {
            let cmd = Command::TubeStats { tube: ix };
            self.forward(set, client, cmd, Then::GatherTube { key, head });
        }
    }

    /// Takes the outcomes the core answered to the router.
    pub(super) fn take_routed(&mut self) {
        while !self.routed.is_empty() {
            for (token, digest) in std::mem::take(&mut self.routed) {
                if token & WATCH != 0 {
                    self.local_woke(token & !WATCH, digest);
                } else {
                    self.gathered(token, None, digest);
                }
            }
        }
    }

    /// A take that found no task in any partition waits: every partition of its tube is
    /// watched (the ones led here in the core, the others by their owners), and the first to
    /// have a task serves it.
    fn wait(&mut self, client: Client, on: On, timeout: Option<Micros>) {
        let leads = self.leads();
        let deadline = timeout.map_or(Micros::MAX, |t| self.mono.saturating_add(t));
        let Some(shards) = self.shards.as_mut() else {
            return;
        };
        let head = on.tube();
        let Some(t) = shards.tubes.get(&head) else {
            return self.answer(client, &Outcome::Nothing);
        };
        let (here, there): (Vec<TubeIx>, Vec<TubeIx>) =
            t.parts.iter().partition(|&&p| shards.here(p, leads));
        let id = shards.next_waiter;
        shards.next_waiter += 1;
        shards.waiters.insert(
            id,
            Waiter {
                client,
                on,
                local: None,
            },
        );
        shards.queues.entry(head).or_default().push_back(id);
        if deadline != Micros::MAX {
            shards.deadlines.push(Reverse((deadline, id)));
            self.timers_changed();
        }
        for ix in there {
            self.watch_remote(ix, client);
        }
        if !here.is_empty() {
            let caller = Caller::new(client.idx, client.gen, client.sid);
            let (core, mut wire) = self.split();
            let group = core.watch_any(caller, ReplyTo::Router(WATCH | id), &here, &mut wire);
            if let Some(w) = self.shards.as_mut().and_then(|s| s.waiters.get_mut(&id)) {
                w.local = group;
            }
            self.take_routed();
        }
    }

    /// Asks the owner of partition `ix` to say when it has a task, unless asked already.
    fn watch_remote(&mut self, ix: TubeIx, client: Client) {
        let Some(shards) = self.shards.as_mut() else {
            return;
        };
        let Some(part) = shards.part(ix) else { return };
        if !shards.watching.insert(ix) {
            return;
        }
        self.forward(
            part.set,
            client,
            Command::Watch { tube: ix },
            Then::Woke { ix },
        );
    }

    /// The oldest take still waiting on `head`'s tube (the others gone are dropped).
    fn oldest_waiter(&mut self, head: TubeIx) -> Option<(u64, Waiter)> {
        let shards = self.shards.as_mut()?;
        let queue = shards.queues.get_mut(&head)?;
        while let Some(&id) = queue.front() {
            match shards.waiters.get(&id) {
                Some(w)
                    if self
                        .conns
                        .get(w.client.idx)
                        .is_some_and(|c| c.gen == w.client.gen) =>
                {
                    return Some((id, *w));
                }
                _ => {
                    queue.pop_front();
                    shards.waiters.remove(&id);
                }
            }
        }
        None
    }

    /// Waiter `id` is answered (or gone): it stops waiting everywhere.
    fn end_wait(&mut self, id: u64) {
        let Some(w) = self.shards.as_mut().and_then(|s| s.waiters.remove(&id)) else {
            return;
        };
        if let Some(q) = self
            .shards
            .as_mut()
            .and_then(|s| s.queues.get_mut(&w.on.tube()))
        {
            q.retain(|&x| x != id);
        }
        if let Some(group) = w.local {
            self.core.unwatch(w.client.idx, group);
        }
    }

    /// A local watch of waiter `id` fired: a partition led here has a task.
    fn local_woke(&mut self, id: u64, digest: Digest) {
        let Some(w) = self
            .shards
            .as_ref()
            .and_then(|s| s.waiters.get(&id))
            .copied()
        else {
            return;
        };
        let Digest::Ready(ix) = digest else {
            // Refused (too many waiting takes on the connection): the take ends so.
            self.end_wait(id);
            let outcome = match digest {
                Digest::Error(e) => Outcome::Error(e),
                _ => Outcome::Nothing,
            };
            return self.answer(w.client, &outcome);
        };
        if let Some(x) = self.shards.as_mut().and_then(|s| s.waiters.get_mut(&id)) {
            x.local = None;
        }
        if self.core.queue().can_take(ix) {
            self.end_wait(id);
            let caller = Caller::new(w.client.idx, w.client.gen, w.client.sid);
            let cmd = Command::Take {
                on: on_ix(w.on, ix),
                timeout: Some(0),
            };
            self.execute_as(caller, w.client.reply, cmd);
        } else {
            // Taken by another first: watch again.
            let caller = Caller::new(w.client.idx, w.client.gen, w.client.sid);
            let (core, mut wire) = self.split();
            let group = core.watch_any(caller, ReplyTo::Router(WATCH | id), &[ix], &mut wire);
            if let Some(x) = self.shards.as_mut().and_then(|s| s.waiters.get_mut(&id)) {
                x.local = group;
            }
        }
    }

    /// The owner of partition `ix` says it has a task: the oldest waiter tries it.
    fn remote_woke(&mut self, ix: TubeIx, outcome: &Outcome<'_>) {
        let Some(shards) = self.shards.as_mut() else {
            return;
        };
        shards.watching.remove(&ix);
        let Some(head) = shards.part(ix).map(|p| p.head) else {
            return;
        };
        if !matches!(outcome, Outcome::Ready(_)) {
            // The link failed or the owner refused: the waiters' deadlines end them, and the
            // next waiter asks again.
            return;
        }
        let Some((id, w)) = self.oldest_waiter(head) else {
            return;
        };
        let Some(set) = self.shards.as_ref().and_then(|s| s.part(ix)).map(|p| p.set) else {
            return;
        };
        let cmd = Command::Take {
            on: on_ix(w.on, ix),
            timeout: Some(0),
        };
        self.forward(set, w.client, cmd, Then::WaitTake { waiter: id, ix });
    }

    /// A waiting take's try of partition `ix` was answered.
    fn wait_took(&mut self, id: u64, ix: TubeIx, client: Client, outcome: &Outcome<'_>) {
        let head = self
            .shards
            .as_ref()
            .and_then(|s| s.part(ix))
            .map(|p| p.head);
        let waiting = self
            .shards
            .as_ref()
            .is_some_and(|s| s.waiters.contains_key(&id));
        match outcome {
            // Taken by another first, or the owner unreachable now: the take waits on.
            Outcome::Nothing | Outcome::Error(_) => {}
            Outcome::Task(_) if !waiting => {
                // It timed out or its connection closed meanwhile: the task goes back.
                self.shards_session_ended(client.sid);
            }
            other => {
                self.end_wait(id);
                self.answer(client, other);
            }
        }
        // More waiters, or this one again: watch the partition again (answered at once if it
        // still has tasks).
        if let Some(head) = head {
            if let Some((_, w)) = self.oldest_waiter(head) {
                self.watch_remote(ix, w.client);
            }
        }
    }

    /// Ends the waiting takes whose deadline passed.
    pub(super) fn expire_waiters(&mut self) {
        let now = self.mono;
        loop {
            let Some(shards) = self.shards.as_mut() else {
                return;
            };
            match shards.deadlines.peek() {
                Some(Reverse((t, _))) if *t <= now => {}
                _ => break,
            }
            let Reverse((_, id)) = shards.deadlines.pop().expect("peeked");
            let Some(w) = shards.waiters.get(&id).copied() else {
                continue;
            };
            self.end_wait(id);
            self.answer(w.client, &Outcome::Nothing);
        }
        self.timers_changed();
    }

    fn timers_changed(&mut self) {
        let next = self.shards.as_ref().and_then(Shards::next_deadline);
        self.timers.set(super::timers::Timer::Shards, next);
    }

    fn gathered(&mut self, key: u64, head: Option<TubeIx>, digest: Digest) {
        let Some(shards) = self.shards.as_mut() else {
            return;
        };
        let Some(g) = shards.gathers.get_mut(&key) else {
            return;
        };
        match digest {
            Digest::Stats(s) => match head.and_then(|h| g.per.iter_mut().find(|p| p.1 == h)) {
                Some(p) => add_stats(&mut p.2, &s),
                None => add_stats(&mut g.stats, &s),
            },
            Digest::Count(n) => g.count += n,
            Digest::Error(e) => g.error = Some(e),
            _ => {}
        }
        g.left -= 1;
        if g.left > 0 {
            return;
        }
        let g = shards.gathers.remove(&key).expect("present above");
        let outcome = match (g.error, g.kind) {
            (Some(e), _) => Outcome::Error(e),
            (None, GatherKind::Stats) => Outcome::TubeStats(g.stats),
            (None, GatherKind::All) => {
                Outcome::AllStats(g.per.into_iter().map(|(n, _, s)| (n, s)).collect())
            }
            (None, GatherKind::Count) => Outcome::Count(g.count),
            (None, GatherKind::Ok) => Outcome::Ok,
        };
        self.answer(g.client, &outcome);
    }

    /// A link's socket is ready.
    pub(super) fn link_ready(&mut self, token: usize) {
        let set = token - LINK_TOKEN_BASE;
        let cred = self.cfg.auth.as_ref();
        let Some(link) = (self.shards.as_mut())
            .and_then(|s| s.sets.get_mut(set))
            .and_then(|s| s.link.as_mut())
        else {
            return;
        };
        if let Err(why) = link.read(cred) {
            return self.link_failed(set, &why);
        }
        // Answers are handled where they were read: their tasks borrow the buffer.
        let (id, input) = (link.id, link.take_input());
        let mut used = 0;
        loop {
            match out_link::next_answer(&input, &mut used) {
                Ok(Some((sync, answer))) => self.on_answer(sync, answer),
                Ok(None) => break,
                Err(why) => return self.link_failed(set, &why),
            }
        }
        let link = self.shards.as_mut().and_then(|s| s.sets[set].link.as_mut());
        if let Some(link) = link.filter(|l| l.id == id) {
            link.give_back(input, used);
        }
        self.flush_links();
    }

    /// Writes what the links have queued.
    pub(super) fn flush_links(&mut self) {
        let Some(shards) = self.shards.as_mut() else {
            return;
        };
        let mut failed = Vec::new();
        for (i, s) in shards.sets.iter_mut().enumerate() {
            if let Some(link) = &mut s.link {
                if let Err(why) = link.flush(self.poll.registry()) {
                    failed.push((i, why));
                }
            }
        }
        for (set, why) in failed {
            self.link_failed(set, &why);
        }
    }

    /// A link is gone: its calls in flight are answered with why.
    fn link_failed(&mut self, set: usize, why: &str) {
        let Some(shards) = self.shards.as_mut() else {
            return;
        };
        let name = shards.sets[set].name.clone();
        if let Some(mut link) = shards.sets[set].link.take() {
            link.close(self.poll.registry());
        }
        warn!(set = %name, why, "link to a replica set dropped");
        let syncs: Vec<u64> = (shards.pending.iter())
            .filter(|(_, p)| p.set == set)
            .map(|(s, _)| *s)
            .collect();
        for sync in syncs {
            let why = format!("the link to replica set {name} failed: {why}");
            self.on_answer(sync, Err(why));
        }
    }

    /// The answer to forwarded request `sync`.
    fn on_answer(&mut self, sync: u64, answer: Answered<'_>) {
        let Some(p) = self.shards.as_mut().and_then(|s| s.pending.remove(&sync)) else {
            return;
        };
        let outcome = match answer {
            Ok(bytes) => match wire::read_answer(bytes) {
                Ok(a) => a.outcome(),
                Err(e) => Outcome::Error(Refusal::Shards(e)),
            },
            Err(why) => Outcome::Error(Refusal::NoPrimary(why)),
        };
        match p.then {
            Then::Deliver => self.answer(p.client, &outcome),
            // A partition without a task, or unreachable now (its set failing over): the next.
            Then::Take { plan } => match outcome {
                Outcome::Nothing | Outcome::Error(Refusal::NoPrimary(_)) => {
                    self.take_next(p.client, plan)
                }
                other => self.answer(p.client, &other),
            },
            Then::Gather { key } => self.gathered(key, None, Digest::of(&outcome)),
            Then::GatherTube { key, head } => self.gathered(key, Some(head), Digest::of(&outcome)),
            Then::Woke { ix } => self.remote_woke(ix, &outcome),
            Then::WaitTake { waiter, ix } => self.wait_took(waiter, ix, p.client, &outcome),
            Then::Put { plan } => match outcome {
                Outcome::Full if !plan.left.is_empty() => self.put_next(p.client, plan),
                other => self.answer(p.client, &other),
            },
        }
    }

    /// Session `sid` of this node ended: the sets it reached release what it holds there.
    pub(super) fn shards_session_ended(&mut self, sid: SessionId) {
        let Some(shards) = self.shards.as_mut() else {
            return;
        };
        let Some(mask) = shards.forwarded.remove(&sid) else {
            return;
        };
        for (i, s) in shards.sets.iter_mut().enumerate() {
            if mask & (1 << i) != 0 {
                if let Some(link) = &mut s.link {
                    let sync = shards.next_sync;
                    shards.next_sync += 1;
                    link.send(sync, &Ask::End { session: sid });
                }
            }
        }
    }

    /// Connection `idx` asked to become a link (another node's `tarq.link`).
    pub(super) fn start_link(&mut self, idx: usize, sync: u64) {
        let out = &mut self.conns[idx].out.out;
        if self.shards.is_none() {
            let msg = "this tarq is no sharded cluster's node (--replica-set)";
            tarq_iproto::response::error(out, sync, super::ER_UNKNOWN, msg);
        } else {
            tarq_iproto::response::ok_empty(out, sync);
            self.conns[idx].proto = super::conn::Protocol::Link(Box::default());
        }
        super::mark_flush(&mut self.conns, &mut self.flush_list, idx);
    }

    /// A new engine session.
    pub(super) fn new_session(&mut self) -> SessionId {
        let sid = self.next_sid;
        self.next_sid += 1;
        sid
    }
}

/// `make(partition)` for the partition `id` names; `cmd` as it is for an id that names none
/// (the core answers it as it would anywhere).
fn by_id<'c>(
    id: u64,
    cmd: Command<'c>,
    make: impl FnOnce(TubeIx) -> Command<'c>,
) -> (TubeIx, Command<'c>) {
    match id_tube(id) {
        Some(ix) => (ix, make(ix)),
        None => (TubeIx::MAX, cmd),
    }
}

/// The partition a command names: its tube, or the one its id names.
fn named_partition(cmd: &Command<'_>) -> Option<TubeIx> {
    match *cmd {
        Command::Put { .. } => Some(0),
        Command::PutIn { tube, .. }
        | Command::Touch { tube, .. }
        | Command::Peek { tube, .. }
        | Command::Bury { tube, .. }
        | Command::Kick { tube, .. }
        | Command::Delete { tube, .. }
        | Command::ReleaseAll { tube }
        | Command::Truncate { tube }
        | Command::DropTube { tube }
        | Command::TubeStats { tube }
        | Command::KickAny { tube, .. }
        | Command::Watch { tube } => Some(tube),
        Command::Take { on, .. } => Some(on.tube()),
        Command::Ack { on, id } | Command::Release { on, id, .. } => match on {
            On::Seed => id_tube(id),
            On::Tube(t) => Some(t),
        },
        Command::TakeTask { id }
        | Command::BuryTaken { id, .. }
        | Command::TouchTtr { id }
        | Command::KickTask { id } => id_tube(id),
        _ => None,
    }
}

/// `on` aimed at partition `ix` (the seed API stays the seed's: its tube is `default`'s).
fn on_ix(on: On, ix: TubeIx) -> On {
    match on {
        On::Seed => On::Seed,
        On::Tube(_) => On::Tube(ix),
    }
}

fn resolve(addr: &str) -> Option<std::net::SocketAddr> {
    use std::net::ToSocketAddrs;
    addr.to_socket_addrs().ok()?.next()
}
