//! A deterministic simulation of partition moves under faults, in the manner of TigerBeetle's
//! VOPR and FoundationDB's simulator: one seed drives everything — clients changing the
//! partition through any node, a link between the old and the new owner that delays and
//! breaks, an etcd that delays, loses requests and loses answers to requests it applied, and
//! time. Every node — the two owners and up to three others, whose clients' calls they route
//! — has its own view of the placement, read from etcd every 250 ms (reads are lost and
//! arrive late, so views are stale and out of order), and decides where a call runs with the
//! router's own decision ([`decide`](super::decide): a client's call, then a forwarded one,
//! relayed at most once), over the facts the node has: its view, its move's freeze, a
//! partition just moved in. The old
//! owner's side is the real [`MoveMachine`], executed here as `moving.rs` executes it on the
//! real core (pages in id order, the changes followed since the move began); the new owner's
//! side and etcd are models of `incoming.rs` and `tarq_cluster::moves` (a claim per
//! partition naming the move; a commit that needs the claim, the owning set and its term;
//! a release that needs the claim and that the partition is not the new owner's).
//!
//! After every event: the partition is served (changes taken) by one set at a time, and a
//! change runs only where the partition is served (a node whose decision runs it elsewhere
//! would acknowledge a change and lose it). When etcd
//! applies a commit: the new owner's durable copy is exactly the old owner's partition (else an
//! acknowledged change would be lost). Once faults stop and the system settles: the move has
//! ended, etcd's owner serves exactly what clients were told was done, and the other side
//! holds nothing.
//!
//! `cargo test -p tarq-net --lib sim` runs [`SEEDS`] seeds and the regression list;
//! `TARQ_SIM_SEED=N cargo test -p tarq-net --lib sim -- --nocapture` replays seed N with
//! its trace. A longer search, beyond what CI tries:
//! `TARQ_SIM_SEEDS=20000..2000000 cargo test --release -p tarq-net --lib sim` (a range,
//! `FROM..TO`, TO excluded; a range of under [`MIN_SEEDS_FOR_SHARES`] seeds is held to the
//! promises only, not to the shares of what its seeds went through).

use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet, BinaryHeap};

use tarq_engine::Micros;

use std::time::Duration;

use super::decide::{self, Decision, Facts, Freshness, Kind};
use super::move_machine::{Fate, Input, MoveMachine, Output, Phase};

/// Seeds a CI run tries (a few seconds).
const SEEDS: u64 = 20_000;
/// Events a seed may take: past them it runs away (a deadline that wakes and changes nothing
/// wakes for ever — found so: a paced copy's deadline in the past).
const MAX_EVENTS: u64 = 20_000;
/// Seeds a run needs before its shares of what the seeds went through are checked.
const MIN_SEEDS_FOR_SHARES: usize = 1_000;
/// Seeds that found bugs, run every time, whatever range a run tries (`TARQ_SIM_SEEDS`), with
/// the bug each found:
/// - 3 and 6: a paced copy's deadline already past (the machine's `next_deadline` named a
///   page's send time after the page had gone), so the loop woke every turn for ever: the
///   seed runs away (f442f02; 5,606 of the first 20,000 seeds find it with the old guard).
const REGRESSIONS: &[u64] = &[3, 6];
/// Tasks a simulated page carries at most (small, so moves take many pages).
const PAGE: usize = 3;
/// Faults and client changes stop here (µs); then the system settles.
const CALM_AT: Micros = 2_000_000;
/// Client changes come mostly before this (µs): while the move runs.
const BUSY: Micros = 300_000;
/// The simulation gives up on settling here.
const END_AT: Micros = 60_000_000;
/// How often each node reads the placement, and how long a view read is trusted for a change
/// (`--placement` poll; the lease less its margin).
const POLL: Micros = 250_000;
const VALID: Micros = 1_000_000;
/// Nodes stop reading the placement here (the seed has settled long before).
const POLL_UNTIL: Micros = CALM_AT + 5_000_000;

/// SplitMix64: a seed's whole stream of choices.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }

    /// True one time in `n`.
    fn one_in(&mut self, n: u64) -> bool {
        self.below(n) == 0
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Set {
    Old,
    New,
}

impl Set {
    /// Its slot in the decisions' `owner`.
    fn slot(self) -> usize {
        match self {
            Set::Old => 0,
            Set::New => 1,
        }
    }
}

/// A node a client's call may reach: the primaries of the old and the new set, or another
/// node (of a third set), which routes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Node {
    Old,
    New,
    Router(usize),
}

