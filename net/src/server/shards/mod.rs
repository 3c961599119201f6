//! A sharded cluster's router ([`Router`]), at the loop's one dispatch (`Server::dispatch`): a
//! command for a partition another replica set owns — or this set owns while another node of
//! it leads — is forwarded to that set's primary over a link ([`out_link`]) and its answer
//! handed to the asking connection's front-end as if the core had given it; a command for a
//! partition this node leads runs here, rewritten to that partition's index. The front-ends
//! know nothing of this: they name a tube (its first partition's index, which every node
//! holds) and ids, and an id's high bits name its partition.
//!
//! The router owns its state (the placement as it reads it, the links, the calls in flight,
//! the waiting takes, the moves) and is handed the core and the wire for each call
//! ([`Ctx`], lent by `Server::with_router`); what only the loop can do it asks for as an
//! [`Effect`]. Where a decision is plain it is made apart from its effects ([`decide`],
//! [`move_machine`]) and tested alone.
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

mod cluster_page;
mod console;
mod ctx;
mod deadlines;
mod decide;
mod drop;
mod drop_hold;
mod gather;
mod held;
mod holds;
mod incoming;
mod links;
mod listing;
mod move_machine;
mod moving;
mod out_link;
mod route;
#[cfg(test)]
mod sim;
mod unknown;
mod users;
mod waiting;
mod waits;

pub(in crate::server) use ctx::{Ctx, Effect};
use decide::{Decision, Facts, Freshness, Kind};
use gather::{Gather, GatherKind};
use route::{PutPlan, TakePlan};
pub(in crate::server) use unknown::Kept;
use waits::Waiter;

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, VecDeque};
use std::hash::{BuildHasher, BuildHasherDefault, DefaultHasher};
use std::sync::Arc;
use std::time::Instant;

use tarq_cluster::{Placement, PlacementFence, SetView, TubePlacement};
use tarq_engine::{id_tube, Micros, SessionId, Stats, TubeIx, TubeOptions, TubePut, TubeType};
use tracing::{info, warn};

use super::host::Digest;
use crate::core::{Caller, Command, On, Outcome, Refusal};
use crate::frontend::link::wire::{self, Ask, Hello, LINK_VERSION};
use crate::frontend::ReplyTo;
use out_link::{Answered, OutLink, FIRST_CALL_SYNC};

/// How often what waits for etcd or a read of the placement looks at it again: a move whose
/// commit went unanswered, a copy's release etcd did not answer, a command held for a
/// placement read.
const RECHECK: Micros = 50_000;

/// Set `set`'s bit in a session's mask of the sets it reached: sets from the 64th on share
/// the last bit (their session ends are told to all of them; an owner that never saw the
/// session ignores it).
fn set_bit(set: usize) -> u64 {
    1 << set.min(63)
}

/// A replica set as the router knows it.
struct SetSlot {
    name: String,
    /// Its primary's address, while it has one, and its term.
    primary: Option<String>,
    term: Option<u64>,
    link: Option<OutLink>,
    /// How its link has been failing, for the log.
    trouble: links::Trouble,
}

use decide::STALE_VIEW;

/// This node's view of the placement, read once for a decision: when, and the epoch it
/// holds while it is trusted.
#[derive(Clone, Copy, Debug)]
struct View {
    now: Instant,
    epoch: Option<i64>,
}

