//! Whole-tube figures: a command run on every partition of a tube (here, or forwarded) and
//! the answers summed; `queue.statistics()` for every tube at once.

use std::collections::BTreeMap;

use super::ctx::Ctx;
use super::*;

/// A whole-tube figure being summed.
pub(super) struct Gather {
    pub(super) client: Client,
    pub(super) left: usize,
    pub(super) stats: Stats,
    pub(super) count: u64,
    pub(super) kind: GatherKind,
    pub(super) error: Option<Refusal>,
    /// Every tube's figures (`GatherKind::All`): name, first partition's index, sum.
    pub(super) per: Vec<(String, TubeIx, Stats)>,
    /// A drop's partitions that may go, with the next number each would give.
    pub(super) floors: Vec<(TubeIx, u64)>,
    /// The partitions whose owners answered with their figures (the console's gather tells
    /// a whole tube from one with a partition missing).
    pub(super) answered: Vec<TubeIx>,
    /// A drop's checks asked of other sets' primaries (set, partition): told if it is given up.
    pub(super) asked: Vec<(usize, TubeIx)>,
    /// When a drop's checks began (its commit may begin only so long after).
    pub(super) since: Option<Instant>,
    /// A drop's checks passed, by set: the term of the primary that passed them (the
    /// commit requires it to lead still).
    pub(super) checked_by: Vec<(String, u64)>,
}

impl Gather {
    /// A figure of kind `kind` for `client`, `left` partitions still to answer.
    pub(super) fn new(client: Client, left: usize, kind: GatherKind) -> Self {
        Gather {
            client,
            left,
            stats: Stats::default(),
            count: 0,
            kind,
            error: None,
            per: Vec::new(),
            floors: Vec::new(),
            answered: Vec::new(),
            asked: Vec::new(),
            since: None,
            checked_by: Vec::new(),
        }
    }

    /// Every tube's figures for `client` (`GatherKind::All`): `per` holds what this node
    /// summed itself, and `left` partitions are still to answer.
    pub(super) fn every_tube(
        client: Client,
        left: usize,
        per: Vec<(String, TubeIx, Stats)>,
    ) -> Self {
        Gather {
            per,
            ..Gather::new(client, left, GatherKind::All)
        }
    }

    /// Adds one partition's answer (partition `head`'s, when known); true once every
    /// partition has answered.
    fn add(&mut self, head: Option<TubeIx>, digest: Digest) -> bool {
        if let (Digest::Stats(_), Some(h)) = (&digest, head) {
            self.answered.push(h);
        }
        match digest {
            Digest::Stats(s) => match head.and_then(|h| self.per.iter_mut().find(|p| p.1 == h)) {
                Some(p) => p.2 += &s,
                None => self.stats += &s,
            },
            Digest::Figures(s, urgent) => {
                self.stats += &s;
                self.count += urgent;
            }
            Digest::Count(n) => match (self.kind, head) {
                (GatherKind::Drop { .. }, Some(ix)) => self.floors.push((ix, n)),
                _ => self.count += n,
            },
            Digest::Error(e) => self.error = Some(e),
            _ => {}
        }
        self.left -= 1;
        self.left == 0
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum GatherKind {
    Stats,
    /// beanstalk's stats-tube: the counts and the urgent ready tasks.
    Figures,
    /// A drop's checks of tube `head`'s partitions (`drop`).
    Drop {
        head: TubeIx,
    },
    All,
    Count,
    Ok,
}

/// The operation counters of `s` by name, as a move's commit carries them in the placement.
pub(super) fn counters_of(s: &Stats) -> BTreeMap<String, u64> {
    (Stats::OP_NAMES.into_iter().zip(s.op_counts()))
        .filter(|&(_, n)| n > 0)
        .map(|(k, n)| (k.to_owned(), n))
        .collect()
}

/// `carried` (a partition's earlier owners' counters, by name) as figures to add to its
/// owner's; a name this node does not know is left out.
fn carried_stats(carried: &BTreeMap<String, u64>) -> Stats {
    let counts = Stats::OP_NAMES.map(|name| carried.get(name).copied().unwrap_or(0));
    Stats::from_op_counts(&counts)
}

impl Router {
    /// What tube `head`'s partitions' earlier owners did with them (moves carried it): added
    /// to the owners' own figures, so a tube's counters do not go back when a partition moves.
    pub(super) fn carried(&self, head: TubeIx) -> Stats {
        let mut s = Stats::default();
        let Some(name) = self.tubes.get(&head).map(|t| &t.name) else {
            return s;
        };
        for p in self
            .placement
            .tubes
            .get(name)
            .map_or(&[][..], |t| &t.partitions)
        {
            if !p.carried.is_empty() {
                s += &carried_stats(&p.carried);
            }
        }
        s
    }
}

impl Router {
    /// Runs `make(partition)` on every partition of `tube` and answers the sum.
    pub(super) fn gather<'c>(
        &mut self,
        cx: &mut Ctx<'_>,
        client: Client,
        tube: TubeIx,
        kind: GatherKind,
        leads: bool,
        make: impl Fn(TubeIx) -> Command<'c>,
    ) -> Option<Command<'c>> {
        // A tube's figures count what its partitions did under earlier owners too.
        let carried = match kind {
            GatherKind::Stats | GatherKind::Figures => self.carried(tube),
            _ => Stats::default(),
        };
        let moved = carried != Stats::default();
        let parts = match self.tubes.get(&tube) {
            Some(t) if t.parts.len() > 1 || !self.here(tube, leads) || moved => t.parts.clone(),
            _ => return Some(make(tube)),
        };
        let key = self.next_gather;
        self.next_gather += 1;
        let gather = Gather {
            stats: carried,
            ..Gather::new(client, parts.len(), kind)
        };
        self.gathers.insert(key, gather);
        for ix in parts {
            let here = self.here(ix, leads);
            if here {
                let caller = Caller::new(client.idx, client.gen, client.sid);
                self.execute_as(cx, caller, ReplyTo::Router(key), make(ix));
            } else if let Some(set) = self.part(ix).map(|p| p.set) {
                self.forward(cx, set, client, make(ix), Then::Gather { key });
            }
        }
        None
    }