impl Node {
    fn index(self) -> usize {
        match self {
            Node::Old => 0,
            Node::New => 1,
            Node::Router(r) => 2 + r,
        }
    }

    fn of(index: usize) -> Node {
        match index {
            0 => Node::Old,
            1 => Node::New,
            r => Node::Router(r - 2),
        }
    }
}

/// A node's view of the placement: the partition's owner as of which commit, read when.
#[derive(Clone, Copy, Debug)]
struct View {
    owner: Set,
    epoch: u64,
    read_at: Micros,
}

/// A page's item: a task as it is now (its version), or gone.
type Item = (u64, Option<u64>);

/// What the old owner sends the new one over the link.
#[derive(Clone, Debug)]
enum ToNew {
    MoveIn,
    Page(Vec<Item>),
    Done { committed: bool },
}

/// What the new owner answers.
#[derive(Clone, Debug)]
enum ToOld {
    Accepted,
    Refused,
    PageDurable,
}

#[derive(Clone, Debug)]
enum EtcdAsk {
    /// The new owner claims the partition's copy for the move.
    Claim,
    /// The old owner's commit, with its term.
    Commit { term: u64 },
    /// The old owner withdraws the claim (a lost commit's fate, or tidiness after giving up).
    Withdraw,
    /// The new owner releases its claim before it drops its copy.
    Release,
}

#[derive(Clone, Debug)]
enum Event {
    /// A client changes the partition through a node it picks.
    Client,
    /// A call at `node`: from its client (`hop` 0), forwarded (1) or relayed (2).
    Call {
        node: Node,
        hop: u8,
    },
    /// Node `node` reads the placement.
    Poll {
        node: usize,
    },
    /// What etcd answered its read: the owner at `epoch`, asked at `sent`.
    Read {
        node: usize,
        owner: Set,
        epoch: u64,
        sent: Micros,
    },
    ToNew {
        link: u64,
        msg: ToNew,
    },
    ToOld {
        link: u64,
        msg: ToOld,
    },
    LinkBreaks,
    /// etcd applies a request (or loses it); `tell` says whether its answer arrives.
    Etcd {
        from: Set,
        ask: EtcdAsk,
        token: u64,
        applied: bool,
        tell: bool,
    },
    /// An etcd answer, or its loss noticed (`None`).
    EtcdAnswer {
        to: Set,
        ask: EtcdAsk,
        token: u64,
        owner: Option<Result<Set, String>>,
    },
    Tick,
}

/// etcd's part of the partition: its owner, the move's claim, the old set's term.
struct Etcd {
    owner: Set,
    claimed: bool,
    term: u64,
    /// Raised by each commit (the placement's epoch).
    epoch: u64,
}

struct Old {
    machine: MoveMachine,
    tasks: BTreeMap<u64, u64>,
    next_id: u64,
    /// Changed since the move began (the core's follow), and the phase's list to resend.
    changed: BTreeSet<u64>,
    resend: Vec<u64>,
    bulk_after: u64,
    bulk_end: u64,
    frozen: bool,
    /// Serves the partition (false once handed over).
    serving: bool,
    ended: bool,
}

struct New {
    copy: Option<BTreeMap<u64, u64>>,
    serving: bool,
    /// It serves changes from here on: every view showing the old owner has expired.
    held_until: Micros,
    /// Its claim's release is under way.
    releasing: bool,
}

struct Sim {
    rng: Rng,
    now: Micros,
    /// The last delivery time on the link each way: a link is a TCP connection, in order.
    to_new_at: Micros,
    to_old_at: Micros,
    /// A deliberate bug, to show the checks catch one: the executor drops a page's items.
    lose_a_page: bool,
    /// Another: the old owner does not take the committed placement in when it hands over,
    /// and routes by its old view until its next read.
    forget_hand_over: bool,
    /// What the seed went through, for the run's figures.
    seen: Seen,
    seq: u64,
    queue: BinaryHeap<Reverse<(Micros, u64)>>,
    events: BTreeMap<u64, Event>,
    link: u64,
    etcd: Etcd,
    old: Old,
    new: New,
    /// Each node's view of the placement, by [`Node::index`].
    views: Vec<View>,
    /// What clients were told was done: the partition as it must be.
    truth: BTreeMap<u64, u64>,
    next_token: u64,
    trace: Vec<String>,
    tracing: bool,
}

impl Sim {
    fn new(seed: u64, tracing: bool) -> Sim {
        Sim::with_bug(seed, tracing, Bug::None)
    }

