//! The console's picture of a sharded cluster: every partition's figures, asked of its owner
//! (the partitions this node leads are read here) once a second. The HTTP console reads it at
//! once (a page never waits on other nodes), so a tube's row is the whole tube, summed over
//! its partitions with the counts its moves carried, the same from every node, and its page
//! lists the partitions with their owning sets and counts. A second's staleness is what
//! RabbitMQ's management UI and Sidekiq's web UI show too; `queue.statistics` is the exact
//! figure.
//!
//! The same gather feeds the console's per-second figures ([`tarq_ops::live::Live`]): each
//! tick of the HTTP port asks every partition's owner for its counters, and once they have
//! answered (or at the next tick, with what came) the whole tubes' sums become that second's
//! sample, their rates the differences of successive sums, and the sample's event goes to
//! every open event stream. A tube with a partition whose owner did not answer is a gap in
//! that second; the counts moves carried are taken as they stood when the owners were asked,
//! so a move committed meanwhile is not counted twice.

use std::collections::HashSet;
use std::time::Duration;

use super::ctx::{Ctx, Effect};
use super::*;
use crate::frontend::http::{PartitionFigures, TubeTotals};

/// The connection index the console's own gathers answer to: no connection has it.
pub(super) const CONSOLE_CLIENT: usize = usize::MAX;

/// How old the figures may be before a page's read asks for new ones: the HTTP port's tick
/// renews them every second, so a page asks only before the first tick or when ticks are late.
const STALE: Duration = Duration::from_secs(3);

/// The console's figures and the gather that renews them.
#[derive(Default)]
pub(super) struct Console {
    figures: Option<(Instant, Arc<HashMap<String, TubeTotals>>)>,
    /// The gather in flight.
    asking: Option<Asking>,
    /// The engine session the console's asks run as on the owners.
    sid: Option<SessionId>,
}

/// The console's gather in flight: what its answers are read against.
struct Asking {
    key: u64,
    /// The second a tick asked it for (it becomes that second's sample), or `None` when a
    /// page's read did.
    second: Option<u64>,
    /// The partitions asked of other nodes.
    asked: Vec<TubeIx>,
    /// What each tube's partitions' moves carried when its owners were asked, by first
    /// partition.
    carried: HashMap<TubeIx, Stats>,
}

impl Router {
    /// The engine session the console's asks run as on the owners, once made.
    pub(super) fn console_sid(&self) -> Option<SessionId> {
        self.console.sid
    }

    pub(super) fn set_console_sid(&mut self, sid: SessionId) {
        self.console.sid = Some(sid);
    }
}

impl Router {
    /// The console's figures of every placed tube (`None` on a single node), as the last
    /// tick's gather left them; the first read of a page, before any tick's, asks for them
    /// and gets `None` until the owners have answered.
    pub(crate) fn cluster_tubes(
        &mut self,
        cx: &mut Ctx<'_>,
    ) -> Option<Arc<HashMap<String, TubeTotals>>> {
        let c = &self.console;
        let stale = (c.figures.as_ref()).is_none_or(|(at, _)| at.elapsed() > STALE);
        if stale && c.asking.is_none() {
            self.ask_console_figures(cx, None);
        }
        self.console.figures.as_ref().map(|(_, f)| Arc::clone(f))
    }

    /// The HTTP port's tick on a sharded node, at wall-clock `second`: the gather still in
    /// flight ends with what came (its second's sample has gaps where owners were late), and
    /// this second's is asked.
    pub(crate) fn console_tick(&mut self, cx: &mut Ctx<'_>, second: u64) {
        self.finish_console_gather();
        self.ask_console_figures(cx, Some(second));
        // The asks' deadlines (the tick runs after the router's own work in the turn).
    }

    /// Ends the console's gather in flight, if any, with the answers it has.
    fn finish_console_gather(&mut self) {
        let Some(key) = self.console.asking.as_ref().map(|a| a.key) else {
            return;
        };
        match self.gathers.remove(&key) {
            Some(g) => self.console_gathered(g.per, &g.answered),
            None => self.console.asking = None,
        }
    }