/// Why a change to a partition this node's set owns may not run now.
#[derive(Debug)]
enum Hold {
    /// This node has read a placement it has not applied yet: the change waits for it.
    AwaitMap,
    /// It cannot be made now (a stale view, a partition moving or just moved): why.
    Refuse(String),
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

impl Client {
    /// The router's own asker (the console's figures, the cluster page's moves, the counts of
    /// waiting takes): no connection; its answers go to the router as `key`.
    fn router(sid: SessionId, key: u64) -> Client {
        Client {
            idx: console::CONSOLE_CLIENT,
            gen: 0,
            sid,
            reply: ReplyTo::Router(key),
        }
    }
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
    /// A peek across partitions: on `Nothing`, the next partitions.
    Peek {
        status: tarq_engine::Status,
        left: Vec<TubeIx>,
    },
    /// The `at`th set's moves, toward the cluster page's ask `key`.
    Moves {
        key: u64,
        at: usize,
    },
    /// The `at`th partition's tasks of listing `key`.
    List {
        key: u64,
        at: usize,
    },
    /// A step of move `id` this node runs, answered by the new owner.
    Move {
        id: u64,
    },
}

struct Pending {
    set: usize,
    client: Client,
    then: Then,
}

/// The router's bounds, from the config.
#[derive(Clone, Copy, Debug)]
pub(crate) struct RouterLimits {
    /// `--link-timeout`: the silence after which a link is taken for dead (µs; 0: never).
    pub link_timeout: Micros,
    /// `--max-routed-calls`: calls of each kind kept waiting at most (forwarded and not
    /// answered, held for a move or the map, takes waiting across partitions).
    pub max_calls: usize,
    /// Bytes a link may hold unsent: past them the other end is not reading, and no more
    /// calls are queued for it (four client frames).
    pub link_buffer: usize,
}

/// What the router holds now and what it refused, for the figures.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct RouterFigures {
    pub forwarded: u64,
    pub held: u64,
    pub waiting: u64,
    pub refused: u64,
}

/// The router's state.
pub(crate) struct Router {
    /// This node's replica set.
    set: String,
    /// This node's name (it names itself so on its links).
    me: Arc<str>,
    /// The cluster's name (a link names it, and its proof covers it).
    cluster: Arc<str>,
    sets: Vec<SetSlot>,
    /// By engine index: the partition placed there.
    parts: Vec<Option<Part>>,
    /// By first partition's index: the tube's partitions.
    tubes: HashMap<TubeIx, Routed>,
    placement: Arc<Placement>,
    fence: PlacementFence,
    /// How long a view of the placement is trusted (lease TTL less the safety margin).
    validity: std::time::Duration,
    /// Partitions that moved to this node's set: not served before these instants, when every
    /// view that showed the old owner has expired.
    held: HashMap<TubeIx, Instant>,
    pending: HashMap<u64, Pending>,
    /// When each of them is answered with "outcome unknown" if its owner has not answered.
    call_deadlines: deadlines::CallDeadlines,
    next_sync: u64,
    gathers: HashMap<u64, Gather>,
    next_gather: u64,
    /// Sessions of this node that forwarded calls, with the sets they reached (told when the
    /// session ends).
    forwarded: HashMap<SessionId, u64>,
    /// Tasks held across links: who took through which set, session ends owed to a set
    /// without a link, and closed links' sessions waiting out their grace.
    holds: holds::Holds,
    /// create_tube calls waiting for etcd, by token.
    creates: HashMap<u64, (Client, bool)>,
    /// User changes waiting for etcd, by token.
    user_changes: HashMap<u64, users::UserChange>,
    /// The seeding of the cluster's users this primary asked for, by token.
    seeding: Option<u64>,
    /// drop calls waiting for etcd, by token.
    drops: HashMap<u64, drop::Dropping>,
    next_token: u64,
    rr: usize,
    /// Takes waiting across partitions, by number, and by tube in arrival order.
    waiters: HashMap<u64, Waiter>,
    queues: HashMap<TubeIx, VecDeque<u64>>,
    /// How many of them wait on each tube, told to the tubes' owners.
    wait_counts: waiting::WaitCounts,
    next_waiter: u64,
    deadlines: BinaryHeap<Reverse<(Micros, u64)>>,
    /// Partitions led elsewhere that this node watches now, with the watch's sync.
    watching: HashMap<TubeIx, u64>,
    /// The move this node runs as a partition's owner, if any.
    moving: Option<moving::Move>,
    /// Partitions being copied here, by index, and copies whose claim in etcd is being
    /// released before they are let go.
    incoming: HashMap<TubeIx, incoming::Incoming>,
    /// Partitions handed over to this node's set by a move, with the placement epoch the move
    /// began at: served here before this node's view of the placement says so.
    adopted: HashMap<TubeIx, i64>,
    move_figures: moving::MoveFigures,
    /// `tarq.link` calls refused (not this cluster's, no proof of its key, another version).
    refused_links: u64,
    /// The router's bounds: `--link-timeout`, `--max-routed-calls`, the link buffer.
    limits: RouterLimits,
    /// Calls refused at those bounds since start.
    busy_refused: u64,
    /// When copies arriving here (a stall, a release to ask again) and commands waiting for a
    /// placement read are looked at again.
    recheck_at: Option<Micros>,
    /// Partitions whose tasks this node lets go of, a batch a turn, with the last id removed.
    letting_go: Vec<(TubeIx, Option<tarq_engine::TaskId>)>,
    /// When the next batch is let go of (monotonic µs; kept to `--move-rate`).
    let_go_at: Micros,
    /// Commands for a partition that wait until the placement this node has read is applied.
    awaiting_map: Vec<held::Held>,
    /// Partitions held here for a drop's fate, with the calls waiting for it.
    drop_holds: drop_hold::DropHolds,
    /// Calls naming a tube this node does not know, waiting for a read of the placement.
    reads: unknown::Reads,
    /// The console's figures of every partition, kept for a second.
    console: console::Console,
    /// Task listings waiting for their partitions' owners, by key (from `next_gather`).
    listings: HashMap<u64, listing::Listing>,
    /// Every set's primary's moves, for the cluster page, kept for a second.
    cluster_moves: cluster_page::ClusterMoves,
    /// What the loop is to do once the router's call returns.
    pub(in crate::server) effects: Vec<Effect>,
}