    fn with_bug(seed: u64, tracing: bool, bug: Bug) -> Sim {
        let mut rng = Rng(seed);
        let n = rng.below(20);
        let tasks: BTreeMap<u64, u64> = (0..n).map(|id| (id, 0)).collect();
        let rate = if rng.one_in(2) {
            0
        } else {
            1000 + rng.below(20_000)
        };
        let mut sim = Sim {
            rng,
            now: 0,
            to_new_at: 0,
            to_old_at: 0,
            lose_a_page: bug == Bug::LoseAPage,
            forget_hand_over: bug == Bug::ForgetHandOver,
            seen: Seen::default(),
            seq: 0,
            queue: BinaryHeap::new(),
            events: BTreeMap::new(),
            link: 0,
            etcd: Etcd {
                owner: Set::Old,
                claimed: false,
                term: 1,
                epoch: 1,
            },
            old: Old {
                machine: MoveMachine::new(rate, 0),
                tasks: tasks.clone(),
                next_id: n,
                changed: BTreeSet::new(),
                resend: Vec::new(),
                bulk_after: 0,
                bulk_end: n,
                frozen: false,
                serving: true,
                ended: false,
            },
            new: New {
                copy: None,
                serving: false,
                held_until: 0,
                releasing: false,
            },
            views: Vec::new(),
            truth: tasks,
            next_token: 1,
            trace: Vec::new(),
            tracing,
        };
        sim.start();
        sim
    }

    /// The seed's first events: each node's reads of the placement, the move's first step,
    /// the clients' changes (most while the move runs, its first few hundred ms, some after)
    /// and perhaps a broken link.
    fn start(&mut self) {
        let routers = self.rng.below(4) as usize;
        let view = View {
            owner: Set::Old,
            epoch: 1,
            read_at: 0,
        };
        self.views = vec![view; 2 + routers];
        for node in 0..self.views.len() {
            let at = self.rng.below(POLL);
            self.at(at, Event::Poll { node });
        }
        self.send_new(ToNew::MoveIn);
        for _ in 0..self.rng.below(60) {
            let at = self.rng.below(BUSY);
            self.at(at, Event::Client);
        }
        for _ in 0..self.rng.below(10) {
            let at = self.rng.below(CALM_AT);
            self.at(at, Event::Client);
        }
        if self.rng.one_in(3) {
            let at = self.rng.below(BUSY);
            self.at(at, Event::LinkBreaks);
        }
    }

    fn at(&mut self, at: Micros, e: Event) {
        self.seq += 1;
        self.queue.push(Reverse((at, self.seq)));
        self.events.insert(self.seq, e);
    }

    /// A delay of the network or etcd: mostly short, sometimes long.
    fn delay(&mut self) -> Micros {
        if self.rng.one_in(10) {
            self.rng.below(300_000)
        } else {
            100 + self.rng.below(2_000)
        }
    }

    fn calm(&self) -> bool {
        self.now >= CALM_AT
    }

    fn send_new(&mut self, msg: ToNew) {
        let at = (self.now + self.delay()).max(self.to_new_at);
        self.to_new_at = at;
        self.at(
            at,
            Event::ToNew {
                link: self.link,
                msg,
            },
        );
    }

    fn send_old(&mut self, msg: ToOld) {
        let at = (self.now + self.delay()).max(self.to_old_at);
        self.to_old_at = at;
        self.at(
            at,
            Event::ToOld {
                link: self.link,
                msg,
            },
        );
    }

    /// Asks etcd: applied or lost on the way, its answer told or lost (noticed after a
    /// timeout). Once calm, nothing is lost.
    fn ask_etcd(&mut self, from: Set, ask: EtcdAsk) -> u64 {
        let token = self.next_token;
        self.next_token += 1;
        let calm = self.calm();
        let applied = calm || !self.rng.one_in(8);
        let tell = calm || !self.rng.one_in(6);
        let at = self.now + self.delay();
        self.at(
            at,
            Event::Etcd {
                from,
                ask,
                token,
                applied,
                tell,
            },
        );
        token
    }

    fn log(&mut self, what: impl FnOnce() -> String) {
        if self.tracing {
            self.trace.push(format!("{:>9} {}", self.now, what()));
        }
    }