    /// Asks every partition's figures for `second`'s sample (`None`: a page's read): the ones
    /// led here read now, the others of their owners.
    fn ask_console_figures(&mut self, cx: &mut Ctx<'_>, second: Option<u64>) {
        let sid = match self.console.sid {
            Some(sid) => sid,
            None => cx.new_session(),
        };
        let leads = cx.leads();
        let holders = cx.core.queue().holders();
        self.console.sid = Some(sid);
        let key = self.next_gather;
        self.next_gather += 1;
        let mut per = Vec::new();
        let mut asks = Vec::new();
        let mut carried = HashMap::with_capacity(self.tubes.len());
        for (&head, t) in &self.tubes {
            carried.insert(head, self.carried(head));
            for &ix in &t.parts {
                let mut s = Stats::default();
                if self.here(ix, leads) {
                    s = cx.core.tube_figures(ix, &holders).unwrap_or_default();
                } else if let Some(p) = self.part(ix) {
                    asks.push((p.set, ix));
                }
                per.push((t.name.clone(), ix, s));
            }
        }
        let client = Client::router(sid, key);
        let asked = asks.iter().map(|&(_, ix)| ix).collect();
        self.console.asking = Some(Asking {
            key,
            second,
            asked,
            carried,
        });
        let gather = Gather::every_tube(client, asks.len(), per);
        if asks.is_empty() {
            return self.console_gathered(gather.per, &[]);
        }
        self.gathers.insert(key, gather);
        for (set, ix) in asks {
            let cmd = Command::TubeStats { tube: ix };
            self.forward(cx, set, client, cmd, Then::GatherTube { key, head: ix });
        }
    }

    /// An answer meant for the console's gather that did not come from an owner (a forward
    /// refused before it was sent): counted as that partition's, with no figures.
    pub(super) fn console_refused(&mut self, cx: &mut Ctx<'_>, c: Client) {
        if let ReplyTo::Router(key) = c.reply {
            self.gathered(cx, key, None, Digest::Nothing);
        }
    }

    /// The console's gather is answered, or ended: every partition's figures, `per` (tube,
    /// index, figures), those asked of other nodes counted when `answered`, become the tubes'
    /// sums and partition lists, and a tick's gather its second's sample.
    pub(super) fn console_gathered(
        &mut self,
        per: Vec<(String, TubeIx, Stats)>,
        answered: &[TubeIx],
    ) {
        let Some(asking) = self.console.asking.take() else {
            return;
        };
        let answered: HashSet<TubeIx> = answered.iter().copied().collect();
        let missing: HashSet<TubeIx> = (asking.asked.into_iter())
            .filter(|ix| !answered.contains(ix))
            .collect();
        let known: HashMap<TubeIx, Stats> = (per.into_iter())
            .filter(|(_, ix, _)| !missing.contains(ix))
            .map(|(_, ix, s)| (ix, s))
            .collect();
        let before = self.console.figures.take().map(|(_, f)| f);
        let mut tubes: HashMap<String, TubeTotals> = HashMap::new();
        let mut partial: HashSet<String> = HashSet::new();
        for t in self.placement.tubes.values() {
            let Some(head) = t.partitions.first().map(|p| p.index) else {
                continue;
            };
            let carried = asking.carried.get(&head).copied();
            let mut stats = carried.unwrap_or_else(|| self.carried(head));
            let earlier = before.as_ref().and_then(|b| b.get(&t.name));
            let mut whole = carried.is_some();
            let partitions = (t.partitions.iter().enumerate())
                .map(|(p, part)| {
                    // An owner that did not answer: its partition as it last gave it.
                    let s = known.get(&part.index).copied().or_else(|| {
                        whole = false;
                        (earlier?.partitions.iter())
                            .find(|e| e.index == part.index)
                            .and_then(|e| e.stats)
                    });
                    if let Some(s) = &s {
                        stats += s;
                    }
                    let primary = (self.sets.iter())
                        .find(|x| x.name == part.set)
                        .and_then(|x| x.primary.clone());
                    PartitionFigures {
                        partition: p as u16,
                        index: part.index,
                        set: part.set.clone(),
                        primary,
                        stats: s,
                    }
                })
                .collect();
            if !whole {
                partial.insert(t.name.clone());
            }
            tubes.insert(t.name.clone(), TubeTotals { stats, partitions });
        }
        let tubes = Arc::new(tubes);
        self.console.figures = Some((Instant::now(), Arc::clone(&tubes)));
        let Some(second) = asking.second else {
            return;
        };
        self.effects.push(Effect::LiveSample {
            second,
            tubes,
            partial,
        });
    }
}