impl Router {
    /// `tarq.link` calls refused since start.
    pub(crate) fn refused_links(&self) -> u64 {
        self.refused_links
    }

    /// The calls the router holds now, and those it refused at its bounds since start.
    pub(crate) fn router_figures(&self) -> RouterFigures {
        let held = self.awaiting_map.len()
            + self.reads.held.len()
            + self.drop_holds.held.len()
            + self.moving.as_ref().map_or(0, |m| m.held_len());
        RouterFigures {
            forwarded: self.pending.len() as u64,
            held: held as u64,
            waiting: self.waiters.len() as u64,
            refused: self.busy_refused,
        }
    }

    /// Why one more call may not wait in a queue of `len` (`what` it holds), if it may not;
    /// counted.
    fn over_bound(&mut self, len: usize, what: &str) -> Option<String> {
        let max = self.limits.max_calls;
        (len >= max).then(|| {
            self.busy_refused += 1;
            format!(
                "busy: this node holds {len} {what} already (--max-routed-calls {max}); \
                 nothing was done"
            )
        })
    }

    pub fn new(
        set: String,
        me: Arc<str>,
        cluster: Arc<str>,
        fence: PlacementFence,
        validity: std::time::Duration,
        limits: RouterLimits,
    ) -> Router {
        Router {
            set,
            me,
            cluster,
            limits,
            busy_refused: 0,
            validity,
            held: HashMap::new(),
            sets: Vec::new(),
            parts: Vec::new(),
            tubes: HashMap::new(),
            placement: Arc::default(),
            fence,
            pending: HashMap::new(),
            call_deadlines: deadlines::CallDeadlines::default(),
            next_sync: FIRST_CALL_SYNC,
            gathers: HashMap::new(),
            next_gather: 0,
            forwarded: HashMap::new(),
            holds: holds::Holds::default(),
            creates: HashMap::new(),
            user_changes: HashMap::new(),
            seeding: None,
            drops: HashMap::new(),
            next_token: 0,
            rr: 0,
            waiters: HashMap::new(),
            queues: HashMap::new(),
            wait_counts: waiting::WaitCounts::default(),
            next_waiter: 0,
            deadlines: BinaryHeap::new(),
            watching: HashMap::new(),
            moving: None,
            incoming: HashMap::new(),
            adopted: HashMap::new(),
            refused_links: 0,
            move_figures: moving::MoveFigures::default(),
            recheck_at: None,
            letting_go: Vec::new(),
            let_go_at: 0,
            awaiting_map: Vec::new(),
            drop_holds: drop_hold::DropHolds::default(),
            reads: unknown::Reads::default(),
            console: console::Console::default(),
            listings: HashMap::new(),
            cluster_moves: cluster_page::ClusterMoves::default(),
            effects: Vec::new(),
        }
    }

    fn slot_of(&mut self, name: &str) -> usize {
        if let Some(i) = self.sets.iter().position(|s| s.name == name) {
            return i;
        }
        self.sets.push(SetSlot {
            name: name.to_owned(),
            primary: None,
            term: None,
            link: None,
            trouble: links::Trouble::default(),
        });
        self.sets.len() - 1
    }