    /// Runs the seed: `Err` names the broken promise.
    fn run(&mut self) -> Result<(), String> {
        self.drive(Input::Tick)?;
        let mut events = 0;
        while let Some(Reverse((at, seq))) = self.queue.pop() {
            if at > END_AT {
                break;
            }
            events += 1;
            if events > MAX_EVENTS {
                return Err(format!("runs away: {MAX_EVENTS} events by {at} µs"));
            }
            self.now = at;
            let e = self.events.remove(&seq).expect("queued");
            self.log(|| format!("{e:?}"));
            self.event(e)?;
            self.check_one_server()?;
            if let Some(at) = self.old.machine.next_deadline() {
                if !self.old.ended && !self.queue.iter().any(|Reverse((t, _))| *t == at) {
                    self.at(at.max(self.now), Event::Tick);
                }
            }
        }
        self.check_settled()
    }

    fn event(&mut self, e: Event) -> Result<(), String> {
        match e {
            Event::Client => {
                let node = Node::of(self.rng.below(self.views.len() as u64) as usize);
                self.call(node, 0)?;
            }
            Event::Call { node, hop } => self.call(node, hop)?,
            Event::Poll { node } => self.poll(node),
            Event::Read {
                node,
                owner,
                epoch,
                sent,
            } => self.read(node, owner, epoch, sent),
            Event::LinkBreaks => {
                self.link += 1;
                self.seen.link_broke = true;
                // Both ends see it: the old owner's calls in flight fail, the new owner lets
                // go of a copy it does not serve.
                self.drive(Input::Failed("the link failed".into()))?;
                self.new_link_closed();
            }
            Event::ToNew { link, msg } if link == self.link => self.at_new(msg),
            Event::ToOld { link, msg } if link == self.link => {
                let input = match msg {
                    ToOld::Accepted => Input::Accepted,
                    ToOld::Refused => Input::Failed("the new owner refused".into()),
                    ToOld::PageDurable => Input::PageAnswered,
                };
                self.drive(input)?;
            }
            Event::ToNew { .. } | Event::ToOld { .. } => {} // on a link that broke
            Event::Etcd {
                from,
                ask,
                token,
                applied,
                tell,
            } => self.at_etcd(from, ask, token, applied, tell)?,
            Event::EtcdAnswer {
                to: Set::Old,
                ask,
                token,
                owner,
            } => self.old_etcd_answer(ask, token, owner)?,
            Event::EtcdAnswer {
                to: Set::New,
                ask,
                owner,
                ..
            } => self.new_etcd_answer(ask, owner),
            Event::Tick => self.drive(Input::Tick)?,
        }
        Ok(())
    }

    /// etcd takes `ask` (or loses it); its answer, if told, comes after a delay, else its
    /// loss is noticed after a timeout.
    fn at_etcd(
        &mut self,
        from: Set,
        ask: EtcdAsk,
        token: u64,
        applied: bool,
        tell: bool,
    ) -> Result<(), String> {
        let owner = if applied {
            self.etcd_apply(&ask)?
        } else {
            Err("lost".into())
        };
        let owner = (applied && tell).then_some(owner);
        let wait = if owner.is_some() {
            self.delay()
        } else {
            500_000
        };
        self.at(
            self.now + wait,
            Event::EtcdAnswer {
                to: from,
                ask,
                token,
                owner,
            },
        );
        Ok(())
    }

    /// Node `node` reads the placement: lost sometimes before calm; the answer, delayed, is
    /// the owner when etcd served it.
    fn poll(&mut self, node: usize) {
        if self.now + POLL < POLL_UNTIL {
            self.at(self.now + POLL, Event::Poll { node });
        }
        if !self.calm() && self.rng.one_in(8) {
            return;
        }
        let (owner, epoch, sent) = (self.etcd.owner, self.etcd.epoch, self.now);
        let at = self.now + self.delay();
        self.at(
            at,
            Event::Read {
                node,
                owner,
                epoch,
                sent,
            },
        );
    }

    /// A read's answer: a view no older than the node's (reads may arrive out of order). A
    /// new owner that reads the partition is its own serves its copy, as `hold_tube` does.
    fn read(&mut self, node: usize, owner: Set, epoch: u64, sent: Micros) {
        let v = &mut self.views[node];
        if epoch < v.epoch {
            return;
        }
        *v = View {
            owner,
            epoch,
            read_at: v.read_at.max(sent),
        };
        if Node::of(node) == Node::New && owner == Set::New && !self.new.serving {
            assert!(
                self.new.copy.is_some(),
                "etcd gives the new set a partition it never copied"
            );
            self.new_serves();
        }
    }

    /// The new owner serves its copy: changes only once every view that showed the old owner
    /// has expired.
    fn new_serves(&mut self) {
        self.new.serving = true;
        self.new.held_until = self.now + VALID;
    }