    /// `queue.statistics()` on a sharded node: every placed tube's figures summed over its
    /// partitions (the ones led here read at once, the others asked of their owners).
    pub(super) fn gather_all(&mut self, cx: &mut Ctx<'_>, client: Client, leads: bool) {
        let mut tubes: Vec<(String, TubeIx, Vec<TubeIx>)> = (self.tubes.iter())
            .filter(|(_, t)| t.name != tarq_engine::DEFAULT_TUBE_NAME)
            .map(|(&head, t)| (t.name.clone(), head, t.parts.clone()))
            .collect();
        tubes.sort();
        let key = self.next_gather;
        self.next_gather += 1;
        let mut per = Vec::with_capacity(tubes.len());
        let mut asks = Vec::new();
        let holders = cx.core.queue().holders();
        for (name, head, parts) in tubes {
            let mut sum = self.carried(head);
            for ix in parts {
                if self.here(ix, leads) {
                    // With its consumers, as an owner's answer for its partition has them.
                    sum += &cx.core.tube_figures(ix, &holders).unwrap_or_default();
                } else if let Some(p) = self.part(ix) {
                    asks.push((p.set, ix, head));
                }
            }
            per.push((name, head, sum));
        }
        let gather = Gather::every_tube(client, asks.len(), per);
        if asks.is_empty() {
            let all = gather.per.into_iter().map(|(n, _, s)| (n, s)).collect();
            return self.answer(cx, client, &Outcome::AllStats(all));
        }
        self.gathers.insert(key, gather);
        for (set, ix, head) in asks {
            let cmd = Command::TubeStats { tube: ix };
            self.forward(cx, set, client, cmd, Then::GatherTube { key, head });
        }
    }

    pub(super) fn gathered(
        &mut self,
        cx: &mut Ctx<'_>,
        key: u64,
        head: Option<TubeIx>,
        digest: Digest,
    ) {
        // A drop's check passed over the link to the owner's primary: that primary led in the
        // term this node's view gives now (a link is closed when the view names another
        // primary, and a deposed primary keeps its holds if it leads again).
        let checked_by = match (&digest, head.and_then(|h| self.part(h))) {
            (Digest::Count(_), Some(p)) => {
                let set = &self.sets[p.set];
                set.term.map(|t| (set.name.clone(), t))
            }
            _ => None,
        };
        let Some(g) = self.gathers.get_mut(&key) else {
            return;
        };
        if let (GatherKind::Drop { .. }, Some(c)) = (g.kind, checked_by) {
            if !g.checked_by.contains(&c) {
                g.checked_by.push(c);
            }
        }
        if !g.add(head, digest) {
            return;
        }
        if let GatherKind::Drop { .. } = g.kind {
            return self.drop_checked(cx, key);
        }
        let g = self.gathers.remove(&key).expect("present above");
        if g.client.idx == super::console::CONSOLE_CLIENT {
            return self.console_gathered(g.per, &g.answered);
        }
        let outcome = match (g.error, g.kind) {
            (Some(e), _) => Outcome::Error(e),
            (None, GatherKind::Stats) => Outcome::TubeStats(g.stats),
            (None, GatherKind::Figures) => Outcome::TubeFigures {
                stats: g.stats,
                urgent: g.count,
            },
            (None, GatherKind::All) => {
                Outcome::AllStats(g.per.into_iter().map(|(n, _, s)| (n, s)).collect())
            }
            (None, GatherKind::Count) => Outcome::Count(g.count),
            (None, GatherKind::Ok) => Outcome::Ok,
            (None, GatherKind::Drop { .. }) => unreachable!("a drop's checks end in drop_checked"),
        };
        self.answer(cx, g.client, &outcome);
    }
}