    /// Takes in a map read from etcd. Returns the sets whose primary changed while a link
    /// went to the old one (it no longer takes changes: the caller drops those links), and
    /// the indexes placed until now and no longer (their tube was dropped: the caller lets
    /// them go). A set the map no longer lists (its every member's lease ran out) has no
    /// primary.
    fn apply(&mut self, placement: Arc<Placement>, sets: &[SetView]) -> (Vec<usize>, Vec<TubeIx>) {
        let mut moved = Vec::new();
        let mut listed = vec![false; self.sets.len()];
        for s in sets {
            let slot = self.slot_of(&s.name);
            listed.resize(self.sets.len(), false);
            listed[slot] = true;
            let primary = s.leader.as_ref().map(|(l, _)| l.addr.clone());
            self.sets[slot].term = s.leader.as_ref().map(|(_, term)| *term);
            if self.sets[slot].primary != primary {
                self.sets[slot].primary = primary;
                if self.sets[slot].link.is_some() {
                    moved.push(slot);
                }
            }
        }
        for (slot, _) in listed.iter().enumerate().filter(|(_, &l)| !l) {
            self.sets[slot].term = None;
            if self.sets[slot].primary.take().is_some() && self.sets[slot].link.is_some() {
                moved.push(slot);
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
            // A move handed it over (or is handing it: the commit read before the word of
            // it): its old owner froze it before the commit and lets go after.
            let handed = self.adopted.contains_key(&(ix as TubeIx))
                || self.incoming.contains_key(&(ix as TubeIx));
            if let (Some(p), Some(was)) = (p, was) {
                if Some(p.set) == mine && was != p.set && !handed {
                    self.held.insert(ix as TubeIx, now + self.validity);
                }
            }
        }
        // A view newer than the move's: the placement says who owns it now.
        self.adopted
            .retain(|_, &mut epoch| placement.epoch <= epoch);
        let vanished = (before.iter().enumerate())
            .filter(|&(ix, was)| was.is_some() && self.parts.get(ix).copied().flatten().is_none())
            .map(|(ix, _)| ix as TubeIx)
            .collect();
        self.placement = placement;
        (moved, vanished)
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

    /// The earliest deadline of a waiting take, of a move's look at the placement, of a
    /// link's liveness, of a closed link's sessions' grace, or of a forwarded call.
    pub fn next_deadline(&self) -> Option<Micros> {
        let let_go = (!self.letting_go.is_empty()).then_some(self.let_go_at);
        let wait = self.deadlines.peek().map(|Reverse((t, _))| *t);
        let links = (self.sets.iter())
            .filter_map(|s| s.link.as_ref()?.next_check(self.limits.link_timeout))
            .min();
        let orphans = self.holds.next_deadline();
        let listings = self.listings.values().map(|l| l.deadline).min();
        [
            wait,
            self.move_check_at(),
            self.recheck_at,
            let_go,
            links,
            orphans,
            listings,
            self.call_deadlines.next(),
            self.drop_holds.next_deadline(),
            self.wait_counts.next_retry(),
        ]
        .into_iter()
        .flatten()
        .min()
    }

    /// Where a take over the watched `tubes` (their first partitions' indexes) can look: the
    /// partitions served here now, those other sets own, and whether the take is this node's
    /// alone (every tube is one partition served here, or a tube of this node's own when it
    /// leads). A tube not routed yet on a replica, or a partition held (moving, or a stale
    /// view), makes it not alone: the take waits or goes round.
    fn watched_partitions(
        &self,
        tubes: &[TubeIx],
        leads: bool,
    ) -> (Vec<TubeIx>, Vec<TubeIx>, bool) {
        let (mut here, mut there) = (Vec::new(), Vec::new());
        let mut own = true;
        let v = self.view();
        for &t in tubes {
            let Some(routed) = self.tubes.get(&t) else {
                if leads {
                    here.push(t); // a tube of this node's own
                } else {
                    // Replicated here before this node applied the placement that has it:
                    // the take waits, and watches the tube's owners once the map is applied.
                    own = false;
                }
                continue;
            };
            for &p in &routed.parts {
                if !self.here(p, leads) {
                    there.push(p);
                    own = false;
                } else if self.hold_in(v, p).is_none() {
                    here.push(p);
                    own &= p == t;
                } else {
                    own = false;
                }
            }
        }
        (here, there, own)
    }

    /// Why a call to `set` is refused before it is sent (nothing was done): too many calls
    /// forwarded and not answered, or a link holding `link_buffer` bytes its other end has
    /// not read.
    fn busy(&mut self, set: usize) -> Option<String> {
        if let Some(why) = self.over_bound(self.pending.len(), "calls forwarded and not answered") {
            return Some(why);
        }
        let unsent = (self.sets[set].link.as_ref()).map_or(0, OutLink::unsent_bytes);
        if unsent < self.limits.link_buffer {
            return None;
        }
        self.busy_refused += 1;
        Some(format!(
            "busy: the link to replica set {} holds {unsent} bytes unsent (its other end is not \
             reading); nothing was done",
            self.sets[set].name
        ))
    }

    /// Looks again at copies and waiting commands by `at` at the latest.
    fn recheck_by(&mut self, at: Micros) {
        self.recheck_at = Some(self.recheck_at.map_or(at, |r| r.min(at)));
    }

    fn part(&self, ix: TubeIx) -> Option<Part> {
        self.parts.get(ix as usize).copied().flatten()
    }

    /// Whether this node's routes may be acted on now: its view of the placement is recent
    /// enough, and the routes are the view's own. The election thread reads a new map before
    /// the loop applies it; until then the fence's epoch is not the routes', and the routes may
    /// name an owner the placement no longer does.
    fn view(&self) -> View {
        let now = Instant::now();
        View {
            now,
            epoch: self.fence.valid_at(now),
        }
    }

    /// Whether this node has read a placement it has not applied yet (a moment's gap between
    /// the election thread's read and the loop's turn): its routes may name an old owner, so
    /// a change waits for it rather than being refused.
    pub(super) fn map_pending(&self) -> bool {
        self.view()
            .epoch
            .is_some_and(|epoch| epoch != self.placement.epoch)
    }

    /// Why this node may not change partition `ix` now though its set owns it: its view of
    /// the placement may be stale, or the partition has just moved here.
    fn hold(&self, ix: TubeIx) -> Option<Hold> {
        self.hold_in(self.view(), ix)
    }

    /// [`hold`](Self::hold) in view `v` (read once for a decision over several partitions).
    fn hold_in(&self, v: View, ix: TubeIx) -> Option<Hold> {
        let f = self.facts(v, ix, true)?;
        if f.frozen && self.drop_holds.holds(ix) {
            let why = format!("partition at index {ix} is held for its tube's drop");
            return Some(Hold::Refuse(why));
        }
        if f.frozen {
            let why = format!("partition at index {ix} is moving to another replica set");
            return Some(Hold::Refuse(why));
        }
        match decide::change_here(&f, &self.set) {
            Decision::AwaitMap => Some(Hold::AwaitMap),
            Decision::Refuse(why) => Some(Hold::Refuse(why)),
            _ => None,
        }
    }

    /// What this node knows of partition `ix` in view `v`, for a decision (`None`: not a
    /// placed partition — a tube of this node's own, or no such index).
    fn facts(&self, v: View, ix: TubeIx, leads: bool) -> Option<Facts> {
        let part = self.part(ix)?;
        let adopted = !self.adopted.is_empty() && self.adopted.contains_key(&ix);
        let view = match v.epoch {
            None => Freshness::Stale,
            Some(epoch) if epoch != self.placement.epoch => Freshness::Pending,
            Some(_) => Freshness::Current,
        };
        let moved_in = (self.held.get(&ix))
            .filter(|until| v.now < **until)
            .map(|until| until.saturating_duration_since(v.now));
        Some(Facts {
            mine: self.sets[part.set].name == self.set || adopted,
            owner: part.set,
            leads,
            frozen: self.frozen(ix),
            view,
            moved_in,
            index: ix,
        })
    }

    /// Where a command another node forwarded runs ([`decide::for_link`]); `Local` for one
    /// that names no placed partition.
    fn forwarded_decision(&self, cmd: &Command<'_>) -> Decision {
        let Some(f) = named_partition(cmd).and_then(|ix| self.facts(self.view(), ix, true)) else {
            return Decision::Local;
        };
        let kind = Kind {
            changes: cmd.changes(),
            reads_only: cmd.reads_only(),
        };
        decide::for_link(&f, kind, &self.set)
    }

    /// The partition of tube `head` (not a utube, not a capped limfifottl) a put goes to, in
    /// turn: one this node leads and may serve now (no hop); else one whose set has a primary
    /// now (a set failing over would refuse every put sent to it); else any (refused there,
    /// saying why). `None`: the routes lack the tube.
    fn put_partition(&mut self, head: TubeIx, leads: bool) -> Option<TubeIx> {
        let parts = &self.tubes.get(&head)?.parts;
        let v = self.view();
        let here = |p: &&TubeIx| self.here(**p, leads) && self.hold_in(v, **p).is_none();
        let led =
            |p: &&TubeIx| (self.part(**p)).is_some_and(|pt| self.sets[pt.set].primary.is_some());
        let rr = self.rr;
        let local = parts.iter().filter(here).count();
        let healthy = parts.iter().filter(led).count();
        let ix = match (local, healthy) {
            (0, 0) => parts[rr % parts.len()],
            (0, _) => *parts.iter().filter(led).nth(rr % healthy).expect("counted"),
            _ => *parts.iter().filter(here).nth(rr % local).expect("counted"),
        };
        self.rr = rr.wrapping_add(1);
        Some(ix)
    }

    /// The name of the placed tube partition `ix` is of.
    pub(in crate::server) fn tube_name_of(&self, ix: TubeIx) -> Option<&str> {
        let head = self.part(ix)?.head;
        self.tubes.get(&head).map(|t| t.name.as_str())
    }

    /// Whether task `id` may be of tube `head` (its first partition's index): its id names
    /// one of the tube's partitions.
    fn of_tube(&self, id: tarq_engine::TaskId, head: TubeIx) -> bool {
        id_tube(id).is_some_and(|ix| ix == head || self.part(ix).is_some_and(|p| p.head == head))
    }

    /// Whether partition `ix`, held in this node's core, is served by it (a node that leads
    /// its set): a tube of this node's own (not placed), or a partition this set owns.
    pub(in crate::server) fn serves_here(&self, ix: TubeIx) -> bool {
        self.part(ix).is_none() || self.here(ix, true)
    }

    /// Whether this node serves partition `ix` itself: its set owns it (or a move handed it
    /// over) and it leads the set.
    fn here(&self, ix: TubeIx, leads: bool) -> bool {
        leads
            && (self
                .part(ix)
                .is_some_and(|p| self.sets[p.set].name == self.set)
                || (!self.adopted.is_empty() && self.adopted.contains_key(&ix)))
    }

    /// Who counts the takes waiting on tube `head` (`waiting`): the owner of its first
    /// partition; this node for a tube of its own that is not placed.
    fn counter_of(&self, head: TubeIx, leads: bool) -> waiting::Owner {
        match self.part(head) {
            Some(_) if self.here(head, leads) => waiting::Owner::Here,
            Some(p) => waiting::Owner::Set(p.set),
            None if leads => waiting::Owner::Here,
            None => waiting::Owner::Unknown,
        }
    }
}

/// A tube's options as a placement keeps them: the engine's own, as JSON (times in
/// microseconds).
pub(crate) fn options_json(o: &TubeOptions) -> serde_json::Value {
    serde_json::to_value(o).expect("tube options always encode")
}

/// Partition `part`'s options from its tube's as placed (a field the placement lacks is its
/// default; options that do not read as a tube's are the defaults, logged).
fn options_from(v: &serde_json::Value, part: u16) -> TubeOptions {
    let opts = serde_json::from_value(v.clone()).unwrap_or_else(|e| {
        warn!(error = %e, "placed tube options that do not read; the defaults instead");
        TubeOptions::default()
    });
    TubeOptions {
        on_demand: false,
        part,
        ..opts
    }
}

impl Router {
    /// Takes in a new map (etcd's `MapChanged`): the routes, and — on a primary — the tubes
    /// this node must hold.
    pub(super) fn shards_map_changed(
        &mut self,
        cx: &mut Ctx<'_>,
        placement: Arc<Placement>,
        sets: &[SetView],
    ) {
        let (moved, vanished) = self.apply(Arc::clone(&placement), sets);
        for set in moved {
            self.link_failed(cx, set, "its replica set has another primary now");
        }
        self.let_go(cx, &vanished);
        // A drop committed: the calls its checks held are answered, the tube gone.
        self.end_drop_holds_of(cx, &vanished);
        info!(
            epoch = placement.epoch,
            tubes = placement.tubes.len(),
            "placement applied"
        );
        for t in placement.tubes.values() {
            self.hold_tube(cx, t);
        }
        self.let_go_strays(cx);
        self.tick_move(cx);
        self.watch_again(cx);
        self.release_awaiting_map(cx);
    }

    /// On a primary, holds what of tube `t` this node must: every tube's first partition (so
    /// its name resolves on every node) and the partitions its set owns.
    fn hold_tube(&mut self, cx: &mut Ctx<'_>, t: &TubePlacement) {
        if !cx.leads() {
            return;
        }
        let me = self.set.clone();
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
            if let Err(e) = cx
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
        cx: &mut Ctx<'_>,
        token: u64,
        result: Result<tarq_cluster::TubePlacement, tarq_cluster::PlacementError>,
    ) {
        if self.move_commit_done(cx, token, &result) || self.copy_etcd_done(cx, token, &result) {
            return;
        }
        if let Some(d) = self.drops.remove(&token) {
            return self.drop_done(cx, d, result);
        }
        let Some((client, if_not_exists)) = self.creates.remove(&token) else {
            return;
        };
        // Made by another node meanwhile, and this call lets it be: the tube as placed.
        let result = match result {
            Err(tarq_cluster::PlacementError::Exists(t)) if if_not_exists => Ok(*t),
            other => other,
        };
        if let Ok(t) = &result {
            self.add_tube(t);
            self.hold_tube(cx, t);
        }
        let outcome = match result {
            Ok(t) => match self
                .placed_tube(cx.core.queue(), &t.name)
                .or_else(|| unknown::PlacedTube::of(&t))
            {
                Some(info) => {
                    self.answer_tube(cx, client, info);
                    return;
                }
                None => Outcome::Error(Refusal::Shards(format!(
                    "tube {} is placed without partitions, or of a type this node does not know",
                    t.name
                ))),
            },
            Err(tarq_cluster::PlacementError::Exists(t)) => {
                let e = tarq_engine::QueueError::TubeExists(t.name.clone());
                Outcome::Error(Refusal::Queue(e))
            }
            Err(e) => Outcome::Error(Refusal::Shards(e.to_string())),
        };
        self.answer(cx, client, &outcome);
    }

    fn answer(&mut self, cx: &mut Ctx<'_>, c: Client, outcome: &Outcome<'_>) {
        if c.idx == console::CONSOLE_CLIENT {
            return self.console_refused(cx, c);
        }
        if cx.wire.conns.get(c.idx).is_some_and(|x| x.gen == c.gen) {
            cx.deliver(c.idx, c.reply, outcome);
            // An HTTP request that asked to close, answered by another node.
            if cx.wire.conns[c.idx]
                .http()
                .is_some_and(|h| h.close_when_answered)
            {
                let reason = "HTTP request asked to close";
                self.effects.push(Effect::Close {
                    idx: c.idx,
                    gen: c.gen,
                    reason,
                });
            }
        }
    }

    /// Connection `idx` asked to become a link (`hello`: the calling node's `tarq.link`).
    /// Only a node of this cluster, speaking this link protocol and proving the cluster's link
    /// key over this connection's greeting salt, gets one; anyone else is refused with why.
    pub(super) fn start_link(
        &mut self,
        cx: &mut Ctx<'_>,
        idx: usize,
        sync: u64,
        hello: &Hello<'_>,
    ) {
        match self.link_refusal(cx, idx, hello) {
            Some((code, why)) => {
                let out = &mut cx.wire.conns[idx].out.out;
                tarq_iproto::response::error(out, sync, code, &why);
                self.refused_links += 1;
                warn!(origin = hello.origin, %why, "a link was refused");
            }
            None => {
                tarq_iproto::response::ok_empty(&mut cx.wire.conns[idx].out.out, sync);
                let origin: Arc<str> = Arc::from(hello.origin);
                cx.link_sessions.opened(&origin);
                let link = crate::frontend::link::LinkConn { origin };
                cx.wire.conns[idx].proto = super::conn::Protocol::Link(Box::new(link));
            }
        }
        cx.wire.conns.mark_flush(idx);
    }

    /// Why connection `idx` may not become the link `hello` asks for (an IPROTO error code and
    /// the message), or `None`.
    fn link_refusal(
        &self,
        cx: &mut Ctx<'_>,
        idx: usize,
        hello: &Hello<'_>,
    ) -> Option<(u32, String)> {
        use tarq_iproto::codes::ER_ACCESS_DENIED;
        if let Some(why) = cx.node_refusal(idx) {
            return Some((tarq_iproto::codes::ER_ACCESS_DENIED, why));
        }
        let (mine, theirs) = (LINK_VERSION, hello.version);
        if theirs != mine {
            let (older, newer) = if theirs < mine {
                (hello.origin, &*self.me)
            } else {
                (&*self.me, hello.origin)
            };
            let why = format!(
                "link protocol version {theirs} from node {}, this node {} speaks {mine}: \
                 upgrade node {older} to the release node {newer} runs",
                hello.origin, self.me
            );
            return Some((super::ER_UNKNOWN, why));
        }
        let denied = |why: String| Some((ER_ACCESS_DENIED, why));
        if hello.cluster != &*self.cluster {
            return denied(format!(
                "a link of cluster {:?} refused: this node is of cluster {:?}",
                hello.cluster, self.cluster
            ));
        }
        let key = cx.cluster().and_then(|c| c.handle().link_key());
        let Some(key) = key else {
            return denied(
                "this node has not read the cluster's link key from etcd yet; the link can be \
                 opened again once it has"
                    .into(),
            );
        };
        let salt = cx.wire.conns[idx].salt();
        if !wire::proof_matches(&key, &salt, hello.cluster, hello) {
            return denied(format!(
                "tarq.link is for the nodes of cluster {} only: the caller did not prove the \
                 cluster's link key",
                self.cluster
            ));
        }
        None
    }

    /// Routes a front-end's command of connection `idx` and runs what is left of it here (a
    /// command held for a move or the map, a take reparked after a move, a call after a read
    /// of the placement). A put's rate was charged when it first came.
    pub(in crate::server) fn dispatch(
        &mut self,
        cx: &mut Ctx<'_>,
        idx: usize,
        reply: ReplyTo,
        cmd: Command<'_>,
    ) {
        let Some(cmd) = self.route(cx, idx, reply, cmd) else {
            return;
        };
        let caller = cx.wire.conns.caller(idx);
        self.execute_as(cx, caller, reply, cmd);
    }

    /// Runs `cmd` in the core for `caller` (a sharded node's commands, forwarded ones, the
    /// router's own), then takes what the core answered to the router. The one call of
    /// `Core::execute` beside the loop's dispatch, so that one stays inlined.
    #[inline(never)]
    pub(super) fn execute_as(
        &mut self,
        cx: &mut Ctx<'_>,
        caller: Caller,
        reply: ReplyTo,
        cmd: Command<'_>,
    ) {
        let (core, wire) = cx.split();
        core.execute(caller, reply, &cmd, wire);
        if !cx.wire.routed.is_empty() {
            self.take_routed(cx);
        }
    }

    /// Releases every task session `sid` holds here, and tells the sets it reached.
    pub(super) fn release_session(&mut self, cx: &mut Ctx<'_>, sid: SessionId) -> usize {
        if cx.cfg.null {
            return 0;
        }
        self.shards_session_ended(cx, sid);
        let leads = cx.leads();
        let (core, wire) = cx.split();
        core.release_session(sid, leads, wire)
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
        | Command::DropCheck { tube }
        | Command::TubeStats { tube }
        | Command::KickAny { tube, .. }
        | Command::PeekFirst { tube, .. }
        | Command::TubeFigures { tube }
        | Command::ListTasks { tube, .. }
        | Command::Watch { tube } => Some(tube),
        Command::Take { on, .. } => Some(on.tube()),
        Command::Ack { on, id } | Command::Release { on, id, .. } => match on {
            On::Seed => id_tube(id),
            On::Tube(t) => Some(t),
        },
        Command::TakeTask { id }
        | Command::BuryTaken { id, .. }
        | Command::TouchTtr { id }
        | Command::KickTask { id }
        | Command::DeleteJob { id }
        | Command::TaskFigures { id } => id_tube(id),
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