    /// What node `node` knows of the partition now, as `Router::facts` gathers it.
    fn facts(&self, node: Node) -> Facts {
        let v = self.views[node.index()];
        let view = match self.now.saturating_sub(v.read_at) > VALID {
            true => Freshness::Stale,
            false => Freshness::Current,
        };
        let (mine, frozen, moved_in) = match node {
            Node::Old => (v.owner == Set::Old, self.old.frozen, None),
            Node::New => {
                let left = self.new.held_until.saturating_sub(self.now);
                let moved_in = (left > 0).then(|| Duration::from_micros(left));
                (v.owner == Set::New || self.new.serving, false, moved_in)
            }
            Node::Router(_) => (false, false, None),
        };
        Facts {
            mine,
            owner: v.owner.slot(),
            leads: true,
            frozen,
            view,
            moved_in,
            index: 1,
        }
    }

    /// A client's change at `node`, decided as the router decides: run there, forwarded to
    /// the owner in the node's view (relayed once more at most), or refused or held (the
    /// client tries later; neither is acknowledged).
    fn call(&mut self, node: Node, hop: u8) -> Result<(), String> {
        let f = self.facts(node);
        let change = Kind {
            changes: true,
            reads_only: false,
        };
        let d = match hop {
            0 => decide::for_client(&f, change, "s"),
            _ => decide::for_link(&f, change, "s"),
        };
        self.log(|| format!("  {node:?} hop {hop}: {d:?}"));
        match d {
            Decision::Local => {
                if hop > 0 {
                    self.seen.forwarded += 1;
                }
                self.change_at(node, &f)
            }
            Decision::Forward(slot) if hop < 2 => {
                let to = if slot == 0 { Node::Old } else { Node::New };
                let at = self.now + self.delay();
                self.at(
                    at,
                    Event::Call {
                        node: to,
                        hop: hop + 1,
                    },
                );
                Ok(())
            }
            _ => {
                self.seen.refused += 1;
                Ok(())
            }
        }
    }

    /// A change runs at `node`: it must serve the partition, or the change is acknowledged and
    /// lost with a copy nobody serves.
    fn change_at(&mut self, node: Node, f: &Facts) -> Result<(), String> {
        let at_old = match node {
            Node::Old if self.old.serving && !self.old.frozen => true,
            Node::New if self.new.serving => false,
            _ => {
                return Err(format!(
                    "{node:?} ran a change to a partition it does not serve: {f:?}"
                ))
            }
        };
        let tasks = match at_old {
            true => &mut self.old.tasks,
            false => self.new.copy.as_mut().expect("a served copy"),
        };
        let id = match self.rng.below(3) {
            0 => {
                self.old.next_id += 1;
                self.old.next_id + 1000
            }
            _ if tasks.is_empty() => return Ok(()),
            _ => {
                let k = self.rng.below(tasks.len() as u64) as usize;
                *tasks.keys().nth(k).expect("in range")
            }
        };
        let change = if tasks.contains_key(&id) && self.rng.one_in(2) {
            None
        } else {
            Some(self.rng.below(1_000_000))
        };
        match change {
            Some(v) => tasks.insert(id, v),
            None => tasks.remove(&id),
        };
        match change {
            Some(v) => self.truth.insert(id, v),
            None => self.truth.remove(&id),
        };
        if at_old {
            self.old.changed.insert(id);
        }
        Ok(())
    }

    /// Feeds the old owner's machine and does what it says, as `moving.rs` does.
    fn drive(&mut self, input: Input) -> Result<(), String> {
        let mut next = vec![input];
        while let Some(input) = next.pop() {
            if self.old.ended {
                return Ok(());
            }
            let outs = self.old.machine.on(input, self.now);
            for o in outs {
                self.log(|| format!("  old: {o:?}"));
                next.extend(self.step(o)?);
            }
        }
        Ok(())
    }

    fn step(&mut self, o: Output) -> Result<Option<Input>, String> {
        let old = &mut self.old;
        Ok(match o {
            Output::SendPage => self.send_page(),
            Output::CollectChanges => {
                self.seen.changes += old.changed.len() as u64;
                old.resend = std::mem::take(&mut old.changed).into_iter().collect();
                Some(Input::Changes {
                    count: old.resend.len(),
                    whole: false,
                })
            }
            Output::Freeze => {
                self.seen.froze = true;
                old.frozen = true;
                None
            }
            Output::Commit => {
                let term = self.etcd.term;
                let token = self.ask_etcd(Set::Old, EtcdAsk::Commit { term });
                Some(Input::CommitAsked(Ok(token)))
            }
            Output::Withdraw => {
                self.seen.withdrew = true;
                Some(Input::WithdrawAsked(
                    self.ask_etcd(Set::Old, EtcdAsk::Withdraw),
                ))
            }
            Output::HandOver => {
                self.seen.committed = true;
                old.ended = true;
                old.serving = false;
                // Thawed as it lets go (`let_go_of`): its calls go by its view from now on.
                old.frozen = false;
                old.tasks.clear();
                // It takes the committed placement in at once (`move_committed`).
                if !self.forget_hand_over {
                    self.views[Node::Old.index()] = View {
                        owner: Set::New,
                        epoch: self.etcd.epoch,
                        read_at: self.now,
                    };
                }
                self.send_new(ToNew::Done { committed: true });
                None
            }
            Output::GiveUp(why) => {
                old.ended = true;
                old.frozen = false;
                self.log(|| format!("  given up: {why}"));
                self.ask_etcd(Set::Old, EtcdAsk::Withdraw);
                self.send_new(ToNew::Done { committed: false });
                None
            }
        })
    }

    /// The old owner's next page: the bulk copy's next ids, or the changes to send again
    /// (the frozen phase sends its last page even when empty); one page's tasks lost on the
    /// way when the seed asks for that bug.
    fn send_page(&mut self) -> Option<Input> {
        let old = &mut self.old;
        let phase = old.machine.phase();
        let (items, last): (Vec<Item>, bool) = if phase == Phase::Bulk {
            let items: Vec<Item> = (old.tasks.range(old.bulk_after..old.bulk_end))
                .take(PAGE)
                .map(|(&id, &v)| (id, Some(v)))
                .collect();
            if items.is_empty() {
                return Some(Input::Exhausted);
            }
            old.bulk_after = items.last().expect("a page").0 + 1;
            (items, false)
        } else {
            let n = old.resend.len().min(PAGE);
            let ids: Vec<u64> = old.resend.drain(..n).collect();
            let items: Vec<Item> = ids
                .iter()
                .map(|id| (*id, old.tasks.get(id).copied()))
                .collect();
            let last = old.resend.is_empty();
            if items.is_empty() && phase != Phase::Final {
                return Some(Input::Exhausted);
            }
            (items, last)
        };
        let n = items.len() as u64;
        let items = if self.lose_a_page && n > 0 {
            self.lose_a_page = false;
            Vec::new()
        } else {
            items
        };
        self.send_new(ToNew::Page(items));
        Some(Input::Sent { items: n, last })
    }

    /// etcd applies `ask`: the partition's owner after it, or why it refused.
    fn etcd_apply(&mut self, ask: &EtcdAsk) -> Result<Result<Set, String>, String> {
        let e = &mut self.etcd;
        Ok(match ask {
            EtcdAsk::Claim if e.owner == Set::Old && !e.claimed => {
                e.claimed = true;
                Ok(e.owner)
            }
            EtcdAsk::Claim => Err("claimed already, or not the old set's".into()),
            EtcdAsk::Commit { term } if e.owner == Set::Old && e.claimed && *term == e.term => {
                // The commit point: the copy must be the partition, whole.
                let copy = self.new.copy.as_ref();
                if copy != Some(&self.old.tasks) {
                    return Err(format!(
                        "committed a copy that is not the partition: copy {copy:?}, partition {:?}",
                        self.old.tasks
                    ));
                }
                e.owner = Set::New;
                e.claimed = false;
                e.epoch += 1;
                Ok(Set::New)
            }
            EtcdAsk::Commit { .. } => Err("the claim is gone".into()),
            // Both withdraw the claim while it is there; etcd answers where the partition is.
            EtcdAsk::Withdraw | EtcdAsk::Release => {
                if e.owner == Set::Old {
                    e.claimed = false;
                }
                Ok(e.owner)
            }
        })
    }

    fn old_etcd_answer(
        &mut self,
        ask: EtcdAsk,
        token: u64,
        owner: Option<Result<Set, String>>,
    ) -> Result<(), String> {
        let m = &self.old.machine;
        let fate = match owner {
            None => Fate::Lost("no answer".into()),
            Some(Ok(Set::New)) => Fate::There,
            Some(Ok(Set::Old)) => Fate::Here,
            Some(Err(why)) => Fate::Refused(why),
        };
        match ask {
            EtcdAsk::Commit { .. } if m.commit_token() == Some(token) => {
                self.drive(Input::Committed(fate))
            }
            EtcdAsk::Withdraw if m.withdraw_token() == Some(token) => {
                self.drive(Input::Withdrawn(fate))
            }
            _ => Ok(()),
        }
    }

    fn at_new(&mut self, msg: ToNew) {
        match msg {
            ToNew::MoveIn => {
                self.new.copy = Some(BTreeMap::new());
                self.ask_etcd(Set::New, EtcdAsk::Claim);
            }
            ToNew::Page(items) => {
                let Some(copy) = self.new.copy.as_mut().filter(|_| !self.new.serving) else {
                    return; // a copy it let go of: the move failed meanwhile
                };
                for (id, v) in items {
                    match v {
                        Some(v) => copy.insert(id, v),
                        None => copy.remove(&id),
                    };
                }
                self.send_old(ToOld::PageDurable);
            }
            ToNew::Done { committed: true } => {
                if self.new.copy.is_some() && !self.new.serving {
                    self.new_serves();
                }
            }
            ToNew::Done { committed: false } => self.new_let_go(),
        }
    }

    /// The link closed: a copy not yet served is let go of (its claim released first).
    fn new_link_closed(&mut self) {
        if self.new.copy.is_some() && !self.new.serving {
            self.new_let_go();
        }
    }

    fn new_let_go(&mut self) {
        if self.new.serving || self.new.copy.is_none() || self.new.releasing {
            return;
        }
        self.new.releasing = true;
        self.ask_etcd(Set::New, EtcdAsk::Release);
    }

    fn new_etcd_answer(&mut self, ask: EtcdAsk, owner: Option<Result<Set, String>>) {
        match (ask, owner) {
            (EtcdAsk::Claim, Some(Ok(_))) => self.send_old(ToOld::Accepted),
            (EtcdAsk::Claim, _) => {
                // Perhaps claimed after all: released before the copy goes.
                self.send_old(ToOld::Refused);
                self.new_let_go();
            }
            // The commit happened: the copy is the partition now.
            (EtcdAsk::Release, Some(Ok(Set::New))) => {
                self.new.releasing = false;
                if self.new.copy.is_some() && !self.new.serving {
                    self.new_serves();
                }
            }
            (EtcdAsk::Release, Some(Ok(Set::Old))) => {
                self.new.releasing = false;
                self.new.copy = None;
            }
            (EtcdAsk::Release, _) => {
                // Not known: asked again.
                self.new.releasing = false;
                self.new_let_go();
            }
            _ => {}
        }
    }

    /// One set at a time takes changes to the partition.
    fn check_one_server(&self) -> Result<(), String> {
        if self.old.serving && !self.old.frozen && self.new.serving {
            return Err("both sets serve the partition".into());
        }
        if self.new.serving && self.etcd.owner != Set::New {
            return Err("the new set serves a partition etcd does not give it".into());
        }
        Ok(())
    }

    /// Settled: the move ended; etcd's owner serves exactly what clients were told; the
    /// other holds nothing.
    fn check_settled(&self) -> Result<(), String> {
        if !self.old.ended {
            return Err(format!(
                "the move never ended: {:?}",
                self.old.machine.phase()
            ));
        }
        let (served, other) = match self.etcd.owner {
            Set::Old => (Some(&self.old.tasks), self.new.copy.as_ref()),
            Set::New => (self.new.copy.as_ref(), None),
        };
        if self.etcd.owner == Set::New && (!self.new.serving || !self.old.tasks.is_empty()) {
            return Err("committed, but the old set still holds the partition".into());
        }
        if self.etcd.owner == Set::Old && !self.old.serving {
            return Err("given up, but the old set does not serve".into());
        }
        if served != Some(&self.truth) {
            return Err(format!(
                "acknowledged changes lost: served {served:?}, told {:?}",
                self.truth
            ));
        }
        if other.is_some() {
            return Err("a copy is left in two places".into());
        }
        Ok(())
    }
}

/// A bug a seed may be run with, to show the checks catch it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Bug {
    None,
    LoseAPage,
    ForgetHandOver,
}

/// Something seeds are meant to reach, and whether one seed did.
type Reached = (&'static str, fn(&Seen) -> bool);

/// What a seed went through.
#[derive(Clone, Copy, Debug, Default)]
struct Seen {
    committed: bool,
    froze: bool,
    withdrew: bool,
    link_broke: bool,
    /// Changes resent after the bulk copy.
    changes: u64,
    /// Client changes run after a forward (or a relay), and refused or held.
    forwarded: u64,
    refused: u64,
}

/// The seeds to try: `TARQ_SIM_SEEDS=FROM..TO` when set (a longer search), else `0..SEEDS`.
fn seed_range() -> std::ops::Range<u64> {
    let Ok(text) = std::env::var("TARQ_SIM_SEEDS") else {
        return 0..SEEDS;
    };
    let bounds = text
        .split_once("..")
        .and_then(|(from, to)| Some((from.trim().parse().ok()?, to.trim().parse().ok()?)));
    match bounds {
        Some((from, to)) if from < to => from..to,
        _ => panic!("TARQ_SIM_SEEDS={text:?} is not a range FROM..TO of seeds (FROM < TO)"),
    }
}

fn run_seed(seed: u64) -> Result<Seen, String> {
    let mut sim = Sim::new(seed, false);
    sim.run().map(|()| sim.seen)
}

#[test]
fn simulated_moves_keep_their_promises_under_faults() {
    if let Ok(seed) = std::env::var("TARQ_SIM_SEED") {
        let seed: u64 = seed.parse().expect("TARQ_SIM_SEED is a number");
        let mut sim = Sim::new(seed, true);
        let r = sim.run();
        for line in &sim.trace {
            println!("{line}");
        }
        println!("{:?}", sim.seen);
        if let Err(why) = r {
            panic!("seed {seed}: {why}");
        }
        return;
    }
    // The regression seeds first, then the range (without them: a seed is tried once).
    let range = seed_range();
    let seeds = (REGRESSIONS.iter().copied()).chain(range.filter(|s| !REGRESSIONS.contains(s)));
    // What the seeds are for: moves committed, frozen after changes, lost commits decided
    // by withdrawing, broken links. Counted as they run: a long search keeps no seed's figures.
    let reached: &[Reached] = &[
        ("committed", |s| s.committed),
        ("given up", |s| !s.committed),
        ("caught up changes", |s| s.changes > 0),
        ("withdrew a claim to learn a commit's fate", |s| s.withdrew),
        ("link broke", |s| s.link_broke),
        ("ran a forwarded change", |s| s.forwarded > 0),
        ("refused or held a change", |s| s.refused > 0),
    ];
    let mut counts = vec![0usize; reached.len()];
    let mut tried = 0;
    let mut failed = Vec::new();
    for seed in seeds {
        tried += 1;
        match run_seed(seed) {
            Ok(seen) => {
                for (n, (_, f)) in counts.iter_mut().zip(reached) {
                    *n += f(&seen) as usize;
                }
            }
            Err(why) => failed.push(format!("seed {seed}: {why}")),
        }
    }
    assert!(
        failed.is_empty(),
        "{} of {tried} seeds broke a promise (replay one: TARQ_SIM_SEED=N cargo test -p \
         tarq-net --lib sim -- --nocapture):\n{}",
        failed.len(),
        failed[..failed.len().min(10)].join("\n")
    );
    // The seeds reach what they are for. Shares of a few seeds say nothing: a short range (a
    // search's tail, say) is held to its promises only.
    if tried < MIN_SEEDS_FOR_SHARES {
        return;
    }
    let figures: Vec<(&str, usize)> = (reached.iter().zip(counts))
        .map(|(&(what, _), n)| (what, n * 100 / tried))
        .collect();
    for &(what, pct) in &figures {
        assert!(pct >= 3, "only {pct}% of seeds {what}: {figures:?}");
    }
}

/// The checks bite: a move whose executor loses one page's tasks is caught by some seeds.
#[test]
fn the_simulation_catches_a_move_that_loses_a_page() {
    let caught = (0..200)
        .filter(|&seed| Sim::with_bug(seed, false, Bug::LoseAPage).run().is_err())
        .count();
    assert!(caught > 20, "caught in {caught} of 200 seeds");
}

/// And an old owner that routes by its old view after handing the partition over runs
/// changes on what it no longer serves: caught.
#[test]
fn the_simulation_catches_an_owner_that_forgets_its_hand_over() {
    let caught: Vec<String> = (0..400)
        .filter_map(|seed| {
            let mut sim = Sim::with_bug(seed, false, Bug::ForgetHandOver);
            sim.run().err()
        })
        .collect();
    assert!(caught.len() > 20, "caught in {} of 400 seeds", caught.len());
    assert!(
        caught.iter().any(|why| why.contains("does not serve")),
        "{caught:?}"
    );
}
